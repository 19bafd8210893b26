//! The gRPC API (`belay.v1`): thin adapters from requests to the
//! [`Coordinator`], plus the standard health and reflection services.
//!
//! Architecture Invariant: this is the one place where errors become
//! `tonic::Status`; database details never reach clients (they are logged).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use tracing::Instrument;

use belay_proto::v1::{
    self,
    definition_service_server::{DefinitionService, DefinitionServiceServer},
    run_service_server::{RunService, RunServiceServer},
    tenant_service_server::{TenantService, TenantServiceServer},
    worker_service_server::{WorkerService, WorkerServiceServer},
};
use futures_util::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

mod auth_layer;

pub use auth_layer::{AuthLayer, AuthService, principal};

use crate::auth::Authenticator;
use crate::coordinator::{ApprovalDecision, Coordinator, CoordinatorError, StartRun};
use crate::definitions::SourceFile;
use crate::machine::FailureClass;
use crate::store::{DefinitionRow, EventRow, RunRow};

/// The status code is the error's [`ErrorCode`](crate::error_code::ErrorCode);
/// the message its public one, with its details in it (gRPC has no field
/// for them). A store error is logged here.
impl From<CoordinatorError> for Status {
    fn from(e: CoordinatorError) -> Status {
        if let CoordinatorError::Store(store) = &e {
            tracing::error!(error = %store, "store error");
        }
        let message = match &e {
            CoordinatorError::Definitions(errors) => format!(
                "bundle refused, nothing was registered; {} error(s):\n{}",
                errors.len(),
                e.details().join("\n")
            ),
            CoordinatorError::Unprocessable { .. } => {
                format!("{}: {}", e.public_message(), e.details().join("; "))
            }
            _ => e.public_message(),
        };
        Status::new(e.code().grpc_code(), message)
    }
}

fn ts(t: &chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// A ready task no live worker can take, as `GetRun` shows it.
fn unclaimable_msg(t: crate::store::UnclaimableTask) -> v1::UnclaimableTask {
    v1::UnclaimableTask {
        task_id: t.task_id.to_string(),
        kind: t.kind,
        requires: t.requires,
        missing: t.missing,
        reason: t.reason,
    }
}

fn run_msg(r: RunRow) -> v1::Run {
    v1::Run {
        run_id: r.run_id.to_string(),
        tenant: r.tenant,
        workflow: r.workflow,
        workflow_version: r.workflow_version as u32,
        status: r.status,
        status_reason: r.status_reason,
        input_json: r.input.to_string(),
        output_json: r.output.map(|o| o.to_string()).unwrap_or_default(),
        idempotency_key: r.idempotency_key,
        caller: r.caller,
        last_seq: r.last_seq as u64,
        created_at: ts(&r.created_at),
        updated_at: ts(&r.updated_at),
    }
}

fn event_msg(e: EventRow) -> v1::RunEvent {
    v1::RunEvent {
        run_id: e.run_id.to_string(),
        seq: e.seq as u64,
        kind: e.kind,
        payload_json: e.payload.to_string(),
        recorded_at: ts(&e.recorded_at),
    }
}

fn definition_msg(d: DefinitionRow, created: bool) -> v1::Definition {
    v1::Definition {
        kind: d.kind,
        name: d.name,
        version: d.version as u32,
        content_hash: d.content_hash,
        created_at: ts(&d.created_at),
        created,
    }
}

/// Whether an event kind ends the run (closes a `WatchRun` stream).
pub fn is_final_event(kind: &str) -> bool {
    matches!(kind, "run_completed" | "run_failed" | "run_cancelled")
}

/// Implements every `belay.v1` service over one coordinator.
#[derive(Debug, Clone)]
pub struct Api {
    coord: Arc<Coordinator>,
    /// Asked again before a long poll or a stream hands something out.
    auth: Authenticator,
    /// Turns true when the server shuts down: open `WatchRun` streams end,
    /// so they cannot hold a graceful shutdown (and a deploy) forever.
    shutdown: tokio::sync::watch::Receiver<bool>,
}

impl Api {
    /// An API over `coord`, authenticating with `auth`; streams end when
    /// `shutdown` turns true.
    pub fn new(
        coord: Arc<Coordinator>,
        auth: Authenticator,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> Api {
        Api {
            coord,
            auth,
            shutdown,
        }
    }

    /// A worker key limited to tenants touches only their tasks:
    /// `PERMISSION_DENIED` naming the principal and the task's tenant. (A
    /// malformed or unknown task id is left for the coordinator to name.)
    /// The tasks a report's `claim_next` claims for its worker once the
    /// report is recorded: up to `max` (at most 64) ready tasks, without
    /// waiting, as `ClaimTasks` claims them. A claim that fails (bad
    /// capabilities, the database) hands out nothing and is logged: the
    /// report it rides on is recorded, and the worker's claim loop asks
    /// again.
    async fn claim_next(
        &self,
        p: &crate::auth::Principal,
        worker_id_sent: &str,
        max: u32,
        capabilities: Option<&v1::WorkerCapabilities>,
        received: tokio::time::Instant,
    ) -> Vec<v1::Task> {
        if max == 0 {
            return Vec::new();
        }
        let claimed = async {
            let capabilities = capability_tags(capabilities)?;
            let tenants = p.tenants.to_stored();
            let filter = crate::store::ClaimFilter {
                tenants: tenants.as_deref(),
                capabilities: capabilities.as_deref(),
            };
            let worker = worker_id(p, worker_id_sent);
            Ok::<_, Status>(
                self.coord
                    .claim_timed(&worker, max.min(64), 0, filter)
                    .await?,
            )
        }
        .await;
        match claimed {
            Ok(claimed) => {
                self.task_messages(&worker_id(p, worker_id_sent), claimed, received)
                    .await
            }
            Err(status) => {
                tracing::warn!(
                    code = ?status.code(),
                    error = status.message(),
                    "claiming the next task with a report failed; the report is recorded"
                );
                Vec::new()
            }
        }
    }

    /// The messages of the tasks a claim just leased to `worker` for a
    /// request the handler began at `received`, each with its dispatch
    /// recorded first where its spec allows
    /// ([`Coordinator::dispatch_with_claim`]; `Task.dispatched`) and when
    /// its lease began relative to `received` (`Task.lease_from_ms`,
    /// rounded down: the worker's bound stays early).
    async fn task_messages(
        &self,
        worker: &str,
        claimed: crate::coordinator::Claimed,
        received: tokio::time::Instant,
    ) -> Vec<v1::Task> {
        let lease = Lease {
            ms: self.coord.lease_ms(),
            from_ms: claimed
                .began
                .saturating_duration_since(received)
                .as_millis() as u64,
        };
        let mut out = Vec::with_capacity(claimed.tasks.len());
        for t in claimed.tasks {
            let dispatched = self.coord.dispatch_with_claim(worker, &t).await;
            out.push(task_message(t, lease, dispatched));
        }
        out
    }

    async fn require_task_tenant(
        &self,
        p: &crate::auth::Principal,
        task_id: &str,
    ) -> Result<(), Status> {
        if p.tenants == crate::auth::Tenants::All {
            return Ok(());
        }
        let Ok(id) = uuid::Uuid::parse_str(task_id) else {
            return Ok(());
        };
        let tenant = self
            .coord
            .store()
            .task_tenant(id)
            .await
            .map_err(CoordinatorError::from)?;
        match tenant {
            Some(t) => Ok(p.require_tenant(&t)?),
            None => Ok(()),
        }
    }
}

/// Most event payload bytes in one `ListRunEvents` page or `WatchRun` batch,
/// so a page of large events stays under clients' message limits; a page
/// always holds at least one event.
pub const MAX_PAGE_BYTES: usize = 3 * 1024 * 1024;

/// Keep events while their payloads fit in [`MAX_PAGE_BYTES`] (at least one).
fn cap_page(events: Vec<EventRow>) -> Vec<EventRow> {
    let mut total = 0usize;
    let mut out = Vec::with_capacity(events.len());
    for e in events {
        let size = e.payload.to_string().len();
        if !out.is_empty() && total + size > MAX_PAGE_BYTES {
            break;
        }
        total += size;
        out.push(e);
    }
    out
}

#[tonic::async_trait]
impl RunService for Api {
    async fn start_run(
        &self,
        req: Request<v1::StartRunRequest>,
    ) -> Result<Response<v1::StartRunResponse>, Status> {
        let p = principal(&req)?;
        let tenant = p.tenant_for(&req.get_ref().tenant)?;
        let header = |name: &str| req.metadata().get(name).and_then(|v| v.to_str().ok());
        let (span, trace) = crate::telemetry::start_run_span(
            header("traceparent"),
            header("tracestate"),
            &tenant,
            &req.get_ref().workflow,
        );
        let r = req.into_inner();
        let start = StartRun {
            tenant,
            workflow: r.workflow,
            input_json: r.input_json,
            idempotency_key: r.idempotency_key,
            caller: p.actor(&r.caller)?,
            caller_grants: p.narrow_grants(&r.caller_grants)?,
        };
        let (run, created) = self
            .coord
            .start_run_in_trace(start, trace)
            .instrument(span)
            .await?;
        Ok(Response::new(v1::StartRunResponse {
            run: Some(run_msg(run)),
            created,
        }))
    }

    async fn get_run(
        &self,
        req: Request<v1::GetRunRequest>,
    ) -> Result<Response<v1::GetRunResponse>, Status> {
        let p = principal(&req)?;
        let r = req.into_inner();
        let run = self
            .coord
            .get_run(&p.tenant_for(&r.tenant)?, &r.run_id)
            .await?;
        // The run is the caller's tenant's (get_run checked): so are its tasks.
        let unclaimable = self.coord.unclaimable_tasks(Some(run.run_id)).await?;
        let open = self.coord.open_requests(run.run_id).await?;
        Ok(Response::new(v1::GetRunResponse {
            run: Some(run_msg(run)),
            unclaimable: unclaimable.into_iter().map(unclaimable_msg).collect(),
            open_requests: open.into_iter().map(open_request_msg).collect(),
        }))
    }

    async fn list_runs(
        &self,
        req: Request<v1::ListRunsRequest>,
    ) -> Result<Response<v1::ListRunsResponse>, Status> {
        let p = principal(&req)?;
        let r = req.into_inner();
        let (runs, next) = self
            .coord
            .list_runs(
                &p.tenant_for(&r.tenant)?,
                &r.status,
                r.page_size,
                &r.page_token,
            )
            .await?;
        Ok(Response::new(v1::ListRunsResponse {
            runs: runs.into_iter().map(run_msg).collect(),
            next_page_token: next,
        }))
    }

    async fn list_run_events(
        &self,
        req: Request<v1::ListRunEventsRequest>,
    ) -> Result<Response<v1::ListRunEventsResponse>, Status> {
        let p = principal(&req)?;
        let r = req.into_inner();
        let events = self
            .coord
            .list_events(&p.tenant_for(&r.tenant)?, &r.run_id, r.after_seq, r.limit)
            .await?;
        Ok(Response::new(v1::ListRunEventsResponse {
            events: cap_page(events).into_iter().map(event_msg).collect(),
        }))
    }

    type WatchRunStream =
        Pin<Box<dyn Stream<Item = Result<v1::RunEvent, Status>> + Send + 'static>>;

    async fn watch_run(
        &self,
        req: Request<v1::WatchRunRequest>,
    ) -> Result<Response<Self::WatchRunStream>, Status> {
        let p = principal(&req)?;
        let r = req.into_inner();
        // Validates tenant and run before the stream starts.
        let run = self
            .coord
            .get_run(&p.tenant_for(&r.tenant)?, &r.run_id)
            .await?;
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let coord = Arc::clone(&self.coord);
        let auth = self.auth.clone();
        let mut shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            let mut wake = coord.subscribe_run_events();
            let mut after = r.after_seq;
            loop {
                // A key revoked while the stream is open ends it.
                if let Err(e) = auth.still_active(&p).await {
                    let _ = tx.send(Err(Status::from(e))).await;
                    return;
                }
                if *shutdown.borrow() {
                    let _ = tx
                        .send(Err(Status::unavailable(
                            "the engine is shutting down; resume from the last seq",
                        )))
                        .await;
                    return;
                }
                let events = match coord
                    .store()
                    .list_events(run.run_id, i64::try_from(after).unwrap_or(i64::MAX), 500)
                    .await
                {
                    Ok(events) => cap_page(events),
                    Err(e) => {
                        let _ = tx.send(Err(Status::from(CoordinatorError::Store(e)))).await;
                        return;
                    }
                };
                let mut finished = false;
                let got = events.len();
                for e in events {
                    after = e.seq as u64;
                    finished |= is_final_event(&e.kind);
                    if tx.send(Ok(event_msg(e))).await.is_err() {
                        return; // client went away
                    }
                }
                if finished {
                    return;
                }
                if got == 0 {
                    // Nothing after `after`: a finished run has nothing more
                    // to say (the caller resumed at or past its end).
                    match coord.store().get_run(&run.tenant, run.run_id).await {
                        Ok(Some(now))
                            if matches!(
                                now.status.as_str(),
                                "completed" | "failed" | "cancelled"
                            ) && after >= now.last_seq as u64 =>
                        {
                            return;
                        }
                        Ok(_) => {}
                        Err(e) => {
                            let _ = tx.send(Err(Status::from(CoordinatorError::Store(e)))).await;
                            return;
                        }
                    }
                    // Wait for a signal for this run, re-checking every second
                    // in case the LISTEN connection dropped one.
                    let deadline = tokio::time::sleep(std::time::Duration::from_secs(1));
                    tokio::pin!(deadline);
                    loop {
                        tokio::select! {
                            _ = &mut deadline => break,
                            _ = tx.closed() => return,
                            _ = shutdown.changed() => break,
                            msg = wake.recv() => match msg {
                                Ok(id) if id == run.run_id => break,
                                Ok(_) => continue,
                                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => break,
                                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                            },
                        }
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn cancel_run(
        &self,
        req: Request<v1::CancelRunRequest>,
    ) -> Result<Response<v1::CancelRunResponse>, Status> {
        let p = principal(&req)?;
        let r = req.into_inner();
        let reason = format!("{} (cancelled by {})", r.reason.trim(), p.id);
        let run = self
            .coord
            .cancel_run(&p.tenant_for(&r.tenant)?, &r.run_id, reason.trim_start())
            .await?;
        Ok(Response::new(v1::CancelRunResponse {
            run: Some(run_msg(run)),
        }))
    }

    async fn pause_run(
        &self,
        req: Request<v1::PauseRunRequest>,
    ) -> Result<Response<v1::PauseRunResponse>, Status> {
        let p = principal(&req)?;
        let r = req.into_inner();
        let run = self
            .coord
            .pause_run(
                &p.tenant_for(&r.tenant)?,
                &r.run_id,
                &p.actor(&r.operator)?,
                &r.reason,
            )
            .await?;
        Ok(Response::new(v1::PauseRunResponse {
            run: Some(run_msg(run)),
        }))
    }

    async fn resume_run(
        &self,
        req: Request<v1::ResumeRunRequest>,
    ) -> Result<Response<v1::ResumeRunResponse>, Status> {
        let p = principal(&req)?;
        let r = req.into_inner();
        let run = self
            .coord
            .resume_run(
                &p.tenant_for(&r.tenant)?,
                &r.run_id,
                &p.actor(&r.operator)?,
                &r.reason,
            )
            .await?;
        Ok(Response::new(v1::ResumeRunResponse {
            run: Some(run_msg(run)),
        }))
    }

    async fn signal_run(
        &self,
        req: Request<v1::SignalRunRequest>,
    ) -> Result<Response<v1::SignalRunResponse>, Status> {
        let p = principal(&req)?;
        let r = req.into_inner();
        let (run, duplicate) = self
            .coord
            .signal_run(
                &p.tenant_for(&r.tenant)?,
                &r.run_id,
                &r.name,
                &r.signal_id,
                &r.payload_json,
                &p.actor(&r.sent_by)?,
            )
            .await?;
        Ok(Response::new(v1::SignalRunResponse {
            run: Some(run_msg(run)),
            duplicate,
        }))
    }

    async fn decide_approval(
        &self,
        req: Request<v1::DecideApprovalRequest>,
    ) -> Result<Response<v1::DecideApprovalResponse>, Status> {
        let p = principal(&req)?;
        let r = req.into_inner();
        // The tenant first: a key of another tenant is told that, not
        // that it lacks the grants it asked for.
        let tenant = p.tenant_for(&r.tenant)?;
        let decision = ApprovalDecision {
            approver: p.actor(&r.approver)?,
            approver_grants: p.narrow_grants(&r.approver_grants)?,
            node: r.node,
            request_id: r.request_id,
            approve: r.approve,
            edited_subject_json: r.edited_subject_json,
            reason: r.reason,
        };
        let (run, duplicate) = self
            .coord
            .decide_approval(&tenant, &r.run_id, decision)
            .await?;
        Ok(Response::new(v1::DecideApprovalResponse {
            run: Some(run_msg(run)),
            duplicate,
        }))
    }

    async fn provide_tool_input(
        &self,
        req: Request<v1::ProvideToolInputRequest>,
    ) -> Result<Response<v1::ProvideToolInputResponse>, Status> {
        let p = principal(&req)?;
        let r = req.into_inner();
        let (run, duplicate) = self
            .coord
            .provide_tool_input(
                &p.tenant_for(&r.tenant)?,
                &r.run_id,
                &r.call_id,
                &r.request_id,
                &r.answer_json,
                &p.actor(&r.by)?,
            )
            .await?;
        Ok(Response::new(v1::ProvideToolInputResponse {
            run: Some(run_msg(run)),
            duplicate,
        }))
    }
}

#[tonic::async_trait]
impl DefinitionService for Api {
    async fn register_bundle(
        &self,
        req: Request<v1::RegisterBundleRequest>,
    ) -> Result<Response<v1::RegisterBundleResponse>, Status> {
        let p = principal(&req)?;
        let r = req.into_inner();
        let tenant = p.tenant_for(&r.tenant)?;
        let files = r
            .files
            .into_iter()
            .map(|f| SourceFile {
                path: f.path,
                content: f.content,
            })
            .collect();
        let rows = self.coord.register_bundle(&tenant, files).await?;
        Ok(Response::new(v1::RegisterBundleResponse {
            definitions: rows
                .into_iter()
                .map(|(d, created)| definition_msg(d, created))
                .collect(),
        }))
    }

    async fn list_definitions(
        &self,
        req: Request<v1::ListDefinitionsRequest>,
    ) -> Result<Response<v1::ListDefinitionsResponse>, Status> {
        let p = principal(&req)?;
        let r = req.into_inner();
        let tenant = p.tenant_for(&r.tenant)?;
        let kind = match r.kind.as_str() {
            "" => None,
            k @ ("tool" | "agent" | "workflow") => Some(k),
            other => {
                return Err(Status::invalid_argument(format!(
                    "unknown kind `{other}`; one of tool, agent, workflow"
                )));
            }
        };
        let rows = self
            .coord
            .store()
            .list_definitions(&tenant, kind)
            .await
            .map_err(CoordinatorError::from)?;
        Ok(Response::new(v1::ListDefinitionsResponse {
            definitions: rows.into_iter().map(|d| definition_msg(d, false)).collect(),
        }))
    }
}

#[tonic::async_trait]
impl TenantService for Api {
    async fn set_tenant_grants(
        &self,
        req: Request<v1::SetTenantGrantsRequest>,
    ) -> Result<Response<v1::SetTenantGrantsResponse>, Status> {
        let p = principal(&req)?;
        let r = req.into_inner();
        let tenant = p.tenant_for(&r.tenant)?;
        if let Some(bad) = r
            .grants
            .iter()
            .find(|g| g.trim().is_empty() || g.contains(char::is_whitespace))
        {
            return Err(Status::invalid_argument(format!(
                "grant {} is empty or contains whitespace",
                crate::coordinator::shown(bad)
            )));
        }
        for grant in &r.grants {
            crate::coordinator::require("grants[]", grant)?;
        }
        let grants = self
            .coord
            .store()
            .set_tenant_grants(&tenant, &r.grants)
            .await
            .map_err(CoordinatorError::from)?;
        Ok(Response::new(v1::SetTenantGrantsResponse { grants }))
    }

    async fn get_tenant_grants(
        &self,
        req: Request<v1::GetTenantGrantsRequest>,
    ) -> Result<Response<v1::GetTenantGrantsResponse>, Status> {
        let p = principal(&req)?;
        let r = req.into_inner();
        let tenant = p.tenant_for(&r.tenant)?;
        let grants = self
            .coord
            .store()
            .tenant_grants(&tenant)
            .await
            .map_err(CoordinatorError::from)?;
        Ok(Response::new(v1::GetTenantGrantsResponse { grants }))
    }
}

fn failure_class(raw: i32) -> Result<FailureClass, Status> {
    match v1::FailureClass::try_from(raw) {
        Ok(v1::FailureClass::NotSent) => Ok(FailureClass::NotSent),
        Ok(v1::FailureClass::MayHaveActed) => Ok(FailureClass::MayHaveActed),
        Ok(v1::FailureClass::Rejected) => Ok(FailureClass::Rejected),
        // Unspecified means the worker does not know: assume the worst.
        Ok(v1::FailureClass::Unspecified) => Ok(FailureClass::MayHaveActed),
        Err(_) => Err(Status::invalid_argument(format!(
            "unknown failure class {raw}"
        ))),
    }
}

/// What a worker added to an MCP call's report: the definition hash (at
/// most 128 bytes: `sha256:` and 64 hex digits) and the kind of failure.
fn mcp_report(definition_hash: &str, kind: i32) -> Result<crate::coordinator::McpReport, Status> {
    if definition_hash.len() > 128 {
        return Err(Status::invalid_argument(
            "`mcp_definition_hash` is longer than 128 bytes",
        ));
    }
    let kind = match v1::ToolFailureKind::try_from(kind) {
        Ok(v1::ToolFailureKind::Unspecified) => None,
        Ok(v1::ToolFailureKind::ToolError) => Some(crate::machine::ToolFailureKind::ToolError),
        Ok(v1::ToolFailureKind::ProtocolError) => {
            Some(crate::machine::ToolFailureKind::ProtocolError)
        }
        Ok(v1::ToolFailureKind::Transport) => Some(crate::machine::ToolFailureKind::Transport),
        Err(_) => {
            return Err(Status::invalid_argument(format!(
                "unknown failure kind {kind}"
            )));
        }
    };
    Ok(crate::coordinator::McpReport {
        definition_hash: Some(definition_hash.to_owned()).filter(|h| !h.is_empty()),
        kind,
    })
}

/// A lease as `Task` states it: its length, and from how long after the
/// request was received it runs (`Task.lease_ms`, `Task.lease_from_ms`).
#[derive(Debug, Clone, Copy)]
struct Lease {
    ms: u64,
    from_ms: u64,
}

/// A claimed task as the worker protocol sends it.
fn task_message(t: crate::store::ClaimedTask, lease: Lease, dispatched: bool) -> v1::Task {
    v1::Task {
        task_id: t.task_id.to_string(),
        run_id: t.run_id.to_string(),
        tenant: t.tenant,
        kind: t.kind,
        attempt: t.attempt as u32,
        lease_ms: lease.ms,
        spec_json: t.spec.to_string(),
        idempotency_key: t.idempotency_key,
        dispatched,
        lease_from_ms: lease.from_ms,
    }
}

/// The capability tags of a claim (`belay_proto::pools`); a worker that
/// sends none (older than worker pools) claims any task, as before.
/// Errors: `INVALID_ARGUMENT` naming a malformed capability.
fn capability_tags(
    capabilities: Option<&v1::WorkerCapabilities>,
) -> Result<Option<Vec<String>>, Status> {
    Ok(capabilities
        .map(belay_proto::pools::capability_tags)
        .transpose()
        .map_err(CoordinatorError::InvalidArgument)?)
}

#[tonic::async_trait]
impl WorkerService for Api {
    async fn claim_tasks(
        &self,
        req: Request<v1::ClaimTasksRequest>,
    ) -> Result<Response<v1::ClaimTasksResponse>, Status> {
        let received = tokio::time::Instant::now();
        let p = principal(&req)?;
        let r = req.into_inner();
        let capabilities = capability_tags(r.capabilities.as_ref())?;
        let tenants = p.tenants.to_stored();
        let filter = crate::store::ClaimFilter {
            tenants: tenants.as_deref(),
            capabilities: capabilities.as_deref(),
        };
        let claimed = self
            .coord
            .claim_timed(&worker_id(&p, &r.worker_id), r.max_tasks, r.wait_ms, filter)
            .await?;
        // A long poll outlives its authentication: a key revoked while it
        // waited gets nothing. What it claimed stays leased to it, never
        // dispatched, until the lease expires and the sweeper hands it to
        // another worker (an undispatched task is safe to give again).
        if r.wait_ms > 0 && !claimed.tasks.is_empty() {
            self.auth.still_active(&p).await?;
        }
        Ok(Response::new(v1::ClaimTasksResponse {
            tasks: self
                .task_messages(&worker_id(&p, &r.worker_id), claimed, received)
                .await,
        }))
    }

    async fn heartbeat(
        &self,
        req: Request<v1::HeartbeatRequest>,
    ) -> Result<Response<v1::HeartbeatResponse>, Status> {
        let p = principal(&req)?;
        let r = req.into_inner();
        let leases: Vec<(String, u32)> = r
            .leases
            .into_iter()
            .map(|l| (l.task_id, l.attempt))
            .collect();
        for (task_id, _) in &leases {
            self.require_task_tenant(&p, task_id).await?;
        }
        let lease_ms = self.coord.lease_ms();
        let out = self
            .coord
            .heartbeat(&worker_id(&p, &r.worker_id), &leases)
            .await?;
        Ok(Response::new(v1::HeartbeatResponse {
            leases: out
                .into_iter()
                .map(|(task_id, attempt, held)| v1::LeaseStatus {
                    task_id,
                    attempt,
                    held,
                    lease_ms,
                })
                .collect(),
        }))
    }

    async fn dispatch_tool_call(
        &self,
        req: Request<v1::DispatchToolCallRequest>,
    ) -> Result<Response<v1::DispatchToolCallResponse>, Status> {
        let p = principal(&req)?;
        let r = req.into_inner();
        let worker = worker_id(&p, &r.worker_id);
        self.require_task_tenant(&p, &r.task_id).await?;
        // A `type: mcp` call: the tenant's pinned definition, looked up (or
        // pinned on first use) before the dispatch is recorded, so a failure
        // here leaves the call undispatched.
        let mcp_pinned_hash = if r.mcp_definition_hash.is_empty() {
            String::new()
        } else {
            self.coord
                .pin_mcp_for_dispatch(&worker, &r.task_id, r.attempt, &r.mcp_definition_hash)
                .await?
        };
        let dispatched = self
            .coord
            .dispatch_call(&worker, &r.task_id, r.attempt)
            .await?;
        Ok(Response::new(v1::DispatchToolCallResponse {
            callback_url: dispatched.callback_url.unwrap_or_default(),
            mcp_pinned_hash,
            secrets: dispatched
                .secrets
                .into_iter()
                .map(|(key, value)| v1::SecretValue {
                    key,
                    value: value.into_inner(),
                })
                .collect(),
        }))
    }

    async fn report_mcp_tools(
        &self,
        req: Request<v1::ReportMcpToolsRequest>,
    ) -> Result<Response<v1::ReportMcpToolsResponse>, Status> {
        let p = principal(&req)?;
        let r = req.into_inner();
        let tools = r
            .tools
            .into_iter()
            .map(|t| crate::mcp_pins::McpToolReport {
                name: t.name,
                definition_hash: t.definition_hash,
                definition_json: t.definition_json,
                refusal: t.refusal,
                suggested_repeat_safety: t.suggested_repeat_safety,
            })
            .collect();
        let new = self
            .coord
            .report_mcp_tools(
                &worker_id(&p, &r.worker_id),
                &r.server,
                &r.protocol_version,
                tools,
            )
            .await?;
        Ok(Response::new(v1::ReportMcpToolsResponse {
            new_definitions: u32::try_from(new).unwrap_or(u32::MAX),
        }))
    }

    async fn complete_task(
        &self,
        req: Request<v1::CompleteTaskRequest>,
    ) -> Result<Response<v1::CompleteTaskResponse>, Status> {
        let received = tokio::time::Instant::now();
        let p = principal(&req)?;
        let r = req.into_inner();
        self.require_task_tenant(&p, &r.task_id).await?;
        let secrets = r
            .vaulted_secrets
            .into_iter()
            .map(|s| (s.key, crate::vault::SecretText::new(s.value)))
            .collect();
        let worker = worker_id(&p, &r.worker_id);
        // The filter a `claim_next` claims with, for the task the report's
        // own transition may hand over (bad capabilities: none handed, and
        // `claim_next` below says why in the log).
        let capabilities = match r.claim_next {
            0 => None,
            _ => capability_tags(r.capabilities.as_ref()).ok(),
        };
        let tenants = p.tenants.to_stored();
        let next = capabilities.as_ref().map(|c| crate::store::ClaimFilter {
            tenants: tenants.as_deref(),
            capabilities: c.as_deref(),
        });
        let handed = self
            .coord
            .complete_sampled(
                &worker,
                &r.task_id,
                r.attempt,
                &r.result_json,
                secrets,
                r.sampling_usage.map(sampling_usage),
                mcp_report(
                    &r.mcp_definition_hash,
                    v1::ToolFailureKind::Unspecified as i32,
                )?,
                next,
            )
            .await?;
        let mut tasks = match handed {
            Some(claimed) => self.task_messages(&worker, claimed, received).await,
            None => Vec::new(),
        };
        // The rest of `claim_next` (all of it when nothing was handed) is
        // claimed as `ClaimTasks` claims.
        let rest = r.claim_next.saturating_sub(tasks.len() as u32);
        tasks.extend(
            self.claim_next(&p, &r.worker_id, rest, r.capabilities.as_ref(), received)
                .await,
        );
        Ok(Response::new(v1::CompleteTaskResponse { tasks }))
    }

    async fn fail_task(
        &self,
        req: Request<v1::FailTaskRequest>,
    ) -> Result<Response<v1::FailTaskResponse>, Status> {
        let p = principal(&req)?;
        let r = req.into_inner();
        self.require_task_tenant(&p, &r.task_id).await?;
        let class = failure_class(r.class)?;
        let status_code = u16::try_from(r.status_code).ok().filter(|c| *c > 0);
        self.coord
            .fail_sampled(
                &worker_id(&p, &r.worker_id),
                &r.task_id,
                r.attempt,
                &r.error,
                class,
                status_code,
                r.sampling_usage.map(sampling_usage),
                mcp_report(&r.mcp_definition_hash, r.failure_kind)?,
            )
            .await?;
        Ok(Response::new(v1::FailTaskResponse {}))
    }

    async fn request_tool_input(
        &self,
        req: Request<v1::RequestToolInputRequest>,
    ) -> Result<Response<v1::RequestToolInputResponse>, Status> {
        let p = principal(&req)?;
        let r = req.into_inner();
        self.require_task_tenant(&p, &r.task_id).await?;
        self.coord
            .request_tool_input(
                &worker_id(&p, &r.worker_id),
                &r.task_id,
                r.attempt,
                &r.via,
                &r.requests_json,
                &r.request_state,
                r.may_have_acted,
                r.sampling_usage.map(sampling_usage),
            )
            .await?;
        Ok(Response::new(v1::RequestToolInputResponse {}))
    }
}

/// The worker id a lease is held under: `<principal id>/<worker id>`, so
/// the fencing of every lease also names the key that claimed it: a
/// worker key can heartbeat, dispatch, complete or fail only the tasks it
/// claimed itself, and it claims only tasks of tenants it may serve. An
/// empty worker id stays empty (and is refused by the coordinator).
fn worker_id(p: &crate::auth::Principal, raw: &str) -> String {
    if raw.is_empty() {
        String::new()
    } else {
        format!("{}/{raw}", p.id)
    }
}

/// The wire form of a worker's `SamplingUsage` report.
fn sampling_usage(u: v1::SamplingUsage) -> belay_proto::wire::SamplingUsage {
    belay_proto::wire::SamplingUsage {
        requests: u.requests,
        input_tokens: u.input_tokens,
        output_tokens: u.output_tokens,
    }
}

/// How long a gRPC connection is kept before the engine asks the peer to
/// reconnect (HTTP/2 GOAWAY): five minutes.
pub const MAX_CONNECTION_AGE: std::time::Duration = std::time::Duration::from_secs(300);

/// How long calls in flight on a connection past [`MAX_CONNECTION_AGE`]
/// may go on before it is closed: a minute, longer than a claim's long
/// poll (30 s); a `WatchRun` stream still open then breaks, and clients
/// resume it from their last `seq`.
pub const MAX_CONNECTION_AGE_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// Serve every service on `listener` until `shutdown` completes: a
/// `TcpListener` serves plaintext, a [`crate::tls::Listener`] plaintext or
/// TLS. Handlers find the caller's [`crate::tls::PeerInfo`] among the
/// request's extensions.
///
/// Errors: reflection setup or the transport failing.
pub async fn serve(
    coord: Arc<Coordinator>,
    auth: Authenticator,
    listener: impl Into<crate::tls::Listener>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut stop_seen = stop_rx.clone();
    let api = Api::new(Arc::clone(&coord), auth.clone(), stop_rx);
    let shutdown = async move {
        shutdown.await;
        // End open streams and long-poll claims first, so the graceful
        // shutdown can finish.
        coord.stop_claims();
        let _ = stop_tx.send(true);
    };
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    set_health(&health_reporter, true).await;
    // Health follows the database: without it the engine can do nothing, so
    // load balancers and readiness probes should look elsewhere.
    let health_task = {
        let reporter = health_reporter.clone();
        let store = api.coord.store().clone();
        tokio::spawn(async move {
            let mut serving = true;
            loop {
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
                let ok = tokio::time::timeout(std::time::Duration::from_secs(2), store.ping())
                    .await
                    .is_ok_and(|r| r.is_ok());
                if ok != serving {
                    serving = ok;
                    tracing::warn!(serving, "database health changed");
                    set_health(&reporter, ok).await;
                }
            }
        })
    };
    // Reflection in both versions: grpcurl, Postman and buf speak v1;
    // grpcurl from PyPI and Python's grpcio-reflection speak only v1alpha.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(belay_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;
    let listener: crate::tls::Listener = listener.into();
    let addr: Option<SocketAddr> = listener.local_addr().ok();
    tracing::info!(?addr, tls = listener.is_tls(), "gRPC serving");
    let server = tonic::transport::Server::builder()
        // Connections are rebalanced over the replicas: each one is told
        // to go away (HTTP/2 GOAWAY) after a while, and closed once its
        // calls in flight end or the grace (longer than a claim's long
        // poll) runs out; workers and clients reconnect through the
        // Service, so a replica added by a scale-up or a rolling restart
        // gets its share within minutes.
        .max_connection_age(MAX_CONNECTION_AGE)
        .max_connection_age_grace(MAX_CONNECTION_AGE_GRACE)
        // Every request is authenticated before it is routed; health and
        // reflection are public (crate::auth::policy).
        .layer(AuthLayer::new(auth))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        // Run inputs up to MAX_JSON_BYTES plus framing.
        .add_service(
            RunServiceServer::new(api.clone())
                .max_decoding_message_size(crate::coordinator::MAX_JSON_BYTES + 1024 * 1024),
        )
        .add_service(DefinitionServiceServer::new(api.clone()))
        .add_service(TenantServiceServer::new(api.clone()))
        // Results up to MAX_JSON_BYTES plus framing; tonic's default is 4 MiB.
        .add_service(
            WorkerServiceServer::new(api)
                .max_decoding_message_size(crate::coordinator::MAX_JSON_BYTES + 1024 * 1024),
        )
        // The listener sets TCP_NODELAY and does the TLS handshakes; each
        // request carries its connection's `tls::PeerInfo`.
        .serve_with_incoming_shutdown(listener.into_incoming(), shutdown);
    tokio::pin!(server);
    // Graceful shutdown waits for open streams; our own `WatchRun` streams
    // end at once, but others (a health `Watch`) never do. Give them a
    // bounded grace so a deploy is never stuck.
    let result = tokio::select! {
        r = &mut server => r,
        _ = async {
            let _ = stop_seen.wait_for(|stopping| *stopping).await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => {
            tracing::warn!(grace_ms = SHUTDOWN_GRACE.as_millis() as u64, "streams still open after the shutdown grace; closing");
            Ok(())
        }
    };
    health_task.abort();
    result?;
    Ok(())
}

/// How tonic puts each connection's [`crate::tls::PeerInfo`] among the
/// extensions of its requests.
impl tonic::transport::server::Connected for crate::tls::Connection {
    type ConnectInfo = crate::tls::PeerInfo;

    fn connect_info(&self) -> crate::tls::PeerInfo {
        self.peer().clone()
    }
}

/// How long a graceful shutdown may wait for open streams.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// An open request for a person, as `GetRunResponse.open_requests` carries it.
fn open_request_msg(r: belay_machine::requests::OpenRequest) -> v1::OpenRequest {
    v1::OpenRequest {
        request_id: r.request_id,
        kind: r.kind.as_str().to_owned(),
        node: r.node,
        call_id: r.call_id,
        approver_grant: r.approver_grant,
    }
}

/// Set every service's health, and the server's as a whole (the empty
/// service name, which the kubelet's gRPC probe, `belay health` and the
/// images' HEALTHCHECK ask about), to serving or not.
async fn set_health(reporter: &tonic_health::server::HealthReporter, serving: bool) {
    use tonic_health::ServingStatus;
    let status = if serving {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    };
    for service in [
        "",
        <RunServiceServer<Api> as tonic::server::NamedService>::NAME,
        <DefinitionServiceServer<Api> as tonic::server::NamedService>::NAME,
        <TenantServiceServer<Api> as tonic::server::NamedService>::NAME,
        <WorkerServiceServer<Api> as tonic::server::NamedService>::NAME,
    ] {
        reporter.set_service_status(service, status).await;
    }
}
