//! MCP sampling as the machine sees it: which tool calls may let their
//! server ask the run's model for completions (`sampling/createMessage`),
//! and how those completions are charged.
//!
//! - A grant ([`SamplingGrant`], `ToolCallSpec.sampling`) goes into the spec
//!   of a call of a tool that declares `sampling:` only when an agent node
//!   proposed it (a workflow's tool node, a reconcile probe and a child run
//!   get none): the agent's model, the tool's `max_requests`, and its
//!   `max_tokens` lowered to what is left of the agent's and the workflow's
//!   token budgets ([`grant`]). No room left (a token, input-token or
//!   cost budget used up): no grant. The grant is computed from the state
//!   when the spec is built (scheduling, an approved confirmation, a
//!   person's answer, an operator's retry with a new key), so a replay
//!   builds the same spec.
//! - The worker reports what the completions used beside the attempt's
//!   result, failure or question for a person (an MCP elicitation); the
//!   coordinator wraps that report in
//!   [`Input::ToolCallSampled`], recorded as [`Event::ToolCallSampled`]
//!   before the report is decided ([`decide_sampled`]), and the fold charges
//!   it like a model call's tokens (`RunState::charge_sampling`), so the
//!   next model call's budget check sees it.
//!
//! The grant bounds each completion, not their sum: a call may use up to
//! `max_requests` × `max_tokens` output tokens, past what was left; the
//! next model call of the node is then refused by its budget check, as for
//! a model call that goes past a budget.

use belay_proto::wire::{SamplingGrant, SamplingUsage};
use serde_json::Value;

use super::state::{CallStatus, NodeState, RunState, RunTotals};
use super::{Decision, Event, Input, MachineError, Step, decide};
use crate::definitions::model::{AgentDef, Budget, ToolDef};

/// What a call of `tool` proposed by `agent` in `node` may ask of the
/// model, or `None` (the tool declares no `sampling:`, or a budget of the
/// node or of the run, `run`, has no room left).
pub(super) fn grant(
    tool: &ToolDef,
    agent: &AgentDef,
    node: &NodeState,
    run: &Budget,
    totals: &RunTotals,
) -> Option<SamplingGrant> {
    let declared = tool.sampling?;
    // An agent that redacts PII: the server's prompt, like the tool's
    // result, may hold personal data, and would reach the provider as it
    // is; only a tool whose results may (`pii_access: llm`) samples.
    if !agent.pii_redaction.is_empty() && !tool.pii_access.llm {
        return None;
    }
    let left = |limit: Option<u64>, used: u64| limit.map(|l| l.saturating_sub(used));
    let run_tokens = totals.input_tokens.saturating_add(totals.output_tokens);
    let output_room = [
        left(agent.budget.max_tokens, node.tokens),
        left(agent.budget.max_output_tokens, node.output_tokens),
        left(run.max_tokens, run_tokens),
        left(run.max_output_tokens, totals.output_tokens),
    ]
    .into_iter()
    .flatten()
    .fold(u64::from(declared.max_tokens), u64::min);
    // A completion needs a prompt: no input tokens left is no room either.
    let no_input = [
        left(agent.budget.max_input_tokens, node.input_tokens),
        left(run.max_input_tokens, totals.input_tokens),
    ]
    .into_iter()
    .flatten()
    .any(|room| room == 0);
    let no_money = agent
        .budget
        .max_cost_usd
        .is_some_and(|l| node.cost_usd >= l)
        || run.max_cost_usd.is_some_and(|l| totals.cost_usd >= l);
    if output_room == 0 || no_input || no_money {
        return None;
    }
    Some(SamplingGrant {
        model: agent.model.clone(),
        max_requests: declared.max_requests,
        max_tokens: u32::try_from(output_room).unwrap_or(u32::MAX),
    })
}

impl Step {
    /// `spec` (a tool call's task spec) with the grant of a call of `tool`
    /// made by node `call_node`, when that node is the running agent node
    /// (see [`grant`]); otherwise `spec` as it is.
    pub(super) fn with_sampling(&self, mut spec: Value, call_node: &str, tool: &ToolDef) -> Value {
        if tool.sampling.is_none() {
            return spec;
        }
        let Some(node) = self.state.node.as_ref().filter(|n| n.id == call_node) else {
            return spec;
        };
        let Some(plan) = self.state.plan.as_deref() else {
            return spec;
        };
        let Some(agent) = plan.agents.get(&node.agent) else {
            return spec;
        };
        let granted = grant(
            tool,
            &agent.def,
            node,
            &plan.workflow.def.budget,
            &self.state.totals,
        );
        if let (Some(granted), Value::Object(map)) = (granted, &mut spec)
            && let Ok(value) = serde_json::to_value(granted)
        {
            map.insert("sampling".into(), value);
        }
        spec
    }
}

/// [`Input::ToolCallSampled`]: records `usage` for the attempt `report`
/// (a [`Input::ToolCallCompleted`], [`Input::TaskFailed`] or
/// [`Input::ToolInputRequested`] of an open tool call) as
/// [`Event::ToolCallSampled`], then decides `report` on the state that
/// includes it, in the same decision.
///
/// # Errors
/// [`MachineError::CallNotOpen`] when `report` is not a result or failure
/// of an open tool call; whatever deciding `report` refuses.
pub(super) fn decide_sampled(
    state: &RunState,
    usage: SamplingUsage,
    report: Input,
) -> Result<Decision, MachineError> {
    let (call_id, attempt) = match &report {
        Input::ToolCallCompleted {
            call_id, attempt, ..
        }
        | Input::TaskFailed {
            call_id, attempt, ..
        }
        | Input::ToolInputRequested {
            call_id, attempt, ..
        } => (call_id.clone(), *attempt),
        _ => {
            return Err(MachineError::InvalidPlan(
                "sampling usage comes only with a tool call's result, failure or question for a person".into(),
            ));
        }
    };
    if !state
        .tool_calls
        .get(&call_id)
        .is_some_and(|c| c.status == CallStatus::Open)
    {
        return Err(MachineError::CallNotOpen {
            call_id,
            detail: "sampling usage is charged only to an open tool call".into(),
        });
    }
    let event = Event::ToolCallSampled {
        call_id,
        attempt,
        usage,
    };
    let mut charged = state.clone();
    charged.apply(&event);
    let mut decision = decide(&charged, report)?;
    decision.events.insert(0, event);
    Ok(decision)
}
