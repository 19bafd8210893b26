//! `crm-server`: the onboarding example's CRM test double as a process.
//!
//! Prints `listening on http://ADDR` as its only stdout line, logs to stderr,
//! and stops on SIGTERM or Ctrl-C. See `belay_example_onboarding::crm_server`.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use belay_example_onboarding::crm_server::{CrmState, serve_crm_server};
use belay_example_onboarding::process;
use clap::Parser;

/// In-memory CRM HTTP server with idempotency keys and fault injection (a test
/// double).
#[derive(Debug, Parser)]
#[command(
    version,
    about = "A CRM HTTP server for the onboarding example (a test double with fault injection)"
)]
struct Args {
    /// Address to listen on; port 0 picks a free port (printed on stdout).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
}

fn main() -> ExitCode {
    process::init_stderr_logging();
    let args = Args::parse();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{error:#}");
            ExitCode::FAILURE
        }
    }
}

#[tokio::main]
async fn run(args: Args) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener
        .local_addr()
        .context("cannot read the bound address")?;
    process::announce(addr);
    tracing::info!(%addr, "CRM server listening");

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut serve_stop = stop_rx.clone();
    let serve = serve_crm_server(listener, Arc::new(CrmState::new()), async move {
        let _ = serve_stop.wait_for(|stopped| *stopped).await;
    });
    tokio::spawn(async move {
        process::shutdown_signal().await;
        stop_tx.send_replace(true);
        // Keep the sender alive so receivers do not see it as dropped.
        std::future::pending::<()>().await;
    });
    process::run_until_stopped(serve, stop_rx)
        .await
        .context("server error")?;
    tracing::info!("stopped");
    Ok(())
}
