//! Parser of `.tools.abl` files: a `TOOLS:` section of tool signatures, each
//! followed by indented properties (seed: `seeds/abl-tools.md`), plus Belay's
//! `permission:` and `repeat_safety:`. HTTP tools take `auth:` with
//! `auth_config:`, `query_params:`, `body_type:`, `body_mode:` and
//! `body_template:`; the lines above the first tool are the file's shared
//! defaults (`base_url:`, `auth:`, `timeout:`, `headers:`, `retry:`,
//! `retry_delay:`, `rate_limit:`). Tools a worker calls take `retry:`,
//! `retry_delay:` and `retry_policy:` (`retry.rs`), `rate_limit:` and
//! `circuit_breaker:`. The run secret vault's `RESULT_SECRETS:` and
//! `SECRET_ACCESS:`, and where `{{_secret.KEY}}` may stand, are read in
//! `secrets.rs`.
//!
//! The format is line-oriented: lines are grouped into a tree by indentation,
//! then each tool is read from its subtree. Errors are collected, not
//! returned at the first one, so an author sees every problem of a file at
//! once; a tool with any error is left out of the output.
//!
//! Each stage has a file: `lines.rs` (lines into blocks, and the scalar
//! values), `file.rs` (the `TOOLS:` items and the file's defaults),
//! `tool.rs` (one tool), `read_props.rs` (its property lines, into the
//! types of `props.rs`), then what the properties mean: `http.rs`,
//! `auth.rs`, `headers.rs`, `mcp.rs`, `behaviour.rs` and `parameters.rs`.
//! The other modules each read the properties of one feature.

use std::collections::BTreeMap;

use crate::imports::FileImport;
use crate::model::ToolDef;
use crate::{DefinitionError, NameAt};

use file::{is_signature_start, parse_item, read_file_defaults};
use lines::{Cx, build_level, head, split_lines};

// The stages.
mod auth;
mod behaviour;
mod file;
mod headers;
mod http;
mod lines;
mod mcp;
mod parameters;
mod props;
mod read_props;
mod tool;

// One feature each.
mod block_scalar;
mod cache;
#[cfg(test)]
mod http_body_tests;
mod http_variants;
mod mcp_resource;
mod pii;
mod process;
mod retry;
mod sampling;
mod sandbox;
mod secrets;
mod types;
mod visibility;

/// Default `timeout:`, ms (the model's documented default).
const DEFAULT_TIMEOUT_MS: u64 = 30_000;

/// Default `callback_url_field:` of a `type: async_webhook` tool (the seed's).
const DEFAULT_CALLBACK_URL_FIELD: &str = "callbackUrl";

/// Default `timeout_seconds:` of a `type: async_webhook` tool (the seed's).
const DEFAULT_CALLBACK_TIMEOUT_SECONDS: u64 = 3600;

/// Largest `timeout_seconds:` accepted: 30 days.
const MAX_CALLBACK_TIMEOUT_SECONDS: u64 = 30 * 24 * 3600;

/// Deepest indentation nesting accepted; deeper lines are refused rather
/// than recursed into, so a hostile file cannot overflow the stack.
const MAX_BLOCK_DEPTH: usize = 64;

/// Binding types the seed documents that Belay does not run yet: named in
/// the error so the author knows it is a gap, not a typo.
const SEED_BINDING_TYPES: &[&str] = &["lambda", "searchai", "table"];

/// Header names the MCP transport sets itself: a `type: mcp` tool's
/// `headers:` may not override them (the worker refuses them too).
const MCP_RESERVED_HEADERS: &[&str] = &[
    "accept",
    "content-type",
    "content-length",
    "host",
    "last-event-id",
    "mcp-protocol-version",
    "mcp-session-id",
    "transfer-encoding",
];

/// Longest `server:` or `server_tool:` name accepted, in characters (MCP
/// tool names are 1 to 128 characters).
const MAX_MCP_NAME_CHARS: usize = 128;

/// Tool properties the seed documents that Belay does not implement yet.
/// Refused (never silently ignored: an ignored `auth:` or `confirmation:`
/// would make a tool behave differently from what its author reads).
const SEED_TOOL_PROPERTIES: &[&str] = &[
    "auth_profile",
    "auth_jit",
    "consent",
    "connection",
    "protocol",
    "soap_version",
    "soap_action",
    "on_soap_fault",
    "wsdl_asset",
    "wsdl_operation",
    "wsdl_version",
    "provides",
    "scrub_secrets",
    "context_access",
    "store_result",
    "function",
    "timeout_ms",
    "workflow_id",
    "mode",
    "param_mapping",
    "index_id",
    "kb_name",
    "search_instructions",
    "table",
    "scope",
];

/// File-level defaults Belay reads (before the first tool), applied to every
/// `type: http` and `type: async_webhook` tool of the file.
const FILE_DEFAULTS: &[&str] = &[
    "base_url",
    "auth",
    "auth_config",
    "timeout",
    "headers",
    "retry",
    "retry_delay",
    "rate_limit",
];

/// Largest `rate_limit:` accepted, calls per second: the limit is kept in
/// the database, one row per tool, so a dispatch of a rate-limited tool
/// waits for the others; past this, a limit is better kept by the service.
const MAX_RATE_LIMIT: f64 = 1000.0;

/// Largest `circuit_breaker.resetMs` accepted: 30 days.
const MAX_RESET_MS: u64 = 30 * 24 * 3600 * 1000;

/// Default `auth_config.header_name` of `auth: api_key`.
const DEFAULT_API_KEY_HEADER: &str = "X-API-Key";

/// Enrichment keys of the seed's "Parameter enrichment and sources" table
/// that Belay does not read yet. (`properties:` and `items:` with a block
/// are read by `parameters::enrich_field` where they apply; elsewhere
/// they are refused here.)
const SEED_ENRICHMENT_KEYS: &[&str] = &["properties", "items"];

/// Enrichment keys of a tool's parameter (not of a nested field) that Belay
/// reads, besides `description` (`parameters::SourceKeys`).
const SOURCE_KEYS: &[&str] = &[
    "required",
    "default",
    "source",
    "value",
    "key",
    "table",
    "hidden",
    "visibility",
];

/// `(tool, NAME, line, column)` of a `timeout_ms: "{{config.NAME}}"` of a
/// `type: workflow` tool.
pub(super) type ConfigTimeout = (String, String, u32, u32);

/// What one `.tools.abl` file yields.
#[derive(Debug, Default)]
pub(super) struct AblOutput {
    /// Tools without errors, in file order.
    pub tools: Vec<ToolDef>,
    /// Every tool name declared (valid or not), for duplicate and reference
    /// checks across the bundle without cascading errors.
    pub declared: Vec<NameAt>,
    /// `(tool, probe)` of every `reconcile_with:`, checked across the bundle.
    pub reconcile_refs: Vec<(String, NameAt)>,
    /// Workflows named by `type: workflow` tools, to resolve against the bundle.
    pub workflow_refs: Vec<NameAt>,
    /// `file:` imports of the `TOOLS:` section, resolved against the bundle.
    pub imports: Vec<FileImport>,
    /// `(producer, vault key, consumer)` of every `consumers:` name of a
    /// `RESULT_SECRETS:` entry, checked across the bundle.
    pub secret_consumers: Vec<(String, String, NameAt)>,
    /// Every `timeout_ms: "{{config.NAME}}"` of a `type: workflow` tool,
    /// resolved across the bundle.
    pub config_timeouts: Vec<ConfigTimeout>,
    /// Every problem found.
    pub errors: Vec<DefinitionError>,
}

/// Parse one `.tools.abl` file.
pub(super) fn parse_tools_file(file: &str, content: &str) -> AblOutput {
    let mut cx = Cx {
        file,
        out: AblOutput::default(),
        types: BTreeMap::new(),
        block_scalars: BTreeMap::new(),
    };
    let lines = split_lines(content, &mut cx);
    let mut lines = lines.into_iter().peekable();
    let blocks = build_level(&mut lines, None, 0, &mut cx);
    // Named types first: tools anywhere in the file may use them.
    let mut types_sections = 0;
    for block in blocks.iter().filter(|b| b.line.text == "TYPES:") {
        types_sections += 1;
        if types_sections > 1 {
            cx.error(
                block.line.no,
                block.line.col(),
                "a second `TYPES:` section; a file has one",
            );
            continue;
        }
        cx.types = types::read_types(block, &mut cx);
    }
    let mut sections = 0;
    for block in &blocks {
        let line = &block.line;
        if line.text == "TYPES:" {
            continue;
        }
        if line.text == "TOOLS:" {
            sections += 1;
            // Defaults come first: they are the lines before the first tool.
            let first_tool = block
                .children
                .iter()
                .position(|b| is_signature_start(&b.line.text))
                .unwrap_or(block.children.len());
            let (head_items, rest) = block.children.split_at(first_tool);
            let defaults = read_file_defaults(head_items, &mut cx);
            for item in rest {
                parse_item(item, &defaults, &mut cx);
            }
        } else if line.text.starts_with("TOOLS:") {
            cx.error(
                line.no,
                line.col(),
                "`TOOLS:` takes an indented block of tools, not a value on the same line",
            );
        } else {
            cx.error(
                line.no,
                line.col(),
                format!(
                    "expected `TOOLS:`, found `{}`; a tools file holds a `TOOLS:` section and, optionally, a `TYPES:` section",
                    head(&line.text)
                ),
            );
        }
    }
    if sections == 0 && blocks.is_empty() {
        cx.error(1, 1, "no `TOOLS:` section: the file declares no tools");
    }
    cx.out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
