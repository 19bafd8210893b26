//! The machine's working copy for one input ([`Step`]): the state as it
//! changes, the decision being built, and what every phase of a call uses
//! (`emit`, which also derives the follow-up events and commands of an
//! event; `command`; the `require_*` checks; the plan; ending the run; a
//! call's task spec). Each phase adds its `impl Step` in a file of its own:
//!
//! - `model_call`: a model's answer, and `on_tool_failure: stop`;
//! - `proposal`: a proposed call's four checks, its confirmation, its launch;
//! - `dispatch`: the checks right before a tool acts, its gates, the tool cache;
//! - `outcome`: a result, a callback, a tool's question to a person;
//! - `failure`: a failed attempt, its retries, a failed probe;
//! - `uncertain`: uncertain outcomes, probes that find, late results;
//! - `graph`: `advance` and the nodes of the workflow;
//! - `child`: child runs;
//! - `wait`: waits, signals, timers, deadlines, approvals;
//! - `decision`: which request a person's decision or answer decides.
//!
//! Other parts of `impl Step` live beside the features they serve
//! (`sampling.rs`, `vault.rs`).

use belay_proto::wire::{AsyncWebhookBinding, HttpBinding, McpBinding, ToolBinding, ToolCallSpec};
use serde_json::{Map, Value, json};

use crate::command::{Command, Decision};
use crate::error::MachineError;
use crate::event::{Event, FailureClass, ResolutionKind, Stop, TimerSpec};
use crate::plan::{Pinned, RunPlan};
use crate::state::{CallStatus, RunState, RunStatus};
use crate::vault::SealedSecret;
use crate::{inject, process, state, variants};
use belay_definitions::model::{RepeatSafety, ToolBindingDef, ToolDef};

mod child;
mod decision;
pub(crate) use decision::Verdict;
mod dispatch;
mod failure;
mod graph;
mod model_call;
mod outcome;
mod proposal;
mod uncertain;
mod wait;

/// A failed attempt, as reported by a worker or implied by a lost lease.
pub(crate) struct Failure {
    pub(crate) call_id: String,
    pub(crate) attempt: u32,
    pub(crate) error: String,
    pub(crate) class: FailureClass,
    pub(crate) dispatched: bool,
    pub(crate) lease_expired: bool,
    pub(crate) status_code: Option<u16>,
}

/// Working copy of the state plus the decision being built.
pub(crate) struct Step {
    pub(crate) state: RunState,
    pub(crate) out: Decision,
    /// The attempt of a late result being applied, for the resolution event.
    pub(crate) late_attempt: Option<u32>,
    /// The sealed `visibility.trace: false` arguments of the model answer
    /// being applied (`untraced.rs`).
    pub(crate) arg_secrets: Vec<SealedSecret>,
    /// How many calls of the model answer being applied may sample: they
    /// split what is left of the budgets (`sampling.rs`); 1 otherwise.
    pub(crate) sampling_share: u32,
}

impl Step {
    pub(crate) fn emit(&mut self, event: Event) {
        // A wall-time timer is not wanted once what it bounds has ended:
        // delete its row (a firing that races this finds it stale).
        let ended: Vec<TimerSpec> = match &event {
            Event::NodeCompleted { node, .. } => self
                .state
                .node
                .as_ref()
                .filter(|n| &n.id == node)
                .and_then(|n| n.deadline.clone())
                .into_iter()
                .collect(),
            Event::RunCompleted { .. } | Event::RunFailed { .. } | Event::RunCancelled { .. } => [
                self.state.node.as_ref().and_then(|n| n.deadline.clone()),
                self.state.deadline.clone(),
            ]
            .into_iter()
            .flatten()
            .collect(),
            _ => Vec::new(),
        };
        // The run's vault is not wanted once the run has ended.
        if matches!(
            event,
            Event::RunCompleted { .. } | Event::RunFailed { .. } | Event::RunCancelled { .. }
        ) && self.plan_vaults()
            && !self.out.commands.contains(&Command::DropRunSecrets)
        {
            self.command(Command::DropRunSecrets);
        }
        for t in ended {
            if !self
                .out
                .commands
                .iter()
                .any(|c| matches!(c, Command::CancelTimer { timer_id } if *timer_id == t.timer_id))
            {
                self.command(Command::CancelTimer {
                    timer_id: t.timer_id,
                });
            }
        }
        if let Some(processed) = self.process_after(&event) {
            self.state.apply(&processed);
            self.out.events.push(processed);
        }
        if self.fold_into_last(&event) {
            return;
        }
        self.state.apply(&event);
        let vars = self.outcome_vars(&event);
        if let Some(keep) = self.cache_store(&event) {
            self.command(keep);
        }
        self.out.events.push(event);
        if let Some(vars) = vars {
            self.state.apply(&vars);
            self.out.events.push(vars);
        }
    }

    /// Where the fleet reads it ([`crate::level::FOLDED_TOOL_NODE`]), write
    /// `event` as a part of the decision's last event, which the fold then
    /// reads as both: a tool node's `NodeStarted` followed by its call's
    /// `ToolCallScheduled` with those arguments becomes the
    /// `ToolCallScheduled` (`starts_node`), and a call's
    /// `ToolCallCompleted` followed by its node's `NodeCompleted` with that
    /// result becomes the `ToolCallCompleted` (`ends_node`). `true`: done
    /// (folded into the state and into the last event).
    fn fold_into_last(&mut self, event: &Event) -> bool {
        if self.state.fleet_level < crate::level::FOLDED_TOOL_NODE {
            return false;
        }
        let folds = match (self.out.events.last(), event) {
            (
                Some(Event::NodeStarted {
                    node: started,
                    input,
                    deadline: None,
                }),
                Event::ToolCallScheduled {
                    node, arguments, ..
                },
            ) => started == node && input == arguments,
            (
                Some(Event::ToolCallCompleted {
                    call_id,
                    ends_node: false,
                    ..
                }),
                Event::NodeCompleted {
                    node,
                    output,
                    next: None,
                },
            ) => self
                .state
                .tool_node_end(call_id)
                .is_some_and(|(n, o)| &n == node && &o == output),
            _ => false,
        };
        if !folds {
            return false;
        }
        self.state.apply_within_last(event);
        match (self.out.events.pop(), event) {
            (Some(Event::NodeStarted { .. }), Event::ToolCallScheduled { .. }) => {
                let mut scheduled = event.clone();
                if let Event::ToolCallScheduled { starts_node, .. } = &mut scheduled {
                    *starts_node = true;
                }
                self.out.events.push(scheduled);
            }
            (Some(mut completed), _) => {
                if let Event::ToolCallCompleted { ends_node, .. } = &mut completed {
                    *ends_node = true;
                }
                self.out.events.push(completed);
            }
            (None, _) => {}
        }
        true
    }

    /// Before a call's result is recorded: its tool's `process.after`,
    /// evaluated over the raw result, as an [`Event::ToolCallProcessed`]
    /// (none for a probe, or a tool without it). See `machine/process.rs`.
    fn process_after(&self, event: &Event) -> Option<Event> {
        let (call_id, result) = match event {
            Event::ToolCallCompleted {
                call_id, result, ..
            } => (call_id, result),
            Event::UncertainOutcomeResolved {
                call_id,
                resolution: ResolutionKind::Succeeded,
                result,
                ..
            } => (call_id, result.as_ref().unwrap_or(&Value::Null)),
            _ => return None,
        };
        let call = self.state.tool_calls.get(call_id)?;
        if call.probe_for.is_some() {
            return None;
        }
        let tool = &self.state.plan.as_ref()?.tools.get(&call.tool)?.def;
        let after = tool.process.as_ref()?.after.as_ref()?;
        let done = process::after(after, &call.arguments, result);
        Some(Event::ToolCallProcessed {
            call_id: call_id.clone(),
            tool: call.tool.clone(),
            stage: "after".to_owned(),
            outcome: done.outcome.to_owned(),
            message: done.message,
            error: done.error,
            result: done.result,
        })
    }

    /// After a call's result or final failure: its tool's `on_result.set`
    /// or `on_error.set`, evaluated over `{"result": ...}` or
    /// `{"error": {"message": ...}}`, as an [`Event::ToolVarsSet`] (none
    /// for a probe, or a tool without them). An expression that fails sets
    /// nothing and is recorded in the event's `errors`; the call itself
    /// keeps its outcome.
    fn outcome_vars(&self, event: &Event) -> Option<Event> {
        let (call_id, input, from) = match event {
            Event::ToolCallCompleted {
                call_id, result, ..
            } => (call_id, json!({ "result": result }), "on_result"),
            Event::ToolCallFailed { call_id, error, .. } => (
                call_id,
                json!({ "error": { "message": error } }),
                "on_error",
            ),
            // An uncertain call resolved (by an operator, a probe or a late
            // result) completes or fails for good here.
            Event::UncertainOutcomeResolved {
                call_id,
                resolution: ResolutionKind::Succeeded,
                result,
                ..
            } => (call_id, json!({ "result": result }), "on_result"),
            Event::UncertainOutcomeResolved {
                call_id,
                resolution: ResolutionKind::Failed,
                error,
                ..
            } => (
                call_id,
                json!({ "error": { "message": error } }),
                "on_error",
            ),
            _ => return None,
        };
        let call = self.state.tool_calls.get(call_id)?;
        if call.probe_for.is_some() {
            return None;
        }
        // `on_result` reads the result as `process.after` made it (the
        // state holds it); a result `after` blocked runs neither.
        let input = if from == "on_result" {
            if call.status != CallStatus::Completed {
                return None;
            }
            json!({ "result": call.result.clone().unwrap_or(Value::Null) })
        } else {
            input
        };
        let tool = &self.state.plan.as_ref()?.tools.get(&call.tool)?.def;
        let exprs = if from == "on_result" {
            &tool.on_result
        } else {
            &tool.on_error
        };
        if exprs.is_empty() {
            return None;
        }
        let mut values = serde_json::Map::new();
        let mut errors = std::collections::BTreeMap::new();
        for (var, expr) in exprs {
            match expr.eval(&input) {
                Ok(value) => {
                    values.insert(var.clone(), value);
                }
                Err(e) => {
                    errors.insert(var.clone(), format!("`{}`: {e}", expr.source()));
                }
            }
        }
        Some(Event::ToolVarsSet {
            call_id: call_id.clone(),
            tool: call.tool.clone(),
            from: from.to_owned(),
            values,
            errors,
        })
    }

    pub(crate) fn command(&mut self, mut command: Command) {
        // Every task of a traced run carries the run's trace with its
        // node's span as the parent, whoever scheduled it.
        if let Some(trace) = &self.state.trace {
            match &mut command {
                Command::ScheduleTask {
                    call_id,
                    spec,
                    repeat_safety,
                    ..
                } => {
                    let safety = repeat_safety
                        .as_ref()
                        .map(|r| r.as_str())
                        .unwrap_or_default();
                    add_trace(spec, trace, &self.state.run_id, call_id, safety);
                }
                Command::RekeyTask { call_id, spec, .. } => {
                    let safety = self
                        .state
                        .tool_calls
                        .get(call_id.as_str())
                        .map(|c| c.repeat_safety.as_str())
                        .unwrap_or_default();
                    add_trace(spec, trace, &self.state.run_id, call_id, safety);
                }
                _ => {}
            }
        }
        self.out.commands.push(command);
    }

    pub(crate) fn wrong_status(&self, detail: &str) -> MachineError {
        MachineError::WrongStatus {
            status: self.state.status.as_str(),
            detail: detail.to_owned(),
        }
    }

    /// Results and failures are recorded while the run is paused too: a
    /// result that arrives is never thrown away.
    pub(crate) fn require_active(&self, what: &str) -> Result<(), MachineError> {
        if matches!(
            self.state.status,
            RunStatus::Running | RunStatus::Paused | RunStatus::Waiting
        ) {
            Ok(())
        } else {
            Err(self.wrong_status(what))
        }
    }

    pub(crate) fn require_open_model_call(&self, call_id: &str) -> Result<(), MachineError> {
        let open = self
            .state
            .node
            .as_ref()
            .and_then(|n| n.model_call.as_ref())
            .is_some_and(|c| c.call_id == call_id);
        if open {
            Ok(())
        } else {
            Err(MachineError::CallNotOpen {
                call_id: call_id.to_owned(),
                detail: "no such open model call".into(),
            })
        }
    }

    pub(crate) fn require_open_tool_call(
        &self,
        call_id: &str,
    ) -> Result<&state::ToolCallState, MachineError> {
        match self.state.tool_calls.get(call_id) {
            Some(call) if call.status == CallStatus::Open => Ok(call),
            Some(call) => Err(MachineError::CallNotOpen {
                call_id: call_id.to_owned(),
                detail: format!("it is {:?}", call.status).to_lowercase(),
            }),
            None => Err(MachineError::CallNotOpen {
                call_id: call_id.to_owned(),
                detail: "no such tool call".into(),
            }),
        }
    }

    pub(crate) fn plan(&self) -> Result<&RunPlan, MachineError> {
        self.state
            .plan
            .as_deref()
            .ok_or_else(|| MachineError::InvalidPlan("run has no plan".into()))
    }

    /// A handle on the plan, for code that changes the state while it reads
    /// the plan (a reference count, not a copy).
    fn plan_handle(&self) -> Result<std::sync::Arc<RunPlan>, MachineError> {
        self.state
            .plan
            .clone()
            .ok_or_else(|| MachineError::InvalidPlan("run has no plan".into()))
    }

    /// End the run as failed: a node could not go on.
    fn fail_run(&mut self, error: String) {
        self.emit(Event::RunFailed { error, stop: None });
        self.command(Command::CancelOpenTasks);
    }

    /// End the run, stopped by a budget or a stop condition (typed).
    fn fail_run_stop(&mut self, error: String, stop: Stop) {
        self.emit(Event::RunFailed {
            error,
            stop: Some(stop),
        });
        self.command(Command::CancelOpenTasks);
    }
}

/// A worker's task of a tool call, ready to schedule: its spec, and what a
/// worker needs to run it ([`belay_proto::pools`]).
pub(crate) struct ToolTask {
    /// The `ToolCallSpec` as JSON.
    pub(crate) spec: Value,
    /// The task's requirements.
    pub(crate) requires: Vec<String>,
}

impl ToolTask {
    /// The task of `spec` (made by [`tool_spec`] for `tool`): its
    /// requirements are those of the binding it sends (the chosen request
    /// variant's) and the tool's `pool:`.
    pub(crate) fn new(tool: &Pinned<ToolDef>, spec: Value) -> Result<Self, MachineError> {
        let binding: ToolBinding = spec
            .get("binding")
            .cloned()
            .map(serde_json::from_value)
            .transpose()
            .map_err(|e| MachineError::InvalidPlan(format!("tool spec binding: {e}")))?
            .ok_or_else(|| MachineError::InvalidPlan("tool spec without a binding".into()))?;
        let requires =
            belay_proto::pools::tool_call_requirements(&binding, tool.def.pool.as_deref());
        Ok(Self { spec, requires })
    }
}

/// The task spec of a call of `tool` with `arguments`, sending the request
/// of its `request_variants:` item `variant` (`None`: the tool's own).
pub(crate) fn tool_spec(
    tool: &Pinned<ToolDef>,
    arguments: &Value,
    key: &str,
    variant: Option<&str>,
) -> Result<Value, MachineError> {
    let binding = match &tool.def.binding {
        ToolBindingDef::Http {
            endpoint,
            method,
            headers,
            timeout_ms,
            request,
        } => ToolBinding::Http(HttpBinding {
            endpoint: endpoint.clone(),
            method: method.clone(),
            headers: headers.clone(),
            timeout_ms: *timeout_ms,
            request: request.clone(),
        }),
        ToolBindingDef::AsyncWebhook {
            endpoint,
            method,
            headers,
            timeout_ms,
            callback_url_field,
            request,
            ..
        } => ToolBinding::AsyncWebhook(AsyncWebhookBinding {
            http: HttpBinding {
                endpoint: endpoint.clone(),
                method: method.clone(),
                headers: headers.clone(),
                timeout_ms: *timeout_ms,
                request: request.clone(),
            },
            callback_url_field: callback_url_field.clone(),
        }),
        ToolBindingDef::Mcp {
            server,
            server_tool,
            headers,
            timeout_ms,
        } => ToolBinding::Mcp(McpBinding {
            server: server.clone(),
            server_tool: server_tool.clone(),
            headers: headers.clone(),
            timeout_ms: *timeout_ms,
        }),
        ToolBindingDef::McpResource {
            server,
            uri_template,
            timeout_ms,
        } => ToolBinding::McpResource(belay_proto::wire::McpResourceBinding {
            server: server.clone(),
            uri_template: uri_template.clone(),
            timeout_ms: *timeout_ms,
        }),
        ToolBindingDef::Sandbox(sandbox) => ToolBinding::Sandbox(sandbox.clone()),
        ToolBindingDef::Workflow { .. } => {
            return Err(MachineError::InvalidPlan(format!(
                "tool `{}` is not called through a worker",
                tool.def.name
            )));
        }
    };
    let binding = match variant {
        None => binding,
        Some(name) => {
            let chosen = variants::named(&tool.def, name).ok_or_else(|| {
                MachineError::InvalidPlan(format!(
                    "tool `{}` has no request variant `{name}`",
                    tool.def.name
                ))
            })?;
            variants::apply(binding, chosen)
        }
    };
    let dispatch_with_claim = dispatch_with_claim(&tool.def, &binding);
    let spec = ToolCallSpec {
        tool: tool.def.name.clone(),
        tool_version: tool.version,
        arguments: arguments.clone(),
        binding,
        idempotency_key: key.to_owned(),
        input: None,
        config_params: inject::config_params(&tool.def),
        result_secrets: tool
            .def
            .result_secrets
            .iter()
            .map(|r| belay_proto::wire::ResultSecret {
                path: r.path.clone(),
                key: r.key.clone(),
            })
            .collect(),
        variant: variant.map(str::to_owned),
        sampling: None,
        trace: None,
        dispatch_with_claim,
        repeat_safety: tool.def.repeat_safety.as_str().to_owned(),
    };
    serde_json::to_value(&spec).map_err(|e| MachineError::InvalidPlan(format!("tool spec: {e}")))
}

/// Whether a call of `def`, sent as `binding`, may have its dispatch
/// recorded when its task is leased ([`ToolCallSpec::dispatch_with_claim`]):
/// `idempotent` (retried whether or not it was dispatched, so the record
/// changes no decision), a plain HTTP request (no callback to issue), no
/// gates (their turn is taken at dispatch), and no vault values to read,
/// fill or keep (handed out or checked at dispatch).
fn dispatch_with_claim(def: &ToolDef, binding: &ToolBinding) -> bool {
    def.repeat_safety == RepeatSafety::Idempotent
        && matches!(binding, ToolBinding::Http(_))
        && !crate::gates::ToolGates::of(def).any()
        && def.secret_access.is_empty()
        && def.result_secrets.is_empty()
        && def.untraced.is_empty()
}

/// Fill absent top-level properties that declare a `default`, so the value
/// that is validated is the value that is persisted and sent.
fn fill_defaults(map: &mut Map<String, Value>, schema: &Value) {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    for (name, prop) in props {
        if !map.contains_key(name)
            && let Some(default) = prop.get("default")
        {
            map.insert(name.clone(), default.clone());
        }
    }
}

/// Put `trace`, with the span of the node visit `call_id` belongs to as
/// the parent, into a task spec (its `trace` field:
/// [`ToolCallSpec::trace`], [`belay_proto::wire::ModelCallSpec::trace`]).
fn add_trace(
    spec: &mut Value,
    trace: &belay_proto::trace::TraceContext,
    run_id: &str,
    call_id: &str,
    repeat_safety: &str,
) {
    let visit = belay_proto::trace::visit_of(call_id);
    let call = belay_proto::trace::CallTrace {
        context: trace.for_node(run_id, visit),
        call_id: call_id.to_owned(),
        repeat_safety: repeat_safety.to_owned(),
    };
    if let (Some(map), Ok(value)) = (spec.as_object_mut(), serde_json::to_value(call)) {
        map.insert("trace".to_owned(), value);
    }
}
