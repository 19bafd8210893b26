//! PII redaction end to end, on both backends: a real engine, worker,
//! scripted model (`scripted-pii`, which passes on whatever its requests
//! hold, as a model would) and an HTTP tool server in the test process.
//! The agent says `pii_redaction: true`; no request to the model holds the
//! customer's e-mail, phone or card number, only tokens; `find_customer`
//! (`pii_access: user`) gets the e-mail, `charge_card` (`pii_access:
//! tools`) the card number from `find_customer`'s result, and
//! `text_customer` (no `pii_access`) is refused before it is sent; the
//! final answer carries the e-mail again.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Result, ensure};
use belay_sdk::StartOptions;
use belay_tests::{DbBackend, EngineOpts, Env, of_kind};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(60);
const EMAIL: &str = "ada.lovelace@example.com";
const PHONE: &str = "+44 20 7946 0958";
const CARD: &str = "4111 1111 1111 1111";

/// The tool server: every request's path and body, in order.
type Seen = Arc<Mutex<Vec<(String, Value)>>>;

async fn serve() -> Result<(Seen, SocketAddr)> {
    let seen: Seen = Arc::default();
    let record = |path: &'static str, answer: Value, seen: Seen| {
        axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
            let seen = Arc::clone(&seen);
            let answer = answer.clone();
            async move {
                seen.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push((path.to_owned(), body));
                axum::Json(answer)
            }
        })
    };
    let router = axum::Router::new()
        .route(
            "/find",
            record(
                "/find",
                json!({"found": true, "phone": PHONE, "card": CARD}),
                Arc::clone(&seen),
            ),
        )
        .route(
            "/text",
            record("/text", json!({"ok": true}), Arc::clone(&seen)),
        )
        .route(
            "/charge",
            record("/charge", json!({"ok": true}), Arc::clone(&seen)),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok((seen, addr))
}

const TOOLS: &str = r#"TOOLS:
  find_customer(email: string) -> {found: boolean, phone: string, card: string}
    description: "Find a customer by e-mail"
    type: http
    endpoint: "http://ADDR/find"
    method: POST
    permission: crm.read
    repeat_safety: idempotent
    pii_access: user

  text_customer(phone: string) -> {ok: boolean}
    description: "Send the customer a text message"
    type: http
    endpoint: "http://ADDR/text"
    method: POST
    permission: crm.write
    repeat_safety: never

  charge_card(card: string) -> {ok: boolean}
    description: "Charge a card"
    type: http
    endpoint: "http://ADDR/charge"
    method: POST
    permission: crm.write
    repeat_safety: idempotent
    pii_access: tools
"#;

const FLOWS: &str = r#"kind: agent
name: pii_agent
model: scripted-pii
instructions: Find the customer, text them, charge their card.
tools: [find_customer, text_customer, charge_card]
grants: [crm.read, crm.write]
pii_redaction: true
---
kind: workflow
name: pii_flow
nodes:
  - {id: serve, type: agent, agent: pii_agent}
"#;

async fn the_model_sees_tokens_and_only_allowed_tools_see_the_data(
    backend: DbBackend,
) -> Result<()> {
    let (seen, addr) = serve().await?;
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    env.client(0)?
        .register_files(vec![
            belay_proto::v1::DefinitionFile {
                path: "pii.tools.abl".into(),
                content: TOOLS.replace("ADDR", &addr.to_string()),
            },
            belay_proto::v1::DefinitionFile {
                path: "pii.yaml".into(),
                content: FLOWS.into(),
            },
        ])
        .await?;
    env.start_worker(0).await?;
    let (run, _) = env
        .client(0)?
        .start_run(
            "pii_flow",
            &json!({"email": EMAIL}),
            StartOptions {
                idempotency_key: "pii-1".into(),
                caller: "test".into(),
                caller_grants: vec!["crm.read".into(), "crm.write".into()],
            },
        )
        .await?;
    let run_id = run.run_id;
    env.wait_for(0, &run_id, "run_completed", T).await?;
    let run = env.client(0)?.get_run(&run_id).await?;
    ensure!(run.status == "completed", "{run:?}");
    let output: Value = serde_json::from_str(&run.output_json)?;
    ensure!(output == json!({"charged": EMAIL}), "{output}");

    // The tools allowed to got the data; the other one got nothing.
    let got = seen
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    ensure!(
        got == [
            ("/find".to_owned(), json!({"email": EMAIL})),
            ("/charge".to_owned(), json!({"card": CARD})),
        ],
        "{got:?}"
    );
    let events = env.events(&run_id).await?;
    let refused = of_kind(&events, "tool_call_refused");
    ensure!(
        refused.len() == 1
            && refused[0]["tool"] == "text_customer"
            && refused[0]["check"] == "pii_access"
            && refused[0]["reason"]
                .as_str()
                .is_some_and(|r| r.contains("[PII:phone:1]") && r.contains("lacks `tools`")),
        "{refused:?}"
    );

    // Every request to the model holds tokens, never the data.
    let ours: Vec<String> = env
        .model_requests("scripted-pii")
        .await?
        .iter()
        .map(Value::to_string)
        .collect();
    ensure!(ours.len() == 3, "{ours:?}");
    for body in &ours {
        for value in [EMAIL, PHONE, CARD] {
            ensure!(!body.contains(value), "{value} sent to the model: {body}");
        }
    }
    ensure!(ours[0].contains("[PII:email:1]"), "{}", ours[0]);
    ensure!(
        ours[1].contains("[PII:phone:1]") && ours[1].contains("[PII:card:1]"),
        "{}",
        ours[1]
    );
    env.stop().await
}

belay_tests::on_both_backends!(the_model_sees_tokens_and_only_allowed_tools_see_the_data);
