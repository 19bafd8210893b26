//! The events of a run's history. Persisted as JSON in `events.payload`;
//! internally tagged with `type`, which is also stored in `events.kind`.
//!
//! Append-only rules: variants and fields are only ever added (new fields with
//! `#[serde(default)]`), never renamed or removed once stored.

use std::collections::BTreeMap;

use belay_proto::wire::{SamplingUsage, ToolUse, Usage};
use serde::{Deserialize, Serialize};

use belay_definitions::model::ChildMode;
use serde_json::Value;

use super::plan::RunPlan;
use belay_definitions::model::RepeatSafety;

/// How a failure relates to the effect, as reported by the worker or implied
/// by a lost lease (mirror of proto `FailureClass`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureClass {
    /// Provably nothing was sent: safe to retry.
    NotSent,
    /// The effect may have happened: repeat safety decides.
    MayHaveActed,
    /// The tool or provider answered with a definite error: no retry.
    Rejected,
}

/// Which of three kinds of failure ended an attempt of a `type: mcp` call
/// (mirror of proto `ToolFailureKind`): the tool's own answer, the
/// protocol's, or the transport's. Added for issue 22.
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

/// How an uncertain outcome was resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResolutionKind {
    /// The call took effect; a result is given.
    Succeeded,
    /// The call did not take effect (or failed); the model is told.
    Failed,
    /// Try again, with the same idempotency key or a new one.
    Retry,
}

impl ResolutionKind {
    /// API / database spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ResolutionKind::Succeeded => "succeeded",
            ResolutionKind::Failed => "failed",
            ResolutionKind::Retry => "retry",
        }
    }
}

/// Who resolved an uncertain outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResolvedVia {
    /// An operator, through the admin endpoint or the CLI.
    Operator,
    /// The worker that lost its lease reported the real result after all.
    LateResult,
    /// A reconcile probe looked the effect up.
    Probe,
    /// The tool server's callback (`type: async_webhook`). Added after v0.1.
    Callback,
}

impl ResolvedVia {
    /// API / database spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ResolvedVia::Operator => "operator",
            ResolvedVia::LateResult => "late_result",
            ResolvedVia::Probe => "probe",
            ResolvedVia::Callback => "callback",
        }
    }
}

/// What a reconcile probe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeOutcome {
    /// The effect exists; its result resolves the call as succeeded.
    Found,
    /// Definitely no effect: safe to retry with the same key.
    NotFound,
    /// Anything else: left for an operator.
    Undecided,
}

/// A durable timer: fires once, `after_ms` from when it was set or `at` a
/// time, by the engine's clock (the database's, which tests control).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimerSpec {
    /// Unique in the run (`<node>.t-<n>`, `<node>.timeout`).
    pub timer_id: String,
    /// ms from when it was set.
    #[serde(default)]
    pub after_ms: Option<u64>,
    /// An RFC 3339 time.
    #[serde(default)]
    pub at: Option<String>,
    /// What it ends: `timeout`, or the index of the wait's entry.
    pub purpose: TimerPurpose,
}

/// What firing a timer means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "entry")]
pub enum TimerPurpose {
    /// The node's timeout.
    Timeout,
    /// Entry `n` (0-based) of a wait's `for:` list (a duration or a time).
    Entry(usize),
    /// The wall-time budget (`max_wall_time`) of an agent's node or of the
    /// run. Added after v0.1.
    Deadline,
}

impl TimerPurpose {
    /// For status reasons: `the timeout` or `a timer`.
    pub fn label(self) -> &'static str {
        match self {
            TimerPurpose::Timeout => "the timeout",
            TimerPurpose::Entry(_) => "a timer",
            TimerPurpose::Deadline => "the wall-time budget",
        }
    }
}

/// One entry of a run's history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// The run was created; `plan` pins every definition it will use.
    RunStarted {
        /// Run id (uuid text), so the fold can mint idempotency keys.
        run_id: String,
        /// Tenant owning the run.
        tenant: String,
        /// Who started it.
        caller: String,
        /// Permissions the caller holds.
        caller_grants: Vec<String>,
        /// Permissions of the tenant when the run started.
        tenant_grants: Vec<String>,
        /// Run input.
        input: Value,
        /// Workflow, agents and tools, resolved and pinned.
        plan: Box<RunPlan>,
        /// The run's wall-time timer (`run~deadline`), when the workflow's
        /// `budget:` has `max_wall_time`. Added after v0.1.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        deadline: Option<TimerSpec>,
        /// The run's W3C trace context: the parent of every span of the
        /// run, in any engine or worker process. Added for issue 21
        /// (traces); absent: not traced.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        trace: Option<belay_proto::trace::TraceContext>,
    },
    /// A node began.
    NodeStarted {
        /// Node id.
        node: String,
        /// Its input.
        input: Value,
        /// The node's wall-time timer (`<visit prefix>.deadline`), when its
        /// agent's `budget:` has `max_wall_time`. Added after v0.1.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        deadline: Option<TimerSpec>,
    },
    /// A model call task was created.
    ModelCallScheduled {
        /// Node id.
        node: String,
        /// Call id, unique in the run (`<node>.m<step>`).
        call_id: String,
        /// 1-based model step within the node.
        step: u32,
    },
    /// One attempt of a model call failed.
    ModelCallAttemptFailed {
        /// Call id.
        call_id: String,
        /// Attempt that failed.
        attempt: u32,
        /// What went wrong.
        error: String,
        /// Whether the engine will try again.
        will_retry: bool,
    },
    /// The model answered.
    ModelCallCompleted {
        /// Call id.
        call_id: String,
        /// Attempt whose result this is.
        attempt: u32,
        /// Answer text.
        content: Option<String>,
        /// Proposed tool calls, ids made unique, arguments as the model wrote them.
        tool_calls: Vec<ToolUse>,
        /// Tokens used.
        usage: Usage,
        /// Why the provider stopped (`stop`, `tool_calls`, `length`, ...), as
        /// the worker mapped it. A `length` turn's tool calls are refused.
        /// Added after v0.1.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        finish_reason: Option<String>,
    },
    /// A proposed tool call failed one of the four checks; `reason` went
    /// back to the model as the call's result.
    ToolCallRefused {
        /// Node id.
        node: String,
        /// The model's tool_use id.
        tool_use_id: String,
        /// Tool name as the model wrote it.
        tool: String,
        /// Which check failed (`not_on_list`, `invalid_arguments`, `permission`,
        /// `budget`, …; `parameter_source`: a parameter the tool supplies
        /// itself (`source:`) could not be filled in; `request_variant`: a
        /// `when:` of the tool's `request_variants:` failed or gave no
        /// boolean).
        check: String,
        /// Message for the model.
        reason: String,
    },
    /// A proposed tool call passed the checks; a tool call task was created.
    ToolCallScheduled {
        /// Node id.
        node: String,
        /// Call id (`<node>.t<n>`).
        call_id: String,
        /// The model's tool_use id.
        tool_use_id: String,
        /// Tool name.
        tool: String,
        /// Tool definition version.
        tool_version: u32,
        /// Arguments exactly as validated and as they will be sent.
        arguments: Value,
        /// Idempotency key of the call (same for every attempt).
        idempotency_key: String,
        /// The tool's repeat safety.
        repeat_safety: RepeatSafety,
        /// The `request_variants:` item the call sends (its `when` was true
        /// for `arguments`, or it is the default); `None`: the tool's own
        /// request. For a call that waits for a confirmation, the variant
        /// of the arguments as proposed (`ConfirmationDecided.variant` is
        /// the one that runs). Added for issue 4.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        variant: Option<String>,
        /// Also the start of tool node `node` with `arguments` as its
        /// input: what a [`Event::NodeStarted`] right before this event
        /// (no deadline) records, folded in. Added for issue 23 (a loop
        /// step wrote the node's input twice); written only once every
        /// engine of the fleet reads it (behaviour level
        /// [`crate::level::FOLDED_TOOL_NODE`]).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        starts_node: bool,
    },
    /// A worker was allowed to start the side effect of an attempt.
    ToolCallDispatched {
        /// Call id.
        call_id: String,
        /// Attempt dispatched.
        attempt: u32,
        /// Worker that asked.
        worker_id: String,
    },
    /// A dispatch was held back by the tool's `rate_limit:`: nothing was
    /// sent, the worker was told not to act, and the task is ready again at
    /// `until` (by the engine's clock). Not an attempt: it counts against no
    /// retry allowance. Added after v0.1.
    ToolCallDeferred {
        /// Call id.
        call_id: String,
        /// The attempt that asked.
        attempt: u32,
        /// Worker that asked.
        worker_id: String,
        /// When the call gets its turn (RFC 3339).
        until: String,
        /// Why, in words.
        reason: String,
    },
    /// A dispatched attempt of a `type: async_webhook` call got a callback
    /// URL. Only the SHA-256 of its single-use token is kept (here and in the
    /// `callbacks` table); the token itself went to the worker once. Every
    /// token issued for a call stays valid until the call ends or the token
    /// is used. Added after v0.1.
    CallbackIssued {
        /// Call id.
        call_id: String,
        /// Attempt it was issued to.
        attempt: u32,
        /// Lower-case hex SHA-256 of the token.
        token_sha256: String,
    },
    /// The tool server accepted a `type: async_webhook` request (2xx); the
    /// call now waits for its callback until `timer` fires. Added after v0.1.
    ToolCallAccepted {
        /// Call id.
        call_id: String,
        /// Attempt whose request was accepted.
        attempt: u32,
        /// The server's answer to the request (not the result).
        response: Value,
        /// When the call gives up waiting (`<call>.callback`).
        timer: TimerSpec,
    },
    /// A callback arrived for a `type: async_webhook` call and its token was
    /// used up; a `ToolCallCompleted` (or a resolution, or a late result)
    /// follows in the same transition. Added after v0.1.
    CallbackReceived {
        /// Call id.
        call_id: String,
        /// Attempt the token was issued to.
        attempt: u32,
        /// Hex SHA-256 of the token used.
        token_sha256: String,
    },
    /// A call of a tool with `confirmation: require: always` waits for a
    /// person's decision before anything is dispatched. Added after v0.1.
    ConfirmationRequested {
        /// Node id.
        node: String,
        /// Call id (the decision names it, as `DecideApproval.node`).
        call_id: String,
        /// Tool name.
        tool: String,
        /// The exact arguments the approver sees.
        arguments: Value,
        /// Permission an approver needs.
        approver_grant: String,
        /// Arguments the approver may not edit.
        immutable_params: Vec<String>,
    },
    /// A person decided a confirmation. On approval the call runs with
    /// exactly `arguments`; a decline goes back as "the user declined".
    /// Added after v0.1.
    ConfirmationDecided {
        /// Call id.
        call_id: String,
        /// Approved or declined.
        approved: bool,
        /// Who.
        by: String,
        /// Why.
        reason: String,
        /// The arguments approved (edited or not); `null` when declined.
        arguments: Value,
        /// Whether the approver edited them.
        edited: bool,
        /// The `request_variants:` item the approved call sends, chosen for
        /// `arguments`; `None`: the tool's own request (or declined).
        /// Added for issue 4.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        variant: Option<String>,
    },
    /// A tool call asked, mid-call, for input from a person (an MCP
    /// server's elicitation). The attempt's task ended; the run waits until
    /// `ProvideToolInput` answers, then the call runs again with the same
    /// idempotency key and the answers. Added after v0.1.
    ToolCallInputRequested {
        /// Call id.
        call_id: String,
        /// This request's id (`<call_id>.input<n>` for the call's n-th
        /// question), which an answer names. Empty in events written
        /// before issue 22: the fold derives it.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        request_id: String,
        /// The attempt that asked.
        attempt: u32,
        /// How the server asked: `input_required` (MCP 2026-07-28),
        /// `elicitation` (`elicitation/create` during the call) or
        /// `url_elicitation_required` (error -32042).
        via: String,
        /// What it asked, as the server sent it (untrusted data: shown to
        /// the person, never executed).
        requests: Value,
        /// Opaque state the server wants echoed with the answers.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        request_state: Option<String>,
    },
    /// A person answered a [`Event::ToolCallInputRequested`]; the call is
    /// scheduled again with `input`. Added after v0.1.
    ToolCallInputProvided {
        /// Call id.
        call_id: String,
        /// The request answered. Empty in events written before issue 22:
        /// the call's open request.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        request_id: String,
        /// Who answered.
        by: String,
        /// The answer as given (checked against what was asked).
        answer: Value,
        /// What the repeated call carries (`ToolCallSpec.input`): every
        /// answer of the call so far, in order.
        input: Value,
    },
    /// An attempt of a tool call failed (reported, or its lease expired).
    ToolCallAttemptFailed {
        /// Call id.
        call_id: String,
        /// Attempt.
        attempt: u32,
        /// What went wrong.
        error: String,
        /// Whether the effect may have happened.
        class: FailureClass,
        /// Whether this attempt had been dispatched.
        dispatched: bool,
        /// Whether another attempt will run.
        will_retry: bool,
        /// The HTTP status the tool answered with, if it answered. A
        /// `not_sent` failure with a status (429, a 5xx to a safe method)
        /// counts against the tool's `retry_policy`; one without (nothing
        /// reached the tool) has the separate not-sent allowance. Added
        /// after v0.1.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status_code: Option<u16>,
        /// When `will_retry`: the delay before the next attempt, ms (the
        /// tool's `retry_policy`, jitter drawn, or the engine's backoff). The
        /// next attempt is due at this event's `recorded_at` plus this.
        /// Added after v0.1.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_delay_ms: Option<u64>,
        /// For a `type: mcp` call: which kind of failure it was (the tool's
        /// `isError`, a JSON-RPC error, the transport), as the worker
        /// reported it. Added for issue 22.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kind: Option<ToolFailureKind>,
    },
    /// Right before the event that records an attempt's result, failure or
    /// question for a person (`tool_call_completed`,
    /// `tool_call_attempt_failed`, `tool_call_failed`,
    /// `uncertain_outcome_recorded`, `tool_call_input_requested`), in the same
    /// transition: the model completions the worker made for the tool's MCP
    /// server during that attempt (`sampling/createMessage`, within the
    /// spec's `SamplingGrant`). The fold charges the tokens to the run's
    /// totals and, when the call is the running agent node's, to the node
    /// (with the agent's `pricing:`), like a model call's, so `budget:`
    /// limits count them. Added for MCP sampling.
    ToolCallSampled {
        /// Call id.
        call_id: String,
        /// The attempt that made the completions.
        attempt: u32,
        /// Completions and tokens, as the worker reported them.
        usage: SamplingUsage,
    },
    /// The tool call succeeded.
    ToolCallCompleted {
        /// Call id.
        call_id: String,
        /// Attempt whose result this is (0: no attempt was made, as for a
        /// cached result or an async child run's id).
        attempt: u32,
        /// The tool's result, whole (the model sees it truncated).
        result: Value,
        /// Set when the result came from the tenant's result cache
        /// (`hints.cacheable`): no task was scheduled, nothing was
        /// dispatched, the tool was not called. Added for issue 4 (result
        /// cache).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cached: Option<super::cache::CachedResult>,
        /// Also the end of the tool node whose call this is, with the
        /// call's result (after its `process.after` stage) as the node's
        /// output and the node's `next`: what a [`Event::NodeCompleted`]
        /// right after this event records, folded in. Added for issue 23;
        /// written only from behaviour level
        /// [`crate::level::FOLDED_TOOL_NODE`].
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        ends_node: bool,
    },
    /// The tool call failed for good; the model sees `error`.
    ToolCallFailed {
        /// Call id.
        call_id: String,
        /// Last attempt.
        attempt: u32,
        /// Message for the model.
        error: String,
        /// For a `type: mcp` call whose last attempt's failure ended it:
        /// which kind of failure that was (see
        /// [`Event::ToolCallAttemptFailed`]). Added for issue 22.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kind: Option<ToolFailureKind>,
    },
    /// Right before the event that records an attempt's result or failure
    /// (in the same transition): the `type: mcp` call of that attempt was
    /// checked against, and sent with, this tool definition (the tenant's
    /// pin the dispatch returned), as the worker reported. Added for issue
    /// 22.
    McpDefinitionChecked {
        /// Call id.
        call_id: String,
        /// The attempt.
        attempt: u32,
        /// `sha256:<hex>` of the canonical definition.
        definition_hash: String,
    },
    /// Right after a call's [`Event::ToolCallCompleted`] (or
    /// [`Event::ToolCallFailed`]): the tool's `on_result.set` (or
    /// `on_error.set`) expressions, evaluated, written to the run's
    /// `.vars`. An expression that failed sets nothing; its variable is in
    /// `errors` with the reason. Added for issue 4.
    ToolVarsSet {
        /// Call id.
        call_id: String,
        /// Tool name.
        tool: String,
        /// `on_result` or `on_error`.
        from: String,
        /// Variables set, with their values.
        values: serde_json::Map<String, Value>,
        /// Variables not set: why their expression failed.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        errors: BTreeMap<String, String>,
    },
    /// Right after a producer's [`Event::ToolCallCompleted`]: the fields of
    /// its result that went into the run's secret vault (`RESULT_SECRETS`),
    /// by key and options; never a value (the result holds
    /// `[VAULTED:<key>]` in their place). `absent`: declared keys the result
    /// had no value for. Added for issue 4.
    SecretsVaulted {
        /// Call id.
        call_id: String,
        /// Tool name.
        tool: String,
        /// Keys put into the vault.
        keys: Vec<super::vault::VaultedKey>,
        /// Declared keys left out: the result had no value at their path.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        absent: Vec<String>,
    },
    /// A tool's `process:` stage that changed what a call runs with or
    /// what is made of its result (`machine/process.rs`). `after`: just
    /// before the call's [`Event::ToolCallCompleted`] (which keeps the raw
    /// result); `result` is what the model, `on_result` and a tool node's
    /// output get instead. `before`: after the call's
    /// [`Event::ToolCallScheduled`], when the stage failed and `on_fail`
    /// (`warn`, `use_original`) let the call run with the model's
    /// arguments. Added for issue 4.
    ToolCallProcessed {
        /// Call id.
        call_id: String,
        /// Tool name.
        tool: String,
        /// `before` or `after`.
        stage: String,
        /// `ok`, `block`, `reask`, `warn`, `use_original` or `fallback`.
        outcome: String,
        /// The `on_fail` message, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
        /// Why the stage failed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        /// `after`: the result used instead of the raw one (none: the raw
        /// one, or, for `block`, nothing: the model reads
        /// `error: <message>`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        result: Option<Value>,
    },
    /// A lease expired before the worker reported.
    TaskLeaseExpired {
        /// Call id.
        call_id: String,
        /// Attempt whose lease expired.
        attempt: u32,
        /// Whether that attempt had been dispatched.
        dispatched: bool,
        /// When the call is retried: the delay before the next attempt, ms,
        /// as in [`Event::ToolCallAttemptFailed`]. Added after v0.1.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_delay_ms: Option<u64>,
    },
    /// A reconcile-class call's outcome is unknown; an uncertain-outcome
    /// record was written.
    UncertainOutcomeRecorded {
        /// Call id.
        call_id: String,
        /// Last attempt.
        attempt: u32,
        /// Why the outcome is unknown.
        reason: String,
    },
    /// The run stopped until someone acts.
    RunPaused {
        /// Why.
        reason: String,
        /// The operator who paused it; `None` when the engine paused it on an
        /// uncertain outcome. Added after v0.1.
        #[serde(default)]
        operator: Option<String>,
    },
    /// An operator pause was lifted, or the last uncertain outcome was
    /// resolved. The run is running again unless uncertain outcomes remain.
    RunResumed {
        /// Who resumed it (operator, `probe:<tool>`, `worker:<id>`).
        by: String,
        /// Why.
        reason: String,
    },
    /// An operator lifted their pause, but an uncertain outcome still holds
    /// the run paused.
    OperatorPauseLifted {
        /// Who.
        by: String,
        /// Why.
        reason: String,
    },
    /// An uncertain outcome was resolved.
    UncertainOutcomeResolved {
        /// Call id.
        call_id: String,
        /// `succeeded`, `failed` or `retry`.
        resolution: ResolutionKind,
        /// For `succeeded`: the result used as the call's result.
        #[serde(default)]
        result: Option<Value>,
        /// For `failed`: the error the model or workflow sees.
        #[serde(default)]
        error: Option<String>,
        /// For `retry`: the idempotency key of the next attempt (new, or the same).
        #[serde(default)]
        idempotency_key: Option<String>,
        /// Who resolved it.
        resolved_by: String,
        /// Why.
        reason: String,
        /// How: an operator, a late result, or a reconcile probe.
        via: ResolvedVia,
        /// For a late result: the attempt that reported it.
        #[serde(default)]
        attempt: Option<u32>,
    },
    /// A reconcile probe was scheduled to look the effect of a call up.
    ReconcileProbeScheduled {
        /// The uncertain call.
        call_id: String,
        /// The probe's own call id (`<call_id>.p<n>`).
        probe_call_id: String,
        /// Probe tool.
        tool: String,
        /// Arguments sent to the probe.
        arguments: Value,
        /// The probe's `request_variants:` item, if any. Added for issue 4.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        variant: Option<String>,
        /// The probe waits this long before it may be claimed (by the
        /// engine's clock): after a lease expired, the uncertain call's
        /// worker may have sent its request just before the lease ended,
        /// and that request can reach the tool until the tool's timeout
        /// passes; a probe sooner could find nothing and let the call run
        /// twice. `None`: at once (the worker reported the failure, so it
        /// stopped). Added for issue 22.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after_ms: Option<u64>,
    },
    /// A reconcile probe answered.
    ReconcileProbeFinished {
        /// The uncertain call.
        call_id: String,
        /// The probe's call id.
        probe_call_id: String,
        /// `found`, `not_found` or `undecided`.
        outcome: ProbeOutcome,
        /// What it saw.
        detail: String,
    },
    /// A result arrived for a call that already has one; kept, not applied.
    LateResultRecorded {
        /// Call id.
        call_id: String,
        /// Attempt that reported it.
        attempt: u32,
        /// The result reported.
        result: Value,
        /// Set when it disagrees with how the call was resolved.
        #[serde(default)]
        discrepancy: Option<String>,
    },
    /// A node finished.
    NodeCompleted {
        /// Node id.
        node: String,
        /// Its output.
        output: Value,
        /// The node chosen to go to (a branch case, a wait's entry,
        /// `on_timeout`, `on_decline`, `on_error`); `None`: the node's
        /// `next`, or the end of the run. Added after v0.1.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next: Option<String>,
    },
    /// A node that starts and ends in the same decision (`set`, `branch`,
    /// `succeed`) passed: one event for what [`Event::NodeStarted`] (input
    /// `null`, no deadline) followed by [`Event::NodeCompleted`] records,
    /// and folds to the same state. Added for issue 23 (a loop step wrote
    /// two events for each of its `set` and `branch` nodes); written only
    /// once every engine of the fleet reads it (behaviour level 2,
    /// `RunState::node_passed`), the two events otherwise.
    NodePassed {
        /// Node id.
        node: String,
        /// Its output (a `set`'s values, a `branch`'s `{case, next}`, a
        /// `succeed`'s output).
        output: Value,
        /// The node chosen to go to (a branch case); `None`: the node's
        /// `next`, or the end of the run.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next: Option<String>,
    },
    /// A signal was delivered to the run (kept until a wait takes it).
    SignalReceived {
        /// The sender's id for this signal; a second signal with the same id
        /// is not applied again.
        signal_id: String,
        /// Signal name.
        name: String,
        /// Payload (valid against the waiting node's `payload_schema`).
        payload: Value,
        /// Who sent it.
        sent_by: String,
    },
    /// A wait node took a delivered signal.
    SignalConsumed {
        /// Node id.
        node: String,
        /// The signal's id.
        signal_id: String,
    },
    /// A wait node began waiting (nothing it waits for had happened yet).
    WaitStarted {
        /// Node id.
        node: String,
        /// Signal names it waits for.
        signals: Vec<String>,
        /// Timers it set.
        timers: Vec<TimerSpec>,
    },
    /// A timer fired (at or after its time, by the engine's clock).
    TimerFired {
        /// Node id.
        node: String,
        /// Timer id.
        timer_id: String,
    },
    /// An approval node asks a person to decide.
    ApprovalRequested {
        /// Node id.
        node: String,
        /// This request's id (`<node>.approval`, `<node>~<n>.approval` on
        /// the n-th visit of the node in a loop), which a decision names.
        /// Empty in events written before issue 22: the fold derives it.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        request_id: String,
        /// Exactly what is to be approved.
        subject: Value,
        /// A question for the approver.
        #[serde(default)]
        prompt: Option<Value>,
        /// The permission an approver must hold.
        approver_grant: String,
        /// Whether the approver may edit `subject`.
        allow_edits: bool,
        /// A timeout timer, if the node has one.
        #[serde(default)]
        timer: Option<TimerSpec>,
    },
    /// A workflow node started a child run (created by the engine right
    /// after this transition, exactly once: its id is derived from this
    /// run's id and the call id).
    ChildRunStarted {
        /// Node id.
        node: String,
        /// Call id (`<node>.c1`).
        call_id: String,
        /// The child's run id.
        child_run_id: String,
        /// Workflow name.
        workflow: String,
        /// The child's input.
        input: Value,
        /// Whether the parent waits for it.
        mode: ChildMode,
        /// A timeout timer (sync only).
        #[serde(default)]
        timer: Option<TimerSpec>,
    },
    /// A sync child run ended.
    ChildRunFinished {
        /// Node id.
        node: String,
        /// The child's run id.
        child_run_id: String,
        /// `completed`, `failed` or `cancelled`.
        status: String,
        /// Its output, when completed.
        #[serde(default)]
        output: Option<Value>,
        /// Why it failed or was cancelled.
        #[serde(default)]
        error: Option<String>,
    },
    /// A person decided an approval.
    ApprovalDecided {
        /// Node id.
        node: String,
        /// The request decided (see [`Event::ApprovalRequested`]). Empty in
        /// events written before issue 22: the node's latest request.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        request_id: String,
        /// Approved or not.
        approved: bool,
        /// Who decided.
        by: String,
        /// Why.
        reason: String,
        /// The subject as approved: the requested one, or the approver's
        /// edit of it. This is what later nodes see.
        subject: Value,
        /// Whether the approver edited the subject.
        edited: bool,
    },
    /// The run finished with an output.
    RunCompleted {
        /// Output of the last node.
        output: Value,
    },
    /// The run failed.
    RunFailed {
        /// Why.
        error: String,
        /// Why, typed, when the run was stopped by a budget or a stop
        /// condition (not by a failure). Added after v0.1.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stop: Option<Stop>,
    },
    /// The run was cancelled.
    RunCancelled {
        /// Why.
        reason: String,
    },
    /// An agent's final answer did not satisfy its `output_schema:`: the
    /// node does not finish; `message` goes to the model as the next user
    /// message and the model is called again (within the node's budget).
    /// Added after v0.1.
    FinalAnswerRefused {
        /// Node id.
        node: String,
        /// The violations (JSON pointer and message), or why the answer is
        /// not JSON.
        errors: Vec<String>,
        /// The text the model reads.
        message: String,
    },
    /// An agent with `pii_redaction:` found new personal data (or a new
    /// origin of known data) in its transcript while building a model
    /// call: the entries added to, or changed in, the node's table of
    /// tokens (`machine/pii.rs`), recorded before the model call so a
    /// token means one value for the whole visit. Added after v0.1.
    PiiTokensIssued {
        /// Node id.
        node: String,
        /// The entries, each in full (token, value, origins).
        entries: Vec<crate::pii::PiiEntry>,
    },
}

impl Event {
    /// The snake_case `type` tag, stored in `events.kind`.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::RunStarted { .. } => "run_started",
            Event::NodeStarted { .. } => "node_started",
            Event::ModelCallScheduled { .. } => "model_call_scheduled",
            Event::ModelCallAttemptFailed { .. } => "model_call_attempt_failed",
            Event::ModelCallCompleted { .. } => "model_call_completed",
            Event::ToolCallRefused { .. } => "tool_call_refused",
            Event::ToolCallScheduled { .. } => "tool_call_scheduled",
            Event::ToolCallDispatched { .. } => "tool_call_dispatched",
            Event::ToolCallDeferred { .. } => "tool_call_deferred",
            Event::CallbackIssued { .. } => "callback_issued",
            Event::ConfirmationRequested { .. } => "confirmation_requested",
            Event::ConfirmationDecided { .. } => "confirmation_decided",
            Event::ToolCallInputRequested { .. } => "tool_call_input_requested",
            Event::ToolCallInputProvided { .. } => "tool_call_input_provided",
            Event::ToolCallAccepted { .. } => "tool_call_accepted",
            Event::CallbackReceived { .. } => "callback_received",
            Event::ToolCallAttemptFailed { .. } => "tool_call_attempt_failed",
            Event::ToolCallSampled { .. } => "tool_call_sampled",
            Event::ToolCallCompleted { .. } => "tool_call_completed",
            Event::ToolCallFailed { .. } => "tool_call_failed",
            Event::McpDefinitionChecked { .. } => "mcp_definition_checked",
            Event::ToolVarsSet { .. } => "tool_vars_set",
            Event::SecretsVaulted { .. } => "secrets_vaulted",
            Event::ToolCallProcessed { .. } => "tool_call_processed",
            Event::TaskLeaseExpired { .. } => "task_lease_expired",
            Event::UncertainOutcomeRecorded { .. } => "uncertain_outcome_recorded",
            Event::RunPaused { .. } => "run_paused",
            Event::RunResumed { .. } => "run_resumed",
            Event::OperatorPauseLifted { .. } => "operator_pause_lifted",
            Event::UncertainOutcomeResolved { .. } => "uncertain_outcome_resolved",
            Event::ReconcileProbeScheduled { .. } => "reconcile_probe_scheduled",
            Event::ReconcileProbeFinished { .. } => "reconcile_probe_finished",
            Event::LateResultRecorded { .. } => "late_result_recorded",
            Event::NodeCompleted { .. } => "node_completed",
            Event::NodePassed { .. } => "node_passed",
            Event::SignalReceived { .. } => "signal_received",
            Event::SignalConsumed { .. } => "signal_consumed",
            Event::WaitStarted { .. } => "wait_started",
            Event::TimerFired { .. } => "timer_fired",
            Event::ApprovalRequested { .. } => "approval_requested",
            Event::ApprovalDecided { .. } => "approval_decided",
            Event::ChildRunStarted { .. } => "child_run_started",
            Event::ChildRunFinished { .. } => "child_run_finished",
            Event::RunCompleted { .. } => "run_completed",
            Event::RunFailed { .. } => "run_failed",
            Event::RunCancelled { .. } => "run_cancelled",
            Event::FinalAnswerRefused { .. } => "final_answer_refused",
            Event::PiiTokensIssued { .. } => "pii_tokens_issued",
        }
    }
}

impl Event {
    /// A [`Event::ToolCallFailed`] of no particular kind (see
    /// [`crate::mcp_report`] for the kind of an MCP call's failure).
    pub(crate) fn tool_call_failed(call_id: String, attempt: u32, error: String) -> Event {
        Event::ToolCallFailed {
            call_id,
            attempt,
            error,
            kind: None,
        }
    }
}

/// Why a run was stopped by a budget or a stop condition of the agent loop
/// (`run_failed.stop`), so operators and code can tell "out of budget" from
/// a failure without reading the message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Stop {
    /// A budget ran out.
    Budget {
        /// Which: `model_steps`, `tokens`, `input_tokens`, `output_tokens`
        /// or `cost_usd`.
        budget: String,
        /// `node` (the agent's `budget:` or `loop:`) or `run` (the
        /// workflow's `budget:`).
        scope: String,
        /// The node it ran out in.
        node: String,
        /// The limit.
        limit: Value,
        /// What was used when it stopped.
        used: Value,
    },
    /// The model proposed the same call (tool and arguments) this many times
    /// in a row (`max_identical_calls`).
    NoProgress {
        /// Node id.
        node: String,
        /// Tool name.
        tool: String,
        /// How many times in a row.
        times: u32,
    },
    /// A tool call failed for good and the agent says `on_tool_failure: stop`.
    ToolFailed {
        /// Node id.
        node: String,
        /// Call id.
        call_id: String,
        /// Tool name.
        tool: String,
    },
    /// `loop: exactly_one_call` and the model proposed a tool call, which
    /// would need a second model call.
    LoopPolicy {
        /// Node id.
        node: String,
        /// The tool it proposed.
        tool: String,
    },
    /// The wall-time budget (`max_wall_time`) ran out: its timer fired
    /// while the node or the run was still going. Calls in flight were
    /// abandoned as at a cancel (tasks cancelled; a dispatched `reconcile`
    /// call became an uncertain outcome). Added after v0.1.
    Deadline {
        /// `node` (the agent's `budget:`) or `run` (the workflow's
        /// `budget:`).
        scope: String,
        /// The node it ran out in (for `run`, the node in progress; empty
        /// between nodes).
        node: String,
        /// The budget, ms.
        limit_ms: u64,
        /// Wall time from the start of the node or run to when the timer
        /// fired, ms (the budget plus how late the timer fired, by the
        /// engine's clock).
        elapsed_ms: u64,
    },
}
