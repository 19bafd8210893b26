-- Durable timers (waits, timeouts) and the engine's clock.
--
-- `belay_now()` is the one clock every lease, retry delay and timer is
-- judged by: the database's `now()` plus an offset that only tests move
-- (`Store::advance_clock`), so a 7-day wait is tested in milliseconds while
-- engine processes keep running. In production the offset stays 0.
CREATE TABLE belay_clock (
    id         smallint PRIMARY KEY CHECK (id = 1),
    offset_ms  bigint NOT NULL DEFAULT 0
);
INSERT INTO belay_clock (id, offset_ms) VALUES (1, 0);

CREATE FUNCTION belay_now() RETURNS timestamptz
    LANGUAGE sql STABLE
    AS $$ SELECT now() + COALESCE((SELECT offset_ms FROM belay_clock WHERE id = 1), 0) * interval '1 millisecond' $$;

ALTER TABLE runs ALTER COLUMN created_at SET DEFAULT belay_now();
ALTER TABLE runs ALTER COLUMN updated_at SET DEFAULT belay_now();
ALTER TABLE events ALTER COLUMN recorded_at SET DEFAULT belay_now();
ALTER TABLE tasks ALTER COLUMN available_at SET DEFAULT belay_now();
ALTER TABLE tasks ALTER COLUMN created_at SET DEFAULT belay_now();
ALTER TABLE tasks ALTER COLUMN updated_at SET DEFAULT belay_now();
ALTER TABLE uncertain_outcomes ALTER COLUMN created_at SET DEFAULT belay_now();
ALTER TABLE notifications ALTER COLUMN next_attempt_at SET DEFAULT belay_now();
ALTER TABLE notifications ALTER COLUMN created_at SET DEFAULT belay_now();

-- A timer of a run: fired once, by whichever engine replica finds it due
-- first. The firing is a run transition that deletes the row in the same
-- transaction; a run that ends loses its timers.
CREATE TABLE timers (
    run_id      uuid NOT NULL REFERENCES runs (run_id),
    -- Unique in the run (`<node>.w<n>`, `<node>.timeout`; `<node>~<visit>.…` on a later visit).
    timer_id    text NOT NULL,
    fire_at     timestamptz NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT belay_now(),
    PRIMARY KEY (run_id, timer_id)
);
CREATE INDEX timers_due ON timers (fire_at);
