//! `request_variants:`: the engine chooses the variant when a call is
//! scheduled (or approved), records it in the event and puts its request
//! into the task spec; replay folds the record and evaluates nothing.

use std::collections::BTreeMap;

use belay_proto::wire::{HttpRequestOptions, ToolBinding, ToolCallSpec};
use serde_json::{Value, json};

use super::{Opts, Run, scheduled_specs};
use crate::*;
use belay_definitions::expr::Expr;
use belay_definitions::model::{ConfirmationDef, RequestVariantDef};

fn eu_variants() -> Vec<RequestVariantDef> {
    vec![
        RequestVariantDef {
            name: "eu".into(),
            when: Some(Expr::parse(r#".email | endswith("@example.eu")"#).expect("jq")),
            default: false,
            endpoint: "https://eu.example.com/lookup".into(),
            method: "PUT".into(),
            headers: BTreeMap::from([("X-Residency".to_owned(), "eu".to_owned())]),
            request: HttpRequestOptions::default(),
        },
        RequestVariantDef {
            name: "default".into(),
            when: None,
            default: true,
            endpoint: "/lookup".into(),
            method: "POST".into(),
            headers: BTreeMap::new(),
            request: HttpRequestOptions::default(),
        },
    ]
}

fn with_variants(plan: &mut RunPlan) {
    if let Some(lookup) = plan.tools.get_mut("lookup") {
        lookup.def.request_variants = eu_variants();
    }
}

fn with_variants_and_confirmation(plan: &mut RunPlan) {
    with_variants(plan);
    if let Some(lookup) = plan.tools.get_mut("lookup") {
        lookup.def.confirmation = Some(ConfirmationDef {
            when_side_effects: false,
            immutable_params: vec![],
            approver_grant: "crm.read".into(),
        });
    }
}

fn with_a_broken_when(plan: &mut RunPlan) {
    if let Some(lookup) = plan.tools.get_mut("lookup") {
        let mut variants = eu_variants();
        variants[0].when = Some(Expr::parse(".email").expect("jq"));
        lookup.def.request_variants = variants;
    }
}

fn scheduled_variant(d: &Decision) -> Option<Option<String>> {
    d.events.iter().find_map(|e| match e {
        Event::ToolCallScheduled { variant, .. } => Some(variant.clone()),
        _ => None,
    })
}

fn http(spec: &Value) -> (ToolCallSpec, String, String, BTreeMap<String, String>) {
    let spec: ToolCallSpec = serde_json::from_value(spec.clone()).expect("tool spec");
    let ToolBinding::Http(http) = spec.binding.clone() else {
        panic!("an http binding")
    };
    (spec, http.endpoint, http.method, http.headers)
}

#[test]
fn the_variant_is_chosen_when_scheduled_recorded_and_sent_in_the_spec() {
    let (mut run, _) = Run::start(Opts {
        edit: Some(with_variants),
        ..Opts::default()
    });
    let d = run.model(
        "intake.m1",
        &[
            ("lookup", r#"{"email":"ada@example.eu"}"#),
            ("lookup", r#"{"email":"bob@example.com"}"#),
        ],
        None,
    );
    let chosen: Vec<Option<String>> = d
        .events
        .iter()
        .filter_map(|e| match e {
            Event::ToolCallScheduled { variant, .. } => Some(variant.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(chosen, [Some("eu".to_owned()), Some("default".to_owned())]);
    // The event as persisted names it.
    let scheduled = d
        .events
        .iter()
        .find(|e| e.kind() == "tool_call_scheduled")
        .expect("scheduled");
    assert_eq!(
        serde_json::to_value(scheduled).expect("json")["variant"],
        "eu"
    );

    let specs = scheduled_specs(&d);
    let (spec, endpoint, method, headers) = http(&specs[0].1);
    assert_eq!(spec.variant.as_deref(), Some("eu"));
    assert_eq!(endpoint, "https://eu.example.com/lookup");
    assert_eq!(method, "PUT");
    assert_eq!(headers.get("X-Residency").map(String::as_str), Some("eu"));
    let (spec, endpoint, method, _) = http(&specs[1].1);
    assert_eq!(spec.variant.as_deref(), Some("default"));
    assert_eq!((endpoint.as_str(), method.as_str()), ("/lookup", "POST"));
    // The call's state keeps the choice (folded from the event: `Run::step`
    // checks replay = live).
    assert_eq!(
        run.state.tool_calls["intake.t1"].variant.as_deref(),
        Some("eu")
    );
}

#[test]
fn without_variants_nothing_is_recorded_and_the_tools_request_is_sent() {
    let (mut run, _) = Run::start(Opts::default());
    let d = run.model(
        "intake.m1",
        &[("lookup", r#"{"email":"ada@example.eu"}"#)],
        None,
    );
    assert_eq!(scheduled_variant(&d), Some(None));
    let specs = scheduled_specs(&d);
    assert!(specs[0].1.get("variant").is_none());
    let scheduled = d
        .events
        .iter()
        .find(|e| e.kind() == "tool_call_scheduled")
        .expect("scheduled");
    assert!(
        serde_json::to_value(scheduled)
            .expect("json")
            .get("variant")
            .is_none()
    );
}

#[test]
fn a_when_that_gives_no_boolean_refuses_the_call_before_anything_is_sent() {
    let (mut run, _) = Run::start(Opts {
        edit: Some(with_a_broken_when),
        ..Opts::default()
    });
    let d = run.model(
        "intake.m1",
        &[("lookup", r#"{"email":"ada@example.eu"}"#)],
        None,
    );
    let refused = d
        .events
        .iter()
        .find_map(|e| match e {
            Event::ToolCallRefused { check, reason, .. } => Some((check.clone(), reason.clone())),
            _ => None,
        })
        .expect("refused");
    assert_eq!(refused.0, "request_variant");
    assert!(
        refused.1.contains(
            "request variant `eu` of tool `lookup` gave \"ada@example.eu\", not true or false"
        ) && refused.1.ends_with("nothing was sent"),
        "{}",
        refused.1
    );
    // Refused: no tool call task, the model hears why.
    assert_eq!(scheduled_variant(&d), None);
    assert!(
        !scheduled_specs(&d)
            .iter()
            .any(|(id, _, _)| id.contains(".t"))
    );
}

#[test]
fn an_approvers_edit_chooses_the_variant_again_and_the_decision_records_it() {
    let (mut run, _) = Run::start(Opts {
        edit: Some(with_variants_and_confirmation),
        ..Opts::default()
    });
    let d = run.model(
        "intake.m1",
        &[("lookup", r#"{"email":"ada@example.eu"}"#)],
        None,
    );
    assert_eq!(scheduled_variant(&d), Some(Some("eu".to_owned())));
    assert!(scheduled_specs(&d).is_empty(), "waits for the decision");
    let d = run.step(Input::DecideApproval {
        request: None,
        node: "intake.t1".into(),
        approve: true,
        edited_subject: Some(json!({"email": "ada@example.com", "plan": "starter"})),
        by: "grace".into(),
        grants: vec!["crm.read".into()],
        reason: "moved".into(),
    });
    let decided = d
        .events
        .iter()
        .find_map(|e| match e {
            Event::ConfirmationDecided {
                variant, edited, ..
            } => Some((variant.clone(), *edited)),
            _ => None,
        })
        .expect("decided");
    assert_eq!(decided, (Some("default".to_owned()), true));
    let specs = scheduled_specs(&d);
    let (spec, endpoint, _, _) = http(&specs[0].1);
    assert_eq!(spec.variant.as_deref(), Some("default"));
    assert_eq!(endpoint, "/lookup");
    assert_eq!(
        run.state.tool_calls["intake.t1"].variant.as_deref(),
        Some("default")
    );
}
