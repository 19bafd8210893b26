//! Fuzz target: the bodies of `type: async_webhook` callbacks. Each input
//! is POSTed to the real callback router (`belay_engine::callbacks`), with
//! the live single-use token of a dispatched and accepted call, over a
//! coordinator and an in-memory SQLite store, in-process: it completes the
//! call (then a fresh call is set up for the next input), or is refused
//! with a 4xx without using the token (not JSON, larger than the limit,
//! not of the tool's output type). Never a 5xx or a panic.

#![no_main]

use std::sync::{Arc, Mutex, OnceLock};

use axum::body::Body;
use axum::http::{Request, header};
use belay_engine::coordinator::{Coordinator, CoordinatorConfig, StartRun};
use belay_engine::definitions::SourceFile;
use belay_engine::store::Store;
use libfuzzer_sys::fuzz_target;
use tower_service::Service as _;

const TOOLS: &str = r#"TOOLS:
  kyc(email: string) -> {check_id: string, status: string, score?: number, notes?: string[]}
    description: "Check identity documents; the provider calls back"
    type: async_webhook
    endpoint: "/kyc/checks"
    method: POST
    callback_url_field: meta.reply_to
    timeout_seconds: 600
    permission: crm.read
    repeat_safety: idempotent
"#;
const FLOW: &str = r#"kind: workflow
name: check
nodes:
  - {id: check, type: tool, tool: kyc, args: {email: "${ .input.email }"}, grants: [crm.read]}
"#;

struct Env {
    rt: tokio::runtime::Runtime,
    coord: Arc<Coordinator>,
    router: axum::Router,
    /// The path of the current call's callback URL.
    path: Mutex<String>,
    calls: Mutex<u64>,
}

fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let coord = rt.block_on(setup());
        let router = belay_engine::callbacks::router(Arc::clone(&coord));
        let env = Env {
            rt,
            coord,
            router,
            path: Mutex::new(String::new()),
            calls: Mutex::new(0),
        };
        env.next_call();
        env
    })
}

async fn setup() -> Arc<Coordinator> {
    let store = Store::connect("sqlite::memory:", 1).await.expect("store");
    store.migrate().await.expect("migrate");
    store
        .set_tenant_grants("t", &["crm.read".into()])
        .await
        .expect("grants");
    let coord = Coordinator::new(store, CoordinatorConfig::default());
    coord
        .serve_callbacks_at("http://127.0.0.1:9/")
        .expect("callback base");
    let files = vec![
        SourceFile {
            path: "kyc.tools.abl".into(),
            content: TOOLS.into(),
        },
        SourceFile {
            path: "check.yaml".into(),
            content: FLOW.into(),
        },
    ];
    coord.register_bundle("t", files).await.expect("register");
    coord
}

impl Env {
    /// Starts a run, claims and dispatches its call, accepts it (the
    /// tool's 2xx answer): its callback URL's path is the one to POST to.
    fn next_call(&self) {
        let n = {
            let mut calls = self.calls.lock().expect("lock");
            *calls += 1;
            *calls
        };
        let url = self.rt.block_on(async {
            let coord = &self.coord;
            coord
                .start_run(StartRun {
                    tenant: "t".into(),
                    workflow: "check".into(),
                    input_json: r#"{"email": "a@x.io"}"#.into(),
                    idempotency_key: format!("fuzz-{n}"),
                    caller: "app".into(),
                    caller_grants: vec!["crm.read".into()],
                })
                .await
                .expect("start");
            let task = coord.claim("w1", 1, 0).await.expect("claim").remove(0);
            let (id, attempt) = (task.task_id.to_string(), task.attempt as u32);
            let url = coord
                .dispatch("w1", &id, attempt)
                .await
                .expect("dispatch")
                .expect("a callback URL");
            coord
                .complete(
                    "w1",
                    &id,
                    attempt,
                    r#"{"check_id": "kyc_1", "status": "pending"}"#,
                )
                .await
                .expect("acceptance");
            url
        });
        let path = url
            .strip_prefix("http://127.0.0.1:9")
            .expect("the callback base")
            .to_owned();
        *self.path.lock().expect("lock") = path;
    }
}

fuzz_target!(|data: &[u8]| {
    let env = env();
    let path = env.path.lock().expect("lock").clone();
    let request = Request::post(&path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(data.to_vec()))
        .expect("a request");
    let response = env
        .rt
        .block_on(env.router.clone().call(request))
        .expect("the router answers");
    let status = response.status();
    assert!(
        !status.is_server_error(),
        "the callback answered {status} to {:?}",
        String::from_utf8_lossy(data)
    );
    if status.is_success() {
        // The call is completed and the token used: a new call for the next.
        env.next_call();
    }
});
