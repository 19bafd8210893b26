//! JSON documents carried in the `*_json` fields of `belay.v1`: task specs the
//! engine hands to workers and the results workers report.
//!
//! These shapes are persisted (task rows, events), so they follow the rules for
//! stored types: fields are only added, with `#[serde(default)]`, never renamed.
//!
//! # In detail (moved from ARCHITECTURE.md)
//!
//! `proto/belay/v1/belay.proto`: the versioned gRPC package `belay.v1`
//! (generated under cargo feature `grpc`, the default; `wire` alone without it).
//! `src/wire.rs`: the JSON documents carried in `*_json` fields (task specs,
//! model results), shared by engine and worker; `ToolBinding::Mcp` (server,
//! server tool, per-call headers, timeout) is a `type: mcp` call.
//! `HttpRequestOptions` (`auth` as `HttpAuth`, `query_params`, `body_type`,
//! `body_mode`, `body_template`, `xml_root`, `body_schema`, `tls_profile`) is
//! flattened into `HttpBinding` and into the
//! stored `ToolBindingDef`, so the engine copies it into the spec as it is;
//! defaults are left out when serialized, so older bindings read and write
//! unchanged. `split_placeholders` is the one scanner of `{{ … }}` for the
//! parser and the worker. `ToolCallSpec.config_params` names the arguments
//! that hold a `source: config` placeholder, the only ones the worker resolves.
//! The run secret vault (`RESULT_SECRETS` / `SECRET_ACCESS`):
//! `ToolCallSpec.result_secrets` (path and key of each producer entry, no
//! option), `take_secret_at` (the one place a value is taken out of a result,
//! `[VAULTED:<key>]` left in its place, used by the worker and, as a backstop,
//! the engine), `secret_placeholder_name` (`{{_secret.KEY}}`) and
//! `is_vault_key`; in the proto, `CompleteTaskRequest.vaulted_secrets` (the
//! values taken out, beside the result, never in it) and
//! `DispatchToolCallResponse.secrets` (the values a consumer's dispatch may
//! read), both `SecretValue`, whose `Debug` is written by hand (`lib.rs`,
//! `build.rs` skips the derived one) and hides the value.
//! `ToolCallSpec.variant` names the `request_variants:` item whose request the
//! binding already is (the engine merged it); the worker only logs it.
//! MCP sampling: `ToolCallSpec.sampling` (`SamplingGrant`: the agent's model,
//! `max_requests`, `max_tokens` per completion, `max_total_tokens` and
//! `max_input_tokens` for all of an attempt's completions) and `SamplingUsage`
//! (completions, input and output tokens), which the worker reports in
//! `CompleteTaskRequest.sampling_usage`, `FailTaskRequest.sampling_usage`
//! and `RequestToolInputRequest.sampling_usage` (proto message
//! `SamplingUsage`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Task kind string for model calls, as in `Task.kind`.
pub const TASK_KIND_MODEL_CALL: &str = "model_call";
/// Task kind string for tool calls, as in `Task.kind`.
pub const TASK_KIND_TOOL_CALL: &str = "tool_call";

/// One message of a model transcript. Provider-neutral; the worker maps it to
/// the provider's format (for OpenAI Chat Completions, one-to-one by role).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum ChatMessage {
    /// The agent's instructions.
    System {
        /// Instruction text.
        content: String,
    },
    /// Input to the agent (the node input, as text or JSON text).
    User {
        /// Message text.
        content: String,
    },
    /// A model turn: text and/or proposed tool calls (tool_use).
    Assistant {
        /// Text of the turn, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<String>,
        /// Proposed tool calls in the order the model gave them.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolUse>,
    },
    /// The result of one tool call, answering `tool_call_id`.
    Tool {
        /// The `ToolUse::id` this answers.
        tool_call_id: String,
        /// Result text (JSON text for structured results), truncated to the
        /// agent's result size limit; refusals and failures are text starting
        /// with `error:`.
        content: String,
    },
}

/// A tool call proposed by the model (OpenAI `tool_calls[]`, Anthropic `tool_use`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolUse {
    /// Provider-assigned id, echoed in the result message.
    pub id: String,
    /// Tool name as the model wrote it (may name an unknown tool).
    pub name: String,
    /// Arguments exactly as the model produced them: JSON text that may be
    /// invalid. The engine decodes and validates it, never the worker.
    pub arguments: String,
}

/// A tool as offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSchema {
    /// Tool name.
    pub name: String,
    /// What the tool does, for the model.
    pub description: String,
    /// JSON Schema (draft 2020-12) of the arguments object; hidden parameters
    /// are not in it.
    pub parameters: Value,
    /// Strict mode (the tool's `strict: true`): `parameters` is already in
    /// the strict subset (every object closed, every property required,
    /// optional ones nullable), and the adapter asks the provider to
    /// constrain generation to it (`function.strict` for OpenAI, the tool's
    /// `strict` for Anthropic). Added for issue 4 (strict mode).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub strict: bool,
}

/// Spec of a `model_call` task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelCallSpec {
    /// Provider model name, from the agent definition.
    pub model: String,
    /// The transcript so far; every tool_use has exactly one result, in order.
    pub messages: Vec<ChatMessage>,
    /// Tools the model may propose.
    pub tools: Vec<ToolSchema>,
    /// Upper bound on output tokens, if the agent sets one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u32>,
    /// The run's trace, with the span of the call's node as the parent:
    /// the parent of the worker's span of this call. Set by the engine on
    /// every task of a traced run. Added for issue 21 (traces).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<crate::trace::CallTrace>,
}

/// Token usage of one model call, in tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    #[serde(default)]
    pub input_tokens: u64,
    /// Completion tokens.
    #[serde(default)]
    pub output_tokens: u64,
}

/// The field of a `model_call` result (`CompleteTask.result_json`) in which
/// the worker names the provider it called (`openai`, `anthropic`), beside
/// the fields of [`ModelCallResult`]: only the engine's metrics read it
/// (`belay_model_tokens_total{provider}`); an engine ignores it otherwise
/// and a result without it is counted as provider `unknown`.
pub const MODEL_PROVIDER_FIELD: &str = "provider";

/// Result of a `model_call` task, reported in `CompleteTask.result_json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelCallResult {
    /// Text of the answer, if any.
    #[serde(default)]
    pub content: Option<String>,
    /// Proposed tool calls, in the model's order.
    #[serde(default)]
    pub tool_calls: Vec<ToolUse>,
    /// Token usage as the provider reported it.
    #[serde(default)]
    pub usage: Usage,
    /// Provider's finish reason (`stop`, `tool_calls`, `length`, ...).
    #[serde(default)]
    pub finish_reason: Option<String>,
}

/// How a tool is executed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToolBinding {
    /// An HTTP endpoint.
    Http(HttpBinding),
    /// An HTTP endpoint that answers later, by POSTing the result to a
    /// callback URL (`type: async_webhook`). The worker gets the URL from
    /// `DispatchToolCallResponse.callback_url`, puts it into the JSON body at
    /// `callback_url_field`, and reports the 2xx answer as the acceptance.
    AsyncWebhook(AsyncWebhookBinding),
    /// A tool of an MCP server (`type: mcp`), called by the worker's MCP
    /// client. Added after v0.1.
    Mcp(McpBinding),
    /// One resource of an MCP server (`type: mcp` with `resource:`), read
    /// by the worker's MCP client (`resources/read`). Added for issue 4.
    McpResource(McpResourceBinding),
    /// Inline JavaScript or Python code run by the worker in an isolated
    /// sandbox (`type: sandbox`). Added for issue 4.
    Sandbox(SandboxBinding),
}

/// Binding of a `type: mcp` tool with `resource:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpResourceBinding {
    /// The server's logical name, resolved by the worker's MCP configuration.
    pub server: String,
    /// The resource's URI, or a URI template (RFC 6570 level 1) whose
    /// `{name}` expressions are filled from the call's arguments of those
    /// names, percent-encoded.
    pub uri_template: String,
    /// Whole-read timeout in ms (waiting for the server's connection included).
    pub timeout_ms: u64,
}

/// Language of a `type: sandbox` tool's code (`runtime:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxRuntime {
    /// `runtime: javascript`: run by the worker's Node.js.
    Javascript,
    /// `runtime: python`: run by the worker's CPython 3.
    Python,
}

impl SandboxRuntime {
    /// The `.tools.abl` spelling: `javascript` or `python`.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxRuntime::Javascript => "javascript",
            SandboxRuntime::Python => "python",
        }
    }
}

/// Binding of a `type: sandbox` tool: the code is the body of a function
/// whose parameters are the tool's declared parameters, by name (an
/// optional one the call leaves out is `undefined` / `None`); what it
/// returns is the tool's result. Shared by the stored tool definition and
/// the task spec, so the engine copies it as it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxBinding {
    /// `runtime:`.
    pub runtime: SandboxRuntime,
    /// `code:`, the function body, exactly as written (a `|` block scalar's
    /// lines with the block's indentation removed).
    pub code: String,
    /// The tool's declared parameter names, in signature order: each is
    /// bound to the argument of that name.
    #[serde(default)]
    pub params: Vec<String>,
    /// `timeout:` in ms (wall clock, start to result); `None`: the worker's
    /// default (`--sandbox-timeout-ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// `memory_mb:`, the process's memory limit in MiB; `None`: the
    /// worker's default (`--sandbox-memory-mb`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
}

/// Binding of a `type: mcp` tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpBinding {
    /// The server's logical name, resolved by the worker's MCP configuration
    /// (`--mcp-config`).
    pub server: String,
    /// The tool's name on the server (`server_tool:`; the tool's own name
    /// when not renamed).
    pub server_tool: String,
    /// Per-call HTTP headers (Streamable HTTP servers only); values may hold
    /// `{{config.X}}`, resolved by the worker from its configuration.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Whole-call timeout in ms (waiting for the server's connection included).
    pub timeout_ms: u64,
}

/// Binding of a `type: async_webhook` tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AsyncWebhookBinding {
    /// The request, as for `type: http` (its method is POST, PUT or PATCH).
    #[serde(flatten)]
    pub http: HttpBinding,
    /// Dot-path in the JSON body where the callback URL goes, e.g.
    /// `callbackUrl` or `meta.reply_to` (objects on the way are created).
    pub callback_url_field: String,
}

/// HTTP binding of a tool (`type: http` in `.tools.abl`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HttpBinding {
    /// Absolute URL, or a path resolved against the worker's HTTP base URL.
    /// `{name}` segments are path parameters filled from the arguments.
    pub endpoint: String,
    /// HTTP method, upper case.
    pub method: String,
    /// Extra request headers; values may hold `{{config.NAME}}`, resolved by
    /// the worker from its configuration (the spec carries the placeholder,
    /// never the value).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Whole-request timeout in ms.
    pub timeout_ms: u64,
    /// Authentication, query parameters and body encoding. Added after the
    /// SSRF release; every field defaults and is left out when it has its
    /// default, so older specs decode and unchanged bindings serialize as
    /// before.
    #[serde(flatten)]
    pub request: HttpRequestOptions,
}

/// How an HTTP tool request is authenticated, built and encoded beyond its
/// endpoint, method, headers and timeout (`.tools.abl`: `auth:` +
/// `auth_config:`, `query_params:`, `body_type:`, `body_mode:`,
/// `body_template:`). Shared by the stored tool definition and the task
/// spec, so the engine copies it as it is.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HttpRequestOptions {
    /// `auth:`; default none.
    #[serde(default, skip_serializing_if = "HttpAuth::is_none")]
    pub auth: HttpAuth,
    /// `query_params:`, in declaration order; a key may repeat. Added to
    /// the endpoint's own query, before the arguments that `body_mode: auto`
    /// sends as query parameters.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub query_params: Vec<QueryParam>,
    /// `body_type:`; default JSON.
    #[serde(default, skip_serializing_if = "BodyType::is_json")]
    pub body_type: BodyType,
    /// `body_mode:`; default `auto`.
    #[serde(default, skip_serializing_if = "BodyMode::is_auto")]
    pub body_mode: BodyMode,
    /// `body_template:` (alias `body:`): the body, with `{{param}}`
    /// placeholders filled from the arguments (see [`BodyType`] for how).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_template: Option<String>,
    /// `xml_root:` of a `body_type: xml` tool whose body is made from the
    /// arguments: the root element's name; `None`: the tool's name. Added
    /// for issue 4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xml_root: Option<String>,
    /// `body_schema:` with `use_body_schema: true`: the JSON Schema the
    /// body's JSON value must satisfy (its top-level `default`s fill absent
    /// properties first); a body that does not is refused before it is
    /// sent. A worker that predates the field sends the body unchecked.
    /// Added for issue 4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_schema: Option<Value>,
    /// `tls_profile:`: the name of a client-certificate (mTLS) profile of
    /// the worker's configuration (`--tls-profiles`); the certificate and
    /// key never appear in a definition or a spec. A worker without the
    /// profile fails the call `NOT_SENT` before dispatch. Added for
    /// issue 4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_profile: Option<String>,
}

/// `auth:` of an HTTP tool with its `auth_config:`. Secrets are
/// `{{config.NAME}}` placeholders, resolved by the worker right before the
/// request; a stored definition or spec never holds a credential.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum HttpAuth {
    /// `auth: none`: no credentials.
    #[default]
    None,
    /// `auth: bearer`: `Authorization: Bearer <token>` (RFC 6750 §2.1).
    Bearer {
        /// `auth_config.token`: holds a `{{config.NAME}}` placeholder.
        token: String,
    },
    /// `auth: api_key`: the key in a header of its own.
    ApiKey {
        /// `auth_config.header_name`; default `X-API-Key`.
        header_name: String,
        /// `auth_config.key`: holds a `{{config.NAME}}` placeholder.
        key: String,
    },
    /// `auth: oauth2_client`: an access token from the OAuth 2.0
    /// client-credentials grant (RFC 6749 §4.4), sent as a bearer token
    /// (RFC 6750 §2.1). The worker caches it per (token URL, client id,
    /// scopes) until shortly before it expires.
    Oauth2Client {
        /// `auth_config.token_url`: the token endpoint, an absolute http(s) URL.
        token_url: String,
        /// `auth_config.client_id`: literal or a `{{config.NAME}}` placeholder.
        client_id: String,
        /// `auth_config.client_secret`: holds a `{{config.NAME}}` placeholder.
        client_secret: String,
        /// `auth_config.scopes`: space-separated scopes; empty: none asked for.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        scopes: String,
    },
    /// `auth: custom`: headers of the author's choice.
    Custom {
        /// `auth_config.custom_headers`: values may hold `{{config.NAME}}`.
        headers: BTreeMap<String, String>,
    },
}

impl HttpAuth {
    /// Whether this is [`HttpAuth::None`] (for `skip_serializing_if`).
    pub fn is_none(&self) -> bool {
        *self == HttpAuth::None
    }
}

/// One `query_params:` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueryParam {
    /// The query key, sent percent-encoded.
    pub key: String,
    /// Literal text with `{{param}}` placeholders naming tool parameters. A
    /// value that is exactly one placeholder sends nothing for an absent or
    /// `null` argument and repeats the key for each item of an array; in any
    /// other value an absent or `null` argument leaves the pair out.
    pub value: String,
}

/// `body_type:`: how the body is encoded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BodyType {
    /// `application/json`. A template is JSON whose strings may hold
    /// placeholders; a string that is exactly `"{{param}}"` becomes the
    /// argument's JSON value.
    #[default]
    Json,
    /// `application/x-www-form-urlencoded`. Arguments are pairs (arrays
    /// repeat the key, objects are JSON text); in a template each
    /// placeholder's value is form-encoded.
    Form,
    /// `text/plain; charset=utf-8`, from a template only; placeholders are
    /// replaced by the argument as text (strings as they are, other values
    /// as JSON text).
    Text,
    /// `application/xml; charset=utf-8`. The arguments become elements
    /// under a root element ([`HttpRequestOptions::xml_root`]): an object's
    /// members are child elements in key order, an array repeats its
    /// member's element, `null` members are left out, scalars are text.
    /// A template is XML whose placeholders are replaced by the argument
    /// as text, XML-escaped. Added for issue 4.
    Xml,
}

impl BodyType {
    /// Whether this is [`BodyType::Json`] (for `skip_serializing_if`).
    pub fn is_json(&self) -> bool {
        *self == BodyType::Json
    }
}

/// `body_mode:`: where the arguments not used by the path, `query_params:`
/// or a template go.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BodyMode {
    /// POST, PUT and PATCH send them as the body; other methods as query
    /// parameters.
    #[default]
    Auto,
    /// They are not sent: no body (unless a template), no extra query.
    None,
}

impl BodyMode {
    /// Whether this is [`BodyMode::Auto`] (for `skip_serializing_if`).
    pub fn is_auto(&self) -> bool {
        *self == BodyMode::Auto
    }
}

/// One piece of a text with `{{ … }}` placeholders ([`split_placeholders`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplatePiece<'a> {
    /// Literal text.
    Text(&'a str),
    /// What stands between `{{` and `}}`, trimmed, with the byte offset of
    /// its `{{` in the text.
    Placeholder {
        /// The trimmed inside, e.g. `config.TOKEN` or `customer_id`.
        inner: &'a str,
        /// Byte offset of the opening `{{`.
        at: usize,
    },
}

/// Splits `text` into literal text and `{{ … }}` placeholders: the one
/// scanner for the placeholders of headers, auth settings, query values and
/// body templates, used by the parser (to check them) and by the worker (to
/// fill them). `Err(offset)`: the `{{` at byte `offset` is not closed.
pub fn split_placeholders(text: &str) -> Result<Vec<TemplatePiece<'_>>, usize> {
    let mut pieces = Vec::new();
    let mut rest = text;
    let mut offset = 0;
    while let Some(start) = rest.find("{{") {
        if start > 0 {
            pieces.push(TemplatePiece::Text(&rest[..start]));
        }
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else {
            return Err(offset + start);
        };
        pieces.push(TemplatePiece::Placeholder {
            inner: after[..end].trim(),
            at: offset + start,
        });
        let consumed = start + 2 + end + 2;
        rest = &rest[consumed..];
        offset += consumed;
    }
    if !rest.is_empty() {
        pieces.push(TemplatePiece::Text(rest));
    }
    Ok(pieces)
}

/// The name of a `{{config.NAME}}` placeholder's inside (`config.NAME`),
/// when it is one: NAME of ASCII letters, digits, `_`, `-` and `.`.
pub fn config_placeholder_name(inner: &str) -> Option<&str> {
    inner.strip_prefix("config.").filter(|n| {
        !n.is_empty()
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    })
}

/// The name of a `{{_secret.KEY}}` placeholder's inside (`_secret.KEY`),
/// when it is one: KEY of ASCII letters, digits, `_` and `-` (a vault key,
/// [`is_vault_key`]).
pub fn secret_placeholder_name(inner: &str) -> Option<&str> {
    inner.strip_prefix("_secret.").filter(|k| is_vault_key(k))
}

/// Prefix of the vault keys of untraced arguments (`_arg_` and 24 hex
/// digits): the engine records a `visibility: {trace: false}` argument as
/// `{{_secret._arg_…}}` and a worker resolves such a placeholder only with a
/// value its dispatch handed out. Tools files may not name keys with it.
pub const ARG_KEY_PREFIX: &str = "_arg_";

/// Longest vault key, in characters.
pub const MAX_VAULT_KEY_CHARS: usize = 64;

/// Whether `key` can name a vault entry: 1 to [`MAX_VAULT_KEY_CHARS`] ASCII
/// letters, digits, `_` and `-`, starting with a letter or `_`.
pub fn is_vault_key(key: &str) -> bool {
    let mut chars = key.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && key.len() <= MAX_VAULT_KEY_CHARS
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// What a vaulted field of a tool's result holds instead of its value,
/// in every event, in what the model sees and in the audit:
/// `[VAULTED:<key>]`.
pub fn vaulted_marker(key: &str) -> String {
    format!("[VAULTED:{key}]")
}

/// One `RESULT_SECRETS:` entry as a worker needs it: where the value is in
/// the tool's result, and the vault key it goes under. The entry's options
/// (consumers, ttl, single use) stay in the engine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResultSecret {
    /// Dotted path of object keys into the result (`otp_token`,
    /// `session.key`).
    pub path: String,
    /// The vault key.
    pub key: String,
}

/// Takes the value at `path` (dotted object keys) out of `result`, leaving
/// [`vaulted_marker`] of `key` in its place, and returns it as text: a
/// string as it is, any other JSON value as its JSON text. `None`, with
/// `result` unchanged, when the path is absent, passes through a value that
/// is not an object, ends at `null`, or already holds the marker (taken
/// before). The one place the worker (and the engine, as a backstop) takes
/// a secret out of a result.
pub fn take_secret_at(result: &mut Value, path: &str, key: &str) -> Option<String> {
    let mut at = result;
    let mut segments = path.split('.').peekable();
    while let Some(segment) = segments.next() {
        let Value::Object(map) = at else {
            return None;
        };
        let next = map.get_mut(segment)?;
        if segments.peek().is_some() {
            at = next;
            continue;
        }
        let marker = vaulted_marker(key);
        let text = match &mut *next {
            Value::Null => return None,
            Value::String(s) if *s == marker => return None,
            Value::String(s) => std::mem::take(s),
            other => other.to_string(),
        };
        *next = Value::String(marker);
        return Some(text);
    }
    None
}

/// Spec of a `tool_call` task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallSpec {
    /// Tool name.
    pub tool: String,
    /// Registered version of the tool definition.
    pub tool_version: u32,
    /// Validated arguments: the exact value that was checked and persisted.
    pub arguments: Value,
    /// How to execute it.
    pub binding: ToolBinding,
    /// Belongs to the call (run + call), identical on every attempt; sent as
    /// the `Idempotency-Key` header by HTTP tools.
    pub idempotency_key: String,
    /// A call repeated after a person answered the tool's question (an MCP
    /// elicitation): the answers, as the worker's MCP client reads them
    /// (`{"responses", "request_state"}` or `{"elicitations": [...]}`).
    /// Absent on a first call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// Arguments whose value is the placeholder `{{config.NAME}}` of a
    /// `source: config` parameter: the worker replaces exactly these (and
    /// no other text of the arguments) with its configured value right
    /// before the request, so no event or spec holds the value; one it
    /// cannot resolve fails the call `NOT_SENT`. Added for issue 4.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub config_params: Vec<String>,
    /// The tool's `RESULT_SECRETS:`: the worker takes the value at each
    /// path out of a result ([`take_secret_at`]) and reports it in
    /// `CompleteTaskRequest.vaulted_secrets`, never in the result. Added
    /// for issue 4.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub result_secrets: Vec<ResultSecret>,
    /// The `request_variants:` item whose request `binding` is (the engine
    /// chose it when the call was scheduled and merged its overrides into
    /// the binding); `None`: the tool's own request. For logs and audit:
    /// the worker sends the binding as it is. Added for issue 4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// For a `type: mcp` tool that declares `sampling:`, called by an agent
    /// node with budget left: the completions its server may ask for
    /// (`sampling/createMessage`) during the call, through the agent's own
    /// model. `None`: the worker refuses every such request of this call.
    /// Added for MCP sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling: Option<SamplingGrant>,
    /// As [`ModelCallSpec::trace`]: the parent of the worker's span of
    /// this call, which outbound requests carry on as `traceparent`.
    /// Added for issue 21 (traces).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<crate::trace::CallTrace>,
    /// The engine may record this call's dispatch when it leases the task
    /// and say so in `Task.dispatched`: an `idempotent` `type: http` tool
    /// with no gates (rate limit, circuit breaker), no vault values to read
    /// or keep and no callback, for which the dispatch record changes no
    /// decision (DESIGN: a call that is safe to repeat is retried whether
    /// or not it was dispatched). Set by the machine when it builds the
    /// spec; false in specs of older engines. Added for issue 23.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dispatch_with_claim: bool,
    /// The tool's repeat safety (`never`, `idempotent`, `reconcile`), for
    /// the worker's logs and spans (`belay.repeat_safety`) whether or not
    /// the run is traced; empty in specs of older engines (then only a
    /// traced run's [`crate::trace::CallTrace::repeat_safety`] says it).
    /// Added for issue 23.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub repeat_safety: String,
}

/// What an MCP server may ask of the run's model during one tool call
/// ([`ToolCallSpec::sampling`]). The engine computes it when it builds the
/// spec; the worker enforces it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SamplingGrant {
    /// The agent's model name (`model:`), as in [`ModelCallSpec::model`]:
    /// the worker calls it with the provider configuration it uses for
    /// `model_call` tasks.
    pub model: String,
    /// Most completions per attempt (the tool's `sampling.max_requests`).
    pub max_requests: u32,
    /// Most output tokens per completion: the tool's `sampling.max_tokens`,
    /// lowered to the agent's `max_output_tokens` and to
    /// [`SamplingGrant::max_total_tokens`]. A server's `maxTokens` is
    /// capped to it.
    pub max_tokens: u32,
    /// Most output tokens of all the attempt's completions together: what
    /// is left of the node's and the run's token and cost budgets when the
    /// spec was built, shared among the sampling calls of the model's turn
    /// (`None`: no budget bounds it; `max_requests` × `max_tokens` does).
    /// Each completion's `maxTokens` is capped to what is left of it, and a
    /// request once it is used up is refused. Added after v0.1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_total_tokens: Option<u32>,
    /// Most input (prompt) tokens of all the attempt's completions
    /// together, likewise (`None`: no input, total-token or cost budget
    /// bounds it). A request whose prompt is estimated (4 bytes a token,
    /// rounded up) past what is left is refused before the model is
    /// called. Added after v0.1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_input_tokens: Option<u32>,
}

/// Model completions made for an MCP server during one tool-call attempt,
/// reported beside the call's result or failure
/// (`CompleteTaskRequest.sampling_usage`, `FailTaskRequest.sampling_usage`)
/// and charged like a model call's tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SamplingUsage {
    /// Completions asked of the model (failed ones included).
    #[serde(default)]
    pub requests: u32,
    /// Input (prompt) tokens, as the provider reported them.
    #[serde(default)]
    pub input_tokens: u64,
    /// Output (completion) tokens, as the provider reported them.
    #[serde(default)]
    pub output_tokens: u64,
}

impl SamplingUsage {
    /// Whether nothing was used (no request made).
    pub fn is_empty(&self) -> bool {
        self.requests == 0 && self.input_tokens == 0 && self.output_tokens == 0
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn an_http_binding_without_the_new_fields_decodes_and_encodes_as_before() {
        let old = r#"{"type":"http","endpoint":"/x","method":"GET","headers":{},"timeout_ms":5}"#;
        let binding: ToolBinding = serde_json::from_str(old).unwrap();
        let ToolBinding::Http(http) = &binding else {
            panic!("http")
        };
        assert_eq!(http.request, HttpRequestOptions::default());
        assert_eq!(serde_json::to_string(&binding).unwrap(), old);
    }

    #[test]
    fn request_options_round_trip_flat() {
        let binding = ToolBinding::Http(HttpBinding {
            endpoint: "/x".into(),
            method: "POST".into(),
            headers: BTreeMap::new(),
            timeout_ms: 5,
            request: HttpRequestOptions {
                auth: HttpAuth::Oauth2Client {
                    token_url: "https://auth/token".into(),
                    client_id: "c".into(),
                    client_secret: "{{config.S}}".into(),
                    scopes: "a b".into(),
                },
                query_params: vec![QueryParam {
                    key: "k".into(),
                    value: "{{v}}".into(),
                }],
                body_type: BodyType::Form,
                body_mode: BodyMode::None,
                body_template: Some("a={{v}}".into()),
                ..HttpRequestOptions::default()
            },
        });
        let json = serde_json::to_value(&binding).unwrap();
        assert_eq!(json["auth"]["type"], "oauth2_client");
        assert_eq!(json["body_type"], "form");
        assert_eq!(json["body_mode"], "none");
        let back: ToolBinding = serde_json::from_value(json).unwrap();
        assert_eq!(back, binding);
    }

    #[test]
    fn placeholders_split() {
        assert_eq!(
            split_placeholders("Bearer {{ config.T }}!{{x}}").unwrap(),
            vec![
                TemplatePiece::Text("Bearer "),
                TemplatePiece::Placeholder {
                    inner: "config.T",
                    at: 7
                },
                TemplatePiece::Text("!"),
                TemplatePiece::Placeholder { inner: "x", at: 22 },
            ]
        );
        assert_eq!(split_placeholders("a {{b").unwrap_err(), 2);
        assert_eq!(config_placeholder_name("config.A-b.c"), Some("A-b.c"));
        assert_eq!(config_placeholder_name("config."), None);
        assert_eq!(config_placeholder_name("session.x"), None);
        assert_eq!(secret_placeholder_name("_secret.txn_otp"), Some("txn_otp"));
        assert_eq!(secret_placeholder_name("_secret.a.b"), None);
        assert_eq!(secret_placeholder_name("_secret."), None);
        assert_eq!(secret_placeholder_name("config.A"), None);
    }

    #[test]
    fn a_secret_is_taken_out_of_a_result_and_a_marker_left() {
        let mut result = serde_json::json!({
            "otp_token": "123456", "expires_in": 300,
            "session": {"key": {"id": 7}, "none": null}, "list": [1]
        });
        assert_eq!(
            take_secret_at(&mut result, "otp_token", "txn_otp").as_deref(),
            Some("123456")
        );
        assert_eq!(
            take_secret_at(&mut result, "session.key", "s").as_deref(),
            Some(r#"{"id":7}"#)
        );
        // Taken before, absent, null, or through something not an object.
        for path in [
            "otp_token",
            "missing",
            "session.none",
            "list.0",
            "expires_in.x",
        ] {
            assert_eq!(take_secret_at(&mut result, path, "txn_otp"), None, "{path}");
        }
        assert_eq!(
            result,
            serde_json::json!({
                "otp_token": "[VAULTED:txn_otp]", "expires_in": 300,
                "session": {"key": "[VAULTED:s]", "none": null}, "list": [1]
            })
        );
        assert!(is_vault_key("txn_otp") && is_vault_key("_a-1"));
        assert!(!is_vault_key("") && !is_vault_key("1a") && !is_vault_key("a.b"));
        assert!(!is_vault_key(&"k".repeat(MAX_VAULT_KEY_CHARS + 1)));
    }
}
