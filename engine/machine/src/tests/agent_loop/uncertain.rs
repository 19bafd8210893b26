//! Uncertain outcomes of a tool call (it may have acted, and repeating it
//! is not safe): the operator's resolution, probes, late results, and the
//! operator pause.

use serde_json::{Value, json};

use super::{dispatch, tool_results};
use crate::tests::{Opts, Run};
use crate::*;

/// A run paused on an uncertain `create` call (`intake.t1`, attempt 1).
fn uncertain_run(opts: Opts) -> (Run, Decision) {
    let (mut run, _) = Run::start(opts);
    run.model("intake.m1", &[("create", r#"{"email":"e"}"#)], None);
    run.step(Input::DispatchToolCall {
        call_id: "intake.t1".into(),
        attempt: 1,
        worker_id: "w".into(),
        callback_token_sha256: None,
        tenant_grants: None,
    });
    let d = run.step(Input::LeaseExpired {
        call_id: "intake.t1".into(),
        attempt: 1,
        dispatched: true,
    });
    assert_eq!(run.state.status, RunStatus::Paused);
    (run, d)
}

fn resolve(call: &str, resolution: Resolution) -> Input {
    Input::ResolveUncertain {
        call_id: call.into(),
        resolution,
        resolved_by: "ops/alice".into(),
        reason: "checked the CRM".into(),
    }
}

#[test]
fn without_a_probe_the_operator_is_notified() {
    let (_, d) = uncertain_run(Opts::default());
    assert!(d.commands.iter().any(|c| matches!(c, Command::NotifyOperator { kind, .. } if kind == "run.paused.uncertain_outcome")));
}

#[test]
fn an_operator_resolves_succeeded_and_the_run_resumes_with_that_result() {
    let (mut run, _) = uncertain_run(Opts::default());
    let bad = decide(
        &run.state,
        resolve(
            "intake.t1",
            Resolution::Succeeded {
                result: json!({"id": 1}),
            },
        ),
    );
    assert!(
        matches!(&bad, Err(MachineError::InvalidResult { errors, .. }) if errors.iter().any(|e| e.contains("account_id"))),
        "{bad:?}"
    );
    let d = run.step(resolve(
        "intake.t1",
        Resolution::Succeeded {
            result: json!({"account_id": "acc_9"}),
        },
    ));
    assert_eq!(
        Run::kinds(&d),
        [
            "uncertain_outcome_resolved",
            "run_resumed",
            "model_call_scheduled"
        ]
    );
    assert!(d.commands.iter().any(|c| matches!(
        c,
        Command::MarkUncertainResolved {
            kind: ResolutionKind::Succeeded,
            via: ResolvedVia::Operator,
            ..
        }
    )));
    assert!(d.commands.contains(&Command::EndTask {
        call_id: "intake.t1".into(),
        end: TaskEnd::Completed
    }));
    assert_eq!(tool_results(&run), [r#"{"account_id":"acc_9"}"#]);
    assert_eq!(run.state.status, RunStatus::Running);
    let twice = decide(
        &run.state,
        resolve("intake.t1", Resolution::Failed { error: "x".into() }),
    );
    assert!(
        matches!(&twice, Err(MachineError::NotUncertain { detail, .. }) if detail.contains("already resolved as `succeeded` via operator")),
        "{twice:?}"
    );
}

#[test]
fn an_operator_resolves_failed_and_the_model_is_told() {
    let (mut run, _) = uncertain_run(Opts::default());
    let d = run.step(resolve(
        "intake.t1",
        Resolution::Failed {
            error: "the CRM has no such account".into(),
        },
    ));
    assert_eq!(
        Run::kinds(&d),
        [
            "uncertain_outcome_resolved",
            "run_resumed",
            "model_call_scheduled"
        ]
    );
    assert_eq!(tool_results(&run), ["error: the CRM has no such account"]);
}

#[test]
fn retry_keeps_the_key_or_mints_a_new_one_and_allows_one_more_dispatch() {
    let (mut run, _) = uncertain_run(Opts::default());
    let d = run.step(resolve(
        "intake.t1",
        Resolution::Retry {
            new_idempotency_key: false,
        },
    ));
    assert_eq!(
        Run::kinds(&d),
        ["uncertain_outcome_resolved", "run_resumed"]
    );
    assert!(d.commands.contains(&Command::RetryTask {
        call_id: "intake.t1".into(),
        delay_ms: 0
    }));
    assert!(
        !d.commands
            .iter()
            .any(|c| matches!(c, Command::RekeyTask { .. }))
    );
    assert_eq!(
        run.state.tool_calls["intake.t1"].idempotency_key,
        "r1/intake.t1"
    );
    let d = run.step(Input::DispatchToolCall {
        call_id: "intake.t1".into(),
        attempt: 2,
        worker_id: "w".into(),
        callback_token_sha256: None,
        tenant_grants: None,
    });
    assert_eq!(Run::kinds(&d), ["tool_call_dispatched"]);

    let (mut run, _) = uncertain_run(Opts::default());
    let d = run.step(resolve(
        "intake.t1",
        Resolution::Retry {
            new_idempotency_key: true,
        },
    ));
    let rekey = d.commands.iter().find_map(|c| match c {
        Command::RekeyTask {
            idempotency_key,
            spec,
            ..
        } => Some((idempotency_key.clone(), spec.clone())),
        _ => None,
    });
    let (key, spec) = rekey.expect("rekeyed");
    assert_eq!(key, "r1/intake.t1/r1");
    assert_eq!(spec["idempotency_key"], "r1/intake.t1/r1");
    assert_eq!(run.state.tool_calls["intake.t1"].idempotency_key, key);
}

#[test]
fn a_probe_that_finds_the_effect_resolves_it_without_an_operator() {
    let (mut run, d) = uncertain_run(Opts {
        probe: true,
        ..Opts::default()
    });
    assert_eq!(
        Run::kinds(&d),
        [
            "task_lease_expired",
            "uncertain_outcome_recorded",
            "reconcile_probe_scheduled",
            "run_paused"
        ]
    );
    assert!(
        !d.commands
            .iter()
            .any(|c| matches!(c, Command::NotifyOperator { .. })),
        "no operator yet"
    );
    let probe = d.commands.iter().find_map(|c| match c {
        Command::ScheduleTask {
            call_id,
            spec,
            runs_while_paused: true,
            ..
        } => Some((call_id.clone(), spec.clone())),
        _ => None,
    });
    let (probe_id, spec) = probe.expect("probe task");
    assert_eq!(probe_id, "intake.t1.p1");
    assert_eq!(spec["arguments"]["idempotency_key"], "r1/intake.t1");
    assert!(
        run.state
            .status_reason
            .contains("looking it up with `find`")
    );
    // The probe may be dispatched while the run is paused; the call it looks up may not.
    run.step(Input::DispatchToolCall {
        call_id: probe_id.clone(),
        attempt: 1,
        worker_id: "w".into(),
        callback_token_sha256: None,
        tenant_grants: None,
    });
    let d = run.step(Input::ToolCallCompleted {
        call_id: probe_id,
        attempt: 1,
        result: json!({"account_id": "acc_7"}),
        secrets: Vec::new(),
    });
    assert_eq!(
        Run::kinds(&d),
        [
            "tool_call_completed",
            "reconcile_probe_finished",
            "uncertain_outcome_resolved",
            "run_resumed",
            "model_call_scheduled"
        ]
    );
    assert_eq!(tool_results(&run), [r#"{"account_id":"acc_7"}"#]);
}

/// Issue 22 (found by the chaos run): after a lease expired, the worker
/// may have sent its request just before the lease ended, and it can reach
/// the tool until the tool's timeout passes: the probe waits that long
/// (its task is ready only then), so it cannot find nothing and let the
/// call run twice. A failure the worker reported (it stopped) is probed
/// at once.
#[test]
fn a_probe_after_an_expired_lease_waits_out_the_tools_timeout() {
    let (_, d) = uncertain_run(Opts {
        probe: true,
        ..Opts::default()
    });
    let delayed = d.commands.iter().find_map(|c| match c {
        Command::RetryTask { call_id, delay_ms } if call_id == "intake.t1.p1" => Some(*delay_ms),
        _ => None,
    });
    assert_eq!(delayed, Some(1000), "the tool's timeout: {:?}", d.commands);
    let scheduled = d.events.iter().find_map(|e| match e {
        Event::ReconcileProbeScheduled { after_ms, .. } => Some(*after_ms),
        _ => None,
    });
    assert_eq!(scheduled, Some(Some(1000)), "the history says why it waits");

    let (mut run, _) = Run::start(Opts {
        probe: true,
        ..Opts::default()
    });
    run.model("intake.m1", &[("create", r#"{"email":"e"}"#)], None);
    dispatch(&mut run, "intake.t1", 1);
    let d = run.step(Input::TaskFailed {
        call_id: "intake.t1".into(),
        attempt: 1,
        error: "timed out".into(),
        class: FailureClass::MayHaveActed,
        dispatched: true,
        status_code: None,
    });
    assert!(Run::kinds(&d).contains(&"reconcile_probe_scheduled"));
    assert!(
        !d.commands
            .iter()
            .any(|c| matches!(c, Command::RetryTask { call_id, .. } if call_id == "intake.t1.p1")),
        "a reported failure is probed at once: {:?}",
        d.commands
    );
}

#[test]
fn a_probe_answering_404_retries_with_the_same_key_and_an_undecided_probe_calls_the_operator() {
    let (mut run, _) = uncertain_run(Opts {
        probe: true,
        ..Opts::default()
    });
    run.step(Input::DispatchToolCall {
        call_id: "intake.t1.p1".into(),
        attempt: 1,
        worker_id: "w".into(),
        callback_token_sha256: None,
        tenant_grants: None,
    });
    let d = run.step(Input::TaskFailed {
        call_id: "intake.t1.p1".into(),
        attempt: 1,
        error: "HTTP 404 Not Found".into(),
        class: FailureClass::Rejected,
        dispatched: true,
        status_code: Some(404),
    });
    assert!(Run::kinds(&d).contains(&"reconcile_probe_finished"));
    assert!(d.commands.contains(&Command::RetryTask {
        call_id: "intake.t1".into(),
        delay_ms: 0
    }));
    assert_eq!(run.state.status, RunStatus::Running);

    let (mut run, _) = uncertain_run(Opts {
        probe: true,
        ..Opts::default()
    });
    let d = run.step(Input::ToolCallCompleted {
        call_id: "intake.t1.p1".into(),
        attempt: 1,
        result: json!({"unrelated": true}),
        secrets: Vec::new(),
    });
    assert!(d.events.iter().any(|e| matches!(
        e,
        Event::ReconcileProbeFinished {
            outcome: ProbeOutcome::Undecided,
            ..
        }
    )));
    assert!(
        d.commands
            .iter()
            .any(|c| matches!(c, Command::NotifyOperator { .. }))
    );
    assert_eq!(run.state.status, RunStatus::Paused);
}

#[test]
fn a_late_result_resolves_an_uncertain_call_and_is_kept_as_a_discrepancy_after_resolution() {
    let (mut run, _) = uncertain_run(Opts::default());
    let late = Input::LateToolResult {
        call_id: "intake.t1".into(),
        attempt: 1,
        result: json!({"account_id": "acc_1"}),
        worker_id: "w".into(),
    };
    let d = run.step(late.clone());
    assert_eq!(
        Run::kinds(&d),
        [
            "uncertain_outcome_resolved",
            "run_resumed",
            "model_call_scheduled"
        ]
    );
    assert!(matches!(
        &d.events[0],
        Event::UncertainOutcomeResolved {
            via: ResolvedVia::LateResult,
            ..
        }
    ));

    let (mut run, _) = uncertain_run(Opts::default());
    run.step(resolve(
        "intake.t1",
        Resolution::Succeeded {
            result: json!({"account_id": "acc_2"}),
        },
    ));
    let d = run.step(late);
    assert_eq!(Run::kinds(&d), ["late_result_recorded"]);
    assert!(
        d.commands
            .iter()
            .any(|c| matches!(c, Command::FlagDiscrepancy { .. }))
    );
    assert!(
        matches!(&d.events[0], Event::LateResultRecorded { discrepancy: Some(m), .. } if m.contains("differs"))
    );
    assert_eq!(
        tool_results(&run),
        [r#"{"account_id":"acc_2"}"#],
        "never applied twice"
    );
}

#[test]
fn for_an_idempotent_call_the_first_result_wins() {
    let (mut run, _) = Run::start(Opts::default());
    run.model("intake.m1", &[("lookup", r#"{"email":"e"}"#)], None);
    run.step(Input::DispatchToolCall {
        call_id: "intake.t1".into(),
        attempt: 1,
        worker_id: "w".into(),
        callback_token_sha256: None,
        tenant_grants: None,
    });
    run.step(Input::LeaseExpired {
        call_id: "intake.t1".into(),
        attempt: 1,
        dispatched: true,
    });
    // Attempt 2 is running when attempt 1's result arrives.
    let d = run.step(Input::LateToolResult {
        call_id: "intake.t1".into(),
        attempt: 1,
        result: json!("first"),
        worker_id: "w".into(),
    });
    assert_eq!(
        Run::kinds(&d),
        ["tool_call_completed", "model_call_scheduled"]
    );
    let d = run.step(Input::LateToolResult {
        call_id: "intake.t1".into(),
        attempt: 2,
        result: json!("second"),
        worker_id: "w2".into(),
    });
    assert_eq!(Run::kinds(&d), ["late_result_recorded"]);
    assert_eq!(tool_results(&run), ["first"]);
}

#[test]
fn an_operator_pause_holds_the_run_until_resumed() {
    let (mut run, _) = Run::start(Opts::default());
    let d = run.step(Input::Pause {
        by: "alice".into(),
        reason: "investigating".into(),
    });
    assert_eq!(Run::kinds(&d), ["run_paused"]);
    assert!(
        decide(
            &run.state,
            Input::Pause {
                by: "bob".into(),
                reason: "again".into()
            }
        )
        .is_err()
    );
    // A result that arrives while paused is recorded, but nothing new starts.
    let d = run.model("intake.m1", &[], Some("done"));
    assert_eq!(Run::kinds(&d), ["model_call_completed"]);
    let d = run.step(Input::Resume {
        by: "alice".into(),
        reason: "ok".into(),
    });
    assert_eq!(
        Run::kinds(&d),
        ["run_resumed", "node_completed", "run_completed"]
    );
    assert!(
        decide(
            &run.state,
            Input::Resume {
                by: "alice".into(),
                reason: "".into()
            }
        )
        .is_err()
    );
}

#[test]
fn resolving_under_an_operator_pause_does_not_resume_the_run() {
    let (mut run, _) = uncertain_run(Opts::default());
    let err = decide(
        &run.state,
        Input::Resume {
            by: "a".into(),
            reason: "".into(),
        },
    );
    assert!(
        matches!(&err, Err(MachineError::WrongStatus { detail, .. }) if detail.contains("uncertain outcome")),
        "{err:?}"
    );
    run.step(Input::Pause {
        by: "alice".into(),
        reason: "hold".into(),
    });
    let d = run.step(resolve(
        "intake.t1",
        Resolution::Succeeded {
            result: json!({"account_id": "a"}),
        },
    ));
    assert_eq!(Run::kinds(&d), ["uncertain_outcome_resolved"]);
    assert_eq!(run.state.status, RunStatus::Paused);
    assert!(run.state.status_reason.contains("paused by alice"));
    let d = run.step(Input::Resume {
        by: "alice".into(),
        reason: "go".into(),
    });
    assert_eq!(Run::kinds(&d), ["run_resumed", "model_call_scheduled"]);
}

#[test]
fn a_call_can_become_uncertain_again_after_a_retry() {
    let (mut run, _) = uncertain_run(Opts::default());
    run.step(resolve(
        "intake.t1",
        Resolution::Retry {
            new_idempotency_key: false,
        },
    ));
    run.step(Input::DispatchToolCall {
        call_id: "intake.t1".into(),
        attempt: 2,
        worker_id: "w".into(),
        callback_token_sha256: None,
        tenant_grants: None,
    });
    let d = run.step(Input::LeaseExpired {
        call_id: "intake.t1".into(),
        attempt: 2,
        dispatched: true,
    });
    assert_eq!(
        Run::kinds(&d),
        [
            "task_lease_expired",
            "uncertain_outcome_recorded",
            "run_paused"
        ]
    );
    assert!(
        d.commands
            .iter()
            .any(|c| matches!(c, Command::RecordUncertainOutcome { attempt: 2, .. }))
    );
}

#[test]
fn cancelling_records_dispatched_reconcile_calls_and_their_records_stay_resolvable() {
    let (mut run, _) = Run::start(Opts::default());
    run.model(
        "intake.m1",
        &[
            ("create", r#"{"email":"e"}"#),
            ("lookup", r#"{"email":"e"}"#),
        ],
        None,
    );
    run.step(Input::DispatchToolCall {
        call_id: "intake.t1".into(),
        attempt: 1,
        worker_id: "w".into(),
        callback_token_sha256: None,
        tenant_grants: None,
    });
    let d = run.step(Input::Cancel {
        reason: "customer left".into(),
    });
    assert_eq!(
        Run::kinds(&d),
        ["uncertain_outcome_recorded", "run_cancelled"]
    );
    assert!(
        d.commands
            .iter()
            .any(|c| matches!(c, Command::NotifyOperator { .. }))
    );
    // Retry makes no sense on a cancelled run; saying what happened does.
    assert!(
        decide(
            &run.state,
            resolve(
                "intake.t1",
                Resolution::Retry {
                    new_idempotency_key: false
                }
            )
        )
        .is_err()
    );
    let d = run.step(resolve(
        "intake.t1",
        Resolution::Succeeded {
            result: json!({"account_id": "a"}),
        },
    ));
    assert_eq!(Run::kinds(&d), ["uncertain_outcome_resolved"]);
    assert_eq!(run.state.status, RunStatus::Cancelled);
    // The lookup's late result is kept, not applied.
    let d = run.step(Input::LateToolResult {
        call_id: "intake.t2".into(),
        attempt: 1,
        result: json!({"found": true}),
        worker_id: "w".into(),
    });
    assert!(
        matches!(&d.events[0], Event::LateResultRecorded { discrepancy: Some(m), .. } if m.contains("cancelled"))
    );
}

#[test]
fn the_probe_needs_the_tenants_grant_not_the_callers_and_an_undecided_probe_asks_for_an_operator() {
    let (mut run, _) = uncertain_run(Opts {
        probe: true,
        caller_grants: vec!["crm.write".into()],
        ..Opts::default()
    });
    let d = run.step(Input::DispatchToolCall {
        call_id: "intake.t1.p1".into(),
        attempt: 1,
        worker_id: "w".into(),
        callback_token_sha256: None,
        tenant_grants: None,
    });
    assert_eq!(Run::kinds(&d), ["tool_call_dispatched"]);
    run.step(Input::ToolCallCompleted {
        call_id: "intake.t1.p1".into(),
        attempt: 1,
        result: json!({"nope": 1}),
        secrets: Vec::new(),
    });
    assert!(
        run.state
            .status_reason
            .contains("an operator must resolve it"),
        "{}",
        run.state.status_reason
    );
    assert!(
        !run.state.status_reason.contains("looking it up"),
        "{}",
        run.state.status_reason
    );
}

#[test]
fn lifting_an_operator_pause_under_an_uncertain_outcome_is_not_a_resume() {
    let (mut run, _) = uncertain_run(Opts::default());
    run.step(Input::Pause {
        by: "alice".into(),
        reason: "hold".into(),
    });
    let d = run.step(Input::Resume {
        by: "alice".into(),
        reason: "ok".into(),
    });
    assert_eq!(Run::kinds(&d), ["operator_pause_lifted"]);
    assert_eq!(run.state.status, RunStatus::Paused);
    assert!(run.state.status_reason.starts_with("uncertain outcome"));
}

#[test]
fn a_probe_result_is_cut_to_what_the_tool_declares() {
    let (mut run, _) = uncertain_run(Opts {
        probe: true,
        ..Opts::default()
    });
    run.step(Input::ToolCallCompleted {
        call_id: "intake.t1.p1".into(),
        attempt: 1,
        result: json!({"account_id": "acc_1", "email": "e", "idempotency_key": "k"}),
        secrets: Vec::new(),
    });
    assert_eq!(tool_results(&run), [r#"{"account_id":"acc_1"}"#]);
}

#[test]
fn a_late_result_that_arrives_after_the_run_ended_is_kept_in_its_history() {
    // Issue 22: attempt 1 lost its lease, attempt 2 completed the call and
    // the run completed; attempt 1's result, reported now, is what really
    // happened at the tool: it is recorded, not refused, and not applied.
    let (mut run, _) = Run::start(Opts::default());
    run.model("intake.m1", &[("lookup", r#"{"email":"e"}"#)], None);
    dispatch(&mut run, "intake.t1", 1);
    run.step(Input::LeaseExpired {
        call_id: "intake.t1".into(),
        attempt: 1,
        dispatched: true,
    });
    dispatch(&mut run, "intake.t1", 2);
    run.step(Input::ToolCallCompleted {
        call_id: "intake.t1".into(),
        attempt: 2,
        result: json!("second"),
        secrets: Vec::new(),
    });
    run.model("intake.m2", &[], Some("done"));
    assert_eq!(run.state.status, RunStatus::Completed);
    let d = run.step(Input::LateToolResult {
        call_id: "intake.t1".into(),
        attempt: 1,
        result: json!("first"),
        worker_id: "w".into(),
    });
    assert_eq!(Run::kinds(&d), ["late_result_recorded"]);
    assert!(
        matches!(&d.events[0], Event::LateResultRecorded { attempt: 1, result, discrepancy: Some(m), .. }
            if result == &json!("first") && m.contains("after the run was completed")),
        "{:?}",
        d.events
    );
    assert_eq!(run.state.status, RunStatus::Completed);
    let completed: Vec<&Value> = run
        .history
        .iter()
        .filter_map(|e| match e {
            Event::ToolCallCompleted { result, .. } => Some(result),
            _ => None,
        })
        .collect();
    assert_eq!(completed, [&json!("second")], "never applied");
}
