//! A tool's `process:` ([`crate::process`]): `before` checks the model's
//! arguments and computes parameters, `after` remaps the result; and
//! `compaction.max_description_length`.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::{jq, tool_results};
use crate::tests::{Opts, Run, scheduled_specs};
use crate::*;
use belay_definitions::model::CompactionDef;

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
        tool_results(&run),
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
        tool_results(&run),
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
    assert_eq!(tool_results(&run), vec![r#"{"name":"ADA"}"#.to_owned()]);
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
        assert_eq!(tool_results(&run), vec![shown.to_owned()], "{shown}");
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
        tool_results(&run),
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
        request: None,
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
    assert_eq!(tool_results(&run), vec![r#"{"name":"Ada"}"#.to_owned()]);
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
