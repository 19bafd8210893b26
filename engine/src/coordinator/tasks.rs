//! A worker's leases: long-poll claims (woken by `LISTEN/NOTIFY`),
//! heartbeats, and the fencing every change of a task passes (the attempt,
//! and the worker holding the lease).

use std::collections::HashMap;
use std::time::Duration;

use super::{Coordinator, CoordinatorError, parse_uuid, require};
use crate::store::{ClaimFilter, ClaimedTask, TaskRow};

/// The [`NothingClaimable`] memos of claims of every tenant, one per set of
/// capability tags claimed with (`None`: a claim naming none).
pub(super) type Memos = HashMap<Option<Vec<String>>, NothingClaimable>;

/// Most memos kept: a deployment has a few kinds of workers; past this the
/// map is cleared rather than grown.
const MAX_MEMOS: usize = 64;

/// How long a claim that found nothing claimable spares the claims after
/// it their statement, when no wake-up came in between
/// ([`NothingClaimable`]): the most a change that no wake-up announces (the
/// clock moved by another process, a lost notification) waits for a new
/// claim request to notice it. Waiting claimers look again at least every
/// second in any case.
const NOTHING_CLAIMABLE_FOR: Duration = Duration::from_millis(100);

/// A claim statement that took fewer tasks than it asked for: at that
/// moment nothing else was claimable. Until [`Store::tasks_wake_seq`](crate::store::Store::tasks_wake_seq) moves
/// (a task was scheduled, re-queued, or announced by another process), the
/// next ready task's time comes, or [`NOTHING_CLAIMABLE_FOR`] passes, a
/// claim would find nothing either, so it waits without asking the
/// database. Without this, every worker's claim that follows a successful
/// one (the worker asks again at once for its free slots) was a statement
/// that found nothing: about one per step below peak load.
#[derive(Debug, Clone, Copy)]
pub(super) struct NothingClaimable {
    /// [`Store::tasks_wake_seq`](crate::store::Store::tasks_wake_seq) read before the statement.
    seq: u64,
    /// When the statement started.
    at: tokio::time::Instant,
    /// When the earliest other ready task becomes claimable (ready now but
    /// row-locked by another claimer: in 5 ms), if there is one.
    next_ready: Option<tokio::time::Instant>,
}

/// What one claim leased ([`Coordinator::claim_timed`]).
#[derive(Debug)]
pub struct Claimed {
    /// The tasks, leased to the claiming worker (none after a long poll
    /// that found nothing).
    pub tasks: Vec<ClaimedTask>,
    /// When the statement that leased them began, by this process's clock:
    /// their leases run from no earlier.
    pub began: tokio::time::Instant,
}

impl NothingClaimable {
    /// Whether a claim at `now` with the wake count `seq` would surely find
    /// nothing; if so, when to look again at the latest.
    fn holds(&self, seq: u64, now: tokio::time::Instant) -> Option<tokio::time::Instant> {
        let until = match self.next_ready {
            Some(t) => t.min(self.at + NOTHING_CLAIMABLE_FOR),
            None => self.at + NOTHING_CLAIMABLE_FOR,
        };
        (seq == self.seq && now < until).then_some(until)
    }
}

impl Coordinator {
    /// Long-poll claim: returns as soon as a task is claimed, or empty after `wait_ms`.
    pub async fn claim(
        &self,
        worker_id: &str,
        max: u32,
        wait_ms: u32,
    ) -> Result<Vec<ClaimedTask>, CoordinatorError> {
        self.claim_for(worker_id, max, wait_ms, None).await
    }

    /// [`Coordinator::claim`] of tasks of `tenants` only (`None`: every
    /// tenant): what a worker key limited to tenants claims.
    pub async fn claim_for(
        &self,
        worker_id: &str,
        max: u32,
        wait_ms: u32,
        tenants: Option<&[String]>,
    ) -> Result<Vec<ClaimedTask>, CoordinatorError> {
        let filter = ClaimFilter {
            tenants,
            capabilities: None,
        };
        self.claim_matching(worker_id, max, wait_ms, filter).await
    }

    /// [`Coordinator::claim_for`] of the tasks `filter` admits: with
    /// capabilities (the tags of `belay_proto::pools`), only tasks whose
    /// every requirement is among them. Each claim also notes the worker as
    /// live, with its capabilities and tenants (`Store::record_worker`, at
    /// most every half lease).
    pub async fn claim_matching(
        &self,
        worker_id: &str,
        max: u32,
        wait_ms: u32,
        filter: ClaimFilter<'_>,
    ) -> Result<Vec<ClaimedTask>, CoordinatorError> {
        Ok(self
            .claim_timed(worker_id, max, wait_ms, filter)
            .await?
            .tasks)
    }

    /// [`Coordinator::claim_matching`], with when the statement that leased
    /// the tasks began: their leases run from no earlier, however long the
    /// claim waited before it (a long poll), which a worker must know to
    /// judge, by its own clock, until when it may still act on them.
    pub async fn claim_timed(
        &self,
        worker_id: &str,
        max: u32,
        wait_ms: u32,
        filter: ClaimFilter<'_>,
    ) -> Result<Claimed, CoordinatorError> {
        let tenants = filter.tenants;
        require("worker_id", worker_id)?;
        if !(1..=64).contains(&max) {
            return Err(CoordinatorError::InvalidArgument(format!(
                "`max_tasks` must be 1..=64, got {max}"
            )));
        }
        if wait_ms > 30_000 {
            return Err(CoordinatorError::InvalidArgument(format!(
                "`wait_ms` must be at most 30000, got {wait_ms}"
            )));
        }
        let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms as u64);
        loop {
            // Register interest before looking, so a notify between the
            // query and the wait is not missed.
            let notified = self.tasks_ready.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            self.note_worker(worker_id, filter).await?;
            let seq = self.store.tasks_wake_seq();
            let started = tokio::time::Instant::now();
            // A memo describes every tenant's tasks a set of capabilities
            // admits: a claim limited to some tenants neither reads nor
            // writes one.
            let memo_key = filter.capabilities.map(<[String]>::to_vec);
            let memo = if tenants.is_none() {
                self.memo().get(&memo_key).copied()
            } else {
                None
            };
            let next_ready = match memo.and_then(|m| m.holds(seq, started)) {
                // Nothing is claimable: wait without a statement.
                Some(look_again) => Some(look_again),
                None => {
                    let claimed = self
                        .store
                        .claim_matching_or_next(
                            worker_id,
                            max as i64,
                            self.config.lease_ms as i64,
                            filter,
                        )
                        .await;
                    let (tasks, next_ready_ms) = match claimed {
                        Ok(c) => c,
                        Err(e) => {
                            if tenants.is_none() {
                                self.memo().remove(&memo_key);
                            }
                            return Err(e.into());
                        }
                    };
                    let next_ready = next_ready_ms
                        .map(|ms| started + Duration::from_millis(ms.max(0) as u64 + 5));
                    if tenants.is_none() {
                        let mut memos = self.memo();
                        if tasks.len() < max as usize {
                            if memos.len() >= MAX_MEMOS {
                                memos.clear();
                            }
                            memos.insert(
                                memo_key,
                                NothingClaimable {
                                    seq,
                                    at: started,
                                    next_ready,
                                },
                            );
                        } else {
                            memos.remove(&memo_key);
                        }
                    }
                    if tasks.len() as u32 == max {
                        // A full batch: more may be ready; let the next claimer look.
                        self.tasks_ready.notify_one();
                    }
                    if !tasks.is_empty() {
                        self.metrics.claimed(&tasks);
                        for t in &tasks {
                            tracing::debug!(task_id = %t.task_id, attempt = t.attempt, worker_id, "task claimed");
                        }
                        return Ok(Claimed {
                            tasks,
                            began: started,
                        });
                    }
                    next_ready
                }
            };
            let now = tokio::time::Instant::now();
            if now >= deadline || self.claims_stopped() {
                self.metrics.claimed(&[]);
                return Ok(Claimed {
                    tasks: Vec::new(),
                    began: now,
                });
            }
            // Wake on NOTIFY, on the earliest delayed retry, or at the
            // deadline; re-check at least every second in case a
            // notification was lost while the listener reconnected.
            let mut wait = deadline - now;
            if let Some(at) = next_ready {
                wait = wait.min(at.saturating_duration_since(now));
            }
            wait = wait.min(Duration::from_secs(1));
            let _ = tokio::time::timeout(wait, notified).await;
        }
    }

    /// Answer every long-poll claim, now and from now on, once it has
    /// looked for tasks (a claim that found some still returns them): the
    /// engine is shutting down, and a worker waiting up to 30 s for work
    /// would hold the graceful shutdown (and a pod's termination) that long.
    /// The worker polls again, reaches another engine, or backs off.
    pub fn stop_claims(&self) {
        self.claims_stopped
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.tasks_ready.notify_waiters();
    }

    /// Whether [`Coordinator::stop_claims`] was called.
    pub(super) fn claims_stopped(&self) -> bool {
        self.claims_stopped
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    fn memo(&self) -> std::sync::MutexGuard<'_, Memos> {
        // A plain value: a panic while it is held cannot leave it half-written.
        self.nothing_claimable
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Extend the leases a worker holds; returns `(task, attempt, held)`.
    pub async fn heartbeat(
        &self,
        worker_id: &str,
        leases: &[(String, u32)],
    ) -> Result<Vec<(String, u32, bool)>, CoordinatorError> {
        require("worker_id", worker_id)?;
        let mut parsed = Vec::with_capacity(leases.len());
        for (task, attempt) in leases {
            parsed.push((parse_uuid("task_id", task)?, *attempt as i32));
        }
        let held = self
            .store
            .heartbeat(worker_id, &parsed, self.config.lease_ms as i64)
            .await?;
        Ok(parsed
            .into_iter()
            .map(|(id, attempt)| {
                (
                    id.to_string(),
                    attempt as u32,
                    held.contains(&(id, attempt)),
                )
            })
            .collect())
    }
}

/// Fencing: the task row must exist and carry exactly `attempt`; while it is
/// leased, only the worker holding the lease may change it.
pub(super) fn fenced<'a>(
    row: Option<&'a TaskRow>,
    attempt: u32,
    worker_id: Option<&str>,
) -> Result<&'a TaskRow, CoordinatorError> {
    let row = row.ok_or_else(|| CoordinatorError::NotFound("task".into()))?;
    if row.attempt as u32 != attempt {
        tracing::warn!(task_id = %row.task_id, attempt, current = row.attempt, "stale attempt refused");
        return Err(CoordinatorError::FailedPrecondition(format!(
            "stale attempt: task {} is at attempt {}, not {attempt}",
            row.task_id, row.attempt
        )));
    }
    if let Some(worker) = worker_id
        && row.status == "leased"
        && row.worker_id.as_deref() != Some(worker)
    {
        tracing::warn!(task_id = %row.task_id, attempt, worker, "task leased by another worker");
        return Err(CoordinatorError::FailedPrecondition(format!(
            "task {} attempt {attempt} is leased by another worker",
            row.task_id
        )));
    }
    Ok(row)
}

/// [`fenced`], for a tool call this attempt holds leased.
///
/// Errors: those of `fenced`; `InvalidArgument` for a model call;
/// `FailedPrecondition` for a task no longer leased.
pub(super) fn leased_tool_call<'a>(
    row: Option<&'a TaskRow>,
    attempt: u32,
    worker_id: &str,
) -> Result<&'a TaskRow, CoordinatorError> {
    let row = fenced(row, attempt, Some(worker_id))?;
    if row.kind != belay_proto::wire::TASK_KIND_TOOL_CALL {
        return Err(CoordinatorError::InvalidArgument(format!(
            "task {} is not a tool call",
            row.task_id
        )));
    }
    if row.status != "leased" {
        return Err(CoordinatorError::FailedPrecondition(format!(
            "task {} is {}, not leased",
            row.task_id, row.status
        )));
    }
    Ok(row)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_claimable_holds_until_a_wake_up_the_next_ready_task_or_its_time_limit() {
        let at = tokio::time::Instant::now();
        let memo = NothingClaimable {
            seq: 7,
            at,
            next_ready: None,
        };
        assert_eq!(memo.holds(7, at), Some(at + NOTHING_CLAIMABLE_FOR));
        // A wake-up since: look.
        assert_eq!(memo.holds(8, at), None);
        // Too old: look (changes no wake-up announces).
        assert_eq!(memo.holds(7, at + NOTHING_CLAIMABLE_FOR), None);
        // A delayed task due before the limit: look when it is due.
        let soon = at + Duration::from_millis(20);
        let memo = NothingClaimable {
            next_ready: Some(soon),
            ..memo
        };
        assert_eq!(memo.holds(7, at), Some(soon));
        assert_eq!(memo.holds(7, soon), None);
        let later = NothingClaimable {
            next_ready: Some(at + Duration::from_secs(5)),
            ..memo
        };
        assert_eq!(later.holds(7, at), Some(at + NOTHING_CLAIMABLE_FOR));
    }
}
