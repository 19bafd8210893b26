-- Drop the foreign keys of the two tables every step writes, `events.run_id`
-- and `tasks.run_id` (both `REFERENCES runs`).
--
-- PostgreSQL checks such a key with a query of its own for every inserted
-- row (`SELECT 1 FROM runs WHERE run_id = $1 FOR KEY SHARE`, through SPI):
-- about 3.8 checks a step (2.8 events and one task), on a run row the same
-- transaction has already locked `FOR UPDATE`. belay-bench measured them at
-- about a tenth of PostgreSQL's CPU per step.
--
-- What the keys guarded still holds: only `store/postgres.rs` writes these
-- tables, always inside a transition that first locks the run row (so the
-- run exists), and no statement deletes a run. The other tables keep their
-- keys (they are written a few times a run, not every step).
ALTER TABLE events DROP CONSTRAINT IF EXISTS events_run_id_fkey;
ALTER TABLE tasks DROP CONSTRAINT IF EXISTS tasks_run_id_fkey;
