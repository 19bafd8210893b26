//! Child runs: started for a `workflow` node or a call of a
//! `type: workflow` tool, and what their end does to the parent.

use serde_json::{Value, json};

use super::Step;
use crate::child_run_id;
use crate::command::Command;
use crate::error::MachineError;
use crate::event::{Event, TimerPurpose, TimerSpec};
use crate::state::{CallStatus, RunStatus, StepKind};
use belay_definitions::model::{ChildMode, NodeKind, ToolBindingDef};

impl Step {
    /// Start a child run for `call_id` (a `workflow` node's `<node>.c1`, or a
    /// `type: workflow` tool's call): the event, the outbox command and, for
    /// a sync child with a timeout, its timer `timer_id`. Returns the child's
    /// id and whether the caller waits for it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn start_child(
        &mut self,
        node: &str,
        call_id: &str,
        workflow: &str,
        input: Value,
        mode: ChildMode,
        timeout_ms: Option<u64>,
        timer_id: String,
    ) -> (String, bool) {
        let child_run_id = child_run_id(&self.state.run_id, call_id);
        let sync = mode == ChildMode::Sync;
        let timer = timeout_ms.filter(|_| sync).map(|ms| TimerSpec {
            timer_id,
            after_ms: Some(ms),
            at: None,
            purpose: TimerPurpose::Timeout,
        });
        self.emit(Event::ChildRunStarted {
            node: node.to_owned(),
            call_id: call_id.to_owned(),
            child_run_id: child_run_id.clone(),
            workflow: workflow.to_owned(),
            input: input.clone(),
            mode,
            timer: timer.clone(),
        });
        self.command(Command::StartChildRun {
            call_id: call_id.to_owned(),
            child_run_id: child_run_id.clone(),
            workflow: workflow.to_owned(),
            input,
            sync,
        });
        if let Some(timer) = timer {
            self.command(Command::ScheduleTimer(timer));
        }
        (child_run_id, sync)
    }

    /// A call of a `type: workflow` tool: start its child run (no task);
    /// `sync` leaves the call open until the child ends, `async` completes
    /// it at once with `{"run_id"}`.
    pub(super) fn start_tool_child(
        &mut self,
        node: &str,
        call_id: &str,
        binding: &ToolBindingDef,
        arguments: &Value,
    ) {
        let ToolBindingDef::Workflow {
            workflow,
            mode,
            timeout_ms,
            param_mapping,
        } = binding
        else {
            return;
        };
        let input = if param_mapping.is_empty() {
            arguments.clone()
        } else {
            Value::Object(
                param_mapping
                    .iter()
                    .map(|(key, param)| {
                        (
                            key.clone(),
                            arguments.get(param).cloned().unwrap_or(Value::Null),
                        )
                    })
                    .collect(),
            )
        };
        let (child_run_id, sync) = self.start_child(
            node,
            call_id,
            workflow,
            input,
            *mode,
            *timeout_ms,
            format!("{call_id}.timeout"),
        );
        if !sync {
            self.emit(Event::ToolCallCompleted {
                call_id: call_id.to_owned(),
                attempt: 0,
                result: json!({"run_id": child_run_id}),
                cached: None,
                ends_node: false,
            });
        }
    }

    /// A child run ended: a sync workflow node waiting for it goes on.
    pub(crate) fn on_child_finished(
        &mut self,
        child_run_id: String,
        status: String,
        output: Option<Value>,
        error: Option<String>,
    ) -> Result<(), MachineError> {
        if self.state.status.is_terminal() || self.state.status == RunStatus::New {
            return Ok(()); // nothing waits for it any more
        }
        // A sync call of a `type: workflow` tool waiting for this child.
        if let Some((call_id, call)) = self
            .state
            .tool_calls
            .iter()
            .find(|(_, c)| {
                c.status == CallStatus::Open && c.child_run_id.as_deref() == Some(&child_run_id)
            })
            .map(|(id, c)| (id.clone(), c.clone()))
        {
            self.emit(Event::ChildRunFinished {
                node: call.node.clone(),
                child_run_id: child_run_id.clone(),
                status: status.clone(),
                output: output.clone(),
                error: error.clone(),
            });
            if let Some(t) = &call.child_timer {
                self.command(Command::CancelTimer {
                    timer_id: t.timer_id.clone(),
                });
            }
            if status == "completed" {
                self.emit(Event::ToolCallCompleted {
                    call_id,
                    attempt: 0,
                    result: output.unwrap_or(Value::Null),
                    cached: None,
                    ends_node: false,
                });
            } else {
                self.emit(Event::ToolCallFailed {
                    call_id,
                    attempt: 0,
                    error: format!(
                        "child run {child_run_id} {status}: {}",
                        error.unwrap_or_else(|| status.clone())
                    ),
                    kind: None,
                });
            }
            return Ok(());
        }
        let Some(step) = self.state.step.clone() else {
            return Ok(());
        };
        let StepKind::Child {
            child_run_id: waited,
            timer,
        } = &step.kind
        else {
            return Ok(());
        };
        if waited != &child_run_id {
            return Ok(()); // an earlier child (timed out), or an async one
        }
        let on_error = self
            .plan()?
            .workflow
            .def
            .nodes
            .iter()
            .find(|n| n.id == step.id)
            .and_then(|n| match &n.kind {
                NodeKind::Workflow { on_error, .. } => on_error.clone(),
                _ => None,
            });
        self.emit(Event::ChildRunFinished {
            node: step.id.clone(),
            child_run_id: child_run_id.clone(),
            status: status.clone(),
            output: output.clone(),
            error: error.clone(),
        });
        if let Some(t) = timer {
            self.command(Command::CancelTimer {
                timer_id: t.timer_id.clone(),
            });
        }
        if status == "completed" {
            self.emit(Event::NodeCompleted {
                node: step.id.clone(),
                output: output.unwrap_or(Value::Null),
                next: None,
            });
        } else {
            let why = error.unwrap_or_else(|| status.clone());
            match on_error {
                Some(next) => self.emit(Event::NodeCompleted {
                    node: step.id.clone(),
                    output: json!({"status": status, "error": why, "run_id": child_run_id}),
                    next: Some(next),
                }),
                None => self.fail_run(format!(
                    "node `{}`: child run {child_run_id} {status}: {why}",
                    step.id
                )),
            }
        }
        Ok(())
    }
}
