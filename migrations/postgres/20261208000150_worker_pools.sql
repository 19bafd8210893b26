-- Worker pools and capabilities (issue 21).
--
-- `tasks.requires`: what a worker needs to run the task, as the tags of
-- `belay_proto::pools` (`mcp:<server>`, `pool:<name>`, `sandbox:<runtime>`,
-- `http_base_url`, `tls_profile:<name>`, `model_provider:<name>`), sorted;
-- computed by the machine when it schedules the task and never changed
-- after. Empty: any worker. A claim that names capabilities takes only
-- tasks with `requires <@ capabilities`; the claim's scan stays on
-- `tasks_ready` (available_at, task_id) and filters the rows it reads, so
-- SKIP LOCKED and its order are as before. Adding a column with a
-- constant default rewrites no row.
ALTER TABLE tasks ADD COLUMN requires text[] NOT NULL DEFAULT '{}';

-- The workers that claimed lately, one row per worker id, written by the
-- claim path at most every half lease per engine: which tasks a live
-- worker could take (`Store::unclaimable_tasks`). A worker is live while
-- `last_claim_at` is within 3 lease lengths of the engine's clock.
CREATE TABLE workers (
    worker_id      text PRIMARY KEY,
    -- The capability tags it claimed with; NULL: a worker older than
    -- worker pools, which claims any task.
    capabilities   text[],
    -- The tenants its key may serve; NULL: every tenant.
    tenants        text[],
    -- By the engine's clock (`belay_now()`).
    last_claim_at  timestamptz NOT NULL
);
