//! The workers that claimed lately (`workers`) and the ready tasks none of
//! them can take (worker pools, issue 21; `crate::pools`).

use uuid::Uuid;

use super::Pg;
use crate::pools::{LiveWorker, ReadyTask};
use crate::rows::StoreError;

/// A `workers` row: id, capabilities, tenants.
type WorkerRow = (String, Option<Vec<String>>, Option<Vec<String>>);

/// A ready task: id, run, tenant, kind, requires.
type ReadyRow = (Uuid, Uuid, String, String, Vec<String>);

impl Pg {
    /// [`crate::Store::record_worker`].
    pub(crate) async fn record_worker(
        &self,
        worker_id: &str,
        capabilities: Option<&[String]>,
        tenants: Option<&[String]>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO workers (worker_id, capabilities, tenants, last_claim_at)
             VALUES ($1, $2, $3, belay_now())
             ON CONFLICT (worker_id) DO UPDATE SET capabilities = EXCLUDED.capabilities,
                 tenants = EXCLUDED.tenants, last_claim_at = EXCLUDED.last_claim_at",
        )
        .bind(worker_id)
        .bind(capabilities)
        .bind(tenants)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// [`crate::Store::live_workers`].
    pub(crate) async fn live_workers(&self, live_ms: i64) -> Result<Vec<LiveWorker>, StoreError> {
        let rows: Vec<WorkerRow> = sqlx::query_as(
            "SELECT worker_id, capabilities, tenants FROM workers
             WHERE last_claim_at > belay_now() - make_interval(secs => $1::float8 / 1000.0)
             ORDER BY worker_id",
        )
        .bind(live_ms as f64)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(worker_id, capabilities, tenants)| LiveWorker {
                worker_id,
                capabilities,
                tenants,
            })
            .collect())
    }

    /// The ready tasks (of run `run_id`, or all) of runs that admit a
    /// claim, that no worker live within `live_ms` can take, in claim
    /// order, at most `limit`.
    pub(crate) async fn unclaimable_ready(
        &self,
        run_id: Option<Uuid>,
        live_ms: i64,
        limit: i64,
    ) -> Result<Vec<ReadyTask>, StoreError> {
        let rows: Vec<ReadyRow> = sqlx::query_as(concat!(
            "WITH live AS MATERIALIZED (
                 SELECT capabilities, tenants FROM workers
                 WHERE last_claim_at > belay_now() - make_interval(secs => $2::float8 / 1000.0))
             SELECT t.task_id, t.run_id, t.tenant, t.kind, t.requires FROM tasks t
             WHERE t.status = 'ready' AND ($1::uuid IS NULL OR t.run_id = $1) AND ",
            run_admits_task!(),
            "
               AND NOT EXISTS (SELECT 1 FROM live w
                               WHERE (w.tenants IS NULL OR t.tenant = ANY(w.tenants))
                                 AND (w.capabilities IS NULL OR t.requires <@ w.capabilities))
             ORDER BY t.available_at, t.task_id LIMIT $3"
        ))
        .bind(run_id)
        .bind(live_ms as f64)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(task_id, run_id, tenant, kind, requires)| ReadyTask {
                task_id,
                run_id,
                tenant,
                kind,
                requires,
            })
            .collect())
    }
}
