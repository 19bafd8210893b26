//! The machinery both backends share around a run transition
//! ([`Store::transition`]): what it locks first ([`Target`]), the states it
//! folds from ([`fold_tail`], the [`StateCache`] of recently changed runs),
//! what a decision asks of the tool gates ([`gates_asked`], [`after_gates`])
//! and of the tool cache ([`CacheServing`]), and what a committed transition
//! hands back ([`Applied`]) and wakes ([`Wakes`], [`Wake`]). No statement:
//! each backend runs its own around these (`postgres/transition.rs`,
//! `sqlite/transition.rs`).

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use belay_machine::gates::{Circuit, GateRow, GateVerdict, ToolGates};
use belay_machine::{Decision, Event, RunState};

#[cfg(doc)]
use crate::Store;
use crate::rows::{StoreError, TaskRow, ToolCacheRow};

/// Why a transition did not happen.
#[derive(Debug, thiserror::Error)]
pub enum TransitionError<E> {
    /// The store failed; nothing was written.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The decision function refused; nothing was written.
    #[error("refused")]
    Refused(E),
}

/// Result of a committed transition.
#[derive(Debug, Clone)]
pub struct Applied {
    /// Seq of the first appended event (if any).
    pub first_seq: u64,
    /// Number of events appended.
    pub events: usize,
    /// Status of the run afterwards.
    pub status: &'static str,
    /// What the decision's [`Command::RestoreSecrets`](belay_machine::Command::RestoreSecrets)
    /// read from the run's vault (sealed; the coordinator opens them).
    /// Empty for every other transition.
    pub secrets: Vec<belay_machine::SealedSecret>,
    /// The run.
    pub run_id: Uuid,
    /// The run's tenant.
    pub tenant: String,
    /// The run's trace context (`RunStarted.trace`); `None`: not traced.
    pub trace: Option<belay_proto::trace::TraceContext>,
    /// The database's clock at the transition.
    pub now: DateTime<Utc>,
    /// The node visits this transition ended, in order (traced runs only:
    /// empty when `trace` is `None`). For their spans.
    pub ended_nodes: Vec<EndedNode>,
    /// The task this transition handed to the reporting worker, leased
    /// (and, for a tool call, dispatched) in it ([`crate::HandOff`]);
    /// `None` when none was asked for or none qualified.
    pub handed: Option<crate::rows::ClaimedTask>,
}

/// A node visit a transition ended (completed, or cut short by the run's
/// end), as the engine's span of it needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndedNode {
    /// Node id.
    pub node: String,
    /// The visit's prefix (`<node>` or `<node>~<n>`).
    pub visit: String,
    /// Seq of its `NodeStarted` or `NodePassed` event (its span's start
    /// time is that event's `recorded_at`).
    pub started_seq: u64,
    /// `NodeCompleted` or `NodePassed` ended it; otherwise the run ended (failed,
    /// cancelled) with the node open.
    pub completed: bool,
}

/// The open node visit of `state` (id, prefix), if any and the run is not
/// over.
fn open_visit(state: &RunState) -> Option<(String, String)> {
    if state.status.is_terminal() {
        return None;
    }
    match (&state.node, &state.step) {
        (Some(n), _) => Some((n.id.clone(), n.prefix.clone())),
        (None, Some(s)) => Some((s.id.clone(), s.prefix.clone())),
        (None, None) => None,
    }
}

/// Fold `events` into `state`, and for a traced run name the node visits
/// they end ([`Applied::ended_nodes`]).
pub(crate) fn apply_events(state: &mut RunState, events: &[Event]) -> Vec<EndedNode> {
    let mut ended = Vec::new();
    for event in events {
        let before = if state.trace.is_some() {
            open_visit(state).map(|v| (v, state.node_started_seq))
        } else {
            None
        };
        state.apply(event);
        if let Some(((node, visit), started_seq)) = before
            && open_visit(state).is_none_or(|(_, now)| now != visit)
        {
            ended.push(EndedNode {
                node,
                visit,
                started_seq,
                completed: matches!(
                    event,
                    Event::NodeCompleted { .. }
                        | Event::ToolCallCompleted {
                            ends_node: true,
                            ..
                        }
                ),
            });
        }
        // A node that passed opened and ended its visit in this one event.
        if state.trace.is_some()
            && let Event::NodePassed { node, .. } = event
        {
            ended.push(EndedNode {
                node: node.clone(),
                visit: belay_machine::visit_prefix(
                    node,
                    state.visits.get(node).copied().unwrap_or(1),
                ),
                started_seq: state.last_seq,
                completed: true,
            });
        }
    }
    ended
}

/// A bounded map of run states; when full, an arbitrary entry is dropped.
/// Beside them, the tasks this engine handed over and has not seen
/// reported yet ([`crate::hand_off::HandedLease`]), bounded alike.
#[derive(Debug, Default)]
pub(crate) struct StateCache {
    map: HashMap<Uuid, RunState>,
    leases: HashMap<Uuid, crate::hand_off::HandedLease>,
    capacity: usize,
}

impl StateCache {
    pub(crate) fn new(capacity: usize) -> StateCache {
        StateCache {
            map: HashMap::new(),
            leases: HashMap::new(),
            capacity,
        }
    }

    pub(crate) fn take(&mut self, run_id: &Uuid) -> Option<RunState> {
        self.map.remove(run_id)
    }

    /// What this engine handed over as task `task_id`, if it still knows.
    pub(crate) fn take_lease(&mut self, task_id: &Uuid) -> Option<crate::hand_off::HandedLease> {
        self.leases.remove(task_id)
    }

    /// Keep what a committed transition handed over.
    pub(crate) fn put_lease(&mut self, lease: crate::hand_off::HandedLease) {
        if self.capacity == 0 {
            return;
        }
        if self.leases.len() >= self.capacity
            && let Some(victim) = self.leases.keys().next().copied()
        {
            self.leases.remove(&victim);
        }
        self.leases.insert(lease.task.task_id, lease);
    }

    pub(crate) fn put(&mut self, run_id: Uuid, state: RunState) {
        if self.capacity == 0 {
            return;
        }
        if self.map.len() >= self.capacity
            && !self.map.contains_key(&run_id)
            && let Some(victim) = self.map.keys().next().copied()
        {
            self.map.remove(&victim);
        }
        self.map.insert(run_id, state);
    }
}

/// Run states kept in memory per engine (see [`Store`]); at most this many.
pub const STATE_CACHE_RUNS: usize = 2048;

/// What a transition locks first.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Target {
    /// A run, and optionally one of its tasks.
    Run(Uuid, Option<Uuid>),
    /// A task and its run.
    Task(Uuid),
    /// A task and its run, for the task's dispatch: the locked task row
    /// also carries the tenant's grants as they are now
    /// ([`TaskRow::tenant_grants`]), read by the same statement.
    Dispatch(Uuid),
}

impl Target {
    /// The target without the dispatch flag, and whether it was set.
    pub(crate) fn split_dispatch(self) -> (Target, bool) {
        match self {
            Target::Dispatch(task_id) => (Target::Task(task_id), true),
            other => (other, false),
        }
    }
}

/// What a committed transition wakes (and hands back).
#[derive(Debug, Clone, Default)]
pub(crate) struct Wakes {
    /// Tasks may have become claimable.
    pub(crate) tasks: bool,
    /// The run got events.
    pub(crate) events: bool,
    /// Outbox rows were written.
    pub(crate) outbox: bool,
    /// What a [`Command::RestoreSecrets`](belay_machine::Command) read from
    /// the run's vault (not a wake-up: handed back with the transition's
    /// result).
    pub(crate) secrets: Vec<belay_machine::SealedSecret>,
}

impl Wakes {
    /// What committing `decision` wakes on PostgreSQL, before its commands
    /// add vault reads or an ended child's outbox row: claimers when it
    /// may have made tasks claimable (`handed`: the call of the task it
    /// handed over leased, [`wakes_tasks`]), watchers when it has events,
    /// the outbox relay when it starts or cancels a child run.
    pub(crate) fn of(decision: &Decision, handed: Option<&str>) -> Wakes {
        use belay_machine::Command;
        Wakes {
            tasks: wakes_tasks(decision, handed),
            events: !decision.events.is_empty(),
            outbox: decision.commands.iter().any(|c| {
                matches!(
                    c,
                    Command::StartChildRun { .. } | Command::CancelChildRun { .. }
                )
            }),
            secrets: Vec::new(),
        }
    }
}

/// Whether a committed `decision` may have made tasks claimable: it
/// schedules or re-queues one, or resumes its run (a paused run's ready
/// tasks are not claimed until then). `handed`: the call of the task the
/// transition handed over leased (no claimer needs waking for it).
pub(crate) fn wakes_tasks(decision: &Decision, handed: Option<&str>) -> bool {
    use belay_machine::{Command, Event};
    decision.commands.iter().any(|c| match c {
        Command::ScheduleTask { call_id, .. } => Some(call_id.as_str()) != handed,
        Command::RetryTask { .. } => true,
        _ => false,
    }) || decision
        .events
        .iter()
        .any(|e| matches!(e, Event::RunResumed { .. }))
}

/// How many times, as far as this process can tell, tasks may have become
/// claimable: bumped after a commit of this process that scheduled or
/// re-queued a task, on a `Wake::Tasks` from another process, when the
/// wake-up listener (re)connects or fell behind, and by the store's own
/// out-of-band task changes ([`Store::advance_clock`],
/// [`Store::expire_task_timers`]). A claimer that found nothing claimable
/// while the count stayed the same may skip looking again
/// ([`Store::tasks_wake_seq`]). Cheap to clone (one shared counter).
#[derive(Debug, Clone, Default)]
pub(crate) struct TasksWakeSeq(std::sync::Arc<std::sync::atomic::AtomicU64>);

impl TasksWakeSeq {
    /// Count one more moment tasks may have become claimable; call it after
    /// the change is committed (visible to a claim statement).
    pub(crate) fn bump(&self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// The count so far.
    pub(crate) fn get(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A wake-up relayed by [`Store::listen`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// Tasks may have become claimable.
    Tasks,
    /// This run got new events.
    RunEvents(Uuid),
    /// Outbox rows were written ([`Store::claim_outbox`]).
    Outbox,
}

/// Apply the events `(seq, payload)` that follow `state` (in seq order),
/// checking that `seq` stays gapless.
///
/// Errors: [`StoreError::Corrupt`] for an event that does not decode or a
/// gap.
pub(crate) fn fold_tail(
    state: &mut RunState,
    run_id: Uuid,
    rows: Vec<(i64, Value)>,
) -> Result<(), StoreError> {
    for (seq, payload) in rows {
        let event: belay_machine::Event = serde_json::from_value(payload)
            .map_err(|e| StoreError::Corrupt(format!("run {run_id} event {seq}: {e}")))?;
        state.apply(&event);
        if state.last_seq != seq as u64 {
            return Err(StoreError::Corrupt(format!(
                "run {run_id}: gap before seq {seq}"
            )));
        }
    }
    Ok(())
}

/// Whether a decision ends its run (a terminal event).
pub(crate) fn ends_run(decision: &Decision) -> bool {
    decision.events.iter().any(|e| {
        matches!(
            e,
            belay_machine::Event::RunCompleted { .. }
                | belay_machine::Event::RunFailed { .. }
                | belay_machine::Event::RunCancelled { .. }
        )
    })
}

/// The `child_finished` outbox payload of a child run that ended in state `after`.
pub(crate) fn child_finished_payload(
    tenant: &str,
    parent: Uuid,
    child: Uuid,
    after: &RunState,
) -> Value {
    serde_json::json!({
        "tenant": tenant,
        "parent_run_id": parent,
        "child_run_id": child,
        "status": after.status.as_str(),
        "output": after.output,
        "error": if after.status_reason.is_empty() { None } else { Some(&after.status_reason) },
    })
}

/// A decision function of a transition that passes no tool gate, as the
/// backends take it: a verdict for it means a decision asked for a tool's
/// gates outside [`Store::transition_task_gated`], which is refused rather
/// than let the call pass unchecked.
pub(crate) fn decide_once<E, F>(
    decide: F,
) -> impl FnMut(&RunState, Option<&TaskRow>, Option<&GateVerdict>) -> Result<Decision, TransitionError<E>>
where
    F: FnOnce(&RunState, Option<&TaskRow>) -> Result<Decision, E>,
{
    let mut decide = Some(decide);
    move |state, task, verdict| match (verdict, decide.take()) {
        (None, Some(decide)) => decide(state, task).map_err(TransitionError::Refused),
        _ => Err(StoreError::Corrupt(
            "a tool's gates held back a decision that cannot be made again".into(),
        )
        .into()),
    }
}

/// The tool gates a decision asks to pass, if any
/// ([`Command::PassToolGates`](belay_machine::Command::PassToolGates)).
pub(crate) fn gates_asked(decision: &Decision) -> Option<GatesAsked<'_>> {
    decision.commands.iter().find_map(|c| match c {
        belay_machine::Command::PassToolGates {
            tool,
            gates,
            holds_turn,
        } => Some(GatesAsked {
            tool,
            gates,
            holds_turn: *holds_turn,
        }),
        _ => None,
    })
}

/// What [`Command::PassToolGates`](belay_machine::Command::PassToolGates) asks.
pub(crate) struct GatesAsked<'a> {
    /// Tool name.
    pub tool: &'a str,
    /// Its gates.
    pub gates: &'a ToolGates,
    /// Whether the call holds a turn.
    pub holds_turn: bool,
}

/// A transition's decision function as the backends take it: the run's
/// state, its locked task row if any, and the verdict of the tool's gates
/// when they held the first decision back (`None` first).
pub(crate) trait DecideFn<E>:
    FnMut(&RunState, Option<&TaskRow>, Option<&GateVerdict>) -> Result<Decision, TransitionError<E>>
{
}

impl<E, F> DecideFn<E> for F where
    F: FnMut(
        &RunState,
        Option<&TaskRow>,
        Option<&GateVerdict>,
    ) -> Result<Decision, TransitionError<E>>
{
}

/// The decision to write after `first` asked for the tool's gates and they
/// said `verdict` (`None`: they let the call go): `first`, or `decide`'s
/// second decision, which may not ask again.
pub(crate) fn after_gates<E, F>(
    first: Decision,
    verdict: Option<GateVerdict>,
    state: &RunState,
    task: Option<&TaskRow>,
    decide: &mut F,
) -> Result<Decision, TransitionError<E>>
where
    F: DecideFn<E>,
{
    let Some(verdict) = verdict else {
        return Ok(first);
    };
    let second = decide(state, task, Some(&verdict))?;
    if gates_asked(&second).is_some() {
        return Err(StoreError::Corrupt(
            "a decision held back by a tool's gates asked for them again".into(),
        )
        .into());
    }
    Ok(second)
}

/// The cache lookups `commands` ask for
/// ([`Command::LookupToolCache`](belay_machine::Command::LookupToolCache)):
/// `(call_id, key)`, in order.
pub(crate) fn cache_lookups(commands: &[belay_machine::Command]) -> Vec<(String, String)> {
    commands
        .iter()
        .filter_map(|c| match c {
            belay_machine::Command::LookupToolCache { call_id, key } => {
                Some((call_id.clone(), key.clone()))
            }
            _ => None,
        })
        .collect()
}

/// Serving the calls a decision launched from the tenant's tool cache
/// ([`belay_machine::cache`]): the loop of each backend's
/// `serve_from_cache`, whose statements differ. It hands out the keys to
/// read, in order (the lookups of the decision, then those of each hit's
/// decision: a hit can start the next node, whose call can hit too), at
/// most [`MAX_CACHE_HITS_PER_TRANSITION`] hits; a live entry makes the
/// machine decide [`Input::ToolCacheHit`] on the state after what was
/// decided so far. If it takes the hit, the call's task and lookup leave
/// the decision and the hit's events and commands are appended; if it
/// refuses, the call runs as a task, as on a miss.
///
/// [`MAX_CACHE_HITS_PER_TRANSITION`]: belay_machine::cache::MAX_CACHE_HITS_PER_TRANSITION
/// [`Input::ToolCacheHit`]: belay_machine::Input::ToolCacheHit
pub(crate) struct CacheServing {
    decision: Decision,
    /// The run after `decision`'s events.
    after: RunState,
    /// `(call_id, key)` to read, in order; `next` is the first not read.
    queue: Vec<(String, String)>,
    next: usize,
    hits: usize,
    /// The tenant's grants now, read at the first live entry.
    grants: Option<Vec<String>>,
}

impl CacheServing {
    /// Serving `decision`, decided on `state`; `Err` gives it back when it
    /// asks for no lookup (it then costs no statement).
    pub(crate) fn new(state: &RunState, decision: Decision) -> Result<CacheServing, Decision> {
        let queue = cache_lookups(&decision.commands);
        if queue.is_empty() {
            return Err(decision);
        }
        let mut after = state.clone();
        for event in &decision.events {
            after.apply(event);
        }
        Ok(CacheServing {
            decision,
            after,
            queue,
            next: 0,
            hits: 0,
            grants: None,
        })
    }

    /// Whether the transition's time is unknown (a run's start): the
    /// machine may start a node whose call fills in the time.
    pub(crate) fn needs_clock(&self) -> bool {
        self.after.now.is_none()
    }

    /// The engine's clock, read in the transaction.
    pub(crate) fn set_clock(&mut self, now: DateTime<Utc>) {
        self.after.now = Some(now);
    }

    /// The next key to read, or `None` when every lookup is done or the
    /// hits are at their bound.
    pub(crate) fn next_key(&mut self) -> Option<String> {
        if self.hits >= belay_machine::cache::MAX_CACHE_HITS_PER_TRANSITION {
            return None;
        }
        let (_, key) = self.queue.get(self.next)?;
        self.next += 1;
        Some(key.clone())
    }

    /// Whether [`CacheServing::serve`] needs the tenant's grants first.
    pub(crate) fn needs_grants(&self) -> bool {
        self.grants.is_none()
    }

    /// The tenant's grants now, read in the transaction.
    pub(crate) fn set_grants(&mut self, grants: Vec<String>) {
        self.grants = Some(grants);
    }

    /// The live entry found for the key [`CacheServing::next_key`] gave last.
    pub(crate) fn serve(&mut self, row: ToolCacheRow) {
        use belay_machine::Command;
        let Some((call_id, _)) = self.next.checked_sub(1).and_then(|i| self.queue.get(i)) else {
            return;
        };
        let call_id = call_id.clone();
        let input = belay_machine::Input::ToolCacheHit {
            call_id: call_id.clone(),
            entry: row.entry(),
            tenant_grants: self.grants.clone().unwrap_or_default(),
        };
        let hit = match belay_machine::decide(&self.after, input) {
            Ok(hit) => hit,
            Err(e) => {
                tracing::debug!(call_id, error = %e, "cached result not used");
                return;
            }
        };
        self.decision.commands.retain(|c| {
            !matches!(c,
                Command::ScheduleTask { call_id: id, .. } | Command::LookupToolCache { call_id: id, .. }
                    if *id == call_id)
        });
        for event in &hit.events {
            self.after.apply(event);
        }
        self.hits += 1;
        self.queue.extend(cache_lookups(&hit.commands));
        self.decision.events.extend(hit.events);
        self.decision.commands.extend(hit.commands);
    }

    /// The decision to write.
    pub(crate) fn finish(self) -> Decision {
        self.decision
    }
}

/// A `tool_gates` row as both backends select it: `next_at_ms`,
/// `queue_at_ms`, `failures`, `circuit`, `retry_at_ms`, then the engine's
/// clock in ms.
pub(crate) type GateTuple = (i64, i64, i64, String, i64, i64);

/// A selected [`GateTuple`] as the row and the engine's clock (ms).
///
/// Errors: [`StoreError::Corrupt`] for a circuit state the schema refuses.
pub(crate) fn gate_row(
    (next_at_ms, queue_at_ms, failures, circuit, retry_at_ms, now_ms): GateTuple,
) -> Result<(GateRow, i64), StoreError> {
    let circuit = Circuit::parse(&circuit)
        .ok_or_else(|| StoreError::Corrupt(format!("tool_gates.circuit {circuit:?}")))?;
    let row = GateRow {
        next_at_ms,
        queue_at_ms,
        failures: u32::try_from(failures).unwrap_or(0),
        circuit,
        retry_at_ms,
    };
    Ok((row, now_ms))
}

#[cfg(test)]
mod tests {
    use super::*;
    use belay_machine::RunStatus;
    use serde_json::json;

    /// A `node_passed` opens and ends its visit in its one event: each is
    /// a visit of its own, the second visit of a node prefixed `~2`, its
    /// span starting at that event.
    #[test]
    fn a_passed_node_ends_a_visit_of_its_own_at_its_event() {
        let mut state = RunState {
            status: RunStatus::Running,
            last_seq: 4,
            trace: Some(belay_proto::trace::TraceContext {
                traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
                tracestate: String::new(),
            }),
            ..RunState::default()
        };
        let passed = |output: Value| Event::NodePassed {
            node: "count".into(),
            output,
            next: None,
        };
        let ended = apply_events(
            &mut state,
            &[passed(json!({"n": 1})), passed(json!({"n": 2}))],
        );
        let visits: Vec<(&str, &str, u64, bool)> = ended
            .iter()
            .map(|e| {
                (
                    e.node.as_str(),
                    e.visit.as_str(),
                    e.started_seq,
                    e.completed,
                )
            })
            .collect();
        assert_eq!(
            visits,
            vec![("count", "count", 5, true), ("count", "count~2", 6, true)]
        );
        assert_eq!(state.vars.get("n"), None, "no plan: not a set node");
        // Untraced: no span, nothing to name.
        state.trace = None;
        assert!(apply_events(&mut state, &[passed(json!({}))]).is_empty());
    }
}
