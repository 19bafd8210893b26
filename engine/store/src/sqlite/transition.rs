//! One run transition ([`Store::transition`](crate::Store::transition)):
//! `BEGIN IMMEDIATE` on the one writer (which stands for PostgreSQL's row
//! locks), read the run (and the task), fold the history from the cached
//! state, let the machine decide (passing the tool gates and the tool cache
//! it asks for), write the decision (`write_decision.rs`) and commit, then
//! wake (`wakes.rs`).

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{Sqlite, Transaction};
use uuid::Uuid;

use super::gates::pass_tool_gates;
use super::tool_cache::serve_from_cache;
use super::write_decision::write_decision;
use super::{Lite, NOW};
use crate::hand_off::{HandOff, claimed, hand_off};
use crate::rows::{StoreError, TaskRow};
use crate::transition::{Applied, DecideFn, StateCache, Target, TransitionError};
use belay_machine::RunState;

impl Lite {
    pub(crate) async fn transition_at<E, F>(
        &self,
        target: Target,
        hand: Option<&HandOff<'_>>,
        mut decide: F,
    ) -> Result<Applied, TransitionError<E>>
    where
        F: DecideFn<E>,
    {
        // BEGIN IMMEDIATE on the one writer connection: the whole database
        // is locked for writing, which covers the run-row and task-row locks.
        let mut tx = self.begin().await?;
        let (target, dispatch) = target.split_dispatch();
        // The engine's clock is read by the same statement: the time of the
        // transition (`RunState::now`).
        type RunLock = (Uuid, String, i64, DateTime<Utc>);
        let (run, task_id): (Option<RunLock>, Option<Uuid>) = match target {
            Target::Run(run_id, task_id) => (
                sqlx::query_as(sqlx::AssertSqlSafe(format!(
                    "SELECT run_id, tenant, last_seq, {NOW} FROM runs WHERE run_id = ?1"
                )))
                .bind(run_id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(StoreError::from)?,
                task_id,
            ),
            Target::Task(task_id) | Target::Dispatch(task_id) => (
                sqlx::query_as(sqlx::AssertSqlSafe(format!(
                    "SELECT run_id, tenant, last_seq, {NOW} FROM runs
                     WHERE run_id = (SELECT run_id FROM tasks WHERE task_id = ?1)"
                )))
                .bind(task_id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(StoreError::from)?,
                Some(task_id),
            ),
        };
        let Some((run_id, tenant, last_seq, now)) = run else {
            return Err(StoreError::NotFound(match target {
                Target::Run(run_id, _) => format!("run {run_id}"),
                Target::Task(task_id) | Target::Dispatch(task_id) => format!("task {task_id}"),
            })
            .into());
        };
        let task = match task_id {
            Some(task_id) => {
                let row: Option<TaskRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                    "SELECT task_id, run_id, call_id, kind, status, attempt, worker_id, dispatched, dispatched_at,
                            available_at, (lease_expires_at IS NOT NULL AND lease_expires_at <= {NOW}) AS lease_expired
                     FROM tasks WHERE task_id = ?1 AND run_id = ?2"
                )))
                .bind(task_id)
                .bind(run_id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(StoreError::from)?;
                let mut row = row.ok_or_else(|| StoreError::NotFound(format!("task {task_id}")))?;
                // The tenant's grants for the permission check at dispatch,
                // in the same transaction (an embedded read, no round trip).
                if dispatch || hand.is_some() {
                    let grants: Option<(Value,)> =
                        sqlx::query_as("SELECT grants FROM tenants WHERE tenant = ?1")
                            .bind(&tenant)
                            .fetch_optional(&mut *tx)
                            .await
                            .map_err(StoreError::from)?;
                    if let Some((v,)) = grants {
                        row.tenant_grants = serde_json::from_value(v).map_err(|e| {
                            StoreError::Corrupt(format!("grants of tenant {tenant}: {e}"))
                        })?;
                    }
                }
                Some(row)
            }
            None => None,
        };
        let cached = self
            .cache()
            .take(&run_id)
            .filter(|s| s.last_seq <= last_seq as u64);
        let mut state = load_state(&mut tx, run_id, cached).await?;
        if state.last_seq != last_seq as u64 {
            return Err(StoreError::Corrupt(format!(
                "run {run_id}: last_seq {last_seq} but {} events",
                state.last_seq
            ))
            .into());
        }
        state.now = Some(now);
        state.fleet_level = crate::fleet_level::machine_level(self.fleet_level());
        let mut decision = decide(&state, task.as_ref(), None);
        if let Ok(first) = &decision
            && let Some(asked) = crate::transition::gates_asked(first)
        {
            let verdict = pass_tool_gates(&mut tx, &tenant, &asked).await?;
            decision = decision.and_then(|first| {
                crate::transition::after_gates(first, verdict, &state, task.as_ref(), &mut decide)
            });
        }
        let decision = match decision {
            Ok(d) => d,
            Err(e) => {
                self.cache().put(run_id, state);
                return Err(e);
            }
        };
        let mut decision = serve_from_cache(&mut tx, &tenant, &state, decision).await?;
        let mut after = state;
        let ended_nodes = crate::transition::apply_events(&mut after, &decision.events);
        let grants = task
            .as_ref()
            .map(|t| t.tenant_grants.as_slice())
            .unwrap_or_default();
        let handed = hand.and_then(|h| hand_off(h, &tenant, grants, &mut decision, &mut after));
        let mut wakes = write_decision(
            &mut tx,
            run_id,
            &tenant,
            last_seq,
            &decision,
            &after,
            handed.as_ref(),
        )
        .await?;
        tx.commit().await.map_err(StoreError::from)?;
        let secrets = std::mem::take(&mut wakes.secrets);
        self.send_wakes(run_id, wakes);
        let handed = handed.and_then(|h| claimed(&h, &decision, run_id, &tenant));
        let applied = Applied {
            first_seq: last_seq as u64 + 1,
            events: decision.events.len(),
            status: after.status.as_str(),
            secrets,
            run_id,
            tenant,
            trace: after.trace.clone(),
            now,
            ended_nodes,
            handed,
        };
        self.cache().put(run_id, after);
        Ok(applied)
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, StateCache> {
        self.states
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

pub(super) async fn load_state(
    tx: &mut Transaction<'static, Sqlite>,
    run_id: Uuid,
    from: Option<RunState>,
) -> Result<RunState, StoreError> {
    let mut state = from.unwrap_or_default();
    let rows: Vec<(i64, Value)> = sqlx::query_as(
        "SELECT seq, payload FROM events WHERE run_id = ?1 AND seq > ?2 ORDER BY seq",
    )
    .bind(run_id)
    .bind(state.last_seq as i64)
    .fetch_all(&mut **tx)
    .await?;
    crate::transition::fold_tail(&mut state, run_id, rows)?;
    Ok(state)
}
