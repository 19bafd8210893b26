//! `visibility: {trace: false}` end to end, on both backends: a real
//! engine (with the harness's `BELAY_VAULT_KEY`), worker and scripted model
//! (`scripted-untraced`, which passes a card number it knows to `pay`), and
//! an HTTP tool server in the test process that records what it got and
//! echoes it back. The server gets the number; no row of the events,
//! tasks, runs or run_secrets tables, not the audit of tool calls, not the
//! model's later requests, not the engine's or the worker's log holds it
//! (the echo is redacted by the worker), and the run's vault is gone once
//! the run ends.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use belay_sdk::StartOptions;
use belay_tests::{DbBackend, EngineOpts, Env, of_kind};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(60);
/// The number in `examples/onboarding/script.yaml` (`scripted-untraced`).
const CARD: &str = "4929-7745-0198-3321";

/// The tool server: `/pay` records the body it got and echoes the card.
async fn serve() -> Result<(Arc<Mutex<Vec<Value>>>, SocketAddr)> {
    let bodies: Arc<Mutex<Vec<Value>>> = Arc::default();
    let seen = Arc::clone(&bodies);
    let router = axum::Router::new().route(
        "/pay",
        axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
            let seen = Arc::clone(&seen);
            async move {
                let echo = body["card"].as_str().unwrap_or_default().to_owned();
                seen.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(body);
                axum::Json(json!({"ok": true, "echo": format!("charged {echo}")}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok((bodies, addr))
}

const TOOLS: &str = r#"TOOLS:
  pay(card: string, amount: number) -> {ok: boolean, echo?: string}
    description: "Charge the customer's card"
    type: http
    endpoint: "http://ADDR/pay"
    method: POST
    permission: crm.write
    repeat_safety: idempotent
    parameters:
      card:
        description: "The card number the customer gave"
        visibility: {trace: false}
"#;

const FLOWS: &str = r#"kind: agent
name: pay_agent
model: scripted-untraced
instructions: Charge the customer's card.
tools: [pay]
grants: [crm.write]
---
kind: workflow
name: pay_flow
nodes:
  - {id: pay, type: agent, agent: pay_agent}
"#;

async fn an_untraced_card_number_reaches_the_tool_and_no_record(backend: DbBackend) -> Result<()> {
    let (bodies, addr) = serve().await?;
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    env.client(0)?
        .register_files(vec![
            belay_proto::v1::DefinitionFile {
                path: "pay.tools.abl".into(),
                content: TOOLS.replace("ADDR", &addr.to_string()),
            },
            belay_proto::v1::DefinitionFile {
                path: "pay.yaml".into(),
                content: FLOWS.into(),
            },
        ])
        .await?;
    env.start_worker(0).await?;
    let (run, _) = env
        .client(0)?
        .start_run(
            "pay_flow",
            &json!({"customer": "c-1"}),
            StartOptions {
                idempotency_key: "untraced-1".into(),
                caller: "test".into(),
                caller_grants: vec!["crm.write".into()],
            },
        )
        .await?;
    let run_id = run.run_id;
    env.wait_for(0, &run_id, "run_completed", T).await?;
    let run = env.client(0)?.get_run(&run_id).await?;
    ensure!(run.status == "completed", "{run:?}");
    let output: Value = serde_json::from_str(&run.output_json)?;
    ensure!(output == json!({"paid": true}), "{output}");

    // The tool got the number, once.
    let got = bodies
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    ensure!(got == [json!({"card": CARD, "amount": 12})], "{got:?}");

    // The record holds the placeholder and the key, never the number.
    let events = env.events(&run_id).await?;
    let scheduled = of_kind(&events, "tool_call_scheduled");
    let placeholder = scheduled[0]["arguments"]["card"]
        .as_str()
        .context("card")?
        .to_owned();
    ensure!(placeholder.starts_with("{{_secret._arg_"), "{placeholder}");
    let completed = of_kind(&events, "tool_call_completed");
    ensure!(
        completed[0]["result"] == json!({"ok": true, "echo": "charged [REDACTED:secret]"}),
        "{completed:?}"
    );
    let vaulted = of_kind(&events, "secrets_vaulted");
    ensure!(
        vaulted.len() == 1 && vaulted[0]["keys"][0]["path"] == "args.card",
        "{vaulted:?}"
    );
    let mut stored = Vec::new();
    for table in ["events", "tasks", "runs", "run_secrets"] {
        stored.extend(env.db.dump_table(table).await?);
    }
    let stored = stored.join("\n");
    ensure!(!stored.contains(CARD), "the number is stored in clear");
    ensure!(stored.contains("_arg_"));
    ensure!(
        env.db.dump_table("run_secrets").await?.is_empty(),
        "the vault outlived the run"
    );

    // The audit of tool calls shows the placeholder.
    let (status, audit) = env
        .admin(
            0,
            reqwest::Method::GET,
            &format!("/tool-calls?run_id={run_id}"),
            None,
        )
        .await?;
    ensure!(status == 200, "{status}: {audit}");
    let audit = audit.to_string();
    ensure!(!audit.contains(CARD) && audit.contains("_arg_"), "{audit}");

    // The model's second request carries its own call with the
    // placeholder: the transcript does not hold the number either.
    let ours: Vec<String> = env
        .model_requests("scripted-untraced")
        .await?
        .iter()
        .map(Value::to_string)
        .collect();
    ensure!(ours.len() == 2, "{ours:?}");
    ensure!(ours.iter().all(|b| !b.contains(CARD)), "{ours:?}");
    ensure!(ours[1].contains("_arg_"), "{}", ours[1]);

    // Nor any log.
    for proc in env.engines.iter().chain(&env.workers) {
        let log =
            std::fs::read_to_string(&proc.log).with_context(|| format!("{}'s log", proc.name))?;
        ensure!(!log.contains(CARD), "{} logged the number", proc.name);
    }
    env.stop().await
}

belay_tests::on_both_backends!(an_untraced_card_number_reaches_the_tool_and_no_record);
