-- Sessions of the operator console (issue 24).
--
-- Signing in with an API key (or a configured token) creates a row here;
-- the browser's cookie holds a random session token of which only the
-- lowercase hex SHA-256 is kept (`id_sha256`), never the credential. Every
-- request looks its session up (one indexed statement) and authenticates
-- the session's credential (`credential`: a key id, or `token:<name>`)
-- against the principals again, so a revoked or expired key ends its
-- sessions on their next request, on every replica. Signing out deletes
-- the row; `expires_at` ends it otherwise. `csrf` is the session's own
-- random CSRF token. Additive (older engines ignore it).
CREATE TABLE console_sessions (
    id_sha256          text PRIMARY KEY,
    credential         text NOT NULL,
    -- SHA-256 of the credential text signed in with: a configured token
    -- changed under the same name ends the sessions of the old one.
    credential_sha256  text NOT NULL,
    principal          text NOT NULL,
    csrf               text NOT NULL,
    created_at         timestamptz NOT NULL,
    expires_at         timestamptz NOT NULL
);
CREATE INDEX console_sessions_expires_at ON console_sessions (expires_at);
