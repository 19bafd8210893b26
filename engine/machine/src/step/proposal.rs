//! A proposed tool call: the four checks (a refusal goes back to the
//! model as the call's result), a confirmation by a person, and the
//! launch of its task or child run.

use belay_proto::wire::ToolUse;
use serde_json::Value;

use super::{Step, ToolTask, fill_defaults, tool_spec};
use crate::command::{Command, TaskKind};
use crate::error::MachineError;
use crate::event::{Event, Stop};
use crate::{idempotency_key, inject, normalize, pii, process, untraced, variants};
use belay_definitions::model::{RepeatSafety, ToolBindingDef, ToolDef};

impl Step {
    /// Refuse a proposed call (`check` failed): the reason goes back to
    /// the model as the call's result.
    pub(super) fn refuse(&mut self, tool_use: &ToolUse, check: &str, reason: String) {
        let node = self
            .state
            .node
            .as_ref()
            .map(|n| n.id.clone())
            .unwrap_or_default();
        self.emit(Event::ToolCallRefused {
            node,
            tool_use_id: tool_use.id.clone(),
            tool: tool_use.name.clone(),
            check: check.to_owned(),
            reason,
        });
    }

    /// The four checks of DESIGN.md, in order; the first failure refuses the call.
    pub(super) fn check_and_schedule(&mut self, tool_use: ToolUse) -> Result<(), MachineError> {
        let node = self
            .state
            .node
            .as_ref()
            .ok_or_else(|| MachineError::InvalidPlan("no node is running".into()))?;
        let node_id = node.id.clone();
        let plan = self.plan()?;
        let agent = plan.agents.get(&node.agent).ok_or_else(|| {
            MachineError::InvalidPlan(format!("agent `{}` not pinned", node.agent))
        })?;
        let node_def = plan.workflow.def.nodes.iter().find(|n| n.id == node_id);
        let refuse = |check: &str, reason: String| Event::ToolCallRefused {
            node: node_id.clone(),
            tool_use_id: tool_use.id.clone(),
            tool: tool_use.name.clone(),
            check: check.to_owned(),
            reason,
        };

        // 1. On the node's list.
        let tool = match (
            agent.def.tools.iter().any(|t| t == &tool_use.name),
            plan.tools.get(&tool_use.name),
        ) {
            (true, Some(tool)) => tool,
            _ => {
                let event = refuse(
                    "not_on_list",
                    format!(
                        "tool `{}` is not available here; available tools: {}",
                        tool_use.name,
                        agent.def.tools.join(", ")
                    ),
                );
                self.emit(event);
                return Ok(());
            }
        };

        // 2. Arguments decode into the input type within the size limit
        // (the type the model sees: parameters it does not supply are
        // refused), then those parameters are filled in.
        // An agent that redacts PII: tokens get their data back, where the
        // tool's `pii_access` allows (`pii.rs`), before anything is checked.
        let restored = match self.state.node.as_ref() {
            Some(node) if !agent.def.pii_redaction.is_empty() => {
                // The table as the model's request was built (`pii.rs`).
                match pii::Redactor::new(&node.pii, &agent.def.pii_redaction)
                    .restore_arguments(&tool_use.arguments, tool.def.pii_access)
                {
                    Ok(arguments) => Some(arguments),
                    Err(refusal) => {
                        let event = refuse("pii_access", refusal.reason(&tool_use.name));
                        self.emit(event);
                        return Ok(());
                    }
                }
            }
            _ => None,
        };
        let raw_arguments = restored.as_deref().unwrap_or(&tool_use.arguments);
        let limit = agent.def.max_argument_bytes as usize;
        let mut arguments = match decode_arguments(raw_arguments, limit, &tool.def) {
            Ok(args) => args,
            Err(reason) => {
                let event = refuse("invalid_arguments", reason);
                self.emit(event);
                return Ok(());
            }
        };
        // `visibility.trace: false` arguments: placeholders, each with its
        // sealed value (else the call is refused before it can act).
        let untraced_values = match untraced::sealed_for(&tool.def, &arguments, &self.arg_secrets) {
            Ok(values) => values,
            Err((check, reason)) => {
                let event = refuse(check, reason);
                self.emit(event);
                return Ok(());
            }
        };
        // What the model chose, for `max_identical_calls` below.
        let chosen = arguments.clone();
        let call_id = self
            .state
            .node
            .as_ref()
            .map(|n| format!("{}.t{}", n.prefix, n.tool_calls + 1))
            .unwrap_or_default();
        let key = idempotency_key(&self.state.run_id, &call_id);
        if let Value::Object(map) = &mut arguments {
            let facts = inject::CallFacts {
                run_id: &self.state.run_id,
                node_id: &node_id,
                call_id: &call_id,
                idempotency_key: &key,
                tenant: &self.state.tenant,
                caller: &self.state.caller,
                now: self.state.now,
            };
            if let Err(reason) = inject::inject(&tool.def, map, &self.state.document(), &facts) {
                let event = refuse(
                    "parameter_source",
                    format!("tool `{}` cannot be called here: {reason}", tool_use.name),
                );
                self.emit(event);
                return Ok(());
            }
        }
        // The tool's `process.before`: preconditions, computed parameters.
        let mut before_skipped = None;
        if let (Some(before), Value::Object(map)) = (
            tool.def.process.as_ref().and_then(|p| p.before.as_ref()),
            &arguments,
        ) {
            match process::before(&tool.def, before, map) {
                process::Before::Go {
                    arguments: computed,
                    skipped,
                } => {
                    arguments = Value::Object(computed);
                    before_skipped = skipped;
                }
                process::Before::Refuse {
                    check,
                    reason,
                    fail_run,
                } => {
                    let event = refuse(check, reason);
                    self.emit(event);
                    if let Some(error) = fail_run {
                        self.fail_run(error);
                    }
                    return Ok(());
                }
            }
        }
        // The request the call sends, chosen from the arguments as sent.
        let variant = match variants::choose(&tool.def, &arguments) {
            Ok(variant) => variant,
            Err(reason) => {
                let event = refuse("request_variant", format!("{reason}; nothing was sent"));
                self.emit(event);
                return Ok(());
            }
        };

        // 3. Permission granted to node, caller and tenant.
        let permission = &tool.def.permission;
        let node_has = agent.def.grants.contains(permission)
            || node_def.is_some_and(|n| n.grants.contains(permission));
        let missing: Vec<&str> = [
            ("node", node_has),
            ("caller", self.state.caller_grants.contains(permission)),
            ("tenant", self.state.tenant_grants.contains(permission)),
        ]
        .into_iter()
        .filter(|(_, ok)| !ok)
        .map(|(who, _)| who)
        .collect();
        if !missing.is_empty() {
            let event = refuse(
                "permission",
                format!(
                    "tool `{}` needs permission `{permission}`, which is not granted to the {}",
                    tool_use.name,
                    missing.join(", ")
                ),
            );
            self.emit(event);
            return Ok(());
        }

        // 4. Budget has room.
        let (_, max_tool_calls) = agent.def.loop_policy.bounds();
        let node_state = self
            .state
            .node
            .as_ref()
            .ok_or_else(|| MachineError::InvalidPlan("no node is running".into()))?;
        if let Some(run_max) = plan.workflow.def.budget.max_tool_calls
            && self.state.totals.tool_calls >= run_max
        {
            let event = refuse(
                "budget",
                format!(
                    "the tool call budget of this run is used up ({run_max} calls); answer with what you have"
                ),
            );
            self.emit(event);
            return Ok(());
        }
        if node_state.tool_calls >= max_tool_calls {
            let event = refuse(
                "budget",
                format!(
                    "the tool call budget of this agent is used up ({max_tool_calls} calls); answer with what you have"
                ),
            );
            self.emit(event);
            return Ok(());
        }
        if let Some(max_tokens) = agent.def.budget.max_tokens
            && node_state.tokens >= max_tokens
        {
            let event = refuse(
                "budget",
                format!("the token budget of this agent is used up ({max_tokens} tokens)"),
            );
            self.emit(event);
            return Ok(());
        }

        // The same call, again and again, is not progress.
        let max_identical = agent.def.max_identical_calls;
        if max_identical > 0
            && let Some((tool_name, args, times)) = &node_state.last_call
            && tool_name == &tool_use.name
            && args == &chosen
            && times + 1 >= max_identical
        {
            let times = times + 1;
            let event = refuse(
                "no_progress",
                format!("the same call was proposed {times} times in a row"),
            );
            let tool = tool_use.name.clone();
            self.emit(event);
            self.fail_run_stop(
                format!(
                    "the model proposed the same call of tool `{tool}` {times} times in a row in node `{node_id}` without progress (`max_identical_calls: {max_identical}`)"
                ),
                Stop::NoProgress {
                    node: node_id,
                    tool,
                    times,
                },
            );
            return Ok(());
        }
        let child = matches!(tool.def.binding, ToolBindingDef::Workflow { .. })
            .then(|| (tool.def.binding.clone(), arguments.clone()));
        let spec = match child {
            None => Some(ToolTask::new(
                tool,
                self.with_sampling(
                    tool_spec(tool, &arguments, &key, variant.as_deref())?,
                    &node_id,
                    &tool.def,
                ),
            )?),
            Some(_) => None,
        };
        let repeat_safety = tool.def.repeat_safety;
        let event = Event::ToolCallScheduled {
            node: node_id.clone(),
            call_id: call_id.clone(),
            tool_use_id: tool_use.id.clone(),
            tool: tool.def.name.clone(),
            tool_version: tool.version,
            arguments,
            idempotency_key: key.clone(),
            repeat_safety,
            variant,
            starts_node: false,
        };
        let (confirmation, tool_name) = (tool.def.confirmation.clone(), tool.def.name.clone());
        self.emit(event);
        self.vault_arguments(&call_id, &tool_name, untraced_values);
        if let Some((outcome, message, why)) = before_skipped {
            self.emit(Event::ToolCallProcessed {
                call_id: call_id.clone(),
                tool: tool_name.clone(),
                stage: "before".to_owned(),
                outcome: outcome.to_owned(),
                message,
                error: Some(why),
                result: None,
            });
        }
        if let Some(confirmation) = confirmation {
            self.request_confirmation(&node_id, &call_id, &tool_name, &confirmation);
            return Ok(());
        }
        self.launch_call(&node_id, &call_id, key, repeat_safety, spec, child);
        Ok(())
    }

    /// A call of a tool with `confirmation:`: nothing is dispatched until a
    /// person decides ([`Step::on_confirmation`]).
    pub(super) fn request_confirmation(
        &mut self,
        node: &str,
        call_id: &str,
        tool: &str,
        confirmation: &belay_definitions::model::ConfirmationDef,
    ) {
        let arguments = self
            .state
            .tool_calls
            .get(call_id)
            .map(|c| c.arguments.clone())
            .unwrap_or(Value::Null);
        self.emit(Event::ConfirmationRequested {
            node: node.to_owned(),
            call_id: call_id.to_owned(),
            tool: tool.to_owned(),
            arguments,
            approver_grant: confirmation.approver_grant.clone(),
            immutable_params: confirmation.immutable_params.clone(),
        });
    }

    /// Start a scheduled call: its task (a worker's tool) or its child run
    /// (a `type: workflow` tool).
    pub(super) fn launch_call(
        &mut self,
        node_id: &str,
        call_id: &str,
        key: String,
        repeat_safety: RepeatSafety,
        spec: Option<ToolTask>,
        child: Option<(ToolBindingDef, Value)>,
    ) {
        match (spec, child) {
            (Some(ToolTask { spec, requires }), _) => {
                if let Some(key) = self.cache_key_of(call_id) {
                    self.command(Command::LookupToolCache {
                        call_id: call_id.to_owned(),
                        key,
                    });
                }
                self.command(Command::ScheduleTask {
                    call_id: call_id.to_owned(),
                    kind: TaskKind::ToolCall,
                    spec,
                    idempotency_key: key,
                    repeat_safety: Some(repeat_safety),
                    runs_while_paused: false,
                    requires,
                })
            }
            (None, Some((binding, arguments))) => {
                self.start_tool_child(node_id, call_id, &binding, &arguments)
            }
            (None, None) => {}
        }
    }

    /// A decision on a call's confirmation (`DecideApproval` naming the
    /// call id): the approver needs the grant; edits may not touch
    /// immutable params and must match the tool's input type; the call then
    /// runs with exactly the approved arguments, or fails with "the user
    /// declined".
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_confirmation(
        &mut self,
        call_id: String,
        approve: bool,
        edited: Option<Value>,
        by: String,
        grants: Vec<String>,
        reason: String,
    ) -> Result<(), MachineError> {
        let call = self.require_open_tool_call(&call_id)?.clone();
        let Some((grant, immutable)) = call.awaiting_confirmation.clone() else {
            return Err(MachineError::NotWaiting(format!(
                "call `{call_id}` does not wait for a confirmation"
            )));
        };
        if !grants.contains(&grant) {
            return Err(MachineError::NotAllowed(format!(
                "confirming call `{call_id}` of tool `{}` needs the grant `{grant}`",
                call.tool
            )));
        }
        let plan = self.plan_handle()?;
        let tool = plan
            .tools
            .get(&call.tool)
            .ok_or_else(|| MachineError::InvalidPlan(format!("tool `{}` not pinned", call.tool)))?;
        let (arguments, was_edited) = match (approve, edited) {
            (true, Some(edit)) => {
                let Value::Object(mut map) = normalize::strip_nul_value(edit) else {
                    return Err(MachineError::InvalidEdit {
                        node: call_id,
                        errors: vec!["/: the edited arguments must be a JSON object".into()],
                    });
                };
                let mut errors: Vec<String> = immutable
                    .iter()
                    .filter(|p| map.get(p.as_str()) != call.arguments.get(p.as_str()))
                    .map(|p| {
                        format!(
                            "/{p}: `{p}` is immutable (`immutable_params`) and may not be edited"
                        )
                    })
                    .collect();
                // Injected parameters are the definition's, not the
                // approver's: one left out is filled in again, one written
                // must be what it was. They are computed again from the
                // edited arguments (an `expr` or `lookup` reading `.args`
                // follows the edit), so what runs is what the decision
                // records.
                for p in &tool.def.injected {
                    if let Some(v) = map.remove(&p.name)
                        && Some(&v) != call.arguments.get(&p.name)
                    {
                        errors.push(format!(
                            "/{0}: `{0}` is filled in by the tool's definition (`source:` or `hidden:`), not by the approver; leave it out",
                            p.name
                        ));
                    }
                }
                // Parameters `process.before` computed are the
                // definition's too: computed again from the edit below.
                let before = tool.def.process.as_ref().and_then(|p| p.before.as_ref());
                for name in before.iter().flat_map(|b| b.params.keys()) {
                    if let Some(v) = map.remove(name)
                        && Some(&v) != call.arguments.get(name)
                    {
                        errors.push(format!(
                            "/{name}: `{name}` is computed by the tool's `process.before`, not by the approver; leave it out"
                        ));
                    }
                }
                fill_defaults(&mut map, tool.def.model_schema());
                if errors.is_empty() {
                    let facts = inject::CallFacts {
                        run_id: &self.state.run_id,
                        node_id: &call.node,
                        call_id: &call_id,
                        idempotency_key: &call.idempotency_key,
                        tenant: &self.state.tenant,
                        caller: &self.state.caller,
                        now: self.state.now,
                    };
                    match inject::inject(&tool.def, &mut map, &self.state.document(), &facts) {
                        Ok(()) => inject::keep_proposal_time(&tool.def, &call.arguments, &mut map),
                        Err(reason) => errors.push(format!("/: {reason}")),
                    }
                }
                let mut value = Value::Object(map);
                if let Err(e) = belay_definitions::validate_json(&tool.def.input_schema, &value) {
                    errors.extend(e);
                }
                // `process.before` over the edited arguments: a refusal
                // (or a stage that fails) refuses the edit; `warn` and
                // `use_original` keep the edit as written.
                if errors.is_empty()
                    && let (Some(before), Value::Object(map)) = (before, &value)
                {
                    match process::before(&tool.def, before, map) {
                        process::Before::Go { arguments, .. } => value = Value::Object(arguments),
                        process::Before::Refuse { reason, .. } => errors.push(format!(
                            "/: the tool's `process.before` refuses the edited arguments: {reason}"
                        )),
                    }
                }
                if !errors.is_empty() {
                    return Err(MachineError::InvalidEdit {
                        node: call_id,
                        errors,
                    });
                }
                let changed = value != call.arguments;
                (value, changed)
            }
            (true, None) => (call.arguments.clone(), false),
            (false, _) => (Value::Null, false),
        };
        // The request the approved arguments send: chosen again after an
        // edit (a `when` that fails refuses the edit, nothing is decided).
        let variant = match (approve, was_edited) {
            (true, true) => variants::choose(&tool.def, &arguments).map_err(|reason| {
                MachineError::InvalidEdit {
                    node: call_id.clone(),
                    errors: vec![format!("/: {reason}")],
                }
            })?,
            (true, false) => call.variant.clone(),
            (false, _) => None,
        };
        self.emit(Event::ConfirmationDecided {
            call_id: call_id.clone(),
            approved: approve,
            by: by.clone(),
            reason: reason.clone(),
            arguments: arguments.clone(),
            edited: was_edited,
            variant: variant.clone(),
        });
        if !approve {
            self.emit(Event::ToolCallFailed {
                call_id,
                attempt: 0,
                error: if reason.trim().is_empty() {
                    format!("the user declined (decided by {by})")
                } else {
                    format!("the user declined (decided by {by}): {reason}")
                },
                kind: None,
            });
            return Ok(());
        }
        let key = call.idempotency_key.clone();
        let child = matches!(tool.def.binding, ToolBindingDef::Workflow { .. })
            .then(|| (tool.def.binding.clone(), arguments.clone()));
        let spec = match child {
            None => Some(ToolTask::new(
                tool,
                self.with_sampling(
                    tool_spec(tool, &arguments, &key, variant.as_deref())?,
                    &call.node,
                    &tool.def,
                ),
            )?),
            Some(_) => None,
        };
        self.launch_call(&call.node, &call_id, key, call.repeat_safety, spec, child);
        Ok(())
    }
}

/// Check 2: the arguments are JSON within `limit` bytes, an object that
/// names none of the parameters the model does not supply, and valid
/// against the schema the model was given once its defaults are filled in.
fn decode_arguments(raw: &str, limit: usize, def: &ToolDef) -> Result<Value, String> {
    let schema = def.model_schema();
    if raw.len() > limit {
        return Err(format!(
            "arguments are {} bytes, more than the limit of {limit} bytes",
            raw.len()
        ));
    }
    let raw = if raw.trim().is_empty() { "{}" } else { raw };
    let value: Value = serde_json::from_str(raw)
        .map_err(|e| format!("arguments are not valid JSON ({e}); send a JSON object"))?;
    let mut value = normalize::strip_nul_value(value);
    if def.strict_schema.is_some() {
        // The strict schema made optional parameters nullable: a `null`
        // there means "not given" (the default applies, as when left out).
        belay_definitions::strict::strip_optional_nulls(schema, &mut value);
    }
    let Value::Object(mut map) = value else {
        return Err("arguments must be a JSON object".into());
    };
    let sent = inject::sent_anyway(def, &map);
    if !sent.is_empty() {
        return Err(inject::not_yours(&sent));
    }
    fill_defaults(&mut map, schema);
    let value = Value::Object(map);
    belay_definitions::validate_json(schema, &value).map_err(|errors| {
        format!(
            "arguments do not match the tool's input schema: {}",
            errors.join("; ")
        )
    })?;
    Ok(value)
}
