//! [`MachineError`]: why the machine refused an input (nothing is written).

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
    /// A request (an approval, a confirmation, a tool's question) that was
    /// already decided, differently from the decision sent now (the same
    /// decision sent again is answered with the recorded one).
    #[error("request `{request}` of `{node}` was already {} by {by} (event {seq}); this {} differs and is not applied",
        if *.answer { "answered" } else if *.approved { "approved" } else { "declined" },
        if *.answer { "answer" } else { "decision" })]
    AlreadyDecided {
        /// Node id, or the call id of a confirmation or question.
        node: String,
        /// The request decided.
        request: String,
        /// Who decided.
        by: String,
        /// Approved or declined.
        approved: bool,
        /// Seq of the decision event.
        seq: u64,
        /// Whether it was an answer to a tool's question (not a decision).
        answer: bool,
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
    /// A decision or answer that names no request, for a node or call that
    /// has had several: which one it decides cannot be known (a retry of an
    /// earlier one must never decide a later one), so it must name it.
    #[error(
        "`{subject}` has had {} requests ({}); name the one this decides (`request_id`){}",
        .requests.len(),
        .requests.join(", "),
        match .open { Some(r) => format!("; the open one is `{r}`"), None => String::new() }
    )]
    RequestRequired {
        /// Node id or call id.
        subject: String,
        /// Its requests, oldest first.
        requests: Vec<String>,
        /// The one open now, if any.
        open: Option<String>,
    },
    /// A decision or answer naming a request that `subject` never made.
    #[error(
        "`{subject}` made no request `{request}`{}",
        if .requests.is_empty() { String::new() } else { format!(" (its requests: {})", .requests.join(", ")) }
    )]
    NoSuchRequest {
        /// Node id or call id.
        subject: String,
        /// The request named.
        request: String,
        /// Its requests, oldest first.
        requests: Vec<String>,
    },
}
