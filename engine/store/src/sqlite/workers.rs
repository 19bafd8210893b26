//! The workers that claimed lately (`workers`) and the ready tasks none of
//! them can take (worker pools, issue 21; `crate::pools`). Lists are JSON
//! arrays; "covers" is a `json_each` anti-join.

use serde_json::Value;
use uuid::Uuid;

use super::{Lite, NOW, now_plus_ms};
use crate::pools::{LiveWorker, ReadyTask};
use crate::rows::StoreError;

/// A stored JSON array of strings (`None` stays `None`).
fn strings(json: Option<String>, column: &str) -> Result<Option<Vec<String>>, StoreError> {
    json.map(|j| {
        serde_json::from_str(&j).map_err(|e| {
            StoreError::Corrupt(format!("`{column}` is not a JSON array of strings: {e}"))
        })
    })
    .transpose()
}

impl Lite {
    pub(crate) async fn record_worker(
        &self,
        worker_id: &str,
        capabilities: Option<&[String]>,
        tenants: Option<&[String]>,
    ) -> Result<(), StoreError> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO workers (worker_id, capabilities, tenants, last_claim_at)
             VALUES (?1, ?2, ?3, {NOW})
             ON CONFLICT (worker_id) DO UPDATE SET capabilities = excluded.capabilities,
                 tenants = excluded.tenants, last_claim_at = excluded.last_claim_at"
        )))
        .bind(worker_id)
        .bind(capabilities.map(|c| Value::from(c.to_vec())))
        .bind(tenants.map(|t| Value::from(t.to_vec())))
        .execute(&self.write)
        .await?;
        Ok(())
    }

    pub(crate) async fn live_workers(&self, live_ms: i64) -> Result<Vec<LiveWorker>, StoreError> {
        let rows: Vec<(String, Option<String>, Option<String>)> =
            sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "SELECT worker_id, capabilities, tenants FROM workers
                 WHERE last_claim_at > {since} ORDER BY worker_id",
                since = now_plus_ms(1),
            )))
            .bind(-(live_ms as f64))
            .fetch_all(&self.read)
            .await?;
        rows.into_iter()
            .map(|(worker_id, capabilities, tenants)| {
                Ok(LiveWorker {
                    worker_id,
                    capabilities: strings(capabilities, "workers.capabilities")?,
                    tenants: strings(tenants, "workers.tenants")?,
                })
            })
            .collect()
    }

    pub(crate) async fn unclaimable_ready(
        &self,
        run_id: Option<Uuid>,
        live_ms: i64,
        limit: i64,
    ) -> Result<Vec<ReadyTask>, StoreError> {
        let rows: Vec<(Uuid, Uuid, String, String, String)> =
            sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "SELECT t.task_id, t.run_id, t.tenant, t.kind, t.requires
                 FROM tasks t JOIN runs r ON r.run_id = t.run_id
                 WHERE t.status = 'ready' AND (?1 IS NULL OR t.run_id = ?1)
                   AND (r.status IN ('running', 'waiting') OR (r.status = 'paused' AND t.runs_while_paused))
                   AND NOT EXISTS (
                       SELECT 1 FROM workers w
                       WHERE w.last_claim_at > {since}
                         AND (w.tenants IS NULL OR t.tenant IN (SELECT value FROM json_each(w.tenants)))
                         AND (w.capabilities IS NULL OR NOT EXISTS (
                                 SELECT 1 FROM json_each(t.requires) q
                                 WHERE q.value NOT IN (SELECT value FROM json_each(w.capabilities)))))
                 ORDER BY t.available_at, t.task_id LIMIT ?3",
                since = now_plus_ms(2),
            )))
            .bind(run_id)
            .bind(-(live_ms as f64))
            .bind(limit)
            .fetch_all(&self.read)
            .await?;
        rows.into_iter()
            .map(|(task_id, run_id, tenant, kind, requires)| {
                Ok(ReadyTask {
                    task_id,
                    run_id,
                    tenant,
                    kind,
                    requires: strings(Some(requires), "tasks.requires")?.unwrap_or_default(),
                })
            })
            .collect()
    }
}
