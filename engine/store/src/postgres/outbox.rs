//! The outbox of cross-run work (`outbox`: start a child run, tell a
//! parent its child finished, cancel a child): written in the transition
//! that asks for it, claimed and carried out after it committed, at least
//! once.

use serde_json::Value;
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

use super::Pg;
use crate::rows::{OutboxRow, StoreError};

impl Pg {
    pub(crate) async fn claim_outbox(
        &self,
        limit: i64,
        lease_ms: i64,
    ) -> Result<Vec<OutboxRow>, StoreError> {
        Ok(sqlx::query_as(
            "WITH due AS (
                 SELECT outbox_id FROM outbox
                 WHERE done_at IS NULL AND next_attempt_at <= belay_now()
                 ORDER BY next_attempt_at, outbox_id
                 LIMIT $1
                 FOR UPDATE SKIP LOCKED)
             UPDATE outbox o SET attempts = o.attempts + 1,
                    next_attempt_at = belay_now() + $2::float8 * interval '1 millisecond'
             FROM due WHERE o.outbox_id = due.outbox_id
             RETURNING o.outbox_id, o.kind, o.run_id, o.payload, o.attempts",
        )
        .bind(limit)
        .bind(lease_ms as f64)
        .fetch_all(&self.pool)
        .await?)
    }

    pub(crate) async fn finish_outbox(
        &self,
        outbox_id: Uuid,
        error: Option<&str>,
    ) -> Result<(), StoreError> {
        match error {
            None => sqlx::query(
                "UPDATE outbox SET done_at = belay_now(), last_error = NULL WHERE outbox_id = $1",
            )
            .bind(outbox_id)
            .execute(&self.pool)
            .await?,
            Some(e) => {
                sqlx::query("UPDATE outbox SET last_error = $2 WHERE outbox_id = $1")
                    .bind(outbox_id)
                    .bind(e)
                    .execute(&self.pool)
                    .await?
            }
        };
        Ok(())
    }
}

/// Write an outbox row (in the transition's transaction).
pub(super) async fn insert_outbox(
    tx: &mut Transaction<'static, Postgres>,
    run_id: Uuid,
    kind: &str,
    payload: &Value,
) -> Result<(), StoreError> {
    sqlx::query("INSERT INTO outbox (outbox_id, kind, run_id, payload) VALUES ($1, $2, $3, $4)")
        .bind(Uuid::now_v7())
        .bind(kind)
        .bind(run_id)
        .bind(payload)
        .execute(&mut **tx)
        .await?;
    Ok(())
}
