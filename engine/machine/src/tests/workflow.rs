//! Machine tests of the workflow graph: branch, set, fail, succeed, tool
//! nodes, waits (signals, timers, timeouts), approvals and loops. Workflows
//! are written in YAML and parsed by the definitions layer, as in
//! production. Each step also checks replay = live and the JSON round trip.
//! Child runs and async webhooks are the modules below.

#![allow(clippy::unwrap_used)]

use serde_json::{Value, json};

use super::{Run, plan_files};
use crate::*;

mod children;
mod decisions;
mod folded;
mod loop_shape;
mod passed;
mod webhook;

const TOOLS: &str = r#"TOOLS:
  create_account(email: string, plan?: string = "starter") -> {account_id: string}
    description: "Create an account"
    type: http
    endpoint: "/accounts"
    permission: crm.write
    repeat_safety: reconcile
"#;

const AGENT: &str = "kind: agent\nname: a\nmodel: m\ninstructions: i\ntools: [create_account]\ngrants: [crm.write]\n";

/// A plan from a workflow YAML (plus the tool and agent above).
fn plan(workflow: &str) -> RunPlan {
    plan_with(TOOLS, workflow)
}

/// A plan from a tools file and a workflow YAML (plus the agent above).
fn plan_with(tools: &str, workflow: &str) -> RunPlan {
    plan_files(tools, AGENT, workflow)
}

impl Run {
    fn start_workflow(workflow: &str, input: Value) -> (Run, Decision) {
        Self::start_plan(plan(workflow), input)
    }

    fn signal(&mut self, id: &str, name: &str, payload: Value) -> Result<Decision, MachineError> {
        self.try_step(Input::Signal {
            signal_id: id.into(),
            name: name.into(),
            payload,
            sent_by: "test".into(),
        })
    }
}

fn timers(d: &Decision) -> Vec<TimerSpec> {
    d.commands
        .iter()
        .filter_map(|c| match c {
            Command::ScheduleTimer(t) => Some(t.clone()),
            _ => None,
        })
        .collect()
}

fn cancelled(d: &Decision) -> Vec<String> {
    d.commands
        .iter()
        .filter_map(|c| match c {
            Command::CancelTimer { timer_id } => Some(timer_id.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn branch_set_and_succeed_run_in_one_transition() {
    let wf = r#"kind: workflow
name: w
nodes:
  - id: route
    type: branch
    cases:
      - when: ${ .input.score > 50 }
        next: high
    default: low
  - id: high
    type: set
    values: {tier: gold, who: "${ .input.name }"}
    next: done
  - id: low
    type: set
    values: {tier: basic}
    next: done
  - id: done
    type: succeed
    output: "${ {tier: .vars.tier, who: .vars.who, route: .nodes.route.output.case} }"
"#;
    let (run, d) = Run::start_workflow(wf, json!({"score": 80, "name": "Ada"}));
    assert!(d.commands.is_empty());
    assert_eq!(run.state.status, RunStatus::Completed);
    assert_eq!(
        run.state.output,
        Some(json!({"tier": "gold", "who": "Ada", "route": 1}))
    );
    let (run, _) = Run::start_workflow(wf, json!({"score": 10}));
    assert_eq!(
        run.state.output,
        Some(json!({"tier": "basic", "who": null, "route": null}))
    );
}

#[test]
fn a_fail_node_fails_the_run_with_its_rendered_error() {
    let wf = "kind: workflow\nname: w\nnodes:\n  - id: stop\n    type: fail\n    error: \"no account for ${ .input.email }\"\n";
    let (run, _) = Run::start_workflow(wf, json!({"email": "x@example.com"}));
    assert_eq!(run.state.status, RunStatus::Failed);
    assert_eq!(
        run.state.status_reason,
        "node `stop`: no account for x@example.com"
    );
}

#[test]
fn an_expression_error_fails_the_run_and_names_the_node_and_key() {
    let wf = "kind: workflow\nname: w\nnodes:\n  - id: s\n    type: set\n    values: {n: \"${ .input.name + 1 }\"}\n";
    let (run, _) = Run::start_workflow(wf, json!({"name": "Ada"}));
    assert_eq!(run.state.status, RunStatus::Failed);
    assert!(
        run.state.status_reason.starts_with("node `s`: `values`:"),
        "{}",
        run.state.status_reason
    );
}

const WAIT: &str = r#"kind: workflow
name: w
nodes:
  - id: docs
    type: wait
    signal: documents_received
    payload_schema: {type: object, required: [files], properties: {files: {type: array}}}
    timeout: 7d
    on_timeout: remind
    next: done
  - id: remind
    type: set
    values: {reminded: true}
    next: docs
  - id: done
    type: succeed
    output: ${ .nodes.docs.output.payload }
"#;

#[test]
fn a_wait_sets_its_timeout_and_a_signal_ends_it() {
    let (mut run, d) = Run::start_workflow(WAIT, json!({}));
    assert_eq!(run.state.status, RunStatus::Waiting);
    assert!(
        run.state
            .status_reason
            .contains("signal `documents_received`"),
        "{}",
        run.state.status_reason
    );
    let t = timers(&d);
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].timer_id, "docs.timeout");
    assert_eq!(t[0].after_ms, Some(7 * 24 * 3600 * 1000));

    // A signal nobody waits for, and a payload the wait refuses: typed errors, nothing written.
    let before = run.history.len();
    assert!(matches!(
        run.signal("s0", "approved", json!({})),
        Err(MachineError::InvalidSignal(m)) if m.contains("waits for: documents_received")
    ));
    assert!(matches!(
        run.signal("s0", "documents_received", json!({"files": "nope"})),
        Err(MachineError::InvalidSignal(m)) if m.contains("payload_schema")
    ));
    assert_eq!(run.history.len(), before);

    let d = run
        .signal("s1", "documents_received", json!({"files": ["id.pdf"]}))
        .unwrap();
    assert_eq!(cancelled(&d), vec!["docs.timeout"]);
    assert_eq!(run.state.status, RunStatus::Completed);
    assert_eq!(run.state.output, Some(json!({"files": ["id.pdf"]})));

    // The same signal id again is applied once: no events.
    let again = decide(
        &run.state,
        Input::Signal {
            signal_id: "s1".into(),
            name: "documents_received".into(),
            payload: json!({"files": ["id.pdf"]}),
            sent_by: "t".into(),
        },
    );
    // Applied once already: accepted with nothing to write, even though the
    // run has completed (a sender retrying after a lost reply).
    assert!(again.is_ok_and(|d| d.events.is_empty() && d.commands.is_empty()));
    // A new signal to a completed run is refused.
    assert!(matches!(
        run.signal("s2", "documents_received", json!({"files": []})),
        Err(MachineError::WrongStatus { .. })
    ));
}

#[test]
fn a_signal_sent_before_the_wait_is_kept_and_a_duplicate_is_applied_once() {
    let wf = r#"kind: workflow
name: w
nodes:
  - {id: a, type: wait, signal: first, next: b}
  - {id: b, type: wait, signal: second}
"#;
    let (mut run, _) = Run::start_workflow(wf, json!({}));
    let d = run.signal("x2", "second", json!({"n": 2})).unwrap();
    assert_eq!(d.events.len(), 1, "buffered only");
    assert_eq!(run.state.status, RunStatus::Waiting);
    let dup = run.signal("x2", "second", json!({"n": 2})).unwrap();
    assert!(dup.events.is_empty() && dup.commands.is_empty());
    assert!(matches!(
        run.signal("x2", "second", json!({"n": 3})),
        Err(MachineError::SignalIdReused { .. })
    ));
    run.signal("x1", "first", json!({"n": 1})).unwrap();
    assert_eq!(run.state.status, RunStatus::Completed);
    assert_eq!(
        run.state.output,
        Some(json!({"signal": "second", "signal_id": "x2", "payload": {"n": 2}}))
    );
    assert_eq!(
        run.history_kinds(),
        vec![
            "run_started",
            "node_started",
            "wait_started",
            "signal_received",
            "signal_received",
            "signal_consumed",
            "node_completed",
            "node_started",
            "signal_consumed",
            "node_completed",
            "run_completed"
        ]
    );
}

#[test]
fn a_timeout_takes_its_transition_and_a_second_visit_gets_new_timer_ids() {
    let (mut run, _) = Run::start_workflow(WAIT, json!({}));
    let d = run.step(Input::TimerFired {
        timer_id: "docs.timeout".into(),
        overdue_ms: 0,
    });
    // on_timeout -> remind (set) -> docs again: a second visit, new ids.
    assert_eq!(run.state.vars.get("reminded"), Some(&json!(true)));
    assert_eq!(run.state.status, RunStatus::Waiting);
    assert_eq!(timers(&d)[0].timer_id, "docs~2.timeout");
    // The old timer firing again (a second replica) changes nothing.
    let stale = run.step(Input::TimerFired {
        timer_id: "docs.timeout".into(),
        overdue_ms: 0,
    });
    assert!(stale.events.is_empty());
    assert_eq!(cancelled(&stale), vec!["docs.timeout"]);
}

#[test]
fn a_timeout_without_a_transition_fails_the_run() {
    let wf = "kind: workflow\nname: w\nnodes:\n  - {id: w, type: wait, signal: s, timeout: 2h}\n";
    let (mut run, _) = Run::start_workflow(wf, json!({}));
    run.step(Input::TimerFired {
        timer_id: "w.timeout".into(),
        overdue_ms: 0,
    });
    assert_eq!(run.state.status, RunStatus::Failed);
    assert!(
        run.state.status_reason.contains("timed out after 2h"),
        "{}",
        run.state.status_reason
    );
}

#[test]
fn the_first_of_several_wins_and_until_takes_a_rendered_time() {
    let wf = r#"kind: workflow
name: w
nodes:
  - id: w
    type: wait
    for:
      - {signal: go, next: signalled}
      - {duration: 3d, next: slept}
      - {until: "${ .input.deadline }", next: deadline}
  - {id: signalled, type: succeed, output: signalled}
  - {id: slept, type: succeed, output: slept}
  - {id: deadline, type: succeed, output: deadline}
"#;
    let (mut run, d) = Run::start_workflow(wf, json!({"deadline": "2026-12-01T10:00:00+01:00"}));
    let t = timers(&d);
    assert_eq!(t.len(), 2);
    assert_eq!(t[0].after_ms, Some(3 * 86_400_000));
    assert_eq!(t[1].at.as_deref(), Some("2026-12-01T09:00:00.000Z"));
    let d = run.step(Input::TimerFired {
        timer_id: t[1].timer_id.clone(),
        overdue_ms: 0,
    });
    assert_eq!(
        cancelled(&d),
        vec![t[0].timer_id.clone(), t[1].timer_id.clone()]
    );
    assert_eq!(run.state.output, Some(json!("deadline")));

    let (run, _) = Run::start_workflow(wf, json!({"deadline": "next tuesday"}));
    assert_eq!(run.state.status, RunStatus::Failed);
    assert!(
        run.state.status_reason.contains("RFC 3339"),
        "{}",
        run.state.status_reason
    );
}

const APPROVAL: &str = r#"kind: workflow
name: w
nodes:
  - id: approve
    type: approval
    subject: "${ {email: .input.email, plan: .input.plan} }"
    prompt: "Open an account for ${ .input.email }?"
    approver_grant: onboarding.approve
    allow_edits: true
    edits_schema: {type: object, required: [email, plan], additionalProperties: false, properties: {email: {type: string}, plan: {enum: [starter, pro]}}}
    on_decline: declined
    timeout: 2d
    next: done
  - {id: done, type: succeed, output: "${ .nodes.approve.output.subject }"}
  - {id: declined, type: fail, error: "declined: ${ .nodes.approve.output.reason }"}
"#;

fn decide_input(approve: bool, edit: Option<Value>, grants: &[&str]) -> Input {
    Input::DecideApproval {
        request: None,
        node: "approve".into(),
        approve,
        edited_subject: edit,
        by: "grace".into(),
        grants: grants.iter().map(|g| (*g).to_owned()).collect(),
        reason: "checked".into(),
    }
}

#[test]
fn an_approval_needs_the_grant_allows_declared_edits_and_is_decided_once() {
    let (mut run, d) = Run::start_workflow(APPROVAL, json!({"email": "a@x.io", "plan": "pro"}));
    assert_eq!(run.state.status, RunStatus::Waiting);
    assert_eq!(timers(&d)[0].timer_id, "approve.timeout");
    let Some(Event::ApprovalRequested {
        subject, prompt, ..
    }) = run.history.last()
    else {
        panic!("{:?}", run.history.last());
    };
    assert_eq!(subject, &json!({"email": "a@x.io", "plan": "pro"}));
    assert_eq!(prompt, &Some(json!("Open an account for a@x.io?")));

    assert!(matches!(
        run.try_step(decide_input(true, None, &["crm.write"])),
        Err(MachineError::NotAllowed(m)) if m.contains("onboarding.approve")
    ));
    assert!(matches!(
        run.try_step(decide_input(
            true,
            Some(json!({"email": "a@x.io", "plan": "gold"})),
            &["onboarding.approve"]
        )),
        Err(MachineError::InvalidEdit { .. })
    ));
    let edit = json!({"email": "a@x.io", "plan": "starter"});
    let d = run.step(decide_input(
        true,
        Some(edit.clone()),
        &["onboarding.approve"],
    ));
    assert_eq!(cancelled(&d), vec!["approve.timeout"]);
    assert_eq!(run.state.status, RunStatus::Completed);
    // What later nodes see is exactly what was approved.
    assert_eq!(run.state.output, Some(edit));
    assert!(matches!(
        decide(
            &run.state,
            decide_input(false, None, &["onboarding.approve"])
        ),
        // After the run has ended, a second decision is still told about the first.
        Err(MachineError::AlreadyDecided { approved: true, .. })
    ));
}

#[test]
fn a_second_decision_is_refused_naming_the_first() {
    let wf = r#"kind: workflow
name: w
nodes:
  - {id: approve, type: approval, subject: x, approver_grant: ok.go, next: wait}
  - {id: wait, type: wait, signal: s}
"#;
    let (mut run, _) = Run::start_workflow(wf, json!({}));
    run.step(Input::DecideApproval {
        request: None,
        node: "approve".into(),
        approve: true,
        edited_subject: None,
        by: "grace".into(),
        grants: vec!["ok.go".into()],
        reason: "fine".into(),
    });
    let second = decide(
        &run.state,
        Input::DecideApproval {
            request: None,
            node: "approve".into(),
            approve: false,
            edited_subject: None,
            by: "bob".into(),
            grants: vec!["ok.go".into()],
            reason: "no".into(),
        },
    );
    assert!(
        matches!(&second, Err(MachineError::AlreadyDecided { by, approved: true, .. }) if by == "grace"),
        "{second:?}"
    );
    // Edits where none are allowed are refused.
    let (mut run, _) = Run::start_workflow(wf, json!({}));
    assert!(matches!(
        run.try_step(Input::DecideApproval {
            request: None,
            node: "approve".into(),
            approve: true,
            edited_subject: Some(json!("y")),
            by: "grace".into(),
            grants: vec!["ok.go".into()],
            reason: String::new(),
        }),
        Err(MachineError::NotAllowed(m)) if m.contains("does not allow edits")
    ));
}

#[test]
fn a_decline_takes_on_decline_and_an_approval_timeout_fails_without_a_transition() {
    let (mut run, _) = Run::start_workflow(APPROVAL, json!({"email": "a@x.io", "plan": "pro"}));
    run.step(decide_input(false, None, &["onboarding.approve"]));
    assert_eq!(run.state.status, RunStatus::Failed);
    assert_eq!(
        run.state.status_reason,
        "node `declined`: declined: checked"
    );

    let wf = "kind: workflow\nname: w\nnodes:\n  - {id: approve, type: approval, subject: x, approver_grant: ok.go, timeout: 1h}\n";
    let (mut run, _) = Run::start_workflow(wf, json!({}));
    run.step(Input::TimerFired {
        timer_id: "approve.timeout".into(),
        overdue_ms: 0,
    });
    assert_eq!(run.state.status, RunStatus::Failed);
    assert!(run.state.status_reason.contains("no decision within 1h"));
}

#[test]
fn a_tool_node_calls_its_tool_with_rendered_args_and_outputs_the_result() {
    let wf = r#"kind: workflow
name: w
nodes:
  - id: create
    type: tool
    tool: create_account
    args: {email: "${ .input.email }"}
    grants: [crm.write]
    on_error: failed
    next: done
  - {id: done, type: succeed, output: "${ .nodes.create.output.account_id }"}
  - {id: failed, type: fail, error: "${ .nodes.create.output.error }"}
"#;
    let (mut run, d) = Run::start_workflow(wf, json!({"email": "a@x.io"}));
    let Some(Command::ScheduleTask { call_id, spec, .. }) = d.commands.first() else {
        panic!("{:?}", d.commands);
    };
    assert_eq!(call_id, "create.t1");
    // Defaults are filled in before the call, as for a model's proposal.
    assert_eq!(
        spec["arguments"],
        json!({"email": "a@x.io", "plan": "starter"})
    );
    run.step(Input::DispatchToolCall {
        call_id: "create.t1".into(),
        attempt: 1,
        worker_id: "w".into(),
        callback_token_sha256: None,
        tenant_grants: None,
    });
    run.step(Input::ToolCallCompleted {
        call_id: "create.t1".into(),
        attempt: 1,
        result: json!({"account_id": "acct_1"}),
        secrets: Vec::new(),
    });
    assert_eq!(run.state.output, Some(json!("acct_1")));

    // A failure for good takes `on_error`.
    let (mut run, _) = Run::start_workflow(wf, json!({"email": "a@x.io"}));
    run.step(Input::TaskFailed {
        call_id: "create.t1".into(),
        attempt: 1,
        error: "HTTP 400: bad email".into(),
        class: FailureClass::Rejected,
        dispatched: true,
        status_code: Some(400),
    });
    assert_eq!(run.state.status, RunStatus::Failed);
    assert!(
        run.state.status_reason.contains("bad email"),
        "{}",
        run.state.status_reason
    );
}

#[test]
fn a_tool_node_without_the_grant_fails_the_run_before_any_task() {
    let wf = "kind: workflow\nname: w\nnodes:\n  - {id: c, type: tool, tool: create_account, args: {email: x}}\n";
    let (run, d) = Run::start_workflow(wf, json!({}));
    assert!(
        d.commands
            .iter()
            .all(|c| !matches!(c, Command::ScheduleTask { .. }))
    );
    assert_eq!(run.state.status, RunStatus::Failed);
    assert!(
        run.state.status_reason.contains("not granted to the node"),
        "{}",
        run.state.status_reason
    );
}

#[test]
fn an_operator_pause_during_a_wait_holds_the_next_node_until_resume() {
    let (mut run, _) = Run::start_workflow(WAIT, json!({}));
    run.step(Input::Pause {
        by: "ops".into(),
        reason: "checking".into(),
    });
    assert_eq!(run.state.status, RunStatus::Paused);
    run.signal("s1", "documents_received", json!({"files": []}))
        .unwrap();
    // The wait ended, but the run stays paused: `done` has not started.
    assert_eq!(run.state.status, RunStatus::Paused);
    assert!(run.state.output.is_none());
    run.step(Input::Resume {
        by: "ops".into(),
        reason: "ok".into(),
    });
    assert_eq!(run.state.status, RunStatus::Completed);

    // Resumed while still waiting: back to waiting, not running.
    let (mut run, _) = Run::start_workflow(WAIT, json!({}));
    run.step(Input::Pause {
        by: "ops".into(),
        reason: "x".into(),
    });
    run.step(Input::Resume {
        by: "ops".into(),
        reason: "y".into(),
    });
    assert_eq!(run.state.status, RunStatus::Waiting);
}

#[test]
fn a_decision_on_a_cancelled_run_is_refused_and_writes_nothing() {
    let (mut run, _) = Run::start_workflow(APPROVAL, json!({"email": "a@x.io", "plan": "pro"}));
    run.step(Input::Cancel {
        reason: "customer left".into(),
    });
    for approve in [true, false] {
        assert!(matches!(
            decide(
                &run.state,
                decide_input(approve, None, &["onboarding.approve"])
            ),
            Err(MachineError::WrongStatus {
                status: "cancelled",
                ..
            })
        ));
    }
}

#[test]
fn cancelling_a_waiting_run_ends_it() {
    let (mut run, _) = Run::start_workflow(WAIT, json!({}));
    run.step(Input::Cancel {
        reason: "customer left".into(),
    });
    assert_eq!(run.state.status, RunStatus::Cancelled);
}

#[test]
fn a_tool_node_failure_names_the_tool_once() {
    let wf = "kind: workflow\nname: w\nnodes:\n  - {id: create, type: tool, tool: create_account, args: {email: x}, grants: [crm.write]}\n";
    let (mut run, _) = Run::start_workflow(wf, json!({}));
    run.step(Input::TaskFailed {
        call_id: "create.t1".into(),
        attempt: 1,
        error: "HTTP 400: bad email".into(),
        class: FailureClass::Rejected,
        dispatched: true,
        status_code: Some(400),
    });
    assert_eq!(run.state.status, RunStatus::Failed);
    assert_eq!(
        run.state.status_reason,
        "node `create`: tool `create_account` failed: HTTP 400: bad email"
    );
}

#[test]
fn a_tool_node_with_oversized_args_fails_before_any_task() {
    let wf = "kind: workflow\nname: w\nnodes:\n  - {id: create, type: tool, tool: create_account, args: {email: \"${ .input.email }\"}, grants: [crm.write]}\n";
    // `{"email":"…","plan":"starter"}` around the email: 29 bytes.
    let email = |n: usize| json!({"email": "x".repeat(n - 29)});
    let (run, d) = Run::start_workflow(wf, email(TOOL_NODE_MAX_ARGUMENT_BYTES + 1));
    assert!(
        d.commands
            .iter()
            .all(|c| !matches!(c, Command::ScheduleTask { .. })),
        "{:?}",
        d.commands
    );
    assert_eq!(run.state.status, RunStatus::Failed);
    assert_eq!(
        run.state.status_reason,
        "node `create`: `args` of tool `create_account` are 65537 bytes, more than the limit of 65536 bytes"
    );
    // At the limit, the call is scheduled.
    let (run, d) = Run::start_workflow(wf, email(TOOL_NODE_MAX_ARGUMENT_BYTES));
    assert!(
        d.commands
            .iter()
            .any(|c| matches!(c, Command::ScheduleTask { .. })),
        "{}",
        run.state.status_reason
    );
}

#[test]
fn a_signal_id_is_one_signal() {
    let (mut run, _) = Run::start_workflow(WAIT, json!({}));
    run.signal("s1", "documents_received", json!({"files": [1], "by": "x"}))
        .unwrap();
    let n = run.history.len();
    // The same signal again (keys in another order): applied once.
    let d = run
        .signal("s1", "documents_received", json!({"by": "x", "files": [1]}))
        .unwrap();
    assert!(d.events.is_empty() && d.commands.is_empty());
    // Another payload or name under the same id: refused.
    let err = run
        .signal("s1", "documents_received", json!({"files": [2], "by": "x"}))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "signal id `s1` was already used for signal `documents_received` with a different payload; a signal id names one signal, so send this one with a new id"
    );
    let err = run.signal("s1", "other", json!({})).unwrap_err();
    assert!(
        matches!(&err, MachineError::SignalIdReused { signal_id, delivered_name, name }
            if signal_id == "s1" && delivered_name == "documents_received" && name == "other"),
        "{err:?}"
    );
    assert_eq!(run.history.len(), n);
    // The record survives a replay of the history.
    assert_eq!(
        RunState::fold(&run.history).signal_ids,
        run.state.signal_ids
    );
}

const CONFIRM_TOOLS: &str = r#"TOOLS:
  create_account(email: string) -> {account_id: string}
    type: http
    endpoint: "/accounts"
    permission: crm.write
    repeat_safety: reconcile
  pay(amount: number, recipient: string) -> {payment_id: string}
    description: "Execute a payment"
    type: http
    endpoint: "/payments"
    permission: crm.write
    repeat_safety: idempotent
    confirmation:
      require: always
      immutable_params: [recipient]
      approver_grant: payments.approve
"#;

const CONFIRM_WF: &str = r#"kind: workflow
name: w
nodes:
  - {id: pay, type: tool, tool: pay, args: {amount: 120, recipient: "acct_9"}, grants: [crm.write], on_error: declined, next: done}
  - {id: done, type: succeed, output: "${ .nodes.pay.output }"}
  - {id: declined, type: fail, error: "${ .nodes.pay.output.error }"}
"#;

fn confirm(edit: Option<Value>, approve: bool, grants: &[&str]) -> Input {
    Input::DecideApproval {
        request: None,
        node: "pay.t1".into(),
        approve,
        edited_subject: edit,
        by: "ana".into(),
        grants: grants.iter().map(|g| (*g).to_owned()).collect(),
        reason: "checked the invoice".into(),
    }
}

#[test]
fn a_confirmed_tool_waits_and_runs_with_exactly_the_approved_arguments() {
    let (mut run, d) = Run::start_plan(plan_with(CONFIRM_TOOLS, CONFIRM_WF), json!({}));
    // Nothing is dispatched before the decision; the approver sees the call.
    assert!(
        d.commands
            .iter()
            .all(|c| !matches!(c, Command::ScheduleTask { .. }))
    );
    assert!(run.history_kinds().contains(&"confirmation_requested"));
    assert_eq!(run.state.status, RunStatus::Waiting);
    assert!(
        run.state
            .status_reason
            .contains("waits for a confirmation by a holder of `payments.approve`"),
        "{}",
        run.state.status_reason
    );
    // Without the grant: refused; editing an immutable param: refused.
    assert!(matches!(
        run.try_step(confirm(None, true, &["crm.write"])),
        Err(MachineError::NotAllowed(_))
    ));
    let bad = run.try_step(confirm(
        Some(json!({"amount": 120, "recipient": "acct_EVIL"})),
        true,
        &["payments.approve"],
    ));
    assert!(
        matches!(&bad, Err(MachineError::InvalidEdit { errors, .. }) if errors.iter().any(|e| e.contains("recipient"))),
        "{bad:?}"
    );
    // An edit that breaks the input type: refused.
    let bad = run.try_step(confirm(
        Some(json!({"amount": "lots", "recipient": "acct_9"})),
        true,
        &["payments.approve"],
    ));
    assert!(
        matches!(bad, Err(MachineError::InvalidEdit { .. })),
        "{bad:?}"
    );
    // Approve with an edit of a mutable param: the task carries exactly it.
    let d = run.step(confirm(
        Some(json!({"amount": 100, "recipient": "acct_9"})),
        true,
        &["payments.approve"],
    ));
    let Some(Command::ScheduleTask { spec, .. }) = d
        .commands
        .iter()
        .find(|c| matches!(c, Command::ScheduleTask { .. }))
    else {
        panic!("{:?}", d.commands);
    };
    assert_eq!(
        spec["arguments"],
        json!({"amount": 100, "recipient": "acct_9"})
    );
    assert_eq!(run.state.status, RunStatus::Running);
    // A second decision is refused, naming the first.
    assert!(matches!(
        run.try_step(confirm(None, false, &["payments.approve"])),
        Err(MachineError::AlreadyDecided { by, approved: true, .. }) if by == "ana"
    ));
}

#[test]
fn a_declined_confirmation_fails_the_call_as_the_user_declined() {
    let (mut run, _) = Run::start_plan(plan_with(CONFIRM_TOOLS, CONFIRM_WF), json!({}));
    let d = run.step(confirm(None, false, &["payments.approve"]));
    assert!(
        d.commands
            .iter()
            .all(|c| !matches!(c, Command::ScheduleTask { .. }))
    );
    assert_eq!(run.state.status, RunStatus::Failed);
    assert!(
        run.state
            .status_reason
            .contains("the user declined (decided by ana): checked the invoice"),
        "{}",
        run.state.status_reason
    );
}

const SIDE_EFFECT_TOOLS: &str = r#"TOOLS:
  look(id: string) -> {found: boolean}
    type: http
    endpoint: "/look"
    effect: read_only
    confirmation:
      require: when_side_effects
    permission: crm.write
    repeat_safety: idempotent
  wipe(id: string) -> {wiped: boolean}
    type: http
    endpoint: "/wipe"
    effect: side_effect
    confirmation:
      require: when_side_effects
    permission: crm.write
    repeat_safety: never
"#;

#[test]
fn when_side_effects_runs_a_read_only_tool_at_once_and_holds_a_side_effect_for_approval() {
    let wf = r#"kind: workflow
name: w
nodes:
  - {id: look, type: tool, tool: look, args: {id: "a1"}, grants: [crm.write], next: wipe}
  - {id: wipe, type: tool, tool: wipe, args: {id: "a1"}, grants: [crm.write], next: done}
  - {id: done, type: succeed, output: "${ .nodes.wipe.output }"}
"#;
    let agent = "kind: agent\nname: a\nmodel: m\ninstructions: i\ntools: [look, wipe]\ngrants: [crm.write]\n";
    let (mut run, d) = Run::start_plan(plan_files(SIDE_EFFECT_TOOLS, agent, wf), json!({}));
    // The read-only tool runs at once: its task is scheduled, nobody asked.
    assert!(
        matches!(d.commands.first(), Some(Command::ScheduleTask { call_id, .. }) if call_id == "look.t1"),
        "{:?}",
        d.commands
    );
    assert!(!run.history_kinds().contains(&"confirmation_requested"));
    run.step(Input::DispatchToolCall {
        call_id: "look.t1".into(),
        attempt: 1,
        worker_id: "w".into(),
        callback_token_sha256: None,
        tenant_grants: None,
    });
    let d = run.step(Input::ToolCallCompleted {
        call_id: "look.t1".into(),
        attempt: 1,
        result: json!({"found": true}),
        secrets: Vec::new(),
    });
    // The side-effect tool waits for a person.
    assert!(
        d.commands
            .iter()
            .all(|c| !matches!(c, Command::ScheduleTask { .. })),
        "{:?}",
        d.commands
    );
    assert_eq!(run.history_kinds().last(), Some(&"confirmation_requested"));
    assert_eq!(run.state.status, RunStatus::Waiting);
    let d = run.step(Input::DecideApproval {
        request: None,
        node: "wipe.t1".into(),
        approve: true,
        edited_subject: None,
        by: "ana".into(),
        grants: vec!["crm.write".into()],
        reason: String::new(),
    });
    assert!(
        matches!(d.commands.first(), Some(Command::ScheduleTask { call_id, spec, .. }) if call_id == "wipe.t1" && spec["arguments"] == json!({"id": "a1"})),
        "{:?}",
        d.commands
    );
}

const TOOLS_WITH_SETS: &str = r#"TOOLS:
  create_account(email: string, plan?: string = "starter") -> {account_id: string}
    description: "Create an account"
    type: http
    endpoint: "/accounts"
    permission: crm.write
    repeat_safety: reconcile
    on_result:
      set:
        account: .result.account_id
        account_number: .result.account_id | tonumber
    on_error:
      set:
        why: .error.message
"#;

const SETS_WORKFLOW: &str = r#"kind: workflow
name: w
nodes:
  - id: create
    type: tool
    tool: create_account
    args: {email: x}
    grants: [crm.write]
    on_error: failed
    next: done
  - {id: done, type: succeed, output: {account: "${ .vars.account }", number: "${ .vars.account_number }"}}
  - {id: failed, type: succeed, output: "${ .vars.why }"}
"#;

#[test]
fn on_result_sets_run_vars_the_next_node_reads_and_a_failing_expression_sets_nothing() {
    let (mut run, _) = Run::start_plan(plan_with(TOOLS_WITH_SETS, SETS_WORKFLOW), json!({}));
    let d = run.step(Input::ToolCallCompleted {
        call_id: "create.t1".into(),
        attempt: 1,
        result: json!({"account_id": "acct_1"}),
        secrets: Vec::new(),
    });
    // Recorded right after the result, before the next node runs.
    let kinds: Vec<&str> = d.events.iter().map(Event::kind).collect();
    assert_eq!(&kinds[..2], ["tool_call_completed", "tool_vars_set"]);
    let Event::ToolVarsSet {
        call_id,
        tool,
        from,
        values,
        errors,
    } = &d.events[1]
    else {
        panic!("{:?}", d.events);
    };
    assert_eq!(
        (call_id.as_str(), tool.as_str(), from.as_str()),
        ("create.t1", "create_account", "on_result")
    );
    assert_eq!(Value::Object(values.clone()), json!({"account": "acct_1"}));
    // `tonumber` of "acct_1" fails: the variable is not set, the reason is
    // recorded, and the call still succeeds.
    let why = errors.get("account_number").cloned().unwrap_or_default();
    assert!(
        why.starts_with("`.result.account_id | tonumber`: "),
        "{why}"
    );
    assert_eq!(run.state.vars.get("account"), Some(&json!("acct_1")));
    assert!(!run.state.vars.contains_key("account_number"));
    assert_eq!(run.state.status, RunStatus::Completed);
    assert_eq!(
        run.state.output,
        Some(json!({"account": "acct_1", "number": null}))
    );
}

#[test]
fn on_error_sets_run_vars_when_a_call_fails_for_good() {
    let (mut run, _) = Run::start_plan(plan_with(TOOLS_WITH_SETS, SETS_WORKFLOW), json!({}));
    let d = run.step(Input::TaskFailed {
        call_id: "create.t1".into(),
        attempt: 1,
        error: "HTTP 400: bad email".into(),
        class: FailureClass::Rejected,
        dispatched: true,
        status_code: Some(400),
    });
    let kinds: Vec<&str> = d.events.iter().map(Event::kind).collect();
    assert_eq!(
        &kinds[..3],
        [
            "tool_call_attempt_failed",
            "tool_call_failed",
            "tool_vars_set"
        ]
    );
    assert!(
        !run.state.vars.contains_key("account"),
        "on_result does not run on a failure"
    );
    assert_eq!(run.state.status, RunStatus::Completed);
    let why = run.state.output.clone().unwrap_or_default();
    assert!(
        why.as_str().is_some_and(|w| w.contains("bad email")),
        "{why}"
    );
}

#[test]
fn an_uncertain_call_resolved_runs_its_on_result_or_on_error() {
    let uncertain = || {
        let (mut run, _) = Run::start_plan(plan_with(TOOLS_WITH_SETS, SETS_WORKFLOW), json!({}));
        run.step(Input::DispatchToolCall {
            call_id: "create.t1".into(),
            attempt: 1,
            worker_id: "w".into(),
            callback_token_sha256: None,
            tenant_grants: None,
        });
        run.step(Input::LeaseExpired {
            call_id: "create.t1".into(),
            attempt: 1,
            dispatched: true,
        });
        assert_eq!(run.state.status, RunStatus::Paused);
        run
    };
    let resolve = |resolution| Input::ResolveUncertain {
        call_id: "create.t1".into(),
        resolution,
        resolved_by: "ops/alice".into(),
        reason: "checked the CRM".into(),
    };
    // Succeeded: the operator's result sets the variables.
    let mut run = uncertain();
    let d = run.step(resolve(Resolution::Succeeded {
        result: json!({"account_id": "42"}),
    }));
    assert!(
        d.events
            .iter()
            .any(|e| matches!(e, Event::ToolVarsSet { from, .. } if from == "on_result")),
        "{:?}",
        d.events
    );
    assert_eq!(
        run.state.output,
        Some(json!({"account": "42", "number": 42}))
    );
    // Failed: the error sets `on_error`'s.
    let mut run = uncertain();
    run.step(resolve(Resolution::Failed {
        error: "no account was made".into(),
    }));
    assert_eq!(
        run.state.vars.get("why"),
        Some(&json!("no account was made"))
    );
}
