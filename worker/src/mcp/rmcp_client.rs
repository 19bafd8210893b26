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

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::error::Error as StdError;
use std::future::Future;
use std::process::Stdio;
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
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpError,
    StreamableHttpPostResponse, StreamableHttpResponseLimits,
};
use rmcp::transport::{StreamableHttpClientTransport, Transport};
use rmcp::{ClientHandler, ErrorData, ServiceError};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, AsyncRead, AsyncReadExt as _, BufReader, ReadBuf};
use tokio::sync::{broadcast, mpsc, watch};
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
/// Longest stderr line logged at once, in bytes; longer lines are split.
const MAX_STDERR_LINE: u64 = 8 * 1024;
/// Longest message a stdio server may send, in bytes (one JSON-RPC line).
/// rmcp discards a longer line; [`LineWatch`] sees it and the call it
/// answers ends at once as [`CallOutcome::AnswerTooLarge`]. Results are
/// truncated to the call's size limit after they are read, so this only
/// bounds the memory one message may take.
pub(crate) const MAX_STDIO_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
/// How much of a line's start is kept to find its JSON-RPC `id`.
const LINE_HEAD_BYTES: usize = 512;
/// Private JSON-RPC error code of the error put in place of a discarded
/// oversized answer (never sent by a server: the slot's flag decides).
const ANSWER_TOO_LARGE_CODE: i32 = -32_099;
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
    /// The transport has it (writing or POSTing).
    Handed,
    /// The transport finished sending it.
    Written,
    /// The transport failed to send it; `not_sent` when provably nothing
    /// reached the server.
    WriteFailed { not_sent: bool },
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

    /// Marks the call of `marker` as handed to the transport of `generation`.
    fn handed(&self, marker: u64, generation: u64, id: RequestId, progress: Option<Value>) {
        if let Some(slot) = lock(&self.slots).get_mut(&marker) {
            slot.state = SendState::Handed;
            slot.generation = generation;
            slot.request_id = Some(id);
            slot.progress_token = progress;
        }
    }

    fn sent(&self, marker: u64, outcome: SendState) -> Option<String> {
        let mut slots = lock(&self.slots);
        let slot = slots.get_mut(&marker)?;
        slot.state = outcome;
        Some(slot.label.clone())
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

struct Tracked<T: Transport<RoleClient>> {
    inner: T,
    calls: Arc<Calls>,
    events: broadcast::Sender<McpEvent>,
    generation: u64,
    not_sent: NotSentFn<T::Error>,
    /// Stdio: the JSON-RPC ids (when found) of lines [`LineWatch`] saw grow
    /// past [`MAX_STDIO_MESSAGE_BYTES`], which rmcp discards.
    oversized: Option<mpsc::UnboundedReceiver<Option<RequestId>>>,
}

impl<T: Transport<RoleClient>> Tracked<T> {
    /// Strips the marker of a `tools/call` request and records it as handed.
    fn take_marker(&self, item: &mut ClientJsonRpcMessage) -> Option<u64> {
        let JsonRpcMessage::Request(request) = item else {
            return None;
        };
        // rmcp keeps the progress token in the request's extensions and
        // merges it into `_meta` when it serializes.
        let progress = request
            .request
            .get_meta()
            .get_progress_token()
            .and_then(|token| serde_json::to_value(token).ok());
        let ClientRequest::CallToolRequest(call) = &mut request.request else {
            return None;
        };
        let meta = call.params.meta.as_mut()?;
        let marker = meta.0.0.remove(MARKER_KEY)?.as_u64()?;
        self.calls
            .handed(marker, self.generation, request.id.clone(), progress);
        Some(marker)
    }
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for Tracked<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        mut item: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let marker = self.take_marker(&mut item);
        let sending = self.inner.send(item);
        let calls = self.calls.clone();
        let events = self.events.clone();
        let not_sent = self.not_sent;
        async move {
            let result = sending.await;
            if let Some(marker) = marker {
                let state = match &result {
                    Ok(()) => SendState::Written,
                    Err(e) => SendState::WriteFailed {
                        not_sent: not_sent(e),
                    },
                };
                let written = state == SendState::Written;
                if let Some(label) = calls.sent(marker, state)
                    && written
                {
                    let _ = events.send(McpEvent::RequestWritten { call: label });
                }
            }
            result
        }
    }

    async fn receive(&mut self) -> Option<ServerJsonRpcMessage> {
        loop {
            let Some(oversized) = self.oversized.as_mut() else {
                return self.inner.receive().await;
            };
            // rmcp's line reader is cancellation safe (its own service
            // loop polls it inside a `select!`), so a discarded answer
            // can be reported while it is still skipping the rest of it.
            let id = tokio::select! {
                biased;
                Some(id) = oversized.recv() => id,
                message = self.inner.receive() => return message,
            };
            if let Some(message) = self.too_large(id) {
                return Some(message);
            }
        }
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

impl<T: Transport<RoleClient>> Tracked<T> {
    /// An error answer to the call whose answer was discarded as too large
    /// (found by the line's `id`, else the only call in flight), so that it
    /// ends now rather than at its timeout; `None` when no call is known.
    fn too_large(&self, id: Option<RequestId>) -> Option<ServerJsonRpcMessage> {
        let marker = match &id {
            Some(id) => self.calls.by_request_id(self.generation, id),
            None => self.calls.single_in_flight(self.generation),
        };
        let Some(marker) = marker else {
            tracing::error!(
                ?id,
                max_bytes = MAX_STDIO_MESSAGE_BYTES,
                "an MCP server sent a message too large to read, answering no known call; discarded"
            );
            return None;
        };
        let mut slots = lock(&self.calls.slots);
        let slot = slots.get_mut(&marker)?;
        let id = slot.request_id.clone()?;
        slot.too_large = true;
        Some(ServerJsonRpcMessage::error(
            ErrorData::new(
                rmcp::model::ErrorCode(ANSWER_TOO_LARGE_CODE),
                format!("the answer is larger than {MAX_STDIO_MESSAGE_BYTES} bytes"),
                None,
            ),
            Some(id),
        ))
    }
}

/// A stdio server's stdout, watched for lines longer than
/// [`MAX_STDIO_MESSAGE_BYTES`] (the limit given to rmcp's line reader, which
/// drops such a line without telling anyone). For each, the `id` found at
/// the line's start (if any) is sent on `oversized`.
struct LineWatch<R> {
    inner: R,
    /// Bytes of the current line so far (without its newline).
    len: usize,
    head: Vec<u8>,
    reported: bool,
    oversized: mpsc::UnboundedSender<Option<RequestId>>,
}

impl<R> LineWatch<R> {
    fn new(inner: R, oversized: mpsc::UnboundedSender<Option<RequestId>>) -> Self {
        Self {
            inner,
            len: 0,
            head: Vec::new(),
            reported: false,
            oversized,
        }
    }

    fn saw(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let newline = bytes.iter().position(|b| *b == b'\n');
            let part = &bytes[..newline.unwrap_or(bytes.len())];
            let room = LINE_HEAD_BYTES.saturating_sub(self.head.len());
            self.head.extend_from_slice(&part[..part.len().min(room)]);
            self.len = self.len.saturating_add(part.len());
            // rmcp drops a line when it and its newline exceed the limit.
            if !self.reported && self.len >= MAX_STDIO_MESSAGE_BYTES {
                self.reported = true;
                let _ = self.oversized.send(id_in_head(&self.head));
            }
            match newline {
                Some(at) => {
                    self.len = 0;
                    self.head.clear();
                    self.reported = false;
                    bytes = &bytes[at + 1..];
                }
                None => bytes = &[],
            }
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for LineWatch<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if let std::task::Poll::Ready(Ok(())) = &polled {
            let this = &mut *self;
            this.saw(&buf.filled()[before..]);
        }
        polled
    }
}

/// The top-level `"id"` of a JSON-RPC message from the start of its line,
/// when it is there (a number, or a string without escapes).
fn id_in_head(head: &[u8]) -> Option<RequestId> {
    let skip_ws = |mut i: usize| {
        while head.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
        }
        i
    };
    let mut depth = 0usize;
    let mut i = 0;
    while i < head.len() {
        match head[i] {
            b'"' => {
                let start = i + 1;
                i = start;
                while *head.get(i)? != b'"' {
                    i += if head[i] == b'\\' { 2 } else { 1 };
                }
                let key = &head[start..i];
                i += 1;
                if depth == 1 && key == b"id" {
                    let colon = skip_ws(i);
                    if head.get(colon) != Some(&b':') {
                        continue;
                    }
                    let value = skip_ws(colon + 1);
                    if head.get(value) == Some(&b'"') {
                        let end = value + 1 + head[value + 1..].iter().position(|b| *b == b'"')?;
                        let text = std::str::from_utf8(&head[value + 1..end]).ok()?;
                        if text.contains('\\') {
                            return None;
                        }
                        return Some(RequestId::String(text.into()));
                    }
                    let end = value
                        + head[value..]
                            .iter()
                            .position(|b| !(b.is_ascii_digit() || *b == b'-'))?;
                    let number = std::str::from_utf8(&head[value..end]).ok()?.parse().ok()?;
                    return Some(RequestId::Number(number));
                }
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    None
}

/// A stdio server process and rmcp's line transport over its pipes (with
/// [`MAX_STDIO_MESSAGE_BYTES`] and [`LineWatch`]). The process is killed
/// when this is dropped (`kill_on_drop`); `close` first closes its stdin
/// and lets it exit for a moment.
struct StdioProcess {
    child: tokio::process::Child,
    transport: AsyncRwTransport<
        RoleClient,
        LineWatch<tokio::process::ChildStdout>,
        tokio::process::ChildStdin,
    >,
}

/// How long a closed stdio server may take to exit before it is killed.
const STDIO_EXIT_WAIT: Duration = Duration::from_secs(3);

impl StdioProcess {
    fn spawn(
        mut cmd: tokio::process::Command,
    ) -> std::io::Result<(
        Self,
        tokio::process::ChildStderr,
        mpsc::UnboundedReceiver<Option<RequestId>>,
    )> {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn()?;
        let missing = || std::io::Error::other("a pipe of the child process is missing");
        let stdin = child.stdin.take().ok_or_else(missing)?;
        let stdout = child.stdout.take().ok_or_else(missing)?;
        let stderr = child.stderr.take().ok_or_else(missing)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let transport = AsyncRwTransport::new(LineWatch::new(stdout, tx), stdin)
            .with_max_line_length(MAX_STDIO_MESSAGE_BYTES);
        Ok((Self { child, transport }, stderr, rx))
    }
}

impl Transport<RoleClient> for StdioProcess {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.transport.send(item)
    }

    fn receive(&mut self) -> impl Future<Output = Option<ServerJsonRpcMessage>> + Send {
        self.transport.receive()
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.transport.close().await?;
        if tokio::time::timeout(STDIO_EXIT_WAIT, self.child.wait())
            .await
            .is_err()
        {
            self.child.kill().await?;
        }
        Ok(())
    }
}

/// A failed write to a server's stdin means its read end is closed: the
/// server cannot have read the request (a partial line is not a request).
fn stdio_not_sent(_: &std::io::Error) -> bool {
    true
}

/// HTTP: provably not processed when the connection was never made, the
/// request never built, or the server refused it before handling it.
fn http_not_sent(error: &StreamableHttpError<reqwest::Error>) -> bool {
    match error {
        StreamableHttpError::Client(e) => e.is_connect() || e.is_builder(),
        StreamableHttpError::HttpStatus(status) => status.status == 429,
        // 401/403: refused before it was handled (or, with `oauth`, no
        // token could be had and nothing was sent).
        StreamableHttpError::SessionExpired
        | StreamableHttpError::ReservedHeaderConflict(_)
        | StreamableHttpError::AuthRequired(_)
        | StreamableHttpError::InsufficientScope(_) => true,
        _ => false,
    }
}

// ---------------------------------------------------------------------------
// Streamable HTTP backend with per-call headers.

#[derive(Clone)]
struct HeaderClient {
    inner: reqwest::Client,
    calls: Arc<Calls>,
    generation: u64,
    /// Cancelled when the server no longer knows this connection's session:
    /// the supervisor then re-makes the connection (see [`HeaderClient::answered`]).
    lost: CancellationToken,
    /// Bearer tokens for a server configured with `oauth`.
    oauth: Option<Arc<OAuth>>,
}

/// Bearer tokens of one server configured with `oauth` (client-credentials
/// grant, RFC 6749 §4.4, with the server's canonical URI as RFC 8707
/// `resource`): from its configured token endpoint, or from the one
/// discovered from its 401 answer ([`crate::oauth_discovery`]). Tokens and
/// the discovered endpoint outlive a connection (they are in [`Shared`]).
struct OAuth {
    config: ResolvedOAuth,
    /// The MCP endpoint: the protected resource.
    resource: reqwest::Url,
    tokens: Arc<crate::oauth2::TokenCache>,
    /// For a configured token endpoint (the operator's choice, as the
    /// server's URL is: not subject to the address policy).
    http: reqwest::Client,
    /// Through the worker's address policy: every discovery fetch and a
    /// discovered token endpoint (both chosen by the server).
    discovery: crate::oauth_discovery::Discovery,
    state: Arc<OAuthState>,
}

/// What one server's [`OAuth`] keeps across connections.
#[derive(Default)]
struct OAuthState {
    /// The discovered token endpoint and the challenge it came from; one
    /// discovery at a time.
    found: tokio::sync::Mutex<Found>,
    /// Why the latest token could not be had: a handshake that failed for
    /// it reports this rather than rmcp's bare "auth required".
    failure: Mutex<Option<AuthorizationError>>,
}

#[derive(Default)]
struct Found {
    endpoint: Option<Arc<Discovered>>,
    challenge: Option<Challenge>,
}

/// Where tokens come from.
#[derive(Clone)]
enum Grant {
    /// `oauth.token_url`.
    Configured(reqwest::Url),
    /// Found by discovery.
    Discovered(Arc<Discovered>),
}

impl Grant {
    /// The token endpoint.
    fn token_url(&self) -> &reqwest::Url {
        match self {
            Self::Configured(url) => url,
            Self::Discovered(found) => &found.token_url,
        }
    }
}

/// How long a token request may take, in ms.
const OAUTH_TOKEN_TIMEOUT_MS: u64 = 10_000;

/// When the server refused a request's credentials (401): its `Bearer`
/// challenge, if it sent one. `None`: not a 401.
fn refusal<T>(
    result: &Result<T, StreamableHttpError<reqwest::Error>>,
) -> Option<Option<Challenge>> {
    match result {
        // rmcp reports a 401 with a `WWW-Authenticate` header as
        // `AuthRequired`, and one without in an unexpected-response error.
        Err(StreamableHttpError::AuthRequired(e)) => {
            Some(Challenge::parse(&e.www_authenticate_header))
        }
        Err(StreamableHttpError::UnexpectedServerResponse(message))
            if message.starts_with("HTTP 401") =>
        {
            Some(None)
        }
        _ => None,
    }
}

/// A token that could not be had, or a fresh one the server refused, as a
/// transport error (a 401: the server handled nothing).
fn no_token(error: &AuthorizationError) -> StreamableHttpError<reqwest::Error> {
    let message = match error {
        AuthorizationError::TokenRefused { .. } => error.to_string(),
        _ => format!("no OAuth access token: {error}"),
    };
    StreamableHttpError::AuthRequired(
        rmcp::transport::streamable_http_client::AuthRequiredError::new(message),
    )
}

impl OAuth {
    /// The credentials of a token request from `grant`.
    fn creds(&self, grant: &Grant) -> crate::oauth2::ClientCredentials {
        let (token_url, scopes, resource, auth) = match grant {
            Grant::Configured(url) => (
                url.clone(),
                self.config.scopes.clone(),
                crate::oauth_discovery::canonical_resource(&self.resource),
                crate::oauth2::ClientAuth::Basic,
            ),
            Grant::Discovered(found) => (
                found.token_url.clone(),
                found.scopes.clone(),
                found.resource.clone(),
                found.auth,
            ),
        };
        crate::oauth2::ClientCredentials {
            token_url,
            client_id: self.config.client_id.clone(),
            client_secret: self.config.client_secret.clone(),
            scopes,
            resource: Some(resource),
            auth,
        }
    }

    /// The grant known now: the configured endpoint, or one discovered
    /// earlier. `None`: to be discovered.
    async fn known(&self) -> Option<Grant> {
        match &self.config.token_url {
            Some(url) => Some(Grant::Configured(url.clone())),
            None => self
                .state
                .found
                .lock()
                .await
                .endpoint
                .clone()
                .map(Grant::Discovered),
        }
    }

    /// Discovers the token endpoint, with `challenge` (else the last one
    /// seen), unless another request already did (or already replaced
    /// `stale`): then that one.
    async fn discover(
        &self,
        challenge: Option<Challenge>,
        stale: Option<&Arc<Discovered>>,
    ) -> Result<Grant, AuthorizationError> {
        let mut found = self.state.found.lock().await;
        if let Some(current) = &found.endpoint
            && stale.is_none_or(|stale| !Arc::ptr_eq(stale, current))
        {
            return Ok(Grant::Discovered(current.clone()));
        }
        if challenge.is_some() {
            found.challenge = challenge;
        }
        let discovered = self
            .discovery
            .discover(
                &self.resource,
                found.challenge.as_ref(),
                &self.config.scopes,
            )
            .await?;
        tracing::info!(
            resource = discovered.resource,
            resource_metadata = %discovered.resource_metadata_url,
            issuer = discovered.issuer,
            token_endpoint = %discovered.token_url,
            scopes = discovered.scopes,
            "MCP server's OAuth token endpoint discovered"
        );
        let discovered = Arc::new(discovered);
        found.endpoint = Some(discovered.clone());
        Ok(Grant::Discovered(discovered))
    }

    /// A token from `grant` (a new one if the cached one is `rejected`).
    async fn token(
        &self,
        grant: &Grant,
        rejected: Option<&str>,
    ) -> Result<String, AuthorizationError> {
        let creds = self.creds(grant);
        let http = match grant {
            Grant::Configured(_) => &self.http,
            Grant::Discovered(_) => {
                self.discovery.check(&creds.token_url).map_err(|refused| {
                    crate::oauth2::TokenError {
                        token_url: creds.token_url.to_string(),
                        message: refused.to_string(),
                        refused: Some(refused),
                        too_large: None,
                    }
                })?;
                self.discovery.http()
            }
        };
        let timeout = Duration::from_millis(OAUTH_TOKEN_TIMEOUT_MS);
        let token = match rejected {
            None => self.tokens.token(http, &creds, timeout).await,
            Some(rejected) => {
                self.tokens
                    .refresh_after_rejection(http, &creds, rejected, timeout)
                    .await
            }
        };
        Ok(token?)
    }

    /// [`OAuth::token`]; when a discovered endpoint fails, it is discovered
    /// again once (`rediscovered` says whether that chance is used up).
    async fn token_or_rediscover(
        &self,
        grant: &mut Grant,
        rejected: Option<&str>,
        rediscovered: &mut bool,
    ) -> Result<String, AuthorizationError> {
        match self.token(grant, rejected).await {
            Ok(token) => Ok(token),
            Err(error) => {
                let Grant::Discovered(stale) = grant.clone() else {
                    return Err(error);
                };
                if *rediscovered {
                    return Err(error);
                }
                tracing::info!(
                    %error,
                    "the discovered token endpoint failed: discovering it again"
                );
                *rediscovered = true;
                *grant = self.discover(None, Some(&stale)).await?;
                self.token(grant, rejected).await
            }
        }
    }

    /// Records why no token could be had, as the transport error.
    fn failed(&self, error: AuthorizationError) -> StreamableHttpError<reqwest::Error> {
        let refused = no_token(&error);
        *lock(&self.state.failure) = Some(error);
        refused
    }

    /// `result`, unless it is a 401 to the fresh token from `grant`: then
    /// [`AuthorizationError::TokenRefused`], recorded as [`OAuth::failed`]
    /// does, so that a handshake refused for it says so.
    fn unless_refused<T>(
        &self,
        grant: &Grant,
        result: Result<T, StreamableHttpError<reqwest::Error>>,
    ) -> Result<T, StreamableHttpError<reqwest::Error>> {
        let Some(challenge) = refusal(&result) else {
            return result;
        };
        let error = AuthorizationError::TokenRefused {
            resource: self.resource.to_string(),
            token_url: grant.token_url().to_string(),
            challenge_error: challenge
                .and_then(|c| c.error)
                .map(|e| e.chars().take(64).collect()),
        };
        tracing::warn!(%error, "MCP server refused a fresh access token");
        Err(self.failed(error))
    }

    /// Runs `send` with a bearer token (see [`HeaderClient::authorized`]).
    async fn authorized<T, F, Fut>(&self, send: F) -> Result<T, StreamableHttpError<reqwest::Error>>
    where
        F: Fn(Option<String>) -> Fut,
        Fut: Future<Output = Result<T, StreamableHttpError<reqwest::Error>>>,
    {
        let mut rediscovered = false;
        let mut grant = match self.known().await {
            Some(grant) => grant,
            None => {
                // Nothing known yet: the server's 401 says where to look
                // (MCP authorization, "Authorization Server Discovery").
                let result = send(None).await;
                let Some(challenge) = refusal(&result) else {
                    return result;
                };
                rediscovered = true;
                self.discover(challenge, None)
                    .await
                    .map_err(|e| self.failed(e))?
            }
        };
        let token = self
            .token_or_rediscover(&mut grant, None, &mut rediscovered)
            .await
            .map_err(|e| self.failed(e))?;
        let result = send(Some(token.clone())).await;
        if refusal(&result).is_none() {
            return result;
        }
        tracing::info!(
            token_url = grant.token_url().as_str(),
            "MCP server answered 401: fetching a new access token"
        );
        let token = self
            .token_or_rediscover(&mut grant, Some(&token), &mut rediscovered)
            .await
            .map_err(|e| self.failed(e))?;
        let result = send(Some(token.clone())).await;
        let Some(challenge) = refusal(&result) else {
            return result;
        };
        let Grant::Discovered(stale) = &grant else {
            return self.unless_refused(&grant, result);
        };
        if rediscovered {
            return self.unless_refused(&grant, result);
        }
        // A fresh token refused too: the server may have moved to another
        // authorization server.
        tracing::info!(
            "MCP server refused a fresh access token: discovering the token endpoint again"
        );
        let stale = stale.clone();
        grant = self
            .discover(challenge, Some(&stale))
            .await
            .map_err(|e| self.failed(e))?;
        let token = self
            .token(&grant, Some(&token))
            .await
            .map_err(|e| self.failed(e))?;
        let result = send(Some(token)).await;
        self.unless_refused(&grant, result)
    }
}

impl HeaderClient {
    /// Runs `send` with the bearer token of a server configured with
    /// `oauth` (else with `auth_header` as rmcp gave it): the cached token,
    /// and once more with a new one when the server answers 401. Without a
    /// token endpoint yet, the request goes without a token first, and a
    /// 401 starts discovery; a discovered endpoint that fails, or whose
    /// fresh token is refused again, is discovered again once. A 401 is
    /// the server refusing before handling the request, so sending it again
    /// cannot repeat an effect.
    async fn authorized<T, F, Fut>(
        &self,
        auth_header: Option<String>,
        send: F,
    ) -> Result<T, StreamableHttpError<reqwest::Error>>
    where
        F: Fn(Option<String>) -> Fut,
        Fut: Future<Output = Result<T, StreamableHttpError<reqwest::Error>>>,
    {
        match &self.oauth {
            None => send(auth_header).await,
            Some(oauth) => oauth.authorized(send).await,
        }
    }
}

type HeaderMap = HashMap<reqwest::header::HeaderName, reqwest::header::HeaderValue>;

impl HeaderClient {
    /// What a POST's answer means for the request it carried.
    ///
    /// A JSON-RPC error without an `id` answering a request is the server
    /// refusing that request before handling it (it could not read it, or
    /// does not know the session). rmcp cannot match it to the request, which
    /// would then wait for its whole timeout; so with a session attached and
    /// an error about the session (some servers answer an unknown session
    /// with 400 rather than the 404 the specification asks for) it becomes
    /// `SessionExpired`, and otherwise it is given the request's id. A
    /// `SessionExpired` (either way) marks the connection lost: rmcp's own
    /// re-initialisation is off, because it would repeat a call on a new
    /// session without the definition check of a re-made connection.
    fn answered(
        &self,
        message_id: Option<RequestId>,
        session_attached: bool,
        result: PostResult,
    ) -> PostResult {
        let result = match (result, message_id) {
            (
                Ok(StreamableHttpPostResponse::Json(JsonRpcMessage::Error(mut error), session)),
                Some(id),
            ) if error.id.is_none() => {
                let about_session = error.error.message.to_ascii_lowercase().contains("session");
                if session_attached && about_session {
                    Err(StreamableHttpError::SessionExpired)
                } else {
                    error.id = Some(id);
                    Ok(StreamableHttpPostResponse::Json(
                        JsonRpcMessage::Error(error),
                        session,
                    ))
                }
            }
            (result, _) => result,
        };
        if matches!(result, Err(StreamableHttpError::SessionExpired)) {
            self.lost.cancel();
        }
        result
    }

    fn headers_for(&self, message: &ClientJsonRpcMessage, mut headers: HeaderMap) -> HeaderMap {
        if let JsonRpcMessage::Request(request) = message
            && let Some(marker) = self.calls.by_request_id(self.generation, &request.id)
            && let Some(slot) = lock(&self.calls.slots).get(&marker)
        {
            headers.extend(slot.headers.iter().cloned());
        }
        headers
    }
}

type PostResult = Result<StreamableHttpPostResponse, StreamableHttpError<reqwest::Error>>;

/// The id of a request message (`None` for notifications and answers).
fn request_id(message: &ClientJsonRpcMessage) -> Option<RequestId> {
    match message {
        JsonRpcMessage::Request(request) => Some(request.id.clone()),
        _ => None,
    }
}

impl StreamableHttpClient for HeaderClient {
    type Error = reqwest::Error;

    fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HeaderMap,
    ) -> impl Future<Output = PostResult> + Send + '_ {
        let headers = self.headers_for(&message, custom_headers);
        let (id, attached) = (request_id(&message), session_id.is_some());
        async move {
            let result = self
                .authorized(auth_header, |auth| {
                    self.inner.post_message(
                        uri.clone(),
                        message.clone(),
                        session_id.clone(),
                        auth,
                        headers.clone(),
                    )
                })
                .await;
            self.answered(id, attached, result)
        }
    }

    fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HeaderMap,
        max_sse_event_size: usize,
    ) -> impl Future<Output = PostResult> + Send + '_ {
        let headers = self.headers_for(&message, custom_headers);
        let (id, attached) = (request_id(&message), session_id.is_some());
        async move {
            let result = self
                .authorized(auth_header, |auth| {
                    self.inner.post_message_with_max_sse_event_size(
                        uri.clone(),
                        message.clone(),
                        session_id.clone(),
                        auth,
                        headers.clone(),
                        max_sse_event_size,
                    )
                })
                .await;
            self.answered(id, attached, result)
        }
    }

    fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HeaderMap,
        limits: StreamableHttpResponseLimits,
    ) -> impl Future<Output = PostResult> + Send + '_ {
        let headers = self.headers_for(&message, custom_headers);
        let (id, attached) = (request_id(&message), session_id.is_some());
        async move {
            let result = self
                .authorized(auth_header, |auth| {
                    self.inner.post_message_with_response_limits(
                        uri.clone(),
                        message.clone(),
                        session_id.clone(),
                        auth,
                        headers.clone(),
                        limits,
                    )
                })
                .await;
            self.answered(id, attached, result)
        }
    }

    fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HeaderMap,
    ) -> impl Future<Output = Result<(), StreamableHttpError<reqwest::Error>>> + Send + '_ {
        self.authorized(auth_header, move |auth| {
            self.inner.delete_session(
                uri.clone(),
                session_id.clone(),
                auth,
                custom_headers.clone(),
            )
        })
    }

    fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HeaderMap,
    ) -> impl Future<
        Output = Result<
            futures_util::stream::BoxStream<'static, Result<sse_stream::Sse, sse_stream::Error>>,
            StreamableHttpError<reqwest::Error>,
        >,
    > + Send
    + '_ {
        self.authorized(auth_header, move |auth| {
            self.inner.get_stream(
                uri.clone(),
                session_id.clone(),
                last_event_id.clone(),
                auth,
                custom_headers.clone(),
            )
        })
    }
}

// ---------------------------------------------------------------------------
// Client handler.

struct Handler {
    shared: Arc<Shared>,
    generation: u64,
}

impl Handler {
    fn info() -> ClientConfig {
        let mut capabilities = ClientCapabilities::default();
        let mut elicitation = ElicitationCapability::default();
        elicitation.form = Some(FormElicitationCapability::default());
        elicitation.url = Some(UrlElicitationCapability::default());
        capabilities.elicitation = Some(elicitation);
        // Declared on every connection (connections are shared by calls);
        // each request is judged by the grant of the call that asked.
        #[allow(deprecated)]
        {
            capabilities.sampling = Some(SamplingCapability::default());
        }
        ClientConfig::new(
            capabilities,
            Implementation::new("belay-worker", env!("CARGO_PKG_VERSION")),
        )
    }

    /// The call an `elicitation/create` belongs to: by the request stream it
    /// came on (HTTP), else the only call in flight.
    fn call_of(&self, context: &RequestContext<RoleClient>) -> Option<u64> {
        if let Some(InboundStreamOrigin::OutboundRequest(id)) =
            context.extensions.get::<InboundStreamOrigin>()
            && let Some(marker) = self.shared.calls.by_request_id(self.generation, id)
        {
            return Some(marker);
        }
        self.shared.calls.single_in_flight(self.generation)
    }

    /// The call a `sampling/createMessage` belongs to: by the request
    /// stream it came on (HTTP), else the only call in flight if it has
    /// been the only call on this client since it started. Otherwise
    /// (stdio with calls that overlapped, or a request after its call
    /// ended while another runs) no call can be told for sure to have
    /// asked, and none is charged.
    fn sampling_call_of(&self, context: &RequestContext<RoleClient>) -> Option<u64> {
        if let Some(InboundStreamOrigin::OutboundRequest(id)) =
            context.extensions.get::<InboundStreamOrigin>()
            && let Some(marker) = self.shared.calls.by_request_id(self.generation, id)
        {
            return Some(marker);
        }
        self.shared.calls.sole_in_flight(self.generation)
    }
}

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        Self::info()
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let server = &self.shared.server.name;
        let Some(marker) = self.call_of(&context) else {
            // Every call that might have asked is told, so none reports an
            // answer shaped by a question nobody saw as a success.
            let mut slots = lock(&self.shared.calls.slots);
            for slot in slots.values_mut().filter(|s| {
                s.generation == self.generation
                    && matches!(s.state, SendState::Handed | SendState::Written)
            }) {
                slot.unattributed_elicitation = true;
            }
            tracing::warn!(
                server,
                "elicitation/create while several calls are in flight: cannot tell which asked; answered cancel"
            );
            return Ok(ElicitResult::new(rmcp::model::ElicitationAction::Cancel));
        };
        let mut slots = lock(&self.shared.calls.slots);
        let Some(slot) = slots.get_mut(&marker) else {
            return Ok(ElicitResult::new(rmcp::model::ElicitationAction::Cancel));
        };
        let asked = serde_json::to_value(&request).unwrap_or(Value::Null);
        let fits = slot.answers.front().is_some_and(|a| a.answers(&asked));
        if fits && let Some(answer) = slot.answers.pop_front() {
            let action = match answer.action {
                ElicitationAction::Accept => rmcp::model::ElicitationAction::Accept,
                ElicitationAction::Decline => rmcp::model::ElicitationAction::Decline,
                ElicitationAction::Cancel => rmcp::model::ElicitationAction::Cancel,
            };
            let mut result = ElicitResult::new(action);
            if let Some(content) = answer.content {
                result = result.with_content(content);
            }
            tracing::info!(
                server,
                call = slot.label,
                "elicitation answered from the call's answers"
            );
            return Ok(result);
        }
        let requests = asked;
        tracing::info!(
            server,
            call = slot.label,
            "elicitation/create: the call needs input"
        );
        // The first request is what the user must answer first; later ones
        // (after our cancel) are not kept.
        if slot.needs_input.is_none() {
            slot.needs_input = Some(InputNeeded {
                via: InputVia::Elicitation,
                requests,
                request_state: None,
                may_have_acted: true,
            });
        }
        Ok(ElicitResult::new(rmcp::model::ElicitationAction::Cancel))
    }

    /// A completion the server asks for during a call: made through the
    /// call's grant ([`CallRequest::sampling`]), at most its
    /// `max_requests`, each capped at its `max_tokens` and what is left of
    /// its `max_total_tokens`, a prompt within what is left of its
    /// `max_input_tokens`, text only; anything else is refused with a
    /// JSON-RPC error saying why, and the call is marked so that a failure
    /// that follows ends as [`CallOutcome::SamplingRefused`]. A request no
    /// call can be tied to for sure marks none, and a model that failed
    /// (-32603) marks the call so that a failure that follows ends as
    /// [`CallOutcome::LostAfterSend`]. The first error answer of a call
    /// is logged at warn, the rest at debug.
    #[allow(deprecated)]
    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        let server = &self.shared.server.name;
        let Some(marker) = self.sampling_call_of(&context) else {
            // No call is marked: one that did not ask would have its own
            // error reworded as a refused completion. A call that did ask
            // and fails for the refusal keeps its own outcome.
            let before = self
                .shared
                .calls
                .unattributed_sampling
                .fetch_add(1, Ordering::Relaxed);
            if before == 0 {
                tracing::warn!(
                    server,
                    "sampling/createMessage that no call in flight can be told for sure to have asked: refused"
                );
            } else {
                tracing::debug!(
                    server,
                    refused = before + 1,
                    "sampling/createMessage that no call in flight can be told for sure to have asked: refused"
                );
            }
            return Err(ErrorData::new(
                rmcp::model::ErrorCode(SAMPLING_REFUSED),
                "sampling/createMessage refused: Belay cannot tell for sure which tool call asked for it \
                 (none is in flight, or calls overlapped on this connection, whose requests carry no origin), \
                 so no grant applies",
                None,
            ));
        };
        let (label, session) = lock(&self.shared.calls.slots)
            .get(&marker)
            .map(|s| (s.label.clone(), s.sampling.clone()))
            .unwrap_or_default();
        let answer = match session {
            None => Err((SAMPLING_REFUSED, SAMPLING_NO_GRANT.to_owned())),
            Some(session) => sample(&session, params).await,
        };
        match answer {
            Ok(result) => {
                tracing::info!(
                    server,
                    call = label,
                    "sampling/createMessage answered by the run's model"
                );
                Ok(result)
            }
            Err((code, message)) => {
                let errors = lock(&self.shared.calls.slots)
                    .get_mut(&marker)
                    .map_or(1, |slot| {
                        // A model that failed is not a refusal: a failure
                        // that follows may be retried (`LostAfterSend`).
                        if code == SAMPLING_FAILED {
                            slot.sampling_model_failed = Some(message.clone());
                        } else {
                            slot.sampling_refused = true;
                        }
                        slot.sampling_errors = slot.sampling_errors.saturating_add(1);
                        slot.sampling_errors
                    });
                if errors == 1 {
                    tracing::warn!(server, call = label, code, "{message}");
                } else {
                    tracing::debug!(server, call = label, code, errors, "{message}");
                }
                Err(ErrorData::new(rmcp::model::ErrorCode(code), message, None))
            }
        }
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        tracing::info!(server = self.shared.server.name, "tools/list_changed");
        self.shared.changes.send_modify(|seq| *seq += 1);
        let _ = self.shared.events.send(McpEvent::ToolsChanged);
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let token = serde_json::to_value(&params.progress_token).unwrap_or(Value::Null);
        if let Some(call) = self.shared.calls.label_by_progress(&token) {
            let _ = self.shared.events.send(McpEvent::Progress {
                call,
                progress: params.progress,
                total: params.total,
                message: params.message,
            });
        }
    }

    #[allow(deprecated)]
    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let server = &self.shared.server.name;
        let data = params.data.to_string();
        match params.level {
            LoggingLevel::Debug => tracing::debug!(server, logger = params.logger, "{data}"),
            LoggingLevel::Info | LoggingLevel::Notice => {
                tracing::info!(server, logger = params.logger, "{data}");
            }
            LoggingLevel::Warning => tracing::warn!(server, logger = params.logger, "{data}"),
            _ => tracing::error!(server, logger = params.logger, "{data}"),
        }
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
    /// (HTTP: the server forgot the session).
    lost: CancellationToken,
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
    // Cancelled (HTTP) when the server forgot the session: ends the connection.
    let lost = CancellationToken::new();
    let (running, pid) = match &shared.server.transport {
        ResolvedTransport::Stdio {
            command,
            args,
            env,
            inherit_env,
            cwd,
        } => {
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
            let (process, stderr, oversized) =
                StdioProcess::spawn(cmd).map_err(|e| McpError::Spawn {
                    server: name.clone(),
                    command: command.clone(),
                    message: e.to_string(),
                })?;
            let pid = process.child.id();
            tokio::spawn(log_stderr(name.clone(), pid, stderr));
            let transport = Tracked {
                inner: process,
                calls: shared.calls.clone(),
                events: shared.events.clone(),
                generation,
                not_sent: stdio_not_sent,
                oversized: Some(oversized),
            };
            let running = tokio::time::timeout(
                timeout,
                handler.serve_with_lifecycle(transport, lifecycle()),
            )
            .await
            .map_err(|_| connect_failed(format!("no handshake within {} ms", timeout.as_millis())))?
            .map_err(|e| connect_failed(error_chain(&e)))?;
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
                oversized: None,
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
    });
    Ok((live, running))
}

/// Logs a stdio server's stderr line by line, so it never mixes with the
/// protocol on stdout.
async fn log_stderr(server: String, pid: Option<u32>, stderr: tokio::process::ChildStderr) {
    let mut reader = BufReader::new(stderr);
    let mut line = Vec::new();
    loop {
        line.clear();
        match (&mut reader)
            .take(MAX_STDERR_LINE)
            .read_until(b'\n', &mut line)
            .await
        {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                let text = String::from_utf8_lossy(&line);
                tracing::info!(target: "belay_worker::mcp::stderr", server, pid, "{}", text.trim_end());
            }
        }
    }
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
        let reason = match quit {
            Ok(reason) => format!("connection ended ({reason:?})"),
            Err(e) => format!("connection task failed: {e}"),
        };
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
                ConnState::Up(live) if !live.peer.is_transport_closed() => {
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
            () = tokio::time::sleep(timeout) => CallOutcome::Timeout {
                timeout_ms: request.timeout_ms,
                sent: handed(&self.calls.state(marker)),
            },
            () = cancel.cancelled() => CallOutcome::Cancelled {
                sent: handed(&self.calls.state(marker)),
                reason: Some("cancelled by the caller".into()),
            },
        }
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
            let state = self.calls.state(marker);
            // (HTTP: only once the connection is known to be lost, so the
            // next one is a new session, checked against its own listing.)
            let retry = state == SendState::Queued
                || (!handed(&state) && (self.is_stdio() || live.lost.is_cancelled()));
            if let CallOutcome::Disconnected { .. } = &outcome
                && retry
                && tokio::time::Instant::now() < deadline
            {
                self.wait_past(&live, deadline).await;
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
        let (needs_input, too_large, unattributed, sampling_refused, model_failed) =
            lock(&self.calls.slots)
                .get_mut(&marker)
                .map(|s| {
                    (
                        s.needs_input.take(),
                        s.too_large,
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
            Err(e) => classify(e, &self.calls.state(marker)),
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

/// One granted completion: the request checked and capped, a completion
/// of the grant taken, the model called once, its tokens recorded. The
/// error is a JSON-RPC code and a message for the server.
#[allow(deprecated)]
async fn sample(
    session: &super::SamplingSession,
    params: CreateMessageRequestParams,
) -> Result<CreateMessageResult, (i32, String)> {
    let (mut request, prompt_bytes) =
        sampling_request(session.grant(), params).map_err(|m| (SAMPLING_INVALID, m))?;
    let completion = session
        .reserve(request.max_tokens, prompt_bytes)
        .map_err(|m| (SAMPLING_REFUSED, m))?;
    request.max_tokens = completion.max_tokens();
    let answer = session.sampler().complete(request).await.map_err(|m| {
        (
            SAMPLING_FAILED,
            format!("sampling/createMessage failed: {m}"),
        )
    })?;
    completion.record(answer.input_tokens, answer.output_tokens);
    let mut result =
        CreateMessageResult::new(SamplingMessage::assistant_text(answer.text), answer.model);
    if let Some(reason) = answer.stop_reason {
        result = result.with_stop_reason(reason);
    }
    Ok(result)
}

/// A server's `sampling/createMessage` as a [`super::SamplingRequest`]:
/// text messages only (an image, audio, a tool use or result is refused),
/// no tools (Belay declares no `sampling.tools`), `maxTokens` capped by the
/// grant's `max_tokens` (the session caps it further to what is left of
/// the grant); `includeContext`, `temperature`, `stopSequences`,
/// `metadata` and `modelPreferences` are not used (the grant's model
/// answers). Also returns the prompt's size in bytes (system prompt and
/// messages' text).
#[allow(deprecated)]
fn sampling_request(
    grant: &super::SamplingGrant,
    params: CreateMessageRequestParams,
) -> Result<(super::SamplingRequest, usize), String> {
    if params.tools.as_ref().is_some_and(|t| !t.is_empty()) {
        return Err(
            "sampling/createMessage with `tools` is not offered: Belay declares no `sampling.tools` capability"
                .into(),
        );
    }
    if params.messages.is_empty() {
        return Err("sampling/createMessage has no messages".into());
    }
    if params.max_tokens == 0 {
        return Err("sampling/createMessage: `maxTokens` must be at least 1".into());
    }
    let mut bytes = params.system_prompt.as_ref().map_or(0, String::len);
    let mut messages = Vec::with_capacity(params.messages.len());
    for (i, message) in params.messages.into_iter().enumerate() {
        let mut texts = Vec::new();
        for block in message.content.into_vec() {
            let kind = match block {
                SamplingMessageContentBlock::Text(text) => {
                    texts.push(text.text);
                    continue;
                }
                SamplingMessageContentBlock::Image(_) => "an image",
                SamplingMessageContentBlock::Audio(_) => "audio",
                SamplingMessageContentBlock::ToolUse(_) => "a tool use",
                SamplingMessageContentBlock::ToolResult(_) => "a tool result",
                _ => "content of an unknown type",
            };
            return Err(format!(
                "sampling/createMessage: message {i} holds {kind}; Belay's sampling takes text only"
            ));
        }
        let text = texts.join("\n\n");
        bytes = bytes.saturating_add(text.len());
        messages.push(super::SamplingText {
            assistant: message.role == Role::Assistant,
            text,
        });
    }
    if bytes > MAX_SAMPLING_PROMPT_BYTES {
        return Err(format!(
            "sampling/createMessage: the prompt is {bytes} bytes, more than Belay sends to a model ({MAX_SAMPLING_PROMPT_BYTES})"
        ));
    }
    Ok((
        super::SamplingRequest {
            model: grant.model.clone(),
            system_prompt: params.system_prompt,
            messages,
            max_tokens: params.max_tokens.min(grant.max_tokens),
        },
        bytes,
    ))
}

fn handed(state: &SendState) -> bool {
    !matches!(
        state,
        SendState::Queued | SendState::WriteFailed { not_sent: true }
    )
}

/// Maps an rmcp error to an outcome, using what the transport saw.
fn classify(error: ServiceError, state: &SendState) -> CallOutcome {
    let reason = error_chain(&error);
    let lost = |reason: String| {
        if handed(state) {
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
        ServiceError::Cancelled { reason } => CallOutcome::Cancelled {
            sent: handed(state),
            reason,
        },
        ServiceError::Timeout { timeout } => CallOutcome::Timeout {
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            sent: handed(state),
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
                Err(e) => classify(e, &SendState::Written),
            }
        };
        match tokio::time::timeout(timeout, reading).await {
            Ok(outcome) => outcome,
            Err(_) => CallOutcome::Timeout {
                timeout_ms: request.timeout_ms,
                sent: true,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A server's `sampling/createMessage` params, as it sends them.
    #[allow(deprecated)]
    fn asked(params: Value) -> CreateMessageRequestParams {
        serde_json::from_value(params).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_sampling_request_becomes_text_capped_by_the_grant_or_a_reason() {
        let grant = crate::mcp::SamplingGrant {
            model: "m".into(),
            max_requests: 1,
            max_tokens: 40,
            max_total_tokens: None,
            max_input_tokens: None,
        };
        let text = |t: &str| serde_json::json!({"type": "text", "text": t});
        let request = sampling_request(
            &grant,
            asked(serde_json::json!({
                "messages": [
                    {"role": "user", "content": [text("a"), text("b")]},
                    {"role": "assistant", "content": text("c")},
                ],
                "systemPrompt": "s",
                "maxTokens": 100,
                "temperature": 0.5,
                "includeContext": "thisServer",
            })),
        );
        // The prompt's bytes: "s", "a\n\nb" and "c".
        assert_eq!(
            request,
            Ok((
                crate::mcp::SamplingRequest {
                    model: "m".into(),
                    system_prompt: Some("s".into()),
                    messages: vec![
                        crate::mcp::SamplingText {
                            assistant: false,
                            text: "a\n\nb".into(),
                        },
                        crate::mcp::SamplingText {
                            assistant: true,
                            text: "c".into(),
                        },
                    ],
                    max_tokens: 40,
                },
                6
            ))
        );
        // Below the grant, the server's own bound stands.
        let small = sampling_request(
            &grant,
            asked(
                serde_json::json!({"messages": [{"role": "user", "content": text("a")}], "maxTokens": 7}),
            ),
        );
        assert_eq!(small.map(|(r, _)| r.max_tokens), Ok(7));

        let refused = |params: Value| match sampling_request(&grant, asked(params)) {
            Err(reason) => reason,
            Ok(request) => panic!("not refused: {request:?}"),
        };
        let image = serde_json::json!({"type": "image", "data": "AAAA", "mimeType": "image/png"});
        assert_eq!(
            refused(serde_json::json!({"messages": [
                {"role": "user", "content": text("look")},
                {"role": "user", "content": [text("at"), image]},
            ], "maxTokens": 5})),
            "sampling/createMessage: message 1 holds an image; Belay's sampling takes text only"
        );
        let audio = serde_json::json!({"type": "audio", "data": "AAAA", "mimeType": "audio/wav"});
        assert!(
            refused(serde_json::json!({"messages": [{"role": "user", "content": audio}], "maxTokens": 5}))
                .contains("message 0 holds audio")
        );
        assert!(
            refused(serde_json::json!({
                "messages": [{"role": "user", "content": text("x")}],
                "maxTokens": 5,
                "tools": [{"name": "t", "inputSchema": {"type": "object"}}],
            }))
            .contains("`tools` is not offered")
        );
        assert!(
            refused(serde_json::json!({"messages": [], "maxTokens": 5})).contains("no messages")
        );
        assert!(
            refused(serde_json::json!({"messages": [{"role": "user", "content": text("x")}], "maxTokens": 0}))
                .contains("at least 1")
        );
        let huge = "x".repeat(MAX_SAMPLING_PROMPT_BYTES + 1);
        assert!(
            refused(serde_json::json!({"messages": [{"role": "user", "content": text(&huge)}], "maxTokens": 5}))
                .contains("more than Belay sends to a model")
        );
    }

    #[test]
    fn the_id_of_an_oversized_line_is_read_from_its_start() {
        let id = |head: &str| id_in_head(head.as_bytes());
        assert_eq!(
            id(r#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"text":"xx"#),
            Some(RequestId::Number(7))
        );
        assert_eq!(
            id(r#"{"id" : "a-1", "jsonrpc":"2.0","result":{"#),
            Some(RequestId::String("a-1".into()))
        );
        // Only the top-level `id` counts; a cut-off head has none.
        assert_eq!(
            id(r#"{"jsonrpc":"2.0","result":{"id":3,"content":[{"text":"xx"#),
            None
        );
        assert_eq!(id(r#"{"jsonrpc":"2.0","result":{"text":"\"id\":4"#), None);
        assert_eq!(id(r#"{"jsonrpc":"2.0","id":12"#), None);
    }

    #[tokio::test]
    async fn a_line_past_the_limit_is_reported_once_with_its_id() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut watch = LineWatch::new(&b""[..], tx);
        watch.saw(br#"{"jsonrpc":"2.0","id":5,"result":"#);
        watch.saw(&vec![b'x'; MAX_STDIO_MESSAGE_BYTES]);
        watch.saw(b"more\n{\"jsonrpc\":\"2.0\",\"id\":6}\n");
        assert_eq!(rx.try_recv().ok(), Some(Some(RequestId::Number(5))));
        assert!(rx.try_recv().is_err());
    }
}
