-- Callback tokens of `type: async_webhook` tool calls (see
-- migrations/postgres/…0007): only each token's SHA-256 is kept.
CREATE TABLE callbacks (
    token_sha256  TEXT PRIMARY KEY,
    run_id        BLOB NOT NULL REFERENCES runs (run_id),
    call_id       TEXT NOT NULL,
    created_at    TEXT NOT NULL
);
