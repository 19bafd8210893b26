-- `tasks_by_run (run_id)` duplicated the leading column of the unique index
-- on (run_id, call_id), and PostgreSQL's generic plans of the hot path's
-- `WHERE run_id = $1 AND call_id = $2` statements (end a task, mark it
-- dispatched, retry it), made while the table was still empty and never
-- analysed, chose it: every such statement then read every task of the run,
-- so a step of a 1 100-call run read ~2 600 index entries and its latency
-- doubled over the run (belay-bench --shape loop). The unique index serves
-- both the exact lookups and the statements by run alone.
DROP INDEX IF EXISTS tasks_by_run;
