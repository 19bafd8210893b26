//! The store's transitions as the coordinator makes them: the same three
//! calls, each also recording its committed decision's figures in the
//! engine's metrics ([`crate::metrics::observe`]). The figures are read
//! inside the transition (where the state is) and recorded only after it
//! committed; a dispatch that decides twice (its gates held the call back)
//! records its last decision.

use std::sync::Mutex;

use uuid::Uuid;

use super::Coordinator;
use crate::machine::gates::GateVerdict;
use crate::machine::{Decision, RunState};
use crate::metrics::{Observed, observe};
use crate::store::{Applied, TaskRow, TransitionError};

/// The figures of the latest decision a transition's closure returned.
#[derive(Default)]
struct Capture(Mutex<Option<Observed>>);

impl Capture {
    /// Keeps the figures of `decision` (when it is `Ok`).
    fn keep<E>(
        &self,
        state: &RunState,
        task: Option<&TaskRow>,
        provider: Option<&str>,
        decision: &Result<Decision, E>,
    ) {
        if let Ok(d) = decision
            && let Ok(mut slot) = self.0.lock()
        {
            *slot = Some(observe(state, task, &d.events, provider));
        }
    }

    /// Records the kept figures into `coord`'s metrics.
    fn commit(self, coord: &Coordinator) {
        if let Some(observed) = self.0.into_inner().ok().flatten() {
            coord.metrics.record(&observed);
        }
    }
}

impl Coordinator {
    /// [`Store::transition`](crate::store::Store::transition), recorded.
    pub(crate) async fn transition<E, F>(
        &self,
        run_id: Uuid,
        task_id: Option<Uuid>,
        decide: F,
    ) -> Result<Applied, TransitionError<E>>
    where
        F: FnOnce(&RunState, Option<&TaskRow>) -> Result<Decision, E>,
    {
        let capture = Capture::default();
        let applied = self
            .store
            .transition(run_id, task_id, |state, row| {
                let d = decide(state, row);
                capture.keep(state, row, None, &d);
                d
            })
            .await?;
        capture.commit(self);
        Ok(applied)
    }

    /// [`Store::transition_task`](crate::store::Store::transition_task),
    /// recorded; `provider` is the model provider a worker reported with
    /// a model call's result.
    pub(crate) async fn transition_task<E, F>(
        &self,
        task_id: Uuid,
        provider: Option<&str>,
        decide: F,
    ) -> Result<Applied, TransitionError<E>>
    where
        F: FnOnce(&RunState, Option<&TaskRow>) -> Result<Decision, E>,
    {
        self.transition_task_handing(task_id, provider, None, decide)
            .await
    }

    /// [`Coordinator::transition_task`] for a report that asks for the
    /// next task with it ([`Store::transition_task_handing`](crate::store::Store::transition_task_handing)).
    pub(crate) async fn transition_task_handing<E, F>(
        &self,
        task_id: Uuid,
        provider: Option<&str>,
        hand: Option<&crate::store::HandOff<'_>>,
        decide: F,
    ) -> Result<Applied, TransitionError<E>>
    where
        F: FnOnce(&RunState, Option<&TaskRow>) -> Result<Decision, E>,
    {
        let capture = Capture::default();
        let applied = self
            .store
            .transition_task_handing(task_id, hand, |state, row| {
                let d = decide(state, row);
                capture.keep(state, row, provider, &d);
                d
            })
            .await?;
        capture.commit(self);
        Ok(applied)
    }

    /// [`Store::transition_task_gated`](crate::store::Store::transition_task_gated),
    /// recorded.
    pub(crate) async fn transition_task_gated<E, F>(
        &self,
        task_id: Uuid,
        mut decide: F,
    ) -> Result<Applied, TransitionError<E>>
    where
        F: FnMut(&RunState, Option<&TaskRow>, Option<&GateVerdict>) -> Result<Decision, E>,
    {
        let capture = Capture::default();
        let applied = self
            .store
            .transition_task_gated(task_id, |state, row, verdict| {
                let d = decide(state, row, verdict);
                capture.keep(state, row, None, &d);
                d
            })
            .await?;
        capture.commit(self);
        Ok(applied)
    }

    /// Records the figures of a run's first decision (`create_run`), once
    /// it was written.
    pub(crate) fn record_created(&self, decision: &Decision) {
        let observed = observe(&RunState::default(), None, &decision.events, None);
        self.metrics.record(&observed);
    }

    /// The engine's metrics.
    pub fn metrics(&self) -> &crate::metrics::EngineMetrics {
        &self.metrics
    }
}
