//! Child runs: a `workflow` node or a `type: workflow` tool starts a child
//! once, a sync parent waits for its output, and a failure, a timeout, a
//! cancel or the run's deadline reaches the child.

#![allow(clippy::unwrap_used)]

use serde_json::{Value, json};

use super::{cancelled, plan_with, timers};
use crate::tests::Run;
use crate::*;

const PARENT: &str = r#"kind: workflow
name: parent
nodes:
  - id: kyc
    type: workflow
    workflow: child
    input: "${ {email: .input.email} }"
    timeout: 1d
    on_error: manual
    next: done
  - {id: done, type: succeed, output: "${ .nodes.kyc.output }"}
  - {id: manual, type: succeed, output: "${ {manual: .nodes.kyc.output.error} }"}
---
kind: workflow
name: child
nodes:
  - {id: only, type: succeed}
"#;

fn child_start(d: &Decision) -> (String, String, Value, bool) {
    d.commands
        .iter()
        .find_map(|c| match c {
            Command::StartChildRun {
                call_id,
                child_run_id,
                input,
                sync,
                ..
            } => Some((call_id.clone(), child_run_id.clone(), input.clone(), *sync)),
            _ => None,
        })
        .expect("a child run is started")
}

#[test]
fn a_sync_child_is_started_once_waited_for_and_its_output_is_the_nodes() {
    let (mut run, d) = Run::start_workflow(PARENT, json!({"email": "a@x.io"}));
    let (call_id, child, input, sync) = child_start(&d);
    assert_eq!(call_id, "kyc.c1");
    assert!(sync);
    assert_eq!(input, json!({"email": "a@x.io"}));
    // The id is derived, so a replay (or a second start) names the same run.
    assert_eq!(child, child_run_id("r1", "kyc.c1"));
    assert_eq!(timers(&d)[0].timer_id, "kyc.timeout");
    assert_eq!(run.state.status, RunStatus::Waiting);

    // A report about another child changes nothing.
    let other = run.step(Input::ChildRunFinished {
        child_run_id: "not-mine".into(),
        status: "completed".into(),
        output: Some(json!(1)),
        error: None,
    });
    assert!(other.events.is_empty());

    let d = run.step(Input::ChildRunFinished {
        child_run_id: child.clone(),
        status: "completed".into(),
        output: Some(json!({"kyc": "clear"})),
        error: None,
    });
    assert_eq!(cancelled(&d), vec!["kyc.timeout"]);
    assert_eq!(run.state.output, Some(json!({"kyc": "clear"})));
    // A second report of the same end is ignored (the outbox is at least once).
    let again = decide(
        &run.state,
        Input::ChildRunFinished {
            child_run_id: child,
            status: "completed".into(),
            output: Some(json!({"kyc": "clear"})),
            error: None,
        },
    )
    .unwrap();
    assert!(again.events.is_empty());
}

#[test]
fn a_failed_child_takes_on_error_and_a_timeout_cancels_the_child() {
    let (mut run, d) = Run::start_workflow(PARENT, json!({"email": "a@x.io"}));
    let (_, child, _, _) = child_start(&d);
    run.step(Input::ChildRunFinished {
        child_run_id: child,
        status: "failed".into(),
        output: None,
        error: Some("no such person".into()),
    });
    assert_eq!(run.state.output, Some(json!({"manual": "no such person"})));

    let (mut run, d) = Run::start_workflow(PARENT, json!({"email": "a@x.io"}));
    let (_, child, _, _) = child_start(&d);
    let d = run.step(Input::TimerFired {
        timer_id: "kyc.timeout".into(),
        overdue_ms: 0,
    });
    assert!(d.commands.iter().any(
        |c| matches!(c, Command::CancelChildRun { child_run_id, .. } if *child_run_id == child)
    ));
    assert_eq!(run.state.status, RunStatus::Failed);
    assert!(
        run.state
            .status_reason
            .contains("did not finish within 1 day"),
        "{}",
        run.state.status_reason
    );
}

#[test]
fn cancelling_a_parent_cancels_its_sync_child_and_an_async_child_does_not_block() {
    let (mut run, d) = Run::start_workflow(PARENT, json!({"email": "a@x.io"}));
    let (_, child, _, _) = child_start(&d);
    let d = run.step(Input::Cancel {
        reason: "customer left".into(),
    });
    assert!(d.commands.iter().any(
        |c| matches!(c, Command::CancelChildRun { child_run_id, .. } if *child_run_id == child)
    ));

    let wf = "kind: workflow\nname: p\nnodes:\n  - {id: fire, type: workflow, workflow: c, mode: async}\n---\nkind: workflow\nname: c\nnodes:\n  - {id: x, type: succeed}\n";
    let (run, d) = Run::start_workflow(wf, json!({}));
    let (_, child, _, sync) = child_start(&d);
    assert!(!sync);
    assert_eq!(run.state.status, RunStatus::Completed);
    assert_eq!(run.state.output, Some(json!({"run_id": child})));
}

const WORKFLOW_TOOLS: &str = r#"TOOLS:
  create_account(email: string, plan?: string = "starter") -> {account_id: string}
    description: "Create an account"
    type: http
    endpoint: "/accounts"
    permission: crm.write
    repeat_safety: reconcile
  run_kyc(customer_email: string) -> {status: string}
    description: "Runs the KYC workflow for a customer"
    type: workflow
    workflow_id: kyc
    mode: sync
    timeout_ms: 60000
    param_mapping:
      email: customer_email
    permission: crm.write
    repeat_safety: idempotent
"#;

#[test]
fn a_workflow_tool_starts_a_child_with_mapped_params_and_its_output_is_the_result() {
    let wf = r#"kind: workflow
name: w
nodes:
  - {id: check, type: tool, tool: run_kyc, args: {customer_email: "${ .input.email }"}, grants: [crm.write]}
---
kind: workflow
name: kyc
nodes:
  - {id: ok, type: succeed, output: {status: clear}}
"#;
    let (mut run, d) = Run::start_plan(plan_with(WORKFLOW_TOOLS, wf), json!({"email": "a@x.io"}));
    // No task: the engine starts the child itself.
    assert!(
        d.commands
            .iter()
            .all(|c| !matches!(c, Command::ScheduleTask { .. }))
    );
    let (call_id, child, input, sync) = child_start(&d);
    assert_eq!((call_id.as_str(), sync), ("check.t1", true));
    assert_eq!(
        input,
        json!({"email": "a@x.io"}),
        "param_mapping renames the parameter"
    );
    assert_eq!(timers(&d)[0].timer_id, "check.t1.timeout");
    // The run waits visibly, holding no task.
    assert_eq!(run.state.status, RunStatus::Waiting);
    assert!(
        run.state.status_reason.contains("waits for child run"),
        "{}",
        run.state.status_reason
    );
    let d = run.step(Input::ChildRunFinished {
        child_run_id: child,
        status: "completed".into(),
        output: Some(json!({"status": "clear"})),
        error: None,
    });
    assert_eq!(cancelled(&d), vec!["check.t1.timeout"]);
    assert_eq!(run.state.status, RunStatus::Completed);
    assert_eq!(run.state.output, Some(json!({"status": "clear"})));

    // Its timeout fails the call (and cancels the child).
    let (mut run, d) = Run::start_plan(plan_with(WORKFLOW_TOOLS, wf), json!({"email": "a@x.io"}));
    let (_, child, _, _) = child_start(&d);
    let d = run.step(Input::TimerFired {
        timer_id: "check.t1.timeout".into(),
        overdue_ms: 0,
    });
    assert!(d.commands.iter().any(
        |c| matches!(c, Command::CancelChildRun { child_run_id, .. } if *child_run_id == child)
    ));
    assert_eq!(run.state.status, RunStatus::Failed);
    assert!(
        run.state.status_reason.contains("did not finish within 1m"),
        "{}",
        run.state.status_reason
    );
}

#[test]
fn a_run_deadline_during_a_sync_child_cancels_the_child_and_fails_the_run() {
    // The parent's `budget:` bounds the whole run's wall time, whatever
    // node it is in; the child has its own (longer) timeout.
    let wf = PARENT.replacen(
        "name: parent\n",
        "name: parent\nbudget:\n  max_wall_time: 6h\n",
        1,
    );
    let (mut run, d) = Run::start_workflow(&wf, json!({"email": "a@x.io"}));
    let (_, child, _, _) = child_start(&d);
    let ids: Vec<String> = timers(&d).into_iter().map(|t| t.timer_id).collect();
    assert_eq!(ids, vec![RUN_DEADLINE_TIMER, "kyc.timeout"]);
    assert_eq!(run.state.status, RunStatus::Waiting);
    let d = run.step(Input::TimerFired {
        timer_id: RUN_DEADLINE_TIMER.into(),
        overdue_ms: 1_500,
    });
    assert_eq!(run.history_kinds().last().copied(), Some("run_failed"));
    assert!(d.commands.iter().any(
        |c| matches!(c, Command::CancelChildRun { child_run_id, reason } if *child_run_id == child && reason.contains("wall_time"))
    ));
    let stop = d.events.iter().find_map(|e| match e {
        Event::RunFailed { stop, .. } => stop.clone(),
        _ => None,
    });
    assert_eq!(
        stop,
        Some(Stop::Deadline {
            scope: "run".into(),
            node: "kyc".into(),
            limit_ms: 6 * 3_600_000,
            elapsed_ms: 6 * 3_600_000 + 1_500,
        })
    );
    assert_eq!(run.state.status, RunStatus::Failed);
    // The child's own timeout, due later, finds the run ended: stale.
    let stale = run.step(Input::TimerFired {
        timer_id: "kyc.timeout".into(),
        overdue_ms: 0,
    });
    assert!(stale.events.is_empty());
}
