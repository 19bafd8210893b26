//! Worker pools (issue 21) on the engine's side: which workers are live
//! (each claim notes its worker in `workers`, at most every half lease per
//! worker and engine), and the ready tasks none of them can take, for
//! `GetRun` and the `belay_tasks_unclaimable` gauge.

use std::collections::HashMap;

use tokio::time::{Duration, Instant};
use uuid::Uuid;

use super::{Coordinator, CoordinatorError};
use crate::store::{ClaimFilter, UnclaimableTask};

/// A worker is live while its last claim is less than this many lease
/// lengths old (by the engine's clock). A waiting long poll notes its
/// worker again every half lease, so a worker that polls is never judged
/// gone.
pub const LIVE_LEASES: u64 = 3;

/// Most tasks [`Coordinator::unclaimable_tasks`] returns.
pub const MAX_UNCLAIMABLE: i64 = 1_000;

/// Most workers [`SeenWorkers`] remembers before it forgets the stale ones.
const MAX_SEEN: usize = 4_096;

/// What this engine last wrote to a worker's `workers` row, and when.
#[derive(Debug)]
struct Seen {
    capabilities: Option<Vec<String>>,
    tenants: Option<Vec<String>>,
    at: Instant,
}

/// The workers this engine noted lately, by worker id: a claim writes its
/// worker's row only when it changed or half a lease has passed, so a busy
/// worker costs one small upsert per half lease, not one per claim.
#[derive(Debug, Default)]
pub(super) struct SeenWorkers(HashMap<String, Seen>);

impl SeenWorkers {
    /// Whether a claim of `worker_id` with `filter` at `now` should write
    /// the row (and if so, remember it as written).
    fn should_write(
        &mut self,
        worker_id: &str,
        filter: ClaimFilter<'_>,
        now: Instant,
        every: Duration,
    ) -> bool {
        let fresh = self.0.get(worker_id).is_some_and(|s| {
            now.saturating_duration_since(s.at) < every
                && s.capabilities.as_deref() == filter.capabilities
                && s.tenants.as_deref() == filter.tenants
        });
        if fresh {
            return false;
        }
        if self.0.len() >= MAX_SEEN {
            self.0
                .retain(|_, s| now.saturating_duration_since(s.at) < every);
        }
        self.0.insert(
            worker_id.to_owned(),
            Seen {
                capabilities: filter.capabilities.map(<[String]>::to_vec),
                tenants: filter.tenants.map(<[String]>::to_vec),
                at: now,
            },
        );
        true
    }

    /// Forget `worker_id`, so its next claim writes again.
    fn forget(&mut self, worker_id: &str) {
        self.0.remove(worker_id);
    }
}

impl Coordinator {
    /// Note that `worker_id` is claiming with `filter`
    /// (`Store::record_worker`), unless this engine wrote the same less
    /// than half a lease ago.
    pub(super) async fn note_worker(
        &self,
        worker_id: &str,
        filter: ClaimFilter<'_>,
    ) -> Result<(), CoordinatorError> {
        let every = Duration::from_millis(self.config.lease_ms / 2);
        let write = self
            .seen()
            .should_write(worker_id, filter, Instant::now(), every);
        if write
            && let Err(e) = self
                .store
                .record_worker(worker_id, filter.capabilities, filter.tenants)
                .await
        {
            self.seen().forget(worker_id);
            return Err(e.into());
        }
        Ok(())
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, SeenWorkers> {
        // A plain map: a panic while it is held cannot leave it half-written.
        self.workers_seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How long a worker stays live after its last claim, ms
    /// ([`LIVE_LEASES`] leases).
    pub fn live_window_ms(&self) -> i64 {
        (self.config.lease_ms * LIVE_LEASES) as i64
    }

    /// The ready tasks (of run `run_id`, or of every run) that no live
    /// worker can take, each with what is missing and why; at most
    /// [`MAX_UNCLAIMABLE`]. The caller has checked the run's tenant.
    pub async fn unclaimable_tasks(
        &self,
        run_id: Option<Uuid>,
    ) -> Result<Vec<UnclaimableTask>, CoordinatorError> {
        Ok(self
            .store
            .unclaimable_tasks(run_id, self.live_window_ms(), MAX_UNCLAIMABLE)
            .await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_row_is_written_when_new_changed_or_half_a_lease_old() {
        let mut seen = SeenWorkers::default();
        let every = Duration::from_millis(500);
        let at = Instant::now();
        let caps = vec!["mcp:a".to_owned()];
        let with = ClaimFilter {
            tenants: None,
            capabilities: Some(&caps),
        };
        assert!(seen.should_write("w", with, at, every));
        assert!(!seen.should_write("w", with, at + Duration::from_millis(499), every));
        assert!(seen.should_write("w", ClaimFilter::default(), at, every));
        assert!(seen.should_write("w", with, at, every));
        assert!(seen.should_write("w", with, at + every, every));
        assert!(seen.should_write("v", with, at, every));
        seen.forget("v");
        assert!(seen.should_write("v", with, at, every));
    }
}
