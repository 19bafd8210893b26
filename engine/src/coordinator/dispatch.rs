//! Dispatch: letting the side effect of a tool call attempt start. The
//! tool's gates (rate limit, circuit breaker) may hold it back; the secret
//! vault's values it may read are opened; an async webhook gets its
//! single-use callback URL. Any error means: do not act.

use uuid::Uuid;

use super::results::producer_tool;
use super::tasks::leased_tool_call;
use super::{
    CALLBACK_PATH_PREFIX, Coordinator, CoordinatorError, callback_token_sha256, parse_uuid, require,
};
use crate::gates::GateVerdict;
use crate::machine::{self, FailureClass, Input, MachineError};
use crate::store::{ClaimedTask, StoreError};
use crate::vault::SecretText;

/// What a dispatch allows the worker ([`Coordinator::dispatch_call`]).
#[derive(Debug, Default)]
pub struct Dispatched {
    /// The single-use callback URL of a `type: async_webhook` call.
    pub callback_url: Option<String>,
    /// The vault values the call's `SECRET_ACCESS` may read, by key (a key
    /// without a value is absent). Secrets: `Debug` hides them.
    pub secrets: Vec<(String, SecretText)>,
}

impl Coordinator {
    /// Allow the side effect of a tool call attempt to start; records
    /// `ToolCallDispatched`. Any error means: do not act. Returns the
    /// callback URL for a `type: async_webhook` call (a fresh single-use
    /// token each time; only its SHA-256 is stored), `None` for other tools.
    /// [`Coordinator::dispatch_call`] also returns the vault's values.
    pub async fn dispatch(
        &self,
        worker_id: &str,
        task_id: &str,
        attempt: u32,
    ) -> Result<Option<String>, CoordinatorError> {
        Ok(self
            .dispatch_call(worker_id, task_id, attempt)
            .await?
            .callback_url)
    }

    /// [`Coordinator::dispatch`], with the values of the run's secret vault
    /// the call's tool may read (its `SECRET_ACCESS`), read and, for a
    /// single-use key, consumed by this call in the dispatch's
    /// transaction. A value that does not decrypt (the vault key changed)
    /// is left out, as an absent one is. A producer tool (`RESULT_SECRETS`)
    /// on an engine without a vault key is refused (rejected, not sent).
    pub async fn dispatch_call(
        &self,
        worker_id: &str,
        task_id: &str,
        attempt: u32,
    ) -> Result<Dispatched, CoordinatorError> {
        require("worker_id", worker_id)?;
        let task = parse_uuid("task_id", task_id)?;
        let worker = worker_id.to_owned();
        let mut refusal: Option<String> = None;
        // 256 random bits from the OS; minted for every dispatch (cheap),
        // used only if the machine issues it.
        let token = match self.callback_base_url() {
            Some(_) => {
                let mut bytes = [0u8; 32];
                getrandom::fill(&mut bytes).map_err(|e| {
                    CoordinatorError::Store(StoreError::Corrupt(format!(
                        "the OS random source failed: {e}"
                    )))
                })?;
                Some(hex::encode(bytes))
            }
            None => None,
        };
        let token_sha256 = token.as_deref().map(callback_token_sha256);
        let mut issued = false;
        // The tool's gates (rate limit, circuit breaker) held the call back.
        let mut gated: Option<String> = None;
        let mut run_id: Option<Uuid> = None;
        let has_vault = self.has_vault_key();
        let applied = self
            .transition_task_gated(task, |state, row, verdict| {
                let row = leased_tool_call(row, attempt, worker_id)?;
                if row.lease_expired {
                    return Err(CoordinatorError::FailedPrecondition(format!(
                        "the lease of task {task_id} attempt {attempt} has expired"
                    )));
                }
                run_id = Some(row.run_id);
                // (An attempt already dispatched, asking again, is let
                // through: its result fails closed on completion.)
                if verdict.is_none()
                    && !has_vault
                    && !row.dispatched
                    && let Some(tool) = producer_tool(state, &row.call_id)
                {
                    // Fail closed: the tool would hand out a secret this
                    // engine could not keep.
                    let detail = format!(
                        "tool `{tool}` puts values into the run's secret vault (`RESULT_SECRETS`), and this engine has no vault key: set BELAY_VAULT_KEY (or --vault-key) to 32 random bytes, hex or base64"
                    );
                    refusal = Some(detail.clone());
                    return machine::decide(
                        state,
                        Input::TaskFailed {
                            call_id: row.call_id.clone(),
                            attempt,
                            error: format!("dispatch refused: {detail}"),
                            class: FailureClass::Rejected,
                            dispatched: false,
                            status_code: None,
                        },
                    )
                    .map_err(CoordinatorError::from);
                }
                if verdict.is_none()
                    && !has_vault
                    && !row.dispatched
                    && let Some((tool, param)) = machine::untraced::vaulted_argument(state, &row.call_id)
                {
                    // Its value is in the vault, which this engine cannot
                    // open: sending the placeholder would be wrong.
                    let detail = format!(
                        "tool `{tool}` takes `{param}` with `visibility.trace: false`, whose value is in the run's secret vault, and this engine has no vault key to open it: set BELAY_VAULT_KEY (or --vault-key) to the key the engine that scheduled the call had"
                    );
                    refusal = Some(detail.clone());
                    return machine::decide(
                        state,
                        Input::TaskFailed {
                            call_id: row.call_id.clone(),
                            attempt,
                            error: format!("dispatch refused: {detail}"),
                            class: FailureClass::Rejected,
                            dispatched: false,
                            status_code: None,
                        },
                    )
                    .map_err(CoordinatorError::from);
                }
                let input = match verdict {
                    None => Input::DispatchToolCall {
                        call_id: row.call_id.clone(),
                        attempt,
                        worker_id: worker.clone(),
                        callback_token_sha256: token_sha256.clone(),
                        // The tenant's grants as they are now (read by the
                        // transition's lock statement), for the permission
                        // check right before the tool acts.
                        tenant_grants: Some(row.tenant_grants.clone()),
                    },
                    Some(verdict) => {
                        let tool = state
                            .tool_calls
                            .get(&row.call_id)
                            .map(|c| c.tool.as_str())
                            .unwrap_or_default();
                        let what = match verdict {
                            GateVerdict::Defer { .. } => "deferred",
                            GateVerdict::CircuitOpen { .. } => "refused",
                        };
                        gated = Some(format!("dispatch {what}: {}", verdict.describe(tool)));
                        Input::DispatchGated {
                            call_id: row.call_id.clone(),
                            attempt,
                            worker_id: worker.clone(),
                            verdict: verdict.clone(),
                        }
                    }
                };
                let decided = machine::decide(state, input);
                if let Ok(d) = &decided {
                    issued = d
                        .events
                        .iter()
                        .any(|e| matches!(e, machine::Event::CallbackIssued { .. }));
                }
                // A refusal fails the attempt now, in the history, instead of
                // leaving it to expire its lease in silence: as not sent
                // (retried) when another replica may serve the call, as
                // rejected when it will repeat on every attempt (a grant
                // withdrawn, a call that may already have acted).
                let (call_id, detail, class, what) = match decided {
                    Err(MachineError::DispatchUnavailable { call_id, detail }) => {
                        (call_id, detail, FailureClass::NotSent, "not dispatched")
                    }
                    Err(MachineError::DispatchRefused { call_id, detail }) => {
                        (call_id, detail, FailureClass::Rejected, "dispatch refused")
                    }
                    other => return other.map_err(CoordinatorError::from),
                };
                refusal = Some(detail.clone());
                machine::decide(
                    state,
                    Input::TaskFailed {
                        call_id,
                        attempt,
                        error: format!("{what}: {detail}"),
                        class,
                        dispatched: false,
                        status_code: None,
                    },
                )
                .map_err(CoordinatorError::from)
            })
            .await?;
        if let Some(detail) = refusal {
            tracing::warn!(%task, attempt, worker_id, %detail, "dispatch refused");
            return Err(CoordinatorError::FailedPrecondition(format!(
                "dispatch refused: {detail}"
            )));
        }
        if let Some(detail) = gated {
            tracing::info!(%task, attempt, worker_id, %detail, "dispatch held back by the tool's gates");
            return Err(CoordinatorError::FailedPrecondition(detail));
        }
        let secrets = self.open_secrets(run_id, applied.secrets);
        tracing::info!(
            %task, attempt, worker_id, callback = issued, secrets = secrets.len(),
            "tool call dispatched"
        );
        let callback_url = match (issued, token, self.callback_base_url()) {
            (true, Some(token), Some(base)) => Some(format!("{base}{CALLBACK_PATH_PREFIX}{token}")),
            _ => None,
        };
        Ok(Dispatched {
            callback_url,
            secrets,
        })
    }

    /// Record the dispatch of `task`, just leased to `worker_id`, when its
    /// spec allows it (`ToolCallSpec::dispatch_with_claim`: a call whose
    /// dispatch record changes no decision) and
    /// [`CoordinatorConfig::dispatch_with_claim`](super::CoordinatorConfig::dispatch_with_claim)
    /// is on, so the worker acts without asking (`Task.dispatched`, one
    /// round trip less per step). Returns whether it did, with nothing to
    /// hand out. Not recorded (false): the worker asks with
    /// `DispatchToolCall` as for any task, and a refusal recorded here
    /// (the grant withdrawn, the run paused) is what it is told then.
    pub async fn dispatch_with_claim(&self, worker_id: &str, task: &ClaimedTask) -> bool {
        if task.dispatched {
            // Handed over by a report's transition, which dispatched it.
            return true;
        }
        if !self.config.dispatch_with_claim
            || task.kind != belay_proto::wire::TASK_KIND_TOOL_CALL
            || task.spec.get("dispatch_with_claim") != Some(&serde_json::Value::Bool(true))
        {
            return false;
        }
        let Ok(attempt) = u32::try_from(task.attempt) else {
            return false;
        };
        match self
            .dispatch_call(worker_id, &task.task_id.to_string(), attempt)
            .await
        {
            Ok(d) => d.callback_url.is_none() && d.secrets.is_empty(),
            Err(e) => {
                tracing::debug!(task = %task.task_id, attempt, error = %e, "not dispatched with its claim; the worker asks");
                false
            }
        }
    }

    /// The values of what a dispatch read from run `run_id`'s vault; one
    /// that does not open is left out (logged by key only).
    fn open_secrets(
        &self,
        run_id: Option<Uuid>,
        sealed: Vec<machine::SealedSecret>,
    ) -> Vec<(String, SecretText)> {
        let (Some(run_id), Some(vault)) = (run_id, self.vault.get()) else {
            if !sealed.is_empty() {
                tracing::warn!(
                    keys = ?sealed.iter().map(|s| s.key.as_str()).collect::<Vec<_>>(),
                    "vaulted secrets cannot be opened: this engine has no vault key; the call gets none"
                );
            }
            return Vec::new();
        };
        sealed
            .into_iter()
            .filter_map(|s| match vault.open(run_id, &s) {
                Ok(value) => Some((s.key, value)),
                Err(e) => {
                    tracing::warn!(%run_id, key = %s.key, error = %e, "vaulted secret left out");
                    None
                }
            })
            .collect()
    }
}
