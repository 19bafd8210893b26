//! Starting runs, reading them, and an operator's or a caller's controls
//! of a run: cancel, pause, resume, signals, approvals.

use serde_json::Value;
use tokio::sync::broadcast;
use uuid::Uuid;

use super::{
    Coordinator, CoordinatorError, MAX_ID_BYTES, MAX_TEXT_BYTES, check_text, json_arg,
    make_page_token, parse_page_token, parse_uuid, require, shown,
};
use crate::definitions;
use crate::machine::{self, Input};
use crate::store::{EventRow, RunRow};

/// Most bytes of a signal's payload (JSON text): 256 KiB. A payload is
/// copied into the run's events and the nodes that use it, so documents
/// should travel by reference.
pub const MAX_SIGNAL_BYTES: usize = 256 * 1024;

/// A request to start a run.
#[derive(Debug, Clone)]
pub struct StartRun {
    /// Tenant.
    pub tenant: String,
    /// Workflow name.
    pub workflow: String,
    /// Input JSON text.
    pub input_json: String,
    /// Idempotency key (required).
    pub idempotency_key: String,
    /// Caller.
    pub caller: String,
    /// Caller's permissions.
    pub caller_grants: Vec<String>,
}

impl Coordinator {
    /// Start a run, or return the run its idempotency key already names.
    pub async fn start_run(&self, req: StartRun) -> Result<(RunRow, bool), CoordinatorError> {
        self.start_run_in_trace(req, None).await
    }

    /// [`Coordinator::start_run`] in the W3C trace `trace` (the
    /// `StartRun` request's span, [`crate::telemetry`]): persisted on
    /// `RunStarted`, the parent of every span of the run. A run its key
    /// already names keeps its own trace.
    pub async fn start_run_in_trace(
        &self,
        req: StartRun,
        trace: Option<belay_proto::trace::TraceContext>,
    ) -> Result<(RunRow, bool), CoordinatorError> {
        require("tenant", &req.tenant)?;
        require("workflow", &req.workflow)?;
        require("idempotency_key", &req.idempotency_key)?;
        check_text("caller", &req.caller, MAX_ID_BYTES)?;
        if req.caller_grants.len() > 256 {
            return Err(CoordinatorError::InvalidArgument(format!(
                "{} caller grants, more than 256",
                req.caller_grants.len()
            )));
        }
        for grant in &req.caller_grants {
            require("caller_grants[]", grant)?;
        }
        if let Some(run) = self
            .store
            .run_by_idempotency_key(&req.tenant, &req.idempotency_key)
            .await?
        {
            return self.same_request(run, &req).await.map(|run| (run, false));
        }
        let input_text = if req.input_json.trim().is_empty() {
            "{}"
        } else {
            req.input_json.as_str()
        };
        let input = json_arg("input_json", input_text)?;
        let plan = self.resolve_plan(&req.tenant, &req.workflow).await?;
        if let Some(schema) = &plan.workflow.def.input_schema {
            definitions::validate_json(schema, &input).map_err(|errors| {
                CoordinatorError::InvalidArgument(format!(
                    "input does not match workflow `{}`'s input schema: {}",
                    req.workflow,
                    errors.join("; ")
                ))
            })?;
        }
        let tenant_grants = self.store.tenant_grants(&req.tenant).await?;
        let run_id = Uuid::now_v7();
        let workflow_version = plan.workflow.version as i32;
        let decision = machine::decide(
            &self.start_state(&plan).await?,
            Input::Start {
                run_id: run_id.to_string(),
                tenant: req.tenant.clone(),
                caller: req.caller.clone(),
                caller_grants: req.caller_grants.clone(),
                tenant_grants,
                input: input.clone(),
                plan: Box::new(plan),
                trace,
            },
        )?;
        let (row, created) = self
            .store
            .create_run(
                run_id,
                &req.tenant,
                &req.workflow,
                workflow_version,
                &input,
                &req.idempotency_key,
                &req.caller,
                &decision,
            )
            .await?;
        if !created {
            // Another request with this key won the race.
            return self.same_request(row, &req).await.map(|run| (run, false));
        }
        self.record_created(&decision);
        tracing::info!(%run_id, tenant = %req.tenant, workflow = %req.workflow, "run started");
        Ok((row, created))
    }

    /// One run of a tenant.
    pub async fn get_run(&self, tenant: &str, run_id: &str) -> Result<RunRow, CoordinatorError> {
        require("tenant", tenant)?;
        let id = parse_uuid("run_id", run_id)?;
        self.store
            .get_run(tenant, id)
            .await?
            .ok_or_else(|| CoordinatorError::NotFound(format!("run {run_id}")))
    }

    /// A page of runs; the page token is `<created_at RFC 3339>|<run_id>` of the last run.
    pub async fn list_runs(
        &self,
        tenant: &str,
        status: &str,
        page_size: u32,
        page_token: &str,
    ) -> Result<(Vec<RunRow>, String), CoordinatorError> {
        require("tenant", tenant)?;
        const STATUSES: [&str; 7] = [
            "pending",
            "running",
            "paused",
            "waiting",
            "completed",
            "failed",
            "cancelled",
        ];
        let status = if status.is_empty() {
            None
        } else if STATUSES.contains(&status) {
            Some(status)
        } else {
            return Err(CoordinatorError::InvalidArgument(format!(
                "unknown status `{status}`; one of {}",
                STATUSES.join(", ")
            )));
        };
        let size = match page_size {
            0 => 50,
            n if n > 500 => {
                return Err(CoordinatorError::InvalidArgument(format!(
                    "`page_size` {n} is more than 500"
                )));
            }
            n => n,
        };
        let after = parse_page_token(page_token)?;
        let rows = self
            .store
            .list_runs(tenant, status, after, size as i64 + 1)
            .await?;
        let mut rows = rows;
        let next = if rows.len() > size as usize {
            rows.truncate(size as usize);
            rows.last()
                .map(|r| make_page_token(&r.created_at, &r.run_id))
                .unwrap_or_default()
        } else {
            String::new()
        };
        Ok((rows, next))
    }

    /// Events of a run of a tenant after `after_seq`.
    pub async fn list_events(
        &self,
        tenant: &str,
        run_id: &str,
        after_seq: u64,
        limit: u32,
    ) -> Result<Vec<EventRow>, CoordinatorError> {
        let run = self.get_run(tenant, run_id).await?;
        let limit = match limit {
            0 => 1000,
            n if n > 1000 => {
                return Err(CoordinatorError::InvalidArgument(format!(
                    "`limit` {n} is more than 1000"
                )));
            }
            n => n,
        };
        Ok(self
            .store
            .list_events(
                run.run_id,
                i64::try_from(after_seq).unwrap_or(i64::MAX),
                limit as i64,
            )
            .await?)
    }

    /// Subscribe to "run X has new events" signals (any run).
    pub fn subscribe_run_events(&self) -> broadcast::Receiver<Uuid> {
        self.run_events.subscribe()
    }

    /// Cancel a run that has not finished.
    pub async fn cancel_run(
        &self,
        tenant: &str,
        run_id: &str,
        reason: &str,
    ) -> Result<RunRow, CoordinatorError> {
        check_text("reason", reason, MAX_TEXT_BYTES)?;
        let reason = if reason.trim().is_empty() {
            "cancelled by request".to_owned()
        } else {
            reason.to_owned()
        };
        self.control_run(tenant, run_id, Input::Cancel { reason }, "run cancelled")
            .await
    }

    /// Operator: fail a call that waits outside any task (an accepted async
    /// webhook whose callback never came, a sync child run), so the run goes
    /// on (an agent sees the failure; a tool node takes `on_error`).
    ///
    /// Errors: `NotFound` for an unknown run; `FailedPrecondition` when the
    /// call is not open or does not wait outside a task, or the run ended;
    /// `InvalidArgument` for a bad call id or reason.
    pub async fn fail_waiting_call(
        &self,
        tenant: &str,
        run_id: &str,
        call_id: &str,
        by: &str,
        reason: &str,
    ) -> Result<RunRow, CoordinatorError> {
        require("call_id", call_id)?;
        check_text("call_id", call_id, MAX_ID_BYTES)?;
        check_text("reason", reason, MAX_TEXT_BYTES)?;
        let input = Input::FailWaitingCall {
            call_id: call_id.to_owned(),
            by: by.to_owned(),
            reason: if reason.trim().is_empty() {
                "no reason given".to_owned()
            } else {
                reason.to_owned()
            },
        };
        self.control_run(tenant, run_id, input, "waiting call failed by operator")
            .await
    }

    /// Operator pause: the run's tasks are not claimed until [`Coordinator::resume_run`].
    pub async fn pause_run(
        &self,
        tenant: &str,
        run_id: &str,
        by: &str,
        reason: &str,
    ) -> Result<RunRow, CoordinatorError> {
        require("operator", by)?;
        check_text("reason", reason, MAX_TEXT_BYTES)?;
        let input = Input::Pause {
            by: by.to_owned(),
            reason: reason.to_owned(),
        };
        self.control_run(tenant, run_id, input, "run paused by operator")
            .await
    }

    /// Lift an operator pause (a run with open uncertain outcomes stays paused).
    pub async fn resume_run(
        &self,
        tenant: &str,
        run_id: &str,
        by: &str,
        reason: &str,
    ) -> Result<RunRow, CoordinatorError> {
        require("operator", by)?;
        check_text("reason", reason, MAX_TEXT_BYTES)?;
        let input = Input::Resume {
            by: by.to_owned(),
            reason: reason.to_owned(),
        };
        self.control_run(tenant, run_id, input, "run resumed by operator")
            .await
    }

    /// Deliver a signal (kept until a wait takes it). Returns the run and
    /// whether `signal_id` had been delivered before (then nothing changed).
    ///
    /// Errors: `InvalidArgument` for a signal the workflow does not wait for
    /// or a payload its wait refuses; `FailedPrecondition` for a finished run,
    /// or for a `signal_id` already delivered with another name or payload.
    #[allow(clippy::too_many_arguments)]
    pub async fn signal_run(
        &self,
        tenant: &str,
        run_id: &str,
        name: &str,
        signal_id: &str,
        payload_json: &str,
        sent_by: &str,
    ) -> Result<(RunRow, bool), CoordinatorError> {
        require("name", name)?;
        check_text("name", name, MAX_ID_BYTES)?;
        require("signal_id", signal_id)?;
        check_text("signal_id", signal_id, MAX_ID_BYTES)?;
        check_text("sent_by", sent_by, MAX_ID_BYTES)?;
        if payload_json.len() > MAX_SIGNAL_BYTES {
            return Err(CoordinatorError::InvalidArgument(format!(
                "`payload_json` is {} bytes, more than the {MAX_SIGNAL_BYTES} bytes a signal may carry; \
                 send a reference (a URL, a document id) instead of the document",
                payload_json.len()
            )));
        }
        let payload = if payload_json.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str::<Value>(payload_json)
                .map(machine::normalize::strip_nul_value)
                .map_err(|e| {
                    CoordinatorError::InvalidArgument(format!("`payload_json` is not JSON: {e}"))
                })?
        };
        let run = self.get_run(tenant, run_id).await?;
        let input = Input::Signal {
            signal_id: signal_id.to_owned(),
            name: name.to_owned(),
            payload,
            sent_by: sent_by.to_owned(),
        };
        let applied = self
            .transition(run.run_id, None, |state, _| {
                machine::decide(state, input).map_err(CoordinatorError::from)
            })
            .await?;
        let duplicate = applied.events == 0;
        tracing::info!(run_id = %run.run_id, signal = name, duplicate, "signal delivered");
        Ok((self.get_run(tenant, run_id).await?, duplicate))
    }

    /// Decide an approval node's request (or a tool call's confirmation);
    /// returns the run afterwards and whether the decision had already been
    /// recorded (a retry: nothing changed).
    ///
    /// Errors: `PermissionDenied` without the node's `approver_grant` (or an
    /// edit where none is allowed), `Conflict` for a second decision that
    /// differs from the first, `FailedPrecondition` when the node is not
    /// waiting, `Unprocessable` for an edit that does not match
    /// `edits_schema`, `InvalidArgument` ("no such node", no such request,
    /// or no `request_id` for a node requested several times).
    pub async fn decide_approval(
        &self,
        tenant: &str,
        run_id: &str,
        d: ApprovalDecision,
    ) -> Result<(RunRow, bool), CoordinatorError> {
        if d.node.is_empty() && d.request_id.is_empty() {
            require("node", &d.node)?;
        }
        check_text("node", &d.node, MAX_ID_BYTES)?;
        check_text("request_id", &d.request_id, MAX_ID_BYTES)?;
        require("approver", &d.approver)?;
        check_text("approver", &d.approver, MAX_ID_BYTES)?;
        check_text("reason", &d.reason, MAX_TEXT_BYTES)?;
        for g in &d.approver_grants {
            check_text("approver_grants", g, MAX_ID_BYTES)?;
        }
        let edited_subject = if d.edited_subject_json.trim().is_empty() {
            None
        } else {
            Some(json_arg("edited_subject_json", &d.edited_subject_json)?)
        };
        let run = self.get_run(tenant, run_id).await?;
        let input = Input::DecideApproval {
            node: d.node.clone(),
            request: (!d.request_id.is_empty()).then(|| d.request_id.clone()),
            approve: d.approve,
            edited_subject,
            by: d.approver.clone(),
            grants: d.approver_grants,
            reason: d.reason,
        };
        let applied = self
            .transition(run.run_id, None, |state, _| {
                machine::decide(state, input).map_err(CoordinatorError::from)
            })
            .await?;
        let duplicate = applied.events == 0;
        tracing::info!(run_id = %run.run_id, node = d.node, request = d.request_id, approve = d.approve, approver = d.approver, duplicate, "approval decided");
        Ok((self.get_run(tenant, run_id).await?, duplicate))
    }

    /// The requests for a person that run `run_id` holds open (from its
    /// folded events). The caller has checked the run's tenant
    /// ([`Coordinator::get_run`]).
    pub async fn open_requests(
        &self,
        run_id: Uuid,
    ) -> Result<Vec<belay_machine::requests::OpenRequest>, CoordinatorError> {
        let state = self.store.run_state(run_id).await?;
        Ok(belay_machine::requests::open_requests(&state))
    }

    /// Apply an operator's control input to a run of `tenant`; returns the
    /// run as it is afterwards.
    pub(super) async fn control_run(
        &self,
        tenant: &str,
        run_id: &str,
        input: Input,
        what: &'static str,
    ) -> Result<RunRow, CoordinatorError> {
        let run = self.get_run(tenant, run_id).await?;
        self.transition(run.run_id, None, |state, _| {
            machine::decide(state, input).map_err(CoordinatorError::from)
        })
        .await?;
        tracing::info!(run_id = %run.run_id, "{what}");
        self.get_run(tenant, run_id).await
    }
}

impl Coordinator {
    /// A retried `StartRun` must be the same request: an idempotency key
    /// reused for another workflow or input is refused (as Stripe does),
    /// not silently answered with a run the caller did not ask for; so is
    /// a retry by another caller or with other caller grants, which would
    /// otherwise get a run started with permissions it does not have (or
    /// lose the ones it asked for).
    async fn same_request(&self, run: RunRow, req: &StartRun) -> Result<RunRow, CoordinatorError> {
        let input_text = if req.input_json.trim().is_empty() {
            "{}"
        } else {
            req.input_json.as_str()
        };
        let input = serde_json::from_str::<Value>(input_text)
            .map(machine::normalize::strip_nul_value)
            .ok();
        let used = |what: &str| {
            CoordinatorError::FailedPrecondition(format!(
                "idempotency key {} was already used {what} (run {}, workflow `{}`); use a new key for a new run",
                shown(&req.idempotency_key),
                run.run_id,
                run.workflow
            ))
        };
        if run.workflow != req.workflow || input.as_ref() != Some(&run.input) {
            return Err(used("for a different request"));
        }
        if run.caller != req.caller {
            return Err(used(&format!("by caller `{}`", run.caller)));
        }
        let mut asked = req.caller_grants.clone();
        asked.sort();
        asked.dedup();
        if self.started_with_grants(&run).await? != asked {
            return Err(used("with other caller grants"));
        }
        Ok(run)
    }

    /// The caller grants a run was started with (its `run_started` event),
    /// sorted.
    async fn started_with_grants(&self, run: &RunRow) -> Result<Vec<String>, CoordinatorError> {
        let first = self.store.list_events(run.run_id, 0, 1).await?;
        let mut grants: Vec<String> = first
            .first()
            .filter(|e| e.kind == "run_started")
            .and_then(|e| e.payload.get("caller_grants"))
            .and_then(|g| serde_json::from_value(g.clone()).ok())
            .unwrap_or_default();
        grants.sort();
        grants.dedup();
        Ok(grants)
    }
}

/// A person's decision of an approval node's request (or a tool call's
/// confirmation), as `RunService.DecideApproval` carries it.
#[derive(Debug, Clone, Default)]
pub struct ApprovalDecision {
    /// The node (or the call id of a confirmation); may be empty when
    /// `request_id` is given.
    pub node: String,
    /// The request decided; empty: the node's only request.
    pub request_id: String,
    /// Approve or decline.
    pub approve: bool,
    /// With `approve`, where allowed: the subject as edited (JSON); empty:
    /// as requested.
    pub edited_subject_json: String,
    /// Who decides.
    pub approver: String,
    /// Their permissions.
    pub approver_grants: Vec<String>,
    /// Why.
    pub reason: String,
}
