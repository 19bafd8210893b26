//! The outbox of cross-run work (`outbox`: start a child run, tell a
//! parent its child finished, cancel a child): written in the transition
//! that asks for it, claimed and carried out after it committed, at least
//! once.

use serde_json::Value;
use sqlx::{Sqlite, Transaction};
use uuid::Uuid;

use super::{Lite, NOW, now_plus_ms};
use crate::rows::{OutboxRow, StoreError};

impl Lite {
    pub(crate) async fn claim_outbox(
        &self,
        limit: i64,
        lease_ms: i64,
    ) -> Result<Vec<OutboxRow>, StoreError> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "UPDATE outbox SET attempts = attempts + 1, next_attempt_at = {lease}
             WHERE outbox_id IN (
                 SELECT outbox_id FROM outbox
                 WHERE done_at IS NULL AND next_attempt_at <= {NOW}
                 ORDER BY next_attempt_at, outbox_id
                 LIMIT ?1)
             RETURNING outbox_id, kind, run_id, payload, attempts",
            lease = now_plus_ms(2)
        )))
        .bind(limit)
        .bind(lease_ms as f64)
        .fetch_all(&self.write)
        .await?)
    }

    pub(crate) async fn finish_outbox(
        &self,
        outbox_id: Uuid,
        error: Option<&str>,
    ) -> Result<(), StoreError> {
        match error {
            None => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE outbox SET done_at = {NOW}, last_error = NULL WHERE outbox_id = ?1"
                )))
                .bind(outbox_id)
                .execute(&self.write)
                .await?
            }
            Some(e) => {
                sqlx::query("UPDATE outbox SET last_error = ?2 WHERE outbox_id = ?1")
                    .bind(outbox_id)
                    .bind(e)
                    .execute(&self.write)
                    .await?
            }
        };
        Ok(())
    }
}

/// Write an outbox row (in the transition's transaction).
pub(super) async fn insert_outbox(
    tx: &mut Transaction<'static, Sqlite>,
    run_id: Uuid,
    kind: &str,
    payload: &Value,
) -> Result<(), StoreError> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO outbox (outbox_id, kind, run_id, payload, next_attempt_at, created_at)
         VALUES (?1, ?2, ?3, ?4, {NOW}, {NOW})"
    )))
    .bind(Uuid::now_v7())
    .bind(kind)
    .bind(run_id)
    .bind(payload)
    .execute(&mut **tx)
    .await?;
    Ok(())
}
