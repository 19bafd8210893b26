//! Belay's throughput benchmark (issue 7): how many steps per second engines
//! and workers get through on the local PostgreSQL, how long a step waits,
//! what a step costs in PostgreSQL transactions and memory, and how that
//! compares with PostgreSQL's own single-insert commit ceiling measured in
//! the same run.
//!
//! [`run`] creates a fresh database `belay_bench_<uuid>` on the given server,
//! starts E engines and N workers against it ([`fleet`]), an in-process
//! scripted model and no-op tool ([`fake`]), registers the workflow
//! ([`workload`]), submits R runs of K no-op tool steps with at most C in
//! flight, waits for all of them, reads the figures from PostgreSQL ([`pg`]),
//! measures the commit ceiling, and drops the database.
//!
//! - modules: [`fake`] (scripted model and tool), [`workload`] (definitions),
//!   [`keys`] (the API keys every call carries), [`fleet`] (engines and
//!   workers, as processes or in-process), [`pg`] (database, counters,
//!   latencies, ceiling).
//!
//! The crate also holds the chaos harness `belay-chaos` ([`chaos`], issue
//! 22): real engine and worker processes under SIGKILLs, PostgreSQL restarts
//! and broken connections, and the invariants checked afterwards.

pub mod chaos;
pub mod cpu;
pub mod fake;
pub mod fleet;
pub mod keys;
pub mod peer;
pub mod pg;
pub mod waits;
pub mod workload;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use belay_sdk::{Client, ConnectOptions, StartOptions};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, oneshot, watch};
use uuid::Uuid;

pub use crate::workload::Shape;

use crate::fleet::{EngineOptions, Fleet, Launch, PeakRss, WorkerOptions};
use crate::keys::BenchKeys;
use crate::pg::{BenchDatabase, Ceiling, DbCounts, Monitor, RunEnd, StepTimings, TableCounts};

/// Everything one benchmark run needs.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Runs to submit (R).
    pub runs: u32,
    /// No-op tool steps per run (K); a run is `2K + 1` steps
    /// ([`Shape::Agent`]) or K ([`Shape::Loop`]).
    pub tool_steps: u32,
    /// What a run does.
    pub shape: Shape,
    /// Size of the no-op tool's JSON answer, bytes (0: `{"ok":true}`).
    pub result_bytes: usize,
    /// Workers (N).
    pub workers: u32,
    /// Engine replicas (E).
    pub engines: u32,
    /// Runs in flight at once (C); also the ceiling's connections (capped).
    pub concurrency: u32,
    /// Submit runs at this rate, runs/s (open loop, still at most C in
    /// flight), to measure latency below the peak; `None`: as fast as C
    /// allows.
    pub rate: Option<f64>,
    /// URL of a database on the PostgreSQL server to use; the bench creates
    /// and drops its own database next to it and touches nothing else.
    pub database_url: String,
    /// The engines' lease, ms.
    pub lease_ms: u64,
    /// The engines' lease-sweep interval, ms.
    pub sweep_interval_ms: u64,
    /// Each engine's connection pool size.
    pub engine_db_connections: u32,
    /// Tasks each worker runs at once.
    pub worker_concurrency: u32,
    /// How the bench watches its runs: one query on `runs` every this many ms.
    pub poll_ms: u64,
    /// Give up when the runs have not all ended within this.
    pub timeout: Duration,
    /// How long the commit ceiling is measured; zero skips it.
    pub ceiling_duration: Duration,
    /// Most connections the ceiling uses (it uses `min(C, this)`).
    pub ceiling_max_connections: u32,
    /// Where engines and workers run.
    pub launch: Launch,
    /// Keep the database (and logs) afterwards, for inspection.
    pub keep_database: bool,
}

impl BenchConfig {
    /// The defaults of the `belay-bench` command, launching engines and
    /// workers with `launch`.
    pub fn new(launch: Launch) -> BenchConfig {
        BenchConfig {
            runs: 200,
            tool_steps: 5,
            shape: Shape::Agent,
            result_bytes: 0,
            workers: 2,
            engines: 1,
            concurrency: 50,
            rate: None,
            database_url: "postgres://postgres@127.0.0.1:5432/test".to_owned(),
            lease_ms: 30_000,
            sweep_interval_ms: 1_000,
            engine_db_connections: 16,
            worker_concurrency: belay_worker::config::DEFAULT_CONCURRENCY as u32,
            poll_ms: 5,
            timeout: Duration::from_secs(600),
            ceiling_duration: Duration::from_secs(5),
            ceiling_max_connections: 64,
            launch,
            keep_database: false,
        }
    }

    /// Connections the ceiling uses: C, capped.
    pub fn ceiling_connections(&self) -> u32 {
        self.concurrency
            .clamp(1, self.ceiling_max_connections.max(1))
    }

    /// The configuration, one `name: value` line each, printed before the
    /// figures.
    pub fn lines(&self) -> Vec<String> {
        let placement = match &self.launch {
            Launch::Processes { engine, worker } => format!(
                "separate processes (engine: {}, worker: {})",
                engine.display(),
                worker.display()
            ),
            Launch::InProcess => "one process (engines, workers and bench)".to_owned(),
        };
        vec![
            format!("runs (R): {}", self.runs),
            match self.shape {
                Shape::Agent => format!(
                    "tool steps per run (K): {} (an agent: a run is {} steps, {} model calls and {} tool calls)",
                    self.tool_steps,
                    workload::steps_per_run(self.tool_steps, self.shape),
                    self.tool_steps + 1,
                    self.tool_steps
                ),
                Shape::Loop => format!(
                    "tool steps per run (K): {} (a workflow loop: a run is {} tool calls, no model)",
                    self.tool_steps, self.tool_steps
                ),
            },
            format!(
                "tool result: {} bytes of JSON",
                fake::tool_answer(self.result_bytes).len()
            ),
            format!(
                "workers (N): {} ({} tasks in flight each)",
                self.workers, self.worker_concurrency
            ),
            format!(
                "engines (E): {} ({} database connections each)",
                self.engines, self.engine_db_connections
            ),
            format!("concurrency (C): {} runs in flight", self.concurrency),
            match self.rate {
                Some(r) => format!("submission rate: {r} runs/s"),
                None => "submission rate: as fast as C allows".to_owned(),
            },
            format!("lease: {} ms", self.lease_ms),
            format!("placement: {placement}"),
        ]
    }

    fn validate(&self) -> Result<()> {
        for (name, value) in [
            ("--runs", self.runs),
            ("--workers", self.workers),
            ("--engines", self.engines),
            ("--concurrency", self.concurrency),
            ("--worker-concurrency", self.worker_concurrency),
            ("--db-connections", self.engine_db_connections),
        ] {
            if value == 0 {
                bail!("{name} must be at least 1");
            }
        }
        if let Some(r) = self.rate
            && !(r.is_finite() && (0.01..=100_000.0).contains(&r))
        {
            bail!("--rate must be 0.01..=100000 runs/s, got {r}");
        }
        if self.lease_ms < 100 {
            bail!("--lease-ms must be at least 100");
        }
        Ok(())
    }
}

/// Median and 99th percentile of a set of durations, in ms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Percentiles {
    /// 50th percentile.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Largest value.
    pub max_ms: f64,
    /// How many values.
    pub count: usize,
}

impl Percentiles {
    /// Nearest-rank percentiles of `values` (`None` when empty).
    pub fn of(values: &[f64]) -> Option<Percentiles> {
        if values.is_empty() {
            return None;
        }
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let rank = |p: f64| {
            let index = (p * sorted.len() as f64).ceil() as usize;
            sorted[index.clamp(1, sorted.len()) - 1]
        };
        Some(Percentiles {
            p50_ms: rank(0.50),
            p99_ms: rank(0.99),
            max_ms: sorted[sorted.len() - 1],
            count: sorted.len(),
        })
    }
}

/// The figures of one benchmark run.
#[derive(Debug, Clone)]
pub struct Report {
    /// The database used (dropped afterwards unless kept).
    pub database: String,
    /// Runs completed.
    pub runs: u64,
    /// Steps completed (model call and tool call tasks).
    pub steps: u64,
    /// From the first submission to the last run seen ending.
    pub elapsed: Duration,
    /// Steps' ready → recorded latency, all steps.
    pub step_latency: Percentiles,
    /// The same, model calls only.
    pub model_step_latency: Option<Percentiles>,
    /// The same, tool calls only.
    pub tool_step_latency: Option<Percentiles>,
    /// Tool calls' ready → dispatched latency (claim plus `DispatchToolCall`).
    pub tool_dispatch_latency: Option<Percentiles>,
    /// Runs' created → ended latency.
    pub run_latency: Percentiles,
    /// Step latency of the first and the last tenth of each run's steps,
    /// when runs have at least 20 steps.
    pub history_latency: Option<(Percentiles, Percentiles)>,
    /// The longest history: its events, and how long a fresh store (empty
    /// state cache) took to read and fold it.
    pub cold_load: Option<(i64, Duration)>,
    /// Tasks that took more than one attempt.
    pub retried_steps: u64,
    /// Events written.
    pub events: u64,
    /// Commits in the bench database during the workload, minus the bench's
    /// own monitoring statements. Includes the engines' API-key lookups
    /// (one autocommit `SELECT` on `principals` each): see `key_lookups`.
    pub commits: i64,
    /// Rollbacks in the bench database during the workload.
    pub rollbacks: i64,
    /// The bench's own statements during the workload (left out of `commits`).
    pub bench_statements: u64,
    /// Scans of `principals` during the workload: the engines' API-key
    /// lookups (once per key a second with the key cache; one per RPC with
    /// `BELAY_KEY_CACHE_MS=0`), each its own transaction (nothing else
    /// reads the table), so a part of `commits`.
    pub key_lookups: i64,
    /// Per-table activity during the workload (`pg_stat_user_tables`); the
    /// `runs` figures include the bench's own polling.
    pub tables: Vec<(String, TableCounts)>,
    /// Requests the scripted model served.
    pub model_requests: u64,
    /// Requests the no-op tool served.
    pub tool_requests: u64,
    /// Peak RSS of engines and workers.
    pub peak_rss: PeakRss,
    /// PostgreSQL's single-insert commit ceiling, unless skipped.
    pub ceiling: Option<Ceiling>,
    /// CPU time spent during the workload, by process.
    pub cpu: cpu::CpuReading,
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn rss_line(what: &str, kib: &[u64], shared: bool) -> String {
    let peak = kib.iter().copied().max().unwrap_or(0);
    if shared {
        return format!(
            "{what} peak RSS: {:.1} MiB (engines, workers and bench share one process: its VmHWM)",
            mib(peak)
        );
    }
    let each = kib
        .iter()
        .map(|k| format!("{:.1}", mib(*k)))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "{what} peak RSS: {:.1} MiB (largest of {} process(es): {each} MiB)",
        mib(peak),
        kib.len()
    )
}

impl Report {
    /// Runs completed per second.
    pub fn runs_per_sec(&self) -> f64 {
        self.runs as f64 / self.elapsed.as_secs_f64().max(f64::EPSILON)
    }

    /// Steps completed per second.
    pub fn steps_per_sec(&self) -> f64 {
        self.steps as f64 / self.elapsed.as_secs_f64().max(f64::EPSILON)
    }

    /// PostgreSQL transactions (commits and rollbacks) per step.
    pub fn transactions_per_step(&self) -> f64 {
        (self.commits + self.rollbacks) as f64 / self.steps.max(1) as f64
    }

    /// Steps per second as a share of the commit ceiling (0..1), if measured.
    pub fn share_of_ceiling(&self) -> Option<f64> {
        self.ceiling.map(|c| self.steps_per_sec() / c.per_sec())
    }

    /// The figures, one `name: value` line each.
    pub fn lines(&self) -> Vec<String> {
        let pct = |name: &str, p: &Percentiles| {
            vec![
                format!("{name} p50: {:.1} ms", p.p50_ms),
                format!("{name} p99: {:.1} ms", p.p99_ms),
            ]
        };
        let mut lines = vec![
            format!("runs/s: {:.1}", self.runs_per_sec()),
            format!("steps/s: {:.1}", self.steps_per_sec()),
        ];
        lines.extend(pct("step latency", &self.step_latency));
        if let Some(p) = &self.model_step_latency {
            lines.extend(pct("model step latency", p));
        }
        if let Some(p) = &self.tool_step_latency {
            lines.extend(pct("tool step latency", p));
        }
        if let Some(p) = &self.tool_dispatch_latency {
            lines.extend(pct("tool ready-to-dispatched latency", p));
        }
        lines.extend(pct("run latency", &self.run_latency));
        if let Some((first, last)) = &self.history_latency {
            lines.extend(pct("step latency, first tenth of each run", first));
            lines.extend(pct("step latency, last tenth of each run", last));
        }
        if let Some((events, took)) = &self.cold_load {
            lines.push(format!(
                "history load of the longest run ({events} events), cold: {:.1} ms",
                took.as_secs_f64() * 1000.0
            ));
        }
        lines.push(format!(
            "postgres transactions per step: {:.2}",
            self.transactions_per_step()
        ));
        lines.push(format!(
            "of which API-key lookups per step: {:.2}",
            self.key_lookups as f64 / self.steps.max(1) as f64
        ));
        lines.push(format!(
            "postgres rollbacks per step: {:.2}",
            self.rollbacks as f64 / self.steps.max(1) as f64
        ));
        lines.push(format!(
            "bench's own statements (left out of the transactions): {}",
            self.bench_statements
        ));
        lines.push(format!(
            "events per step: {:.2}",
            self.events as f64 / self.steps.max(1) as f64
        ));
        lines.push(format!("retried steps: {}", self.retried_steps));
        let steps = self.steps.max(1) as f64;
        // Tables with next to nothing per step (setup leftovers) are noise.
        let tables = self.tables.iter().filter(|(_, t)| {
            [t.inserted, t.updated, t.deleted, t.idx_scan, t.seq_scan]
                .iter()
                .any(|n| (*n as f64 / steps).abs() >= 0.005)
        });
        for (table, t) in tables {
            lines.push(format!(
                "table {table} per step: {:.2} inserted, {:.2} updated ({:.2} HOT), {:.2} deleted, \
                 {:.2} index scans ({:.1} entries), {:.2} seq scans ({:.1} rows)",
                t.inserted as f64 / steps,
                t.updated as f64 / steps,
                t.hot_updated as f64 / steps,
                t.deleted as f64 / steps,
                t.idx_scan as f64 / steps,
                t.idx_tup_read as f64 / steps,
                t.seq_scan as f64 / steps,
                t.seq_tup_read as f64 / steps,
            ));
        }
        lines.push(self.cpu.per_step_line(self.steps));
        lines.push(rss_line(
            "engine",
            &self.peak_rss.engines_kib,
            self.peak_rss.shared_process,
        ));
        lines.push(rss_line(
            "worker",
            &self.peak_rss.workers_kib,
            self.peak_rss.shared_process,
        ));
        match (&self.ceiling, self.share_of_ceiling()) {
            (Some(c), Some(share)) => {
                lines.push(format!(
                    "postgres single-insert commits/s: {:.0} ({} connections, {:.1} s)",
                    c.per_sec(),
                    c.connections,
                    c.elapsed.as_secs_f64()
                ));
                lines.push(format!(
                    "steps/s as share of the ceiling: {:.1}%",
                    share * 100.0
                ));
            }
            _ => lines.push("postgres single-insert commits/s: not measured".to_owned()),
        }
        lines.push(format!(
            "elapsed: {:.2} s for {} runs, {} steps",
            self.elapsed.as_secs_f64(),
            self.runs,
            self.steps
        ));
        lines
    }
}

/// Runs the benchmark: fresh database, engines, workers, R runs, figures,
/// ceiling; the database is dropped afterwards whatever happens (unless
/// `keep_database`).
///
/// Errors: bad configuration, PostgreSQL unreachable, an engine or worker
/// failing, any run not completing (failed, cancelled, paused) or the runs
/// not all ending within the timeout.
pub async fn run(config: &BenchConfig) -> Result<Report> {
    config.validate()?;
    let db = BenchDatabase::create(&config.database_url).await?;
    let log_dir = std::env::temp_dir().join(&db.name);
    let result = run_in(config, &db, &log_dir).await;
    if config.keep_database {
        eprintln!("kept database {} (logs in {})", db.name, log_dir.display());
    } else {
        if let Err(e) = db.drop_database().await {
            eprintln!("warning: {e:#}");
        }
        // Keep the processes' logs when something went wrong.
        if result.is_ok() {
            let _ = std::fs::remove_dir_all(&log_dir);
        }
    }
    result
}

async fn run_in(
    config: &BenchConfig,
    db: &BenchDatabase,
    log_dir: &std::path::Path,
) -> Result<Report> {
    // The scripted model and the no-op tool, in this process.
    let (stop_fakes, fakes_stopped) = watch::channel(false);
    let fake_listener = TcpListener::bind("127.0.0.1:0").await?;
    let fake_url = format!("http://{}", fake_listener.local_addr()?);
    let counters = Arc::new(fake::Counters::default());
    let fakes = tokio::spawn(fake::serve(
        fake_listener,
        config.tool_steps,
        config.result_bytes,
        Arc::clone(&counters),
        async move {
            let mut rx = fakes_stopped;
            let _ = rx.wait_for(|s| *s).await;
        },
    ));

    let mut fleet = Fleet::new(config.launch.clone(), log_dir.to_owned(), "");
    let outcome = drive(config, db, log_dir, &mut fleet, &fake_url).await;
    // Read the peaks while the processes still exist, then stop them all.
    let peak_rss = fleet.peak_rss();
    fleet.stop().await;
    let _ = stop_fakes.send(true);
    let _ = fakes.await;
    let workload = match outcome {
        Ok(workload) => workload,
        Err(e) => {
            return Err(anyhow!(
                "{e:#}\n(logs of engines and workers: {})",
                log_dir.display()
            ));
        }
    };
    let peak_rss = peak_rss?;

    // Every backend is gone now, so their statistics are flushed.
    let after = pg::settled_counts(&db.url).await?;
    let pool = sqlx::PgPool::connect(&db.url).await?;
    let timings: StepTimings = pg::step_timings(&pool).await?;
    pool.close().await;
    // How the engine loads a history it has not cached (another replica's
    // run, a restart): read every event and fold it.
    let cold_load = match timings.longest_run {
        Some((run, events)) => {
            let store = belay_engine::store::Store::connect(&db.url, 1)
                .await
                .context("connecting a store to time a cold history load")?;
            let started = Instant::now();
            let loaded = store.run_state(run).await;
            let took = started.elapsed();
            store.close().await;
            loaded.with_context(|| format!("folding run {run}"))?;
            Some((events, took))
        }
        None => None,
    };
    let history_latency = if workload::steps_per_run(config.tool_steps, config.shape) >= 20 {
        Percentiles::of(&timings.first_tenth_ms).zip(Percentiles::of(&timings.last_tenth_ms))
    } else {
        None
    };
    if timings.not_completed > 0 {
        bail!(
            "{} task(s) did not complete although every run did",
            timings.not_completed
        );
    }
    let all: Vec<f64> = timings
        .model_ms
        .iter()
        .chain(&timings.tool_ms)
        .copied()
        .collect();
    let step_latency =
        Percentiles::of(&all).ok_or_else(|| anyhow!("no completed steps in the database"))?;
    let run_latency =
        Percentiles::of(&timings.run_ms).ok_or_else(|| anyhow!("no runs in the database"))?;

    let ceiling = if config.ceiling_duration.is_zero() {
        None
    } else {
        Some(
            pg::commit_ceiling(
                &db.url,
                config.ceiling_connections(),
                config.ceiling_duration,
            )
            .await
            .context("measuring the single-insert commit ceiling")?,
        )
    };

    // The bench's statements up to here are in `after`; those of the final
    // read itself are not (a few at most, whose flush time is up to PostgreSQL).
    let commits =
        after.counts.xact.commits - workload.before.xact.commits - workload.bench_statements as i64;
    let mut tables = after.counts.tables_since(&workload.before);
    let key_lookups = tables
        .iter()
        .find(|(name, _)| name == "principals")
        .map_or(0, |(_, t)| t.idx_scan + t.seq_scan);
    // Leave the bench's own polling out of the `runs` table's figures.
    for (name, t) in &mut tables {
        if name == "runs" {
            t.idx_scan -= workload.polled_runs as i64;
            t.idx_tup_read -= workload.polled_runs as i64;
        }
    }
    Ok(Report {
        database: db.name.clone(),
        runs: workload.runs,
        steps: timings.steps(),
        elapsed: workload.elapsed,
        step_latency,
        model_step_latency: Percentiles::of(&timings.model_ms),
        tool_step_latency: Percentiles::of(&timings.tool_ms),
        tool_dispatch_latency: Percentiles::of(&timings.tool_dispatch_ms),
        run_latency,
        history_latency,
        cold_load,
        retried_steps: timings.retried,
        events: timings.events,
        commits,
        rollbacks: after.counts.xact.rollbacks - workload.before.xact.rollbacks,
        tables,
        bench_statements: workload.bench_statements,
        key_lookups,
        model_requests: counters
            .model_requests
            .load(std::sync::atomic::Ordering::Relaxed),
        tool_requests: counters
            .tool_requests
            .load(std::sync::atomic::Ordering::Relaxed),
        peak_rss,
        ceiling,
        cpu: workload.cpu,
    })
}

/// What the workload phase measured.
struct Workload {
    runs: u64,
    elapsed: Duration,
    before: DbCounts,
    bench_statements: u64,
    polled_runs: u64,
    cpu: cpu::CpuReading,
}

/// A client of the engine at `url` for the bench tenant, with `key`.
///
/// Errors: a URL or key that cannot be used.
pub fn client(url: &str, key: &str) -> Result<Client> {
    Ok(Client::connect(
        &ConnectOptions::new(url).with_api_key(key),
        workload::TENANT,
    )?)
}

/// Starts an engine in `fleet`, registers the workflow through it and
/// grants the tenant its permission, with the operator key.
async fn register(
    fleet: &mut Fleet,
    options: &EngineOptions,
    keys: &BenchKeys,
    tool_steps: u32,
    shape: Shape,
) -> Result<()> {
    let url = fleet.add_engine(options).await?;
    let client = client(&url, &keys.operator)?;
    client
        .register_files(workload::bundle(tool_steps, shape))
        .await
        .context("registering the benchmark's definitions")?;
    client
        .set_tenant_grants(vec![workload::PERMISSION.to_owned()])
        .await
        .context("granting the tenant its permission")?;
    Ok(())
}

type Waiters = Arc<Mutex<HashMap<Uuid, oneshot::Sender<RunEnd>>>>;

/// Starts engines and workers, registers the workflow, runs the workload.
async fn drive(
    config: &BenchConfig,
    db: &BenchDatabase,
    log_dir: &Path,
    fleet: &mut Fleet,
    fake_url: &str,
) -> Result<Workload> {
    let engine_options = EngineOptions {
        database_url: db.url.clone(),
        lease_ms: config.lease_ms,
        sweep_interval_ms: config.sweep_interval_ms,
        db_connections: config.engine_db_connections,
    };
    // Setup (migrations and API keys, then definitions and grants through
    // an engine of its own) is done before counting starts: once every
    // backend has gone, pg_stat_database holds all of their statistics (an
    // idle backend may otherwise keep them for up to 10 s), so the counters
    // read next are exact and the setup is not in them.
    let keys = keys::mint(&db.url).await?;
    let mut setup = Fleet::new(config.launch.clone(), log_dir.to_owned(), "setup-");
    let registered = register(
        &mut setup,
        &engine_options,
        &keys,
        config.tool_steps,
        config.shape,
    )
    .await;
    setup.stop().await;
    registered?;
    let settled = pg::settled_counts(&db.url).await?;

    // One after the other, as each checks the migrations at start.
    let mut engine_urls = Vec::new();
    for _ in 0..config.engines {
        engine_urls.push(fleet.add_engine(&engine_options).await?);
    }
    for j in 0..config.workers as usize {
        fleet.add_worker(&WorkerOptions {
            engine_url: engine_urls[j % engine_urls.len()].clone(),
            api_key: keys.worker.clone(),
            worker_id: format!("bench-worker-{j}"),
            concurrency: config.worker_concurrency as usize,
            model_base_url: format!("{fake_url}/v1"),
            http_base_url: fake_url.to_owned(),
        })?;
    }
    // Timing starts once every worker's first claim has reached its engine.
    fleet.wait_workers_ready().await?;
    let clients = engine_urls
        .iter()
        .map(|url| client(url, &keys.operator))
        .collect::<Result<Vec<_>>>()?;
    let monitor = Monitor::connect(&db.url).await?;

    let waiters: Waiters = Arc::new(Mutex::new(HashMap::new()));
    let (stop_poll, poll_stopped) = watch::channel(false);
    let poller = tokio::spawn(poll_runs(
        monitor.clone(),
        Arc::clone(&waiters),
        Duration::from_millis(config.poll_ms.max(1)),
        poll_stopped,
    ));
    let cpu_before = cpu_reading(fleet)?;
    let outcome = submit_and_wait(config, &clients, fleet, &waiters, &monitor).await;
    let cpu_after = cpu_reading(fleet);
    let _ = stop_poll.send(true);
    let poll_result = poller.await;
    let (runs, elapsed) = outcome?;
    poll_result.context("the run poller panicked")??;
    let cpu = cpu_after?.since(&cpu_before);
    let bench_statements = settled.statements + monitor.statements();
    let polled_runs = monitor.polled_runs();
    monitor.close().await;
    Ok(Workload {
        runs,
        elapsed,
        before: settled.counts,
        bench_statements,
        polled_runs,
        cpu,
    })
}

/// CPU time of the fleet, the bench, PostgreSQL and the machine, now.
fn cpu_reading(fleet: &Fleet) -> Result<cpu::CpuReading> {
    let mut reading = cpu::CpuReading::read_base()?;
    if let Some((engines, workers)) = fleet.cpu_ms()? {
        reading.engines_ms = Some(engines);
        reading.workers_ms = Some(workers);
    }
    Ok(reading)
}

/// Every `interval`, asks PostgreSQL which of the runs being waited for have
/// ended, and tells their waiters.
async fn poll_runs(
    monitor: Monitor,
    waiters: Waiters,
    interval: Duration,
    mut stopped: watch::Receiver<bool>,
) -> Result<()> {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stopped.wait_for(|s| *s) => return Ok(()),
        }
        let ids: Vec<Uuid> = waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .copied()
            .collect();
        if ids.is_empty() {
            continue;
        }
        let ended = match monitor.ended_runs(&ids).await {
            Ok(ended) => ended,
            Err(e) => {
                // Dropping the senders ends every wait with an error.
                waiters
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clear();
                return Err(e);
            }
        };
        let mut waiters = waiters.lock().unwrap_or_else(PoisonError::into_inner);
        for (id, end) in ended {
            if let Some(tx) = waiters.remove(&id) {
                let _ = tx.send(end);
            }
        }
    }
}

/// Submits the runs (at most C in flight, round-robin over the engines) and
/// waits for each to end. Returns the runs completed and the time from the
/// first submission to the last end.
async fn submit_and_wait(
    config: &BenchConfig,
    clients: &[Client],
    fleet: &mut Fleet,
    waiters: &Waiters,
    monitor: &Monitor,
) -> Result<(u64, Duration)> {
    let total = config.runs as usize;
    let permits = Arc::new(Semaphore::new(config.concurrency as usize));
    let mut in_flight = tokio::task::JoinSet::new();
    let batch = Uuid::new_v4().simple().to_string();
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + config.timeout;
    let mut health = tokio::time::interval(Duration::from_millis(500));
    let mut submitted = 0_usize;
    let mut completed = 0_usize;
    let mut last_end = started;
    // With --rate, run i is submitted at `started + i / rate` (or when a
    // permit frees up, if later).
    let pace = config.rate.map(|r| Duration::from_secs_f64(1.0 / r));
    let mut next_at = tokio::time::Instant::now();
    while completed < total {
        let at = next_at;
        tokio::select! {
            permit = async {
                tokio::time::sleep_until(at).await;
                Arc::clone(&permits).acquire_owned().await
            }, if submitted < total => {
                let permit = permit.context("the submission semaphore closed")?;
                if let Some(pace) = pace {
                    next_at += pace;
                }
                let client = clients[submitted % clients.len()].clone();
                let waiters = Arc::clone(waiters);
                let key = format!("bench-{batch}-{submitted}");
                let input = json!({ "i": submitted });
                in_flight.spawn(async move {
                    let (run, _) = client
                        .start_run(workload::WORKFLOW, &input, StartOptions {
                            idempotency_key: key,
                            caller: "belay-bench".to_owned(),
                            caller_grants: vec![workload::PERMISSION.to_owned()],
                        })
                        .await
                        .context("StartRun")?;
                    let id = Uuid::parse_str(&run.run_id)
                        .with_context(|| format!("run id {:?}", run.run_id))?;
                    let (tx, rx) = oneshot::channel();
                    waiters.lock().unwrap_or_else(PoisonError::into_inner).insert(id, tx);
                    let end = rx.await.context("the run poller stopped")?;
                    drop(permit);
                    Ok::<_, anyhow::Error>((id, end))
                });
                submitted += 1;
            }
            Some(joined) = in_flight.join_next() => {
                let (id, end) = joined.context("a submitter panicked")??;
                if end.status != "completed" {
                    bail!(
                        "run {id} ended {}{}",
                        end.status,
                        if end.reason.is_empty() { String::new() } else { format!(": {}", end.reason) }
                    );
                }
                completed += 1;
                last_end = Instant::now();
            }
            _ = health.tick() => fleet.check_alive()?,
            _ = tokio::time::sleep_until(deadline) => {
                let progress = pg::progress_summary(monitor.pool())
                    .await
                    .unwrap_or_else(|e| format!("(cannot read progress: {e})"));
                bail!(
                    "only {completed} of {total} runs completed within {} s ({submitted} submitted); {progress}",
                    config.timeout.as_secs()
                );
            }
        }
    }
    Ok((completed as u64, last_end.duration_since(started)))
}

/// The bench executable's own path, to re-run it as an engine or worker.
///
/// Errors: the platform cannot tell.
pub fn current_exe() -> Result<PathBuf> {
    std::env::current_exe().context("cannot find the bench executable to run engines and workers")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let values: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let p = Percentiles::of(&values).expect("not empty");
        assert_eq!(
            (p.p50_ms, p.p99_ms, p.max_ms, p.count),
            (50.0, 99.0, 100.0, 100)
        );
        let one = Percentiles::of(&[3.0]).expect("not empty");
        assert_eq!((one.p50_ms, one.p99_ms), (3.0, 3.0));
        assert!(Percentiles::of(&[]).is_none());
    }

    #[test]
    fn database_url_keeps_the_server() -> Result<()> {
        assert_eq!(
            pg::with_database(
                "postgres://postgres@127.0.0.1:5432/test?sslmode=disable",
                "x"
            )?,
            "postgres://postgres@127.0.0.1:5432/x?sslmode=disable"
        );
        Ok(())
    }

    #[test]
    fn ceiling_connections_follow_concurrency_capped() {
        let mut config = BenchConfig::new(Launch::InProcess);
        config.concurrency = 500;
        assert_eq!(config.ceiling_connections(), 64);
        config.concurrency = 3;
        assert_eq!(config.ceiling_connections(), 3);
    }
}
