-- The durable result cache of `hints.cacheable: true` tools (see
-- migrations/postgres/…20261203000060). Times are in the stored format
-- (`YYYY-MM-DDTHH:MM:SS.SSSZ`) by the engine's clock.
CREATE TABLE tool_cache (
    tenant      TEXT NOT NULL,
    cache_key   TEXT NOT NULL,
    tool        TEXT NOT NULL,
    result      TEXT NOT NULL,
    run_id      BLOB NOT NULL,
    call_id     TEXT NOT NULL,
    stored_at   TEXT NOT NULL,
    expires_at  TEXT NOT NULL,
    PRIMARY KEY (tenant, cache_key)
);
CREATE INDEX tool_cache_expiry ON tool_cache (expires_at);
