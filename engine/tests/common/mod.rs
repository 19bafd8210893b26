//! Shared by the engine's PostgreSQL tests: a fresh database per test.

/// A database created for one test; [`Db::drop`] removes it.
pub struct Db {
    /// Database name.
    pub name: String,
    /// URL of the database.
    pub url: String,
    admin: String,
}

impl Db {
    /// Create `<prefix>_<uuid>` on `$BELAY_TEST_PG` (default the local
    /// server); returns it and its URL.
    pub async fn create(prefix: &str) -> (Db, String) {
        let base = std::env::var("BELAY_TEST_PG")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into());
        let name = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
        let admin = format!("{base}/postgres");
        let pool = sqlx::PgPool::connect(&admin)
            .await
            .expect("PostgreSQL on 127.0.0.1:5432");
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&pool)
            .await
            .expect("create db");
        pool.close().await;
        (
            Db {
                name: name.clone(),
                url: format!("{base}/{name}"),
                admin,
            },
            format!("{base}/{name}"),
        )
    }

    /// Drop the database, closing leftover connections.
    pub async fn drop(self) {
        let pool = sqlx::PgPool::connect(&self.admin).await.expect("admin");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        )))
        .execute(&pool)
        .await
        .expect("drop db");
    }
}
