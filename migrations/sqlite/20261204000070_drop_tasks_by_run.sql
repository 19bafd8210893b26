-- As migrations/postgres/20261204000070_drop_tasks_by_run.sql: the unique
-- index on (run_id, call_id) serves lookups by run, and a planner that picks
-- `tasks_by_run (run_id)` for an exact (run_id, call_id) lookup reads every
-- task of the run.
DROP INDEX IF EXISTS tasks_by_run;
