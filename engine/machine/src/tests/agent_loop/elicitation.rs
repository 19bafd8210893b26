//! A tool asking a person for input mid-call (MCP elicitation): the run
//! waits durably, the answer repeats the call with it, and only a call
//! that is safe to repeat waits.

use serde_json::{Value, json};

use super::{dispatch, tool_results};
use crate::tests::{Opts, Run};
use crate::*;

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
        request: None,
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
    // The same answer again (a retry after a lost reply) is answered with
    // the recorded one and changes nothing; a different one is refused,
    // naming the first (issue 22).
    let d = run.step(provide(answer.clone()));
    assert!(d.events.is_empty() && d.commands.is_empty(), "{d:?}");
    assert!(matches!(
        decide(&run.state, provide(json!({"action": "decline"}))),
        Err(MachineError::AlreadyDecided { request, .. }) if request == "intake.t1.input1"
    ));

    // A second question of the repeated call: the next repeat carries both answers.
    dispatch(&mut run, "intake.t1", 2);
    let d = run.step(ask("intake.t1", 2, "elicitation", name_form(), true));
    assert!(matches!(
        &d.events[0],
        Event::ToolCallInputRequested { request_id, .. } if request_id == "intake.t1.input2"
    ));
    let second = json!({"action": "decline"});
    // Now an answer must name its question: a retry of the first answer
    // would otherwise answer the second.
    assert!(matches!(
        decide(&run.state, provide(answer.clone())),
        Err(MachineError::RequestRequired { open: Some(open), .. }) if open == "intake.t1.input2"
    ));
    let d = run.step(Input::ProvideToolInput {
        request: Some("intake.t1.input1".into()),
        call_id: "intake.t1".into(),
        answer: answer.clone(),
        by: "ada".into(),
    });
    assert!(
        d.events.is_empty(),
        "a retry of the first answer changes nothing: {d:?}"
    );
    let d = run.step(Input::ProvideToolInput {
        request: Some("intake.t1.input2".into()),
        call_id: "intake.t1".into(),
        answer: second.clone(),
        by: "ada".into(),
    });
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
            request: None,
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
        request: None,
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
            request: Some(format!("intake.t1.input{round}")),
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
