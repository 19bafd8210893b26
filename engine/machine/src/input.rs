//! What the coordinator feeds [`decide`](fn@crate::decide): an [`Input`], one
//! variant per thing that can happen to a run, and an operator's (or a
//! probe's) [`Resolution`] of an uncertain outcome.

use belay_proto::wire::ModelCallResult;
use serde_json::Value;

use crate::cache;
use crate::event::FailureClass;
use crate::gates::GateVerdict;
use crate::plan::RunPlan;
use crate::vault::SealedSecret;

/// Something that happened to a run, fed to [`decide`](fn@crate::decide).
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
        /// The W3C trace context the run is started in (the caller's
        /// `traceparent`, or a new trace the engine made); `None`: not
        /// traced.
        trace: Option<belay_proto::trace::TraceContext>,
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
    /// A `type: mcp` call's result or failure (`report`, possibly inside
    /// an [`Input::ToolCallSampled`]) with what the worker adds: the
    /// definition hash the call was checked against (recorded as
    /// `mcp_definition_checked` before it) and the kind of its failure (set
    /// on the `tool_call_attempt_failed` and `tool_call_failed` it leads
    /// to). Added for issue 22.
    McpReported {
        /// The pinned definition hash, if the worker reported one.
        definition_hash: Option<String>,
        /// The kind of failure, for a failure.
        kind: Option<crate::event::ToolFailureKind>,
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
        /// The question answered (`<call_id>.input<n>`, from its
        /// `tool_call_input_requested` event). `None`: the call's open
        /// question, accepted only while the call has asked once (issue 22).
        request: Option<String>,
        /// The answer: `{"action": "accept"|"decline"|"cancel", "content"?:
        /// {...}}` for `elicitation` and `url_elicitation_required`,
        /// `{"responses": {<key>: <answer>}}` for `input_required`.
        answer: Value,
        /// Who answers.
        by: String,
    },
    /// The tenant's tool cache holds a live result for a call the decision
    /// before it launched ([`Command::LookupToolCache`](crate::Command::LookupToolCache)); decided by the
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
        /// Node id, or a call id for a tool call's confirmation.
        node: String,
        /// The request decided (`<node>.approval`, `<node>~<n>.approval`,
        /// or a confirmation's call id). `None`: the node's request,
        /// accepted only while the node has been requested once (issue 22).
        request: Option<String>,
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
