//! Thin client of the engine's `WorkerService`.
//!
//! The channel connects lazily, so a worker starts before the engine and
//! reconnects by itself after an engine restart. The reporting calls
//! ([`EngineClient::dispatch`], [`EngineClient::dispatch_mcp`],
//! [`EngineClient::report_complete`], [`EngineClient::report_failure`],
//! [`EngineClient::report_mcp_tools`]) retry transient errors with exponential
//! backoff because losing them costs a lease expiry (and, after dispatch, an
//! uncertain outcome). A refusal that will not change on retry
//! (`FAILED_PRECONDITION`, `NOT_FOUND`, `PERMISSION_DENIED`,
//! `INVALID_ARGUMENT`, ...) is returned at once: the lease is gone, the task
//! was cancelled, or the request is wrong.
//!
//! Retrying `DispatchToolCall` is safe: the worker acts only after an OK, so a
//! lost OK followed by a refusal of the retry means the worker does not act,
//! and the engine treats the lease as lost after dispatch.
//!
//! `ClaimTasks` and `Heartbeat` are not retried here: the runner's loops call
//! them again anyway.

use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use belay_proto::v1::worker_service_client::WorkerServiceClient;
use belay_proto::v1::{
    ClaimTasksRequest, CompleteTaskRequest, DispatchToolCallRequest, DispatchToolCallResponse,
    FailTaskRequest, FailureClass, HeartbeatRequest, LeaseStatus, McpToolListing,
    ReportMcpToolsRequest, RequestToolInputRequest, SecretValue, Task, TaskLease,
    WorkerCapabilities,
};

use crate::placeholders::SecretValues;
use belay_proto::connect::{AuthChannel, ConnectError, ConnectOptions};
use tonic::{Code, Status};

/// Deadline of one unary call (dispatch, complete, fail), in ms; a
/// heartbeat's comes from the lease ([`EngineClient::heartbeat`]).
const CALL_TIMEOUT_MS: u64 = 10_000;
/// Extra deadline of `ClaimTasks` on top of its long-poll wait, in ms.
const CLAIM_EXTRA_TIMEOUT_MS: u64 = 10_000;
/// Largest engine response the client accepts, in bytes.
const MAX_DECODING_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
/// TCP connect timeout to the engine, in ms.
const CONNECT_TIMEOUT_MS: u64 = 5_000;

/// Backoff of the reporting calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// First delay, in ms.
    pub min_delay_ms: u64,
    /// Largest delay, in ms (delays double up to it, with jitter).
    pub max_delay_ms: u64,
    /// Stop retrying once the delays add up to this, in ms.
    pub total_delay_ms: u64,
}

impl Default for RetryPolicy {
    /// 100 ms doubling to 5 s, for up to 2 minutes: long enough to ride out an
    /// engine restart or failover.
    fn default() -> Self {
        Self {
            min_delay_ms: 100,
            max_delay_ms: 5_000,
            total_delay_ms: 120_000,
        }
    }
}

impl RetryPolicy {
    fn backoff(&self) -> ExponentialBuilder {
        ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(self.min_delay_ms))
            .with_max_delay(Duration::from_millis(self.max_delay_ms))
            .with_total_delay(Some(Duration::from_millis(self.total_delay_ms)))
            .without_max_times()
            .with_jitter()
    }
}

/// What a `DispatchToolCall` allowed.
#[derive(Debug, Clone, Default)]
pub struct Dispatch {
    /// The callback URL of a `type: async_webhook` call.
    pub callback_url: Option<String>,
    /// The pinned definition hash of a `type: mcp` call (empty otherwise).
    pub mcp_pinned_hash: String,
    /// The vault values the call may read (`SECRET_ACCESS`), for its
    /// `{{_secret.KEY}}` placeholders. Secrets: `Debug` shows the keys.
    pub secrets: SecretValues,
}

impl From<DispatchToolCallResponse> for Dispatch {
    fn from(r: DispatchToolCallResponse) -> Self {
        Dispatch {
            callback_url: Some(r.callback_url).filter(|u| !u.is_empty()),
            mcp_pinned_hash: r.mcp_pinned_hash,
            secrets: SecretValues::new(r.secrets.into_iter().map(|s| (s.key, s.value)).collect()),
        }
    }
}

/// What a `type: mcp` call adds to its result or failure report (recorded
/// in its events, for the audit): the definition hash it was checked
/// against, and which of the three kinds of MCP failure ended it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct McpReport {
    /// The pinned definition hash the dispatch returned.
    pub definition_hash: Option<String>,
    /// The kind of failure (`None` for a result, or a call refused before
    /// it was sent).
    pub kind: Option<crate::mcp::ToolFailureKind>,
}

impl McpReport {
    fn hash(&self) -> String {
        self.definition_hash.clone().unwrap_or_default()
    }

    fn kind(&self) -> i32 {
        use crate::mcp::ToolFailureKind as K;
        use belay_proto::v1::ToolFailureKind as P;
        (match self.kind {
            None => P::Unspecified,
            Some(K::ToolError) => P::ToolError,
            Some(K::ProtocolError) => P::ProtocolError,
            Some(K::Transport) => P::Transport,
        }) as i32
    }
}

/// A task's result as `CompleteTask` reports it
/// ([`EngineClient::report_complete_claiming`]).
#[derive(Debug, Clone, Default)]
pub struct Completion {
    /// `wire::ModelCallResult` for a model call; the tool's result for a
    /// tool call.
    pub result_json: String,
    /// Values taken out of the result (its `RESULT_SECRETS`), by vault key.
    pub vaulted: Vec<(String, String)>,
    /// Model completions an MCP server asked for during the call.
    pub sampling: Option<belay_proto::wire::SamplingUsage>,
    /// Ready tasks to claim for this worker with the report (0..=64; 0:
    /// none).
    pub claim_next: u32,
}

/// Whether a failed call may succeed if sent again: transport failures and
/// engine-side unavailability (restart, overload, deadline). Refusals about the
/// task itself are final.
pub fn is_retryable(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable
            | Code::DeadlineExceeded
            // tonic reports its own client-side timeout as CANCELLED.
            | Code::Cancelled
            | Code::Unknown
            | Code::ResourceExhausted
            | Code::Aborted
            | Code::Internal
    )
}

/// Client of `belay.v1.WorkerService` for one worker id. Cheap to clone (the
/// channel is shared).
#[derive(Debug, Clone)]
pub struct EngineClient {
    client: WorkerServiceClient<AuthChannel>,
    worker_id: String,
    retry: RetryPolicy,
    /// When each held lease's side effect may last start: a dispatch
    /// answered later is refused here ([`crate::lease_clock`]).
    lease_clock: crate::lease_clock::LeaseClock,
    /// Sent with every claim ([`EngineClient::with_capabilities`]); `None`:
    /// none, so the engine hands out any task (as to a worker older than
    /// worker pools).
    capabilities: Option<WorkerCapabilities>,
}

impl EngineClient {
    /// A client for `engine_url` (`http://host:port`) without an API key or
    /// TLS options: [`EngineClient::connect`] with just the URL.
    ///
    /// Errors: as [`EngineClient::connect`].
    pub fn connect_lazy(
        engine_url: &str,
        worker_id: impl Into<String>,
    ) -> Result<Self, ConnectError> {
        Self::connect(&ConnectOptions::new(engine_url), worker_id)
    }

    /// A client for the engine of `options` (URL, CA file, client
    /// certificate, API key). Does not connect: the first call does, and
    /// every call after a connection loss reconnects.
    ///
    /// Errors: the options' [`ConnectError`] (a bad URL, an unreadable
    /// file, a TLS option with `http://`, an API key a header cannot carry).
    pub fn connect(
        options: &ConnectOptions,
        worker_id: impl Into<String>,
    ) -> Result<Self, ConnectError> {
        let channel = options.connect_lazy_with(|endpoint| {
            endpoint
                .connect_timeout(Duration::from_millis(CONNECT_TIMEOUT_MS))
                .tcp_nodelay(true)
                // Find a dead engine connection in a long poll without
                // waiting for the poll's deadline.
                .http2_keep_alive_interval(Duration::from_secs(10))
                .keep_alive_timeout(Duration::from_secs(5))
        })?;
        Ok(Self {
            // Claimed specs carry whole transcripts, up to 64 per claim; the
            // 4 MiB default would make a large batch unclaimable forever.
            client: WorkerServiceClient::new(channel)
                .max_decoding_message_size(MAX_DECODING_MESSAGE_BYTES),
            worker_id: worker_id.into(),
            retry: RetryPolicy::default(),
            lease_clock: crate::lease_clock::LeaseClock::default(),
            capabilities: None,
        })
    }

    /// The same client with another backoff for the reporting calls.
    pub fn with_retry_policy(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// The same client, claiming only the tasks `capabilities` cover (the
    /// engine matches each task's requirements against them:
    /// `belay_proto::pools`).
    pub fn with_capabilities(mut self, capabilities: WorkerCapabilities) -> Self {
        self.capabilities = Some(capabilities);
        self
    }

    /// The act-by moments of the leases this client's dispatches are
    /// checked against (shared by its clones; the runner keeps it).
    pub fn lease_clock(&self) -> &crate::lease_clock::LeaseClock {
        &self.lease_clock
    }

    /// `DispatchToolCall` with `request`, retried while transient, and
    /// refused when answered too late ([`EngineClient::in_time`]).
    async fn dispatch_request(&self, request: DispatchToolCallRequest) -> Result<Dispatch, Status> {
        let (task_id, attempt) = (request.task_id.clone(), request.attempt);
        let dispatch = self
            .retrying("DispatchToolCall", &task_id, attempt, |mut client| {
                let request = request.clone();
                async move {
                    client
                        .dispatch_tool_call(with_deadline(request))
                        .await
                        .map(|r| Dispatch::from(r.into_inner()))
                }
            })
            .await?;
        self.in_time(&task_id, attempt, dispatch)
    }

    /// A dispatch's answer, unless it came too late to act on: after the
    /// lease may have run out by this worker's clock, it is refused
    /// (`DEADLINE_EXCEEDED`), and the worker must not act.
    fn in_time(&self, task_id: &str, attempt: u32, dispatch: Dispatch) -> Result<Dispatch, Status> {
        if self.lease_clock.may_act(task_id, attempt) {
            return Ok(dispatch);
        }
        Err(Status::deadline_exceeded(format!(
            "the dispatch of task {task_id} attempt {attempt} was answered after its lease may have run out (by this worker's clock); not acting: the engine judges the lease"
        )))
    }

    /// The capabilities sent with every claim, if any.
    pub fn capabilities(&self) -> Option<&WorkerCapabilities> {
        self.capabilities.as_ref()
    }

    /// This worker's id, sent in every request.
    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }

    /// One `ClaimTasks` long poll: up to `max_tasks` (1..=64) tasks, waiting up
    /// to `wait_ms` (0..=30 000) for the first. No retry.
    pub async fn claim_tasks(&self, max_tasks: u32, wait_ms: u32) -> Result<Vec<Task>, Status> {
        let mut request = tonic::Request::new(ClaimTasksRequest {
            worker_id: self.worker_id.clone(),
            max_tasks: max_tasks.clamp(1, 64),
            wait_ms: wait_ms.min(30_000),
            capabilities: self.capabilities.clone(),
        });
        request.set_timeout(Duration::from_millis(
            u64::from(wait_ms) + CLAIM_EXTRA_TIMEOUT_MS,
        ));
        let response = self.client.clone().claim_tasks(request).await?;
        Ok(response.into_inner().tasks)
    }

    /// One `Heartbeat` for `leases`, with `deadline` (the runner derives it
    /// from the shortest lease, so a stalled heartbeat fails before the
    /// lease runs out); the status of each lease, `held: false` for lost
    /// ones. No retry.
    pub async fn heartbeat(
        &self,
        leases: Vec<TaskLease>,
        deadline: Duration,
    ) -> Result<Vec<LeaseStatus>, Status> {
        let mut request = tonic::Request::new(HeartbeatRequest {
            worker_id: self.worker_id.clone(),
            leases,
        });
        request.set_timeout(deadline);
        let response = self.client.clone().heartbeat(request).await?;
        Ok(response.into_inner().leases)
    }

    /// `DispatchToolCall`, retried while transient. `Ok` means the dispatch is
    /// recorded and the worker may act; any error means it must not. The
    /// `Ok` value holds the callback URL of a `type: async_webhook` call
    /// and the vault values of a tool with `SECRET_ACCESS`.
    pub async fn dispatch(&self, task_id: &str, attempt: u32) -> Result<Dispatch, Status> {
        let request = DispatchToolCallRequest {
            worker_id: self.worker_id.clone(),
            task_id: task_id.to_owned(),
            attempt,
            mcp_definition_hash: String::new(),
        };
        self.dispatch_request(request).await
    }

    /// [`EngineClient::dispatch`] for `task`, unless the engine recorded its
    /// dispatch when it leased it (`Task.dispatched`: an `idempotent` HTTP
    /// call with nothing to hand out): then nothing is asked, and it is
    /// refused only when the lease may have run out by this worker's clock,
    /// as a late answer to `DispatchToolCall` is ([`EngineClient::in_time`]).
    pub async fn dispatch_task(&self, task: &Task) -> Result<Dispatch, Status> {
        if task.dispatched {
            return self.in_time(&task.task_id, task.attempt, Dispatch::default());
        }
        self.dispatch(&task.task_id, task.attempt).await
    }

    /// `DispatchToolCall` for a `type: mcp` call, retried while transient:
    /// sends the definition hash the worker's server lists for the tool now
    /// and returns the hash the engine pinned for the run's tenant (the one
    /// the call must find) in [`Dispatch::mcp_pinned_hash`]. As for
    /// [`EngineClient::dispatch`], any error means the worker must not act.
    pub async fn dispatch_mcp(
        &self,
        task_id: &str,
        attempt: u32,
        listed_hash: &str,
    ) -> Result<Dispatch, Status> {
        let request = DispatchToolCallRequest {
            worker_id: self.worker_id.clone(),
            task_id: task_id.to_owned(),
            attempt,
            mcp_definition_hash: listed_hash.to_owned(),
        };
        self.dispatch_request(request).await
    }

    /// `ReportMcpTools`: what `server` lists, retried while transient.
    /// Returns how many listings the engine had not seen.
    pub async fn report_mcp_tools(
        &self,
        server: &str,
        protocol_version: &str,
        tools: Vec<McpToolListing>,
    ) -> Result<u32, Status> {
        let request = ReportMcpToolsRequest {
            worker_id: self.worker_id.clone(),
            server: server.to_owned(),
            protocol_version: protocol_version.to_owned(),
            tools,
        };
        self.retrying("ReportMcpTools", server, 0, |mut client| {
            let request = request.clone();
            async move {
                client
                    .report_mcp_tools(with_deadline(request))
                    .await
                    .map(|r| r.into_inner().new_definitions)
            }
        })
        .await
    }

    /// `CompleteTask` with `result_json`, retried while transient.
    pub async fn report_complete(
        &self,
        task_id: &str,
        attempt: u32,
        result_json: String,
    ) -> Result<(), Status> {
        self.report_complete_vaulted(task_id, attempt, result_json, Vec::new())
            .await
    }

    /// [`EngineClient::report_complete`] for a producer tool: `vaulted` are
    /// the values taken out of the result (its `RESULT_SECRETS`), by vault
    /// key, sent beside the result, never in it.
    pub async fn report_complete_vaulted(
        &self,
        task_id: &str,
        attempt: u32,
        result_json: String,
        vaulted: Vec<(String, String)>,
    ) -> Result<(), Status> {
        self.report_complete_sampled(
            task_id,
            attempt,
            result_json,
            vaulted,
            None,
            &McpReport::default(),
        )
        .await
    }

    /// [`EngineClient::report_complete_vaulted`] with the model completions
    /// an MCP server asked for during the call (`sampling`), which the
    /// engine charges to the run's budgets, and what an MCP call adds
    /// (`mcp`: its definition hash).
    pub async fn report_complete_sampled(
        &self,
        task_id: &str,
        attempt: u32,
        result_json: String,
        vaulted: Vec<(String, String)>,
        sampling: Option<belay_proto::wire::SamplingUsage>,
        mcp: &McpReport,
    ) -> Result<(), Status> {
        let report = Completion {
            result_json,
            vaulted,
            sampling,
            claim_next: 0,
        };
        self.report_complete_claiming(task_id, attempt, report, mcp)
            .await
            .map(drop)
    }

    /// `CompleteTask` with everything a completion can carry, retried while
    /// transient; returns the tasks the engine claimed for this worker
    /// with it (`report.claim_next`, sent with the first try only: a retry
    /// after a lost reply asks for none, so a task claimed for the lost
    /// reply is the only one left to its lease's expiry). An engine older
    /// than `claim_next` returns none.
    pub async fn report_complete_claiming(
        &self,
        task_id: &str,
        attempt: u32,
        report: Completion,
        mcp: &McpReport,
    ) -> Result<Vec<Task>, Status> {
        let Completion {
            result_json,
            vaulted,
            sampling,
            claim_next,
        } = report;
        let request = CompleteTaskRequest {
            worker_id: self.worker_id.clone(),
            task_id: task_id.to_owned(),
            attempt,
            result_json,
            vaulted_secrets: vaulted
                .into_iter()
                .map(|(key, value)| SecretValue { key, value })
                .collect(),
            sampling_usage: sampling.map(sampling_usage),
            mcp_definition_hash: mcp.hash(),
            claim_next: claim_next.min(64),
            capabilities: if claim_next > 0 {
                self.capabilities.clone()
            } else {
                None
            },
        };
        let first_try = std::sync::atomic::AtomicBool::new(true);
        self.retrying("CompleteTask", task_id, attempt, |mut client| {
            let mut request = request.clone();
            if !first_try.swap(false, std::sync::atomic::Ordering::SeqCst) {
                request.claim_next = 0;
                request.capabilities = None;
            }
            async move {
                client
                    .complete_task(with_deadline(request))
                    .await
                    .map(|r| r.into_inner().tasks)
            }
        })
        .await
    }

    /// `FailTask` with `error`, `class` and the tool's HTTP status if it
    /// answered with one, retried while transient.
    pub async fn report_failure(
        &self,
        task_id: &str,
        attempt: u32,
        error: String,
        class: FailureClass,
        status_code: Option<u16>,
    ) -> Result<(), Status> {
        self.report_failure_sampled(
            task_id,
            attempt,
            error,
            class,
            status_code,
            None,
            &McpReport::default(),
        )
        .await
    }

    /// [`EngineClient::report_failure`] with the model completions an MCP
    /// server asked for before the call failed (`sampling`), charged all
    /// the same, and what an MCP call adds (`mcp`: its definition hash and
    /// kind of failure).
    #[allow(clippy::too_many_arguments)]
    pub async fn report_failure_sampled(
        &self,
        task_id: &str,
        attempt: u32,
        error: String,
        class: FailureClass,
        status_code: Option<u16>,
        sampling: Option<belay_proto::wire::SamplingUsage>,
        mcp: &McpReport,
    ) -> Result<(), Status> {
        let request = FailTaskRequest {
            worker_id: self.worker_id.clone(),
            task_id: task_id.to_owned(),
            attempt,
            error,
            class: class as i32,
            status_code: status_code.map(u32::from).unwrap_or(0),
            sampling_usage: sampling.map(sampling_usage),
            failure_kind: mcp.kind(),
            mcp_definition_hash: mcp.hash(),
        };
        self.retrying("FailTask", task_id, attempt, |mut client| {
            let request = request.clone();
            async move { client.fail_task(with_deadline(request)).await.map(drop) }
        })
        .await
    }

    /// `RequestToolInput`: the tool asked a person for input mid-call
    /// (`needed`, from the MCP client), retried while transient.
    /// `sampling`: the model completions the server asked for before it
    /// asked the person, charged all the same.
    pub async fn report_needs_input(
        &self,
        task_id: &str,
        attempt: u32,
        needed: &crate::mcp::InputNeeded,
        sampling: Option<belay_proto::wire::SamplingUsage>,
    ) -> Result<(), Status> {
        let via = serde_json::to_value(needed.via)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        let request = RequestToolInputRequest {
            worker_id: self.worker_id.clone(),
            task_id: task_id.to_owned(),
            attempt,
            via,
            requests_json: needed.requests.to_string(),
            request_state: needed.request_state.clone().unwrap_or_default(),
            may_have_acted: needed.may_have_acted,
            sampling_usage: sampling.map(sampling_usage),
        };
        self.retrying("RequestToolInput", task_id, attempt, |mut client| {
            let request = request.clone();
            async move {
                client
                    .request_tool_input(with_deadline(request))
                    .await
                    .map(drop)
            }
        })
        .await
    }

    async fn retrying<F, Fut, T>(
        &self,
        call: &'static str,
        task_id: &str,
        attempt: u32,
        f: F,
    ) -> Result<T, Status>
    where
        F: Fn(WorkerServiceClient<AuthChannel>) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let mut retries = 0u32;
        (|| f(self.client.clone()))
            .retry(self.retry.backoff())
            .when(is_retryable)
            .notify(|status: &Status, delay: Duration| {
                retries += 1;
                // One warning per call; the rest at debug so an engine outage
                // does not flood the log.
                if retries == 1 {
                    tracing::warn!(
                        %task_id, attempt, call, code = ?status.code(), error = status.message(),
                        "engine call failed, retrying"
                    );
                } else {
                    tracing::debug!(
                        %task_id, attempt, call, retries, delay_ms = delay.as_millis() as u64,
                        code = ?status.code(), "engine call still failing"
                    );
                }
            })
            .await
    }
}

fn with_deadline<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(Duration::from_millis(CALL_TIMEOUT_MS));
    request
}

/// The proto form of a [`belay_proto::wire::SamplingUsage`].
fn sampling_usage(u: belay_proto::wire::SamplingUsage) -> belay_proto::v1::SamplingUsage {
    belay_proto::v1::SamplingUsage {
        requests: u.requests,
        input_tokens: u.input_tokens,
        output_tokens: u.output_tokens,
    }
}

/// Log a dispatch the engine did not allow (the worker then neither acts
/// nor reports): a call held back by its tool's rate limit (`dispatch
/// deferred: …`, routine under a tight limit) at info, any other refusal
/// at warn.
pub(crate) fn log_dispatch_refused(task: &belay_proto::v1::Task, status: &Status) {
    let (task_id, attempt) = (&task.task_id, task.attempt);
    if status.message().starts_with("dispatch deferred:") {
        tracing::info!(
            %task_id, attempt, detail = status.message(),
            "dispatch deferred by the tool's rate limit; not acting"
        );
    } else {
        tracing::warn!(
            %task_id, attempt, code = ?status.code(), error = status.message(),
            "dispatch refused; not acting and not reporting"
        );
    }
}
