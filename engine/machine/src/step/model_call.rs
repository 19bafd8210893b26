//! A model's answer: recorded, then each proposed call checked in turn;
//! and `on_tool_failure: stop`.

use belay_proto::wire::{ModelCallResult, ToolUse};

use super::Step;
use crate::command::{Command, TaskEnd};
use crate::error::MachineError;
use crate::event::{Event, Stop};
use crate::normalize;
use crate::state::RunStatus;
use belay_definitions::model::{AgentDef, LoopPolicy, OnToolFailure};

impl Step {
    /// The model answered: record it, then check each proposed call in order.
    pub(crate) fn on_model_result(
        &mut self,
        call_id: String,
        attempt: u32,
        result: ModelCallResult,
    ) -> Result<(), MachineError> {
        let step = self.state.node.as_ref().map(|n| n.model_steps).unwrap_or(0);
        // Tool-use ids must be unique within the turn so each gets exactly one result.
        let mut seen = std::collections::BTreeSet::new();
        let tool_calls: Vec<ToolUse> = result
            .tool_calls
            .into_iter()
            .enumerate()
            .map(|(i, tu)| {
                let id = normalize::strip_nul(&tu.id);
                let id = if id.is_empty() || seen.contains(&id) {
                    format!("belay_{step}_{i}")
                } else {
                    id
                };
                seen.insert(id.clone());
                ToolUse {
                    id,
                    name: normalize::strip_nul(&tu.name),
                    arguments: normalize::strip_nul(&tu.arguments),
                }
            })
            .collect();
        let finish_reason = result.finish_reason.map(|r| normalize::strip_nul(&r));
        // Cut off by the output token limit: so the provider says, or the
        // answer used the whole limit the agent sets (some providers say
        // `tool_calls` of a turn whose last call was cut off).
        let limit = self.current_agent_def().and_then(|a| a.max_output_tokens);
        let cut_off = finish_reason.as_deref() == Some("length")
            || (!tool_calls.is_empty()
                && limit.is_some_and(|l| result.usage.output_tokens >= u64::from(l)));
        self.emit(Event::ModelCallCompleted {
            call_id: call_id.clone(),
            attempt,
            content: result.content.map(|c| normalize::strip_nul(&c)),
            tool_calls: tool_calls.clone(),
            usage: result.usage,
            finish_reason,
        });
        self.command(Command::EndTask {
            call_id,
            end: TaskEnd::Completed,
        });
        let one_call = self
            .current_agent_def()
            .is_some_and(|a| a.loop_policy == LoopPolicy::ExactlyOneCall);
        // The calls of this turn whose tools may sample split what is left
        // of the budgets.
        self.sampling_share = self.state.plan.as_deref().map_or(1, |plan| {
            let n = tool_calls
                .iter()
                .filter(|t| {
                    plan.tools
                        .get(&t.name)
                        .is_some_and(|t| t.def.sampling.is_some())
                })
                .count();
            u32::try_from(n).unwrap_or(u32::MAX).max(1)
        });
        let mut stop = None;
        for tool_use in tool_calls {
            if cut_off {
                // The arguments of a cut-off turn may be cut off too: nothing
                // of it runs.
                self.refuse(
                    &tool_use,
                    "truncated",
                    "the turn was cut off by the output token limit (it used the whole limit, or finish_reason `length`), so its tool calls are not executed; propose them again in a shorter answer".into(),
                );
            } else if one_call {
                self.refuse(
                    &tool_use,
                    "loop_policy",
                    "this agent makes exactly one model call (`exactly_one_call`); a tool call would need a second one".into(),
                );
                if stop.is_none() {
                    stop = Some(tool_use.name.clone());
                }
            } else if self.state.status == RunStatus::Running
                || self.state.status == RunStatus::Waiting
            {
                self.check_and_schedule(tool_use)?;
            }
        }
        if let (Some(tool), Some(node)) = (stop, self.state.node.as_ref().map(|n| n.id.clone())) {
            self.fail_run_stop(
                format!(
                    "node `{node}` runs its agent with `exactly_one_call`, and the model proposed tool `{tool}`, which would need a second model call"
                ),
                Stop::LoopPolicy { node, tool },
            );
        }
        Ok(())
    }

    /// The agent of the running agent node, if any.
    fn current_agent_def(&self) -> Option<&AgentDef> {
        let node = self.state.node.as_ref()?;
        Some(&self.state.plan.as_ref()?.agents.get(&node.agent)?.def)
    }

    /// `on_tool_failure: stop`: a call of the running agent that failed for
    /// good in this decision stops the run (a declined confirmation is the
    /// person's answer, not a failure: the model hears it).
    pub(crate) fn stop_on_tool_failure(&mut self) -> Result<(), MachineError> {
        if self.state.status.is_terminal() {
            return Ok(());
        }
        let Some(node) = self.state.node.as_ref() else {
            return Ok(());
        };
        if self
            .current_agent_def()
            .is_none_or(|a| a.on_tool_failure != OnToolFailure::Stop)
        {
            return Ok(());
        }
        let failed = self.out.events.iter().find_map(|e| match e {
            Event::ToolCallFailed { call_id, .. } => {
                let call = self.state.tool_calls.get(call_id)?;
                let declined = call.confirmed.as_ref().is_some_and(|(_, ok, _)| !ok);
                (call.node == node.id && !declined && call.probe_for.is_none())
                    .then(|| (call_id.clone(), call.tool.clone()))
            }
            _ => None,
        });
        if let Some((call_id, tool)) = failed {
            let node = node.id.clone();
            self.fail_run_stop(
                format!(
                    "tool `{tool}` (call `{call_id}`) failed, and the agent of node `{node}` stops on a tool failure (`on_tool_failure: stop`)"
                ),
                Stop::ToolFailed {
                    node,
                    call_id,
                    tool,
                },
            );
        }
        Ok(())
    }
}
