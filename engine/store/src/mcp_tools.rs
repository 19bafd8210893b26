//! Rows of the MCP tool tables (`mcp_tool_definitions`, `mcp_tool_pins`):
//! the definitions workers report for the tools of their MCP servers, and
//! the definition each tenant accepted (pinned). The statements are in the
//! backends (`postgres.rs`, `sqlite.rs`, at their ends); the rules (trust on
//! first use, accepting a change) are in `belay_engine::mcp_pins`.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;

/// One definition of an MCP tool, as workers reported it: a row of
/// `mcp_tool_definitions`, keyed by (server, tool, definition hash).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow, Serialize)]
pub struct McpToolDefinitionRow {
    /// The server's logical name.
    pub server: String,
    /// The tool's name on the server.
    pub tool: String,
    /// `sha256:<hex>` of the canonical definition.
    pub definition_hash: String,
    /// The definition as the worker mapped it (untrusted data: shown, never run).
    pub definition: Value,
    /// Why Belay refuses the tool, if it does.
    pub refusal: Option<String>,
    /// `never` or `idempotent`: the default the server's hints suggest.
    pub suggested_repeat_safety: String,
    /// Protocol revision of the report that last listed it.
    pub protocol_version: String,
    /// When a worker first listed this definition (database clock).
    pub first_seen_at: DateTime<Utc>,
    /// When a worker last listed it (database clock).
    pub last_seen_at: DateTime<Utc>,
    /// The worker whose report last listed it.
    pub reported_by: String,
}

/// The definition of an MCP tool a tenant accepted: a row of `mcp_tool_pins`.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow, Serialize)]
pub struct McpToolPinRow {
    /// Tenant.
    pub tenant: String,
    /// The server's logical name.
    pub server: String,
    /// The tool's name on the server.
    pub tool: String,
    /// The accepted definition's hash: calls go through only while the
    /// server lists exactly this one.
    pub definition_hash: String,
    /// The hash accepted before this one, if any.
    pub previous_hash: Option<String>,
    /// `first use (worker <id>)`, or who accepted it (token name and operator).
    pub accepted_by: String,
    /// Why.
    pub reason: String,
    /// When (database clock).
    pub accepted_at: DateTime<Utc>,
}

/// One listed tool to record ([`super::Store::record_mcp_tools`]).
#[derive(Debug, Clone, PartialEq)]
pub struct McpToolListingIn {
    /// The tool's name on the server.
    pub tool: String,
    /// `sha256:<hex>`.
    pub definition_hash: String,
    /// The definition (NUL-free JSON).
    pub definition: Value,
    /// Why Belay refuses it, if it does.
    pub refusal: Option<String>,
    /// `never` or `idempotent`.
    pub suggested_repeat_safety: String,
}

/// What pinning at dispatch needs to know of a task.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct McpPinTask {
    /// The run's tenant.
    pub tenant: String,
    /// `model_call` or `tool_call`.
    pub kind: String,
    /// `ready`, `leased`, ...
    pub status: String,
    /// Current attempt.
    pub attempt: i32,
    /// Worker holding the lease.
    pub worker_id: Option<String>,
    /// The task spec (`wire::ToolCallSpec` for tool calls).
    pub spec: Value,
}
