//! `visibility: {trace: false}` in the agent loop, without a database: the
//! value taken out of the model's answer never reaches an event or a spec,
//! the call's vault entry is commanded with its scheduling, its dispatch
//! reads the key back, and a call whose value could not be sealed (no
//! vault key) or is not a string is refused before it can act.

#![allow(clippy::unwrap_used)]

use belay_proto::wire::{ModelCallResult, ToolUse};
use serde_json::{Value, json};

use super::{AGENT_WF, Run, plan_files};
use crate::untraced::{ARG_KEY_PREFIX, take_untraced};
use crate::vault::SealedSecret;
use crate::*;

const CARD: &str = "4111-1111-1111-1111";

const TOOLS: &str = r#"TOOLS:
  pay(card: string, amount: number) -> {ok: boolean}
    type: http
    endpoint: "/pay"
    method: POST
    permission: crm.write
    repeat_safety: idempotent
    parameters:
      card:
        visibility: {trace: false}
"#;

const AGENT: &str =
    "kind: agent\nname: a\nmodel: m\ninstructions: i\ntools: [pay]\ngrants: [crm.write]\n";

fn answer(arguments: &str) -> ModelCallResult {
    ModelCallResult {
        content: None,
        tool_calls: vec![ToolUse {
            id: "tu1".into(),
            name: "pay".into(),
            arguments: arguments.into(),
        }],
        usage: belay_proto::wire::Usage {
            input_tokens: 1,
            output_tokens: 1,
        },
        finish_reason: None,
    }
}

/// What the coordinator does: take the values out, "seal" them (the
/// machine never opens a value: any bytes stand for the ciphertext), hand
/// them in; `vault: false` seals none, as an engine without a vault key.
fn complete(run: &mut Run, arguments: &str, vault: bool) -> Decision {
    let mut result = answer(arguments);
    let taken = take_untraced(&run.state, "n.m1", &mut result);
    let secrets = if vault {
        taken
            .iter()
            .map(|(key, value)| SealedSecret {
                key: key.clone(),
                nonce: vec![0; 12],
                ciphertext: value.bytes().rev().collect(),
            })
            .collect()
    } else {
        Vec::new()
    };
    run.step(Input::ModelCallCompletedUntraced {
        call_id: "n.m1".into(),
        attempt: 1,
        result,
        secrets,
    })
}

fn refusal(d: &Decision) -> (String, String) {
    d.events
        .iter()
        .find_map(|e| match e {
            Event::ToolCallRefused { check, reason, .. } => Some((check.clone(), reason.clone())),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{:?}", d.events))
}

#[test]
fn an_untraced_value_is_in_no_event_and_is_vaulted_with_the_scheduling_and_read_at_dispatch() {
    let plan = plan_files(TOOLS, AGENT, AGENT_WF);
    let (mut run, _) = Run::start_plan(plan, json!({}));
    let d = complete(
        &mut run,
        &format!(r#"{{"card": "{CARD}", "amount": 5}}"#),
        true,
    );

    let history = serde_json::to_string(&run.history).unwrap();
    assert!(!history.contains(CARD), "{history}");
    let Some(Event::ToolCallScheduled { arguments, .. }) = d
        .events
        .iter()
        .find(|e| matches!(e, Event::ToolCallScheduled { .. }))
    else {
        panic!("{:?}", d.events);
    };
    let placeholder = arguments["card"].as_str().unwrap().to_owned();
    let key = placeholder
        .strip_prefix("{{_secret.")
        .and_then(|k| k.strip_suffix("}}"))
        .unwrap()
        .to_owned();
    assert!(key.starts_with(ARG_KEY_PREFIX) && key.len() == 29, "{key}");
    assert_eq!(arguments["amount"], json!(5));
    // The model's recorded turn (its transcript) holds the placeholder too.
    let Some(Event::ModelCallCompleted { tool_calls, .. }) = d
        .events
        .iter()
        .find(|e| matches!(e, Event::ModelCallCompleted { .. }))
    else {
        panic!();
    };
    assert!(tool_calls[0].arguments.contains(&placeholder));
    // Its key, never its value, in an event; the sealed value in the
    // command the store writes in the same transaction.
    let Some(Event::SecretsVaulted { keys, .. }) = d
        .events
        .iter()
        .find(|e| matches!(e, Event::SecretsVaulted { .. }))
    else {
        panic!("{:?}", d.events);
    };
    assert_eq!(keys[0].key, key);
    assert_eq!(keys[0].path, "args.card");
    assert_eq!(keys[0].consumers, ["pay"]);
    let vaulted: Vec<&Command> = d
        .commands
        .iter()
        .filter(|c| matches!(c, Command::VaultSecrets { .. }))
        .collect();
    let [Command::VaultSecrets { entries, tool, .. }] = vaulted.as_slice() else {
        panic!("{:?}", d.commands);
    };
    assert_eq!(tool, "pay");
    assert_eq!(entries[0].sealed.key, key);
    assert!(!entries[0].single_use && entries[0].ttl_s.is_none());
    // The task spec holds the placeholder.
    let spec = d
        .commands
        .iter()
        .find_map(|c| match c {
            Command::ScheduleTask {
                kind: TaskKind::ToolCall,
                spec,
                ..
            } => Some(spec.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(spec["arguments"]["card"], Value::String(placeholder));

    let d = run.step(Input::DispatchToolCall {
        call_id: "n.t1".into(),
        attempt: 1,
        worker_id: "w".into(),
        callback_token_sha256: None,
        tenant_grants: None,
    });
    assert!(
        d.commands.iter().any(|c| matches!(
            c,
            Command::RestoreSecrets { keys, tool, .. } if keys.as_slice() == std::slice::from_ref(&key) && tool == "pay"
        )),
        "{:?}",
        d.commands
    );
}

#[test]
fn without_a_sealed_value_or_with_a_value_that_is_no_string_the_call_is_refused_before_it_acts() {
    let plan = plan_files(TOOLS, AGENT, AGENT_WF);
    let (mut run, _) = Run::start_plan(plan.clone(), json!({}));
    let d = complete(
        &mut run,
        &format!(r#"{{"card": "{CARD}", "amount": 5}}"#),
        false,
    );
    let (check, reason) = refusal(&d);
    assert_eq!(check, "vault");
    assert!(reason.contains("BELAY_VAULT_KEY"), "{reason}");
    assert!(!serde_json::to_string(&run.history).unwrap().contains(CARD));
    assert!(!d.commands.iter().any(|c| matches!(
        c,
        Command::ScheduleTask {
            kind: TaskKind::ToolCall,
            ..
        } | Command::VaultSecrets { .. }
    )));

    for (arguments, hidden) in [
        (
            r#"{"card": 4111111111111111, "amount": 5}"#,
            "4111111111111111",
        ),
        (r#"{"card": {"n": "4111-2222"}, "amount": 5}"#, "4111-2222"),
    ] {
        let (mut run, _) = Run::start_plan(plan.clone(), json!({}));
        let d = complete(&mut run, arguments, true);
        let (check, reason) = refusal(&d);
        assert_eq!(check, "invalid_arguments");
        assert!(reason.contains("`card` must be a string"), "{reason}");
        assert!(
            !serde_json::to_string(&run.history)
                .unwrap()
                .contains(hidden)
        );
    }

    // Arguments that are not JSON at all are not recorded either.
    let (mut run, _) = Run::start_plan(plan, json!({}));
    let d = complete(&mut run, &format!(r#"{{"card": "{CARD}", "amount""#), true);
    assert_eq!(refusal(&d).0, "invalid_arguments");
    assert!(!serde_json::to_string(&run.history).unwrap().contains(CARD));
}
