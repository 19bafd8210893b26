//! The operator console's run list on PostgreSQL: a filtered keyset page
//! of a tenant's runs and their counts by status ([`RunSearch`]).

use super::Pg;
use super::runs::RUN_COLUMNS;
use crate::rows::{RunRow, StoreError};
use crate::run_search::RunSearch;

/// The filters of a search but its status and page, with the workflow,
/// the time range, the text pattern and the id pattern bound as `$first`
/// to `$first + 4`.
fn filters(first: u8) -> String {
    let [w, from, before, text, id] = [0, 1, 2, 3, 4].map(|i| first + i);
    format!(
        "(${w}::text IS NULL OR workflow = ${w})
         AND (${from}::timestamptz IS NULL OR created_at >= ${from})
         AND (${before}::timestamptz IS NULL OR created_at < ${before})
         AND (${text}::text IS NULL
              OR input::text ILIKE ${text} ESCAPE '\\'
              OR idempotency_key ILIKE ${text} ESCAPE '\\'
              OR (${id}::text IS NOT NULL AND replace(run_id::text, '-', '') LIKE ${id}))"
    )
}

impl Pg {
    /// A page of a tenant's runs matching `q`, newest first.
    pub(crate) async fn search_runs(&self, q: &RunSearch<'_>) -> Result<Vec<RunRow>, StoreError> {
        let (after_ts, after_id) = match q.after {
            Some((ts, id)) => (Some(ts), Some(id)),
            None => (None, None),
        };
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {RUN_COLUMNS} FROM runs
             WHERE tenant = $1 AND ($2::text IS NULL OR status = $2) AND {}
               AND ($8::timestamptz IS NULL OR (created_at, run_id) < ($8, $9))
             ORDER BY created_at DESC, run_id DESC LIMIT $10",
            filters(3)
        )))
        .bind(q.tenant)
        .bind(q.status)
        .bind(q.workflow)
        .bind(q.created_from)
        .bind(q.created_before)
        .bind(q.text_pattern())
        .bind(q.id_pattern())
        .bind(after_ts)
        .bind(after_id)
        .bind(q.limit)
        .fetch_all(&self.pool)
        .await?)
    }

    /// How many of a tenant's runs match `q` (status and page aside), by
    /// status, in status order.
    pub(crate) async fn count_runs_by_status(
        &self,
        q: &RunSearch<'_>,
    ) -> Result<Vec<(String, i64)>, StoreError> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT status, count(*) FROM runs WHERE tenant = $1 AND {}
             GROUP BY status ORDER BY status",
            filters(2)
        )))
        .bind(q.tenant)
        .bind(q.workflow)
        .bind(q.created_from)
        .bind(q.created_before)
        .bind(q.text_pattern())
        .bind(q.id_pattern())
        .fetch_all(&self.pool)
        .await?)
    }
}
