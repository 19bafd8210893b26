//! The pure run machine: events in, decisions out. No I/O, no clock, no
//! randomness; the coordinator feeds it an [`Input`] and the run's folded
//! [`RunState`], writes the returned events and performs the returned
//! [`Command`]s in one transaction.
//!
//! Every transition is a match arm in [`decide`]; follow-up work (the next
//! model call, the next node, the end of the run) is derived in `advance`
//! from the state alone, so replaying a history reaches the same decisions.

pub mod cache;
pub mod event;
pub mod gates;
pub mod normalize;
pub mod pii;
pub mod plan;
pub mod scrub;
pub mod state;
pub mod vault;

use belay_proto::wire::{
    AsyncWebhookBinding, ChatMessage, HttpBinding, McpBinding, ModelCallResult, ModelCallSpec,
    ToolBinding, ToolCallSpec, ToolSchema, ToolUse,
};
use serde_json::{Map, Value, json};

pub use event::{
    Event, FailureClass, ProbeOutcome, ResolutionKind, ResolvedVia, Stop, TimerPurpose, TimerSpec,
};
pub use plan::{Pinned, RunPlan};
pub use state::{CallStatus, RunState, RunStatus, StepKind, StepState};
pub use vault::{SealedSecret, VaultEntry, VaultedKey};

use crate::gates::{GateVerdict, ToolGates};
use belay_definitions::expr::Template;
use belay_definitions::model::{
    AgentDef, Budget, ChildMode, CircuitBreakerDef, Jitter, LoopPolicy, NodeKind, OnToolFailure,
    RepeatSafety, RetryPolicy, ToolBindingDef, ToolDef, WaitDef, WaitFor,
};

/// Timer id of the run's wall-time budget (no node's timer id can be it:
/// those are `<node>[~<n>].<what>`).
pub const RUN_DEADLINE_TIMER: &str = "run~deadline";

/// Kind of a task row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskKind {
    /// A call to a model provider.
    ModelCall,
    /// A call to a tool.
    ToolCall,
}

impl TaskKind {
    /// Database / wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskKind::ModelCall => belay_proto::wire::TASK_KIND_MODEL_CALL,
            TaskKind::ToolCall => belay_proto::wire::TASK_KIND_TOOL_CALL,
        }
    }
}

/// Terminal status the store sets on a task row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskEnd {
    /// Result recorded.
    Completed,
    /// Failed for good.
    Failed,
    /// Outcome unknown, an uncertain-outcome record exists.
    Uncertain,
    /// No longer needed (a probe whose call was resolved otherwise).
    Cancelled,
}

/// Effects the coordinator performs in the same transaction as the events.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Persist a timer; any engine replica fires it once it is due.
    ScheduleTimer(TimerSpec),
    /// Create a child run (after this transition commits; exactly once: the
    /// id is fixed) of `workflow` with `input`, for the tenant, caller and
    /// caller grants of this run, linked to this run's `call_id`.
    StartChildRun {
        /// Call id in this run.
        call_id: String,
        /// The child's run id.
        child_run_id: String,
        /// Workflow name.
        workflow: String,
        /// Input.
        input: Value,
        /// Whether this run waits for the child's end.
        sync: bool,
    },
    /// Cancel a child run (after this transition commits).
    CancelChildRun {
        /// The child's run id.
        child_run_id: String,
        /// Why.
        reason: String,
    },
    /// Delete a timer (fired, or no longer wanted).
    CancelTimer {
        /// Timer id.
        timer_id: String,
    },
    /// Insert a task row, ready to claim.
    ScheduleTask {
        /// Call id (unique per run).
        call_id: String,
        /// Kind.
        kind: TaskKind,
        /// `ModelCallSpec` or `ToolCallSpec` as JSON.
        spec: Value,
        /// Idempotency key of the call.
        idempotency_key: String,
        /// Repeat safety for tool calls.
        repeat_safety: Option<RepeatSafety>,
        /// Claimable while the run is paused (reconcile probes).
        runs_while_paused: bool,
    },
    /// Give a task a new spec, with a new idempotency key (an operator's
    /// retry of a call that surely did nothing) or the same one (a
    /// person's answers to carry, a sampling grant computed again before a
    /// retry).
    RekeyTask {
        /// Call id.
        call_id: String,
        /// New key.
        idempotency_key: String,
        /// The spec carrying the new key.
        spec: Value,
    },
    /// Close an uncertain-outcome record with its resolution.
    MarkUncertainResolved {
        /// Call id.
        call_id: String,
        /// Resolution as stored (`{"resolution": ..., "result"|"error"|"idempotency_key": ...}`).
        resolution: Value,
        /// `succeeded`, `failed`, `retry`.
        kind: ResolutionKind,
        /// Who.
        resolved_by: String,
        /// Why.
        reason: String,
        /// How.
        via: ResolvedVia,
    },
    /// Flag a late result on a resolved uncertain-outcome record.
    FlagDiscrepancy {
        /// Call id.
        call_id: String,
        /// `{attempt, result, detail}`.
        discrepancy: Value,
    },
    /// Store what a reconcile probe found on the uncertain-outcome record.
    RecordProbe {
        /// The uncertain call.
        call_id: String,
        /// `{tool, outcome, detail}`.
        probe: Value,
    },
    /// Queue a notification for operators (webhook outbox).
    NotifyOperator {
        /// Event kind, e.g. `run.paused.uncertain_outcome`.
        kind: String,
        /// JSON body.
        payload: Value,
    },
    /// Put a task back to ready after `delay_ms`, keeping its attempt counter.
    RetryTask {
        /// Call id.
        call_id: String,
        /// Delay before it can be claimed again, ms.
        delay_ms: u64,
    },
    /// Remember which run and call a callback token belongs to, so that
    /// `POST /callbacks/v1/{token}` can find the run.
    RegisterCallback {
        /// Call id.
        call_id: String,
        /// Lower-case hex SHA-256 of the token.
        token_sha256: String,
    },
    /// Before anything else of this decision is written: read the tool's
    /// gates (`crate::gates::admit`) and take the call's turn. If they hold
    /// the call back, the store asks the machine again with
    /// [`Input::DispatchGated`] and writes that decision instead. Emitted
    /// only with a dispatch, and only for a tool that declares a gate.
    PassToolGates {
        /// Tool name (the gates are the tenant's, per tool name).
        tool: String,
        /// What the pinned tool declares.
        gates: ToolGates,
        /// The call was deferred before and holds a turn.
        holds_turn: bool,
    },
    /// Move the tool's circuit: a success closes it, a failure counts
    /// towards opening it (`crate::gates::after_failure`). Only for tools
    /// with a `circuit_breaker:`.
    RecordToolOutcome {
        /// Tool name.
        tool: String,
        /// Its breaker.
        circuit_breaker: CircuitBreakerDef,
        /// Whether the call failed in a way that counts
        /// (`crate::gates::counts_as_failure`).
        failed: bool,
    },
    /// Mark the current attempt of a tool call task as dispatched.
    MarkDispatched {
        /// Call id.
        call_id: String,
        /// Attempt.
        attempt: u32,
    },
    /// Close a task.
    EndTask {
        /// Call id.
        call_id: String,
        /// How it ended.
        end: TaskEnd,
    },
    /// Write an uncertain-outcome record for a tool call.
    RecordUncertainOutcome {
        /// Call id.
        call_id: String,
        /// Node id.
        node: String,
        /// Tool name.
        tool: String,
        /// Tool version.
        tool_version: u32,
        /// Arguments sent.
        arguments: Value,
        /// Idempotency key.
        idempotency_key: String,
        /// Attempt whose outcome is unknown.
        attempt: u32,
        /// Why.
        reason: String,
    },
    /// Cancel every open task of the run.
    CancelOpenTasks,
    /// Put a producer's sealed result fields into the run's vault (a key
    /// written again replaces its value and options, and is unconsumed).
    /// Emitted with the result's events, so the vault holds a value only
    /// if the result was recorded.
    VaultSecrets {
        /// The producing call.
        call_id: String,
        /// Its tool.
        tool: String,
        /// What to keep.
        entries: Vec<VaultEntry>,
    },
    /// At a dispatch: read the run's vault for `keys`, for `tool` (a key's
    /// `consumers` must allow it), leaving out expired keys and single-use
    /// keys another call consumed; consume the single-use ones for
    /// `call_id`. The store hands what it read to the coordinator
    /// (the store's `Applied::secrets`), which gives it to the worker.
    RestoreSecrets {
        /// The dispatched call.
        call_id: String,
        /// Its tool.
        tool: String,
        /// Its `SECRET_ACCESS: READ` keys.
        keys: Vec<String>,
    },
    /// The run ended: delete its vault.
    DropRunSecrets,
    /// Before the `ScheduleTask` of `call_id` in the same decision: look
    /// `key` up in the tenant's tool cache (by the engine's clock). On a
    /// live entry the store leaves that task out and decides
    /// [`Input::ToolCacheHit`] with it, on the state after this decision,
    /// in the same transaction ([`cache`]). Added for issue 4 (result cache).
    LookupToolCache {
        /// Call id.
        call_id: String,
        /// The call's cache key ([`cache::key`]).
        key: String,
    },
    /// Keep a call's result in the tenant's tool cache for `ttl_ms` by the
    /// engine's clock (a newer result of the same key replaces it). Added
    /// for issue 4 (result cache).
    StoreToolCache {
        /// The call's cache key ([`cache::key`]).
        key: String,
        /// Tool name (for operators and the store's tests).
        tool: String,
        /// The call whose result it is.
        call_id: String,
        /// The result, as recorded (scrubbed).
        result: Value,
        /// How long it is served, ms.
        ttl_ms: u64,
    },
}

/// What the machine decided for one input.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decision {
    /// Events to append, in order.
    pub events: Vec<Event>,
    /// Effects to perform in the same transaction.
    pub commands: Vec<Command>,
}

/// Something that happened to a run, fed to [`decide`].
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// Create the run.
    Start {
        /// Run id.
        run_id: String,
        /// Tenant.
        tenant: String,
        /// Caller.
        caller: String,
        /// Caller permissions.
        caller_grants: Vec<String>,
        /// Tenant permissions.
        tenant_grants: Vec<String>,
        /// Input.
        input: Value,
        /// Pinned definitions.
        plan: Box<RunPlan>,
    },
    /// A worker reported a model result.
    ModelCallCompleted {
        /// Call id.
        call_id: String,
        /// Attempt.
        attempt: u32,
        /// Result.
        result: ModelCallResult,
    },
    /// A worker asks to start a tool's side effect.
    DispatchToolCall {
        /// Call id.
        call_id: String,
        /// Attempt.
        attempt: u32,
        /// Worker.
        worker_id: String,
        /// Hex SHA-256 of a fresh callback token the coordinator minted, or
        /// `None` when the engine serves no callback endpoint. Used only for
        /// `type: async_webhook` tools (which are refused without one).
        callback_token_sha256: Option<String>,
        /// The tenant's grants now (read at dispatch), so a permission
        /// revoked since the run started is refused before the tool acts;
        /// `None`: the grants pinned when the run started.
        tenant_grants: Option<Vec<String>>,
    },
    /// The tool's gates held back a dispatch that [`Input::DispatchToolCall`]
    /// allowed (in the same transaction, which then writes only this
    /// decision): a rate limit defers the call (the task is ready again at
    /// its turn; not an attempt), an open circuit fails it without sending.
    DispatchGated {
        /// Call id.
        call_id: String,
        /// Attempt.
        attempt: u32,
        /// Worker.
        worker_id: String,
        /// What the gates said.
        verdict: GateVerdict,
    },
    /// An operator gives up on a call that waits outside any task (an
    /// accepted async webhook whose callback was lost, a sync child run): it
    /// fails now, as if its timeout had fired, and a child is cancelled.
    FailWaitingCall {
        /// Call id.
        call_id: String,
        /// Who.
        by: String,
        /// Why.
        reason: String,
    },
    /// The tool server of a `type: async_webhook` call POSTed to its
    /// callback URL. A token is used once: a replay changes nothing.
    Callback {
        /// Hex SHA-256 of the token in the URL.
        token_sha256: String,
        /// The body: the call's result (checked against the tool's output schema).
        payload: Value,
    },
    /// A worker reported a tool result.
    ToolCallCompleted {
        /// Call id.
        call_id: String,
        /// Attempt.
        attempt: u32,
        /// Result (normalised).
        result: Value,
        /// The fields of the result the worker took out for the vault
        /// (the tool's `RESULT_SECRETS`), sealed by the coordinator; the
        /// result holds `[VAULTED:<key>]` in their place.
        secrets: Vec<SealedSecret>,
    },
    /// A tool call's result, failure or question for a person (`report`: an
    /// [`Input::ToolCallCompleted`], [`Input::TaskFailed`] or
    /// [`Input::ToolInputRequested`]) reported with
    /// the model completions its MCP server asked for during the attempt
    /// (see `sampling.rs`): recorded as `tool_call_sampled`, then `report`
    /// is decided in the same transition. Added for MCP sampling.
    ToolCallSampled {
        /// Completions and tokens, as the worker reported them.
        usage: belay_proto::wire::SamplingUsage,
        /// The attempt's result or failure.
        report: Box<Input>,
    },
    /// A worker reported a failure (model or tool call).
    TaskFailed {
        /// Call id.
        call_id: String,
        /// Attempt.
        attempt: u32,
        /// Message.
        error: String,
        /// Classification.
        class: FailureClass,
        /// Whether this attempt was dispatched (from the task row).
        dispatched: bool,
        /// HTTP status if the tool answered with one.
        status_code: Option<u16>,
    },
    /// A result reported by an attempt that no longer holds the task (its
    /// lease expired): resolves an uncertain outcome, wins if the call is
    /// still open, or is kept as history.
    LateToolResult {
        /// Call id.
        call_id: String,
        /// Attempt that reported.
        attempt: u32,
        /// Result (normalised).
        result: Value,
        /// Worker that reported.
        worker_id: String,
    },
    /// An operator resolves an uncertain outcome.
    ResolveUncertain {
        /// Call id.
        call_id: String,
        /// The resolution.
        resolution: Resolution,
        /// Who.
        resolved_by: String,
        /// Why.
        reason: String,
    },
    /// An operator pauses the run.
    Pause {
        /// Who.
        by: String,
        /// Why.
        reason: String,
    },
    /// An operator lifts their pause.
    Resume {
        /// Who.
        by: String,
        /// Why.
        reason: String,
    },
    /// A lease expired before the worker reported.
    LeaseExpired {
        /// Call id.
        call_id: String,
        /// Attempt.
        attempt: u32,
        /// Whether this attempt was dispatched.
        dispatched: bool,
    },
    /// Cancel the run.
    Cancel {
        /// Why.
        reason: String,
    },
    /// A signal sent to the run (`SignalRun`).
    Signal {
        /// The sender's id for it (duplicates are applied once).
        signal_id: String,
        /// Name.
        name: String,
        /// Payload.
        payload: Value,
        /// Who sent it.
        sent_by: String,
    },
    /// A child run ended (or could not start: `failed` with the reason).
    ChildRunFinished {
        /// The child's run id.
        child_run_id: String,
        /// `completed`, `failed` or `cancelled`.
        status: String,
        /// Its output, when completed.
        output: Option<Value>,
        /// Why it failed or was cancelled.
        error: Option<String>,
    },
    /// A timer of the run is due.
    TimerFired {
        /// Timer id.
        timer_id: String,
        /// How late it fires: the engine's clock now minus its due time,
        /// ms (0 when on time). Time enters the machine only this way.
        overdue_ms: u64,
    },
    /// A worker reports that the tool asked, mid-call, for input from a
    /// person (an MCP server's elicitation) instead of answering.
    ToolInputRequested {
        /// Call id.
        call_id: String,
        /// The attempt that asked.
        attempt: u32,
        /// `input_required`, `elicitation` or `url_elicitation_required`.
        via: String,
        /// What the server asked (untrusted).
        requests: Value,
        /// Opaque server state to echo with the answers.
        request_state: Option<String>,
        /// The server kept running after Belay declined to answer at once
        /// (`elicitation`): the tool may have acted.
        may_have_acted: bool,
    },
    /// A person answers a tool's question ([`Input::ToolInputRequested`]).
    ProvideToolInput {
        /// Call id.
        call_id: String,
        /// The answer: `{"action": "accept"|"decline"|"cancel", "content"?:
        /// {...}}` for `elicitation` and `url_elicitation_required`,
        /// `{"responses": {<key>: <answer>}}` for `input_required`.
        answer: Value,
        /// Who answers.
        by: String,
    },
    /// The tenant's tool cache holds a live result for a call the decision
    /// before it launched ([`Command::LookupToolCache`]); decided by the
    /// store in the same transaction. Refused (and the call's task then
    /// scheduled as usual) when the call is no longer launchable from the
    /// cache: not open, dispatched, its key or the permission changed.
    /// Added for issue 4 (result cache).
    ToolCacheHit {
        /// Call id.
        call_id: String,
        /// The entry found.
        entry: cache::CacheEntry,
        /// The tenant's grants now, read in the same transaction, so a
        /// permission withdrawn since the run started is not served from
        /// the cache (it is refused at dispatch instead).
        tenant_grants: Vec<String>,
    },
    /// A person decides an approval node.
    DecideApproval {
        /// Node id.
        node: String,
        /// Approve or decline.
        approve: bool,
        /// The subject as the approver edited it (only where allowed).
        edited_subject: Option<Value>,
        /// Who.
        by: String,
        /// Their permissions.
        grants: Vec<String>,
        /// Why.
        reason: String,
    },
    /// A worker reported a model result whose proposed calls carried
    /// `visibility.trace: false` arguments: the coordinator took them out
    /// of `result` (placeholders in their place, `untraced::take_untraced`)
    /// and sealed them into `secrets` (empty when it has no vault key, and
    /// such calls are then refused). Otherwise as
    /// [`Input::ModelCallCompleted`]. Added for issue 4 (visibility).
    ModelCallCompletedUntraced {
        /// Call id.
        call_id: String,
        /// Attempt.
        attempt: u32,
        /// Result, with placeholders.
        result: ModelCallResult,
        /// The values taken out, sealed.
        secrets: Vec<SealedSecret>,
    },
}

/// An operator's (or a probe's) decision about an uncertain outcome.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolution {
    /// It took effect; `result` (valid against the tool's output type) is the call's result.
    Succeeded {
        /// The result.
        result: Value,
    },
    /// It failed; the model sees `error` as the tool's failure.
    Failed {
        /// The error.
        error: String,
    },
    /// Try again: with the same idempotency key, or a new one when the
    /// operator is sure the first call did nothing.
    Retry {
        /// Use a new idempotency key.
        new_idempotency_key: bool,
    },
}

/// Why an input was refused; nothing is written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MachineError {
    /// The run is not in a state that accepts this input.
    #[error("run is {status}: {detail}")]
    WrongStatus {
        /// Current status.
        status: &'static str,
        /// What was attempted.
        detail: String,
    },
    /// The input names a call that is not open.
    #[error("call `{call_id}` is not open: {detail}")]
    CallNotOpen {
        /// Call id.
        call_id: String,
        /// Details.
        detail: String,
    },
    /// A dispatch that the tool's repeat safety forbids.
    #[error("dispatch refused for `{call_id}`: {detail}")]
    DispatchRefused {
        /// Call id.
        call_id: String,
        /// Why.
        detail: String,
    },
    /// This engine cannot dispatch the call, though another replica may
    /// (an async webhook on an engine without a callback endpoint): the
    /// attempt fails as not sent and is retried with backoff.
    #[error("dispatch of `{call_id}` not possible on this engine: {detail}")]
    DispatchUnavailable {
        /// Call id.
        call_id: String,
        /// Why.
        detail: String,
    },
    /// The call has no open uncertain outcome (never had, or already resolved).
    #[error("call `{call_id}` has no open uncertain outcome: {detail}")]
    NotUncertain {
        /// Call id.
        call_id: String,
        /// Details.
        detail: String,
    },
    /// A `succeeded` resolution's result does not match the tool's output type.
    #[error("the result does not match the output type of `{tool}`: {}", .errors.join("; "))]
    InvalidResult {
        /// Tool.
        tool: String,
        /// Each violation.
        errors: Vec<String>,
    },
    /// The run's plan is inconsistent (should have been caught at registration).
    #[error("invalid plan: {0}")]
    InvalidPlan(String),
    /// A signal the workflow does not wait for, or whose payload does not
    /// match the waiting node's schema.
    #[error("{0}")]
    InvalidSignal(String),
    /// A signal id already delivered to the run, sent again with another
    /// name or payload (an exact repeat is a duplicate, applied once).
    #[error(
        "signal id `{signal_id}` was already used for {}; a signal id names one signal, so send this one with a new id",
        if .delivered_name == .name {
            format!("signal `{name}` with a different payload")
        } else {
            format!("signal `{delivered_name}`, not `{name}`")
        }
    )]
    SignalIdReused {
        /// The id.
        signal_id: String,
        /// Name of the signal delivered with it.
        delivered_name: String,
        /// Name sent now.
        name: String,
    },
    /// An approval that was already decided.
    #[error("node `{node}` was already {} by {by} (event {seq})", if *.approved { "approved" } else { "declined" })]
    AlreadyDecided {
        /// Node id.
        node: String,
        /// Who decided.
        by: String,
        /// Approved or declined.
        approved: bool,
        /// Seq of the decision event.
        seq: u64,
    },
    /// An approver's edit does not match the node's `edits_schema`.
    #[error("the edited subject does not match the `edits_schema` of node `{node}`: {}", .errors.join("; "))]
    InvalidEdit {
        /// Node id.
        node: String,
        /// Each violation.
        errors: Vec<String>,
    },
    /// A person's answer to a tool's question does not fit the question.
    #[error("the input for call `{call_id}` does not fit what the tool asked: {}", .errors.join("; "))]
    InvalidInput {
        /// Call id.
        call_id: String,
        /// Each problem, with its JSON pointer.
        errors: Vec<String>,
    },
    /// The caller may not do this (an approver without the node's grant).
    #[error("{0}")]
    NotAllowed(String),
    /// A decision for a node that is not waiting for one.
    #[error("{0}")]
    NotWaiting(String),
    /// A decision naming a node the run's workflow does not have.
    #[error(
        "no such node `{node}` in workflow `{workflow}`; {}",
        if .approvals.is_empty() {
            "it has no approval nodes".to_owned()
        } else {
            format!("its approval nodes: {}", .approvals.join(", "))
        }
    )]
    NoSuchNode {
        /// The node named.
        node: String,
        /// The run's workflow.
        workflow: String,
        /// Its approval nodes, in file order.
        approvals: Vec<String>,
    },
}

/// Attempts of a `tool` node's call (idempotent, or not yet dispatched)
/// before it fails: the agents' default `max_tool_attempts`.
pub const TOOL_NODE_ATTEMPTS: u32 = 5;

/// Largest arguments of a `tool` node's call, bytes of JSON (after
/// defaults are filled in): the agents' default `max_argument_bytes`.
pub const TOOL_NODE_MAX_ARGUMENT_BYTES: usize = 65_536;

/// Most bytes of a mistyped tool result quoted in the failure it becomes
/// (the whole result is not kept: it does not match what the tool declares).
pub const RESULT_EXCERPT_BYTES: usize = 2048;

/// Attempts of a tool call that provably did nothing (`not_sent`, or lost
/// before dispatch) before it fails: with [`retry_delay_ms`]'s backoff
/// (0.5 s doubling, at most 30 s) about 13 minutes of retrying, so a tool
/// host or MCP server being redeployed does not fail the run. Attempts that
/// may have acted are bounded by the agent's `max_tool_attempts`.
pub const MAX_NOT_SENT_ATTEMPTS: u32 = 30;

/// Most questions one tool call may ask a person (MCP elicitation rounds)
/// before it fails: a server that asks for ever does not hold a run for ever.
pub const MAX_INPUT_ROUNDS: u32 = 8;

/// Retry delay for attempt number `failed` (1-based), ms: 500 · 2^(n-1), at most 30 s.
pub fn retry_delay_ms(failed: u32) -> u64 {
    let exp = failed.saturating_sub(1).min(16);
    (500u64 << exp).min(30_000)
}

/// The delay before the retry after the `n`th failure that counts under a
/// tool's `policy` (1-based), ms: [`RetryPolicy::base_delay_ms`], then, for
/// `jitter: full`, a draw from `[0, that]` ([`full_jitter_ms`]) keyed by
/// the failed attempt, so the same failure always gets the same delay.
pub fn policy_delay_ms(
    policy: &RetryPolicy,
    n: u32,
    run_id: &str,
    call_id: &str,
    attempt: u32,
) -> u64 {
    let base = policy.base_delay_ms(n);
    match policy.jitter {
        Jitter::None => base,
        Jitter::Full => full_jitter_ms(base, run_id, call_id, attempt),
    }
}

/// "Full jitter" (AWS, "Exponential Backoff and Jitter"): a delay uniform
/// in `[0, base]` ms, drawn from the SHA-256 of (run id, call id, attempt)
/// instead of a random source: the machine stays pure, and deciding the
/// same failure again gives the same delay.
pub fn full_jitter_ms(base: u64, run_id: &str, call_id: &str, attempt: u32) -> u64 {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!(
        "belay.retry.jitter\n{run_id}\n{call_id}\n{attempt}"
    ));
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first) % base.saturating_add(1)
}

/// Idempotency key of a call: belongs to run + call, never to an attempt.
pub fn idempotency_key(run_id: &str, call_id: &str) -> String {
    format!("{run_id}/{call_id}")
}

/// Decide what happens for `input` given the run's `state`.
pub fn decide(state: &RunState, input: Input) -> Result<Decision, MachineError> {
    let mut m = Step {
        state: state.clone(),
        out: Decision::default(),
        late_attempt: None,
        arg_secrets: Vec::new(),
        sampling_share: 1,
    };
    match input {
        Input::Start {
            run_id,
            tenant,
            caller,
            caller_grants,
            tenant_grants,
            input,
            plan,
        } => {
            if m.state.status != RunStatus::New {
                return Err(m.wrong_status("start"));
            }
            // The run's wall-time budget: a durable timer from now.
            let deadline = plan
                .workflow
                .def
                .budget
                .max_wall_time_ms
                .map(|ms| TimerSpec {
                    timer_id: RUN_DEADLINE_TIMER.to_owned(),
                    after_ms: Some(ms),
                    at: None,
                    purpose: TimerPurpose::Deadline,
                });
            m.emit(Event::RunStarted {
                run_id,
                tenant,
                caller,
                caller_grants,
                tenant_grants,
                input,
                plan,
                deadline: deadline.clone(),
            });
            if let Some(timer) = deadline {
                m.command(Command::ScheduleTimer(timer));
            }
        }
        Input::ModelCallCompleted {
            call_id,
            attempt,
            result,
        } => {
            m.require_active("model result")?;
            m.require_open_model_call(&call_id)?;
            m.on_model_result(call_id, attempt, result)?;
        }
        Input::ModelCallCompletedUntraced {
            call_id,
            attempt,
            result,
            secrets,
        } => {
            m.require_active("model result")?;
            m.require_open_model_call(&call_id)?;
            m.arg_secrets = secrets;
            m.on_model_result(call_id, attempt, result)?;
        }
        Input::DispatchToolCall {
            call_id,
            attempt,
            worker_id,
            callback_token_sha256,
            tenant_grants,
        } => {
            m.on_dispatch(
                call_id,
                attempt,
                worker_id,
                callback_token_sha256,
                tenant_grants,
            )?;
        }
        Input::DispatchGated {
            call_id,
            attempt,
            worker_id,
            verdict,
        } => {
            m.on_dispatch_gated(call_id, attempt, worker_id, verdict)?;
        }
        Input::ToolCacheHit {
            call_id,
            entry,
            tenant_grants,
        } => {
            m.on_cache_hit(call_id, entry, &tenant_grants)?;
        }
        Input::Callback {
            token_sha256,
            payload,
        } => {
            m.on_callback(&token_sha256, payload)?;
        }
        Input::FailWaitingCall {
            call_id,
            by,
            reason,
        } => {
            m.require_active("failing a call")?;
            let call = m.require_open_tool_call(&call_id)?.clone();
            if !call.waits_outside() {
                return Err(MachineError::CallNotOpen {
                    call_id,
                    detail: "it does not wait for a callback, a child run, a confirmation or a person's input (only such calls can be failed by an operator; a call with a task ends with its task)".into(),
                });
            }
            for timer in [&call.child_timer, &call.callback_timer]
                .into_iter()
                .flatten()
            {
                m.command(Command::CancelTimer {
                    timer_id: timer.timer_id.clone(),
                });
            }
            if let Some(child) = &call.child_run_id {
                m.command(Command::CancelChildRun {
                    child_run_id: child.clone(),
                    reason: format!("its parent's call was failed by {by}: {reason}"),
                });
            }
            m.emit(Event::ToolCallFailed {
                call_id,
                attempt: call.dispatched_attempt.unwrap_or(0),
                error: format!("failed by operator {by}: {reason}"),
            });
        }
        Input::ToolCallCompleted {
            call_id,
            attempt,
            result,
            secrets,
        } => {
            m.require_active("tool result")?;
            m.require_open_tool_call(&call_id)?;
            m.on_tool_result(call_id.clone(), attempt, result)?;
            m.vault_result(&call_id, secrets)?;
            // The endpoint answered: whatever the result holds, it is up.
            m.record_tool_outcome(&call_id, false);
        }
        Input::ToolInputRequested {
            call_id,
            attempt,
            via,
            requests,
            request_state,
            may_have_acted,
        } => {
            m.require_active("input request")?;
            m.require_open_tool_call(&call_id)?;
            m.on_input_requested(
                call_id,
                attempt,
                via,
                requests,
                request_state,
                may_have_acted,
            )?;
        }
        Input::ProvideToolInput {
            call_id,
            answer,
            by,
        } => {
            m.require_active("input")?;
            m.on_input_provided(call_id, answer, by)?;
        }
        Input::ToolCallSampled { usage, report } => {
            return sampling::decide_sampled(state, usage, *report);
        }
        Input::TaskFailed {
            call_id,
            attempt,
            error,
            class,
            dispatched,
            status_code,
        } => {
            m.require_active("failure report")?;
            let counts = dispatched && gates::counts_as_failure(class, status_code);
            m.on_failure(Failure {
                call_id: call_id.clone(),
                attempt,
                error,
                class,
                dispatched,
                lease_expired: false,
                status_code,
            })?;
            if counts {
                m.record_tool_outcome(&call_id, true);
            }
        }
        Input::LateToolResult {
            call_id,
            attempt,
            result,
            worker_id,
        } => {
            // A result that arrives after a cancel is still what happened:
            // it is kept (and resolves an open uncertain outcome).
            if m.state.status != RunStatus::Cancelled {
                m.require_active("late result")?;
            }
            m.on_late_result(call_id, attempt, result, worker_id)?;
        }
        Input::ResolveUncertain {
            call_id,
            resolution,
            resolved_by,
            reason,
        } => {
            // Records of a cancelled run can still be closed (succeeded or
            // failed: what happened in the world), never retried.
            if m.state.status != RunStatus::Cancelled {
                m.require_active("resolve")?;
            } else if matches!(resolution, Resolution::Retry { .. }) {
                return Err(m.wrong_status("resolve as retry: the run is cancelled, so nothing would run it; resolve as succeeded or failed"));
            }
            m.resolve(
                &call_id,
                resolution,
                resolved_by,
                reason,
                ResolvedVia::Operator,
            )?;
        }
        Input::Pause { by, reason } => {
            if m.state.operator_paused.is_some() {
                return Err(m.wrong_status("pause: it is already paused by an operator"));
            }
            m.require_active("pause")?;
            let reason = if reason.trim().is_empty() {
                "no reason given".to_owned()
            } else {
                reason
            };
            m.emit(Event::RunPaused {
                reason: format!("paused by {by}: {reason}"),
                operator: Some(by),
            });
        }
        Input::Resume { by, reason } => {
            if m.state.operator_paused.is_none() {
                let open = m.state.open_uncertain();
                let detail = if open.is_empty() {
                    "resume: it is not paused by an operator".to_owned()
                } else {
                    format!(
                        "resume: it is paused on {} uncertain outcome(s) ({}); resolve them instead",
                        open.len(),
                        open.join(", ")
                    )
                };
                return Err(m.wrong_status(&detail));
            }
            if m.state.open_uncertain().is_empty() {
                m.emit(Event::RunResumed { by, reason });
            } else {
                // The operator's hold is gone, but an uncertain outcome still holds the run.
                m.emit(Event::OperatorPauseLifted { by, reason });
            }
        }
        Input::LeaseExpired {
            call_id,
            attempt,
            dispatched,
        } => {
            // A paused run can still have leases expire (its tasks were
            // claimed before it paused); judge them the same way.
            if m.state.status.is_terminal() || m.state.status == RunStatus::New {
                return Err(m.wrong_status("lease expiry"));
            }
            let class = if dispatched {
                FailureClass::MayHaveActed
            } else {
                FailureClass::NotSent
            };
            let error = format!("lease of attempt {attempt} expired before a result was reported");
            m.on_failure(Failure {
                call_id,
                attempt,
                error,
                class,
                dispatched,
                lease_expired: true,
                status_code: None,
            })?;
        }
        Input::Cancel { reason } => {
            if m.state.status.is_terminal() || m.state.status == RunStatus::New {
                return Err(m.wrong_status("cancel"));
            }
            m.abandon_in_flight(
                "the run was cancelled",
                &format!("its parent run was cancelled: {reason}"),
            )?;
            m.emit(Event::RunCancelled { reason });
            m.command(Command::CancelOpenTasks);
        }
        Input::Signal {
            signal_id,
            name,
            payload,
            sent_by,
        } => {
            if let Some(delivered) = m.state.signal_ids.get(&signal_id) {
                // Applied once already (even if the run has ended since: a
                // sender retrying after a lost reply is told it arrived).
                if *delivered == state::DeliveredSignal::new(&name, &payload) {
                    return Ok(m.out);
                }
                // The same id for another signal: applying it would lose
                // it, answering "duplicate" would tell the sender it
                // arrived.
                return Err(MachineError::SignalIdReused {
                    signal_id,
                    delivered_name: delivered.name.clone(),
                    name,
                });
            }
            if m.state.status.is_terminal() || m.state.status == RunStatus::New {
                return Err(m.wrong_status(&format!("signal `{name}`")));
            }
            m.check_signal(&name, &payload)?;
            m.emit(Event::SignalReceived {
                signal_id,
                name,
                payload,
                sent_by,
            });
            m.take_signal()?;
        }
        Input::TimerFired {
            timer_id,
            overdue_ms,
        } => {
            m.on_timer(&timer_id, overdue_ms)?;
        }
        Input::ChildRunFinished {
            child_run_id,
            status,
            output,
            error,
        } => {
            m.on_child_finished(child_run_id, status, output, error)?;
        }
        Input::DecideApproval {
            node,
            approve,
            edited_subject,
            by,
            grants,
            reason,
        } => {
            // A call id names a tool call's confirmation; anything else a node.
            let call = m.state.tool_calls.get(&node).cloned();
            match call {
                Some(c) if c.awaiting_confirmation.is_some() => {
                    m.on_confirmation(node, approve, edited_subject, by, grants, reason)?
                }
                Some(c) if c.confirmed.is_some() => {
                    let (first_by, approved, seq) = c.confirmed.unwrap_or_default();
                    return Err(MachineError::AlreadyDecided {
                        node,
                        by: first_by,
                        approved,
                        seq,
                    });
                }
                _ => m.on_decision(node, approve, edited_subject, by, grants, reason)?,
            }
        }
    }
    m.stop_on_tool_failure()?;
    m.advance()?;
    Ok(m.out)
}

/// The run id of the child started by `call_id` of `run_id`: a UUID v5
/// (RFC 9562) of `<run_id>/<call_id>` in Belay's namespace, so replaying the
/// history, or starting the child twice, names the same run.
pub fn child_run_id(run_id: &str, call_id: &str) -> String {
    /// Belay's UUID v5 namespace (a fixed random UUID).
    const NAMESPACE: uuid::Uuid = uuid::uuid!("6f1d3c1e-8a53-4c0e-9d3b-6b2a4f3e9c17");
    uuid::Uuid::new_v5(&NAMESPACE, format!("{run_id}/{call_id}").as_bytes()).to_string()
}

/// `ms` as a human duration (`3days`, `1h 30m`), for status reasons.
pub fn show_ms(ms: u64) -> String {
    humantime::format_duration(std::time::Duration::from_millis(ms)).to_string()
}

/// Why starting a node stopped: the machine refused, or the run fails (a
/// template could not be rendered, a `fail` node).
enum Halt {
    Machine(MachineError),
    Fail(String),
}

impl From<MachineError> for Halt {
    fn from(e: MachineError) -> Self {
        Halt::Machine(e)
    }
}

/// A failed attempt, as reported by a worker or implied by a lost lease.
struct Failure {
    call_id: String,
    attempt: u32,
    error: String,
    class: FailureClass,
    dispatched: bool,
    lease_expired: bool,
    status_code: Option<u16>,
}

/// Whether a failed tool-call attempt is within its call's attempts, and
/// the delay before the next one if it is retried.
struct Retries {
    /// Another attempt is allowed by the count (repeat safety and the
    /// failure's class decide whether one is made at all).
    within: bool,
    /// The delay before it, ms.
    delay_ms: u64,
    /// The attempt counted against the tool's `retry_policy` (rather than
    /// the not-sent allowance or the engine's defaults).
    by_policy: bool,
}

/// Working copy of the state plus the decision being built.
struct Step {
    state: RunState,
    out: Decision,
    /// The attempt of a late result being applied, for the resolution event.
    late_attempt: Option<u32>,
    /// The sealed `visibility.trace: false` arguments of the model answer
    /// being applied (`untraced.rs`).
    arg_secrets: Vec<SealedSecret>,
    /// How many calls of the model answer being applied may sample: they
    /// split what is left of the budgets (`sampling.rs`); 1 otherwise.
    sampling_share: u32,
}

impl Step {
    fn emit(&mut self, event: Event) {
        // A wall-time timer is not wanted once what it bounds has ended:
        // delete its row (a firing that races this finds it stale).
        let ended: Vec<TimerSpec> = match &event {
            Event::NodeCompleted { node, .. } => self
                .state
                .node
                .as_ref()
                .filter(|n| &n.id == node)
                .and_then(|n| n.deadline.clone())
                .into_iter()
                .collect(),
            Event::RunCompleted { .. } | Event::RunFailed { .. } | Event::RunCancelled { .. } => [
                self.state.node.as_ref().and_then(|n| n.deadline.clone()),
                self.state.deadline.clone(),
            ]
            .into_iter()
            .flatten()
            .collect(),
            _ => Vec::new(),
        };
        // The run's vault is not wanted once the run has ended.
        if matches!(
            event,
            Event::RunCompleted { .. } | Event::RunFailed { .. } | Event::RunCancelled { .. }
        ) && self.plan_vaults()
            && !self.out.commands.contains(&Command::DropRunSecrets)
        {
            self.command(Command::DropRunSecrets);
        }
        for t in ended {
            if !self
                .out
                .commands
                .iter()
                .any(|c| matches!(c, Command::CancelTimer { timer_id } if *timer_id == t.timer_id))
            {
                self.command(Command::CancelTimer {
                    timer_id: t.timer_id,
                });
            }
        }
        if let Some(processed) = self.process_after(&event) {
            self.state.apply(&processed);
            self.out.events.push(processed);
        }
        self.state.apply(&event);
        let vars = self.outcome_vars(&event);
        if let Some(keep) = self.cache_store(&event) {
            self.command(keep);
        }
        self.out.events.push(event);
        if let Some(vars) = vars {
            self.state.apply(&vars);
            self.out.events.push(vars);
        }
    }

    /// Before a call's result is recorded: its tool's `process.after`,
    /// evaluated over the raw result, as an [`Event::ToolCallProcessed`]
    /// (none for a probe, or a tool without it). See `machine/process.rs`.
    fn process_after(&self, event: &Event) -> Option<Event> {
        let (call_id, result) = match event {
            Event::ToolCallCompleted {
                call_id, result, ..
            } => (call_id, result),
            Event::UncertainOutcomeResolved {
                call_id,
                resolution: ResolutionKind::Succeeded,
                result,
                ..
            } => (call_id, result.as_ref().unwrap_or(&Value::Null)),
            _ => return None,
        };
        let call = self.state.tool_calls.get(call_id)?;
        if call.probe_for.is_some() {
            return None;
        }
        let tool = &self.state.plan.as_ref()?.tools.get(&call.tool)?.def;
        let after = tool.process.as_ref()?.after.as_ref()?;
        let done = process::after(after, &call.arguments, result);
        Some(Event::ToolCallProcessed {
            call_id: call_id.clone(),
            tool: call.tool.clone(),
            stage: "after".to_owned(),
            outcome: done.outcome.to_owned(),
            message: done.message,
            error: done.error,
            result: done.result,
        })
    }

    /// After a call's result or final failure: its tool's `on_result.set`
    /// or `on_error.set`, evaluated over `{"result": ...}` or
    /// `{"error": {"message": ...}}`, as an [`Event::ToolVarsSet`] (none
    /// for a probe, or a tool without them). An expression that fails sets
    /// nothing and is recorded in the event's `errors`; the call itself
    /// keeps its outcome.
    fn outcome_vars(&self, event: &Event) -> Option<Event> {
        let (call_id, input, from) = match event {
            Event::ToolCallCompleted {
                call_id, result, ..
            } => (call_id, json!({ "result": result }), "on_result"),
            Event::ToolCallFailed { call_id, error, .. } => (
                call_id,
                json!({ "error": { "message": error } }),
                "on_error",
            ),
            // An uncertain call resolved (by an operator, a probe or a late
            // result) completes or fails for good here.
            Event::UncertainOutcomeResolved {
                call_id,
                resolution: ResolutionKind::Succeeded,
                result,
                ..
            } => (call_id, json!({ "result": result }), "on_result"),
            Event::UncertainOutcomeResolved {
                call_id,
                resolution: ResolutionKind::Failed,
                error,
                ..
            } => (
                call_id,
                json!({ "error": { "message": error } }),
                "on_error",
            ),
            _ => return None,
        };
        let call = self.state.tool_calls.get(call_id)?;
        if call.probe_for.is_some() {
            return None;
        }
        // `on_result` reads the result as `process.after` made it (the
        // state holds it); a result `after` blocked runs neither.
        let input = if from == "on_result" {
            if call.status != CallStatus::Completed {
                return None;
            }
            json!({ "result": call.result.clone().unwrap_or(Value::Null) })
        } else {
            input
        };
        let tool = &self.state.plan.as_ref()?.tools.get(&call.tool)?.def;
        let exprs = if from == "on_result" {
            &tool.on_result
        } else {
            &tool.on_error
        };
        if exprs.is_empty() {
            return None;
        }
        let mut values = serde_json::Map::new();
        let mut errors = std::collections::BTreeMap::new();
        for (var, expr) in exprs {
            match expr.eval(&input) {
                Ok(value) => {
                    values.insert(var.clone(), value);
                }
                Err(e) => {
                    errors.insert(var.clone(), format!("`{}`: {e}", expr.source()));
                }
            }
        }
        Some(Event::ToolVarsSet {
            call_id: call_id.clone(),
            tool: call.tool.clone(),
            from: from.to_owned(),
            values,
            errors,
        })
    }

    fn command(&mut self, command: Command) {
        self.out.commands.push(command);
    }

    fn wrong_status(&self, detail: &str) -> MachineError {
        MachineError::WrongStatus {
            status: self.state.status.as_str(),
            detail: detail.to_owned(),
        }
    }

    /// Results and failures are recorded while the run is paused too: a
    /// result that arrives is never thrown away.
    fn require_active(&self, what: &str) -> Result<(), MachineError> {
        if matches!(
            self.state.status,
            RunStatus::Running | RunStatus::Paused | RunStatus::Waiting
        ) {
            Ok(())
        } else {
            Err(self.wrong_status(what))
        }
    }

    fn require_open_model_call(&self, call_id: &str) -> Result<(), MachineError> {
        let open = self
            .state
            .node
            .as_ref()
            .and_then(|n| n.model_call.as_ref())
            .is_some_and(|c| c.call_id == call_id);
        if open {
            Ok(())
        } else {
            Err(MachineError::CallNotOpen {
                call_id: call_id.to_owned(),
                detail: "no such open model call".into(),
            })
        }
    }

    fn require_open_tool_call(&self, call_id: &str) -> Result<&state::ToolCallState, MachineError> {
        match self.state.tool_calls.get(call_id) {
            Some(call) if call.status == CallStatus::Open => Ok(call),
            Some(call) => Err(MachineError::CallNotOpen {
                call_id: call_id.to_owned(),
                detail: format!("it is {:?}", call.status).to_lowercase(),
            }),
            None => Err(MachineError::CallNotOpen {
                call_id: call_id.to_owned(),
                detail: "no such tool call".into(),
            }),
        }
    }

    fn plan(&self) -> Result<&RunPlan, MachineError> {
        self.state
            .plan
            .as_deref()
            .ok_or_else(|| MachineError::InvalidPlan("run has no plan".into()))
    }

    /// A handle on the plan, for code that changes the state while it reads
    /// the plan (a reference count, not a copy).
    fn plan_handle(&self) -> Result<std::sync::Arc<RunPlan>, MachineError> {
        self.state
            .plan
            .clone()
            .ok_or_else(|| MachineError::InvalidPlan("run has no plan".into()))
    }

    /// The model answered: record it, then check each proposed call in order.
    /// `callback_timeout_ms` of the call's tool if it is `type: async_webhook`.
    fn callback_timeout_ms(&self, call_id: &str) -> Option<u64> {
        let call = self.state.tool_calls.get(call_id)?;
        match &self.plan().ok()?.tools.get(&call.tool)?.def.binding {
            ToolBindingDef::AsyncWebhook {
                callback_timeout_ms,
                ..
            } => Some(*callback_timeout_ms),
            _ => None,
        }
    }

    fn on_model_result(
        &mut self,
        call_id: String,
        attempt: u32,
        result: ModelCallResult,
    ) -> Result<(), MachineError> {
        let step = self.state.node.as_ref().map(|n| n.model_steps).unwrap_or(0);
        // Tool-use ids must be unique within the turn so each gets exactly one result.
        let mut seen = std::collections::BTreeSet::new();
        let tool_calls: Vec<ToolUse> = result
            .tool_calls
            .into_iter()
            .enumerate()
            .map(|(i, tu)| {
                let id = normalize::strip_nul(&tu.id);
                let id = if id.is_empty() || seen.contains(&id) {
                    format!("belay_{step}_{i}")
                } else {
                    id
                };
                seen.insert(id.clone());
                ToolUse {
                    id,
                    name: normalize::strip_nul(&tu.name),
                    arguments: normalize::strip_nul(&tu.arguments),
                }
            })
            .collect();
        let finish_reason = result.finish_reason.map(|r| normalize::strip_nul(&r));
        let cut_off = finish_reason.as_deref() == Some("length");
        self.emit(Event::ModelCallCompleted {
            call_id: call_id.clone(),
            attempt,
            content: result.content.map(|c| normalize::strip_nul(&c)),
            tool_calls: tool_calls.clone(),
            usage: result.usage,
            finish_reason,
        });
        self.command(Command::EndTask {
            call_id,
            end: TaskEnd::Completed,
        });
        let one_call = self
            .current_agent_def()
            .is_some_and(|a| a.loop_policy == LoopPolicy::ExactlyOneCall);
        // The calls of this turn whose tools may sample split what is left
        // of the budgets.
        self.sampling_share = self.state.plan.as_deref().map_or(1, |plan| {
            let n = tool_calls
                .iter()
                .filter(|t| {
                    plan.tools
                        .get(&t.name)
                        .is_some_and(|t| t.def.sampling.is_some())
                })
                .count();
            u32::try_from(n).unwrap_or(u32::MAX).max(1)
        });
        let mut stop = None;
        for tool_use in tool_calls {
            if cut_off {
                // The arguments of a cut-off turn may be cut off too: nothing
                // of it runs.
                self.refuse(
                    &tool_use,
                    "truncated",
                    "the turn was cut off by the output token limit (finish_reason `length`), so its tool calls are not executed; propose them again in a shorter answer".into(),
                );
            } else if one_call {
                self.refuse(
                    &tool_use,
                    "loop_policy",
                    "this agent makes exactly one model call (`exactly_one_call`); a tool call would need a second one".into(),
                );
                if stop.is_none() {
                    stop = Some(tool_use.name.clone());
                }
            } else if self.state.status == RunStatus::Running
                || self.state.status == RunStatus::Waiting
            {
                self.check_and_schedule(tool_use)?;
            }
        }
        if let (Some(tool), Some(node)) = (stop, self.state.node.as_ref().map(|n| n.id.clone())) {
            self.fail_run_stop(
                format!(
                    "node `{node}` runs its agent with `exactly_one_call`, and the model proposed tool `{tool}`, which would need a second model call"
                ),
                Stop::LoopPolicy { node, tool },
            );
        }
        Ok(())
    }

    /// The agent of the running agent node, if any.
    fn current_agent_def(&self) -> Option<&AgentDef> {
        let node = self.state.node.as_ref()?;
        Some(&self.state.plan.as_ref()?.agents.get(&node.agent)?.def)
    }

    /// Refuse a proposed call (`check` failed): the reason goes back to
    /// the model as the call's result.
    fn refuse(&mut self, tool_use: &ToolUse, check: &str, reason: String) {
        let node = self
            .state
            .node
            .as_ref()
            .map(|n| n.id.clone())
            .unwrap_or_default();
        self.emit(Event::ToolCallRefused {
            node,
            tool_use_id: tool_use.id.clone(),
            tool: tool_use.name.clone(),
            check: check.to_owned(),
            reason,
        });
    }

    /// `on_tool_failure: stop`: a call of the running agent that failed for
    /// good in this decision stops the run (a declined confirmation is the
    /// person's answer, not a failure: the model hears it).
    fn stop_on_tool_failure(&mut self) -> Result<(), MachineError> {
        if self.state.status.is_terminal() {
            return Ok(());
        }
        let Some(node) = self.state.node.as_ref() else {
            return Ok(());
        };
        if self
            .current_agent_def()
            .is_none_or(|a| a.on_tool_failure != OnToolFailure::Stop)
        {
            return Ok(());
        }
        let failed = self.out.events.iter().find_map(|e| match e {
            Event::ToolCallFailed { call_id, .. } => {
                let call = self.state.tool_calls.get(call_id)?;
                let declined = call.confirmed.as_ref().is_some_and(|(_, ok, _)| !ok);
                (call.node == node.id && !declined && call.probe_for.is_none())
                    .then(|| (call_id.clone(), call.tool.clone()))
            }
            _ => None,
        });
        if let Some((call_id, tool)) = failed {
            let node = node.id.clone();
            self.fail_run_stop(
                format!(
                    "tool `{tool}` (call `{call_id}`) failed, and the agent of node `{node}` stops on a tool failure (`on_tool_failure: stop`)"
                ),
                Stop::ToolFailed {
                    node,
                    call_id,
                    tool,
                },
            );
        }
        Ok(())
    }

    /// The four checks of DESIGN.md, in order; the first failure refuses the call.
    fn check_and_schedule(&mut self, tool_use: ToolUse) -> Result<(), MachineError> {
        let node = self
            .state
            .node
            .as_ref()
            .ok_or_else(|| MachineError::InvalidPlan("no node is running".into()))?;
        let node_id = node.id.clone();
        let plan = self.plan()?;
        let agent = plan.agents.get(&node.agent).ok_or_else(|| {
            MachineError::InvalidPlan(format!("agent `{}` not pinned", node.agent))
        })?;
        let node_def = plan.workflow.def.nodes.iter().find(|n| n.id == node_id);
        let refuse = |check: &str, reason: String| Event::ToolCallRefused {
            node: node_id.clone(),
            tool_use_id: tool_use.id.clone(),
            tool: tool_use.name.clone(),
            check: check.to_owned(),
            reason,
        };

        // 1. On the node's list.
        let tool = match (
            agent.def.tools.iter().any(|t| t == &tool_use.name),
            plan.tools.get(&tool_use.name),
        ) {
            (true, Some(tool)) => tool,
            _ => {
                let event = refuse(
                    "not_on_list",
                    format!(
                        "tool `{}` is not available here; available tools: {}",
                        tool_use.name,
                        agent.def.tools.join(", ")
                    ),
                );
                self.emit(event);
                return Ok(());
            }
        };

        // 2. Arguments decode into the input type within the size limit
        // (the type the model sees: parameters it does not supply are
        // refused), then those parameters are filled in.
        // An agent that redacts PII: tokens get their data back, where the
        // tool's `pii_access` allows (`pii.rs`), before anything is checked.
        let restored = match self.state.node.as_ref() {
            Some(node) if !agent.def.pii_redaction.is_empty() => {
                // The table as the model's request was built (`pii.rs`).
                match pii::Redactor::new(&node.pii, &agent.def.pii_redaction)
                    .restore_arguments(&tool_use.arguments, tool.def.pii_access)
                {
                    Ok(arguments) => Some(arguments),
                    Err(refusal) => {
                        let event = refuse("pii_access", refusal.reason(&tool_use.name));
                        self.emit(event);
                        return Ok(());
                    }
                }
            }
            _ => None,
        };
        let raw_arguments = restored.as_deref().unwrap_or(&tool_use.arguments);
        let limit = agent.def.max_argument_bytes as usize;
        let mut arguments = match decode_arguments(raw_arguments, limit, &tool.def) {
            Ok(args) => args,
            Err(reason) => {
                let event = refuse("invalid_arguments", reason);
                self.emit(event);
                return Ok(());
            }
        };
        // `visibility.trace: false` arguments: placeholders, each with its
        // sealed value (else the call is refused before it can act).
        let untraced_values = match untraced::sealed_for(&tool.def, &arguments, &self.arg_secrets) {
            Ok(values) => values,
            Err((check, reason)) => {
                let event = refuse(check, reason);
                self.emit(event);
                return Ok(());
            }
        };
        // What the model chose, for `max_identical_calls` below.
        let chosen = arguments.clone();
        let call_id = self
            .state
            .node
            .as_ref()
            .map(|n| format!("{}.t{}", n.prefix, n.tool_calls + 1))
            .unwrap_or_default();
        let key = idempotency_key(&self.state.run_id, &call_id);
        if let Value::Object(map) = &mut arguments {
            let facts = inject::CallFacts {
                run_id: &self.state.run_id,
                node_id: &node_id,
                call_id: &call_id,
                idempotency_key: &key,
                tenant: &self.state.tenant,
                caller: &self.state.caller,
                now: self.state.now,
            };
            if let Err(reason) = inject::inject(&tool.def, map, &self.state.document(), &facts) {
                let event = refuse(
                    "parameter_source",
                    format!("tool `{}` cannot be called here: {reason}", tool_use.name),
                );
                self.emit(event);
                return Ok(());
            }
        }
        // The tool's `process.before`: preconditions, computed parameters.
        let mut before_skipped = None;
        if let (Some(before), Value::Object(map)) = (
            tool.def.process.as_ref().and_then(|p| p.before.as_ref()),
            &arguments,
        ) {
            match process::before(&tool.def, before, map) {
                process::Before::Go {
                    arguments: computed,
                    skipped,
                } => {
                    arguments = Value::Object(computed);
                    before_skipped = skipped;
                }
                process::Before::Refuse {
                    check,
                    reason,
                    fail_run,
                } => {
                    let event = refuse(check, reason);
                    self.emit(event);
                    if let Some(error) = fail_run {
                        self.fail_run(error);
                    }
                    return Ok(());
                }
            }
        }
        // The request the call sends, chosen from the arguments as sent.
        let variant = match variants::choose(&tool.def, &arguments) {
            Ok(variant) => variant,
            Err(reason) => {
                let event = refuse("request_variant", format!("{reason}; nothing was sent"));
                self.emit(event);
                return Ok(());
            }
        };

        // 3. Permission granted to node, caller and tenant.
        let permission = &tool.def.permission;
        let node_has = agent.def.grants.contains(permission)
            || node_def.is_some_and(|n| n.grants.contains(permission));
        let missing: Vec<&str> = [
            ("node", node_has),
            ("caller", self.state.caller_grants.contains(permission)),
            ("tenant", self.state.tenant_grants.contains(permission)),
        ]
        .into_iter()
        .filter(|(_, ok)| !ok)
        .map(|(who, _)| who)
        .collect();
        if !missing.is_empty() {
            let event = refuse(
                "permission",
                format!(
                    "tool `{}` needs permission `{permission}`, which is not granted to the {}",
                    tool_use.name,
                    missing.join(", ")
                ),
            );
            self.emit(event);
            return Ok(());
        }

        // 4. Budget has room.
        let (_, max_tool_calls) = agent.def.loop_policy.bounds();
        let node_state = self
            .state
            .node
            .as_ref()
            .ok_or_else(|| MachineError::InvalidPlan("no node is running".into()))?;
        if let Some(run_max) = plan.workflow.def.budget.max_tool_calls
            && self.state.totals.tool_calls >= run_max
        {
            let event = refuse(
                "budget",
                format!(
                    "the tool call budget of this run is used up ({run_max} calls); answer with what you have"
                ),
            );
            self.emit(event);
            return Ok(());
        }
        if node_state.tool_calls >= max_tool_calls {
            let event = refuse(
                "budget",
                format!(
                    "the tool call budget of this agent is used up ({max_tool_calls} calls); answer with what you have"
                ),
            );
            self.emit(event);
            return Ok(());
        }
        if let Some(max_tokens) = agent.def.budget.max_tokens
            && node_state.tokens >= max_tokens
        {
            let event = refuse(
                "budget",
                format!("the token budget of this agent is used up ({max_tokens} tokens)"),
            );
            self.emit(event);
            return Ok(());
        }

        // The same call, again and again, is not progress.
        let max_identical = agent.def.max_identical_calls;
        if max_identical > 0
            && let Some((tool_name, args, times)) = &node_state.last_call
            && tool_name == &tool_use.name
            && args == &chosen
            && times + 1 >= max_identical
        {
            let times = times + 1;
            let event = refuse(
                "no_progress",
                format!("the same call was proposed {times} times in a row"),
            );
            let tool = tool_use.name.clone();
            self.emit(event);
            self.fail_run_stop(
                format!(
                    "the model proposed the same call of tool `{tool}` {times} times in a row in node `{node_id}` without progress (`max_identical_calls: {max_identical}`)"
                ),
                Stop::NoProgress {
                    node: node_id,
                    tool,
                    times,
                },
            );
            return Ok(());
        }
        let child = matches!(tool.def.binding, ToolBindingDef::Workflow { .. })
            .then(|| (tool.def.binding.clone(), arguments.clone()));
        let spec = match child {
            None => Some(self.with_sampling(
                tool_spec(tool, &arguments, &key, variant.as_deref())?,
                &node_id,
                &tool.def,
            )),
            Some(_) => None,
        };
        let repeat_safety = tool.def.repeat_safety;
        let event = Event::ToolCallScheduled {
            node: node_id.clone(),
            call_id: call_id.clone(),
            tool_use_id: tool_use.id.clone(),
            tool: tool.def.name.clone(),
            tool_version: tool.version,
            arguments,
            idempotency_key: key.clone(),
            repeat_safety,
            variant,
        };
        let confirmation = tool.def.confirmation.clone();
        let tool_name = tool.def.name.clone();
        self.emit(event);
        self.vault_arguments(&call_id, &tool_name, untraced_values);
        if let Some((outcome, message, why)) = before_skipped {
            self.emit(Event::ToolCallProcessed {
                call_id: call_id.clone(),
                tool: tool_name.clone(),
                stage: "before".to_owned(),
                outcome: outcome.to_owned(),
                message,
                error: Some(why),
                result: None,
            });
        }
        if let Some(confirmation) = confirmation {
            self.request_confirmation(&node_id, &call_id, &tool_name, &confirmation);
            return Ok(());
        }
        self.launch_call(&node_id, &call_id, key, repeat_safety, spec, child);
        Ok(())
    }

    /// A call of a tool with `confirmation:`: nothing is dispatched until a
    /// person decides ([`Step::on_confirmation`]).
    fn request_confirmation(
        &mut self,
        node: &str,
        call_id: &str,
        tool: &str,
        confirmation: &belay_definitions::model::ConfirmationDef,
    ) {
        let arguments = self
            .state
            .tool_calls
            .get(call_id)
            .map(|c| c.arguments.clone())
            .unwrap_or(Value::Null);
        self.emit(Event::ConfirmationRequested {
            node: node.to_owned(),
            call_id: call_id.to_owned(),
            tool: tool.to_owned(),
            arguments,
            approver_grant: confirmation.approver_grant.clone(),
            immutable_params: confirmation.immutable_params.clone(),
        });
    }

    /// Start a scheduled call: its task (a worker's tool) or its child run
    /// (a `type: workflow` tool).
    fn launch_call(
        &mut self,
        node_id: &str,
        call_id: &str,
        key: String,
        repeat_safety: RepeatSafety,
        spec: Option<Value>,
        child: Option<(ToolBindingDef, Value)>,
    ) {
        match (spec, child) {
            (Some(spec), _) => {
                if let Some(key) = self.cache_key_of(call_id) {
                    self.command(Command::LookupToolCache {
                        call_id: call_id.to_owned(),
                        key,
                    });
                }
                self.command(Command::ScheduleTask {
                    call_id: call_id.to_owned(),
                    kind: TaskKind::ToolCall,
                    spec,
                    idempotency_key: key,
                    repeat_safety: Some(repeat_safety),
                    runs_while_paused: false,
                })
            }
            (None, Some((binding, arguments))) => {
                self.start_tool_child(node_id, call_id, &binding, &arguments)
            }
            (None, None) => {}
        }
    }

    /// A decision on a call's confirmation (`DecideApproval` naming the
    /// call id): the approver needs the grant; edits may not touch
    /// immutable params and must match the tool's input type; the call then
    /// runs with exactly the approved arguments, or fails with "the user
    /// declined".
    #[allow(clippy::too_many_arguments)]
    fn on_confirmation(
        &mut self,
        call_id: String,
        approve: bool,
        edited: Option<Value>,
        by: String,
        grants: Vec<String>,
        reason: String,
    ) -> Result<(), MachineError> {
        let call = self.require_open_tool_call(&call_id)?.clone();
        let Some((grant, immutable)) = call.awaiting_confirmation.clone() else {
            return Err(MachineError::NotWaiting(format!(
                "call `{call_id}` does not wait for a confirmation"
            )));
        };
        if !grants.contains(&grant) {
            return Err(MachineError::NotAllowed(format!(
                "confirming call `{call_id}` of tool `{}` needs the grant `{grant}`",
                call.tool
            )));
        }
        let plan = self.plan_handle()?;
        let tool = plan
            .tools
            .get(&call.tool)
            .ok_or_else(|| MachineError::InvalidPlan(format!("tool `{}` not pinned", call.tool)))?;
        let (arguments, was_edited) = match (approve, edited) {
            (true, Some(edit)) => {
                let Value::Object(mut map) = normalize::strip_nul_value(edit) else {
                    return Err(MachineError::InvalidEdit {
                        node: call_id,
                        errors: vec!["/: the edited arguments must be a JSON object".into()],
                    });
                };
                let mut errors: Vec<String> = immutable
                    .iter()
                    .filter(|p| map.get(p.as_str()) != call.arguments.get(p.as_str()))
                    .map(|p| {
                        format!(
                            "/{p}: `{p}` is immutable (`immutable_params`) and may not be edited"
                        )
                    })
                    .collect();
                // Injected parameters are the definition's, not the
                // approver's: one left out is filled in again, one written
                // must be what it was. They are computed again from the
                // edited arguments (an `expr` or `lookup` reading `.args`
                // follows the edit), so what runs is what the decision
                // records.
                for p in &tool.def.injected {
                    if let Some(v) = map.remove(&p.name)
                        && Some(&v) != call.arguments.get(&p.name)
                    {
                        errors.push(format!(
                            "/{0}: `{0}` is filled in by the tool's definition (`source:` or `hidden:`), not by the approver; leave it out",
                            p.name
                        ));
                    }
                }
                // Parameters `process.before` computed are the
                // definition's too: computed again from the edit below.
                let before = tool.def.process.as_ref().and_then(|p| p.before.as_ref());
                for name in before.iter().flat_map(|b| b.params.keys()) {
                    if let Some(v) = map.remove(name)
                        && Some(&v) != call.arguments.get(name)
                    {
                        errors.push(format!(
                            "/{name}: `{name}` is computed by the tool's `process.before`, not by the approver; leave it out"
                        ));
                    }
                }
                fill_defaults(&mut map, tool.def.model_schema());
                if errors.is_empty() {
                    let facts = inject::CallFacts {
                        run_id: &self.state.run_id,
                        node_id: &call.node,
                        call_id: &call_id,
                        idempotency_key: &call.idempotency_key,
                        tenant: &self.state.tenant,
                        caller: &self.state.caller,
                        now: self.state.now,
                    };
                    match inject::inject(&tool.def, &mut map, &self.state.document(), &facts) {
                        Ok(()) => inject::keep_proposal_time(&tool.def, &call.arguments, &mut map),
                        Err(reason) => errors.push(format!("/: {reason}")),
                    }
                }
                let mut value = Value::Object(map);
                if let Err(e) = belay_definitions::validate_json(&tool.def.input_schema, &value) {
                    errors.extend(e);
                }
                // `process.before` over the edited arguments: a refusal
                // (or a stage that fails) refuses the edit; `warn` and
                // `use_original` keep the edit as written.
                if errors.is_empty()
                    && let (Some(before), Value::Object(map)) = (before, &value)
                {
                    match process::before(&tool.def, before, map) {
                        process::Before::Go { arguments, .. } => value = Value::Object(arguments),
                        process::Before::Refuse { reason, .. } => errors.push(format!(
                            "/: the tool's `process.before` refuses the edited arguments: {reason}"
                        )),
                    }
                }
                if !errors.is_empty() {
                    return Err(MachineError::InvalidEdit {
                        node: call_id,
                        errors,
                    });
                }
                let changed = value != call.arguments;
                (value, changed)
            }
            (true, None) => (call.arguments.clone(), false),
            (false, _) => (Value::Null, false),
        };
        // The request the approved arguments send: chosen again after an
        // edit (a `when` that fails refuses the edit, nothing is decided).
        let variant = match (approve, was_edited) {
            (true, true) => variants::choose(&tool.def, &arguments).map_err(|reason| {
                MachineError::InvalidEdit {
                    node: call_id.clone(),
                    errors: vec![format!("/: {reason}")],
                }
            })?,
            (true, false) => call.variant.clone(),
            (false, _) => None,
        };
        self.emit(Event::ConfirmationDecided {
            call_id: call_id.clone(),
            approved: approve,
            by: by.clone(),
            reason: reason.clone(),
            arguments: arguments.clone(),
            edited: was_edited,
            variant: variant.clone(),
        });
        if !approve {
            self.emit(Event::ToolCallFailed {
                call_id,
                attempt: 0,
                error: if reason.trim().is_empty() {
                    format!("the user declined (decided by {by})")
                } else {
                    format!("the user declined (decided by {by}): {reason}")
                },
            });
            return Ok(());
        }
        let key = call.idempotency_key.clone();
        let child = matches!(tool.def.binding, ToolBindingDef::Workflow { .. })
            .then(|| (tool.def.binding.clone(), arguments.clone()));
        let spec = match child {
            None => Some(self.with_sampling(
                tool_spec(tool, &arguments, &key, variant.as_deref())?,
                &call.node,
                &tool.def,
            )),
            Some(_) => None,
        };
        self.launch_call(&call.node, &call_id, key, call.repeat_safety, spec, child);
        Ok(())
    }

    /// Start a child run for `call_id` (a `workflow` node's `<node>.c1`, or a
    /// `type: workflow` tool's call): the event, the outbox command and, for
    /// a sync child with a timeout, its timer `timer_id`. Returns the child's
    /// id and whether the caller waits for it.
    #[allow(clippy::too_many_arguments)]
    fn start_child(
        &mut self,
        node: &str,
        call_id: &str,
        workflow: &str,
        input: Value,
        mode: ChildMode,
        timeout_ms: Option<u64>,
        timer_id: String,
    ) -> (String, bool) {
        let child_run_id = child_run_id(&self.state.run_id, call_id);
        let sync = mode == ChildMode::Sync;
        let timer = timeout_ms.filter(|_| sync).map(|ms| TimerSpec {
            timer_id,
            after_ms: Some(ms),
            at: None,
            purpose: TimerPurpose::Timeout,
        });
        self.emit(Event::ChildRunStarted {
            node: node.to_owned(),
            call_id: call_id.to_owned(),
            child_run_id: child_run_id.clone(),
            workflow: workflow.to_owned(),
            input: input.clone(),
            mode,
            timer: timer.clone(),
        });
        self.command(Command::StartChildRun {
            call_id: call_id.to_owned(),
            child_run_id: child_run_id.clone(),
            workflow: workflow.to_owned(),
            input,
            sync,
        });
        if let Some(timer) = timer {
            self.command(Command::ScheduleTimer(timer));
        }
        (child_run_id, sync)
    }

    /// A call of a `type: workflow` tool: start its child run (no task);
    /// `sync` leaves the call open until the child ends, `async` completes
    /// it at once with `{"run_id"}`.
    fn start_tool_child(
        &mut self,
        node: &str,
        call_id: &str,
        binding: &ToolBindingDef,
        arguments: &Value,
    ) {
        let ToolBindingDef::Workflow {
            workflow,
            mode,
            timeout_ms,
            param_mapping,
        } = binding
        else {
            return;
        };
        let input = if param_mapping.is_empty() {
            arguments.clone()
        } else {
            Value::Object(
                param_mapping
                    .iter()
                    .map(|(key, param)| {
                        (
                            key.clone(),
                            arguments.get(param).cloned().unwrap_or(Value::Null),
                        )
                    })
                    .collect(),
            )
        };
        let (child_run_id, sync) = self.start_child(
            node,
            call_id,
            workflow,
            input,
            *mode,
            *timeout_ms,
            format!("{call_id}.timeout"),
        );
        if !sync {
            self.emit(Event::ToolCallCompleted {
                call_id: call_id.to_owned(),
                attempt: 0,
                result: json!({"run_id": child_run_id}),
                cached: None,
            });
        }
    }

    fn on_dispatch(
        &mut self,
        call_id: String,
        attempt: u32,
        worker_id: String,
        callback_token_sha256: Option<String>,
        tenant_grants: Option<Vec<String>>,
    ) -> Result<(), MachineError> {
        let call = self.require_open_tool_call(&call_id)?.clone();
        // Reconcile probes run while the run is paused on what they look up;
        // everything else only while it runs.
        // A run `waiting` on one call's child or callback still runs the
        // other calls of the same turn.
        let allowed = match self.state.status {
            RunStatus::Running | RunStatus::Waiting => true,
            RunStatus::Paused => call.probe_for.is_some(),
            _ => false,
        };
        if !allowed {
            return Err(self.wrong_status("dispatch"));
        }
        let is_webhook = self.plan().is_ok_and(|p| {
            p.tools
                .get(&call.tool)
                .is_some_and(|t| matches!(t.def.binding, ToolBindingDef::AsyncWebhook { .. }))
        });
        let issue_callback = |m: &mut Step| -> Result<(), MachineError> {
            if !is_webhook {
                return Ok(());
            }
            let Some(token_sha256) = callback_token_sha256.clone() else {
                return Err(MachineError::DispatchUnavailable {
                    call_id: call_id.clone(),
                    detail: format!(
                        "tool `{}` is `type: async_webhook`, and this engine serves no callback endpoint (start it with --callback-listen)",
                        call.tool
                    ),
                });
            };
            m.emit(Event::CallbackIssued {
                call_id: call_id.clone(),
                attempt,
                token_sha256: token_sha256.clone(),
            });
            m.command(Command::RegisterCallback {
                call_id: call_id.clone(),
                token_sha256,
            });
            Ok(())
        };
        if call.dispatched_attempt == Some(attempt) {
            // The same attempt asking again (its reply was lost): already
            // recorded. An async webhook gets a fresh token, as the first
            // reply (and its token) never reached the worker; a consumer of
            // the vault gets its values again (the call consumed them).
            self.restore_secrets(&call_id, &call.tool);
            return issue_callback(self);
        }
        if call.may_have_acted && call.repeat_safety != RepeatSafety::Idempotent {
            return Err(MachineError::DispatchRefused {
                call_id,
                detail: format!(
                    "a `{}` tool is dispatched at most once",
                    call.repeat_safety.as_str()
                ),
            });
        }
        // Permission again, immediately before the tool acts: the node's
        // grants (agent + node, as pinned), the caller's, and the tenant's
        // as they are now (a grant withdrawn since the proposal refuses it).
        let tenant_grants = tenant_grants.as_ref().unwrap_or(&self.state.tenant_grants);
        let (permission, missing) = self.missing_grants(&call, tenant_grants)?;
        if !missing.is_empty() {
            return Err(MachineError::DispatchRefused {
                call_id,
                detail: format!(
                    "permission `{permission}` is no longer granted to the {}",
                    missing.join(", ")
                ),
            });
        }
        let plan = self.plan()?;
        let gates = plan
            .tools
            .get(&call.tool)
            .map(|t| ToolGates::of(&t.def))
            .unwrap_or_default();
        self.emit(Event::ToolCallDispatched {
            call_id: call_id.clone(),
            attempt,
            worker_id,
        });
        issue_callback(self)?;
        self.restore_secrets(&call_id, &call.tool);
        self.command(Command::MarkDispatched { call_id, attempt });
        if gates.any() {
            // Last: every other check passed, so a turn taken is used.
            self.command(Command::PassToolGates {
                tool: call.tool.clone(),
                gates,
                holds_turn: call.holds_turn,
            });
        }
        Ok(())
    }

    /// The permission of `call`'s tool and who of node, caller and tenant
    /// (`tenant_grants`: the tenant's grants now) lacks it, for the check
    /// right before a tool acts (or its cached result is served). A
    /// reconcile probe is the engine's own lookup, declared by the tool's
    /// author: tenant policy applies, the node's and the caller's do not.
    fn missing_grants(
        &self,
        call: &state::ToolCallState,
        tenant_grants: &[String],
    ) -> Result<(String, Vec<&'static str>), MachineError> {
        let plan = self.plan()?;
        let permission = plan
            .tools
            .get(&call.tool)
            .map(|t| t.def.permission.clone())
            .ok_or_else(|| MachineError::InvalidPlan(format!("tool `{}` not pinned", call.tool)))?;
        let node_def = plan.workflow.def.nodes.iter().find(|n| n.id == call.node);
        let agent_has = node_def
            .and_then(|n| match &n.kind {
                NodeKind::Agent { agent, .. } => plan.agents.get(agent),
                _ => None,
            })
            .is_some_and(|a| a.def.grants.contains(&permission));
        let node_has = agent_has || node_def.is_some_and(|n| n.grants.contains(&permission));
        let probe = call.probe_for.is_some();
        let missing = [
            ("node", probe || node_has),
            (
                "caller",
                probe || self.state.caller_grants.contains(&permission),
            ),
            ("tenant", tenant_grants.contains(&permission)),
        ]
        .into_iter()
        .filter(|(_, ok)| !ok)
        .map(|(who, _)| who)
        .collect();
        Ok((permission, missing))
    }

    /// The cache key of call `call_id` when its result may come from, and
    /// go to, the tenant's tool cache ([`cache`]): a call of a tool whose
    /// [`ToolDef::cache_ttl_ms`] is set, not a reconcile probe, and one that
    /// has not asked a person for input (its result then depends on the
    /// answers, which its arguments do not hold).
    fn cache_key_of(&self, call_id: &str) -> Option<String> {
        let call = self.state.tool_calls.get(call_id)?;
        if call.probe_for.is_some() || call.input_rounds > 0 {
            return None;
        }
        let tool = self.state.plan.as_ref()?.tools.get(&call.tool)?;
        tool.def.cache_ttl_ms(cache::DEFAULT_TOOL_CACHE_TTL_MS)?;
        Some(cache::key(&self.state.tenant, tool, &call.arguments))
    }

    /// A call just completed by `event` (a result the tool gave: not a
    /// cached one) whose result goes to the tenant's tool cache: the
    /// command that keeps it. A result larger than
    /// [`cache::MAX_CACHED_RESULT_BYTES`] is not kept.
    fn cache_store(&self, event: &Event) -> Option<Command> {
        let Event::ToolCallCompleted {
            call_id,
            result,
            cached: None,
            ..
        } = event
        else {
            return None;
        };
        let key = self.cache_key_of(call_id)?;
        let call = self.state.tool_calls.get(call_id)?;
        let tool = self.state.plan.as_ref()?.tools.get(&call.tool)?;
        let ttl_ms = tool.def.cache_ttl_ms(cache::DEFAULT_TOOL_CACHE_TTL_MS)?;
        if serde_json::to_string(result).map_or(true, |t| t.len() > cache::MAX_CACHED_RESULT_BYTES)
        {
            return None;
        }
        Some(Command::StoreToolCache {
            key,
            tool: call.tool.clone(),
            call_id: call_id.clone(),
            result: result.clone(),
            ttl_ms,
        })
    }

    /// The store found a live entry for a call launched in the decision
    /// before this one (same transaction): the call completes with it, as
    /// a `tool_call_completed` marked `cached`, with no attempt (0), no
    /// task and no dispatch. The checks a dispatch makes right before the
    /// tool acts are made here too (the run runs, the call is open and not
    /// under way, the tenant's grants now); the entry must be the call's
    /// key and of the tool's declared return type. Any refusal leaves the
    /// call to its task, as if the cache had no entry.
    fn on_cache_hit(
        &mut self,
        call_id: String,
        entry: cache::CacheEntry,
        tenant_grants: &[String],
    ) -> Result<(), MachineError> {
        if !matches!(self.state.status, RunStatus::Running | RunStatus::Waiting) {
            return Err(self.wrong_status("serving a cached result"));
        }
        let call = self.require_open_tool_call(&call_id)?.clone();
        if call.dispatched_attempt.is_some()
            || call.failed_attempts > 0
            || call.awaiting_confirmation.is_some()
            || call.awaiting_input.is_some()
        {
            return Err(MachineError::CallNotOpen {
                call_id,
                detail: "it is under way, so it is not served from the cache".into(),
            });
        }
        if self.cache_key_of(&call_id).as_deref() != Some(entry.key.as_str()) {
            return Err(MachineError::CallNotOpen {
                call_id,
                detail: "the cache entry is not this call's".into(),
            });
        }
        let (permission, missing) = self.missing_grants(&call, tenant_grants)?;
        if !missing.is_empty() {
            return Err(MachineError::DispatchRefused {
                call_id,
                detail: format!(
                    "permission `{permission}` is no longer granted to the {}",
                    missing.join(", ")
                ),
            });
        }
        let tool =
            self.plan()?.tools.get(&call.tool).ok_or_else(|| {
                MachineError::InvalidPlan(format!("tool `{}` not pinned", call.tool))
            })?;
        if let Err(errors) =
            belay_definitions::validate_json(&tool.def.output_schema, &entry.result)
        {
            return Err(MachineError::InvalidResult {
                tool: call.tool.clone(),
                errors,
            });
        }
        let at = |t: chrono::DateTime<chrono::Utc>| {
            t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
        };
        self.emit(Event::ToolCallCompleted {
            call_id,
            attempt: 0,
            result: entry.result,
            cached: Some(cache::CachedResult {
                key: entry.key,
                stored_by_run: entry.stored_by_run,
                stored_by_call: entry.stored_by_call,
                stored_at: at(entry.stored_at),
                expires_at: at(entry.expires_at),
            }),
        });
        Ok(())
    }

    /// The tool's gates held back a dispatch [`Step::on_dispatch`] allowed
    /// (the store decides again with this, in the same transaction). A
    /// deferral puts the task back until its turn and is no attempt; an
    /// open circuit fails the call as not sent and refused, so the model
    /// (or a tool node's `on_error`) hears it at once.
    fn on_dispatch_gated(
        &mut self,
        call_id: String,
        attempt: u32,
        worker_id: String,
        verdict: GateVerdict,
    ) -> Result<(), MachineError> {
        let call = self.require_open_tool_call(&call_id)?.clone();
        let reason = verdict.describe(&call.tool);
        match verdict {
            GateVerdict::Defer {
                delay_ms, until, ..
            } => {
                self.emit(Event::ToolCallDeferred {
                    call_id: call_id.clone(),
                    attempt,
                    worker_id,
                    until,
                    reason,
                });
                self.command(Command::RetryTask { call_id, delay_ms });
                Ok(())
            }
            GateVerdict::CircuitOpen { .. } => self.on_failure(Failure {
                call_id,
                attempt,
                error: reason,
                class: FailureClass::Rejected,
                dispatched: false,
                lease_expired: false,
                status_code: None,
            }),
        }
    }

    /// A reported outcome of a call of a tool with a `circuit_breaker:`
    /// moves its circuit ([`Command::RecordToolOutcome`]); other tools cost
    /// nothing.
    fn record_tool_outcome(&mut self, call_id: &str, failed: bool) {
        let Some(tool) = self.state.tool_calls.get(call_id).map(|c| c.tool.clone()) else {
            return;
        };
        let breaker = self
            .plan()
            .ok()
            .and_then(|p| p.tools.get(&tool))
            .and_then(|t| t.def.circuit_breaker);
        if let Some(circuit_breaker) = breaker {
            self.command(Command::RecordToolOutcome {
                tool,
                circuit_breaker,
                failed,
            });
        }
    }

    /// A callback of a `type: async_webhook` call: its result, once. An
    /// open call completes (whether or not the worker has reported the
    /// acceptance yet); an uncertain one is resolved by it; a call that
    /// already ended keeps it as history. The token is used up in every case,
    /// so a replay changes nothing.
    fn on_callback(&mut self, token_sha256: &str, payload: Value) -> Result<(), MachineError> {
        let Some((call_id, call, attempt, used)) =
            self.state.tool_calls.iter().find_map(|(id, c)| {
                c.callback_tokens
                    .get(token_sha256)
                    .map(|(attempt, used)| (id.clone(), c.clone(), *attempt, *used))
            })
        else {
            return Err(MachineError::CallNotOpen {
                call_id: String::new(),
                detail: "no call of this run issued that callback token".into(),
            });
        };
        if used {
            return Ok(());
        }
        // Only a result that will be applied is checked against the tool's
        // type (a late one is kept as it came).
        let applies = !self.state.status.is_terminal()
            && matches!(call.status, CallStatus::Open | CallStatus::Uncertain);
        if applies {
            let plan = self.plan()?;
            let tool = plan.tools.get(&call.tool).ok_or_else(|| {
                MachineError::InvalidPlan(format!("tool `{}` not pinned", call.tool))
            })?;
            belay_definitions::validate_json(&tool.def.output_schema, &payload).map_err(
                |errors| MachineError::InvalidResult {
                    tool: call.tool.clone(),
                    errors,
                },
            )?;
        }
        let payload = self.scrubbed(&call_id, payload);
        self.emit(Event::CallbackReceived {
            call_id: call_id.clone(),
            attempt,
            token_sha256: token_sha256.to_owned(),
        });
        if self.state.status.is_terminal() {
            self.emit(Event::LateResultRecorded {
                call_id,
                attempt,
                result: payload,
                discrepancy: Some(format!(
                    "the callback for attempt {attempt} arrived after the run was {}; it is kept here, not applied",
                    self.state.status.as_str()
                )),
            });
            return Ok(());
        }
        match call.status {
            CallStatus::Open => {
                if let Some(timer) = &call.callback_timer {
                    self.command(Command::CancelTimer {
                        timer_id: timer.timer_id.clone(),
                    });
                }
                self.emit(Event::ToolCallCompleted {
                    call_id: call_id.clone(),
                    attempt,
                    result: payload,
                    cached: None,
                });
                // The worker may not have reported the acceptance yet: its
                // task ends here, and its report finds the call completed.
                self.command(Command::EndTask {
                    call_id,
                    end: TaskEnd::Completed,
                });
                Ok(())
            }
            CallStatus::Uncertain => {
                self.late_attempt = Some(attempt);
                self.resolve(
                    &call_id,
                    Resolution::Succeeded { result: payload },
                    "callback".to_owned(),
                    format!("the tool server called back for attempt {attempt}"),
                    ResolvedVia::Callback,
                )
            }
            CallStatus::Completed | CallStatus::Failed | CallStatus::Cancelled => {
                self.emit(Event::LateResultRecorded {
                    call_id,
                    attempt,
                    result: payload,
                    discrepancy: Some(format!(
                        "the callback for attempt {attempt} arrived after the call was {}; it is kept here, not applied",
                        call.status.as_str()
                    )),
                });
                Ok(())
            }
        }
    }

    /// A worker's result for the current attempt of an open tool call.
    fn on_tool_result(
        &mut self,
        call_id: String,
        attempt: u32,
        result: Value,
    ) -> Result<(), MachineError> {
        let probe_for = self
            .state
            .tool_calls
            .get(&call_id)
            .and_then(|c| c.probe_for.clone());
        if let Some(callback_timeout_ms) = self.callback_timeout_ms(&call_id)
            && probe_for.is_none()
        {
            // An async webhook's 2xx answer is an acceptance: the result
            // comes by callback.
            let timer = TimerSpec {
                timer_id: format!("{call_id}.callback"),
                after_ms: Some(callback_timeout_ms),
                at: None,
                purpose: TimerPurpose::Timeout,
            };
            if self
                .state
                .tool_calls
                .get(&call_id)
                .is_some_and(|c| c.callback_timer.is_some())
            {
                // Already accepted (a second report of the same acceptance).
                return Ok(());
            }
            self.emit(Event::ToolCallAccepted {
                call_id: call_id.clone(),
                attempt,
                response: result,
                timer: timer.clone(),
            });
            self.command(Command::EndTask {
                call_id,
                end: TaskEnd::Completed,
            });
            self.command(Command::ScheduleTimer(timer));
            return Ok(());
        }
        if probe_for.is_none()
            && let Some(failure) = self.result_type_failure(&call_id, attempt, &result)?
        {
            return self.on_failure(failure);
        }
        let result = self.scrubbed(&call_id, result);
        self.emit(Event::ToolCallCompleted {
            call_id: call_id.clone(),
            attempt,
            result: result.clone(),
            cached: None,
        });
        self.command(Command::EndTask {
            call_id: call_id.clone(),
            end: TaskEnd::Completed,
        });
        if let Some(target) = probe_for {
            self.on_probe_found(&target, &call_id, result)?;
        }
        Ok(())
    }

    /// A tool asked, mid-call, for input from a person (an MCP server's
    /// elicitation). The run waits durably for the answer
    /// ([`Step::on_input_provided`]), then the call runs again with the same
    /// idempotency key, carrying the answers. Repeating the call must be
    /// safe for that: when the server kept running after Belay declined to
    /// answer at once (`may_have_acted`), only an `idempotent` tool waits; a
    /// `never` tool fails and a `reconcile` tool's call becomes an uncertain
    /// outcome, as for any answer lost after the call acted. A reconcile
    /// probe (the engine's own lookup), and a call past
    /// [`MAX_INPUT_ROUNDS`] questions, fail instead of waiting.
    fn on_input_requested(
        &mut self,
        call_id: String,
        attempt: u32,
        via: String,
        requests: Value,
        request_state: Option<String>,
        may_have_acted: bool,
    ) -> Result<(), MachineError> {
        let call = self.require_open_tool_call(&call_id)?.clone();
        let refusal = if !matches!(
            via.as_str(),
            "input_required" | "elicitation" | "url_elicitation_required"
        ) {
            Some(format!("asked for input in an unknown way `{via}`"))
        } else if call.probe_for.is_some() {
            Some("a reconcile probe cannot wait for a person".to_owned())
        } else if call.input_rounds >= MAX_INPUT_ROUNDS {
            Some(format!(
                "it asked for input more than {MAX_INPUT_ROUNDS} times"
            ))
        } else if may_have_acted && call.repeat_safety != RepeatSafety::Idempotent {
            Some(format!(
                "it asked for input mid-call and kept running when Belay did not answer at once, so it may have acted; \
                 calling it again with the answer would repeat it, which its repeat safety `{}` does not allow \
                 (declare it `idempotent` if repeating it is safe)",
                call.repeat_safety.as_str()
            ))
        } else {
            None
        };
        if let Some(why) = refusal {
            return self.on_failure(Failure {
                call_id,
                attempt,
                error: format!("the tool asked for input from a person: {why}"),
                class: if may_have_acted {
                    FailureClass::MayHaveActed
                } else {
                    FailureClass::Rejected
                },
                dispatched: true,
                lease_expired: false,
                status_code: None,
            });
        }
        self.emit(Event::ToolCallInputRequested {
            call_id: call_id.clone(),
            attempt,
            via: via.clone(),
            requests,
            request_state,
        });
        self.command(Command::EndTask {
            call_id: call_id.clone(),
            end: TaskEnd::Completed,
        });
        self.command(Command::NotifyOperator {
            kind: "run.waiting.tool_input".into(),
            payload: serde_json::json!({
                "type": "run.waiting.tool_input",
                "tenant": self.state.tenant,
                "run_id": self.state.run_id,
                "call_id": call_id,
                "tool": call.tool,
                "via": via,
            }),
        });
        Ok(())
    }

    /// A person answered a tool's question: the answer must fit it (the
    /// form's `requestedSchema` for an accepted elicitation), then the call
    /// is scheduled again with every answer so far as its `input`.
    fn on_input_provided(
        &mut self,
        call_id: String,
        answer: Value,
        by: String,
    ) -> Result<(), MachineError> {
        let call = self.require_open_tool_call(&call_id)?.clone();
        let Some(asked) = call.awaiting_input.clone() else {
            return Err(MachineError::CallNotOpen {
                call_id,
                detail: "it does not wait for input".into(),
            });
        };
        let answer = normalize::strip_nul_value(answer);
        let input = input_for_repeat(&call_id, &asked, &answer, &call.input)?;
        let tool =
            self.plan()?.tools.get(&call.tool).cloned().ok_or_else(|| {
                MachineError::InvalidPlan(format!("tool `{}` not pinned", call.tool))
            })?;
        let spec = self.spec_again(&call, &tool, &input)?;
        self.emit(Event::ToolCallInputProvided {
            call_id: call_id.clone(),
            by,
            answer,
            input,
        });
        self.command(Command::RekeyTask {
            call_id: call_id.clone(),
            idempotency_key: call.idempotency_key.clone(),
            spec,
        });
        self.command(Command::RetryTask {
            call_id,
            delay_ms: 0,
        });
        Ok(())
    }

    /// `result` of call `call_id` with its secrets redacted (`scrub.rs`),
    /// unless its tool says `scrub_secrets: false`.
    fn scrubbed(&self, call_id: &str, result: Value) -> Value {
        if self.scrubs(call_id) {
            scrub::scrub(&result).0
        } else {
            result
        }
    }

    /// Whether what call `call_id` answers is scrubbed: unless its tool
    /// says `scrub_secrets: false` (a model call's errors always are).
    fn scrubs(&self, call_id: &str) -> bool {
        self.state
            .tool_calls
            .get(call_id)
            .and_then(|c| self.state.plan.as_ref()?.tools.get(&c.tool))
            .is_none_or(|t| t.def.scrub_secrets)
    }

    /// [`Step::scrubbed`] for an error text.
    fn scrubbed_text(&self, call_id: &str, text: &str) -> String {
        if self.scrubs(call_id) {
            scrub::scrub_text(text, &mut 0)
        } else {
            text.to_owned()
        }
    }

    /// The failure a worker's result is recorded as when it does not match
    /// the tool's declared return type (the fourth check of the tool model:
    /// a result reaches the model and the run's state only as the type the
    /// tool declares). The tool has acted, so nothing repeats it: a
    /// `reconcile` tool's call becomes an uncertain outcome (an operator
    /// looks at what it did), any other fails with the violations and the
    /// first [`RESULT_EXCERPT_BYTES`] bytes of the result, which the model
    /// sees as the call's error. `None` when the result is valid.
    fn result_type_failure(
        &self,
        call_id: &str,
        attempt: u32,
        result: &Value,
    ) -> Result<Option<Failure>, MachineError> {
        let Some(call) = self.state.tool_calls.get(call_id) else {
            return Ok(None);
        };
        let plan = self.plan()?;
        let tool = plan
            .tools
            .get(&call.tool)
            .ok_or_else(|| MachineError::InvalidPlan(format!("tool `{}` not pinned", call.tool)))?;
        // With `process.after`, the declared return type is the processed
        // result's: check what the model and the run's state will get. A
        // stage that failed decides the call itself (`block`: failed;
        // `reask`/`fallback`: a message), or keeps the raw result (`warn`,
        // `use_original`), which is then checked.
        let processed;
        let checked = match tool.def.process.as_ref().and_then(|p| p.after.as_ref()) {
            Some(after) if call.probe_for.is_none() => {
                let done = process::after(after, &call.arguments, result);
                match (done.outcome, done.result) {
                    ("ok", Some(r)) => {
                        processed = r;
                        &processed
                    }
                    ("ok" | "warn" | "use_original", _) => result,
                    _ => return Ok(None),
                }
            }
            _ => result,
        };
        let Err(errors) = belay_definitions::validate_json(&tool.def.output_schema, checked) else {
            return Ok(None);
        };
        let text = self.scrubbed(call_id, checked.clone()).to_string();
        let excerpt = normalize::truncate_str(&text, RESULT_EXCERPT_BYTES);
        let class = if call.repeat_safety == RepeatSafety::Reconcile {
            FailureClass::MayHaveActed
        } else {
            FailureClass::Rejected
        };
        Ok(Some(Failure {
            call_id: call_id.to_owned(),
            attempt,
            error: format!(
                "the tool answered, but its result does not match its declared return type ({}); result: {excerpt}",
                errors.join("; ")
            ),
            class,
            dispatched: true,
            lease_expired: false,
            status_code: None,
        }))
    }

    /// A probe answered with a result: found, if it is a valid result of the
    /// uncertain call's tool; otherwise the operator decides.
    fn on_probe_found(
        &mut self,
        target: &str,
        probe_call_id: &str,
        result: Value,
    ) -> Result<(), MachineError> {
        let Some(call) = self.state.tool_calls.get(target).cloned() else {
            return Ok(());
        };
        if call.status != CallStatus::Uncertain {
            return Ok(()); // resolved meanwhile (operator or late result)
        }
        let probe_tool = self
            .state
            .tool_calls
            .get(probe_call_id)
            .map(|c| c.tool.clone())
            .unwrap_or_default();
        let schema = self
            .plan()?
            .tools
            .get(&call.tool)
            .map(|t| t.def.output_schema.clone());
        // The probe may answer with more than the tool returns (the whole
        // record); the call's result is what the tool declares.
        let result = match (&schema, result) {
            (Some(schema), Value::Object(map)) => {
                match schema.get("properties").and_then(Value::as_object) {
                    Some(props) => Value::Object(
                        map.into_iter()
                            .filter(|(k, _)| props.contains_key(k))
                            .collect(),
                    ),
                    None => Value::Object(map),
                }
            }
            (_, other) => other,
        };
        let valid = match &schema {
            Some(schema) => belay_definitions::validate_json(schema, &result),
            None => Err(vec![format!("tool `{}` is not pinned", call.tool)]),
        };
        match valid {
            Ok(()) => {
                let detail = format!("`{probe_tool}` found the effect of `{}`", call.tool);
                self.probe_finished(
                    target,
                    probe_call_id,
                    &probe_tool,
                    ProbeOutcome::Found,
                    detail.clone(),
                );
                self.resolve(
                    target,
                    Resolution::Succeeded { result },
                    format!("probe:{probe_tool}"),
                    detail,
                    ResolvedVia::Probe,
                )
            }
            Err(errors) => {
                let detail = format!(
                    "`{probe_tool}` answered, but not with a result of `{}`: {}",
                    call.tool,
                    errors.join("; ")
                );
                self.probe_finished(
                    target,
                    probe_call_id,
                    &probe_tool,
                    ProbeOutcome::Undecided,
                    detail,
                );
                self.notify_uncertain(target);
                Ok(())
            }
        }
    }

    fn probe_finished(
        &mut self,
        target: &str,
        probe_call_id: &str,
        tool: &str,
        outcome: ProbeOutcome,
        detail: String,
    ) {
        self.emit(Event::ReconcileProbeFinished {
            call_id: target.to_owned(),
            probe_call_id: probe_call_id.to_owned(),
            outcome,
            detail: detail.clone(),
        });
        self.command(Command::RecordProbe {
            call_id: target.to_owned(),
            probe: serde_json::json!({"tool": tool, "probe_call_id": probe_call_id, "outcome": outcome, "detail": detail}),
        });
    }

    /// Record an uncertain outcome for `call` (event, task end, record).
    fn record_uncertain(
        &mut self,
        call_id: &str,
        call: &state::ToolCallState,
        attempt: u32,
        reason: String,
    ) -> Result<(), MachineError> {
        let tool_version = self
            .plan()?
            .tools
            .get(&call.tool)
            .map(|t| t.version)
            .unwrap_or(0);
        self.emit(Event::UncertainOutcomeRecorded {
            call_id: call_id.to_owned(),
            attempt,
            reason: reason.clone(),
        });
        self.command(Command::EndTask {
            call_id: call_id.to_owned(),
            end: TaskEnd::Uncertain,
        });
        self.command(Command::RecordUncertainOutcome {
            call_id: call_id.to_owned(),
            node: call.node.clone(),
            tool: call.tool.clone(),
            tool_version,
            arguments: call.arguments.clone(),
            idempotency_key: call.idempotency_key.clone(),
            attempt,
            reason,
        });
        Ok(())
    }

    /// Queue the operator notification for an uncertain call.
    fn notify_uncertain(&mut self, call_id: &str) {
        let Some(call) = self.state.tool_calls.get(call_id) else {
            return;
        };
        let payload = serde_json::json!({
            "type": "run.paused.uncertain_outcome",
            "tenant": self.state.tenant,
            "run_id": self.state.run_id,
            "call_id": call_id,
            "node": call.node,
            "tool": call.tool,
            "idempotency_key": call.idempotency_key,
            "reason": call.uncertain_reason,
        });
        self.command(Command::NotifyOperator {
            kind: "run.paused.uncertain_outcome".into(),
            payload,
        });
    }

    /// Resolve an open uncertain outcome (operator, late result or probe).
    fn resolve(
        &mut self,
        call_id: &str,
        resolution: Resolution,
        resolved_by: String,
        reason: String,
        via: ResolvedVia,
    ) -> Result<(), MachineError> {
        let call = match self.state.tool_calls.get(call_id) {
            Some(c) if c.status == CallStatus::Uncertain => c.clone(),
            Some(c) => {
                let detail = match &c.resolution {
                    Some((by, kind, _)) => format!(
                        "already resolved as `{}` via {}",
                        kind.as_str(),
                        by.as_str()
                    ),
                    None => format!("it is {:?}", c.status).to_lowercase(),
                };
                return Err(MachineError::NotUncertain {
                    call_id: call_id.to_owned(),
                    detail,
                });
            }
            None => {
                return Err(MachineError::NotUncertain {
                    call_id: call_id.to_owned(),
                    detail: "no such tool call".into(),
                });
            }
        };
        let tool =
            self.plan()?.tools.get(&call.tool).cloned().ok_or_else(|| {
                MachineError::InvalidPlan(format!("tool `{}` not pinned", call.tool))
            })?;
        let (kind, event_result, event_error, key, stored) = match resolution {
            Resolution::Succeeded { result } => {
                let result = normalize::strip_nul_value(result);
                // A late result is the tool's own answer; an operator's or a
                // probe's must match the tool's output type.
                if via != ResolvedVia::LateResult {
                    belay_definitions::validate_json(&tool.def.output_schema, &result).map_err(
                        |errors| MachineError::InvalidResult {
                            tool: call.tool.clone(),
                            errors,
                        },
                    )?;
                }
                let stored = serde_json::json!({"resolution": "succeeded", "result": result});
                (ResolutionKind::Succeeded, Some(result), None, None, stored)
            }
            Resolution::Failed { error } => {
                let error = normalize::strip_nul(&error);
                let error = if error.trim().is_empty() {
                    "failed (no message given)".to_owned()
                } else {
                    error
                };
                let stored = serde_json::json!({"resolution": "failed", "error": error});
                (ResolutionKind::Failed, None, Some(error), None, stored)
            }
            Resolution::Retry {
                new_idempotency_key,
            } => {
                let key = if new_idempotency_key {
                    format!(
                        "{}/r{}",
                        idempotency_key(&self.state.run_id, call_id),
                        call.rekeys + 1
                    )
                } else {
                    call.idempotency_key.clone()
                };
                let stored = serde_json::json!({"resolution": "retry", "idempotency_key": key, "new_idempotency_key": new_idempotency_key});
                (ResolutionKind::Retry, None, None, Some(key), stored)
            }
        };
        let late_attempt = self.late_attempt.take();
        self.emit(Event::UncertainOutcomeResolved {
            call_id: call_id.to_owned(),
            resolution: kind,
            result: event_result,
            error: event_error,
            idempotency_key: key.clone(),
            resolved_by: resolved_by.clone(),
            reason: reason.clone(),
            via,
            attempt: late_attempt,
        });
        self.command(Command::MarkUncertainResolved {
            call_id: call_id.to_owned(),
            resolution: stored,
            kind,
            resolved_by: resolved_by.clone(),
            reason,
            via,
        });
        // Probes still looking this call up are moot now.
        let moot: Vec<String> = self
            .state
            .tool_calls
            .iter()
            .filter(|(_, c)| {
                c.probe_for.as_deref() == Some(call_id) && c.status == CallStatus::Open
            })
            .map(|(id, _)| id.clone())
            .collect();
        for probe in moot {
            self.command(Command::EndTask {
                call_id: probe,
                end: TaskEnd::Cancelled,
            });
        }
        match kind {
            ResolutionKind::Succeeded => self.command(Command::EndTask {
                call_id: call_id.to_owned(),
                end: TaskEnd::Completed,
            }),
            ResolutionKind::Failed => self.command(Command::EndTask {
                call_id: call_id.to_owned(),
                end: TaskEnd::Failed,
            }),
            ResolutionKind::Retry => {
                if let Some(key) = key.filter(|k| k != &call.idempotency_key) {
                    let spec = tool_spec(&tool, &call.arguments, &key, call.variant.as_deref())?;
                    let spec = self.with_sampling(spec, &call.node, &tool.def);
                    self.command(Command::RekeyTask {
                        call_id: call_id.to_owned(),
                        idempotency_key: key,
                        spec,
                    });
                }
                self.command(Command::RetryTask {
                    call_id: call_id.to_owned(),
                    delay_ms: 0,
                });
            }
        }
        if self.state.status == RunStatus::Paused
            && self.state.operator_paused.is_none()
            && self.state.open_uncertain().is_empty()
        {
            self.emit(Event::RunResumed {
                by: resolved_by,
                reason: "every uncertain outcome is resolved".into(),
            });
        }
        Ok(())
    }

    /// A result from an attempt that lost its lease (DESIGN.md table, last row).
    fn on_late_result(
        &mut self,
        call_id: String,
        attempt: u32,
        result: Value,
        worker_id: String,
    ) -> Result<(), MachineError> {
        let result = self.scrubbed(&call_id, result);
        let call = self
            .state
            .tool_calls
            .get(&call_id)
            .cloned()
            .ok_or_else(|| MachineError::CallNotOpen {
                call_id: call_id.clone(),
                detail: "no such tool call".into(),
            })?;
        match call.status {
            CallStatus::Completed if call.completed_by_attempt == Some(attempt) => Ok(()), // the same report again
            CallStatus::Uncertain => {
                self.late_attempt = Some(attempt);
                self.resolve(
                    &call_id,
                    Resolution::Succeeded { result },
                    format!("worker:{worker_id}"),
                    format!("attempt {attempt} reported its result after losing its lease"),
                    ResolvedVia::LateResult,
                )
            }
            // Still open (being retried): the first result wins.
            CallStatus::Open => self.on_tool_result(call_id, attempt, result),
            CallStatus::Completed | CallStatus::Failed | CallStatus::Cancelled => {
                let cancelled = (call.status == CallStatus::Cancelled).then(|| {
                    format!("attempt {attempt} reported a result after the run was cancelled; it is kept here, not applied")
                });
                let discrepancy = call.resolution.as_ref().map(|(via, kind, resolved)| {
                    let agrees = *kind == ResolutionKind::Succeeded && resolved.as_ref() == Some(&result);
                    format!(
                        "attempt {attempt} reported a result after the outcome was resolved as `{}` via {}; {}",
                        kind.as_str(),
                        via.as_str(),
                        if agrees { "it matches the resolution" } else { "it differs from the resolution and was not applied" }
                    )
                });
                if let Some(detail) = &discrepancy {
                    self.command(Command::FlagDiscrepancy {
                        call_id: call_id.clone(),
                        discrepancy: serde_json::json!({"attempt": attempt, "result": result, "detail": detail, "worker_id": worker_id}),
                    });
                    // Someone resolved this outcome; they should know it was
                    // answered otherwise (or confirmed).
                    self.command(Command::NotifyOperator {
                        kind: "uncertain_outcome.discrepancy".into(),
                        payload: serde_json::json!({
                            "type": "uncertain_outcome.discrepancy",
                            "tenant": self.state.tenant,
                            "run_id": self.state.run_id,
                            "call_id": call_id,
                            "tool": call.tool,
                            "detail": detail,
                        }),
                    });
                }
                self.emit(Event::LateResultRecorded {
                    call_id,
                    attempt,
                    result,
                    discrepancy: discrepancy.or(cancelled),
                });
                Ok(())
            }
        }
    }

    /// A failed attempt, reported or implied by a lost lease: the table of
    /// DESIGN.md, "The tool call, exactly".
    fn on_failure(&mut self, failure: Failure) -> Result<(), MachineError> {
        let Failure {
            call_id,
            attempt,
            error,
            class,
            dispatched,
            lease_expired,
            status_code,
        } = failure;
        // An error quotes what the tool answered (an HTTP body, a result):
        // its secrets go no further than a result's would.
        let error = self.scrubbed_text(&call_id, &normalize::strip_nul(&error));
        // A tool node has no agent: it gets the agents' default limits.
        let (max_model_attempts, max_tool_attempts) = self
            .state
            .current_agent()
            .map(|a| (a.max_model_attempts, a.max_tool_attempts))
            .unwrap_or((TOOL_NODE_ATTEMPTS, TOOL_NODE_ATTEMPTS));

        // Model calls: no side effects, retried like idempotent tools.
        if self
            .state
            .node
            .as_ref()
            .and_then(|n| n.model_call.as_ref())
            .is_some_and(|c| c.call_id == call_id)
        {
            let failed = self
                .state
                .node
                .as_ref()
                .and_then(|n| n.model_call.as_ref())
                .map(|c| c.failed_attempts + 1)
                .unwrap_or(1);
            let will_retry = failed < max_model_attempts;
            self.emit(Event::ModelCallAttemptFailed {
                call_id: call_id.clone(),
                attempt,
                error: error.clone(),
                will_retry,
            });
            if will_retry {
                self.command(Command::RetryTask {
                    call_id,
                    delay_ms: retry_delay_ms(failed),
                });
            } else {
                self.command(Command::EndTask {
                    call_id: call_id.clone(),
                    end: TaskEnd::Failed,
                });
                self.emit(Event::RunFailed {
                    error: format!(
                        "model call `{call_id}` failed {failed} times; last error: {error}"
                    ),
                    stop: None,
                });
                self.command(Command::CancelOpenTasks);
            }
            return Ok(());
        }

        let call = self.require_open_tool_call(&call_id)?.clone();
        // Attempts that provably did nothing (not sent, or lost before
        // dispatch) have their own, longer allowance: an MCP server or tool
        // host being redeployed must not fail durable runs.
        let nothing_done = class == FailureClass::NotSent || !dispatched;
        let not_sent = call.not_sent_failures + u32::from(nothing_done);
        let failed = call.failed_attempts + 1;
        let acted = failed - not_sent.min(failed);
        let policy = self
            .state
            .plan
            .as_ref()
            .and_then(|p| p.tools.get(&call.tool))
            .and_then(|t| t.def.retry_policy.clone());
        let retries = match &policy {
            None => Retries {
                within: if nothing_done {
                    not_sent < MAX_NOT_SENT_ATTEMPTS
                } else {
                    acted < max_tool_attempts
                },
                delay_ms: retry_delay_ms(if nothing_done { not_sent } else { acted }),
                by_policy: false,
            },
            Some(policy) => self.policy_retries(
                policy,
                &call,
                &call_id,
                attempt,
                class,
                dispatched,
                status_code,
                max_tool_attempts,
            ),
        };
        let within_attempts = retries.within;
        let delay_ms = retries.delay_ms;
        // What may happen next, by class and repeat safety.
        enum Next {
            Retry,
            Fail(String),
            Uncertain,
        }
        if let Some(target) = call.probe_for.clone() {
            // A probe without a policy of its own keeps its backoff by attempt.
            let delay_ms = if policy.is_some() {
                delay_ms
            } else {
                retry_delay_ms(attempt)
            };
            return self.on_probe_failure(
                &target,
                Failure {
                    call_id,
                    attempt,
                    error,
                    class,
                    dispatched,
                    lease_expired,
                    status_code,
                },
                within_attempts,
                delay_ms,
            );
        }
        let next = match (class, dispatched, call.repeat_safety) {
            (FailureClass::Rejected, _, _) => {
                Next::Fail(format!("tool `{}` failed: {error}", call.tool))
            }
            (FailureClass::NotSent, _, _) | (_, false, _) => {
                if within_attempts {
                    Next::Retry
                } else if retries.by_policy {
                    Next::Fail(format!(
                        "tool `{}` failed after {failed} attempts (its retry policy allows no more); last error: {error}",
                        call.tool
                    ))
                } else {
                    Next::Fail(format!(
                        "tool `{}` could not be reached in {not_sent} attempts (nothing was sent); last error: {error}",
                        call.tool
                    ))
                }
            }
            (FailureClass::MayHaveActed, true, RepeatSafety::Never) => Next::Fail(format!(
                "tool `{}` may or may not have acted ({error}); it is not repeated because its repeat safety is `never`",
                call.tool
            )),
            (FailureClass::MayHaveActed, true, RepeatSafety::Idempotent) => {
                if within_attempts {
                    Next::Retry
                } else {
                    Next::Fail(format!(
                        "tool `{}` failed after {failed} attempts; last error: {error}",
                        call.tool
                    ))
                }
            }
            (FailureClass::MayHaveActed, true, RepeatSafety::Reconcile) => Next::Uncertain,
        };
        let retry_delay_ms = matches!(next, Next::Retry).then_some(delay_ms);
        if lease_expired {
            self.emit(Event::TaskLeaseExpired {
                call_id: call_id.clone(),
                attempt,
                dispatched,
                retry_delay_ms,
            });
        } else {
            self.emit(Event::ToolCallAttemptFailed {
                call_id: call_id.clone(),
                attempt,
                error: error.clone(),
                class,
                dispatched,
                will_retry: matches!(next, Next::Retry),
                status_code,
                retry_delay_ms,
            });
        }
        match next {
            Next::Retry => {
                self.refresh_sampling_grant(&call_id)?;
                self.command(Command::RetryTask { call_id, delay_ms })
            }
            Next::Fail(message) => {
                self.emit(Event::ToolCallFailed {
                    call_id: call_id.clone(),
                    attempt,
                    error: message,
                });
                self.command(Command::EndTask {
                    call_id,
                    end: TaskEnd::Failed,
                });
            }
            Next::Uncertain => {
                let reason = format!(
                    "outcome of `{}` call `{call_id}` (attempt {attempt}) is unknown: {error}",
                    call.tool
                );
                self.record_uncertain(&call_id, &call, attempt, reason.clone())?;
                let probe = self
                    .plan()?
                    .tools
                    .get(&call.tool)
                    .and_then(|t| t.def.reconcile_with.clone())
                    .and_then(|name| self.plan().ok()?.tools.get(&name).cloned());
                let mut pause_reason = format!("uncertain outcome: {reason}");
                // The probe's own injected parameters are filled in like a
                // model's call; a probe that cannot be called goes to the
                // operator instead.
                let probe_call_id = format!("{call_id}.p{}", call.probes + 1);
                let key = idempotency_key(&self.state.run_id, &probe_call_id);
                let probe = probe.and_then(|probe| {
                    let mut args = Map::new();
                    args.insert(
                        "idempotency_key".into(),
                        Value::String(call.idempotency_key.clone()),
                    );
                    let facts = inject::CallFacts {
                        run_id: &self.state.run_id,
                        node_id: &call.node,
                        call_id: &probe_call_id,
                        idempotency_key: &key,
                        tenant: &self.state.tenant,
                        caller: &self.state.caller,
                        now: self.state.now,
                    };
                    let args =
                        inject::inject(&probe.def, &mut args, &self.state.document(), &facts)
                            .map(|()| Value::Object(args))
                            .and_then(|args| {
                                let variant = variants::choose(&probe.def, &args)?;
                                Ok((args, variant))
                            });
                    match args {
                        Ok((args, variant)) => Some((probe, args, variant)),
                        Err(e) => {
                            pause_reason = format!(
                                "{pause_reason}; the probe `{}` cannot be called: {e}",
                                probe.def.name
                            );
                            None
                        }
                    }
                });
                match probe {
                    Some((probe, arguments, variant)) => {
                        let spec = tool_spec(&probe, &arguments, &key, variant.as_deref())?;
                        self.emit(Event::ReconcileProbeScheduled {
                            call_id: call_id.clone(),
                            probe_call_id: probe_call_id.clone(),
                            tool: probe.def.name.clone(),
                            arguments,
                            variant,
                        });
                        self.command(Command::ScheduleTask {
                            call_id: probe_call_id,
                            kind: TaskKind::ToolCall,
                            spec,
                            idempotency_key: key,
                            repeat_safety: Some(RepeatSafety::Idempotent),
                            runs_while_paused: true,
                        });
                        pause_reason =
                            format!("{pause_reason}; looking it up with `{}`", probe.def.name);
                    }
                    None => self.notify_uncertain(&call_id),
                }
                if self.state.status == RunStatus::Running {
                    self.emit(Event::RunPaused {
                        reason: pause_reason,
                        operator: None,
                    });
                }
            }
        }
        Ok(())
    }

    /// The retries of a failed attempt of `call`, whose tool declares
    /// `policy`. Attempts that reached nothing (not sent with no answer
    /// from the tool: a refused connection, a token endpoint down, an MCP
    /// server away; or lost before dispatch) keep the separate allowance of
    /// [`MAX_NOT_SENT_ATTEMPTS`], with the engine's backoff or the policy's
    /// delay, whichever is longer (the allowance exists to outlast a
    /// redeploy; the policy may space attempts further, not closer). Every
    /// other failure counts: at most `1 + max_retries` of them (else the
    /// agent's `max_tool_attempts`), each followed by the policy's delay.
    #[allow(clippy::too_many_arguments)]
    fn policy_retries(
        &self,
        policy: &RetryPolicy,
        call: &state::ToolCallState,
        call_id: &str,
        attempt: u32,
        class: FailureClass,
        dispatched: bool,
        status_code: Option<u16>,
        max_tool_attempts: u32,
    ) -> Retries {
        let nothing_done = class == FailureClass::NotSent || !dispatched;
        let answered = class == FailureClass::NotSent && dispatched && status_code.is_some();
        let failed = call.failed_attempts + 1;
        let unreached = (call.not_sent_failures + u32::from(nothing_done))
            .saturating_sub(call.answered_not_sent + u32::from(answered));
        let run_id = &self.state.run_id;
        if nothing_done && !answered {
            let policy_delay = policy_delay_ms(policy, unreached, run_id, call_id, attempt);
            return Retries {
                within: unreached < MAX_NOT_SENT_ATTEMPTS,
                delay_ms: policy_delay.max(retry_delay_ms(unreached)),
                by_policy: false,
            };
        }
        let counted = failed.saturating_sub(unreached);
        let max_attempts = policy
            .max_retries
            .map_or(max_tool_attempts, |r| r.saturating_add(1));
        Retries {
            within: counted < max_attempts,
            delay_ms: policy_delay_ms(policy, counted, run_id, call_id, attempt),
            by_policy: true,
        }
    }

    /// A reconcile probe failed: a definite "not found" (HTTP 404) means the
    /// call had no effect and is retried with the same key; a failure that is
    /// safe to retry retries the probe; anything else goes to the operator.
    fn on_probe_failure(
        &mut self,
        target: &str,
        failure: Failure,
        within_attempts: bool,
        delay_ms: u64,
    ) -> Result<(), MachineError> {
        let Failure {
            call_id: probe_call_id,
            attempt,
            error,
            class,
            dispatched,
            lease_expired,
            status_code,
        } = failure;
        let probe_tool = self
            .state
            .tool_calls
            .get(&probe_call_id)
            .map(|c| c.tool.clone())
            .unwrap_or_default();
        let not_found = class == FailureClass::Rejected && status_code == Some(404);
        // Probes are idempotent reads: any failure but a definite answer may be retried.
        let retry = !not_found && class != FailureClass::Rejected && within_attempts;
        let retry_delay_ms = retry.then_some(delay_ms);
        if lease_expired {
            self.emit(Event::TaskLeaseExpired {
                call_id: probe_call_id.clone(),
                attempt,
                dispatched,
                retry_delay_ms,
            });
        } else {
            self.emit(Event::ToolCallAttemptFailed {
                call_id: probe_call_id.clone(),
                attempt,
                error: error.clone(),
                class,
                dispatched: true,
                will_retry: retry,
                status_code,
                retry_delay_ms,
            });
        }
        if retry {
            self.command(Command::RetryTask {
                call_id: probe_call_id,
                delay_ms,
            });
            return Ok(());
        }
        self.emit(Event::ToolCallFailed {
            call_id: probe_call_id.clone(),
            attempt,
            error: error.clone(),
        });
        self.command(Command::EndTask {
            call_id: probe_call_id.clone(),
            end: TaskEnd::Failed,
        });
        let still_uncertain = self
            .state
            .tool_calls
            .get(target)
            .is_some_and(|c| c.status == CallStatus::Uncertain);
        if !still_uncertain {
            return Ok(());
        }
        if not_found {
            let detail = format!("`{probe_tool}` found no effect ({error})");
            self.probe_finished(
                target,
                &probe_call_id,
                &probe_tool,
                ProbeOutcome::NotFound,
                detail.clone(),
            );
            self.resolve(
                target,
                Resolution::Retry {
                    new_idempotency_key: false,
                },
                format!("probe:{probe_tool}"),
                detail,
                ResolvedVia::Probe,
            )
        } else {
            let detail = format!("`{probe_tool}` could not decide: {error}");
            self.probe_finished(
                target,
                &probe_call_id,
                &probe_tool,
                ProbeOutcome::Undecided,
                detail,
            );
            self.notify_uncertain(target);
            Ok(())
        }
    }

    /// Derive follow-up work from the state until nothing more can happen now.
    fn advance(&mut self) -> Result<(), MachineError> {
        loop {
            if self.state.status != RunStatus::Running {
                return Ok(());
            }
            if let Some(step) = self.state.step.clone() {
                if self.advance_step(&step)? {
                    continue;
                }
                return Ok(());
            }
            let Some(node) = self.state.node.clone() else {
                // Between nodes: start the next one or finish the run.
                let plan = self.plan_handle()?;
                let next = match self.state.last_completed.as_ref() {
                    None => Some(plan.workflow.def.start.clone()),
                    Some((last, _)) => self.state.chosen_next.clone().or_else(|| {
                        plan.workflow
                            .def
                            .nodes
                            .iter()
                            .find(|n| &n.id == last)
                            .and_then(|n| n.next.clone())
                    }),
                };
                match next {
                    Some(id) => self.start_node(&plan, &id)?,
                    None => {
                        let output = self.previous_output().unwrap_or(Value::Null);
                        self.emit(Event::RunCompleted { output });
                    }
                }
                continue;
            };
            if node.model_call.is_some() || !node.pending.is_empty() {
                return Ok(()); // waiting for a worker
            }
            let plan = self.plan()?;
            let agent = plan
                .agents
                .get(&node.agent)
                .ok_or_else(|| {
                    MachineError::InvalidPlan(format!("agent `{}` not pinned", node.agent))
                })?
                .def
                .clone();
            if !plan.workflow.def.nodes.iter().any(|n| n.id == node.id) {
                return Err(MachineError::InvalidPlan(format!("no node `{}`", node.id)));
            }
            match node.transcript.last() {
                Some(ChatMessage::Assistant {
                    content,
                    tool_calls,
                }) if tool_calls.is_empty() => {
                    // A final answer: JSON if it parses, text otherwise;
                    // with an `output_schema:`, JSON that satisfies it, or
                    // the model is asked again.
                    let mut text = content.clone().unwrap_or_default();
                    // The answer is the node's output: every token gets
                    // its data back (`pii.rs`).
                    let redactor = pii::Redactor::new(&node.pii, &agent.pii_redaction);
                    if !agent.pii_redaction.is_empty() {
                        text = redactor.restore_all(&text);
                    }
                    let output = match &agent.output_schema {
                        None => serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text)),
                        Some(schema) => match checked_final_answer(schema, &text) {
                            Ok(value) => value,
                            Err(errors) => {
                                let message = format!(
                                    "Your final answer does not match the required output schema: {}. \
                                     Answer again with only a JSON value that matches this JSON Schema: {schema}",
                                    errors.join("; ")
                                );
                                // The errors quote the answer with its data
                                // back: the model reads tokens again.
                                let message = if agent.pii_redaction.is_empty() {
                                    message
                                } else {
                                    redactor.redact_text(&message)
                                };
                                self.emit(Event::FinalAnswerRefused {
                                    node: node.id.clone(),
                                    errors,
                                    message,
                                });
                                // The next pass calls the model again, within
                                // the node's budget.
                                continue;
                            }
                        },
                    };
                    self.emit(Event::NodeCompleted {
                        node: node.id.clone(),
                        output,
                        next: None,
                    });
                }
                _ => {
                    let run_budget = plan.workflow.def.budget.clone();
                    if let Some((error, stop)) =
                        out_of_budget(&agent, &node, &run_budget, &self.state.totals)
                    {
                        self.fail_run_stop(error, stop);
                        continue;
                    }
                    let step = node.model_steps + 1;
                    let call_id = format!("{}.m{step}", node.prefix);
                    let tools = agent
                        .tools
                        .iter()
                        .filter_map(|name| plan.tools.get(name))
                        .map(|t| ToolSchema {
                            name: t.def.name.clone(),
                            description: t.def.description.clone(),
                            parameters: t
                                .def
                                .strict_schema
                                .as_ref()
                                .unwrap_or(t.def.model_schema())
                                .clone(),
                            strict: t.def.strict_schema.is_some(),
                        })
                        .collect();
                    // An agent that redacts PII sends tokens in its
                    // place (`pii.rs`).
                    // New values (or origins) are recorded first, so a
                    // token keeps its value for the whole visit.
                    let (messages, issued) = if agent.pii_redaction.is_empty() {
                        (node.transcript.clone(), Vec::new())
                    } else {
                        let to_model =
                            |tool: &str| plan.tools.get(tool).is_some_and(|t| t.def.pii_access.llm);
                        let mut redactor = pii::Redactor::new(&node.pii, &agent.pii_redaction);
                        redactor.learn(&node.transcript, to_model);
                        (
                            redactor.redact_messages(&node.transcript, to_model),
                            redactor.changed(),
                        )
                    };
                    let spec = ModelCallSpec {
                        model: agent.model.clone(),
                        messages,
                        tools,
                        max_output_tokens: agent.max_output_tokens,
                    };
                    let spec = serde_json::to_value(&spec)
                        .map_err(|e| MachineError::InvalidPlan(format!("model spec: {e}")))?;
                    let key = idempotency_key(&self.state.run_id, &call_id);
                    if !issued.is_empty() {
                        self.emit(Event::PiiTokensIssued {
                            node: node.id.clone(),
                            entries: issued,
                        });
                    }
                    self.emit(Event::ModelCallScheduled {
                        node: node.id.clone(),
                        call_id: call_id.clone(),
                        step,
                    });
                    self.command(Command::ScheduleTask {
                        call_id,
                        kind: TaskKind::ModelCall,
                        spec,
                        idempotency_key: key,
                        repeat_safety: None,
                        runs_while_paused: false,
                    });
                    return Ok(());
                }
            }
        }
    }

    /// End the run as failed: a node could not go on.
    fn fail_run(&mut self, error: String) {
        self.emit(Event::RunFailed { error, stop: None });
        self.command(Command::CancelOpenTasks);
    }

    /// End the run, stopped by a budget or a stop condition (typed).
    fn fail_run_stop(&mut self, error: String, stop: Stop) {
        self.emit(Event::RunFailed {
            error,
            stop: Some(stop),
        });
        self.command(Command::CancelOpenTasks);
    }

    /// Start node `id`: emit `NodeStarted`, and finish at once the nodes
    /// that need nothing from outside (branch, set, fail, succeed).
    fn start_node(&mut self, plan: &RunPlan, id: &str) -> Result<(), MachineError> {
        match self.try_start_node(plan, id) {
            Ok(()) => Ok(()),
            Err(Halt::Fail(error)) => {
                self.fail_run(error);
                Ok(())
            }
            Err(Halt::Machine(e)) => Err(e),
        }
    }

    /// [`Step::start_node`]; a template that cannot be rendered is
    /// [`Halt::Fail`] (the run fails, nothing of the node is written).
    fn try_start_node(&mut self, plan: &RunPlan, id: &str) -> Result<(), Halt> {
        let def = plan
            .workflow
            .def
            .nodes
            .iter()
            .find(|n| n.id == id)
            .ok_or_else(|| MachineError::InvalidPlan(format!("no node `{id}`")))?
            .clone();
        let doc = self.state.document();
        let render = |t: &Template, what: &str| {
            t.render(&doc)
                .map_err(|e| Halt::Fail(format!("node `{id}`: `{what}`: {e}")))
        };
        match &def.kind {
            NodeKind::Agent { agent, input } => {
                let input = match input {
                    Some(t) => render(t, "input")?,
                    None => self.previous_output_or_input(),
                };
                // The agent's wall-time budget: a durable timer from now,
                // its id unique per visit (`<node>~<n>.deadline`).
                let deadline = plan
                    .agents
                    .get(agent)
                    .and_then(|a| a.def.budget.max_wall_time_ms)
                    .map(|ms| TimerSpec {
                        timer_id: format!("{}.deadline", self.next_prefix(id)),
                        after_ms: Some(ms),
                        at: None,
                        purpose: TimerPurpose::Deadline,
                    });
                self.emit(Event::NodeStarted {
                    node: id.to_owned(),
                    input,
                    deadline: deadline.clone(),
                });
                if let Some(timer) = deadline {
                    self.command(Command::ScheduleTimer(timer));
                }
            }
            NodeKind::Tool { tool, args, .. } => {
                let args = render(args, "args")?;
                self.emit(Event::NodeStarted {
                    node: id.to_owned(),
                    input: args.clone(),
                    deadline: None,
                });
                self.schedule_node_tool(plan, &def, tool, args)?;
            }
            NodeKind::Wait(wait) => self.start_wait(&def, wait, &doc)?,
            NodeKind::Workflow {
                workflow,
                input,
                mode,
                timeout_ms,
                ..
            } => {
                let input = match input {
                    Some(t) => render(t, "input")?,
                    None => self.previous_output_or_input(),
                };
                self.emit(Event::NodeStarted {
                    node: id.to_owned(),
                    input: input.clone(),
                    deadline: None,
                });
                let prefix = self.step_prefix(id);
                let (child_run_id, sync) = self.start_child(
                    id,
                    &format!("{prefix}.c1"),
                    workflow,
                    input,
                    *mode,
                    *timeout_ms,
                    format!("{prefix}.timeout"),
                );
                if !sync {
                    self.emit(Event::NodeCompleted {
                        node: id.to_owned(),
                        output: json!({"run_id": child_run_id}),
                        next: None,
                    });
                }
            }
            NodeKind::Approval(approval) => {
                let subject = render(&approval.subject, "subject")?;
                let prompt = approval
                    .prompt
                    .as_ref()
                    .map(|p| render(p, "prompt"))
                    .transpose()?;
                self.emit(Event::NodeStarted {
                    node: id.to_owned(),
                    input: subject.clone(),
                    deadline: None,
                });
                let prefix = self.step_prefix(id);
                let timer = approval.timeout_ms.map(|ms| TimerSpec {
                    timer_id: format!("{prefix}.timeout"),
                    after_ms: Some(ms),
                    at: None,
                    purpose: TimerPurpose::Timeout,
                });
                self.emit(Event::ApprovalRequested {
                    node: id.to_owned(),
                    subject,
                    prompt,
                    approver_grant: approval.approver_grant.clone(),
                    allow_edits: approval.allow_edits,
                    timer: timer.clone(),
                });
                if let Some(timer) = timer {
                    self.command(Command::ScheduleTimer(timer));
                }
            }
            NodeKind::Branch { cases, default } => {
                self.emit(Event::NodeStarted {
                    node: id.to_owned(),
                    input: Value::Null,
                    deadline: None,
                });
                let mut chosen: Option<(usize, String)> = None;
                for (i, case) in cases.iter().enumerate() {
                    match case.when.eval(&doc) {
                        Ok(v) if !matches!(v, Value::Null | Value::Bool(false)) => {
                            chosen = Some((i, case.next.clone()));
                            break;
                        }
                        Ok(_) => {}
                        Err(e) => {
                            return Err(Halt::Fail(format!(
                                "node `{id}`: `when` of case {}: {e}",
                                i + 1
                            )));
                        }
                    }
                }
                let (output, next) = match chosen {
                    Some((i, next)) => (json!({"case": i + 1, "next": next}), Some(next)),
                    None => (
                        json!({"case": null, "next": default.clone().or_else(|| def.next.clone())}),
                        default.clone(),
                    ),
                };
                self.emit(Event::NodeCompleted {
                    node: id.to_owned(),
                    output,
                    next,
                });
            }
            NodeKind::Set { values } => {
                let values = match render(values, "values")? {
                    v @ Value::Object(_) => v,
                    other => {
                        return Err(Halt::Fail(format!(
                            "node `{id}`: `values` must render to an object, not {other}"
                        )));
                    }
                };
                self.emit(Event::NodeStarted {
                    node: id.to_owned(),
                    input: Value::Null,
                    deadline: None,
                });
                self.emit(Event::NodeCompleted {
                    node: id.to_owned(),
                    output: values,
                    next: None,
                });
            }
            NodeKind::Fail { error } => {
                self.emit(Event::NodeStarted {
                    node: id.to_owned(),
                    input: Value::Null,
                    deadline: None,
                });
                let message = match render(error, "error") {
                    Ok(Value::String(s)) => s,
                    Ok(other) => other.to_string(),
                    Err(Halt::Fail(e)) => e,
                    Err(e) => return Err(e),
                };
                return Err(Halt::Fail(format!("node `{id}`: {message}")));
            }
            NodeKind::Succeed { output } => {
                let output = match output {
                    Some(t) => render(t, "output")?,
                    None => self.previous_output().unwrap_or(Value::Null),
                };
                self.emit(Event::NodeStarted {
                    node: id.to_owned(),
                    input: Value::Null,
                    deadline: None,
                });
                self.emit(Event::NodeCompleted {
                    node: id.to_owned(),
                    output,
                    next: None,
                });
            }
        }
        Ok(())
    }

    /// The output of the latest completed node, if any.
    fn previous_output(&self) -> Option<Value> {
        self.state.last_completed.as_ref().map(|(_, o)| o.clone())
    }

    /// A node's default input: the previous node's output, or the run input
    /// for the first node.
    fn previous_output_or_input(&self) -> Value {
        self.previous_output()
            .unwrap_or_else(|| self.state.input.clone())
    }

    /// The call/timer id prefix of the step being started.
    /// The prefix the next visit of node `id` gets (the fold's rule:
    /// `<node>` on the first visit, `<node>~<n>` on the n-th).
    fn next_prefix(&self, id: &str) -> String {
        match self.state.visits.get(id).copied().unwrap_or(0) + 1 {
            1 => id.to_owned(),
            visit => format!("{id}~{visit}"),
        }
    }

    fn step_prefix(&self, id: &str) -> String {
        self.state
            .step
            .as_ref()
            .filter(|s| s.id == id)
            .map(|s| s.prefix.clone())
            .unwrap_or_else(|| id.to_owned())
    }

    /// A tool node's call: the same checks as a model's proposal (input
    /// type, permission of node, caller and tenant), then a task.
    fn schedule_node_tool(
        &mut self,
        plan: &RunPlan,
        def: &belay_definitions::model::NodeDef,
        tool_name: &str,
        args: Value,
    ) -> Result<(), MachineError> {
        let tool = plan
            .tools
            .get(tool_name)
            .ok_or_else(|| MachineError::InvalidPlan(format!("tool `{tool_name}` not pinned")))?;
        let Value::Object(mut map) = normalize::strip_nul_value(args) else {
            self.fail_run(format!(
                "node `{}`: `args` of tool `{tool_name}` must render to an object",
                def.id
            ));
            return Ok(());
        };
        let sent = inject::sent_anyway(&tool.def, &map);
        if !sent.is_empty() {
            self.fail_run(format!(
                "node `{}`: `args` of tool `{tool_name}` set {}, which the tool's definition supplies itself (`source:` or `hidden:`)",
                def.id,
                sent.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
            ));
            return Ok(());
        }
        fill_defaults(&mut map, tool.def.model_schema());
        let call_id = format!("{}.t1", self.step_prefix(&def.id));
        let key = idempotency_key(&self.state.run_id, &call_id);
        let facts = inject::CallFacts {
            run_id: &self.state.run_id,
            node_id: &def.id,
            call_id: &call_id,
            idempotency_key: &key,
            tenant: &self.state.tenant,
            caller: &self.state.caller,
            now: self.state.now,
        };
        if let Err(reason) = inject::inject(&tool.def, &mut map, &self.state.document(), &facts) {
            self.fail_run(format!("node `{}`: tool `{tool_name}`: {reason}", def.id));
            return Ok(());
        }
        let arguments = Value::Object(map);
        // The same bound as a model's proposal (measured as the JSON that
        // is persisted and sent).
        let size = serde_json::to_string(&arguments).map_or(usize::MAX, |s| s.len());
        if size > TOOL_NODE_MAX_ARGUMENT_BYTES {
            self.fail_run(format!(
                "node `{}`: `args` of tool `{tool_name}` are {size} bytes, more than the limit of {TOOL_NODE_MAX_ARGUMENT_BYTES} bytes",
                def.id
            ));
            return Ok(());
        }
        if let Err(errors) = belay_definitions::validate_json(&tool.def.input_schema, &arguments) {
            self.fail_run(format!(
                "node `{}`: `args` do not match the input type of tool `{tool_name}`: {}",
                def.id,
                errors.join("; ")
            ));
            return Ok(());
        }
        // `process.before`, over arguments of the tool's input type: no
        // model to re-ask, so any refusal fails the run.
        let mut before_skipped = None;
        let mut computed = None;
        if let Some(before) = tool.def.process.as_ref().and_then(|p| p.before.as_ref()) {
            let Value::Object(map) = &arguments else {
                return Err(MachineError::InvalidPlan("arguments are an object".into()));
            };
            match process::before(&tool.def, before, map) {
                process::Before::Go { arguments, skipped } => {
                    computed = Some(arguments);
                    before_skipped = skipped;
                }
                process::Before::Refuse {
                    reason, fail_run, ..
                } => {
                    let error = fail_run.unwrap_or_else(|| {
                        format!("tool `{tool_name}`: `process.before` refused the call: {reason}")
                    });
                    self.fail_run(format!("node `{}`: {error}", def.id));
                    return Ok(());
                }
            }
        }
        let arguments = computed.map(Value::Object).unwrap_or(arguments);
        let permission = &tool.def.permission;
        let missing: Vec<&str> = [
            ("node", def.grants.contains(permission)),
            ("caller", self.state.caller_grants.contains(permission)),
            ("tenant", self.state.tenant_grants.contains(permission)),
        ]
        .into_iter()
        .filter(|(_, ok)| !ok)
        .map(|(who, _)| who)
        .collect();
        if !missing.is_empty() {
            self.fail_run(format!(
                "node `{}`: tool `{tool_name}` needs permission `{permission}`, which is not granted to the {}",
                def.id,
                missing.join(", ")
            ));
            return Ok(());
        }
        let variant = match variants::choose(&tool.def, &arguments) {
            Ok(variant) => variant,
            Err(reason) => {
                self.fail_run(format!(
                    "node `{}`: tool `{tool_name}`: {reason}; nothing was sent",
                    def.id
                ));
                return Ok(());
            }
        };
        let child = matches!(tool.def.binding, ToolBindingDef::Workflow { .. })
            .then(|| (tool.def.binding.clone(), arguments.clone()));
        let spec = match child {
            None => Some(tool_spec(tool, &arguments, &key, variant.as_deref())?),
            Some(_) => None,
        };
        let repeat_safety = tool.def.repeat_safety;
        self.emit(Event::ToolCallScheduled {
            node: def.id.clone(),
            call_id: call_id.clone(),
            tool_use_id: String::new(),
            tool: tool.def.name.clone(),
            tool_version: tool.version,
            arguments,
            idempotency_key: key.clone(),
            repeat_safety,
            variant,
        });
        if let Some((outcome, message, why)) = before_skipped {
            self.emit(Event::ToolCallProcessed {
                call_id: call_id.clone(),
                tool: tool.def.name.clone(),
                stage: "before".to_owned(),
                outcome: outcome.to_owned(),
                message,
                error: Some(why),
                result: None,
            });
        }
        if let Some(confirmation) = &tool.def.confirmation {
            self.request_confirmation(&def.id, &call_id, &tool.def.name, confirmation);
            return Ok(());
        }
        self.launch_call(&def.id, &call_id, key, repeat_safety, spec, child);
        Ok(())
    }

    /// Follow-up of a non-agent node in progress; `true` when something
    /// was emitted.
    fn advance_step(&mut self, step: &StepState) -> Result<bool, MachineError> {
        let StepKind::Tool { call_id } = &step.kind else {
            return Ok(false); // waiting for a signal, timer or decision
        };
        let Some(call) = self.state.tool_calls.get(call_id).cloned() else {
            return Ok(false);
        };
        match call.status {
            CallStatus::Completed => {
                self.emit(Event::NodeCompleted {
                    node: step.id.clone(),
                    output: call.result.unwrap_or(Value::Null),
                    next: None,
                });
                Ok(true)
            }
            CallStatus::Failed => {
                let on_error = self
                    .plan()?
                    .workflow
                    .def
                    .nodes
                    .iter()
                    .find(|n| n.id == step.id)
                    .and_then(|n| match &n.kind {
                        NodeKind::Tool { on_error, .. } => on_error.clone(),
                        _ => None,
                    });
                let error = call.error.unwrap_or_else(|| "failed".into());
                match on_error {
                    Some(next) => self.emit(Event::NodeCompleted {
                        node: step.id.clone(),
                        output: json!({"error": error}),
                        next: Some(next),
                    }),
                    // Most call errors already say "tool `t` failed…";
                    // name the tool only when the error does not.
                    None if error.starts_with(&format!("tool `{}` ", call.tool)) => {
                        self.fail_run(format!("node `{}`: {error}", step.id))
                    }
                    None => self.fail_run(format!(
                        "node `{}`: tool `{}` failed: {error}",
                        step.id, call.tool
                    )),
                }
                Ok(true)
            }
            CallStatus::Open | CallStatus::Uncertain | CallStatus::Cancelled => Ok(false),
        }
    }

    /// A wait node: take a signal that came early, or set timers and wait.
    fn start_wait(
        &mut self,
        def: &belay_definitions::model::NodeDef,
        wait: &WaitDef,
        doc: &Value,
    ) -> Result<(), MachineError> {
        let id = def.id.clone();
        // Render the times first: a bad one fails the run before anything starts.
        let mut at_times: Vec<Option<String>> = Vec::with_capacity(wait.any.len());
        for (i, entry) in wait.any.iter().enumerate() {
            let WaitFor::Until { at, .. } = entry else {
                at_times.push(None);
                continue;
            };
            let rendered = at
                .render(doc)
                .map_err(|e| e.to_string())
                .and_then(|v| match v {
                    Value::String(s) => chrono::DateTime::parse_from_rfc3339(s.trim())
                        .map(|t| {
                            t.with_timezone(&chrono::Utc)
                                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
                        })
                        .map_err(|e| format!("{s:?} is not an RFC 3339 time ({e})")),
                    other => Err(format!(
                        "must render to an RFC 3339 time string, not {other}"
                    )),
                });
            match rendered {
                Ok(t) => at_times.push(Some(t)),
                Err(e) => {
                    self.fail_run(format!("node `{id}`: `until` of entry {}: {e}", i + 1));
                    return Ok(());
                }
            }
        }
        self.emit(Event::NodeStarted {
            node: id.clone(),
            input: Value::Null,
            deadline: None,
        });
        let signals: Vec<String> = wait
            .any
            .iter()
            .filter_map(|f| match f {
                WaitFor::Signal { name, .. } => Some(name.clone()),
                _ => None,
            })
            .collect();
        if let Some(signal) = self
            .state
            .signals
            .iter()
            .find(|s| signals.contains(&s.name))
            .cloned()
        {
            self.consume_signal(&id, wait, signal, &[]);
            return Ok(());
        }
        let prefix = self.step_prefix(&id);
        let mut timers = Vec::new();
        for (i, entry) in wait.any.iter().enumerate() {
            match entry {
                WaitFor::Duration { ms, .. } => timers.push(TimerSpec {
                    timer_id: format!("{prefix}.w{}", i + 1),
                    after_ms: Some(*ms),
                    at: None,
                    purpose: TimerPurpose::Entry(i),
                }),
                WaitFor::Until { .. } => timers.push(TimerSpec {
                    timer_id: format!("{prefix}.w{}", i + 1),
                    after_ms: None,
                    at: at_times.get(i).cloned().flatten(),
                    purpose: TimerPurpose::Entry(i),
                }),
                WaitFor::Signal { .. } => {}
            }
        }
        if let Some(ms) = wait.timeout_ms {
            timers.push(TimerSpec {
                timer_id: format!("{prefix}.timeout"),
                after_ms: Some(ms),
                at: None,
                purpose: TimerPurpose::Timeout,
            });
        }
        self.emit(Event::WaitStarted {
            node: id,
            signals,
            timers: timers.clone(),
        });
        for t in timers {
            self.command(Command::ScheduleTimer(t));
        }
        Ok(())
    }

    /// A wait node takes `signal`: the node ends, going to the entry's `next`.
    fn consume_signal(
        &mut self,
        node: &str,
        wait: &WaitDef,
        signal: state::BufferedSignal,
        timers: &[TimerSpec],
    ) {
        let next = wait.any.iter().find_map(|f| match f {
            WaitFor::Signal { name, next, .. } if name == &signal.name => Some(next.clone()),
            _ => None,
        });
        self.emit(Event::SignalConsumed {
            node: node.to_owned(),
            signal_id: signal.signal_id.clone(),
        });
        for t in timers {
            self.command(Command::CancelTimer {
                timer_id: t.timer_id.clone(),
            });
        }
        self.emit(Event::NodeCompleted {
            node: node.to_owned(),
            output: json!({
                "signal": signal.name,
                "signal_id": signal.signal_id,
                "payload": signal.payload,
            }),
            next: next.flatten(),
        });
    }

    /// A delivered signal: the current wait takes it if it waits for it.
    fn take_signal(&mut self) -> Result<(), MachineError> {
        let Some(step) = self.state.step.clone() else {
            return Ok(());
        };
        let StepKind::Wait { signals, timers } = &step.kind else {
            return Ok(());
        };
        let Some(signal) = self
            .state
            .signals
            .iter()
            .find(|s| signals.contains(&s.name))
            .cloned()
        else {
            return Ok(());
        };
        let wait = self.wait_def(&step.id)?;
        self.consume_signal(&step.id, &wait, signal, timers);
        Ok(())
    }

    fn wait_def(&self, node: &str) -> Result<WaitDef, MachineError> {
        self.plan()?
            .workflow
            .def
            .nodes
            .iter()
            .find(|n| n.id == node)
            .and_then(|n| match &n.kind {
                NodeKind::Wait(w) => Some(w.clone()),
                _ => None,
            })
            .ok_or_else(|| MachineError::InvalidPlan(format!("node `{node}` is not a wait")))
    }

    /// A signal must be one the workflow waits for, with a payload its
    /// waiting node accepts (the current one's, else the first declaring it).
    fn check_signal(&self, name: &str, payload: &Value) -> Result<(), MachineError> {
        let plan = self.plan()?;
        let mut declared: Vec<(&str, Option<&Value>)> = Vec::new();
        let mut all: Vec<&str> = Vec::new();
        for node in &plan.workflow.def.nodes {
            if let NodeKind::Wait(w) = &node.kind {
                for f in &w.any {
                    if let WaitFor::Signal {
                        name: n,
                        payload_schema,
                        ..
                    } = f
                    {
                        all.push(n);
                        if n == name {
                            declared.push((&node.id, payload_schema.as_ref()));
                        }
                    }
                }
            }
        }
        if declared.is_empty() {
            all.sort_unstable();
            all.dedup();
            return Err(MachineError::InvalidSignal(format!(
                "workflow `{}` has no wait for signal `{name}`; it waits for: {}",
                plan.workflow.def.name,
                if all.is_empty() {
                    "no signals".to_owned()
                } else {
                    all.join(", ")
                }
            )));
        }
        let current = self.state.step.as_ref().map(|s| s.id.as_str());
        let (node, schema) = declared
            .iter()
            .find(|(n, _)| Some(*n) == current)
            .or_else(|| declared.first())
            .copied()
            .unwrap_or(("", None));
        if let Some(schema) = schema
            && let Err(errors) = belay_definitions::validate_json(schema, payload)
        {
            return Err(MachineError::InvalidSignal(format!(
                "the payload of signal `{name}` does not match the `payload_schema` of node `{node}`: {}",
                errors.join("; ")
            )));
        }
        Ok(())
    }

    /// Let go of everything in flight because the run ends now (a cancel,
    /// a wall-time budget): a `reconcile` call dispatched at this moment
    /// may act after all, so it becomes an uncertain outcome the operator
    /// can find (and is notified of); sync child runs and children of
    /// `workflow` tools are cancelled with `child_reason`. The caller ends
    /// the run and cancels the open tasks (`CancelOpenTasks`). `why` starts
    /// the uncertain record's reason ("the run was cancelled").
    fn abandon_in_flight(&mut self, why: &str, child_reason: &str) -> Result<(), MachineError> {
        let in_flight: Vec<(String, state::ToolCallState)> = self
            .state
            .tool_calls
            .iter()
            .filter(|(_, c)| {
                c.status == CallStatus::Open
                    && c.dispatched_attempt.is_some()
                    && c.repeat_safety == RepeatSafety::Reconcile
                    && c.probe_for.is_none()
            })
            .map(|(id, c)| (id.clone(), c.clone()))
            .collect();
        for (call_id, call) in in_flight {
            let attempt = call.dispatched_attempt.unwrap_or(0);
            let reason = format!(
                "{why} while `{}` call `{call_id}` (attempt {attempt}) was dispatched; it may have acted",
                call.tool
            );
            self.record_uncertain(&call_id, &call, attempt, reason)?;
            self.notify_uncertain(&call_id);
        }
        if let Some(StepKind::Child { child_run_id, .. }) =
            self.state.step.as_ref().map(|s| s.kind.clone())
        {
            self.command(Command::CancelChildRun {
                child_run_id,
                reason: child_reason.to_owned(),
            });
        }
        let children: Vec<String> = self
            .state
            .tool_calls
            .values()
            .filter(|c| c.status == CallStatus::Open)
            .filter_map(|c| c.child_run_id.clone())
            .collect();
        for child_run_id in children {
            self.command(Command::CancelChildRun {
                child_run_id,
                reason: child_reason.to_owned(),
            });
        }
        Ok(())
    }

    /// A wall-time timer fired (`max_wall_time`): if it is the run's, or
    /// the current visit's of the agent node in progress, stop the run with
    /// [`Stop::Deadline`], abandoning what is in flight as a cancel does.
    /// `Ok(false)`: not a live deadline timer (another timer, or stale).
    fn on_deadline(&mut self, timer_id: &str, overdue_ms: u64) -> Result<bool, MachineError> {
        let node_timer = self
            .state
            .node
            .as_ref()
            .and_then(|n| n.deadline.as_ref().map(|t| (n.id.clone(), t.clone())))
            .filter(|(_, t)| t.timer_id == timer_id);
        let run_timer = self
            .state
            .deadline
            .clone()
            .filter(|t| t.timer_id == timer_id);
        let (scope, node, timer) = match (node_timer, run_timer) {
            (Some((node, t)), _) => ("node", node, t),
            (None, Some(t)) => {
                let node = self
                    .state
                    .node
                    .as_ref()
                    .map(|n| n.id.clone())
                    .or_else(|| self.state.step.as_ref().map(|s| s.id.clone()))
                    .unwrap_or_default();
                ("run", node, t)
            }
            (None, None) => return Ok(false),
        };
        let limit_ms = timer.after_ms.unwrap_or(0);
        let elapsed_ms = limit_ms.saturating_add(overdue_ms);
        self.emit(Event::TimerFired {
            node: node.clone(),
            timer_id: timer_id.to_owned(),
        });
        self.command(Command::CancelTimer {
            timer_id: timer_id.to_owned(),
        });
        let whose = if scope == "node" {
            let agent = self
                .state
                .node
                .as_ref()
                .map(|n| n.agent.clone())
                .unwrap_or_default();
            format!("agent `{agent}` in node `{node}`")
        } else if node.is_empty() {
            "the run".to_owned()
        } else {
            format!("the run (in node `{node}`)")
        };
        let error = format!(
            "{whose} used its `wall_time` budget ({} of {})",
            show_ms(elapsed_ms),
            show_ms(limit_ms)
        );
        self.abandon_in_flight(
            &format!("the {scope}'s wall-time budget ran out"),
            &format!("its parent run stopped: {error}"),
        )?;
        self.fail_run_stop(
            error,
            Stop::Deadline {
                scope: scope.to_owned(),
                node,
                limit_ms,
                elapsed_ms,
            },
        );
        Ok(true)
    }

    /// A timer is due: it stops the run or node at its wall-time budget,
    /// ends its wait or approval, or is stale.
    fn on_timer(&mut self, timer_id: &str, overdue_ms: u64) -> Result<(), MachineError> {
        let stale = |m: &mut Step| {
            m.command(Command::CancelTimer {
                timer_id: timer_id.to_owned(),
            });
        };
        if self.state.status.is_terminal() || self.state.status == RunStatus::New {
            stale(self);
            return Ok(());
        }
        if self.on_deadline(timer_id, overdue_ms)? {
            return Ok(());
        }
        // A call's own timer: a sync child's timeout or a callback's.
        if let Some((call_id, call, timer)) = self.state.tool_calls.iter().find_map(|(id, c)| {
            let timer = [&c.child_timer, &c.callback_timer]
                .into_iter()
                .flatten()
                .find(|t| t.timer_id == timer_id)?;
            (c.status == CallStatus::Open).then(|| (id.clone(), c.clone(), timer.clone()))
        }) {
            let after = timer.after_ms.map(show_ms).unwrap_or_default();
            self.emit(Event::TimerFired {
                node: call.node.clone(),
                timer_id: timer_id.to_owned(),
            });
            self.command(Command::CancelTimer {
                timer_id: timer_id.to_owned(),
            });
            let (attempt, error) = match &call.child_run_id {
                Some(child) => {
                    self.command(Command::CancelChildRun {
                        child_run_id: child.clone(),
                        reason: format!("its parent gave up waiting after {after}"),
                    });
                    (
                        0,
                        format!("child run {child} did not finish within {after}"),
                    )
                }
                None => (
                    call.dispatched_attempt.unwrap_or(0),
                    format!(
                        "the tool server accepted the request but did not call back within {after}"
                    ),
                ),
            };
            self.emit(Event::ToolCallFailed {
                call_id,
                attempt,
                error,
            });
            return Ok(());
        }
        let Some(step) = self.state.step.clone() else {
            stale(self);
            return Ok(());
        };
        let plan = self.plan_handle()?;
        let def = plan
            .workflow
            .def
            .nodes
            .iter()
            .find(|n| n.id == step.id)
            .cloned()
            .ok_or_else(|| MachineError::InvalidPlan(format!("no node `{}`", step.id)))?;
        match (&step.kind, &def.kind) {
            (StepKind::Wait { timers, .. }, NodeKind::Wait(wait)) => {
                let Some(timer) = timers.iter().find(|t| t.timer_id == timer_id).cloned() else {
                    stale(self);
                    return Ok(());
                };
                self.emit(Event::TimerFired {
                    node: step.id.clone(),
                    timer_id: timer_id.to_owned(),
                });
                for t in timers {
                    self.command(Command::CancelTimer {
                        timer_id: t.timer_id.clone(),
                    });
                }
                match timer.purpose {
                    TimerPurpose::Timeout => {
                        let after = wait.timeout_ms.map(show_ms).unwrap_or_default();
                        match &wait.on_timeout {
                            Some(next) => self.emit(Event::NodeCompleted {
                                node: step.id.clone(),
                                output: json!({"timed_out": true}),
                                next: Some(next.clone()),
                            }),
                            None => self.fail_run(format!(
                                "node `{}` timed out after {after} with nothing it waited for",
                                step.id
                            )),
                        }
                    }
                    // Never among a wait's timers (see `on_deadline`).
                    TimerPurpose::Deadline => {}
                    TimerPurpose::Entry(i) => {
                        let next = wait.any.get(i).and_then(|f| match f {
                            WaitFor::Duration { next, .. } | WaitFor::Until { next, .. } => {
                                next.clone()
                            }
                            WaitFor::Signal { .. } => None,
                        });
                        self.emit(Event::NodeCompleted {
                            node: step.id.clone(),
                            output: json!({"timer": timer_id}),
                            next,
                        });
                    }
                }
            }
            (StepKind::Approval { timer: Some(t), .. }, NodeKind::Approval(approval))
                if t.timer_id == timer_id =>
            {
                self.emit(Event::TimerFired {
                    node: step.id.clone(),
                    timer_id: timer_id.to_owned(),
                });
                self.command(Command::CancelTimer {
                    timer_id: timer_id.to_owned(),
                });
                let after = approval.timeout_ms.map(show_ms).unwrap_or_default();
                match &approval.on_timeout {
                    Some(next) => self.emit(Event::NodeCompleted {
                        node: step.id.clone(),
                        output: json!({"approved": false, "timed_out": true}),
                        next: Some(next.clone()),
                    }),
                    None => {
                        self.fail_run(format!("node `{}`: no decision within {after}", step.id))
                    }
                }
            }
            (
                StepKind::Child {
                    child_run_id,
                    timer: Some(t),
                },
                NodeKind::Workflow {
                    timeout_ms,
                    on_timeout,
                    ..
                },
            ) if t.timer_id == timer_id => {
                self.emit(Event::TimerFired {
                    node: step.id.clone(),
                    timer_id: timer_id.to_owned(),
                });
                self.command(Command::CancelTimer {
                    timer_id: timer_id.to_owned(),
                });
                let after = timeout_ms.map(show_ms).unwrap_or_default();
                self.command(Command::CancelChildRun {
                    child_run_id: child_run_id.clone(),
                    reason: format!("its parent gave up waiting after {after}"),
                });
                match on_timeout {
                    Some(next) => self.emit(Event::NodeCompleted {
                        node: step.id.clone(),
                        output: json!({"timed_out": true, "run_id": child_run_id}),
                        next: Some(next.clone()),
                    }),
                    None => self.fail_run(format!(
                        "node `{}`: child run {child_run_id} did not finish within {after}",
                        step.id
                    )),
                }
            }
            _ => stale(self),
        }
        Ok(())
    }

    /// A child run ended: a sync workflow node waiting for it goes on.
    fn on_child_finished(
        &mut self,
        child_run_id: String,
        status: String,
        output: Option<Value>,
        error: Option<String>,
    ) -> Result<(), MachineError> {
        if self.state.status.is_terminal() || self.state.status == RunStatus::New {
            return Ok(()); // nothing waits for it any more
        }
        // A sync call of a `type: workflow` tool waiting for this child.
        if let Some((call_id, call)) = self
            .state
            .tool_calls
            .iter()
            .find(|(_, c)| {
                c.status == CallStatus::Open && c.child_run_id.as_deref() == Some(&child_run_id)
            })
            .map(|(id, c)| (id.clone(), c.clone()))
        {
            self.emit(Event::ChildRunFinished {
                node: call.node.clone(),
                child_run_id: child_run_id.clone(),
                status: status.clone(),
                output: output.clone(),
                error: error.clone(),
            });
            if let Some(t) = &call.child_timer {
                self.command(Command::CancelTimer {
                    timer_id: t.timer_id.clone(),
                });
            }
            if status == "completed" {
                self.emit(Event::ToolCallCompleted {
                    call_id,
                    attempt: 0,
                    result: output.unwrap_or(Value::Null),
                    cached: None,
                });
            } else {
                self.emit(Event::ToolCallFailed {
                    call_id,
                    attempt: 0,
                    error: format!(
                        "child run {child_run_id} {status}: {}",
                        error.unwrap_or_else(|| status.clone())
                    ),
                });
            }
            return Ok(());
        }
        let Some(step) = self.state.step.clone() else {
            return Ok(());
        };
        let StepKind::Child {
            child_run_id: waited,
            timer,
        } = &step.kind
        else {
            return Ok(());
        };
        if waited != &child_run_id {
            return Ok(()); // an earlier child (timed out), or an async one
        }
        let on_error = self
            .plan()?
            .workflow
            .def
            .nodes
            .iter()
            .find(|n| n.id == step.id)
            .and_then(|n| match &n.kind {
                NodeKind::Workflow { on_error, .. } => on_error.clone(),
                _ => None,
            });
        self.emit(Event::ChildRunFinished {
            node: step.id.clone(),
            child_run_id: child_run_id.clone(),
            status: status.clone(),
            output: output.clone(),
            error: error.clone(),
        });
        if let Some(t) = timer {
            self.command(Command::CancelTimer {
                timer_id: t.timer_id.clone(),
            });
        }
        if status == "completed" {
            self.emit(Event::NodeCompleted {
                node: step.id.clone(),
                output: output.unwrap_or(Value::Null),
                next: None,
            });
        } else {
            let why = error.unwrap_or_else(|| status.clone());
            match on_error {
                Some(next) => self.emit(Event::NodeCompleted {
                    node: step.id.clone(),
                    output: json!({"status": status, "error": why, "run_id": child_run_id}),
                    next: Some(next),
                }),
                None => self.fail_run(format!(
                    "node `{}`: child run {child_run_id} {status}: {why}",
                    step.id
                )),
            }
        }
        Ok(())
    }

    /// A person's decision on the approval node `node`.
    fn on_decision(
        &mut self,
        node: String,
        approve: bool,
        edited_subject: Option<Value>,
        by: String,
        grants: Vec<String>,
        reason: String,
    ) -> Result<(), MachineError> {
        // A misspelt node is named as such, whatever the run is doing.
        if let Ok(plan) = self.plan()
            && !plan.workflow.def.nodes.iter().any(|n| n.id == node)
        {
            return Err(MachineError::NoSuchNode {
                node,
                workflow: plan.workflow.def.name.clone(),
                approvals: plan
                    .workflow
                    .def
                    .nodes
                    .iter()
                    .filter(|n| matches!(n.kind, NodeKind::Approval(_)))
                    .map(|n| n.id.clone())
                    .collect(),
            });
        }
        if self.state.status.is_terminal() || self.state.status == RunStatus::New {
            // A second decision is told about the first, even after the run
            // has ended; any other decision on an ended run is refused.
            if let Some(d) = self.state.decided.get(&node) {
                return Err(MachineError::AlreadyDecided {
                    node,
                    by: d.by.clone(),
                    approved: d.approved,
                    seq: d.seq,
                });
            }
            return Err(self.wrong_status(&format!("decide node `{node}`")));
        }
        let waiting = self
            .state
            .step
            .as_ref()
            .filter(|s| s.id == node)
            .and_then(|s| match &s.kind {
                StepKind::Approval {
                    subject,
                    approver_grant,
                    allow_edits,
                    timer,
                } => Some((
                    subject.clone(),
                    approver_grant.clone(),
                    *allow_edits,
                    timer.clone(),
                )),
                _ => None,
            });
        let Some((subject, approver_grant, allow_edits, timer)) = waiting else {
            // A second decision is told about the first, even after the
            // run has ended.
            if let Some(d) = self.state.decided.get(&node) {
                return Err(MachineError::AlreadyDecided {
                    node,
                    by: d.by.clone(),
                    approved: d.approved,
                    seq: d.seq,
                });
            }
            if self.state.status.is_terminal() || self.state.status == RunStatus::New {
                return Err(self.wrong_status(&format!("decide node `{node}`")));
            }
            return Err(MachineError::NotWaiting(format!(
                "node `{node}` is not waiting for a decision"
            )));
        };
        if !grants.contains(&approver_grant) {
            return Err(MachineError::NotAllowed(format!(
                "deciding node `{node}` needs permission `{approver_grant}`, which {by} does not hold"
            )));
        }
        let approval = self
            .plan()?
            .workflow
            .def
            .nodes
            .iter()
            .find(|n| n.id == node)
            .and_then(|n| match &n.kind {
                NodeKind::Approval(a) => Some(a.clone()),
                _ => None,
            })
            .ok_or_else(|| {
                MachineError::InvalidPlan(format!("node `{node}` is not an approval"))
            })?;
        let (final_subject, edited) = match edited_subject {
            None => (subject, false),
            Some(_) if !approve => {
                return Err(MachineError::NotAllowed(
                    "edits come with an approval, not with a decline".into(),
                ));
            }
            Some(_) if !allow_edits => {
                return Err(MachineError::NotAllowed(format!(
                    "node `{node}` does not allow edits (`allow_edits: true`); approve or decline the subject as it is"
                )));
            }
            Some(edit) => {
                let edit = normalize::strip_nul_value(edit);
                if let Some(schema) = &approval.edits_schema
                    && let Err(errors) = belay_definitions::validate_json(schema, &edit)
                {
                    return Err(MachineError::InvalidEdit { node, errors });
                }
                let edited = edit != subject;
                (edit, edited)
            }
        };
        self.emit(Event::ApprovalDecided {
            node: node.clone(),
            approved: approve,
            by: by.clone(),
            reason: reason.clone(),
            subject: final_subject.clone(),
            edited,
        });
        if let Some(t) = timer {
            self.command(Command::CancelTimer {
                timer_id: t.timer_id,
            });
        }
        let output = json!({"approved": approve, "by": by, "reason": reason, "subject": final_subject, "edited": edited});
        if approve {
            self.emit(Event::NodeCompleted {
                node,
                output,
                next: None,
            });
        } else {
            match approval.on_decline {
                Some(next) => self.emit(Event::NodeCompleted {
                    node,
                    output,
                    next: Some(next),
                }),
                None => self.fail_run(format!("node `{node}` was declined by {by}: {reason}")),
            }
        }
        Ok(())
    }
}

/// The task spec of a call of `tool` with `arguments` and idempotency `key`.
/// Whether the next model call of `node` would go past a budget: the
/// agent's `loop:` steps and `budget:` (scope `node`), then the workflow's
/// `budget:` over the whole run (scope `run`). The message and the typed
/// stop, or `None`.
fn out_of_budget(
    agent: &AgentDef,
    node: &state::NodeState,
    run: &Budget,
    totals: &state::RunTotals,
) -> Option<(String, Stop)> {
    let (max_model_steps, _) = agent.loop_policy.bounds();
    let node_limits: [(&str, Option<f64>, f64); 5] = [
        (
            "model_steps",
            Some(f64::from(max_model_steps)),
            f64::from(node.model_steps),
        ),
        (
            "tokens",
            agent.budget.max_tokens.map(|n| n as f64),
            node.tokens as f64,
        ),
        (
            "input_tokens",
            agent.budget.max_input_tokens.map(|n| n as f64),
            node.input_tokens as f64,
        ),
        (
            "output_tokens",
            agent.budget.max_output_tokens.map(|n| n as f64),
            node.output_tokens as f64,
        ),
        ("cost_usd", agent.budget.max_cost_usd, node.cost_usd),
    ];
    let run_tokens = totals.input_tokens.saturating_add(totals.output_tokens);
    let run_limits: [(&str, Option<f64>, f64); 5] = [
        (
            "model_steps",
            run.max_model_steps.map(f64::from),
            f64::from(totals.model_steps),
        ),
        (
            "tokens",
            run.max_tokens.map(|n| n as f64),
            run_tokens as f64,
        ),
        (
            "input_tokens",
            run.max_input_tokens.map(|n| n as f64),
            totals.input_tokens as f64,
        ),
        (
            "output_tokens",
            run.max_output_tokens.map(|n| n as f64),
            totals.output_tokens as f64,
        ),
        ("cost_usd", run.max_cost_usd, totals.cost_usd),
    ];
    let number = |v: f64, budget: &str| -> Value {
        if budget == "cost_usd" {
            serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number)
        } else {
            Value::from(v as u64)
        }
    };
    for (scope, limits) in [("node", node_limits), ("run", run_limits)] {
        for (budget, limit, used) in limits {
            let Some(limit) = limit else { continue };
            if used < limit {
                continue;
            }
            let whose = if scope == "node" {
                format!("agent `{}` in node `{}`", agent.name, node.id)
            } else {
                format!("the run (in node `{}`)", node.id)
            };
            let error = if budget == "model_steps" && scope == "node" {
                format!(
                    "{whose} reached its bound of {max_model_steps} model steps without a final answer"
                )
            } else {
                let show = |v: f64| {
                    if budget == "cost_usd" {
                        format!("{v:.6} USD")
                    } else {
                        format!("{}", v as u64)
                    }
                };
                format!(
                    "{whose} used its `{budget}` budget ({} of {})",
                    show(used),
                    show(limit)
                )
            };
            return Some((
                error,
                Stop::Budget {
                    budget: budget.to_owned(),
                    scope: scope.to_owned(),
                    node: node.id.clone(),
                    limit: number(limit, budget),
                    used: number(used, budget),
                },
            ));
        }
    }
    None
}

/// The `ToolCallSpec.input` of a call repeated after a person's answer
/// (the worker's MCP client reads it as its `InputAnswers`): for
/// `input_required`, the responses with the server's `request_state`; for an
/// elicitation, every answer of the call so far in the order asked (the
/// repeated call meets the same questions again); for
/// `url_elicitation_required`, nothing but the fact that the person was
/// there. Errors: [`MachineError::InvalidInput`] naming each problem.
fn input_for_repeat(
    call_id: &str,
    asked: &state::AwaitingInput,
    answer: &Value,
    so_far: &Value,
) -> Result<Value, MachineError> {
    let invalid = |errors: Vec<String>| MachineError::InvalidInput {
        call_id: call_id.to_owned(),
        errors,
    };
    // One elicitation answer: `{action, content?}`, the content checked
    // against the form's schema when accepted.
    let check_answer = |pointer: &str, answer: &Value, schema: Option<&Value>| -> Vec<String> {
        let Some(map) = answer.as_object() else {
            // The answer itself: `/` at the root, else its own pointer.
            let at = if pointer.is_empty() { "/" } else { pointer };
            return vec![format!(
                "{at}: an answer is an object `{{\"action\": \"accept\"|\"decline\"|\"cancel\", \"content\": {{...}}}}`"
            )];
        };
        let mut errors = Vec::new();
        if let Some(key) = map
            .keys()
            .find(|k| !matches!(k.as_str(), "action" | "content"))
        {
            errors.push(format!(
                "{pointer}/{key}: unknown field (an answer has `action` and `content`)"
            ));
        }
        match map.get("action").and_then(Value::as_str) {
            Some("accept") => {
                if let (Some(schema), content) = (schema, map.get("content")) {
                    let content = content
                        .cloned()
                        .unwrap_or(Value::Object(Default::default()));
                    if let Err(e) = belay_definitions::validate_json(schema, &content) {
                        // `/: msg` (the form itself) or `/name: msg`.
                        errors.extend(e.into_iter().map(|e| match e.strip_prefix("/: ") {
                            Some(msg) => format!("{pointer}/content: {msg}"),
                            None => format!("{pointer}/content{e}"),
                        }));
                    }
                }
            }
            Some("decline" | "cancel") => {
                if map.contains_key("content") {
                    errors.push(format!(
                        "{pointer}/content: only an accepted answer has content"
                    ));
                }
            }
            _ => errors.push(format!(
                "{pointer}/action: must be \"accept\", \"decline\" or \"cancel\""
            )),
        }
        errors
    };
    match asked.via.as_str() {
        "input_required" => {
            let Some(responses) = answer.get("responses").and_then(Value::as_object) else {
                return Err(invalid(vec![
                    "/responses: an object answering each of the tool's requests by its key".into(),
                ]));
            };
            let requests = asked.requests.as_object().cloned().unwrap_or_default();
            let mut errors = Vec::new();
            for key in requests.keys().filter(|k| !responses.contains_key(*k)) {
                errors.push(format!("/responses/{key}: not answered"));
            }
            for (key, response) in responses {
                match requests.get(key) {
                    None => {
                        errors.push(format!("/responses/{key}: the tool asked no such request"))
                    }
                    Some(request) => {
                        let schema = request.pointer("/params/requestedSchema");
                        errors.extend(check_answer(&format!("/responses/{key}"), response, schema));
                    }
                }
            }
            if !errors.is_empty() {
                return Err(invalid(errors));
            }
            Ok(serde_json::json!({
                "responses": responses,
                "request_state": asked.request_state,
            }))
        }
        via => {
            // An elicitation form (or a URL the person visited).
            let url = via == "url_elicitation_required"
                || asked.requests.get("mode").and_then(Value::as_str) == Some("url");
            let schema = if url {
                None
            } else {
                asked.requests.get("requestedSchema")
            };
            let errors = check_answer("", answer, schema);
            if !errors.is_empty() {
                return Err(invalid(errors));
            }
            if url && answer.get("content").is_some() {
                return Err(invalid(vec![
                    "/content: a URL request has no form to fill; answer with the action only"
                        .into(),
                ]));
            }
            if via == "url_elicitation_required" {
                // The server refused to start until the person finished at the URL.
                return Ok(serde_json::json!({}));
            }
            let mut elicitations = so_far
                .get("elicitations")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            // With the question it answers, so the repeated call does not
            // give it to another question (`ElicitationAnswer::question`).
            let mut answered = answer.clone();
            if let Value::Object(map) = &mut answered {
                map.insert("question".into(), asked.requests.clone());
            }
            elicitations.push(answered);
            Ok(serde_json::json!({ "elicitations": elicitations }))
        }
    }
}

/// The task spec of a call of `tool` with `arguments`, sending the request
/// of its `request_variants:` item `variant` (`None`: the tool's own).
fn tool_spec(
    tool: &Pinned<ToolDef>,
    arguments: &Value,
    key: &str,
    variant: Option<&str>,
) -> Result<Value, MachineError> {
    let binding = match &tool.def.binding {
        ToolBindingDef::Http {
            endpoint,
            method,
            headers,
            timeout_ms,
            request,
        } => ToolBinding::Http(HttpBinding {
            endpoint: endpoint.clone(),
            method: method.clone(),
            headers: headers.clone(),
            timeout_ms: *timeout_ms,
            request: request.clone(),
        }),
        ToolBindingDef::AsyncWebhook {
            endpoint,
            method,
            headers,
            timeout_ms,
            callback_url_field,
            request,
            ..
        } => ToolBinding::AsyncWebhook(AsyncWebhookBinding {
            http: HttpBinding {
                endpoint: endpoint.clone(),
                method: method.clone(),
                headers: headers.clone(),
                timeout_ms: *timeout_ms,
                request: request.clone(),
            },
            callback_url_field: callback_url_field.clone(),
        }),
        ToolBindingDef::Mcp {
            server,
            server_tool,
            headers,
            timeout_ms,
        } => ToolBinding::Mcp(McpBinding {
            server: server.clone(),
            server_tool: server_tool.clone(),
            headers: headers.clone(),
            timeout_ms: *timeout_ms,
        }),
        ToolBindingDef::McpResource {
            server,
            uri_template,
            timeout_ms,
        } => ToolBinding::McpResource(belay_proto::wire::McpResourceBinding {
            server: server.clone(),
            uri_template: uri_template.clone(),
            timeout_ms: *timeout_ms,
        }),
        ToolBindingDef::Sandbox(sandbox) => ToolBinding::Sandbox(sandbox.clone()),
        ToolBindingDef::Workflow { .. } => {
            return Err(MachineError::InvalidPlan(format!(
                "tool `{}` is not called through a worker",
                tool.def.name
            )));
        }
    };
    let binding = match variant {
        None => binding,
        Some(name) => {
            let chosen = variants::named(&tool.def, name).ok_or_else(|| {
                MachineError::InvalidPlan(format!(
                    "tool `{}` has no request variant `{name}`",
                    tool.def.name
                ))
            })?;
            variants::apply(binding, chosen)
        }
    };
    let spec = ToolCallSpec {
        tool: tool.def.name.clone(),
        tool_version: tool.version,
        arguments: arguments.clone(),
        binding,
        idempotency_key: key.to_owned(),
        input: None,
        config_params: inject::config_params(&tool.def),
        result_secrets: tool
            .def
            .result_secrets
            .iter()
            .map(|r| belay_proto::wire::ResultSecret {
                path: r.path.clone(),
                key: r.key.clone(),
            })
            .collect(),
        variant: variant.map(str::to_owned),
        sampling: None,
    };
    serde_json::to_value(&spec).map_err(|e| MachineError::InvalidPlan(format!("tool spec: {e}")))
}

/// Check 2: the arguments are JSON within `limit` bytes, an object that
/// names none of the parameters the model does not supply, and valid
/// against the schema the model was given once its defaults are filled in.
fn decode_arguments(raw: &str, limit: usize, def: &ToolDef) -> Result<Value, String> {
    let schema = def.model_schema();
    if raw.len() > limit {
        return Err(format!(
            "arguments are {} bytes, more than the limit of {limit} bytes",
            raw.len()
        ));
    }
    let raw = if raw.trim().is_empty() { "{}" } else { raw };
    let value: Value = serde_json::from_str(raw)
        .map_err(|e| format!("arguments are not valid JSON ({e}); send a JSON object"))?;
    let mut value = normalize::strip_nul_value(value);
    if def.strict_schema.is_some() {
        // The strict schema made optional parameters nullable: a `null`
        // there means "not given" (the default applies, as when left out).
        belay_definitions::strict::strip_optional_nulls(schema, &mut value);
    }
    let Value::Object(mut map) = value else {
        return Err("arguments must be a JSON object".into());
    };
    let sent = inject::sent_anyway(def, &map);
    if !sent.is_empty() {
        return Err(inject::not_yours(&sent));
    }
    fill_defaults(&mut map, schema);
    let value = Value::Object(map);
    belay_definitions::validate_json(schema, &value).map_err(|errors| {
        format!(
            "arguments do not match the tool's input schema: {}",
            errors.join("; ")
        )
    })?;
    Ok(value)
}

/// An agent's final answer `text` checked against its `output_schema`:
/// the JSON value (the text, or the one fenced code block it is wrapped in,
/// as models often write ```` ```json … ``` ````), or the violations.
fn checked_final_answer(schema: &Value, text: &str) -> Result<Value, Vec<String>> {
    let trimmed = text.trim();
    let unfenced = trimmed
        .strip_prefix("```")
        .and_then(|rest| rest.strip_suffix("```"))
        .map(|inner| {
            // The info string (`json`) ends at the first line break.
            inner.split_once('\n').map_or(inner, |(info, body)| {
                if info.trim().chars().all(|c| c.is_ascii_alphanumeric()) {
                    body
                } else {
                    inner
                }
            })
        })
        .unwrap_or(trimmed);
    let value: Value = serde_json::from_str(unfenced).map_err(|e| {
        vec![format!(
            "the answer is not JSON ({e}); it must be one JSON value"
        )]
    })?;
    belay_definitions::validate_json(schema, &value)?;
    Ok(value)
}

/// Fill absent top-level properties that declare a `default`, so the value
/// that is validated is the value that is persisted and sent.
fn fill_defaults(map: &mut Map<String, Value>, schema: &Value) {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    for (name, prop) in props {
        if !map.contains_key(name)
            && let Some(default) = prop.get("default")
        {
            map.insert(name.clone(), default.clone());
        }
    }
}

mod inject;
mod process;
mod sampling;
pub mod untraced;
mod variants;

#[cfg(test)]
mod tests;
