//! A run's state: the fold of its events. `apply` is the only way state
//! changes, so replaying a recorded history always gives the same state.

use std::collections::BTreeMap;

use belay_proto::wire::{ChatMessage, ToolUse};
use serde_json::{Map, Value, json};

use super::event::{Event, FailureClass, ResolutionKind, ResolvedVia, TimerSpec};
use super::plan::RunPlan;
use belay_definitions::model::{AgentDef, NodeKind, RepeatSafety};

/// Lifecycle status of a run, as stored in `runs.status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    /// No `RunStarted` applied yet.
    New,
    /// Progressing: tasks may be claimed.
    Running,
    /// Stopped until an operator acts (uncertain outcome); tasks are not claimed.
    Paused,
    /// Waiting durably for a signal, a timer or an approval; holds no task.
    Waiting,
    /// Finished with an output.
    Completed,
    /// Finished with an error.
    Failed,
    /// Cancelled.
    Cancelled,
}

impl RunStatus {
    /// Database / API spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::New => "pending",
            RunStatus::Running => "running",
            RunStatus::Paused => "paused",
            RunStatus::Waiting => "waiting",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
        }
    }

    /// Whether the run has finished for good.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunStatus::Completed | RunStatus::Failed | RunStatus::Cancelled
        )
    }
}

/// Status of one tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallStatus {
    /// Task scheduled or running.
    Open,
    /// Result recorded.
    Completed,
    /// Failed for good.
    Failed,
    /// Outcome unknown; waiting for resolution.
    Uncertain,
    /// Run cancelled while open.
    Cancelled,
}

impl CallStatus {
    /// Lower-case word for messages: `open`, `completed`, `failed`,
    /// `uncertain`, `cancelled`.
    pub fn as_str(self) -> &'static str {
        match self {
            CallStatus::Open => "open",
            CallStatus::Completed => "completed",
            CallStatus::Failed => "failed",
            CallStatus::Uncertain => "uncertain",
            CallStatus::Cancelled => "cancelled",
        }
    }
}

/// What the run knows about one accepted tool call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCallState {
    /// Node that made it.
    pub node: String,
    /// The model's tool_use id.
    pub tool_use_id: String,
    /// Tool name.
    pub tool: String,
    /// Repeat safety of the tool.
    pub repeat_safety: RepeatSafety,
    /// Validated arguments.
    pub arguments: Value,
    /// Idempotency key.
    pub idempotency_key: String,
    /// Failed attempts so far (reported failures and expired leases).
    pub failed_attempts: u32,
    /// Of those, the attempts that provably did nothing (`not_sent`, or
    /// lost before dispatch).
    pub not_sent_failures: u32,
    /// Of those, the `not_sent` failures the tool answered (an HTTP status:
    /// 429, a 5xx to a safe method): with a `retry_policy`, they count
    /// against its `max_retries`, not against the not-sent allowance.
    pub answered_not_sent: u32,
    /// The attempt currently dispatched, if any.
    pub dispatched_attempt: Option<u32>,
    /// Its last dispatch was deferred by the tool's rate limit and not
    /// dispatched since: the call holds a turn, and does not queue again
    /// when it comes back (`crate::gates::admit`).
    pub holds_turn: bool,
    /// Whether a dispatched attempt may have had its effect (its lease was
    /// lost, or it failed in a way that may have acted). A dispatched attempt
    /// that failed provably before sending anything (`not_sent`) or was
    /// refused (`rejected`) did not act, so it does not count.
    pub may_have_acted: bool,
    /// Status.
    pub status: CallStatus,
    /// For a reconcile probe: the uncertain call it looks up.
    pub probe_for: Option<String>,
    /// Probes scheduled for this call so far.
    pub probes: u32,
    /// Operator retries with a new idempotency key so far.
    pub rekeys: u32,
    /// The attempt whose reported result completed the call.
    pub completed_by_attempt: Option<u32>,
    /// How the call's uncertain outcome was resolved, if it was.
    pub resolution: Option<(ResolvedVia, ResolutionKind, Option<Value>)>,
    /// Why its outcome is uncertain (while it is).
    pub uncertain_reason: Option<String>,
    /// The result once completed (as the tool's `process.after` made
    /// it; the `tool_call_completed` event keeps the raw one).
    pub result: Option<Value>,
    /// `process.after`'s outcome, recorded before the result: the result
    /// to use instead of the raw one, or (`Err`) the `block` message.
    pub after: Option<Result<Value, String>>,
    /// The error once failed.
    pub error: Option<String>,
    /// For a `type: workflow` tool: the child run a sync call waits for.
    pub child_run_id: Option<String>,
    /// Its timeout timer.
    pub child_timer: Option<TimerSpec>,
    /// For a `type: async_webhook` call: the callback tokens issued (hex
    /// SHA-256 → the attempt it was issued to, and whether it was used).
    pub callback_tokens: BTreeMap<String, (u32, bool)>,
    /// Set once the server accepted the request: the timer that ends the
    /// wait for the callback.
    pub callback_timer: Option<TimerSpec>,
    /// A `confirmation:` waiting for a decision: the approver grant and the
    /// immutable params. Cleared by the decision.
    pub awaiting_confirmation: Option<(String, Vec<String>)>,
    /// The confirmation decision, once made: who, approved, its seq.
    pub confirmed: Option<(String, bool, u64)>,
    /// A question of the tool (MCP elicitation) waiting for a person's
    /// answer. Cleared by the answer.
    pub awaiting_input: Option<AwaitingInput>,
    /// Questions answered so far, and what the repeated call carries
    /// (`ToolCallSpec.input`; `null` before the first answer).
    pub input_rounds: u32,
    /// Every question the call asked, oldest first, with its answer once
    /// given: an answer names the question it answers, so a retried answer
    /// to an earlier question is told apart from one to the open question.
    /// Added for issue 22.
    pub input_requests: Vec<HumanRequest>,
    /// See `input_rounds`.
    pub input: Value,
    /// The `request_variants:` item the call sends (from
    /// `ToolCallScheduled`, then `ConfirmationDecided`); a spec built again
    /// for the call uses it.
    pub variant: Option<String>,
}

/// A tool's question to a person, from [`Event::ToolCallInputRequested`].
#[derive(Debug, Clone, PartialEq)]
pub struct AwaitingInput {
    /// The attempt that asked.
    pub attempt: u32,
    /// `input_required`, `elicitation` or `url_elicitation_required`.
    pub via: String,
    /// What the server asked (untrusted).
    pub requests: Value,
    /// Opaque server state to echo.
    pub request_state: Option<String>,
    /// The question's request id (`<call_id>.input<n>`).
    pub request_id: String,
}

/// A request for a person's decision or answer (an approval node's
/// request, a tool's question), and the answer once given. Added for issue
/// 22: answers name their request, and a retried answer is answered with
/// the recorded one.
#[derive(Debug, Clone, PartialEq)]
pub struct HumanRequest {
    /// The request's id.
    pub request_id: String,
    /// The answer, once given.
    pub answered: Option<Decided>,
}

/// The request id of an `approval` node's visit with call-id prefix
/// `prefix` (`<node>` or `<node>~<n>`): `<prefix>.approval`.
pub fn approval_request_id(prefix: &str) -> String {
    format!("{prefix}.approval")
}

/// The request id of call `call_id`'s `n`-th question (from 1):
/// `<call_id>.input<n>`.
pub fn input_request_id(call_id: &str, n: usize) -> String {
    format!("{call_id}.input{n}")
}

impl ToolCallState {
    /// Why this open call holds the run `waiting`, if it does: a
    /// confirmation, a callback, or a sync child run (in that order).
    pub(crate) fn outside_wait_reason(&self, call_id: &str) -> Option<String> {
        if self.status != CallStatus::Open {
            return None;
        }
        let tool = &self.tool;
        if let Some((grant, _)) = &self.awaiting_confirmation {
            return Some(format!(
                "call `{call_id}` of tool `{tool}` waits for a confirmation by a holder of `{grant}`"
            ));
        }
        if self.awaiting_input.is_some() {
            return Some(format!(
                "call `{call_id}` of tool `{tool}` waits for input from a person (ProvideToolInput)"
            ));
        }
        if let Some(timer) = &self.callback_timer {
            let after = timer.after_ms.map(super::show_ms).unwrap_or_default();
            return Some(format!(
                "call `{call_id}` of tool `{tool}` waits for its callback (up to {after})"
            ));
        }
        self.child_run_id
            .as_ref()
            .map(|child| format!("call `{call_id}` of tool `{tool}` waits for child run {child}"))
    }

    /// Whether the call waits for something outside any task: a child run
    /// (sync `type: workflow`), a callback (accepted `type: async_webhook`),
    /// a confirmation or a person's input.
    pub fn waits_outside(&self) -> bool {
        self.status == CallStatus::Open
            && (self.child_run_id.is_some()
                || self.callback_timer.is_some()
                || self.awaiting_confirmation.is_some()
                || self.awaiting_input.is_some())
    }
}

impl ToolCallState {
    fn new(
        node: &str,
        tool_use_id: &str,
        tool: &str,
        repeat_safety: RepeatSafety,
        arguments: &Value,
        key: &str,
    ) -> Self {
        ToolCallState {
            node: node.to_owned(),
            tool_use_id: tool_use_id.to_owned(),
            tool: tool.to_owned(),
            repeat_safety,
            arguments: arguments.clone(),
            idempotency_key: key.to_owned(),
            failed_attempts: 0,
            not_sent_failures: 0,
            answered_not_sent: 0,
            dispatched_attempt: None,
            holds_turn: false,
            may_have_acted: false,
            status: CallStatus::Open,
            probe_for: None,
            probes: 0,
            rekeys: 0,
            completed_by_attempt: None,
            resolution: None,
            uncertain_reason: None,
            result: None,
            after: None,
            error: None,
            child_run_id: None,
            child_timer: None,
            callback_tokens: BTreeMap::new(),
            callback_timer: None,
            awaiting_confirmation: None,
            confirmed: None,
            awaiting_input: None,
            input_rounds: 0,
            input_requests: Vec::new(),
            input: Value::Null,
            variant: None,
        }
    }
}

/// One proposed tool call of the latest model turn, awaiting its result.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingToolUse {
    /// The model's tool_use id.
    pub tool_use_id: String,
    /// Call id if accepted.
    pub call_id: Option<String>,
    /// Result text for the model once known.
    pub result: Option<String>,
}

/// The model call a node is waiting for.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenModelCall {
    /// Call id.
    pub call_id: String,
    /// Failed attempts so far.
    pub failed_attempts: u32,
}

/// State of the agent node being executed.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeState {
    /// Node id.
    pub id: String,
    /// Prefix of this visit's call ids (see [`StepState::prefix`]).
    pub prefix: String,
    /// Agent name.
    pub agent: String,
    /// Transcript so far.
    pub transcript: Vec<ChatMessage>,
    /// Model calls scheduled so far.
    pub model_steps: u32,
    /// Tool calls accepted so far.
    pub tool_calls: u32,
    /// Tokens used so far (input + output).
    pub tokens: u64,
    /// Input (prompt) tokens so far.
    pub input_tokens: u64,
    /// Output (completion) tokens so far.
    pub output_tokens: u64,
    /// Cost so far, USD (with the agent's `pricing:`; 0 without).
    pub cost_usd: f64,
    /// The latest accepted call (tool, arguments) and how many times in a
    /// row it was proposed.
    pub last_call: Option<(String, Value, u32)>,
    /// The open model call, if any.
    pub model_call: Option<OpenModelCall>,
    /// Proposed calls of the latest turn, in the model's order.
    pub pending: Vec<PendingToolUse>,
    /// The wall-time timer of this visit (the agent's `max_wall_time`).
    pub deadline: Option<TimerSpec>,
    /// With `pii_redaction:`, the table of personal data found and its
    /// tokens, folded from `pii_tokens_issued` (`machine/pii.rs`).
    pub pii: Vec<crate::pii::PiiEntry>,
}

/// A non-agent node being executed.
#[derive(Debug, Clone, PartialEq)]
pub struct StepState {
    /// Node id.
    pub id: String,
    /// Prefix of this visit's call and timer ids (`<node>`, or `<node>~<n>`
    /// on the n-th visit of a node in a loop).
    pub prefix: String,
    /// What it is doing.
    pub kind: StepKind,
}

/// What a non-agent node is doing.
#[derive(Debug, Clone, PartialEq)]
pub enum StepKind {
    /// Started; nothing scheduled yet (instantaneous nodes end in the same
    /// transition).
    Started,
    /// A tool node's call.
    Tool {
        /// Call id.
        call_id: String,
    },
    /// A wait node waiting.
    Wait {
        /// Signal names it takes.
        signals: Vec<String>,
        /// Its timers.
        timers: Vec<TimerSpec>,
    },
    /// A sync workflow node waiting for its child run.
    Child {
        /// The child's run id.
        child_run_id: String,
        /// Timeout timer.
        timer: Option<TimerSpec>,
    },
    /// An approval node waiting for a decision.
    Approval {
        /// Exactly what is to be approved.
        subject: Value,
        /// Permission an approver must hold.
        approver_grant: String,
        /// Whether the subject may be edited.
        allow_edits: bool,
        /// Timeout timer.
        timer: Option<TimerSpec>,
        /// The request's id ([`approval_request_id`]).
        request_id: String,
    },
}

/// A delivered signal no wait has taken yet.
#[derive(Debug, Clone, PartialEq)]
pub struct BufferedSignal {
    /// Sender's id.
    pub signal_id: String,
    /// Name.
    pub name: String,
    /// Payload.
    pub payload: Value,
}

/// What a delivered signal was, kept for as long as the run: its name and
/// a digest of its payload (payloads can be large).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveredSignal {
    /// Name.
    pub name: String,
    /// SHA-256 of the payload's compact JSON (object keys sorted).
    pub payload_sha256: [u8; 32],
}

impl DeliveredSignal {
    /// The record of signal `name` with `payload`.
    pub fn new(name: &str, payload: &Value) -> DeliveredSignal {
        use sha2::{Digest, Sha256};
        DeliveredSignal {
            name: name.to_owned(),
            payload_sha256: Sha256::digest(payload.to_string().as_bytes()).into(),
        }
    }
}

/// A person's recorded decision (an approval, a confirmation) or answer
/// (a tool's question), for answering a retry with it and refusing a
/// different second one.
#[derive(Debug, Clone, PartialEq)]
pub struct Decided {
    /// Who.
    pub by: String,
    /// Approved or not (`true` for an answer to a question).
    pub approved: bool,
    /// Seq of the decision event.
    pub seq: u64,
    /// SHA-256 of what was decided with it (the subject as approved, or
    /// the answer), so that a retry carrying the same is recognised.
    pub content_sha256: [u8; 32],
}

impl Decided {
    /// A decision by `by` at `seq`, with its content `content`.
    pub fn new(by: &str, approved: bool, seq: u64, content: &Value) -> Decided {
        Decided {
            by: by.to_owned(),
            approved,
            seq,
            content_sha256: content_sha256(content),
        }
    }
}

/// SHA-256 of `value`'s JSON text (serde_json's, keys in map order).
pub fn content_sha256(value: &Value) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    Sha256::digest(value.to_string().as_bytes()).into()
}

/// What a run used so far (all nodes), from its events.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunTotals {
    /// Model calls completed.
    pub model_steps: u32,
    /// Tool calls accepted (of agents).
    pub tool_calls: u32,
    /// Input (prompt) tokens.
    pub input_tokens: u64,
    /// Output (completion) tokens.
    pub output_tokens: u64,
    /// Cost, USD (of agents with `pricing:`).
    pub cost_usd: f64,
}

/// The fold of a run's events.
#[derive(Debug, Clone, PartialEq)]
pub struct RunState {
    /// Run id.
    pub run_id: String,
    /// Tenant.
    pub tenant: String,
    /// Status.
    pub status: RunStatus,
    /// Why paused, failed or cancelled.
    pub status_reason: String,
    /// Pinned definitions (None before `RunStarted`); shared, so the
    /// machine takes a handle instead of copying every definition.
    pub plan: Option<std::sync::Arc<RunPlan>>,
    /// What the whole run used so far, for the workflow's `budget:`.
    pub totals: RunTotals,
    /// The run's wall-time timer (the workflow's `max_wall_time`).
    pub deadline: Option<TimerSpec>,
    /// Run input.
    pub input: Value,
    /// Who started the run (`StartRun`'s caller).
    pub caller: String,
    /// Caller's permissions.
    pub caller_grants: Vec<String>,
    /// Tenant's permissions.
    pub tenant_grants: Vec<String>,
    /// The node being executed.
    pub node: Option<NodeState>,
    /// The latest completed node and its output (`None` before the first
    /// completes). Only the latest is kept: a long loop must not grow the
    /// state (the events keep them all).
    pub last_completed: Option<(String, Value)>,
    /// The non-agent node being executed.
    pub step: Option<StepState>,
    /// Inputs and outputs of the latest visit of each node
    /// (`{"input", "output"}`), for the jq state document.
    pub node_io: Map<String, Value>,
    /// Run variables set by `set` nodes.
    pub vars: Map<String, Value>,
    /// Visits of each node so far.
    pub visits: BTreeMap<String, u32>,
    /// The node chosen by the latest `NodeCompleted` (`None`: its `next`).
    pub chosen_next: Option<String>,
    /// Delivered signals not yet taken by a wait, oldest first.
    pub signals: Vec<BufferedSignal>,
    /// Every signal delivered, by its id: what it was, so that the same
    /// id sent again is told apart from a retry.
    pub signal_ids: BTreeMap<String, DeliveredSignal>,
    /// Every request of each `approval` node, by node id, oldest first,
    /// with its decision once made (issue 22: a decision names its
    /// request, so a retried decision of an earlier visit is never applied
    /// to a later one).
    pub approvals: BTreeMap<String, Vec<HumanRequest>>,
    /// Every accepted tool call by call id.
    pub tool_calls: imbl::OrdMap<String, ToolCallState>,
    /// Final output once completed.
    pub output: Option<Value>,
    /// Set while an operator has paused the run: the reason.
    pub operator_paused: Option<String>,
    /// Seq of the last applied event (0 for none).
    pub last_seq: u64,
    /// The engine's clock at the transition being decided, set by the store
    /// (read by the transition's lock statement) or the coordinator (a
    /// run's start) right before it asks the machine. Not part of the
    /// fold: [`RunState::apply`] never touches it and a folded history has
    /// `None`. The machine reads it only to fill a `source: runtime` time
    /// parameter, whose value is then recorded in the call's arguments, so
    /// nothing a replay computes depends on it. `None`: no time is known
    /// (such a parameter then has no value).
    pub now: Option<chrono::DateTime<chrono::Utc>>,
    /// The run's W3C trace context (`RunStarted.trace`).
    pub trace: Option<belay_proto::trace::TraceContext>,
    /// Seq of the latest `NodeStarted` or `NodePassed` (0 before the
    /// first): where the open node's span begins.
    pub node_started_seq: u64,
    /// The behaviour level every engine that may read this run's history
    /// implements (the fleet's, `belay_store::fleet_level`): the machine
    /// writes an event form of [`crate::level`] only at or above its
    /// level, the older form below. Set by the store or the coordinator
    /// right before it asks the machine, like [`RunState::now`]; not part
    /// of the fold (0 in a folded history: the forms every release reads).
    pub fleet_level: u32,
}

impl Default for RunState {
    fn default() -> Self {
        RunState {
            run_id: String::new(),
            tenant: String::new(),
            status: RunStatus::New,
            status_reason: String::new(),
            plan: None,
            input: Value::Null,
            caller: String::new(),
            caller_grants: Vec::new(),
            tenant_grants: Vec::new(),
            node: None,
            last_completed: None,
            step: None,
            node_io: Map::new(),
            vars: Map::new(),
            visits: BTreeMap::new(),
            chosen_next: None,
            signals: Vec::new(),
            signal_ids: BTreeMap::new(),
            approvals: BTreeMap::new(),
            tool_calls: imbl::OrdMap::new(),
            output: None,
            operator_paused: None,
            last_seq: 0,
            totals: RunTotals::default(),
            deadline: None,
            now: None,
            trace: None,
            node_started_seq: 0,
            fleet_level: 0,
        }
    }
}

impl RunState {
    /// Fold a whole history.
    pub fn fold<'a>(events: impl IntoIterator<Item = &'a Event>) -> RunState {
        let mut state = RunState::default();
        for event in events {
            state.apply(event);
        }
        state
    }

    /// The agent definition of the node being executed.
    pub fn current_agent(&self) -> Option<&AgentDef> {
        let node = self.node.as_ref()?;
        self.plan
            .as_ref()?
            .agents
            .get(&node.agent)
            .map(|pinned| &pinned.def)
    }

    /// Charges the completions a call's MCP server had the model make
    /// ([`Event::ToolCallSampled`]) like a model call's tokens: to the run's
    /// totals, and to the running agent node when the call is its own
    /// (this visit's), with the agent's `pricing:`. Not a model step.
    /// Saturating, like model usage: absurd numbers exhaust a budget.
    fn charge_sampling(&mut self, call_id: &str, usage: &belay_proto::wire::SamplingUsage) {
        let (input, output) = (usage.input_tokens, usage.output_tokens);
        let call_node = self.tool_calls.get(call_id).map(|c| c.node.clone());
        let node = self.node.as_mut().filter(|n| {
            call_node.as_deref() == Some(n.id.as_str())
                && call_id
                    .strip_prefix(n.prefix.as_str())
                    .is_some_and(|rest| rest.starts_with('.'))
        });
        let cost = node
            .as_ref()
            .and_then(|n| {
                self.plan
                    .as_ref()?
                    .agents
                    .get(&n.agent)?
                    .def
                    .pricing
                    .clone()
            })
            .map(|p| p.cost_usd(input, output))
            .unwrap_or(0.0);
        self.totals.input_tokens = self.totals.input_tokens.saturating_add(input);
        self.totals.output_tokens = self.totals.output_tokens.saturating_add(output);
        self.totals.cost_usd += cost;
        if let Some(node) = node {
            node.tokens = node.tokens.saturating_add(input).saturating_add(output);
            node.input_tokens = node.input_tokens.saturating_add(input);
            node.output_tokens = node.output_tokens.saturating_add(output);
            node.cost_usd += cost;
        }
    }

    /// A reconcile probe of `call_id` was scheduled: the probe becomes a
    /// call of its own (`probe_call_id`, idempotent, on the uncertain
    /// call's node), and the call counts one more probe.
    fn probe_scheduled(
        &mut self,
        call_id: &str,
        probe_call_id: &str,
        tool: &str,
        arguments: &Value,
        variant: &Option<String>,
    ) {
        let node = self
            .tool_calls
            .get(call_id)
            .map(|c| c.node.clone())
            .unwrap_or_default();
        let key = super::idempotency_key(&self.run_id, probe_call_id);
        if let Some(call) = self.tool_calls.get_mut(call_id) {
            call.probes += 1;
        }
        let mut probe =
            ToolCallState::new(&node, "", tool, RepeatSafety::Idempotent, arguments, &key);
        probe.probe_for = Some(call_id.to_owned());
        probe.variant = variant.clone();
        self.tool_calls.insert(probe_call_id.to_owned(), probe);
    }

    /// Apply one event. Unknown references are ignored rather than panicking:
    /// the machine never emits them, and a fold must not crash on history.
    pub fn apply(&mut self, event: &Event) {
        self.last_seq += 1;
        self.fold_event(event);
    }

    /// Fold `event` as a part of the event before it, at that event's seq:
    /// the machine writing two events as one ([`crate::level`]) after it
    /// folded the first.
    pub(crate) fn apply_within_last(&mut self, event: &Event) {
        self.fold_event(event);
    }

    /// [`RunState::apply`] but for the seq.
    fn fold_event(&mut self, event: &Event) {
        match event {
            Event::RunStarted {
                run_id,
                tenant,
                caller,
                caller_grants,
                tenant_grants,
                input,
                plan,
                deadline,
                trace,
            } => {
                self.deadline = deadline.clone();
                self.trace = trace.clone();
                self.run_id = run_id.clone();
                self.tenant = tenant.clone();
                self.caller = caller.clone();
                self.caller_grants = caller_grants.clone();
                self.tenant_grants = tenant_grants.clone();
                self.input = input.clone();
                self.plan = Some(std::sync::Arc::new((**plan).clone()));
                self.status = RunStatus::Running;
            }
            Event::NodeStarted {
                node,
                input,
                deadline,
            } => self.start_node(node, input, deadline),
            Event::ModelCallScheduled { call_id, .. } => {
                if let Some(node) = self.node.as_mut() {
                    node.model_steps += 1;
                    node.model_call = Some(OpenModelCall {
                        call_id: call_id.clone(),
                        failed_attempts: 0,
                    });
                }
            }
            Event::ModelCallAttemptFailed { .. } => {
                if let Some(call) = self.node.as_mut().and_then(|n| n.model_call.as_mut()) {
                    call.failed_attempts += 1;
                }
            }
            Event::ModelCallCompleted {
                content,
                tool_calls,
                usage,
                ..
            } => {
                let pricing = self.node.as_ref().and_then(|n| {
                    self.plan
                        .as_ref()?
                        .agents
                        .get(&n.agent)?
                        .def
                        .pricing
                        .clone()
                });
                let cost = pricing
                    .map(|p| p.cost_usd(usage.input_tokens, usage.output_tokens))
                    .unwrap_or(0.0);
                self.totals.model_steps += 1;
                self.totals.input_tokens =
                    self.totals.input_tokens.saturating_add(usage.input_tokens);
                self.totals.output_tokens = self
                    .totals
                    .output_tokens
                    .saturating_add(usage.output_tokens);
                self.totals.cost_usd += cost;
                if let Some(node) = self.node.as_mut() {
                    node.model_call = None;
                    // Saturating: a provider (or a bad worker) reporting absurd
                    // usage must exhaust the budget, not overflow it.
                    node.tokens = node
                        .tokens
                        .saturating_add(usage.input_tokens)
                        .saturating_add(usage.output_tokens);
                    node.input_tokens = node.input_tokens.saturating_add(usage.input_tokens);
                    node.output_tokens = node.output_tokens.saturating_add(usage.output_tokens);
                    node.cost_usd += cost;
                    node.transcript.push(ChatMessage::Assistant {
                        content: content.clone(),
                        tool_calls: tool_calls.clone(),
                    });
                    node.pending = tool_calls
                        .iter()
                        .map(|ToolUse { id, .. }| PendingToolUse {
                            tool_use_id: id.clone(),
                            call_id: None,
                            result: None,
                        })
                        .collect();
                }
            }
            Event::ToolCallRefused {
                tool_use_id,
                reason,
                ..
            } => {
                self.set_pending_result(tool_use_id, format!("error: {reason}"));
            }
            Event::ToolCallScheduled {
                node,
                call_id,
                tool_use_id,
                tool,
                arguments,
                idempotency_key,
                repeat_safety,
                variant,
                starts_node,
                ..
            } => {
                if *starts_node {
                    self.start_node(node, arguments, &None);
                }
                if let Some(step) = self.step.as_mut()
                    && &step.id == node
                {
                    step.kind = StepKind::Tool {
                        call_id: call_id.clone(),
                    };
                } else if let Some(state) = self.node.as_mut() {
                    state.tool_calls += 1;
                    self.totals.tool_calls += 1;
                    let chosen = model_arguments(self.plan.as_deref(), tool, arguments);
                    state.last_call = match state.last_call.take() {
                        Some((t, a, n)) if &t == tool && a == chosen => Some((t, a, n + 1)),
                        _ => Some((tool.clone(), chosen, 1)),
                    };
                    if let Some(p) = state
                        .pending
                        .iter_mut()
                        .find(|p| &p.tool_use_id == tool_use_id)
                    {
                        p.call_id = Some(call_id.clone());
                    }
                }
                let mut call = ToolCallState::new(
                    node,
                    tool_use_id,
                    tool,
                    *repeat_safety,
                    arguments,
                    idempotency_key,
                );
                call.variant = variant.clone();
                self.tool_calls.insert(call_id.clone(), call);
            }
            Event::ToolCallDispatched {
                call_id, attempt, ..
            } => {
                if let Some(call) = self.tool_calls.get_mut(call_id) {
                    call.dispatched_attempt = Some(*attempt);
                    call.holds_turn = false;
                }
            }
            Event::ToolCallDeferred { call_id, .. } => {
                if let Some(call) = self.tool_calls.get_mut(call_id) {
                    call.holds_turn = true;
                }
            }
            Event::CallbackIssued {
                call_id,
                attempt,
                token_sha256,
            } => {
                if let Some(call) = self.tool_calls.get_mut(call_id) {
                    call.callback_tokens
                        .insert(token_sha256.clone(), (*attempt, false));
                }
            }
            Event::ConfirmationRequested {
                call_id,
                approver_grant,
                immutable_params,
                ..
            } => {
                if let Some(call) = self.tool_calls.get_mut(call_id) {
                    call.awaiting_confirmation =
                        Some((approver_grant.clone(), immutable_params.clone()));
                    if let Some(reason) = call.outside_wait_reason(call_id) {
                        self.set_waiting(reason);
                    }
                }
            }
            Event::ConfirmationDecided {
                call_id,
                approved,
                by,
                arguments,
                variant,
                ..
            } => {
                let seq = self.last_seq;
                if let Some(call) = self.tool_calls.get_mut(call_id) {
                    call.awaiting_confirmation = None;
                    call.confirmed = Some((by.clone(), *approved, seq));
                    if *approved {
                        call.arguments = arguments.clone();
                        call.variant = variant.clone();
                    }
                }
                self.refresh_waiting();
            }
            Event::ToolCallInputRequested { .. } | Event::ToolCallInputProvided { .. } => {
                self.apply_request_event(event)
            }
            Event::ToolCallAccepted { call_id, timer, .. } => {
                if let Some(call) = self.tool_calls.get_mut(call_id) {
                    call.callback_timer = Some(timer.clone());
                    if let Some(reason) = call.outside_wait_reason(call_id) {
                        self.set_waiting(reason);
                    }
                }
            }
            Event::CallbackReceived {
                call_id,
                token_sha256,
                ..
            } => {
                if let Some(call) = self.tool_calls.get_mut(call_id)
                    && let Some(token) = call.callback_tokens.get_mut(token_sha256)
                {
                    token.1 = true;
                }
            }
            Event::ToolCallSampled { call_id, usage, .. } => self.charge_sampling(call_id, usage),
            Event::ToolCallAttemptFailed {
                call_id,
                class,
                dispatched,
                status_code,
                ..
            } => {
                if let Some(call) = self.tool_calls.get_mut(call_id) {
                    call.failed_attempts += 1;
                    call.dispatched_attempt = None;
                    if *class == FailureClass::NotSent || !*dispatched {
                        call.not_sent_failures += 1;
                    }
                    if *class == FailureClass::NotSent && *dispatched && status_code.is_some() {
                        call.answered_not_sent += 1;
                    }
                    if *dispatched && *class == FailureClass::MayHaveActed {
                        call.may_have_acted = true;
                    }
                }
            }
            Event::TaskLeaseExpired {
                call_id,
                dispatched,
                ..
            } => {
                if let Some(call) = self.tool_calls.get_mut(call_id) {
                    call.failed_attempts += 1;
                    call.dispatched_attempt = None;
                    if *dispatched {
                        call.may_have_acted = true;
                    } else {
                        call.not_sent_failures += 1;
                    }
                }
            }
            Event::ToolCallCompleted {
                call_id,
                attempt,
                result,
                ends_node,
                ..
            } => self.fold_tool_call_completed(call_id, *attempt, result, *ends_node),
            Event::ToolCallFailed { call_id, error, .. } => {
                self.fail_call(call_id, error);
                self.end_child_wait(call_id);
            }
            Event::UncertainOutcomeRecorded {
                call_id, reason, ..
            } => {
                if let Some(call) = self.tool_calls.get_mut(call_id) {
                    call.status = CallStatus::Uncertain;
                    call.uncertain_reason = Some(reason.clone());
                }
            }
            Event::RunPaused { reason, operator } => {
                if operator.is_some() {
                    self.operator_paused = Some(reason.clone());
                }
                self.status = RunStatus::Paused;
                self.status_reason = reason.clone();
            }
            Event::RunResumed { .. } | Event::OperatorPauseLifted { .. } => {
                self.operator_paused = None;
                self.refresh_pause(true);
            }
            Event::UncertainOutcomeResolved {
                call_id,
                resolution,
                result,
                error,
                idempotency_key,
                via,
                attempt,
                ..
            } => {
                if let Some(call) = self.tool_calls.get_mut(call_id) {
                    call.resolution = Some((*via, *resolution, result.clone()));
                    call.uncertain_reason = None;
                    if *via == ResolvedVia::LateResult {
                        call.completed_by_attempt = *attempt;
                    }
                }
                match resolution {
                    ResolutionKind::Succeeded => {
                        self.complete_call(call_id, result.as_ref().unwrap_or(&Value::Null));
                    }
                    ResolutionKind::Failed => {
                        self.fail_call(call_id, error.as_deref().unwrap_or("failed"));
                    }
                    ResolutionKind::Retry => {
                        if let Some(call) = self.tool_calls.get_mut(call_id) {
                            call.status = CallStatus::Open;
                            call.may_have_acted = false;
                            call.dispatched_attempt = None;
                            if let Some(key) = idempotency_key
                                && key != &call.idempotency_key
                            {
                                call.idempotency_key = key.clone();
                                call.rekeys += 1;
                            }
                        }
                    }
                }
                // The pause reason follows what is still open; only
                // `RunResumed` makes the run run again.
                if self.status == RunStatus::Paused {
                    self.refresh_pause(false);
                }
            }
            Event::ReconcileProbeScheduled {
                call_id,
                probe_call_id,
                tool,
                arguments,
                variant,
                after_ms: _,
            } => self.probe_scheduled(call_id, probe_call_id, tool, arguments, variant),
            Event::ReconcileProbeFinished {
                call_id,
                outcome: super::event::ProbeOutcome::Undecided,
                detail,
                ..
            } => {
                // The probe could not decide: the reason must now ask for an
                // operator, not say "looking it up".
                if let Some(call) = self.tool_calls.get_mut(call_id)
                    && let Some(reason) = call.uncertain_reason.as_mut()
                {
                    *reason = format!("{reason}; {detail}; an operator must resolve it");
                }
                if self.status == RunStatus::Paused {
                    self.refresh_pause(false);
                }
            }
            Event::ReconcileProbeFinished { .. }
            | Event::LateResultRecorded { .. }
            | Event::SecretsVaulted { .. } => {}
            Event::ToolCallProcessed {
                call_id,
                stage,
                outcome,
                message,
                result,
                ..
            } if stage == "after" => {
                if let Some(call) = self.tool_calls.get_mut(call_id) {
                    call.after = match (outcome.as_str(), result) {
                        ("block", _) => Some(Err(message.clone().unwrap_or_default())),
                        (_, Some(r)) => Some(Ok(r.clone())),
                        (_, None) => None,
                    };
                }
            }
            Event::ToolCallProcessed { .. } => {}
            Event::ToolVarsSet {
                values, call_id, ..
            } => {
                for (k, v) in values {
                    self.vars.insert(k.clone(), v.clone());
                }
                // `on_result` has read the result; a tool node's output
                // still needs it.
                if !self.is_step_call(call_id)
                    && let Some(call) = self.tool_calls.get_mut(call_id)
                {
                    call.result = None;
                }
            }
            Event::NodeCompleted { node, output, next } => self.complete_node(node, output, next),
            Event::NodePassed { node, output, next } => {
                // The node's start and end in one event.
                self.start_node(node, &Value::Null, &None);
                self.complete_node(node, output, next);
            }
            Event::SignalReceived {
                signal_id,
                name,
                payload,
                ..
            } => {
                self.signal_ids
                    .insert(signal_id.clone(), DeliveredSignal::new(name, payload));
                self.signals.push(BufferedSignal {
                    signal_id: signal_id.clone(),
                    name: name.clone(),
                    payload: payload.clone(),
                });
            }
            Event::SignalConsumed { signal_id, .. } => {
                self.signals.retain(|s| &s.signal_id != signal_id);
            }
            Event::WaitStarted {
                node,
                signals,
                timers,
            } => {
                if let Some(step) = self.step.as_mut()
                    && &step.id == node
                {
                    step.kind = StepKind::Wait {
                        signals: signals.clone(),
                        timers: timers.clone(),
                    };
                }
                let mut what: Vec<String> =
                    signals.iter().map(|s| format!("signal `{s}`")).collect();
                for t in timers {
                    what.push(match (&t.after_ms, &t.at) {
                        (Some(ms), _) => {
                            format!("{} after {}", t.purpose.label(), super::show_ms(*ms))
                        }
                        (None, Some(at)) => format!("{} at {at}", t.purpose.label()),
                        _ => t.purpose.label().to_owned(),
                    });
                }
                self.set_waiting(format!("node `{node}` waits for {}", what.join(" or ")));
            }
            Event::TimerFired { .. } | Event::McpDefinitionChecked { .. } => {}
            Event::ApprovalRequested { .. } => self.apply_request_event(event),
            Event::ChildRunStarted {
                node,
                call_id,
                child_run_id,
                mode,
                timer,
                workflow,
                ..
            } => {
                let from_tool = self
                    .step
                    .as_ref()
                    .is_none_or(|s| &s.id != node || s.kind != StepKind::Started);
                if from_tool {
                    // A call of a `type: workflow` tool: the call waits.
                    if let Some(call) = self.tool_calls.get_mut(call_id)
                        && *mode == belay_definitions::model::ChildMode::Sync
                    {
                        call.child_run_id = Some(child_run_id.clone());
                        call.child_timer = timer.clone();
                        let tool = call.tool.clone();
                        self.set_waiting(format!(
                            "call `{call_id}` of tool `{tool}` waits for child run {child_run_id} (workflow `{workflow}`)"
                        ));
                    }
                } else if *mode == belay_definitions::model::ChildMode::Sync {
                    if let Some(step) = self.step.as_mut()
                        && &step.id == node
                    {
                        step.kind = StepKind::Child {
                            child_run_id: child_run_id.clone(),
                            timer: timer.clone(),
                        };
                    }
                    self.set_waiting(format!(
                        "node `{node}` waits for child run {child_run_id} (workflow `{workflow}`)"
                    ));
                }
            }
            Event::ChildRunFinished { .. } => {}
            Event::ApprovalDecided { .. } => self.apply_request_event(event),
            Event::RunCompleted { output } => {
                self.status = RunStatus::Completed;
                self.status_reason.clear();
                self.output = Some(output.clone());
            }
            Event::RunFailed { error, .. } => {
                self.status = RunStatus::Failed;
                self.status_reason = error.clone();
            }
            Event::RunCancelled { reason } => {
                self.status = RunStatus::Cancelled;
                self.status_reason = reason.clone();
                let open: Vec<String> = self
                    .tool_calls
                    .iter()
                    .filter(|(_, c)| c.status == CallStatus::Open)
                    .map(|(id, _)| id.clone())
                    .collect();
                for id in open {
                    if let Some(call) = self.tool_calls.get_mut(&id) {
                        call.status = CallStatus::Cancelled;
                    }
                }
            }
            Event::PiiTokensIssued { node, entries } => {
                if let Some(state) = self.node.as_mut()
                    && &state.id == node
                {
                    for entry in entries {
                        match state.pii.iter_mut().find(|e| e.token == entry.token) {
                            Some(known) => *known = entry.clone(),
                            None => state.pii.push(entry.clone()),
                        }
                    }
                }
            }
            Event::FinalAnswerRefused { node, message, .. } => {
                if let Some(state) = self.node.as_mut()
                    && &state.id == node
                {
                    state.transcript.push(ChatMessage::User {
                        content: message.clone(),
                    });
                }
            }
        }
    }

    /// Fold a node's start ([`Event::NodeStarted`], the start of an
    /// [`Event::NodePassed`]: input `null`, no deadline, or of a
    /// `ToolCallScheduled` that `starts_node`: its arguments, no deadline),
    /// at the seq of the event being applied.
    fn start_node(&mut self, node: &str, input: &Value, deadline: &Option<TimerSpec>) {
        self.node_started_seq = self.last_seq;
        let visit = {
            let v = self.visits.entry(node.to_owned()).or_insert(0);
            *v += 1;
            *v
        };
        let prefix = crate::visit_prefix(node, visit);
        self.node_io
            .insert(node.to_owned(), json!({"input": input, "output": null}));
        self.chosen_next = None;
        let kind = self
            .plan
            .as_ref()
            .and_then(|p| p.workflow.def.nodes.iter().find(|n| n.id == node))
            .map(|n| n.kind.clone());
        let Some(NodeKind::Agent { agent, .. }) = kind else {
            self.step = Some(StepState {
                id: node.to_owned(),
                prefix,
                kind: StepKind::Started,
            });
            return;
        };
        let instructions = self
            .plan
            .as_ref()
            .and_then(|p| p.agents.get(&agent))
            .map(|a| a.def.instructions.clone())
            .unwrap_or_default();
        let user = match input {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        };
        self.node = Some(NodeState {
            id: node.to_owned(),
            prefix,
            agent,
            transcript: vec![
                ChatMessage::System {
                    content: instructions,
                },
                ChatMessage::User { content: user },
            ],
            model_steps: 0,
            tool_calls: 0,
            tokens: 0,
            input_tokens: 0,
            output_tokens: 0,
            cost_usd: 0.0,
            last_call: None,
            model_call: None,
            pending: Vec::new(),
            deadline: deadline.clone(),
            pii: Vec::new(),
        });
    }

    /// Fold a node's end ([`Event::NodeCompleted`], the end of an
    /// [`Event::NodePassed`], or of a `ToolCallCompleted` that
    /// `ends_node`).
    fn complete_node(&mut self, node: &str, output: &Value, next: &Option<String>) {
        let is_set = self
            .plan
            .as_ref()
            .and_then(|p| p.workflow.def.nodes.iter().find(|n| n.id == node))
            .is_some_and(|n| matches!(n.kind, NodeKind::Set { .. }));
        if is_set && let Value::Object(values) = output {
            for (k, v) in values {
                self.vars.insert(k.clone(), v.clone());
            }
        }
        if let Some(Value::Object(io)) = self.node_io.get_mut(node) {
            io.insert("output".into(), output.clone());
        }
        // A tool node's result is its output now.
        if let Some(StepKind::Tool { call_id }) = self.step.as_ref().map(|s| &s.kind)
            && let Some(call) = self.tool_calls.get_mut(call_id)
        {
            call.result = None;
        }
        self.node = None;
        self.step = None;
        self.chosen_next = next.clone();
        self.last_completed = Some((node.to_owned(), output.clone()));
        if self.status == RunStatus::Waiting {
            self.status = RunStatus::Running;
            self.status_reason.clear();
        }
    }

    /// Fold a [`Event::ToolCallCompleted`]: the call's result, and the end
    /// of its tool node when the event `ends_node`.
    fn fold_tool_call_completed(
        &mut self,
        call_id: &str,
        attempt: u32,
        result: &Value,
        ends_node: bool,
    ) {
        if let Some(call) = self.tool_calls.get_mut(call_id) {
            call.completed_by_attempt = Some(attempt);
        }
        self.complete_call(call_id, result);
        self.end_child_wait(call_id);
        if ends_node && let Some((node, output)) = self.tool_node_end(call_id) {
            self.complete_node(&node, &output, &None);
        }
    }

    /// The end a completed `call_id` gives the tool node it is the call
    /// of, as `(node, output)`: the call's result (after its
    /// `process.after` stage), what `ToolCallCompleted.ends_node` folds
    /// in. `None`: no tool node is waiting for that call.
    pub(crate) fn tool_node_end(&self, call_id: &str) -> Option<(String, Value)> {
        let step = self.step.as_ref().filter(|_| self.is_step_call(call_id))?;
        let output = self.tool_calls.get(call_id)?.result.clone();
        Some((step.id.clone(), output.unwrap_or(Value::Null)))
    }

    /// Whether `call_id` is the call of the tool node being executed.
    fn is_step_call(&self, call_id: &str) -> bool {
        self.step
            .as_ref()
            .is_some_and(|s| matches!(&s.kind, StepKind::Tool { call_id: c } if c == call_id))
    }

    /// Mark a call completed and, unless it is a probe, hand its result to
    /// the model (truncated to the agent's limit).
    fn complete_call(&mut self, call_id: &str, result: &Value) {
        // `process.after` recorded what becomes of the result.
        let after = self
            .tool_calls
            .get_mut(call_id)
            .and_then(|c| c.after.take());
        let processed;
        let result = match after {
            Some(Err(message)) => {
                self.fail_call(call_id, &message);
                return;
            }
            Some(Ok(v)) => {
                processed = v;
                &processed
            }
            None => result,
        };
        let limit = self
            .current_agent()
            .map(|a| a.max_result_bytes)
            .unwrap_or(16384);
        // `compaction.essential_fields` first, then
        // `max_description_length`, then the byte limit; the event (and
        // `call.result`) keep the whole result.
        let compaction = self
            .tool_calls
            .get(call_id)
            .and_then(|c| self.plan.as_ref()?.tools.get(&c.tool))
            .and_then(|t| t.def.compaction.as_ref());
        let text = match compaction {
            Some(c) => {
                let mut shown = if c.essential_fields.is_empty() {
                    result.clone()
                } else {
                    super::normalize::essential_fields(result, &c.essential_fields)
                };
                if let Some(max) = c.max_description_length {
                    shown = super::normalize::cut_long_strings(&shown, max as usize);
                }
                super::normalize::truncate_for_model(&shown, limit as usize)
            }
            None => super::normalize::truncate_for_model(result, limit as usize),
        };
        // The state keeps a result only while something will read it: a
        // tool node's output (until `node_completed`), or `on_result` (until
        // its `tool_vars_set`, in the same transition). A long run must not
        // hold every result it ever had; the events do.
        let is_step_call = self.is_step_call(call_id);
        let has_on_result = self
            .tool_calls
            .get(call_id)
            .and_then(|c| self.plan.as_ref()?.tools.get(&c.tool))
            .is_some_and(|t| !t.def.on_result.is_empty());
        if let Some(call) = self.tool_calls.get_mut(call_id) {
            call.status = CallStatus::Completed;
            call.result = (is_step_call || (has_on_result && call.probe_for.is_none()))
                .then(|| result.clone());
            if call.probe_for.is_none() {
                let tool_use_id = call.tool_use_id.clone();
                self.set_pending_result(&tool_use_id, text);
            }
        }
    }

    /// Mark a call failed and, unless it is a probe, tell the model.
    fn fail_call(&mut self, call_id: &str, error: &str) {
        let limit = self
            .current_agent()
            .map(|a| a.max_result_bytes)
            .unwrap_or(16384);
        let text = super::normalize::truncate_for_model(
            &Value::String(format!("error: {error}")),
            limit as usize,
        );
        if let Some(call) = self.tool_calls.get_mut(call_id) {
            call.status = CallStatus::Failed;
            call.error = Some(error.to_owned());
            if call.probe_for.is_none() {
                let tool_use_id = call.tool_use_id.clone();
                self.set_pending_result(&tool_use_id, text);
            }
        }
    }

    /// Calls whose outcome is uncertain, in call-id order.
    pub fn open_uncertain(&self) -> Vec<&str> {
        self.tool_calls
            .iter()
            .filter(|(_, c)| c.status == CallStatus::Uncertain)
            .map(|(id, _)| id.as_str())
            .collect()
    }

    /// After a resume or a resolution: paused while an operator pause or an
    /// uncertain outcome remains, running otherwise.
    fn refresh_pause(&mut self, may_run: bool) {
        if self.status.is_terminal() {
            return;
        }
        if let Some(reason) = &self.operator_paused {
            self.status = RunStatus::Paused;
            self.status_reason = reason.clone();
        } else if let Some(reason) = self
            .tool_calls
            .values()
            .find(|c| c.status == CallStatus::Uncertain)
            .and_then(|c| c.uncertain_reason.clone())
        {
            self.status = RunStatus::Paused;
            self.status_reason = format!("uncertain outcome: {reason}");
        } else if may_run {
            self.status = RunStatus::Running;
            self.status_reason.clear();
            if let Some(reason) = self.waiting_reason() {
                self.status = RunStatus::Waiting;
                self.status_reason = reason;
            }
        }
    }

    /// Enter `waiting` (unless paused: the pause shows until it is lifted).
    pub(crate) fn set_waiting(&mut self, reason: String) {
        if self.status == RunStatus::Running {
            self.status = RunStatus::Waiting;
            self.status_reason = reason;
        }
    }

    /// A `type: workflow` call ended: the run stops waiting for it (unless
    /// another child call still holds it).
    fn end_child_wait(&mut self, call_id: &str) {
        let was_child = self.tool_calls.get(call_id).is_some_and(|c| {
            c.child_run_id.is_some()
                || c.callback_timer.is_some()
                || c.confirmed.is_some()
                || c.awaiting_input.is_some()
        });
        if was_child {
            self.refresh_waiting();
        }
    }

    /// A waiting run whose wait may have ended: still waiting (with the
    /// current reason) or running again.
    pub(crate) fn refresh_waiting(&mut self) {
        if self.status == RunStatus::Waiting {
            match self.waiting_reason() {
                Some(reason) => self.status_reason = reason,
                None => {
                    self.status = RunStatus::Running;
                    self.status_reason.clear();
                }
            }
        }
    }

    /// Why the run would be waiting now, if its current node waits.
    fn waiting_reason(&self) -> Option<String> {
        // Calls first: a confirmation, then a callback, then a child.
        let call_wait = self
            .tool_calls
            .iter()
            .filter_map(|(id, c)| {
                let rank = match (
                    &c.awaiting_confirmation,
                    &c.awaiting_input,
                    &c.callback_timer,
                ) {
                    (Some(_), _, _) => 0,
                    (None, Some(_), _) => 1,
                    (None, None, Some(_)) => 2,
                    (None, None, None) => 3,
                };
                Some((rank, c.outside_wait_reason(id)?))
            })
            .min_by_key(|(rank, _)| *rank);
        if let Some((_, reason)) = call_wait {
            return Some(reason);
        }
        let step = self.step.as_ref()?;
        match &step.kind {
            StepKind::Wait { signals, .. } => Some(format!(
                "node `{}` waits for {}",
                step.id,
                if signals.is_empty() {
                    "a timer".to_owned()
                } else {
                    signals
                        .iter()
                        .map(|s| format!("signal `{s}`"))
                        .collect::<Vec<_>>()
                        .join(" or ")
                }
            )),
            StepKind::Approval {
                approver_grant,
                request_id,
                ..
            } => Some(format!(
                "node `{}` waits for an approval (request `{request_id}`) by a holder of `{approver_grant}`",
                step.id
            )),
            StepKind::Child { child_run_id, .. } => Some(format!(
                "node `{}` waits for child run {child_run_id}",
                step.id
            )),
            _ => None,
        }
    }

    /// The document jq expressions of a workflow see:
    /// `{"input", "nodes": {<id>: {"input", "output"}}, "vars", "run": {"id", "tenant"}}`.
    pub fn document(&self) -> Value {
        json!({
            "input": self.input,
            "nodes": self.node_io,
            "vars": self.vars,
            "run": {"id": self.run_id, "tenant": self.tenant},
        })
    }

    /// Record a result for a pending tool use; once every pending call has
    /// its result, append them to the transcript in the model's order.
    fn set_pending_result(&mut self, tool_use_id: &str, text: String) {
        let Some(node) = self.node.as_mut() else {
            return;
        };
        if let Some(p) = node
            .pending
            .iter_mut()
            .find(|p| p.tool_use_id == tool_use_id && p.result.is_none())
        {
            p.result = Some(text);
        }
        if !node.pending.is_empty() && node.pending.iter().all(|p| p.result.is_some()) {
            for p in node.pending.drain(..) {
                node.transcript.push(ChatMessage::Tool {
                    tool_call_id: p.tool_use_id,
                    content: p.result.unwrap_or_default(),
                });
            }
        }
    }
}

/// The part of a scheduled call's `arguments` the model chose: without the
/// parameters the tool's definition fills in (`ToolDef.injected`), which
/// may differ on every call (a call id) and so would hide a repeated call
/// from `max_identical_calls`.
pub(super) fn model_arguments(plan: Option<&RunPlan>, tool: &str, arguments: &Value) -> Value {
    let injected = plan
        .and_then(|p| p.tools.get(tool))
        .map(|t| &t.def.injected)
        .filter(|i| !i.is_empty());
    match (injected, arguments) {
        (Some(injected), Value::Object(map)) => Value::Object(
            map.iter()
                .filter(|(k, _)| !injected.iter().any(|p| &p.name == *k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        _ => arguments.clone(),
    }
}
