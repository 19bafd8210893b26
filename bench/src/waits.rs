//! The waiting-runs scenario (issue 5): a run that waits holds no worker, no
//! connection and no task slot. [`run`] starts one engine (a child process,
//! so its memory is its own) and no worker at all, submits W runs of a
//! workflow whose first node waits for a signal, checks that all W are
//! `waiting` with no task row, reads the engine's RSS, then signals every
//! run and waits until all have completed. It prints one `name: value` line
//! per figure.
//!
//! The workflow (`workload::WAIT_WORKFLOW`): `wait` for signal `go` with a
//! payload schema, then `succeed` with the payload. Every call carries the
//! bench's operator key ([`crate::keys`]), minted before the engine starts.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use belay_proto::v1;
use belay_proto::v1::run_service_client::RunServiceClient;
use belay_sdk::{ConnectOptions, StartOptions};
use serde_json::json;
use tokio::sync::Semaphore;

use crate::fleet::{EngineOptions, Fleet, Launch};
use crate::pg::BenchDatabase;

/// Settings of the waiting-runs scenario.
#[derive(Debug, Clone)]
pub struct WaitsConfig {
    /// Runs that wait at once (W).
    pub runs: u32,
    /// Requests in flight at once while submitting and signalling.
    pub concurrency: u32,
    /// A database URL on the PostgreSQL server (a fresh database is created
    /// next to it and dropped afterwards).
    pub database_url: String,
    /// The engine's connection pool size.
    pub engine_db_connections: u32,
    /// Give up after this.
    pub timeout: Duration,
    /// Where the engine runs.
    pub launch: Launch,
    /// Keep the database and logs.
    pub keep_database: bool,
}

/// The figures of one scenario run.
#[derive(Debug, Clone)]
pub struct WaitsReport {
    /// W.
    pub runs: u32,
    /// Time to submit all W runs, each ending in `waiting`.
    pub submit: Duration,
    /// Runs waiting at once, as counted in the database.
    pub waiting: i64,
    /// Task rows while they wait (0: nothing for a worker to hold).
    pub tasks_while_waiting: i64,
    /// Engine RSS (current) with W runs waiting, KiB.
    pub engine_rss_waiting_kib: u64,
    /// Time from the first signal to the last run completed.
    pub signal_to_done: Duration,
    /// Runs completed.
    pub completed: i64,
    /// Engine peak RSS over the whole scenario, KiB.
    pub engine_peak_kib: u64,
}

impl WaitsReport {
    /// One `name: value` line per figure.
    pub fn lines(&self) -> Vec<String> {
        let per_s = |n: u32, d: Duration| n as f64 / d.as_secs_f64().max(1e-9);
        vec![
            format!("waiting runs (W): {}", self.runs),
            "workers: 0 (a waiting run needs none)".to_owned(),
            format!(
                "submit W runs to waiting: {:.2} s ({:.0} runs/s)",
                self.submit.as_secs_f64(),
                per_s(self.runs, self.submit)
            ),
            format!("runs waiting at once: {}", self.waiting),
            format!("task rows while waiting: {}", self.tasks_while_waiting),
            format!(
                "engine RSS with W runs waiting: {:.1} MiB",
                self.engine_rss_waiting_kib as f64 / 1024.0
            ),
            format!(
                "signal all W to all completed: {:.2} s ({:.0} runs/s)",
                self.signal_to_done.as_secs_f64(),
                per_s(self.runs, self.signal_to_done)
            ),
            format!("runs completed: {}", self.completed),
            format!(
                "engine peak RSS: {:.1} MiB",
                self.engine_peak_kib as f64 / 1024.0
            ),
        ]
    }
}

/// Run the scenario.
///
/// Errors: PostgreSQL unreachable, the engine failing, a run not reaching
/// `waiting` or `completed` within the timeout.
pub async fn run(config: &WaitsConfig) -> Result<WaitsReport> {
    let db = BenchDatabase::create(&config.database_url).await?;
    let log_dir = std::env::temp_dir().join(&db.name);
    let mut fleet = Fleet::new(config.launch.clone(), log_dir.clone(), "waits-");
    let result = tokio::time::timeout(config.timeout, drive(config, &db, &mut fleet)).await;
    fleet.stop().await;
    if !config.keep_database {
        db.drop_database().await?;
        let _ = std::fs::remove_dir_all(&log_dir);
    }
    match result {
        Ok(r) => r.map_err(|e| anyhow!("{e:#}\n(engine log: {})", log_dir.display())),
        Err(_) => bail!(
            "the scenario did not finish within {} s",
            config.timeout.as_secs()
        ),
    }
}

async fn drive(config: &WaitsConfig, db: &BenchDatabase, fleet: &mut Fleet) -> Result<WaitsReport> {
    let keys = crate::keys::mint(&db.url).await?;
    let engine_url = fleet
        .add_engine(&EngineOptions {
            database_url: db.url.clone(),
            lease_ms: 30_000,
            sweep_interval_ms: 1_000,
            db_connections: config.engine_db_connections,
        })
        .await?;
    let client = crate::client(&engine_url, &keys.operator)?;
    client
        .register_files(vec![v1::DefinitionFile {
            path: "waits.yaml".into(),
            content: crate::workload::WAIT_WORKFLOW.into(),
        }])
        .await
        .context("registering the waiting workflow")?;
    let channel = ConnectOptions::new(&engine_url)
        .with_api_key(&keys.operator)
        .connect_lazy_with(|endpoint| endpoint.tcp_nodelay(true))?;
    let pool = sqlx::PgPool::connect(&db.url).await?;
    let limit = Arc::new(Semaphore::new(config.concurrency.max(1) as usize));

    // Submit W runs; each StartRun returns once the run is `waiting`.
    let started = Instant::now();
    let mut jobs = tokio::task::JoinSet::new();
    for i in 0..config.runs {
        let client = client.clone();
        let permit = Arc::clone(&limit).acquire_owned().await?;
        jobs.spawn(async move {
            let _permit = permit;
            let (run, _) = client
                .start_run(
                    "bench_wait",
                    &json!({"i": i}),
                    StartOptions {
                        idempotency_key: format!("wait-{i}"),
                        caller: "bench".into(),
                        caller_grants: vec![],
                    },
                )
                .await?;
            if run.status != "waiting" {
                bail!(
                    "run {} is {} after start, not waiting",
                    run.run_id,
                    run.status
                );
            }
            Ok::<_, anyhow::Error>(run.run_id)
        });
    }
    let mut run_ids = Vec::with_capacity(config.runs as usize);
    while let Some(joined) = jobs.join_next().await {
        run_ids.push(joined??);
    }
    let submit = started.elapsed();
    let waiting: i64 = sqlx::query_scalar("SELECT count(*) FROM runs WHERE status = 'waiting'")
        .fetch_one(&pool)
        .await?;
    let tasks_while_waiting: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks")
        .fetch_one(&pool)
        .await?;
    let engine_rss_waiting_kib = fleet
        .current_rss()?
        .first()
        .copied()
        .ok_or_else(|| anyhow!("no engine RSS"))?;

    // Signal every run, then wait for all to complete.
    let started = Instant::now();
    let mut jobs = tokio::task::JoinSet::new();
    for run_id in run_ids {
        let mut runs = RunServiceClient::new(channel.clone());
        let permit = Arc::clone(&limit).acquire_owned().await?;
        jobs.spawn(async move {
            let _permit = permit;
            let resp = runs
                .signal_run(v1::SignalRunRequest {
                    tenant: crate::workload::TENANT.into(),
                    run_id: run_id.clone(),
                    name: "go".into(),
                    signal_id: format!("go-{run_id}"),
                    payload_json: r#"{"ok": true}"#.into(),
                    sent_by: "bench".into(),
                })
                .await?
                .into_inner();
            let status = resp.run.map(|r| r.status).unwrap_or_default();
            if status != "completed" {
                bail!("run {run_id} is {status} after its signal, not completed");
            }
            Ok::<_, anyhow::Error>(())
        });
    }
    while let Some(joined) = jobs.join_next().await {
        joined??;
    }
    let signal_to_done = started.elapsed();
    let completed: i64 = sqlx::query_scalar("SELECT count(*) FROM runs WHERE status = 'completed'")
        .fetch_one(&pool)
        .await?;
    pool.close().await;
    let peak = fleet.peak_rss()?;
    Ok(WaitsReport {
        runs: config.runs,
        submit,
        waiting,
        tasks_while_waiting,
        engine_rss_waiting_kib,
        signal_to_done,
        completed,
        engine_peak_kib: peak.engines_kib.first().copied().unwrap_or(0),
    })
}
