//! The worker loop: claim tasks, keep their leases alive, perform them, report.
//!
//! - One claim loop long-polls `ClaimTasks` for as many tasks as there are
//!   free slots (a semaphore of `concurrency` permits bounds the tasks in
//!   flight). While the engine is unreachable it backs off (100 ms doubling to
//!   5 s) and logs once per outage.
//! - Each claimed task runs in its own tokio task holding one permit. Its
//!   `CompleteTask` asks the engine to claim one more task with the report
//!   (`claim_next`, unless the worker is stopping): a task handed back so
//!   runs next under the same permit, without a claim round trip, so a run
//!   whose steps follow each other goes from step to step in one call.
//! - One heartbeat loop renews every held lease in a single `Heartbeat`,
//!   a third of the shortest lease after the last renewal. A lease the engine
//!   reports as not held is dropped at once: if the task had not been
//!   dispatched, its future is aborted and nothing is reported (the engine
//!   retries it); if a tool call was already dispatched, its effect may be
//!   under way, so it finishes and its result is reported late (the engine
//!   resolves an uncertain outcome with it, lets the first result win, or
//!   keeps it as history).
//! - A `tool_call` is dispatched (`DispatchToolCall`) before the HTTP request
//!   starts; if dispatch fails the worker does not act and does not report.
//!   An async webhook's request gets the callback URL the dispatch returned;
//!   its 2xx answer is reported as a result the engine reads as "accepted".
//!   A `type: mcp` call goes through [`crate::mcp_tool`]: the dispatch also
//!   carries the tool's listed definition hash and returns the pinned one.
//!   A `type: sandbox` call runs its code through [`crate::sandbox_tool`]
//!   after dispatch (a worker without the runtime refuses it `NOT_SENT`
//!   before).
//! - The run's secret vault: a tool with `SECRET_ACCESS` gets its values
//!   from the dispatch and its request is built again with them (headers
//!   and body template only); a producer's result has the value at each
//!   of its spec's `result_secrets` paths taken out (`[VAULTED:<key>]` left
//!   in its place) and sent beside the result in `CompleteTask`, never in
//!   it. Neither kind of value is logged, and what a tool answers is
//!   reported with them redacted.
//! - On shutdown the claim loop stops, in-flight tasks get a grace period to
//!   finish and report (heartbeats continue meanwhile); the rest are
//!   stopped and each is reported as failed at once, so the engine judges
//!   it now rather than when its lease runs out: `NOT_SENT` for a tool call
//!   not yet dispatched, `MAY_HAVE_ACTED` for a dispatched one and for a
//!   model call (its request may be with the provider). A task that was
//!   already reporting its outcome is left to that report (or its lease).
//! - Each heartbeat's RPC deadline is a third of the shortest lease held
//!   (at most 10 s), so one stalled heartbeat cannot outlive a short lease:
//!   it fails and the next one goes out while the lease still holds.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;
use tracing::Instrument as _;

use anyhow::Context as _;
use belay_proto::v1::{FailureClass, LeaseStatus, Task, TaskLease};
use belay_proto::wire::{
    McpBinding, ModelCallSpec, SandboxBinding, TASK_KIND_MODEL_CALL, TASK_KIND_TOOL_CALL,
    ToolBinding, ToolCallSpec,
};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, oneshot};
use tokio::task::{AbortHandle, JoinError, JoinSet};
use tokio::time::Instant;
use tonic::Code;

use crate::config::WorkerConfig;
use crate::engine_client::{EngineClient, McpReport, log_dispatch_refused};
use crate::http_tool::HttpToolClient;
use crate::mcp_tool::{McpCallReport, McpTools};
use crate::model::ModelClient;
use crate::sandbox_tool::SandboxTools;

/// Most tasks one `ClaimTasks` may ask for (the engine's limit).
const MAX_CLAIM: usize = 64;
/// First delay of the claim loop while the engine is unreachable, in ms.
const CLAIM_RETRY_MIN_MS: u64 = 100;
/// Largest delay of the claim loop while the engine is unreachable, in ms.
const CLAIM_RETRY_MAX_MS: u64 = 5_000;
/// Shortest time between two claims that returned nothing.
const MIN_EMPTY_CLAIM_INTERVAL: Duration = Duration::from_millis(100);
/// First delay after a failed heartbeat, in ms.
const HEARTBEAT_RETRY_MIN_MS: u64 = 100;
/// Largest delay after failed heartbeats, in ms.
const HEARTBEAT_RETRY_MAX_MS: u64 = 2_000;
/// Shortest heartbeat period, in ms, so a tiny lease cannot make a busy loop.
const MIN_HEARTBEAT_PERIOD_MS: u64 = 50;
/// Lease assumed when the engine sends `lease_ms: 0`, in ms.
const FALLBACK_LEASE_MS: u64 = 30_000;
/// Longest deadline of one `Heartbeat` RPC, in ms (with a lease of 30 s or
/// more; shorter leases get a third of theirs).
const MAX_HEARTBEAT_DEADLINE_MS: u64 = 10_000;
/// How long the failure reports of tasks abandoned at shutdown are retried
/// for, in total, ms: the worker is stopping.
const ABANDONED_REPORT_RETRY_MS: u64 = 3_000;

/// Runs a worker until `shutdown` resolves, then drains in-flight tasks for up
/// to `config.shutdown_grace_ms` and returns.
///
/// Errors only on invalid configuration (engine URL, HTTP clients); engine
/// outages, model and tool failures are handled and logged, never returned.
pub async fn run(config: WorkerConfig, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let engine = EngineClient::connect(&config.connect_options(), config.worker_id.clone())
        .context("cannot set up the engine connection")?;
    run_with_engine(config, engine, shutdown).await
}

/// [`run`] with a ready-made engine client (for a custom retry policy).
/// `config.engine_url` and `config.worker_id` are not used; the client's are.
pub async fn run_with_engine(
    config: WorkerConfig,
    engine: EngineClient,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let model = ModelClient::new(&config.model).context("cannot build the model client")?;
    let tools = HttpToolClient::new(
        config.http_base_url.clone(),
        config.tool_network_policy.clone(),
    )
    .context("cannot build the HTTP tool client")?
    .with_config_values(config.tool_config.clone().or(&config.mcp.config))
    .with_tls_profiles(&config.tls_profiles)
    .context("invalid --tls-profiles")?;
    // MCP servers connect (and report their tools) before the first claim.
    let mcp = if config.mcp.servers.is_empty() {
        None
    } else {
        Some(
            McpTools::start(&config.mcp, &config.tool_network_policy, engine.clone())
                .await
                .context("invalid MCP configuration")?,
        )
    };
    let health = config.health.clone();
    health.set_worker_id(engine.worker_id());
    let sandbox = SandboxTools::start(config.sandbox.clone()).await;
    let engine = match engine.capabilities() {
        Some(_) => engine,
        None => engine.with_capabilities(
            crate::capabilities::of(&config, &sandbox).map_err(anyhow::Error::msg)?,
        ),
    };
    let ctx = Arc::new(Ctx {
        engine,
        model,
        tools,
        mcp,
        sandbox,
        leases: Mutex::new(HashMap::new()),
        lease_added: Notify::new(),
        metrics: health.metrics().clone(),
        stopping: AtomicBool::new(!config.claim_with_reports),
    });
    let concurrency = config.concurrency.clamp(1, Semaphore::MAX_PERMITS);
    ctx.metrics.set_capacity(concurrency);
    tracing::info!(
        worker_id = ctx.engine.worker_id(),
        engine_url = %config.engine_url,
        concurrency,
        "worker started"
    );

    let (stop_heartbeats, heartbeats_stopped) = oneshot::channel();
    let heartbeats = tokio::spawn(heartbeat_loop(Arc::clone(&ctx), heartbeats_stopped));

    let semaphore = Arc::new(Semaphore::new(concurrency));
    let mut tasks = JoinSet::new();
    let mut outage_since: Option<Instant> = None;
    let mut refused: Option<tonic::Status> = None;
    let mut retry_delay = Duration::from_millis(CLAIM_RETRY_MIN_MS);
    tokio::pin!(shutdown);

    loop {
        while let Some(joined) = tasks.try_join_next() {
            log_join(joined);
        }
        let first = tokio::select! {
            biased;
            () = &mut shutdown => break,
            permit = Arc::clone(&semaphore).acquire_owned() => match permit {
                Ok(permit) => permit,
                // The semaphore is never closed; treat it as a shutdown.
                Err(_) => break,
            },
        };
        let mut permits = vec![first];
        while permits.len() < MAX_CLAIM {
            match Arc::clone(&semaphore).try_acquire_owned() {
                Ok(permit) => permits.push(permit),
                Err(_) => break,
            }
        }
        let max_tasks = u32::try_from(permits.len()).unwrap_or(1);
        // Until a claim has reached the engine (at start, after an outage),
        // ask without waiting, so `/readyz` says ready at once instead of
        // after a whole long poll on an idle engine; then long-poll.
        let probe = health.get() != crate::health::Readiness::Ready && config.claim_wait_ms > 0;
        let wait_ms = if probe { 0 } else { config.claim_wait_ms };
        let claim_started = Instant::now();
        let claimed = tokio::select! {
            biased;
            // Dropping a claim in flight may leave tasks leased to us that we
            // never start; their leases expire and, as nothing was
            // dispatched, the engine simply retries them.
            () = &mut shutdown => break,
            claimed = ctx.engine.claim_tasks(max_tasks, wait_ms) => claimed,
        };
        note_claim(&ctx, &health, &claimed);
        match claimed {
            Ok(claimed) => {
                if let Some(since) = outage_since.take() {
                    tracing::info!(
                        down_ms = since.elapsed().as_millis() as u64,
                        "engine reachable again"
                    );
                }
                retry_delay = Duration::from_millis(CLAIM_RETRY_MIN_MS);
                // An engine that answers "nothing" without long-polling (or a
                // wait of 0) must not turn this loop into a busy poll; the
                // probe above is followed by a long poll at once.
                if claimed.is_empty()
                    && !probe
                    && claim_started.elapsed() < MIN_EMPTY_CLAIM_INTERVAL
                {
                    drop(permits);
                    tokio::select! {
                        biased;
                        () = &mut shutdown => break,
                        () = tokio::time::sleep_until(claim_started + MIN_EMPTY_CLAIM_INTERVAL) => {}
                    }
                    continue;
                }
                for task in claimed {
                    let Some(permit) = permits.pop() else {
                        tracing::warn!(
                            task_id = %task.task_id,
                            attempt = task.attempt,
                            "engine returned more tasks than asked for; leaving this one to lease expiry"
                        );
                        continue;
                    };
                    start_task(&ctx, &mut tasks, task, permit, claim_started);
                }
            }
            // Not an outage: the engine will not take this credential
            // again (no key, a revoked, expired or wrong-role key). Stop,
            // loudly, rather than look healthy while doing nothing.
            Err(status)
                if matches!(
                    status.code(),
                    tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
                ) =>
            {
                refused = Some(status);
                break;
            }
            Err(status) => {
                if outage_since.is_none() {
                    // With the transport's causes: a TLS failure (an untrusted
                    // certificate) says so only there.
                    tracing::warn!(
                        code = ?status.code(),
                        error = %belay_proto::connect::status_detail(&status),
                        "cannot claim tasks; retrying with backoff until the engine answers"
                    );
                    outage_since = Some(Instant::now());
                }
                drop(permits);
                tokio::select! {
                    biased;
                    () = &mut shutdown => break,
                    () = tokio::time::sleep(retry_delay) => {}
                }
                retry_delay = (retry_delay * 2).min(Duration::from_millis(CLAIM_RETRY_MAX_MS));
            }
        }
    }

    health.stopping();
    ctx.stopping.store(true, Ordering::SeqCst);
    tracing::info!(
        in_flight = tasks.len(),
        "shutting down: stopped claiming, waiting for in-flight tasks"
    );
    drain(&ctx, &mut tasks, config.shutdown_grace_ms).await;
    let _ = stop_heartbeats.send(());
    if let Err(e) = heartbeats.await {
        tracing::error!(error = %e, "heartbeat loop ended abnormally");
    }
    if let Some(mcp) = &ctx.mcp {
        mcp.shutdown().await;
    }
    tracing::info!("worker stopped");
    refused.map_or(Ok(()), credential_refused)
}

/// Waits up to `grace_ms` for the tasks in flight to finish; then stops
/// the rest and reports each ([`report_abandoned`]).
async fn drain(ctx: &Ctx, tasks: &mut JoinSet<()>, grace_ms: u64) {
    let grace = Duration::from_millis(grace_ms);
    let drained = tokio::time::timeout(grace, async {
        while let Some(joined) = tasks.join_next().await {
            log_join(joined);
        }
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            abandoned = tasks.len(),
            "shutdown grace period over; stopping the tasks still running and reporting them"
        );
        let abandoned = ctx.held();
        tasks.shutdown().await;
        report_abandoned(ctx, abandoned, grace_ms).await;
    }
}

/// Tells the health state and the metrics how a claim went.
fn note_claim(
    ctx: &Ctx,
    health: &crate::health::HealthState,
    claimed: &Result<Vec<Task>, tonic::Status>,
) {
    ctx.metrics.claim(match claimed {
        Ok(tasks) if tasks.is_empty() => "empty",
        Ok(_) => "claimed",
        Err(s) if matches!(s.code(), Code::Unauthenticated | Code::PermissionDenied) => "refused",
        Err(_) => "error",
    });
    match claimed {
        Ok(_) => health.claim_succeeded(),
        Err(status) => health.claim_failed(format!("{:?}: {}", status.code(), status.message())),
    }
}

/// The error a worker stops with when the engine refuses its credential
/// (no key, a revoked, expired or wrong-role key), logged as it is made.
fn credential_refused(status: tonic::Status) -> anyhow::Result<()> {
    tracing::error!(
        code = ?status.code(),
        error = %status.message(),
        "the engine refuses this worker's credential (--api-key, BELAY_API_KEY); stopping"
    );
    anyhow::bail!(
        "the engine refused the worker's credential: {:?}: {}",
        status.code(),
        status.message()
    )
}

/// What the tasks share.
struct Ctx {
    engine: EngineClient,
    model: ModelClient,
    tools: HttpToolClient,
    /// MCP servers, when configured (`type: mcp` tools).
    mcp: Option<Arc<McpTools>>,
    /// Runs `type: sandbox` tools.
    sandbox: SandboxTools,
    /// Leases held, by (task id, attempt).
    leases: Mutex<HashMap<LeaseKey, HeldLease>>,
    /// Wakes the heartbeat loop when a lease is added (it may be the shortest).
    lease_added: Notify,
    /// The worker's metrics (served by the health listener).
    metrics: crate::metrics::WorkerMetrics,
    /// Set once the claim loop stopped (or from the start, without
    /// `claim_with_reports`): reports claim no next task.
    stopping: AtomicBool,
}

type LeaseKey = (String, u32);

/// Tasks the engine claimed for this worker with a task's report
/// (`claim_next`), to run next under the task's permit.
type NextTasks = Arc<Mutex<Vec<(Task, Instant)>>>;

struct HeldLease {
    /// The task's run and kind, for a report at shutdown.
    run_id: String,
    kind: String,
    /// Lease length the engine last gave, in ms.
    lease_ms: u64,
    /// When the last successful heartbeat (or the claim) was sent; the engine
    /// extended the lease no earlier than this.
    renewed_at: Instant,
    /// Aborts the future running the task (set once it is spawned; shared
    /// by the tasks handed over to it).
    abort: Arc<OnceLock<AbortHandle>>,
    /// Set once the engine allowed a tool call's side effect to start.
    dispatched: Arc<AtomicBool>,
    /// Set once the task started reporting its outcome.
    reporting: Arc<AtomicBool>,
    /// What its report's `claim_next` claimed.
    next: NextTasks,
}

/// A task still running when the shutdown grace period ended.
struct Abandoned {
    task: Task,
    dispatched: Arc<AtomicBool>,
    reporting: Arc<AtomicBool>,
}

impl Ctx {
    fn leases(&self) -> MutexGuard<'_, HashMap<LeaseKey, HeldLease>> {
        // A panic while holding the lock leaves the map consistent (every
        // operation on it is a single insert/remove/update).
        self.leases.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks `task` as reporting its outcome (a stop at shutdown then
    /// leaves it to that report).
    fn reporting(&self, task: &Task) {
        if let Some(held) = self.leases().get(&(task.task_id.clone(), task.attempt)) {
            held.reporting.store(true, Ordering::SeqCst);
        }
    }

    /// How many tasks `task`'s report asks the engine to claim with it:
    /// one, unless the worker is stopping or the task's lease is gone (a
    /// late report after a lost lease has no entry to hand over to).
    fn claim_next(&self, task: &Task) -> u32 {
        let held = self
            .leases()
            .contains_key(&(task.task_id.clone(), task.attempt));
        u32::from(held && !self.stopping.load(Ordering::SeqCst))
    }

    /// Keeps the tasks claimed with `task`'s report for its future to run
    /// next. A task whose lease is already gone (lost meanwhile) cannot run
    /// them: they are left to their leases' expiry, and said so.
    /// `sent`: when the report was sent (the claimed tasks' leases run
    /// from no earlier).
    fn hand_over(&self, task: &Task, claimed: Vec<Task>, sent: Instant) {
        if claimed.is_empty() {
            return;
        }
        match self.leases().get(&(task.task_id.clone(), task.attempt)) {
            Some(held) => held
                .next
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend(claimed.into_iter().map(|t| (t, sent))),
            None => {
                for lost in claimed {
                    tracing::warn!(
                        task_id = %lost.task_id, attempt = lost.attempt,
                        "a task claimed with a report arrived after its reporter's lease was gone; leaving it to lease expiry"
                    );
                }
            }
        }
    }

    /// The tasks whose leases are held now.
    fn held(&self) -> Vec<Abandoned> {
        self.leases()
            .iter()
            .map(|((task_id, attempt), held)| Abandoned {
                task: Task {
                    task_id: task_id.clone(),
                    attempt: *attempt,
                    run_id: held.run_id.clone(),
                    kind: held.kind.clone(),
                    ..Task::default()
                },
                dispatched: Arc::clone(&held.dispatched),
                reporting: Arc::clone(&held.reporting),
            })
            .collect()
    }

    /// The deadline of the next `Heartbeat` RPC: a third of the shortest
    /// lease held, at most [`MAX_HEARTBEAT_DEADLINE_MS`], so a heartbeat
    /// that stalls fails while the lease still holds and the next one has
    /// time to renew it.
    fn heartbeat_deadline(&self) -> Duration {
        let shortest = self.leases().values().map(|l| l.lease_ms).min();
        heartbeat_period(shortest.unwrap_or(FALLBACK_LEASE_MS))
            .min(Duration::from_millis(MAX_HEARTBEAT_DEADLINE_MS))
    }

    /// When the next heartbeat is due: a third of each lease after its last
    /// renewal, earliest first. `None` when no lease is held.
    fn next_heartbeat_due(&self) -> Option<Instant> {
        self.leases()
            .values()
            .map(|l| l.renewed_at + heartbeat_period(l.lease_ms))
            .min()
    }

    fn apply_heartbeat(&self, sent: &[TaskLease], statuses: Vec<LeaseStatus>, sent_at: Instant) {
        let mut leases = self.leases();
        // Renew everything sent first, so a lease the engine forgot to mention
        // does not make the loop send again immediately.
        for lease in sent {
            if let Some(held) = leases.get_mut(&(lease.task_id.clone(), lease.attempt)) {
                held.renewed_at = sent_at;
            }
        }
        let clock = self.engine.lease_clock();
        for status in statuses {
            let key = (status.task_id, status.attempt);
            if status.held {
                if let Some(held) = leases.get_mut(&key) {
                    if status.lease_ms > 0 {
                        held.lease_ms = status.lease_ms;
                    }
                    // Only a lease the engine says it extended may be acted
                    // on for longer.
                    clock.renewed(&key.0, key.1, sent_at, held.lease_ms);
                }
            } else if let Some(lost) = leases.remove(&key) {
                // Whatever the task does next, it starts no side effect.
                clock.lost(&key.0, key.1);
                if lost.dispatched.load(Ordering::SeqCst) {
                    // The side effect may be under way: finish it and report
                    // the real result late, so the engine can resolve an
                    // uncertain outcome (or keep it as history) instead of
                    // losing what happened.
                    tracing::warn!(
                        task_id = %key.0,
                        attempt = key.1,
                        "lease lost after dispatch; finishing the call to report its result late"
                    );
                } else {
                    if let Some(abort) = lost.abort.get() {
                        abort.abort();
                    }
                    tracing::warn!(
                        task_id = %key.0,
                        attempt = key.1,
                        "lease lost; task abandoned without reporting"
                    );
                }
            }
        }
    }
}

fn heartbeat_period(lease_ms: u64) -> Duration {
    let lease_ms = if lease_ms == 0 {
        FALLBACK_LEASE_MS
    } else {
        lease_ms
    };
    Duration::from_millis((lease_ms / 3).max(MIN_HEARTBEAT_PERIOD_MS))
}

/// Removes the task's lease when its future ends, however it ends (done,
/// panicked, aborted), so a dead task is never kept alive by heartbeats.
struct LeaseGuard {
    ctx: Arc<Ctx>,
    key: LeaseKey,
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.ctx.leases().remove(&self.key);
        self.ctx
            .engine
            .lease_clock()
            .forget(&self.key.0, self.key.1);
    }
}

/// Spawns `task` holding `permit`; when it ends, the task its report
/// claimed ([`Ctx::hand_over`]) runs next in the same future, under the
/// same permit, with a lease entry of its own.
fn start_task(
    ctx: &Arc<Ctx>,
    tasks: &mut JoinSet<()>,
    task: Task,
    permit: OwnedSemaphorePermit,
    claim_sent: Instant,
) {
    // Hold the lock across the spawn so the task's guard cannot remove the
    // lease before it is inserted, and a lost lease cannot be aborted
    // before the abort handle is set.
    let mut leases = ctx.leases();
    let abort = Arc::<OnceLock<AbortHandle>>::default();
    let first = Running::register(ctx, &mut leases, &task, &abort, claim_sent);
    let (task_ctx, task_abort) = (Arc::clone(ctx), Arc::clone(&abort));
    let handle = tasks.spawn(async move {
        let _permit = permit;
        let mut current = Some((task, first));
        while let Some((task, running)) = current.take() {
            let started = Instant::now();
            task_ctx.metrics.slot(true);
            perform_task(&task_ctx, &task, &running.dispatched).await;
            task_ctx.metrics.slot(false);
            task_ctx
                .metrics
                .task_duration(&task.kind, started.elapsed());
            current = running.finish().map(|(next, report_sent)| {
                let running = Running::register(
                    &task_ctx,
                    &mut task_ctx.leases(),
                    &next,
                    &task_abort,
                    report_sent,
                );
                task_ctx.lease_added.notify_one();
                (next, running)
            });
        }
    });
    let _ = abort.set(handle);
    drop(leases);
    ctx.lease_added.notify_one();
}

/// What the future running a task holds of the task's lease entry.
struct Running {
    /// Removes the entry when dropped.
    guard: LeaseGuard,
    dispatched: Arc<AtomicBool>,
    next: NextTasks,
}

impl Running {
    /// Enters `task`'s lease into `leases` (the locked map of `ctx`); the
    /// entry aborts the future `abort` names when the lease is lost.
    /// `sent` is when the request that claimed it was sent (the lease runs
    /// from no earlier).
    fn register(
        ctx: &Arc<Ctx>,
        leases: &mut HashMap<LeaseKey, HeldLease>,
        task: &Task,
        abort: &Arc<OnceLock<AbortHandle>>,
        sent: Instant,
    ) -> Running {
        let key: LeaseKey = (task.task_id.clone(), task.attempt);
        ctx.engine.lease_clock().leased(
            &task.task_id,
            task.attempt,
            sent,
            task.lease_from_ms,
            task.lease_ms,
        );
        let running = Running {
            guard: LeaseGuard {
                ctx: Arc::clone(ctx),
                key: key.clone(),
            },
            dispatched: Arc::new(AtomicBool::new(false)),
            next: NextTasks::default(),
        };
        leases.insert(
            key,
            HeldLease {
                run_id: task.run_id.clone(),
                kind: task.kind.clone(),
                lease_ms: task.lease_ms,
                renewed_at: sent,
                abort: Arc::clone(abort),
                dispatched: Arc::clone(&running.dispatched),
                reporting: Arc::new(AtomicBool::new(false)),
                next: Arc::clone(&running.next),
            },
        );
        running
    }

    /// Ends the task's lease entry; returns the task its report claimed,
    /// if any (the worker asks for one: more are left to lease expiry),
    /// with when that report was sent.
    fn finish(self) -> Option<(Task, Instant)> {
        let mut next =
            std::mem::take(&mut *self.next.lock().unwrap_or_else(PoisonError::into_inner));
        drop(self.guard);
        let first = (!next.is_empty()).then(|| next.remove(0));
        for (extra, _) in next {
            tracing::warn!(
                task_id = %extra.task_id, attempt = extra.attempt,
                "the engine claimed more tasks with a report than asked for; leaving this one to lease expiry"
            );
        }
        first
    }
}

/// Reports each task stopped at the end of the shutdown grace period as
/// failed (unless it was already reporting its outcome), so the engine
/// judges it at once instead of when its lease expires: a tool call not
/// dispatched was not sent; a dispatched one, or a model call, may have
/// acted. The reports are retried only briefly: the worker is stopping.
async fn report_abandoned(ctx: &Ctx, abandoned: Vec<Abandoned>, grace_ms: u64) {
    let engine = ctx.engine.clone().with_retry_policy(crate::RetryPolicy {
        min_delay_ms: 50,
        max_delay_ms: 500,
        total_delay_ms: ABANDONED_REPORT_RETRY_MS,
    });
    for stopped in abandoned {
        if stopped.reporting.load(Ordering::SeqCst) {
            continue;
        }
        let task = &stopped.task;
        let dispatched = stopped.dispatched.load(Ordering::SeqCst);
        let (class, what) = match (task.kind.as_str(), dispatched) {
            (TASK_KIND_TOOL_CALL, false) => (
                FailureClass::NotSent,
                "before its tool call was dispatched: nothing was sent",
            ),
            (TASK_KIND_TOOL_CALL, true) => (
                FailureClass::MayHaveActed,
                "after its tool call was dispatched: the tool may have acted",
            ),
            _ => (
                FailureClass::MayHaveActed,
                "while its request may have been with the model provider",
            ),
        };
        let error = format!(
            "worker `{}` stopped this task when its shutdown grace period ({grace_ms} ms) ended, {what}",
            engine.worker_id()
        );
        let (task_id, attempt) = (&task.task_id, task.attempt);
        match engine
            .report_failure(task_id, attempt, error, class, None)
            .await
        {
            Ok(()) => tracing::info!(
                %task_id, attempt, run_id = %task.run_id, class = class.as_str_name(),
                "task stopped at shutdown reported"
            ),
            Err(status) => log_report_refused("FailTask", task, &status),
        }
    }
}

fn log_join(joined: Result<(), JoinError>) {
    if let Err(e) = joined
        && e.is_panic()
    {
        tracing::error!(error = %e, "task panicked; its lease will expire");
    }
}

async fn heartbeat_loop(ctx: Arc<Ctx>, mut stop: oneshot::Receiver<()>) {
    let mut failing_since: Option<Instant> = None;
    let mut retry_delay = Duration::from_millis(HEARTBEAT_RETRY_MIN_MS);
    let mut not_before: Option<Instant> = None;
    loop {
        let due = match (ctx.next_heartbeat_due(), not_before) {
            (Some(due), Some(not_before)) => Some(due.max(not_before)),
            (due, _) => due,
        };
        tokio::select! {
            biased;
            _ = &mut stop => return,
            () = ctx.lease_added.notified() => continue,
            () = sleep_until(due) => {}
        }
        let sent: Vec<TaskLease> = ctx
            .leases()
            .keys()
            .map(|(task_id, attempt)| TaskLease {
                task_id: task_id.clone(),
                attempt: *attempt,
            })
            .collect();
        if sent.is_empty() {
            continue;
        }
        let sent_at = Instant::now();
        let deadline = ctx.heartbeat_deadline();
        let answer = tokio::select! {
            biased;
            _ = &mut stop => return,
            answer = ctx.engine.heartbeat(sent.clone(), deadline) => answer,
        };
        match answer {
            Ok(statuses) => {
                if let Some(since) = failing_since.take() {
                    tracing::info!(
                        failing_ms = since.elapsed().as_millis() as u64,
                        "heartbeats accepted again"
                    );
                }
                not_before = None;
                retry_delay = Duration::from_millis(HEARTBEAT_RETRY_MIN_MS);
                ctx.apply_heartbeat(&sent, statuses, sent_at);
            }
            Err(status) => {
                if failing_since.is_none() {
                    tracing::warn!(
                        code = ?status.code(),
                        error = status.message(),
                        leases = sent.len(),
                        "heartbeat failed; retrying with backoff"
                    );
                    failing_since = Some(Instant::now());
                }
                // Never wait longer than a deadline: the lease is short.
                not_before = Some(Instant::now() + retry_delay.min(deadline));
                retry_delay = (retry_delay * 2).min(Duration::from_millis(HEARTBEAT_RETRY_MAX_MS));
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

async fn perform_task(ctx: &Ctx, task: &Task, dispatched: &AtomicBool) {
    let task_id = &task.task_id;
    let attempt = task.attempt;
    tracing::info!(%task_id, attempt, run_id = %task.run_id, kind = %task.kind, "task claimed");
    match task.kind.as_str() {
        TASK_KIND_MODEL_CALL => perform_model_call(ctx, task).await,
        TASK_KIND_TOOL_CALL => perform_tool_call(ctx, task, dispatched).await,
        other => {
            let error = format!("this worker cannot perform tasks of kind {other:?}");
            report_failure(ctx, task, FailureClass::NotSent, error).await;
        }
    }
}

async fn perform_model_call(ctx: &Ctx, task: &Task) {
    let spec: ModelCallSpec = match serde_json::from_str(&task.spec_json) {
        Ok(spec) => spec,
        Err(e) => {
            let error = format!("invalid model_call spec: {e}");
            return report_failure(ctx, task, FailureClass::Rejected, error).await;
        }
    };
    let span = crate::telemetry::model_call_span(task, &spec, ctx.model.provider());
    report_model_call(ctx, task, &spec, &span)
        .instrument(span.clone())
        .await;
}

/// Call the model and report its answer (inside the call's `span`).
async fn report_model_call(ctx: &Ctx, task: &Task, spec: &ModelCallSpec, span: &tracing::Span) {
    let answer = ctx.model.call(spec).await;
    if let Ok(result) = &answer {
        crate::telemetry::record_usage(span, result);
    }
    match answer {
        Ok(result) => match result_with_provider(&result, ctx.model.provider()) {
            Ok(json) => report_complete(ctx, task, json).await,
            Err(e) => {
                let error = format!("cannot encode the model result: {e}");
                report_failure(ctx, task, FailureClass::MayHaveActed, error).await;
            }
        },
        Err(e) => {
            let class = e.class();
            tracing::warn!(
                task_id = %task.task_id, attempt = task.attempt, class = class.as_str_name(),
                error = %e, "model call failed"
            );
            report_failure(ctx, task, class, e.to_string()).await;
        }
    }
}

/// A model call's result as JSON, with the provider named beside its
/// fields ([`belay_proto::wire::MODEL_PROVIDER_FIELD`], for the engine's
/// metrics).
fn result_with_provider(
    result: &belay_proto::wire::ModelCallResult,
    provider: crate::config::ModelProvider,
) -> Result<String, serde_json::Error> {
    let mut value = serde_json::to_value(result)?;
    if let Some(fields) = value.as_object_mut() {
        fields.insert(
            belay_proto::wire::MODEL_PROVIDER_FIELD.to_owned(),
            provider.as_str().into(),
        );
    }
    serde_json::to_string(&value)
}

async fn perform_tool_call(ctx: &Ctx, task: &Task, dispatched: &AtomicBool) {
    let spec: ToolCallSpec = match serde_json::from_str(&task.spec_json) {
        Ok(spec) => spec,
        Err(e) => {
            let error = format!("invalid tool_call spec: {e}");
            return report_failure(ctx, task, FailureClass::Rejected, error).await;
        }
    };
    let span = crate::telemetry::tool_call_span(task, &spec);
    perform_tool_spec(ctx, task, spec, dispatched)
        .instrument(span)
        .await;
}

/// Perform a tool call of `spec` (inside the call's span).
async fn perform_tool_spec(
    ctx: &Ctx,
    task: &Task,
    mut spec: ToolCallSpec,
    dispatched: &AtomicBool,
) {
    let task_id = &task.task_id;
    let attempt = task.attempt;
    // `source: config` parameters: resolved here, before dispatch, so a
    // value this worker lacks is NOT_SENT (naming only the placeholder).
    let filled = match crate::placeholders::resolve_arguments(
        &mut spec.arguments,
        &spec.config_params,
        ctx.tools.config_values(),
    ) {
        Ok(filled) => filled,
        Err(e) => {
            let error = format!("tool `{}`: {e}", spec.tool);
            return report_failure(ctx, task, FailureClass::NotSent, error).await;
        }
    };
    // What the tool answers must not carry those values back (a tool that
    // echoes its request): into the events, or to the model.
    let mut redact = Redactions {
        config: filled,
        secrets: Vec::new(),
    };
    if let ToolBinding::Mcp(binding) = &spec.binding {
        return perform_mcp_call(ctx, task, &spec, binding, dispatched, &mut redact).await;
    }
    if let ToolBinding::McpResource(binding) = &spec.binding {
        return perform_mcp_read(ctx, task, &spec, binding, dispatched, &mut redact).await;
    }
    if let ToolBinding::Sandbox(binding) = &spec.binding {
        return perform_sandbox_call(ctx, task, &spec, binding, dispatched, &redact).await;
    }
    // Build the request before dispatch: a call that cannot be made is
    // refused without ever being dispatched.
    let mut request = match ctx.tools.prepare(&spec) {
        Ok(request) => request,
        Err(e) => return report_failure(ctx, task, e.class(), e.to_string()).await,
    };
    let dispatch = match ctx.engine.dispatch_task(task).await {
        Ok(dispatch) => dispatch,
        Err(status) => return log_dispatch_refused(task, &status),
    };
    dispatched.store(true, Ordering::SeqCst);
    let callback_url = dispatch.callback_url;
    // `visibility.trace: false` arguments: their values, from the vault,
    // in place of their placeholders (a missing one sends nothing); the
    // request is built again below, with them.
    if let Err(error) = crate::untraced::restore_arguments(&mut spec.arguments, &dispatch.secrets) {
        return report_failure(ctx, task, FailureClass::NotSent, error).await;
    }
    if !dispatch.secrets.is_empty() {
        // The run's vault values for `{{_secret.KEY}}`: the request again,
        // with them (it was built with none, so only they change).
        redact.secrets = dispatch.secrets.values();
        request = match ctx.tools.prepare_with_secrets(&spec, &dispatch.secrets) {
            Ok(request) => request,
            Err(e) => {
                let error = redact.apply(e.to_string());
                return report_failure(ctx, task, e.class(), error).await;
            }
        };
    }
    if request.wants_callback_url() {
        // An async webhook: the engine's single-use callback URL goes into
        // the body. Without one nothing is sent (NOT_SENT: safe to retry).
        let injected = match callback_url.as_deref() {
            Some(url) => request.set_callback_url(url),
            None => Err(crate::http_tool::HttpToolError::Connect(
                "the engine gave no callback URL for an async webhook".into(),
            )),
        };
        if let Err(e) = injected {
            return report_failure(ctx, task, FailureClass::NotSent, e.to_string()).await;
        }
    }
    if let Some(trace) = crate::telemetry::outbound(&tracing::Span::current(), spec.trace.as_ref())
    {
        request.set_trace(&trace);
    }
    tracing::info!(
        %task_id, attempt, tool = %spec.tool, variant = spec.variant.as_deref().unwrap_or("-"),
        "tool call dispatched"
    );
    match ctx.tools.execute(request).await {
        Ok(value) => report_result(ctx, task, &spec, value, &redact).await,
        Err(e) => {
            let class = e.class();
            let error = redact.apply(e.to_string());
            tracing::warn!(
                %task_id, attempt, tool = %spec.tool, class = class.as_str_name(), %error,
                "tool call failed"
            );
            report_failure_with_status(ctx, task, class, error, e.status_code()).await;
        }
    }
}

/// A `type: mcp` call (see [`crate::mcp_tool`]): checked, dispatched,
/// called, reported.
async fn perform_mcp_call(
    ctx: &Ctx,
    task: &Task,
    spec: &ToolCallSpec,
    binding: &McpBinding,
    dispatched: &AtomicBool,
    redact: &mut Redactions,
) {
    let Some(mcp) = &ctx.mcp else {
        let error = format!(
            "MCP server `{}` is not configured on this worker (it has no --mcp-config)",
            binding.server
        );
        return report_failure(ctx, task, FailureClass::Rejected, error).await;
    };
    // A granted call's server may ask the agent's model for completions,
    // through this worker's model client; what they used is reported with
    // the outcome.
    let sampling = spec.sampling.clone().map(|grant| {
        let sampler = crate::sampling::ModelSampler::new(ctx.model.clone());
        Arc::new(crate::mcp::SamplingSession::new(grant, Arc::new(sampler)))
    });
    let mut definition_hash = None;
    let report = mcp
        .call(task, spec, binding, sampling.clone(), |d| {
            dispatched.store(true, Ordering::SeqCst);
            redact.secrets = d.secrets.values();
            definition_hash = d.definition_hash.map(str::to_owned);
        })
        .await;
    // A completion the server started before the call ended (it timed
    // out, say) is spent all the same: wait for it, then report.
    let used = match sampling {
        Some(session) => {
            session.finish().await;
            Some(session.usage()).filter(|u| !u.is_empty())
        }
        None => None,
    };
    let reported = Reported {
        sampling: used,
        mcp: McpReport {
            definition_hash,
            kind: None,
        },
    };
    report_mcp(ctx, task, spec, report, redact, reported).await;
}

/// Performs a `type: mcp` tool with `resource:`: reads the resource through
/// the worker's MCP client and reports its contents like a tool result.
async fn perform_mcp_read(
    ctx: &Ctx,
    task: &Task,
    spec: &ToolCallSpec,
    binding: &belay_proto::wire::McpResourceBinding,
    dispatched: &AtomicBool,
    redact: &mut Redactions,
) {
    let Some(mcp) = &ctx.mcp else {
        let error = format!(
            "MCP server `{}` is not configured on this worker (it has no --mcp-config)",
            binding.server
        );
        return report_failure(ctx, task, FailureClass::NotSent, error).await;
    };
    let report = mcp
        .read(task, spec, binding, |d| {
            dispatched.store(true, Ordering::SeqCst);
            redact.secrets = d.secrets.values();
        })
        .await;
    report_mcp(ctx, task, spec, report, redact, Reported::default()).await;
}

/// What a tool call's report carries beside its result or failure: the
/// model completions its MCP server asked for, and what an MCP call adds
/// (its definition hash, its kind of failure).
#[derive(Debug, Default)]
struct Reported {
    sampling: Option<belay_proto::wire::SamplingUsage>,
    mcp: McpReport,
}

/// Reports what an MCP call or read came to, with what `reported` adds.
async fn report_mcp(
    ctx: &Ctx,
    task: &Task,
    spec: &ToolCallSpec,
    report: McpCallReport,
    redact: &mut Redactions,
    mut reported: Reported,
) {
    if let Some(used) = &reported.sampling {
        tracing::info!(
            task_id = %task.task_id, attempt = task.attempt, tool = %spec.tool,
            requests = used.requests, input_tokens = used.input_tokens,
            output_tokens = used.output_tokens, "MCP server's sampling used the model"
        );
    }
    match report {
        McpCallReport::Complete(json) => match serde_json::from_str::<serde_json::Value>(&json) {
            Ok(value) => report_result_sampled(ctx, task, spec, value, redact, reported).await,
            // Never happens (the text is a value's); fail rather than risk
            // reporting a value meant for the vault.
            Err(e) => {
                let error = format!("the MCP result is not JSON: {e}");
                report_failure_sampled(
                    ctx,
                    task,
                    FailureClass::MayHaveActed,
                    error,
                    None,
                    reported,
                )
                .await;
            }
        },
        McpCallReport::Fail { class, error, kind } => {
            let error = redact.apply(error);
            tracing::warn!(
                task_id = %task.task_id, attempt = task.attempt, tool = %spec.tool,
                class = class.as_str_name(), ?kind, %error, "MCP tool call failed"
            );
            reported.mcp.kind = kind;
            report_failure_sampled(ctx, task, class, error, None, reported).await;
        }
        McpCallReport::NeedsInput(needed) => {
            let task_id = &task.task_id;
            let attempt = task.attempt;
            ctx.reporting(task);
            match ctx
                .engine
                .report_needs_input(task_id, attempt, &needed, reported.sampling)
                .await
            {
                Ok(()) => tracing::info!(
                    %task_id, attempt, tool = %spec.tool, via = ?needed.via,
                    "MCP tool asked for input from a person; the engine waits for it"
                ),
                Err(status) => log_report_refused("RequestToolInput", task, &status),
            }
        }
        McpCallReport::NotDispatched => {}
    }
}

/// A `type: sandbox` call (see [`crate::sandbox_tool`]): checked,
/// dispatched, run, reported.
async fn perform_sandbox_call(
    ctx: &Ctx,
    task: &Task,
    spec: &ToolCallSpec,
    binding: &SandboxBinding,
    dispatched: &AtomicBool,
    redact: &Redactions,
) {
    let (task_id, attempt) = (&task.task_id, task.attempt);
    if let Err(e) = ctx.sandbox.check(binding) {
        return report_failure(ctx, task, e.class(), e.to_string()).await;
    }
    if let Err(status) = ctx.engine.dispatch(task_id, attempt).await {
        return log_dispatch_refused(task, &status);
    }
    dispatched.store(true, Ordering::SeqCst);
    tracing::info!(
        %task_id, attempt, tool = %spec.tool, runtime = binding.runtime.as_str(),
        "sandbox tool call dispatched"
    );
    match ctx.sandbox.run(binding, &spec.arguments).await {
        Ok(value) => report_result(ctx, task, spec, value, redact).await,
        Err(e) => {
            let class = e.class();
            let error = redact.apply(e.to_string());
            tracing::warn!(
                %task_id, attempt, tool = %spec.tool, class = class.as_str_name(), %error,
                "sandbox tool call failed"
            );
            report_failure(ctx, task, class, error).await;
        }
    }
}

/// Values kept out of what a tool call reports (its result and errors): the
/// `source: config` values put into its arguments, shown as
/// `[REDACTED:config]`, and the vault values its dispatch handed out,
/// shown as `[REDACTED:secret]`.
struct Redactions {
    config: Vec<String>,
    secrets: Vec<String>,
}

impl Redactions {
    fn apply(&self, mut text: String) -> String {
        if !self.config.is_empty() {
            text = crate::placeholders::redact_values(&text, &self.config);
        }
        if !self.secrets.is_empty() {
            text = crate::placeholders::redact_values_as(&text, &self.secrets, "secret");
        }
        text
    }
}

/// Report a tool's result: the values at its spec's `result_secrets` paths
/// taken out (the result keeps `[VAULTED:<key>]` there, and any other copy
/// of them in the result is redacted) and sent beside it, for the run's
/// vault; then `redact` applied.
async fn report_result(
    ctx: &Ctx,
    task: &Task,
    spec: &ToolCallSpec,
    value: serde_json::Value,
    redact: &Redactions,
) {
    report_result_sampled(ctx, task, spec, value, redact, Reported::default()).await
}

/// [`report_result`] with what `reported` adds (an MCP server's sampling
/// usage, an MCP call's definition hash).
async fn report_result_sampled(
    ctx: &Ctx,
    task: &Task,
    spec: &ToolCallSpec,
    mut value: serde_json::Value,
    redact: &Redactions,
    reported: Reported,
) {
    let vaulted: Vec<(String, String)> = spec
        .result_secrets
        .iter()
        .filter_map(|r| {
            belay_proto::wire::take_secret_at(&mut value, &r.path, &r.key)
                .map(|v| (r.key.clone(), v))
        })
        .collect();
    let mut text = redact.apply(value.to_string());
    if !vaulted.is_empty() {
        let values: Vec<String> = vaulted.iter().map(|(_, v)| v.clone()).collect();
        text = crate::placeholders::redact_values_as(&text, &values, "vaulted");
        tracing::info!(
            task_id = %task.task_id, attempt = task.attempt, tool = %spec.tool,
            keys = ?vaulted.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            "result fields taken out for the run's secret vault"
        );
    }
    report_complete_vaulted(ctx, task, text, vaulted, reported).await
}

async fn report_complete(ctx: &Ctx, task: &Task, result_json: String) {
    report_complete_vaulted(ctx, task, result_json, Vec::new(), Reported::default()).await
}

async fn report_complete_vaulted(
    ctx: &Ctx,
    task: &Task,
    result_json: String,
    vaulted: Vec<(String, String)>,
    reported: Reported,
) {
    ctx.reporting(task);
    let task_id = &task.task_id;
    let attempt = task.attempt;
    let completion = crate::engine_client::Completion {
        result_json,
        vaulted,
        sampling: reported.sampling,
        claim_next: ctx.claim_next(task),
    };
    let sent = Instant::now();
    match ctx
        .engine
        .report_complete_claiming(task_id, attempt, completion, &reported.mcp)
        .await
    {
        Ok(claimed) => {
            ctx.metrics.task(&task.kind, "succeeded");
            tracing::info!(%task_id, attempt, "task completed");
            ctx.hand_over(task, claimed, sent);
        }
        // The engine will never accept this result (too large: OUT_OF_RANGE
        // is tonic's message-size refusal; or not valid for it); say so now rather than leave the task to lease expiry. The
        // effect did happen, so the class is MAY_HAVE_ACTED.
        Err(status) if matches!(status.code(), Code::InvalidArgument | Code::OutOfRange) => {
            tracing::warn!(
                %task_id, attempt, error = status.message(),
                "engine refused the result; reporting a failure instead"
            );
            let error = format!("the engine refused the result: {}", status.message());
            // The completions an MCP server got are charged with the
            // failure, as they would have been with the result.
            report_failure_sampled(ctx, task, FailureClass::MayHaveActed, error, None, reported)
                .await;
        }
        Err(status) => {
            ctx.metrics.task(&task.kind, "report_refused");
            log_report_refused("CompleteTask", task, &status)
        }
    }
}

async fn report_failure(ctx: &Ctx, task: &Task, class: FailureClass, error: String) {
    report_failure_with_status(ctx, task, class, error, None).await
}

async fn report_failure_with_status(
    ctx: &Ctx,
    task: &Task,
    class: FailureClass,
    error: String,
    status_code: Option<u16>,
) {
    report_failure_sampled(ctx, task, class, error, status_code, Reported::default()).await
}

async fn report_failure_sampled(
    ctx: &Ctx,
    task: &Task,
    class: FailureClass,
    error: String,
    status_code: Option<u16>,
    reported: Reported,
) {
    // Inside the call's span: it ends failed.
    crate::telemetry::record_failure(&tracing::Span::current());
    ctx.reporting(task);
    let task_id = &task.task_id;
    let attempt = task.attempt;
    match ctx
        .engine
        .report_failure_sampled(
            task_id,
            attempt,
            error,
            class,
            status_code,
            reported.sampling,
            &reported.mcp,
        )
        .await
    {
        Ok(()) => {
            ctx.metrics.task(&task.kind, failure_outcome(class));
            tracing::info!(%task_id, attempt, class = class.as_str_name(), "task failure reported")
        }
        Err(status) => {
            ctx.metrics.task(&task.kind, "report_refused");
            log_report_refused("FailTask", task, &status)
        }
    }
}

/// The `outcome` label of a reported failure class.
fn failure_outcome(class: FailureClass) -> &'static str {
    match class {
        FailureClass::NotSent => "not_sent",
        FailureClass::MayHaveActed => "may_have_acted",
        FailureClass::Rejected => "rejected",
        _ => "failed",
    }
}

fn log_report_refused(call: &'static str, task: &Task, status: &tonic::Status) {
    let task_id = &task.task_id;
    let attempt = task.attempt;
    match status.code() {
        Code::FailedPrecondition | Code::NotFound => tracing::info!(
            %task_id, attempt, call, code = ?status.code(), error = status.message(),
            "report dropped: the lease is gone or the task was cancelled"
        ),
        _ => tracing::error!(
            %task_id, attempt, call, code = ?status.code(), error = status.message(),
            "report failed; the task's lease will expire"
        ),
    }
}
