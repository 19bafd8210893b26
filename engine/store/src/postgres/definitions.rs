//! Registered definitions (`definitions`): versions by content hash, the
//! newest registered being current.

use serde_json::Value;

use super::Pg;
use crate::rows::{DefinitionRow, StoreError};

impl Pg {
    /// Names of every registered definition of a kind for a tenant.
    pub(crate) async fn definition_names(
        &self,
        tenant: &str,
        kind: &str,
    ) -> Result<Vec<String>, StoreError> {
        let rows: Vec<(String,)> =
            sqlx::query_as("SELECT DISTINCT name FROM definitions WHERE tenant = $1 AND kind = $2")
                .bind(tenant)
                .bind(kind)
                .fetch_all(&self.pool)
                .await?;
        Ok(rows.into_iter().map(|r| r.0).collect())
    }

    /// Register definitions in one transaction: identical content (same hash)
    /// returns the existing version, new content gets the next version.
    /// Input: `(kind, name, content_hash, body, source_file)`. Output: rows and
    /// whether each was created.
    pub(crate) async fn register_definitions(
        &self,
        tenant: &str,
        defs: &[(String, String, String, Value, String)],
    ) -> Result<Vec<(DefinitionRow, bool)>, StoreError> {
        let mut tx = self.pool.begin().await?;
        // Serialise registrations of one tenant so version numbers do not race.
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 7))")
            .bind(tenant)
            .execute(&mut *tx)
            .await?;
        let mut out = Vec::with_capacity(defs.len());
        for (kind, name, hash, body, source_file) in defs {
            let existing: Option<DefinitionRow> = sqlx::query_as(
                "SELECT kind, name, version, content_hash, body, created_at FROM definitions
                 WHERE tenant = $1 AND kind = $2 AND name = $3 AND content_hash = $4",
            )
            .bind(tenant)
            .bind(kind)
            .bind(name)
            .bind(hash)
            .fetch_optional(&mut *tx)
            .await?;
            if let Some(row) = existing {
                // Identical content registered again becomes current again.
                sqlx::query(
                    "UPDATE definitions SET registered_at = clock_timestamp()
                     WHERE tenant = $1 AND kind = $2 AND name = $3 AND version = $4",
                )
                .bind(tenant)
                .bind(kind)
                .bind(name)
                .bind(row.version)
                .execute(&mut *tx)
                .await?;
                out.push((row, false));
                continue;
            }
            let row: DefinitionRow = sqlx::query_as(
                "INSERT INTO definitions (tenant, kind, name, version, content_hash, body, source_file, registered_at)
                 VALUES ($1, $2, $3,
                    (SELECT COALESCE(MAX(version), 0) + 1 FROM definitions WHERE tenant = $1 AND kind = $2 AND name = $3),
                    $4, $5, $6, clock_timestamp())
                 RETURNING kind, name, version, content_hash, body, created_at",
            )
            .bind(tenant)
            .bind(kind)
            .bind(name)
            .bind(hash)
            .bind(body)
            .bind(source_file)
            .fetch_one(&mut *tx)
            .await?;
            out.push((row, true));
        }
        tx.commit().await?;
        Ok(out)
    }

    /// Definitions of a tenant, optionally of one kind, by kind, name, version.
    pub(crate) async fn list_definitions(
        &self,
        tenant: &str,
        kind: Option<&str>,
    ) -> Result<Vec<DefinitionRow>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT kind, name, version, content_hash, body, created_at FROM definitions
             WHERE tenant = $1 AND ($2::text IS NULL OR kind = $2)
             ORDER BY kind, name, version",
        )
        .bind(tenant)
        .bind(kind)
        .fetch_all(&self.pool)
        .await?)
    }

    /// The newest version of a definition.
    pub(crate) async fn latest_definition(
        &self,
        tenant: &str,
        kind: &str,
        name: &str,
    ) -> Result<Option<DefinitionRow>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT kind, name, version, content_hash, body, created_at FROM definitions
             WHERE tenant = $1 AND kind = $2 AND name = $3
             ORDER BY registered_at DESC, version DESC LIMIT 1",
        )
        .bind(tenant)
        .bind(kind)
        .bind(name)
        .fetch_optional(&self.pool)
        .await?)
    }
}
