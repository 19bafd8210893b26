//! Machine tests of the result cache (`hints.cacheable`, [`crate::cache`])
//! and of `source: runtime` time parameters: what a decision asks of the
//! store, what a hit records, and that replaying the history gives the
//! same state (every step of [`Run`] checks it) without the cache or the
//! clock.

#![allow(clippy::unwrap_used)]

use chrono::{DateTime, TimeZone, Utc};
use serde_json::{Value, json};

use super::{AGENT_WF, Run, model_call_ids, plan_files};
use crate::cache::{CacheEntry, CachedResult};
use crate::*;

const TOOLS: &str = r#"TOOLS:
  rate(from: string, to: string) -> {rate: number}
    description: "Get the exchange rate"
    type: http
    endpoint: "/fx"
    method: GET
    hints:
      cacheable: true
      cache_ttl: 5m
    effect: read_only
    permission: crm.write
    repeat_safety: idempotent
  rate_uncached(from: string, to: string) -> {rate: number}
    type: http
    endpoint: "/fx"
    permission: crm.write
    repeat_safety: idempotent
  rate_confirmed(from: string, to: string) -> {rate: number}
    type: http
    endpoint: "/fx"
    method: GET
    hints:
      cacheable: true
    confirmation:
      require: always
    permission: crm.write
    repeat_safety: idempotent
"#;

const NODE_WF: &str = r#"kind: workflow
name: w
nodes:
  - {id: fx, type: tool, tool: rate, args: {from: "${ .input.from }", to: EUR}, grants: [crm.write], next: done}
  - {id: done, type: succeed, output: "${ .nodes.fx.output }"}
"#;

const AGENT: &str = "kind: agent\nname: a\nmodel: m\ninstructions: i\ntools: [rate, rate_uncached]\ngrants: [crm.write]\n";

fn at(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms).single().unwrap()
}

/// The lookups and tasks a decision asks for, in order.
fn asks(d: &Decision) -> Vec<String> {
    d.commands
        .iter()
        .filter_map(|c| match c {
            Command::LookupToolCache { call_id, .. } => Some(format!("lookup {call_id}")),
            Command::ScheduleTask { call_id, .. } => Some(format!("task {call_id}")),
            Command::StoreToolCache { call_id, .. } => Some(format!("store {call_id}")),
            _ => None,
        })
        .collect()
}

fn lookup_key(d: &Decision, call: &str) -> String {
    d.commands
        .iter()
        .find_map(|c| match c {
            Command::LookupToolCache { call_id, key } if call_id == call => Some(key.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no lookup of {call}: {:?}", d.commands))
}

fn entry(key: &str, result: Value) -> CacheEntry {
    CacheEntry {
        key: key.into(),
        result,
        stored_by_run: "r0".into(),
        stored_by_call: "fx.t1".into(),
        stored_at: at(1_000),
        expires_at: at(301_000),
    }
}

fn hit(call: &str, entry: CacheEntry) -> Input {
    Input::ToolCacheHit {
        call_id: call.into(),
        entry,
        tenant_grants: vec!["crm.write".into()],
    }
}

fn proposes(calls: &[(&str, &str)]) -> Input {
    Input::ModelCallCompleted {
        call_id: "n.m1".into(),
        attempt: 1,
        result: belay_proto::wire::ModelCallResult {
            content: None,
            tool_calls: calls
                .iter()
                .enumerate()
                .map(|(i, (name, args))| belay_proto::wire::ToolUse {
                    id: format!("tu{i}"),
                    name: (*name).into(),
                    arguments: (*args).into(),
                })
                .collect(),
            usage: belay_proto::wire::Usage {
                input_tokens: 1,
                output_tokens: 1,
            },
            finish_reason: None,
        },
    }
}

#[test]
fn a_hit_completes_the_call_with_no_task_and_the_history_replays_without_the_cache() {
    let (mut run, d) = Run::start_plan(plan_files(TOOLS, AGENT, NODE_WF), json!({"from": "USD"}));
    // The call is looked up right before its task.
    assert_eq!(asks(&d), ["lookup fx.t1", "task fx.t1"]);
    let key = lookup_key(&d, "fx.t1");
    let d = run.step(hit("fx.t1", entry(&key, json!({"rate": 0.92}))));
    assert_eq!(
        d.events.iter().map(Event::kind).collect::<Vec<_>>(),
        [
            "tool_call_completed",
            "node_completed",
            "node_started",
            "node_completed",
            "run_completed"
        ]
    );
    let Event::ToolCallCompleted {
        attempt, cached, ..
    } = &d.events[0]
    else {
        panic!("{:?}", d.events);
    };
    assert_eq!(*attempt, 0);
    assert_eq!(
        cached,
        &Some(CachedResult {
            key: key.clone(),
            stored_by_run: "r0".into(),
            stored_by_call: "fx.t1".into(),
            stored_at: "1970-01-01T00:00:01.000Z".into(),
            expires_at: "1970-01-01T00:05:01.000Z".into(),
        })
    );
    // No task to end, nothing stored again.
    assert!(
        d.commands
            .iter()
            .all(|c| !matches!(c, Command::EndTask { .. } | Command::StoreToolCache { .. })),
        "{:?}",
        d.commands
    );
    assert_eq!(run.state.output, Some(json!({"rate": 0.92})));
    // The recorded history alone gives the same state (`Run::step` checked
    // it at each step), and the hit is in it.
    let replayed = RunState::fold(&run.history);
    assert_eq!(replayed.tool_calls["fx.t1"].status, CallStatus::Completed);
    assert_eq!(replayed.output, Some(json!({"rate": 0.92})));
    // The node took the result as its output; the state holds it once.
    assert_eq!(replayed.tool_calls["fx.t1"].result, None);
}

#[test]
fn a_result_the_tool_gave_is_stored_and_a_failure_is_not() {
    let (mut run, d) = Run::start_plan(plan_files(TOOLS, AGENT, NODE_WF), json!({"from": "USD"}));
    let key = lookup_key(&d, "fx.t1");
    run.step(Input::DispatchToolCall {
        call_id: "fx.t1".into(),
        attempt: 1,
        worker_id: "w".into(),
        callback_token_sha256: None,
        tenant_grants: None,
    });
    // A mistyped result is a failure: nothing is stored.
    let (mut bad, _) = Run::start_plan(plan_files(TOOLS, AGENT, NODE_WF), json!({"from": "USD"}));
    let d = bad.step(Input::ToolCallCompleted {
        secrets: Vec::new(),
        call_id: "fx.t1".into(),
        attempt: 1,
        result: json!({"rate": "high"}),
    });
    assert!(!asks(&d).iter().any(|a| a.starts_with("store")), "{d:?}");
    // A failure reported by the worker: nothing is stored.
    let (mut failed, _) =
        Run::start_plan(plan_files(TOOLS, AGENT, NODE_WF), json!({"from": "USD"}));
    let d = failed.step(Input::TaskFailed {
        call_id: "fx.t1".into(),
        attempt: 1,
        error: "HTTP 400".into(),
        class: FailureClass::Rejected,
        dispatched: true,
        status_code: Some(400),
    });
    assert!(!asks(&d).iter().any(|a| a.starts_with("store")), "{d:?}");
    // A result: stored under the call's key, scrubbed, with the tool's TTL.
    let d = run.step(Input::ToolCallCompleted {
        secrets: Vec::new(),
        call_id: "fx.t1".into(),
        attempt: 1,
        result: json!({"rate": 0.92, "api_key": "sk-live-0123456789abcdef0123"}),
    });
    let stored = d.commands.iter().find_map(|c| match c {
        Command::StoreToolCache {
            key,
            tool,
            call_id,
            result,
            ttl_ms,
        } => Some((
            key.clone(),
            tool.clone(),
            call_id.clone(),
            result.clone(),
            *ttl_ms,
        )),
        _ => None,
    });
    let (stored_key, tool, call_id, result, ttl_ms) = stored.expect("stored");
    assert_eq!(
        (stored_key, tool.as_str(), call_id.as_str(), ttl_ms),
        (key, "rate", "fx.t1", 300_000)
    );
    assert_eq!(result["rate"], json!(0.92));
    assert!(
        !result.to_string().contains("sk-live"),
        "an unscrubbed result was stored: {result}"
    );
}

#[test]
fn the_key_is_the_tenant_the_definition_and_the_arguments() {
    let plan = plan_files(TOOLS, AGENT, NODE_WF);
    let tool = plan.tools["rate"].clone();
    let args = json!({"from": "USD", "to": "EUR"});
    let key = cache::key("acme", &tool, &args);
    // Same call, another run of the tenant: the same key; the order of the
    // arguments' keys does not matter.
    let (_, d) = Run::start_plan(plan.clone(), json!({"from": "USD"}));
    assert_eq!(lookup_key(&d, "fx.t1"), key);
    assert_eq!(
        cache::key("acme", &tool, &json!({"to": "EUR", "from": "USD"})),
        key
    );
    // Other arguments, another tenant, another definition: other keys.
    assert_ne!(
        cache::key("acme", &tool, &json!({"from": "GBP", "to": "EUR"})),
        key
    );
    assert_ne!(cache::key("globex", &tool, &args), key);
    let mut changed = tool.clone();
    changed.content_hash = "h2".into();
    assert_ne!(cache::key("acme", &changed, &args), key);
    // The tenant and the tool's name cannot run into each other.
    let mut named = tool.clone();
    named.def.name = "e\n3:rate".into();
    assert_ne!(cache::key("acm", &named, &args), key);
}

#[test]
fn a_tool_without_cacheable_is_never_looked_up_nor_stored() {
    let (mut run, _) = Run::start_plan(plan_files(TOOLS, AGENT, AGENT_WF), json!({"from": "USD"}));
    let d = run.step(proposes(&[(
        "rate_uncached",
        r#"{"from": "USD", "to": "EUR"}"#,
    )]));
    assert_eq!(asks(&d), ["task n.t1"]);
    let d = run.step(Input::ToolCallCompleted {
        secrets: Vec::new(),
        call_id: "n.t1".into(),
        attempt: 1,
        result: json!({"rate": 1.0}),
    });
    assert!(!asks(&d).iter().any(|a| a.starts_with("store")), "{d:?}");
    // A hit for it is refused (the store then schedules the task).
    let (mut run, _) = Run::start_plan(plan_files(TOOLS, AGENT, AGENT_WF), json!({"from": "USD"}));
    run.step(proposes(&[(
        "rate_uncached",
        r#"{"from": "USD", "to": "EUR"}"#,
    )]));
    assert!(matches!(
        run.try_step(hit("n.t1", entry("k", json!({"rate": 1.0})))),
        Err(MachineError::CallNotOpen { .. })
    ));
}

#[test]
fn hits_of_every_call_of_a_turn_make_the_next_model_call_and_count_against_the_budget() {
    let (mut run, _) = Run::start_plan(plan_files(TOOLS, AGENT, AGENT_WF), json!({"from": "USD"}));
    let d = run.step(proposes(&[
        ("rate", r#"{"from": "USD", "to": "EUR"}"#),
        ("rate", r#"{"from": "GBP", "to": "EUR"}"#),
    ]));
    assert_eq!(
        asks(&d),
        ["lookup n.t1", "task n.t1", "lookup n.t2", "task n.t2"]
    );
    assert_ne!(lookup_key(&d, "n.t1"), lookup_key(&d, "n.t2"));
    // The budget counts both calls: they were accepted when proposed.
    assert_eq!(run.state.node.as_ref().unwrap().tool_calls, 2);
    assert_eq!(run.state.totals.tool_calls, 2);
    let first = run.step(hit(
        "n.t1",
        entry(&lookup_key(&d, "n.t1"), json!({"rate": 0.9})),
    ));
    assert!(model_call_ids(&first).is_empty());
    let second = run.step(hit(
        "n.t2",
        entry(&lookup_key(&d, "n.t2"), json!({"rate": 1.2})),
    ));
    let next = model_call_ids(&second);
    assert_eq!(next.len(), 1, "{:?}", second.commands);
    // The model reads the cached results as it would the tool's.
    let text = next[0].1["messages"].to_string();
    assert!(text.contains("0.9") && text.contains("1.2"), "{text}");
}

#[test]
fn a_hit_is_refused_when_the_call_is_under_way_the_key_differs_the_grant_is_gone_or_the_type_is_wrong()
 {
    let start = || {
        let (run, d) = Run::start_plan(plan_files(TOOLS, AGENT, NODE_WF), json!({"from": "USD"}));
        let key = lookup_key(&d, "fx.t1");
        (run, key)
    };
    // Another call's entry.
    let (mut run, key) = start();
    assert!(matches!(
        run.try_step(hit("fx.t1", entry(&format!("{key}0"), json!({"rate": 1})))),
        Err(MachineError::CallNotOpen { .. })
    ));
    // The tenant's grant was withdrawn: not served (the dispatch refuses it).
    let (mut run, key) = start();
    let refused = run.try_step(Input::ToolCacheHit {
        call_id: "fx.t1".into(),
        entry: entry(&key, json!({"rate": 1})),
        tenant_grants: vec![],
    });
    assert!(
        matches!(&refused, Err(MachineError::DispatchRefused { detail, .. }) if detail.contains("tenant")),
        "{refused:?}"
    );
    // Not of the tool's return type.
    let (mut run, key) = start();
    assert!(matches!(
        run.try_step(hit("fx.t1", entry(&key, json!({"rate": "x"})))),
        Err(MachineError::InvalidResult { .. })
    ));
    // Already dispatched by a worker.
    let (mut run, key) = start();
    run.step(Input::DispatchToolCall {
        call_id: "fx.t1".into(),
        attempt: 1,
        worker_id: "w".into(),
        callback_token_sha256: None,
        tenant_grants: None,
    });
    assert!(matches!(
        run.try_step(hit("fx.t1", entry(&key, json!({"rate": 1})))),
        Err(MachineError::CallNotOpen { .. })
    ));
    // A run paused by an operator serves nothing.
    let (mut run, key) = start();
    run.step(Input::Pause {
        by: "ops".into(),
        reason: "look".into(),
    });
    assert!(matches!(
        run.try_step(hit("fx.t1", entry(&key, json!({"rate": 1})))),
        Err(MachineError::WrongStatus { .. })
    ));
}

#[test]
fn a_confirmed_tool_is_looked_up_only_once_approved() {
    let wf = r#"kind: workflow
name: w
nodes:
  - {id: fx, type: tool, tool: rate_confirmed, args: {from: USD, to: EUR}, grants: [crm.write]}
"#;
    let (mut run, d) = Run::start_plan(plan_files(TOOLS, AGENT, wf), json!({}));
    assert!(asks(&d).is_empty(), "{:?}", d.commands);
    // Not approved yet: nothing to serve.
    assert!(
        run.try_step(hit("fx.t1", entry("k", json!({"rate": 1}))))
            .is_err()
    );
    let d = run.step(Input::DecideApproval {
        request: None,
        node: "fx.t1".into(),
        approve: true,
        edited_subject: None,
        by: "ana".into(),
        grants: vec!["crm.write".into()],
        reason: String::new(),
    });
    assert_eq!(asks(&d), ["lookup fx.t1", "task fx.t1"]);
    // Its TTL is the engine's (pinned by the coordinator; the machine's
    // default when the plan says none).
    let key = lookup_key(&d, "fx.t1");
    run.step(Input::DispatchToolCall {
        call_id: "fx.t1".into(),
        attempt: 1,
        worker_id: "w".into(),
        callback_token_sha256: None,
        tenant_grants: None,
    });
    let d = run.step(Input::ToolCallCompleted {
        secrets: Vec::new(),
        call_id: "fx.t1".into(),
        attempt: 1,
        result: json!({"rate": 1}),
    });
    assert!(d.commands.contains(&Command::StoreToolCache {
        key,
        tool: "rate_confirmed".into(),
        call_id: "fx.t1".into(),
        result: json!({"rate": 1}),
        ttl_ms: cache::DEFAULT_TOOL_CACHE_TTL_MS,
    }));
}

const TIME_TOOLS: &str = r#"TOOLS:
  report(kind: string, at: string, day: date, ms: number) -> {ok: boolean}
    type: http
    endpoint: "/report"
    parameters:
      at:
        source: runtime
        value: time
      day:
        source: runtime
        value: date
      ms:
        source: runtime
        value: unix_ms
    permission: crm.write
    repeat_safety: idempotent
    confirmation:
      require: always
"#;

const TIME_AGENT: &str =
    "kind: agent\nname: a\nmodel: m\ninstructions: i\ntools: [report]\ngrants: [crm.write]\n";

const TIME_WF: &str = r#"kind: workflow
name: w
nodes:
  - {id: r, type: tool, tool: report, args: {kind: daily}, grants: [crm.write]}
"#;

/// A run of `plan` started at `now` (the store hands in the time of each
/// transition; here, of the start).
fn start_at(plan: RunPlan, now: DateTime<Utc>) -> (Run, Decision) {
    let mut run = Run {
        state: RunState {
            now: Some(now),
            ..RunState::default()
        },
        history: vec![],
    };
    let d = run.step(Input::Start {
        run_id: "r1".into(),
        tenant: "acme".into(),
        caller: "app".into(),
        caller_grants: vec!["crm.write".into()],
        tenant_grants: vec!["crm.write".into()],
        input: json!({}),
        plan: Box::new(plan),
        trace: None,
    });
    (run, d)
}

fn scheduled_args(history: &[Event]) -> Value {
    history
        .iter()
        .find_map(|e| match e {
            Event::ToolCallScheduled { arguments, .. } => Some(arguments.clone()),
            _ => None,
        })
        .unwrap_or(Value::Null)
}

#[test]
fn a_runtime_time_is_the_transitions_time_recorded_in_the_arguments() {
    let now = at(1_764_670_530_123); // 2025-12-02T10:15:30.123Z
    let plan = plan_files(TIME_TOOLS, TIME_AGENT, TIME_WF);
    let (run, _) = start_at(plan.clone(), now);
    let args = scheduled_args(&run.history);
    assert_eq!(
        args,
        json!({"kind": "daily", "at": "2025-12-02T10:15:30.123Z", "day": "2025-12-02", "ms": 1_764_670_530_123_i64})
    );
    // Deciding again with the same time gives the same decision; replaying
    // the history needs no time at all (`Run::step` compared the fold).
    let (again, _) = start_at(plan.clone(), now);
    assert_eq!(again.history, run.history);
    let replayed = RunState::fold(&run.history);
    assert_eq!(replayed.now, None);
    assert_eq!(replayed.tool_calls["r.t1"].arguments, args);

    // An approver's edit fills the other parameters in again, but the
    // call keeps the time it was proposed at (the approver saw it).
    let (mut run, _) = start_at(plan.clone(), now);
    run.state.now = Some(at(1_764_756_930_123)); // a day later
    let d = run.step(Input::DecideApproval {
        request: None,
        node: "r.t1".into(),
        approve: true,
        edited_subject: Some(json!({"kind": "weekly"})),
        by: "ana".into(),
        grants: vec!["crm.write".into()],
        reason: String::new(),
    });
    let Some(Event::ConfirmationDecided { arguments, .. }) = d.events.first() else {
        panic!("{:?}", d.events);
    };
    assert_eq!(
        arguments,
        &json!({"kind": "weekly", "at": "2025-12-02T10:15:30.123Z", "day": "2025-12-02", "ms": 1_764_670_530_123_i64})
    );

    // Without a time (nothing handed in), the parameter has no value, and a
    // required one stops the call, naming it and not a value.
    let (run, _) = Run::start_plan(plan, json!({}));
    assert_eq!(run.state.status, RunStatus::Failed);
    assert!(
        run.state
            .status_reason
            .contains("parameter `at` (`source: runtime`) has no value here and no default"),
        "{}",
        run.state.status_reason
    );
}
