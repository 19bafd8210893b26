//! The loops every replica runs ([`Coordinator::spawn_background`]): the
//! `LISTEN/NOTIFY` relay, the sweeper (expired leases, due timers, expired
//! tool cache entries) and the outbox (child runs: start, tell the parent,
//! cancel).

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use uuid::Uuid;

use super::fleet::Reach;
use super::tasks::fenced;
use super::{Coordinator, CoordinatorError};
use crate::definitions;
use crate::machine::{self, Input};
use crate::store::{StoreError, TransitionError, Wake};

/// How long a claimed outbox row is left to its replica before another may
/// take it, ms.
pub const OUTBOX_LEASE_MS: i64 = 10_000;

/// Most levels of child runs below a run that no other run started: a
/// child that would nest deeper is not created, and the `workflow` node
/// (or `type: workflow` tool call) that starts it fails with a message
/// naming this limit. Registration refuses a bundle whose workflows start
/// themselves again; this bounds what it cannot see (a cycle closed by
/// registering a new version of an already registered workflow).
pub const MAX_CHILD_DEPTH: u32 = 8;

/// How often the sweeper deletes expired entries of the tool result cache.
const TOOL_CACHE_PURGE_INTERVAL: Duration = Duration::from_secs(60);
/// How often the sweep loop refreshes the fleet registration
/// (`store::fleet_level`).
const FLEET_REFRESH_INTERVAL: Duration =
    Duration::from_millis(crate::store::fleet_level::REFRESH_INTERVAL_MS);

/// Most expired entries of the tool result cache deleted by one statement.
const TOOL_CACHE_PURGE_BATCH: i64 = 1_000;

impl Coordinator {
    /// Background loops: LISTEN/NOTIFY relay and the sweeper (expired
    /// leases, due timers, and once a minute expired tool cache entries).
    /// They run until the returned handles are aborted.
    pub fn spawn_background(self: &Arc<Self>) -> Vec<tokio::task::JoinHandle<()>> {
        let listen = {
            let this = Arc::clone(self);
            tokio::spawn(async move { this.listen_loop().await })
        };
        let sweep = {
            let this = Arc::clone(self);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(
                    this.config.sweep_interval_ms.max(10),
                ));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut purged_at: Option<tokio::time::Instant> = None;
                let mut reach = Reach::starting();
                let mut fleet_refreshed_at: Option<tokio::time::Instant> = None;
                loop {
                    tick.tick().await;
                    // Histogram samples into buckets, scraped or not.
                    this.metrics.upkeep();
                    // Before judging leases: an outage gives workers a
                    // lease length to re-assert theirs (`fleet.rs`).
                    if let Err(e) = this.record_fleet_alive(&mut reach).await {
                        tracing::warn!(error = %e, "recording the fleet's liveness failed");
                        continue;
                    }
                    if fleet_refreshed_at.is_none_or(|at| at.elapsed() >= FLEET_REFRESH_INTERVAL) {
                        fleet_refreshed_at = Some(tokio::time::Instant::now());
                        if let Err(e) = this.refresh_fleet_level().await {
                            if this.outranked.borrow().is_some() {
                                // Judges nothing more; the engine stops
                                // (`Coordinator::fleet_outranked`).
                                tracing::error!(error = %e, "the fleet's behaviour level is past this engine's; stopping");
                                return;
                            }
                            tracing::warn!(error = %e, "refreshing the fleet's behaviour level failed");
                        }
                    }
                    if let Err(e) = this.sweep_expired_leases().await {
                        tracing::warn!(error = %e, "lease sweep failed");
                    }
                    if let Err(e) = this.fire_due_timers().await {
                        tracing::warn!(error = %e, "timer sweep failed");
                    }
                    if purged_at.is_none_or(|at| at.elapsed() >= TOOL_CACHE_PURGE_INTERVAL) {
                        purged_at = Some(tokio::time::Instant::now());
                        match this.purge_tool_cache().await {
                            Ok(0) => {}
                            Ok(n) => {
                                tracing::debug!(entries = n, "expired tool cache entries deleted")
                            }
                            Err(e) => tracing::warn!(error = %e, "tool cache purge failed"),
                        }
                        if let Err(e) = this.store.purge_stale_heartbeats().await {
                            tracing::warn!(error = %e, "purging stale heartbeats failed");
                        }
                    }
                }
            })
        };
        let outbox = {
            let this = Arc::clone(self);
            tokio::spawn(async move {
                let interval = Duration::from_millis(this.config.sweep_interval_ms.max(10));
                loop {
                    // Woken by the relay, and every sweep interval for rows
                    // whose earlier attempt failed or whose wake-up was missed.
                    let _ = tokio::time::timeout(interval, this.outbox_ready.notified()).await;
                    loop {
                        match this.process_outbox().await {
                            Ok(0) => break,
                            Ok(_) => continue,
                            Err(e) => {
                                tracing::warn!(error = %e, "outbox processing failed");
                                break;
                            }
                        }
                    }
                }
            })
        };
        vec![listen, sweep, outbox]
    }

    /// Judge every expired lease once (none during the fleet's grace
    /// after an outage: `fleet.rs`). Returns how many were handled.
    pub async fn sweep_expired_leases(&self) -> Result<usize, CoordinatorError> {
        let grace_ms = crate::store::fleet_grace_ms(self.config.lease_ms as i64);
        let expired = self.store.expired_leases(100, grace_ms).await?;
        let mut handled = 0;
        for lease in expired {
            let attempt = lease.attempt as u32;
            let result = self
                .transition(lease.run_id, Some(lease.task_id), |state, row| {
                    let row = fenced(row, attempt, None)?;
                    if row.status != "leased" || !row.lease_expired {
                        // Another replica got there first, or a heartbeat won.
                        return Ok(machine::Decision::default());
                    }
                    machine::decide(
                        state,
                        Input::LeaseExpired {
                            call_id: row.call_id.clone(),
                            attempt,
                            dispatched: row.dispatched,
                        },
                    )
                    .map_err(CoordinatorError::from)
                })
                .await;
            match result {
                Ok(applied) if applied.events > 0 => {
                    handled += 1;
                    tracing::warn!(task_id = %lease.task_id, attempt, run_status = applied.status, "lease expired");
                }
                Ok(_) => {}
                Err(TransitionError::Refused(e)) => {
                    // The run finished meanwhile: the lease no longer matters.
                    tracing::debug!(task_id = %lease.task_id, error = %e, "expired lease skipped");
                    self.store
                        .end_orphan_task(lease.task_id, lease.attempt)
                        .await?;
                }
                // One run that cannot be judged (its history does not decode,
                // say) must not stop lease expiry for every other run.
                Err(TransitionError::Store(e)) => {
                    tracing::error!(task_id = %lease.task_id, run_id = %lease.run_id, error = %e, "cannot judge an expired lease; skipping it");
                }
            }
        }
        Ok(handled)
    }

    /// Fire due timers (any replica; each fires once: its transition
    /// deletes the row under the run lock, and a stale or repeated firing
    /// changes nothing). Returns how many were handled.
    pub async fn fire_due_timers(&self) -> Result<usize, CoordinatorError> {
        let due = self
            .store
            .due_timers(256)
            .await
            .map_err(CoordinatorError::Store)?;
        let mut handled = 0;
        for (run_id, timer_id, overdue_ms) in due {
            let input = Input::TimerFired {
                timer_id: timer_id.clone(),
                overdue_ms: u64::try_from(overdue_ms).unwrap_or(0),
            };
            match self
                .transition(run_id, None, |state, _| {
                    machine::decide(state, input).map_err(CoordinatorError::from)
                })
                .await
            {
                Ok(_) => handled += 1,
                Err(e) => {
                    // One run that cannot be judged must not stop the others.
                    tracing::warn!(%run_id, timer_id, error = %CoordinatorError::from(e), "timer could not fire");
                }
            }
        }
        Ok(handled)
    }

    /// Delete the expired entries of the tool result cache, a batch at a
    /// time; returns how many.
    pub async fn purge_tool_cache(&self) -> Result<u64, CoordinatorError> {
        let mut total = 0;
        loop {
            let n = self
                .store
                .purge_expired_tool_cache(TOOL_CACHE_PURGE_BATCH)
                .await?;
            total += n;
            if n < TOOL_CACHE_PURGE_BATCH as u64 {
                return Ok(total);
            }
        }
    }

    /// Carry out due outbox rows (start child runs, tell parents their child
    /// ended, cancel children). Each kind is idempotent, so a row done twice
    /// (a replica died before marking it) changes nothing the second time.
    /// Returns how many rows were claimed.
    pub async fn process_outbox(&self) -> Result<usize, CoordinatorError> {
        let rows = self
            .store
            .claim_outbox(32, OUTBOX_LEASE_MS)
            .await
            .map_err(CoordinatorError::Store)?;
        let n = rows.len();
        for row in rows {
            let result = match row.kind.as_str() {
                "start_child" => self.start_child(&row).await,
                "child_finished" => self.deliver_child_end(&row).await,
                "cancel_child" => self.cancel_child(&row).await,
                other => Err(CoordinatorError::Store(StoreError::Corrupt(format!(
                    "outbox row {} has unknown kind `{other}`",
                    row.outbox_id
                )))),
            };
            let error = result.err().map(|e| e.to_string());
            if let Some(e) = &error {
                tracing::warn!(outbox_id = %row.outbox_id, kind = %row.kind, attempt = row.attempts, error = %e, "outbox row failed; retried after its lease");
            }
            self.store
                .finish_outbox(row.outbox_id, error.as_deref())
                .await
                .map_err(CoordinatorError::Store)?;
        }
        Ok(n)
    }

    /// `start_child`: create the child run (its id and idempotency key are
    /// fixed, so a second attempt finds it). A workflow that cannot start
    /// (not registered, input refused) is reported to the parent as a
    /// failed child.
    async fn start_child(&self, row: &crate::store::OutboxRow) -> Result<(), CoordinatorError> {
        let p = &row.payload;
        let field = |k: &str| {
            p.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let (tenant, call_id, workflow) = (field("tenant"), field("call_id"), field("workflow"));
        let child_run_id = Uuid::parse_str(&field("child_run_id")).map_err(|e| {
            CoordinatorError::Store(StoreError::Corrupt(format!("outbox child_run_id: {e}")))
        })?;
        let input = p.get("input").cloned().unwrap_or(Value::Null);
        let parent = self
            .store
            .get_run(&tenant, row.run_id)
            .await?
            .ok_or_else(|| CoordinatorError::NotFound(format!("run {}", row.run_id)))?;
        let parent_state = self.store.run_state(row.run_id).await?;
        let sync = p.get("sync").and_then(Value::as_bool).unwrap_or(true);
        // A cancelled (or failed) parent keeps its last step in the state,
        // so its status is looked at too.
        let child_id = child_run_id.to_string();
        let awaited = !parent_state.status.is_terminal()
            && (matches!(
                parent_state.step.as_ref().map(|s| &s.kind),
                Some(machine::StepKind::Child { child_run_id: c, .. }) if *c == child_id
            ) || parent_state.tool_calls.values().any(|c| {
                c.status == machine::CallStatus::Open
                    && c.child_run_id.as_deref() == Some(child_id.as_str())
            }));
        if sync && !awaited {
            // The parent stopped waiting before the child started (it was
            // cancelled, or gave up): starting it now would orphan it.
            tracing::info!(parent = %row.run_id, child = %child_run_id, "child run not started: its parent no longer waits for it");
            return Ok(());
        }
        let started = async {
            // The parent's ancestors plus the parent itself: the child's level.
            let depth = self
                .store
                .run_depth(row.run_id, MAX_CHILD_DEPTH)
                .await?
                .saturating_add(1);
            if depth > MAX_CHILD_DEPTH {
                return Err(CoordinatorError::FailedPrecondition(format!(
                    "workflow `{workflow}` would be a child run {depth} levels deep, more than the {MAX_CHILD_DEPTH} a run may nest (does a workflow start itself again?)"
                )));
            }
            let plan = self.resolve_plan(&tenant, &workflow).await?;
            if let Some(schema) = &plan.workflow.def.input_schema {
                definitions::validate_json(schema, &input).map_err(|errors| {
                    CoordinatorError::InvalidArgument(format!(
                        "input does not match workflow `{workflow}`'s input schema: {}",
                        errors.join("; ")
                    ))
                })?;
            }
            let tenant_grants = self.store.tenant_grants(&tenant).await?;
            let version = plan.workflow.version as i32;
            let decision = machine::decide(
                &self.start_state(&plan).await?,
                Input::Start {
                    run_id: child_run_id.to_string(),
                    tenant: tenant.clone(),
                    caller: parent.caller.clone(),
                    caller_grants: parent_state.caller_grants.clone(),
                    tenant_grants,
                    input: input.clone(),
                    plan: Box::new(plan),
                    // A child run is in its parent's trace, below the
                    // span of the node that started it.
                    trace: parent_state.trace.as_ref().map(|trace| {
                        trace.for_node(
                            &parent_state.run_id,
                            belay_proto::trace::visit_of(&call_id),
                        )
                    }),
                },
            )?;
            let (_, created) = self
                .store
                .create_child_run(
                    child_run_id,
                    &tenant,
                    &workflow,
                    version,
                    &input,
                    &format!("child:{}/{call_id}", row.run_id),
                    &parent.caller,
                    &decision,
                    (row.run_id, &call_id),
                )
                .await?;
            if created {
                self.record_created(&decision);
            }
            Ok::<_, CoordinatorError>(())
        }
        .await;
        match started {
            Ok(()) => {
                tracing::info!(parent = %row.run_id, child = %child_run_id, workflow, "child run started");
                Ok(())
            }
            // The child cannot run: the parent hears it as a failed child.
            Err(
                e @ (CoordinatorError::NotFound(_)
                | CoordinatorError::FailedPrecondition(_)
                | CoordinatorError::InvalidArgument(_)),
            ) => {
                let input = Input::ChildRunFinished {
                    child_run_id: child_run_id.to_string(),
                    status: "failed".into(),
                    output: None,
                    error: Some(format!("the child run could not start: {e}")),
                };
                self.transition(row.run_id, None, |state, _| {
                    machine::decide(state, input).map_err(CoordinatorError::from)
                })
                .await?;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// `child_finished`: tell the parent (a parent no longer waiting
    /// ignores it).
    async fn deliver_child_end(
        &self,
        row: &crate::store::OutboxRow,
    ) -> Result<(), CoordinatorError> {
        let p = &row.payload;
        let parent = p
            .get("parent_run_id")
            .and_then(Value::as_str)
            .and_then(|s| Uuid::parse_str(s).ok())
            .ok_or_else(|| {
                CoordinatorError::Store(StoreError::Corrupt(format!(
                    "outbox row {} has no parent_run_id",
                    row.outbox_id
                )))
            })?;
        let input = Input::ChildRunFinished {
            child_run_id: row.run_id.to_string(),
            status: p
                .get("status")
                .and_then(Value::as_str)
                .unwrap_or("failed")
                .to_owned(),
            output: p.get("output").cloned().filter(|v| !v.is_null()),
            error: p.get("error").and_then(Value::as_str).map(str::to_owned),
        };
        self.transition(parent, None, |state, _| {
            machine::decide(state, input).map_err(CoordinatorError::from)
        })
        .await?;
        Ok(())
    }

    /// `cancel_child`: cancel the child unless it has ended already.
    async fn cancel_child(&self, row: &crate::store::OutboxRow) -> Result<(), CoordinatorError> {
        let p = &row.payload;
        let child = p
            .get("child_run_id")
            .and_then(Value::as_str)
            .and_then(|s| Uuid::parse_str(s).ok())
            .ok_or_else(|| {
                CoordinatorError::Store(StoreError::Corrupt(format!(
                    "outbox row {} has no child_run_id",
                    row.outbox_id
                )))
            })?;
        let reason = p
            .get("reason")
            .and_then(Value::as_str)
            .unwrap_or("its parent cancelled it")
            .to_owned();
        let result = self
            .transition(child, None, |state, _| {
                machine::decide(state, Input::Cancel { reason }).map_err(CoordinatorError::from)
            })
            .await;
        match result {
            Ok(_) => Ok(()),
            // Ended already: nothing to cancel.
            Err(TransitionError::Refused(CoordinatorError::FailedPrecondition(_))) => Ok(()),
            // Not created (yet): its `start_child` row may still be in
            // flight on another replica; look again a few times, after which
            // it was surely never started (its parent stopped waiting first).
            Err(TransitionError::Store(StoreError::NotFound(_))) if row.attempts < 4 => {
                Err(CoordinatorError::FailedPrecondition(format!(
                    "child run {child} does not exist yet"
                )))
            }
            Err(TransitionError::Store(StoreError::NotFound(_))) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn listen_loop(&self) {
        let mut backoff = Duration::from_millis(100);
        loop {
            match self.listen_once().await {
                Ok(()) => {}
                Err(e) => tracing::warn!(error = %e, "LISTEN connection lost; reconnecting"),
            }
            // Wake everyone: notifications may have been missed.
            self.tasks_ready.notify_waiters();
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }

    async fn listen_once(&self) -> Result<(), StoreError> {
        let tasks_ready = &self.tasks_ready;
        let outbox_ready = &self.outbox_ready;
        let run_events = &self.run_events;
        self.store
            .listen(&mut |wake| match wake {
                // One claimer per wake-up (not all: each would run a claim
                // query, all but one for nothing); a claimer that fills its
                // batch passes the wake-up on.
                Wake::Tasks => tasks_ready.notify_one(),
                Wake::Outbox => outbox_ready.notify_one(),
                Wake::RunEvents(run) => {
                    let _ = run_events.send(run);
                }
            })
            .await
    }
}
