//! Sessions of the operator console (`console_sessions`), as on PostgreSQL
//! (`postgres/console_sessions.rs`); times are the engine's clock
//! ([`NOW`]) in the stored format, reads on the read pool.

use super::{Lite, NOW, now_plus_ms};
use crate::console_sessions::{ConsoleSessionRow, NewConsoleSession};
use crate::rows::StoreError;

impl Lite {
    pub(crate) async fn create_console_session(
        &self,
        s: &NewConsoleSession,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DELETE FROM console_sessions WHERE expires_at <= {NOW}"
        )))
        .execute(&mut *tx)
        .await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO console_sessions (id_sha256, credential, credential_sha256, principal,
                                           csrf, created_at, expires_at)
             VALUES (?1, ?2, ?3, ?4, ?5, {NOW}, {})",
            now_plus_ms(6)
        )))
        .bind(&s.id_sha256)
        .bind(&s.credential)
        .bind(&s.credential_sha256)
        .bind(&s.principal)
        .bind(&s.csrf)
        .bind(s.ttl_ms)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    pub(crate) async fn console_session(
        &self,
        id_sha256: &str,
    ) -> Result<Option<ConsoleSessionRow>, StoreError> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT credential, credential_sha256, principal, csrf, created_at, expires_at
             FROM console_sessions WHERE id_sha256 = ?1 AND expires_at > {NOW}"
        )))
        .bind(id_sha256)
        .fetch_optional(&self.read)
        .await?)
    }

    pub(crate) async fn end_console_session(&self, id_sha256: &str) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM console_sessions WHERE id_sha256 = ?1")
            .bind(id_sha256)
            .execute(&self.write)
            .await?;
        Ok(done.rows_affected() > 0)
    }
}
