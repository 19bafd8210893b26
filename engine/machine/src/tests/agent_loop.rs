//! Machine tests: every transition of the agent loop and of a tool call's
//! lifecycle, without a database. Each test also checks that folding the
//! recorded history gives the same state as stepping (replay = live).

use std::collections::BTreeMap;

use belay_proto::wire::{ChatMessage, ModelCallResult, ToolCallSpec, ToolUse, Usage};
use serde_json::{Value, json};

use super::{Opts, Run, scheduled_specs, tool};
use crate::gates::{GateVerdict, ToolGates};
use crate::*;
use belay_definitions::model::{
    CircuitBreakerDef, CompactionDef, LoopPolicy, OnToolFailure, Pricing, RepeatSafety,
    ToolBindingDef,
};

#[test]
fn happy_path_runs_model_tool_model_and_completes() {
    let (mut run, d) = Run::start(Opts::default());
    assert_eq!(
        Run::kinds(&d),
        ["run_started", "node_started", "model_call_scheduled"]
    );
    let specs = scheduled_specs(&d);
    assert_eq!(specs.len(), 1);
    assert_eq!(specs[0].0, "intake.m1");
    assert_eq!(specs[0].2, "r1/intake.m1");
    let tools = specs[0].1["tools"].as_array().expect("tools").len();
    assert_eq!(tools, 3);

    let d = run.model(
        "intake.m1",
        &[("lookup", r#"{"email":"a@example.com"}"#)],
        None,
    );
    assert_eq!(
        Run::kinds(&d),
        ["model_call_completed", "tool_call_scheduled"]
    );
    let specs = scheduled_specs(&d);
    assert_eq!(specs[0].0, "intake.t1");
    let spec: ToolCallSpec = serde_json::from_value(specs[0].1.clone()).expect("tool spec");
    assert_eq!(spec.idempotency_key, "r1/intake.t1");
    // The default was filled in before validation, so what is sent is what was checked.
    assert_eq!(
        spec.arguments,
        json!({"email": "a@example.com", "plan": "starter"})
    );
    assert!(d.commands.contains(&Command::EndTask {
        call_id: "intake.m1".into(),
        end: TaskEnd::Completed
    }));

    let d = run.step(Input::DispatchToolCall {
        call_id: "intake.t1".into(),
        attempt: 1,
        worker_id: "w1".into(),
        callback_token_sha256: None,
        tenant_grants: None,
    });
    assert_eq!(Run::kinds(&d), ["tool_call_dispatched"]);
    let d = run.step(Input::ToolCallCompleted {
        call_id: "intake.t1".into(),
        attempt: 1,
        result: json!({"found": false}),
        secrets: Vec::new(),
    });
    assert_eq!(
        Run::kinds(&d),
        ["tool_call_completed", "model_call_scheduled"]
    );
    let spec = &scheduled_specs(&d)[0].1;
    let last = spec["messages"]
        .as_array()
        .and_then(|m| m.last())
        .cloned()
        .expect("messages");
    assert_eq!(
        last,
        json!({"role": "tool", "tool_call_id": "tu0", "content": "{\"found\":false}"})
    );

    let d = run.model("intake.m2", &[], Some(r#"{"account_id":"acc_1"}"#));
    assert_eq!(
        Run::kinds(&d),
        ["model_call_completed", "node_completed", "run_completed"]
    );
    assert_eq!(run.state.status, RunStatus::Completed);
    assert_eq!(run.state.output, Some(json!({"account_id": "acc_1"})));
}

#[test]
fn each_failed_check_goes_back_to_the_model_in_order() {
    let (mut run, _) = Run::start(Opts {
        caller_grants: vec!["crm.read".into()],
        ..Opts::default()
    });
    let d = run.model(
        "intake.m1",
        &[
            ("delete_everything", "{}"),
            ("lookup", r#"{"email": "#),
            ("lookup", r#"{"email": 42}"#),
            ("create", r#"{"email":"a@example.com"}"#),
            ("lookup", r#"{"email":"a@example.com"}"#),
            ("lookup", &format!(r#"{{"email":"{}"}}"#, "x".repeat(300))),
        ],
        None,
    );
    let refusals: Vec<(String, String)> = d
        .events
        .iter()
        .filter_map(|e| match e {
            Event::ToolCallRefused { check, reason, .. } => Some((check.clone(), reason.clone())),
            _ => None,
        })
        .collect();
    let checks: Vec<&str> = refusals.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(
        checks,
        [
            "not_on_list",
            "invalid_arguments",
            "invalid_arguments",
            "permission",
            "invalid_arguments"
        ]
    );
    assert!(
        refusals[0]
            .1
            .contains("`delete_everything` is not available"),
        "{}",
        refusals[0].1
    );
    assert!(
        refusals[1].1.contains("not valid JSON"),
        "{}",
        refusals[1].1
    );
    assert!(refusals[2].1.contains("input schema"), "{}", refusals[2].1);
    assert!(
        refusals[3].1.contains("not granted to the caller"),
        "{}",
        refusals[3].1
    );
    assert!(
        refusals[4].1.contains("more than the limit of 200 bytes"),
        "{}",
        refusals[4].1
    );
    // Only the valid, permitted call became a task.
    assert_eq!(scheduled_specs(&d).len(), 1);
    // Its result arrives; then every tool_use has exactly one result, in the model's order.
    run.step(Input::DispatchToolCall {
        call_id: "intake.t1".into(),
        attempt: 1,
        worker_id: "w".into(),
        callback_token_sha256: None,
        tenant_grants: None,
    });
    let d = run.step(Input::ToolCallCompleted {
        call_id: "intake.t1".into(),
        attempt: 1,
        result: json!("ok"),
        secrets: Vec::new(),
    });
    assert_eq!(
        Run::kinds(&d),
        ["tool_call_completed", "model_call_scheduled"]
    );
    let results: Vec<(String, String)> = run
        .transcript()
        .into_iter()
        .filter_map(|m| match m {
            ChatMessage::Tool {
                tool_call_id,
                content,
            } => Some((tool_call_id, content)),
            _ => None,
        })
        .collect();
    let ids: Vec<&str> = results.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["tu0", "tu1", "tu2", "tu3", "tu4", "tu5"]);
    assert!(results[0].1.starts_with("error: "));
    assert_eq!(results[4].1, "ok");
}

#[test]
fn results_go_back_in_the_models_order_whatever_order_they_arrive() {
    let (mut run, _) = Run::start(Opts::default());
    run.model(
        "intake.m1",
        &[
            ("lookup", r#"{"email":"1"}"#),
            ("lookup", r#"{"email":"2"}"#),
        ],
        None,
    );
    let d = run.step(Input::ToolCallCompleted {
        call_id: "intake.t2".into(),
        attempt: 1,
        result: json!("second"),
        secrets: Vec::new(),
    });
    assert_eq!(
        Run::kinds(&d),
        ["tool_call_completed"],
        "waits for the first call"
    );
    let d = run.step(Input::ToolCallCompleted {
        call_id: "intake.t1".into(),
        attempt: 1,
        result: json!("first"),
        secrets: Vec::new(),
    });
    assert_eq!(
        Run::kinds(&d),
        ["tool_call_completed", "model_call_scheduled"]
    );
    let contents: Vec<String> = run
        .transcript()
        .into_iter()
        .filter_map(|m| match m {
            ChatMessage::Tool { content, .. } => Some(content),
            _ => None,
        })
        .collect();
    assert_eq!(contents, ["first", "second"]);
}

#[test]
fn tool_call_budget_refuses_calls_beyond_it() {
    let (mut run, _) = Run::start(Opts {
        max_tool_calls: 1,
        ..Opts::default()
    });
    let d = run.model(
        "intake.m1",
        &[
            ("lookup", r#"{"email":"1"}"#),
            ("lookup", r#"{"email":"2"}"#),
        ],
        None,
    );
    assert_eq!(
        Run::kinds(&d),
        [
            "model_call_completed",
            "tool_call_scheduled",
            "tool_call_refused"
        ]
    );
    match &d.events[2] {
        Event::ToolCallRefused { check, .. } => assert_eq!(check, "budget"),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn lost_lease_before_dispatch_is_retried_for_every_repeat_safety() {
    for (tool, n) in [("lookup", 1), ("create", 1), ("wipe", 1)] {
        let (mut run, _) = Run::start(Opts::default());
        run.model("intake.m1", &[(tool, r#"{"email":"e"}"#)], None);
        let d = run.step(Input::LeaseExpired {
            call_id: "intake.t1".into(),
            attempt: n,
            dispatched: false,
        });
        assert_eq!(Run::kinds(&d), ["task_lease_expired"], "{tool}");
        assert_eq!(
            d.commands,
            vec![Command::RetryTask {
                call_id: "intake.t1".into(),
                delay_ms: 500
            }]
        );
    }
}

#[test]
fn idempotent_call_lost_after_dispatch_is_retried_with_the_same_key_until_attempts_run_out() {
    let (mut run, d0) = Run::start(Opts::default());
    let _ = d0;
    let d = run.model("intake.m1", &[("lookup", r#"{"email":"e"}"#)], None);
    let key = scheduled_specs(&d)[0].2.clone();
    for attempt in 1..=2 {
        run.step(Input::DispatchToolCall {
            call_id: "intake.t1".into(),
            attempt,
            worker_id: "w".into(),
            callback_token_sha256: None,
            tenant_grants: None,
        });
        let d = run.step(Input::LeaseExpired {
            call_id: "intake.t1".into(),
            attempt,
            dispatched: true,
        });
        assert!(matches!(d.commands[0], Command::RetryTask { .. }));
        assert_eq!(run.state.tool_calls["intake.t1"].idempotency_key, key);
    }
    run.step(Input::DispatchToolCall {
        call_id: "intake.t1".into(),
        attempt: 3,
        worker_id: "w".into(),
        callback_token_sha256: None,
        tenant_grants: None,
    });
    let d = run.step(Input::LeaseExpired {
        call_id: "intake.t1".into(),
        attempt: 3,
        dispatched: true,
    });
    assert_eq!(
        Run::kinds(&d),
        [
            "task_lease_expired",
            "tool_call_failed",
            "model_call_scheduled"
        ]
    );
}

#[test]
fn never_call_lost_after_dispatch_fails_and_the_model_is_told() {
    let (mut run, _) = Run::start(Opts::default());
    run.model("intake.m1", &[("wipe", r#"{"email":"e"}"#)], None);
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
    assert_eq!(
        Run::kinds(&d),
        [
            "task_lease_expired",
            "tool_call_failed",
            "model_call_scheduled"
        ]
    );
    let told = run.transcript().into_iter().any(|m| matches!(m, ChatMessage::Tool { content, .. } if content.contains("repeat safety is `never`")));
    assert!(told);
}

#[test]
fn reconcile_call_lost_after_dispatch_becomes_uncertain_and_pauses_the_run() {
    let (mut run, _) = Run::start(Opts::default());
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
    assert_eq!(
        Run::kinds(&d),
        [
            "task_lease_expired",
            "uncertain_outcome_recorded",
            "run_paused"
        ]
    );
    assert!(d.commands.iter().any(|c| matches!(c, Command::RecordUncertainOutcome { idempotency_key, .. } if idempotency_key == "r1/intake.t1")));
    assert!(d.commands.contains(&Command::EndTask {
        call_id: "intake.t1".into(),
        end: TaskEnd::Uncertain
    }));
    assert_eq!(run.state.status, RunStatus::Paused);
    // A paused run refuses new dispatches.
    assert!(
        decide(
            &run.state,
            Input::DispatchToolCall {
                call_id: "intake.t1".into(),
                attempt: 2,
                worker_id: "w".into(),
                callback_token_sha256: None,
                tenant_grants: None,
            }
        )
        .is_err()
    );
}

#[test]
fn reported_failures_follow_the_class() {
    // May have acted, reconcile → uncertain.
    let (mut run, _) = Run::start(Opts::default());
    run.model("intake.m1", &[("create", r#"{"email":"e"}"#)], None);
    run.step(Input::DispatchToolCall {
        call_id: "intake.t1".into(),
        attempt: 1,
        worker_id: "w".into(),
        callback_token_sha256: None,
        tenant_grants: None,
    });
    let d = run.step(Input::TaskFailed {
        call_id: "intake.t1".into(),
        attempt: 1,
        error: "timeout after sending".into(),
        class: FailureClass::MayHaveActed,
        dispatched: true,
        status_code: None,
    });
    assert_eq!(
        Run::kinds(&d),
        [
            "tool_call_attempt_failed",
            "uncertain_outcome_recorded",
            "run_paused"
        ]
    );

    // Not sent, reconcile → retry.
    let (mut run, _) = Run::start(Opts::default());
    run.model("intake.m1", &[("create", r#"{"email":"e"}"#)], None);
    run.step(Input::DispatchToolCall {
        call_id: "intake.t1".into(),
        attempt: 1,
        worker_id: "w".into(),
        callback_token_sha256: None,
        tenant_grants: None,
    });
    let d = run.step(Input::TaskFailed {
        call_id: "intake.t1".into(),
        attempt: 1,
        error: "connection refused".into(),
        class: FailureClass::NotSent,
        dispatched: true,
        status_code: None,
    });
    assert_eq!(Run::kinds(&d), ["tool_call_attempt_failed"]);
    assert!(matches!(d.commands[0], Command::RetryTask { .. }));

    // Rejected → the model is told, no retry.
    let (mut run, _) = Run::start(Opts::default());
    run.model("intake.m1", &[("lookup", r#"{"email":"e"}"#)], None);
    let d = run.step(Input::TaskFailed {
        call_id: "intake.t1".into(),
        attempt: 1,
        error: "HTTP 404: no such customer".into(),
        class: FailureClass::Rejected,
        dispatched: true,
        status_code: Some(404),
    });
    assert_eq!(
        Run::kinds(&d),
        [
            "tool_call_attempt_failed",
            "tool_call_failed",
            "model_call_scheduled"
        ]
    );
}

#[test]
fn dispatch_is_recorded_once_per_attempt_and_at_most_once_for_reconcile() {
    let (mut run, _) = Run::start(Opts::default());
    run.model("intake.m1", &[("create", r#"{"email":"e"}"#)], None);
    let d = run.step(Input::DispatchToolCall {
        call_id: "intake.t1".into(),
        attempt: 1,
        worker_id: "w".into(),
        callback_token_sha256: None,
        tenant_grants: None,
    });
    assert_eq!(Run::kinds(&d), ["tool_call_dispatched"]);
    let again = run.step(Input::DispatchToolCall {
        call_id: "intake.t1".into(),
        attempt: 1,
        worker_id: "w".into(),
        callback_token_sha256: None,
        tenant_grants: None,
    });
    assert!(
        again.events.is_empty(),
        "a repeated dispatch of the same attempt records nothing"
    );
    // A dispatched attempt that provably sent nothing did not act: the retry
    // may be dispatched (once more).
    run.step(Input::TaskFailed {
        call_id: "intake.t1".into(),
        attempt: 1,
        error: "connection refused".into(),
        class: FailureClass::NotSent,
        dispatched: true,
        status_code: None,
    });
    let d = run.step(Input::DispatchToolCall {
        call_id: "intake.t1".into(),
        attempt: 2,
        worker_id: "w".into(),
        callback_token_sha256: None,
        tenant_grants: None,
    });
    assert_eq!(Run::kinds(&d), ["tool_call_dispatched"]);
    assert!(!run.state.tool_calls["intake.t1"].may_have_acted);
}

#[test]
fn model_failures_are_retried_then_fail_the_run() {
    let (mut run, _) = Run::start(Opts::default());
    for attempt in 1..=2 {
        let d = run.step(Input::TaskFailed {
            call_id: "intake.m1".into(),
            attempt,
            error: "503".into(),
            class: FailureClass::MayHaveActed,
            dispatched: false,
            status_code: None,
        });
        assert_eq!(Run::kinds(&d), ["model_call_attempt_failed"]);
        assert_eq!(
            d.commands,
            vec![Command::RetryTask {
                call_id: "intake.m1".into(),
                delay_ms: retry_delay_ms(attempt)
            }]
        );
    }
    let d = run.step(Input::LeaseExpired {
        call_id: "intake.m1".into(),
        attempt: 3,
        dispatched: false,
    });
    assert_eq!(Run::kinds(&d), ["model_call_attempt_failed", "run_failed"]);
    assert_eq!(run.state.status, RunStatus::Failed);
    assert!(run.state.status_reason.contains("failed 3 times"));
}

#[test]
fn the_loop_bound_fails_the_run_with_a_reason() {
    let (mut run, _) = Run::start(Opts {
        max_model_steps: 2,
        ..Opts::default()
    });
    run.model("intake.m1", &[("lookup", r#"{"email":"1"}"#)], None);
    run.step(Input::ToolCallCompleted {
        call_id: "intake.t1".into(),
        attempt: 1,
        result: json!(1),
        secrets: Vec::new(),
    });
    run.model("intake.m2", &[("lookup", r#"{"email":"2"}"#)], None);
    let d = run.step(Input::ToolCallCompleted {
        call_id: "intake.t2".into(),
        attempt: 1,
        result: json!(2),
        secrets: Vec::new(),
    });
    assert_eq!(Run::kinds(&d), ["tool_call_completed", "run_failed"]);
    assert!(run.state.status_reason.contains("bound of 2 model steps"));
}

#[test]
fn stale_and_unknown_calls_are_refused_without_events() {
    let (mut run, _) = Run::start(Opts::default());
    run.model("intake.m1", &[("lookup", r#"{"email":"1"}"#)], None);
    run.step(Input::ToolCallCompleted {
        call_id: "intake.t1".into(),
        attempt: 1,
        result: json!(1),
        secrets: Vec::new(),
    });
    let again = decide(
        &run.state,
        Input::ToolCallCompleted {
            call_id: "intake.t1".into(),
            attempt: 1,
            result: json!(1),
            secrets: Vec::new(),
        },
    );
    assert!(matches!(again, Err(MachineError::CallNotOpen { .. })));
    let unknown = decide(
        &run.state,
        Input::ModelCallCompleted {
            call_id: "intake.m9".into(),
            attempt: 1,
            result: ModelCallResult {
                content: None,
                tool_calls: vec![],
                usage: Usage::default(),
                finish_reason: None,
            },
        },
    );
    assert!(matches!(unknown, Err(MachineError::CallNotOpen { .. })));
}

#[test]
fn results_are_truncated_for_the_model_but_kept_whole_in_events() {
    let (mut run, _) = Run::start(Opts {
        max_result_bytes: 10,
        ..Opts::default()
    });
    run.model("intake.m1", &[("lookup", r#"{"email":"1"}"#)], None);
    let big = "y".repeat(100);
    let d = run.step(Input::ToolCallCompleted {
        call_id: "intake.t1".into(),
        attempt: 1,
        result: json!(big),
        secrets: Vec::new(),
    });
    assert!(
        matches!(&d.events[0], Event::ToolCallCompleted { result, .. } if result == &json!(big))
    );
    let content = run.transcript().into_iter().find_map(|m| match m {
        ChatMessage::Tool { content, .. } => Some(content),
        _ => None,
    });
    assert_eq!(
        content.as_deref(),
        Some("yyyyyyyyyy…[truncated: 10 of 100 bytes shown]")
    );
}

#[test]
fn essential_fields_compact_the_result_for_the_model_but_the_event_keeps_it_whole() {
    let (mut run, _) = Run::start(Opts {
        edit: Some(|plan| {
            if let Some(lookup) = plan.tools.get_mut("lookup") {
                lookup.def.compaction = Some(CompactionDef {
                    essential_fields: vec!["items.id".into(), "total".into(), "nope.x".into()],
                    max_description_length: None,
                });
            }
        }),
        ..Opts::default()
    });
    run.model("intake.m1", &[("lookup", r#"{"email":"1"}"#)], None);
    let whole = json!({
        "items": [{"id": 1, "blurb": "long text"}, {"id": 2, "blurb": "more"}],
        "total": 2,
        "debug": {"trace": "abc"}
    });
    let d = run.step(Input::ToolCallCompleted {
        call_id: "intake.t1".into(),
        attempt: 1,
        result: whole.clone(),
        secrets: Vec::new(),
    });
    assert!(matches!(&d.events[0], Event::ToolCallCompleted { result, .. } if result == &whole));
    let content = run.transcript().into_iter().find_map(|m| match m {
        ChatMessage::Tool { content, .. } => Some(content),
        _ => None,
    });
    let shown: Value =
        serde_json::from_str(content.as_deref().unwrap_or("null")).unwrap_or_default();
    assert_eq!(shown, json!({"items": [{"id": 1}, {"id": 2}], "total": 2}));
}

#[test]
fn on_result_sets_run_vars_after_an_agents_call() {
    let (mut run, _) = Run::start(Opts {
        edit: Some(|plan| {
            if let Some(lookup) = plan.tools.get_mut("lookup") {
                lookup.def.on_result.insert(
                    "customer".into(),
                    belay_definitions::expr::Expr::parse(".result.id").expect("valid jq"),
                );
            }
        }),
        ..Opts::default()
    });
    run.model("intake.m1", &[("lookup", r#"{"email":"1"}"#)], None);
    let d = run.step(Input::ToolCallCompleted {
        call_id: "intake.t1".into(),
        attempt: 1,
        result: json!({"id": "c_9", "name": "Ada"}),
        secrets: Vec::new(),
    });
    assert_eq!(
        Run::kinds(&d)[..2],
        ["tool_call_completed", "tool_vars_set"]
    );
    assert_eq!(run.state.vars.get("customer"), Some(&json!("c_9")));
}

#[test]
fn cancel_ends_the_run_and_cancels_open_tasks() {
    let (mut run, _) = Run::start(Opts::default());
    let d = run.step(Input::Cancel {
        reason: "user asked".into(),
    });
    assert_eq!(Run::kinds(&d), ["run_cancelled"]);
    assert_eq!(d.commands, vec![Command::CancelOpenTasks]);
    assert!(
        decide(
            &run.state,
            Input::Cancel {
                reason: "again".into()
            }
        )
        .is_err()
    );
}

#[test]
fn duplicate_or_empty_tool_use_ids_are_made_unique() {
    let (mut run, _) = Run::start(Opts::default());
    let d = run.step(Input::ModelCallCompleted {
        call_id: "intake.m1".into(),
        attempt: 1,
        result: ModelCallResult {
            content: Some("a\u{0}b".into()),
            tool_calls: vec![
                ToolUse {
                    id: "x".into(),
                    name: "lookup".into(),
                    arguments: r#"{"email":"1"}"#.into(),
                },
                ToolUse {
                    id: "x".into(),
                    name: "lookup".into(),
                    arguments: r#"{"email":"2"}"#.into(),
                },
                ToolUse {
                    id: "".into(),
                    name: "lookup".into(),
                    arguments: r#"{"email":"3"}"#.into(),
                },
            ],
            usage: Usage::default(),
            finish_reason: None,
        },
    });
    match &d.events[0] {
        Event::ModelCallCompleted {
            tool_calls,
            content,
            ..
        } => {
            let ids: Vec<&str> = tool_calls.iter().map(|t| t.id.as_str()).collect();
            assert_eq!(ids, ["x", "belay_1_1", "belay_1_2"]);
            assert_eq!(
                content.as_deref(),
                Some("ab"),
                "NUL bytes are stripped at the boundary"
            );
        }
        other => panic!("unexpected {other:?}"),
    }
}

// ---- uncertain outcomes: resolution, probes, late results, operator pause ----

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

fn tool_results(run: &Run) -> Vec<String> {
    run.transcript()
        .into_iter()
        .filter_map(|m| match m {
            ChatMessage::Tool { content, .. } => Some(content),
            _ => None,
        })
        .collect()
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
fn absurd_token_usage_saturates_instead_of_overflowing() {
    let (mut run, _) = Run::start(Opts::default());
    let d = run.step(Input::ModelCallCompleted {
        call_id: "intake.m1".into(),
        attempt: 1,
        result: ModelCallResult {
            content: None,
            tool_calls: vec![ToolUse {
                id: "a".into(),
                name: "lookup".into(),
                arguments: r#"{"email":"1"}"#.into(),
            }],
            usage: Usage {
                input_tokens: u64::MAX,
                output_tokens: 5,
            },
            finish_reason: None,
        },
    });
    assert_eq!(
        Run::kinds(&d),
        ["model_call_completed", "tool_call_scheduled"]
    );
    assert_eq!(run.state.node.as_ref().map(|n| n.tokens), Some(u64::MAX));
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
fn an_mcp_tool_call_is_handed_to_the_worker_with_its_server_and_server_tool() {
    let mut search = tool("search", "web.read", RepeatSafety::Never, &["q"]);
    search.def.binding = ToolBindingDef::Mcp {
        server: "everything".into(),
        server_tool: "echo".into(),
        headers: BTreeMap::from([("X-Key".to_owned(), "{{config.KEY}}".to_owned())]),
        timeout_ms: 5_000,
    };
    let spec = tool_spec(&search, &json!({"q": "hi"}), "r1/intake.t1", None).expect("spec");
    assert_eq!(
        spec["binding"],
        json!({"type": "mcp", "server": "everything", "server_tool": "echo",
               "headers": {"X-Key": "{{config.KEY}}"}, "timeout_ms": 5000})
    );
    let spec: ToolCallSpec = serde_json::from_value(spec).expect("wire spec");
    assert_eq!(spec.tool, "search");
    assert_eq!(spec.idempotency_key, "r1/intake.t1");
    assert!(matches!(
        spec.binding,
        belay_proto::wire::ToolBinding::Mcp(ref b) if b.server_tool == "echo" && b.timeout_ms == 5_000
    ));
}

#[test]
fn a_result_that_does_not_match_the_declared_type_fails_the_call_or_becomes_uncertain() {
    // A `never` tool: the call fails (the tool answered, nothing is
    // repeated), and the model hears why, with the result quoted.
    let (mut run, _) = Run::start(Opts::default());
    run.model("intake.m1", &[("wipe", r#"{"email":"e"}"#)], None);
    run.step(Input::DispatchToolCall {
        call_id: "intake.t1".into(),
        attempt: 1,
        worker_id: "w".into(),
        callback_token_sha256: None,
        tenant_grants: None,
    });
    let d = run.step(Input::ToolCallCompleted {
        call_id: "intake.t1".into(),
        attempt: 1,
        result: json!(["not", "an", "object"]),
        secrets: Vec::new(),
    });
    assert_eq!(
        Run::kinds(&d),
        [
            "tool_call_attempt_failed",
            "tool_call_failed",
            "model_call_scheduled"
        ]
    );
    let told = tool_results(&run);
    assert_eq!(told.len(), 1);
    assert!(
        told[0].contains("does not match its declared return type")
            && told[0].contains("[\"not\",\"an\",\"object\"]"),
        "{told:?}"
    );
    assert!(
        !d.events
            .iter()
            .any(|e| matches!(e, Event::ToolCallCompleted { .. })),
        "a mistyped result is never a success"
    );

    // A reconcile tool: what it did is unknown to the run, so an operator
    // decides; the run pauses.
    let (mut run, _) = Run::start(Opts::default());
    run.model("intake.m1", &[("create", r#"{"email":"e"}"#)], None);
    run.step(Input::DispatchToolCall {
        call_id: "intake.t1".into(),
        attempt: 1,
        worker_id: "w".into(),
        callback_token_sha256: None,
        tenant_grants: None,
    });
    let d = run.step(Input::ToolCallCompleted {
        call_id: "intake.t1".into(),
        attempt: 1,
        result: json!({"id": 7}),
        secrets: Vec::new(),
    });
    assert_eq!(
        Run::kinds(&d),
        [
            "tool_call_attempt_failed",
            "uncertain_outcome_recorded",
            "run_paused"
        ]
    );
    assert_eq!(run.state.status, RunStatus::Paused);
}

// ---- a tool asking a person for input mid-call (MCP elicitation) ----

fn ask(call: &str, attempt: u32, via: &str, requests: Value, may_have_acted: bool) -> Input {
    Input::ToolInputRequested {
        call_id: call.into(),
        attempt,
        via: via.into(),
        requests,
        request_state: (via == "input_required").then(|| "opaque-1".to_owned()),
        may_have_acted,
    }
}

fn dispatch(run: &mut Run, call: &str, attempt: u32) {
    let d = run.step(Input::DispatchToolCall {
        call_id: call.into(),
        attempt,
        worker_id: "w".into(),
        callback_token_sha256: None,
        tenant_grants: None,
    });
    assert_eq!(Run::kinds(&d), ["tool_call_dispatched"]);
}

fn name_form() -> Value {
    json!({
        "message": "Who are you?",
        "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    })
}

#[test]
fn an_elicitation_waits_durably_and_the_answer_repeats_the_call_with_it() {
    let (mut run, _) = Run::start(Opts::default());
    run.model("intake.m1", &[("lookup", r#"{"email":"e"}"#)], None);
    dispatch(&mut run, "intake.t1", 1);
    let d = run.step(ask("intake.t1", 1, "elicitation", name_form(), true));
    assert_eq!(Run::kinds(&d), ["tool_call_input_requested"]);
    assert!(d.commands.contains(&Command::EndTask {
        call_id: "intake.t1".into(),
        end: TaskEnd::Completed
    }));
    assert!(d.commands.iter().any(
        |c| matches!(c, Command::NotifyOperator { kind, .. } if kind == "run.waiting.tool_input")
    ));
    assert_eq!(run.state.status, RunStatus::Waiting);
    assert!(
        run.state.status_reason.contains("waits for input"),
        "{}",
        run.state.status_reason
    );

    // An answer that does not fit the form is refused, and changes nothing.
    let provide = |answer: Value| Input::ProvideToolInput {
        call_id: "intake.t1".into(),
        answer,
        by: "ada".into(),
    };
    for (bad, expect) in [
        (
            json!({"action": "accept", "content": {}}),
            "/content: \"name\" is a required property",
        ),
        (json!({"action": "maybe"}), "/action: must be"),
        (
            json!({"action": "decline", "content": {"name": "x"}}),
            "only an accepted answer has content",
        ),
        (json!("yes"), "an answer is an object"),
    ] {
        match decide(&run.state, provide(bad.clone())) {
            Err(MachineError::InvalidInput { errors, .. }) => {
                assert!(
                    errors.iter().any(|e| e.contains(expect)),
                    "{bad}: {errors:?}"
                )
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
    let answer = json!({"action": "accept", "content": {"name": "Ada"}});
    let d = run.step(provide(answer.clone()));
    assert_eq!(Run::kinds(&d), ["tool_call_input_provided"]);
    assert_eq!(run.state.status, RunStatus::Running);
    let spec = d
        .commands
        .iter()
        .find_map(|c| match c {
            Command::RekeyTask {
                idempotency_key,
                spec,
                ..
            } => Some((idempotency_key.clone(), spec.clone())),
            _ => None,
        })
        .expect("the task gets the answers");
    assert_eq!(spec.0, "r1/intake.t1", "the same idempotency key");
    let with_question = |a: &Value| {
        let mut a = a.clone();
        a["question"] = name_form();
        a
    };
    assert_eq!(
        spec.1["input"],
        json!({"elicitations": [with_question(&answer)]}),
        "each answer goes with the question it answers"
    );
    assert_eq!(spec.1["arguments"]["email"], "e");
    assert!(d.commands.contains(&Command::RetryTask {
        call_id: "intake.t1".into(),
        delay_ms: 0
    }));
    // Answering twice is refused: the call no longer waits.
    assert!(matches!(
        decide(&run.state, provide(answer.clone())),
        Err(MachineError::CallNotOpen { .. })
    ));

    // A second question of the repeated call: the next repeat carries both answers.
    dispatch(&mut run, "intake.t1", 2);
    run.step(ask("intake.t1", 2, "elicitation", name_form(), true));
    let second = json!({"action": "decline"});
    let d = run.step(provide(second.clone()));
    let input = d.events.iter().find_map(|e| match e {
        Event::ToolCallInputProvided { input, .. } => Some(input.clone()),
        _ => None,
    });
    assert_eq!(
        input,
        Some(json!({"elicitations": [with_question(&answer), with_question(&second)]}))
    );
    dispatch(&mut run, "intake.t1", 3);
    let d = run.step(Input::ToolCallCompleted {
        call_id: "intake.t1".into(),
        attempt: 3,
        result: json!({"found": true}),
        secrets: Vec::new(),
    });
    assert_eq!(
        Run::kinds(&d),
        ["tool_call_completed", "model_call_scheduled"]
    );
}

#[test]
fn a_call_that_may_have_acted_waits_only_when_repeating_it_is_safe() {
    // `never`: the server kept running after Belay declined to answer, so a
    // repeat would repeat it: the call fails, saying why.
    let (mut run, _) = Run::start(Opts::default());
    run.model("intake.m1", &[("wipe", r#"{"email":"e"}"#)], None);
    dispatch(&mut run, "intake.t1", 1);
    let d = run.step(ask("intake.t1", 1, "elicitation", name_form(), true));
    assert_eq!(
        Run::kinds(&d),
        [
            "tool_call_attempt_failed",
            "tool_call_failed",
            "model_call_scheduled"
        ]
    );
    assert!(
        tool_results(&run)[0].contains("repeat safety `never`"),
        "{:?}",
        tool_results(&run)
    );

    // `reconcile`, may have acted: an uncertain outcome, as for a lost answer.
    let (mut run, _) = Run::start(Opts::default());
    run.model("intake.m1", &[("create", r#"{"email":"e"}"#)], None);
    dispatch(&mut run, "intake.t1", 1);
    let d = run.step(ask("intake.t1", 1, "elicitation", name_form(), true));
    assert_eq!(
        Run::kinds(&d),
        [
            "tool_call_attempt_failed",
            "uncertain_outcome_recorded",
            "run_paused"
        ]
    );

    // `reconcile`, asked before acting (MCP 2026-07-28 `input_required`):
    // it waits, and the repeat echoes the server's state with the responses.
    let (mut run, _) = Run::start(Opts::default());
    run.model("intake.m1", &[("create", r#"{"email":"e"}"#)], None);
    dispatch(&mut run, "intake.t1", 1);
    let requests = json!({"who": {"method": "elicitation/create", "params": name_form()}});
    let d = run.step(ask("intake.t1", 1, "input_required", requests, false));
    assert_eq!(Run::kinds(&d), ["tool_call_input_requested"]);
    let bad = decide(
        &run.state,
        Input::ProvideToolInput {
            call_id: "intake.t1".into(),
            answer: json!({"responses": {"other": {"action": "cancel"}}}),
            by: "ada".into(),
        },
    );
    match bad {
        Err(MachineError::InvalidInput { errors, .. }) => {
            assert!(
                errors.contains(&"/responses/who: not answered".to_owned()),
                "{errors:?}"
            );
            assert!(
                errors
                    .iter()
                    .any(|e| e.contains("/responses/other: the tool asked no such request")),
                "{errors:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    let responses = json!({"who": {"action": "accept", "content": {"name": "Ada"}}});
    let d = run.step(Input::ProvideToolInput {
        call_id: "intake.t1".into(),
        answer: json!({"responses": responses}),
        by: "ada".into(),
    });
    let spec = d.commands.iter().find_map(|c| match c {
        Command::RekeyTask { spec, .. } => Some(spec.clone()),
        _ => None,
    });
    assert_eq!(
        spec.map(|s| s["input"].clone()),
        Some(json!({"responses": responses, "request_state": "opaque-1"}))
    );
    // It was not dispatched in a way that may have acted: it may run again.
    dispatch(&mut run, "intake.t1", 2);
}

#[test]
fn a_tool_asking_for_ever_fails_and_an_operator_can_fail_a_waiting_call() {
    let (mut run, _) = Run::start(Opts::default());
    run.model("intake.m1", &[("lookup", r#"{"email":"e"}"#)], None);
    for round in 1..=MAX_INPUT_ROUNDS {
        dispatch(&mut run, "intake.t1", round);
        run.step(ask(
            "intake.t1",
            round,
            "url_elicitation_required",
            json!({"elicitations": []}),
            false,
        ));
        let d = run.step(Input::ProvideToolInput {
            call_id: "intake.t1".into(),
            answer: json!({"action": "accept"}),
            by: "ada".into(),
        });
        assert_eq!(Run::kinds(&d), ["tool_call_input_provided"]);
    }
    dispatch(&mut run, "intake.t1", MAX_INPUT_ROUNDS + 1);
    let d = run.step(ask(
        "intake.t1",
        MAX_INPUT_ROUNDS + 1,
        "url_elicitation_required",
        json!({}),
        false,
    ));
    assert_eq!(
        Run::kinds(&d),
        [
            "tool_call_attempt_failed",
            "tool_call_failed",
            "model_call_scheduled"
        ]
    );
    assert!(
        tool_results(&run)[0].contains("more than 8 times"),
        "{:?}",
        tool_results(&run)
    );

    // A call waiting for a person can be failed by an operator.
    let (mut run, _) = Run::start(Opts::default());
    run.model("intake.m1", &[("lookup", r#"{"email":"e"}"#)], None);
    dispatch(&mut run, "intake.t1", 1);
    run.step(ask("intake.t1", 1, "elicitation", name_form(), false));
    let d = run.step(Input::FailWaitingCall {
        call_id: "intake.t1".into(),
        by: "ops".into(),
        reason: "nobody is there".into(),
    });
    assert_eq!(Run::kinds(&d), ["tool_call_failed", "model_call_scheduled"]);
    assert_eq!(run.state.status, RunStatus::Running);
}

// ---- loop policies, stop conditions and budgets ----

fn stop_of(d: &Decision) -> Option<Stop> {
    d.events.iter().find_map(|e| match e {
        Event::RunFailed { stop, .. } => stop.clone(),
        _ => None,
    })
}

#[test]
fn a_turn_cut_off_by_the_token_limit_never_runs_its_tool_calls() {
    let (mut run, _) = Run::start(Opts::default());
    let d = run.step(Input::ModelCallCompleted {
        call_id: "intake.m1".into(),
        attempt: 1,
        result: ModelCallResult {
            content: None,
            tool_calls: vec![
                ToolUse {
                    id: "a".into(),
                    name: "lookup".into(),
                    arguments: r#"{"email":"x@y.z"}"#.into(),
                },
                ToolUse {
                    id: "b".into(),
                    name: "create".into(),
                    arguments: r#"{"email":"x@y"#.into(),
                },
            ],
            usage: Usage::default(),
            finish_reason: Some("length".into()),
        },
    });
    assert_eq!(
        Run::kinds(&d),
        [
            "model_call_completed",
            "tool_call_refused",
            "tool_call_refused",
            "model_call_scheduled"
        ]
    );
    assert!(
        scheduled_specs(&d)
            .iter()
            .all(|(id, _, _)| id == "intake.m2"),
        "no tool task"
    );
    assert!(
        d.events
            .iter()
            .all(|e| !matches!(e, Event::ToolCallRefused { check, .. } if check != "truncated"))
    );
    assert!(
        tool_results(&run)
            .iter()
            .all(|r| r.contains("cut off by the output token limit")),
        "{:?}",
        tool_results(&run)
    );
}

#[test]
fn exactly_one_call_refuses_a_tool_call_and_stops() {
    let opts = Opts {
        edit: Some(|p| {
            if let Some(a) = p.agents.get_mut("onboarder") {
                a.def.loop_policy = LoopPolicy::ExactlyOneCall;
            }
        }),
        ..Opts::default()
    };
    // A final answer in the one call: done.
    let (mut run, _) = Run::start(Opts {
        edit: opts.edit,
        ..Opts::default()
    });
    let d = run.model("intake.m1", &[], Some(r#"{"account_id":"a"}"#));
    assert_eq!(
        Run::kinds(&d),
        ["model_call_completed", "node_completed", "run_completed"]
    );
    // A tool call would need a second model call: refused, and the run stops.
    let (mut run, _) = Run::start(opts);
    let d = run.model("intake.m1", &[("lookup", r#"{"email":"e"}"#)], None);
    assert_eq!(
        Run::kinds(&d),
        ["model_call_completed", "tool_call_refused", "run_failed"]
    );
    assert_eq!(
        stop_of(&d),
        Some(Stop::LoopPolicy {
            node: "intake".into(),
            tool: "lookup".into()
        })
    );
}

#[test]
fn the_same_call_proposed_again_and_again_stops_the_run() {
    let (mut run, _) = Run::start(Opts {
        edit: Some(|p| {
            if let Some(a) = p.agents.get_mut("onboarder") {
                a.def.max_identical_calls = 3;
            }
        }),
        ..Opts::default()
    });
    for (i, result) in [(1, json!({"n": 1})), (2, json!({"n": 1}))] {
        run.model(
            &format!("intake.m{i}"),
            &[("lookup", r#"{"email":"e"}"#)],
            None,
        );
        let call = format!("intake.t{i}");
        dispatch(&mut run, &call, 1);
        run.step(Input::ToolCallCompleted {
            call_id: call,
            attempt: 1,
            result,
            secrets: Vec::new(),
        });
    }
    // The third time in a row: refused, and the run stops.
    let d = run.model("intake.m3", &[("lookup", r#"{"email":"e"}"#)], None);
    assert_eq!(Run::kinds(&d)[1..], ["tool_call_refused", "run_failed"]);
    assert_eq!(
        stop_of(&d),
        Some(Stop::NoProgress {
            node: "intake".into(),
            tool: "lookup".into(),
            times: 3
        })
    );
}

#[test]
fn budgets_of_the_node_and_of_the_run_stop_it_with_a_typed_outcome() {
    // Node: 10 input tokens per model call (Run::model), at most 15.
    let (mut run, _) = Run::start(Opts {
        edit: Some(|p| {
            if let Some(a) = p.agents.get_mut("onboarder") {
                a.def.budget.max_input_tokens = Some(15);
            }
        }),
        ..Opts::default()
    });
    run.model("intake.m1", &[("lookup", r#"{"email":"e"}"#)], None);
    dispatch(&mut run, "intake.t1", 1);
    run.step(Input::ToolCallCompleted {
        call_id: "intake.t1".into(),
        attempt: 1,
        result: json!({}),
        secrets: Vec::new(),
    });
    run.model("intake.m2", &[("lookup", r#"{"email":"f"}"#)], None);
    dispatch(&mut run, "intake.t2", 1);
    let d = run.step(Input::ToolCallCompleted {
        call_id: "intake.t2".into(),
        attempt: 1,
        result: json!({}),
        secrets: Vec::new(),
    });
    assert_eq!(Run::kinds(&d), ["tool_call_completed", "run_failed"]);
    assert_eq!(
        stop_of(&d),
        Some(Stop::Budget {
            budget: "input_tokens".into(),
            scope: "node".into(),
            node: "intake".into(),
            limit: json!(15),
            used: json!(20)
        })
    );

    // Run: cost from the agent's price table (10 in, 5 out per call at
    // $1 / $2 per million tokens = $0.00002 per call), at most $0.00003.
    let (mut run, _) = Run::start(Opts {
        edit: Some(|p| {
            if let Some(a) = p.agents.get_mut("onboarder") {
                a.def.pricing = Some(Pricing {
                    input_per_million_usd: 1.0,
                    output_per_million_usd: 2.0,
                });
            }
            p.workflow.def.budget.max_cost_usd = Some(0.00003);
        }),
        ..Opts::default()
    });
    run.model("intake.m1", &[("lookup", r#"{"email":"e"}"#)], None);
    dispatch(&mut run, "intake.t1", 1);
    run.step(Input::ToolCallCompleted {
        call_id: "intake.t1".into(),
        attempt: 1,
        result: json!({}),
        secrets: Vec::new(),
    });
    assert_eq!(
        run.state.status,
        RunStatus::Running,
        "one call is under the budget"
    );
    run.model("intake.m2", &[("lookup", r#"{"email":"f"}"#)], None);
    dispatch(&mut run, "intake.t2", 1);
    let d = run.step(Input::ToolCallCompleted {
        call_id: "intake.t2".into(),
        attempt: 1,
        result: json!({}),
        secrets: Vec::new(),
    });
    match stop_of(&d) {
        Some(Stop::Budget {
            budget,
            scope,
            used,
            ..
        }) => {
            assert_eq!((budget.as_str(), scope.as_str()), ("cost_usd", "run"));
            assert!(
                (used.as_f64().unwrap_or(0.0) - 0.00004).abs() < 1e-12,
                "{used}"
            );
        }
        other => panic!("{other:?}"),
    }

    // Run: tool calls past the workflow's budget are refused to the model.
    let (mut run, _) = Run::start(Opts {
        edit: Some(|p| p.workflow.def.budget.max_tool_calls = Some(1)),
        ..Opts::default()
    });
    let d = run.model(
        "intake.m1",
        &[
            ("lookup", r#"{"email":"e"}"#),
            ("lookup", r#"{"email":"f"}"#),
        ],
        None,
    );
    assert_eq!(
        Run::kinds(&d),
        [
            "model_call_completed",
            "tool_call_scheduled",
            "tool_call_refused"
        ]
    );
}

#[test]
fn on_tool_failure_stop_ends_the_run_when_a_call_fails_for_good() {
    let (mut run, _) = Run::start(Opts {
        edit: Some(|p| {
            if let Some(a) = p.agents.get_mut("onboarder") {
                a.def.on_tool_failure = OnToolFailure::Stop;
            }
        }),
        ..Opts::default()
    });
    run.model("intake.m1", &[("wipe", r#"{"email":"e"}"#)], None);
    dispatch(&mut run, "intake.t1", 1);
    let d = run.step(Input::TaskFailed {
        call_id: "intake.t1".into(),
        attempt: 1,
        error: "HTTP 400".into(),
        class: FailureClass::Rejected,
        dispatched: true,
        status_code: Some(400),
    });
    assert_eq!(
        Run::kinds(&d),
        ["tool_call_attempt_failed", "tool_call_failed", "run_failed"]
    );
    assert_eq!(
        stop_of(&d),
        Some(Stop::ToolFailed {
            node: "intake".into(),
            call_id: "intake.t1".into(),
            tool: "wipe".into()
        })
    );
}

#[test]
fn secrets_in_results_are_redacted_before_they_are_recorded_unless_the_tool_opts_out() {
    let (mut run, _) = Run::start(Opts::default());
    run.model("intake.m1", &[("lookup", r#"{"email":"e"}"#)], None);
    dispatch(&mut run, "intake.t1", 1);
    let d = run.step(Input::ToolCallCompleted {
        call_id: "intake.t1".into(),
        attempt: 1,
        result: json!({"found": true, "api_key": "k_live_123", "echo": "Authorization: Bearer abcdefghijklmnop"}),
        secrets: Vec::new(),
    });
    let recorded = d.events.iter().find_map(|e| match e {
        Event::ToolCallCompleted { result, .. } => Some(result.clone()),
        _ => None,
    });
    assert_eq!(
        recorded,
        Some(
            json!({"found": true, "api_key": "[REDACTED:secret_field]", "echo": "Authorization: Bearer [REDACTED:bearer_token]"})
        )
    );
    assert!(!tool_results(&run)[0].contains("k_live_123"));

    let (mut run, _) = Run::start(Opts {
        edit: Some(|p| {
            if let Some(t) = p.tools.get_mut("lookup") {
                t.def.scrub_secrets = false;
            }
        }),
        ..Opts::default()
    });
    run.model("intake.m1", &[("lookup", r#"{"email":"e"}"#)], None);
    dispatch(&mut run, "intake.t1", 1);
    let raw = json!({"api_key": "k_live_123"});
    let d = run.step(Input::ToolCallCompleted {
        call_id: "intake.t1".into(),
        attempt: 1,
        result: raw.clone(),
        secrets: Vec::new(),
    });
    assert!(
        d.events
            .iter()
            .any(|e| matches!(e, Event::ToolCallCompleted { result, .. } if *result == raw))
    );
}

#[test]
fn attempts_that_sent_nothing_have_a_longer_allowance_than_attempts_that_may_have_acted() {
    let (mut run, _) = Run::start(Opts::default());
    run.model("intake.m1", &[("lookup", r#"{"email":"e"}"#)], None);
    let fail = |attempt: u32, class: FailureClass| Input::TaskFailed {
        call_id: "intake.t1".into(),
        attempt,
        error: "connection refused".into(),
        class,
        dispatched: true,
        status_code: None,
    };
    // The agent allows 3 attempts; a server that is down (not sent) is
    // retried far longer, with a delay growing to 30 s.
    for attempt in 1..MAX_NOT_SENT_ATTEMPTS {
        dispatch(&mut run, "intake.t1", attempt);
        let d = run.step(fail(attempt, FailureClass::NotSent));
        assert!(
            d.commands
                .iter()
                .any(|c| matches!(c, Command::RetryTask { delay_ms, .. } if *delay_ms <= 30_000)),
            "attempt {attempt}: {:?}",
            Run::kinds(&d)
        );
    }
    // Those did not use up the attempts of a call that may have acted.
    let a = MAX_NOT_SENT_ATTEMPTS;
    dispatch(&mut run, "intake.t1", a);
    let d = run.step(fail(a, FailureClass::MayHaveActed));
    assert!(
        d.commands
            .iter()
            .any(|c| matches!(c, Command::RetryTask { delay_ms: 500, .. }))
    );
    // The last not-sent attempt of the allowance fails the call, saying so.
    dispatch(&mut run, "intake.t1", a + 1);
    let d = run.step(fail(a + 1, FailureClass::NotSent));
    assert_eq!(
        Run::kinds(&d),
        [
            "tool_call_attempt_failed",
            "tool_call_failed",
            "model_call_scheduled"
        ]
    );
    assert!(
        tool_results(&run)[0].contains("could not be reached in 30 attempts (nothing was sent)"),
        "{:?}",
        tool_results(&run)
    );
}

#[test]
fn errors_quoting_what_a_tool_answered_are_scrubbed_too() {
    let (mut run, _) = Run::start(Opts::default());
    run.model("intake.m1", &[("wipe", r#"{"email":"e"}"#)], None);
    dispatch(&mut run, "intake.t1", 1);
    run.step(Input::TaskFailed {
        call_id: "intake.t1".into(),
        attempt: 1,
        error: "HTTP 401: {\"error\":\"bad key\",\"echo\":\"Bearer abcdefghijklmnop\"}".into(),
        class: FailureClass::Rejected,
        dispatched: true,
        status_code: Some(401),
    });
    let told = tool_results(&run);
    assert!(
        told[0].contains("Bearer [REDACTED:bearer_token]") && !told[0].contains("abcdefghijklmnop"),
        "{told:?}"
    );
}

/// `lookup` with `rate_limit: 2` and `circuit_breaker: {threshold: 3, resetMs: 10000}`.
fn gated_lookup(plan: &mut RunPlan) {
    if let Some(lookup) = plan.tools.get_mut("lookup") {
        lookup.def.rate_limit = Some(2.0);
        lookup.def.circuit_breaker = Some(CircuitBreakerDef {
            threshold: 3,
            reset_ms: 10_000,
        });
    }
}

fn dispatch_input(call_id: &str, attempt: u32) -> Input {
    Input::DispatchToolCall {
        call_id: call_id.into(),
        attempt,
        worker_id: "w1".into(),
        callback_token_sha256: None,
        tenant_grants: None,
    }
}

fn outcomes(d: &Decision) -> Vec<(String, bool)> {
    d.commands
        .iter()
        .filter_map(|c| match c {
            Command::RecordToolOutcome { tool, failed, .. } => Some((tool.clone(), *failed)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_gated_dispatch_asks_for_the_gates_and_a_deferral_is_no_attempt() {
    let (mut run, _) = Run::start(Opts {
        edit: Some(gated_lookup),
        ..Opts::default()
    });
    run.model(
        "intake.m1",
        &[
            ("lookup", r#"{"email":"a@example.com"}"#),
            ("create", r#"{"email":"a@example.com"}"#),
        ],
        None,
    );
    // The store passes the gates of the dispatch decision before writing it.
    let first = decide(&run.state, dispatch_input("intake.t1", 1)).expect("dispatch");
    assert_eq!(Run::kinds(&first), ["tool_call_dispatched"]);
    assert_eq!(
        first.commands.last(),
        Some(&Command::PassToolGates {
            tool: "lookup".into(),
            gates: ToolGates {
                rate_limit: Some(2.0),
                circuit_breaker: Some(CircuitBreakerDef {
                    threshold: 3,
                    reset_ms: 10_000
                }),
            },
            holds_turn: false,
        })
    );
    // A tool without gates asks for nothing.
    let ungated = decide(&run.state, dispatch_input("intake.t2", 1)).expect("dispatch");
    assert_eq!(
        ungated.commands,
        vec![Command::MarkDispatched {
            call_id: "intake.t2".into(),
            attempt: 1
        }]
    );
    // The gates say "not yet": that decision is written instead.
    let d = run.step(Input::DispatchGated {
        call_id: "intake.t1".into(),
        attempt: 1,
        worker_id: "w1".into(),
        verdict: GateVerdict::Defer {
            delay_ms: 400,
            until: "2026-01-01T00:00:00.400Z".into(),
            rate_limit: 2.0,
        },
    });
    assert_eq!(Run::kinds(&d), ["tool_call_deferred"]);
    let Event::ToolCallDeferred { until, reason, .. } = &d.events[0] else {
        panic!("{:?}", d.events);
    };
    assert_eq!(until, "2026-01-01T00:00:00.400Z");
    assert!(reason.contains("rate limit (2 per second)"), "{reason}");
    assert_eq!(
        d.commands,
        vec![Command::RetryTask {
            call_id: "intake.t1".into(),
            delay_ms: 400
        }]
    );
    let call = &run.state.tool_calls["intake.t1"];
    assert_eq!(
        (
            call.failed_attempts,
            call.not_sent_failures,
            call.dispatched_attempt
        ),
        (0, 0, None)
    );
    // Its turn: it holds one (it does not queue again), is dispatched, and
    // a result closes the circuit.
    let d = run.step(dispatch_input("intake.t1", 2));
    assert_eq!(Run::kinds(&d), ["tool_call_dispatched"]);
    assert!(matches!(
        d.commands.last(),
        Some(Command::PassToolGates {
            holds_turn: true,
            ..
        })
    ));
    assert!(!run.state.tool_calls["intake.t1"].holds_turn);
    let d = run.step(Input::ToolCallCompleted {
        call_id: "intake.t1".into(),
        attempt: 2,
        result: json!({"found": false}),
        secrets: Vec::new(),
    });
    assert_eq!(outcomes(&d), vec![("lookup".to_owned(), false)]);
    // Outcomes of tools without a breaker move nothing.
    run.step(dispatch_input("intake.t2", 1));
    let d = run.step(Input::ToolCallCompleted {
        call_id: "intake.t2".into(),
        attempt: 1,
        result: json!({"account_id": "acc_1"}),
        secrets: Vec::new(),
    });
    assert_eq!(outcomes(&d), vec![]);
}

#[test]
fn an_open_circuit_fails_the_call_unsent_and_the_model_hears_why() {
    let (mut run, _) = Run::start(Opts {
        edit: Some(gated_lookup),
        ..Opts::default()
    });
    run.model(
        "intake.m1",
        &[("lookup", r#"{"email":"a@example.com"}"#)],
        None,
    );
    let d = run.step(Input::DispatchGated {
        call_id: "intake.t1".into(),
        attempt: 1,
        worker_id: "w1".into(),
        verdict: GateVerdict::CircuitOpen {
            failures: 3,
            until: "2026-01-01T00:00:10.000Z".into(),
            probing: false,
        },
    });
    assert_eq!(
        Run::kinds(&d),
        [
            "tool_call_attempt_failed",
            "tool_call_failed",
            "model_call_scheduled"
        ]
    );
    let Event::ToolCallAttemptFailed {
        class, dispatched, ..
    } = &d.events[0]
    else {
        panic!("{:?}", d.events);
    };
    assert_eq!((*class, *dispatched), (FailureClass::Rejected, false));
    // Failing fast is not a failure of the endpoint.
    assert_eq!(outcomes(&d), vec![]);
    let told = run.transcript().last().cloned().expect("a tool message");
    let told = serde_json::to_string(&told).expect("json");
    assert!(
        told.contains("the circuit breaker of tool `lookup` is open after 3 consecutive failures: calls fail without being sent until 2026-01-01T00:00:10.000Z"),
        "{told}"
    );
}

#[test]
fn only_failures_of_the_endpoint_count_against_the_circuit() {
    let (mut run, _) = Run::start(Opts {
        edit: Some(gated_lookup),
        ..Opts::default()
    });
    run.model(
        "intake.m1",
        &[
            ("lookup", r#"{"email":"a@example.com"}"#),
            ("lookup", r#"{"email":"b@example.com"}"#),
        ],
        None,
    );
    let failed = |call: &str, attempt, class, dispatched, status_code| Input::TaskFailed {
        call_id: call.into(),
        attempt,
        error: "failed".into(),
        class,
        dispatched,
        status_code,
    };
    // A definite refusal (404) says the endpoint works.
    run.step(dispatch_input("intake.t1", 1));
    let d = run.step(failed(
        "intake.t1",
        1,
        FailureClass::Rejected,
        true,
        Some(404),
    ));
    assert_eq!(outcomes(&d), vec![]);
    // A 503 counts; so does a connection refused after dispatch; a failure
    // before dispatch does not.
    run.step(dispatch_input("intake.t2", 1));
    let d = run.step(failed(
        "intake.t2",
        1,
        FailureClass::NotSent,
        true,
        Some(503),
    ));
    assert_eq!(outcomes(&d), vec![("lookup".to_owned(), true)]);
    run.step(dispatch_input("intake.t2", 2));
    let d = run.step(failed("intake.t2", 2, FailureClass::NotSent, true, None));
    assert_eq!(outcomes(&d), vec![("lookup".to_owned(), true)]);
    let d = run.step(failed("intake.t2", 3, FailureClass::NotSent, false, None));
    assert_eq!(outcomes(&d), vec![]);
    // A lost lease says nothing about the endpoint.
    run.step(dispatch_input("intake.t2", 4));
    let d = run.step(Input::LeaseExpired {
        call_id: "intake.t2".into(),
        attempt: 4,
        dispatched: true,
    });
    assert_eq!(outcomes(&d), vec![]);
}

/// One hour, ms: the wall-time budget of the deadline tests.
const HOUR_MS: u64 = 3_600_000;

fn deadline_timer(timer_id: &str, ms: u64) -> Command {
    Command::ScheduleTimer(TimerSpec {
        timer_id: timer_id.into(),
        after_ms: Some(ms),
        at: None,
        purpose: TimerPurpose::Deadline,
    })
}

fn cancels_timer(d: &Decision, timer_id: &str) -> bool {
    d.commands
        .iter()
        .any(|c| matches!(c, Command::CancelTimer { timer_id: t } if t == timer_id))
}

#[test]
fn a_node_deadline_that_fires_mid_loop_stops_the_run_with_a_typed_outcome() {
    let (mut run, d) = Run::start(Opts {
        edit: Some(|p| {
            if let Some(a) = p.agents.get_mut("onboarder") {
                a.def.budget.max_wall_time_ms = Some(HOUR_MS);
            }
        }),
        ..Opts::default()
    });
    // The node's timer is set when it starts, and recorded in its event.
    assert!(
        d.commands
            .contains(&deadline_timer("intake.deadline", HOUR_MS))
    );
    assert!(d.events.iter().any(|e| matches!(
        e,
        Event::NodeStarted { deadline: Some(t), .. } if t.timer_id == "intake.deadline"
    )));
    // Mid-loop: a dispatched `reconcile` call and an idempotent one not
    // yet dispatched are in flight.
    run.model(
        "intake.m1",
        &[
            ("create", r#"{"email":"e"}"#),
            ("lookup", r#"{"email":"e"}"#),
        ],
        None,
    );
    dispatch(&mut run, "intake.t1", 1);
    let d = run.step(Input::TimerFired {
        timer_id: "intake.deadline".into(),
        overdue_ms: 250,
    });
    assert_eq!(
        Run::kinds(&d),
        ["timer_fired", "uncertain_outcome_recorded", "run_failed"]
    );
    assert_eq!(
        stop_of(&d),
        Some(Stop::Deadline {
            scope: "node".into(),
            node: "intake".into(),
            limit_ms: HOUR_MS,
            elapsed_ms: HOUR_MS + 250,
        })
    );
    assert_eq!(run.state.status, RunStatus::Failed);
    assert!(
        run.state.status_reason.contains("`wall_time` budget"),
        "{}",
        run.state.status_reason
    );
    // In flight, as at a cancel: tasks cancelled, the dispatched reconcile
    // call kept for an operator, the timer row deleted.
    assert!(d.commands.contains(&Command::CancelOpenTasks));
    assert!(d.commands.iter().any(|c| matches!(
        c,
        Command::RecordUncertainOutcome { call_id, reason, .. }
            if call_id == "intake.t1" && reason.contains("wall-time budget")
    )));
    assert!(
        d.commands
            .iter()
            .any(|c| matches!(c, Command::NotifyOperator { .. }))
    );
    assert!(cancels_timer(&d, "intake.deadline"));
    // Firing again (a second replica) changes nothing.
    let again = run.step(Input::TimerFired {
        timer_id: "intake.deadline".into(),
        overdue_ms: 300,
    });
    assert!(again.events.is_empty());
}

#[test]
fn a_node_deadline_that_fires_after_its_node_finished_changes_nothing() {
    let (mut run, _) = Run::start(Opts {
        edit: Some(|p| {
            if let Some(a) = p.agents.get_mut("onboarder") {
                a.def.budget.max_wall_time_ms = Some(HOUR_MS);
            }
            // A second agent node after the first.
            let mut review = p.workflow.def.nodes[0].clone();
            review.id = "review".into();
            p.workflow.def.nodes[0].next = Some("review".into());
            p.workflow.def.nodes.push(review);
        }),
        ..Opts::default()
    });
    let d = run.model("intake.m1", &[], Some("done"));
    assert_eq!(
        Run::kinds(&d),
        [
            "model_call_completed",
            "node_completed",
            "node_started",
            "model_call_scheduled"
        ]
    );
    // The finished node's timer is deleted, the next node's set.
    assert!(cancels_timer(&d, "intake.deadline"));
    assert!(
        d.commands
            .contains(&deadline_timer("review.deadline", HOUR_MS))
    );
    // A firing that raced the delete is stale: nothing happens to `review`.
    let before = run.state.clone();
    let d = run.step(Input::TimerFired {
        timer_id: "intake.deadline".into(),
        overdue_ms: 0,
    });
    assert!(d.events.is_empty(), "{:?}", d.events);
    assert_eq!(
        d.commands,
        [Command::CancelTimer {
            timer_id: "intake.deadline".into()
        }]
    );
    assert_eq!(run.state, before);
    // The run completes normally and deletes the live timer.
    let d = run.model("review.m1", &[], Some("ok"));
    assert!(Run::kinds(&d).contains(&"run_completed"));
    assert!(cancels_timer(&d, "review.deadline"));
}

#[test]
fn a_run_deadline_stops_the_run_in_whatever_node_it_is() {
    let (mut run, d) = Run::start(Opts {
        edit: Some(|p| p.workflow.def.budget.max_wall_time_ms = Some(2 * HOUR_MS)),
        ..Opts::default()
    });
    assert!(
        d.commands
            .contains(&deadline_timer(RUN_DEADLINE_TIMER, 2 * HOUR_MS))
    );
    assert!(d.events.iter().any(|e| matches!(
        e,
        Event::RunStarted { deadline: Some(t), .. } if t.timer_id == RUN_DEADLINE_TIMER
    )));
    // A model call is open; no node budget is set.
    let d = run.step(Input::TimerFired {
        timer_id: RUN_DEADLINE_TIMER.into(),
        overdue_ms: 0,
    });
    assert_eq!(Run::kinds(&d), ["timer_fired", "run_failed"]);
    assert_eq!(
        stop_of(&d),
        Some(Stop::Deadline {
            scope: "run".into(),
            node: "intake".into(),
            limit_ms: 2 * HOUR_MS,
            elapsed_ms: 2 * HOUR_MS,
        })
    );
    assert!(d.commands.contains(&Command::CancelOpenTasks));
    assert_eq!(
        run.state.status_reason,
        "the run (in node `intake`) used its `wall_time` budget (2h of 2h)"
    );
    // The run's stop is persisted as a tagged value.
    let stop = serde_json::to_value(stop_of(&d)).expect("serialise");
    assert_eq!(
        stop,
        json!({"kind": "deadline", "scope": "run", "node": "intake", "limit_ms": 7_200_000, "elapsed_ms": 7_200_000})
    );
}

#[test]
fn a_producer_vaults_its_result_fields_and_a_consumer_reads_them_at_dispatch() {
    use belay_definitions::model::ResultSecretDef;
    let sealed = |key: &str| SealedSecret {
        key: key.into(),
        nonce: vec![0; 12],
        ciphertext: vec![7, 7, 7],
    };
    let (mut run, _) = Run::start(Opts {
        edit: Some(|plan| {
            if let Some(lookup) = plan.tools.get_mut("lookup") {
                lookup.def.result_secrets = vec![
                    ResultSecretDef {
                        path: "otp".into(),
                        key: "txn_otp".into(),
                        consumers: vec!["create".into()],
                        ttl_s: Some(300),
                        single_use: true,
                    },
                    ResultSecretDef {
                        path: "session.key".into(),
                        key: "sess".into(),
                        consumers: vec![],
                        ttl_s: None,
                        single_use: false,
                    },
                ];
            }
            if let Some(create) = plan.tools.get_mut("create") {
                create.def.secret_access = vec!["txn_otp".into()];
            }
        }),
        ..Opts::default()
    });
    // The producer's spec names its paths and keys, never an option.
    let d = run.model(
        "intake.m1",
        &[("lookup", r#"{"email":"a@example.com"}"#)],
        None,
    );
    let spec: ToolCallSpec =
        serde_json::from_value(scheduled_specs(&d)[0].1.clone()).expect("tool spec");
    assert_eq!(
        serde_json::to_value(&spec.result_secrets).unwrap_or_default(),
        json!([{"path": "otp", "key": "txn_otp"}, {"path": "session.key", "key": "sess"}])
    );
    let d = run.step(Input::DispatchToolCall {
        call_id: "intake.t1".into(),
        attempt: 1,
        worker_id: "w1".into(),
        callback_token_sha256: None,
        tenant_grants: None,
    });
    // The producer reads nothing.
    assert!(
        !d.commands
            .iter()
            .any(|c| matches!(c, Command::RestoreSecrets { .. }))
    );
    let d = run.step(Input::ToolCallCompleted {
        call_id: "intake.t1".into(),
        attempt: 1,
        result: json!({"otp": "[VAULTED:txn_otp]", "ok": true}),
        secrets: vec![sealed("txn_otp"), sealed("undeclared")],
    });
    assert_eq!(
        Run::kinds(&d),
        [
            "tool_call_completed",
            "secrets_vaulted",
            "model_call_scheduled"
        ]
    );
    let vaulted = serde_json::to_value(&d.events[1]).unwrap_or_default();
    assert_eq!(
        vaulted,
        json!({
            "type": "secrets_vaulted", "call_id": "intake.t1", "tool": "lookup",
            "keys": [{"key": "txn_otp", "path": "otp", "ttl_s": 300, "single_use": true, "consumers": ["create"]}],
            "absent": ["sess"]
        })
    );
    // Only the declared key goes into the vault; the undeclared one is dropped.
    let entries: Vec<&VaultEntry> = d
        .commands
        .iter()
        .filter_map(|c| match c {
            Command::VaultSecrets { entries, .. } => Some(entries),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].sealed, sealed("txn_otp"));
    assert_eq!((entries[0].ttl_s, entries[0].single_use), (Some(300), true));

    // The consumer's dispatch reads its keys, and again when the same
    // attempt asks again (its reply was lost).
    run.model(
        "intake.m2",
        &[("create", r#"{"email":"a@example.com"}"#)],
        None,
    );
    let restore = Command::RestoreSecrets {
        call_id: "intake.t2".into(),
        tool: "create".into(),
        keys: vec!["txn_otp".into()],
    };
    for _ in 0..2 {
        let d = run.step(Input::DispatchToolCall {
            call_id: "intake.t2".into(),
            attempt: 1,
            worker_id: "w1".into(),
            callback_token_sha256: None,
            tenant_grants: None,
        });
        assert!(d.commands.contains(&restore), "{:?}", d.commands);
    }
    run.step(Input::ToolCallCompleted {
        call_id: "intake.t2".into(),
        attempt: 1,
        result: json!({"account_id": "acc_1"}),
        secrets: Vec::new(),
    });
    // The run's end drops its vault.
    let d = run.model("intake.m3", &[], Some("done"));
    assert!(
        Run::kinds(&d).contains(&"run_completed"),
        "{:?}",
        Run::kinds(&d)
    );
    assert!(d.commands.contains(&Command::DropRunSecrets));
}

#[test]
fn a_run_without_producers_drops_no_vault() {
    let (mut run, _) = Run::start(Opts::default());
    let d = run.model("intake.m1", &[], Some("done"));
    assert!(Run::kinds(&d).contains(&"run_completed"));
    assert!(!d.commands.contains(&Command::DropRunSecrets));
}

// `process:` (machine/process.rs) and `compaction.max_description_length`.

fn jq(s: &str) -> belay_definitions::expr::Expr {
    belay_definitions::expr::Expr::parse(s).expect("valid jq")
}

/// `lookup` with `process.before`: `email` must be `a@x`; `email_upper`
/// is computed; `on_fail` as given.
fn lookup_before(plan: &mut RunPlan, on_fail: belay_definitions::model::OnFail) {
    use belay_definitions::model::{ProcessBefore, ProcessDef};
    if let Some(lookup) = plan.tools.get_mut("lookup") {
        lookup.def.process = Some(ProcessDef {
            before: Some(ProcessBefore {
                params: BTreeMap::from([(
                    "email_upper".to_owned(),
                    jq(".args.email | ascii_upcase"),
                )]),
                require: vec![jq(r#".args.email | endswith("@x")"#)],
                on_fail,
            }),
            after: None,
        });
    }
}

fn tool_contents(run: &Run) -> Vec<String> {
    run.transcript()
        .into_iter()
        .filter_map(|m| match m {
            ChatMessage::Tool { content, .. } => Some(content),
            _ => None,
        })
        .collect()
}

#[test]
fn process_before_params_are_computed_and_recorded_in_the_scheduled_arguments() {
    use belay_definitions::model::OnFail;
    let (mut run, _) = Run::start(Opts {
        edit: Some(|plan| lookup_before(plan, OnFail::Reask("use an @x address".into()))),
        ..Opts::default()
    });
    let d = run.model("intake.m1", &[("lookup", r#"{"email":"a@x"}"#)], None);
    let scheduled = d.events.iter().find_map(|e| match e {
        Event::ToolCallScheduled { arguments, .. } => Some(arguments.clone()),
        _ => None,
    });
    assert_eq!(
        scheduled,
        Some(json!({"email": "a@x", "email_upper": "A@X", "plan": "starter"}))
    );
    let specs = scheduled_specs(&d);
    assert_eq!(specs.len(), 1);
    assert_eq!(specs[0].1["arguments"]["email_upper"], json!("A@X"));
    assert!(!Run::kinds(&d).contains(&"tool_call_processed"));
}

#[test]
fn process_before_reask_refuses_and_the_model_reads_the_message() {
    use belay_definitions::model::OnFail;
    let (mut run, _) = Run::start(Opts {
        edit: Some(|plan| lookup_before(plan, OnFail::Reask("use an @x address".into()))),
        ..Opts::default()
    });
    let d = run.model("intake.m1", &[("lookup", r#"{"email":"a@y"}"#)], None);
    assert!(d.events.iter().any(|e| matches!(
        e,
        Event::ToolCallRefused { check, reason, .. } if check == "process" && reason == "use an @x address"
    )));
    assert!(!Run::kinds(&d).contains(&"tool_call_scheduled"));
    assert!(!Run::kinds(&d).contains(&"run_failed"));
    assert_eq!(
        tool_contents(&run),
        vec!["error: use an @x address".to_owned()]
    );
    // The model is asked again.
    assert!(
        Run::kinds(&d).contains(&"model_call_scheduled"),
        "{:?}",
        Run::kinds(&d)
    );
}

#[test]
fn process_before_block_refuses_and_fails_the_run() {
    use belay_definitions::model::OnFail;
    let (mut run, _) = Run::start(Opts {
        edit: Some(|plan| lookup_before(plan, OnFail::Block("not allowed".into()))),
        ..Opts::default()
    });
    let d = run.model("intake.m1", &[("lookup", r#"{"email":"a@y"}"#)], None);
    let kinds = Run::kinds(&d);
    assert!(kinds.contains(&"tool_call_refused"), "{kinds:?}");
    assert!(kinds.contains(&"run_failed"), "{kinds:?}");
    let error = d.events.iter().find_map(|e| match e {
        Event::RunFailed { error, .. } => Some(error.clone()),
        _ => None,
    });
    assert!(
        error.is_some_and(|e| e.contains("precondition") && e.contains("not allowed")),
        "{d:?}"
    );
    assert_eq!(run.state.status, RunStatus::Failed);
}

#[test]
fn process_before_fallback_refuses_with_its_own_check() {
    use belay_definitions::model::OnFail;
    let (mut run, _) = Run::start(Opts {
        edit: Some(|plan| lookup_before(plan, OnFail::Fallback("no such customer".into()))),
        ..Opts::default()
    });
    let d = run.model("intake.m1", &[("lookup", r#"{"email":"a@y"}"#)], None);
    assert!(d.events.iter().any(|e| matches!(
        e,
        Event::ToolCallRefused { check, .. } if check == "process_fallback"
    )));
    assert_eq!(
        tool_contents(&run),
        vec!["error: no such customer".to_owned()]
    );
}

#[test]
fn process_before_warn_and_use_original_run_the_call_with_the_models_arguments() {
    use belay_definitions::model::OnFail;
    for (edit, outcome) in [
        (
            (|plan: &mut RunPlan| lookup_before(plan, OnFail::Warn("odd address".into())))
                as fn(&mut RunPlan),
            "warn",
        ),
        (
            |plan: &mut RunPlan| lookup_before(plan, OnFail::UseOriginal),
            "use_original",
        ),
    ] {
        let (mut run, _) = Run::start(Opts {
            edit: Some(edit),
            ..Opts::default()
        });
        let d = run.model("intake.m1", &[("lookup", r#"{"email":"a@y"}"#)], None);
        let specs = scheduled_specs(&d);
        assert_eq!(specs.len(), 1, "{outcome}");
        assert_eq!(
            specs[0].1["arguments"],
            json!({"email": "a@y", "plan": "starter"})
        );
        let processed = d.events.iter().find_map(|e| match e {
            Event::ToolCallProcessed {
                stage,
                outcome,
                error,
                ..
            } => Some((stage.clone(), outcome.clone(), error.clone())),
            _ => None,
        });
        let (stage, got, error) = processed.expect("tool_call_processed");
        assert_eq!((stage.as_str(), got.as_str()), ("before", outcome));
        assert!(error.is_some_and(|e| e.contains("gave false")));
    }
}

/// `lookup` with `process.after`: `{name: .result.name | ascii_upcase}`.
fn lookup_after(plan: &mut RunPlan, on_fail: belay_definitions::model::OnFail) {
    use belay_definitions::model::{ProcessAfter, ProcessDef};
    if let Some(lookup) = plan.tools.get_mut("lookup") {
        lookup.def.process = Some(ProcessDef {
            before: None,
            after: Some(ProcessAfter {
                result: BTreeMap::from([("name".to_owned(), jq(".result.name | ascii_upcase"))]),
                on_fail,
            }),
        });
        lookup.def.on_result.insert("seen".into(), jq(".result"));
    }
}

#[test]
fn process_after_remaps_the_result_for_the_model_and_on_result_but_the_event_keeps_it_raw() {
    use belay_definitions::model::OnFail;
    let (mut run, _) = Run::start(Opts {
        edit: Some(|plan| lookup_after(plan, OnFail::UseOriginal)),
        ..Opts::default()
    });
    run.model("intake.m1", &[("lookup", r#"{"email":"1"}"#)], None);
    let raw = json!({"id": "c_9", "name": "Ada"});
    let d = run.step(Input::ToolCallCompleted {
        secrets: Vec::new(),
        call_id: "intake.t1".into(),
        attempt: 1,
        result: raw.clone(),
    });
    assert_eq!(
        Run::kinds(&d)[..3],
        [
            "tool_call_processed",
            "tool_call_completed",
            "tool_vars_set"
        ]
    );
    assert!(matches!(&d.events[1], Event::ToolCallCompleted { result, .. } if result == &raw));
    assert!(matches!(
        &d.events[0],
        Event::ToolCallProcessed { outcome, result: Some(r), .. }
            if outcome == "ok" && r == &json!({"name": "ADA"})
    ));
    assert_eq!(tool_contents(&run), vec![r#"{"name":"ADA"}"#.to_owned()]);
    assert_eq!(run.state.vars.get("seen"), Some(&json!({"name": "ADA"})));
}

#[test]
fn process_after_on_fail_outcomes() {
    use belay_definitions::model::OnFail;
    /// (plan edit, what the model reads, whether on_result ran)
    type Case = (fn(&mut RunPlan), &'static str, bool);
    let cases: [Case; 4] = [
        (
            |p| lookup_after(p, OnFail::Block("quote unusable".into())),
            "error: quote unusable",
            false,
        ),
        (
            |p| lookup_after(p, OnFail::Reask("try another customer".into())),
            "try another customer",
            true,
        ),
        (
            |p| lookup_after(p, OnFail::Fallback("unknown".into())),
            "unknown",
            true,
        ),
        (
            |p| lookup_after(p, OnFail::Warn("raw".into())),
            r#"{"id":"c_9","name":7}"#,
            true,
        ),
    ];
    for (edit, shown, vars) in cases {
        let (mut run, _) = Run::start(Opts {
            edit: Some(edit),
            ..Opts::default()
        });
        run.model("intake.m1", &[("lookup", r#"{"email":"1"}"#)], None);
        // `ascii_upcase` of a number fails.
        let d = run.step(Input::ToolCallCompleted {
            secrets: Vec::new(),
            call_id: "intake.t1".into(),
            attempt: 1,
            result: json!({"id": "c_9", "name": 7}),
        });
        assert_eq!(tool_contents(&run), vec![shown.to_owned()], "{shown}");
        assert_eq!(Run::kinds(&d).contains(&"tool_vars_set"), vars, "{shown}");
    }
}

#[test]
fn max_description_length_cuts_long_strings_for_the_model_only() {
    let (mut run, _) = Run::start(Opts {
        edit: Some(|plan| {
            if let Some(lookup) = plan.tools.get_mut("lookup") {
                lookup.def.compaction = Some(CompactionDef {
                    essential_fields: Vec::new(),
                    max_description_length: Some(4),
                });
            }
        }),
        ..Opts::default()
    });
    run.model("intake.m1", &[("lookup", r#"{"email":"1"}"#)], None);
    let whole = json!({"id": 12345678, "blurb": "a long description"});
    let d = run.step(Input::ToolCallCompleted {
        secrets: Vec::new(),
        call_id: "intake.t1".into(),
        attempt: 1,
        result: whole.clone(),
    });
    assert!(matches!(&d.events[0], Event::ToolCallCompleted { result, .. } if result == &whole));
    assert_eq!(
        tool_contents(&run),
        vec![r#"{"blurb":"a lo…[cut]","id":12345678}"#.to_owned()]
    );
}

#[test]
fn an_approvers_edit_is_processed_again_and_may_not_write_a_computed_parameter() {
    use belay_definitions::model::{ConfirmationDef, OnFail};
    let (mut run, _) = Run::start(Opts {
        edit: Some(|plan| {
            lookup_before(plan, OnFail::Reask("use an @x address".into()));
            if let Some(lookup) = plan.tools.get_mut("lookup") {
                lookup.def.confirmation = Some(ConfirmationDef {
                    when_side_effects: false,
                    immutable_params: Vec::new(),
                    approver_grant: "crm.read".into(),
                });
            }
        }),
        ..Opts::default()
    });
    run.model("intake.m1", &[("lookup", r#"{"email":"a@x"}"#)], None);
    let decide_with = |edit: Value| Input::DecideApproval {
        node: "intake.t1".into(),
        approve: true,
        edited_subject: Some(edit),
        by: "ops".into(),
        grants: vec!["crm.read".into()],
        reason: "ok".into(),
    };
    // A computed parameter written with another value is refused.
    let err = decide(
        &run.state,
        decide_with(json!({"email": "b@x", "email_upper": "NOPE"})),
    )
    .expect_err("refused");
    assert!(
        format!("{err:?}").contains("computed by the tool's `process.before`"),
        "{err:?}"
    );
    // An edit the precondition refuses is refused.
    let err = decide(&run.state, decide_with(json!({"email": "b@y"}))).expect_err("refused");
    assert!(format!("{err:?}").contains("use an @x address"), "{err:?}");
    // An edit that passes gets its parameters computed again.
    let d = run.step(decide_with(json!({"email": "b@x"})));
    let decided = d.events.iter().find_map(|e| match e {
        Event::ConfirmationDecided { arguments, .. } => Some(arguments.clone()),
        _ => None,
    });
    assert_eq!(
        decided,
        Some(json!({"email": "b@x", "email_upper": "B@X", "plan": "starter"}))
    );
}

#[test]
fn with_process_after_the_return_type_checks_the_processed_result_not_the_raw_one() {
    use belay_definitions::model::{OnFail, ProcessAfter, ProcessDef};
    fn edit(plan: &mut RunPlan, expr: &str) {
        if let Some(lookup) = plan.tools.get_mut("lookup") {
            // The tool answers `{"id", "full"}`; its declared type is the
            // processed `{"name": string}`.
            lookup.def.output_schema = json!({"type": "object", "required": ["name"],
                "properties": {"name": {"type": "string"}}});
            lookup.def.process = Some(ProcessDef {
                before: None,
                after: Some(ProcessAfter {
                    result: BTreeMap::from([("name".to_owned(), jq(expr))]),
                    on_fail: OnFail::Block("cannot read the answer".into()),
                }),
            });
        }
    }
    let raw = json!({"id": "c_9", "full": "Ada"});
    // The raw answer lacks `name`, the processed one has it: completed.
    let (mut run, _) = Run::start(Opts {
        edit: Some(|plan| edit(plan, ".result.full")),
        ..Opts::default()
    });
    run.model("intake.m1", &[("lookup", r#"{"email":"1"}"#)], None);
    let d = run.step(Input::ToolCallCompleted {
        secrets: Vec::new(),
        call_id: "intake.t1".into(),
        attempt: 1,
        result: raw.clone(),
    });
    assert!(
        Run::kinds(&d).contains(&"tool_call_completed"),
        "{:?}",
        Run::kinds(&d)
    );
    assert_eq!(tool_contents(&run), vec![r#"{"name":"Ada"}"#.to_owned()]);
    // A processed result of the wrong type fails the call, naming it.
    let (mut run, _) = Run::start(Opts {
        edit: Some(|plan| edit(plan, ".result.id | length")),
        ..Opts::default()
    });
    run.model("intake.m1", &[("lookup", r#"{"email":"1"}"#)], None);
    let d = run.step(Input::ToolCallCompleted {
        secrets: Vec::new(),
        call_id: "intake.t1".into(),
        attempt: 1,
        result: raw,
    });
    assert!(
        !Run::kinds(&d).contains(&"tool_call_completed"),
        "{:?}",
        Run::kinds(&d)
    );
    let failed = d.events.iter().find_map(|e| match e {
        Event::ToolCallFailed { error, .. } => Some(error.clone()),
        _ => None,
    });
    assert!(
        failed
            .as_deref()
            .is_some_and(|e| e.contains("does not match its declared return type")),
        "{failed:?}"
    );
}

fn with_account_output_schema(plan: &mut RunPlan) {
    if let Some(agent) = plan.agents.get_mut("onboarder") {
        agent.def.output_schema = Some(json!({
            "type": "object",
            "required": ["account_id"],
            "properties": {"account_id": {"type": "string"}}
        }));
    }
}

fn refused_errors(d: &Decision) -> Vec<String> {
    d.events
        .iter()
        .find_map(|e| match e {
            Event::FinalAnswerRefused { errors, .. } => Some(errors.clone()),
            _ => None,
        })
        .unwrap_or_default()
}

#[test]
fn a_final_answer_is_checked_against_the_output_schema_and_the_model_is_asked_again() {
    let (mut run, _) = Run::start(Opts {
        edit: Some(with_account_output_schema),
        ..Opts::default()
    });
    // Text, not JSON: refused, and the model reads why.
    let d = run.model("intake.m1", &[], Some("all done"));
    assert_eq!(
        Run::kinds(&d),
        [
            "model_call_completed",
            "final_answer_refused",
            "model_call_scheduled"
        ]
    );
    let errors = refused_errors(&d);
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0].starts_with("the answer is not JSON"),
        "{errors:?}"
    );
    let spec = &scheduled_specs(&d)[0].1;
    let last = spec["messages"].as_array().and_then(|m| m.last()).cloned();
    let last = last.expect("messages");
    assert_eq!(last["role"], "user");
    let text = last["content"].as_str().unwrap_or_default();
    assert!(
        text.starts_with(
            "Your final answer does not match the required output schema: the answer is not JSON"
        ) && text.contains("\"account_id\""),
        "{text}"
    );
    // JSON of the wrong shape: refused with the violation's place.
    let d = run.model("intake.m2", &[], Some(r#"{"account": 1}"#));
    assert_eq!(
        Run::kinds(&d),
        [
            "model_call_completed",
            "final_answer_refused",
            "model_call_scheduled"
        ]
    );
    let errors = refused_errors(&d);
    assert!(
        errors.iter().any(|e| e.contains("account_id")),
        "{errors:?}"
    );
    // A fenced JSON answer that matches finishes the node with the value.
    let d = run.model(
        "intake.m3",
        &[],
        Some("```json\n{\"account_id\": \"A-1\"}\n```"),
    );
    assert_eq!(
        Run::kinds(&d),
        ["model_call_completed", "node_completed", "run_completed"]
    );
    assert_eq!(run.state.output, Some(json!({"account_id": "A-1"})));
}

#[test]
fn refused_final_answers_count_against_the_model_step_budget() {
    let (mut run, _) = Run::start(Opts {
        max_model_steps: 2,
        edit: Some(with_account_output_schema),
        ..Opts::default()
    });
    let d = run.model("intake.m1", &[], Some("[]"));
    assert!(Run::kinds(&d).contains(&"final_answer_refused"));
    let d = run.model("intake.m2", &[], Some(r#"{"account_id": 7}"#));
    assert_eq!(
        Run::kinds(&d),
        ["model_call_completed", "final_answer_refused", "run_failed"]
    );
    let Some(Event::RunFailed {
        stop: Some(Stop::Budget { budget, .. }),
        ..
    }) = d.events.last()
    else {
        panic!("{:?}", d.events.last())
    };
    assert_eq!(budget, "model_steps");
    assert_eq!(run.state.status, RunStatus::Failed);
}

#[test]
fn without_an_output_schema_any_answer_finishes_the_node() {
    let (mut run, _) = Run::start(Opts::default());
    let d = run.model("intake.m1", &[], Some("```json\n{}\n```"));
    assert_eq!(
        Run::kinds(&d),
        ["model_call_completed", "node_completed", "run_completed"]
    );
    // Not unfenced: without a schema the text is kept as it is.
    assert_eq!(run.state.output, Some(json!("```json\n{}\n```")));
}

#[test]
fn the_state_keeps_no_result_once_the_model_has_it() {
    let (mut run, _) = Run::start(Opts::default());
    run.model(
        "intake.m1",
        &[("lookup", r#"{"email":"a@example.com"}"#)],
        None,
    );
    run.step(Input::DispatchToolCall {
        call_id: "intake.t1".into(),
        attempt: 1,
        worker_id: "w1".into(),
        callback_token_sha256: None,
        tenant_grants: None,
    });
    let big = "x".repeat(100_000);
    run.step(Input::ToolCallCompleted {
        call_id: "intake.t1".into(),
        attempt: 1,
        result: json!({"found": true, "pad": big}),
        secrets: Vec::new(),
    });
    // The model got its (truncated) text; the call keeps no copy of the
    // result, and the history (which `Run::step` replays) holds it whole.
    let call = &run.state.tool_calls["intake.t1"];
    assert_eq!((call.status, &call.result), (CallStatus::Completed, &None));
    let recorded = run.history.iter().any(|e| {
        matches!(e, Event::ToolCallCompleted { result, .. } if result["pad"].as_str().map(str::len) == Some(100_000))
    });
    assert!(recorded);
}
