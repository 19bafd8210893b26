//! The optimistic transition of a worker's report (issue 23): one
//! statement, no `BEGIN`, no lock statement, no `COMMIT`.
//!
//! When this engine handed the reported task over itself
//! ([`HandedLease`]) and still caches the run's state as that transition
//! left it, it decides on that state and on the task row as it wrote it,
//! and writes the decision with one statement whose first CTE locks the
//! run and task rows and checks that they are still as assumed (the run's
//! `last_seq`; the task leased to the same worker and attempt, dispatched
//! alike, its lease held by the database clock) and that the tenant's
//! grants are those the hand-off used. Every write of the statement is
//! conditional on that check, so the statement writes all or nothing, in
//! its own (implicit) transaction: the same rows, locks and fencing as
//! the locking transition, three round trips fewer. The check is stricter
//! than the locking transition in two ways, each costing only a retry: it
//! wants the lease held by the clock (the locking transition accepts a
//! report whose lease ran out but was not swept yet), and the grants
//! unchanged even when nothing is dispatched.
//!
//! Only the hot path takes it: a decision whose task writes merge into
//! one statement (`write_decision.rs`'s `TaskWrites`), that passes no
//! tool gate, reads no cache, does not end the run, for a run whose tools
//! do not read the time (the decision is made with an estimate of the
//! database clock, [`HandedLease::now`]). Any other decision is written by
//! the locking transition instead, once the rows it locks are found as
//! assumed ([`Pg::transition_at`]); a check that fails writes nothing and
//! answers [`StoreError::Raced`], which the worker retries (the retry takes
//! the locking transition: the lease is forgotten once used).

use super::Pg;
use super::write_decision::{EventArrays, Guard, TaskWrites, hot_query};
use crate::hand_off::{HandOff, HandedLease, claimed, hand_off};
use crate::rows::StoreError;
use crate::transition::{
    Applied, DecideFn, TransitionError, Wakes, apply_events, cache_lookups, ends_run,
};
use belay_machine::{Decision, RunState};
use uuid::Uuid;

/// What [`Pg::optimistic`] did.
pub(super) enum Optimistic<E> {
    /// Nothing: no lease or no matching cached state; the locking
    /// transition decides.
    NotTried,
    /// It decided on the lease and the cached state, and cannot write that
    /// decision itself: the locking transition writes it if it finds the
    /// rows as `lease` has them.
    Decided(HandedLease, Result<Decision, TransitionError<E>>),
    /// It wrote and committed.
    Written(Applied),
}

/// The error of a check that failed: nothing was written.
pub(super) fn raced(run_id: Uuid) -> StoreError {
    StoreError::Raced(format!(
        "run {run_id} changed while its report was decided; nothing was written"
    ))
}

impl Pg {
    /// Decide the report of `task_id` (asking for the next task with
    /// `hand`) on what this engine knows, and write it in one statement
    /// when the decision allows (module docs).
    ///
    /// Errors: the database's; [`StoreError::Raced`] when the rows were
    /// not as assumed (nothing was written).
    pub(super) async fn optimistic<E, F>(
        &self,
        task_id: Uuid,
        hand: &HandOff<'_>,
        decide: &mut F,
    ) -> Result<Optimistic<E>, TransitionError<E>>
    where
        F: DecideFn<E>,
    {
        let Some(lease) = self.cache().take_lease(&task_id) else {
            return Ok(Optimistic::NotTried);
        };
        let run_id = lease.task.run_id;
        let Some(mut state) = self.cache().take(&run_id) else {
            return Ok(Optimistic::NotTried);
        };
        if state.last_seq != lease.last_seq || state.plan.as_ref().is_none_or(|p| p.reads_time()) {
            self.cache().put(run_id, state);
            return Ok(Optimistic::NotTried);
        }
        state.now = Some(lease.now());
        state.fleet_level = crate::fleet_level::machine_level(self.fleet_level());
        let own = Some((lease.task.call_id.as_str(), task_id));
        let decision = match decide(&state, Some(&lease.task), None) {
            Ok(d) if one_statement(&d, own) => d,
            other => {
                self.cache().put(run_id, state);
                return Ok(Optimistic::Decided(lease, other));
            }
        };
        self.write_optimistic(lease, state, decision, hand)
            .await
            .map(Optimistic::Written)
    }

    /// Write `decision`, decided on `state` for the report of `lease`'s
    /// task, in one guarded statement.
    async fn write_optimistic<E>(
        &self,
        lease: HandedLease,
        state: RunState,
        mut decision: Decision,
        hand: &HandOff<'_>,
    ) -> Result<Applied, TransitionError<E>> {
        let (task, run_id) = (&lease.task, lease.task.run_id);
        let mut after = state;
        let ended_nodes = apply_events(&mut after, &decision.events);
        let handed = hand_off(
            hand,
            &lease.tenant,
            &lease.grants,
            &mut decision,
            &mut after,
        );
        let own = Some((task.call_id.as_str(), task.task_id));
        // The hand-off adds events only: the writes merged before it still do.
        let mut writes =
            TaskWrites::of(&decision.commands, own, handed.as_ref()).ok_or_else(|| {
                StoreError::Corrupt(format!("run {run_id}: a hand-off unmerged the task writes"))
            })?;
        writes.guard = Some(Guard {
            last_seq: lease.last_seq as i64,
            task_id: task.task_id,
            attempt: task.attempt,
            worker_id: task.worker_id.as_deref().unwrap_or_default(),
            dispatched: task.dispatched,
            grants: &lease.grants,
        });
        let events = EventArrays::of(&decision, lease.last_seq as i64)?;
        let sql = writes.statement();
        let sent = std::time::Instant::now();
        // A race leaves the run's state out of the cache: the retry folds its
        // history from the database (a clone kept for it would cost every
        // report what only a race needs).
        let (_, wrote, now) =
            hot_query(&sql, &writes, run_id, &lease.tenant, &events, &after, None)
                .fetch_one(&self.pool)
                .await
                .map_err(StoreError::from)?;
        if !wrote {
            return Err(raced(run_id).into());
        }
        let wakes = Wakes::of(&decision, handed.as_ref().map(|h| h.call_id.as_str()));
        self.wakes.send(run_id, wakes);
        let handed = handed.and_then(|h| {
            let claimed = claimed(&h, &decision, run_id, &lease.tenant)?;
            let run = (run_id, lease.tenant.as_str(), after.last_seq);
            self.cache().put_lease(HandedLease::of(
                &h,
                &claimed.kind,
                run,
                &lease.grants,
                (now, sent),
            ));
            Some(claimed)
        });
        let applied = Applied {
            first_seq: lease.last_seq + 1,
            events: decision.events.len(),
            status: after.status.as_str(),
            secrets: Vec::new(),
            run_id,
            tenant: lease.tenant.clone(),
            trace: after.trace.clone(),
            now,
            ended_nodes,
            handed,
        };
        self.cache().put(run_id, after);
        Ok(applied)
    }
}

/// Whether `decision` (of the report of `own`'s task) is written by one
/// statement: events, and task writes that merge, and nothing else.
fn one_statement(decision: &Decision, own: Option<(&str, Uuid)>) -> bool {
    !decision.events.is_empty()
        && !ends_run(decision)
        && crate::transition::gates_asked(decision).is_none()
        && cache_lookups(&decision.commands).is_empty()
        && TaskWrites::of(&decision.commands, own, None).is_some()
}
