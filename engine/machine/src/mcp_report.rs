//! What a worker adds to the report of a `type: mcp` call's attempt
//! ([`Input::McpReported`]): the definition hash the call was checked
//! against, recorded as [`Event::McpDefinitionChecked`] before the
//! attempt's result or failure, and the kind of its failure (the tool's
//! `isError`, a JSON-RPC error, the transport), set on the
//! [`Event::ToolCallAttemptFailed`] and [`Event::ToolCallFailed`] the
//! failure leads to, so the history and the audit keep the three kinds
//! apart. Added for issue 22.

use super::event::ToolFailureKind;
use super::state::CallStatus;
use super::{Decision, Event, Input, MachineError, RunState, decide};

/// The call and attempt a report is about, through an
/// [`Input::ToolCallSampled`] wrapper.
fn reported_call(report: &Input) -> Option<(String, u32)> {
    match report {
        Input::ToolCallCompleted {
            call_id, attempt, ..
        }
        | Input::TaskFailed {
            call_id, attempt, ..
        } => Some((call_id.clone(), *attempt)),
        Input::ToolCallSampled { report, .. } => reported_call(report),
        _ => None,
    }
}

/// [`Input::McpReported`]: decides `report`, then records the definition
/// hash first and sets `kind` on the failure events of the call.
pub(super) fn decide_reported(
    state: &RunState,
    definition_hash: Option<String>,
    kind: Option<ToolFailureKind>,
    report: Input,
) -> Result<Decision, MachineError> {
    let Some((call_id, attempt)) = reported_call(&report) else {
        return Err(MachineError::InvalidPlan(
            "an MCP report comes only with a tool call's result or failure".into(),
        ));
    };
    if !state
        .tool_calls
        .get(&call_id)
        .is_some_and(|c| c.status == CallStatus::Open)
    {
        return Err(MachineError::CallNotOpen {
            call_id,
            detail: "an MCP report is recorded only for an open tool call".into(),
        });
    }
    let mut decision = decide(state, report)?;
    for event in &mut decision.events {
        match event {
            Event::ToolCallAttemptFailed {
                call_id: id,
                kind: k,
                ..
            }
            | Event::ToolCallFailed {
                call_id: id,
                kind: k,
                ..
            } if *id == call_id && k.is_none() => *k = kind,
            _ => {}
        }
    }
    if let Some(definition_hash) = definition_hash.filter(|h| !h.is_empty()) {
        decision.events.insert(
            0,
            Event::McpDefinitionChecked {
                call_id,
                attempt,
                definition_hash,
            },
        );
    }
    Ok(decision)
}
