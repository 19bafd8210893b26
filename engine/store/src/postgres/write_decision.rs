//! Writing a decision in its transition's transaction: append the events,
//! update the run row, perform each command's statements
//! ([`write_decision`]), with the hot path's task writes merged into one
//! statement ([`TaskWrites`]).

use serde_json::Value;
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

use super::gates::record_tool_outcome;
use super::outbox::insert_outbox;
use crate::hand_off::{HANDED_ATTEMPT, Handed, scheduled_task_id};
use crate::rows::{StoreError, TOOL_CACHE_COLUMNS};
use crate::transition::Wakes;
use belay_machine::{Command, Decision, RunState, SealedSecret, TaskEnd};

/// An RFC 3339 time (the machine writes them; a bad one is treated as "now").
fn parse_time(s: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&chrono::Utc))
}

/// The task writes of a decision whose commands are only the hot path's
/// (schedule, retry, mark dispatched, end), each on a different call, and
/// whose updates are all of the transition's own locked task: they
/// go into the statement that appends the events and updates the run row,
/// as data-modifying CTEs over arrays (one round trip and one executor start
/// instead of one per command; belay-bench measured the round trips to
/// PostgreSQL as the largest part of the engine's and the server's CPU per
/// step). The CTEs of one statement see the same snapshot and PostgreSQL
/// cannot update one row twice in one statement, so a decision that touches
/// a call twice, updates another task, or has any other command, is written
/// one command at a time instead ([`TaskWrites::of`] answers `None`).
#[derive(Default)]
pub(super) struct TaskWrites<'a> {
    schedule_ids: Vec<Uuid>,
    schedule_calls: Vec<&'a str>,
    schedule_kinds: Vec<&'static str>,
    schedule_specs: Vec<&'a Value>,
    schedule_keys: Vec<&'a str>,
    schedule_safety: Vec<Option<&'static str>>,
    schedule_paused: Vec<bool>,
    /// Each task's `requires`, as a JSON array (UNNEST cannot take an
    /// array of arrays of different lengths).
    schedule_requires: Vec<Value>,
    /// The update of the transition's own locked task (at most one: the
    /// calls are distinct), as `(task_id, write)`: by primary key, a scalar
    /// parameter.
    own: Option<(Uuid, OwnWrite)>,
    /// The scheduled task written leased to the reporting worker, if any
    /// ([`crate::hand_off`]).
    handed: Option<&'a Handed>,
    /// Without the run's lock: what must still hold for anything to be
    /// written (the optimistic transition, `optimistic.rs`).
    pub(super) guard: Option<Guard<'a>>,
}

/// What an optimistic transition decided on, checked by its one statement
/// under the rows' locks before it writes anything ([`TaskWrites::guard`]):
/// the run row's `last_seq`, the reported task still leased as handed
/// over (attempt, worker, dispatched, lease held by the database clock),
/// and the tenant's grants as the hand-off read them.
#[derive(Debug, Clone, Copy)]
pub(super) struct Guard<'a> {
    pub(super) last_seq: i64,
    pub(super) task_id: Uuid,
    pub(super) attempt: i32,
    pub(super) worker_id: &'a str,
    pub(super) dispatched: bool,
    pub(super) grants: &'a [String],
}

/// What the merged statement does to the transition's own task.
#[derive(Debug, Clone, Copy, PartialEq)]
enum OwnWrite {
    /// Back to `ready` after a backoff, ms.
    Retry(f64),
    /// Marked dispatched for this attempt.
    Dispatch(i32),
    /// Ended with this `tasks.status`.
    End(&'static str),
}

impl<'a> TaskWrites<'a> {
    /// The task writes of `commands`, or `None` when they cannot share one
    /// statement (another command, one call touched twice, or an update of
    /// a task other than `own`, the transition's locked task as `(call_id,
    /// task_id)`).
    pub(super) fn of(
        commands: &'a [Command],
        own: Option<(&str, Uuid)>,
        handed: Option<&'a Handed>,
    ) -> Option<TaskWrites<'a>> {
        let mut w = TaskWrites {
            handed,
            ..TaskWrites::default()
        };
        let own_id = |call_id: &str| own.filter(|(c, _)| *c == call_id).map(|(_, id)| id);
        let mut calls = std::collections::HashSet::new();
        for command in commands {
            let call = match command {
                Command::ScheduleTask {
                    call_id,
                    kind,
                    spec,
                    idempotency_key,
                    repeat_safety,
                    runs_while_paused,
                    requires,
                } => {
                    w.schedule_ids.push(scheduled_task_id(call_id, handed));
                    w.schedule_requires.push(Value::from(requires.clone()));
                    w.schedule_calls.push(call_id);
                    w.schedule_kinds.push(kind.as_str());
                    w.schedule_specs.push(spec);
                    w.schedule_keys.push(idempotency_key);
                    w.schedule_safety.push(repeat_safety.map(|r| r.as_str()));
                    w.schedule_paused.push(*runs_while_paused);
                    call_id
                }
                Command::RetryTask { call_id, delay_ms } => {
                    w.set_own(own_id(call_id)?, OwnWrite::Retry(*delay_ms as f64))?;
                    call_id
                }
                Command::MarkDispatched { call_id, attempt } => {
                    let attempt = i32::try_from(*attempt).ok()?;
                    w.set_own(own_id(call_id)?, OwnWrite::Dispatch(attempt))?;
                    call_id
                }
                Command::EndTask { call_id, end } => {
                    w.set_own(own_id(call_id)?, OwnWrite::End(task_end_status(end)))?;
                    call_id
                }
                // Served before the decision is written.
                Command::PassToolGates { .. } | Command::LookupToolCache { .. } => continue,
                _ => return None,
            };
            if !calls.insert(call.as_str()) {
                return None;
            }
        }
        Some(w)
    }

    /// Record the one update of the own task; `None` if there already is
    /// one (the same row cannot be updated twice in one statement).
    fn set_own(&mut self, task_id: Uuid, write: OwnWrite) -> Option<()> {
        match self.own {
            Some(_) => None,
            None => {
                self.own = Some((task_id, write));
                Some(())
            }
        }
    }
}

impl TaskWrites<'_> {
    /// The statement that appends the events (`$1` run, `$2..$4` seqs,
    /// kinds, payloads, `$9` tenant), updates the run row (`$5..$8`), with
    /// the clock `$10`, and writes the tasks: the CTEs of the non-empty
    /// kinds only, their parameters numbered on from `$11` in the order
    /// schedule (8, and 4 more with a handed task: its id, worker, lease
    /// ms, dispatched), then the own task's update (2: its id, and the
    /// retry's backoff ms, the dispatch's attempt or the end's status).
    /// Every time written is the clock CTE's: the events' `recorded_at`
    /// default, `belay_now()`, ran once per event row (an index scan of
    /// `belay_clock` each: 9.4 a loop step in belay-bench).
    ///
    /// With a [`Guard`], its parameters come last (6: the task's id, the
    /// run's `last_seq`, the attempt, worker, dispatched, the grants), its
    /// CTE locks the run and task rows, and every write is made only if it
    /// found them as guarded. The statement answers the run's parent, whether
    /// it wrote (always, without a guard), and its clock.
    pub(super) fn statement(&self) -> String {
        let g = self.guard_parameter();
        let (guard_cte, held) = match g {
            None => (String::new(), ""),
            Some(g) => (
                format!(
                    ",
             guard AS MATERIALIZED (
                 SELECT r.run_id FROM runs r JOIN tasks t ON t.task_id = ${g}::uuid AND t.run_id = r.run_id
                 WHERE r.run_id = $1 AND r.last_seq = ${}::int8 AND t.status = 'leased'
                   AND t.attempt = ${}::int4 AND t.worker_id = ${}::text AND t.dispatched = ${}::bool
                   AND {}
                   AND COALESCE((SELECT grants FROM tenants WHERE tenant = $9), '{{}}') = ${}::text[]
                 FOR UPDATE OF r, t)",
                    g + 1,
                    g + 2,
                    g + 3,
                    g + 4,
                    lease_holds!("(SELECT now FROM clock)"),
                    g + 5
                ),
                " AND EXISTS (SELECT 1 FROM guard)",
            ),
        };
        let mut sql = format!(
            "WITH clock AS MATERIALIZED (SELECT COALESCE($10::timestamptz, belay_now()) AS now){guard_cte},
             ins AS (
                 INSERT INTO events (run_id, seq, kind, payload, tenant, recorded_at)
                 SELECT $1, s, k, p, $9, clock.now
                 FROM UNNEST($2::int8[], $3::text[], $4::jsonb[]) AS e(s, k, p), clock
                 WHERE true{held}),
             upd AS (
                 UPDATE runs SET status = $5, status_reason = $6, output = $7, last_seq = $8,
                        updated_at = (SELECT now FROM clock)
                 WHERE run_id = $1{held} RETURNING parent_run_id)",
        );
        // The own task's update finds its row by primary key, a scalar
        // parameter. Finding it by call id let a generic plan read the run's
        // whole index range or every leased task (a join with UNNEST: ~3 500
        // entries a statement in belay-bench; `call_id = ANY(...)`: all the
        // run's tasks; `status = 'leased'`: a BitmapAnd with
        // `tasks_leased`), and `task_id = ANY($n)`, whose array the planner
        // takes for 10 elements, made the generic plan of a connection
        // prepared while `tasks` was small a sequential scan of the whole
        // table, kept as the table grew (517 pages a statement in
        // belay-bench, on a table not yet analysed).
        let mut n = 10;
        if !self.schedule_ids.is_empty() {
            // A handed task (`$h`: its id, worker, lease ms, dispatched) is
            // inserted leased, as a claim would leave it.
            let (leased_cols, leased_vals) = match self.handed {
                None => ("", String::new()),
                Some(_) => {
                    let (h, w, l, d) = (n + 9, n + 10, n + 11, n + 12);
                    (
                        ", attempt, worker_id, lease_expires_at, dispatched, dispatched_attempt, dispatched_at",
                        format!(
                            ", CASE WHEN id = ${h}::uuid THEN {HANDED_ATTEMPT} ELSE 0 END,
                        CASE WHEN id = ${h}::uuid THEN ${w}::text END,
                        CASE WHEN id = ${h}::uuid THEN clock.now + make_interval(secs => ${l}::float8 / 1000.0) END,
                        (id = ${h}::uuid AND ${d}::bool),
                        CASE WHEN id = ${h}::uuid AND ${d}::bool THEN {HANDED_ATTEMPT} END,
                        CASE WHEN id = ${h}::uuid AND ${d}::bool THEN clock.now END"
                        ),
                    )
                }
            };
            let status = match self.handed {
                None => "'ready'".to_owned(),
                Some(_) => format!(
                    "CASE WHEN id = ${}::uuid THEN 'leased' ELSE 'ready' END",
                    n + 9
                ),
            };
            sql += &format!(
                ", sched AS (
                 INSERT INTO tasks (task_id, run_id, tenant, call_id, kind, status, spec, idempotency_key,
                                    repeat_safety, runs_while_paused, requires, available_at, created_at, updated_at{leased_cols})
                 SELECT id, $1, $9, c, k, {status}, sp, ik, rs, rp, ARRAY(SELECT jsonb_array_elements_text(rq)),
                        clock.now, clock.now, clock.now{leased_vals}
                 FROM UNNEST(${}::uuid[], ${}::text[], ${}::text[], ${}::jsonb[], ${}::text[], ${}::text[],
                             ${}::bool[], ${}::jsonb[]) AS n(id, c, k, sp, ik, rs, rp, rq), clock
                 WHERE true{held})",
                n + 1,
                n + 2,
                n + 3,
                n + 4,
                n + 5,
                n + 6,
                n + 7,
                n + 8
            );
            n += if self.handed.is_some() { 12 } else { 8 };
        }
        if let Some((_, write)) = self.own {
            let (id, value) = (n + 1, n + 2);
            let (cte, set, filter) = match write {
                OwnWrite::Retry(_) => (
                    "retry",
                    format!(
                        "status = 'ready', lease_expires_at = NULL, worker_id = NULL, dispatched = false,
                        available_at = (SELECT now FROM clock) + make_interval(secs => ${value}::float8 / 1000.0)"
                    ),
                    String::new(),
                ),
                OwnWrite::Dispatch(_) => (
                    "disp",
                    "dispatched = true, dispatched_attempt = t.attempt,
                        dispatched_at = (SELECT now FROM clock)"
                        .to_owned(),
                    format!(" AND (t.status = 'leased') IS TRUE AND t.attempt = ${value}::int4"),
                ),
                OwnWrite::End(_) => (
                    "ends",
                    format!("status = ${value}::text, lease_expires_at = NULL"),
                    String::new(),
                ),
            };
            sql += &format!(
                ", {cte} AS (
                 UPDATE tasks t SET {set}, updated_at = (SELECT now FROM clock)
                 WHERE t.task_id = ${id}::uuid{filter}{held})"
            );
        }
        sql += &format!(
            " SELECT (SELECT parent_run_id FROM upd), {}, (SELECT now FROM clock)",
            if g.is_some() {
                "EXISTS (SELECT 1 FROM guard)"
            } else {
                "true"
            }
        );
        sql
    }

    /// The number of the guard's first parameter (after the schedule's and
    /// the own task's), if there is a guard.
    fn guard_parameter(&self) -> Option<usize> {
        self.guard?;
        let schedule = match (self.schedule_ids.is_empty(), self.handed) {
            (true, _) => 0,
            (false, None) => 8,
            (false, Some(_)) => 12,
        };
        Some(11 + schedule + if self.own.is_some() { 2 } else { 0 })
    }
}

/// What the merged statement answers: the run's parent, whether it wrote
/// (false only when its [`Guard`] did not hold), and its clock.
pub(super) type HotRow = (Option<Uuid>, bool, chrono::DateTime<chrono::Utc>);

/// A decision's events as the merged statement's arrays.
pub(super) struct EventArrays {
    seqs: Vec<i64>,
    kinds: Vec<&'static str>,
    payloads: Vec<Value>,
    /// The run's `last_seq` after them.
    new_seq: i64,
}

impl EventArrays {
    /// The events of `decision`, numbered on from `last_seq`.
    ///
    /// Errors: [`StoreError::Corrupt`] for an event that does not serialise.
    pub(super) fn of(decision: &Decision, last_seq: i64) -> Result<EventArrays, StoreError> {
        let mut payloads = Vec::with_capacity(decision.events.len());
        for event in &decision.events {
            payloads.push(
                serde_json::to_value(event)
                    .map_err(|e| StoreError::Corrupt(format!("event does not serialise: {e}")))?,
            );
        }
        Ok(EventArrays {
            seqs: (1..=decision.events.len() as i64)
                .map(|i| last_seq + i)
                .collect(),
            kinds: decision.events.iter().map(|e| e.kind()).collect(),
            payloads,
            new_seq: last_seq + decision.events.len() as i64,
        })
    }
}

/// The merged statement `sql` of `w` ([`TaskWrites::statement`]) with its
/// parameters bound: the events, the run row as `after` has it, the clock
/// `now` (`None`: the database's), the task writes, then the guard's.
pub(super) fn hot_query<'q>(
    sql: &'q str,
    w: &'q TaskWrites<'q>,
    run_id: Uuid,
    tenant: &'q str,
    events: &'q EventArrays,
    after: &'q RunState,
    now: Option<chrono::DateTime<chrono::Utc>>,
) -> sqlx::query::QueryAs<'q, Postgres, HotRow, sqlx::postgres::PgArguments> {
    let mut query = sqlx::query_as::<_, HotRow>(sqlx::AssertSqlSafe(sql))
        .bind(run_id)
        .bind(&events.seqs)
        .bind(&events.kinds)
        .bind(&events.payloads)
        .bind(after.status.as_str())
        .bind(&after.status_reason)
        .bind(after.output.as_ref())
        .bind(events.new_seq)
        .bind(tenant)
        .bind(now);
    if !w.schedule_ids.is_empty() {
        query = query
            .bind(&w.schedule_ids)
            .bind(&w.schedule_calls)
            .bind(&w.schedule_kinds)
            .bind(&w.schedule_specs)
            .bind(&w.schedule_keys)
            .bind(&w.schedule_safety)
            .bind(&w.schedule_paused)
            .bind(&w.schedule_requires);
        if let Some(h) = w.handed {
            query = query
                .bind(h.task_id)
                .bind(&h.worker_id)
                .bind(h.lease_ms as f64)
                .bind(h.dispatched);
        }
    }
    if let Some((task_id, write)) = w.own {
        query = query.bind(task_id);
        query = match write {
            OwnWrite::Retry(ms) => query.bind(ms),
            OwnWrite::Dispatch(attempt) => query.bind(attempt),
            OwnWrite::End(status) => query.bind(status),
        };
    }
    if let Some(g) = &w.guard {
        query = query
            .bind(g.task_id)
            .bind(g.last_seq)
            .bind(g.attempt)
            .bind(g.worker_id)
            .bind(g.dispatched)
            .bind(g.grants);
    }
    query
}

/// Inserts the task a [`Command::ScheduleTask`] asks for, ready, or
/// leased when it is the `handed` one (per-command path).
async fn schedule_task(
    tx: &mut Transaction<'static, Postgres>,
    run_id: Uuid,
    tenant: &str,
    command: &Command,
    handed: Option<&Handed>,
    now: Option<chrono::DateTime<chrono::Utc>>,
) -> Result<(), StoreError> {
    let Command::ScheduleTask {
        call_id,
        kind,
        spec,
        idempotency_key,
        repeat_safety,
        runs_while_paused,
        requires,
    } = command
    else {
        return Ok(());
    };
    sqlx::query(
        "INSERT INTO tasks (task_id, run_id, tenant, call_id, kind, status, spec, idempotency_key, repeat_safety,
                            runs_while_paused, requires)
         VALUES ($1, $2, $3, $4, $5, 'ready', $6, $7, $8, $9, $10)",
    )
    .bind(scheduled_task_id(call_id, handed))
    .bind(run_id)
    .bind(tenant)
    .bind(call_id)
    .bind(kind.as_str())
    .bind(spec)
    .bind(idempotency_key)
    .bind(repeat_safety.map(|r| r.as_str()))
    .bind(runs_while_paused)
    .bind(requires)
    .execute(&mut **tx)
    .await?;
    match handed.filter(|h| h.call_id == *call_id) {
        Some(h) => lease_handed(tx, h, now).await,
        None => Ok(()),
    }
}

/// Leases the task `handed` names (inserted ready by the per-command path)
/// to its worker, as a claim would, from the transition's clock `now`.
async fn lease_handed(
    tx: &mut Transaction<'static, Postgres>,
    handed: &Handed,
    now: Option<chrono::DateTime<chrono::Utc>>,
) -> Result<(), StoreError> {
    sqlx::query(
        "WITH clock AS MATERIALIZED (SELECT COALESCE($5::timestamptz, belay_now()) AS now)
         UPDATE tasks t SET status = 'leased', attempt = $2, worker_id = $3,
                lease_expires_at = clock.now + make_interval(secs => $4::float8 / 1000.0),
                dispatched = $6, dispatched_attempt = CASE WHEN $6 THEN $2 END,
                dispatched_at = CASE WHEN $6 THEN clock.now END, updated_at = clock.now
         FROM clock WHERE t.task_id = $1",
    )
    .bind(handed.task_id)
    .bind(HANDED_ATTEMPT)
    .bind(&handed.worker_id)
    .bind(handed.lease_ms as f64)
    .bind(now)
    .bind(handed.dispatched)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The `tasks.status` a task ends with.
fn task_end_status(end: &TaskEnd) -> &'static str {
    match end {
        TaskEnd::Completed => "completed",
        TaskEnd::Failed => "failed",
        TaskEnd::Uncertain => "uncertain",
        TaskEnd::Cancelled => "cancelled",
    }
}

/// Append the decision's events after `last_seq`, perform its commands, and
/// update the run row from the state `after` the events. Returns what to
/// wake once the transaction has committed ([`wakes`](super::wakes)), and what
/// a [`Command::RestoreSecrets`] read from the run's vault.
/// `now` is the engine's clock read by the transition's lock statement
/// (`belay_now()` once, instead of in every statement), `None` for a new run;
/// `own` the transition's locked task (`(call_id, task_id)`), if any.
#[allow(clippy::too_many_arguments)]
pub(super) async fn write_decision(
    tx: &mut Transaction<'static, Postgres>,
    run_id: Uuid,
    tenant: &str,
    last_seq: i64,
    decision: &Decision,
    after: &RunState,
    now: Option<chrono::DateTime<chrono::Utc>>,
    own: Option<(&str, Uuid)>,
    handed: Option<&Handed>,
) -> Result<Wakes, StoreError> {
    let mut wakes = Wakes::of(decision, handed.map(|h| h.call_id.as_str()));
    let mut parent_run_id: Option<Uuid> = None;
    // Whether the task writes went with the events ([`TaskWrites`]).
    let mut commands_written = false;
    if !decision.events.is_empty() {
        let events = EventArrays::of(decision, last_seq)?;
        // One round trip: the events and the run row (a projection of them),
        // and on the hot path the task writes too.
        // Any other decision writes its commands one at a time below, with
        // no task writes here.
        let hot = TaskWrites::of(&decision.commands, own, handed);
        commands_written = hot.is_some();
        let w = hot.unwrap_or_default();
        // Only the CTEs this decision needs are in the statement (at most 16
        // texts, each prepared once per connection): an empty CTE still
        // costs its plan's start-up on every execution.
        let sql = w.statement();
        let (parent, _, _) = hot_query(&sql, &w, run_id, tenant, &events, after, now)
            .fetch_one(&mut **tx)
            .await?;
        parent_run_id = parent;
    }
    let commands = if commands_written {
        &[][..]
    } else {
        &decision.commands[..]
    };
    for command in commands {
        match command {
            Command::ScheduleTask { .. } => {
                schedule_task(tx, run_id, tenant, command, handed, now).await?;
            }
            Command::RetryTask { call_id, delay_ms } => {
                sqlx::query(
                    "UPDATE tasks SET status = 'ready', lease_expires_at = NULL, worker_id = NULL, dispatched = false,
                            available_at = belay_now() + make_interval(secs => $3::float8 / 1000.0), updated_at = belay_now()
                     WHERE run_id = $1 AND call_id = $2",
                )
                .bind(run_id)
                .bind(call_id)
                .bind(*delay_ms as f64)
                .execute(&mut **tx)
                .await?;
            }
            Command::MarkDispatched { call_id, attempt } => {
                sqlx::query(
                    "UPDATE tasks SET dispatched = true, dispatched_attempt = $3, dispatched_at = belay_now(), updated_at = belay_now()
                     WHERE run_id = $1 AND call_id = $2 AND attempt = $3 AND status = 'leased'",
                )
                .bind(run_id)
                .bind(call_id)
                .bind(*attempt as i32)
                .execute(&mut **tx)
                .await?;
            }
            Command::EndTask { call_id, end } => {
                let status = task_end_status(end);
                sqlx::query(
                    "UPDATE tasks SET status = $3, lease_expires_at = NULL, updated_at = belay_now()
                     WHERE run_id = $1 AND call_id = $2",
                )
                .bind(run_id)
                .bind(call_id)
                .bind(status)
                .execute(&mut **tx)
                .await?;
            }
            Command::RecordUncertainOutcome {
                call_id,
                node,
                tool,
                tool_version,
                arguments,
                idempotency_key,
                attempt: _,
                reason,
            } => {
                sqlx::query(
                    "INSERT INTO uncertain_outcomes (uncertain_id, tenant, run_id, task_id, call_id, node_id, tool,
                         tool_version, arguments, idempotency_key, attempts, worker_id, reason, occurrence)
                     SELECT $1, $2, $3, t.task_id, $4, $5, $6, $7, $8, $9,
                            -- Every attempt's dispatch and failure, from the events
                            -- (this transition's events are already inserted).
                            (SELECT COALESCE(jsonb_agg(jsonb_build_object(
                                        'seq', e.seq, 'event', e.kind, 'attempt', e.payload->'attempt',
                                        'worker_id', e.payload->'worker_id', 'error', e.payload->'error',
                                        'class', e.payload->'class', 'at', e.recorded_at) ORDER BY e.seq), '[]'::jsonb)
                             FROM events e
                             WHERE e.run_id = $3 AND e.payload->>'call_id' = $4
                               AND e.kind IN ('tool_call_dispatched', 'tool_call_attempt_failed', 'task_lease_expired')),
                            t.worker_id, $10,
                            -- A call can be uncertain again after a retry: one record each time.
                            (SELECT COALESCE(MAX(occurrence), 0) + 1 FROM uncertain_outcomes u
                             WHERE u.run_id = $3 AND u.call_id = $4)
                     FROM tasks t WHERE t.run_id = $3 AND t.call_id = $4",
                )
                .bind(Uuid::now_v7())
                .bind(tenant)
                .bind(run_id)
                .bind(call_id)
                .bind(node)
                .bind(tool)
                .bind(*tool_version as i32)
                .bind(arguments)
                .bind(idempotency_key)
                .bind(reason)
                .execute(&mut **tx)
                .await?;
            }
            Command::RekeyTask {
                call_id,
                idempotency_key,
                spec,
            } => {
                sqlx::query(
                    "UPDATE tasks SET idempotency_key = $3, spec = $4, updated_at = belay_now()
                     WHERE run_id = $1 AND call_id = $2",
                )
                .bind(run_id)
                .bind(call_id)
                .bind(idempotency_key)
                .bind(spec)
                .execute(&mut **tx)
                .await?;
            }
            Command::MarkUncertainResolved {
                call_id,
                resolution,
                kind,
                resolved_by,
                reason,
                via,
            } => {
                sqlx::query(
                    "UPDATE uncertain_outcomes SET status = 'resolved', resolution = $3, resolution_kind = $4,
                            resolved_by = $5, resolution_reason = $6, resolved_via = $7, resolved_at = belay_now()
                     WHERE uncertain_id = (SELECT uncertain_id FROM uncertain_outcomes
                                           WHERE run_id = $1 AND call_id = $2 AND status = 'open'
                                           ORDER BY occurrence DESC LIMIT 1)",
                )
                .bind(run_id)
                .bind(call_id)
                .bind(resolution)
                .bind(kind.as_str())
                .bind(resolved_by)
                .bind(reason)
                .bind(via.as_str())
                .execute(&mut **tx)
                .await?;
            }
            Command::FlagDiscrepancy {
                call_id,
                discrepancy,
            } => {
                sqlx::query(
                    "UPDATE uncertain_outcomes SET discrepancy = COALESCE(discrepancy, '[]'::jsonb) || jsonb_build_array($3::jsonb)
                     WHERE uncertain_id = (SELECT uncertain_id FROM uncertain_outcomes
                                           WHERE run_id = $1 AND call_id = $2
                                           ORDER BY occurrence DESC LIMIT 1)",
                )
                .bind(run_id)
                .bind(call_id)
                .bind(discrepancy)
                .execute(&mut **tx)
                .await?;
            }
            Command::RecordProbe { call_id, probe } => {
                sqlx::query(
                    "UPDATE uncertain_outcomes SET probe = $3::jsonb || jsonb_build_object('at', belay_now())
                     WHERE uncertain_id = (SELECT uncertain_id FROM uncertain_outcomes
                                           WHERE run_id = $1 AND call_id = $2
                                           ORDER BY occurrence DESC LIMIT 1)",
                )
                .bind(run_id)
                .bind(call_id)
                .bind(probe)
                .execute(&mut **tx)
                .await?;
            }
            Command::NotifyOperator { kind, payload } => {
                sqlx::query(
                    "INSERT INTO notifications (notification_id, tenant, run_id, kind, payload)
                     VALUES ($1, $2, $3, $4, $5::jsonb || jsonb_build_object('uncertain_id',
                         (SELECT uncertain_id FROM uncertain_outcomes u
                          WHERE u.run_id = $3 AND u.call_id = $5::jsonb->>'call_id'
                          ORDER BY occurrence DESC LIMIT 1)))",
                )
                .bind(Uuid::now_v7())
                .bind(tenant)
                .bind(run_id)
                .bind(kind)
                .bind(payload)
                .execute(&mut **tx)
                .await?;
            }
            Command::ScheduleTimer(timer) => {
                sqlx::query(
                    "INSERT INTO timers (run_id, timer_id, fire_at)
                     VALUES ($1, $2, COALESCE($3::timestamptz, belay_now() + $4::float8 * interval '1 millisecond'))
                     ON CONFLICT (run_id, timer_id) DO UPDATE SET fire_at = EXCLUDED.fire_at",
                )
                .bind(run_id)
                .bind(&timer.timer_id)
                .bind(timer.at.as_deref().and_then(parse_time))
                .bind(timer.after_ms.unwrap_or(0) as f64)
                .execute(&mut **tx)
                .await?;
            }
            Command::RegisterCallback {
                call_id,
                token_sha256,
            } => {
                sqlx::query(
                    "INSERT INTO callbacks (token_sha256, run_id, call_id) VALUES ($1, $2, $3)
                     ON CONFLICT (token_sha256) DO NOTHING",
                )
                .bind(token_sha256)
                .bind(run_id)
                .bind(call_id)
                .execute(&mut **tx)
                .await?;
            }
            Command::CancelTimer { timer_id } => {
                sqlx::query("DELETE FROM timers WHERE run_id = $1 AND timer_id = $2")
                    .bind(run_id)
                    .bind(timer_id)
                    .execute(&mut **tx)
                    .await?;
            }
            Command::StartChildRun {
                call_id,
                child_run_id,
                workflow,
                input,
                sync,
            } => {
                let payload = serde_json::json!({
                    "tenant": tenant, "call_id": call_id, "child_run_id": child_run_id,
                    "workflow": workflow, "input": input, "sync": sync,
                });
                insert_outbox(tx, run_id, "start_child", &payload).await?;
            }
            Command::CancelChildRun {
                child_run_id,
                reason,
            } => {
                let payload = serde_json::json!({
                    "tenant": tenant, "child_run_id": child_run_id, "reason": reason,
                });
                insert_outbox(tx, run_id, "cancel_child", &payload).await?;
            }
            Command::CancelOpenTasks => {
                sqlx::query(
                    "UPDATE tasks SET status = 'cancelled', lease_expires_at = NULL, updated_at = belay_now()
                     WHERE run_id = $1 AND status IN ('ready', 'leased')",
                )
                .bind(run_id)
                .execute(&mut **tx)
                .await?;
            }
            // Passed before this decision was written (`transition_at`);
            // lookups were made by `serve_from_cache`.
            Command::PassToolGates { .. } | Command::LookupToolCache { .. } => {}
            Command::StoreToolCache {
                key,
                tool,
                call_id,
                result,
                ttl_ms,
            } => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "INSERT INTO tool_cache ({TOOL_CACHE_COLUMNS})
                     VALUES ($1, $2, $3, $4, $5, $6, belay_now(),
                             belay_now() + make_interval(secs => $7::float8 / 1000.0))
                     ON CONFLICT (tenant, cache_key) DO UPDATE SET
                         tool = excluded.tool, result = excluded.result, run_id = excluded.run_id,
                         call_id = excluded.call_id, stored_at = excluded.stored_at,
                         expires_at = excluded.expires_at"
                )))
                .bind(tenant)
                .bind(key)
                .bind(tool)
                .bind(result)
                .bind(run_id)
                .bind(call_id)
                .bind(*ttl_ms as f64)
                .execute(&mut **tx)
                .await?;
            }
            Command::RecordToolOutcome {
                tool,
                circuit_breaker,
                failed,
            } => record_tool_outcome(tx, tenant, tool, circuit_breaker, *failed).await?,
            Command::VaultSecrets {
                call_id, entries, ..
            } => {
                for entry in entries {
                    sqlx::query(
                        "INSERT INTO run_secrets (run_id, key, producer_call, nonce, ciphertext, expires_at, single_use, consumers)
                         VALUES ($1, $2, $3, $4, $5,
                                 CASE WHEN $6::int8 IS NULL THEN NULL ELSE belay_now() + make_interval(secs => $6::float8) END,
                                 $7, $8)
                         ON CONFLICT (run_id, key) DO UPDATE SET producer_call = excluded.producer_call,
                             nonce = excluded.nonce, ciphertext = excluded.ciphertext,
                             expires_at = excluded.expires_at, single_use = excluded.single_use,
                             consumers = excluded.consumers, consumed_by_call = NULL,
                             created_at = belay_now()",
                    )
                    .bind(run_id)
                    .bind(&entry.sealed.key)
                    .bind(call_id)
                    .bind(&entry.sealed.nonce)
                    .bind(&entry.sealed.ciphertext)
                    .bind(entry.ttl_s.map(|t| i64::try_from(t).unwrap_or(i64::MAX)))
                    .bind(entry.single_use)
                    .bind(&entry.consumers)
                    .execute(&mut **tx)
                    .await?;
                }
            }
            Command::RestoreSecrets {
                call_id,
                tool,
                keys,
            } => {
                // Row locks come with the UPDATE; the run row's lock already
                // serialises the run's transitions.
                let rows: Vec<(String, Vec<u8>, Vec<u8>)> = sqlx::query_as(
                    "UPDATE run_secrets
                     SET consumed_by_call = CASE WHEN single_use THEN $4 ELSE consumed_by_call END
                     WHERE run_id = $1 AND key = ANY($2)
                       AND (expires_at IS NULL OR expires_at > belay_now())
                       AND (cardinality(consumers) = 0 OR $3 = ANY(consumers))
                       AND (consumed_by_call IS NULL OR consumed_by_call = $4)
                     RETURNING key, nonce, ciphertext",
                )
                .bind(run_id)
                .bind(keys)
                .bind(tool)
                .bind(call_id)
                .fetch_all(&mut **tx)
                .await?;
                wakes
                    .secrets
                    .extend(
                        rows.into_iter()
                            .map(|(key, nonce, ciphertext)| SealedSecret {
                                key,
                                nonce,
                                ciphertext,
                            }),
                    );
            }
            Command::DropRunSecrets => {
                sqlx::query("DELETE FROM run_secrets WHERE run_id = $1")
                    .bind(run_id)
                    .execute(&mut **tx)
                    .await?;
            }
        }
    }
    // A run that ended has nothing left to wake it; a child run that ends
    // tells its parent (through the outbox).
    if crate::transition::ends_run(decision) {
        sqlx::query("DELETE FROM timers WHERE run_id = $1")
            .bind(run_id)
            .execute(&mut **tx)
            .await?;
        if let Some(parent) = parent_run_id {
            let payload = crate::transition::child_finished_payload(tenant, parent, run_id, after);
            insert_outbox(tx, run_id, "child_finished", &payload).await?;
            wakes.outbox = true;
        }
    }
    Ok(wakes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use belay_machine::TaskKind;

    fn schedule(call: &str) -> Command {
        Command::ScheduleTask {
            call_id: call.to_owned(),
            kind: TaskKind::ToolCall,
            spec: serde_json::json!({}),
            idempotency_key: format!("key-{call}"),
            repeat_safety: None,
            runs_while_paused: false,
            requires: Vec::new(),
        }
    }

    /// A step's usual decision: end the own call `a.t1`, schedule `a.m2`.
    fn end_then_schedule() -> Vec<Command> {
        vec![
            Command::EndTask {
                call_id: "a.t1".to_owned(),
                end: TaskEnd::Completed,
            },
            schedule("a.m2"),
        ]
    }

    #[test]
    fn a_handed_task_is_inserted_leased_with_its_parameters_before_the_own_tasks() {
        let commands = end_then_schedule();
        let own = Some(("a.t1", Uuid::nil()));
        let handed = Handed {
            task_id: Uuid::from_u128(7),
            call_id: "a.m2".to_owned(),
            worker_id: "w1".to_owned(),
            lease_ms: 30_000,
            dispatched: false,
        };
        let w = TaskWrites::of(&commands, own, Some(&handed)).expect("hot path");
        assert_eq!(w.schedule_ids, [handed.task_id], "the handed task's id");
        let sql = w.statement();
        assert!(
            sql.contains("CASE WHEN id = $19::uuid THEN 'leased' ELSE 'ready' END")
                && sql.contains("$20::text")
                && sql.contains("$21::float8")
                && sql.contains("$22::bool"),
            "{sql}"
        );
        assert!(
            sql.contains("t.task_id = $23::uuid") && sql.contains("status = $24::text"),
            "{sql}"
        );
        assert!(!sql.contains("$25"), "{sql}");
        // Another call's task keeps a fresh id.
        let other = Handed {
            call_id: "a.m9".to_owned(),
            ..handed
        };
        let w = TaskWrites::of(&commands, own, Some(&other)).expect("hot path");
        assert_ne!(w.schedule_ids, [other.task_id]);
    }

    #[test]
    fn the_hot_path_takes_only_task_writes_on_different_calls() {
        // End one call, schedule the next: one statement.
        let commands = end_then_schedule();
        let own = Some(("a.t1", Uuid::nil()));
        let w = TaskWrites::of(&commands, own, None).expect("hot path");
        assert_eq!(w.own, Some((Uuid::nil(), OwnWrite::End("completed"))));
        assert_eq!(w.schedule_calls, ["a.m2"]);
        assert_eq!(w.schedule_kinds, ["tool_call"]);
        // A call touched twice: one statement could not update its row twice.
        let twice = vec![
            Command::RetryTask {
                call_id: "a.t1".to_owned(),
                delay_ms: 10,
            },
            Command::EndTask {
                call_id: "a.t1".to_owned(),
                end: TaskEnd::Failed,
            },
        ];
        assert!(TaskWrites::of(&twice, own, None).is_none());
        // Any other command: written one at a time.
        let other = vec![schedule("a.m2"), Command::CancelOpenTasks];
        assert!(TaskWrites::of(&other, own, None).is_none());
        // Ending a task other than the transition's own (or with none
        // locked): written one at a time, by its call id.
        assert!(TaskWrites::of(&commands, Some(("a.t9", Uuid::nil())), None).is_none());
        assert!(TaskWrites::of(&commands, None, None).is_none());
        // No command at all: nothing for the tasks table.
        assert!(TaskWrites::of(&[], None, None).is_some_and(|w| w.schedule_ids.is_empty()));
    }

    #[test]
    fn the_statement_holds_only_the_needed_ctes_numbered_on_from_11() {
        let commands = end_then_schedule();
        let own = Some(("a.t1", Uuid::nil()));
        let sql = TaskWrites::of(&commands, own, None)
            .expect("hot path")
            .statement();
        assert!(
            sql.contains("sched AS") && sql.contains("$11::uuid[]") && sql.contains("$18::jsonb[]")
        );
        assert!(
            sql.contains("ends AS")
                && sql.contains("t.task_id = $19::uuid")
                && sql.contains("status = $20::text")
        );
        assert!(!sql.contains("retry AS") && !sql.contains("disp AS") && !sql.contains("$21"));
        // The own task is found by a scalar key, never `= ANY(array)` (a
        // generic plan took a sequential scan for it).
        assert!(!sql.contains("ANY("), "{sql}");
        let dispatch = vec![Command::MarkDispatched {
            call_id: "a.t1".to_owned(),
            attempt: 2,
        }];
        let sql = TaskWrites::of(&dispatch, own, None)
            .expect("hot path")
            .statement();
        assert!(
            sql.contains("disp AS")
                && sql.contains("t.task_id = $11::uuid")
                && sql.contains("t.attempt = $12::int4")
        );
        assert!(!sql.contains("sched AS") && !sql.contains("$13"));
        let retry = vec![Command::RetryTask {
            call_id: "a.t1".to_owned(),
            delay_ms: 250,
        }];
        let w = TaskWrites::of(&retry, own, None).expect("hot path");
        assert_eq!(w.own, Some((Uuid::nil(), OwnWrite::Retry(250.0))));
        let sql = w.statement();
        assert!(
            sql.contains("retry AS") && sql.contains("$12::float8 / 1000.0"),
            "{sql}"
        );
        let none = TaskWrites::default().statement();
        assert!(!none.contains("tasks"), "{none}");
    }

    /// A guarded statement numbers the guard's six parameters after the
    /// task writes' and holds every write to the guard's rows.
    #[test]
    fn a_guarded_statement_writes_only_what_its_guard_found() {
        let commands = end_then_schedule();
        let own = Some(("a.t1", Uuid::nil()));
        let grants = vec!["g".to_owned()];
        let mut w = TaskWrites::of(&commands, own, None).expect("hot path");
        w.guard = Some(Guard {
            last_seq: 4,
            task_id: Uuid::nil(),
            attempt: 1,
            worker_id: "w",
            dispatched: true,
            grants: &grants,
        });
        let sql = w.statement();
        for p in [
            "$21::uuid",
            "$22::int8",
            "$23::int4",
            "$24::text",
            "$25::bool",
            "$26::text[]",
        ] {
            assert!(sql.contains(p), "{p}: {sql}");
        }
        assert!(!sql.contains("$27"), "{sql}");
        assert!(sql.contains("FOR UPDATE OF r, t"), "{sql}");
        // events, the run row, the scheduled task and the own task's end.
        assert_eq!(
            sql.matches("AND EXISTS (SELECT 1 FROM guard)").count(),
            4,
            "{sql}"
        );
        assert!(
            sql.ends_with("EXISTS (SELECT 1 FROM guard), (SELECT now FROM clock)"),
            "{sql}"
        );
        let unguarded = TaskWrites::of(&commands, own, None)
            .expect("hot path")
            .statement();
        assert!(!unguarded.contains("guard"), "{unguarded}");
    }
}
