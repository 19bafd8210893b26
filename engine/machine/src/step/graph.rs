//! The workflow graph: `advance` derives the next work from the state
//! (the next model call, the end of an agent node, the next node, the
//! end of the run); starting a node, and a tool node's call.

use belay_proto::wire::{ChatMessage, ModelCallSpec, ToolSchema};
use serde_json::{Value, json};

use super::{Step, ToolTask, fill_defaults, tool_spec};
use crate::command::{Command, TaskKind};
use crate::error::MachineError;
use crate::event::{Event, Stop, TimerPurpose, TimerSpec};
use crate::plan::RunPlan;
use crate::state::{CallStatus, RunStatus, StepKind, StepState};
use crate::{
    TOOL_NODE_MAX_ARGUMENT_BYTES, idempotency_key, inject, normalize, pii, process, state, variants,
};
use belay_definitions::expr::Template;
use belay_definitions::model::{AgentDef, Budget, NodeKind, ToolBindingDef};

/// Why starting a node stopped: the machine refused, or the run fails (a
/// template could not be rendered, a `fail` node).
enum Halt {
    Machine(MachineError),
    Fail(String),
}

impl From<MachineError> for Halt {
    fn from(e: MachineError) -> Self {
        Halt::Machine(e)
    }
}

impl Step {
    /// Derive follow-up work from the state until nothing more can happen now.
    pub(crate) fn advance(&mut self) -> Result<(), MachineError> {
        loop {
            if self.state.status != RunStatus::Running {
                return Ok(());
            }
            if let Some(step) = self.state.step.clone() {
                if self.advance_step(&step)? {
                    continue;
                }
                return Ok(());
            }
            let Some(node) = self.state.node.clone() else {
                // Between nodes: start the next one or finish the run.
                let plan = self.plan_handle()?;
                let next = match self.state.last_completed.as_ref() {
                    None => Some(plan.workflow.def.start.clone()),
                    Some((last, _)) => self.state.chosen_next.clone().or_else(|| {
                        plan.workflow
                            .def
                            .nodes
                            .iter()
                            .find(|n| &n.id == last)
                            .and_then(|n| n.next.clone())
                    }),
                };
                match next {
                    Some(id) => self.start_node(&plan, &id)?,
                    None => {
                        let output = self.previous_output().unwrap_or(Value::Null);
                        self.emit(Event::RunCompleted { output });
                    }
                }
                continue;
            };
            if node.model_call.is_some() || !node.pending.is_empty() {
                return Ok(()); // waiting for a worker
            }
            let plan = self.plan()?;
            let agent = plan
                .agents
                .get(&node.agent)
                .ok_or_else(|| {
                    MachineError::InvalidPlan(format!("agent `{}` not pinned", node.agent))
                })?
                .def
                .clone();
            if !plan.workflow.def.nodes.iter().any(|n| n.id == node.id) {
                return Err(MachineError::InvalidPlan(format!("no node `{}`", node.id)));
            }
            match node.transcript.last() {
                Some(ChatMessage::Assistant {
                    content,
                    tool_calls,
                }) if tool_calls.is_empty() => {
                    // A final answer: JSON if it parses, text otherwise;
                    // with an `output_schema:`, JSON that satisfies it, or
                    // the model is asked again.
                    let mut text = content.clone().unwrap_or_default();
                    // The answer is the node's output: every token gets
                    // its data back (`pii.rs`).
                    let redactor = pii::Redactor::new(&node.pii, &agent.pii_redaction);
                    if !agent.pii_redaction.is_empty() {
                        text = redactor.restore_all(&text);
                    }
                    let output = match &agent.output_schema {
                        None => serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text)),
                        Some(schema) => match checked_final_answer(schema, &text) {
                            Ok(value) => value,
                            Err(errors) => {
                                let message = format!(
                                    "Your final answer does not match the required output schema: {}. \
                                     Answer again with only a JSON value that matches this JSON Schema: {schema}",
                                    errors.join("; ")
                                );
                                // The errors quote the answer with its data
                                // back: the model reads tokens again.
                                let message = if agent.pii_redaction.is_empty() {
                                    message
                                } else {
                                    redactor.redact_text(&message)
                                };
                                self.emit(Event::FinalAnswerRefused {
                                    node: node.id.clone(),
                                    errors,
                                    message,
                                });
                                // The next pass calls the model again, within
                                // the node's budget.
                                continue;
                            }
                        },
                    };
                    self.emit(Event::NodeCompleted {
                        node: node.id.clone(),
                        output,
                        next: None,
                    });
                }
                _ => {
                    let run_budget = plan.workflow.def.budget.clone();
                    if let Some((error, stop)) =
                        out_of_budget(&agent, &node, &run_budget, &self.state.totals)
                    {
                        self.fail_run_stop(error, stop);
                        continue;
                    }
                    let step = node.model_steps + 1;
                    let call_id = format!("{}.m{step}", node.prefix);
                    let tools = agent
                        .tools
                        .iter()
                        .filter_map(|name| plan.tools.get(name))
                        .map(|t| ToolSchema {
                            name: t.def.name.clone(),
                            description: t.def.description.clone(),
                            parameters: t
                                .def
                                .strict_schema
                                .as_ref()
                                .unwrap_or(t.def.model_schema())
                                .clone(),
                            strict: t.def.strict_schema.is_some(),
                        })
                        .collect();
                    // An agent that redacts PII sends tokens in its
                    // place (`pii.rs`).
                    // New values (or origins) are recorded first, so a
                    // token keeps its value for the whole visit.
                    let (messages, issued) = if agent.pii_redaction.is_empty() {
                        (node.transcript.clone(), Vec::new())
                    } else {
                        let to_model =
                            |tool: &str| plan.tools.get(tool).is_some_and(|t| t.def.pii_access.llm);
                        let mut redactor = pii::Redactor::new(&node.pii, &agent.pii_redaction);
                        redactor.learn(&node.transcript, to_model);
                        (
                            redactor.redact_messages(&node.transcript, to_model),
                            redactor.changed(),
                        )
                    };
                    let spec = ModelCallSpec {
                        model: agent.model.clone(),
                        messages,
                        tools,
                        max_output_tokens: agent.max_output_tokens,
                        trace: None,
                    };
                    let spec = serde_json::to_value(&spec)
                        .map_err(|e| MachineError::InvalidPlan(format!("model spec: {e}")))?;
                    let key = idempotency_key(&self.state.run_id, &call_id);
                    if !issued.is_empty() {
                        self.emit(Event::PiiTokensIssued {
                            node: node.id.clone(),
                            entries: issued,
                        });
                    }
                    self.emit(Event::ModelCallScheduled {
                        node: node.id.clone(),
                        call_id: call_id.clone(),
                        step,
                    });
                    self.command(Command::ScheduleTask {
                        call_id,
                        kind: TaskKind::ModelCall,
                        spec,
                        idempotency_key: key,
                        repeat_safety: None,
                        runs_while_paused: false,
                        requires: belay_proto::pools::model_call_requirements(
                            agent.pool.as_deref(),
                            agent.provider.as_deref(),
                        ),
                    });
                    return Ok(());
                }
            }
        }
    }

    /// Start node `id`: emit `NodeStarted`, and finish at once the nodes
    /// that need nothing from outside (branch, set, fail, succeed).
    fn start_node(&mut self, plan: &RunPlan, id: &str) -> Result<(), MachineError> {
        match self.try_start_node(plan, id) {
            Ok(()) => Ok(()),
            Err(Halt::Fail(error)) => {
                self.fail_run(error);
                Ok(())
            }
            Err(Halt::Machine(e)) => Err(e),
        }
    }

    /// [`Step::start_node`]; a template that cannot be rendered is
    /// [`Halt::Fail`] (the run fails, nothing of the node is written).
    fn try_start_node(&mut self, plan: &RunPlan, id: &str) -> Result<(), Halt> {
        let def = plan
            .workflow
            .def
            .nodes
            .iter()
            .find(|n| n.id == id)
            .ok_or_else(|| MachineError::InvalidPlan(format!("no node `{id}`")))?
            .clone();
        let doc = self.state.document();
        let render = |t: &Template, what: &str| {
            t.render(&doc)
                .map_err(|e| Halt::Fail(format!("node `{id}`: `{what}`: {e}")))
        };
        match &def.kind {
            NodeKind::Agent { agent, input } => {
                let input = match input {
                    Some(t) => render(t, "input")?,
                    None => self.previous_output_or_input(),
                };
                // The agent's wall-time budget: a durable timer from now,
                // its id unique per visit (`<node>~<n>.deadline`).
                let deadline = plan
                    .agents
                    .get(agent)
                    .and_then(|a| a.def.budget.max_wall_time_ms)
                    .map(|ms| TimerSpec {
                        timer_id: format!("{}.deadline", self.next_prefix(id)),
                        after_ms: Some(ms),
                        at: None,
                        purpose: TimerPurpose::Deadline,
                    });
                self.emit(Event::NodeStarted {
                    node: id.to_owned(),
                    input,
                    deadline: deadline.clone(),
                });
                if let Some(timer) = deadline {
                    self.command(Command::ScheduleTimer(timer));
                }
            }
            NodeKind::Tool { tool, args, .. } => {
                let args = render(args, "args")?;
                self.emit(Event::NodeStarted {
                    node: id.to_owned(),
                    input: args.clone(),
                    deadline: None,
                });
                self.schedule_node_tool(plan, &def, tool, args)?;
            }
            NodeKind::Wait(wait) => self.start_wait(&def, wait, &doc)?,
            NodeKind::Workflow {
                workflow,
                input,
                mode,
                timeout_ms,
                ..
            } => {
                let input = match input {
                    Some(t) => render(t, "input")?,
                    None => self.previous_output_or_input(),
                };
                self.emit(Event::NodeStarted {
                    node: id.to_owned(),
                    input: input.clone(),
                    deadline: None,
                });
                let prefix = self.step_prefix(id);
                let (child_run_id, sync) = self.start_child(
                    id,
                    &format!("{prefix}.c1"),
                    workflow,
                    input,
                    *mode,
                    *timeout_ms,
                    format!("{prefix}.timeout"),
                );
                if !sync {
                    self.emit(Event::NodeCompleted {
                        node: id.to_owned(),
                        output: json!({"run_id": child_run_id}),
                        next: None,
                    });
                }
            }
            NodeKind::Approval(approval) => {
                let subject = render(&approval.subject, "subject")?;
                let prompt = approval
                    .prompt
                    .as_ref()
                    .map(|p| render(p, "prompt"))
                    .transpose()?;
                self.emit(Event::NodeStarted {
                    node: id.to_owned(),
                    input: subject.clone(),
                    deadline: None,
                });
                let prefix = self.step_prefix(id);
                let timer = approval.timeout_ms.map(|ms| TimerSpec {
                    timer_id: format!("{prefix}.timeout"),
                    after_ms: Some(ms),
                    at: None,
                    purpose: TimerPurpose::Timeout,
                });
                self.emit(Event::ApprovalRequested {
                    node: id.to_owned(),
                    request_id: state::approval_request_id(&prefix),
                    subject,
                    prompt,
                    approver_grant: approval.approver_grant.clone(),
                    allow_edits: approval.allow_edits,
                    timer: timer.clone(),
                });
                if let Some(timer) = timer {
                    self.command(Command::ScheduleTimer(timer));
                }
            }
            NodeKind::Branch { cases, default } => {
                let mut chosen: Option<(usize, String)> = None;
                for (i, case) in cases.iter().enumerate() {
                    match case.when.eval(&doc) {
                        Ok(v) if !matches!(v, Value::Null | Value::Bool(false)) => {
                            chosen = Some((i, case.next.clone()));
                            break;
                        }
                        Ok(_) => {}
                        Err(e) => {
                            // The node started, and failed the run.
                            self.emit(Event::NodeStarted {
                                node: id.to_owned(),
                                input: Value::Null,
                                deadline: None,
                            });
                            return Err(Halt::Fail(format!(
                                "node `{id}`: `when` of case {}: {e}",
                                i + 1
                            )));
                        }
                    }
                }
                let (output, next) = match chosen {
                    Some((i, next)) => (json!({"case": i + 1, "next": next}), Some(next)),
                    None => (
                        json!({"case": null, "next": default.clone().or_else(|| def.next.clone())}),
                        default.clone(),
                    ),
                };
                self.pass_node(id, output, next);
            }
            NodeKind::Set { values } => {
                let values = match render(values, "values")? {
                    v @ Value::Object(_) => v,
                    other => {
                        return Err(Halt::Fail(format!(
                            "node `{id}`: `values` must render to an object, not {other}"
                        )));
                    }
                };
                self.pass_node(id, values, None);
            }
            NodeKind::Fail { error } => {
                self.emit(Event::NodeStarted {
                    node: id.to_owned(),
                    input: Value::Null,
                    deadline: None,
                });
                let message = match render(error, "error") {
                    Ok(Value::String(s)) => s,
                    Ok(other) => other.to_string(),
                    Err(Halt::Fail(e)) => e,
                    Err(e) => return Err(e),
                };
                return Err(Halt::Fail(format!("node `{id}`: {message}")));
            }
            NodeKind::Succeed { output } => {
                let output = match output {
                    Some(t) => render(t, "output")?,
                    None => self.previous_output().unwrap_or(Value::Null),
                };
                self.pass_node(id, output, None);
            }
        }
        Ok(())
    }

    /// Record node `id` starting and ending in this decision (input `null`):
    /// one [`Event::NodePassed`] where every engine reads it
    /// ([`crate::level::NODE_PASSED`]), a
    /// `NodeStarted` and a `NodeCompleted` otherwise; both fold to the same
    /// state.
    fn pass_node(&mut self, id: &str, output: Value, next: Option<String>) {
        let node = id.to_owned();
        if self.state.fleet_level >= crate::level::NODE_PASSED {
            self.emit(Event::NodePassed { node, output, next });
            return;
        }
        self.emit(Event::NodeStarted {
            node: node.clone(),
            input: Value::Null,
            deadline: None,
        });
        self.emit(Event::NodeCompleted { node, output, next });
    }

    /// The output of the latest completed node, if any.
    fn previous_output(&self) -> Option<Value> {
        self.state.last_completed.as_ref().map(|(_, o)| o.clone())
    }

    /// A node's default input: the previous node's output, or the run input
    /// for the first node.
    fn previous_output_or_input(&self) -> Value {
        self.previous_output()
            .unwrap_or_else(|| self.state.input.clone())
    }

    /// The prefix the next visit of node `id` gets (the fold's rule:
    /// `<node>` on the first visit, `<node>~<n>` on the n-th).
    fn next_prefix(&self, id: &str) -> String {
        crate::visit_prefix(id, self.state.visits.get(id).copied().unwrap_or(0) + 1)
    }

    /// The call/timer id prefix of the step being started.
    pub(super) fn step_prefix(&self, id: &str) -> String {
        self.state
            .step
            .as_ref()
            .filter(|s| s.id == id)
            .map(|s| s.prefix.clone())
            .unwrap_or_else(|| id.to_owned())
    }

    /// A tool node's call: the same checks as a model's proposal (input
    /// type, permission of node, caller and tenant), then a task.
    fn schedule_node_tool(
        &mut self,
        plan: &RunPlan,
        def: &belay_definitions::model::NodeDef,
        tool_name: &str,
        args: Value,
    ) -> Result<(), MachineError> {
        let tool = plan
            .tools
            .get(tool_name)
            .ok_or_else(|| MachineError::InvalidPlan(format!("tool `{tool_name}` not pinned")))?;
        let Value::Object(mut map) = normalize::strip_nul_value(args) else {
            self.fail_run(format!(
                "node `{}`: `args` of tool `{tool_name}` must render to an object",
                def.id
            ));
            return Ok(());
        };
        let sent = inject::sent_anyway(&tool.def, &map);
        if !sent.is_empty() {
            self.fail_run(format!(
                "node `{}`: `args` of tool `{tool_name}` set {}, which the tool's definition supplies itself (`source:` or `hidden:`)",
                def.id,
                sent.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
            ));
            return Ok(());
        }
        fill_defaults(&mut map, tool.def.model_schema());
        let call_id = format!("{}.t1", self.step_prefix(&def.id));
        let key = idempotency_key(&self.state.run_id, &call_id);
        let facts = inject::CallFacts {
            run_id: &self.state.run_id,
            node_id: &def.id,
            call_id: &call_id,
            idempotency_key: &key,
            tenant: &self.state.tenant,
            caller: &self.state.caller,
            now: self.state.now,
        };
        if let Err(reason) = inject::inject(&tool.def, &mut map, &self.state.document(), &facts) {
            self.fail_run(format!("node `{}`: tool `{tool_name}`: {reason}", def.id));
            return Ok(());
        }
        let arguments = Value::Object(map);
        // The same bound as a model's proposal (measured as the JSON that
        // is persisted and sent).
        let size = serde_json::to_string(&arguments).map_or(usize::MAX, |s| s.len());
        if size > TOOL_NODE_MAX_ARGUMENT_BYTES {
            self.fail_run(format!(
                "node `{}`: `args` of tool `{tool_name}` are {size} bytes, more than the limit of {TOOL_NODE_MAX_ARGUMENT_BYTES} bytes",
                def.id
            ));
            return Ok(());
        }
        if let Err(errors) = belay_definitions::validate_json(&tool.def.input_schema, &arguments) {
            self.fail_run(format!(
                "node `{}`: `args` do not match the input type of tool `{tool_name}`: {}",
                def.id,
                errors.join("; ")
            ));
            return Ok(());
        }
        // `process.before`, over arguments of the tool's input type: no
        // model to re-ask, so any refusal fails the run.
        let mut before_skipped = None;
        let mut computed = None;
        if let Some(before) = tool.def.process.as_ref().and_then(|p| p.before.as_ref()) {
            let Value::Object(map) = &arguments else {
                return Err(MachineError::InvalidPlan("arguments are an object".into()));
            };
            match process::before(&tool.def, before, map) {
                process::Before::Go { arguments, skipped } => {
                    computed = Some(arguments);
                    before_skipped = skipped;
                }
                process::Before::Refuse {
                    reason, fail_run, ..
                } => {
                    let error = fail_run.unwrap_or_else(|| {
                        format!("tool `{tool_name}`: `process.before` refused the call: {reason}")
                    });
                    self.fail_run(format!("node `{}`: {error}", def.id));
                    return Ok(());
                }
            }
        }
        let arguments = computed.map(Value::Object).unwrap_or(arguments);
        let permission = &tool.def.permission;
        let missing: Vec<&str> = [
            ("node", def.grants.contains(permission)),
            ("caller", self.state.caller_grants.contains(permission)),
            ("tenant", self.state.tenant_grants.contains(permission)),
        ]
        .into_iter()
        .filter(|(_, ok)| !ok)
        .map(|(who, _)| who)
        .collect();
        if !missing.is_empty() {
            self.fail_run(format!(
                "node `{}`: tool `{tool_name}` needs permission `{permission}`, which is not granted to the {}",
                def.id,
                missing.join(", ")
            ));
            return Ok(());
        }
        let variant = match variants::choose(&tool.def, &arguments) {
            Ok(variant) => variant,
            Err(reason) => {
                self.fail_run(format!(
                    "node `{}`: tool `{tool_name}`: {reason}; nothing was sent",
                    def.id
                ));
                return Ok(());
            }
        };
        let child = matches!(tool.def.binding, ToolBindingDef::Workflow { .. })
            .then(|| (tool.def.binding.clone(), arguments.clone()));
        let spec = match child {
            None => Some(ToolTask::new(
                tool,
                tool_spec(tool, &arguments, &key, variant.as_deref())?,
            )?),
            Some(_) => None,
        };
        let repeat_safety = tool.def.repeat_safety;
        self.emit(Event::ToolCallScheduled {
            node: def.id.clone(),
            call_id: call_id.clone(),
            tool_use_id: String::new(),
            tool: tool.def.name.clone(),
            tool_version: tool.version,
            arguments,
            idempotency_key: key.clone(),
            repeat_safety,
            variant,
            starts_node: false,
        });
        if let Some((outcome, message, why)) = before_skipped {
            self.emit(Event::ToolCallProcessed {
                call_id: call_id.clone(),
                tool: tool.def.name.clone(),
                stage: "before".to_owned(),
                outcome: outcome.to_owned(),
                message,
                error: Some(why),
                result: None,
            });
        }
        if let Some(confirmation) = &tool.def.confirmation {
            self.request_confirmation(&def.id, &call_id, &tool.def.name, confirmation);
            return Ok(());
        }
        self.launch_call(&def.id, &call_id, key, repeat_safety, spec, child);
        Ok(())
    }

    /// Follow-up of a non-agent node in progress; `true` when something
    /// was emitted.
    fn advance_step(&mut self, step: &StepState) -> Result<bool, MachineError> {
        let StepKind::Tool { call_id } = &step.kind else {
            return Ok(false); // waiting for a signal, timer or decision
        };
        let Some(call) = self.state.tool_calls.get(call_id).cloned() else {
            return Ok(false);
        };
        match call.status {
            CallStatus::Completed => {
                self.emit(Event::NodeCompleted {
                    node: step.id.clone(),
                    output: call.result.unwrap_or(Value::Null),
                    next: None,
                });
                Ok(true)
            }
            CallStatus::Failed => {
                let on_error = self
                    .plan()?
                    .workflow
                    .def
                    .nodes
                    .iter()
                    .find(|n| n.id == step.id)
                    .and_then(|n| match &n.kind {
                        NodeKind::Tool { on_error, .. } => on_error.clone(),
                        _ => None,
                    });
                let error = call.error.unwrap_or_else(|| "failed".into());
                match on_error {
                    Some(next) => self.emit(Event::NodeCompleted {
                        node: step.id.clone(),
                        output: json!({"error": error}),
                        next: Some(next),
                    }),
                    // Most call errors already say "tool `t` failed…";
                    // name the tool only when the error does not.
                    None if error.starts_with(&format!("tool `{}` ", call.tool)) => {
                        self.fail_run(format!("node `{}`: {error}", step.id))
                    }
                    None => self.fail_run(format!(
                        "node `{}`: tool `{}` failed: {error}",
                        step.id, call.tool
                    )),
                }
                Ok(true)
            }
            CallStatus::Open | CallStatus::Uncertain | CallStatus::Cancelled => Ok(false),
        }
    }
}

/// Whether the next model call of `node` would go past a budget: the
/// agent's `loop:` steps and `budget:` (scope `node`), then the workflow's
/// `budget:` over the whole run (scope `run`). The message and the typed
/// stop, or `None`.
fn out_of_budget(
    agent: &AgentDef,
    node: &state::NodeState,
    run: &Budget,
    totals: &state::RunTotals,
) -> Option<(String, Stop)> {
    let (max_model_steps, _) = agent.loop_policy.bounds();
    let node_limits: [(&str, Option<f64>, f64); 5] = [
        (
            "model_steps",
            Some(f64::from(max_model_steps)),
            f64::from(node.model_steps),
        ),
        (
            "tokens",
            agent.budget.max_tokens.map(|n| n as f64),
            node.tokens as f64,
        ),
        (
            "input_tokens",
            agent.budget.max_input_tokens.map(|n| n as f64),
            node.input_tokens as f64,
        ),
        (
            "output_tokens",
            agent.budget.max_output_tokens.map(|n| n as f64),
            node.output_tokens as f64,
        ),
        ("cost_usd", agent.budget.max_cost_usd, node.cost_usd),
    ];
    let run_tokens = totals.input_tokens.saturating_add(totals.output_tokens);
    let run_limits: [(&str, Option<f64>, f64); 5] = [
        (
            "model_steps",
            run.max_model_steps.map(f64::from),
            f64::from(totals.model_steps),
        ),
        (
            "tokens",
            run.max_tokens.map(|n| n as f64),
            run_tokens as f64,
        ),
        (
            "input_tokens",
            run.max_input_tokens.map(|n| n as f64),
            totals.input_tokens as f64,
        ),
        (
            "output_tokens",
            run.max_output_tokens.map(|n| n as f64),
            totals.output_tokens as f64,
        ),
        ("cost_usd", run.max_cost_usd, totals.cost_usd),
    ];
    let number = |v: f64, budget: &str| -> Value {
        if budget == "cost_usd" {
            serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number)
        } else {
            Value::from(v as u64)
        }
    };
    for (scope, limits) in [("node", node_limits), ("run", run_limits)] {
        for (budget, limit, used) in limits {
            let Some(limit) = limit else { continue };
            if used < limit {
                continue;
            }
            let whose = if scope == "node" {
                format!("agent `{}` in node `{}`", agent.name, node.id)
            } else {
                format!("the run (in node `{}`)", node.id)
            };
            let error = if budget == "model_steps" && scope == "node" {
                format!(
                    "{whose} reached its bound of {max_model_steps} model steps without a final answer"
                )
            } else {
                let show = |v: f64| {
                    if budget == "cost_usd" {
                        format!("{v:.6} USD")
                    } else {
                        format!("{}", v as u64)
                    }
                };
                format!(
                    "{whose} used its `{budget}` budget ({} of {})",
                    show(used),
                    show(limit)
                )
            };
            return Some((
                error,
                Stop::Budget {
                    budget: budget.to_owned(),
                    scope: scope.to_owned(),
                    node: node.id.clone(),
                    limit: number(limit, budget),
                    used: number(used, budget),
                },
            ));
        }
    }
    None
}

/// An agent's final answer `text` checked against its `output_schema`:
/// the JSON value (the text, or the one fenced code block it is wrapped in,
/// as models often write ```` ```json … ``` ````), or the violations.
fn checked_final_answer(schema: &Value, text: &str) -> Result<Value, Vec<String>> {
    let trimmed = text.trim();
    let unfenced = trimmed
        .strip_prefix("```")
        .and_then(|rest| rest.strip_suffix("```"))
        .map(|inner| {
            // The info string (`json`) ends at the first line break.
            inner.split_once('\n').map_or(inner, |(info, body)| {
                if info.trim().chars().all(|c| c.is_ascii_alphanumeric()) {
                    body
                } else {
                    inner
                }
            })
        })
        .unwrap_or(trimmed);
    let value: Value = serde_json::from_str(unfenced).map_err(|e| {
        vec![format!(
            "the answer is not JSON ({e}); it must be one JSON value"
        )]
    })?;
    belay_definitions::validate_json(schema, &value)?;
    Ok(value)
}
