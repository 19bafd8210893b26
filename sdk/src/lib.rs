//! Belay client library: a typed wrapper over the `belay.v1` gRPC services
//! for applications and the `belay` CLI, a client of the engine's admin HTTP
//! endpoint ([`admin::AdminClient`]), and a readable one-line rendering of
//! run events ([`timeline_line`]).

pub mod admin;
pub mod keys;

use std::path::{Path, PathBuf};

use belay_proto::v1::{
    self, definition_service_client::DefinitionServiceClient, run_service_client::RunServiceClient,
    tenant_service_client::TenantServiceClient,
};
use futures_util::StreamExt;
use serde_json::Value;

pub use belay_proto::connect::{AuthChannel, ConnectError, ConnectOptions};

pub use belay_proto::v1::{Definition, Run, RunEvent, UnclaimableTask};

/// Largest gRPC message the client sends or accepts, bytes (64 MiB).
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// A gRPC status code as short words (`not found`, `permission denied`).
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "ok",
        Code::Cancelled => "cancelled",
        Code::Unknown => "unknown error",
        Code::InvalidArgument => "invalid argument",
        Code::DeadlineExceeded => "deadline exceeded",
        Code::NotFound => "not found",
        Code::AlreadyExists => "already exists",
        Code::PermissionDenied => "permission denied",
        Code::ResourceExhausted => "resource exhausted",
        Code::FailedPrecondition => "failed precondition",
        Code::Aborted => "aborted",
        Code::OutOfRange => "out of range",
        Code::Unimplemented => "unimplemented",
        Code::Internal => "internal error",
        Code::Unavailable => "unavailable",
        Code::DataLoss => "data loss",
        Code::Unauthenticated => "unauthenticated",
    }
}

/// Errors of the client.
#[derive(Debug, thiserror::Error)]
pub enum SdkError {
    /// The connection could not be set up: a malformed URL, an unreadable
    /// CA or client certificate file, a TLS option with `http://`, an API
    /// key a header cannot carry.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The engine answered with an error status (or could not be reached:
    /// `Unavailable`, with the transport's causes, e.g. a certificate that
    /// is not trusted).
    #[error("{}: {}", code_name(.0.code()), belay_proto::connect::status_detail(.0))]
    Status(#[from] tonic::Status),
    /// Reading definition files failed.
    #[error("reading {path}: {source}")]
    Io {
        /// File or folder.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// A JSON argument is not JSON.
    #[error("invalid JSON in {what}: {source}")]
    Json {
        /// Which argument.
        what: String,
        /// Cause.
        source: serde_json::Error,
    },
    /// A definition bundle larger than the engine takes
    /// ([`MAX_BUNDLE_BYTES`]); nothing was sent. Names the largest file.
    #[error(
        "the bundle is {total} bytes, more than the {limit} bytes the engine takes in one registration; the largest file is {largest} ({largest_bytes} bytes): register fewer files at once, or make them smaller"
    )]
    BundleTooLarge {
        /// Bytes of all files' contents.
        total: usize,
        /// [`MAX_BUNDLE_BYTES`].
        limit: usize,
        /// Path of the largest file.
        largest: String,
        /// Its size in bytes.
        largest_bytes: usize,
    },
    /// The admin endpoint URL is malformed.
    #[error("invalid admin URL {url:?}: {message}")]
    InvalidAdminUrl {
        /// URL given.
        url: String,
        /// What is wrong.
        message: String,
    },
    /// A CA file holds no usable certificate.
    #[error("the CA file {}: {message}", path.display())]
    InvalidCaFile {
        /// Its path.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// No admin token was given.
    #[error("no admin token: pass --admin-token or set BELAY_ADMIN_TOKEN")]
    MissingAdminToken,
    /// The admin endpoint could not be reached or its answer not read.
    #[error("admin endpoint: {0}")]
    Http(#[from] reqwest::Error),
    /// The admin endpoint refused the request; `message` is the server's.
    #[error("{message} ({code}, HTTP {status}){}", details_text(.details))]
    Admin {
        /// HTTP status.
        status: u16,
        /// Error code (`not_found`, `conflict`, `unprocessable`, ...).
        code: String,
        /// The server's message.
        message: String,
        /// Further items (e.g. every violation of the output type).
        details: Vec<String>,
    },
}

fn details_text(details: &[String]) -> String {
    details.iter().map(|d| format!("\n  - {d}")).collect()
}

/// A connection to one engine, for one tenant. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Client {
    tenant: String,
    runs: RunServiceClient<AuthChannel>,
    definitions: DefinitionServiceClient<AuthChannel>,
    tenants: TenantServiceClient<AuthChannel>,
}

/// Options of [`Client::start_run`].
#[derive(Debug, Clone, Default)]
pub struct StartOptions {
    /// Idempotency key; the same key returns the same run.
    pub idempotency_key: String,
    /// Who starts the run.
    pub caller: String,
    /// Permissions the caller holds.
    pub caller_grants: Vec<String>,
}

impl Client {
    /// Connect lazily to `url` (e.g. `http://127.0.0.1:50051`) for `tenant`,
    /// without an API key: [`Client::connect`] with just the URL.
    ///
    /// Errors: as [`Client::connect`].
    pub fn connect_lazy(url: &str, tenant: &str) -> Result<Client, SdkError> {
        Client::connect(&ConnectOptions::new(url), tenant)
    }

    /// Connect lazily to the engine of `options` (its URL, `https://` with
    /// a CA file or the system's trust store, a client certificate, the API
    /// key sent with every call) for `tenant`; the first call establishes
    /// the connection.
    ///
    /// Errors: [`SdkError::Connect`].
    pub fn connect(options: &ConnectOptions, tenant: &str) -> Result<Client, SdkError> {
        let channel = options.connect_lazy()?;
        Ok(Client {
            tenant: tenant.to_owned(),
            // Runs carry inputs, outputs and events up to several MiB;
            // tonic's default 4 MiB decode limit would refuse them.
            runs: RunServiceClient::new(channel.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            definitions: DefinitionServiceClient::new(channel.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            tenants: TenantServiceClient::new(channel),
        })
    }

    /// The tenant this client acts for.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// Register every `*.tools.abl`, `*.yaml` and `*.yml` file under `paths`
    /// (files or folders, not recursive into hidden folders) as one bundle.
    pub async fn register_paths(&self, paths: &[PathBuf]) -> Result<Vec<Definition>, SdkError> {
        let mut files = Vec::new();
        for path in paths {
            collect_files(path, &mut files)?;
        }
        files.sort_by(|a: &v1::DefinitionFile, b| a.path.cmp(&b.path));
        self.register_files(files).await
    }

    /// Register a bundle of files given as (path, content). Errors: a bundle
    /// over [`MAX_BUNDLE_BYTES`] is [`SdkError::BundleTooLarge`] before
    /// anything is sent (the engine's gRPC message limit would otherwise
    /// refuse it without naming a file); the engine's refusals as
    /// [`SdkError::Status`].
    pub async fn register_files(
        &self,
        files: Vec<v1::DefinitionFile>,
    ) -> Result<Vec<Definition>, SdkError> {
        check_bundle_size(&files)?;
        let resp = self
            .definitions
            .clone()
            .register_bundle(v1::RegisterBundleRequest {
                tenant: self.tenant.clone(),
                files,
            })
            .await?;
        Ok(resp.into_inner().definitions)
    }

    /// Definitions of the tenant; `kind` empty for all.
    pub async fn list_definitions(&self, kind: &str) -> Result<Vec<Definition>, SdkError> {
        let resp = self
            .definitions
            .clone()
            .list_definitions(v1::ListDefinitionsRequest {
                tenant: self.tenant.clone(),
                kind: kind.to_owned(),
            })
            .await?;
        Ok(resp.into_inner().definitions)
    }

    /// Replace the tenant's grants.
    pub async fn set_tenant_grants(&self, grants: Vec<String>) -> Result<Vec<String>, SdkError> {
        let resp = self
            .tenants
            .clone()
            .set_tenant_grants(v1::SetTenantGrantsRequest {
                tenant: self.tenant.clone(),
                grants,
            })
            .await?;
        Ok(resp.into_inner().grants)
    }

    /// The tenant's grants.
    pub async fn tenant_grants(&self) -> Result<Vec<String>, SdkError> {
        let resp = self
            .tenants
            .clone()
            .get_tenant_grants(v1::GetTenantGrantsRequest {
                tenant: self.tenant.clone(),
            })
            .await?;
        Ok(resp.into_inner().grants)
    }

    /// Start a run of `workflow` with `input`; returns the run and whether it was created.
    pub async fn start_run(
        &self,
        workflow: &str,
        input: &Value,
        opts: StartOptions,
    ) -> Result<(Run, bool), SdkError> {
        let resp = self
            .runs
            .clone()
            .start_run(v1::StartRunRequest {
                tenant: self.tenant.clone(),
                workflow: workflow.to_owned(),
                input_json: input.to_string(),
                idempotency_key: opts.idempotency_key,
                caller: opts.caller,
                caller_grants: opts.caller_grants,
            })
            .await?
            .into_inner();
        let run = resp
            .run
            .ok_or_else(|| tonic::Status::internal("StartRun returned no run"))?;
        Ok((run, resp.created))
    }

    /// One run.
    pub async fn get_run(&self, run_id: &str) -> Result<Run, SdkError> {
        Ok(self.get_run_detail(run_id).await?.0)
    }

    /// One run, with its ready tasks that no live worker can take (worker
    /// pools: each says which requirement no live worker has).
    pub async fn get_run_detail(
        &self,
        run_id: &str,
    ) -> Result<(Run, Vec<UnclaimableTask>), SdkError> {
        let resp = self.get_run_response(run_id).await?;
        let run = resp
            .run
            .ok_or_else(|| tonic::Status::internal("GetRun returned no run"))?;
        Ok((run, resp.unclaimable))
    }

    /// A page of runs; returns the runs and the next page token ("" on the last page).
    pub async fn list_runs(
        &self,
        status: &str,
        page_size: u32,
        page_token: &str,
    ) -> Result<(Vec<Run>, String), SdkError> {
        let resp = self
            .runs
            .clone()
            .list_runs(v1::ListRunsRequest {
                tenant: self.tenant.clone(),
                status: status.to_owned(),
                page_size,
                page_token: page_token.to_owned(),
            })
            .await?
            .into_inner();
        Ok((resp.runs, resp.next_page_token))
    }

    /// Every event of a run after `after_seq` (pages through all of them).
    pub async fn events(&self, run_id: &str, after_seq: u64) -> Result<Vec<RunEvent>, SdkError> {
        let mut out = Vec::new();
        let mut after = after_seq;
        loop {
            let page = self
                .runs
                .clone()
                .list_run_events(v1::ListRunEventsRequest {
                    tenant: self.tenant.clone(),
                    run_id: run_id.to_owned(),
                    after_seq: after,
                    limit: 1000,
                })
                .await?
                .into_inner()
                .events;
            let n = page.len();
            if let Some(last) = page.last() {
                after = last.seq;
            }
            out.extend(page);
            // Pages are capped by bytes as well as by count, so only an
            // empty page means the end.
            if n == 0 {
                return Ok(out);
            }
        }
    }

    /// Stream a run's events after `after_seq`, calling `on_event` for each,
    /// until the run finishes (completed, failed, cancelled) or `stop`
    /// returns true for an event. Returns the last event seen.
    pub async fn watch(
        &self,
        run_id: &str,
        after_seq: u64,
        mut on_event: impl FnMut(&RunEvent) -> bool,
    ) -> Result<Option<RunEvent>, SdkError> {
        let mut stream = self
            .runs
            .clone()
            .watch_run(v1::WatchRunRequest {
                tenant: self.tenant.clone(),
                run_id: run_id.to_owned(),
                after_seq,
            })
            .await?
            .into_inner();
        let mut last = None;
        while let Some(item) = stream.next().await {
            let event = item?;
            let stop = on_event(&event);
            last = Some(event);
            if stop {
                break;
            }
        }
        Ok(last)
    }

    /// Operator pause (`PauseRun`): the run's tasks are not claimed until
    /// [`Client::resume_run`]; `operator` is recorded as who paused.
    pub async fn pause_run(
        &self,
        run_id: &str,
        operator: &str,
        reason: &str,
    ) -> Result<Run, SdkError> {
        let resp = self
            .runs
            .clone()
            .pause_run(v1::PauseRunRequest {
                tenant: self.tenant.clone(),
                run_id: run_id.to_owned(),
                operator: operator.to_owned(),
                reason: reason.to_owned(),
            })
            .await?
            .into_inner();
        Ok(resp
            .run
            .ok_or_else(|| tonic::Status::internal("PauseRun returned no run"))?)
    }

    /// Lift an operator pause (`ResumeRun`); a run with open uncertain
    /// outcomes stays paused until they are resolved.
    pub async fn resume_run(
        &self,
        run_id: &str,
        operator: &str,
        reason: &str,
    ) -> Result<Run, SdkError> {
        let resp = self
            .runs
            .clone()
            .resume_run(v1::ResumeRunRequest {
                tenant: self.tenant.clone(),
                run_id: run_id.to_owned(),
                operator: operator.to_owned(),
                reason: reason.to_owned(),
            })
            .await?
            .into_inner();
        Ok(resp
            .run
            .ok_or_else(|| tonic::Status::internal("ResumeRun returned no run"))?)
    }

    /// Send signal `name` to a run (`SignalRun`), for a `wait` node that
    /// waits for it; a signal that comes before its wait is kept until the
    /// wait starts. `signal_id` is the sender's id for this signal: sending
    /// the same signal (name and payload) with it again is applied once, and
    /// returns `true` as the second value (a duplicate). `sent_by` is
    /// recorded in the event.
    ///
    /// Errors come back as [`SdkError::Status`]: `INVALID_ARGUMENT` when the
    /// workflow waits for no such signal or the payload does not match the
    /// wait's `payload_schema`, `NOT_FOUND` for an unknown run, and
    /// `FAILED_PRECONDITION` when the run has ended or when `signal_id` was
    /// already delivered with another name or payload (the message names
    /// the id).
    pub async fn signal(
        &self,
        run_id: &str,
        name: &str,
        signal_id: &str,
        payload: &Value,
        sent_by: &str,
    ) -> Result<(Run, bool), SdkError> {
        let resp = self
            .runs
            .clone()
            .signal_run(v1::SignalRunRequest {
                tenant: self.tenant.clone(),
                run_id: run_id.to_owned(),
                name: name.to_owned(),
                signal_id: signal_id.to_owned(),
                payload_json: payload.to_string(),
                sent_by: sent_by.to_owned(),
            })
            .await?
            .into_inner();
        let run = resp
            .run
            .ok_or_else(|| tonic::Status::internal("SignalRun returned no run"))?;
        Ok((run, resp.duplicate))
    }

    /// Approve (`approve: true`) or decline the waiting `approval` node
    /// `node` of a run (`DecideApproval`). `edited_subject` (with an
    /// approval, where the node has `allow_edits: true`) replaces the subject
    /// as approved and must match the node's `edits_schema`; `None` approves
    /// the subject as requested. `approver` and `reason` are recorded;
    /// `approver_grants` are the approver's permissions and must include the
    /// node's `approver_grant`.
    ///
    /// Errors come back as [`SdkError::Status`]: `PERMISSION_DENIED` without
    /// the grant (or with an edit the node does not allow), `ABORTED` when
    /// the node was already decided (the message names who decided),
    /// `FAILED_PRECONDITION` when the node is not waiting for a decision,
    /// `INVALID_ARGUMENT` for an edit that does not match `edits_schema` or
    /// for a node the run's workflow does not have ("no such node").
    #[allow(clippy::too_many_arguments)]
    pub async fn decide_approval(
        &self,
        run_id: &str,
        node: &str,
        approve: bool,
        edited_subject: Option<&Value>,
        approver: &str,
        approver_grants: Vec<String>,
        reason: &str,
    ) -> Result<Run, SdkError> {
        let req = v1::DecideApprovalRequest {
            node: node.to_owned(),
            approve,
            edited_subject_json: edited_subject.map(Value::to_string).unwrap_or_default(),
            approver: approver.to_owned(),
            approver_grants,
            reason: reason.to_owned(),
            ..Default::default()
        };
        Ok(self.decide(run_id, req).await?.0)
    }

    /// Decide request `request_id` of run `run_id` (an `OpenRequest.request_id`
    /// from [`Client::open_requests`], or the `request_id` of its
    /// `approval_requested` event): the way to decide an approval node a
    /// loop visits more than once, and safe to retry after a lost reply.
    /// Returns the run and whether the request had already been decided
    /// this way (`true`: a retry, nothing changed). Otherwise as
    /// [`Client::decide_approval`]; a decision that differs from the one
    /// recorded is `ABORTED`, naming it.
    #[allow(clippy::too_many_arguments)]
    pub async fn decide_request(
        &self,
        run_id: &str,
        request_id: &str,
        approve: bool,
        edited_subject: Option<&Value>,
        approver: &str,
        approver_grants: Vec<String>,
        reason: &str,
    ) -> Result<(Run, bool), SdkError> {
        let req = v1::DecideApprovalRequest {
            request_id: request_id.to_owned(),
            approve,
            edited_subject_json: edited_subject.map(Value::to_string).unwrap_or_default(),
            approver: approver.to_owned(),
            approver_grants,
            reason: reason.to_owned(),
            ..Default::default()
        };
        self.decide(run_id, req).await
    }

    /// `DecideApproval` for run `run_id` of this client's tenant.
    async fn decide(
        &self,
        run_id: &str,
        req: v1::DecideApprovalRequest,
    ) -> Result<(Run, bool), SdkError> {
        let resp = self
            .runs
            .clone()
            .decide_approval(v1::DecideApprovalRequest {
                tenant: self.tenant.clone(),
                run_id: run_id.to_owned(),
                ..req
            })
            .await?
            .into_inner();
        let run = resp
            .run
            .ok_or_else(|| tonic::Status::internal("DecideApproval returned no run"))?;
        Ok((run, resp.duplicate))
    }

    /// The requests for a person run `run_id` holds open (approvals,
    /// confirmations, tools' questions), each with the request id a
    /// decision or answer names (`GetRun`'s `open_requests`).
    pub async fn open_requests(&self, run_id: &str) -> Result<Vec<v1::OpenRequest>, SdkError> {
        Ok(self.get_run_response(run_id).await?.open_requests)
    }

    /// `GetRun` for run `run_id` of this client's tenant, whole: the run,
    /// its unclaimable tasks and its open requests in one call.
    pub async fn get_run_response(&self, run_id: &str) -> Result<v1::GetRunResponse, SdkError> {
        let resp = self
            .runs
            .clone()
            .get_run(v1::GetRunRequest {
                tenant: self.tenant.clone(),
                run_id: run_id.to_owned(),
            })
            .await?;
        Ok(resp.into_inner())
    }

    /// Answer a tool's question to a person (`ProvideToolInput`): the call
    /// `call_id` of run `run_id` waits for it (its `tool_call_input_requested`
    /// event holds what the MCP server asked). `answer` is
    /// `{"action": "accept"|"decline"|"cancel", "content": {...}}` for an
    /// elicitation (the content must match the form's `requestedSchema`),
    /// `{"responses": {"<key>": <answer>}}` for `input_required`. `by` is
    /// recorded. The call then runs again with the answer.
    ///
    /// Errors come back as [`SdkError::Status`]: `INVALID_ARGUMENT` listing
    /// each problem when the answer does not fit the question,
    /// `FAILED_PRECONDITION` when the call does not wait for input.
    pub async fn provide_tool_input(
        &self,
        run_id: &str,
        call_id: &str,
        answer: &Value,
        by: &str,
    ) -> Result<Run, SdkError> {
        Ok(self
            .answer_request(run_id, call_id, "", answer, by)
            .await?
            .0)
    }

    /// Answer question `request_id` (`<call_id>.input<n>`; empty: the
    /// call's only question) of call `call_id`: the way to answer a call
    /// that asks more than once, and safe to retry after a lost reply.
    /// Returns the run and whether the question had already been answered
    /// with this answer (`true`: a retry, nothing changed); a different
    /// answer to an answered question is `ABORTED`. Otherwise as
    /// [`Client::provide_tool_input`].
    pub async fn answer_request(
        &self,
        run_id: &str,
        call_id: &str,
        request_id: &str,
        answer: &Value,
        by: &str,
    ) -> Result<(Run, bool), SdkError> {
        let resp = self
            .runs
            .clone()
            .provide_tool_input(v1::ProvideToolInputRequest {
                tenant: self.tenant.clone(),
                run_id: run_id.to_owned(),
                call_id: call_id.to_owned(),
                request_id: request_id.to_owned(),
                answer_json: answer.to_string(),
                by: by.to_owned(),
            })
            .await?
            .into_inner();
        let run = resp
            .run
            .ok_or_else(|| tonic::Status::internal("ProvideToolInput returned no run"))?;
        Ok((run, resp.duplicate))
    }

    /// Cancel a run.
    pub async fn cancel_run(&self, run_id: &str, reason: &str) -> Result<Run, SdkError> {
        let resp = self
            .runs
            .clone()
            .cancel_run(v1::CancelRunRequest {
                tenant: self.tenant.clone(),
                run_id: run_id.to_owned(),
                reason: reason.to_owned(),
            })
            .await?
            .into_inner();
        Ok(resp
            .run
            .ok_or_else(|| tonic::Status::internal("CancelRun returned no run"))?)
    }
}

fn is_definition_file(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name.ends_with(".tools.abl") || name.ends_with(".yaml") || name.ends_with(".yml")
}

fn collect_files(path: &Path, out: &mut Vec<v1::DefinitionFile>) -> Result<(), SdkError> {
    let io = |source| SdkError::Io {
        path: path.to_owned(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    if meta.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(io)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        entries.sort();
        for entry in entries {
            let hidden = entry
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with('.'));
            if hidden {
                continue;
            }
            if entry.is_dir() || is_definition_file(&entry) {
                collect_files(&entry, out)?;
            }
        }
    } else {
        let content = std::fs::read_to_string(path).map_err(io)?;
        out.push(v1::DefinitionFile {
            path: path.display().to_string(),
            content,
        });
    }
    Ok(())
}

/// Whether an event kind ends the run.
pub fn is_final_event(kind: &str) -> bool {
    matches!(kind, "run_completed" | "run_failed" | "run_cancelled")
}

fn short(value: &Value, limit: usize) -> String {
    let text = match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    if text.len() <= limit {
        return text;
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// A timer of a `wait_started` / `approval_requested` event: `id in 3d`
/// or `id at <time>`.
fn timer_text(t: &Value) -> String {
    let id = t.get("timer_id").map(|v| short(v, 60)).unwrap_or_default();
    match (
        t.get("after_ms").and_then(Value::as_u64),
        t.get("at").and_then(Value::as_str),
    ) {
        (Some(ms), _) => format!("{id} in {}", duration_text(ms)),
        (None, Some(at)) => format!("{id} at {at}"),
        _ => id,
    }
}

/// `259200000` → `3d`, `5400000` → `90m`, `1500` → `1500ms`: the largest
/// unit that divides the duration.
fn duration_text(ms: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
    ];
    UNITS
        .iter()
        .find(|(unit, _)| ms > 0 && ms.is_multiple_of(*unit))
        .map(|(unit, name)| format!("{}{name}", ms / unit))
        .unwrap_or_else(|| format!("{ms}ms"))
}

/// ` in <delay>` when a failure event says when the next attempt is due
/// (`retry_delay_ms`: the next attempt is due that long after the event's
/// `recorded_at`), else nothing.
fn retry_in(p: &Value) -> String {
    p.get("retry_delay_ms")
        .and_then(Value::as_u64)
        .map(|ms| format!(" in {}", duration_text(ms)))
        .unwrap_or_default()
}

/// One readable line for an event: seq, kind, and the fields that matter
/// (call id, tool, arguments, result, attempt, idempotency key, errors).
pub fn timeline_line(event: &RunEvent) -> String {
    let p: Value = serde_json::from_str(&event.payload_json).unwrap_or(Value::Null);
    let s = |k: &str| p.get(k).map(|v| short(v, 160)).unwrap_or_default();
    let detail = match event.kind.as_str() {
        "run_started" => format!(
            "tenant={} caller={} input={}",
            s("tenant"),
            s("caller"),
            s("input")
        ),
        "node_started" => format!("node={} input={}", s("node"), s("input")),
        "model_call_scheduled" => format!("{} step={}", s("call_id"), s("step")),
        "model_call_completed" => {
            let calls: Vec<String> = p
                .get("tool_calls")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .map(|c| {
                            format!("{}({})", short(&c["name"], 40), short(&c["arguments"], 80))
                        })
                        .collect()
                })
                .unwrap_or_default();
            if calls.is_empty() {
                format!(
                    "{} attempt={} answer={}",
                    s("call_id"),
                    s("attempt"),
                    s("content")
                )
            } else {
                format!(
                    "{} attempt={} tool_calls=[{}]",
                    s("call_id"),
                    s("attempt"),
                    calls.join(", ")
                )
            }
        }
        "model_call_attempt_failed" => format!(
            "{} attempt={} retry={} error={}",
            s("call_id"),
            s("attempt"),
            s("will_retry"),
            s("error")
        ),
        "tool_call_refused" => format!("{} check={} reason={}", s("tool"), s("check"), s("reason")),
        "tool_call_scheduled" => format!(
            "{} {} args={} key={} repeat_safety={}",
            s("call_id"),
            s("tool"),
            s("arguments"),
            s("idempotency_key"),
            s("repeat_safety")
        ),
        "tool_call_dispatched" => format!(
            "{} attempt={} worker={}",
            s("call_id"),
            s("attempt"),
            s("worker_id")
        ),
        "tool_call_deferred" => format!(
            "{} attempt={} worker={} until={}",
            s("call_id"),
            s("attempt"),
            s("worker_id"),
            s("until")
        ),
        "callback_issued" | "callback_received" => format!(
            "{} attempt={} token_sha256={}",
            s("call_id"),
            s("attempt"),
            short(&p["token_sha256"], 12)
        ),
        "tool_call_accepted" => format!(
            "{} attempt={} response={} waits up to {}",
            s("call_id"),
            s("attempt"),
            s("response"),
            p["timer"]["after_ms"]
                .as_u64()
                .map(|ms| format!("{} s", ms / 1000))
                .unwrap_or_default()
        ),
        "tool_call_sampled" => format!(
            "{} attempt={} requests={} input_tokens={} output_tokens={}",
            s("call_id"),
            s("attempt"),
            p["usage"]["requests"],
            p["usage"]["input_tokens"],
            p["usage"]["output_tokens"]
        ),
        "tool_call_completed" => format!(
            "{} attempt={} result={}",
            s("call_id"),
            s("attempt"),
            s("result")
        ),
        "tool_call_attempt_failed" => format!(
            "{} attempt={} class={} dispatched={} retry={}{} error={}",
            s("call_id"),
            s("attempt"),
            s("class"),
            s("dispatched"),
            s("will_retry"),
            retry_in(&p),
            s("error")
        ),
        "tool_call_failed" => format!(
            "{} attempt={} error={}",
            s("call_id"),
            s("attempt"),
            s("error")
        ),
        "tool_call_processed" => format!(
            "{} {} {} {} message={} error={} result={}",
            s("call_id"),
            s("tool"),
            s("stage"),
            s("outcome"),
            s("message"),
            s("error"),
            s("result")
        ),
        "final_answer_refused" => format!("{} errors={}", s("node"), s("errors")),
        // The tokens only: the values are the run's data.
        "pii_tokens_issued" => format!(
            "{} tokens={}",
            s("node"),
            p["entries"]
                .as_array()
                .map(|es| es
                    .iter()
                    .filter_map(|e| e["token"].as_str())
                    .collect::<Vec<_>>()
                    .join(","))
                .unwrap_or_default()
        ),
        "tool_vars_set" => match p.get("errors") {
            Some(e) if !e.is_null() => format!(
                "{} {} {} values={} errors={}",
                s("call_id"),
                s("tool"),
                s("from"),
                s("values"),
                short(e, 160)
            ),
            _ => format!(
                "{} {} {} values={}",
                s("call_id"),
                s("tool"),
                s("from"),
                s("values")
            ),
        },
        "task_lease_expired" => format!(
            "{} attempt={} dispatched={}{}",
            s("call_id"),
            s("attempt"),
            s("dispatched"),
            retry_in(&p)
        ),
        "uncertain_outcome_recorded" => format!(
            "{} attempt={} reason={}",
            s("call_id"),
            s("attempt"),
            s("reason")
        ),
        "run_paused" => match p.get("operator").and_then(Value::as_str) {
            Some(op) => format!("by={op} reason={}", s("reason")),
            None => s("reason"),
        },
        "run_cancelled" => s("reason"),
        "run_resumed" => format!("by={} reason={}", s("by"), s("reason")),
        "uncertain_outcome_resolved" => {
            let outcome = match p.get("resolution").and_then(Value::as_str) {
                Some("succeeded") => format!("succeeded result={}", s("result")),
                Some("failed") => format!("failed error={}", s("error")),
                Some("retry") => format!("retry key={}", s("idempotency_key")),
                _ => s("resolution"),
            };
            format!(
                "{} {outcome} by={} via={} reason={}",
                s("call_id"),
                s("resolved_by"),
                s("via"),
                s("reason")
            )
        }
        "reconcile_probe_scheduled" => format!(
            "{} probe={} {} args={}",
            s("call_id"),
            s("probe_call_id"),
            s("tool"),
            s("arguments")
        ),
        "reconcile_probe_finished" => format!(
            "{} probe={} outcome={} detail={}",
            s("call_id"),
            s("probe_call_id"),
            s("outcome"),
            s("detail")
        ),
        "late_result_recorded" => format!(
            "{} attempt={} result={} discrepancy={}",
            s("call_id"),
            s("attempt"),
            s("result"),
            s("discrepancy")
        ),
        "node_completed" | "node_passed" => match p.get("next").and_then(Value::as_str) {
            Some(next) => format!("node={} output={} next={next}", s("node"), s("output")),
            None => format!("node={} output={}", s("node"), s("output")),
        },
        "wait_started" => {
            let timers: Vec<String> = p
                .get("timers")
                .and_then(Value::as_array)
                .map(|a| a.iter().map(timer_text).collect())
                .unwrap_or_default();
            format!(
                "node={} signals={} timers=[{}]",
                s("node"),
                s("signals"),
                timers.join(", ")
            )
        }
        "signal_received" => format!(
            "{} id={} from={} payload={}",
            s("name"),
            s("signal_id"),
            s("sent_by"),
            s("payload")
        ),
        "signal_consumed" => format!("node={} signal_id={}", s("node"), s("signal_id")),
        "timer_fired" => format!("node={} timer={}", s("node"), s("timer_id")),
        "approval_requested" => format!(
            "node={} subject={} approver_grant={} allow_edits={}{}",
            s("node"),
            s("subject"),
            s("approver_grant"),
            s("allow_edits"),
            match p.get("timer") {
                Some(t) if !t.is_null() => format!(" timer={}", timer_text(t)),
                _ => String::new(),
            }
        ),
        "approval_decided" => format!(
            "node={} {} by={} edited={} subject={} reason={}",
            s("node"),
            if p.get("approved").and_then(Value::as_bool) == Some(true) {
                "approved"
            } else {
                "declined"
            },
            s("by"),
            s("edited"),
            s("subject"),
            s("reason")
        ),
        "run_completed" => format!("output={}", s("output")),
        "run_failed" => format!("error={}", s("error")),
        _ => short(&p, 200),
    } + folded_node(&p);
    format!("{:>4}  {:<27} {}", event.seq, event.kind, detail)
}

/// ` starts_node` or ` ends_node` when a call's event also starts or ends
/// its tool node (`tool_call_scheduled.starts_node`,
/// `tool_call_completed.ends_node`: the node's own event folded in, issue
/// 23), else nothing.
fn folded_node(p: &Value) -> &'static str {
    let set = |field: &str| p.get(field) == Some(&Value::Bool(true));
    match (set("starts_node"), set("ends_node")) {
        (true, _) => " starts_node",
        (_, true) => " ends_node",
        _ => "",
    }
}

/// The most bytes of definition files one registration may carry: the
/// engine's limit on a bundle (`MAX_JSON_BYTES` in
/// `engine/src/coordinator/mod.rs`, 4 MiB), which is also its gRPC message limit.
pub const MAX_BUNDLE_BYTES: usize = 4 * 1024 * 1024;

fn check_bundle_size(files: &[v1::DefinitionFile]) -> Result<(), SdkError> {
    let total: usize = files.iter().map(|f| f.content.len()).sum();
    if total <= MAX_BUNDLE_BYTES {
        return Ok(());
    }
    let (largest, largest_bytes) = files
        .iter()
        .max_by_key(|f| f.content.len())
        .map(|f| (f.path.clone(), f.content.len()))
        .unwrap_or_default();
    Err(SdkError::BundleTooLarge {
        total,
        limit: MAX_BUNDLE_BYTES,
        largest,
        largest_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_over_the_engines_limit_is_refused_before_sending_naming_the_largest_file() {
        // `register_files` runs this check before it sends anything.
        let files = vec![
            v1::DefinitionFile {
                path: "small.yaml".into(),
                content: "kind: agent\n".into(),
            },
            v1::DefinitionFile {
                path: "big.tools.abl".into(),
                content: "#".repeat(MAX_BUNDLE_BYTES),
            },
        ];
        let err = check_bundle_size(&files).expect_err("refused");
        assert!(
            matches!(&err, SdkError::BundleTooLarge { largest, largest_bytes, .. }
                if largest == "big.tools.abl" && *largest_bytes == MAX_BUNDLE_BYTES),
            "{err:?}"
        );
        assert!(err.to_string().starts_with(&format!(
            "the bundle is {} bytes, more than the {MAX_BUNDLE_BYTES} bytes",
            MAX_BUNDLE_BYTES + 12
        )));
        assert!(check_bundle_size(&files[..1]).is_ok());
    }

    fn event(kind: &str, payload: Value) -> RunEvent {
        RunEvent {
            seq: 7,
            kind: kind.to_owned(),
            payload_json: payload.to_string(),
            ..Default::default()
        }
    }

    #[test]
    fn durations_use_the_largest_unit_that_divides_them() {
        assert_eq!(duration_text(3 * 86_400_000), "3d");
        assert_eq!(duration_text(90 * 60_000), "90m");
        assert_eq!(duration_text(1_500), "1500ms");
        assert_eq!(duration_text(0), "0ms");
    }

    #[test]
    fn tool_vars_set_names_the_call_its_values_and_any_errors() {
        let line = timeline_line(&event(
            "tool_vars_set",
            serde_json::json!({"call_id": "pay.t1", "tool": "charge", "from": "on_result", "values": {"balance": 12}}),
        ));
        assert!(
            line.ends_with(r#"pay.t1 charge on_result values={"balance":12}"#),
            "{line}"
        );
        let line = timeline_line(&event(
            "tool_vars_set",
            serde_json::json!({"call_id": "pay.t1", "tool": "charge", "from": "on_error", "values": {}, "errors": {"code": "not a number"}}),
        ));
        assert!(line.contains("errors="), "{line}");
    }

    #[test]
    fn a_call_that_starts_or_ends_its_node_says_so() {
        let line = timeline_line(&event(
            "tool_call_scheduled",
            serde_json::json!({"call_id": "call.t1", "tool": "noop", "arguments": {"i": 0}, "idempotency_key": "k", "repeat_safety": "idempotent", "starts_node": true}),
        ));
        assert!(
            line.ends_with("repeat_safety=idempotent starts_node"),
            "{line}"
        );
        let line = timeline_line(&event(
            "tool_call_completed",
            serde_json::json!({"call_id": "call.t1", "attempt": 1, "result": {"ok": true}, "ends_node": true}),
        ));
        assert!(line.ends_with(r#"result={"ok":true} ends_node"#), "{line}");
        let line = timeline_line(&event(
            "tool_call_completed",
            serde_json::json!({"call_id": "call.t1", "attempt": 1, "result": {"ok": true}}),
        ));
        assert!(line.ends_with(r#"result={"ok":true}"#), "{line}");
    }

    #[test]
    fn a_retried_attempt_says_when_the_next_one_is_due() {
        let line = timeline_line(&event(
            "tool_call_attempt_failed",
            serde_json::json!({"call_id": "lookup.t1", "attempt": 1, "class": "may_have_acted", "dispatched": true, "will_retry": true, "status_code": 503, "retry_delay_ms": 5000, "error": "HTTP 503"}),
        ));
        assert!(
            line.ends_with(
                "lookup.t1 attempt=1 class=may_have_acted dispatched=true retry=true in 5s error=HTTP 503"
            ),
            "{line}"
        );
        let line = timeline_line(&event(
            "task_lease_expired",
            serde_json::json!({"call_id": "lookup.t1", "attempt": 2, "dispatched": false, "retry_delay_ms": 60000}),
        ));
        assert!(
            line.ends_with("lookup.t1 attempt=2 dispatched=false in 1m"),
            "{line}"
        );
        let line = timeline_line(&event(
            "tool_call_attempt_failed",
            serde_json::json!({"call_id": "c", "attempt": 3, "class": "rejected", "dispatched": true, "will_retry": false, "error": "HTTP 400"}),
        ));
        assert!(line.ends_with("retry=false error=HTTP 400"), "{line}");
    }

    #[test]
    fn waits_and_approvals_have_readable_timeline_lines() {
        let line = timeline_line(&event(
            "wait_started",
            serde_json::json!({"node": "documents", "signals": ["documents_received"],
                "timers": [{"timer_id": "documents.w2", "after_ms": 259_200_000u64, "purpose": {"kind": "entry", "entry": 1}}]}),
        ));
        assert!(
            line.ends_with(
                "node=documents signals=[\"documents_received\"] timers=[documents.w2 in 3d]"
            ),
            "{line}"
        );
        let line = timeline_line(&event(
            "approval_decided",
            serde_json::json!({"node": "approve", "approved": true, "by": "grace", "reason": "ok", "subject": {"plan": "pro"}, "edited": true}),
        ));
        assert!(
            line.ends_with(
                "node=approve approved by=grace edited=true subject={\"plan\":\"pro\"} reason=ok"
            ),
            "{line}"
        );
    }
}
