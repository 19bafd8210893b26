//! Fuzz target: the JSON bodies of the admin API. Each input's first byte
//! picks a route that takes a body (resolve an uncertain outcome, pause,
//! resume or cancel a run, fail a waiting call, accept an MCP tool
//! definition, create an API key); the rest is POSTed as its body, as an
//! operator, to the real admin router (`belay_engine::admin::router`)
//! over a coordinator and an in-memory SQLite store, in-process. Every
//! answer is a 2xx or a 4xx with the admin error shape, never a 5xx or a
//! panic.

#![no_main]

use std::sync::OnceLock;

use axum::body::Body;
use axum::http::{Request, header};
use belay_engine::admin::{self, AdminAuth};
use belay_engine::auth::Authenticator;
use belay_engine::coordinator::{Coordinator, CoordinatorConfig, StartRun};
use belay_engine::definitions::SourceFile;
use belay_engine::store::Store;
use libfuzzer_sys::fuzz_target;
use tower_service::Service as _;

const TOKEN: &str = "ops-token-0123456789";
const TOOLS: &str = r#"TOOLS:
  note(text: string) -> {noted: boolean}
    description: "Write a note"
    type: http
    endpoint: "/notes"
    permission: crm.write
    repeat_safety: idempotent
"#;
const FLOW: &str = r#"kind: workflow
name: w
nodes:
  - {id: n, type: tool, tool: note, args: {text: "x"}, grants: [crm.write]}
"#;

struct Env {
    rt: tokio::runtime::Runtime,
    router: axum::Router,
    run: String,
}

fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let (router, run) = rt.block_on(setup());
        Env { rt, router, run }
    })
}

async fn setup() -> (axum::Router, String) {
    let store = Store::connect("sqlite::memory:", 1).await.expect("store");
    store.migrate().await.expect("migrate");
    store
        .set_tenant_grants("acme", &["crm.write".into()])
        .await
        .expect("grants");
    let coord = Coordinator::new(store.clone(), CoordinatorConfig::default());
    let files = vec![
        SourceFile {
            path: "t.tools.abl".into(),
            content: TOOLS.into(),
        },
        SourceFile {
            path: "w.yaml".into(),
            content: FLOW.into(),
        },
    ];
    coord
        .register_bundle("acme", files)
        .await
        .expect("register");
    let (run, _) = coord
        .start_run(StartRun {
            tenant: "acme".into(),
            workflow: "w".into(),
            input_json: "{}".into(),
            idempotency_key: "fuzz".into(),
            caller: "c".into(),
            caller_grants: vec!["crm.write".into()],
        })
        .await
        .expect("start");
    let auth = Authenticator::new(
        store,
        AdminAuth::parse(&format!("ops:{TOKEN}")).expect("tokens"),
    );
    (admin::router(coord, auth), run.run_id.to_string())
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    let env = env();
    let run = &env.run;
    let uncertain = "0190a0a0-0000-7000-8000-000000000000";
    let path = match which % 8 {
        0 => format!("/admin/v1/tenants/acme/uncertain-outcomes/{uncertain}/resolve"),
        1 => format!("/admin/v1/tenants/acme/runs/{run}/pause"),
        2 => format!("/admin/v1/tenants/acme/runs/{run}/resume"),
        3 => format!("/admin/v1/tenants/acme/runs/{run}/cancel"),
        4 => format!("/admin/v1/tenants/acme/runs/{run}/calls/n.t1/fail"),
        5 => "/admin/v1/tenants/acme/mcp-tools/srv/echo/accept".to_owned(),
        6 => "/admin/v1/keys".to_owned(),
        _ => format!("/admin/v1/tenants/acme/runs/{run}/pause"),
    };
    let request = Request::post(&path)
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_vec()))
        .expect("a request");
    let response = env
        .rt
        .block_on(env.router.clone().call(request))
        .expect("the router answers");
    assert!(
        !response.status().is_server_error(),
        "POST {path} answered {} to {:?}",
        response.status(),
        String::from_utf8_lossy(body)
    );
});
