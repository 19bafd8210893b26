-- Principals and their credentials (issue 26): who may call the engine,
-- with which role, for which tenants and with which grants.
--
-- One row per credential. An API key is `key_id` (public: it appears in
-- the key string and in listings) plus a secret of which only the
-- lowercase hex SHA-256 is kept (`secret_sha256`); a certificate-only
-- principal has instead the subject of its client certificate
-- (`cert_subject`), matched over mTLS. Exactly one of the two is set. One
-- principal (`alice@acme`, `worker-pool-a`: the id recorded in events) may
-- hold several credentials, one row each.
CREATE TABLE principals (
    key_id         text PRIMARY KEY,
    principal      text NOT NULL,
    role           text NOT NULL
                   CHECK (role IN ('client', 'worker', 'approver', 'operator', 'admin')),
    -- NULL: every tenant; otherwise a non-empty list of tenant names.
    tenants        text[] CHECK (tenants IS NULL OR cardinality(tenants) > 0),
    -- Permission names, as `tenants.grants`.
    grants         text[] NOT NULL DEFAULT '{}',
    secret_sha256  text,
    cert_subject   text CONSTRAINT principals_cert_subject_unique UNIQUE,
    description    text NOT NULL DEFAULT '',
    created_by     text NOT NULL,
    -- By the engine's clock (`belay_now()`), so tests can move it.
    created_at     timestamptz NOT NULL DEFAULT belay_now(),
    -- NULL: never expires.
    expires_at     timestamptz,
    -- Set once (a second revoke keeps the first time).
    revoked_at     timestamptz,
    CONSTRAINT principals_one_credential
        CHECK ((secret_sha256 IS NULL) <> (cert_subject IS NULL))
);
-- Every credential of one principal (listing, revoking them all).
CREATE INDEX principals_principal ON principals (principal);
