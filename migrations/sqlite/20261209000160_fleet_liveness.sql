-- When the engine fleet could last hear workers (see
-- migrations/postgres/…20261209000160): one row, times by the engine's
-- clock in the stored format.
CREATE TABLE fleet_liveness (
    id           INTEGER PRIMARY KEY CHECK (id = 1),
    last_seen_at TEXT NOT NULL,
    up_since     TEXT NOT NULL
);
