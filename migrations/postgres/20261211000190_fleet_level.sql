-- Behaviour changes gated on the whole engine fleet having upgraded
-- (issue 22; engine/store/src/fleet_level.rs).
--
-- A schema change can be additive while a behaviour change is not: since
-- heartbeats moved to `task_heartbeats` (migration 20261206000090), an
-- engine of a release before it judges a heartbeated lease by
-- `tasks.lease_expires_at` alone and expires it while its worker keeps it
-- alive. So each engine registers here the behaviour level its build
-- implements (`engine_replicas`, refreshed every second or so), and a
-- behaviour an older replica would misread is used only once the fleet's
-- level (`fleet_level`) has been raised to it: by an engine that saw, for
-- a whole hold (10 minutes by default), every live replica at that level
-- or higher and no connection of an engine too old to register. The level
-- never goes down: an engine of a lower level refuses to start.
CREATE TABLE engine_replicas (
    replica_id   uuid PRIMARY KEY,
    level        integer NOT NULL,
    started_at   timestamptz NOT NULL,
    last_seen_at timestamptz NOT NULL
);

CREATE TABLE fleet_level (
    id            smallint PRIMARY KEY CHECK (id = 1),
    -- The behaviour level every engine of the fleet implements.
    level         integer NOT NULL,
    -- When it was last raised.
    raised_at     timestamptz NOT NULL,
    -- Since when the fleet has looked ready for a higher level (every
    -- live replica above `level`, no unregistered engine); NULL when not.
    ready_since   timestamptz
);

-- A database that has run nothing yet (a new install) has had no older
-- engine: its fleet is at level 1 from the start. One that has runs was
-- used by a release before this table (level 0) until the fleet is seen
-- to have upgraded.
INSERT INTO fleet_level (id, level, raised_at)
SELECT 1, CASE WHEN EXISTS (SELECT 1 FROM runs) THEN 0 ELSE 1 END, now();
