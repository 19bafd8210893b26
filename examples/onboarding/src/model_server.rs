//! A scripted, stateless OpenAI-compatible chat completions server.
//!
//! A [`Script`] maps a model name to a list of [`Turn`]s. The turn played for a
//! request is the number of assistant messages already in the request, so the
//! server keeps no conversation state: a retried request gets the same answer,
//! byte for byte, and any number of runs can share one server.
//!
//! Strings in a turn may contain placeholders, resolved against the request:
//!
//! - `{{input.<path>}}`: a field of the first user message, parsed as JSON;
//! - `{{result.<tool>.<path>}}`: a field of the most recent tool message that
//!   answers a call of `<tool>` (matched by `tool_call_id` to the assistant
//!   messages' `tool_calls`), parsed as JSON.
//!
//! `<path>` is a dot-separated list of object keys and array indexes; an empty
//! path (`{{input}}`) means the whole value. Strings resolve to their text,
//! other values to their JSON text. In a mapping of tool arguments, a string
//! that is exactly one placeholder is replaced by the resolved JSON value itself
//! (so a number stays a number). A placeholder that cannot be resolved makes the
//! request fail with HTTP 400 naming the placeholder and the reason, unless it
//! ends in `?` (`{{input.plan?}}`): an optional placeholder that cannot be
//! resolved is left out of its arguments mapping (or is empty text in a
//! string), as a model leaves out an optional argument.
//!
//! Endpoints: `POST /v1/chat/completions` (and `/chat/completions`),
//! `GET /v1/models` (and `/models`), and `GET /_requests`, the log of every
//! completion request received.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Value, json};
use tokio::net::TcpListener;

/// `prompt_tokens` reported when a turn does not set `usage`.
pub const DEFAULT_PROMPT_TOKENS: u64 = 100;

/// `completion_tokens` reported when a turn does not set `usage`.
pub const DEFAULT_COMPLETION_TOKENS: u64 = 20;

/// The `created` timestamp of every completion: fixed rather than the clock so
/// that a retried request gets an identical response.
pub const CREATED: i64 = 1_735_689_600;

/// The largest completion request body accepted.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024 * 1024;

/// The scripts of a model server: model name → turns, in play order.
#[derive(Debug, Clone, PartialEq)]
pub struct Script {
    models: BTreeMap<String, Vec<Turn>>,
}

/// One scripted assistant answer.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Turn {
    /// The assistant message's text, if any (placeholders allowed).
    #[serde(default)]
    pub content: Option<String>,
    /// The tool calls the assistant proposes, in order.
    #[serde(default)]
    pub tool_calls: Vec<ScriptedToolCall>,
    /// Token counts to report; missing counts use the defaults.
    #[serde(default)]
    pub usage: Option<ScriptedUsage>,
}

/// One tool call of a [`Turn`].
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedToolCall {
    /// The tool's name; sent as is, even if no such tool was offered (so a
    /// script can propose an unknown tool).
    pub name: String,
    /// The call's arguments; `{}` when missing.
    #[serde(default = "ScriptedArguments::empty")]
    pub arguments: ScriptedArguments,
}

/// The arguments of a [`ScriptedToolCall`].
#[derive(Debug, Clone, PartialEq)]
pub enum ScriptedArguments {
    /// A YAML string: sent verbatim as the `arguments` text, even when it is
    /// not valid JSON (placeholders are still resolved in it).
    Raw(String),
    /// Any other YAML value (normally a mapping): serialized to JSON text.
    Json(Value),
}

impl ScriptedArguments {
    /// Empty arguments, `{}`.
    fn empty() -> Self {
        Self::Json(Value::Object(serde_json::Map::new()))
    }
}

impl<'de> Deserialize<'de> for ScriptedArguments {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Going through `Value` lets YAML decide: a string stays raw text,
        // anything else is data to encode.
        Ok(match Value::deserialize(deserializer)? {
            Value::String(raw) => Self::Raw(raw),
            other => Self::Json(other),
        })
    }
}

/// Token counts of a [`Turn`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedUsage {
    /// Reported `prompt_tokens`; [`DEFAULT_PROMPT_TOKENS`] when missing.
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
    /// Reported `completion_tokens`; [`DEFAULT_COMPLETION_TOKENS`] when missing.
    #[serde(default)]
    pub completion_tokens: Option<u64>,
}

/// Why a script could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    /// The script file could not be read.
    #[error("cannot read script {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The text is not YAML of the expected shape.
    #[error("invalid script: {0}")]
    Parse(String),
    /// The YAML has the right shape but a turn makes no sense.
    #[error("invalid script: model `{model}`, turn {turn}: {reason}")]
    Invalid {
        /// The model whose turn is wrong.
        model: String,
        /// The turn's index.
        turn: usize,
        /// What is wrong.
        reason: String,
    },
}

impl Script {
    /// Parses a script: a YAML mapping of model name to a list of turns.
    pub fn from_yaml(text: &str) -> Result<Self, ScriptError> {
        let models: BTreeMap<String, Vec<Turn>> =
            serde_saphyr::from_str(text).map_err(|error| ScriptError::Parse(error.to_string()))?;
        for (model, turns) in &models {
            for (turn, played) in turns.iter().enumerate() {
                let invalid = |reason: &str| ScriptError::Invalid {
                    model: model.clone(),
                    turn,
                    reason: reason.to_owned(),
                };
                // An answer with neither text nor calls would leave the agent
                // loop with nothing to do; it is always a mistake in the script.
                if played.content.is_none() && played.tool_calls.is_empty() {
                    return Err(invalid("a turn needs `content` or `tool_calls`"));
                }
                if played.tool_calls.iter().any(|call| call.name.is_empty()) {
                    return Err(invalid("a tool call needs a non-empty `name`"));
                }
            }
        }
        Ok(Self { models })
    }

    /// Reads and parses a script file.
    pub fn from_file(path: &Path) -> Result<Self, ScriptError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScriptError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_yaml(&text)
    }

    /// The onboarding example's scripts ([`crate::ONBOARDING_SCRIPT`]).
    pub fn onboarding() -> Result<Self, ScriptError> {
        Self::from_yaml(crate::ONBOARDING_SCRIPT)
    }

    /// The turns of a model, if the script has it.
    pub fn turns(&self, model: &str) -> Option<&[Turn]> {
        self.models.get(model).map(Vec::as_slice)
    }

    /// The scripted model names, sorted.
    pub fn models(&self) -> impl Iterator<Item = &str> {
        self.models.keys().map(String::as_str)
    }
}

/// One completion request as the server saw it, for `GET /_requests`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelRequestRecord {
    /// Arrival order, from 1.
    pub seq: u64,
    /// The request path.
    pub path: String,
    /// The requested model, if the body could be read.
    pub model: Option<String>,
    /// How many messages the request carried.
    pub message_count: usize,
    /// The turn the request asked for (its number of assistant messages), if
    /// the body could be read; set even when that turn does not exist.
    pub turn: Option<usize>,
    /// The names of the tools the request offered.
    pub tools: Vec<String>,
    /// The HTTP status answered.
    pub status: u16,
    /// The error message answered, if any.
    pub error: Option<String>,
    /// The request body as JSON (`null` if it was not JSON), so tests can check
    /// the transcript the engine sent.
    pub body: Value,
}

/// The state of a model server: its script, optional API key and request log.
///
/// Share it (in an `Arc`) with [`serve_model_server`] to read the log
/// in-process.
#[derive(Debug)]
pub struct ModelServerState {
    script: Script,
    api_key: Option<String>,
    log: Mutex<Vec<ModelRequestRecord>>,
}

impl ModelServerState {
    /// A server playing `script`; with `api_key`, completion and model list
    /// requests must carry `Authorization: Bearer <api_key>`.
    pub fn new(script: Script, api_key: Option<String>) -> Self {
        Self {
            script,
            api_key,
            log: Mutex::new(Vec::new()),
        }
    }

    /// The script being played.
    pub fn script(&self) -> &Script {
        &self.script
    }

    /// Every completion request received so far, in arrival order.
    pub fn requests(&self) -> Vec<ModelRequestRecord> {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// The model server's routes, for callers that serve it themselves.
pub fn model_router(state: Arc<ModelServerState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/chat/completions", post(chat_completions))
        .route("/v1/models", get(list_models))
        .route("/models", get(list_models))
        .route("/_requests", get(list_requests))
        // Long agent transcripts can exceed axum's 2 MB default.
        .layer(DefaultBodyLimit::max(MAX_REQUEST_BYTES))
        .with_state(state)
}

/// Serves the model server on `listener` until `shutdown` completes, then
/// finishes in-flight requests and returns.
pub async fn serve_model_server<F>(
    listener: TcpListener,
    state: Arc<ModelServerState>,
    shutdown: F,
) -> std::io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    axum::serve(listener, model_router(state))
        .with_graceful_shutdown(shutdown)
        .await
}

/// An OpenAI-style error answer.
#[derive(Debug, Clone)]
struct ApiError {
    status: StatusCode,
    message: String,
    code: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, code: Option<&'static str>, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            code,
        }
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, None, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({
            "error": {
                "message": self.message,
                "type": "invalid_request_error",
                "param": null,
                "code": self.code,
            }
        });
        (self.status, axum::Json(body)).into_response()
    }
}

/// Checks the bearer token when the server has an API key.
fn authorize(state: &ModelServerState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(expected) = &state.api_key else {
        return Ok(());
    };
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| {
            let (scheme, token) = value.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        });
    match presented {
        Some(token) if token == expected => Ok(()),
        Some(_) => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            Some("invalid_api_key"),
            "Incorrect API key provided.",
        )),
        None => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            Some("invalid_api_key"),
            "Missing bearer authentication in the Authorization header.",
        )),
    }
}

/// `GET /v1/models`: the scripted models, for clients that probe first.
async fn list_models(State(state): State<Arc<ModelServerState>>, headers: HeaderMap) -> Response {
    if let Err(error) = authorize(&state, &headers) {
        return error.into_response();
    }
    let data: Vec<Value> = state
        .script
        .models()
        .map(|id| json!({"id": id, "object": "model", "created": CREATED, "owned_by": "belay-scripted"}))
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// `GET /_requests`: the request log.
async fn list_requests(State(state): State<Arc<ModelServerState>>) -> Response {
    axum::Json(state.requests()).into_response()
}

/// The parts of a chat completions request the server looks at; everything
/// else (temperature, tool_choice, ...) is accepted and ignored.
#[derive(Debug, Deserialize)]
struct ChatRequest {
    model: String,
    #[serde(default)]
    messages: Vec<ChatMessage>,
    #[serde(default)]
    tools: Option<Vec<RequestTool>>,
    #[serde(default)]
    stream: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct ChatMessage {
    role: String,
    #[serde(default)]
    content: Option<Value>,
    #[serde(default)]
    tool_calls: Option<Vec<RequestToolCall>>,
    #[serde(default)]
    tool_call_id: Option<String>,
}

#[derive(Debug, Deserialize)]
struct RequestToolCall {
    id: String,
    #[serde(default)]
    function: Option<RequestFunction>,
}

#[derive(Debug, Deserialize)]
struct RequestFunction {
    name: String,
}

#[derive(Debug, Deserialize)]
struct RequestTool {
    #[serde(default)]
    function: Option<RequestFunction>,
}

/// `POST /v1/chat/completions`.
async fn chat_completions(
    State(state): State<Arc<ModelServerState>>,
    uri: Uri,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body_json: Value = body
        .as_ref()
        .ok()
        .and_then(|bytes| serde_json::from_slice(bytes).ok())
        .unwrap_or(Value::Null);
    let parsed: Option<ChatRequest> = serde_json::from_value(body_json.clone()).ok();

    let result = authorize(&state, &headers).and_then(|()| {
        let bytes = body
            .map_err(|rejection| ApiError::new(rejection.status(), None, rejection.body_text()))?;
        let request: ChatRequest = serde_json::from_slice(&bytes).map_err(|error| {
            ApiError::bad_request(format!(
                "The request body is not a valid chat completions request: {error}"
            ))
        })?;
        play(&state.script, &request)
    });

    let (status, error, response) = match result {
        Ok(completion) => (StatusCode::OK, None, axum::Json(completion).into_response()),
        Err(error) => (
            error.status,
            Some(error.message.clone()),
            error.into_response(),
        ),
    };
    if let Some(message) = &error {
        tracing::info!(status = status.as_u16(), %message, "completion request refused");
    }

    let record = {
        let mut log = state.log.lock().unwrap_or_else(PoisonError::into_inner);
        let record = ModelRequestRecord {
            seq: log.len() as u64 + 1,
            path: uri.path().to_owned(),
            model: parsed.as_ref().map(|request| request.model.clone()),
            message_count: parsed.as_ref().map_or(0, |request| request.messages.len()),
            turn: parsed.as_ref().map(turn_of),
            tools: parsed
                .as_ref()
                .and_then(|request| request.tools.as_ref())
                .map(|tools| {
                    tools
                        .iter()
                        .filter_map(|tool| tool.function.as_ref().map(|f| f.name.clone()))
                        .collect()
                })
                .unwrap_or_default(),
            status: status.as_u16(),
            error,
            body: body_json,
        };
        log.push(record.clone());
        record
    };
    tracing::debug!(seq = record.seq, model = ?record.model, turn = ?record.turn, status = record.status, "completion request");
    response
}

/// The turn a request asks for: its number of assistant messages.
fn turn_of(request: &ChatRequest) -> usize {
    request
        .messages
        .iter()
        .filter(|message| message.role == "assistant")
        .count()
}

/// Computes the scripted answer to a request.
fn play(script: &Script, request: &ChatRequest) -> Result<Value, ApiError> {
    if request.stream == Some(true) {
        return Err(ApiError::bad_request(
            "The scripted model server does not support `stream: true`.",
        ));
    }
    let model = request.model.as_str();
    let turns = script.turns(model).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            Some("model_not_found"),
            format!(
                "The model `{model}` does not exist: the script has no such model (it has: {}).",
                script.models().collect::<Vec<_>>().join(", ")
            ),
        )
    })?;
    let turn_index = turn_of(request);
    let turn = turns.get(turn_index).ok_or_else(|| {
        ApiError::bad_request(format!(
            "The script of model `{model}` is exhausted: the request has {turn_index} assistant \
             messages, so it asks for turn {turn_index}, but the script has {} turns (0 to {}).",
            turns.len(),
            turns.len().saturating_sub(1)
        ))
    })?;

    let context = Context {
        messages: &request.messages,
    };
    let in_turn = |error: PlaceholderError| {
        ApiError::bad_request(format!(
            "Cannot resolve placeholder `{{{{{}}}}}` in turn {turn_index} of model `{model}`: {}",
            error.expression, error.reason
        ))
    };

    let content = match &turn.content {
        Some(template) => Some(context.interpolate(template).map_err(in_turn)?),
        None => None,
    };
    let mut tool_calls = Vec::with_capacity(turn.tool_calls.len());
    for (index, call) in turn.tool_calls.iter().enumerate() {
        let arguments = match &call.arguments {
            ScriptedArguments::Raw(template) => context.interpolate(template).map_err(in_turn)?,
            ScriptedArguments::Json(value) => {
                let resolved = context
                    .resolve_value(value)
                    .map_err(in_turn)?
                    .unwrap_or(Value::Null);
                // Serializing a `Value` cannot fail: its keys are strings.
                serde_json::to_string(&resolved).map_err(|error| {
                    ApiError::bad_request(format!("Cannot encode tool arguments: {error}"))
                })?
            }
        };
        tool_calls.push(json!({
            "id": format!("call_{turn_index}_{index}"),
            "type": "function",
            "function": {"name": call.name, "arguments": arguments},
        }));
    }

    let usage = turn.usage.unwrap_or(ScriptedUsage {
        prompt_tokens: None,
        completion_tokens: None,
    });
    let prompt_tokens = usage.prompt_tokens.unwrap_or(DEFAULT_PROMPT_TOKENS);
    let completion_tokens = usage.completion_tokens.unwrap_or(DEFAULT_COMPLETION_TOKENS);

    let finish_reason = if tool_calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    };
    let mut message = json!({"role": "assistant", "content": content});
    // Like OpenAI, mention `tool_calls` only when there are some.
    if !tool_calls.is_empty() {
        message["tool_calls"] = Value::Array(tool_calls);
    }
    Ok(json!({
        "id": format!("chatcmpl-{model}-{turn_index}"),
        "object": "chat.completion",
        "created": CREATED,
        "model": model,
        "choices": [{
            "index": 0,
            "message": message,
            "finish_reason": finish_reason,
        }],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens.saturating_add(completion_tokens),
        },
    }))
}

/// Why a placeholder could not be resolved.
#[derive(Debug)]
struct PlaceholderError {
    expression: String,
    reason: String,
}

/// What placeholders are resolved against: the request's messages.
struct Context<'a> {
    messages: &'a [ChatMessage],
}

impl Context<'_> {
    /// Replaces every `{{...}}` in `template` with the text of its value. An
    /// unterminated `{{` is kept as text, so raw argument strings are free to
    /// contain braces.
    fn interpolate(&self, template: &str) -> Result<String, PlaceholderError> {
        let mut out = String::with_capacity(template.len());
        let mut rest = template;
        while let Some(start) = rest.find("{{") {
            let after = &rest[start + 2..];
            let Some(end) = after.find("}}") else {
                break;
            };
            out.push_str(&rest[..start]);
            // A missing optional value contributes nothing to the text.
            if let Some(value) = self.resolve_optional(&after[..end])? {
                out.push_str(&render(&value));
            }
            rest = &after[end + 2..];
        }
        out.push_str(rest);
        Ok(out)
    }

    /// Resolves placeholders in every string of a JSON value. A string that is
    /// exactly one placeholder becomes the resolved value itself; if that
    /// placeholder is optional and missing, the string is left out of its
    /// object or array (like a model omitting an optional argument), and
    /// `None` is returned for a top-level one.
    fn resolve_value(&self, value: &Value) -> Result<Option<Value>, PlaceholderError> {
        Ok(Some(match value {
            Value::String(text) => match sole_placeholder(text) {
                Some(expression) => return self.resolve_optional(expression),
                None => Value::String(self.interpolate(text)?),
            },
            Value::Array(items) => {
                let mut resolved = Vec::with_capacity(items.len());
                for item in items {
                    resolved.extend(self.resolve_value(item)?);
                }
                Value::Array(resolved)
            }
            Value::Object(fields) => {
                let mut resolved = serde_json::Map::new();
                for (key, item) in fields {
                    if let Some(item) = self.resolve_value(item)? {
                        resolved.insert(key.clone(), item);
                    }
                }
                Value::Object(resolved)
            }
            other => other.clone(),
        }))
    }

    /// Resolves a placeholder expression that may end in `?` (optional): an
    /// optional one that cannot be resolved is `None` instead of an error.
    fn resolve_optional(&self, raw_expression: &str) -> Result<Option<Value>, PlaceholderError> {
        match raw_expression.trim().strip_suffix('?') {
            Some(expression) => Ok(self.resolve(expression).ok()),
            None => self.resolve(raw_expression).map(Some),
        }
    }

    /// Resolves one placeholder expression (the text between the braces).
    fn resolve(&self, raw_expression: &str) -> Result<Value, PlaceholderError> {
        let expression = raw_expression.trim();
        let fail = |reason: String| PlaceholderError {
            expression: expression.to_owned(),
            reason,
        };
        let (root, rest) = match expression.split_once('.') {
            Some((root, rest)) => (root, Some(rest)),
            None => (expression, None),
        };
        match root {
            "input" => {
                let message = self
                    .messages
                    .iter()
                    .find(|message| message.role == "user")
                    .ok_or_else(|| fail("the request has no user message".to_owned()))?;
                let text = text_of(message.content.as_ref())
                    .ok_or_else(|| fail("the first user message has no text content".to_owned()))?;
                let input: Value = serde_json::from_str(&text).map_err(|error| {
                    fail(format!("the first user message is not JSON ({error})"))
                })?;
                lookup(&input, rest.unwrap_or(""))
                    .map_err(|reason| fail(format!("{reason} in the input")))
            }
            "result" => {
                let rest = rest.unwrap_or("");
                let (tool, path) = rest.split_once('.').unwrap_or((rest, ""));
                if tool.is_empty() {
                    return Err(fail(
                        "expected `result.<tool name>.<field path>`".to_owned(),
                    ));
                }
                let result = self.latest_result(tool).map_err(fail)?;
                lookup(&result, path)
                    .map_err(|reason| fail(format!("{reason} in the result of `{tool}`")))
            }
            _ => Err(fail(
                "unknown placeholder; expected `input.<field path>` or \
                 `result.<tool name>.<field path>`"
                    .to_owned(),
            )),
        }
    }

    /// The content, parsed as JSON, of the most recent tool message answering a
    /// call of `tool`.
    fn latest_result(&self, tool: &str) -> Result<Value, String> {
        let names: HashMap<&str, &str> = self
            .messages
            .iter()
            .filter(|message| message.role == "assistant")
            .flat_map(|message| message.tool_calls.iter().flatten())
            .filter_map(|call| {
                let function = call.function.as_ref()?;
                Some((call.id.as_str(), function.name.as_str()))
            })
            .collect();
        let message = self
            .messages
            .iter()
            .rev()
            .filter(|message| message.role == "tool")
            .find(|message| {
                message
                    .tool_call_id
                    .as_deref()
                    .and_then(|id| names.get(id))
                    .is_some_and(|name| *name == tool)
            })
            .ok_or_else(|| format!("no tool message answers a call of `{tool}`"))?;
        let text = text_of(message.content.as_ref())
            .ok_or_else(|| format!("the latest result of `{tool}` has no text content"))?;
        serde_json::from_str(&text)
            .map_err(|error| format!("the latest result of `{tool}` is not JSON ({error}): {text}"))
    }
}

/// If `text` is exactly one placeholder, its expression.
fn sole_placeholder(text: &str) -> Option<&str> {
    let inner = text.strip_prefix("{{")?.strip_suffix("}}")?;
    (!inner.contains("{{") && !inner.contains("}}")).then_some(inner)
}

/// The text of a message's content: a string, or the concatenated `text` of
/// its content parts.
fn text_of(content: Option<&Value>) -> Option<String> {
    match content? {
        Value::String(text) => Some(text.clone()),
        Value::Array(parts) => {
            let texts: Vec<&str> = parts
                .iter()
                .filter_map(|part| part.get("text").and_then(Value::as_str))
                .collect();
            (!texts.is_empty()).then(|| texts.concat())
        }
        _ => None,
    }
}

/// Follows a dot-separated path of keys and array indexes into `value`.
fn lookup(value: &Value, path: &str) -> Result<Value, String> {
    let mut current = value;
    let mut walked = String::new();
    for segment in path.split('.').filter(|segment| !segment.is_empty()) {
        let next = match current {
            Value::Object(fields) => fields.get(segment),
            Value::Array(items) => segment.parse::<usize>().ok().and_then(|i| items.get(i)),
            _ => None,
        };
        current = next.ok_or_else(|| {
            let at = if walked.is_empty() {
                "the top level".to_owned()
            } else {
                format!("`{walked}`")
            };
            format!(
                "field `{segment}` not found at {at} (which is {})",
                describe(current)
            )
        })?;
        if !walked.is_empty() {
            walked.push('.');
        }
        walked.push_str(segment);
    }
    Ok(current.clone())
}

/// A short description of a JSON value for error messages.
fn describe(value: &Value) -> String {
    match value {
        Value::Object(fields) => {
            let keys: Vec<&str> = fields.keys().map(String::as_str).collect();
            format!("an object with keys [{}]", keys.join(", "))
        }
        Value::Array(items) => format!("an array of {} items", items.len()),
        Value::String(_) => "a string".to_owned(),
        Value::Number(_) => "a number".to_owned(),
        Value::Bool(_) => "a boolean".to_owned(),
        Value::Null => "null".to_owned(),
    }
}

/// The text a resolved value contributes to a string.
fn render(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(json: Value) -> Vec<ChatMessage> {
        serde_json::from_value(json).expect("messages")
    }

    #[test]
    fn lookup_walks_objects_and_arrays() {
        let value = json!({"a": {"b": [10, {"c": "x"}]}});
        assert_eq!(lookup(&value, "a.b.1.c").expect("found"), json!("x"));
        assert_eq!(lookup(&value, "").expect("whole"), value);
        let error = lookup(&value, "a.z").expect_err("missing");
        assert!(error.contains("`z`") && error.contains("[b]"), "{error}");
    }

    #[test]
    fn results_are_matched_by_tool_call_id() {
        let msgs = messages(json!([
            {"role": "user", "content": "{\"email\": \"a@b.c\"}"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "x1", "type": "function", "function": {"name": "create_account", "arguments": "{}"}},
                {"id": "x2", "type": "function", "function": {"name": "other", "arguments": "{}"}}
            ]},
            {"role": "tool", "tool_call_id": "x1", "content": "{\"account_id\": \"acct_1\"}"},
            {"role": "tool", "tool_call_id": "x2", "content": "{\"account_id\": \"wrong\"}"}
        ]));
        let context = Context { messages: &msgs };
        assert_eq!(
            context
                .interpolate("id={{ result.create_account.account_id }} for {{input.email}}")
                .expect("resolved"),
            "id=acct_1 for a@b.c"
        );
        let error = context
            .resolve("result.send_welcome_email.message_id")
            .expect_err("none");
        assert!(error.reason.contains("no tool message"), "{}", error.reason);
        let error = context.resolve("bogus.x").expect_err("root");
        assert!(
            error.reason.contains("unknown placeholder"),
            "{}",
            error.reason
        );
    }

    #[test]
    fn sole_placeholders_keep_their_type_and_text_does_not() {
        let msgs = messages(
            json!([{"role": "user", "content": [{"type": "text", "text": "{\"n\": 42}"}]}]),
        );
        let context = Context { messages: &msgs };
        assert_eq!(
            context
                .resolve_value(
                    &json!({"n": "{{input.n}}", "s": "n={{input.n}}", "k": ["{{input}}"]})
                )
                .expect("resolved"),
            Some(json!({"n": 42, "s": "n=42", "k": [{"n": 42}]}))
        );
        assert_eq!(
            context.interpolate("{\"email\": ").expect("raw"),
            "{\"email\": "
        );
        assert_eq!(
            context.interpolate("a {{ b").expect("unterminated"),
            "a {{ b"
        );
    }

    #[test]
    fn optional_placeholders_are_left_out_when_missing() {
        let msgs = messages(json!([{"role": "user", "content": "{\"n\": 1}"}]));
        let context = Context { messages: &msgs };
        assert_eq!(
            context
                .resolve_value(&json!({"n": "{{input.n?}}", "plan": "{{ input.plan? }}", "list": ["{{input.x?}}", 2]}))
                .expect("resolved"),
            Some(json!({"n": 1, "list": [2]}))
        );
        assert_eq!(
            context.interpolate("plan=[{{input.plan?}}]").expect("text"),
            "plan=[]"
        );
        // Without `?` the same placeholder is an error.
        assert!(context.interpolate("{{input.plan}}").is_err());
    }
}
