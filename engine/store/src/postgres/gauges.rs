//! The figures of the engine's database gauges (see `crate::gauges`).

use super::Pg;
use crate::gauges::{
    GaugeCounts, PAUSED_REASON_SQL, PoolConnections, WAITING_REASON_SQL, task_pool_sql,
};
use crate::rows::StoreError;

impl Pg {
    /// See [`Store::gauge_counts`](crate::Store::gauge_counts). One
    /// statement: four grouped counts, tagged by which gauge they feed (the
    /// backlog by kind and pool).
    pub(crate) async fn gauge_counts(&self) -> Result<GaugeCounts, StoreError> {
        let rows: Vec<(String, String, String, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "WITH clock AS MATERIALIZED (SELECT belay_now() AS now)
             SELECT 'ready', kind, pool, count(*) FROM
                 (SELECT t.kind, {pool} AS pool FROM tasks t
                  WHERE t.status = 'ready' AND t.available_at <= (SELECT now FROM clock) AND {admits}) r
             GROUP BY kind, pool
             UNION ALL
             SELECT 'uncertain', tenant, '', count(*) FROM uncertain_outcomes WHERE status = 'open' GROUP BY tenant
             UNION ALL
             SELECT 'paused', reason, '', count(*) FROM
                 (SELECT {PAUSED_REASON_SQL} AS reason FROM runs WHERE status = 'paused') p GROUP BY reason
             UNION ALL
             SELECT 'waiting', reason, '', count(*) FROM
                 (SELECT {WAITING_REASON_SQL} AS reason FROM runs WHERE status = 'waiting') w GROUP BY reason",
            admits = run_admits_task!(),
            pool = task_pool_sql("unnest(t.requires) AS tag", "tag"),
        )))
        .fetch_all(&self.pool)
        .await?;
        Ok(crate::gauges::sort_counts(rows))
    }

    /// See [`Store::pool_connections`](crate::Store::pool_connections).
    pub(crate) fn pool_connections(&self) -> PoolConnections {
        let idle = u32::try_from(self.pool.num_idle()).unwrap_or(u32::MAX);
        PoolConnections {
            idle,
            in_use: self.pool.size().saturating_sub(idle),
        }
    }
}
