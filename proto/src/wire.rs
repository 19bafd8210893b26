//! JSON documents carried in the `*_json` fields of `belay.v1`: task specs the
//! engine hands to workers and the results workers report.
//!
//! These shapes are persisted (task rows, events), so they follow the rules for
//! stored types: fields are only added, with `#[serde(default)]`, never renamed.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Task kind string for model calls, as in `Task.kind`.
pub const TASK_KIND_MODEL_CALL: &str = "model_call";
/// Task kind string for tool calls, as in `Task.kind`.
pub const TASK_KIND_TOOL_CALL: &str = "tool_call";

/// One message of a model transcript. Provider-neutral; the worker maps it to
/// the provider's format (for OpenAI Chat Completions, one-to-one by role).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum ChatMessage {
    /// The agent's instructions.
    System {
        /// Instruction text.
        content: String,
    },
    /// Input to the agent (the node input, as text or JSON text).
    User {
        /// Message text.
        content: String,
    },
    /// A model turn: text and/or proposed tool calls (tool_use).
    Assistant {
        /// Text of the turn, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<String>,
        /// Proposed tool calls in the order the model gave them.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolUse>,
    },
    /// The result of one tool call, answering `tool_call_id`.
    Tool {
        /// The `ToolUse::id` this answers.
        tool_call_id: String,
        /// Result text (JSON text for structured results), truncated to the
        /// agent's result size limit; refusals and failures are text starting
        /// with `error:`.
        content: String,
    },
}

/// A tool call proposed by the model (OpenAI `tool_calls[]`, Anthropic `tool_use`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolUse {
    /// Provider-assigned id, echoed in the result message.
    pub id: String,
    /// Tool name as the model wrote it (may name an unknown tool).
    pub name: String,
    /// Arguments exactly as the model produced them: JSON text that may be
    /// invalid. The engine decodes and validates it, never the worker.
    pub arguments: String,
}

/// A tool as offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSchema {
    /// Tool name.
    pub name: String,
    /// What the tool does, for the model.
    pub description: String,
    /// JSON Schema (draft 2020-12) of the arguments object; hidden parameters
    /// are not in it.
    pub parameters: Value,
}

/// Spec of a `model_call` task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelCallSpec {
    /// Provider model name, from the agent definition.
    pub model: String,
    /// The transcript so far; every tool_use has exactly one result, in order.
    pub messages: Vec<ChatMessage>,
    /// Tools the model may propose.
    pub tools: Vec<ToolSchema>,
    /// Upper bound on output tokens, if the agent sets one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u32>,
}

/// Token usage of one model call, in tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    #[serde(default)]
    pub input_tokens: u64,
    /// Completion tokens.
    #[serde(default)]
    pub output_tokens: u64,
}

/// Result of a `model_call` task, reported in `CompleteTask.result_json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelCallResult {
    /// Text of the answer, if any.
    #[serde(default)]
    pub content: Option<String>,
    /// Proposed tool calls, in the model's order.
    #[serde(default)]
    pub tool_calls: Vec<ToolUse>,
    /// Token usage as the provider reported it.
    #[serde(default)]
    pub usage: Usage,
    /// Provider's finish reason (`stop`, `tool_calls`, `length`, ...).
    #[serde(default)]
    pub finish_reason: Option<String>,
}

/// How a tool is executed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToolBinding {
    /// An HTTP endpoint.
    Http(HttpBinding),
    /// An HTTP endpoint that answers later, by POSTing the result to a
    /// callback URL (`type: async_webhook`). The worker gets the URL from
    /// `DispatchToolCallResponse.callback_url`, puts it into the JSON body at
    /// `callback_url_field`, and reports the 2xx answer as the acceptance.
    AsyncWebhook(AsyncWebhookBinding),
    /// A tool of an MCP server (`type: mcp`), called by the worker's MCP
    /// client. Added after v0.1.
    Mcp(McpBinding),
}

/// Binding of a `type: mcp` tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpBinding {
    /// The server's logical name, resolved by the worker's MCP configuration
    /// (`--mcp-config`).
    pub server: String,
    /// The tool's name on the server (`server_tool:`; the tool's own name
    /// when not renamed).
    pub server_tool: String,
    /// Per-call HTTP headers (Streamable HTTP servers only); values may hold
    /// `{{config.X}}`, resolved by the worker from its configuration.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Whole-call timeout in ms (waiting for the server's connection included).
    pub timeout_ms: u64,
}

/// Binding of a `type: async_webhook` tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AsyncWebhookBinding {
    /// The request, as for `type: http` (its method is POST, PUT or PATCH).
    #[serde(flatten)]
    pub http: HttpBinding,
    /// Dot-path in the JSON body where the callback URL goes, e.g.
    /// `callbackUrl` or `meta.reply_to` (objects on the way are created).
    pub callback_url_field: String,
}

/// HTTP binding of a tool (`type: http` in `.tools.abl`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HttpBinding {
    /// Absolute URL, or a path resolved against the worker's HTTP base URL.
    /// `{name}` segments are path parameters filled from the arguments.
    pub endpoint: String,
    /// HTTP method, upper case.
    pub method: String,
    /// Extra request headers.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Whole-request timeout in ms.
    pub timeout_ms: u64,
}

/// Spec of a `tool_call` task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallSpec {
    /// Tool name.
    pub tool: String,
    /// Registered version of the tool definition.
    pub tool_version: u32,
    /// Validated arguments: the exact value that was checked and persisted.
    pub arguments: Value,
    /// How to execute it.
    pub binding: ToolBinding,
    /// Belongs to the call (run + call), identical on every attempt; sent as
    /// the `Idempotency-Key` header by HTTP tools.
    pub idempotency_key: String,
    /// A call repeated after a person answered the tool's question (an MCP
    /// elicitation): the answers, as the worker's MCP client reads them
    /// (`{"responses", "request_state"}` or `{"elicitations": [...]}`).
    /// Absent on a first call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
}
