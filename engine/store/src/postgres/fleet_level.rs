//! The fleet's behaviour level (`engine_replicas`, `fleet_level`,
//! migration `20261211000190`; `crate::fleet_level`).

use std::sync::atomic::Ordering;

use super::Pg;
use crate::StoreError;
use crate::fleet_level::{FleetRefresh, REPLICA_LIVE_MS, judge_join};

/// SQL: how many client connections to this database may be engines of a
/// release before the registry (level 0): not named `belay-engine…`, and
/// their last statement was an engine's, or one this user may not see.
/// An engine's `LISTEN` connection (sqlx's `PgListener`) last sent
/// `LISTEN "belay_tasks";…`, the channel quoted.
const UNREGISTERED_ENGINES: &str = "SELECT count(*) FROM pg_stat_activity a
     WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
       AND a.backend_type = 'client backend'
       AND a.application_name NOT LIKE 'belay-engine%'
       AND (a.query LIKE '%belay_now()%' OR a.query LIKE 'LISTEN belay%'
            OR a.query LIKE 'LISTEN \"belay%'
            OR a.query LIKE '%_sqlx_migrations%' OR a.query = '<insufficient privilege>')";

impl Pg {
    /// See [`crate::Store::join_fleet`].
    pub(crate) async fn join_fleet(&self, own: i32) -> Result<i32, StoreError> {
        let level: Option<i32> = sqlx::query_scalar("SELECT level FROM fleet_level WHERE id = 1")
            .fetch_optional(&self.pool)
            .await?;
        let level = level.ok_or_else(|| {
            StoreError::Corrupt("table fleet_level has no row (migration 20261211000190)".into())
        })?;
        judge_join(own, level)?;
        self.register_replica(own).await?;
        self.fleet_level.store(level, Ordering::Relaxed);
        Ok(level)
    }

    /// See [`crate::Store::refresh_fleet`].
    pub(crate) async fn refresh_fleet(&self, refresh: FleetRefresh) -> Result<i32, StoreError> {
        self.register_replica(refresh.level).await?;
        // The level is raised to the lowest live replica's once the fleet
        // has looked ready (every live replica above the level, no
        // unregistered engine connected) for the whole hold; never lowered
        // (GREATEST: a concurrent raise by another replica wins).
        let (level, unregistered): (i32, i64) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "WITH seen AS (
                 SELECT (SELECT min(level) FROM engine_replicas
                         WHERE last_seen_at > belay_now() - make_interval(secs => $1::float8 / 1000.0)) AS lowest,
                        ({UNREGISTERED_ENGINES}) AS unregistered
             ), judged AS (
                 SELECT s.lowest, s.unregistered,
                        (s.lowest > f.level AND s.unregistered = 0) AS ready,
                        COALESCE(f.ready_since, belay_now()) AS ready_from
                 FROM fleet_level f, seen s WHERE f.id = 1
             )
             UPDATE fleet_level f SET
                 ready_since = CASE WHEN j.ready THEN j.ready_from END,
                 level = CASE WHEN j.ready AND j.ready_from <= belay_now() - make_interval(secs => $2::float8 / 1000.0)
                              THEN GREATEST(f.level, j.lowest) ELSE f.level END,
                 raised_at = CASE WHEN j.ready AND j.ready_from <= belay_now() - make_interval(secs => $2::float8 / 1000.0)
                                   AND j.lowest > f.level
                              THEN belay_now() ELSE f.raised_at END
             FROM judged j WHERE f.id = 1
             RETURNING f.level, j.unregistered"
        )))
        .bind(REPLICA_LIVE_MS as f64)
        .bind(refresh.hold_ms as f64)
        .fetch_one(&self.pool)
        .await?;
        let was = self.fleet_level.swap(level, Ordering::Relaxed);
        if level > refresh.level {
            // The caller stops (`judge_join`); nothing is claimed for it.
        } else if level > was {
            tracing::info!(
                level,
                was,
                "every engine of the fleet implements behaviour level {level}: its behaviour is used from now on"
            );
        } else if unregistered > 0 && level < refresh.level {
            tracing::debug!(
                level,
                unregistered,
                "connections of engines of a release before the fleet registry keep the fleet's behaviour level"
            );
        }
        Ok(level)
    }

    /// Register (or refresh) this replica's row; rows of replicas gone for
    /// an hour are deleted.
    async fn register_replica(&self, level: i32) -> Result<(), StoreError> {
        sqlx::query(
            "WITH gone AS (DELETE FROM engine_replicas WHERE last_seen_at < belay_now() - interval '1 hour')
             INSERT INTO engine_replicas (replica_id, level, started_at, last_seen_at)
             VALUES ($1, $2, belay_now(), belay_now())
             ON CONFLICT (replica_id) DO UPDATE SET level = EXCLUDED.level, last_seen_at = EXCLUDED.last_seen_at",
        )
        .bind(self.replica_id)
        .bind(level)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// See [`crate::Store::fleet_level`].
    pub(crate) fn fleet_level(&self) -> i32 {
        self.fleet_level.load(Ordering::Relaxed)
    }
}
