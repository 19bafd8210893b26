//! What bounds the agent loop: loop policies, stop conditions, budgets of
//! the node and of the run, deadlines, and the attempts a call is allowed.

use belay_proto::wire::{ModelCallResult, ToolUse, Usage};
use serde_json::json;

use super::{dispatch, tool_results};
use crate::tests::{Opts, Run, scheduled_specs};
use crate::*;
use belay_definitions::model::{LoopPolicy, OnToolFailure, Pricing};

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
fn a_turn_that_used_the_whole_output_limit_runs_no_tool_call_whatever_its_finish_reason() {
    let opts = Opts {
        edit: Some(|p| {
            if let Some(a) = p.agents.get_mut("onboarder") {
                a.def.max_output_tokens = Some(50);
            }
        }),
        ..Opts::default()
    };
    let answer = |output_tokens| ModelCallResult {
        content: None,
        // Whole JSON (a compatible server closed it), but the call was cut
        // off before its optional fields.
        tool_calls: vec![ToolUse {
            id: "a".into(),
            name: "lookup".into(),
            arguments: r#"{"email":"x@y.z"}"#.into(),
        }],
        usage: Usage {
            input_tokens: 10,
            output_tokens,
        },
        finish_reason: Some("tool_calls".into()),
    };
    let (mut run, _) = Run::start(Opts {
        edit: opts.edit,
        ..Opts::default()
    });
    let d = run.step(Input::ModelCallCompleted {
        call_id: "intake.m1".into(),
        attempt: 1,
        result: answer(50),
    });
    assert_eq!(
        Run::kinds(&d),
        [
            "model_call_completed",
            "tool_call_refused",
            "model_call_scheduled"
        ]
    );
    assert!(
        d.events
            .iter()
            .any(|e| matches!(e, Event::ToolCallRefused { check, .. } if check == "truncated"))
    );
    // One token under the limit: the call runs.
    let (mut run, _) = Run::start(opts);
    let d = run.step(Input::ModelCallCompleted {
        call_id: "intake.m1".into(),
        attempt: 1,
        result: answer(49),
    });
    assert_eq!(
        Run::kinds(&d),
        ["model_call_completed", "tool_call_scheduled"]
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
