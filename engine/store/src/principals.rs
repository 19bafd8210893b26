//! Principals and their credentials (`principals`, issue 26): the rows the
//! store hands out ([`PrincipalRow`]) and takes ([`NewPrincipal`]). Plain
//! data; the statements are in `postgres/principals.rs` and
//! `sqlite/principals.rs`. What a role may do, and how a key string is
//! parsed and its secret hashed, is the caller's: the store keeps only the
//! SHA-256 of a secret and never sees the secret itself.

use std::fmt;

use chrono::{DateTime, Utc};

#[cfg(doc)]
use crate::Store;
use crate::rows::StoreError;

/// What `Debug` shows of a secret's hash: whether there is one, not its value.
const REDACTED: &str = "<redacted>";

/// A principal with its credential, as stored: one row of `principals`.
///
/// `Debug` redacts [`PrincipalRow::secret_sha256`].
#[derive(Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct PrincipalRow {
    /// The credential's public id (in the key string and in listings).
    pub key_id: String,
    /// The principal's id (`alice@acme`, `worker-pool-a`), recorded in events.
    pub principal: String,
    /// `client`, `worker`, `approver`, `operator` or `admin`.
    pub role: String,
    /// The tenants it may act for; `None`: every tenant. Never an empty list.
    pub tenants: Option<Vec<String>>,
    /// Permission names granted to it.
    pub grants: Vec<String>,
    /// Lowercase hex SHA-256 of an API key's secret; `None` for a
    /// certificate-only principal.
    pub secret_sha256: Option<String>,
    /// The client-certificate subject (`CN=worker-a`) that authenticates as
    /// it over mTLS; `None` for an API key.
    pub cert_subject: Option<String>,
    /// Free text for operators.
    pub description: String,
    /// Who created it (a principal id).
    pub created_by: String,
    /// When it was created (engine's clock).
    pub created_at: DateTime<Utc>,
    /// When it stops authenticating (engine's clock); `None`: never.
    pub expires_at: Option<DateTime<Utc>>,
    /// When it was revoked (engine's clock); `None`: not revoked.
    pub revoked_at: Option<DateTime<Utc>>,
    /// Whether expires_at has passed by the database clock at read time.
    pub expired: bool,
}

impl fmt::Debug for PrincipalRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrincipalRow")
            .field("key_id", &self.key_id)
            .field("principal", &self.principal)
            .field("role", &self.role)
            .field("tenants", &self.tenants)
            .field("grants", &self.grants)
            .field("secret_sha256", &redacted(&self.secret_sha256))
            .field("cert_subject", &self.cert_subject)
            .field("description", &self.description)
            .field("created_by", &self.created_by)
            .field("created_at", &self.created_at)
            .field("expires_at", &self.expires_at)
            .field("revoked_at", &self.revoked_at)
            .field("expired", &self.expired)
            .finish()
    }
}

/// What [`Store::create_principal`] inserts.
///
/// Exactly one of `secret_sha256` and `cert_subject` must be set, `role`
/// must be one of the five roles and `tenants` must not be an empty list;
/// the database refuses any other row. `Debug` redacts
/// [`NewPrincipal::secret_sha256`].
#[derive(Clone, PartialEq, Eq)]
pub struct NewPrincipal {
    /// The credential's public id; unique ([`StoreError::Conflict`]).
    pub key_id: String,
    /// The principal's id.
    pub principal: String,
    /// `client`, `worker`, `approver`, `operator` or `admin`.
    pub role: String,
    /// The tenants it may act for; `None`: every tenant.
    pub tenants: Option<Vec<String>>,
    /// Permission names granted to it.
    pub grants: Vec<String>,
    /// Lowercase hex SHA-256 of an API key's secret.
    pub secret_sha256: Option<String>,
    /// A client-certificate subject; unique ([`StoreError::Conflict`]).
    pub cert_subject: Option<String>,
    /// Free text for operators.
    pub description: String,
    /// Who creates it (a principal id).
    pub created_by: String,
    /// Lifetime from now by the database clock, in milliseconds; None = never expires.
    pub expires_in_ms: Option<i64>,
}

impl fmt::Debug for NewPrincipal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NewPrincipal")
            .field("key_id", &self.key_id)
            .field("principal", &self.principal)
            .field("role", &self.role)
            .field("tenants", &self.tenants)
            .field("grants", &self.grants)
            .field("secret_sha256", &redacted(&self.secret_sha256))
            .field("cert_subject", &self.cert_subject)
            .field("description", &self.description)
            .field("created_by", &self.created_by)
            .field("expires_in_ms", &self.expires_in_ms)
            .finish()
    }
}

/// A secret's hash as `Debug` shows it: `Some("<redacted>")` or `None`.
fn redacted(hash: &Option<String>) -> Option<&'static str> {
    hash.as_ref().map(|_| REDACTED)
}

/// The error of an insert into `principals`: a unique violation is the
/// [`StoreError::Conflict`] naming its column, anything else the database's
/// error (a CHECK refusing the row among them).
pub(crate) fn insert_error(e: sqlx::Error) -> StoreError {
    match &e {
        sqlx::Error::Database(db) if db.is_unique_violation() => {
            // PostgreSQL names the constraint; SQLite only its message
            // (`UNIQUE constraint failed: principals.cert_subject`).
            let column = conflicting_column(db.constraint().unwrap_or_else(|| db.message()));
            StoreError::Conflict(format!("a principal with this {column} already exists"))
        }
        _ => StoreError::Database(e),
    }
}

/// The column of `principals` a unique violation of `constraint_or_message`
/// names: `cert_subject`, or else `key_id` (the table's only other unique
/// column, `principals_pkey` on PostgreSQL).
fn conflicting_column(constraint_or_message: &str) -> &'static str {
    if constraint_or_message.contains("cert_subject") {
        "cert_subject"
    } else {
        "key_id"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_secret_hash() {
        let hash = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        let new = NewPrincipal {
            key_id: "k1".into(),
            principal: "alice@acme".into(),
            role: "client".into(),
            tenants: None,
            grants: vec![],
            secret_sha256: Some(hash.into()),
            cert_subject: None,
            description: String::new(),
            created_by: "admin".into(),
            expires_in_ms: None,
        };
        let shown = format!("{new:?}");
        assert!(!shown.contains(&hash[..8]), "{shown}");
        assert!(
            shown.contains("secret_sha256: Some(\"<redacted>\")"),
            "{shown}"
        );
        let row = PrincipalRow {
            key_id: new.key_id,
            principal: new.principal,
            role: new.role,
            tenants: new.tenants,
            grants: new.grants,
            secret_sha256: new.secret_sha256,
            cert_subject: new.cert_subject,
            description: new.description,
            created_by: new.created_by,
            created_at: DateTime::<Utc>::UNIX_EPOCH,
            expires_at: None,
            revoked_at: None,
            expired: false,
        };
        let shown = format!("{row:?}");
        assert!(!shown.contains(&hash[..8]), "{shown}");
        assert!(shown.contains("key_id: \"k1\""), "{shown}");
        let cert_only = PrincipalRow {
            secret_sha256: None,
            ..row
        };
        assert!(format!("{cert_only:?}").contains("secret_sha256: None"));
    }

    #[test]
    fn a_unique_violation_names_its_column() {
        assert_eq!(
            conflicting_column("principals_cert_subject_unique"),
            "cert_subject"
        );
        assert_eq!(
            conflicting_column("UNIQUE constraint failed: principals.cert_subject"),
            "cert_subject"
        );
        assert_eq!(conflicting_column("principals_pkey"), "key_id");
        assert_eq!(
            conflicting_column("UNIQUE constraint failed: principals.key_id"),
            "key_id"
        );
    }
}
