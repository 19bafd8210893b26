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
//! The grant bounds the sum of an attempt's completions, not only each
//! one: `max_total_tokens` output and `max_input_tokens` input tokens, from
//! what is left of the token and cost budgets (cost in tokens at the
//! agent's prices), split among the sampling calls of one model turn; each
//! completion is further bounded by the tool's `max_tokens` and the
//! agent's `max_output_tokens`. A retry gets a new grant from what is left
//! then ([`Step::refresh_sampling_grant`]). The worker estimates a prompt
//! before sending it, so a completion may still pass what was left by
//! the estimate's error; the next model call's budget check then stops
//! the run, as for a model call that goes past a budget.

use belay_proto::wire::{SamplingGrant, SamplingUsage};
use serde_json::Value;

use super::state::{CallStatus, NodeState, RunState, RunTotals};
use super::step::Step;
use super::{Decision, Event, Input, MachineError, decide};
use belay_definitions::model::{AgentDef, Budget, ToolDef};

/// What a call of `tool` proposed by `agent` in `node` may ask of the
/// model, or `None` (the tool declares no `sampling:`, an agent that
/// redacts PII and a tool without `pii_access: llm`, or a budget of the
/// node or of the run, `run`, with no room left). `share`: the sampling
/// calls of the same model turn, which split what is left (at least 1).
pub(super) fn grant(
    tool: &ToolDef,
    agent: &AgentDef,
    node: &NodeState,
    run: &Budget,
    totals: &RunTotals,
    share: u32,
) -> Option<SamplingGrant> {
    let declared = tool.sampling?;
    // An agent that redacts PII: the server's prompt, like the tool's
    // result, may hold personal data, and would reach the provider as it
    // is; only a tool whose results may (`pii_access: llm`) samples.
    if !agent.pii_redaction.is_empty() && !tool.pii_access.llm {
        return None;
    }
    let left = |limit: Option<u64>, used: u64| limit.map(|l| l.saturating_sub(used));
    let min = |xs: &[Option<u64>]| xs.iter().flatten().copied().min();
    let run_tokens = totals.input_tokens.saturating_add(totals.output_tokens);
    let any_tokens = min(&[
        left(agent.budget.max_tokens, node.tokens),
        left(run.max_tokens, run_tokens),
    ]);
    // A cost budget, in tokens of each kind at the agent's prices (a cost
    // budget needs `pricing:`).
    let cost_left = [
        agent.budget.max_cost_usd.map(|l| l - node.cost_usd),
        run.max_cost_usd.map(|l| l - totals.cost_usd),
    ]
    .into_iter()
    .flatten()
    .reduce(f64::min);
    let in_tokens_of = |usd: f64, per_million: f64| -> Option<u64> {
        (per_million > 0.0).then(|| (usd.max(0.0) / per_million * 1_000_000.0).floor() as u64)
    };
    let (cost_output, cost_input) = match (cost_left, &agent.pricing) {
        (Some(usd), Some(p)) => (
            in_tokens_of(usd, p.output_per_million_usd),
            in_tokens_of(usd, p.input_per_million_usd),
        ),
        (Some(usd), None) if usd <= 0.0 => (Some(0), Some(0)),
        _ => (None, None),
    };
    let share = u64::from(share.max(1));
    let output_room = min(&[
        any_tokens,
        left(agent.budget.max_output_tokens, node.output_tokens),
        left(run.max_output_tokens, totals.output_tokens),
        cost_output,
    ])
    .map(|room| room / share);
    let input_room = min(&[
        any_tokens,
        left(agent.budget.max_input_tokens, node.input_tokens),
        left(run.max_input_tokens, totals.input_tokens),
        cost_input,
    ])
    .map(|room| room / share);
    if output_room == Some(0) || input_room == Some(0) {
        return None;
    }
    let per_completion = [
        Some(u64::from(declared.max_tokens)),
        agent.max_output_tokens.map(u64::from),
        output_room,
    ]
    .into_iter()
    .flatten()
    .fold(u64::MAX, u64::min);
    let clamp = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    Some(SamplingGrant {
        model: agent.model.clone(),
        max_requests: declared.max_requests,
        max_tokens: clamp(per_completion),
        max_total_tokens: output_room.map(clamp),
        max_input_tokens: input_room.map(clamp),
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
        // Outside the step that schedules a turn's calls (a retry, an
        // approval, a person's answer), the turn's sampling calls still
        // open hold their share: this one gets no more than its part.
        let share = if self.sampling_share > 1 {
            self.sampling_share
        } else {
            let open = node
                .pending
                .iter()
                .filter(|p| p.result.is_none())
                .filter_map(|p| self.state.tool_calls.get(p.call_id.as_deref()?))
                .filter(|c| {
                    plan.tools
                        .get(&c.tool)
                        .is_some_and(|t| t.def.sampling.is_some())
                })
                .count();
            u32::try_from(open).unwrap_or(u32::MAX).max(1)
        };
        let granted = grant(
            tool,
            &agent.def,
            node,
            &plan.workflow.def.budget,
            &self.state.totals,
            share,
        );
        if let (Some(granted), Value::Object(map)) = (granted, &mut spec)
            && let Ok(value) = serde_json::to_value(granted)
        {
            map.insert("sampling".into(), value);
        }
        spec
    }
}

impl Step {
    /// The spec of `call` of `tool` built again, with a grant from what is
    /// left now and the person's answers so far (`input`, none when null).
    pub(super) fn spec_again(
        &self,
        call: &super::state::ToolCallState,
        tool: &super::plan::Pinned<ToolDef>,
        input: &Value,
    ) -> Result<Value, MachineError> {
        let spec = super::step::tool_spec(
            tool,
            &call.arguments,
            &call.idempotency_key,
            call.variant.as_deref(),
        )?;
        let mut spec = self.with_sampling(spec, &call.node, &tool.def);
        if let Value::Object(map) = &mut spec
            && !input.is_null()
        {
            map.insert("input".into(), input.clone());
        }
        Ok(spec)
    }

    /// Before call `call_id` is tried again: a tool that samples gets its
    /// spec again with a grant from what is left now (its earlier
    /// attempts' completions are charged by then), never the grant of the
    /// first attempt; no room left, no grant (the server is refused).
    pub(super) fn refresh_sampling_grant(&mut self, call_id: &str) -> Result<(), MachineError> {
        let Some(call) = self.state.tool_calls.get(call_id).cloned() else {
            return Ok(());
        };
        let Some(tool) = self
            .state
            .plan
            .as_deref()
            .and_then(|p| p.tools.get(&call.tool))
            .cloned()
        else {
            return Ok(());
        };
        if tool.def.sampling.is_none() {
            return Ok(());
        }
        let spec = self.spec_again(&call, &tool, &call.input)?;
        self.command(super::Command::RekeyTask {
            call_id: call_id.to_owned(),
            idempotency_key: call.idempotency_key.clone(),
            spec,
        });
        Ok(())
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
