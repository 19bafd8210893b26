//! The invariants checked once the runs have settled, as pure functions of
//! what was observed ([`Observed`]: the submissions, the database's facts,
//! the recording server's requests, the workers that died, the processes'
//! panics), so each can be shown to fail on a history that breaks it.
//!
//! - **no run lost**: every submission was acknowledged, every
//!   acknowledgement (and a `StartRun` sent again after the end) names the
//!   same run, that run exists, and its key names no other run;
//! - **settled**: every run is `completed`, `failed` or `cancelled`, or
//!   `paused` with a reason and an open uncertain record (or an operator's
//!   pause), or `waiting` with a reason and a timer or callback;
//! - **at most once**: a `never` or `reconcile` call reached its tool at
//!   most once; every request came for a call the run's history has;
//! - **one key**: every request of a call carried the call's idempotency
//!   key, so an `idempotent` call's attempts share one;
//! - **gapless seq**: a run's events are `1..=last_seq`, none missing;
//! - **no task leased by a dead worker** once its lease is over (plus the
//!   sweep's grace);
//! - **lost reconcile outcomes**: a `reconcile` call that reached its tool
//!   has a result in its run's history or an uncertain-outcome record;
//!   an open record holds its run paused;
//! - **clean requests, no panics**: every tool request named its run and
//!   call; no engine or worker panicked.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use uuid::Uuid;

use super::observe::{EventRow, Facts};
use super::recorder::{ToolKind, ToolRequest};
use super::submit::Submission;

/// Everything the checks look at.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// The submissions.
    pub submissions: Vec<Submission>,
    /// The database.
    pub facts: Facts,
    /// Every request the tools received.
    pub requests: Vec<ToolRequest>,
    /// Requests without a run or call.
    pub malformed: Vec<String>,
    /// Ids of workers that were killed or exited.
    pub dead_workers: BTreeSet<String>,
    /// How long after its lease ended a dead worker's task may still be
    /// leased (the sweep's interval and some slack), ms.
    pub lease_grace_ms: f64,
    /// Panics found in the processes' logs (file and line).
    pub panics: Vec<String>,
}

/// One broken invariant.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Violation {
    /// The run, when one is concerned.
    pub run: Option<Uuid>,
    /// Which check.
    pub check: &'static str,
    /// What exactly.
    pub what: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.run {
            Some(run) => write!(f, "[{}] run {run}: {}", self.check, self.what),
            None => write!(f, "[{}] {}", self.check, self.what),
        }
    }
}

fn violation(run: Option<Uuid>, check: &'static str, what: String) -> Violation {
    Violation { run, check, what }
}

/// Every check, violations sorted by check and run.
pub fn check(o: &Observed) -> Vec<Violation> {
    let mut found = Vec::new();
    found.extend(no_run_lost(o));
    found.extend(settled(o));
    found.extend(requests_match_calls(o));
    found.extend(gapless_seq(o));
    found.extend(no_dead_leases(o));
    found.extend(lost_reconcile_outcomes(o));
    found.extend(
        o.malformed
            .iter()
            .map(|m| violation(None, "clean requests", m.clone())),
    );
    found.extend(
        o.panics
            .iter()
            .map(|p| violation(None, "no panics", p.clone())),
    );
    found.sort();
    found
}

fn no_run_lost(o: &Observed) -> Vec<Violation> {
    const CHECK: &str = "no run lost";
    let mut found = Vec::new();
    let by_id: BTreeMap<Uuid, &str> = o
        .facts
        .runs
        .iter()
        .map(|r| (r.run_id, r.idempotency_key.as_str()))
        .collect();
    let mut by_key: BTreeMap<&str, Vec<Uuid>> = BTreeMap::new();
    for r in &o.facts.runs {
        by_key.entry(&r.idempotency_key).or_default().push(r.run_id);
    }
    for s in &o.submissions {
        let Some(first) = s.run_ids.first() else {
            found.push(violation(
                None,
                CHECK,
                format!(
                    "run {} (key {}) was never acknowledged after {} attempts: {}",
                    s.index,
                    s.key,
                    s.attempts,
                    s.last_error.as_deref().unwrap_or("no error")
                ),
            ));
            continue;
        };
        if let Some(other) = s.run_ids.iter().find(|id| *id != first) {
            found.push(violation(
                Some(*first),
                CHECK,
                format!(
                    "key {} was answered with two runs: {first} and {other}",
                    s.key
                ),
            ));
        }
        if !by_id.contains_key(first) {
            found.push(violation(
                Some(*first),
                CHECK,
                format!("acknowledged for key {}, but not in the database", s.key),
            ));
        }
        if let Some(ids) = by_key.get(s.key.as_str())
            && ids.len() > 1
        {
            found.push(violation(
                Some(*first),
                CHECK,
                format!("key {} names {} runs: {ids:?}", s.key, ids.len()),
            ));
        }
    }
    found
}

/// The latest `run_paused` event's operator, if the run was paused by one.
fn paused_by_operator(events: &[EventRow]) -> bool {
    events
        .iter()
        .rev()
        .find(|e| e.kind == "run_paused")
        .is_some_and(|e| e.payload.get("operator").is_some_and(|o| !o.is_null()))
}

fn settled(o: &Observed) -> Vec<Violation> {
    const CHECK: &str = "settled";
    let open: BTreeSet<Uuid> = o
        .facts
        .uncertain
        .iter()
        .filter(|u| u.status == "open")
        .map(|u| u.run_id)
        .collect();
    let mut found = Vec::new();
    for run in &o.facts.runs {
        let events = o
            .facts
            .events
            .get(&run.run_id)
            .map_or(&[][..], Vec::as_slice);
        let problem = match run.status.as_str() {
            "completed" | "failed" | "cancelled" => None,
            "paused" if run.reason.is_empty() => Some("paused without a reason".to_owned()),
            "paused" if !open.contains(&run.run_id) && !paused_by_operator(events) => {
                Some(format!(
                    "paused ({}) with no open uncertain record and no operator's pause",
                    run.reason
                ))
            }
            "paused" => None,
            "waiting" if run.reason.is_empty() => Some("waiting without a reason".to_owned()),
            "waiting" if !o.facts.wakeups.contains(&run.run_id) => Some(format!(
                "waiting ({}) with nothing registered that will wake it",
                run.reason
            )),
            "waiting" => None,
            other => {
                let open_tasks: Vec<String> = o
                    .facts
                    .tasks
                    .iter()
                    .filter(|t| {
                        t.run_id == run.run_id && matches!(t.status.as_str(), "ready" | "leased")
                    })
                    .map(|t| format!("{} {} (attempt {})", t.call_id, t.status, t.attempt))
                    .collect();
                Some(format!(
                    "still {other} after the settle timeout; last event: {}; open tasks: [{}]",
                    events.last().map_or("none", |e| e.kind.as_str()),
                    open_tasks.join(", ")
                ))
            }
        };
        if let Some(problem) = problem {
            found.push(violation(Some(run.run_id), CHECK, problem));
        }
    }
    found
}

/// A call as its run's history scheduled it.
#[derive(Debug, Clone)]
struct Scheduled {
    tool: String,
    key: String,
}

/// Every scheduled tool call, by (run, call id). Reconcile probes are
/// scheduled with their own events and are not among them.
fn scheduled_calls(facts: &Facts) -> BTreeMap<(Uuid, String), Scheduled> {
    let mut calls = BTreeMap::new();
    for (run, events) in &facts.events {
        for e in events.iter().filter(|e| e.kind == "tool_call_scheduled") {
            let text = |field: &str| {
                e.payload
                    .get(field)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned()
            };
            calls.insert(
                (*run, text("call_id")),
                Scheduled {
                    tool: text("tool"),
                    key: text("idempotency_key"),
                },
            );
        }
    }
    calls
}

fn requests_match_calls(o: &Observed) -> Vec<Violation> {
    let calls = scheduled_calls(&o.facts);
    let mut groups: BTreeMap<(ToolKind, String, String), Vec<&ToolRequest>> = BTreeMap::new();
    for r in &o.requests {
        groups
            .entry((r.kind, r.run.clone(), r.call.clone()))
            .or_default()
            .push(r);
    }
    let mut found = Vec::new();
    for ((kind, run, call), requests) in groups {
        let run_id = Uuid::parse_str(&run).ok();
        let scheduled = run_id.and_then(|id| calls.get(&(id, call.clone())));
        let Some(scheduled) = scheduled.filter(|s| s.tool == kind.tool()) else {
            found.push(violation(
                run_id,
                "at most once",
                format!(
                    "{} received {} request(s) for call {call:?} of run {run:?}, which the run's history does not schedule",
                    kind.tool(),
                    requests.len()
                ),
            ));
            continue;
        };
        if kind.at_most_once() && requests.len() > 1 {
            found.push(violation(
                run_id,
                "at most once",
                format!(
                    "{} call {call} reached the tool {} times (repeat safety allows one)",
                    kind.tool(),
                    requests.len()
                ),
            ));
        }
        let keys: BTreeSet<Option<&str>> = requests.iter().map(|r| r.key.as_deref()).collect();
        if keys.len() > 1 || keys.iter().any(|k| *k != Some(scheduled.key.as_str())) {
            found.push(violation(
                run_id,
                "one key",
                format!(
                    "{} call {call} was sent with the keys {keys:?}; its key is {:?}",
                    kind.tool(),
                    scheduled.key
                ),
            ));
        }
    }
    found
}

fn gapless_seq(o: &Observed) -> Vec<Violation> {
    let mut found = Vec::new();
    for run in &o.facts.runs {
        let seqs: Vec<i64> = o
            .facts
            .events
            .get(&run.run_id)
            .map(|events| events.iter().map(|e| e.seq).collect())
            .unwrap_or_default();
        let gapless = seqs.iter().enumerate().all(|(i, s)| *s == i as i64 + 1);
        if !gapless || seqs.len() as i64 != run.last_seq {
            let missing: Vec<i64> = (1..=run.last_seq.max(seqs.len() as i64))
                .filter(|s| !seqs.contains(s))
                .take(10)
                .collect();
            found.push(violation(
                Some(run.run_id),
                "gapless seq",
                format!(
                    "{} events, last_seq {}, missing {missing:?}",
                    seqs.len(),
                    run.last_seq
                ),
            ));
        }
    }
    found
}

fn no_dead_leases(o: &Observed) -> Vec<Violation> {
    o.facts
        .tasks
        .iter()
        .filter(|t| t.status == "leased")
        .filter(|t| t.worker_id.as_ref().is_some_and(|w| o.dead_workers.contains(w)))
        .filter(|t| t.lease_over_ms.is_some_and(|ms| ms > o.lease_grace_ms))
        .map(|t| {
            violation(
                Some(t.run_id),
                "no task leased by a dead worker",
                format!(
                    "task of {} (attempt {}) is still leased by {}, dead, {:.0} ms after its lease ended",
                    t.call_id,
                    t.attempt,
                    t.worker_id.as_deref().unwrap_or("?"),
                    t.lease_over_ms.unwrap_or_default()
                ),
            )
        })
        .collect()
}

fn lost_reconcile_outcomes(o: &Observed) -> Vec<Violation> {
    const CHECK: &str = "lost reconcile outcomes";
    let records: BTreeMap<(Uuid, &str), Vec<&str>> =
        o.facts.uncertain.iter().fold(BTreeMap::new(), |mut m, u| {
            m.entry((u.run_id, u.call_id.as_str()))
                .or_default()
                .push(u.status.as_str());
            m
        });
    let status: BTreeMap<Uuid, &str> = o
        .facts
        .runs
        .iter()
        .map(|r| (r.run_id, r.status.as_str()))
        .collect();
    let mut found = Vec::new();
    let reached: BTreeSet<(Uuid, &str)> = o
        .requests
        .iter()
        .filter(|r| matches!(r.kind, ToolKind::Reconcile | ToolKind::ReconcileProbed))
        .filter_map(|r| Some((Uuid::parse_str(&r.run).ok()?, r.call.as_str())))
        .collect();
    for (run, call) in reached {
        let events = o.facts.events.get(&run).map_or(&[][..], Vec::as_slice);
        let completed = events.iter().any(|e| {
            e.kind == "tool_call_completed"
                && e.payload.get("call_id").and_then(Value::as_str) == Some(call)
        });
        if !completed && !records.contains_key(&(run, call)) {
            let last = events
                .iter()
                .rev()
                .find(|e| e.payload.get("call_id").and_then(Value::as_str) == Some(call))
                .map_or("none", |e| e.kind.as_str());
            found.push(violation(
                Some(run),
                CHECK,
                format!(
                    "{call} reached the tool, but the history has no result and there is no uncertain record (the call's last event: {last})"
                ),
            ));
        }
    }
    for ((run, call), states) in &records {
        let run_status = status.get(run).copied().unwrap_or("missing");
        if states.contains(&"open") && run_status != "paused" {
            found.push(violation(
                Some(*run),
                CHECK,
                format!("the uncertain record of {call} is open, but the run is {run_status}"),
            ));
        }
    }
    found
}

#[cfg(test)]
mod tests;
