//! Model adapters: one HTTP client ([`ModelClient`]) that speaks OpenAI Chat
//! Completions ([`openai`]) or Anthropic Messages ([`anthropic`]), chosen by
//! [`ModelProvider`].
//!
//! A call maps a [`belay_proto::wire::ModelCallSpec`] to one `POST` request in
//! the provider's shape and its 2xx answer back to a
//! [`belay_proto::wire::ModelCallResult`]. Sending, timeouts and the failure
//! class of every way a call can go wrong are shared by both providers (this
//! file); only the body mapping, the authentication header and which
//! statuses mean "refused before doing the work" differ.
//!
//! The adapter makes exactly one request per call and never retries: the
//! engine owns retries and records every attempt. Tool-call arguments are
//! passed through as the exact text the provider returned (OpenAI), or as the
//! provider's `input` object encoded as JSON text (Anthropic); the engine
//! validates them.

use std::time::Duration;

use belay_proto::v1::FailureClass;
use belay_proto::wire::{ModelCallResult, ModelCallSpec, ToolSchema};
use reqwest::header::{AUTHORIZATION, HeaderName, HeaderValue};
use serde_json::{Map, Value};

use crate::config::{ModelProvider, ModelProviderConfig};
use crate::http_util::{SendFailure, classify_send_error, error_chain, truncate_text};

pub mod anthropic;
pub mod openai;

pub use openai::{build_request, parse_response};

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
    /// HTTP 429 (rate limited), or, from Anthropic, 529 (`overloaded_error`).
    /// Class `NOT_SENT`: the provider refused before doing the work.
    #[error("model provider rate limited the call or is overloaded (HTTP {status}): {message}")]
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
    /// A 2xx answer whose body is not a response of the provider's API (Chat
    /// Completions or Messages). Class `MAY_HAVE_ACTED`: the provider did the
    /// work but we cannot read it.
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

/// A client of one model provider. Cheap to clone (the connection pool is
/// shared).
#[derive(Debug, Clone)]
pub struct ModelClient {
    http: reqwest::Client,
    provider: ModelProvider,
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
        let path = match config.provider {
            ModelProvider::OpenAi => "chat/completions",
            ModelProvider::Anthropic => "messages",
        };
        Ok(Self {
            http,
            provider: config.provider,
            endpoint: format!("{}/{path}", config.base_url.trim_end_matches('/')),
            api_key: config.api_key.clone().filter(|k| !k.is_empty()),
            timeout_ms: config.timeout_ms,
        })
    }

    /// The URL requests go to: `{base_url}/chat/completions` (OpenAI) or
    /// `{base_url}/messages` (Anthropic).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The API this client speaks.
    pub fn provider(&self) -> ModelProvider {
        self.provider
    }

    /// Performs one model call: exactly one HTTP request, no retry.
    pub async fn call(&self, spec: &ModelCallSpec) -> Result<ModelCallResult, ModelError> {
        let body = match self.provider {
            ModelProvider::OpenAi => openai::build_request(spec),
            ModelProvider::Anthropic => anthropic::build_request(spec),
        };
        let body = serde_json::to_vec(&body)
            .map_err(|e| ModelError::Config(format!("cannot encode the request: {e}")))?;
        let mut request = self
            .http
            .post(&self.endpoint)
            .timeout(Duration::from_millis(self.timeout_ms))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(reqwest::header::ACCEPT, "application/json")
            .body(body);
        if self.provider == ModelProvider::Anthropic {
            request = request.header(anthropic::VERSION_HEADER, anthropic::API_VERSION);
        }
        if let Some((name, value)) = self.auth_header()? {
            request = request.header(name, value);
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
            let (mut result, limit) = match self.provider {
                ModelProvider::OpenAi => (openai::parse_response(&bytes)?, spec.max_output_tokens),
                ModelProvider::Anthropic => (
                    anthropic::parse_response(&bytes)?,
                    Some(
                        spec.max_output_tokens
                            .unwrap_or(anthropic::DEFAULT_MAX_TOKENS),
                    ),
                ),
            };
            mark_cut_off(&mut result, limit);
            return Ok(result);
        }
        let message = format!(
            "{}: {}",
            status,
            truncate_text(&provider_error_message(&bytes))
        );
        let code = status.as_u16();
        Err(if self.refused_before_work(code) {
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

    /// The header carrying the API key, marked sensitive so it never shows
    /// in debug output: `Authorization: Bearer <key>` (OpenAI) or
    /// `x-api-key: <key>` (Anthropic). A key that is not a valid header value
    /// is a configuration error (nothing sent); the message does not quote it.
    fn auth_header(&self) -> Result<Option<(HeaderName, HeaderValue)>, ModelError> {
        let Some(key) = &self.api_key else {
            return Ok(None);
        };
        let (name, text) = match self.provider {
            ModelProvider::OpenAi => (AUTHORIZATION, format!("Bearer {key}")),
            ModelProvider::Anthropic => (
                HeaderName::from_static(anthropic::API_KEY_HEADER),
                key.clone(),
            ),
        };
        let mut value = HeaderValue::from_str(&text).map_err(|_| {
            ModelError::Config(format!(
                "the API key is not a valid `{name}` header value (control characters?)"
            ))
        })?;
        value.set_sensitive(true);
        Ok(Some((name, value)))
    }

    /// Statuses by which the provider says it did not take the request on:
    /// 429 everywhere, and Anthropic's 529 (`overloaded_error`, Anthropic API
    /// docs, "Errors").
    fn refused_before_work(&self, status: u16) -> bool {
        status == 429 || (self.provider == ModelProvider::Anthropic && status == 529)
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

/// The finish reason of an answer that holds tool calls and used the whole
/// output-token limit sent with the request (`limit`): `length`, whatever
/// the provider said. Its last tool call was cut off (some compatible
/// servers say `tool_calls` all the same, and close the cut-off JSON), and
/// the engine runs no tool call of a cut-off turn. Without a known limit
/// (OpenAI with no `max_output_tokens`) the provider's word stands.
pub fn mark_cut_off(result: &mut ModelCallResult, limit: Option<u32>) {
    let Some(limit) = limit else {
        return;
    };
    let used_all = result.usage.output_tokens >= u64::from(limit);
    if !used_all || result.tool_calls.is_empty() || result.finish_reason.as_deref() == Some(CUT_OFF)
    {
        return;
    }
    tracing::warn!(
        output_tokens = result.usage.output_tokens,
        limit,
        finish_reason = result.finish_reason.as_deref().unwrap_or("-"),
        "the model used its whole output-token limit in a turn with tool calls: treated as cut off (`length`)"
    );
    result.finish_reason = Some(CUT_OFF.to_owned());
}

/// The engine's finish reason of a turn cut off by the token limit.
const CUT_OFF: &str = "length";

/// A 2xx body as JSON, or [`ModelError::InvalidResponse`] quoting it
/// (truncated). Text that is not Unicode (a lone surrogate escape, bytes
/// that are not UTF-8) is replaced with U+FFFD first
/// ([`crate::json_text::repair`]), as everywhere text enters.
fn parse_json_body(body: &[u8]) -> Result<Value, ModelError> {
    serde_json::from_slice(body).or_else(|e| {
        let repaired =
            crate::json_text::repair(body).and_then(|(text, _)| serde_json::from_slice(&text).ok());
        repaired.ok_or_else(|| {
            ModelError::InvalidResponse(format!(
                "body is not JSON ({e}): {}",
                truncate_text(&String::from_utf8_lossy(body))
            ))
        })
    })
}

/// Adds `tools` to `body`, each of the spec's tools mapped by `tool`, unless
/// the spec offers none: an empty list is left out, since some providers
/// refuse one.
fn insert_tools(
    body: &mut Map<String, Value>,
    spec: &ModelCallSpec,
    tool: impl Fn(&ToolSchema) -> Value,
) {
    if !spec.tools.is_empty() {
        body.insert("tools".into(), spec.tools.iter().map(tool).collect());
    }
}

/// `usage.<field>` as a token count; missing or not a whole number is 0.
fn usage_tokens(usage: Option<&Value>, field: &str) -> u64 {
    usage
        .and_then(|u| u.get(field))
        .and_then(Value::as_u64)
        .unwrap_or(0)
}

/// The provider's error message: `error.message` (OpenAI; Anthropic's
/// `{"type": "error", "error": {"type", "message"}}`, prefixed with the
/// error's `type`), a string `error`, or a top-level `message`; otherwise the
/// body as text.
fn provider_error_message(body: &[u8]) -> String {
    if let Ok(value) = serde_json::from_slice::<Value>(body) {
        let found = match value.get("error") {
            Some(Value::String(s)) => Some(s.clone()),
            Some(err) => err.get("message").and_then(Value::as_str).map(|message| {
                match err.get("type").and_then(Value::as_str) {
                    Some(kind) => format!("{kind}: {message}"),
                    None => message.to_owned(),
                }
            }),
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
