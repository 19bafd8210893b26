//! What property lines are read into: a tool's [`Props`] (with its
//! [`BindingType`] and [`ConfirmationProps`]) and the file's
//! [`FileDefaults`]. Types only: `read_props.rs` fills them in, the other
//! stages check and use them.

use std::collections::{BTreeMap, BTreeSet};

use belay_proto::wire::{BodyMode, BodyType, HttpAuth};
use serde_json::Value;

use crate::NameAt;
use crate::expr::Expr;
use crate::model::{ChildMode, CircuitBreakerDef, CompactionDef, Effect, RepeatSafety, ToolHints};

use super::lines::Block;
use super::{retry, sandbox};

/// The shared defaults at the top of a tools file (the seed's "Tool file
/// format"), for its `type: http` and `type: async_webhook` tools.
#[derive(Debug, Default)]
pub(super) struct FileDefaults {
    /// `base_url:`, joined to every endpoint that is a path.
    pub(super) base_url: Option<String>,
    /// `auth:` with `auth_config:`, for tools without an `auth:` of their own.
    pub(super) auth: Option<HttpAuth>,
    /// `timeout:` in ms, for tools without one.
    pub(super) timeout_ms: Option<u64>,
    /// `headers:`, merged under each tool's (a tool's header of the same
    /// name, in any case, wins).
    pub(super) headers: BTreeMap<String, String>,
    /// `retry:` and `retry_delay:`, for tools without their own.
    pub(super) retry: retry::RetryProps,
    /// `rate_limit:`, for tools without one.
    pub(super) rate_limit: Option<f64>,
}

/// How a tool is called, from `type:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BindingType {
    Http,
    Workflow,
    AsyncWebhook,
    Mcp,
    Unsupported,
    Sandbox,
}

/// Everything read from a tool's property lines.
#[derive(Default)]
pub(super) struct Props<'b> {
    pub(super) description: Option<String>,
    /// The `type:` read, or `Unsupported` for a type already reported (so
    /// no "missing `type`" error follows).
    pub(super) binding_type: Option<BindingType>,
    /// `workflow_id:` of a `type: workflow` tool.
    pub(super) workflow_id: Option<NameAt>,
    /// `mode:` of a `type: workflow` tool.
    pub(super) mode: Option<ChildMode>,
    /// `timeout_ms:` of a `type: workflow` tool.
    pub(super) workflow_timeout_ms: Option<u64>,
    /// `timeout_ms: "{{config.NAME}}"` of a `type: workflow` tool: NAME,
    /// line and column, resolved from the engine's configuration by
    /// [`crate::parse_bundle`].
    pub(super) workflow_timeout_config: Option<(String, u32, u32)>,
    /// `param_mapping:` of a `type: workflow` tool: workflow input key → tool parameter.
    pub(super) param_mapping: BTreeMap<String, String>,
    /// `callback_url_field:` of a `type: async_webhook` tool, with its line and column.
    pub(super) callback_url_field: Option<(String, u32, u32)>,
    /// `timeout_seconds:` of a `type: async_webhook` tool.
    pub(super) callback_timeout_seconds: Option<u64>,
    /// `server:` of a `type: mcp` tool.
    pub(super) server: Option<String>,
    /// `server_tool:` of a `type: mcp` tool.
    pub(super) server_tool: Option<String>,
    /// `resource:` of a `type: mcp` tool (`abl/mcp_resource.rs`), with the
    /// line and column of its value.
    pub(super) resource: Option<(String, u32, u32)>,
    pub(super) endpoint: Option<(String, u32, u32)>,
    pub(super) method: Option<String>,
    /// Line and column of the `method:` value.
    pub(super) method_at: (u32, u32),
    pub(super) headers: BTreeMap<String, String>,
    pub(super) timeout_ms: Option<u64>,
    pub(super) permission: Option<String>,
    pub(super) repeat_safety: Option<RepeatSafety>,
    pub(super) reconcile_with: Option<NameAt>,
    /// `pool:`: the worker pool its calls go to.
    pub(super) pool: Option<String>,
    /// `scrub_secrets: false` (None: the default, true).
    pub(super) scrub_secrets: Option<bool>,
    /// `pii_access:` (`abl/pii.rs`), with the line and column of its value.
    pub(super) pii_access: Option<(crate::model::PiiAccess, u32, u32)>,
    /// `strict: true`, with the line and column of its value.
    pub(super) strict: Option<(u32, u32)>,
    /// `rate_limit:`, calls per second.
    pub(super) rate_limit: Option<f64>,
    /// `circuit_breaker:`.
    pub(super) circuit_breaker: Option<CircuitBreakerDef>,
    /// `compaction:`.
    pub(super) compaction: Option<CompactionDef>,
    /// `on_result: {set: ...}`.
    pub(super) on_result: BTreeMap<String, Expr>,
    /// `on_error: {set: ...}`.
    pub(super) on_error: BTreeMap<String, Expr>,
    /// `process:` (`abl/process.rs`).
    pub(super) process: Option<crate::model::ProcessDef>,
    /// `confirmation:` with `require: always` or `when_side_effects`.
    pub(super) confirmation: Option<ConfirmationProps>,
    /// `hints:`.
    pub(super) hints: ToolHints,
    /// Line and column of the value of each hint written.
    pub(super) hint_at: BTreeMap<&'static str, (u32, u32)>,
    /// `effect:`, with the line and column of its value.
    pub(super) effect: Option<(Effect, u32, u32)>,
    pub(super) parameters: Option<&'b Block>,
    /// `base_url:` (a file-level default only), with its line and column.
    pub(super) base_url: Option<(String, u32, u32)>,
    /// `auth:` as written, with the line and column of its value.
    pub(super) auth: Option<(String, u32, u32)>,
    /// `auth_config:`, read once `auth:` is known.
    pub(super) auth_config: Option<&'b Block>,
    /// `query_params:`, read once the signature is known.
    pub(super) query_params: Option<&'b Block>,
    /// `body_type:`, with the line and column of its value.
    pub(super) body_type: Option<(BodyType, u32, u32)>,
    /// `body_mode:`.
    pub(super) body_mode: Option<BodyMode>,
    /// `body_template:` (or `body:`), with the line and the column of its
    /// first character inside the quotes.
    pub(super) body_template: Option<(String, u32, u32)>,
    /// `retry:`, `retry_delay:` and `retry_policy:`.
    pub(super) retry: retry::RetryProps,
    /// `RESULT_SECRETS:`, read once the return type is known.
    pub(super) result_secrets: Option<&'b Block>,
    /// `SECRET_ACCESS:`.
    pub(super) secret_access: Option<&'b Block>,
    /// Every `{{_secret.KEY}}` of `headers:`: (KEY, line, column), checked
    /// against `SECRET_ACCESS` once it is read.
    pub(super) header_secrets: Vec<(String, u32, u32)>,
    /// `request_variants:`, read once the tool's own request is known.
    pub(super) request_variants: Option<&'b Block>,
    /// `xml_root:`, with its line and column.
    pub(super) xml_root: Option<(String, u32, u32)>,
    /// `body_schema:` (parsed and compiled), with its line and column.
    pub(super) body_schema: Option<(Value, u32, u32)>,
    /// `use_body_schema:`, with its line and column.
    pub(super) use_body_schema: Option<(bool, u32, u32)>,
    /// `tls_profile:`.
    pub(super) tls_profile: Option<String>,
    /// Every property written, valid or not: an invalid `permission:` is
    /// reported once, as invalid, not a second time as missing. `body:` is
    /// recorded as `body_template`.
    pub(super) present: BTreeSet<String>,
    /// `runtime:`, `code:` and `memory_mb:` of a `type: sandbox` tool
    /// (`sandbox.rs`).
    pub(super) sandbox: sandbox::SandboxProps,
    /// `sampling:` of a `type: mcp` tool (`abl/sampling.rs`), with the line
    /// and column of its key.
    pub(super) sampling: Option<(crate::model::SamplingDef, u32, u32)>,
}

/// A `confirmation:` block that asks for a person's decision.
pub(super) struct ConfirmationProps {
    /// `immutable_params:`, each with the line and column of the list.
    pub(super) immutable: Vec<(String, u32, u32)>,
    /// `approver_grant:`.
    pub(super) grant: Option<String>,
    /// `require: when_side_effects` (else `always`).
    pub(super) when_side_effects: bool,
}
