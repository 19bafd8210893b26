//! Tool gates on both backends: a tool's `rate_limit:` and
//! `circuit_breaker:` are kept in the database (`tool_gates`), so they hold
//! across workers and engine replicas. Driven through the coordinator
//! (claim, dispatch, complete, fail) as workers do; time is the engine's
//! clock, moved with `Store::advance_clock`, never slept.

mod common;
use common::{Backend, TestDb};

use std::sync::Arc;

use belay_engine::coordinator::{Coordinator, CoordinatorError, StartRun};
use belay_engine::gates::{Circuit, GateRow};
use belay_engine::machine::FailureClass;
use belay_engine::store::{ClaimedTask, Store};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use uuid::Uuid;

const TENANT: &str = "t";

const TOOLS: &str = r#"TOOLS:
  limited(n: number) -> object
    type: http
    endpoint: "/limited"
    rate_limit: 2
    permission: p.use
    repeat_safety: idempotent

  fragile(n: number) -> object
    type: http
    endpoint: "/fragile"
    circuit_breaker: {threshold: 2, resetMs: 10000}
    permission: p.use
    repeat_safety: never

  plain(n: number) -> object
    type: http
    endpoint: "/plain"
    permission: p.use
    repeat_safety: idempotent
"#;

const FLOWS: &str = r#"kind: workflow
name: limited
nodes:
  - {id: call, type: tool, tool: limited, args: {n: "${ .input.n }"}, grants: [p.use]}
---
kind: workflow
name: fragile
nodes:
  - {id: call, type: tool, tool: fragile, args: {n: "${ .input.n }"}, grants: [p.use], on_error: failed, next: done}
  - {id: done, type: succeed}
  - {id: failed, type: fail, error: "${ .nodes.call.output.error }"}
---
kind: workflow
name: plain
nodes:
  - {id: call, type: tool, tool: plain, args: {n: "${ .input.n }"}, grants: [p.use]}
"#;

struct Env {
    db: TestDb,
    store: Store,
    coord: Arc<Coordinator>,
}

impl Env {
    async fn new(backend: Backend) -> Env {
        let db = TestDb::create(backend, "belay_gates").await;
        let store = db.store(8).await;
        let coord = common::coordinator(store.clone(), &[TENANT], TOOLS, FLOWS, &["p.use"]).await;
        Env { db, store, coord }
    }

    async fn finish(self) {
        self.store.close().await;
        self.db.drop().await;
    }

    async fn start(&self, workflow: &str, n: u32) -> Uuid {
        let (run, _) = self
            .coord
            .start_run(StartRun {
                tenant: TENANT.into(),
                workflow: workflow.into(),
                input_json: json!({"n": n}).to_string(),
                idempotency_key: format!("{workflow}-{n}"),
                caller: "app".into(),
                caller_grants: vec!["p.use".into()],
            })
            .await
            .expect("start");
        run.run_id
    }

    /// Every ready task, claimed by `worker`.
    async fn claim(&self, worker: &str) -> Vec<ClaimedTask> {
        self.coord.claim(worker, 64, 0).await.expect("claim")
    }

    async fn claim_one(&self, worker: &str) -> ClaimedTask {
        let mut tasks = self.claim(worker).await;
        assert_eq!(tasks.len(), 1, "one ready task");
        tasks.remove(0)
    }

    async fn dispatch(&self, worker: &str, task: &ClaimedTask) -> Result<(), String> {
        match self
            .coord
            .dispatch(worker, &task.task_id.to_string(), task.attempt as u32)
            .await
        {
            Ok(_) => Ok(()),
            Err(CoordinatorError::FailedPrecondition(m)) => Err(m),
            Err(e) => panic!("dispatch: {e}"),
        }
    }

    async fn complete(&self, worker: &str, task: &ClaimedTask) {
        self.coord
            .complete(worker, &task.task_id.to_string(), task.attempt as u32, "{}")
            .await
            .expect("complete");
    }

    async fn fail_500(&self, worker: &str, task: &ClaimedTask) {
        self.coord
            .fail(
                worker,
                &task.task_id.to_string(),
                task.attempt as u32,
                "tool endpoint answered POST with HTTP 500",
                FailureClass::MayHaveActed,
                Some(500),
            )
            .await
            .expect("fail");
    }

    async fn gate(&self, tool: &str) -> GateRow {
        self.store
            .tool_gate(TENANT, tool)
            .await
            .expect("gate")
            .unwrap_or_default()
    }

    /// The run's events `(kind, payload, recorded_at)`.
    async fn events(&self, run: Uuid) -> Vec<(String, Value, DateTime<Utc>)> {
        self.store
            .list_events(run, 0, 1000)
            .await
            .expect("events")
            .into_iter()
            .map(|e| (e.kind, e.payload, e.recorded_at))
            .collect()
    }

    async fn kinds(&self, run: Uuid) -> Vec<String> {
        self.events(run).await.into_iter().map(|e| e.0).collect()
    }

    async fn run_status(&self, run: Uuid) -> (String, String) {
        let row = self
            .store
            .get_run(TENANT, run)
            .await
            .expect("run")
            .expect("exists");
        (row.status, row.status_reason)
    }

    async fn now_ms(&self) -> i64 {
        self.store
            .clock_now()
            .await
            .expect("clock")
            .timestamp_millis()
    }
}

fn ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

async fn a_rate_limit_defers_calls_to_their_turns_across_workers(backend: Backend) {
    let env = Env::new(backend).await;
    let runs = [
        env.start("limited", 1).await,
        env.start("limited", 2).await,
        env.start("limited", 3).await,
    ];
    // Two workers hold the three calls.
    let mut tasks = env.coord.claim("w1", 2, 0).await.expect("claim");
    tasks.extend(env.claim("w2").await);
    assert_eq!(tasks.len(), 3);
    tasks.sort_by_key(|t| runs.iter().position(|r| *r == t.run_id));
    let workers = ["w1", "w1", "w2"];
    let before = env.now_ms().await;
    env.dispatch(workers[0], &tasks[0])
        .await
        .expect("the first call goes");
    let second = env
        .dispatch(workers[1], &tasks[1])
        .await
        .expect_err("held back");
    let third = env
        .dispatch(workers[2], &tasks[2])
        .await
        .expect_err("held back");
    for refusal in [&second, &third] {
        assert!(
            refusal.starts_with("dispatch deferred: tool `limited` is at its rate limit (2 per second); the call waits for its turn at "),
            "{refusal}"
        );
    }
    // Turns one interval apart: the second at the first's next token, the
    // third one interval later.
    let row = env.gate("limited").await;
    assert!(
        (before..=before + 1000).contains(&(row.next_at_ms - 500)),
        "{row:?}"
    );
    assert_eq!(row.queue_at_ms, row.next_at_ms + 1000);
    let deferral = |events: &[(String, Value, DateTime<Utc>)]| {
        events
            .iter()
            .find(|e| e.0 == "tool_call_deferred")
            .map(|e| e.1.clone())
            .expect("a deferral")
    };
    let turn = |d: &Value| {
        DateTime::parse_from_rfc3339(d["until"].as_str().expect("until"))
            .expect("rfc3339")
            .timestamp_millis()
    };
    let d2 = deferral(&env.events(runs[1]).await);
    let d3 = deferral(&env.events(runs[2]).await);
    assert_eq!(
        (turn(&d2), turn(&d3), d3["worker_id"].as_str()),
        (row.next_at_ms, row.next_at_ms + 500, Some("w2"))
    );
    // A deferral is no attempt: nothing failed, and the tasks wait.
    for run in &runs[1..] {
        let kinds = env.kinds(*run).await;
        assert!(!kinds.iter().any(|k| k.contains("failed")), "{kinds:?}");
    }
    assert!(env.claim("w1").await.is_empty(), "nothing is ready yet");

    // Each call goes at its turn, by the engine's clock.
    env.complete(workers[0], &tasks[0]).await;
    env.store.advance_clock(500).await.expect("advance");
    let t2 = env.claim_one("w2").await;
    assert_eq!((t2.run_id, t2.attempt), (runs[1], 2));
    env.dispatch("w2", &t2).await.expect("its turn");
    env.complete("w2", &t2).await;
    assert!(env.claim("w1").await.is_empty(), "the third waits");
    env.store.advance_clock(500).await.expect("advance");
    let t3 = env.claim_one("w1").await;
    env.dispatch("w1", &t3).await.expect("its turn");
    env.complete("w1", &t3).await;

    let mut dispatched = Vec::new();
    for run in runs {
        assert_eq!(env.run_status(run).await.0, "completed");
        let events = env.events(run).await;
        let at: Vec<i64> = events
            .iter()
            .filter(|e| e.0 == "tool_call_dispatched")
            .map(|e| ms(e.2))
            .collect();
        assert_eq!(at.len(), 1, "one dispatch per call");
        dispatched.extend(at);
    }
    dispatched.sort();
    for pair in dispatched.windows(2) {
        assert!(pair[1] - pair[0] >= 500, "{dispatched:?}");
    }
    // A tool without gates has no row (its calls cost no statement here).
    let run = env.start("plain", 1).await;
    let task = env.claim_one("w1").await;
    assert_eq!(task.run_id, run);
    env.dispatch("w1", &task).await.expect("plain");
    env.complete("w1", &task).await;
    assert_eq!(
        env.store.tool_gate(TENANT, "plain").await.expect("gate"),
        None
    );
    env.finish().await;
}

async fn concurrent_dispatches_take_one_turn_each(backend: Backend) {
    let env = Env::new(backend).await;
    for n in 0..8 {
        env.start("limited", n).await;
    }
    let tasks = env.claim("w1").await;
    assert_eq!(tasks.len(), 8);
    let results = futures_util::future::join_all(tasks.iter().map(|t| env.dispatch("w1", t))).await;
    let went = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(went, 1, "{results:?}");
    let mut turns: Vec<String> = results
        .iter()
        .filter_map(|r| r.as_ref().err())
        .map(|m| m.rsplit(' ').next().unwrap_or_default().to_owned())
        .collect();
    turns.sort();
    turns.dedup();
    assert_eq!(
        turns.len(),
        7,
        "every deferred call has a turn of its own: {turns:?}"
    );
    env.finish().await;
}

async fn a_circuit_opens_fails_fast_and_a_probe_closes_it(backend: Backend) {
    let env = Env::new(backend).await;
    // Two consecutive 500s open it.
    for n in 1..=2 {
        let run = env.start("fragile", n).await;
        let task = env.claim_one("w1").await;
        env.dispatch("w1", &task).await.expect("closed: it goes");
        env.fail_500("w1", &task).await;
        assert_eq!(env.run_status(run).await.0, "failed");
    }
    let opened = env.now_ms().await;
    let row = env.gate("fragile").await;
    assert_eq!((row.circuit, row.failures), (Circuit::Open, 2));
    assert!(
        (opened - 1000..=opened).contains(&(row.retry_at_ms - 10_000)),
        "{row:?}"
    );

    // Open: the call fails without being sent; the node's `on_error` runs.
    let run = env.start("fragile", 3).await;
    let task = env.claim_one("w1").await;
    let refused = env.dispatch("w1", &task).await.expect_err("held back");
    assert!(
        refused.starts_with(
            "dispatch refused: the circuit breaker of tool `fragile` is open after 2 consecutive failures: calls fail without being sent until "
        ),
        "{refused}"
    );
    let (status, reason) = env.run_status(run).await;
    assert_eq!(status, "failed");
    assert!(
        reason.contains("circuit breaker of tool `fragile` is open"),
        "{reason}"
    );
    let kinds = env.kinds(run).await;
    assert!(
        !kinds.contains(&"tool_call_dispatched".to_owned()),
        "{kinds:?}"
    );
    assert_eq!(
        env.gate("fragile").await,
        row,
        "failing fast changes nothing"
    );

    // After resetMs one probe goes; the others still fail fast. The probe
    // fails: open again.
    env.store.advance_clock(10_000).await.expect("advance");
    env.start("fragile", 4).await;
    env.start("fragile", 5).await;
    let tasks = env.claim("w1").await;
    assert_eq!(tasks.len(), 2);
    env.dispatch("w1", &tasks[0]).await.expect("the probe goes");
    assert_eq!(env.gate("fragile").await.circuit, Circuit::HalfOpen);
    let refused = env.dispatch("w1", &tasks[1]).await.expect_err("held back");
    assert!(
        refused.contains("is half-open: one probe call is under way"),
        "{refused}"
    );
    env.fail_500("w1", &tasks[0]).await;
    let row = env.gate("fragile").await;
    assert_eq!((row.circuit, row.failures), (Circuit::Open, 3));

    // Another resetMs: the probe succeeds and the circuit closes.
    env.store.advance_clock(10_000).await.expect("advance");
    let probe_run = env.start("fragile", 6).await;
    let probe = env.claim_one("w1").await;
    env.dispatch("w1", &probe).await.expect("the probe goes");
    env.complete("w1", &probe).await;
    assert_eq!(env.run_status(probe_run).await.0, "completed");
    let row = env.gate("fragile").await;
    assert_eq!((row.circuit, row.failures), (Circuit::Closed, 0));
    let run = env.start("fragile", 7).await;
    let task = env.claim_one("w1").await;
    env.dispatch("w1", &task).await.expect("closed again");
    env.complete("w1", &task).await;
    assert_eq!(env.run_status(run).await.0, "completed");
    env.finish().await;
}

async fn a_definite_refusal_neither_opens_nor_closes_the_circuit(backend: Backend) {
    let env = Env::new(backend).await;
    let run = env.start("fragile", 1).await;
    let task = env.claim_one("w1").await;
    env.dispatch("w1", &task).await.expect("goes");
    env.fail_500("w1", &task).await;
    assert_eq!(env.gate("fragile").await.failures, 1);
    env.start("fragile", 2).await;
    let task = env.claim_one("w1").await;
    env.dispatch("w1", &task).await.expect("goes");
    env.coord
        .fail(
            "w1",
            &task.task_id.to_string(),
            task.attempt as u32,
            "HTTP 400",
            FailureClass::Rejected,
            Some(400),
        )
        .await
        .expect("fail");
    assert_eq!(env.gate("fragile").await.failures, 1);
    assert_eq!(env.run_status(run).await.0, "failed");
    env.finish().await;
}

on_both_backends!(
    a_rate_limit_defers_calls_to_their_turns_across_workers,
    concurrent_dispatches_take_one_turn_each,
    a_circuit_opens_fails_fast_and_a_probe_closes_it,
    a_definite_refusal_neither_opens_nor_closes_the_circuit,
);
