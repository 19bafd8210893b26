//! The SQLite backend (embedded default: `belay dev`, the example, tests).
//!
//! Same semantics as [`postgres`](crate::postgres), done the SQLite way:
//!
//! - **One writer.** Every write goes through one connection (a pool of
//!   one), in `BEGIN IMMEDIATE` transactions, so transitions and claims are
//!   serialised inside the engine process: that is the run-row lock and
//!   `SKIP LOCKED` of PostgreSQL. Reads use a separate pool (WAL mode lets
//!   them run beside the writer).
//! - **One engine process per file.** The engine holds an exclusive `flock`
//!   on the database file while the store is open; a second engine on the
//!   same file (by any path, symlink or hard link) is refused with
//!   [`StoreError::Config`]. Workers connect over gRPC, any
//!   number of them.
//! - **Wake-ups** are an in-process broadcast channel fed after each commit
//!   (PostgreSQL: `LISTEN/NOTIFY`).
//! - **Durability**: WAL with `synchronous = FULL`, so a committed transition
//!   survives a process kill and a power cut.
//! - **Clock**: SQLite's `'now'` (the engine machine's clock, ms precision);
//!   leases are judged by it, as PostgreSQL's `now()` is on the other backend.

use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Sqlite, Transaction};
use tokio::sync::broadcast;
use uuid::Uuid;

use crate::rows::{
    ClaimedTask, DefinitionRow, EventRow, ExpiredLease, NotificationRow, NotificationStatus,
    OutboxRow, RunRow, StoreError, TOOL_CACHE_COLUMNS, TaskRow, ToolCacheRow, UncertainQuery,
    UncertainRow,
};
use crate::transition::{
    Applied, STATE_CACHE_RUNS, StateCache, Target, TasksWakeSeq, TransitionError, Wake, Wakes,
};
use belay_definitions::model::CircuitBreakerDef;
use belay_machine::gates::{self, Circuit, GateRow, GateVerdict};
use belay_machine::{Command, Decision, RunState, SealedSecret, TaskEnd};

/// SQL for "now" in the stored time format (`YYYY-MM-DDTHH:MM:SS.SSSZ`).
const NOW: &str = "strftime('%Y-%m-%dT%H:%M:%fZ','now', COALESCE((SELECT printf('%+.3f seconds', offset_ms / 1000.0) FROM belay_clock WHERE id = 1), '+0 seconds'))";

/// The strftime modifier that shifts SQLite's `'now'` by the clock offset
/// (see `Store::advance_clock`).
const CLOCK: &str = "COALESCE((SELECT printf('%+.3f seconds', offset_ms / 1000.0) FROM belay_clock WHERE id = 1), '+0 seconds')";

/// SQL for "now plus the ms in bound parameter `?N`" in the stored format.
fn now_plus_ms(param: u8) -> String {
    format!(
        "strftime('%Y-%m-%dT%H:%M:%fZ','now', {CLOCK}, printf('%+.3f seconds', ?{param} / 1000.0))"
    )
}

/// A timestamp in the stored format, for binding.
fn ts(t: &DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

/// A keyset position `(created_at, id)` for binding. Stored times have ms
/// precision; a position between two ms (a hand-made page token, or one
/// from PostgreSQL, which keeps µs) lies after every row of its ms, whatever
/// the id, so it becomes (that ms, the largest id). Without this the
/// fraction would be cut off and rows of that ms with a larger id skipped.
fn keyset(after: Option<(DateTime<Utc>, Uuid)>) -> (Option<String>, Option<Uuid>) {
    match after {
        None => (None, None),
        Some((t, id)) if t.timestamp_subsec_nanos() % 1_000_000 == 0 => (Some(ts(&t)), Some(id)),
        Some((t, _)) => (Some(ts(&t)), Some(Uuid::max())),
    }
}

const RUN_COLUMNS: &str = "run_id, tenant, workflow, workflow_version, status, status_reason, input, output, idempotency_key, caller, last_seq, created_at, updated_at";

const UNCERTAIN_COLUMNS: &str = "uncertain_id, tenant, run_id, task_id, call_id, node_id, tool, tool_version, arguments,
    idempotency_key, attempts, worker_id, reason, status, created_at, resolution, resolution_kind, resolved_by,
    resolved_at, resolved_via, resolution_reason, probe, discrepancy, occurrence";

/// The SQLite backend of [`Store`](crate::Store); cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Lite {
    /// The one writer connection.
    write: SqlitePool,
    /// Readers (the writer itself for an in-memory database).
    read: SqlitePool,
    /// See the PostgreSQL backend: folded states of recently changed runs.
    states: Arc<Mutex<StateCache>>,
    /// Wake-ups, sent after commit.
    wake: broadcast::Sender<Wake>,
    /// Bumped whenever tasks may have become claimable
    /// ([`crate::Store::tasks_wake_seq`]).
    tasks_seq: TasksWakeSeq,
    /// The exclusive `flock` on the database file, held while any clone lives and
    /// the store is not closed.
    lock: Arc<Mutex<Option<std::fs::File>>>,
}

impl Lite {
    /// Open `sqlite://PATH`, `sqlite:PATH` or `sqlite::memory:`; readers get
    /// at most `max_connections` connections.
    pub(crate) async fn connect(url: &str, max_connections: u32) -> Result<Lite, StoreError> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| StoreError::Config(format!("SQLite URL {url:?}: {e}")))?
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10));
        // In memory only when the URL says so: `sqlite::memory:`, or a
        // `mode=memory` query parameter; a file whose name merely contains
        // those words is a file.
        let (location, query) = url.split_once('?').unwrap_or((url, ""));
        let memory = location == "sqlite::memory:"
            || location == "sqlite://:memory:"
            || query.split('&').any(|p| p == "mode=memory");
        let (write, read, lock) = if memory {
            // One connection that never closes: the database lives in it.
            let pool = SqlitePoolOptions::new()
                .max_connections(1)
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None)
                .acquire_timeout(Duration::from_secs(60))
                .connect_with(options)
                .await?;
            (pool.clone(), pool, None)
        } else {
            let path = options.get_filename().to_path_buf();
            if let Some(dir) = path.parent()
                && !dir.as_os_str().is_empty()
                && !dir.exists()
            {
                std::fs::create_dir_all(dir).map_err(|e| {
                    StoreError::Config(format!("creating directory {}: {e}", dir.display()))
                })?;
            }
            let lock = lock_file(&path)?;
            let options = options
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Full);
            let write = SqlitePoolOptions::new()
                .max_connections(1)
                .acquire_timeout(Duration::from_secs(60))
                .connect_with(options.clone())
                .await?;
            let read = SqlitePoolOptions::new()
                .max_connections(max_connections.max(1))
                .acquire_timeout(Duration::from_secs(10))
                .connect_with(options)
                .await?;
            (write, read, Some(lock))
        };
        let (wake, _) = broadcast::channel(1024);
        Ok(Lite {
            write,
            read,
            states: Arc::new(Mutex::new(StateCache::new(STATE_CACHE_RUNS))),
            wake,
            tasks_seq: TasksWakeSeq::default(),
            lock: Arc::new(Mutex::new(lock)),
        })
    }

    pub(crate) async fn migrate(&self) -> Result<(), StoreError> {
        sqlx::migrate!("../../migrations/sqlite")
            .run(&self.write)
            .await?;
        Ok(())
    }

    pub(crate) async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.read).await?;
        Ok(())
    }

    pub(crate) async fn listen(
        &self,
        on_wake: &mut (dyn FnMut(Wake) + Send),
    ) -> Result<(), StoreError> {
        let mut rx = self.wake.subscribe();
        // Like PostgreSQL's listener, end with an error (`PoolClosed`) once
        // the store is closed, instead of waiting forever.
        let ended = self
            .write
            .close_event()
            .do_until(async {
                loop {
                    match rx.recv().await {
                        Ok(w) => on_wake(w),
                        // Fell behind: some wake-ups were dropped; everyone looks again.
                        Err(broadcast::error::RecvError::Lagged(_)) => {
                            self.tasks_seq.bump();
                            on_wake(Wake::Tasks)
                        }
                        Err(broadcast::error::RecvError::Closed) => {
                            return StoreError::Config("the store was closed".into());
                        }
                    }
                }
            })
            .await?;
        Err(ended)
    }

    async fn begin(&self) -> Result<Transaction<'static, Sqlite>, StoreError> {
        Ok(self.write.begin_with("BEGIN IMMEDIATE").await?)
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, StateCache> {
        self.states
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    // ---- tenants -------------------------------------------------------

    pub(crate) async fn set_tenant_grants(
        &self,
        tenant: &str,
        grants: &[String],
    ) -> Result<Vec<String>, StoreError> {
        let mut grants = grants.to_vec();
        grants.sort();
        grants.dedup();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO tenants (tenant, grants) VALUES (?1, ?2)
             ON CONFLICT (tenant) DO UPDATE SET grants = excluded.grants, updated_at = {NOW}"
        )))
        .bind(tenant)
        .bind(Value::from(grants.clone()))
        .execute(&self.write)
        .await?;
        Ok(grants)
    }

    pub(crate) async fn tenant_grants(&self, tenant: &str) -> Result<Vec<String>, StoreError> {
        let row: Option<(Value,)> = sqlx::query_as("SELECT grants FROM tenants WHERE tenant = ?1")
            .bind(tenant)
            .fetch_optional(&self.read)
            .await?;
        match row {
            None => Ok(Vec::new()),
            Some((v,)) => serde_json::from_value(v)
                .map_err(|e| StoreError::Corrupt(format!("grants of tenant {tenant}: {e}"))),
        }
    }

    // ---- definitions ---------------------------------------------------

    pub(crate) async fn definition_names(
        &self,
        tenant: &str,
        kind: &str,
    ) -> Result<Vec<String>, StoreError> {
        let rows: Vec<(String,)> =
            sqlx::query_as("SELECT DISTINCT name FROM definitions WHERE tenant = ?1 AND kind = ?2")
                .bind(tenant)
                .bind(kind)
                .fetch_all(&self.read)
                .await?;
        Ok(rows.into_iter().map(|r| r.0).collect())
    }

    pub(crate) async fn register_definitions(
        &self,
        tenant: &str,
        defs: &[(String, String, String, Value, String)],
    ) -> Result<Vec<(DefinitionRow, bool)>, StoreError> {
        let mut tx = self.begin().await?;
        let mut out = Vec::with_capacity(defs.len());
        for (kind, name, hash, body, source_file) in defs {
            let existing: Option<DefinitionRow> = sqlx::query_as(
                "SELECT kind, name, version, content_hash, body, created_at FROM definitions
                 WHERE tenant = ?1 AND kind = ?2 AND name = ?3 AND content_hash = ?4",
            )
            .bind(tenant)
            .bind(kind)
            .bind(name)
            .bind(hash)
            .fetch_optional(&mut *tx)
            .await?;
            if let Some(row) = existing {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE definitions SET registered_at = {NOW},
                        registration_seq = (SELECT COALESCE(MAX(registration_seq), 0) + 1 FROM definitions WHERE tenant = ?1)
                     WHERE tenant = ?1 AND kind = ?2 AND name = ?3 AND version = ?4"
                )))
                .bind(tenant)
                .bind(kind)
                .bind(name)
                .bind(row.version)
                .execute(&mut *tx)
                .await?;
                out.push((row, false));
                continue;
            }
            let row: DefinitionRow = sqlx::query_as(
                "INSERT INTO definitions (tenant, kind, name, version, content_hash, body, source_file, registration_seq)
                 VALUES (?1, ?2, ?3,
                    (SELECT COALESCE(MAX(version), 0) + 1 FROM definitions WHERE tenant = ?1 AND kind = ?2 AND name = ?3),
                    ?4, ?5, ?6,
                    (SELECT COALESCE(MAX(registration_seq), 0) + 1 FROM definitions WHERE tenant = ?1))
                 RETURNING kind, name, version, content_hash, body, created_at",
            )
            .bind(tenant)
            .bind(kind)
            .bind(name)
            .bind(hash)
            .bind(body)
            .bind(source_file)
            .fetch_one(&mut *tx)
            .await?;
            out.push((row, true));
        }
        tx.commit().await?;
        Ok(out)
    }

    pub(crate) async fn list_definitions(
        &self,
        tenant: &str,
        kind: Option<&str>,
    ) -> Result<Vec<DefinitionRow>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT kind, name, version, content_hash, body, created_at FROM definitions
             WHERE tenant = ?1 AND (?2 IS NULL OR kind = ?2)
             ORDER BY kind, name, version",
        )
        .bind(tenant)
        .bind(kind)
        .fetch_all(&self.read)
        .await?)
    }

    pub(crate) async fn latest_definition(
        &self,
        tenant: &str,
        kind: &str,
        name: &str,
    ) -> Result<Option<DefinitionRow>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT kind, name, version, content_hash, body, created_at FROM definitions
             WHERE tenant = ?1 AND kind = ?2 AND name = ?3
             ORDER BY registration_seq DESC, version DESC LIMIT 1",
        )
        .bind(tenant)
        .bind(kind)
        .bind(name)
        .fetch_optional(&self.read)
        .await?)
    }

    // ---- runs ------------------------------------------------------------

    pub(crate) async fn run_by_idempotency_key(
        &self,
        tenant: &str,
        key: &str,
    ) -> Result<Option<RunRow>, StoreError> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE tenant = ?1 AND idempotency_key = ?2"
        )))
        .bind(tenant)
        .bind(key)
        .fetch_optional(&self.read)
        .await?)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn create_run(
        &self,
        run_id: Uuid,
        tenant: &str,
        workflow: &str,
        workflow_version: i32,
        input: &Value,
        idempotency_key: &str,
        caller: &str,
        decision: &Decision,
        parent: Option<(Uuid, &str)>,
    ) -> Result<(RunRow, bool), StoreError> {
        let mut tx = self.begin().await?;
        let inserted = sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO runs (run_id, tenant, workflow, workflow_version, status, input, idempotency_key, caller,
                               parent_run_id, parent_call_id, created_at, updated_at)
             VALUES (?1, ?2, ?3, ?4, 'pending', ?5, ?6, ?7, ?8, ?9, {NOW}, {NOW})
             ON CONFLICT (tenant, idempotency_key) DO NOTHING"
        )))
        .bind(run_id)
        .bind(tenant)
        .bind(workflow)
        .bind(workflow_version)
        .bind(input)
        .bind(idempotency_key)
        .bind(caller)
        .bind(parent.map(|p| p.0))
        .bind(parent.map(|p| p.1))
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if inserted == 0 {
            tx.rollback().await?;
            let row = self
                .run_by_idempotency_key(tenant, idempotency_key)
                .await?
                .ok_or_else(|| {
                    StoreError::NotFound(format!("run with idempotency key {idempotency_key}"))
                })?;
            return Ok((row, false));
        }
        let served;
        let decision = if crate::transition::cache_lookups(&decision.commands).is_empty() {
            decision
        } else {
            served =
                serve_from_cache(&mut tx, tenant, &RunState::default(), decision.clone()).await?;
            &served
        };
        let mut state = RunState::default();
        for event in &decision.events {
            state.apply(event);
        }
        let wakes = write_decision(&mut tx, run_id, tenant, 0, decision, &state).await?;
        tx.commit().await?;
        self.send_wakes(run_id, wakes);
        let row = self
            .get_run(tenant, run_id)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("run {run_id}")))?;
        Ok((row, true))
    }

    pub(crate) async fn get_run(
        &self,
        tenant: &str,
        run_id: Uuid,
    ) -> Result<Option<RunRow>, StoreError> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE tenant = ?1 AND run_id = ?2"
        )))
        .bind(tenant)
        .bind(run_id)
        .fetch_optional(&self.read)
        .await?)
    }

    /// How many ancestors `run_id` has, counting at most `limit + 1`.
    pub(crate) async fn run_depth(&self, run_id: Uuid, limit: u32) -> Result<u32, StoreError> {
        let depth: i64 = sqlx::query_scalar(
            "WITH RECURSIVE chain (parent_run_id, depth) AS (
                 SELECT parent_run_id, 0 FROM runs WHERE run_id = ?1
               UNION ALL
                 SELECT r.parent_run_id, c.depth + 1
                 FROM runs r JOIN chain c ON r.run_id = c.parent_run_id
                 WHERE c.depth <= ?2
             )
             SELECT COALESCE(MAX(depth), 0) FROM chain",
        )
        .bind(run_id)
        .bind(i64::from(limit))
        .fetch_one(&self.read)
        .await?;
        Ok(u32::try_from(depth).unwrap_or(u32::MAX))
    }

    pub(crate) async fn list_runs(
        &self,
        tenant: &str,
        status: Option<&str>,
        after: Option<(DateTime<Utc>, Uuid)>,
        limit: i64,
    ) -> Result<Vec<RunRow>, StoreError> {
        let (after_ts, after_id) = keyset(after);
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {RUN_COLUMNS} FROM runs
             WHERE tenant = ?1 AND (?2 IS NULL OR status = ?2)
               AND (?3 IS NULL OR (created_at, run_id) < (?3, ?4))
             ORDER BY created_at DESC, run_id DESC LIMIT ?5"
        )))
        .bind(tenant)
        .bind(status)
        .bind(after_ts)
        .bind(after_id)
        .bind(limit)
        .fetch_all(&self.read)
        .await?)
    }

    pub(crate) async fn list_events(
        &self,
        run_id: Uuid,
        after_seq: i64,
        limit: i64,
    ) -> Result<Vec<EventRow>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT run_id, seq, kind, payload, recorded_at FROM events
             WHERE run_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
        )
        .bind(run_id)
        .bind(after_seq)
        .bind(limit)
        .fetch_all(&self.read)
        .await?)
    }

    pub(crate) async fn transition_at<E, F>(
        &self,
        target: Target,
        mut decide: F,
    ) -> Result<Applied, TransitionError<E>>
    where
        F: FnMut(
            &RunState,
            Option<&TaskRow>,
            Option<&GateVerdict>,
        ) -> Result<Decision, TransitionError<E>>,
    {
        // BEGIN IMMEDIATE on the one writer connection: the whole database
        // is locked for writing, which covers the run-row and task-row locks.
        let mut tx = self.begin().await?;
        let (target, dispatch) = target.split_dispatch();
        // The engine's clock is read by the same statement: the time of the
        // transition (`RunState::now`).
        type RunLock = (Uuid, String, i64, DateTime<Utc>);
        let (run, task_id): (Option<RunLock>, Option<Uuid>) = match target {
            Target::Run(run_id, task_id) => (
                sqlx::query_as(sqlx::AssertSqlSafe(format!(
                    "SELECT run_id, tenant, last_seq, {NOW} FROM runs WHERE run_id = ?1"
                )))
                .bind(run_id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(StoreError::from)?,
                task_id,
            ),
            Target::Task(task_id) | Target::Dispatch(task_id) => (
                sqlx::query_as(sqlx::AssertSqlSafe(format!(
                    "SELECT run_id, tenant, last_seq, {NOW} FROM runs
                     WHERE run_id = (SELECT run_id FROM tasks WHERE task_id = ?1)"
                )))
                .bind(task_id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(StoreError::from)?,
                Some(task_id),
            ),
        };
        let Some((run_id, tenant, last_seq, now)) = run else {
            return Err(StoreError::NotFound(match target {
                Target::Run(run_id, _) => format!("run {run_id}"),
                Target::Task(task_id) | Target::Dispatch(task_id) => format!("task {task_id}"),
            })
            .into());
        };
        let task = match task_id {
            Some(task_id) => {
                let row: Option<TaskRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                    "SELECT task_id, run_id, call_id, kind, status, attempt, worker_id, dispatched, dispatched_at,
                            (lease_expires_at IS NOT NULL AND lease_expires_at <= {NOW}) AS lease_expired
                     FROM tasks WHERE task_id = ?1 AND run_id = ?2"
                )))
                .bind(task_id)
                .bind(run_id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(StoreError::from)?;
                let mut row = row.ok_or_else(|| StoreError::NotFound(format!("task {task_id}")))?;
                // The tenant's grants for the permission check at dispatch,
                // in the same transaction (an embedded read, no round trip).
                if dispatch {
                    let grants: Option<(Value,)> =
                        sqlx::query_as("SELECT grants FROM tenants WHERE tenant = ?1")
                            .bind(&tenant)
                            .fetch_optional(&mut *tx)
                            .await
                            .map_err(StoreError::from)?;
                    if let Some((v,)) = grants {
                        row.tenant_grants = serde_json::from_value(v).map_err(|e| {
                            StoreError::Corrupt(format!("grants of tenant {tenant}: {e}"))
                        })?;
                    }
                }
                Some(row)
            }
            None => None,
        };
        let cached = self
            .cache()
            .take(&run_id)
            .filter(|s| s.last_seq <= last_seq as u64);
        let mut state = load_state(&mut tx, run_id, cached).await?;
        if state.last_seq != last_seq as u64 {
            return Err(StoreError::Corrupt(format!(
                "run {run_id}: last_seq {last_seq} but {} events",
                state.last_seq
            ))
            .into());
        }
        state.now = Some(now);
        let mut decision = decide(&state, task.as_ref(), None);
        if let Ok(first) = &decision
            && let Some(asked) = crate::transition::gates_asked(first)
        {
            let verdict = pass_tool_gates(&mut tx, &tenant, &asked).await?;
            decision = decision.and_then(|first| {
                crate::transition::after_gates(first, verdict, &state, task.as_ref(), &mut decide)
            });
        }
        let decision = match decision {
            Ok(d) => d,
            Err(e) => {
                self.cache().put(run_id, state);
                return Err(e);
            }
        };
        let decision = serve_from_cache(&mut tx, &tenant, &state, decision).await?;
        let mut after = state;
        for event in &decision.events {
            after.apply(event);
        }
        let mut wakes =
            write_decision(&mut tx, run_id, &tenant, last_seq, &decision, &after).await?;
        tx.commit().await.map_err(StoreError::from)?;
        let secrets = std::mem::take(&mut wakes.secrets);
        self.send_wakes(run_id, wakes);
        let applied = Applied {
            first_seq: last_seq as u64 + 1,
            events: decision.events.len(),
            status: after.status.as_str(),
            secrets,
        };
        self.cache().put(run_id, after);
        Ok(applied)
    }

    fn send_wakes(&self, run_id: Uuid, wakes: Wakes) {
        // No receiver (no coordinator listening) is fine.
        if wakes.tasks {
            self.tasks_seq.bump();
            let _ = self.wake.send(Wake::Tasks);
        }
        if wakes.events {
            let _ = self.wake.send(Wake::RunEvents(run_id));
        }
        if wakes.outbox {
            let _ = self.wake.send(Wake::Outbox);
        }
    }

    pub(crate) async fn run_state(&self, run_id: Uuid) -> Result<RunState, StoreError> {
        let mut tx = self.read.begin().await?;
        let state = load_state(&mut tx, run_id, None).await?;
        tx.commit().await?;
        Ok(state)
    }

    // ---- tasks -----------------------------------------------------------

    pub(crate) async fn claim_tasks(
        &self,
        worker_id: &str,
        max: i64,
        lease_ms: i64,
    ) -> Result<Vec<ClaimedTask>, StoreError> {
        // One statement on the one writer: no two claims see the same row.
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "UPDATE tasks SET status = 'leased', attempt = attempt + 1, worker_id = ?1,
                    lease_expires_at = {lease}, dispatched = 0, updated_at = {NOW}
             WHERE task_id IN (
                 SELECT t.task_id FROM tasks t JOIN runs r ON r.run_id = t.run_id
                 WHERE t.status = 'ready' AND t.available_at <= {NOW}
                   AND (r.status IN ('running', 'waiting') OR (r.status = 'paused' AND t.runs_while_paused))
                 ORDER BY t.available_at, t.task_id
                 LIMIT ?2)
             RETURNING task_id, run_id, tenant, kind, attempt, spec, idempotency_key",
            lease = now_plus_ms(3)
        )))
        .bind(worker_id)
        .bind(max)
        .bind(lease_ms as f64)
        .fetch_all(&self.write)
        .await?)
    }

    pub(crate) async fn heartbeat(
        &self,
        worker_id: &str,
        leases: &[(Uuid, i32)],
        lease_ms: i64,
    ) -> Result<Vec<(Uuid, i32)>, StoreError> {
        let mut tx = self.begin().await?;
        let mut out = Vec::with_capacity(leases.len());
        for (task_id, attempt) in leases {
            let row: Option<(Uuid, i32)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "UPDATE tasks SET lease_expires_at = MAX(lease_expires_at, {lease})
                 WHERE task_id = ?1 AND attempt = ?2 AND status = 'leased'
                   AND worker_id = ?4 AND lease_expires_at > {NOW}
                 RETURNING task_id, attempt",
                lease = now_plus_ms(3)
            )))
            .bind(task_id)
            .bind(attempt)
            .bind(lease_ms as f64)
            .bind(worker_id)
            .fetch_optional(&mut *tx)
            .await?;
            out.extend(row);
        }
        tx.commit().await?;
        Ok(out)
    }

    pub(crate) async fn expired_leases(&self, limit: i64) -> Result<Vec<ExpiredLease>, StoreError> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT task_id, run_id, attempt FROM tasks
             WHERE status = 'leased' AND lease_expires_at <= {NOW}
             ORDER BY lease_expires_at LIMIT ?1"
        )))
        .bind(limit)
        .fetch_all(&self.read)
        .await?)
    }

    /// See [`Store::claim_tasks_or_next`](crate::Store::claim_tasks_or_next):
    /// two statements here (one writer, no round trip to save).
    pub(crate) async fn claim_tasks_or_next(
        &self,
        worker_id: &str,
        max: i64,
        lease_ms: i64,
    ) -> Result<(Vec<ClaimedTask>, Option<i64>), StoreError> {
        let tasks = self.claim_tasks(worker_id, max, lease_ms).await?;
        if tasks.len() as i64 >= max {
            return Ok((tasks, None));
        }
        Ok((tasks, self.next_ready_in_ms().await?))
    }

    pub(crate) async fn next_ready_in_ms(&self) -> Result<Option<i64>, StoreError> {
        let row: Option<(Option<f64>,)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT (julianday(MIN(t.available_at)) - julianday('now', {CLOCK})) * 86400000.0
             FROM tasks t JOIN runs r ON r.run_id = t.run_id
             WHERE t.status = 'ready'
               AND (r.status IN ('running', 'waiting') OR (r.status = 'paused' AND t.runs_while_paused))"
        )))
        .fetch_optional(&self.read)
        .await?;
        Ok(row.and_then(|r| r.0).map(|ms| ms.max(0.0) as i64))
    }

    pub(crate) async fn expire_task_timers(
        &self,
        task_id: Option<Uuid>,
    ) -> Result<u64, StoreError> {
        let done = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE tasks SET
                 lease_expires_at = CASE WHEN status = 'leased'
                     THEN strftime('%Y-%m-%dT%H:%M:%fZ','now', {CLOCK}, '-0.001 seconds') ELSE lease_expires_at END,
                 available_at = CASE WHEN status = 'ready' AND available_at > {NOW} THEN {NOW} ELSE available_at END
             WHERE status IN ('leased', 'ready') AND (?1 IS NULL OR task_id = ?1)"
        )))
        .bind(task_id)
        .execute(&self.write)
        .await?;
        self.tasks_seq.bump();
        Ok(done.rows_affected())
    }

    pub(crate) async fn close(&self) {
        self.write.close().await;
        self.read.close().await;
        // No connection is left, so another engine may open the file now
        // (a restart in the same process, as after a crash in another).
        self.lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
    }

    pub(crate) async fn due_timers(
        &self,
        limit: i64,
    ) -> Result<Vec<(Uuid, String, i64)>, StoreError> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT run_id, timer_id,
                    MAX(0, CAST(ROUND((julianday({NOW}) - julianday(fire_at)) * 86400000.0) AS INTEGER))
               FROM timers WHERE fire_at <= {NOW}
             ORDER BY fire_at, run_id, timer_id LIMIT ?1"
        )))
        .bind(limit)
        .fetch_all(&self.read)
        .await?)
    }

    pub(crate) async fn callback_run(
        &self,
        token_sha256: &str,
    ) -> Result<Option<Uuid>, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT run_id FROM callbacks WHERE token_sha256 = ?1")
                .bind(token_sha256)
                .fetch_optional(&self.read)
                .await?,
        )
    }

    pub(crate) async fn advance_clock(&self, ms: i64) -> Result<(), StoreError> {
        sqlx::query("UPDATE belay_clock SET offset_ms = offset_ms + ?1 WHERE id = 1")
            .bind(ms)
            .execute(&self.write)
            .await?;
        // Delayed tasks may be due now.
        self.tasks_seq.bump();
        Ok(())
    }

    pub(crate) fn tasks_wake_seq(&self) -> u64 {
        self.tasks_seq.get()
    }

    pub(crate) async fn clock_now(&self) -> Result<DateTime<Utc>, StoreError> {
        Ok(
            sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT {NOW}")))
                .fetch_one(&self.read)
                .await?,
        )
    }

    pub(crate) async fn claim_outbox(
        &self,
        limit: i64,
        lease_ms: i64,
    ) -> Result<Vec<OutboxRow>, StoreError> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "UPDATE outbox SET attempts = attempts + 1, next_attempt_at = {lease}
             WHERE outbox_id IN (
                 SELECT outbox_id FROM outbox
                 WHERE done_at IS NULL AND next_attempt_at <= {NOW}
                 ORDER BY next_attempt_at, outbox_id
                 LIMIT ?1)
             RETURNING outbox_id, kind, run_id, payload, attempts",
            lease = now_plus_ms(2)
        )))
        .bind(limit)
        .bind(lease_ms as f64)
        .fetch_all(&self.write)
        .await?)
    }

    pub(crate) async fn finish_outbox(
        &self,
        outbox_id: Uuid,
        error: Option<&str>,
    ) -> Result<(), StoreError> {
        match error {
            None => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE outbox SET done_at = {NOW}, last_error = NULL WHERE outbox_id = ?1"
                )))
                .bind(outbox_id)
                .execute(&self.write)
                .await?
            }
            Some(e) => {
                sqlx::query("UPDATE outbox SET last_error = ?2 WHERE outbox_id = ?1")
                    .bind(outbox_id)
                    .bind(e)
                    .execute(&self.write)
                    .await?
            }
        };
        Ok(())
    }

    pub(crate) async fn end_orphan_task(
        &self,
        task_id: Uuid,
        attempt: i32,
    ) -> Result<(), StoreError> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE tasks SET status = 'cancelled', lease_expires_at = NULL, updated_at = {NOW}
             WHERE task_id = ?1 AND attempt = ?2 AND status = 'leased'"
        )))
        .bind(task_id)
        .bind(attempt)
        .execute(&self.write)
        .await?;
        Ok(())
    }

    // ---- uncertain outcomes --------------------------------------------

    pub(crate) async fn uncertain_for_run(
        &self,
        run_id: Uuid,
    ) -> Result<Vec<UncertainRow>, StoreError> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {UNCERTAIN_COLUMNS} FROM uncertain_outcomes WHERE run_id = ?1 ORDER BY created_at, occurrence"
        )))
        .bind(run_id)
        .fetch_all(&self.read)
        .await?)
    }

    pub(crate) async fn get_uncertain(
        &self,
        tenant: &str,
        id: Uuid,
    ) -> Result<Option<UncertainRow>, StoreError> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {UNCERTAIN_COLUMNS} FROM uncertain_outcomes WHERE tenant = ?1 AND uncertain_id = ?2"
        )))
        .bind(tenant)
        .bind(id)
        .fetch_optional(&self.read)
        .await?)
    }

    pub(crate) async fn list_uncertain(
        &self,
        f: &UncertainQuery<'_>,
    ) -> Result<Vec<UncertainRow>, StoreError> {
        let (after_ts, after_id) = keyset(f.after);
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {UNCERTAIN_COLUMNS} FROM uncertain_outcomes
             WHERE tenant = ?1
               AND (?2 IS NULL OR status = ?2)
               AND (?3 IS NULL OR tool = ?3)
               AND (?4 IS NULL OR run_id = ?4)
               AND (?5 IS NULL OR created_at <= {older})
               AND (?6 IS NULL OR created_at >= {newer})
               AND (?7 IS NULL OR (created_at, uncertain_id) < (?7, ?8))
             ORDER BY created_at DESC, uncertain_id DESC LIMIT ?9",
            older = format!("strftime('%Y-%m-%dT%H:%M:%fZ','now', {CLOCK}, printf('-%.3f seconds', ?5 / 1000.0))"),
            newer = format!("strftime('%Y-%m-%dT%H:%M:%fZ','now', {CLOCK}, printf('-%.3f seconds', ?6 / 1000.0))"),
        )))
        .bind(f.tenant)
        .bind(f.status)
        .bind(f.tool)
        .bind(f.run_id)
        .bind(f.older_than_ms.map(|ms| ms as f64))
        .bind(f.newer_than_ms.map(|ms| ms as f64))
        .bind(after_ts)
        .bind(after_id)
        .bind(f.limit)
        .fetch_all(&self.read)
        .await?)
    }

    // ---- notifications (outbox) ----------------------------------------

    pub(crate) async fn claim_due_notifications(
        &self,
        limit: i64,
        lease_ms: i64,
    ) -> Result<Vec<NotificationRow>, StoreError> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "UPDATE notifications SET attempts = attempts + 1, next_attempt_at = {lease}
             WHERE notification_id IN (
                 SELECT notification_id FROM notifications
                 WHERE delivered_at IS NULL AND failed_at IS NULL AND next_attempt_at <= {NOW}
                 ORDER BY next_attempt_at, notification_id
                 LIMIT ?1)
             RETURNING notification_id, tenant, run_id, kind, payload, attempts, created_at",
            lease = now_plus_ms(2)
        )))
        .bind(limit)
        .bind(lease_ms as f64)
        .fetch_all(&self.write)
        .await?)
    }

    pub(crate) async fn mark_notification_delivered(&self, id: Uuid) -> Result<bool, StoreError> {
        let done = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE notifications SET delivered_at = {NOW}, last_error = NULL
             WHERE notification_id = ?1 AND delivered_at IS NULL"
        )))
        .bind(id)
        .execute(&self.write)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    pub(crate) async fn record_notification_failure(
        &self,
        id: Uuid,
        attempt: i32,
        error: &str,
        retry_in_ms: Option<i64>,
    ) -> Result<bool, StoreError> {
        let done = match retry_in_ms {
            Some(ms) => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE notifications SET last_error = ?3, next_attempt_at = {next}
                     WHERE notification_id = ?1 AND attempts = ?2
                       AND delivered_at IS NULL AND failed_at IS NULL",
                    next = now_plus_ms(4)
                )))
                .bind(id)
                .bind(attempt)
                .bind(error)
                .bind(ms as f64)
                .execute(&self.write)
                .await?
            }
            None => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE notifications SET last_error = ?3, failed_at = {NOW}
                     WHERE notification_id = ?1 AND attempts = ?2
                       AND delivered_at IS NULL AND failed_at IS NULL"
                )))
                .bind(id)
                .bind(attempt)
                .bind(error)
                .execute(&self.write)
                .await?
            }
        };
        Ok(done.rows_affected() == 1)
    }

    pub(crate) async fn notifications_for_run(
        &self,
        run_id: Uuid,
    ) -> Result<Vec<NotificationStatus>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT notification_id, tenant, run_id, kind, attempts, next_attempt_at,
                    delivered_at, failed_at, last_error
             FROM notifications WHERE run_id = ?1
             ORDER BY created_at, notification_id",
        )
        .bind(run_id)
        .fetch_all(&self.read)
        .await?)
    }
}

/// Take an exclusive `flock` on the database file itself (created empty if
/// missing; SQLite takes an empty file as a new database). The lock follows
/// the file, not the name: a symlink, a hard link or another spelling of the
/// path finds it taken. It is released when the handle closes, including
/// when the process dies. (SQLite's own locks are POSIX `fcntl` locks, which
/// `flock` does not interact with on Linux; the handle is closed only after
/// every SQLite connection, as closing it would drop this process's `fcntl`
/// locks on the file.)
fn lock_file(path: &std::path::Path) -> Result<std::fs::File, StoreError> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| {
            StoreError::Config(format!("opening SQLite database {}: {e}", path.display()))
        })?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(StoreError::Config(format!(
            "SQLite database {} is in use by another engine process; \
             one engine process per SQLite file; use PostgreSQL for several engine replicas",
            path.display(),
        ))),
        Err(std::fs::TryLockError::Error(e)) => Err(StoreError::Config(format!(
            "locking SQLite database {}: {e}",
            path.display()
        ))),
    }
}

/// Write an outbox row (in the transition's transaction).
async fn insert_outbox(
    tx: &mut Transaction<'static, Sqlite>,
    run_id: Uuid,
    kind: &str,
    payload: &Value,
) -> Result<(), StoreError> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO outbox (outbox_id, kind, run_id, payload, next_attempt_at, created_at)
         VALUES (?1, ?2, ?3, ?4, {NOW}, {NOW})"
    )))
    .bind(Uuid::now_v7())
    .bind(kind)
    .bind(run_id)
    .bind(payload)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn load_state(
    tx: &mut Transaction<'static, Sqlite>,
    run_id: Uuid,
    from: Option<RunState>,
) -> Result<RunState, StoreError> {
    let mut state = from.unwrap_or_default();
    let rows: Vec<(i64, Value)> = sqlx::query_as(
        "SELECT seq, payload FROM events WHERE run_id = ?1 AND seq > ?2 ORDER BY seq",
    )
    .bind(run_id)
    .bind(state.last_seq as i64)
    .fetch_all(&mut **tx)
    .await?;
    crate::transition::fold_tail(&mut state, run_id, rows)?;
    Ok(state)
}

/// Serve the calls `decision` launched with a cache lookup
/// ([`Command::LookupToolCache`]) from the tenant's tool cache where it has
/// a live entry (the rules are [`crate::transition::CacheServing`]'s); `state` is the
/// run before `decision`. A decision without lookups costs no statement.
async fn serve_from_cache(
    tx: &mut Transaction<'static, Sqlite>,
    tenant: &str,
    state: &RunState,
    decision: Decision,
) -> Result<Decision, StoreError> {
    let mut serving = match crate::transition::CacheServing::new(state, decision) {
        Ok(serving) => serving,
        Err(decision) => return Ok(decision),
    };
    if serving.needs_clock() {
        serving.set_clock(
            sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT {NOW}")))
                .fetch_one(&mut **tx)
                .await?,
        );
    }
    while let Some(key) = serving.next_key() {
        let row: Option<ToolCacheRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {TOOL_CACHE_COLUMNS} FROM tool_cache
             WHERE tenant = ?1 AND cache_key = ?2 AND expires_at > {NOW}"
        )))
        .bind(tenant)
        .bind(&key)
        .fetch_optional(&mut **tx)
        .await?;
        let Some(row) = row else {
            continue;
        };
        if serving.needs_grants() {
            let stored: Option<(Value,)> =
                sqlx::query_as("SELECT grants FROM tenants WHERE tenant = ?1")
                    .bind(tenant)
                    .fetch_optional(&mut **tx)
                    .await?;
            serving.set_grants(match stored {
                Some((v,)) => serde_json::from_value(v)
                    .map_err(|e| StoreError::Corrupt(format!("grants of tenant {tenant}: {e}")))?,
                None => Vec::new(),
            });
        }
        serving.serve(row);
    }
    Ok(serving.finish())
}

/// SQL of the newest uncertain-outcome record of a call (`?1` run, `?2` call).
const NEWEST_RECORD: &str = "(SELECT uncertain_id FROM uncertain_outcomes
     WHERE run_id = ?1 AND call_id = ?2 ORDER BY occurrence DESC LIMIT 1)";

/// Append the decision's events after `last_seq`, perform its commands, and
/// update the run row from the state `after` the events.
async fn write_decision(
    tx: &mut Transaction<'static, Sqlite>,
    run_id: Uuid,
    tenant: &str,
    last_seq: i64,
    decision: &Decision,
    after: &RunState,
) -> Result<Wakes, StoreError> {
    let mut wakes = Wakes {
        tasks: crate::transition::wakes_tasks(decision),
        events: !decision.events.is_empty(),
        outbox: false,
        secrets: Vec::new(),
    };
    for (i, event) in decision.events.iter().enumerate() {
        let payload = serde_json::to_value(event)
            .map_err(|e| StoreError::Corrupt(format!("event does not serialise: {e}")))?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO events (run_id, seq, kind, payload, tenant, recorded_at) VALUES (?1, ?2, ?3, ?4, ?5, {NOW})"
        )))
            .bind(run_id)
            .bind(last_seq + 1 + i as i64)
            .bind(event.kind())
            .bind(payload)
            .bind(tenant)
            .execute(&mut **tx)
            .await?;
    }
    for command in &decision.commands {
        match command {
            Command::ScheduleTask {
                call_id,
                kind,
                spec,
                idempotency_key,
                repeat_safety,
                runs_while_paused,
            } => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "INSERT INTO tasks (task_id, run_id, tenant, call_id, kind, status, spec, idempotency_key, repeat_safety,
                         runs_while_paused, available_at, created_at, updated_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, 'ready', ?6, ?7, ?8, ?9, {NOW}, {NOW}, {NOW})"
                )))
                .bind(Uuid::now_v7())
                .bind(run_id)
                .bind(tenant)
                .bind(call_id)
                .bind(kind.as_str())
                .bind(spec)
                .bind(idempotency_key)
                .bind(repeat_safety.map(|r| r.as_str()))
                .bind(runs_while_paused)
                .execute(&mut **tx)
                .await?;
                wakes.tasks = true;
            }
            Command::RetryTask { call_id, delay_ms } => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE tasks SET status = 'ready', lease_expires_at = NULL, worker_id = NULL, dispatched = 0,
                            available_at = {available}, updated_at = {NOW}
                     WHERE run_id = ?1 AND call_id = ?2",
                    available = now_plus_ms(3)
                )))
                .bind(run_id)
                .bind(call_id)
                .bind(*delay_ms as f64)
                .execute(&mut **tx)
                .await?;
                wakes.tasks = true;
            }
            Command::MarkDispatched { call_id, attempt } => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE tasks SET dispatched = 1, dispatched_attempt = ?3, dispatched_at = {NOW}, updated_at = {NOW}
                     WHERE run_id = ?1 AND call_id = ?2 AND attempt = ?3 AND status = 'leased'"
                )))
                .bind(run_id)
                .bind(call_id)
                .bind(*attempt as i32)
                .execute(&mut **tx)
                .await?;
            }
            Command::EndTask { call_id, end } => {
                let status = match end {
                    TaskEnd::Completed => "completed",
                    TaskEnd::Failed => "failed",
                    TaskEnd::Uncertain => "uncertain",
                    TaskEnd::Cancelled => "cancelled",
                };
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE tasks SET status = ?3, lease_expires_at = NULL, updated_at = {NOW}
                     WHERE run_id = ?1 AND call_id = ?2"
                )))
                .bind(run_id)
                .bind(call_id)
                .bind(status)
                .execute(&mut **tx)
                .await?;
            }
            Command::RecordUncertainOutcome {
                call_id,
                node,
                tool,
                tool_version,
                arguments,
                idempotency_key,
                attempt: _,
                reason,
            } => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "INSERT INTO uncertain_outcomes (uncertain_id, tenant, run_id, task_id, call_id, node_id, tool,
                         tool_version, arguments, idempotency_key, attempts, worker_id, reason, occurrence, created_at)
                     SELECT ?3, ?4, ?1, t.task_id, ?2, ?5, ?6, ?7, ?8, ?9,
                            -- Every attempt's dispatch and failure, from the events
                            -- (this transition's events are already inserted).
                            (SELECT COALESCE(json_group_array(json_object(
                                        'seq', e.seq, 'event', e.kind, 'attempt', e.payload -> '$.attempt',
                                        'worker_id', e.payload -> '$.worker_id', 'error', e.payload -> '$.error',
                                        'class', e.payload -> '$.class', 'at', e.recorded_at) ORDER BY e.seq), '[]')
                             FROM events e
                             WHERE e.run_id = ?1 AND e.payload ->> '$.call_id' = ?2
                               AND e.kind IN ('tool_call_dispatched', 'tool_call_attempt_failed', 'task_lease_expired')),
                            t.worker_id, ?10,
                            (SELECT COALESCE(MAX(occurrence), 0) + 1 FROM uncertain_outcomes u
                             WHERE u.run_id = ?1 AND u.call_id = ?2),
                            {NOW}
                     FROM tasks t WHERE t.run_id = ?1 AND t.call_id = ?2"
                )))
                .bind(run_id)
                .bind(call_id)
                .bind(Uuid::now_v7())
                .bind(tenant)
                .bind(node)
                .bind(tool)
                .bind(*tool_version as i32)
                .bind(arguments)
                .bind(idempotency_key)
                .bind(reason)
                .execute(&mut **tx)
                .await?;
            }
            Command::RekeyTask {
                call_id,
                idempotency_key,
                spec,
            } => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE tasks SET idempotency_key = ?3, spec = ?4, updated_at = {NOW}
                     WHERE run_id = ?1 AND call_id = ?2"
                )))
                .bind(run_id)
                .bind(call_id)
                .bind(idempotency_key)
                .bind(spec)
                .execute(&mut **tx)
                .await?;
            }
            Command::MarkUncertainResolved {
                call_id,
                resolution,
                kind,
                resolved_by,
                reason,
                via,
            } => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE uncertain_outcomes SET status = 'resolved', resolution = ?3, resolution_kind = ?4,
                            resolved_by = ?5, resolution_reason = ?6, resolved_via = ?7, resolved_at = {NOW}
                     WHERE uncertain_id = (SELECT uncertain_id FROM uncertain_outcomes
                                           WHERE run_id = ?1 AND call_id = ?2 AND status = 'open'
                                           ORDER BY occurrence DESC LIMIT 1)"
                )))
                .bind(run_id)
                .bind(call_id)
                .bind(resolution)
                .bind(kind.as_str())
                .bind(resolved_by)
                .bind(reason)
                .bind(via.as_str())
                .execute(&mut **tx)
                .await?;
            }
            Command::FlagDiscrepancy {
                call_id,
                discrepancy,
            } => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE uncertain_outcomes
                     SET discrepancy = json_insert(COALESCE(discrepancy, '[]'), '$[#]', json(?3))
                     WHERE uncertain_id = {NEWEST_RECORD}"
                )))
                .bind(run_id)
                .bind(call_id)
                .bind(discrepancy)
                .execute(&mut **tx)
                .await?;
            }
            Command::RecordProbe { call_id, probe } => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE uncertain_outcomes SET probe = json_set(json(?3), '$.at', {NOW})
                     WHERE uncertain_id = {NEWEST_RECORD}"
                )))
                .bind(run_id)
                .bind(call_id)
                .bind(probe)
                .execute(&mut **tx)
                .await?;
            }
            Command::NotifyOperator { kind, payload } => {
                // The record's id is added here, as the PostgreSQL backend
                // does in SQL (SQLite stores ids as blobs).
                let call_id = payload.get("call_id").and_then(Value::as_str).unwrap_or("");
                let record: Option<(Uuid,)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                    "SELECT uncertain_id FROM uncertain_outcomes WHERE uncertain_id = {NEWEST_RECORD}"
                )))
                .bind(run_id)
                .bind(call_id)
                .fetch_optional(&mut **tx)
                .await?;
                let mut payload = payload.clone();
                if let Value::Object(map) = &mut payload {
                    map.insert(
                        "uncertain_id".into(),
                        record.map_or(Value::Null, |(id,)| Value::String(id.to_string())),
                    );
                }
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "INSERT INTO notifications (notification_id, tenant, run_id, kind, payload, next_attempt_at, created_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, {NOW}, {NOW})"
                )))
                .bind(Uuid::now_v7())
                .bind(tenant)
                .bind(run_id)
                .bind(kind)
                .bind(payload)
                .execute(&mut **tx)
                .await?;
            }
            Command::ScheduleTimer(timer) => {
                let fire_at = match timer.at.as_deref().and_then(|t| {
                    chrono::DateTime::parse_from_rfc3339(t)
                        .ok()
                        .map(|t| ts(&t.with_timezone(&Utc)))
                }) {
                    Some(at) => at,
                    None => {
                        let row: (String,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                            "SELECT {}",
                            now_plus_ms(1)
                        )))
                        .bind(timer.after_ms.unwrap_or(0) as f64)
                        .fetch_one(&mut **tx)
                        .await?;
                        row.0
                    }
                };
                sqlx::query(
                    "INSERT INTO timers (run_id, timer_id, fire_at) VALUES (?1, ?2, ?3)
                     ON CONFLICT (run_id, timer_id) DO UPDATE SET fire_at = excluded.fire_at",
                )
                .bind(run_id)
                .bind(&timer.timer_id)
                .bind(fire_at)
                .execute(&mut **tx)
                .await?;
            }
            Command::RegisterCallback {
                call_id,
                token_sha256,
            } => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "INSERT INTO callbacks (token_sha256, run_id, call_id, created_at)
                     VALUES (?1, ?2, ?3, {NOW}) ON CONFLICT (token_sha256) DO NOTHING"
                )))
                .bind(token_sha256)
                .bind(run_id)
                .bind(call_id)
                .execute(&mut **tx)
                .await?;
            }
            Command::CancelTimer { timer_id } => {
                sqlx::query("DELETE FROM timers WHERE run_id = ?1 AND timer_id = ?2")
                    .bind(run_id)
                    .bind(timer_id)
                    .execute(&mut **tx)
                    .await?;
            }
            Command::StartChildRun {
                call_id,
                child_run_id,
                workflow,
                input,
                sync,
            } => {
                let payload = serde_json::json!({
                    "tenant": tenant, "call_id": call_id, "child_run_id": child_run_id,
                    "workflow": workflow, "input": input, "sync": sync,
                });
                insert_outbox(tx, run_id, "start_child", &payload).await?;
                wakes.outbox = true;
            }
            Command::CancelChildRun {
                child_run_id,
                reason,
            } => {
                let payload = serde_json::json!({
                    "tenant": tenant, "child_run_id": child_run_id, "reason": reason,
                });
                insert_outbox(tx, run_id, "cancel_child", &payload).await?;
                wakes.outbox = true;
            }
            Command::CancelOpenTasks => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE tasks SET status = 'cancelled', lease_expires_at = NULL, updated_at = {NOW}
                     WHERE run_id = ?1 AND status IN ('ready', 'leased')"
                )))
                .bind(run_id)
                .execute(&mut **tx)
                .await?;
            }
            // Passed before this decision was written (`transition_at`);
            // lookups were made by `serve_from_cache`.
            Command::PassToolGates { .. } | Command::LookupToolCache { .. } => {}
            Command::StoreToolCache {
                key,
                tool,
                call_id,
                result,
                ttl_ms,
            } => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "INSERT INTO tool_cache ({TOOL_CACHE_COLUMNS})
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, {NOW}, {expires})
                     ON CONFLICT (tenant, cache_key) DO UPDATE SET
                         tool = excluded.tool, result = excluded.result, run_id = excluded.run_id,
                         call_id = excluded.call_id, stored_at = excluded.stored_at,
                         expires_at = excluded.expires_at",
                    expires = now_plus_ms(7)
                )))
                .bind(tenant)
                .bind(key)
                .bind(tool)
                .bind(result)
                .bind(run_id)
                .bind(call_id)
                .bind(*ttl_ms as f64)
                .execute(&mut **tx)
                .await?;
            }
            Command::RecordToolOutcome {
                tool,
                circuit_breaker,
                failed,
            } => record_tool_outcome(tx, tenant, tool, circuit_breaker, *failed).await?,
            Command::VaultSecrets {
                call_id, entries, ..
            } => {
                for entry in entries {
                    let consumers = serde_json::to_string(&entry.consumers)
                        .map_err(|e| StoreError::Corrupt(format!("consumers: {e}")))?;
                    let ttl_ms = entry
                        .ttl_s
                        .map(|t| i64::try_from(t.saturating_mul(1000)).unwrap_or(i64::MAX));
                    sqlx::query(sqlx::AssertSqlSafe(format!(
                        "INSERT INTO run_secrets (run_id, key, producer_call, nonce, ciphertext, expires_at, single_use, consumers, consumed_by_call, created_at)
                         VALUES (?1, ?2, ?3, ?4, ?5, CASE WHEN ?6 IS NULL THEN NULL ELSE {} END, ?7, ?8, NULL, {NOW})
                         ON CONFLICT (run_id, key) DO UPDATE SET producer_call = excluded.producer_call,
                             nonce = excluded.nonce, ciphertext = excluded.ciphertext,
                             expires_at = excluded.expires_at, single_use = excluded.single_use,
                             consumers = excluded.consumers, consumed_by_call = NULL,
                             created_at = excluded.created_at",
                        now_plus_ms(6)
                    )))
                    .bind(run_id)
                    .bind(&entry.sealed.key)
                    .bind(call_id)
                    .bind(&entry.sealed.nonce)
                    .bind(&entry.sealed.ciphertext)
                    .bind(ttl_ms)
                    .bind(entry.single_use)
                    .bind(consumers)
                    .execute(&mut **tx)
                    .await?;
                }
            }
            Command::RestoreSecrets {
                call_id,
                tool,
                keys,
            } => {
                let keys = serde_json::to_string(keys)
                    .map_err(|e| StoreError::Corrupt(format!("vault keys: {e}")))?;
                let rows: Vec<(String, Vec<u8>, Vec<u8>)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                    "UPDATE run_secrets
                     SET consumed_by_call = CASE WHEN single_use THEN ?4 ELSE consumed_by_call END
                     WHERE run_id = ?1 AND key IN (SELECT value FROM json_each(?2))
                       AND (expires_at IS NULL OR expires_at > {NOW})
                       AND (consumers = '[]' OR EXISTS (SELECT 1 FROM json_each(consumers) WHERE value = ?3))
                       AND (consumed_by_call IS NULL OR consumed_by_call = ?4)
                     RETURNING key, nonce, ciphertext"
                )))
                .bind(run_id)
                .bind(keys)
                .bind(tool)
                .bind(call_id)
                .fetch_all(&mut **tx)
                .await?;
                wakes
                    .secrets
                    .extend(
                        rows.into_iter()
                            .map(|(key, nonce, ciphertext)| SealedSecret {
                                key,
                                nonce,
                                ciphertext,
                            }),
                    );
            }
            Command::DropRunSecrets => {
                sqlx::query("DELETE FROM run_secrets WHERE run_id = ?1")
                    .bind(run_id)
                    .execute(&mut **tx)
                    .await?;
            }
        }
    }
    if after.status.is_terminal() {
        // A run that ended has nothing left to wake it.
        sqlx::query("DELETE FROM timers WHERE run_id = ?1")
            .bind(run_id)
            .execute(&mut **tx)
            .await?;
        // A child run that ends tells its parent (through the outbox).
        if crate::transition::ends_run(decision) {
            let parent: Option<(Option<Uuid>,)> =
                sqlx::query_as("SELECT parent_run_id FROM runs WHERE run_id = ?1")
                    .bind(run_id)
                    .fetch_optional(&mut **tx)
                    .await?;
            if let Some((Some(parent),)) = parent {
                let payload =
                    crate::transition::child_finished_payload(tenant, parent, run_id, after);
                insert_outbox(tx, run_id, "child_finished", &payload).await?;
                wakes.outbox = true;
            }
        }
    }
    // The run row is a projection of the events: a decision without any
    // (a duplicate signal, a stale timer, a repeated child report) leaves
    // it as it is, `updated_at` included.
    if !decision.events.is_empty() {
        let new_seq = last_seq + decision.events.len() as i64;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE runs SET status = ?2, status_reason = ?3, output = ?4, last_seq = ?5, updated_at = {NOW}
             WHERE run_id = ?1"
        )))
        .bind(run_id)
        .bind(after.status.as_str())
        .bind(&after.status_reason)
        .bind(after.output.as_ref())
        .bind(new_seq)
        .execute(&mut **tx)
        .await?;
    }
    Ok(wakes)
}

// ---- tool gates (rate limits, circuit breakers) ------------------------
// The rules are in `belay_machine::gates`; these statements load and save its rows.
// The one writer connection serialises every transaction, so no row lock
// is needed (the PostgreSQL backend takes them).

/// SQL for the engine's clock in ms since the epoch (`'now'` shifted like [`NOW`]).
fn now_ms() -> String {
    format!("CAST(ROUND((julianday('now', {CLOCK}) - 2440587.5) * 86400000.0) AS INTEGER)")
}

/// The tool's row and the engine's clock (ms); `None` when it has no row.
async fn load_gate(
    tx: &mut Transaction<'static, Sqlite>,
    tenant: &str,
    tool: &str,
) -> Result<Option<(GateRow, i64)>, StoreError> {
    let row: Option<crate::transition::GateTuple> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT next_at_ms, queue_at_ms, failures, circuit, retry_at_ms, {}
         FROM tool_gates WHERE tenant = ?1 AND tool = ?2",
        now_ms()
    )))
    .bind(tenant)
    .bind(tool)
    .fetch_optional(&mut **tx)
    .await?;
    row.map(crate::transition::gate_row).transpose()
}

/// The tool's row (a fresh one when it has none) and the engine's clock (ms).
async fn gate_or_default(
    tx: &mut Transaction<'static, Sqlite>,
    tenant: &str,
    tool: &str,
) -> Result<(GateRow, i64), StoreError> {
    if let Some(found) = load_gate(tx, tenant, tool).await? {
        return Ok(found);
    }
    let now: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT {}", now_ms())))
        .fetch_one(&mut **tx)
        .await?;
    Ok((GateRow::default(), now))
}

async fn save_gate(
    tx: &mut Transaction<'static, Sqlite>,
    tenant: &str,
    tool: &str,
    row: &GateRow,
) -> Result<(), StoreError> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO tool_gates (tenant, tool, next_at_ms, queue_at_ms, failures, circuit, retry_at_ms, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, {NOW})
         ON CONFLICT (tenant, tool) DO UPDATE SET next_at_ms = excluded.next_at_ms,
             queue_at_ms = excluded.queue_at_ms, failures = excluded.failures, circuit = excluded.circuit,
             retry_at_ms = excluded.retry_at_ms, updated_at = excluded.updated_at"
    )))
    .bind(tenant)
    .bind(tool)
    .bind(row.next_at_ms)
    .bind(row.queue_at_ms)
    .bind(i64::from(row.failures))
    .bind(row.circuit.as_str())
    .bind(row.retry_at_ms)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// See the PostgreSQL backend's `pass_tool_gates`.
async fn pass_tool_gates(
    tx: &mut Transaction<'static, Sqlite>,
    tenant: &str,
    asked: &crate::transition::GatesAsked<'_>,
) -> Result<Option<GateVerdict>, StoreError> {
    let (tool, gates) = (asked.tool, asked.gates);
    let (row, now) = gate_or_default(tx, tenant, tool).await?;
    if gates.rate_limit.is_none() && row.circuit == Circuit::Closed {
        return Ok(None);
    }
    let (verdict, next) = gates::admit(&row, now, gates, asked.holds_turn);
    if next != row {
        save_gate(tx, tenant, tool, &next).await?;
    }
    Ok(verdict)
}

/// See the PostgreSQL backend's `record_tool_outcome`.
async fn record_tool_outcome(
    tx: &mut Transaction<'static, Sqlite>,
    tenant: &str,
    tool: &str,
    breaker: &CircuitBreakerDef,
    failed: bool,
) -> Result<(), StoreError> {
    if !failed {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE tool_gates SET failures = 0, circuit = 'closed', retry_at_ms = 0, updated_at = {NOW}
             WHERE tenant = ?1 AND tool = ?2 AND (failures <> 0 OR circuit <> 'closed')"
        )))
        .bind(tenant)
        .bind(tool)
        .execute(&mut **tx)
        .await?;
        return Ok(());
    }
    let (row, now) = gate_or_default(tx, tenant, tool).await?;
    save_gate(tx, tenant, tool, &gates::after_failure(&row, now, breaker)).await
}

impl Lite {
    /// See [`crate::Store::tool_gate`].
    pub(crate) async fn run_secrets(
        &self,
        run_id: Uuid,
    ) -> Result<Vec<crate::rows::RunSecretRow>, StoreError> {
        type Row = (String, String, Option<String>, bool, String, Option<String>);
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT key, producer_call, expires_at, single_use, consumers, consumed_by_call
             FROM run_secrets WHERE run_id = ?1 ORDER BY key",
        )
        .bind(run_id)
        .fetch_all(&self.read)
        .await?;
        rows.into_iter()
            .map(
                |(key, producer_call, expires_at, single_use, consumers, consumed_by_call)| {
                    let consumers: Vec<String> = serde_json::from_str(&consumers)
                        .map_err(|e| StoreError::Corrupt(format!("run_secrets.consumers: {e}")))?;
                    let expires_at = match expires_at {
                        Some(t) => Some(
                            chrono::DateTime::parse_from_rfc3339(&t)
                                .map_err(|e| {
                                    StoreError::Corrupt(format!("run_secrets.expires_at: {e}"))
                                })?
                                .with_timezone(&Utc),
                        ),
                        None => None,
                    };
                    Ok(crate::rows::RunSecretRow {
                        key,
                        producer_call,
                        expires_at,
                        single_use,
                        consumers,
                        consumed_by_call,
                    })
                },
            )
            .collect()
    }

    pub(crate) async fn tool_cache_entries(
        &self,
        tenant: &str,
    ) -> Result<Vec<ToolCacheRow>, StoreError> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {TOOL_CACHE_COLUMNS} FROM tool_cache WHERE tenant = ?1
             ORDER BY stored_at DESC, cache_key"
        )))
        .bind(tenant)
        .fetch_all(&self.read)
        .await?)
    }

    pub(crate) async fn purge_expired_tool_cache(&self, limit: i64) -> Result<u64, StoreError> {
        let done = sqlx::query(sqlx::AssertSqlSafe(format!(
            "DELETE FROM tool_cache WHERE rowid IN (
                 SELECT rowid FROM tool_cache WHERE expires_at <= {NOW}
                 ORDER BY expires_at LIMIT ?1)"
        )))
        .bind(limit)
        .execute(&self.write)
        .await?;
        Ok(done.rows_affected())
    }

    pub(crate) async fn tool_gate(
        &self,
        tenant: &str,
        tool: &str,
    ) -> Result<Option<GateRow>, StoreError> {
        let mut tx = self.read.begin().await?;
        let row = load_gate(&mut tx, tenant, tool).await?;
        tx.commit().await?;
        Ok(row.map(|(row, _)| row))
    }
}

// ---- MCP tools (definitions reported by workers, pins) -----------------
// New statements only; the rules are in `belay_engine::mcp_pins`.

const MCP_DEFINITION_COLUMNS: &str = "server, tool, definition_hash, definition, refusal, suggested_repeat_safety, protocol_version, first_seen_at, last_seen_at, reported_by";
const MCP_PIN_COLUMNS: &str =
    "tenant, server, tool, definition_hash, previous_hash, accepted_by, reason, accepted_at";

impl Lite {
    /// See [`crate::Store::record_mcp_tools`].
    pub(crate) async fn record_mcp_tools(
        &self,
        server: &str,
        protocol_version: &str,
        reported_by: &str,
        listings: &[crate::rows::McpToolListingIn],
    ) -> Result<u64, StoreError> {
        let mut tx = self.begin().await?;
        let seq: i64 =
            sqlx::query_scalar("SELECT COALESCE(MAX(report_seq), 0) + 1 FROM mcp_tool_definitions")
                .fetch_one(&mut *tx)
                .await?;
        let mut new = 0;
        for l in listings {
            let inserted = sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO mcp_tool_definitions
                     (server, tool, definition_hash, definition, refusal, suggested_repeat_safety,
                      protocol_version, first_seen_at, last_seen_at, reported_by, report_seq)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, {NOW}, {NOW}, ?8, ?9)
                 ON CONFLICT (server, tool, definition_hash) DO NOTHING"
            )))
            .bind(server)
            .bind(&l.tool)
            .bind(&l.definition_hash)
            .bind(&l.definition)
            .bind(l.refusal.as_deref())
            .bind(&l.suggested_repeat_safety)
            .bind(protocol_version)
            .bind(reported_by)
            .bind(seq)
            .execute(&mut *tx)
            .await?;
            if inserted.rows_affected() == 1 {
                new += 1;
            } else {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE mcp_tool_definitions
                     SET last_seen_at = {NOW}, reported_by = ?4, protocol_version = ?5,
                         report_seq = ?6
                     WHERE server = ?1 AND tool = ?2 AND definition_hash = ?3"
                )))
                .bind(server)
                .bind(&l.tool)
                .bind(&l.definition_hash)
                .bind(reported_by)
                .bind(protocol_version)
                .bind(seq)
                .execute(&mut *tx)
                .await?;
            }
        }
        tx.commit().await?;
        Ok(new)
    }

    /// See [`crate::Store::mcp_tool_definitions`].
    pub(crate) async fn mcp_tool_definitions(
        &self,
        server: Option<&str>,
        tool: Option<&str>,
    ) -> Result<Vec<crate::rows::McpToolDefinitionRow>, StoreError> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {MCP_DEFINITION_COLUMNS} FROM mcp_tool_definitions
             WHERE (?1 IS NULL OR server = ?1) AND (?2 IS NULL OR tool = ?2)
             ORDER BY server, tool, report_seq DESC, definition_hash"
        )))
        .bind(server)
        .bind(tool)
        .fetch_all(&self.read)
        .await?)
    }

    /// See [`crate::Store::mcp_tool_pins`].
    pub(crate) async fn mcp_tool_pins(
        &self,
        tenant: &str,
        server: Option<&str>,
        tool: Option<&str>,
    ) -> Result<Vec<crate::rows::McpToolPinRow>, StoreError> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {MCP_PIN_COLUMNS} FROM mcp_tool_pins
             WHERE tenant = ?1 AND (?2 IS NULL OR server = ?2) AND (?3 IS NULL OR tool = ?3)
             ORDER BY server, tool"
        )))
        .bind(tenant)
        .bind(server)
        .bind(tool)
        .fetch_all(&self.read)
        .await?)
    }

    /// See [`crate::Store::pin_mcp_tool_first_use`].
    pub(crate) async fn pin_mcp_tool_first_use(
        &self,
        tenant: &str,
        server: &str,
        tool: &str,
        definition_hash: &str,
        accepted_by: &str,
    ) -> Result<crate::rows::McpToolPinRow, StoreError> {
        let mut tx = self.begin().await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO mcp_tool_pins
                 (tenant, server, tool, definition_hash, accepted_by, reason, accepted_at)
             VALUES (?1, ?2, ?3, ?4, ?5, 'trusted on first use', {NOW})
             ON CONFLICT (tenant, server, tool) DO NOTHING"
        )))
        .bind(tenant)
        .bind(server)
        .bind(tool)
        .bind(definition_hash)
        .bind(accepted_by)
        .execute(&mut *tx)
        .await?;
        let pin = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {MCP_PIN_COLUMNS} FROM mcp_tool_pins
             WHERE tenant = ?1 AND server = ?2 AND tool = ?3"
        )))
        .bind(tenant)
        .bind(server)
        .bind(tool)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(pin)
    }

    /// See [`crate::Store::accept_mcp_tool`].
    pub(crate) async fn accept_mcp_tool(
        &self,
        tenant: &str,
        server: &str,
        tool: &str,
        definition_hash: &str,
        accepted_by: &str,
        reason: &str,
    ) -> Result<crate::rows::McpToolPinRow, StoreError> {
        let mut tx = self.begin().await?;
        let pin = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "INSERT INTO mcp_tool_pins
                 (tenant, server, tool, definition_hash, accepted_by, reason, accepted_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, {NOW})
             ON CONFLICT (tenant, server, tool) DO UPDATE
             SET previous_hash = CASE WHEN mcp_tool_pins.definition_hash = excluded.definition_hash
                                      THEN mcp_tool_pins.previous_hash
                                      ELSE mcp_tool_pins.definition_hash END,
                 definition_hash = excluded.definition_hash,
                 accepted_by = excluded.accepted_by,
                 reason = excluded.reason,
                 accepted_at = excluded.accepted_at
             WHERE mcp_tool_pins.definition_hash <> excluded.definition_hash
             RETURNING {MCP_PIN_COLUMNS}"
        )))
        .bind(tenant)
        .bind(server)
        .bind(tool)
        .bind(definition_hash)
        .bind(accepted_by)
        .bind(reason)
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
        // Accepting the hash already pinned changes nothing (the WHERE leaves
        // the row alone and returns none): answer with the pin.
        match pin {
            Some(row) => Ok(row),
            None => self
                .mcp_tool_pins(tenant, Some(server), Some(tool))
                .await?
                .into_iter()
                .next()
                .ok_or_else(|| StoreError::NotFound(format!("MCP tool pin {server}/{tool}"))),
        }
    }

    /// See [`crate::Store::mcp_pin_task`].
    pub(crate) async fn mcp_pin_task(
        &self,
        task_id: Uuid,
    ) -> Result<Option<crate::rows::McpPinTask>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT tenant, kind, status, attempt, worker_id, spec FROM tasks WHERE task_id = ?1",
        )
        .bind(task_id)
        .fetch_optional(&self.read)
        .await?)
    }
}

// ---- audit of tool calls -------------------------------------------------
// The rules (what each event means for a call) are in `crate::tool_calls`.

impl Lite {
    /// See [`crate::Store::list_tool_calls`] and the PostgreSQL backend's
    /// (the same statement, with correlated sub-selects for its laterals).
    pub(crate) async fn list_tool_calls(
        &self,
        q: &crate::tool_calls::ToolCallQuery<'_>,
    ) -> Result<Vec<crate::tool_calls::ToolCallEvents>, StoreError> {
        use crate::tool_calls::END_KINDS;
        // A position between two ms lies after every row of its ms (see
        // `keyset`).
        let after = q.after.map(|(t, id, seq)| {
            if t.timestamp_subsec_nanos() % 1_000_000 == 0 {
                (ts(&t), id, seq)
            } else {
                (ts(&t), Uuid::max(), i64::MAX)
            }
        });
        let mut sql = sqlx::QueryBuilder::<Sqlite>::new("WITH page AS (");
        crate::tool_calls::push_page(&mut sql, q, after);
        sql.push(format_args!(
            "),
             found AS (
                 SELECT page.*,
                     (SELECT MIN(x.seq) FROM events x
                      WHERE x.run_id = page.run_id AND x.seq > page.seq AND x.kind = 'confirmation_decided'
                        AND x.payload->>'call_id' = page.payload->>'call_id') AS confirmation_seq,
                     (SELECT MAX(x.seq) FROM events x
                      WHERE x.run_id = page.run_id AND x.seq > page.seq AND x.kind IN {END_KINDS}
                        AND x.payload->>'call_id' = page.payload->>'call_id') AS end_seq,
                     (SELECT t.value->>'arguments'
                      FROM events x, json_each(x.payload, '$.tool_calls') t
                      WHERE page.kind = 'tool_call_refused' AND x.run_id = page.run_id AND x.seq < page.seq
                        AND x.kind = 'model_call_completed' AND t.value->>'id' = page.payload->>'tool_use_id'
                      ORDER BY x.seq DESC LIMIT 1) AS model_arguments
                 FROM page)
             SELECT p.run_id, p.seq, p.payload AS proposal, p.recorded_at AS proposed_at,
                    r.tenant, r.caller, c.payload AS confirmation,
                    e.payload AS end_payload, e.recorded_at AS ended_at, p.model_arguments
             FROM found p
             JOIN runs r ON r.run_id = p.run_id
             LEFT JOIN events c ON c.run_id = p.run_id AND c.seq = p.confirmation_seq
             LEFT JOIN events e ON e.run_id = p.run_id AND e.seq = p.end_seq
             ORDER BY p.recorded_at DESC, p.run_id DESC, p.seq DESC"
        ));
        Ok(sql.build_query_as().fetch_all(&self.read).await?)
    }
}
