-- The secret vault of a run (`RESULT_SECRETS` / `SECRET_ACCESS`, the
-- seed's SecretRef): values a producer tool's result held, kept outside the
-- run's events, encrypted with AES-256-GCM under the engine's vault key
-- (`BELAY_VAULT_KEY`; engine/src/vault.rs), the run id and key bound in as
-- associated data. Written in the transaction that records the producer's
-- result, read at a consumer's dispatch (which consumes a single-use one),
-- deleted when the run ends. Times are by the engine's clock
-- (`belay_now()`).
CREATE TABLE run_secrets (
    run_id            uuid NOT NULL REFERENCES runs (run_id),
    key               text NOT NULL,
    -- The call whose result held it.
    producer_call     text NOT NULL,
    nonce             bytea NOT NULL,
    ciphertext        bytea NOT NULL,
    -- NULL: until the run ends.
    expires_at        timestamptz,
    single_use        boolean NOT NULL DEFAULT false,
    -- Tools that may read it; empty: any whose `SECRET_ACCESS` lists it.
    consumers         text[] NOT NULL DEFAULT '{}',
    -- The call that consumed a single-use value (its retries read it again).
    consumed_by_call  text,
    created_at        timestamptz NOT NULL DEFAULT belay_now(),
    PRIMARY KEY (run_id, key)
);
