//! One run transition ([`Store::transition`](crate::Store::transition)):
//! lock the run (and the task) in one statement, fold the history from the
//! cached state, let the machine decide (passing the tool gates and the
//! tool cache it asks for), write the decision (`write_decision.rs`) and
//! commit, then wake (`wakes.rs`).

use serde_json::Value;
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

use super::Pg;
use super::gates::pass_tool_gates;
use super::optimistic::{Optimistic, raced};
use super::tool_cache::serve_from_cache;
use super::write_decision::write_decision;
use crate::hand_off::{HandOff, HandedLease, claimed, hand_off};
use crate::rows::{StoreError, TaskRow};
use crate::transition::{Applied, DecideFn, StateCache, Target, TransitionError};
use belay_machine::RunState;
use belay_machine::gates::GateVerdict;

impl Pg {
    /// See [`Store::transition`](crate::Store::transition). A worker's
    /// report of a task this engine handed over is first tried without the
    /// lock statement (`optimistic.rs`); a decision made that way that
    /// one statement cannot write is written by the locking transition,
    /// if the rows it locks are as that decision assumed.
    pub(crate) async fn transition_at<E, F>(
        &self,
        target: Target,
        hand: Option<&HandOff<'_>>,
        mut decide: F,
    ) -> Result<Applied, TransitionError<E>>
    where
        F: DecideFn<E>,
    {
        let (Target::Task(task_id), Some(hand)) = (target, hand) else {
            return self.transition_locked(target, hand, decide).await;
        };
        match self.optimistic(task_id, hand, &mut decide).await? {
            Optimistic::NotTried => self.transition_locked(target, Some(hand), decide).await,
            Optimistic::Written(applied) => Ok(applied),
            Optimistic::Decided(lease, decided) => {
                let mut decided = Some(decided);
                let premade = move |state: &RunState,
                                    task: Option<&TaskRow>,
                                    verdict: Option<&GateVerdict>| {
                    let same = verdict.is_none()
                        && state.last_seq == lease.last_seq
                        && task.is_some_and(|t| lease.matches(t));
                    // A verdict means the gates held the decision back: it
                    // would have to be made again, which it cannot.
                    match decided.take() {
                        Some(decided) if same => decided,
                        _ => Err(raced(lease.task.run_id).into()),
                    }
                };
                self.transition_locked(target, Some(hand), premade).await
            }
        }
    }

    /// [`Pg::transition_at`] with the run (and task) rows locked first.
    async fn transition_locked<E, F>(
        &self,
        target: Target,
        hand: Option<&HandOff<'_>>,
        mut decide: F,
    ) -> Result<Applied, TransitionError<E>>
    where
        F: DecideFn<E>,
    {
        let mut tx = self.pool.begin().await.map_err(StoreError::from)?;
        // When the clock below is read, by this engine's clock (a handed
        // lease's time is estimated from both).
        let began = std::time::Instant::now();
        // Lock order everywhere: run row, then task row. Both are locked by
        // one statement (one round trip): the CTE locks the run row, then the
        // lateral sub-select locks the task row of that run. The task is
        // found by its key alone: `(run_id = r.run_id) IS TRUE` is no index
        // condition, so a generic plan made while `tasks` was empty cannot
        // pick the (run_id, call_id) index and read every task of the run
        // (seen with auto_explain: a 300-call run's lock read 150 rows).
        let (target, dispatch) = target.split_dispatch();
        let (run_id, task_id) = match target {
            Target::Run(run_id, task_id) => (Some(run_id), task_id),
            Target::Task(task_id) | Target::Dispatch(task_id) => (None, Some(task_id)),
        };
        // A task's lease this engine recorded is of no more use once the
        // task is reported or changed under the lock (a dispatch of a
        // handed task changes nothing the record holds, or changes the
        // run's `last_seq`, which the record is checked against).
        if let (Some(task_id), false) = (task_id, dispatch) {
            self.cache().take_lease(&task_id);
        }
        let row: Option<LockedRow> = sqlx::query_as(concat!(
            "WITH clock AS MATERIALIZED (SELECT belay_now() AS now),
             r AS (
                 SELECT run_id, tenant, last_seq FROM runs
                 WHERE run_id = COALESCE($1, (SELECT run_id FROM tasks WHERE task_id = $2))
                 FOR UPDATE)
             SELECT r.run_id, r.tenant, r.last_seq, (SELECT now FROM clock) AS now,
                    t.task_id, t.call_id, t.kind, t.status, t.attempt, t.worker_id, t.dispatched,
                    t.dispatched_at, t.lease_expired, t.available_at,
                    CASE WHEN $3 THEN (SELECT grants FROM tenants WHERE tenant = r.tenant) END AS tenant_grants
             FROM r LEFT JOIN LATERAL (
                 SELECT t.task_id, t.call_id, t.kind, t.status, t.attempt, t.worker_id, t.dispatched,
                        t.dispatched_at, t.available_at,
                        (t.lease_expires_at IS NOT NULL AND NOT ",
            lease_holds!("(SELECT now FROM clock)"),
            ") AS lease_expired
                 FROM tasks t WHERE t.task_id = $2 AND (t.run_id = r.run_id) IS TRUE
                 FOR UPDATE) t ON true"
        ))
        .bind(run_id)
        .bind(task_id)
        .bind(dispatch || hand.is_some())
        .fetch_optional(&mut *tx)
        .await
        .map_err(StoreError::from)?;
        let Some(row) = row else {
            return Err(StoreError::NotFound(match target {
                Target::Run(run_id, _) => format!("run {run_id}"),
                Target::Task(task_id) | Target::Dispatch(task_id) => format!("task {task_id}"),
            })
            .into());
        };
        let (run_id, tenant, last_seq) = (row.run_id, row.tenant.clone(), row.last_seq);
        let task = match task_id {
            Some(task_id) => Some(
                row.task()
                    .ok_or_else(|| StoreError::NotFound(format!("task {task_id}")))?,
            ),
            None => None,
        };
        // Start from the cached state when it is not ahead of the run row
        // (it never is, unless a transaction that produced it rolled back
        // after the cache was filled, which `put` after commit prevents).
        let cached = self
            .cache()
            .take(&run_id)
            .filter(|s| s.last_seq <= last_seq as u64);
        let mut state = load_state(&mut tx, run_id, cached, Some(last_seq as u64)).await?;
        if state.last_seq != last_seq as u64 {
            return Err(StoreError::Corrupt(format!(
                "run {run_id}: last_seq {last_seq} but {} events",
                state.last_seq
            ))
            .into());
        }
        state.now = Some(row.now);
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
        let grants = row.tenant_grants.as_deref().unwrap_or_default();
        let handed = hand.and_then(|h| hand_off(h, &tenant, grants, &mut decision, &mut after));
        let mut wakes = write_decision(
            &mut tx,
            run_id,
            &tenant,
            last_seq,
            &decision,
            &after,
            Some(row.now),
            task.as_ref().map(|t| (t.call_id.as_str(), t.task_id)),
            handed.as_ref(),
        )
        .await?;
        let secrets = std::mem::take(&mut wakes.secrets);
        tx.commit().await.map_err(StoreError::from)?;
        self.wakes.send(run_id, wakes);
        let handed = handed.and_then(|h| {
            let claimed = claimed(&h, &decision, run_id, &tenant)?;
            let run = (run_id, tenant.as_str(), after.last_seq);
            self.cache().put_lease(HandedLease::of(
                &h,
                &claimed.kind,
                run,
                grants,
                (row.now, began),
            ));
            Some(claimed)
        });
        let applied = Applied {
            first_seq: last_seq as u64 + 1,
            events: decision.events.len(),
            status: after.status.as_str(),
            secrets,
            run_id,
            tenant,
            trace: after.trace.clone(),
            now: row.now,
            ended_nodes,
            handed,
        };
        // Only a committed state may be cached.
        self.cache().put(run_id, after);
        Ok(applied)
    }

    pub(super) fn cache(&self) -> std::sync::MutexGuard<'_, StateCache> {
        // The cache holds no invariant a panic could break: ignore poisoning.
        self.states
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Fold a run's events (inside the transition's transaction).
/// Fold a run's events after `from` (a state known to be a prefix of the
/// history: its `last_seq` events), or from the start.
/// The run row and (for a task's transition) the task row, locked by the
/// first statement of a transition.
#[derive(sqlx::FromRow)]
struct LockedRow {
    run_id: Uuid,
    tenant: String,
    last_seq: i64,
    /// The engine's clock (the time of the transition, `RunState::now`).
    now: chrono::DateTime<chrono::Utc>,
    task_id: Option<Uuid>,
    call_id: Option<String>,
    kind: Option<String>,
    status: Option<String>,
    attempt: Option<i32>,
    worker_id: Option<String>,
    dispatched: Option<bool>,
    dispatched_at: Option<chrono::DateTime<chrono::Utc>>,
    lease_expired: Option<bool>,
    available_at: Option<chrono::DateTime<chrono::Utc>>,
    tenant_grants: Option<Vec<String>>,
}

impl LockedRow {
    /// The task row, if one was asked for and belongs to the run.
    fn task(&self) -> Option<TaskRow> {
        Some(TaskRow {
            task_id: self.task_id?,
            run_id: self.run_id,
            call_id: self.call_id.clone()?,
            kind: self.kind.clone()?,
            status: self.status.clone()?,
            attempt: self.attempt?,
            worker_id: self.worker_id.clone(),
            dispatched: self.dispatched?,
            dispatched_at: self.dispatched_at,
            lease_expired: self.lease_expired?,
            available_at: self.available_at,
            tenant_grants: self.tenant_grants.clone().unwrap_or_default(),
        })
    }
}

/// The run's state: `from` (a cached prefix) plus the events after it. With
/// `known_last_seq` (the locked run row's), a prefix that is already that
/// far is returned without a query.
pub(super) async fn load_state(
    tx: &mut Transaction<'static, Postgres>,
    run_id: Uuid,
    from: Option<RunState>,
    known_last_seq: Option<u64>,
) -> Result<RunState, StoreError> {
    let mut state = from.unwrap_or_default();
    if known_last_seq == Some(state.last_seq) && state.last_seq > 0 {
        // The cached state is the run row's: no event to read.
        return Ok(state);
    }
    let rows: Vec<(i64, Value)> = sqlx::query_as(
        "SELECT seq, payload FROM events WHERE run_id = $1 AND seq > $2 ORDER BY seq",
    )
    .bind(run_id)
    .bind(state.last_seq as i64)
    .fetch_all(&mut **tx)
    .await?;
    crate::transition::fold_tail(&mut state, run_id, rows)?;
    Ok(state)
}
