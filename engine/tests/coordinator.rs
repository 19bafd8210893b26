//! Coordinator and store on both backends (PostgreSQL and SQLite; every
//! test runs once per backend, as `postgres::<name>` and `sqlite::<name>`):
//! claims, heartbeats, fencing, dispatch, the lease sweeper, definition
//! versions, health. Lease expiry is made deterministic with
//! `Store::expire_task_timers` instead of sleeping.

mod common;
use common::{Backend, TestDb};

use std::sync::Arc;

use belay_engine::coordinator::{Coordinator, CoordinatorConfig, CoordinatorError, StartRun};
use belay_engine::definitions::SourceFile;
use belay_engine::machine::FailureClass;
use belay_engine::store::{Store, StoreError};
use belay_proto::wire::{ModelCallResult, ToolUse, Usage};
use serde_json::json;

async fn setup(backend: Backend) -> (TestDb, Arc<Coordinator>, String) {
    common::create_run(backend, "belay_c").await
}

async fn expire_leases(coord: &Coordinator) {
    coord
        .store()
        .expire_task_timers(None)
        .await
        .expect("expire");
}

fn model_result_with_create() -> String {
    serde_json::to_string(&ModelCallResult {
        content: None,
        tool_calls: vec![ToolUse {
            id: "tu".into(),
            name: "create".into(),
            arguments: r#"{"email":"e"}"#.into(),
        }],
        usage: Usage::default(),
        finish_reason: None,
    })
    .expect("json")
}

/// Complete the first model call with a `create` proposal and claim the
/// resulting tool call as worker `w1`.
async fn claim_tool_call(coord: &Coordinator) -> belay_engine::store::ClaimedTask {
    let model = coord.claim("w1", 1, 0).await.expect("claim").remove(0);
    coord
        .complete(
            "w1",
            &model.task_id.to_string(),
            1,
            &model_result_with_create(),
        )
        .await
        .expect("complete");
    coord.claim("w1", 1, 0).await.expect("claim").remove(0)
}

async fn claims_are_fenced_by_attempt(backend: Backend) {
    let (db, coord, _run) = setup(backend).await;
    // Nothing ready for an unknown kind of wait: an empty claim returns without error.
    let tasks = coord.claim("w1", 4, 0).await.expect("claim");
    assert_eq!(tasks.len(), 1);
    let task = &tasks[0];
    assert_eq!((task.kind.as_str(), task.attempt), ("model_call", 1));
    assert!(
        coord
            .claim("w2", 4, 50)
            .await
            .expect("empty claim")
            .is_empty()
    );
    assert_eq!(
        coord.store().next_ready_in_ms().await.expect("next ready"),
        None
    );

    let id = task.task_id.to_string();
    let held = coord
        .heartbeat("w1", &[(id.clone(), 1), (id.clone(), 2)])
        .await
        .expect("heartbeat");
    assert_eq!(held, vec![(id.clone(), 1, true), (id.clone(), 2, false)]);
    assert!(
        !coord.heartbeat("w2", &[(id.clone(), 1)]).await.expect("hb")[0].2,
        "another worker's lease"
    );

    let stale = coord
        .complete("w1", &id, 2, &model_result_with_create())
        .await;
    assert!(
        matches!(stale, Err(CoordinatorError::FailedPrecondition(ref m)) if m.contains("stale attempt")),
        "{stale:?}"
    );
    let bad = coord.complete("w1", &id, 1, "{not json").await;
    assert!(
        matches!(bad, Err(CoordinatorError::InvalidArgument(_))),
        "{bad:?}"
    );
    coord
        .complete("w1", &id, 1, &model_result_with_create())
        .await
        .expect("complete");
    // The same attempt reporting again (its reply was lost) is accepted, and writes nothing.
    let before = coord
        .store()
        .list_events(task.run_id, 0, 1000)
        .await
        .expect("events")
        .len();
    coord
        .complete("w1", &id, 1, &model_result_with_create())
        .await
        .expect("duplicate complete");
    let after = coord
        .store()
        .list_events(task.run_id, 0, 1000)
        .await
        .expect("events")
        .len();
    assert_eq!(before, after);
    let late_fail = coord
        .fail("w1", &id, 1, "boom", FailureClass::NotSent, None)
        .await;
    assert!(
        matches!(late_fail, Err(CoordinatorError::FailedPrecondition(_))),
        "{late_fail:?}"
    );
    db.drop().await;
}

async fn a_reconcile_call_whose_lease_expires_after_dispatch_is_uncertain(backend: Backend) {
    let (db, coord, run_id) = setup(backend).await;
    let tool = claim_tool_call(&coord).await;
    assert_eq!(tool.kind, "tool_call");
    let id = tool.task_id.to_string();
    coord.dispatch("w1", &id, 1).await.expect("dispatch");
    coord
        .dispatch("w1", &id, 1)
        .await
        .expect("the same attempt may ask again");
    expire_leases(&coord).await;
    // An expired lease can no longer report or dispatch... it is judged by the sweeper.
    assert_eq!(coord.sweep_expired_leases().await.expect("sweep"), 1);
    assert_eq!(
        coord.sweep_expired_leases().await.expect("sweep again"),
        0,
        "judged exactly once"
    );
    let run = coord.get_run("t", &run_id).await.expect("run");
    assert_eq!(run.status, "paused");
    let rows = coord
        .store()
        .uncertain_for_run(run.run_id)
        .await
        .expect("uncertain");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].arguments, json!({"email": "e"}));
    assert_eq!(rows[0].worker_id.as_deref(), Some("w1"));
    assert_eq!(rows[0].attempts[0]["attempt"], 1);
    // Nothing is claimable: the task is uncertain and the run paused.
    assert!(coord.claim("w2", 4, 0).await.expect("claim").is_empty());
    // The worker that lost the lease reports the real result after all: it
    // resolves the outcome (recorded as a late result) and the run resumes.
    coord
        .complete("w1", &id, 1, r#"{"id":"acc_1"}"#)
        .await
        .expect("late result accepted");
    let row = &coord
        .store()
        .uncertain_for_run(run.run_id)
        .await
        .expect("uncertain")[0];
    assert_eq!(row.status, "resolved");
    assert_eq!(row.resolved_via.as_deref(), Some("late_result"));
    assert_eq!(
        coord.get_run("t", &run_id).await.expect("run").status,
        "running"
    );
    // Reported again: the same result from the same attempt writes nothing.
    let seq = coord.get_run("t", &run_id).await.expect("run").last_seq;
    coord
        .complete("w1", &id, 1, r#"{"id":"acc_1"}"#)
        .await
        .expect("duplicate");
    assert_eq!(
        coord.get_run("t", &run_id).await.expect("run").last_seq,
        seq
    );
    db.drop().await;
}

async fn a_lease_lost_before_dispatch_is_retried_with_a_new_attempt(backend: Backend) {
    let (db, coord, run_id) = setup(backend).await;
    let tool = claim_tool_call(&coord).await;
    expire_leases(&coord).await;
    let refused = coord.dispatch("w1", &tool.task_id.to_string(), 1).await;
    assert!(
        matches!(refused, Err(CoordinatorError::FailedPrecondition(ref m)) if m.contains("expired")),
        "{refused:?}"
    );
    assert_eq!(coord.sweep_expired_leases().await.expect("sweep"), 1);
    coord
        .store()
        .expire_task_timers(None)
        .await
        .expect("skip backoff");
    let again = coord.claim("w2", 1, 0).await.expect("claim").remove(0);
    assert_eq!((again.task_id, again.attempt), (tool.task_id, 2));
    assert_eq!(again.idempotency_key, tool.idempotency_key);
    coord
        .dispatch("w2", &again.task_id.to_string(), 2)
        .await
        .expect("dispatch");
    coord
        .complete("w2", &again.task_id.to_string(), 2, r#"{"id":"x"}"#)
        .await
        .expect("complete");
    let run = coord.get_run("t", &run_id).await.expect("run");
    assert_eq!(run.status, "running", "the next model call is scheduled");
    db.drop().await;
}

async fn cancel_stops_a_run_and_its_tasks(backend: Backend) {
    let (db, coord, run_id) = setup(backend).await;
    let run = coord
        .cancel_run("t", &run_id, "no longer needed")
        .await
        .expect("cancel");
    assert_eq!(
        (run.status.as_str(), run.status_reason.as_str()),
        ("cancelled", "no longer needed")
    );
    assert!(coord.claim("w", 4, 0).await.expect("claim").is_empty());
    assert!(matches!(
        coord.cancel_run("t", &run_id, "").await,
        Err(CoordinatorError::FailedPrecondition(_))
    ));
    assert!(matches!(
        coord.get_run("other", &run_id).await,
        Err(CoordinatorError::NotFound(_))
    ));
    db.drop().await;
}

async fn registering_older_content_again_makes_it_current_and_moving_a_file_is_no_new_version(
    backend: Backend,
) {
    let (db, coord, _run) = setup(backend).await;
    let register = |content: &str, path: &str| {
        let coord = Arc::clone(&coord);
        let (content, path) = (content.to_owned(), path.to_owned());
        async move {
            coord
                .register_bundle("t", vec![SourceFile { path, content }])
                .await
                .expect("register")
        }
    };
    let b = common::CREATE_AGENT.replace("model: m", "model: m2");
    let v2 = register(&b, "x.yaml").await;
    assert_eq!((v2[0].0.version, v2[0].1), (2, true));
    // A again: unchanged content, but current again.
    let again = register(common::CREATE_AGENT, "x.yaml").await;
    assert_eq!((again[0].0.version, again[0].1), (1, false));
    let latest = coord
        .store()
        .latest_definition("t", "agent", "a")
        .await
        .expect("latest")
        .expect("row");
    assert_eq!(latest.version, 1);
    // The same content from another path (or after a comment line) is the same version.
    let moved = register(
        &format!("# a comment\n{}", common::CREATE_AGENT),
        "elsewhere/renamed.yaml",
    )
    .await;
    assert_eq!((moved[0].0.version, moved[0].1), (1, false));
    db.drop().await;
}

async fn bad_text_is_refused_as_invalid_not_as_an_outage(backend: Backend) {
    let (db, coord, run_id) = setup(backend).await;
    let start = |tenant: &str, key: &str| StartRun {
        tenant: tenant.into(),
        workflow: "w".into(),
        input_json: "{}".into(),
        idempotency_key: key.into(),
        caller: "c".into(),
        caller_grants: vec![],
    };
    for (req, needle) in [
        (start("t\0", "k2"), "NUL"),
        (start("t", &"k".repeat(3000)), "more than the limit"),
        (start("t", "k"), "different request"),
    ] {
        let mut req = req;
        if needle == "different request" {
            req.input_json = r#"{"other": 1}"#.into();
        }
        let err = coord.start_run(req).await.expect_err("refused");
        assert!(
            matches!(&err, CoordinatorError::InvalidArgument(m) | CoordinatorError::FailedPrecondition(m) if m.contains(needle)),
            "{err:?}"
        );
    }
    let err = coord
        .cancel_run("t", &run_id, "why\0")
        .await
        .expect_err("refused");
    assert!(
        matches!(err, CoordinatorError::InvalidArgument(_)),
        "{err:?}"
    );
    let long_id = "x".repeat(100_000);
    let err = coord
        .get_run("t", &long_id)
        .await
        .expect_err("refused")
        .to_string();
    assert!(
        err.len() < 300,
        "the bad value is not echoed whole: {} bytes",
        err.len()
    );
    db.drop().await;
}

async fn only_the_lease_holder_may_dispatch_or_report(backend: Backend) {
    let (db, coord, _run) = setup(backend).await;
    let tool = claim_tool_call(&coord).await;
    let id = tool.task_id.to_string();
    let other = coord.dispatch("intruder", &id, 1).await;
    assert!(
        matches!(&other, Err(CoordinatorError::FailedPrecondition(m)) if m.contains("another worker")),
        "{other:?}"
    );
    let other = coord
        .fail("intruder", &id, 1, "x", FailureClass::Rejected, None)
        .await;
    assert!(
        matches!(other, Err(CoordinatorError::FailedPrecondition(_))),
        "{other:?}"
    );
    coord.dispatch("w1", &id, 1).await.expect("the holder may");
    db.drop().await;
}

async fn one_run_that_cannot_be_judged_does_not_stop_the_sweeper(backend: Backend) {
    let (db, coord, first_run) = setup(backend).await;
    // A second run whose model call is also leased.
    coord
        .start_run(StartRun {
            tenant: "t".into(),
            workflow: "w".into(),
            input_json: "{}".into(),
            idempotency_key: "k2".into(),
            caller: "c".into(),
            caller_grants: vec!["crm.write".into()],
        })
        .await
        .expect("start");
    let claimed = coord.claim("w1", 2, 0).await.expect("claim");
    assert_eq!(claimed.len(), 2);
    // Corrupt the first run's history (an unknown event type, as a newer
    // engine version might write).
    let raw = db.raw().await;
    let changed = raw
        .execute(
            r#"UPDATE events SET payload = '{"type": "from_the_future"}' WHERE run_id = $1 AND seq = 1"#,
            Some(uuid::Uuid::parse_str(&first_run).expect("uuid")),
        )
        .await;
    assert_eq!(changed, 1);
    raw.close().await;
    expire_leases(&coord).await;
    assert_eq!(
        coord.sweep_expired_leases().await.expect("sweep"),
        1,
        "the healthy run's lease is judged"
    );
    db.drop().await;
}

async fn two_replicas_with_their_own_state_caches_agree_with_a_full_fold(backend: Backend) {
    let (db, coord_a, run_id) = setup(backend).await;
    let store_b = Store::connect(&db.url, 2).await;
    let coord_b = match backend {
        Backend::Postgres => Coordinator::new(
            store_b.expect("connect"),
            CoordinatorConfig {
                lease_ms: 60_000,
                sweep_interval_ms: 1_000,
                ..CoordinatorConfig::default()
            },
        ),
        Backend::Sqlite => {
            // One engine process per SQLite file: a second store on the same
            // file is refused, so "replica B" is the same store here (its
            // cache is the one A uses; the fold must still agree).
            let err = store_b.expect_err("a second store on one SQLite file");
            assert!(
                matches!(err, StoreError::Config(ref m) if m.contains("in use by another engine process")),
                "{err:?}"
            );
            Arc::clone(&coord_a)
        }
    };
    // Replica A completes the model call (and caches the state), replica B
    // dispatches and completes the tool call (A's cache is now behind), then
    // A handles the next model call: it must fold only the tail, correctly.
    let tool = claim_tool_call(&coord_a).await;
    let id = tool.task_id.to_string();
    coord_b
        .dispatch("w1", &id, 1)
        .await
        .expect("dispatch via B");
    coord_b
        .complete("w1", &id, 1, r#"{"id":"x"}"#)
        .await
        .expect("complete via B");
    let model = coord_a.claim("w1", 1, 0).await.expect("claim").remove(0);
    let answer = serde_json::to_string(&ModelCallResult {
        content: Some("done".into()),
        tool_calls: vec![],
        usage: Usage::default(),
        finish_reason: None,
    })
    .expect("json");
    coord_a
        .complete("w1", &model.task_id.to_string(), 1, &answer)
        .await
        .expect("complete via A");
    let run = coord_a.get_run("t", &run_id).await.expect("run");
    assert_eq!(run.status, "completed");
    let folded = coord_a.store().run_state(run.run_id).await.expect("fold");
    assert_eq!(folded.last_seq, run.last_seq as u64);
    assert_eq!(folded.output, Some(serde_json::json!("done")));
    db.drop().await;
}

async fn health_follows_the_database(backend: Backend) {
    let (db, coord, _run) = setup(backend).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let auth = belay_engine::auth::Authenticator::new(
        coord.store().clone(),
        belay_engine::admin::AdminAuth::default(),
    );
    let server = tokio::spawn(belay_engine::api::serve(
        Arc::clone(&coord),
        auth,
        listener,
        async {
            let _ = stop_rx.await;
        },
    ));
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    // A service, and the server as a whole (the empty name: what the
    // kubelet's gRPC probe and `belay health` ask).
    let mut watches = Vec::new();
    for service in ["belay.v1.WorkerService", ""] {
        let watch = health
            .watch(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .expect("watch")
            .into_inner();
        watches.push(watch);
    }
    use tonic_health::pb::health_check_response::ServingStatus;
    for watch in &mut watches {
        let first = tokio::time::timeout(std::time::Duration::from_secs(10), watch.message())
            .await
            .expect("first status within 10 s")
            .expect("status")
            .expect("some");
        assert_eq!(first.status, ServingStatus::Serving as i32);
    }
    // The database goes away (here: the engine's pool is closed).
    coord.store().close().await;
    for watch in &mut watches {
        let next = tokio::time::timeout(std::time::Duration::from_secs(20), watch.message())
            .await
            .expect("a status change within 20 s")
            .expect("status")
            .expect("some");
        assert_eq!(next.status, ServingStatus::NotServing as i32);
    }
    // Shutdown ends even with the health watch still open (bounded grace).
    let _ = stop_tx.send(());
    let stopped = tokio::time::timeout(std::time::Duration::from_secs(15), server).await;
    assert!(stopped.is_ok(), "the server did not stop within the grace");
    drop(watches);
    db.drop().await;
}

/// PostgreSQL only (SQLite has one engine process per file): a replica
/// hears another's wake-ups through `LISTEN/NOTIFY` once each has said hello
/// (`belay-store`'s `postgres/wakes.rs`: an engine that has heard no other listener sends none).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_hears_the_wake_ups_of_another_once_it_said_hello() {
    let (db, coord_a, _run) = setup(Backend::Postgres).await;
    let background = coord_a.spawn_background();
    let store_b = Store::connect(&db.url, 2).await.expect("connect B");
    // B's listener: B commits nothing, so every wake-up it hears for tasks
    // came from A, through PostgreSQL.
    let (tx, mut heard) = tokio::sync::mpsc::unbounded_channel();
    let listener = {
        let store_b = store_b.clone();
        tokio::spawn(async move {
            let _ = store_b
                .listen(&mut |w| {
                    if w == belay_engine::store::Wake::Tasks {
                        let _ = tx.send(());
                    }
                })
                .await;
        })
    };
    let seq_before = store_b.tasks_wake_seq();
    // A learns of B from B's hello (asynchronously): start runs until one's
    // wake-up reaches B; the first normally does.
    let mut reached = false;
    for i in 0..20 {
        coord_a
            .start_run(StartRun {
                tenant: "t".into(),
                workflow: "w".into(),
                input_json: "{}".into(),
                idempotency_key: format!("wake-{i}"),
                caller: "c".into(),
                caller_grants: vec!["crm.write".into()],
            })
            .await
            .expect("start on A");
        if tokio::time::timeout(std::time::Duration::from_millis(500), heard.recv())
            .await
            .is_ok()
        {
            reached = true;
            break;
        }
    }
    assert!(reached, "no wake-up of A reached B's listener");
    assert!(
        store_b.tasks_wake_seq() > seq_before,
        "a wake-up heard counts as tasks maybe claimable"
    );
    listener.abort();
    background.iter().for_each(|h| h.abort());
    db.drop().await;
}

/// PostgreSQL only: when the `LISTEN` connection is lost (sqlx reconnects
/// it on its own), whatever was notified meanwhile is gone, so the
/// listener wakes every claimer to look again and the wake count moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_listen_connection_wakes_claimers_to_look_again() {
    let db = TestDb::create(Backend::Postgres, "belay_c").await;
    let store = db.store(2).await;
    let (tx, mut heard) = tokio::sync::mpsc::unbounded_channel();
    let listener = {
        let store = store.clone();
        tokio::spawn(async move {
            let _ = store
                .listen(&mut |w| {
                    let _ = tx.send(w);
                })
                .await;
        })
    };
    let raw = db.raw().await;
    // Wait for the LISTEN connection, then end it from the server side.
    let listening = "SELECT count(*)::text FROM pg_stat_activity
                     WHERE datname = current_database() AND query LIKE 'LISTEN%' AND $1 IS NOT NULL";
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while raw.fetch_texts(listening, uuid::Uuid::nil()).await != vec!["1".to_owned()] {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no LISTEN connection"
        );
        tokio::task::yield_now().await;
    }
    let seq = store.tasks_wake_seq();
    let ended = raw
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = current_database() AND query LIKE 'LISTEN%' AND $1 IS NOT NULL",
            Some(uuid::Uuid::nil()),
        )
        .await;
    assert_eq!(ended, 1);
    let woke = tokio::time::timeout(std::time::Duration::from_secs(20), async {
        while let Some(w) = heard.recv().await {
            if w == belay_engine::store::Wake::Tasks {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(
        woke,
        Ok(true),
        "no wake-up after the LISTEN connection was lost"
    );
    assert!(store.tasks_wake_seq() > seq);
    listener.abort();
    raw.close().await;
    store.close().await;
    db.drop().await;
}

/// PostgreSQL only (SQLite extends the task's row): a heartbeat writes
/// `task_heartbeats`, never the task's row in the hot `tasks` table, and
/// its extension is purged once the task has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_heartbeat_leaves_the_task_row_alone_and_its_extension_goes_when_the_task_ends() {
    let (db, coord, _run) = setup(Backend::Postgres).await;
    let task = coord.claim("w1", 1, 0).await.expect("claim").remove(0);
    let id = task.task_id.to_string();
    let attempt = u32::try_from(task.attempt).expect("attempt");
    let raw = db.raw().await;
    let row_version = "SELECT xmin::text || ':' || ctid::text FROM tasks WHERE task_id = $1";
    let before = raw.fetch_texts(row_version, task.task_id).await;
    let held = coord
        .heartbeat("w1", &[(id.clone(), attempt)])
        .await
        .expect("heartbeat");
    assert_eq!(held, vec![(id.clone(), attempt, true)]);
    assert_eq!(
        raw.fetch_texts(row_version, task.task_id).await,
        before,
        "the heartbeat rewrote the task's row"
    );
    let extension = raw
        .fetch_texts(
            "SELECT attempt::text FROM task_heartbeats WHERE task_id = $1",
            task.task_id,
        )
        .await;
    assert_eq!(extension, vec![task.attempt.to_string()]);
    // Nothing to purge while the lease is held.
    assert_eq!(
        coord.store().purge_stale_heartbeats().await.expect("purge"),
        0
    );
    coord
        .complete("w1", &id, attempt, &model_result_with_create())
        .await
        .expect("complete");
    assert_eq!(
        coord.store().purge_stale_heartbeats().await.expect("purge"),
        1
    );
    raw.close().await;
    db.drop().await;
}

/// A long-poll claim answers (empty) as soon as the engine begins to shut
/// down, instead of holding the graceful shutdown for its `wait_ms`; a
/// claim that finds a task still gets it, and later claims answer at once.
async fn a_long_poll_claim_answers_when_the_engine_stops(backend: Backend) {
    let (db, coord, _run) = setup(backend).await;
    // The run's first task, so nothing more is ready.
    let first = coord.claim("w1", 1, 0).await.expect("claim");
    assert_eq!(first.len(), 1);
    let waiting = {
        let coord = Arc::clone(&coord);
        tokio::spawn(async move { coord.claim("w2", 1, 30_000).await })
    };
    // Let the claim look and begin to wait (it re-looks every second, so a
    // stop before it waits is seen too).
    tokio::task::yield_now().await;
    coord.stop_claims();
    // The guard is far below the claim's 30 s: only a stopped claim answers.
    let answered = tokio::time::timeout(std::time::Duration::from_secs(10), waiting)
        .await
        .expect("the claim answered before its wait_ms")
        .expect("join")
        .expect("claim");
    assert!(answered.is_empty(), "{answered:?}");
    let again = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        coord.claim("w2", 1, 30_000),
    )
    .await
    .expect("a claim after the stop answers at once")
    .expect("claim");
    assert!(again.is_empty());
    db.drop().await;
}

on_both_backends!(
    claims_are_fenced_by_attempt,
    a_reconcile_call_whose_lease_expires_after_dispatch_is_uncertain,
    a_lease_lost_before_dispatch_is_retried_with_a_new_attempt,
    cancel_stops_a_run_and_its_tasks,
    registering_older_content_again_makes_it_current_and_moving_a_file_is_no_new_version,
    bad_text_is_refused_as_invalid_not_as_an_outage,
    only_the_lease_holder_may_dispatch_or_report,
    one_run_that_cannot_be_judged_does_not_stop_the_sweeper,
    two_replicas_with_their_own_state_caches_agree_with_a_full_fold,
    health_follows_the_database,
    a_long_poll_claim_answers_when_the_engine_stops,
);
