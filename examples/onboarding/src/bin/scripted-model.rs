//! `scripted-model`: the scripted OpenAI-compatible model server as a process.
//!
//! Prints `listening on http://ADDR` as its only stdout line, logs to stderr,
//! and stops on SIGTERM or Ctrl-C. See `belay_example_onboarding::model_server`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use belay_example_onboarding::model_server::{ModelServerState, Script, serve_model_server};
use belay_example_onboarding::process;
use clap::Parser;

/// Scripted OpenAI-compatible chat completions server (a test double).
#[derive(Debug, Parser)]
#[command(
    version,
    about = "A scripted OpenAI-compatible Chat Completions server (a test double)"
)]
struct Args {
    /// Address to listen on; port 0 picks a free port (printed on stdout).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Script file (YAML: model name -> turns). Default: the onboarding
    /// example's embedded script.yaml.
    #[arg(long)]
    script: Option<PathBuf>,
    /// Require `Authorization: Bearer <KEY>` on completion requests.
    #[arg(long, env = "SCRIPTED_MODEL_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
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
    // Loaded before binding, so a bad script fails fast without announcing an
    // address that will never answer.
    let script = match &args.script {
        Some(path) => Script::from_file(path)?,
        None => Script::onboarding().context("the embedded onboarding script is invalid")?,
    };
    let models: Vec<&str> = script.models().collect();
    tracing::info!(?models, auth = args.api_key.is_some(), "script loaded");
    let state = Arc::new(ModelServerState::new(script, args.api_key));

    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener
        .local_addr()
        .context("cannot read the bound address")?;
    process::announce(addr);
    tracing::info!(%addr, "scripted model server listening");

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut serve_stop = stop_rx.clone();
    let serve = serve_model_server(listener, state, async move {
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
