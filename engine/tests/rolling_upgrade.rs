//! Rolling upgrades across a behaviour change (issue 22, item 3), on
//! PostgreSQL (SQLite runs one engine per file: no replica runs beside
//! another, so nothing is gated there).
//!
//! The release before `task_heartbeats` judged a lease by
//! `tasks.lease_expires_at` alone; since heartbeats moved to that table,
//! such a replica sharing the database expired leases that workers kept
//! alive through a new one. Here a replica of that release is its SQL,
//! kept verbatim (`fixtures/release_20261205/`), run on a connection of its
//! own beside the current engine: while it is connected the fleet stays at
//! behaviour level 0 and heartbeats extend the task's row too, so it sees
//! the lease held; once every engine has upgraded for the whole hold the
//! fleet is raised to level 1, heartbeats stop rewriting the row (what an
//! old replica would now misread), and an engine below the level is
//! refused at start. Level 2 (issue 23): a node that starts and ends in
//! one decision is one `node_passed` event, which a level-1 replica cannot
//! fold; below it, the `node_started` and `node_completed` it reads.
//! Level 3: a tool node's start and end ride on its call's events.

mod common;
use common::{Backend, TestDb, create_run};

use belay_engine::coordinator::Coordinator;
use belay_engine::store::FleetRefresh;
use belay_engine::store::fleet_level::BEHAVIOUR_LEVEL;
use sqlx::Connection;
use uuid::Uuid;

/// The previous release's lease sweeper (`$1`: limit).
const OLD_SWEEP: &str = include_str!("fixtures/release_20261205/expired_leases.sql");
/// The previous release's heartbeat.
const OLD_HEARTBEAT: &str = include_str!("fixtures/release_20261205/heartbeat.sql");

/// A replica of the previous release: a connection that, like it, names no
/// `application_name`.
async fn previous_release(db: &TestDb) -> sqlx::PgConnection {
    sqlx::PgConnection::connect(&db.url)
        .await
        .expect("previous release's connection")
}

/// The tasks the previous release's sweeper would judge expired now.
async fn old_sweep(conn: &mut sqlx::PgConnection) -> Vec<Uuid> {
    let rows: Vec<(Uuid, Uuid, i32)> = sqlx::query_as(OLD_SWEEP)
        .bind(100_i64)
        .fetch_all(conn)
        .await
        .expect("the previous release's sweep");
    rows.into_iter().map(|r| r.0).collect()
}

/// `refresh_fleet` of the coordinator's store with `hold_ms`.
async fn refresh(coord: &Coordinator, hold_ms: u64) -> i32 {
    coord
        .store()
        .refresh_fleet(FleetRefresh {
            level: BEHAVIOUR_LEVEL,
            hold_ms,
        })
        .await
        .expect("refresh")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_previous_release_beside_this_one_never_sees_a_heartbeated_lease_expire() {
    let (db, coord, _run) = create_run(Backend::Postgres, "belay_upgrade").await;
    assert_eq!(
        coord.store().fleet_level(),
        BEHAVIOUR_LEVEL,
        "a new database has had no older engine"
    );
    // As the migration leaves a database the previous release used.
    let raw = db.raw().await;
    assert_eq!(
        raw.execute("UPDATE fleet_level SET level = 0", None).await,
        1
    );
    assert_eq!(
        coord
            .store()
            .join_fleet(BEHAVIOUR_LEVEL)
            .await
            .expect("join"),
        0
    );
    let mut old = previous_release(&db).await;
    assert!(old_sweep(&mut old).await.is_empty());

    // A worker holds a task (60 s leases) through the new engine and
    // heartbeats it past the claim's lease.
    let store = coord.store();
    let task = coord.claim("w1", 1, 0).await.expect("claim").remove(0);
    let id = task.task_id.to_string();
    let attempt = u32::try_from(task.attempt).expect("attempt");
    store.advance_clock(30_000).await.expect("clock");
    let held = coord
        .heartbeat("w1", &[(id.clone(), attempt)])
        .await
        .expect("heartbeat");
    assert_eq!(held, vec![(id.clone(), attempt, true)]);
    store.advance_clock(40_000).await.expect("clock");
    assert_eq!(
        refresh(&coord, 0).await,
        0,
        "the previous release is connected"
    );
    assert!(
        old_sweep(&mut old).await.is_empty(),
        "the previous release judged a heartbeated lease expired"
    );
    assert_eq!(coord.sweep_expired_leases().await.expect("sweep"), 0);

    // Its heartbeats (a worker connected to it) are honoured here too.
    let extended: Vec<(Uuid, i32)> = sqlx::query_as(OLD_HEARTBEAT)
        .bind("w1")
        .bind(vec![task.task_id])
        .bind(vec![task.attempt])
        .bind(60_000_f64)
        .fetch_all(&mut old)
        .await
        .expect("the previous release's heartbeat");
    assert_eq!(extended, vec![(task.task_id, task.attempt)]);
    store.advance_clock(55_000).await.expect("clock");
    assert_eq!(coord.sweep_expired_leases().await.expect("sweep"), 0);

    // The previous release is gone: after the hold the fleet is raised.
    old.close().await.expect("close");
    let held = coord
        .heartbeat("w1", &[(id.clone(), attempt)])
        .await
        .expect("heartbeat");
    assert_eq!(held, vec![(id.clone(), attempt, true)]);
    assert_eq!(refresh(&coord, 20_000).await, 0, "the hold begins");
    store.advance_clock(21_000).await.expect("clock");
    assert_eq!(
        refresh(&coord, 20_000).await,
        BEHAVIOUR_LEVEL,
        "the hold has passed"
    );
    assert_eq!(store.fleet_level(), BEHAVIOUR_LEVEL);

    // Level 1 and up: a heartbeat leaves the task's row alone, so a replica of
    // the previous release would now misread the lease: the behaviour the
    // level kept from it while it could run.
    let row_version = "SELECT xmin::text || ':' || ctid::text FROM tasks WHERE task_id = $1";
    let before = raw.fetch_texts(row_version, task.task_id).await;
    let held = coord
        .heartbeat("w1", &[(id.clone(), attempt)])
        .await
        .expect("heartbeat");
    assert_eq!(held, vec![(id.clone(), attempt, true)]);
    assert_eq!(raw.fetch_texts(row_version, task.task_id).await, before);
    store.advance_clock(45_000).await.expect("clock");
    assert_eq!(coord.sweep_expired_leases().await.expect("sweep"), 0);
    let mut late = previous_release(&db).await;
    assert_eq!(old_sweep(&mut late).await, vec![task.task_id]);
    late.close().await.expect("close");

    // The level never goes down: an engine below it is refused at start,
    // and one at it joins.
    let err = store
        .join_fleet(0)
        .await
        .expect_err("below the fleet's level");
    let text = err.to_string();
    assert!(
        text.contains(&format!("behaviour level {BEHAVIOUR_LEVEL}"))
            && text.contains("implements level 0"),
        "{text}"
    );
    assert_eq!(
        store.join_fleet(BEHAVIOUR_LEVEL).await.expect("join"),
        BEHAVIOUR_LEVEL
    );
    assert_eq!(refresh(&coord, 0).await, BEHAVIOUR_LEVEL);
    raw.close().await;
    db.drop().await;
}

/// A replica that registered at a lower level and is still live keeps the
/// fleet's level, whatever the hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_replica_of_a_lower_level_keeps_the_fleet_below_it() {
    let (db, coord, _run) = create_run(Backend::Postgres, "belay_upgrade").await;
    let raw = db.raw().await;
    assert_eq!(
        raw.execute("UPDATE fleet_level SET level = 0", None).await,
        1
    );
    let older = db.store(1).await;
    // Joined (and refreshing) at level 0, as a release of level 0 that
    // knows the registry would.
    assert_eq!(older.join_fleet(0).await.expect("join"), 0);
    assert_eq!(refresh(&coord, 0).await, 0);
    // It stops refreshing; once it is not live any more, the fleet rises.
    older.close().await;
    coord
        .store()
        .advance_clock(belay_engine::store::fleet_level::REPLICA_LIVE_MS + 1_000)
        .await
        .expect("clock");
    assert_eq!(refresh(&coord, 0).await, BEHAVIOUR_LEVEL);
    raw.close().await;
    db.drop().await;
}

/// A replica of the previous release that is idle but for its `LISTEN`
/// connection (sqlx's `PgListener`, which both releases use, sends
/// `LISTEN "belay_tasks";LISTEN "belay_events";`, the channel quoted) is
/// recognised: the fleet stays below level 1 while it is connected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_previous_releases_listen_connection_keeps_the_fleet_below_level_one() {
    let (db, coord, _run) = create_run(Backend::Postgres, "belay_upgrade").await;
    let raw = db.raw().await;
    assert_eq!(
        raw.execute("UPDATE fleet_level SET level = 0", None).await,
        1
    );
    assert_eq!(
        coord
            .store()
            .join_fleet(BEHAVIOUR_LEVEL)
            .await
            .expect("join"),
        0
    );
    let mut listener = sqlx::postgres::PgListener::connect(&db.url)
        .await
        .expect("the previous release's LISTEN connection");
    listener
        .listen_all(["belay_tasks", "belay_events"])
        .await
        .expect("listen");
    assert_eq!(
        refresh(&coord, 0).await,
        0,
        "the previous release's LISTEN connection is open"
    );
    drop(listener);
    // Its backend goes once the server sees the connection closed.
    let mut level = 0;
    for _ in 0..50 {
        level = refresh(&coord, 0).await;
        if level == BEHAVIOUR_LEVEL {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(level, BEHAVIOUR_LEVEL, "the previous release is gone");
    raw.close().await;
    db.drop().await;
}

/// An engine running when the fleet's level is raised past its own (it
/// was not seen live for a whole hold: stopped, or cut off from the
/// database) stops serving, naming both levels, as it would refuse to
/// start; it does not go on beside a fleet whose behaviour it misreads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_engine_stops_once_the_fleet_is_raised_past_it() {
    use belay_engine::server::{Engine, EngineOptions, Listeners, ServeError};
    let db = common::TestDb::create(Backend::Postgres, "belay_upgrade").await;
    let engine = Engine::start(EngineOptions::new(db.url.clone(), 4))
        .await
        .expect("engine");
    let coord = std::sync::Arc::clone(engine.coordinator());
    assert_eq!(
        coord.refresh_fleet_level().await.expect("refresh"),
        BEHAVIOUR_LEVEL
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let served = tokio::spawn(async move {
        engine
            .serve(Listeners::grpc_only(listener), std::future::pending::<()>())
            .await
    });
    let raw = db.raw().await;
    let raised = format!("UPDATE fleet_level SET level = {}", BEHAVIOUR_LEVEL + 1);
    assert_eq!(raw.execute(&raised, None).await, 1);
    let ended = tokio::time::timeout(std::time::Duration::from_secs(20), served)
        .await
        .expect("the engine stopped")
        .expect("joined");
    match ended {
        Err(ServeError::Outranked(text)) => assert!(
            text.contains(&format!("behaviour level {}", BEHAVIOUR_LEVEL + 1))
                && text.contains(&format!("implements level {BEHAVIOUR_LEVEL}")),
            "{text}"
        ),
        other => panic!("expected the engine to stop outranked, got {other:?}"),
    }
    assert!(coord.refresh_fleet_level().await.is_err());
    raw.close().await;
    db.drop().await;
}

/// Nodes that pass in one decision on either side of a wait: the first
/// in the run's start (the coordinator's), the others in the signal's
/// transition (the store's).
const PASSING: &str = r#"kind: workflow
name: passing
nodes:
  - {id: first, type: set, values: {a: 1}, next: hold}
  - {id: hold, type: wait, signal: go, next: second}
  - {id: second, type: set, values: {b: 2}, next: done}
  - {id: done, type: succeed, output: "${ .vars }"}
"#;

/// Put the fleet at `level` (as a migration or a raise after the hold
/// leaves it) and have the coordinator's engine read it.
async fn set_level(raw: &common::Raw, coord: &Coordinator, level: i32) {
    let sql = format!("UPDATE fleet_level SET level = {level}");
    assert_eq!(raw.execute(&sql, None).await, 1);
    let joined = coord.store().join_fleet(BEHAVIOUR_LEVEL).await;
    assert_eq!(joined.expect("join"), level);
}

/// Start a run of `workflow` for tenant `t` (input `{}`), by caller `c`
/// holding `grants`.
async fn start(
    coord: &Coordinator,
    workflow: &str,
    key: &str,
    grants: &[&str],
) -> belay_engine::store::RunRow {
    let (run, _) = coord
        .start_run(belay_engine::coordinator::StartRun {
            tenant: "t".into(),
            workflow: workflow.into(),
            input_json: "{}".into(),
            idempotency_key: key.into(),
            caller: "c".into(),
            caller_grants: grants.iter().map(|g| (*g).to_owned()).collect(),
        })
        .await
        .expect("start");
    run
}

/// Start a `PASSING` run, signal it, and return its event kinds.
async fn passing_run(coord: &Coordinator, key: &str) -> Vec<String> {
    let run = start(coord, "passing", key, &[]).await;
    let id = run.run_id.to_string();
    let (done, _) = coord
        .signal_run("t", &id, "go", "s1", "{}", "test")
        .await
        .expect("signal");
    assert_eq!(done.status, "completed");
    assert_eq!(done.output, Some(serde_json::json!({"a": 1, "b": 2})));
    coord
        .store()
        .list_events(run.run_id, 0, 100)
        .await
        .expect("events")
        .into_iter()
        .map(|e| e.kind)
        .collect()
}

/// Behaviour level 2 (issue 23): a node that starts and ends in one
/// decision is one `node_passed` event, which a replica of level 1 cannot
/// fold; below level 2 it is a `node_started` and a `node_completed`, as
/// every release writes, and both runs end alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_level_two_a_node_is_started_and_completed_and_from_it_passes() {
    let db = TestDb::create(Backend::Postgres, "belay_upgrade").await;
    let coord = Coordinator::new(
        db.store(4).await,
        belay_engine::coordinator::CoordinatorConfig::default(),
    );
    coord
        .register_bundle(
            "t",
            vec![belay_engine::definitions::SourceFile {
                path: "passing.yaml".into(),
                content: PASSING.into(),
            }],
        )
        .await
        .expect("register");
    let raw = db.raw().await;
    set_level(&raw, &coord, 1).await;
    let wait = [
        "node_started",
        "wait_started",
        "signal_received",
        "signal_consumed",
        "node_completed",
    ];
    let pair = ["node_started", "node_completed"];
    let level_one: Vec<&str> = [
        &["run_started"][..],
        &pair,
        &wait,
        &pair,
        &pair,
        &["run_completed"],
    ]
    .concat();
    assert_eq!(passing_run(&coord, "k1").await, level_one);

    // The fleet raised (as after the hold): the same run, three events fewer.
    set_level(&raw, &coord, 2).await;
    let level_two: Vec<&str> = [
        &["run_started", "node_passed"][..],
        &wait,
        &["node_passed", "node_passed", "run_completed"],
    ]
    .concat();
    assert_eq!(passing_run(&coord, "k2").await, level_two);
    raw.close().await;
    db.drop().await;
}

/// A tool node, then `succeed`.
const CALLING: &str = r#"kind: workflow
name: calling
nodes:
  - {id: call, type: tool, tool: noop, args: {i: 1}, grants: [crm.write], next: done}
  - {id: done, type: succeed}
"#;

/// The idempotent tool `CALLING` calls.
const NOOP: &str = r#"TOOLS:
  noop(i: number) -> {ok: boolean}
    description: "Does nothing"
    type: http
    endpoint: "/noop"
    permission: crm.write
    repeat_safety: idempotent
"#;

/// Start a `CALLING` run, have worker `w` claim, dispatch and complete its
/// call, and return its event kinds.
async fn calling_run(coord: &Coordinator, key: &str) -> Vec<String> {
    let run = start(coord, "calling", key, &["crm.write"]).await;
    let task = common::claim_of(coord, "w", run.run_id, "tool_call").await;
    let id = task.task_id.to_string();
    let attempt = u32::try_from(task.attempt).expect("attempt");
    coord.dispatch("w", &id, attempt).await.expect("dispatch");
    coord
        .complete("w", &id, attempt, r#"{"ok": true}"#)
        .await
        .expect("complete");
    let events = coord
        .store()
        .list_events(run.run_id, 0, 100)
        .await
        .expect("events");
    assert_eq!(
        events.last().map(|e| e.kind.as_str()),
        Some("run_completed")
    );
    events.into_iter().map(|e| e.kind).collect()
}

/// Behaviour level 3 (issue 23): a tool node's start rides on its call's
/// `tool_call_scheduled` (the coordinator's start) and its end on the
/// call's `tool_call_completed` (the store's transition), which a replica
/// of level 2 would not read as the node's; below level 3 the node's own
/// `node_started` and `node_completed` are written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_level_three_a_tool_node_is_started_and_completed_and_from_it_folds() {
    let db = TestDb::create(Backend::Postgres, "belay_upgrade").await;
    let coord = common::coordinator(db.store(4).await, &["t"], NOOP, CALLING, &["crm.write"]).await;
    let raw = db.raw().await;
    let call = ["tool_call_dispatched", "tool_call_completed"];
    set_level(&raw, &coord, 2).await;
    let level_two: Vec<&str> = [
        &["run_started", "node_started", "tool_call_scheduled"][..],
        &call,
        &["node_completed", "node_passed", "run_completed"],
    ]
    .concat();
    assert_eq!(calling_run(&coord, "k2").await, level_two);
    set_level(&raw, &coord, 3).await;
    let level_three: Vec<&str> = [
        &["run_started", "tool_call_scheduled"][..],
        &call,
        &["node_passed", "run_completed"],
    ]
    .concat();
    assert_eq!(calling_run(&coord, "k3").await, level_three);
    raw.close().await;
    db.drop().await;
}

/// A live replica of level 1 (the previous release, which cannot fold
/// `node_passed`) keeps the fleet at level 1, so nothing is written in
/// the new form beside it; once it is gone the fleet rises to this build's level.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_level_one_replica_keeps_the_fleet_from_writing_node_passed() {
    use belay_engine::machine::level::NODE_PASSED;
    use belay_engine::store::fleet_level::{REPLICA_LIVE_MS, machine_level};
    let (db, coord, _run) = create_run(Backend::Postgres, "belay_upgrade").await;
    let raw = db.raw().await;
    set_level(&raw, &coord, 1).await;
    let older = db.store(1).await;
    assert_eq!(older.join_fleet(1).await.expect("join"), 1);
    assert_eq!(refresh(&coord, 0).await, 1);
    assert!(machine_level(coord.store().fleet_level()) < NODE_PASSED);
    older.close().await;
    coord
        .store()
        .advance_clock(REPLICA_LIVE_MS + 1_000)
        .await
        .expect("clock");
    assert_eq!(refresh(&coord, 0).await, BEHAVIOUR_LEVEL);
    assert!(machine_level(coord.store().fleet_level()) >= NODE_PASSED);
    raw.close().await;
    db.drop().await;
}
