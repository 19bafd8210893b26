//! The coordinator: drives the pure [`machine`](crate::machine) through the
//! [`store`](crate::store). Resolves definitions into a run plan at start,
//! fences every task change by attempt, long-polls claims on `LISTEN/NOTIFY`,
//! and sweeps expired leases.
//!
//! Architecture Invariant: holds no state that PostgreSQL does not; any
//! number of coordinators may run against one database.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use belay_proto::wire::{ModelCallResult, SamplingUsage};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::{Notify, broadcast};
use uuid::Uuid;

use crate::definitions::model::{AgentDef, NodeKind, ToolDef, WorkflowDef};
use crate::definitions::{self, DefinitionError, RegisteredNames, SourceFile};
use crate::gates::GateVerdict;
use crate::machine::{self, FailureClass, Input, MachineError, Pinned, RunPlan};
use crate::store::{
    ClaimedTask, DefinitionRow, EventRow, RunRow, Store, StoreError, TaskRow, TransitionError,
    UncertainQuery, UncertainRow, Wake,
};
use crate::vault::{SecretText, VaultKey};

/// How long a claimed outbox row is left to its replica before another may
/// take it, ms.
pub const OUTBOX_LEASE_MS: i64 = 10_000;

/// Most levels of child runs below a run that no other run started: a
/// child that would nest deeper is not created, and the `workflow` node
/// (or `type: workflow` tool call) that starts it fails with a message
/// naming this limit. Registration refuses a bundle whose workflows start
/// themselves again; this bounds what it cannot see (a cycle closed by
/// registering a new version of an already registered workflow).
pub const MAX_CHILD_DEPTH: u32 = 8;

/// Most bytes of a signal's payload (JSON text): 256 KiB. A payload is
/// copied into the run's events and the nodes that use it, so documents
/// should travel by reference.
pub const MAX_SIGNAL_BYTES: usize = 256 * 1024;

/// Most bytes accepted in a run input or a task result.
pub const MAX_JSON_BYTES: usize = 4 * 1024 * 1024;

/// Errors of coordinator operations; the API maps each to one status code.
#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    /// The named thing does not exist (for this tenant).
    #[error("{0} not found")]
    NotFound(String),
    /// The request is malformed.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Definitions were refused; every error is listed.
    #[error("{} definition error(s)", .0.len())]
    Definitions(Vec<DefinitionError>),
    /// The request is well-formed but the state does not allow it (stale
    /// attempt, finished run, refused dispatch).
    #[error("{0}")]
    FailedPrecondition(String),
    /// The thing was already done by someone else (a second resolve).
    #[error("{0}")]
    Conflict(String),
    /// The caller lacks a permission this needs.
    #[error("{0}")]
    PermissionDenied(String),
    /// A resolution's result does not match the tool's output type; each
    /// violation is listed.
    #[error("{message}")]
    Unprocessable {
        /// Summary.
        message: String,
        /// Each violation (`<json pointer>: <message>`).
        errors: Vec<String>,
    },
    /// The store failed.
    #[error(transparent)]
    Store(StoreError),
}

impl From<TransitionError<CoordinatorError>> for CoordinatorError {
    fn from(e: TransitionError<CoordinatorError>) -> Self {
        match e {
            TransitionError::Store(StoreError::NotFound(what)) => CoordinatorError::NotFound(what),
            TransitionError::Store(e) => CoordinatorError::Store(e),
            TransitionError::Refused(e) => e,
        }
    }
}

impl From<MachineError> for CoordinatorError {
    fn from(e: MachineError) -> Self {
        match e.clone() {
            MachineError::InvalidPlan(msg) => {
                CoordinatorError::Store(StoreError::Corrupt(format!("invalid plan: {msg}")))
            }
            MachineError::NotUncertain { .. } => CoordinatorError::Conflict(e.to_string()),
            MachineError::InvalidResult { tool, errors } => CoordinatorError::Unprocessable {
                message: format!("the result does not match the output type of `{tool}`"),
                errors,
            },
            MachineError::InvalidSignal(msg) => CoordinatorError::InvalidArgument(msg),
            MachineError::NoSuchNode { .. } => CoordinatorError::InvalidArgument(e.to_string()),
            MachineError::InvalidEdit { node, errors } => CoordinatorError::Unprocessable {
                message: format!(
                    "the edited subject does not match the `edits_schema` of node `{node}`"
                ),
                errors,
            },
            MachineError::InvalidInput { call_id, errors } => CoordinatorError::Unprocessable {
                message: format!("the input for call `{call_id}` does not fit what the tool asked"),
                errors,
            },
            MachineError::AlreadyDecided { .. } => CoordinatorError::Conflict(e.to_string()),
            MachineError::NotAllowed(msg) => CoordinatorError::PermissionDenied(msg),
            other => CoordinatorError::FailedPrecondition(other.to_string()),
        }
    }
}

/// Tunables, all durations in ms.
#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    /// Lease granted by a claim or a heartbeat.
    pub lease_ms: u64,
    /// How often expired leases are looked for.
    pub sweep_interval_ms: u64,
    /// How long a result of a `hints.cacheable: true` tool is served from
    /// the tenant's result cache when the tool gives no `hints.cache_ttl`
    /// (pinned into each run's plan when it starts); 0: such tools are not
    /// cached.
    pub tool_cache_ttl_ms: u64,
    /// Values of `{{config.NAME}}` placeholders resolved in definitions
    /// when they are registered (a `type: workflow` tool's `timeout_ms`),
    /// by NAME; the binaries read them from `BELAY_TOOL_CONFIG_<NAME>`
    /// ([`definitions::config_from_env`]). Empty by default.
    pub definition_config: std::collections::BTreeMap<String, String>,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        CoordinatorConfig {
            lease_ms: 30_000,
            sweep_interval_ms: 1_000,
            tool_cache_ttl_ms: machine::cache::DEFAULT_TOOL_CACHE_TTL_MS,
            definition_config: std::collections::BTreeMap::new(),
        }
    }
}

/// How often the sweeper deletes expired entries of the tool result cache.
const TOOL_CACHE_PURGE_INTERVAL: Duration = Duration::from_secs(60);

/// Most expired entries of the tool result cache deleted by one statement.
const TOOL_CACHE_PURGE_BATCH: i64 = 1_000;

/// How long a claim that found nothing claimable spares the claims after
/// it their statement, when no wake-up came in between
/// ([`NothingClaimable`]): the most a change that no wake-up announces (the
/// clock moved by another process, a lost notification) waits for a new
/// claim request to notice it. Waiting claimers look again at least every
/// second in any case.
const NOTHING_CLAIMABLE_FOR: Duration = Duration::from_millis(100);

/// A claim statement that took fewer tasks than it asked for: at that
/// moment nothing else was claimable. Until [`Store::tasks_wake_seq`] moves
/// (a task was scheduled, re-queued, or announced by another process), the
/// next ready task's time comes, or [`NOTHING_CLAIMABLE_FOR`] passes, a
/// claim would find nothing either, so it waits without asking the
/// database. Without this, every worker's claim that follows a successful
/// one (the worker asks again at once for its free slots) was a statement
/// that found nothing: about one per step below peak load.
#[derive(Debug, Clone, Copy)]
struct NothingClaimable {
    /// [`Store::tasks_wake_seq`] read before the statement.
    seq: u64,
    /// When the statement started.
    at: tokio::time::Instant,
    /// When the earliest other ready task becomes claimable (ready now but
    /// row-locked by another claimer: in 5 ms), if there is one.
    next_ready: Option<tokio::time::Instant>,
}

impl NothingClaimable {
    /// Whether a claim at `now` with the wake count `seq` would surely find
    /// nothing; if so, when to look again at the latest.
    fn holds(&self, seq: u64, now: tokio::time::Instant) -> Option<tokio::time::Instant> {
        let until = match self.next_ready {
            Some(t) => t.min(self.at + NOTHING_CLAIMABLE_FOR),
            None => self.at + NOTHING_CLAIMABLE_FOR,
        };
        (seq == self.seq && now < until).then_some(until)
    }
}

/// The coordinator; share it with `Arc`.
#[derive(Debug)]
pub struct Coordinator {
    store: Store,
    config: CoordinatorConfig,
    tasks_ready: Notify,
    /// What the last claim that left nothing claimable saw, so the next
    /// claim can skip its statement ([`NothingClaimable`]).
    nothing_claimable: std::sync::Mutex<Option<NothingClaimable>>,
    run_events: broadcast::Sender<Uuid>,
    /// Outbox rows were written (here or by another replica).
    outbox_ready: Notify,
    /// Base URL of the callback endpoint (`type: async_webhook`), as tool
    /// servers reach it; unset: such tools are refused at dispatch.
    callback_base_url: std::sync::OnceLock<String>,
    /// The key of the runs' secret vaults (`RESULT_SECRETS`); unset: a
    /// producer tool is refused at dispatch.
    vault: std::sync::OnceLock<VaultKey>,
}

/// What a dispatch allows the worker ([`Coordinator::dispatch_call`]).
#[derive(Debug, Default)]
pub struct Dispatched {
    /// The single-use callback URL of a `type: async_webhook` call.
    pub callback_url: Option<String>,
    /// The vault values the call's `SECRET_ACCESS` may read, by key (a key
    /// without a value is absent). Secrets: `Debug` hides them.
    pub secrets: Vec<(String, SecretText)>,
}

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

impl From<StoreError> for CoordinatorError {
    /// Data the database refuses (SQLSTATE class 22 "data exception", 54
    /// "program limit exceeded") fails the same way on every retry, so it is
    /// the caller's bad input, not an outage.
    fn from(e: StoreError) -> Self {
        if let StoreError::Database(sqlx::Error::Database(db)) = &e
            && let Some(code) = db.code()
            && (code.starts_with("22") || code.starts_with("54"))
        {
            tracing::warn!(error = %db, %code, "the database refused a value");
            return CoordinatorError::InvalidArgument(format!(
                "a value was refused by the database (SQLSTATE {code}): it is malformed or too long"
            ));
        }
        CoordinatorError::Store(e)
    }
}

/// Longest identifier (tenant, workflow, idempotency key, worker id, grant,
/// operator), bytes.
pub const MAX_ID_BYTES: usize = 256;
/// Longest free text (reasons, caller), bytes.
pub const MAX_TEXT_BYTES: usize = 4096;

/// A value as it may be echoed in an error: at most 64 bytes.
pub(crate) fn shown(value: &str) -> String {
    let cut = machine::normalize::truncate_str(value, 64);
    if cut.len() < value.len() {
        format!("{cut:?}… ({} bytes)", value.len())
    } else {
        format!("{cut:?}")
    }
}

/// Text from a client: no NUL (PostgreSQL text cannot hold it), at most `max` bytes.
pub(crate) fn check_text(field: &str, value: &str, max: usize) -> Result<(), CoordinatorError> {
    if value.contains('\0') {
        return Err(CoordinatorError::InvalidArgument(format!(
            "`{field}` contains a NUL character"
        )));
    }
    if value.len() > max {
        return Err(CoordinatorError::InvalidArgument(format!(
            "`{field}` is {} bytes, more than the limit of {max} bytes",
            value.len()
        )));
    }
    Ok(())
}

/// A required identifier: non-empty, no NUL, at most [`MAX_ID_BYTES`].
pub(crate) fn require(field: &str, value: &str) -> Result<(), CoordinatorError> {
    if value.trim().is_empty() {
        return Err(CoordinatorError::InvalidArgument(format!(
            "`{field}` is required"
        )));
    }
    check_text(field, value, MAX_ID_BYTES)
}

/// The JSON document of request field `field`: at most `MAX_JSON_BYTES`,
/// valid JSON, NUL characters stripped (PostgreSQL `jsonb` refuses them).
///
/// Errors: `InvalidArgument` naming the field, its size or the parse error.
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

fn json_arg(field: &str, text: &str) -> Result<Value, CoordinatorError> {
    if text.len() > MAX_JSON_BYTES {
        return Err(CoordinatorError::InvalidArgument(format!(
            "`{field}` is {} bytes, more than {MAX_JSON_BYTES}",
            text.len()
        )));
    }
    let value: Value = serde_json::from_str(text).map_err(|e| {
        CoordinatorError::InvalidArgument(format!("`{field}` is not valid JSON: {e}"))
    })?;
    Ok(machine::normalize::strip_nul_value(value))
}

/// `value` as a UUID. Errors: [`CoordinatorError::InvalidArgument`] naming `field`.
pub(crate) fn parse_uuid(field: &str, value: &str) -> Result<Uuid, CoordinatorError> {
    Uuid::parse_str(value).map_err(|e| {
        CoordinatorError::InvalidArgument(format!(
            "`{field}` is not a UUID ({e}): {}",
            shown(value)
        ))
    })
}

fn decode<T: serde::de::DeserializeOwned>(row: &DefinitionRow) -> Result<T, CoordinatorError> {
    serde_json::from_value(row.body.clone()).map_err(|e| {
        CoordinatorError::Store(StoreError::Corrupt(format!(
            "{} `{}` v{} does not decode: {e}",
            row.kind, row.name, row.version
        )))
    })
}

fn pinned<T>(row: &DefinitionRow, def: T) -> Pinned<T> {
    Pinned {
        version: row.version as u32,
        content_hash: row.content_hash.clone(),
        def,
    }
}

impl Coordinator {
    /// A coordinator over `store`.
    pub fn new(store: Store, config: CoordinatorConfig) -> Arc<Coordinator> {
        let (run_events, _) = broadcast::channel(1024);
        Arc::new(Coordinator {
            store,
            config,
            tasks_ready: Notify::new(),
            nothing_claimable: std::sync::Mutex::new(None),
            outbox_ready: Notify::new(),
            run_events,
            callback_base_url: std::sync::OnceLock::new(),
            vault: std::sync::OnceLock::new(),
        })
    }

    /// Keep the runs' secret vaults (`RESULT_SECRETS`) encrypted with
    /// `key` (`--vault-key` / `BELAY_VAULT_KEY`). Set once; a second call is
    /// refused with `FailedPrecondition`. Without it a producer tool's call
    /// is refused before it acts, and a producer's result that reaches
    /// this engine anyway fails its call: values are never kept unencrypted.
    pub fn use_vault_key(&self, key: VaultKey) -> Result<(), CoordinatorError> {
        self.vault.set(key).map_err(|_| {
            CoordinatorError::FailedPrecondition("the vault key is already set".into())
        })
    }

    /// Whether a vault key is set.
    pub fn has_vault_key(&self) -> bool {
        self.vault.get().is_some()
    }

    /// Serve callbacks of `type: async_webhook` tools at `base_url` (what
    /// tool servers reach, e.g. `https://belay.example.com` or
    /// `http://127.0.0.1:50053`; a trailing `/` is dropped): dispatches then
    /// hand out `{base_url}/callbacks/v1/{token}`. Set once; a second call is
    /// refused with `FailedPrecondition`; a base that is not an http(s) URL
    /// with `InvalidArgument`.
    pub fn serve_callbacks_at(&self, base_url: &str) -> Result<(), CoordinatorError> {
        let base = base_url.trim().trim_end_matches('/');
        let parsed = reqwest::Url::parse(base).map_err(|e| {
            CoordinatorError::InvalidArgument(format!("callback base URL {}: {e}", shown(base_url)))
        })?;
        if parsed.query().is_some() || parsed.fragment().is_some() {
            return Err(CoordinatorError::InvalidArgument(format!(
                "callback base URL {} must not have a query or fragment: `/callbacks/v1/<token>` is appended to it",
                shown(base_url)
            )));
        }
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host().is_none() {
            return Err(CoordinatorError::InvalidArgument(format!(
                "callback base URL {} must be an http:// or https:// URL with a host",
                shown(base_url)
            )));
        }
        self.callback_base_url.set(base.to_owned()).map_err(|_| {
            CoordinatorError::FailedPrecondition("the callback base URL is already set".into())
        })
    }

    /// The callback base URL, if callbacks are served.
    pub fn callback_base_url(&self) -> Option<&str> {
        self.callback_base_url.get().map(String::as_str)
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Lease length in ms.
    pub fn lease_ms(&self) -> u64 {
        self.config.lease_ms
    }

    // ---- definitions -------------------------------------------------------

    /// Parse, validate and register a bundle; refused whole on any error.
    pub async fn register_bundle(
        &self,
        tenant: &str,
        files: Vec<SourceFile>,
    ) -> Result<Vec<(DefinitionRow, bool)>, CoordinatorError> {
        require("tenant", tenant)?;
        if files.is_empty() {
            return Err(CoordinatorError::InvalidArgument(
                "the bundle has no files".into(),
            ));
        }
        let total: usize = files.iter().map(|f| f.content.len()).sum();
        if total > MAX_JSON_BYTES {
            return Err(CoordinatorError::InvalidArgument(format!(
                "the bundle is {total} bytes, more than {MAX_JSON_BYTES}"
            )));
        }
        for f in &files {
            check_text("files[].path", &f.path, 1024)?;
            if f.content.contains('\0') {
                return Err(CoordinatorError::InvalidArgument(format!(
                    "file {} contains a NUL character",
                    shown(&f.path)
                )));
            }
        }
        let registered = RegisteredNames {
            tools: self
                .store
                .definition_names(tenant, "tool")
                .await?
                .into_iter()
                .collect(),
            agents: self
                .store
                .definition_names(tenant, "agent")
                .await?
                .into_iter()
                .collect(),
            workflows: self
                .store
                .definition_names(tenant, "workflow")
                .await?
                .into_iter()
                .collect(),
            config: self.config.definition_config.clone(),
        };
        let bundle = definitions::parse_bundle(&files, &registered)
            .map_err(CoordinatorError::Definitions)?;
        let mut defs = Vec::new();
        let mut push =
            |kind: &str, name: &str, file: &str, body: Result<Value, serde_json::Error>| {
                let body = body.map_err(|e| {
                    CoordinatorError::InvalidArgument(format!("{kind} `{name}`: {e}"))
                })?;
                // Where a definition was written (file, line) is not part of
                // what it is: moving it must not make a new version.
                let hash = hex::encode(Sha256::digest(
                    without_source_positions(&body).to_string().as_bytes(),
                ));
                defs.push((
                    kind.to_owned(),
                    name.to_owned(),
                    hash,
                    body,
                    file.to_owned(),
                ));
                Ok::<(), CoordinatorError>(())
            };
        for t in &bundle.tools {
            push("tool", &t.name, &t.source_file, serde_json::to_value(t))?;
        }
        for a in &bundle.agents {
            push("agent", &a.name, &a.source_file, serde_json::to_value(a))?;
        }
        for w in &bundle.workflows {
            push("workflow", &w.name, &w.source_file, serde_json::to_value(w))?;
        }
        Ok(self.store.register_definitions(tenant, &defs).await?)
    }

    /// Resolve the newest versions of a workflow and everything it reaches.
    async fn resolve_plan(
        &self,
        tenant: &str,
        workflow: &str,
    ) -> Result<RunPlan, CoordinatorError> {
        let row = self
            .store
            .latest_definition(tenant, "workflow", workflow)
            .await?
            .ok_or_else(|| CoordinatorError::NotFound(format!("workflow `{workflow}`")))?;
        let wf: WorkflowDef = decode(&row)?;
        let mut agents = BTreeMap::new();
        let mut tools = BTreeMap::new();
        for node in &wf.nodes {
            match &node.kind {
                NodeKind::Agent { agent, .. } => {
                    if agents.contains_key(agent) {
                        continue;
                    }
                    let arow = self
                        .store
                        .latest_definition(tenant, "agent", agent)
                        .await?
                        .ok_or_else(|| {
                            CoordinatorError::FailedPrecondition(format!(
                                "agent `{agent}` of workflow `{workflow}` is not registered"
                            ))
                        })?;
                    let adef: AgentDef = decode(&arow)?;
                    for tool in &adef.tools {
                        self.pin_tool(tenant, tool, &format!("agent `{agent}`"), &mut tools)
                            .await?;
                    }
                    agents.insert(agent.clone(), pinned(&arow, adef));
                }
                NodeKind::Tool { tool, .. } => {
                    self.pin_tool(tenant, tool, &format!("node `{}`", node.id), &mut tools)
                        .await?;
                }
                _ => {}
            }
        }
        Ok(RunPlan {
            workflow: pinned(&row, wf),
            agents,
            tools,
        })
    }

    /// Pin the newest `tool` (and its reconcile probe) into `tools`.
    async fn pin_tool(
        &self,
        tenant: &str,
        tool: &str,
        used_by: &str,
        tools: &mut BTreeMap<String, Pinned<ToolDef>>,
    ) -> Result<(), CoordinatorError> {
        if tools.contains_key(tool) {
            return Ok(());
        }
        let trow = self
            .store
            .latest_definition(tenant, "tool", tool)
            .await?
            .ok_or_else(|| {
                CoordinatorError::FailedPrecondition(format!(
                    "tool `{tool}` of {used_by} is not registered"
                ))
            })?;
        let mut tdef: ToolDef = decode(&trow)?;
        self.repeat_safety_from_server(&mut tdef).await?;
        // The engine's default cache TTL, pinned so the run keeps it.
        if tdef.hints.cacheable == Some(true) && tdef.hints.cache_ttl_ms.is_none() {
            tdef.hints.cache_ttl_ms = Some(self.config.tool_cache_ttl_ms);
        }
        // A reconcile probe is pinned too (never offered to the model).
        if let Some(probe) = tdef.reconcile_with.clone()
            && !tools.contains_key(&probe)
            && let Some(prow) = self.store.latest_definition(tenant, "tool", &probe).await?
        {
            let pdef: ToolDef = decode(&prow)?;
            tools.insert(probe, pinned(&prow, pdef));
        }
        tools.insert(tool.to_owned(), pinned(&trow, tdef));
        Ok(())
    }

    /// A `type: mcp` tool declared without `repeat_safety:` gets, for the
    /// run being planned, what the newest report of its server's listing
    /// suggests (`idempotent` only for a trusted server's read-only or
    /// idempotent tool; see `ToolDef::repeat_safety_from_server`); without
    /// a report it stays `never`. Pinned into the plan, so the run keeps it.
    async fn repeat_safety_from_server(&self, tool: &mut ToolDef) -> Result<(), CoordinatorError> {
        let crate::definitions::model::ToolBindingDef::Mcp {
            server,
            server_tool,
            ..
        } = &tool.binding
        else {
            return Ok(());
        };
        if !tool.repeat_safety_from_server {
            return Ok(());
        }
        let reported = self
            .store
            .mcp_tool_definitions(Some(server), Some(server_tool))
            .await?;
        // Newest report first.
        if reported
            .first()
            .is_some_and(|r| r.suggested_repeat_safety == "idempotent")
        {
            tool.repeat_safety = crate::definitions::model::RepeatSafety::Idempotent;
        }
        Ok(())
    }

    /// The state a run starts from: empty, with the engine's clock when a
    /// tool of `plan` fills a parameter with the time (`source: runtime`
    /// `time`, `date`, `unix_ms`), since its first node may call it (the
    /// one round trip is spent only then).
    async fn start_state(&self, plan: &RunPlan) -> Result<machine::RunState, CoordinatorError> {
        let reads_time = plan.tools.values().any(|t| {
            t.def.injected.iter().any(|p| {
                matches!(p.source, definitions::model::ParamSource::Runtime { field } if field.is_time())
            })
        });
        let now = if reads_time {
            Some(self.store.clock_now().await?)
        } else {
            None
        };
        Ok(machine::RunState {
            now,
            ..machine::RunState::default()
        })
    }

    /// Delete the expired entries of the tool result cache, a batch at a
    /// time; returns how many.
    pub async fn purge_tool_cache(&self) -> Result<u64, CoordinatorError> {
        let mut total = 0;
        loop {
            let n = self
                .store
                .purge_expired_tool_cache(TOOL_CACHE_PURGE_BATCH)
                .await?;
            total += n;
            if n < TOOL_CACHE_PURGE_BATCH as u64 {
                return Ok(total);
            }
        }
    }

    // ---- runs ---------------------------------------------------------------

    /// Start a run, or return the run its idempotency key already names.
    pub async fn start_run(&self, req: StartRun) -> Result<(RunRow, bool), CoordinatorError> {
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
            return same_request(run, &req).map(|run| (run, false));
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
            return same_request(row, &req).map(|run| (run, false));
        }
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
            .store
            .transition(run.run_id, None, |state, _| {
                machine::decide(state, input).map_err(CoordinatorError::from)
            })
            .await?;
        let duplicate = applied.events == 0;
        tracing::info!(run_id = %run.run_id, signal = name, duplicate, "signal delivered");
        Ok((self.get_run(tenant, run_id).await?, duplicate))
    }

    /// Decide an approval node.
    ///
    /// Errors: `PermissionDenied` without the node's `approver_grant` (or an
    /// edit where none is allowed), `Conflict` for a second decision,
    /// `FailedPrecondition` when the node is not waiting, `Unprocessable` for
    /// an edit that does not match `edits_schema`, `InvalidArgument` ("no
    /// such node") for a node the run's workflow does not have.
    #[allow(clippy::too_many_arguments)]
    pub async fn decide_approval(
        &self,
        tenant: &str,
        run_id: &str,
        node: &str,
        approve: bool,
        edited_subject_json: &str,
        approver: &str,
        approver_grants: &[String],
        reason: &str,
    ) -> Result<RunRow, CoordinatorError> {
        require("node", node)?;
        check_text("node", node, MAX_ID_BYTES)?;
        require("approver", approver)?;
        check_text("approver", approver, MAX_ID_BYTES)?;
        check_text("reason", reason, MAX_TEXT_BYTES)?;
        for g in approver_grants {
            check_text("approver_grants", g, MAX_ID_BYTES)?;
        }
        let edited_subject = if edited_subject_json.trim().is_empty() {
            None
        } else {
            Some(json_arg("edited_subject_json", edited_subject_json)?)
        };
        let run = self.get_run(tenant, run_id).await?;
        let input = Input::DecideApproval {
            node: node.to_owned(),
            approve,
            edited_subject,
            by: approver.to_owned(),
            grants: approver_grants.to_vec(),
            reason: reason.to_owned(),
        };
        self.store
            .transition(run.run_id, None, |state, _| {
                machine::decide(state, input).map_err(CoordinatorError::from)
            })
            .await?;
        tracing::info!(run_id = %run.run_id, node, approve, approver, "approval decided");
        self.get_run(tenant, run_id).await
    }

    /// Fire due timers (any replica; each fires once: its transition
    /// deletes the row under the run lock, and a stale or repeated firing
    /// changes nothing). Returns how many were handled.
    pub async fn fire_due_timers(&self) -> Result<usize, CoordinatorError> {
        let due = self
            .store
            .due_timers(256)
            .await
            .map_err(CoordinatorError::Store)?;
        let mut handled = 0;
        for (run_id, timer_id, overdue_ms) in due {
            let input = Input::TimerFired {
                timer_id: timer_id.clone(),
                overdue_ms: u64::try_from(overdue_ms).unwrap_or(0),
            };
            match self
                .store
                .transition(run_id, None, |state, _| {
                    machine::decide(state, input).map_err(CoordinatorError::from)
                })
                .await
            {
                Ok(_) => handled += 1,
                Err(e) => {
                    // One run that cannot be judged must not stop the others.
                    tracing::warn!(%run_id, timer_id, error = %CoordinatorError::from(e), "timer could not fire");
                }
            }
        }
        Ok(handled)
    }

    /// Apply an operator's control input to a run of `tenant`; returns the
    /// run as it is afterwards.
    async fn control_run(
        &self,
        tenant: &str,
        run_id: &str,
        input: Input,
        what: &'static str,
    ) -> Result<RunRow, CoordinatorError> {
        let run = self.get_run(tenant, run_id).await?;
        self.store
            .transition(run.run_id, None, |state, _| {
                machine::decide(state, input).map_err(CoordinatorError::from)
            })
            .await?;
        tracing::info!(run_id = %run.run_id, "{what}");
        self.get_run(tenant, run_id).await
    }

    // ---- uncertain outcomes ----------------------------------------------

    /// Uncertain-outcome records of a tenant, newest first; the page token
    /// is `<created_at RFC 3339>|<uncertain_id>` of the last record.
    pub async fn list_uncertain(
        &self,
        filter: &UncertainFilter,
    ) -> Result<(Vec<UncertainRow>, String), CoordinatorError> {
        require("tenant", &filter.tenant)?;
        let status = match filter.status.as_deref() {
            None | Some("") | Some("any") => None,
            Some(s @ ("open" | "resolved")) => Some(s),
            Some(other) => {
                return Err(CoordinatorError::InvalidArgument(format!(
                    "unknown status `{other}`; one of open, resolved, any"
                )));
            }
        };
        let run_id = match filter.run_id.as_deref() {
            None | Some("") => None,
            Some(id) => Some(parse_uuid("run_id", id)?),
        };
        let size = match filter.page_size {
            0 => 50,
            n if n > 500 => {
                return Err(CoordinatorError::InvalidArgument(format!(
                    "`page_size` {n} is more than 500"
                )));
            }
            n => n,
        };
        let after = parse_page_token(&filter.page_token)?;
        // Ten years, in ms: a larger age is a mistake, not a filter.
        const MAX_AGE_MS: u64 = 10 * 366 * 24 * 3600 * 1000;
        for (name, value) in [
            ("older_than_ms", filter.older_than_ms),
            ("newer_than_ms", filter.newer_than_ms),
        ] {
            if value.is_some_and(|ms| ms > MAX_AGE_MS) {
                return Err(CoordinatorError::InvalidArgument(format!(
                    "`{name}` must be at most {MAX_AGE_MS} (ten years in ms)"
                )));
            }
        }
        let mut rows = self
            .store
            .list_uncertain(&UncertainQuery {
                tenant: &filter.tenant,
                status,
                tool: filter.tool.as_deref().filter(|t| !t.is_empty()),
                run_id,
                older_than_ms: filter.older_than_ms,
                newer_than_ms: filter.newer_than_ms,
                after,
                limit: size as i64 + 1,
            })
            .await?;
        let next = if rows.len() > size as usize {
            rows.truncate(size as usize);
            rows.last()
                .map(|r| make_page_token(&r.created_at, &r.uncertain_id))
                .unwrap_or_default()
        } else {
            String::new()
        };
        Ok((rows, next))
    }

    /// One uncertain-outcome record of a tenant.
    pub async fn get_uncertain(
        &self,
        tenant: &str,
        id: &str,
    ) -> Result<UncertainRow, CoordinatorError> {
        require("tenant", tenant)?;
        let id = parse_uuid("uncertain_id", id)?;
        self.store.get_uncertain(tenant, id).await?.ok_or_else(|| {
            CoordinatorError::NotFound(format!("uncertain outcome {id} of tenant `{tenant}`"))
        })
    }

    /// Resolve an uncertain outcome; appends events and resumes the run if
    /// nothing else holds it. A second resolve gets [`CoordinatorError::Conflict`];
    /// concurrent resolves are serialised by the run lock, so one wins.
    pub async fn resolve_uncertain(
        &self,
        tenant: &str,
        id: &str,
        resolution: machine::Resolution,
        resolved_by: &str,
        reason: &str,
    ) -> Result<UncertainRow, CoordinatorError> {
        require("resolved_by", resolved_by)?;
        if reason.trim().is_empty() {
            return Err(CoordinatorError::InvalidArgument(
                "`reason` is required".into(),
            ));
        }
        check_text("reason", reason, MAX_TEXT_BYTES)?;
        match &resolution {
            machine::Resolution::Failed { error } => check_text("error", error, MAX_TEXT_BYTES)?,
            machine::Resolution::Succeeded { result } => {
                if machine::normalize::strip_nul_value(result.clone()) != *result {
                    return Err(CoordinatorError::InvalidArgument(
                        "`result` contains a NUL character".into(),
                    ));
                }
                let size = result.to_string().len();
                if size > MAX_JSON_BYTES {
                    return Err(CoordinatorError::InvalidArgument(format!(
                        "`result` is {size} bytes, more than {MAX_JSON_BYTES}"
                    )));
                }
            }
            machine::Resolution::Retry { .. } => {}
        }
        let record = self.get_uncertain(tenant, id).await?;
        if record.status != "open" {
            return Err(CoordinatorError::Conflict(format!(
                "uncertain outcome {id} is already resolved ({} by {} at {})",
                record.resolution_kind.as_deref().unwrap_or("?"),
                record.resolved_by.as_deref().unwrap_or("?"),
                record
                    .resolved_at
                    .map(|t| t.to_rfc3339())
                    .unwrap_or_default()
            )));
        }
        let (by, why, call_id) = (
            resolved_by.to_owned(),
            reason.to_owned(),
            record.call_id.clone(),
        );
        self.store
            .transition(record.run_id, Some(record.task_id), |state, _| {
                machine::decide(
                    state,
                    Input::ResolveUncertain {
                        call_id,
                        resolution,
                        resolved_by: by,
                        reason: why,
                    },
                )
                .map_err(CoordinatorError::from)
            })
            .await?;
        tracing::info!(uncertain_id = %record.uncertain_id, run_id = %record.run_id, resolved_by, "uncertain outcome resolved");
        self.get_uncertain(tenant, id).await
    }

    // ---- tasks -------------------------------------------------------------

    /// Long-poll claim: returns as soon as a task is claimed, or empty after `wait_ms`.
    pub async fn claim(
        &self,
        worker_id: &str,
        max: u32,
        wait_ms: u32,
    ) -> Result<Vec<ClaimedTask>, CoordinatorError> {
        require("worker_id", worker_id)?;
        if !(1..=64).contains(&max) {
            return Err(CoordinatorError::InvalidArgument(format!(
                "`max_tasks` must be 1..=64, got {max}"
            )));
        }
        if wait_ms > 30_000 {
            return Err(CoordinatorError::InvalidArgument(format!(
                "`wait_ms` must be at most 30000, got {wait_ms}"
            )));
        }
        let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms as u64);
        loop {
            // Register interest before looking, so a notify between the
            // query and the wait is not missed.
            let notified = self.tasks_ready.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let seq = self.store.tasks_wake_seq();
            let started = tokio::time::Instant::now();
            let memo = *self.memo();
            let next_ready = match memo.and_then(|m| m.holds(seq, started)) {
                // Nothing is claimable: wait without a statement.
                Some(look_again) => Some(look_again),
                None => {
                    let claimed = self
                        .store
                        .claim_tasks_or_next(worker_id, max as i64, self.config.lease_ms as i64)
                        .await;
                    let (tasks, next_ready_ms) = match claimed {
                        Ok(c) => c,
                        Err(e) => {
                            *self.memo() = None;
                            return Err(e.into());
                        }
                    };
                    let next_ready = next_ready_ms
                        .map(|ms| started + Duration::from_millis(ms.max(0) as u64 + 5));
                    *self.memo() = (tasks.len() < max as usize).then_some(NothingClaimable {
                        seq,
                        at: started,
                        next_ready,
                    });
                    if tasks.len() as u32 == max {
                        // A full batch: more may be ready; let the next claimer look.
                        self.tasks_ready.notify_one();
                    }
                    if !tasks.is_empty() {
                        for t in &tasks {
                            tracing::debug!(task_id = %t.task_id, attempt = t.attempt, worker_id, "task claimed");
                        }
                        return Ok(tasks);
                    }
                    next_ready
                }
            };
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(Vec::new());
            }
            // Wake on NOTIFY, on the earliest delayed retry, or at the
            // deadline; re-check at least every second in case a
            // notification was lost while the listener reconnected.
            let mut wait = deadline - now;
            if let Some(at) = next_ready {
                wait = wait.min(at.saturating_duration_since(now));
            }
            wait = wait.min(Duration::from_secs(1));
            let _ = tokio::time::timeout(wait, notified).await;
        }
    }

    fn memo(&self) -> std::sync::MutexGuard<'_, Option<NothingClaimable>> {
        // A plain value: a panic while it is held cannot leave it half-written.
        self.nothing_claimable
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Extend the leases a worker holds; returns `(task, attempt, held)`.
    pub async fn heartbeat(
        &self,
        worker_id: &str,
        leases: &[(String, u32)],
    ) -> Result<Vec<(String, u32, bool)>, CoordinatorError> {
        require("worker_id", worker_id)?;
        let mut parsed = Vec::with_capacity(leases.len());
        for (task, attempt) in leases {
            parsed.push((parse_uuid("task_id", task)?, *attempt as i32));
        }
        let held = self
            .store
            .heartbeat(worker_id, &parsed, self.config.lease_ms as i64)
            .await?;
        Ok(parsed
            .into_iter()
            .map(|(id, attempt)| {
                (
                    id.to_string(),
                    attempt as u32,
                    held.contains(&(id, attempt)),
                )
            })
            .collect())
    }

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
            .store
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
        self.store
            .transition(run_id, None, |state, _| {
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
                        machine::Event::LateResultRecorded { discrepancy, .. } => {
                            discrepancy.clone()
                        }
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
        self.complete_sampled(worker_id, task_id, attempt, result_json, secrets, None)
            .await
    }

    /// [`Coordinator::complete_with_secrets`] with the model completions
    /// the tool's MCP server asked for during the attempt (`sampling`,
    /// `CompleteTaskRequest.sampling_usage`): recorded as
    /// `tool_call_sampled` in the transition that records the result, and
    /// charged to the budgets (`machine/sampling.rs`). Usage reported with
    /// a late result, or for a model call, is not charged (logged).
    pub async fn complete_sampled(
        &self,
        worker_id: &str,
        task_id: &str,
        attempt: u32,
        result_json: &str,
        secrets: Vec<(String, SecretText)>,
        sampling: Option<SamplingUsage>,
    ) -> Result<(), CoordinatorError> {
        require("worker_id", worker_id)?;
        let mut value = json_arg("result_json", result_json)?;
        let task = parse_uuid("task_id", task_id)?;
        let vault = self.vault.get();
        self.store
            .transition_task(task, |state, row| {
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
                    with_sampling(input, sampling)
                } else {
                    input
                };
                machine::decide(state, input).map_err(CoordinatorError::from)
            })
            .await?;
        tracing::info!(%task, attempt, worker_id, "task completed");
        Ok(())
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
        self.fail_sampled(worker_id, task_id, attempt, error, class, status_code, None)
            .await
    }

    /// [`Coordinator::fail`] with the model completions the tool's MCP
    /// server asked for before the attempt failed (`sampling`,
    /// `FailTaskRequest.sampling_usage`), charged as with a result
    /// ([`Coordinator::complete_sampled`]).
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
    ) -> Result<(), CoordinatorError> {
        require("worker_id", worker_id)?;
        let task = parse_uuid("task_id", task_id)?;
        let error = machine::normalize::truncate_str(error, 16 * 1024).to_owned();
        self.store
            .transition_task(task, |state, row| {
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
                    with_sampling(failed, sampling)
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
        self.store
            .transition_task(task, |state, row| {
                let row = leased_tool_call(row, attempt, worker_id)?;
                let asked = Input::ToolInputRequested {
                    call_id: row.call_id.clone(),
                    attempt,
                    via: via.to_owned(),
                    requests,
                    request_state: (!request_state.is_empty()).then(|| request_state.to_owned()),
                    may_have_acted,
                };
                machine::decide(state, with_sampling(asked, sampling))
                    .map_err(CoordinatorError::from)
            })
            .await?;
        tracing::info!(%task, attempt, worker_id, via, "tool asked for input");
        Ok(())
    }

    /// A person answers a tool's question (`RunService.ProvideToolInput`).
    ///
    /// Errors: `NotFound` for an unknown run; `InvalidArgument` for a bad
    /// call id, `by` or JSON; `Unprocessable` listing each problem when the
    /// answer does not fit the question; `FailedPrecondition` when the call
    /// does not wait for input or the run ended.
    pub async fn provide_tool_input(
        &self,
        tenant: &str,
        run_id: &str,
        call_id: &str,
        answer_json: &str,
        by: &str,
    ) -> Result<RunRow, CoordinatorError> {
        require("call_id", call_id)?;
        check_text("call_id", call_id, MAX_ID_BYTES)?;
        require("by", by)?;
        check_text("by", by, MAX_ID_BYTES)?;
        let answer = json_arg("answer_json", answer_json)?;
        let input = Input::ProvideToolInput {
            call_id: call_id.to_owned(),
            answer,
            by: by.to_owned(),
        };
        self.control_run(tenant, run_id, input, "tool input provided")
            .await
    }

    /// Judge every expired lease once. Returns how many were handled.
    pub async fn sweep_expired_leases(&self) -> Result<usize, CoordinatorError> {
        let expired = self.store.expired_leases(100).await?;
        let mut handled = 0;
        for lease in expired {
            let attempt = lease.attempt as u32;
            let result = self
                .store
                .transition(lease.run_id, Some(lease.task_id), |state, row| {
                    let row = fenced(row, attempt, None)?;
                    if row.status != "leased" || !row.lease_expired {
                        // Another replica got there first, or a heartbeat won.
                        return Ok(machine::Decision::default());
                    }
                    machine::decide(
                        state,
                        Input::LeaseExpired {
                            call_id: row.call_id.clone(),
                            attempt,
                            dispatched: row.dispatched,
                        },
                    )
                    .map_err(CoordinatorError::from)
                })
                .await;
            match result {
                Ok(applied) if applied.events > 0 => {
                    handled += 1;
                    tracing::warn!(task_id = %lease.task_id, attempt, run_status = applied.status, "lease expired");
                }
                Ok(_) => {}
                Err(TransitionError::Refused(e)) => {
                    // The run finished meanwhile: the lease no longer matters.
                    tracing::debug!(task_id = %lease.task_id, error = %e, "expired lease skipped");
                    self.store
                        .end_orphan_task(lease.task_id, lease.attempt)
                        .await?;
                }
                // One run that cannot be judged (its history does not decode,
                // say) must not stop lease expiry for every other run.
                Err(TransitionError::Store(e)) => {
                    tracing::error!(task_id = %lease.task_id, run_id = %lease.run_id, error = %e, "cannot judge an expired lease; skipping it");
                }
            }
        }
        Ok(handled)
    }

    /// Background loops: LISTEN/NOTIFY relay and the sweeper (expired
    /// leases, due timers, and once a minute expired tool cache entries).
    /// They run until the returned handles are aborted.
    pub fn spawn_background(self: &Arc<Self>) -> Vec<tokio::task::JoinHandle<()>> {
        let listen = {
            let this = Arc::clone(self);
            tokio::spawn(async move { this.listen_loop().await })
        };
        let sweep = {
            let this = Arc::clone(self);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(
                    this.config.sweep_interval_ms.max(10),
                ));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut purged_at: Option<tokio::time::Instant> = None;
                loop {
                    tick.tick().await;
                    if let Err(e) = this.sweep_expired_leases().await {
                        tracing::warn!(error = %e, "lease sweep failed");
                    }
                    if let Err(e) = this.fire_due_timers().await {
                        tracing::warn!(error = %e, "timer sweep failed");
                    }
                    if purged_at.is_none_or(|at| at.elapsed() >= TOOL_CACHE_PURGE_INTERVAL) {
                        purged_at = Some(tokio::time::Instant::now());
                        match this.purge_tool_cache().await {
                            Ok(0) => {}
                            Ok(n) => {
                                tracing::debug!(entries = n, "expired tool cache entries deleted")
                            }
                            Err(e) => tracing::warn!(error = %e, "tool cache purge failed"),
                        }
                        if let Err(e) = this.store.purge_stale_heartbeats().await {
                            tracing::warn!(error = %e, "purging stale heartbeats failed");
                        }
                    }
                }
            })
        };
        let outbox = {
            let this = Arc::clone(self);
            tokio::spawn(async move {
                let interval = Duration::from_millis(this.config.sweep_interval_ms.max(10));
                loop {
                    // Woken by the relay, and every sweep interval for rows
                    // whose earlier attempt failed or whose wake-up was missed.
                    let _ = tokio::time::timeout(interval, this.outbox_ready.notified()).await;
                    loop {
                        match this.process_outbox().await {
                            Ok(0) => break,
                            Ok(_) => continue,
                            Err(e) => {
                                tracing::warn!(error = %e, "outbox processing failed");
                                break;
                            }
                        }
                    }
                }
            })
        };
        vec![listen, sweep, outbox]
    }

    /// Carry out due outbox rows (start child runs, tell parents their child
    /// ended, cancel children). Each kind is idempotent, so a row done twice
    /// (a replica died before marking it) changes nothing the second time.
    /// Returns how many rows were claimed.
    pub async fn process_outbox(&self) -> Result<usize, CoordinatorError> {
        let rows = self
            .store
            .claim_outbox(32, OUTBOX_LEASE_MS)
            .await
            .map_err(CoordinatorError::Store)?;
        let n = rows.len();
        for row in rows {
            let result = match row.kind.as_str() {
                "start_child" => self.start_child(&row).await,
                "child_finished" => self.deliver_child_end(&row).await,
                "cancel_child" => self.cancel_child(&row).await,
                other => Err(CoordinatorError::Store(StoreError::Corrupt(format!(
                    "outbox row {} has unknown kind `{other}`",
                    row.outbox_id
                )))),
            };
            let error = result.err().map(|e| e.to_string());
            if let Some(e) = &error {
                tracing::warn!(outbox_id = %row.outbox_id, kind = %row.kind, attempt = row.attempts, error = %e, "outbox row failed; retried after its lease");
            }
            self.store
                .finish_outbox(row.outbox_id, error.as_deref())
                .await
                .map_err(CoordinatorError::Store)?;
        }
        Ok(n)
    }

    /// `start_child`: create the child run (its id and idempotency key are
    /// fixed, so a second attempt finds it). A workflow that cannot start
    /// (not registered, input refused) is reported to the parent as a
    /// failed child.
    async fn start_child(&self, row: &crate::store::OutboxRow) -> Result<(), CoordinatorError> {
        let p = &row.payload;
        let field = |k: &str| {
            p.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let (tenant, call_id, workflow) = (field("tenant"), field("call_id"), field("workflow"));
        let child_run_id = Uuid::parse_str(&field("child_run_id")).map_err(|e| {
            CoordinatorError::Store(StoreError::Corrupt(format!("outbox child_run_id: {e}")))
        })?;
        let input = p.get("input").cloned().unwrap_or(Value::Null);
        let parent = self
            .store
            .get_run(&tenant, row.run_id)
            .await?
            .ok_or_else(|| CoordinatorError::NotFound(format!("run {}", row.run_id)))?;
        let parent_state = self.store.run_state(row.run_id).await?;
        let sync = p.get("sync").and_then(Value::as_bool).unwrap_or(true);
        // A cancelled (or failed) parent keeps its last step in the state,
        // so its status is looked at too.
        let child_id = child_run_id.to_string();
        let awaited = !parent_state.status.is_terminal()
            && (matches!(
                parent_state.step.as_ref().map(|s| &s.kind),
                Some(machine::StepKind::Child { child_run_id: c, .. }) if *c == child_id
            ) || parent_state.tool_calls.values().any(|c| {
                c.status == machine::CallStatus::Open
                    && c.child_run_id.as_deref() == Some(child_id.as_str())
            }));
        if sync && !awaited {
            // The parent stopped waiting before the child started (it was
            // cancelled, or gave up): starting it now would orphan it.
            tracing::info!(parent = %row.run_id, child = %child_run_id, "child run not started: its parent no longer waits for it");
            return Ok(());
        }
        let started = async {
            // The parent's ancestors plus the parent itself: the child's level.
            let depth = self
                .store
                .run_depth(row.run_id, MAX_CHILD_DEPTH)
                .await?
                .saturating_add(1);
            if depth > MAX_CHILD_DEPTH {
                return Err(CoordinatorError::FailedPrecondition(format!(
                    "workflow `{workflow}` would be a child run {depth} levels deep, more than the {MAX_CHILD_DEPTH} a run may nest (does a workflow start itself again?)"
                )));
            }
            let plan = self.resolve_plan(&tenant, &workflow).await?;
            if let Some(schema) = &plan.workflow.def.input_schema {
                definitions::validate_json(schema, &input).map_err(|errors| {
                    CoordinatorError::InvalidArgument(format!(
                        "input does not match workflow `{workflow}`'s input schema: {}",
                        errors.join("; ")
                    ))
                })?;
            }
            let tenant_grants = self.store.tenant_grants(&tenant).await?;
            let version = plan.workflow.version as i32;
            let decision = machine::decide(
                &self.start_state(&plan).await?,
                Input::Start {
                    run_id: child_run_id.to_string(),
                    tenant: tenant.clone(),
                    caller: parent.caller.clone(),
                    caller_grants: parent_state.caller_grants.clone(),
                    tenant_grants,
                    input: input.clone(),
                    plan: Box::new(plan),
                },
            )?;
            self.store
                .create_child_run(
                    child_run_id,
                    &tenant,
                    &workflow,
                    version,
                    &input,
                    &format!("child:{}/{call_id}", row.run_id),
                    &parent.caller,
                    &decision,
                    (row.run_id, &call_id),
                )
                .await?;
            Ok::<_, CoordinatorError>(())
        }
        .await;
        match started {
            Ok(()) => {
                tracing::info!(parent = %row.run_id, child = %child_run_id, workflow, "child run started");
                Ok(())
            }
            // The child cannot run: the parent hears it as a failed child.
            Err(
                e @ (CoordinatorError::NotFound(_)
                | CoordinatorError::FailedPrecondition(_)
                | CoordinatorError::InvalidArgument(_)),
            ) => {
                let input = Input::ChildRunFinished {
                    child_run_id: child_run_id.to_string(),
                    status: "failed".into(),
                    output: None,
                    error: Some(format!("the child run could not start: {e}")),
                };
                self.store
                    .transition(row.run_id, None, |state, _| {
                        machine::decide(state, input).map_err(CoordinatorError::from)
                    })
                    .await?;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// `child_finished`: tell the parent (a parent no longer waiting
    /// ignores it).
    async fn deliver_child_end(
        &self,
        row: &crate::store::OutboxRow,
    ) -> Result<(), CoordinatorError> {
        let p = &row.payload;
        let parent = p
            .get("parent_run_id")
            .and_then(Value::as_str)
            .and_then(|s| Uuid::parse_str(s).ok())
            .ok_or_else(|| {
                CoordinatorError::Store(StoreError::Corrupt(format!(
                    "outbox row {} has no parent_run_id",
                    row.outbox_id
                )))
            })?;
        let input = Input::ChildRunFinished {
            child_run_id: row.run_id.to_string(),
            status: p
                .get("status")
                .and_then(Value::as_str)
                .unwrap_or("failed")
                .to_owned(),
            output: p.get("output").cloned().filter(|v| !v.is_null()),
            error: p.get("error").and_then(Value::as_str).map(str::to_owned),
        };
        self.store
            .transition(parent, None, |state, _| {
                machine::decide(state, input).map_err(CoordinatorError::from)
            })
            .await?;
        Ok(())
    }

    /// `cancel_child`: cancel the child unless it has ended already.
    async fn cancel_child(&self, row: &crate::store::OutboxRow) -> Result<(), CoordinatorError> {
        let p = &row.payload;
        let child = p
            .get("child_run_id")
            .and_then(Value::as_str)
            .and_then(|s| Uuid::parse_str(s).ok())
            .ok_or_else(|| {
                CoordinatorError::Store(StoreError::Corrupt(format!(
                    "outbox row {} has no child_run_id",
                    row.outbox_id
                )))
            })?;
        let reason = p
            .get("reason")
            .and_then(Value::as_str)
            .unwrap_or("its parent cancelled it")
            .to_owned();
        let result = self
            .store
            .transition(child, None, |state, _| {
                machine::decide(state, Input::Cancel { reason }).map_err(CoordinatorError::from)
            })
            .await;
        match result {
            Ok(_) => Ok(()),
            // Ended already: nothing to cancel.
            Err(TransitionError::Refused(CoordinatorError::FailedPrecondition(_))) => Ok(()),
            // Not created (yet): its `start_child` row may still be in
            // flight on another replica; look again a few times, after which
            // it was surely never started (its parent stopped waiting first).
            Err(TransitionError::Store(StoreError::NotFound(_))) if row.attempts < 4 => {
                Err(CoordinatorError::FailedPrecondition(format!(
                    "child run {child} does not exist yet"
                )))
            }
            Err(TransitionError::Store(StoreError::NotFound(_))) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn listen_loop(&self) {
        let mut backoff = Duration::from_millis(100);
        loop {
            match self.listen_once().await {
                Ok(()) => {}
                Err(e) => tracing::warn!(error = %e, "LISTEN connection lost; reconnecting"),
            }
            // Wake everyone: notifications may have been missed.
            self.tasks_ready.notify_waiters();
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }

    async fn listen_once(&self) -> Result<(), StoreError> {
        let tasks_ready = &self.tasks_ready;
        let outbox_ready = &self.outbox_ready;
        let run_events = &self.run_events;
        self.store
            .listen(&mut |wake| match wake {
                // One claimer per wake-up (not all: each would run a claim
                // query, all but one for nothing); a claimer that fills its
                // batch passes the wake-up on.
                Wake::Tasks => tasks_ready.notify_one(),
                Wake::Outbox => outbox_ready.notify_one(),
                Wake::RunEvents(run) => {
                    let _ = run_events.send(run);
                }
            })
            .await
    }
}

/// Filters for [`Coordinator::list_uncertain`].
#[derive(Debug, Clone, Default)]
pub struct UncertainFilter {
    /// Tenant (required).
    pub tenant: String,
    /// `open` (default for operators), `resolved`, or `any`/`None`.
    pub status: Option<String>,
    /// Tool name.
    pub tool: Option<String>,
    /// Run id.
    pub run_id: Option<String>,
    /// Only records at least this old, ms.
    pub older_than_ms: Option<u64>,
    /// Only records at most this old, ms.
    pub newer_than_ms: Option<u64>,
    /// 1..=500; 0 means 50.
    pub page_size: u32,
    /// From a previous page; empty for the first.
    pub page_token: String,
}

/// A page token naming a keyset position: `<RFC 3339, µs>|<id>`.
pub(crate) fn make_page_token(ts: &chrono::DateTime<chrono::Utc>, id: &Uuid) -> String {
    format!(
        "{}|{id}",
        ts.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
    )
}

/// The position a [`make_page_token`] token names; `None` for an empty
/// token. Errors: [`CoordinatorError::InvalidArgument`] naming `page_token`.
pub(crate) fn parse_page_token(
    token: &str,
) -> Result<Option<(chrono::DateTime<chrono::Utc>, Uuid)>, CoordinatorError> {
    if token.is_empty() {
        return Ok(None);
    }
    let bad = || {
        CoordinatorError::InvalidArgument(format!(
            "`page_token` {token:?} is not a token from a previous page"
        ))
    };
    let (ts, id) = token.split_once('|').ok_or_else(bad)?;
    let ts = chrono::DateTime::parse_from_rfc3339(ts)
        .map_err(|_| bad())?
        .with_timezone(&chrono::Utc);
    let id = Uuid::parse_str(id).map_err(|_| bad())?;
    Ok(Some((ts, id)))
}

/// A retried `StartRun` must be the same request: an idempotency key reused
/// for another workflow or input is refused (as Stripe does), not silently
/// answered with a run the caller did not ask for.
fn same_request(run: RunRow, req: &StartRun) -> Result<RunRow, CoordinatorError> {
    let input_text = if req.input_json.trim().is_empty() {
        "{}"
    } else {
        req.input_json.as_str()
    };
    let input = serde_json::from_str::<Value>(input_text)
        .map(machine::normalize::strip_nul_value)
        .ok();
    if run.workflow != req.workflow || input.as_ref() != Some(&run.input) {
        return Err(CoordinatorError::FailedPrecondition(format!(
            "idempotency key {} was already used for a different request (run {}, workflow `{}`); use a new key for a new run",
            shown(&req.idempotency_key),
            run.run_id,
            run.workflow
        )));
    }
    Ok(run)
}

/// `body` without the `source_file` / `source_line` keys, at any depth.
fn without_source_positions(body: &Value) -> Value {
    match body {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| k.as_str() != "source_file" && k.as_str() != "source_line")
                .map(|(k, v)| (k.clone(), without_source_positions(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_source_positions).collect()),
        other => other.clone(),
    }
}

/// Fencing: the task row must exist and carry exactly `attempt`; while it is
/// leased, only the worker holding the lease may change it.
/// [`fenced`], for a tool call this attempt holds leased.
///
/// Errors: those of `fenced`; `InvalidArgument` for a model call;
/// `FailedPrecondition` for a task no longer leased.
/// The tool of call `call_id` when it is a producer of the run's secret
/// vault (its pinned definition has `RESULT_SECRETS`).
fn producer_tool(state: &machine::RunState, call_id: &str) -> Option<String> {
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

fn leased_tool_call<'a>(
    row: Option<&'a TaskRow>,
    attempt: u32,
    worker_id: &str,
) -> Result<&'a TaskRow, CoordinatorError> {
    let row = fenced(row, attempt, Some(worker_id))?;
    if row.kind != belay_proto::wire::TASK_KIND_TOOL_CALL {
        return Err(CoordinatorError::InvalidArgument(format!(
            "task {} is not a tool call",
            row.task_id
        )));
    }
    if row.status != "leased" {
        return Err(CoordinatorError::FailedPrecondition(format!(
            "task {} is {}, not leased",
            row.task_id, row.status
        )));
    }
    Ok(row)
}

fn fenced<'a>(
    row: Option<&'a TaskRow>,
    attempt: u32,
    worker_id: Option<&str>,
) -> Result<&'a TaskRow, CoordinatorError> {
    let row = row.ok_or_else(|| CoordinatorError::NotFound("task".into()))?;
    if row.attempt as u32 != attempt {
        tracing::warn!(task_id = %row.task_id, attempt, current = row.attempt, "stale attempt refused");
        return Err(CoordinatorError::FailedPrecondition(format!(
            "stale attempt: task {} is at attempt {}, not {attempt}",
            row.task_id, row.attempt
        )));
    }
    if let Some(worker) = worker_id
        && row.status == "leased"
        && row.worker_id.as_deref() != Some(worker)
    {
        tracing::warn!(task_id = %row.task_id, attempt, worker, "task leased by another worker");
        return Err(CoordinatorError::FailedPrecondition(format!(
            "task {} attempt {attempt} is leased by another worker",
            row.task_id
        )));
    }
    Ok(row)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_claimable_holds_until_a_wake_up_the_next_ready_task_or_its_time_limit() {
        let at = tokio::time::Instant::now();
        let memo = NothingClaimable {
            seq: 7,
            at,
            next_ready: None,
        };
        assert_eq!(memo.holds(7, at), Some(at + NOTHING_CLAIMABLE_FOR));
        // A wake-up since: look.
        assert_eq!(memo.holds(8, at), None);
        // Too old: look (changes no wake-up announces).
        assert_eq!(memo.holds(7, at + NOTHING_CLAIMABLE_FOR), None);
        // A delayed task due before the limit: look when it is due.
        let soon = at + Duration::from_millis(20);
        let memo = NothingClaimable {
            next_ready: Some(soon),
            ..memo
        };
        assert_eq!(memo.holds(7, at), Some(soon));
        assert_eq!(memo.holds(7, soon), None);
        let later = NothingClaimable {
            next_ready: Some(at + Duration::from_secs(5)),
            ..memo
        };
        assert_eq!(later.holds(7, at), Some(at + NOTHING_CLAIMABLE_FOR));
    }
}
