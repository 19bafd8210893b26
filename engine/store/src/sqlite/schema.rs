//! What the database's migrations are, for the compatibility check of
//! [`crate::Store::migrate`] (`crate::schema`).

use super::Lite;
use crate::StoreError;

impl Lite {
    /// The versions of the migrations applied (sqlx's `_sqlx_migrations`),
    /// and `schema_compat.oldest_compatible`; empty and `None` on a new
    /// database.
    pub(crate) async fn schema_versions(&self) -> Result<(Vec<i64>, Option<i64>), StoreError> {
        let tables: Vec<String> = sqlx::query_scalar(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN ('_sqlx_migrations', 'schema_compat')",
        )
        .fetch_all(&self.write)
        .await?;
        let applied: Vec<i64> = if tables.iter().any(|t| t == "_sqlx_migrations") {
            sqlx::query_scalar(
                "SELECT version FROM _sqlx_migrations WHERE success ORDER BY version",
            )
            .fetch_all(&self.write)
            .await?
        } else {
            Vec::new()
        };
        let oldest = if tables.iter().any(|t| t == "schema_compat") {
            sqlx::query_scalar("SELECT oldest_compatible FROM schema_compat WHERE id = 1")
                .fetch_optional(&self.write)
                .await?
        } else {
            None
        };
        Ok((applied, oldest))
    }
}
