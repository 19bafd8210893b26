//! Uncertain outcomes: recorded and notified, found by a reconcile
//! probe, resolved by an operator, a probe, a callback or a late
//! result.

use serde_json::Value;

use super::{Step, tool_spec};
use crate::command::{Command, TaskEnd};
use crate::error::MachineError;
use crate::event::{Event, ProbeOutcome, ResolutionKind, ResolvedVia};
use crate::input::Resolution;
use crate::state::{CallStatus, RunStatus};
use crate::{idempotency_key, normalize, state};

impl Step {
    /// A probe answered with a result: found, if it is a valid result of the
    /// uncertain call's tool; otherwise the operator decides.
    pub(super) fn on_probe_found(
        &mut self,
        target: &str,
        probe_call_id: &str,
        result: Value,
    ) -> Result<(), MachineError> {
        let Some(call) = self.state.tool_calls.get(target).cloned() else {
            return Ok(());
        };
        if call.status != CallStatus::Uncertain {
            return Ok(()); // resolved meanwhile (operator or late result)
        }
        let probe_tool = self
            .state
            .tool_calls
            .get(probe_call_id)
            .map(|c| c.tool.clone())
            .unwrap_or_default();
        let schema = self
            .plan()?
            .tools
            .get(&call.tool)
            .map(|t| t.def.output_schema.clone());
        // The probe may answer with more than the tool returns (the whole
        // record); the call's result is what the tool declares.
        let result = match (&schema, result) {
            (Some(schema), Value::Object(map)) => {
                match schema.get("properties").and_then(Value::as_object) {
                    Some(props) => Value::Object(
                        map.into_iter()
                            .filter(|(k, _)| props.contains_key(k))
                            .collect(),
                    ),
                    None => Value::Object(map),
                }
            }
            (_, other) => other,
        };
        let valid = match &schema {
            Some(schema) => belay_definitions::validate_json(schema, &result),
            None => Err(vec![format!("tool `{}` is not pinned", call.tool)]),
        };
        match valid {
            Ok(()) => {
                let detail = format!("`{probe_tool}` found the effect of `{}`", call.tool);
                self.probe_finished(
                    target,
                    probe_call_id,
                    &probe_tool,
                    ProbeOutcome::Found,
                    detail.clone(),
                );
                self.resolve(
                    target,
                    Resolution::Succeeded { result },
                    format!("probe:{probe_tool}"),
                    detail,
                    ResolvedVia::Probe,
                )
            }
            Err(errors) => {
                let detail = format!(
                    "`{probe_tool}` answered, but not with a result of `{}`: {}",
                    call.tool,
                    errors.join("; ")
                );
                self.probe_finished(
                    target,
                    probe_call_id,
                    &probe_tool,
                    ProbeOutcome::Undecided,
                    detail,
                );
                self.notify_uncertain(target);
                Ok(())
            }
        }
    }

    pub(super) fn probe_finished(
        &mut self,
        target: &str,
        probe_call_id: &str,
        tool: &str,
        outcome: ProbeOutcome,
        detail: String,
    ) {
        self.emit(Event::ReconcileProbeFinished {
            call_id: target.to_owned(),
            probe_call_id: probe_call_id.to_owned(),
            outcome,
            detail: detail.clone(),
        });
        self.command(Command::RecordProbe {
            call_id: target.to_owned(),
            probe: serde_json::json!({"tool": tool, "probe_call_id": probe_call_id, "outcome": outcome, "detail": detail}),
        });
    }

    /// Record an uncertain outcome for `call` (event, task end, record).
    pub(super) fn record_uncertain(
        &mut self,
        call_id: &str,
        call: &state::ToolCallState,
        attempt: u32,
        reason: String,
    ) -> Result<(), MachineError> {
        let tool_version = self
            .plan()?
            .tools
            .get(&call.tool)
            .map(|t| t.version)
            .unwrap_or(0);
        self.emit(Event::UncertainOutcomeRecorded {
            call_id: call_id.to_owned(),
            attempt,
            reason: reason.clone(),
        });
        self.command(Command::EndTask {
            call_id: call_id.to_owned(),
            end: TaskEnd::Uncertain,
        });
        self.command(Command::RecordUncertainOutcome {
            call_id: call_id.to_owned(),
            node: call.node.clone(),
            tool: call.tool.clone(),
            tool_version,
            arguments: call.arguments.clone(),
            idempotency_key: call.idempotency_key.clone(),
            attempt,
            reason,
        });
        Ok(())
    }

    /// Queue the operator notification for an uncertain call.
    pub(super) fn notify_uncertain(&mut self, call_id: &str) {
        let Some(call) = self.state.tool_calls.get(call_id) else {
            return;
        };
        let payload = serde_json::json!({
            "type": "run.paused.uncertain_outcome",
            "tenant": self.state.tenant,
            "run_id": self.state.run_id,
            "call_id": call_id,
            "node": call.node,
            "tool": call.tool,
            "idempotency_key": call.idempotency_key,
            "reason": call.uncertain_reason,
        });
        self.command(Command::NotifyOperator {
            kind: "run.paused.uncertain_outcome".into(),
            payload,
        });
    }

    /// Resolve an open uncertain outcome (operator, late result or probe).
    pub(crate) fn resolve(
        &mut self,
        call_id: &str,
        resolution: Resolution,
        resolved_by: String,
        reason: String,
        via: ResolvedVia,
    ) -> Result<(), MachineError> {
        let call = match self.state.tool_calls.get(call_id) {
            Some(c) if c.status == CallStatus::Uncertain => c.clone(),
            Some(c) => {
                let detail = match &c.resolution {
                    Some((by, kind, _)) => format!(
                        "already resolved as `{}` via {}",
                        kind.as_str(),
                        by.as_str()
                    ),
                    None => format!("it is {:?}", c.status).to_lowercase(),
                };
                return Err(MachineError::NotUncertain {
                    call_id: call_id.to_owned(),
                    detail,
                });
            }
            None => {
                return Err(MachineError::NotUncertain {
                    call_id: call_id.to_owned(),
                    detail: "no such tool call".into(),
                });
            }
        };
        let tool =
            self.plan()?.tools.get(&call.tool).cloned().ok_or_else(|| {
                MachineError::InvalidPlan(format!("tool `{}` not pinned", call.tool))
            })?;
        let (kind, event_result, event_error, key, stored) = match resolution {
            Resolution::Succeeded { result } => {
                let result = normalize::strip_nul_value(result);
                // A late result is the tool's own answer; an operator's or a
                // probe's must match the tool's output type.
                if via != ResolvedVia::LateResult {
                    belay_definitions::validate_json(&tool.def.output_schema, &result).map_err(
                        |errors| MachineError::InvalidResult {
                            tool: call.tool.clone(),
                            errors,
                        },
                    )?;
                }
                let stored = serde_json::json!({"resolution": "succeeded", "result": result});
                (ResolutionKind::Succeeded, Some(result), None, None, stored)
            }
            Resolution::Failed { error } => {
                let error = normalize::strip_nul(&error);
                let error = if error.trim().is_empty() {
                    "failed (no message given)".to_owned()
                } else {
                    error
                };
                let stored = serde_json::json!({"resolution": "failed", "error": error});
                (ResolutionKind::Failed, None, Some(error), None, stored)
            }
            Resolution::Retry {
                new_idempotency_key,
            } => {
                let key = if new_idempotency_key {
                    format!(
                        "{}/r{}",
                        idempotency_key(&self.state.run_id, call_id),
                        call.rekeys + 1
                    )
                } else {
                    call.idempotency_key.clone()
                };
                let stored = serde_json::json!({"resolution": "retry", "idempotency_key": key, "new_idempotency_key": new_idempotency_key});
                (ResolutionKind::Retry, None, None, Some(key), stored)
            }
        };
        let late_attempt = self.late_attempt.take();
        self.emit(Event::UncertainOutcomeResolved {
            call_id: call_id.to_owned(),
            resolution: kind,
            result: event_result,
            error: event_error,
            idempotency_key: key.clone(),
            resolved_by: resolved_by.clone(),
            reason: reason.clone(),
            via,
            attempt: late_attempt,
        });
        self.command(Command::MarkUncertainResolved {
            call_id: call_id.to_owned(),
            resolution: stored,
            kind,
            resolved_by: resolved_by.clone(),
            reason,
            via,
        });
        // Probes still looking this call up are moot now.
        let moot: Vec<String> = self
            .state
            .tool_calls
            .iter()
            .filter(|(_, c)| {
                c.probe_for.as_deref() == Some(call_id) && c.status == CallStatus::Open
            })
            .map(|(id, _)| id.clone())
            .collect();
        for probe in moot {
            self.command(Command::EndTask {
                call_id: probe,
                end: TaskEnd::Cancelled,
            });
        }
        match kind {
            ResolutionKind::Succeeded => self.command(Command::EndTask {
                call_id: call_id.to_owned(),
                end: TaskEnd::Completed,
            }),
            ResolutionKind::Failed => self.command(Command::EndTask {
                call_id: call_id.to_owned(),
                end: TaskEnd::Failed,
            }),
            ResolutionKind::Retry => {
                if let Some(key) = key.filter(|k| k != &call.idempotency_key) {
                    let spec = tool_spec(&tool, &call.arguments, &key, call.variant.as_deref())?;
                    let spec = self.with_sampling(spec, &call.node, &tool.def);
                    self.command(Command::RekeyTask {
                        call_id: call_id.to_owned(),
                        idempotency_key: key,
                        spec,
                    });
                }
                self.command(Command::RetryTask {
                    call_id: call_id.to_owned(),
                    delay_ms: 0,
                });
            }
        }
        if self.state.status == RunStatus::Paused
            && self.state.operator_paused.is_none()
            && self.state.open_uncertain().is_empty()
        {
            self.emit(Event::RunResumed {
                by: resolved_by,
                reason: "every uncertain outcome is resolved".into(),
            });
        }
        Ok(())
    }

    /// A result from an attempt that lost its lease (DESIGN.md table, last row).
    pub(crate) fn on_late_result(
        &mut self,
        call_id: String,
        attempt: u32,
        result: Value,
        worker_id: String,
    ) -> Result<(), MachineError> {
        let result = self.scrubbed(&call_id, result);
        let call = self
            .state
            .tool_calls
            .get(&call_id)
            .cloned()
            .ok_or_else(|| MachineError::CallNotOpen {
                call_id: call_id.clone(),
                detail: "no such tool call".into(),
            })?;
        match call.status {
            CallStatus::Completed if call.completed_by_attempt == Some(attempt) => Ok(()), // the same report again
            CallStatus::Uncertain => {
                self.late_attempt = Some(attempt);
                self.resolve(
                    &call_id,
                    Resolution::Succeeded { result },
                    format!("worker:{worker_id}"),
                    format!("attempt {attempt} reported its result after losing its lease"),
                    ResolvedVia::LateResult,
                )
            }
            // Still open (being retried): the first result wins.
            CallStatus::Open if !self.state.status.is_terminal() => {
                self.on_tool_result(call_id, attempt, result)
            }
            CallStatus::Open
            | CallStatus::Completed
            | CallStatus::Failed
            | CallStatus::Cancelled => {
                let ended = self.state.status.is_terminal() || call.status == CallStatus::Cancelled;
                let cancelled = ended.then(|| {
                    let what = if self.state.status.is_terminal() { self.state.status.as_str() } else { "cancelled" };
                    format!("attempt {attempt} reported a result after the run was {what}; it is kept here, not applied")
                });
                let discrepancy = call.resolution.as_ref().map(|(via, kind, resolved)| {
                    let agrees = *kind == ResolutionKind::Succeeded && resolved.as_ref() == Some(&result);
                    format!(
                        "attempt {attempt} reported a result after the outcome was resolved as `{}` via {}; {}",
                        kind.as_str(),
                        via.as_str(),
                        if agrees { "it matches the resolution" } else { "it differs from the resolution and was not applied" }
                    )
                });
                if let Some(detail) = &discrepancy {
                    self.command(Command::FlagDiscrepancy {
                        call_id: call_id.clone(),
                        discrepancy: serde_json::json!({"attempt": attempt, "result": result, "detail": detail, "worker_id": worker_id}),
                    });
                    // Someone resolved this outcome; they should know it was
                    // answered otherwise (or confirmed).
                    self.command(Command::NotifyOperator {
                        kind: "uncertain_outcome.discrepancy".into(),
                        payload: serde_json::json!({
                            "type": "uncertain_outcome.discrepancy",
                            "tenant": self.state.tenant,
                            "run_id": self.state.run_id,
                            "call_id": call_id,
                            "tool": call.tool,
                            "detail": detail,
                        }),
                    });
                }
                self.emit(Event::LateResultRecorded {
                    call_id,
                    attempt,
                    result,
                    discrepancy: discrepancy.or(cancelled),
                });
                Ok(())
            }
        }
    }
}
