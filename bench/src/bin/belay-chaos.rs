//! `belay-chaos`: the chaos harness (issue 22). Runs real `belay-engine` and
//! `belay-worker` processes against a fresh PostgreSQL database, submits
//! runs that call `never`, `idempotent` and `reconcile` tools, injects
//! faults (SIGKILLs, PostgreSQL restarts, dropped and stalled connections)
//! for `--duration` seconds, lets the runs settle, checks the invariants
//! and prints the figures and every violation. Exit status: 0 when every
//! check held, 1 on a violation, 2 when the harness could not do its work.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use belay_bench::chaos::{self, ChaosConfig};
use clap::Parser;

#[derive(Parser)]
#[command(
    name = "belay-chaos",
    about = "Belay's chaos harness: engines, workers, runs of never/idempotent/reconcile tools, SIGKILLs, PostgreSQL restarts and broken connections; then the invariants"
)]
struct Args {
    /// Seed of the fault schedule and the slow answers (default: drawn
    /// from the clock, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Runs to submit (over the first 80% of --duration).
    #[arg(long, default_value_t = 100)]
    runs: u32,
    /// Seconds of faults.
    #[arg(long, default_value_t = 120)]
    duration: u64,
    /// Engine processes.
    #[arg(long, default_value_t = 2)]
    engines: u32,
    /// Worker processes.
    #[arg(long, default_value_t = 3)]
    workers: u32,
    /// A database on the PostgreSQL server to use: a fresh database
    /// `belay_chaos_<uuid>` is made next to it (dropped afterwards unless a
    /// check failed).
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/test"
    )]
    database_url: String,
    /// The `belay-engine` executable (default: next to this one).
    #[arg(long)]
    engine_bin: Option<PathBuf>,
    /// The `belay-worker` executable (default: next to this one).
    #[arg(long)]
    worker_bin: Option<PathBuf>,
    /// Do not restart PostgreSQL (the other faults still happen).
    #[arg(long)]
    no_pg_restarts: bool,
    /// The cluster to restart, VERSION/NAME (default: the one `pg_lsclusters`
    /// lists on the database URL's port).
    #[arg(long)]
    pg_cluster: Option<String>,
    /// The engines' lease, ms.
    #[arg(long, default_value_t = 2_000)]
    lease_ms: u64,
    /// The engines' lease-sweep interval, ms.
    #[arg(long, default_value_t = 200)]
    sweep_interval_ms: u64,
    /// Mean time between two faults, ms.
    #[arg(long, default_value_t = 1_500)]
    fault_interval_ms: u64,
    /// The tools' timeout, ms.
    #[arg(long, default_value_t = 2_000)]
    tool_timeout_ms: u64,
    /// The workers' model timeout, ms.
    #[arg(long, default_value_t = 3_000)]
    model_timeout_ms: u64,
    /// Share of tool and model answers held back for 0.5 to 1.5 timeouts.
    #[arg(long, default_value_t = 0.05)]
    slow_share: f64,
    /// Tasks each worker runs at once.
    #[arg(long, default_value_t = 8)]
    worker_concurrency: u32,
    /// Seconds the runs may take to settle once the faults stop.
    #[arg(long, default_value_t = 180)]
    settle_timeout_secs: u64,
    /// Keep the database and the logs even when every check holds.
    #[arg(long)]
    keep_database: bool,
}

/// A seed from the clock, when none is given.
fn clock_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    chaos::rng::mix(nanos ^ u64::from(std::process::id())) % 1_000_000
}

/// `name` next to this executable.
fn sibling(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf))
        .unwrap_or_default()
        .join(name)
}

fn config(args: Args) -> ChaosConfig {
    ChaosConfig {
        seed: args.seed.unwrap_or_else(clock_seed),
        runs: args.runs,
        duration: Duration::from_secs(args.duration),
        engines: args.engines,
        workers: args.workers,
        database_url: args.database_url,
        pg_restarts: !args.no_pg_restarts,
        pg_cluster: args.pg_cluster,
        lease_ms: args.lease_ms,
        sweep_interval_ms: args.sweep_interval_ms,
        fault_interval_ms: args.fault_interval_ms,
        tool_timeout_ms: args.tool_timeout_ms,
        model_timeout_ms: args.model_timeout_ms,
        slow_share: args.slow_share,
        worker_concurrency: args.worker_concurrency,
        settle_timeout: Duration::from_secs(args.settle_timeout_secs),
        keep_database: args.keep_database,
        ..ChaosConfig::new(
            args.engine_bin.unwrap_or_else(|| sibling("belay-engine")),
            args.worker_bin.unwrap_or_else(|| sibling("belay-worker")),
        )
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // sqlx's slow-statement warnings (a DROP DATABASE of the
                // fresh database while PostgreSQL is busy) are noise here.
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,sqlx=error")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let config = config(args);
    for line in config.lines() {
        println!("{line}");
    }
    println!();
    match chaos::run(&config).await {
        Ok(report) => {
            for line in report.lines() {
                println!("{line}");
            }
            if report.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("belay-chaos could not finish: {e:#}");
            ExitCode::from(2)
        }
    }
}
