//! MCP client: discovers and calls the tools of MCP servers, with every
//! outcome typed so that the engine can apply repeat safety.
//!
//! - [`config`]: servers by logical name (stdio or Streamable HTTP) and
//!   `{{config.X}}` placeholders ([`McpConfig`]).
//! - [`McpClient`]: the interface the worker uses; [`connect`] makes one for a
//!   server, [`McpServers`] holds one per configured server.
//! - [`schema`]: listed tool → pinned [`McpToolDefinition`] (hash, refusals).
//! - [`default_repeat_safety`]: the default repeat safety of an MCP tool.
//! - `rmcp_client`: the only module that imports `rmcp` (pinned `=3.11.0`); it
//!   speaks protocol 2026-07-28 and falls back to 2025-11-25 for servers that
//!   do not know it.
//!
//! A call ([`McpClient::call_tool`]) never retries an effect and never waits
//! for a person: it returns one [`CallOutcome`] saying whether the request
//! reached the server. A stdio server that dies is restarted (with backoff)
//! by the client; the call that was in flight is `LostAfterSend`.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use belay_proto::v1::FailureClass;
pub use belay_proto::wire::{SamplingGrant, SamplingUsage};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tokio::sync::{broadcast, watch};

pub mod config;
mod result;
mod rmcp_client;
pub mod schema;

pub use config::{
    ConfigError, HttpServerConfig, McpConfig, McpServerConfig, OAuthClientConfig, ResolvedOAuth,
    ResolvedServer, ResolvedTransport, StdioServerConfig,
};
pub use result::Truncation;
pub use schema::{RawTool, SchemaRefusal, SchemaSide};
pub use tokio_util::sync::CancellationToken;

/// A boxed, `Send` future, so that [`McpClient`] can be used as a trait object.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Default whole-call timeout of [`CallRequest::new`], in ms.
pub const DEFAULT_CALL_TIMEOUT_MS: u64 = 60_000;
/// Default result size limit of [`CallRequest::new`], in bytes.
pub const DEFAULT_MAX_RESULT_BYTES: usize = 1024 * 1024;
/// `_meta` key carrying [`CallRequest::idempotency_key`] to the server.
pub const IDEMPOTENCY_META_KEY: &str = "io.belay/idempotency-key";
/// `_meta` key of a call's W3C `traceparent` (the MCP convention for trace
/// context in `_meta`, [`CallRequest::trace`]).
pub const TRACEPARENT_META_KEY: &str = "traceparent";
/// `_meta` key of a call's W3C `tracestate`, when it has one.
pub const TRACESTATE_META_KEY: &str = "tracestate";

/// A connection to one MCP server, by logical name.
///
/// Implementations keep the connection alive (restarting a stdio server that
/// died) and hold no durable state.
pub trait McpClient: Send + Sync {
    /// The server's logical name.
    fn server(&self) -> &str;

    /// Whether the configuration trusts this server's hints
    /// (see [`default_repeat_safety`]).
    fn trusted(&self) -> bool;

    /// Lists every tool (following `nextCursor` through all pages) and maps
    /// each to a pinned definition or a refusal. Waits for a connection up to
    /// the server's connect timeout. The result also becomes the catalog that
    /// calls are checked against.
    ///
    /// # Errors
    /// [`McpError::Disconnected`] when no connection came up in time,
    /// [`McpError::Protocol`] when the server answered with an error or
    /// something that is not a tool list, [`McpError::Closed`] after
    /// [`McpClient::shutdown`].
    fn list_tools(&self) -> BoxFuture<'_, Result<Discovery, McpError>>;

    /// Calls one tool once. Checks before sending (not sent when refused):
    /// per-call headers, the tool is listed and mappable, its definition hash
    /// is [`CallRequest::expected_hash`], the arguments match its input
    /// schema. The checks run against the catalog of the connection the
    /// call is sent on: it is re-listed first when it is stale
    /// ([`McpClient::tools_changed`] moved on, e.g. the server restarted
    /// while the call waited for the connection).
    fn call_tool(&self, request: CallRequest) -> BoxFuture<'_, CallOutcome>;

    /// A counter that increases on every `notifications/tools/list_changed`
    /// and every reconnection (a restarted server may list other tools).
    /// `changed().await` on it is the "tools changed" signal; a
    /// [`Discovery`] whose [`Discovery::change_seq`] is below the current
    /// value is stale.
    fn tools_changed(&self) -> watch::Receiver<u64>;

    /// Connection state, now.
    fn status(&self) -> ServerStatus;

    /// Connection, progress and tool-change events, as they happen. Slow
    /// receivers lose the oldest events (`broadcast` semantics).
    fn events(&self) -> broadcast::Receiver<McpEvent>;

    /// Stops the connection (and the stdio process); later calls return
    /// `Disconnected`. Idempotent.
    fn shutdown(&self) -> BoxFuture<'_, ()>;

    /// Lists the server's resources and resource templates (every page),
    /// as MCP JSON. A server without resources lists none.
    ///
    /// # Errors
    /// As [`McpClient::list_tools`].
    fn list_resources(&self) -> BoxFuture<'_, Result<ResourceListing, McpError>>;

    /// Reads one resource (`resources/read`) once. Its contents come back
    /// as [`CallOutcome::Ok`] whose [`ToolResult::content`] holds the MCP
    /// `contents` entries (`{uri, mimeType, text | blob}`), cut to
    /// [`ReadRequest::max_result_bytes`]; a JSON-RPC error (e.g. -32002,
    /// resource not found) is [`CallOutcome::Rejected`]. A read changes
    /// nothing, so the other outcomes only say whether to try again.
    fn read_resource(&self, request: ReadRequest) -> BoxFuture<'_, CallOutcome>;
}

/// What [`McpClient::list_resources`] found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResourceListing {
    /// Server name.
    pub server: String,
    /// `resources/list` entries (`uri`, `name`, `mimeType`, …), untrusted.
    pub resources: Vec<Value>,
    /// `resources/templates/list` entries (`uriTemplate`, `name`, …),
    /// untrusted; empty when the server has none or does not know the method.
    pub templates: Vec<Value>,
}

/// One [`McpClient::read_resource`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadRequest {
    /// The resource's URI.
    pub uri: String,
    /// Whole-read timeout (waiting for a connection included), in ms.
    pub timeout_ms: u64,
    /// Size limit of the contents, in bytes.
    pub max_result_bytes: usize,
}

impl ReadRequest {
    /// A read of `uri` with [`DEFAULT_CALL_TIMEOUT_MS`] and
    /// [`DEFAULT_MAX_RESULT_BYTES`].
    pub fn new(uri: impl Into<String>) -> Self {
        Self {
            uri: uri.into(),
            timeout_ms: DEFAULT_CALL_TIMEOUT_MS,
            max_result_bytes: DEFAULT_MAX_RESULT_BYTES,
        }
    }
}

/// Fills a `resource:` URI template (RFC 6570 level 1: `{name}` only) from
/// `arguments`: strings as they are, numbers and booleans as JSON text,
/// each percent-encoded except RFC 3986's unreserved characters.
///
/// # Errors
/// A message naming the expression whose argument is missing or not a
/// string, number or boolean, or a malformed template.
pub fn expand_uri_template(
    template: &str,
    arguments: &Map<String, Value>,
) -> Result<String, String> {
    const UNRESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~');
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let close = after
            .find('}')
            .ok_or_else(|| format!("unclosed `{{` in `{template}`"))?;
        let name = &after[..close];
        let value = match arguments.get(name) {
            Some(Value::String(s)) => s.clone(),
            Some(v @ (Value::Number(_) | Value::Bool(_))) => v.to_string(),
            Some(_) => {
                return Err(format!(
                    "argument `{name}` is not a string, number or boolean"
                ));
            }
            None => return Err(format!("no argument `{name}` for `{{{name}}}`")),
        };
        out.push_str(&percent_encoding::utf8_percent_encode(&value, UNRESERVED).to_string());
        rest = &after[close + 1..];
    }
    if rest.contains('}') {
        return Err(format!("`}}` without a matching `{{` in `{template}`"));
    }
    out.push_str(rest);
    Ok(out)
}

/// Connects to one server: starts it (stdio) or opens a session (HTTP) and
/// performs the MCP handshake, waiting at most the server's connect timeout.
/// From then on the connection is supervised: when it is lost it is re-made,
/// with exponential backoff between attempts.
///
/// # Errors
/// [`McpError::Spawn`] when the stdio command cannot be started,
/// [`McpError::Connect`] when the handshake fails or times out.
pub async fn connect(server: ResolvedServer) -> Result<Arc<dyn McpClient>, McpError> {
    let client = rmcp_client::RmcpClient::connect(server).await?;
    Ok(Arc::new(client))
}

/// What the client makes of `line`, one line a stdio server writes: a
/// message (its text repaired with U+FFFD where it is not Unicode), a tool
/// result finished as a call's outcome would be (against a tool whose
/// output schema asks for `{"n": integer}`, cut to 1 KiB), an error
/// answer's outcome, an answer that cannot be decoded, a request, or a
/// line that is skipped; as text. Pure; for the fuzz target of MCP messages
/// and for tests.
pub fn check_server_line(line: &[u8]) -> String {
    rmcp_client::check_line(line)
}

/// One [`McpClient`] per configured server.
#[derive(Clone, Default)]
pub struct McpServers {
    clients: BTreeMap<String, Arc<dyn McpClient>>,
}

impl McpServers {
    /// Validates the whole configuration, then connects to every server.
    ///
    /// # Errors
    /// The first [`McpError::Config`] (nothing is started then), or the first
    /// server that fails to connect (those already connected are shut down).
    pub async fn connect_all(config: &McpConfig) -> Result<Self, McpError> {
        config.validate().map_err(McpError::Config)?;
        let mut servers = Self::default();
        for name in config.servers.keys() {
            let resolved = config.resolve(name).map_err(McpError::Config)?;
            match connect(resolved).await {
                Ok(client) => {
                    servers.clients.insert(name.clone(), client);
                }
                Err(e) => {
                    servers.shutdown().await;
                    return Err(e);
                }
            }
        }
        Ok(servers)
    }

    /// The client of server `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn McpClient>> {
        self.clients.get(name)
    }

    /// Server names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.clients.keys().map(String::as_str)
    }

    /// Shuts every client down.
    pub async fn shutdown(&self) {
        for client in self.clients.values() {
            client.shutdown().await;
        }
    }
}

/// Why a client could not be made, or a listing failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum McpError {
    /// The configuration is unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The stdio command could not be started.
    #[error("MCP server `{server}`: cannot start `{command}`: {message}")]
    Spawn {
        /// Server name.
        server: String,
        /// The command as configured.
        command: String,
        /// The OS error, e.g. "No such file or directory (os error 2)".
        message: String,
    },
    /// The handshake (`server/discover` or `initialize`) failed or timed out.
    #[error("MCP server `{server}`: connection failed: {message}")]
    Connect {
        /// Server name.
        server: String,
        /// What happened.
        message: String,
    },
    /// No access token the server accepts could be had for a server with
    /// `oauth`: the discovery of its token endpoint or the token request
    /// failed, or the server refused a fresh token from it with 401. No
    /// request reached the server's tools.
    #[error("MCP server `{server}`: authorization failed: {error}")]
    Authorization {
        /// Server name.
        server: String,
        /// What failed, naming the URL (boxed: it is large and rare).
        error: Box<crate::oauth_discovery::AuthorizationError>,
    },
    /// A stdio server exited before completing the handshake: its exit
    /// status and last stderr lines say why (a missing API key, a bad
    /// argument, a crash).
    #[error(
        "MCP server `{server}` exited ({status}) before completing the MCP handshake; its last stderr lines: {}",
        stderr_text(stderr)
    )]
    Exited {
        /// Server name.
        server: String,
        /// The exit status, e.g. `exit status: 3` or `signal: 9 (SIGKILL)`.
        status: String,
        /// Its last stderr lines (at most 10, each cut to 512 bytes),
        /// oldest first; untrusted text.
        stderr: Vec<String>,
    },
    /// No live connection within the connect timeout.
    #[error("MCP server `{server}` is not connected: {reason}")]
    Disconnected {
        /// Server name.
        server: String,
        /// The last connection error, or what was lost.
        reason: String,
    },
    /// The server answered, but not with what MCP says it must.
    #[error("MCP server `{server}` answered with an error: {message}")]
    Protocol {
        /// Server name.
        server: String,
        /// The error or a description of the bad answer.
        message: String,
    },
    /// The client was shut down.
    #[error("MCP client for `{server}` is shut down")]
    Closed {
        /// Server name.
        server: String,
    },
}

/// A server's stderr lines in an error message: quoted, joined by ` | `.
fn stderr_text(lines: &[String]) -> String {
    if lines.is_empty() {
        return "(none)".to_owned();
    }
    lines
        .iter()
        .map(|l| format!("{l:?}"))
        .collect::<Vec<_>>()
        .join(" | ")
}

/// A tool's behaviour hints (MCP `annotations`). Untrusted: they matter only
/// for a server configured as trusted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolHints {
    /// `annotations.title`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// `readOnlyHint`: the tool does not change its environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    /// `destructiveHint`: it may destroy or overwrite (MCP default: true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destructive: Option<bool>,
    /// `idempotentHint`: repeating a call with the same arguments has no
    /// further effect (MCP default: false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent: Option<bool>,
    /// `openWorldHint`: it reaches outside entities.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_world: Option<bool>,
}

impl ToolHints {
    /// Reads the hints from an MCP `annotations` object; anything not a
    /// boolean (or string, for the title) is treated as absent.
    pub fn from_annotations(annotations: Option<&Value>) -> Self {
        let flag = |key: &str| {
            annotations
                .and_then(|a| a.get(key))
                .and_then(Value::as_bool)
        };
        Self {
            title: annotations
                .and_then(|a| a.get("title"))
                .and_then(Value::as_str)
                .map(str::to_owned),
            read_only: flag("readOnlyHint"),
            destructive: flag("destructiveHint"),
            idempotent: flag("idempotentHint"),
            open_world: flag("openWorldHint"),
        }
    }
}

/// Default repeat safety of an MCP tool (an ABL binding can still declare
/// its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DefaultRepeatSafety {
    /// Never repeated after it may have acted.
    Never,
    /// Repeated with the same idempotency key.
    Idempotent,
}

/// `never`, unless the server is `trusted` and the tool says it is
/// `readOnlyHint` or `idempotentHint`: then `idempotent`. Hints of an
/// untrusted server are ignored (a server could claim anything).
pub fn default_repeat_safety(trusted: bool, hints: &ToolHints) -> DefaultRepeatSafety {
    if trusted && (hints.read_only == Some(true) || hints.idempotent == Some(true)) {
        DefaultRepeatSafety::Idempotent
    } else {
        DefaultRepeatSafety::Never
    }
}

/// A listed tool that Belay can represent, pinned by hash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpToolDefinition {
    /// Name on the server (`server_tool` in ABL).
    pub name: String,
    /// Display title, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Description: untrusted text, for the model as data only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// JSON Schema of the arguments (`"type": "object"`).
    pub input_schema: Value,
    /// JSON Schema of `structuredContent`, when the tool declares one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    /// Behaviour hints.
    pub hints: ToolHints,
    /// `sha256:<hex>`, see [`schema`].
    pub definition_hash: String,
}

/// A listed tool that Belay refuses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedTool {
    /// Name on the server.
    pub name: String,
    /// Hash of what was refused.
    pub definition_hash: String,
    /// Why.
    pub reason: SchemaRefusal,
}

/// The result of listing a server's tools.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Discovery {
    /// Server's logical name.
    pub server: String,
    /// Negotiated protocol revision, e.g. `2025-11-25`.
    pub protocol_version: String,
    /// Value of [`McpClient::tools_changed`] when the listing started.
    pub change_seq: u64,
    /// Tools Belay can call, in the server's order.
    pub tools: Vec<McpToolDefinition>,
    /// Tools Belay refuses, with reasons, in the server's order.
    pub refused: Vec<RefusedTool>,
}

/// One tool call.
#[derive(Debug, Clone)]
pub struct CallRequest {
    /// Tool name on the server (after ABL `server_tool` renaming).
    pub tool: String,
    /// The arguments object, already validated by the engine (checked again
    /// against the input schema before sending).
    pub arguments: Map<String, Value>,
    /// The pinned [`McpToolDefinition::definition_hash`]; when set and the
    /// server now lists a different definition (or none), the call is
    /// refused with [`CallRefusal::DefinitionChanged`].
    pub expected_hash: Option<String>,
    /// Extra HTTP headers for this call (HTTP servers only); values may hold
    /// `{{config.X}}`, and `{{_secret.KEY}}` filled from `secrets`.
    pub headers: BTreeMap<String, String>,
    /// The run's vault values the dispatch handed out (`SECRET_ACCESS`), for
    /// the `{{_secret.KEY}}` of `headers` (a key without a value is the
    /// empty string). Secrets: `Debug` shows the keys only.
    pub secrets: crate::placeholders::SecretValues,
    /// Whole-call timeout (waiting for a connection included), in ms.
    pub timeout_ms: u64,
    /// Result size limit, in bytes (see [`Truncation`]).
    pub max_result_bytes: usize,
    /// The call's idempotency key (`<run_id>/<call_id>`), sent in `_meta` as
    /// [`IDEMPOTENCY_META_KEY`] and used to label events.
    pub idempotency_key: Option<String>,
    /// Answers to a previous [`CallOutcome::NeedsInput`] of this call.
    pub input: Option<InputAnswers>,
    /// Cancels the call: the outcome becomes [`CallOutcome::Cancelled`] and
    /// the server is sent `notifications/cancelled`.
    pub cancel: Option<CancellationToken>,
    /// The completions the server may ask for during this call
    /// (`sampling/createMessage`, see [`SamplingSession`]); `None`: every
    /// such request is refused. Read [`SamplingSession::usage`] after the
    /// call for what was used.
    pub sampling: Option<Arc<SamplingSession>>,
    /// The W3C trace context of the call (the worker's tool-call span),
    /// sent in `_meta` as `traceparent` and `tracestate` (the MCP
    /// convention), so the server's spans join the run's trace.
    pub trace: Option<belay_proto::trace::TraceContext>,
}

impl CallRequest {
    /// A call with [`DEFAULT_CALL_TIMEOUT_MS`], [`DEFAULT_MAX_RESULT_BYTES`]
    /// and nothing else set.
    pub fn new(tool: impl Into<String>, arguments: Map<String, Value>) -> Self {
        Self {
            tool: tool.into(),
            arguments,
            expected_hash: None,
            headers: BTreeMap::new(),
            secrets: crate::placeholders::SecretValues::default(),
            timeout_ms: DEFAULT_CALL_TIMEOUT_MS,
            max_result_bytes: DEFAULT_MAX_RESULT_BYTES,
            idempotency_key: None,
            input: None,
            cancel: None,
            sampling: None,
            trace: None,
        }
    }

    /// The `_meta` entries of [`CallRequest::trace`]: `traceparent`, and
    /// `tracestate` when it has one.
    pub fn trace_meta(&self) -> Vec<(&'static str, String)> {
        let Some(trace) = &self.trace else {
            return Vec::new();
        };
        let mut meta = vec![(TRACEPARENT_META_KEY, trace.traceparent.clone())];
        if !trace.tracestate.is_empty() {
            meta.push((TRACESTATE_META_KEY, trace.tracestate.clone()));
        }
        meta
    }
}

/// What one call may ask of the run's model (`ToolCallSpec.sampling`),
/// how, and what it has used so far. Shared between the call and the
/// client's handler of the server's `sampling/createMessage` requests.
///
/// After the call, [`SamplingSession::finish`] ends it and waits for the
/// completions still running (a call that timed out may leave one), so the
/// usage read then is every completion the server got.
pub struct SamplingSession {
    grant: SamplingGrant,
    sampler: Arc<dyn Sampler>,
    state: std::sync::Mutex<SessionState>,
    /// Completions running now.
    running: watch::Sender<u32>,
}

#[derive(Default)]
struct SessionState {
    used: SamplingUsage,
    /// Output tokens the running completions may still use (their capped
    /// `maxTokens`), held against [`SamplingGrant::max_total_tokens`].
    held_output: u64,
    /// Input tokens the running completions' prompts were estimated at,
    /// held against [`SamplingGrant::max_input_tokens`].
    held_input: u64,
    /// [`SamplingSession::finish`] was called: no completion starts.
    finished: bool,
}

/// Bytes of prompt text counted as one input token when a request is
/// checked against [`SamplingGrant::max_input_tokens`] before the model is
/// called (a rough, generous estimate; the provider's count is what is
/// charged afterwards).
pub const SAMPLING_BYTES_PER_TOKEN: usize = 4;

/// The estimated input tokens of a prompt of `bytes` bytes:
/// [`SAMPLING_BYTES_PER_TOKEN`] bytes a token, rounded up.
pub fn estimated_prompt_tokens(bytes: usize) -> u64 {
    u64::try_from(bytes.div_ceil(SAMPLING_BYTES_PER_TOKEN)).unwrap_or(u64::MAX)
}

impl std::fmt::Debug for SamplingSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SamplingSession")
            .field("grant", &self.grant)
            .field("used", &self.usage())
            .finish_non_exhaustive()
    }
}

impl SamplingSession {
    /// A session for one call under `grant`, whose completions `sampler`
    /// makes.
    pub fn new(grant: SamplingGrant, sampler: Arc<dyn Sampler>) -> Self {
        Self {
            grant,
            sampler,
            state: std::sync::Mutex::new(SessionState::default()),
            running: watch::Sender::new(0),
        }
    }

    /// The grant.
    pub fn grant(&self) -> &SamplingGrant {
        &self.grant
    }

    fn state(&self) -> std::sync::MutexGuard<'_, SessionState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// What the completions made so far used: every completion asked of
    /// the model (failed ones too), and the tokens the provider reported.
    pub fn usage(&self) -> SamplingUsage {
        self.state().used
    }

    /// Ends the session (a completion asked for later is refused) and
    /// waits until no completion is running, so [`SamplingSession::usage`]
    /// then holds every one. A running completion ends within the model
    /// client's timeout.
    pub async fn finish(&self) {
        self.state().finished = true;
        let mut running = self.running.subscribe();
        // The sender lives in `self`, so the wait ends only at zero.
        let _ = running.wait_for(|n| *n == 0).await;
    }

    /// Takes one of the grant's completions for a request asking for at
    /// most `max_tokens` output tokens with a prompt of `prompt_bytes`
    /// bytes (system prompt and messages' text), or says why none is
    /// given: the call has ended, `max_requests` are used, the grant's
    /// output tokens ([`SamplingGrant::max_total_tokens`]) are used up, or
    /// the prompt, estimated with [`estimated_prompt_tokens`], is more
    /// than what is left of [`SamplingGrant::max_input_tokens`].
    ///
    /// The completion's [`Completion::max_tokens`] is `max_tokens` capped
    /// to the grant's `max_tokens` and to what is left of
    /// `max_total_tokens`; that many output tokens and the prompt's
    /// estimate are held (so completions running at once share what is
    /// left) until the returned guard is dropped, and it counts as running
    /// until then.
    pub(crate) fn reserve(
        &self,
        max_tokens: u32,
        prompt_bytes: usize,
    ) -> Result<Completion<'_>, String> {
        let mut state = self.state();
        if state.finished {
            return Err(
                "sampling/createMessage refused: the tool call it belongs to has ended".into(),
            );
        }
        if state.used.requests >= self.grant.max_requests {
            return Err(format!(
                "sampling/createMessage refused: this tool call may ask for {} completion(s) (the tool's `sampling.max_requests`), and has used them",
                self.grant.max_requests
            ));
        }
        let mut cap = max_tokens.min(self.grant.max_tokens);
        if let Some(total) = self.grant.max_total_tokens {
            let left = u64::from(total)
                .saturating_sub(state.used.output_tokens)
                .saturating_sub(state.held_output);
            if left == 0 {
                return Err(format!(
                    "sampling/createMessage refused: this tool call's completions may use {total} output token(s) in all \
                     (what the run's token and cost budgets leave), and have used them"
                ));
            }
            cap = cap.min(u32::try_from(left).unwrap_or(u32::MAX));
        }
        let estimate = estimated_prompt_tokens(prompt_bytes);
        if let Some(total) = self.grant.max_input_tokens {
            let left = u64::from(total)
                .saturating_sub(state.used.input_tokens)
                .saturating_sub(state.held_input);
            if estimate > left {
                return Err(format!(
                    "sampling/createMessage refused: the prompt is about {estimate} input token(s) \
                     ({SAMPLING_BYTES_PER_TOKEN} bytes a token), more than the {left} left of the {total} \
                     this tool call's completions may use in all (what the run's budgets leave)"
                ));
            }
        }
        state.used.requests += 1;
        state.held_output = state.held_output.saturating_add(u64::from(cap));
        state.held_input = state.held_input.saturating_add(estimate);
        self.running.send_modify(|n| *n += 1);
        Ok(Completion {
            session: self,
            max_tokens: cap,
            held_input: estimate,
        })
    }

    /// The sampler.
    pub(crate) fn sampler(&self) -> &Arc<dyn Sampler> {
        &self.sampler
    }
}

/// One completion of a [`SamplingSession`] while it runs.
pub(crate) struct Completion<'a> {
    session: &'a SamplingSession,
    /// Most output tokens it may use (held in the session).
    max_tokens: u32,
    /// Its prompt's estimated input tokens (held in the session).
    held_input: u64,
}

impl Completion<'_> {
    /// Most output tokens this completion may use: the request's
    /// `maxTokens` capped by the grant and what is left of it.
    pub(crate) fn max_tokens(&self) -> u32 {
        self.max_tokens
    }

    /// Adds the completion's tokens as the provider reported them (and
    /// ends it, releasing what it held).
    pub(crate) fn record(self, input_tokens: u64, output_tokens: u64) {
        let mut state = self.session.state();
        state.used.input_tokens = state.used.input_tokens.saturating_add(input_tokens);
        state.used.output_tokens = state.used.output_tokens.saturating_add(output_tokens);
    }
}

impl Drop for Completion<'_> {
    fn drop(&mut self) {
        {
            let mut state = self.session.state();
            state.held_output = state.held_output.saturating_sub(u64::from(self.max_tokens));
            state.held_input = state.held_input.saturating_sub(self.held_input);
        }
        self.session
            .running
            .send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// Makes the completions of [`SamplingSession`]s: the worker's model
/// adapters (`crate::sampling::ModelSampler`), or a test double.
pub trait Sampler: Send + Sync {
    /// One completion, exactly one model request (no retry).
    ///
    /// # Errors
    /// Why the model call failed, as text for the server.
    fn complete(&self, request: SamplingRequest) -> BoxFuture<'_, Result<SamplingAnswer, String>>;
}

/// A server's `sampling/createMessage`, as the client checked it: text
/// only, `max_tokens` already capped by the grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SamplingRequest {
    /// The grant's model name.
    pub model: String,
    /// `systemPrompt`, if any (untrusted server text).
    pub system_prompt: Option<String>,
    /// The conversation, in order (untrusted server text).
    pub messages: Vec<SamplingText>,
    /// Most output tokens: the server's `maxTokens`, at most the grant's.
    pub max_tokens: u32,
}

/// One text message of a [`SamplingRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SamplingText {
    /// `true`: the assistant's; `false`: the user's.
    pub assistant: bool,
    /// The message's text blocks, joined by blank lines.
    pub text: String,
}

/// A completion, for the server's `CreateMessageResult`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SamplingAnswer {
    /// The answer's text.
    pub text: String,
    /// The model that answered.
    pub model: String,
    /// MCP's `stopReason` (`endTurn`, `maxTokens`, `toolUse`, or the
    /// provider's own), if known.
    pub stop_reason: Option<String>,
    /// Input (prompt) tokens, as the provider reported them.
    pub input_tokens: u64,
    /// Output tokens, as the provider reported them.
    pub output_tokens: u64,
}

/// The user's answers to a [`CallOutcome::NeedsInput`], collected durably by
/// the engine, for the repeated call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InputAnswers {
    /// Protocol 2026-07-28 (`input_required`): responses by the keys of
    /// [`InputNeeded::requests`], sent as `inputResponses`.
    #[serde(default)]
    pub responses: Map<String, Value>,
    /// Protocol 2026-07-28: [`InputNeeded::request_state`], echoed unchanged.
    #[serde(default)]
    pub request_state: Option<String>,
    /// Older protocols: answers to the server's `elicitation/create`
    /// requests during the repeated call, in the order it asks.
    #[serde(default)]
    pub elicitations: Vec<ElicitationAnswer>,
}

/// One answer to an `elicitation/create` request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ElicitationAnswer {
    /// What the user did.
    pub action: ElicitationAction,
    /// The form's content, for `accept`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Value>,
    /// The `elicitation/create` params this answers, as the engine recorded
    /// them. A repeated call whose server asks something else (another
    /// message, mode, URL or form; a new `elicitationId` alone does not
    /// count) is not given this answer: the call needs input again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub question: Option<Value>,
}

impl ElicitationAnswer {
    /// Whether this answer was given to `asked` (the `elicitation/create`
    /// params as JSON). An answer recorded without its question fits any.
    pub fn answers(&self, asked: &Value) -> bool {
        let Some(question) = &self.question else {
            return true;
        };
        ["message", "mode", "url", "requestedSchema"]
            .iter()
            .all(|k| question.get(k) == asked.get(k))
    }
}

/// MCP elicitation actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ElicitationAction {
    /// The user submitted the form.
    Accept,
    /// The user said no.
    Decline,
    /// The user dismissed it.
    Cancel,
}

/// A tool's result, possibly cut to the size limit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    /// MCP content blocks as JSON (`{"type": "text", "text": …}`, images, …).
    /// Untrusted data.
    pub content: Vec<Value>,
    /// `structuredContent`; validated against the output schema for a
    /// successful result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured_content: Option<Value>,
    /// Set when the result was cut to [`CallRequest::max_result_bytes`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncation: Option<Truncation>,
}

/// How a call ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum CallOutcome {
    /// The tool succeeded.
    Ok(ToolResult),
    /// The tool ran and reported failure (`isError: true`): a tool failure,
    /// never a success.
    ToolError(ToolResult),
    /// The server needs input from the user before the call can complete.
    NeedsInput(InputNeeded),
    /// Refused before anything was sent.
    Refused(CallRefusal),
    /// No connection, or the request could not be written: nothing was sent.
    Disconnected {
        /// What happened.
        reason: String,
    },
    /// The request was sent but its answer was lost (the server died, the
    /// stream broke), or the tool failed after the run's model failed a
    /// completion its server asked for (MCP sampling): the tool may have
    /// acted, and a repeat may succeed.
    LostAfterSend {
        /// What happened.
        reason: String,
    },
    /// The server answered `tools/call` with a JSON-RPC error (unknown tool,
    /// invalid arguments, …): a protocol-level refusal.
    Rejected {
        /// JSON-RPC error code.
        code: i32,
        /// Error message (untrusted text).
        message: String,
        /// Error data, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        data: Option<Value>,
    },
    /// The server answered with something unusable (not a tool result, or
    /// `structuredContent` missing or not matching the output schema): the
    /// tool may have acted.
    Malformed {
        /// What is wrong.
        reason: String,
    },
    /// The server's answer arrived but cannot be decoded (stdio: a line
    /// that is not JSON even after text that is not Unicode was replaced
    /// with U+FFFD, e.g. cut off, yet names the call's request id). A
    /// definite, deterministic failure: the same answer would come again,
    /// so it is never retried as if it had been lost.
    Undecodable {
        /// Why it cannot be decoded (the decoder's error).
        reason: String,
    },
    /// The server's answer was larger than a stdio message may be (64 MiB),
    /// so it could not be read: the tool acted, its result is lost.
    AnswerTooLarge {
        /// The limit, in bytes.
        limit_bytes: u64,
    },
    /// Cancelled through [`CallRequest::cancel`] or by the server.
    Cancelled {
        /// Whether the request had been handed to the transport (the tool may
        /// have acted).
        sent: bool,
        /// Why, if known.
        reason: Option<String>,
    },
    /// [`CallRequest::timeout_ms`] passed without an answer.
    Timeout {
        /// The timeout, in ms.
        timeout_ms: u64,
        /// Whether the request may have reached the server (stdio: written
        /// whole; HTTP: handed to the transport).
        sent: bool,
        /// Why, when more is known: a stdio request that could not be
        /// written whole (the server is not reading its stdin, and is
        /// restarted).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
    },
    /// The server asked for a completion (`sampling/createMessage`) that
    /// Belay did not give, and the call failed for it: the server's request
    /// was answered with a JSON-RPC error saying why (the call has no
    /// [`CallRequest::sampling`] grant, it used the grant's completions,
    /// several calls were in flight on a stdio connection so the asker is
    /// unknown, or the request holds something other than text; a model
    /// call that failed is not a refusal, see [`CallOutcome::LostAfterSend`])
    /// and the tool then reported an error or refused the
    /// call; or (protocol 2026-07-28) the call returned `input_required`
    /// with a sampling request in it, which Belay does not answer. A
    /// definite answer: repeating it changes nothing. A tool that recovers
    /// from the refusal and succeeds ends [`CallOutcome::Ok`].
    SamplingRefused {
        /// Whether the tool had been running when it asked (older
        /// protocols), so it may have acted; `false` for `input_required`.
        may_have_acted: bool,
        /// What the server said after the refusal (its tool error text or
        /// JSON-RPC error), untrusted; `None` for `input_required`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
    },
}

impl CallOutcome {
    /// Whether the tool may have acted on the server (the request was sent
    /// and no definite answer says otherwise). `Ok` and `ToolError` did act.
    pub fn may_have_acted(&self) -> bool {
        match self {
            Self::Ok(_) | Self::ToolError(_) => true,
            Self::NeedsInput(n) => n.may_have_acted,
            Self::Refused(_) | Self::Disconnected { .. } | Self::Rejected { .. } => false,
            Self::LostAfterSend { .. }
            | Self::Malformed { .. }
            | Self::Undecodable { .. }
            | Self::AnswerTooLarge { .. } => true,
            Self::Cancelled { sent, .. } | Self::Timeout { sent, .. } => *sent,
            Self::SamplingRefused { may_have_acted, .. } => *may_have_acted,
        }
    }

    /// The failure class to report in `FailTask`; `None` for `Ok` (report a
    /// result) and `NeedsInput` (the engine waits for the user).
    /// `ToolError` (`isError`, the tool's own answer), `Undecodable` and
    /// `Refused` are definite answers (`REJECTED`): repeating changes
    /// nothing. A JSON-RPC error (`Rejected`) is the protocol's answer, not
    /// the tool's: one that says the request was refused before anything
    /// ran ([`refused_before_running`]) is `REJECTED`, any other (-32603
    /// internal error, a server's own code) `MAY_HAVE_ACTED`, so the tool's
    /// repeat safety decides (an `idempotent` tool is tried again, a
    /// `reconcile` one becomes an uncertain outcome).
    pub fn failure_class(&self) -> Option<FailureClass> {
        match self {
            Self::Ok(_) | Self::NeedsInput(_) => None,
            Self::Disconnected { .. } | Self::Refused(CallRefusal::MissingConfigValue { .. }) => {
                Some(FailureClass::NotSent)
            }
            Self::Rejected { code, .. } if !refused_before_running(*code) => {
                Some(FailureClass::MayHaveActed)
            }
            Self::ToolError(_)
            | Self::Rejected { .. }
            | Self::Refused(_)
            | Self::Undecodable { .. }
            | Self::SamplingRefused { .. } => Some(FailureClass::Rejected),
            Self::LostAfterSend { .. } | Self::Malformed { .. } | Self::AnswerTooLarge { .. } => {
                Some(FailureClass::MayHaveActed)
            }
            Self::Cancelled { sent, .. } | Self::Timeout { sent, .. } => Some(if *sent {
                FailureClass::MayHaveActed
            } else {
                FailureClass::NotSent
            }),
        }
    }
}

/// Whether a JSON-RPC error code says the server refused the request
/// before handling it (JSON-RPC 2.0's parse error -32700, invalid request
/// -32600, method not found -32601, invalid params -32602: MCP answers an
/// unknown tool or invalid arguments so), so the tool did not run.
pub fn refused_before_running(code: i32) -> bool {
    matches!(code, -32700 | -32600 | -32601 | -32602)
}

/// Which of the three kinds of MCP failure an outcome is, for the events
/// and the audit (`ToolCallFailed.kind`): the tool's own answer, the
/// protocol's, or the transport's. `None` for a success, a question for a
/// person, and a call Belay refused before sending (not an answer of the
/// server's).
pub fn failure_kind(outcome: &CallOutcome) -> Option<ToolFailureKind> {
    match outcome {
        CallOutcome::Ok(_) | CallOutcome::NeedsInput(_) | CallOutcome::Refused(_) => None,
        CallOutcome::ToolError(_) | CallOutcome::SamplingRefused { .. } => {
            Some(ToolFailureKind::ToolError)
        }
        CallOutcome::Rejected { .. }
        | CallOutcome::Malformed { .. }
        | CallOutcome::Undecodable { .. }
        | CallOutcome::AnswerTooLarge { .. } => Some(ToolFailureKind::ProtocolError),
        CallOutcome::Disconnected { .. }
        | CallOutcome::LostAfterSend { .. }
        | CallOutcome::Cancelled { .. }
        | CallOutcome::Timeout { .. } => Some(ToolFailureKind::Transport),
    }
}

/// The three kinds of MCP failure ([`failure_kind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolFailureKind {
    /// The tool ran and reported failure (`isError: true`).
    ToolError,
    /// The server answered with a JSON-RPC error, or with an answer that
    /// is not a usable result (malformed, undecodable, too large).
    ProtocolError,
    /// No answer: not sent, lost after sending, timed out, cancelled.
    Transport,
}

/// What the server asks the user for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputNeeded {
    /// How it asked.
    pub via: InputVia,
    /// What it asked, as MCP JSON: the `inputRequests` map
    /// ([`InputVia::InputRequired`]), the `elicitation/create` params
    /// ([`InputVia::Elicitation`]), or the `-32042` error data
    /// ([`InputVia::UrlElicitationRequired`]). Untrusted.
    pub requests: Value,
    /// Opaque state to echo in [`InputAnswers::request_state`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_state: Option<String>,
    /// True for [`InputVia::Elicitation`]: the server kept running the tool
    /// after Belay answered `cancel`, so it may have acted.
    pub may_have_acted: bool,
}

/// The three ways MCP servers ask for input mid-call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputVia {
    /// Protocol 2026-07-28: the call returned `resultType: input_required`.
    InputRequired,
    /// Older protocols: the server sent `elicitation/create` during the call;
    /// Belay answered `cancel` (it never waits for a person in memory).
    Elicitation,
    /// The server answered with error `-32042` (URL elicitation required).
    UrlElicitationRequired,
}

/// Why a call was refused before sending.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CallRefusal {
    /// The server does not list this tool.
    #[error("the server does not list a tool `{tool}`")]
    UnknownTool {
        /// Tool name.
        tool: String,
    },
    /// The tool's schema cannot be represented.
    #[error("tool `{tool}` is refused: {reason}")]
    SchemaRefused {
        /// Tool name.
        tool: String,
        /// Why.
        reason: SchemaRefusal,
    },
    /// The listed definition differs from the pinned one.
    #[error("tool `{tool}` changed: pinned {expected}, listed {}", actual.as_deref().unwrap_or("nothing"))]
    DefinitionChanged {
        /// Tool name.
        tool: String,
        /// The pinned hash.
        expected: String,
        /// The listed hash; `None` when the tool is gone.
        actual: Option<String>,
    },
    /// The arguments do not match the input schema.
    #[error("arguments of `{tool}` do not match its input schema: {errors}")]
    InvalidArguments {
        /// Tool name.
        tool: String,
        /// Violations, `pointer: message; …`.
        errors: String,
    },
    /// A per-call header is invalid, reserved, or has an unresolvable
    /// placeholder.
    #[error("header `{name}`: {reason}")]
    InvalidHeader {
        /// Header name.
        name: String,
        /// Why.
        reason: String,
    },
    /// A per-call header's `{{config.NAME}}` has no value in this worker's
    /// configuration: nothing was sent, and another worker may have it
    /// (`NOT_SENT`).
    #[error("header `{name}`: {reason}")]
    MissingConfigValue {
        /// Header name.
        name: String,
        /// Which placeholder.
        reason: String,
    },
    /// Per-call headers were given for a stdio server.
    #[error("per-call headers need an HTTP server; `{server}` is stdio")]
    HeadersNotSupported {
        /// Server name.
        server: String,
    },
}

/// Connection state of a client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerStatus {
    /// Logical name.
    pub server: String,
    /// `stdio` or `http`.
    pub transport: String,
    /// Whether a live connection is up now.
    pub connected: bool,
    /// Number of the latest connection that came up: 1 for the first; every
    /// later attempt takes the next number, so failed attempts skip some.
    pub generation: u64,
    /// Process id of the stdio server, when up.
    pub pid: Option<u32>,
    /// Negotiated protocol revision, when up.
    pub protocol_version: Option<String>,
    /// Why the last connection was lost or the last attempt failed.
    pub last_error: Option<String>,
}

/// Something that happened on a connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum McpEvent {
    /// A connection came up (first or re-made).
    Connected {
        /// Connection number.
        generation: u64,
        /// Process id (stdio).
        pid: Option<u32>,
        /// Negotiated protocol revision.
        protocol_version: String,
    },
    /// The connection was lost; a new one will be attempted.
    ConnectionLost {
        /// Connection number that was lost.
        generation: u64,
        /// Why.
        reason: String,
    },
    /// An attempt to reconnect failed; another follows after a delay.
    ConnectFailed {
        /// Why.
        reason: String,
    },
    /// The server sent `notifications/tools/list_changed`.
    ToolsChanged,
    /// A `tools/call` request was handed over by the transport (stdio: the
    /// line is written to the server's stdin; HTTP: the server answered the
    /// POST).
    RequestWritten {
        /// [`CallRequest::idempotency_key`], or `call-<n>`.
        call: String,
    },
    /// The server reported progress on a call.
    Progress {
        /// As in [`McpEvent::RequestWritten`].
        call: String,
        /// Progress so far.
        progress: f64,
        /// Total, if known.
        total: Option<f64>,
        /// Message (untrusted).
        message: Option<String>,
    },
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn hints(read_only: Option<bool>, idempotent: Option<bool>) -> ToolHints {
        ToolHints {
            read_only,
            idempotent,
            ..ToolHints::default()
        }
    }

    #[test]
    fn repeat_safety_is_never_unless_trusted_and_hinted() {
        use DefaultRepeatSafety::{Idempotent, Never};
        let cases = [
            (false, hints(Some(true), Some(true)), Never),
            (false, hints(None, None), Never),
            (true, hints(None, None), Never),
            (true, hints(Some(false), Some(false)), Never),
            (true, hints(Some(true), None), Idempotent),
            (true, hints(None, Some(true)), Idempotent),
            (true, hints(Some(false), Some(true)), Idempotent),
        ];
        for (trusted, h, expected) in cases {
            assert_eq!(
                default_repeat_safety(trusted, &h),
                expected,
                "{trusted} {h:?}"
            );
        }
        // A destructive hint does not matter once the tool is idempotent.
        let destructive = ToolHints {
            destructive: Some(true),
            ..hints(None, Some(true))
        };
        assert_eq!(default_repeat_safety(true, &destructive), Idempotent);
    }

    #[test]
    fn hints_come_from_annotations() {
        let h = ToolHints::from_annotations(Some(&json!({
            "title": "T", "readOnlyHint": true, "destructiveHint": "yes", "idempotentHint": false
        })));
        assert_eq!(h.title.as_deref(), Some("T"));
        assert_eq!(h.read_only, Some(true));
        assert_eq!(h.destructive, None);
        assert_eq!(h.idempotent, Some(false));
        assert_eq!(ToolHints::from_annotations(None), ToolHints::default());
    }

    #[test]
    fn uri_templates_fill_and_encode_their_arguments() {
        let args = |v: Value| match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        };
        assert_eq!(
            expand_uri_template(
                "docs://a/{id}/v{n}?x={q}",
                &args(json!({"id": "a b/c", "n": 2, "q": true}))
            )
            .unwrap(),
            "docs://a/a%20b%2Fc/v2?x=true"
        );
        assert_eq!(
            expand_uri_template("file:///x", &Map::new()).unwrap(),
            "file:///x"
        );
        assert!(expand_uri_template("d://{id}", &Map::new()).is_err());
        assert!(expand_uri_template("d://{id", &args(json!({"id": "x"}))).is_err());
        assert!(expand_uri_template("d://{id}", &args(json!({"id": [1]}))).is_err());
    }

    struct NoModel;

    impl Sampler for NoModel {
        fn complete(
            &self,
            _request: SamplingRequest,
        ) -> BoxFuture<'_, Result<SamplingAnswer, String>> {
            Box::pin(async { Err("no model here".to_owned()) })
        }
    }

    #[tokio::test]
    async fn a_session_counts_its_completions_and_finishes_after_the_running_one() {
        use futures_util::FutureExt as _;
        let grant = SamplingGrant {
            model: "m".into(),
            max_requests: 2,
            max_tokens: 10,
            max_total_tokens: None,
            max_input_tokens: None,
        };
        let session = SamplingSession::new(grant, Arc::new(NoModel));
        let first = session.reserve(100, 8).unwrap();
        assert_eq!(first.max_tokens(), 10);
        first.record(3, 4);
        let running = session.reserve(5, 8).unwrap();
        assert_eq!(running.max_tokens(), 5);
        // The grant's two completions are taken.
        assert!(
            session
                .reserve(5, 8)
                .is_err_and(|e| e.contains("has used them"))
        );
        // A completion still runs: finishing waits for it.
        let mut finish = Box::pin(session.finish());
        assert!(finish.as_mut().now_or_never().is_none());
        running.record(5, 6);
        finish.await;
        assert_eq!(
            session.usage(),
            SamplingUsage {
                requests: 2,
                input_tokens: 8,
                output_tokens: 10
            }
        );
        // Nothing starts once the call has ended.
        let ended = SamplingSession::new(
            SamplingGrant {
                model: "m".into(),
                max_requests: 5,
                max_tokens: 10,
                max_total_tokens: None,
                max_input_tokens: None,
            },
            Arc::new(NoModel),
        );
        ended.finish().await;
        assert!(ended.reserve(1, 1).is_err_and(|e| e.contains("has ended")));
        assert_eq!(ended.usage(), SamplingUsage::default());
    }

    fn bounded(max_total_tokens: Option<u32>, max_input_tokens: Option<u32>) -> SamplingSession {
        SamplingSession::new(
            SamplingGrant {
                model: "m".into(),
                max_requests: 10,
                max_tokens: 40,
                max_total_tokens,
                max_input_tokens,
            },
            Arc::new(NoModel),
        )
    }

    #[test]
    fn a_session_caps_each_completion_to_what_is_left_of_its_output_tokens() {
        let session = bounded(Some(100), None);
        // Capped by the grant's `max_tokens` first.
        let first = session.reserve(500, 10).unwrap();
        assert_eq!(first.max_tokens(), 40);
        first.record(5, 30);
        // 70 left: a completion may still take 40.
        let second = session.reserve(500, 10).unwrap();
        assert_eq!(second.max_tokens(), 40);
        // While it runs, its 40 are held: 30 left for one at the same time.
        let third = session.reserve(500, 10).unwrap();
        assert_eq!(third.max_tokens(), 30);
        assert!(
            session
                .reserve(1, 10)
                .is_err_and(|e| e.contains("100 output token(s) in all")),
        );
        // The provider reports fewer than were held: the rest comes back.
        second.record(5, 10);
        third.record(5, 25);
        // 100 - 30 - 10 - 25 = 35 left.
        let fourth = session.reserve(500, 10).unwrap();
        assert_eq!(fourth.max_tokens(), 35);
        fourth.record(5, 35);
        assert!(
            session
                .reserve(1, 10)
                .is_err_and(|e| e.contains("have used them"))
        );
        assert_eq!(
            session.usage(),
            SamplingUsage {
                requests: 4,
                input_tokens: 20,
                output_tokens: 100
            }
        );
        // A failed completion (dropped unrecorded) gives back what it held.
        let session = bounded(Some(50), None);
        drop(session.reserve(50, 10).unwrap());
        assert_eq!(session.reserve(50, 10).unwrap().max_tokens(), 40);
        assert_eq!(session.usage().requests, 2);
        assert_eq!(session.usage().output_tokens, 0);
    }

    #[test]
    fn a_session_refuses_a_prompt_estimated_past_what_is_left_of_its_input_tokens() {
        assert_eq!(estimated_prompt_tokens(0), 0);
        assert_eq!(estimated_prompt_tokens(1), 1);
        assert_eq!(estimated_prompt_tokens(8), 2);
        assert_eq!(estimated_prompt_tokens(9), 3);
        let session = bounded(None, Some(50));
        // 200 bytes: 50 tokens, exactly what is left.
        let first = session.reserve(10, 200).unwrap();
        // While it runs its estimate is held: nothing left for another.
        assert!(session.reserve(10, 1).is_err_and(
            |e| e.contains("about 1 input token(s)") && e.contains("the 0 left of the 50")
        ),);
        // The provider counted 30: 20 are left.
        first.record(30, 5);
        assert!(
            session
                .reserve(10, 81)
                .is_err_and(|e| e.contains("about 21 input token(s)") && e.contains("the 20 left")),
        );
        // A refused request is not counted.
        assert_eq!(session.usage().requests, 1);
        session.reserve(10, 80).unwrap().record(20, 5);
        assert!(session.reserve(10, 1).is_err());
        assert_eq!(
            session.usage(),
            SamplingUsage {
                requests: 2,
                input_tokens: 50,
                output_tokens: 10
            }
        );
        // Without bounds, neither is limited but by `max_tokens`.
        let free = bounded(None, None);
        assert_eq!(free.reserve(u32::MAX, usize::MAX).unwrap().max_tokens(), 40);
    }

    #[test]
    fn outcomes_map_to_failure_classes() {
        let lost = CallOutcome::LostAfterSend { reason: "x".into() };
        assert_eq!(lost.failure_class(), Some(FailureClass::MayHaveActed));
        assert!(lost.may_have_acted());
        let down = CallOutcome::Disconnected { reason: "x".into() };
        assert_eq!(down.failure_class(), Some(FailureClass::NotSent));
        assert!(!down.may_have_acted());
        let err = CallOutcome::ToolError(ToolResult::default());
        assert_eq!(err.failure_class(), Some(FailureClass::Rejected));
        let timeout = CallOutcome::Timeout {
            timeout_ms: 1,
            sent: false,
            detail: None,
        };
        assert_eq!(timeout.failure_class(), Some(FailureClass::NotSent));
        // A JSON-RPC error is the protocol's answer: repeat safety decides,
        // unless it says the request was refused before anything ran.
        let rpc = |code| CallOutcome::Rejected {
            code,
            message: "m".into(),
            data: None,
        };
        assert_eq!(
            rpc(-32603).failure_class(),
            Some(FailureClass::MayHaveActed)
        );
        assert_eq!(
            rpc(-32000).failure_class(),
            Some(FailureClass::MayHaveActed)
        );
        for code in [-32700, -32600, -32601, -32602] {
            assert_eq!(
                rpc(code).failure_class(),
                Some(FailureClass::Rejected),
                "{code}"
            );
        }
        let undecodable = CallOutcome::Undecodable { reason: "x".into() };
        assert_eq!(undecodable.failure_class(), Some(FailureClass::Rejected));
        // Three kinds: the tool's answer, the protocol's, the transport's.
        assert_eq!(failure_kind(&err), Some(ToolFailureKind::ToolError));
        assert_eq!(
            failure_kind(&rpc(-32603)),
            Some(ToolFailureKind::ProtocolError)
        );
        assert_eq!(
            failure_kind(&undecodable),
            Some(ToolFailureKind::ProtocolError)
        );
        assert_eq!(failure_kind(&lost), Some(ToolFailureKind::Transport));
        assert_eq!(failure_kind(&timeout), Some(ToolFailureKind::Transport));
        assert_eq!(failure_kind(&CallOutcome::Ok(ToolResult::default())), None);
        assert_eq!(CallOutcome::Ok(ToolResult::default()).failure_class(), None);
        let json = serde_json::to_value(&lost).unwrap();
        assert_eq!(json["outcome"], "lost_after_send");
    }
}
