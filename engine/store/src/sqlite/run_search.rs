//! The operator console's run list on SQLite: a filtered keyset page of a
//! tenant's runs and their counts by status ([`RunSearch`]). Times are
//! bound in the stored text format, so they compare as text.

use super::runs::RUN_COLUMNS;
use super::{Lite, keyset, ts};
use crate::rows::{RunRow, StoreError};
use crate::run_search::RunSearch;

/// The filters of a search but its status and page, with the workflow,
/// the time range, the text pattern and the id pattern bound as `?first`
/// to `?first + 4`. `LIKE` is case-insensitive for ASCII in SQLite.
fn filters(first: u8) -> String {
    let [w, from, before, text, id] = [0, 1, 2, 3, 4].map(|i| first + i);
    format!(
        "(?{w} IS NULL OR workflow = ?{w})
         AND (?{from} IS NULL OR created_at >= ?{from})
         AND (?{before} IS NULL OR created_at < ?{before})
         AND (?{text} IS NULL
              OR input LIKE ?{text} ESCAPE '\\'
              OR idempotency_key LIKE ?{text} ESCAPE '\\'
              OR (?{id} IS NOT NULL AND lower(hex(run_id)) LIKE ?{id}))"
    )
}

impl Lite {
    /// A page of a tenant's runs matching `q`, newest first.
    pub(crate) async fn search_runs(&self, q: &RunSearch<'_>) -> Result<Vec<RunRow>, StoreError> {
        let (after_ts, after_id) = keyset(q.after);
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {RUN_COLUMNS} FROM runs
             WHERE tenant = ?1 AND (?2 IS NULL OR status = ?2) AND {}
               AND (?8 IS NULL OR (created_at, run_id) < (?8, ?9))
             ORDER BY created_at DESC, run_id DESC LIMIT ?10",
            filters(3)
        )))
        .bind(q.tenant)
        .bind(q.status)
        .bind(q.workflow)
        .bind(q.created_from.as_ref().map(ts))
        .bind(q.created_before.as_ref().map(ts))
        .bind(q.text_pattern())
        .bind(q.id_pattern())
        .bind(after_ts)
        .bind(after_id)
        .bind(q.limit)
        .fetch_all(&self.read)
        .await?)
    }

    /// How many of a tenant's runs match `q` (status and page aside), by
    /// status, in status order.
    pub(crate) async fn count_runs_by_status(
        &self,
        q: &RunSearch<'_>,
    ) -> Result<Vec<(String, i64)>, StoreError> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT status, count(*) FROM runs WHERE tenant = ?1 AND {}
             GROUP BY status ORDER BY status",
            filters(2)
        )))
        .bind(q.tenant)
        .bind(q.workflow)
        .bind(q.created_from.as_ref().map(ts))
        .bind(q.created_before.as_ref().map(ts))
        .bind(q.text_pattern())
        .bind(q.id_pattern())
        .fetch_all(&self.read)
        .await?)
    }
}
