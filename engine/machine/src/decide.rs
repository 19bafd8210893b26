//! [`decide`]: one match arm per [`Input`], then the follow-up work that
//! any input may open (`Step::advance`), on a working copy of the state
//! ([`Step`]).

use crate::command::{Command, Decision};
use crate::error::MachineError;
use crate::event::{Event, FailureClass, ResolvedVia, TimerPurpose, TimerSpec};
use crate::input::{Input, Resolution};
use crate::state::{RunState, RunStatus};
use crate::step::Verdict;
use crate::{
    RUN_DEADLINE_TIMER, gates, mcp_report, sampling, state,
    step::{Failure, Step},
};

/// A report wrapped with what came beside it: sampling usage
/// (`sampling::decide_sampled`), what an MCP call adds
/// (`mcp_report::decide_reported`).
fn decide_wrapped(state: &RunState, input: Input) -> Result<Decision, MachineError> {
    match input {
        Input::ToolCallSampled { usage, report } => sampling::decide_sampled(state, usage, *report),
        Input::McpReported {
            definition_hash,
            kind,
            report,
        } => mcp_report::decide_reported(state, definition_hash, kind, *report),
        _ => Err(MachineError::InvalidPlan(
            "only sampling usage and MCP reports wrap a report".into(),
        )),
    }
}

/// Decide what happens for `input` given the run's `state`.
pub fn decide(state: &RunState, input: Input) -> Result<Decision, MachineError> {
    let mut m = Step {
        state: state.clone(),
        out: Decision::default(),
        late_attempt: None,
        arg_secrets: Vec::new(),
        sampling_share: 1,
    };
    match input {
        Input::Start {
            run_id,
            tenant,
            caller,
            caller_grants,
            tenant_grants,
            input,
            plan,
            trace,
        } => {
            if m.state.status != RunStatus::New {
                return Err(m.wrong_status("start"));
            }
            // The run's wall-time budget: a durable timer from now.
            let deadline = plan
                .workflow
                .def
                .budget
                .max_wall_time_ms
                .map(|ms| TimerSpec {
                    timer_id: RUN_DEADLINE_TIMER.to_owned(),
                    after_ms: Some(ms),
                    at: None,
                    purpose: TimerPurpose::Deadline,
                });
            m.emit(Event::RunStarted {
                run_id,
                tenant,
                caller,
                caller_grants,
                tenant_grants,
                input,
                plan,
                deadline: deadline.clone(),
                trace,
            });
            if let Some(timer) = deadline {
                m.command(Command::ScheduleTimer(timer));
            }
        }
        Input::ModelCallCompleted {
            call_id,
            attempt,
            result,
        } => {
            m.require_active("model result")?;
            m.require_open_model_call(&call_id)?;
            m.on_model_result(call_id, attempt, result)?;
        }
        Input::ModelCallCompletedUntraced {
            call_id,
            attempt,
            result,
            secrets,
        } => {
            m.require_active("model result")?;
            m.require_open_model_call(&call_id)?;
            m.arg_secrets = secrets;
            m.on_model_result(call_id, attempt, result)?;
        }
        Input::DispatchToolCall {
            call_id,
            attempt,
            worker_id,
            callback_token_sha256,
            tenant_grants,
        } => {
            m.on_dispatch(
                call_id,
                attempt,
                worker_id,
                callback_token_sha256,
                tenant_grants,
            )?;
        }
        Input::DispatchGated {
            call_id,
            attempt,
            worker_id,
            verdict,
        } => {
            m.on_dispatch_gated(call_id, attempt, worker_id, verdict)?;
        }
        Input::ToolCacheHit {
            call_id,
            entry,
            tenant_grants,
        } => {
            m.on_cache_hit(call_id, entry, &tenant_grants)?;
        }
        Input::Callback {
            token_sha256,
            payload,
        } => {
            m.on_callback(&token_sha256, payload)?;
        }
        Input::FailWaitingCall {
            call_id,
            by,
            reason,
        } => {
            m.require_active("failing a call")?;
            let call = m.require_open_tool_call(&call_id)?.clone();
            if !call.waits_outside() {
                return Err(MachineError::CallNotOpen {
                    call_id,
                    detail: "it does not wait for a callback, a child run, a confirmation or a person's input (only such calls can be failed by an operator; a call with a task ends with its task)".into(),
                });
            }
            for timer in [&call.child_timer, &call.callback_timer]
                .into_iter()
                .flatten()
            {
                m.command(Command::CancelTimer {
                    timer_id: timer.timer_id.clone(),
                });
            }
            if let Some(child) = &call.child_run_id {
                m.command(Command::CancelChildRun {
                    child_run_id: child.clone(),
                    reason: format!("its parent's call was failed by {by}: {reason}"),
                });
            }
            m.emit(Event::tool_call_failed(
                call_id,
                call.dispatched_attempt.unwrap_or(0),
                format!("failed by operator {by}: {reason}"),
            ));
        }
        Input::ToolCallCompleted {
            call_id,
            attempt,
            result,
            secrets,
        } => {
            m.require_active("tool result")?;
            m.require_open_tool_call(&call_id)?;
            m.on_tool_result(call_id.clone(), attempt, result)?;
            m.vault_result(&call_id, secrets)?;
            // The endpoint answered: whatever the result holds, it is up.
            m.record_tool_outcome(&call_id, false);
        }
        Input::ToolInputRequested {
            call_id,
            attempt,
            via,
            requests,
            request_state,
            may_have_acted,
        } => {
            m.require_active("input request")?;
            m.require_open_tool_call(&call_id)?;
            m.on_input_requested(
                call_id,
                attempt,
                via,
                requests,
                request_state,
                may_have_acted,
            )?;
        }
        Input::ProvideToolInput {
            call_id,
            request,
            answer,
            by,
        } => {
            m.on_answer(call_id, request, answer, by)?;
        }
        wrapped @ (Input::ToolCallSampled { .. } | Input::McpReported { .. }) => {
            return decide_wrapped(state, wrapped);
        }
        Input::TaskFailed {
            call_id,
            attempt,
            error,
            class,
            dispatched,
            status_code,
        } => {
            m.require_active("failure report")?;
            let counts = dispatched && gates::counts_as_failure(class, status_code);
            m.on_failure(Failure {
                call_id: call_id.clone(),
                attempt,
                error,
                class,
                dispatched,
                lease_expired: false,
                status_code,
            })?;
            if counts {
                m.record_tool_outcome(&call_id, true);
            }
        }
        Input::LateToolResult {
            call_id,
            attempt,
            result,
            worker_id,
        } => {
            // A result that arrives after the run ended (completed, failed,
            // cancelled) is still what happened at the tool: it is kept,
            // never applied (and resolves an open uncertain outcome); issue
            // 22. Only a run not yet started refuses it.
            if !m.state.status.is_terminal() {
                m.require_active("late result")?;
            }
            m.on_late_result(call_id, attempt, result, worker_id)?;
        }
        Input::ResolveUncertain {
            call_id,
            resolution,
            resolved_by,
            reason,
        } => {
            // Records of a cancelled run can still be closed (succeeded or
            // failed: what happened in the world), never retried.
            if m.state.status != RunStatus::Cancelled {
                m.require_active("resolve")?;
            } else if matches!(resolution, Resolution::Retry { .. }) {
                return Err(m.wrong_status("resolve as retry: the run is cancelled, so nothing would run it; resolve as succeeded or failed"));
            }
            m.resolve(
                &call_id,
                resolution,
                resolved_by,
                reason,
                ResolvedVia::Operator,
            )?;
        }
        Input::Pause { by, reason } => {
            if m.state.operator_paused.is_some() {
                return Err(m.wrong_status("pause: it is already paused by an operator"));
            }
            m.require_active("pause")?;
            let reason = if reason.trim().is_empty() {
                "no reason given".to_owned()
            } else {
                reason
            };
            m.emit(Event::RunPaused {
                reason: format!("paused by {by}: {reason}"),
                operator: Some(by),
            });
        }
        Input::Resume { by, reason } => {
            if m.state.operator_paused.is_none() {
                let open = m.state.open_uncertain();
                let detail = if open.is_empty() {
                    "resume: it is not paused by an operator".to_owned()
                } else {
                    format!(
                        "resume: it is paused on {} uncertain outcome(s) ({}); resolve them instead",
                        open.len(),
                        open.join(", ")
                    )
                };
                return Err(m.wrong_status(&detail));
            }
            if m.state.open_uncertain().is_empty() {
                m.emit(Event::RunResumed { by, reason });
            } else {
                // The operator's hold is gone, but an uncertain outcome still holds the run.
                m.emit(Event::OperatorPauseLifted { by, reason });
            }
        }
        Input::LeaseExpired {
            call_id,
            attempt,
            dispatched,
        } => {
            // A paused run can still have leases expire (its tasks were
            // claimed before it paused); judge them the same way.
            if m.state.status.is_terminal() || m.state.status == RunStatus::New {
                return Err(m.wrong_status("lease expiry"));
            }
            let class = if dispatched {
                FailureClass::MayHaveActed
            } else {
                FailureClass::NotSent
            };
            let error = format!("lease of attempt {attempt} expired before a result was reported");
            m.on_failure(Failure {
                call_id,
                attempt,
                error,
                class,
                dispatched,
                lease_expired: true,
                status_code: None,
            })?;
        }
        Input::Cancel { reason } => {
            if m.state.status.is_terminal() || m.state.status == RunStatus::New {
                return Err(m.wrong_status("cancel"));
            }
            m.abandon_in_flight(
                "the run was cancelled",
                &format!("its parent run was cancelled: {reason}"),
            )?;
            m.emit(Event::RunCancelled { reason });
            m.command(Command::CancelOpenTasks);
        }
        Input::Signal {
            signal_id,
            name,
            payload,
            sent_by,
        } => {
            if let Some(delivered) = m.state.signal_ids.get(&signal_id) {
                // Applied once already (even if the run has ended since: a
                // sender retrying after a lost reply is told it arrived).
                if *delivered == state::DeliveredSignal::new(&name, &payload) {
                    return Ok(m.out);
                }
                // The same id for another signal: applying it would lose
                // it, answering "duplicate" would tell the sender it
                // arrived.
                return Err(MachineError::SignalIdReused {
                    signal_id,
                    delivered_name: delivered.name.clone(),
                    name,
                });
            }
            if m.state.status.is_terminal() || m.state.status == RunStatus::New {
                return Err(m.wrong_status(&format!("signal `{name}`")));
            }
            m.check_signal(&name, &payload)?;
            m.emit(Event::SignalReceived {
                signal_id,
                name,
                payload,
                sent_by,
            });
            m.take_signal()?;
        }
        Input::TimerFired {
            timer_id,
            overdue_ms,
        } => {
            m.on_timer(&timer_id, overdue_ms)?;
        }
        Input::ChildRunFinished {
            child_run_id,
            status,
            output,
            error,
        } => {
            m.on_child_finished(child_run_id, status, output, error)?;
        }
        Input::DecideApproval {
            node,
            request,
            approve,
            edited_subject,
            by,
            grants,
            reason,
        } => {
            let verdict = Verdict {
                approve,
                edited_subject,
                by,
                grants,
                reason,
            };
            m.on_decide(node, request, verdict)?;
        }
    }
    m.stop_on_tool_failure()?;
    m.advance()?;
    Ok(m.out)
}
