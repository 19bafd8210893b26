-- Belay's schema for the embedded SQLite backend: the same tables, columns
-- and meaning as migrations/postgres/ (0001..0004 folded into one), with
-- SQLite types. Migrations are numbered and never edited after they land.
--
-- Types: ids are 16-byte BLOB uuids; times are TEXT in one fixed UTC format,
-- `YYYY-MM-DDTHH:MM:SS.SSSZ` (strftime('%Y-%m-%dT%H:%M:%fZ','now')), so they
-- compare correctly as text; JSON is TEXT; booleans are 0/1.

CREATE TABLE tenants (
    tenant      TEXT PRIMARY KEY,
    -- JSON array of strings.
    grants      TEXT NOT NULL DEFAULT '[]',
    updated_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now'))
);

CREATE TABLE definitions (
    tenant        TEXT NOT NULL,
    kind          TEXT NOT NULL CHECK (kind IN ('tool', 'agent', 'workflow')),
    name          TEXT NOT NULL,
    version       INTEGER NOT NULL CHECK (version >= 1),
    content_hash  TEXT NOT NULL,
    body          TEXT NOT NULL,
    source_file   TEXT NOT NULL,
    created_at    TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),
    registered_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),
    -- Increases on every registration of a tenant (PostgreSQL orders by
    -- registered_at, which has microseconds; SQLite's clock has ms, so two
    -- registrations in one ms are ordered by this counter instead).
    registration_seq INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, kind, name, version),
    UNIQUE (tenant, kind, name, content_hash)
);
CREATE INDEX definitions_current ON definitions (tenant, kind, name, registration_seq DESC);

CREATE TABLE runs (
    run_id            BLOB PRIMARY KEY,
    tenant            TEXT NOT NULL,
    workflow          TEXT NOT NULL,
    workflow_version  INTEGER NOT NULL,
    status            TEXT NOT NULL CHECK (status IN ('pending', 'running', 'paused', 'waiting', 'completed', 'failed', 'cancelled')),
    status_reason     TEXT NOT NULL DEFAULT '',
    input             TEXT NOT NULL,
    output            TEXT,
    idempotency_key   TEXT NOT NULL,
    caller            TEXT NOT NULL DEFAULT '',
    last_seq          INTEGER NOT NULL DEFAULT 0,
    created_at        TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),
    updated_at        TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),
    UNIQUE (tenant, idempotency_key)
);
CREATE INDEX runs_by_tenant ON runs (tenant, created_at DESC, run_id DESC);
CREATE INDEX runs_by_tenant_status ON runs (tenant, status, created_at DESC, run_id DESC);

CREATE TABLE events (
    run_id       BLOB NOT NULL REFERENCES runs (run_id),
    seq          INTEGER NOT NULL CHECK (seq >= 1),
    kind         TEXT NOT NULL,
    payload      TEXT NOT NULL,
    recorded_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;

CREATE TABLE tasks (
    task_id             BLOB PRIMARY KEY,
    run_id              BLOB NOT NULL REFERENCES runs (run_id),
    tenant              TEXT NOT NULL,
    call_id             TEXT NOT NULL,
    kind                TEXT NOT NULL CHECK (kind IN ('model_call', 'tool_call')),
    status              TEXT NOT NULL CHECK (status IN ('ready', 'leased', 'completed', 'failed', 'uncertain', 'cancelled')),
    attempt             INTEGER NOT NULL DEFAULT 0,
    repeat_safety       TEXT CHECK (repeat_safety IN ('never', 'idempotent', 'reconcile')),
    spec                TEXT NOT NULL,
    idempotency_key     TEXT NOT NULL,
    available_at        TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),
    lease_expires_at    TEXT,
    worker_id           TEXT,
    dispatched          BOOLEAN NOT NULL DEFAULT 0,
    dispatched_attempt  INTEGER,
    dispatched_at       TEXT,
    runs_while_paused   BOOLEAN NOT NULL DEFAULT 0,
    created_at          TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),
    updated_at          TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),
    UNIQUE (run_id, call_id)
);
CREATE INDEX tasks_ready ON tasks (available_at, task_id) WHERE status = 'ready';
CREATE INDEX tasks_leased ON tasks (lease_expires_at) WHERE status = 'leased';
CREATE INDEX tasks_by_run ON tasks (run_id);

CREATE TABLE uncertain_outcomes (
    uncertain_id      BLOB PRIMARY KEY,
    tenant            TEXT NOT NULL,
    run_id            BLOB NOT NULL REFERENCES runs (run_id),
    task_id           BLOB NOT NULL REFERENCES tasks (task_id),
    call_id           TEXT NOT NULL,
    node_id           TEXT NOT NULL,
    tool              TEXT NOT NULL,
    tool_version      INTEGER NOT NULL,
    arguments         TEXT NOT NULL,
    idempotency_key   TEXT NOT NULL,
    attempts          TEXT NOT NULL DEFAULT '[]',
    worker_id         TEXT,
    reason            TEXT NOT NULL,
    status            TEXT NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'resolved')),
    resolution        TEXT,
    resolution_kind   TEXT CHECK (resolution_kind IN ('succeeded', 'failed', 'retry')),
    resolved_by       TEXT,
    resolved_at       TEXT,
    resolved_via      TEXT,
    resolution_reason TEXT,
    probe             TEXT,
    discrepancy       TEXT,
    occurrence        INTEGER NOT NULL DEFAULT 1,
    created_at        TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now'))
);
CREATE UNIQUE INDEX uncertain_by_call ON uncertain_outcomes (run_id, call_id, occurrence);
CREATE INDEX uncertain_open ON uncertain_outcomes (tenant, created_at) WHERE status = 'open';
CREATE INDEX uncertain_by_tenant ON uncertain_outcomes (tenant, created_at DESC, uncertain_id DESC);

CREATE TABLE notifications (
    notification_id  BLOB PRIMARY KEY,
    tenant           TEXT NOT NULL,
    run_id           BLOB NOT NULL REFERENCES runs (run_id),
    kind             TEXT NOT NULL,
    payload          TEXT NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    next_attempt_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')),
    delivered_at     TEXT,
    failed_at        TEXT,
    last_error       TEXT,
    created_at       TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now'))
);
CREATE INDEX notifications_due ON notifications (next_attempt_at) WHERE delivered_at IS NULL AND failed_at IS NULL;
