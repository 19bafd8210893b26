-- Worker pools and capabilities (see migrations/postgres/…20261208000150):
-- `tasks.requires` is a JSON array of the tags a worker needs (empty: any
-- worker); `workers` has the capability tags and tenants (JSON arrays,
-- NULL: any) each worker claimed with lately, and when, by the engine's
-- clock in the stored format.
ALTER TABLE tasks ADD COLUMN requires TEXT NOT NULL DEFAULT '[]'
    CHECK (json_valid(requires) AND json_type(requires) = 'array');

CREATE TABLE workers (
    worker_id      TEXT PRIMARY KEY,
    capabilities   TEXT CHECK (capabilities IS NULL OR json_valid(capabilities)),
    tenants        TEXT CHECK (tenants IS NULL OR json_valid(tenants)),
    last_claim_at  TEXT NOT NULL
);
