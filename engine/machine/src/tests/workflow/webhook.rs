//! `type: async_webhook` tools: the call is accepted, then completed once
//! by its callback, in whichever order they come; without a callback in
//! time it fails.

#![allow(clippy::unwrap_used)]

use serde_json::{Value, json};

use super::{cancelled, plan_with, timers};
use crate::tests::Run;
use crate::*;

const WEBHOOK_TOOLS: &str = r#"TOOLS:
  create_account(email: string) -> {account_id: string}
    type: http
    endpoint: "/accounts"
    permission: crm.write
    repeat_safety: reconcile
  kyc(email: string) -> {check_id: string, status: string}
    description: "Check identity documents; the provider calls back"
    type: async_webhook
    endpoint: "/kyc/checks"
    method: POST
    callback_url_field: meta.reply_to
    timeout_seconds: 600
    permission: crm.write
    repeat_safety: idempotent
"#;

const WEBHOOK_WF: &str = r#"kind: workflow
name: w
nodes:
  - {id: check, type: tool, tool: kyc, args: {email: "${ .input.email }"}, grants: [crm.write], on_error: failed, next: done}
  - {id: done, type: succeed, output: "${ .nodes.check.output }"}
  - {id: failed, type: fail, error: "${ .nodes.check.output.error }"}
"#;

fn dispatch_webhook(
    run: &mut Run,
    attempt: u32,
    token: Option<&str>,
) -> Result<Decision, MachineError> {
    run.try_step(Input::DispatchToolCall {
        call_id: "check.t1".into(),
        attempt,
        worker_id: "w".into(),
        callback_token_sha256: token.map(str::to_owned),
        tenant_grants: None,
    })
}

fn callback(run: &mut Run, token: &str, payload: Value) -> Result<Decision, MachineError> {
    run.try_step(Input::Callback {
        token_sha256: token.into(),
        payload,
    })
}

#[test]
fn an_async_webhook_is_accepted_then_completed_by_its_callback_once() {
    let (mut run, d) = Run::start_plan(
        plan_with(WEBHOOK_TOOLS, WEBHOOK_WF),
        json!({"email": "a@x.io"}),
    );
    let Some(Command::ScheduleTask { spec, .. }) = d.commands.first() else {
        panic!("{:?}", d.commands);
    };
    assert_eq!(spec["binding"]["type"], "async_webhook");
    assert_eq!(spec["binding"]["callback_url_field"], "meta.reply_to");
    assert_eq!(spec["binding"]["endpoint"], "/kyc/checks");

    // Dispatch issues the token (only its hash is known here) and registers it.
    let d = dispatch_webhook(&mut run, 1, Some("h1")).unwrap();
    assert_eq!(
        d.events.iter().map(Event::kind).collect::<Vec<_>>(),
        ["tool_call_dispatched", "callback_issued"]
    );
    assert!(d.commands.iter().any(
        |c| matches!(c, Command::RegisterCallback { token_sha256, .. } if token_sha256 == "h1")
    ));
    // The same attempt asking again (its reply lost) gets a second token.
    let d = dispatch_webhook(&mut run, 1, Some("h1b")).unwrap();
    assert_eq!(
        d.events.iter().map(Event::kind).collect::<Vec<_>>(),
        ["callback_issued"]
    );

    // The 2xx answer is an acceptance: the task ends, the call waits.
    let d = run.step(Input::ToolCallCompleted {
        call_id: "check.t1".into(),
        attempt: 1,
        result: json!({"check_id": "kyc_1", "status": "pending"}),
        secrets: Vec::new(),
    });
    assert_eq!(
        d.events.iter().map(Event::kind).collect::<Vec<_>>(),
        ["tool_call_accepted"]
    );
    assert!(d.commands.iter().any(|c| matches!(
        c,
        Command::EndTask {
            end: TaskEnd::Completed,
            ..
        }
    )));
    assert_eq!(timers(&d)[0].timer_id, "check.t1.callback");
    assert_eq!(timers(&d)[0].after_ms, Some(600_000));
    assert_eq!(run.state.status, RunStatus::Waiting);
    assert!(
        run.state
            .status_reason
            .contains("waits for its callback (up to 10m)"),
        "{}",
        run.state.status_reason
    );

    // A result that does not match the output type is refused; the token stays unused.
    let bad = callback(&mut run, "h1", json!({"check_id": 7}));
    assert!(
        matches!(bad, Err(MachineError::InvalidResult { .. })),
        "{bad:?}"
    );
    // An unknown token is refused.
    assert!(matches!(
        callback(&mut run, "nope", json!({})),
        Err(MachineError::CallNotOpen { .. })
    ));

    let d = callback(
        &mut run,
        "h1",
        json!({"check_id": "kyc_1", "status": "clear"}),
    )
    .unwrap();
    assert_eq!(
        d.events.iter().map(Event::kind).collect::<Vec<_>>(),
        [
            "callback_received",
            "tool_call_completed",
            "node_completed",
            "node_started",
            "node_completed",
            "run_completed"
        ]
    );
    assert_eq!(cancelled(&d), vec!["check.t1.callback"]);
    assert_eq!(
        run.state.output,
        Some(json!({"check_id": "kyc_1", "status": "clear"}))
    );

    // A replay of the same callback changes nothing; the other token of the
    // call, once the run has ended, is kept as a late result.
    let d = callback(
        &mut run,
        "h1",
        json!({"check_id": "kyc_1", "status": "clear"}),
    )
    .unwrap();
    assert!(d.events.is_empty() && d.commands.is_empty());
    let d = callback(
        &mut run,
        "h1b",
        json!({"check_id": "kyc_1", "status": "clear"}),
    )
    .unwrap();
    assert_eq!(
        d.events.iter().map(Event::kind).collect::<Vec<_>>(),
        ["callback_received", "late_result_recorded"]
    );
}

#[test]
fn a_callback_before_the_acceptance_completes_the_call_and_the_late_acceptance_is_ignored() {
    let (mut run, _) = Run::start_plan(
        plan_with(WEBHOOK_TOOLS, WEBHOOK_WF),
        json!({"email": "a@x.io"}),
    );
    dispatch_webhook(&mut run, 1, Some("h1")).unwrap();
    // Fast servers call back before they answer the request.
    let d = callback(
        &mut run,
        "h1",
        json!({"check_id": "kyc_1", "status": "clear"}),
    )
    .unwrap();
    assert!(d.commands.iter().any(|c| matches!(
        c,
        Command::EndTask {
            end: TaskEnd::Completed,
            ..
        }
    )));
    assert_eq!(run.state.status, RunStatus::Completed);
    // The worker's report of the acceptance now arrives as a late result of
    // the same attempt: nothing changes (the run has ended: it is refused).
    let before = run.state.clone();
    let late = run.try_step(Input::LateToolResult {
        call_id: "check.t1".into(),
        attempt: 1,
        result: json!({"check_id": "kyc_1", "status": "pending"}),
        worker_id: "w".into(),
    });
    assert!(
        late.as_ref().map_or(true, |d| d.events.is_empty()),
        "{late:?}"
    );
    assert_eq!(run.state, before);
}

#[test]
fn an_async_webhook_without_a_callback_in_time_fails_and_needs_a_callback_endpoint() {
    let (mut run, _) = Run::start_plan(
        plan_with(WEBHOOK_TOOLS, WEBHOOK_WF),
        json!({"email": "a@x.io"}),
    );
    // An engine that serves no callback endpoint refuses the dispatch.
    let refused = dispatch_webhook(&mut run, 1, None);
    assert!(
        matches!(&refused, Err(MachineError::DispatchUnavailable { detail, .. }) if detail.contains("--callback-listen")),
        "{refused:?}"
    );
    dispatch_webhook(&mut run, 1, Some("h1")).unwrap();
    run.step(Input::ToolCallCompleted {
        call_id: "check.t1".into(),
        attempt: 1,
        result: json!({"accepted": true}),
        secrets: Vec::new(),
    });
    let d = run.step(Input::TimerFired {
        timer_id: "check.t1.callback".into(),
        overdue_ms: 0,
    });
    assert!(
        d.events
            .iter()
            .any(|e| matches!(e, Event::ToolCallFailed { .. }))
    );
    assert_eq!(run.state.status, RunStatus::Failed);
    assert!(
        run.state
            .status_reason
            .contains("did not call back within 10m"),
        "{}",
        run.state.status_reason
    );
    // The callback arriving after the timeout is kept as history, not applied.
    let failed_run = run.state.status;
    let late = callback(
        &mut run,
        "h1",
        json!({"check_id": "kyc_1", "status": "clear"}),
    )
    .unwrap();
    assert!(
        late.events
            .iter()
            .any(|e| matches!(e, Event::LateResultRecorded { .. }))
    );
    assert_eq!(run.state.status, failed_run);
}
