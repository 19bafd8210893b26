-- Durable timers and the engine's clock (see migrations/postgres/…0005):
-- SQLite's 'now' plus an offset only tests move. Every time the SQLite
-- backend writes or compares is `now` shifted by this offset.
CREATE TABLE belay_clock (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    offset_ms  INTEGER NOT NULL DEFAULT 0
);
INSERT INTO belay_clock (id, offset_ms) VALUES (1, 0);

CREATE TABLE timers (
    run_id      BLOB NOT NULL REFERENCES runs (run_id),
    timer_id    TEXT NOT NULL,
    fire_at     TEXT NOT NULL,
    created_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),
    PRIMARY KEY (run_id, timer_id)
);
CREATE INDEX timers_due ON timers (fire_at);
