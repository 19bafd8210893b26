-- Tool gates: the rate limit (`rate_limit:`) and circuit breaker
-- (`circuit_breaker:`) a tool shares across every run, worker and engine
-- replica of a tenant. The rules are in engine/src/gates.rs; a dispatch
-- reads (and, with a rate limit, locks) the row in its own transaction.
-- One row per tenant and tool name, made the first time a call of the tool
-- is gated or fails; never deleted. Times are ms since the Unix epoch by
-- the engine's clock (`belay_now()`).
CREATE TABLE tool_gates (
    tenant       text NOT NULL,
    tool         text NOT NULL,
    -- Rate limit: the earliest time the next call may be dispatched.
    next_at_ms   bigint NOT NULL DEFAULT 0,
    -- Rate limit: the turn the next deferred call is given (turns are one
    -- interval apart, so calls waiting together come back in a row).
    queue_at_ms  bigint NOT NULL DEFAULT 0,
    -- Consecutive failures that count against the circuit (a success
    -- clears them).
    failures     integer NOT NULL DEFAULT 0,
    circuit      text NOT NULL DEFAULT 'closed' CHECK (circuit IN ('closed', 'open', 'half_open')),
    -- open: when a probe call may go; half_open: when the probe under way
    -- is given up on.
    retry_at_ms  bigint NOT NULL DEFAULT 0,
    updated_at   timestamptz NOT NULL DEFAULT belay_now(),
    PRIMARY KEY (tenant, tool)
);
