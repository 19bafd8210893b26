//! A failed attempt (the table of DESIGN.md, "The tool call, exactly"):
//! retried, failed for good, or an uncertain outcome; the retries a
//! tool's policy allows; and a failed reconcile probe.

use serde_json::{Map, Value};

use super::{Failure, Step, ToolTask, tool_spec};
use crate::command::{Command, TaskEnd, TaskKind};
use crate::error::MachineError;
use crate::event::{Event, FailureClass, ProbeOutcome, ResolvedVia};
use crate::input::Resolution;
use crate::state::{CallStatus, RunStatus};
use crate::{
    MAX_NOT_SENT_ATTEMPTS, TOOL_NODE_ATTEMPTS, idempotency_key, inject, normalize, policy_delay_ms,
    retry_delay_ms, state, variants,
};
use belay_definitions::model::{RepeatSafety, RetryPolicy, ToolBindingDef};

/// Whether a failed tool-call attempt is within its call's attempts, and
/// the delay before the next one if it is retried.
struct Retries {
    /// Another attempt is allowed by the count (repeat safety and the
    /// failure's class decide whether one is made at all).
    within: bool,
    /// The delay before it, ms.
    delay_ms: u64,
    /// The attempt counted against the tool's `retry_policy` (rather than
    /// the not-sent allowance or the engine's defaults).
    by_policy: bool,
}

impl Step {
    /// A failed attempt, reported or implied by a lost lease: the table of
    /// DESIGN.md, "The tool call, exactly".
    pub(crate) fn on_failure(&mut self, failure: Failure) -> Result<(), MachineError> {
        let Failure {
            call_id,
            attempt,
            error,
            class,
            dispatched,
            lease_expired,
            status_code,
        } = failure;
        // An error quotes what the tool answered (an HTTP body, a result):
        // its secrets go no further than a result's would.
        let error = self.scrubbed_text(&call_id, &normalize::strip_nul(&error));
        // A tool node has no agent: it gets the agents' default limits.
        let (max_model_attempts, max_tool_attempts) = self
            .state
            .current_agent()
            .map(|a| (a.max_model_attempts, a.max_tool_attempts))
            .unwrap_or((TOOL_NODE_ATTEMPTS, TOOL_NODE_ATTEMPTS));

        // Model calls: no side effects, retried like idempotent tools.
        if self
            .state
            .node
            .as_ref()
            .and_then(|n| n.model_call.as_ref())
            .is_some_and(|c| c.call_id == call_id)
        {
            let failed = self
                .state
                .node
                .as_ref()
                .and_then(|n| n.model_call.as_ref())
                .map(|c| c.failed_attempts + 1)
                .unwrap_or(1);
            let will_retry = failed < max_model_attempts;
            self.emit(Event::ModelCallAttemptFailed {
                call_id: call_id.clone(),
                attempt,
                error: error.clone(),
                will_retry,
            });
            if will_retry {
                self.command(Command::RetryTask {
                    call_id,
                    delay_ms: retry_delay_ms(failed),
                });
            } else {
                self.command(Command::EndTask {
                    call_id: call_id.clone(),
                    end: TaskEnd::Failed,
                });
                self.emit(Event::RunFailed {
                    error: format!(
                        "model call `{call_id}` failed {failed} times; last error: {error}"
                    ),
                    stop: None,
                });
                self.command(Command::CancelOpenTasks);
            }
            return Ok(());
        }

        let call = self.require_open_tool_call(&call_id)?.clone();
        // Attempts that provably did nothing (not sent, or lost before
        // dispatch) have their own, longer allowance: an MCP server or tool
        // host being redeployed must not fail durable runs.
        let nothing_done = class == FailureClass::NotSent || !dispatched;
        let not_sent = call.not_sent_failures + u32::from(nothing_done);
        let failed = call.failed_attempts + 1;
        let acted = failed - not_sent.min(failed);
        let policy = self
            .state
            .plan
            .as_ref()
            .and_then(|p| p.tools.get(&call.tool))
            .and_then(|t| t.def.retry_policy.clone());
        let retries = match &policy {
            None => Retries {
                within: if nothing_done {
                    not_sent < MAX_NOT_SENT_ATTEMPTS
                } else {
                    acted < max_tool_attempts
                },
                delay_ms: retry_delay_ms(if nothing_done { not_sent } else { acted }),
                by_policy: false,
            },
            Some(policy) => self.policy_retries(
                policy,
                &call,
                &call_id,
                attempt,
                class,
                dispatched,
                status_code,
                max_tool_attempts,
            ),
        };
        let within_attempts = retries.within;
        let delay_ms = retries.delay_ms;
        // What may happen next, by class and repeat safety.
        enum Next {
            Retry,
            Fail(String),
            Uncertain,
        }
        if let Some(target) = call.probe_for.clone() {
            // A probe without a policy of its own keeps its backoff by attempt.
            let delay_ms = if policy.is_some() {
                delay_ms
            } else {
                retry_delay_ms(attempt)
            };
            return self.on_probe_failure(
                &target,
                Failure {
                    call_id,
                    attempt,
                    error,
                    class,
                    dispatched,
                    lease_expired,
                    status_code,
                },
                within_attempts,
                delay_ms,
            );
        }
        let next = match (class, dispatched, call.repeat_safety) {
            (FailureClass::Rejected, _, _) => {
                Next::Fail(format!("tool `{}` failed: {error}", call.tool))
            }
            (FailureClass::NotSent, _, _) | (_, false, _) => {
                if within_attempts {
                    Next::Retry
                } else if retries.by_policy {
                    Next::Fail(format!(
                        "tool `{}` failed after {failed} attempts (its retry policy allows no more); last error: {error}",
                        call.tool
                    ))
                } else {
                    Next::Fail(format!(
                        "tool `{}` could not be reached in {not_sent} attempts (nothing was sent); last error: {error}",
                        call.tool
                    ))
                }
            }
            (FailureClass::MayHaveActed, true, RepeatSafety::Never) => Next::Fail(format!(
                "tool `{}` may or may not have acted ({error}); it is not repeated because its repeat safety is `never`",
                call.tool
            )),
            (FailureClass::MayHaveActed, true, RepeatSafety::Idempotent) => {
                if within_attempts {
                    Next::Retry
                } else {
                    Next::Fail(format!(
                        "tool `{}` failed after {failed} attempts; last error: {error}",
                        call.tool
                    ))
                }
            }
            (FailureClass::MayHaveActed, true, RepeatSafety::Reconcile) => Next::Uncertain,
        };
        let retry_delay_ms = matches!(next, Next::Retry).then_some(delay_ms);
        if lease_expired {
            self.emit(Event::TaskLeaseExpired {
                call_id: call_id.clone(),
                attempt,
                dispatched,
                retry_delay_ms,
            });
        } else {
            self.emit(Event::ToolCallAttemptFailed {
                call_id: call_id.clone(),
                attempt,
                error: error.clone(),
                class,
                dispatched,
                will_retry: matches!(next, Next::Retry),
                status_code,
                retry_delay_ms,
                kind: None,
            });
        }
        match next {
            Next::Retry => {
                self.refresh_sampling_grant(&call_id)?;
                self.command(Command::RetryTask { call_id, delay_ms })
            }
            Next::Fail(message) => {
                self.emit(Event::tool_call_failed(call_id.clone(), attempt, message));
                self.command(Command::EndTask {
                    call_id,
                    end: TaskEnd::Failed,
                });
            }
            Next::Uncertain => {
                let reason = format!(
                    "outcome of `{}` call `{call_id}` (attempt {attempt}) is unknown: {error}",
                    call.tool
                );
                self.record_uncertain(&call_id, &call, attempt, reason.clone())?;
                let probe = self
                    .plan()?
                    .tools
                    .get(&call.tool)
                    .and_then(|t| t.def.reconcile_with.clone())
                    .and_then(|name| self.plan().ok()?.tools.get(&name).cloned());
                let mut pause_reason = format!("uncertain outcome: {reason}");
                // The probe's own injected parameters are filled in like a
                // model's call; a probe that cannot be called goes to the
                // operator instead.
                let probe_call_id = format!("{call_id}.p{}", call.probes + 1);
                let key = idempotency_key(&self.state.run_id, &probe_call_id);
                let probe = probe.and_then(|probe| {
                    let mut args = Map::new();
                    args.insert(
                        "idempotency_key".into(),
                        Value::String(call.idempotency_key.clone()),
                    );
                    let facts = inject::CallFacts {
                        run_id: &self.state.run_id,
                        node_id: &call.node,
                        call_id: &probe_call_id,
                        idempotency_key: &key,
                        tenant: &self.state.tenant,
                        caller: &self.state.caller,
                        now: self.state.now,
                    };
                    let args =
                        inject::inject(&probe.def, &mut args, &self.state.document(), &facts)
                            .map(|()| Value::Object(args))
                            .and_then(|args| {
                                let variant = variants::choose(&probe.def, &args)?;
                                Ok((args, variant))
                            });
                    match args {
                        Ok((args, variant)) => Some((probe, args, variant)),
                        Err(e) => {
                            pause_reason = format!(
                                "{pause_reason}; the probe `{}` cannot be called: {e}",
                                probe.def.name
                            );
                            None
                        }
                    }
                });
                match probe {
                    Some((probe, arguments, variant)) => {
                        let ToolTask { spec, requires } = ToolTask::new(
                            &probe,
                            tool_spec(&probe, &arguments, &key, variant.as_deref())?,
                        )?;
                        let after_ms = lease_expired.then(|| self.in_flight_ms(&call.tool));
                        self.emit(Event::ReconcileProbeScheduled {
                            call_id: call_id.clone(),
                            probe_call_id: probe_call_id.clone(),
                            tool: probe.def.name.clone(),
                            arguments,
                            variant,
                            after_ms,
                        });
                        self.schedule_probe(probe_call_id, spec, key, requires, after_ms);
                        pause_reason =
                            format!("{pause_reason}; looking it up with `{}`", probe.def.name);
                    }
                    None => self.notify_uncertain(&call_id),
                }
                if self.state.status == RunStatus::Running {
                    self.emit(Event::RunPaused {
                        reason: pause_reason,
                        operator: None,
                    });
                }
            }
        }
        Ok(())
    }

    /// How long after its worker lost the lease a call of `tool` may still
    /// reach the tool ([`in_flight_ms`]): a probe sooner could find nothing
    /// and let the call run twice. 0 for a tool the plan does not pin.
    fn in_flight_ms(&self, tool: &str) -> u64 {
        self.plan()
            .ok()
            .and_then(|plan| plan.tools.get(tool).map(|t| in_flight_ms(&t.def.binding)))
            .unwrap_or(0)
    }

    /// Schedules the task of a reconcile probe (claimable while the run
    /// is paused), ready only after `after_ms` when given: a request the
    /// worker sent just before its lease ended has reached the tool or
    /// been given up by then.
    fn schedule_probe(
        &mut self,
        probe_call_id: String,
        spec: Value,
        idempotency_key: String,
        requires: Vec<String>,
        after_ms: Option<u64>,
    ) {
        self.command(Command::ScheduleTask {
            call_id: probe_call_id.clone(),
            kind: TaskKind::ToolCall,
            spec,
            idempotency_key,
            repeat_safety: Some(RepeatSafety::Idempotent),
            runs_while_paused: true,
            requires,
        });
        if let Some(delay_ms) = after_ms {
            self.command(Command::RetryTask {
                call_id: probe_call_id,
                delay_ms,
            });
        }
    }

    /// The retries of a failed attempt of `call`, whose tool declares
    /// `policy`. Attempts that reached nothing (not sent with no answer
    /// from the tool: a refused connection, a token endpoint down, an MCP
    /// server away; or lost before dispatch) keep the separate allowance of
    /// [`MAX_NOT_SENT_ATTEMPTS`], with the engine's backoff or the policy's
    /// delay, whichever is longer (the allowance exists to outlast a
    /// redeploy; the policy may space attempts further, not closer). Every
    /// other failure counts: at most `1 + max_retries` of them (else the
    /// agent's `max_tool_attempts`), each followed by the policy's delay.
    #[allow(clippy::too_many_arguments)]
    fn policy_retries(
        &self,
        policy: &RetryPolicy,
        call: &state::ToolCallState,
        call_id: &str,
        attempt: u32,
        class: FailureClass,
        dispatched: bool,
        status_code: Option<u16>,
        max_tool_attempts: u32,
    ) -> Retries {
        let nothing_done = class == FailureClass::NotSent || !dispatched;
        let answered = class == FailureClass::NotSent && dispatched && status_code.is_some();
        let failed = call.failed_attempts + 1;
        let unreached = (call.not_sent_failures + u32::from(nothing_done))
            .saturating_sub(call.answered_not_sent + u32::from(answered));
        let run_id = &self.state.run_id;
        if nothing_done && !answered {
            let policy_delay = policy_delay_ms(policy, unreached, run_id, call_id, attempt);
            return Retries {
                within: unreached < MAX_NOT_SENT_ATTEMPTS,
                delay_ms: policy_delay.max(retry_delay_ms(unreached)),
                by_policy: false,
            };
        }
        let counted = failed.saturating_sub(unreached);
        let max_attempts = policy
            .max_retries
            .map_or(max_tool_attempts, |r| r.saturating_add(1));
        Retries {
            within: counted < max_attempts,
            delay_ms: policy_delay_ms(policy, counted, run_id, call_id, attempt),
            by_policy: true,
        }
    }

    /// A reconcile probe failed: a definite "not found" (HTTP 404) means the
    /// call had no effect and is retried with the same key; a failure that is
    /// safe to retry retries the probe; anything else goes to the operator.
    fn on_probe_failure(
        &mut self,
        target: &str,
        failure: Failure,
        within_attempts: bool,
        delay_ms: u64,
    ) -> Result<(), MachineError> {
        let Failure {
            call_id: probe_call_id,
            attempt,
            error,
            class,
            dispatched,
            lease_expired,
            status_code,
        } = failure;
        let probe_tool = self
            .state
            .tool_calls
            .get(&probe_call_id)
            .map(|c| c.tool.clone())
            .unwrap_or_default();
        let not_found = class == FailureClass::Rejected && status_code == Some(404);
        // Probes are idempotent reads: any failure but a definite answer may be retried.
        let retry = !not_found && class != FailureClass::Rejected && within_attempts;
        let retry_delay_ms = retry.then_some(delay_ms);
        if lease_expired {
            self.emit(Event::TaskLeaseExpired {
                call_id: probe_call_id.clone(),
                attempt,
                dispatched,
                retry_delay_ms,
            });
        } else {
            self.emit(Event::ToolCallAttemptFailed {
                call_id: probe_call_id.clone(),
                attempt,
                error: error.clone(),
                class,
                dispatched: true,
                will_retry: retry,
                status_code,
                retry_delay_ms,
                kind: None,
            });
        }
        if retry {
            self.command(Command::RetryTask {
                call_id: probe_call_id,
                delay_ms,
            });
            return Ok(());
        }
        self.emit(Event::ToolCallFailed {
            call_id: probe_call_id.clone(),
            attempt,
            error: error.clone(),
            kind: None,
        });
        self.command(Command::EndTask {
            call_id: probe_call_id.clone(),
            end: TaskEnd::Failed,
        });
        let still_uncertain = self
            .state
            .tool_calls
            .get(target)
            .is_some_and(|c| c.status == CallStatus::Uncertain);
        if !still_uncertain {
            return Ok(());
        }
        if not_found {
            let detail = format!("`{probe_tool}` found no effect ({error})");
            self.probe_finished(
                target,
                &probe_call_id,
                &probe_tool,
                ProbeOutcome::NotFound,
                detail.clone(),
            );
            self.resolve(
                target,
                Resolution::Retry {
                    new_idempotency_key: false,
                },
                format!("probe:{probe_tool}"),
                detail,
                ResolvedVia::Probe,
            )
        } else {
            let detail = format!("`{probe_tool}` could not decide: {error}");
            self.probe_finished(
                target,
                &probe_call_id,
                &probe_tool,
                ProbeOutcome::Undecided,
                detail,
            );
            self.notify_uncertain(target);
            Ok(())
        }
    }
}

/// How long after its worker lost the lease a call's request may still
/// reach the tool, ms: the binding's own timeout, after which the worker
/// gives the request up (for an async webhook, the timeout of its
/// request, not of the callback).
fn in_flight_ms(binding: &ToolBindingDef) -> u64 {
    match binding {
        ToolBindingDef::Http { timeout_ms, .. }
        | ToolBindingDef::AsyncWebhook { timeout_ms, .. }
        | ToolBindingDef::Mcp { timeout_ms, .. }
        | ToolBindingDef::McpResource { timeout_ms, .. } => *timeout_ms,
        // A child run is the engine's own: nothing is in flight.
        ToolBindingDef::Workflow { .. } => 0,
        // Without a `timeout:` the worker's `--sandbox-timeout-ms` applies,
        // which the engine does not know: a minute covers its default
        // (10 s) and most settings.
        ToolBindingDef::Sandbox(sandbox) => sandbox.timeout_ms.unwrap_or(60_000),
    }
}
