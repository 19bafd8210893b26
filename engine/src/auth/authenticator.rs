//! From a request's credential to a [`Principal`]: API keys are looked up
//! in the store, or found in the [`KeyCache`] of the ones verified less
//! than its time to live ago (so a revocation takes effect on the next
//! request on the engine that revoked, within the time to live on the
//! others; an expiring key is looked up every time), configured tokens in
//! memory, client certificates by their subject (never cached).

use axum::http::HeaderMap;

use super::key::{self, KEY_PREFIX};
use super::key_cache::KeyCache;
use super::static_tokens::bearer;
use super::{AdminAuth, AuthError, Principal, Role, Tenants};
use crate::store::{PrincipalRow, Store};

/// What a request presented (owned, so a request is not held across the
/// store lookup). `Debug` never prints the bearer credential.
#[derive(Clone, Default)]
pub struct Credentials {
    /// The `Bearer` credential of its `authorization` header.
    pub bearer: Option<String>,
    /// The RFC 4514 subject of its verified client certificate.
    pub cert_subject: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("bearer", &self.bearer.as_ref().map(|_| "<redacted>"))
            .field("cert_subject", &self.cert_subject)
            .finish()
    }
}

impl Credentials {
    /// The credentials of a request's headers, with its connection's
    /// certificate subject. Errors: [`AuthError::Unauthenticated`] for an
    /// `authorization` header that is not `Bearer <credential>`.
    pub fn from_headers(
        headers: &HeaderMap,
        cert_subject: Option<String>,
    ) -> Result<Credentials, AuthError> {
        Ok(Credentials {
            bearer: bearer(headers)?.map(str::to_owned),
            cert_subject,
        })
    }
}

/// Authenticates requests against the store's principals and the
/// configured tokens.
#[derive(Debug, Clone)]
pub struct Authenticator {
    store: Store,
    tokens: std::sync::Arc<AdminAuth>,
    keys: std::sync::Arc<KeyCache>,
}

impl Authenticator {
    /// An authenticator over the principals of `store` and the configured
    /// `tokens` (may be empty), looking every key up
    /// ([`Authenticator::with_key_cache`] keeps them).
    pub fn new(store: Store, tokens: AdminAuth) -> Authenticator {
        Authenticator {
            store,
            tokens: std::sync::Arc::new(tokens),
            keys: std::sync::Arc::new(KeyCache::new(std::time::Duration::ZERO)),
        }
    }

    /// The same authenticator, keeping verified API keys for `ttl`
    /// ([`KeyCache`]; zero: none).
    pub fn with_key_cache(mut self, ttl: std::time::Duration) -> Authenticator {
        self.keys = std::sync::Arc::new(KeyCache::new(ttl));
        self
    }

    /// Forgets what the cache holds of `key_id`: call it when the key is
    /// revoked through this engine, so it stops working here at once.
    pub fn forget_key(&self, key_id: &str) {
        self.keys.forget_key(key_id);
    }

    /// The configured tokens.
    pub fn tokens(&self) -> &AdminAuth {
        &self.tokens
    }

    /// Who presented `credentials`: a bearer credential first (an API key
    /// when it starts with `belay_`, else a configured token), else the
    /// client certificate. Errors: [`AuthError::Unauthenticated`] for no
    /// credential, a malformed key, an unknown key or wrong secret (one
    /// message for both, so key ids cannot be probed), a revoked or expired
    /// key; [`AuthError::Store`] when the principals cannot be read.
    pub async fn authenticate(&self, credentials: Credentials) -> Result<Principal, AuthError> {
        match (
            credentials.bearer.as_deref(),
            credentials.cert_subject.as_deref(),
        ) {
            (Some(text), _) if text.starts_with(KEY_PREFIX) => self.api_key(text).await,
            (Some(text), _) => self
                .tokens
                .find(text)
                .map(|t| t.principal())
                .ok_or_else(|| AuthError::Unauthenticated("invalid API key or token".into())),
            (None, Some(subject)) => self.certificate(subject).await,
            (None, None) => Err(AuthError::Unauthenticated(
                "missing credential: send `authorization: Bearer <API key>`".into(),
            )),
        }
    }

    /// Whether `principal`'s credential still proves it: for a request
    /// that outlives its authentication (a claim's long poll, a `WatchRun`
    /// stream), asked again before it hands anything out. A configured
    /// token always does. Errors: [`AuthError::Unauthenticated`] once the
    /// key (or certificate principal) is revoked, expired or gone;
    /// [`AuthError::Store`].
    pub async fn still_active(&self, principal: &Principal) -> Result<(), AuthError> {
        if principal.credential.starts_with("token:") {
            return Ok(());
        }
        self.stored(&principal.credential).await.map(|_| ())
    }

    /// The principal of a stored credential (`<key id>` or `cert:<key id>`)
    /// looked up again. Errors: [`AuthError::Unauthenticated`] once it is
    /// revoked, expired or gone; [`AuthError::Store`].
    async fn stored(&self, credential: &str) -> Result<Principal, AuthError> {
        let key_id = credential.strip_prefix("cert:").unwrap_or(credential);
        let row = self
            .store
            .principal_by_key_id(key_id)
            .await?
            .ok_or_else(|| AuthError::Unauthenticated(format!("API key {key_id} is gone")))?;
        active(row, &format!("API key {key_id}"))
    }

    /// The principal of a credential that authenticated earlier (a
    /// console session's): `credential` is a [`Principal::credential`] (a
    /// key id, `cert:<key id>` or `token:<name>`) and `credential_sha256`
    /// the lowercase hex SHA-256 of the text presented then. A key is
    /// looked up again (revoked, expired or deleted ones refused); a
    /// configured token must still be configured under that name with that
    /// secret. Errors: [`AuthError::Unauthenticated`] naming why the
    /// credential no longer proves anyone; [`AuthError::Store`].
    pub async fn resume(
        &self,
        credential: &str,
        credential_sha256: &str,
    ) -> Result<Principal, AuthError> {
        if let Some(name) = credential.strip_prefix("token:") {
            return self
                .tokens
                .by_name(name)
                .filter(|t| t.has_digest(credential_sha256))
                .map(|t| t.principal())
                .ok_or_else(|| {
                    AuthError::Unauthenticated(format!(
                        "configured token `{name}` was removed or changed"
                    ))
                });
        }
        self.stored(credential).await
    }

    async fn api_key(&self, text: &str) -> Result<Principal, AuthError> {
        if let Some(principal) = self.keys.get(text) {
            return Ok(principal);
        }
        let presented = key::parse(text)?;
        let row = self
            .store
            .principal_by_key_id(&presented.key_id)
            .await?
            .filter(|row| {
                row.secret_sha256
                    .as_deref()
                    .is_some_and(|stored| presented.matches(stored))
            })
            .ok_or_else(|| AuthError::Unauthenticated("invalid API key or token".into()))?;
        // An expiring key's expiry is judged by the database's clock on
        // every request: it is not kept.
        let keep = row.expires_at.is_none();
        let principal = active(row, &format!("API key {}", presented.key_id))?;
        if keep {
            self.keys.put(text, &presented.key_id, &principal);
        }
        Ok(principal)
    }

    async fn certificate(&self, subject: &str) -> Result<Principal, AuthError> {
        let row = self
            .store
            .principal_by_cert_subject(subject)
            .await?
            .ok_or_else(|| {
                AuthError::Unauthenticated(format!(
                    "client certificate `{subject}` names no principal"
                ))
            })?;
        active(
            row,
            &format!("the principal of client certificate `{subject}`"),
        )
    }
}

/// The principal of a row that is neither revoked nor expired.
fn active(row: PrincipalRow, what: &str) -> Result<Principal, AuthError> {
    if let Some(at) = row.revoked_at {
        return Err(AuthError::Unauthenticated(format!(
            "{what} was revoked at {}",
            at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        )));
    }
    if row.expired {
        let at = row
            .expires_at
            .map(|at| at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            .unwrap_or_default();
        return Err(AuthError::Unauthenticated(format!(
            "{what} expired at {at}"
        )));
    }
    principal_of(row)
}

/// The principal a stored row describes. Errors: [`AuthError::Internal`]
/// for a role the engine does not know (a row written by a newer engine).
pub fn principal_of(row: PrincipalRow) -> Result<Principal, AuthError> {
    let role: Role = row.role.parse().map_err(|_| {
        AuthError::Internal(format!(
            "key {} has unknown role {:?}",
            row.key_id, row.role
        ))
    })?;
    let credential = match row.cert_subject {
        Some(_) => format!("cert:{}", row.key_id),
        None => row.key_id,
    };
    Ok(Principal {
        id: row.principal,
        credential,
        role,
        tenants: Tenants::from_stored(row.tenants),
        grants: row.grants,
    })
}
