//! The PostgreSQL backend.

use std::time::Duration;

use std::sync::{Arc, Mutex};

use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

use crate::rows::{
    ClaimedTask, DefinitionRow, EventRow, ExpiredLease, OutboxRow, RunRow, StoreError,
    TOOL_CACHE_COLUMNS, TaskRow, ToolCacheRow, UncertainQuery, UncertainRow,
};
use crate::transition::{Applied, STATE_CACHE_RUNS, StateCache, Target, TransitionError, Wake};
use belay_definitions::model::CircuitBreakerDef;
use belay_machine::gates::{self, Circuit, GateRow, GateVerdict};
use belay_machine::{Command, Decision, RunState, SealedSecret, TaskEnd};

use crate::transition::Wakes;
use wakes::{EVENTS_CHANNEL, TASKS_CHANNEL, WakeRelay};

pub(crate) mod notifications;
pub(crate) mod wakes;

/// SQL: whether the run of task `t` lets it be claimed (running or
/// waiting, or paused and the task runs while paused); NULL, so false, when
/// the run is gone. A scalar sub-select, which PostgreSQL does not flatten
/// into a join, so every plan looks the run up by primary key for each
/// candidate task in `tasks_ready` order: a join let a generic plan
/// prepared while the tables were small read every run (`Seq Scan on
/// runs`, kept as the table grew, until it was first analysed).
macro_rules! run_admits_task {
    () => {
        "(SELECT r.status IN ('running', 'waiting') OR (r.status = 'paused' AND t.runs_while_paused)
           FROM runs r WHERE r.run_id = t.run_id)"
    };
}

/// SQL: whether the lease of task `t` (leased) still holds at `$now` (an
/// SQL expression): its claim-time `lease_expires_at`, or a heartbeat's
/// extension of the same attempt in `task_heartbeats`. Heartbeats write
/// only that narrow table (migration `20261206000090`), so liveness does
/// not rewrite `tasks` rows (wide: the spec) or their index entries; a
/// task that ends before its first heartbeat (most do) never has a row
/// there, and the extension is looked up only once the claim-time lease
/// has passed.
macro_rules! lease_holds {
    ($now:literal) => {
        concat!(
            "(t.lease_expires_at > ",
            $now,
            " OR EXISTS (SELECT 1 FROM task_heartbeats h
                  WHERE h.task_id = t.task_id AND h.attempt = t.attempt AND h.lease_until > ",
            $now,
            "))"
        )
    };
}

/// Tells the wake-up relay that `LISTEN` ended when dropped.
struct NotListeningOnDrop<'a>(&'a WakeRelay);

impl Drop for NotListeningOnDrop<'_> {
    fn drop(&mut self) {
        self.0.listening(false);
    }
}

/// Aborts a spawned task when dropped (the `LISTEN` reader of
/// [`Pg::listen`] ends with its caller).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The PostgreSQL backend of [`Store`](crate::Store); cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Pg {
    pool: PgPool,
    /// Folded states of recently changed runs, so a transition folds only
    /// the events appended since (by any replica) instead of the whole
    /// history. Entries are only a cache: a state is used only when its
    /// `last_seq` is at most the run row's, read under the run lock, and the
    /// missing tail is folded from the events table.
    states: Arc<Mutex<StateCache>>,
    /// Wake-ups of committed transitions, sent after commit
    /// ([`wakes`]).
    wakes: WakeRelay,
}

const RUN_COLUMNS: &str = "run_id, tenant, workflow, workflow_version, status, status_reason, input, output, idempotency_key, caller, last_seq, created_at, updated_at";

/// A pooled connection idle this long is pinged before it is handed out.
const PING_IDLE_AFTER: Duration = Duration::from_secs(1);

impl Pg {
    /// Connect with a pool of at most `max_connections`.
    ///
    /// Errors: [`StoreError::Database`] when the database is unreachable.
    pub(crate) async fn connect(url: &str, max_connections: u32) -> Result<Pg, StoreError> {
        let options: PgConnectOptions = url.parse()?;
        // One plain connection first: an unreachable server, a refused login
        // or a missing database is reported as itself, at once, instead of
        // as a pool timeout after 10 s.
        let probe = tokio::time::timeout(
            Duration::from_secs(10),
            <sqlx::PgConnection as sqlx::Connection>::connect_with(&options),
        )
        .await
        .map_err(|_| {
            StoreError::Config(format!(
                "PostgreSQL at {} did not answer within 10 s",
                shown_url(url)
            ))
        })??;
        sqlx::Connection::close(probe).await?;
        // sqlx pings (a round trip) every connection it hands out by
        // default (and, unconditionally, every one given back, which also
        // closes one that broke in use); a connection used within the last
        // second is live but for
        // a server restart in that second, which fails the statement and
        // the transaction rolls back (the caller retries, and sqlx drops the
        // broken connection), so only a longer idle one is pinged.
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(10))
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= PING_IDLE_AFTER {
                        sqlx::Connection::ping(conn).await?;
                    }
                    Ok(true)
                })
            })
            .connect_with(options)
            .await?;
        Ok(Pg {
            wakes: WakeRelay::start(pool.clone()),
            pool,
            states: Arc::new(Mutex::new(StateCache::new(STATE_CACHE_RUNS))),
        })
    }

    /// The underlying pool (for LISTEN connections).
    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Apply pending migrations from `migrations/` (embedded at build time).
    pub(crate) async fn migrate(&self) -> Result<(), StoreError> {
        sqlx::migrate!("../../migrations/postgres")
            .run(&self.pool)
            .await?;
        Ok(())
    }

    /// One round trip to the database (health checks).
    pub(crate) async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// Relay wake-ups to `on_wake` until the connection fails (the caller
    /// reconnects): this process's own as they commit, other processes'
    /// through `LISTEN` ([`wakes`]).
    pub(crate) async fn listen(
        &self,
        on_wake: &mut (dyn FnMut(Wake) + Send),
    ) -> Result<(), StoreError> {
        // Subscribed before LISTEN, so nothing committed here in between
        // is missed.
        let mut local = self.wakes.subscribe_local();
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen_all([TASKS_CHANNEL, EVENTS_CHANNEL]).await?;
        // Wake-ups from other processes may have been missed before this.
        self.wakes.tasks_may_be_claimable();
        // Others send their wake-ups once they hear this process say hello;
        // until the connection is up again, this one sends all of its own.
        self.wakes.listening(true);
        let _not_listening = NotListeningOnDrop(&self.wakes);
        // The listener runs in its own task and hands over through a
        // channel, so that waiting on both sources cancels only
        // cancel-safe receives.
        let (tx, mut remote) = tokio::sync::mpsc::channel::<Result<Vec<Wake>, StoreError>>(256);
        let relay = self.wakes.clone();
        let reader = tokio::spawn(async move {
            loop {
                let item = match listener.try_recv().await {
                    Ok(Some(n)) => {
                        let wakes = relay.decode(n.channel(), n.payload());
                        if wakes.contains(&Wake::Tasks) {
                            relay.tasks_may_be_claimable();
                        }
                        Ok(wakes)
                    }
                    // The connection was lost (sqlx reconnects it on its
                    // own): notifications sent meanwhile are gone, so
                    // everyone looks again, and others hear this process
                    // again (they may have stopped sending to it).
                    Ok(None) => {
                        tracing::warn!("LISTEN connection lost; reconnecting");
                        relay.tasks_may_be_claimable();
                        relay.listening(true);
                        Ok(vec![Wake::Tasks, Wake::Outbox])
                    }
                    Err(e) => Err(StoreError::from(e)),
                };
                let failed = item.is_err();
                if tx.send(item).await.is_err() || failed {
                    return;
                }
            }
        });
        let _abort = AbortOnDrop(reader);
        loop {
            tokio::select! {
                item = remote.recv() => match item {
                    Some(Ok(wakes)) => wakes.into_iter().for_each(&mut *on_wake),
                    Some(Err(e)) => return Err(e),
                    None => return Err(StoreError::Config("the LISTEN connection ended".into())),
                },
                wake = local.recv() => match wake {
                    Ok(w) => on_wake(w),
                    // Fell behind: some wake-ups were dropped; look again.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        self.wakes.tasks_may_be_claimable();
                        on_wake(Wake::Tasks);
                        on_wake(Wake::Outbox);
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                        return Err(StoreError::Config("the store was closed".into()));
                    }
                },
            }
        }
    }

    // ---- tenants -------------------------------------------------------

    /// Replace a tenant's grants; returns them sorted.
    pub(crate) async fn set_tenant_grants(
        &self,
        tenant: &str,
        grants: &[String],
    ) -> Result<Vec<String>, StoreError> {
        let mut grants = grants.to_vec();
        grants.sort();
        grants.dedup();
        sqlx::query(
            "INSERT INTO tenants (tenant, grants) VALUES ($1, $2)
             ON CONFLICT (tenant) DO UPDATE SET grants = EXCLUDED.grants, updated_at = belay_now()",
        )
        .bind(tenant)
        .bind(&grants)
        .execute(&self.pool)
        .await?;
        Ok(grants)
    }

    /// A tenant's grants (empty if never configured).
    pub(crate) async fn tenant_grants(&self, tenant: &str) -> Result<Vec<String>, StoreError> {
        let row: Option<(Vec<String>,)> =
            sqlx::query_as("SELECT grants FROM tenants WHERE tenant = $1")
                .bind(tenant)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(|r| r.0).unwrap_or_default())
    }

    // ---- definitions ---------------------------------------------------

    /// Names of every registered definition of a kind for a tenant.
    pub(crate) async fn definition_names(
        &self,
        tenant: &str,
        kind: &str,
    ) -> Result<Vec<String>, StoreError> {
        let rows: Vec<(String,)> =
            sqlx::query_as("SELECT DISTINCT name FROM definitions WHERE tenant = $1 AND kind = $2")
                .bind(tenant)
                .bind(kind)
                .fetch_all(&self.pool)
                .await?;
        Ok(rows.into_iter().map(|r| r.0).collect())
    }

    /// Register definitions in one transaction: identical content (same hash)
    /// returns the existing version, new content gets the next version.
    /// Input: `(kind, name, content_hash, body, source_file)`. Output: rows and
    /// whether each was created.
    pub(crate) async fn register_definitions(
        &self,
        tenant: &str,
        defs: &[(String, String, String, Value, String)],
    ) -> Result<Vec<(DefinitionRow, bool)>, StoreError> {
        let mut tx = self.pool.begin().await?;
        // Serialise registrations of one tenant so version numbers do not race.
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 7))")
            .bind(tenant)
            .execute(&mut *tx)
            .await?;
        let mut out = Vec::with_capacity(defs.len());
        for (kind, name, hash, body, source_file) in defs {
            let existing: Option<DefinitionRow> = sqlx::query_as(
                "SELECT kind, name, version, content_hash, body, created_at FROM definitions
                 WHERE tenant = $1 AND kind = $2 AND name = $3 AND content_hash = $4",
            )
            .bind(tenant)
            .bind(kind)
            .bind(name)
            .bind(hash)
            .fetch_optional(&mut *tx)
            .await?;
            if let Some(row) = existing {
                // Identical content registered again becomes current again.
                sqlx::query(
                    "UPDATE definitions SET registered_at = clock_timestamp()
                     WHERE tenant = $1 AND kind = $2 AND name = $3 AND version = $4",
                )
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
                "INSERT INTO definitions (tenant, kind, name, version, content_hash, body, source_file, registered_at)
                 VALUES ($1, $2, $3,
                    (SELECT COALESCE(MAX(version), 0) + 1 FROM definitions WHERE tenant = $1 AND kind = $2 AND name = $3),
                    $4, $5, $6, clock_timestamp())
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

    /// Definitions of a tenant, optionally of one kind, by kind, name, version.
    pub(crate) async fn list_definitions(
        &self,
        tenant: &str,
        kind: Option<&str>,
    ) -> Result<Vec<DefinitionRow>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT kind, name, version, content_hash, body, created_at FROM definitions
             WHERE tenant = $1 AND ($2::text IS NULL OR kind = $2)
             ORDER BY kind, name, version",
        )
        .bind(tenant)
        .bind(kind)
        .fetch_all(&self.pool)
        .await?)
    }

    /// The newest version of a definition.
    pub(crate) async fn latest_definition(
        &self,
        tenant: &str,
        kind: &str,
        name: &str,
    ) -> Result<Option<DefinitionRow>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT kind, name, version, content_hash, body, created_at FROM definitions
             WHERE tenant = $1 AND kind = $2 AND name = $3
             ORDER BY registered_at DESC, version DESC LIMIT 1",
        )
        .bind(tenant)
        .bind(kind)
        .bind(name)
        .fetch_optional(&self.pool)
        .await?)
    }

    // ---- runs ------------------------------------------------------------

    /// The run with this idempotency key, if any.
    pub(crate) async fn run_by_idempotency_key(
        &self,
        tenant: &str,
        key: &str,
    ) -> Result<Option<RunRow>, StoreError> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE tenant = $1 AND idempotency_key = $2"
        )))
        .bind(tenant)
        .bind(key)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Create a run and apply its first decision in one transaction. If the
    /// idempotency key already names a run, nothing is written and that run
    /// is returned with `false`.
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
        let mut tx = self.pool.begin().await?;
        let inserted = sqlx::query(
            "INSERT INTO runs (run_id, tenant, workflow, workflow_version, status, input, idempotency_key, caller,
                               parent_run_id, parent_call_id)
             VALUES ($1, $2, $3, $4, 'pending', $5, $6, $7, $8, $9)
             ON CONFLICT (tenant, idempotency_key) DO NOTHING",
        )
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
        let wakes =
            write_decision(&mut tx, run_id, tenant, 0, decision, &state, None, None).await?;
        tx.commit().await?;
        self.wakes.send(run_id, wakes);
        let row = self
            .get_run(tenant, run_id)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("run {run_id}")))?;
        Ok((row, true))
    }

    /// One run of a tenant.
    pub(crate) async fn get_run(
        &self,
        tenant: &str,
        run_id: Uuid,
    ) -> Result<Option<RunRow>, StoreError> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE tenant = $1 AND run_id = $2"
        )))
        .bind(tenant)
        .bind(run_id)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// How many ancestors `run_id` has, counting at most `limit + 1`.
    pub(crate) async fn run_depth(&self, run_id: Uuid, limit: u32) -> Result<u32, StoreError> {
        let depth: i64 = sqlx::query_scalar(
            "WITH RECURSIVE chain (parent_run_id, depth) AS (
                 SELECT parent_run_id, 0 FROM runs WHERE run_id = $1
               UNION ALL
                 SELECT r.parent_run_id, c.depth + 1
                 FROM runs r JOIN chain c ON r.run_id = c.parent_run_id
                 WHERE c.depth <= $2
             )
             SELECT CAST(COALESCE(MAX(depth), 0) AS BIGINT) FROM chain",
        )
        .bind(run_id)
        .bind(i32::try_from(limit).unwrap_or(i32::MAX))
        .fetch_one(&self.pool)
        .await?;
        Ok(u32::try_from(depth).unwrap_or(u32::MAX))
    }

    /// Runs of a tenant, newest first, keyset-paged by `(created_at, run_id)`.
    pub(crate) async fn list_runs(
        &self,
        tenant: &str,
        status: Option<&str>,
        after: Option<(chrono::DateTime<chrono::Utc>, Uuid)>,
        limit: i64,
    ) -> Result<Vec<RunRow>, StoreError> {
        let (after_ts, after_id) = match after {
            Some((ts, id)) => (Some(ts), Some(id)),
            None => (None, None),
        };
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {RUN_COLUMNS} FROM runs
             WHERE tenant = $1 AND ($2::text IS NULL OR status = $2)
               AND ($3::timestamptz IS NULL OR (created_at, run_id) < ($3, $4))
             ORDER BY created_at DESC, run_id DESC LIMIT $5"
        )))
        .bind(tenant)
        .bind(status)
        .bind(after_ts)
        .bind(after_id)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Events of a run with `seq > after_seq`, at most `limit`.
    pub(crate) async fn list_events(
        &self,
        run_id: Uuid,
        after_seq: i64,
        limit: i64,
    ) -> Result<Vec<EventRow>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT run_id, seq, kind, payload, recorded_at FROM events
             WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
        )
        .bind(run_id)
        .bind(after_seq)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }

    /// See [`Store::transition`](crate::Store::transition).
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
        let mut tx = self.pool.begin().await.map_err(StoreError::from)?;
        // Lock order everywhere: run row, then task row. Both are locked by
        // one statement (one round trip): the CTE locks the run row, then the
        // lateral sub-select locks the task row of that run. The task is
        // found by its key alone: `(run_id = r.run_id) IS TRUE` is no index
        // condition, so a generic plan made while `tasks` was empty cannot
        // pick the (run_id, call_id) index and read every task of the run
        // (seen with auto_explain: a 300-call run's lock read 150 rows).
        let (target, dispatch) = target.split_dispatch();
        let (run_id, task_id) = match target {
            Target::Run(run_id, task_id) => (Some(run_id), task_id),
            Target::Task(task_id) | Target::Dispatch(task_id) => (None, Some(task_id)),
        };
        let row: Option<LockedRow> = sqlx::query_as(concat!(
            "WITH clock AS MATERIALIZED (SELECT belay_now() AS now),
             r AS (
                 SELECT run_id, tenant, last_seq FROM runs
                 WHERE run_id = COALESCE($1, (SELECT run_id FROM tasks WHERE task_id = $2))
                 FOR UPDATE)
             SELECT r.run_id, r.tenant, r.last_seq, (SELECT now FROM clock) AS now,
                    t.task_id, t.call_id, t.kind, t.status, t.attempt, t.worker_id, t.dispatched,
                    t.dispatched_at, t.lease_expired,
                    CASE WHEN $3 THEN (SELECT grants FROM tenants WHERE tenant = r.tenant) END AS tenant_grants
             FROM r LEFT JOIN LATERAL (
                 SELECT t.task_id, t.call_id, t.kind, t.status, t.attempt, t.worker_id, t.dispatched,
                        t.dispatched_at,
                        (t.lease_expires_at IS NOT NULL AND NOT ",
            lease_holds!("(SELECT now FROM clock)"),
            ") AS lease_expired
                 FROM tasks t WHERE t.task_id = $2 AND (t.run_id = r.run_id) IS TRUE
                 FOR UPDATE) t ON true"
        ))
        .bind(run_id)
        .bind(task_id)
        .bind(dispatch)
        .fetch_optional(&mut *tx)
        .await
        .map_err(StoreError::from)?;
        let Some(row) = row else {
            return Err(StoreError::NotFound(match target {
                Target::Run(run_id, _) => format!("run {run_id}"),
                Target::Task(task_id) | Target::Dispatch(task_id) => format!("task {task_id}"),
            })
            .into());
        };
        let (run_id, tenant, last_seq) = (row.run_id, row.tenant.clone(), row.last_seq);
        let task = match task_id {
            Some(task_id) => Some(
                row.task()
                    .ok_or_else(|| StoreError::NotFound(format!("task {task_id}")))?,
            ),
            None => None,
        };
        // Start from the cached state when it is not ahead of the run row
        // (it never is, unless a transaction that produced it rolled back
        // after the cache was filled, which `put` after commit prevents).
        let cached = self
            .cache()
            .take(&run_id)
            .filter(|s| s.last_seq <= last_seq as u64);
        let mut state = load_state(&mut tx, run_id, cached, Some(last_seq as u64)).await?;
        if state.last_seq != last_seq as u64 {
            return Err(StoreError::Corrupt(format!(
                "run {run_id}: last_seq {last_seq} but {} events",
                state.last_seq
            ))
            .into());
        }
        state.now = Some(row.now);
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
        let mut wakes = write_decision(
            &mut tx,
            run_id,
            &tenant,
            last_seq,
            &decision,
            &after,
            Some(row.now),
            task.as_ref().map(|t| (t.call_id.as_str(), t.task_id)),
        )
        .await?;
        let secrets = std::mem::take(&mut wakes.secrets);
        tx.commit().await.map_err(StoreError::from)?;
        self.wakes.send(run_id, wakes);
        let applied = Applied {
            first_seq: last_seq as u64 + 1,
            events: decision.events.len(),
            status: after.status.as_str(),
            secrets,
        };
        // Only a committed state may be cached.
        self.cache().put(run_id, after);
        Ok(applied)
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, StateCache> {
        // The cache holds no invariant a panic could break: ignore poisoning.
        self.states
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The folded state of a run (for reads and tests).
    pub(crate) async fn run_state(&self, run_id: Uuid) -> Result<RunState, StoreError> {
        let mut tx = self.pool.begin().await?;
        let state = load_state(&mut tx, run_id, None, None).await?;
        tx.commit().await?;
        Ok(state)
    }

    // ---- tasks -----------------------------------------------------------

    /// Claim up to `max` ready tasks (see [`Pg::claim_tasks_or_next`]).
    pub(crate) async fn claim_tasks(
        &self,
        worker_id: &str,
        max: i64,
        lease_ms: i64,
    ) -> Result<Vec<ClaimedTask>, StoreError> {
        Ok(self.claim_tasks_or_next(worker_id, max, lease_ms).await?.0)
    }

    /// Claim up to `max` ready tasks of running runs for `worker_id`, with a
    /// lease of `lease_ms` by the database clock. Each claim increments the
    /// task's attempt (the fencing token). When fewer than `max` are
    /// claimed, also says when the earliest other ready task becomes
    /// claimable (as [`Pg::next_ready_in_ms`], leaving out the tasks just
    /// claimed, which the statement's snapshot still sees ready), in the
    /// same statement: the coordinator then knows how long nothing is
    /// claimable (`NothingClaimable`).
    pub(crate) async fn claim_tasks_or_next(
        &self,
        worker_id: &str,
        max: i64,
        lease_ms: i64,
    ) -> Result<(Vec<ClaimedTask>, Option<i64>), StoreError> {
        let rows: Vec<ClaimOrNext> = sqlx::query_as(concat!(
            "WITH clock AS MATERIALIZED (SELECT belay_now() AS now),
             picked AS (
                 SELECT t.task_id FROM tasks t
                 WHERE t.status = 'ready' AND t.available_at <= (SELECT now FROM clock)
                   AND ",
            run_admits_task!(),
            "
                 ORDER BY t.available_at, t.task_id
                 LIMIT $2
                 FOR UPDATE OF t SKIP LOCKED),
             claimed AS (
                 UPDATE tasks t SET status = 'leased', attempt = t.attempt + 1, worker_id = $1,
                        lease_expires_at = clock.now + make_interval(secs => $3::float8 / 1000.0),
                        dispatched = false, updated_at = clock.now
                 FROM picked, clock WHERE t.task_id = picked.task_id
                 RETURNING t.task_id, t.run_id, t.tenant, t.kind, t.attempt, t.spec, t.idempotency_key)
             SELECT task_id, run_id, tenant, kind, attempt, spec, idempotency_key,
                    NULL::float8 AS next_ready_ms
             FROM claimed
             UNION ALL
             SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                    -- ORDER BY + LIMIT 1, not MIN(): PostgreSQL turns MIN
                    -- over a join into reading every ready task and run.
                    (SELECT (EXTRACT(EPOCH FROM (t.available_at - (SELECT now FROM clock))) * 1000)::float8
                     FROM tasks t
                     WHERE t.status = 'ready' AND t.task_id NOT IN (SELECT task_id FROM claimed) AND ",
            run_admits_task!(),
            "
                     ORDER BY t.available_at, t.task_id LIMIT 1)
             WHERE (SELECT count(*) FROM claimed) < $2"
        ))
        .bind(worker_id)
        .bind(max)
        .bind(lease_ms as f64)
        .fetch_all(&self.pool)
        .await?;
        let mut tasks = Vec::with_capacity(rows.len());
        let mut next = None;
        for row in rows {
            match row.task() {
                Some(task) => tasks.push(task),
                None => next = row.next_ready_ms.map(|ms| ms.max(0.0) as i64),
            }
        }
        Ok((tasks, next))
    }

    /// Extend the leases a worker still holds (not yet expired, same
    /// attempt). Returns the `(task_id, attempt)` pairs extended.
    pub(crate) async fn heartbeat(
        &self,
        worker_id: &str,
        leases: &[(Uuid, i32)],
        lease_ms: i64,
    ) -> Result<Vec<(Uuid, i32)>, StoreError> {
        let ids: Vec<Uuid> = leases.iter().map(|l| l.0).collect();
        let attempts: Vec<i32> = leases.iter().map(|l| l.1).collect();
        // Written to `task_heartbeats` only (see `lease_holds!`). The task
        // rows are read, not locked: a sweep that judges a lease expired
        // while this commits may still expire it, and the worker, told
        // "held", is refused at its next report by the attempt fence, as
        // when a lease is lost between two heartbeats. An extension never
        // goes back to an older attempt.
        let rows: Vec<(Uuid, i32)> = sqlx::query_as(concat!(
            "INSERT INTO task_heartbeats AS h (task_id, attempt, lease_until)
             SELECT t.task_id, t.attempt, belay_now() + make_interval(secs => $4::float8 / 1000.0)
             FROM UNNEST($2::uuid[], $3::int4[]) AS l(task_id, attempt)
             CROSS JOIN LATERAL (SELECT * FROM tasks t WHERE t.task_id = l.task_id) t
             WHERE t.attempt = l.attempt AND t.status = 'leased' AND t.worker_id = $1
               AND ",
            lease_holds!("belay_now()"),
            "
             ON CONFLICT (task_id) DO UPDATE SET attempt = EXCLUDED.attempt, lease_until = EXCLUDED.lease_until
                WHERE h.attempt <= EXCLUDED.attempt
             RETURNING h.task_id, h.attempt"
        ))
        .bind(worker_id)
        .bind(&ids)
        .bind(&attempts)
        .bind(lease_ms as f64)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    /// Leases that have expired by the database clock, oldest first.
    pub(crate) async fn expired_leases(&self, limit: i64) -> Result<Vec<ExpiredLease>, StoreError> {
        Ok(sqlx::query_as(concat!(
            "SELECT t.task_id, t.run_id, t.attempt FROM tasks t
             WHERE t.status = 'leased' AND t.lease_expires_at <= belay_now() AND NOT ",
            lease_holds!("belay_now()"),
            " ORDER BY t.lease_expires_at LIMIT $1"
        ))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Earliest time a `ready` task becomes claimable, in ms from now (0 if
    /// one is claimable now), or `None` when no task is ready.
    pub(crate) async fn next_ready_in_ms(&self) -> Result<Option<i64>, StoreError> {
        let row: Option<(Option<f64>,)> = sqlx::query_as(concat!(
            "SELECT (EXTRACT(EPOCH FROM (t.available_at - belay_now())) * 1000)::float8
                 FROM tasks t
                 WHERE t.status = 'ready' AND ",
            run_admits_task!(),
            " ORDER BY t.available_at, t.task_id LIMIT 1"
        ))
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.and_then(|r| r.0).map(|ms| ms.max(0.0) as i64))
    }

    /// [`crate::Store::expire_task_timers`].
    pub(crate) async fn expire_task_timers(
        &self,
        task_id: Option<Uuid>,
    ) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "UPDATE tasks SET
                 lease_expires_at = CASE WHEN status = 'leased' THEN belay_now() - interval '1 millisecond' ELSE lease_expires_at END,
                 available_at = CASE WHEN status = 'ready' AND available_at > belay_now() THEN belay_now() ELSE available_at END
             WHERE status IN ('leased', 'ready') AND ($1::uuid IS NULL OR task_id = $1)",
        )
        .bind(task_id)
        .execute(&self.pool)
        .await?;
        // Heartbeats' extensions go too.
        sqlx::query("DELETE FROM task_heartbeats WHERE $1::uuid IS NULL OR task_id = $1")
            .bind(task_id)
            .execute(&self.pool)
            .await?;
        self.wakes.tasks_may_be_claimable();
        Ok(done.rows_affected())
    }

    pub(crate) async fn close(&self) {
        self.pool.close().await;
    }

    pub(crate) async fn due_timers(
        &self,
        limit: i64,
    ) -> Result<Vec<(Uuid, String, i64)>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT run_id, timer_id,
                    GREATEST(0, (EXTRACT(EPOCH FROM (belay_now() - fire_at)) * 1000)::BIGINT)
               FROM timers WHERE fire_at <= belay_now()
             ORDER BY fire_at, run_id, timer_id LIMIT $1",
        )
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }

    pub(crate) async fn callback_run(
        &self,
        token_sha256: &str,
    ) -> Result<Option<Uuid>, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT run_id FROM callbacks WHERE token_sha256 = $1")
                .bind(token_sha256)
                .fetch_optional(&self.pool)
                .await?,
        )
    }

    pub(crate) async fn advance_clock(&self, ms: i64) -> Result<(), StoreError> {
        sqlx::query("UPDATE belay_clock SET offset_ms = offset_ms + $1 WHERE id = 1")
            .bind(ms)
            .execute(&self.pool)
            .await?;
        // Delayed tasks may be due now.
        self.wakes.tasks_may_be_claimable();
        Ok(())
    }

    pub(crate) fn tasks_wake_seq(&self) -> u64 {
        self.wakes.tasks_seq()
    }

    pub(crate) async fn clock_now(&self) -> Result<chrono::DateTime<chrono::Utc>, StoreError> {
        Ok(sqlx::query_scalar("SELECT belay_now()")
            .fetch_one(&self.pool)
            .await?)
    }

    pub(crate) async fn claim_outbox(
        &self,
        limit: i64,
        lease_ms: i64,
    ) -> Result<Vec<OutboxRow>, StoreError> {
        Ok(sqlx::query_as(
            "WITH due AS (
                 SELECT outbox_id FROM outbox
                 WHERE done_at IS NULL AND next_attempt_at <= belay_now()
                 ORDER BY next_attempt_at, outbox_id
                 LIMIT $1
                 FOR UPDATE SKIP LOCKED)
             UPDATE outbox o SET attempts = o.attempts + 1,
                    next_attempt_at = belay_now() + $2::float8 * interval '1 millisecond'
             FROM due WHERE o.outbox_id = due.outbox_id
             RETURNING o.outbox_id, o.kind, o.run_id, o.payload, o.attempts",
        )
        .bind(limit)
        .bind(lease_ms as f64)
        .fetch_all(&self.pool)
        .await?)
    }

    pub(crate) async fn finish_outbox(
        &self,
        outbox_id: Uuid,
        error: Option<&str>,
    ) -> Result<(), StoreError> {
        match error {
            None => sqlx::query(
                "UPDATE outbox SET done_at = belay_now(), last_error = NULL WHERE outbox_id = $1",
            )
            .bind(outbox_id)
            .execute(&self.pool)
            .await?,
            Some(e) => {
                sqlx::query("UPDATE outbox SET last_error = $2 WHERE outbox_id = $1")
                    .bind(outbox_id)
                    .bind(e)
                    .execute(&self.pool)
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
        sqlx::query(
            "UPDATE tasks SET status = 'cancelled', lease_expires_at = NULL, updated_at = belay_now()
             WHERE task_id = $1 AND attempt = $2 AND status = 'leased'",
        )
        .bind(task_id)
        .bind(attempt)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    // ---- uncertain outcomes --------------------------------------------

    /// Uncertain-outcome records of a run.
    pub(crate) async fn uncertain_for_run(
        &self,
        run_id: Uuid,
    ) -> Result<Vec<UncertainRow>, StoreError> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {UNCERTAIN_COLUMNS} FROM uncertain_outcomes WHERE run_id = $1 ORDER BY created_at"
        )))
        .bind(run_id)
        .fetch_all(&self.pool)
        .await?)
    }

    /// One uncertain-outcome record of a tenant.
    pub(crate) async fn get_uncertain(
        &self,
        tenant: &str,
        id: Uuid,
    ) -> Result<Option<UncertainRow>, StoreError> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {UNCERTAIN_COLUMNS} FROM uncertain_outcomes WHERE tenant = $1 AND uncertain_id = $2"
        )))
        .bind(tenant)
        .bind(id)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Uncertain-outcome records of a tenant, newest first, filtered and
    /// keyset-paged by `(created_at, uncertain_id)`. Ages are judged by the
    /// database clock, in ms.
    pub(crate) async fn list_uncertain(
        &self,
        f: &UncertainQuery<'_>,
    ) -> Result<Vec<UncertainRow>, StoreError> {
        let (after_ts, after_id) = match f.after {
            Some((ts, id)) => (Some(ts), Some(id)),
            None => (None, None),
        };
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {UNCERTAIN_COLUMNS} FROM uncertain_outcomes
             WHERE tenant = $1
               AND ($2::text IS NULL OR status = $2)
               AND ($3::text IS NULL OR tool = $3)
               AND ($4::uuid IS NULL OR run_id = $4)
               AND ($5::float8 IS NULL OR created_at <= belay_now() - make_interval(secs => $5 / 1000.0))
               AND ($6::float8 IS NULL OR created_at >= belay_now() - make_interval(secs => $6 / 1000.0))
               AND ($7::timestamptz IS NULL OR (created_at, uncertain_id) < ($7, $8))
             ORDER BY created_at DESC, uncertain_id DESC LIMIT $9"
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
        .fetch_all(&self.pool)
        .await?)
    }
}

const UNCERTAIN_COLUMNS: &str = "uncertain_id, tenant, run_id, task_id, call_id, node_id, tool, tool_version, arguments,
    idempotency_key, attempts, worker_id, reason, status, created_at, resolution, resolution_kind, resolved_by,
    resolved_at, resolved_via, resolution_reason, probe, discrepancy, occurrence";

/// A database URL without its password, for messages.
fn shown_url(url: &str) -> String {
    match split_credentials(url) {
        Some((scheme, rest)) => format!("{scheme}://{rest}"),
        None => "the configured URL".to_owned(),
    }
}

/// `(scheme, host-and-path)` of `scheme://[user[:password]@]host…`, the
/// credentials dropped.
fn split_credentials(url: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    Some((scheme, rest))
}

/// Write an outbox row (in the transition's transaction).
async fn insert_outbox(
    tx: &mut Transaction<'static, Postgres>,
    run_id: Uuid,
    kind: &str,
    payload: &Value,
) -> Result<(), StoreError> {
    sqlx::query("INSERT INTO outbox (outbox_id, kind, run_id, payload) VALUES ($1, $2, $3, $4)")
        .bind(Uuid::now_v7())
        .bind(kind)
        .bind(run_id)
        .bind(payload)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// An RFC 3339 time (the machine writes them; a bad one is treated as "now").
fn parse_time(s: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&chrono::Utc))
}

/// Fold a run's events (inside the transition's transaction).
/// Fold a run's events after `from` (a state known to be a prefix of the
/// history: its `last_seq` events), or from the start.
/// The run row and (for a task's transition) the task row, locked by the
/// first statement of a transition.
#[derive(sqlx::FromRow)]
struct LockedRow {
    run_id: Uuid,
    tenant: String,
    last_seq: i64,
    /// The engine's clock (the time of the transition, `RunState::now`).
    now: chrono::DateTime<chrono::Utc>,
    task_id: Option<Uuid>,
    call_id: Option<String>,
    kind: Option<String>,
    status: Option<String>,
    attempt: Option<i32>,
    worker_id: Option<String>,
    dispatched: Option<bool>,
    dispatched_at: Option<chrono::DateTime<chrono::Utc>>,
    lease_expired: Option<bool>,
    tenant_grants: Option<Vec<String>>,
}

impl LockedRow {
    /// The task row, if one was asked for and belongs to the run.
    fn task(&self) -> Option<TaskRow> {
        Some(TaskRow {
            task_id: self.task_id?,
            run_id: self.run_id,
            call_id: self.call_id.clone()?,
            kind: self.kind.clone()?,
            status: self.status.clone()?,
            attempt: self.attempt?,
            worker_id: self.worker_id.clone(),
            dispatched: self.dispatched?,
            dispatched_at: self.dispatched_at,
            lease_expired: self.lease_expired?,
            tenant_grants: self.tenant_grants.clone().unwrap_or_default(),
        })
    }
}

/// The run's state: `from` (a cached prefix) plus the events after it. With
/// `known_last_seq` (the locked run row's), a prefix that is already that
/// far is returned without a query.
async fn load_state(
    tx: &mut Transaction<'static, Postgres>,
    run_id: Uuid,
    from: Option<RunState>,
    known_last_seq: Option<u64>,
) -> Result<RunState, StoreError> {
    let mut state = from.unwrap_or_default();
    if known_last_seq == Some(state.last_seq) && state.last_seq > 0 {
        // The cached state is the run row's: no event to read.
        return Ok(state);
    }
    let rows: Vec<(i64, Value)> = sqlx::query_as(
        "SELECT seq, payload FROM events WHERE run_id = $1 AND seq > $2 ORDER BY seq",
    )
    .bind(run_id)
    .bind(state.last_seq as i64)
    .fetch_all(&mut **tx)
    .await?;
    crate::transition::fold_tail(&mut state, run_id, rows)?;
    Ok(state)
}

/// The task writes of a decision whose commands are only the hot path's
/// (schedule, retry, mark dispatched, end), each on a different call, and
/// whose updates are all of the transition's own locked task: they
/// go into the statement that appends the events and updates the run row,
/// as data-modifying CTEs over arrays (one round trip and one executor start
/// instead of one per command; belay-bench measured the round trips to
/// PostgreSQL as the largest part of the engine's and the server's CPU per
/// step). The CTEs of one statement see the same snapshot and PostgreSQL
/// cannot update one row twice in one statement, so a decision that touches
/// a call twice, updates another task, or has any other command, is written
/// one command at a time instead ([`TaskWrites::of`] answers `None`).
#[derive(Default)]
struct TaskWrites<'a> {
    schedule_ids: Vec<Uuid>,
    schedule_calls: Vec<&'a str>,
    schedule_kinds: Vec<&'static str>,
    schedule_specs: Vec<&'a Value>,
    schedule_keys: Vec<&'a str>,
    schedule_safety: Vec<Option<&'static str>>,
    schedule_paused: Vec<bool>,
    /// The update of the transition's own locked task (at most one: the
    /// calls are distinct), as `(task_id, write)`: by primary key, a scalar
    /// parameter.
    own: Option<(Uuid, OwnWrite)>,
}

/// What the merged statement does to the transition's own task.
#[derive(Debug, Clone, Copy, PartialEq)]
enum OwnWrite {
    /// Back to `ready` after a backoff, ms.
    Retry(f64),
    /// Marked dispatched for this attempt.
    Dispatch(i32),
    /// Ended with this `tasks.status`.
    End(&'static str),
}

impl<'a> TaskWrites<'a> {
    /// The task writes of `commands`, or `None` when they cannot share one
    /// statement (another command, one call touched twice, or an update of
    /// a task other than `own`, the transition's locked task as `(call_id,
    /// task_id)`).
    fn of(commands: &'a [Command], own: Option<(&str, Uuid)>) -> Option<TaskWrites<'a>> {
        let mut w = TaskWrites::default();
        let own_id = |call_id: &str| own.filter(|(c, _)| *c == call_id).map(|(_, id)| id);
        let mut calls = std::collections::HashSet::new();
        for command in commands {
            let call = match command {
                Command::ScheduleTask {
                    call_id,
                    kind,
                    spec,
                    idempotency_key,
                    repeat_safety,
                    runs_while_paused,
                } => {
                    w.schedule_ids.push(Uuid::now_v7());
                    w.schedule_calls.push(call_id);
                    w.schedule_kinds.push(kind.as_str());
                    w.schedule_specs.push(spec);
                    w.schedule_keys.push(idempotency_key);
                    w.schedule_safety.push(repeat_safety.map(|r| r.as_str()));
                    w.schedule_paused.push(*runs_while_paused);
                    call_id
                }
                Command::RetryTask { call_id, delay_ms } => {
                    w.set_own(own_id(call_id)?, OwnWrite::Retry(*delay_ms as f64))?;
                    call_id
                }
                Command::MarkDispatched { call_id, attempt } => {
                    let attempt = i32::try_from(*attempt).ok()?;
                    w.set_own(own_id(call_id)?, OwnWrite::Dispatch(attempt))?;
                    call_id
                }
                Command::EndTask { call_id, end } => {
                    w.set_own(own_id(call_id)?, OwnWrite::End(task_end_status(end)))?;
                    call_id
                }
                // Served before the decision is written.
                Command::PassToolGates { .. } | Command::LookupToolCache { .. } => continue,
                _ => return None,
            };
            if !calls.insert(call.as_str()) {
                return None;
            }
        }
        Some(w)
    }

    /// Record the one update of the own task; `None` if there already is
    /// one (the same row cannot be updated twice in one statement).
    fn set_own(&mut self, task_id: Uuid, write: OwnWrite) -> Option<()> {
        match self.own {
            Some(_) => None,
            None => {
                self.own = Some((task_id, write));
                Some(())
            }
        }
    }
}

impl TaskWrites<'_> {
    /// The statement that appends the events (`$1` run, `$2..$4` seqs,
    /// kinds, payloads, `$9` tenant), updates the run row (`$5..$8`), with
    /// the clock `$10`, and writes the tasks: the CTEs of the non-empty
    /// kinds only, their parameters numbered on from `$11` in the order
    /// schedule (7), then the own task's update (2: its id, and the
    /// retry's backoff ms, the dispatch's attempt or the end's status).
    fn statement(&self) -> String {
        let mut sql = String::from(
            "WITH clock AS MATERIALIZED (SELECT COALESCE($10::timestamptz, belay_now()) AS now),
             ins AS (
                 INSERT INTO events (run_id, seq, kind, payload, tenant)
                 SELECT $1, s, k, p, $9 FROM UNNEST($2::int8[], $3::text[], $4::jsonb[]) AS e(s, k, p)),
             upd AS (
                 UPDATE runs SET status = $5, status_reason = $6, output = $7, last_seq = $8,
                        updated_at = (SELECT now FROM clock)
                 WHERE run_id = $1 RETURNING parent_run_id)",
        );
        // The own task's update finds its row by primary key, a scalar
        // parameter. Finding it by call id let a generic plan read the run's
        // whole index range or every leased task (a join with UNNEST: ~3 500
        // entries a statement in belay-bench; `call_id = ANY(...)`: all the
        // run's tasks; `status = 'leased'`: a BitmapAnd with
        // `tasks_leased`), and `task_id = ANY($n)`, whose array the planner
        // takes for 10 elements, made the generic plan of a connection
        // prepared while `tasks` was small a sequential scan of the whole
        // table, kept as the table grew (517 pages a statement in
        // belay-bench, on a table not yet analysed).
        let mut n = 10;
        if !self.schedule_ids.is_empty() {
            sql += &format!(
                ", sched AS (
                 INSERT INTO tasks (task_id, run_id, tenant, call_id, kind, status, spec, idempotency_key,
                                    repeat_safety, runs_while_paused, available_at, created_at, updated_at)
                 SELECT id, $1, $9, c, k, 'ready', sp, ik, rs, rp, clock.now, clock.now, clock.now
                 FROM UNNEST(${}::uuid[], ${}::text[], ${}::text[], ${}::jsonb[], ${}::text[], ${}::text[],
                             ${}::bool[]) AS n(id, c, k, sp, ik, rs, rp), clock)",
                n + 1,
                n + 2,
                n + 3,
                n + 4,
                n + 5,
                n + 6,
                n + 7
            );
            n += 7;
        }
        if let Some((_, write)) = self.own {
            let (id, value) = (n + 1, n + 2);
            let (cte, set, filter) = match write {
                OwnWrite::Retry(_) => (
                    "retry",
                    format!(
                        "status = 'ready', lease_expires_at = NULL, worker_id = NULL, dispatched = false,
                        available_at = (SELECT now FROM clock) + make_interval(secs => ${value}::float8 / 1000.0)"
                    ),
                    String::new(),
                ),
                OwnWrite::Dispatch(_) => (
                    "disp",
                    "dispatched = true, dispatched_attempt = t.attempt,
                        dispatched_at = (SELECT now FROM clock)"
                        .to_owned(),
                    format!(" AND (t.status = 'leased') IS TRUE AND t.attempt = ${value}::int4"),
                ),
                OwnWrite::End(_) => (
                    "ends",
                    format!("status = ${value}::text, lease_expires_at = NULL"),
                    String::new(),
                ),
            };
            sql += &format!(
                ", {cte} AS (
                 UPDATE tasks t SET {set}, updated_at = (SELECT now FROM clock)
                 WHERE t.task_id = ${id}::uuid{filter})"
            );
        }
        sql += " SELECT (SELECT parent_run_id FROM upd)";
        sql
    }
}

/// The `tasks.status` a task ends with.
fn task_end_status(end: &TaskEnd) -> &'static str {
    match end {
        TaskEnd::Completed => "completed",
        TaskEnd::Failed => "failed",
        TaskEnd::Uncertain => "uncertain",
        TaskEnd::Cancelled => "cancelled",
    }
}

/// Append the decision's events after `last_seq`, perform its commands, and
/// update the run row from the state `after` the events. Returns what to
/// wake once the transaction has committed ([`wakes`]), and what
/// a [`Command::RestoreSecrets`] read from the run's vault.
/// `now` is the engine's clock read by the transition's lock statement
/// (`belay_now()` once, instead of in every statement), `None` for a new run;
/// `own` the transition's locked task (`(call_id, task_id)`), if any.
#[allow(clippy::too_many_arguments)]
async fn write_decision(
    tx: &mut Transaction<'static, Postgres>,
    run_id: Uuid,
    tenant: &str,
    last_seq: i64,
    decision: &Decision,
    after: &RunState,
    now: Option<chrono::DateTime<chrono::Utc>>,
    own: Option<(&str, Uuid)>,
) -> Result<Wakes, StoreError> {
    let mut wakes = Wakes {
        tasks: crate::transition::wakes_tasks(decision),
        events: !decision.events.is_empty(),
        outbox: decision.commands.iter().any(|c| {
            matches!(
                c,
                Command::StartChildRun { .. } | Command::CancelChildRun { .. }
            )
        }),
        secrets: Vec::new(),
    };
    let mut parent_run_id: Option<Uuid> = None;
    // Whether the task writes went with the events ([`TaskWrites`]).
    let mut commands_written = false;
    if !decision.events.is_empty() {
        let mut seqs = Vec::with_capacity(decision.events.len());
        let mut kinds = Vec::with_capacity(decision.events.len());
        let mut payloads = Vec::with_capacity(decision.events.len());
        for (i, event) in decision.events.iter().enumerate() {
            seqs.push(last_seq + 1 + i as i64);
            kinds.push(event.kind().to_owned());
            payloads.push(
                serde_json::to_value(event)
                    .map_err(|e| StoreError::Corrupt(format!("event does not serialise: {e}")))?,
            );
        }
        // One round trip: the events and the run row (a projection of them),
        // and on the hot path the task writes too.
        let new_seq = last_seq + decision.events.len() as i64;
        // Any other decision writes its commands one at a time below, with
        // no task writes here.
        let hot = TaskWrites::of(&decision.commands, own);
        commands_written = hot.is_some();
        let w = hot.unwrap_or_default();
        // Only the CTEs this decision needs are in the statement (at most 16
        // texts, each prepared once per connection): an empty CTE still
        // costs its plan's start-up on every execution.
        let sql = w.statement();
        let mut query = sqlx::query_as::<_, (Option<Uuid>,)>(sqlx::AssertSqlSafe(sql))
            .bind(run_id)
            .bind(&seqs)
            .bind(&kinds)
            .bind(&payloads)
            .bind(after.status.as_str())
            .bind(&after.status_reason)
            .bind(after.output.as_ref())
            .bind(new_seq)
            .bind(tenant)
            .bind(now);
        if !w.schedule_ids.is_empty() {
            query = query
                .bind(&w.schedule_ids)
                .bind(&w.schedule_calls)
                .bind(&w.schedule_kinds)
                .bind(&w.schedule_specs)
                .bind(&w.schedule_keys)
                .bind(&w.schedule_safety)
                .bind(&w.schedule_paused);
        }
        if let Some((task_id, write)) = w.own {
            query = query.bind(task_id);
            query = match write {
                OwnWrite::Retry(ms) => query.bind(ms),
                OwnWrite::Dispatch(attempt) => query.bind(attempt),
                OwnWrite::End(status) => query.bind(status),
            };
        }
        let (parent,) = query.fetch_one(&mut **tx).await?;
        parent_run_id = parent;
    }
    let commands = if commands_written {
        &[][..]
    } else {
        &decision.commands[..]
    };
    for command in commands {
        match command {
            Command::ScheduleTask {
                call_id,
                kind,
                spec,
                idempotency_key,
                repeat_safety,
                runs_while_paused,
            } => {
                sqlx::query(
                    "INSERT INTO tasks (task_id, run_id, tenant, call_id, kind, status, spec, idempotency_key, repeat_safety, runs_while_paused)
                     VALUES ($1, $2, $3, $4, $5, 'ready', $6, $7, $8, $9)",
                )
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
            }
            Command::RetryTask { call_id, delay_ms } => {
                sqlx::query(
                    "UPDATE tasks SET status = 'ready', lease_expires_at = NULL, worker_id = NULL, dispatched = false,
                            available_at = belay_now() + make_interval(secs => $3::float8 / 1000.0), updated_at = belay_now()
                     WHERE run_id = $1 AND call_id = $2",
                )
                .bind(run_id)
                .bind(call_id)
                .bind(*delay_ms as f64)
                .execute(&mut **tx)
                .await?;
            }
            Command::MarkDispatched { call_id, attempt } => {
                sqlx::query(
                    "UPDATE tasks SET dispatched = true, dispatched_attempt = $3, dispatched_at = belay_now(), updated_at = belay_now()
                     WHERE run_id = $1 AND call_id = $2 AND attempt = $3 AND status = 'leased'",
                )
                .bind(run_id)
                .bind(call_id)
                .bind(*attempt as i32)
                .execute(&mut **tx)
                .await?;
            }
            Command::EndTask { call_id, end } => {
                let status = task_end_status(end);
                sqlx::query(
                    "UPDATE tasks SET status = $3, lease_expires_at = NULL, updated_at = belay_now()
                     WHERE run_id = $1 AND call_id = $2",
                )
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
                sqlx::query(
                    "INSERT INTO uncertain_outcomes (uncertain_id, tenant, run_id, task_id, call_id, node_id, tool,
                         tool_version, arguments, idempotency_key, attempts, worker_id, reason, occurrence)
                     SELECT $1, $2, $3, t.task_id, $4, $5, $6, $7, $8, $9,
                            -- Every attempt's dispatch and failure, from the events
                            -- (this transition's events are already inserted).
                            (SELECT COALESCE(jsonb_agg(jsonb_build_object(
                                        'seq', e.seq, 'event', e.kind, 'attempt', e.payload->'attempt',
                                        'worker_id', e.payload->'worker_id', 'error', e.payload->'error',
                                        'class', e.payload->'class', 'at', e.recorded_at) ORDER BY e.seq), '[]'::jsonb)
                             FROM events e
                             WHERE e.run_id = $3 AND e.payload->>'call_id' = $4
                               AND e.kind IN ('tool_call_dispatched', 'tool_call_attempt_failed', 'task_lease_expired')),
                            t.worker_id, $10,
                            -- A call can be uncertain again after a retry: one record each time.
                            (SELECT COALESCE(MAX(occurrence), 0) + 1 FROM uncertain_outcomes u
                             WHERE u.run_id = $3 AND u.call_id = $4)
                     FROM tasks t WHERE t.run_id = $3 AND t.call_id = $4",
                )
                .bind(Uuid::now_v7())
                .bind(tenant)
                .bind(run_id)
                .bind(call_id)
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
                sqlx::query(
                    "UPDATE tasks SET idempotency_key = $3, spec = $4, updated_at = belay_now()
                     WHERE run_id = $1 AND call_id = $2",
                )
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
                sqlx::query(
                    "UPDATE uncertain_outcomes SET status = 'resolved', resolution = $3, resolution_kind = $4,
                            resolved_by = $5, resolution_reason = $6, resolved_via = $7, resolved_at = belay_now()
                     WHERE uncertain_id = (SELECT uncertain_id FROM uncertain_outcomes
                                           WHERE run_id = $1 AND call_id = $2 AND status = 'open'
                                           ORDER BY occurrence DESC LIMIT 1)",
                )
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
                sqlx::query(
                    "UPDATE uncertain_outcomes SET discrepancy = COALESCE(discrepancy, '[]'::jsonb) || jsonb_build_array($3::jsonb)
                     WHERE uncertain_id = (SELECT uncertain_id FROM uncertain_outcomes
                                           WHERE run_id = $1 AND call_id = $2
                                           ORDER BY occurrence DESC LIMIT 1)",
                )
                .bind(run_id)
                .bind(call_id)
                .bind(discrepancy)
                .execute(&mut **tx)
                .await?;
            }
            Command::RecordProbe { call_id, probe } => {
                sqlx::query(
                    "UPDATE uncertain_outcomes SET probe = $3::jsonb || jsonb_build_object('at', belay_now())
                     WHERE uncertain_id = (SELECT uncertain_id FROM uncertain_outcomes
                                           WHERE run_id = $1 AND call_id = $2
                                           ORDER BY occurrence DESC LIMIT 1)",
                )
                .bind(run_id)
                .bind(call_id)
                .bind(probe)
                .execute(&mut **tx)
                .await?;
            }
            Command::NotifyOperator { kind, payload } => {
                sqlx::query(
                    "INSERT INTO notifications (notification_id, tenant, run_id, kind, payload)
                     VALUES ($1, $2, $3, $4, $5::jsonb || jsonb_build_object('uncertain_id',
                         (SELECT uncertain_id FROM uncertain_outcomes u
                          WHERE u.run_id = $3 AND u.call_id = $5::jsonb->>'call_id'
                          ORDER BY occurrence DESC LIMIT 1)))",
                )
                .bind(Uuid::now_v7())
                .bind(tenant)
                .bind(run_id)
                .bind(kind)
                .bind(payload)
                .execute(&mut **tx)
                .await?;
            }
            Command::ScheduleTimer(timer) => {
                sqlx::query(
                    "INSERT INTO timers (run_id, timer_id, fire_at)
                     VALUES ($1, $2, COALESCE($3::timestamptz, belay_now() + $4::float8 * interval '1 millisecond'))
                     ON CONFLICT (run_id, timer_id) DO UPDATE SET fire_at = EXCLUDED.fire_at",
                )
                .bind(run_id)
                .bind(&timer.timer_id)
                .bind(timer.at.as_deref().and_then(parse_time))
                .bind(timer.after_ms.unwrap_or(0) as f64)
                .execute(&mut **tx)
                .await?;
            }
            Command::RegisterCallback {
                call_id,
                token_sha256,
            } => {
                sqlx::query(
                    "INSERT INTO callbacks (token_sha256, run_id, call_id) VALUES ($1, $2, $3)
                     ON CONFLICT (token_sha256) DO NOTHING",
                )
                .bind(token_sha256)
                .bind(run_id)
                .bind(call_id)
                .execute(&mut **tx)
                .await?;
            }
            Command::CancelTimer { timer_id } => {
                sqlx::query("DELETE FROM timers WHERE run_id = $1 AND timer_id = $2")
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
            }
            Command::CancelChildRun {
                child_run_id,
                reason,
            } => {
                let payload = serde_json::json!({
                    "tenant": tenant, "child_run_id": child_run_id, "reason": reason,
                });
                insert_outbox(tx, run_id, "cancel_child", &payload).await?;
            }
            Command::CancelOpenTasks => {
                sqlx::query(
                    "UPDATE tasks SET status = 'cancelled', lease_expires_at = NULL, updated_at = belay_now()
                     WHERE run_id = $1 AND status IN ('ready', 'leased')",
                )
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
                     VALUES ($1, $2, $3, $4, $5, $6, belay_now(),
                             belay_now() + make_interval(secs => $7::float8 / 1000.0))
                     ON CONFLICT (tenant, cache_key) DO UPDATE SET
                         tool = excluded.tool, result = excluded.result, run_id = excluded.run_id,
                         call_id = excluded.call_id, stored_at = excluded.stored_at,
                         expires_at = excluded.expires_at"
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
                    sqlx::query(
                        "INSERT INTO run_secrets (run_id, key, producer_call, nonce, ciphertext, expires_at, single_use, consumers)
                         VALUES ($1, $2, $3, $4, $5,
                                 CASE WHEN $6::int8 IS NULL THEN NULL ELSE belay_now() + make_interval(secs => $6::float8) END,
                                 $7, $8)
                         ON CONFLICT (run_id, key) DO UPDATE SET producer_call = excluded.producer_call,
                             nonce = excluded.nonce, ciphertext = excluded.ciphertext,
                             expires_at = excluded.expires_at, single_use = excluded.single_use,
                             consumers = excluded.consumers, consumed_by_call = NULL,
                             created_at = belay_now()",
                    )
                    .bind(run_id)
                    .bind(&entry.sealed.key)
                    .bind(call_id)
                    .bind(&entry.sealed.nonce)
                    .bind(&entry.sealed.ciphertext)
                    .bind(entry.ttl_s.map(|t| i64::try_from(t).unwrap_or(i64::MAX)))
                    .bind(entry.single_use)
                    .bind(&entry.consumers)
                    .execute(&mut **tx)
                    .await?;
                }
            }
            Command::RestoreSecrets {
                call_id,
                tool,
                keys,
            } => {
                // Row locks come with the UPDATE; the run row's lock already
                // serialises the run's transitions.
                let rows: Vec<(String, Vec<u8>, Vec<u8>)> = sqlx::query_as(
                    "UPDATE run_secrets
                     SET consumed_by_call = CASE WHEN single_use THEN $4 ELSE consumed_by_call END
                     WHERE run_id = $1 AND key = ANY($2)
                       AND (expires_at IS NULL OR expires_at > belay_now())
                       AND (cardinality(consumers) = 0 OR $3 = ANY(consumers))
                       AND (consumed_by_call IS NULL OR consumed_by_call = $4)
                     RETURNING key, nonce, ciphertext",
                )
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
                sqlx::query("DELETE FROM run_secrets WHERE run_id = $1")
                    .bind(run_id)
                    .execute(&mut **tx)
                    .await?;
            }
        }
    }
    // A run that ended has nothing left to wake it; a child run that ends
    // tells its parent (through the outbox).
    if crate::transition::ends_run(decision) {
        sqlx::query("DELETE FROM timers WHERE run_id = $1")
            .bind(run_id)
            .execute(&mut **tx)
            .await?;
        if let Some(parent) = parent_run_id {
            let payload = crate::transition::child_finished_payload(tenant, parent, run_id, after);
            insert_outbox(tx, run_id, "child_finished", &payload).await?;
            wakes.outbox = true;
        }
    }
    Ok(wakes)
}

// ---- tool gates (rate limits, circuit breakers) ------------------------
// The rules are in `belay_machine::gates`; these statements load and save its rows.

/// A row of [`Pg::claim_tasks_or_next`]: a claimed task, or (alone, when
/// none was claimed) the time until the earliest ready task, ms.
#[derive(sqlx::FromRow)]
struct ClaimOrNext {
    task_id: Option<Uuid>,
    run_id: Option<Uuid>,
    tenant: Option<String>,
    kind: Option<String>,
    attempt: Option<i32>,
    spec: Option<Value>,
    idempotency_key: Option<String>,
    next_ready_ms: Option<f64>,
}

impl ClaimOrNext {
    fn task(&self) -> Option<ClaimedTask> {
        Some(ClaimedTask {
            task_id: self.task_id?,
            run_id: self.run_id?,
            tenant: self.tenant.clone()?,
            kind: self.kind.clone()?,
            attempt: self.attempt?,
            spec: self.spec.clone()?,
            idempotency_key: self.idempotency_key.clone()?,
        })
    }
}

/// The columns of a `tool_gates` row, then the engine's clock in ms.
const GATE_COLUMNS: &str = "next_at_ms, queue_at_ms, failures::int8, circuit, retry_at_ms, floor(EXTRACT(EPOCH FROM belay_now()) * 1000)::int8";

/// The tool's row and the engine's clock (ms), locked for this transaction
/// with `lock`; `None` when the tool has no row.
async fn load_gate(
    tx: &mut Transaction<'static, Postgres>,
    tenant: &str,
    tool: &str,
    lock: bool,
) -> Result<Option<(GateRow, i64)>, StoreError> {
    let row: Option<crate::transition::GateTuple> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {GATE_COLUMNS} FROM tool_gates WHERE tenant = $1 AND tool = $2{}",
        if lock { " FOR UPDATE" } else { "" }
    )))
    .bind(tenant)
    .bind(tool)
    .fetch_optional(&mut **tx)
    .await?;
    row.map(crate::transition::gate_row).transpose()
}

/// The tool's row, created if missing, locked for this transaction; and
/// the engine's clock (ms). Creating it first means two replicas gating the
/// tool's first call wait for each other like any later one.
async fn lock_gate(
    tx: &mut Transaction<'static, Postgres>,
    tenant: &str,
    tool: &str,
) -> Result<(GateRow, i64), StoreError> {
    if let Some(found) = load_gate(tx, tenant, tool, true).await? {
        return Ok(found);
    }
    sqlx::query("INSERT INTO tool_gates (tenant, tool) VALUES ($1, $2) ON CONFLICT DO NOTHING")
        .bind(tenant)
        .bind(tool)
        .execute(&mut **tx)
        .await?;
    load_gate(tx, tenant, tool, true)
        .await?
        .ok_or_else(|| StoreError::Corrupt(format!("tool_gates row of {tool:?} vanished")))
}

async fn save_gate(
    tx: &mut Transaction<'static, Postgres>,
    tenant: &str,
    tool: &str,
    row: &GateRow,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE tool_gates SET next_at_ms = $3, queue_at_ms = $4, failures = $5, circuit = $6,
                retry_at_ms = $7, updated_at = belay_now()
         WHERE tenant = $1 AND tool = $2",
    )
    .bind(tenant)
    .bind(tool)
    .bind(row.next_at_ms)
    .bind(row.queue_at_ms)
    .bind(i32::try_from(row.failures).unwrap_or(i32::MAX))
    .bind(row.circuit.as_str())
    .bind(row.retry_at_ms)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// [`Command::PassToolGates`]: `None` when the call may go (its turn is
/// taken), else why not. A tool with a rate limit locks its row (every
/// dispatch takes a turn); a tool with only a circuit breaker reads its row
/// without a lock and locks it only when the circuit is not closed, so the
/// dispatches of a healthy tool never wait for each other.
async fn pass_tool_gates(
    tx: &mut Transaction<'static, Postgres>,
    tenant: &str,
    asked: &crate::transition::GatesAsked<'_>,
) -> Result<Option<GateVerdict>, StoreError> {
    let (tool, gates) = (asked.tool, asked.gates);
    let (row, now) = if gates.rate_limit.is_some() {
        lock_gate(tx, tenant, tool).await?
    } else {
        match load_gate(tx, tenant, tool, false).await? {
            None => return Ok(None),
            Some((row, _)) if row.circuit == Circuit::Closed => return Ok(None),
            // Rows are never deleted.
            Some(_) => lock_gate(tx, tenant, tool).await?,
        }
    };
    let (verdict, next) = gates::admit(&row, now, gates, asked.holds_turn);
    if next != row {
        save_gate(tx, tenant, tool, &next).await?;
    }
    Ok(verdict)
}

/// [`Command::RecordToolOutcome`]. A success closes the circuit and clears
/// the count: one `UPDATE` that touches (and locks) the row only when
/// there is something to clear, so a healthy tool's results never wait for
/// each other. A failure is [`gates::after_failure`] on the locked row.
async fn record_tool_outcome(
    tx: &mut Transaction<'static, Postgres>,
    tenant: &str,
    tool: &str,
    breaker: &CircuitBreakerDef,
    failed: bool,
) -> Result<(), StoreError> {
    if !failed {
        sqlx::query(
            "UPDATE tool_gates SET failures = 0, circuit = 'closed', retry_at_ms = 0, updated_at = belay_now()
             WHERE tenant = $1 AND tool = $2 AND (failures <> 0 OR circuit <> 'closed')",
        )
        .bind(tenant)
        .bind(tool)
        .execute(&mut **tx)
        .await?;
        return Ok(());
    }
    let (row, now) = lock_gate(tx, tenant, tool).await?;
    save_gate(tx, tenant, tool, &gates::after_failure(&row, now, breaker)).await
}

/// Serve the calls `decision` launched with a cache lookup
/// ([`Command::LookupToolCache`]) from the tenant's tool cache where it has
/// a live entry (the rules are [`crate::transition::CacheServing`]'s); `state` is the
/// run before `decision`. A decision without lookups costs no statement.
async fn serve_from_cache(
    tx: &mut Transaction<'static, Postgres>,
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
            sqlx::query_scalar("SELECT belay_now()")
                .fetch_one(&mut **tx)
                .await?,
        );
    }
    while let Some(key) = serving.next_key() {
        let row: Option<ToolCacheRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {TOOL_CACHE_COLUMNS} FROM tool_cache
             WHERE tenant = $1 AND cache_key = $2 AND expires_at > belay_now()"
        )))
        .bind(tenant)
        .bind(&key)
        .fetch_optional(&mut **tx)
        .await?;
        let Some(row) = row else {
            continue;
        };
        if serving.needs_grants() {
            let stored: Option<(Vec<String>,)> =
                sqlx::query_as("SELECT grants FROM tenants WHERE tenant = $1")
                    .bind(tenant)
                    .fetch_optional(&mut **tx)
                    .await?;
            serving.set_grants(stored.map(|r| r.0).unwrap_or_default());
        }
        serving.serve(row);
    }
    Ok(serving.finish())
}

impl Pg {
    /// See [`crate::Store::tool_cache_entries`].
    pub(crate) async fn tool_cache_entries(
        &self,
        tenant: &str,
    ) -> Result<Vec<ToolCacheRow>, StoreError> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {TOOL_CACHE_COLUMNS} FROM tool_cache WHERE tenant = $1
             ORDER BY stored_at DESC, cache_key"
        )))
        .bind(tenant)
        .fetch_all(&self.pool)
        .await?)
    }

    /// See [`crate::Store::purge_stale_heartbeats`].
    pub(crate) async fn purge_stale_heartbeats(&self) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "DELETE FROM task_heartbeats h
             WHERE NOT EXISTS (SELECT 1 FROM tasks t
                               WHERE t.task_id = h.task_id AND t.attempt = h.attempt
                                 AND t.status = 'leased')",
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// See [`crate::Store::purge_expired_tool_cache`]. Rows another engine
    /// is deleting are skipped.
    pub(crate) async fn purge_expired_tool_cache(&self, limit: i64) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "DELETE FROM tool_cache WHERE (tenant, cache_key) IN (
                 SELECT tenant, cache_key FROM tool_cache WHERE expires_at <= belay_now()
                 ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)",
        )
        .bind(limit)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// See [`crate::Store::tool_gate`].
    pub(crate) async fn run_secrets(
        &self,
        run_id: Uuid,
    ) -> Result<Vec<crate::rows::RunSecretRow>, StoreError> {
        type Row = (
            String,
            String,
            Option<chrono::DateTime<chrono::Utc>>,
            bool,
            Vec<String>,
            Option<String>,
        );
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT key, producer_call, expires_at, single_use, consumers, consumed_by_call
             FROM run_secrets WHERE run_id = $1 ORDER BY key",
        )
        .bind(run_id)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(
                |(key, producer_call, expires_at, single_use, consumers, consumed_by_call)| {
                    crate::rows::RunSecretRow {
                        key,
                        producer_call,
                        expires_at,
                        single_use,
                        consumers,
                        consumed_by_call,
                    }
                },
            )
            .collect())
    }

    pub(crate) async fn tool_gate(
        &self,
        tenant: &str,
        tool: &str,
    ) -> Result<Option<GateRow>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let row = load_gate(&mut tx, tenant, tool, false).await?;
        tx.commit().await?;
        Ok(row.map(|(row, _)| row))
    }
}

// ---- MCP tools (definitions reported by workers, pins) -----------------
// New statements only; the rules are in `belay_engine::mcp_pins`.

const MCP_DEFINITION_COLUMNS: &str = "server, tool, definition_hash, definition, refusal, suggested_repeat_safety, protocol_version, first_seen_at, last_seen_at, reported_by";
const MCP_PIN_COLUMNS: &str =
    "tenant, server, tool, definition_hash, previous_hash, accepted_by, reason, accepted_at";

impl Pg {
    /// See [`crate::Store::record_mcp_tools`].
    pub(crate) async fn record_mcp_tools(
        &self,
        server: &str,
        protocol_version: &str,
        reported_by: &str,
        listings: &[crate::rows::McpToolListingIn],
    ) -> Result<u64, StoreError> {
        let mut tx = self.pool.begin().await?;
        let seq: i64 = sqlx::query_scalar("SELECT nextval('mcp_tool_report_seq')")
            .fetch_one(&mut *tx)
            .await?;
        let mut new = 0;
        for l in listings {
            let inserted = sqlx::query(
                "INSERT INTO mcp_tool_definitions
                     (server, tool, definition_hash, definition, refusal, suggested_repeat_safety,
                      protocol_version, reported_by, report_seq)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                 ON CONFLICT (server, tool, definition_hash) DO NOTHING",
            )
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
                sqlx::query(
                    "UPDATE mcp_tool_definitions
                     SET last_seen_at = belay_now(), reported_by = $4, protocol_version = $5,
                         report_seq = $6
                     WHERE server = $1 AND tool = $2 AND definition_hash = $3",
                )
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
             WHERE ($1::text IS NULL OR server = $1) AND ($2::text IS NULL OR tool = $2)
             ORDER BY server, tool, report_seq DESC, definition_hash"
        )))
        .bind(server)
        .bind(tool)
        .fetch_all(&self.pool)
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
             WHERE tenant = $1 AND ($2::text IS NULL OR server = $2) AND ($3::text IS NULL OR tool = $3)
             ORDER BY server, tool"
        )))
        .bind(tenant)
        .bind(server)
        .bind(tool)
        .fetch_all(&self.pool)
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
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO mcp_tool_pins (tenant, server, tool, definition_hash, accepted_by, reason)
             VALUES ($1, $2, $3, $4, $5, 'trusted on first use')
             ON CONFLICT (tenant, server, tool) DO NOTHING",
        )
        .bind(tenant)
        .bind(server)
        .bind(tool)
        .bind(definition_hash)
        .bind(accepted_by)
        .execute(&mut *tx)
        .await?;
        let pin = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {MCP_PIN_COLUMNS} FROM mcp_tool_pins
             WHERE tenant = $1 AND server = $2 AND tool = $3"
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
        // Accepting the hash already pinned changes nothing (the WHERE
        // leaves the row alone and returns none): answer with the pin.
        let written: Option<crate::rows::McpToolPinRow> =
            sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "INSERT INTO mcp_tool_pins (tenant, server, tool, definition_hash, accepted_by, reason)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (tenant, server, tool) DO UPDATE
             SET previous_hash = CASE WHEN mcp_tool_pins.definition_hash = excluded.definition_hash
                                      THEN mcp_tool_pins.previous_hash
                                      ELSE mcp_tool_pins.definition_hash END,
                 definition_hash = excluded.definition_hash,
                 accepted_by = excluded.accepted_by,
                 reason = excluded.reason,
                 accepted_at = belay_now()
             WHERE mcp_tool_pins.definition_hash <> excluded.definition_hash
             RETURNING {MCP_PIN_COLUMNS}"
        )))
            .bind(tenant)
            .bind(server)
            .bind(tool)
            .bind(definition_hash)
            .bind(accepted_by)
            .bind(reason)
            .fetch_optional(&self.pool)
            .await?;
        match written {
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
            "SELECT tenant, kind, status, attempt, worker_id, spec FROM tasks WHERE task_id = $1",
        )
        .bind(task_id)
        .fetch_optional(&self.pool)
        .await?)
    }
}

// ---- audit of tool calls -------------------------------------------------
// The rules (what each event means for a call) are in `crate::tool_calls`.

impl Pg {
    /// See [`crate::Store::list_tool_calls`]. The page is read from the
    /// partial index `events_tool_calls` (the keyset row comparison is its
    /// range, so a later page does not walk the earlier ones); only then are
    /// the page's other events looked up, in their runs.
    pub(crate) async fn list_tool_calls(
        &self,
        q: &crate::tool_calls::ToolCallQuery<'_>,
    ) -> Result<Vec<crate::tool_calls::ToolCallEvents>, StoreError> {
        use crate::tool_calls::END_KINDS;
        let mut sql = sqlx::QueryBuilder::<Postgres>::new(
            "SELECT p.run_id, p.seq, p.payload AS proposal, p.recorded_at AS proposed_at,
                    r.tenant, r.caller, c.payload AS confirmation,
                    e.payload AS end_payload, e.recorded_at AS ended_at,
                    m.arguments AS model_arguments
             FROM (",
        );
        crate::tool_calls::push_page(&mut sql, q, q.after);
        sql.push(format_args!(
            ") p
             JOIN runs r ON r.run_id = p.run_id
             LEFT JOIN LATERAL (
                 SELECT x.payload FROM events x
                 WHERE x.run_id = p.run_id AND x.seq > p.seq AND x.kind = 'confirmation_decided'
                   AND x.payload->>'call_id' = p.payload->>'call_id'
                 ORDER BY x.seq LIMIT 1) c ON true
             LEFT JOIN LATERAL (
                 SELECT x.payload, x.recorded_at FROM events x
                 WHERE x.run_id = p.run_id AND x.seq > p.seq AND x.kind IN {END_KINDS}
                   AND x.payload->>'call_id' = p.payload->>'call_id'
                 ORDER BY x.seq DESC LIMIT 1) e ON true
             LEFT JOIN LATERAL (
                 SELECT t->>'arguments' AS arguments
                 FROM events x CROSS JOIN jsonb_array_elements(x.payload->'tool_calls') t
                 WHERE p.kind = 'tool_call_refused' AND x.run_id = p.run_id AND x.seq < p.seq
                   AND x.kind = 'model_call_completed' AND t->>'id' = p.payload->>'tool_use_id'
                 ORDER BY x.seq DESC LIMIT 1) m ON true
             ORDER BY p.recorded_at DESC, p.run_id DESC, p.seq DESC"
        ));
        Ok(sql.build_query_as().fetch_all(&self.pool).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use belay_machine::TaskKind;

    fn schedule(call: &str) -> Command {
        Command::ScheduleTask {
            call_id: call.to_owned(),
            kind: TaskKind::ToolCall,
            spec: serde_json::json!({}),
            idempotency_key: format!("key-{call}"),
            repeat_safety: None,
            runs_while_paused: false,
        }
    }

    /// A step's usual decision: end the own call `a.t1`, schedule `a.m2`.
    fn end_then_schedule() -> Vec<Command> {
        vec![
            Command::EndTask {
                call_id: "a.t1".to_owned(),
                end: TaskEnd::Completed,
            },
            schedule("a.m2"),
        ]
    }

    #[test]
    fn the_hot_path_takes_only_task_writes_on_different_calls() {
        // End one call, schedule the next: one statement.
        let commands = end_then_schedule();
        let own = Some(("a.t1", Uuid::nil()));
        let w = TaskWrites::of(&commands, own).expect("hot path");
        assert_eq!(w.own, Some((Uuid::nil(), OwnWrite::End("completed"))));
        assert_eq!(w.schedule_calls, ["a.m2"]);
        assert_eq!(w.schedule_kinds, ["tool_call"]);
        // A call touched twice: one statement could not update its row twice.
        let twice = vec![
            Command::RetryTask {
                call_id: "a.t1".to_owned(),
                delay_ms: 10,
            },
            Command::EndTask {
                call_id: "a.t1".to_owned(),
                end: TaskEnd::Failed,
            },
        ];
        assert!(TaskWrites::of(&twice, own).is_none());
        // Any other command: written one at a time.
        let other = vec![schedule("a.m2"), Command::CancelOpenTasks];
        assert!(TaskWrites::of(&other, own).is_none());
        // Ending a task other than the transition's own (or with none
        // locked): written one at a time, by its call id.
        assert!(TaskWrites::of(&commands, Some(("a.t9", Uuid::nil()))).is_none());
        assert!(TaskWrites::of(&commands, None).is_none());
        // No command at all: nothing for the tasks table.
        assert!(TaskWrites::of(&[], None).is_some_and(|w| w.schedule_ids.is_empty()));
    }

    #[test]
    fn the_statement_holds_only_the_needed_ctes_numbered_on_from_11() {
        let commands = end_then_schedule();
        let own = Some(("a.t1", Uuid::nil()));
        let sql = TaskWrites::of(&commands, own)
            .expect("hot path")
            .statement();
        assert!(
            sql.contains("sched AS") && sql.contains("$11::uuid[]") && sql.contains("$17::bool[]")
        );
        assert!(
            sql.contains("ends AS")
                && sql.contains("t.task_id = $18::uuid")
                && sql.contains("status = $19::text")
        );
        assert!(!sql.contains("retry AS") && !sql.contains("disp AS") && !sql.contains("$20"));
        // The own task is found by a scalar key, never `= ANY(array)` (a
        // generic plan took a sequential scan for it).
        assert!(!sql.contains("ANY("), "{sql}");
        let dispatch = vec![Command::MarkDispatched {
            call_id: "a.t1".to_owned(),
            attempt: 2,
        }];
        let sql = TaskWrites::of(&dispatch, own)
            .expect("hot path")
            .statement();
        assert!(
            sql.contains("disp AS")
                && sql.contains("t.task_id = $11::uuid")
                && sql.contains("t.attempt = $12::int4")
        );
        assert!(!sql.contains("sched AS") && !sql.contains("$13"));
        let retry = vec![Command::RetryTask {
            call_id: "a.t1".to_owned(),
            delay_ms: 250,
        }];
        let w = TaskWrites::of(&retry, own).expect("hot path");
        assert_eq!(w.own, Some((Uuid::nil(), OwnWrite::Retry(250.0))));
        let sql = w.statement();
        assert!(
            sql.contains("retry AS") && sql.contains("$12::float8 / 1000.0"),
            "{sql}"
        );
        let none = TaskWrites::default().statement();
        assert!(!none.contains("tasks"), "{none}");
    }
}
