//! Sessions of the operator console (`console_sessions`): created at
//! sign-in (sweeping expired ones), read on every console request (one
//! indexed statement, unexpired only), deleted at sign-out. Times are the
//! engine's clock (`belay_now()`).

use super::Pg;
use crate::console_sessions::{ConsoleSessionRow, NewConsoleSession};
use crate::rows::StoreError;

impl Pg {
    /// See [`crate::Store::create_console_session`].
    pub(crate) async fn create_console_session(
        &self,
        s: &NewConsoleSession,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM console_sessions WHERE expires_at <= belay_now()")
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO console_sessions (id_sha256, credential, credential_sha256, principal,
                                           csrf, created_at, expires_at)
             VALUES ($1, $2, $3, $4, $5, belay_now(),
                     belay_now() + $6::bigint * interval '1 millisecond')",
        )
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

    /// See [`crate::Store::console_session`].
    pub(crate) async fn console_session(
        &self,
        id_sha256: &str,
    ) -> Result<Option<ConsoleSessionRow>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT credential, credential_sha256, principal, csrf, created_at, expires_at
             FROM console_sessions WHERE id_sha256 = $1 AND expires_at > belay_now()",
        )
        .bind(id_sha256)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// See [`crate::Store::end_console_session`].
    pub(crate) async fn end_console_session(&self, id_sha256: &str) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM console_sessions WHERE id_sha256 = $1")
            .bind(id_sha256)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }
}
