//! What the `scripted-model` and `crm-server` binaries share: logging to
//! stderr, announcing the bound address on stdout, and stopping on signals.
//!
//! Tests spawn the binaries with `--listen 127.0.0.1:0` and read the one line
//! the binary prints to stdout to learn the port, so stdout carries exactly that
//! line and everything else goes to stderr.

use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::time::Duration;

use tracing_subscriber::EnvFilter;

/// How long a binary waits for in-flight requests after a stop signal before
/// exiting anyway, so a stuck client cannot keep a test double alive.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Sends `tracing` output to stderr, filtered by `RUST_LOG` (default `info`).
pub fn init_stderr_logging() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // `try_init` so a second call (or a test harness's subscriber) is harmless.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// The line a binary prints once it is listening: `listening on http://ADDR`.
pub fn listening_line(addr: SocketAddr) -> String {
    format!("listening on http://{addr}")
}

/// Prints [`listening_line`] to stdout and flushes it.
///
/// A closed stdout (the spawning test stopped reading) is logged, not fatal:
/// the server is still useful to whoever already knows its address.
pub fn announce(addr: SocketAddr) {
    let mut stdout = std::io::stdout().lock();
    if let Err(error) = writeln!(stdout, "{}", listening_line(addr)).and_then(|()| stdout.flush()) {
        tracing::warn!(%error, "cannot print the listening address to stdout");
    }
}

/// Completes on SIGTERM or Ctrl-C (SIGINT): the engine's one stop signal.
pub use belay_engine::server::shutdown_signal;

/// Runs a server future until it ends by itself, or until `stop` completes and
/// then at most [`SHUTDOWN_GRACE`] more, whichever is first.
///
/// `serve` is expected to start its own graceful shutdown when `stop`
/// completes (it is given a clone of the same signal); this only bounds how long
/// that may take.
pub async fn run_until_stopped<F>(
    serve: F,
    stop: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()>
where
    F: std::future::Future<Output = std::io::Result<()>>,
{
    let mut stop = stop;
    let deadline = async move {
        // An error means the sender is gone, which only happens at exit.
        let _ = stop.wait_for(|stopped| *stopped).await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    tokio::select! {
        result = serve => result,
        () = deadline => {
            tracing::warn!("in-flight requests did not finish within {SHUTDOWN_GRACE:?}; exiting anyway");
            Ok(())
        }
    }
}
