//! `node_passed` (issue 23): a node that starts and ends in one decision
//! (`set`, `branch`, `succeed`) is one event where the fleet reads it
//! (`RunState::fleet_level` at least `level::NODE_PASSED`), two otherwise, and both fold to the same
//! state.

use serde_json::json;

use super::loop_shape;
use crate::tests::Run;
use crate::*;

/// The loop at the level that writes `node_passed` (and not the folds of
/// a later level), or below it; the kinds of each decision that completed
/// a call.
fn run_loop(node_passed: bool) -> (Run, Vec<Vec<&'static str>>) {
    let level = if node_passed { level::NODE_PASSED } else { 1 };
    let (run, mut decisions) = loop_shape::run_loop("noop", level);
    decisions.remove(0);
    (run, decisions)
}

#[test]
fn a_loop_step_passes_its_set_and_branch_in_one_event_each() {
    let (run, decisions) = run_loop(true);
    assert_eq!(
        decisions[0],
        [
            "tool_call_completed",
            "node_completed",
            "node_passed",
            "node_passed",
            "node_started",
            "tool_call_scheduled"
        ]
    );
    assert_eq!(
        decisions[2],
        [
            "tool_call_completed",
            "node_completed",
            "node_passed",
            "node_passed",
            "node_passed",
            "run_completed"
        ]
    );
    assert_eq!(run.state.status, RunStatus::Completed);
    assert_eq!(run.state.output, Some(json!({"n": 3})));
}

#[test]
fn below_the_level_a_node_is_started_and_completed_and_both_fold_alike() {
    let (old, old_decisions) = run_loop(false);
    let (new, _) = run_loop(true);
    assert_eq!(
        old_decisions[0],
        [
            "tool_call_completed",
            "node_completed",
            "node_started",
            "node_completed",
            "node_started",
            "node_completed",
            "node_started",
            "tool_call_scheduled"
        ]
    );
    assert!(!old.history_kinds().contains(&"node_passed"));
    // Seven nodes passed (three `set`, three `branch`, one `succeed`):
    // seven events fewer, and the same state but for the seqs.
    assert_eq!(old.history.len(), new.history.len() + 7);
    assert_eq!(loop_shape::seqs_aside(&old), loop_shape::seqs_aside(&new));
    // A node's span begins at the event that started it.
    assert_eq!(new.state.node_started_seq, new.state.last_seq - 1);
}

#[test]
fn a_branch_whose_case_fails_is_started_and_fails_the_run_as_before() {
    let wf = "kind: workflow\nname: w\nnodes:\n  - id: b\n    type: branch\n    cases:\n      - when: \"${ .input + 1 }\"\n        next: done\n  - {id: done, type: succeed}\n";
    for node_passed in [false, true] {
        let (run, d) = loop_shape::start_at(wf, if node_passed { level::NODE_PASSED } else { 1 });
        assert_eq!(
            Run::kinds(&d),
            ["run_started", "node_started", "run_failed"]
        );
        assert!(
            run.state
                .status_reason
                .starts_with("node `b`: `when` of case 1:"),
            "{}",
            run.state.status_reason
        );
    }
}

#[test]
fn node_passed_survives_its_json_round_trip_without_a_next() {
    let e = Event::NodePassed {
        node: "count".into(),
        output: json!({"n": 1}),
        next: None,
    };
    let v = serde_json::to_value(&e).expect("serialise");
    assert_eq!(
        v,
        json!({"type": "node_passed", "node": "count", "output": {"n": 1}})
    );
    let back: Event = serde_json::from_value(v).expect("deserialise");
    assert_eq!(back, e);
    assert_eq!(e.kind(), "node_passed");
}
