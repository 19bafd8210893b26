//! Uncertain-outcome records (`uncertain_outcomes`), as operators read
//! them; they are written and resolved by transitions
//! (`write_decision.rs`).

use uuid::Uuid;

use super::{CLOCK, Lite, keyset};
use crate::rows::{StoreError, UncertainQuery, UncertainRow};

const UNCERTAIN_COLUMNS: &str = "uncertain_id, tenant, run_id, task_id, call_id, node_id, tool, tool_version, arguments,
    idempotency_key, attempts, worker_id, reason, status, created_at, resolution, resolution_kind, resolved_by,
    resolved_at, resolved_via, resolution_reason, probe, discrepancy, occurrence";

impl Lite {
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
        let older = format!(
            "strftime('%Y-%m-%dT%H:%M:%fZ','now', {CLOCK}, printf('-%.3f seconds', ?5 / 1000.0))"
        );
        let newer = format!(
            "strftime('%Y-%m-%dT%H:%M:%fZ','now', {CLOCK}, printf('-%.3f seconds', ?6 / 1000.0))"
        );
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {UNCERTAIN_COLUMNS} FROM uncertain_outcomes
             WHERE tenant = ?1
               AND (?2 IS NULL OR status = ?2)
               AND (?3 IS NULL OR tool = ?3)
               AND (?4 IS NULL OR run_id = ?4)
               AND (?5 IS NULL OR created_at <= {older})
               AND (?6 IS NULL OR created_at >= {newer})
               AND (?7 IS NULL OR (created_at, uncertain_id) < (?7, ?8))
             ORDER BY created_at DESC, uncertain_id DESC LIMIT ?9"
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
}
