//! Runs (`runs`) and their history (`events`): creating a run with its
//! first decision, reading runs, events, folded states and the rows of a
//! run's secret vault. A run's later transitions are in `transition.rs`.

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::tool_cache::serve_from_cache;
use super::transition::load_state;
use super::write_decision::write_decision;
use super::{Lite, NOW, keyset};
use crate::rows::{EventRow, RunRow, StoreError};
use belay_machine::{Decision, RunState};

pub(super) const RUN_COLUMNS: &str = "run_id, tenant, workflow, workflow_version, status, status_reason, input, output, idempotency_key, caller, last_seq, created_at, updated_at";

impl Lite {
    pub(crate) async fn run_by_idempotency_key(
        &self,
        tenant: &str,
        key: &str,
    ) -> Result<Option<RunRow>, StoreError> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE tenant = ?1 AND idempotency_key = ?2"
        )))
        .bind(tenant)
        .bind(key)
        .fetch_optional(&self.read)
        .await?)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn create_run(
        &self,
        run_id: Uuid,
        tenant: &str,
        workflow: &str,
        workflow_version: i32,
        input: &Value,
        idempotency_key: &str,
        caller: &str,
        decision: &Decision,
        parent: Option<(Uuid, &str)>,
    ) -> Result<(RunRow, bool), StoreError> {
        let mut tx = self.begin().await?;
        let inserted = sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO runs (run_id, tenant, workflow, workflow_version, status, input, idempotency_key, caller,
                               parent_run_id, parent_call_id, created_at, updated_at)
             VALUES (?1, ?2, ?3, ?4, 'pending', ?5, ?6, ?7, ?8, ?9, {NOW}, {NOW})
             ON CONFLICT (tenant, idempotency_key) DO NOTHING"
        )))
        .bind(run_id)
        .bind(tenant)
        .bind(workflow)
        .bind(workflow_version)
        .bind(input)
        .bind(idempotency_key)
        .bind(caller)
        .bind(parent.map(|p| p.0))
        .bind(parent.map(|p| p.1))
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if inserted == 0 {
            tx.rollback().await?;
            let row = self
                .run_by_idempotency_key(tenant, idempotency_key)
                .await?
                .ok_or_else(|| {
                    StoreError::NotFound(format!("run with idempotency key {idempotency_key}"))
                })?;
            return Ok((row, false));
        }
        let served;
        let decision = if crate::transition::cache_lookups(&decision.commands).is_empty() {
            decision
        } else {
            // The start's state as the coordinator built it: the level of
            // the forms the fleet reads (the rest is empty at a start).
            let start = RunState {
                fleet_level: crate::fleet_level::machine_level(self.fleet_level()),
                ..RunState::default()
            };
            served = serve_from_cache(&mut tx, tenant, &start, decision.clone()).await?;
            &served
        };
        let mut state = RunState::default();
        for event in &decision.events {
            state.apply(event);
        }
        let wakes = write_decision(&mut tx, run_id, tenant, 0, decision, &state, None).await?;
        tx.commit().await?;
        self.send_wakes(run_id, wakes);
        let row = self
            .get_run(tenant, run_id)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("run {run_id}")))?;
        Ok((row, true))
    }

    pub(crate) async fn get_run(
        &self,
        tenant: &str,
        run_id: Uuid,
    ) -> Result<Option<RunRow>, StoreError> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE tenant = ?1 AND run_id = ?2"
        )))
        .bind(tenant)
        .bind(run_id)
        .fetch_optional(&self.read)
        .await?)
    }

    /// How many ancestors `run_id` has, counting at most `limit + 1`.
    pub(crate) async fn run_depth(&self, run_id: Uuid, limit: u32) -> Result<u32, StoreError> {
        let depth: i64 = sqlx::query_scalar(
            "WITH RECURSIVE chain (parent_run_id, depth) AS (
                 SELECT parent_run_id, 0 FROM runs WHERE run_id = ?1
               UNION ALL
                 SELECT r.parent_run_id, c.depth + 1
                 FROM runs r JOIN chain c ON r.run_id = c.parent_run_id
                 WHERE c.depth <= ?2
             )
             SELECT COALESCE(MAX(depth), 0) FROM chain",
        )
        .bind(run_id)
        .bind(i64::from(limit))
        .fetch_one(&self.read)
        .await?;
        Ok(u32::try_from(depth).unwrap_or(u32::MAX))
    }

    pub(crate) async fn list_runs(
        &self,
        tenant: &str,
        status: Option<&str>,
        after: Option<(DateTime<Utc>, Uuid)>,
        limit: i64,
    ) -> Result<Vec<RunRow>, StoreError> {
        let (after_ts, after_id) = keyset(after);
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {RUN_COLUMNS} FROM runs
             WHERE tenant = ?1 AND (?2 IS NULL OR status = ?2)
               AND (?3 IS NULL OR (created_at, run_id) < (?3, ?4))
             ORDER BY created_at DESC, run_id DESC LIMIT ?5"
        )))
        .bind(tenant)
        .bind(status)
        .bind(after_ts)
        .bind(after_id)
        .bind(limit)
        .fetch_all(&self.read)
        .await?)
    }

    pub(crate) async fn list_events(
        &self,
        run_id: Uuid,
        after_seq: i64,
        limit: i64,
    ) -> Result<Vec<EventRow>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT run_id, seq, kind, payload, recorded_at FROM events
             WHERE run_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
        )
        .bind(run_id)
        .bind(after_seq)
        .bind(limit)
        .fetch_all(&self.read)
        .await?)
    }

    pub(crate) async fn run_state(&self, run_id: Uuid) -> Result<RunState, StoreError> {
        let mut tx = self.read.begin().await?;
        let state = load_state(&mut tx, run_id, None).await?;
        tx.commit().await?;
        Ok(state)
    }

    /// See [`crate::Store::tool_gate`].
    pub(crate) async fn run_secrets(
        &self,
        run_id: Uuid,
    ) -> Result<Vec<crate::rows::RunSecretRow>, StoreError> {
        type Row = (String, String, Option<String>, bool, String, Option<String>);
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT key, producer_call, expires_at, single_use, consumers, consumed_by_call
             FROM run_secrets WHERE run_id = ?1 ORDER BY key",
        )
        .bind(run_id)
        .fetch_all(&self.read)
        .await?;
        rows.into_iter()
            .map(
                |(key, producer_call, expires_at, single_use, consumers, consumed_by_call)| {
                    let consumers: Vec<String> = serde_json::from_str(&consumers)
                        .map_err(|e| StoreError::Corrupt(format!("run_secrets.consumers: {e}")))?;
                    let expires_at = match expires_at {
                        Some(t) => Some(
                            chrono::DateTime::parse_from_rfc3339(&t)
                                .map_err(|e| {
                                    StoreError::Corrupt(format!("run_secrets.expires_at: {e}"))
                                })?
                                .with_timezone(&Utc),
                        ),
                        None => None,
                    };
                    Ok(crate::rows::RunSecretRow {
                        key,
                        producer_call,
                        expires_at,
                        single_use,
                        consumers,
                        consumed_by_call,
                    })
                },
            )
            .collect()
    }
}
