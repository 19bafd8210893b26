//! Handing a worker the next task of the run whose step it just reported,
//! in the report's own transition (issue 23: one transaction and one round
//! trip per step).
//!
//! A worker's report may ask for the next task with it (`claim_next`). When
//! the report's decision schedules a task that worker may take, the store
//! writes that task already leased to it (attempt 1, the lease from the
//! transition's clock) instead of leaving it for a claim: no claim
//! statement, no wake-up, and the run's next step starts from the reply.
//! A tool call whose dispatch record changes no decision
//! (`ToolCallSpec::dispatch_with_claim`) is dispatched too, by the machine
//! ([`Input::DispatchToolCall`], with the tenant's grants as the lock
//! statement read them), and its `ToolCallDispatched` goes into the same
//! transaction. Anything else (a dispatch the machine refuses, a decision
//! with other commands for the call) hands nothing: the task stays ready
//! and is claimed as any other.

use belay_machine::{Command, Decision, Event, Input, RunState, RunStatus, TaskKind};
use uuid::Uuid;

use crate::pools::ClaimFilter;
use crate::rows::{ClaimedTask, TaskRow};

/// What a worker's report asks of its transition: the next task for
/// `worker_id`, leased for `lease_ms` (> 0) by the database clock, among
/// the tasks `filter` lets it claim.
#[derive(Debug, Clone, Copy)]
pub struct HandOff<'a> {
    /// The worker the task is leased to.
    pub worker_id: &'a str,
    /// The lease's length, ms.
    pub lease_ms: i64,
    /// The tenants and capability tags the worker claims with.
    pub filter: ClaimFilter<'a>,
    /// Whether a tool call whose spec allows it may be dispatched with the
    /// lease (the engine's `--dispatch-with-claim`); without, only model
    /// calls are handed.
    pub dispatch_tool_calls: bool,
}

/// The task a transition hands over: written leased by the backend's
/// [`write_decision`](crate) in place of a ready one.
#[derive(Debug, Clone)]
pub(crate) struct Handed {
    /// Its new task id.
    pub(crate) task_id: Uuid,
    /// The call it performs.
    pub(crate) call_id: String,
    /// The worker it is leased to.
    pub(crate) worker_id: String,
    /// The lease, ms.
    pub(crate) lease_ms: i64,
    /// Whether its dispatch is recorded with it.
    pub(crate) dispatched: bool,
}

/// What an engine knows of a task it handed over, as its transition
/// committed: enough to decide the worker's report of it on the cached
/// state without reading the run and task rows first, the decision then
/// written only if they are still as recorded here (the optimistic
/// transition, `postgres/optimistic.rs`).
#[derive(Debug, Clone)]
pub(crate) struct HandedLease {
    /// The task row as the transition wrote it (leased, attempt 1).
    pub(crate) task: TaskRow,
    /// The run's tenant.
    pub(crate) tenant: String,
    /// The run's `last_seq` once the transition committed.
    pub(crate) last_seq: u64,
    /// The tenant's grants as the transition read them.
    pub(crate) grants: Vec<String>,
    /// The database clock of the transition, and this engine's monotonic
    /// clock when that was read: the report's time is estimated from them
    /// (a change of the test clock `belay_clock` in between is missed; only
    /// the step-duration metric reads the estimate, [`HandedLease::now`]).
    pub(crate) at: (chrono::DateTime<chrono::Utc>, std::time::Instant),
}

impl HandedLease {
    /// The lease `handed` (of `kind`) is, as a transition of `run_id`
    /// (`tenant`, `grants`) left it with `last_seq`; `at`: the
    /// transition's database clock and this engine's clock when it was read.
    pub(crate) fn of(
        handed: &Handed,
        kind: &str,
        run: (Uuid, &str, u64),
        grants: &[String],
        at: (chrono::DateTime<chrono::Utc>, std::time::Instant),
    ) -> HandedLease {
        let now = at.0;
        let (run_id, tenant, last_seq) = run;
        HandedLease {
            task: TaskRow {
                task_id: handed.task_id,
                run_id,
                call_id: handed.call_id.clone(),
                kind: kind.to_owned(),
                status: "leased".to_owned(),
                attempt: HANDED_ATTEMPT,
                worker_id: Some(handed.worker_id.clone()),
                dispatched: handed.dispatched,
                dispatched_at: handed.dispatched.then_some(now),
                lease_expired: false,
                available_at: Some(now),
                tenant_grants: Vec::new(),
            },
            tenant: tenant.to_owned(),
            last_seq,
            grants: grants.to_vec(),
            at,
        }
    }

    /// The report's time by the database clock, estimated: the
    /// transition's time and what this engine's clock counted since.
    pub(crate) fn now(&self) -> chrono::DateTime<chrono::Utc> {
        let elapsed = chrono::Duration::from_std(self.at.1.elapsed()).unwrap_or_default();
        self.at.0 + elapsed
    }

    /// Whether `row`, read under lock, is the task as recorded here (its
    /// grants aside: only a dispatch reads them).
    pub(crate) fn matches(&self, row: &TaskRow) -> bool {
        let t = &self.task;
        (
            t.task_id, t.run_id, &t.call_id, &t.kind, &t.status, t.attempt,
        ) == (
            row.task_id,
            row.run_id,
            &row.call_id,
            &row.kind,
            &row.status,
            row.attempt,
        ) && (&t.worker_id, t.dispatched, t.lease_expired)
            == (&row.worker_id, row.dispatched, row.lease_expired)
    }
}

/// The attempt a handed task holds (its first claim).
pub(crate) const HANDED_ATTEMPT: i32 = 1;

/// The spec field that lets a tool call be dispatched with its claim
/// (`belay_proto::wire::ToolCallSpec::dispatch_with_claim`).
const DISPATCH_WITH_CLAIM: &str = "dispatch_with_claim";

/// Picks the first task `decision` schedules that `hand` may take, and for
/// a tool call appends its dispatch to `decision` (and folds it into
/// `after`, the state after the decision's events). Returns what to write
/// leased, or `None` (the decision is left as it was). `tenant_grants`:
/// the tenant's grants now, as the transition's lock statement read them.
pub(crate) fn hand_off(
    hand: &HandOff<'_>,
    tenant: &str,
    tenant_grants: &[String],
    decision: &mut Decision,
    after: &mut RunState,
) -> Option<Handed> {
    if hand.lease_ms <= 0 || !admits_tasks(after.status) || !admitted(hand.filter.tenants, tenant) {
        return None;
    }
    let (call_id, kind) = decision.commands.iter().find_map(|c| match c {
        Command::ScheduleTask {
            call_id,
            kind,
            spec,
            runs_while_paused: false,
            requires,
            ..
        } if covered(hand.filter.capabilities, requires) && takes(hand, *kind, spec) => {
            Some((call_id.clone(), *kind))
        }
        _ => None,
    })?;
    if touched_again(&decision.commands, &call_id) {
        return None;
    }
    let dispatched = kind == TaskKind::ToolCall;
    if dispatched {
        let dispatch = dispatch(hand, &call_id, tenant_grants, after)?;
        crate::transition::apply_events(after, &dispatch.events);
        decision.events.extend(dispatch.events);
    }
    Some(Handed {
        task_id: Uuid::now_v7(),
        call_id,
        worker_id: hand.worker_id.to_owned(),
        lease_ms: hand.lease_ms,
        dispatched,
    })
}

/// The id of the task scheduled for `call_id`: the handed task's, if it
/// is that call, else a new one (UUIDv7).
pub(crate) fn scheduled_task_id(call_id: &str, handed: Option<&Handed>) -> Uuid {
    match handed {
        Some(h) if h.call_id == call_id => h.task_id,
        _ => Uuid::now_v7(),
    }
}

/// The task message of what a transition handed over: `spec` and `key` as
/// its schedule command wrote them, waited 0 ms.
pub(crate) fn claimed(
    handed: &Handed,
    decision: &Decision,
    run_id: Uuid,
    tenant: &str,
) -> Option<ClaimedTask> {
    decision.commands.iter().find_map(|c| match c {
        Command::ScheduleTask {
            call_id,
            kind,
            spec,
            idempotency_key,
            ..
        } if *call_id == handed.call_id => Some(ClaimedTask {
            task_id: handed.task_id,
            run_id,
            tenant: tenant.to_owned(),
            kind: kind.as_str().to_owned(),
            attempt: HANDED_ATTEMPT,
            spec: spec.clone(),
            idempotency_key: idempotency_key.clone(),
            waited_ms: 0.0,
            dispatched: handed.dispatched,
        }),
        _ => None,
    })
}

/// The machine's dispatch of attempt 1 of `call_id` for `hand`'s worker:
/// only a plain `ToolCallDispatched` with its `MarkDispatched` (which the
/// leased insert carries) qualifies.
fn dispatch(
    hand: &HandOff<'_>,
    call_id: &str,
    tenant_grants: &[String],
    after: &RunState,
) -> Option<Decision> {
    let decided = belay_machine::decide(
        after,
        Input::DispatchToolCall {
            call_id: call_id.to_owned(),
            attempt: HANDED_ATTEMPT as u32,
            worker_id: hand.worker_id.to_owned(),
            callback_token_sha256: None,
            tenant_grants: Some(tenant_grants.to_vec()),
        },
    );
    let decision = match decided {
        Ok(d) => d,
        Err(e) => {
            tracing::debug!(call_id, error = %e, "not handed over with the report: the worker's claim dispatches it");
            return None;
        }
    };
    let plain = matches!(
        decision.events.as_slice(),
        [Event::ToolCallDispatched { .. }]
    ) && matches!(
        decision.commands.as_slice(),
        [Command::MarkDispatched { .. }]
    );
    plain.then_some(decision)
}

/// Whether the machine's `after` state lets a task of the run be claimed
/// (as the claim statement's `run_admits_task!`, for a task that does not
/// run while paused).
fn admits_tasks(status: RunStatus) -> bool {
    matches!(status, RunStatus::Running | RunStatus::Waiting)
}

/// Whether `tenant` is among `tenants` (`None`: any).
fn admitted(tenants: Option<&[String]>, tenant: &str) -> bool {
    tenants.is_none_or(|t| t.iter().any(|x| x == tenant))
}

/// Whether `capabilities` cover every tag `requires` (`None`: any task).
fn covered(capabilities: Option<&[String]>, requires: &[String]) -> bool {
    capabilities.is_none_or(|c| requires.iter().all(|r| c.contains(r)))
}

/// Whether `hand` takes a task of `kind` with `spec`: a model call, or a
/// tool call dispatched with its claim.
fn takes(hand: &HandOff<'_>, kind: TaskKind, spec: &serde_json::Value) -> bool {
    match kind {
        TaskKind::ModelCall => true,
        TaskKind::ToolCall => {
            hand.dispatch_tool_calls
                && spec.get(DISPATCH_WITH_CLAIM) == Some(&serde_json::Value::Bool(true))
        }
    }
}

/// Whether any command but its schedule touches `call_id` (it would then
/// write the row the leased insert writes).
fn touched_again(commands: &[Command], call_id: &str) -> bool {
    commands
        .iter()
        .filter(|c| command_call(c) == Some(call_id))
        .count()
        > 1
}

/// The call a task command acts on.
fn command_call(command: &Command) -> Option<&str> {
    match command {
        Command::ScheduleTask { call_id, .. }
        | Command::RetryTask { call_id, .. }
        | Command::MarkDispatched { call_id, .. }
        | Command::EndTask { call_id, .. }
        | Command::RekeyTask { call_id, .. } => Some(call_id),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_cover_requirements_and_tenants_admit() {
        let caps = vec!["gpu".to_owned(), "eu".to_owned()];
        assert!(covered(None, &["x".to_owned()]));
        assert!(covered(Some(&caps), &["eu".to_owned()]));
        assert!(!covered(Some(&caps), &["us".to_owned()]));
        assert!(covered(Some(&[]), &[]));
        let tenants = vec!["acme".to_owned()];
        assert!(admitted(None, "x"));
        assert!(admitted(Some(&tenants), "acme"));
        assert!(!admitted(Some(&tenants), "other"));
        assert!(!admitted(Some(&[]), "acme"));
    }

    #[test]
    fn a_tool_call_is_taken_only_when_its_spec_and_the_engine_allow_it() {
        let mut hand = HandOff {
            worker_id: "w",
            lease_ms: 1000,
            filter: ClaimFilter::default(),
            dispatch_tool_calls: true,
        };
        let yes = serde_json::json!({"dispatch_with_claim": true});
        let no = serde_json::json!({"dispatch_with_claim": false});
        assert!(takes(&hand, TaskKind::ToolCall, &yes));
        assert!(!takes(&hand, TaskKind::ToolCall, &no));
        assert!(!takes(&hand, TaskKind::ToolCall, &serde_json::json!({})));
        assert!(takes(&hand, TaskKind::ModelCall, &no));
        hand.dispatch_tool_calls = false;
        assert!(!takes(&hand, TaskKind::ToolCall, &yes));
    }
}
