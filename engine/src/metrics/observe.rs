//! What a committed decision did, as metrics: [`observe`] reads the run's
//! state before the decision, the task row of the transition and the
//! decision's events (inside the transition, where the state is at hand)
//! into an [`Observed`], which the coordinator records once the
//! transaction committed (a refused or failed transition records nothing).

use std::collections::BTreeMap;

use super::{
    EngineMetrics, LEASES_EXPIRED, MODEL_TOKENS, RUNS_ENDED, RUNS_STARTED, STEP_DURATION, STEPS,
    TOOL_CALLS,
};
use crate::machine::{Event, RunState};
use crate::store::TaskRow;

/// The figures of one decision, owned (no borrow of the state).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observed {
    /// `(tenant, workflow)` of runs this decision started.
    runs_started: Vec<(String, String)>,
    /// The final status the run reached, with its tenant and workflow.
    run_ended: Option<(String, String, &'static str)>,
    /// `(kind, outcome)` per call whose attempt reported.
    steps: Vec<(&'static str, &'static str)>,
    /// `(kind, seconds)`: the transition's task, ready to recorded.
    step_duration: Option<(&'static str, f64)>,
    /// Kinds of leases that expired.
    leases_expired: Vec<&'static str>,
    /// `(provider, model, input tokens, output tokens, cost USD)`.
    tokens: Vec<(String, String, u64, u64, f64)>,
    /// `(tool, outcome)` of tool calls that ended or were refused.
    tool_calls: Vec<(String, &'static str)>,
}

/// The `kind` label of a task kind: `model_call`, `tool_call`, else `other`
/// (bounded whatever the database holds).
pub(crate) fn kind_label(kind: &str) -> &'static str {
    match kind {
        "model_call" => "model_call",
        "tool_call" => "tool_call",
        _ => "other",
    }
}

/// The `provider` label of what a worker reported: `openai`, `anthropic`,
/// `unknown` when it said nothing, `other` for anything else.
pub(crate) fn provider_label(provider: Option<&str>) -> &'static str {
    match provider {
        Some("openai") => "openai",
        Some("anthropic") => "anthropic",
        None => "unknown",
        Some(_) => "other",
    }
}

/// How strong an outcome is when one decision tells several of a call
/// (an attempt failed, then the call failed for good or became uncertain):
/// the strongest is counted, once.
fn rank(outcome: &str) -> u8 {
    match outcome {
        "succeeded" => 1,
        "retried" => 2,
        "lease_expired" => 3,
        "failed" => 4,
        _ => 5,
    }
}

/// The figures of `events`, decided on `state` (before them) in a
/// transition of `task` (if any); `provider` is what the worker reported
/// with a model call's result.
pub fn observe(
    state: &RunState,
    task: Option<&TaskRow>,
    events: &[Event],
    provider: Option<&str>,
) -> Observed {
    let mut out = Observed::default();
    // Tools of calls this decision schedules (a cached result comes in the
    // same decision as its scheduling).
    let mut scheduled: BTreeMap<&str, &str> = BTreeMap::new();
    let mut outcomes: BTreeMap<&str, &'static str> = BTreeMap::new();
    for event in events {
        match event {
            Event::RunStarted { tenant, plan, .. } => out
                .runs_started
                .push((tenant.clone(), plan.workflow.def.name.clone())),
            Event::RunCompleted { .. } => out.run_ended = Some(ended(state, events, "completed")),
            Event::RunFailed { .. } => out.run_ended = Some(ended(state, events, "failed")),
            Event::RunCancelled { .. } => out.run_ended = Some(ended(state, events, "cancelled")),
            Event::ToolCallScheduled { call_id, tool, .. } => {
                scheduled.insert(call_id, tool);
            }
            Event::ModelCallCompleted { call_id, usage, .. } => {
                set_outcome(&mut outcomes, call_id, "succeeded");
                out.tokens.push(model_tokens(state, provider, usage));
            }
            Event::ModelCallAttemptFailed {
                call_id,
                will_retry,
                ..
            }
            | Event::ToolCallAttemptFailed {
                call_id,
                will_retry,
                ..
            } => set_outcome(
                &mut outcomes,
                call_id,
                if *will_retry { "retried" } else { "failed" },
            ),
            Event::ToolCallCompleted {
                call_id,
                attempt,
                cached,
                ..
            } => {
                let tool = tool_of(state, &scheduled, call_id);
                if cached.is_some() {
                    out.tool_calls.push((tool, "cached"));
                } else {
                    out.tool_calls.push((tool, "succeeded"));
                    if *attempt > 0 {
                        set_outcome(&mut outcomes, call_id, "succeeded");
                    }
                }
            }
            Event::ToolCallFailed { call_id, .. } => {
                out.tool_calls
                    .push((tool_of(state, &scheduled, call_id), "failed"));
                set_outcome(&mut outcomes, call_id, "failed");
            }
            Event::UncertainOutcomeRecorded { call_id, .. } => {
                out.tool_calls
                    .push((tool_of(state, &scheduled, call_id), "uncertain"));
                set_outcome(&mut outcomes, call_id, "uncertain");
            }
            Event::TaskLeaseExpired { call_id, .. } => {
                out.leases_expired.push(call_kind(state, call_id));
                set_outcome(&mut outcomes, call_id, "lease_expired");
            }
            Event::ToolCallRefused { tool, .. } => {
                let known = state
                    .plan
                    .as_ref()
                    .is_some_and(|p| p.tools.contains_key(tool));
                let tool = if known {
                    tool.clone()
                } else {
                    "unknown".into()
                };
                out.tool_calls.push((tool, "refused"));
            }
            _ => {}
        }
    }
    if let Some(task) = task
        && outcomes.contains_key(task.call_id.as_str())
        && let (Some(now), Some(ready)) = (state.now, task.available_at)
    {
        let secs = (now - ready).num_milliseconds().max(0) as f64 / 1000.0;
        out.step_duration = Some((kind_label(&task.kind), secs));
    }
    out.steps = outcomes
        .into_iter()
        .map(|(call, outcome)| (call_kind(state, call), outcome))
        .collect();
    out
}

/// Keeps the strongest outcome of `call` ([`rank`]).
fn set_outcome<'a>(
    outcomes: &mut BTreeMap<&'a str, &'static str>,
    call: &'a str,
    outcome: &'static str,
) {
    let slot = outcomes.entry(call).or_insert(outcome);
    if rank(outcome) > rank(slot) {
        *slot = outcome;
    }
}

/// `(tenant, workflow, status)` of a run that ended: from the state, or,
/// for a run that starts and ends in one decision, its `RunStarted`.
fn ended(
    state: &RunState,
    events: &[Event],
    status: &'static str,
) -> (String, String, &'static str) {
    if let Some(plan) = &state.plan {
        return (state.tenant.clone(), plan.workflow.def.name.clone(), status);
    }
    events
        .iter()
        .find_map(|e| match e {
            Event::RunStarted { tenant, plan, .. } => {
                Some((tenant.clone(), plan.workflow.def.name.clone(), status))
            }
            _ => None,
        })
        .unwrap_or_else(|| (state.tenant.clone(), String::new(), status))
}

/// The kind of a call: a tool call when the run (or this decision) has it
/// as one, else a model call.
fn call_kind(state: &RunState, call: &str) -> &'static str {
    if state.tool_calls.contains_key(call) {
        "tool_call"
    } else {
        "model_call"
    }
}

/// The tool of `call`: from the run's calls, or a call this decision
/// scheduled; `unknown` otherwise.
fn tool_of(state: &RunState, scheduled: &BTreeMap<&str, &str>, call: &str) -> String {
    state
        .tool_calls
        .get(call)
        .map(|c| c.tool.clone())
        .or_else(|| scheduled.get(call).map(|t| (*t).to_owned()))
        .unwrap_or_else(|| "unknown".into())
}

/// `(provider, model, input, output, cost)` of a model call's usage, with
/// the running agent's model and `pricing:` (as the fold charges it).
fn model_tokens(
    state: &RunState,
    provider: Option<&str>,
    usage: &belay_proto::wire::Usage,
) -> (String, String, u64, u64, f64) {
    let agent = state.current_agent();
    let model = agent
        .map(|a| a.model.clone())
        .unwrap_or_else(|| "unknown".into());
    let cost = agent
        .and_then(|a| a.pricing.as_ref())
        .map(|p| p.cost_usd(usage.input_tokens, usage.output_tokens))
        .unwrap_or(0.0);
    (
        provider_label(provider).to_owned(),
        model,
        usage.input_tokens,
        usage.output_tokens,
        cost,
    )
}

impl Observed {
    /// Whether nothing is to be recorded.
    pub fn is_empty(&self) -> bool {
        *self == Observed::default()
    }

    /// Adds these figures to `m`.
    pub(crate) fn record(&self, m: &EngineMetrics) {
        for (tenant, workflow) in &self.runs_started {
            m.counter(RUNS_STARTED, &[("tenant", tenant), ("workflow", workflow)])
                .increment(1);
        }
        if let Some((tenant, workflow, status)) = &self.run_ended {
            m.counter(
                RUNS_ENDED,
                &[
                    ("tenant", tenant),
                    ("workflow", workflow),
                    ("status", status),
                ],
            )
            .increment(1);
        }
        for (kind, outcome) in &self.steps {
            m.counter(STEPS, &[("kind", kind), ("outcome", outcome)])
                .increment(1);
        }
        if let Some((kind, secs)) = self.step_duration {
            m.histogram(STEP_DURATION, &[("kind", kind)]).record(secs);
        }
        for kind in &self.leases_expired {
            m.counter(LEASES_EXPIRED, &[("kind", kind)]).increment(1);
        }
        for (provider, model, input, output, cost) in &self.tokens {
            let labels = |d| {
                [
                    ("provider", provider.as_str()),
                    ("model", model.as_str()),
                    ("direction", d),
                ]
            };
            m.counter(MODEL_TOKENS, &labels("input")).increment(*input);
            m.counter(MODEL_TOKENS, &labels("output"))
                .increment(*output);
            m.add_cost(provider, model, *cost);
        }
        for (tool, outcome) in &self.tool_calls {
            m.counter(TOOL_CALLS, &[("tool", tool), ("outcome", outcome)])
                .increment(1);
        }
    }
}
