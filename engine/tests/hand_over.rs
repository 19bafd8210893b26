//! The next step handed over in the report's own transition (issue 23), on
//! both backends, through the coordinator: a completion that asks for the
//! next task (`next`) gets the run's next `idempotent` HTTP step leased
//! to its worker at attempt 1 and dispatched, written by the same
//! transition (its `tool_call_dispatched` right after the completion's
//! events, no claim between), and leased so that no other worker can
//! claim it; a handed lease that expires is judged as any (the call
//! retried at attempt 2 with its key); a model call is handed leased, not
//! dispatched; a `never`
//! step, a step the worker's capabilities do not cover, another tenant's
//! step, and a step whose grant was withdrawn are handed nothing and stay
//! ready for a claim (the last one refused when its worker asks for its
//! dispatch, as before).

mod common;
use common::{Backend, TestDb};

use std::sync::Arc;

use belay_engine::coordinator::{Coordinator, McpReport, StartRun};
use belay_engine::store::{ClaimFilter, ClaimedTask};
use belay_proto::wire::{ModelCallResult, ToolUse, Usage};

const TOOLS: &str = r#"TOOLS:
  noop(i: number) -> {ok: boolean}
    description: "does nothing"
    type: http
    endpoint: "/noop"
    permission: t.noop
    repeat_safety: idempotent
  once(i: number) -> {ok: boolean}
    description: "acts once"
    type: http
    endpoint: "/once"
    permission: t.noop
    repeat_safety: never
"#;

const WORKFLOWS: &str = r#"kind: workflow
name: two
nodes:
  - id: first
    type: tool
    tool: noop
    args: {i: 1}
    grants: [t.noop]
    next: second
  - id: second
    type: tool
    tool: noop
    args: {i: 2}
    grants: [t.noop]
    next: done
  - id: done
    type: succeed
    output: "${ .nodes.second.output }"
---
kind: workflow
name: then_once
nodes:
  - id: first
    type: tool
    tool: noop
    args: {i: 1}
    grants: [t.noop]
    next: second
  - id: second
    type: tool
    tool: once
    args: {i: 2}
    grants: [t.noop]
    next: done
  - id: done
    type: succeed
    output: "${ .nodes.second.output }"
---
kind: agent
name: a
model: m
instructions: i
tools: [noop]
grants: [t.noop]
---
kind: workflow
name: agent
nodes:
  - id: n
    type: agent
    agent: a
"#;

struct Fixture {
    db: TestDb,
    coord: Arc<Coordinator>,
}

impl Fixture {
    async fn start(backend: Backend) -> Fixture {
        let db = TestDb::create(backend, "belay_hand_over").await;
        let coord =
            common::coordinator(db.store(4).await, &["a"], TOOLS, WORKFLOWS, &["t.noop"]).await;
        Fixture { db, coord }
    }

    async fn run(&self, workflow: &str) -> uuid::Uuid {
        let (run, _) = self
            .coord
            .start_run(StartRun {
                tenant: "a".into(),
                workflow: workflow.into(),
                input_json: "{}".into(),
                idempotency_key: format!("run-{workflow}"),
                caller: "c".into(),
                caller_grants: vec!["t.noop".into()],
            })
            .await
            .expect("start");
        run.run_id
    }

    async fn claim(&self, worker: &str) -> Vec<ClaimedTask> {
        self.coord.claim(worker, 8, 0).await.expect("claim")
    }

    /// The one ready task, claimed and dispatched for `worker`.
    async fn claim_dispatched(&self, worker: &str) -> ClaimedTask {
        let task = self.claim(worker).await.remove(0);
        self.coord
            .dispatch(worker, &task.task_id.to_string(), task.attempt as u32)
            .await
            .expect("dispatch");
        task
    }

    /// Completes `task` for `worker` with `result`, asking for the next
    /// task through `next`; returns what was handed over.
    async fn complete(
        &self,
        worker: &str,
        task: &ClaimedTask,
        result: &str,
        next: ClaimFilter<'_>,
    ) -> Vec<ClaimedTask> {
        self.coord
            .complete_sampled(
                worker,
                &task.task_id.to_string(),
                task.attempt as u32,
                result,
                Vec::new(),
                None,
                McpReport::default(),
                Some(next),
            )
            .await
            .expect("complete")
            .map(|c| c.tasks)
            .unwrap_or_default()
    }

    /// Run `run`'s events as `(seq, kind, call_id)`.
    async fn events(&self, run: uuid::Uuid) -> Vec<(i64, String, String)> {
        self.coord
            .store()
            .list_events(run, 0, 1_000)
            .await
            .expect("events")
            .into_iter()
            .map(|e| {
                let call = e.payload["call_id"].as_str().unwrap_or_default().to_owned();
                (e.seq, e.kind, call)
            })
            .collect()
    }

    /// How many `tool_call_dispatched` events run `run` has.
    async fn dispatches(&self, run: uuid::Uuid) -> usize {
        let events = self.events(run).await;
        events
            .iter()
            .filter(|e| e.1 == "tool_call_dispatched")
            .count()
    }

    async fn stop(self) {
        self.db.drop().await;
    }
}

const OK: &str = r#"{"ok":true}"#;

/// The claim a worker older than worker pools makes: any task.
fn any() -> ClaimFilter<'static> {
    ClaimFilter::default()
}

async fn the_next_idempotent_step_is_leased_and_dispatched_in_the_reports_transition(
    backend: Backend,
) {
    let f = Fixture::start(backend).await;
    let run = f.run("two").await;
    let first = f.claim_dispatched("w1").await;
    let handed = f.complete("w1", &first, OK, any()).await;
    assert_eq!(handed.len(), 1, "{handed:?}");
    let second = &handed[0];
    assert_eq!((second.run_id, second.attempt), (run, 1));
    assert!(second.dispatched);
    assert!(
        second.spec["dispatch_with_claim"] == true,
        "{}",
        second.spec
    );
    assert_ne!(second.task_id, first.task_id);
    assert!(f.claim("w2").await.is_empty(), "leased to w1");
    // The completion's events and the next call's dispatch are one
    // transition's: the dispatch follows the completion's events at once.
    let events = f.events(run).await;
    let completed = events
        .iter()
        .position(|(_, k, c)| k == "tool_call_completed" && c == "first.t1")
        .expect("first completed");
    let dispatched: Vec<_> = events
        .iter()
        .filter(|(_, k, _)| k == "tool_call_dispatched")
        .collect();
    assert_eq!(dispatched.len(), 2, "{events:?}");
    let scheduled_then_dispatched = events[completed..]
        .windows(2)
        .any(|w| w[1].1 == "tool_call_dispatched" && w[1].2 == dispatched[1].2 && w[0].2 == w[1].2);
    assert!(scheduled_then_dispatched, "{events:?}");
    if backend == Backend::Postgres {
        // Every event of one transition carries its clock: the next call's
        // dispatch was recorded by the completion's transaction, not by a
        // claim after it.
        let rows = f
            .coord
            .store()
            .list_events(run, 0, 1_000)
            .await
            .expect("events");
        let at = |kind: &str, call: &str| {
            rows.iter()
                .find(|e| e.kind == kind && e.payload["call_id"] == call)
                .map(|e| e.recorded_at)
                .expect("event")
        };
        assert_eq!(
            at("tool_call_completed", "first.t1"),
            at("tool_call_dispatched", &dispatched[1].2)
        );
        assert_ne!(
            at("tool_call_dispatched", "first.t1"),
            at("tool_call_completed", "first.t1"),
            "the first call's dispatch was a transaction of its own"
        );
    }
    // The handed task's fencing token is the one a claim would give.
    let after = f.complete("w1", second, OK, any()).await;
    assert!(after.is_empty(), "the run has no step left");
    let events = f.events(run).await;
    assert_eq!(events.last().map(|e| e.1.as_str()), Some("run_completed"));
    let seqs: Vec<i64> = events.iter().map(|e| e.0).collect();
    assert_eq!(seqs, (1..=seqs.len() as i64).collect::<Vec<_>>(), "gapless");
    f.stop().await;
}

async fn only_its_worker_and_attempt_can_complete_the_handed_step(backend: Backend) {
    let f = Fixture::start(backend).await;
    f.run("two").await;
    let first = f.claim_dispatched("w1").await;
    let second = f.complete("w1", &first, OK, any()).await.remove(0);
    let id = second.task_id.to_string();
    let refused = f
        .coord
        .complete("w1", &id, 2, OK)
        .await
        .expect_err("attempt 2 does not hold the task");
    assert!(refused.to_string().contains("attempt"), "{refused}");
    let refused = f
        .coord
        .complete("w2", &id, 1, OK)
        .await
        .expect_err("w2 does not hold the task");
    assert!(
        refused.to_string().contains("leased by another worker"),
        "{refused}"
    );
    f.coord
        .complete("w1", &id, 1, OK)
        .await
        .expect("its holder completes it");
    f.stop().await;
}

async fn a_handed_lease_that_expires_is_judged_and_the_call_retried_with_its_key(backend: Backend) {
    let f = Fixture::start(backend).await;
    let run = f.run("two").await;
    let first = f.claim_dispatched("w1").await;
    // The worker never learns of the handed task (its reply was lost).
    let lost = f.complete("w1", &first, OK, any()).await.remove(0);
    f.coord
        .store()
        .expire_task_timers(Some(lost.task_id))
        .await
        .expect("expire");
    assert_eq!(f.coord.sweep_expired_leases().await.expect("sweep"), 1);
    let events = f.events(run).await;
    assert_eq!(
        events.last().map(|e| (e.1.as_str(), e.2.as_str())),
        Some(("task_lease_expired", "second.t1")),
        "{events:?}"
    );
    // Its retry delay, waited out.
    f.coord
        .store()
        .expire_task_timers(Some(lost.task_id))
        .await
        .expect("ready now");
    let again = f.claim("w2").await.remove(0);
    assert_eq!((again.task_id, again.attempt), (lost.task_id, 2));
    assert_eq!(again.idempotency_key, lost.idempotency_key);
    assert!(f.complete("w2", &again, OK, any()).await.is_empty());
    let events = f.events(run).await;
    assert_eq!(events.last().map(|e| e.1.as_str()), Some("run_completed"));
    f.stop().await;
}

async fn a_model_call_is_handed_leased_not_dispatched(backend: Backend) {
    let f = Fixture::start(backend).await;
    let run = f.run("agent").await;
    let model = f.claim("w1").await.remove(0);
    let answer = ModelCallResult {
        content: None,
        tool_calls: vec![ToolUse {
            id: "tu".into(),
            name: "noop".into(),
            arguments: r#"{"i":1}"#.into(),
        }],
        usage: Usage::default(),
        finish_reason: None,
    };
    let answer = serde_json::to_string(&answer).expect("json");
    let tool = f.complete("w1", &model, &answer, any()).await.remove(0);
    assert_eq!(tool.kind, "tool_call");
    assert!(
        tool.dispatched,
        "an idempotent HTTP call proposed by the model"
    );
    let next_model = f.complete("w1", &tool, OK, any()).await;
    assert_eq!(next_model.len(), 1, "the model's next turn");
    assert_eq!(next_model[0].kind, "model_call");
    assert!(!next_model[0].dispatched, "a model call has no dispatch");
    assert_eq!(next_model[0].attempt, 1);
    assert!(f.claim("w2").await.is_empty(), "leased to w1");
    assert_eq!(f.dispatches(run).await, 1);
    f.stop().await;
}

async fn a_never_step_is_left_for_a_claim_that_dispatches_it_when_asked(backend: Backend) {
    let f = Fixture::start(backend).await;
    let run = f.run("then_once").await;
    let first = f.claim_dispatched("w1").await;
    assert!(f.complete("w1", &first, OK, any()).await.is_empty());
    let once = f.claim("w2").await;
    assert_eq!(once.len(), 1, "ready for any claim");
    assert_eq!(f.dispatches(run).await, 1, "only the first step's");
    f.stop().await;
}

async fn a_step_the_worker_may_not_take_is_left_ready(backend: Backend) {
    let f = Fixture::start(backend).await;
    f.run("two").await;
    let first = f.claim_dispatched("w1").await;
    // A worker that serves no HTTP tool (it named capabilities without
    // `http_base_url`).
    let none: Vec<String> = Vec::new();
    let no_http = ClaimFilter {
        tenants: None,
        capabilities: Some(&none),
    };
    assert!(f.complete("w1", &first, OK, no_http).await.is_empty());
    let second = f.claim("w2").await;
    assert_eq!(second.len(), 1, "ready for a worker that can take it");
    assert_eq!(second[0].attempt, 1);
    f.stop().await;
}

async fn another_tenants_step_is_left_ready(backend: Backend) {
    let f = Fixture::start(backend).await;
    f.run("two").await;
    let first = f.claim_dispatched("w1").await;
    let b = vec!["b".to_owned()];
    let tenant_b = ClaimFilter {
        tenants: Some(&b),
        capabilities: None,
    };
    assert!(f.complete("w1", &first, OK, tenant_b).await.is_empty());
    assert_eq!(f.claim("w2").await.len(), 1);
    f.stop().await;
}

async fn a_step_whose_grant_was_withdrawn_is_refused_at_its_dispatch(backend: Backend) {
    let f = Fixture::start(backend).await;
    let run = f.run("two").await;
    let first = f.claim_dispatched("w1").await;
    f.coord
        .store()
        .set_tenant_grants("a", &[])
        .await
        .expect("withdraw");
    assert!(f.complete("w1", &first, OK, any()).await.is_empty());
    let second = f.claim("w2").await;
    assert_eq!(second.len(), 1);
    let refused = f
        .coord
        .dispatch("w2", &second[0].task_id.to_string(), 1)
        .await
        .expect_err("the grant is withdrawn");
    assert!(
        refused.to_string().contains("no longer granted"),
        "{refused}"
    );
    assert_eq!(f.dispatches(run).await, 1);
    f.stop().await;
}

on_both_backends!(
    the_next_idempotent_step_is_leased_and_dispatched_in_the_reports_transition,
    only_its_worker_and_attempt_can_complete_the_handed_step,
    a_model_call_is_handed_leased_not_dispatched,
    a_handed_lease_that_expires_is_judged_and_the_call_retried_with_its_key,
    a_never_step_is_left_for_a_claim_that_dispatches_it_when_asked,
    a_step_the_worker_may_not_take_is_left_ready,
    another_tenants_step_is_left_ready,
    a_step_whose_grant_was_withdrawn_is_refused_at_its_dispatch,
);
