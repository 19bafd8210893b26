-- A tool node's start and end are written inside its call's
-- `tool_call_scheduled` and `tool_call_completed` (issue 23), which an
-- engine of a build before this migration cannot fold (it would miss the
-- node's start and end). Nothing is gated on SQLite (one engine per file:
-- engine/store/src/fleet_level.rs), but an older build could still open a
-- file this one wrote; it refuses one whose oldest compatible engine is
-- newer than it knows (engine/store/src/schema.rs), naming the versions.
UPDATE schema_compat SET oldest_compatible = 20261213000210 WHERE id = 1;
