//! Uncertain-outcome records (`uncertain_outcomes`), as operators read
//! them; they are written and resolved by transitions
//! (`write_decision.rs`).

use uuid::Uuid;

use super::Pg;
use crate::rows::{StoreError, UncertainQuery, UncertainRow};

impl Pg {
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
