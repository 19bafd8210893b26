//! Parameters the model does not supply, end to end on both backends
//! (`tests/fixtures/enrich.tools.abl`): the scripted model is offered a tool
//! whose schema holds the email only and sends the email only; the CRM (a
//! real HTTP server) receives the customer reference from the run's input
//! (`source: system`, hidden), the tenant (`source: auth`), the call id
//! (`source: runtime`) and the partner key from the worker's configuration
//! (`source: config`). The model's requests hold none of them, and no event
//! or task spec holds the partner key: they hold its placeholder.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use belay_sdk::StartOptions;
use belay_tests::{DbBackend, EngineOpts, Env, of_kind};
use serde_json::json;

const T: Duration = Duration::from_secs(60);
const PARTNER_KEY: &str = "e2e-partner-k3y";
const CUSTOMER_REF: &str = "ref-hidden-7731";

async fn injected_parameters_reach_the_tool_but_never_the_model_and_config_is_never_recorded(
    backend: DbBackend,
) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    env.start_worker_with_env(
        0,
        &[("BELAY_TOOL_CONFIG_E2E_PARTNER_KEY", PARTNER_KEY.into())],
    )
    .await?;
    let client = env.client(0)?;
    let (run, _) = client
        .start_run(
            "lookup_enriched_flow",
            &json!({"email": "ada@example.com", "customer_ref": CUSTOMER_REF}),
            StartOptions {
                idempotency_key: "enrich-1".into(),
                caller: "test".into(),
                caller_grants: vec!["crm.read".into()],
            },
        )
        .await?;
    env.wait_for(0, &run.run_id, "run_completed", T).await?;
    let done = client.get_run(&run.run_id).await?;
    ensure!(done.status == "completed", "{done:?}");

    // The tool server got every parameter, filled in.
    let events = env.events(&run.run_id).await?;
    let scheduled = of_kind(&events, "tool_call_scheduled");
    let scheduled = scheduled.first().context("no scheduled call")?;
    let call_id = scheduled["call_id"].as_str().context("no call id")?;
    let requests = env.crm_requests("/customers/lookup").await?;
    ensure!(requests.len() == 1, "{requests:?}");
    ensure!(
        requests[0]["body"]
            == json!({
                "email": "ada@example.com",
                "customer_ref": CUSTOMER_REF,
                "tenant": env.tenant,
                "partner_key": PARTNER_KEY,
                "call": call_id,
            }),
        "{}",
        requests[0]["body"]
    );

    // The model was offered the email only, and never saw a filled-in value.
    let ours = env.model_requests("scripted-enrich").await?;
    ensure!(ours.len() == 2, "{ours:?}");
    let tools = &ours[0]["tools"];
    ensure!(
        tools[0]["function"]["parameters"]["properties"]
            .as_object()
            .is_some_and(|p| p.keys().eq(["email"])),
        "{tools}"
    );
    for request in &ours {
        let text = request.to_string();
        for hidden in [
            CUSTOMER_REF,
            PARTNER_KEY,
            "partner_key",
            "customer_ref",
            call_id,
        ] {
            ensure!(
                !text.contains(hidden),
                "`{hidden}` reached the model: {text}"
            );
        }
    }

    // The events and the task spec hold the placeholder, never the value.
    ensure!(
        scheduled["arguments"]["partner_key"] == "{{config.E2E_PARTNER_KEY}}"
            && scheduled["arguments"]["customer_ref"] == CUSTOMER_REF,
        "{scheduled}"
    );
    let spec = env.db.task_spec(&run.run_id, call_id).await?;
    ensure!(spec["config_params"] == json!(["partner_key"]), "{spec}");
    let recorded = format!("{} {spec}", serde_json::to_string(&events)?);
    ensure!(
        !recorded.contains(PARTNER_KEY),
        "the partner key was recorded"
    );
    env.stop().await
}

belay_tests::on_both_backends!(
    injected_parameters_reach_the_tool_but_never_the_model_and_config_is_never_recorded
);
