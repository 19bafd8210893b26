//! Tasks a worker runs (`tasks`, `task_heartbeats`): claims, heartbeats,
//! expired leases, readiness, and the task timers tests and operators
//! expire. What a task's report does to its run is a transition
//! (`transition.rs`).

use serde_json::Value;
use uuid::Uuid;

use super::Pg;
use crate::pools::ClaimFilter;
use crate::rows::{ClaimedTask, ExpiredLease, StoreError};

impl Pg {
    /// Claim up to `max` ready tasks (see [`Pg::claim_tasks_or_next`]).
    pub(crate) async fn claim_tasks(
        &self,
        worker_id: &str,
        max: i64,
        lease_ms: i64,
        filter: ClaimFilter<'_>,
    ) -> Result<Vec<ClaimedTask>, StoreError> {
        Ok(self
            .claim_tasks_or_next(worker_id, max, lease_ms, filter)
            .await?
            .0)
    }

    /// Claim up to `max` ready tasks of running runs for `worker_id`, with a
    /// lease of `lease_ms` by the database clock. Each claim increments the
    /// task's attempt (the fencing token). When fewer than `max` are
    /// claimed, also says when the earliest other ready task becomes
    /// claimable (as [`Pg::next_ready_in_ms`], leaving out the tasks just
    /// claimed, which the statement's snapshot still sees ready), in the
    /// same statement: the coordinator then knows how long nothing is
    /// claimable (`NothingClaimable`). `filter` limits both to the tasks
    /// of its tenants whose `requires` its capabilities cover (`<@`,
    /// checked on the rows `tasks_ready` yields, so the order and SKIP
    /// LOCKED are as before).
    pub(crate) async fn claim_tasks_or_next(
        &self,
        worker_id: &str,
        max: i64,
        lease_ms: i64,
        filter: ClaimFilter<'_>,
    ) -> Result<(Vec<ClaimedTask>, Option<i64>), StoreError> {
        let rows: Vec<ClaimOrNext> = sqlx::query_as(concat!(
            "WITH clock AS MATERIALIZED (SELECT belay_now() AS now),
             picked AS (
                 SELECT t.task_id FROM tasks t
                 WHERE t.status = 'ready' AND t.available_at <= (SELECT now FROM clock)
                   AND ($4::text[] IS NULL OR t.tenant = ANY($4))
                   AND ($5::text[] IS NULL OR t.requires <@ $5)
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
                 RETURNING t.task_id, t.run_id, t.tenant, t.kind, t.attempt, t.spec, t.idempotency_key,
                           (EXTRACT(EPOCH FROM (clock.now - t.available_at)) * 1000)::float8 AS waited_ms)
             SELECT task_id, run_id, tenant, kind, attempt, spec, idempotency_key, waited_ms,
                    NULL::float8 AS next_ready_ms
             FROM claimed
             UNION ALL
             SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                    -- ORDER BY + LIMIT 1, not MIN(): PostgreSQL turns MIN
                    -- over a join into reading every ready task and run.
                    (SELECT (EXTRACT(EPOCH FROM (t.available_at - (SELECT now FROM clock))) * 1000)::float8
                     FROM tasks t
                     WHERE t.status = 'ready' AND t.task_id NOT IN (SELECT task_id FROM claimed)
                       AND ($4::text[] IS NULL OR t.tenant = ANY($4))
                       AND ($5::text[] IS NULL OR t.requires <@ $5) AND ",
            run_admits_task!(),
            "
                     ORDER BY t.available_at, t.task_id LIMIT 1)
             WHERE (SELECT count(*) FROM claimed) < $2"
        ))
        .bind(worker_id)
        .bind(max)
        .bind(lease_ms as f64)
        .bind(filter.tenants)
        .bind(filter.capabilities)
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
        // Written to `task_heartbeats` (see `lease_holds!`), and, while
        // the fleet is below behaviour level 1 (`fleet_level`: an engine of
        // a release before that table may share the database and reads
        // `tasks.lease_expires_at` alone), to the task's row too. The task
        // rows are not locked by the insert: a sweep that judges a lease
        // expired while this commits may still expire it, and the worker,
        // told "held", is refused at its next report by the attempt fence,
        // as when a lease is lost between two heartbeats. An extension
        // never goes back to an older attempt nor shortens a lease.
        let rows: Vec<(Uuid, i32)> = sqlx::query_as(concat!(
            "WITH extended AS (
             INSERT INTO task_heartbeats AS h (task_id, attempt, lease_until)
             SELECT t.task_id, t.attempt, belay_now() + make_interval(secs => $4::float8 / 1000.0)
             FROM UNNEST($2::uuid[], $3::int4[]) AS l(task_id, attempt)
             CROSS JOIN LATERAL (SELECT * FROM tasks t WHERE t.task_id = l.task_id) t
             WHERE t.attempt = l.attempt AND t.status = 'leased' AND t.worker_id = $1
               AND (",
            lease_holds!("belay_now()"),
            " OR ",
            fleet_in_grace!("$5"),
            ")
             ON CONFLICT (task_id) DO UPDATE SET attempt = EXCLUDED.attempt, lease_until = EXCLUDED.lease_until
                WHERE h.attempt <= EXCLUDED.attempt
             RETURNING h.task_id, h.attempt, h.lease_until
             ), on_rows AS (
                 UPDATE tasks t SET lease_expires_at = GREATEST(t.lease_expires_at, e.lease_until)
                 FROM extended e
                 WHERE $6 AND t.task_id = e.task_id AND t.attempt = e.attempt AND t.status = 'leased'
             )
             SELECT task_id, attempt FROM extended"
        ))
        .bind(worker_id)
        .bind(&ids)
        .bind(&attempts)
        .bind(lease_ms as f64)
        .bind(crate::fleet_grace_ms(lease_ms) as f64)
        .bind(crate::fleet_level::heartbeats_write_task_rows(self.fleet_level()))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    /// Leases that have expired by the database clock, oldest first; none
    /// while the fleet is in its grace after an outage (`grace_ms`).
    pub(crate) async fn expired_leases(
        &self,
        limit: i64,
        grace_ms: i64,
    ) -> Result<Vec<ExpiredLease>, StoreError> {
        Ok(sqlx::query_as(concat!(
            "SELECT t.task_id, t.run_id, t.attempt FROM tasks t
             WHERE t.status = 'leased' AND t.lease_expires_at <= belay_now() AND NOT ",
            lease_holds!("belay_now()"),
            " AND NOT ",
            fleet_in_grace!("$2"),
            " ORDER BY t.lease_expires_at LIMIT $1"
        ))
        .bind(limit)
        .bind(grace_ms as f64)
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

    pub(crate) async fn task_tenant(&self, task_id: Uuid) -> Result<Option<String>, StoreError> {
        let row: Option<(String,)> = sqlx::query_as("SELECT tenant FROM tasks WHERE task_id = $1")
            .bind(task_id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| r.0))
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
}

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
    waited_ms: Option<f64>,
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
            waited_ms: self.waited_ms.unwrap_or(0.0).max(0.0),
            dispatched: false,
        })
    }
}
