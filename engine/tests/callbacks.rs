//! Callbacks of `type: async_webhook` tools through the coordinator and the
//! real HTTP callback endpoint, on both backends (`postgres::<name>` and
//! `sqlite::<name>`): the dispatch hands out a single-use URL, the 2xx answer
//! is an acceptance, the callback completes the call once (a replay is
//! answered `applied: false`), bad callbacks are refused without using the
//! token, the wait times out by the engine's clock, and a callback reaches a
//! run after its engine was replaced.

mod common;
use common::{Backend, TestDb};

use std::sync::Arc;

use belay_engine::coordinator::{Coordinator, CoordinatorConfig, StartRun};
use belay_engine::definitions::SourceFile;
use belay_engine::store::ClaimedTask;
use serde_json::{Value, json};
use tokio::sync::watch;
use uuid::Uuid;

const TENANT: &str = "t";

const TOOLS: &str = r#"TOOLS:
  kyc(email: string) -> {check_id: string, status: string}
    description: "Check identity documents; the provider calls back"
    type: async_webhook
    endpoint: "/kyc/checks"
    method: POST
    callback_url_field: meta.reply_to
    timeout_seconds: 600
    permission: crm.read
    repeat_safety: idempotent
  note(text: string) -> {noted: boolean}
    description: "Write a note"
    type: http
    endpoint: "/notes"
    permission: crm.read
    repeat_safety: idempotent
"#;

const AGENT: &str = r#"kind: agent
name: checker
model: m
instructions: Check the customer and take notes.
tools: [kyc, note]
grants: [crm.read]
---
kind: workflow
name: agent_check
nodes:
  - {id: intake, type: agent, agent: checker, grants: [crm.read]}
"#;

const FLOW: &str = r#"kind: workflow
name: check
nodes:
  - {id: check, type: tool, tool: kyc, args: {email: "${ .input.email }"}, grants: [crm.read], on_error: failed, next: done}
  - {id: done, type: succeed, output: "${ .nodes.check.output }"}
  - {id: failed, type: fail, error: "${ .nodes.check.output.error }"}
"#;

/// An engine: a coordinator with its callback endpoint served over HTTP on
/// `port` (0: a free one). Dropping `stop` ends the server.
struct Engine {
    coord: Arc<Coordinator>,
    port: u16,
    stop: watch::Sender<bool>,
    server: tokio::task::JoinHandle<()>,
}

impl Engine {
    /// Stop serving, then close the store (on SQLite this releases the
    /// file for the next engine).
    async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.server.await;
        self.coord.store().close().await;
    }
}

async fn engine(db: &TestDb, port: u16) -> Engine {
    let coord = Coordinator::new(db.store(4).await, CoordinatorConfig::default());
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("bind the callback endpoint");
    let port = listener.local_addr().expect("addr").port();
    coord
        .serve_callbacks_at(&format!("http://127.0.0.1:{port}/"))
        .expect("callback base");
    let (stop, mut stopped) = watch::channel(false);
    let server = tokio::spawn({
        let coord = Arc::clone(&coord);
        async move {
            let shutdown = async move {
                let _ = stopped.wait_for(|s| *s).await;
            };
            let _ = belay_engine::callbacks::serve(coord, listener, shutdown).await;
        }
    });
    Engine {
        coord,
        port,
        stop,
        server,
    }
}

async fn setup(backend: Backend) -> (TestDb, Engine) {
    let db = TestDb::create(backend, "belay_cb").await;
    let e = engine(&db, 0).await;
    e.coord
        .store()
        .set_tenant_grants(TENANT, &["crm.read".into()])
        .await
        .expect("grants");
    e.coord
        .register_bundle(
            TENANT,
            vec![
                SourceFile {
                    path: "kyc.tools.abl".into(),
                    content: TOOLS.into(),
                },
                SourceFile {
                    path: "check.yaml".into(),
                    content: FLOW.into(),
                },
                SourceFile {
                    path: "agent.yaml".into(),
                    content: AGENT.into(),
                },
            ],
        )
        .await
        .expect("register");
    (db, e)
}

async fn start(coord: &Coordinator, key: &str) -> Uuid {
    start_workflow(coord, "check", key).await
}

async fn start_workflow(coord: &Coordinator, workflow: &str, key: &str) -> Uuid {
    let (run, _) = coord
        .start_run(StartRun {
            tenant: TENANT.into(),
            workflow: workflow.into(),
            input_json: json!({"email": "a@x.io"}).to_string(),
            idempotency_key: key.into(),
            caller: "app".into(),
            caller_grants: vec!["crm.read".into()],
        })
        .await
        .expect("start");
    run.run_id
}

async fn claim_one(coord: &Coordinator) -> ClaimedTask {
    let mut tasks = coord.claim("w1", 1, 0).await.expect("claim");
    assert_eq!(tasks.len(), 1, "one task");
    tasks.remove(0)
}

/// Claim and dispatch the run's task; returns the task and the callback URL.
async fn dispatch(coord: &Coordinator) -> (ClaimedTask, String) {
    let task = claim_one(coord).await;
    let url = coord
        .dispatch("w1", &task.task_id.to_string(), task.attempt as u32)
        .await
        .expect("dispatch")
        .expect("an async webhook gets a callback URL");
    (task, url)
}

async fn accept(coord: &Coordinator, task: &ClaimedTask) {
    coord
        .complete(
            "w1",
            &task.task_id.to_string(),
            task.attempt as u32,
            &json!({"check_id": "kyc_1", "status": "pending"}).to_string(),
        )
        .await
        .expect("acceptance");
}

async fn post(url: &str, body: &str) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .expect("POST the callback");
    let status = response.status().as_u16();
    let body = response.json::<Value>().await.unwrap_or(Value::Null);
    (status, body)
}

async fn status(coord: &Coordinator, run: Uuid) -> (String, String, Option<Value>) {
    let r = coord
        .get_run(TENANT, &run.to_string())
        .await
        .expect("get run");
    (r.status, r.status_reason, r.output)
}

async fn kinds(coord: &Coordinator, run: Uuid) -> Vec<String> {
    coord
        .store()
        .list_events(run, 0, 1000)
        .await
        .expect("events")
        .into_iter()
        .map(|e| e.kind)
        .collect()
}

async fn a_callback_completes_its_call_once_and_a_replay_changes_nothing(backend: Backend) {
    let (db, e) = setup(backend).await;
    let run = start(&e.coord, "cb1").await;
    let (task, url) = dispatch(&e.coord).await;
    // The URL is under the served base; the token is 64 hex digits, and
    // only its SHA-256 is stored.
    let token = url
        .strip_prefix(&format!("http://127.0.0.1:{}/callbacks/v1/", e.port))
        .expect("URL under the base")
        .to_owned();
    assert_eq!(token.len(), 64);
    assert!(token.bytes().all(|b| b.is_ascii_hexdigit()));
    let raw = db.raw().await;
    let stored = raw
        .fetch_texts("SELECT token_sha256 FROM callbacks WHERE run_id = $1", run)
        .await;
    raw.close().await;
    assert_eq!(stored.len(), 1);
    assert_ne!(stored[0], token, "the token itself is never stored");
    assert_eq!(
        stored[0],
        belay_engine::coordinator::callback_token_sha256(&token)
    );

    accept(&e.coord, &task).await;
    let (st, reason, _) = status(&e.coord, run).await;
    assert_eq!(st, "waiting");
    assert!(
        reason.contains("waits for its callback (up to 10m)"),
        "{reason}"
    );
    // The run holds no task while it waits.
    assert!(e.coord.claim("w1", 4, 0).await.expect("claim").is_empty());

    // A result that does not match the tool's output type: 422, token kept.
    let (code, body) = post(&url, r#"{"check_id": 7}"#).await;
    assert_eq!(code, 422, "{body}");
    let (code, body) = post(&url, "{not json").await;
    assert_eq!(code, 400, "{body}");
    // Unknown and malformed tokens: 404.
    let unknown = format!(
        "http://127.0.0.1:{}/callbacks/v1/{}",
        e.port,
        "0".repeat(64)
    );
    assert_eq!(post(&unknown, "{}").await.0, 404);
    let malformed = format!("http://127.0.0.1:{}/callbacks/v1/xyz", e.port);
    assert_eq!(post(&malformed, "{}").await.0, 404);

    let result = r#"{"check_id": "kyc_1", "status": "clear"}"#;
    let (code, body) = post(&url, result).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["applied"], true);
    assert_eq!(body["run_id"], run.to_string());
    let (st, _, output) = status(&e.coord, run).await;
    assert_eq!(st, "completed");
    assert_eq!(
        output,
        Some(json!({"check_id": "kyc_1", "status": "clear"}))
    );

    // The replay: 200, applied false, nothing written.
    let before = kinds(&e.coord, run).await;
    let (code, body) = post(&url, result).await;
    assert_eq!((code, body["applied"].clone()), (200, json!(false)));
    assert_eq!(kinds(&e.coord, run).await, before);
    assert_eq!(
        before.iter().filter(|k| *k == "callback_received").count(),
        1
    );
    db.drop().await;
}

async fn the_callback_wait_times_out_by_the_engines_clock(backend: Backend) {
    let (db, e) = setup(backend).await;
    let run = start(&e.coord, "cb2").await;
    let (task, url) = dispatch(&e.coord).await;
    accept(&e.coord, &task).await;
    e.coord
        .store()
        .advance_clock(9 * 60_000)
        .await
        .expect("clock");
    assert_eq!(e.coord.fire_due_timers().await.expect("fire"), 0);
    e.coord
        .store()
        .advance_clock(2 * 60_000)
        .await
        .expect("clock");
    assert_eq!(e.coord.fire_due_timers().await.expect("fire"), 1);
    let (st, reason, _) = status(&e.coord, run).await;
    assert_eq!(st, "failed");
    assert!(reason.contains("did not call back within 10m"), "{reason}");
    // Too late: the run has ended; the callback is kept in the history, not
    // applied, and the sender is told so (200, so it does not retry).
    let (code, body) = post(&url, r#"{"check_id": "kyc_1", "status": "clear"}"#).await;
    assert_eq!(
        (code, body["applied"].clone()),
        (200, json!(false)),
        "{body}"
    );
    assert!(
        body["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("after the run was failed"),
        "{body}"
    );
    assert!(
        kinds(&e.coord, run)
            .await
            .contains(&"late_result_recorded".to_owned())
    );
    let (code, body) = post(&url, r#"{"check_id": "kyc_1", "status": "clear"}"#).await;
    assert_eq!(
        (code, body["applied"].clone()),
        (200, json!(false)),
        "{body}"
    );
    assert!(
        body["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("used before"),
        "{body}"
    );
    db.drop().await;
}

async fn a_callback_reaches_its_run_after_the_engine_was_replaced(backend: Backend) {
    let (db, e) = setup(backend).await;
    let run = start(&e.coord, "cb3").await;
    let (task, url) = dispatch(&e.coord).await;
    accept(&e.coord, &task).await;
    // The engine goes away (its server stops, its caches with it); a new one
    // serves the same port, as after a restart behind a fixed address.
    let port = e.port;
    e.stop().await;
    let e = engine(&db, port).await;
    let (code, body) = post(&url, r#"{"check_id": "kyc_1", "status": "review"}"#).await;
    assert_eq!(
        (code, body["applied"].clone()),
        (200, json!(true)),
        "{body}"
    );
    let (st, _, output) = status(&e.coord, run).await;
    assert_eq!(st, "completed");
    assert_eq!(
        output,
        Some(json!({"check_id": "kyc_1", "status": "review"}))
    );
    db.drop().await;
}

async fn an_engine_without_a_callback_endpoint_refuses_the_dispatch(backend: Backend) {
    let (db, e) = setup(backend).await;
    let run = start(&e.coord, "cb4").await;
    // An engine that serves no callbacks (on the same store: SQLite allows
    // one engine process per file).
    let bare = Coordinator::new(e.coord.store().clone(), CoordinatorConfig::default());
    let task = claim_one(&bare).await;
    let refused = bare
        .dispatch("w1", &task.task_id.to_string(), task.attempt as u32)
        .await
        .expect_err("refused");
    assert!(
        refused.to_string().contains("--callback-listen"),
        "{refused}"
    );
    // The refusal is in the history, not a silent lease expiry, and the
    // attempt is retried (another replica may serve callbacks).
    let events = e
        .coord
        .store()
        .list_events(run, 0, 1000)
        .await
        .expect("events");
    let failed = events
        .iter()
        .find(|ev| ev.kind == "tool_call_attempt_failed")
        .expect("attempt failed");
    assert_eq!(failed.payload["class"], "not_sent", "{:?}", failed.payload);
    assert_eq!(failed.payload["will_retry"], true, "{:?}", failed.payload);
    e.coord.store().advance_clock(60_000).await.expect("clock");
    let (_task, url) = dispatch(&e.coord).await;
    assert!(url.contains("/callbacks/v1/"));
    db.drop().await;
}

async fn the_other_calls_of_a_turn_run_while_one_waits_for_its_callback(backend: Backend) {
    let (db, e) = setup(backend).await;
    let run = start_workflow(&e.coord, "agent_check", "cb5").await;
    // The model proposes both tools in one turn.
    let model = claim_one(&e.coord).await;
    assert_eq!(model.kind, "model_call");
    let turn = json!({
        "content": null,
        "tool_calls": [
            {"id": "u1", "name": "kyc", "arguments": "{\"email\": \"a@x.io\"}"},
            {"id": "u2", "name": "note", "arguments": "{\"text\": \"checking\"}"}
        ],
        "finish_reason": "tool_calls"
    });
    e.coord
        .complete(
            "w1",
            &model.task_id.to_string(),
            model.attempt as u32,
            &turn.to_string(),
        )
        .await
        .expect("model result");
    let tasks = e.coord.claim("w1", 4, 0).await.expect("claim");
    assert_eq!(tasks.len(), 2);
    let kyc = tasks
        .iter()
        .find(|t| t.spec["tool"] == "kyc")
        .expect("kyc task");
    let note = tasks
        .iter()
        .find(|t| t.spec["tool"] == "note")
        .expect("note task");
    e.coord
        .dispatch("w1", &kyc.task_id.to_string(), kyc.attempt as u32)
        .await
        .expect("dispatch kyc")
        .expect("callback URL");
    accept(&e.coord, kyc).await;
    assert_eq!(status(&e.coord, run).await.0, "waiting");
    // The note is dispatched although the run waits, fails before sending,
    // and is claimed again (after its retry delay) while the run still waits.
    let url = e
        .coord
        .dispatch("w1", &note.task_id.to_string(), note.attempt as u32)
        .await
        .expect("a waiting run's other call may act");
    assert_eq!(url, None, "a plain HTTP tool gets no callback URL");
    e.coord
        .fail(
            "w1",
            &note.task_id.to_string(),
            note.attempt as u32,
            "connection refused",
            belay_engine::machine::FailureClass::NotSent,
            None,
        )
        .await
        .expect("fail");
    e.coord.store().advance_clock(60_000).await.expect("clock");
    let again = e.coord.claim("w1", 4, 0).await.expect("claim");
    assert_eq!(again.len(), 1, "the retry is claimed while the run waits");
    assert_eq!(again[0].spec["tool"], "note");
    assert_eq!(status(&e.coord, run).await.0, "waiting");
    db.drop().await;
}

async fn an_operator_fails_a_call_whose_callback_never_comes(backend: Backend) {
    let (db, e) = setup(backend).await;
    let run = start(&e.coord, "cb6").await;
    let (task, url) = dispatch(&e.coord).await;
    accept(&e.coord, &task).await;
    // An unknown call cannot be failed.
    let refused = e
        .coord
        .fail_waiting_call(TENANT, &run.to_string(), "nope.t1", "ops", "lost")
        .await
        .expect_err("unknown call");
    assert!(refused.to_string().contains("nope.t1"), "{refused}");
    // Through the admin endpoint, as an operator does.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind admin");
    let admin_url = format!("http://{}", listener.local_addr().expect("addr"));
    let auth = belay_engine::auth::Authenticator::new(
        e.coord.store().clone(),
        belay_engine::admin::AdminAuth::parse("ops:ops-token-0123456789").expect("auth"),
    );
    tokio::spawn(belay_engine::admin::serve(
        Arc::clone(&e.coord),
        auth,
        listener,
        std::future::pending(),
    ));
    let fail_url = format!("{admin_url}/admin/v1/tenants/{TENANT}/runs/{run}/calls/check.t1/fail");
    let response = reqwest::Client::new()
        .post(&fail_url)
        .bearer_auth("ops-token-0123456789")
        .json(&json!({"reason": "the provider lost it"}))
        .send()
        .await
        .expect("POST fail");
    assert_eq!(response.status().as_u16(), 200);
    // A second time: the call is no longer open (409).
    let again = reqwest::Client::new()
        .post(&fail_url)
        .bearer_auth("ops-token-0123456789")
        .json(&json!({"reason": "again"}))
        .send()
        .await
        .expect("POST fail again");
    assert_eq!(again.status().as_u16(), 409);
    let (st, reason, _) = status(&e.coord, run).await;
    // The tool node takes on_error: the run fails with the call's error.
    assert_eq!(st, "failed");
    assert!(
        reason.contains("failed by operator ops: the provider lost it"),
        "{reason}"
    );
    // The callback arriving afterwards is kept, not applied.
    let (code, body) = post(&url, r#"{"check_id": "kyc_1", "status": "clear"}"#).await;
    assert_eq!(
        (code, body["applied"].clone()),
        (200, json!(false)),
        "{body}"
    );
    db.drop().await;
}

on_both_backends!(
    an_operator_fails_a_call_whose_callback_never_comes,
    the_other_calls_of_a_turn_run_while_one_waits_for_its_callback,
    a_callback_completes_its_call_once_and_a_replay_changes_nothing,
    the_callback_wait_times_out_by_the_engines_clock,
    a_callback_reaches_its_run_after_the_engine_was_replaced,
    an_engine_without_a_callback_endpoint_refuses_the_dispatch,
);
