-- Liveness off the hot table.
--
-- A worker's heartbeat used to extend a lease by updating its `tasks` row:
-- a new version of a wide row (the task's spec) and, as `lease_expires_at`
-- is in the `tasks_leased` index, new index entries, every third of a lease
-- for every long-running task, in the table every claim and every step
-- writes. A heartbeat now writes only here: one narrow row per leased task
-- that lives longer than a heartbeat period, with no secondary index (so
-- its updates are HOT, and `fillfactor` leaves them room). A lease holds
-- while `tasks.lease_expires_at` (set at claim) or `lease_until` of the
-- same attempt here is in the future. Rows of ended or re-claimed attempts
-- are ignored (the attempt differs) and deleted by the sweeper.
CREATE TABLE task_heartbeats (
    task_id     uuid PRIMARY KEY,
    attempt     integer NOT NULL,
    lease_until timestamptz NOT NULL
) WITH (fillfactor = 50);
