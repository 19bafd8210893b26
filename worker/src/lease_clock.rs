//! The latest moment a worker may still start a task's side effect: a
//! little before its lease can have run out, by the worker's own clock.
//!
//! The engine's lease runs from when it *received* the claim or the last
//! heartbeat it extended; the worker knows when it *sent* them, which is
//! earlier, so `sent + lease` is a bound the engine's expiry is never
//! before. A dispatch whose answer arrives after that bound (less a
//! margin for the clocks' rates) must not be acted on: the engine may
//! already have judged the lease expired, looked the call up with a
//! reconcile probe that found nothing, and handed it to another attempt
//! (seen in the chaos run: a stalled connection to the engine delivered
//! the answer 3 s late, and the call reached its tool twice).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// The act-by moments of the leases a worker holds, by (task id,
/// attempt). Cheap to clone (shared).
#[derive(Debug, Clone, Default)]
pub struct LeaseClock {
    act_by: Arc<Mutex<HashMap<(String, u32), Instant>>>,
}

/// What is kept off the end of a lease: a twentieth of it, at least 20 ms.
pub fn margin(lease_ms: u64) -> Duration {
    Duration::from_millis((lease_ms / 20).max(20))
}

impl LeaseClock {
    /// The engine extended the lease of `task_id`/`attempt` to `lease_ms`
    /// on a request the worker sent at `sent_at` (a claim or a heartbeat).
    pub fn renewed(&self, task_id: &str, attempt: u32, sent_at: Instant, lease_ms: u64) {
        let by = (sent_at + Duration::from_millis(lease_ms))
            .checked_sub(margin(lease_ms))
            .unwrap_or(sent_at);
        self.map().insert((task_id.to_owned(), attempt), by);
    }

    /// A claim the worker sent at `sent_at` leased `task_id`/`attempt` for
    /// `lease_ms`, from `lease_from_ms` after the engine received it
    /// (`Task.lease_from_ms`: what a long poll waited). The lease is
    /// counted from `sent_at + lease_from_ms`, but never from later than
    /// now (the lease began before its answer arrived).
    pub fn leased(
        &self,
        task_id: &str,
        attempt: u32,
        sent_at: Instant,
        lease_from_ms: u64,
        lease_ms: u64,
    ) {
        let from = sent_at
            .checked_add(Duration::from_millis(lease_from_ms))
            .map_or_else(Instant::now, |t| t.min(Instant::now()));
        self.renewed(task_id, attempt, from, lease_ms);
    }

    /// The engine says the lease is lost: no side effect of it may start
    /// any more.
    pub fn lost(&self, task_id: &str, attempt: u32) {
        self.map()
            .insert((task_id.to_owned(), attempt), Instant::now());
    }

    /// The task ended: its lease is no longer tracked.
    pub fn forget(&self, task_id: &str, attempt: u32) {
        self.map().remove(&(task_id.to_owned(), attempt));
    }

    /// Whether the side effect of `task_id`/`attempt` may still start now:
    /// true before its act-by moment, and for a lease this clock was never
    /// told of (a client used without the runner, as in tests).
    pub fn may_act(&self, task_id: &str, attempt: u32) -> bool {
        self.map()
            .get(&(task_id.to_owned(), attempt))
            .is_none_or(|by| Instant::now() < *by)
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<(String, u32), Instant>> {
        // Single inserts and removes: never inconsistent.
        self.act_by.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_polls_wait_moves_the_lease_on_but_never_past_now() {
        let clock = LeaseClock::default();
        // Sent 3 s ago; the engine waited 2.9 s before it leased: 2 s
        // leases still have most of their length left.
        let sent = Instant::now() - Duration::from_millis(3_000);
        clock.leased("t", 1, sent, 2_900, 2_000);
        assert!(clock.may_act("t", 1));
        // Without the wait, the lease would look over.
        clock.leased("t", 2, sent, 0, 2_000);
        assert!(!clock.may_act("t", 2));
        // A wait longer than the time since the send counts from now.
        clock.leased("t", 3, sent, u64::MAX, 2_000);
        assert!(clock.may_act("t", 3));
        let by = clock.map()[&("t".to_owned(), 3)];
        assert!(by <= Instant::now() + Duration::from_millis(2_000));
    }

    #[test]
    fn a_lease_may_be_acted_on_until_its_margin_before_the_end() {
        let clock = LeaseClock::default();
        assert!(clock.may_act("t", 1), "unknown leases are not held back");
        let long_ago = Instant::now() - Duration::from_millis(1_950);
        clock.renewed("t", 1, long_ago, 2_000);
        assert!(!clock.may_act("t", 1), "within 100 ms of the end");
        clock.renewed("t", 1, Instant::now(), 2_000);
        assert!(clock.may_act("t", 1));
        assert!(clock.may_act("t", 2), "another attempt");
        clock.lost("t", 1);
        assert!(!clock.may_act("t", 1), "a lost lease is never acted on");
        clock.forget("t", 1);
        assert!(clock.may_act("t", 1));
        assert_eq!(margin(30_000), Duration::from_millis(1_500));
        assert_eq!(margin(100), Duration::from_millis(20));
    }
}
