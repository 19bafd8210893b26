//! `belay-engine`: the engine server (coordinator) and its `migrate` command.

use std::sync::Arc;

use anyhow::Context;
use belay_engine::coordinator::{Coordinator, CoordinatorConfig};
use belay_engine::store::Store;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "belay-engine",
    version,
    about = "Belay engine: coordinator, gRPC API, lease sweeper"
)]
struct Cli {
    /// PostgreSQL URL.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/test",
        global = true
    )]
    database_url: String,
    #[command(flatten)]
    serve: ServeArgs,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Apply migrations and serve (the default when no command is given).
    Serve,
    /// Apply migrations and exit.
    Migrate,
}

#[derive(clap::Args)]
struct ServeArgs {
    /// gRPC listen address; port 0 picks a free port.
    #[arg(long, env = "BELAY_LISTEN", default_value = "127.0.0.1:50051")]
    listen: String,
    /// Lease length of a claim or heartbeat, ms.
    #[arg(long, env = "BELAY_LEASE_MS", default_value_t = 30_000)]
    lease_ms: u64,
    /// How often expired leases are looked for, ms.
    #[arg(long, env = "BELAY_SWEEP_INTERVAL_MS", default_value_t = 1_000)]
    sweep_interval_ms: u64,
    /// Database connections.
    #[arg(long, env = "BELAY_DB_CONNECTIONS", default_value_t = 16)]
    db_connections: u32,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Migrate) => {
            let store = Store::connect(&cli.database_url, 2)
                .await
                .context("connecting to PostgreSQL")?;
            store.migrate().await.context("applying migrations")?;
            println!("migrations applied");
            Ok(())
        }
        Some(Command::Serve) | None => serve(&cli.database_url, cli.serve).await,
    }
}

async fn serve(database_url: &str, args: ServeArgs) -> anyhow::Result<()> {
    let store = Store::connect(database_url, args.db_connections)
        .await
        .context("connecting to PostgreSQL")?;
    store.migrate().await.context("applying migrations")?;
    let coord = Coordinator::new(
        store,
        CoordinatorConfig {
            lease_ms: args.lease_ms,
            sweep_interval_ms: args.sweep_interval_ms,
        },
    );
    let background = coord.spawn_background();
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let addr = listener.local_addr()?;
    // Tests and scripts read this line to find the port.
    println!("listening on http://{addr}");
    use std::io::Write;
    std::io::stdout().flush()?;
    let result = belay_engine::api::serve(Arc::clone(&coord), listener, shutdown_signal()).await;
    for h in background {
        h.abort();
    }
    result
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
    tracing::info!("shutting down");
}
