//! [`McpClient`] over `rmcp` (pinned `=3.11.0`). The only module that
//! imports `rmcp`: when its API moves, this file moves with it.
//!
//! Pieces:
//! - [`Tracked`]: wraps the rmcp transport to learn, per call, whether the
//!   `tools/call` request was handed over (written to stdin, or POSTed),
//!   which is what tells `Disconnected` (not sent) from `LostAfterSend`. Calls
//!   are found by a marker in the request's `_meta` that the wrapper strips
//!   before the request leaves, so servers see unmodified requests.
//! - [`HeaderClient`]: the Streamable HTTP backend (reqwest) plus per-call
//!   headers, looked up by JSON-RPC request id.
//! - [`Handler`]: the client side of server requests and notifications:
//!   `tools/list_changed` (bumps the change counter), progress, logging, and
//!   `elicitation/create`, which is answered from the call's durable answers
//!   or with `cancel` (the call then ends as `NeedsInput`); and
//!   `sampling/createMessage` (the `sampling` capability is declared on
//!   every connection): a request of a call whose [`CallRequest::sampling`]
//!   grant has a completion and tokens left becomes one model call through
//!   the grant's [`super::Sampler`]; any other is refused with a JSON-RPC
//!   error saying why (the call then ends as `SamplingRefused` if it
//!   fails). A request is tied to the call on whose HTTP stream it came,
//!   else (stdio) to the only call in flight if it has been the only call
//!   on the client since it started ([`CallSlot::shared`]); one that
//!   cannot be tied for sure is refused and charged to, and marks, no
//!   call. A model that fails a granted completion is answered -32603 and
//!   is not a refusal: a tool error that follows ends `LostAfterSend` (the
//!   tool may have acted; a repeat may succeed).
//! - the supervisor task: waits for the connection to end, then reconnects
//!   (restarting a stdio server) with exponential backoff (`backon`).
//!
//! Files: `rmcp_client/stdio.rs` (the stdio transport: lines written whole
//! or provably not sent, answers decoded or failed at once, a server's exit
//! told), `rmcp_client/http.rs` (the Streamable HTTP backend and OAuth),
//! `rmcp_client/handler.rs` (the server's requests and notifications).

mod handler;
mod http;
mod stdio;

use handler::Handler;
use http::{HeaderClient, HeaderMap, OAuth, OAuthState, http_not_sent};
pub(crate) use stdio::MAX_STDIO_MESSAGE_BYTES;
use stdio::StdioProcess;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::error::Error as StdError;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBuilder};
use rmcp::model::GetMeta as _;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientCapabilities, ClientConfig,
    ClientJsonRpcMessage, ClientRequest, ElicitRequestParams, ElicitResult, ElicitationCapability,
    FormElicitationCapability, Implementation, InputRequest, JsonRpcMessage,
    ProgressNotificationParam, ProtocolVersion, RequestId, RequestMetaObject, ServerJsonRpcMessage,
    UrlElicitationCapability,
};
use rmcp::model::{ReadResourceRequestParams, ReadResourceResponse};
// Logging notifications are deprecated by the 2026-07-28 revision but still
// sent by servers on older ones; they are only logged here.
#[allow(deprecated)]
use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam};
// Sampling is deprecated by the 2026-07-28 revision (SEP-2577); servers on
// older revisions still ask for it.
#[allow(deprecated)]
use rmcp::model::{
    CreateMessageRequestParams, CreateMessageResult, Role, SamplingCapability, SamplingMessage,
    SamplingMessageContentBlock,
};
use rmcp::service::{
    ClientCacheConfig, ClientLifecycleMode, ClientServiceExt as _, InboundStreamOrigin,
    NotificationContext, RequestContext, RoleClient, RunningService,
};
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpError,
    StreamableHttpPostResponse, StreamableHttpResponseLimits,
};
use rmcp::transport::{StreamableHttpClientTransport, Transport};
use rmcp::{ClientHandler, ErrorData, ServiceError};
use serde_json::Value;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use super::config::{
    ResolvedOAuth, ResolvedServer, ResolvedTransport, check_header, resolve_call_header,
};
use super::schema::{self, CompiledTool, RawTool};
use super::{
    BoxFuture, CallOutcome, CallRefusal, CallRequest, Discovery, ElicitationAction,
    ElicitationAnswer, IDEMPOTENCY_META_KEY, InputNeeded, InputVia, McpClient, McpError, McpEvent,
    ReadRequest, RefusedTool, ResourceListing, ServerStatus, result,
};
use crate::oauth_discovery::{AuthorizationError, Challenge, Discovered};

/// `_meta` key of the call marker (stripped before sending).
const MARKER_KEY: &str = "io.belay/call-marker";
/// JSON-RPC error code of "URL elicitation required".
const URL_ELICITATION_REQUIRED: i32 = -32042;
/// The JSON-RPC error code of a `sampling/createMessage` Belay does not
/// give (no grant, grant used up, the asking call unknown): -1, the code of
/// MCP's own example of a rejected sampling request (specification,
/// "Sampling", error handling).
const SAMPLING_REFUSED: i32 = -1;
/// JSON-RPC "invalid params": a sampling request Belay cannot turn into a
/// model call (not text, tools, no messages, too large).
const SAMPLING_INVALID: i32 = -32602;
/// JSON-RPC "internal error": the model call of a granted request failed.
const SAMPLING_FAILED: i32 = -32603;
/// Why a request of a call without a grant is refused.
const SAMPLING_NO_GRANT: &str = "sampling/createMessage refused: this tool call has no sampling grant \
     (its tool declares no `sampling:`, it was not proposed by an agent, or the run's budget has no room left); \
     a completion goes only through the run's own model, budget and events";
/// Largest sampling request Belay sends to the model: the bytes of the
/// system prompt and every message's text.
const MAX_SAMPLING_PROMPT_BYTES: usize = 1024 * 1024;
/// Why a stdio call ended unsent when its request could not be written
/// whole in time.
const WEDGED: &str = "its request could not be written whole before the call ended (the server is not reading its stdin), \
     so it was not sent; the server is restarted";
/// Connect timeout of the HTTP backend, in ms.
const HTTP_CONNECT_TIMEOUT_MS: u64 = 10_000;
/// How often a broken SSE stream (a call's answer, or the server's own
/// stream) is resumed with `Last-Event-ID` before it counts as lost. rmcp's
/// default retries for ever, which would leave a call to a dead server
/// waiting for its whole timeout instead of being reported as lost after
/// sending.
const HTTP_SSE_RESUME_ATTEMPTS: usize = 3;
/// First delay between SSE resumption attempts, in ms (doubling).
const HTTP_SSE_RESUME_DELAY_MS: u64 = 200;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

// ---------------------------------------------------------------------------
// Per-call bookkeeping shared by the transport wrapper, the handler and the
// HTTP backend.

#[derive(Debug, Clone, PartialEq, Eq)]
enum SendState {
    /// Given to rmcp, not yet to the transport.
    Queued,
    /// The transport has it: stdio, being written (not whole yet); HTTP,
    /// being POSTed (the server may be handling it).
    Handed,
    /// The transport finished sending it (stdio: the pipe took its last
    /// byte).
    Written,
    /// The transport failed to send it; `not_sent` when provably nothing
    /// reached the server.
    WriteFailed { not_sent: bool },
    /// The call ended (its timeout, a cancellation, a lost connection)
    /// before the request was sent (stdio: written whole), and it never
    /// will be: provably not sent. See [`Calls::settle`].
    Abandoned,
}

/// What [`Calls::settle`] found.
struct Settled {
    /// Whether the request may have reached the server.
    sent: bool,
    /// Stdio: the connection on which the request was left unwritten (a
    /// write stuck on a full pipe: the server is not reading its stdin),
    /// which must be torn down before anything else is sent on it.
    wedged: Option<u64>,
}

struct CallSlot {
    label: String,
    generation: u64,
    state: SendState,
    request_id: Option<RequestId>,
    progress_token: Option<Value>,
    headers: Vec<(reqwest::header::HeaderName, reqwest::header::HeaderValue)>,
    answers: VecDeque<ElicitationAnswer>,
    needs_input: Option<InputNeeded>,
    /// An `elicitation/create` came while this and other calls were in
    /// flight on the connection (stdio cannot say which call asked); it was
    /// answered `cancel`, so this call's answer may reflect that.
    unattributed_elicitation: bool,
    /// The answer was longer than [`MAX_STDIO_MESSAGE_BYTES`] and discarded.
    too_large: bool,
    /// The answer arrived but cannot be decoded (stdio): why.
    undecodable: Option<String>,
    /// The server sent `sampling/createMessage` during this call and was
    /// refused (no grant, grant used up, invalid request); a model that
    /// failed a granted completion does not count: the tool's own outcome
    /// stands then.
    sampling_refused: bool,
    /// The run's model failed a completion this call's server asked for
    /// (a provider error or timeout): the message, so that a tool error
    /// that follows is a failure that may be retried, not a definite one.
    sampling_model_failed: Option<String>,
    /// `sampling/createMessage` requests of this call answered with an
    /// error (for the log: the first at warn, the rest at debug, their
    /// number when the call ends).
    sampling_errors: u32,
    /// Another call was in flight on this client when this one started, or
    /// started before it ended: a server request whose origin is not known
    /// (stdio) cannot be this call's for sure even when it is the only
    /// call left in flight.
    shared: bool,
    /// The call's sampling grant and usage ([`CallRequest::sampling`]).
    sampling: Option<Arc<super::SamplingSession>>,
}

#[derive(Default)]
struct Calls {
    slots: Mutex<HashMap<u64, CallSlot>>,
    /// `sampling/createMessage` requests refused because no call could be
    /// told for sure to have asked (the first is logged at warn, the rest
    /// at debug).
    unattributed_sampling: AtomicU64,
}

impl Calls {
    fn state(&self, marker: u64) -> SendState {
        lock(&self.slots)
            .get(&marker)
            .map_or(SendState::Queued, |s| s.state.clone())
    }

    /// Marks the call of `marker` as handed to the transport of
    /// `generation`; `false` (hand nothing over) once it is abandoned.
    fn handed(&self, marker: u64, generation: u64, id: RequestId, progress: Option<Value>) -> bool {
        let mut slots = lock(&self.slots);
        let Some(slot) = slots.get_mut(&marker) else {
            return true;
        };
        if slot.state == SendState::Abandoned {
            return false;
        }
        slot.state = SendState::Handed;
        slot.generation = generation;
        slot.request_id = Some(id);
        slot.progress_token = progress;
        true
    }

    /// Records how the transport of `generation` ended sending the call of
    /// `marker` (unless the call has moved on: abandoned, or handed to
    /// another connection). Returns its label when it was written.
    fn sent(&self, marker: u64, generation: u64, outcome: SendState) -> Option<String> {
        let mut slots = lock(&self.slots);
        let slot = slots.get_mut(&marker)?;
        let current = slot.generation == generation
            && matches!(slot.state, SendState::Handed | SendState::Written);
        if !current {
            return None;
        }
        slot.state = outcome;
        (slot.state == SendState::Written).then(|| slot.label.clone())
    }

    /// Decides, once and for all, whether the call of `marker` was sent,
    /// for an outcome that ends it without an answer (timeout,
    /// cancellation, a lost connection). A request not yet handed over, or
    /// (stdio) not yet written whole, is marked abandoned under the slot
    /// lock the stdio writer takes for every write, so it is never sent
    /// afterwards: not sent, exactly. Over HTTP a request being POSTed may
    /// be handled by the server: sent.
    fn settle(&self, marker: u64, stdio: bool) -> Settled {
        let mut slots = lock(&self.slots);
        let Some(slot) = slots.get_mut(&marker) else {
            return Settled {
                sent: false,
                wedged: None,
            };
        };
        let (sent, wedged) = match slot.state {
            SendState::Written => (true, None),
            SendState::WriteFailed { not_sent } => (!not_sent, None),
            SendState::Abandoned => (false, None),
            SendState::Queued => {
                slot.state = SendState::Abandoned;
                (false, None)
            }
            SendState::Handed if stdio => {
                slot.state = SendState::Abandoned;
                (false, Some(slot.generation))
            }
            SendState::Handed => (true, None),
        };
        Settled { sent, wedged }
    }

    /// A call that was provably not sent goes out again on the next
    /// connection: its slot is queued again.
    fn requeue(&self, marker: u64) {
        if let Some(slot) = lock(&self.slots).get_mut(&marker) {
            slot.state = SendState::Queued;
            slot.request_id = None;
        }
    }

    fn by_request_id(&self, generation: u64, id: &RequestId) -> Option<u64> {
        lock(&self.slots)
            .iter()
            .find(|(_, s)| s.generation == generation && s.request_id.as_ref() == Some(id))
            .map(|(m, _)| *m)
    }

    fn label_by_progress(&self, token: &Value) -> Option<String> {
        lock(&self.slots)
            .values()
            .find(|s| s.progress_token.as_ref() == Some(token))
            .map(|s| s.label.clone())
    }

    /// Starts tracking a call: it and every call in flight now are marked
    /// [`CallSlot::shared`] when they overlap.
    fn start(&self, marker: u64, mut slot: CallSlot) {
        let mut slots = lock(&self.slots);
        if !slots.is_empty() {
            slot.shared = true;
            for other in slots.values_mut() {
                other.shared = true;
            }
        }
        slots.insert(marker, slot);
    }

    /// The only call in flight on `generation`, if exactly one is and it
    /// has been the only call on this client since it started (see
    /// [`CallSlot::shared`]): the one call a server request of unknown
    /// origin can be tied to for sure.
    fn sole_in_flight(&self, generation: u64) -> Option<u64> {
        let marker = self.single_in_flight(generation)?;
        lock(&self.slots)
            .get(&marker)
            .is_some_and(|s| !s.shared)
            .then_some(marker)
    }

    /// The only call in flight on `generation`, if exactly one is.
    fn single_in_flight(&self, generation: u64) -> Option<u64> {
        let slots = lock(&self.slots);
        let mut in_flight = slots.iter().filter(|(_, s)| {
            s.generation == generation && matches!(s.state, SendState::Handed | SendState::Written)
        });
        match (in_flight.next(), in_flight.next()) {
            (Some((m, _)), None) => Some(*m),
            _ => None,
        }
    }
}

/// Drops a call's slot when the call ends.
struct SlotGuard<'a> {
    calls: &'a Calls,
    marker: u64,
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        let slot = lock(&self.calls.slots).remove(&self.marker);
        if let Some(slot) = slot
            && slot.sampling_errors > 1
        {
            tracing::warn!(
                call = slot.label,
                errors = slot.sampling_errors,
                "sampling/createMessage requests answered with an error during the call"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Transport wrapper.

/// Whether a transport's send error proves that nothing reached the server.
type NotSentFn<E> = fn(&E) -> bool;

/// A transport that takes the marker of the `tools/call` it sends, so that
/// it can record itself when the request was sent whole (stdio: under the
/// slot lock, see `stdio.rs`).
trait MarkedTransport: Transport<RoleClient> {
    /// Sends `item`; `marker`: the call it carries, if it is one.
    fn send_marked(
        &mut self,
        item: ClientJsonRpcMessage,
        marker: Option<u64>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static;
}

impl MarkedTransport for StreamableHttpClientTransport<HeaderClient> {
    fn send_marked(
        &mut self,
        item: ClientJsonRpcMessage,
        _marker: Option<u64>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.send(item)
    }
}

struct Tracked<T: MarkedTransport> {
    inner: T,
    calls: Arc<Calls>,
    events: broadcast::Sender<McpEvent>,
    generation: u64,
    not_sent: NotSentFn<T::Error>,
}

/// What [`Tracked::take_marker`] found in a message.
enum Marked {
    /// Not a call.
    No,
    /// The call of this marker, handed over now.
    Call(u64),
    /// A call that has ended unsent: it must not be sent.
    Abandoned(u64),
}

impl<T: MarkedTransport> Tracked<T> {
    /// Strips the marker of a `tools/call` request and records it as handed.
    fn take_marker(&self, item: &mut ClientJsonRpcMessage) -> Marked {
        let JsonRpcMessage::Request(request) = item else {
            return Marked::No;
        };
        // rmcp keeps the progress token in the request's extensions and
        // merges it into `_meta` when it serializes.
        let progress = request
            .request
            .get_meta()
            .get_progress_token()
            .and_then(|token| serde_json::to_value(token).ok());
        let ClientRequest::CallToolRequest(call) = &mut request.request else {
            return Marked::No;
        };
        let Some(meta) = call.params.meta.as_mut() else {
            return Marked::No;
        };
        let Some(marker) = meta.0.0.remove(MARKER_KEY).and_then(|m| m.as_u64()) else {
            return Marked::No;
        };
        if self
            .calls
            .handed(marker, self.generation, request.id.clone(), progress)
        {
            Marked::Call(marker)
        } else {
            Marked::Abandoned(marker)
        }
    }
}

impl<T: MarkedTransport> Transport<RoleClient> for Tracked<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        mut item: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let (marker, sending) = match self.take_marker(&mut item) {
            Marked::No => (None, Some(self.inner.send_marked(item, None))),
            Marked::Call(marker) => (
                Some(marker),
                Some(self.inner.send_marked(item, Some(marker))),
            ),
            Marked::Abandoned(marker) => {
                // Its call has ended as not sent; nobody waits for it.
                tracing::debug!(marker, "request of an abandoned call not sent");
                (None, None)
            }
        };
        let calls = self.calls.clone();
        let events = self.events.clone();
        let not_sent = self.not_sent;
        let generation = self.generation;
        async move {
            let Some(sending) = sending else {
                return Ok(());
            };
            let result = sending.await;
            if let Some(marker) = marker {
                let state = match &result {
                    Ok(()) => SendState::Written,
                    Err(e) => SendState::WriteFailed {
                        not_sent: not_sent(e),
                    },
                };
                if let Some(label) = calls.sent(marker, generation, state) {
                    let _ = events.send(McpEvent::RequestWritten { call: label });
                }
            }
            result
        }
    }

    fn receive(&mut self) -> impl Future<Output = Option<ServerJsonRpcMessage>> + Send {
        self.inner.receive()
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

// ---------------------------------------------------------------------------
// Connection state and supervision.

struct Live {
    peer: rmcp::Peer<RoleClient>,
    generation: u64,
    pid: Option<u32>,
    protocol_version: String,
    /// Cancelled when the connection is known to be lost before rmcp noticed
    /// (HTTP: the server forgot the session; stdio: a request could not be
    /// written whole within its call's timeout).
    lost: CancellationToken,
    /// Stdio: how the process ended, once it has.
    exit: Option<Arc<stdio::Exit>>,
}

#[derive(Clone)]
enum ConnState {
    Connecting,
    Up(Arc<Live>),
    Down(String),
    Closed,
}

struct Catalog {
    change_seq: u64,
    tools: HashMap<String, Arc<CompiledTool>>,
    refused: HashMap<String, RefusedTool>,
}

struct Shared {
    server: ResolvedServer,
    state: watch::Sender<ConnState>,
    changes: watch::Sender<u64>,
    events: broadcast::Sender<McpEvent>,
    calls: Arc<Calls>,
    catalog: tokio::sync::Mutex<Option<Catalog>>,
    shutdown: CancellationToken,
    next_marker: AtomicU64,
    last_error: Mutex<Option<String>>,
    /// Number of the latest connection that came up.
    generation: AtomicU64,
    /// OAuth access tokens (servers with `oauth`), kept across reconnections.
    tokens: Arc<crate::oauth2::TokenCache>,
    /// The discovered OAuth token endpoint (servers with `oauth` and no
    /// `token_url`), kept for the client's life.
    oauth: Arc<OAuthState>,
}

/// The rmcp-backed [`McpClient`].
pub(crate) struct RmcpClient {
    shared: Arc<Shared>,
    supervisor: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for RmcpClient {
    fn drop(&mut self) {
        // The supervisor owns the connection; without this it would keep the
        // server process alive after the last handle is gone.
        self.shared.shutdown.cancel();
    }
}

type Running = RunningService<RoleClient, Handler>;

impl RmcpClient {
    /// Connects once (see [`super::connect`]) and starts the supervisor.
    pub(crate) async fn connect(server: ResolvedServer) -> Result<Self, McpError> {
        let (state, _) = watch::channel(ConnState::Connecting);
        let (changes, _) = watch::channel(0u64);
        let (events, _) = broadcast::channel(256);
        let shared = Arc::new(Shared {
            server,
            state,
            changes,
            events,
            calls: Arc::new(Calls::default()),
            catalog: tokio::sync::Mutex::new(None),
            shutdown: CancellationToken::new(),
            next_marker: AtomicU64::new(1),
            last_error: Mutex::new(None),
            generation: AtomicU64::new(0),
            tokens: Arc::default(),
            oauth: Arc::default(),
        });
        let (live, running) = connect_once(&shared, 1).await?;
        publish_up(&shared, &live);
        let supervisor = tokio::spawn(supervise(shared.clone(), live, running));
        Ok(Self {
            shared,
            supervisor: Mutex::new(Some(supervisor)),
        })
    }
}

fn publish_up(shared: &Shared, live: &Arc<Live>) {
    shared.generation.store(live.generation, Ordering::Relaxed);
    shared.state.send_replace(ConnState::Up(live.clone()));
    let _ = shared.events.send(McpEvent::Connected {
        generation: live.generation,
        pid: live.pid,
        protocol_version: live.protocol_version.clone(),
    });
    tracing::info!(
        server = shared.server.name,
        generation = live.generation,
        pid = live.pid,
        protocol = live.protocol_version,
        "MCP server connected"
    );
}

fn lifecycle() -> ClientLifecycleMode {
    ClientLifecycleMode::Auto {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        legacy_version: Some(ProtocolVersion::V_2025_11_25),
    }
}

/// Starts the process (stdio) or session (HTTP) and performs the handshake.
async fn connect_once(
    shared: &Arc<Shared>,
    generation: u64,
) -> Result<(Arc<Live>, Running), McpError> {
    let name = shared.server.name.clone();
    let connect_failed = |message: String| McpError::Connect {
        server: name.clone(),
        message,
    };
    let handler = Handler {
        shared: shared.clone(),
        generation,
    };
    let timeout = Duration::from_millis(shared.server.common.connect_timeout_ms);
    // Cancelled when the connection is known to be lost before rmcp
    // notices (HTTP: the server forgot the session; stdio: a request could
    // not be written whole): ends the connection.
    let lost = CancellationToken::new();
    let mut exit = None;
    let (running, pid) = match &shared.server.transport {
        ResolvedTransport::Stdio { .. } => {
            let (running, pid, ended) = connect_stdio(shared, generation, handler, timeout).await?;
            exit = Some(ended);
            (running, pid)
        }
        ResolvedTransport::Http {
            url,
            headers,
            oauth,
        } => {
            let mut fixed = HeaderMap::new();
            for (key, value) in headers {
                let key = reqwest::header::HeaderName::from_bytes(key.as_bytes())
                    .map_err(|e| connect_failed(format!("header `{key}`: {e}")))?;
                let value = reqwest::header::HeaderValue::from_str(value)
                    .map_err(|e| connect_failed(format!("header `{key}`: {e}")))?;
                fixed.insert(key, value);
            }
            // No idle keep-alive connections: every POST opens its own, so a
            // connection that cannot be made proves the request was not sent.
            // A reused connection that the server had closed would leave that
            // ambiguous (and a `never` tool's call uncertain).
            let http = reqwest::Client::builder()
                .connect_timeout(Duration::from_millis(HTTP_CONNECT_TIMEOUT_MS))
                .pool_max_idle_per_host(0)
                .build()
                .map_err(|e| connect_failed(error_chain(&e)))?;
            let oauth = match oauth {
                None => None,
                Some(config) => Some(Arc::new(OAuth {
                    config: config.clone(),
                    resource: reqwest::Url::parse(url)
                        .map_err(|e| connect_failed(format!("URL `{url}`: {e}")))?,
                    tokens: shared.tokens.clone(),
                    http: reqwest::Client::builder()
                        .connect_timeout(Duration::from_millis(HTTP_CONNECT_TIMEOUT_MS))
                        .build()
                        .map_err(|e| connect_failed(error_chain(&e)))?,
                    discovery: crate::oauth_discovery::Discovery::new(Arc::new(
                        shared.server.network_policy.clone(),
                    ))
                    .map_err(|e| connect_failed(error_chain(&e)))?,
                    state: shared.oauth.clone(),
                })),
            };
            // With a known token endpoint the first token is fetched here,
            // so that an endpoint that refuses the client is reported as
            // what it is (rmcp reports a failed send without its cause).
            // An unknown one is discovered from the server's first 401.
            if let Some(oauth) = &oauth {
                *lock(&oauth.state.failure) = None;
                if let Some(mut grant) = oauth.known().await {
                    oauth
                        .token_or_rediscover(&mut grant, None, &mut false)
                        .await
                        .map_err(|error| McpError::Authorization {
                            server: name.clone(),
                            error: Box::new(error),
                        })?;
                }
            }
            let oauth_state = oauth.as_ref().map(|o| o.state.clone());
            let client = HeaderClient {
                inner: http,
                calls: shared.calls.clone(),
                generation,
                lost: lost.clone(),
                oauth,
            };
            let mut config =
                StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(fixed);
            let mut resume =
                rmcp::transport::common::client_side_sse::ExponentialBackoff::default();
            resume.max_times = Some(HTTP_SSE_RESUME_ATTEMPTS);
            resume.base_duration = Duration::from_millis(HTTP_SSE_RESUME_DELAY_MS);
            resume.max_delay = Some(Duration::from_secs(2));
            config.retry_config = Arc::new(resume);
            // A session the server forgot is a lost connection (see
            // `HeaderClient::answered`), never silently re-made by rmcp.
            config.reinit_on_expired_session = false;
            let transport = Tracked {
                inner: StreamableHttpClientTransport::with_client(client, config),
                calls: shared.calls.clone(),
                events: shared.events.clone(),
                generation,
                not_sent: http_not_sent,
            };
            let running = tokio::time::timeout(
                timeout,
                handler.serve_with_lifecycle(transport, lifecycle()),
            )
            .await
            .map_err(|_| connect_failed(format!("no handshake within {} ms", timeout.as_millis())))?
            .map_err(|e| {
                // Authorization failed before the server handled anything:
                // say why, not rmcp's bare "auth required".
                match oauth_state.as_ref().and_then(|o| lock(&o.failure).take()) {
                    Some(error) => McpError::Authorization {
                        server: name.clone(),
                        error: Box::new(error),
                    },
                    None => connect_failed(error_chain(&e)),
                }
            })?;
            (running, None)
        }
    };
    let peer = running.peer().clone();
    // Discovery must see what the server lists now, not a cached page.
    peer.set_response_cache_config(ClientCacheConfig::disabled())
        .await;
    let protocol_version = peer
        .peer_info()
        .map(|info| info.protocol_version.as_str().to_owned())
        .unwrap_or_default();
    let live = Arc::new(Live {
        peer,
        generation,
        pid,
        protocol_version,
        lost,
        exit,
    });
    Ok((live, running))
}

/// A failed write to a server's stdin left at most part of a line: no
/// request.
fn stdio_not_sent(_: &std::io::Error) -> bool {
    true
}

/// Starts a stdio server and performs the handshake. A server that exits
/// before completing it is [`McpError::Exited`], with its exit status and
/// last stderr lines.
async fn connect_stdio(
    shared: &Arc<Shared>,
    generation: u64,
    handler: Handler,
    timeout: Duration,
) -> Result<(Running, Option<u32>, Arc<stdio::Exit>), McpError> {
    let name = shared.server.name.clone();
    let ResolvedTransport::Stdio {
        command,
        args,
        env,
        inherit_env,
        cwd,
    } = &shared.server.transport
    else {
        return Err(McpError::Connect {
            server: name,
            message: "not a stdio server".into(),
        });
    };
    let mut cmd = tokio::process::Command::new(command);
    cmd.args(args).env_clear().kill_on_drop(true);
    for key in super::config::INHERITED_ENV
        .iter()
        .copied()
        .chain(inherit_env.iter().map(String::as_str))
    {
        if let Some(value) = std::env::var_os(key) {
            cmd.env(key, value);
        }
    }
    cmd.envs(env);
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    let spawned =
        StdioProcess::spawn(cmd, &name, shared.calls.clone(), generation).map_err(|e| {
            McpError::Spawn {
                server: name.clone(),
                command: command.clone(),
                message: e.to_string(),
            }
        })?;
    let transport = Tracked {
        inner: spawned.process,
        calls: shared.calls.clone(),
        events: shared.events.clone(),
        generation,
        not_sent: stdio_not_sent,
    };
    let connect_failed = |message: String| McpError::Connect {
        server: name.clone(),
        message,
    };
    let handshake = tokio::time::timeout(
        timeout,
        handler.serve_with_lifecycle(transport, lifecycle()),
    )
    .await
    .map_err(|_| connect_failed(format!("no handshake within {} ms", timeout.as_millis())))?;
    match handshake {
        Ok(running) => Ok((running, spawned.pid, spawned.exit)),
        Err(e) => {
            let Some(status) = spawned.exit.wait(Duration::from_secs(1)).await else {
                return Err(connect_failed(error_chain(&e)));
            };
            // Its stderr ends with it: read to the end before telling.
            let _ = tokio::time::timeout(Duration::from_secs(1), spawned.stderr).await;
            Err(McpError::Exited {
                server: name.clone(),
                status,
                stderr: spawned.exit.stderr(),
            })
        }
    }
}

/// A server's last stderr lines for a message: quoted, joined by ` | `.
fn stderr_lines(lines: &[String]) -> String {
    if lines.is_empty() {
        return "(none)".to_owned();
    }
    lines
        .iter()
        .map(|l| format!("{l:?}"))
        .collect::<Vec<_>>()
        .join(" | ")
}

/// Waits for the connection to end, then re-makes it, until shutdown.
async fn supervise(shared: Arc<Shared>, mut live: Arc<Live>, mut running: Running) {
    let server = shared.server.name.clone();
    let common = &shared.server.common;
    let min = Duration::from_millis(common.restart_min_delay_ms);
    let max = Duration::from_millis(common.restart_max_delay_ms);
    let new_backoff = || {
        ExponentialBuilder::default()
            .with_min_delay(min)
            .with_max_delay(max)
            .with_jitter()
            .without_max_times()
            .build()
    };
    let mut backoff = new_backoff();
    loop {
        let connected_at = Instant::now();
        let cancel = running.cancellation_token();
        let waiting = running.waiting();
        tokio::pin!(waiting);
        let quit = tokio::select! {
            quit = &mut waiting => quit,
            // The server forgot the session: end this connection, make another.
            () = live.lost.cancelled() => {
                cancel.cancel();
                (&mut waiting).await
            }
            () = shared.shutdown.cancelled() => {
                cancel.cancel();
                let _ = waiting.await;
                shared.state.send_replace(ConnState::Closed);
                return;
            }
        };
        let mut reason = match quit {
            Ok(reason) => format!("connection ended ({reason:?})"),
            Err(e) => format!("connection task failed: {e}"),
        };
        if let Some(exit) = &live.exit
            && let Some(status) = exit.status()
        {
            reason = format!(
                "{reason}: the server exited ({status}); its last stderr lines: {}",
                stderr_lines(&exit.stderr())
            );
        }
        tracing::warn!(
            server,
            generation = live.generation,
            reason,
            "MCP server connection lost"
        );
        *lock(&shared.last_error) = Some(reason.clone());
        shared.state.send_replace(ConnState::Down(reason.clone()));
        let _ = shared.events.send(McpEvent::ConnectionLost {
            generation: live.generation,
            reason,
        });
        if connected_at.elapsed() >= max {
            backoff = new_backoff();
        }
        let mut generation = live.generation;
        loop {
            let delay = backoff.next().unwrap_or(max);
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = shared.shutdown.cancelled() => {
                    shared.state.send_replace(ConnState::Closed);
                    return;
                }
            }
            generation += 1;
            shared.state.send_replace(ConnState::Connecting);
            match connect_once(&shared, generation).await {
                Ok((l, r)) => {
                    live = l;
                    running = r;
                    // A restarted server may list other tools.
                    shared.changes.send_modify(|seq| *seq += 1);
                    publish_up(&shared, &live);
                    break;
                }
                Err(e) => {
                    let reason = e.to_string();
                    tracing::warn!(server, reason, "MCP server reconnect failed");
                    *lock(&shared.last_error) = Some(reason.clone());
                    shared.state.send_replace(ConnState::Down(reason.clone()));
                    let _ = shared.events.send(McpEvent::ConnectFailed { reason });
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The client.

impl Shared {
    /// A live connection, waiting until `deadline` for one.
    async fn live(&self, deadline: tokio::time::Instant) -> Result<Arc<Live>, McpError> {
        let mut rx = self.state.subscribe();
        loop {
            let reason = match &*rx.borrow_and_update() {
                ConnState::Up(live)
                    if !live.peer.is_transport_closed() && !live.lost.is_cancelled() =>
                {
                    return Ok(live.clone());
                }
                ConnState::Closed => {
                    return Err(McpError::Closed {
                        server: self.server.name.clone(),
                    });
                }
                ConnState::Up(_) => "connection closed".to_owned(),
                ConnState::Connecting => "connecting".to_owned(),
                ConnState::Down(reason) => reason.clone(),
            };
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => {
                    return Err(McpError::Closed {
                        server: self.server.name.clone(),
                    });
                }
                Err(_) => {
                    return Err(McpError::Disconnected {
                        server: self.server.name.clone(),
                        reason,
                    });
                }
            }
        }
    }

    fn is_stdio(&self) -> bool {
        matches!(self.server.transport, ResolvedTransport::Stdio { .. })
    }

    fn connect_deadline(&self) -> tokio::time::Instant {
        tokio::time::Instant::now() + Duration::from_millis(self.server.common.connect_timeout_ms)
    }

    /// Lists all tools on a live connection and replaces the catalog.
    async fn discover(&self) -> Result<(Discovery, Catalog), McpError> {
        let deadline = self.connect_deadline();
        loop {
            let live = self.live(deadline).await?;
            let change_seq = *self.changes.borrow();
            let tools = match live.peer.list_all_tools().await {
                Ok(tools) => tools,
                // Listing has no effect: when the connection died under us
                // (a stdio server's pipe broke), wait for the next one.
                Err(e @ (ServiceError::TransportClosed | ServiceError::TransportSend(_))) => {
                    let reconnects = matches!(e, ServiceError::TransportClosed) || self.is_stdio();
                    if reconnects && tokio::time::Instant::now() < deadline {
                        self.wait_past(&live, deadline).await;
                        continue;
                    }
                    return Err(McpError::Disconnected {
                        server: self.server.name.clone(),
                        reason: error_chain(&e),
                    });
                }
                Err(e) => {
                    return Err(McpError::Protocol {
                        server: self.server.name.clone(),
                        message: error_chain(&e),
                    });
                }
            };
            let mut discovery = Discovery {
                server: self.server.name.clone(),
                protocol_version: live.protocol_version.clone(),
                change_seq,
                tools: Vec::new(),
                refused: Vec::new(),
            };
            let mut catalog = Catalog {
                change_seq,
                tools: HashMap::new(),
                refused: HashMap::new(),
            };
            for tool in tools {
                let raw = RawTool {
                    name: tool.name.to_string(),
                    title: tool.title.clone(),
                    description: tool.description.as_ref().map(ToString::to_string),
                    input_schema: Value::Object((*tool.input_schema).clone()),
                    output_schema: tool
                        .output_schema
                        .as_ref()
                        .map(|s| Value::Object((**s).clone())),
                    annotations: tool
                        .annotations
                        .as_ref()
                        .and_then(|a| serde_json::to_value(a).ok()),
                };
                match schema::map_tool(&raw) {
                    Ok(compiled) => {
                        discovery.tools.push(compiled.definition.clone());
                        catalog.tools.insert(raw.name, Arc::new(compiled));
                    }
                    Err((definition_hash, reason)) => {
                        tracing::warn!(
                            server = self.server.name,
                            tool = raw.name,
                            %reason,
                            "MCP tool refused"
                        );
                        let refused = RefusedTool {
                            name: raw.name.clone(),
                            definition_hash,
                            reason,
                        };
                        discovery.refused.push(refused.clone());
                        catalog.refused.insert(raw.name, refused);
                    }
                }
            }
            return Ok((discovery, catalog));
        }
    }

    /// Waits until the state moves past `live` (or `deadline`).
    async fn wait_past(&self, live: &Arc<Live>, deadline: tokio::time::Instant) {
        let mut rx = self.state.subscribe();
        loop {
            let moved = match &*rx.borrow_and_update() {
                ConnState::Up(l) => l.generation != live.generation,
                ConnState::Closed => true,
                ConnState::Connecting | ConnState::Down(_) => true,
            };
            if moved {
                return;
            }
            if !matches!(
                tokio::time::timeout_at(deadline, rx.changed()).await,
                Ok(Ok(()))
            ) {
                return;
            }
        }
    }

    async fn call(&self, request: CallRequest) -> CallOutcome {
        let server = self.server.name.clone();
        // 1. Headers.
        let mut headers = Vec::new();
        if !request.headers.is_empty() {
            if matches!(self.server.transport, ResolvedTransport::Stdio { .. }) {
                return CallOutcome::Refused(CallRefusal::HeadersNotSupported { server });
            }
            for (name, value) in &request.headers {
                let invalid = |reason: String| {
                    CallOutcome::Refused(CallRefusal::InvalidHeader {
                        name: name.clone(),
                        reason,
                    })
                };
                let value = match resolve_call_header(
                    &server,
                    value,
                    &self.server.config_values,
                    &request.secrets,
                ) {
                    Ok(v) => v,
                    Err(e @ crate::mcp::config::ConfigError::MissingConfigValue { .. }) => {
                        return CallOutcome::Refused(CallRefusal::MissingConfigValue {
                            name: name.clone(),
                            reason: e.to_string(),
                        });
                    }
                    Err(e) => return invalid(e.to_string()),
                };
                if let Err(e) = check_header(&server, name, &value) {
                    return invalid(e.to_string());
                }
                match (
                    reqwest::header::HeaderName::from_bytes(name.as_bytes()),
                    reqwest::header::HeaderValue::from_str(&value),
                ) {
                    (Ok(n), Ok(v)) => headers.push((n, v)),
                    _ => return invalid("not valid HTTP".into()),
                }
            }
        }

        let timeout = Duration::from_millis(request.timeout_ms);
        let cancel = request.cancel.clone().unwrap_or_default();
        let marker = self.next_marker.fetch_add(1, Ordering::Relaxed);
        let label = request
            .idempotency_key
            .clone()
            .unwrap_or_else(|| format!("call-{marker}"));
        self.calls.start(
            marker,
            CallSlot {
                label,
                generation: 0,
                state: SendState::Queued,
                request_id: None,
                progress_token: None,
                headers,
                answers: request
                    .input
                    .as_ref()
                    .map(|i| i.elicitations.iter().cloned().collect())
                    .unwrap_or_default(),
                needs_input: None,
                unattributed_elicitation: false,
                too_large: false,
                undecodable: None,
                sampling_refused: false,
                sampling_model_failed: None,
                sampling_errors: 0,
                shared: false,
                sampling: request.sampling.clone(),
            },
        );
        // Removes the slot however this future ends (a caller may drop it).
        let _slot = SlotGuard {
            calls: &self.calls,
            marker,
        };
        tokio::select! {
            outcome = self.checked_call(&request, marker) => outcome,
            () = tokio::time::sleep(timeout) => {
                let settled = self.settle(marker);
                CallOutcome::Timeout {
                    timeout_ms: request.timeout_ms,
                    sent: settled.sent,
                    detail: settled.wedged.map(|_| WEDGED.to_owned()),
                }
            }
            () = cancel.cancelled() => {
                let settled = self.settle(marker);
                CallOutcome::Cancelled {
                    sent: settled.sent,
                    reason: Some(match settled.wedged {
                        Some(_) => format!("cancelled by the caller; {WEDGED}"),
                        None => "cancelled by the caller".into(),
                    }),
                }
            }
        }
    }

    /// [`Calls::settle`] for this client's transport; a stdio connection
    /// on which the request was left unwritten is torn down (the server is
    /// not reading its stdin: every later request would wait behind this
    /// one), and the supervisor starts the server again.
    fn settle(&self, marker: u64) -> Settled {
        let settled = self.calls.settle(marker, self.is_stdio());
        if let Some(generation) = settled.wedged
            && let ConnState::Up(live) = &*self.state.borrow()
            && live.generation == generation
            && !live.lost.is_cancelled()
        {
            tracing::warn!(
                server = self.server.name,
                generation,
                "an MCP server is not reading its stdin: a request could not be written whole before its call ended; restarting the server"
            );
            live.lost.cancel();
        }
        settled
    }

    /// Checks against the catalog, then sends (see [`McpClient::call_tool`]).
    async fn checked_call(&self, request: &CallRequest, marker: u64) -> CallOutcome {
        let deadline = self.connect_deadline();
        loop {
            let live = match self.live(deadline).await {
                Ok(live) => live,
                Err(e) => {
                    return CallOutcome::Disconnected {
                        reason: e.to_string(),
                    };
                }
            };
            // Checked against the catalog of the connection the call goes
            // out on: the change counter moves before a re-made connection
            // is published, so a server restarted since the last listing
            // (which may list other definitions) is listed again first.
            let tool = match self.catalog_tool(request).await {
                Ok(tool) => tool,
                Err(outcome) => return outcome,
            };
            let arguments = Value::Object(request.arguments.clone());
            if let Err(errors) = schema::validate(&tool.input, &arguments) {
                return CallOutcome::Refused(CallRefusal::InvalidArguments {
                    tool: request.tool.clone(),
                    errors,
                });
            }
            let outcome = self.send_call(&live, request, marker, &tool).await;
            // Nothing was sent and the connection is gone: the request can
            // go to the next connection, which the supervisor is making.
            // (HTTP: only once the connection is known to be lost, so the
            // next one is a new session, checked against its own listing.)
            let retry = match self.calls.state(marker) {
                SendState::Queued | SendState::Abandoned => true,
                SendState::WriteFailed { not_sent: true } => {
                    self.is_stdio() || live.lost.is_cancelled()
                }
                _ => false,
            };
            if let CallOutcome::Disconnected { .. } = &outcome
                && retry
                && tokio::time::Instant::now() < deadline
            {
                self.wait_past(&live, deadline).await;
                self.calls.requeue(marker);
                continue;
            }
            return outcome;
        }
    }

    /// The catalog entry of the requested tool, re-listing a stale catalog.
    async fn catalog_tool(&self, request: &CallRequest) -> Result<Arc<CompiledTool>, CallOutcome> {
        let mut catalog = self.catalog.lock().await;
        let current = *self.changes.borrow();
        if catalog.as_ref().is_none_or(|c| c.change_seq < current) {
            match self.discover().await {
                Ok((_, fresh)) => *catalog = Some(fresh),
                Err(McpError::Protocol { message, .. }) => {
                    return Err(CallOutcome::Malformed {
                        reason: format!("tools/list failed: {message}"),
                    });
                }
                Err(e) => {
                    return Err(CallOutcome::Disconnected {
                        reason: e.to_string(),
                    });
                }
            }
        }
        let Some(catalog) = catalog.as_ref() else {
            return Err(CallOutcome::Disconnected {
                reason: "no tool list".into(),
            });
        };
        let name = &request.tool;
        let listed_hash = catalog
            .tools
            .get(name)
            .map(|t| t.definition.definition_hash.clone())
            .or_else(|| catalog.refused.get(name).map(|r| r.definition_hash.clone()));
        if let Some(expected) = &request.expected_hash
            && listed_hash.as_ref() != Some(expected)
        {
            return Err(CallOutcome::Refused(CallRefusal::DefinitionChanged {
                tool: name.clone(),
                expected: expected.clone(),
                actual: listed_hash,
            }));
        }
        if let Some(refused) = catalog.refused.get(name) {
            return Err(CallOutcome::Refused(CallRefusal::SchemaRefused {
                tool: name.clone(),
                reason: refused.reason.clone(),
            }));
        }
        catalog
            .tools
            .get(name)
            .cloned()
            .ok_or_else(|| CallOutcome::Refused(CallRefusal::UnknownTool { tool: name.clone() }))
    }

    async fn send_call(
        &self,
        live: &Live,
        request: &CallRequest,
        marker: u64,
        tool: &CompiledTool,
    ) -> CallOutcome {
        let mut meta = RequestMetaObject::default();
        meta.0.0.insert(MARKER_KEY.into(), Value::from(marker));
        if let Some(key) = &request.idempotency_key {
            meta.0
                .0
                .insert(IDEMPOTENCY_META_KEY.into(), Value::String(key.clone()));
        }
        for (key, value) in request.trace_meta() {
            meta.0.0.insert(key.into(), Value::String(value));
        }
        let mut params = CallToolRequestParams::new(request.tool.clone())
            .with_arguments(request.arguments.clone());
        params.meta = Some(meta);
        if let Some(input) = &request.input {
            if !input.responses.is_empty() {
                params.input_responses = Some(
                    input
                        .responses
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect::<BTreeMap<_, _>>(),
                );
            }
            params.request_state = input.request_state.clone();
        }
        let response = live.peer.call_tool_once(params).await;
        let (needs_input, too_large, undecodable, unattributed, sampling_refused, model_failed) =
            lock(&self.calls.slots)
                .get_mut(&marker)
                .map(|s| {
                    (
                        s.needs_input.take(),
                        s.too_large,
                        s.undecodable.take(),
                        s.unattributed_elicitation,
                        s.sampling_refused,
                        s.sampling_model_failed.take(),
                    )
                })
                .unwrap_or_default();
        if too_large {
            return CallOutcome::AnswerTooLarge {
                limit_bytes: u64::try_from(MAX_STDIO_MESSAGE_BYTES).unwrap_or(u64::MAX),
            };
        }
        if let Some(reason) = undecodable {
            return CallOutcome::Undecodable { reason };
        }
        if let Some(needed) = needs_input {
            // We answered the server's elicitation with `cancel`; whatever it
            // returned after that is not the answer the user would give.
            return CallOutcome::NeedsInput(needed);
        }
        if unattributed && response.is_ok() {
            return CallOutcome::Malformed {
                reason: "the server asked for input (elicitation/create) while several calls were in flight on this connection, \
                         so Belay could not tell which call asked and answered `cancel`; this call's answer may reflect that cancelled question"
                    .into(),
            };
        }
        if let Ok(CallToolResponse::InputRequired(input)) = &response
            && input.input_requests.as_ref().is_some_and(|requests| {
                requests
                    .values()
                    .any(|r| matches!(r, InputRequest::CreateMessage(_)))
            })
        {
            // Protocol 2026-07-28 asks within the result: nothing ran yet,
            // and no person could answer a completion request.
            return CallOutcome::SamplingRefused {
                may_have_acted: false,
                detail: None,
            };
        }
        let outcome = match response {
            Ok(CallToolResponse::Complete(result)) => {
                finish(result, tool, request.max_result_bytes)
            }
            Ok(CallToolResponse::InputRequired(input)) => CallOutcome::NeedsInput(InputNeeded {
                via: InputVia::InputRequired,
                requests: input
                    .input_requests
                    .as_ref()
                    .and_then(|r| serde_json::to_value(r).ok())
                    .unwrap_or(Value::Null),
                request_state: input.request_state.clone(),
                may_have_acted: false,
            }),
            Ok(CallToolResponse::Task(_)) => CallOutcome::Malformed {
                reason: "the server answered with a task, which Belay did not ask for".into(),
            },
            Ok(_) => CallOutcome::Malformed {
                reason: "the server's answer to tools/call is of an unknown kind".into(),
            },
            Err(e) => {
                let sent = match &e {
                    // An answer: it was sent.
                    ServiceError::McpError(_) => true,
                    _ => self.settle(marker).sent,
                };
                classify(e, sent)
            }
        };
        match outcome {
            // The server recovered from the refusal: its result stands.
            CallOutcome::Ok(_) => outcome,
            // The run's model failed a completion the tool needed (a 429, a
            // timeout): the tool ran and may have acted, and a repeat may
            // succeed, so its repeat safety decides, not a definite refusal.
            CallOutcome::ToolError(_) | CallOutcome::Rejected { .. } if model_failed.is_some() => {
                CallOutcome::LostAfterSend {
                    reason: format!(
                        "the tool failed after the run's model failed a completion its server asked for (MCP sampling): {}; \
                         the tool may have acted, and a repeat may succeed",
                        model_failed.unwrap_or_default()
                    ),
                }
            }
            _ if !sampling_refused => outcome,
            CallOutcome::ToolError(result) => CallOutcome::SamplingRefused {
                may_have_acted: true,
                detail: Some(result::text(&result.content)),
            },
            CallOutcome::Rejected { code, message, .. } => CallOutcome::SamplingRefused {
                may_have_acted: true,
                detail: Some(format!("JSON-RPC error {code}: {message}")),
            },
            // Lost, cancelled, timed out…: what happened to the call matters
            // more than why the server asked.
            other => other,
        }
    }
}

/// Maps an rmcp error to an outcome, using whether the request may have
/// reached the server (`sent`, from [`Calls::settle`]).
fn classify(error: ServiceError, sent: bool) -> CallOutcome {
    let reason = error_chain(&error);
    let lost = |reason: String| {
        if sent {
            CallOutcome::LostAfterSend { reason }
        } else {
            CallOutcome::Disconnected { reason }
        }
    };
    match error {
        ServiceError::McpError(data) if data.code.0 == URL_ELICITATION_REQUIRED => {
            CallOutcome::NeedsInput(InputNeeded {
                via: InputVia::UrlElicitationRequired,
                requests: data
                    .data
                    .clone()
                    .unwrap_or_else(|| Value::String(data.message.to_string())),
                request_state: None,
                may_have_acted: false,
            })
        }
        ServiceError::McpError(data) => CallOutcome::Rejected {
            code: data.code.0,
            message: data.message.to_string(),
            data: data.data,
        },
        ServiceError::UnexpectedResponse => CallOutcome::Malformed {
            reason: "the server's answer to tools/call is not a tool result".into(),
        },
        ServiceError::Cancelled { reason } => CallOutcome::Cancelled { sent, reason },
        ServiceError::Timeout { timeout } => CallOutcome::Timeout {
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            sent,
            detail: None,
        },
        _ => lost(reason),
    }
}

/// A complete `tools/call` result: error or success, output schema checked,
/// truncated.
fn finish(result: CallToolResult, tool: &CompiledTool, max_bytes: usize) -> CallOutcome {
    let content: Result<Vec<Value>, _> = result.content.iter().map(serde_json::to_value).collect();
    let Ok(content) = content else {
        return CallOutcome::Malformed {
            reason: "a content block cannot be represented as JSON".into(),
        };
    };
    if result.is_error == Some(true) {
        return CallOutcome::ToolError(result::truncate(
            content,
            result.structured_content,
            max_bytes,
        ));
    }
    if let Some(validator) = &tool.output {
        match &result.structured_content {
            None => {
                return CallOutcome::Malformed {
                    reason: "the tool declares an output schema but returned no structuredContent"
                        .into(),
                };
            }
            Some(structured) => {
                if let Err(errors) = schema::validate(validator, structured) {
                    return CallOutcome::Malformed {
                        reason: format!(
                            "structuredContent does not match the output schema: {errors}"
                        ),
                    };
                }
            }
        }
    }
    CallOutcome::Ok(result::truncate(
        content,
        result.structured_content,
        max_bytes,
    ))
}

/// What the client makes of one line a stdio server writes (see
/// [`super::check_server_line`]).
pub(crate) fn check_line(line: &[u8]) -> String {
    static TOOL: std::sync::OnceLock<Option<CompiledTool>> = std::sync::OnceLock::new();
    let tool = TOOL.get_or_init(|| {
        schema::map_tool(&RawTool {
            name: "t".into(),
            title: None,
            description: None,
            input_schema: serde_json::json!({"type": "object"}),
            output_schema: Some(serde_json::json!({
                "type": "object",
                "properties": {"n": {"type": "integer"}},
                "required": ["n"],
            })),
            annotations: None,
        })
        .ok()
    });
    let decoded = match stdio::decode_line(line) {
        stdio::Decoded::Message(message, _) => Ok(*message),
        other => Err(other),
    };
    match decoded {
        Ok(JsonRpcMessage::Response(response)) => {
            let result = serde_json::to_value(&response.result)
                .ok()
                .and_then(|v| serde_json::from_value::<CallToolResult>(v).ok());
            match (result, tool) {
                (Some(result), Some(tool)) => format!("{:?}", finish(result, tool, 1024)),
                _ => "response".into(),
            }
        }
        Ok(JsonRpcMessage::Error(e)) => {
            format!("{:?}", classify(ServiceError::McpError(e.error), true))
        }
        Ok(_) | Err(stdio::Decoded::Message(..)) => "message".into(),
        Err(stdio::Decoded::Skip) => "skip".into(),
        Err(stdio::Decoded::Request { .. }) => "request".into(),
        Err(stdio::Decoded::Answer { reason, .. }) => format!("undecodable answer: {reason}"),
        Err(stdio::Decoded::Unknown { reason }) => format!("unknown: {reason}"),
    }
}

/// The error and its sources joined with `": "`.
fn error_chain(error: &(dyn StdError + 'static)) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        let text = inner.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = inner.source();
    }
    out
}

impl Shared {
    /// See [`McpClient::list_resources`].
    async fn resources(&self) -> Result<ResourceListing, McpError> {
        let deadline = self.connect_deadline();
        let live = self.live(deadline).await?;
        let protocol = |e: ServiceError| McpError::Protocol {
            server: self.server.name.clone(),
            message: error_chain(&e),
        };
        let declared = live
            .peer
            .peer_info()
            .is_some_and(|info| info.capabilities.resources.is_some());
        if !declared {
            return Ok(ResourceListing {
                server: self.server.name.clone(),
                resources: Vec::new(),
                templates: Vec::new(),
            });
        }
        let resources = live.peer.list_all_resources().await.map_err(protocol)?;
        let templates = match live.peer.list_all_resource_templates().await {
            Ok(templates) => templates,
            Err(ServiceError::McpError(e))
                if e.code == rmcp::model::ErrorCode::METHOD_NOT_FOUND =>
            {
                Vec::new()
            }
            Err(e) => return Err(protocol(e)),
        };
        Ok(ResourceListing {
            server: self.server.name.clone(),
            resources: resources
                .iter()
                .filter_map(|r| serde_json::to_value(r).ok())
                .collect(),
            templates: templates
                .iter()
                .filter_map(|t| serde_json::to_value(t).ok())
                .collect(),
        })
    }

    /// See [`McpClient::read_resource`].
    async fn read(&self, request: ReadRequest) -> CallOutcome {
        let timeout = Duration::from_millis(request.timeout_ms);
        let reading = async {
            let live = match self.live(self.connect_deadline()).await {
                Ok(live) => live,
                Err(e) => {
                    return CallOutcome::Disconnected {
                        reason: e.to_string(),
                    };
                }
            };
            let params = ReadResourceRequestParams::new(request.uri.clone());
            match live.peer.read_resource_once(params).await {
                Ok(ReadResourceResponse::Complete(result)) => {
                    let contents: Result<Vec<Value>, _> =
                        result.contents.iter().map(serde_json::to_value).collect();
                    match contents {
                        Ok(contents) => CallOutcome::Ok(result::truncate(
                            contents,
                            None,
                            request.max_result_bytes,
                        )),
                        Err(e) => CallOutcome::Malformed {
                            reason: format!("resource contents cannot be represented as JSON: {e}"),
                        },
                    }
                }
                Ok(_) => CallOutcome::Malformed {
                    reason:
                        "the server asked for input to read a resource, which Belay does not answer"
                            .into(),
                },
                // Sent or not, a read changed nothing.
                Err(e) => classify(e, true),
            }
        };
        match tokio::time::timeout(timeout, reading).await {
            Ok(outcome) => outcome,
            Err(_) => CallOutcome::Timeout {
                timeout_ms: request.timeout_ms,
                sent: true,
                detail: None,
            },
        }
    }
}

impl McpClient for RmcpClient {
    fn server(&self) -> &str {
        &self.shared.server.name
    }

    fn trusted(&self) -> bool {
        self.shared.server.common.trusted
    }

    fn list_tools(&self) -> BoxFuture<'_, Result<Discovery, McpError>> {
        Box::pin(async move {
            let mut catalog = self.shared.catalog.lock().await;
            let (discovery, fresh) = self.shared.discover().await?;
            *catalog = Some(fresh);
            Ok(discovery)
        })
    }

    fn call_tool(&self, request: CallRequest) -> BoxFuture<'_, CallOutcome> {
        Box::pin(self.shared.call(request))
    }

    fn tools_changed(&self) -> watch::Receiver<u64> {
        self.shared.changes.subscribe()
    }

    fn status(&self) -> ServerStatus {
        let state = self.shared.state.borrow().clone();
        let transport = match self.shared.server.transport {
            ResolvedTransport::Stdio { .. } => "stdio",
            ResolvedTransport::Http { .. } => "http",
        };
        let (connected, generation, pid, protocol_version) = match &state {
            ConnState::Up(live) if !live.peer.is_transport_closed() => (
                true,
                live.generation,
                live.pid,
                Some(live.protocol_version.clone()),
            ),
            _ => (
                false,
                self.shared.generation.load(Ordering::Relaxed),
                None,
                None,
            ),
        };
        ServerStatus {
            server: self.shared.server.name.clone(),
            transport: transport.to_owned(),
            connected,
            generation,
            pid,
            protocol_version,
            last_error: lock(&self.shared.last_error).clone(),
        }
    }

    fn events(&self) -> broadcast::Receiver<McpEvent> {
        self.shared.events.subscribe()
    }

    fn list_resources(&self) -> BoxFuture<'_, Result<ResourceListing, McpError>> {
        Box::pin(self.shared.resources())
    }

    fn read_resource(&self, request: ReadRequest) -> BoxFuture<'_, CallOutcome> {
        Box::pin(self.shared.read(request))
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.shared.shutdown.cancel();
            let handle = lock(&self.supervisor).take();
            if let Some(handle) = handle {
                let _ = handle.await;
            }
        })
    }
}
