-- Uncertain outcomes get resolved: by an operator, a late result or a
-- reconcile probe. Also: tasks that may run while their run is paused
-- (reconcile probes), and an outbox of operator notifications.

ALTER TABLE uncertain_outcomes
    -- succeeded | failed | retry
    ADD COLUMN resolution_kind   text CHECK (resolution_kind IN ('succeeded', 'failed', 'retry')),
    -- operator | late_result | probe
    ADD COLUMN resolved_via      text,
    ADD COLUMN resolution_reason text,
    -- What a reconcile probe found: {tool, outcome, detail, at}.
    ADD COLUMN probe             jsonb,
    -- A late result that arrived after the record was resolved: it is kept
    -- here and in the run's events, never applied.
    ADD COLUMN discrepancy       jsonb;
CREATE INDEX uncertain_by_tenant ON uncertain_outcomes (tenant, created_at DESC, uncertain_id DESC);

ALTER TABLE tasks
    -- Reconcile probes run while their run is paused on the uncertain outcome
    -- they look up; every other task waits for the run to resume.
    ADD COLUMN runs_while_paused boolean NOT NULL DEFAULT false;

-- Outbox of notifications (webhooks), written in the transaction that pauses
-- a run, delivered by any engine replica with retries.
CREATE TABLE notifications (
    notification_id  uuid PRIMARY KEY,
    tenant           text NOT NULL,
    run_id           uuid NOT NULL REFERENCES runs (run_id),
    kind             text NOT NULL,
    payload          jsonb NOT NULL,
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    delivered_at     timestamptz,
    -- Set when delivery was abandoned after the last attempt.
    failed_at        timestamptz,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX notifications_due ON notifications (next_attempt_at) WHERE delivered_at IS NULL AND failed_at IS NULL;
