//! `belay health`, the probe the container images run as their
//! `HEALTHCHECK` (deploy/container/Containerfile): exit 0 and `SERVING` for
//! a real engine's grpc.health.v1, exit 1 with one error line naming the URL
//! when nothing answers; with `--url`, a real worker's `/readyz`: 503 (and
//! its reason) while its engine is unreachable, 200 once a claim was
//! answered.

use std::process::{Output, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use belay_tests::{DbBackend, EngineOpts, Env, Proc, bin};
use tokio::process::Command;

const T: Duration = Duration::from_secs(60);

/// `belay health args…` to its end.
async fn health(args: &[&str]) -> Result<Output> {
    let mut cmd = Command::new(bin("belay")?);
    cmd.arg("health")
        .args(args)
        .env_remove("BELAY_HEALTH_URL")
        .env_remove("BELAY_ENGINE_URL")
        .env_remove("BELAY_CA_FILE")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    tokio::time::timeout(T, cmd.output())
        .await
        .with_context(|| format!("belay health {args:?} did not exit"))?
        .map_err(Into::into)
}

/// The probe failed with exit 1 and exactly one `error:` line; returns it.
fn unhealthy(output: &Output) -> Result<String> {
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(
        output.status.code() == Some(1),
        "exit {:?}; stderr: {stderr}",
        output.status.code()
    );
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    match errors.as_slice() {
        [line] => Ok((*line).to_owned()),
        _ => bail!("expected one `error:` line, got: {stderr}"),
    }
}

/// A port on 127.0.0.1 that nothing listens on (bound, then released).
fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn belay_health_says_serving_for_an_engine_and_fails_naming_a_dead_url() -> Result<()> {
    let env = Env::start_on(DbBackend::Sqlite, EngineOpts::default()).await?;
    let url = env.engines[0].url.clone();
    let out = health(&["--engine-url", &url]).await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        stdout.trim() == format!("{url}: SERVING"),
        "printed {stdout:?}"
    );

    let dead = format!("http://127.0.0.1:{}", free_port()?);
    let line = unhealthy(&health(&["--engine-url", &dead, "--timeout", "2s"]).await?)?;
    ensure!(line.contains(&dead), "{line}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn belay_health_url_follows_a_workers_readyz() -> Result<()> {
    let mut env = Env::start_on(DbBackend::Sqlite, EngineOpts::default()).await?;

    // A worker whose engine does not answer: not ready, and /readyz says why.
    let port = free_port()?;
    let readyz = format!("http://127.0.0.1:{port}/readyz");
    let lonely = Proc::spawn(
        "lonely-worker",
        &bin("belay-worker")?,
        &[
            "--engine-url".into(),
            format!("http://127.0.0.1:{}", free_port()?),
            "--health-listen".into(),
            format!("127.0.0.1:{port}"),
        ],
        &[("BELAY_API_KEY", env.worker_key.clone())],
        false,
    )
    .await?;
    // Until its health listener is bound the probe cannot connect: poll
    // (another process's listener gives nothing to await).
    let deadline = tokio::time::Instant::now() + T;
    let line = loop {
        let line = unhealthy(&health(&["--url", &readyz]).await?)?;
        if line.contains("503") {
            break line;
        }
        ensure!(line.contains(&readyz), "{line}");
        ensure!(
            tokio::time::Instant::now() < deadline,
            "never answered: {line}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    ensure!(
        line.contains("reason"),
        "the 503's reason is printed: {line}"
    );
    drop(lonely);

    // A worker of the env's engine: ready once its first claim is answered.
    let port = free_port()?;
    let readyz = format!("http://127.0.0.1:{port}/readyz");
    env.start_worker_with_env(
        0,
        &[("BELAY_WORKER_HEALTH_LISTEN", format!("127.0.0.1:{port}"))],
    )
    .await?;
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let out = health(&["--url", &readyz]).await?;
        if out.status.success() {
            let stdout = String::from_utf8_lossy(&out.stdout);
            ensure!(
                stdout.trim() == format!("{readyz}: 200 OK"),
                "printed {stdout:?}"
            );
            return Ok(());
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "never ready: {}",
            unhealthy(&out)?
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
