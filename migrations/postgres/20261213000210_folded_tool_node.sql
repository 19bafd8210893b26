-- A tool node's start is written inside its call's `tool_call_scheduled`
-- (`starts_node`) and its end inside the call's `tool_call_completed`
-- (`ends_node`) where the node's own events would repeat the call's
-- arguments and result (issue 23: a loop step wrote both). A release of
-- behaviour level 2 ignores those fields and would miss the node's start
-- and end: it is behaviour level 3 (engine/store/src/fleet_level.rs), used
-- once the fleet's level is raised. As in migration 20261212000200, a
-- database that has run nothing and has seen no engine register starts at
-- level 3; any other is raised by its engines once every live one
-- implements level 3 for a whole hold.
UPDATE fleet_level SET level = 3
WHERE id = 1 AND level < 3
  AND NOT EXISTS (SELECT 1 FROM runs)
  AND NOT EXISTS (SELECT 1 FROM engine_replicas);
