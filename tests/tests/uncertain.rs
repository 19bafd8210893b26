//! Uncertain outcomes end to end: reconcile probes, late results, and the
//! processes killed (or frozen) at the dangerous moments.

use std::time::Duration;

use anyhow::Result;
use belay_tests::{DbBackend, EngineOpts, Env, dispatch_counts, of_kind};
use nix::sys::signal::Signal;
use serde_json::Value;

const T: Duration = Duration::from_secs(60);

async fn a_probe_that_finds_the_lost_account_resolves_it_and_the_run_completes(
    backend: DbBackend,
) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    let run_id = env
        .run_losing_the_create("probe@example.com", "p1", "hang_after_effect", None)
        .await?;
    env.wait_for(0, &run_id, "run_completed", T).await?;
    let events = env.events(&run_id).await?;
    assert_eq!(
        of_kind(&events, "run_paused").len(),
        1,
        "the run paused on the uncertain outcome"
    );
    let finished = of_kind(&events, "reconcile_probe_finished");
    assert_eq!(finished.len(), 1);
    assert_eq!(finished[0]["outcome"], "found");
    let resolved = of_kind(&events, "uncertain_outcome_resolved");
    assert_eq!(resolved[0]["via"], "probe");
    // Exactly one create reached the CRM, and the run used its account.
    assert_eq!(env.crm_requests("/accounts").await?.len(), 1);
    let state = env.crm_state().await?;
    let account_id = state["accounts"][0]["account_id"].clone();
    let run = env.client(0)?.get_run(&run_id).await?;
    let output: Value = serde_json::from_str(&run.output_json)?;
    assert_eq!(output["account_id"], account_id);
    let rows = env.uncertain_rows(&run_id).await?;
    assert_eq!(
        (rows[0]["status"].as_str(), rows[0]["resolved_via"].as_str()),
        (Some("resolved"), Some("probe"))
    );
    env.stop().await
}

async fn a_probe_that_finds_nothing_retries_the_call_with_the_same_key(
    backend: DbBackend,
) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    // The first create never reaches the CRM's effect and never answers.
    let run_id = env
        .run_losing_the_create("none@example.com", "p2", "hang_before_effect", None)
        .await?;
    env.wait_for(0, &run_id, "run_completed", T).await?;
    let events = env.events(&run_id).await?;
    let finished = of_kind(&events, "reconcile_probe_finished");
    assert_eq!(finished[0]["outcome"], "not_found");
    let creates = env.crm_requests("/accounts").await?;
    assert_eq!(
        creates.len(),
        2,
        "the call was repeated once, after the probe proved it did nothing"
    );
    assert_eq!(creates[0]["idempotency_key"], creates[1]["idempotency_key"]);
    assert_eq!(
        env.crm_state().await?["accounts"].as_array().map(Vec::len),
        Some(1)
    );
    // The create was dispatched twice in all: once per attempt, the second
    // only after the uncertain outcome was resolved.
    assert_eq!(dispatch_counts(&events)["intake.t2"], 2);
    env.stop().await
}

async fn a_late_result_from_the_worker_that_lost_its_lease_resolves_the_outcome(
    backend: DbBackend,
) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    // The create takes effect, but its answer is held until we release it.
    env.crm_fault("/accounts", "hold_after_effect", 1).await?;
    // The probe never answers, so only the late result can resolve it.
    env.crm_fault("/accounts/by-idempotency-key/*", "hang_before_effect", 10)
        .await?;
    env.start_worker(0).await?;
    let run_id = env
        .start_onboarding(0, "onboarding_express", "late@example.com", "p3")
        .await?;
    env.crm_wait("/accounts", 1).await?;
    // Freeze the worker: no heartbeats, so its lease expires mid-call.
    env.workers[0].signal(Signal::SIGSTOP)?;
    env.wait_for(0, &run_id, "run_paused", T).await?;
    env.crm_release().await?;
    env.workers[0].signal(Signal::SIGCONT)?;
    env.wait_for(0, &run_id, "run_completed", T).await?;
    let events = env.events(&run_id).await?;
    let resolved = of_kind(&events, "uncertain_outcome_resolved");
    assert_eq!(resolved.len(), 1);
    assert_eq!(resolved[0]["via"], "late_result");
    assert_eq!(env.crm_requests("/accounts").await?.len(), 1);
    let account_id = env.crm_state().await?["accounts"][0]["account_id"].clone();
    assert_eq!(resolved[0]["result"]["account_id"], account_id);
    env.stop().await
}

async fn an_operator_resolves_the_lost_create_through_the_admin_endpoint(
    backend: DbBackend,
) -> Result<()> {
    use reqwest::Method;
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    let run_id = env
        .run_losing_the_create(
            "ops@example.com",
            "p4",
            "hang_after_effect",
            Some("fail_400"),
        )
        .await?;
    env.wait_for(0, &run_id, "reconcile_probe_finished", T)
        .await?;

    // The operator finds it in the list, with everything needed to decide.
    let (status, list) = env
        .admin(
            0,
            Method::GET,
            &format!("/uncertain-outcomes?run_id={run_id}"),
            None,
        )
        .await?;
    assert_eq!(status, 200, "{list}");
    let items = list["items"].as_array().cloned().unwrap_or_default();
    assert_eq!(items.len(), 1);
    let record = &items[0];
    assert_eq!(record["tool"], "create_account");
    assert_eq!(record["arguments"]["email"], "ops@example.com");
    assert_eq!(record["idempotency_key"], format!("{run_id}/intake.t2"));
    assert!(record["attempts"].as_array().is_some_and(|a| !a.is_empty()));
    let id = record["uncertain_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();

    // Looks the account up in the CRM, and resolves: succeeded with its id.
    let account_id = env.crm_state().await?["accounts"][0]["account_id"].clone();
    let bad =
        serde_json::json!({"resolution": "succeeded", "result": {"id": 1}, "reason": "found it"});
    let (status, body) = env
        .admin(
            0,
            Method::POST,
            &format!("/uncertain-outcomes/{id}/resolve"),
            Some(bad),
        )
        .await?;
    assert_eq!(status, 422, "{body}");
    let good = serde_json::json!({"resolution": "succeeded", "result": {"account_id": account_id}, "reason": "the account exists in the CRM", "operator": "alice"});
    let (status, body) = env
        .admin(
            0,
            Method::POST,
            &format!("/uncertain-outcomes/{id}/resolve"),
            Some(good.clone()),
        )
        .await?;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["resolved_by"], "ops/alice");
    let (status, _) = env
        .admin(
            0,
            Method::POST,
            &format!("/uncertain-outcomes/{id}/resolve"),
            Some(good),
        )
        .await?;
    assert_eq!(status, 409, "resolving twice is refused");

    env.wait_for(0, &run_id, "run_completed", T).await?;
    let run = env.client(0)?.get_run(&run_id).await?;
    let output: Value = serde_json::from_str(&run.output_json)?;
    assert_eq!(
        output["account_id"], account_id,
        "the run used the operator's account id"
    );
    assert_eq!(
        env.crm_requests("/accounts").await?.len(),
        1,
        "the CRM saw exactly one create"
    );
    let welcome = env.crm_requests("/emails/welcome").await?;
    assert_eq!(welcome[0]["body"]["account_id"], account_id);
    env.stop().await
}

async fn an_engine_killed_during_resolve_resolves_at_most_once(backend: DbBackend) -> Result<()> {
    use reqwest::Method;
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    let run_id = env
        .run_losing_the_create(
            "kill-resolve@example.com",
            "p5",
            "hang_after_effect",
            Some("fail_400"),
        )
        .await?;
    env.wait_for(0, &run_id, "reconcile_probe_finished", T)
        .await?;
    let id = env.uncertain_rows(&run_id).await?[0]["uncertain_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let account_id = env.crm_state().await?["accounts"][0]["account_id"].clone();
    let body = serde_json::json!({"resolution": "succeeded", "result": {"account_id": account_id}, "reason": "found in CRM"});

    // Fire the resolve and SIGKILL the engine without waiting for the answer:
    // the kill lands before, during or after the resolve's transaction; in
    // every case the outcome must end up resolved exactly once.
    let path = format!("/uncertain-outcomes/{id}/resolve");
    let url = format!(
        "{}/admin/v1/tenants/{}{path}",
        env.engines[0].admin_url(),
        env.tenant
    );
    let (http, first_body) = (env.http.clone(), body.clone());
    let fired = tokio::spawn(async move {
        http.post(url)
            .bearer_auth(belay_tests::ADMIN_TOKEN)
            .json(&first_body)
            .send()
            .await
            .map(|r| r.status().as_u16())
    });
    tokio::task::yield_now().await;
    env.restart_engine(0).await?;
    let first = fired.await?;
    assert!(matches!(first, Ok(200) | Err(_)), "{first:?}");
    let (status, answer) = env.admin(0, Method::POST, &path, Some(body)).await?;
    assert!(status == 200 || status == 409, "{status} {answer}");
    env.wait_for(0, &run_id, "run_completed", T).await?;
    let events = env.events(&run_id).await?;
    assert_eq!(
        of_kind(&events, "uncertain_outcome_resolved").len(),
        1,
        "resolved exactly once"
    );
    assert_eq!(env.crm_requests("/accounts").await?.len(), 1);
    env.stop().await
}

async fn an_engine_restart_finds_a_dispatched_reconcile_call_without_a_result(
    backend: DbBackend,
) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    // The create takes effect; its answer is held, then lost with the worker.
    env.crm_fault("/accounts", "hold_after_effect", 1).await?;
    env.crm_fault("/accounts/by-idempotency-key/*", "fail_400", 1)
        .await?;
    env.start_worker(0).await?;
    let run_id = env
        .start_onboarding(0, "onboarding_express", "restart@example.com", "p6")
        .await?;
    env.crm_wait("/accounts", 1).await?;
    // Everything dies after dispatch, before the result is written.
    env.workers[0].kill().await?;
    env.restart_engine(0).await?;
    env.start_worker(0).await?;
    env.wait_for(0, &run_id, "reconcile_probe_finished", T)
        .await?;
    let run = env.client(0)?.get_run(&run_id).await?;
    assert_eq!(run.status, "paused");
    let events = env.events(&run_id).await?;
    let expired = of_kind(&events, "task_lease_expired");
    assert!(
        expired
            .iter()
            .any(|e| e["call_id"] == "intake.t2" && e["dispatched"] == true)
    );
    assert_eq!(of_kind(&events, "uncertain_outcome_recorded").len(), 1);
    assert_eq!(
        dispatch_counts(&events)["intake.t2"],
        1,
        "never dispatched again"
    );
    assert_eq!(env.crm_requests("/accounts").await?.len(), 1);
    env.stop().await
}

async fn a_call_that_is_uncertain_twice_gets_two_records_and_the_run_goes_on(
    backend: DbBackend,
) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    // The first two creates never take effect and never answer.
    env.crm_fault("/accounts", "hang_before_effect", 2).await?;
    env.start_worker(0).await?;
    let run_id = env
        .start_onboarding(0, "onboarding_express", "twice@example.com", "p7")
        .await?;
    for n in 1..=2 {
        env.crm_wait("/accounts", n).await?;
        env.workers[n - 1].kill().await?;
        env.start_worker(0).await?;
    }
    env.wait_for(0, &run_id, "run_completed", T).await?;
    let rows = env.uncertain_rows(&run_id).await?;
    assert_eq!(rows.len(), 2, "{rows:?}");
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(row["occurrence"], i + 1);
        assert_eq!(row["status"], "resolved");
        assert_eq!(row["resolved_via"], "probe");
    }
    assert_eq!(env.crm_requests("/accounts").await?.len(), 3);
    assert_eq!(
        env.crm_state().await?["accounts"].as_array().map(Vec::len),
        Some(1)
    );
    env.stop().await
}

/// Issue 22, item 9: a worker stopped with SIGTERM while its dispatched
/// create still runs, past its shutdown grace period, reports the call at
/// once (`may_have_acted`), so the engine judges it now (the reconcile
/// probe finds the account) rather than when the worker's lease (60 s
/// here) runs out.
async fn a_worker_stopped_past_its_grace_period_reports_the_call_it_abandons(
    backend: DbBackend,
) -> Result<()> {
    let mut env = Env::start_on(
        backend,
        EngineOpts {
            lease_ms: 60_000,
            ..EngineOpts::default()
        },
    )
    .await?;
    // The create takes effect, then its answer never comes.
    env.crm_fault("/accounts", "hang_after_effect", 1).await?;
    let worker = env
        .start_worker_with_args(0, &["--shutdown-grace-ms".into(), "300".into()])
        .await?;
    let run_id = env
        .start_onboarding(0, "onboarding_express", "sigterm@example.com", "p9")
        .await?;
    env.crm_wait("/accounts", 1).await?;
    let stopped = std::time::Instant::now();
    env.workers[worker].signal(Signal::SIGTERM)?;
    let status =
        tokio::time::timeout(Duration::from_secs(15), env.workers[worker].wait()).await??;
    assert!(status.success(), "the worker exited with {status}");
    // Judged well within the lease: the attempt failed, may have acted.
    env.wait_for(
        0,
        &run_id,
        "tool_call_attempt_failed",
        Duration::from_secs(20),
    )
    .await?;
    assert!(
        stopped.elapsed() < Duration::from_secs(30),
        "judged after {:?}, not at once",
        stopped.elapsed()
    );
    let events = env.events(&run_id).await?;
    let failed = of_kind(&events, "tool_call_attempt_failed");
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0]["class"], "may_have_acted", "{}", failed[0]);
    assert!(
        failed[0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("shutdown grace period (300 ms)")),
        "{}",
        failed[0]
    );
    // A worker that comes back finishes the run: the probe finds the account.
    env.start_worker(0).await?;
    env.wait_for(0, &run_id, "run_completed", T).await?;
    assert_eq!(
        env.crm_state().await?["accounts"].as_array().map(Vec::len),
        Some(1)
    );
    env.stop().await
}

belay_tests::on_both_backends!(
    a_worker_stopped_past_its_grace_period_reports_the_call_it_abandons,
    a_probe_that_finds_the_lost_account_resolves_it_and_the_run_completes,
    a_probe_that_finds_nothing_retries_the_call_with_the_same_key,
    a_late_result_from_the_worker_that_lost_its_lease_resolves_the_outcome,
    an_operator_resolves_the_lost_create_through_the_admin_endpoint,
    an_engine_killed_during_resolve_resolves_at_most_once,
    an_engine_restart_finds_a_dispatched_reconcile_call_without_a_result,
    a_call_that_is_uncertain_twice_gets_two_records_and_the_run_goes_on,
);
