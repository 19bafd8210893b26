//! The chaos harness end to end, small enough for CI's debug build: six
//! runs through two real engines and two real workers while faults go on
//! for 15 s (SIGKILLs, dropped and stalled connections; no PostgreSQL
//! restarts here, since other tests share the server: `.ci/run` runs the
//! two-minute version with them afterwards). Every check must hold.
//!
//! Needs PostgreSQL on 127.0.0.1:5432 (or `DATABASE_URL`) and the
//! `belay-engine` and `belay-worker` binaries next to the test's target
//! folder: `cargo build --workspace --bins` first.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Result, anyhow};
use belay_bench::chaos::{self, ChaosConfig};

/// `target/<profile>/<name>`, from the test executable's place.
fn binary(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| anyhow!("no target folder above {}", exe.display()))?;
    let path = dir.join(name);
    if !path.exists() {
        return Err(anyhow!(
            "{} not found: run `cargo build --workspace --bins` first",
            path.display()
        ));
    }
    Ok(path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_runs_through_fifteen_seconds_of_faults_keep_every_invariant() -> Result<()> {
    let mut config = ChaosConfig::new(binary("belay-engine")?, binary("belay-worker")?);
    config.seed = 7;
    config.runs = 6;
    config.duration = Duration::from_secs(15);
    config.workers = 2;
    config.fault_interval_ms = 1_000;
    config.pg_restarts = false;
    config.settle_timeout = Duration::from_secs(120);
    if let Ok(url) = std::env::var("DATABASE_URL") {
        config.database_url = url;
    }
    let report = chaos::run(&config).await?;
    let text = report.lines().join("\n");
    assert!(report.passed(), "{text}");
    assert_eq!(report.acknowledged, 6, "{text}");
    assert_eq!(report.statuses.values().sum::<u64>(), 6, "{text}");
    assert!(report.faults.values().sum::<u64>() >= 8, "{text}");
    assert!(
        report.faults.contains_key("engine SIGKILL")
            || report.faults.contains_key("worker SIGKILL"),
        "{text}"
    );
    assert!(report.engines.1 >= 2 && report.workers.1 >= 2, "{text}");
    // Every run reached at least its agent's tools.
    assert!(report.requests["chaos_idempotent"] >= 6, "{text}");
    assert!(report.model_requests >= 6, "{text}");
    Ok(())
}

#[test]
fn a_bad_flag_or_a_missing_binary_exits_2_naming_it() -> Result<()> {
    let run = |args: &[&str]| -> Result<(Option<i32>, String)> {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_belay-chaos"))
            .args(args)
            .output()?;
        Ok((
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ))
    };
    let (code, stderr) = run(&["--runs", "0", "--no-pg-restarts"])?;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--runs must be at least 1"), "{stderr}");
    let (code, stderr) = run(&[
        "--engine-bin",
        "/nonexistent/belay-engine",
        "--no-pg-restarts",
    ])?;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("/nonexistent/belay-engine not found"),
        "{stderr}"
    );
    Ok(())
}
