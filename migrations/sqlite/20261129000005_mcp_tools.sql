-- MCP tool definitions and the definitions each tenant accepted (pinning);
-- see migrations/postgres/…0008 for the meaning of every column.
CREATE TABLE mcp_tool_definitions (
    server                   TEXT NOT NULL,
    tool                     TEXT NOT NULL,
    definition_hash          TEXT NOT NULL,
    definition               TEXT NOT NULL,
    refusal                  TEXT,
    suggested_repeat_safety  TEXT NOT NULL,
    protocol_version         TEXT NOT NULL,
    first_seen_at            TEXT NOT NULL,
    last_seen_at             TEXT NOT NULL,
    reported_by              TEXT NOT NULL,
    -- MAX + 1 per report (one writer: strictly increasing).
    report_seq               INTEGER NOT NULL,
    PRIMARY KEY (server, tool, definition_hash)
);

CREATE TABLE mcp_tool_pins (
    tenant            TEXT NOT NULL,
    server            TEXT NOT NULL,
    tool              TEXT NOT NULL,
    definition_hash   TEXT NOT NULL,
    previous_hash     TEXT,
    accepted_by       TEXT NOT NULL,
    reason            TEXT NOT NULL,
    accepted_at       TEXT NOT NULL,
    PRIMARY KEY (tenant, server, tool)
);
