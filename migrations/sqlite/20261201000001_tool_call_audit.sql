-- The audit of tool calls (see migrations/postgres/…20261201000001): each
-- event carries its run's tenant, and a partial index orders a tenant's
-- proposals by (recorded_at, run_id, seq).
ALTER TABLE events ADD COLUMN tenant TEXT;
UPDATE events SET tenant = (SELECT r.tenant FROM runs r WHERE r.run_id = events.run_id);

CREATE INDEX events_tool_calls ON events (tenant, recorded_at, run_id, seq)
    WHERE kind IN ('tool_call_scheduled', 'tool_call_refused');
