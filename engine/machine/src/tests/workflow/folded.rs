//! A tool node folded into its call's events (issue 23, behaviour level
//! `level::FOLDED_TOOL_NODE`): the node's start rides on the call's
//! `tool_call_scheduled` (`starts_node`) when its input is the call's
//! arguments, and its end on the call's `tool_call_completed`
//! (`ends_node`) when its output is the call's result; below the level,
//! or when anything differs, the node's own events are written, and both
//! forms fold to the same state.

use serde_json::json;

use super::loop_shape;
use crate::tests::Run;
use crate::*;

#[test]
fn a_loop_step_is_its_calls_events_and_its_passed_nodes() {
    let (run, decisions) = loop_shape::run_loop("noop", level::FOLDED_TOOL_NODE);
    assert_eq!(decisions[0], ["run_started", "tool_call_scheduled"]);
    assert_eq!(
        decisions[1],
        [
            "tool_call_completed",
            "node_passed",
            "node_passed",
            "tool_call_scheduled"
        ]
    );
    assert_eq!(
        decisions[3],
        [
            "tool_call_completed",
            "node_passed",
            "node_passed",
            "node_passed",
            "run_completed"
        ]
    );
    assert!(run.history.iter().all(|e| match e {
        Event::ToolCallScheduled { starts_node, .. } => *starts_node,
        Event::ToolCallCompleted { ends_node, .. } => *ends_node,
        _ => true,
    }));
    assert_eq!(run.state.status, RunStatus::Completed);
    assert_eq!(run.state.output, Some(json!({"n": 3})));
    // The node's span begins at the call's scheduling.
    let (old, _) = loop_shape::run_loop("noop", level::NODE_PASSED);
    // Three starts and three ends fewer, the same state but for the seqs.
    assert_eq!(old.history.len(), run.history.len() + 6);
    assert_eq!(loop_shape::seqs_aside(&old), loop_shape::seqs_aside(&run));
}

#[test]
fn below_the_level_a_tool_node_is_started_and_completed() {
    let (run, decisions) = loop_shape::run_loop("noop", level::NODE_PASSED);
    assert_eq!(
        decisions[0],
        ["run_started", "node_started", "tool_call_scheduled"]
    );
    assert_eq!(decisions[1][..2], ["tool_call_completed", "node_completed"]);
    assert!(!run.history.iter().any(|e| matches!(
        e,
        Event::ToolCallScheduled {
            starts_node: true,
            ..
        } | Event::ToolCallCompleted {
            ends_node: true,
            ..
        }
    )));
}

#[test]
fn a_call_whose_result_sets_vars_ends_its_node_in_its_own_event() {
    let (run, decisions) = loop_shape::run_loop("noted", level::FOLDED_TOOL_NODE);
    // The start still folds; `tool_vars_set` stands between the result and
    // the node's end, which keeps its own event.
    assert_eq!(decisions[0], ["run_started", "tool_call_scheduled"]);
    assert_eq!(
        decisions[1][..3],
        ["tool_call_completed", "tool_vars_set", "node_completed"]
    );
    assert_eq!(run.state.vars.get("noted"), Some(&json!(true)));
    let (old, _) = loop_shape::run_loop("noted", 1);
    assert_eq!(loop_shape::seqs_aside(&old), loop_shape::seqs_aside(&run));
}

#[test]
fn a_call_whose_arguments_differ_from_the_nodes_input_starts_the_node_in_its_own_event() {
    // The default of `pad` is filled in: the call's arguments are not the
    // node's input, which keeps its own event; the end still folds.
    let (run, decisions) = loop_shape::run_loop("padded", level::FOLDED_TOOL_NODE);
    assert_eq!(
        decisions[0],
        ["run_started", "node_started", "tool_call_scheduled"]
    );
    assert_eq!(
        decisions[1],
        [
            "tool_call_completed",
            "node_passed",
            "node_passed",
            "node_started",
            "tool_call_scheduled"
        ]
    );
    let (old, _) = loop_shape::run_loop("padded", 1);
    assert_eq!(loop_shape::seqs_aside(&old), loop_shape::seqs_aside(&run));
}

#[test]
fn a_failed_call_taking_on_error_completes_its_node_in_its_own_event() {
    let wf = "kind: workflow\nname: w\nnodes:\n  - {id: call, type: tool, tool: noop, args: {i: 1}, grants: [crm.write], on_error: failed, next: done}\n  - {id: done, type: succeed}\n  - {id: failed, type: succeed, output: failed}\n";
    let (mut run, _) = loop_shape::start_at(wf, level::FOLDED_TOOL_NODE);
    let d = run.step(Input::TaskFailed {
        call_id: "call.t1".into(),
        attempt: 1,
        error: "HTTP 400: no".into(),
        class: FailureClass::Rejected,
        dispatched: true,
        status_code: Some(400),
    });
    assert_eq!(
        Run::kinds(&d),
        [
            "tool_call_attempt_failed",
            "tool_call_failed",
            "node_completed",
            "node_passed",
            "run_completed"
        ]
    );
    assert_eq!(run.state.output, Some(json!("failed")));
}

#[test]
fn the_folded_fields_are_left_out_of_the_json_when_false() {
    let completed = |ends_node| Event::ToolCallCompleted {
        call_id: "call.t1".into(),
        attempt: 1,
        result: json!({"ok": true}),
        cached: None,
        ends_node,
    };
    let v = serde_json::to_value(completed(false)).expect("serialise");
    assert_eq!(v.get("ends_node"), None);
    let v = serde_json::to_value(completed(true)).expect("serialise");
    assert_eq!(v["ends_node"], json!(true));
    let back: Event = serde_json::from_value(v).expect("deserialise");
    assert_eq!(back, completed(true));
}
