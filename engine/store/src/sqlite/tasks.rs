//! Tasks a worker runs (`tasks`): claims, heartbeats (which extend
//! `tasks.lease_expires_at` here; PostgreSQL keeps them off the row, in
//! `task_heartbeats`, so only it has `purge_stale_heartbeats`),
//! expired leases, readiness, and the task timers tests and operators
//! expire. What a task's report does to its run is a transition
//! (`transition.rs`).

use serde_json::Value;
use uuid::Uuid;

use super::{CLOCK, Lite, NOW, fleet_in_grace, now_plus_ms};
use crate::pools::ClaimFilter;
use crate::rows::{ClaimedTask, ExpiredLease, StoreError};

/// SQL: whether task `t`'s tenant is in the JSON array bound as `?N`
/// (NULL: any tenant). The list is a bound value, never SQL text.
fn tenant_in_list(param: u8) -> String {
    format!("(?{param} IS NULL OR t.tenant IN (SELECT value FROM json_each(?{param})))")
}

/// SQL: whether every requirement of task `t` is in the JSON array of
/// capability tags bound as `?N` (NULL: a claim without capabilities,
/// which takes any task).
fn covered_by(param: u8) -> String {
    format!(
        "(?{param} IS NULL OR NOT EXISTS (SELECT 1 FROM json_each(t.requires) q
                                          WHERE q.value NOT IN (SELECT value FROM json_each(?{param}))))"
    )
}

/// The bound value of [`tenant_in_list`]: the tenants as a JSON array.
fn tenant_list(tenants: Option<&[String]>) -> Option<Value> {
    tenants.map(|t| Value::from(t.to_vec()))
}

impl Lite {
    pub(crate) async fn claim_tasks(
        &self,
        worker_id: &str,
        max: i64,
        lease_ms: i64,
        filter: ClaimFilter<'_>,
    ) -> Result<Vec<ClaimedTask>, StoreError> {
        // One statement on the one writer: no two claims see the same row.
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "UPDATE tasks SET status = 'leased', attempt = attempt + 1, worker_id = ?1,
                    lease_expires_at = {lease}, dispatched = 0, updated_at = {NOW}
             WHERE task_id IN (
                 SELECT t.task_id FROM tasks t JOIN runs r ON r.run_id = t.run_id
                 WHERE t.status = 'ready' AND t.available_at <= {NOW}
                   AND {tenant_in_list} AND {covered}
                   AND (r.status IN ('running', 'waiting') OR (r.status = 'paused' AND t.runs_while_paused))
                 ORDER BY t.available_at, t.task_id
                 LIMIT ?2)
             RETURNING task_id, run_id, tenant, kind, attempt, spec, idempotency_key,
                       MAX(0.0, (julianday({NOW}) - julianday(available_at)) * 86400000.0) AS waited_ms",
            lease = now_plus_ms(3),
            tenant_in_list = tenant_in_list(4),
            covered = covered_by(5),
        )))
        .bind(worker_id)
        .bind(max)
        .bind(lease_ms as f64)
        .bind(tenant_list(filter.tenants))
        .bind(tenant_list(filter.capabilities))
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
                   AND worker_id = ?4 AND (lease_expires_at > {NOW} OR {grace})
                 RETURNING task_id, attempt",
                lease = now_plus_ms(3),
                grace = fleet_in_grace(5)
            )))
            .bind(task_id)
            .bind(attempt)
            .bind(lease_ms as f64)
            .bind(worker_id)
            .bind(crate::fleet_grace_ms(lease_ms) as f64)
            .fetch_optional(&mut *tx)
            .await?;
            out.extend(row);
        }
        tx.commit().await?;
        Ok(out)
    }

    pub(crate) async fn expired_leases(
        &self,
        limit: i64,
        grace_ms: i64,
    ) -> Result<Vec<ExpiredLease>, StoreError> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT task_id, run_id, attempt FROM tasks
             WHERE status = 'leased' AND lease_expires_at <= {NOW} AND NOT {grace}
             ORDER BY lease_expires_at LIMIT ?1",
            grace = fleet_in_grace(2)
        )))
        .bind(limit)
        .bind(grace_ms as f64)
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
        filter: ClaimFilter<'_>,
    ) -> Result<(Vec<ClaimedTask>, Option<i64>), StoreError> {
        let tasks = self.claim_tasks(worker_id, max, lease_ms, filter).await?;
        if tasks.len() as i64 >= max {
            return Ok((tasks, None));
        }
        Ok((tasks, self.next_ready_of(filter).await?))
    }

    pub(crate) async fn next_ready_in_ms(&self) -> Result<Option<i64>, StoreError> {
        self.next_ready_of(ClaimFilter::default()).await
    }

    /// [`Lite::next_ready_in_ms`] of the tasks `filter` admits.
    async fn next_ready_of(&self, filter: ClaimFilter<'_>) -> Result<Option<i64>, StoreError> {
        let row: Option<(Option<f64>,)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT (julianday(MIN(t.available_at)) - julianday('now', {CLOCK})) * 86400000.0
             FROM tasks t JOIN runs r ON r.run_id = t.run_id
             WHERE t.status = 'ready' AND {tenant_in_list} AND {covered}
               AND (r.status IN ('running', 'waiting') OR (r.status = 'paused' AND t.runs_while_paused))",
            tenant_in_list = tenant_in_list(1),
            covered = covered_by(2),
        )))
        .bind(tenant_list(filter.tenants))
        .bind(tenant_list(filter.capabilities))
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

    pub(crate) async fn task_tenant(&self, task_id: Uuid) -> Result<Option<String>, StoreError> {
        let row: Option<(String,)> = sqlx::query_as("SELECT tenant FROM tasks WHERE task_id = ?1")
            .bind(task_id)
            .fetch_optional(&self.read)
            .await?;
        Ok(row.map(|r| r.0))
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
}
