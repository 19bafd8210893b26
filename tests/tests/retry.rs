//! Per-tool retry policies end to end, on both backends: a real engine and
//! worker call the CRM double (a local HTTP server, loopback allowlisted by
//! the harness), which answers 503 as often as a test arms it. The tools are
//! declared in `tests/fixtures/retry.tools.abl`.
//!
//! The declared delays are seconds long, yet no test waits them out: each
//! reads the persisted next-attempt time (the task's `available_at`, judged
//! by the engine's clock) and the delay recorded in the failure event, then
//! moves the engine's clock (`belay_clock`) past it.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use belay_sdk::{RunEvent, StartOptions};
use belay_tests::{DbBackend, EngineOpts, Env, of_kind};
use serde_json::{Value, json};
use sqlx::types::chrono::{DateTime, FixedOffset};

const T: Duration = Duration::from_secs(60);
const CALL: &str = "lookup.t1";

async fn start(env: &Env, workflow: &str, key: &str) -> Result<String> {
    let (run, _) = env
        .client(0)?
        .start_run(
            workflow,
            &json!({"email": "ada@example.com"}),
            StartOptions {
                idempotency_key: key.into(),
                caller: "test".into(),
                caller_grants: vec!["crm.read".into()],
            },
        )
        .await?;
    Ok(run.run_id)
}

/// The `n`th (1-based) `tool_call_attempt_failed` of the run, once recorded.
async fn nth_failure(env: &Env, run_id: &str, n: usize) -> Result<Value> {
    env.wait_for_nth(0, run_id, "tool_call_attempt_failed", n, T)
        .await?;
    let events = env.events(run_id).await?;
    of_kind(&events, "tool_call_attempt_failed")
        .get(n - 1)
        .map(|e| (*e).clone())
        .context("no such failure")
}

/// The task waits, persisted, for about `delay_ms` before its next attempt
/// (a little less: real time has passed since the failure was recorded; the
/// margin is wide for a loaded machine, and still far above the engine's
/// own 0.5 s and 1 s).
async fn waits_for(env: &Env, run_id: &str, delay_ms: f64) -> Result<()> {
    let (status, ready_in) = env.db.task_ready_in_ms(run_id, CALL).await?;
    ensure!(status == "ready", "task is {status}");
    ensure!(
        ready_in <= delay_ms && ready_in > delay_ms - 4_000.0,
        "next attempt due in {ready_in} ms, expected about {delay_ms}"
    );
    Ok(())
}

fn at(event: &RunEvent) -> Result<DateTime<FixedOffset>> {
    DateTime::parse_from_rfc3339(&event.recorded_at)
        .with_context(|| format!("recorded_at {:?}", event.recorded_at))
}

async fn a_503_twice_is_retried_on_the_declared_exponential_schedule(
    backend: DbBackend,
) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    env.crm_fault("/customers/lookup", "fail_503", 2).await?;
    env.start_worker(0).await?;
    let run_id = start(&env, "retry_backoff", "retry-backoff-1").await?;

    // Attempt 1 fails; the next is due 5 s later (`initial_delay_ms`).
    let first = nth_failure(&env, &run_id, 1).await?;
    ensure!(
        first["class"] == "may_have_acted"
            && first["status_code"] == 503
            && first["will_retry"] == true
            && first["retry_delay_ms"] == 5000,
        "{first}"
    );
    waits_for(&env, &run_id, 5_000.0).await?;
    ensure!(env.crm_requests("/customers/lookup").await?.len() == 1);

    // Attempt 2 fails; 5000 · 2 is capped at `max_delay_ms`: 8 s.
    env.db.advance_clock(5_000).await?;
    let second = nth_failure(&env, &run_id, 2).await?;
    ensure!(
        second["will_retry"] == true && second["retry_delay_ms"] == 8000,
        "{second}"
    );
    waits_for(&env, &run_id, 8_000.0).await?;
    ensure!(env.crm_requests("/customers/lookup").await?.len() == 2);

    // Attempt 3 succeeds.
    env.db.advance_clock(8_000).await?;
    env.wait_for(0, &run_id, "run_completed", T).await?;
    let run = env.client(0)?.get_run(&run_id).await?;
    ensure!(run.status == "completed", "{run:?}");
    ensure!(env.crm_requests("/customers/lookup").await?.len() == 3);

    // On the engine's clock, each attempt was dispatched at least its
    // declared delay after the failure before it.
    let raw = env.client(0)?.events(&run_id, 0).await?;
    let failures: Vec<&RunEvent> = raw
        .iter()
        .filter(|e| e.kind == "tool_call_attempt_failed")
        .collect();
    let dispatches: Vec<&RunEvent> = raw
        .iter()
        .filter(|e| e.kind == "tool_call_dispatched")
        .collect();
    ensure!(failures.len() == 2 && dispatches.len() == 3, "{raw:?}");
    for (i, delay_ms) in [(0, 5_000), (1, 8_000)] {
        let gap = (at(dispatches[i + 1])? - at(failures[i])?).num_milliseconds();
        ensure!(
            gap >= delay_ms,
            "attempt {} came {gap} ms after the failure, before its {delay_ms} ms",
            i + 2
        );
    }
    env.stop().await
}

async fn max_retries_1_stops_after_two_attempts(backend: DbBackend) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    env.crm_fault("/customers/lookup", "fail_503", 5).await?;
    env.start_worker(0).await?;
    let run_id = start(&env, "retry_once", "retry-once-1").await?;

    let first = nth_failure(&env, &run_id, 1).await?;
    ensure!(
        first["will_retry"] == true && first["retry_delay_ms"] == 5000,
        "{first}"
    );
    waits_for(&env, &run_id, 5_000.0).await?;
    env.db.advance_clock(5_000).await?;

    env.wait_for(0, &run_id, "run_failed", T).await?;
    let events = env.events(&run_id).await?;
    let failures = of_kind(&events, "tool_call_attempt_failed");
    ensure!(failures.len() == 2, "{failures:?}");
    ensure!(
        failures[1]["will_retry"] == false && failures[1].get("retry_delay_ms").is_none(),
        "{}",
        failures[1]
    );
    let failed = of_kind(&events, "tool_call_failed");
    let error = failed
        .first()
        .and_then(|e| e["error"].as_str())
        .context("no tool_call_failed")?;
    ensure!(error.contains("failed after 2 attempts"), "{error}");
    ensure!(env.db.task_status(&run_id, CALL).await? == "failed");
    // Nothing more reaches the CRM, however long one waits.
    env.db.advance_clock(60_000).await?;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    ensure!(env.crm_requests("/customers/lookup").await?.len() == 2);
    env.stop().await
}

belay_tests::on_both_backends!(
    a_503_twice_is_retried_on_the_declared_exponential_schedule,
    max_retries_1_stops_after_two_attempts,
);
