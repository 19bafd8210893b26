//! Parsed, validated definitions: the values stored in the `definitions` table
//! (as canonical JSON) and pinned into a run when it starts.
//!
//! Persisted shapes: fields are only added (with `#[serde(default)]`), never renamed.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Whether a tool call may be repeated when its outcome is unknown
/// (DESIGN.md, "The tool call, exactly").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RepeatSafety {
    /// Never repeated once dispatched: a lost outcome fails the step.
    Never,
    /// Repeated with the same idempotency key.
    Idempotent,
    /// Never repeated blindly: a lost outcome becomes an uncertain outcome.
    Reconcile,
}

impl RepeatSafety {
    /// The `.tools.abl` / database spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            RepeatSafety::Never => "never",
            RepeatSafety::Idempotent => "idempotent",
            RepeatSafety::Reconcile => "reconcile",
        }
    }
}

/// How a tool is executed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToolBindingDef {
    /// `type: http`.
    Http {
        /// `endpoint:`, absolute URL or path; `{param}` segments are path parameters.
        endpoint: String,
        /// `method:`, upper case; default `POST`.
        method: String,
        /// `headers:`.
        #[serde(default)]
        headers: BTreeMap<String, String>,
        /// `timeout:` in ms; default 30000.
        timeout_ms: u64,
    },
}

/// A tool declared in a `.tools.abl` file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDef {
    /// snake_case name from the signature.
    pub name: String,
    /// `description:`.
    pub description: String,
    /// JSON Schema (draft 2020-12) of the arguments object built from the
    /// signature and `parameters:` block: `type: object`, `properties`,
    /// `required`, `additionalProperties: false`, defaults as `default`.
    pub input_schema: Value,
    /// JSON Schema of the return type.
    pub output_schema: Value,
    /// `permission:`: the one permission a call needs (granted to node,
    /// caller and tenant).
    pub permission: String,
    /// `repeat_safety:`.
    pub repeat_safety: RepeatSafety,
    /// `reconcile_with:`: an idempotent, read-only tool that looks this
    /// tool's effect up by idempotency key (it takes an `idempotency_key`
    /// string argument). Only on `reconcile` tools. Added after v0.1.
    #[serde(default)]
    pub reconcile_with: Option<String>,
    /// `type:` and its binding properties.
    pub binding: ToolBindingDef,
    /// File the tool was declared in (bundle-relative path).
    pub source_file: String,
    /// 1-based line of the signature.
    pub source_line: u32,
}

/// Loop policy of an agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum LoopPolicy {
    /// Model call, tool calls, repeat until a final answer or a bound.
    BoundedLoop {
        /// Most model calls in one node execution.
        max_model_steps: u32,
        /// Most accepted tool calls in one node execution.
        max_tool_calls: u32,
    },
}

/// The bounds of an agent node's execution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    /// Most tokens (input + output) over all model calls; `None`: unbounded.
    #[serde(default)]
    pub max_tokens: Option<u64>,
}

/// An agent declared in YAML (`kind: agent`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentDef {
    /// Agent name.
    pub name: String,
    /// Provider model name.
    pub model: String,
    /// System instructions.
    pub instructions: String,
    /// Names of tools the agent may propose (the node's list).
    pub tools: Vec<String>,
    /// Permissions granted to nodes running this agent.
    pub grants: Vec<String>,
    /// `loop:`.
    pub loop_policy: LoopPolicy,
    /// `budget:`.
    pub budget: Budget,
    /// Largest tool-call arguments accepted from the model, bytes; default 65536.
    pub max_argument_bytes: u32,
    /// Tool results are truncated to this many bytes before the model sees
    /// them; default 16384.
    pub max_result_bytes: u32,
    /// Model-call attempts before the run fails; default 5.
    pub max_model_attempts: u32,
    /// Attempts of one idempotent tool call (or of calls not yet dispatched)
    /// before it fails; default 5.
    pub max_tool_attempts: u32,
    /// Passed to the model as its output bound, tokens.
    #[serde(default)]
    pub max_output_tokens: Option<u32>,
    /// File and line, for messages.
    pub source_file: String,
    /// 1-based line of the document start.
    pub source_line: u32,
}

/// One node of a workflow graph.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeDef {
    /// Node id, unique in the workflow.
    pub id: String,
    /// What the node does.
    pub kind: NodeKind,
    /// Extra permissions granted to this node (added to the agent's grants).
    #[serde(default)]
    pub grants: Vec<String>,
    /// Id of the next node; `None`: the run completes with this node's output.
    #[serde(default)]
    pub next: Option<String>,
    /// 1-based line of the node in its file.
    pub source_line: u32,
}

/// Node kinds supported so far.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum NodeKind {
    /// Run an agent loop. Its input is the run input (first node) or the
    /// previous node's output.
    Agent {
        /// Agent name.
        agent: String,
    },
}

/// A workflow declared in YAML (`kind: workflow`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkflowDef {
    /// Workflow name.
    pub name: String,
    /// Id of the first node (default: the first node listed).
    pub start: String,
    /// Nodes in file order.
    pub nodes: Vec<NodeDef>,
    /// JSON Schema of the run input; `None`: any JSON.
    #[serde(default)]
    pub input_schema: Option<Value>,
    /// File of the declaration.
    pub source_file: String,
    /// 1-based line of the document start.
    pub source_line: u32,
}

/// Everything parsed from one bundle.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Bundle {
    /// Tools from `.tools.abl` files.
    pub tools: Vec<ToolDef>,
    /// Agents from YAML files.
    pub agents: Vec<AgentDef>,
    /// Workflows from YAML files.
    pub workflows: Vec<WorkflowDef>,
}
