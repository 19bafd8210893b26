-- A node that starts and ends in one decision is written as one
-- `node_passed` event (issue 23), which an engine of a build before this
-- migration cannot fold. A database file has one engine (nothing runs
-- beside it, so nothing is gated on SQLite: engine/store/src/fleet_level.rs),
-- but an older build could still open a file this one wrote; it refuses
-- one whose oldest compatible engine is newer than it knows
-- (engine/store/src/schema.rs), naming the versions.
UPDATE schema_compat SET oldest_compatible = 20261212000200 WHERE id = 1;
