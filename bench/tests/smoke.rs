//! Smoke tests of the benchmark, cheap enough for CI (debug build): three
//! runs of two no-op tool steps against a fresh database, once with engine
//! and worker as child processes (the default) and once in-process, checking
//! that every figure is there and plausible.
//!
//! Needs PostgreSQL on 127.0.0.1:5432 (or `DATABASE_URL`).

use std::path::PathBuf;
use std::time::Duration;

use belay_bench::fleet::{ChildCommand, Launch};
use belay_bench::{BenchConfig, Report};

fn small(launch: Launch) -> BenchConfig {
    let mut config = BenchConfig::new(launch);
    config.runs = 3;
    config.tool_steps = 2;
    config.workers = 1;
    config.engines = 1;
    config.concurrency = 3;
    config.timeout = Duration::from_secs(60);
    config.ceiling_duration = Duration::from_millis(500);
    if let Ok(url) = std::env::var("DATABASE_URL") {
        config.database_url = url;
    }
    config
}

fn check(report: &Report) {
    // 3 runs × (3 model calls + 2 tool calls).
    assert_eq!(report.runs, 3);
    assert_eq!(report.steps, 15);
    assert!(report.model_requests >= 9, "{report:?}");
    assert!(report.tool_requests >= 6, "{report:?}");
    assert!(report.runs_per_sec() > 0.0 && report.steps_per_sec() > report.runs_per_sec());
    let p = report.step_latency;
    assert_eq!(p.count, 15);
    assert!(p.p50_ms > 0.0 && p.p99_ms >= p.p50_ms, "{p:?}");
    assert_eq!(report.model_step_latency.map(|p| p.count), Some(9));
    assert_eq!(report.tool_step_latency.map(|p| p.count), Some(6));
    assert_eq!(report.tool_dispatch_latency.map(|p| p.count), Some(6));
    assert_eq!(report.run_latency.count, 3);
    // Every step is at least the commit that records its result.
    assert!(
        report.transactions_per_step() >= 1.0,
        "{} transactions per step",
        report.transactions_per_step()
    );
    // Keys are looked up when first seen and then at most once a
    // second each (--key-cache-ms): some lookups, counted in the
    // transactions, but not one per RPC as before.
    assert!(
        report.key_lookups >= 1,
        "{} key lookups",
        report.key_lookups
    );
    assert!(report.commits >= report.key_lookups, "{report:?}");
    // Each step records at least its scheduling and its completion.
    assert!(
        report.events >= 2 * report.steps,
        "{} events",
        report.events
    );
    assert!(report.peak_rss.engines_kib.iter().all(|k| *k > 1024));
    assert!(report.peak_rss.workers_kib.iter().all(|k| *k > 1024));
    let ceiling = report.ceiling.expect("the ceiling was measured");
    assert!(ceiling.commits > 0 && ceiling.per_sec() > 0.0);
    assert_eq!(ceiling.connections, 3);
    assert!(report.share_of_ceiling().is_some_and(|s| s > 0.0));

    let text = report.lines().join("\n");
    for label in [
        "runs/s: ",
        "steps/s: ",
        "step latency p50: ",
        "step latency p99: ",
        "postgres transactions per step: ",
        "of which API-key lookups per step: ",
        "cpu ms per step: ",
        "engine peak RSS: ",
        "worker peak RSS: ",
        "postgres single-insert commits/s: ",
        "steps/s as share of the ceiling: ",
    ] {
        assert!(text.contains(label), "no `{label}` in\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_and_worker_as_processes() -> anyhow::Result<()> {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_belay-bench"));
    let config = small(Launch::Processes {
        engine: ChildCommand::bench_role(&exe, "engine"),
        worker: ChildCommand::bench_role(&exe, "worker"),
    });
    let report = belay_bench::run(&config).await?;
    check(&report);
    assert!(!report.peak_rss.shared_process);
    assert_eq!(report.peak_rss.engines_kib.len(), 1);
    assert_eq!(report.peak_rss.workers_kib.len(), 1);
    // Each process's CPU time is read, and a running engine and worker
    // spend some (10 ms ticks: 15 steps cost more than nothing).
    let engines = report.cpu.engines_ms.unwrap_or(-1.0);
    let workers = report.cpu.workers_ms.unwrap_or(-1.0);
    assert!(engines >= 0.0 && workers >= 0.0, "{:?}", report.cpu);
    assert!(report.cpu.machine_busy_ms > 0.0, "{:?}", report.cpu);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_and_worker_in_process() -> anyhow::Result<()> {
    let report = belay_bench::run(&small(Launch::InProcess)).await?;
    check(&report);
    assert!(report.peak_rss.shared_process);
    assert!(report.cpu.engines_ms.is_none() && report.cpu.workers_ms.is_none());
    Ok(())
}

/// The waiting-runs scenario, small: five runs wait with no worker and no
/// task row, then all complete on their signal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_runs_hold_no_task_and_all_complete() -> anyhow::Result<()> {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_belay-bench"));
    let config = belay_bench::waits::WaitsConfig {
        runs: 5,
        concurrency: 5,
        database_url: std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into()),
        engine_db_connections: 4,
        timeout: Duration::from_secs(60),
        launch: Launch::Processes {
            engine: ChildCommand::bench_role(&exe, "engine"),
            worker: ChildCommand::bench_role(&exe, "worker"),
        },
        keep_database: false,
    };
    let report = belay_bench::waits::run(&config).await?;
    assert_eq!(report.waiting, 5);
    assert_eq!(report.tasks_while_waiting, 0);
    assert_eq!(report.completed, 5);
    assert!(
        report.engine_rss_waiting_kib > 1024
            && report.engine_peak_kib >= report.engine_rss_waiting_kib
    );
    let text = report.lines().join("\n");
    for label in [
        "waiting runs (W): 5",
        "task rows while waiting: 0",
        "engine RSS with W runs waiting: ",
        "signal all W to all completed: ",
    ] {
        assert!(text.contains(label), "no `{label}` in\n{text}");
    }
    Ok(())
}
