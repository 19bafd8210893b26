//! Sessions of the operator console (`console_sessions`, migration
//! `20261210000180`): the row the store takes ([`NewConsoleSession`]) and
//! hands out ([`ConsoleSessionRow`]). Plain data; the statements are in
//! `postgres/console_sessions.rs` and `sqlite/console_sessions.rs`. The
//! store never sees a session token, only its SHA-256; how a session
//! proves its principal is the engine's (`engine/src/console/session.rs`).

use std::fmt;

use chrono::{DateTime, Utc};

#[cfg(doc)]
use crate::Store;

/// What `Debug` shows of a CSRF token.
const REDACTED: &str = "<redacted>";

/// What [`Store::create_console_session`] inserts. `Debug` redacts
/// [`NewConsoleSession::csrf`].
#[derive(Clone, PartialEq, Eq)]
pub struct NewConsoleSession {
    /// Lowercase hex SHA-256 of the session token the cookie holds.
    pub id_sha256: String,
    /// The signed-in principal's credential id: a key id, or
    /// `token:<name>` for a configured token.
    pub credential: String,
    /// Lowercase hex SHA-256 of the credential text signed in with.
    pub credential_sha256: String,
    /// The principal's id, for listings and logs.
    pub principal: String,
    /// The session's CSRF token (random, lowercase hex).
    pub csrf: String,
    /// How long the session lives from now by the engine's clock, ms (> 0).
    pub ttl_ms: i64,
}

impl fmt::Debug for NewConsoleSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NewConsoleSession")
            .field("id_sha256", &self.id_sha256)
            .field("credential", &self.credential)
            .field("principal", &self.principal)
            .field("csrf", &REDACTED)
            .field("ttl_ms", &self.ttl_ms)
            .finish_non_exhaustive()
    }
}

/// A session that has not expired, as [`Store::console_session`] returns
/// it. `Debug` redacts [`ConsoleSessionRow::csrf`].
#[derive(Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ConsoleSessionRow {
    /// As [`NewConsoleSession::credential`].
    pub credential: String,
    /// As [`NewConsoleSession::credential_sha256`].
    pub credential_sha256: String,
    /// As [`NewConsoleSession::principal`].
    pub principal: String,
    /// As [`NewConsoleSession::csrf`].
    pub csrf: String,
    /// When it was signed in (engine's clock).
    pub created_at: DateTime<Utc>,
    /// When it ends (engine's clock).
    pub expires_at: DateTime<Utc>,
}

impl fmt::Debug for ConsoleSessionRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConsoleSessionRow")
            .field("credential", &self.credential)
            .field("principal", &self.principal)
            .field("csrf", &REDACTED)
            .field("created_at", &self.created_at)
            .field("expires_at", &self.expires_at)
            .finish_non_exhaustive()
    }
}
