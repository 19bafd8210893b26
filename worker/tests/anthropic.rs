//! The Anthropic Messages adapter against a local HTTP server playing the
//! Anthropic API: the request (headers, `system`, alternating roles,
//! `tool_use` / `tool_result` blocks, tools, `max_tokens`), the answer
//! (text, parallel `tool_use` blocks, usage, `stop_reason`), and the failure
//! class of every status (the transport failures, shared with OpenAI, are
//! checked for both providers in `model.rs`).
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use belay_proto::v1::FailureClass;
use belay_proto::wire::{ChatMessage, ModelCallSpec, ToolUse, Usage};
use belay_worker::model::anthropic::{
    DEFAULT_MAX_TOKENS, build_request, finish_reason, parse_response,
};
use belay_worker::{ModelClient, ModelError, ModelProvider};
use serde_json::{Value, json};

/// A turn with two parallel calls (one failed), then a call whose arguments
/// were not an object, then its refusal.
fn spec() -> ModelCallSpec {
    let call = |id: &str, arguments: &str| ToolUse {
        id: id.into(),
        name: "lookup".into(),
        arguments: arguments.into(),
    };
    let result = |id: &str, content: &str| ChatMessage::Tool {
        tool_call_id: id.into(),
        content: content.into(),
    };
    ModelCallSpec {
        model: "claude-test".into(),
        messages: vec![
            ChatMessage::System {
                content: "be brief".into(),
            },
            ChatMessage::User {
                content: "hello".into(),
            },
            ChatMessage::Assistant {
                content: Some("Looking both up.".into()),
                tool_calls: vec![
                    call("toolu_a", "{\"q\":\"x\"}"),
                    call("toolu_b", "{\"q\":\"y\"}"),
                ],
            },
            result("toolu_a", "{\"found\":true}"),
            result("toolu_b", "error: the CRM has no such account"),
            ChatMessage::Assistant {
                content: None,
                tool_calls: vec![call("toolu_c", "{\"q\": oops")],
            },
            result("toolu_c", "error: arguments are not valid JSON"),
        ],
        tools: vec![common::lookup_tool()],
        max_output_tokens: Some(256),
        trace: None,
    }
}

fn client(base_url: String, api_key: Option<&str>, timeout_ms: u64) -> ModelClient {
    common::model_client(ModelProvider::Anthropic, base_url, api_key, timeout_ms)
}

/// The answer of a turn that proposes two calls at once.
fn two_calls_answer() -> Value {
    json!({
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [
            {"type": "text", "text": "Checking "},
            {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "x"}},
            {"type": "text", "text": "both."},
            {"type": "tool_use", "id": "toolu_2", "name": "weather",
             "input": {"city": "Paris", "days": [1, 2]}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": null,
        "usage": {"input_tokens": 12, "output_tokens": 34},
    })
}

#[test]
fn request_maps_system_alternation_tool_blocks_and_tools() {
    let body = build_request(&spec());
    assert_eq!(
        body,
        json!({
            "model": "claude-test",
            "max_tokens": 256,
            "system": "be brief",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "hello"}]},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Looking both up."},
                    {"type": "tool_use", "id": "toolu_a", "name": "lookup", "input": {"q": "x"}},
                    {"type": "tool_use", "id": "toolu_b", "name": "lookup", "input": {"q": "y"}},
                ]},
                // Both results of the turn in one user message, in order.
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_a", "content": "{\"found\":true}"},
                    {"type": "tool_result", "tool_use_id": "toolu_b",
                     "content": "error: the CRM has no such account", "is_error": true},
                ]},
                // Arguments that are not a JSON object go as an empty input.
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "toolu_c", "name": "lookup", "input": {}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_c",
                     "content": "error: arguments are not valid JSON", "is_error": true},
                ]},
            ],
            "tools": [{
                "name": "lookup",
                "description": "Look something up",
                "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
            }],
        })
    );
}

#[test]
fn request_without_limit_tools_or_system_text_uses_the_defaults() {
    let spec = ModelCallSpec {
        model: "claude-test".into(),
        messages: vec![
            ChatMessage::System {
                content: String::new(),
            },
            ChatMessage::User {
                content: "hello".into(),
            },
            // A turn with nothing in it is left out; the user messages
            // around it become one.
            ChatMessage::Assistant {
                content: Some(String::new()),
                tool_calls: vec![],
            },
            ChatMessage::User {
                content: "again".into(),
            },
        ],
        tools: vec![],
        max_output_tokens: None,
        trace: None,
    };
    assert_eq!(
        build_request(&spec),
        json!({
            "model": "claude-test",
            "max_tokens": DEFAULT_MAX_TOKENS,
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "hello"},
                {"type": "text", "text": "again"},
            ]}],
        })
    );
}

#[test]
fn stop_reasons_map_to_finish_reasons() {
    for (stop_reason, expected) in [
        ("end_turn", "stop"),
        ("tool_use", "tool_calls"),
        ("max_tokens", "length"),
        ("model_context_window_exceeded", "length"),
        ("stop_sequence", "stop_sequence"),
        ("refusal", "refusal"),
        ("pause_turn", "pause_turn"),
    ] {
        assert_eq!(finish_reason(stop_reason), expected, "{stop_reason}");
    }
}

#[test]
fn a_turn_cut_off_by_max_tokens_is_length_with_its_calls_as_sent() {
    // The worker reports what the provider said; the engine decides that a
    // cut-off turn's calls never run.
    let body = json!({
        "content": [{"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {}}],
        "stop_reason": "max_tokens",
        "usage": {"input_tokens": 5, "output_tokens": 256},
    });
    let result = parse_response(body.to_string().as_bytes()).unwrap();
    assert_eq!(result.finish_reason.as_deref(), Some("length"));
    assert_eq!(result.content, None);
    assert_eq!(result.tool_calls.len(), 1);
    assert_eq!(result.usage.output_tokens, 256);
}

#[test]
fn usage_counts_prompt_cache_tokens_as_input() {
    let body = json!({
        "content": [{"type": "text", "text": "Hi."}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 10, "cache_creation_input_tokens": 200,
                  "cache_read_input_tokens": 3000, "output_tokens": 7},
    });
    let result = parse_response(body.to_string().as_bytes()).unwrap();
    assert_eq!(result.content.as_deref(), Some("Hi."));
    assert!(result.tool_calls.is_empty());
    assert_eq!(result.finish_reason.as_deref(), Some("stop"));
    assert_eq!(
        result.usage,
        Usage {
            input_tokens: 3210,
            output_tokens: 7
        }
    );
}

#[test]
fn other_blocks_are_skipped_and_a_missing_input_is_left_to_the_engine() {
    let body = json!({
        "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "sig"},
            {"type": "tool_use", "id": "toolu_1", "name": "lookup"},
        ],
        "stop_reason": "tool_use",
    });
    let result = parse_response(body.to_string().as_bytes()).unwrap();
    assert_eq!(result.content, None);
    assert_eq!(
        result.tool_calls,
        vec![ToolUse {
            id: "toolu_1".into(),
            name: "lookup".into(),
            arguments: String::new(),
        }]
    );
    assert_eq!(result.usage, Usage::default());
}

#[test]
fn unparseable_2xx_bodies_may_have_acted() {
    common::assert_unreadable(
        parse_response,
        &[
            b"<html>gateway</html>",
            b"{\"type\": \"message\"}",
            b"{\"content\": \"not blocks\"}",
        ],
    );
}

#[tokio::test]
async fn call_posts_headers_and_body_and_maps_parallel_tool_use() {
    let (addr, recorded) = common::recording_server("/v1/messages", two_calls_answer()).await;
    let client = client(format!("http://{addr}/v1/"), Some("sk-ant-test"), 5_000);
    assert!(client.endpoint().ends_with("/v1/messages"));
    let result = client.call(&spec()).await.unwrap();

    assert_eq!(result.content.as_deref(), Some("Checking both."));
    assert_eq!(
        result.tool_calls,
        vec![
            ToolUse {
                id: "toolu_1".into(),
                name: "lookup".into(),
                arguments: "{\"q\":\"x\"}".into(),
            },
            ToolUse {
                id: "toolu_2".into(),
                name: "weather".into(),
                arguments: "{\"city\":\"Paris\",\"days\":[1,2]}".into(),
            },
        ]
    );
    assert_eq!(
        result.usage,
        Usage {
            input_tokens: 12,
            output_tokens: 34
        }
    );
    assert_eq!(result.finish_reason.as_deref(), Some("tool_calls"));

    let recorded = recorded.lock().unwrap();
    let (uri, headers, body) = &recorded[0];
    assert_eq!(uri.path(), "/v1/messages");
    assert_eq!(headers["x-api-key"], "sk-ant-test");
    assert_eq!(headers["anthropic-version"], "2023-06-01");
    assert_eq!(headers["content-type"], "application/json");
    assert!(!headers.contains_key("authorization"));
    assert_eq!(body, &build_request(&spec()));
}

#[tokio::test]
async fn no_api_key_header_without_a_key() {
    let answer = json!({"content": [], "stop_reason": "end_turn"});
    let (addr, recorded) = common::recording_server("/messages", answer).await;
    client(format!("http://{addr}"), Some(""), 5_000)
        .call(&spec())
        .await
        .unwrap();
    assert!(!recorded.lock().unwrap()[0].1.contains_key("x-api-key"));
}

#[tokio::test]
async fn a_key_that_is_no_header_value_is_a_configuration_error_without_the_key() {
    let base = format!("http://{}", common::closed_port());
    let err = client(base, Some("sk-ant\nsecret"), 5_000)
        .call(&spec())
        .await
        .unwrap_err();
    assert!(matches!(err, ModelError::Config(_)), "{err:?}");
    assert_eq!(err.class(), FailureClass::NotSent);
    assert!(!err.to_string().contains("secret"), "{err}");
}

/// Anthropic's error envelope for `kind` and `message`.
fn error_body(kind: &str, message: &str) -> String {
    json!({"type": "error", "error": {"type": kind, "message": message}}).to_string()
}

#[tokio::test]
async fn provider_statuses_are_classified() {
    let cases = [
        (429, "rate_limit_error", FailureClass::NotSent),
        (529, "overloaded_error", FailureClass::NotSent),
        (400, "invalid_request_error", FailureClass::Rejected),
        (401, "authentication_error", FailureClass::Rejected),
        (413, "request_too_large", FailureClass::Rejected),
        (500, "api_error", FailureClass::MayHaveActed),
    ];
    for (status, kind, class) in cases {
        let body = error_body(kind, "what went wrong");
        let router = Router::new().route(
            "/messages",
            post(move || async move { (StatusCode::from_u16(status).unwrap(), body) }),
        );
        let base = format!("http://{}", common::serve(router).await);
        let err = client(base, Some("k"), 5_000)
            .call(&spec())
            .await
            .unwrap_err();
        assert_eq!(err.class(), class, "{status}: {err:?}");
        let expected_variant = match status {
            429 | 529 => matches!(err, ModelError::RateLimited { status: s, .. } if s == status),
            500.. => matches!(err, ModelError::Server { status: s, .. } if s == status),
            _ => matches!(err, ModelError::Rejected { status: s, .. } if s == status),
        };
        assert!(expected_variant, "{status}: {err:?}");
        let text = err.to_string();
        assert!(
            text.contains(&format!("{kind}: what went wrong")),
            "{status}: {text}"
        );
    }
}

/// Issue 22, item 8: an answer that used the whole output-token limit the
/// adapter sent (here the default 4096, as the spec sets none) holds a
/// cut-off last call, whatever `stop_reason` says: it is `length`, so the
/// engine runs none of its calls.
#[tokio::test]
async fn an_answer_that_used_the_whole_limit_is_cut_off_whatever_its_stop_reason() {
    let mut answer = two_calls_answer();
    answer["usage"]["output_tokens"] = json!(4096);
    let (addr, _) = common::recording_server("/v1/messages", answer).await;
    let client = client(format!("http://{addr}/v1/"), None, 5_000);
    let mut spec = spec();
    spec.max_output_tokens = None;
    let result = client.call(&spec).await.unwrap();
    assert_eq!(result.finish_reason.as_deref(), Some("length"));
    // Under the limit, the provider's word stands.
    let (addr, _) = common::recording_server("/v1/messages", two_calls_answer()).await;
    let client = common::model_client(
        ModelProvider::Anthropic,
        format!("http://{addr}/v1/"),
        None,
        5_000,
    );
    let result = client.call(&spec).await.unwrap();
    assert_eq!(result.finish_reason.as_deref(), Some("tool_calls"));
}
