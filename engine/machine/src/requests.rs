//! The requests for a person that a run holds open: approvals of
//! `approval` nodes, confirmations of tool calls, tools' questions. Each is
//! named by its request id, which a decision or answer names (issue 22;
//! `step/decision.rs`), and `RunService.GetRun` lists them.

use crate::event::Event;
use crate::state::{
    AwaitingInput, CallStatus, Decided, HumanRequest, RunState, StepKind, approval_request_id,
    input_request_id,
};

/// What kind of request a person answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestKind {
    /// An `approval` node's request (`DecideApproval`).
    Approval,
    /// A tool call's `confirmation:` (`DecideApproval` naming the call).
    Confirmation,
    /// A tool's question to a person (`ProvideToolInput`).
    ToolInput,
}

impl RequestKind {
    /// `approval`, `confirmation` or `tool_input`.
    pub fn as_str(self) -> &'static str {
        match self {
            RequestKind::Approval => "approval",
            RequestKind::Confirmation => "confirmation",
            RequestKind::ToolInput => "tool_input",
        }
    }
}

/// A request waiting for a person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenRequest {
    /// Its id, which the decision or answer names.
    pub request_id: String,
    /// What it asks for.
    pub kind: RequestKind,
    /// The node that asks.
    pub node: String,
    /// The call that asks (empty for an approval node).
    pub call_id: String,
    /// The permission a decider needs (empty for a tool's question).
    pub approver_grant: String,
}

/// Every request `state` holds open, the approval node's first, then the
/// calls' in call-id order.
pub fn open_requests(state: &RunState) -> Vec<OpenRequest> {
    let mut open = Vec::new();
    if let Some(step) = &state.step
        && let StepKind::Approval {
            approver_grant,
            request_id,
            ..
        } = &step.kind
    {
        open.push(OpenRequest {
            request_id: request_id.clone(),
            kind: RequestKind::Approval,
            node: step.id.clone(),
            call_id: String::new(),
            approver_grant: approver_grant.clone(),
        });
    }
    for (call_id, call) in state
        .tool_calls
        .iter()
        .filter(|(_, c)| c.status == CallStatus::Open)
    {
        if let Some((grant, _)) = &call.awaiting_confirmation {
            open.push(OpenRequest {
                request_id: call_id.clone(),
                kind: RequestKind::Confirmation,
                node: call.node.clone(),
                call_id: call_id.clone(),
                approver_grant: grant.clone(),
            });
        }
        if let Some(asked) = &call.awaiting_input {
            open.push(OpenRequest {
                request_id: asked.request_id.clone(),
                kind: RequestKind::ToolInput,
                node: call.node.clone(),
                call_id: call_id.clone(),
                approver_grant: String::new(),
            });
        }
    }
    open
}

impl RunState {
    /// Fold an event that opens or answers a request for a person
    /// (`approval_requested`, `approval_decided`,
    /// `tool_call_input_requested`, `tool_call_input_provided`); part of
    /// [`RunState::apply`]. Events written before request ids existed have
    /// none: the id is derived (the node's visit prefix, the call's count
    /// of questions) and an answer goes to the latest request.
    pub(crate) fn apply_request_event(&mut self, event: &Event) {
        match event {
            Event::ApprovalRequested {
                node,
                request_id,
                subject,
                approver_grant,
                allow_edits,
                timer,
                ..
            } => {
                let request_id = match (request_id.is_empty(), self.step.as_ref()) {
                    (false, _) => request_id.clone(),
                    (true, Some(step)) if &step.id == node => approval_request_id(&step.prefix),
                    (true, _) => approval_request_id(node),
                };
                if let Some(step) = self.step.as_mut()
                    && &step.id == node
                {
                    step.kind = StepKind::Approval {
                        subject: subject.clone(),
                        approver_grant: approver_grant.clone(),
                        allow_edits: *allow_edits,
                        timer: timer.clone(),
                        request_id: request_id.clone(),
                    };
                }
                self.set_waiting(format!(
                    "node `{node}` waits for an approval (request `{request_id}`) by a holder of `{approver_grant}`"
                ));
                self.approvals
                    .entry(node.clone())
                    .or_default()
                    .push(HumanRequest {
                        request_id,
                        answered: None,
                    });
            }
            Event::ApprovalDecided {
                node,
                request_id,
                approved,
                by,
                subject,
                ..
            } => {
                let decided = Decided::new(by, *approved, self.last_seq, subject);
                let rounds = self.approvals.entry(node.clone()).or_default();
                // Before issue 22 a decision named no request: the node's latest.
                let round = if request_id.is_empty() {
                    rounds.last_mut()
                } else {
                    rounds.iter_mut().find(|r| &r.request_id == request_id)
                };
                match round {
                    Some(round) => round.answered = Some(decided),
                    None => rounds.push(HumanRequest {
                        request_id: request_id.clone(),
                        answered: Some(decided),
                    }),
                }
            }
            Event::ToolCallInputRequested {
                call_id,
                request_id,
                attempt,
                via,
                requests,
                request_state,
            } => {
                if let Some(call) = self.tool_calls.get_mut(call_id) {
                    let request_id = if request_id.is_empty() {
                        input_request_id(call_id, call.input_requests.len() + 1)
                    } else {
                        request_id.clone()
                    };
                    call.input_requests.push(HumanRequest {
                        request_id: request_id.clone(),
                        answered: None,
                    });
                    call.awaiting_input = Some(AwaitingInput {
                        attempt: *attempt,
                        via: via.clone(),
                        requests: requests.clone(),
                        request_state: request_state.clone(),
                        request_id,
                    });
                    call.dispatched_attempt = None;
                    if let Some(reason) = call.outside_wait_reason(call_id) {
                        self.set_waiting(reason);
                    }
                }
            }
            Event::ToolCallInputProvided {
                call_id,
                request_id,
                by,
                answer,
                input,
            } => {
                let seq = self.last_seq;
                if let Some(call) = self.tool_calls.get_mut(call_id) {
                    let open = call.awaiting_input.take().map(|a| a.request_id);
                    let answered = if request_id.is_empty() {
                        open
                    } else {
                        Some(request_id.clone())
                    };
                    if let Some(round) = call
                        .input_requests
                        .iter_mut()
                        .find(|r| Some(&r.request_id) == answered.as_ref())
                    {
                        round.answered = Some(Decided::new(by, true, seq, answer));
                    }
                    call.input_rounds += 1;
                    call.input = input.clone();
                }
                self.refresh_waiting();
            }
            _ => {}
        }
    }
}
