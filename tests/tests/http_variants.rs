//! `request_variants:` end to end, on both backends: the real engine
//! parses the tools file, chooses the variant when it schedules each call
//! (recorded in `tool_call_scheduled` and in the task spec), and a real
//! worker sends the chosen request to a server in this process. The EU
//! variant goes to its own endpoint, with PUT, its header and an XML body
//! (`body_type: xml`), and its XML answer comes back as JSON; a US call
//! matches no `when` and sends the tool's own JSON POST.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use axum::body::Bytes;
use axum::http::{HeaderMap, Method, Uri, header};
use belay_sdk::StartOptions;
use belay_tests::{DbBackend, EngineOpts, Env, of_kind};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(60);

/// (method, path, headers, body) of every request.
type Seen = Arc<Mutex<Vec<(Method, String, HeaderMap, String)>>>;

async fn serve() -> Result<(Seen, SocketAddr)> {
    let seen: Seen = Arc::default();
    let log = Arc::clone(&seen);
    let router = axum::Router::new().fallback(
        move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
            let log = Arc::clone(&log);
            async move {
                let text = String::from_utf8_lossy(&body).into_owned();
                let eu = uri.path().starts_with("/eu/");
                log.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push((method, uri.path().to_owned(), headers, text));
                if eu {
                    (
                        [(header::CONTENT_TYPE, "application/xml")],
                        "<receipt><ref>eu-1</ref></receipt>".to_owned(),
                    )
                } else {
                    (
                        [(header::CONTENT_TYPE, "application/json")],
                        r#"{"ref": "us-1"}"#.to_owned(),
                    )
                }
            }
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok((seen, addr))
}

async fn register(env: &Env, addr: SocketAddr) -> Result<()> {
    let tools = format!(
        r#"TOOLS:
  submit_order(id: string, region: string, amount: number) -> {{ref: string}}
    description: "Submit an order where its region keeps its data"
    type: http
    endpoint: "http://{addr}/us/orders"
    method: POST
    headers:
      X-Region: us
    permission: crm.write
    repeat_safety: idempotent
    request_variants:
      - name: eu
        when: '.region == "EU"'
        endpoint: "http://{addr}/eu/orders/{{id}}"
        method: PUT
        headers:
          X-Region: eu
          X-Residency: eu-only
        body_type: xml
      - name: default
        default: true
"#
    );
    let flow = r#"kind: workflow
name: submit_order_flow
nodes:
  - {id: submit, type: tool, tool: submit_order, args: {id: "${ .input.id }", region: "${ .input.region }", amount: "${ .input.amount }"}, grants: [crm.write]}
"#;
    env.client(0)?
        .register_files(vec![
            belay_proto::v1::DefinitionFile {
                path: "variants.tools.abl".into(),
                content: tools,
            },
            belay_proto::v1::DefinitionFile {
                path: "variants.yaml".into(),
                content: flow.into(),
            },
        ])
        .await?;
    Ok(())
}

/// Runs the flow for `input`; the run's events once it completed.
async fn run(env: &Env, input: Value, key: &str) -> Result<(String, Vec<Value>)> {
    let (run, _) = env
        .client(0)?
        .start_run(
            "submit_order_flow",
            &input,
            StartOptions {
                idempotency_key: key.into(),
                caller: "test".into(),
                caller_grants: vec!["crm.write".into()],
            },
        )
        .await?;
    env.wait_for(0, &run.run_id, "run_completed", T).await?;
    let events = env.events(&run.run_id).await?;
    Ok((run.run_id, events))
}

async fn the_eu_variant_is_chosen_recorded_and_sent(backend: DbBackend) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    let (seen, addr) = serve().await?;
    register(&env, addr).await?;
    env.start_worker(0).await?;

    let (eu_run, events) = run(
        &env,
        json!({"id": "o-1", "region": "EU", "amount": 12.5}),
        "variant-eu",
    )
    .await?;
    let scheduled = of_kind(&events, "tool_call_scheduled");
    let scheduled = scheduled.first().context("scheduled")?;
    ensure!(scheduled["variant"] == "eu", "{scheduled}");
    let completed = of_kind(&events, "tool_call_completed");
    ensure!(
        completed.first().context("completed")?["result"] == json!({"ref": "eu-1"}),
        "the XML answer as JSON: {events:?}"
    );
    let call_id = scheduled["call_id"].as_str().context("call id")?;
    let spec = env.db.task_spec(&eu_run, call_id).await?;
    ensure!(spec["variant"] == "eu", "{spec}");
    ensure!(spec["binding"]["method"] == "PUT", "{spec}");
    ensure!(spec["binding"]["body_type"] == "xml", "{spec}");

    let (_, events) = run(
        &env,
        json!({"id": "o-2", "region": "US", "amount": 3}),
        "variant-us",
    )
    .await?;
    let scheduled = of_kind(&events, "tool_call_scheduled");
    ensure!(
        scheduled.first().context("scheduled")?["variant"] == "default",
        "{events:?}"
    );

    let seen = seen
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    ensure!(seen.len() == 2, "{seen:?}");
    let (method, path, headers, body) = &seen[0];
    ensure!(
        *method == Method::PUT && path == "/eu/orders/o-1",
        "{seen:?}"
    );
    ensure!(headers["x-region"] == "eu" && headers["x-residency"] == "eu-only");
    ensure!(headers[header::CONTENT_TYPE] == "application/xml; charset=utf-8");
    ensure!(
        body.contains("<submit_order><amount>12.5</amount><region>EU</region></submit_order>"),
        "{body}"
    );
    let (method, path, headers, body) = &seen[1];
    ensure!(*method == Method::POST && path == "/us/orders", "{seen:?}");
    ensure!(headers["x-region"] == "us" && headers.get("x-residency").is_none());
    let body: Value = serde_json::from_str(body)?;
    ensure!(
        body == json!({"id": "o-2", "region": "US", "amount": 3}),
        "{body}"
    );
    env.stop().await
}

belay_tests::on_both_backends!(the_eu_variant_is_chosen_recorded_and_sent);
