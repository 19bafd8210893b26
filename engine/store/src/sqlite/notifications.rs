//! The notification outbox (`notifications`): the statements that deliver
//! the rows a transition wrote when it paused a run on an uncertain
//! outcome. The same claims and fences as `postgres/notifications.rs` (see
//! there); the one writer stands for `FOR UPDATE SKIP LOCKED`.

use uuid::Uuid;

use super::{Lite, NOW, now_plus_ms};
use crate::rows::{NotificationRow, NotificationStatus, StoreError};

impl Lite {
    pub(crate) async fn claim_due_notifications(
        &self,
        limit: i64,
        lease_ms: i64,
    ) -> Result<Vec<NotificationRow>, StoreError> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "UPDATE notifications SET attempts = attempts + 1, next_attempt_at = {lease}
             WHERE notification_id IN (
                 SELECT notification_id FROM notifications
                 WHERE delivered_at IS NULL AND failed_at IS NULL AND next_attempt_at <= {NOW}
                 ORDER BY next_attempt_at, notification_id
                 LIMIT ?1)
             RETURNING notification_id, tenant, run_id, kind, payload, attempts, created_at",
            lease = now_plus_ms(2)
        )))
        .bind(limit)
        .bind(lease_ms as f64)
        .fetch_all(&self.write)
        .await?)
    }

    pub(crate) async fn mark_notification_delivered(&self, id: Uuid) -> Result<bool, StoreError> {
        let done = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE notifications SET delivered_at = {NOW}, last_error = NULL
             WHERE notification_id = ?1 AND delivered_at IS NULL"
        )))
        .bind(id)
        .execute(&self.write)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    pub(crate) async fn record_notification_failure(
        &self,
        id: Uuid,
        attempt: i32,
        error: &str,
        retry_in_ms: Option<i64>,
    ) -> Result<bool, StoreError> {
        let done = match retry_in_ms {
            Some(ms) => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE notifications SET last_error = ?3, next_attempt_at = {next}
                     WHERE notification_id = ?1 AND attempts = ?2
                       AND delivered_at IS NULL AND failed_at IS NULL",
                    next = now_plus_ms(4)
                )))
                .bind(id)
                .bind(attempt)
                .bind(error)
                .bind(ms as f64)
                .execute(&self.write)
                .await?
            }
            None => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE notifications SET last_error = ?3, failed_at = {NOW}
                     WHERE notification_id = ?1 AND attempts = ?2
                       AND delivered_at IS NULL AND failed_at IS NULL"
                )))
                .bind(id)
                .bind(attempt)
                .bind(error)
                .execute(&self.write)
                .await?
            }
        };
        Ok(done.rows_affected() == 1)
    }

    pub(crate) async fn notifications_for_run(
        &self,
        run_id: Uuid,
    ) -> Result<Vec<NotificationStatus>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT notification_id, tenant, run_id, kind, attempts, next_attempt_at,
                    delivered_at, failed_at, last_error
             FROM notifications WHERE run_id = ?1
             ORDER BY created_at, notification_id",
        )
        .bind(run_id)
        .fetch_all(&self.read)
        .await?)
    }
}
