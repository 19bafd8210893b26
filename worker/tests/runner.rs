//! The worker loop against a fake in-process engine (`WorkerService`) and
//! in-process tool and model servers.
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use belay_proto::v1::{FailureClass, Task};
use belay_proto::wire::{
    ChatMessage, HttpBinding, ModelCallResult, ModelCallSpec, TASK_KIND_MODEL_CALL,
    TASK_KIND_TOOL_CALL, ToolBinding, ToolCallSpec,
};
use belay_worker::{
    EngineClient, ModelProvider, ModelProviderConfig, NetworkPolicy, RetryPolicy, WorkerConfig,
};
use common::{FakeEngine, GUARD, Log, Report};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const WORKER_ID: &str = "w-test";

struct Worker {
    stop: oneshot::Sender<()>,
    handle: JoinHandle<anyhow::Result<()>>,
}

impl Worker {
    fn start(engine: &FakeEngine, configure: impl FnOnce(&mut WorkerConfig)) -> Self {
        Self::start_at(engine.url(), configure)
    }

    fn start_at(engine_url: String, configure: impl FnOnce(&mut WorkerConfig)) -> Self {
        let mut config = WorkerConfig::new(engine_url, WORKER_ID);
        config.claim_wait_ms = 500;
        config.shutdown_grace_ms = 10_000;
        // The tool servers here are local.
        config.tool_network_policy = NetworkPolicy::allowing_loopback();
        configure(&mut config);
        let client = EngineClient::connect_lazy(&config.engine_url, WORKER_ID)
            .unwrap()
            .with_retry_policy(RetryPolicy {
                min_delay_ms: 10,
                max_delay_ms: 50,
                total_delay_ms: 5_000,
            });
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown = async move {
            let _ = stopped.await;
        };
        let handle = tokio::spawn(belay_worker::run_with_engine(config, client, shutdown));
        Self { stop, handle }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        guard(self.handle).await.unwrap().unwrap();
    }
}

async fn guard<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(GUARD, f)
        .await
        .expect("did not finish within the guard time")
}

fn tool_task(task_id: &str, attempt: u32, endpoint: String, method: &str) -> Task {
    let spec = ToolCallSpec {
        tool: "transfer".into(),
        tool_version: 1,
        arguments: json!({"amount": 5}),
        binding: ToolBinding::Http(HttpBinding {
            endpoint,
            method: method.into(),
            headers: BTreeMap::new(),
            timeout_ms: 60_000,
            request: Default::default(),
        }),
        idempotency_key: format!("key-{task_id}"),
        input: None,
        config_params: Vec::new(),
        result_secrets: Vec::new(),
        variant: None,
        sampling: None,
        trace: None,
        dispatch_with_claim: false,
        repeat_safety: String::new(),
    };
    Task {
        task_id: task_id.into(),
        run_id: "run-1".into(),
        tenant: "acme".into(),
        kind: TASK_KIND_TOOL_CALL.into(),
        attempt,
        lease_ms: 30_000,
        spec_json: serde_json::to_string(&spec).unwrap(),
        idempotency_key: format!("key-{task_id}"),
        dispatched: false,
        lease_from_ms: 0,
    }
}

fn model_task(task_id: &str, attempt: u32, spec_json: String) -> Task {
    Task {
        task_id: task_id.into(),
        run_id: "run-1".into(),
        tenant: "acme".into(),
        kind: TASK_KIND_MODEL_CALL.into(),
        attempt,
        lease_ms: 30_000,
        spec_json,
        idempotency_key: format!("key-{task_id}"),
        dispatched: false,
        lease_from_ms: 0,
    }
}

/// A tool server whose routes log `http <path>` into `log` and answer `{"ok": true}`.
async fn logging_tool_server(log: &Log) -> String {
    let handler = |log: Log| {
        move |uri: axum::http::Uri| async move {
            log.push(format!("http {}", uri.path()));
            axum::Json(json!({"ok": true}))
        }
    };
    let router = Router::new()
        .route("/act", post(handler(log.clone())))
        .route("/second", post(handler(log.clone())));
    format!("http://{}", common::serve(router).await)
}

#[tokio::test]
async fn tool_call_is_dispatched_before_the_request_and_completed_with_its_attempt() {
    let log = Log::default();
    let tools = logging_tool_server(&log).await;
    let mut engine = FakeEngine::start(log.clone()).await;
    engine.push(tool_task("t1", 3, format!("{tools}/act"), "POST"));
    let worker = Worker::start(&engine, |_| {});

    let Report::Complete(done) = engine.next_report().await else {
        panic!("expected a completion");
    };
    assert_eq!(done.task_id, "t1");
    assert_eq!(done.attempt, 3);
    assert_eq!(done.worker_id, WORKER_ID);
    assert_eq!(
        serde_json::from_str::<Value>(&done.result_json).unwrap(),
        json!({"ok": true})
    );
    assert_eq!(
        log.entries(),
        vec!["claim t1 3", "dispatch t1 3", "http /act", "complete t1 3"]
    );
    {
        let state = engine.state.lock().unwrap();
        assert_eq!(state.dispatches[0].worker_id, WORKER_ID);
        assert_eq!(state.dispatches[0].attempt, 3);
    }
    worker.stop().await;
}

/// A task the engine leased already dispatched (`Task.dispatched`, issue
/// 23) is acted on without `DispatchToolCall`.
#[tokio::test]
async fn a_task_handed_out_dispatched_is_acted_on_without_asking() {
    let log = Log::default();
    let tools = logging_tool_server(&log).await;
    let mut engine = FakeEngine::start(log.clone()).await;
    let mut task = tool_task("t1", 1, format!("{tools}/act"), "POST");
    task.dispatched = true;
    engine.push(task);
    let worker = Worker::start(&engine, |_| {});
    let Report::Complete(done) = engine.next_report().await else {
        panic!("expected a completion");
    };
    assert_eq!(done.task_id, "t1");
    assert_eq!(
        log.entries(),
        vec!["claim t1 1", "http /act", "complete t1 1"]
    );
    assert!(engine.state.lock().unwrap().dispatches.is_empty());
    worker.stop().await;
}

#[tokio::test]
async fn a_configured_value_the_tool_echoes_back_is_redacted_from_its_answer() {
    // A `source: config` parameter: the worker puts the value in, the tool
    // echoes its request body, and the reported result carries no value.
    let router = Router::new().route(
        "/act",
        post(|body: axum::Json<Value>| async move { axum::Json(json!({"echo": body.0})) }),
    );
    let tools = format!("http://{}", common::serve(router).await);
    let mut engine = FakeEngine::start(Log::default()).await;
    let mut task = tool_task("t1", 1, format!("{tools}/act"), "POST");
    let mut spec: ToolCallSpec = serde_json::from_str(&task.spec_json).unwrap();
    spec.arguments = json!({"amount": 5, "key": "{{config.PARTNER_KEY}}"});
    spec.config_params = vec!["key".into()];
    task.spec_json = serde_json::to_string(&spec).unwrap();
    engine.push(task);
    let worker = Worker::start(&engine, |c| {
        c.tool_config = belay_worker::placeholders::ConfigValues::new(BTreeMap::from([(
            "PARTNER_KEY".to_owned(),
            "pk_live_0123".to_owned(),
        )]));
    });
    let Report::Complete(done) = engine.next_report().await else {
        panic!("expected a completion");
    };
    assert_eq!(
        serde_json::from_str::<Value>(&done.result_json).unwrap(),
        json!({"echo": {"amount": 5, "key": "[REDACTED:config]"}})
    );
    worker.stop().await;
}

#[tokio::test]
async fn tool_calls_of_one_turn_run_at_the_same_time() {
    // The two calls a model proposed in one turn are two tasks. Each request
    // waits at a barrier for the other one: both complete only if both were
    // in flight at once on this one worker. The barrier's timeout turns a
    // worker that runs them one after the other into a failed call.
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let handler = move |uri: axum::http::Uri| {
        let barrier = Arc::clone(&barrier);
        async move {
            match tokio::time::timeout(GUARD / 2, barrier.wait()).await {
                Ok(_) => (StatusCode::OK, format!("\"{}\"", uri.path())),
                Err(_) => (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the other call of the turn never arrived".to_owned(),
                ),
            }
        }
    };
    let router = Router::new()
        .route("/lookup_a", post(handler.clone()))
        .route("/lookup_b", post(handler));
    let tools = format!("http://{}", common::serve(router).await);
    let mut engine = FakeEngine::start(Log::default()).await;
    engine.push(tool_task("call-a", 1, format!("{tools}/lookup_a"), "POST"));
    engine.push(tool_task("call-b", 1, format!("{tools}/lookup_b"), "POST"));
    let worker = Worker::start(&engine, |c| c.concurrency = 2);

    let mut results = Vec::new();
    for _ in 0..2 {
        match engine.next_report().await {
            Report::Complete(done) => results.push((done.task_id, done.result_json)),
            other => panic!("the calls did not run at the same time: {other:?}"),
        }
    }
    results.sort();
    assert_eq!(
        results,
        [
            ("call-a".to_owned(), "\"/lookup_a\"".to_owned()),
            ("call-b".to_owned(), "\"/lookup_b\"".to_owned()),
        ]
    );
    worker.stop().await;
}

#[tokio::test]
async fn refused_dispatch_means_no_request_and_no_report() {
    let log = Log::default();
    let tools = logging_tool_server(&log).await;
    let mut engine = FakeEngine::start(log.clone()).await;
    engine
        .state
        .lock()
        .unwrap()
        .refuse_dispatch
        .insert("t1".into());
    engine.push(tool_task("t1", 1, format!("{tools}/act"), "POST"));
    engine.push(tool_task("t2", 1, format!("{tools}/second"), "POST"));
    // One slot: t2 is claimed only once t1 is finished with.
    let worker = Worker::start(&engine, |c| c.concurrency = 1);

    let report = engine.next_report().await;
    assert_eq!(report.task_id(), "t2");
    assert_eq!(
        log.entries(),
        vec![
            "claim t1 1",
            "dispatch t1 1 refused",
            "claim t2 1",
            "dispatch t2 1",
            "http /second",
            "complete t2 1",
        ]
    );
    assert!(engine.pending_reports().is_empty());
    worker.stop().await;
}

#[tokio::test]
async fn a_lease_lost_after_dispatch_finishes_the_call_and_reports_it_late() {
    let log = Log::default();
    let mut engine = FakeEngine::start(log.clone()).await;
    // The tool answers only after the engine has told the worker that t1's
    // lease is lost: the call is under way, so the worker must finish it and
    // report the real result (late) instead of dropping it.
    let state = engine.state.clone();
    let told = engine.state.lock().unwrap().lost_told.clone();
    let hang_log = log.clone();
    let router = Router::new()
        .route(
            "/slow",
            post(move || async move {
                hang_log.push("http /slow");
                state.lock().unwrap().lost.insert("t1".into());
                told.notified().await;
                "{\"late\":true}"
            }),
        )
        .route(
            "/second",
            post({
                let log = log.clone();
                move || async move {
                    log.push("http /second");
                    "{}"
                }
            }),
        );
    let tools = format!("http://{}", common::serve(router).await);
    let mut lost = tool_task("t1", 2, format!("{tools}/slow"), "POST");
    lost.lease_ms = 300; // heartbeat every 100 ms
    engine.push(lost);
    engine.push(tool_task("t2", 1, format!("{tools}/second"), "POST"));
    let worker = Worker::start(&engine, |c| c.concurrency = 1);

    let report = engine.next_report().await;
    assert_eq!(
        report.task_id(),
        "t1",
        "the dispatched call was finished, not dropped"
    );
    let report = engine.next_report().await;
    assert_eq!(report.task_id(), "t2");
    assert_eq!(
        log.entries(),
        vec![
            "claim t1 2",
            "dispatch t1 2",
            "http /slow",
            "complete t1 2",
            "claim t2 1",
            "dispatch t2 1",
            "http /second",
            "complete t2 1",
        ]
    );
    worker.stop().await;
}

#[tokio::test]
async fn tool_failure_is_reported_with_class_and_attempt() {
    let log = Log::default();
    let router = Router::new().route(
        "/act",
        post(|| async { (axum::http::StatusCode::BAD_GATEWAY, "upstream died") }),
    );
    let tools = format!("http://{}", common::serve(router).await);
    let mut engine = FakeEngine::start(log.clone()).await;
    engine.push(tool_task("t1", 4, format!("{tools}/act"), "POST"));
    let worker = Worker::start(&engine, |_| {});

    let Report::Fail(failed) = engine.next_report().await else {
        panic!("expected a failure");
    };
    assert_eq!(failed.attempt, 4);
    assert_eq!(failed.class, FailureClass::MayHaveActed as i32);
    assert!(failed.error.contains("502"), "{}", failed.error);
    assert!(failed.error.contains("upstream died"), "{}", failed.error);
    worker.stop().await;
}

#[tokio::test]
async fn unusable_tool_binding_is_rejected_without_dispatch() {
    let log = Log::default();
    let mut engine = FakeEngine::start(log.clone()).await;
    // A path endpoint and no HTTP base URL.
    engine.push(tool_task("t1", 1, "/act".into(), "POST"));
    let worker = Worker::start(&engine, |_| {});

    let Report::Fail(failed) = engine.next_report().await else {
        panic!("expected a failure");
    };
    assert_eq!(failed.class, FailureClass::Rejected as i32);
    assert!(engine.state.lock().unwrap().dispatches.is_empty());
    worker.stop().await;
}

#[tokio::test]
async fn a_tool_at_a_refused_address_is_rejected_and_never_reached() {
    let log = Log::default();
    let tools = logging_tool_server(&log).await;
    let port = tools.rsplit(':').next().unwrap();
    let mut engine = FakeEngine::start(log.clone()).await;
    // An IP literal: refused before dispatch.
    engine.push(tool_task("t1", 1, format!("{tools}/act"), "POST"));
    // A name: refused once resolved, which is after dispatch.
    engine.push(tool_task(
        "t2",
        1,
        format!("http://localhost:{port}/act"),
        "POST",
    ));
    let worker = Worker::start(&engine, |c| {
        c.concurrency = 1;
        c.tool_network_policy = NetworkPolicy::default();
    });

    for task_id in ["t1", "t2"] {
        let Report::Fail(failed) = engine.next_report().await else {
            panic!("expected a failure");
        };
        assert_eq!(failed.task_id, task_id);
        assert_eq!(failed.class, FailureClass::Rejected as i32);
        assert!(
            failed.error.contains("loopback 127.0.0.1"),
            "{}",
            failed.error
        );
        assert!(
            failed.error.contains("--allow-private-network"),
            "{}",
            failed.error
        );
    }
    let entries = log.entries();
    assert!(
        !entries.iter().any(|e| e.starts_with("http")),
        "{entries:?}"
    );
    assert!(
        !entries.contains(&"dispatch t1 1".to_owned()),
        "{entries:?}"
    );
    assert!(entries.contains(&"dispatch t2 1".to_owned()), "{entries:?}");
    worker.stop().await;
}

#[tokio::test]
async fn invalid_specs_are_rejected_with_the_parse_error() {
    let log = Log::default();
    let mut engine = FakeEngine::start(log.clone()).await;
    engine.push(model_task("m1", 1, "{not json".into()));
    let mut bad_tool = tool_task("t1", 1, "http://127.0.0.1:1/x".into(), "POST");
    bad_tool.spec_json = r#"{"tool": "x"}"#.into();
    engine.push(bad_tool);
    let worker = Worker::start(&engine, |_| {});

    let mut fails = Vec::new();
    for _ in 0..2 {
        let Report::Fail(failed) = engine.next_report().await else {
            panic!("expected a failure");
        };
        fails.push(failed);
    }
    fails.sort_by(|a, b| a.task_id.cmp(&b.task_id));
    assert_eq!(fails[0].task_id, "m1");
    assert!(
        fails[0].error.contains("invalid model_call spec"),
        "{}",
        fails[0].error
    );
    assert_eq!(fails[1].task_id, "t1");
    assert!(
        fails[1].error.contains("invalid tool_call spec"),
        "{}",
        fails[1].error
    );
    for failed in &fails {
        assert_eq!(failed.class, FailureClass::Rejected as i32);
    }
    assert!(engine.state.lock().unwrap().dispatches.is_empty());
    worker.stop().await;
}

#[tokio::test]
async fn model_call_result_is_reported() {
    let log = Log::default();
    let router = Router::new().route(
        "/v1/chat/completions",
        post(|| async {
            axum::Json(json!({
                "choices": [{"message": {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "lookup", "arguments": "{\"q\": oops"}}
                ]}, "finish_reason": "tool_calls"}],
                "usage": {"prompt_tokens": 7, "completion_tokens": 3},
            }))
        }),
    );
    let model_base = format!("http://{}/v1", common::serve(router).await);
    let mut engine = FakeEngine::start(log.clone()).await;
    let spec = ModelCallSpec {
        model: "m".into(),
        messages: vec![ChatMessage::User {
            content: "hi".into(),
        }],
        tools: vec![],
        max_output_tokens: None,
        trace: None,
    };
    engine.push(model_task("m1", 2, serde_json::to_string(&spec).unwrap()));
    let worker = Worker::start(&engine, |c| c.model.base_url = model_base);

    let Report::Complete(done) = engine.next_report().await else {
        panic!("expected a completion");
    };
    assert_eq!(done.attempt, 2);
    let result: ModelCallResult = serde_json::from_str(&done.result_json).unwrap();
    assert_eq!(result.tool_calls[0].arguments, "{\"q\": oops");
    assert_eq!(result.usage.input_tokens, 7);
    assert_eq!(result.finish_reason.as_deref(), Some("tool_calls"));
    worker.stop().await;
}

#[tokio::test]
async fn a_worker_configured_for_anthropic_speaks_messages() {
    let router = Router::new().route(
        "/v1/messages",
        post(|headers: axum::http::HeaderMap| async move {
            assert_eq!(headers["x-api-key"], "sk-ant-test");
            axum::Json(json!({
                "content": [{"type": "text", "text": "Done."}],
                "stop_reason": "end_turn",
                "usage": {"input_tokens": 7, "output_tokens": 3},
            }))
        }),
    );
    let model_base = format!("http://{}/v1", common::serve(router).await);
    let mut engine = FakeEngine::start(Log::default()).await;
    let spec = json!({"model": "claude-test", "messages": [{"role": "user", "content": "hi"}],
                      "tools": []});
    engine.push(model_task("m1", 1, spec.to_string()));
    let worker = Worker::start(&engine, |c| {
        c.model = ModelProviderConfig {
            provider: ModelProvider::Anthropic,
            base_url: model_base,
            api_key: Some("sk-ant-test".into()),
            ..ModelProviderConfig::default()
        }
    });

    let Report::Complete(done) = engine.next_report().await else {
        panic!("expected a completion");
    };
    let result: ModelCallResult = serde_json::from_str(&done.result_json).unwrap();
    assert_eq!(result.content.as_deref(), Some("Done."));
    assert_eq!(result.finish_reason.as_deref(), Some("stop"));
    assert_eq!(result.usage.input_tokens, 7);
    worker.stop().await;
}

#[tokio::test]
async fn model_failure_is_reported_with_its_class() {
    let log = Log::default();
    let router = Router::new().route(
        "/v1/chat/completions",
        post(|| async {
            (
                axum::http::StatusCode::UNAUTHORIZED,
                r#"{"error": {"message": "Incorrect API key provided"}}"#,
            )
        }),
    );
    let model_base = format!("http://{}/v1", common::serve(router).await);
    let mut engine = FakeEngine::start(log.clone()).await;
    let spec = json!({"model": "m", "messages": [], "tools": []});
    engine.push(model_task("m1", 1, spec.to_string()));
    let worker = Worker::start(&engine, |c| c.model.base_url = model_base);

    let Report::Fail(failed) = engine.next_report().await else {
        panic!("expected a failure");
    };
    assert_eq!(failed.class, FailureClass::Rejected as i32);
    assert!(failed.error.contains("Incorrect API key provided"));
    worker.stop().await;
}

#[tokio::test]
async fn unavailable_engine_reports_are_retried() {
    let log = Log::default();
    let tools = logging_tool_server(&log).await;
    let mut engine = FakeEngine::start(log.clone()).await;
    engine.state.lock().unwrap().unavailable_completes = 2;
    engine.push(tool_task("t1", 1, format!("{tools}/act"), "POST"));
    let worker = Worker::start(&engine, |_| {});

    let report = engine.next_report().await;
    assert!(matches!(report, Report::Complete(_)));
    assert_eq!(engine.state.lock().unwrap().complete_calls, 3);
    // The tool acted once: retrying the report never repeats the call.
    assert_eq!(
        log.entries()
            .iter()
            .filter(|e| e.starts_with("http"))
            .count(),
        1
    );
    worker.stop().await;
}

#[tokio::test]
async fn shutdown_waits_for_in_flight_tasks() {
    let log = Log::default();
    let (release, released) = oneshot::channel::<()>();
    let released = Arc::new(Mutex::new(Some(released)));
    let (arrived_tx, arrived) = oneshot::channel::<()>();
    let arrived_tx = Arc::new(Mutex::new(Some(arrived_tx)));
    let router = Router::new().route(
        "/slow",
        post(move || {
            let released = released.lock().unwrap().take();
            if let Some(tx) = arrived_tx.lock().unwrap().take() {
                let _ = tx.send(());
            }
            async move {
                if let Some(released) = released {
                    let _ = released.await;
                }
                "\"finished\""
            }
        }),
    );
    let tools = format!("http://{}", common::serve(router).await);
    let mut engine = FakeEngine::start(log.clone()).await;
    engine.push(tool_task("t1", 1, format!("{tools}/slow"), "POST"));
    let worker = Worker::start(&engine, |_| {});

    guard(arrived).await.unwrap();
    let _ = worker.stop.send(());
    release.send(()).unwrap();
    guard(worker.handle).await.unwrap().unwrap();
    let Report::Complete(done) = engine.next_report().await else {
        panic!("expected a completion");
    };
    assert_eq!(done.result_json, "\"finished\"");
}

/// A tool server whose `/hang` never answers; `arrived` fires when a
/// request reaches it.
async fn hanging_tool_server() -> (String, Arc<tokio::sync::Notify>) {
    let arrived = Arc::new(tokio::sync::Notify::new());
    let seen = arrived.clone();
    let router = Router::new().route(
        "/hang",
        post(move || {
            seen.notify_one();
            std::future::pending::<&'static str>()
        }),
    );
    (format!("http://{}", common::serve(router).await), arrived)
}

/// Issue 22, item 9: the heartbeat RPC's deadline comes from the lease.
/// With a 1.5 s lease and an engine that never answers the first
/// heartbeat, the next one goes out before the lease has run out (with a
/// fixed 10 s deadline it would wait 10 s, long after the lease expired
/// and the call was handed to another worker).
#[tokio::test]
async fn a_stalled_heartbeat_gives_way_to_the_next_before_a_short_lease_runs_out() {
    let log = Log::default();
    let (tools, arrived) = hanging_tool_server().await;
    let engine = FakeEngine::start(log.clone()).await;
    let seen = {
        let mut state = engine.state.lock().unwrap();
        state.stall_heartbeats = 1;
        state.heartbeat_seen.clone()
    };
    let mut task = tool_task("t1", 1, format!("{tools}/hang"), "POST");
    task.lease_ms = 1_500;
    engine.push(task);
    // The tool never answers: stop without waiting for it.
    let worker = Worker::start(&engine, |c| c.shutdown_grace_ms = 100);
    guard(arrived.notified()).await;
    guard(seen.notified()).await;
    tokio::time::timeout(std::time::Duration::from_millis(5_000), seen.notified())
        .await
        .expect("a second heartbeat after the stalled one");
    let at = engine.state.lock().unwrap().heartbeat_at.clone();
    let gap = at[1] - at[0];
    assert!(
        gap < std::time::Duration::from_millis(1_500),
        "the next heartbeat came {gap:?} after the stalled one, past the 1.5 s lease"
    );
    worker.stop().await;
}

/// Issue 22, item 9: a worker stopped while tasks still run past its
/// grace period reports each at once, by where it was (a dispatched call
/// may have acted, one whose dispatch never came back was not sent),
/// rather than leaving the engine to wait out the lease.
#[tokio::test]
async fn tasks_stopped_at_the_end_of_the_grace_period_are_reported_by_where_they_were() {
    let log = Log::default();
    let (tools, arrived) = hanging_tool_server().await;
    let mut engine = FakeEngine::start(log.clone()).await;
    let stalled = {
        let mut state = engine.state.lock().unwrap();
        state.stall_dispatch.insert("t2".into());
        state.dispatch_stalled.clone()
    };
    engine.push(tool_task("t1", 1, format!("{tools}/hang"), "POST"));
    engine.push(tool_task("t2", 1, format!("{tools}/hang"), "POST"));
    let worker = Worker::start(&engine, |c| c.shutdown_grace_ms = 300);
    guard(arrived.notified()).await;
    guard(stalled.notified()).await;
    worker.stop().await;
    let mut failed = std::collections::BTreeMap::new();
    for report in engine.pending_reports() {
        let Report::Fail(f) = report else {
            panic!("{report:?}");
        };
        failed.insert(f.task_id.clone(), f);
    }
    let class = |id: &str| FailureClass::try_from(failed[id].class).unwrap();
    assert_eq!(failed.len(), 2, "{failed:?}");
    assert_eq!(class("t1"), FailureClass::MayHaveActed);
    assert!(
        failed["t1"]
            .error
            .contains("after its tool call was dispatched"),
        "{}",
        failed["t1"].error
    );
    assert_eq!(class("t2"), FailureClass::NotSent);
    assert!(
        failed["t2"].error.contains("nothing was sent"),
        "{}",
        failed["t2"].error
    );
    assert!(
        failed["t2"]
            .error
            .contains("shutdown grace period (300 ms)"),
        "{}",
        failed["t2"].error
    );
}

#[tokio::test]
async fn worker_started_before_the_engine_claims_once_it_is_up() {
    let log = Log::default();
    let tools = logging_tool_server(&log).await;
    let addr = common::closed_port();
    // Claims fail with connection refused until the engine listens.
    let worker = Worker::start_at(format!("http://{addr}"), |_| {});
    let mut engine = FakeEngine::start_on(addr, log.clone()).await;
    engine.push(tool_task("t1", 1, format!("{tools}/act"), "POST"));

    let report = engine.next_report().await;
    assert!(matches!(report, Report::Complete(_)), "{report:?}");
    worker.stop().await;
}

/// `GET path` of the health endpoint at `addr`: status and JSON body.
async fn probe(addr: std::net::SocketAddr, path: &str) -> (u16, Value) {
    let response = reqwest::get(format!("http://{addr}{path}")).await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

#[tokio::test]
async fn readiness_follows_the_engine_and_shutdown_while_liveness_holds() {
    use belay_worker::health::{HealthState, Readiness};
    let health = HealthState::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let health_addr = listener.local_addr().unwrap();
    tokio::spawn(belay_worker::health::serve(
        listener,
        health.clone(),
        std::future::pending(),
    ));
    // Before the worker claims anything.
    let (status, body) = probe(health_addr, "/readyz").await;
    assert_eq!(status, 503);
    assert_eq!(body["reason"], "no claim has reached the engine yet");
    assert_eq!(probe(health_addr, "/livez").await, (200, json!("ok")));

    // The engine's port is closed: claims fail, the worker is not ready.
    let addr = common::closed_port();
    let worker = Worker::start_at(format!("http://{addr}"), |c| c.health = health.clone());
    health
        .wait_for(|r| matches!(r, Readiness::EngineUnreachable { .. }))
        .await;
    let (status, body) = probe(health_addr, "/readyz").await;
    assert_eq!(status, 503);
    assert_eq!(body["worker_id"], WORKER_ID);
    let reason = body["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("the engine cannot be reached: Unavailable"),
        "{body}"
    );
    assert!(body["unreachable_for_ms"].is_u64(), "{body}");

    // The engine comes up: the next claim reaches it.
    let _engine = FakeEngine::start_on(addr, Log::default()).await;
    guard(health.wait_for(|r| *r == Readiness::Ready)).await;
    let (status, body) = probe(health_addr, "/readyz").await;
    assert_eq!(
        (status, body),
        (200, json!({"ready": true, "worker_id": WORKER_ID}))
    );

    // Shutdown: no more claims, not ready; the process still answers.
    worker.stop().await;
    assert_eq!(health.get(), Readiness::Stopping);
    let (status, body) = probe(health_addr, "/readyz").await;
    assert_eq!(status, 503);
    assert_eq!(body["reason"], "shutting down: no more claims");
    assert_eq!(probe(health_addr, "/livez").await.0, 200);
}

/// Issue 22 (found by the chaos run): a dispatch answered after the lease
/// was lost (a stalled connection to the engine delivered the OK late,
/// after the engine had judged the lease, probed the call and handed it to
/// another attempt) is not acted on: the tool never hears of that attempt.
#[tokio::test]
async fn a_dispatch_answered_after_the_lease_was_lost_is_not_acted_on() {
    let log = Log::default();
    let (tools, recorded) = common::recording_server("/transfer", json!({"ok": true})).await;
    let mut engine = FakeEngine::start(log.clone()).await;
    // Every heartbeat stalls too (the same stalled connection): the worker
    // never hears that the lease is lost, only that it was not renewed.
    let (heartbeat_seen, release) = {
        let mut state = engine.state.lock().unwrap();
        state.hold_dispatch.insert("t1".into());
        state.stall_heartbeats = u32::MAX;
        (
            state.heartbeat_seen.clone(),
            state.dispatch_released.clone(),
        )
    };
    let mut late = tool_task("t1", 1, format!("http://{tools}/transfer"), "POST");
    late.lease_ms = 300;
    engine.push(late);
    let worker = Worker::start(&engine, |c| c.concurrency = 1);
    // The first heartbeat comes after the claim; heartbeats come a third of
    // the lease apart: once one arrives 400 ms after the first, the 300 ms
    // lease has run out by the worker's clock.
    guard(heartbeat_seen.notified()).await;
    let first = tokio::time::Instant::now();
    loop {
        guard(heartbeat_seen.notified()).await;
        if first.elapsed() >= std::time::Duration::from_millis(400) {
            break;
        }
    }
    release.notify_one();
    // One slot: t2 runs once t1's future has ended.
    engine.push(tool_task(
        "t2",
        1,
        format!("http://{tools}/transfer"),
        "POST",
    ));
    let report = engine.next_report().await;
    assert_eq!(report.task_id(), "t2", "{report:?}");
    let keys: Vec<String> = recorded
        .lock()
        .unwrap()
        .iter()
        .map(|(_, headers, _)| {
            headers
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    assert_eq!(keys, vec!["key-t2".to_owned()], "t1 never reached the tool");
    worker.stop().await;
}
