//! The operator console on both backends (`postgres::<name>`,
//! `sqlite::<name>`), served in-process with the admin router on
//! 127.0.0.1:0 and called with reqwest as a browser would (cookies by hand,
//! no redirects followed): every route refuses a caller without a session,
//! a principal of another tenant and a role the route does not admit; every
//! form without this session's CSRF token is refused with 403 and changes
//! nothing; the run list's filters, counts and pages (and a search text
//! too long refused by name); the pages an
//! operator sees, and an uncertain outcome resolved through the form; a
//! tool call's confirmation decided (with an edit) through the form, also
//! by an admin, which holds no grants but acts with the one asked; and
//! `Secure` cookies behind TLS.
//! (The real browser, with a real engine, worker and CRM, is
//! `tests/tests/console.rs`.)

mod common;
use common::{Backend, TestDb};

use std::sync::Arc;

use belay_engine::console::{self, Policy, ROUTES};
use belay_engine::coordinator::{Coordinator, StartRun};
use belay_engine::store::RunSearch;
use belay_proto::wire::{ModelCallResult, ToolUse, Usage};
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, COOKIE, LOCATION, SET_COOKIE};
use serde_json::{Value, json};
use uuid::Uuid;

const TOKENS: &str = "ops:ops-token-0123456789";
const OPS: &str = "ops-token-0123456789";

struct Env {
    db: TestDb,
    coord: Arc<Coordinator>,
    base: String,
    http: reqwest::Client,
}

/// A signed-in browser: its session cookie and CSRF token.
struct Session {
    cookie: String,
    csrf: String,
}

impl Env {
    async fn new(backend: Backend) -> Env {
        let db = TestDb::create(backend, "belay_con").await;
        let store = db.store(8).await;
        let coord = common::coordinator(
            store,
            &["acme", "other"],
            common::CREATE_TOOL,
            common::CREATE_AGENT,
            &["crm.write"],
        )
        .await;
        let base = common::serve_admin(&coord, TOKENS).await;
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("client");
        Env {
            db,
            coord,
            base,
            http,
        }
    }

    async fn finish(self) {
        self.db.drop().await;
    }

    /// An API key made through the admin endpoint.
    async fn key(&self, principal: &str, role: &str, tenant: &str, grants: &[&str]) -> String {
        let body: Value = self
            .http
            .post(format!("{}/admin/v1/keys", self.base))
            .bearer_auth(OPS)
            .json(&json!({"principal": principal, "role": role, "tenants": [tenant], "grants": grants}))
            .send()
            .await
            .expect("create key")
            .json()
            .await
            .expect("key json");
        body["key"].as_str().expect("key").to_owned()
    }

    /// Sign in with `key` through the login form.
    async fn sign_in(&self, key: &str, tenant: &str) -> Session {
        let response = login_response(self, key, tenant, "").await;
        assert_eq!(response.status(), StatusCode::SEE_OTHER, "signing in");
        let set = response
            .headers()
            .get_all(SET_COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find(|v| v.starts_with(console::SESSION_COOKIE))
            .expect("session cookie")
            .to_owned();
        for attribute in ["HttpOnly", "SameSite=Strict", "Path=/console"] {
            assert!(set.contains(attribute), "{set}");
        }
        assert!(!set.contains("Secure"), "plaintext: no Secure: {set}");
        let cookie = set.split(';').next().unwrap_or_default().to_owned();
        let page = self
            .get(
                Some(&cookie),
                "/console/t/{t}/runs".replace("{t}", tenant).as_str(),
            )
            .await;
        assert_eq!(page.0, StatusCode::OK, "{}", page.1);
        Session {
            cookie,
            csrf: csrf_of(&page.1),
        }
    }

    async fn get(&self, cookie: Option<&str>, path: &str) -> (StatusCode, String, Option<String>) {
        let mut req = self.http.get(format!("{}{path}", self.base));
        if let Some(c) = cookie {
            req = req.header(COOKIE, c);
        }
        let response = req.send().await.expect("get");
        let location = response
            .headers()
            .get(LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        (
            response.status(),
            response.text().await.unwrap_or_default(),
            location,
        )
    }

    async fn post(
        &self,
        cookie: Option<&str>,
        path: &str,
        fields: &[(&str, &str)],
    ) -> (StatusCode, String) {
        let mut req = self
            .http
            .post(format!("{}{path}", self.base))
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(form_body(fields));
        if let Some(c) = cookie {
            req = req.header(COOKIE, c);
        }
        let response = req.send().await.expect("post");
        (response.status(), response.text().await.unwrap_or_default())
    }

    async fn start(&self, tenant: &str, key: &str, input: Value) -> Uuid {
        let (run, _) = self
            .coord
            .start_run(StartRun {
                tenant: tenant.into(),
                workflow: "w".into(),
                input_json: input.to_string(),
                idempotency_key: key.into(),
                caller: "c".into(),
                caller_grants: vec!["crm.write".into()],
            })
            .await
            .expect("start");
        run.run_id
    }

    /// A run of `tenant` whose call of `create` is uncertain: (run, record).
    async fn uncertain(&self, tenant: &str, key: &str) -> (Uuid, Uuid) {
        let run = self
            .start(tenant, key, json!({"email": "e@example.com"}))
            .await;
        let model = self.coord.claim("w1", 1, 0).await.expect("claim").remove(0);
        let proposal = serde_json::to_string(&ModelCallResult {
            content: None,
            tool_calls: vec![ToolUse {
                id: "tu".into(),
                name: "create".into(),
                arguments: r#"{"email":"e@example.com"}"#.into(),
            }],
            usage: Usage::default(),
            finish_reason: None,
        })
        .expect("json");
        self.coord
            .complete("w1", &model.task_id.to_string(), 1, &proposal)
            .await
            .expect("complete");
        let call = self.coord.claim("w1", 1, 0).await.expect("claim").remove(0);
        self.coord
            .dispatch("w1", &call.task_id.to_string(), 1)
            .await
            .expect("dispatch");
        self.coord
            .store()
            .expire_task_timers(Some(call.task_id))
            .await
            .expect("expire");
        assert_eq!(self.coord.sweep_expired_leases().await.expect("sweep"), 1);
        let rows = self
            .coord
            .store()
            .uncertain_for_run(run)
            .await
            .expect("rows");
        (run, rows[0].uncertain_id)
    }

    async fn last_seq(&self, tenant: &str, run: Uuid) -> i64 {
        self.coord
            .get_run(tenant, &run.to_string())
            .await
            .expect("run")
            .last_seq
    }
}

fn form_body(fields: &[(&str, &str)]) -> String {
    let mut s = form_urlencoded::Serializer::new(String::new());
    for (k, v) in fields {
        s.append_pair(k, v);
    }
    s.finish()
}

fn cookie_of(response: &reqwest::Response, name: &str) -> Option<String> {
    response
        .headers()
        .get_all(SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| v.strip_prefix(&format!("{name}=")))
        .map(|v| v.split(';').next().unwrap_or_default().to_owned())
}

/// The CSRF token of a page's first form.
fn csrf_of(html: &str) -> String {
    let marker = r#"name="csrf" value=""#;
    let start = html
        .find(marker)
        .map(|i| i + marker.len())
        .expect("a csrf field");
    html[start..]
        .split('"')
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// `path` with its parameters filled in.
fn fill(path: &str, tenant: &str, run: Uuid, record: Uuid) -> String {
    path.replace("{tenant}", tenant)
        .replace("{run_id}", &run.to_string())
        .replace("{node}", "n")
        .replace("{call_id}", "n.t1")
        .replace("{id}", &record.to_string())
}

/// The form fields each POST route takes (so an admitted one gets past
/// the form decoding).
fn fields_of(path: &str) -> Vec<(&'static str, &'static str)> {
    if path.ends_with("/resolve") {
        vec![("resolution", "retry"), ("reason", "r")]
    } else if path.ends_with("/signal") {
        vec![("name", "go"), ("signal_id", "s1")]
    } else if path.ends_with("/decide") {
        vec![("decision", "approve"), ("reason", "r")]
    } else if path.ends_with("/input") {
        vec![("answer", "{}")]
    } else {
        vec![("reason", "r")]
    }
}

async fn every_route_refuses_the_wrong_principal(backend: Backend) {
    let env = Env::new(backend).await;
    let (run, record) = env.uncertain("acme", "k1").await;
    let viewer = env.key("viewer", "client", "acme", &[]).await;
    let approver = env
        .key("approver", "approver", "acme", &["crm.approve"])
        .await;
    let operator = env.key("operator", "operator", "acme", &[]).await;
    let stranger = env.key("stranger", "operator", "other", &[]).await;
    let worker = env.key("worker", "worker", "acme", &[]).await;
    let sessions = [
        ("client", env.sign_in(&viewer, "acme").await),
        ("approver", env.sign_in(&approver, "acme").await),
        ("operator", env.sign_in(&operator, "acme").await),
    ];
    let stranger = env.sign_in(&stranger, "other").await;
    let before = env.last_seq("acme", run).await;
    let mut checked = 0;
    for (method, template, policy) in ROUTES {
        if !template.contains("{tenant}") {
            continue;
        }
        let path = fill(template, "acme", run, record);
        let mut fields: Vec<(&str, &str)> = fields_of(template);
        if *method == "GET" {
            // No session: the login page, coming back here.
            let (status, _, location) = env.get(None, &path).await;
            assert_eq!(status, StatusCode::SEE_OTHER, "{path}");
            assert!(
                location
                    .unwrap_or_default()
                    .starts_with("/console/login?next="),
                "{path}"
            );
            // Another tenant's principal sees nothing of it.
            let (status, body, _) = env.get(Some(&stranger.cookie), &path).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {body}");
            assert!(!body.contains(&run.to_string()), "{path} leaks the run");
            for (role, s) in &sessions {
                let (status, body, _) = env.get(Some(&s.cookie), &path).await;
                let admitted = policy.roles().iter().any(|r| r.as_str() == *role);
                let want = if admitted {
                    StatusCode::OK
                } else {
                    StatusCode::FORBIDDEN
                };
                assert_eq!(status, want, "{role} GET {path}: {body}");
            }
        } else {
            let (status, _) = env.post(None, &path, &fields).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}");
            fields.push(("csrf", &stranger.csrf));
            let (status, _) = env.post(Some(&stranger.cookie), &path, &fields).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{path}");
            fields.pop();
            for (role, s) in &sessions {
                let admitted = policy.roles().iter().any(|r| r.as_str() == *role);
                // Without the token, with another session's, then (refused
                // roles only) with its own.
                let (status, body) = env.post(Some(&s.cookie), &path, &fields).await;
                assert_eq!(
                    status,
                    StatusCode::FORBIDDEN,
                    "{role} POST {path} without CSRF: {body}"
                );
                if admitted {
                    assert!(body.contains("CSRF"), "{body}");
                }
                let mut wrong = fields.clone();
                wrong.push(("csrf", &stranger.csrf));
                let (status, _) = env.post(Some(&s.cookie), &path, &wrong).await;
                assert_eq!(
                    status,
                    StatusCode::FORBIDDEN,
                    "{role} POST {path} with another CSRF"
                );
                if !admitted {
                    let mut own = fields.clone();
                    own.push(("csrf", &s.csrf));
                    let (status, body) = env.post(Some(&s.cookie), &path, &own).await;
                    assert_eq!(status, StatusCode::FORBIDDEN, "{role} POST {path}: {body}");
                }
            }
        }
        checked += 1;
    }
    assert_eq!(
        checked,
        ROUTES.iter().filter(|r| r.1.contains("{tenant}")).count()
    );
    assert!(checked >= 12, "{checked}");
    assert_eq!(
        env.last_seq("acme", run).await,
        before,
        "no refused form changed the run"
    );
    let open = env
        .coord
        .get_uncertain("acme", &record.to_string())
        .await
        .expect("record");
    assert_eq!(open.status, "open");
    // A worker key cannot sign in; a key of one tenant cannot sign in to another.
    let (status, body) = sign_in_status(&env, &worker, "acme").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, _) = sign_in_status(&env, &viewer, "other").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = sign_in_status(&env, "belay_nope_nope", "acme").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    env.finish().await;
}

/// The status of a sign-in attempt (with a valid login token).
async fn sign_in_status(env: &Env, key: &str, tenant: &str) -> (StatusCode, String) {
    let form = env
        .http
        .get(format!("{}{}", env.base, console::LOGIN_PATH))
        .send()
        .await
        .expect("login page");
    let login_cookie = cookie_of(&form, console::LOGIN_COOKIE).expect("login cookie");
    let token = csrf_of(&form.text().await.expect("text"));
    let cookie = format!("{}={login_cookie}", console::LOGIN_COOKIE);
    // Without the login token: refused whatever the key.
    let (status, _) = env
        .post(
            Some(&cookie),
            console::LOGIN_PATH,
            &[("key", key), ("tenant", tenant)],
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    env.post(
        Some(&cookie),
        console::LOGIN_PATH,
        &[("key", key), ("tenant", tenant), ("csrf", &token)],
    )
    .await
}

/// A search of acme's runs by text and status.
fn search<'a>(text: Option<&'a str>, status: Option<&'a str>) -> RunSearch<'a> {
    RunSearch {
        tenant: "acme",
        text,
        status,
        limit: 100,
        ..RunSearch::default()
    }
}

async fn the_run_list_filters_counts_and_pages(backend: Backend) {
    let env = Env::new(backend).await;
    let (paused, _) = env.uncertain("acme", "u1").await;
    let mut runs = Vec::new();
    for i in 0..4 {
        runs.push(
            env.start(
                "acme",
                &format!("k{i}"),
                json!({"email": format!("user{i}@example.com")}),
            )
            .await,
        );
    }
    env.start("other", "o1", json!({"email": "user1@example.com"}))
        .await;
    let store = env.coord.store();
    let found = store
        .search_runs(&search(Some("USER1@"), None))
        .await
        .expect("search");
    assert_eq!(
        found.iter().map(|r| r.run_id).collect::<Vec<_>>(),
        vec![runs[1]]
    );
    let id = runs[2].simple().to_string();
    let found = store
        .search_runs(&search(Some(&id[20..]), None))
        .await
        .expect("by id");
    assert_eq!(
        found.iter().map(|r| r.run_id).collect::<Vec<_>>(),
        vec![runs[2]]
    );
    let found = store
        .search_runs(&search(Some("k3"), None))
        .await
        .expect("by key");
    assert_eq!(
        found.iter().map(|r| r.run_id).collect::<Vec<_>>(),
        vec![runs[3]]
    );
    assert!(
        store
            .search_runs(&search(Some("50%_"), None))
            .await
            .expect("escaped")
            .is_empty()
    );
    let found = store
        .search_runs(&search(None, Some("paused")))
        .await
        .expect("status");
    assert_eq!(
        found.iter().map(|r| r.run_id).collect::<Vec<_>>(),
        vec![paused]
    );
    let counts = store
        .count_runs_by_status(&search(None, Some("paused")))
        .await
        .expect("counts");
    let total: i64 = counts.iter().map(|c| c.1).sum();
    assert_eq!(total, 5, "counts ignore the status filter: {counts:?}");
    assert!(counts.contains(&("paused".to_owned(), 1)), "{counts:?}");
    let future = chrono::Utc::now() + chrono::Duration::hours(1);
    let later = RunSearch {
        created_from: Some(future),
        ..search(None, None)
    };
    assert!(store.search_runs(&later).await.expect("time").is_empty());
    let before = RunSearch {
        created_before: Some(future),
        workflow: Some("w"),
        ..search(None, None)
    };
    assert_eq!(store.search_runs(&before).await.expect("time").len(), 5);
    // Pages of two, newest first, through the page's "Older" links.
    let operator = env.key("operator", "operator", "acme", &[]).await;
    let s = env.sign_in(&operator, "acme").await;
    let mut seen = Vec::new();
    let mut path = "/console/t/acme/runs?q=example.com&size=2".to_owned();
    let mut pages = 0;
    loop {
        let (status, body, _) = env.get(Some(&s.cookie), &path).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        pages += 1;
        seen.extend(
            body.match_indices("data-run-id=\"")
                .map(|(i, m)| body[i + m.len()..i + m.len() + 36].to_owned()),
        );
        let Some(i) = body.find("rel=\"next\"") else {
            break;
        };
        let href = body[..i].rsplit("href=\"").next().unwrap_or_default();
        // askama escapes `&` as `&#38;`.
        path = href
            .split('"')
            .next()
            .unwrap_or_default()
            .replace("&#38;", "&");
        if seen.len() > 10 {
            break;
        }
    }
    assert_eq!(seen.len(), 5, "every run of acme once: {seen:?}");
    seen.sort();
    seen.dedup();
    assert_eq!(
        (seen.len(), pages),
        (5, 3),
        "five runs on three pages of two"
    );
    let (_, body, _) = env
        .get(
            Some(&s.cookie),
            "/console/t/acme/runs?status=paused&partial=1",
        )
        .await;
    assert!(
        body.contains(&paused.to_string()) && !body.contains(&runs[0].to_string()),
        "{body}"
    );
    assert!(
        !body.contains("<html"),
        "partial=1 answers with the live part only"
    );
    let (status, _, _) = env
        .get(Some(&s.cookie), "/console/t/acme/runs?status=sleeping")
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    env.finish().await;
}

async fn an_operator_sees_the_pages_and_resolves_from_the_form(backend: Backend) {
    let env = Env::new(backend).await;
    let (run, record) = env.uncertain("acme", "k1").await;
    let operator = env.key("operator", "operator", "acme", &[]).await;
    let s = env.sign_in(&operator, "acme").await;
    let (status, page, _) = env
        .get(Some(&s.cookie), &format!("/console/t/acme/runs/{run}"))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        page.contains(r#"class="g-node current" data-node="n""#),
        "the graph marks the node"
    );
    assert!(
        page.contains(&format!("{run}/n.t1")),
        "the call's idempotency key"
    );
    assert!(
        page.contains("tool_call_dispatched") && page.contains("JSON of event 1"),
        "timeline"
    );
    let (_, page, _) = env
        .get(Some(&s.cookie), "/console/t/acme/definitions")
        .await;
    assert!(
        page.contains("create(email: string) -&#62; {id: string}"),
        "signature"
    );
    let (_, page, _) = env.get(Some(&s.cookie), "/console/t/acme/uncertain").await;
    assert!(
        page.contains(&format!("data-uncertain=\"{record}\"")),
        "queued"
    );
    let path = format!("/console/t/acme/uncertain/{record}/resolve");
    let bad = [
        ("resolution", "succeeded"),
        ("result", r#"{"id": 5}"#),
        ("reason", "found"),
        ("csrf", s.csrf.as_str()),
    ];
    let (status, body) = env.post(Some(&s.cookie), &path, &bad).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let good = [
        ("resolution", "succeeded"),
        ("result", r#"{"id": "acct-9"}"#),
        ("reason", "found it in the CRM"),
        ("csrf", s.csrf.as_str()),
    ];
    let (status, body) = env.post(Some(&s.cookie), &path, &good).await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    let row = env
        .coord
        .get_uncertain("acme", &record.to_string())
        .await
        .expect("record");
    assert_eq!(
        (row.status.as_str(), row.resolved_by.as_deref()),
        ("resolved", Some("operator"))
    );
    let (_, page, _) = env
        .get(Some(&s.cookie), "/console/t/acme/uncertain?notice=resolved")
        .await;
    assert!(
        page.contains("found it in the CRM")
            && page.contains("The uncertain outcome was resolved.")
    );
    // Signing out clears the cookie.
    let (status, _) = env
        .post(Some(&s.cookie), console::LOGOUT_PATH, &[("csrf", &s.csrf)])
        .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert!(matches!(
        ROUTES
            .iter()
            .find(|r| r.1 == console::LOGOUT_PATH)
            .map(|r| r.2),
        Some(Policy::SignedIn)
    ));
    env.finish().await;
}

const CONFIRMED_TOOL: &str = r#"TOOLS:
  pay(amount: number, recipient: string) -> {payment_id: string}
    description: "Execute a payment"
    type: http
    endpoint: "/payments"
    permission: crm.write
    repeat_safety: idempotent
    confirmation:
      require: always
      immutable_params: [recipient]
"#;

const CONFIRMED_FLOW: &str = "kind: workflow\nname: payout\nnodes:\n  - {id: pay, type: tool, tool: pay, args: {amount: 120, recipient: \"acct_9\"}, grants: [crm.write]}\n";

/// A tool call waiting for its confirmation is on the page of what waits
/// on people with its exact arguments; an approver without the grant is
/// shown no form and refused; one with it approves an edit, which is what
/// the call then sends.
async fn a_confirmation_is_decided_from_the_page(backend: Backend) {
    let env = Env::new(backend).await;
    let files = vec![
        belay_engine::definitions::SourceFile {
            path: "pay.tools.abl".into(),
            content: CONFIRMED_TOOL.into(),
        },
        belay_engine::definitions::SourceFile {
            path: "payout.yaml".into(),
            content: CONFIRMED_FLOW.into(),
        },
    ];
    env.coord
        .register_bundle("acme", files)
        .await
        .expect("register");
    let (run, _) = env
        .coord
        .start_run(StartRun {
            tenant: "acme".into(),
            workflow: "payout".into(),
            input_json: "{}".into(),
            idempotency_key: "pay1".into(),
            caller: "c".into(),
            caller_grants: vec!["crm.write".into()],
        })
        .await
        .expect("start");
    assert_eq!(run.status, "waiting");
    let without = env.key("nogrant", "approver", "acme", &[]).await;
    let with = env.key("payer", "approver", "acme", &["crm.write"]).await;
    let s = env.sign_in(&without, "acme").await;
    let (status, page, _) = env.get(Some(&s.cookie), "/console/t/acme/approvals").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        page.contains(r#"data-waiting="confirmation""#)
            && page.contains("Confirm pay (call pay.t1)"),
        "{page}"
    );
    assert!(
        page.contains("&#34;recipient&#34;: &#34;acct_9&#34;"),
        "the exact arguments: {page}"
    );
    assert!(
        !page.contains("/approvals/pay.t1/decide"),
        "no form without the grant"
    );
    let path = format!(
        "/console/t/acme/runs/{}/approvals/pay.t1/decide",
        run.run_id
    );
    let edited = r#"{"amount": 100, "recipient": "acct_9"}"#;
    let form = |csrf: &str| {
        vec![
            ("decision".to_owned(), "approve".to_owned()),
            ("reason".to_owned(), "ok".to_owned()),
            ("subject".to_owned(), edited.to_owned()),
            ("csrf".to_owned(), csrf.to_owned()),
        ]
    };
    let fields = form(&s.csrf);
    let refs: Vec<(&str, &str)> = fields
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let (status, body) = env.post(Some(&s.cookie), &path, &refs).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let s = env.sign_in(&with, "acme").await;
    let (_, page, _) = env.get(Some(&s.cookie), "/console/t/acme/approvals").await;
    assert!(
        page.contains("/approvals/pay.t1/decide"),
        "a form for the holder of the grant"
    );
    let fields = form(&s.csrf);
    let refs: Vec<(&str, &str)> = fields
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let (status, body) = env.post(Some(&s.cookie), &path, &refs).await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    let tasks = env.coord.claim("w1", 4, 0).await.expect("claim");
    assert_eq!(tasks.len(), 1);
    assert_eq!(
        tasks[0].spec["arguments"],
        json!({"amount": 100, "recipient": "acct_9"})
    );
    let (_, page, _) = env
        .get(Some(&s.cookie), "/console/t/acme/approvals?notice=approved")
        .await;
    assert!(
        page.contains("Approved.") && !page.contains("pay.t1"),
        "{page}"
    );
    env.finish().await;
}

/// An admin holds no grants of its own, yet may act with any (it could
/// make a key holding them): the approvals page offers it the form of a
/// confirmation that needs `crm.write`, and sending that form decides it
/// (it was refused: the form acted with the admin's own, empty, grants).
async fn an_admin_decides_what_the_page_offers_it(backend: Backend) {
    let env = Env::new(backend).await;
    let files = vec![
        belay_engine::definitions::SourceFile {
            path: "pay.tools.abl".into(),
            content: CONFIRMED_TOOL.into(),
        },
        belay_engine::definitions::SourceFile {
            path: "payout.yaml".into(),
            content: CONFIRMED_FLOW.into(),
        },
    ];
    env.coord
        .register_bundle("acme", files)
        .await
        .expect("register");
    let (run, _) = env
        .coord
        .start_run(StartRun {
            tenant: "acme".into(),
            workflow: "payout".into(),
            input_json: "{}".into(),
            idempotency_key: "pay-admin".into(),
            caller: "c".into(),
            caller_grants: vec!["crm.write".into()],
        })
        .await
        .expect("start");
    assert_eq!(run.status, "waiting");
    let s = env.sign_in(OPS, "acme").await;
    let (status, page, _) = env.get(Some(&s.cookie), "/console/t/acme/approvals").await;
    assert_eq!(status, StatusCode::OK);
    let path = format!(
        "/console/t/acme/runs/{}/approvals/pay.t1/decide",
        run.run_id
    );
    assert!(
        page.contains(&path),
        "the admin is offered the form: {page}"
    );
    let mut fields = vec![
        ("decision", "approve"),
        ("reason", "ok"),
        ("csrf", s.csrf.as_str()),
    ];
    let grant = hidden_of(&page, "grant");
    if let Some(g) = grant.as_deref() {
        fields.push(("grant", g));
    }
    let (status, body) = env.post(Some(&s.cookie), &path, &fields).await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    let tasks = env.coord.claim("w1", 4, 0).await.expect("claim");
    assert_eq!(tasks.len(), 1, "the confirmed call runs");
    let holder = env.key("narrow", "approver", "acme", &["crm.read"]).await;
    let h = env.sign_in(&holder, "acme").await;
    let tampered = [
        ("decision", "approve"),
        ("reason", "ok"),
        ("grant", "crm.write"),
        ("csrf", h.csrf.as_str()),
    ];
    let (status, body) = env.post(Some(&h.cookie), &path, &tampered).await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "a key's form grant may only narrow its grants: {body}"
    );
    env.finish().await;
}

/// The value of the first hidden input `name` of `html`, if any.
fn hidden_of(html: &str, name: &str) -> Option<String> {
    let marker = format!(r#"type="hidden" name="{name}" value=""#);
    let start = html.find(&marker)? + marker.len();
    let end = html[start..].find('"')?;
    Some(html[start..start + end].to_owned())
}

/// A search text too long for a run id, an input or a key is refused with
/// 400 naming `q` on both backends (SQLite refused its `LIKE` pattern, which
/// the page told as "the engine's database is unavailable", 503).
async fn a_search_text_too_long_is_refused_by_name(backend: Backend) {
    let env = Env::new(backend).await;
    env.start("acme", "k1", json!({"email": "e@example.com"}))
        .await;
    let viewer = env.key("reader", "client", "acme", &[]).await;
    let s = env.sign_in(&viewer, "acme").await;
    let long = "a".repeat(60_000);
    for path in [
        format!("/console/t/acme/runs?q={long}"),
        format!("/console/t/acme/runs?partial=1&q={long}"),
    ] {
        let (status, body, _) = env.get(Some(&s.cookie), &path).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert!(
            body.contains("the search text `q` is 60000 characters long"),
            "{body}"
        );
    }
    let (status, body, _) = env
        .get(
            Some(&s.cookie),
            &format!("/console/t/acme/runs?q={}", "a".repeat(500)),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    env.finish().await;
}

/// Behind a TLS listener (`admin::router_for(…, true)`, as `Engine::serve`
/// builds it when the engine serves TLS) the cookies are `Secure`.
async fn cookies_are_secure_behind_tls(backend: Backend) {
    let env = Env::new(backend).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let auth = belay_engine::auth::Authenticator::new(
        env.coord.store().clone(),
        belay_engine::admin::AdminAuth::parse(TOKENS).expect("tokens"),
    );
    let app = belay_engine::admin::router_for(Arc::clone(&env.coord), auth, true);
    tokio::spawn(belay_engine::tls::serve_http(
        listener,
        app,
        std::future::pending(),
    ));
    let response = env
        .http
        .get(format!("http://{addr}{}", console::LOGIN_PATH))
        .send()
        .await
        .expect("login page");
    let set = response
        .headers()
        .get(SET_COOKIE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(
        set.starts_with(console::LOGIN_COOKIE) && set.contains("; Secure"),
        "{set}"
    );
    let csp = response
        .headers()
        .get("content-security-policy")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    env.finish().await;
}

/// Whether `cookie` (a `name=value` pair) is signed in: the runs page
/// answers, rather than sending the browser to the login page.
async fn signed_in(env: &Env, cookie: &str) -> bool {
    let (status, body, location) = env.get(Some(cookie), "/console/t/acme/runs").await;
    match status {
        StatusCode::OK => true,
        StatusCode::SEE_OTHER => {
            let to = location.unwrap_or_default();
            assert!(to.starts_with("/console/login?next="), "{to}");
            false
        }
        other => panic!("runs page: {other}: {body}"),
    }
}

/// The value of a `name=value` cookie pair.
fn value_of(cookie: &str) -> &str {
    cookie.split_once('=').map(|(_, v)| v).unwrap_or_default()
}

async fn sessions_hold_no_key_and_end_on_the_server(backend: Backend) {
    let env = Env::new(backend).await;
    let key = env.key("operator", "operator", "acme", &[]).await;
    let key_id = belay_engine::auth::key::parse(&key).expect("key").key_id;
    let s = env.sign_in(&key, "acme").await;
    // The cookie is a random token: not the key, not an encoding of it.
    let token = value_of(&s.cookie);
    assert_eq!(token.len(), 64, "{token}");
    assert!(token.bytes().all(|b| b.is_ascii_hexdigit()), "{token}");
    let secret = key.rsplit('_').next().unwrap_or_default();
    assert!(!token.contains(secret) && !key.contains(token));
    // The store keeps the token's hash and the key's id, never the key.
    let store = env.coord.store();
    let row = store
        .console_session(&belay_engine::auth::key::secret_sha256(token))
        .await
        .expect("read")
        .expect("the session is stored");
    assert_eq!(row.credential, key_id);
    assert_eq!(row.principal, "operator");
    assert_eq!(
        row.csrf, s.csrf,
        "the page's forms carry the session's token"
    );
    assert!(
        !format!("{row:?}").contains(&row.csrf),
        "Debug redacts the CSRF token"
    );
    assert!(!row.credential_sha256.contains(secret));
    // A made-up token, and the old cookie format (the key, base64url), are
    // no sessions.
    assert!(
        !signed_in(
            &env,
            &format!("{}={}", console::SESSION_COOKIE, "ab".repeat(32))
        )
        .await
    );
    let old = base64_url(&key);
    assert!(!signed_in(&env, &format!("{}={old}", console::SESSION_COOKIE)).await);
    // Signing out ends the session on the server: the same cookie, sent
    // again (a copy kept by an attacker), is no longer signed in.
    assert!(signed_in(&env, &s.cookie).await);
    let (status, _) = env
        .post(Some(&s.cookie), console::LOGOUT_PATH, &[("csrf", &s.csrf)])
        .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert!(!signed_in(&env, &s.cookie).await, "replayed after sign-out");
    // Signing in again ends the browser's previous session (no fixation).
    let first = env.sign_in(&key, "acme").await;
    let second = sign_in_with_cookie(&env, &key, &first.cookie).await;
    assert!(
        !signed_in(&env, &first.cookie).await,
        "the previous session ended"
    );
    assert!(signed_in(&env, &second).await);
    // Revoking the key ends its sessions at their next request.
    let revoked = env
        .http
        .post(format!("{}/admin/v1/keys/{key_id}/revoke", env.base))
        .bearer_auth(OPS)
        .send()
        .await
        .expect("revoke");
    assert_eq!(revoked.status(), StatusCode::OK);
    assert!(!signed_in(&env, &second).await, "revoked key");
    let gone = store
        .console_session(&belay_engine::auth::key::secret_sha256(value_of(&second)))
        .await
        .expect("read");
    assert!(gone.is_none(), "the revoked key's session was ended");
    // A session ends 12 hours after sign-in, by the engine's clock.
    let other = env.key("operator2", "operator", "acme", &[]).await;
    let s = env.sign_in(&other, "acme").await;
    store
        .advance_clock(12 * 3600 * 1000 - 1000)
        .await
        .expect("clock");
    assert!(signed_in(&env, &s.cookie).await, "not yet 12 hours");
    store.advance_clock(2000).await.expect("clock");
    assert!(!signed_in(&env, &s.cookie).await, "after 12 hours");
    env.finish().await;
}

/// The answer to signing in with `key` for `tenant` (may be empty) through
/// the login form, from a browser that also sends the cookies `previous`
/// (may be empty).
async fn login_response(env: &Env, key: &str, tenant: &str, previous: &str) -> reqwest::Response {
    let form = env
        .http
        .get(format!("{}{}", env.base, console::LOGIN_PATH))
        .send()
        .await
        .expect("login page");
    let login_cookie = cookie_of(&form, console::LOGIN_COOKIE).expect("login cookie");
    let token = csrf_of(&form.text().await.expect("text"));
    let mut cookies = format!("{}={login_cookie}", console::LOGIN_COOKIE);
    if !previous.is_empty() {
        cookies = format!("{cookies}; {previous}");
    }
    env.http
        .post(format!("{}{}", env.base, console::LOGIN_PATH))
        .header(COOKIE, cookies)
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(form_body(&[
            ("key", key),
            ("tenant", tenant),
            ("csrf", &token),
        ]))
        .send()
        .await
        .expect("login")
}

/// Sign in with `key` from a browser that has session cookie `previous`;
/// returns the new session's cookie pair.
async fn sign_in_with_cookie(env: &Env, key: &str, previous: &str) -> String {
    let response = login_response(env, key, "acme", previous).await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let value = cookie_of(&response, console::SESSION_COOKIE).expect("session cookie");
    format!("{}={value}", console::SESSION_COOKIE)
}

async fn a_key_of_several_tenants_chooses_one_and_pages_speak_plainly(backend: Backend) {
    let env = Env::new(backend).await;
    let made: Value = env
        .http
        .post(format!("{}/admin/v1/keys", env.base))
        .bearer_auth(OPS)
        .json(&json!({"principal": "both", "role": "operator", "tenants": ["acme", "other"]}))
        .send()
        .await
        .expect("create key")
        .json()
        .await
        .expect("key json");
    let key = made["key"].as_str().expect("key").to_owned();
    // No tenant typed: signed in, sent to the page choosing one.
    let response = login_response(&env, &key, "", "").await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let to = response
        .headers()
        .get(LOCATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert_eq!(to, console::HOME_PATH);
    let value = cookie_of(&response, console::SESSION_COOKIE).expect("session cookie");
    let cookie = format!("{}={value}", console::SESSION_COOKIE);
    let (status, page, _) = env.get(Some(&cookie), console::HOME_PATH).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    for link in [
        r#"href="/console/t/acme/runs""#,
        r#"href="/console/t/other/runs""#,
    ] {
        assert!(page.contains(link), "{link} in {page}");
    }
    let (status, _, location) = env.get(Some(&cookie), "/console?tenant=other").await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(location.as_deref(), Some("/console/t/other/runs"));
    let (status, page, _) = env.get(Some(&cookie), "/console?tenant=nope").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(
        page.contains("nope") && page.contains("Choose a tenant"),
        "{page}"
    );
    // Each tenant's pages link back to the choice.
    let (status, page, _) = env.get(Some(&cookie), "/console/t/acme/runs").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains(r#"<a href="/console">switch</a>"#), "{page}");
    // An address with a parameter the page does not take: an HTML page
    // naming it, not the admin API's JSON.
    let response = env
        .http
        .get(format!("{}/console/t/acme/runs?bogus=1", env.base))
        .header(COOKIE, &cookie)
        .send()
        .await
        .expect("get");
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let kind = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(kind.starts_with("text/html"), "{kind}");
    let page = response.text().await.unwrap_or_default();
    assert!(
        page.contains("query this page does not take") && page.contains("bogus"),
        "{page}"
    );
    let (status, page, _) = env
        .get(Some(&cookie), "/console/t/acme/runs?page=nonsense")
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        page.contains("go back to the first page") && !page.contains("page_token"),
        "{page}"
    );
    // A signal whose payload is not JSON is refused naming the field.
    let run = env
        .start("acme", "sig", json!({"email": "s@example.com"}))
        .await;
    let (_, page, _) = env
        .get(Some(&cookie), &format!("/console/t/acme/runs/{run}"))
        .await;
    let csrf = csrf_of(&page);
    let (status, body) = env
        .post(
            Some(&cookie),
            &format!("/console/t/acme/runs/{run}/signal"),
            &[
                ("name", "go"),
                ("signal_id", "s1"),
                ("payload", "{nope"),
                ("csrf", &csrf),
            ],
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body.contains("Payload (JSON): not JSON at line 1"),
        "{body}"
    );
    env.finish().await;
}

/// `text` in base64url without padding (the cookie format before sessions
/// were stored).
fn base64_url(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text)
}

on_both_backends!(
    a_confirmation_is_decided_from_the_page,
    an_admin_decides_what_the_page_offers_it,
    a_search_text_too_long_is_refused_by_name,
    cookies_are_secure_behind_tls,
    every_route_refuses_the_wrong_principal,
    the_run_list_filters_counts_and_pages,
    an_operator_sees_the_pages_and_resolves_from_the_form,
    sessions_hold_no_key_and_end_on_the_server,
    a_key_of_several_tenants_chooses_one_and_pages_speak_plainly,
);
