//! The audit of tool calls (admin `GET /admin/v1/tenants/{tenant}/tool-calls`)
//! on both backends (`postgres::<name>`, `sqlite::<name>`), without
//! processes: the model's turns and the workers' reports are made with the
//! `Coordinator` (claim, dispatch, complete, fail, as the gRPC handlers
//! do), and the admin router is served in-process.

mod common;
use common::{Backend, TestDb, claim_of, decision, percent};

use std::sync::Arc;

use belay_engine::coordinator::{Coordinator, StartRun};
use belay_engine::machine::{FailureClass, Resolution};
use belay_proto::wire::{ModelCallResult, ToolUse, Usage};
use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

const TOOLS: &str = r#"TOOLS:
  lookup(q: string) -> {found: boolean}
    description: "Look an account up"
    type: http
    endpoint: "/lookup"
    permission: crm.read
    repeat_safety: idempotent

  create(email: string) -> {id: string}
    description: "Create an account"
    type: http
    endpoint: "/create"
    permission: crm.write
    repeat_safety: reconcile

  pay(amount: number) -> {payment_id: string}
    description: "Pay"
    type: http
    endpoint: "/pay"
    permission: crm.write
    repeat_safety: idempotent
    confirmation:
      require: always
"#;
const AGENT: &str = "kind: agent\nname: a\nmodel: m\ninstructions: i\ntools: [lookup, create, pay]\ngrants: [crm.read, crm.write]\n---\nkind: workflow\nname: w\nnodes:\n  - id: n\n    type: agent\n    agent: a\n";

const OPS: &str = "ops-token-0123456789";
const OTHER_BOT: &str = "other-token-0123456789";
const TOKENS: &str = "ops:ops-token-0123456789,other-bot:other-token-0123456789:other";
const GRANTS: [&str; 2] = ["crm.read", "crm.write"];

struct Env {
    db: TestDb,
    coord: Arc<Coordinator>,
    base: String,
    http: reqwest::Client,
}

impl Env {
    async fn new(backend: Backend) -> Env {
        let db = TestDb::create(backend, "belay_tc").await;
        let coord =
            common::coordinator(db.store(8).await, &["acme", "other"], TOOLS, AGENT, &GRANTS).await;
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

    async fn start(&self, tenant: &str, key: &str, caller: &str) -> Uuid {
        let (run, created) = self
            .coord
            .start_run(StartRun {
                tenant: tenant.into(),
                workflow: "w".into(),
                input_json: "{}".into(),
                idempotency_key: key.into(),
                caller: caller.into(),
                caller_grants: GRANTS.iter().map(|g| (*g).to_owned()).collect(),
            })
            .await
            .expect("start");
        assert!(created);
        run.run_id
    }

    /// The model's next turn in `run`: it proposes `calls` (id, tool,
    /// arguments as the model wrote them), or answers when there are none.
    async fn turn(&self, run: Uuid, calls: &[(&str, &str, &str)]) {
        let model = claim_of(&self.coord, "w1", run, "model_call").await;
        let result = ModelCallResult {
            content: calls.is_empty().then(|| "done".to_owned()),
            tool_calls: calls
                .iter()
                .map(|(id, name, arguments)| ToolUse {
                    id: (*id).into(),
                    name: (*name).into(),
                    arguments: (*arguments).into(),
                })
                .collect(),
            usage: Usage::default(),
            finish_reason: None,
        };
        self.coord
            .complete(
                "w1",
                &model.task_id.to_string(),
                1,
                &serde_json::to_string(&result).expect("json"),
            )
            .await
            .expect("complete model call");
    }

    /// Claim and dispatch `run`'s tool call; returns its task id.
    async fn dispatched(&self, run: Uuid) -> String {
        let task = claim_of(&self.coord, "w1", run, "tool_call")
            .await
            .task_id
            .to_string();
        self.coord.dispatch("w1", &task, 1).await.expect("dispatch");
        task
    }

    async fn get(&self, token: &str, tenant: &str, query: &[(&str, &str)]) -> (StatusCode, Value) {
        let query: Vec<String> = query
            .iter()
            .map(|(k, v)| format!("{k}={}", percent(v)))
            .collect();
        let resp = self
            .http
            .get(format!(
                "{}/admin/v1/tenants/{tenant}/tool-calls?{}",
                self.base,
                query.join("&")
            ))
            .bearer_auth(token)
            .send()
            .await
            .expect("request");
        let status = resp.status();
        (status, resp.json().await.expect("json"))
    }

    /// The items of one page that must be served.
    async fn items(&self, tenant: &str, query: &[(&str, &str)]) -> Vec<Value> {
        let (status, body) = self.get(OPS, tenant, query).await;
        assert_eq!(status, StatusCode::OK, "{query:?}: {body}");
        body["items"].as_array().expect("items").clone()
    }
}

/// The record of `run`'s call of `tool` with `decision`, the `nth` newest.
fn find<'a>(items: &'a [Value], run: Uuid, tool: &str, decision: &str, nth: usize) -> &'a Value {
    items
        .iter()
        .filter(|i| {
            i["run_id"] == run.to_string() && i["tool"] == tool && i["decision"] == decision
        })
        .nth(nth)
        .unwrap_or_else(|| panic!("no {decision} call of {tool} in run {run}: {items:?}"))
}

/// `(proposed_at, run_id, seq)` of each item, which must be newest first.
fn assert_newest_first(items: &[Value]) {
    let keys: Vec<(String, String, i64)> = items
        .iter()
        .map(|i| {
            let at = chrono::DateTime::parse_from_rfc3339(i["proposed_at"].as_str().expect("at"))
                .expect("time")
                .to_rfc3339_opts(chrono::SecondsFormat::Nanos, true);
            (
                at,
                i["run_id"].as_str().expect("run").to_owned(),
                i["seq"].as_i64().expect("seq"),
            )
        })
        .collect();
    let mut sorted = keys.clone();
    sorted.sort_by(|a, b| b.cmp(a));
    sorted.dedup();
    assert_eq!(keys, sorted, "newest first, each once");
}

async fn the_audit_shows_every_proposed_call_of_a_tenant(backend: Backend) {
    let env = Env::new(backend).await;

    // Run A: one turn proposes a call that passes, a tool not on the list,
    // and arguments that do not decode (twice: not the input type, not JSON).
    let a = env.start("acme", "a", "alice").await;
    env.turn(
        a,
        &[
            ("tu1", "lookup", r#"{"q":"x"}"#),
            ("tu2", "nope", r#"{"a":1}"#),
            ("tu3", "lookup", r#"{"q":5}"#),
            ("tu4", "lookup", "{not json"),
        ],
    )
    .await;
    let task = env.dispatched(a).await;
    env.coord
        .complete("w1", &task, 1, r#"{"found":true}"#)
        .await
        .expect("complete");
    // The next turn's call fails for good.
    env.turn(a, &[("tu5", "create", r#"{"email":"e@example.com"}"#)])
        .await;
    let task = env.dispatched(a).await;
    env.coord
        .fail(
            "w1",
            &task,
            1,
            "422: invalid email",
            FailureClass::Rejected,
            Some(422),
        )
        .await
        .expect("fail");
    // A call that needs a confirmation is open until a person decides.
    env.turn(a, &[("tu6", "pay", r#"{"amount":5}"#)]).await;
    let items = env
        .items("acme", &[("tool", "pay"), ("run_id", &a.to_string())])
        .await;
    assert_eq!(items.len(), 1, "{items:?}");
    assert_eq!(
        (&items[0]["outcome"], &items[0]["confirmation"]),
        (&json!("open"), &Value::Null)
    );
    env.coord
        .decide_approval(
            "acme",
            &a.to_string(),
            decision(
                "n.t3",
                true,
                r#"{"amount":7}"#,
                "bob",
                &["crm.write".to_owned()],
                "fine",
            ),
        )
        .await
        .map(|(run, _)| run)
        .expect("approve");
    let task = claim_of(&env.coord, "w1", a, "tool_call")
        .await
        .task_id
        .to_string();
    env.coord.dispatch("w1", &task, 1).await.expect("dispatch");
    env.coord
        .complete("w1", &task, 1, r#"{"payment_id":"p-1"}"#)
        .await
        .expect("complete");
    env.turn(a, &[]).await;
    assert_eq!(
        env.coord
            .get_run("acme", &a.to_string())
            .await
            .expect("run")
            .status,
        "completed"
    );

    // Run B: a call whose outcome becomes uncertain (its lease is lost
    // after dispatch), then is resolved.
    let b = env.start("acme", "b", "carol").await;
    env.turn(b, &[("tu1", "create", r#"{"email":"b@example.com"}"#)])
        .await;
    let task = env.dispatched(b).await;
    env.coord
        .store()
        .expire_task_timers(Some(Uuid::parse_str(&task).expect("uuid")))
        .await
        .expect("expire");
    assert_eq!(env.coord.sweep_expired_leases().await.expect("sweep"), 1);
    let items = env.items("acme", &[("run_id", &b.to_string())]).await;
    assert_eq!(
        (items.len(), &items[0]["outcome"], &items[0]["ended_at"]),
        (1, &json!("uncertain"), &Value::Null)
    );

    // Run C, of another tenant.
    let c = env.start("other", "c", "dave").await;
    env.turn(c, &[("tu1", "lookup", r#"{"q":"secret"}"#)]).await;

    let uncertain = env
        .coord
        .store()
        .uncertain_for_run(b)
        .await
        .expect("uncertain")
        .remove(0);
    env.coord
        .resolve_uncertain(
            "acme",
            &uncertain.uncertain_id.to_string(),
            Resolution::Succeeded {
                result: json!({"id": "acct-9"}),
            },
            "ops",
            "exists in the CRM",
        )
        .await
        .expect("resolve");

    let all = env.items("acme", &[]).await;
    assert_eq!(all.len(), 7, "{all:#?}");
    assert_newest_first(&all);
    assert_eq!(
        all[0]["run_id"],
        b.to_string(),
        "run B's call is the newest"
    );
    assert!(
        all.iter().all(|i| i["tenant"] == "acme"),
        "only acme's calls"
    );

    let done = find(&all, a, "lookup", "scheduled", 0);
    assert_eq!(done["call_id"], "n.t1");
    assert_eq!(done["tool_version"], 1);
    assert_eq!(done["node"], "n");
    assert_eq!(done["arguments"], json!({"q": "x"}));
    assert_eq!(done["caller"], "alice");
    assert_eq!(done["tenant"], "acme");
    assert_eq!(done["refusal"], Value::Null);
    assert_eq!(done["confirmation"], Value::Null);
    assert_eq!(done["outcome"], "completed");
    assert_eq!(done["result"], json!({"found": true}));
    assert_eq!(done["error"], Value::Null);
    assert!(done["ended_at"].as_str().expect("ended") >= done["proposed_at"].as_str().expect("at"));

    let not_listed = find(&all, a, "nope", "refused", 0);
    assert_eq!(not_listed["call_id"], Value::Null);
    assert_eq!(not_listed["tool_version"], Value::Null);
    assert_eq!(not_listed["refusal"]["check"], "not_on_list");
    assert!(
        not_listed["refusal"]["reason"]
            .as_str()
            .expect("reason")
            .contains("tool `nope` is not available here"),
        "{not_listed}"
    );
    assert_eq!(
        not_listed["arguments"],
        json!({"a": 1}),
        "as the model wrote them"
    );
    assert_eq!(not_listed["outcome"], "failed");
    assert_eq!(not_listed["error"], not_listed["refusal"]["reason"]);
    assert_eq!(not_listed["ended_at"], not_listed["proposed_at"]);
    // Newest first: within a turn, the later proposal comes first.
    let not_json = find(&all, a, "lookup", "refused", 0);
    assert_eq!(not_json["refusal"]["check"], "invalid_arguments");
    assert_eq!(
        not_json["arguments"], "{not json",
        "the text, as it is not JSON"
    );
    let mistyped = find(&all, a, "lookup", "refused", 1);
    assert_eq!(mistyped["refusal"]["check"], "invalid_arguments");
    assert_eq!(mistyped["arguments"], json!({"q": 5}));
    assert_eq!(mistyped["caller"], "alice");

    let failed = find(&all, a, "create", "scheduled", 0);
    assert_eq!(failed["call_id"], "n.t2");
    assert_eq!(failed["outcome"], "failed");
    assert!(
        failed["error"]
            .as_str()
            .expect("error")
            .contains("422: invalid email"),
        "{failed}"
    );
    assert_eq!(failed["result"], Value::Null);
    assert!(failed["ended_at"].is_string());

    let paid = find(&all, a, "pay", "scheduled", 0);
    assert_eq!(paid["arguments"], json!({"amount": 7}), "the approved edit");
    assert_eq!(
        paid["confirmation"],
        json!({"approved": true, "by": "bob", "edited": true})
    );
    assert_eq!(
        (&paid["outcome"], &paid["result"]),
        (&json!("completed"), &json!({"payment_id": "p-1"}))
    );

    let resolved = find(&all, b, "create", "scheduled", 0);
    assert_eq!(resolved["caller"], "carol");
    assert_eq!(
        (&resolved["outcome"], &resolved["result"]),
        (&json!("completed"), &json!({"id": "acct-9"}))
    );
    assert!(resolved["ended_at"].is_string());

    // Filters: per tool, per run, per decision, together.
    let count = |items: Vec<Value>| items.len();
    assert_eq!(count(env.items("acme", &[("tool", "lookup")]).await), 3);
    assert_eq!(count(env.items("acme", &[("tool", "create")]).await), 2);
    assert_eq!(count(env.items("acme", &[("tool", "nothing")]).await), 0);
    assert_eq!(
        count(env.items("acme", &[("run_id", &a.to_string())]).await),
        6
    );
    assert_eq!(
        count(env.items("acme", &[("decision", "refused")]).await),
        3
    );
    assert_eq!(
        count(env.items("acme", &[("decision", "scheduled")]).await),
        4
    );
    let one = env
        .items(
            "acme",
            &[
                ("tool", "create"),
                ("decision", "scheduled"),
                ("run_id", &b.to_string()),
            ],
        )
        .await;
    assert_eq!(one, vec![resolved.clone()]);

    // Pages of 2, then 3: the same calls in the same order, each once.
    for limit in ["2", "3"] {
        let mut paged = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut query = vec![("limit", limit)];
            if let Some(t) = &token {
                query.push(("page_token", t.as_str()));
            }
            let (status, body) = env.get(OPS, "acme", &query).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            let items = body["items"].as_array().expect("items");
            assert!(items.len() <= limit.parse().expect("limit"));
            paged.extend(items.iter().cloned());
            match body["next_page_token"].as_str() {
                Some(t) => token = Some(t.to_owned()),
                None => break,
            }
        }
        assert_eq!(paged, all, "limit {limit}");
    }
    let (_, last) = env.get(OPS, "acme", &[("limit", "7")]).await;
    assert_eq!(last["next_page_token"], Value::Null, "no empty last page");

    // Another tenant sees only its own calls, and none of acme's even when
    // it names acme's run; a tenant's token cannot read acme's.
    let theirs = env.items("other", &[]).await;
    assert_eq!(theirs.len(), 1, "{theirs:?}");
    assert_eq!(
        (
            &theirs[0]["run_id"],
            &theirs[0]["tenant"],
            &theirs[0]["caller"]
        ),
        (&json!(c.to_string()), &json!("other"), &json!("dave"))
    );
    assert_eq!(theirs[0]["outcome"], "open");
    assert!(
        env.items("other", &[("run_id", &a.to_string())])
            .await
            .is_empty()
    );
    assert!(
        env.items("acme", &[("run_id", &c.to_string())])
            .await
            .is_empty()
    );
    assert!(env.items("nobody", &[]).await.is_empty());
    let (status, body) = env.get(OTHER_BOT, "acme", &[]).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, body) = env.get(OTHER_BOT, "other", &[]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    env.finish().await;
}

async fn bad_query_parameters_get_400_naming_them(backend: Backend) {
    let env = Env::new(backend).await;
    for (query, needle) in [
        (
            ("decision", "maybe"),
            "`decision` \"maybe\" is not `scheduled` or `refused`",
        ),
        (("run_id", "not-a-uuid"), "`run_id` is not a UUID"),
        (("page_token", "garbage"), "`page_token`"),
        (("page_token", "2026-12-01T00:00:00Z|x|1"), "`page_token`"),
        (("limit", "0"), "`limit` 0 is not from 1 to 500"),
        (("limit", "501"), "`limit` 501 is not from 1 to 500"),
        (("limit", "abc"), "limit"),
        (("limit", "-1"), "limit"),
        (("colour", "blue"), "unknown field `colour`"),
    ] {
        let (status, body) = env.get(OPS, "acme", &[query]).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query:?}: {body}");
        assert_eq!(body["error"]["code"], "invalid_argument", "{query:?}");
        let message = body["error"]["message"].as_str().expect("message");
        assert!(message.contains(needle), "{query:?}: {message}");
    }
    let (status, body) = env.get("wrong", "acme", &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let (status, body) = env.get(OPS, "acme", &[("limit", "500")]).await;
    assert_eq!(
        (status, &body["items"], &body["next_page_token"]),
        (StatusCode::OK, &json!([]), &Value::Null)
    );
    env.finish().await;
}

on_both_backends!(
    the_audit_shows_every_proposed_call_of_a_tenant,
    bad_query_parameters_get_400_naming_them,
);
