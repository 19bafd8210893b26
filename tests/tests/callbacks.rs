//! A `type: async_webhook` tool end to end, on both backends: the real
//! engine and worker binaries and the CRM double, which answers the KYC
//! check with 202 and posts the result to the engine's callback URL. The
//! callback is held while the engine is SIGKILLed and started again, then
//! delivered, then replayed: it is applied once.

use std::time::Duration;

use anyhow::{Result, ensure};
use belay_sdk::StartOptions;
use belay_tests::{DbBackend, EngineOpts, Env, of_kind};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(60);

async fn crm_post(env: &Env, path: &str, body: Value) -> Result<Value> {
    Ok(env
        .http
        .post(format!("{}{path}", env.crm.url))
        .json(&body)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?)
}

async fn a_kyc_callback_survives_an_engine_restart_and_a_replay_is_applied_once(
    backend: DbBackend,
) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    env.start_worker(0).await?;
    crm_post(&env, "/_callbacks/hold", json!({"hold": true})).await?;
    let client = env.client(0)?;
    let (run, _) = client
        .start_run(
            "kyc_direct",
            &json!({"email": "ada@example.com", "name": "Ada"}),
            StartOptions {
                idempotency_key: "kyc-1".into(),
                caller: "test".into(),
                caller_grants: vec!["crm.read".into(), "crm.write".into()],
            },
        )
        .await?;
    env.wait_for(0, &run.run_id, "tool_call_accepted", T)
        .await?;
    let waiting = client.get_run(&run.run_id).await?;
    ensure!(waiting.status == "waiting", "{waiting:?}");
    ensure!(
        waiting.status_reason.contains("waits for its callback"),
        "{}",
        waiting.status_reason
    );
    // The request carried a callback URL under the engine's callback endpoint.
    let requests = env.crm_requests("/kyc/checks").await?;
    ensure!(requests.len() == 1, "{requests:?}");
    let url = requests[0]["body"]["callbackUrl"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    ensure!(
        url.starts_with(&format!("{}/callbacks/v1/", env.engines[0].callback_url())),
        "{url}"
    );

    // The engine dies while the provider works; a new one takes its ports.
    env.restart_engine(0).await?;
    let sent = crm_post(&env, "/_callbacks/send", json!({})).await?;
    let first = &sent["sent"][0];
    ensure!(
        first["status"] == 200 && first["response"]["applied"] == true,
        "{sent}"
    );
    env.wait_for(0, &run.run_id, "run_completed", T).await?;
    let done = client.get_run(&run.run_id).await?;
    ensure!(done.status == "completed", "{done:?}");
    let output: Value = serde_json::from_str(&done.output_json)?;
    ensure!(
        output == json!({"check_id": "kyc_000001", "status": "clear"}),
        "{output}"
    );

    // The provider retries the delivery: answered 200, applied false.
    let replay = crm_post(&env, "/_callbacks/replay", json!({})).await?;
    ensure!(
        replay["status"] == 200 && replay["response"]["applied"] == false,
        "{replay}"
    );
    let events = env.events(&run.run_id).await?;
    ensure!(
        of_kind(&events, "callback_received").len() == 1,
        "{events:?}"
    );
    ensure!(
        of_kind(&events, "tool_call_accepted").len() == 1,
        "{events:?}"
    );
    ensure!(env.crm_requests("/kyc/checks").await?.len() == 1);
    env.stop().await
}

belay_tests::on_both_backends!(
    a_kyc_callback_survives_an_engine_restart_and_a_replay_is_applied_once
);
