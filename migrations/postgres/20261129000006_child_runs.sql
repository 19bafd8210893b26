-- Child runs (workflow nodes) and the engine's outbox.
--
-- A run started by another run's `workflow` node names its parent. Work a
-- transition asks for that belongs to another run (start a child, tell a
-- parent its child ended, cancel a child) is written to `outbox` in the same
-- transaction and carried out afterwards by any engine replica, at least
-- once; each kind is idempotent (a child's run id is fixed, a parent ignores
-- a second report, cancelling an ended run changes nothing).
ALTER TABLE runs ADD COLUMN parent_run_id uuid REFERENCES runs (run_id);
ALTER TABLE runs ADD COLUMN parent_call_id text;
CREATE INDEX runs_by_parent ON runs (parent_run_id) WHERE parent_run_id IS NOT NULL;

CREATE TABLE outbox (
    outbox_id        uuid PRIMARY KEY,
    kind             text NOT NULL CHECK (kind IN ('start_child', 'child_finished', 'cancel_child')),
    -- The run whose transition wrote the row.
    run_id           uuid NOT NULL REFERENCES runs (run_id),
    payload          jsonb NOT NULL,
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT belay_now(),
    done_at          timestamptz,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT belay_now()
);
CREATE INDEX outbox_due ON outbox (next_attempt_at) WHERE done_at IS NULL;
