-- The audit of tool calls (admin `GET /admin/v1/tenants/{tenant}/tool-calls`):
-- every call a run proposed (`tool_call_scheduled`, `tool_call_refused`),
-- newest first, per tenant, derived from the events.
--
-- Events did not name their tenant (only `runs` did), so a tenant's page
-- would have walked every tenant's proposals; each event now carries its
-- run's tenant (written by the store with the event; never changes, like
-- the run's). Filled in here for the events written before. NULL only for
-- an event an engine older than this migration wrote while running beside
-- a newer one.
ALTER TABLE events ADD COLUMN tenant text;
UPDATE events e SET tenant = r.tenant FROM runs r WHERE r.run_id = e.run_id;

-- A tenant's proposals in (recorded_at, run_id, seq) order, the audit's
-- keyset; only the two proposal kinds, so no other event is indexed.
CREATE INDEX events_tool_calls ON events (tenant, recorded_at, run_id, seq)
    WHERE kind IN ('tool_call_scheduled', 'tool_call_refused');
