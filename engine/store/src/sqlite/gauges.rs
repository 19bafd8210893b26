//! The figures of the engine's database gauges (see `crate::gauges`).

use super::{Lite, NOW};
use crate::gauges::{
    GaugeCounts, PAUSED_REASON_SQL, PoolConnections, WAITING_REASON_SQL, task_pool_sql,
};
use crate::rows::StoreError;

impl Lite {
    /// See [`Store::gauge_counts`](crate::Store::gauge_counts). One
    /// statement: four grouped counts, tagged by which gauge they feed (the
    /// backlog by kind and pool).
    pub(crate) async fn gauge_counts(&self) -> Result<GaugeCounts, StoreError> {
        let rows: Vec<(String, String, String, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT 'ready', kind, pool, count(*) FROM
                 (SELECT t.kind, {pool} AS pool FROM tasks t JOIN runs r ON r.run_id = t.run_id
                  WHERE t.status = 'ready' AND t.available_at <= {NOW}
                    AND (r.status IN ('running', 'waiting') OR (r.status = 'paused' AND t.runs_while_paused)))
             GROUP BY kind, pool
             UNION ALL
             SELECT 'uncertain', tenant, '', count(*) FROM uncertain_outcomes WHERE status = 'open' GROUP BY tenant
             UNION ALL
             SELECT 'paused', reason, '', count(*) FROM
                 (SELECT {PAUSED_REASON_SQL} AS reason FROM runs WHERE status = 'paused') GROUP BY reason
             UNION ALL
             SELECT 'waiting', reason, '', count(*) FROM
                 (SELECT {WAITING_REASON_SQL} AS reason FROM runs WHERE status = 'waiting') GROUP BY reason",
            pool = task_pool_sql("json_each(t.requires) AS tag", "tag.value"),
        )))
        .fetch_all(&self.read)
        .await?;
        Ok(crate::gauges::sort_counts(rows))
    }

    /// See [`Store::pool_connections`](crate::Store::pool_connections): the
    /// writer's pool and the readers' together.
    pub(crate) fn pool_connections(&self) -> PoolConnections {
        let idle = self.write.num_idle() + self.read.num_idle();
        let idle = u32::try_from(idle).unwrap_or(u32::MAX);
        PoolConnections {
            idle,
            in_use: (self.write.size() + self.read.size()).saturating_sub(idle),
        }
    }
}
