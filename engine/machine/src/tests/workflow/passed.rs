//! `node_passed` (issue 23): a node that starts and ends in one decision
//! (`set`, `branch`, `succeed`) is one event where the fleet reads it
//! (`RunState::node_passed`), two otherwise, and both fold to the same
//! state.

use serde_json::json;

use crate::tests::{Run, plan_files};
use crate::*;

const NOOP: &str = r#"TOOLS:
  noop(i: number) -> {ok: boolean}
    description: "Does nothing"
    type: http
    endpoint: "/noop"
    permission: crm.write
    repeat_safety: idempotent
"#;

const AGENT: &str =
    "kind: agent\nname: a\nmodel: m\ninstructions: i\ntools: [noop]\ngrants: [crm.write]\n";

/// The benchmark's loop shape: a tool node, a `set` and a `branch`, three
/// times round, then `succeed`.
const LOOP: &str = r#"kind: workflow
name: w
nodes:
  - id: call
    type: tool
    tool: noop
    args: {i: "${ .vars.n // 0 }"}
    grants: [crm.write]
    next: count
  - id: count
    type: set
    values: {n: "${ (.vars.n // 0) + 1 }"}
    next: again
  - id: again
    type: branch
    cases:
      - when: "${ .vars.n < 3 }"
        next: call
    default: done
  - id: done
    type: succeed
    output: "${ {n: .vars.n} }"
"#;

/// Start `workflow` on a state that may (or may not) write `node_passed`.
fn start(workflow: &str, node_passed: bool) -> (Run, Decision) {
    let state = RunState {
        node_passed,
        ..RunState::default()
    };
    Run::start_plan_on(state, plan_files(NOOP, AGENT, workflow), json!({}))
}

/// Run the loop to its end, completing each call; the kinds of each
/// completion's decision.
fn run_loop(node_passed: bool) -> (Run, Vec<Vec<&'static str>>) {
    let (mut run, _) = start(LOOP, node_passed);
    let mut decisions = Vec::new();
    for call in ["call.t1", "call~2.t1", "call~3.t1"] {
        run.step(Input::DispatchToolCall {
            call_id: call.into(),
            attempt: 1,
            worker_id: "w".into(),
            callback_token_sha256: None,
            tenant_grants: None,
        });
        let d = run.step(Input::ToolCallCompleted {
            call_id: call.into(),
            attempt: 1,
            result: json!({"ok": true}),
            secrets: Vec::new(),
        });
        decisions.push(Run::kinds(&d));
    }
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
    let seqs_aside = |run: &Run| RunState {
        last_seq: 0,
        node_started_seq: 0,
        node_passed: false,
        ..run.state.clone()
    };
    assert_eq!(seqs_aside(&old), seqs_aside(&new));
    // A node's span begins at the event that started it.
    assert_eq!(new.state.node_started_seq, new.state.last_seq - 1);
}

#[test]
fn a_branch_whose_case_fails_is_started_and_fails_the_run_as_before() {
    let wf = "kind: workflow\nname: w\nnodes:\n  - id: b\n    type: branch\n    cases:\n      - when: \"${ .input + 1 }\"\n        next: done\n  - {id: done, type: succeed}\n";
    for node_passed in [false, true] {
        let (run, d) = start(wf, node_passed);
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
