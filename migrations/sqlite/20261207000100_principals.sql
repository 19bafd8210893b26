-- Principals and their credentials (see migrations/postgres/…20261207000100):
-- one row per credential, an API key (`key_id` and the lowercase hex
-- SHA-256 of its secret) or a client-certificate subject, exactly one of
-- the two. Lists are JSON arrays of strings, as `tenants.grants`; times are
-- in the stored format (`YYYY-MM-DDTHH:MM:SS.SSSZ`) by the engine's clock,
-- written by the store (a DEFAULT cannot read `belay_clock`).
CREATE TABLE principals (
    key_id         TEXT PRIMARY KEY,
    principal      TEXT NOT NULL,
    role           TEXT NOT NULL
                   CHECK (role IN ('client', 'worker', 'approver', 'operator', 'admin')),
    -- NULL: every tenant; otherwise a non-empty JSON array of tenant names.
    tenants        TEXT CHECK (tenants IS NULL
                               OR (json_valid(tenants) AND json_array_length(tenants) > 0)),
    grants         TEXT NOT NULL DEFAULT '[]'
                   CHECK (json_valid(grants) AND json_type(grants) = 'array'),
    secret_sha256  TEXT,
    cert_subject   TEXT UNIQUE,
    description    TEXT NOT NULL DEFAULT '',
    created_by     TEXT NOT NULL,
    created_at     TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),
    expires_at     TEXT,
    revoked_at     TEXT,
    CHECK ((secret_sha256 IS NULL) <> (cert_subject IS NULL))
) WITHOUT ROWID;
CREATE INDEX principals_principal ON principals (principal);
