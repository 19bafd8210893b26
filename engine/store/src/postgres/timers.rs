//! Timers (`timers`) and callback tokens (`callbacks`) that runs wait on,
//! and the engine's clock they are judged by (`belay_now()`, shifted by
//! `belay_clock` for tests).

use uuid::Uuid;

use super::Pg;
use crate::rows::StoreError;

impl Pg {
    pub(crate) async fn due_timers(
        &self,
        limit: i64,
    ) -> Result<Vec<(Uuid, String, i64)>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT run_id, timer_id,
                    GREATEST(0, (EXTRACT(EPOCH FROM (belay_now() - fire_at)) * 1000)::BIGINT)
               FROM timers WHERE fire_at <= belay_now()
             ORDER BY fire_at, run_id, timer_id LIMIT $1",
        )
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }

    pub(crate) async fn callback_run(
        &self,
        token_sha256: &str,
    ) -> Result<Option<Uuid>, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT run_id FROM callbacks WHERE token_sha256 = $1")
                .bind(token_sha256)
                .fetch_optional(&self.pool)
                .await?,
        )
    }

    pub(crate) async fn advance_clock(&self, ms: i64) -> Result<(), StoreError> {
        sqlx::query("UPDATE belay_clock SET offset_ms = offset_ms + $1 WHERE id = 1")
            .bind(ms)
            .execute(&self.pool)
            .await?;
        // Delayed tasks may be due now.
        self.wakes.tasks_may_be_claimable();
        Ok(())
    }

    pub(crate) async fn clock_now(&self) -> Result<chrono::DateTime<chrono::Utc>, StoreError> {
        Ok(sqlx::query_scalar("SELECT belay_now()")
            .fetch_one(&self.pool)
            .await?)
    }
}
