//! PII redaction in the agent loop ([`crate::pii`]): what the model's spec
//! holds, which calls get their data back, and the final answer. Each
//! step also checks replay = live ([`Run::step`]).

use belay_proto::wire::ChatMessage;
use serde_json::{Value, json};

use super::{Opts, Run, scheduled_specs};
use crate::*;
use belay_definitions::model::{PiiAccess, PiiKind};

/// `lookup` may receive the user's data, `create` may not receive any,
/// `wipe`'s results go to the model as they are (`llm`).
fn redacting(p: &mut RunPlan) {
    if let Some(a) = p.agents.get_mut("onboarder") {
        a.def.pii_redaction = PiiKind::ALL.to_vec();
    }
    if let Some(t) = p.tools.get_mut("lookup") {
        t.def.pii_access = PiiAccess {
            user: true,
            ..PiiAccess::default()
        };
    }
    if let Some(t) = p.tools.get_mut("wipe") {
        t.def.pii_access = PiiAccess {
            llm: true,
            ..PiiAccess::default()
        };
    }
}

/// The messages of the model call the decision schedules.
fn model_messages(d: &Decision) -> Vec<ChatMessage> {
    let specs = scheduled_specs(d);
    let spec = specs
        .iter()
        .find(|(id, ..)| id.contains(".m"))
        .map(|(_, spec, _)| spec.clone())
        .unwrap_or(Value::Null);
    serde_json::from_value(spec["messages"].clone()).unwrap_or_default()
}

fn complete(run: &mut Run, call: &str, result: Value) -> Decision {
    run.step(Input::ToolCallCompleted {
        call_id: call.into(),
        attempt: 1,
        result,
        secrets: Vec::new(),
    })
}

fn refusals(d: &Decision) -> Vec<(String, String)> {
    d.events
        .iter()
        .filter_map(|e| match e {
            Event::ToolCallRefused {
                check,
                reason,
                tool,
                ..
            } => Some((format!("{tool}:{check}"), reason.clone())),
            _ => None,
        })
        .collect()
}

/// The model's call `call_id` passes `token` (a tool's data) to `lookup`
/// (`pii_access: user`): refused, naming the missing level.
fn lookup_is_refused_a_tools_value(run: &mut Run, call_id: &str, token: &str) {
    let d = run.model(
        call_id,
        &[("lookup", &format!(r#"{{"email":"{token}"}}"#))],
        None,
    );
    let refused = refusals(&d);
    assert!(
        refused.len() == 1 && refused[0].1.contains("lacks `tools`"),
        "{refused:?}"
    );
}

#[test]
fn the_model_sees_tokens_and_only_allowed_tools_get_the_data_back() {
    let (mut run, d) = Run::start(Opts {
        edit: Some(redacting),
        ..Opts::default()
    });
    // The run's input holds a@example.com: the spec holds a token.
    let sent = serde_json::to_string(&model_messages(&d)).unwrap_or_default();
    assert!(!sent.contains("a@example.com"), "{sent}");
    assert!(sent.contains("[PII:email:1]"), "{sent}");

    // `lookup` (pii_access: user) gets the address; `create` (none) is
    // refused, naming the token and the level it lacks.
    let d = run.model(
        "intake.m1",
        &[
            ("lookup", r#"{"email":"[PII:email:1]"}"#),
            ("create", r#"{"email":"[PII:email:1]"}"#),
        ],
        None,
    );
    let spec = scheduled_specs(&d)
        .into_iter()
        .find(|(id, ..)| id == "intake.t1")
        .map(|(_, spec, _)| spec)
        .unwrap_or(Value::Null);
    assert_eq!(spec["arguments"]["email"], "a@example.com");
    let refused = refusals(&d);
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0].0, "create:pii_access");
    assert!(
        refused[0].1.contains("[PII:email:1]") && refused[0].1.contains("lacks `user`"),
        "{refused:?}"
    );
    // What the model wrote is recorded as written.
    assert!(run.history.iter().any(|e| matches!(
        e,
        Event::ModelCallCompleted { tool_calls, .. } if tool_calls[0].arguments.contains("[PII:email:1]")
    )));

    // A result with new data: a token in the next request.
    let d = complete(
        &mut run,
        "intake.t1",
        json!({"found": true, "phone": "+1 415 555 2671", "card": "4111 1111 1111 1111"}),
    );
    let messages = model_messages(&d);
    let sent = serde_json::to_string(&messages).unwrap_or_default();
    for value in ["a@example.com", "415 555 2671", "4111 1111"] {
        assert!(!sent.contains(value), "{value} in {sent}");
    }
    assert!(
        sent.contains("[PII:phone:1]") && sent.contains("[PII:card:1]"),
        "{sent}"
    );

    // `lookup` has `user`, not `tools`: the phone number from a result
    // stays out of its call.
    lookup_is_refused_a_tools_value(&mut run, "intake.m2", "[PII:phone:1]");
}

#[test]
fn the_final_answer_gets_its_data_back_and_llm_results_pass_as_they_are() {
    let (mut run, _) = Run::start(Opts {
        edit: Some(redacting),
        ..Opts::default()
    });
    run.model("intake.m1", &[("wipe", r#"{"email":"nobody"}"#)], None);
    let d = complete(
        &mut run,
        "intake.t1",
        json!({"wiped": true, "owner": "bob@example.com"}),
    );
    let sent = serde_json::to_string(&model_messages(&d)).unwrap_or_default();
    // `wipe` says `llm`: its result is sent as it is.
    assert!(sent.contains("bob@example.com"), "{sent}");
    assert!(!sent.contains("a@example.com"), "{sent}");

    let d = run.model("intake.m2", &[], Some("Onboarded [PII:email:1]."));
    let output = d.events.iter().find_map(|e| match e {
        Event::NodeCompleted { output, .. } => Some(output.clone()),
        _ => None,
    });
    assert_eq!(output, Some(json!("Onboarded a@example.com.")));
}

#[test]
fn without_pii_redaction_nothing_changes() {
    let (mut run, d) = Run::start(Opts::default());
    let sent = serde_json::to_string(&model_messages(&d)).unwrap_or_default();
    assert!(sent.contains("a@example.com"), "{sent}");
    // A token the model makes up is just text.
    let d = run.model(
        "intake.m1",
        &[("lookup", r#"{"email":"[PII:email:1]"}"#)],
        None,
    );
    let spec = scheduled_specs(&d)
        .into_iter()
        .find(|(id, ..)| id == "intake.t1")
        .map(|(_, spec, _)| spec)
        .unwrap_or(Value::Null);
    assert_eq!(spec["arguments"]["email"], "[PII:email:1]");
}

#[test]
fn an_unknown_token_is_refused() {
    let (mut run, _) = Run::start(Opts {
        edit: Some(redacting),
        ..Opts::default()
    });
    let d = run.model(
        "intake.m1",
        &[("lookup", r#"{"email":"[PII:email:9]"}"#)],
        None,
    );
    let refused = refusals(&d);
    assert!(
        refused.len() == 1
            && refused[0].0 == "lookup:pii_access"
            && refused[0]
                .1
                .contains("not a token this conversation issued"),
        "{refused:?}"
    );
}

/// `redacting` with an `output_schema` whose `n` is an integer.
fn redacting_with_schema(p: &mut RunPlan) {
    redacting(p);
    if let Some(a) = p.agents.get_mut("onboarder") {
        a.def.output_schema = Some(json!({
            "type": "object",
            "required": ["n"],
            "properties": {"n": {"type": "integer"}}
        }));
    }
}

#[test]
fn a_refused_final_answer_quotes_tokens_and_gives_no_value_a_new_origin() {
    let (mut run, _) = Run::start(Opts {
        edit: Some(redacting_with_schema),
        ..Opts::default()
    });
    run.model("intake.m1", &[("create", r#"{"email":"x"}"#)], None);
    complete(
        &mut run,
        "intake.t1",
        json!({"account_id": "A1", "card": "4111 1111 1111 1111"}),
    );
    // The answer quotes the card (a tool's data): the refusal the model
    // reads quotes the token, not the number.
    let d = run.model("intake.m2", &[], Some(r#"{"n":"[PII:card:1]"}"#));
    let message = d
        .events
        .iter()
        .find_map(|e| match e {
            Event::FinalAnswerRefused { message, .. } => Some(message.clone()),
            _ => None,
        })
        .unwrap_or_default();
    assert!(
        message.contains("[PII:card:1]") && !message.contains("4111"),
        "{message}"
    );
    let sent = serde_json::to_string(&model_messages(&d)).unwrap_or_default();
    assert!(!sent.contains("4111 1111"), "{sent}");
    // Still a tool's data only: `lookup` (`user`) may not have it.
    lookup_is_refused_a_tools_value(&mut run, "intake.m3", "[PII:card:1]");
}

#[test]
fn a_tool_use_id_used_again_in_a_later_turn_keeps_each_result_with_its_tool() {
    let (mut run, _) = Run::start(Opts {
        edit: Some(redacting),
        ..Opts::default()
    });
    // Turn 1: `create` as tu0; its result holds a card.
    run.model("intake.m1", &[("create", r#"{"email":"x"}"#)], None);
    complete(
        &mut run,
        "intake.t1",
        json!({"account_id": "A1", "card": "4111 1111 1111 1111"}),
    );
    // Turn 2: `wipe` (`llm`) as tu0 again: only its own result passes.
    run.model("intake.m2", &[("wipe", r#"{"email":"y"}"#)], None);
    let d = complete(
        &mut run,
        "intake.t2",
        json!({"wiped": true, "by": "ops@example.com"}),
    );
    let sent = serde_json::to_string(&model_messages(&d)).unwrap_or_default();
    assert!(!sent.contains("4111 1111"), "{sent}");
    assert!(sent.contains("ops@example.com"), "{sent}");
}

#[test]
fn the_table_is_recorded_before_the_model_call_and_folded_into_the_node() {
    let (run, d) = Run::start(Opts {
        edit: Some(redacting),
        ..Opts::default()
    });
    let kinds: Vec<&str> = d.events.iter().map(Event::kind).collect();
    let issued = kinds.iter().position(|k| *k == "pii_tokens_issued");
    let scheduled = kinds.iter().position(|k| *k == "model_call_scheduled");
    assert!(issued.is_some() && issued < scheduled, "{kinds:?}");
    let table = run
        .state
        .node
        .as_ref()
        .map(|n| n.pii.clone())
        .unwrap_or_default();
    assert_eq!(table.len(), 1);
    assert_eq!(table[0].token, "[PII:email:1]");
    assert_eq!(table[0].value, "a@example.com");
    assert!(table[0].user && !table[0].tools);
}
