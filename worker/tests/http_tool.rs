//! HTTP tool execution against in-process servers: request shape per method,
//! headers, result decoding, and the failure class of every way a call fails;
//! auth (bearer, api_key, custom, oauth2_client with its token cache),
//! `{{config.NAME}}` placeholders, query parameters and bodies.
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::routing::any;
use belay_proto::v1::FailureClass;
use belay_proto::wire::{
    BodyMode, BodyType, HttpAuth, HttpBinding, HttpRequestOptions, QueryParam, ToolBinding,
    ToolCallSpec,
};
use belay_worker::oauth2::Clock;
use belay_worker::placeholders::ConfigValues;
use belay_worker::ssrf::{AddressRefused, RangeKind, parse_cidr};
use belay_worker::{HttpToolClient, HttpToolError, NetworkPolicy};
use serde_json::{Value, json};

#[derive(Debug, Clone)]
struct Seen {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
}

type SeenLog = Arc<Mutex<Vec<Seen>>>;

/// A tool server that records every request and answers `status` with `body`.
async fn tool_server(status: u16, body: &'static str) -> (String, SeenLog) {
    server_at("127.0.0.1", status, HeaderMap::new(), body).await
}

/// A server on `ip` (any loopback address works on Linux) that records every
/// request and answers `status` with `headers` and `body`.
async fn server_at(
    ip: &str,
    status: u16,
    headers: HeaderMap,
    body: &'static str,
) -> (String, SeenLog) {
    let seen: SeenLog = Arc::default();
    let router = Router::new().fallback(any({
        let seen = Arc::clone(&seen);
        move |method: Method, uri: Uri, request_headers: HeaderMap, body_in: Bytes| async move {
            seen.lock().unwrap().push(Seen {
                method,
                uri,
                headers: request_headers,
                body: body_in,
            });
            (StatusCode::from_u16(status).unwrap(), headers, body)
        }
    }));
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (format!("http://{addr}"), seen)
}

/// A client that may reach this machine (the tool servers here are local).
fn local_client(base_url: Option<String>) -> HttpToolClient {
    HttpToolClient::new(base_url, NetworkPolicy::allowing_loopback()).unwrap()
}

fn spec(endpoint: &str, method: &str, arguments: Value) -> ToolCallSpec {
    ToolCallSpec {
        tool: "t".into(),
        tool_version: 1,
        arguments,
        binding: ToolBinding::Http(HttpBinding {
            endpoint: endpoint.into(),
            method: method.into(),
            headers: BTreeMap::from([("X-Api-Version".to_owned(), "2".to_owned())]),
            timeout_ms: 5_000,
            request: Default::default(),
        }),
        idempotency_key: "run-1/call-7".into(),
        input: None,
        config_params: Vec::new(),
        result_secrets: Vec::new(),
        variant: None,
        sampling: None,
        trace: None,
        dispatch_with_claim: false,
        repeat_safety: String::new(),
    }
}

/// The HTTP binding of `spec`.
fn http_mut(spec: &mut ToolCallSpec) -> &mut HttpBinding {
    let ToolBinding::Http(binding) = &mut spec.binding else {
        panic!("an http binding")
    };
    binding
}

fn with_timeout(mut spec: ToolCallSpec, timeout_ms: u64) -> ToolCallSpec {
    http_mut(&mut spec).timeout_ms = timeout_ms;
    spec
}

fn sorted_query(uri: &Uri) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> = uri
        .query()
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap();
            (k.to_owned(), v.to_owned())
        })
        .collect();
    pairs.sort();
    pairs
}

#[tokio::test]
async fn get_fills_encoded_path_params_and_sends_the_rest_as_query() {
    let (base, seen) = tool_server(200, r#"{"id": 1}"#).await;
    let client = local_client(Some(format!("{base}/api/")));
    let result = client
        .call(&spec(
            "/users/{user}/docs/{n}",
            "GET",
            json!({"user": "ann/ø x", "n": 3, "tags": ["a", "b c"], "limit": 10, "skip": null}),
        ))
        .await
        .unwrap();
    assert_eq!(result, json!({"id": 1}));

    let seen = seen.lock().unwrap();
    let req = &seen[0];
    assert_eq!(req.method, Method::GET);
    assert_eq!(req.uri.path(), "/api/users/ann%2F%C3%B8%20x/docs/3");
    assert_eq!(
        sorted_query(&req.uri),
        vec![
            ("limit".into(), "10".into()),
            ("tags".into(), "a".into()),
            ("tags".into(), "b+c".into()),
        ]
    );
    assert!(req.body.is_empty());
    assert_eq!(req.headers["idempotency-key"], "run-1/call-7");
    assert_eq!(req.headers["x-api-version"], "2");
}

#[tokio::test]
async fn post_sends_the_remaining_arguments_as_json_body() {
    let (base, seen) = tool_server(201, r#"{"created": true}"#).await;
    let client = local_client(None);
    let result = client
        .call(&spec(
            &format!("{base}/accounts/{{id}}/transfers"),
            "POST",
            json!({"id": 42, "amount": 10.5, "memo": "rent"}),
        ))
        .await
        .unwrap();
    assert_eq!(result, json!({"created": true}));

    let seen = seen.lock().unwrap();
    let req = &seen[0];
    assert_eq!(req.method, Method::POST);
    assert_eq!(req.uri.path(), "/accounts/42/transfers");
    assert_eq!(req.uri.query(), None);
    assert_eq!(req.headers["content-type"], "application/json");
    assert_eq!(req.headers["idempotency-key"], "run-1/call-7");
    let body: Value = serde_json::from_slice(&req.body).unwrap();
    assert_eq!(body, json!({"amount": 10.5, "memo": "rent"}));
}

#[tokio::test]
async fn put_and_patch_send_a_body_delete_sends_a_query() {
    for (method, body_expected) in [("PUT", true), ("PATCH", true), ("DELETE", false)] {
        let (base, seen) = tool_server(200, "").await;
        let client = local_client(Some(base));
        client
            .call(&spec("/items", method, json!({"k": "v"})))
            .await
            .unwrap();
        let seen = seen.lock().unwrap();
        let req = &seen[0];
        assert_eq!(req.method.as_str(), method);
        if body_expected {
            assert_eq!(req.body.as_ref(), br#"{"k":"v"}"#);
            assert_eq!(req.uri.query(), None);
        } else {
            assert!(req.body.is_empty());
            assert_eq!(req.uri.query(), Some("k=v"));
        }
    }
}

#[tokio::test]
async fn idempotency_key_wins_over_a_binding_header() {
    let (base, seen) = tool_server(200, "{}").await;
    let client = local_client(Some(base));
    let mut spec = spec("/x", "POST", json!({}));
    http_mut(&mut spec)
        .headers
        .insert("Idempotency-Key".into(), "forged".into());
    client.call(&spec).await.unwrap();
    let seen = seen.lock().unwrap();
    let values: Vec<_> = seen[0].headers.get_all("idempotency-key").iter().collect();
    assert_eq!(values, vec!["run-1/call-7"]);
}

#[tokio::test]
async fn non_json_body_is_a_string_and_empty_body_is_null() {
    let (base, _) = tool_server(200, "plain words").await;
    let client = local_client(Some(base));
    let value = client.call(&spec("/x", "GET", json!({}))).await.unwrap();
    assert_eq!(value, json!("plain words"));

    let (base, _) = tool_server(204, "").await;
    let client = local_client(Some(base));
    let value = client.call(&spec("/x", "POST", json!({}))).await.unwrap();
    assert_eq!(value, Value::Null);
}

#[tokio::test]
async fn relative_endpoint_without_base_url_is_rejected_before_any_request() {
    let client = local_client(None);
    let err = client.prepare(&spec("/x", "GET", json!({}))).unwrap_err();
    assert!(matches!(err, HttpToolError::Config(_)), "{err:?}");
    assert_eq!(err.class(), FailureClass::Rejected);
}

#[tokio::test]
async fn connection_refused_is_not_sent() {
    let client = local_client(None);
    let url = format!("http://{}/x", common::closed_port());
    let err = client
        .call(&spec(&url, "POST", json!({})))
        .await
        .unwrap_err();
    assert!(matches!(err, HttpToolError::Connect(_)), "{err:?}");
    assert_eq!(err.class(), FailureClass::NotSent);
}

#[tokio::test]
async fn server_error_on_post_may_have_acted_but_on_get_was_not_sent() {
    let (base, _) = tool_server(503, "down for maintenance").await;
    let client = local_client(Some(base));

    let err = client
        .call(&spec("/x", "POST", json!({})))
        .await
        .unwrap_err();
    assert!(
        matches!(err, HttpToolError::Status { status: 503, .. }),
        "{err:?}"
    );
    assert_eq!(err.class(), FailureClass::MayHaveActed);
    assert!(err.to_string().contains("down for maintenance"));

    let err = client
        .call(&spec("/x", "GET", json!({})))
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::NotSent);
}

#[tokio::test]
async fn client_error_is_rejected_with_status_and_body() {
    let (base, _) = tool_server(422, r#"{"error": "amount must be positive"}"#).await;
    let client = local_client(Some(base));
    let err = client
        .call(&spec("/x", "POST", json!({"amount": -1})))
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::Rejected);
    let text = err.to_string();
    assert!(text.contains("422"), "{text}");
    assert!(text.contains("amount must be positive"), "{text}");
}

#[tokio::test]
async fn too_many_requests_is_not_sent() {
    let (base, _) = tool_server(429, "slow down").await;
    let client = local_client(Some(base));
    let err = client
        .call(&spec("/x", "POST", json!({})))
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::NotSent);
}

#[tokio::test]
async fn timeout_may_have_acted() {
    let router = Router::new().fallback(any(std::future::pending::<&'static str>));
    let base = format!("http://{}", common::serve(router).await);
    let client = local_client(Some(base));
    let err = client
        .call(&with_timeout(spec("/x", "GET", json!({})), 200))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            HttpToolError::Timeout {
                timeout_ms: 200,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.class(), FailureClass::MayHaveActed);
}

#[tokio::test]
async fn connection_closed_after_sending_may_have_acted() {
    let base = format!("http://{}", common::hang_up_server().await);
    let client = local_client(Some(base));
    let err = client
        .call(&spec("/x", "POST", json!({"a": 1})))
        .await
        .unwrap_err();
    assert!(matches!(err, HttpToolError::Transport(_)), "{err:?}");
    assert_eq!(err.class(), FailureClass::MayHaveActed);
}

fn webhook_spec(endpoint: &str, method: &str, field: &str, arguments: Value) -> ToolCallSpec {
    ToolCallSpec {
        tool: "kyc".into(),
        tool_version: 1,
        arguments,
        binding: ToolBinding::AsyncWebhook(belay_proto::wire::AsyncWebhookBinding {
            http: HttpBinding {
                endpoint: endpoint.into(),
                method: method.into(),
                headers: BTreeMap::new(),
                timeout_ms: 5_000,
                request: Default::default(),
            },
            callback_url_field: field.into(),
        }),
        idempotency_key: "run-1/call-8".into(),
        input: None,
        config_params: Vec::new(),
        result_secrets: Vec::new(),
        variant: None,
        sampling: None,
        trace: None,
        dispatch_with_claim: false,
        repeat_safety: String::new(),
    }
}

#[tokio::test]
async fn an_async_webhook_carries_its_callback_url_at_the_dot_path() {
    let (base, seen) = tool_server(202, r#"{"check_id": "kyc_1", "status": "pending"}"#).await;
    let client = local_client(None);
    let mut request = client
        .prepare(&webhook_spec(
            &format!("{base}/kyc/checks"),
            "POST",
            "meta.reply_to",
            json!({"email": "a@x.io", "meta": {"source": "belay"}}),
        ))
        .unwrap();
    assert!(request.wants_callback_url());
    request
        .set_callback_url("http://engine:50053/callbacks/v1/abc")
        .unwrap();
    let accepted = client.execute(request).await.unwrap();
    assert_eq!(accepted, json!({"check_id": "kyc_1", "status": "pending"}));
    let seen = seen.lock().unwrap();
    let body: Value = serde_json::from_slice(&seen[0].body).unwrap();
    // Objects on the path are kept and extended; the URL goes in as a string.
    assert_eq!(
        body,
        json!({"email": "a@x.io", "meta": {"source": "belay", "reply_to": "http://engine:50053/callbacks/v1/abc"}})
    );
    assert_eq!(seen[0].headers["idempotency-key"], "run-1/call-8");
}

#[tokio::test]
async fn an_async_webhook_that_cannot_carry_its_url_is_refused_before_dispatch() {
    let client = local_client(Some("http://127.0.0.1:9".into()));
    // A value on the path that is not an object.
    let err = client
        .prepare(&webhook_spec(
            "/k",
            "POST",
            "meta.reply_to",
            json!({"meta": "x"}),
        ))
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::Rejected);
    assert!(
        err.to_string()
            .contains("`meta` is a string, not an object"),
        "{err}"
    );
    // A method without a body.
    let err = client
        .prepare(&webhook_spec("/k", "GET", "callbackUrl", json!({})))
        .unwrap_err();
    assert!(err.to_string().contains("POST, PUT or PATCH"), "{err}");
    // A plain HTTP request takes no callback URL.
    let mut plain = client.prepare(&spec("/k", "POST", json!({}))).unwrap();
    assert!(!plain.wants_callback_url());
    assert!(plain.set_callback_url("http://x/").is_err());
}

// --- Where tool requests may go (worker/src/ssrf.rs) ---

fn refusal(err: &HttpToolError) -> &AddressRefused {
    match err {
        HttpToolError::Refused(refused) => refused,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn loopback_is_refused_without_an_allowlist_and_the_server_sees_nothing() {
    let (base, seen) = tool_server(200, "{}").await;
    let client = HttpToolClient::new(None, NetworkPolicy::default()).unwrap();
    let spec = spec(&format!("{base}/x"), "POST", json!({}));

    // An IP literal is refused when the request is built: before dispatch.
    let err = client.prepare(&spec).unwrap_err();
    assert_eq!(err.class(), FailureClass::Rejected);
    let refused = refusal(&err);
    assert_eq!(refused.range.kind, RangeKind::Loopback);
    assert!(!refused.resolved);
    let message = err.to_string();
    for part in [
        "tool request to 127.0.0.1 refused",
        "loopback 127.0.0.1",
        "--allow-private-network 127.0.0.1/32",
    ] {
        assert!(message.contains(part), "{part:?} not in {message}");
    }

    let err = client.call(&spec).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::Rejected);
    assert!(seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn loopback_is_reached_when_allowlisted() {
    let (base, seen) = tool_server(200, r#"{"ok": true}"#).await;
    let policy = NetworkPolicy::new(vec![parse_cidr("127.0.0.0/8").unwrap()]);
    let client = HttpToolClient::new(Some(base), policy).unwrap();
    let value = client.call(&spec("/x", "POST", json!({}))).await.unwrap();
    assert_eq!(value, json!({"ok": true}));
    assert_eq!(seen.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_name_resolving_to_loopback_is_refused_after_resolution() {
    let (base, seen) = tool_server(200, "{}").await;
    let port = base.rsplit(':').next().unwrap();
    let url = format!("http://localhost:{port}/x");
    let client = HttpToolClient::new(None, NetworkPolicy::default()).unwrap();
    // A name cannot be judged before it is resolved, so it passes `prepare`…
    let request = client.prepare(&spec(&url, "POST", json!({}))).unwrap();
    // …and is refused when resolved, before any connection.
    let err = client.execute(request).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::Rejected);
    let refused = refusal(&err);
    assert!(refused.resolved);
    assert_eq!(refused.host, "localhost");
    assert_eq!(refused.range.kind, RangeKind::Loopback);
    assert!(
        err.to_string()
            .contains("tool request to localhost refused: it resolves to loopback"),
        "{err}"
    );
    assert!(seen.lock().unwrap().is_empty());

    // Allowlisted, the same name is reached.
    local_client(None)
        .call(&spec(&url, "POST", json!({})))
        .await
        .unwrap();
    assert_eq!(seen.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_redirect_to_a_refused_address_is_not_followed() {
    // The tool server may be reached (127.0.0.1); its redirect target may
    // not (127.0.0.2).
    let (target, target_seen) = tool_server_on_second_loopback().await;
    let policy = NetworkPolicy::new(vec![parse_cidr("127.0.0.1").unwrap()]);
    let client = HttpToolClient::new(None, policy).unwrap();
    for (status, method, class) in [
        (302, "GET", FailureClass::Rejected),
        (307, "POST", FailureClass::MayHaveActed),
    ] {
        let mut headers = HeaderMap::new();
        headers.insert("location", format!("{target}/latest").parse().unwrap());
        let (base, seen) = server_at("127.0.0.1", status, headers, "").await;
        let err = client
            .call(&spec(&format!("{base}/x"), method, json!({})))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, HttpToolError::Redirect { status: s, .. } if *s == status),
            "{err:?}"
        );
        assert_eq!(err.class(), class, "{method} {status}");
        assert_eq!(err.status_code(), Some(status));
        let message = err.to_string();
        assert!(
            message.contains(&format!("a redirect to {target}/latest")),
            "{message}"
        );
        assert!(message.contains("do not follow redirects"), "{message}");
        assert_eq!(seen.lock().unwrap().len(), 1);
    }
    assert!(target_seen.lock().unwrap().is_empty());
}

/// A tool server on 127.0.0.2, which a policy allowing 127.0.0.1 refuses.
async fn tool_server_on_second_loopback() -> (String, SeenLog) {
    server_at("127.0.0.2", 200, HeaderMap::new(), "{}").await
}

#[tokio::test]
async fn metadata_and_mapped_loopback_literals_are_refused_without_a_connection() {
    let (base, seen) = tool_server(200, "{}").await;
    let port = base.rsplit(':').next().unwrap();
    let client = HttpToolClient::new(None, NetworkPolicy::default()).unwrap();
    for (url, kind, address) in [
        (
            "http://169.254.169.254/latest/meta-data/".to_owned(),
            RangeKind::LinkLocal,
            "169.254.169.254",
        ),
        (
            format!("http://[::ffff:127.0.0.1]:{port}/x"),
            RangeKind::Loopback,
            "::ffff:127.0.0.1",
        ),
        // The URL parser reads a number as an IPv4 address.
        (
            format!("http://2130706433:{port}/x"),
            RangeKind::Loopback,
            "127.0.0.1",
        ),
    ] {
        // `prepare` does no I/O: the refusal comes before any connection.
        let err = client.prepare(&spec(&url, "GET", json!({}))).unwrap_err();
        let refused = refusal(&err);
        assert_eq!(refused.range.kind, kind, "{url}");
        assert_eq!(refused.address.to_string(), address, "{url}");
        assert_eq!(err.class(), FailureClass::Rejected);
        // An async webhook too.
        let err = client
            .prepare(&webhook_spec(&url, "POST", "reply_to", json!({})))
            .unwrap_err();
        assert_eq!(refusal(&err).range.kind, kind, "{url}");
    }
    assert!(seen.lock().unwrap().is_empty());
}

// ---- Auth, `{{config.NAME}}` placeholders, query parameters and bodies ----

const SECRET: &str = "s3cret-value";

fn config_values() -> ConfigValues {
    ConfigValues::new(BTreeMap::from([
        ("TOKEN".to_owned(), SECRET.to_owned()),
        ("KEY".to_owned(), "k-123".to_owned()),
        ("CLIENT_SECRET".to_owned(), "cs-456".to_owned()),
    ]))
}

fn configured_client(base_url: Option<String>) -> HttpToolClient {
    local_client(base_url).with_config_values(config_values())
}

/// `spec` with `options` and no binding headers.
fn spec_with(
    endpoint: &str,
    method: &str,
    arguments: Value,
    options: HttpRequestOptions,
) -> ToolCallSpec {
    let mut spec = spec(endpoint, method, arguments);
    let binding = http_mut(&mut spec);
    binding.headers.clear();
    binding.request = options;
    spec
}

fn auth(auth: HttpAuth) -> HttpRequestOptions {
    HttpRequestOptions {
        auth,
        ..HttpRequestOptions::default()
    }
}

#[tokio::test]
async fn bearer_api_key_and_custom_auth_headers_reach_the_server_resolved() {
    let (base, seen) = tool_server(200, "{}").await;
    let client = configured_client(Some(base));
    let cases = [
        auth(HttpAuth::Bearer {
            token: "{{config.TOKEN}}".into(),
        }),
        auth(HttpAuth::ApiKey {
            header_name: "X-API-Key".into(),
            key: "{{ config.KEY }}".into(),
        }),
        auth(HttpAuth::Custom {
            headers: BTreeMap::from([
                ("X-Tenant".to_owned(), "acme".to_owned()),
                ("X-Signature".to_owned(), "sig={{config.TOKEN}}".to_owned()),
            ]),
        }),
    ];
    for options in cases {
        client
            .call(&spec_with("/x", "GET", json!({}), options))
            .await
            .unwrap();
    }
    // A `{{config.NAME}}` in a plain binding header is resolved too.
    let mut with_header = spec_with("/x", "GET", json!({}), HttpRequestOptions::default());
    http_mut(&mut with_header)
        .headers
        .insert("X-Key".into(), "{{config.KEY}}".into());
    client.call(&with_header).await.unwrap();

    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 4);
    assert_eq!(
        seen[0].headers["authorization"],
        format!("Bearer {SECRET}").as_str()
    );
    assert_eq!(seen[1].headers["x-api-key"], "k-123");
    assert!(seen[1].headers.get("authorization").is_none());
    assert_eq!(seen[2].headers["x-tenant"], "acme");
    assert_eq!(
        seen[2].headers["x-signature"],
        format!("sig={SECRET}").as_str()
    );
    assert_eq!(seen[3].headers["x-key"], "k-123");
}

#[tokio::test]
async fn an_unresolvable_placeholder_is_not_sent_and_names_only_the_placeholder() {
    let (base, seen) = tool_server(200, "{}").await;
    let client = configured_client(Some(base));
    for options in [
        auth(HttpAuth::Bearer {
            token: "{{config.MISSING_TOKEN}}".into(),
        }),
        auth(HttpAuth::Oauth2Client {
            token_url: "http://127.0.0.1:9/token".into(),
            client_id: "id".into(),
            client_secret: "{{config.MISSING_TOKEN}}".into(),
            scopes: String::new(),
        }),
    ] {
        let err = client
            .prepare(&spec_with("/x", "POST", json!({}), options))
            .unwrap_err();
        assert!(
            matches!(&err, HttpToolError::Unconfigured { name, .. } if name == "MISSING_TOKEN"),
            "{err:?}"
        );
        assert_eq!(err.class(), FailureClass::NotSent);
        let message = err.to_string();
        assert!(message.contains("{{config.MISSING_TOKEN}}"), "{message}");
        assert!(
            message.contains("BELAY_TOOL_CONFIG_MISSING_TOKEN"),
            "{message}"
        );
    }
    // A client without any configuration never sends a placeholder as it is.
    let bare = local_client(None);
    let err = bare
        .call(&spec_with(
            "http://127.0.0.1:9/x",
            "GET",
            json!({}),
            auth(HttpAuth::Bearer {
                token: "{{config.TOKEN}}".into(),
            }),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::NotSent);
    assert!(seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn secrets_appear_in_no_error_and_no_debug_output() {
    let (base, _seen) = tool_server(401, "unauthorized").await;
    let client = configured_client(Some(base));
    let spec = spec_with(
        "/x",
        "GET",
        json!({}),
        auth(HttpAuth::Bearer {
            token: "{{config.TOKEN}}".into(),
        }),
    );
    let prepared = client.prepare(&spec).unwrap();
    assert!(!format!("{prepared:?}").contains(SECRET));
    let err = client.call(&spec).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::Rejected);
    assert!(!err.to_string().contains(SECRET), "{err}");
    assert!(!format!("{err:?}").contains(SECRET));
    assert!(!format!("{client:?}").contains(SECRET));
}

#[tokio::test]
async fn query_params_keep_order_repeat_keys_and_precede_the_remaining_arguments() {
    let (base, seen) = tool_server(200, "{}").await;
    let client = local_client(Some(base));
    let options = HttpRequestOptions {
        query_params: vec![
            QueryParam {
                key: "tag".into(),
                value: "{{first}}".into(),
            },
            QueryParam {
                key: "fixed".into(),
                value: "a b&c".into(),
            },
            QueryParam {
                key: "tag".into(),
                value: "{{second}}".into(),
            },
            QueryParam {
                key: "tag".into(),
                value: "{{many}}".into(),
            },
            QueryParam {
                key: "absent".into(),
                value: "x-{{nothing}}".into(),
            },
            QueryParam {
                key: "range".into(),
                value: "{{first}}..{{second}}".into(),
            },
        ],
        ..HttpRequestOptions::default()
    };
    let args = json!({"first": "z", "second": 2, "many": ["m1", "m2"], "rest": "r"});
    client
        .call(&spec_with("/s?v=1", "GET", args.clone(), options.clone()))
        .await
        .unwrap();
    let none = HttpRequestOptions {
        body_mode: BodyMode::None,
        ..options
    };
    client
        .call(&spec_with("/s", "GET", args, none))
        .await
        .unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(
        seen[0].uri.query(),
        Some("v=1&tag=z&fixed=a+b%26c&tag=2&tag=m1&tag=m2&range=z..2&rest=r")
    );
    // `body_mode: none`: the arguments no template names are not sent.
    assert_eq!(
        seen[1].uri.query(),
        Some("tag=z&fixed=a+b%26c&tag=2&tag=m1&tag=m2&range=z..2")
    );
}

#[tokio::test]
async fn form_text_and_json_bodies() {
    let (base, seen) = tool_server(200, "{}").await;
    let client = local_client(Some(base));
    let args = json!({"name": "Ann Lee", "tags": ["a", "b&c"], "age": 41, "note": null});
    let calls = [
        // Auto form body: every remaining argument, arrays repeat the key.
        HttpRequestOptions {
            body_type: BodyType::Form,
            ..HttpRequestOptions::default()
        },
        // Form template: each value form-encoded, so `&` stays inside it.
        HttpRequestOptions {
            body_type: BodyType::Form,
            body_template: Some("who={{name}}&t={{tags}}&n={{note}}".into()),
            ..HttpRequestOptions::default()
        },
        HttpRequestOptions {
            body_type: BodyType::Text,
            body_template: Some("Hello {{name}}, {{age}}!".into()),
            ..HttpRequestOptions::default()
        },
        // JSON template: a lone placeholder keeps the argument's type.
        HttpRequestOptions {
            body_template: Some(
                r#"{"customer": {"name": "{{name}}", "age": "{{age}}", "tags": "{{tags}}"}, "greeting": "hi {{name}}", "missing": "{{note}}", "n": 1}"#
                    .into(),
            ),
            ..HttpRequestOptions::default()
        },
    ];
    for options in calls {
        client
            .call(&spec_with("/b", "POST", args.clone(), options))
            .await
            .unwrap();
    }
    let seen = seen.lock().unwrap();
    let body = |i: usize| String::from_utf8(seen[i].body.to_vec()).unwrap();
    let content_type = |i: usize| seen[i].headers["content-type"].to_str().unwrap().to_owned();
    assert_eq!(content_type(0), "application/x-www-form-urlencoded");
    let mut pairs: Vec<&str> = body(0).leak().split('&').collect();
    pairs.sort_unstable();
    assert_eq!(pairs, ["age=41", "name=Ann%20Lee", "tags=a", "tags=b%26c"]);
    assert_eq!(body(1), r#"who=Ann%20Lee&t=%5B%22a%22%2C%22b%26c%22%5D&n="#);
    assert_eq!(content_type(2), "text/plain; charset=utf-8");
    assert_eq!(body(2), "Hello Ann Lee, 41!");
    assert_eq!(content_type(3), "application/json");
    assert_eq!(
        serde_json::from_str::<Value>(&body(3)).unwrap(),
        json!({
            "customer": {"name": "Ann Lee", "age": 41, "tags": ["a", "b&c"]},
            "greeting": "hi Ann Lee",
            "missing": null,
            "n": 1
        })
    );
}

/// An OAuth token endpoint that issues `tok-1`, `tok-2`, … (each valid for
/// `expires_in` seconds) and a tool server that refuses the tokens in
/// `revoked` with 401; both count their requests.
struct OAuthServers {
    token_url: String,
    tool_url: String,
    token_requests: Arc<Mutex<Vec<(HeaderMap, Bytes)>>>,
    tool_tokens: Arc<Mutex<Vec<String>>>,
}

async fn oauth_servers(expires_in: u64, revoked: &'static [&'static str]) -> OAuthServers {
    oauth_servers_with(json!(expires_in), revoked).await
}

/// [`oauth_servers`] whose token answers carry `expires_in` as given (any
/// JSON value).
async fn oauth_servers_with(expires_in: Value, revoked: &'static [&'static str]) -> OAuthServers {
    let token_requests: Arc<Mutex<Vec<(HeaderMap, Bytes)>>> = Arc::default();
    let token_router = Router::new().fallback(any({
        let log = Arc::clone(&token_requests);
        move |headers: HeaderMap, body: Bytes| {
            let expires_in = expires_in.clone();
            async move {
                let n = {
                    let mut log = log.lock().unwrap();
                    log.push((headers, body));
                    log.len()
                };
                // Slow enough that concurrent callers overlap with the fetch.
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                axum::Json(json!({
                    "access_token": format!("tok-{n}"),
                    "token_type": "Bearer",
                    "expires_in": expires_in
                }))
            }
        }
    }));
    let tool_tokens: Arc<Mutex<Vec<String>>> = Arc::default();
    let tool_router = Router::new().fallback(any({
        let log = Arc::clone(&tool_tokens);
        move |headers: HeaderMap| async move {
            let token = headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .trim_start_matches("Bearer ")
                .to_owned();
            log.lock().unwrap().push(token.clone());
            if revoked.contains(&token.as_str()) {
                (StatusCode::UNAUTHORIZED, "{}".to_owned())
            } else {
                (StatusCode::OK, json!({"token": token}).to_string())
            }
        }
    }));
    let token_addr = common::serve(token_router).await;
    let tool_addr = common::serve(tool_router).await;
    OAuthServers {
        token_url: format!("http://{token_addr}/oauth/token"),
        tool_url: format!("http://{tool_addr}/api"),
        token_requests,
        tool_tokens,
    }
}

fn oauth_spec(servers: &OAuthServers) -> ToolCallSpec {
    spec_with(
        &servers.tool_url,
        "POST",
        json!({}),
        auth(HttpAuth::Oauth2Client {
            token_url: servers.token_url.clone(),
            client_id: "my client".into(),
            client_secret: "{{config.CLIENT_SECRET}}".into(),
            scopes: "read write".into(),
        }),
    )
}

/// A clock that starts now and moves only when told.
fn manual_clock() -> (Clock, Arc<AtomicU64>) {
    let start = Instant::now();
    let offset_secs = Arc::new(AtomicU64::new(0));
    let clock = Clock::from_fn({
        let offset = Arc::clone(&offset_secs);
        move || start + std::time::Duration::from_secs(offset.load(Ordering::SeqCst))
    });
    (clock, offset_secs)
}

#[tokio::test]
async fn oauth2_client_fetches_one_token_for_concurrent_calls_and_again_after_expiry() {
    let servers = oauth_servers(60, &[]).await;
    let (clock, offset) = manual_clock();
    let client = configured_client(None).with_clock(clock);
    let spec = oauth_spec(&servers);
    let calls: Vec<_> = (0..5)
        .map(|_| {
            let client = client.clone();
            let spec = spec.clone();
            tokio::spawn(async move { client.call(&spec).await })
        })
        .collect();
    for call in calls {
        assert_eq!(call.await.unwrap().unwrap(), json!({"token": "tok-1"}));
    }
    assert_eq!(servers.token_requests.lock().unwrap().len(), 1);
    {
        let requests = servers.token_requests.lock().unwrap();
        let (headers, body) = &requests[0];
        // RFC 6749 §2.3.1: id and secret form-encoded, then Basic.
        assert_eq!(
            headers["authorization"],
            "Basic bXklMjBjbGllbnQ6Y3MtNDU2" // my%20client:cs-456
        );
        assert_eq!(headers["content-type"], "application/x-www-form-urlencoded");
        assert_eq!(
            body.as_ref(),
            b"grant_type=client_credentials&scope=read%20write"
        );
    }
    // Still fresh 29 s before expiry (the margin is 30 s)...
    offset.store(29, Ordering::SeqCst);
    client.call(&spec).await.unwrap();
    assert_eq!(servers.token_requests.lock().unwrap().len(), 1);
    // ...refreshed within it.
    offset.store(31, Ordering::SeqCst);
    assert_eq!(client.call(&spec).await.unwrap(), json!({"token": "tok-2"}));
    assert_eq!(servers.token_requests.lock().unwrap().len(), 2);
    assert!(
        servers
            .tool_tokens
            .lock()
            .unwrap()
            .iter()
            .all(|t| t.starts_with("tok-"))
    );
}

#[tokio::test]
async fn oauth2_client_refreshes_once_when_the_tool_answers_401() {
    let servers = oauth_servers(3600, &["tok-1"]).await;
    let client = configured_client(None);
    let spec = oauth_spec(&servers);
    assert_eq!(client.call(&spec).await.unwrap(), json!({"token": "tok-2"}));
    assert_eq!(servers.token_requests.lock().unwrap().len(), 2);
    assert_eq!(*servers.tool_tokens.lock().unwrap(), ["tok-1", "tok-2"]);

    // A tool that refuses every token: one refresh, then the 401 stands.
    let servers = oauth_servers(3600, &["tok-1", "tok-2", "tok-3"]).await;
    let err = client.call(&oauth_spec(&servers)).await.unwrap_err();
    assert_eq!(err.status_code(), Some(401));
    assert_eq!(servers.token_requests.lock().unwrap().len(), 2);
    assert_eq!(servers.tool_tokens.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn a_failing_token_endpoint_is_not_sent_and_the_tool_sees_nothing() {
    let (token_base, _) = tool_server(401, r#"{"error": "invalid_client"}"#).await;
    let (tool_base, seen) = tool_server(200, "{}").await;
    let client = configured_client(None);
    let err = client
        .call(&spec_with(
            &format!("{tool_base}/x"),
            "POST",
            json!({}),
            auth(HttpAuth::Oauth2Client {
                token_url: format!("{token_base}/token"),
                client_id: "id".into(),
                client_secret: "{{config.CLIENT_SECRET}}".into(),
                scopes: String::new(),
            }),
        ))
        .await
        .unwrap_err();
    assert!(matches!(err, HttpToolError::Auth(_)), "{err:?}");
    assert_eq!(err.class(), FailureClass::NotSent);
    let message = err.to_string();
    assert!(message.contains("invalid_client"), "{message}");
    assert!(!message.contains("cs-456"), "{message}");
    assert!(seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_token_endpoint_on_a_refused_address_is_refused_before_dispatch() {
    let client = HttpToolClient::new(None, NetworkPolicy::default())
        .unwrap()
        .with_config_values(config_values());
    let err = client
        .prepare(&spec_with(
            "https://tools.example.com/x",
            "POST",
            json!({}),
            auth(HttpAuth::Oauth2Client {
                token_url: "http://127.0.0.1:9/token".into(),
                client_id: "id".into(),
                client_secret: "{{config.CLIENT_SECRET}}".into(),
                scopes: String::new(),
            }),
        ))
        .unwrap_err();
    assert!(matches!(err, HttpToolError::Refused(_)), "{err:?}");
    assert_eq!(err.class(), FailureClass::Rejected);
}

/// A server answering 200 with `len` bytes of JSON string, with a
/// `Content-Length` (`chunked: false`) or as a chunked stream of 64 KiB
/// pieces that announces no length (`chunked: true`).
async fn large_body_server(len: usize, chunked: bool) -> String {
    let router = Router::new().fallback(any(move || async move {
        let mut text = vec![b'x'; len];
        text[0] = b'"';
        text[len - 1] = b'"';
        if chunked {
            let pieces: Vec<Result<Bytes, std::io::Error>> = text
                .chunks(64 * 1024)
                .map(|c| Ok(Bytes::copy_from_slice(c)))
                .collect();
            axum::body::Body::from_stream(futures_util::stream::iter(pieces))
        } else {
            axum::body::Body::from(text)
        }
    }));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    format!("http://{addr}")
}

#[tokio::test]
async fn an_answer_longer_than_the_cap_is_refused_with_or_without_a_length() {
    use belay_worker::http_tool::MAX_RESPONSE_BYTES;
    // Exactly at the cap: read whole.
    let url = large_body_server(MAX_RESPONSE_BYTES, false).await;
    let value = local_client(None)
        .call(&spec(&format!("{url}/big"), "GET", json!({})))
        .await
        .unwrap();
    assert_eq!(value.as_str().map(str::len), Some(MAX_RESPONSE_BYTES - 2));

    for chunked in [false, true] {
        let url = large_body_server(MAX_RESPONSE_BYTES + 1, chunked).await;
        for (method, class) in [
            ("GET", FailureClass::Rejected),
            ("POST", FailureClass::MayHaveActed),
        ] {
            let err = local_client(None)
                .call(&spec(&format!("{url}/big"), method, json!({})))
                .await
                .unwrap_err();
            let HttpToolError::ResponseTooLarge {
                method: m,
                status,
                limit,
                seen,
            } = &err
            else {
                panic!("expected ResponseTooLarge, got {err:?}");
            };
            assert_eq!(
                (m.as_str(), *status, *limit),
                (method, 200, MAX_RESPONSE_BYTES)
            );
            if chunked {
                assert!(seen.starts_with("read "), "{seen}");
            } else {
                assert_eq!(seen, &format!("Content-Length: {}", MAX_RESPONSE_BYTES + 1));
            }
            assert_eq!(err.class(), class, "{method} chunked={chunked}");
            assert!(err.to_string().contains("more than 4194304 bytes"), "{err}");
        }
    }
}

/// An `oauth2_client` spec calling `tool_url` with tokens from `token_url`.
fn token_spec(tool_url: &str, token_url: &str) -> ToolCallSpec {
    spec_with(
        tool_url,
        "POST",
        json!({}),
        auth(HttpAuth::Oauth2Client {
            token_url: token_url.to_owned(),
            client_id: "id".into(),
            client_secret: "{{config.CLIENT_SECRET}}".into(),
            scopes: String::new(),
        }),
    )
}

/// A token endpoint answering 200 with `padding` spaces, then a valid
/// token object: with a `Content-Length` (`announced`), or as a stream of
/// 1 MiB pieces made one at a time as the connection takes them, with no
/// length. Returns its URL and how many pieces it has made.
async fn padded_token_endpoint(padding: usize, announced: bool) -> (String, Arc<AtomicUsize>) {
    const PIECE: usize = 1 << 20;
    let made = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&made);
    let router = Router::new().fallback(any(move || {
        let made = Arc::clone(&counter);
        async move {
            let tail: &[u8] = br#"{"access_token":"t","token_type":"bearer"}"#;
            if announced {
                let mut body = vec![b' '; padding];
                body.extend_from_slice(tail);
                return axum::body::Body::from(body);
            }
            let pieces = futures_util::stream::unfold(0usize, move |sent| {
                let made = Arc::clone(&made);
                async move {
                    if sent > padding {
                        return None;
                    }
                    made.fetch_add(1, Ordering::SeqCst);
                    let piece = if sent == padding {
                        Bytes::from_static(tail)
                    } else {
                        Bytes::from(vec![b' '; PIECE.min(padding - sent)])
                    };
                    let next = if sent == padding {
                        padding + 1
                    } else {
                        sent + piece.len()
                    };
                    Some((Ok::<_, std::io::Error>(piece), next))
                }
            });
            axum::body::Body::from_stream(pieces)
        }
    }));
    let addr = common::serve(router).await;
    (format!("http://{addr}/token"), made)
}

#[tokio::test]
async fn a_token_answer_longer_than_the_cap_is_refused_without_reading_it_whole() {
    use belay_worker::oauth2::MAX_TOKEN_ANSWER_BYTES;
    const TAIL: usize = r#"{"access_token":"t","token_type":"bearer"}"#.len();
    let (tool, seen) = tool_server(200, "{}").await;
    let tool_url = format!("{tool}/x");
    let client = configured_client(None);

    // Exactly at the cap, streamed: read whole and used.
    let (token_url, _) = padded_token_endpoint(MAX_TOKEN_ANSWER_BYTES - TAIL, false).await;
    assert_eq!(
        client
            .call(&token_spec(&tool_url, &token_url))
            .await
            .unwrap(),
        json!({})
    );
    assert_eq!(seen.lock().unwrap().len(), 1);

    // 200 MiB streamed without a length: refused once past the cap, and
    // the connection dropped long before the end (what the endpoint made
    // is bounded by the sockets' buffers, a few MiB).
    let (token_url, made) = padded_token_endpoint(200 << 20, false).await;
    let err = client
        .call(&token_spec(&tool_url, &token_url))
        .await
        .unwrap_err();
    let HttpToolError::Auth(token_error) = &err else {
        panic!("{err:?}");
    };
    assert_eq!(token_error.token_url, token_url);
    assert_eq!(token_error.too_large, Some(MAX_TOKEN_ANSWER_BYTES));
    assert_eq!(err.class(), FailureClass::NotSent);
    let message = err.to_string();
    assert!(
        message.starts_with(&format!(
            "OAuth 2.0 token request to {token_url} failed: HTTP 200 with an answer of more than \
             65536 bytes (read "
        )),
        "{message}"
    );
    let made = made.load(Ordering::SeqCst);
    println!("the 200 MiB token endpoint made {made} MiB pieces");
    assert!(
        made < 50,
        "{made} of 201 pieces made: the answer was read on"
    );
    assert_eq!(seen.lock().unwrap().len(), 1, "the tool saw nothing");

    // One byte over, announced: refused before reading.
    let (token_url, _) = padded_token_endpoint(MAX_TOKEN_ANSWER_BYTES - TAIL + 1, true).await;
    let err = client
        .call(&token_spec(&tool_url, &token_url))
        .await
        .unwrap_err();
    let HttpToolError::Auth(token_error) = &err else {
        panic!("{err:?}");
    };
    assert_eq!(token_error.too_large, Some(MAX_TOKEN_ANSWER_BYTES));
    assert!(err.to_string().contains("(Content-Length: 65537)"), "{err}");
    assert_eq!(seen.lock().unwrap().len(), 1, "the tool saw nothing");
}

#[tokio::test]
async fn expires_in_may_be_a_numeric_string_and_anything_else_gets_the_default_lifetime() {
    use belay_worker::oauth2::DEFAULT_LIFETIME_SECS;
    for (expires_in, lifetime) in [
        (json!("3599"), 3599),
        (json!(" 120 "), 120),
        (json!(3599.5), 3599),
        (json!("soon"), DEFAULT_LIFETIME_SECS),
        (json!(true), DEFAULT_LIFETIME_SECS),
        (json!(null), DEFAULT_LIFETIME_SECS),
        (json!("-5"), DEFAULT_LIFETIME_SECS),
    ] {
        let servers = oauth_servers_with(expires_in.clone(), &[]).await;
        let (clock, offset) = manual_clock();
        let client = configured_client(None).with_clock(clock);
        let spec = oauth_spec(&servers);
        assert_eq!(
            client.call(&spec).await.unwrap(),
            json!({"token": "tok-1"}),
            "expires_in {expires_in}"
        );
        // Refreshed 30 s before it expires (the margin at these lifetimes).
        offset.store(lifetime - 31, Ordering::SeqCst);
        assert_eq!(
            client.call(&spec).await.unwrap(),
            json!({"token": "tok-1"}),
            "expires_in {expires_in}"
        );
        offset.store(lifetime - 29, Ordering::SeqCst);
        assert_eq!(
            client.call(&spec).await.unwrap(),
            json!({"token": "tok-2"}),
            "expires_in {expires_in}"
        );
        assert_eq!(servers.token_requests.lock().unwrap().len(), 2);
    }
}

#[tokio::test]
async fn a_token_answer_field_of_the_wrong_type_is_named() {
    let (tool, seen) = tool_server(200, "{}").await;
    for (answer, named) in [
        (
            r#"{"access_token": 5, "token_type": "bearer"}"#,
            "`access_token` in the answer is not a string",
        ),
        (
            r#"{"access_token": "t", "token_type": ["bearer"]}"#,
            "`token_type` in the answer is not a string",
        ),
        (r#"["t"]"#, "the answer is not a JSON object"),
    ] {
        let (token, _) = tool_server(200, answer).await;
        let err = configured_client(None)
            .call(&token_spec(&format!("{tool}/x"), &format!("{token}/token")))
            .await
            .unwrap_err();
        assert!(matches!(err, HttpToolError::Auth(_)), "{err:?}");
        assert!(err.to_string().contains(named), "{err}");
    }
    assert!(seen.lock().unwrap().is_empty());
}

/// A failing endpoint that streams an endless answer: the error quotes
/// its first 4 KiB and the rest is never read (nor held).
#[tokio::test]
async fn an_error_answer_is_quoted_from_its_start_and_never_read_whole() {
    let served = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&served);
    let router = Router::new().fallback(any(move || {
        let counter = Arc::clone(&counter);
        async move {
            // 1 GiB in 64 KiB pieces, produced only as they are read.
            let pieces =
                futures_util::StreamExt::map(futures_util::stream::iter(0..16 * 1024), move |_| {
                    counter.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, std::io::Error>(Bytes::from(vec![b'e'; 64 * 1024]))
                });
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                axum::body::Body::from_stream(pieces),
            )
        }
    }));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let err = local_client(None)
        .call(&spec(&format!("http://{addr}/fail"), "GET", json!({})))
        .await
        .unwrap_err();
    let HttpToolError::Status { status, body, .. } = &err else {
        panic!("expected Status, got {err:?}");
    };
    assert_eq!(*status, 500);
    assert!(
        body.starts_with("eeee") && body.ends_with("(the rest was not read)"),
        "{}",
        &body[body.len() - 60..]
    );
    assert!(body.len() < 4200, "{}", body.len());
    // Far fewer pieces than the 16 384 the server would send.
    let pieces = served.load(Ordering::SeqCst);
    assert!(pieces < 200, "{pieces} pieces were produced");
}
