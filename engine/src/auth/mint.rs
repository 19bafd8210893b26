//! Making a key in-process, for a process that wires an engine itself
//! (`belay dev`, the example, the benchmark): the same row the admin
//! endpoint's `POST /admin/v1/keys` writes.

use super::{AuthError, Role, Tenants, key};
use crate::store::{NewPrincipal, Store};

/// Create a key for `principal` with `role`, `tenants` and `grants`,
/// recorded as made by `created_by`, without expiry; returns the key text
/// (`belay_<key id>_<secret>`), which is not stored. Errors:
/// [`AuthError::Store`] when it cannot be written, [`AuthError::Internal`]
/// without randomness.
pub async fn mint_key(
    store: &Store,
    principal: &str,
    role: Role,
    tenants: Tenants,
    grants: Vec<String>,
    created_by: &str,
) -> Result<String, AuthError> {
    let new = key::generate()?;
    store
        .create_principal(&NewPrincipal {
            key_id: new.key_id.clone(),
            principal: principal.to_owned(),
            role: role.as_str().to_owned(),
            tenants: tenants.to_stored(),
            grants,
            secret_sha256: Some(new.secret_sha256.clone()),
            cert_subject: None,
            description: String::new(),
            created_by: created_by.to_owned(),
            expires_in_ms: None,
        })
        .await?;
    Ok(new.key)
}
