//! The OpenAI-compatible adapter: request mapping, response parsing, and the
//! failure class of every way a provider call can go wrong (the transport
//! failures for both providers; Anthropic's mapping is in `anthropic.rs`).
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use belay_proto::v1::FailureClass;
use belay_proto::wire::{ChatMessage, ModelCallSpec, ToolUse, Usage};
use belay_worker::model::{build_request, parse_response};
use belay_worker::{ModelClient, ModelError, ModelProvider};
use serde_json::json;

fn spec() -> ModelCallSpec {
    ModelCallSpec {
        model: "gpt-test".into(),
        messages: vec![
            ChatMessage::System {
                content: "be brief".into(),
            },
            ChatMessage::User {
                content: "hello".into(),
            },
            ChatMessage::Assistant {
                content: None,
                tool_calls: vec![ToolUse {
                    id: "call_1".into(),
                    name: "lookup".into(),
                    arguments: "{\"q\":\"x\"}".into(),
                }],
            },
            ChatMessage::Tool {
                tool_call_id: "call_1".into(),
                content: "{\"found\":true}".into(),
            },
        ],
        tools: vec![common::lookup_tool()],
        max_output_tokens: Some(256),
        trace: None,
    }
}

fn client(base_url: String, api_key: Option<&str>, timeout_ms: u64) -> ModelClient {
    common::model_client(ModelProvider::OpenAi, base_url, api_key, timeout_ms)
}

/// A provider answering every request with `status` and `body`.
async fn provider(status: u16, body: &'static str) -> String {
    let router = Router::new().route(
        "/v1/chat/completions",
        post(move || async move { (StatusCode::from_u16(status).unwrap(), body) }),
    );
    format!("http://{}/v1", common::serve(router).await)
}

#[test]
fn request_maps_messages_tools_and_max_tokens() {
    let body = build_request(&spec());
    assert_eq!(
        body,
        json!({
            "model": "gpt-test",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hello"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "lookup", "arguments": "{\"q\":\"x\"}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "{\"found\":true}"},
            ],
            "tools": [{"type": "function", "function": {
                "name": "lookup",
                "description": "Look something up",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            }}],
            "max_tokens": 256,
        })
    );
}

#[test]
fn request_without_tools_or_limit_omits_them() {
    let mut spec = spec();
    spec.tools.clear();
    spec.max_output_tokens = None;
    let body = build_request(&spec);
    assert!(body.get("tools").is_none());
    assert!(body.get("max_tokens").is_none());
}

#[test]
fn invalid_json_arguments_are_passed_through_verbatim() {
    let raw_args = "{\"city\": \"Par"; // truncated by the model: invalid JSON
    let body = json!({
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_a", "type": "function",
                 "function": {"name": "weather", "arguments": raw_args}},
                {"id": "call_b", "type": "function",
                 "function": {"name": "nope", "arguments": "not json at all"}},
            ]},
            "finish_reason": "tool_calls",
        }],
        "usage": {"prompt_tokens": 12, "completion_tokens": 34, "total_tokens": 46},
    });
    let result = parse_response(body.to_string().as_bytes()).unwrap();
    assert_eq!(result.content, None);
    assert_eq!(
        result.tool_calls,
        vec![
            ToolUse {
                id: "call_a".into(),
                name: "weather".into(),
                arguments: raw_args.into(),
            },
            ToolUse {
                id: "call_b".into(),
                name: "nope".into(),
                arguments: "not json at all".into(),
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
}

#[test]
fn missing_tool_calls_and_usage_are_empty() {
    let body = json!({"choices": [{"message": {"role": "assistant", "content": "Hi."},
                                   "finish_reason": "stop"}]});
    let result = parse_response(body.to_string().as_bytes()).unwrap();
    assert_eq!(result.content.as_deref(), Some("Hi."));
    assert!(result.tool_calls.is_empty());
    assert_eq!(result.usage, Usage::default());
    assert_eq!(result.finish_reason.as_deref(), Some("stop"));
}

#[test]
fn object_arguments_are_reencoded_as_text() {
    let body = json!({"choices": [{"message": {"tool_calls": [
        {"id": "c", "function": {"name": "t", "arguments": {"a": 1}}}
    ]}}]});
    let result = parse_response(body.to_string().as_bytes()).unwrap();
    assert_eq!(result.tool_calls[0].arguments, "{\"a\":1}");
}

#[test]
fn unparseable_2xx_bodies_may_have_acted() {
    common::assert_unreadable(
        parse_response,
        &[
            b"<html>gateway</html>",
            b"{\"choices\": []}",
            b"{\"object\": \"chat.completion\"}",
            b"{\"choices\": [{\"finish_reason\": \"stop\"}]}",
        ],
    );
}

#[tokio::test]
async fn call_posts_the_request_and_parses_the_answer() {
    let answer = json!({
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "done"},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1},
    });
    let (addr, recorded) = common::recording_server("/v1/chat/completions", answer).await;
    let result = client(format!("http://{addr}/v1/"), Some("sk-test"), 5_000)
        .call(&spec())
        .await
        .unwrap();
    assert_eq!(result.content.as_deref(), Some("done"));
    assert_eq!(result.usage.output_tokens, 1);

    let recorded = recorded.lock().unwrap();
    let (uri, headers, body) = &recorded[0];
    assert_eq!(uri.path(), "/v1/chat/completions");
    assert_eq!(headers["authorization"], "Bearer sk-test");
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(body, &build_request(&spec()));
}

#[tokio::test]
async fn no_authorization_header_without_a_key() {
    let answer = json!({"choices": [{"message": {"content": "ok"}}]});
    let (addr, recorded) = common::recording_server("/v1/chat/completions", answer).await;
    client(format!("http://{addr}/v1"), None, 5_000)
        .call(&spec())
        .await
        .unwrap();
    assert!(!recorded.lock().unwrap()[0].1.contains_key("authorization"));
}

#[tokio::test]
async fn provider_4xx_is_rejected_with_its_message() {
    let base = provider(
        400,
        r#"{"error": {"message": "Invalid value for 'max_tokens'", "type": "invalid_request_error"}}"#,
    )
    .await;
    let err = client(base, Some("k"), 5_000)
        .call(&spec())
        .await
        .unwrap_err();
    assert!(
        matches!(err, ModelError::Rejected { status: 400, .. }),
        "{err:?}"
    );
    assert_eq!(err.class(), FailureClass::Rejected);
    let text = err.to_string();
    assert!(text.contains("400"), "{text}");
    assert!(text.contains("Invalid value for 'max_tokens'"), "{text}");
}

#[tokio::test]
async fn provider_5xx_may_have_acted() {
    // 529 too: it means "overloaded, not taken on" only in Anthropic's API.
    for status in [503, 529] {
        let base = provider(status, "upstream overloaded").await;
        let err = client(base, None, 5_000).call(&spec()).await.unwrap_err();
        assert!(
            matches!(err, ModelError::Server { status: s, .. } if s == status),
            "{err:?}"
        );
        assert_eq!(err.class(), FailureClass::MayHaveActed);
        assert!(err.to_string().contains("upstream overloaded"));
    }
}

#[tokio::test]
async fn provider_429_is_not_sent() {
    let base = provider(429, r#"{"error": {"message": "Rate limit reached"}}"#).await;
    let err = client(base, None, 5_000).call(&spec()).await.unwrap_err();
    assert!(
        matches!(err, ModelError::RateLimited { status: 429, .. }),
        "{err:?}"
    );
    assert_eq!(err.class(), FailureClass::NotSent);
    assert!(err.to_string().contains("Rate limit reached"));
}

#[tokio::test]
async fn long_provider_errors_are_truncated() {
    let body: &'static str = Box::leak("x".repeat(100_000).into_boxed_str());
    let base = provider(400, body).await;
    let err = client(base, None, 5_000).call(&spec()).await.unwrap_err();
    let text = err.to_string();
    assert!(text.len() < 5_000, "{} bytes", text.len());
    assert!(text.contains("truncated"));
}

#[tokio::test]
async fn unparseable_2xx_from_the_server_may_have_acted() {
    let base = provider(200, "this is not json").await;
    let err = client(base, None, 5_000).call(&spec()).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::MayHaveActed);
}

/// Whether an error is the expected one.
type Expect = fn(&ModelError) -> bool;

/// Sending and its failures are shared by both providers: each way a call
/// can fail in transport is checked with each.
#[tokio::test]
async fn transport_failures_are_classified_for_both_providers() {
    let pending = Router::new()
        .route(
            "/v1/chat/completions",
            post(std::future::pending::<&'static str>),
        )
        .route("/v1/messages", post(std::future::pending::<&'static str>));
    let cases: [(&str, String, u64, Expect, FailureClass); 3] = [
        (
            "timeout",
            format!("http://{}/v1", common::serve(pending).await),
            200,
            |e| {
                matches!(
                    e,
                    ModelError::Timeout {
                        timeout_ms: 200,
                        ..
                    }
                )
            },
            FailureClass::MayHaveActed,
        ),
        (
            "connection refused",
            format!("http://{}/v1", common::closed_port()),
            5_000,
            |e| matches!(e, ModelError::Connect(_)),
            FailureClass::NotSent,
        ),
        (
            "connection closed after sending",
            format!("http://{}/v1", common::hang_up_server().await),
            5_000,
            |e| matches!(e, ModelError::Transport(_)),
            FailureClass::MayHaveActed,
        ),
    ];
    for (case, base, timeout_ms, expected, class) in cases {
        for provider in [ModelProvider::OpenAi, ModelProvider::Anthropic] {
            let err = common::model_client(provider, base.clone(), None, timeout_ms)
                .call(&spec())
                .await
                .unwrap_err();
            assert!(expected(&err), "{case}, {provider:?}: {err:?}");
            assert_eq!(err.class(), class, "{case}, {provider:?}");
        }
    }
}

/// Issue 22, item 8: a tool call cut off by the token limit. Its answer
/// used the whole `max_tokens` the adapter sent, and the provider (an
/// OpenAI-compatible server that closed the JSON) says `tool_calls`: it
/// is `length` all the same, so the engine runs none of its calls. And a
/// stored call whose arguments do not parse goes back in the transcript as
/// `{}`, never as the unparseable text (several providers answer every
/// later request with 400).
#[tokio::test]
async fn a_call_cut_off_by_the_token_limit_is_length_and_never_sent_back_unparseable() {
    let answer = json!({
        "choices": [{
            "message": {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_9", "type": "function",
                 "function": {"name": "lookup", "arguments": "{\"q\":\"x\"}"}}
            ]},
            "finish_reason": "tool_calls",
        }],
        "usage": {"prompt_tokens": 40, "completion_tokens": 256},
    });
    let (addr, _) = common::recording_server("/v1/chat/completions", answer.clone()).await;
    let result = client(format!("http://{addr}/v1"), None, 5_000)
        .call(&spec())
        .await
        .unwrap();
    assert_eq!(result.finish_reason.as_deref(), Some("length"));
    // One token short of the limit: as the provider says.
    let mut under = answer;
    under["usage"]["completion_tokens"] = json!(255);
    let (addr, _) = common::recording_server("/v1/chat/completions", under).await;
    let result = client(format!("http://{addr}/v1"), None, 5_000)
        .call(&spec())
        .await
        .unwrap();
    assert_eq!(result.finish_reason.as_deref(), Some("tool_calls"));

    let mut cut = spec();
    cut.messages[2] = ChatMessage::Assistant {
        content: None,
        tool_calls: vec![
            ToolUse {
                id: "call_1".into(),
                name: "lookup".into(),
                arguments: "{\"q\":\"x".into(),
            },
            ToolUse {
                id: "call_2".into(),
                name: "lookup".into(),
                arguments: "{\"q\":\"y\"}".into(),
            },
        ],
    };
    let body = build_request(&cut);
    let calls = &body["messages"][2]["tool_calls"];
    assert_eq!(calls[0]["function"]["arguments"], "{}");
    assert_eq!(calls[1]["function"]["arguments"], "{\"q\":\"y\"}");
}

/// A 2xx body with a lone surrogate escape is read, the surrogate replaced
/// with U+FFFD (DESIGN's normalisation at the boundary), not refused as
/// unreadable.
#[test]
fn a_lone_surrogate_in_an_answer_becomes_the_replacement_character() {
    let body = br#"{"choices":[{"message":{"role":"assistant","content":"x\ud83dy"},"finish_reason":"stop"}]}"#;
    let result = parse_response(body).unwrap();
    assert_eq!(result.content.as_deref(), Some("x\u{FFFD}y"));
}
