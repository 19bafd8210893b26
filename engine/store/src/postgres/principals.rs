//! Principals and their credentials (`principals`): creating them, reading
//! one by key id or certificate subject (on every request: one indexed
//! statement), listing and revoking them. Times are the engine's clock
//! (`belay_now()`).

use super::Pg;
use crate::principals::{NewPrincipal, PrincipalRow, insert_error};
use crate::rows::StoreError;

/// The columns of [`PrincipalRow`], in its order, `expired` judged by the
/// engine's clock.
macro_rules! principal_columns {
    () => {
        "key_id, principal, role, tenants, grants, secret_sha256, cert_subject,
         description, created_by, created_at, expires_at, revoked_at,
         (expires_at IS NOT NULL AND expires_at <= belay_now()) AS expired"
    };
}

impl Pg {
    /// See [`crate::Store::create_principal`].
    pub(crate) async fn create_principal(
        &self,
        p: &NewPrincipal,
    ) -> Result<PrincipalRow, StoreError> {
        sqlx::query_as(concat!(
            "INSERT INTO principals (key_id, principal, role, tenants, grants, secret_sha256,
                                     cert_subject, description, created_by, created_at, expires_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, belay_now(),
                     belay_now() + $10::bigint * interval '1 millisecond')
             RETURNING ",
            principal_columns!()
        ))
        .bind(&p.key_id)
        .bind(&p.principal)
        .bind(&p.role)
        .bind(p.tenants.as_deref())
        .bind(&p.grants)
        .bind(p.secret_sha256.as_deref())
        .bind(p.cert_subject.as_deref())
        .bind(&p.description)
        .bind(&p.created_by)
        .bind(p.expires_in_ms)
        .fetch_one(&self.pool)
        .await
        .map_err(insert_error)
    }

    /// See [`crate::Store::principal_by_key_id`].
    pub(crate) async fn principal_by_key_id(
        &self,
        key_id: &str,
    ) -> Result<Option<PrincipalRow>, StoreError> {
        Ok(sqlx::query_as(concat!(
            "SELECT ",
            principal_columns!(),
            " FROM principals WHERE key_id = $1"
        ))
        .bind(key_id)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// See [`crate::Store::principal_by_cert_subject`].
    pub(crate) async fn principal_by_cert_subject(
        &self,
        subject: &str,
    ) -> Result<Option<PrincipalRow>, StoreError> {
        Ok(sqlx::query_as(concat!(
            "SELECT ",
            principal_columns!(),
            " FROM principals WHERE cert_subject = $1"
        ))
        .bind(subject)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// See [`crate::Store::list_principals`].
    pub(crate) async fn list_principals(
        &self,
        tenant: Option<&str>,
    ) -> Result<Vec<PrincipalRow>, StoreError> {
        // `$1 = ANY(NULL)` is NULL, so a row for every tenant is left out
        // of a tenant's list.
        Ok(sqlx::query_as(concat!(
            "SELECT ",
            principal_columns!(),
            " FROM principals WHERE $1::text IS NULL OR $1 = ANY(tenants)
             ORDER BY created_at, key_id"
        ))
        .bind(tenant)
        .fetch_all(&self.pool)
        .await?)
    }

    /// See [`crate::Store::revoke_principal`].
    pub(crate) async fn revoke_principal(
        &self,
        key_id: &str,
    ) -> Result<Option<PrincipalRow>, StoreError> {
        Ok(sqlx::query_as(concat!(
            "UPDATE principals SET revoked_at = COALESCE(revoked_at, belay_now())
             WHERE key_id = $1
             RETURNING ",
            principal_columns!()
        ))
        .bind(key_id)
        .fetch_optional(&self.pool)
        .await?)
    }
}
