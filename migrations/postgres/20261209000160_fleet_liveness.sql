-- When the engine fleet could last hear workers (issue 22).
--
-- A lease ran out when no engine could hear its heartbeats: every engine
-- down for longer than the lease (a fleet restart during a deploy), or the
-- database unreachable, while workers went on. The first sweep afterwards
-- judged those leases expired and failed calls that had succeeded. Now
-- each engine records here when it can reach the database (`last_seen_at`,
-- every sweep) and when the fleet's current stretch of being reachable
-- began (`up_since`: set by an engine that starts after every engine was
-- silent, or that itself could not reach the database for a while). The
-- sweeper judges no lease before `up_since` plus one lease length, so each
-- worker gets a whole lease to re-assert its leases (a heartbeat now
-- extends any lease still held by its attempt, expired or not, until a
-- sweep has judged it). One row (id 1); additive (older engines ignore it).
CREATE TABLE fleet_liveness (
    id           smallint PRIMARY KEY CHECK (id = 1),
    last_seen_at timestamptz NOT NULL,
    up_since     timestamptz NOT NULL
);
