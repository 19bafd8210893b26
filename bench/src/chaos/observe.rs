//! What the database says once the faults have stopped: waiting until the
//! runs settle ([`wait_settled`]), then reading every run, event, task,
//! uncertain-outcome record and wake-up ([`read_facts`]) for the checks.
//! The harness reads PostgreSQL directly (not through the proxy), as an
//! operator with `psql` would.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::Value;
use sqlx::{PgPool, Row};
use tokio::time::Instant;
use uuid::Uuid;

/// One row of `runs`.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRow {
    /// Run id.
    pub run_id: Uuid,
    /// The key `StartRun` was given.
    pub idempotency_key: String,
    /// `completed`, `failed`, `paused`, …
    pub status: String,
    /// Why (for `paused`, `waiting`, `failed`).
    pub reason: String,
    /// The last event's `seq` as the run row says.
    pub last_seq: i64,
}

/// One event.
#[derive(Debug, Clone, PartialEq)]
pub struct EventRow {
    /// Its `seq`.
    pub seq: i64,
    /// Its kind (`tool_call_scheduled`, …).
    pub kind: String,
    /// The event.
    pub payload: Value,
}

/// One task, with how its lease stands.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskRow {
    /// Its run.
    pub run_id: Uuid,
    /// Its call.
    pub call_id: String,
    /// `ready`, `leased`, `completed`, …
    pub status: String,
    /// The worker that holds or held it.
    pub worker_id: Option<String>,
    /// Its attempt.
    pub attempt: i32,
    /// ms since its lease ended, by the database's clock (the later of the
    /// claim's expiry and the attempt's heartbeat); negative while it
    /// holds, `None` without a lease.
    pub lease_over_ms: Option<f64>,
}

/// One uncertain-outcome record.
#[derive(Debug, Clone, PartialEq)]
pub struct UncertainRow {
    /// Its run.
    pub run_id: Uuid,
    /// Its call.
    pub call_id: String,
    /// `open` or `resolved`.
    pub status: String,
    /// How it was resolved (`operator`, `probe`, `late_result`, …).
    pub resolved_via: Option<String>,
}

/// Everything read.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// Every run.
    pub runs: Vec<RunRow>,
    /// Every run's events, in `seq` order.
    pub events: BTreeMap<Uuid, Vec<EventRow>>,
    /// Every task.
    pub tasks: Vec<TaskRow>,
    /// Every uncertain-outcome record.
    pub uncertain: Vec<UncertainRow>,
    /// Runs with a timer or a callback registered (what wakes a waiting run).
    pub wakeups: BTreeSet<Uuid>,
}

/// Runs not settled yet: still `pending` or `running`, or with a task
/// ready or leased (a probe under way, a retry waiting for its turn).
///
/// Errors: the query failing.
pub async fn unsettled(pool: &PgPool) -> Result<i64> {
    sqlx::query_scalar(
        "SELECT count(*) FROM runs r
         WHERE r.status IN ('pending', 'running')
            OR EXISTS (SELECT 1 FROM tasks t
                       WHERE t.run_id = r.run_id AND t.status IN ('ready', 'leased'))",
    )
    .fetch_one(pool)
    .await
    .context("counting the runs not settled")
}

/// Waits until every run has settled or `timeout` passes; returns whether
/// all settled. Errors of the query (PostgreSQL just back) are retried.
pub async fn wait_settled(pool: &PgPool, timeout: Duration) -> bool {
    let started = Instant::now();
    loop {
        if let Ok(0) = unsettled(pool).await {
            return true;
        }
        if started.elapsed() > timeout {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Reads every fact the checks need, in one snapshot (a `REPEATABLE READ`
/// read-only transaction): a late result recorded between two of the
/// reads must not show a run still paused beside its resolved uncertain
/// record.
///
/// Errors: a query failing.
pub async fn read_facts(pool: &PgPool) -> Result<Facts> {
    let mut tx = pool.begin().await.context("starting the snapshot")?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await
        .context("starting the snapshot")?;
    let facts = read_facts_in(&mut tx).await?;
    tx.commit().await.context("ending the snapshot")?;
    Ok(facts)
}

async fn read_facts_in(pool: &mut sqlx::PgConnection) -> Result<Facts> {
    let runs = sqlx::query(
        "SELECT run_id, idempotency_key, status, status_reason, last_seq FROM runs ORDER BY created_at",
    )
    .fetch_all(&mut *pool)
    .await
    .context("reading runs")?
    .iter()
    .map(|r| {
        Ok(RunRow {
            run_id: r.try_get("run_id")?,
            idempotency_key: r.try_get("idempotency_key")?,
            status: r.try_get("status")?,
            reason: r.try_get("status_reason")?,
            last_seq: r.try_get("last_seq")?,
        })
    })
    .collect::<Result<Vec<_>, sqlx::Error>>()?;
    Ok(Facts {
        runs,
        events: read_events(&mut *pool).await?,
        tasks: read_tasks(&mut *pool).await?,
        uncertain: read_uncertain(&mut *pool).await?,
        wakeups: sqlx::query_scalar("SELECT run_id FROM timers UNION SELECT run_id FROM callbacks")
            .fetch_all(&mut *pool)
            .await
            .context("reading timers and callbacks")?
            .into_iter()
            .collect(),
    })
}

async fn read_events(pool: &mut sqlx::PgConnection) -> Result<BTreeMap<Uuid, Vec<EventRow>>> {
    let rows = sqlx::query("SELECT run_id, seq, kind, payload FROM events ORDER BY run_id, seq")
        .fetch_all(pool)
        .await
        .context("reading events")?;
    let mut events: BTreeMap<Uuid, Vec<EventRow>> = BTreeMap::new();
    for r in rows {
        events
            .entry(r.try_get("run_id")?)
            .or_default()
            .push(EventRow {
                seq: r.try_get("seq")?,
                kind: r.try_get("kind")?,
                payload: r.try_get("payload")?,
            });
    }
    Ok(events)
}

async fn read_tasks(pool: &mut sqlx::PgConnection) -> Result<Vec<TaskRow>> {
    sqlx::query(
        "SELECT t.run_id, t.call_id, t.status, t.worker_id, t.attempt,
                (EXTRACT(EPOCH FROM (belay_now() - GREATEST(t.lease_expires_at, h.lease_until)))
                 * 1000)::float8 AS lease_over_ms
         FROM tasks t
         LEFT JOIN task_heartbeats h ON h.task_id = t.task_id AND h.attempt = t.attempt",
    )
    .fetch_all(pool)
    .await
    .context("reading tasks")?
    .iter()
    .map(|r| {
        Ok(TaskRow {
            run_id: r.try_get("run_id")?,
            call_id: r.try_get("call_id")?,
            status: r.try_get("status")?,
            worker_id: r.try_get("worker_id")?,
            attempt: r.try_get("attempt")?,
            lease_over_ms: r.try_get("lease_over_ms")?,
        })
    })
    .collect::<Result<Vec<_>, sqlx::Error>>()
    .context("reading a task row")
}

async fn read_uncertain(pool: &mut sqlx::PgConnection) -> Result<Vec<UncertainRow>> {
    sqlx::query("SELECT run_id, call_id, status, resolved_via FROM uncertain_outcomes")
        .fetch_all(pool)
        .await
        .context("reading uncertain outcomes")?
        .iter()
        .map(|r| {
            Ok(UncertainRow {
                run_id: r.try_get("run_id")?,
                call_id: r.try_get("call_id")?,
                status: r.try_get("status")?,
                resolved_via: r.try_get("resolved_via")?,
            })
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()
        .context("reading an uncertain-outcome row")
}
