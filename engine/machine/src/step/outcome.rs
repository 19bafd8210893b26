//! What a call answered: a worker's result (checked against the tool's
//! return type, its secrets scrubbed), an async webhook's callback, and
//! a tool's question to a person, with the answer it is repeated with.

use serde_json::Value;

use super::{Failure, Step};
use crate::command::{Command, TaskEnd};
use crate::error::MachineError;
use crate::event::{Event, FailureClass, ResolvedVia, TimerPurpose, TimerSpec};
use crate::input::Resolution;
use crate::state::CallStatus;
use crate::{MAX_INPUT_ROUNDS, RESULT_EXCERPT_BYTES, normalize, process, scrub, state};
use belay_definitions::model::{RepeatSafety, ToolBindingDef};

impl Step {
    /// `callback_timeout_ms` of the call's tool if it is `type: async_webhook`.
    fn callback_timeout_ms(&self, call_id: &str) -> Option<u64> {
        let call = self.state.tool_calls.get(call_id)?;
        match &self.plan().ok()?.tools.get(&call.tool)?.def.binding {
            ToolBindingDef::AsyncWebhook {
                callback_timeout_ms,
                ..
            } => Some(*callback_timeout_ms),
            _ => None,
        }
    }

    /// A callback of a `type: async_webhook` call: its result, once. An
    /// open call completes (whether or not the worker has reported the
    /// acceptance yet); an uncertain one is resolved by it; a call that
    /// already ended keeps it as history. The token is used up in every case,
    /// so a replay changes nothing.
    pub(crate) fn on_callback(
        &mut self,
        token_sha256: &str,
        payload: Value,
    ) -> Result<(), MachineError> {
        let Some((call_id, call, attempt, used)) =
            self.state.tool_calls.iter().find_map(|(id, c)| {
                c.callback_tokens
                    .get(token_sha256)
                    .map(|(attempt, used)| (id.clone(), c.clone(), *attempt, *used))
            })
        else {
            return Err(MachineError::CallNotOpen {
                call_id: String::new(),
                detail: "no call of this run issued that callback token".into(),
            });
        };
        if used {
            return Ok(());
        }
        // Only a result that will be applied is checked against the tool's
        // type (a late one is kept as it came).
        let applies = !self.state.status.is_terminal()
            && matches!(call.status, CallStatus::Open | CallStatus::Uncertain);
        if applies {
            let plan = self.plan()?;
            let tool = plan.tools.get(&call.tool).ok_or_else(|| {
                MachineError::InvalidPlan(format!("tool `{}` not pinned", call.tool))
            })?;
            belay_definitions::validate_json(&tool.def.output_schema, &payload).map_err(
                |errors| MachineError::InvalidResult {
                    tool: call.tool.clone(),
                    errors,
                },
            )?;
        }
        let payload = self.scrubbed(&call_id, payload);
        self.emit(Event::CallbackReceived {
            call_id: call_id.clone(),
            attempt,
            token_sha256: token_sha256.to_owned(),
        });
        if self.state.status.is_terminal() {
            self.emit(Event::LateResultRecorded {
                call_id,
                attempt,
                result: payload,
                discrepancy: Some(format!(
                    "the callback for attempt {attempt} arrived after the run was {}; it is kept here, not applied",
                    self.state.status.as_str()
                )),
            });
            return Ok(());
        }
        match call.status {
            CallStatus::Open => {
                if let Some(timer) = &call.callback_timer {
                    self.command(Command::CancelTimer {
                        timer_id: timer.timer_id.clone(),
                    });
                }
                self.emit(Event::ToolCallCompleted {
                    call_id: call_id.clone(),
                    attempt,
                    result: payload,
                    cached: None,
                    ends_node: false,
                });
                // The worker may not have reported the acceptance yet: its
                // task ends here, and its report finds the call completed.
                self.command(Command::EndTask {
                    call_id,
                    end: TaskEnd::Completed,
                });
                Ok(())
            }
            CallStatus::Uncertain => {
                self.late_attempt = Some(attempt);
                self.resolve(
                    &call_id,
                    Resolution::Succeeded { result: payload },
                    "callback".to_owned(),
                    format!("the tool server called back for attempt {attempt}"),
                    ResolvedVia::Callback,
                )
            }
            CallStatus::Completed | CallStatus::Failed | CallStatus::Cancelled => {
                self.emit(Event::LateResultRecorded {
                    call_id,
                    attempt,
                    result: payload,
                    discrepancy: Some(format!(
                        "the callback for attempt {attempt} arrived after the call was {}; it is kept here, not applied",
                        call.status.as_str()
                    )),
                });
                Ok(())
            }
        }
    }

    /// A worker's result for the current attempt of an open tool call.
    pub(crate) fn on_tool_result(
        &mut self,
        call_id: String,
        attempt: u32,
        result: Value,
    ) -> Result<(), MachineError> {
        let probe_for = self
            .state
            .tool_calls
            .get(&call_id)
            .and_then(|c| c.probe_for.clone());
        if let Some(callback_timeout_ms) = self.callback_timeout_ms(&call_id)
            && probe_for.is_none()
        {
            // An async webhook's 2xx answer is an acceptance: the result
            // comes by callback.
            let timer = TimerSpec {
                timer_id: format!("{call_id}.callback"),
                after_ms: Some(callback_timeout_ms),
                at: None,
                purpose: TimerPurpose::Timeout,
            };
            if self
                .state
                .tool_calls
                .get(&call_id)
                .is_some_and(|c| c.callback_timer.is_some())
            {
                // Already accepted (a second report of the same acceptance).
                return Ok(());
            }
            self.emit(Event::ToolCallAccepted {
                call_id: call_id.clone(),
                attempt,
                response: result,
                timer: timer.clone(),
            });
            self.command(Command::EndTask {
                call_id,
                end: TaskEnd::Completed,
            });
            self.command(Command::ScheduleTimer(timer));
            return Ok(());
        }
        if probe_for.is_none()
            && let Some(failure) = self.result_type_failure(&call_id, attempt, &result)?
        {
            return self.on_failure(failure);
        }
        let result = self.scrubbed(&call_id, result);
        self.emit(Event::ToolCallCompleted {
            call_id: call_id.clone(),
            attempt,
            result: result.clone(),
            cached: None,
            ends_node: false,
        });
        self.command(Command::EndTask {
            call_id: call_id.clone(),
            end: TaskEnd::Completed,
        });
        if let Some(target) = probe_for {
            self.on_probe_found(&target, &call_id, result)?;
        }
        Ok(())
    }

    /// A tool asked, mid-call, for input from a person (an MCP server's
    /// elicitation). The run waits durably for the answer
    /// ([`Step::on_input_provided`]), then the call runs again with the same
    /// idempotency key, carrying the answers. Repeating the call must be
    /// safe for that: when the server kept running after Belay declined to
    /// answer at once (`may_have_acted`), only an `idempotent` tool waits; a
    /// `never` tool fails and a `reconcile` tool's call becomes an uncertain
    /// outcome, as for any answer lost after the call acted. A reconcile
    /// probe (the engine's own lookup), and a call past
    /// [`MAX_INPUT_ROUNDS`] questions, fail instead of waiting.
    pub(crate) fn on_input_requested(
        &mut self,
        call_id: String,
        attempt: u32,
        via: String,
        requests: Value,
        request_state: Option<String>,
        may_have_acted: bool,
    ) -> Result<(), MachineError> {
        let call = self.require_open_tool_call(&call_id)?.clone();
        let refusal = if !matches!(
            via.as_str(),
            "input_required" | "elicitation" | "url_elicitation_required"
        ) {
            Some(format!("asked for input in an unknown way `{via}`"))
        } else if call.probe_for.is_some() {
            Some("a reconcile probe cannot wait for a person".to_owned())
        } else if call.input_rounds >= MAX_INPUT_ROUNDS {
            Some(format!(
                "it asked for input more than {MAX_INPUT_ROUNDS} times"
            ))
        } else if may_have_acted && call.repeat_safety != RepeatSafety::Idempotent {
            Some(format!(
                "it asked for input mid-call and kept running when Belay did not answer at once, so it may have acted; \
                 calling it again with the answer would repeat it, which its repeat safety `{}` does not allow \
                 (declare it `idempotent` if repeating it is safe)",
                call.repeat_safety.as_str()
            ))
        } else {
            None
        };
        if let Some(why) = refusal {
            return self.on_failure(Failure {
                call_id,
                attempt,
                error: format!("the tool asked for input from a person: {why}"),
                class: if may_have_acted {
                    FailureClass::MayHaveActed
                } else {
                    FailureClass::Rejected
                },
                dispatched: true,
                lease_expired: false,
                status_code: None,
            });
        }
        self.emit(Event::ToolCallInputRequested {
            call_id: call_id.clone(),
            request_id: state::input_request_id(&call_id, call.input_requests.len() + 1),
            attempt,
            via: via.clone(),
            requests,
            request_state,
        });
        self.command(Command::EndTask {
            call_id: call_id.clone(),
            end: TaskEnd::Completed,
        });
        self.command(Command::NotifyOperator {
            kind: "run.waiting.tool_input".into(),
            payload: serde_json::json!({
                "type": "run.waiting.tool_input",
                "tenant": self.state.tenant,
                "run_id": self.state.run_id,
                "call_id": call_id,
                "tool": call.tool,
                "via": via,
            }),
        });
        Ok(())
    }

    /// A person answered a tool's question: the answer must fit it (the
    /// form's `requestedSchema` for an accepted elicitation), then the call
    /// is scheduled again with every answer so far as its `input`.
    pub(crate) fn on_input_provided(
        &mut self,
        call_id: String,
        request_id: String,
        answer: Value,
        by: String,
    ) -> Result<(), MachineError> {
        let call = self.require_open_tool_call(&call_id)?.clone();
        let Some(asked) = call
            .awaiting_input
            .clone()
            .filter(|a| a.request_id == request_id)
        else {
            return Err(MachineError::CallNotOpen {
                call_id,
                detail: format!("it does not wait for input `{request_id}`"),
            });
        };
        let answer = normalize::strip_nul_value(answer);
        let input = input_for_repeat(&call_id, &asked, &answer, &call.input)?;
        let tool =
            self.plan()?.tools.get(&call.tool).cloned().ok_or_else(|| {
                MachineError::InvalidPlan(format!("tool `{}` not pinned", call.tool))
            })?;
        let spec = self.spec_again(&call, &tool, &input)?;
        self.emit(Event::ToolCallInputProvided {
            call_id: call_id.clone(),
            request_id,
            by,
            answer,
            input,
        });
        self.command(Command::RekeyTask {
            call_id: call_id.clone(),
            idempotency_key: call.idempotency_key.clone(),
            spec,
        });
        self.command(Command::RetryTask {
            call_id,
            delay_ms: 0,
        });
        Ok(())
    }

    /// `result` of call `call_id` with its secrets redacted (`scrub.rs`),
    /// unless its tool says `scrub_secrets: false`.
    pub(super) fn scrubbed(&self, call_id: &str, result: Value) -> Value {
        if self.scrubs(call_id) {
            scrub::scrub(&result).0
        } else {
            result
        }
    }

    /// Whether what call `call_id` answers is scrubbed: unless its tool
    /// says `scrub_secrets: false` (a model call's errors always are).
    fn scrubs(&self, call_id: &str) -> bool {
        self.state
            .tool_calls
            .get(call_id)
            .and_then(|c| self.state.plan.as_ref()?.tools.get(&c.tool))
            .is_none_or(|t| t.def.scrub_secrets)
    }

    /// [`Step::scrubbed`] for an error text.
    pub(super) fn scrubbed_text(&self, call_id: &str, text: &str) -> String {
        if self.scrubs(call_id) {
            scrub::scrub_text(text, &mut 0)
        } else {
            text.to_owned()
        }
    }

    /// The failure a worker's result is recorded as when it does not match
    /// the tool's declared return type (the fourth check of the tool model:
    /// a result reaches the model and the run's state only as the type the
    /// tool declares). The tool has acted, so nothing repeats it: a
    /// `reconcile` tool's call becomes an uncertain outcome (an operator
    /// looks at what it did), any other fails with the violations and the
    /// first [`RESULT_EXCERPT_BYTES`] bytes of the result, which the model
    /// sees as the call's error. `None` when the result is valid.
    fn result_type_failure(
        &self,
        call_id: &str,
        attempt: u32,
        result: &Value,
    ) -> Result<Option<Failure>, MachineError> {
        let Some(call) = self.state.tool_calls.get(call_id) else {
            return Ok(None);
        };
        let plan = self.plan()?;
        let tool = plan
            .tools
            .get(&call.tool)
            .ok_or_else(|| MachineError::InvalidPlan(format!("tool `{}` not pinned", call.tool)))?;
        // With `process.after`, the declared return type is the processed
        // result's: check what the model and the run's state will get. A
        // stage that failed decides the call itself (`block`: failed;
        // `reask`/`fallback`: a message), or keeps the raw result (`warn`,
        // `use_original`), which is then checked.
        let processed;
        let checked = match tool.def.process.as_ref().and_then(|p| p.after.as_ref()) {
            Some(after) if call.probe_for.is_none() => {
                let done = process::after(after, &call.arguments, result);
                match (done.outcome, done.result) {
                    ("ok", Some(r)) => {
                        processed = r;
                        &processed
                    }
                    ("ok" | "warn" | "use_original", _) => result,
                    _ => return Ok(None),
                }
            }
            _ => result,
        };
        let Err(errors) = belay_definitions::validate_json(&tool.def.output_schema, checked) else {
            return Ok(None);
        };
        let text = self.scrubbed(call_id, checked.clone()).to_string();
        let excerpt = normalize::truncate_str(&text, RESULT_EXCERPT_BYTES);
        let class = if call.repeat_safety == RepeatSafety::Reconcile {
            FailureClass::MayHaveActed
        } else {
            FailureClass::Rejected
        };
        Ok(Some(Failure {
            call_id: call_id.to_owned(),
            attempt,
            error: format!(
                "the tool answered, but its result does not match its declared return type ({}); result: {excerpt}",
                errors.join("; ")
            ),
            class,
            dispatched: true,
            lease_expired: false,
            status_code: None,
        }))
    }
}

/// The `ToolCallSpec.input` of a call repeated after a person's answer
/// (the worker's MCP client reads it as its `InputAnswers`): for
/// `input_required`, the responses with the server's `request_state`; for an
/// elicitation, every answer of the call so far in the order asked (the
/// repeated call meets the same questions again); for
/// `url_elicitation_required`, nothing but the fact that the person was
/// there. Errors: [`MachineError::InvalidInput`] naming each problem.
fn input_for_repeat(
    call_id: &str,
    asked: &state::AwaitingInput,
    answer: &Value,
    so_far: &Value,
) -> Result<Value, MachineError> {
    let invalid = |errors: Vec<String>| MachineError::InvalidInput {
        call_id: call_id.to_owned(),
        errors,
    };
    // One elicitation answer: `{action, content?}`, the content checked
    // against the form's schema when accepted.
    let check_answer = |pointer: &str, answer: &Value, schema: Option<&Value>| -> Vec<String> {
        let Some(map) = answer.as_object() else {
            // The answer itself: `/` at the root, else its own pointer.
            let at = if pointer.is_empty() { "/" } else { pointer };
            return vec![format!(
                "{at}: an answer is an object `{{\"action\": \"accept\"|\"decline\"|\"cancel\", \"content\": {{...}}}}`"
            )];
        };
        let mut errors = Vec::new();
        if let Some(key) = map
            .keys()
            .find(|k| !matches!(k.as_str(), "action" | "content"))
        {
            errors.push(format!(
                "{pointer}/{key}: unknown field (an answer has `action` and `content`)"
            ));
        }
        match map.get("action").and_then(Value::as_str) {
            Some("accept") => {
                if let (Some(schema), content) = (schema, map.get("content")) {
                    let content = content
                        .cloned()
                        .unwrap_or(Value::Object(Default::default()));
                    if let Err(e) = belay_definitions::validate_json(schema, &content) {
                        // `/: msg` (the form itself) or `/name: msg`.
                        errors.extend(e.into_iter().map(|e| match e.strip_prefix("/: ") {
                            Some(msg) => format!("{pointer}/content: {msg}"),
                            None => format!("{pointer}/content{e}"),
                        }));
                    }
                }
            }
            Some("decline" | "cancel") => {
                if map.contains_key("content") {
                    errors.push(format!(
                        "{pointer}/content: only an accepted answer has content"
                    ));
                }
            }
            _ => errors.push(format!(
                "{pointer}/action: must be \"accept\", \"decline\" or \"cancel\""
            )),
        }
        errors
    };
    match asked.via.as_str() {
        "input_required" => {
            let Some(responses) = answer.get("responses").and_then(Value::as_object) else {
                return Err(invalid(vec![
                    "/responses: an object answering each of the tool's requests by its key".into(),
                ]));
            };
            let requests = asked.requests.as_object().cloned().unwrap_or_default();
            let mut errors = Vec::new();
            for key in requests.keys().filter(|k| !responses.contains_key(*k)) {
                errors.push(format!("/responses/{key}: not answered"));
            }
            for (key, response) in responses {
                match requests.get(key) {
                    None => {
                        errors.push(format!("/responses/{key}: the tool asked no such request"))
                    }
                    Some(request) => {
                        let schema = request.pointer("/params/requestedSchema");
                        errors.extend(check_answer(&format!("/responses/{key}"), response, schema));
                    }
                }
            }
            if !errors.is_empty() {
                return Err(invalid(errors));
            }
            Ok(serde_json::json!({
                "responses": responses,
                "request_state": asked.request_state,
            }))
        }
        via => {
            // An elicitation form (or a URL the person visited).
            let url = via == "url_elicitation_required"
                || asked.requests.get("mode").and_then(Value::as_str) == Some("url");
            let schema = if url {
                None
            } else {
                asked.requests.get("requestedSchema")
            };
            let errors = check_answer("", answer, schema);
            if !errors.is_empty() {
                return Err(invalid(errors));
            }
            if url && answer.get("content").is_some() {
                return Err(invalid(vec![
                    "/content: a URL request has no form to fill; answer with the action only"
                        .into(),
                ]));
            }
            if via == "url_elicitation_required" {
                // The server refused to start until the person finished at the URL.
                return Ok(serde_json::json!({}));
            }
            let mut elicitations = so_far
                .get("elicitations")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            // With the question it answers, so the repeated call does not
            // give it to another question (`ElicitationAnswer::question`).
            let mut answered = answer.clone();
            if let Value::Object(map) = &mut answered {
                map.insert("question".into(), asked.requests.clone());
            }
            elicitations.push(answered);
            Ok(serde_json::json!({ "elicitations": elicitations }))
        }
    }
}
