//! OpenAI Chat Completions: the request body for a [`ModelCallSpec`] and the
//! [`ModelCallResult`] of a 2xx answer's `choices[0]`.
//!
//! Format: the OpenAI API reference, "Create chat completion"
//! (`POST /v1/chat/completions`). Pure mapping: no I/O. A stored tool
//! call whose arguments are not a JSON object goes back as `{}`, never as
//! the unparseable text (as the Anthropic adapter does).

use belay_proto::wire::{ChatMessage, ModelCallResult, ModelCallSpec, ToolUse, Usage};
use serde_json::{Map, Value, json};

use super::{ModelError, insert_tools, parse_json_body, provider_error_message, usage_tokens};
use crate::http_util::truncate_text;

/// The Chat Completions request body for `spec`: `model`, `messages` (one per
/// transcript message, by role), `tools` (omitted when empty, which some
/// providers refuse; a strict tool's function carries `"strict": true`) and
/// `max_tokens` (only when the spec sets it).
pub fn build_request(spec: &ModelCallSpec) -> Value {
    let messages: Vec<Value> = spec.messages.iter().map(message_json).collect();
    let mut body = Map::new();
    body.insert("model".into(), Value::String(spec.model.clone()));
    body.insert("messages".into(), Value::Array(messages));
    insert_tools(&mut body, spec, |t| {
        let mut function = json!({
            "name": t.name,
            "description": t.description,
            "parameters": t.parameters,
        });
        // Structured Outputs for function calling: `strict` sits in the
        // function object; the engine already rewrote `parameters` into the
        // strict subset (`definitions::strict`).
        if t.strict
            && let Value::Object(f) = &mut function
        {
            f.insert("strict".into(), Value::Bool(true));
        }
        json!({"type": "function", "function": function})
    });
    if let Some(max) = spec.max_output_tokens {
        body.insert("max_tokens".into(), Value::from(max));
    }
    Value::Object(body)
}

fn message_json(message: &ChatMessage) -> Value {
    match message {
        ChatMessage::System { content } => json!({"role": "system", "content": content}),
        ChatMessage::User { content } => json!({"role": "user", "content": content}),
        ChatMessage::Assistant {
            content,
            tool_calls,
        } => {
            let mut m = Map::new();
            m.insert("role".into(), "assistant".into());
            // OpenAI wants `content: null` beside tool calls, and some text
            // when there are none.
            let content = match (content, tool_calls.is_empty()) {
                (Some(text), _) => Value::String(text.clone()),
                (None, false) => Value::Null,
                (None, true) => Value::String(String::new()),
            };
            m.insert("content".into(), content);
            if !tool_calls.is_empty() {
                let calls = tool_calls
                    .iter()
                    .map(|c| {
                        json!({
                            "id": c.id,
                            "type": "function",
                            "function": {"name": c.name, "arguments": sent_arguments(&c.arguments)},
                        })
                    })
                    .collect();
                m.insert("tool_calls".into(), Value::Array(calls));
            }
            Value::Object(m)
        }
        ChatMessage::Tool {
            tool_call_id,
            content,
        } => json!({"role": "tool", "tool_call_id": tool_call_id, "content": content}),
    }
}

/// A stored tool call's `arguments` as sent back in the transcript: the
/// model's text when it is a JSON object, else `{}`. Text that does not
/// parse (a call cut off by the token limit) makes several providers answer
/// every later request of the run with 400; the engine has already
/// answered such a call with an `error:` result saying what was wrong, and
/// the events keep the model's text.
fn sent_arguments(arguments: &str) -> String {
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(_)) => arguments.to_owned(),
        _ => "{}".to_owned(),
    }
}

/// Parses a 2xx Chat Completions body: `choices[0].message` (content and
/// tool calls), `choices[0].finish_reason` and `usage`. Lenient about what is
/// missing (no `tool_calls`, no `usage`, null content); strict only about the
/// body being JSON with at least one choice that has a message.
///
/// Tool-call `arguments` are kept verbatim when they are a string (even if
/// that string is not valid JSON); a provider that sends an object instead
/// gets it re-encoded as JSON text.
pub fn parse_response(body: &[u8]) -> Result<ModelCallResult, ModelError> {
    let value = parse_json_body(body)?;
    let Some(choice) = value
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
    else {
        return Err(ModelError::InvalidResponse(format!(
            "no choices in the response: {}",
            truncate_text(&provider_error_message(body))
        )));
    };
    let Some(message) = choice.get("message").and_then(Value::as_object) else {
        return Err(ModelError::InvalidResponse(
            "choices[0] has no message object".to_owned(),
        ));
    };
    let content = match message.get("content") {
        Some(Value::String(text)) => Some(text.clone()),
        // Some compatible servers send content parts; keep their text.
        Some(Value::Array(parts)) => Some(
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<String>(),
        ),
        _ => None,
    };
    let tool_calls = message
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(|calls| calls.iter().map(tool_use).collect())
        .unwrap_or_default();
    let usage = value.get("usage");
    Ok(ModelCallResult {
        content,
        tool_calls,
        usage: Usage {
            input_tokens: usage_tokens(usage, "prompt_tokens"),
            output_tokens: usage_tokens(usage, "completion_tokens"),
        },
        finish_reason: choice
            .get("finish_reason")
            .and_then(Value::as_str)
            .map(str::to_owned),
    })
}

/// One `tool_calls[]` entry. Missing fields become empty strings rather than
/// errors: the engine refuses an unknown tool or bad arguments with a message
/// the model can act on, which is better than failing the whole call.
fn tool_use(call: &Value) -> ToolUse {
    let function = call.get("function");
    let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or_default().to_owned();
    let arguments = match function.and_then(|f| f.get("arguments")) {
        Some(Value::String(raw)) => raw.clone(),
        None | Some(Value::Null) => String::new(),
        Some(other) => other.to_string(),
    };
    ToolUse {
        id: text(call.get("id")),
        name: text(function.and_then(|f| f.get("name"))),
        arguments,
    }
}
