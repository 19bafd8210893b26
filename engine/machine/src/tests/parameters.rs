//! The parameters a definition fills in (`source:`, `hidden: true`): left
//! out of the model's schema, refused from the model or a tool node's args,
//! filled in when the call is proposed and again after an approver's edit,
//! and no way around the check on calls the model repeats. Definitions are
//! parsed from text, as in production.

#![allow(clippy::unwrap_used)]

use belay_proto::wire::{ModelCallResult, ToolUse};
use serde_json::{Value, json};

use super::{AGENT_WF, Run, model_calls, plan_files};
use crate::*;

/// A tool with every kind of parameter the model does not supply.
const CHARGE_TOOLS: &str = r#"TOOLS:
  charge(amount: number, customer_id: string, run: string, node: string, call: string, key: string, who: string, org: string, api_key: string, cents: number, zone: string, fixed: string, note?: string) -> {ok: boolean}
    description: "Charge the customer"
    type: http
    endpoint: "/charge"
    parameters:
      customer_id:
        source: system
        value: ".input.customer_id"
        hidden: true
      run:
        source: runtime
        value: run_id
      node:
        source: runtime
        value: node_id
      call:
        source: runtime
        value: call_id
      key:
        source: runtime
        value: idempotency_key
      who:
        source: auth
      org:
        source: auth
        value: tenant
      api_key:
        source: config
        value: CRM_KEY
      cents:
        source: expr
        value: ".args.amount * 100"
      zone:
        source: lookup
        key: ".input.country"
        table:
          DE: eu
          US: us
        default: other
      fixed:
        value: v1
    permission: crm.write
    repeat_safety: idempotent
"#;

const CHARGE_AGENT: &str =
    "kind: agent\nname: a\nmodel: m\ninstructions: i\ntools: [charge]\ngrants: [crm.write]\n";

fn model_proposes(call_id: &str, arguments: &str) -> Input {
    Input::ModelCallCompleted {
        call_id: call_id.into(),
        attempt: 1,
        result: ModelCallResult {
            content: None,
            tool_calls: vec![ToolUse {
                id: "tu1".into(),
                name: "charge".into(),
                arguments: arguments.into(),
            }],
            usage: belay_proto::wire::Usage {
                input_tokens: 1,
                output_tokens: 1,
            },
            finish_reason: None,
        },
    }
}

#[test]
fn parameters_the_model_does_not_supply_are_hidden_from_it_and_filled_in_when_proposed() {
    let plan = plan_files(CHARGE_TOOLS, CHARGE_AGENT, AGENT_WF);
    let input = json!({"customer_id": "cus_42", "country": "DE"});
    let (mut run, d) = Run::start_plan(plan, input);
    // The model is given `amount` only.
    let spec = &model_calls(&d)[0];
    assert_eq!(
        spec["tools"][0]["parameters"],
        json!({
            "type": "object",
            "properties": {"amount": {"type": "number"}, "note": {"type": "string"}},
            "required": ["amount"],
            "additionalProperties": false,
        })
    );
    for hidden in ["customer_id", "api_key", "zone", "CRM_KEY"] {
        assert!(
            !spec["tools"].to_string().contains(hidden),
            "{hidden} shown to the model"
        );
    }

    // The model proposes `amount`; the call carries every parameter,
    // filled in from the state, the call, the caller and the definition.
    let proposal = model_proposes("n.m1", r#"{"amount": 12}"#);
    let before = run.state.clone();
    let d = run.step(proposal.clone());
    let arguments = json!({
        "amount": 12,
        "customer_id": "cus_42",
        "run": "r1",
        "node": "n",
        "call": "n.t1",
        "key": "r1/n.t1",
        "who": "app",
        "org": "acme",
        "api_key": "{{config.CRM_KEY}}",
        "cents": 1200,
        "zone": "eu",
        "fixed": "v1",
    });
    let Some(Event::ToolCallScheduled {
        arguments: recorded,
        ..
    }) = d
        .events
        .iter()
        .find(|e| matches!(e, Event::ToolCallScheduled { .. }))
    else {
        panic!("{:?}", d.events);
    };
    assert_eq!(recorded, &arguments);
    let Some(Command::ScheduleTask { spec, .. }) = d.commands.iter().find(|c| {
        matches!(
            c,
            Command::ScheduleTask {
                kind: TaskKind::ToolCall,
                ..
            }
        )
    }) else {
        panic!("{:?}", d.commands);
    };
    assert_eq!(spec["arguments"], arguments);
    assert_eq!(spec["config_params"], json!(["api_key"]));
    // Deciding the same input on the same state gives the same arguments.
    assert_eq!(decide(&before, proposal).unwrap(), d);

    // The transcript keeps the model's own arguments: the next model call
    // shows none of the filled-in values.
    run.step(Input::DispatchToolCall {
        call_id: "n.t1".into(),
        attempt: 1,
        worker_id: "w".into(),
        callback_token_sha256: None,
        tenant_grants: None,
    });
    let d = run.step(Input::ToolCallCompleted {
        call_id: "n.t1".into(),
        attempt: 1,
        result: json!({"ok": true}),
        secrets: Vec::new(),
    });
    let next = model_calls(&d);
    assert_eq!(next.len(), 1, "{:?}", d.commands);
    // (The run's input, with its customer id, is the agent's user message.)
    for hidden in ["CRM_KEY", "\"eu\"", "1200", "r1/n.t1", "\"v1\""] {
        assert!(
            !next[0].to_string().contains(hidden),
            "{hidden} shown to the model: {}",
            next[0]
        );
    }

    // A lookup that misses takes the default.
    let plan = plan_files(CHARGE_TOOLS, CHARGE_AGENT, AGENT_WF);
    let (mut run, _) = Run::start_plan(plan, json!({"customer_id": "c", "country": "FR"}));
    let d = run.step(model_proposes("n.m1", r#"{"amount": 1}"#));
    let Some(Event::ToolCallScheduled { arguments, .. }) = d
        .events
        .iter()
        .find(|e| matches!(e, Event::ToolCallScheduled { .. }))
    else {
        panic!("{:?}", d.events);
    };
    assert_eq!(arguments["zone"], json!("other"));
}

#[test]
fn a_model_sending_a_parameter_it_does_not_supply_is_refused_and_told_why() {
    let plan = plan_files(CHARGE_TOOLS, CHARGE_AGENT, AGENT_WF);
    let (mut run, _) = Run::start_plan(plan.clone(), json!({"customer_id": "cus_42"}));
    let d = run.step(model_proposes(
        "n.m1",
        r#"{"amount": 12, "customer_id": "cus_EVIL", "api_key": "{{config.OTHER}}"}"#,
    ));
    let Some(Event::ToolCallRefused { check, reason, .. }) = d
        .events
        .iter()
        .find(|e| matches!(e, Event::ToolCallRefused { .. }))
    else {
        panic!("{:?}", d.events);
    };
    assert_eq!(check, "invalid_arguments");
    assert_eq!(
        reason,
        "arguments may not include `customer_id`, `api_key`: the system supplies them; call the tool without them"
    );
    assert!(d.commands.iter().all(|c| !matches!(
        c,
        Command::ScheduleTask {
            kind: TaskKind::ToolCall,
            ..
        }
    )));
    // The refusal goes back to the model as the call's result.
    let next = model_calls(&d);
    assert!(next[0].to_string().contains("the system supplies them"));

    // A parameter whose source gives nothing refuses the call without
    // showing a value.
    let (mut run, _) = Run::start_plan(plan, json!({"country": "US"}));
    let d = run.step(model_proposes("n.m1", r#"{"amount": 12}"#));
    let Some(Event::ToolCallRefused { check, reason, .. }) = d
        .events
        .iter()
        .find(|e| matches!(e, Event::ToolCallRefused { .. }))
    else {
        panic!("{:?}", d.events);
    };
    assert_eq!(check, "parameter_source");
    assert_eq!(
        reason,
        "tool `charge` cannot be called here: parameter `customer_id` (`source: system` `.input.customer_id`) has no value here and no default"
    );
    // A value of the wrong type, likewise (and the value is not shown).
    let plan = plan_files(CHARGE_TOOLS, CHARGE_AGENT, AGENT_WF);
    let (mut run, _) = Run::start_plan(plan, json!({"customer_id": {"secret": "s3"}}));
    let d = run.step(model_proposes("n.m1", r#"{"amount": 12}"#));
    let Some(Event::ToolCallRefused { check, reason, .. }) = d
        .events
        .iter()
        .find(|e| matches!(e, Event::ToolCallRefused { .. }))
    else {
        panic!("{:?}", d.events);
    };
    assert_eq!(check, "parameter_source");
    assert!(
        reason.contains("does not match its type") && !reason.contains("s3"),
        "{reason}"
    );
}

#[test]
fn a_tool_node_gets_the_injected_parameters_and_may_not_set_them() {
    let wf = |args: &str| {
        format!(
            "kind: workflow\nname: w\nnodes:\n  - {{id: pay, type: tool, tool: charge, args: {args}, grants: [crm.write]}}\n"
        )
    };
    let plan = plan_files(CHARGE_TOOLS, CHARGE_AGENT, &wf("{amount: 3}"));
    let (_, d) = Run::start_plan(plan, json!({"customer_id": "cus_1", "country": "US"}));
    let Some(Command::ScheduleTask { spec, .. }) = d.commands.first() else {
        panic!("{:?}", d.commands);
    };
    assert_eq!(spec["arguments"]["customer_id"], json!("cus_1"));
    assert_eq!(spec["arguments"]["node"], json!("pay"));
    assert_eq!(spec["arguments"]["call"], json!("pay.t1"));
    assert_eq!(spec["arguments"]["cents"], json!(300));
    assert_eq!(spec["arguments"]["zone"], json!("us"));

    let plan = plan_files(CHARGE_TOOLS, CHARGE_AGENT, &wf("{amount: 3, who: root}"));
    let (run, d) = Run::start_plan(plan, json!({"customer_id": "cus_1"}));
    assert!(
        d.commands
            .iter()
            .all(|c| !matches!(c, Command::ScheduleTask { .. })),
        "{:?}",
        d.commands
    );
    assert_eq!(run.state.status, RunStatus::Failed);
    assert!(
        run.state.status_reason.contains(
            "`args` of tool `charge` set `who`, which the tool's definition supplies itself"
        ),
        "{}",
        run.state.status_reason
    );
}

#[test]
fn the_same_call_repeated_stops_the_run_although_its_filled_in_call_id_differs() {
    let plan = plan_files(CHARGE_TOOLS, CHARGE_AGENT, AGENT_WF);
    let (mut run, _) = Run::start_plan(plan, json!({"customer_id": "c", "country": "US"}));
    for step in 1..=3 {
        let d = run.step(model_proposes(&format!("n.m{step}"), r#"{"amount": 5}"#));
        if step == 3 {
            assert!(
                d.events.iter().any(
                    |e| matches!(e, Event::ToolCallRefused { check, .. } if check == "no_progress")
                ),
                "{:?}",
                d.events
            );
            break;
        }
        let call_id = format!("n.t{step}");
        run.step(Input::DispatchToolCall {
            call_id: call_id.clone(),
            attempt: 1,
            worker_id: "w".into(),
            callback_token_sha256: None,
            tenant_grants: None,
        });
        run.step(Input::ToolCallCompleted {
            call_id,
            attempt: 1,
            result: json!({"ok": true}),
            secrets: Vec::new(),
        });
    }
    assert_eq!(run.state.status, RunStatus::Failed);
}

#[test]
fn an_approvers_edit_recomputes_the_parameters_the_definition_fills_in() {
    let tools = r#"TOOLS:
  charge(amount: number, cents: number, call: string) -> {ok: boolean}
    type: http
    endpoint: "/charge"
    method: POST
    parameters:
      cents:
        source: expr
        value: ".args.amount * 100"
      call:
        source: runtime
        value: call_id
    confirmation:
      require: always
      approver_grant: pay.approve
    permission: crm.write
    repeat_safety: idempotent
"#;
    let wf = "kind: workflow\nname: w\nnodes:\n  - {id: pay, type: tool, tool: charge, args: {amount: 3}, grants: [crm.write]}\n";
    let agent =
        "kind: agent\nname: a\nmodel: m\ninstructions: i\ntools: [charge]\ngrants: [crm.write]\n";
    let (mut run, _) = Run::start_plan(plan_files(tools, agent, wf), json!({}));
    assert_eq!(
        run.state.status,
        RunStatus::Waiting,
        "{}",
        run.state.status_reason
    );
    let confirm = |edit: Value| Input::DecideApproval {
        request: None,
        node: "pay.t1".into(),
        approve: true,
        edited_subject: Some(edit),
        by: "ana".into(),
        grants: vec!["pay.approve".into()],
        reason: String::new(),
    };
    // Writing a filled-in parameter with another value: refused, named.
    let bad = run.try_step(confirm(json!({"amount": 10, "cents": 5})));
    assert!(
        matches!(&bad, Err(MachineError::InvalidEdit { errors, .. })
            if errors.iter().any(|e| e.contains("`cents` is filled in by the tool's definition"))),
        "{bad:?}"
    );
    // Left out (or written as it was): filled in again from the edit.
    let d = run.step(confirm(json!({"amount": 10, "call": "pay.t1"})));
    let Some(Command::ScheduleTask { spec, .. }) = d.commands.first() else {
        panic!("{:?}", d.commands);
    };
    assert_eq!(
        spec["arguments"],
        json!({"amount": 10, "cents": 1000, "call": "pay.t1"})
    );
    let recorded = d.events.iter().find_map(|e| match e {
        Event::ConfirmationDecided { arguments, .. } => Some(arguments.clone()),
        _ => None,
    });
    assert_eq!(recorded, Some(spec["arguments"].clone()));
}
