//! Persistence. Every SQL statement of the engine lives under this module.
//!
//! [`Store`] is the one interface the rest of the engine sees; it has two
//! backends with the same semantics: PostgreSQL ([`postgres`], production:
//! any number of engine replicas) and SQLite ([`sqlite`], embedded: one
//! engine process per database file). Each backend method has the same
//! signature, and [`Store`] dispatches to the one it was opened on, so the
//! two cannot drift apart without a compile error; the conformance suite
//! (`engine/tests/store_conformance.rs`) runs the same tests on both.
//!
//! Architecture Invariant: each run transition is one transaction that
//! appends its events and changes the run and task rows together
//! ([`Store::transition`]); events are appended under the run row's lock, so
//! `seq` is gapless. Leases are judged by the database clock (`now()`), never
//! by comparing the clocks of two machines.

mod mcp_tools;
mod postgres;
mod sqlite;
mod tool_calls;

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

pub use mcp_tools::{McpPinTask, McpToolDefinitionRow, McpToolListingIn, McpToolPinRow};
pub use postgres::notifications::{NotificationRow, NotificationStatus};
pub use postgres::wakes::{EVENTS_CHANNEL, TASKS_CHANNEL};
pub use tool_calls::{
    ToolCallConfirmation, ToolCallDecision, ToolCallOutcome, ToolCallQuery, ToolCallRecord,
    ToolCallRefusal,
};

use belay_machine::gates::{Circuit, GateRow, GateVerdict, ToolGates};
use belay_machine::{Decision, RunState};

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
    /// The store cannot be opened as configured (URL scheme, a SQLite file
    /// held by another engine process, an unusable path).
    #[error("{0}")]
    Config(String),
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
    /// What the decision's [`Command::RestoreSecrets`](belay_machine::Command::RestoreSecrets)
    /// read from the run's vault (sealed; the coordinator opens them).
    /// Empty for every other transition.
    pub secrets: Vec<belay_machine::SealedSecret>,
}

/// A bounded map of run states; when full, an arbitrary entry is dropped.
#[derive(Debug, Default)]
pub(crate) struct StateCache {
    map: HashMap<Uuid, RunState>,
    capacity: usize,
}

impl StateCache {
    pub(crate) fn new(capacity: usize) -> StateCache {
        StateCache {
            map: HashMap::new(),
            capacity,
        }
    }

    pub(crate) fn take(&mut self, run_id: &Uuid) -> Option<RunState> {
        self.map.remove(run_id)
    }

    pub(crate) fn put(&mut self, run_id: Uuid, state: RunState) {
        if self.capacity == 0 {
            return;
        }
        if self.map.len() >= self.capacity
            && !self.map.contains_key(&run_id)
            && let Some(victim) = self.map.keys().next().copied()
        {
            self.map.remove(&victim);
        }
        self.map.insert(run_id, state);
    }
}

/// Run states kept in memory per engine (see [`Store`]); at most this many.
pub const STATE_CACHE_RUNS: usize = 2048;

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

/// What a transition locks first.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Target {
    /// A run, and optionally one of its tasks.
    Run(Uuid, Option<Uuid>),
    /// A task and its run.
    Task(Uuid),
    /// A task and its run, for the task's dispatch: the locked task row
    /// also carries the tenant's grants as they are now
    /// ([`TaskRow::tenant_grants`]), read by the same statement.
    Dispatch(Uuid),
}

impl Target {
    /// The target without the dispatch flag, and whether it was set.
    pub(crate) fn split_dispatch(self) -> (Target, bool) {
        match self {
            Target::Dispatch(task_id) => (Target::Task(task_id), true),
            other => (other, false),
        }
    }
}

/// What a committed transition wakes (and hands back).
#[derive(Debug, Clone, Default)]
pub(crate) struct Wakes {
    /// Tasks may have become claimable.
    pub(crate) tasks: bool,
    /// The run got events.
    pub(crate) events: bool,
    /// Outbox rows were written.
    pub(crate) outbox: bool,
    /// What a [`Command::RestoreSecrets`](belay_machine::Command) read from
    /// the run's vault (not a wake-up: handed back with the transition's
    /// result).
    pub(crate) secrets: Vec<belay_machine::SealedSecret>,
}

/// Whether a committed `decision` may have made tasks claimable: it
/// schedules or re-queues one, or resumes its run (a paused run's ready
/// tasks are not claimed until then).
pub(crate) fn wakes_tasks(decision: &Decision) -> bool {
    use belay_machine::{Command, Event};
    decision
        .commands
        .iter()
        .any(|c| matches!(c, Command::ScheduleTask { .. } | Command::RetryTask { .. }))
        || decision
            .events
            .iter()
            .any(|e| matches!(e, Event::RunResumed { .. }))
}

/// How many times, as far as this process can tell, tasks may have become
/// claimable: bumped after a commit of this process that scheduled or
/// re-queued a task, on a `Wake::Tasks` from another process, when the
/// wake-up listener (re)connects or fell behind, and by the store's own
/// out-of-band task changes ([`Store::advance_clock`],
/// [`Store::expire_task_timers`]). A claimer that found nothing claimable
/// while the count stayed the same may skip looking again
/// ([`Store::tasks_wake_seq`]). Cheap to clone (one shared counter).
#[derive(Debug, Clone, Default)]
pub(crate) struct TasksWakeSeq(std::sync::Arc<std::sync::atomic::AtomicU64>);

impl TasksWakeSeq {
    /// Count one more moment tasks may have become claimable; call it after
    /// the change is committed (visible to a claim statement).
    pub(crate) fn bump(&self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// The count so far.
    pub(crate) fn get(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A wake-up relayed by [`Store::listen`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// Tasks may have become claimable.
    Tasks,
    /// This run got new events.
    RunEvents(Uuid),
    /// Outbox rows were written ([`Store::claim_outbox`]).
    Outbox,
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

/// Apply the events `(seq, payload)` that follow `state` (in seq order),
/// checking that `seq` stays gapless.
///
/// Errors: [`StoreError::Corrupt`] for an event that does not decode or a
/// gap.
pub(crate) fn fold_tail(
    state: &mut RunState,
    run_id: Uuid,
    rows: Vec<(i64, Value)>,
) -> Result<(), StoreError> {
    for (seq, payload) in rows {
        let event: belay_machine::Event = serde_json::from_value(payload)
            .map_err(|e| StoreError::Corrupt(format!("run {run_id} event {seq}: {e}")))?;
        state.apply(&event);
        if state.last_seq != seq as u64 {
            return Err(StoreError::Corrupt(format!(
                "run {run_id}: gap before seq {seq}"
            )));
        }
    }
    Ok(())
}

/// Whether a decision ends its run (a terminal event).
pub(crate) fn ends_run(decision: &Decision) -> bool {
    decision.events.iter().any(|e| {
        matches!(
            e,
            belay_machine::Event::RunCompleted { .. }
                | belay_machine::Event::RunFailed { .. }
                | belay_machine::Event::RunCancelled { .. }
        )
    })
}

/// The `child_finished` outbox payload of a child run that ended in state `after`.
pub(crate) fn child_finished_payload(
    tenant: &str,
    parent: Uuid,
    child: Uuid,
    after: &RunState,
) -> Value {
    serde_json::json!({
        "tenant": tenant,
        "parent_run_id": parent,
        "child_run_id": child,
        "status": after.status.as_str(),
        "output": after.output,
        "error": if after.status_reason.is_empty() { None } else { Some(&after.status_reason) },
    })
}

/// A decision function of a transition that passes no tool gate, as the
/// backends take it: a verdict for it means a decision asked for a tool's
/// gates outside [`Store::transition_task_gated`], which is refused rather
/// than let the call pass unchecked.
fn decide_once<E, F>(
    decide: F,
) -> impl FnMut(&RunState, Option<&TaskRow>, Option<&GateVerdict>) -> Result<Decision, TransitionError<E>>
where
    F: FnOnce(&RunState, Option<&TaskRow>) -> Result<Decision, E>,
{
    let mut decide = Some(decide);
    move |state, task, verdict| match (verdict, decide.take()) {
        (None, Some(decide)) => decide(state, task).map_err(TransitionError::Refused),
        _ => Err(StoreError::Corrupt(
            "a tool's gates held back a decision that cannot be made again".into(),
        )
        .into()),
    }
}

/// The tool gates a decision asks to pass, if any
/// ([`Command::PassToolGates`](belay_machine::Command::PassToolGates)).
pub(crate) fn gates_asked(decision: &Decision) -> Option<GatesAsked<'_>> {
    decision.commands.iter().find_map(|c| match c {
        belay_machine::Command::PassToolGates {
            tool,
            gates,
            holds_turn,
        } => Some(GatesAsked {
            tool,
            gates,
            holds_turn: *holds_turn,
        }),
        _ => None,
    })
}

/// What [`Command::PassToolGates`](belay_machine::Command::PassToolGates) asks.
pub(crate) struct GatesAsked<'a> {
    /// Tool name.
    pub tool: &'a str,
    /// Its gates.
    pub gates: &'a ToolGates,
    /// Whether the call holds a turn.
    pub holds_turn: bool,
}

/// The decision to write after `first` asked for the tool's gates and they
/// said `verdict` (`None`: they let the call go): `first`, or `decide`'s
/// second decision, which may not ask again.
pub(crate) fn after_gates<E, F>(
    first: Decision,
    verdict: Option<GateVerdict>,
    state: &RunState,
    task: Option<&TaskRow>,
    decide: &mut F,
) -> Result<Decision, TransitionError<E>>
where
    F: FnMut(
        &RunState,
        Option<&TaskRow>,
        Option<&GateVerdict>,
    ) -> Result<Decision, TransitionError<E>>,
{
    let Some(verdict) = verdict else {
        return Ok(first);
    };
    let second = decide(state, task, Some(&verdict))?;
    if gates_asked(&second).is_some() {
        return Err(StoreError::Corrupt(
            "a decision held back by a tool's gates asked for them again".into(),
        )
        .into());
    }
    Ok(second)
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

/// The cache lookups `commands` ask for
/// ([`Command::LookupToolCache`](belay_machine::Command::LookupToolCache)):
/// `(call_id, key)`, in order.
pub(crate) fn cache_lookups(commands: &[belay_machine::Command]) -> Vec<(String, String)> {
    commands
        .iter()
        .filter_map(|c| match c {
            belay_machine::Command::LookupToolCache { call_id, key } => {
                Some((call_id.clone(), key.clone()))
            }
            _ => None,
        })
        .collect()
}

/// Serving the calls a decision launched from the tenant's tool cache
/// ([`belay_machine::cache`]): the loop of each backend's
/// `serve_from_cache`, whose statements differ. It hands out the keys to
/// read, in order (the lookups of the decision, then those of each hit's
/// decision: a hit can start the next node, whose call can hit too), at
/// most [`MAX_CACHE_HITS_PER_TRANSITION`] hits; a live entry makes the
/// machine decide [`Input::ToolCacheHit`] on the state after what was
/// decided so far. If it takes the hit, the call's task and lookup leave
/// the decision and the hit's events and commands are appended; if it
/// refuses, the call runs as a task, as on a miss.
///
/// [`MAX_CACHE_HITS_PER_TRANSITION`]: belay_machine::cache::MAX_CACHE_HITS_PER_TRANSITION
/// [`Input::ToolCacheHit`]: belay_machine::Input::ToolCacheHit
pub(crate) struct CacheServing {
    decision: Decision,
    /// The run after `decision`'s events.
    after: RunState,
    /// `(call_id, key)` to read, in order; `next` is the first not read.
    queue: Vec<(String, String)>,
    next: usize,
    hits: usize,
    /// The tenant's grants now, read at the first live entry.
    grants: Option<Vec<String>>,
}

impl CacheServing {
    /// Serving `decision`, decided on `state`; `Err` gives it back when it
    /// asks for no lookup (it then costs no statement).
    pub(crate) fn new(state: &RunState, decision: Decision) -> Result<CacheServing, Decision> {
        let queue = cache_lookups(&decision.commands);
        if queue.is_empty() {
            return Err(decision);
        }
        let mut after = state.clone();
        for event in &decision.events {
            after.apply(event);
        }
        Ok(CacheServing {
            decision,
            after,
            queue,
            next: 0,
            hits: 0,
            grants: None,
        })
    }

    /// Whether the transition's time is unknown (a run's start): the
    /// machine may start a node whose call fills in the time.
    pub(crate) fn needs_clock(&self) -> bool {
        self.after.now.is_none()
    }

    /// The engine's clock, read in the transaction.
    pub(crate) fn set_clock(&mut self, now: DateTime<Utc>) {
        self.after.now = Some(now);
    }

    /// The next key to read, or `None` when every lookup is done or the
    /// hits are at their bound.
    pub(crate) fn next_key(&mut self) -> Option<String> {
        if self.hits >= belay_machine::cache::MAX_CACHE_HITS_PER_TRANSITION {
            return None;
        }
        let (_, key) = self.queue.get(self.next)?;
        self.next += 1;
        Some(key.clone())
    }

    /// Whether [`CacheServing::serve`] needs the tenant's grants first.
    pub(crate) fn needs_grants(&self) -> bool {
        self.grants.is_none()
    }

    /// The tenant's grants now, read in the transaction.
    pub(crate) fn set_grants(&mut self, grants: Vec<String>) {
        self.grants = Some(grants);
    }

    /// The live entry found for the key [`CacheServing::next_key`] gave last.
    pub(crate) fn serve(&mut self, row: ToolCacheRow) {
        use belay_machine::Command;
        let Some((call_id, _)) = self.next.checked_sub(1).and_then(|i| self.queue.get(i)) else {
            return;
        };
        let call_id = call_id.clone();
        let input = belay_machine::Input::ToolCacheHit {
            call_id: call_id.clone(),
            entry: row.entry(),
            tenant_grants: self.grants.clone().unwrap_or_default(),
        };
        let hit = match belay_machine::decide(&self.after, input) {
            Ok(hit) => hit,
            Err(e) => {
                tracing::debug!(call_id, error = %e, "cached result not used");
                return;
            }
        };
        self.decision.commands.retain(|c| {
            !matches!(c,
                Command::ScheduleTask { call_id: id, .. } | Command::LookupToolCache { call_id: id, .. }
                    if *id == call_id)
        });
        for event in &hit.events {
            self.after.apply(event);
        }
        self.hits += 1;
        self.queue.extend(cache_lookups(&hit.commands));
        self.decision.events.extend(hit.events);
        self.decision.commands.extend(hit.commands);
    }

    /// The decision to write.
    pub(crate) fn finish(self) -> Decision {
        self.decision
    }
}

/// A `tool_gates` row as both backends select it: `next_at_ms`,
/// `queue_at_ms`, `failures`, `circuit`, `retry_at_ms`, then the engine's
/// clock in ms.
pub(crate) type GateTuple = (i64, i64, i64, String, i64, i64);

/// A selected [`GateTuple`] as the row and the engine's clock (ms).
///
/// Errors: [`StoreError::Corrupt`] for a circuit state the schema refuses.
pub(crate) fn gate_row(
    (next_at_ms, queue_at_ms, failures, circuit, retry_at_ms, now_ms): GateTuple,
) -> Result<(GateRow, i64), StoreError> {
    let circuit = Circuit::parse(&circuit)
        .ok_or_else(|| StoreError::Corrupt(format!("tool_gates.circuit {circuit:?}")))?;
    let row = GateRow {
        next_at_ms,
        queue_at_ms,
        failures: u32::try_from(failures).unwrap_or(0),
        circuit,
        retry_at_ms,
    };
    Ok((row, now_ms))
}

/// Which database a [`Store`] was opened on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// PostgreSQL: any number of engine replicas share one database.
    Postgres,
    /// SQLite: one engine process per database file.
    Sqlite,
}

#[derive(Debug, Clone)]
enum Backend {
    Postgres(postgres::Pg),
    Sqlite(sqlite::Lite),
}

/// Handle to the store; cheap to clone. Open it with [`Store::connect`].
#[derive(Debug, Clone)]
pub struct Store {
    backend: Backend,
}

/// Call the same method on whichever backend the store was opened on.
macro_rules! on_backend {
    ($self:ident, $b:ident => $call:expr) => {
        match &$self.backend {
            Backend::Postgres($b) => $call,
            Backend::Sqlite($b) => $call,
        }
    };
}

impl Store {
    /// Open a store. `url` is either a PostgreSQL URL (`postgres://…` or
    /// `postgresql://…`; a pool of at most `max_connections`) or a SQLite URL:
    /// `sqlite://PATH` (the file is created when missing; a second engine
    /// process on the same file is refused) or `sqlite::memory:` (nothing is
    /// kept after the process exits).
    ///
    /// Errors: [`StoreError::Database`] when the database is unreachable,
    /// [`StoreError::Config`] for a URL of another scheme or a SQLite file
    /// another engine process holds.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Store, StoreError> {
        let backend = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Backend::Postgres(postgres::Pg::connect(url, max_connections).await?)
        } else if url.starts_with("sqlite:") {
            Backend::Sqlite(sqlite::Lite::connect(url, max_connections).await?)
        } else {
            return Err(StoreError::Config(format!(
                "database URL must start with `postgres://`, `postgresql://` or `sqlite:`, not {:?}",
                url.split(':').next().unwrap_or_default()
            )));
        };
        Ok(Store { backend })
    }

    /// Which database this store is on.
    pub fn backend_kind(&self) -> BackendKind {
        match &self.backend {
            Backend::Postgres(_) => BackendKind::Postgres,
            Backend::Sqlite(_) => BackendKind::Sqlite,
        }
    }

    /// Apply pending migrations (embedded at build time from
    /// `migrations/postgres/` or `migrations/sqlite/`).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        on_backend!(self, b => b.migrate().await)
    }

    /// One round trip to the database (health checks).
    pub async fn ping(&self) -> Result<(), StoreError> {
        on_backend!(self, b => b.ping().await)
    }

    /// Relay wake-ups (tasks became claimable, a run got events) to
    /// `on_wake` until the connection fails; the caller reconnects and
    /// should assume wake-ups were missed. PostgreSQL: `LISTEN/NOTIFY`, so
    /// every replica hears every commit. SQLite: an in-process channel fed
    /// after each commit.
    pub async fn listen(&self, on_wake: &mut (dyn FnMut(Wake) + Send)) -> Result<(), StoreError> {
        on_backend!(self, b => b.listen(on_wake).await)
    }

    // ---- tenants -------------------------------------------------------

    /// Replace a tenant's grants; returns them sorted and deduplicated.
    pub async fn set_tenant_grants(
        &self,
        tenant: &str,
        grants: &[String],
    ) -> Result<Vec<String>, StoreError> {
        on_backend!(self, b => b.set_tenant_grants(tenant, grants).await)
    }

    /// A tenant's grants (empty if never configured).
    pub async fn tenant_grants(&self, tenant: &str) -> Result<Vec<String>, StoreError> {
        on_backend!(self, b => b.tenant_grants(tenant).await)
    }

    // ---- definitions ---------------------------------------------------

    /// Names of every registered definition of a kind for a tenant.
    pub async fn definition_names(
        &self,
        tenant: &str,
        kind: &str,
    ) -> Result<Vec<String>, StoreError> {
        on_backend!(self, b => b.definition_names(tenant, kind).await)
    }

    /// Register definitions in one transaction: identical content (same hash)
    /// returns the existing version and makes it current again, new content
    /// gets the next version. Input: `(kind, name, content_hash, body,
    /// source_file)`. Output: rows and whether each was created.
    pub async fn register_definitions(
        &self,
        tenant: &str,
        defs: &[(String, String, String, Value, String)],
    ) -> Result<Vec<(DefinitionRow, bool)>, StoreError> {
        on_backend!(self, b => b.register_definitions(tenant, defs).await)
    }

    /// Definitions of a tenant, optionally of one kind, by kind, name, version.
    pub async fn list_definitions(
        &self,
        tenant: &str,
        kind: Option<&str>,
    ) -> Result<Vec<DefinitionRow>, StoreError> {
        on_backend!(self, b => b.list_definitions(tenant, kind).await)
    }

    /// The current version of a definition (the latest registered).
    pub async fn latest_definition(
        &self,
        tenant: &str,
        kind: &str,
        name: &str,
    ) -> Result<Option<DefinitionRow>, StoreError> {
        on_backend!(self, b => b.latest_definition(tenant, kind, name).await)
    }

    // ---- runs ------------------------------------------------------------

    /// The run with this idempotency key, if any.
    pub async fn run_by_idempotency_key(
        &self,
        tenant: &str,
        key: &str,
    ) -> Result<Option<RunRow>, StoreError> {
        on_backend!(self, b => b.run_by_idempotency_key(tenant, key).await)
    }

    /// Create a run and apply its first decision in one transaction. If the
    /// idempotency key already names a run, nothing is written and that run
    /// is returned with `false`.
    #[allow(clippy::too_many_arguments)]
    pub async fn create_run(
        &self,
        run_id: Uuid,
        tenant: &str,
        workflow: &str,
        workflow_version: i32,
        input: &Value,
        idempotency_key: &str,
        caller: &str,
        decision: &Decision,
    ) -> Result<(RunRow, bool), StoreError> {
        on_backend!(self, b => b
            .create_run(run_id, tenant, workflow, workflow_version, input, idempotency_key, caller, decision, None)
            .await)
    }

    /// [`Store::create_run`] for a child run of `parent` (started by its
    /// call `parent_call_id`): when the child ends, its parent is told
    /// through the outbox.
    #[allow(clippy::too_many_arguments)]
    pub async fn create_child_run(
        &self,
        run_id: Uuid,
        tenant: &str,
        workflow: &str,
        workflow_version: i32,
        input: &Value,
        idempotency_key: &str,
        caller: &str,
        decision: &Decision,
        parent: (Uuid, &str),
    ) -> Result<(RunRow, bool), StoreError> {
        on_backend!(self, b => b
            .create_run(run_id, tenant, workflow, workflow_version, input, idempotency_key, caller, decision, Some(parent))
            .await)
    }

    /// Claim up to `limit` due outbox rows for `lease_ms` (other replicas
    /// skip them until then; an unfinished row is claimed again after it).
    pub async fn claim_outbox(
        &self,
        limit: i64,
        lease_ms: i64,
    ) -> Result<Vec<OutboxRow>, StoreError> {
        on_backend!(self, b => b.claim_outbox(limit, lease_ms).await)
    }

    /// Mark an outbox row done (`error` `None`), or record why this attempt
    /// failed (it is claimed again when its lease ends).
    pub async fn finish_outbox(
        &self,
        outbox_id: Uuid,
        error: Option<&str>,
    ) -> Result<(), StoreError> {
        on_backend!(self, b => b.finish_outbox(outbox_id, error).await)
    }

    /// One run of a tenant.
    pub async fn get_run(&self, tenant: &str, run_id: Uuid) -> Result<Option<RunRow>, StoreError> {
        on_backend!(self, b => b.get_run(tenant, run_id).await)
    }

    /// How many runs `run_id` descends from through `parent_run_id` (0 for
    /// a run no other run started, or an unknown run), counting at most
    /// `limit + 1`: enough to tell whether a child of it would nest more
    /// than `limit` deep.
    pub async fn run_depth(&self, run_id: Uuid, limit: u32) -> Result<u32, StoreError> {
        on_backend!(self, b => b.run_depth(run_id, limit).await)
    }

    /// Runs of a tenant, newest first, keyset-paged by `(created_at, run_id)`.
    pub async fn list_runs(
        &self,
        tenant: &str,
        status: Option<&str>,
        after: Option<(DateTime<Utc>, Uuid)>,
        limit: i64,
    ) -> Result<Vec<RunRow>, StoreError> {
        on_backend!(self, b => b.list_runs(tenant, status, after, limit).await)
    }

    /// Events of a run with `seq > after_seq`, at most `limit`, in seq order.
    pub async fn list_events(
        &self,
        run_id: Uuid,
        after_seq: i64,
        limit: i64,
    ) -> Result<Vec<EventRow>, StoreError> {
        on_backend!(self, b => b.list_events(run_id, after_seq, limit).await)
    }

    /// One transition: lock the run (and the task, if named), fold the
    /// history, let `decide` choose, then append its events and perform its
    /// commands, all in one transaction. `decide` refusing writes nothing.
    pub async fn transition<E, F>(
        &self,
        run_id: Uuid,
        task_id: Option<Uuid>,
        decide: F,
    ) -> Result<Applied, TransitionError<E>>
    where
        F: FnOnce(&RunState, Option<&TaskRow>) -> Result<Decision, E>,
    {
        let target = Target::Run(run_id, task_id);
        let decide = decide_once(decide);
        on_backend!(self, b => b.transition_at(target, decide).await)
    }

    /// [`Store::transition`] for the run a task belongs to, found and locked
    /// in the same statement (one round trip less on every worker report).
    pub async fn transition_task<E, F>(
        &self,
        task_id: Uuid,
        decide: F,
    ) -> Result<Applied, TransitionError<E>>
    where
        F: FnOnce(&RunState, Option<&TaskRow>) -> Result<Decision, E>,
    {
        let target = Target::Task(task_id);
        let decide = decide_once(decide);
        on_backend!(self, b => b.transition_at(target, decide).await)
    }

    /// [`Store::transition_task`] for a dispatch, which may pass a tool's
    /// gates ([`belay_machine::gates`]). `decide` is called with `None` first; when
    /// its decision asks for the tool's gates
    /// ([`Command::PassToolGates`](belay_machine::Command::PassToolGates)),
    /// the store reads and updates the tool's row in the same transaction,
    /// and if the gates hold the call back, calls `decide` again with their
    /// verdict and writes that second decision instead of the first. A
    /// tool without gates costs no statement.
    pub async fn transition_task_gated<E, F>(
        &self,
        task_id: Uuid,
        mut decide: F,
    ) -> Result<Applied, TransitionError<E>>
    where
        F: FnMut(&RunState, Option<&TaskRow>, Option<&GateVerdict>) -> Result<Decision, E>,
    {
        let target = Target::Dispatch(task_id);
        let decide =
            move |state: &RunState, task: Option<&TaskRow>, verdict: Option<&GateVerdict>| {
                decide(state, task, verdict).map_err(TransitionError::Refused)
            };
        on_backend!(self, b => b.transition_at(target, decide).await)
    }

    /// The rows of a run's secret vault, by key, without their values
    /// (for tests and operators); empty once the run has ended.
    pub async fn run_secrets(&self, run_id: Uuid) -> Result<Vec<RunSecretRow>, StoreError> {
        on_backend!(self, b => b.run_secrets(run_id).await)
    }

    /// The gate row of a tenant's tool ([`belay_machine::gates`]), as stored; `None`
    /// when no call of it was ever gated or failed (the same as
    /// [`GateRow::default`]). For tests and operators.
    pub async fn tool_gate(&self, tenant: &str, tool: &str) -> Result<Option<GateRow>, StoreError> {
        on_backend!(self, b => b.tool_gate(tenant, tool).await)
    }

    /// Every entry of a tenant's tool result cache, expired or not (they
    /// are served only until `expires_at`), newest first. For operators and
    /// tests.
    pub async fn tool_cache_entries(&self, tenant: &str) -> Result<Vec<ToolCacheRow>, StoreError> {
        on_backend!(self, b => b.tool_cache_entries(tenant).await)
    }

    /// Delete up to `limit` expired entries of the tool result cache (every
    /// tenant; by the engine's clock), oldest first; returns how many. The
    /// coordinator's sweeper calls it, so the cache holds little more than
    /// the entries still served.
    pub async fn purge_expired_tool_cache(&self, limit: i64) -> Result<u64, StoreError> {
        on_backend!(self, b => b.purge_expired_tool_cache(limit).await)
    }

    /// Delete the heartbeat extensions of leases that are over (the task
    /// ended, or was claimed again with a new attempt); returns how many.
    /// PostgreSQL keeps heartbeats in `task_heartbeats`, off `tasks`;
    /// SQLite extends `tasks.lease_expires_at` and has nothing to purge.
    /// The coordinator's sweeper calls it once a minute.
    pub async fn purge_stale_heartbeats(&self) -> Result<u64, StoreError> {
        match &self.backend {
            Backend::Postgres(b) => b.purge_stale_heartbeats().await,
            Backend::Sqlite(_) => Ok(0),
        }
    }

    /// The folded state of a run from its whole history (for reads and tests).
    pub async fn run_state(&self, run_id: Uuid) -> Result<RunState, StoreError> {
        on_backend!(self, b => b.run_state(run_id).await)
    }

    // ---- tasks -----------------------------------------------------------

    /// Claim up to `max` ready tasks of running runs (and probe tasks of
    /// paused ones) for `worker_id`, with a lease of `lease_ms` by the
    /// database clock. Each claim increments the task's attempt (the fencing
    /// token). Concurrent claims never hand out the same task.
    pub async fn claim_tasks(
        &self,
        worker_id: &str,
        max: i64,
        lease_ms: i64,
    ) -> Result<Vec<ClaimedTask>, StoreError> {
        on_backend!(self, b => b.claim_tasks(worker_id, max, lease_ms).await)
    }

    /// A count that grows whenever tasks may have become claimable in this
    /// process's view (a commit here that scheduled or re-queued a task, a
    /// wake-up from another process, a reconnect of the wake-up listener,
    /// [`Store::advance_clock`], [`Store::expire_task_timers`]). Read it
    /// before a claim: if a claim found nothing claimable and the count has
    /// not moved since, another look would find nothing either, except for
    /// changes no wake-up announces (another process moving the clock, a
    /// lost notification), which claimers pick up on their periodic look.
    pub fn tasks_wake_seq(&self) -> u64 {
        on_backend!(self, b => b.tasks_wake_seq())
    }

    /// [`Store::claim_tasks`], and when fewer than `max` were claimed, also
    /// [`Store::next_ready_in_ms`] of the tasks left (PostgreSQL: in the same
    /// statement, one round trip). Returns the tasks and, then, the ms until
    /// the earliest other ready task is claimable (`None`: no other ready
    /// task, or `max` were claimed).
    pub async fn claim_tasks_or_next(
        &self,
        worker_id: &str,
        max: i64,
        lease_ms: i64,
    ) -> Result<(Vec<ClaimedTask>, Option<i64>), StoreError> {
        on_backend!(self, b => b.claim_tasks_or_next(worker_id, max, lease_ms).await)
    }

    /// Extend the leases a worker still holds (not yet expired, same
    /// attempt) to at least `lease_ms` from now (a heartbeat never
    /// shortens a lease). Returns the `(task_id, attempt)` pairs extended.
    /// PostgreSQL writes the extension to `task_heartbeats`, not to the
    /// task's row (liveness off the hot table); SQLite to the row.
    pub async fn heartbeat(
        &self,
        worker_id: &str,
        leases: &[(Uuid, i32)],
        lease_ms: i64,
    ) -> Result<Vec<(Uuid, i32)>, StoreError> {
        on_backend!(self, b => b.heartbeat(worker_id, leases, lease_ms).await)
    }

    /// Leases that have expired by the database clock, oldest first.
    pub async fn expired_leases(&self, limit: i64) -> Result<Vec<ExpiredLease>, StoreError> {
        on_backend!(self, b => b.expired_leases(limit).await)
    }

    /// Earliest time a `ready` task becomes claimable, in ms from now (0 if
    /// one is claimable now), or `None` when no task is ready.
    pub async fn next_ready_in_ms(&self) -> Result<Option<i64>, StoreError> {
        on_backend!(self, b => b.next_ready_in_ms().await)
    }

    /// Make task timers due now, as if their time had passed: the leases of
    /// `leased` tasks expire (the sweeper then judges them like any expired
    /// lease) and `ready` tasks waiting out a retry delay become claimable.
    /// All tasks, or only `task_id`. Returns the number of tasks changed.
    /// For tests (deterministic lease expiry without sleeping) and for
    /// operators who know a worker is gone for good.
    pub async fn expire_task_timers(&self, task_id: Option<Uuid>) -> Result<u64, StoreError> {
        on_backend!(self, b => b.expire_task_timers(task_id).await)
    }

    /// Timers that are due by the engine's clock, oldest first:
    /// `(run_id, timer_id, overdue_ms)`, where `overdue_ms` is how long ago
    /// it was due (ms, ≥ 0). Firing one is a run transition
    /// ([`belay_machine::Input::TimerFired`]) that deletes it.
    pub async fn due_timers(&self, limit: i64) -> Result<Vec<(Uuid, String, i64)>, StoreError> {
        on_backend!(self, b => b.due_timers(limit).await)
    }

    /// The run a callback token (hex SHA-256) was issued in, if any
    /// ([`belay_machine::Command::RegisterCallback`]).
    pub async fn callback_run(&self, token_sha256: &str) -> Result<Option<Uuid>, StoreError> {
        on_backend!(self, b => b.callback_run(token_sha256).await)
    }

    /// Move the engine's clock forward by `ms` (negative: back) for every
    /// engine on this database: leases, retry delays and timers are all
    /// judged by it. For tests (a 7-day wait in milliseconds); production
    /// leaves it alone.
    pub async fn advance_clock(&self, ms: i64) -> Result<(), StoreError> {
        on_backend!(self, b => b.advance_clock(ms).await)
    }

    /// The engine's clock: the database's time plus the offset of
    /// [`Store::advance_clock`].
    pub async fn clock_now(&self) -> Result<DateTime<Utc>, StoreError> {
        on_backend!(self, b => b.clock_now().await)
    }

    /// Close every connection; later calls fail with
    /// [`StoreError::Database`]. For shutdown (and tests of an outage).
    /// SQLite: the file's engine lock goes with the connections, so another
    /// store may open it afterwards.
    pub async fn close(&self) {
        on_backend!(self, b => b.close().await)
    }

    /// Cancel a leased task whose run can no longer use it (the run finished).
    pub async fn end_orphan_task(&self, task_id: Uuid, attempt: i32) -> Result<(), StoreError> {
        on_backend!(self, b => b.end_orphan_task(task_id, attempt).await)
    }

    // ---- uncertain outcomes --------------------------------------------

    /// Uncertain-outcome records of a run, oldest first.
    pub async fn uncertain_for_run(&self, run_id: Uuid) -> Result<Vec<UncertainRow>, StoreError> {
        on_backend!(self, b => b.uncertain_for_run(run_id).await)
    }

    /// One uncertain-outcome record of a tenant.
    pub async fn get_uncertain(
        &self,
        tenant: &str,
        id: Uuid,
    ) -> Result<Option<UncertainRow>, StoreError> {
        on_backend!(self, b => b.get_uncertain(tenant, id).await)
    }

    /// Uncertain-outcome records of a tenant, newest first, filtered and
    /// keyset-paged by `(created_at, uncertain_id)`. Ages are judged by the
    /// database clock, in ms.
    pub async fn list_uncertain(
        &self,
        f: &UncertainQuery<'_>,
    ) -> Result<Vec<UncertainRow>, StoreError> {
        on_backend!(self, b => b.list_uncertain(f).await)
    }

    // ---- audit of tool calls ------------------------------------------

    /// The tool calls a tenant's runs proposed (scheduled or refused), newest
    /// first, keyset-paged by `(proposed_at, run_id, seq)` and filtered;
    /// each derived from the run's events alone (see [`ToolCallRecord`]).
    ///
    /// Errors: [`StoreError::Corrupt`] for an event that does not decode.
    pub async fn list_tool_calls(
        &self,
        q: &ToolCallQuery<'_>,
    ) -> Result<Vec<ToolCallRecord>, StoreError> {
        let rows = on_backend!(self, b => b.list_tool_calls(q).await)?;
        rows.into_iter()
            .map(tool_calls::ToolCallEvents::into_record)
            .collect()
    }

    // ---- notifications (outbox) ----------------------------------------

    /// Claim up to `limit` due notifications (oldest due first): each
    /// claimed row's `attempts` is incremented and its `next_attempt_at`
    /// pushed `lease_ms` into the future, so other replicas skip it.
    pub async fn claim_due_notifications(
        &self,
        limit: i64,
        lease_ms: i64,
    ) -> Result<Vec<NotificationRow>, StoreError> {
        on_backend!(self, b => b.claim_due_notifications(limit, lease_ms).await)
    }

    /// Mark a notification delivered. Returns whether the row changed
    /// (false: already delivered).
    pub async fn mark_notification_delivered(&self, id: Uuid) -> Result<bool, StoreError> {
        on_backend!(self, b => b.mark_notification_delivered(id).await)
    }

    /// Record a failed delivery attempt: schedule the next one `retry_in_ms`
    /// from now, or abandon delivery when `retry_in_ms` is `None`. Fenced by
    /// `attempt`: returns false (and changes nothing) when the row was
    /// claimed again meanwhile or is already delivered or abandoned.
    pub async fn record_notification_failure(
        &self,
        id: Uuid,
        attempt: i32,
        error: &str,
        retry_in_ms: Option<i64>,
    ) -> Result<bool, StoreError> {
        on_backend!(self, b => b.record_notification_failure(id, attempt, error, retry_in_ms).await)
    }

    /// Delivery state of a run's notifications, oldest first.
    pub async fn notifications_for_run(
        &self,
        run_id: Uuid,
    ) -> Result<Vec<NotificationStatus>, StoreError> {
        on_backend!(self, b => b.notifications_for_run(run_id).await)
    }

    // ---- MCP tools (definitions reported by workers, pins) -------------

    /// Record one report of an MCP server's tools: each (tool, hash) not
    /// seen before is inserted, the others have `last_seen_at`,
    /// `reported_by` and `protocol_version` refreshed. Returns how many
    /// were new.
    pub async fn record_mcp_tools(
        &self,
        server: &str,
        protocol_version: &str,
        reported_by: &str,
        listings: &[McpToolListingIn],
    ) -> Result<u64, StoreError> {
        on_backend!(self, b => b.record_mcp_tools(server, protocol_version, reported_by, listings).await)
    }

    /// Reported MCP tool definitions, every hash, optionally of one server
    /// (and one tool); ordered by server, tool, newest report first.
    pub async fn mcp_tool_definitions(
        &self,
        server: Option<&str>,
        tool: Option<&str>,
    ) -> Result<Vec<McpToolDefinitionRow>, StoreError> {
        on_backend!(self, b => b.mcp_tool_definitions(server, tool).await)
    }

    /// A tenant's pinned MCP tool definitions, optionally of one server
    /// (and one tool), ordered by server and tool.
    pub async fn mcp_tool_pins(
        &self,
        tenant: &str,
        server: Option<&str>,
        tool: Option<&str>,
    ) -> Result<Vec<McpToolPinRow>, StoreError> {
        on_backend!(self, b => b.mcp_tool_pins(tenant, server, tool).await)
    }

    /// Pin `definition_hash` for the tenant's (server, tool) unless a pin
    /// exists (trust on first use); returns the pin in force either way.
    pub async fn pin_mcp_tool_first_use(
        &self,
        tenant: &str,
        server: &str,
        tool: &str,
        definition_hash: &str,
        accepted_by: &str,
    ) -> Result<McpToolPinRow, StoreError> {
        on_backend!(self, b => b.pin_mcp_tool_first_use(tenant, server, tool, definition_hash, accepted_by).await)
    }

    /// Pin `definition_hash` for the tenant's (server, tool), replacing the
    /// pin in force (kept as `previous_hash`); returns the new pin. The hash
    /// already pinned leaves the row as it is (time, author, history) and
    /// returns it.
    pub async fn accept_mcp_tool(
        &self,
        tenant: &str,
        server: &str,
        tool: &str,
        definition_hash: &str,
        accepted_by: &str,
        reason: &str,
    ) -> Result<McpToolPinRow, StoreError> {
        on_backend!(self, b => b.accept_mcp_tool(tenant, server, tool, definition_hash, accepted_by, reason).await)
    }

    /// The tenant, state and spec of a task, for pinning its MCP tool at
    /// dispatch; `None` when there is no such task.
    pub async fn mcp_pin_task(&self, task_id: Uuid) -> Result<Option<McpPinTask>, StoreError> {
        on_backend!(self, b => b.mcp_pin_task(task_id).await)
    }
}
