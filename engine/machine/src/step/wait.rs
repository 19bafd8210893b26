//! What a run waits for: wait nodes and signals, timers and wall-time
//! deadlines, approvals; and letting go of what is in flight when the
//! run ends early.

use serde_json::{Value, json};

use super::Step;
use super::decision::Verdict;
use crate::command::Command;
use crate::error::MachineError;
use crate::event::{Event, Stop, TimerPurpose, TimerSpec};
use crate::state::{CallStatus, RunStatus, StepKind};
use crate::{normalize, show_ms, state};
use belay_definitions::model::{NodeKind, RepeatSafety, WaitDef, WaitFor};

impl Step {
    /// A wait node: take a signal that came early, or set timers and wait.
    pub(super) fn start_wait(
        &mut self,
        def: &belay_definitions::model::NodeDef,
        wait: &WaitDef,
        doc: &Value,
    ) -> Result<(), MachineError> {
        let id = def.id.clone();
        // Render the times first: a bad one fails the run before anything starts.
        let mut at_times: Vec<Option<String>> = Vec::with_capacity(wait.any.len());
        for (i, entry) in wait.any.iter().enumerate() {
            let WaitFor::Until { at, .. } = entry else {
                at_times.push(None);
                continue;
            };
            let rendered = at
                .render(doc)
                .map_err(|e| e.to_string())
                .and_then(|v| match v {
                    Value::String(s) => chrono::DateTime::parse_from_rfc3339(s.trim())
                        .map(|t| {
                            t.with_timezone(&chrono::Utc)
                                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
                        })
                        .map_err(|e| format!("{s:?} is not an RFC 3339 time ({e})")),
                    other => Err(format!(
                        "must render to an RFC 3339 time string, not {other}"
                    )),
                });
            match rendered {
                Ok(t) => at_times.push(Some(t)),
                Err(e) => {
                    self.fail_run(format!("node `{id}`: `until` of entry {}: {e}", i + 1));
                    return Ok(());
                }
            }
        }
        self.emit(Event::NodeStarted {
            node: id.clone(),
            input: Value::Null,
            deadline: None,
        });
        let signals: Vec<String> = wait
            .any
            .iter()
            .filter_map(|f| match f {
                WaitFor::Signal { name, .. } => Some(name.clone()),
                _ => None,
            })
            .collect();
        if let Some(signal) = self
            .state
            .signals
            .iter()
            .find(|s| signals.contains(&s.name))
            .cloned()
        {
            self.consume_signal(&id, wait, signal, &[]);
            return Ok(());
        }
        let prefix = self.step_prefix(&id);
        let mut timers = Vec::new();
        for (i, entry) in wait.any.iter().enumerate() {
            match entry {
                WaitFor::Duration { ms, .. } => timers.push(TimerSpec {
                    timer_id: format!("{prefix}.w{}", i + 1),
                    after_ms: Some(*ms),
                    at: None,
                    purpose: TimerPurpose::Entry(i),
                }),
                WaitFor::Until { .. } => timers.push(TimerSpec {
                    timer_id: format!("{prefix}.w{}", i + 1),
                    after_ms: None,
                    at: at_times.get(i).cloned().flatten(),
                    purpose: TimerPurpose::Entry(i),
                }),
                WaitFor::Signal { .. } => {}
            }
        }
        if let Some(ms) = wait.timeout_ms {
            timers.push(TimerSpec {
                timer_id: format!("{prefix}.timeout"),
                after_ms: Some(ms),
                at: None,
                purpose: TimerPurpose::Timeout,
            });
        }
        self.emit(Event::WaitStarted {
            node: id,
            signals,
            timers: timers.clone(),
        });
        for t in timers {
            self.command(Command::ScheduleTimer(t));
        }
        Ok(())
    }

    /// A wait node takes `signal`: the node ends, going to the entry's `next`.
    fn consume_signal(
        &mut self,
        node: &str,
        wait: &WaitDef,
        signal: state::BufferedSignal,
        timers: &[TimerSpec],
    ) {
        let next = wait.any.iter().find_map(|f| match f {
            WaitFor::Signal { name, next, .. } if name == &signal.name => Some(next.clone()),
            _ => None,
        });
        self.emit(Event::SignalConsumed {
            node: node.to_owned(),
            signal_id: signal.signal_id.clone(),
        });
        for t in timers {
            self.command(Command::CancelTimer {
                timer_id: t.timer_id.clone(),
            });
        }
        self.emit(Event::NodeCompleted {
            node: node.to_owned(),
            output: json!({
                "signal": signal.name,
                "signal_id": signal.signal_id,
                "payload": signal.payload,
            }),
            next: next.flatten(),
        });
    }

    /// A delivered signal: the current wait takes it if it waits for it.
    pub(crate) fn take_signal(&mut self) -> Result<(), MachineError> {
        let Some(step) = self.state.step.clone() else {
            return Ok(());
        };
        let StepKind::Wait { signals, timers } = &step.kind else {
            return Ok(());
        };
        let Some(signal) = self
            .state
            .signals
            .iter()
            .find(|s| signals.contains(&s.name))
            .cloned()
        else {
            return Ok(());
        };
        let wait = self.wait_def(&step.id)?;
        self.consume_signal(&step.id, &wait, signal, timers);
        Ok(())
    }

    fn wait_def(&self, node: &str) -> Result<WaitDef, MachineError> {
        self.plan()?
            .workflow
            .def
            .nodes
            .iter()
            .find(|n| n.id == node)
            .and_then(|n| match &n.kind {
                NodeKind::Wait(w) => Some(w.clone()),
                _ => None,
            })
            .ok_or_else(|| MachineError::InvalidPlan(format!("node `{node}` is not a wait")))
    }

    /// A signal must be one the workflow waits for, with a payload its
    /// waiting node accepts (the current one's, else the first declaring it).
    pub(crate) fn check_signal(&self, name: &str, payload: &Value) -> Result<(), MachineError> {
        let plan = self.plan()?;
        let mut declared: Vec<(&str, Option<&Value>)> = Vec::new();
        let mut all: Vec<&str> = Vec::new();
        for node in &plan.workflow.def.nodes {
            if let NodeKind::Wait(w) = &node.kind {
                for f in &w.any {
                    if let WaitFor::Signal {
                        name: n,
                        payload_schema,
                        ..
                    } = f
                    {
                        all.push(n);
                        if n == name {
                            declared.push((&node.id, payload_schema.as_ref()));
                        }
                    }
                }
            }
        }
        if declared.is_empty() {
            all.sort_unstable();
            all.dedup();
            return Err(MachineError::InvalidSignal(format!(
                "workflow `{}` has no wait for signal `{name}`; it waits for: {}",
                plan.workflow.def.name,
                if all.is_empty() {
                    "no signals".to_owned()
                } else {
                    all.join(", ")
                }
            )));
        }
        let current = self.state.step.as_ref().map(|s| s.id.as_str());
        let (node, schema) = declared
            .iter()
            .find(|(n, _)| Some(*n) == current)
            .or_else(|| declared.first())
            .copied()
            .unwrap_or(("", None));
        if let Some(schema) = schema
            && let Err(errors) = belay_definitions::validate_json(schema, payload)
        {
            return Err(MachineError::InvalidSignal(format!(
                "the payload of signal `{name}` does not match the `payload_schema` of node `{node}`: {}",
                errors.join("; ")
            )));
        }
        Ok(())
    }

    /// Let go of everything in flight because the run ends now (a cancel,
    /// a wall-time budget): a `reconcile` call dispatched at this moment
    /// may act after all, so it becomes an uncertain outcome the operator
    /// can find (and is notified of); sync child runs and children of
    /// `workflow` tools are cancelled with `child_reason`. The caller ends
    /// the run and cancels the open tasks (`CancelOpenTasks`). `why` starts
    /// the uncertain record's reason ("the run was cancelled").
    pub(crate) fn abandon_in_flight(
        &mut self,
        why: &str,
        child_reason: &str,
    ) -> Result<(), MachineError> {
        let in_flight: Vec<(String, state::ToolCallState)> = self
            .state
            .tool_calls
            .iter()
            .filter(|(_, c)| {
                c.status == CallStatus::Open
                    && c.dispatched_attempt.is_some()
                    && c.repeat_safety == RepeatSafety::Reconcile
                    && c.probe_for.is_none()
            })
            .map(|(id, c)| (id.clone(), c.clone()))
            .collect();
        for (call_id, call) in in_flight {
            let attempt = call.dispatched_attempt.unwrap_or(0);
            let reason = format!(
                "{why} while `{}` call `{call_id}` (attempt {attempt}) was dispatched; it may have acted",
                call.tool
            );
            self.record_uncertain(&call_id, &call, attempt, reason)?;
            self.notify_uncertain(&call_id);
        }
        if let Some(StepKind::Child { child_run_id, .. }) =
            self.state.step.as_ref().map(|s| s.kind.clone())
        {
            self.command(Command::CancelChildRun {
                child_run_id,
                reason: child_reason.to_owned(),
            });
        }
        let children: Vec<String> = self
            .state
            .tool_calls
            .values()
            .filter(|c| c.status == CallStatus::Open)
            .filter_map(|c| c.child_run_id.clone())
            .collect();
        for child_run_id in children {
            self.command(Command::CancelChildRun {
                child_run_id,
                reason: child_reason.to_owned(),
            });
        }
        Ok(())
    }

    /// A wall-time timer fired (`max_wall_time`): if it is the run's, or
    /// the current visit's of the agent node in progress, stop the run with
    /// [`Stop::Deadline`], abandoning what is in flight as a cancel does.
    /// `Ok(false)`: not a live deadline timer (another timer, or stale).
    fn on_deadline(&mut self, timer_id: &str, overdue_ms: u64) -> Result<bool, MachineError> {
        let node_timer = self
            .state
            .node
            .as_ref()
            .and_then(|n| n.deadline.as_ref().map(|t| (n.id.clone(), t.clone())))
            .filter(|(_, t)| t.timer_id == timer_id);
        let run_timer = self
            .state
            .deadline
            .clone()
            .filter(|t| t.timer_id == timer_id);
        let (scope, node, timer) = match (node_timer, run_timer) {
            (Some((node, t)), _) => ("node", node, t),
            (None, Some(t)) => {
                let node = self
                    .state
                    .node
                    .as_ref()
                    .map(|n| n.id.clone())
                    .or_else(|| self.state.step.as_ref().map(|s| s.id.clone()))
                    .unwrap_or_default();
                ("run", node, t)
            }
            (None, None) => return Ok(false),
        };
        let limit_ms = timer.after_ms.unwrap_or(0);
        let elapsed_ms = limit_ms.saturating_add(overdue_ms);
        self.emit(Event::TimerFired {
            node: node.clone(),
            timer_id: timer_id.to_owned(),
        });
        self.command(Command::CancelTimer {
            timer_id: timer_id.to_owned(),
        });
        let whose = if scope == "node" {
            let agent = self
                .state
                .node
                .as_ref()
                .map(|n| n.agent.clone())
                .unwrap_or_default();
            format!("agent `{agent}` in node `{node}`")
        } else if node.is_empty() {
            "the run".to_owned()
        } else {
            format!("the run (in node `{node}`)")
        };
        let error = format!(
            "{whose} used its `wall_time` budget ({} of {})",
            show_ms(elapsed_ms),
            show_ms(limit_ms)
        );
        self.abandon_in_flight(
            &format!("the {scope}'s wall-time budget ran out"),
            &format!("its parent run stopped: {error}"),
        )?;
        self.fail_run_stop(
            error,
            Stop::Deadline {
                scope: scope.to_owned(),
                node,
                limit_ms,
                elapsed_ms,
            },
        );
        Ok(true)
    }

    /// A timer is due: it stops the run or node at its wall-time budget,
    /// ends its wait or approval, or is stale.
    pub(crate) fn on_timer(&mut self, timer_id: &str, overdue_ms: u64) -> Result<(), MachineError> {
        let stale = |m: &mut Step| {
            m.command(Command::CancelTimer {
                timer_id: timer_id.to_owned(),
            });
        };
        if self.state.status.is_terminal() || self.state.status == RunStatus::New {
            stale(self);
            return Ok(());
        }
        if self.on_deadline(timer_id, overdue_ms)? {
            return Ok(());
        }
        // A call's own timer: a sync child's timeout or a callback's.
        if let Some((call_id, call, timer)) = self.state.tool_calls.iter().find_map(|(id, c)| {
            let timer = [&c.child_timer, &c.callback_timer]
                .into_iter()
                .flatten()
                .find(|t| t.timer_id == timer_id)?;
            (c.status == CallStatus::Open).then(|| (id.clone(), c.clone(), timer.clone()))
        }) {
            let after = timer.after_ms.map(show_ms).unwrap_or_default();
            self.emit(Event::TimerFired {
                node: call.node.clone(),
                timer_id: timer_id.to_owned(),
            });
            self.command(Command::CancelTimer {
                timer_id: timer_id.to_owned(),
            });
            let (attempt, error) = match &call.child_run_id {
                Some(child) => {
                    self.command(Command::CancelChildRun {
                        child_run_id: child.clone(),
                        reason: format!("its parent gave up waiting after {after}"),
                    });
                    (
                        0,
                        format!("child run {child} did not finish within {after}"),
                    )
                }
                None => (
                    call.dispatched_attempt.unwrap_or(0),
                    format!(
                        "the tool server accepted the request but did not call back within {after}"
                    ),
                ),
            };
            self.emit(Event::ToolCallFailed {
                call_id,
                attempt,
                error,
                kind: None,
            });
            return Ok(());
        }
        let Some(step) = self.state.step.clone() else {
            stale(self);
            return Ok(());
        };
        let plan = self.plan_handle()?;
        let def = plan
            .workflow
            .def
            .nodes
            .iter()
            .find(|n| n.id == step.id)
            .cloned()
            .ok_or_else(|| MachineError::InvalidPlan(format!("no node `{}`", step.id)))?;
        match (&step.kind, &def.kind) {
            (StepKind::Wait { timers, .. }, NodeKind::Wait(wait)) => {
                let Some(timer) = timers.iter().find(|t| t.timer_id == timer_id).cloned() else {
                    stale(self);
                    return Ok(());
                };
                self.emit(Event::TimerFired {
                    node: step.id.clone(),
                    timer_id: timer_id.to_owned(),
                });
                for t in timers {
                    self.command(Command::CancelTimer {
                        timer_id: t.timer_id.clone(),
                    });
                }
                match timer.purpose {
                    TimerPurpose::Timeout => {
                        let after = wait.timeout_ms.map(show_ms).unwrap_or_default();
                        match &wait.on_timeout {
                            Some(next) => self.emit(Event::NodeCompleted {
                                node: step.id.clone(),
                                output: json!({"timed_out": true}),
                                next: Some(next.clone()),
                            }),
                            None => self.fail_run(format!(
                                "node `{}` timed out after {after} with nothing it waited for",
                                step.id
                            )),
                        }
                    }
                    // Never among a wait's timers (see `on_deadline`).
                    TimerPurpose::Deadline => {}
                    TimerPurpose::Entry(i) => {
                        let next = wait.any.get(i).and_then(|f| match f {
                            WaitFor::Duration { next, .. } | WaitFor::Until { next, .. } => {
                                next.clone()
                            }
                            WaitFor::Signal { .. } => None,
                        });
                        self.emit(Event::NodeCompleted {
                            node: step.id.clone(),
                            output: json!({"timer": timer_id}),
                            next,
                        });
                    }
                }
            }
            (StepKind::Approval { timer: Some(t), .. }, NodeKind::Approval(approval))
                if t.timer_id == timer_id =>
            {
                self.emit(Event::TimerFired {
                    node: step.id.clone(),
                    timer_id: timer_id.to_owned(),
                });
                self.command(Command::CancelTimer {
                    timer_id: timer_id.to_owned(),
                });
                let after = approval.timeout_ms.map(show_ms).unwrap_or_default();
                match &approval.on_timeout {
                    Some(next) => self.emit(Event::NodeCompleted {
                        node: step.id.clone(),
                        output: json!({"approved": false, "timed_out": true}),
                        next: Some(next.clone()),
                    }),
                    None => {
                        self.fail_run(format!("node `{}`: no decision within {after}", step.id))
                    }
                }
            }
            (
                StepKind::Child {
                    child_run_id,
                    timer: Some(t),
                },
                NodeKind::Workflow {
                    timeout_ms,
                    on_timeout,
                    ..
                },
            ) if t.timer_id == timer_id => {
                self.emit(Event::TimerFired {
                    node: step.id.clone(),
                    timer_id: timer_id.to_owned(),
                });
                self.command(Command::CancelTimer {
                    timer_id: timer_id.to_owned(),
                });
                let after = timeout_ms.map(show_ms).unwrap_or_default();
                self.command(Command::CancelChildRun {
                    child_run_id: child_run_id.clone(),
                    reason: format!("its parent gave up waiting after {after}"),
                });
                match on_timeout {
                    Some(next) => self.emit(Event::NodeCompleted {
                        node: step.id.clone(),
                        output: json!({"timed_out": true, "run_id": child_run_id}),
                        next: Some(next.clone()),
                    }),
                    None => self.fail_run(format!(
                        "node `{}`: child run {child_run_id} did not finish within {after}",
                        step.id
                    )),
                }
            }
            _ => stale(self),
        }
        Ok(())
    }

    /// A person's decision on request `request_id` of the approval node
    /// `node` (resolved by `decision.rs`: the request is the node's and
    /// not yet decided). `verdict` is checked against the node: the
    /// approver's grant, edits only where allowed and valid.
    pub(crate) fn on_decision(
        &mut self,
        node: String,
        request_id: String,
        verdict: Verdict,
    ) -> Result<(), MachineError> {
        let Verdict {
            approve,
            edited_subject,
            by,
            grants,
            reason,
        } = verdict;
        let waiting = self
            .state
            .step
            .as_ref()
            .filter(|s| s.id == node)
            .and_then(|s| match &s.kind {
                StepKind::Approval {
                    subject,
                    approver_grant,
                    allow_edits,
                    timer,
                    request_id: open,
                } if *open == request_id => Some((
                    subject.clone(),
                    approver_grant.clone(),
                    *allow_edits,
                    timer.clone(),
                )),
                _ => None,
            });
        let Some((subject, approver_grant, allow_edits, timer)) = waiting else {
            if self.state.status.is_terminal() || self.state.status == RunStatus::New {
                return Err(self.wrong_status(&format!("decide node `{node}`")));
            }
            return Err(MachineError::NotWaiting(format!(
                "request `{request_id}` of node `{node}` is not waiting for a decision"
            )));
        };
        if !grants.contains(&approver_grant) {
            return Err(MachineError::NotAllowed(format!(
                "deciding node `{node}` needs permission `{approver_grant}`, which {by} does not hold"
            )));
        }
        let approval = self
            .plan()?
            .workflow
            .def
            .nodes
            .iter()
            .find(|n| n.id == node)
            .and_then(|n| match &n.kind {
                NodeKind::Approval(a) => Some(a.clone()),
                _ => None,
            })
            .ok_or_else(|| {
                MachineError::InvalidPlan(format!("node `{node}` is not an approval"))
            })?;
        let (final_subject, edited) = match edited_subject {
            None => (subject, false),
            Some(_) if !approve => {
                return Err(MachineError::NotAllowed(
                    "edits come with an approval, not with a decline".into(),
                ));
            }
            Some(_) if !allow_edits => {
                return Err(MachineError::NotAllowed(format!(
                    "node `{node}` does not allow edits (`allow_edits: true`); approve or decline the subject as it is"
                )));
            }
            Some(edit) => {
                let edit = normalize::strip_nul_value(edit);
                if let Some(schema) = &approval.edits_schema
                    && let Err(errors) = belay_definitions::validate_json(schema, &edit)
                {
                    return Err(MachineError::InvalidEdit { node, errors });
                }
                let edited = edit != subject;
                (edit, edited)
            }
        };
        self.emit(Event::ApprovalDecided {
            node: node.clone(),
            request_id,
            approved: approve,
            by: by.clone(),
            reason: reason.clone(),
            subject: final_subject.clone(),
            edited,
        });
        if let Some(t) = timer {
            self.command(Command::CancelTimer {
                timer_id: t.timer_id,
            });
        }
        let output = json!({"approved": approve, "by": by, "reason": reason, "subject": final_subject, "edited": edited});
        if approve {
            self.emit(Event::NodeCompleted {
                node,
                output,
                next: None,
            });
        } else {
            match approval.on_decline {
                Some(next) => self.emit(Event::NodeCompleted {
                    node,
                    output,
                    next: Some(next),
                }),
                None => self.fail_run(format!("node `{node}` was declined by {by}: {reason}")),
            }
        }
        Ok(())
    }
}
