//! Rolling upgrades (issue 22), on both backends: an engine whose database
//! was migrated further by a newer release runs beside those migrations
//! while they are additive (it used to refuse to start: sqlx's "previously
//! applied but missing", so an old pod could not restart, scale or be
//! rolled back to), and refuses with a message naming the versions once a
//! newer release contracted the schema past it (`schema_compat`).

mod common;
use common::{Backend, TestDb};

use belay_engine::store::Store;

/// A migration version no release has yet.
const NEWER: i64 = 29_991_231_000_000;

/// As a newer release's migration leaves it: applied, unknown to this engine.
async fn apply_a_newer_migration(db: &TestDb) {
    let sql = match db.backend {
        Backend::Postgres => format!(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
             VALUES ({NEWER}, 'a newer release', true, '\\x00'::bytea, 0)"
        ),
        Backend::Sqlite => format!(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
             VALUES ({NEWER}, 'a newer release', 1, X'00', 0)"
        ),
    };
    let raw = db.raw().await;
    assert_eq!(raw.execute(&sql, None).await, 1);
    raw.close().await;
}

async fn an_engine_runs_beside_additive_migrations_of_a_newer_release_and_refuses_contracted_ones(
    backend: Backend,
) {
    let db = TestDb::create(backend, "belay_schema").await;
    let store = db.store(2).await;
    apply_a_newer_migration(&db).await;
    // The old engine restarts: it runs beside the newer migration.
    store
        .migrate()
        .await
        .expect("beside an additive newer migration");
    store.close().await;
    let again = Store::connect(&db.url, 2).await.expect("connect");
    again
        .migrate()
        .await
        .expect("a restarted old replica starts too");
    again.ping().await.expect("and works");

    // A later release contracts the schema: engines must know its version.
    let raw = db.raw().await;
    let raised = format!("UPDATE schema_compat SET oldest_compatible = {NEWER}");
    assert_eq!(raw.execute(&raised, None).await, 1);
    raw.close().await;
    let err = again
        .migrate()
        .await
        .expect_err("too old for the contracted schema");
    let text = err.to_string();
    assert!(
        text.contains(&format!("migrated to {NEWER}"))
            && text.contains(&format!("at least migration {NEWER}"))
            && text.contains("upgrade this engine"),
        "{text}"
    );
    again.close().await;
    db.drop().await;
}

on_both_backends!(
    an_engine_runs_beside_additive_migrations_of_a_newer_release_and_refuses_contracted_ones
);
