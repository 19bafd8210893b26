//! What `belay-chaos` prints: the configuration, the faults injected by
//! kind, how the runs and calls ended, what the tools received, and every
//! violation, one line each.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use super::checks::Violation;
use super::observe::Facts;
use super::recorder::ToolKind;

/// The figures of one chaos run.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// The database used (kept when a check failed).
    pub database: String,
    /// Where the processes' logs and `faults.log` are.
    pub log_dir: String,
    /// Runs submitted.
    pub runs: u32,
    /// Runs acknowledged by an engine.
    pub acknowledged: usize,
    /// `StartRun` attempts in all.
    pub start_attempts: u64,
    /// Length of the fault phase.
    pub duration: Duration,
    /// Engines, and how many times they were started.
    pub engines: (u32, u32),
    /// Workers, and how many times they were started.
    pub workers: (u32, u32),
    /// The lease, ms.
    pub lease_ms: u64,
    /// Faults applied, by kind.
    pub faults: BTreeMap<&'static str, u64>,
    /// Faults that found nothing to act on, by kind.
    pub skipped: BTreeMap<&'static str, u64>,
    /// Connections through each proxy: (link, accepted, dropped by a fault,
    /// refused because the upstream was down).
    pub proxies: Vec<(String, u64, u64, u64)>,
    /// Processes that ended by themselves (name: status).
    pub exits: Vec<String>,
    /// How long the runs took to settle once the faults stopped.
    pub settle: Duration,
    /// Whether they all did within the settle timeout.
    pub settled_all: bool,
    /// Runs by status.
    pub statuses: BTreeMap<String, u64>,
    /// Calls by tool and outcome.
    pub calls: BTreeMap<(String, String), u64>,
    /// Requests each tool received.
    pub requests: BTreeMap<&'static str, usize>,
    /// Probe requests.
    pub probes: u64,
    /// Model requests.
    pub model_requests: u64,
    /// Answers held back.
    pub slow_answers: u64,
    /// Uncertain records by state (`open`, `resolved by probe`, …).
    pub uncertain: BTreeMap<String, u64>,
    /// `never` calls that reached the tool but ended failed (their result
    /// was lost; allowed, counted).
    pub never_lost_results: u64,
    /// PostgreSQL restarts that failed.
    pub pg_errors: Vec<String>,
    /// The broken invariants.
    pub violations: Vec<Violation>,
}

/// How each scheduled call ended, by tool: `completed`, `failed`,
/// `resolved <resolution> by <via>` (an uncertain outcome resolved without
/// a result event), `uncertain (open)` or `open`.
pub fn call_outcomes(facts: &Facts) -> BTreeMap<(String, String), u64> {
    let open_records: std::collections::BTreeSet<(uuid::Uuid, &str)> = facts
        .uncertain
        .iter()
        .filter(|u| u.status == "open")
        .map(|u| (u.run_id, u.call_id.as_str()))
        .collect();
    let mut outcomes = BTreeMap::new();
    for (run, events) in &facts.events {
        let call_of = |e: &Value| e.get("call_id").and_then(Value::as_str).map(str::to_owned);
        for scheduled in events.iter().filter(|e| e.kind == "tool_call_scheduled") {
            let (Some(call), Some(tool)) = (
                call_of(&scheduled.payload),
                scheduled.payload.get("tool").and_then(Value::as_str),
            ) else {
                continue;
            };
            let ended = |kind: &str| {
                events
                    .iter()
                    .any(|e| e.kind == kind && call_of(&e.payload).as_deref() == Some(&call))
            };
            let resolved = events.iter().rev().find(|e| {
                e.kind == "uncertain_outcome_resolved"
                    && call_of(&e.payload).as_deref() == Some(&call)
            });
            let outcome = if ended("tool_call_completed") {
                "completed".to_owned()
            } else if ended("tool_call_failed") {
                "failed".to_owned()
            } else if let Some(e) = resolved {
                let how = |field: &str| e.payload.get(field).and_then(Value::as_str).unwrap_or("?");
                format!("resolved {} by {}", how("resolution"), how("via"))
            } else if open_records.contains(&(*run, call.as_str())) {
                "uncertain (open)".to_owned()
            } else {
                "open".to_owned()
            };
            *outcomes.entry((tool.to_owned(), outcome)).or_insert(0) += 1;
        }
    }
    outcomes
}

fn joined<K: std::fmt::Display, V: std::fmt::Display>(
    items: impl IntoIterator<Item = (K, V)>,
) -> String {
    let parts: Vec<String> = items.into_iter().map(|(k, v)| format!("{k} {v}")).collect();
    if parts.is_empty() {
        "none".to_owned()
    } else {
        parts.join(", ")
    }
}

impl Report {
    /// The report, one line each.
    pub fn lines(&self) -> Vec<String> {
        let mut lines = vec![
            format!(
                "seed: {} (the same faults again: --seed {})",
                self.seed, self.seed
            ),
            format!(
                "runs: {} submitted, {} acknowledged ({} StartRun attempts)",
                self.runs, self.acknowledged, self.start_attempts
            ),
            format!(
                "engines: {} ({} starts), workers: {} ({} starts), lease {} ms",
                self.engines.0, self.engines.1, self.workers.0, self.workers.1, self.lease_ms
            ),
            format!(
                "faults: {} in {:.0} s",
                self.faults.values().sum::<u64>(),
                self.duration.as_secs_f64()
            ),
        ];
        lines.extend(self.faults.iter().map(|(k, n)| format!("  {k}: {n}")));
        if !self.skipped.is_empty() {
            lines.push(format!(
                "  skipped (nothing to act on): {}",
                joined(self.skipped.iter().map(|(k, v)| (*k, *v)))
            ));
        }
        for (link, accepted, dropped, refused) in &self.proxies {
            lines.push(format!(
                "proxy {link}: {accepted} connections, {dropped} dropped by faults, {refused} refused (upstream down)"
            ));
        }
        lines.push(format!(
            "processes that exited by themselves: {}",
            if self.exits.is_empty() {
                "none".to_owned()
            } else {
                self.exits.join("; ")
            }
        ));
        lines.push(if self.settled_all {
            format!(
                "settled {:.1} s after the faults stopped",
                self.settle.as_secs_f64()
            )
        } else {
            format!(
                "not all runs settled within {:.1} s after the faults stopped",
                self.settle.as_secs_f64()
            )
        });
        lines.push(format!("runs by status: {}", joined(self.statuses.iter())));
        for kind in ToolKind::ALL {
            let outcomes = self
                .calls
                .iter()
                .filter(|((tool, _), _)| tool == kind.tool())
                .map(|((_, outcome), n)| (outcome.as_str(), *n));
            lines.push(format!(
                "{} calls: {}; requests received: {}",
                kind.tool(),
                joined(outcomes),
                self.requests.get(kind.tool()).copied().unwrap_or(0)
            ));
        }
        lines.push(format!(
            "probe requests: {}, model requests: {}, answers held back: {}",
            self.probes, self.model_requests, self.slow_answers
        ));
        lines.push(format!(
            "uncertain records: {}",
            joined(self.uncertain.iter())
        ));
        lines.push(format!(
            "chaos_never calls that acted but ended failed (result lost; allowed): {}",
            self.never_lost_results
        ));
        for e in &self.pg_errors {
            lines.push(format!("PostgreSQL restart failed: {e}"));
        }
        lines.push(format!("violations: {}", self.violations.len()));
        lines.extend(self.violations.iter().map(|v| format!("  VIOLATION {v}")));
        lines.push(format!("database: {}", self.database));
        lines.push(format!("logs: {}", self.log_dir));
        lines
    }

    /// Whether every check held and the harness did all it meant to.
    pub fn passed(&self) -> bool {
        self.violations.is_empty() && self.pg_errors.is_empty()
    }
}
