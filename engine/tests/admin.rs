//! The admin HTTP endpoint and webhook notifications on both backends
//! (PostgreSQL and SQLite; every test runs once per backend, as
//! `postgres::<name>` and `sqlite::<name>`): the router is served in-process
//! on 127.0.0.1:0 and called with reqwest. Uncertain outcomes are made
//! without processes: a tool call is claimed and dispatched, then its lease
//! is expired with `Store::expire_task_timers` and the sweeper judges it.
//! Nothing sleeps to wait for something awaitable.

mod common;
use common::{Backend, Raw, TestDb, percent};

use std::sync::{Arc, Mutex};

use axum::http::{HeaderMap, StatusCode};
use belay_engine::admin::{self, ROUTES};
use belay_engine::coordinator::{Coordinator, StartRun};
use belay_engine::notify::{Notifier, verify_signature};
use belay_proto::wire::{ModelCallResult, ToolUse, Usage};
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use serde_json::{Value, json};
use uuid::Uuid;

const TOOLS: &str = r#"TOOLS:
  create(email: string) -> {id: string}
    description: "create"
    type: http
    endpoint: "/create"
    permission: crm.write
    repeat_safety: reconcile

  update(id: string) -> {id: string}
    description: "update"
    type: http
    endpoint: "/update"
    permission: crm.write
    repeat_safety: reconcile
"#;
const AGENT: &str = "kind: agent\nname: a\nmodel: m\ninstructions: i\ntools: [create, update]\ngrants: [crm.write]\n---\nkind: workflow\nname: w\nnodes:\n  - id: n\n    type: agent\n    agent: a\n";

const OPS: &str = "ops-token-0123456789";
const ACME_BOT: &str = "acme-token-0123456789";
const OTHER_BOT: &str = "other-token-0123456789";
const TOKENS: &str = "ops:ops-token-0123456789,acme-bot:acme-token-0123456789:acme,other-bot:other-token-0123456789:other";

struct Env {
    db: TestDb,
    coord: Arc<Coordinator>,
    /// Direct access for test setup (aging rows) and snapshots.
    raw: Raw,
    base: String,
    http: reqwest::Client,
}

impl Env {
    async fn new(backend: Backend) -> Env {
        let db = TestDb::create(backend, "belay_a").await;
        let store = db.store(8).await;
        // After the store: it creates the SQLite file.
        let raw = db.raw().await;
        let coord =
            common::coordinator(store, &["acme", "other"], TOOLS, AGENT, &["crm.write"]).await;
        let base = common::serve_admin(&coord, TOKENS).await;
        Env {
            db,
            coord,
            raw,
            base,
            http: reqwest::Client::new(),
        }
    }

    async fn finish(self) {
        self.raw.close().await;
        self.db.drop().await;
    }

    /// Start a run of `tenant` whose model proposes `tool`, and lose the
    /// dispatched call's lease: the run pauses with one open record.
    /// Returns (run id, uncertain id).
    async fn uncertain(&self, tenant: &str, key: &str, tool: &str) -> (Uuid, Uuid) {
        let run = self.start(tenant, key).await;
        let model = self.coord.claim("w1", 1, 0).await.expect("claim").remove(0);
        assert_eq!((model.run_id, model.kind.as_str()), (run, "model_call"));
        self.coord
            .complete("w1", &model.task_id.to_string(), 1, &proposal(tool))
            .await
            .expect("complete");
        let call = self.coord.claim("w1", 1, 0).await.expect("claim").remove(0);
        assert_eq!((call.run_id, call.kind.as_str()), (run, "tool_call"));
        self.coord
            .dispatch("w1", &call.task_id.to_string(), 1)
            .await
            .expect("dispatch");
        assert_eq!(
            self.coord
                .store()
                .expire_task_timers(Some(call.task_id))
                .await
                .expect("expire"),
            1
        );
        assert_eq!(self.coord.sweep_expired_leases().await.expect("sweep"), 1);
        let rows = self
            .coord
            .store()
            .uncertain_for_run(run)
            .await
            .expect("uncertain");
        assert_eq!(rows.len(), 1);
        (run, rows[0].uncertain_id)
    }

    async fn start(&self, tenant: &str, key: &str) -> Uuid {
        let (run, created) = self
            .coord
            .start_run(StartRun {
                tenant: tenant.into(),
                workflow: "w".into(),
                input_json: "{}".into(),
                idempotency_key: key.into(),
                caller: "c".into(),
                caller_grants: vec!["crm.write".into()],
            })
            .await
            .expect("start");
        assert!(created);
        run.run_id
    }

    /// Make every notification due now (its backoff passed).
    async fn make_notifications_due(&self) {
        let sql = match self.db.backend {
            Backend::Postgres => {
                "UPDATE notifications SET next_attempt_at = now() - interval '1 second'"
            }
            Backend::Sqlite => {
                "UPDATE notifications SET next_attempt_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-1 seconds')"
            }
        };
        self.raw.execute(sql, None).await;
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn get(&self, token: Option<&str>, path: &str) -> (StatusCode, HeaderMap, Value) {
        let mut req = self.http.get(self.url(path));
        if let Some(t) = token {
            req = req.header(AUTHORIZATION, format!("Bearer {t}"));
        }
        respond(req).await
    }

    async fn post(&self, token: Option<&str>, path: &str, body: Value) -> (StatusCode, Value) {
        self.post_raw(token, path, body.to_string()).await
    }

    async fn post_raw(&self, token: Option<&str>, path: &str, body: String) -> (StatusCode, Value) {
        let mut req = self
            .http
            .post(self.url(path))
            .header(CONTENT_TYPE, "application/json")
            .body(body);
        if let Some(t) = token {
            req = req.header(AUTHORIZATION, format!("Bearer {t}"));
        }
        let (status, _, body) = respond(req).await;
        (status, body)
    }

    /// Everything an admin request could have changed, to compare before
    /// and after a refused one.
    async fn snapshot(&self) -> Value {
        json!({
            "runs": self.raw.dump("runs", "run_id").await,
            "events": self.raw.dump("events", "run_id, seq").await,
            "tasks": self.raw.dump("tasks", "task_id").await,
            "uncertain": self.raw.dump("uncertain_outcomes", "uncertain_id").await,
            "notifications": self.raw.dump("notifications", "notification_id").await,
        })
    }

    async fn event_kinds(&self, run: Uuid) -> Vec<String> {
        self.coord
            .store()
            .list_events(run, 0, 1000)
            .await
            .expect("events")
            .into_iter()
            .map(|e| e.kind)
            .collect()
    }
}

async fn respond(req: reqwest::RequestBuilder) -> (StatusCode, HeaderMap, Value) {
    let resp = req.send().await.expect("request");
    let status = StatusCode::from_u16(resp.status().as_u16()).expect("status");
    let mut headers = HeaderMap::new();
    for (k, v) in resp.headers() {
        headers.insert(
            axum::http::HeaderName::from_bytes(k.as_str().as_bytes()).expect("name"),
            axum::http::HeaderValue::from_bytes(v.as_bytes()).expect("value"),
        );
    }
    let text = resp.text().await.expect("body");
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, headers, body)
}

fn proposal(tool: &str) -> String {
    let arguments = if tool == "create" {
        r#"{"email":"e@example.com"}"#
    } else {
        r#"{"id":"acct-1"}"#
    };
    serde_json::to_string(&ModelCallResult {
        content: None,
        tool_calls: vec![ToolUse {
            id: "tu".into(),
            name: tool.into(),
            arguments: arguments.into(),
        }],
        usage: Usage::default(),
        finish_reason: None,
    })
    .expect("json")
}

fn list_path(tenant: &str) -> String {
    format!("/admin/v1/tenants/{tenant}/uncertain-outcomes")
}

fn record_path(tenant: &str, id: impl std::fmt::Display) -> String {
    format!("/admin/v1/tenants/{tenant}/uncertain-outcomes/{id}")
}

fn resolve_path(tenant: &str, id: impl std::fmt::Display) -> String {
    format!("/admin/v1/tenants/{tenant}/uncertain-outcomes/{id}/resolve")
}

fn run_path(tenant: &str, run: impl std::fmt::Display) -> String {
    format!("/admin/v1/tenants/{tenant}/runs/{run}")
}

fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("")
}

fn message(body: &Value) -> &str {
    body["error"]["message"].as_str().unwrap_or("")
}

fn ids(body: &Value) -> Vec<String> {
    body["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| i["uncertain_id"].as_str().expect("id").to_owned())
        .collect()
}

fn succeeded(reason: &str) -> Value {
    json!({"resolution": "succeeded", "result": {"id": "acct-42"}, "reason": reason, "operator": "alice"})
}

async fn missing_or_wrong_tokens_get_401_and_change_nothing(backend: Backend) {
    let env = Env::new(backend).await;
    let (_, id) = env.uncertain("acme", "k1", "create").await;
    let before = env.snapshot().await;

    let (status, headers, body) = env.get(None, &list_path("acme")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(code(&body), "unauthorized");
    assert!(message(&body).contains("missing credential"), "{body}");
    assert!(
        headers[WWW_AUTHENTICATE.as_str()]
            .to_str()
            .expect("header")
            .starts_with("Bearer"),
    );
    let (status, headers, body) = env.get(Some("nope"), &record_path("acme", id)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert!(
        headers[WWW_AUTHENTICATE.as_str()]
            .to_str()
            .expect("header")
            .contains("invalid_token")
    );
    for token in [None, Some("wrong-token"), Some(&OPS[..OPS.len() - 1])] {
        let (status, body) = env
            .post(token, &resolve_path("acme", id), succeeded("no token"))
            .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{token:?}: {body}");
    }
    // Authentication comes before the body is read: a malformed body
    // without a token is still 401.
    let (status, _) = env
        .post_raw(None, &resolve_path("acme", id), "{nope".into())
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = env
        .post(
            Some("wrong"),
            &format!("{}/pause", run_path("acme", Uuid::now_v7())),
            json!({"reason": "x"}),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // A scheme other than Bearer.
    let (status, _, _) = respond(
        env.http
            .get(env.url(&list_path("acme")))
            .header(AUTHORIZATION, format!("Basic {OPS}")),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    assert_eq!(env.snapshot().await, before, "nothing changed");
    let (status, _, body) = env.get(Some(OPS), &record_path("acme", id)).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::OK, Some("open"))
    );
    env.finish().await;
}

async fn a_token_of_another_tenant_gets_403_and_changes_nothing(backend: Backend) {
    let env = Env::new(backend).await;
    let (run, id) = env.uncertain("acme", "k1", "create").await;
    let before = env.snapshot().await;
    let (status, _, body) = env.get(Some(OTHER_BOT), &list_path("acme")).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(code(&body), "forbidden");
    assert!(
        message(&body).contains("`other-bot` may act for tenant(s) `other`, not for tenant `acme`"),
        "{body}"
    );
    let (status, body) = env
        .post(Some(OTHER_BOT), &resolve_path("acme", id), succeeded("x"))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, body) = env
        .post(
            Some(OTHER_BOT),
            &format!("{}/cancel", run_path("acme", run)),
            json!({"reason": "x"}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(env.snapshot().await, before);
    // The tenant's own token works.
    let (status, _, body) = env.get(Some(ACME_BOT), &record_path("acme", id)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    env.finish().await;
}

async fn list_filters_and_pages(backend: Backend) {
    let env = Env::new(backend).await;
    let (run1, id1) = env.uncertain("acme", "k1", "create").await;
    let (_, id2) = env.uncertain("acme", "k2", "update").await;
    let (_, id3) = env.uncertain("acme", "k3", "create").await;
    let (_, other) = env.uncertain("other", "k1", "create").await;
    let (id1, id2, id3) = (id1.to_string(), id2.to_string(), id3.to_string());

    let list = |query: String| {
        let env = &env;
        async move {
            let (status, _, body) = env
                .get(Some(ACME_BOT), &format!("{}{query}", list_path("acme")))
                .await;
            assert_eq!(status, StatusCode::OK, "{query}: {body}");
            body
        }
    };
    let all = list(String::new()).await;
    assert_eq!(
        ids(&all),
        vec![id3.clone(), id2.clone(), id1.clone()],
        "newest first"
    );
    assert!(all["next_page_token"].is_null());
    assert!(
        !ids(&all).contains(&other.to_string()),
        "another tenant's record"
    );
    assert_eq!(all["items"][0]["tenant"], "acme");

    assert_eq!(ids(&list("?tool=update".into()).await), vec![id2.clone()]);
    assert_eq!(
        ids(&list("?tool=create".into()).await),
        vec![id3.clone(), id1.clone()]
    );
    assert_eq!(
        ids(&list("?tool=nothing".into()).await),
        Vec::<String>::new()
    );
    assert_eq!(
        ids(&list(format!("?run_id={run1}")).await),
        vec![id1.clone()]
    );
    assert_eq!(ids(&list("?older_than_ms=3600000".into()).await).len(), 0);
    assert_eq!(ids(&list("?newer_than_ms=3600000".into()).await).len(), 3);
    let two_hours_ago = match env.db.backend {
        Backend::Postgres => "now() - interval '2 hours'",
        Backend::Sqlite => "strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-2 hours')",
    };
    let aged = env
        .raw
        .execute(
            &format!(
                "UPDATE uncertain_outcomes SET created_at = {two_hours_ago} WHERE uncertain_id = $1"
            ),
            Some(Uuid::parse_str(&id1).expect("uuid")),
        )
        .await;
    assert_eq!(aged, 1);
    assert_eq!(
        ids(&list("?older_than_ms=3600000".into()).await),
        vec![id1.clone()]
    );
    assert_eq!(
        ids(&list("?newer_than_ms=3600000".into()).await),
        vec![id3.clone(), id2.clone()]
    );

    let page1 = list("?page_size=2".into()).await;
    assert_eq!(ids(&page1), vec![id3.clone(), id2.clone()]);
    let token = page1["next_page_token"].as_str().expect("token").to_owned();
    let page2 = list(format!("?page_size=2&page_token={}", percent(&token))).await;
    assert_eq!(ids(&page2), vec![id1.clone()]);
    assert!(page2["next_page_token"].is_null());

    let (status, _) = env
        .post(
            Some(OPS),
            &resolve_path("acme", &id2),
            json!({"resolution": "failed", "error": "gone", "reason": "checked the CRM"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        ids(&list(String::new()).await),
        vec![id3.clone(), id1.clone()],
        "open by default"
    );
    assert_eq!(ids(&list("?status=open".into()).await).len(), 2);
    assert_eq!(
        ids(&list("?status=resolved".into()).await),
        vec![id2.clone()]
    );
    assert_eq!(ids(&list("?status=any".into()).await).len(), 3);

    for (query, needle) in [
        ("?status=closed", "unknown status `closed`"),
        ("?page_size=501", "more than 500"),
        ("?page_size=abc", "page_size"),
        ("?page_token=garbage", "page_token"),
        ("?run_id=not-a-uuid", "not a UUID"),
        ("?colour=blue", "unknown field `colour`"),
        ("?older_than_ms=-1", "older_than_ms"),
    ] {
        let (status, _, body) = env
            .get(Some(OPS), &format!("{}{query}", list_path("acme")))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert_eq!(code(&body), "invalid_argument", "{query}");
        assert!(message(&body).contains(needle), "{query}: {body}");
    }
    env.finish().await;
}

async fn show_returns_everything_an_operator_needs(backend: Backend) {
    let env = Env::new(backend).await;
    let (run, id) = env.uncertain("acme", "k1", "create").await;
    let (status, _, r) = env.get(Some(OPS), &record_path("acme", id)).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!(r["uncertain_id"], id.to_string());
    assert_eq!(r["run_id"], run.to_string());
    assert_eq!(r["tenant"], "acme");
    assert_eq!(r["tool"], "create");
    assert_eq!(r["tool_version"], 1);
    assert_eq!(r["node_id"], "n");
    assert_eq!(r["arguments"], json!({"email": "e@example.com"}));
    assert!(
        r["idempotency_key"]
            .as_str()
            .expect("key")
            .starts_with(&run.to_string())
    );
    assert_eq!(r["worker_id"], "w1");
    assert_eq!(r["status"], "open");
    assert_eq!(r["attempts"][0]["attempt"], 1);
    assert!(r["created_at"].is_string() && r["task_id"].is_string() && r["call_id"].is_string());
    assert!(r["resolved_at"].is_null() && r["resolved_by"].is_null());

    let (status, _, run_view) = env.get(Some(OPS), &run_path("acme", run)).await;
    assert_eq!(status, StatusCode::OK, "{run_view}");
    assert_eq!(run_view["status"], "paused");
    assert_eq!(run_view["open_uncertain_outcomes"], json!([id.to_string()]));
    env.finish().await;
}

async fn resolving_succeeded_resumes_the_run_and_records_who_when_why(backend: Backend) {
    let env = Env::new(backend).await;
    let (run, id) = env.uncertain("acme", "k1", "create").await;
    let (status, r) = env
        .post(
            Some(OPS),
            &resolve_path("acme", id),
            succeeded("the account exists in the CRM"),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!(r["status"], "resolved");
    assert_eq!(r["resolution_kind"], "succeeded");
    assert_eq!(r["resolution"]["result"], json!({"id": "acct-42"}));
    assert_eq!(r["resolved_by"], "ops/alice");
    assert_eq!(r["resolved_via"], "operator");
    assert_eq!(r["resolution_reason"], "the account exists in the CRM");
    assert!(r["resolved_at"].is_string(), "{r}");

    let kinds = env.event_kinds(run).await;
    let tail: Vec<&str> = kinds.iter().rev().take(3).map(String::as_str).collect();
    assert!(
        kinds.contains(&"uncertain_outcome_resolved".to_owned()),
        "{kinds:?}"
    );
    assert!(kinds.contains(&"run_resumed".to_owned()), "{kinds:?}");
    assert!(
        kinds.iter().position(|k| k == "uncertain_outcome_resolved")
            < kinds.iter().position(|k| k == "run_resumed"),
        "{tail:?}"
    );
    let (status, _, view) = env.get(Some(ACME_BOT), &run_path("acme", run)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(view["status"], "running", "{view}");
    assert_eq!(view["open_uncertain_outcomes"], json!([]));
    // The next model call is claimable: the run goes on.
    let next = env.coord.claim("w2", 1, 0).await.expect("claim");
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].kind, "model_call");

    // Without an operator, the token's name is who resolved.
    let (_, id2) = env.uncertain("acme", "k2", "create").await;
    let (status, r) = env
        .post(
            Some(ACME_BOT),
            &resolve_path("acme", id2),
            json!({"resolution": "succeeded", "result": {"id": "x"}, "reason": "seen"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!(r["resolved_by"], "acme-bot");
    env.finish().await;
}

async fn resolving_failed_hands_the_error_to_the_model(backend: Backend) {
    let env = Env::new(backend).await;
    let (run, id) = env.uncertain("acme", "k1", "create").await;
    let (status, r) = env
        .post(
            Some(OPS),
            &resolve_path("acme", id),
            json!({"resolution": "failed", "error": "the CRM refused it", "reason": "CRM log shows a 409", "operator": "bob"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!(r["resolution_kind"], "failed");
    assert_eq!(r["resolution"]["error"], "the CRM refused it");
    assert_eq!(r["resolved_by"], "ops/bob");
    let task = env
        .raw
        .fetch_texts(
            "SELECT status FROM tasks WHERE task_id = $1",
            Uuid::parse_str(r["task_id"].as_str().expect("task")).expect("uuid"),
        )
        .await;
    assert_eq!(task, ["failed"]);
    assert_eq!(
        env.coord
            .get_run("acme", &run.to_string())
            .await
            .expect("run")
            .status,
        "running"
    );
    let (status, body) = env
        .post(
            Some(OPS),
            &resolve_path("acme", id),
            json!({"resolution": "failed", "error": "  ", "reason": "r"}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "empty error: {body}");
    env.finish().await;
}

async fn task_of(env: &Env, id: Uuid) -> (String, String) {
    let row = env
        .raw
        .fetch_texts(
            "SELECT t.status, t.idempotency_key FROM tasks t
             JOIN uncertain_outcomes u ON u.task_id = t.task_id WHERE u.uncertain_id = $1",
            id,
        )
        .await;
    (row[0].clone(), row[1].clone())
}

async fn resolving_retry_readies_the_task_with_the_same_or_a_new_key(backend: Backend) {
    let env = Env::new(backend).await;
    let (_, same) = env.uncertain("acme", "k1", "create").await;
    let (_, fresh) = env.uncertain("acme", "k2", "create").await;
    let (_, key_before) = task_of(&env, same).await;
    let (status, r) = env
        .post(
            Some(OPS),
            &resolve_path("acme", same),
            json!({"resolution": "retry", "new_idempotency_key": false, "reason": "the CRM dedupes by key"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!(r["resolution_kind"], "retry");
    assert_eq!(
        task_of(&env, same).await,
        ("ready".to_owned(), key_before.clone())
    );
    assert_eq!(r["resolution"]["idempotency_key"], key_before);
    // The retried call is claimed again with the same key.
    let again = env.coord.claim("w2", 1, 0).await.expect("claim").remove(0);
    assert_eq!(
        (again.kind.as_str(), again.idempotency_key.as_str()),
        ("tool_call", key_before.as_str())
    );
    env.coord
        .fail(
            "w2",
            &again.task_id.to_string(),
            again.attempt as u32,
            "stop",
            belay_engine::machine::FailureClass::Rejected,
            Some(400),
        )
        .await
        .expect("fail");

    let (_, old_key) = task_of(&env, fresh).await;
    let (status, r) = env
        .post(
            Some(OPS),
            &resolve_path("acme", fresh),
            json!({"resolution": "retry", "new_idempotency_key": true, "reason": "the request never reached the CRM"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{r}");
    let (status, new_key) = task_of(&env, fresh).await;
    assert_eq!(status, "ready");
    assert_ne!(new_key, old_key, "a new key");
    assert_eq!(r["resolution"]["idempotency_key"], new_key);
    assert_eq!(r["resolution"]["new_idempotency_key"], true);
    env.finish().await;
}

async fn resolving_twice_is_a_conflict_and_changes_nothing(backend: Backend) {
    let env = Env::new(backend).await;
    let (_, id) = env.uncertain("acme", "k1", "create").await;
    let (status, _) = env
        .post(Some(OPS), &resolve_path("acme", id), succeeded("first"))
        .await;
    assert_eq!(status, StatusCode::OK);
    let before = env.snapshot().await;
    for body in [
        succeeded("second"),
        json!({"resolution": "retry", "reason": "again"}),
    ] {
        let (status, err) = env.post(Some(OPS), &resolve_path("acme", id), body).await;
        assert_eq!(status, StatusCode::CONFLICT, "{err}");
        assert_eq!(code(&err), "conflict");
        assert!(message(&err).contains("already resolved"), "{err}");
    }
    assert_eq!(env.snapshot().await, before);
    env.finish().await;
}

async fn a_concurrent_double_resolve_resolves_once(backend: Backend) {
    let env = Env::new(backend).await;
    let (run, id) = env.uncertain("acme", "k1", "create").await;
    let path = resolve_path("acme", id);
    let (a, b) = tokio::join!(
        env.post(Some(OPS), &path, succeeded("alice saw it")),
        env.post(
            Some(ACME_BOT),
            &path,
            json!({"resolution": "failed", "error": "no", "reason": "bob saw nothing"})
        ),
    );
    let mut statuses = [a.0, b.0];
    statuses.sort();
    assert_eq!(
        statuses,
        [StatusCode::OK, StatusCode::CONFLICT],
        "{a:?} {b:?}"
    );
    let kinds = env.event_kinds(run).await;
    assert_eq!(
        kinds
            .iter()
            .filter(|k| *k == "uncertain_outcome_resolved")
            .count(),
        1,
        "{kinds:?}"
    );
    let winner = if a.0 == StatusCode::OK { &a.1 } else { &b.1 };
    let (_, _, stored) = env.get(Some(OPS), &record_path("acme", id)).await;
    assert_eq!(stored["resolved_by"], winner["resolved_by"]);
    env.finish().await;
}

async fn a_result_not_matching_the_output_type_is_422_and_changes_nothing(backend: Backend) {
    let env = Env::new(backend).await;
    let (run, id) = env.uncertain("acme", "k1", "create").await;
    let before = env.snapshot().await;
    for result in [json!({"id": 42}), json!({}), json!("acct-1"), Value::Null] {
        let (status, body) = env
            .post(
                Some(OPS),
                &resolve_path("acme", id),
                json!({"resolution": "succeeded", "result": result, "reason": "r"}),
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{result}: {body}");
        assert_eq!(code(&body), "unprocessable");
        assert!(message(&body).contains("create"), "{body}");
        let details = body["error"]["details"].as_array().expect("details");
        assert!(!details.is_empty(), "{body}");
    }
    assert_eq!(env.snapshot().await, before);
    assert_eq!(
        env.coord
            .get_run("acme", &run.to_string())
            .await
            .expect("run")
            .status,
        "paused"
    );
    env.finish().await;
}

async fn bad_input_gets_a_precise_4xx_and_changes_nothing(backend: Backend) {
    let env = Env::new(backend).await;
    let (_, id) = env.uncertain("acme", "k1", "create").await;
    let (_, other) = env.uncertain("other", "k1", "create").await;
    let before = env.snapshot().await;
    let path = resolve_path("acme", id);

    let cases: Vec<(String, StatusCode, &str, &str)> = vec![
        ("{\"resolution\": \"succeeded\",".into(), StatusCode::BAD_REQUEST, "invalid_argument", "line 1 column"),
        ("not json".into(), StatusCode::BAD_REQUEST, "invalid_argument", "malformed JSON"),
        (json!({"resolution": "succeeded", "result": {"id": "x"}, "reason": "r", "colour": "blue"}).to_string(), StatusCode::BAD_REQUEST, "invalid_argument", "unknown field `colour`"),
        (json!({"resolution": "succeeded", "reason": "r"}).to_string(), StatusCode::BAD_REQUEST, "invalid_argument", "missing field `result`"),
        (json!({"resolution": "succeeded", "result": {"id": "x"}}).to_string(), StatusCode::BAD_REQUEST, "invalid_argument", "missing field `reason`"),
        (json!({"resolution": "succeeded", "result": {"id": "x"}, "reason": "  "}).to_string(), StatusCode::BAD_REQUEST, "invalid_argument", "`reason` must not be empty"),
        (json!({"resolution": "maybe", "reason": "r"}).to_string(), StatusCode::BAD_REQUEST, "invalid_argument", "unknown variant `maybe`"),
        (json!({"reason": "r"}).to_string(), StatusCode::BAD_REQUEST, "invalid_argument", "missing field `resolution`"),
        (json!({"resolution": "retry", "new_idempotency_key": "yes", "reason": "r"}).to_string(), StatusCode::BAD_REQUEST, "invalid_argument", "new_idempotency_key: invalid type: string \"yes\", expected a boolean at line 1 column"),
        (json!({"resolution": "failed", "error": 5, "reason": "r"}).to_string(), StatusCode::BAD_REQUEST, "invalid_argument", "error: invalid type: integer `5`, expected a string"),
        (json!({"resolution": "retry", "result": {"id": "x"}, "reason": "r"}).to_string(), StatusCode::BAD_REQUEST, "invalid_argument", "`result` is only allowed"),
        (json!({"resolution": "retry", "reason": "r", "operator": ""}).to_string(), StatusCode::BAD_REQUEST, "invalid_argument", "`operator`"),
        (json!({"resolution": "retry", "reason": "r".repeat(5000)}).to_string(), StatusCode::BAD_REQUEST, "invalid_argument", "more than 4096"),
        (json!({"resolution": "succeeded", "result": {"id": "x".repeat(70_000)}, "reason": "r"}).to_string(), StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", "larger than 65536 bytes"),
    ];
    for (body, want, want_code, needle) in cases {
        let shown: String = body.chars().take(80).collect();
        let (status, err) = env.post_raw(Some(OPS), &path, body).await;
        assert_eq!(status, want, "{shown}: {err}");
        assert_eq!(code(&err), want_code, "{shown}: {err}");
        assert!(message(&err).contains(needle), "{shown}: {err}");
    }
    // The body must be declared as JSON.
    let (status, _, err) = respond(
        env.http
            .post(env.url(&path))
            .header(AUTHORIZATION, format!("Bearer {OPS}"))
            .body(succeeded("r").to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{err}");
    assert_eq!(code(&err), "unsupported_media_type");

    // Unknown, malformed and another tenant's ids.
    let unknown = Uuid::now_v7();
    let (status, err) = env
        .post(Some(OPS), &resolve_path("acme", unknown), succeeded("r"))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{err}");
    assert_eq!(code(&err), "not_found");
    let (status, _, err) = env.get(Some(OPS), &record_path("acme", unknown)).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{err}");
    assert_eq!(
        message(&err),
        format!("uncertain outcome {unknown} of tenant `acme` not found")
    );
    let (status, _, err) = env.get(Some(OPS), &record_path("acme", "not-a-uuid")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");
    assert!(message(&err).contains("not a UUID"), "{err}");
    let (status, err) = env
        .post(Some(OPS), &resolve_path("acme", "12345"), succeeded("r"))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");
    for token in [OPS, ACME_BOT] {
        let (status, err) = env
            .post(Some(token), &resolve_path("acme", other), succeeded("r"))
            .await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{err}");
        assert_eq!(
            message(&err),
            format!("uncertain outcome {other} of tenant `acme` not found")
        );
        let (status, _, _) = env.get(Some(token), &record_path("acme", other)).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }
    assert_eq!(env.snapshot().await, before, "nothing changed");
    env.finish().await;
}

async fn operators_pause_resume_and_cancel_runs(backend: Backend) {
    let env = Env::new(backend).await;
    let (uncertain_run, _) = env.uncertain("acme", "k1", "create").await;
    let run = env.start("acme", "k2").await;
    let control = |op: &'static str, run: Uuid, body: Value| {
        let env = &env;
        async move {
            env.post(Some(OPS), &format!("{}/{op}", run_path("acme", run)), body)
                .await
        }
    };

    let (status, _, view) = env.get(Some(OPS), &run_path("acme", run)).await;
    assert_eq!(
        (status, view["status"].as_str()),
        (StatusCode::OK, Some("running")),
        "{view}"
    );
    assert_eq!(view["workflow"], "w");

    let (status, view) = control(
        "pause",
        run,
        json!({"reason": "investigating", "operator": "carol"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{view}");
    assert_eq!(view["status"], "paused");
    assert!(
        env.coord.claim("w1", 4, 0).await.expect("claim").is_empty(),
        "a paused run's tasks are not claimed"
    );
    let (status, err) = control("pause", run, json!({"reason": "again"})).await;
    assert_eq!(
        (status, code(&err)),
        (StatusCode::CONFLICT, "failed_precondition"),
        "{err}"
    );
    let kinds = env.event_kinds(run).await;
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("run_paused"),
        "{kinds:?}"
    );

    let (status, view) = control("resume", run, json!({"reason": "all clear"})).await;
    assert_eq!(status, StatusCode::OK, "{view}");
    assert_eq!(view["status"], "running");
    assert_eq!(env.coord.claim("w1", 4, 0).await.expect("claim").len(), 1);
    let (status, err) = control("resume", run, json!({"reason": "again"})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{err}");
    // A run paused on an uncertain outcome is resumed by resolving it.
    let (status, err) = control("resume", uncertain_run, json!({"reason": "go"})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{err}");

    let (status, err) = control("cancel", run, json!({"operator": "carol"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "reason is required: {err}");
    let (status, err) = control("cancel", run, json!({"reason": "x", "force": true})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");
    let (status, view) = control(
        "cancel",
        run,
        json!({"reason": "duplicate signup", "operator": "carol"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{view}");
    assert_eq!(view["status"], "cancelled");
    assert_eq!(
        view["status_reason"],
        "duplicate signup (cancelled by ops/carol)"
    );
    let (status, err) = control("cancel", run, json!({"reason": "again"})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{err}");

    let (status, err) = control("pause", Uuid::now_v7(), json!({"reason": "x"})).await;
    assert_eq!(
        (status, code(&err)),
        (StatusCode::NOT_FOUND, "not_found"),
        "{err}"
    );
    let (status, _, err) = env.get(Some(OPS), &run_path("other", run)).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "another tenant's run: {err}");
    let (status, _, err) = env.get(Some(OPS), &run_path("acme", "nope")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");
    env.finish().await;
}

async fn the_openapi_document_describes_every_route_the_router_serves(backend: Backend) {
    let env = Env::new(backend).await;
    let (status, _, doc) = env.get(None, admin::OPENAPI_PATH).await;
    assert_eq!(status, StatusCode::OK, "served without a token");
    assert_eq!(doc["openapi"], "3.1.0");
    for (method, path) in ROUTES {
        let op = &doc["paths"][*path][method.to_lowercase()];
        assert!(op.is_object(), "{method} {path} is not documented");
        // Served: a request reaches the route (not the 404/405 fallbacks).
        let concrete = path
            .replace("{tenant}", "acme")
            .replace("{id}", &Uuid::now_v7().to_string())
            .replace("{run_id}", &Uuid::now_v7().to_string());
        let req = match *method {
            "GET" => env.http.get(env.url(&concrete)),
            _ => env
                .http
                .post(env.url(&concrete))
                .json(&json!({"resolution": "retry", "reason": "r"})),
        };
        let (status, _, body) = respond(req.header(AUTHORIZATION, format!("Bearer {OPS}"))).await;
        assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
        assert!(
            !message(&body).contains("no admin route"),
            "{method} {path} is not served: {body}"
        );
    }
    for schema in [
        "Error",
        "UncertainOutcome",
        "ResolveRequest",
        "Run",
        "RunControlRequest",
    ] {
        assert!(doc["components"]["schemas"][schema].is_object(), "{schema}");
    }
    let (status, _, body) = env.get(Some(OPS), "/admin/v1/nothing").await;
    assert_eq!((status, code(&body)), (StatusCode::NOT_FOUND, "not_found"));
    let (status, _, body) = env
        .get(Some(OPS), &resolve_path("acme", Uuid::now_v7()))
        .await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed")
    );
    env.finish().await;
}

type Received = Arc<Mutex<Vec<(HeaderMap, Vec<u8>)>>>;

/// A webhook receiver that answers 500 to its first request and 200 after.
async fn receiver() -> (String, Received) {
    let received: Received = Arc::default();
    let seen = Arc::clone(&received);
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: HeaderMap, body: axum::body::Bytes| {
            let seen = Arc::clone(&seen);
            async move {
                let mut seen = seen.lock().expect("lock");
                seen.push((headers, body.to_vec()));
                if seen.len() == 1 {
                    (StatusCode::INTERNAL_SERVER_ERROR, "receiver down")
                } else {
                    (StatusCode::OK, "ok")
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/hook"), received)
}

async fn webhooks_are_retried_with_backoff_then_delivered_signed(backend: Backend) {
    let env = Env::new(backend).await;
    let (run, _) = env.uncertain("acme", "k1", "create").await;
    let notes = env
        .coord
        .store()
        .notifications_for_run(run)
        .await
        .expect("notes");
    assert_eq!(notes.len(), 1, "written with the pause");
    let note = notes[0].clone();
    assert_eq!(note.kind, "run.paused.uncertain_outcome");

    let (url, received) = receiver().await;
    let secret = "whsec-test";
    let notifier = Notifier::new(env.coord.store().clone(), &url, secret).expect("notifier");
    assert!(!format!("{notifier:?}").contains(secret));

    assert_eq!(notifier.deliver_due_once().await.expect("round 1"), 0);
    let after1 = env
        .coord
        .store()
        .notifications_for_run(run)
        .await
        .expect("notes")[0]
        .clone();
    assert_eq!(after1.attempts, 1);
    assert!(after1.delivered_at.is_none() && after1.failed_at.is_none());
    let last_error = after1.last_error.clone().unwrap_or_default();
    assert!(
        last_error.contains("500") && last_error.contains("receiver down"),
        "{last_error}"
    );
    // The database clock is this machine's clock on both backends.
    let backoff_ms = (after1.next_attempt_at - chrono::Utc::now()).num_milliseconds();
    assert!(
        (0..=1_000).contains(&backoff_ms),
        "first backoff is 1 s: {backoff_ms}"
    );
    // Not due yet: nothing is sent.
    assert_eq!(notifier.deliver_due_once().await.expect("early"), 0);
    assert_eq!(received.lock().expect("lock").len(), 1);

    env.make_notifications_due().await;
    assert_eq!(notifier.deliver_due_once().await.expect("round 2"), 1);
    let done = env
        .coord
        .store()
        .notifications_for_run(run)
        .await
        .expect("notes")[0]
        .clone();
    assert_eq!(done.attempts, 2);
    assert!(
        done.delivered_at.is_some() && done.last_error.is_none(),
        "{done:?}"
    );

    let received = received.lock().expect("lock").clone();
    assert_eq!(received.len(), 2);
    for (headers, body) in &received {
        let signature = headers["belay-signature"].to_str().expect("signature");
        let t = verify_signature(secret.as_bytes(), signature, body).expect("valid signature");
        assert!((chrono::Utc::now().timestamp() - t).abs() < 300);
        assert_eq!(verify_signature(b"wrong", signature, body), None);
        assert_eq!(
            headers["belay-delivery"],
            note.notification_id.to_string().as_str()
        );
        assert_eq!(headers["content-type"], "application/json");
        let event: Value = serde_json::from_slice(body).expect("json body");
        assert_eq!(event["id"], note.notification_id.to_string());
        assert_eq!(event["type"], "run.paused.uncertain_outcome");
        assert!(event["created_at"].is_string());
        assert_eq!(event["data"]["run_id"], run.to_string());
        assert_eq!(event["data"]["tenant"], "acme");
        assert_eq!(event["data"]["tool"], "create");
    }
    // Delivered notifications are not sent again.
    env.make_notifications_due().await;
    assert_eq!(notifier.deliver_due_once().await.expect("round 3"), 0);
    env.finish().await;
}

async fn webhook_delivery_is_abandoned_after_the_last_attempt(backend: Backend) {
    let env = Env::new(backend).await;
    let (run, _) = env.uncertain("acme", "k1", "create").await;
    // A port nobody listens on: connection refused.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/hook", closed.local_addr().expect("addr"));
    drop(closed);
    let notifier = Notifier::new(env.coord.store().clone(), &url, "s").expect("notifier");
    env.raw
        .execute(
            &format!(
                "UPDATE notifications SET attempts = {}",
                belay_engine::notify::MAX_ATTEMPTS - 1
            ),
            None,
        )
        .await;
    assert_eq!(notifier.deliver_due_once().await.expect("last round"), 0);
    let note = env
        .coord
        .store()
        .notifications_for_run(run)
        .await
        .expect("notes")[0]
        .clone();
    assert_eq!(note.attempts, belay_engine::notify::MAX_ATTEMPTS);
    assert!(
        note.failed_at.is_some() && note.delivered_at.is_none(),
        "{note:?}"
    );
    let last_error = note.last_error.unwrap_or_default();
    assert!(
        last_error.to_lowercase().contains("connect"),
        "the cause is named: {last_error}"
    );
    env.make_notifications_due().await;
    assert_eq!(
        notifier.deliver_due_once().await.expect("after"),
        0,
        "never again"
    );
    assert_eq!(
        env.coord
            .store()
            .notifications_for_run(run)
            .await
            .expect("notes")[0]
            .attempts,
        belay_engine::notify::MAX_ATTEMPTS
    );
    assert!(Notifier::new(env.coord.store().clone(), &url, "").is_err());
    assert!(Notifier::new(env.coord.store().clone(), "ftp://x", "s").is_err());
    env.finish().await;
}

on_both_backends!(
    missing_or_wrong_tokens_get_401_and_change_nothing,
    a_token_of_another_tenant_gets_403_and_changes_nothing,
    list_filters_and_pages,
    show_returns_everything_an_operator_needs,
    resolving_succeeded_resumes_the_run_and_records_who_when_why,
    resolving_failed_hands_the_error_to_the_model,
    resolving_retry_readies_the_task_with_the_same_or_a_new_key,
    resolving_twice_is_a_conflict_and_changes_nothing,
    a_concurrent_double_resolve_resolves_once,
    a_result_not_matching_the_output_type_is_422_and_changes_nothing,
    bad_input_gets_a_precise_4xx_and_changes_nothing,
    operators_pause_resume_and_cancel_runs,
    the_openapi_document_describes_every_route_the_router_serves,
    webhooks_are_retried_with_backoff_then_delivered_signed,
    webhook_delivery_is_abandoned_after_the_last_attempt,
);
