//! A worker about to run a call: the checks made right before a tool
//! acts (the run, the call, the grants now), the tool's gates and
//! circuit, and the tenant's tool cache (a result served from it, or
//! kept in it).

use super::{Failure, Step};
use crate::command::Command;
use crate::error::MachineError;
use crate::event::{Event, FailureClass};
use crate::gates::{GateVerdict, ToolGates};
use crate::state::RunStatus;
use crate::{cache, state};
use belay_definitions::model::{NodeKind, RepeatSafety, ToolBindingDef};

impl Step {
    pub(crate) fn on_dispatch(
        &mut self,
        call_id: String,
        attempt: u32,
        worker_id: String,
        callback_token_sha256: Option<String>,
        tenant_grants: Option<Vec<String>>,
    ) -> Result<(), MachineError> {
        let call = self.require_open_tool_call(&call_id)?.clone();
        // Reconcile probes run while the run is paused on what they look up;
        // everything else only while it runs.
        // A run `waiting` on one call's child or callback still runs the
        // other calls of the same turn.
        let allowed = match self.state.status {
            RunStatus::Running | RunStatus::Waiting => true,
            RunStatus::Paused => call.probe_for.is_some(),
            _ => false,
        };
        if !allowed {
            return Err(self.wrong_status("dispatch"));
        }
        let is_webhook = self.plan().is_ok_and(|p| {
            p.tools
                .get(&call.tool)
                .is_some_and(|t| matches!(t.def.binding, ToolBindingDef::AsyncWebhook { .. }))
        });
        let issue_callback = |m: &mut Step| -> Result<(), MachineError> {
            if !is_webhook {
                return Ok(());
            }
            let Some(token_sha256) = callback_token_sha256.clone() else {
                return Err(MachineError::DispatchUnavailable {
                    call_id: call_id.clone(),
                    detail: format!(
                        "tool `{}` is `type: async_webhook`, and this engine serves no callback endpoint (start it with --callback-listen)",
                        call.tool
                    ),
                });
            };
            m.emit(Event::CallbackIssued {
                call_id: call_id.clone(),
                attempt,
                token_sha256: token_sha256.clone(),
            });
            m.command(Command::RegisterCallback {
                call_id: call_id.clone(),
                token_sha256,
            });
            Ok(())
        };
        if call.dispatched_attempt == Some(attempt) {
            // The same attempt asking again (its reply was lost): already
            // recorded. An async webhook gets a fresh token, as the first
            // reply (and its token) never reached the worker; a consumer of
            // the vault gets its values again (the call consumed them).
            self.restore_secrets(&call_id, &call.tool);
            return issue_callback(self);
        }
        if call.may_have_acted && call.repeat_safety != RepeatSafety::Idempotent {
            return Err(MachineError::DispatchRefused {
                call_id,
                detail: format!(
                    "a `{}` tool is dispatched at most once",
                    call.repeat_safety.as_str()
                ),
            });
        }
        // Permission again, immediately before the tool acts: the node's
        // grants (agent + node, as pinned), the caller's, and the tenant's
        // as they are now (a grant withdrawn since the proposal refuses it).
        let tenant_grants = tenant_grants.as_ref().unwrap_or(&self.state.tenant_grants);
        let (permission, missing) = self.missing_grants(&call, tenant_grants)?;
        if !missing.is_empty() {
            return Err(MachineError::DispatchRefused {
                call_id,
                detail: format!(
                    "permission `{permission}` is no longer granted to the {}",
                    missing.join(", ")
                ),
            });
        }
        let plan = self.plan()?;
        let gates = plan
            .tools
            .get(&call.tool)
            .map(|t| ToolGates::of(&t.def))
            .unwrap_or_default();
        self.emit(Event::ToolCallDispatched {
            call_id: call_id.clone(),
            attempt,
            worker_id,
        });
        issue_callback(self)?;
        self.restore_secrets(&call_id, &call.tool);
        self.command(Command::MarkDispatched { call_id, attempt });
        if gates.any() {
            // Last: every other check passed, so a turn taken is used.
            self.command(Command::PassToolGates {
                tool: call.tool.clone(),
                gates,
                holds_turn: call.holds_turn,
            });
        }
        Ok(())
    }

    /// The permission of `call`'s tool and who of node, caller and tenant
    /// (`tenant_grants`: the tenant's grants now) lacks it, for the check
    /// right before a tool acts (or its cached result is served). A
    /// reconcile probe is the engine's own lookup, declared by the tool's
    /// author: tenant policy applies, the node's and the caller's do not.
    fn missing_grants(
        &self,
        call: &state::ToolCallState,
        tenant_grants: &[String],
    ) -> Result<(String, Vec<&'static str>), MachineError> {
        let plan = self.plan()?;
        let permission = plan
            .tools
            .get(&call.tool)
            .map(|t| t.def.permission.clone())
            .ok_or_else(|| MachineError::InvalidPlan(format!("tool `{}` not pinned", call.tool)))?;
        let node_def = plan.workflow.def.nodes.iter().find(|n| n.id == call.node);
        let agent_has = node_def
            .and_then(|n| match &n.kind {
                NodeKind::Agent { agent, .. } => plan.agents.get(agent),
                _ => None,
            })
            .is_some_and(|a| a.def.grants.contains(&permission));
        let node_has = agent_has || node_def.is_some_and(|n| n.grants.contains(&permission));
        let probe = call.probe_for.is_some();
        let missing = [
            ("node", probe || node_has),
            (
                "caller",
                probe || self.state.caller_grants.contains(&permission),
            ),
            ("tenant", tenant_grants.contains(&permission)),
        ]
        .into_iter()
        .filter(|(_, ok)| !ok)
        .map(|(who, _)| who)
        .collect();
        Ok((permission, missing))
    }

    /// The cache key of call `call_id` when its result may come from, and
    /// go to, the tenant's tool cache ([`cache`]): a call of a tool whose
    /// [`ToolDef::cache_ttl_ms`](belay_definitions::model::ToolDef::cache_ttl_ms) is set, not a reconcile probe, and one that
    /// has not asked a person for input (its result then depends on the
    /// answers, which its arguments do not hold).
    pub(super) fn cache_key_of(&self, call_id: &str) -> Option<String> {
        let call = self.state.tool_calls.get(call_id)?;
        if call.probe_for.is_some() || call.input_rounds > 0 {
            return None;
        }
        let tool = self.state.plan.as_ref()?.tools.get(&call.tool)?;
        tool.def.cache_ttl_ms(cache::DEFAULT_TOOL_CACHE_TTL_MS)?;
        Some(cache::key(&self.state.tenant, tool, &call.arguments))
    }

    /// A call just completed by `event` (a result the tool gave: not a
    /// cached one) whose result goes to the tenant's tool cache: the
    /// command that keeps it. A result larger than
    /// [`cache::MAX_CACHED_RESULT_BYTES`] is not kept.
    pub(super) fn cache_store(&self, event: &Event) -> Option<Command> {
        let Event::ToolCallCompleted {
            call_id,
            result,
            cached: None,
            ..
        } = event
        else {
            return None;
        };
        let key = self.cache_key_of(call_id)?;
        let call = self.state.tool_calls.get(call_id)?;
        let tool = self.state.plan.as_ref()?.tools.get(&call.tool)?;
        let ttl_ms = tool.def.cache_ttl_ms(cache::DEFAULT_TOOL_CACHE_TTL_MS)?;
        if serde_json::to_string(result).map_or(true, |t| t.len() > cache::MAX_CACHED_RESULT_BYTES)
        {
            return None;
        }
        Some(Command::StoreToolCache {
            key,
            tool: call.tool.clone(),
            call_id: call_id.clone(),
            result: result.clone(),
            ttl_ms,
        })
    }

    /// The store found a live entry for a call launched in the decision
    /// before this one (same transaction): the call completes with it, as
    /// a `tool_call_completed` marked `cached`, with no attempt (0), no
    /// task and no dispatch. The checks a dispatch makes right before the
    /// tool acts are made here too (the run runs, the call is open and not
    /// under way, the tenant's grants now); the entry must be the call's
    /// key and of the tool's declared return type. Any refusal leaves the
    /// call to its task, as if the cache had no entry.
    pub(crate) fn on_cache_hit(
        &mut self,
        call_id: String,
        entry: cache::CacheEntry,
        tenant_grants: &[String],
    ) -> Result<(), MachineError> {
        if !matches!(self.state.status, RunStatus::Running | RunStatus::Waiting) {
            return Err(self.wrong_status("serving a cached result"));
        }
        let call = self.require_open_tool_call(&call_id)?.clone();
        if call.dispatched_attempt.is_some()
            || call.failed_attempts > 0
            || call.awaiting_confirmation.is_some()
            || call.awaiting_input.is_some()
        {
            return Err(MachineError::CallNotOpen {
                call_id,
                detail: "it is under way, so it is not served from the cache".into(),
            });
        }
        if self.cache_key_of(&call_id).as_deref() != Some(entry.key.as_str()) {
            return Err(MachineError::CallNotOpen {
                call_id,
                detail: "the cache entry is not this call's".into(),
            });
        }
        let (permission, missing) = self.missing_grants(&call, tenant_grants)?;
        if !missing.is_empty() {
            return Err(MachineError::DispatchRefused {
                call_id,
                detail: format!(
                    "permission `{permission}` is no longer granted to the {}",
                    missing.join(", ")
                ),
            });
        }
        let tool =
            self.plan()?.tools.get(&call.tool).ok_or_else(|| {
                MachineError::InvalidPlan(format!("tool `{}` not pinned", call.tool))
            })?;
        if let Err(errors) =
            belay_definitions::validate_json(&tool.def.output_schema, &entry.result)
        {
            return Err(MachineError::InvalidResult {
                tool: call.tool.clone(),
                errors,
            });
        }
        let at = |t: chrono::DateTime<chrono::Utc>| {
            t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
        };
        self.emit(Event::ToolCallCompleted {
            call_id,
            attempt: 0,
            result: entry.result,
            cached: Some(cache::CachedResult {
                key: entry.key,
                stored_by_run: entry.stored_by_run,
                stored_by_call: entry.stored_by_call,
                stored_at: at(entry.stored_at),
                expires_at: at(entry.expires_at),
            }),
            ends_node: false,
        });
        Ok(())
    }

    /// The tool's gates held back a dispatch [`Step::on_dispatch`] allowed
    /// (the store decides again with this, in the same transaction). A
    /// deferral puts the task back until its turn and is no attempt; an
    /// open circuit fails the call as not sent and refused, so the model
    /// (or a tool node's `on_error`) hears it at once.
    pub(crate) fn on_dispatch_gated(
        &mut self,
        call_id: String,
        attempt: u32,
        worker_id: String,
        verdict: GateVerdict,
    ) -> Result<(), MachineError> {
        let call = self.require_open_tool_call(&call_id)?.clone();
        let reason = verdict.describe(&call.tool);
        match verdict {
            GateVerdict::Defer {
                delay_ms, until, ..
            } => {
                self.emit(Event::ToolCallDeferred {
                    call_id: call_id.clone(),
                    attempt,
                    worker_id,
                    until,
                    reason,
                });
                self.command(Command::RetryTask { call_id, delay_ms });
                Ok(())
            }
            GateVerdict::CircuitOpen { .. } => self.on_failure(Failure {
                call_id,
                attempt,
                error: reason,
                class: FailureClass::Rejected,
                dispatched: false,
                lease_expired: false,
                status_code: None,
            }),
        }
    }

    /// A reported outcome of a call of a tool with a `circuit_breaker:`
    /// moves its circuit ([`Command::RecordToolOutcome`]); other tools cost
    /// nothing.
    pub(crate) fn record_tool_outcome(&mut self, call_id: &str, failed: bool) {
        let Some(tool) = self.state.tool_calls.get(call_id).map(|c| c.tool.clone()) else {
            return;
        };
        let breaker = self
            .plan()
            .ok()
            .and_then(|p| p.tools.get(&tool))
            .and_then(|t| t.def.circuit_breaker);
        if let Some(circuit_breaker) = breaker {
            self.command(Command::RecordToolOutcome {
                tool,
                circuit_breaker,
                failed,
            });
        }
    }
}
