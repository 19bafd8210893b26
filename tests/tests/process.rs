//! A tool's `process:` transforms, end to end on both backends
//! (`tests/fixtures/process.tools.abl`): the scripted model sends a
//! mixed-case email; `process.before` lower-cases it and adds `channel`, so
//! the CRM (a real HTTP server) receives the computed arguments; the CRM
//! answers `{found, customer_id, name}`; `process.after` remaps it to
//! `{known, who}`, which is what the model reads (and answers with), while
//! `tool_call_completed` keeps the CRM's answer.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use belay_sdk::StartOptions;
use belay_tests::{DbBackend, EngineOpts, Env, of_kind};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(60);

async fn process_before_computes_what_the_server_gets_and_after_remaps_what_the_model_reads(
    backend: DbBackend,
) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    env.start_worker(0).await?;
    let client = env.client(0)?;
    let (run, _) = client
        .start_run(
            "lookup_processed_flow",
            &json!({"email": "Ada@Example.COM"}),
            StartOptions {
                idempotency_key: "process-1".into(),
                caller: "test".into(),
                caller_grants: vec!["crm.read".into()],
            },
        )
        .await?;
    env.wait_for(0, &run.run_id, "run_completed", T).await?;
    let done = client.get_run(&run.run_id).await?;
    ensure!(done.status == "completed", "{done:?}");

    // The server got the arguments `before` computed.
    let requests = env.crm_requests("/customers/lookup").await?;
    ensure!(requests.len() == 1, "{requests:?}");
    ensure!(
        requests[0]["body"] == json!({"email": "ada@example.com", "channel": "process-e2e"}),
        "{}",
        requests[0]["body"]
    );

    // The events: the computed arguments are recorded when the call is
    // scheduled; the raw result in `tool_call_completed`; the remapped one
    // in `tool_call_processed`.
    let events = env.events(&run.run_id).await?;
    let scheduled = of_kind(&events, "tool_call_scheduled");
    let scheduled = scheduled.first().context("no scheduled call")?;
    ensure!(
        scheduled["arguments"] == json!({"email": "ada@example.com", "channel": "process-e2e"}),
        "{scheduled}"
    );
    let completed = of_kind(&events, "tool_call_completed");
    let completed = completed.first().context("no completed call")?;
    ensure!(
        completed["result"]["customer_id"] == "cust_000002",
        "{completed}"
    );
    let processed = of_kind(&events, "tool_call_processed");
    let processed = processed.first().context("no processed result")?;
    ensure!(
        processed["stage"] == "after"
            && processed["outcome"] == "ok"
            && processed["result"] == json!({"known": true, "who": "Ada Lovelace"}),
        "{processed}"
    );

    // The model read the remapped result, never the raw one.
    let ours = env.model_requests("scripted-process").await?;
    ensure!(ours.len() == 2, "{ours:?}");
    let tool_message = ours[1]["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["role"] == "tool"))
        .context("no tool message")?;
    let content: Value = serde_json::from_str(
        tool_message["content"]
            .as_str()
            .context("tool content is not text")?,
    )?;
    ensure!(
        content == json!({"known": true, "who": "Ada Lovelace"}),
        "{content}"
    );
    ensure!(
        !ours[1]["body"].to_string().contains("cust_000002"),
        "the raw result reached the model"
    );
    env.stop().await
}

belay_tests::on_both_backends!(
    process_before_computes_what_the_server_gets_and_after_remaps_what_the_model_reads
);
