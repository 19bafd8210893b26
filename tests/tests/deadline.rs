//! Wall-time budgets end to end, on both backends: an agent node with
//! `budget: {max_wall_time: 1h}` (`tests/fixtures/deadline.yaml`) whose
//! first tool call hangs at the CRM double is stopped once the engine's
//! clock (`belay_clock`) is moved an hour on; nothing sleeps.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use belay_tests::{DbBackend, EngineOpts, Env, of_kind};

const T: Duration = Duration::from_secs(60);
const HOUR_MS: i64 = 3_600_000;

async fn an_agent_node_out_of_wall_time_stops_the_run_with_its_tool_call_pending(
    backend: DbBackend,
) -> Result<()> {
    // A lease longer than the jump, so only the deadline can end the call.
    let mut env = Env::start_on(
        backend,
        EngineOpts {
            lease_ms: 2 * HOUR_MS as u64,
            ..EngineOpts::default()
        },
    )
    .await?;
    env.crm_fault("/customers/lookup", "hang_after_effect", 1)
        .await?;
    env.start_worker(0).await?;
    let run_id = env
        .start_onboarding(0, "onboarding_deadline", "late@example.com", "kd")
        .await?;
    // The lookup was dispatched and is hanging at the CRM.
    env.crm_wait("/customers/lookup", 1).await?;
    env.wait_for(0, &run_id, "tool_call_dispatched", T).await?;
    let run = env.client(0)?.get_run(&run_id).await?;
    ensure!(run.status == "running", "run is {}", run.status);

    env.db.advance_clock(HOUR_MS).await?;
    env.wait_for(0, &run_id, "run_failed", T).await?;

    let events = env.events(&run_id).await?;
    let started = of_kind(&events, "node_started");
    ensure!(
        started[0]["deadline"]["timer_id"] == "intake.deadline"
            && started[0]["deadline"]["after_ms"] == HOUR_MS,
        "{}",
        started[0]
    );
    ensure!(
        of_kind(&events, "tool_call_completed").is_empty(),
        "the lookup never answered"
    );
    let failed = of_kind(&events, "run_failed");
    let stop = &failed.first().context("run_failed")?["stop"];
    ensure!(
        stop["kind"] == "deadline"
            && stop["scope"] == "node"
            && stop["node"] == "intake"
            && stop["limit_ms"] == HOUR_MS,
        "{stop}"
    );
    let elapsed = stop["elapsed_ms"].as_i64().context("elapsed_ms")?;
    ensure!(
        (HOUR_MS..HOUR_MS + 60_000).contains(&elapsed),
        "elapsed {elapsed} ms"
    );
    let timers = of_kind(&events, "timer_fired");
    ensure!(
        timers.len() == 1 && timers[0]["timer_id"] == "intake.deadline",
        "{timers:?}"
    );
    let run = env.client(0)?.get_run(&run_id).await?;
    ensure!(run.status == "failed", "run is {}", run.status);
    ensure!(
        run.status_reason
            .contains("agent `deadline_agent` in node `intake` used its `wall_time` budget"),
        "{}",
        run.status_reason
    );
    // The pending call's task was cancelled (an idempotent lookup: no
    // uncertain record), and its late answer changes nothing.
    ensure!(env.db.task_status(&run_id, "intake.t1").await? == "cancelled");
    ensure!(env.uncertain_rows(&run_id).await?.is_empty());
    env.crm_release().await?;
    env.stop().await
}

belay_tests::on_both_backends!(
    an_agent_node_out_of_wall_time_stops_the_run_with_its_tool_call_pending,
);
