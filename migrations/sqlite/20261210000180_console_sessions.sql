-- Sessions of the operator console (see
-- migrations/postgres/…20261210000180): times by the engine's clock in the
-- stored format.
CREATE TABLE console_sessions (
    id_sha256          TEXT PRIMARY KEY,
    credential         TEXT NOT NULL,
    credential_sha256  TEXT NOT NULL,
    principal          TEXT NOT NULL,
    csrf               TEXT NOT NULL,
    created_at         TEXT NOT NULL,
    expires_at         TEXT NOT NULL
);
CREATE INDEX console_sessions_expires_at ON console_sessions (expires_at);
