-- Tool gates: a tool's shared rate limit and circuit breaker (see
-- migrations/postgres/…20261202000040). Times are ms since the Unix epoch
-- by the engine's clock.
CREATE TABLE tool_gates (
    tenant       TEXT NOT NULL,
    tool         TEXT NOT NULL,
    next_at_ms   INTEGER NOT NULL DEFAULT 0,
    queue_at_ms  INTEGER NOT NULL DEFAULT 0,
    failures     INTEGER NOT NULL DEFAULT 0,
    circuit      TEXT NOT NULL DEFAULT 'closed' CHECK (circuit IN ('closed', 'open', 'half_open')),
    retry_at_ms  INTEGER NOT NULL DEFAULT 0,
    updated_at   TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),
    PRIMARY KEY (tenant, tool)
);
