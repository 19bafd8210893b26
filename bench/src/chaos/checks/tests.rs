//! Each check against a history that keeps it and one that breaks it.

use serde_json::json;

use super::*;
use crate::chaos::observe::{RunRow, TaskRow, UncertainRow};

const RUN: &str = "0193a000-0000-7000-8000-000000000001";

fn run_id() -> Uuid {
    Uuid::parse_str(RUN).expect("a uuid")
}

fn event(seq: i64, payload: Value) -> EventRow {
    EventRow {
        seq,
        kind: payload["type"].as_str().unwrap_or_default().to_owned(),
        payload,
    }
}

fn scheduled(seq: i64, call: &str, tool: &str) -> EventRow {
    event(
        seq,
        json!({"type": "tool_call_scheduled", "call_id": call, "tool": tool,
               "idempotency_key": format!("{RUN}/{call}")}),
    )
}

fn request(kind: ToolKind, call: &str) -> ToolRequest {
    ToolRequest {
        kind,
        run: RUN.to_owned(),
        call: call.to_owned(),
        key: Some(format!("{RUN}/{call}")),
        delay_ms: 0,
    }
}

/// One completed run whose four calls each reached their tool once.
fn healthy() -> Observed {
    let events = vec![
        event(1, json!({"type": "run_started"})),
        scheduled(2, "never.t1", "chaos_never"),
        event(
            3,
            json!({"type": "tool_call_completed", "call_id": "never.t1"}),
        ),
        scheduled(4, "idem.t1", "chaos_idempotent"),
        event(
            5,
            json!({"type": "tool_call_completed", "call_id": "idem.t1"}),
        ),
        scheduled(6, "plain.t1", "chaos_reconcile"),
        event(
            7,
            json!({"type": "tool_call_completed", "call_id": "plain.t1"}),
        ),
        event(8, json!({"type": "run_completed"})),
    ];
    Observed {
        submissions: vec![Submission {
            index: 0,
            key: "chaos-b-0".into(),
            run_ids: vec![run_id(), run_id()],
            attempts: 1,
            last_error: None,
        }],
        facts: Facts {
            runs: vec![RunRow {
                run_id: run_id(),
                idempotency_key: "chaos-b-0".into(),
                status: "completed".into(),
                reason: String::new(),
                last_seq: 8,
            }],
            events: [(run_id(), events)].into_iter().collect(),
            ..Facts::default()
        },
        requests: vec![
            request(ToolKind::Never, "never.t1"),
            request(ToolKind::Idempotent, "idem.t1"),
            request(ToolKind::Idempotent, "idem.t1"),
            request(ToolKind::Reconcile, "plain.t1"),
        ],
        lease_grace_ms: 1000.0,
        ..Observed::default()
    }
}

fn checks_failing(o: &Observed) -> Vec<&'static str> {
    let mut names: Vec<&str> = check(o).iter().map(|v| v.check).collect();
    names.dedup();
    names
}

#[test]
fn a_healthy_history_keeps_every_check() {
    assert_eq!(check(&healthy()), vec![]);
}

#[test]
fn a_run_never_acknowledged_or_missing_or_doubled_is_lost() {
    let mut o = healthy();
    o.submissions[0].run_ids.clear();
    o.submissions[0].last_error = Some("unavailable".into());
    assert_eq!(checks_failing(&o), ["no run lost"]);

    let mut o = healthy();
    o.submissions[0].run_ids[1] = Uuid::nil();
    assert_eq!(checks_failing(&o), ["no run lost"]);

    let mut o = healthy();
    let mut twin = o.facts.runs[0].clone();
    twin.run_id = Uuid::nil();
    o.facts.runs.push(twin);
    let found = check(&o);
    assert!(
        found
            .iter()
            .any(|v| v.check == "no run lost" && v.what.contains("names 2 runs")),
        "{found:?}"
    );
}

#[test]
fn a_run_stuck_or_paused_without_a_record_is_not_settled() {
    let mut o = healthy();
    o.facts.runs[0].status = "running".into();
    assert_eq!(checks_failing(&o), ["settled"]);

    let mut o = healthy();
    o.facts.runs[0].status = "paused".into();
    o.facts.runs[0].reason = "uncertain outcome of plain.t1".into();
    assert_eq!(checks_failing(&o), ["settled"]);
    o.facts.uncertain.push(UncertainRow {
        run_id: run_id(),
        call_id: "plain.t1".into(),
        status: "open".into(),
        resolved_via: None,
    });
    assert_eq!(check(&o), vec![], "paused with its open record is settled");

    let mut o = healthy();
    o.facts.runs[0].status = "waiting".into();
    o.facts.runs[0].reason = "waiting for a signal".into();
    assert_eq!(checks_failing(&o), ["settled"]);
    o.facts.wakeups.insert(run_id());
    assert_eq!(check(&o), vec![]);
}

#[test]
fn a_never_or_reconcile_call_sent_twice_breaks_at_most_once() {
    for (kind, call) in [
        (ToolKind::Never, "never.t1"),
        (ToolKind::Reconcile, "plain.t1"),
    ] {
        let mut o = healthy();
        o.requests.push(request(kind, call));
        let found = check(&o);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(
            (found[0].check, found[0].run),
            ("at most once", Some(run_id()))
        );
        assert!(found[0].what.contains("2 times"), "{}", found[0].what);
    }
    let mut o = healthy();
    o.requests.push(request(ToolKind::Never, "ghost.t9"));
    assert_eq!(checks_failing(&o), ["at most once"]);
}

#[test]
fn an_idempotent_call_with_a_second_key_breaks_one_key() {
    let mut o = healthy();
    o.requests[2].key = Some(format!("{RUN}/idem.t1-again"));
    assert_eq!(checks_failing(&o), ["one key"]);
    let mut o = healthy();
    o.requests[0].key = None;
    assert_eq!(checks_failing(&o), ["one key"]);
}

#[test]
fn a_missing_event_breaks_gapless_seq() {
    let mut o = healthy();
    if let Some(events) = o.facts.events.get_mut(&run_id()) {
        events.remove(3);
    }
    let found = check(&o);
    assert!(
        found
            .iter()
            .any(|v| v.check == "gapless seq" && v.what.contains("missing [4]")),
        "{found:?}"
    );
}

#[test]
fn a_task_still_leased_by_a_dead_worker_is_found_after_its_lease() {
    let mut o = healthy();
    o.dead_workers.insert("chaos-w0-0".into());
    let task = |worker: &str, over: f64| TaskRow {
        run_id: run_id(),
        call_id: "idem.t1".into(),
        status: "leased".into(),
        worker_id: Some(worker.into()),
        attempt: 2,
        lease_over_ms: Some(over),
    };
    o.facts.tasks = vec![task("chaos-w0-0", -500.0), task("chaos-w1-0", 9000.0)];
    assert_eq!(check(&o), vec![], "a live lease, or a live worker's");
    o.facts.tasks.push(task("chaos-w0-0", 5000.0));
    assert_eq!(checks_failing(&o), ["no task leased by a dead worker"]);
}

#[test]
fn a_reconcile_call_that_acted_without_result_or_record_is_lost() {
    let mut o = healthy();
    if let Some(events) = o.facts.events.get_mut(&run_id()) {
        events[6] = event(
            7,
            json!({"type": "tool_call_failed", "call_id": "plain.t1"}),
        );
    }
    let found = check(&o);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].check, "lost reconcile outcomes");
    assert!(
        found[0].what.contains("tool_call_failed"),
        "{}",
        found[0].what
    );
    o.facts.uncertain.push(UncertainRow {
        run_id: run_id(),
        call_id: "plain.t1".into(),
        status: "resolved".into(),
        resolved_via: Some("operator".into()),
    });
    assert_eq!(check(&o), vec![], "a resolved record accounts for it");
    o.facts.uncertain[0].status = "open".into();
    assert_eq!(
        checks_failing(&o),
        ["lost reconcile outcomes"],
        "open, yet the run completed"
    );
}

#[test]
fn malformed_requests_and_panics_are_violations() {
    let mut o = healthy();
    o.malformed
        .push("chaos_never received a body without run and call: {}".into());
    o.panics
        .push("engine-0.0.log: thread 'main' panicked at x.rs:1".into());
    assert_eq!(checks_failing(&o), ["clean requests", "no panics"]);
}
