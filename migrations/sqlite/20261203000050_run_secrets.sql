-- The secret vault of a run (see migrations/postgres/…20261203000050).
-- `consumers` is a JSON array of tool names; times are TEXT in the stored
-- format, by the engine's clock.
CREATE TABLE run_secrets (
    run_id            BLOB NOT NULL REFERENCES runs (run_id),
    key               TEXT NOT NULL,
    producer_call     TEXT NOT NULL,
    nonce             BLOB NOT NULL,
    ciphertext        BLOB NOT NULL,
    expires_at        TEXT,
    single_use        INTEGER NOT NULL DEFAULT 0,
    consumers         TEXT NOT NULL DEFAULT '[]',
    consumed_by_call  TEXT,
    created_at        TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),
    PRIMARY KEY (run_id, key)
);
