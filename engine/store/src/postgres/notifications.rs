//! The notification outbox (`notifications`): rows are written by
//! [`Store::transition`] in the transaction that pauses a run on an
//! uncertain outcome; these statements let any engine replica deliver them.
//!
//! Claiming pushes `next_attempt_at` forward by a lease and counts the
//! attempt, under `FOR UPDATE SKIP LOCKED`, so replicas never deliver the
//! same row at once; a replica that dies mid-delivery leaves the row to be
//! claimed again when the lease passes. Later updates are fenced by
//! `attempts`, so a stale deliverer cannot overwrite a newer claim's state.
//! Times are judged by the database clock.

use uuid::Uuid;

#[cfg(doc)]
use crate::Store;
use crate::rows::{NotificationRow, NotificationStatus, StoreError};

impl super::Pg {
    /// Claim up to `limit` due notifications (oldest due first): each
    /// claimed row's `attempts` is incremented and its `next_attempt_at`
    /// pushed `lease_ms` into the future, so other replicas skip it.
    ///
    /// Errors: [`StoreError::Database`].
    pub(crate) async fn claim_due_notifications(
        &self,
        limit: i64,
        lease_ms: i64,
    ) -> Result<Vec<NotificationRow>, StoreError> {
        let rows = sqlx::query_as::<_, NotificationRow>(
            "WITH due AS (
                 SELECT notification_id FROM notifications
                 WHERE delivered_at IS NULL AND failed_at IS NULL AND next_attempt_at <= belay_now()
                 ORDER BY next_attempt_at, notification_id
                 LIMIT $1
                 FOR UPDATE SKIP LOCKED
             )
             UPDATE notifications n
             SET attempts = n.attempts + 1,
                 next_attempt_at = belay_now() + $2::float8 * interval '1 millisecond'
             FROM due
             WHERE n.notification_id = due.notification_id
             RETURNING n.notification_id, n.tenant, n.run_id, n.kind, n.payload, n.attempts, n.created_at",
        )
        .bind(limit)
        .bind(lease_ms as f64)
        .fetch_all(self.pool())
        .await?;
        Ok(rows)
    }

    /// Mark a notification delivered (whichever attempt delivered it).
    /// Returns whether the row changed (false: already delivered).
    ///
    /// Errors: [`StoreError::Database`].
    pub(crate) async fn mark_notification_delivered(&self, id: Uuid) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE notifications SET delivered_at = belay_now(), last_error = NULL
             WHERE notification_id = $1 AND delivered_at IS NULL",
        )
        .bind(id)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Record a failed attempt: schedule the next one `retry_in_ms` from now,
    /// or abandon delivery (`failed_at`) when `retry_in_ms` is `None`.
    /// Fenced by `attempt`: returns false (and changes nothing) when the row
    /// was claimed again meanwhile or is already delivered or abandoned.
    ///
    /// Errors: [`StoreError::Database`].
    pub(crate) async fn record_notification_failure(
        &self,
        id: Uuid,
        attempt: i32,
        error: &str,
        retry_in_ms: Option<i64>,
    ) -> Result<bool, StoreError> {
        let done = match retry_in_ms {
            Some(ms) => {
                sqlx::query(
                    "UPDATE notifications
                     SET last_error = $3, next_attempt_at = belay_now() + $4::float8 * interval '1 millisecond'
                     WHERE notification_id = $1 AND attempts = $2
                       AND delivered_at IS NULL AND failed_at IS NULL",
                )
                .bind(id)
                .bind(attempt)
                .bind(error)
                .bind(ms as f64)
                .execute(self.pool())
                .await?
            }
            None => {
                sqlx::query(
                    "UPDATE notifications SET last_error = $3, failed_at = belay_now()
                     WHERE notification_id = $1 AND attempts = $2
                       AND delivered_at IS NULL AND failed_at IS NULL",
                )
                .bind(id)
                .bind(attempt)
                .bind(error)
                .execute(self.pool())
                .await?
            }
        };
        Ok(done.rows_affected() == 1)
    }

    /// Delivery state of a run's notifications, oldest first.
    ///
    /// Errors: [`StoreError::Database`].
    pub(crate) async fn notifications_for_run(
        &self,
        run_id: Uuid,
    ) -> Result<Vec<NotificationStatus>, StoreError> {
        let rows = sqlx::query_as::<_, NotificationStatus>(
            "SELECT notification_id, tenant, run_id, kind, attempts, next_attempt_at,
                    delivered_at, failed_at, last_error
             FROM notifications WHERE run_id = $1
             ORDER BY created_at, notification_id",
        )
        .bind(run_id)
        .fetch_all(self.pool())
        .await?;
        Ok(rows)
    }
}
