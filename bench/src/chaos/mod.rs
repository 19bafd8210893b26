//! `belay-chaos` (issue 22): a chaos harness with real processes. Two (or
//! `--engines`) `belay-engine` processes and several `belay-worker`
//! processes run against a fresh PostgreSQL database; N runs of the
//! workflow of [`definitions`] call tools of every repeat safety on the
//! harness's [`recorder`], while the [`faults`] schedule drawn from the seed
//! SIGKILLs engines and workers ([`procs`] starts them again), restarts
//! PostgreSQL ([`postgres`]) and drops or stalls connections through the
//! harness's TCP [`proxy`]s (workers and clients to each engine, engines to
//! PostgreSQL, workers to the tool server). Runs are submitted with retries
//! ([`submit`]). When the fault phase ends, everything is brought back up,
//! the runs settle ([`observe`]) and the invariants are checked
//! ([`checks`]); [`report`] prints the figures and every violation.
//!
//! [`run`] drives it all and always cleans up: the processes are killed,
//! PostgreSQL is made sure to answer again, and the database and logs are
//! dropped unless a check failed or `keep_database` is set.

pub mod checks;
pub mod definitions;
pub mod faults;
pub mod observe;
pub mod postgres;
pub mod procs;
pub mod proxy;
pub mod recorder;
pub mod report;
pub mod rng;
pub mod submit;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use belay_sdk::{Client, ConnectOptions};
use tokio::net::TcpListener;
use tokio::time::Instant;

use crate::pg::BenchDatabase;
use checks::{Observed, Violation};
use faults::{Injector, PlanOptions};
use procs::{ProcSpec, Supervisor};
use proxy::Proxy;
use recorder::{RecorderOptions, Recording};
use report::Report;
use submit::Submission;

use crate::keys::BenchKeys;

/// Everything one chaos run needs.
#[derive(Debug, Clone)]
pub struct ChaosConfig {
    /// Seed of the fault schedule and of the slow answers.
    pub seed: u64,
    /// Runs to submit.
    pub runs: u32,
    /// Length of the fault phase (runs are submitted over its first 80%).
    pub duration: Duration,
    /// Engine processes.
    pub engines: u32,
    /// Worker processes.
    pub workers: u32,
    /// A database URL on the PostgreSQL server to use; a fresh database
    /// `belay_chaos_<uuid>` is made next to it.
    pub database_url: String,
    /// The `belay-engine` executable.
    pub engine_bin: PathBuf,
    /// The `belay-worker` executable.
    pub worker_bin: PathBuf,
    /// Whether to restart PostgreSQL.
    pub pg_restarts: bool,
    /// The cluster to restart (`VERSION/NAME`); `None`: the one listening
    /// on the database URL's port.
    pub pg_cluster: Option<String>,
    /// The engines' lease, ms.
    pub lease_ms: u64,
    /// The engines' sweep interval, ms.
    pub sweep_interval_ms: u64,
    /// Mean time between two faults, ms.
    pub fault_interval_ms: u64,
    /// The tools' timeout, ms.
    pub tool_timeout_ms: u64,
    /// The workers' model timeout, ms.
    pub model_timeout_ms: u64,
    /// Share of tool and model answers held back (0..=1).
    pub slow_share: f64,
    /// Tasks each worker runs at once.
    pub worker_concurrency: u32,
    /// How long the runs may take to settle after the faults.
    pub settle_timeout: Duration,
    /// Keep the database and logs even when every check holds.
    pub keep_database: bool,
}

impl ChaosConfig {
    /// The defaults, with the binaries at `engine_bin` and `worker_bin`.
    pub fn new(engine_bin: PathBuf, worker_bin: PathBuf) -> ChaosConfig {
        ChaosConfig {
            seed: 1,
            runs: 100,
            duration: Duration::from_secs(120),
            engines: 2,
            workers: 3,
            database_url: "postgres://postgres@127.0.0.1:5432/test".to_owned(),
            engine_bin,
            worker_bin,
            pg_restarts: true,
            pg_cluster: None,
            lease_ms: 2_000,
            sweep_interval_ms: 200,
            fault_interval_ms: 1_500,
            tool_timeout_ms: 2_000,
            model_timeout_ms: 3_000,
            slow_share: 0.05,
            worker_concurrency: 8,
            settle_timeout: Duration::from_secs(180),
            keep_database: false,
        }
    }

    fn validate(&self) -> Result<()> {
        for (flag, value) in [
            ("--runs", self.runs),
            ("--engines", self.engines),
            ("--workers", self.workers),
            ("--worker-concurrency", self.worker_concurrency),
        ] {
            if value == 0 {
                bail!("{flag} must be at least 1");
            }
        }
        if self.duration.is_zero() {
            bail!("--duration must be more than 0 s");
        }
        if !(0.0..=1.0).contains(&self.slow_share) {
            bail!("--slow-share must be between 0 and 1");
        }
        if self.lease_ms < 500 || self.tool_timeout_ms < 100 || self.model_timeout_ms < 100 {
            bail!("--lease-ms must be at least 500, the timeouts at least 100");
        }
        for bin in [&self.engine_bin, &self.worker_bin] {
            if !bin.exists() {
                bail!(
                    "{} not found: build it first (cargo build -p belay-engine -p belay-worker), or name it with --engine-bin / --worker-bin",
                    bin.display()
                );
            }
        }
        Ok(())
    }

    /// The configuration, one line each, printed before the figures.
    pub fn lines(&self) -> Vec<String> {
        vec![
            format!(
                "belay-chaos: {} runs, {} s of faults (one every ~{} ms), {} engines, {} workers",
                self.runs,
                self.duration.as_secs(),
                self.fault_interval_ms,
                self.engines,
                self.workers
            ),
            format!(
                "binaries: {} and {}",
                self.engine_bin.display(),
                self.worker_bin.display()
            ),
            format!(
                "PostgreSQL restarts: {}",
                if self.pg_restarts { "on" } else { "off" }
            ),
        ]
    }
}

/// The host:port of a PostgreSQL URL.
///
/// Errors: not a URL with a host.
fn pg_addr(url: &str) -> Result<(SocketAddr, u16)> {
    let parsed =
        reqwest::Url::parse(url).with_context(|| format!("--database-url {url:?} is not a URL"))?;
    let port = parsed.port().unwrap_or(5432);
    let host = parsed
        .host_str()
        .ok_or_else(|| anyhow!("--database-url {url:?} has no host"))?;
    let host = if host == "localhost" {
        "127.0.0.1"
    } else {
        host
    };
    let addr = format!("{host}:{port}")
        .parse()
        .with_context(|| format!("--database-url {url:?}: the host must be an IP address"))?;
    Ok((addr, port))
}

/// `url` pointed at `addr` instead of its own host and port.
fn via(url: &str, addr: SocketAddr) -> Result<String> {
    let mut parsed = reqwest::Url::parse(url)?;
    parsed
        .set_ip_host(addr.ip())
        .map_err(|()| anyhow!("cannot set the host of {url:?}"))?;
    parsed
        .set_port(Some(addr.port()))
        .map_err(|()| anyhow!("cannot set the port of {url:?}"))?;
    Ok(parsed.to_string())
}

/// What the harness set up before the processes start.
struct World {
    log_dir: PathBuf,
    recording: Recording,
    recorder: tokio::task::JoinHandle<std::io::Result<()>>,
    pg_proxy: Proxy,
    tool_proxy: Proxy,
    keys: BenchKeys,
}

/// Runs the harness once; the report says what held.
///
/// Errors: the harness could not do its work (PostgreSQL unreachable, a
/// binary missing, an engine that never started).
pub async fn run(config: &ChaosConfig) -> Result<Report> {
    config.validate()?;
    let (pg, port) = pg_addr(&config.database_url)?;
    let cluster = match (config.pg_restarts, &config.pg_cluster) {
        (false, _) => None,
        (true, Some(arg)) => Some(postgres::parse_cluster_arg(arg, port)?),
        (true, None) => Some(postgres::find_cluster(port).await?),
    };
    let db = BenchDatabase::create_named(&config.database_url, "belay_chaos").await?;
    let log_dir = std::env::temp_dir().join(&db.name);
    let outcome = match setup(config, &db, &log_dir, pg).await {
        Ok(world) => {
            let outcome = drive(config, &db, &world, cluster.as_ref()).await;
            world.recorder.abort();
            outcome
        }
        Err(e) => Err(e),
    };
    // PostgreSQL must answer again, whatever happened.
    let up = postgres::ensure_up(cluster.as_ref(), &db.url).await;
    let keep = config.keep_database || outcome.as_ref().map_or(true, |r| !r.passed());
    if !keep {
        let _ = db.drop_database().await;
        let _ = std::fs::remove_dir_all(&log_dir);
    }
    up.context("PostgreSQL after the chaos")?;
    outcome
}

async fn setup(
    config: &ChaosConfig,
    db: &BenchDatabase,
    log_dir: &Path,
    pg: SocketAddr,
) -> Result<World> {
    std::fs::create_dir_all(log_dir).with_context(|| format!("creating {}", log_dir.display()))?;
    let keys = crate::keys::mint_for(&db.url, definitions::TENANT, definitions::PERMISSION).await?;
    let recording = Recording::default();
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let recorder_addr = listener.local_addr()?;
    let recorder = tokio::spawn(recorder::serve(
        listener,
        RecorderOptions {
            seed: config.seed,
            slow_share: config.slow_share,
            tool_timeout_ms: config.tool_timeout_ms,
            model_timeout_ms: config.model_timeout_ms,
        },
        recording.clone(),
    ));
    Ok(World {
        log_dir: log_dir.to_owned(),
        recording,
        recorder,
        pg_proxy: Proxy::start("engines to PostgreSQL", pg).await?,
        tool_proxy: Proxy::start("workers to tool server", recorder_addr).await?,
        keys,
    })
}

/// Starts the processes, runs the fault phase and the checks, and kills
/// the processes whatever happened.
async fn drive(
    config: &ChaosConfig,
    db: &BenchDatabase,
    world: &World,
    cluster: Option<&postgres::Cluster>,
) -> Result<Report> {
    // Until an engine listens, its proxy refuses (port 9: discard).
    let nowhere: SocketAddr = "127.0.0.1:9".parse()?;
    let mut engine_proxies = Vec::new();
    for i in 0..config.engines {
        engine_proxies
            .push(Proxy::start(&format!("workers/clients to engine {i}"), nowhere).await?);
    }
    let spec = ProcSpec {
        engine_bin: config.engine_bin.clone(),
        worker_bin: config.worker_bin.clone(),
        log_dir: world.log_dir.clone(),
        database_url: via(&db.url, world.pg_proxy.addr())?,
        lease_ms: config.lease_ms,
        sweep_interval_ms: config.sweep_interval_ms,
        db_connections: 8,
        worker_key: world.keys.worker.clone(),
        tool_url: format!("http://{}", world.tool_proxy.addr()),
        model_timeout_ms: config.model_timeout_ms,
        worker_concurrency: config.worker_concurrency,
    };
    let mut supervisor = Supervisor::new(spec, engine_proxies, config.workers);
    let outcome = phases(config, db, world, cluster, &mut supervisor).await;
    supervisor.stop().await;
    world.pg_proxy.drop_all();
    world.tool_proxy.drop_all();
    outcome
}

/// A client of each engine (through its proxy), with `key`.
fn clients(supervisor: &Supervisor, key: &str) -> Result<Vec<Client>> {
    supervisor
        .engine_proxies()
        .iter()
        .map(|p| {
            let url = format!("http://{}", p.addr());
            Ok(Client::connect(
                &ConnectOptions::new(&url).with_api_key(key),
                definitions::TENANT,
            )?)
        })
        .collect()
}

/// Registers the definitions and grants the tenant its permission.
async fn register(client: &Client, tool_timeout_ms: u64) -> Result<()> {
    client
        .register_files(definitions::bundle(tool_timeout_ms))
        .await
        .context("registering the chaos definitions")?;
    client
        .set_tenant_grants(vec![definitions::PERMISSION.to_owned()])
        .await
        .context("granting the tenant its permission")?;
    Ok(())
}

async fn phases(
    config: &ChaosConfig,
    db: &BenchDatabase,
    world: &World,
    cluster: Option<&postgres::Cluster>,
    supervisor: &mut Supervisor,
) -> Result<Report> {
    supervisor
        .bring_all_up(Duration::from_secs(90))
        .await
        .context("starting the engines and workers")?;
    let clients = clients(supervisor, &world.keys.operator)?;
    register(&clients[0], config.tool_timeout_ms).await?;
    let schedule = faults::plan(&PlanOptions {
        seed: config.seed,
        duration_ms: config.duration.as_millis() as u64,
        mean_interval_ms: config.fault_interval_ms,
        engines: config.engines as usize,
        workers: config.workers as usize,
        pg_restarts: cluster.is_some(),
        lease_ms: config.lease_ms,
    });
    let start = Instant::now();
    let give_up_at = start + config.duration + config.settle_timeout;
    let batch = format!("{:x}", config.seed);
    let submitter = tokio::spawn({
        let clients = clients.clone();
        let (runs, window) = (config.runs, config.duration.mul_f64(0.8));
        async move { submit::submit_all(clients, runs, window, give_up_at, &batch).await }
    });
    let mut injector = Injector::new(
        supervisor,
        &world.pg_proxy,
        &world.tool_proxy,
        cluster.cloned(),
        db.url.clone(),
        &world.log_dir,
    )?;
    let injected = injector
        .run(&schedule, start, start + config.duration)
        .await;
    // Whatever happened: no stall left, PostgreSQL answering.
    let calm = injector.calm().await;
    let (applied, skipped, pg_errors) = (
        std::mem::take(&mut injector.applied),
        std::mem::take(&mut injector.skipped),
        std::mem::take(&mut injector.pg_errors),
    );
    drop(injector);
    injected?;
    calm?;
    supervisor
        .bring_all_up(Duration::from_secs(120))
        .await
        .context("starting everything again after the faults")?;
    let faults_over = Instant::now();
    let mut submissions = submitter.await.context("the submitter panicked")?;
    resubmit(&clients, &mut submissions).await;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&db.url)
        .await
        .context("connecting to the chaos database to check it")?;
    let remaining = config.settle_timeout.saturating_sub(faults_over.elapsed());
    let settled_all = observe::wait_settled(&pool, remaining).await;
    let settle = faults_over.elapsed();
    let facts = observe::read_facts(&pool).await?;
    pool.close().await;
    let observed = Observed {
        submissions,
        facts,
        requests: world.recording.requests(),
        malformed: world.recording.malformed(),
        dead_workers: supervisor.dead_worker_ids().clone(),
        lease_grace_ms: (3 * config.sweep_interval_ms + 1_000) as f64,
        panics: panics(supervisor.logs()),
    };
    let violations = checks::check(&observed);
    Ok(build_report(
        config,
        db,
        world,
        supervisor,
        Phase {
            applied,
            skipped,
            pg_errors,
            settle,
            settled_all,
        },
        &observed,
        violations,
    ))
}

/// Sends `StartRun` once more for every acknowledged run, now that all is
/// calm: the same key must answer with the same run.
async fn resubmit(clients: &[Client], submissions: &mut [Submission]) {
    for s in submissions.iter_mut().filter(|s| !s.run_ids.is_empty()) {
        let client = &clients[s.index as usize % clients.len()];
        let options = belay_sdk::StartOptions {
            idempotency_key: s.key.clone(),
            caller: "belay-chaos".to_owned(),
            caller_grants: vec![definitions::PERMISSION.to_owned()],
        };
        let input = serde_json::json!({ "i": s.index });
        if let Ok((run, _)) = client
            .start_run(definitions::WORKFLOW, &input, options)
            .await
            && let Ok(id) = uuid::Uuid::parse_str(&run.run_id)
        {
            s.run_ids.push(id);
        }
    }
}

/// Every line of the logs that reports a panic, with its file.
fn panics(logs: &[PathBuf]) -> Vec<String> {
    let mut found = Vec::new();
    for log in logs {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        for line in text.lines().filter(|l| l.contains("panicked at")) {
            found.push(format!("{}: {}", log.display(), line.trim()));
        }
    }
    found
}

/// What the fault phase left for the report.
struct Phase {
    applied: BTreeMap<&'static str, u64>,
    skipped: BTreeMap<&'static str, u64>,
    pg_errors: Vec<String>,
    settle: Duration,
    settled_all: bool,
}

fn build_report(
    config: &ChaosConfig,
    db: &BenchDatabase,
    world: &World,
    supervisor: &Supervisor,
    phase: Phase,
    observed: &Observed,
    violations: Vec<Violation>,
) -> Report {
    let facts = &observed.facts;
    let mut statuses = BTreeMap::new();
    for r in &facts.runs {
        *statuses.entry(r.status.clone()).or_insert(0) += 1;
    }
    let mut uncertain = BTreeMap::new();
    for u in &facts.uncertain {
        let state = match &u.resolved_via {
            Some(via) => format!("resolved by {via}"),
            None => u.status.clone(),
        };
        *uncertain.entry(state).or_insert(0) += 1;
    }
    let calls = report::call_outcomes(facts);
    let never_acted: std::collections::BTreeSet<(String, String)> = observed
        .requests
        .iter()
        .filter(|r| r.kind == recorder::ToolKind::Never)
        .map(|r| (r.run.clone(), r.call.clone()))
        .collect();
    let never_lost_results = never_lost(facts, &never_acted);
    let (engine_starts, worker_starts) = supervisor.starts();
    let mut proxies: Vec<&Proxy> = supervisor.engine_proxies().iter().collect();
    proxies.push(&world.pg_proxy);
    proxies.push(&world.tool_proxy);
    Report {
        seed: config.seed,
        database: db.name.clone(),
        log_dir: world.log_dir.display().to_string(),
        runs: config.runs,
        acknowledged: observed
            .submissions
            .iter()
            .filter(|s| !s.run_ids.is_empty())
            .count(),
        start_attempts: observed
            .submissions
            .iter()
            .map(|s| u64::from(s.attempts))
            .sum(),
        duration: config.duration,
        engines: (config.engines, engine_starts),
        workers: (config.workers, worker_starts),
        lease_ms: config.lease_ms,
        faults: phase.applied,
        skipped: phase.skipped,
        proxies: proxies
            .iter()
            .map(|p| {
                let c = p.counts();
                let load =
                    |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
                (
                    p.name().to_owned(),
                    load(&c.accepted),
                    load(&c.dropped),
                    load(&c.refused),
                )
            })
            .collect(),
        exits: supervisor
            .exits()
            .iter()
            .map(|e| format!("{} ({})", e.name, e.status))
            .collect(),
        settle: phase.settle,
        settled_all: phase.settled_all,
        statuses,
        calls,
        requests: recorder::ToolKind::ALL
            .iter()
            .map(|k| {
                (
                    k.tool(),
                    observed.requests.iter().filter(|r| r.kind == *k).count(),
                )
            })
            .collect(),
        probes: world.recording.probe_requests(),
        model_requests: world.recording.model_requests(),
        slow_answers: world.recording.slow_answers(),
        uncertain,
        never_lost_results,
        pg_errors: phase.pg_errors,
        violations,
    }
}

/// `never` calls that reached the tool but ended `tool_call_failed`.
fn never_lost(facts: &observe::Facts, acted: &std::collections::BTreeSet<(String, String)>) -> u64 {
    let mut lost = 0;
    for (run, events) in &facts.events {
        for e in events.iter().filter(|e| e.kind == "tool_call_failed") {
            let call = e.payload.get("call_id").and_then(serde_json::Value::as_str);
            if let Some(call) = call
                && acted.contains(&(run.to_string(), call.to_owned()))
            {
                lost += 1;
            }
        }
    }
    lost
}
