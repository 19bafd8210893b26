//! Strict mode on the wire: the exact `tools` each adapter sends to a real
//! local HTTP server for a strict tool beside a non-strict one, for OpenAI
//! Chat Completions (`function.strict`) and Anthropic Messages (the tool's
//! top-level `strict`).
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use belay_proto::wire::{ChatMessage, ModelCallSpec, ToolSchema};
use belay_worker::ModelProvider;
use serde_json::{Value, json};

/// A strict schema as the engine builds it (`definitions::strict`): every
/// property required, the optional `limit` nullable, objects closed.
fn strict_parameters() -> Value {
    json!({
        "type": "object",
        "properties": {
            "query": {"type": "string"},
            "limit": {"type": ["number", "null"], "description": "(default: 20)"}
        },
        "required": ["query", "limit"],
        "additionalProperties": false
    })
}

fn spec() -> ModelCallSpec {
    ModelCallSpec {
        model: "m".into(),
        messages: vec![ChatMessage::User {
            content: "find it".into(),
        }],
        tools: vec![
            ToolSchema {
                name: "search".into(),
                description: "Search the catalogue".into(),
                parameters: strict_parameters(),
                strict: true,
            },
            common::lookup_tool(),
        ],
        max_output_tokens: Some(64),
        trace: None,
    }
}

#[tokio::test]
async fn openai_sends_strict_in_the_function_of_a_strict_tool_only() {
    let answer = json!({
        "choices": [{"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]
    });
    let (addr, recorded) = common::recording_server("/v1/chat/completions", answer).await;
    common::model_client(
        ModelProvider::OpenAi,
        format!("http://{addr}/v1"),
        None,
        5_000,
    )
    .call(&spec())
    .await
    .unwrap();
    let recorded = recorded.lock().unwrap();
    assert_eq!(recorded.len(), 1);
    assert_eq!(
        recorded[0].2["tools"],
        json!([
            {"type": "function", "function": {
                "name": "search",
                "description": "Search the catalogue",
                "parameters": strict_parameters(),
                "strict": true
            }},
            {"type": "function", "function": {
                "name": "lookup",
                "description": "Look something up",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}
            }}
        ])
    );
}

#[tokio::test]
async fn anthropic_sends_strict_beside_the_input_schema_of_a_strict_tool_only() {
    let answer = json!({
        "content": [{"type": "text", "text": "ok"}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 1, "output_tokens": 1}
    });
    let (addr, recorded) = common::recording_server("/v1/messages", answer).await;
    common::model_client(
        ModelProvider::Anthropic,
        format!("http://{addr}/v1"),
        None,
        5_000,
    )
    .call(&spec())
    .await
    .unwrap();
    let recorded = recorded.lock().unwrap();
    assert_eq!(recorded.len(), 1);
    assert_eq!(
        recorded[0].2["tools"],
        json!([
            {
                "name": "search",
                "description": "Search the catalogue",
                "input_schema": strict_parameters(),
                "strict": true
            },
            {
                "name": "lookup",
                "description": "Look something up",
                "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}
            }
        ])
    );
    // Strict tool use is generally available: no beta header is needed.
    assert!(!recorded[0].1.contains_key("anthropic-beta"));
}
