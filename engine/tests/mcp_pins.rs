//! Pinning of MCP tool definitions on both backends (`postgres::<name>`,
//! `sqlite::<name>`), without processes: workers' reports are made with
//! `Coordinator::report_mcp_tools`, dispatches with
//! `Coordinator::pin_mcp_for_dispatch` + `Coordinator::dispatch` (what the
//! gRPC handler does), and the admin router is served in-process.

mod common;
use common::{Backend, TestDb, claim_of};

use std::sync::Arc;

use belay_engine::coordinator::{Coordinator, CoordinatorError, StartRun};
use belay_engine::mcp_pins::McpToolReport;
use belay_proto::wire::{ModelCallResult, ToolBinding, ToolCallSpec, ToolUse, Usage};
use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

const TOOLS: &str = r#"TOOLS:
  echo(message: string) -> object[]
    description: "Echo a message"
    type: mcp
    server: everything
    server_tool: echo
    permission: mcp.use
    repeat_safety: idempotent

  add(a: number, b: number) -> object[]
    description: "Repeat safety from the server's hints"
    type: mcp
    server: everything
    server_tool: get-sum
    permission: mcp.use

  lookup(q: string) -> {found: boolean}
    type: http
    endpoint: "/lookup"
    permission: mcp.use
    repeat_safety: idempotent
"#;
const AGENT: &str = "kind: agent\nname: a\nmodel: m\ninstructions: i\ntools: [echo, lookup, add]\ngrants: [mcp.use]\n---\nkind: workflow\nname: w\nnodes:\n  - id: n\n    type: agent\n    agent: a\n";

const OPS: &str = "ops-token-0123456789";
const OTHER_BOT: &str = "other-token-0123456789";
const TOKENS: &str = "ops:ops-token-0123456789,other-bot:other-token-0123456789:other";

fn hash(c: char) -> String {
    format!("sha256:{}", c.to_string().repeat(64))
}

fn report(name: &str, hash: &str, description: &str) -> McpToolReport {
    McpToolReport {
        name: name.into(),
        definition_hash: hash.into(),
        definition_json:
            json!({"name": name, "description": description, "input_schema": {"type": "object"}})
                .to_string(),
        refusal: String::new(),
        suggested_repeat_safety: "never".into(),
    }
}

struct Env {
    db: TestDb,
    coord: Arc<Coordinator>,
    base: String,
    http: reqwest::Client,
}

impl Env {
    async fn new(backend: Backend) -> Env {
        let db = TestDb::create(backend, "belay_m").await;
        let coord = common::coordinator(
            db.store(8).await,
            &["acme", "other"],
            TOOLS,
            AGENT,
            &["mcp.use"],
        )
        .await;
        let base = common::serve_admin(&coord, TOKENS).await;
        Env {
            db,
            coord,
            base,
            http: reqwest::Client::new(),
        }
    }

    async fn finish(self) {
        self.db.drop().await;
    }

    /// Start a run of `tenant` whose model proposes `tool`; claim the tool
    /// call for `worker`. Returns (run id, task id).
    async fn tool_call(&self, tenant: &str, key: &str, tool: &str, worker: &str) -> (Uuid, Uuid) {
        let (run, created) = self
            .coord
            .start_run(StartRun {
                tenant: tenant.into(),
                workflow: "w".into(),
                input_json: "{}".into(),
                idempotency_key: key.into(),
                caller: "c".into(),
                caller_grants: vec!["mcp.use".into()],
            })
            .await
            .expect("start");
        assert!(created);
        // Other runs' tasks may be ready too: take this run's.
        let model = claim_of(&self.coord, worker, run.run_id, "model_call").await;
        let args = if tool == "echo" {
            r#"{"message":"hi"}"#
        } else {
            r#"{"q":"x"}"#
        };
        let proposal = serde_json::to_string(&ModelCallResult {
            content: None,
            tool_calls: vec![ToolUse {
                id: "tu".into(),
                name: tool.into(),
                arguments: args.into(),
            }],
            usage: Usage::default(),
            finish_reason: None,
        })
        .expect("json");
        self.coord
            .complete(worker, &model.task_id.to_string(), 1, &proposal)
            .await
            .expect("complete");
        let call = claim_of(&self.coord, worker, run.run_id, "tool_call").await;
        (run.run_id, call.task_id)
    }

    async fn get(&self, token: &str, path: &str) -> (StatusCode, Value) {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(token)
            .send()
            .await
            .expect("request");
        let status = resp.status();
        (status, resp.json().await.expect("json"))
    }

    async fn post(&self, token: &str, path: &str, body: Value) -> (StatusCode, Value) {
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(token)
            .json(&body)
            .send()
            .await
            .expect("request");
        let status = resp.status();
        (status, resp.json().await.expect("json"))
    }
}

async fn reports_record_each_definition_once_and_refuse_bad_listings(backend: Backend) {
    let env = Env::new(backend).await;
    let a = hash('a');
    let b = hash('b');
    let first = vec![
        report("echo", &a, "Echoes"),
        report("get-sum", &hash('c'), "Adds"),
    ];
    let new = env
        .coord
        .report_mcp_tools("w1", "everything", "2025-11-25", first.clone())
        .await
        .expect("report");
    assert_eq!(new, 2);
    // The same listing again (another worker): nothing new.
    let new = env
        .coord
        .report_mcp_tools("w2", "everything", "2025-11-25", first)
        .await
        .expect("report");
    assert_eq!(new, 0);
    // A changed definition of one tool: one new listing; both are kept.
    let new = env
        .coord
        .report_mcp_tools(
            "w1",
            "everything",
            "2025-11-25",
            vec![report("echo", &b, "Echoes, now differently\u{0}")],
        )
        .await
        .expect("report");
    assert_eq!(new, 1);
    let history = env
        .coord
        .store()
        .mcp_tool_definitions(Some("everything"), Some("echo"))
        .await
        .expect("definitions");
    assert_eq!(history.len(), 2);
    assert_eq!(history[0].definition_hash, b, "newest listing first");
    assert_eq!(history[0].reported_by, "w1");
    // NUL characters of untrusted text are stripped before they are stored.
    assert_eq!(
        history[0].definition["description"],
        "Echoes, now differently"
    );

    // Bad listings are refused whole, naming what is wrong.
    for (tools, needle) in [
        (
            vec![report("echo", "sha256:xyz", "d")],
            "is not a definition hash",
        ),
        (
            vec![report("echo", &a, "d"), report("echo", &b, "d")],
            "listed twice",
        ),
        (vec![report("bad name", &a, "d")], "without whitespace"),
        (
            vec![McpToolReport {
                definition_json: "{not json".into(),
                ..report("echo", &a, "d")
            }],
            "is not JSON",
        ),
        (
            vec![McpToolReport {
                suggested_repeat_safety: "always".into(),
                ..report("echo", &a, "d")
            }],
            "is not `never` or `idempotent`",
        ),
    ] {
        let err = env
            .coord
            .report_mcp_tools("w1", "everything", "2025-11-25", tools)
            .await
            .expect_err(needle);
        assert!(
            matches!(&err, CoordinatorError::InvalidArgument(m) if m.contains(needle)),
            "{needle}: {err}"
        );
    }
    assert_eq!(
        env.coord
            .store()
            .mcp_tool_definitions(None, None)
            .await
            .expect("definitions")
            .len(),
        3,
        "refused reports recorded nothing"
    );
    env.finish().await;
}

async fn the_first_dispatch_pins_and_a_changed_definition_waits_for_an_operator(backend: Backend) {
    let env = Env::new(backend).await;
    let (a, b) = (hash('a'), hash('b'));
    env.coord
        .report_mcp_tools(
            "w1",
            "everything",
            "2025-11-25",
            vec![report("echo", &a, "v1")],
        )
        .await
        .expect("report");
    let (status, body) = env.get(OPS, "/admin/v1/tenants/acme/mcp-tools").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["items"][0]["status"], "unpinned", "{body}");

    // acme's first call pins what the worker lists (trust on first use).
    let (_, task) = env.tool_call("acme", "k1", "echo", "w1").await;
    let spec = env
        .coord
        .store()
        .mcp_pin_task(task)
        .await
        .expect("task")
        .expect("row");
    let spec: ToolCallSpec = serde_json::from_value(spec.spec).expect("spec");
    assert!(
        matches!(spec.binding, ToolBinding::Mcp(ref m) if m.server == "everything" && m.server_tool == "echo")
    );
    // Only the worker holding the lease, at its attempt, may pin.
    let err = env
        .coord
        .pin_mcp_for_dispatch("w2", &task.to_string(), 1, &a)
        .await
        .expect_err("not leased to w2");
    assert!(
        matches!(err, CoordinatorError::FailedPrecondition(_)),
        "{err}"
    );
    let pinned = env
        .coord
        .pin_mcp_for_dispatch("w1", &task.to_string(), 1, &a)
        .await
        .expect("pin");
    assert_eq!(pinned, a);
    env.coord
        .dispatch("w1", &task.to_string(), 1)
        .await
        .expect("dispatch");
    env.coord
        .complete(
            "w1",
            &task.to_string(),
            1,
            r#"[{"type":"text","text":"Echo: hi"}]"#,
        )
        .await
        .expect("complete");

    // A non-MCP call sends no hash; one that does is told so.
    let (_, http_task) = env.tool_call("acme", "k2", "lookup", "w1").await;
    let err = env
        .coord
        .pin_mcp_for_dispatch("w1", &http_task.to_string(), 1, &a)
        .await
        .expect_err("not mcp");
    assert!(
        matches!(&err, CoordinatorError::InvalidArgument(m) if m.contains("not a call of a `type: mcp` tool")),
        "{err}"
    );

    // The server now lists another definition: the pin stays, and the
    // dispatch answers with it (the worker's client then refuses the call).
    env.coord
        .report_mcp_tools(
            "w1",
            "everything",
            "2025-11-25",
            vec![report("echo", &b, "v2")],
        )
        .await
        .expect("report");
    let (_, task) = env.tool_call("acme", "k3", "echo", "w1").await;
    let pinned = env
        .coord
        .pin_mcp_for_dispatch("w1", &task.to_string(), 1, &b)
        .await
        .expect("pin");
    assert_eq!(
        pinned, a,
        "a changed definition is not pinned by a dispatch"
    );

    let (status, body) = env
        .get(OPS, "/admin/v1/tenants/acme/mcp-tools?status=changed")
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let items = body["items"].as_array().expect("items");
    assert_eq!(items.len(), 1, "{body}");
    assert_eq!(items[0]["tool"], "echo");
    assert_eq!(items[0]["pinned"]["definition_hash"], a.as_str());
    assert_eq!(items[0]["pinned"]["accepted_by"], "first use (worker w1)");
    assert_eq!(items[0]["listed"]["definition_hash"], b.as_str());
    assert_eq!(items[0]["listed"]["definition"]["description"], "v2");
    let (status, detail) = env
        .get(OPS, "/admin/v1/tenants/acme/mcp-tools/everything/echo")
        .await;
    assert_eq!(status, StatusCode::OK, "{detail}");
    assert_eq!(detail["status"], "changed");
    assert_eq!(detail["history"].as_array().map(Vec::len), Some(2));

    // Tenant `other` never called it: nothing is pinned for it, and its
    // token cannot see or accept acme's tools.
    let (_, body) = env
        .get(OTHER_BOT, "/admin/v1/tenants/other/mcp-tools")
        .await;
    assert_eq!(body["items"][0]["status"], "unpinned", "{body}");
    let accept = "/admin/v1/tenants/acme/mcp-tools/everything/echo/accept";
    let (status, _) = env
        .post(
            OTHER_BOT,
            accept,
            json!({"definition_hash": b, "reason": "r"}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    // Only a reported definition can be accepted; a reason is required.
    let (status, body) = env
        .post(
            OPS,
            accept,
            json!({"definition_hash": hash('d'), "reason": "looks fine"}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap_or("").contains(&b),
        "names the reported hashes: {body}"
    );
    let (status, body) = env
        .post(OPS, accept, json!({"definition_hash": b, "reason": " "}))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = env
        .post(
            OPS,
            accept,
            json!({"definition_hash": "sha256:nope", "reason": "x"}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");

    let (status, body) = env
        .post(
            OPS,
            accept,
            json!({"definition_hash": b, "reason": "reviewed the new schema", "operator": "alice"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "pinned");
    assert_eq!(body["pinned"]["definition_hash"], b.as_str());
    assert_eq!(body["pinned"]["previous_hash"], a.as_str());
    assert_eq!(body["pinned"]["accepted_by"], "ops/alice");
    assert_eq!(body["pinned"]["reason"], "reviewed the new schema");
    // The next dispatch gets the accepted definition.
    let (_, task) = env.tool_call("acme", "k4", "echo", "w1").await;
    assert_eq!(
        env.coord
            .pin_mcp_for_dispatch("w1", &task.to_string(), 1, &b)
            .await
            .expect("pin"),
        b
    );
    // `other` pins on its own first use.
    let (_, task) = env.tool_call("other", "k1", "echo", "w1").await;
    assert_eq!(
        env.coord
            .pin_mcp_for_dispatch("w1", &task.to_string(), 1, &b)
            .await
            .expect("pin"),
        b
    );
    let (status, body) = env
        .get(OPS, "/admin/v1/tenants/acme/mcp-tools/everything/nope")
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = env
        .get(OPS, "/admin/v1/tenants/acme/mcp-tools?status=sideways")
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    env.finish().await;
}

async fn a_refused_definition_cannot_be_accepted(backend: Backend) {
    let env = Env::new(backend).await;
    let refused = McpToolReport {
        refusal: "input schema must have \"type\": \"object\", found \"type\": \"string\"".into(),
        ..report("weird", &hash('e'), "d")
    };
    env.coord
        .report_mcp_tools("w1", "everything", "2025-11-25", vec![refused])
        .await
        .expect("report");
    let (status, body) = env
        .post(
            OPS,
            "/admin/v1/tenants/acme/mcp-tools/everything/weird/accept",
            json!({"definition_hash": hash('e'), "reason": "r"}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("cannot be called"),
        "{body}"
    );
    let (_, body) = env.get(OPS, "/admin/v1/tenants/acme/mcp-tools").await;
    assert!(
        body["items"][0]["listed"]["refusal"]
            .as_str()
            .unwrap_or("")
            .contains("type")
    );
    env.finish().await;
}

async fn accepting_the_pinned_definition_again_changes_nothing(backend: Backend) {
    let env = Env::new(backend).await;
    let (a, b) = (hash('a'), hash('b'));
    for (h, d) in [(&a, "v1"), (&b, "v2")] {
        env.coord
            .report_mcp_tools("w1", "everything", "2025-11-25", vec![report("echo", h, d)])
            .await
            .expect("report");
    }
    let accept = "/admin/v1/tenants/acme/mcp-tools/everything/echo/accept";
    let (status, first) = env
        .post(
            OPS,
            accept,
            json!({"definition_hash": a, "reason": "first", "operator": "alice"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let (status, second) = env
        .post(
            OPS,
            accept,
            json!({"definition_hash": b, "reason": "reviewed v2", "operator": "alice"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(second["pinned"]["previous_hash"], a.as_str());
    // The same hash again (a retried request, another operator): a no-op
    // answered with the pin unchanged.
    let (status, again) = env
        .post(
            OPS,
            accept,
            json!({"definition_hash": b, "reason": "again", "operator": "bob"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["pinned"], second["pinned"], "{again}");
    assert_eq!(again["pinned"]["previous_hash"], a.as_str());
    assert_eq!(again["pinned"]["accepted_by"], "ops/alice");
    assert_eq!(again["pinned"]["reason"], "reviewed v2");
    let (_, detail) = env
        .get(OPS, "/admin/v1/tenants/acme/mcp-tools/everything/echo")
        .await;
    assert_eq!(detail["pinned"], second["pinned"], "{detail}");
    env.finish().await;
}

/// A `type: mcp` tool without `repeat_safety:` takes, for each run, what
/// the newest report of the server's listing suggests: `never` before any
/// report or when the suggestion is `never`, `idempotent` once a worker
/// (trusting the server, whose tool says `readOnlyHint`) suggests it.
async fn an_mcp_tool_without_repeat_safety_takes_the_servers_hint(backend: Backend) {
    let env = Env::new(backend).await;
    let planned = |key: &'static str| {
        let coord = Arc::clone(&env.coord);
        async move {
            let (run, _) = coord
                .start_run(StartRun {
                    tenant: "acme".into(),
                    workflow: "w".into(),
                    input_json: "{}".into(),
                    idempotency_key: key.into(),
                    caller: "c".into(),
                    caller_grants: vec!["mcp.use".into()],
                })
                .await
                .expect("start");
            let events = coord
                .list_events("acme", &run.run_id.to_string(), 0, 10)
                .await
                .expect("events");
            let started = events
                .iter()
                .find(|e| e.kind == "run_started")
                .expect("run_started");
            let tools = &started.payload["plan"]["tools"];
            (
                tools["add"]["def"]["repeat_safety"].clone(),
                tools["echo"]["def"]["repeat_safety"].clone(),
            )
        }
    };
    assert_eq!(planned("h1").await, (json!("never"), json!("idempotent")));
    let mut hinted = report("get-sum", &hash('c'), "sum");
    env.coord
        .report_mcp_tools("w1", "everything", "2025-11-25", vec![hinted.clone()])
        .await
        .expect("report");
    assert_eq!(planned("h2").await.0, json!("never"), "suggested `never`");
    hinted.definition_hash = hash('d');
    hinted.suggested_repeat_safety = "idempotent".into();
    env.coord
        .report_mcp_tools("w1", "everything", "2025-11-25", vec![hinted])
        .await
        .expect("report");
    assert_eq!(planned("h3").await.0, json!("idempotent"));
    // A declared repeat safety is never overridden by a hint.
    env.coord
        .report_mcp_tools(
            "w1",
            "everything",
            "2025-11-25",
            vec![McpToolReport {
                suggested_repeat_safety: "never".into(),
                ..report("echo", &hash('e'), "echo")
            }],
        )
        .await
        .expect("report");
    assert_eq!(planned("h4").await.1, json!("idempotent"));
    env.finish().await;
}

/// The permission is checked again right before the tool acts, against
/// the tenant's grants as they are then: a grant withdrawn after the model
/// proposed the call refuses the dispatch, and the call fails (not retried).
async fn a_grant_withdrawn_after_the_proposal_refuses_the_dispatch(backend: Backend) {
    let env = Env::new(backend).await;
    let (run, task) = env.tool_call("acme", "revoked-1", "lookup", "w1").await;
    env.coord
        .store()
        .set_tenant_grants("acme", &[])
        .await
        .expect("grants");
    let refused = env.coord.dispatch("w1", &task.to_string(), 1).await;
    let message = match refused {
        Err(CoordinatorError::FailedPrecondition(m)) => m,
        other => panic!("{other:?}"),
    };
    assert!(
        message.contains("permission `mcp.use` is no longer granted to the tenant"),
        "{message}"
    );
    let events = env
        .coord
        .list_events("acme", &run.to_string(), 0, 100)
        .await
        .expect("events");
    assert!(
        events.iter().any(|e| e.kind == "tool_call_failed"
            && e.payload["error"]
                .as_str()
                .unwrap_or("")
                .contains("no longer granted")),
        "the call fails, in the history"
    );
    assert!(!events.iter().any(|e| e.kind == "tool_call_dispatched"));
    env.finish().await;
}

/// The three kinds of MCP failure (the tool's `isError`, a JSON-RPC error,
/// the transport) stay apart in the events and the audit, and each
/// attempt's event says which definition it was checked against. A
/// JSON-RPC error the worker reports as `may_have_acted` is retried by an
/// `idempotent` tool's repeat safety (issue 22).
async fn mcp_failure_kinds_and_the_checked_definition_are_in_the_events_and_the_audit(
    backend: Backend,
) {
    use belay_engine::coordinator::McpReport;
    use belay_engine::machine::{FailureClass, ToolFailureKind};
    let env = Env::new(backend).await;
    let a = hash('a');
    env.coord
        .report_mcp_tools(
            "w1",
            "everything",
            "2025-11-25",
            vec![report("echo", &a, "v1")],
        )
        .await
        .expect("report");
    let dispatched = |task: Uuid| {
        let coord = env.coord.clone();
        let a = a.clone();
        async move {
            let pinned = coord
                .pin_mcp_for_dispatch("w1", &task.to_string(), 1, &a)
                .await
                .expect("pin");
            coord
                .dispatch("w1", &task.to_string(), 1)
                .await
                .expect("dispatch");
            pinned
        }
    };
    let reported = |kind| McpReport {
        definition_hash: Some(a.clone()),
        kind: Some(kind),
    };
    let events = |run: Uuid| {
        let coord = env.coord.clone();
        async move {
            coord
                .list_events("acme", &run.to_string(), 0, 100)
                .await
                .expect("events")
        }
    };

    // A JSON-RPC error (-32603) of an idempotent tool: retried.
    let (run, task) = env.tool_call("acme", "kinds-1", "echo", "w1").await;
    assert_eq!(dispatched(task).await, a);
    env.coord
        .fail_sampled(
            "w1",
            &task.to_string(),
            1,
            "MCP tool `echo` of server `everything` answered with a JSON-RPC error -32603",
            FailureClass::MayHaveActed,
            None,
            None,
            reported(ToolFailureKind::ProtocolError),
        )
        .await
        .expect("fail");
    let history = events(run).await;
    let kinds: Vec<&str> = history.iter().map(|e| e.kind.as_str()).collect();
    let checked = kinds
        .iter()
        .position(|k| *k == "mcp_definition_checked")
        .expect("mcp_definition_checked");
    assert_eq!(
        kinds.get(checked + 1),
        Some(&"tool_call_attempt_failed"),
        "{kinds:?}"
    );
    assert_eq!(history[checked].payload["definition_hash"], a);
    assert_eq!(history[checked].payload["attempt"], 1);
    let failed = &history[checked + 1].payload;
    assert_eq!(failed["kind"], "protocol_error", "{failed}");
    assert_eq!(failed["will_retry"], true, "{failed}");
    assert!(!kinds.contains(&"tool_call_failed"), "{kinds:?}");

    // The tool's own error (`isError`): a definite answer, the call fails.
    let (run, task) = env.tool_call("acme", "kinds-2", "echo", "w1").await;
    dispatched(task).await;
    env.coord
        .fail_sampled(
            "w1",
            &task.to_string(),
            1,
            "MCP tool `echo` of server `everything` reported an error: no",
            FailureClass::Rejected,
            None,
            None,
            reported(ToolFailureKind::ToolError),
        )
        .await
        .expect("fail");
    let history = events(run).await;
    let failed = history
        .iter()
        .find(|e| e.kind == "tool_call_failed")
        .expect("tool_call_failed");
    assert_eq!(failed.payload["kind"], "tool_error", "{}", failed.payload);
    let (status, body) = env
        .get(
            OPS,
            &format!("/admin/v1/tenants/acme/tool-calls?run_id={run}"),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["items"][0]["outcome"], "failed", "{body}");
    assert_eq!(body["items"][0]["error_kind"], "tool_error", "{body}");

    // A result: its attempt's definition is recorded before it.
    let (run, task) = env.tool_call("acme", "kinds-3", "echo", "w1").await;
    dispatched(task).await;
    env.coord
        .complete_sampled(
            "w1",
            &task.to_string(),
            1,
            r#"[{"type":"text","text":"Echo: hi"}]"#,
            Vec::new(),
            None,
            McpReport {
                definition_hash: Some(a.clone()),
                kind: None,
            },
            None,
        )
        .await
        .expect("complete");
    let history = events(run).await;
    let kinds: Vec<&str> = history.iter().map(|e| e.kind.as_str()).collect();
    let checked = kinds
        .iter()
        .position(|k| *k == "mcp_definition_checked")
        .expect("mcp_definition_checked");
    assert_eq!(
        kinds.get(checked + 1),
        Some(&"tool_call_completed"),
        "{kinds:?}"
    );
    let (_, body) = env
        .get(
            OPS,
            &format!("/admin/v1/tenants/acme/tool-calls?run_id={run}"),
        )
        .await;
    assert_eq!(body["items"][0]["outcome"], "completed", "{body}");
    assert!(body["items"][0].get("error_kind").is_none(), "{body}");
    env.finish().await;
}

on_both_backends!(
    mcp_failure_kinds_and_the_checked_definition_are_in_the_events_and_the_audit,
    reports_record_each_definition_once_and_refuse_bad_listings,
    the_first_dispatch_pins_and_a_changed_definition_waits_for_an_operator,
    a_refused_definition_cannot_be_accepted,
    accepting_the_pinned_definition_again_changes_nothing,
    an_mcp_tool_without_repeat_safety_takes_the_servers_hint,
    a_grant_withdrawn_after_the_proposal_refuses_the_dispatch,
);
