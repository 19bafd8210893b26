//! `tool_call` tasks whose binding is [`ToolBinding::Mcp`](belay_proto::wire::ToolBinding::Mcp):
//! the worker's side of MCP tools.
//!
//! [`McpTools`] holds one [`McpClient`] per configured server. At start it
//! connects every server (a server that cannot be reached is retried in the
//! background with backoff; its calls fail `NOT_SENT` meanwhile), lists its
//! tools and reports them to the engine (`ReportMcpTools`); it lists and
//! reports again after every `tools/list_changed` notification and every
//! reconnection (the client's [`McpClient::tools_changed`] counter).
//!
//! A call ([`McpTools::call`]), in order:
//!
//! 1. Before dispatch (nothing acts yet; a failure here is reported with the
//!    call undispatched): the server is configured and connected (else
//!    `NOT_SENT`: another worker may serve it), the arguments are an object,
//!    the server lists the tool (re-listed first when the listing is stale)
//!    with a definition Belay can call, and the arguments match the listed
//!    input schema.
//! 2. `DispatchToolCall` with the definition hash listed now; the engine
//!    answers with the hash pinned for the run's tenant (pinning this one on
//!    the tenant's first call). A refused dispatch: nothing is done or
//!    reported.
//! 3. [`McpClient::call_tool`] with `expected_hash` = the pin and the call's
//!    idempotency key: a definition that changed is refused before anything
//!    is sent, and reported (`REJECTED`, naming both hashes) after the new
//!    listing was reported, so an operator can review and accept it.
//! 4. The outcome becomes a result (`structuredContent` when the tool gave
//!    one, else the `content` blocks) or a failure with its class
//!    ([`CallOutcome::failure_class`]): `isError` is a tool failure the model
//!    sees; a lost answer after sending is `MAY_HAVE_ACTED` (the tool's
//!    repeat safety decides: fail, retry with the same key, or an uncertain
//!    outcome).
//!
//! A tool that asks for user input mid-call ([`CallOutcome::NeedsInput`]) is
//! reported with `RequestToolInput`: the engine waits durably for a person
//! (`RunService.ProvideToolInput`), then schedules the call again with the
//! answers in `ToolCallSpec.input`, which this module hands to the client as
//! its [`crate::mcp::InputAnswers`] (the repeated call meets the same
//! questions and answers them from there). Whether repeating the call is
//! safe is the engine's decision (the tool's repeat safety).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use belay_proto::v1::{FailureClass, McpToolListing, Task};
use belay_proto::wire::{McpBinding, McpResourceBinding, ToolCallSpec};
use serde_json::Value;
use tokio::task::AbortHandle;

use crate::engine_client::EngineClient;
use crate::mcp::{
    self, CallOutcome, CallRefusal, CallRequest, DEFAULT_MAX_RESULT_BYTES, DefaultRepeatSafety,
    Discovery, McpClient, McpConfig, ResolvedServer, ToolResult,
};

/// How long the worker's start waits for each server's first connection,
/// ms (all servers at once). A server slower than that (or one that never
/// completes the handshake) goes on connecting in the background, so one
/// bad server does not hold back the worker's other work.
const START_WAIT_MS: u64 = 10_000;

/// Most tools one report lists (the engine's limit).
const MAX_REPORTED_TOOLS: usize = 1000;
/// Largest definition sent in a report, bytes; a larger one is sent as a
/// stub naming its size (the engine's limit is the same).
const MAX_REPORTED_DEFINITION_BYTES: usize = 256 * 1024;
/// Most bytes of definitions in one report; past it, definitions are stubs
/// (a gRPC message is at most a few MiB).
const MAX_REPORT_BYTES: usize = 3 * 1024 * 1024;
/// Most bytes of server text (an `isError` result, an error message) put
/// into a failure's error.
const MAX_ERROR_TEXT_BYTES: usize = 8 * 1024;
/// How long [`McpTools::start`] waits for a server's first listing to be
/// reported before it goes on (the report then continues in the background).
const FIRST_REPORT_WAIT: Duration = Duration::from_secs(10);

/// What a call ends with, for the runner to report.
#[derive(Debug, Clone, PartialEq)]
pub enum McpCallReport {
    /// `CompleteTask` with this result JSON.
    Complete(String),
    /// `FailTask` with this class and error.
    Fail {
        /// Whether the tool may have acted.
        class: FailureClass,
        /// What happened, for the model (server text included is data).
        error: String,
        /// Which of the three kinds of MCP failure it is (the tool's own
        /// answer, the protocol's, the transport's); `None` for a call
        /// refused before it was sent.
        kind: Option<mcp::ToolFailureKind>,
    },
    /// `RequestToolInput`: the tool asked a person for input mid-call.
    NeedsInput(mcp::InputNeeded),
    /// The engine refused the dispatch: nothing was done; report nothing.
    NotDispatched,
}

fn fail(class: FailureClass, error: impl Into<String>) -> McpCallReport {
    McpCallReport::Fail {
        class,
        error: error.into(),
        kind: None,
    }
}

/// What the dispatch of an MCP call allowed, for `on_dispatched`
/// ([`McpTools::call`], [`McpTools::read`]).
#[derive(Debug)]
pub struct Dispatched<'a> {
    /// The vault values the call may read (`SECRET_ACCESS`).
    pub secrets: &'a crate::placeholders::SecretValues,
    /// The hash of the tool definition the call is checked against (the
    /// tenant's pin); `None` for a resource read.
    pub definition_hash: Option<&'a str>,
}

/// One server's state.
#[derive(Default)]
struct Slot {
    client: Option<Arc<dyn McpClient>>,
    /// Why the server is not connected (the last connection error).
    last_error: Option<String>,
    /// The newest listing.
    discovery: Option<Discovery>,
}

/// What a server lists for one tool now.
enum Listed {
    /// Callable, with this definition hash and input schema.
    Callable(String, Value),
    /// Listed but refused (its schema cannot be represented).
    Refused(String),
    /// Not listed; the names it does list.
    Missing(Vec<String>),
}

/// The worker's MCP servers (see the module docs). Share it with `Arc`.
pub struct McpTools {
    engine: EngineClient,
    slots: Mutex<BTreeMap<String, Slot>>,
    tasks: Mutex<Vec<AbortHandle>>,
    /// Servers whose first listing was reported (or failed).
    first_report: tokio::sync::watch::Sender<std::collections::BTreeSet<String>>,
}

impl std::fmt::Debug for McpTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpTools")
            .field("servers", &self.slots().keys().collect::<Vec<_>>())
            .finish()
    }
}

impl McpTools {
    /// Checks `config`, then connects every server at once (each waits at
    /// most its connect timeout). A server that does not come up is retried
    /// in the background with backoff. Every connected server's tools are
    /// listed and reported to `engine` before this returns (waiting at most
    /// 10 s for the engine; the report then goes on in the background), so
    /// the engine knows the definitions before the worker's first call.
    /// OAuth discovery of servers with `oauth` reaches what
    /// `network_policy` allows (the worker's tool policy).
    ///
    /// # Errors
    /// The first configuration error ([`mcp::ConfigError`]); nothing is
    /// started then.
    pub async fn start(
        config: &McpConfig,
        network_policy: &crate::ssrf::NetworkPolicy,
        engine: EngineClient,
    ) -> Result<Arc<Self>, mcp::ConfigError> {
        config.validate()?;
        let mut resolved = Vec::new();
        for name in config.servers.keys() {
            resolved.push(
                config
                    .resolve(name)?
                    .with_network_policy(network_policy.clone()),
            );
        }
        let tools = Arc::new(Self {
            engine,
            slots: Mutex::new(
                resolved
                    .iter()
                    .map(|s| (s.name.clone(), Slot::default()))
                    .collect(),
            ),
            tasks: Mutex::new(Vec::new()),
            first_report: tokio::sync::watch::Sender::new(std::collections::BTreeSet::new()),
        });
        let attempts = resolved.into_iter().map(|server| {
            let tools = Arc::clone(&tools);
            async move {
                let name = server.name.clone();
                let first = tokio::time::timeout(
                    Duration::from_millis(START_WAIT_MS),
                    mcp::connect(server.clone()),
                )
                .await
                .unwrap_or_else(|_| {
                    Err(mcp::McpError::Connect {
                        server: name.clone(),
                        message: format!(
                            "not connected within {START_WAIT_MS} ms of the worker's start"
                        ),
                    })
                });
                match first {
                    Ok(client) => tools.connected(&name, client).await,
                    Err(e) => {
                        tracing::error!(
                            server = %name, error = %e,
                            "MCP server not reachable at start; retrying in the background (its calls fail NOT_SENT meanwhile)"
                        );
                        tools.slot(&name, |slot| slot.last_error = Some(e.to_string()));
                        let retry = tokio::spawn(Arc::clone(&tools).connect_later(server));
                        tools.track(retry.abort_handle());
                    }
                }
            }
        });
        futures_util::future::join_all(attempts).await;
        Ok(tools)
    }

    /// Stops the background tasks and every connection (stdio servers are
    /// stopped). Idempotent.
    pub async fn shutdown(&self) {
        for task in std::mem::take(&mut *self.tasks()) {
            task.abort();
        }
        let clients: Vec<Arc<dyn McpClient>> = self
            .slots()
            .values_mut()
            .filter_map(|s| s.client.take())
            .collect();
        for client in clients {
            client.shutdown().await;
        }
    }

    fn slots(&self) -> MutexGuard<'_, BTreeMap<String, Slot>> {
        // Every critical section is a single read or write of a slot.
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn tasks(&self) -> MutexGuard<'_, Vec<AbortHandle>> {
        self.tasks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn track(&self, task: AbortHandle) {
        self.tasks().push(task);
    }

    fn slot<T>(&self, server: &str, f: impl FnOnce(&mut Slot) -> T) -> Option<T> {
        self.slots().get_mut(server).map(f)
    }

    /// Records a connected client, lists and reports its tools (waiting at
    /// most [`FIRST_REPORT_WAIT`]), then watches its tool list.
    async fn connected(self: &Arc<Self>, server: &str, client: Arc<dyn McpClient>) {
        tracing::info!(server, status = ?client.status(), "MCP server connected");
        self.slot(server, |slot| {
            slot.client = Some(Arc::clone(&client));
            slot.last_error = None;
        });
        // Subscribed before the first listing, so no change is missed.
        let changed = client.tools_changed();
        let watch = tokio::spawn(Arc::clone(self).watch(server.to_owned(), client, changed));
        self.track(watch.abort_handle());
        let mut first = self.first_report.subscribe();
        let _ = tokio::time::timeout(
            FIRST_REPORT_WAIT,
            first.wait_for(|done| done.contains(server)),
        )
        .await;
    }

    /// Connects a server that was down at start, with backoff between the
    /// server's restart delays.
    async fn connect_later(self: Arc<Self>, server: ResolvedServer) {
        let min = server.common.restart_min_delay_ms.max(1);
        let max = server.common.restart_max_delay_ms.max(min);
        let mut delay = min;
        loop {
            tokio::time::sleep(Duration::from_millis(delay)).await;
            match mcp::connect(server.clone()).await {
                Ok(client) => {
                    self.connected(&server.name, client).await;
                    return;
                }
                Err(e) => {
                    tracing::debug!(server = %server.name, error = %e, "MCP server still not reachable");
                    self.slot(&server.name, |slot| slot.last_error = Some(e.to_string()));
                    delay = delay.saturating_mul(2).min(max);
                }
            }
        }
    }

    /// Lists and reports the server's tools now and after every change.
    async fn watch(
        self: Arc<Self>,
        server: String,
        client: Arc<dyn McpClient>,
        mut changed: tokio::sync::watch::Receiver<u64>,
    ) {
        loop {
            changed.borrow_and_update();
            if let Err(e) = self.refresh(&server, client.as_ref()).await {
                tracing::warn!(server, error = %e, "cannot list the MCP server's tools; trying again at its next change");
            }
            self.first_report
                .send_if_modified(|done| done.insert(server.clone()));
            if changed.changed().await.is_err() {
                return;
            }
        }
    }

    /// Lists the server's tools, keeps the listing and reports it.
    async fn refresh(
        &self,
        server: &str,
        client: &dyn McpClient,
    ) -> Result<Discovery, mcp::McpError> {
        let discovery = client.list_tools().await?;
        self.slot(server, |slot| slot.discovery = Some(discovery.clone()));
        self.report(&discovery, client.trusted()).await;
        Ok(discovery)
    }

    /// Sends `discovery` to the engine; a failure is logged (the next
    /// listing is reported again).
    async fn report(&self, discovery: &Discovery, trusted: bool) {
        let tools = listings(discovery, trusted);
        let count = tools.len();
        match self
            .engine
            .report_mcp_tools(&discovery.server, &discovery.protocol_version, tools)
            .await
        {
            Ok(new) => tracing::info!(
                server = %discovery.server, tools = count, new,
                "MCP tools reported to the engine"
            ),
            Err(status) => tracing::warn!(
                server = %discovery.server, code = ?status.code(), error = status.message(),
                "cannot report the MCP server's tools to the engine"
            ),
        }
    }

    /// What `server` lists for `tool` now: from the kept listing while it is
    /// fresh, else listed (and reported) again.
    async fn listed(
        &self,
        server: &str,
        client: &dyn McpClient,
        tool: &str,
    ) -> Result<Listed, mcp::McpError> {
        let current = *client.tools_changed().borrow();
        let kept = self
            .slot(server, |slot| slot.discovery.clone())
            .flatten()
            .filter(|d| d.change_seq >= current);
        let discovery = match kept {
            Some(d) => d,
            None => self.refresh(server, client).await?,
        };
        if let Some(t) = discovery.tools.iter().find(|t| t.name == tool) {
            return Ok(Listed::Callable(
                t.definition_hash.clone(),
                t.input_schema.clone(),
            ));
        }
        if let Some(r) = discovery.refused.iter().find(|r| r.name == tool) {
            return Ok(Listed::Refused(r.reason.to_string()));
        }
        Ok(Listed::Missing(
            discovery.tools.iter().map(|t| t.name.clone()).collect(),
        ))
    }

    /// Performs one `type: mcp` call (see the module docs) and says what to
    /// report. `on_dispatched` runs once the engine allowed the call to act,
    /// with the vault values the dispatch handed out (for the call's
    /// `{{_secret.KEY}}` headers; the caller keeps them out of what it
    /// reports) and the pinned definition hash the call is checked
    /// against (reported with the outcome, recorded in its events).
    ///
    /// `sampling`: the call's grant (`spec.sampling`) with the sampler that
    /// makes its completions; read its usage after the call.
    pub async fn call(
        &self,
        task: &Task,
        spec: &ToolCallSpec,
        binding: &McpBinding,
        sampling: Option<Arc<mcp::SamplingSession>>,
        on_dispatched: impl FnOnce(&Dispatched<'_>),
    ) -> McpCallReport {
        let server = binding.server.as_str();
        let tool = binding.server_tool.as_str();
        let (client, last_error) =
            match self.slot(server, |s| (s.client.clone(), s.last_error.clone())) {
                // Another worker (with another --mcp-config) may serve it.
                None => {
                    return fail(
                        FailureClass::NotSent,
                        format!(
                            "MCP server `{server}` is not configured on worker `{}` (--mcp-config)",
                            self.engine.worker_id()
                        ),
                    );
                }
                Some(found) => found,
            };
        let Some(client) = client else {
            return fail(
                FailureClass::NotSent,
                format!(
                    "MCP server `{server}` is not connected: {}",
                    last_error.as_deref().unwrap_or("connecting")
                ),
            );
        };
        let Value::Object(arguments) = &spec.arguments else {
            return fail(
                FailureClass::Rejected,
                format!("the arguments of `{}` are not a JSON object", spec.tool),
            );
        };
        // A repeat after a person answered the tool's question.
        let input = match spec
            .input
            .clone()
            .map(serde_json::from_value::<mcp::InputAnswers>)
        {
            None => None,
            Some(Ok(answers)) => Some(answers),
            Some(Err(e)) => {
                return fail(
                    FailureClass::Rejected,
                    format!(
                        "the engine's answers for `{}` cannot be read: {e}",
                        spec.tool
                    ),
                );
            }
        };
        let listed_hash = match self.listed(server, client.as_ref(), tool).await {
            Ok(Listed::Callable(hash, input_schema)) => {
                // Checked here too (the client checks again before sending),
                // so that a refusal is reported undispatched, with no pin.
                let checked = mcp::schema::compile(&input_schema).and_then(|validator| {
                    mcp::schema::validate(&validator, &Value::Object(arguments.clone()))
                });
                if let Err(errors) = checked {
                    return fail(
                        FailureClass::Rejected,
                        format!(
                            "MCP tool `{tool}` of server `{server}` was not called: \
                             the arguments do not match its input schema: {}",
                            cut(&errors, MAX_ERROR_TEXT_BYTES)
                        ),
                    );
                }
                hash
            }
            Ok(Listed::Refused(reason)) => {
                return fail(
                    FailureClass::Rejected,
                    format!("MCP tool `{tool}` of server `{server}` cannot be called: {reason}"),
                );
            }
            Ok(Listed::Missing(names)) => {
                return fail(
                    FailureClass::Rejected,
                    format!(
                        "MCP server `{server}` lists no tool `{tool}` (it lists: {})",
                        cut(&names.join(", "), MAX_ERROR_TEXT_BYTES)
                    ),
                );
            }
            Err(e) => {
                return fail(
                    FailureClass::NotSent,
                    format!("cannot list the tools of MCP server `{server}`: {e}"),
                );
            }
        };
        let (pinned, secrets) = match self
            .engine
            .dispatch_mcp(&task.task_id, task.attempt, &listed_hash)
            .await
        {
            Ok(d) => (d.mcp_pinned_hash, d.secrets),
            Err(status) => {
                crate::engine_client::log_dispatch_refused(task, &status);
                return McpCallReport::NotDispatched;
            }
        };
        on_dispatched(&Dispatched {
            secrets: &secrets,
            definition_hash: Some(&pinned).filter(|p| !p.is_empty()).map(String::as_str),
        });
        if pinned.is_empty() {
            return fail(
                FailureClass::Rejected,
                format!(
                    "the engine pinned no definition of MCP tool `{tool}` of server `{server}`; not calling it"
                ),
            );
        }
        tracing::info!(
            task_id = %task.task_id, attempt = task.attempt, server, tool,
            "MCP tool call dispatched"
        );
        let request = CallRequest {
            tool: tool.to_owned(),
            arguments: arguments.clone(),
            expected_hash: Some(pinned),
            headers: binding.headers.clone(),
            secrets,
            timeout_ms: binding.timeout_ms.max(1),
            max_result_bytes: DEFAULT_MAX_RESULT_BYTES,
            idempotency_key: Some(spec.idempotency_key.clone()),
            input,
            cancel: None,
            sampling,
            trace: crate::telemetry::outbound(&tracing::Span::current(), spec.trace.as_ref()),
        };
        let outcome = client.call_tool(request).await;
        if let CallOutcome::Refused(CallRefusal::DefinitionChanged { .. }) = &outcome {
            // Let the engine know what the server lists now before the
            // failure is recorded, so an operator can review it at once.
            if let Err(e) = self.refresh(server, client.as_ref()).await {
                tracing::warn!(server, error = %e, "cannot list the MCP server's tools after a definition change");
            }
        }
        report_of(server, tool, &task.tenant, outcome)
    }
}

impl McpTools {
    /// Reads the resource of a `type: mcp` tool with `resource:` (the URI
    /// template filled from the arguments) and says what to report: its
    /// `{"contents": […]}` (MCP's `resources/read` result), or a failure. No
    /// definition is pinned (a resource has no tool definition); the read
    /// is dispatched like any call before it is sent, and `on_dispatched`
    /// runs then.
    pub async fn read(
        &self,
        task: &Task,
        spec: &ToolCallSpec,
        binding: &McpResourceBinding,
        on_dispatched: impl FnOnce(&Dispatched<'_>),
    ) -> McpCallReport {
        let server = binding.server.as_str();
        let client = match self.slot(server, |s| (s.client.clone(), s.last_error.clone())) {
            None => {
                return fail(
                    FailureClass::NotSent,
                    format!(
                        "MCP server `{server}` is not configured on worker `{}` (--mcp-config)",
                        self.engine.worker_id()
                    ),
                );
            }
            Some((None, last_error)) => {
                return fail(
                    FailureClass::NotSent,
                    format!(
                        "MCP server `{server}` is not connected: {}",
                        last_error.as_deref().unwrap_or("connecting")
                    ),
                );
            }
            Some((Some(client), _)) => client,
        };
        let Value::Object(arguments) = &spec.arguments else {
            return fail(
                FailureClass::Rejected,
                format!("the arguments of `{}` are not a JSON object", spec.tool),
            );
        };
        let uri = match mcp::expand_uri_template(&binding.uri_template, arguments) {
            Ok(uri) => uri,
            Err(e) => {
                return fail(
                    FailureClass::Rejected,
                    format!(
                        "tool `{}`: resource URI `{}`: {e}",
                        spec.tool, binding.uri_template
                    ),
                );
            }
        };
        let secrets = match self.engine.dispatch(&task.task_id, task.attempt).await {
            Ok(d) => d.secrets,
            Err(status) => {
                crate::engine_client::log_dispatch_refused(task, &status);
                return McpCallReport::NotDispatched;
            }
        };
        on_dispatched(&Dispatched {
            secrets: &secrets,
            definition_hash: None,
        });
        tracing::info!(
            task_id = %task.task_id, attempt = task.attempt, server, %uri,
            "MCP resource read dispatched"
        );
        let outcome = client
            .read_resource(mcp::ReadRequest {
                uri: uri.clone(),
                timeout_ms: binding.timeout_ms.max(1),
                max_result_bytes: DEFAULT_MAX_RESULT_BYTES,
            })
            .await;
        let named = format!("MCP resource `{uri}` of server `{server}`");
        match outcome {
            CallOutcome::Ok(result) => {
                let mut value = serde_json::json!({ "contents": result.content });
                if let Some(t) = result.truncation
                    && let Ok(t) = serde_json::to_value(t)
                {
                    value["truncation"] = t;
                }
                McpCallReport::Complete(value.to_string())
            }
            CallOutcome::Rejected { code, message, .. } => fail(
                FailureClass::Rejected,
                format!(
                    "{named} could not be read (JSON-RPC error {code}): {}",
                    cut(&message, MAX_ERROR_TEXT_BYTES)
                ),
            ),
            CallOutcome::Disconnected { reason } => fail(
                FailureClass::NotSent,
                format!("{named} was not read: not connected ({reason})"),
            ),
            other => {
                let class = other.failure_class().unwrap_or(FailureClass::MayHaveActed);
                let what = match &other {
                    CallOutcome::Timeout { timeout_ms, .. } => {
                        format!("no answer within {timeout_ms} ms")
                    }
                    CallOutcome::LostAfterSend { reason } => {
                        format!("the answer was lost ({reason})")
                    }
                    CallOutcome::Malformed { reason } => cut(reason, MAX_ERROR_TEXT_BYTES),
                    other => format!("{other:?}"),
                };
                fail(class, format!("{named} could not be read: {what}"))
            }
        }
    }
}

/// The failure or result an outcome is reported as.
fn report_of(server: &str, tool: &str, tenant: &str, outcome: CallOutcome) -> McpCallReport {
    let kind = mcp::failure_kind(&outcome);
    match failure_of(server, tool, tenant, outcome) {
        McpCallReport::Fail { class, error, .. } => McpCallReport::Fail { class, error, kind },
        other => other,
    }
}

/// [`report_of`] without the kind.
fn failure_of(server: &str, tool: &str, tenant: &str, outcome: CallOutcome) -> McpCallReport {
    let class = outcome.failure_class();
    let named = format!("MCP tool `{tool}` of server `{server}`");
    match outcome {
        CallOutcome::Ok(result) => {
            let value = result
                .structured_content
                .unwrap_or(Value::Array(result.content));
            McpCallReport::Complete(value.to_string())
        }
        CallOutcome::ToolError(result) => fail(
            FailureClass::Rejected,
            format!("{named} reported an error: {}", text_of(&result)),
        ),
        CallOutcome::NeedsInput(needed) => McpCallReport::NeedsInput(needed),
        CallOutcome::Refused(CallRefusal::DefinitionChanged {
            expected, actual, ..
        }) => fail(
            FailureClass::Rejected,
            format!(
                "{named} changed: the accepted definition is {expected}, the server lists {}; \
                 refused until an operator accepts the new definition \
                 (POST /admin/v1/tenants/{tenant}/mcp-tools/{server}/{tool}/accept)",
                actual.as_deref().unwrap_or("no such tool")
            ),
        ),
        CallOutcome::Refused(refusal) => fail(
            class.unwrap_or(FailureClass::Rejected),
            format!("{named} was not called: {refusal}"),
        ),
        CallOutcome::Disconnected { reason } => fail(
            FailureClass::NotSent,
            format!("{named} was not called: not connected ({reason})"),
        ),
        CallOutcome::LostAfterSend { reason } => fail(
            FailureClass::MayHaveActed,
            format!(
                "{named}: the call was sent but its answer was lost ({reason}); it may have acted"
            ),
        ),
        CallOutcome::Rejected { code, message, .. } => fail(
            class.unwrap_or(FailureClass::MayHaveActed),
            if mcp::refused_before_running(code) {
                format!(
                    "{named} refused the call before running it (JSON-RPC error {code}): {}",
                    cut(&message, MAX_ERROR_TEXT_BYTES)
                )
            } else {
                format!(
                    "{named} answered with a JSON-RPC error {code}, a protocol error rather than the tool's own answer; \
                     it may have acted: {}",
                    cut(&message, MAX_ERROR_TEXT_BYTES)
                )
            },
        ),
        CallOutcome::Malformed { reason } => fail(
            FailureClass::MayHaveActed,
            format!(
                "{named} answered with something unusable: {}",
                cut(&reason, MAX_ERROR_TEXT_BYTES)
            ),
        ),
        CallOutcome::Undecodable { reason } => fail(
            FailureClass::Rejected,
            format!(
                "{named} answered, but its answer cannot be decoded ({}); \
                 not tried again: the same answer would come back",
                cut(&reason, MAX_ERROR_TEXT_BYTES)
            ),
        ),
        CallOutcome::AnswerTooLarge { limit_bytes } => fail(
            FailureClass::MayHaveActed,
            format!(
                "{named}: the call was sent but its answer is larger than {limit_bytes} bytes \
                 and could not be read; it has acted"
            ),
        ),
        CallOutcome::Cancelled { sent, reason } => fail(
            class.unwrap_or(FailureClass::MayHaveActed),
            format!(
                "{named}: the call was cancelled{} ({})",
                if sent { " after it was sent" } else { "" },
                reason.as_deref().unwrap_or("no reason given")
            ),
        ),
        CallOutcome::Timeout {
            timeout_ms,
            sent,
            detail,
        } => fail(
            class.unwrap_or(FailureClass::MayHaveActed),
            match (sent, detail) {
                (_, Some(detail)) => format!("{named}: no answer within {timeout_ms} ms: {detail}"),
                (true, None) => {
                    format!("{named}: no answer within {timeout_ms} ms after the call was sent")
                }
                (false, None) => format!("{named}: no answer within {timeout_ms} ms (not sent)"),
            },
        ),
        CallOutcome::SamplingRefused { detail, .. } => fail(
            FailureClass::Rejected,
            format!(
                "{named} asked for a model completion (MCP sampling) that Belay did not give{}",
                detail
                    .map(|d| format!("; the server then said: {}", cut(&d, MAX_ERROR_TEXT_BYTES)))
                    .unwrap_or_default()
            ),
        ),
    }
}

/// The text of a result's content blocks (other blocks as JSON), cut to
/// [`MAX_ERROR_TEXT_BYTES`].
fn text_of(result: &ToolResult) -> String {
    let parts: Vec<String> = result
        .content
        .iter()
        .map(|block| match block.get("text").and_then(Value::as_str) {
            Some(text) => text.to_owned(),
            None => block.to_string(),
        })
        .collect();
    let text = if parts.is_empty() {
        result
            .structured_content
            .as_ref()
            .map(Value::to_string)
            .unwrap_or_else(|| "(no content)".to_owned())
    } else {
        parts.join("\n")
    };
    cut(&text, MAX_ERROR_TEXT_BYTES)
}

/// `text` cut to at most `limit` bytes on a character boundary, marked.
fn cut(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_owned();
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &text[..end], text.len())
}

/// A listing as `ReportMcpTools` carries it, within the engine's limits.
fn listings(discovery: &Discovery, trusted: bool) -> Vec<McpToolListing> {
    let mut budget = MAX_REPORT_BYTES;
    let mut out = Vec::new();
    let mut stub = |name: &str, json: String| -> String {
        if json.len() <= MAX_REPORTED_DEFINITION_BYTES && json.len() <= budget {
            budget -= json.len();
            json
        } else {
            serde_json::json!({
                "name": name,
                "omitted": format!("the definition is {} bytes, too large to report", json.len()),
            })
            .to_string()
        }
    };
    for tool in &discovery.tools {
        let json = serde_json::to_string(tool).unwrap_or_default();
        let suggested = match mcp::default_repeat_safety(trusted, &tool.hints) {
            DefaultRepeatSafety::Never => "never",
            DefaultRepeatSafety::Idempotent => "idempotent",
        };
        out.push(McpToolListing {
            name: tool.name.clone(),
            definition_hash: tool.definition_hash.clone(),
            definition_json: stub(&tool.name, json),
            refusal: String::new(),
            suggested_repeat_safety: suggested.to_owned(),
        });
    }
    for refused in &discovery.refused {
        let json = serde_json::to_string(refused).unwrap_or_default();
        out.push(McpToolListing {
            name: refused.name.clone(),
            definition_hash: refused.definition_hash.clone(),
            definition_json: stub(&refused.name, json),
            refusal: refused.reason.to_string(),
            suggested_repeat_safety: "never".to_owned(),
        });
    }
    if out.len() > MAX_REPORTED_TOOLS {
        tracing::warn!(
            server = %discovery.server, tools = out.len(),
            "the MCP server lists more tools than a report carries; reporting the first {MAX_REPORTED_TOOLS}"
        );
        out.truncate(MAX_REPORTED_TOOLS);
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::mcp::{InputNeeded, InputVia, McpToolDefinition, ToolHints};
    use serde_json::json;

    fn report(outcome: CallOutcome) -> McpCallReport {
        report_of("srv", "t", "acme", outcome)
    }

    #[test]
    fn results_prefer_structured_content() {
        let ok = CallOutcome::Ok(ToolResult {
            content: vec![json!({"type": "text", "text": "3"})],
            structured_content: Some(json!({"result": 3})),
            truncation: None,
        });
        assert_eq!(
            report(ok),
            McpCallReport::Complete(r#"{"result":3}"#.into())
        );
        let text = CallOutcome::Ok(ToolResult {
            content: vec![json!({"type": "text", "text": "Echo: hi"})],
            ..ToolResult::default()
        });
        assert_eq!(
            report(text),
            McpCallReport::Complete(r#"[{"text":"Echo: hi","type":"text"}]"#.into())
        );
    }

    #[test]
    fn failures_carry_their_class_and_say_what_happened() {
        let McpCallReport::Fail { class, error, .. } = report(CallOutcome::ToolError(ToolResult {
            content: vec![json!({"type": "text", "text": "no such city"})],
            ..ToolResult::default()
        })) else {
            panic!()
        };
        assert_eq!(class, FailureClass::Rejected);
        assert!(error.contains("reported an error: no such city"), "{error}");

        let McpCallReport::Fail { class, error, .. } = report(CallOutcome::LostAfterSend {
            reason: "server exited".into(),
        }) else {
            panic!()
        };
        assert_eq!(class, FailureClass::MayHaveActed);
        assert!(error.contains("may have acted"), "{error}");

        let McpCallReport::Fail { class, error, .. } =
            report(CallOutcome::Refused(CallRefusal::DefinitionChanged {
                tool: "t".into(),
                expected: "sha256:aa".into(),
                actual: Some("sha256:bb".into()),
            }))
        else {
            panic!()
        };
        assert_eq!(class, FailureClass::Rejected);
        assert!(
            error.contains("sha256:aa")
                && error.contains("sha256:bb")
                && error.contains("/admin/v1/tenants/acme/mcp-tools/srv/t/accept"),
            "{error}"
        );

        // A `{{config.X}}` this worker lacks: nothing was sent, and another
        // worker may have it.
        assert!(matches!(
            report(CallOutcome::Refused(CallRefusal::MissingConfigValue {
                name: "X-Key".into(),
                reason: "`{{config.K}}` has no value".into(),
            })),
            McpCallReport::Fail {
                class: FailureClass::NotSent,
                ..
            }
        ));
        // A question for a person is handed to the engine as it came (the
        // engine decides, by repeat safety, whether to wait).
        let needed = InputNeeded {
            via: InputVia::Elicitation,
            requests: json!({"message": "name?"}),
            request_state: None,
            may_have_acted: true,
        };
        assert!(matches!(
            report(CallOutcome::NeedsInput(needed.clone())),
            McpCallReport::NeedsInput(ref n) if *n == needed
        ));
        assert!(matches!(
            report(CallOutcome::Disconnected { reason: "x".into() }),
            McpCallReport::Fail {
                class: FailureClass::NotSent,
                ..
            }
        ));
        assert!(matches!(
            report(CallOutcome::Timeout {
                timeout_ms: 5,
                sent: true,
                detail: None,
            }),
            McpCallReport::Fail {
                class: FailureClass::MayHaveActed,
                ..
            }
        ));
    }

    #[test]
    fn server_text_is_cut() {
        let long = "é".repeat(10_000);
        let cut_text = cut(&long, 101);
        assert!(cut_text.len() < 200, "{}", cut_text.len());
        assert!(cut_text.ends_with("(20000 bytes)"));
    }

    #[test]
    fn listings_suggest_idempotent_only_for_trusted_hints() {
        let tool = McpToolDefinition {
            name: "read".into(),
            title: None,
            description: Some("reads".into()),
            input_schema: json!({"type": "object"}),
            output_schema: None,
            hints: ToolHints {
                read_only: Some(true),
                ..ToolHints::default()
            },
            definition_hash: format!("sha256:{}", "0".repeat(64)),
        };
        let discovery = Discovery {
            server: "s".into(),
            protocol_version: "2025-11-25".into(),
            change_seq: 0,
            tools: vec![tool],
            refused: Vec::new(),
        };
        assert_eq!(
            listings(&discovery, false)[0].suggested_repeat_safety,
            "never"
        );
        let trusted = listings(&discovery, true);
        assert_eq!(trusted[0].suggested_repeat_safety, "idempotent");
        let def: Value = serde_json::from_str(&trusted[0].definition_json).unwrap();
        assert_eq!(def["description"], "reads");
    }
}
