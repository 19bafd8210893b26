//! Machine tests of the agent loop and of a tool call's lifecycle: model
//! turns, the checks a proposed call goes through, dispatch, results and
//! what the model gets of them, failures by class, lost leases, cancelling,
//! and the final answer. Its larger topics are the modules below. Every
//! step checks replay = live ([`Run::step`]).

use std::collections::BTreeMap;

use belay_proto::wire::{ChatMessage, ModelCallResult, ToolCallSpec, ToolUse, Usage};
use serde_json::{Value, json};

use super::{Opts, Run, scheduled_specs, tool};
use crate::*;
use belay_definitions::model::{CompactionDef, RepeatSafety, ToolBindingDef};

mod elicitation;
mod gates;
mod limits;
mod process;
mod secrets;
mod uncertain;

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

fn jq(s: &str) -> belay_definitions::expr::Expr {
    belay_definitions::expr::Expr::parse(s).expect("valid jq")
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
