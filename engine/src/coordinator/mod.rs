//! The coordinator: drives the pure [`machine`](crate::machine) through the
//! [`store`](crate::store). Resolves definitions into a run plan at start,
//! fences every task change by attempt, long-polls claims on `LISTEN/NOTIFY`,
//! and sweeps expired leases.
//!
//! Architecture Invariant: holds no state that PostgreSQL does not; any
//! number of coordinators may run against one database.
//!
//! The files, one concern each:
//! - `mod.rs`: [`CoordinatorError`] and its conversions, [`CoordinatorConfig`],
//!   [`Coordinator`] itself, and the checks of request fields every part uses.
//! - `registry.rs`: registering definitions, and resolving a workflow into the
//!   run plan a run pins when it starts.
//! - `runs.rs`: starting, reading and controlling runs (cancel, pause,
//!   resume, signals, approvals).
//! - `uncertain.rs`: listing and resolving uncertain outcomes.
//! - `tasks.rs`: claims and heartbeats (a worker's leases), and the fencing
//!   every change of a task passes.
//! - `observed.rs`: the store's transitions, each recording its committed
//!   decision in the engine's metrics.
//! - `dispatch.rs`: letting a tool call's side effect start (its gates, the
//!   secret vault, the callback token).
//! - `results.rs`: what comes back from a call: results, failures, a tool's
//!   question for a person and its answer, async webhook callbacks.
//! - `background.rs`: the loops every replica runs: LISTEN/NOTIFY relay, the
//!   sweeper (expired leases, due timers, the tool cache) and the outbox
//!   (child runs).
//!
//! # In detail (moved from ARCHITECTURE.md)
//!
//! (dispatch takes the tenant's current grants from the
//! locked task row, `TaskRow::tenant_grants`, read by the transition's lock
//! statement, for the machine's permission check right before the tool
//! acts) resolves a workflow's definitions into a run plan
//! (agents, tools of agents and tool nodes, reconcile probes; an MCP tool
//! declared without `repeat_safety:` gets the newest reported listing's
//! `suggested_repeat_safety`, else `never`, pinned into the plan; a
//! `hints.cacheable` tool without `hints.cache_ttl` gets the engine's
//! `--tool-cache-ttl-ms`, pinned the same way), reads the engine's clock
//! for a run's start when a tool of its plan fills in the time
//! (`start_state`), fences task
//! changes by attempt, long-polls claims on the store's wake-ups
//! (`Store::listen`; a claim that took fewer tasks than it asked for is
//! remembered with `Store::tasks_wake_seq`, and until a wake-up moves that
//! count, the next ready task is due, or 100 ms pass, later claims wait
//! without a statement: `NothingClaimable`), sweeps expired leases, fires due timers
//! (`fire_due_timers`, telling the machine how late each fires), deletes
//! expired tool cache entries once a minute (`purge_tool_cache`), delivers signals (`signal_run`) and approval decisions
//! (`decide_approval`), seals a producer's values into the run's vault
//! (`complete_with_secrets`: only keys the tool declares; a value the worker
//! left at a declared path is taken out too; no vault key fails the call,
//! and a producer is refused at dispatch before it acts), wraps a tool
//! call's result, failure or question for a person that came with MCP
//! sampling usage into `Input::ToolCallSampled` (`complete_sampled`,
//! `fail_sampled`, `request_tool_input`; usage of a late result is logged,
//! not charged) and opens a
//! consumer's (`dispatch_call`, returning them with the callback URL in
//! `Dispatched`; a value that does not open is left out), and carries out the outbox (`process_outbox`: start a
//! child run with its derived id, tell a parent its child ended, cancel a
//! child; each idempotent, so at-least-once is enough). A child that would
//! nest more than `MAX_CHILD_DEPTH` (8) levels below a top-level run
//! (counted through `runs.parent_run_id`, `Store::run_depth`) is not
//! created: its parent hears it as a child that could not start, so the
//! starting node or call fails. **Invariant:** holds
//! no state the database does not; any number of coordinators run against one
//! database without a leader.

use std::sync::Arc;

use serde_json::Value;
use tokio::sync::{Notify, broadcast};
use uuid::Uuid;

use crate::definitions::DefinitionError;
use crate::machine::{self, MachineError};
use crate::store::{Store, StoreError, TransitionError};
use crate::vault::VaultKey;

mod background;
mod dispatch;
mod fleet;
mod observed;
mod pools;
mod registry;
mod results;
mod runs;
mod tasks;
mod uncertain;

pub use background::{MAX_CHILD_DEPTH, OUTBOX_LEASE_MS};
pub use dispatch::Dispatched;
pub use results::{
    CALLBACK_PATH_PREFIX, CallbackOutcome, MAX_CALLBACK_BYTES, McpReport, callback_token_sha256,
};
pub use runs::{ApprovalDecision, MAX_SIGNAL_BYTES, StartRun};

pub use pools::LIVE_LEASES;
pub use tasks::Claimed;
pub use uncertain::UncertainFilter;

/// Most bytes accepted in a run input or a task result.
pub const MAX_JSON_BYTES: usize = 4 * 1024 * 1024;

/// Longest identifier (tenant, workflow, idempotency key, worker id, grant,
/// operator), bytes.
pub const MAX_ID_BYTES: usize = 256;
/// Longest free text (reasons, caller), bytes.
pub const MAX_TEXT_BYTES: usize = 4096;

/// Errors of coordinator operations. Each has one
/// [`ErrorCode`](crate::error_code::ErrorCode) ([`CoordinatorError::code`]),
/// which gives its gRPC status and HTTP status.
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
            // A report decided without the run's lock raced a change:
            // nothing was written, and the worker sends it again (ABORTED).
            TransitionError::Store(StoreError::Raced(what)) => CoordinatorError::Conflict(what),
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
            MachineError::NoSuchNode { .. }
            | MachineError::RequestRequired { .. }
            | MachineError::NoSuchRequest { .. } => {
                CoordinatorError::InvalidArgument(e.to_string())
            }
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
            // Every variant is named (no catch-all), so a new one is a
            // compile error here until it is given its error.
            other @ (MachineError::WrongStatus { .. }
            | MachineError::CallNotOpen { .. }
            | MachineError::DispatchRefused { .. }
            | MachineError::DispatchUnavailable { .. }
            | MachineError::SignalIdReused { .. }
            | MachineError::NotWaiting(_)) => {
                CoordinatorError::FailedPrecondition(other.to_string())
            }
        }
    }
}

impl From<StoreError> for CoordinatorError {
    /// Data the database refuses (SQLSTATE class 22 "data exception", 54
    /// "program limit exceeded") fails the same way on every retry, so it is
    /// the caller's bad input, not an outage; so is a duplicate of a unique
    /// value ([`StoreError::Conflict`], whose message names only the column).
    fn from(e: StoreError) -> Self {
        if let StoreError::Conflict(what) = e {
            return CoordinatorError::Conflict(what);
        }
        if let Some(code) = e.rejected_value_sqlstate() {
            tracing::warn!(error = %e, %code, "the database refused a value");
            return CoordinatorError::InvalidArgument(format!(
                "a value was refused by the database (SQLSTATE {code}): it is malformed or too long"
            ));
        }
        CoordinatorError::Store(e)
    }
}

/// Tunables, all durations in ms.
#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    /// Lease granted by a claim or a heartbeat.
    pub lease_ms: u64,
    /// How often expired leases are looked for.
    pub sweep_interval_ms: u64,
    /// How long the fleet must look upgraded before its behaviour level is
    /// raised (`store::fleet_level`).
    pub fleet_upgrade_hold_ms: u64,
    /// Record the dispatch of a task whose spec allows it when it is
    /// leased ([`Coordinator::dispatch_with_claim`]); on by default (off:
    /// every worker asks, as before; for A/B measurements).
    pub dispatch_with_claim: bool,
    /// How long a result of a `hints.cacheable: true` tool is served from
    /// the tenant's result cache when the tool gives no `hints.cache_ttl`
    /// (pinned into each run's plan when it starts); 0: such tools are not
    /// cached.
    pub tool_cache_ttl_ms: u64,
    /// Values of `{{config.NAME}}` placeholders resolved in definitions
    /// when they are registered (a `type: workflow` tool's `timeout_ms`),
    /// by NAME; the binaries read them from `BELAY_TOOL_CONFIG_<NAME>`
    /// ([`definitions::config_from_env`](crate::definitions::config_from_env)). Empty by default.
    pub definition_config: std::collections::BTreeMap<String, String>,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        CoordinatorConfig {
            lease_ms: 30_000,
            sweep_interval_ms: 1_000,
            fleet_upgrade_hold_ms: crate::store::fleet_level::DEFAULT_UPGRADE_HOLD_MS,
            dispatch_with_claim: true,
            tool_cache_ttl_ms: machine::cache::DEFAULT_TOOL_CACHE_TTL_MS,
            definition_config: std::collections::BTreeMap::new(),
        }
    }
}

/// The coordinator; share it with `Arc`.
#[derive(Debug)]
pub struct Coordinator {
    store: Store,
    config: CoordinatorConfig,
    tasks_ready: Notify,
    /// Set once the engine begins to shut down ([`Coordinator::stop_claims`]):
    /// long-poll claims answer empty at once instead of holding the
    /// graceful shutdown for their `wait_ms`.
    claims_stopped: std::sync::atomic::AtomicBool,
    /// What the last claim that left nothing claimable saw, so the next
    /// claim can skip its statement ([`tasks::NothingClaimable`]), by the
    /// capability tags it claimed with (`None`: none named).
    nothing_claimable: std::sync::Mutex<tasks::Memos>,
    /// When each worker's claim was last written to `workers`
    /// ([`pools::SeenWorkers`]).
    workers_seen: std::sync::Mutex<pools::SeenWorkers>,
    run_events: broadcast::Sender<Uuid>,
    /// Outbox rows were written (here or by another replica).
    outbox_ready: Notify,
    /// Base URL of the callback endpoint (`type: async_webhook`), as tool
    /// servers reach it; unset: such tools are refused at dispatch.
    callback_base_url: std::sync::OnceLock<String>,
    /// The key of the runs' secret vaults (`RESULT_SECRETS`); unset: a
    /// producer tool is refused at dispatch.
    vault: std::sync::OnceLock<VaultKey>,
    /// This engine's metrics (`/metrics`), recorded by `observed.rs`.
    metrics: crate::metrics::EngineMetrics,
    /// Set, with the reason, once the fleet's behaviour level was found
    /// raised past this engine's while it ran
    /// ([`Coordinator::refresh_fleet_level`]): it must stop.
    outranked: tokio::sync::watch::Sender<Option<String>>,
}

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

impl Coordinator {
    /// A coordinator over `store`.
    pub fn new(store: Store, config: CoordinatorConfig) -> Arc<Coordinator> {
        let (run_events, _) = broadcast::channel(1024);
        Arc::new(Coordinator {
            store,
            config,
            tasks_ready: Notify::new(),
            claims_stopped: std::sync::atomic::AtomicBool::new(false),
            nothing_claimable: std::sync::Mutex::new(Default::default()),
            workers_seen: std::sync::Mutex::new(Default::default()),
            outbox_ready: Notify::new(),
            run_events,
            callback_base_url: std::sync::OnceLock::new(),
            vault: std::sync::OnceLock::new(),
            metrics: crate::metrics::EngineMetrics::new(),
            outranked: tokio::sync::watch::Sender::new(None),
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
}
