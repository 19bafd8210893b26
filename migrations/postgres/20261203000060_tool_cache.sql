-- The durable result cache of `hints.cacheable: true` tools
-- (engine/src/machine/cache.rs). One row per tenant and key; the key is a
-- SHA-256 of (tenant, tool name, the pinned definition's content hash, the
-- arguments the tool receives, canonical JSON), so a new definition of the
-- tool never hits an older one's rows and tenants never share one. A call
-- launched in a transition looks its key up in that transition (a live
-- row: `expires_at > belay_now()`); a successful, scrubbed result is
-- written in the transition that records it, replacing the key's row.
-- Expired rows are deleted by the engines' sweeper
-- (`Store::purge_expired_tool_cache`), in batches, oldest first.
CREATE TABLE tool_cache (
    tenant      text NOT NULL,
    cache_key   text NOT NULL,
    tool        text NOT NULL,
    result      jsonb NOT NULL,
    -- The call whose result it is.
    run_id      uuid NOT NULL,
    call_id     text NOT NULL,
    stored_at   timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (tenant, cache_key)
);
CREATE INDEX tool_cache_expiry ON tool_cache (expires_at);
