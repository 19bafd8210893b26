//! The CRM server over real HTTP: the service endpoints, idempotency keys,
//! every fault action, `/_wait`, the request log and shutdown.

#![allow(missing_docs)]

mod common;

use belay_example_onboarding::crm_server::FaultAction;
use common::{client, start_crm};
use serde_json::{Value, json};

const ALICE: &str = r#"{"email": "alice@example.com", "name": "Alice", "plan": "pro"}"#;

async fn post(url: &str, path: &str, key: Option<&str>, body: &str) -> (u16, Value) {
    post_with(&client(), url, path, key, body)
        .await
        .expect("response")
}

async fn post_with(
    client: &reqwest::Client,
    url: &str,
    path: &str,
    key: Option<&str>,
    body: &str,
) -> reqwest::Result<(u16, Value)> {
    let mut request = client
        .post(format!("{url}{path}"))
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    let response = request.send().await?;
    let status = response.status().as_u16();
    Ok((status, response.json().await?))
}

async fn get(url: &str, path: &str) -> (u16, Value) {
    let response = client()
        .get(format!("{url}{path}"))
        .send()
        .await
        .expect("send");
    let status = response.status().as_u16();
    (status, response.json().await.expect("json"))
}

async fn arm(url: &str, path: &str, action: &str, times: u32) {
    let (status, body) = post(
        url,
        "/_faults",
        None,
        &json!({"path": path, "action": action, "times": times}).to_string(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

async fn accounts(url: &str) -> Vec<Value> {
    let (status, state) = get(url, "/_state").await;
    assert_eq!(status, 200);
    state["accounts"].as_array().expect("accounts").clone()
}

#[tokio::test]
async fn lookup_finds_seeded_customers_only() {
    let crm = start_crm().await;
    let (status, body) = post(
        &crm.url,
        "/customers/lookup",
        None,
        r#"{"email": "known@example.com"}"#,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!({"found": true, "customer_id": "cust_000001", "name": "Known Customer"})
    );
    let (status, body) = post(
        &crm.url,
        "/customers/lookup",
        None,
        r#"{"email": "nobody@example.com"}"#,
    )
    .await;
    assert_eq!((status, body), (200, json!({"found": false})));
    crm.stop().await;
}

#[tokio::test]
async fn accounts_without_a_key_are_never_deduplicated() {
    let crm = start_crm().await;
    let (status, first) = post(&crm.url, "/accounts", None, ALICE).await;
    assert_eq!(
        (status, &first),
        (201, &json!({"account_id": "acct_000001"}))
    );
    let (status, second) = post(&crm.url, "/accounts", None, ALICE).await;
    assert_eq!(
        (status, &second),
        (201, &json!({"account_id": "acct_000002"}))
    );
    assert_eq!(accounts(&crm.url).await.len(), 2);
    crm.stop().await;
}

#[tokio::test]
async fn plan_defaults_to_the_tools_default() {
    let crm = start_crm().await;
    let (status, _) = post(
        &crm.url,
        "/accounts",
        None,
        r#"{"email": "a@b.c", "name": "A"}"#,
    )
    .await;
    assert_eq!(status, 201);
    assert_eq!(
        accounts(&crm.url).await[0]["plan"],
        belay_example_onboarding::crm_server::DEFAULT_PLAN
    );
    crm.stop().await;
}

#[tokio::test]
async fn idempotency_key_replays_the_first_response() {
    let crm = start_crm().await;
    let (status, first) = post(&crm.url, "/accounts", Some("run1-call3"), ALICE).await;
    assert_eq!(status, 201);
    // Same request, keys in another order: same call.
    let reordered = r#"{"plan": "pro", "name": "Alice", "email": "alice@example.com"}"#;
    let (status, again) = post(&crm.url, "/accounts", Some("run1-call3"), reordered).await;
    assert_eq!((status, &again), (201, &first));
    let all = accounts(&crm.url).await;
    assert_eq!(all.len(), 1);
    assert_eq!(all[0]["idempotency_key"], "run1-call3");

    // Another key is another call.
    let (status, other) = post(&crm.url, "/accounts", Some("run1-call4"), ALICE).await;
    assert_eq!(status, 201);
    assert_ne!(other, first);

    // Reusing a key for a different request is a caller bug: 409, no effect.
    let (status, body) = post(
        &crm.url,
        "/accounts",
        Some("run1-call3"),
        r#"{"email": "bob@example.com", "name": "Bob", "plan": "pro"}"#,
    )
    .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"], "idempotency_key_reused");
    assert_eq!(accounts(&crm.url).await.len(), 2);

    // The reconcile lookup.
    let (status, found) = get(&crm.url, "/accounts/by-idempotency-key/run1-call3").await;
    assert_eq!(status, 200, "{found}");
    assert_eq!(found["account_id"], first["account_id"]);
    assert_eq!(found["email"], "alice@example.com");
    let (status, missing) = get(&crm.url, "/accounts/by-idempotency-key/never-used").await;
    assert_eq!((status, missing), (404, json!({"error": "not_found"})));
    crm.stop().await;
}

#[tokio::test]
async fn reconcile_lookup_decodes_percent_encoded_keys() {
    let crm = start_crm().await;
    let (status, created) = post(&crm.url, "/accounts", Some("run/1 call:3"), ALICE).await;
    assert_eq!(status, 201);
    let (status, found) = get(&crm.url, "/accounts/by-idempotency-key/run%2F1%20call%3A3").await;
    assert_eq!(status, 200, "{found}");
    assert_eq!(found["account_id"], created["account_id"]);
    crm.stop().await;
}

#[tokio::test]
async fn welcome_email_needs_an_existing_account_and_honours_keys() {
    let crm = start_crm().await;
    let (_, created) = post(&crm.url, "/accounts", None, ALICE).await;
    let account_id = created["account_id"].as_str().expect("id");
    let email = json!({"email": "alice@example.com", "account_id": account_id}).to_string();

    let (status, sent) = post(&crm.url, "/emails/welcome", Some("k1"), &email).await;
    assert_eq!((status, &sent), (200, &json!({"message_id": "msg_000001"})));
    let (status, again) = post(&crm.url, "/emails/welcome", Some("k1"), &email).await;
    assert_eq!((status, again), (200, sent));

    let unknown = r#"{"email": "alice@example.com", "account_id": "acct_999999"}"#;
    let (status, body) = post(&crm.url, "/emails/welcome", None, unknown).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"], "account_not_found");

    let (_, state) = get(&crm.url, "/_state").await;
    assert_eq!(state["emails"].as_array().expect("emails").len(), 1);
    crm.stop().await;
}

#[tokio::test]
async fn welcome_email_names_the_plan_when_given() {
    let crm = start_crm().await;
    let (_, created) = post(&crm.url, "/accounts", None, ALICE).await;
    let account_id = created["account_id"].as_str().expect("id");
    let email =
        json!({"email": "alice@example.com", "account_id": account_id, "plan": "enterprise"})
            .to_string();
    let (status, _) = post(&crm.url, "/emails/welcome", Some("w1"), &email).await;
    assert_eq!(status, 200);
    // The same key without the plan is another request.
    let plain = json!({"email": "alice@example.com", "account_id": account_id}).to_string();
    let (status, body) = post(&crm.url, "/emails/welcome", Some("w1"), &plain).await;
    assert_eq!(status, 409, "{body}");
    let (_, state) = get(&crm.url, "/_state").await;
    assert_eq!(state["emails"][0]["plan"], "enterprise");
    crm.stop().await;
}

#[tokio::test]
async fn reminders_need_an_existing_account_and_honour_keys() {
    let crm = start_crm().await;
    let (_, created) = post(&crm.url, "/accounts", None, ALICE).await;
    let account_id = created["account_id"].as_str().expect("id");
    let reminder =
        json!({"email": "alice@example.com", "account_id": account_id, "reminder": 2}).to_string();
    let (status, sent) = post(&crm.url, "/emails/reminder", Some("r1"), &reminder).await;
    assert_eq!((status, &sent), (200, &json!({"message_id": "rem_000001"})));
    let (status, again) = post(&crm.url, "/emails/reminder", Some("r1"), &reminder).await;
    assert_eq!((status, again), (200, sent));
    let unknown = r#"{"email": "alice@example.com", "account_id": "acct_999999"}"#;
    let (status, body) = post(&crm.url, "/emails/reminder", None, unknown).await;
    assert_eq!((status, &body["error"]), (404, &json!("account_not_found")));
    let zeroth = json!({"email": "a@b.c", "account_id": account_id, "reminder": 0}).to_string();
    let (status, body) = post(&crm.url, "/emails/reminder", None, &zeroth).await;
    assert_eq!((status, &body["error"]), (400, &json!("invalid_field")));
    let (_, state) = get(&crm.url, "/_state").await;
    let reminders = state["reminders"].as_array().expect("reminders");
    assert_eq!(reminders.len(), 1);
    assert_eq!(reminders[0]["reminder"], 2);
    assert_eq!(reminders[0]["idempotency_key"], "r1");
    crm.stop().await;
}

#[tokio::test]
async fn kyc_checks_are_clear_unless_documents_are_missing_or_review_is_asked_for() {
    let crm = start_crm().await;
    let (_, created) = post(&crm.url, "/accounts", None, ALICE).await;
    let account_id = created["account_id"].as_str().expect("id");
    let check = |email: &str, files: Value| {
        json!({"account_id": account_id, "email": email, "name": "Alice", "files": files})
            .to_string()
    };
    let clear = check("alice@example.com", json!(["passport.pdf"]));
    let (status, first) = post(&crm.url, "/kyc/checks", Some("k1"), &clear).await;
    assert_eq!(
        (status, &first),
        (200, &json!({"check_id": "kyc_000001", "status": "clear"}))
    );
    let (status, again) = post(&crm.url, "/kyc/checks", Some("k1"), &clear).await;
    assert_eq!((status, again), (200, first));
    let (_, none) = post(
        &crm.url,
        "/kyc/checks",
        None,
        &check("alice@example.com", json!([])),
    )
    .await;
    assert_eq!(none["status"], "review");
    let asked = check("alice+review@example.com", json!(["passport.pdf"]));
    let (_, asked) = post(&crm.url, "/kyc/checks", None, &asked).await;
    assert_eq!(asked["status"], "review");
    let (status, body) = post(
        &crm.url,
        "/kyc/checks",
        None,
        &check("alice@example.com", json!("passport.pdf")),
    )
    .await;
    assert_eq!((status, &body["error"]), (400, &json!("invalid_field")));
    let (_, state) = get(&crm.url, "/_state").await;
    assert_eq!(state["kyc_checks"].as_array().map(Vec::len), Some(3));
    assert_eq!(state["kyc_checks"][0]["files"], json!(["passport.pdf"]));
    crm.stop().await;
}

#[tokio::test]
async fn bad_requests_are_400_with_a_json_error() {
    let crm = start_crm().await;
    let cases = [
        ("/accounts", r#"{"email": "#, "invalid_json"),
        ("/accounts", "", "invalid_json"),
        (
            "/accounts",
            r#"{"email": "a@b.c", "plan": "pro"}"#,
            "missing_field",
        ),
        (
            "/accounts",
            r#"{"email": "a@b.c", "name": "A", "plan": 3}"#,
            "invalid_field",
        ),
        (
            "/accounts",
            r#"{"email": 42, "name": "A", "plan": "pro"}"#,
            "invalid_field",
        ),
        (
            "/accounts",
            r#"{"email": "", "name": "A", "plan": "pro"}"#,
            "invalid_field",
        ),
        ("/accounts", "[1, 2]", "invalid_body"),
        ("/customers/lookup", "{}", "missing_field"),
        ("/emails/welcome", r#"{"email": "a@b.c"}"#, "missing_field"),
    ];
    for (path, body, error) in cases {
        let (status, reply) = post(&crm.url, path, None, body).await;
        assert_eq!(status, 400, "{path} {body}: {reply}");
        assert_eq!(reply["error"], error, "{path} {body}: {reply}");
        assert!(
            reply["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{reply}"
        );
    }
    let (status, reply) = post(&crm.url, "/nope", None, "{}").await;
    assert_eq!((status, &reply["error"]), (404, &json!("not_found")));
    let (status, reply) = get(&crm.url, "/accounts").await;
    assert_eq!(
        (status, &reply["error"]),
        (405, &json!("method_not_allowed"))
    );
    assert!(accounts(&crm.url).await.is_empty());
    crm.stop().await;
}

#[tokio::test]
async fn requests_are_logged_in_order_and_filterable() {
    let crm = start_crm().await;
    post(
        &crm.url,
        "/customers/lookup",
        None,
        r#"{"email": "x@example.com"}"#,
    )
    .await;
    post(&crm.url, "/accounts", Some("key-1"), ALICE).await;
    post(&crm.url, "/accounts", None, "not json").await;
    get(&crm.url, "/_state").await; // control requests are not recorded

    let (status, all) = get(&crm.url, "/_requests").await;
    assert_eq!(status, 200);
    let all = all.as_array().expect("array");
    assert_eq!(all.len(), 3);
    assert_eq!(all[0]["seq"], 1);
    assert_eq!(all[0]["method"], "POST");
    assert_eq!(all[0]["path"], "/customers/lookup");
    assert_eq!(all[0]["idempotency_key"], Value::Null);
    assert_eq!(all[0]["body"], json!({"email": "x@example.com"}));
    assert_eq!(all[1]["idempotency_key"], "key-1");
    assert_eq!(all[1]["status"], 201);
    assert_eq!(all[2]["body"], "not json");
    assert_eq!(all[2]["status"], 400);

    let (_, filtered) = get(&crm.url, "/_requests?path=/accounts").await;
    let seqs: Vec<u64> = filtered
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|r| r["seq"].as_u64())
        .collect();
    assert_eq!(seqs, [2, 3]);
    assert_eq!(crm.state.requests(Some("/customers/lookup")).len(), 1);
    crm.stop().await;
}

#[tokio::test]
async fn fail_503_answers_without_effect() {
    let crm = start_crm().await;
    arm(&crm.url, "/accounts", "fail_503", 1).await;
    let (status, body) = post(&crm.url, "/accounts", Some("k"), ALICE).await;
    assert_eq!(status, 503, "{body}");
    assert!(accounts(&crm.url).await.is_empty());
    // Used up after one request; the retry with the same key creates it once.
    let (status, body) = post(&crm.url, "/accounts", Some("k"), ALICE).await;
    assert_eq!((status, body), (201, json!({"account_id": "acct_000001"})));
    let log = crm.state.requests(Some("/accounts"));
    assert_eq!(log[0].fault, Some(FaultAction::Fail503));
    assert_eq!(log[0].status, Some(503));
    assert_eq!(log[1].fault, None);
    crm.stop().await;
}

#[tokio::test]
async fn fail_500_after_effect_applies_then_fails_and_the_key_replays() {
    let crm = start_crm().await;
    arm(&crm.url, "/accounts", "fail_500_after_effect", 1).await;
    let (status, body) = post(&crm.url, "/accounts", Some("k"), ALICE).await;
    assert_eq!(status, 500, "{body}");
    let created = accounts(&crm.url).await;
    assert_eq!(created.len(), 1, "the effect happened despite the 500");
    let (status, body) = post(&crm.url, "/accounts", Some("k"), ALICE).await;
    assert_eq!(status, 201);
    assert_eq!(body["account_id"], created[0]["account_id"]);
    assert_eq!(accounts(&crm.url).await.len(), 1);
    crm.stop().await;
}

#[tokio::test]
async fn faults_apply_the_given_number_of_times_and_can_be_cleared() {
    let crm = start_crm().await;
    arm(&crm.url, "/customers/lookup", "fail_503", 2).await;
    arm(&crm.url, "/accounts", "fail_503", 5).await;
    let lookup = r#"{"email": "known@example.com"}"#;
    assert_eq!(
        post(&crm.url, "/customers/lookup", None, lookup).await.0,
        503
    );
    assert_eq!(
        post(&crm.url, "/customers/lookup", None, lookup).await.0,
        503
    );
    assert_eq!(
        post(&crm.url, "/customers/lookup", None, lookup).await.0,
        200
    );

    let (_, faults) = get(&crm.url, "/_faults").await;
    assert_eq!(
        faults["faults"],
        json!([{"path": "/accounts", "action": "fail_503", "times": 5}])
    );
    let response = client()
        .delete(format!("{}/_faults", crm.url))
        .send()
        .await
        .expect("send");
    assert_eq!(
        response.json::<Value>().await.expect("json"),
        json!({"cleared": 1})
    );
    assert_eq!(post(&crm.url, "/accounts", None, ALICE).await.0, 201);

    // Invalid faults are refused.
    for bad in [
        json!({"path": "/accounts", "action": "explode", "times": 1}),
        json!({"path": "/accounts", "action": "fail_503", "times": 0}),
        json!({"path": "/_state", "action": "fail_503"}),
        json!({"action": "fail_503"}),
    ] {
        let (status, body) = post(&crm.url, "/_faults", None, &bad.to_string()).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert_eq!(body["error"], "invalid_fault");
    }
    crm.stop().await;
}

/// Sends a request that is expected to hang, on its own client so no pooled
/// connection is shared with other requests.
fn spawn_hanging(url: &str, key: &str) -> tokio::task::JoinHandle<reqwest::Result<(u16, Value)>> {
    let url = url.to_owned();
    let key = key.to_owned();
    tokio::spawn(async move { post_with(&client(), &url, "/accounts", Some(&key), ALICE).await })
}

#[tokio::test]
async fn hang_after_effect_applies_and_never_answers() {
    let crm = start_crm().await;
    arm(&crm.url, "/accounts", "hang_after_effect", 1).await;
    let hanging = spawn_hanging(&crm.url, "k");

    let (status, body) = get(&crm.url, "/_wait?path=/accounts&count=1&timeout_ms=10000").await;
    assert_eq!((status, body), (200, json!({"count": 1})));
    // The effect is visible as soon as /_wait answers.
    let created = accounts(&crm.url).await;
    assert_eq!(created.len(), 1);
    let log = crm.state.requests(Some("/accounts"));
    assert_eq!(
        (log[0].fault, log[0].status),
        (Some(FaultAction::HangAfterEffect), None)
    );

    // The server keeps serving other requests meanwhile; the reconcile lookup
    // finds the account the caller never heard about.
    let (status, found) = get(&crm.url, "/accounts/by-idempotency-key/k").await;
    assert_eq!(status, 200);
    assert_eq!(found["account_id"], created[0]["account_id"]);
    assert!(!hanging.is_finished());

    // Stopping the server closes the hung connection without an answer, and
    // the hung request does not hold up the shutdown.
    crm.stop().await;
    let outcome = hanging.await.expect("task");
    assert!(
        outcome.is_err(),
        "a hung request must never be answered: {outcome:?}"
    );
}

#[tokio::test]
async fn hang_before_effect_records_without_effect() {
    let crm = start_crm().await;
    arm(&crm.url, "/accounts", "hang_before_effect", 1).await;
    let hanging = spawn_hanging(&crm.url, "k");

    assert_eq!(
        crm.state
            .wait_for_requests(Some("/accounts"), 1, std::time::Duration::from_secs(10))
            .await,
        Ok(1)
    );
    assert!(accounts(&crm.url).await.is_empty());
    let log = crm.state.requests(Some("/accounts"));
    assert_eq!(
        (log[0].fault, log[0].status),
        (Some(FaultAction::HangBeforeEffect), None)
    );
    assert_eq!(log[0].idempotency_key.as_deref(), Some("k"));
    assert_eq!(get(&crm.url, "/accounts/by-idempotency-key/k").await.0, 404);

    // The fault is used up: a retry with the same key does the work once.
    let (status, body) = post(&crm.url, "/accounts", Some("k"), ALICE).await;
    assert_eq!((status, body), (201, json!({"account_id": "acct_000001"})));

    crm.stop().await;
    assert!(hanging.await.expect("task").is_err());
}

#[tokio::test]
async fn wait_answers_once_the_count_is_reached() {
    let crm = start_crm().await;
    let url = crm.url.clone();
    let waiter =
        tokio::spawn(
            async move { get(&url, "/_wait?path=/accounts&count=2&timeout_ms=30000").await },
        );
    // Requests to other paths do not count.
    post(&crm.url, "/customers/lookup", None, r#"{"email": "a@b.c"}"#).await;
    post(&crm.url, "/accounts", None, ALICE).await;
    post(&crm.url, "/accounts", None, ALICE).await;
    let (status, body) = waiter.await.expect("task");
    assert_eq!(status, 200);
    assert!(body["count"].as_u64().is_some_and(|n| n >= 2), "{body}");

    // Already reached: answers immediately; no path means any path.
    assert_eq!(
        get(&crm.url, "/_wait?count=3").await,
        (200, json!({"count": 3}))
    );
    crm.stop().await;
}

#[tokio::test]
async fn wait_times_out_with_408() {
    let crm = start_crm().await;
    post(&crm.url, "/accounts", None, ALICE).await;
    let (status, body) = get(&crm.url, "/_wait?path=/accounts&count=2&timeout_ms=50").await;
    assert_eq!(status, 408, "{body}");
    assert_eq!(body["count"], 1);
    assert_eq!(body["error"], "timeout");
    let (status, body) = get(&crm.url, "/_wait?count=abc").await;
    assert_eq!((status, &body["error"]), (400, &json!("invalid_query")));
    crm.stop().await;
}

#[tokio::test]
async fn stopping_releases_pending_waits() {
    let crm = start_crm().await;
    let url = crm.url.clone();
    let waiter = tokio::spawn(async move {
        client()
            .get(format!(
                "{url}/_wait?path=/accounts&count=1&timeout_ms=600000"
            ))
            .send()
            .await
    });
    // `/_wait` is not observable from outside until it answers, so look at the
    // state's waiter count (no sleeping: yield until the server task got there).
    while crm.state.pending_waits() == 0 {
        tokio::task::yield_now().await;
    }
    // The shutdown must complete rather than wait ten minutes, and the
    // long-poll gets an answer saying why.
    crm.stop().await;
    let response = waiter.await.expect("task").expect("response");
    assert_eq!(response.status(), 503);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["error"], "stopping");
}

#[tokio::test]
async fn clients_giving_up_on_hung_requests_do_not_disturb_the_server() {
    let crm = start_crm().await;
    arm(&crm.url, "/accounts", "hang_after_effect", 2).await;
    let first = spawn_hanging(&crm.url, "k1");
    let second = spawn_hanging(&crm.url, "k2");
    assert_eq!(get(&crm.url, "/_wait?path=/accounts&count=2").await.0, 200);
    // The caller dies (like a killed worker): its connection closes.
    first.abort();
    assert!(first.await.expect_err("aborted").is_cancelled());
    // Both effects happened, the server still answers, and it stops promptly
    // with the other request still hung.
    assert_eq!(accounts(&crm.url).await.len(), 2);
    assert_eq!(post(&crm.url, "/accounts", None, ALICE).await.0, 201);
    crm.stop().await;
    assert!(second.await.expect("task").is_err());
}
