//! The result cache of `hints.cacheable: true` tools on both backends
//! (table `tool_cache`), driven through the coordinator as workers drive
//! it: a call whose key has a live entry completes in the transition that
//! launches it (no task to claim), a result is stored in the transition
//! that records it, entries expire by the engine's clock (moved with
//! `Store::advance_clock`, never slept) and are purged. Also the time of a
//! `source: runtime` parameter, which is the engine's clock at the
//! transition that proposes the call.

mod common;
use common::{Backend, TestDb};

use std::sync::Arc;

use belay_engine::coordinator::{Coordinator, StartRun};
use belay_engine::machine::FailureClass;
use belay_engine::machine::cache::MAX_CACHE_HITS_PER_TRANSITION;
use belay_engine::store::{ClaimedTask, Store, ToolCallQuery};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use uuid::Uuid;

const TENANT: &str = "t";
const OTHER: &str = "u";
const TTL_MS: i64 = 60_000;

const TOOLS: &str = r#"TOOLS:
  rate(from: string) -> {rate: number}
    type: http
    endpoint: "/fx"
    method: GET
    hints:
      cacheable: true
      cache_ttl: 1m
    effect: read_only
    permission: p.use
    repeat_safety: idempotent

  plain_rate(from: string) -> {rate: number}
    type: http
    endpoint: "/fx"
    permission: p.use
    repeat_safety: idempotent

  stamp(kind: string, at: string, day: date) -> object
    type: http
    endpoint: "/stamp"
    parameters:
      at:
        source: runtime
        value: time
      day:
        source: runtime
        value: date
    permission: p.use
    repeat_safety: idempotent
"#;

const FLOWS: &str = r#"kind: workflow
name: rate
nodes:
  - {id: fx, type: tool, tool: rate, args: {from: "${ .input.from }"}, grants: [p.use], on_error: failed, next: done}
  - {id: done, type: succeed, output: "${ .nodes.fx.output }"}
  - {id: failed, type: fail, error: "${ .nodes.fx.output.error }"}
---
kind: workflow
name: twice
nodes:
  - {id: a, type: tool, tool: rate, args: {from: "${ .input.from }"}, grants: [p.use], next: b}
  - {id: b, type: tool, tool: rate, args: {from: EUR}, grants: [p.use]}
---
kind: workflow
name: plain
nodes:
  - {id: fx, type: tool, tool: plain_rate, args: {from: "${ .input.from }"}, grants: [p.use]}
---
kind: workflow
name: poll
nodes:
  - {id: fx, type: tool, tool: rate, args: {from: "${ .input.from }"}, grants: [p.use], next: again}
  - id: again
    type: branch
    cases:
      - when: ${ .nodes.fx.output.rate > 0 }
        next: fx
    default: done
  - {id: done, type: succeed}
---
kind: workflow
name: stamped
nodes:
  - {id: first, type: tool, tool: stamp, args: {kind: start}, grants: [p.use], next: second}
  - {id: second, type: tool, tool: stamp, args: {kind: next}, grants: [p.use]}
"#;

struct Env {
    db: TestDb,
    store: Store,
    coord: Arc<Coordinator>,
    runs: std::sync::atomic::AtomicU32,
}

impl Env {
    async fn new(backend: Backend) -> Env {
        let db = TestDb::create(backend, "belay_cache").await;
        let store = db.store(8).await;
        let coord =
            common::coordinator(store.clone(), &[TENANT, OTHER], TOOLS, FLOWS, &["p.use"]).await;
        Env {
            db,
            store,
            coord,
            runs: Default::default(),
        }
    }

    async fn finish(self) {
        self.store.close().await;
        self.db.drop().await;
    }

    async fn start_for(&self, tenant: &str, workflow: &str, input: Value) -> Uuid {
        let n = self.runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (run, _) = self
            .coord
            .start_run(StartRun {
                tenant: tenant.into(),
                workflow: workflow.into(),
                input_json: input.to_string(),
                idempotency_key: format!("{workflow}-{n}"),
                caller: "app".into(),
                caller_grants: vec!["p.use".into()],
            })
            .await
            .expect("start");
        run.run_id
    }

    async fn start(&self, workflow: &str, from: &str) -> Uuid {
        self.start_for(TENANT, workflow, json!({"from": from}))
            .await
    }

    async fn claim(&self) -> Vec<ClaimedTask> {
        self.coord.claim("w", 64, 0).await.expect("claim")
    }

    /// The one ready task, dispatched, answered with `result`.
    async fn serve(&self, result: Value) -> ClaimedTask {
        let mut tasks = self.claim().await;
        assert_eq!(tasks.len(), 1, "one ready task");
        let task = tasks.remove(0);
        self.coord
            .dispatch("w", &task.task_id.to_string(), task.attempt as u32)
            .await
            .expect("dispatch");
        self.coord
            .complete(
                "w",
                &task.task_id.to_string(),
                task.attempt as u32,
                &result.to_string(),
            )
            .await
            .expect("complete");
        task
    }

    async fn events(&self, run: Uuid) -> Vec<(String, Value, DateTime<Utc>)> {
        self.store
            .list_events(run, 0, 1000)
            .await
            .expect("events")
            .into_iter()
            .map(|e| (e.kind, e.payload, e.recorded_at))
            .collect()
    }

    async fn status(&self, tenant: &str, run: Uuid) -> (String, Option<Value>) {
        let row = self
            .store
            .get_run(tenant, run)
            .await
            .expect("run")
            .expect("exists");
        (row.status, row.output)
    }

    /// The `cached` marker of each `tool_call_completed` of the run.
    async fn cached(&self, run: Uuid) -> Vec<Value> {
        self.events(run)
            .await
            .into_iter()
            .filter(|(kind, _, _)| kind == "tool_call_completed")
            .map(|(_, p, _)| p.get("cached").cloned().unwrap_or(Value::Null))
            .collect()
    }
}

async fn a_second_run_is_served_from_the_cache_until_the_entry_expires(backend: Backend) {
    let env = Env::new(backend).await;
    let first = env.start("rate", "USD").await;
    env.serve(json!({"rate": 1.5})).await;
    assert_eq!(env.status(TENANT, first).await.0, "completed");
    assert_eq!(env.cached(first).await, vec![Value::Null]);
    let entries = env.store.tool_cache_entries(TENANT).await.expect("entries");
    assert_eq!(entries.len(), 1, "{entries:?}");
    let entry = &entries[0];
    assert_eq!(
        (entry.tool.as_str(), entry.run_id, entry.call_id.as_str()),
        ("rate", first, "fx.t1")
    );
    assert_eq!(entry.result, json!({"rate": 1.5}));
    assert_eq!(
        (entry.expires_at - entry.stored_at).num_milliseconds(),
        TTL_MS
    );

    // The same call in another run: completed by the transition that
    // started it, from the cache; no task was ever made.
    let second = env.start("rate", "USD").await;
    assert_eq!(
        env.status(TENANT, second).await,
        ("completed".into(), Some(json!({"rate": 1.5})))
    );
    assert!(env.claim().await.is_empty());
    let kinds: Vec<String> = env.events(second).await.into_iter().map(|e| e.0).collect();
    assert!(
        !kinds.iter().any(|k| k == "tool_call_dispatched"),
        "{kinds:?}"
    );
    // The whole run is its start's transition, where the fleet of a new
    // database reads every form: the tool node starts with its call's
    // scheduling and ends with the cached result, and the `succeed` after
    // it passes in one event.
    assert_eq!(
        kinds,
        [
            "run_started",
            "tool_call_scheduled",
            "tool_call_completed",
            "node_passed",
            "run_completed"
        ],
        "{kinds:?}"
    );
    let cached = env.cached(second).await;
    assert_eq!(cached.len(), 1);
    assert_eq!(cached[0]["key"], json!(entry.cache_key));
    assert_eq!(cached[0]["stored_by_run"], json!(first.to_string()));
    assert_eq!(cached[0]["stored_by_call"], json!("fx.t1"));
    // The audit shows the hit, with the caller and tenant of its run.
    let calls = env
        .store
        .list_tool_calls(&ToolCallQuery {
            tenant: TENANT,
            run_id: Some(second),
            limit: 10,
            ..ToolCallQuery::default()
        })
        .await
        .expect("audit");
    assert_eq!(calls.len(), 1);
    assert_eq!(
        (calls[0].caller.as_str(), calls[0].tenant.as_str()),
        ("app", TENANT)
    );
    assert_eq!(
        calls[0].cached.as_ref().map(|c| c.stored_by_run.clone()),
        Some(first.to_string())
    );

    // Other arguments, or another tenant: a call of their own.
    let other_args = env.start("rate", "GBP").await;
    env.serve(json!({"rate": 1.2})).await;
    assert_eq!(env.status(TENANT, other_args).await.0, "completed");
    let other_tenant = env.start_for(OTHER, "rate", json!({"from": "USD"})).await;
    env.serve(json!({"rate": 1.6})).await;
    assert_eq!(
        env.status(OTHER, other_tenant).await,
        ("completed".into(), Some(json!({"rate": 1.6})))
    );
    assert_eq!(
        env.store
            .tool_cache_entries(OTHER)
            .await
            .expect("entries")
            .len(),
        1
    );

    // Past the TTL by the engine's clock: called again, and the expired
    // entry is purged (the new result replaces it).
    env.store.advance_clock(TTL_MS + 1).await.expect("clock");
    assert_eq!(
        env.store
            .purge_expired_tool_cache(100)
            .await
            .expect("purge"),
        3
    );
    assert!(
        env.store
            .tool_cache_entries(TENANT)
            .await
            .expect("entries")
            .is_empty()
    );
    let later = env.start("rate", "USD").await;
    env.serve(json!({"rate": 1.7})).await;
    assert_eq!(
        env.status(TENANT, later).await,
        ("completed".into(), Some(json!({"rate": 1.7})))
    );
    let entries = env.store.tool_cache_entries(TENANT).await.expect("entries");
    assert_eq!(entries.len(), 1);
    assert_eq!(
        (entries[0].run_id, entries[0].result.clone()),
        (later, json!({"rate": 1.7}))
    );
    assert_eq!(
        env.store
            .purge_expired_tool_cache(100)
            .await
            .expect("purge"),
        0
    );
    env.finish().await;
}

async fn a_hit_can_start_the_next_cached_call_in_the_same_transition(backend: Backend) {
    let env = Env::new(backend).await;
    let first = env.start("twice", "USD").await;
    env.serve(json!({"rate": 1.5})).await;
    env.serve(json!({"rate": 1.0})).await;
    assert_eq!(env.status(TENANT, first).await.0, "completed");
    // Both calls hit: the run ends in the transition that started it.
    let second = env.start("twice", "USD").await;
    assert_eq!(
        env.status(TENANT, second).await,
        ("completed".into(), Some(json!({"rate": 1.0})))
    );
    assert!(env.claim().await.is_empty());
    let cached = env.cached(second).await;
    assert_eq!(cached.len(), 2);
    assert!(
        cached
            .iter()
            .all(|c| c["stored_by_run"] == json!(first.to_string()))
    );
    let seqs: Vec<i64> = env
        .store
        .list_events(second, 0, 100)
        .await
        .expect("events")
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(seqs, (1..=seqs.len() as i64).collect::<Vec<_>>());
    env.finish().await;
}

async fn a_loop_over_a_cached_call_stops_hitting_after_the_bound_of_one_transition(
    backend: Backend,
) {
    let env = Env::new(backend).await;
    let run = env.start("poll", "USD").await;
    // The first result is stored by the transition that records it, which
    // also launches the second visit's call: that lookup does not see the
    // entry yet, so the call is a task.
    env.serve(json!({"rate": 1.5})).await;
    assert_eq!(env.cached(run).await, vec![Value::Null]);
    // The next visits hit, until the bound: then the call is a task again
    // (the loop cannot turn inside one transaction).
    env.serve(json!({"rate": 1.5})).await;
    let cached = env.cached(run).await;
    let hits = cached.iter().filter(|c| !c.is_null()).count();
    assert_eq!(
        (cached.len(), hits),
        (
            2 + MAX_CACHE_HITS_PER_TRANSITION,
            MAX_CACHE_HITS_PER_TRANSITION
        )
    );
    let tasks = env.claim().await;
    assert_eq!(tasks.len(), 1);
    assert_eq!(env.status(TENANT, run).await.0, "running");
    env.coord
        .cancel_run(TENANT, &run.to_string(), "enough")
        .await
        .expect("cancel");
    env.finish().await;
}

async fn a_failure_is_not_cached_and_an_uncached_tool_always_runs(backend: Backend) {
    let env = Env::new(backend).await;
    let failed = env.start("rate", "USD").await;
    let mut tasks = env.claim().await;
    let task = tasks.remove(0);
    env.coord
        .dispatch("w", &task.task_id.to_string(), task.attempt as u32)
        .await
        .expect("dispatch");
    env.coord
        .fail(
            "w",
            &task.task_id.to_string(),
            task.attempt as u32,
            "tool endpoint answered GET with HTTP 400",
            FailureClass::Rejected,
            Some(400),
        )
        .await
        .expect("fail");
    assert_eq!(env.status(TENANT, failed).await.0, "failed");
    assert!(
        env.store
            .tool_cache_entries(TENANT)
            .await
            .expect("entries")
            .is_empty()
    );
    // So the next run calls the tool.
    let next = env.start("rate", "USD").await;
    env.serve(json!({"rate": 1.5})).await;
    assert_eq!(env.cached(next).await, vec![Value::Null]);

    // A tool without `cacheable: true` runs every time and stores nothing.
    for _ in 0..2 {
        let run = env.start("plain", "USD").await;
        env.serve(json!({"rate": 1.5})).await;
        assert_eq!(env.cached(run).await, vec![Value::Null]);
    }
    assert_eq!(
        env.store
            .tool_cache_entries(TENANT)
            .await
            .expect("entries")
            .len(),
        1
    );
    env.finish().await;
}

async fn a_runtime_time_is_the_engines_clock_when_the_call_is_proposed(backend: Backend) {
    let env = Env::new(backend).await;
    let arguments = |events: &[(String, Value, DateTime<Utc>)]| -> Vec<(Value, DateTime<Utc>)> {
        events
            .iter()
            .filter(|(kind, _, _)| kind == "tool_call_scheduled")
            .map(|(_, p, at)| (p["arguments"].clone(), *at))
            .collect()
    };
    // The first node's call is proposed when the run starts; the second's
    // in the transition of the first's result, a day later by the clock.
    let run = env.start_for(TENANT, "stamped", json!({})).await;
    env.store.advance_clock(86_400_000).await.expect("clock");
    env.serve(json!({})).await;
    env.serve(json!({})).await;
    assert_eq!(env.status(TENANT, run).await.0, "completed");
    let scheduled = arguments(&env.events(run).await);
    assert_eq!(scheduled.len(), 2);
    for (args, recorded_at) in &scheduled {
        let at: DateTime<Utc> = args["at"].as_str().expect("at").parse().expect("RFC 3339");
        // The time the proposal was recorded at (same clock, same
        // transition; PostgreSQL's `now()` is the transaction's start).
        assert!(
            (at - *recorded_at).num_milliseconds().abs() < 1_000,
            "{at} vs {recorded_at}"
        );
        assert_eq!(args["day"], json!(at.format("%Y-%m-%d").to_string()));
    }
    let first: DateTime<Utc> = scheduled[0].0["at"]
        .as_str()
        .unwrap_or_default()
        .parse()
        .expect("at");
    let second: DateTime<Utc> = scheduled[1].0["at"]
        .as_str()
        .unwrap_or_default()
        .parse()
        .expect("at");
    assert!(
        (second - first).num_milliseconds() >= 86_400_000,
        "{first} then {second}"
    );
    // The task carries exactly the recorded arguments.
    let state = env.store.run_state(run).await.expect("state");
    assert_eq!(state.tool_calls["second.t1"].arguments, scheduled[1].0);
    env.finish().await;
}

on_both_backends!(
    a_second_run_is_served_from_the_cache_until_the_entry_expires,
    a_hit_can_start_the_next_cached_call_in_the_same_transition,
    a_loop_over_a_cached_call_stops_hitting_after_the_bound_of_one_transition,
    a_failure_is_not_cached_and_an_uncached_tool_always_runs,
    a_runtime_time_is_the_engines_clock_when_the_call_is_proposed,
);
