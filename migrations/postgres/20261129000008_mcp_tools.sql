-- MCP tool definitions and the definitions each tenant accepted (pinning).
--
-- Workers list the tools of their MCP servers and report every listing
-- (`WorkerService.ReportMcpTools`): one row per distinct definition of a
-- tool, keyed by its hash, so an operator can see what changed. The
-- definition is untrusted data from the server; it is shown, never run.
-- Numbers reports in the order the engine recorded them (clock ties cannot
-- reorder two reports).
CREATE SEQUENCE mcp_tool_report_seq;

CREATE TABLE mcp_tool_definitions (
    server                   text NOT NULL,
    tool                     text NOT NULL,
    definition_hash          text NOT NULL,
    definition               jsonb NOT NULL,
    -- Why Belay refuses the tool (its schema cannot be represented); NULL
    -- for a callable tool.
    refusal                  text,
    -- `never` or `idempotent`: what the server's hints suggest (informational).
    suggested_repeat_safety  text NOT NULL,
    protocol_version         text NOT NULL,
    first_seen_at            timestamptz NOT NULL DEFAULT belay_now(),
    last_seen_at             timestamptz NOT NULL DEFAULT belay_now(),
    -- The worker whose report last listed it, and that report's number
    -- (the newest listing of a tool is the one with the highest).
    reported_by              text NOT NULL,
    report_seq               bigint NOT NULL,
    PRIMARY KEY (server, tool, definition_hash)
);

-- The definition of each MCP tool a tenant's runs may call. Written at the
-- tenant's first dispatch of the tool (trust on first use: the hash the
-- worker lists then) and by an operator accepting a changed definition.
-- A worker calls a tool only while its server lists exactly this hash.
CREATE TABLE mcp_tool_pins (
    tenant            text NOT NULL,
    server            text NOT NULL,
    tool              text NOT NULL,
    definition_hash   text NOT NULL,
    -- The hash pinned before this one, if any.
    previous_hash     text,
    -- `first use (worker <id>)`, or the admin token name (and operator).
    accepted_by       text NOT NULL,
    reason            text NOT NULL,
    accepted_at       timestamptz NOT NULL DEFAULT belay_now(),
    PRIMARY KEY (tenant, server, tool)
);
