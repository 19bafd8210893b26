-- A node that starts and ends in one decision (`set`, `branch`, `succeed`)
-- is written as one `node_passed` event (issue 23: a loop step wrote two
-- events for each of its `set` and `branch` nodes), which a release of
-- behaviour level 1 cannot fold: it is behaviour level 2
-- (engine/store/src/fleet_level.rs), used once the fleet's level is raised.
-- A database that has run nothing and has seen no engine register has had
-- no older engine: its fleet starts at level 2, as migration
-- 20261211000190 started a new one at level 1. Any other is raised by its
-- engines once every live one implements level 2 for a whole hold.
UPDATE fleet_level SET level = 2
WHERE id = 1 AND level < 2
  AND NOT EXISTS (SELECT 1 FROM runs)
  AND NOT EXISTS (SELECT 1 FROM engine_replicas);
