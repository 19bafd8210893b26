//! OpenAI-compatible Chat Completions adapter.
//!
//! Maps a [`belay_proto::wire::ModelCallSpec`] to one `POST {base_url}/chat/completions`
//! request and the answer's `choices[0]` back to a [`belay_proto::wire::ModelCallResult`].
//!
//! The adapter makes exactly one request per call and never retries: the
//! engine owns retries and records every attempt. Tool-call arguments are
//! passed through as the exact text the provider returned, valid JSON or not;
//! the engine validates them.

use std::time::Duration;

use belay_proto::v1::FailureClass;
use belay_proto::wire::{ChatMessage, ModelCallResult, ModelCallSpec, ToolUse, Usage};
use serde_json::{Map, Value, json};

use crate::config::ModelProviderConfig;
use crate::http_util::{SendFailure, classify_send_error, error_chain, truncate_text};

/// Connect timeout of model requests, in ms. A connect that times out sent
/// nothing, so it is classified `NOT_SENT`.
const CONNECT_TIMEOUT_MS: u64 = 10_000;

/// Why a model call failed. [`ModelError::class`] says whether the provider
/// may have processed the request.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The request could not be built (bad base URL, bad API key characters).
    /// Nothing was sent. Class `NOT_SENT`: another worker may be configured
    /// correctly.
    #[error("model client configuration error: {0}")]
    Config(String),
    /// Connection refused, DNS failure, TLS failure or connect timeout: nothing
    /// was sent. Class `NOT_SENT`.
    #[error("could not reach the model provider, nothing was sent: {0}")]
    Connect(String),
    /// The whole-request timeout fired after the request may have been sent.
    /// Class `MAY_HAVE_ACTED`.
    #[error("model call timed out after {timeout_ms} ms: {message}")]
    Timeout {
        /// The timeout that fired, in ms.
        timeout_ms: u64,
        /// Transport error chain.
        message: String,
    },
    /// The connection failed after the request was sent (reset, closed before
    /// the response, body read error). Class `MAY_HAVE_ACTED`.
    #[error("model call failed after the request was sent: {0}")]
    Transport(String),
    /// HTTP 429. Class `NOT_SENT`: the provider refused before doing the work.
    #[error("model provider rate limited the call (HTTP {status}): {message}")]
    RateLimited {
        /// HTTP status code.
        status: u16,
        /// The provider's error message, truncated to 4 KiB.
        message: String,
    },
    /// Another HTTP 4xx. Class `REJECTED`: sending it again gets the same answer.
    #[error("model provider rejected the call (HTTP {status}): {message}")]
    Rejected {
        /// HTTP status code.
        status: u16,
        /// The provider's error message, truncated to 4 KiB.
        message: String,
    },
    /// HTTP 5xx or any other non-2xx status. Class `MAY_HAVE_ACTED`.
    #[error("model provider failed (HTTP {status}): {message}")]
    Server {
        /// HTTP status code.
        status: u16,
        /// The provider's error message, truncated to 4 KiB.
        message: String,
    },
    /// A 2xx answer whose body is not a Chat Completions response. Class
    /// `MAY_HAVE_ACTED`: the provider did the work but we cannot read it.
    #[error("model provider answered with an unreadable response: {0}")]
    InvalidResponse(String),
}

impl ModelError {
    /// The failure class to report in `FailTask`.
    pub fn class(&self) -> FailureClass {
        match self {
            Self::Config(_) | Self::Connect(_) | Self::RateLimited { .. } => FailureClass::NotSent,
            Self::Rejected { .. } => FailureClass::Rejected,
            Self::Timeout { .. }
            | Self::Transport(_)
            | Self::Server { .. }
            | Self::InvalidResponse(_) => FailureClass::MayHaveActed,
        }
    }
}

/// A client of one OpenAI-compatible provider. Cheap to clone (the connection
/// pool is shared).
#[derive(Debug, Clone)]
pub struct ModelClient {
    http: reqwest::Client,
    endpoint: String,
    api_key: Option<String>,
    timeout_ms: u64,
}

impl ModelClient {
    /// A client for `config`. Fails only if the HTTP client cannot be built
    /// (e.g. no TLS roots).
    pub fn new(config: &ModelProviderConfig) -> Result<Self, ModelError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(CONNECT_TIMEOUT_MS))
            .user_agent(concat!("belay-worker/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| ModelError::Config(error_chain(&e)))?;
        Ok(Self {
            http,
            endpoint: format!("{}/chat/completions", config.base_url.trim_end_matches('/')),
            api_key: config.api_key.clone().filter(|k| !k.is_empty()),
            timeout_ms: config.timeout_ms,
        })
    }

    /// The URL requests go to: `{base_url}/chat/completions`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Performs one model call: exactly one HTTP request, no retry.
    pub async fn call(&self, spec: &ModelCallSpec) -> Result<ModelCallResult, ModelError> {
        let body = serde_json::to_vec(&build_request(spec))
            .map_err(|e| ModelError::Config(format!("cannot encode the request: {e}")))?;
        let mut request = self
            .http
            .post(&self.endpoint)
            .timeout(Duration::from_millis(self.timeout_ms))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(reqwest::header::ACCEPT, "application/json")
            .body(body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.map_err(|e| self.send_error(&e))?;
        let status = response.status();
        let bytes = match response.bytes().await {
            Ok(bytes) => bytes,
            Err(e) if status.is_success() => return Err(self.send_error(&e)),
            // The status already classifies a failed call; a body we cannot
            // read only costs us the provider's message.
            Err(e) => format!("<error body unreadable: {}>", error_chain(&e)).into(),
        };
        if status.is_success() {
            return parse_response(&bytes);
        }
        let message = format!(
            "{}: {}",
            status,
            truncate_text(&provider_error_message(&bytes))
        );
        let code = status.as_u16();
        Err(if code == 429 {
            ModelError::RateLimited {
                status: code,
                message,
            }
        } else if status.is_client_error() {
            ModelError::Rejected {
                status: code,
                message,
            }
        } else {
            ModelError::Server {
                status: code,
                message,
            }
        })
    }

    fn send_error(&self, err: &reqwest::Error) -> ModelError {
        // The API key travels in a header, never in the URL, so the error text
        // is safe to report.
        let message = error_chain(err);
        match classify_send_error(err) {
            SendFailure::NotSent if err.is_builder() => ModelError::Config(message),
            SendFailure::NotSent => ModelError::Connect(message),
            SendFailure::Timeout => ModelError::Timeout {
                timeout_ms: self.timeout_ms,
                message,
            },
            SendFailure::AfterSend => ModelError::Transport(message),
        }
    }
}

/// The Chat Completions request body for `spec`: `model`, `messages` (one per
/// transcript message, by role), `tools` (omitted when empty, which some
/// providers refuse) and `max_tokens` (only when the spec sets it).
pub fn build_request(spec: &ModelCallSpec) -> Value {
    let messages: Vec<Value> = spec.messages.iter().map(message_json).collect();
    let mut body = Map::new();
    body.insert("model".into(), Value::String(spec.model.clone()));
    body.insert("messages".into(), Value::Array(messages));
    if !spec.tools.is_empty() {
        let tools = spec
            .tools
            .iter()
            .map(|t| {
                json!({
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    }
                })
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
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
                            "function": {"name": c.name, "arguments": c.arguments},
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

/// Parses a 2xx Chat Completions body: `choices[0].message` (content and
/// tool calls), `choices[0].finish_reason` and `usage`. Lenient about what is
/// missing (no `tool_calls`, no `usage`, null content); strict only about the
/// body being JSON with at least one choice that has a message.
///
/// Tool-call `arguments` are kept verbatim when they are a string (even if
/// that string is not valid JSON); a provider that sends an object instead
/// gets it re-encoded as JSON text.
pub fn parse_response(body: &[u8]) -> Result<ModelCallResult, ModelError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        ModelError::InvalidResponse(format!(
            "body is not JSON ({e}): {}",
            truncate_text(&String::from_utf8_lossy(body))
        ))
    })?;
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
    let tokens = |field: &str| {
        usage
            .and_then(|u| u.get(field))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    Ok(ModelCallResult {
        content,
        tool_calls,
        usage: Usage {
            input_tokens: tokens("prompt_tokens"),
            output_tokens: tokens("completion_tokens"),
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

/// The provider's error message: `error.message`, a string `error`, or a
/// top-level `message`; otherwise the body as text.
fn provider_error_message(body: &[u8]) -> String {
    if let Ok(value) = serde_json::from_slice::<Value>(body) {
        let found = match value.get("error") {
            Some(Value::String(s)) => Some(s.clone()),
            Some(err) => err
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_owned),
            None => value
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_owned),
        };
        if let Some(message) = found {
            return message;
        }
    }
    String::from_utf8_lossy(body).into_owned()
}
