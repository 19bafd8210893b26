//! Persistence. Every SQL statement of the engine lives under this module.
//!
//! Architecture Invariant: each run transition is one transaction that
//! appends its events and changes the run and task rows together
//! ([`Store::transition`]); events are appended under the run row's lock, so
//! `seq` is gapless. Leases are judged by the database clock (`now()`), never
//! by comparing the clocks of two machines.

mod notifications;
mod postgres;

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

pub use notifications::{NotificationRow, NotificationStatus};
pub use postgres::{EVENTS_CHANNEL, Store, TASKS_CHANNEL, UncertainQuery};

/// Errors of the store. Database details stay in logs; the API maps these to
/// generic statuses.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database failed or is unreachable.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// Migrations failed.
    #[error("migration error: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A stored row does not decode (a bug or a manual edit).
    #[error("corrupt row: {0}")]
    Corrupt(String),
    /// The run or task named does not exist (for this tenant).
    #[error("{0} not found")]
    NotFound(String),
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

/// Why a transition did not happen.
#[derive(Debug, thiserror::Error)]
pub enum TransitionError<E> {
    /// The store failed; nothing was written.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The decision function refused; nothing was written.
    #[error("refused")]
    Refused(E),
}

/// Result of a committed transition.
#[derive(Debug, Clone)]
pub struct Applied {
    /// Seq of the first appended event (if any).
    pub first_seq: u64,
    /// Number of events appended.
    pub events: usize,
    /// Status of the run afterwards.
    pub status: &'static str,
}
