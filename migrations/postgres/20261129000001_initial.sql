-- Belay's first schema. Migrations are numbered and never edited after they
-- land; a change is a new file.

-- Permissions granted to a tenant by operators. A tool call needs its
-- permission granted to the node, the caller and the tenant.
CREATE TABLE tenants (
    tenant      text PRIMARY KEY,
    grants      text[] NOT NULL DEFAULT '{}',
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Immutable, versioned definitions. `body` is the parsed, validated
-- definition as canonical JSON; `content_hash` is sha256 of that JSON, so
-- registering identical content again finds the existing version.
CREATE TABLE definitions (
    tenant        text NOT NULL,
    kind          text NOT NULL CHECK (kind IN ('tool', 'agent', 'workflow')),
    name          text NOT NULL,
    version       integer NOT NULL CHECK (version >= 1),
    content_hash  text NOT NULL,
    body          jsonb NOT NULL,
    source_file   text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, kind, name, version),
    UNIQUE (tenant, kind, name, content_hash)
);

CREATE TABLE runs (
    run_id            uuid PRIMARY KEY,
    tenant            text NOT NULL,
    workflow          text NOT NULL,
    workflow_version  integer NOT NULL,
    status            text NOT NULL CHECK (status IN ('pending', 'running', 'paused', 'waiting', 'completed', 'failed', 'cancelled')),
    -- Why the run is paused, waiting, failed or cancelled.
    status_reason     text NOT NULL DEFAULT '',
    input             jsonb NOT NULL,
    output            jsonb,
    idempotency_key   text NOT NULL,
    caller            text NOT NULL DEFAULT '',
    -- Seq of the newest event; events are appended under this row's lock, so
    -- seq is gapless.
    last_seq          bigint NOT NULL DEFAULT 0,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant, idempotency_key)
);
CREATE INDEX runs_by_tenant ON runs (tenant, created_at DESC, run_id DESC);
CREATE INDEX runs_by_tenant_status ON runs (tenant, status, created_at DESC, run_id DESC);

-- A run's history; its state is the fold of these rows in seq order.
CREATE TABLE events (
    run_id       uuid NOT NULL REFERENCES runs (run_id),
    seq          bigint NOT NULL CHECK (seq >= 1),
    kind         text NOT NULL,
    payload      jsonb NOT NULL,
    recorded_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, seq)
);

-- Units of work workers claim. `attempt` is the fencing token: incremented at
-- each claim, and every later change names it.
CREATE TABLE tasks (
    task_id             uuid PRIMARY KEY,
    run_id              uuid NOT NULL REFERENCES runs (run_id),
    tenant              text NOT NULL,
    -- The call this task performs, unique per run (`<node>.m<n>`, `<node>.t<n>`).
    call_id             text NOT NULL,
    kind                text NOT NULL CHECK (kind IN ('model_call', 'tool_call')),
    status              text NOT NULL CHECK (status IN ('ready', 'leased', 'completed', 'failed', 'uncertain', 'cancelled')),
    attempt             integer NOT NULL DEFAULT 0,
    repeat_safety       text CHECK (repeat_safety IN ('never', 'idempotent', 'reconcile')),
    spec                jsonb NOT NULL,
    -- Belongs to the call: the same on every attempt.
    idempotency_key     text NOT NULL,
    -- Not claimable before this time (retry backoff).
    available_at        timestamptz NOT NULL DEFAULT now(),
    lease_expires_at    timestamptz,
    worker_id           text,
    -- True once the current attempt was allowed to start its side effect.
    dispatched          boolean NOT NULL DEFAULT false,
    dispatched_attempt  integer,
    dispatched_at       timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    UNIQUE (run_id, call_id)
);
-- The claim query: ready tasks in order of availability.
CREATE INDEX tasks_ready ON tasks (available_at, task_id) WHERE status = 'ready';
-- The lease sweeper.
CREATE INDEX tasks_leased ON tasks (lease_expires_at) WHERE status = 'leased';
CREATE INDEX tasks_by_run ON tasks (run_id);

-- Tool calls that may have acted but whose result was lost, awaiting an
-- operator (or a late result, or a reconcile probe).
CREATE TABLE uncertain_outcomes (
    uncertain_id      uuid PRIMARY KEY,
    tenant            text NOT NULL,
    run_id            uuid NOT NULL REFERENCES runs (run_id),
    task_id           uuid NOT NULL REFERENCES tasks (task_id),
    call_id           text NOT NULL,
    node_id           text NOT NULL,
    tool              text NOT NULL,
    tool_version      integer NOT NULL,
    -- The exact arguments sent.
    arguments         jsonb NOT NULL,
    idempotency_key   text NOT NULL,
    -- [{attempt, worker_id, dispatched_at, error}] of every attempt.
    attempts          jsonb NOT NULL DEFAULT '[]',
    worker_id         text,
    reason            text NOT NULL,
    status            text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'resolved')),
    resolution        jsonb,
    resolved_by       text,
    resolved_at       timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    UNIQUE (run_id, call_id)
);
CREATE INDEX uncertain_open ON uncertain_outcomes (tenant, created_at) WHERE status = 'open';
