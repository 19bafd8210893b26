//! `belay-bench`: Belay's throughput benchmark. Prints the configuration, then
//! one line per figure (runs/s, steps/s, step latency p50/p99, PostgreSQL
//! transactions per step, engine and worker peak RSS, PostgreSQL's
//! single-insert commit ceiling and the share of it reached). Exits non-zero
//! when a run fails or the runs do not finish in time.
//!
//! The hidden `engine` and `worker` subcommands are the bench re-running
//! itself as one engine or one worker process; they take the same flags as
//! `belay-engine` and `belay-worker`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use belay_bench::fleet::{self, ChildCommand, EngineOptions, Launch, WorkerOptions};
use belay_bench::{BenchConfig, current_exe};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "belay-bench",
    about = "Belay throughput benchmark: engines, workers, R runs of K no-op tool steps, and PostgreSQL's own commit ceiling",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(flatten)]
    bench: BenchArgs,
    #[command(subcommand)]
    role: Option<Role>,
}

#[derive(clap::Args)]
struct BenchArgs {
    /// Runs to submit (R).
    #[arg(long, default_value_t = 200)]
    runs: u32,
    /// No-op tool steps per run (K); a run is 2K+1 steps (K+1 model calls).
    #[arg(long, default_value_t = 5)]
    steps: u32,
    /// What a run does: `agent` (K+1 scripted model calls, K tool calls) or
    /// `loop` (a workflow calling the tool K times round a loop, no model).
    #[arg(long, value_enum, default_value = "agent")]
    shape: belay_bench::Shape,
    /// Size of the no-op tool's JSON answer, bytes (0: `{"ok":true}`).
    #[arg(long, default_value_t = 0)]
    result_bytes: usize,
    /// Workers (N).
    #[arg(long, default_value_t = 2)]
    workers: u32,
    /// Engine replicas (E), all on the same database.
    #[arg(long, default_value_t = 1)]
    engines: u32,
    /// Runs submitted and in flight at once (C); also the commit ceiling's
    /// connections (at most --ceiling-max-connections).
    #[arg(long, default_value_t = 50)]
    concurrency: u32,
    /// Submit runs at this rate (runs/s, open loop; still at most
    /// --concurrency in flight), to measure step latency below the peak.
    #[arg(long)]
    rate: Option<f64>,
    /// A database on the PostgreSQL server to use: the bench creates its own
    /// fresh database `belay_bench_<uuid>` next to it and drops it afterwards.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/test"
    )]
    database_url: String,
    /// The engines' lease, ms.
    #[arg(long, default_value_t = 30_000)]
    lease_ms: u64,
    /// Tasks each worker runs at once (belay-worker --concurrency).
    #[arg(long, default_value_t = belay_worker::config::DEFAULT_CONCURRENCY as u32)]
    worker_concurrency: u32,
    /// Each engine's database connections (belay-engine --db-connections).
    #[arg(long, default_value_t = 16)]
    db_connections: u32,
    /// Seconds the single-insert commit ceiling is measured; 0 skips it.
    #[arg(long, default_value_t = 5.0)]
    ceiling_secs: f64,
    /// Most connections the ceiling uses.
    #[arg(long, default_value_t = 64)]
    ceiling_max_connections: u32,
    /// Give up when the runs have not all ended after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout_secs: u64,
    /// How often the bench checks which runs ended (one query), ms.
    #[arg(long, default_value_t = 5)]
    poll_ms: u64,
    /// Run engines and workers inside the bench process instead of as child
    /// processes (their peak RSS is then the bench's).
    #[arg(long, conflicts_with_all = ["engine_bin", "worker_bin"])]
    in_process: bool,
    /// Engine executable to start instead of the bench itself (e.g.
    /// target/release/belay-engine; make sure it is freshly built).
    #[arg(long)]
    engine_bin: Option<PathBuf>,
    /// Worker executable to start instead of the bench itself (e.g.
    /// target/release/belay-worker).
    #[arg(long)]
    worker_bin: Option<PathBuf>,
    /// Keep the database and the processes' logs afterwards.
    #[arg(long)]
    keep_database: bool,
    /// Instead of the throughput run: the waiting-runs scenario. Submit this
    /// many runs that wait for a signal (one engine, no worker), report the
    /// engine's memory while they all wait, then signal them all and time
    /// their completion. Uses --concurrency, --db-connections,
    /// --database-url, --timeout-secs.
    #[arg(long)]
    waiting_runs: Option<u32>,
    /// Also run the workload on this engine, in the same invocation: R runs
    /// of K steps with C in flight, then --sequential-runs one at a time, on
    /// Belay (--shape loop) and on the peer, and print both and their ratios.
    #[arg(long, value_enum)]
    peer: Option<belay_bench::peer::Peer>,
    /// With --peer: runs of the sequential rounds.
    #[arg(long, default_value_t = 100, requires = "peer")]
    sequential_runs: u32,
}

#[derive(Subcommand)]
enum Role {
    /// Serve one engine (what the bench starts as a child process).
    #[command(hide = true)]
    Engine(EngineArgs),
    /// Run one worker (what the bench starts as a child process).
    #[command(hide = true)]
    Worker(WorkerArgs),
}

/// The `belay-engine` flags the bench passes.
#[derive(clap::Args)]
struct EngineArgs {
    #[arg(long)]
    database_url: String,
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    #[arg(long, default_value_t = 30_000)]
    lease_ms: u64,
    #[arg(long, default_value_t = 1_000)]
    sweep_interval_ms: u64,
    #[arg(long, default_value_t = 16)]
    db_connections: u32,
}

/// The `belay-worker` flags the bench passes.
#[derive(clap::Args)]
struct WorkerArgs {
    #[arg(long)]
    engine_url: String,
    /// The worker's API key, as `belay-worker --api-key`; the bench passes
    /// it in the environment.
    #[arg(long, env = "BELAY_API_KEY", hide_env_values = true)]
    api_key: String,
    #[arg(long)]
    worker_id: String,
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    #[arg(long)]
    model_base_url: String,
    #[arg(long)]
    http_base_url: String,
    /// Serve `/livez` and `/readyz` here, as `belay-worker --health-listen`
    /// (the bench waits for every worker's `/readyz` before it submits).
    #[arg(long)]
    health_listen: Option<std::net::SocketAddr>,
    /// Accepted for compatibility with `belay-worker`; the bench's own worker
    /// always uses [`fleet::WORKER_SHUTDOWN_GRACE_MS`].
    #[arg(long)]
    shutdown_grace_ms: Option<u64>,
    /// Accepted for compatibility with `belay-worker`; the bench's own worker
    /// always allows loopback, where its tool server is.
    #[command(flatten)]
    allow_private_networks: belay_worker::ssrf::AllowPrivateNetworkArgs,
}

async fn engine_role(args: EngineArgs) -> anyhow::Result<()> {
    let coord = fleet::start_engine(&EngineOptions {
        database_url: args.database_url,
        lease_ms: args.lease_ms,
        sweep_interval_ms: args.sweep_interval_ms,
        db_connections: args.db_connections,
    })
    .await?;
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    // The parent reads this line to find the port, as with belay-engine.
    println!("listening on http://{}", listener.local_addr()?);
    std::io::Write::flush(&mut std::io::stdout())?;
    fleet::serve_engine(coord, listener, fleet::parent_gone()).await
}

async fn worker_role(args: WorkerArgs) -> anyhow::Result<()> {
    fleet::run_worker(
        &WorkerOptions {
            engine_url: args.engine_url,
            api_key: args.api_key,
            worker_id: args.worker_id,
            concurrency: args.concurrency,
            model_base_url: args.model_base_url,
            http_base_url: args.http_base_url,
        },
        belay_worker::health::HealthState::default(),
        args.health_listen,
        fleet::parent_gone(),
    )
    .await
}

async fn bench(args: BenchArgs) -> anyhow::Result<()> {
    let launch = if args.in_process {
        Launch::InProcess
    } else {
        let exe = current_exe()?;
        Launch::Processes {
            engine: args
                .engine_bin
                .map(ChildCommand::binary)
                .unwrap_or_else(|| ChildCommand::bench_role(&exe, "engine")),
            worker: args
                .worker_bin
                .map(ChildCommand::binary)
                .unwrap_or_else(|| ChildCommand::bench_role(&exe, "worker")),
        }
    };
    if let Some(runs) = args.waiting_runs {
        let config = belay_bench::waits::WaitsConfig {
            runs,
            concurrency: args.concurrency,
            database_url: args.database_url,
            engine_db_connections: args.db_connections,
            timeout: Duration::from_secs(args.timeout_secs),
            launch,
            keep_database: args.keep_database,
        };
        println!(
            "scenario: waiting runs (W={runs}, concurrency {})\n",
            config.concurrency
        );
        let report = belay_bench::waits::run(&config).await?;
        for line in report.lines() {
            println!("{line}");
        }
        return Ok(());
    }
    if !args.ceiling_secs.is_finite() || args.ceiling_secs < 0.0 {
        anyhow::bail!("--ceiling-secs must be a number of seconds, at least 0");
    }
    let config = BenchConfig {
        runs: args.runs,
        tool_steps: args.steps,
        shape: args.shape,
        result_bytes: args.result_bytes,
        workers: args.workers,
        engines: args.engines,
        concurrency: args.concurrency,
        rate: args.rate,
        database_url: args.database_url,
        lease_ms: args.lease_ms,
        worker_concurrency: args.worker_concurrency,
        engine_db_connections: args.db_connections,
        poll_ms: args.poll_ms,
        timeout: Duration::from_secs(args.timeout_secs),
        ceiling_duration: Duration::from_secs_f64(args.ceiling_secs),
        ceiling_max_connections: args.ceiling_max_connections,
        keep_database: args.keep_database,
        ..BenchConfig::new(launch)
    };
    for line in config.lines() {
        println!("{line}");
    }
    println!();
    if let Some(belay_bench::peer::Peer::Restate) = args.peer {
        let comparison = belay_bench::peer::compare(&config, args.sequential_runs).await?;
        for line in comparison.lines() {
            println!("{line}");
        }
        return Ok(());
    }
    let report = belay_bench::run(&config).await?;
    for line in report.lines() {
        println!("{line}");
    }
    Ok(())
}

fn main() -> ExitCode {
    // Started as an expression evaluator of the sandbox: serve and exit.
    belay_engine::expr_sandbox::run_sandbox_if_requested();
    // Otherwise evaluate workflow expressions in such evaluators.
    belay_engine::expr_sandbox::enable_sandbox();
    async_main()
}

#[tokio::main]
async fn async_main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let result = match cli.role {
        Some(Role::Engine(args)) => engine_role(args).await,
        Some(Role::Worker(args)) => worker_role(args).await,
        None => bench(cli.bench).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
