//! Identity and access: who is calling ([`Principal`]) and what it may do.
//!
//! A caller proves who it is with `authorization: Bearer <credential>` on
//! every gRPC request and admin route, or with a client certificate over
//! mTLS:
//! - an API key (`belay_<key id>_<secret>`, [`key`]), created through the
//!   admin endpoint (`POST /admin/v1/keys`, `belay keys create`) and stored
//!   only as the SHA-256 of its secret in the `principals` table, with its
//!   principal's id, [`Role`], [`Tenants`] and grants; it may expire (by
//!   the database clock) and be revoked, effective on the next request on
//!   the engine that revoked it and within `--key-cache-ms` (default 1 s)
//!   on the others ([`key_cache`]: verified keys without an expiry are
//!   kept that long);
//! - a configured token (`--admin-tokens`, `name:token[:tenant]`,
//!   [`static_tokens`]): the bootstrap principals that create the first
//!   keys; an admin for `*`, else an operator of its tenant;
//! - a verified client certificate whose subject a principal row names
//!   (`cert_subject`).
//!
//! [`Authenticator::authenticate`] turns a request's credential into a
//! [`Principal`]; [`policy`] says which roles each gRPC method admits; the
//! handlers then take the tenant and grants of a request from the
//! principal ([`Principal::tenant_for`], [`Principal::narrow_grants`]).
//! Errors are [`AuthError`]s; their codes are mapped in
//! [`crate::error_code`] (`UNAUTHENTICATED`/401, `PERMISSION_DENIED`/403).

mod authenticator;
pub mod key;
pub mod key_cache;
mod mint;
pub mod policy;
mod principal;
pub mod static_tokens;

pub use authenticator::{Authenticator, Credentials, principal_of};
pub use mint::mint_key;
pub use principal::{Principal, Role, Tenants};
pub use static_tokens::{AdminAuth, AdminToken, RECOMMENDED_TOKEN_CHARS};

use crate::error_code::ErrorCode;
use crate::store::StoreError;

/// Why a request was not let through, or a key not made.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// No credential, a malformed one, or one that proves no one (unknown,
    /// wrong secret, revoked, expired): `UNAUTHENTICATED`, 401.
    #[error("{0}")]
    Unauthenticated(String),
    /// A proven principal that may not do this (role, tenant, grants):
    /// `PERMISSION_DENIED`, 403.
    #[error("{0}")]
    PermissionDenied(String),
    /// A malformed field of a key request, or a request whose tenant is
    /// ambiguous: `INVALID_ARGUMENT`, 400.
    #[error("{0}")]
    InvalidArgument(String),
    /// The token configuration (`name:token[:tenant],...`) is malformed.
    /// Never produced by a request.
    #[error("invalid token configuration (`name:token[:tenant],…`): {0}")]
    Config(String),
    /// The principals could not be read or written: `UNAVAILABLE`, 503
    /// (details are logged, never returned).
    #[error("reading principals: {0}")]
    Store(#[from] StoreError),
    /// A fault of the engine (no randomness): `INTERNAL`, 500.
    #[error("{0}")]
    Internal(String),
}

impl AuthError {
    /// The error's one code, on every wire.
    pub fn code(&self) -> ErrorCode {
        match self {
            AuthError::Unauthenticated(_) => ErrorCode::Unauthenticated,
            AuthError::PermissionDenied(_) => ErrorCode::PermissionDenied,
            AuthError::InvalidArgument(_) => ErrorCode::InvalidArgument,
            AuthError::Store(_) => ErrorCode::Unavailable,
            AuthError::Config(_) | AuthError::Internal(_) => ErrorCode::Internal,
        }
    }

    /// What a client is told: the message, except for store and internal
    /// faults, whose details are logged instead.
    pub fn public_message(&self) -> String {
        match self {
            AuthError::Store(_) => {
                "the engine's database is unavailable or failed; retry later".to_owned()
            }
            AuthError::Config(_) | AuthError::Internal(_) => {
                "internal error while authenticating".to_owned()
            }
            other => other.to_string(),
        }
    }
}
