-- Child runs and the engine's outbox (see migrations/postgres/…0006).
ALTER TABLE runs ADD COLUMN parent_run_id BLOB REFERENCES runs (run_id);
ALTER TABLE runs ADD COLUMN parent_call_id TEXT;
CREATE INDEX runs_by_parent ON runs (parent_run_id) WHERE parent_run_id IS NOT NULL;

CREATE TABLE outbox (
    outbox_id        BLOB PRIMARY KEY,
    kind             TEXT NOT NULL CHECK (kind IN ('start_child', 'child_finished', 'cancel_child')),
    run_id           BLOB NOT NULL REFERENCES runs (run_id),
    payload          TEXT NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    next_attempt_at  TEXT NOT NULL,
    done_at          TEXT,
    last_error       TEXT,
    created_at       TEXT NOT NULL
);
CREATE INDEX outbox_due ON outbox (next_attempt_at) WHERE done_at IS NULL;
