//! A run's history as the run page shows it: events grouped by node visit,
//! and inside a visit by call (model calls with their answer and token
//! usage; tool calls with arguments, idempotency key, repeat safety and
//! each attempt: dispatched where and when, and how it ended). Events of
//! the run itself (start, pauses, signals, the end) stand between the
//! visits. Every event keeps its raw JSON.

use std::collections::BTreeMap;

use serde_json::Value;

use super::page::{cut, pretty, short, when};
use crate::store::EventRow;

/// One event as a line of the timeline.
pub(crate) struct Item {
    pub(crate) seq: i64,
    pub(crate) kind: String,
    pub(crate) at: String,
    pub(crate) summary: String,
    pub(crate) raw: String,
}

/// One attempt of a call.
#[derive(Default)]
pub(crate) struct Attempt {
    pub(crate) n: u64,
    pub(crate) dispatched: String,
    pub(crate) ended: String,
}

/// One call of a node visit.
#[derive(Default)]
pub(crate) struct Call {
    pub(crate) call_id: String,
    /// `model`, `tool`, `child` or `confirmation`.
    pub(crate) kind: String,
    pub(crate) title: String,
    pub(crate) arguments: Option<String>,
    pub(crate) idempotency_key: String,
    pub(crate) repeat_safety: String,
    pub(crate) usage: String,
    pub(crate) answer: Option<String>,
    pub(crate) attempts: Vec<Attempt>,
    pub(crate) events: Vec<Item>,
}

/// One visit of a node.
pub(crate) struct Visit {
    pub(crate) node: String,
    pub(crate) visit: u32,
    pub(crate) events: Vec<Item>,
    pub(crate) calls: Vec<Call>,
}

/// A part of the timeline.
pub(crate) enum Section {
    /// An event of the run itself.
    Run(Item),
    /// A node visit.
    Node(Visit),
}

impl Section {
    /// The run event, if it is one.
    pub(crate) fn run(&self) -> Option<&Item> {
        match self {
            Section::Run(i) => Some(i),
            Section::Node(_) => None,
        }
    }

    /// The node visit, if it is one.
    pub(crate) fn visit(&self) -> Option<&Visit> {
        match self {
            Section::Node(v) => Some(v),
            Section::Run(_) => None,
        }
    }
}

fn text(v: &Value, key: &str) -> String {
    match &v[key] {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// One line saying what an event is.
fn summary(kind: &str, p: &Value) -> String {
    let t = |k: &str| text(p, k);
    match kind {
        "run_started" => format!("started by {}", t("caller")),
        "node_started" => format!("node {} started", t("node")),
        "model_call_scheduled" => format!("model step {}", t("step")),
        "model_call_completed" => format!(
            "answered ({} tool call(s)); tokens in {} / out {}",
            p["tool_calls"].as_array().map(Vec::len).unwrap_or(0),
            text(&p["usage"], "input_tokens"),
            text(&p["usage"], "output_tokens")
        ),
        "model_call_attempt_failed" => {
            format!("attempt {} failed: {}", t("attempt"), cut(&t("error"), 160))
        }
        "tool_call_refused" => format!(
            "{} refused ({}): {}",
            t("tool"),
            t("check"),
            cut(&t("reason"), 160)
        ),
        "tool_call_scheduled" => format!(
            "{}{} scheduled ({})",
            if p["starts_node"] == true {
                format!("node {} started: ", t("node"))
            } else {
                String::new()
            },
            t("tool"),
            t("repeat_safety")
        ),
        "tool_call_dispatched" => {
            format!("attempt {} dispatched to {}", t("attempt"), t("worker_id"))
        }
        "tool_call_attempt_failed" => format!(
            "attempt {} failed ({}, dispatched: {}): {}",
            t("attempt"),
            t("class"),
            t("dispatched"),
            cut(&t("error"), 160)
        ),
        "tool_call_completed" => format!(
            "attempt {} completed: {}{}",
            t("attempt"),
            short(&p["result"], 120),
            if p["ends_node"] == true {
                "; its node completed"
            } else {
                ""
            }
        ),
        "tool_call_failed" => format!("failed: {}", cut(&t("error"), 160)),
        "task_lease_expired" => format!(
            "attempt {}: lease expired (dispatched: {})",
            t("attempt"),
            t("dispatched")
        ),
        "uncertain_outcome_recorded" => format!("uncertain outcome: {}", cut(&t("reason"), 160)),
        "reconcile_probe_scheduled" => format!("reconcile probe {} scheduled", t("tool")),
        "reconcile_probe_finished" => {
            format!("probe found: {} {}", t("outcome"), cut(&t("detail"), 120))
        }
        "uncertain_outcome_resolved" => format!(
            "resolved {} by {} (via {}): {}",
            t("resolution"),
            t("resolved_by"),
            t("via"),
            cut(&t("reason"), 120)
        ),
        "run_paused" => format!("paused: {}", cut(&t("reason"), 160)),
        "run_resumed" | "operator_pause_lifted" => {
            format!("resumed by {}: {}", t("by"), t("reason"))
        }
        "signal_received" => format!(
            "signal {} ({}) from {}",
            t("name"),
            t("signal_id"),
            t("sent_by")
        ),
        "wait_started" => format!("waiting for {}", short(&p["signals"], 80)),
        "timer_fired" => format!("timer {} fired", t("timer_id")),
        "approval_requested" => format!("approval by a holder of {}", t("approver_grant")),
        "approval_decided" | "confirmation_decided" => format!(
            "{} by {}: {}",
            if p["approved"] == Value::Bool(true) {
                "approved"
            } else {
                "declined"
            },
            t("by"),
            cut(&t("reason"), 120)
        ),
        "confirmation_requested" => format!(
            "{} waits for a confirmation by a holder of {}",
            t("tool"),
            t("approver_grant")
        ),
        "tool_call_input_requested" => format!("the tool asks a person ({})", t("via")),
        "tool_call_input_provided" => format!("answered by {}", t("by")),
        "node_completed" => format!(
            "completed → {}",
            if t("next").is_empty() {
                "end".into()
            } else {
                t("next")
            }
        ),
        "node_passed" => match t("next") {
            next if next.is_empty() => format!("node {} passed", t("node")),
            next => format!("node {} passed → {next}", t("node")),
        },
        "run_completed" => format!("completed: {}", short(&p["output"], 160)),
        "run_failed" => format!("failed: {}", cut(&t("error"), 200)),
        "run_cancelled" => format!("cancelled: {}", cut(&t("reason"), 200)),
        other => other.replace('_', " "),
    }
}

fn item(e: &EventRow) -> Item {
    Item {
        seq: e.seq,
        kind: e.kind.clone(),
        at: when(&e.recorded_at),
        summary: summary(&e.kind, &e.payload),
        raw: pretty(&e.payload),
    }
}

/// Folds events into sections.
#[derive(Default)]
struct Builder {
    sections: Vec<Section>,
    /// Section index of each node's latest visit.
    visit_of: BTreeMap<String, usize>,
    visits: BTreeMap<String, u32>,
    /// Section and call index of each call id (probes under their call).
    call_of: BTreeMap<String, (usize, usize)>,
}

impl Builder {
    fn visit(&mut self, node: &str, start: bool) -> usize {
        if let (false, Some(&i)) = (start, self.visit_of.get(node)) {
            return i;
        }
        let n = self.visits.entry(node.to_owned()).or_insert(0);
        *n += 1;
        self.sections.push(Section::Node(Visit {
            node: node.to_owned(),
            visit: *n,
            events: Vec::new(),
            calls: Vec::new(),
        }));
        let i = self.sections.len() - 1;
        self.visit_of.insert(node.to_owned(), i);
        i
    }

    fn open_call(&mut self, section: usize, call_id: &str, e: &EventRow) -> Option<(usize, usize)> {
        let Section::Node(v) = &mut self.sections[section] else {
            return None;
        };
        let p = &e.payload;
        let mut call = Call {
            call_id: call_id.to_owned(),
            ..Call::default()
        };
        match e.kind.as_str() {
            "model_call_scheduled" => {
                call.kind = "model".into();
                call.title = format!("model step {}", text(p, "step"));
            }
            "child_run_started" => {
                call.kind = "child".into();
                call.title = format!(
                    "child run {} of {}",
                    text(p, "child_run_id"),
                    text(p, "workflow")
                );
            }
            _ => {
                call.kind = if e.kind == "confirmation_requested" {
                    "confirmation"
                } else {
                    "tool"
                }
                .into();
                call.title = text(p, "tool");
                call.arguments = Some(pretty(&p["arguments"]));
                call.idempotency_key = text(p, "idempotency_key");
                call.repeat_safety = text(p, "repeat_safety");
            }
        }
        v.calls.push(call);
        let at = (section, v.calls.len() - 1);
        self.call_of.insert(call_id.to_owned(), at);
        Some(at)
    }

    fn add(&mut self, e: &EventRow) {
        let p = &e.payload;
        let node = text(p, "node");
        let call_id = text(p, "call_id");
        if e.kind == "reconcile_probe_scheduled"
            && let Some(&at) = self.call_of.get(&call_id)
        {
            self.call_of.insert(text(p, "probe_call_id"), at);
        }
        let at = match (
            self.call_of.get(&call_id).copied(),
            node.is_empty(),
            call_id.is_empty(),
        ) {
            (Some(at), _, _) => Some(at),
            (None, false, false) => {
                // A call that starts its node (`starts_node`) opens a visit.
                let section = self.visit(&node, p["starts_node"] == true);
                self.open_call(section, &call_id, e)
            }
            _ => None,
        };
        if let Some((s, c)) = at {
            if let Section::Node(v) = &mut self.sections[s] {
                note_attempt(&mut v.calls[c], e);
                v.calls[c].events.push(item(e));
            }
            return;
        }
        if node.is_empty() {
            self.sections.push(Section::Run(item(e)));
            return;
        }
        let section = self.visit(
            &node,
            matches!(e.kind.as_str(), "node_started" | "node_passed"),
        );
        if let Section::Node(v) = &mut self.sections[section] {
            v.events.push(item(e));
        }
    }
}

/// What an event says of a call's attempts, usage or answer.
fn note_attempt(call: &mut Call, e: &EventRow) {
    let p = &e.payload;
    if e.kind == "model_call_completed" {
        call.usage = format!(
            "{} in / {} out tokens",
            text(&p["usage"], "input_tokens"),
            text(&p["usage"], "output_tokens")
        );
        let names: Vec<String> = p["tool_calls"]
            .as_array()
            .map(|a| a.iter().map(|c| text(c, "name")).collect())
            .unwrap_or_default();
        let content = text(p, "content");
        call.answer = Some(if names.is_empty() {
            content
        } else {
            format!("{content}\n→ proposes: {}", names.join(", "))
                .trim()
                .to_owned()
        });
    }
    // A reconcile probe's own attempts are not the call's.
    let Some(n) = p["attempt"]
        .as_u64()
        .filter(|_| text(p, "call_id") == call.call_id)
    else {
        return;
    };
    let at = when(&e.recorded_at);
    let ended = match e.kind.as_str() {
        "tool_call_dispatched" => {
            let a = attempt(call, n);
            a.dispatched = format!("{at} on {}", text(p, "worker_id"));
            return;
        }
        "tool_call_completed" | "model_call_completed" => format!("{at}: completed"),
        "tool_call_attempt_failed" | "model_call_attempt_failed" => {
            format!(
                "{at}: failed ({}) {}",
                text(p, "class"),
                cut(&text(p, "error"), 100)
            )
        }
        "tool_call_failed" => format!("{at}: failed for good"),
        "task_lease_expired" => format!("{at}: lease expired"),
        "uncertain_outcome_recorded" => format!("{at}: uncertain"),
        "late_result_recorded" => format!("{at}: late result"),
        _ => return,
    };
    attempt(call, n).ended = ended;
}

fn attempt(call: &mut Call, n: u64) -> &mut Attempt {
    if let Some(i) = call.attempts.iter().position(|a| a.n == n) {
        return &mut call.attempts[i];
    }
    call.attempts.push(Attempt {
        n,
        ..Attempt::default()
    });
    let last = call.attempts.len() - 1;
    &mut call.attempts[last]
}

/// The timeline of `events` (in seq order).
pub(crate) fn build(events: &[EventRow]) -> Vec<Section> {
    let mut b = Builder::default();
    for e in events {
        b.add(e);
    }
    b.sections
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(seq: i64, payload: Value) -> EventRow {
        EventRow {
            run_id: uuid::Uuid::nil(),
            seq,
            kind: payload["type"].as_str().unwrap_or_default().to_owned(),
            payload,
            recorded_at: chrono::Utc::now(),
        }
    }

    #[test]
    fn events_group_by_visit_and_call() {
        let events = [
            ev(1, json!({"type": "run_started", "caller": "c"})),
            ev(2, json!({"type": "node_started", "node": "n"})),
            ev(
                3,
                json!({"type": "tool_call_scheduled", "node": "n", "call_id": "n.t1", "tool": "create", "arguments": {"a": 1}, "idempotency_key": "r/n.t1", "repeat_safety": "reconcile"}),
            ),
            ev(
                4,
                json!({"type": "tool_call_dispatched", "call_id": "n.t1", "attempt": 1, "worker_id": "w0"}),
            ),
            ev(
                5,
                json!({"type": "task_lease_expired", "call_id": "n.t1", "attempt": 1, "dispatched": true}),
            ),
            ev(
                6,
                json!({"type": "reconcile_probe_scheduled", "call_id": "n.t1", "probe_call_id": "n.t1.p1", "tool": "find"}),
            ),
            ev(
                7,
                json!({"type": "tool_call_dispatched", "call_id": "n.t1.p1", "attempt": 1, "worker_id": "w1"}),
            ),
            ev(8, json!({"type": "run_paused", "reason": "uncertain"})),
            ev(
                9,
                json!({"type": "node_completed", "node": "n", "next": null}),
            ),
        ];
        let sections = build(&events);
        assert_eq!(sections.len(), 3);
        let Section::Node(v) = &sections[1] else {
            panic!("a visit")
        };
        assert_eq!((v.node.as_str(), v.visit, v.events.len()), ("n", 1, 2));
        assert_eq!(v.calls.len(), 1);
        let call = &v.calls[0];
        assert_eq!(
            (call.title.as_str(), call.repeat_safety.as_str()),
            ("create", "reconcile")
        );
        assert_eq!(
            call.events.len(),
            5,
            "the probe's events are under its call"
        );
        assert!(
            call.attempts[0].dispatched.ends_with("on w0"),
            "{}",
            call.attempts[0].dispatched
        );
        assert!(call.attempts[0].ended.ends_with("lease expired"));
        assert!(matches!(&sections[2], Section::Run(i) if i.summary == "paused: uncertain"));
    }

    #[test]
    fn a_call_that_starts_its_node_opens_a_visit_and_its_result_ends_it() {
        let scheduled = |seq, call: &str| {
            ev(
                seq,
                json!({"type": "tool_call_scheduled", "node": "call", "call_id": call, "tool": "noop", "arguments": {}, "idempotency_key": "k", "repeat_safety": "idempotent", "starts_node": true}),
            )
        };
        let completed = |seq, call: &str| {
            ev(
                seq,
                json!({"type": "tool_call_completed", "call_id": call, "attempt": 1, "result": {"ok": true}, "ends_node": true}),
            )
        };
        let events = [
            ev(1, json!({"type": "run_started", "caller": "c"})),
            scheduled(2, "call.t1"),
            completed(3, "call.t1"),
            scheduled(4, "call~2.t1"),
            completed(5, "call~2.t1"),
        ];
        let sections = build(&events);
        let visits: Vec<(&str, u32, usize)> = sections
            .iter()
            .filter_map(|s| match s {
                Section::Node(v) => Some((v.node.as_str(), v.visit, v.calls.len())),
                Section::Run(_) => None,
            })
            .collect();
        assert_eq!(visits, vec![("call", 1, 1), ("call", 2, 1)]);
        let Section::Node(second) = &sections[2] else {
            panic!("a visit")
        };
        let lines: Vec<&str> = second.calls[0]
            .events
            .iter()
            .map(|i| i.summary.as_str())
            .collect();
        assert_eq!(
            lines,
            [
                "node call started: noop scheduled (idempotent)",
                "attempt 1 completed: {\"ok\":true}; its node completed"
            ]
        );
    }

    #[test]
    fn each_node_passed_is_a_visit_of_its_own() {
        let events = [
            ev(1, json!({"type": "run_started", "caller": "c"})),
            ev(
                2,
                json!({"type": "node_passed", "node": "count", "output": {"n": 1}}),
            ),
            ev(
                3,
                json!({"type": "node_passed", "node": "again", "output": {"case": 1, "next": "count"}, "next": "count"}),
            ),
            ev(
                4,
                json!({"type": "node_passed", "node": "count", "output": {"n": 2}}),
            ),
        ];
        let sections = build(&events);
        let visits: Vec<(&str, u32, usize)> = sections
            .iter()
            .filter_map(|s| match s {
                Section::Node(v) => Some((v.node.as_str(), v.visit, v.events.len())),
                Section::Run(_) => None,
            })
            .collect();
        assert_eq!(
            visits,
            vec![("count", 1, 1), ("again", 1, 1), ("count", 2, 1)]
        );
        let Section::Node(again) = &sections[2] else {
            panic!("a visit")
        };
        assert_eq!(again.events[0].summary, "node again passed → count");
    }
}
