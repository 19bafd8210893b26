//! Which request a person's decision or answer decides (issue 22).
//!
//! An `approval` node visited in a loop (review → decline → revise →
//! review) asks once per visit, and a tool may ask a person several
//! questions in one call. A decision that named only the node (or the
//! call) could not be told apart from a retry of the previous round's
//! decision after a lost reply, and was applied to the round open now. So
//! every request has an id (`<node>.approval`, `<node>~<n>.approval`,
//! `<call_id>.input<n>`; a confirmation's is its call id), recorded in its
//! event and shown in the run's status reason, and a decision names it:
//!
//! - a decision for a request already decided is answered with what was
//!   recorded: the same decision succeeds and changes nothing (no events),
//!   a different one is a conflict naming the first;
//! - it is never applied to another request;
//! - one naming no request is accepted only while the node (or call) has
//!   made one request; after that it must name it.

use serde_json::Value;

use super::Step;
use crate::error::MachineError;
use crate::normalize;
use crate::state::{Decided, HumanRequest, RunStatus, StepKind, content_sha256};

/// What a person decided about an approval or a confirmation.
#[derive(Debug, Clone)]
pub(crate) struct Verdict {
    /// Approve or decline.
    pub(crate) approve: bool,
    /// The subject (or arguments) as edited, where allowed.
    pub(crate) edited_subject: Option<Value>,
    /// Who.
    pub(crate) by: String,
    /// Their permissions.
    pub(crate) grants: Vec<String>,
    /// Why.
    pub(crate) reason: String,
}

impl Step {
    /// `DecideApproval`: `node` is an approval node or a call id (a
    /// confirmation); `request` the request decided, if named.
    pub(crate) fn on_decide(
        &mut self,
        node: String,
        request: Option<String>,
        verdict: Verdict,
    ) -> Result<(), MachineError> {
        // A call id names a tool call's confirmation (its request id).
        let call_id = request
            .clone()
            .filter(|r| self.state.tool_calls.contains_key(r));
        if let Some(call) = self.state.tool_calls.get(call_id.as_ref().unwrap_or(&node)) {
            let call_id = call_id.unwrap_or_else(|| node.clone());
            if call.awaiting_confirmation.is_some() {
                let v = verdict;
                return self.on_confirmation(
                    call_id,
                    v.approve,
                    v.edited_subject,
                    v.by,
                    v.grants,
                    v.reason,
                );
            }
            if let Some((by, approved, seq)) = call.confirmed.clone() {
                // A confirmation's edits are re-derived (defaults, injected
                // parameters), so only the verdict is compared.
                let recorded = Decided {
                    by,
                    approved,
                    seq,
                    content_sha256: [0; 32],
                };
                let same = recorded.approved == verdict.approve;
                return repeated(&call_id, &call_id, &recorded, same, false);
            }
        }
        let node = match (node.is_empty(), &request) {
            (true, Some(r)) => self.node_of_request(r).unwrap_or_default(),
            _ => node,
        };
        self.check_node_exists(&node)?;
        let rounds = self.state.approvals.get(&node).cloned().unwrap_or_default();
        let Some(request_id) = pick_request(&node, request, &rounds, self.open_approval(&node))?
        else {
            // Never requested: the node is not waiting (or the run ended).
            if self.state.status.is_terminal() || self.state.status == RunStatus::New {
                return Err(self.wrong_status(&format!("decide node `{node}`")));
            }
            return Err(MachineError::NotWaiting(format!(
                "node `{node}` is not waiting for a decision"
            )));
        };
        let round = rounds.iter().find(|r| r.request_id == request_id);
        if let Some(recorded) = round.and_then(|r| r.answered.as_ref()) {
            let same = recorded.approved == verdict.approve
                && verdict.edited_subject.as_ref().is_none_or(|e| {
                    content_sha256(&normalize::strip_nul_value(e.clone()))
                        == recorded.content_sha256
                });
            return repeated(&node, &request_id, recorded, same, false);
        }
        // A decision is still told about an earlier one after the run ended
        // (above); any other decision on an ended run is refused.
        if self.state.status.is_terminal() || self.state.status == RunStatus::New {
            return Err(self.wrong_status(&format!("decide node `{node}`")));
        }
        self.on_decision(node, request_id, verdict)
    }

    /// `ProvideToolInput`: the question of call `call_id` that `request`
    /// names (or its only one) answered with `answer`.
    pub(crate) fn on_answer(
        &mut self,
        call_id: String,
        request: Option<String>,
        answer: Value,
        by: String,
    ) -> Result<(), MachineError> {
        let call = self.state.tool_calls.get(&call_id);
        let rounds = call.map(|c| c.input_requests.clone()).unwrap_or_default();
        let open = call
            .and_then(|c| c.awaiting_input.as_ref())
            .map(|a| a.request_id.clone());
        if let Some(request_id) = pick_request(&call_id, request, &rounds, open)? {
            let round = rounds.iter().find(|r| r.request_id == request_id);
            if let Some(recorded) = round.and_then(|r| r.answered.as_ref()) {
                let same =
                    content_sha256(&normalize::strip_nul_value(answer)) == recorded.content_sha256;
                return repeated(&call_id, &request_id, recorded, same, true);
            }
            self.require_active("input")?;
            return self.on_input_provided(call_id, request_id, answer, by);
        }
        self.require_active("input")?;
        self.require_open_tool_call(&call_id)?;
        Err(MachineError::CallNotOpen {
            call_id,
            detail: "it does not wait for input".into(),
        })
    }

    /// The request of approval node `node` waiting now, if any.
    fn open_approval(&self, node: &str) -> Option<String> {
        match &self.state.step.as_ref().filter(|s| s.id == node)?.kind {
            StepKind::Approval { request_id, .. } => Some(request_id.clone()),
            _ => None,
        }
    }

    /// The approval node that made request `request`.
    fn node_of_request(&self, request: &str) -> Option<String> {
        self.state
            .approvals
            .iter()
            .find(|(_, rounds)| rounds.iter().any(|r| r.request_id == request))
            .map(|(node, _)| node.clone())
    }

    /// A misspelt node is named as such, whatever the run is doing.
    fn check_node_exists(&self, node: &str) -> Result<(), MachineError> {
        let Ok(plan) = self.plan() else { return Ok(()) };
        let nodes = &plan.workflow.def.nodes;
        if nodes.iter().any(|n| n.id == node) {
            return Ok(());
        }
        Err(MachineError::NoSuchNode {
            node: node.to_owned(),
            workflow: plan.workflow.def.name.clone(),
            approvals: nodes
                .iter()
                .filter(|n| matches!(n.kind, belay_definitions::model::NodeKind::Approval(_)))
                .map(|n| n.id.clone())
                .collect(),
        })
    }
}

/// The request a decision for `subject` (a node or a call) decides, among
/// its `rounds` (`open`: the one waiting now): the one `request` names (it
/// must be one of them), or with none named the only one. `None` when
/// `subject` made no request.
fn pick_request(
    subject: &str,
    request: Option<String>,
    rounds: &[HumanRequest],
    open: Option<String>,
) -> Result<Option<String>, MachineError> {
    let ids = || {
        rounds
            .iter()
            .map(|r| r.request_id.clone())
            .collect::<Vec<_>>()
    };
    match request {
        Some(r) if rounds.iter().any(|x| x.request_id == r) => Ok(Some(r)),
        Some(r) => Err(MachineError::NoSuchRequest {
            subject: subject.to_owned(),
            request: r,
            requests: ids(),
        }),
        None if rounds.len() > 1 => Err(MachineError::RequestRequired {
            subject: subject.to_owned(),
            requests: ids(),
            open,
        }),
        None => Ok(rounds.first().map(|r| r.request_id.clone())),
    }
}

/// A decision (an `answer` to a question) for a request already decided:
/// `same` as the recorded one succeeds and changes nothing; a different one
/// is refused, naming it.
fn repeated(
    subject: &str,
    request: &str,
    recorded: &Decided,
    same: bool,
    answer: bool,
) -> Result<(), MachineError> {
    if same {
        return Ok(());
    }
    Err(MachineError::AlreadyDecided {
        node: subject.to_owned(),
        request: request.to_owned(),
        by: recorded.by.clone(),
        approved: recorded.approved,
        seq: recorded.seq,
        answer,
    })
}
