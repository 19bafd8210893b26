//! The gates of a tool ([`crate::gates`]): a rate-limited or circuit-broken
//! dispatch asks for the gates, a deferral is no attempt, and only the
//! endpoint's failures count against the circuit.

use serde_json::json;

use crate::gates::{GateVerdict, ToolGates};
use crate::tests::{Opts, Run};
use crate::*;
use belay_definitions::model::CircuitBreakerDef;

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
