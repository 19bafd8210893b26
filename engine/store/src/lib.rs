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
//!
//! Layout: [`Store`] and its façade methods are here; `rows.rs` holds
//! [`StoreError`] and the rows the store hands out or takes;
//! `transition.rs` the machinery both backends share around a transition;
//! `postgres/` and `sqlite/` the statements, one file per concern with the
//! same names in both, so that a method's two versions sit at the same
//! relative path (`postgres/tasks.rs` beside `sqlite/tasks.rs`);
//! `tool_calls.rs` the audit of tool calls; `principals.rs` the rows of
//! callers' credentials; `console_sessions.rs` those of console
//! sign-ins; `run_search.rs` the query of the operator
//! console's run list ([`RunSearch`]: filters, keyset page, counts by
//! status; `run_search.rs` in each backend).
//!
//! # In detail (moved from ARCHITECTURE.md)
//!
//! every SQL statement. `lib.rs` is the one interface (`Store`),
//! `rows.rs` the row types (with those of the MCP pinning tables;
//! `tool_calls.rs`: the audit's `ToolCallRecord`, read from a proposal event
//! and the events of its call as the fold reads them, and the page of
//! proposals both backends select); it dispatches each call to the backend it was opened
//! on: `postgres/` or `sqlite/` (each with the webhook notifications' SQL in its `notifications.rs`). Both write the `outbox` of cross-run work (child runs) in the transition that asks for it.
//! Both backends have methods of the same names and signatures, so `Store`
//! does not compile when they drift. `Store::transition` locks the run row
//! (then the task row), folds the events, calls the decision function,
//! appends events with gapless `seq`, applies commands and updates the run
//! row, all in one transaction, and wakes claimers and watchers once it has
//! committed. On PostgreSQL the lock statement also reads the engine's clock
//! (`belay_now()`, once), and a decision whose commands are only the hot
//! path's task writes (schedule, retry, mark dispatched, end; each on a
//! different call) is written in one statement with its events and run row
//! (`TaskWrites` in `postgres/write_decision.rs`: data-modifying CTEs over arrays, the
//! one update only of the transition's own locked task, by a scalar primary
//! key (`OwnWrite`), so no generic plan can read the run's whole index range
//! or, prepared while `tasks` was small, scan the whole table; an update of
//! another task takes the per-command path), so a step's transition is
//! BEGIN, lock, write, COMMIT; any other decision is written a command at a
//! time. `events` and `tasks` have no foreign key to `runs` (migration
//! `20261205000080`: a checking query per inserted row); every write to them
//! holds the run row's lock and no run is deleted. Heartbeats stay off
//! `tasks`: a claim sets `tasks.lease_expires_at`, a heartbeat upserts the
//! narrow `task_heartbeats` row of that attempt (migration `20261206000090`,
//! no secondary index, so HOT updates), and a lease holds while either is in
//! the future (`lease_holds!`: the lock statement, the sweeper's
//! `expired_leases`, the heartbeat itself; a heartbeat never shortens a
//! lease, on SQLite either); the sweeper deletes extensions of ended or
//! re-claimed attempts once a minute (`purge_stale_heartbeats`). Pooled connections are
//! pinged on hand-out only after 1 s idle (sqlx pings every hand-out by
//! default; it still pings every connection given back). PostgreSQL: row locks, `SKIP LOCKED` claims (in `tasks_ready`
//! order, each candidate's run looked up by a scalar sub-select,
//! `run_admits_task!`, never a join a generic plan could make a scan of
//! `runs`), any number of
//! engines; wake-ups (`postgres/wakes.rs`) go to the engine's own listener at once
//! and to other replicas by `pg_notify`, batched (the sender waits 2 ms,
//! `COALESCE`, for more to join), from a background sender
//! and never inside a transition (a `NOTIFY` in a transaction serialises
//! the commits of all notifying transactions: 8x fewer commits/s, measured;
//! its module doc), each waiter polling every second for a lost one. A
//! listening engine sends them only while it has heard another listener
//! in the last 30 s: listeners say `hello` when `LISTEN` starts and every
//! 10 s and answer another's with `here` (a lone engine sends no
//! notification at all). A decision wakes claimers when it schedules or
//! re-queues a task or resumes its run (`store::wakes_tasks`).
//! SQLite: one writer connection with `BEGIN IMMEDIATE` (the whole database
//! is the lock), WAL with `synchronous=FULL`, an in-process broadcast for
//! wake-ups, and an exclusive `flock` on the database file, so one engine process per
//! file. Each engine keeps the
//! folded state of recently changed runs in memory (bounded) and folds only
//! the events appended since, read under the run lock, so a step does not
//! replay the whole history; events are immutable and `seq` gapless, so a
//! cached prefix plus the tail is the fold. **Invariant:** the only module
//! that speaks SQL; lease expiry is judged by the database's clock
//! (PostgreSQL `now()`, SQLite `'now'`); only a committed state is cached;
//! every store test in `engine/tests/` runs on both backends; every event
//! row carries its run's `tenant` (written with it, never changed), so a
//! tenant's tool-call proposals are one partial index (`events_tool_calls`)
//! instead of a join through `runs`. The lock statement of a transition also
//! reads the engine's clock, handed to the machine as `RunState.now`. A
//! decision that asks for cache lookups (`Command::LookupToolCache`) is
//! served in its transaction (`serve_from_cache` in each backend, its
//! rules in `CacheServing` in `transition.rs`): each key is read from `tool_cache`
//! (live by the engine's clock), and a hit leaves out the call's task and
//! appends the machine's decision of `Input::ToolCacheHit`, whose own
//! lookups are served too, at most `MAX_CACHE_HITS_PER_TRANSITION` (16)
//! hits; a decision without lookups costs no statement. `Command::StoreToolCache`
//! upserts the entry; `purge_expired_tool_cache` deletes expired ones. `Store::transition_task_gated` (dispatch)
//! passes a tool's gates when the decision asks for them: it reads the
//! tool's `tool_gates` row (PostgreSQL: `FOR UPDATE` for a rate-limited tool;
//! a tool with only a breaker reads without a lock and locks only when the
//! circuit is not closed), applies `gates::admit`, writes the row back, and
//! decides again with the verdict if the call is held back; all in the
//! dispatch's transaction. `Command::RecordToolOutcome` moves the circuit in
//! the transaction of the result (a success is one `UPDATE` that touches the
//! row only when there is something to clear). A tool without gates costs
//! no statement.
//! The run secret vault is the table `run_secrets` (run, key, producer call,
//! nonce, ciphertext, `expires_at` by the engine's clock, `single_use`,
//! `consumers`, `consumed_by_call`): `Command::VaultSecrets` upserts (a key
//! written again is unconsumed), `Command::RestoreSecrets` is one `UPDATE …
//! RETURNING` that reads the keys the tool may read (its `consumers`, not
//! expired, not consumed by another call) and consumes the single-use ones
//! for the call, and hands the rows back in `Applied::secrets`;
//! `Command::DropRunSecrets` deletes the run's rows. `Store::run_secrets`
//! lists a run's rows without values (tests, operators).

mod console_sessions;
mod db_errors;
mod fleet;
pub mod fleet_level;
mod gauges;
mod hand_off;
mod pools;
mod postgres;
mod principals;
mod rows;
mod run_search;
pub mod schema;
mod sqlite;
mod tool_calls;
mod transition;

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

pub use console_sessions::{ConsoleSessionRow, NewConsoleSession};
pub use db_errors::{DB_ERROR_CLASSES, db_error_counts};
pub use fleet::{FLEET_GRACE_MIN_MS, FleetReset, fleet_grace_ms};
pub use fleet_level::FleetRefresh;
pub use gauges::{GaugeCounts, POOL_TAG_PREFIX, PoolConnections, pool_of};
pub use hand_off::HandOff;
pub use pools::{ClaimFilter, LiveWorker, UnclaimableTask};
pub use postgres::wakes::{EVENTS_CHANNEL, TASKS_CHANNEL};
pub use principals::{NewPrincipal, PrincipalRow};
pub use rows::{
    ClaimedTask, DefinitionRow, EventRow, ExpiredLease, McpPinTask, McpToolDefinitionRow,
    McpToolListingIn, McpToolPinRow, NotificationRow, NotificationStatus, OutboxRow, RunRow,
    RunSecretRow, StoreError, TaskRow, ToolCacheRow, UncertainQuery, UncertainRow,
};
pub use run_search::RunSearch;
pub use tool_calls::{
    ToolCallConfirmation, ToolCallDecision, ToolCallOutcome, ToolCallQuery, ToolCallRecord,
    ToolCallRefusal,
};
pub use transition::{Applied, EndedNode, STATE_CACHE_RUNS, TransitionError, Wake};

use belay_machine::gates::{GateRow, GateVerdict};
use belay_machine::{Decision, RunState};
use transition::{Target, decide_once};

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
    observer: Option<CommitObserver>,
}

/// What [`Store::on_commit`] calls with every committed transition: it
/// runs on the committing task, after the commit, so it must not block
/// (hand the work to a channel).
#[derive(Clone)]
pub struct CommitObserver(std::sync::Arc<dyn Fn(&Applied) + Send + Sync>);

impl std::fmt::Debug for CommitObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CommitObserver")
    }
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
        Ok(Store {
            backend,
            observer: None,
        })
    }

    /// This store, calling `observe` after every committed transition
    /// ([`Store::transition`] and its task forms) with what it applied
    /// (the engine's node spans, `belay_engine::telemetry`). Clones made
    /// afterwards share it; earlier ones do not.
    pub fn on_commit(mut self, observe: impl Fn(&Applied) + Send + Sync + 'static) -> Store {
        self.observer = Some(CommitObserver(std::sync::Arc::new(observe)));
        self
    }

    /// Hand a committed transition to the observer, if any.
    fn observed<E>(
        &self,
        applied: Result<Applied, TransitionError<E>>,
    ) -> Result<Applied, TransitionError<E>> {
        if let (Ok(applied), Some(observer)) = (&applied, &self.observer) {
            (observer.0)(applied);
        }
        applied
    }

    /// The figures of the engine's database gauges: ready tasks by kind,
    /// open uncertain outcomes by tenant, paused and waiting runs by
    /// reason ([`GaugeCounts`]), in one statement. The same on every
    /// engine of a database. Errors: [`StoreError::Database`].
    pub async fn gauge_counts(&self) -> Result<GaugeCounts, StoreError> {
        on_backend!(self, b => b.gauge_counts().await)
    }

    /// Connections of this process's pool(s), idle and in use; no statement.
    pub fn pool_connections(&self) -> PoolConnections {
        on_backend!(self, b => b.pool_connections())
    }

    /// Which database this store is on.
    pub fn backend_kind(&self) -> BackendKind {
        match &self.backend {
            Backend::Postgres(_) => BackendKind::Postgres,
            Backend::Sqlite(_) => BackendKind::Sqlite,
        }
    }

    /// Apply pending migrations (embedded at build time from
    /// `migrations/postgres/` or `migrations/sqlite/`), then join the
    /// fleet at this build's behaviour level ([`Store::join_fleet`]).
    ///
    /// Errors: [`StoreError::Config`] when the database was migrated past
    /// what this engine can run beside (`schema`) or its fleet was raised
    /// past this engine's behaviour level (`fleet_level`).
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

    // ---- principals (callers' credentials) ----------------------------

    /// Insert a principal with its credential; `created_at` is now and
    /// `expires_at` `p.expires_in_ms` from now, by the engine's clock.
    /// Returns the row as stored.
    ///
    /// Errors: [`StoreError::Conflict`] when a principal with this `key_id`
    /// or `cert_subject` exists (the message names which);
    /// [`StoreError::Database`] when the database refuses the row (neither
    /// or both of `secret_sha256` and `cert_subject`, an unknown role, an
    /// empty `tenants` list: CHECK constraints), or fails. Nothing is
    /// written on an error.
    pub async fn create_principal(&self, p: &NewPrincipal) -> Result<PrincipalRow, StoreError> {
        on_backend!(self, b => b.create_principal(p).await)
    }

    /// The principal whose credential has this public id, revoked and
    /// expired ones included (the caller judges `revoked_at` and
    /// `expired`). One indexed statement (every request authenticates
    /// with it); SQLite reads on the read pool.
    pub async fn principal_by_key_id(
        &self,
        key_id: &str,
    ) -> Result<Option<PrincipalRow>, StoreError> {
        on_backend!(self, b => b.principal_by_key_id(key_id).await)
    }

    /// The principal a client-certificate subject (`CN=worker-a`)
    /// authenticates as, revoked and expired ones included. One indexed
    /// statement.
    pub async fn principal_by_cert_subject(
        &self,
        subject: &str,
    ) -> Result<Option<PrincipalRow>, StoreError> {
        on_backend!(self, b => b.principal_by_cert_subject(subject).await)
    }

    /// Every principal (`tenant` `None`), or those whose `tenants` list
    /// names `tenant` (not those of every tenant, `tenants` NULL); revoked
    /// and expired ones included. Ordered by `created_at`, then `key_id`.
    pub async fn list_principals(
        &self,
        tenant: Option<&str>,
    ) -> Result<Vec<PrincipalRow>, StoreError> {
        on_backend!(self, b => b.list_principals(tenant).await)
    }

    /// Revoke a credential: `revoked_at` becomes now by the engine's clock
    /// unless it is set already (a second revoke keeps the first time).
    /// Returns the row afterwards; `None` when no principal has this
    /// `key_id`.
    pub async fn revoke_principal(&self, key_id: &str) -> Result<Option<PrincipalRow>, StoreError> {
        on_backend!(self, b => b.revoke_principal(key_id).await)
    }

    // ---- console sessions ----------------------------------------------

    /// Begin a console session: insert `s` (`created_at` now, `expires_at`
    /// `s.ttl_ms` from now, by the engine's clock), deleting every session
    /// that has expired in the same transaction.
    ///
    /// Errors: [`StoreError::Database`] when the row cannot be written (a
    /// session with this `id_sha256` exists: a 256-bit random token was
    /// drawn twice) or the database fails. Nothing is written on an error.
    pub async fn create_console_session(&self, s: &NewConsoleSession) -> Result<(), StoreError> {
        on_backend!(self, b => b.create_console_session(s).await)
    }

    /// The session whose token has this SHA-256, if it has not expired by
    /// the engine's clock and was not ended. One indexed statement (every
    /// console request asks it); SQLite reads on the read pool.
    pub async fn console_session(
        &self,
        id_sha256: &str,
    ) -> Result<Option<ConsoleSessionRow>, StoreError> {
        on_backend!(self, b => b.console_session(id_sha256).await)
    }

    /// End a session (sign-out): delete it. Returns whether it existed.
    pub async fn end_console_session(&self, id_sha256: &str) -> Result<bool, StoreError> {
        on_backend!(self, b => b.end_console_session(id_sha256).await)
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

    /// A page of a tenant's runs matching `q` (the operator console's run
    /// list), newest first, keyset-paged by `(created_at, run_id)`.
    pub async fn search_runs(&self, q: &RunSearch<'_>) -> Result<Vec<RunRow>, StoreError> {
        on_backend!(self, b => b.search_runs(q).await)
    }

    /// How many of a tenant's runs match `q`, its status and page aside,
    /// by status (`(status, count)` in status order; absent statuses have
    /// no entry).
    pub async fn count_runs_by_status(
        &self,
        q: &RunSearch<'_>,
    ) -> Result<Vec<(String, i64)>, StoreError> {
        on_backend!(self, b => b.count_runs_by_status(q).await)
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
        let applied = on_backend!(self, b => b.transition_at(target, None, decide).await);
        self.observed(applied)
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
        self.transition_task_handing(task_id, None, decide).await
    }

    /// [`Store::transition_task`] for a worker's report that asks for the
    /// next task with it: when the decision schedules one `hand` may take,
    /// it is written leased to `hand`'s worker (and a tool call dispatched)
    /// in the same transaction, and returned in [`Applied::handed`]
    /// ([`HandOff`]; module `hand_off`).
    pub async fn transition_task_handing<E, F>(
        &self,
        task_id: Uuid,
        hand: Option<&HandOff<'_>>,
        decide: F,
    ) -> Result<Applied, TransitionError<E>>
    where
        F: FnOnce(&RunState, Option<&TaskRow>) -> Result<Decision, E>,
    {
        let target = Target::Task(task_id);
        let decide = decide_once(decide);
        let applied = on_backend!(self, b => b.transition_at(target, hand, decide).await);
        self.observed(applied)
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
        let applied = on_backend!(self, b => b.transition_at(target, None, decide).await);
        self.observed(applied)
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
    /// token). Concurrent claims never hand out the same task. `tenants`:
    /// `None` claims tasks of any tenant, `Some(list)` only tasks whose
    /// tenant is in `list` (an empty list claims nothing).
    pub async fn claim_tasks(
        &self,
        worker_id: &str,
        max: i64,
        lease_ms: i64,
        tenants: Option<&[String]>,
    ) -> Result<Vec<ClaimedTask>, StoreError> {
        let filter = ClaimFilter {
            tenants,
            capabilities: None,
        };
        on_backend!(self, b => b.claim_tasks(worker_id, max, lease_ms, filter).await)
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
    /// task, or `max` were claimed). `tenants` limits both the claim and
    /// the tasks that estimate looks at, as in [`Store::claim_tasks`].
    pub async fn claim_tasks_or_next(
        &self,
        worker_id: &str,
        max: i64,
        lease_ms: i64,
        tenants: Option<&[String]>,
    ) -> Result<(Vec<ClaimedTask>, Option<i64>), StoreError> {
        let filter = ClaimFilter {
            tenants,
            capabilities: None,
        };
        self.claim_matching_or_next(worker_id, max, lease_ms, filter)
            .await
    }

    /// [`Store::claim_tasks_or_next`] of the tasks `filter` admits: of its
    /// tenants, and (with capabilities) only tasks whose every requirement
    /// (`tasks.requires`, the tags of `belay_proto::pools`) is among them;
    /// the estimate of the next ready task looks at the same tasks.
    pub async fn claim_matching_or_next(
        &self,
        worker_id: &str,
        max: i64,
        lease_ms: i64,
        filter: ClaimFilter<'_>,
    ) -> Result<(Vec<ClaimedTask>, Option<i64>), StoreError> {
        on_backend!(self, b => b.claim_tasks_or_next(worker_id, max, lease_ms, filter).await)
    }

    /// Note that `worker_id` claimed now (by the engine's clock), with
    /// these capability tags (`None`: it named none, so it takes any task)
    /// and for these tenants (`None`: every tenant): one upsert of its
    /// `workers` row. The coordinator calls it at most every half lease per
    /// worker.
    pub async fn record_worker(
        &self,
        worker_id: &str,
        capabilities: Option<&[String]>,
        tenants: Option<&[String]>,
    ) -> Result<(), StoreError> {
        on_backend!(self, b => b.record_worker(worker_id, capabilities, tenants).await)
    }

    /// The workers whose last claim is less than `live_ms` old by the
    /// engine's clock, by worker id.
    pub async fn live_workers(&self, live_ms: i64) -> Result<Vec<LiveWorker>, StoreError> {
        on_backend!(self, b => b.live_workers(live_ms).await)
    }

    /// The ready tasks (of run `run_id`, or of every run) that no worker
    /// live within `live_ms` can take: none that serves the task's tenant
    /// has every one of its requirements (a worker that named no
    /// capabilities has them all). Tasks of runs that admit no claim now
    /// (paused, ended) are left out; tasks waiting out a retry delay are
    /// in. In claim order, at most `limit`; each with what is missing and
    /// why. One statement over the ready tasks and the live workers (a
    /// scan of the ready tasks when `run_id` is `None`: for a gauge read
    /// every few seconds, not for a hot path).
    pub async fn unclaimable_tasks(
        &self,
        run_id: Option<Uuid>,
        live_ms: i64,
        limit: i64,
    ) -> Result<Vec<UnclaimableTask>, StoreError> {
        let ready = on_backend!(self, b => b.unclaimable_ready(run_id, live_ms, limit).await)?;
        if ready.is_empty() {
            return Ok(Vec::new());
        }
        let live = self.live_workers(live_ms).await?;
        Ok(ready.into_iter().map(|t| t.unclaimable(&live)).collect())
    }

    /// Extend the leases a worker still holds (not yet expired, same
    /// attempt; during the fleet's grace after an outage also one that
    /// expired but was not judged yet, see [`Store::fleet_alive`]) to at
    /// least `lease_ms` from now (a heartbeat never shortens a lease).
    /// Returns the `(task_id, attempt)` pairs extended.
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

    /// Leases that have expired by the database clock, oldest first; none
    /// while the fleet is in its grace after an outage: less than
    /// `grace_ms` (a lease length) since it began hearing workers again
    /// ([`Store::fleet_alive`]), so each worker had a whole lease to
    /// re-assert its leases before any is judged.
    pub async fn expired_leases(
        &self,
        limit: i64,
        grace_ms: i64,
    ) -> Result<Vec<ExpiredLease>, StoreError> {
        on_backend!(self, b => b.expired_leases(limit, grace_ms).await)
    }

    /// Record that an engine reaches the database now (`fleet_liveness`;
    /// issue 22), and whether the fleet's stretch of hearing workers begins
    /// again now: [`FleetReset::IfSilentFor`] when no engine recorded this
    /// for that long (an engine starting after a fleet outage),
    /// [`FleetReset::Now`] when this engine itself could not reach the
    /// database for a while. While that stretch is younger than a lease, a
    /// heartbeat re-asserts a lease that expired meanwhile and no lease is
    /// judged expired ([`Store::expired_leases`]).
    pub async fn fleet_alive(&self, reset: FleetReset) -> Result<(), StoreError> {
        on_backend!(self, b => b.fleet_alive(reset).await)
    }

    /// Register this engine at behaviour level `own` (`fleet_level`) and
    /// read the fleet's level, which gated behaviour follows from now on
    /// ([`Store::migrate`] joins at [`fleet_level::BEHAVIOUR_LEVEL`]).
    /// Returns the fleet's level. SQLite: `own` (nothing is gated).
    ///
    /// Errors: [`StoreError::Config`] naming both levels when the fleet's
    /// level is above `own`.
    pub async fn join_fleet(&self, own: i32) -> Result<i32, StoreError> {
        on_backend!(self, b => b.join_fleet(own).await)
    }

    /// Refresh this engine's registration and raise the fleet's level to
    /// the lowest live replica's once, for `refresh.hold_ms`, every live
    /// replica was above it and no engine of a release before the registry
    /// was connected (`fleet_level`); every
    /// [`fleet_level::REFRESH_INTERVAL_MS`]. Returns the fleet's level.
    pub async fn refresh_fleet(&self, refresh: FleetRefresh) -> Result<i32, StoreError> {
        on_backend!(self, b => b.refresh_fleet(refresh).await)
    }

    /// The fleet's behaviour level as this store last read it; no
    /// statement.
    pub fn fleet_level(&self) -> i32 {
        on_backend!(self, b => b.fleet_level())
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

    /// The tenant of a task; `None` when there is no such task.
    pub async fn task_tenant(&self, task_id: Uuid) -> Result<Option<String>, StoreError> {
        on_backend!(self, b => b.task_tenant(task_id).await)
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
