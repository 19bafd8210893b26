//! Store conformance: the same store-level tests run on both backends
//! (PostgreSQL and SQLite, as `postgres::<name>` and `sqlite::<name>`), so
//! the two cannot drift apart unnoticed. They hold what `Store` promises:
//! gapless `seq` under concurrent transitions (and one transaction per
//! transition), claims that never hand one task to two workers, fencing by
//! attempt, heartbeats, expired-lease order, retry delays, idempotent run
//! creation, keyset paging of runs and uncertain outcomes with timestamp
//! ties, definition versions, tenant grants, uncertain-outcome records and
//! their occurrences, the notification outbox, JSON and timestamp round
//! trips, and a closed store.
//!
//! Runs and tasks are made through the coordinator where that is simplest
//! (a run needs a pinned plan); everything asserted is read through the
//! store. Time is moved with `Store::expire_task_timers` (or leases granted
//! already in the past), never by sleeping. Raw SQL only does what the store
//! API cannot, with the same statement on both backends: `created_at` ties
//! and statuses for paging, notification timers in the past; plus, on
//! PostgreSQL only, a non-UTC session time zone.

mod common;
use common::{Backend, TestDb};

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use belay_engine::coordinator::{Coordinator, CoordinatorError, StartRun};
use belay_engine::machine::{Command, Decision, Event, Resolution, TaskKind};
use belay_engine::store::{
    RunRow, Store, StoreError, TaskRow, TransitionError, UncertainQuery, UncertainRow, Wake,
};
use belay_proto::wire::{ModelCallResult, ToolUse, Usage};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use uuid::Uuid;

const TOOLS: &str = r#"TOOLS:
  create(email: string) -> {id: string}
    description: "create"
    type: http
    endpoint: "/create"
    permission: crm.write
    repeat_safety: reconcile

  update(id: string) -> {id: string}
    description: "update"
    type: http
    endpoint: "/update"
    permission: crm.write
    repeat_safety: reconcile
"#;
const AGENT: &str = "kind: agent\nname: a\nmodel: m\ninstructions: i\ntools: [create, update]\ngrants: [crm.write]\n---\nkind: workflow\nname: w\nnodes:\n  - id: n\n    type: agent\n    agent: a\n";

/// A fresh database with the migrations applied, a coordinator on it, the
/// definitions above registered for tenant `t`, and `t` granted `crm.write`.
struct Env {
    db: TestDb,
    store: Store,
    coord: Arc<Coordinator>,
}

impl Env {
    async fn new(backend: Backend) -> Env {
        Env::on(TestDb::create(backend, "belay_s").await).await
    }

    async fn on(db: TestDb) -> Env {
        let store = db.store(8).await;
        let coord = common::coordinator(store.clone(), &["t"], TOOLS, AGENT, &["crm.write"]).await;
        Env { db, store, coord }
    }

    async fn finish(self) {
        self.store.close().await;
        self.db.drop().await;
    }

    /// Start a run of tenant `t`: its first model call is ready.
    async fn start(&self, key: &str) -> Uuid {
        let (run, created) = self
            .coord
            .start_run(StartRun {
                tenant: "t".into(),
                workflow: "w".into(),
                input_json: "{}".into(),
                idempotency_key: key.into(),
                caller: "c".into(),
                caller_grants: vec!["crm.write".into()],
            })
            .await
            .expect("start");
        assert!(created);
        run.run_id
    }

    async fn run(&self, run: Uuid) -> RunRow {
        self.store
            .get_run("t", run)
            .await
            .expect("get run")
            .expect("run exists")
    }

    /// Start a run whose model proposes `tool`, dispatch the call and lose
    /// its lease: the run pauses with an open record. Needs no other ready
    /// task. Returns (run, task, uncertain id).
    async fn uncertain(&self, key: &str, tool: &str) -> (Uuid, Uuid, Uuid) {
        let run = self.start(key).await;
        let model = self.coord.claim("w1", 1, 0).await.expect("claim").remove(0);
        assert_eq!((model.run_id, model.kind.as_str()), (run, "model_call"));
        self.coord
            .complete("w1", &model.task_id.to_string(), 1, &proposal(tool))
            .await
            .expect("complete");
        let call = self.coord.claim("w1", 1, 0).await.expect("claim").remove(0);
        assert_eq!((call.run_id, call.kind.as_str()), (run, "tool_call"));
        self.dispatch_and_lose(&call.task_id, call.attempt as u32)
            .await;
        let rows = self.store.uncertain_for_run(run).await.expect("uncertain");
        (
            run,
            call.task_id,
            rows.last().expect("a record").uncertain_id,
        )
    }

    /// Dispatch a leased tool call as `w1`, expire its lease and sweep.
    async fn dispatch_and_lose(&self, task: &Uuid, attempt: u32) {
        self.coord
            .dispatch("w1", &task.to_string(), attempt)
            .await
            .expect("dispatch");
        assert_eq!(
            self.store
                .expire_task_timers(Some(*task))
                .await
                .expect("expire"),
            1
        );
        assert_eq!(self.coord.sweep_expired_leases().await.expect("sweep"), 1);
    }
}

fn proposal(tool: &str) -> String {
    serde_json::to_string(&ModelCallResult {
        content: None,
        tool_calls: vec![ToolUse {
            id: "tu".into(),
            name: tool.into(),
            arguments: if tool == "create" {
                r#"{"email":"e@example.com"}"#.into()
            } else {
                r#"{"id":"acct-1"}"#.into()
            },
        }],
        usage: Usage::default(),
        finish_reason: None,
    })
    .expect("json")
}

/// A task row as a transition sees it (a refused transition writes nothing).
async fn task_row(store: &Store, run: Uuid, task: Uuid) -> TaskRow {
    match store
        .transition(run, Some(task), |_, row| {
            Err::<Decision, _>(Box::new(row.cloned().expect("the task row")))
        })
        .await
    {
        Err(TransitionError::Refused(row)) => *row,
        other => panic!("reading task {task}: {other:?}"),
    }
}

/// An event that changes nothing in the fold: a late result for no call.
fn marker(result: Value) -> Event {
    Event::LateResultRecorded {
        call_id: "none".into(),
        attempt: 1,
        result,
        discrepancy: None,
    }
}

fn assert_recent(t: DateTime<Utc>, what: &str) {
    let off = (Utc::now() - t).num_milliseconds().abs();
    assert!(off < 60_000, "{what} is {t}, {off} ms from now");
}

// ---- transitions --------------------------------------------------------

/// Many writers (and, on PostgreSQL, two stores with their own state
/// caches) transition one run at once: `seq` stays gapless, each
/// transition's events are contiguous, every decision saw exactly the
/// history before its events, and refusals consume no seq.
async fn seq_is_gapless_under_concurrent_transitions(backend: Backend) {
    let env = Env::new(backend).await;
    let run = env.start("k").await;
    // Half the transitions lock the run through its (leased) model call.
    let task = env
        .store
        .claim_tasks("w", 1, 60_000, None)
        .await
        .expect("claim")
        .remove(0)
        .task_id;
    let before = env.run(run).await.last_seq;
    let mut stores = vec![env.store.clone()];
    if backend == Backend::Postgres {
        stores.push(env.db.store(8).await);
    }
    const WRITERS: usize = 16;
    const STEPS: usize = 8;
    let mut handles = Vec::new();
    for w in 0..WRITERS {
        let store = stores[w % stores.len()].clone();
        handles.push(tokio::spawn(async move {
            let mut applied = Vec::new();
            for step in 0..STEPS {
                // 0..=3 events; 0 is a refusal.
                let n = (w + step) % 4;
                let decide = move |state: &belay_engine::machine::RunState, _: Option<&TaskRow>| {
                    if n == 0 {
                        return Err("refused");
                    }
                    let seen = state.last_seq;
                    Ok(Decision {
                        events: (0..n)
                            .map(|i| marker(json!({"w": w, "step": step, "i": i, "seen": seen})))
                            .collect(),
                        commands: vec![],
                    })
                };
                let result = if step % 2 == 0 {
                    store.transition(run, None, decide).await
                } else {
                    store.transition_task(task, decide).await
                };
                match result {
                    Ok(a) => {
                        assert_eq!(a.events, n);
                        applied.push((w, step, a.first_seq, n));
                    }
                    Err(TransitionError::Refused(_)) => assert_eq!(n, 0),
                    Err(e) => panic!("writer {w} step {step}: {e:?}"),
                }
            }
            applied
        }));
    }
    let mut applied = Vec::new();
    for h in handles {
        applied.extend(h.await.expect("writer"));
    }
    let written: usize = applied.iter().map(|a| a.3).sum();
    let total = before as usize + written;
    let events = env
        .store
        .list_events(run, 0, 100_000)
        .await
        .expect("events");
    let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=total as i64).collect::<Vec<_>>(), "gapless");
    let mut firsts = HashSet::new();
    for (w, step, first, n) in applied {
        assert!(
            firsts.insert(first),
            "two transitions got first_seq {first}"
        );
        for i in 0..n {
            let e = &events[first as usize - 1 + i];
            assert_eq!(
                e.payload["result"],
                json!({"w": w, "step": step, "i": i, "seen": first - 1}),
                "seq {}",
                e.seq
            );
        }
    }
    assert_eq!(env.run(run).await.last_seq, total as i64);
    for store in &stores {
        assert_eq!(
            store.run_state(run).await.expect("fold").last_seq,
            total as u64
        );
    }
    // One more transition through each store folds the tail correctly.
    for store in &stores {
        let a = store
            .transition(run, None, |state, _| {
                Ok::<_, ()>(Decision {
                    events: vec![marker(json!({"seen": state.last_seq}))],
                    commands: vec![],
                })
            })
            .await
            .expect("transition");
        let last = env
            .store
            .list_events(run, a.first_seq as i64 - 1, 1)
            .await
            .expect("events");
        assert_eq!(last[0].payload["result"]["seen"], a.first_seq - 1);
    }
    // A transition of many events (one statement on PostgreSQL, one per
    // event on SQLite), then paging through the whole history.
    let big = env
        .store
        .transition(run, None, |_, _| {
            Ok::<_, ()>(Decision {
                events: (0..500).map(|i| marker(json!(i))).collect(),
                commands: vec![],
            })
        })
        .await
        .expect("500 events");
    assert_eq!(big.events, 500);
    let mut paged = Vec::new();
    let mut after = 0;
    loop {
        let page = env.store.list_events(run, after, 77).await.expect("page");
        if page.is_empty() {
            break;
        }
        after = page.last().expect("last").seq;
        paged.extend(page.into_iter().map(|e| e.seq));
    }
    let last_seq = env.run(run).await.last_seq;
    assert_eq!(paged, (1..=last_seq).collect::<Vec<_>>());
    assert_eq!(last_seq as u64, big.first_seq + 499);
    if stores.len() > 1 {
        stores[1].close().await;
    }
    env.finish().await;
}

/// A transition whose command fails writes nothing (not even its events),
/// caches nothing, and the next transition continues the same seq.
async fn a_failed_transition_writes_nothing(backend: Backend) {
    let env = Env::new(backend).await;
    let run = env.start("k").await;
    let before = env.run(run).await;
    let events_before = env.store.list_events(run, 0, 1000).await.expect("events");
    let schedule = |call_id: &str| Command::ScheduleTask {
        call_id: call_id.into(),
        kind: TaskKind::ToolCall,
        spec: json!({}),
        idempotency_key: format!("k/{call_id}"),
        repeat_safety: None,
        runs_while_paused: false,
        requires: Vec::new(),
    };
    let (a, b) = (schedule("dup"), schedule("dup"));
    let err = env
        .store
        .transition(run, None, move |_, _| {
            Ok::<_, ()>(Decision {
                events: vec![marker(json!("lost"))],
                // The second insert breaks UNIQUE (run_id, call_id).
                commands: vec![a, b],
            })
        })
        .await
        .expect_err("duplicate call id");
    assert!(
        matches!(err, TransitionError::Store(StoreError::Database(_))),
        "{err:?}"
    );
    let after = env.run(run).await;
    assert_eq!(after.last_seq, before.last_seq);
    assert_eq!(after.updated_at, before.updated_at);
    assert_eq!(
        env.store
            .list_events(run, 0, 1000)
            .await
            .expect("events")
            .len(),
        events_before.len()
    );
    let applied = env
        .store
        .transition(run, None, |state, _| {
            Ok::<_, ()>(Decision {
                events: vec![marker(json!({"seen": state.last_seq}))],
                commands: vec![schedule("dup")],
            })
        })
        .await
        .expect("transition");
    assert_eq!(applied.first_seq, before.last_seq as u64 + 1);
    let last = env
        .store
        .list_events(run, before.last_seq, 10)
        .await
        .expect("events");
    assert_eq!(last.len(), 1);
    assert_eq!(last[0].payload["result"]["seen"], before.last_seq);

    // Unknown runs and tasks are not found, and nothing is decided.
    let missing = Uuid::now_v7();
    for result in [
        env.store
            .transition(missing, None, |_, _| -> Result<Decision, ()> {
                panic!("decided")
            })
            .await,
        env.store
            .transition(run, Some(missing), |_, _| -> Result<Decision, ()> {
                panic!("decided")
            })
            .await,
        env.store
            .transition_task(missing, |_, _| -> Result<Decision, ()> {
                panic!("decided")
            })
            .await,
    ] {
        assert!(
            matches!(result, Err(TransitionError::Store(StoreError::NotFound(_)))),
            "{result:?}"
        );
    }
    env.finish().await;
}

// ---- tasks --------------------------------------------------------------

/// Many workers claim at once: every claimable task is claimed exactly
/// once (attempt 1), tasks of a paused run only when they run while paused.
async fn concurrent_claims_hand_each_ready_task_to_exactly_one_worker(backend: Backend) {
    let env = Env::new(backend).await;
    let running = env.start("k1").await;
    let paused = env.start("k2").await;
    env.coord
        .pause_run("t", &paused.to_string(), "ops", "hold")
        .await
        .expect("pause");
    let schedule = |run: Uuid, prefix: &'static str, n: usize, while_paused: bool| {
        let store = env.store.clone();
        async move {
            store
                .transition(run, None, move |_, _| {
                    Ok::<_, ()>(Decision {
                        events: vec![],
                        commands: (0..n)
                            .map(|i| Command::ScheduleTask {
                                call_id: format!("{prefix}{i}"),
                                kind: TaskKind::ToolCall,
                                spec: json!({"call": format!("{prefix}{i}")}),
                                idempotency_key: format!("{run}/{prefix}{i}"),
                                repeat_safety: None,
                                runs_while_paused: while_paused,
                                requires: Vec::new(),
                            })
                            .collect(),
                    })
                })
                .await
                .expect("schedule");
        }
    };
    schedule(running, "x", 60, false).await;
    schedule(paused, "held", 3, false).await;
    schedule(paused, "probe", 2, true).await;
    // The running run's model call, its 60 tasks, and the 2 probe tasks.
    let expected = 1 + 60 + 2;

    let mut handles = Vec::new();
    for w in 0..12 {
        let store = env.store.clone();
        handles.push(tokio::spawn(async move {
            let mut got = Vec::new();
            loop {
                let batch = store
                    .claim_tasks(&format!("w{w}"), 3, 60_000, None)
                    .await
                    .expect("claim");
                if batch.is_empty() {
                    return got;
                }
                got.extend(batch.into_iter().map(|t| (format!("w{w}"), t)));
            }
        }));
    }
    let mut claimed = Vec::new();
    for h in handles {
        claimed.extend(h.await.expect("worker"));
    }
    let ids: HashSet<Uuid> = claimed.iter().map(|(_, t)| t.task_id).collect();
    assert_eq!(ids.len(), claimed.len(), "a task was claimed twice");
    assert_eq!(claimed.len(), expected);
    for (worker, t) in &claimed {
        assert_eq!((t.attempt, t.tenant.as_str()), (1, "t"));
        let row = task_row(&env.store, t.run_id, t.task_id).await;
        assert_eq!(
            (row.status.as_str(), row.worker_id.as_deref(), row.attempt),
            ("leased", Some(worker.as_str()), 1)
        );
        assert!(!row.lease_expired && !row.dispatched);
        if t.run_id == paused {
            assert!(row.call_id.starts_with("probe"), "{}", row.call_id);
        }
        if t.kind == "tool_call" {
            assert_eq!(t.spec, json!({"call": row.call_id}));
            assert_eq!(t.idempotency_key, format!("{}/{}", t.run_id, row.call_id));
        }
    }
    assert!(
        env.store
            .claim_tasks("late", 10, 60_000, None)
            .await
            .expect("claim")
            .is_empty()
    );
    // Ready tasks remain, but only of the paused run: none is claimable.
    assert_eq!(env.store.next_ready_in_ms().await.expect("next"), None);
    env.finish().await;
}

/// After a lease is lost and the task claimed again, the old attempt can
/// change nothing: not its lease, not its dispatch mark, not its result,
/// not its end. The current attempt can.
async fn a_stale_attempt_cannot_change_a_task(backend: Backend) {
    let env = Env::new(backend).await;
    let run = env.start("k").await;
    let first = env
        .store
        .claim_tasks("w1", 1, 60_000, None)
        .await
        .expect("claim")
        .remove(0);
    assert_eq!(first.attempt, 1);
    assert_eq!(env.store.expire_task_timers(None).await.expect("expire"), 1);
    let expired = env.store.expired_leases(10, 60_000).await.expect("expired");
    assert_eq!(expired.len(), 1);
    assert_eq!(
        (expired[0].task_id, expired[0].run_id, expired[0].attempt),
        (first.task_id, run, 1)
    );
    assert_eq!(env.coord.sweep_expired_leases().await.expect("sweep"), 1);
    // A model call whose lease expired is retried after a delay.
    let row = task_row(&env.store, run, first.task_id).await;
    assert_eq!(
        (row.status.as_str(), row.attempt, row.worker_id.as_deref()),
        ("ready", 1, None)
    );
    assert!(
        env.store
            .claim_tasks("w2", 1, 60_000, None)
            .await
            .expect("claim")
            .is_empty(),
        "the retry delay holds it"
    );
    let wait = env.store.next_ready_in_ms().await.expect("next");
    assert!(matches!(wait, Some(ms) if ms > 0), "{wait:?}");
    assert_eq!(
        env.store
            .expire_task_timers(Some(first.task_id))
            .await
            .expect("skip delay"),
        1
    );
    assert_eq!(env.store.next_ready_in_ms().await.expect("next"), Some(0));
    let second = env
        .store
        .claim_tasks("w2", 1, 60_000, None)
        .await
        .expect("claim")
        .remove(0);
    assert_eq!((second.task_id, second.attempt), (first.task_id, 2));
    let call_id = task_row(&env.store, run, first.task_id).await.call_id;
    let seq = env.run(run).await.last_seq;

    // The stale attempt (1) and the stale worker change nothing.
    assert!(
        env.store
            .heartbeat("w1", &[(first.task_id, 1)], 60_000)
            .await
            .expect("heartbeat")
            .is_empty()
    );
    assert!(
        env.store
            .heartbeat("w1", &[(first.task_id, 2)], 60_000)
            .await
            .expect("heartbeat")
            .is_empty(),
        "another worker's lease"
    );
    env.store
        .end_orphan_task(first.task_id, 1)
        .await
        .expect("end orphan");
    let mark = |attempt: u32| {
        let call_id = call_id.clone();
        move |_: &belay_engine::machine::RunState, _: Option<&TaskRow>| {
            Ok::<_, ()>(Decision {
                events: vec![],
                commands: vec![Command::MarkDispatched { call_id, attempt }],
            })
        }
    };
    env.store
        .transition(run, None, mark(1))
        .await
        .expect("transition");
    let stale = env
        .coord
        .complete("w1", &first.task_id.to_string(), 1, &proposal("create"))
        .await;
    assert!(
        matches!(stale, Err(CoordinatorError::FailedPrecondition(_))),
        "{stale:?}"
    );
    let row = task_row(&env.store, run, first.task_id).await;
    assert_eq!(
        (row.status.as_str(), row.attempt, row.worker_id.as_deref()),
        ("leased", 2, Some("w2"))
    );
    assert!(!row.dispatched && row.dispatched_at.is_none());
    assert_eq!(env.run(run).await.last_seq, seq, "no event written");

    // The current attempt can.
    assert_eq!(
        env.store
            .heartbeat("w2", &[(first.task_id, 2)], 60_000)
            .await
            .expect("heartbeat"),
        vec![(first.task_id, 2)]
    );
    env.store
        .transition(run, None, mark(2))
        .await
        .expect("transition");
    let row = task_row(&env.store, run, first.task_id).await;
    assert!(row.dispatched);
    assert_recent(row.dispatched_at.expect("dispatched_at"), "dispatched_at");
    env.store
        .end_orphan_task(first.task_id, 2)
        .await
        .expect("end orphan");
    let row = task_row(&env.store, run, first.task_id).await;
    assert_eq!((row.status.as_str(), row.attempt), ("cancelled", 2));
    env.finish().await;
}

/// A heartbeat extends only leases the caller holds, at their current
/// attempt, that have not expired, by `lease_ms` from now.
async fn heartbeat_extends_only_the_callers_unexpired_leases(backend: Backend) {
    let env = Env::new(backend).await;
    for key in ["a", "b", "c"] {
        env.start(key).await;
    }
    let claim = |worker: &'static str| {
        let store = env.store.clone();
        async move {
            store
                .claim_tasks(worker, 1, 60_000, None)
                .await
                .expect("claim")
                .remove(0)
                .task_id
        }
    };
    let a = claim("w1").await;
    let b = claim("w2").await;
    let c = claim("w1").await;
    let held: BTreeSet<(Uuid, i32)> = env
        .store
        .heartbeat(
            "w1",
            &[(a, 1), (b, 1), (c, 2), (c, 1), (Uuid::now_v7(), 1)],
            60_000,
        )
        .await
        .expect("heartbeat")
        .into_iter()
        .collect();
    assert_eq!(held, BTreeSet::from([(a, 1), (c, 1)]));
    env.store.expire_task_timers(Some(a)).await.expect("expire");
    assert_eq!(
        env.store
            .heartbeat("w1", &[(a, 1), (c, 1)], 60_000)
            .await
            .expect("heartbeat"),
        vec![(c, 1)],
        "an expired lease is not revived"
    );
    let expired = || async {
        env.store
            .expired_leases(10, 60_000)
            .await
            .expect("expired")
            .into_iter()
            .map(|l| l.task_id)
            .collect::<BTreeSet<Uuid>>()
    };
    // A heartbeat never shortens a lease.
    assert_eq!(
        env.store
            .heartbeat("w1", &[(c, 1)], -1_000)
            .await
            .expect("heartbeat"),
        vec![(c, 1)]
    );
    assert_eq!(expired().await, BTreeSet::from([a]));
    // It extends it to `lease_ms` from now: 50 s on, a 60 s heartbeat holds
    // the lease past the claim's 60 s, until 110 s.
    env.store.advance_clock(50_000).await.expect("clock");
    assert_eq!(
        env.store
            .heartbeat("w1", &[(b, 1), (c, 1)], 60_000)
            .await
            .expect("heartbeat"),
        vec![(c, 1)]
    );
    env.store.advance_clock(20_000).await.expect("clock");
    assert_eq!(expired().await, BTreeSet::from([a, b]));
    env.store.advance_clock(45_000).await.expect("clock");
    assert_eq!(expired().await, BTreeSet::from([a, b, c]));
    assert!(
        env.store
            .heartbeat("w1", &[], 60_000)
            .await
            .expect("empty heartbeat")
            .is_empty()
    );
    env.finish().await;
}

/// Expired leases come oldest expiry first, limited, live ones never.
async fn expired_leases_come_oldest_first(backend: Backend) {
    let env = Env::new(backend).await;
    for key in ["a", "b", "c", "d", "e"] {
        env.start(key).await;
    }
    // Leases granted already in the past (no sleeping): ms relative to now.
    let mut by_lease = BTreeMap::new();
    for lease_ms in [-2_000i64, -5_000, 60_000, -1_000, -3_000] {
        let t = env
            .store
            .claim_tasks("w", 1, lease_ms, None)
            .await
            .expect("claim")
            .remove(0);
        by_lease.insert(lease_ms, (t.task_id, t.run_id));
    }
    let want: Vec<(Uuid, Uuid, i32)> = [-5_000, -3_000, -2_000, -1_000]
        .iter()
        .map(|ms| (by_lease[ms].0, by_lease[ms].1, 1))
        .collect();
    let got: Vec<(Uuid, Uuid, i32)> = env
        .store
        .expired_leases(10, 60_000)
        .await
        .expect("expired")
        .into_iter()
        .map(|l| (l.task_id, l.run_id, l.attempt))
        .collect();
    assert_eq!(got, want);
    let two = env.store.expired_leases(2, 60_000).await.expect("expired");
    assert_eq!(
        two.iter().map(|l| l.task_id).collect::<Vec<_>>(),
        vec![want[0].0, want[1].0]
    );
    env.finish().await;
}

/// A retry delay holds a task back by the database clock until it passes
/// (or `expire_task_timers` skips it); the retry keeps the attempt counter
/// and clears the lease and dispatch mark.
async fn retry_delays_and_expire_task_timers(backend: Backend) {
    let env = Env::new(backend).await;
    let run = env.start("k").await;
    assert_eq!(env.store.next_ready_in_ms().await.expect("next"), Some(0));
    // A ready task that is already claimable is still counted (as on both backends).
    assert_eq!(env.store.expire_task_timers(None).await.expect("expire"), 1);
    let t = env
        .store
        .claim_tasks("w", 1, 60_000, None)
        .await
        .expect("claim")
        .remove(0);
    assert_eq!(env.store.next_ready_in_ms().await.expect("next"), None);
    let call_id = task_row(&env.store, run, t.task_id).await.call_id;
    let retry_call = call_id.clone();
    env.store
        .transition(run, Some(t.task_id), move |_, _| {
            Ok::<_, ()>(Decision {
                events: vec![],
                commands: vec![
                    Command::MarkDispatched {
                        call_id: retry_call.clone(),
                        attempt: 1,
                    },
                    Command::RetryTask {
                        call_id: retry_call,
                        delay_ms: 600_000,
                    },
                ],
            })
        })
        .await
        .expect("retry");
    let row = task_row(&env.store, run, t.task_id).await;
    assert_eq!(
        (
            row.status.as_str(),
            row.attempt,
            row.worker_id.as_deref(),
            row.dispatched
        ),
        ("ready", 1, None, false)
    );
    assert!(!row.lease_expired);
    let wait = env
        .store
        .next_ready_in_ms()
        .await
        .expect("next")
        .expect("a ready task");
    assert!((590_000..=600_000).contains(&wait), "{wait}");
    assert!(
        env.store
            .claim_tasks("w", 1, 60_000, None)
            .await
            .expect("claim")
            .is_empty()
    );
    assert_eq!(
        env.store
            .expire_task_timers(Some(Uuid::now_v7()))
            .await
            .expect("no such task"),
        0
    );
    assert_eq!(
        env.store
            .expire_task_timers(Some(t.task_id))
            .await
            .expect("expire"),
        1
    );
    assert_eq!(env.store.next_ready_in_ms().await.expect("next"), Some(0));
    let again = env
        .store
        .claim_tasks("w", 1, 60_000, None)
        .await
        .expect("claim")
        .remove(0);
    assert_eq!((again.task_id, again.attempt), (t.task_id, 2));
    env.finish().await;
}

// ---- runs ---------------------------------------------------------------

/// `create_run` with a known idempotency key writes nothing and returns the
/// existing run with `false`, also when many race on one key.
async fn create_run_is_idempotent(backend: Backend) {
    let env = Env::new(backend).await;
    let input = json!({"email": "ada@example.com", "n": [1, 2, 3]});
    let decision = Decision {
        events: vec![marker(json!(1)), marker(json!(2))],
        commands: vec![],
    };
    let first = Uuid::now_v7();
    let (row, created) = env
        .store
        .create_run(first, "u", "wf", 3, &input, "key", "alice", &decision)
        .await
        .expect("create");
    assert!(created);
    assert_eq!(
        (
            row.run_id,
            row.tenant.as_str(),
            row.workflow.as_str(),
            row.workflow_version,
            row.idempotency_key.as_str(),
            row.caller.as_str(),
            row.last_seq,
        ),
        (first, "u", "wf", 3, "key", "alice", 2)
    );
    assert_eq!(row.input, input);
    assert_eq!(row.output, None);
    assert_eq!(row.status, "pending");
    assert_recent(row.created_at, "created_at");
    assert!(row.updated_at >= row.created_at);

    let second = Uuid::now_v7();
    let (again, created) = env
        .store
        .create_run(second, "u", "wf2", 9, &json!({}), "key", "bob", &decision)
        .await
        .expect("create again");
    assert!(!created);
    assert_eq!(
        (again.run_id, again.caller.as_str(), again.last_seq),
        (first, "alice", 2)
    );
    assert!(env.store.get_run("u", second).await.expect("get").is_none());
    assert_eq!(
        env.store
            .list_events(first, 0, 100)
            .await
            .expect("events")
            .len(),
        2
    );
    assert_eq!(
        env.store
            .run_by_idempotency_key("u", "key")
            .await
            .expect("by key")
            .map(|r| r.run_id),
        Some(first)
    );
    assert!(
        env.store
            .run_by_idempotency_key("v", "key")
            .await
            .expect("by key")
            .is_none()
    );
    // The key is per tenant.
    let (other, created) = env
        .store
        .create_run(
            second,
            "v",
            "wf",
            1,
            &input,
            "key",
            "c",
            &Decision::default(),
        )
        .await
        .expect("other tenant");
    assert!(created);
    assert_eq!((other.run_id, other.last_seq), (second, 0));
    assert!(env.store.get_run("u", second).await.expect("get").is_none());

    // Sixteen racing creates with one key: one run.
    let mut handles = Vec::new();
    for i in 0..16 {
        let store = env.store.clone();
        let decision = decision.clone();
        handles.push(tokio::spawn(async move {
            store
                .create_run(
                    Uuid::now_v7(),
                    "u",
                    "wf",
                    1,
                    &json!({"i": i}),
                    "race",
                    "c",
                    &decision,
                )
                .await
                .expect("create")
        }));
    }
    let mut winners = 0;
    let mut ids = HashSet::new();
    for h in handles {
        let (row, created) = h.await.expect("task");
        winners += usize::from(created);
        ids.insert(row.run_id);
    }
    assert_eq!((winners, ids.len()), (1, 1));
    let run = *ids.iter().next().expect("id");
    assert_eq!(
        env.store
            .list_events(run, 0, 100)
            .await
            .expect("events")
            .len(),
        2
    );
    let all = env
        .store
        .list_runs("u", None, None, 100)
        .await
        .expect("list");
    assert_eq!(all.len(), 2, "the first run and the raced one");
    env.finish().await;
}

/// Keyset paging of runs returns every run exactly once, newest first,
/// whatever the page size, when many runs share a `created_at`; status and
/// tenant filters hold across pages.
async fn list_runs_pages_every_run_exactly_once(backend: Backend) {
    let env = Env::new(backend).await;
    let raw = env.db.raw().await;
    let mut ids = Vec::new();
    for i in 0..45 {
        let id = Uuid::now_v7();
        env.store
            .create_run(
                id,
                "p",
                "wf",
                1,
                &json!({"i": i}),
                &format!("k{i}"),
                "c",
                &Decision::default(),
            )
            .await
            .expect("create");
        ids.push(id);
        // Twenty share one timestamp, fifteen another, ten keep their own.
        let tie = match i {
            0..20 => Some("2031-05-06T07:08:09.123Z"),
            20..35 => Some("2019-01-01T00:00:00.000Z"),
            _ => None,
        };
        if let Some(tie) = tie {
            raw.execute(
                &format!("UPDATE runs SET created_at = '{tie}' WHERE run_id = $1"),
                Some(id),
            )
            .await;
        }
        if i % 3 == 0 {
            raw.execute(
                "UPDATE runs SET status = 'cancelled' WHERE run_id = $1",
                Some(id),
            )
            .await;
        }
    }
    env.store
        .create_run(
            Uuid::now_v7(),
            "q",
            "wf",
            1,
            &json!({}),
            "k0",
            "c",
            &Decision::default(),
        )
        .await
        .expect("another tenant");
    raw.close().await;

    let mut rows = Vec::new();
    for id in &ids {
        rows.push(
            env.store
                .get_run("p", *id)
                .await
                .expect("get")
                .expect("run"),
        );
    }
    rows.sort_by_key(|r| std::cmp::Reverse((r.created_at, r.run_id)));
    let want: Vec<Uuid> = rows.iter().map(|r| r.run_id).collect();
    let want_cancelled: Vec<Uuid> = rows
        .iter()
        .filter(|r| r.status == "cancelled")
        .map(|r| r.run_id)
        .collect();
    assert_eq!(want_cancelled.len(), 15);

    for status in [None, Some("cancelled")] {
        for size in [1, 2, 7, 20, 45, 100] {
            let mut got = Vec::new();
            let mut after = None;
            loop {
                let page = env
                    .store
                    .list_runs("p", status, after, size)
                    .await
                    .expect("page");
                assert!(page.len() <= size as usize);
                got.extend(page.iter().map(|r| r.run_id));
                if page.len() < size as usize {
                    break;
                }
                let last = page.last().expect("last");
                after = Some((last.created_at, last.run_id));
            }
            let want = if status.is_some() {
                &want_cancelled
            } else {
                &want
            };
            assert_eq!(&got, want, "status {status:?}, page size {size}");
        }
    }
    env.finish().await;
}

// ---- uncertain outcomes -------------------------------------------------

/// Keyset paging of uncertain outcomes returns every record exactly once,
/// newest first, with timestamp ties; filters hold across pages.
async fn list_uncertain_pages_every_record_exactly_once(backend: Backend) {
    let env = Env::new(backend).await;
    let mut ids = Vec::new();
    for i in 0..9 {
        let tool = if i % 3 == 0 { "update" } else { "create" };
        let (_, _, id) = env.uncertain(&format!("k{i}"), tool).await;
        ids.push((id, tool));
    }
    let raw = env.db.raw().await;
    for (i, (id, _)) in ids.iter().enumerate() {
        if i < 6 {
            raw.execute(
                "UPDATE uncertain_outcomes SET created_at = '2020-02-03T04:05:06.789Z' WHERE uncertain_id = $1",
                Some(*id),
            )
            .await;
        }
    }
    raw.close().await;
    let mut rows: Vec<UncertainRow> = Vec::new();
    for (id, _) in &ids {
        rows.push(
            env.store
                .get_uncertain("t", *id)
                .await
                .expect("get")
                .expect("row"),
        );
    }
    rows.sort_by_key(|r| std::cmp::Reverse((r.created_at, r.uncertain_id)));
    let want: Vec<Uuid> = rows.iter().map(|r| r.uncertain_id).collect();
    let want_update: Vec<Uuid> = rows
        .iter()
        .filter(|r| r.tool == "update")
        .map(|r| r.uncertain_id)
        .collect();
    assert_eq!(want_update.len(), 3);

    for tool in [None, Some("update")] {
        for size in [1, 2, 4, 9, 50] {
            let mut got = Vec::new();
            let mut after = None;
            loop {
                let page = env
                    .store
                    .list_uncertain(&UncertainQuery {
                        tenant: "t",
                        status: Some("open"),
                        tool,
                        after,
                        limit: size,
                        ..UncertainQuery::default()
                    })
                    .await
                    .expect("page");
                got.extend(page.iter().map(|r| r.uncertain_id));
                if page.len() < size as usize {
                    break;
                }
                let last = page.last().expect("last");
                after = Some((last.created_at, last.uncertain_id));
            }
            let want = if tool.is_some() { &want_update } else { &want };
            assert_eq!(&got, want, "tool {tool:?}, page size {size}");
        }
    }
    // Age filters by the database clock: six records are years old.
    let query = |older: Option<u64>, newer: Option<u64>| UncertainQuery {
        tenant: "t",
        older_than_ms: older,
        newer_than_ms: newer,
        limit: 100,
        ..UncertainQuery::default()
    };
    let recent = env
        .store
        .list_uncertain(&query(None, Some(3_600_000)))
        .await
        .expect("newer");
    assert_eq!(recent.len(), 3);
    let old = env
        .store
        .list_uncertain(&query(Some(3_600_000), None))
        .await
        .expect("older");
    assert_eq!(old.len(), 6);
    assert!(
        env.store
            .list_uncertain(&UncertainQuery {
                tenant: "other",
                limit: 100,
                ..UncertainQuery::default()
            })
            .await
            .expect("other tenant")
            .is_empty()
    );
    env.finish().await;
}

/// The uncertain-outcome record carries the call, its attempts (with RFC
/// 3339 times) and the worker; a call uncertain again after a retry gets a
/// second record (occurrence 2), and each record gets its own notification.
async fn uncertain_records_and_occurrences(backend: Backend) {
    let env = Env::new(backend).await;
    let (run, task, first) = env.uncertain("k", "create").await;
    let rows = env.store.uncertain_for_run(run).await.expect("rows");
    assert_eq!(rows.len(), 1);
    let r = &rows[0];
    assert_eq!(
        (
            r.uncertain_id,
            r.tenant.as_str(),
            r.run_id,
            r.task_id,
            r.node_id.as_str(),
            r.tool.as_str(),
            r.tool_version,
            r.worker_id.as_deref(),
            r.status.as_str(),
            r.occurrence,
        ),
        (
            first,
            "t",
            run,
            task,
            "n",
            "create",
            1,
            Some("w1"),
            "open",
            1
        )
    );
    assert_eq!(r.arguments, json!({"email": "e@example.com"}));
    assert!(r.idempotency_key.starts_with(&run.to_string()));
    assert_recent(r.created_at, "created_at");
    let attempts = r.attempts.as_array().expect("attempts");
    let kinds: Vec<&str> = attempts
        .iter()
        .map(|a| a["event"].as_str().expect("event"))
        .collect();
    assert_eq!(kinds, ["tool_call_dispatched", "task_lease_expired"]);
    for a in attempts {
        assert_eq!(a["attempt"], 1);
        let at = DateTime::parse_from_rfc3339(a["at"].as_str().expect("at")).expect("RFC 3339");
        assert_recent(at.with_timezone(&Utc), "attempt time");
        assert!(a["seq"].as_i64().expect("seq") > 0);
    }
    assert_eq!(attempts[0]["worker_id"], "w1");
    assert!(r.resolution.is_none() && r.resolved_at.is_none() && r.probe.is_none());
    assert!(r.discrepancy.is_none());
    assert_eq!(
        env.store
            .get_uncertain("t", first)
            .await
            .expect("get")
            .map(|r| r.uncertain_id),
        Some(first)
    );
    assert!(
        env.store
            .get_uncertain("u", first)
            .await
            .expect("get")
            .is_none()
    );

    // Retried with the same key, dispatched, lost again: a second record.
    env.coord
        .resolve_uncertain(
            "t",
            &first.to_string(),
            Resolution::Retry {
                new_idempotency_key: false,
            },
            "ops",
            "try again",
        )
        .await
        .expect("resolve");
    let again = env.coord.claim("w1", 1, 0).await.expect("claim").remove(0);
    assert_eq!((again.task_id, again.attempt), (task, 2));
    env.dispatch_and_lose(&task, 2).await;
    let rows = env.store.uncertain_for_run(run).await.expect("rows");
    assert_eq!(
        rows.iter()
            .map(|r| (r.occurrence, r.status.as_str()))
            .collect::<Vec<_>>(),
        [(1, "resolved"), (2, "open")]
    );
    let (one, two) = (&rows[0], &rows[1]);
    assert_eq!(one.uncertain_id, first);
    assert_eq!(
        (
            one.resolution_kind.as_deref(),
            one.resolved_by.as_deref(),
            one.resolved_via.as_deref(),
            one.resolution_reason.as_deref(),
        ),
        (
            Some("retry"),
            Some("ops"),
            Some("operator"),
            Some("try again")
        )
    );
    assert_eq!(
        one.resolution.as_ref().expect("resolution")["resolution"],
        "retry"
    );
    assert_recent(one.resolved_at.expect("resolved_at"), "resolved_at");
    assert_eq!(
        two.attempts
            .as_array()
            .expect("attempts")
            .iter()
            .map(|a| (
                a["event"].as_str().expect("event"),
                a["attempt"].as_i64().expect("n")
            ))
            .collect::<Vec<_>>(),
        [
            ("tool_call_dispatched", 1),
            ("task_lease_expired", 1),
            ("tool_call_dispatched", 2),
            ("task_lease_expired", 2)
        ],
        "every attempt of the call"
    );
    // Probe results and discrepancies go to the call's newest record.
    let call_id = two.call_id.clone();
    env.store
        .transition(run, None, move |_, _| {
            Ok::<_, ()>(Decision {
                events: vec![],
                commands: vec![
                    Command::RecordProbe {
                        call_id: call_id.clone(),
                        probe: json!({"tool": "lookup", "outcome": "undecided", "detail": "ünclear"}),
                    },
                    Command::FlagDiscrepancy {
                        call_id: call_id.clone(),
                        discrepancy: json!({"attempt": 1, "result": {"id": "x"}}),
                    },
                    Command::FlagDiscrepancy {
                        call_id,
                        discrepancy: json!([1, 2]),
                    },
                ],
            })
        })
        .await
        .expect("probe and discrepancies");
    let rows = env.store.uncertain_for_run(run).await.expect("rows");
    assert!(rows[0].probe.is_none() && rows[0].discrepancy.is_none());
    let mut probe = rows[1].probe.clone().expect("probe");
    let at = probe
        .as_object_mut()
        .expect("object")
        .remove("at")
        .expect("at");
    assert_recent(
        DateTime::parse_from_rfc3339(at.as_str().expect("text"))
            .expect("RFC 3339")
            .with_timezone(&Utc),
        "probe time",
    );
    assert_eq!(
        probe,
        json!({"tool": "lookup", "outcome": "undecided", "detail": "ünclear"})
    );
    assert_eq!(
        rows[1].discrepancy,
        Some(json!([{"attempt": 1, "result": {"id": "x"}}, [1, 2]]))
    );
    let notes = env.store.notifications_for_run(run).await.expect("notes");
    assert_eq!(notes.len(), 2);
    let claimed = env
        .store
        .claim_due_notifications(10, 60_000)
        .await
        .expect("claim");
    let mut pointed: Vec<(i32, String)> = claimed
        .iter()
        .map(|n| {
            let id = n.payload["uncertain_id"]
                .as_str()
                .expect("uncertain_id")
                .to_owned();
            let occurrence = rows
                .iter()
                .find(|r| r.uncertain_id.to_string() == id)
                .expect("a record")
                .occurrence;
            (
                occurrence,
                n.payload["call_id"].as_str().expect("call").to_owned(),
            )
        })
        .collect();
    pointed.sort();
    assert_eq!(pointed.iter().map(|p| p.0).collect::<Vec<_>>(), [1, 2]);
    env.finish().await;
}

// ---- notifications ------------------------------------------------------

/// The outbox: concurrent claims never hand a row out twice; a claim leases
/// the row and counts the attempt; failures and deliveries are fenced by
/// attempt; delivered and abandoned rows are never claimed again.
async fn notifications_claim_deliver_and_failure_are_fenced(backend: Backend) {
    let env = Env::new(backend).await;
    let (run_a, _, _) = env.uncertain("a", "create").await;
    let (run_b, _, _) = env.uncertain("b", "create").await;
    let id_a = env.store.notifications_for_run(run_a).await.expect("notes")[0].notification_id;
    let id_b = env.store.notifications_for_run(run_b).await.expect("notes")[0].notification_id;

    let mut handles = Vec::new();
    for _ in 0..8 {
        let store = env.store.clone();
        handles.push(tokio::spawn(async move {
            store
                .claim_due_notifications(10, 60_000)
                .await
                .expect("claim")
        }));
    }
    let mut claimed = Vec::new();
    for h in handles {
        claimed.extend(h.await.expect("claimer"));
    }
    let mut ids: Vec<Uuid> = claimed.iter().map(|n| n.notification_id).collect();
    ids.sort();
    let mut want = vec![id_a, id_b];
    want.sort();
    assert_eq!(ids, want, "each row claimed once");
    for n in &claimed {
        assert_eq!((n.attempts, n.tenant.as_str()), (1, "t"));
        assert_eq!(n.kind, "run.paused.uncertain_outcome");
        assert_eq!(n.payload["run_id"], n.run_id.to_string());
        assert_recent(n.created_at, "notification created_at");
    }
    assert!(
        env.store
            .claim_due_notifications(10, 60_000)
            .await
            .expect("claim")
            .is_empty(),
        "leased"
    );

    // A: fails (stale attempt refused), is retried, delivered once.
    assert!(
        !env.store
            .record_notification_failure(id_a, 0, "stale", Some(0))
            .await
            .expect("failure")
    );
    assert!(
        env.store
            .record_notification_failure(id_a, 1, "HTTP 500", Some(-1_000))
            .await
            .expect("failure")
    );
    let a = &env.store.notifications_for_run(run_a).await.expect("notes")[0];
    assert_eq!((a.attempts, a.last_error.as_deref()), (1, Some("HTTP 500")));
    assert!(a.next_attempt_at < Utc::now() && a.delivered_at.is_none() && a.failed_at.is_none());
    let again = env
        .store
        .claim_due_notifications(10, 60_000)
        .await
        .expect("claim");
    assert_eq!(
        again
            .iter()
            .map(|n| (n.notification_id, n.attempts))
            .collect::<Vec<_>>(),
        [(id_a, 2)]
    );
    assert!(
        !env.store
            .record_notification_failure(id_a, 1, "late", Some(0))
            .await
            .expect("failure"),
        "the first attempt is stale now"
    );
    assert!(
        env.store
            .mark_notification_delivered(id_a)
            .await
            .expect("delivered")
    );
    assert!(
        !env.store
            .mark_notification_delivered(id_a)
            .await
            .expect("again")
    );
    assert!(
        !env.store
            .record_notification_failure(id_a, 2, "after delivery", Some(0))
            .await
            .expect("failure")
    );
    let a = &env.store.notifications_for_run(run_a).await.expect("notes")[0];
    assert_eq!((a.attempts, a.last_error.as_deref()), (2, None));
    assert_recent(a.delivered_at.expect("delivered_at"), "delivered_at");

    // B: abandoned after its last attempt.
    assert!(
        env.store
            .record_notification_failure(id_b, 1, "connection refused", None)
            .await
            .expect("abandon")
    );
    assert!(
        !env.store
            .record_notification_failure(id_b, 1, "again", Some(0))
            .await
            .expect("after abandon")
    );
    let b = &env.store.notifications_for_run(run_b).await.expect("notes")[0];
    assert_eq!(b.last_error.as_deref(), Some("connection refused"));
    assert_recent(b.failed_at.expect("failed_at"), "failed_at");
    assert!(b.delivered_at.is_none());

    // Neither is ever claimed again, even with every timer in the past.
    let raw = env.db.raw().await;
    raw.execute(
        "UPDATE notifications SET next_attempt_at = '2000-01-01T00:00:00.000Z'",
        None,
    )
    .await;
    raw.close().await;
    assert!(
        env.store
            .claim_due_notifications(10, 60_000)
            .await
            .expect("claim")
            .is_empty()
    );
    env.finish().await;
}

// ---- definitions and tenants --------------------------------------------

/// New content gets the next version; identical content returns its
/// version and becomes current again (also within one call, where the last
/// registration wins); versions are per tenant, kind and name; concurrent
/// registrations of new content get distinct versions.
async fn definition_versions_and_the_current_one(backend: Backend) {
    let env = Env::new(backend).await;
    let store = &env.store;
    let def = |name: &str, hash: &str| {
        (
            "agent".to_owned(),
            name.to_owned(),
            hash.to_owned(),
            json!({"name": name, "hash": hash, "nested": {"ü": [1, 2]}}),
            format!("{name}.yaml"),
        )
    };
    let register = |defs: Vec<(String, String, String, Value, String)>| async move {
        store
            .register_definitions("d", &defs)
            .await
            .expect("register")
            .into_iter()
            .map(|(row, created)| (row.content_hash, row.version, created))
            .collect::<Vec<_>>()
    };
    let current = |name: &'static str| async move {
        let row = store
            .latest_definition("d", "agent", name)
            .await
            .expect("latest")
            .expect("a version");
        (row.content_hash, row.version)
    };
    let h = |s: &str| s.to_owned();

    assert_eq!(register(vec![def("a", "h1")]).await, [(h("h1"), 1, true)]);
    assert_eq!(register(vec![def("a", "h1")]).await, [(h("h1"), 1, false)]);
    assert_eq!(register(vec![def("a", "h2")]).await, [(h("h2"), 2, true)]);
    assert_eq!(current("a").await, (h("h2"), 2));
    assert_eq!(register(vec![def("a", "h1")]).await, [(h("h1"), 1, false)]);
    assert_eq!(
        current("a").await,
        (h("h1"), 1),
        "older content is current again"
    );
    // Within one call the last registration wins.
    assert_eq!(
        register(vec![def("a", "h1"), def("a", "h2")]).await,
        [(h("h1"), 1, false), (h("h2"), 2, false)]
    );
    assert_eq!(current("a").await, (h("h2"), 2));
    assert_eq!(
        register(vec![def("a", "h2"), def("a", "h1"), def("b", "h1")]).await,
        [(h("h2"), 2, false), (h("h1"), 1, false), (h("h1"), 1, true)]
    );
    assert_eq!(current("a").await, (h("h1"), 1));
    assert_eq!(
        register(vec![def("a", "h3"), def("a", "h3")]).await,
        [(h("h3"), 3, true), (h("h3"), 3, false)],
        "new content twice in one call"
    );
    assert_eq!(current("a").await, (h("h3"), 3));
    // Quick alternation: each registration is current right after it.
    for round in 0..5 {
        for hash in ["h1", "h2", "h3"] {
            register(vec![def("a", hash)]).await;
            assert_eq!(current("a").await.0, hash, "round {round}");
        }
    }
    // Another tenant and another kind are separate.
    let other = store
        .register_definitions("e", &[def("a", "h3")])
        .await
        .expect("register");
    assert_eq!((other[0].0.version, other[0].1), (1, true));
    let tool = store
        .register_definitions(
            "d",
            &[(
                "tool".into(),
                "a".into(),
                "h9".into(),
                json!({}),
                "a.tools.abl".into(),
            )],
        )
        .await
        .expect("register");
    assert_eq!((tool[0].0.version, tool[0].1), (1, true));
    assert!(
        store
            .latest_definition("d", "workflow", "a")
            .await
            .expect("latest")
            .is_none()
    );

    // Concurrent registrations of new content: distinct, gapless versions.
    let mut handles = Vec::new();
    for i in 0..8 {
        let store = store.clone();
        let d = def("a", &format!("c{i}"));
        handles.push(tokio::spawn(async move {
            let out = store
                .register_definitions("d", &[d])
                .await
                .expect("register");
            assert!(out[0].1);
            out[0].0.version
        }));
    }
    let mut versions = Vec::new();
    for h in handles {
        versions.push(h.await.expect("registrar"));
    }
    versions.sort();
    assert_eq!(versions, (4..=11).collect::<Vec<_>>());

    let listed = store
        .list_definitions("d", Some("agent"))
        .await
        .expect("list");
    let listed: Vec<(String, i32)> = listed.into_iter().map(|r| (r.name, r.version)).collect();
    let mut want: Vec<(String, i32)> = (1..=11).map(|v| ("a".to_owned(), v)).collect();
    want.push(("b".into(), 1));
    assert_eq!(listed, want);
    let all = store.list_definitions("d", None).await.expect("list");
    assert_eq!(all.len(), 13);
    assert_eq!(
        (
            all[0].kind.as_str(),
            all.last().expect("last").kind.as_str()
        ),
        ("agent", "tool")
    );
    let body = &all[0].body;
    assert_eq!(
        body,
        &json!({"name": "a", "hash": "h1", "nested": {"ü": [1, 2]}})
    );
    assert_recent(all[0].created_at, "definition created_at");
    let mut names = store.definition_names("d", "agent").await.expect("names");
    names.sort();
    assert_eq!(names, ["a", "b"]);
    env.finish().await;
}

/// Grants round trip sorted and deduplicated; a tenant never configured has none.
async fn tenant_grants_round_trip(backend: Backend) {
    let env = Env::new(backend).await;
    let s = |v: &[&str]| v.iter().map(|g| (*g).to_owned()).collect::<Vec<_>>();
    assert!(
        env.store
            .tenant_grants("nobody")
            .await
            .expect("grants")
            .is_empty()
    );
    let set = env
        .store
        .set_tenant_grants(
            "g",
            &s(&[
                "email.send",
                "crm.write",
                "crm.read",
                "crm.write",
                "zä",
                "Ω",
            ]),
        )
        .await
        .expect("set");
    let want = s(&["crm.read", "crm.write", "email.send", "zä", "Ω"]);
    assert_eq!(set, want);
    assert_eq!(env.store.tenant_grants("g").await.expect("grants"), want);
    assert_eq!(
        env.store.set_tenant_grants("g", &[]).await.expect("clear"),
        Vec::<String>::new()
    );
    assert!(
        env.store
            .tenant_grants("g")
            .await
            .expect("grants")
            .is_empty()
    );
    assert_eq!(
        env.store.tenant_grants("t").await.expect("grants"),
        s(&["crm.write"])
    );
    env.finish().await;
}

// ---- values -------------------------------------------------------------

/// JSON written through events, run input and run output reads back
/// byte-equal (canonical serialisation): nested objects, unicode, escapes,
/// numbers at the edges of their types, and a 1 MiB string.
async fn json_values_round_trip_byte_equal(backend: Backend) {
    let env = Env::new(backend).await;
    let mut big = String::new();
    while big.len() < 1 << 20 {
        big.push_str("abc ✓ 😀 \"quoted\" \\ back\nslash\t");
    }
    let values = [
        json!({"a": {"b": [1, 2, {"c": null, "d": true, "e": false}]}, "empty": {}, "none": [], "z": {"y": {"x": {"w": {"v": [[[]]]}}}}}),
        json!("héllo wörld ✓ 𝄞 😀 日本語 עברית ﷽ \u{2028}\u{2029}\u{feff}\u{200d}"),
        json!({"ключ": "значение", "🔑": "🗝", "": "empty key", "a\"b\\c": "\u{1}\u{1f}\u{7f}"}),
        json!([
            i64::MIN,
            i64::MAX,
            u64::MAX,
            0,
            -1,
            0.5,
            0.1,
            1.5e300,
            -2.5e-300,
            123456.789
        ]),
        json!({"big": big}),
        json!([]),
        json!(null),
    ];
    let (run, created) = env
        .store
        .create_run(
            Uuid::now_v7(),
            "t",
            "wf",
            1,
            &values[0],
            "json",
            "c",
            &Decision::default(),
        )
        .await
        .expect("create");
    assert!(created);
    let run = run.run_id;
    assert_eq!(
        serde_json::to_string(&env.run(run).await.input).expect("json"),
        serde_json::to_string(&values[0]).expect("json")
    );
    let events: Vec<Event> = values.iter().cloned().map(marker).collect();
    let written = events.clone();
    env.store
        .transition(run, None, move |_, _| {
            Ok::<_, ()>(Decision {
                events: written,
                commands: vec![],
            })
        })
        .await
        .expect("transition");
    let rows = env.store.list_events(run, 0, 100).await.expect("events");
    assert_eq!(rows.len(), events.len());
    for (row, event) in rows.iter().zip(&events) {
        let want =
            serde_json::to_string(&serde_json::to_value(event).expect("value")).expect("json");
        let got = serde_json::to_string(&row.payload).expect("json");
        assert!(
            got == want,
            "seq {}: {} bytes read, {} written",
            row.seq,
            got.len(),
            want.len()
        );
        assert_eq!(row.kind, "late_result_recorded");
        let decoded: Event = serde_json::from_value(row.payload.clone()).expect("decodes");
        assert_eq!(&decoded, event);
    }
    assert_eq!(
        env.store.run_state(run).await.expect("fold").last_seq,
        events.len() as u64
    );
    // The run's output column.
    let output = values[2].clone();
    let out = output.clone();
    env.store
        .transition(run, None, move |_, _| {
            Ok::<_, ()>(Decision {
                events: vec![Event::RunCompleted { output: out }],
                commands: vec![],
            })
        })
        .await
        .expect("complete");
    let row = env.run(run).await;
    assert_eq!(row.status, "completed");
    assert_eq!(
        serde_json::to_string(&row.output.expect("output")).expect("json"),
        serde_json::to_string(&output).expect("json")
    );
    env.finish().await;
}

/// Timestamps decode as the right instant in UTC, whatever the database
/// session's time zone (PostgreSQL: the database is set to UTC-03:30).
async fn timestamps_decode_as_utc(backend: Backend) {
    let db = TestDb::create(backend, "belay_s").await;
    if backend == Backend::Postgres {
        let raw = db.raw().await;
        raw.execute(
            "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET timezone TO %L', current_database(), 'America/St_Johns'); END $$",
            None,
        )
        .await;
        raw.close().await;
    }
    let env = Env::on(db).await;
    let before = Utc::now() - chrono::Duration::seconds(5);
    let (run, _, id) = env.uncertain("k", "create").await;
    let after = Utc::now() + chrono::Duration::seconds(5);
    let within = |t: DateTime<Utc>, what: &str| {
        assert!(
            before <= t && t <= after,
            "{what} {t} not in [{before}, {after}]"
        );
    };
    let row = env.run(run).await;
    within(row.created_at, "run created_at");
    within(row.updated_at, "run updated_at");
    for e in env.store.list_events(run, 0, 100).await.expect("events") {
        within(e.recorded_at, "recorded_at");
    }
    let u = env
        .store
        .get_uncertain("t", id)
        .await
        .expect("get")
        .expect("row");
    within(u.created_at, "uncertain created_at");
    for n in env.store.notifications_for_run(run).await.expect("notes") {
        within(n.next_attempt_at, "next_attempt_at");
    }
    for d in env.store.list_definitions("t", None).await.expect("defs") {
        within(d.created_at, "definition created_at");
    }
    let claimed = env
        .store
        .claim_due_notifications(1, 60_000)
        .await
        .expect("claim");
    within(claimed[0].created_at, "notification created_at");
    // The page token of a run survives the round trip exactly (SQLite
    // stores ms, PostgreSQL µs; either way the stored value comes back).
    let page = env
        .store
        .list_runs("t", None, Some((row.created_at, row.run_id)), 10)
        .await
        .expect("page");
    assert!(page.iter().all(|r| r.run_id != run));
    let page = env
        .store
        .list_runs(
            "t",
            None,
            Some((
                row.created_at + chrono::Duration::microseconds(1),
                row.run_id,
            )),
            10,
        )
        .await
        .expect("page");
    assert_eq!(page.iter().map(|r| r.run_id).collect::<Vec<_>>(), [run]);
    if backend == Backend::Sqlite {
        assert_eq!(
            row.created_at.timestamp_subsec_micros() % 1_000,
            0,
            "ms precision"
        );
    }
    env.finish().await;
}

// ---- lifecycle ----------------------------------------------------------

/// After `close`, every call fails with a database error, and `listen`
/// (whether it started before or after) ends with an error instead of
/// waiting forever.
async fn a_closed_store_fails_every_call(backend: Backend) {
    let env = Env::new(backend).await;
    let run = env.start("k").await;
    let store = env.store.clone();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let listening = tokio::spawn(async move {
        store
            .listen(&mut |wake| {
                let _ = tx.send(wake);
            })
            .await
    });
    // The listener is subscribed once it relays a wake-up of a transition
    // (PostgreSQL: a NOTIFY before its LISTEN is not heard, so write again).
    let mut heard = false;
    for probe in 0..100 {
        env.store
            .transition(run, None, move |_, _| {
                Ok::<_, ()>(Decision {
                    events: vec![marker(json!(probe))],
                    commands: vec![],
                })
            })
            .await
            .expect("transition");
        if let Ok(Some(wake)) = tokio::time::timeout(Duration::from_millis(200), rx.recv()).await {
            assert_eq!(wake, Wake::RunEvents(run));
            heard = true;
            break;
        }
    }
    assert!(heard, "the listener relays wake-ups");
    env.store.close().await;
    let ended = tokio::time::timeout(Duration::from_secs(20), listening)
        .await
        .expect("listen ends when the store is closed")
        .expect("task");
    assert!(ended.is_err(), "listen returned {ended:?}");
    let late = tokio::time::timeout(Duration::from_secs(20), env.store.listen(&mut |_| {}))
        .await
        .expect("listen on a closed store returns");
    assert!(late.is_err());
    assert!(matches!(
        env.store.ping().await,
        Err(StoreError::Database(_))
    ));
    assert!(matches!(
        env.store.get_run("t", run).await,
        Err(StoreError::Database(_))
    ));
    assert!(matches!(
        env.store.claim_tasks("w", 1, 1_000, None).await,
        Err(StoreError::Database(_))
    ));
    assert!(matches!(
        env.store.tenant_grants("t").await,
        Err(StoreError::Database(_))
    ));
    let t = env
        .store
        .transition(run, None, |_, _| Ok::<_, ()>(Decision::default()))
        .await;
    assert!(
        matches!(t, Err(TransitionError::Store(StoreError::Database(_)))),
        "{t:?}"
    );
    env.db.drop().await;
}

on_both_backends!(
    seq_is_gapless_under_concurrent_transitions,
    a_failed_transition_writes_nothing,
    concurrent_claims_hand_each_ready_task_to_exactly_one_worker,
    a_stale_attempt_cannot_change_a_task,
    heartbeat_extends_only_the_callers_unexpired_leases,
    expired_leases_come_oldest_first,
    retry_delays_and_expire_task_timers,
    create_run_is_idempotent,
    list_runs_pages_every_run_exactly_once,
    list_uncertain_pages_every_record_exactly_once,
    uncertain_records_and_occurrences,
    notifications_claim_deliver_and_failure_are_fenced,
    definition_versions_and_the_current_one,
    tenant_grants_round_trip,
    json_values_round_trip_byte_equal,
    timestamps_decode_as_utc,
    a_closed_store_fails_every_call,
);
