//! A traced run: `RunStarted` keeps the trace context it was started in,
//! the fold restores it, and every task spec carries it with the span of
//! the call's node visit as the parent, plus the call id and (tools) the
//! repeat safety; an untraced run's specs carry none.

use super::*;
use belay_proto::trace::{CallTrace, TraceContext};
use belay_proto::wire::ModelCallSpec;

const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn start_traced() -> (Run, Decision, TraceContext) {
    let trace = TraceContext::parse(TP, "rojo=1").expect("valid traceparent");
    let opts = Opts::default();
    let mut run = Run {
        state: RunState::default(),
        history: vec![],
    };
    let d = run.step(Input::Start {
        run_id: "r1".into(),
        tenant: "acme".into(),
        caller: "app".into(),
        caller_grants: opts.caller_grants.clone(),
        tenant_grants: vec!["crm.read".into(), "crm.write".into(), "ops.danger".into()],
        input: json!({"email": "a@example.com"}),
        plan: Box::new(plan(&opts)),
        trace: Some(trace.clone()),
    });
    (run, d, trace)
}

fn trace_of(spec: &Value) -> CallTrace {
    serde_json::from_value(spec["trace"].clone()).expect("a trace in the spec")
}

#[test]
fn every_task_of_a_traced_run_names_its_node_span_as_parent() {
    let (mut run, d, trace) = start_traced();
    assert!(matches!(
        &d.events[0],
        Event::RunStarted { trace: Some(t), .. } if *t == trace
    ));
    assert_eq!(run.state.trace.as_ref(), Some(&trace));
    let node_span = trace.node_span_id("r1", "intake");

    let specs = scheduled_specs(&d);
    let model = trace_of(&specs[0].1);
    assert_eq!(model.call_id, "intake.m1");
    assert_eq!(model.context.trace_id(), trace.trace_id());
    assert_eq!(model.context.parent_id(), node_span);
    assert_eq!(model.context.tracestate, "rojo=1");
    assert_eq!(model.repeat_safety, "");
    let spec: ModelCallSpec = serde_json::from_value(specs[0].1.clone()).expect("model spec");
    assert_eq!(spec.trace.as_ref(), Some(&model));

    let d = run.model(
        "intake.m1",
        &[("lookup", r#"{"email":"a@example.com"}"#)],
        None,
    );
    let specs = scheduled_specs(&d);
    let tool = trace_of(&specs[0].1);
    assert_eq!(tool.call_id, "intake.t1");
    assert_eq!(tool.context.parent_id(), node_span);
    assert!(!tool.repeat_safety.is_empty(), "{tool:?}");
}

#[test]
fn the_trace_survives_a_replay_and_an_untraced_run_has_none() {
    let (run, _, trace) = start_traced();
    let mut replayed = RunState::default();
    for event in &run.history {
        let json = serde_json::to_value(event).expect("encodes");
        replayed.apply(&serde_json::from_value(json).expect("decodes"));
    }
    assert_eq!(replayed.trace, Some(trace));
    assert_eq!(
        replayed.node_started_seq, 2,
        "NodeStarted is the second event"
    );

    let (_, d) = Run::start(Opts::default());
    assert!(scheduled_specs(&d)[0].1.get("trace").is_none());
}
