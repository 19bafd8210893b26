//! Principals in the store (table `principals`, issue 26) on both
//! backends: a credential is created and read back by key id and by
//! certificate subject, listed with and without a tenant, revoked once
//! (a second revoke keeps the first time), judged expired by the engine's
//! clock (moved with `Store::advance_clock`, never slept); a duplicate
//! key id or certificate subject is a `StoreError::Conflict` and a row
//! the CHECK constraints refuse is an error that writes nothing. Also
//! claims limited to tenants: a worker of tenant `a` is handed only `a`'s
//! tasks and told nothing of `b`'s.

mod common;
use common::{Backend, TestDb};

use belay_engine::coordinator::StartRun;
use belay_engine::store::{NewPrincipal, PrincipalRow, Store, StoreError};
use chrono::{DateTime, Utc};
use uuid::Uuid;

/// A lowercase hex SHA-256 (of `"test"`).
const HASH: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

/// An API key `key_id` of `principal` (role `client`, every tenant, never
/// expiring).
fn api_key(key_id: &str, principal: &str) -> NewPrincipal {
    NewPrincipal {
        key_id: key_id.into(),
        principal: principal.into(),
        role: "client".into(),
        tenants: None,
        grants: vec![],
        secret_sha256: Some(HASH.into()),
        cert_subject: None,
        description: String::new(),
        created_by: "admin@ops".into(),
        expires_in_ms: None,
    }
}

/// A certificate-only principal `key_id` for `subject`.
fn cert(key_id: &str, principal: &str, subject: &str) -> NewPrincipal {
    NewPrincipal {
        secret_sha256: None,
        cert_subject: Some(subject.into()),
        role: "worker".into(),
        ..api_key(key_id, principal)
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

fn key_ids(rows: &[PrincipalRow]) -> Vec<&str> {
    rows.iter().map(|r| r.key_id.as_str()).collect()
}

/// A fresh store of `backend`, with its database.
async fn open(backend: Backend) -> (TestDb, Store) {
    let db = TestDb::create(backend, "belay_p").await;
    let store = db.store(4).await;
    (db, store)
}

async fn close(db: TestDb, store: Store) {
    store.close().await;
    db.drop().await;
}

/// `create_principal` between two readings of the engine's clock: the
/// first reading, the row and the second reading.
async fn created_between(
    store: &Store,
    p: &NewPrincipal,
) -> (DateTime<Utc>, PrincipalRow, DateTime<Utc>) {
    let before = store.clock_now().await.expect("clock");
    let row = store.create_principal(p).await.expect("create");
    let after = store.clock_now().await.expect("clock");
    (before, row, after)
}

async fn create_and_read_by_key_id_and_cert_subject(backend: Backend) {
    let (db, store) = open(backend).await;
    // The engine's clock, not the machine's: a day ahead.
    store.advance_clock(86_400_000).await.expect("clock");
    let new = NewPrincipal {
        role: "operator".into(),
        tenants: Some(strings(&["acme", "globex"])),
        grants: strings(&["crm.write", "runs.cancel"]),
        description: "Alice's laptop".into(),
        ..api_key("k_alice", "alice@acme")
    };
    let (before, created, after) = created_between(&store, &new).await;
    assert_eq!(created.key_id, "k_alice");
    assert_eq!(created.principal, "alice@acme");
    assert_eq!(created.role, "operator");
    assert_eq!(created.tenants, Some(strings(&["acme", "globex"])));
    assert_eq!(created.grants, strings(&["crm.write", "runs.cancel"]));
    assert_eq!(created.secret_sha256.as_deref(), Some(HASH));
    assert_eq!(created.cert_subject, None);
    assert_eq!(created.description, "Alice's laptop");
    assert_eq!(created.created_by, "admin@ops");
    assert!(
        before <= created.created_at && created.created_at <= after,
        "{before} <= {} <= {after}",
        created.created_at
    );
    assert!(created.created_at > Utc::now() + chrono::Duration::hours(23));
    assert_eq!((created.expires_at, created.revoked_at), (None, None));
    assert!(!created.expired);
    assert_eq!(
        store.principal_by_key_id("k_alice").await.expect("read"),
        Some(created.clone())
    );
    assert_eq!(
        store.principal_by_key_id("k_nobody").await.expect("read"),
        None
    );
    // A key's hash is not a certificate subject.
    assert_eq!(
        store.principal_by_cert_subject(HASH).await.expect("read"),
        None
    );

    let worker = store
        .create_principal(&cert("k_pool", "worker-pool-a", "CN=worker-a"))
        .await
        .expect("create");
    assert_eq!(worker.secret_sha256, None);
    assert_eq!(worker.cert_subject.as_deref(), Some("CN=worker-a"));
    assert_eq!((worker.role.as_str(), &worker.grants), ("worker", &vec![]));
    assert_eq!(
        store
            .principal_by_cert_subject("CN=worker-a")
            .await
            .expect("read"),
        Some(worker.clone())
    );
    assert_eq!(
        store.principal_by_key_id("k_pool").await.expect("read"),
        Some(worker)
    );
    assert_eq!(
        store
            .principal_by_cert_subject("CN=worker-b")
            .await
            .expect("read"),
        None
    );
    close(db, store).await;
}

async fn list_with_and_without_a_tenant(backend: Backend) {
    let (db, store) = open(backend).await;
    assert!(store.list_principals(None).await.expect("list").is_empty());
    let only_a = NewPrincipal {
        tenants: Some(strings(&["a"])),
        ..api_key("k3", "p3")
    };
    store.create_principal(&only_a).await.expect("create");
    // Later by the engine's clock, so listed after k3 whatever the keys.
    store.advance_clock(1_000).await.expect("clock");
    let a_and_b = NewPrincipal {
        tenants: Some(strings(&["b", "a"])),
        ..api_key("k1", "p1")
    };
    store.create_principal(&a_and_b).await.expect("create");
    store.advance_clock(1_000).await.expect("clock");
    store
        .create_principal(&api_key("k2", "every-tenant"))
        .await
        .expect("create");
    // Revoked and expired ones are listed too.
    store.revoke_principal("k1").await.expect("revoke");
    store.advance_clock(1_000).await.expect("clock");
    let expired = NewPrincipal {
        tenants: Some(strings(&["b"])),
        expires_in_ms: Some(-1),
        ..cert("k0", "p0", "CN=zero")
    };
    store.create_principal(&expired).await.expect("create");

    let all = store.list_principals(None).await.expect("list");
    assert_eq!(key_ids(&all), ["k3", "k1", "k2", "k0"]);
    assert!(all[1].revoked_at.is_some() && all[3].expired);
    let of = |tenant: &'static str| {
        let store = store.clone();
        async move {
            let rows = store.list_principals(Some(tenant)).await.expect("list");
            rows.into_iter().map(|r| r.key_id).collect::<Vec<_>>()
        }
    };
    // A principal of every tenant (k2) is in no tenant's list.
    assert_eq!(of("a").await, ["k3", "k1"]);
    assert_eq!(of("b").await, ["k1", "k0"]);
    assert!(of("c").await.is_empty());
    // A tenant name is matched whole, never as a pattern.
    assert!(of("%").await.is_empty());
    close(db, store).await;
}

async fn revoke_is_idempotent(backend: Backend) {
    let (db, store) = open(backend).await;
    store
        .create_principal(&api_key("k1", "alice@acme"))
        .await
        .expect("create");
    let before = store.clock_now().await.expect("clock");
    let revoked = store
        .revoke_principal("k1")
        .await
        .expect("revoke")
        .expect("k1 exists");
    let after = store.clock_now().await.expect("clock");
    let at = revoked.revoked_at.expect("revoked");
    assert!(before <= at && at <= after, "{before} <= {at} <= {after}");
    store.advance_clock(60_000).await.expect("clock");
    let again = store
        .revoke_principal("k1")
        .await
        .expect("revoke")
        .expect("k1 exists");
    assert_eq!(again, revoked, "a second revoke keeps the first time");
    assert_eq!(
        store.principal_by_key_id("k1").await.expect("read"),
        Some(revoked)
    );
    assert_eq!(
        store.revoke_principal("k_nobody").await.expect("revoke"),
        None
    );
    close(db, store).await;
}

async fn expiry_is_judged_by_the_database_clock(backend: Backend) {
    let (db, store) = open(backend).await;
    let new = NewPrincipal {
        expires_in_ms: Some(60_000),
        ..api_key("k_short", "alice@acme")
    };
    let created = store.create_principal(&new).await.expect("create");
    let expires_at = created.expires_at.expect("an expiry");
    assert_eq!(
        expires_at - created.created_at,
        chrono::Duration::minutes(1)
    );
    assert!(!created.expired);
    store
        .create_principal(&api_key("k_forever", "alice@acme"))
        .await
        .expect("create");
    let read = |key: &'static str| {
        let store = store.clone();
        async move {
            store
                .principal_by_key_id(key)
                .await
                .expect("read")
                .expect("exists")
        }
    };

    store.advance_clock(30_000).await.expect("clock");
    assert!(!read("k_short").await.expired);
    store.advance_clock(30_000).await.expect("clock");
    let short = read("k_short").await;
    assert!(short.expired, "{short:?}");
    assert_eq!(short.expires_at, Some(expires_at));
    // Revoking or listing does not change the verdict.
    let revoked = store
        .revoke_principal("k_short")
        .await
        .expect("revoke")
        .expect("exists");
    assert!(revoked.expired);
    assert!(
        store
            .list_principals(None)
            .await
            .expect("list")
            .iter()
            .all(|r| r.expired == (r.key_id == "k_short"))
    );

    // A year on, a key without an expiry still holds.
    store.advance_clock(365 * 86_400_000).await.expect("clock");
    let forever = read("k_forever").await;
    assert!(!forever.expired && forever.expires_at.is_none());
    close(db, store).await;
}

async fn a_duplicate_key_id_or_cert_subject_is_a_conflict(backend: Backend) {
    let (db, store) = open(backend).await;
    let first = store
        .create_principal(&cert("k1", "worker-pool-a", "CN=worker-a"))
        .await
        .expect("create");

    let same_key = store.create_principal(&api_key("k1", "mallory")).await;
    match same_key {
        Err(StoreError::Conflict(msg)) => assert!(msg.contains("key_id"), "{msg}"),
        other => panic!("a duplicate key_id: {other:?}"),
    }
    let same_subject = store
        .create_principal(&cert("k2", "mallory", "CN=worker-a"))
        .await;
    match same_subject {
        Err(StoreError::Conflict(msg)) => assert!(msg.contains("cert_subject"), "{msg}"),
        other => panic!("a duplicate cert_subject: {other:?}"),
    }
    // Nothing was written: the first row as it was, and no k2.
    assert_eq!(store.list_principals(None).await.expect("list"), [first]);
    // Many API keys share no subject (NULL is never a duplicate).
    store
        .create_principal(&api_key("k3", "alice@acme"))
        .await
        .expect("create");
    store
        .create_principal(&api_key("k4", "alice@acme"))
        .await
        .expect("create");
    close(db, store).await;
}

/// Whether `result` is the database refusing the row with a CHECK
/// constraint.
fn is_check_violation(result: &Result<PrincipalRow, StoreError>) -> bool {
    matches!(
        result,
        Err(StoreError::Database(sqlx::Error::Database(db))) if db.is_check_violation()
    )
}

async fn the_database_refuses_a_row_its_checks_forbid(backend: Backend) {
    let (db, store) = open(backend).await;
    let neither = NewPrincipal {
        secret_sha256: None,
        ..api_key("k_neither", "p")
    };
    let both = NewPrincipal {
        cert_subject: Some("CN=both".into()),
        ..api_key("k_both", "p")
    };
    let unknown_role = NewPrincipal {
        role: "root".into(),
        ..api_key("k_role", "p")
    };
    let no_tenant = NewPrincipal {
        tenants: Some(vec![]),
        ..api_key("k_empty", "p")
    };
    for bad in [neither, both, unknown_role, no_tenant] {
        let result = store.create_principal(&bad).await;
        assert!(is_check_violation(&result), "{bad:?}: {result:?}");
        assert_eq!(
            store.principal_by_key_id(&bad.key_id).await.expect("read"),
            None
        );
    }
    assert_eq!(
        store
            .principal_by_cert_subject("CN=both")
            .await
            .expect("read"),
        None
    );
    assert!(store.list_principals(None).await.expect("list").is_empty());
    close(db, store).await;
}

async fn a_claim_limited_to_tenants_sees_only_their_tasks(backend: Backend) {
    let (db, store) = open(backend).await;
    let coord = common::coordinator(
        store.clone(),
        &["a", "b"],
        common::CREATE_TOOL,
        common::CREATE_AGENT,
        &["crm.write"],
    )
    .await;
    let mut runs = Vec::new();
    for tenant in ["a", "b"] {
        let (run, created) = coord
            .start_run(StartRun {
                tenant: tenant.into(),
                workflow: "w".into(),
                input_json: "{}".into(),
                idempotency_key: format!("k-{tenant}"),
                caller: "c".into(),
                caller_grants: strings(&["crm.write"]),
            })
            .await
            .expect("start");
        assert!(created);
        runs.push(run.run_id);
    }
    let (run_a, run_b): (Uuid, Uuid) = (runs[0], runs[1]);
    let only_a = strings(&["a"]);

    // Each run's first model call is ready; `a`'s worker gets `a`'s and
    // hears of no other ready task, though `b`'s is.
    let (claimed, next) = store
        .claim_tasks_or_next("wa", 10, 60_000, Some(&only_a))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 1, "{claimed:?}");
    assert_eq!(
        (claimed[0].run_id, claimed[0].tenant.as_str()),
        (run_a, "a")
    );
    assert_eq!(next, None, "b's task is not a's worker's to wait for");
    assert_eq!(store.next_ready_in_ms().await.expect("next"), Some(0));
    assert!(
        store
            .claim_tasks("wa", 10, 60_000, Some(&only_a))
            .await
            .expect("claim")
            .is_empty()
    );
    // An empty list claims nothing; a tenant name is matched whole.
    assert!(
        store
            .claim_tasks("w", 10, 60_000, Some(&[]))
            .await
            .expect("claim")
            .is_empty()
    );
    assert!(
        store
            .claim_tasks("w", 10, 60_000, Some(&strings(&["%", "b'--"])))
            .await
            .expect("claim")
            .is_empty()
    );
    let (claimed, next) = store
        .claim_tasks_or_next("wb", 10, 60_000, Some(&strings(&["c", "b"])))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 1, "{claimed:?}");
    assert_eq!(
        (claimed[0].run_id, claimed[0].tenant.as_str()),
        (run_b, "b")
    );
    assert_eq!(next, None);
    // Nothing is left for anyone.
    let (claimed, next) = store
        .claim_tasks_or_next("w", 10, 60_000, None)
        .await
        .expect("claim");
    assert!(claimed.is_empty() && next.is_none(), "{claimed:?} {next:?}");
    close(db, store).await;
}

on_both_backends!(
    create_and_read_by_key_id_and_cert_subject,
    list_with_and_without_a_tenant,
    revoke_is_idempotent,
    expiry_is_judged_by_the_database_clock,
    a_duplicate_key_id_or_cert_subject_is_a_conflict,
    the_database_refuses_a_row_its_checks_forbid,
    a_claim_limited_to_tenants_sees_only_their_tasks,
);
