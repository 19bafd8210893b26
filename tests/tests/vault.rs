//! The run secret vault end to end (`RESULT_SECRETS` / `SECRET_ACCESS` /
//! `{{_secret.KEY}}`, the seed's SecretRef), on both backends: a real engine
//! (with the harness's `BELAY_VAULT_KEY`) and worker call an HTTP server in
//! the test process (loopback is allowed to the worker explicitly).
//!
//! - An agent (the scripted model `scripted-vault`) asks for a one-time
//!   code (`request_otp` answers `{otp_token, expires_in}` and repeats the
//!   code in a message), then converts a transaction twice: the server gets
//!   the code in `X-OTP-Token` on the first call only (the key is
//!   single-use, so the second call's header is empty) and answers whether
//!   it matched. The code is in none of the model's requests, no row of
//!   the events or tasks tables, not the audit of tool calls, not the
//!   engine's or the worker's log; the model sees `[VAULTED:txn_otp]`, and
//!   the run's vault is gone once it ends.
//! - Tool nodes with a wait between them: the engine's clock moved past the
//!   key's `ttl`, the consumer's header is empty.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use belay_sdk::StartOptions;
use belay_tests::{DbBackend, EngineOpts, Env, of_kind};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(60);
const OTP: &str = "otp-7Q2x-91kd-55Zp";

/// The tool server: `/otp/request` hands out [`OTP`]; `/txn/convert`
/// records the `X-OTP-Token` it got and answers whether it is the code.
#[derive(Default)]
struct Server {
    issued: AtomicUsize,
    tokens: Mutex<Vec<Option<String>>>,
}

impl Server {
    fn tokens(&self) -> Vec<Option<String>> {
        self.tokens
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

async fn serve() -> Result<(Arc<Server>, SocketAddr)> {
    let server = Arc::new(Server::default());
    let issuer = Arc::clone(&server);
    let converter = Arc::clone(&server);
    let router = axum::Router::new()
        .route(
            "/otp/request",
            axum::routing::post(move || {
                let server = Arc::clone(&issuer);
                async move {
                    server.issued.fetch_add(1, Ordering::SeqCst);
                    axum::Json(json!({
                        "otp_token": OTP,
                        "expires_in": 300,
                        "message": format!("code {OTP} sent by SMS"),
                    }))
                }
            }),
        )
        .route(
            "/txn/convert",
            axum::routing::post(move |headers: axum::http::HeaderMap| {
                let server = Arc::clone(&converter);
                async move {
                    let token = headers
                        .get("x-otp-token")
                        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
                    let ok = token.as_deref() == Some(OTP);
                    server
                        .tokens
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(token.clone());
                    axum::Json(json!({
                        "status": if ok { "converted" } else { "rejected" },
                        // A server that echoes what it got: the worker
                        // redacts the value before reporting.
                        "echo": token.unwrap_or_default(),
                    }))
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok((server, addr))
}

const TOOLS: &str = r#"TOOLS:
  request_otp(account_id: string) -> {otp_token: string, expires_in: number, message: string}
    description: "Send a one-time code to the account holder"
    type: http
    endpoint: "http://ADDR/otp/request"
    method: POST
    permission: crm.write
    repeat_safety: never
    RESULT_SECRETS:
      otp_token -> txn_otp (consumers: [convert_transaction_to_emi], ttl: 300, single_use: true)

  convert_transaction_to_emi(txn_id: string) -> {status: string, echo?: string}
    description: "Convert a transaction to EMI, authorised by the one-time code"
    type: http
    endpoint: "http://ADDR/txn/convert"
    method: POST
    permission: crm.write
    repeat_safety: idempotent
    SECRET_ACCESS:
      READ: [txn_otp]
    headers:
      X-OTP-Token: "{{_secret.txn_otp}}"
"#;

const FLOWS: &str = r#"kind: agent
name: vault_agent
model: scripted-vault
instructions: Convert the customer's transaction to EMI with a one-time code.
tools: [request_otp, convert_transaction_to_emi]
grants: [crm.write]
---
kind: workflow
name: vault_agent_flow
nodes:
  - id: convert
    type: agent
    agent: vault_agent
    input: {account_id: "${ .input.account_id }", txn_id: "${ .input.txn_id }"}
---
kind: workflow
name: vault_ttl_flow
nodes:
  - {id: otp, type: tool, tool: request_otp, args: {account_id: "${ .input.account_id }"}, grants: [crm.write], next: pause}
  - {id: pause, type: wait, duration: 400s, next: convert}
  - {id: convert, type: tool, tool: convert_transaction_to_emi, args: {txn_id: "${ .input.txn_id }"}, grants: [crm.write], next: done}
  - {id: done, type: succeed, output: "${ .nodes.convert.output }"}
"#;

/// A started world with the vault tools (pointing at the server) and a
/// worker.
async fn setup(backend: DbBackend) -> Result<(Env, Arc<Server>)> {
    let (server, addr) = serve().await?;
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    env.client(0)?
        .register_files(vec![
            belay_proto::v1::DefinitionFile {
                path: "vault.tools.abl".into(),
                content: TOOLS.replace("ADDR", &addr.to_string()),
            },
            belay_proto::v1::DefinitionFile {
                path: "vault.yaml".into(),
                content: FLOWS.into(),
            },
        ])
        .await?;
    env.start_worker(0).await?;
    Ok((env, server))
}

async fn start(env: &Env, workflow: &str, key: &str) -> Result<String> {
    let (run, _) = env
        .client(0)?
        .start_run(
            workflow,
            &json!({"account_id": "acc-1", "txn_id": "txn-9"}),
            StartOptions {
                idempotency_key: key.into(),
                caller: "test".into(),
                caller_grants: vec!["crm.write".into()],
            },
        )
        .await?;
    Ok(run.run_id)
}

/// Every row of the tables a run's history and tasks live in, as text.
async fn stored_text(env: &Env) -> Result<String> {
    let mut rows = Vec::new();
    for table in ["events", "tasks", "runs", "run_secrets"] {
        rows.extend(env.db.dump_table(table).await?);
    }
    Ok(rows.join("\n"))
}

async fn a_vaulted_code_reaches_only_the_consumers_header_and_only_once(
    backend: DbBackend,
) -> Result<()> {
    let (env, server) = setup(backend).await?;
    let run_id = start(&env, "vault_agent_flow", "vault-agent-1").await?;
    env.wait_for(0, &run_id, "run_completed", T).await?;
    let run = env.client(0)?.get_run(&run_id).await?;
    ensure!(run.status == "completed", "{run:?}");

    // The server got the code on the first call, an empty header on the
    // second (single-use), and said so.
    ensure!(server.issued.load(Ordering::SeqCst) == 1);
    let tokens = server.tokens();
    ensure!(
        tokens == [Some(OTP.to_owned()), Some(String::new())],
        "{tokens:?}"
    );
    let output: Value = serde_json::from_str(&run.output_json)?;
    ensure!(output == json!({"status": "rejected"}), "{output}");

    // What was recorded holds the marker and the key, never the code.
    let events = env.events(&run_id).await?;
    let results: Vec<&Value> = of_kind(&events, "tool_call_completed")
        .into_iter()
        .map(|e| &e["result"])
        .collect();
    ensure!(
        results.first().is_some_and(|r| **r
            == json!({"otp_token": "[VAULTED:txn_otp]", "expires_in": 300, "message": "code [REDACTED:vaulted] sent by SMS"})),
        "{results:?}"
    );
    ensure!(
        results
            .get(1)
            .is_some_and(|r| **r == json!({"status": "converted", "echo": "[REDACTED:secret]"})),
        "{results:?}"
    );
    let vaulted = of_kind(&events, "secrets_vaulted");
    ensure!(
        vaulted.len() == 1
            && vaulted[0]["keys"]
                == json!([{"key": "txn_otp", "path": "otp_token", "ttl_s": 300, "single_use": true, "consumers": ["convert_transaction_to_emi"]}]),
        "{vaulted:?}"
    );
    let stored = stored_text(&env).await?;
    ensure!(!stored.contains(OTP), "the code is stored in clear");
    ensure!(stored.contains("[VAULTED:txn_otp]"));
    // The run ended: its vault is gone.
    ensure!(
        env.db.dump_table("run_secrets").await?.is_empty(),
        "the vault outlived the run"
    );

    // The model never saw it, only the marker.
    let ours: Vec<String> = env
        .model_requests("scripted-vault")
        .await?
        .iter()
        .map(Value::to_string)
        .collect();
    ensure!(ours.len() == 4, "{ours:?}");
    ensure!(ours.iter().all(|body| !body.contains(OTP)), "{ours:?}");
    ensure!(ours[1].contains("[VAULTED:txn_otp]"), "{}", ours[1]);

    // The audit of tool calls shows the marker.
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
    ensure!(!audit.contains(OTP), "{audit}");
    ensure!(audit.contains("[VAULTED:txn_otp]"), "{audit}");

    // Nor did any log.
    for proc in env.engines.iter().chain(&env.workers) {
        let log =
            std::fs::read_to_string(&proc.log).with_context(|| format!("{}'s log", proc.name))?;
        ensure!(!log.contains(OTP), "{} logged the code", proc.name);
    }
    env.stop().await
}

async fn a_vaulted_code_past_its_ttl_is_sent_as_an_empty_header(backend: DbBackend) -> Result<()> {
    let (env, server) = setup(backend).await?;
    let run_id = start(&env, "vault_ttl_flow", "vault-ttl-1").await?;
    env.wait_for(0, &run_id, "wait_started", T).await?;
    // `ttl: 300`: the wait is 400 s; move the engine's clock past both.
    env.db.advance_clock(401_000).await?;
    env.wait_for(0, &run_id, "run_completed", T).await?;
    let tokens = server.tokens();
    ensure!(tokens == [Some(String::new())], "{tokens:?}");
    let run = env.client(0)?.get_run(&run_id).await?;
    let output: Value = serde_json::from_str(&run.output_json)?;
    ensure!(output["status"] == "rejected", "{output}");
    ensure!(!stored_text(&env).await?.contains(OTP));
    env.stop().await
}

belay_tests::on_both_backends!(
    a_vaulted_code_reaches_only_the_consumers_header_and_only_once,
    a_vaulted_code_past_its_ttl_is_sent_as_an_empty_header,
);
