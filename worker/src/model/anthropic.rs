//! Anthropic Messages: the request body for a [`ModelCallSpec`] and the
//! [`ModelCallResult`] of a 2xx answer.
//!
//! Format: the Anthropic API docs, "Messages" (`POST /v1/messages`, version
//! `2023-06-01`) and "Tool use" (`tool_use` / `tool_result` content blocks).
//! Pure mapping: no I/O.
//!
//! Where the transcript and the Messages API differ:
//! - System messages go to the top-level `system` (joined by a blank line
//!   when there are several), never into `messages`.
//! - Messages must alternate `user` / `assistant`, and all results of one
//!   turn's tool calls must come back in one `user` message: a tool result
//!   is a `tool_result` block in a `user` message, and consecutive messages
//!   of one role are merged into one (results first, in the transcript's
//!   order, as the API requires).
//! - A stored tool call's `arguments` is text; `tool_use.input` must be an
//!   object, so the text is parsed, and text that is not a JSON object is
//!   sent as `{}` (the engine has already answered such a call with an
//!   `error:` result saying what was wrong).
//! - `max_tokens` is required: the spec's `max_output_tokens`, else
//!   [`DEFAULT_MAX_TOKENS`].

use belay_proto::wire::{ChatMessage, ModelCallResult, ModelCallSpec, ToolUse, Usage};
use serde_json::{Map, Value, json};

use super::{ModelError, insert_tools, parse_json_body, provider_error_message, usage_tokens};
use crate::http_util::truncate_text;

/// The `anthropic-version` this adapter speaks.
pub const API_VERSION: &str = "2023-06-01";
/// Header naming the API version.
pub const VERSION_HEADER: &str = "anthropic-version";
/// Header carrying the API key.
pub const API_KEY_HEADER: &str = "x-api-key";
/// `max_tokens` sent when the agent sets no `max_output_tokens`, in tokens:
/// the largest output every Claude model accepts (the Claude 3 models' limit).
pub const DEFAULT_MAX_TOKENS: u32 = 4096;
/// How the engine marks a failed or refused call's result text (`error: …`);
/// such a result is sent with `is_error: true`.
pub const ERROR_RESULT_PREFIX: &str = "error:";

/// The Messages request body for `spec`: `model`, `max_tokens`, `system`
/// (omitted when there is no system text), `messages` (alternating roles,
/// content as blocks: `text`, `tool_use` with `id`/`name`/`input`,
/// `tool_result` with `tool_use_id`/`content`/`is_error`) and `tools`
/// (`{name, description, input_schema}`, plus `strict: true` for a strict
/// tool; omitted when empty).
pub fn build_request(spec: &ModelCallSpec) -> Value {
    let mut system: Vec<&str> = Vec::new();
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for message in &spec.messages {
        let (role, blocks) = match message {
            ChatMessage::System { content } => {
                if !content.is_empty() {
                    system.push(content);
                }
                continue;
            }
            // The user's text goes as it is, even empty: the API judges it.
            ChatMessage::User { content } => ("user", vec![text_block(content)]),
            ChatMessage::Assistant {
                content,
                tool_calls,
            } => {
                // The API refuses empty text blocks.
                let text = content.as_deref().filter(|t| !t.is_empty());
                let blocks = text
                    .map(text_block)
                    .into_iter()
                    .chain(tool_calls.iter().map(tool_use_block))
                    .collect();
                ("assistant", blocks)
            }
            ChatMessage::Tool {
                tool_call_id,
                content,
            } => ("user", vec![tool_result_block(tool_call_id, content)]),
        };
        match turns.last_mut() {
            // A turn with nothing in it (an assistant turn without text or
            // calls) is left out; its neighbours then merge.
            _ if blocks.is_empty() => {}
            Some((last_role, last)) if *last_role == role => last.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }

    let mut body = Map::new();
    body.insert("model".into(), Value::String(spec.model.clone()));
    let max_tokens = spec.max_output_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
    body.insert("max_tokens".into(), Value::from(max_tokens));
    if !system.is_empty() {
        body.insert("system".into(), Value::String(system.join("\n\n")));
    }
    let messages = turns
        .into_iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    body.insert("messages".into(), Value::Array(messages));
    insert_tools(&mut body, spec, |t| {
        let mut tool = Map::new();
        tool.insert("name".into(), Value::String(t.name.clone()));
        if !t.description.is_empty() {
            tool.insert("description".into(), Value::String(t.description.clone()));
        }
        tool.insert("input_schema".into(), t.parameters.clone());
        // Strict tool use: a top-level `strict` beside `input_schema`
        // (Anthropic docs, "Structured outputs"); the schema is already in
        // the strict subset.
        if t.strict {
            tool.insert("strict".into(), Value::Bool(true));
        }
        Value::Object(tool)
    });
    Value::Object(body)
}

fn text_block(text: &str) -> Value {
    json!({"type": "text", "text": text})
}

fn tool_use_block(call: &ToolUse) -> Value {
    let input = match serde_json::from_str::<Value>(&call.arguments) {
        Ok(object @ Value::Object(_)) => object,
        _ => Value::Object(Map::new()),
    };
    json!({"type": "tool_use", "id": call.id, "name": call.name, "input": input})
}

/// A `tool_result` block; empty result text leaves `content` out (it is
/// optional, and an empty text block is refused).
fn tool_result_block(tool_use_id: &str, content: &str) -> Value {
    let mut block = Map::new();
    block.insert("type".into(), "tool_result".into());
    block.insert("tool_use_id".into(), Value::String(tool_use_id.to_owned()));
    if !content.is_empty() {
        block.insert("content".into(), Value::String(content.to_owned()));
    }
    if content.starts_with(ERROR_RESULT_PREFIX) {
        block.insert("is_error".into(), Value::Bool(true));
    }
    Value::Object(block)
}

/// Parses a 2xx Messages body: `content` blocks (`text` blocks joined into
/// the content, `tool_use` blocks into tool calls in their order; other
/// blocks, e.g. `thinking`, are not kept), `usage` and `stop_reason` (through
/// [`finish_reason`]). Strict only about the body being JSON with a `content`
/// array.
///
/// Usage: input tokens are `input_tokens` plus the prompt-cache counts
/// (`cache_creation_input_tokens`, `cache_read_input_tokens`), which the API
/// reports apart; output tokens are `output_tokens`.
pub fn parse_response(body: &[u8]) -> Result<ModelCallResult, ModelError> {
    let value = parse_json_body(body)?;
    let Some(blocks) = value.get("content").and_then(Value::as_array) else {
        return Err(ModelError::InvalidResponse(format!(
            "no content array in the response: {}",
            truncate_text(&provider_error_message(body))
        )));
    };
    let mut content: Option<String> = None;
    let mut tool_calls = Vec::new();
    for block in blocks {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => content.get_or_insert_with(String::new).push_str(
                block
                    .get("text")
                    .and_then(Value::as_str)
                    .unwrap_or_default(),
            ),
            Some("tool_use") => tool_calls.push(tool_use(block)),
            _ => {}
        }
    }
    let usage = value.get("usage");
    let input_tokens = [
        "input_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
    ]
    .into_iter()
    .fold(0u64, |sum, field| {
        sum.saturating_add(usage_tokens(usage, field))
    });
    Ok(ModelCallResult {
        content,
        tool_calls,
        usage: Usage {
            input_tokens,
            output_tokens: usage_tokens(usage, "output_tokens"),
        },
        finish_reason: value
            .get("stop_reason")
            .and_then(Value::as_str)
            .map(finish_reason),
    })
}

/// The engine's finish reason for an Anthropic `stop_reason`: `end_turn` →
/// `stop`, `tool_use` → `tool_calls`, `max_tokens` and
/// `model_context_window_exceeded` (both: the output was cut off by a token
/// limit) → `length`; anything else (`stop_sequence`, `pause_turn`,
/// `refusal`, values added later) as it is.
pub fn finish_reason(stop_reason: &str) -> String {
    match stop_reason {
        "end_turn" => "stop",
        "tool_use" => "tool_calls",
        "max_tokens" | "model_context_window_exceeded" => "length",
        other => other,
    }
    .to_owned()
}

/// One `tool_use` block. The `input` object is encoded as JSON text; a
/// missing field becomes an empty string rather than an error, so the engine
/// refuses the call with a message the model can act on.
fn tool_use(block: &Value) -> ToolUse {
    let text = |field: &str| {
        block
            .get(field)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let arguments = match block.get("input") {
        None | Some(Value::Null) => String::new(),
        Some(input) => input.to_string(),
    };
    ToolUse {
        id: text("id"),
        name: text("name"),
        arguments,
    }
}
