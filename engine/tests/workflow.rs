//! Workflow graphs through the coordinator on both backends (PostgreSQL and
//! SQLite; every test runs once per backend, as `postgres::<name>` and
//! `sqlite::<name>`): signals (early, duplicate, refused), durable timers
//! (downtime, timeouts, concurrent firing), approvals, child runs through the
//! outbox, definition versions, and what a waiting run holds.
//!
//! Deterministic: time moves with `Store::advance_clock`, and the tests call
//! `fire_due_timers` / `process_outbox` themselves instead of waiting for the
//! background loops, except
//! `the_background_loops_start_children_tell_parents_and_fire_timers_on_their_own`,
//! which checks that those loops do it within a bounded wait.

mod common;
use common::{Backend, Raw, TestDb, decision};

use std::sync::Arc;
use std::time::Duration;

use belay_engine::coordinator::{
    Coordinator, CoordinatorConfig, CoordinatorError, OUTBOX_LEASE_MS, StartRun,
};
use belay_engine::definitions::SourceFile;
use belay_engine::machine::child_run_id;
use belay_engine::store::{DefinitionRow, EventRow, RunRow, Store, StoreError};
use serde_json::{Value, json};
use uuid::Uuid;

const TENANT: &str = "t";
const HOUR_MS: i64 = 3_600_000;
const DAY_MS: i64 = 24 * HOUR_MS;

const TOOLS: &str = r#"TOOLS:
  create_account(email: string, plan?: string = "starter") -> {account_id: string}
    description: "Create an account"
    type: http
    endpoint: "/accounts"
    permission: crm.write
    repeat_safety: idempotent
"#;

fn config() -> CoordinatorConfig {
    CoordinatorConfig {
        lease_ms: 60_000,
        sweep_interval_ms: 1_000,
        ..CoordinatorConfig::default()
    }
}

/// A fresh database with a coordinator on it; tenant `t` holds `crm.write`.
async fn setup(backend: Backend) -> (TestDb, Arc<Coordinator>) {
    let db = TestDb::create(backend, "belay_wf").await;
    let coord = Coordinator::new(db.store(4).await, config());
    coord
        .store()
        .set_tenant_grants(TENANT, &["crm.write".into()])
        .await
        .expect("grants");
    (db, coord)
}

/// Register the tools above and `yaml` for `tenant`.
async fn register_in(coord: &Coordinator, tenant: &str, yaml: &str) -> Vec<(DefinitionRow, bool)> {
    coord
        .register_bundle(
            tenant,
            vec![
                SourceFile {
                    path: "crm.tools.abl".into(),
                    content: TOOLS.into(),
                },
                SourceFile {
                    path: "flows.yaml".into(),
                    content: yaml.into(),
                },
            ],
        )
        .await
        .expect("register")
}

async fn register(coord: &Coordinator, yaml: &str) -> Vec<(DefinitionRow, bool)> {
    register_in(coord, TENANT, yaml).await
}

/// Start `workflow` for `tenant` with `input`; the caller holds `crm.write`.
async fn start_in(
    coord: &Coordinator,
    tenant: &str,
    workflow: &str,
    input: Value,
    key: &str,
) -> RunRow {
    let (run, created) = coord
        .start_run(StartRun {
            tenant: tenant.into(),
            workflow: workflow.into(),
            input_json: input.to_string(),
            idempotency_key: key.into(),
            caller: "app".into(),
            caller_grants: vec!["crm.write".into()],
        })
        .await
        .expect("start");
    assert!(created);
    run
}

async fn start(coord: &Coordinator, workflow: &str, input: Value, key: &str) -> RunRow {
    start_in(coord, TENANT, workflow, input, key).await
}

async fn run_in(coord: &Coordinator, tenant: &str, id: Uuid) -> RunRow {
    coord
        .get_run(tenant, &id.to_string())
        .await
        .expect("get run")
}

async fn run(coord: &Coordinator, id: Uuid) -> RunRow {
    run_in(coord, TENANT, id).await
}

async fn events(coord: &Coordinator, id: Uuid) -> Vec<EventRow> {
    coord
        .store()
        .list_events(id, 0, 1000)
        .await
        .expect("events")
}

async fn kinds(coord: &Coordinator, id: Uuid) -> Vec<String> {
    events(coord, id)
        .await
        .into_iter()
        .map(|e| e.kind)
        .collect()
}

async fn count_kind(coord: &Coordinator, id: Uuid, kind: &str) -> usize {
    kinds(coord, id).await.iter().filter(|k| *k == kind).count()
}

async fn signal(
    coord: &Coordinator,
    id: Uuid,
    name: &str,
    signal_id: &str,
    payload: Value,
) -> Result<(RunRow, bool), CoordinatorError> {
    coord
        .signal_run(
            TENANT,
            &id.to_string(),
            name,
            signal_id,
            &payload.to_string(),
            "test",
        )
        .await
}

/// A count from a query with the uuid parameter `$1` (`SELECT COUNT(*) …`).
async fn count(raw: &Raw, from_where: &str, id: Uuid) -> i64 {
    raw.fetch_texts(
        &format!("SELECT CAST(COUNT(*) AS TEXT) FROM {from_where}"),
        id,
    )
    .await[0]
        .parse()
        .expect("a count")
}

/// Every row of the tables a transition writes, for "nothing changed" checks.
async fn snapshot(raw: &Raw) -> Vec<Vec<String>> {
    vec![
        raw.dump("runs", "run_id").await,
        raw.dump("events", "run_id, seq").await,
        raw.dump("tasks", "task_id").await,
        raw.dump("timers", "run_id, timer_id").await,
    ]
}

async fn fire(coord: &Coordinator) -> usize {
    coord.fire_due_timers().await.expect("fire due timers")
}

async fn outbox(coord: &Coordinator) -> usize {
    coord.process_outbox().await.expect("process outbox")
}

/// The run's timers, by id.
async fn timer_ids(raw: &Raw, id: Uuid) -> Vec<String> {
    let n = count(raw, "timers WHERE run_id = $1", id).await;
    if n == 0 {
        return vec![];
    }
    assert_eq!(n, 1, "this helper reads one timer");
    raw.fetch_texts("SELECT timer_id FROM timers WHERE run_id = $1", id)
        .await
}

// ---- signals ----------------------------------------------------------------

const EARLY: &str = r#"kind: workflow
name: early
nodes:
  - id: approve
    type: approval
    subject: "${ .input }"
    approver_grant: ops.approve
    next: docs
  - id: docs
    type: wait
    signal: documents_received
    payload_schema: {type: object, required: [files], properties: {files: {type: array}}}
    timeout: 7d
    next: done
  - {id: done, type: succeed, output: "${ .nodes.docs.output }"}
"#;

async fn a_signal_sent_before_its_wait_is_kept_and_taken_at_once(backend: Backend) {
    let (db, coord) = setup(backend).await;
    register(&coord, EARLY).await;
    let r = start(&coord, "early", json!({"who": "ada"}), "k1").await;
    assert_eq!(r.status, "waiting");
    let raw = db.raw().await;

    // The run is at the approval when the signal arrives: it is kept.
    let before = events(&coord, r.run_id).await.len();
    let (after, duplicate) = signal(
        &coord,
        r.run_id,
        "documents_received",
        "s1",
        json!({"files": ["id.pdf"]}),
    )
    .await
    .expect("signal");
    assert!(!duplicate);
    assert_eq!(after.status, "waiting");
    assert!(
        after.status_reason.contains("approve"),
        "{}",
        after.status_reason
    );
    let kinds_now = kinds(&coord, r.run_id).await;
    assert_eq!(kinds_now.len(), before + 1);
    assert_eq!(
        kinds_now.last().map(String::as_str),
        Some("signal_received")
    );
    assert!(timer_ids(&raw, r.run_id).await.is_empty());

    // The approval ends; the wait takes the kept signal in the same
    // transition: it never waits, so it never sets its 7-day timeout.
    let seq = after.last_seq;
    let done = coord
        .decide_approval(
            TENANT,
            &r.run_id.to_string(),
            decision("approve", true, "", "grace", &["ops.approve".into()], "ok"),
        )
        .await
        .map(|(run, _)| run)
        .expect("decide");
    assert_eq!(done.status, "completed");
    assert_eq!(
        done.output,
        Some(
            json!({"signal": "documents_received", "signal_id": "s1", "payload": {"files": ["id.pdf"]}})
        )
    );
    let tail: Vec<String> = events(&coord, r.run_id)
        .await
        .into_iter()
        .filter(|e| e.seq > seq)
        .map(|e| e.kind)
        .collect();
    assert_eq!(
        tail,
        [
            "approval_decided",
            "node_completed",
            "node_started",
            "signal_consumed",
            "node_completed",
            "node_passed",
            "run_completed"
        ]
    );
    assert_eq!(count(&raw, "timers WHERE run_id = $1", r.run_id).await, 0);
    raw.close().await;
    db.drop().await;
}

const TWICE: &str = r#"kind: workflow
name: twice
nodes:
  - {id: a, type: wait, signal: go, next: b}
  - {id: b, type: wait, signal: more}
"#;

async fn a_duplicate_signal_is_reported_and_writes_nothing(backend: Backend) {
    let (db, coord) = setup(backend).await;
    register(&coord, TWICE).await;
    let r = start(&coord, "twice", json!({}), "k1").await;
    let (_, duplicate) = signal(&coord, r.run_id, "go", "g1", json!({"n": 1}))
        .await
        .expect("first");
    assert!(!duplicate);
    let seq = run(&coord, r.run_id).await.last_seq;
    let n = events(&coord, r.run_id).await.len();
    let raw = db.raw().await;
    let before = snapshot(&raw).await;
    // The same signal again: a duplicate.
    let (after, duplicate) = signal(&coord, r.run_id, "go", "g1", json!({"n": 1}))
        .await
        .expect("again");
    assert!(duplicate, "the same signal id is a duplicate");
    assert_eq!(after.last_seq, seq);
    // The same id for another payload or another name: refused, naming
    // the id, not passed off as a duplicate.
    for (name, payload, says) in [
        (
            "go",
            json!({"n": "another payload"}),
            "signal `go` with a different payload",
        ),
        ("more", json!({"n": 1}), "signal `go`, not `more`"),
    ] {
        let err = signal(&coord, r.run_id, name, "g1", payload)
            .await
            .expect_err("another signal under a used id");
        assert!(
            matches!(&err, CoordinatorError::FailedPrecondition(m)
                if m.starts_with("signal id `g1` was already used for ") && m.contains(says)),
            "{err:?}"
        );
        assert_eq!(
            tonic::Status::from(err).code(),
            tonic::Code::FailedPrecondition
        );
    }
    assert_eq!(events(&coord, r.run_id).await.len(), n, "no event written");
    assert_eq!(snapshot(&raw).await, before, "the run row is untouched too");
    raw.close().await;
    assert_eq!(count_kind(&coord, r.run_id, "signal_received").await, 1);

    // The same id sent twice at once: one is applied, one is the duplicate.
    let (x, y) = tokio::join!(
        signal(&coord, r.run_id, "go", "g2", json!({"n": 2})),
        signal(&coord, r.run_id, "go", "g2", json!({"n": 2})),
    );
    let mut dups = [x.expect("x").1, y.expect("y").1];
    dups.sort();
    assert_eq!(dups, [false, true]);
    assert_eq!(count_kind(&coord, r.run_id, "signal_received").await, 2);

    let (done, duplicate) = signal(&coord, r.run_id, "more", "m1", json!(null))
        .await
        .expect("more");
    assert!(!duplicate);
    assert_eq!(done.status, "completed");
    db.drop().await;
}

const DOCS: &str = r#"kind: workflow
name: docs
nodes:
  - id: docs
    type: wait
    signal: documents_received
    payload_schema: {type: object, required: [files], properties: {files: {type: array}}}
    timeout: 7d
    on_timeout: remind
    next: done
  - id: remind
    type: set
    values: {reminded: true}
    next: docs
  - id: done
    type: succeed
    output: ${ .nodes.docs.output.payload }
"#;

async fn a_signal_nobody_waits_for_or_a_bad_payload_is_refused_and_writes_nothing(
    backend: Backend,
) {
    let (db, coord) = setup(backend).await;
    register(&coord, DOCS).await;
    let r = start(&coord, "docs", json!({}), "k1").await;
    let raw = db.raw().await;
    let before = snapshot(&raw).await;
    let id = r.run_id.to_string();
    let cases: Vec<(&str, &str, String, &str)> = vec![
        (
            "approved",
            "s1",
            "{}".into(),
            "waits for: documents_received",
        ),
        (
            "documents_received",
            "s2",
            json!({"files": "nope"}).to_string(),
            "payload_schema",
        ),
        ("documents_received", "s3", "{not json".into(), "not JSON"),
        ("documents_received", "", "{}".into(), "signal_id"),
        ("", "s5", "{}".into(), "name"),
        ("documents_received", "s\0", "{}".into(), "NUL"),
    ];
    for (name, signal_id, payload, needle) in cases {
        let err = coord
            .signal_run(TENANT, &id, name, signal_id, &payload, "test")
            .await
            .expect_err("refused");
        assert!(
            matches!(&err, CoordinatorError::InvalidArgument(m) if m.contains(needle)),
            "{name:?}/{signal_id:?}: {err:?}"
        );
    }
    // Another tenant's run, or no run at all: not found.
    for (tenant, run_id) in [("other", id.clone()), (TENANT, Uuid::now_v7().to_string())] {
        let err = coord
            .signal_run(tenant, &run_id, "documents_received", "s6", "{}", "t")
            .await
            .expect_err("refused");
        assert!(matches!(err, CoordinatorError::NotFound(_)), "{err:?}");
    }
    assert_eq!(snapshot(&raw).await, before, "nothing was written");
    // The refused ids were not remembered: the first good signal with one of them counts.
    let (done, duplicate) = signal(
        &coord,
        r.run_id,
        "documents_received",
        "s2",
        json!({"files": []}),
    )
    .await
    .expect("good signal");
    assert!(!duplicate);
    assert_eq!(done.status, "completed");
    // A finished run takes no signal.
    let err = signal(
        &coord,
        r.run_id,
        "documents_received",
        "s7",
        json!({"files": []}),
    )
    .await
    .expect_err("finished");
    assert!(
        matches!(err, CoordinatorError::FailedPrecondition(_)),
        "{err:?}"
    );
    raw.close().await;
    db.drop().await;
}

// ---- timers -----------------------------------------------------------------

const SLOW: &str = r#"kind: workflow
name: slow
nodes:
  - id: docs
    type: wait
    signal: documents_received
    timeout: 3d
    on_timeout: remind
    next: done
  - {id: remind, type: succeed, output: reminded}
  - {id: done, type: succeed, output: received}
"#;

async fn a_timer_due_while_no_engine_runs_fires_once_on_the_next_engine(backend: Backend) {
    let (db, coord_a) = setup(backend).await;
    register(&coord_a, SLOW).await;
    let r = start(&coord_a, "slow", json!({}), "k1").await;
    assert_eq!(r.status, "waiting");
    assert_eq!(fire(&coord_a).await, 0, "not due yet");

    if backend == Backend::Sqlite {
        // While A has the file open, no other engine may.
        let err = Store::connect(&db.url, 4)
            .await
            .expect_err("a second engine while A runs");
        assert!(matches!(err, StoreError::Config(_)), "{err:?}");
    }
    // Engine A goes away.
    coord_a.store().close().await;
    assert!(coord_a.fire_due_timers().await.is_err(), "A is closed");

    // Three days pass with no engine running.
    let raw = db.raw().await;
    assert_eq!(
        raw.execute(
            &format!(
                "UPDATE belay_clock SET offset_ms = offset_ms + {} WHERE id = 1",
                3 * DAY_MS
            ),
            None,
        )
        .await,
        1
    );
    assert_eq!(timer_ids(&raw, r.run_id).await, ["docs.timeout"]);

    // A new engine on the same database fires it at its first look, once.
    let store_b = Store::connect(&db.url, 4)
        .await
        .expect("a new engine on the database");
    let coord_b = Coordinator::new(store_b, config());
    assert_eq!(fire(&coord_b).await, 1);
    let after = run(&coord_b, r.run_id).await;
    assert_eq!(
        (after.status.as_str(), after.output.clone()),
        ("completed", Some(json!("reminded")))
    );
    assert_eq!(fire(&coord_b).await, 0);
    coord_b
        .store()
        .advance_clock(7 * DAY_MS)
        .await
        .expect("clock");
    assert_eq!(fire(&coord_b).await, 0);
    assert_eq!(count_kind(&coord_b, r.run_id, "timer_fired").await, 1);
    assert_eq!(count(&raw, "timers WHERE run_id = $1", r.run_id).await, 0);
    raw.close().await;
    drop(coord_a);
    coord_b.store().close().await;
    db.drop().await;
}

const TIMEOUTS: &str = r#"kind: workflow
name: strict
nodes:
  - {id: w, type: wait, signal: s, timeout: 2h}
---
kind: workflow
name: race
nodes:
  - id: w
    type: wait
    for:
      - {signal: go, next: signalled}
      - {duration: 3d, next: slept}
    timeout: 5d
  - {id: signalled, type: succeed, output: signalled}
  - {id: slept, type: succeed, output: slept}
"#;

async fn timeouts_take_on_timeout_or_fail_the_run_and_a_duration_can_beat_a_signal(
    backend: Backend,
) {
    let (db, coord) = setup(backend).await;
    register(&coord, DOCS).await;
    register(&coord, TIMEOUTS).await;
    let raw = db.raw().await;
    let clock = coord.store();

    // `on_timeout`: a second visit of the wait, with a new timer.
    let r = start(&coord, "docs", json!({}), "k1").await;
    assert_eq!(timer_ids(&raw, r.run_id).await, ["docs.timeout"]);
    clock
        .advance_clock(7 * DAY_MS - 1_000)
        .await
        .expect("clock");
    assert_eq!(fire(&coord).await, 0, "one second early");
    assert_eq!(run(&coord, r.run_id).await.status, "waiting");
    clock.advance_clock(1_000).await.expect("clock");
    assert_eq!(fire(&coord).await, 1);
    let after = run(&coord, r.run_id).await;
    assert_eq!(after.status, "waiting");
    let state = clock.run_state(r.run_id).await.expect("state");
    assert_eq!(state.vars.get("reminded"), Some(&json!(true)));
    assert_eq!(timer_ids(&raw, r.run_id).await, ["docs~2.timeout"]);
    assert_eq!(fire(&coord).await, 0);
    let (done, _) = signal(
        &coord,
        r.run_id,
        "documents_received",
        "s1",
        json!({"files": ["a.pdf"]}),
    )
    .await
    .expect("signal");
    assert_eq!(done.output, Some(json!({"files": ["a.pdf"]})));
    assert_eq!(count_kind(&coord, r.run_id, "timer_fired").await, 1);
    assert!(timer_ids(&raw, r.run_id).await.is_empty());

    // No `on_timeout`: the run fails.
    let r = start(&coord, "strict", json!({}), "k2").await;
    clock.advance_clock(2 * HOUR_MS).await.expect("clock");
    assert_eq!(fire(&coord).await, 1);
    let after = run(&coord, r.run_id).await;
    assert_eq!(after.status, "failed");
    assert!(
        after.status_reason.contains("timed out after 2h"),
        "{}",
        after.status_reason
    );
    assert!(timer_ids(&raw, r.run_id).await.is_empty());

    // The first of several: the 3-day duration comes before the signal; the
    // 5-day timeout is gone with the wait.
    let r = start(&coord, "race", json!({}), "k3").await;
    assert_eq!(count(&raw, "timers WHERE run_id = $1", r.run_id).await, 2);
    clock.advance_clock(3 * DAY_MS).await.expect("clock");
    assert_eq!(fire(&coord).await, 1);
    let after = run(&coord, r.run_id).await;
    assert_eq!(
        (after.status.as_str(), after.output),
        ("completed", Some(json!("slept")))
    );
    assert_eq!(count(&raw, "timers WHERE run_id = $1", r.run_id).await, 0);
    let late = signal(&coord, r.run_id, "go", "g1", json!({})).await;
    assert!(
        matches!(late, Err(CoordinatorError::FailedPrecondition(_))),
        "{late:?}"
    );
    clock.advance_clock(5 * DAY_MS).await.expect("clock");
    assert_eq!(fire(&coord).await, 0);
    assert_eq!(count_kind(&coord, r.run_id, "timer_fired").await, 1);
    raw.close().await;
    db.drop().await;
}

const NAP: &str = "kind: workflow\nname: nap\nnodes:\n  - {id: nap, type: wait, duration: 1h}\n";

async fn two_engines_firing_the_same_due_timers_fire_each_once(backend: Backend) {
    let (db, coord_a) = setup(backend).await;
    register(&coord_a, NAP).await;
    let mut runs = Vec::new();
    for i in 0..50 {
        runs.push(
            start(&coord_a, "nap", json!({}), &format!("k{i}"))
                .await
                .run_id,
        );
    }
    coord_a.store().advance_clock(HOUR_MS).await.expect("clock");
    let coord_b = match backend {
        Backend::Postgres => Coordinator::new(
            Store::connect(&db.url, 4).await.expect("engine B"),
            config(),
        ),
        Backend::Sqlite => {
            // One engine process per SQLite file: a second engine is
            // refused, so the "two engines" are two tasks of the one engine.
            let err = Store::connect(&db.url, 4)
                .await
                .expect_err("a second engine on one SQLite file");
            assert!(
                matches!(err, StoreError::Config(ref m) if m.contains("in use by another engine process")),
                "{err:?}"
            );
            Arc::clone(&coord_a)
        }
    };
    let a = tokio::spawn({
        let c = Arc::clone(&coord_a);
        async move { c.fire_due_timers().await }
    });
    let b = tokio::spawn({
        let c = Arc::clone(&coord_b);
        async move { c.fire_due_timers().await }
    });
    let (a, b) = (a.await.expect("join"), b.await.expect("join"));
    let (a, b) = (a.expect("A fires"), b.expect("B fires"));
    assert!(a + b >= 50, "every due timer was handled: {a} + {b}");
    let raw = db.raw().await;
    for id in &runs {
        assert_eq!(
            count(
                &raw,
                "events WHERE run_id = $1 AND kind = 'timer_fired'",
                *id
            )
            .await,
            1,
            "run {id}"
        );
        assert_eq!(run(&coord_a, *id).await.status, "completed");
        assert_eq!(count(&raw, "timers WHERE run_id = $1", *id).await, 0);
    }
    assert_eq!(fire(&coord_a).await + fire(&coord_b).await, 0);
    raw.close().await;
    db.drop().await;
}

// ---- approvals ----------------------------------------------------------------

const APPROVALS: &str = r#"kind: workflow
name: open_account
nodes:
  - id: approve
    type: approval
    subject: "${ {email: .input.email, plan: .input.plan} }"
    prompt: "Open an account for ${ .input.email }?"
    approver_grant: onboarding.approve
    allow_edits: true
    edits_schema: {type: object, required: [email, plan], additionalProperties: false, properties: {email: {type: string}, plan: {enum: [starter, pro]}}}
    on_decline: declined
    next: create
  - id: create
    type: tool
    tool: create_account
    args: "${ .nodes.approve.output.subject }"
    grants: [crm.write]
    next: done
  - {id: done, type: succeed, output: "${ {account: .nodes.create.output.account_id, approved: .nodes.approve.output.subject} }"}
  - {id: declined, type: fail, error: "declined: ${ .nodes.approve.output.reason }"}
---
kind: workflow
name: as_is
nodes:
  - {id: approve, type: approval, subject: "${ .input }", approver_grant: ok.go}
"#;

async fn an_approval_needs_the_grant_is_decided_once_and_the_next_node_sees_the_approved_subject(
    backend: Backend,
) {
    let (db, coord) = setup(backend).await;
    register(&coord, APPROVALS).await;
    let r = start(
        &coord,
        "open_account",
        json!({"email": "a@x.io", "plan": "pro"}),
        "k1",
    )
    .await;
    assert_eq!(r.status, "waiting");
    let id = r.run_id.to_string();
    let raw = db.raw().await;
    let before = snapshot(&raw).await;
    let decide = |approve: bool, edit: Option<Value>, by: &'static str, grants: &[&str]| {
        let coord = Arc::clone(&coord);
        let id = id.clone();
        let grants: Vec<String> = grants.iter().map(|g| (*g).to_owned()).collect();
        async move {
            let edit = edit.map(|e| e.to_string()).unwrap_or_default();
            coord
                .decide_approval(
                    TENANT,
                    &id,
                    decision("approve", approve, &edit, by, &grants, "checked"),
                )
                .await
                .map(|(run, _)| run)
        }
    };
    let starter = json!({"email": "a@x.io", "plan": "starter"});

    let err = decide(true, None, "mallory", &["crm.write"])
        .await
        .expect_err("no grant");
    assert!(
        matches!(&err, CoordinatorError::PermissionDenied(m) if m.contains("onboarding.approve")),
        "{err:?}"
    );
    let err = decide(
        false,
        Some(starter.clone()),
        "grace",
        &["onboarding.approve"],
    )
    .await
    .expect_err("edits with a decline");
    assert!(
        matches!(err, CoordinatorError::PermissionDenied(_)),
        "{err:?}"
    );
    let err = decide(
        true,
        Some(json!({"email": "a@x.io", "plan": "gold"})),
        "grace",
        &["onboarding.approve"],
    )
    .await
    .expect_err("edit outside edits_schema");
    assert!(
        matches!(err, CoordinatorError::Unprocessable { .. }),
        "{err:?}"
    );
    let err = coord
        .decide_approval(TENANT, &id, decision("create", true, "", "grace", &[], ""))
        .await
        .map(|(run, _)| run)
        .expect_err("not an approval that waits");
    assert!(
        matches!(err, CoordinatorError::FailedPrecondition(_)),
        "{err:?}"
    );
    // A node the workflow does not have is named as such, not "not waiting".
    let err = coord
        .decide_approval(
            TENANT,
            &id,
            decision(
                "aprove",
                true,
                "",
                "grace",
                &["onboarding.approve".into()],
                "",
            ),
        )
        .await
        .map(|(run, _)| run)
        .expect_err("misspelt node");
    assert!(
        matches!(&err, CoordinatorError::InvalidArgument(m)
            if m.starts_with("no such node `aprove` in workflow ") && m.ends_with("its approval nodes: approve")),
        "{err:?}"
    );
    let status = tonic::Status::from(err);
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().starts_with("no such node `aprove`"),
        "{status:?}"
    );
    assert_eq!(snapshot(&raw).await, before, "refusals write nothing");

    // Edits where the node allows none.
    let fixed = start(&coord, "as_is", json!({"x": 1}), "k2").await;
    let err = coord
        .decide_approval(
            TENANT,
            &fixed.run_id.to_string(),
            decision(
                "approve",
                true,
                r#"{"x": 2}"#,
                "grace",
                &["ok.go".into()],
                "",
            ),
        )
        .await
        .map(|(run, _)| run)
        .expect_err("no edits allowed");
    assert!(
        matches!(&err, CoordinatorError::PermissionDenied(m) if m.contains("does not allow edits")),
        "{err:?}"
    );
    assert_eq!(run(&coord, fixed.run_id).await.status, "waiting");

    // A valid decision, with an edit.
    let decided = decide(
        true,
        Some(starter.clone()),
        "grace",
        &["onboarding.approve"],
    )
    .await
    .expect("decide");
    assert_eq!(
        decided.status, "running",
        "the tool node's task is scheduled"
    );
    let second = decide(false, None, "bob", &["onboarding.approve"])
        .await
        .expect_err("decided already");
    assert!(
        matches!(&second, CoordinatorError::Conflict(m) if m.contains("approved by grace")),
        "{second:?}"
    );
    let ev = events(&coord, r.run_id).await;
    let decision = ev
        .iter()
        .find(|e| e.kind == "approval_decided")
        .expect("decided event");
    assert_eq!(decision.payload["subject"], starter);
    assert_eq!(decision.payload["edited"], json!(true));
    assert_eq!(decision.payload["by"], json!("grace"));
    assert_eq!(count_kind(&coord, r.run_id, "approval_decided").await, 1);

    // The next node calls its tool with exactly the approved subject.
    let task = coord.claim("w1", 1, 0).await.expect("claim").remove(0);
    assert_eq!(task.run_id, r.run_id);
    assert_eq!(task.spec["arguments"], starter);
    let task_id = task.task_id.to_string();
    coord.dispatch("w1", &task_id, 1).await.expect("dispatch");
    coord
        .complete("w1", &task_id, 1, r#"{"account_id": "acct_1"}"#)
        .await
        .expect("complete");
    let done = run(&coord, r.run_id).await;
    assert_eq!(done.status, "completed");
    assert_eq!(
        done.output,
        Some(json!({"account": "acct_1", "approved": starter}))
    );
    // After the end, the same decision again (a retry) is answered with
    // the recorded one; a different one is still told who decided first.
    let again = decide(true, None, "grace", &["onboarding.approve"]).await;
    assert!(again.is_ok(), "{again:?}");
    let late = decide(false, None, "bob", &["onboarding.approve"]).await;
    assert!(
        matches!(&late, Err(CoordinatorError::Conflict(m)) if m.contains("approved by grace")),
        "{late:?}"
    );
    raw.close().await;
    db.drop().await;
}

// ---- child runs -----------------------------------------------------------------

const FAMILY: &str = r#"kind: workflow
name: parent
nodes:
  - id: kyc
    type: workflow
    workflow: child
    input: "${ {email: .input.email} }"
    timeout: 1d
    on_error: manual
    next: done
  - {id: done, type: succeed, output: "${ .nodes.kyc.output }"}
  - {id: manual, type: succeed, output: "${ {manual: .nodes.kyc.output.error} }"}
---
kind: workflow
name: child
input_schema: {type: object, required: [email], properties: {email: {type: string}}}
nodes:
  - {id: check, type: wait, signal: checked, next: out}
  - {id: out, type: succeed, output: "${ {kyc: .nodes.check.output.payload.result, email: .input.email} }"}
"#;

fn child_of(parent: Uuid) -> Uuid {
    Uuid::parse_str(&child_run_id(&parent.to_string(), "kyc.c1")).expect("uuid")
}

/// Make the outbox rows of `kind` written by `run` due again as if the
/// replica that carried them out died before marking them done.
async fn crash_before_finish(coord: &Coordinator, raw: &Raw, run: Uuid, kind: &str) {
    let reset = raw
        .execute(
            &format!("UPDATE outbox SET done_at = NULL WHERE run_id = $1 AND kind = '{kind}'"),
            Some(run),
        )
        .await;
    assert_eq!(reset, 1, "one {kind} row of {run}");
    coord
        .store()
        .advance_clock(OUTBOX_LEASE_MS + 1)
        .await
        .expect("clock");
}

async fn open_outbox_rows(raw: &Raw, run: Uuid) -> i64 {
    count(raw, "outbox WHERE run_id = $1 AND done_at IS NULL", run).await
}

async fn a_sync_child_run_is_started_waited_for_and_its_output_is_the_parents(backend: Backend) {
    let (db, coord) = setup(backend).await;
    register(&coord, FAMILY).await;
    let raw = db.raw().await;
    let p = start(&coord, "parent", json!({"email": "a@x.io"}), "k1").await;
    assert_eq!(p.status, "waiting");
    let c = child_of(p.run_id);
    assert!(matches!(
        coord.get_run(TENANT, &c.to_string()).await,
        Err(CoordinatorError::NotFound(_))
    ));
    assert_eq!(open_outbox_rows(&raw, p.run_id).await, 1);

    // The outbox starts the child, with its derived id.
    assert_eq!(outbox(&coord).await, 1);
    assert_eq!(outbox(&coord).await, 0, "done once");
    let child = run(&coord, c).await;
    assert_eq!(
        (child.workflow.as_str(), child.status.as_str()),
        ("child", "waiting")
    );
    assert_eq!(child.input, json!({"email": "a@x.io"}));
    assert_eq!(child.idempotency_key, format!("child:{}/kyc.c1", p.run_id));
    assert_eq!(
        count(
            &raw,
            "runs c JOIN runs p ON p.run_id = c.parent_run_id WHERE c.run_id = $1 AND p.workflow = 'parent' AND c.parent_call_id = 'kyc.c1'",
            c
        )
        .await,
        1
    );

    // The start is carried out again (its replica died before marking it
    // done): the child exists, nothing changes.
    crash_before_finish(&coord, &raw, p.run_id, "start_child").await;
    let before = snapshot(&raw).await;
    assert_eq!(outbox(&coord).await, 1);
    assert_eq!(
        snapshot(&raw).await,
        before,
        "the second start changed nothing"
    );
    assert_eq!(open_outbox_rows(&raw, p.run_id).await, 0);

    // The child ends; the outbox tells the parent, which completes with its output.
    let (ended, _) = signal(&coord, c, "checked", "c1", json!({"result": "clear"}))
        .await
        .expect("signal the child");
    assert_eq!(ended.status, "completed");
    assert_eq!(run(&coord, p.run_id).await.status, "waiting");
    assert_eq!(outbox(&coord).await, 1);
    let parent = run(&coord, p.run_id).await;
    let expected = json!({"kyc": "clear", "email": "a@x.io"});
    assert_eq!(
        (parent.status.as_str(), parent.output.clone()),
        ("completed", Some(expected.clone()))
    );
    let finished = events(&coord, p.run_id)
        .await
        .into_iter()
        .find(|e| e.kind == "child_run_finished")
        .expect("child_run_finished");
    assert_eq!(finished.payload["child_run_id"], json!(c.to_string()));
    assert_eq!(finished.payload["output"], expected);

    // Telling the parent twice changes nothing.
    crash_before_finish(&coord, &raw, c, "child_finished").await;
    let before = snapshot(&raw).await;
    assert_eq!(outbox(&coord).await, 1);
    assert_eq!(outbox(&coord).await, 0);
    assert_eq!(
        snapshot(&raw).await,
        before,
        "the second report changed nothing"
    );
    assert_eq!(count_kind(&coord, p.run_id, "child_run_finished").await, 1);
    raw.close().await;
    db.drop().await;
}

async fn a_child_that_cannot_start_makes_the_parent_take_on_error(backend: Backend) {
    let (db, coord) = setup(backend).await;
    register(&coord, FAMILY).await;
    let raw = db.raw().await;

    // The input fails the child's `input_schema`.
    let p = start(&coord, "parent", json!({"email": 42}), "k1").await;
    assert_eq!(outbox(&coord).await, 1);
    let parent = run(&coord, p.run_id).await;
    assert_eq!(parent.status, "completed", "{}", parent.status_reason);
    let why = parent.output.as_ref().expect("output")["manual"]
        .as_str()
        .expect("text")
        .to_owned();
    assert!(
        why.contains("could not start") && why.contains("input schema"),
        "{why}"
    );
    assert!(matches!(
        coord.get_run(TENANT, &child_of(p.run_id).to_string()).await,
        Err(CoordinatorError::NotFound(_))
    ));
    let finished = events(&coord, p.run_id)
        .await
        .into_iter()
        .find(|e| e.kind == "child_run_finished")
        .expect("child_run_finished");
    assert_eq!(finished.payload["status"], json!("failed"));

    // The child workflow is not registered (any more) for this tenant.
    register_in(&coord, "t2", FAMILY).await;
    assert_eq!(
        raw.execute(
            "DELETE FROM definitions WHERE tenant = 't2' AND kind = 'workflow' AND name = 'child'",
            None
        )
        .await,
        1
    );
    let p2 = start_in(&coord, "t2", "parent", json!({"email": "b@x.io"}), "k1").await;
    assert_eq!(outbox(&coord).await, 1);
    let parent = run_in(&coord, "t2", p2.run_id).await;
    assert_eq!(parent.status, "completed", "{}", parent.status_reason);
    let why = parent.output.as_ref().expect("output")["manual"]
        .as_str()
        .expect("text")
        .to_owned();
    assert!(
        why.contains("could not start") && why.contains("workflow `child`"),
        "{why}"
    );
    assert_eq!(open_outbox_rows(&raw, p2.run_id).await, 0);
    raw.close().await;
    db.drop().await;
}

async fn cancelling_a_parent_cancels_its_waiting_child_once(backend: Backend) {
    let (db, coord) = setup(backend).await;
    register(&coord, FAMILY).await;
    let raw = db.raw().await;
    let p = start(&coord, "parent", json!({"email": "a@x.io"}), "k1").await;
    let c = child_of(p.run_id);
    assert_eq!(outbox(&coord).await, 1);
    assert_eq!(run(&coord, c).await.status, "waiting");

    let cancelled = coord
        .cancel_run(TENANT, &p.run_id.to_string(), "customer left")
        .await
        .expect("cancel");
    assert_eq!(cancelled.status, "cancelled");
    assert_eq!(
        run(&coord, c).await.status,
        "waiting",
        "until the outbox runs"
    );
    assert_eq!(outbox(&coord).await, 1);
    let child = run(&coord, c).await;
    assert_eq!(child.status, "cancelled");
    assert!(
        child
            .status_reason
            .contains("its parent run was cancelled: customer left"),
        "{}",
        child.status_reason
    );
    // The cancelled child reports its end; the cancelled parent ignores it.
    let parent_events = events(&coord, p.run_id).await.len();
    assert_eq!(outbox(&coord).await, 1);
    assert_eq!(events(&coord, p.run_id).await.len(), parent_events);
    assert_eq!(run(&coord, p.run_id).await.status, "cancelled");

    // Cancelling again (the replica died before marking it done) changes nothing.
    crash_before_finish(&coord, &raw, p.run_id, "cancel_child").await;
    let before = snapshot(&raw).await;
    assert_eq!(outbox(&coord).await, 1);
    assert_eq!(snapshot(&raw).await, before);
    assert_eq!(count_kind(&coord, c, "run_cancelled").await, 1);

    // A parent cancelled before its child started: the child never starts.
    let p2 = start(&coord, "parent", json!({"email": "b@x.io"}), "k2").await;
    coord
        .cancel_run(TENANT, &p2.run_id.to_string(), "too soon")
        .await
        .expect("cancel");
    assert_eq!(outbox(&coord).await, 2, "start_child and cancel_child");
    let c2 = child_of(p2.run_id);
    assert!(matches!(
        coord.get_run(TENANT, &c2.to_string()).await,
        Err(CoordinatorError::NotFound(_))
    ));
    // The cancel looks for the child a few times (its start may be in
    // flight elsewhere), then gives up.
    let mut rounds = 0;
    while open_outbox_rows(&raw, p2.run_id).await > 0 {
        rounds += 1;
        assert!(rounds <= 5, "the cancel_child row never finished");
        coord
            .store()
            .advance_clock(OUTBOX_LEASE_MS + 1)
            .await
            .expect("clock");
        assert_eq!(outbox(&coord).await, 1);
    }
    assert!(matches!(
        coord.get_run(TENANT, &c2.to_string()).await,
        Err(CoordinatorError::NotFound(_))
    ));
    raw.close().await;
    db.drop().await;
}

// ---- background loops -----------------------------------------------------------

/// Wait (at most 20 s) until `check` holds for run `id`, looking again on
/// each of the coordinator's run-event wake-ups (and every 100 ms).
async fn eventually(
    coord: &Coordinator,
    id: Uuid,
    what: &str,
    check: impl Fn(&RunRow) -> bool,
) -> RunRow {
    let mut wake = coord.subscribe_run_events();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(r) = coord.get_run(TENANT, &id.to_string()).await
            && check(&r)
        {
            return r;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within 20 s"
        );
        let _ = tokio::time::timeout(Duration::from_millis(100), wake.recv()).await;
    }
}

async fn the_background_loops_start_children_tell_parents_and_fire_timers_on_their_own(
    backend: Backend,
) {
    let db = TestDb::create(backend, "belay_wf").await;
    let coord = Coordinator::new(
        db.store(4).await,
        CoordinatorConfig {
            lease_ms: 60_000,
            sweep_interval_ms: 100,
            ..CoordinatorConfig::default()
        },
    );
    register(&coord, FAMILY).await;
    register(&coord, NAP).await;
    let loops = coord.spawn_background();

    let p = start(&coord, "parent", json!({"email": "a@x.io"}), "k1").await;
    let c = child_of(p.run_id);
    eventually(&coord, c, "the child is started", |r| r.status == "waiting").await;
    signal(&coord, c, "checked", "c1", json!({"result": "clear"}))
        .await
        .expect("signal the child");
    let parent = eventually(&coord, p.run_id, "the parent completes", |r| {
        r.status == "completed"
    })
    .await;
    assert_eq!(
        parent.output,
        Some(json!({"kyc": "clear", "email": "a@x.io"}))
    );

    let nap = start(&coord, "nap", json!({}), "k2").await;
    coord.store().advance_clock(HOUR_MS).await.expect("clock");
    eventually(&coord, nap.run_id, "the timer fires", |r| {
        r.status == "completed"
    })
    .await;
    assert_eq!(count_kind(&coord, nap.run_id, "timer_fired").await, 1);
    for h in loops {
        h.abort();
    }
    db.drop().await;
}

// ---- versions -----------------------------------------------------------------------

const VERSIONED: &str = r#"kind: workflow
name: versioned
nodes:
  - {id: w, type: wait, signal: go, next: done}
  - {id: done, type: succeed, output: v1}
"#;

fn workflow_row(rows: &[(DefinitionRow, bool)]) -> (DefinitionRow, bool) {
    rows.iter()
        .find(|(r, _)| r.kind == "workflow")
        .cloned()
        .expect("a workflow row")
}

async fn pinned_version(coord: &Coordinator, id: Uuid) -> (i64, String) {
    let started = events(coord, id).await.remove(0);
    assert_eq!(started.kind, "run_started");
    let w = &started.payload["plan"]["workflow"];
    (
        w["version"].as_i64().expect("version"),
        w["content_hash"].as_str().expect("hash").to_owned(),
    )
}

async fn a_run_stays_on_the_version_it_started_with(backend: Backend) {
    let (db, coord) = setup(backend).await;
    let (v1, created) = workflow_row(&register(&coord, VERSIONED).await);
    assert_eq!((v1.version, created), (1, true));
    let old = start(&coord, "versioned", json!({}), "k1").await;
    assert_eq!(old.workflow_version, 1);

    let changed = VERSIONED.replace("output: v1", "output: v2");
    let (v2, created) = workflow_row(&register(&coord, &changed).await);
    assert_eq!((v2.version, created), (2, true));
    assert_ne!(v2.content_hash, v1.content_hash);
    let (again, created) = workflow_row(&register(&coord, &changed).await);
    assert_eq!(
        (again.version, created),
        (2, false),
        "same content, same version"
    );
    // v1's row is as it was.
    let stored = coord
        .store()
        .list_definitions(TENANT, Some("workflow"))
        .await
        .expect("definitions");
    let stored_v1 = stored.iter().find(|r| r.version == 1).expect("v1");
    assert_eq!(
        (
            &stored_v1.content_hash,
            &stored_v1.body,
            stored_v1.created_at
        ),
        (&v1.content_hash, &v1.body, v1.created_at)
    );
    assert_eq!(stored.len(), 2);

    let new = start(&coord, "versioned", json!({}), "k2").await;
    assert_eq!(new.workflow_version, 2);
    assert_eq!(
        pinned_version(&coord, old.run_id).await,
        (1, v1.content_hash.clone())
    );
    assert_eq!(
        pinned_version(&coord, new.run_id).await,
        (2, v2.content_hash.clone())
    );
    let (old_done, _) = signal(&coord, old.run_id, "go", "g", json!({}))
        .await
        .expect("signal");
    let (new_done, _) = signal(&coord, new.run_id, "go", "g", json!({}))
        .await
        .expect("signal");
    assert_eq!(old_done.output, Some(json!("v1")));
    assert_eq!(new_done.output, Some(json!("v2")));
    assert_eq!(run(&coord, old.run_id).await.workflow_version, 1);
    db.drop().await;
}

// ---- what a waiting run holds ---------------------------------------------------------

const TOOL_THEN_WAIT: &str = r#"kind: workflow
name: tool_then_wait
nodes:
  - {id: create, type: tool, tool: create_account, args: {email: "${ .input.email }"}, grants: [crm.write], next: docs}
  - {id: docs, type: wait, signal: documents_received, timeout: 7d, next: done}
  - {id: done, type: succeed}
"#;

async fn a_waiting_run_holds_no_task_and_no_lease(backend: Backend) {
    let (db, coord) = setup(backend).await;
    register(&coord, TOOL_THEN_WAIT).await;
    register(&coord, DOCS).await;
    let raw = db.raw().await;

    let waits_only = start(&coord, "docs", json!({}), "k1").await;
    assert_eq!(waits_only.status, "waiting");
    assert_eq!(
        count(&raw, "tasks WHERE run_id = $1", waits_only.run_id).await,
        0
    );

    let r = start(&coord, "tool_then_wait", json!({"email": "a@x.io"}), "k2").await;
    let task = coord.claim("w1", 4, 0).await.expect("claim");
    assert_eq!(task.len(), 1);
    let task_id = task[0].task_id.to_string();
    coord.dispatch("w1", &task_id, 1).await.expect("dispatch");
    coord
        .complete("w1", &task_id, 1, r#"{"account_id": "acct_1"}"#)
        .await
        .expect("complete");
    assert_eq!(run(&coord, r.run_id).await.status, "waiting");

    for id in [waits_only.run_id, r.run_id] {
        assert_eq!(
            count(
                &raw,
                "tasks WHERE run_id = $1 AND (status IN ('ready', 'leased') OR lease_expires_at IS NOT NULL)",
                id
            )
            .await,
            0,
            "run {id} holds a task or a lease"
        );
        assert_eq!(count(&raw, "timers WHERE run_id = $1", id).await, 1);
    }
    assert_eq!(
        count(
            &raw,
            "tasks WHERE run_id = $1 AND status = 'completed'",
            r.run_id
        )
        .await,
        1
    );
    assert_eq!(
        coord.store().next_ready_in_ms().await.expect("next ready"),
        None
    );
    assert!(coord.claim("w1", 4, 0).await.expect("claim").is_empty());
    coord.store().advance_clock(DAY_MS).await.expect("clock");
    assert_eq!(fire(&coord).await, 0);
    assert_eq!(
        coord.store().next_ready_in_ms().await.expect("next ready"),
        None
    );
    db.drop().await;
}

const WORKFLOW_TOOL: &str = r#"TOOLS:
  run_kyc(customer_email: string) -> {kyc: string}
    description: "Runs the KYC workflow"
    type: workflow
    workflow_id: child
    timeout_ms: 86400000
    param_mapping:
      email: customer_email
    permission: crm.write
    repeat_safety: idempotent
"#;

const TOOL_PARENT: &str = r#"kind: workflow
name: tool_parent
nodes:
  - {id: check, type: tool, tool: run_kyc, args: {customer_email: "${ .input.email }"}, grants: [crm.write]}
"#;

async fn a_workflow_tool_runs_a_child_and_its_output_is_the_calls_result(backend: Backend) {
    let (db, coord) = setup(backend).await;
    register(&coord, FAMILY).await;
    coord
        .register_bundle(
            TENANT,
            vec![
                SourceFile {
                    path: "kyc.tools.abl".into(),
                    content: WORKFLOW_TOOL.into(),
                },
                SourceFile {
                    path: "tool_parent.yaml".into(),
                    content: TOOL_PARENT.into(),
                },
            ],
        )
        .await
        .expect("register the workflow tool");
    let p = start(&coord, "tool_parent", json!({"email": "a@x.io"}), "wt1").await;
    let c = Uuid::parse_str(&child_run_id(&p.run_id.to_string(), "check.t1")).expect("uuid");
    // No task for a worker: the engine starts the child itself; the run waits visibly.
    assert_eq!(p.status, "waiting");
    assert_eq!(coord.claim("w1", 4, 0).await.expect("claim").len(), 0);
    assert_eq!(outbox(&coord).await, 1);
    let child = run(&coord, c).await;
    assert_eq!(child.status, "waiting");
    // `param_mapping` renamed the tool's parameter to the child's input key.
    assert_eq!(child.input, json!({"email": "a@x.io"}));
    signal(&coord, c, "checked", "c1", json!({"result": "clear"}))
        .await
        .expect("signal the child");
    assert_eq!(outbox(&coord).await, 1);
    let parent = run(&coord, p.run_id).await;
    assert_eq!(
        (parent.status.as_str(), parent.output),
        (
            "completed",
            Some(json!({"kyc": "clear", "email": "a@x.io"}))
        )
    );

    // Cancelling a parent whose workflow-tool call waits cancels the child.
    let p = start(&coord, "tool_parent", json!({"email": "b@x.io"}), "wt2").await;
    let c = Uuid::parse_str(&child_run_id(&p.run_id.to_string(), "check.t1")).expect("uuid");
    assert_eq!(outbox(&coord).await, 1);
    coord
        .cancel_run(TENANT, &p.run_id.to_string(), "no longer needed")
        .await
        .expect("cancel");
    assert_eq!(outbox(&coord).await, 1);
    assert_eq!(run(&coord, c).await.status, "cancelled");
    db.drop().await;
}

// ---- child runs that nest without end ------------------------------------

const SELF_LOOP: &str = r#"kind: workflow
name: looper
nodes:
  - {id: first, type: succeed}
  - {id: again, type: workflow, workflow: looper}
"#;

async fn a_workflow_that_starts_itself_is_refused_at_registration(backend: Backend) {
    let (db, coord) = setup(backend).await;
    let refused = coord
        .register_bundle(
            TENANT,
            vec![SourceFile {
                path: "loop.yaml".into(),
                content: SELF_LOOP.into(),
            }],
        )
        .await;
    let Err(CoordinatorError::Definitions(errors)) = refused else {
        panic!("expected definition errors, got {refused:?}");
    };
    let messages: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(messages.len(), 1, "{messages:?}");
    assert!(
        messages[0].starts_with(
            "loop.yaml:5:43: workflow `looper` starts itself again through child runs: `looper` (node `again`) → `looper`;"
        ),
        "{messages:?}"
    );
    // Through a `type: workflow` tool of the same bundle, too.
    let refused = coord
        .register_bundle(
            TENANT,
            vec![
                SourceFile {
                    path: "kyc.tools.abl".into(),
                    content: WORKFLOW_TOOL.into(),
                },
                SourceFile {
                    path: "flows.yaml".into(),
                    content: "kind: workflow\nname: child\nnodes:\n  - {id: check, type: tool, tool: run_kyc, args: {customer_email: x}, grants: [crm.write]}\n".into(),
                },
            ],
        )
        .await;
    let Err(CoordinatorError::Definitions(errors)) = refused else {
        panic!("expected definition errors, got {refused:?}");
    };
    assert!(
        errors[0]
            .message
            .contains("`child` (node `check`, tool `run_kyc`) → `child`"),
        "{errors:?}"
    );
    assert!(
        coord
            .store()
            .definition_names(TENANT, "workflow")
            .await
            .expect("names")
            .is_empty(),
        "nothing registered"
    );
    db.drop().await;
}

/// `w0` → `w1` → … → `w<levels>`, each a sync child of the one before.
fn chain(levels: u32) -> String {
    let mut yaml = String::new();
    for i in 0..levels {
        yaml.push_str(&format!(
            "kind: workflow\nname: w{i}\nnodes:\n  - {{id: deeper, type: workflow, workflow: w{}}}\n---\n",
            i + 1
        ));
    }
    yaml.push_str(&format!(
        "kind: workflow\nname: w{levels}\nnodes:\n  - {{id: done, type: succeed, output: bottom}}\n"
    ));
    yaml
}

/// Carry out the outbox until nothing is left (bounded).
async fn drain_outbox(coord: &Coordinator) {
    for _ in 0..100 {
        if outbox(coord).await == 0 {
            return;
        }
    }
    panic!("the outbox never emptied");
}

/// `run` and the chain of `deeper.c1` children below it, as far as they exist.
async fn descendants(coord: &Coordinator, run: Uuid) -> Vec<RunRow> {
    let mut rows = vec![self::run(coord, run).await];
    loop {
        let parent = rows.last().expect("a run").run_id;
        let child = Uuid::parse_str(&child_run_id(&parent.to_string(), "deeper.c1")).expect("uuid");
        match coord.get_run(TENANT, &child.to_string()).await {
            Ok(row) => rows.push(row),
            Err(CoordinatorError::NotFound(_)) => return rows,
            Err(e) => panic!("{e}"),
        }
    }
}

async fn child_runs_nest_at_most_max_child_depth(backend: Backend) {
    use belay_engine::coordinator::MAX_CHILD_DEPTH;
    let (db, coord) = setup(backend).await;

    // As deep as allowed: every level runs, and the top completes.
    register(&coord, &chain(MAX_CHILD_DEPTH)).await;
    let p = start(&coord, "w0", json!({}), "deep-ok").await;
    drain_outbox(&coord).await;
    let runs = descendants(&coord, p.run_id).await;
    assert_eq!(runs.len() as u32, MAX_CHILD_DEPTH + 1);
    assert!(
        runs.iter().all(|r| r.status == "completed"),
        "{:?}",
        runs.iter()
            .map(|r| (&r.workflow, &r.status, &r.status_reason))
            .collect::<Vec<_>>()
    );
    assert_eq!(runs[0].output, Some(json!("bottom")));

    // One level more: the deepest child is not created; the node that
    // would start it fails, and so does every run above it.
    register_in(&coord, "t2", &chain(MAX_CHILD_DEPTH + 1)).await;
    let p = start_in(&coord, "t2", "w0", json!({}), "deep-too").await;
    drain_outbox(&coord).await;
    let mut rows = vec![run_in(&coord, "t2", p.run_id).await];
    loop {
        let parent = rows.last().expect("a run").run_id;
        let child = Uuid::parse_str(&child_run_id(&parent.to_string(), "deeper.c1")).expect("uuid");
        match coord.get_run("t2", &child.to_string()).await {
            Ok(row) => rows.push(row),
            Err(CoordinatorError::NotFound(_)) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(
        rows.len() as u32,
        MAX_CHILD_DEPTH + 1,
        "no run below level {MAX_CHILD_DEPTH}"
    );
    let deepest = rows.last().expect("a run");
    assert_eq!(deepest.workflow, format!("w{MAX_CHILD_DEPTH}"));
    assert_eq!(deepest.status, "failed");
    assert!(
        deepest.status_reason.contains("could not start")
            && deepest.status_reason.contains(&format!(
                "workflow `w{}` would be a child run {} levels deep, more than the {MAX_CHILD_DEPTH}",
                MAX_CHILD_DEPTH + 1,
                MAX_CHILD_DEPTH + 1
            )),
        "{}",
        deepest.status_reason
    );
    assert!(rows.iter().all(|r| r.status == "failed"));

    // A cycle registration cannot see (a new version of a registered
    // workflow closes it) is bounded the same way.
    let a_b = |b_body: &str| {
        format!(
            "kind: workflow\nname: a\nnodes:\n  - {{id: deeper, type: workflow, workflow: b}}\n---\nkind: workflow\nname: b\nnodes:\n  - {b_body}\n"
        )
    };
    register_in(&coord, "t3", &a_b("{id: done, type: succeed}")).await;
    register_in(
        &coord,
        "t3",
        "kind: workflow\nname: b\nnodes:\n  - {id: deeper, type: workflow, workflow: a}\n",
    )
    .await;
    let p = start_in(&coord, "t3", "a", json!({}), "cycle").await;
    drain_outbox(&coord).await;
    let mut levels = 1;
    let mut at = p.run_id;
    loop {
        let child = Uuid::parse_str(&child_run_id(&at.to_string(), "deeper.c1")).expect("uuid");
        match coord.get_run("t3", &child.to_string()).await {
            Ok(row) => {
                assert_eq!(row.status, "failed");
                levels += 1;
                at = row.run_id;
            }
            Err(CoordinatorError::NotFound(_)) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(levels, MAX_CHILD_DEPTH + 1);
    assert_eq!(run_in(&coord, "t3", p.run_id).await.status, "failed");
    db.drop().await;
}

const CONFIRMED_TOOL: &str = r#"TOOLS:
  pay(amount: number, recipient: string) -> {payment_id: string}
    description: "Execute a payment"
    type: http
    endpoint: "/payments"
    permission: crm.write
    repeat_safety: idempotent
    confirmation:
      require: always
      immutable_params: [recipient]
"#;

const CONFIRMED_FLOW: &str = r#"kind: workflow
name: payout
nodes:
  - {id: pay, type: tool, tool: pay, args: {amount: 120, recipient: "acct_9"}, grants: [crm.write]}
"#;

async fn a_confirmed_tool_call_waits_for_a_decision_and_runs_the_approved_arguments(
    backend: Backend,
) {
    let (db, coord) = setup(backend).await;
    coord
        .register_bundle(
            TENANT,
            vec![
                SourceFile {
                    path: "pay.tools.abl".into(),
                    content: CONFIRMED_TOOL.into(),
                },
                SourceFile {
                    path: "payout.yaml".into(),
                    content: CONFIRMED_FLOW.into(),
                },
            ],
        )
        .await
        .expect("register");
    let r = start(&coord, "payout", json!({}), "pay1").await;
    assert_eq!(r.status, "waiting");
    // Nothing to dispatch before the decision.
    assert!(coord.claim("w1", 4, 0).await.expect("claim").is_empty());
    let id = r.run_id.to_string();
    let refused = coord
        .decide_approval(
            TENANT,
            &id,
            decision(
                "pay.t1",
                true,
                r#"{"amount": 120, "recipient": "x"}"#,
                "ana",
                &["crm.write".into()],
                "ok",
            ),
        )
        .await
        .map(|(run, _)| run)
        .expect_err("immutable");
    assert!(
        matches!(refused, CoordinatorError::Unprocessable { .. }),
        "{refused:?}"
    );
    coord
        .decide_approval(
            TENANT,
            &id,
            decision(
                "pay.t1",
                true,
                r#"{"amount": 100, "recipient": "acct_9"}"#,
                "ana",
                &["crm.write".into()],
                "ok",
            ),
        )
        .await
        .map(|(run, _)| run)
        .expect("approve");
    let tasks = coord.claim("w1", 4, 0).await.expect("claim");
    assert_eq!(tasks.len(), 1);
    assert_eq!(
        tasks[0].spec["arguments"],
        json!({"amount": 100, "recipient": "acct_9"})
    );
    let again = coord
        .decide_approval(
            TENANT,
            &id,
            decision("pay.t1", false, "", "bob", &["crm.write".into()], "no"),
        )
        .await
        .map(|(run, _)| run)
        .expect_err("second decision");
    assert!(matches!(again, CoordinatorError::Conflict(_)), "{again:?}");
    assert_eq!(
        count_kind(&coord, r.run_id, "confirmation_decided").await,
        1
    );
    db.drop().await;
}

on_both_backends!(
    a_confirmed_tool_call_waits_for_a_decision_and_runs_the_approved_arguments,
    a_workflow_that_starts_itself_is_refused_at_registration,
    child_runs_nest_at_most_max_child_depth,
    a_workflow_tool_runs_a_child_and_its_output_is_the_calls_result,
    a_signal_sent_before_its_wait_is_kept_and_taken_at_once,
    a_duplicate_signal_is_reported_and_writes_nothing,
    a_signal_nobody_waits_for_or_a_bad_payload_is_refused_and_writes_nothing,
    a_timer_due_while_no_engine_runs_fires_once_on_the_next_engine,
    timeouts_take_on_timeout_or_fail_the_run_and_a_duration_can_beat_a_signal,
    two_engines_firing_the_same_due_timers_fire_each_once,
    an_approval_needs_the_grant_is_decided_once_and_the_next_node_sees_the_approved_subject,
    a_sync_child_run_is_started_waited_for_and_its_output_is_the_parents,
    a_child_that_cannot_start_makes_the_parent_take_on_error,
    cancelling_a_parent_cancels_its_waiting_child_once,
    the_background_loops_start_children_tell_parents_and_fire_timers_on_their_own,
    a_run_stays_on_the_version_it_started_with,
    a_waiting_run_holds_no_task_and_no_lease,
);
