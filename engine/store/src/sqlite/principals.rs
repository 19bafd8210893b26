//! Principals and their credentials (`principals`; the lists are JSON
//! arrays here): creating them, reading one by key id or certificate
//! subject (on every request: one indexed statement on the read pool),
//! listing and revoking them. Times are the engine's clock ([`NOW`]).

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::{CLOCK, Lite, NOW};
use crate::principals::{NewPrincipal, PrincipalRow, insert_error};
use crate::rows::StoreError;

/// The columns of [`PrincipalRow`], in its order, `expired` judged by the
/// engine's clock.
fn columns() -> String {
    format!(
        "key_id, principal, role, tenants, grants, secret_sha256, cert_subject,
         description, created_by, created_at, expires_at, revoked_at,
         (expires_at IS NOT NULL AND expires_at <= {NOW}) AS expired"
    )
}

impl Lite {
    pub(crate) async fn create_principal(
        &self,
        p: &NewPrincipal,
    ) -> Result<PrincipalRow, StoreError> {
        let row: Principal = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "INSERT INTO principals (key_id, principal, role, tenants, grants, secret_sha256,
                                     cert_subject, description, created_by, created_at, expires_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, {NOW},
                     CASE WHEN ?10 IS NULL THEN NULL
                          ELSE strftime('%Y-%m-%dT%H:%M:%fZ', 'now', {CLOCK},
                                        printf('%+.3f seconds', ?10 / 1000.0)) END)
             RETURNING {}",
            columns()
        )))
        .bind(&p.key_id)
        .bind(&p.principal)
        .bind(&p.role)
        .bind(p.tenants.clone().map(Value::from))
        .bind(Value::from(p.grants.clone()))
        .bind(p.secret_sha256.as_deref())
        .bind(p.cert_subject.as_deref())
        .bind(&p.description)
        .bind(&p.created_by)
        .bind(p.expires_in_ms)
        .fetch_one(&self.write)
        .await
        .map_err(insert_error)?;
        row.decode()
    }

    pub(crate) async fn principal_by_key_id(
        &self,
        key_id: &str,
    ) -> Result<Option<PrincipalRow>, StoreError> {
        let row: Option<Principal> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {} FROM principals WHERE key_id = ?1",
            columns()
        )))
        .bind(key_id)
        .fetch_optional(&self.read)
        .await?;
        row.map(Principal::decode).transpose()
    }

    pub(crate) async fn principal_by_cert_subject(
        &self,
        subject: &str,
    ) -> Result<Option<PrincipalRow>, StoreError> {
        let row: Option<Principal> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {} FROM principals WHERE cert_subject = ?1",
            columns()
        )))
        .bind(subject)
        .fetch_optional(&self.read)
        .await?;
        row.map(Principal::decode).transpose()
    }

    pub(crate) async fn list_principals(
        &self,
        tenant: Option<&str>,
    ) -> Result<Vec<PrincipalRow>, StoreError> {
        // `json_each(NULL)` has no rows, so a row for every tenant is left
        // out of a tenant's list.
        let rows: Vec<Principal> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {} FROM principals
             WHERE ?1 IS NULL OR EXISTS (SELECT 1 FROM json_each(tenants) WHERE value = ?1)
             ORDER BY created_at, key_id",
            columns()
        )))
        .bind(tenant)
        .fetch_all(&self.read)
        .await?;
        rows.into_iter().map(Principal::decode).collect()
    }

    pub(crate) async fn revoke_principal(
        &self,
        key_id: &str,
    ) -> Result<Option<PrincipalRow>, StoreError> {
        let row: Option<Principal> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "UPDATE principals SET revoked_at = COALESCE(revoked_at, {NOW})
             WHERE key_id = ?1
             RETURNING {}",
            columns()
        )))
        .bind(key_id)
        .fetch_optional(&self.write)
        .await?;
        row.map(Principal::decode).transpose()
    }
}

/// A row of `principals` as SQLite returns it: the lists as JSON text.
#[derive(sqlx::FromRow)]
struct Principal {
    key_id: String,
    principal: String,
    role: String,
    tenants: Option<String>,
    grants: String,
    secret_sha256: Option<String>,
    cert_subject: Option<String>,
    description: String,
    created_by: String,
    created_at: DateTime<Utc>,
    expires_at: Option<DateTime<Utc>>,
    revoked_at: Option<DateTime<Utc>>,
    expired: bool,
}

impl Principal {
    /// The row with its lists decoded.
    ///
    /// Errors: [`StoreError::Corrupt`] for a list that is not a JSON array
    /// of strings.
    fn decode(self) -> Result<PrincipalRow, StoreError> {
        let list = |json: &str, what: &str| {
            serde_json::from_str::<Vec<String>>(json).map_err(|e| {
                StoreError::Corrupt(format!("{what} of principal {}: {e}", self.key_id))
            })
        };
        let tenants = self
            .tenants
            .as_deref()
            .map(|t| list(t, "tenants"))
            .transpose()?;
        let grants = list(&self.grants, "grants")?;
        Ok(PrincipalRow {
            key_id: self.key_id,
            principal: self.principal,
            role: self.role,
            tenants,
            grants,
            secret_sha256: self.secret_sha256,
            cert_subject: self.cert_subject,
            description: self.description,
            created_by: self.created_by,
            created_at: self.created_at,
            expires_at: self.expires_at,
            revoked_at: self.revoked_at,
            expired: self.expired,
        })
    }
}
