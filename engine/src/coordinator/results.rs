//! What comes back from a call: a worker's result or failure (late ones
//! included), a tool's question for a person and the person's answer, and
//! the callback of a `type: async_webhook` tool.

use belay_proto::wire::{ModelCallResult, SamplingUsage};
use serde_json::Value;
use uuid::Uuid;

use super::tasks::{Claimed, fenced, leased_tool_call};
use super::{
    Coordinator, CoordinatorError, MAX_ID_BYTES, MAX_JSON_BYTES, check_text, json_arg, parse_uuid,
    require,
};
use crate::machine::{self, FailureClass, Input};
use crate::store::{ClaimFilter, HandOff, RunRow, StoreError};
use crate::vault::SecretText;

/// What `POST /callbacks/v1/{token}` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallbackOutcome {
    /// The run the token belongs to.
    pub run_id: Uuid,
    /// Whether the result was applied: it completed the call or resolved
    /// its uncertain outcome.
    pub applied: bool,
    /// Why not, when not applied: the token was used before (a replay), or
    /// the call or run had ended (the callback is then kept in the run's
    /// history as a late result).
    pub detail: Option<String>,
}

/// Most bytes of a callback's body: the tool's result (JSON).
pub const MAX_CALLBACK_BYTES: usize = MAX_JSON_BYTES;

/// Path of the callback endpoint, under the callback base URL.
pub const CALLBACK_PATH_PREFIX: &str = "/callbacks/v1/";

/// Hex SHA-256 of a callback token.
pub fn callback_token_sha256(token: &str) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(token.as_bytes()))
}

impl Coordinator {
    /// A tool server's callback for a `type: async_webhook` call: `token`
    /// from the URL, `body` the result as JSON (empty: `null`).
    ///
    /// Errors: `NotFound` for a token never issued (or malformed);
    /// `InvalidArgument` for a body that is not JSON or is too large;
    /// `Unprocessable` for a result that does not match the tool's output
    /// type (the token stays unused, so a corrected callback can follow);
    /// `FailedPrecondition` when the run has ended.
    pub async fn callback(
        &self,
        token: &str,
        body: &[u8],
    ) -> Result<CallbackOutcome, CoordinatorError> {
        // Tokens are 64 hex digits; anything else was never issued.
        if token.len() != 64 || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(CoordinatorError::NotFound("callback token".into()));
        }
        let token_sha256 = callback_token_sha256(&token.to_ascii_lowercase());
        let run_id = self
            .store
            .callback_run(&token_sha256)
            .await?
            .ok_or_else(|| CoordinatorError::NotFound("callback token".into()))?;
        if body.len() > MAX_CALLBACK_BYTES {
            return Err(CoordinatorError::InvalidArgument(format!(
                "the callback body is {} bytes, more than {MAX_CALLBACK_BYTES}",
                body.len()
            )));
        }
        let payload = if body.iter().all(u8::is_ascii_whitespace) {
            Value::Null
        } else {
            serde_json::from_slice::<Value>(body)
                .map(machine::normalize::strip_nul_value)
                .map_err(|e| {
                    CoordinatorError::InvalidArgument(format!("the callback body is not JSON: {e}"))
                })?
        };
        let mut detail: Option<String> = None;
        let mut applied = false;
        self.transition(run_id, None, |state, _| {
            let d = machine::decide(
                state,
                Input::Callback {
                    token_sha256: token_sha256.clone(),
                    payload,
                },
            )
            .map_err(CoordinatorError::from)?;
            applied = d.events.iter().any(|e| {
                matches!(
                    e,
                    machine::Event::ToolCallCompleted { .. }
                        | machine::Event::UncertainOutcomeResolved { .. }
                )
            });
            detail = if d.events.is_empty() {
                Some("this callback token was used before; nothing changed".to_owned())
            } else {
                d.events.iter().find_map(|e| match e {
                    machine::Event::LateResultRecorded { discrepancy, .. } => discrepancy.clone(),
                    _ => None,
                })
            };
            Ok(d)
        })
        .await?;
        tracing::info!(%run_id, applied, "callback received");
        Ok(CallbackOutcome {
            run_id,
            applied,
            detail: detail.filter(|_| !applied),
        })
    }

    /// Record a task's result.
    pub async fn complete(
        &self,
        worker_id: &str,
        task_id: &str,
        attempt: u32,
        result_json: &str,
    ) -> Result<(), CoordinatorError> {
        self.complete_with_secrets(worker_id, task_id, attempt, result_json, Vec::new())
            .await
    }

    /// [`Coordinator::complete`] for a producer tool (`RESULT_SECRETS`):
    /// `secrets` are the values the worker took out of the result, by
    /// vault key. They are sealed and kept in the run's vault in the
    /// transaction that records the result; the result holds
    /// `[VAULTED:<key>]` in their place (a value the worker left at a
    /// declared path is taken out here too). A key the tool does not
    /// declare is dropped. Without a vault key the call fails (rejected):
    /// the values are never kept unencrypted. A late result (an attempt
    /// that lost its lease) is recorded without its values: they are
    /// dropped, never vaulted.
    pub async fn complete_with_secrets(
        &self,
        worker_id: &str,
        task_id: &str,
        attempt: u32,
        result_json: &str,
        secrets: Vec<(String, SecretText)>,
    ) -> Result<(), CoordinatorError> {
        self.complete_sampled(
            worker_id,
            task_id,
            attempt,
            result_json,
            secrets,
            None,
            McpReport::default(),
            None,
        )
        .await
        .map(|_| ())
    }

    /// [`Coordinator::complete_with_secrets`] with the model completions
    /// the tool's MCP server asked for during the attempt (`sampling`,
    /// `CompleteTaskRequest.sampling_usage`): recorded as
    /// `tool_call_sampled` in the transition that records the result, and
    /// charged to the budgets (`machine/sampling.rs`). Usage reported with
    /// a late result, or for a model call, is not charged (logged). `mcp`:
    /// what a `type: mcp` call adds ([`McpReport`]). `next`: the worker
    /// asks for its next task with the report (`claim_next`), claiming as
    /// this filter allows; a task the report's decision schedules that it
    /// may take is handed to it leased in the same transaction
    /// ([`crate::store::HandOff`]) and returned, with when the
    /// transition began (its lease runs from no earlier). `None` (nothing
    /// handed): the caller claims as usual.
    #[allow(clippy::too_many_arguments)]
    pub async fn complete_sampled(
        &self,
        worker_id: &str,
        task_id: &str,
        attempt: u32,
        result_json: &str,
        secrets: Vec<(String, SecretText)>,
        sampling: Option<SamplingUsage>,
        mcp: McpReport,
        next: Option<ClaimFilter<'_>>,
    ) -> Result<Option<Claimed>, CoordinatorError> {
        require("worker_id", worker_id)?;
        let mut value = json_arg("result_json", result_json)?;
        let task = parse_uuid("task_id", task_id)?;
        let vault = self.vault.get();
        // The model provider a worker names in a model call's result
        // (`belay_proto::wire::MODEL_PROVIDER_FIELD`), for the metrics.
        let provider = value
            .get(belay_proto::wire::MODEL_PROVIDER_FIELD)
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned);
        let hand = self.hand_off_for(worker_id, next).await;
        let began = tokio::time::Instant::now();
        let applied = self
            .transition_task_handing(task, provider.as_deref(), hand.as_ref(), |state, row| {
                let row = row.ok_or_else(|| CoordinatorError::NotFound("task".into()))?;
                let is_tool = row.kind == belay_proto::wire::TASK_KIND_TOOL_CALL;
                let current = row.status == "leased" && row.attempt as u32 == attempt;
                // What the tool's `RESULT_SECRETS` vault, out of the result.
                let vaulted = if is_tool {
                    take_vaulted(state, &row.call_id, &mut value, secrets)
                } else {
                    Vec::new()
                };
                if is_tool && !current && attempt >= 1 && attempt <= row.attempt as u32 {
                    if let Some(usage) = sampling.filter(|u| !u.is_empty()) {
                        tracing::warn!(
                            %task, attempt, ?usage,
                            "sampling usage reported with a late result is not charged"
                        );
                    }
                    // A result from an attempt that no longer holds the task:
                    // the machine decides (resolve, first wins, or history).
                    return machine::decide(
                        state,
                        Input::LateToolResult {
                            call_id: row.call_id.clone(),
                            attempt,
                            result: value,
                            worker_id: worker_id.to_owned(),
                        },
                    )
                    .map_err(CoordinatorError::from);
                }
                let row = fenced(Some(row), attempt, Some(worker_id))?;
                if row.status == "completed" {
                    // The same attempt reporting again (its reply was lost).
                    return Ok(machine::Decision::default());
                }
                if row.status != "leased" {
                    return Err(CoordinatorError::FailedPrecondition(format!(
                        "task {task_id} is {}, not leased",
                        row.status
                    )));
                }
                let input = if row.kind == belay_proto::wire::TASK_KIND_MODEL_CALL {
                    let mut result: ModelCallResult =
                        serde_json::from_value(value).map_err(|e| {
                            CoordinatorError::InvalidArgument(format!(
                                "`result_json` is not a model call result: {e}"
                            ))
                        })?;
                    // `visibility.trace: false` arguments: out of the answer
                    // before anything of it is recorded.
                    let taken = machine::untraced::take_untraced(state, &row.call_id, &mut result);
                    if taken.is_empty() {
                        Input::ModelCallCompleted {
                            call_id: row.call_id.clone(),
                            attempt,
                            result,
                        }
                    } else {
                        let mut sealed = Vec::with_capacity(taken.len());
                        // No vault key: none sealed, and the machine refuses
                        // those calls (check `vault`) before they can act.
                        if let Some(vault) = vault {
                            for (key, text) in taken {
                                let text = SecretText::new(text);
                                sealed.push(vault.seal(row.run_id, &key, text.expose()).map_err(
                                    |e| CoordinatorError::Store(StoreError::Corrupt(e.to_string())),
                                )?);
                            }
                        }
                        Input::ModelCallCompletedUntraced {
                            call_id: row.call_id.clone(),
                            attempt,
                            result,
                            secrets: sealed,
                        }
                    }
                } else if vaulted.is_empty() {
                    Input::ToolCallCompleted {
                        call_id: row.call_id.clone(),
                        attempt,
                        result: value,
                        secrets: Vec::new(),
                    }
                } else if let Some(vault) = vault {
                    let mut sealed = Vec::with_capacity(vaulted.len());
                    for (key, text) in &vaulted {
                        sealed.push(vault.seal(row.run_id, key, text.expose()).map_err(|e| {
                            CoordinatorError::Store(StoreError::Corrupt(e.to_string()))
                        })?);
                    }
                    Input::ToolCallCompleted {
                        call_id: row.call_id.clone(),
                        attempt,
                        result: value,
                        secrets: sealed,
                    }
                } else {
                    // Fail closed: a secret is never kept unencrypted, and
                    // the result without it would pass for the whole.
                    let tool = producer_tool(state, &row.call_id).unwrap_or_default();
                    Input::TaskFailed {
                        call_id: row.call_id.clone(),
                        attempt,
                        error: format!(
                            "the result of `{tool}` holds values for the run's secret vault (`RESULT_SECRETS`), and this engine has no vault key to keep them: the result was dropped; set BELAY_VAULT_KEY (or --vault-key) to 32 random bytes, hex or base64"
                        ),
                        class: FailureClass::Rejected,
                        dispatched: row.dispatched,
                        status_code: None,
                    }
                };
                let input = if is_tool {
                    with_mcp(with_sampling(input, sampling), mcp.clone())
                } else {
                    input
                };
                machine::decide(state, input).map_err(CoordinatorError::from)
            })
            .await?;
        tracing::info!(%task, attempt, worker_id, "task completed");
        Ok(applied.handed.map(|t| {
            tracing::info!(
                task_id = %t.task_id, attempt = t.attempt, worker_id, dispatched = t.dispatched,
                "task handed over with the report"
            );
            let tasks = vec![t];
            self.metrics.claimed(&tasks);
            Claimed { tasks, began }
        }))
    }

    /// What a report that asks for its next task (`next`, its claim's
    /// filter) asks of its transition: nothing while claims are stopped
    /// (shutting down), or when the worker's liveness record fails (logged:
    /// the report is recorded all the same, and nothing is handed).
    async fn hand_off_for<'a>(
        &self,
        worker_id: &'a str,
        next: Option<ClaimFilter<'a>>,
    ) -> Option<HandOff<'a>> {
        let filter = next.filter(|_| !self.claims_stopped())?;
        if let Err(e) = self.note_worker(worker_id, filter).await {
            tracing::warn!(worker_id, error = %e, "recording the worker failed; its report hands over nothing");
            return None;
        }
        Some(HandOff {
            worker_id,
            lease_ms: self.config.lease_ms as i64,
            filter,
            dispatch_tool_calls: self.config.dispatch_with_claim,
        })
    }

    /// Record a task's failure.
    pub async fn fail(
        &self,
        worker_id: &str,
        task_id: &str,
        attempt: u32,
        error: &str,
        class: FailureClass,
        status_code: Option<u16>,
    ) -> Result<(), CoordinatorError> {
        self.fail_sampled(
            worker_id,
            task_id,
            attempt,
            error,
            class,
            status_code,
            None,
            McpReport::default(),
        )
        .await
    }

    /// [`Coordinator::fail`] with the model completions the tool's MCP
    /// server asked for before the attempt failed (`sampling`,
    /// `FailTaskRequest.sampling_usage`), charged as with a result
    /// ([`Coordinator::complete_sampled`]), and what a `type: mcp` call
    /// adds (`mcp`: its definition hash and kind of failure).
    #[allow(clippy::too_many_arguments)]
    pub async fn fail_sampled(
        &self,
        worker_id: &str,
        task_id: &str,
        attempt: u32,
        error: &str,
        class: FailureClass,
        status_code: Option<u16>,
        sampling: Option<SamplingUsage>,
        mcp: McpReport,
    ) -> Result<(), CoordinatorError> {
        require("worker_id", worker_id)?;
        let task = parse_uuid("task_id", task_id)?;
        let error = machine::normalize::truncate_str(error, 16 * 1024).to_owned();
        self.transition_task(task, None, |state, row| {
            let row = fenced(row, attempt, Some(worker_id))?;
            if row.status != "leased" {
                return Err(CoordinatorError::FailedPrecondition(format!(
                    "task {task_id} is {}, not leased",
                    row.status
                )));
            }
            let failed = Input::TaskFailed {
                call_id: row.call_id.clone(),
                attempt,
                error,
                class,
                dispatched: row.dispatched,
                status_code,
            };
            let input = if row.kind == belay_proto::wire::TASK_KIND_TOOL_CALL {
                with_mcp(with_sampling(failed, sampling), mcp.clone())
            } else {
                failed
            };
            machine::decide(state, input).map_err(CoordinatorError::from)
        })
        .await?;
        tracing::info!(%task, attempt, worker_id, ?class, "task failed");
        Ok(())
    }

    /// A worker reports that the tool asked, mid-call, for input from a
    /// person (`WorkerService.RequestToolInput`). The machine decides:
    /// wait for `ProvideToolInput`, or fail / record an uncertain outcome
    /// when repeating the call is unsafe.
    ///
    /// `sampling`: the model completions the tool's MCP server asked for
    /// before it asked the person, charged as with a result
    /// ([`Coordinator::complete_sampled`]).
    ///
    /// Errors: `InvalidArgument` for a bad id, `via` or JSON over
    /// `MAX_JSON_BYTES`; `FailedPrecondition` for a task this attempt no
    /// longer holds.
    #[allow(clippy::too_many_arguments)]
    pub async fn request_tool_input(
        &self,
        worker_id: &str,
        task_id: &str,
        attempt: u32,
        via: &str,
        requests_json: &str,
        request_state: &str,
        may_have_acted: bool,
        sampling: Option<SamplingUsage>,
    ) -> Result<(), CoordinatorError> {
        require("worker_id", worker_id)?;
        require("via", via)?;
        check_text("via", via, MAX_ID_BYTES)?;
        check_text("request_state", request_state, MAX_JSON_BYTES)?;
        let requests = json_arg("requests_json", requests_json)?;
        let task = parse_uuid("task_id", task_id)?;
        self.transition_task(task, None, |state, row| {
            let row = leased_tool_call(row, attempt, worker_id)?;
            let asked = Input::ToolInputRequested {
                call_id: row.call_id.clone(),
                attempt,
                via: via.to_owned(),
                requests,
                request_state: (!request_state.is_empty()).then(|| request_state.to_owned()),
                may_have_acted,
            };
            machine::decide(state, with_sampling(asked, sampling)).map_err(CoordinatorError::from)
        })
        .await?;
        tracing::info!(%task, attempt, worker_id, via, "tool asked for input");
        Ok(())
    }

    /// A person answers a tool's question (`RunService.ProvideToolInput`):
    /// question `request_id` of call `call_id` (empty: its only one).
    /// Returns the run afterwards and whether the question had already been
    /// answered with this answer (a retry: nothing changed).
    ///
    /// Errors: `NotFound` for an unknown run; `InvalidArgument` for a bad
    /// call id, request id, `by` or JSON, or no `request_id` for a call that
    /// asked several times; `Unprocessable` listing each problem when the
    /// answer does not fit the question; `Conflict` for a different answer
    /// to a question already answered; `FailedPrecondition` when the call
    /// does not wait for input or the run ended.
    pub async fn provide_tool_input(
        &self,
        tenant: &str,
        run_id: &str,
        call_id: &str,
        request_id: &str,
        answer_json: &str,
        by: &str,
    ) -> Result<(RunRow, bool), CoordinatorError> {
        require("call_id", call_id)?;
        check_text("call_id", call_id, MAX_ID_BYTES)?;
        check_text("request_id", request_id, MAX_ID_BYTES)?;
        require("by", by)?;
        check_text("by", by, MAX_ID_BYTES)?;
        let answer = json_arg("answer_json", answer_json)?;
        let input = Input::ProvideToolInput {
            call_id: call_id.to_owned(),
            request: (!request_id.is_empty()).then(|| request_id.to_owned()),
            answer,
            by: by.to_owned(),
        };
        let run = self.get_run(tenant, run_id).await?;
        let applied = self
            .transition(run.run_id, None, |state, _| {
                machine::decide(state, input).map_err(CoordinatorError::from)
            })
            .await?;
        let duplicate = applied.events == 0;
        tracing::info!(run_id = %run.run_id, call_id, request_id, duplicate, "tool input provided");
        Ok((self.get_run(tenant, run_id).await?, duplicate))
    }
}

/// `report` (a tool call's result, failure or question for a person) with
/// the sampling usage the
/// worker reported beside it, when it made any completion
/// ([`Input::ToolCallSampled`]).
fn with_sampling(report: Input, usage: Option<SamplingUsage>) -> Input {
    match usage.filter(|u| !u.is_empty()) {
        Some(usage) => Input::ToolCallSampled {
            usage,
            report: Box::new(report),
        },
        None => report,
    }
}

/// What a worker adds to the report of a `type: mcp` call's attempt
/// (`CompleteTaskRequest.mcp_definition_hash`,
/// `FailTaskRequest.failure_kind` and `mcp_definition_hash`): recorded as
/// `mcp_definition_checked` and as the `kind` of the failure events
/// (`machine/mcp_report.rs`). Added for issue 22.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct McpReport {
    /// The definition hash the call was checked against.
    pub definition_hash: Option<String>,
    /// The kind of its failure.
    pub kind: Option<machine::ToolFailureKind>,
}

/// `report` with what an MCP call's worker added ([`Input::McpReported`]),
/// when it added anything.
fn with_mcp(report: Input, mcp: McpReport) -> Input {
    if mcp == McpReport::default() {
        return report;
    }
    Input::McpReported {
        definition_hash: mcp.definition_hash,
        kind: mcp.kind,
        report: Box::new(report),
    }
}

/// The tool of call `call_id` when it is a producer of the run's secret
/// vault (its pinned definition has `RESULT_SECRETS`).
pub(super) fn producer_tool(state: &machine::RunState, call_id: &str) -> Option<String> {
    let tool = &state.tool_calls.get(call_id)?.tool;
    let def = &state.plan.as_ref()?.tools.get(tool)?.def;
    (!def.result_secrets.is_empty()).then(|| tool.clone())
}

/// The values a producer's result gives the vault: those the worker took
/// out (`from_worker`, only keys the tool declares), and any value still at
/// a declared path of `result` (taken out here, so it is in no event).
/// Empty for a tool without `RESULT_SECRETS`.
fn take_vaulted(
    state: &machine::RunState,
    call_id: &str,
    result: &mut Value,
    from_worker: Vec<(String, SecretText)>,
) -> Vec<(String, SecretText)> {
    let declared = state
        .tool_calls
        .get(call_id)
        .and_then(|c| state.plan.as_ref()?.tools.get(&c.tool))
        .map(|t| t.def.result_secrets.clone())
        .unwrap_or_default();
    let mut out: Vec<(String, SecretText)> = Vec::new();
    for def in &declared {
        let left = belay_proto::wire::take_secret_at(result, &def.path, &def.key);
        let given = from_worker
            .iter()
            .find(|(k, _)| *k == def.key)
            .map(|(_, v)| v.clone());
        if let Some(value) = given.or_else(|| left.map(SecretText::new)) {
            out.push((def.key.clone(), value));
        }
    }
    out
}
