-- A call can become uncertain more than once (uncertain, retried on an
-- operator's or a probe's word, uncertain again): one record per occurrence.
-- Commands that touch "the record of a call" address its newest occurrence.
ALTER TABLE uncertain_outcomes DROP CONSTRAINT uncertain_outcomes_run_id_call_id_key;
ALTER TABLE uncertain_outcomes ADD COLUMN occurrence integer NOT NULL DEFAULT 1;
CREATE UNIQUE INDEX uncertain_by_call ON uncertain_outcomes (run_id, call_id, occurrence);
