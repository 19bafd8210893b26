//! An engine outage longer than the lease (issue 22), through the
//! coordinator on both backends: every engine down (or the database
//! unreachable) while a worker goes on with a dispatched `reconcile` call
//! and gets its answer. The restarted fleet gives the worker a lease length
//! to re-assert its lease before judging any (`coordinator/fleet.rs`), so
//! the worker's real result, reported for its still-current attempt, is
//! recorded: no uncertain outcome that cannot be true, no second request.
//! Deterministic: the outage is the database clock moved on
//! (`Store::advance_clock`) while nothing records the fleet's liveness.

mod common;
use common::{Backend, TestDb};

use std::sync::Arc;

use belay_engine::coordinator::Coordinator;
use belay_engine::store::FleetReset;

/// The common test coordinator's lease, ms.
const LEASE_MS: i64 = 60_000;

async fn setup(backend: Backend) -> (TestDb, Arc<Coordinator>, String) {
    common::create_run(backend, "belay_outage").await
}

/// The fleet is up (its first record, before any lease: no grace); the
/// create call is dispatched; then every engine is down for two leases
/// while the worker goes on, and an engine starts: the fleet was silent.
async fn dispatched_create_then_outage(coord: &Coordinator) -> String {
    let store = coord.store();
    store.fleet_alive(FleetReset::No).await.expect("alive");
    let task = common::dispatched_create(coord).await;
    store.advance_clock(2 * LEASE_MS).await.expect("clock");
    store
        .fleet_alive(FleetReset::IfSilentFor(coord.outage_gap_ms()))
        .await
        .expect("alive");
    task
}

async fn kinds(coord: &Coordinator, run_id: &str) -> Vec<String> {
    let events = coord
        .list_events("t", run_id, 0, 1000)
        .await
        .expect("events");
    events.into_iter().map(|e| e.kind).collect()
}

async fn a_result_reported_after_an_outage_longer_than_the_lease_is_recorded(backend: Backend) {
    let (db, coord, run_id) = setup(backend).await;
    // The worker goes on through the outage, and the tool answers it.
    let task = dispatched_create_then_outage(&coord).await;
    // The lease ran out by the clock, but no engine could hear it: not judged.
    assert_eq!(coord.sweep_expired_leases().await.expect("sweep"), 0);
    // The worker re-asserts it on reconnecting, and reports its result.
    let held = coord
        .heartbeat("w1", &[(task.clone(), 1)])
        .await
        .expect("heartbeat");
    assert_eq!(held, vec![(task.clone(), 1, true)]);
    coord
        .complete("w1", &task, 1, r#"{"id":"acc_1"}"#)
        .await
        .expect("the current attempt's result is recorded");
    let kinds = kinds(&coord, &run_id).await;
    assert!(
        kinds.contains(&"tool_call_completed".to_owned()),
        "{kinds:?}"
    );
    for never in [
        "task_lease_expired",
        "uncertain_outcome_recorded",
        "run_paused",
    ] {
        assert!(!kinds.contains(&never.to_owned()), "{never}: {kinds:?}");
    }
    assert_eq!(
        coord.get_run("t", &run_id).await.expect("run").status,
        "running"
    );
    db.drop().await;
}

async fn after_the_grace_a_lease_nobody_reasserted_is_judged(backend: Backend) {
    let (db, coord, run_id) = setup(backend).await;
    let store = coord.store().clone();
    let task = dispatched_create_then_outage(&coord).await;
    assert_eq!(coord.sweep_expired_leases().await.expect("sweep"), 0);
    // The worker died in the outage: one grace later the lease is judged
    // as before (a reconcile call dispatched: uncertain, the run paused).
    store.advance_clock(LEASE_MS + 1).await.expect("clock");
    store.fleet_alive(FleetReset::No).await.expect("alive");
    assert_eq!(coord.sweep_expired_leases().await.expect("sweep"), 1);
    assert_eq!(
        coord.get_run("t", &run_id).await.expect("run").status,
        "paused"
    );
    // Its heartbeat, too late, no longer revives it.
    let held = coord
        .heartbeat("w1", &[(task, 1)])
        .await
        .expect("heartbeat");
    assert!(held.iter().all(|(_, _, h)| !h), "{held:?}");
    db.drop().await;
}

async fn a_fleet_that_was_never_silent_judges_expired_leases_at_once(backend: Backend) {
    let (db, coord, run_id) = setup(backend).await;
    let store = coord.store().clone();
    store.fleet_alive(FleetReset::No).await.expect("alive");
    let task = common::dispatched_create(&coord).await;
    // The worker stopped heartbeating while engines ran (it froze): its
    // lease is judged at the next sweep, and not revived by a late heartbeat.
    store.expire_task_timers(None).await.expect("expire");
    store
        .fleet_alive(FleetReset::IfSilentFor(coord.outage_gap_ms()))
        .await
        .expect("alive");
    let held = coord
        .heartbeat("w1", &[(task, 1)])
        .await
        .expect("heartbeat");
    assert!(held.iter().all(|(_, _, h)| !h), "{held:?}");
    assert_eq!(coord.sweep_expired_leases().await.expect("sweep"), 1);
    assert_eq!(
        coord.get_run("t", &run_id).await.expect("run").status,
        "paused"
    );
    db.drop().await;
}

async fn an_engine_that_could_not_reach_the_database_begins_a_grace(backend: Backend) {
    let (db, coord, _run_id) = setup(backend).await;
    let store = coord.store().clone();
    store.fleet_alive(FleetReset::No).await.expect("alive");
    let _task = common::dispatched_create(&coord).await;
    store.expire_task_timers(None).await.expect("expire");
    // A running engine whose own ticks failed for longer than the gap.
    store.fleet_alive(FleetReset::Now).await.expect("alive");
    assert_eq!(coord.sweep_expired_leases().await.expect("sweep"), 0);
    db.drop().await;
}

on_both_backends!(
    a_result_reported_after_an_outage_longer_than_the_lease_is_recorded,
    after_the_grace_a_lease_nobody_reasserted_is_judged,
    a_fleet_that_was_never_silent_judges_expired_leases_at_once,
    an_engine_that_could_not_reach_the_database_begins_a_grace,
);
