//! An HTTP tool with `auth: bearer` end to end, on both backends: the token
//! is a `{{config.NAME}}` placeholder. A worker without its value fails the
//! call `NOT_SENT` before sending it and the CRM sees nothing (the tool is
//! `idempotent`, so its dispatch was recorded with its claim: `dispatched`
//! says so, and the class that nothing was sent); a worker with
//! the value (`BELAY_TOOL_CONFIG_<NAME>`) makes the call. The value appears
//! in no event and no task spec: they hold the placeholder.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use belay_sdk::StartOptions;
use belay_tests::{DbBackend, EngineOpts, Env, of_kind};
use serde_json::json;

const T: Duration = Duration::from_secs(60);
const SECRET: &str = "e2e-bearer-s3cret";

async fn a_bearer_token_is_resolved_by_the_worker_and_never_recorded(
    backend: DbBackend,
) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    let unconfigured = env.start_worker(0).await?;
    let client = env.client(0)?;
    let (run, _) = client
        .start_run(
            "lookup_authed",
            &json!({"email": "ada@example.com"}),
            StartOptions {
                idempotency_key: "auth-1".into(),
                caller: "test".into(),
                caller_grants: vec!["crm.read".into()],
            },
        )
        .await?;
    env.wait_for(0, &run.run_id, "tool_call_attempt_failed", T)
        .await?;
    let events = env.events(&run.run_id).await?;
    let failed = of_kind(&events, "tool_call_attempt_failed");
    let failed = failed.first().context("no failed attempt")?;
    ensure!(failed["class"] == "not_sent", "{failed}");
    ensure!(
        !of_kind(&events, "tool_call_dispatched").is_empty() && failed["dispatched"] == true,
        "an idempotent call is dispatched with its claim: {failed}"
    );
    let error = failed["error"].as_str().unwrap_or_default();
    ensure!(
        error.contains("{{config.E2E_CRM_TOKEN}}")
            && error.contains("BELAY_TOOL_CONFIG_E2E_CRM_TOKEN"),
        "{error}"
    );
    env.workers[unconfigured].kill().await?;
    ensure!(env.crm_requests("/customers/lookup").await?.is_empty());

    env.start_worker_with_env(0, &[("BELAY_TOOL_CONFIG_E2E_CRM_TOKEN", SECRET.into())])
        .await?;
    env.wait_for(0, &run.run_id, "run_completed", T).await?;
    let done = client.get_run(&run.run_id).await?;
    ensure!(done.status == "completed", "{done:?}");
    ensure!(env.crm_requests("/customers/lookup").await?.len() == 1);

    let events = env.events(&run.run_id).await?;
    let scheduled = of_kind(&events, "tool_call_scheduled");
    let call_id = scheduled
        .first()
        .and_then(|e| e["call_id"].as_str())
        .context("no scheduled call")?;
    let spec = env.db.task_spec(&run.run_id, call_id).await?;
    ensure!(
        spec["binding"]["auth"] == json!({"type": "bearer", "token": "{{config.E2E_CRM_TOKEN}}"}),
        "{spec}"
    );
    let recorded = format!("{} {spec}", serde_json::to_string(&events)?);
    ensure!(!recorded.contains(SECRET), "the token was recorded");
    env.stop().await
}

belay_tests::on_both_backends!(a_bearer_token_is_resolved_by_the_worker_and_never_recorded);
