//! Strict mode in the agent loop: the model is given the strict schema
//! with the `strict` flag, and a `null` a strict model sends for an
//! optional parameter is removed before check 2 (so the default applies),
//! while check 2 still refuses what the tool's own schema refuses.

#![allow(clippy::unwrap_used)]

use belay_proto::wire::{ModelCallResult, ToolUse};
use serde_json::json;

use super::{AGENT_WF, Run, model_calls, plan_files};
use crate::*;

const TOOLS: &str = r#"TOOLS:
  search(query: string, limit?: number = 20, filter?: {tag: string, kind?: string}) -> {ok: boolean}
    description: "Search"
    type: http
    endpoint: "/search"
    permission: crm.write
    repeat_safety: idempotent
    strict: true
"#;

const AGENT: &str =
    "kind: agent\nname: a\nmodel: m\ninstructions: i\ntools: [search]\ngrants: [crm.write]\n";

fn proposes(arguments: &str) -> Input {
    Input::ModelCallCompleted {
        call_id: "n.m1".into(),
        attempt: 1,
        result: ModelCallResult {
            content: None,
            tool_calls: vec![ToolUse {
                id: "tu1".into(),
                name: "search".into(),
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
fn a_strict_tool_is_offered_with_its_strict_schema_and_nulls_of_optional_parameters_are_dropped() {
    let plan = plan_files(TOOLS, AGENT, AGENT_WF);
    let (mut run, d) = Run::start_plan(plan.clone(), json!({}));
    let spec = &model_calls(&d)[0];
    assert_eq!(spec["tools"][0]["strict"], json!(true));
    assert_eq!(
        spec["tools"][0]["parameters"]["required"],
        json!(["filter", "limit", "query"])
    );
    assert_eq!(
        spec["tools"][0]["parameters"]["properties"]["filter"]["properties"]["kind"]["type"],
        json!(["string", "null"])
    );

    let d = run.step(proposes(
        r#"{"query": "shoes", "limit": null, "filter": {"tag": "red", "kind": null}}"#,
    ));
    let Some(Event::ToolCallScheduled { arguments, .. }) = d
        .events
        .iter()
        .find(|e| matches!(e, Event::ToolCallScheduled { .. }))
    else {
        panic!("{:?}", d.events);
    };
    // The nulls are gone; the default fills `limit` as if it were left out.
    assert_eq!(
        arguments,
        &json!({"query": "shoes", "limit": 20, "filter": {"tag": "red"}})
    );

    // Check 2 still runs against the tool's own schema: a null for a
    // required parameter is refused, and so is a wrong type.
    for bad in [
        r#"{"query": null, "limit": null, "filter": null}"#,
        r#"{"query": "x", "limit": "ten", "filter": null}"#,
    ] {
        let (mut run, _) = Run::start_plan(plan.clone(), json!({}));
        let d = run.step(proposes(bad));
        let Some(Event::ToolCallRefused { check, reason, .. }) = d
            .events
            .iter()
            .find(|e| matches!(e, Event::ToolCallRefused { .. }))
        else {
            panic!("{bad}: {:?}", d.events);
        };
        assert_eq!(check, "invalid_arguments", "{reason}");
    }
}

#[test]
fn a_tool_without_strict_gets_no_flag_and_keeps_a_null_for_check_2() {
    let tools = TOOLS.replace("    strict: true\n", "");
    let plan = plan_files(&tools, AGENT, AGENT_WF);
    let (mut run, d) = Run::start_plan(plan, json!({}));
    let spec = &model_calls(&d)[0];
    assert!(spec["tools"][0].get("strict").is_none(), "{spec}");
    assert_eq!(spec["tools"][0]["parameters"]["required"], json!(["query"]));
    let d = run.step(proposes(r#"{"query": "shoes", "limit": null}"#));
    assert!(
        d.events.iter().any(
            |e| matches!(e, Event::ToolCallRefused { check, .. } if check == "invalid_arguments")
        ),
        "{:?}",
        d.events
    );
}
