//! The store's error and the rows it hands out or takes: [`StoreError`],
//! the rows of its tables (`runs`, `events`, `tasks`, `definitions`,
//! `uncertain_outcomes`, `outbox`, `tool_cache`, `notifications`, the MCP
//! tool tables, ...) and the filters of its list queries. Plain data: the
//! statements that read and write them are in the backends (`postgres/`,
//! `sqlite/`, in the file named after the table or concern); the audit of
//! tool calls keeps its types beside its rules, in `tool_calls.rs`.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

#[cfg(doc)]
use crate::Store;

/// Errors of the store. Database details stay in logs; the API maps these to
/// generic statuses.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database failed or is unreachable.
    #[error("database error: {0}")]
    Database(#[source] sqlx::Error),
    /// Migrations failed.
    #[error("migration error: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A stored row does not decode (a bug or a manual edit).
    #[error("corrupt row: {0}")]
    Corrupt(String),
    /// The run or task named does not exist (for this tenant).
    #[error("{0} not found")]
    NotFound(String),
    /// A row with this unique value exists already (the message names the
    /// column, e.g. a principal's `key_id` or `cert_subject`); nothing was
    /// written.
    #[error("{0}")]
    Conflict(String),
    /// A transition decided without the run's lock (a worker's report of
    /// a task this engine handed over) found the run, the task or the
    /// tenant's grants changed when it came to write: nothing was written,
    /// and the same report sent again is decided afresh.
    #[error("{0}")]
    Raced(String),
    /// The store cannot be opened as configured (URL scheme, a SQLite file
    /// held by another engine process, an unusable path).
    #[error("{0}")]
    Config(String),
}

impl From<sqlx::Error> for StoreError {
    /// Counted by class for the engine's metrics ([`crate::db_error_counts`]).
    fn from(e: sqlx::Error) -> Self {
        crate::db_errors::count(&e);
        StoreError::Database(e)
    }
}

impl StoreError {
    /// The SQLSTATE of a value the database refused as data, if this error
    /// is one: class 22 ("data exception": a malformed value, a string too
    /// long for its column, a NUL byte in text, a number out of range) or
    /// 54 ("program limit exceeded": a value or statement over one of the
    /// server's size limits). Such a statement fails the same way on every
    /// retry, so the error is the caller's bad input (the API answers it as
    /// an invalid argument), not an outage; `None` for every other error.
    ///
    /// On SQLite the code is SQLite's numeric result code, not a SQLSTATE,
    /// and none of them is in these classes but `SQLITE_NOLFS` (22); SQLite
    /// stores what PostgreSQL refuses here (it has no length limits short of
    /// `SQLITE_TOOBIG`, 18), so this is in effect PostgreSQL's.
    pub fn rejected_value_sqlstate(&self) -> Option<std::borrow::Cow<'_, str>> {
        match self {
            StoreError::Database(sqlx::Error::Database(db)) => db
                .code()
                .filter(|code| code.starts_with("22") || code.starts_with("54")),
            _ => None,
        }
    }

    /// Whether the database could not be reached, or is not accepting
    /// connections yet: an I/O or TLS failure, a pool timeout, or
    /// PostgreSQL's SQLSTATE class 08 (connection exception) or 57P01–
    /// 57P03 (shutting down, crash shutdown, "the database system is
    /// starting up" / in recovery), also inside a failed migration. Such a
    /// failure may pass by itself (an engine that starts while PostgreSQL
    /// recovers waits for it); any other error will not.
    pub fn is_unreachable(&self) -> bool {
        let e = match self {
            StoreError::Database(e) => e,
            StoreError::Migrate(sqlx::migrate::MigrateError::Execute(e)) => e,
            _ => return false,
        };
        match e {
            sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::PoolTimedOut => true,
            sqlx::Error::Database(db) => db
                .code()
                .is_some_and(|c| c.starts_with("08") || matches!(&*c, "57P01" | "57P02" | "57P03")),
            _ => false,
        }
    }

    /// Whether the database refused a value as data (SQLSTATE class 22 or
    /// 54; see [`StoreError::rejected_value_sqlstate`]).
    pub fn is_rejected_value(&self) -> bool {
        self.rejected_value_sqlstate().is_some()
    }
}

/// A row of `runs`.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct RunRow {
    /// Run id.
    pub run_id: Uuid,
    /// Tenant.
    pub tenant: String,
    /// Workflow name.
    pub workflow: String,
    /// Workflow version.
    pub workflow_version: i32,
    /// Status (`running`, `paused`, ...).
    pub status: String,
    /// Why paused/failed/cancelled.
    pub status_reason: String,
    /// Input.
    pub input: Value,
    /// Output when completed.
    pub output: Option<Value>,
    /// Idempotency key given at start.
    pub idempotency_key: String,
    /// Caller.
    pub caller: String,
    /// Newest seq.
    pub last_seq: i64,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// Last changed.
    pub updated_at: DateTime<Utc>,
}

/// A row of `events`.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct EventRow {
    /// Run id.
    pub run_id: Uuid,
    /// Gapless from 1.
    pub seq: i64,
    /// Event type.
    pub kind: String,
    /// Whole event as JSON.
    pub payload: Value,
    /// When it was written (database clock).
    pub recorded_at: DateTime<Utc>,
}

/// A row of `tasks`, as seen inside a transition.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TaskRow {
    /// Task id.
    pub task_id: Uuid,
    /// Run id.
    pub run_id: Uuid,
    /// Call id.
    pub call_id: String,
    /// `model_call` or `tool_call`.
    pub kind: String,
    /// `ready`, `leased`, `completed`, ...
    pub status: String,
    /// Current attempt (fencing token).
    pub attempt: i32,
    /// Worker holding the lease.
    pub worker_id: Option<String>,
    /// Whether the current attempt was dispatched.
    pub dispatched: bool,
    /// When it was dispatched.
    pub dispatched_at: Option<DateTime<Utc>>,
    /// Whether the lease has expired by the database clock.
    pub lease_expired: bool,
    /// When the current attempt became ready (claimable): the task's
    /// creation, or the end of a retry's backoff. With the transition's
    /// `RunState::now` it gives a step's latency, ready to recorded.
    pub available_at: Option<DateTime<Utc>>,
    /// The grants the run's tenant holds as of the transition's lock
    /// statement (empty for a tenant never configured), read in that same
    /// statement for a dispatch ([`Store::transition_task_gated`]), so the
    /// permission check at dispatch costs no round trip of its own; empty
    /// for every other transition.
    #[sqlx(skip)]
    pub tenant_grants: Vec<String>,
}

/// A task handed to a worker by a claim.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ClaimedTask {
    /// Task id.
    pub task_id: Uuid,
    /// Run id.
    pub run_id: Uuid,
    /// Tenant.
    pub tenant: String,
    /// Kind.
    pub kind: String,
    /// Attempt now held.
    pub attempt: i32,
    /// Spec JSON.
    pub spec: Value,
    /// Idempotency key.
    pub idempotency_key: String,
    /// How long the task had been ready (claimable) when this claim took
    /// it, ms by the database clock: the dispatch latency.
    pub waited_ms: f64,
    /// Whether its dispatch was recorded with its lease (a task handed
    /// over by a report's transition, [`crate::HandOff`]); a claim
    /// statement leaves it false.
    #[sqlx(default)]
    pub dispatched: bool,
}

/// A definition as stored.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct DefinitionRow {
    /// `tool`, `agent` or `workflow`.
    pub kind: String,
    /// Name.
    pub name: String,
    /// Version.
    pub version: i32,
    /// sha256 hex of `body`.
    pub content_hash: String,
    /// Canonical JSON of the definition.
    pub body: Value,
    /// Created.
    pub created_at: DateTime<Utc>,
}

/// An expired lease found by the sweeper.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ExpiredLease {
    /// Task id.
    pub task_id: Uuid,
    /// Run id.
    pub run_id: Uuid,
    /// Attempt whose lease expired.
    pub attempt: i32,
}

/// A row of `uncertain_outcomes`.
#[derive(Debug, Clone, sqlx::FromRow, serde::Serialize)]
pub struct UncertainRow {
    /// Record id.
    pub uncertain_id: Uuid,
    /// Tenant.
    pub tenant: String,
    /// Run.
    pub run_id: Uuid,
    /// Task.
    pub task_id: Uuid,
    /// Call.
    pub call_id: String,
    /// Node.
    pub node_id: String,
    /// Tool.
    pub tool: String,
    /// Tool version.
    pub tool_version: i32,
    /// Arguments sent.
    pub arguments: Value,
    /// Idempotency key.
    pub idempotency_key: String,
    /// Attempts with timestamps and errors.
    pub attempts: Value,
    /// Worker that dispatched it.
    pub worker_id: Option<String>,
    /// Why.
    pub reason: String,
    /// `open` or `resolved`.
    pub status: String,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// The resolution as stored (`{"resolution": ..., ...}`).
    pub resolution: Option<Value>,
    /// `succeeded`, `failed` or `retry`.
    pub resolution_kind: Option<String>,
    /// Who resolved it.
    pub resolved_by: Option<String>,
    /// When.
    pub resolved_at: Option<DateTime<Utc>>,
    /// `operator`, `late_result` or `probe`.
    pub resolved_via: Option<String>,
    /// Why.
    pub resolution_reason: Option<String>,
    /// What a reconcile probe found.
    pub probe: Option<Value>,
    /// Late results that arrived after resolution (array).
    pub discrepancy: Option<Value>,
    /// 1 for the call's first uncertain outcome, 2 if it became uncertain
    /// again after a retry, and so on.
    pub occurrence: i32,
}

/// A row of a run's secret vault (`run_secrets`), without its value: for
/// tests and operators ([`Store::run_secrets`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunSecretRow {
    /// The vault key.
    pub key: String,
    /// The call whose result held it.
    pub producer_call: String,
    /// When it expires by the engine's clock; `None`: at the run's end.
    pub expires_at: Option<DateTime<Utc>>,
    /// Consumed by the first call that reads it.
    pub single_use: bool,
    /// The tools that may read it (empty: any that lists it).
    pub consumers: Vec<String>,
    /// The call that consumed it, for a single-use one.
    pub consumed_by_call: Option<String>,
}

/// Filters of [`Store::list_uncertain`].
#[derive(Debug, Clone, Default)]
pub struct UncertainQuery<'a> {
    /// Tenant (required).
    pub tenant: &'a str,
    /// `open` or `resolved`.
    pub status: Option<&'a str>,
    /// Tool name.
    pub tool: Option<&'a str>,
    /// Run.
    pub run_id: Option<Uuid>,
    /// Only records at least this old, ms.
    pub older_than_ms: Option<u64>,
    /// Only records at most this old, ms.
    pub newer_than_ms: Option<u64>,
    /// Keyset position: records strictly older than this.
    pub after: Option<(chrono::DateTime<chrono::Utc>, Uuid)>,
    /// Page size + 1.
    pub limit: i64,
}

/// A row of `outbox`: work a transition asked for that belongs to another
/// run, carried out after it committed, at least once.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OutboxRow {
    /// Id.
    pub outbox_id: Uuid,
    /// `start_child`, `child_finished` or `cancel_child`.
    pub kind: String,
    /// The run whose transition wrote it.
    pub run_id: Uuid,
    /// What to do (shape per kind).
    pub payload: Value,
    /// Claims so far (this one included).
    pub attempts: i32,
}

/// A row of `tool_cache` (the result cache of `hints.cacheable` tools,
/// [`belay_machine::cache`]).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct ToolCacheRow {
    /// Tenant.
    pub tenant: String,
    /// Key ([`belay_machine::cache::key`]).
    pub cache_key: String,
    /// Tool name.
    pub tool: String,
    /// The result, as recorded (scrubbed).
    pub result: Value,
    /// The run whose call stored it.
    pub run_id: Uuid,
    /// That call's id.
    pub call_id: String,
    /// When it was stored (engine's clock).
    pub stored_at: DateTime<Utc>,
    /// When it stops being served (engine's clock).
    pub expires_at: DateTime<Utc>,
}

impl ToolCacheRow {
    /// The entry as the machine takes it ([`belay_machine::Input::ToolCacheHit`]).
    pub(crate) fn entry(self) -> belay_machine::cache::CacheEntry {
        belay_machine::cache::CacheEntry {
            key: self.cache_key,
            result: self.result,
            stored_by_run: self.run_id.to_string(),
            stored_by_call: self.call_id,
            stored_at: self.stored_at,
            expires_at: self.expires_at,
        }
    }
}

/// The columns of [`ToolCacheRow`], in its order.
pub(crate) const TOOL_CACHE_COLUMNS: &str =
    "tenant, cache_key, tool, result, run_id, call_id, stored_at, expires_at";

// ---- notifications (outbox) ----------------------------------------
// Written by a transition that pauses a run on an uncertain outcome; the
// statements that deliver them are in `postgres/notifications.rs` and
// `sqlite/notifications.rs`.

/// A notification claimed for delivery.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct NotificationRow {
    /// Id; sent as the body's `id` and the `Belay-Delivery` header.
    pub notification_id: Uuid,
    /// Tenant.
    pub tenant: String,
    /// Run that paused.
    pub run_id: Uuid,
    /// Event type, e.g. `run.paused.uncertain_outcome`.
    pub kind: String,
    /// JSON payload (the body's `data`).
    pub payload: Value,
    /// Attempts so far, including the one this claim starts (1-based).
    pub attempts: i32,
    /// When the notification was written (database clock).
    pub created_at: DateTime<Utc>,
}

/// Delivery state of one notification (for operators and tests).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct NotificationStatus {
    /// Id.
    pub notification_id: Uuid,
    /// Tenant.
    pub tenant: String,
    /// Run.
    pub run_id: Uuid,
    /// Event type.
    pub kind: String,
    /// Attempts made (claims).
    pub attempts: i32,
    /// When it may be claimed next.
    pub next_attempt_at: DateTime<Utc>,
    /// When a receiver accepted it (2xx).
    pub delivered_at: Option<DateTime<Utc>>,
    /// When delivery was abandoned after the last attempt.
    pub failed_at: Option<DateTime<Utc>>,
    /// The last failure (HTTP status and body excerpt, or transport error).
    pub last_error: Option<String>,
}

// ---- MCP tools (definitions reported by workers, pins) -------------
// Rows of the MCP tool tables (`mcp_tool_definitions`, `mcp_tool_pins`):
// the definitions workers report for the tools of their MCP servers, and
// the definition each tenant accepted (pinned). The statements are in the
// backends (`postgres/mcp_tools.rs`, `sqlite/mcp_tools.rs`); the rules (trust
// on first use, accepting a change) are in `belay_engine::mcp_pins`.

/// One definition of an MCP tool, as workers reported it: a row of
/// `mcp_tool_definitions`, keyed by (server, tool, definition hash).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow, Serialize)]
pub struct McpToolDefinitionRow {
    /// The server's logical name.
    pub server: String,
    /// The tool's name on the server.
    pub tool: String,
    /// `sha256:<hex>` of the canonical definition.
    pub definition_hash: String,
    /// The definition as the worker mapped it (untrusted data: shown, never run).
    pub definition: Value,
    /// Why Belay refuses the tool, if it does.
    pub refusal: Option<String>,
    /// `never` or `idempotent`: the default the server's hints suggest.
    pub suggested_repeat_safety: String,
    /// Protocol revision of the report that last listed it.
    pub protocol_version: String,
    /// When a worker first listed this definition (database clock).
    pub first_seen_at: DateTime<Utc>,
    /// When a worker last listed it (database clock).
    pub last_seen_at: DateTime<Utc>,
    /// The worker whose report last listed it.
    pub reported_by: String,
}

/// The definition of an MCP tool a tenant accepted: a row of `mcp_tool_pins`.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow, Serialize)]
pub struct McpToolPinRow {
    /// Tenant.
    pub tenant: String,
    /// The server's logical name.
    pub server: String,
    /// The tool's name on the server.
    pub tool: String,
    /// The accepted definition's hash: calls go through only while the
    /// server lists exactly this one.
    pub definition_hash: String,
    /// The hash accepted before this one, if any.
    pub previous_hash: Option<String>,
    /// `first use (worker <id>)`, or who accepted it (token name and operator).
    pub accepted_by: String,
    /// Why.
    pub reason: String,
    /// When (database clock).
    pub accepted_at: DateTime<Utc>,
}

/// One listed tool to record ([`super::Store::record_mcp_tools`]).
#[derive(Debug, Clone, PartialEq)]
pub struct McpToolListingIn {
    /// The tool's name on the server.
    pub tool: String,
    /// `sha256:<hex>`.
    pub definition_hash: String,
    /// The definition (NUL-free JSON).
    pub definition: Value,
    /// Why Belay refuses it, if it does.
    pub refusal: Option<String>,
    /// `never` or `idempotent`.
    pub suggested_repeat_safety: String,
}

/// What pinning at dispatch needs to know of a task.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct McpPinTask {
    /// The run's tenant.
    pub tenant: String,
    /// `model_call` or `tool_call`.
    pub kind: String,
    /// `ready`, `leased`, ...
    pub status: String,
    /// Current attempt.
    pub attempt: i32,
    /// Worker holding the lease.
    pub worker_id: Option<String>,
    /// The task spec (`wire::ToolCallSpec` for tool calls).
    pub spec: Value,
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::*;

    /// A database error with the given code, as a driver reports it.
    #[derive(Debug)]
    struct Refused(Option<&'static str>);

    impl std::fmt::Display for Refused {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "refused with {:?}", self.0)
        }
    }

    impl std::error::Error for Refused {}

    impl sqlx::error::DatabaseError for Refused {
        fn message(&self) -> &str {
            "refused"
        }

        fn code(&self) -> Option<Cow<'_, str>> {
            self.0.map(Cow::Borrowed)
        }

        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }

        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }

        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }

        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    fn refused(code: Option<&'static str>) -> StoreError {
        StoreError::Database(sqlx::Error::Database(Box::new(Refused(code))))
    }

    #[test]
    fn a_value_refused_as_data_is_told_from_an_outage_by_its_sqlstate_class() {
        // 22001 string_data_right_truncation, 22021 character_not_in_repertoire
        // (a NUL byte), 22P02 invalid_text_representation, 54000
        // program_limit_exceeded.
        for code in ["22001", "22021", "22P02", "54000"] {
            let e = refused(Some(code));
            assert_eq!(e.rejected_value_sqlstate().as_deref(), Some(code));
            assert!(e.is_rejected_value(), "{code}");
        }
        // 23505 unique_violation, 40001 serialization_failure, 57P01
        // admin_shutdown, 08006 connection_failure; a code-less error; and
        // SQLite's SQLITE_TOOBIG (18), SQLITE_CONSTRAINT_UNIQUE (2067).
        for code in [
            Some("23505"),
            Some("40001"),
            Some("57P01"),
            Some("08006"),
            None,
            Some("18"),
            Some("2067"),
        ] {
            let e = refused(code);
            assert_eq!(e.rejected_value_sqlstate(), None, "{code:?}");
            assert!(!e.is_rejected_value(), "{code:?}");
        }
        for e in [
            StoreError::Database(sqlx::Error::PoolTimedOut),
            StoreError::Corrupt("22001".into()),
            StoreError::NotFound("run".into()),
            StoreError::Config("22".into()),
            StoreError::Conflict("22".into()),
        ] {
            assert!(!e.is_rejected_value(), "{e}");
        }
    }
}
