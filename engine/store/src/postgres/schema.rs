//! What the database's migrations are, for the compatibility check of
//! [`crate::Store::migrate`] (`crate::schema`).

use super::Pg;
use crate::StoreError;

impl Pg {
    /// The versions of the migrations applied (sqlx's `_sqlx_migrations`),
    /// and `schema_compat.oldest_compatible`; empty and `None` on a new
    /// database.
    pub(crate) async fn schema_versions(&self) -> Result<(Vec<i64>, Option<i64>), StoreError> {
        let (has_migrations, has_compat): (bool, bool) = sqlx::query_as(
            "SELECT to_regclass('_sqlx_migrations') IS NOT NULL, to_regclass('schema_compat') IS NOT NULL",
        )
        .fetch_one(&self.pool)
        .await?;
        let applied: Vec<i64> = if has_migrations {
            sqlx::query_scalar(
                "SELECT version FROM _sqlx_migrations WHERE success ORDER BY version",
            )
            .fetch_all(&self.pool)
            .await?
        } else {
            Vec::new()
        };
        let oldest = if has_compat {
            sqlx::query_scalar("SELECT oldest_compatible FROM schema_compat WHERE id = 1")
                .fetch_optional(&self.pool)
                .await?
        } else {
            None
        };
        Ok((applied, oldest))
    }
}
