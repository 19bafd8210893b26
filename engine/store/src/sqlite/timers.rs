//! Timers (`timers`) and callback tokens (`callbacks`) that runs wait on,
//! and the engine's clock they are judged by (SQLite's `'now'`, shifted by
//! `belay_clock` for tests).

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{Lite, NOW};
use crate::rows::StoreError;

impl Lite {
    pub(crate) async fn due_timers(
        &self,
        limit: i64,
    ) -> Result<Vec<(Uuid, String, i64)>, StoreError> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT run_id, timer_id,
                    MAX(0, CAST(ROUND((julianday({NOW}) - julianday(fire_at)) * 86400000.0) AS INTEGER))
               FROM timers WHERE fire_at <= {NOW}
             ORDER BY fire_at, run_id, timer_id LIMIT ?1"
        )))
        .bind(limit)
        .fetch_all(&self.read)
        .await?)
    }

    pub(crate) async fn callback_run(
        &self,
        token_sha256: &str,
    ) -> Result<Option<Uuid>, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT run_id FROM callbacks WHERE token_sha256 = ?1")
                .bind(token_sha256)
                .fetch_optional(&self.read)
                .await?,
        )
    }

    pub(crate) async fn advance_clock(&self, ms: i64) -> Result<(), StoreError> {
        sqlx::query("UPDATE belay_clock SET offset_ms = offset_ms + ?1 WHERE id = 1")
            .bind(ms)
            .execute(&self.write)
            .await?;
        // Delayed tasks may be due now.
        self.tasks_seq.bump();
        Ok(())
    }

    pub(crate) async fn clock_now(&self) -> Result<DateTime<Utc>, StoreError> {
        Ok(
            sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT {NOW}")))
                .fetch_one(&self.read)
                .await?,
        )
    }
}
