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

use std::collections::{BTreeMap, BTreeSet};

use belay_proto::wire::{
    BodyMode, BodyType, HttpAuth, HttpRequestOptions, QueryParam, TemplatePiece,
    config_placeholder_name, secret_placeholder_name, split_placeholders,
};
use serde_json::Value;

use super::expr::Expr;
use super::imports::{FileImport, parse_import_value};
use super::model::{
    AuthField, ChildMode, CircuitBreakerDef, CompactionDef, ConfirmationDef, Effect, InjectedParam,
    Latency, MAX_TIMER_MS, ParamSource, RepeatSafety, RuntimeField, ToolBindingDef, ToolDef,
    ToolHints,
};
use super::signature::{
    self, Direction, Field, MAX_TYPE_DEPTH, Prim, Signature, TypeExpr, check_input_type,
    parse_field_decl, parse_signature,
};
use super::{DefinitionError, NameAt, check_name, check_permission};

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
/// are read by [`enrich_field`] where they apply; elsewhere they are
/// refused here.)
const SEED_ENRICHMENT_KEYS: &[&str] = &["properties", "items"];

/// Enrichment keys of a tool's parameter (not of a nested field) that Belay
/// reads, besides `description` ([`SourceKeys`]).
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

/// A `visibility.trace: false` parameter: name, type, and the line and
/// column of its `trace:` value.
type Untraced = (String, TypeExpr, u32, u32);

/// A parameter the model does not supply, with the line and column of its
/// name.
type Injected = (InjectedParam, (u32, u32));

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
    /// `(tool, NAME, line, column)` of every `timeout_ms: "{{config.NAME}}"`
    /// of a `type: workflow` tool, resolved across the bundle.
    pub config_timeouts: Vec<(String, String, u32, u32)>,
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

struct Cx<'a> {
    file: &'a str,
    out: AblOutput,
    /// The file's `TYPES:`, expanded ([`types::read_types`]).
    types: BTreeMap<String, TypeExpr>,
    /// The text of each `key: |` block scalar, by the line number of its
    /// key (`block_scalar.rs`); its lines are not in the line tree.
    block_scalars: BTreeMap<u32, block_scalar::BlockScalar>,
}

impl Cx<'_> {
    fn error(&mut self, line: u32, column: u32, message: impl Into<String>) {
        self.out
            .errors
            .push(DefinitionError::new(self.file, line, column, message));
    }
}

/// One meaningful line: comment stripped, trimmed, with its indentation.
#[derive(Debug, Clone)]
struct Line {
    /// 1-based line number.
    no: u32,
    /// Leading spaces.
    indent: usize,
    /// The content, without comment and surrounding whitespace.
    text: String,
}

impl Line {
    /// Column of the first character of `text`.
    fn col(&self) -> u32 {
        to_u32(self.indent).saturating_add(1)
    }
}

/// A line and the more-indented lines under it.
#[derive(Debug)]
struct Block {
    line: Line,
    children: Vec<Block>,
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The first few words of `text`, for messages that quote a line.
fn head(text: &str) -> String {
    let cut: String = text.chars().take(40).collect();
    if cut.len() < text.len() {
        format!("{cut}...")
    } else {
        cut
    }
}

fn split_lines(content: &str, cx: &mut Cx<'_>) -> Vec<Line> {
    let content = content.strip_prefix('\u{feff}').unwrap_or(content);
    let mut lines = Vec::new();
    let mut raws = content.split('\n').enumerate().peekable();
    while let Some((i, raw)) = raws.next() {
        let no = to_u32(i).saturating_add(1);
        let raw = raw.strip_suffix('\r').unwrap_or(raw);
        let stripped = strip_comment(raw);
        if stripped.trim().is_empty() {
            continue;
        }
        let leading: Vec<char> = stripped.chars().take_while(|c| c.is_whitespace()).collect();
        if let Some(at) = leading.iter().position(|&c| c != ' ') {
            cx.error(
                no,
                to_u32(at).saturating_add(1),
                "indentation must be spaces (found a tab or other whitespace)",
            );
            continue;
        }
        let line = Line {
            no,
            indent: leading.len(),
            text: stripped.trim().to_string(),
        };
        // A `key: |` takes the more-indented raw lines after it as its
        // text: comments, blank lines and indentation included.
        if let Some(indicator) = split_key(&line).map(|kv| kv.value)
            && block_scalar::is_indicator(indicator)
        {
            let scalar = block_scalar::read(indicator, &line, &mut raws);
            cx.block_scalars.insert(no, scalar);
        }
        lines.push(line);
    }
    lines
}

/// Cut a `#` comment: a `#` at the start or after whitespace, outside
/// quotes. As in YAML, `a#b` is not a comment, so `#` in URLs survives.
fn strip_comment(raw: &str) -> &str {
    let mut quote: Option<char> = None;
    let mut prev: Option<char> = None;
    let mut escaped = false;
    for (i, c) in raw.char_indices() {
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if c == '\\' && q == '"' {
                    escaped = true;
                } else if c == '\'' && q == '\'' && raw[i + 1..].starts_with('\'') {
                    // `''` is a quote inside a single-quoted string.
                    escaped = true;
                } else if c == q {
                    quote = None;
                }
            }
            None => {
                // A quote opens a string only where a value can start; the
                // apostrophe in `don't` must not hide a later comment.
                let at_value_start = prev.is_none_or(|p| p.is_whitespace() || ":=,([{".contains(p));
                if (c == '"' || c == '\'') && at_value_start {
                    quote = Some(c);
                } else if c == '#' && prev.is_none_or(char::is_whitespace) {
                    return &raw[..i];
                }
            }
        }
        prev = Some(c);
    }
    raw
}

/// Group lines into blocks: each line owns the following lines indented
/// further than it.
fn build_level(
    lines: &mut std::iter::Peekable<std::vec::IntoIter<Line>>,
    parent_indent: Option<usize>,
    depth: usize,
    cx: &mut Cx<'_>,
) -> Vec<Block> {
    let mut out = Vec::new();
    let mut level: Option<usize> = None;
    while let Some(next) = lines.peek() {
        if parent_indent.is_some_and(|p| next.indent <= p) {
            break;
        }
        if depth >= MAX_BLOCK_DEPTH {
            cx.error(next.no, next.col(), "indentation is nested too deeply");
            // Drop the whole over-deep subtree: one error is enough.
            while lines
                .peek()
                .is_some_and(|l| parent_indent.is_none_or(|p| l.indent > p))
            {
                lines.next();
            }
            break;
        }
        let Some(line) = lines.next() else { break };
        match level {
            None => level = Some(line.indent),
            Some(l) if l != line.indent => cx.error(
                line.no,
                line.col(),
                format!(
                    "inconsistent indentation: {} spaces here, {} on the lines above at this level",
                    line.indent, l
                ),
            ),
            Some(_) => {}
        }
        let children = build_level(lines, Some(line.indent), depth + 1, cx);
        out.push(Block { line, children });
    }
    out
}

/// `key: value` (or `key?: value` in `parameters:`), split with columns.
struct KeyValue<'a> {
    key: &'a str,
    key_col: u32,
    optional: bool,
    value: &'a str,
    value_col: u32,
}

fn split_key(line: &Line) -> Option<KeyValue<'_>> {
    let text = line.text.as_str();
    let colon = text.find(':')?;
    let rest = &text[colon + 1..];
    if !(rest.is_empty() || rest.starts_with(char::is_whitespace)) {
        return None;
    }
    let mut key = text[..colon].trim_end();
    let optional = key.ends_with('?');
    if optional {
        key = key[..key.len() - 1].trim_end();
    }
    let mut chars = key.chars();
    let valid = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !valid {
        return None;
    }
    let value = rest.trim();
    let value_offset = text.len() - rest.trim_start().len();
    Some(KeyValue {
        key,
        key_col: line.col(),
        optional,
        value,
        value_col: line
            .col()
            .saturating_add(to_u32(text[..value_offset].chars().count())),
    })
}

/// A scalar property value: `"double"` or `'single'` quoted, or bare text.
fn parse_scalar(value: &str, col: u32) -> Result<String, (u32, String)> {
    let chars: Vec<char> = value.chars().collect();
    match chars.first() {
        Some('"' | '\'') => {
            let (s, next) = signature::lex_string(&chars, 0)
                .map_err(|(at, m)| (col.saturating_add(to_u32(at)), m))?;
            if chars[next..].iter().any(|c| !c.is_whitespace()) {
                return Err((
                    col.saturating_add(to_u32(next)),
                    "unexpected text after the closing quote".to_string(),
                ));
            }
            Ok(s)
        }
        _ if block_scalar::is_indicator(value) => Err((
            col,
            "block scalars (`|`, `>`) are supported for `code:` only; write the value on one line, in quotes"
                .to_string(),
        )),
        _ => Ok(value.to_string()),
    }
}

fn is_quoted(value: &str) -> bool {
    value.starts_with('"') || value.starts_with('\'')
}

/// One item under `TOOLS:`: a tool, or something the seed allows there that
/// Belay does not.
fn parse_item(block: &Block, defaults: &FileDefaults, cx: &mut Cx<'_>) {
    let line = &block.line;
    if is_signature_start(&line.text) {
        parse_tool(block, defaults, cx);
        return;
    }
    if read_import(block, cx) {
        return;
    }
    let message = match split_key(line) {
        Some(kv) if FILE_DEFAULTS.contains(&kv.key) => {
            format!(
                "file-level default `{}:` must come before the first tool",
                kv.key
            )
        }
        _ => not_a_tool_message(line),
    };
    cx.error(line.no, line.col(), message);
}

/// Why a line under `TOOLS:` that is neither a tool nor a default is refused.
fn not_a_tool_message(line: &Line) -> String {
    match split_key(line) {
        Some(kv) if kv.key == "retry_policy" || kv.key == "circuit_breaker" => format!(
            "`{}:` is not a file-level default: give it per tool (the file's defaults are {})",
            kv.key,
            FILE_DEFAULTS
                .iter()
                .map(|d| format!("`{d}:`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        _ => format!(
            "expected a tool signature `name(params) -> ReturnType`, found `{}`",
            head(&line.text)
        ),
    }
}

/// The shared defaults at the top of a tools file (the seed's "Tool file
/// format"), for its `type: http` and `type: async_webhook` tools.
#[derive(Debug, Default)]
struct FileDefaults {
    /// `base_url:`, joined to every endpoint that is a path.
    base_url: Option<String>,
    /// `auth:` with `auth_config:`, for tools without an `auth:` of their own.
    auth: Option<HttpAuth>,
    /// `timeout:` in ms, for tools without one.
    timeout_ms: Option<u64>,
    /// `headers:`, merged under each tool's (a tool's header of the same
    /// name, in any case, wins).
    headers: BTreeMap<String, String>,
    /// `retry:` and `retry_delay:`, for tools without their own.
    retry: retry::RetryProps,
    /// `rate_limit:`, for tools without one.
    rate_limit: Option<f64>,
}

/// Reads the lines before the first tool: [`FILE_DEFAULTS`] (read by the
/// same code as a tool's properties), anything else refused.
fn read_file_defaults(items: &[Block], cx: &mut Cx<'_>) -> FileDefaults {
    let mut accepted = Vec::new();
    for item in items {
        if read_import(item, cx) {
            continue;
        }
        match split_key(&item.line) {
            Some(kv) if FILE_DEFAULTS.contains(&kv.key) && !kv.optional => accepted.push(item),
            _ => cx.error(
                item.line.no,
                item.line.col(),
                not_a_tool_message(&item.line),
            ),
        }
    }
    let props = read_props(accepted.into_iter(), cx);
    for (key, line, col) in &props.header_secrets {
        cx.error(
            *line,
            *col,
            format!(
                "`{{{{_secret.{key}}}}}` is not allowed in the file's default `headers:`: put it in the `headers:` of the tool whose `SECRET_ACCESS` lists `{key}`"
            ),
        );
    }
    let auth = props_auth(&props, None, cx);
    FileDefaults {
        base_url: props.base_url.map(|(url, _, _)| url),
        auth,
        timeout_ms: props.timeout_ms,
        headers: props.headers,
        retry: props.retry,
        rate_limit: props.rate_limit,
    }
}

/// A `file: "path" [tool, ...]` line (the seed's "Import syntax"), anywhere
/// in the `TOOLS:` section: recorded for the bundle to resolve. Whether
/// `block` is one.
fn read_import(block: &Block, cx: &mut Cx<'_>) -> bool {
    let line = &block.line;
    let Some(kv) = split_key(line).filter(|kv| kv.key == "file" && !kv.optional) else {
        return false;
    };
    if let Some(child) = block.children.first() {
        cx.error(
            child.line.no,
            child.line.col(),
            "`file:` takes no indented block; list the tools in brackets: `file: \"./a.tools.abl\" [tool, ...]`",
        );
    }
    match parse_import_value(kv.value, line.no, kv.value_col) {
        Ok(import) => cx.out.imports.push(import),
        Err((column, message)) => cx.error(line.no, column, message),
    }
    true
}

fn is_signature_start(text: &str) -> bool {
    let rest = text.trim_start_matches(|c: char| c.is_ascii_alphanumeric() || c == '_');
    rest.len() < text.len() && rest.trim_start().starts_with('(')
}

/// How a tool is called, from `type:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BindingType {
    Http,
    Workflow,
    AsyncWebhook,
    Mcp,
    Unsupported,
    Sandbox,
}

/// Everything read from a tool's property lines.
#[derive(Default)]
struct Props<'b> {
    description: Option<String>,
    /// The `type:` read, or `Unsupported` for a type already reported (so
    /// no "missing `type`" error follows).
    binding_type: Option<BindingType>,
    /// `workflow_id:` of a `type: workflow` tool.
    workflow_id: Option<NameAt>,
    /// `mode:` of a `type: workflow` tool.
    mode: Option<ChildMode>,
    /// `timeout_ms:` of a `type: workflow` tool.
    workflow_timeout_ms: Option<u64>,
    /// `timeout_ms: "{{config.NAME}}"` of a `type: workflow` tool: NAME,
    /// line and column, resolved from the engine's configuration by
    /// [`super::parse_bundle`].
    workflow_timeout_config: Option<(String, u32, u32)>,
    /// `param_mapping:` of a `type: workflow` tool: workflow input key → tool parameter.
    param_mapping: BTreeMap<String, String>,
    /// `callback_url_field:` of a `type: async_webhook` tool, with its line and column.
    callback_url_field: Option<(String, u32, u32)>,
    /// `timeout_seconds:` of a `type: async_webhook` tool.
    callback_timeout_seconds: Option<u64>,
    /// `server:` of a `type: mcp` tool.
    server: Option<String>,
    /// `server_tool:` of a `type: mcp` tool.
    server_tool: Option<String>,
    /// `resource:` of a `type: mcp` tool (`abl/mcp_resource.rs`), with the
    /// line and column of its value.
    resource: Option<(String, u32, u32)>,
    endpoint: Option<(String, u32, u32)>,
    method: Option<String>,
    /// Line and column of the `method:` value.
    method_at: (u32, u32),
    headers: BTreeMap<String, String>,
    timeout_ms: Option<u64>,
    permission: Option<String>,
    repeat_safety: Option<RepeatSafety>,
    reconcile_with: Option<NameAt>,
    /// `scrub_secrets: false` (None: the default, true).
    scrub_secrets: Option<bool>,
    /// `pii_access:` (`abl/pii.rs`), with the line and column of its value.
    pii_access: Option<(crate::model::PiiAccess, u32, u32)>,
    /// `strict: true`, with the line and column of its value.
    strict: Option<(u32, u32)>,
    /// `rate_limit:`, calls per second.
    rate_limit: Option<f64>,
    /// `circuit_breaker:`.
    circuit_breaker: Option<CircuitBreakerDef>,
    /// `compaction:`.
    compaction: Option<CompactionDef>,
    /// `on_result: {set: ...}`.
    on_result: BTreeMap<String, Expr>,
    /// `on_error: {set: ...}`.
    on_error: BTreeMap<String, Expr>,
    /// `process:` (`abl/process.rs`).
    process: Option<crate::model::ProcessDef>,
    /// `confirmation:` with `require: always` or `when_side_effects`.
    confirmation: Option<ConfirmationProps>,
    /// `hints:`.
    hints: ToolHints,
    /// Line and column of the value of each hint written.
    hint_at: BTreeMap<&'static str, (u32, u32)>,
    /// `effect:`, with the line and column of its value.
    effect: Option<(Effect, u32, u32)>,
    parameters: Option<&'b Block>,
    /// `base_url:` (a file-level default only), with its line and column.
    base_url: Option<(String, u32, u32)>,
    /// `auth:` as written, with the line and column of its value.
    auth: Option<(String, u32, u32)>,
    /// `auth_config:`, read once `auth:` is known.
    auth_config: Option<&'b Block>,
    /// `query_params:`, read once the signature is known.
    query_params: Option<&'b Block>,
    /// `body_type:`, with the line and column of its value.
    body_type: Option<(BodyType, u32, u32)>,
    /// `body_mode:`.
    body_mode: Option<BodyMode>,
    /// `body_template:` (or `body:`), with the line and the column of its
    /// first character inside the quotes.
    body_template: Option<(String, u32, u32)>,
    /// `retry:`, `retry_delay:` and `retry_policy:`.
    retry: retry::RetryProps,
    /// `RESULT_SECRETS:`, read once the return type is known.
    result_secrets: Option<&'b Block>,
    /// `SECRET_ACCESS:`.
    secret_access: Option<&'b Block>,
    /// Every `{{_secret.KEY}}` of `headers:`: (KEY, line, column), checked
    /// against `SECRET_ACCESS` once it is read.
    header_secrets: Vec<(String, u32, u32)>,
    /// `request_variants:`, read once the tool's own request is known.
    request_variants: Option<&'b Block>,
    /// `xml_root:`, with its line and column.
    xml_root: Option<(String, u32, u32)>,
    /// `body_schema:` (parsed and compiled), with its line and column.
    body_schema: Option<(Value, u32, u32)>,
    /// `use_body_schema:`, with its line and column.
    use_body_schema: Option<(bool, u32, u32)>,
    /// `tls_profile:`.
    tls_profile: Option<String>,
    /// Every property written, valid or not: an invalid `permission:` is
    /// reported once, as invalid, not a second time as missing. `body:` is
    /// recorded as `body_template`.
    present: BTreeSet<String>,
    /// `runtime:`, `code:` and `memory_mb:` of a `type: sandbox` tool
    /// (`sandbox.rs`).
    sandbox: sandbox::SandboxProps,
    /// `sampling:` of a `type: mcp` tool (`abl/sampling.rs`), with the line
    /// and column of its key.
    sampling: Option<(crate::model::SamplingDef, u32, u32)>,
}

fn parse_tool(block: &Block, defaults: &FileDefaults, cx: &mut Cx<'_>) {
    let line = &block.line;
    let errors_before = cx.out.errors.len();
    let signature = match parse_signature(&line.text, line.col()) {
        Ok(s) => Some(s),
        Err(e) => {
            cx.error(line.no, e.column, e.message);
            None
        }
    };
    // The name is known even when the rest of the signature is broken, so
    // agents that list the tool do not get a second, misleading error.
    let name: String = line
        .text
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    if let Some(message) = check_name("tool", &name) {
        cx.error(line.no, line.col(), message);
    }
    cx.out.declared.push(NameAt {
        name: name.clone(),
        line: line.no,
        column: line.col(),
    });
    let mut signature = signature;
    if let Some(sig) = &mut signature {
        // The file's named types, substituted.
        let types = std::mem::take(&mut cx.types);
        // Parameters whose type names a type: their defaults were checked
        // against an opaque schema when parsed, so again once expanded.
        let named: Vec<bool> = sig
            .params
            .iter()
            .map(|p| {
                let mut refs = Vec::new();
                signature::named_refs(&p.ty, &mut refs);
                !refs.is_empty()
            })
            .collect();
        for ty in sig
            .params
            .iter_mut()
            .map(|p| &mut p.ty)
            .chain([&mut sig.returns])
        {
            if let Err(e) = signature::expand_named(ty, &types) {
                cx.error(line.no, e.column, e.message);
            }
        }
        cx.types = types;
        for (p, named) in sig.params.iter().zip(named) {
            if let Err(e) = check_input_type(&p.ty) {
                cx.error(line.no, e.column, e.message);
            } else if named
                && let Some(d) = &p.default
                && let Err(e) = signature::check_default(&p.ty, d, p.column)
            {
                // A named type's default is checked once the type is known.
                cx.error(
                    line.no,
                    e.column,
                    format!("parameter `{}`: {}", p.name, e.message),
                );
            }
        }
    }

    let mut props = read_props(block.children.iter(), cx);

    let mut injected = Vec::new();
    let mut untraced = Vec::new();
    if let Some(sig) = &mut signature
        && let Some(params_block) = props.parameters
    {
        (injected, untraced) = apply_parameters(params_block, &mut sig.params, &name, cx);
    }
    check_injected_use(&injected, &props, &name, cx);
    check_side_effect_hints(&props, cx);

    if let (Some(sig), Some(c)) = (&signature, &props.confirmation) {
        for (param, pline, pcol) in &c.immutable {
            if !sig.params.iter().any(|p| &p.name == param) {
                cx.error(
                    *pline,
                    *pcol,
                    format!(
                        "`immutable_params` names `{param}`, which is not a parameter of `{name}`"
                    ),
                );
            }
        }
    }
    let missing = |cx: &mut Cx<'_>, what: &str| {
        cx.error(
            line.no,
            line.col(),
            format!("tool `{name}` is missing {what}"),
        );
    };
    match props.binding_type {
        None => missing(cx, "`type: http` (how the tool is called)"),
        Some(BindingType::Http | BindingType::AsyncWebhook)
            if !props.present.contains("endpoint") =>
        {
            missing(cx, "`endpoint:`")
        }
        Some(BindingType::AsyncWebhook) if !props.present.contains("method") => missing(
            cx,
            "`method:` (`POST`, `PUT` or `PATCH`: an async webhook sends a body with the callback URL)",
        ),
        Some(BindingType::Workflow) if !props.present.contains("workflow_id") => {
            missing(cx, "`workflow_id:` (the workflow a call starts)")
        }
        Some(BindingType::Mcp) if !props.present.contains("server") => missing(
            cx,
            "`server:` (the MCP server's logical name, as the worker's MCP configuration names it)",
        ),
        _ => {}
    }
    check_mcp_props(&props, &name, line, cx);
    sandbox::check(&props, signature.as_ref(), &name, line, cx);
    if props.binding_type == Some(BindingType::Workflow) {
        for key in ["rate_limit", "circuit_breaker"] {
            if props.present.contains(key) {
                cx.error(
                    line.no,
                    line.col(),
                    format!(
                        "tool `{name}` is `type: workflow`: `{key}:` applies to tools a worker calls (`type: http`, `async_webhook` or `mcp`)"
                    ),
                );
            }
        }
        for key in ["endpoint", "method", "headers", "timeout"] {
            if props.present.contains(key) {
                cx.error(
                    line.no,
                    line.col(),
                    format!(
                        "tool `{name}` is `type: workflow`: `{key}:` applies to `type: http` only"
                    ),
                );
            }
        }
        if let (Some(sig), false) = (&signature, props.param_mapping.is_empty()) {
            for (key, param) in &props.param_mapping {
                if !sig.params.iter().any(|p| &p.name == param) {
                    cx.error(
                        line.no,
                        line.col(),
                        format!("`param_mapping` maps `{key}` from `{param}`, which is not a parameter of `{name}`"),
                    );
                }
            }
        }
        if let Some(w) = &props.workflow_id {
            cx.out.workflow_refs.push(w.clone());
        }
        if let Some((config, at_line, at_col)) = &props.workflow_timeout_config {
            cx.out
                .config_timeouts
                .push((name.clone(), config.clone(), *at_line, *at_col));
        }
    } else {
        for key in ["workflow_id", "mode", "timeout_ms", "param_mapping"] {
            if props.present.contains(key) {
                cx.error(
                    line.no,
                    line.col(),
                    format!("`{key}:` applies to `type: workflow` tools only"),
                );
            }
        }
    }
    if props.binding_type == Some(BindingType::AsyncWebhook) {
        if let Some(method) = &props.method
            && !["POST", "PUT", "PATCH"].contains(&method.as_str())
        {
            cx.error(
                props.method_at.0,
                props.method_at.1,
                format!(
                    "tool `{name}` is `type: async_webhook`: `method: {method}` sends no body to carry the callback URL (expected POST, PUT or PATCH)"
                ),
            );
        }
        if let (Some(sig), Some((field, fline, fcol))) = (&signature, &props.callback_url_field) {
            let first = field.split('.').next().unwrap_or_default();
            if sig.params.iter().any(|p| p.name == first) {
                cx.error(
                    *fline,
                    *fcol,
                    format!(
                        "`callback_url_field: {field}` would overwrite the parameter `{first}` of `{name}`; pick a field no parameter uses"
                    ),
                );
            }
        }
    } else {
        for key in ["callback_url_field", "timeout_seconds"] {
            if props.present.contains(key) {
                cx.error(
                    line.no,
                    line.col(),
                    format!("`{key}:` applies to `type: async_webhook` tools only"),
                );
            }
        }
    }
    if !props.present.contains("permission") {
        missing(
            cx,
            "`permission:` (the one permission a call needs, e.g. `crm.write`)",
        );
    }
    // An MCP tool may leave it to the server's hints (resolved when a run
    // starts; `never` without a trusted hint).
    let from_server =
        !props.present.contains("repeat_safety") && props.binding_type == Some(BindingType::Mcp);
    // Reading a resource changes nothing: idempotent, not the server's hints.
    let from_server = from_server && props.resource.is_none();
    if !props.present.contains("repeat_safety") && props.resource.is_some() {
        props.repeat_safety = Some(RepeatSafety::Idempotent);
    } else if from_server {
        props.repeat_safety = Some(RepeatSafety::Never);
    } else if props.binding_type == Some(BindingType::Sandbox)
        && !props.present.contains("repeat_safety")
    {
        // A pure computation: running it again is harmless.
        props.repeat_safety = Some(RepeatSafety::Idempotent);
    } else if !props.present.contains("repeat_safety") {
        missing(
            cx,
            "`repeat_safety:` (`never`, `idempotent` or `reconcile`)",
        );
    }
    cache::check(
        &props,
        &injected,
        &name,
        props.present.contains("repeat_safety"),
        cx,
    );
    if let Some(probe) = &props.reconcile_with {
        if props
            .repeat_safety
            .is_some_and(|r| r != RepeatSafety::Reconcile)
        {
            cx.error(
                probe.line,
                probe.column,
                "`reconcile_with:` needs `repeat_safety: reconcile`",
            );
        }
        if probe.name == name {
            cx.error(
                probe.line,
                probe.column,
                format!("tool `{name}` cannot reconcile with itself"),
            );
        }
        cx.out.reconcile_refs.push((name.clone(), probe.clone()));
    }
    if let (Some(sig), Some((endpoint, eline, ecol))) = (&signature, &props.endpoint) {
        check_path_params(endpoint, *eline, *ecol, sig, cx);
    }
    if let Some((_, bline, bcol)) = &props.base_url {
        cx.error(
            *bline,
            *bcol,
            "`base_url:` is a file-level default: put it under `TOOLS:`, above the first tool",
        );
    }
    let mut placed_secrets = std::mem::take(&mut props.header_secrets);
    let request = http_request_options(
        &props,
        signature.as_ref(),
        &name,
        line,
        defaults,
        &mut placed_secrets,
        cx,
    );
    let (result_secrets, secret_access) =
        secrets::read_tool(&props, signature.as_ref(), &name, line, placed_secrets, cx);
    let request_variants = match (props.request_variants, props.binding_type) {
        (Some(block), Some(BindingType::Http)) => {
            let base_headers = merge_headers(&defaults.headers, props.headers.clone());
            let base = http_variants::BaseRequest {
                endpoint: props.endpoint.as_ref().map(|(e, _, _)| e.as_str()),
                method: props.method.as_deref().unwrap_or("POST"),
                headers: &base_headers,
                request: &request,
                body_type: props.body_type,
                body_mode: props.body_mode,
                body_template: props.body_template.as_ref(),
                base_url: defaults.base_url.as_deref(),
                xml_root: props.xml_root.as_ref().map(|(_, l, c)| (*l, *c)),
                body_schema: request
                    .body_schema
                    .as_ref()
                    .and(props.body_schema.as_ref())
                    .map(|(_, l, c)| (*l, *c)),
                broken: cx.out.errors.len() > errors_before,
            };
            let mut placed = Vec::new();
            let variants = http_variants::read_variants(
                block,
                &base,
                signature.as_ref(),
                &name,
                line,
                &mut placed,
                cx,
            );
            // A variant's `{{_secret.KEY}}` must be a key the tool reads, as
            // in its own headers and body template.
            for (key, kline, kcol) in placed {
                if !secret_access.contains(&key) {
                    cx.error(
                        kline,
                        kcol,
                        format!(
                            "`{{{{_secret.{key}}}}}`: `{key}` is not in the `SECRET_ACCESS: READ` list of `{name}`"
                        ),
                    );
                }
            }
            variants
        }
        (Some(block), Some(t)) if t != BindingType::Unsupported => {
            cx.error(
                block.line.no,
                block.line.col(),
                "`request_variants:` applies to `type: http` tools only",
            );
            Vec::new()
        }
        _ => Vec::new(),
    };
    check_injected_use_in_variants(&injected, &request_variants, &name, cx);
    let own_retry = std::mem::take(&mut props.retry);
    let retry_policy =
        retry::tool_policy(own_retry, &defaults.retry, props.binding_type, &name, cx);

    if cx.out.errors.len() > errors_before {
        return;
    }
    // No error was recorded, so every required piece is present; the
    // `let ... else` only satisfies the types.
    let (Some(sig), Some(permission), Some(repeat_safety)) =
        (signature, props.permission, props.repeat_safety)
    else {
        return;
    };
    // The file's defaults apply to HTTP requests only.
    let http_like = matches!(
        props.binding_type,
        Some(BindingType::Http | BindingType::AsyncWebhook)
    );
    let (headers, default_timeout_ms, default_rate_limit) = if http_like {
        (
            merge_headers(&defaults.headers, props.headers),
            defaults.timeout_ms,
            defaults.rate_limit,
        )
    } else {
        (props.headers, None, None)
    };
    // The tool's `timeout:`, then its `hints.timeout`, then the file's.
    let timeout_ms = props
        .timeout_ms
        .or(props.hints.timeout_ms)
        .or(default_timeout_ms)
        .unwrap_or(DEFAULT_TIMEOUT_MS);
    let method = props.method.unwrap_or_else(|| "POST".to_string());
    let endpoint = props
        .endpoint
        .map(|(e, _, _)| join_base_url(defaults.base_url.as_deref(), e));
    let binding = match (props.binding_type, endpoint, props.workflow_id) {
        (Some(BindingType::Mcp), _, _) => {
            let Some(server) = props.server else {
                return;
            };
            if let Some((template, line_no, col)) = props.resource {
                let Some(binding) = mcp_resource::binding(
                    server,
                    template,
                    timeout_ms,
                    &sig,
                    &props.present,
                    props.repeat_safety,
                )
                .map_err(|m| cx.error(line_no, col, m))
                .ok() else {
                    return;
                };
                binding
            } else {
                ToolBindingDef::Mcp {
                    server,
                    server_tool: props.server_tool.unwrap_or_else(|| sig.name.clone()),
                    headers,
                    timeout_ms,
                }
            }
        }
        (Some(BindingType::Http), Some(endpoint), _) => ToolBindingDef::Http {
            endpoint,
            method,
            headers,
            timeout_ms,
            request,
        },
        (Some(BindingType::Workflow), _, Some(workflow)) => ToolBindingDef::Workflow {
            workflow: workflow.name,
            mode: props.mode.unwrap_or_default(),
            timeout_ms: props.workflow_timeout_ms.or(props.hints.timeout_ms),
            param_mapping: props.param_mapping,
        },
        (Some(BindingType::Sandbox), _, _) => {
            let Some(binding) = sandbox::binding(
                &mut props.sandbox,
                &sig,
                props.timeout_ms.or(props.hints.timeout_ms),
            ) else {
                return;
            };
            ToolBindingDef::Sandbox(binding)
        }
        (Some(BindingType::AsyncWebhook), Some(endpoint), _) => ToolBindingDef::AsyncWebhook {
            endpoint,
            method,
            headers,
            timeout_ms,
            request,
            callback_url_field: props
                .callback_url_field
                .map(|(f, _, _)| f)
                .unwrap_or_else(|| DEFAULT_CALLBACK_URL_FIELD.to_string()),
            callback_timeout_ms: props
                .callback_timeout_seconds
                .unwrap_or(DEFAULT_CALLBACK_TIMEOUT_SECONDS)
                * 1000,
        },
        _ => return,
    };
    let model_input_schema = (!injected.is_empty()).then(|| {
        let visible: Vec<Field> = sig
            .params
            .iter()
            .filter(|p| !injected.iter().any(|(i, _)| i.name == p.name))
            .cloned()
            .collect();
        signature::input_schema(&visible)
    });
    let mut tool = ToolDef {
        name: sig.name,
        description: props.description.unwrap_or_default(),
        input_schema: signature::input_schema(&sig.params),
        output_schema: signature::type_schema(&sig.returns, Direction::Output),
        permission,
        repeat_safety,
        repeat_safety_from_server: from_server,
        scrub_secrets: props.scrub_secrets.unwrap_or(true),
        pii_access: props.pii_access.map(|(a, _, _)| a).unwrap_or_default(),
        reconcile_with: props.reconcile_with.map(|p| p.name),
        binding,
        confirmation: None,
        injected: injected.into_iter().map(|(i, _)| i).collect(),
        model_input_schema,
        hints: props.hints,
        effect: props.effect.map(|(e, _, _)| e),
        retry_policy,
        rate_limit: props.rate_limit.or(default_rate_limit),
        circuit_breaker: props.circuit_breaker,
        compaction: props.compaction,
        on_result: props.on_result,
        on_error: props.on_error,
        result_secrets,
        secret_access,
        process: props.process,
        request_variants,
        strict_schema: None,
        untraced: Vec::new(),
        sampling: props.sampling.map(|(def, _, _)| def),
        source_file: cx.file.to_string(),
        source_line: line.no,
    };
    if let Some((l, c)) = props.strict {
        match super::strict::to_strict(&tool.name, tool.model_schema()) {
            Ok(schema) => tool.strict_schema = Some(schema),
            Err(e) => {
                cx.error(l, c, e.to_string());
                return;
            }
        }
    }
    // `when_side_effects` is settled here, once: the machine sees a tool
    // that always asks, or one that never does.
    let side_effects = tool.has_side_effects();
    tool.confirmation = props
        .confirmation
        .filter(|c| !c.when_side_effects || side_effects)
        .map(|c| ConfirmationDef {
            when_side_effects: c.when_side_effects,
            immutable_params: c.immutable.into_iter().map(|(p, _, _)| p).collect(),
            approver_grant: c.grant.unwrap_or_else(|| tool.permission.clone()),
        });
    if let (Some((access, l, c)), Some((name, ..))) = (props.pii_access, untraced.first())
        && (access.user || access.tools)
    {
        cx.error(
            l,
            c,
            format!(
                "`pii_access:` cannot give personal data to `{name}`, a `visibility.trace: false` parameter: its value is sealed in the run's vault as the model wrote it, before the engine could put the data back in place of a token"
            ),
        );
        return;
    }
    if !untraced.is_empty() {
        if !visibility::check_untraced(&tool, &untraced, cx) {
            return;
        }
        tool.untraced = untraced.into_iter().map(|(n, ..)| n).collect();
    }
    cx.out.tools.push(tool);
}

/// Properties that shape an HTTP request beyond endpoint, method, headers
/// and timeout.
const HTTP_REQUEST_PROPERTIES: &[&str] = &[
    "auth",
    "auth_config",
    "query_params",
    "body_type",
    "body_mode",
    "body_template",
    "xml_root",
    "body_schema",
    "use_body_schema",
    "tls_profile",
];

/// Longest `tls_profile:` name, in characters.
const MAX_TLS_PROFILE_CHARS: usize = 64;

/// The checked `auth:`, `query_params:` and body properties of a `type:
/// http` or `type: async_webhook` tool (the file's `auth:` when the tool
/// has none). For any other type, each of them written is an error.
/// Every `{{_secret.KEY}}` of the body template goes into `body_secrets`
/// (KEY, line, column), to check against the tool's `SECRET_ACCESS`.
fn http_request_options(
    props: &Props<'_>,
    sig: Option<&Signature>,
    name: &str,
    line: &Line,
    defaults: &FileDefaults,
    body_secrets: &mut Vec<(String, u32, u32)>,
    cx: &mut Cx<'_>,
) -> HttpRequestOptions {
    let async_webhook = match props.binding_type {
        Some(BindingType::Http) => false,
        Some(BindingType::AsyncWebhook) => true,
        Some(BindingType::Workflow | BindingType::Mcp | BindingType::Sandbox) => {
            for key in HTTP_REQUEST_PROPERTIES {
                if props.present.contains(*key) {
                    cx.error(
                        line.no,
                        line.col(),
                        format!(
                            "`{key}:` applies to `type: http` and `type: async_webhook` tools only"
                        ),
                    );
                }
            }
            return HttpRequestOptions::default();
        }
        // Already reported: no second error about these properties.
        Some(BindingType::Unsupported) | None => return HttpRequestOptions::default(),
    };
    let auth = props_auth(props, defaults.auth.as_ref(), cx);
    let query_params = props
        .query_params
        .map(|block| read_query_params(block, sig, name, cx))
        .unwrap_or_default();
    let body_schema = used_body_schema(props, cx);
    let body = BodyProps {
        method: props.method.as_deref().unwrap_or("POST"),
        body_type: props.body_type,
        body_mode: props.body_mode.unwrap_or_default(),
        body_template: props.body_template.as_ref(),
        xml_root: props.xml_root.as_ref().map(|(_, l, c)| (*l, *c)),
        body_schema: body_schema.as_ref().map(|(_, l, c)| (*l, *c)),
    };
    check_body(&body, async_webhook, sig, name, line, body_secrets, cx);
    let (body_type, body_mode) = (
        body.body_type.map(|(t, _, _)| t).unwrap_or_default(),
        body.body_mode,
    );
    HttpRequestOptions {
        auth: auth.unwrap_or_default(),
        query_params,
        body_type,
        body_mode,
        body_template: props.body_template.as_ref().map(|(t, _, _)| t.clone()),
        xml_root: props.xml_root.as_ref().map(|(r, _, _)| r.clone()),
        body_schema: body_schema.map(|(s, _, _)| s),
        tls_profile: props.tls_profile.clone(),
    }
}

/// `body_schema:` when `use_body_schema: true` uses it. Either without the
/// other is an error: a schema written but not used would read as enforced.
fn used_body_schema(props: &Props<'_>, cx: &mut Cx<'_>) -> Option<(Value, u32, u32)> {
    match (&props.body_schema, props.use_body_schema) {
        (Some(schema), Some((true, _, _))) => Some(schema.clone()),
        (Some((_, sline, scol)), _) => {
            cx.error(
                *sline,
                *scol,
                "`body_schema:` is used only with `use_body_schema: true` beside it (add it, or drop the schema)",
            );
            None
        }
        (None, Some((true, uline, ucol))) => {
            cx.error(
                uline,
                ucol,
                "`use_body_schema: true` needs a `body_schema:` (the JSON Schema of the body)",
            );
            None
        }
        (None, _) => None,
    }
}

/// An XML element name as this worker writes them: a letter or `_`, then
/// letters, digits, `_`, `-` or `.` (ASCII; no namespace prefix).
fn is_xml_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// The body properties of one request (a tool's, or a request variant's
/// merged over it), each with the line and column it was written at.
struct BodyProps<'a> {
    /// Method, upper case.
    method: &'a str,
    body_type: Option<(BodyType, u32, u32)>,
    body_mode: BodyMode,
    body_template: Option<&'a (String, u32, u32)>,
    /// Line and column of `xml_root:`.
    xml_root: Option<(u32, u32)>,
    /// Line and column of `body_schema:` (with `use_body_schema: true`).
    body_schema: Option<(u32, u32)>,
}

/// The body rules: a method without a body takes no `body_type:` or
/// `body_template:`; an async webhook's body is JSON; `body_mode: none`
/// takes no template; a template is checked ([`check_body_template`]);
/// `body_type: text` needs one. Every `{{_secret.KEY}}` of the template
/// goes into `body_secrets`.
fn check_body(
    body: &BodyProps<'_>,
    async_webhook: bool,
    sig: Option<&Signature>,
    name: &str,
    line: &Line,
    body_secrets: &mut Vec<(String, u32, u32)>,
    cx: &mut Cx<'_>,
) {
    let method = body.method;
    let sends_body = matches!(method, "POST" | "PUT" | "PATCH");
    let body_type = body.body_type.map(|(t, _, _)| t).unwrap_or_default();
    let body_mode = body.body_mode;
    if !sends_body {
        if let Some((_, tline, tcol)) = body.body_type {
            cx.error(
                tline,
                tcol,
                format!("`method: {method}` sends no body: `body_type:` does not apply"),
            );
        }
        if let Some((_, tline, tcol)) = body.body_template {
            cx.error(
                *tline,
                *tcol,
                format!("`method: {method}` sends no body: `body_template:` does not apply"),
            );
        }
    }
    if async_webhook {
        if let Some((t, tline, tcol)) = body.body_type
            && t != BodyType::Json
        {
            cx.error(
                tline,
                tcol,
                "an async webhook sends the callback URL in a JSON body: `body_type` must be `json`",
            );
        }
        if body_mode == BodyMode::None {
            cx.error(
                line.no,
                line.col(),
                "an async webhook sends the callback URL in its body: `body_mode: none` does not apply",
            );
        }
    }
    match body.body_template {
        Some((_, tline, tcol)) if body_mode == BodyMode::None => cx.error(
            *tline,
            *tcol,
            "`body_mode: none` sends no body: drop it or the `body_template:`",
        ),
        Some((template, tline, tcol)) if sends_body => {
            let at = (*tline, *tcol);
            check_body_template(
                template,
                body_type,
                async_webhook,
                sig,
                name,
                at,
                body_secrets,
                cx,
            );
        }
        None if sends_body && body_type == BodyType::Text && body_mode == BodyMode::Auto => {
            if let Some((_, tline, tcol)) = body.body_type {
                cx.error(
                    tline,
                    tcol,
                    "`body_type: text` needs a `body_template:` (the text to send)",
                );
            }
        }
        _ => {}
    }
    if let Some((rline, rcol)) = body.xml_root {
        if body_type != BodyType::Xml {
            cx.error(rline, rcol, "`xml_root:` applies to `body_type: xml` only");
        } else if body.body_template.is_some() {
            cx.error(
                rline,
                rcol,
                "`xml_root:` names the root of a body made from the arguments; a `body_template:` writes its own root",
            );
        }
    }
    if let Some((sline, scol)) = body.body_schema {
        let made_from_json = match body_type {
            BodyType::Json => true,
            BodyType::Form | BodyType::Xml => body.body_template.is_none(),
            BodyType::Text => false,
        };
        let has_body = sends_body && (body_mode == BodyMode::Auto || body.body_template.is_some());
        if !has_body {
            cx.error(
                sline,
                scol,
                format!("`body_schema:` does not apply: `method: {method}` with this `body_mode` sends no body"),
            );
        } else if !made_from_json {
            cx.error(
                sline,
                scol,
                "`body_schema:` checks a body made from a JSON value: `body_type: json` (arguments or template), or `form` or `xml` made from the arguments (not a text template)",
            );
        }
    }
}

/// The `auth:` and `auth_config:` of `props`, or `fallback` (the file's)
/// when neither is written.
fn props_auth(props: &Props<'_>, fallback: Option<&HttpAuth>, cx: &mut Cx<'_>) -> Option<HttpAuth> {
    match (&props.auth, props.auth_config) {
        (Some(auth), config) => build_auth(auth, config, cx),
        (None, Some(config)) => {
            cx.error(
                config.line.no,
                config.line.col(),
                "`auth_config:` needs an `auth:` beside it (a tool's does not extend the file's `auth:`)",
            );
            None
        }
        (None, None) => fallback.cloned(),
    }
}

/// A `body_template:`: its placeholders name parameters; for JSON it is
/// JSON (placeholders inside strings), an object for an async webhook.
#[allow(clippy::too_many_arguments)]
fn check_body_template(
    template: &str,
    body_type: BodyType,
    async_webhook: bool,
    sig: Option<&Signature>,
    tool: &str,
    (line, col): (u32, u32),
    secrets: &mut Vec<(String, u32, u32)>,
    cx: &mut Cx<'_>,
) {
    if let Some(sig) = sig {
        let found = check_param_placeholders(template, (line, col), sig, "`body_template`", cx);
        secrets.extend(found);
    }
    if body_type != BodyType::Json {
        return;
    }
    match serde_json::from_str::<serde_json::Value>(template) {
        Err(e) => cx.error(
            line,
            col,
            format!(
                "`body_template` of `{tool}` is not JSON ({e}); put placeholders inside strings, like `{{\"name\": \"{{{{name}}}}\"}}` (a string that is only a placeholder takes the argument's JSON value)"
            ),
        ),
        Ok(value) if async_webhook && !value.is_object() => cx.error(
            line,
            col,
            "the `body_template` of an async webhook must be a JSON object, to carry the callback URL",
        ),
        Ok(_) => {}
    }
}

/// Each `{{...}}` in `text` (at `line`, `col`) names a parameter of `sig`:
/// query values and body templates take arguments, never credentials. A
/// body template may also hold `{{_secret.KEY}}`: returned as (KEY, line,
/// column) to check against the tool's `SECRET_ACCESS`; anywhere else it
/// is refused.
fn check_param_placeholders(
    text: &str,
    (line, col): (u32, u32),
    sig: &Signature,
    what: &str,
    cx: &mut Cx<'_>,
) -> Vec<(String, u32, u32)> {
    let mut secrets_found = Vec::new();
    let at = |offset: usize| col.saturating_add(to_u32(text[..offset].chars().count()));
    let pieces = match split_placeholders(text) {
        Ok(pieces) => pieces,
        Err(offset) => {
            cx.error(
                line,
                at(offset),
                format!("a `{{{{` placeholder in {what} is not closed with `}}}}`"),
            );
            return secrets_found;
        }
    };
    for piece in pieces {
        let TemplatePiece::Placeholder { inner, at: offset } = piece else {
            continue;
        };
        if inner.starts_with("_secret") {
            match secret_placeholder_name(inner) {
                Some(key) if what == "`body_template`" => {
                    secrets_found.push((key.to_owned(), line, at(offset)));
                }
                Some(_) => cx.error(line, at(offset), secrets::misplaced_message(inner, what)),
                None => cx.error(line, at(offset), secrets::bad_key_message(inner)),
            }
        } else if config_placeholder_name(inner).is_some() {
            cx.error(
                line,
                at(offset),
                format!(
                    "`{{{{{inner}}}}}` is not allowed in {what}: it takes parameters; credentials go in `headers:` or `auth_config:`"
                ),
            );
        } else if !sig.params.iter().any(|p| p.name == inner) {
            cx.error(
                line,
                at(offset),
                format!(
                    "`{{{{{inner}}}}}` in {what} is not a parameter of `{}`",
                    sig.name
                ),
            );
        }
    }
    secrets_found
}

/// `query_params:` as `key: value` lines (order kept, a key once) or `-
/// key: K` items with `value: V` under them (a key may repeat).
fn read_query_params(
    block: &Block,
    sig: Option<&Signature>,
    tool: &str,
    cx: &mut Cx<'_>,
) -> Vec<QueryParam> {
    let mut out = Vec::new();
    let mut map_keys: BTreeMap<String, u32> = BTreeMap::new();
    for entry in &block.children {
        let item = match entry.line.text.strip_prefix("- ") {
            Some(rest) => read_query_item(entry, rest, tool, cx),
            None => read_query_pair(entry, &mut map_keys, cx),
        };
        let Some((param, vline, vcol)) = item else {
            continue;
        };
        if let Some(sig) = sig {
            let _ =
                check_param_placeholders(&param.value, (vline, vcol), sig, "`query_params`", cx);
        }
        out.push(param);
    }
    out
}

/// A `key: value` line of `query_params:`, with the value's line and column.
fn read_query_pair(
    entry: &Block,
    seen: &mut BTreeMap<String, u32>,
    cx: &mut Cx<'_>,
) -> Option<(QueryParam, u32, u32)> {
    let line = &entry.line;
    let kv = entry_kv(line, "`key: value` or `- key: K` in `query_params:`", cx)?;
    if let Some(first) = seen.insert(kv.key.to_owned(), line.no) {
        cx.error(
            line.no,
            kv.key_col,
            format!(
                "duplicate query key `{}` (first on line {first}); to send a key twice, write each as `- key: {}` with `value:` under it",
                kv.key, kv.key
            ),
        );
        return None;
    }
    let value = scalar_or_empty(entry, &kv, cx)?;
    let col = kv.value_col + u32::from(is_quoted(kv.value));
    let param = QueryParam {
        key: kv.key.to_owned(),
        value,
    };
    Some((param, line.no, col))
}

/// A `- key: K` item of `query_params:` (with `value: V` beside or under
/// it), with the value's line and column.
fn read_query_item(
    entry: &Block,
    rest: &str,
    tool: &str,
    cx: &mut Cx<'_>,
) -> Option<(QueryParam, u32, u32)> {
    let first = Line {
        no: entry.line.no,
        indent: entry.line.indent + 2 + (rest.len() - rest.trim_start().len()),
        text: rest.trim_start().to_owned(),
    };
    let errors_before = cx.out.errors.len();
    let mut key = None;
    let mut value = None;
    for line in std::iter::once(&first).chain(entry.children.iter().map(|c| &c.line)) {
        let field = split_key(line).filter(|kv| !kv.optional);
        let Some(kv) = field.filter(|kv| matches!(kv.key, "key" | "value")) else {
            cx.error(
                line.no,
                line.col(),
                format!(
                    "expected `key:` or `value:` in a `query_params` item of `{tool}`, found `{}`",
                    head(&line.text)
                ),
            );
            continue;
        };
        let parsed = match parse_scalar(kv.value, kv.value_col) {
            Ok(v) => v,
            Err((col, m)) => {
                cx.error(line.no, col, m);
                continue;
            }
        };
        let slot = if kv.key == "key" {
            &mut key
        } else {
            &mut value
        };
        if slot.is_some() {
            cx.error(
                line.no,
                kv.key_col,
                format!("duplicate `{}` in a `query_params` item", kv.key),
            );
            continue;
        }
        let col = kv.value_col + u32::from(is_quoted(kv.value));
        *slot = Some((parsed, line.no, col));
    }
    if let Some(nested) = entry.children.iter().find_map(|c| c.children.first()) {
        cx.error(
            nested.line.no,
            nested.line.col(),
            "a `query_params` item is one `key:` and one `value:` line",
        );
    }
    if cx.out.errors.len() > errors_before {
        return None;
    }
    let (Some((key, kline, kcol)), Some((value, vline, vcol))) = (key, value) else {
        cx.error(
            entry.line.no,
            entry.line.col(),
            "a `query_params` item needs both `key:` and `value:`",
        );
        return None;
    };
    if key.is_empty() || key.chars().any(|c| c.is_whitespace() || c.is_control()) {
        cx.error(
            kline,
            kcol,
            "a query key must not be empty or contain whitespace",
        );
        return None;
    }
    Some((QueryParam { key, value }, vline, vcol))
}

/// A one-line value that may be empty (`q:` or `q: ""`).
fn scalar_or_empty(block: &Block, kv: &KeyValue<'_>, cx: &mut Cx<'_>) -> Option<String> {
    if kv.value.is_empty() && block.children.is_empty() {
        return Some(String::new());
    }
    scalar(block, kv, cx)
}

/// `auth:` with its `auth_config:` block, checked against the seed's
/// "Auth configuration" table. Credentials (`token`, `key`,
/// `client_secret`) must be `{{config.NAME}}` placeholders, so a tools file,
/// a stored definition and a task spec never hold one. `None` after an error.
fn build_auth(
    (kind, aline, acol): &(String, u32, u32),
    config: Option<&Block>,
    cx: &mut Cx<'_>,
) -> Option<HttpAuth> {
    let (aline, acol) = (*aline, *acol);
    let allowed: &[&'static str] = match kind.as_str() {
        "none" => &[],
        "bearer" => &["token"],
        "api_key" => &["header_name", "key"],
        "oauth2_client" => &["token_url", "client_id", "client_secret", "scopes"],
        "custom" => &["custom_headers"],
        "oauth2_user" => {
            cx.error(
                aline,
                acol,
                "`auth: oauth2_user` is not supported: a Belay run has no end user to authorize; use `oauth2_client`",
            );
            return None;
        }
        "saml" => {
            cx.error(
                aline,
                acol,
                "`auth: saml` is not supported (the seed itself does not resolve it at run time)",
            );
            return None;
        }
        other => {
            cx.error(
                aline,
                acol,
                format!(
                    "unknown auth `{other}` (expected `none`, `bearer`, `api_key`, `oauth2_client` or `custom`)"
                ),
            );
            return None;
        }
    };
    let errors_before = cx.out.errors.len();
    let mut config_values = AuthConfig::default();
    if let Some(block) = config {
        if kind == "none" {
            cx.error(
                block.line.no,
                block.line.col(),
                "`auth: none` takes no `auth_config:`",
            );
        }
        read_auth_config(block, kind, allowed, &mut config_values, cx);
    }
    let mut need = |key: &str, cx: &mut Cx<'_>| match config_values.values.remove(key) {
        Some(v) => Some(v),
        None => {
            let example = if matches!(key, "token" | "key" | "client_secret") {
                format!(" (e.g. `{key}: \"{{{{config.NAME}}}}\"`)")
            } else {
                String::new()
            };
            cx.error(
                aline,
                acol,
                format!("`auth: {kind}` needs `{key}:` in `auth_config:`{example}"),
            );
            None
        }
    };
    let auth = match kind.as_str() {
        "bearer" => need("token", cx).map(|token| HttpAuth::Bearer { token }),
        "api_key" => need("key", cx).map(|key| HttpAuth::ApiKey {
            header_name: config_values
                .values
                .remove("header_name")
                .unwrap_or_else(|| DEFAULT_API_KEY_HEADER.to_owned()),
            key,
        }),
        "oauth2_client" => {
            let token_url = need("token_url", cx);
            let client_id = need("client_id", cx);
            let client_secret = need("client_secret", cx);
            match (token_url, client_id, client_secret) {
                (Some(token_url), Some(client_id), Some(client_secret)) => {
                    Some(HttpAuth::Oauth2Client {
                        token_url,
                        client_id,
                        client_secret,
                        scopes: config_values.values.remove("scopes").unwrap_or_default(),
                    })
                }
                _ => None,
            }
        }
        "custom" => match config_values.custom_headers {
            Some(headers) if !headers.is_empty() => Some(HttpAuth::Custom { headers }),
            _ => {
                cx.error(
                    aline,
                    acol,
                    "`auth: custom` needs `custom_headers:` in `auth_config:` (an indented block of `Header-Name: value` lines)",
                );
                None
            }
        },
        _ => Some(HttpAuth::None),
    };
    auth.filter(|_| cx.out.errors.len() == errors_before)
}

/// What an `auth_config:` block holds.
#[derive(Default)]
struct AuthConfig {
    /// Scalar entries by key, each checked.
    values: BTreeMap<&'static str, String>,
    /// `custom_headers:`.
    custom_headers: Option<BTreeMap<String, String>>,
}

/// Keys of the seed's "Auth configuration" table that Belay reads, plus
/// `token` (bearer) and `key` (api_key), which carry the credential.
const AUTH_CONFIG_KEYS: &[&str] = &[
    "token",
    "key",
    "header_name",
    "token_url",
    "client_id",
    "client_secret",
    "scopes",
    "custom_headers",
];

/// Reads an `auth_config:` block for `auth: kind`, which takes the keys in
/// `allowed`.
fn read_auth_config(
    block: &Block,
    kind: &str,
    allowed: &[&'static str],
    out: &mut AuthConfig,
    cx: &mut Cx<'_>,
) {
    let mut seen: BTreeMap<&str, u32> = BTreeMap::new();
    for entry in &block.children {
        let line = &entry.line;
        let Some(kv) = entry_kv(line, "`property: value` in `auth_config:`", cx) else {
            continue;
        };
        if !first_time(
            &mut seen,
            &kv,
            line.no,
            &format!("`{}` in `auth_config:`", kv.key),
            cx,
        ) {
            continue;
        }
        let Some(key) = allowed.iter().find(|k| **k == kv.key).copied() else {
            let message = if kv.key == "provider" {
                "`provider` is not supported: it names an identity provider for `oauth2_user` or `saml`, which Belay does not run".to_owned()
            } else if AUTH_CONFIG_KEYS.contains(&kv.key) {
                let takes: Vec<String> = allowed.iter().map(|k| format!("`{k}`")).collect();
                let takes = if takes.is_empty() {
                    "nothing".to_owned()
                } else {
                    takes.join(", ")
                };
                format!(
                    "`{}` does not apply to `auth: {kind}` (it takes {takes})",
                    kv.key
                )
            } else {
                format!("unknown property `{}` in `auth_config:`", kv.key)
            };
            cx.error(line.no, kv.key_col, message);
            continue;
        };
        if key == "custom_headers" {
            if block_only(entry, &kv, cx) {
                out.custom_headers = Some(read_headers(entry, cx));
                check_header_placeholders(entry, false, cx);
            }
            continue;
        }
        let Some(value) = scalar(entry, &kv, cx) else {
            continue;
        };
        match check_auth_value(key, &value) {
            Some(message) => cx.error(line.no, kv.value_col, message),
            None => {
                out.values.insert(key, value);
            }
        }
    }
}

/// What is wrong with the `auth_config` value `value` of `key`, if anything.
fn check_auth_value(key: &str, value: &str) -> Option<String> {
    let secret = matches!(key, "token" | "key" | "client_secret");
    if secret || key == "client_id" {
        if let Some(message) = check_config_placeholders(value) {
            return Some(format!("`{key}`: {message}"));
        }
        let has_placeholder = split_placeholders(value).is_ok_and(|p| {
            p.iter()
                .any(|p| matches!(p, TemplatePiece::Placeholder { .. }))
        });
        if secret && !has_placeholder {
            return Some(format!(
                "`{key}` must be a `{{{{config.NAME}}}}` placeholder, resolved by the worker: a tools file never holds a credential"
            ));
        }
        if value.chars().any(|c| c == '\r' || c == '\n' || c == '\0') {
            return Some(format!("`{key}` must not contain line breaks or NUL"));
        }
        return None;
    }
    if value.contains("{{") {
        return Some(format!(
            "`{key}` takes no placeholder (only `token`, `key`, `client_id` and `client_secret` do)"
        ));
    }
    match key {
        "header_name" if !is_header_name(value) => {
            Some(format!("`{value}` is not a valid header name"))
        }
        "token_url"
            if !(value.starts_with("https://") || value.starts_with("http://"))
                || value.chars().any(|c| c.is_whitespace() || c.is_control()) =>
        {
            Some(format!(
                "`token_url` must be an absolute http(s) URL, not `{value}`"
            ))
        }
        "scopes"
            if value
                .chars()
                .any(|c| c.is_control() || c == '"' || c == '\\') =>
        {
            Some("`scopes` are scope names separated by spaces".to_owned())
        }
        _ => None,
    }
}

/// RFC 9110 token: the characters of a header name.
fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c))
}

/// What is wrong with a `base_url:`, if anything: an absolute http(s) URL
/// without whitespace, `{` or `}`.
fn check_base_url(url: &str) -> Option<String> {
    if !(url.starts_with("https://") || url.starts_with("http://")) {
        return Some(format!(
            "`base_url` must be an absolute http(s) URL, not `{url}`"
        ));
    }
    if url
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == '{' || c == '}')
    {
        return Some("`base_url` must not contain whitespace, `{` or `}`".to_owned());
    }
    None
}

/// `endpoint` joined to the file's `base_url` when it is a path.
fn join_base_url(base_url: Option<&str>, endpoint: String) -> String {
    match base_url {
        Some(base) if endpoint.starts_with('/') => {
            format!("{}{endpoint}", base.trim_end_matches('/'))
        }
        _ => endpoint,
    }
}

/// The file's default headers under the tool's: a tool header wins over a
/// default of the same name in any case.
fn merge_headers(
    defaults: &BTreeMap<String, String>,
    mut own: BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    for (name, value) in defaults {
        if !own.keys().any(|o| o.eq_ignore_ascii_case(name)) {
            own.insert(name.clone(), value.clone());
        }
    }
    own
}

/// The `type: mcp` rules: `endpoint:` and `method:` do not apply (the
/// worker's configuration says how to reach the server), header values hold
/// only `{{config.NAME}}` placeholders and no header the MCP transport sets
/// itself; `server:` and `server_tool:` belong to `type: mcp` tools only.
fn check_mcp_props(props: &Props<'_>, name: &str, line: &Line, cx: &mut Cx<'_>) {
    if props.binding_type != Some(BindingType::Mcp) {
        for key in ["server", "server_tool", "resource", "sampling"] {
            if props.present.contains(key) {
                // At the property when its place is known, else the tool.
                let (l, c) = match (key, props.sampling, &props.resource) {
                    ("sampling", Some((_, l, c)), _) => (l, c),
                    ("resource", _, Some((_, l, c))) => (*l, *c),
                    _ => (line.no, line.col()),
                };
                cx.error(l, c, format!("`{key}:` applies to `type: mcp` tools only"));
            }
        }
        return;
    }
    if let (Some(_), Some((_, l, c))) = (&props.resource, props.sampling) {
        cx.error(
            l,
            c,
            "`sampling:` applies to calls of a server's tools, not to a `resource:` read (a read cannot ask for a completion)",
        );
    }
    for key in ["endpoint", "method"] {
        if props.present.contains(key) {
            cx.error(
                line.no,
                line.col(),
                format!(
                    "tool `{name}` is `type: mcp`: `{key}:` does not apply (the worker's MCP configuration says how to reach the server)"
                ),
            );
        }
    }
    for header in props.headers.keys() {
        if MCP_RESERVED_HEADERS.contains(&header.to_ascii_lowercase().as_str()) {
            cx.error(
                line.no,
                line.col(),
                format!(
                    "tool `{name}`: header `{header}` is set by the MCP transport itself and cannot be given in `headers:`"
                ),
            );
        }
    }
}

/// Every `{{...}}` in the values of a headers block (`headers:`,
/// `auth_config.custom_headers:`) must be `{{config.NAME}}`, or, with
/// `secrets` (a tool's own `headers:`), `{{_secret.KEY}}`: returned as
/// (KEY, line, column) to check against the tool's `SECRET_ACCESS`.
fn check_header_placeholders(
    block: &Block,
    secrets: bool,
    cx: &mut Cx<'_>,
) -> Vec<(String, u32, u32)> {
    let mut found = Vec::new();
    for header in &block.children {
        let line = &header.line;
        let Some((name, value)) = line.text.split_once(':') else {
            continue;
        };
        let name = name.trim_end();
        let lead = value.chars().take_while(|c| c.is_whitespace()).count();
        let value_col = line
            .col()
            .saturating_add(to_u32(name.chars().count() + 1 + lead));
        let value = value.trim();
        if secrets && let Ok(pieces) = split_placeholders(value) {
            for piece in pieces {
                if let TemplatePiece::Placeholder { inner, at } = piece
                    && let Some(key) = secret_placeholder_name(inner)
                {
                    let col = value_col.saturating_add(to_u32(value[..at].chars().count()));
                    found.push((key.to_owned(), line.no, col));
                }
            }
        }
        let check = if secrets {
            check_header_value(value)
        } else {
            check_config_placeholders(value)
        };
        if let Some(message) = check {
            cx.error(line.no, line.col(), format!("header `{name}`: {message}"));
        }
    }
    found
}

/// [`check_config_placeholders`] for a tool's own `headers:`, where
/// `{{_secret.KEY}}` is allowed too.
fn check_header_value(value: &str) -> Option<String> {
    let Ok(pieces) = split_placeholders(value) else {
        return Some("a `{{` placeholder is not closed with `}}`".into());
    };
    pieces.iter().find_map(|piece| match piece {
        TemplatePiece::Placeholder { inner, .. }
            if config_placeholder_name(inner).is_none()
                && secret_placeholder_name(inner).is_none() =>
        {
            Some(if inner.starts_with("_secret") {
                secrets::bad_key_message(inner)
            } else {
                format!(
                    "placeholder `{{{{{inner}}}}}` is not supported (only `{{{{config.NAME}}}}`, resolved by the worker from its configuration, and `{{{{_secret.KEY}}}}` of a key the tool lists in `SECRET_ACCESS`)"
                )
            })
        }
        _ => None,
    })
}

/// `None` when every `{{...}}` in `value` is `{{config.NAME}}` (NAME of
/// letters, digits, `_`, `-`, `.`), else what is wrong.
fn check_config_placeholders(value: &str) -> Option<String> {
    let Ok(pieces) = split_placeholders(value) else {
        return Some("a `{{` placeholder is not closed with `}}`".into());
    };
    pieces.iter().find_map(|piece| match piece {
        TemplatePiece::Placeholder { inner, .. } if inner.starts_with("_secret") => {
            Some(secrets::misplaced_message(inner, "here"))
        }
        TemplatePiece::Placeholder { inner, .. } if config_placeholder_name(inner).is_none() => {
            Some(format!(
                "placeholder `{{{{{inner}}}}}` is not supported (only `{{{{config.NAME}}}}`, resolved by the worker from its configuration)"
            ))
        }
        _ => None,
    })
}

/// `None` when `value` is a usable `server:` / `server_tool:` name: 1 to
/// [`MAX_MCP_NAME_CHARS`] characters without whitespace, control characters
/// or `/`.
fn check_mcp_name(key: &str, value: &str) -> Option<String> {
    let chars = value.chars().count();
    if chars == 0 || chars > MAX_MCP_NAME_CHARS {
        return Some(format!(
            "`{key}` must be 1 to {MAX_MCP_NAME_CHARS} characters, not {chars}"
        ));
    }
    if value
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == '/')
    {
        return Some(format!(
            "`{key}: {value}` must not contain whitespace, control characters or `/`"
        ));
    }
    None
}

fn read_props<'b>(children: impl Iterator<Item = &'b Block>, cx: &mut Cx<'_>) -> Props<'b> {
    let mut props = Props::default();
    let mut seen: BTreeMap<&str, u32> = BTreeMap::new();
    for child in children {
        let line = &child.line;
        let Some(kv) = split_key(line) else {
            cx.error(
                line.no,
                line.col(),
                format!("expected `property: value`, found `{}`", head(&line.text)),
            );
            continue;
        };
        if kv.optional {
            cx.error(
                line.no,
                kv.key_col,
                format!("unknown property `{}?`", kv.key),
            );
            continue;
        }
        // `body:` is the seed's alias of `body_template:`: one property.
        let key = if kv.key == "body" {
            "body_template"
        } else {
            kv.key
        };
        let what = format!("property `{}`", kv.key);
        if !first_time(&mut seen, &KeyValue { key, ..kv }, line.no, &what, cx) {
            continue;
        }
        props.present.insert(key.to_string());
        match key {
            "base_url" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    match check_base_url(&s) {
                        Some(m) => cx.error(line.no, kv.value_col, m),
                        None => props.base_url = Some((s, line.no, kv.value_col)),
                    }
                }
            }
            "auth" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    props.auth = Some((s, line.no, kv.value_col));
                }
            }
            "auth_config" | "query_params" | "request_variants" => {
                if block_only(child, &kv, cx) {
                    match key {
                        "auth_config" => props.auth_config = Some(child),
                        "query_params" => props.query_params = Some(child),
                        _ => props.request_variants = Some(child),
                    }
                }
            }
            "body_type" => {
                let choices = [
                    ("json", BodyType::Json),
                    ("form", BodyType::Form),
                    ("xml", BodyType::Xml),
                    ("text", BodyType::Text),
                ];
                if let Some(t) = keyword(child, &kv, &choices, cx) {
                    props.body_type = Some((t, line.no, kv.value_col));
                }
            }
            "xml_root" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    if is_xml_name(&s) {
                        props.xml_root = Some((s, line.no, kv.value_col));
                    } else {
                        cx.error(
                            line.no,
                            kv.value_col,
                            format!("`xml_root` must be an XML element name (a letter or `_`, then letters, digits, `_`, `-`, `.`), not `{s}`"),
                        );
                    }
                }
            }
            "body_schema" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    let col = kv.value_col + u32::from(is_quoted(kv.value));
                    match serde_json::from_str::<Value>(&s) {
                        Err(e) => cx.error(
                            line.no,
                            col,
                            format!("`body_schema` is not JSON ({e}); write the JSON Schema on one line, in single quotes"),
                        ),
                        Ok(schema) if !schema.is_object() => cx.error(
                            line.no,
                            col,
                            "`body_schema` must be a JSON Schema object, like `{\"type\": \"object\"}`",
                        ),
                        Ok(schema) => match super::schema::compile(&schema) {
                            Err(e) => cx.error(
                                line.no,
                                col,
                                format!("`body_schema` is not a valid JSON Schema: {e}"),
                            ),
                            Ok(_) => props.body_schema = Some((schema, line.no, col)),
                        },
                    }
                }
            }
            "use_body_schema" => {
                let choices = [("true", true), ("false", false)];
                if let Some(b) = keyword(child, &kv, &choices, cx) {
                    props.use_body_schema = Some((b, line.no, kv.value_col));
                }
            }
            "tls_profile" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    let ok = !s.is_empty()
                        && s.chars().count() <= MAX_TLS_PROFILE_CHARS
                        && s.chars()
                            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
                    if ok {
                        props.tls_profile = Some(s);
                    } else {
                        cx.error(
                            line.no,
                            kv.value_col,
                            format!("`tls_profile` must be the name of a profile of the worker's configuration: 1 to {MAX_TLS_PROFILE_CHARS} letters, digits, `_`, `-` or `.`, not `{s}`"),
                        );
                    }
                }
            }
            "body_mode" => {
                let choices = [("auto", BodyMode::Auto), ("none", BodyMode::None)];
                props.body_mode = keyword(child, &kv, &choices, cx).or(props.body_mode);
            }
            "retry" | "retry_delay" | "retry_policy" => {
                retry::read_prop(child, &kv, &mut props.retry, cx);
            }
            "body_template" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    let col = kv.value_col + u32::from(is_quoted(kv.value));
                    props.body_template = Some((s, line.no, col));
                }
            }
            "description" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    props.description = Some(s);
                }
            }
            "type" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    if s == "http" {
                        props.binding_type = Some(BindingType::Http);
                    } else if s == "workflow" {
                        props.binding_type = Some(BindingType::Workflow);
                    } else if s == "async_webhook" {
                        props.binding_type = Some(BindingType::AsyncWebhook);
                    } else if s == "mcp" {
                        props.binding_type = Some(BindingType::Mcp);
                    } else if s == "sandbox" {
                        props.binding_type = Some(BindingType::Sandbox);
                    } else {
                        props.binding_type = Some(BindingType::Unsupported);
                        let message = if SEED_BINDING_TYPES.contains(&s.as_str()) {
                            format!("binding type `{s}` is not supported yet")
                        } else {
                            format!(
                                "unknown binding type `{s}` (expected `http`, `workflow`, `async_webhook`, `mcp` or `sandbox`)"
                            )
                        };
                        cx.error(line.no, kv.value_col, message);
                    }
                }
            }
            "endpoint" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    // Point at the text inside the quotes.
                    let col = kv.value_col + u32::from(is_quoted(kv.value));
                    if let Some((inner, at)) = secrets::first_secret_placeholder(&s) {
                        let col = col.saturating_add(to_u32(s[..at].chars().count()));
                        cx.error(
                            line.no,
                            col,
                            secrets::misplaced_message(inner, "`endpoint`"),
                        );
                    } else if let Some(message) = check_endpoint(&s) {
                        cx.error(line.no, kv.value_col, message);
                    } else {
                        props.endpoint = Some((s, line.no, col));
                    }
                }
            }
            "method" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    let upper = s.to_ascii_uppercase();
                    if ["GET", "POST", "PUT", "PATCH", "DELETE"].contains(&upper.as_str()) {
                        props.method = Some(upper);
                        props.method_at = (line.no, kv.value_col);
                    } else {
                        cx.error(
                            line.no,
                            kv.value_col,
                            format!(
                                "unknown method `{s}` (expected GET, POST, PUT, PATCH or DELETE)"
                            ),
                        );
                    }
                }
            }
            "timeout" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    match parse_timeout(&s) {
                        Ok(ms) => props.timeout_ms = Some(ms),
                        Err(m) => cx.error(line.no, kv.value_col, m),
                    }
                }
            }
            "permission" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    match check_permission("permission", &s) {
                        Some(m) => cx.error(line.no, kv.value_col, m),
                        None => props.permission = Some(s),
                    }
                }
            }
            "repeat_safety" => {
                let choices = [
                    ("never", RepeatSafety::Never),
                    ("idempotent", RepeatSafety::Idempotent),
                    ("reconcile", RepeatSafety::Reconcile),
                ];
                props.repeat_safety = keyword(child, &kv, &choices, cx).or(props.repeat_safety);
            }
            "reconcile_with" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    match check_name("tool", &s) {
                        Some(m) => cx.error(line.no, kv.value_col, m),
                        None => {
                            props.reconcile_with = Some(NameAt {
                                name: s,
                                line: line.no,
                                column: kv.value_col,
                            })
                        }
                    }
                }
            }
            "strict" => {
                if keyword(child, &kv, &[("true", true), ("false", false)], cx) == Some(true) {
                    props.strict = Some((line.no, kv.value_col));
                }
            }
            "pii_access" => {
                if let Some(s) = scalar(child, &kv, cx)
                    && let Some(access) = pii::read_pii_access(&s, line.no, kv.value_col, cx)
                {
                    props.pii_access = Some((access, line.no, kv.value_col));
                }
            }
            "scrub_secrets" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    match s.as_str() {
                        "true" => props.scrub_secrets = None,
                        "false" => props.scrub_secrets = Some(false),
                        other => cx.error(
                            line.no,
                            kv.value_col,
                            format!("`scrub_secrets:` must be `true` or `false`, found `{other}`"),
                        ),
                    }
                }
            }
            "headers" => {
                if block_only(child, &kv, cx) {
                    props.headers = read_headers(child, cx);
                    props.header_secrets = check_header_placeholders(child, true, cx);
                }
            }
            "RESULT_SECRETS" | "SECRET_ACCESS" => {
                if block_only(child, &kv, cx) {
                    if key == "RESULT_SECRETS" {
                        props.result_secrets = Some(child);
                    } else {
                        props.secret_access = Some(child);
                    }
                }
            }
            "resource" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    props.resource = Some((s, line.no, kv.value_col));
                }
            }
            "server" | "server_tool" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    match check_mcp_name(kv.key, &s) {
                        Some(m) => cx.error(line.no, kv.value_col, m),
                        None if kv.key == "server" => props.server = Some(s),
                        None => props.server_tool = Some(s),
                    }
                }
            }
            "parameters" => {
                if block_only(child, &kv, cx) {
                    props.parameters = Some(child);
                }
            }
            "workflow_id" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    match check_name("workflow", &s) {
                        Some(m) => cx.error(line.no, kv.value_col, m),
                        None => {
                            props.workflow_id = Some(NameAt {
                                name: s,
                                line: line.no,
                                column: kv.value_col,
                            })
                        }
                    }
                }
            }
            "mode" => {
                let choices = [("sync", ChildMode::Sync), ("async", ChildMode::Async)];
                props.mode = keyword(child, &kv, &choices, cx).or(props.mode);
            }
            "timeout_ms" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    let config = s
                        .trim()
                        .strip_prefix("{{")
                        .and_then(|r| r.strip_suffix("}}"))
                        .and_then(|inner| belay_proto::wire::config_placeholder_name(inner.trim()));
                    match (config, s.parse::<u64>()) {
                        (Some(name), _) => {
                            props.workflow_timeout_config =
                                Some((name.to_owned(), line.no, kv.value_col));
                        }
                        (None, Ok(ms)) if (1..=MAX_TIMER_MS).contains(&ms) => {
                            props.workflow_timeout_ms = Some(ms)
                        }
                        (None, Ok(ms)) if ms > MAX_TIMER_MS => cx.error(
                            line.no,
                            kv.value_col,
                            format!(
                                "`timeout_ms` is longer than 10 years ({MAX_TIMER_MS} ms), the longest a durable timer may wait, not `{ms}`"
                            ),
                        ),
                        _ => cx.error(
                            line.no,
                            kv.value_col,
                            format!(
                                "`timeout_ms` must be a whole number of ms, at least 1, or `{{{{config.NAME}}}}`, not `{s}`"
                            ),
                        ),
                    }
                }
            }
            "confirmation" => {
                if block_only(child, &kv, cx) {
                    props.confirmation = read_confirmation(child, cx);
                }
            }
            "rate_limit" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    match parse_rate_limit(&s) {
                        Ok(rate) => props.rate_limit = Some(rate),
                        Err(m) => cx.error(line.no, kv.value_col, m),
                    }
                }
            }
            "circuit_breaker" => {
                props.circuit_breaker = read_circuit_breaker(child, &kv, cx);
            }
            "compaction" => {
                if block_only(child, &kv, cx) {
                    props.compaction = read_compaction(child, cx);
                }
            }
            "process" => {
                if block_only(child, &kv, cx) {
                    props.process = process::read_process(child, cx);
                }
            }
            "on_result" | "on_error" => {
                if block_only(child, &kv, cx) {
                    let set = read_on_outcome(child, kv.key, cx);
                    if kv.key == "on_result" {
                        props.on_result = set;
                    } else {
                        props.on_error = set;
                    }
                }
            }
            "hints" => {
                if block_only(child, &kv, cx) {
                    (props.hints, props.hint_at) = read_hints(child, cx);
                }
            }
            "effect" => {
                let choices = [
                    ("read_only", Effect::ReadOnly),
                    ("state_write", Effect::StateWrite),
                    ("side_effect", Effect::SideEffect),
                ];
                if let Some(e) = keyword(child, &kv, &choices, cx) {
                    props.effect = Some((e, line.no, kv.value_col));
                }
            }
            "callback_url_field" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    let valid = !s.is_empty()
                        && s.split('.').all(|seg| {
                            !seg.is_empty()
                                && seg
                                    .chars()
                                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
                        });
                    if valid {
                        props.callback_url_field = Some((s, line.no, kv.value_col));
                    } else {
                        cx.error(
                            line.no,
                            kv.value_col,
                            format!(
                                "`callback_url_field` must be a dot-path of field names (letters, digits, `_`, `-`), like `callbackUrl` or `meta.reply_to`, not `{s}`"
                            ),
                        );
                    }
                }
            }
            "timeout_seconds" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    match s.parse::<u64>() {
                        Ok(n) if (1..=MAX_CALLBACK_TIMEOUT_SECONDS).contains(&n) => {
                            props.callback_timeout_seconds = Some(n)
                        }
                        _ => cx.error(
                            line.no,
                            kv.value_col,
                            format!(
                                "`timeout_seconds` must be a whole number of seconds from 1 to {MAX_CALLBACK_TIMEOUT_SECONDS} (30 days), not `{s}`"
                            ),
                        ),
                    }
                }
            }
            "runtime" | "code" | "memory_mb" => {
                sandbox::read_prop(child, &kv, &mut props.sandbox, cx);
            }
            "sampling" => {
                props.sampling =
                    sampling::read(child, &kv, cx).map(|def| (def, line.no, kv.key_col));
            }
            "param_mapping" => {
                if block_only(child, &kv, cx) {
                    for entry in &child.children {
                        let Some(m) = split_key(&entry.line) else {
                            cx.error(
                                entry.line.no,
                                entry.line.col(),
                                "expected `workflow_input_key: tool_parameter`",
                            );
                            continue;
                        };
                        match parse_scalar(m.value, m.value_col) {
                            Ok(param) if !param.is_empty() => {
                                props.param_mapping.insert(m.key.to_owned(), param);
                            }
                            _ => cx.error(
                                entry.line.no,
                                m.value_col,
                                format!("`{}` needs the name of a tool parameter", m.key),
                            ),
                        }
                    }
                }
            }
            other => {
                let message = if SEED_TOOL_PROPERTIES.contains(&other) || other.starts_with("wsdl_")
                {
                    format!("property `{other}` is not supported yet")
                } else {
                    format!("unknown property `{other}`")
                };
                cx.error(line.no, kv.key_col, message);
            }
        }
    }
    props
}

/// The `key: value` of `line` (no `key?:`); else the error "expected
/// {expected}, found `…`".
fn entry_kv<'l>(line: &'l Line, expected: &str, cx: &mut Cx<'_>) -> Option<KeyValue<'l>> {
    let kv = split_key(line).filter(|kv| !kv.optional);
    if kv.is_none() {
        cx.error(
            line.no,
            line.col(),
            format!("expected {expected}, found `{}`", head(&line.text)),
        );
    }
    kv
}

/// A one-line value that is one of `choices`; else an error "unknown KEY
/// `value` (expected `a` or `b`)" at the value.
fn keyword<T: Copy>(
    block: &Block,
    kv: &KeyValue<'_>,
    choices: &[(&str, T)],
    cx: &mut Cx<'_>,
) -> Option<T> {
    let s = scalar(block, kv, cx)?;
    if let Some((_, value)) = choices.iter().find(|(name, _)| *name == s) {
        return Some(*value);
    }
    let names: Vec<String> = choices.iter().map(|(n, _)| format!("`{n}`")).collect();
    let expected = match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => names.join(""),
    };
    cx.error(
        block.line.no,
        kv.value_col,
        format!("unknown {} `{s}` (expected {expected})", kv.key),
    );
    None
}

/// Records that `kv.key` was written on `line`; `false`, with the error
/// "duplicate {what} (first on line N)" at the key, if it was already.
fn first_time<'k>(
    seen: &mut BTreeMap<&'k str, u32>,
    kv: &KeyValue<'k>,
    line: u32,
    what: &str,
    cx: &mut Cx<'_>,
) -> bool {
    match seen.insert(kv.key, line) {
        None => true,
        Some(first) => {
            cx.error(
                line,
                kv.key_col,
                format!("duplicate {what} (first on line {first})"),
            );
            false
        }
    }
}

/// The value of a one-line property; `None` (with an error) otherwise.
fn scalar(block: &Block, kv: &KeyValue<'_>, cx: &mut Cx<'_>) -> Option<String> {
    let line = &block.line;
    if let Some(first) = block.children.first() {
        cx.error(
            first.line.no,
            first.line.col(),
            format!(
                "`{}` takes a value on its own line, not an indented block",
                kv.key
            ),
        );
        return None;
    }
    if kv.value.is_empty() {
        cx.error(line.no, kv.key_col, format!("`{}` needs a value", kv.key));
        return None;
    }
    match parse_scalar(kv.value, kv.value_col) {
        Ok(s) => Some(s),
        Err((col, m)) => {
            cx.error(line.no, col, m);
            None
        }
    }
}

/// A `confirmation:` block that asks for a person's decision.
struct ConfirmationProps {
    /// `immutable_params:`, each with the line and column of the list.
    immutable: Vec<(String, u32, u32)>,
    /// `approver_grant:`.
    grant: Option<String>,
    /// `require: when_side_effects` (else `always`).
    when_side_effects: bool,
}

/// The `confirmation:` block: `require: always | never | when_side_effects`
/// (the `consent_*` properties are not supported: refused, not ignored),
/// `immutable_params: [a, b]`, `approver_grant: perm`. `None` for `never`.
fn read_confirmation(block: &Block, cx: &mut Cx<'_>) -> Option<ConfirmationProps> {
    let mut require: Option<String> = None;
    let mut immutable = Vec::new();
    let mut grant = None;
    for entry in &block.children {
        let line = &entry.line;
        let Some(kv) = split_key(line) else {
            cx.error(
                line.no,
                line.col(),
                "expected `property: value` in `confirmation:`",
            );
            continue;
        };
        match kv.key {
            "require" => {
                let Some(v) = scalar(entry, &kv, cx) else { continue };
                match v.as_str() {
                    "always" | "never" | "when_side_effects" => require = Some(v),
                    other => cx.error(
                        line.no,
                        kv.value_col,
                        format!("unknown `require: {other}` (expected `always`, `never` or `when_side_effects`)"),
                    ),
                }
            }
            "immutable_params" => {
                let text = kv.value.trim();
                let Some(inner) = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')) else {
                    cx.error(
                        line.no,
                        kv.value_col,
                        "`immutable_params` takes a list of parameter names, like `[recipient, amount]`",
                    );
                    continue;
                };
                for item in inner.split(',').map(str::trim).filter(|i| !i.is_empty()) {
                    let name = item.trim_matches(|c| c == '"' || c == '\'');
                    immutable.push((name.to_owned(), line.no, kv.value_col));
                }
            }
            "approver_grant" => {
                if let Some(v) = scalar(entry, &kv, cx) {
                    match check_permission("approver_grant", &v) {
                        Some(m) => cx.error(line.no, kv.value_col, m),
                        None => grant = Some(v),
                    }
                }
            }
            key if key.starts_with("consent_") => cx.error(
                line.no,
                kv.key_col,
                format!("`{key}` is not supported yet: Belay asks an approver, not the end user in a conversation"),
            ),
            other => cx.error(
                line.no,
                kv.key_col,
                format!("unknown property `{other}` in `confirmation:` (expected `require`, `immutable_params`, `approver_grant`)"),
            ),
        }
    }
    match require.as_deref() {
        Some(r @ ("always" | "when_side_effects")) => Some(ConfirmationProps {
            immutable,
            grant,
            when_side_effects: r == "when_side_effects",
        }),
        Some(_) => None,
        None => {
            cx.error(
                block.line.no,
                block.line.col(),
                "`confirmation:` needs `require: always`, `require: never` or `require: when_side_effects`",
            );
            None
        }
    }
}

/// `rate_limit:`: calls per second, a decimal number more than 0 and at
/// most [`MAX_RATE_LIMIT`] (`2`, `0.5`: one call every 2 s).
fn parse_rate_limit(s: &str) -> Result<f64, String> {
    let digits = |t: &str| !t.is_empty() && t.chars().all(|c| c.is_ascii_digit());
    let decimal = match s.split_once('.') {
        Some((whole, fraction)) => digits(whole) && digits(fraction),
        None => digits(s),
    };
    match s.parse::<f64>() {
        Ok(rate)
            if decimal
                && rate > 0.0
                && rate <= MAX_RATE_LIMIT
                && 1000.0 / rate <= crate::model::MAX_INTERVAL_MS as f64 =>
        {
            Ok(rate)
        }
        _ => Err(format!(
            "`rate_limit` must be a number of calls per second, at least one call a day (0.0000116) and at most {MAX_RATE_LIMIT} (like `10` or `0.5`), not `{s}`"
        )),
    }
}

/// `circuit_breaker:` as a block (`threshold:` and `resetMs:` on their own
/// lines) or inline (`{threshold: 5, resetMs: 30000}`). `reset_ms` is
/// accepted for `resetMs`. `None`, with errors, unless both are valid.
fn read_circuit_breaker(
    block: &Block,
    kv: &KeyValue<'_>,
    cx: &mut Cx<'_>,
) -> Option<CircuitBreakerDef> {
    let line = &block.line;
    // (key, value, line, key column, value column) of each entry.
    let mut entries: Vec<(String, String, u32, u32, u32)> = Vec::new();
    if kv.value.is_empty() {
        for entry in &block.children {
            let Some(e) = entry_kv(&entry.line, "`threshold: N` or `resetMs: MS`", cx) else {
                continue;
            };
            if let Some(value) = scalar(entry, &e, cx) {
                entries.push((
                    e.key.to_owned(),
                    value,
                    entry.line.no,
                    e.key_col,
                    e.value_col,
                ));
            }
        }
    } else {
        let Some(inner) = kv.value.strip_prefix('{').and_then(|v| v.strip_suffix('}')) else {
            cx.error(
                line.no,
                kv.value_col,
                "`circuit_breaker` takes `{threshold: N, resetMs: MS}`, or `threshold:` and `resetMs:` on indented lines",
            );
            return None;
        };
        if let Some(first) = block.children.first() {
            cx.error(
                first.line.no,
                first.line.col(),
                "`circuit_breaker` takes `{threshold: N, resetMs: MS}` or indented lines, not both",
            );
            return None;
        }
        let leading = |t: &str| t.chars().take_while(|c| c.is_whitespace()).count();
        // Chars of the value before the item (the `{` at first).
        let mut offset = 1;
        for item in inner.split(',') {
            let col = kv.value_col + to_u32(offset + leading(item));
            offset += item.chars().count() + 1;
            let Some((key, value)) = item.split_once(':') else {
                cx.error(line.no, col, "expected `threshold: N` or `resetMs: MS`");
                continue;
            };
            let key_chars = key.trim_start().chars().count();
            let value_col = col + to_u32(key_chars + 1 + leading(value));
            entries.push((
                key.trim().to_owned(),
                value.trim().to_owned(),
                line.no,
                col,
                value_col,
            ));
        }
    }
    let mut threshold = None;
    let mut reset_ms = None;
    let mut seen: BTreeMap<&'static str, u32> = BTreeMap::new();
    for (key, value, eline, key_col, value_col) in &entries {
        let name = match key.as_str() {
            "threshold" => "threshold",
            "resetMs" | "reset_ms" => "resetMs",
            other => {
                cx.error(
                    *eline,
                    *key_col,
                    format!("unknown property `{other}` in `circuit_breaker:` (expected `threshold`, `resetMs`)"),
                );
                continue;
            }
        };
        if let Some(first) = seen.insert(name, *eline) {
            cx.error(
                *eline,
                *key_col,
                format!("duplicate `{name}` in `circuit_breaker:` (first on line {first})"),
            );
            continue;
        }
        let parsed = value.parse::<u64>().ok();
        match (name, parsed) {
            ("threshold", Some(n)) if n >= 1 && n <= u64::from(u32::MAX) => {
                threshold = u32::try_from(n).ok();
            }
            ("threshold", _) => cx.error(
                *eline,
                *value_col,
                format!("`threshold` must be a whole number of consecutive failures, at least 1, not `{value}`"),
            ),
            (_, Some(ms)) if (1..=MAX_RESET_MS).contains(&ms) => reset_ms = Some(ms),
            _ => cx.error(
                *eline,
                *value_col,
                format!("`resetMs` must be a whole number of ms from 1 to {MAX_RESET_MS} (30 days), not `{value}`"),
            ),
        }
    }
    for (name, what) in [
        ("threshold", "consecutive failures that open the circuit"),
        ("resetMs", "ms an open circuit waits before a probe call"),
    ] {
        if !seen.contains_key(name) {
            cx.error(
                line.no,
                kv.key_col,
                format!("`circuit_breaker:` needs `{name}:` ({what})"),
            );
        }
    }
    Some(CircuitBreakerDef {
        threshold: threshold?,
        reset_ms: reset_ms?,
    })
}

/// The `compaction:` block: `essential_fields: [a, b.c]` (or one path per
/// `- item` line). The seed's other properties are refused.
/// Most paths one `compaction.essential_fields` may list: selecting costs
/// (keys of the result) × (paths) inside a run's transition, so the count
/// is bounded.
const MAX_ESSENTIAL_FIELDS: usize = 64;

/// Most variables one `on_result.set:` or `on_error.set:` may set: each is
/// an evaluation over the whole result inside a run's transition, and its
/// value is recorded in the `tool_vars_set` event.
const MAX_OUTCOME_VARS: usize = 16;

fn read_compaction(block: &Block, cx: &mut Cx<'_>) -> Option<CompactionDef> {
    let errors_before = cx.out.errors.len();
    let mut fields: Option<Vec<String>> = None;
    let mut max_len: Option<u32> = None;
    for entry in &block.children {
        let line = &entry.line;
        let Some(kv) = entry_kv(line, "`essential_fields: [path, ...]` in `compaction:`", cx)
        else {
            continue;
        };
        match kv.key {
            "essential_fields" => {
                if fields.is_some() {
                    cx.error(line.no, kv.key_col, "duplicate `essential_fields` in `compaction:`");
                    continue;
                }
                fields = read_field_paths(entry, &kv, cx);
                if let Some(f) = &fields
                    && f.len() > MAX_ESSENTIAL_FIELDS
                {
                    cx.error(
                        line.no,
                        kv.key_col,
                        format!(
                            "`essential_fields` lists {} paths, more than the limit of {MAX_ESSENTIAL_FIELDS}",
                            f.len()
                        ),
                    );
                    fields = None;
                }
            }
            "max_description_length" => {
                if max_len.is_some() {
                    cx.error(
                        line.no,
                        kv.key_col,
                        "duplicate `max_description_length` in `compaction:`",
                    );
                    continue;
                }
                if let Some(s) = scalar(entry, &kv, cx) {
                    match s.parse::<u32>() {
                        Ok(n) if n >= 1 => max_len = Some(n),
                        _ => cx.error(
                            line.no,
                            kv.value_col,
                            format!(
                                "`max_description_length` must be a whole number of characters, at least 1, not `{s}`"
                            ),
                        ),
                    }
                }
            }
            "summary_timeout_ms" => cx.error(
                line.no,
                kv.key_col,
                "`compaction.summary_timeout_ms` is not applicable: Belay never summarises a result with a model (what the model sees is cut by `essential_fields`, `max_description_length` and `max_result_bytes`, deterministically)",
            ),
            "max_search_tokens" => cx.error(
                line.no,
                kv.key_col,
                "`compaction.max_search_tokens` is not applicable: it applies to SearchAI results, and Belay has no SearchAI tools",
            ),
            other => cx.error(
                line.no,
                kv.key_col,
                format!(
                    "unknown property `{other}` in `compaction:` (expected `essential_fields` or `max_description_length`)"
                ),
            ),
        }
    }
    if cx.out.errors.len() != errors_before {
        return None;
    }
    if fields.is_none() && max_len.is_none() {
        cx.error(
            block.line.no,
            block.line.col(),
            "`compaction:` needs `essential_fields: [path, ...]` or `max_description_length: N`",
        );
        return None;
    }
    Some(CompactionDef {
        essential_fields: fields.unwrap_or_default(),
        max_description_length: max_len,
    })
}

/// `essential_fields:` as `[a, b.c]` or as `- a` lines: dotted paths, each
/// segment non-empty; at least one. `None`, with errors, when one is bad.
fn read_field_paths(block: &Block, kv: &KeyValue<'_>, cx: &mut Cx<'_>) -> Option<Vec<String>> {
    let line = &block.line;
    // (item, line, column) of each path as written.
    let mut items: Vec<(String, u32, u32)> = Vec::new();
    if kv.value.is_empty() {
        for entry in &block.children {
            let text = entry.line.text.as_str();
            let Some(item) = text.strip_prefix('-') else {
                cx.error(
                    entry.line.no,
                    entry.line.col(),
                    "expected `- path` in `essential_fields:`",
                );
                continue;
            };
            let lead = item.chars().take_while(|c| c.is_whitespace()).count();
            items.push((
                item.trim().to_owned(),
                entry.line.no,
                entry.line.col() + to_u32(1 + lead),
            ));
        }
    } else {
        let Some(inner) = kv.value.strip_prefix('[').and_then(|v| v.strip_suffix(']')) else {
            cx.error(
                line.no,
                kv.value_col,
                "`essential_fields` takes a list of dotted paths, like `[items.id, items.name]`",
            );
            return None;
        };
        if let Some(first) = block.children.first() {
            cx.error(
                first.line.no,
                first.line.col(),
                "`essential_fields` takes `[a, b]` or `- a` lines, not both",
            );
            return None;
        }
        let mut offset = 1;
        for item in inner.split(',') {
            let lead = item.chars().take_while(|c| c.is_whitespace()).count();
            let col = kv.value_col + to_u32(offset + lead);
            offset += item.chars().count() + 1;
            if item.trim().is_empty() && inner.trim().is_empty() {
                continue;
            }
            items.push((item.trim().to_owned(), line.no, col));
        }
    }
    let mut paths = Vec::new();
    let mut ok = true;
    for (item, no, col) in items {
        let path = item.trim_matches(|c| c == '"' || c == '\'');
        if path.is_empty() {
            cx.error(no, col, "empty item in `essential_fields`");
            ok = false;
        } else if path.split('.').any(str::is_empty) {
            cx.error(
                no,
                col,
                format!("`{item}` is not a field path: write names joined by `.`, like `items.id`"),
            );
            ok = false;
        } else if path.chars().any(|c| c.is_whitespace() || c.is_control()) {
            cx.error(
                no,
                col,
                format!("field path `{path}` must not contain spaces"),
            );
            ok = false;
        } else if !paths.iter().any(|p| p == path) {
            paths.push(path.to_owned());
        }
    }
    if ok && paths.is_empty() {
        cx.error(
            line.no,
            kv.value_col.max(kv.key_col),
            "`essential_fields` needs at least one field path",
        );
        return None;
    }
    ok.then_some(paths)
}

/// The `on_result:` or `on_error:` block: `set:` with one `var: <jq>` line
/// per run variable. `do:` action blocks are refused.
fn read_on_outcome(block: &Block, what: &str, cx: &mut Cx<'_>) -> BTreeMap<String, Expr> {
    let mut set = BTreeMap::new();
    let input = if what == "on_result" {
        "`{\"result\": <the result>}`, like `.result.balance`"
    } else {
        "`{\"error\": {\"message\": <why>}}`, like `.error.message`"
    };
    for entry in &block.children {
        let line = &entry.line;
        let Some(kv) = entry_kv(line, &format!("`set:` in `{what}:`"), cx) else {
            continue;
        };
        match kv.key {
            "set" => {
                if !block_only(entry, &kv, cx) {
                    continue;
                }
                for item in &entry.children {
                    let Some(v) = entry_kv(&item.line, "`variable: <jq expression>`", cx) else {
                        continue;
                    };
                    let name_ok = v.key.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                        && v.key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                    if !name_ok {
                        cx.error(
                            item.line.no,
                            v.key_col,
                            format!("variable name `{}` must be letters, digits and `_`, not starting with a digit", v.key),
                        );
                        continue;
                    }
                    if set.contains_key(v.key) {
                        cx.error(
                            item.line.no,
                            v.key_col,
                            format!("duplicate variable `{}` in `{what}.set:`", v.key),
                        );
                        continue;
                    }
                    if set.len() >= MAX_OUTCOME_VARS {
                        cx.error(
                            item.line.no,
                            v.key_col,
                            format!(
                                "`{what}.set:` sets more than {MAX_OUTCOME_VARS} variables; keep one variable holding an object instead"
                            ),
                        );
                        continue;
                    }
                    let Some(text) = scalar(item, &v, cx) else {
                        continue;
                    };
                    if text.trim().is_empty() {
                        cx.error(
                            item.line.no,
                            v.value_col,
                            format!("`{}` needs a jq expression over {input}", v.key),
                        );
                        continue;
                    }
                    match Expr::parse(&text) {
                        Ok(e) => {
                            set.insert(v.key.to_owned(), e);
                        }
                        Err(e) => {
                            let hint = if text.starts_with("result") || text.starts_with("error") {
                                "; the expression is jq over {\"result\": ...} or {\"error\": ...}: write `.result.balance`, with the leading `.`"
                            } else {
                                ""
                            };
                            cx.error(
                                item.line.no,
                                v.value_col,
                                format!("`{}` is not a valid jq expression: {e}{hint}", v.key),
                            );
                        }
                    }
                }
            }
            "do" => cx.error(
                line.no,
                kv.key_col,
                format!("`{what}.do:` action blocks are not applicable: they are actions of a conversational runtime; in Belay, control flow is the workflow graph (`next`, `branch`, `on_error`)"),
            ),
            other => cx.error(
                line.no,
                kv.key_col,
                format!("unknown property `{other}` in `{what}:` (expected `set`)"),
            ),
        }
    }
    set
}

/// The `hints:` block: `cacheable`, `side_effects`, `requires_auth`
/// (`true`/`false`), `latency` (`fast`, `medium`, `slow`), `timeout` (a
/// duration, as `timeout:`; a bare number is ms), `cache_ttl` (a Belay
/// extension: `cache::parse_ttl`); with where `cacheable` and `cache_ttl`
/// were written, for `cache::check`.
fn read_hints(block: &Block, cx: &mut Cx<'_>) -> (ToolHints, BTreeMap<&'static str, (u32, u32)>) {
    let mut hints = ToolHints::default();
    let mut at = BTreeMap::new();
    let mut seen: BTreeMap<&str, u32> = BTreeMap::new();
    for entry in &block.children {
        let line = &entry.line;
        let Some(kv) = entry_kv(line, "`hint: value` in `hints:`", cx) else {
            continue;
        };
        if !first_time(&mut seen, &kv, line.no, &format!("hint `{}`", kv.key), cx) {
            continue;
        }
        for known in ["cacheable", "cache_ttl"] {
            if kv.key == known {
                at.insert(known, (line.no, kv.value_col));
            }
        }
        let flag = |cx: &mut Cx<'_>| keyword(entry, &kv, &[("true", true), ("false", false)], cx);
        match kv.key {
            "cacheable" => hints.cacheable = flag(cx),
            "side_effects" => hints.side_effects = flag(cx),
            "requires_auth" => hints.requires_auth = flag(cx),
            "latency" => {
                let choices = [
                    ("fast", Latency::Fast),
                    ("medium", Latency::Medium),
                    ("slow", Latency::Slow),
                ];
                hints.latency = keyword(entry, &kv, &choices, cx);
            }
            "timeout" => {
                if let Some(s) = scalar(entry, &kv, cx) {
                    match parse_timeout(&s) {
                        Ok(ms) => hints.timeout_ms = Some(ms),
                        Err(m) => cx.error(line.no, kv.value_col, m),
                    }
                }
            }
            "cache_ttl" => {
                if let Some(s) = scalar(entry, &kv, cx) {
                    match cache::parse_ttl(&s) {
                        Ok(ms) => hints.cache_ttl_ms = Some(ms),
                        Err(m) => cx.error(line.no, kv.value_col, m),
                    }
                }
            }
            other => cx.error(
                line.no,
                kv.key_col,
                format!("unknown hint `{other}` (expected `cacheable`, `cache_ttl`, `latency`, `side_effects`, `requires_auth` or `timeout`)"),
            ),
        }
    }
    (hints, at)
}

/// `effect:` and `hints.side_effects` must agree: `read_only` with
/// `side_effects: true`, or a writing effect with `side_effects: false`,
/// is a contradiction the author has to settle.
fn check_side_effect_hints(props: &Props<'_>, cx: &mut Cx<'_>) {
    if let (Some((effect, line, col)), Some(side_effects)) =
        (props.effect, props.hints.side_effects)
        && (effect == Effect::ReadOnly) == side_effects
    {
        let written = match effect {
            Effect::ReadOnly => "read_only",
            Effect::StateWrite => "state_write",
            Effect::SideEffect => "side_effect",
        };
        cx.error(
            line,
            col,
            format!("`effect: {written}` contradicts `hints.side_effects: {side_effects}`; keep one of them"),
        );
    }
}

/// Whether a block property (`headers:`, `parameters:`) has no inline value.
fn block_only(block: &Block, kv: &KeyValue<'_>, cx: &mut Cx<'_>) -> bool {
    if kv.value.is_empty() {
        return true;
    }
    cx.error(
        block.line.no,
        kv.value_col,
        format!(
            "`{}` takes an indented block on the following lines, not a value",
            kv.key
        ),
    );
    false
}

fn check_endpoint(endpoint: &str) -> Option<String> {
    if !(endpoint.starts_with('/')
        || endpoint.starts_with("https://")
        || endpoint.starts_with("http://"))
    {
        return Some(format!(
            "endpoint `{endpoint}` must be a path starting with `/` or an http(s) URL"
        ));
    }
    if endpoint
        .chars()
        .any(|c| c.is_whitespace() || c.is_control())
    {
        return Some("endpoint must not contain whitespace".to_string());
    }
    None
}

/// `30s`, `500ms`, `2m`, or a bare number, which the seed defines as
/// milliseconds (`timeout: 10000` in "HTTP tools"). Returns ms.
fn parse_timeout(s: &str) -> Result<u64, String> {
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(digits_end);
    let factor = match unit {
        "" | "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        _ => 0,
    };
    let Ok(n) = number.parse::<u64>() else {
        return Err(format!(
            "timeout `{s}` is not a duration (write e.g. `30s`, `500ms`, `2m`, or a number of milliseconds)"
        ));
    };
    if factor == 0 && unit.chars().all(|c| c.is_ascii_alphabetic()) {
        return Err(format!(
            "timeout `{s}` has an unknown unit (use `ms`, `s` or `m`)"
        ));
    }
    if factor == 0 {
        return Err(format!(
            "timeout `{s}` is not a duration (write e.g. `30s`, `500ms`, `2m`, or a number of milliseconds)"
        ));
    }
    match n.checked_mul(factor) {
        Some(0) => Err("timeout must be more than 0".to_string()),
        Some(ms) => Ok(ms),
        None => Err(format!("timeout `{s}` is too large")),
    }
}

fn read_headers(block: &Block, cx: &mut Cx<'_>) -> BTreeMap<String, String> {
    let mut headers = BTreeMap::new();
    // Header names are case-insensitive: `Accept` and `accept` are one header.
    let mut seen: BTreeMap<String, u32> = BTreeMap::new();
    for child in &block.children {
        let line = &child.line;
        if let Some(first) = child.children.first() {
            cx.error(
                first.line.no,
                first.line.col(),
                "a header is one `Name: value` line",
            );
            continue;
        }
        let Some((name, value)) = line.text.split_once(':') else {
            cx.error(
                line.no,
                line.col(),
                format!(
                    "expected `Header-Name: value`, found `{}`",
                    head(&line.text)
                ),
            );
            continue;
        };
        let name = name.trim_end();
        if !is_header_name(name) {
            cx.error(
                line.no,
                line.col(),
                format!("`{name}` is not a valid header name"),
            );
            continue;
        }
        let raw_value = value.trim();
        let value_col = line.col().saturating_add(to_u32(
            line.text.chars().count() - value.trim_start().chars().count(),
        ));
        let value = match parse_scalar(raw_value, value_col) {
            Ok(v) => v,
            Err((col, m)) => {
                cx.error(line.no, col, m);
                continue;
            }
        };
        if value.chars().any(|c| c == '\r' || c == '\n' || c == '\0') {
            cx.error(
                line.no,
                value_col,
                "a header value must not contain line breaks or NUL",
            );
            continue;
        }
        if let Some(first) = seen.insert(name.to_ascii_lowercase(), line.no) {
            cx.error(
                line.no,
                line.col(),
                format!("duplicate header `{name}` (first on line {first})"),
            );
            continue;
        }
        headers.insert(name.to_string(), value);
    }
    headers
}

/// Check each `{name}` of the endpoint against the signature.
fn check_path_params(endpoint: &str, line: u32, col: u32, sig: &Signature, cx: &mut Cx<'_>) {
    let mut open: Option<(usize, String)> = None;
    for (i, c) in endpoint.chars().enumerate() {
        let at = col.saturating_add(to_u32(i));
        match (c, &mut open) {
            ('{', None) => open = Some((i, String::new())),
            ('{', Some(_)) => {
                cx.error(line, at, "unexpected `{` inside a path parameter");
                return;
            }
            ('}', None) => {
                cx.error(line, at, "`}` without a matching `{` in the endpoint");
                return;
            }
            ('}', Some((start, name))) => {
                let name = std::mem::take(name);
                let at = col.saturating_add(to_u32(*start));
                open = None;
                check_path_param(&name, line, at, sig, cx);
            }
            (c, Some((_, name))) => name.push(c),
            (_, None) => {}
        }
    }
    if let Some((start, _)) = open {
        cx.error(
            line,
            col.saturating_add(to_u32(start)),
            "unclosed `{` in the endpoint",
        );
    }
}

fn check_path_param(name: &str, line: u32, at: u32, sig: &Signature, cx: &mut Cx<'_>) {
    let Some(param) = sig.params.iter().find(|p| p.name == name) else {
        cx.error(
            line,
            at,
            format!(
                "path parameter `{{{name}}}` is not a parameter of `{}`",
                sig.name
            ),
        );
        return;
    };
    if !matches!(
        param.ty,
        TypeExpr::Prim(Prim::String | Prim::Number | Prim::Boolean | Prim::Date)
    ) {
        cx.error(
            line,
            at,
            format!("path parameter `{name}` must be a string, number, boolean or date"),
        );
    } else if param.optional && param.default.is_none() {
        // An absent value would leave a hole in the URL.
        cx.error(
            line,
            at,
            format!("path parameter `{name}` is optional; make it required or give it a default"),
        );
    }
}

/// Apply a tool's `parameters:` block to its signature parameters; returns
/// the parameters the model does not supply ([`InjectedParam`]), in the
/// block's order, each with the line and column of its name, and those
/// with `visibility.trace: false` (name, type, line and column of the
/// `trace:` value).
fn apply_parameters(
    block: &Block,
    params: &mut [Field],
    tool: &str,
    cx: &mut Cx<'_>,
) -> (Vec<Injected>, Vec<Untraced>) {
    let mut injected = Vec::new();
    let mut untraced = Vec::new();
    let mut seen: BTreeMap<&str, u32> = BTreeMap::new();
    for child in &block.children {
        let line = &child.line;
        let Some(kv) = split_key(line) else {
            cx.error(
                line.no,
                line.col(),
                format!(
                    "expected `parameter_name:` followed by an indented block, found `{}`",
                    head(&line.text)
                ),
            );
            continue;
        };
        if let Some(first) = seen.insert(kv.key, line.no) {
            cx.error(
                line.no,
                kv.key_col,
                format!(
                    "parameter `{}` is described twice (first on line {first})",
                    kv.key
                ),
            );
            continue;
        }
        let Some(param) = params.iter_mut().find(|p| p.name == kv.key) else {
            cx.error(
                line.no,
                kv.key_col,
                format!("`{}` is not a parameter of `{tool}`", kv.key),
            );
            continue;
        };
        if kv.optional {
            cx.error(
                line.no,
                kv.key_col,
                "mark a parameter optional in the signature, not in `parameters:`",
            );
            continue;
        }
        if !kv.value.is_empty() {
            cx.error(
                line.no,
                kv.value_col,
                format!(
                    "parameter `{}` is typed in the signature; put its details in an indented block below it",
                    kv.key
                ),
            );
            continue;
        }
        let mut keys = SourceKeys::default();
        enrich_field(param, &child.children, 1, Some(&mut keys), cx);
        if let Some(v) = keys.visibility {
            if let Some((model, l, c)) = v.model {
                let from_elsewhere = keys.value.is_some()
                    || keys
                        .source
                        .as_ref()
                        .is_some_and(|(s, _, _)| s.as_str() != "model");
                match keys.hidden {
                    Some((hidden, ..)) if hidden == model => cx.error(
                        l,
                        c,
                        format!("`visibility.model: {model}` contradicts `hidden: {hidden}`"),
                    ),
                    _ if model && from_elsewhere => cx.error(
                        l,
                        c,
                        format!("`visibility.model: true` contradicts the parameter's source: `{}` is never shown to the model when its value comes from elsewhere", kv.key),
                    ),
                    // `model: false` is `hidden: true`.
                    None if !model => keys.hidden = Some((true, l, c)),
                    _ => {}
                }
            }
            if let Some((false, l, c)) = v.trace {
                untraced.push((kv.key.to_owned(), param.ty.clone(), l, c));
            }
        }
        if let Some(i) = finish_source(param, keys, (line.no, kv.key_col), cx) {
            injected.push((i, (line.no, kv.key_col)));
        }
    }
    (injected, untraced)
}

/// The source settings written under one parameter, with the line and
/// column of each value, read by [`SourceKeys::read`] and checked by
/// [`finish_source`].
#[derive(Default)]
struct SourceKeys<'b> {
    /// Keys seen, for duplicates.
    seen: BTreeMap<String, u32>,
    source: Option<(String, u32, u32)>,
    /// `value:` as written (unquoted), whether it was quoted, line, column.
    value: Option<(String, bool, u32, u32)>,
    key: Option<(String, u32, u32)>,
    table: Option<&'b Block>,
    hidden: Option<(bool, u32, u32)>,
    required: Option<(bool, u32, u32)>,
    /// `default:` as written (unquoted), whether it was quoted, line, column.
    default: Option<(String, bool, u32, u32)>,
    /// `visibility:` (`abl/visibility.rs`).
    visibility: Option<visibility::Visibility>,
}

impl<'b> SourceKeys<'b> {
    fn read(&mut self, block: &'b Block, kv: &KeyValue<'_>, cx: &mut Cx<'_>) {
        let line = &block.line;
        if let Some(first) = self.seen.insert(kv.key.to_owned(), line.no) {
            cx.error(
                line.no,
                kv.key_col,
                format!("duplicate `{}:` (first on line {first})", kv.key),
            );
            return;
        }
        let at = |v: String| (v, line.no, kv.value_col);
        let flag = |cx: &mut Cx<'_>| {
            keyword(block, kv, &[("true", true), ("false", false)], cx)
                .map(|b| (b, line.no, kv.value_col))
        };
        match kv.key {
            "source" => self.source = scalar(block, kv, cx).map(at),
            "key" => self.key = scalar(block, kv, cx).map(at),
            "value" | "default" => {
                let Some(v) = scalar(block, kv, cx) else {
                    return;
                };
                let entry = Some((v, is_quoted(kv.value), line.no, kv.value_col));
                if kv.key == "value" {
                    self.value = entry;
                } else {
                    self.default = entry;
                }
            }
            "table" => {
                if block_only(block, kv, cx) {
                    self.table = Some(block);
                }
            }
            "hidden" => self.hidden = flag(cx),
            "visibility" => self.visibility = Some(visibility::read_visibility(block, kv, cx)),
            _ => self.required = flag(cx),
        }
    }
}

/// A literal written for a parameter of type `ty` (`default:`, a `value:`
/// without `source:`, a `table:` entry): the text for `string` (quoted or
/// not), a `YYYY-MM-DD` text for `date`, an unquoted number or `true` /
/// `false` for `number` and `boolean`. Other types take no literal.
fn typed_literal(ty: &TypeExpr, text: &str, quoted: bool, what: &str) -> Result<Value, String> {
    let found = || {
        if quoted {
            format!("\"{text}\"")
        } else {
            format!("`{text}`")
        }
    };
    match ty {
        TypeExpr::Prim(Prim::String) => Ok(Value::String(text.to_owned())),
        TypeExpr::Prim(Prim::Date) if signature::is_date(text) => {
            Ok(Value::String(text.to_owned()))
        }
        TypeExpr::Prim(Prim::Date) => Err(format!("{what} {} is not a date (YYYY-MM-DD)", found())),
        TypeExpr::Prim(Prim::Number) => {
            match (quoted, serde_json::from_str::<serde_json::Number>(text)) {
                (false, Ok(n)) => Ok(Value::Number(n)),
                _ => Err(format!("{what} {} is not a number", found())),
            }
        }
        TypeExpr::Prim(Prim::Boolean) => match (quoted, text) {
            (false, "true") => Ok(Value::Bool(true)),
            (false, "false") => Ok(Value::Bool(false)),
            _ => Err(format!("{what} {} is not `true` or `false`", found())),
        },
        _ => Err(format!(
            "a parameter of type `{}` cannot take a {what}; literals are for string, number, boolean and date",
            ty.describe()
        )),
    }
}

/// The `value:`s of `source: runtime`, for messages.
const RUNTIME_VALUES: &str = "`run_id`, `node_id`, `call_id`, `idempotency_key`, `tenant`, `time` (or `now`), `date` or `unix_ms`";

/// The built-in type of `ty`, if it is one.
fn field_ty_prim(ty: &TypeExpr) -> Option<Prim> {
    match ty {
        TypeExpr::Prim(p) => Some(*p),
        _ => None,
    }
}

/// The `source:`, `value:`, `key:`, `table:`, `hidden:`, `required:` and
/// `default:` of one parameter, applied to `field` (`required`, `default`)
/// and checked; `Some` for a parameter the model does not supply. `at` is
/// the line and column of the parameter's name.
fn finish_source(
    field: &mut Field,
    keys: SourceKeys<'_>,
    at: (u32, u32),
    cx: &mut Cx<'_>,
) -> Option<InjectedParam> {
    let name = field.name.clone();
    // A vaulted secret never becomes an argument (the model's transcript
    // and every event hold the arguments).
    for (what, entry) in [("`value`", &keys.value), ("`default`", &keys.default)] {
        if let Some((text, quoted, line, col)) = entry
            && let Some((inner, at)) = secrets::first_secret_placeholder(text)
        {
            let col = col
                .saturating_add(u32::from(*quoted))
                .saturating_add(to_u32(text[..at].chars().count()));
            let what = format!("a parameter's {what}");
            cx.error(*line, col, secrets::misplaced_message(inner, &what));
            return None;
        }
    }
    if let Some((text, quoted, line, col)) = &keys.default {
        match typed_literal(&field.ty, text, *quoted, "default") {
            Ok(v) => field.default = Some(v),
            Err(m) => cx.error(*line, *col, m),
        }
    }
    if let Some((required, line, col)) = keys.required {
        if required && field.default.is_some() {
            cx.error(
                line,
                col,
                format!("`{name}` has a default, so it is never missing; drop `required: true` or the default"),
            );
        }
        field.optional = !required;
    }
    let source = keys.source.as_ref().map(|(s, _, _)| s.as_str());
    let (src_line, src_col) = keys.source.as_ref().map_or(at, |(_, l, c)| (*l, *c));
    let lookup = source == Some("lookup");
    if !lookup {
        for (what, pos) in [
            ("key", keys.key.as_ref().map(|(_, l, c)| (*l, *c))),
            ("table", keys.table.map(|b| (b.line.no, b.line.col()))),
        ] {
            if let Some((l, c)) = pos {
                cx.error(l, c, format!("`{what}:` goes with `source: lookup`"));
            }
        }
    }
    let model_source = matches!(source, None | Some("model"));
    if let Some((false, line, col)) = keys.hidden
        && !(model_source && keys.value.is_none())
    {
        cx.error(
            line,
            col,
            format!("`hidden: false` contradicts the parameter's source: `{name}` is never shown to the model when its value comes from elsewhere"),
        );
    }
    let field_ty = field.ty.clone();
    let need_string = |cx: &mut Cx<'_>, what: &str| {
        if field.ty != TypeExpr::Prim(Prim::String) {
            cx.error(
                src_line,
                src_col,
                format!(
                    "`source: {what}` gives a string; `{name}` is a `{}`",
                    field.ty.describe()
                ),
            );
        }
    };
    let value = keys.value.clone();
    let value_text = |cx: &mut Cx<'_>, what: &str| -> Option<(String, u32, u32)> {
        match &value {
            Some((v, _, l, c)) => Some((v.clone(), *l, *c)),
            None => {
                cx.error(src_line, src_col, format!("`source: {what}` needs a `value:` ({})", match what {
                    "system" => "a jq expression over the run's state, like `.input.customer_id`",
                    "expr" => "a jq expression over the run's state and the model's arguments at `.args`",
                    "runtime" => RUNTIME_VALUES,
                    _ => "the name of a worker configuration value, like `CRM_ACCOUNT`",
                }));
                None
            }
        }
    };
    let parse_expr =
        |cx: &mut Cx<'_>, text: &str, line: u32, col: u32, what: &str| match Expr::parse(text) {
            Ok(e) => Some(e),
            Err(e) => {
                cx.error(
                    line,
                    col,
                    format!("`{what}` is not a valid jq expression: {e}"),
                );
                None
            }
        };
    let source = match source {
        None | Some("model") => {
            match (&keys.value, keys.hidden) {
                (Some((_, _, line, col)), _) if source == Some("model") => {
                    cx.error(*line, *col, format!("`value:` needs a `source:` other than `model`: the model supplies `{name}`"));
                    return None;
                }
                (Some((text, quoted, line, col)), _) => {
                    match typed_literal(&field.ty, text, *quoted, "value") {
                        Ok(value) => ParamSource::Literal { value },
                        Err(m) => {
                            cx.error(*line, *col, m);
                            return None;
                        }
                    }
                }
                (None, Some((true, line, col))) => match &field.default {
                    Some(d) => ParamSource::Literal { value: d.clone() },
                    None => {
                        cx.error(line, col, format!("hidden parameter `{name}` needs a `source:`, a `value:` or a `default:`: the model never sends it"));
                        return None;
                    }
                },
                _ => return None,
            }
        }
        Some("system" | "expr") => {
            let what = source.unwrap_or_default();
            let (text, line, col) = value_text(cx, what)?;
            let expr = parse_expr(cx, &text, line, col, "value")?;
            if what == "system" {
                ParamSource::System { expr }
            } else {
                ParamSource::Expr { expr }
            }
        }
        Some("runtime") => {
            let (text, line, col) = value_text(cx, "runtime")?;
            let field = match text.as_str() {
                "run_id" => RuntimeField::RunId,
                "node_id" => RuntimeField::NodeId,
                "call_id" => RuntimeField::CallId,
                "idempotency_key" => RuntimeField::IdempotencyKey,
                "tenant" => RuntimeField::Tenant,
                "time" | "now" => RuntimeField::Time,
                "date" => RuntimeField::Date,
                "unix_ms" => RuntimeField::UnixMs,
                other => {
                    cx.error(line, col, format!("unknown `value: {other}` of `source: runtime` (expected {RUNTIME_VALUES})"));
                    return None;
                }
            };
            // What each value gives: the time as RFC 3339 text, the date as
            // `YYYY-MM-DD` (a `date` or a `string`), ms as a number.
            let fits = match field {
                RuntimeField::Date => {
                    matches!(field_ty_prim(&field_ty), Some(Prim::Date | Prim::String))
                }
                RuntimeField::UnixMs => field_ty_prim(&field_ty) == Some(Prim::Number),
                _ => field_ty_prim(&field_ty) == Some(Prim::String),
            };
            if !fits {
                let gives = match field {
                    RuntimeField::Date => {
                        "a date (`YYYY-MM-DD`), for a `date` or `string` parameter"
                    }
                    RuntimeField::UnixMs => "a number (ms since the Unix epoch)",
                    RuntimeField::Time => "a string (RFC 3339, like `2026-12-02T10:15:30.123Z`)",
                    _ => "a string",
                };
                cx.error(
                    src_line,
                    src_col,
                    format!(
                        "`source: runtime` `value: {text}` gives {gives}; `{name}` is a `{}`",
                        field_ty.describe()
                    ),
                );
            }
            ParamSource::Runtime { field }
        }
        Some("auth") => {
            need_string(cx, "auth");
            let field = match value.as_ref().map(|(v, _, l, c)| (v.as_str(), *l, *c)) {
                None | Some(("caller", _, _)) => AuthField::Caller,
                Some(("tenant", _, _)) => AuthField::Tenant,
                Some((other, line, col)) => {
                    cx.error(line, col, format!("unknown `value: {other}` of `source: auth` (expected `caller`, the identity that started the run, or `tenant`)"));
                    return None;
                }
            };
            ParamSource::Auth { field }
        }
        Some("config") => {
            need_string(cx, "config");
            let (text, line, col) = value_text(cx, "config")?;
            // `NAME` or `{{config.NAME}}`.
            let config_name = match text.strip_prefix("{{").and_then(|t| t.strip_suffix("}}")) {
                Some(inner) => config_placeholder_name(inner.trim()).map(str::to_owned),
                None => config_placeholder_name(&format!("config.{text}")).map(|_| text.clone()),
            };
            let Some(config_name) = config_name else {
                cx.error(line, col, format!("`value: {text}` of `source: config` must be a configuration name (letters, digits, `_`, `-`, `.`) or `{{{{config.NAME}}}}`"));
                return None;
            };
            ParamSource::Config { name: config_name }
        }
        Some("lookup") => {
            if let Some((_, _, line, col)) = &keys.value {
                cx.error(
                    *line,
                    *col,
                    "`source: lookup` takes `key:` and `table:`, not `value:`",
                );
            }
            let Some((key, kline, kcol)) = &keys.key else {
                cx.error(src_line, src_col, "`source: lookup` needs `key:` (a jq expression giving the key, like `.args.country`)");
                return None;
            };
            let key = parse_expr(cx, key, *kline, *kcol, "key")?;
            let Some(table_block) = keys.table else {
                cx.error(
                    src_line,
                    src_col,
                    "`source: lookup` needs `table:`, an indented block of `key: value` lines",
                );
                return None;
            };
            let mut table = BTreeMap::new();
            for entry in &table_block.children {
                let Some(kv) = entry_kv(&entry.line, "`key: value` in `table:`", cx) else {
                    continue;
                };
                let Some(text) = scalar(entry, &kv, cx) else {
                    continue;
                };
                match typed_literal(&field.ty, &text, is_quoted(kv.value), "value") {
                    Ok(v) => {
                        if table.insert(kv.key.to_owned(), v).is_some() {
                            cx.error(
                                entry.line.no,
                                kv.key_col,
                                format!("duplicate key `{}` in `table:`", kv.key),
                            );
                        }
                    }
                    Err(m) => cx.error(entry.line.no, kv.value_col, m),
                }
            }
            if table.is_empty() && table_block.children.is_empty() {
                cx.error(
                    table_block.line.no,
                    table_block.line.col(),
                    "`table:` is empty",
                );
            }
            ParamSource::Lookup { key, table }
        }
        Some(other) => {
            cx.error(src_line, src_col, format!("unknown `source: {other}` (expected `model`, `system`, `runtime`, `config`, `auth`, `expr` or `lookup`)"));
            return None;
        }
    };
    Some(InjectedParam {
        name,
        source,
        default: field.default.clone(),
        required: !field.optional,
    })
}

/// Where a `source: config` parameter may go: only into a request body or
/// an MCP call, never a URL (a URL ends up in errors and logs) nor a child
/// run's input (no worker resolves it there).
fn check_injected_use(
    injected: &[(InjectedParam, (u32, u32))],
    props: &Props<'_>,
    tool: &str,
    cx: &mut Cx<'_>,
) {
    for (param, (line, col)) in injected {
        if !matches!(param.source, ParamSource::Config { .. }) {
            continue;
        }
        let name = &param.name;
        let in_text = |text: &str| {
            let squeezed: String = text.chars().filter(|c| !c.is_whitespace()).collect();
            squeezed.contains(&format!("{{{{{name}}}}}"))
        };
        let endpoint_has = props
            .endpoint
            .as_ref()
            .is_some_and(|(e, _, _)| e.contains(&format!("{{{name}}}")));
        let query_has = props.query_params.is_some_and(|b| {
            fn any_line(b: &Block, f: &dyn Fn(&str) -> bool) -> bool {
                f(&b.line.text) || b.children.iter().any(|c| any_line(c, f))
            }
            any_line(b, &in_text)
        });
        let method = props.method.as_deref().unwrap_or("POST");
        let to_query = props.body_template.is_none()
            && matches!(method, "GET" | "DELETE")
            && props.body_mode != Some(belay_proto::wire::BodyMode::None);
        let problem = match props.binding_type {
            Some(BindingType::Workflow) => Some("a `type: workflow` tool's arguments go to a child run, where no worker resolves it".to_owned()),
            _ if endpoint_has => Some("it is a path parameter, and a URL ends up in logs and errors".to_owned()),
            _ if query_has => Some("`query_params:` puts it in the URL, which ends up in logs and errors".to_owned()),
            Some(BindingType::Http | BindingType::AsyncWebhook) if to_query => Some(format!("a {method} request sends its arguments in the URL, which ends up in logs and errors")),
            _ => None,
        };
        if let Some(problem) = problem {
            cx.error(
                *line,
                *col,
                format!("parameter `{name}` of `{tool}` has `source: config`, but {problem}; a configured value goes in a request body or an MCP call only"),
            );
        }
    }
}

/// [`check_injected_use`] for each `request_variants:` item (its merged
/// request): a variant must not put a `source: config` parameter into a
/// URL either (a path parameter, a query parameter, or the arguments of a
/// request without a body). Reported at the parameter, naming the variant.
fn check_injected_use_in_variants(
    injected: &[(InjectedParam, (u32, u32))],
    variants: &[super::model::RequestVariantDef],
    tool: &str,
    cx: &mut Cx<'_>,
) {
    for (param, (line, col)) in injected {
        if !matches!(param.source, ParamSource::Config { .. }) {
            continue;
        }
        let name = &param.name;
        let placeholder = |text: &str| {
            let squeezed: String = text.chars().filter(|c| !c.is_whitespace()).collect();
            squeezed.contains(&format!("{{{{{name}}}}}"))
        };
        for v in variants {
            let method = v.method.trim().to_ascii_uppercase();
            let problem = if v.endpoint.contains(&format!("{{{name}}}")) {
                Some("it is a path parameter".to_owned())
            } else if v.request.query_params.iter().any(|q| placeholder(&q.value)) {
                Some("`query_params:` puts it in the URL".to_owned())
            } else if v.request.body_template.is_none()
                && matches!(method.as_str(), "GET" | "DELETE")
                && v.request.body_mode != belay_proto::wire::BodyMode::None
            {
                Some(format!("a {method} request sends its arguments in the URL"))
            } else {
                None
            };
            if let Some(problem) = problem {
                cx.error(
                    *line,
                    *col,
                    format!(
                        "parameter `{name}` of `{tool}` has `source: config`, but in request variant `{}` {problem}, which ends up in logs and errors; a configured value goes in a request body or an MCP call only",
                        v.name
                    ),
                );
            }
        }
    }
}

/// Apply an indented block to a parameter or field: `description:`, and
/// nested fields when it is an `object` / `object[]`.
fn enrich_field<'b>(
    field: &mut Field,
    blocks: &'b [Block],
    depth: usize,
    mut keys: Option<&mut SourceKeys<'b>>,
    cx: &mut Cx<'_>,
) {
    if depth > MAX_TYPE_DEPTH {
        if let Some(first) = blocks.first() {
            cx.error(
                first.line.no,
                first.line.col(),
                "fields are nested too deeply",
            );
        }
        return;
    }
    // Decided once: the first nested field turns `object` into a declared
    // object, after which more fields are still welcome.
    let can_nest = field.ty.is_plain_object();
    // The seed's schema keys: `properties:` (under `object` or `object[]`)
    // and `items:` (under `object[]`) with a block of field lines declare
    // the same fields as lines written directly under the parameter, so
    // their blocks are read as if they were (duplicates across both
    // included). Under an `object`, `items:` stays a field named `items`.
    let is_array = matches!(field.ty, TypeExpr::Array(_));
    let blocks: Vec<&Block> = blocks
        .iter()
        .flat_map(|b| {
            let schema_key = can_nest
                && !b.children.is_empty()
                && split_key(&b.line).is_some_and(|kv| {
                    kv.value.is_empty()
                        && !kv.optional
                        && (kv.key == "properties" || (kv.key == "items" && is_array))
                });
            if schema_key {
                b.children.iter().collect::<Vec<_>>()
            } else {
                vec![b]
            }
        })
        .collect();
    let mut seen: BTreeMap<&str, u32> = BTreeMap::new();
    for child in blocks {
        let line = &child.line;
        let Some(kv) = split_key(line) else {
            cx.error(
                line.no,
                line.col(),
                format!(
                    "expected `description:` or `field: type`, found `{}`",
                    head(&line.text)
                ),
            );
            continue;
        };
        // `description` is normally the enrichment key, but an object may
        // well have a field called `description`: `description: string`
        // under an object declares that field, `description: "text"` (or
        // any non-type text) describes the parameter.
        let value_is_type =
            !is_quoted(kv.value) && parse_field_decl(&line.text, line.col()).is_ok();
        let declares_field = can_nest && (value_is_type || kv.value.is_empty());
        if kv.key == "description" && !kv.optional && !declares_field {
            if field.description.is_some() {
                cx.error(
                    line.no,
                    kv.key_col,
                    format!("`{}` already has a description", field.name),
                );
            } else if let Some(s) = scalar(child, &kv, cx) {
                field.description = Some(s);
            }
            continue;
        }
        // Under an object parameter, `source: string` declares a field
        // named `source`; `source: system` is the setting.
        let key_declares_field = can_nest
            && (kv.value.is_empty()
                || parse_field_decl(&line.text, line.col())
                    .is_ok_and(|f| check_input_type(&f.ty).is_ok()));
        if SOURCE_KEYS.contains(&kv.key) && !kv.optional && !key_declares_field {
            match keys.as_deref_mut() {
                Some(keys) => keys.read(child, &kv, cx),
                None => cx.error(
                    line.no,
                    kv.key_col,
                    format!(
                        "`{}:` applies to a tool's parameters, not to nested fields",
                        kv.key
                    ),
                ),
            }
            continue;
        }
        if SEED_ENRICHMENT_KEYS.contains(&kv.key) && !declares_field {
            let message = match kv.key {
                "properties" => format!(
                    "`properties:` with a block of `field: type` lines declares the fields of an `object` or `object[]` parameter; `{}` is `{}`",
                    field.name,
                    field.ty.describe()
                ),
                "items" => format!(
                    "`items:` with a block of `field: type` lines declares the item fields of an `object[]` parameter; `{}` is `{}`",
                    field.name,
                    field.ty.describe()
                ),
                _ => format!("parameter setting `{}:` is not supported yet", kv.key),
            };
            cx.error(line.no, kv.key_col, message);
            continue;
        }
        if !can_nest {
            let message = match &field.ty {
                TypeExpr::Object(_) => format!(
                    "`{}` declares its fields inline in the signature; `{}` cannot be added here",
                    field.name, kv.key
                ),
                _ => format!(
                    "`{}` is not an object: nested field `{}` needs type `object` or `object[]`",
                    field.name, kv.key
                ),
            };
            cx.error(line.no, kv.key_col, message);
            continue;
        }
        let mut nested = if kv.value.is_empty() {
            if child.children.is_empty() {
                cx.error(
                    line.no,
                    kv.key_col,
                    format!(
                        "field `{}` needs a type (`{}: string`) or an indented block of fields",
                        kv.key, kv.key
                    ),
                );
                continue;
            }
            Field {
                name: kv.key.to_string(),
                column: kv.key_col,
                optional: kv.optional,
                ty: TypeExpr::Prim(Prim::Object),
                default: None,
                description: None,
            }
        } else {
            match parse_field_decl(&line.text, line.col()) {
                Ok(f) => f,
                Err(e) => {
                    cx.error(line.no, e.column, e.message);
                    continue;
                }
            }
        };
        if let Err(e) = signature::expand_named(&mut nested.ty, &cx.types)
            .and_then(|()| check_input_type(&nested.ty))
        {
            cx.error(line.no, e.column, e.message);
            continue;
        }
        if !first_time(&mut seen, &kv, line.no, &format!("field `{}`", kv.key), cx) {
            continue;
        }
        if !child.children.is_empty() {
            enrich_field(&mut nested, &child.children, depth + 1, None, cx);
        }
        if let Some(fields) = field.ty.object_fields_mut() {
            fields.push(nested);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    const FILE: &str = "tools/crm.tools.abl";

    fn parse(content: &str) -> AblOutput {
        parse_tools_file(FILE, content)
    }

    fn one_tool(content: &str) -> ToolDef {
        let out = parse(content);
        assert_eq!(out.errors, vec![], "unexpected errors");
        assert_eq!(out.tools.len(), 1);
        out.tools.into_iter().next().unwrap()
    }

    /// Errors as `line:column: message`.
    fn errors(content: &str) -> Vec<String> {
        let out = parse(content);
        for e in &out.errors {
            assert_eq!(e.file, FILE);
        }
        assert!(out.tools.is_empty() || !out.errors.is_empty());
        out.errors
            .iter()
            .map(|e| format!("{}:{}: {}", e.line, e.column, e.message))
            .collect()
    }

    /// A tool with the required properties around `extra` property lines.
    fn tool_with(signature: &str, extra: &str) -> String {
        format!(
            "TOOLS:\n  {signature}\n    type: http\n    endpoint: \"/x\"\n    permission: p.read\n    repeat_safety: idempotent\n{extra}"
        )
    }

    #[test]
    fn compaction_essential_fields() {
        let t = one_tool(&tool_with(
            "search(q: string) -> {items: object[]}",
            "    compaction:\n      essential_fields: [items.id, \"items.name\", items.id]\n",
        ));
        let fields = t.compaction.map(|c| c.essential_fields);
        assert_eq!(
            fields,
            Some(vec!["items.id".to_owned(), "items.name".to_owned()])
        );
        let t = one_tool(&tool_with(
            "search(q: string) -> object",
            "    compaction:\n      essential_fields:\n        - total\n        - meta.page\n",
        ));
        let fields = t.compaction.map(|c| c.essential_fields);
        assert_eq!(
            fields,
            Some(vec!["total".to_owned(), "meta.page".to_owned()])
        );
        // Absent: the definition's JSON (and content hash) is unchanged.
        let t = one_tool(&tool_with("search(q: string) -> object", ""));
        let json = serde_json::to_value(&t).unwrap();
        assert!(json.get("compaction").is_none());
        assert!(json.get("on_result").is_none() && json.get("on_error").is_none());
    }

    #[test]
    fn compaction_paths_and_outcome_variables_are_bounded() {
        let paths: Vec<String> = (0..=MAX_ESSENTIAL_FIELDS)
            .map(|i| format!("k{i}"))
            .collect();
        let errs = errors(&tool_with(
            "f() -> object",
            &format!(
                "    compaction:\n      essential_fields: [{}]\n",
                paths.join(", ")
            ),
        ));
        assert!(
            errs.iter().any(|e| e.contains("more than the limit of 64")),
            "{errs:?}"
        );
        let vars: String = (0..=MAX_OUTCOME_VARS)
            .map(|i| format!("        v{i}: .result\n"))
            .collect();
        let errs = errors(&tool_with(
            "f() -> object",
            &format!("    on_result:\n      set:\n{vars}"),
        ));
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(errs[0].contains("more than 16 variables"), "{errs:?}");
    }

    #[test]
    fn compaction_max_description_length() {
        let t = one_tool(&tool_with(
            "search(q: string) -> object",
            "    compaction:\n      max_description_length: 500\n",
        ));
        let c = t.compaction.expect("compaction");
        assert_eq!(c.max_description_length, Some(500));
        assert!(c.essential_fields.is_empty());
    }

    #[test]
    fn compaction_errors() {
        let sig = "search(q: string) -> object";
        let cases = [
            (
                "    compaction:\n      essential_fields: [a, b..c, ]\n",
                vec![
                    "8:29: `b..c` is not a field path: write names joined by `.`, like `items.id`",
                    "8:35: empty item in `essential_fields`",
                ],
            ),
            (
                "    compaction:\n      essential_fields: items.id\n",
                vec![
                    "8:25: `essential_fields` takes a list of dotted paths, like `[items.id, items.name]`",
                ],
            ),
            (
                "    compaction:\n      essential_fields: []\n",
                vec!["8:25: `essential_fields` needs at least one field path"],
            ),
            (
                "    compaction:\n      summary_timeout_ms: 500\n      max_search_tokens: 9\n      essential_fields: [a]\n",
                vec![
                    "8:7: `compaction.summary_timeout_ms` is not applicable: Belay never summarises a result with a model (what the model sees is cut by `essential_fields`, `max_description_length` and `max_result_bytes`, deterministically)",
                    "9:7: `compaction.max_search_tokens` is not applicable: it applies to SearchAI results, and Belay has no SearchAI tools",
                ],
            ),
            (
                "    compaction: [a]\n",
                vec![
                    "7:17: `compaction` takes an indented block on the following lines, not a value",
                ],
            ),
            (
                "    compaction:\n      keep: [a]\n",
                vec![
                    "8:7: unknown property `keep` in `compaction:` (expected `essential_fields` or `max_description_length`)",
                ],
            ),
            (
                "    compaction:\n      max_description_length: 0\n",
                vec![
                    "8:31: `max_description_length` must be a whole number of characters, at least 1, not `0`",
                ],
            ),
            (
                "    compaction:\n      max_description_length: 5\n      max_description_length: 6\n",
                vec!["9:7: duplicate `max_description_length` in `compaction:`"],
            ),
        ];
        for (extra, expected) in cases {
            assert_eq!(errors(&tool_with(sig, extra)), expected, "{extra}");
        }
    }

    #[test]
    fn on_result_and_on_error_set_run_vars() {
        let t = one_tool(&tool_with(
            "get_balance(account_id: string) -> {balance: number, currency: string}",
            "    on_result:\n      set:\n        current_balance: .result.balance\n        account_currency: \".result.currency | ascii_downcase\"\n    on_error:\n      set:\n        balance_error: .error.message\n",
        ));
        let sources = |m: &BTreeMap<String, Expr>| -> Vec<(String, String)> {
            m.iter()
                .map(|(k, e)| (k.clone(), e.source().to_owned()))
                .collect()
        };
        assert_eq!(
            sources(&t.on_result),
            vec![
                (
                    "account_currency".to_owned(),
                    ".result.currency | ascii_downcase".to_owned()
                ),
                ("current_balance".to_owned(), ".result.balance".to_owned()),
            ]
        );
        assert_eq!(
            sources(&t.on_error),
            vec![("balance_error".to_owned(), ".error.message".to_owned())]
        );
    }

    #[test]
    fn on_result_errors() {
        let sig = "get(id: string) -> object";
        let cases = [
            (
                "    on_result:\n      set:\n        x: .result | now\n",
                "9:12: `x` is not a valid jq expression:",
            ),
            (
                "    on_result:\n      set:\n        x: .result.[\n",
                "9:12: `x` is not a valid jq expression:",
            ),
            (
                "    on_result:\n      set:\n        x: result.balance\n",
                "write `.result.balance`, with the leading `.`",
            ),
            (
                "    on_error:\n      set:\n        x-y: .error.message\n",
                "9:9: variable name `x-y` must be letters, digits and `_`, not starting with a digit",
            ),
            (
                "    on_error:\n      set:\n        x: .error\n        x: .error\n",
                "10:9: duplicate variable `x` in `on_error.set:`",
            ),
            (
                "    on_result:\n      do:\n        - SET: x = 1\n",
                "8:7: `on_result.do:` action blocks are not applicable",
            ),
            (
                "    on_result:\n      keep: 1\n",
                "8:7: unknown property `keep` in `on_result:` (expected `set`)",
            ),
            (
                "    on_result:\n      set:\n        x:\n",
                "9:9: `x` needs a value",
            ),
        ];
        for (extra, expected) in cases {
            let errs = errors(&tool_with(sig, extra));
            assert_eq!(errs.len(), 1, "{extra}: {errs:?}");
            assert!(
                errs[0].starts_with(expected) || errs[0].contains(expected),
                "{extra}: {errs:?}"
            );
        }
    }

    #[test]
    fn full_http_tool() {
        let t = one_tool(
            r#"# CRM tools
TOOLS:
  # looks a customer up
  get_customer(customer_id: string, expand?: boolean = false) -> {id: string, name?: string}
    description: "Fetch one customer by id"   # shown to the model
    type: http
    endpoint: "https://crm.example.com/v1/customers/{customer_id}"
    method: get
    headers:
      X-Api-Version: "2024-01"
      Accept: application/json
    timeout: 10s
    permission: crm.read
    repeat_safety: idempotent
"#,
        );
        assert_eq!(t.name, "get_customer");
        assert_eq!(t.description, "Fetch one customer by id");
        assert_eq!(t.permission, "crm.read");
        assert_eq!(t.repeat_safety, RepeatSafety::Idempotent);
        assert_eq!(t.source_file, FILE);
        assert_eq!(t.source_line, 4);
        assert_eq!(
            t.binding,
            ToolBindingDef::Http {
                endpoint: "https://crm.example.com/v1/customers/{customer_id}".into(),
                method: "GET".into(),
                headers: BTreeMap::from([
                    ("Accept".to_string(), "application/json".to_string()),
                    ("X-Api-Version".to_string(), "2024-01".to_string()),
                ]),
                timeout_ms: 10_000,
                request: Default::default(),
            }
        );
        assert_eq!(
            t.input_schema,
            json!({
                "type": "object",
                "properties": {
                    "customer_id": {"type": "string"},
                    "expand": {"type": "boolean", "default": false}
                },
                "required": ["customer_id"],
                "additionalProperties": false
            })
        );
        assert_eq!(
            t.output_schema,
            json!({
                "type": "object",
                "properties": {"id": {"type": "string"}, "name": {"type": "string"}},
                "required": ["id"],
                "additionalProperties": true
            })
        );
    }

    #[test]
    fn defaults_for_optional_properties() {
        let t = one_tool(&tool_with("ping() -> boolean", ""));
        assert_eq!(t.description, "");
        assert_eq!(
            t.binding,
            ToolBindingDef::Http {
                endpoint: "/x".into(),
                method: "POST".into(),
                headers: BTreeMap::new(),
                timeout_ms: 30_000,
                request: Default::default(),
            }
        );
        assert_eq!(
            t.input_schema,
            json!({"type": "object", "properties": {}, "required": [], "additionalProperties": false})
        );
        assert_eq!(t.output_schema, json!({"type": "boolean"}));
    }

    #[test]
    fn timeouts() {
        assert_eq!(parse_timeout("30s"), Ok(30_000));
        assert_eq!(parse_timeout("500ms"), Ok(500));
        assert_eq!(parse_timeout("2m"), Ok(120_000));
        // The seed's unit for a bare number is milliseconds.
        assert_eq!(parse_timeout("10000"), Ok(10_000));
        assert_eq!(
            parse_timeout("0s"),
            Err("timeout must be more than 0".into())
        );
        assert_eq!(
            parse_timeout("5h"),
            Err("timeout `5h` has an unknown unit (use `ms`, `s` or `m`)".into())
        );
        assert!(
            parse_timeout("soon")
                .unwrap_err()
                .starts_with("timeout `soon` is not a duration")
        );
        assert!(parse_timeout("1.5s").is_err());
        assert_eq!(
            parse_timeout("99999999999999999999m"),
            Err("timeout `99999999999999999999m` is not a duration (write e.g. `30s`, `500ms`, `2m`, or a number of milliseconds)".into())
        );
        assert_eq!(
            parse_timeout("999999999999999999m"),
            Err("timeout `999999999999999999m` is too large".into())
        );
        let t = one_tool(&tool_with("f() -> string", "    timeout: 250ms\n"));
        let ToolBindingDef::Http { timeout_ms, .. } = t.binding else {
            panic!("an http tool");
        };
        assert_eq!(timeout_ms, 250);
    }

    #[test]
    fn seed_properties_and_items_keys_declare_the_nested_fields() {
        // The seed's `properties:` (object) and `items:` (object[]) blocks
        // give the same schema as field lines written directly.
        let keyed = one_tool(&tool_with(
            "create_order(customer: object, lines: object[], meta: object) -> {order_id: string}",
            r#"    parameters:
      customer:
        description: "Who is ordering"
        properties:
          name: string
          address:
            properties:
              zip: string = "00000"
      lines:
        items:
          product_id: string
          quantity: number = 1
      meta:
        items: string[]
"#,
        ));
        let direct = one_tool(&tool_with(
            "create_order(customer: object, lines: object[], meta: object) -> {order_id: string}",
            r#"    parameters:
      customer:
        description: "Who is ordering"
        name: string
        address:
          zip: string = "00000"
      lines:
        product_id: string
        quantity: number = 1
      meta:
        items: string[]
"#,
        ));
        assert_eq!(keyed.input_schema, direct.input_schema);
        assert_eq!(
            keyed.input_schema["properties"]["lines"]["items"]["required"],
            json!(["product_id"])
        );
        // Under an `object`, `items:` is a field of that name.
        assert_eq!(
            keyed.input_schema["properties"]["meta"]["properties"]["items"],
            json!({"type": "array", "items": {"type": "string"}})
        );

        // A field declared both ways is a duplicate; the keys do not apply
        // to a non-object parameter.
        let errs = errors(&tool_with(
            "f(c: object, n: number, s: string[]) -> string",
            r#"    parameters:
      c:
        name: string
        properties:
          name: string
      n:
        properties:
          x: string
      s:
        items:
          x: string
"#,
        ));
        assert_eq!(errs.len(), 3, "{errs:#?}");
        assert!(errs[0].contains("field `name`"), "{errs:#?}");
        assert!(
            errs[1].ends_with(
                "declares the fields of an `object` or `object[]` parameter; `n` is `number`"
            ),
            "{errs:#?}"
        );
        assert!(
            errs[2].ends_with(
                "declares the item fields of an `object[]` parameter; `s` is `string[]`"
            ),
            "{errs:#?}"
        );
    }

    #[test]
    fn seed_object_parameters_with_nested_fields() {
        let t = one_tool(&tool_with(
            "create_order(customer: object, items: object[]) -> {order_id: string}",
            r#"    description: "Create a new order"
    parameters:
      customer:
        description: "Who is ordering"
        name: string
        email?: string
        address:
          street: string
          zip: string = "00000"
        tags: string[]
      items:
        product_id: string
        quantity: number = 1
"#,
        ));
        assert_eq!(
            t.input_schema,
            json!({
                "type": "object",
                "properties": {
                    "customer": {
                        "type": "object",
                        "description": "Who is ordering",
                        "properties": {
                            "name": {"type": "string"},
                            "email": {"type": "string"},
                            "address": {
                                "type": "object",
                                "properties": {
                                    "street": {"type": "string"},
                                    "zip": {"type": "string", "default": "00000"}
                                },
                                "required": ["street"],
                                "additionalProperties": false
                            },
                            "tags": {"type": "array", "items": {"type": "string"}}
                        },
                        "required": ["name", "address", "tags"],
                        "additionalProperties": false
                    },
                    "items": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "product_id": {"type": "string"},
                                "quantity": {"type": "number", "default": 1}
                            },
                            "required": ["product_id"],
                            "additionalProperties": false
                        }
                    }
                },
                "required": ["customer", "items"],
                "additionalProperties": false
            })
        );
        assert_eq!(t.description, "Create a new order");
    }

    #[test]
    fn parameter_descriptions_and_field_named_description() {
        let t = one_tool(&tool_with(
            "charge(amount: number, note: object, lines: object[]) -> {receipt_id: string}",
            r#"    parameters:
      amount:
        description: Charge amount in the account currency
      note:
        description: string
        title:
          description: "Headline"
          text: string
      lines:
        description: "The order lines"
        sku: string
"#,
        ));
        let p = &t.input_schema["properties"];
        assert_eq!(
            p["amount"],
            json!({"type": "number", "description": "Charge amount in the account currency"})
        );
        // Under an object, `description: string` declares a field.
        assert_eq!(
            p["note"]["properties"]["description"],
            json!({"type": "string"})
        );
        assert_eq!(
            p["note"]["properties"]["title"],
            json!({
                "type": "object",
                "description": "Headline",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
                "additionalProperties": false
            })
        );
        assert_eq!(p["lines"]["description"], json!("The order lines"));
        assert_eq!(p["lines"]["items"]["required"], json!(["sku"]));
    }

    #[test]
    fn path_parameter_must_be_declared() {
        assert_eq!(
            errors(
                "TOOLS:\n  get_hotel(id: string) -> Hotel\n    type: http\n    endpoint: \"/hotels/{hotel_id}/x\"\n    permission: h.read\n    repeat_safety: idempotent\n"
            ),
            vec!["4:24: path parameter `{hotel_id}` is not a parameter of `get_hotel`"]
        );
        let t = one_tool(
            "TOOLS:\n  get_hotel(hotel_id: string) -> Hotel\n    type: http\n    endpoint: /hotels/{hotel_id}\n    method: GET\n    permission: h.read\n    repeat_safety: idempotent\n",
        );
        assert_eq!(t.output_schema, json!({"title": "Hotel"}));
    }

    #[test]
    fn path_parameter_shape_errors() {
        let e = errors(
            "TOOLS:\n  f(a?: string, b: object, c: number = 1) -> string\n    type: http\n    endpoint: /x/{a}/{b}/{c}/{d\n    permission: p\n    repeat_safety: never\n",
        );
        assert_eq!(
            e,
            vec![
                "4:18: path parameter `a` is optional; make it required or give it a default",
                "4:22: path parameter `b` must be a string, number, boolean or date",
                "4:30: unclosed `{` in the endpoint",
            ]
        );
        assert_eq!(
            errors(
                "TOOLS:\n  f(a: string) -> string\n    type: http\n    endpoint: /x/a}\n    permission: p\n    repeat_safety: never\n"
            ),
            vec!["4:19: `}` without a matching `{` in the endpoint"]
        );
    }

    #[test]
    fn workflow_tools() {
        let out = parse(
            "TOOLS:\n  kyc(email: string) -> {status: string}\n    description: \"k\"\n    type: workflow\n    workflow_id: kyc_check\n    mode: async\n    timeout_ms: 5000\n    param_mapping:\n      customer: email\n    permission: crm.read\n    repeat_safety: idempotent\n",
        );
        assert_eq!(out.errors, vec![]);
        let ToolBindingDef::Workflow {
            workflow,
            mode,
            timeout_ms,
            param_mapping,
        } = &out.tools[0].binding
        else {
            panic!("{:?}", out.tools[0].binding);
        };
        assert_eq!(workflow, "kyc_check");
        assert_eq!(*mode, ChildMode::Async);
        assert_eq!(*timeout_ms, Some(5000));
        assert_eq!(
            param_mapping.get("customer").map(String::as_str),
            Some("email")
        );
        assert_eq!(out.workflow_refs[0].name, "kyc_check");
        let bad = parse(
            "TOOLS:\n  kyc(email: string) -> {status: string}\n    type: workflow\n    endpoint: \"/x\"\n    mode: later\n    param_mapping:\n      customer: mail\n    permission: crm.read\n    repeat_safety: idempotent\n",
        );
        let messages: Vec<String> = bad.errors.iter().map(|e| e.message.clone()).collect();
        assert!(
            messages.iter().any(|m| m.contains("unknown mode `later`")),
            "{messages:?}"
        );
        assert!(
            messages
                .iter()
                .any(|m| m.contains("missing `workflow_id:`")),
            "{messages:?}"
        );
        assert!(
            messages
                .iter()
                .any(|m| m.contains("`endpoint:` applies to `type: http` only")),
            "{messages:?}"
        );
        assert!(
            messages
                .iter()
                .any(|m| m.contains("`mail`, which is not a parameter")),
            "{messages:?}"
        );
    }

    #[test]
    fn confirmation_blocks() {
        let t = one_tool(
            "TOOLS:\n  execute_payment(amount: number, recipient: string) -> {confirmation_id: string}\n    description: \"Execute a payment\"\n    type: http\n    endpoint: \"/api/payments\"\n    method: POST\n    confirmation:\n      require: always\n      immutable_params: [recipient]\n    permission: pay.exec\n    repeat_safety: idempotent\n",
        );
        assert_eq!(
            t.confirmation,
            Some(ConfirmationDef {
                when_side_effects: false,
                immutable_params: vec!["recipient".into()],
                approver_grant: "pay.exec".into(),
            })
        );
        let t = one_tool(
            "TOOLS:\n  f(a: string) -> string\n    type: http\n    endpoint: /f\n    confirmation:\n      require: never\n    permission: p\n    repeat_safety: never\n",
        );
        assert_eq!(t.confirmation, None);
        assert_eq!(
            errors(
                "TOOLS:\n  f(a: string) -> string\n    type: http\n    endpoint: /f\n    confirmation:\n      require: sometimes\n      immutable_params: [b]\n      consent_scope: [x]\n    permission: p\n    repeat_safety: never\n"
            ),
            vec![
                "6:16: unknown `require: sometimes` (expected `always`, `never` or `when_side_effects`)",
                "8:7: `consent_scope` is not supported yet: Belay asks an approver, not the end user in a conversation",
                "5:5: `confirmation:` needs `require: always`, `require: never` or `require: when_side_effects`",
            ]
        );
        assert_eq!(
            errors(
                "TOOLS:\n  f(a: string) -> string\n    type: http\n    endpoint: /f\n    confirmation:\n      require: always\n      immutable_params: [b]\n    permission: p\n    repeat_safety: never\n"
            ),
            vec!["7:25: `immutable_params` names `b`, which is not a parameter of `f`"]
        );
    }

    #[test]
    fn confirmation_when_side_effects_asks_only_for_tools_with_side_effects() {
        let tool = |extra: &str| {
            one_tool(&tool_with(
                "f(a: string) -> string",
                &format!(
                    "    confirmation:\n      require: when_side_effects\n      immutable_params: [a]\n{extra}"
                ),
            ))
        };
        let asks = Some(ConfirmationDef {
            when_side_effects: true,
            immutable_params: vec!["a".into()],
            approver_grant: "p.read".into(),
        });
        // Undeclared: taken to have side effects.
        assert_eq!(tool("").confirmation, asks);
        assert!(tool("").has_side_effects());
        assert_eq!(tool("    effect: side_effect\n").confirmation, asks);
        assert_eq!(tool("    effect: state_write\n").confirmation, asks);
        assert_eq!(
            tool("    hints:\n      side_effects: true\n").confirmation,
            asks
        );
        assert_eq!(tool("    effect: read_only\n").confirmation, None);
        assert!(!tool("    effect: read_only\n").has_side_effects());
        assert_eq!(
            tool("    hints:\n      side_effects: false\n").confirmation,
            None
        );
        assert_eq!(
            tool("    effect: read_only\n    hints:\n      side_effects: false\n").confirmation,
            None
        );
        // `effect:` and the hint must agree.
        assert_eq!(
            errors(&tool_with(
                "f() -> string",
                "    effect: read_only\n    hints:\n      side_effects: true\n"
            )),
            vec![
                "7:13: `effect: read_only` contradicts `hints.side_effects: true`; keep one of them"
            ]
        );
        assert_eq!(
            errors(&tool_with(
                "f() -> string",
                "    effect: side_effect\n    hints:\n      side_effects: false\n"
            )),
            vec![
                "7:13: `effect: side_effect` contradicts `hints.side_effects: false`; keep one of them"
            ]
        );
        assert_eq!(
            errors(&tool_with("f() -> string", "    effect: destructive\n")),
            vec![
                "7:13: unknown effect `destructive` (expected `read_only`, `state_write` or `side_effect`)"
            ]
        );
    }

    #[test]
    fn hints_are_parsed_and_stored_and_the_timeout_hint_yields_to_timeout() {
        // The seed's example.
        let t = one_tool(
            "TOOLS:\n  get_balance(account_id: string) -> {balance: number}\n    description: \"Get account balance\"\n    type: http\n    endpoint: /balance\n    hints:\n      cacheable: true\n      latency: fast\n      timeout: 5000\n      side_effects: false\n      requires_auth: true\n    permission: bank.read\n    repeat_safety: idempotent\n",
        );
        assert_eq!(
            t.hints,
            ToolHints {
                cacheable: Some(true),
                latency: Some(Latency::Fast),
                side_effects: Some(false),
                requires_auth: Some(true),
                timeout_ms: Some(5000),
                cache_ttl_ms: None,
            }
        );
        assert!(!t.has_side_effects());
        let timeout = |t: &ToolDef| match &t.binding {
            ToolBindingDef::Http { timeout_ms, .. }
            | ToolBindingDef::Mcp { timeout_ms, .. }
            | ToolBindingDef::McpResource { timeout_ms, .. }
            | ToolBindingDef::AsyncWebhook { timeout_ms, .. } => Some(*timeout_ms),
            ToolBindingDef::Workflow { timeout_ms, .. } => *timeout_ms,
            ToolBindingDef::Sandbox(b) => b.timeout_ms,
        };
        assert_eq!(timeout(&t), Some(5000));
        // `timeout:` wins over the hint; the hint wins over the file's default.
        let t = one_tool(&tool_with(
            "f() -> string",
            "    timeout: 2s\n    hints:\n      timeout: 9s\n",
        ));
        assert_eq!(timeout(&t), Some(2000));
        let t = one_tool(
            "TOOLS:\n  timeout: 20s\n  f() -> string\n    type: http\n    endpoint: /f\n    hints:\n      timeout: 7s\n    permission: p\n    repeat_safety: never\n",
        );
        assert_eq!(timeout(&t), Some(7000));
        let t = one_tool(
            "TOOLS:\n  f() -> string\n    type: mcp\n    server: s\n    hints:\n      timeout: 1m\n    permission: p\n",
        );
        assert_eq!(timeout(&t), Some(60_000));
        // No hints: nothing stored, and the stored form is unchanged.
        let t = one_tool(&tool_with("f() -> string", ""));
        assert!(t.hints.is_empty());
        let stored = serde_json::to_value(&t).unwrap();
        for key in ["hints", "effect", "injected", "model_input_schema"] {
            assert!(stored.get(key).is_none(), "{key} serialized");
        }
        assert_eq!(
            errors(&tool_with(
                "f() -> string",
                "    hints:\n      cacheable: yes\n      latency: instant\n      timeout: soon\n      cost: 3\n      cacheable: false\n      latency\n    hints:\n      timeout: 1s\n"
            )),
            vec![
                "8:18: unknown cacheable `yes` (expected `true` or `false`)",
                "9:16: unknown latency `instant` (expected `fast`, `medium` or `slow`)",
                "10:16: timeout `soon` is not a duration (write e.g. `30s`, `500ms`, `2m`, or a number of milliseconds)",
                "11:7: unknown hint `cost` (expected `cacheable`, `cache_ttl`, `latency`, `side_effects`, `requires_auth` or `timeout`)",
                "12:7: duplicate hint `cacheable` (first on line 8)",
                "13:7: expected `hint: value` in `hints:`, found `latency`",
                "14:5: duplicate property `hints` (first on line 7)",
            ]
        );
        assert_eq!(
            errors(&tool_with("f() -> string", "    hints: fast\n")),
            vec!["7:12: `hints` takes an indented block on the following lines, not a value"]
        );
    }

    #[test]
    fn cacheable_takes_a_ttl_and_is_refused_on_a_tool_that_acts() {
        // A GET tool: a method that may change something needs the tool
        // to say it does not (below).
        let get_with =
            |sig: &str, extra: &str| tool_with(sig, &format!("{extra}    method: GET\n"));
        // The seed's "Caching hints" example, with Belay's required
        // properties and the `cache_ttl` extension.
        let t = one_tool(
            "TOOLS:\n  get_exchange_rate(from: string, to: string) -> {rate: number}\n    description: \"Get current exchange rate\"\n    type: http\n    endpoint: \"/api/fx/rate\"\n    method: GET\n    hints:\n      cacheable: true\n      latency: fast\n      cache_ttl: 5m\n    effect: read_only\n    permission: fx.read\n    repeat_safety: idempotent\n",
        );
        assert_eq!(
            (t.hints.cacheable, t.hints.cache_ttl_ms),
            (Some(true), Some(300_000))
        );
        assert_eq!(t.cache_ttl_ms(1), Some(300_000));
        for (ttl, ms) in [
            ("90000", 90_000),
            ("30s", 30_000),
            ("1h 30m", 5_400_000),
            ("7days", 604_800_000),
        ] {
            let t = one_tool(&get_with(
                "f() -> string",
                &format!("    hints:\n      cacheable: true\n      cache_ttl: {ttl}\n"),
            ));
            assert_eq!(t.hints.cache_ttl_ms, Some(ms), "{ttl}");
        }
        // Without a TTL, the engine's default (pinned when a run starts).
        let t = one_tool(&get_with(
            "f() -> string",
            "    hints:\n      cacheable: true\n",
        ));
        assert_eq!((t.hints.cache_ttl_ms, t.cache_ttl_ms(42)), (None, Some(42)));
        assert_eq!(t.cache_ttl_ms(0), None);
        // `cacheable: false` (or nothing) never caches.
        let t = one_tool(&get_with(
            "f() -> string",
            "    hints:\n      cacheable: false\n",
        ));
        assert_eq!(t.cache_ttl_ms(42), None);
        assert_eq!(
            errors(&get_with(
                "f() -> string",
                "    hints:\n      cacheable: true\n      cache_ttl: 0\n"
            )),
            vec![
                "9:18: `cache_ttl` must be more than 0 (leave `cacheable: true` out to cache nothing)"
            ]
        );
        assert_eq!(
            errors(&get_with(
                "f() -> string",
                "    hints:\n      cacheable: true\n      cache_ttl: 8days\n"
            )),
            vec![
                "9:18: `cache_ttl: 8days` is longer than 7 days, the longest a result is served from the cache"
            ]
        );
        let e = errors(&get_with(
            "f() -> string",
            "    hints:\n      cacheable: true\n      cache_ttl: soon\n",
        ));
        assert!(
            e.len() == 1 && e[0].starts_with("9:18: `cache_ttl: soon` is not a duration"),
            "{e:?}"
        );
        assert_eq!(
            errors(&get_with(
                "f() -> string",
                "    hints:\n      cache_ttl: 5m\n"
            )),
            vec![
                "8:18: `hints.cache_ttl` goes with `hints.cacheable: true`: without it nothing is cached"
            ]
        );

        // A tool that acts may not be cached: each refusal points at
        // `cacheable: true` (line 8, column 18).
        let refused = |props: &str, repeat_safety: &str| {
            errors(&format!(
                "TOOLS:\n  f() -> string\n    type: http\n    endpoint: \"/x\"\n    permission: p\n    repeat_safety: {repeat_safety}\n    hints:\n      cacheable: true\n{props}    method: GET\n"
            ))
        };
        let why = |what: &str| {
            vec![format!(
                "8:18: `cacheable: true` does not fit tool `f`: {what}; a cached result is served instead of calling the tool"
            )]
        };
        assert_eq!(
            refused("    effect: side_effect\n", "idempotent"),
            why("it declares `effect: side_effect`")
        );
        // A method that may change something needs the tool to say it
        // does not.
        let post = |props: &str| {
            errors(&format!(
                "TOOLS:\n  f() -> string\n    type: http\n    endpoint: \"/x\"\n    permission: p\n    repeat_safety: idempotent\n    hints:\n      cacheable: true\n{props}"
            ))
        };
        assert_eq!(
            post(""),
            why(
                "it sends `POST` (the default method), which may change something; declare `effect: read_only` (or `hints.side_effects: false`) if it does not"
            )
        );
        assert_eq!(
            post("    method: delete\n"),
            why(
                "it sends `DELETE`, which may change something; declare `effect: read_only` (or `hints.side_effects: false`) if it does not"
            )
        );
        for ok in [
            "    method: POST\n    effect: read_only\n",
            "      side_effects: false\n    method: PUT\n",
            "    method: GET\n",
        ] {
            let t = one_tool(&format!(
                "TOOLS:\n  f() -> string\n    type: http\n    endpoint: \"/x\"\n    permission: p\n    repeat_safety: idempotent\n    hints:\n      cacheable: true\n{ok}"
            ));
            assert_eq!(t.hints.cacheable, Some(true), "{ok}");
        }
        assert_eq!(
            refused("    effect: state_write\n", "idempotent"),
            why("it declares `effect: state_write`")
        );
        assert_eq!(
            refused("      side_effects: true\n", "idempotent"),
            why("it declares `hints.side_effects: true`")
        );
        assert_eq!(
            refused("", "never"),
            why(
                "it is `repeat_safety: never` (a call whose effect must not happen twice); only an `idempotent` tool that changes nothing may be cached"
            )
        );
        assert_eq!(
            refused("", "reconcile"),
            why(
                "it is `repeat_safety: reconcile` (a call whose effect must not happen twice); only an `idempotent` tool that changes nothing may be cached"
            )
        );
        // The vault: a cached result would bypass it (a producer's hit
        // vaults nothing; a consumer's key leaves out its secret).
        assert_eq!(
            refused("    SECRET_ACCESS:\n      READ: [k1]\n", "idempotent"),
            why(
                "it declares `SECRET_ACCESS:`, and the cache key (its arguments) leaves out the secret its request carries"
            )
        );
        assert_eq!(
            refused("    scrub_secrets: false\n", "idempotent"),
            why(
                "it says `scrub_secrets: false`, and the cache keeps only scrubbed results (it keeps them outside the run, for every run of the tenant)"
            )
        );
        assert_eq!(
            errors(
                "TOOLS:\n  f() -> string\n    type: mcp\n    server: s\n    permission: p\n    hints:\n      cacheable: true\n"
            ),
            vec![
                "7:18: `cacheable: true` does not fit tool `f`: it leaves its repeat safety to the MCP server's hints; declare `repeat_safety: idempotent`; a cached result is served instead of calling the tool"
            ]
        );
        let e = errors(
            "TOOLS:\n  f(x: string) -> object\n    type: workflow\n    workflow_id: child\n    permission: p\n    repeat_safety: idempotent\n    hints:\n      cacheable: true\n",
        );
        assert!(
            e.contains(&"8:18: `cacheable: true` does not fit tool `f`: it is `type: workflow`, and each call starts a child run; a cached result is served instead of calling the tool".to_owned()),
            "{e:?}"
        );
        // A parameter unique to each call would make every key different.
        assert_eq!(
            errors(&get_with(
                "f(at: string, day: date) -> string",
                "    hints:\n      cacheable: true\n    parameters:\n      at:\n        source: runtime\n        value: time\n      day:\n        source: runtime\n        value: date\n",
            )),
            why(
                "its parameter `at` is `source: runtime` `value: time`, different in every call, so no two calls have the same arguments (the cache key) and none would ever be served"
            )
        );
        // An idempotent MCP tool that says so may be cached.
        let t = one_tool(
            "TOOLS:\n  f() -> string\n    type: mcp\n    server: s\n    permission: p\n    repeat_safety: idempotent\n    hints:\n      cacheable: true\n",
        );
        assert_eq!(t.cache_ttl_ms(5), Some(5));
    }

    #[test]
    fn runtime_time_values_and_their_types() {
        let t = one_tool(&tool_with(
            "f(at: string, now: string, day: date, day_text: string, ms: number) -> string",
            "    parameters:\n      at:\n        source: runtime\n        value: time\n      now:\n        source: runtime\n        value: now\n      day:\n        source: runtime\n        value: date\n      day_text:\n        source: runtime\n        value: date\n      ms:\n        source: runtime\n        value: unix_ms\n",
        ));
        let fields: Vec<_> = t
            .injected
            .iter()
            .map(|p| match &p.source {
                ParamSource::Runtime { field } => (p.name.as_str(), *field),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            fields,
            vec![
                ("at", RuntimeField::Time),
                ("now", RuntimeField::Time),
                ("day", RuntimeField::Date),
                ("day_text", RuntimeField::Date),
                ("ms", RuntimeField::UnixMs),
            ]
        );
        assert_eq!(
            t.model_input_schema,
            Some(
                json!({"type": "object", "properties": {}, "required": [], "additionalProperties": false})
            )
        );
        // Each value needs a parameter of the type it gives.
        assert_eq!(
            errors(&tool_with(
                "f(a: number, b: string, c: boolean, d: date) -> string",
                "    parameters:\n      a:\n        source: runtime\n        value: time\n      b:\n        source: runtime\n        value: unix_ms\n      c:\n        source: runtime\n        value: date\n      d:\n        source: runtime\n        value: run_id\n",
            )),
            vec![
                "9:17: `source: runtime` `value: time` gives a string (RFC 3339, like `2026-12-02T10:15:30.123Z`); `a` is a `number`",
                "12:17: `source: runtime` `value: unix_ms` gives a number (ms since the Unix epoch); `b` is a `string`",
                "15:17: `source: runtime` `value: date` gives a date (`YYYY-MM-DD`), for a `date` or `string` parameter; `c` is a `boolean`",
                "18:17: `source: runtime` `value: run_id` gives a string; `d` is a `date`",
            ]
        );
        assert_eq!(
            errors(&tool_with(
                "f(a: string) -> string",
                "    parameters:\n      a:\n        source: runtime\n        value: timestamp\n",
            )),
            vec![
                "10:16: unknown `value: timestamp` of `source: runtime` (expected `run_id`, `node_id`, `call_id`, `idempotency_key`, `tenant`, `time` (or `now`), `date` or `unix_ms`)"
            ]
        );
    }

    #[test]
    fn parameter_sources_hidden_parameters_and_the_models_schema() {
        // The seed's example, with Belay's `value:` as a jq path over the
        // run's state.
        let t = one_tool(
            r#"TOOLS:
  charge_card(amount: number, customer_id: string) -> {receipt_id: string}
    description: "Charge the customer's card on file"
    type: http
    endpoint: "/api/charges"
    method: POST
    parameters:
      customer_id:
        source: system            # model | system | runtime | config | auth | expr | lookup
        value: ".input.customer_id"
        hidden: true              # do not expose to the model
      amount:
        description: "Charge amount in the account currency"
        required: true
    permission: pay.charge
    repeat_safety: idempotent
"#,
        );
        assert_eq!(
            t.injected,
            vec![InjectedParam {
                name: "customer_id".into(),
                source: ParamSource::System {
                    expr: Expr::parse(".input.customer_id").unwrap()
                },
                default: None,
                required: true,
            }]
        );
        assert_eq!(
            t.model_schema(),
            &json!({
                "type": "object",
                "properties": {"amount": {"type": "number", "description": "Charge amount in the account currency"}},
                "required": ["amount"],
                "additionalProperties": false,
            })
        );
        assert_eq!(t.input_schema["required"], json!(["amount", "customer_id"]));

        // Every source, and `required` / `default` overriding the signature.
        let t = one_tool(&tool_with(
            r#"f(q: string, limit?: number, run: string, node: string, call: string, key: string, who: string, org: string, secret: string, cents: number, zone: string, fixed: number, tag?: string = "a", flag: boolean) -> string"#,
            r#"    parameters:
      q:
        description: "What to look for"
      limit:
        required: true
      run:
        source: runtime
        value: run_id
      node:
        source: runtime
        value: node_id
      call:
        source: runtime
        value: call_id
      key:
        source: runtime
        value: idempotency_key
      who:
        source: auth
      org:
        source: auth
        value: tenant
      secret:
        source: config
        value: "{{config.CRM_ACCOUNT}}"
      cents:
        source: expr
        value: ".args.limit * 100"
      zone:
        source: lookup
        key: ".input.country"
        table:
          DE: eu
          US: "us"
        default: other
      fixed:
        value: 42
      tag:
        hidden: true
        default: b
      flag:
        default: true
"#,
        ));
        let sources: Vec<(&str, &ParamSource, bool)> = t
            .injected
            .iter()
            .map(|p| (p.name.as_str(), &p.source, p.required))
            .collect();
        let runtime = |field| ParamSource::Runtime { field };
        let auth = |field| ParamSource::Auth { field };
        assert_eq!(
            sources,
            vec![
                ("run", &runtime(RuntimeField::RunId), true),
                ("node", &runtime(RuntimeField::NodeId), true),
                ("call", &runtime(RuntimeField::CallId), true),
                ("key", &runtime(RuntimeField::IdempotencyKey), true),
                ("who", &auth(AuthField::Caller), true),
                ("org", &auth(AuthField::Tenant), true),
                (
                    "secret",
                    &ParamSource::Config {
                        name: "CRM_ACCOUNT".into()
                    },
                    true
                ),
                (
                    "cents",
                    &ParamSource::Expr {
                        expr: Expr::parse(".args.limit * 100").unwrap()
                    },
                    true
                ),
                (
                    "zone",
                    &ParamSource::Lookup {
                        key: Expr::parse(".input.country").unwrap(),
                        table: BTreeMap::from([
                            ("DE".into(), json!("eu")),
                            ("US".into(), json!("us"))
                        ]),
                    },
                    true
                ),
                ("fixed", &ParamSource::Literal { value: json!(42) }, true),
                ("tag", &ParamSource::Literal { value: json!("b") }, false),
            ]
        );
        assert_eq!(t.injected[8].default, Some(json!("other")));
        // The model sees q, limit (now required) and flag (now defaulted).
        assert_eq!(
            t.model_schema(),
            &json!({
                "type": "object",
                "properties": {
                    "q": {"type": "string", "description": "What to look for"},
                    "limit": {"type": "number"},
                    "flag": {"type": "boolean", "default": true},
                },
                "required": ["q", "limit"],
                "additionalProperties": false,
            })
        );
        // `source: config` by bare name; `source: model` is the default.
        let t = one_tool(&tool_with(
            "f(a: string, b: string) -> string",
            "    parameters:\n      a:\n        source: config\n        value: CRM_KEY\n      b:\n        source: model\n        required: false\n",
        ));
        assert_eq!(t.injected.len(), 1);
        assert_eq!(
            t.injected[0].source,
            ParamSource::Config {
                name: "CRM_KEY".into()
            }
        );
        assert_eq!(t.model_schema()["required"], json!([]));
        // A tool without injected parameters has one schema.
        let t = one_tool(&tool_with("f(a: string) -> string", ""));
        assert_eq!(t.model_input_schema, None);
        assert_eq!(t.model_schema(), &t.input_schema);
    }

    #[test]
    fn parameter_source_errors() {
        assert_eq!(
            errors(&tool_with(
                "f(a: string, b: number, c: string, d: string, e: string, g: number, h: string, i: string, j: object, k: string, l: string, m: string) -> string",
                r#"    parameters:
      a:
        source: session
      b:
        source: runtime
        value: run_id
      c:
        source: runtime
        value: time
      d:
        source: system
      e:
        source: expr
        value: ".input | foo"
      g:
        default: "3"
        required: true
      h:
        hidden: true
      i:
        source: auth
        value: token
        hidden: false
      j:
        value: x
      k:
        key: ".x"
        source: model
        value: v
      l:
        source: lookup
        value: x
      m:
        source: config
        value: "{{secret.X}}"
"#
            )),
            vec![
                "9:17: unknown `source: session` (expected `model`, `system`, `runtime`, `config`, `auth`, `expr` or `lookup`)",
                "11:17: `source: runtime` `value: run_id` gives a string; `b` is a `number`",
                "17:17: `source: system` needs a `value:` (a jq expression over the run's state, like `.input.customer_id`)",
                "20:16: `value` is not a valid jq expression: column 10: `foo/0` is not defined",
                "22:18: default \"3\" is not a number",
                "25:17: hidden parameter `h` needs a `source:`, a `value:` or a `default:`: the model never sends it",
                "29:17: `hidden: false` contradicts the parameter's source: `i` is never shown to the model when its value comes from elsewhere",
                "28:16: unknown `value: token` of `source: auth` (expected `caller`, the identity that started the run, or `tenant`)",
                "31:16: a parameter of type `object` cannot take a value; literals are for string, number, boolean and date",
                "33:14: `key:` goes with `source: lookup`",
                "35:16: `value:` needs a `source:` other than `model`: the model supplies `k`",
                "38:16: `source: lookup` takes `key:` and `table:`, not `value:`",
                "37:17: `source: lookup` needs `key:` (a jq expression giving the key, like `.args.country`)",
                "41:16: `value: {{secret.X}}` of `source: config` must be a configuration name (letters, digits, `_`, `-`, `.`) or `{{config.NAME}}`",
            ]
        );
        // Keys of nested fields, duplicates, a default and `required: true`.
        assert_eq!(
            errors(&tool_with(
                r#"f(o: object, a: string = "x", t: string) -> string"#,
                "    parameters:\n      o:\n        p:\n          q: string\n          source: system\n      a:\n        required: true\n        required: false\n      t:\n        source: lookup\n        key: .k\n        table: x\n"
            )),
            vec![
                "11:11: `source:` applies to a tool's parameters, not to nested fields",
                "14:9: duplicate `required:` (first on line 13)",
                "13:19: `a` has a default, so it is never missing; drop `required: true` or the default",
                "18:16: `table` takes an indented block on the following lines, not a value",
                "16:17: `source: lookup` needs `table:`, an indented block of `key: value` lines",
            ]
        );
        // Where a configured value may go: a body or an MCP call only.
        let config = "    parameters:\n      k:\n        source: config\n        value: K\n";
        // A variant's `{{_secret.KEY}}` is checked against the tool's
        // `SECRET_ACCESS`, at its place, like the tool's own.
        assert_eq!(
            errors(
                "TOOLS:\n  f(k: string) -> string\n    type: http\n    endpoint: /x\n    permission: p\n    repeat_safety: never\n    request_variants:\n      - name: eu\n        default: true\n        headers:\n          X-Otp: \"{{_secret.zzz}}\"\n"
            ),
            vec!["11:19: `{{_secret.zzz}}`: `zzz` is not in the `SECRET_ACCESS: READ` list of `f`"]
        );
        // A request variant may not put it in a URL either.
        for (variant, problem) in [
            (
                "        method: GET\n",
                "a GET request sends its arguments in the URL",
            ),
            ("        endpoint: /x/{k}\n", "it is a path parameter"),
        ] {
            assert_eq!(
                errors(&format!(
                    "TOOLS:\n  f(k: string) -> string\n    type: http\n    endpoint: /x\n    permission: p\n    repeat_safety: never\n{config}    request_variants:\n      - name: eu\n        default: true\n{variant}"
                )),
                vec![format!(
                    "8:7: parameter `k` of `f` has `source: config`, but in request variant `eu` {problem}, which ends up in logs and errors; a configured value goes in a request body or an MCP call only"
                )]
            );
        }
        assert_eq!(
            errors(&format!(
                "TOOLS:\n  f(k: string) -> string\n    type: http\n    endpoint: /x/{{k}}\n    permission: p\n    repeat_safety: never\n{config}"
            )),
            vec![
                "8:7: parameter `k` of `f` has `source: config`, but it is a path parameter, and a URL ends up in logs and errors; a configured value goes in a request body or an MCP call only"
            ]
        );
        assert_eq!(
            errors(&format!(
                "TOOLS:\n  f(k: string) -> string\n    type: http\n    endpoint: /x\n    method: GET\n    permission: p\n    repeat_safety: never\n{config}"
            )),
            vec![
                "9:7: parameter `k` of `f` has `source: config`, but a GET request sends its arguments in the URL, which ends up in logs and errors; a configured value goes in a request body or an MCP call only"
            ]
        );
        assert_eq!(
            errors(&format!(
                "TOOLS:\n  f(k: string) -> string\n    type: http\n    endpoint: /x\n    query_params:\n      key: \"{{{{ k }}}}\"\n    permission: p\n    repeat_safety: never\n{config}"
            )),
            vec![
                "10:7: parameter `k` of `f` has `source: config`, but `query_params:` puts it in the URL, which ends up in logs and errors; a configured value goes in a request body or an MCP call only"
            ]
        );
        assert_eq!(
            errors(&format!(
                "TOOLS:\n  f(k: string) -> string\n    type: workflow\n    workflow_id: w\n    permission: p\n    repeat_safety: never\n{config}"
            )),
            vec![
                "8:7: parameter `k` of `f` has `source: config`, but a `type: workflow` tool's arguments go to a child run, where no worker resolves it; a configured value goes in a request body or an MCP call only"
            ]
        );
        // MCP calls carry it.
        one_tool(&format!(
            "TOOLS:\n  f(k: string) -> string\n    type: mcp\n    server: s\n    permission: p\n{config}"
        ));
    }

    #[test]
    fn async_webhook_tools() {
        // The seed's example, with Belay's two required properties.
        let t = one_tool(
            "TOOLS:\n  generate_report(report_type: string, date_range: string) -> {report_url: string, status: string}\n    description: \"Generate a financial report (processed asynchronously)\"\n    type: async_webhook\n    endpoint: \"https://reports.internal/api/generate\"\n    method: POST\n    callback_url_field: \"callbackUrl\"\n    timeout_seconds: 3600\n    permission: reports.write\n    repeat_safety: idempotent\n",
        );
        assert_eq!(
            t.binding,
            ToolBindingDef::AsyncWebhook {
                endpoint: "https://reports.internal/api/generate".into(),
                method: "POST".into(),
                headers: BTreeMap::new(),
                timeout_ms: DEFAULT_TIMEOUT_MS,
                callback_url_field: "callbackUrl".into(),
                callback_timeout_ms: 3_600_000,
                request: Default::default(),
            }
        );
        // Defaults: callbackUrl, one hour.
        let t = one_tool(
            "TOOLS:\n  r(x: string) -> string\n    type: async_webhook\n    endpoint: /r\n    method: put\n    permission: p\n    repeat_safety: never\n",
        );
        let ToolBindingDef::AsyncWebhook {
            method,
            callback_url_field,
            callback_timeout_ms,
            ..
        } = &t.binding
        else {
            panic!("{:?}", t.binding);
        };
        assert_eq!(
            (
                method.as_str(),
                callback_url_field.as_str(),
                *callback_timeout_ms
            ),
            ("PUT", "callbackUrl", 3_600_000)
        );
        assert_eq!(
            errors(
                "TOOLS:\n  r(x: string) -> string\n    type: async_webhook\n    endpoint: /r\n    method: GET\n    callback_url_field: \"a..b\"\n    timeout_seconds: 0\n    permission: p\n    repeat_safety: never\n"
            ),
            vec![
                "6:25: `callback_url_field` must be a dot-path of field names (letters, digits, `_`, `-`), like `callbackUrl` or `meta.reply_to`, not `a..b`",
                "7:22: `timeout_seconds` must be a whole number of seconds from 1 to 2592000 (30 days), not `0`",
                "5:13: tool `r` is `type: async_webhook`: `method: GET` sends no body to carry the callback URL (expected POST, PUT or PATCH)",
            ]
        );
        assert_eq!(
            errors(
                "TOOLS:\n  r(x: string) -> string\n    type: async_webhook\n    endpoint: /r\n    permission: p\n    repeat_safety: never\n    callback_url_field: x.y\n"
            ),
            vec![
                "2:3: tool `r` is missing `method:` (`POST`, `PUT` or `PATCH`: an async webhook sends a body with the callback URL)",
                "7:25: `callback_url_field: x.y` would overwrite the parameter `x` of `r`; pick a field no parameter uses",
            ]
        );
        assert_eq!(
            errors(
                "TOOLS:\n  r(x: string) -> string\n    type: http\n    endpoint: /r\n    timeout_seconds: 5\n    permission: p\n    repeat_safety: never\n"
            ),
            vec!["2:3: `timeout_seconds:` applies to `type: async_webhook` tools only"]
        );
    }

    #[test]
    fn unsupported_binding_type() {
        assert_eq!(
            errors(
                "TOOLS:\n  search(q: string) -> string\n    type: lambda\n    permission: web.read\n    repeat_safety: idempotent\n"
            ),
            vec!["3:11: binding type `lambda` is not supported yet"]
        );
        assert_eq!(
            errors(
                "TOOLS:\n  search(q: string) -> string\n    type: carrier_pigeon\n    permission: web.read\n    repeat_safety: idempotent\n"
            ),
            vec![
                "3:11: unknown binding type `carrier_pigeon` (expected `http`, `workflow`, `async_webhook`, `mcp` or `sandbox`)"
            ]
        );
    }

    #[test]
    fn mcp_tools() {
        // The seed's example, with Belay's two required properties.
        let t = one_tool(
            "TOOLS:\n  web_search(query: string) -> {results: {title: string, url: string, snippet: string}[]}\n    description: \"Search the web\"\n    type: mcp\n    server: \"brave-search\"\n    permission: web.read\n    repeat_safety: idempotent\n",
        );
        assert_eq!(
            t.binding,
            ToolBindingDef::Mcp {
                server: "brave-search".into(),
                server_tool: "web_search".into(),
                headers: BTreeMap::new(),
                timeout_ms: DEFAULT_TIMEOUT_MS,
            }
        );
        assert_eq!(t.repeat_safety, RepeatSafety::Idempotent);
        // Renamed, with per-call headers holding config placeholders and a timeout.
        let t = one_tool(
            "TOOLS:\n  search(query: string) -> {results: object[]}\n    type: mcp\n    server: brave-search\n    server_tool: brave_web_search\n    headers:\n      Authorization: \"Bearer {{config.BRAVE_TOKEN}}\"\n      X-Tenant: \"{{ config.tenant-id }}-search\"\n    timeout: 5s\n    permission: web.read\n    repeat_safety: never\n",
        );
        assert_eq!(
            t.binding,
            ToolBindingDef::Mcp {
                server: "brave-search".into(),
                server_tool: "brave_web_search".into(),
                headers: BTreeMap::from([
                    (
                        "Authorization".to_owned(),
                        "Bearer {{config.BRAVE_TOKEN}}".to_owned()
                    ),
                    (
                        "X-Tenant".to_owned(),
                        "{{ config.tenant-id }}-search".to_owned()
                    ),
                ]),
                timeout_ms: 5_000,
            }
        );
        // The stored shape is tagged like the other bindings.
        let stored = serde_json::to_value(&t.binding).unwrap();
        assert_eq!(stored["type"], "mcp");
        assert_eq!(
            serde_json::from_value::<ToolBindingDef>(stored).unwrap(),
            t.binding
        );
    }

    #[test]
    fn scrub_secrets_is_on_unless_turned_off() {
        let base = "TOOLS:\n  t(q: string) -> string\n    type: http\n    endpoint: /t\n    permission: p\n    repeat_safety: never\n";
        assert!(one_tool(base).scrub_secrets);
        assert!(!one_tool(&format!("{base}    scrub_secrets: false\n")).scrub_secrets);
        assert_eq!(
            errors(&format!("{base}    scrub_secrets: sometimes\n")),
            vec!["7:20: `scrub_secrets:` must be `true` or `false`, found `sometimes`"]
        );
    }

    #[test]
    fn mcp_tool_errors() {
        // server is required; repeat_safety may come from the server's hints.
        assert_eq!(
            errors("TOOLS:\n  t(q: string) -> string\n    type: mcp\n    permission: p\n"),
            vec![
                "2:3: tool `t` is missing `server:` (the MCP server's logical name, as the worker's MCP configuration names it)",
            ]
        );
        let t = one_tool(
            "TOOLS:\n  t(q: string) -> string\n    type: mcp\n    server: s\n    permission: p\n",
        );
        assert!(t.repeat_safety_from_server);
        assert_eq!(t.repeat_safety, RepeatSafety::Never, "until a run starts");
        assert_eq!(
            errors(
                "TOOLS:\n  t(q: string) -> string\n    type: mcp\n    server: \"a b\"\n    server_tool: x/y\n    endpoint: /t\n    method: POST\n    permission: p\n    repeat_safety: never\n"
            ),
            vec![
                "4:13: `server: a b` must not contain whitespace, control characters or `/`",
                "5:18: `server_tool: x/y` must not contain whitespace, control characters or `/`",
                "2:3: tool `t` is `type: mcp`: `endpoint:` does not apply (the worker's MCP configuration says how to reach the server)",
                "2:3: tool `t` is `type: mcp`: `method:` does not apply (the worker's MCP configuration says how to reach the server)",
            ]
        );
        assert_eq!(
            errors(
                "TOOLS:\n  t(q: string) -> string\n    type: mcp\n    server: s\n    headers:\n      X-User: \"{{session.user}}\"\n      X-Key: \"{{config.K\"\n      Mcp-Session-Id: abc\n    permission: p\n    repeat_safety: never\n"
            ),
            vec![
                "6:7: header `X-User`: placeholder `{{session.user}}` is not supported (only `{{config.NAME}}`, resolved by the worker from its configuration, and `{{_secret.KEY}}` of a key the tool lists in `SECRET_ACCESS`)",
                "7:7: header `X-Key`: a `{{` placeholder is not closed with `}}`",
                "2:3: tool `t`: header `Mcp-Session-Id` is set by the MCP transport itself and cannot be given in `headers:`",
            ]
        );
        assert_eq!(
            errors(
                "TOOLS:\n  t(q: string) -> string\n    type: http\n    endpoint: /t\n    server: s\n    server_tool: u\n    permission: p\n    repeat_safety: never\n"
            ),
            vec![
                "2:3: `server:` applies to `type: mcp` tools only",
                "2:3: `server_tool:` applies to `type: mcp` tools only",
            ]
        );
    }

    #[test]
    fn missing_required_properties() {
        assert_eq!(
            errors("TOOLS:\n  f() -> string\n    description: x\n"),
            vec![
                "2:3: tool `f` is missing `type: http` (how the tool is called)",
                "2:3: tool `f` is missing `permission:` (the one permission a call needs, e.g. `crm.write`)",
                "2:3: tool `f` is missing `repeat_safety:` (`never`, `idempotent` or `reconcile`)",
            ]
        );
        assert_eq!(
            errors(
                "TOOLS:\n  f() -> string\n    type: http\n    permission: a\n    repeat_safety: never\n"
            ),
            vec!["2:3: tool `f` is missing `endpoint:`"]
        );
    }

    #[test]
    fn unknown_and_unsupported_properties() {
        assert_eq!(
            errors(&tool_with(
                "f() -> string",
                "    colour: blue\n    auth_profile: crm\n    provides: [a]\n    wsdl_thing: x\n"
            )),
            vec![
                "7:5: unknown property `colour`",
                "8:5: property `auth_profile` is not supported yet",
                "9:5: property `provides` is not supported yet",
                "10:5: property `wsdl_thing` is not supported yet",
            ]
        );
    }

    #[test]
    fn property_value_errors() {
        assert_eq!(
            errors(&tool_with(
                "f() -> string",
                "    method: FETCH\n    permission: crm write\n    repeat_safety: sometimes\n    description:\n    timeout: 3h\n"
            )),
            vec![
                "7:13: unknown method `FETCH` (expected GET, POST, PUT, PATCH or DELETE)",
                "8:5: duplicate property `permission` (first on line 5)",
                "9:5: duplicate property `repeat_safety` (first on line 6)",
                "10:5: `description` needs a value",
                "11:14: timeout `3h` has an unknown unit (use `ms`, `s` or `m`)",
            ]
        );
        assert_eq!(
            errors(
                "TOOLS:\n  f() -> string\n    type: http\n    endpoint: \"/x\"\n    permission: \"crm write\"\n    repeat_safety: sometimes\n"
            ),
            vec![
                "5:17: permission `crm write` must not contain whitespace",
                "6:20: unknown repeat_safety `sometimes` (expected `never`, `idempotent` or `reconcile`)",
            ]
        );
        assert_eq!(
            errors(&tool_with(
                "f() -> string",
                "    description: \"unterminated\n    timeout: 5s extra\n"
            )),
            vec![
                "7:18: unterminated string",
                "8:14: timeout `5s extra` is not a duration (write e.g. `30s`, `500ms`, `2m`, or a number of milliseconds)"
            ]
        );
        assert_eq!(
            errors(&tool_with(
                "f() -> string",
                "    description: \"a\" b\n    method: |\n"
            )),
            vec![
                "7:21: unexpected text after the closing quote",
                "8:13: block scalars (`|`, `>`) are supported for `code:` only; write the value on one line, in quotes",
            ]
        );
    }

    #[test]
    fn endpoint_errors() {
        assert_eq!(
            errors(
                "TOOLS:\n  f() -> string\n    type: http\n    endpoint: api/x\n    permission: a\n    repeat_safety: never\n"
            ),
            vec!["4:15: endpoint `api/x` must be a path starting with `/` or an http(s) URL",]
        );
    }

    /// Endpoint, headers, timeout and request options of an http binding.
    fn http_parts(
        binding: &ToolBindingDef,
    ) -> (String, BTreeMap<String, String>, u64, HttpRequestOptions) {
        match binding {
            ToolBindingDef::Http {
                endpoint,
                headers,
                timeout_ms,
                request,
                ..
            } => (
                endpoint.clone(),
                headers.clone(),
                *timeout_ms,
                request.clone(),
            ),
            other => panic!("an http tool, not {other:?}"),
        }
    }

    fn http_request(content: &str) -> (String, BTreeMap<String, String>, u64, HttpRequestOptions) {
        http_parts(&one_tool(content).binding)
    }

    #[test]
    fn auth_types() {
        let auth = |extra: &str| http_request(&tool_with("f() -> string", extra)).3.auth;
        assert_eq!(auth(""), HttpAuth::None);
        assert_eq!(auth("    auth: none\n"), HttpAuth::None);
        assert_eq!(
            auth("    auth: bearer\n    auth_config:\n      token: \"{{config.CRM_TOKEN}}\"\n"),
            HttpAuth::Bearer {
                token: "{{config.CRM_TOKEN}}".into()
            }
        );
        assert_eq!(
            auth("    auth: api_key\n    auth_config:\n      key: \"{{config.K}}\"\n"),
            HttpAuth::ApiKey {
                header_name: "X-API-Key".into(),
                key: "{{config.K}}".into()
            }
        );
        assert_eq!(
            auth(
                "    auth: api_key\n    auth_config:\n      header_name: \"X-Partner-Key\"\n      key: \"{{config.K}}\"\n"
            ),
            HttpAuth::ApiKey {
                header_name: "X-Partner-Key".into(),
                key: "{{config.K}}".into()
            }
        );
        assert_eq!(
            auth(
                "    auth: oauth2_client\n    auth_config:\n      token_url: \"https://auth.example.com/oauth/token\"\n      client_id: \"my-client-id\"\n      client_secret: \"{{config.OAUTH_CLIENT_SECRET}}\"\n      scopes: \"read:users write:users\"\n"
            ),
            HttpAuth::Oauth2Client {
                token_url: "https://auth.example.com/oauth/token".into(),
                client_id: "my-client-id".into(),
                client_secret: "{{config.OAUTH_CLIENT_SECRET}}".into(),
                scopes: "read:users write:users".into(),
            }
        );
        assert_eq!(
            auth(
                "    auth: custom\n    auth_config:\n      custom_headers:\n        X-Tenant: acme\n        X-Signature: \"{{config.SIG}}\"\n"
            ),
            HttpAuth::Custom {
                headers: BTreeMap::from([
                    ("X-Signature".into(), "{{config.SIG}}".into()),
                    ("X-Tenant".into(), "acme".into()),
                ])
            }
        );
    }

    #[test]
    fn auth_errors() {
        let errs = |extra: &str| errors(&tool_with("f() -> string", extra));
        assert_eq!(
            errs("    auth: basic\n"),
            vec![
                "7:11: unknown auth `basic` (expected `none`, `bearer`, `api_key`, `oauth2_client` or `custom`)"
            ]
        );
        assert_eq!(
            errs("    auth: oauth2_user\n"),
            vec![
                "7:11: `auth: oauth2_user` is not supported: a Belay run has no end user to authorize; use `oauth2_client`"
            ]
        );
        assert_eq!(
            errs("    auth: saml\n"),
            vec![
                "7:11: `auth: saml` is not supported (the seed itself does not resolve it at run time)"
            ]
        );
        assert_eq!(
            errs("    auth: bearer\n"),
            vec![
                "7:11: `auth: bearer` needs `token:` in `auth_config:` (e.g. `token: \"{{config.NAME}}\"`)"
            ]
        );
        assert_eq!(
            errs(
                "    auth: bearer\n    auth_config:\n      token: \"sk-live-123\"\n      header_name: X\n      colour: red\n      provider: okta\n      token: x\n"
            ),
            vec![
                "9:14: `token` must be a `{{config.NAME}}` placeholder, resolved by the worker: a tools file never holds a credential",
                "10:7: `header_name` does not apply to `auth: bearer` (it takes `token`)",
                "11:7: unknown property `colour` in `auth_config:`",
                "12:7: `provider` is not supported: it names an identity provider for `oauth2_user` or `saml`, which Belay does not run",
                "13:7: duplicate `token` in `auth_config:` (first on line 9)",
                "7:11: `auth: bearer` needs `token:` in `auth_config:` (e.g. `token: \"{{config.NAME}}\"`)",
            ]
        );
        assert_eq!(
            errs(
                "    auth: oauth2_client\n    auth_config:\n      token_url: \"/token\"\n      client_id: \"{{env.ID}}\"\n      client_secret: \"{{config.S}}\"\n      scopes: \"{{config.SCOPES}}\"\n"
            ),
            vec![
                "9:18: `token_url` must be an absolute http(s) URL, not `/token`",
                "10:18: `client_id`: placeholder `{{env.ID}}` is not supported (only `{{config.NAME}}`, resolved by the worker from its configuration)",
                "12:15: `scopes` takes no placeholder (only `token`, `key`, `client_id` and `client_secret` do)",
                "7:11: `auth: oauth2_client` needs `token_url:` in `auth_config:`",
                "7:11: `auth: oauth2_client` needs `client_id:` in `auth_config:`",
            ]
        );
        assert_eq!(
            errs(
                "    auth: api_key\n    auth_config:\n      header_name: \"Bad Name\"\n      key: \"{{config.K\"\n"
            ),
            vec![
                "9:20: `Bad Name` is not a valid header name",
                "10:12: `key`: a `{{` placeholder is not closed with `}}`",
                "7:11: `auth: api_key` needs `key:` in `auth_config:` (e.g. `key: \"{{config.NAME}}\"`)",
            ]
        );
        assert_eq!(
            errs(
                "    auth: custom\n    auth_config:\n      custom_headers:\n        X-A: \"{{secret.a}}\"\n"
            ),
            vec![
                "10:9: header `X-A`: placeholder `{{secret.a}}` is not supported (only `{{config.NAME}}`, resolved by the worker from its configuration)",
            ]
        );
        assert_eq!(
            errs("    auth: custom\n"),
            vec![
                "7:11: `auth: custom` needs `custom_headers:` in `auth_config:` (an indented block of `Header-Name: value` lines)"
            ]
        );
        assert_eq!(
            errs("    auth: none\n    auth_config:\n      token: \"{{config.T}}\"\n"),
            vec![
                "8:5: `auth: none` takes no `auth_config:`",
                "9:7: `token` does not apply to `auth: none` (it takes nothing)",
            ]
        );
        assert_eq!(
            errs("    auth_config:\n      token: \"{{config.T}}\"\n"),
            vec![
                "7:5: `auth_config:` needs an `auth:` beside it (a tool's does not extend the file's `auth:`)"
            ]
        );
        assert_eq!(
            errs("    headers:\n      X-User: \"{{session.user}}\"\n"),
            vec![
                "8:7: header `X-User`: placeholder `{{session.user}}` is not supported (only `{{config.NAME}}`, resolved by the worker from its configuration, and `{{_secret.KEY}}` of a key the tool lists in `SECRET_ACCESS`)"
            ]
        );
        assert_eq!(
            errors(
                "TOOLS:\n  w() -> object\n    type: workflow\n    workflow_id: w\n    auth: none\n    query_params:\n      a: b\n    permission: p\n    repeat_safety: never\n"
            ),
            vec![
                "2:3: `auth:` applies to `type: http` and `type: async_webhook` tools only",
                "2:3: `query_params:` applies to `type: http` and `type: async_webhook` tools only",
            ]
        );
    }

    #[test]
    fn query_params_keep_order_and_repeat_keys() {
        let (_, _, _, request) = http_request(&tool_with(
            "f(tag_a: string, tag_b?: string, limit: number = 10) -> string",
            "    method: GET\n    query_params:\n      limit: \"{{limit}}\"\n      - key: tag\n        value: \"{{tag_a}}\"\n      - key: \"tag\"\n        value: \"{{tag_b}}\"\n      - key: \"filter[kind]\"\n        value: fixed\n      empty:\n",
        ));
        let pairs: Vec<(&str, &str)> = request
            .query_params
            .iter()
            .map(|q| (q.key.as_str(), q.value.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("limit", "{{limit}}"),
                ("tag", "{{tag_a}}"),
                ("tag", "{{tag_b}}"),
                ("filter[kind]", "fixed"),
                ("empty", ""),
            ]
        );
    }

    #[test]
    fn query_params_errors() {
        assert_eq!(
            errors(&tool_with(
                "f(a: string) -> string",
                "    query_params:\n      a: \"{{a}}\"\n      a: x\n      b: \"v-{{nope}}\"\n      c: \"{{config.KEY}}\"\n      - key: k\n      - value: v\n      - key: k\n        value: v\n        other: x\n      - key: \"a b\"\n        value: v\n      what\n      d: \"{{a\"\n"
            )),
            vec![
                "9:7: duplicate query key `a` (first on line 8); to send a key twice, write each as `- key: a` with `value:` under it",
                "10:13: `{{nope}}` in `query_params` is not a parameter of `f`",
                "11:11: `{{config.KEY}}` is not allowed in `query_params`: it takes parameters; credentials go in `headers:` or `auth_config:`",
                "12:7: a `query_params` item needs both `key:` and `value:`",
                "13:7: a `query_params` item needs both `key:` and `value:`",
                "16:9: expected `key:` or `value:` in a `query_params` item of `f`, found `other: x`",
                "17:15: a query key must not be empty or contain whitespace",
                "19:7: expected `key: value` or `- key: K` in `query_params:`, found `what`",
                "20:11: a `{{` placeholder in `query_params` is not closed with `}}`",
            ]
        );
    }

    #[test]
    fn body_properties() {
        let (_, _, _, request) = http_request(&tool_with(
            "f(name: string, age: number) -> string",
            "    body_type: form\n    body_mode: none\n",
        ));
        assert_eq!(request.body_type, BodyType::Form);
        assert_eq!(request.body_mode, BodyMode::None);
        let (_, _, _, request) = http_request(&tool_with(
            "f(name: string, age: number) -> string",
            "    body_type: json\n    body_template: '{\"customer\": {\"name\": \"{{name}}\", \"age\": \"{{age}}\"}, \"note\": \"hi {{name}}\"}'\n",
        ));
        assert_eq!(request.body_type, BodyType::Json);
        assert_eq!(
            request.body_template.as_deref(),
            Some(
                "{\"customer\": {\"name\": \"{{name}}\", \"age\": \"{{age}}\"}, \"note\": \"hi {{name}}\"}"
            )
        );
        let (_, _, _, request) = http_request(&tool_with(
            "f(name: string) -> string",
            "    body_type: text\n    body: \"Hello {{name}}\"\n",
        ));
        assert_eq!(request.body_type, BodyType::Text);
        assert_eq!(request.body_template.as_deref(), Some("Hello {{name}}"));
    }

    #[test]
    fn body_errors() {
        let errs = |sig: &str, extra: &str| errors(&tool_with(sig, extra));
        assert_eq!(
            errs(
                "f() -> string",
                "    body_type: xml\n    body_mode: sometimes\n"
            ),
            vec!["8:16: unknown body_mode `sometimes` (expected `auto` or `none`)",]
        );
        assert_eq!(
            errs("f() -> string", "    body_type: yaml\n"),
            vec!["7:16: unknown body_type `yaml` (expected `json`, `form`, `xml` or `text`)"]
        );
        assert_eq!(
            errs(
                "f(a: string) -> string",
                "    method: GET\n    body_type: form\n    body_template: \"{{a}}\"\n"
            ),
            vec![
                "8:16: `method: GET` sends no body: `body_type:` does not apply",
                "9:21: `method: GET` sends no body: `body_template:` does not apply",
            ]
        );
        assert_eq!(
            errs(
                "f(a: string) -> string",
                "    body_mode: none\n    body_template: '{\"a\": \"{{a}}\"}'\n"
            ),
            vec!["8:21: `body_mode: none` sends no body: drop it or the `body_template:`"]
        );
        assert_eq!(
            errs("f(a: string) -> string", "    body_type: text\n"),
            vec!["7:16: `body_type: text` needs a `body_template:` (the text to send)"]
        );
        assert_eq!(
            errs(
                "f(a: string) -> string",
                "    body_template: '{\"a\": {{a}}}'\n    body: x\n"
            ),
            vec![
                "8:5: duplicate property `body` (first on line 7)",
                "7:21: `body_template` of `f` is not JSON (key must be a string at line 1 column 8); put placeholders inside strings, like `{\"name\": \"{{name}}\"}` (a string that is only a placeholder takes the argument's JSON value)",
            ]
        );
        assert_eq!(
            errs(
                "f(a: string) -> string",
                "    body_type: form\n    body_template: \"a={{a}}&b={{b}}&c={{config.C}}\"\n"
            ),
            vec![
                "8:31: `{{b}}` in `body_template` is not a parameter of `f`",
                "8:39: `{{config.C}}` is not allowed in `body_template`: it takes parameters; credentials go in `headers:` or `auth_config:`",
            ]
        );
        assert_eq!(
            errors(
                "TOOLS:\n  r(a: string) -> string\n    type: async_webhook\n    endpoint: /r\n    method: POST\n    body_type: form\n    body_mode: none\n    permission: p\n    repeat_safety: never\n"
            ),
            vec![
                "6:16: an async webhook sends the callback URL in a JSON body: `body_type` must be `json`",
                "2:3: an async webhook sends the callback URL in its body: `body_mode: none` does not apply",
            ]
        );
        assert_eq!(
            errors(
                "TOOLS:\n  r(a: string) -> string\n    type: async_webhook\n    endpoint: /r\n    method: POST\n    body_template: '[\"{{a}}\"]'\n    permission: p\n    repeat_safety: never\n"
            ),
            vec![
                "6:21: the `body_template` of an async webhook must be a JSON object, to carry the callback URL"
            ]
        );
    }

    #[test]
    fn file_level_defaults() {
        let out = parse(
            r#"TOOLS:
  base_url: "https://api.hotels.com/v1/"
  auth: bearer
  auth_config:
    token: "{{config.HOTELS_TOKEN}}"
  timeout: 5000
  headers:
    Accept: "application/json"
    X-Api-Version: "2024-01"

  search_hotels(destination: string) -> object
    type: http
    endpoint: "/search"
    method: POST
    permission: hotels.read
    repeat_safety: idempotent

  get_hotel(hotel_id: string) -> object
    type: http
    endpoint: "https://other.example.com/hotels/{hotel_id}"
    method: GET
    auth: none
    timeout: 2s
    headers:
      accept: "text/plain"
    permission: hotels.read
    repeat_safety: idempotent

  run_report() -> object
    type: workflow
    workflow_id: report
    permission: hotels.read
    repeat_safety: never
"#,
        );
        assert_eq!(out.errors, vec![]);
        let (endpoint, headers, timeout_ms, request) = http_parts(&out.tools[0].binding);
        assert_eq!(endpoint, "https://api.hotels.com/v1/search");
        assert_eq!(timeout_ms, 5000);
        assert_eq!(headers["Accept"], "application/json");
        assert_eq!(headers["X-Api-Version"], "2024-01");
        assert_eq!(
            request.auth,
            HttpAuth::Bearer {
                token: "{{config.HOTELS_TOKEN}}".into()
            }
        );
        let (endpoint, headers, timeout_ms, request) = http_parts(&out.tools[1].binding);
        assert_eq!(endpoint, "https://other.example.com/hotels/{hotel_id}");
        assert_eq!(timeout_ms, 2000);
        // The tool's `accept` wins over the default `Accept`.
        assert_eq!(
            headers,
            BTreeMap::from([
                ("X-Api-Version".into(), "2024-01".into()),
                ("accept".into(), "text/plain".into()),
            ])
        );
        assert_eq!(request.auth, HttpAuth::None);
        assert!(matches!(
            out.tools[2].binding,
            ToolBindingDef::Workflow { .. }
        ));
    }

    #[test]
    fn rate_limits_and_circuit_breakers() {
        let out = parse(
            r#"TOOLS:
  base_url: "https://api.example.com"
  rate_limit: 5

  search(q: string) -> object
    type: http
    endpoint: "/search"
    permission: p.read
    repeat_safety: idempotent

  slow(q: string) -> object
    type: http
    endpoint: "/slow"
    rate_limit: 0.5
    circuit_breaker:
      threshold: 5
      resetMs: 30000
    permission: p.read
    repeat_safety: idempotent

  inline(q: string) -> object
    type: async_webhook
    endpoint: "/kyc"
    method: POST
    circuit_breaker: {threshold: 2, reset_ms: 1000}
    permission: p.read
    repeat_safety: idempotent

  web(q: string) -> object
    type: mcp
    server: search
    rate_limit: 2
    permission: p.read

  tools(q: string) -> object
    type: mcp
    server: search
    permission: p.read

  report() -> object
    type: workflow
    workflow_id: report
    permission: p.read
    repeat_safety: never
"#,
        );
        assert_eq!(out.errors, vec![]);
        let gates: Vec<(Option<f64>, Option<CircuitBreakerDef>)> = out
            .tools
            .iter()
            .map(|t| (t.rate_limit, t.circuit_breaker))
            .collect();
        let breaker = |threshold, reset_ms| {
            Some(CircuitBreakerDef {
                threshold,
                reset_ms,
            })
        };
        assert_eq!(
            gates,
            vec![
                // The file's default, for HTTP tools without their own.
                (Some(5.0), None),
                (Some(0.5), breaker(5, 30_000)),
                (Some(5.0), breaker(2, 1000)),
                // The file's defaults apply to HTTP requests only.
                (Some(2.0), None),
                (None, None),
                (None, None),
            ]
        );
        // Stored as written, and left out when not declared, so the content
        // hash of a tool without gates did not change when they were added.
        let stored = serde_json::to_value(&out.tools[1]).unwrap();
        assert_eq!(stored["rate_limit"], json!(0.5));
        assert_eq!(
            stored["circuit_breaker"],
            json!({"threshold": 5, "reset_ms": 30000})
        );
        let plain = serde_json::to_value(&out.tools[4]).unwrap();
        assert!(plain.get("rate_limit").is_none() && plain.get("circuit_breaker").is_none());
        let back: ToolDef = serde_json::from_value(stored).unwrap();
        assert_eq!(back, out.tools[1]);
    }

    /// The example of the README's "Rate limits and circuit breakers",
    /// read from the README itself.
    #[test]
    fn readme_rate_limit_example_parses() {
        let readme = include_str!("../../../README.md");
        let example = readme
            .split("## Rate limits and circuit breakers")
            .nth(1)
            .and_then(|section| section.split("```yaml\n").nth(1))
            .and_then(|block| block.split("```").next())
            .expect("the README's example");
        let tool = one_tool(example);
        assert_eq!(tool.rate_limit, Some(2.0));
        assert_eq!(
            tool.circuit_breaker,
            Some(CircuitBreakerDef {
                threshold: 5,
                reset_ms: 30_000
            })
        );
    }

    #[test]
    fn rate_limit_and_circuit_breaker_errors() {
        let with = |extra: &str| errors(&tool_with("f() -> string", extra));
        for bad in [
            "0",
            "-1",
            "1001",
            "1e3",
            "two",
            ".5",
            "5.",
            "NaN",
            "inf",
            "0.000000000000000000001",
            "0.00001",
        ] {
            assert_eq!(
                with(&format!("    rate_limit: {bad}\n")),
                vec![format!(
                    "7:17: `rate_limit` must be a number of calls per second, at least one call a day (0.0000116) and at most 1000 (like `10` or `0.5`), not `{bad}`"
                )],
                "{bad}"
            );
        }
        assert_eq!(
            with(
                "    circuit_breaker:\n      threshold: 0\n      resetMs: 1s\n      half_open: 1\n      threshold: 3\n"
            ),
            vec![
                "8:18: `threshold` must be a whole number of consecutive failures, at least 1, not `0`",
                "9:16: `resetMs` must be a whole number of ms from 1 to 2592000000 (30 days), not `1s`",
                "10:7: unknown property `half_open` in `circuit_breaker:` (expected `threshold`, `resetMs`)",
                "11:7: duplicate `threshold` in `circuit_breaker:` (first on line 8)",
            ]
        );
        assert_eq!(
            with("    circuit_breaker:\n"),
            vec![
                "7:5: `circuit_breaker:` needs `threshold:` (consecutive failures that open the circuit)",
                "7:5: `circuit_breaker:` needs `resetMs:` (ms an open circuit waits before a probe call)",
            ]
        );
        assert_eq!(
            with("    circuit_breaker: {threshold: 3,  resetMs: x}\n"),
            vec![
                "7:47: `resetMs` must be a whole number of ms from 1 to 2592000000 (30 days), not `x`"
            ]
        );
        assert_eq!(
            with("    circuit_breaker: {threshold 3, resetMs: 5}\n"),
            vec![
                "7:23: expected `threshold: N` or `resetMs: MS`",
                "7:5: `circuit_breaker:` needs `threshold:` (consecutive failures that open the circuit)",
            ]
        );
        assert_eq!(
            with("    circuit_breaker: 5\n"),
            vec![
                "7:22: `circuit_breaker` takes `{threshold: N, resetMs: MS}`, or `threshold:` and `resetMs:` on indented lines"
            ]
        );
        assert_eq!(
            errors(
                "TOOLS:\n  f() -> object\n    type: workflow\n    workflow_id: w\n    rate_limit: 1\n    permission: p\n    repeat_safety: never\n"
            ),
            vec![
                "2:3: tool `f` is `type: workflow`: `rate_limit:` applies to tools a worker calls (`type: http`, `async_webhook` or `mcp`)"
            ]
        );
        assert_eq!(
            errors(
                "TOOLS:\n  rate_limit: 0\n  f() -> string\n    type: http\n    endpoint: /x\n    permission: p\n    repeat_safety: never\n  rate_limit: 2\n"
            ),
            vec![
                "2:15: `rate_limit` must be a number of calls per second, at least one call a day (0.0000116) and at most 1000 (like `10` or `0.5`), not `0`",
                "8:3: file-level default `rate_limit:` must come before the first tool",
            ]
        );
    }

    /// The example of the README's "HTTP tools" section, as written there.
    #[test]
    fn readme_parameters_example_parses() {
        // The README's example, taken from the README itself.
        let readme = include_str!("../../../README.md");
        let start = readme.find("TOOLS:\n  charge_card(").unwrap();
        let end = start + readme[start..].find("```").unwrap();
        let t = one_tool(&readme[start..end]);
        let names: Vec<&str> = t.injected.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            ["customer_id", "tenant", "api_key", "cents", "region"]
        );
        assert_eq!(t.model_schema()["required"], json!(["amount"]));
        assert!(t.confirmation.is_some());
    }

    #[test]
    fn readme_http_example_parses() {
        let out = parse(
            r#"TOOLS:
  # File-level defaults: above the first tool, for every HTTP tool of the file.
  base_url: "https://crm.example.com/v1"   # joined to endpoints that are paths
  auth: bearer
  auth_config:
    token: "{{config.CRM_TOKEN}}"          # a credential is always a placeholder
  timeout: 5000                            # ms (or 5s)
  headers:
    X-Api-Version: "2024-01"               # merged; a tool's header of the same name wins

  search_customers(q: string, tags?: string[], limit: number = 20) -> object
    type: http
    endpoint: "/customers/search"          # https://crm.example.com/v1/customers/search
    method: GET
    query_params:                          # in this order; `- key:` items may repeat a key
      q: "{{q}}"
      - key: tag
        value: "{{tags}}"                  # an array repeats the key: tag=a&tag=b
      - key: tag
        value: "vip"
    body_mode: none                        # arguments not named above are not sent
    permission: crm.read
    repeat_safety: idempotent

  create_note(customer_id: string, text: string) -> object
    type: http
    endpoint: "/customers/{customer_id}/notes"
    method: POST
    auth: oauth2_client                    # replaces the file's auth
    auth_config:
      token_url: "https://auth.example.com/oauth/token"
      client_id: "belay-crm"
      client_secret: "{{config.CRM_OAUTH_SECRET}}"
      scopes: "notes:write"
    body_template: '{"note": {"body": "{{text}}", "source": "belay"}}'
    permission: crm.write
    repeat_safety: idempotent
"#,
        );
        assert_eq!(out.errors, vec![]);
        let (endpoint, headers, timeout_ms, request) = http_parts(&out.tools[0].binding);
        assert_eq!(endpoint, "https://crm.example.com/v1/customers/search");
        assert_eq!(headers["X-Api-Version"], "2024-01");
        assert_eq!(timeout_ms, 5000);
        assert_eq!(request.query_params.len(), 3);
        assert_eq!(request.body_mode, BodyMode::None);
        let (_, _, _, request) = http_parts(&out.tools[1].binding);
        assert!(matches!(request.auth, HttpAuth::Oauth2Client { .. }));
    }

    #[test]
    fn file_level_default_errors() {
        assert_eq!(
            errors(
                "TOOLS:\n  base_url: \"api.example.com\"\n  auth_config:\n    token: \"{{config.T}}\"\n  type: http\n  headers:\n    X-A: \"{{session.a}}\"\n  f() -> string\n    type: http\n    endpoint: /x\n    base_url: \"https://x\"\n    permission: p\n    repeat_safety: never\n  timeout: 5s\n"
            ),
            vec![
                "5:3: expected a tool signature `name(params) -> ReturnType`, found `type: http`",
                "2:13: `base_url` must be an absolute http(s) URL, not `api.example.com`",
                "7:5: header `X-A`: placeholder `{{session.a}}` is not supported (only `{{config.NAME}}`, resolved by the worker from its configuration, and `{{_secret.KEY}}` of a key the tool lists in `SECRET_ACCESS`)",
                "3:3: `auth_config:` needs an `auth:` beside it (a tool's does not extend the file's `auth:`)",
                "11:15: `base_url:` is a file-level default: put it under `TOOLS:`, above the first tool",
                "14:3: file-level default `timeout:` must come before the first tool",
            ]
        );
        assert_eq!(
            errors(
                "TOOLS:\n  auth: bearer\n  f() -> string\n    type: http\n    endpoint: /x\n    permission: p\n    repeat_safety: never\n"
            ),
            vec![
                "2:9: `auth: bearer` needs `token:` in `auth_config:` (e.g. `token: \"{{config.NAME}}\"`)"
            ]
        );
    }

    #[test]
    fn stored_bindings_without_request_options_decode_and_encode_unchanged() {
        for old in [
            r#"{"type":"http","endpoint":"/x","method":"GET","headers":{},"timeout_ms":5}"#,
            r#"{"type":"async_webhook","endpoint":"/x","method":"POST","headers":{},"timeout_ms":5,"callback_url_field":"cb","callback_timeout_ms":9}"#,
        ] {
            let binding: ToolBindingDef = serde_json::from_str(old).unwrap();
            assert_eq!(serde_json::to_string(&binding).unwrap(), old);
        }
        let with_auth = ToolBindingDef::Http {
            endpoint: "/x".into(),
            method: "GET".into(),
            headers: BTreeMap::new(),
            timeout_ms: 5,
            request: HttpRequestOptions {
                auth: HttpAuth::Bearer {
                    token: "{{config.T}}".into(),
                },
                ..HttpRequestOptions::default()
            },
        };
        let json = serde_json::to_string(&with_auth).unwrap();
        assert_eq!(
            serde_json::from_str::<ToolBindingDef>(&json).unwrap(),
            with_auth
        );
    }

    #[test]
    fn headers_block() {
        assert_eq!(
            errors(&tool_with(
                "f() -> string",
                "    headers:\n      Accept: a\n      accept: b\n      Bad Name: c\n      X-Line: \"a\\nb\"\n      nocolon\n"
            )),
            vec![
                "9:7: duplicate header `accept` (first on line 8)",
                "10:7: `Bad Name` is not a valid header name",
                "11:15: a header value must not contain line breaks or NUL",
                "12:7: expected `Header-Name: value`, found `nocolon`",
            ]
        );
        assert_eq!(
            errors(&tool_with("f() -> string", "    headers: {Accept: x}\n")),
            vec!["7:14: `headers` takes an indented block on the following lines, not a value"]
        );
        let t = one_tool(&tool_with(
            "f() -> string",
            "    headers:\n      Authorization: \"Bearer {{config.TOKEN}}\"\n      X-Empty:\n",
        ));
        let ToolBindingDef::Http { headers, .. } = t.binding else {
            panic!("an http tool");
        };
        assert_eq!(headers["Authorization"], "Bearer {{config.TOKEN}}");
        assert_eq!(headers["X-Empty"], "");
    }

    #[test]
    fn signature_errors_keep_going() {
        // A broken signature is reported, and the tool's properties and the
        // next tool are still checked.
        assert_eq!(
            errors(
                "TOOLS:\n  f(a: strng) -> string\n    type: http\n    endpoint: /x\n    permission: p\n    repeat_safety: never\n    bogus: 1\n  g() -> string\n    permission: p\n"
            ),
            vec![
                "2:8: unknown type `strng` (expected string, number, boolean, date, object, or `type[]`)",
                "7:5: unknown property `bogus`",
                "8:3: tool `g` is missing `type: http` (how the tool is called)",
                "8:3: tool `g` is missing `repeat_safety:` (`never`, `idempotent` or `reconcile`)",
            ]
        );
        let out = parse("TOOLS:\n  f(a: strng) -> string\n");
        assert_eq!(out.declared.len(), 1);
        assert_eq!(out.declared[0].name, "f");
    }

    #[test]
    fn bad_tool_names() {
        assert_eq!(
            errors(&tool_with("GetCustomer() -> string", "")),
            vec![
                "2:3: tool name `GetCustomer` must be lower case letters, digits and `_`, starting with a letter"
            ]
        );
        let long = "a".repeat(65);
        assert_eq!(
            errors(&tool_with(&format!("{long}() -> string"), "")),
            vec![format!(
                "2:3: tool name `{long}` is longer than 64 characters"
            )]
        );
    }

    #[test]
    fn named_type_in_parameter() {
        assert_eq!(
            errors(&tool_with("f(h: Hotel) -> string", "")),
            vec![
                "2:8: named type `Hotel` is not defined in this file's `TYPES:` section, so it is not allowed in parameters; define it there, or use `object` and declare its fields"
            ]
        );
    }

    #[test]
    fn parameters_block_errors() {
        assert_eq!(
            errors(&tool_with(
                "f(a: string, o: object, i: {x: string}) -> string",
                r#"    parameters:
      zz:
        description: "nope"
      a: string
      a:
        sub: string
      o:
        source: system
        bad: strng
        x?: number
        x: string
        ok: object
      i:
        y: string
      a2
"#
            )),
            vec![
                "8:7: `zz` is not a parameter of `f`",
                "10:10: parameter `a` is typed in the signature; put its details in an indented block below it",
                "11:7: parameter `a` is described twice (first on line 10)",
                "15:14: unknown type `strng` (expected string, number, boolean, date, object, or `type[]`)",
                "17:9: duplicate field `x` (first on line 16)",
                "14:17: `source: system` needs a `value:` (a jq expression over the run's state, like `.input.customer_id`)",
                "20:9: `i` declares its fields inline in the signature; `y` cannot be added here",
                "21:7: expected `parameter_name:` followed by an indented block, found `a2`",
            ]
        );
        assert_eq!(
            errors(&tool_with(
                "f(a: string, o: object) -> string",
                "    parameters:\n      a:\n        sub: string\n        description: \"x\"\n        description: \"y\"\n      o:\n        empty:\n"
            )),
            vec![
                "9:9: `a` is not an object: nested field `sub` needs type `object` or `object[]`",
                "11:9: `a` already has a description",
                "13:9: field `empty` needs a type (`empty: string`) or an indented block of fields",
            ]
        );
    }

    #[test]
    fn file_structure_errors() {
        assert_eq!(
            errors(""),
            vec!["1:1: no `TOOLS:` section: the file declares no tools"]
        );
        assert_eq!(
            errors("# only a comment\n"),
            vec!["1:1: no `TOOLS:` section: the file declares no tools"]
        );
        assert_eq!(
            errors("AGENT: x\nTOOLS: y\n"),
            vec![
                "1:1: expected `TOOLS:`, found `AGENT: x`; a tools file holds a `TOOLS:` section and, optionally, a `TYPES:` section",
                "2:1: `TOOLS:` takes an indented block of tools, not a value on the same line",
            ]
        );
        assert_eq!(
            errors("TOOLS:\n  rate_limit: 3\n  file: \"./a.tools.abl\" [a]\n  what is this\n"),
            vec![
                "4:3: expected a tool signature `name(params) -> ReturnType`, found `what is this`",
            ]
        );
        assert_eq!(
            errors("TOOLS:\n\tf() -> string\n"),
            vec!["2:1: indentation must be spaces (found a tab or other whitespace)"]
        );
        // Only a section header is fine: a file may be emptied out.
        assert!(errors("TOOLS:\n").is_empty());
    }

    #[test]
    fn file_imports() {
        let out = parse(
            "TOOLS:\n  file: \"./a.tools.abl\" [x, y]\n  f() -> string\n    type: http\n    endpoint: /f\n    permission: p\n    repeat_safety: never\n  file: b.tools.abl\n",
        );
        assert_eq!(out.errors, vec![]);
        assert_eq!(out.tools.len(), 1);
        let imports: Vec<(&str, u32, u32, Option<usize>)> = out
            .imports
            .iter()
            .map(|i| {
                (
                    i.path.as_str(),
                    i.line,
                    i.column,
                    i.names.as_ref().map(Vec::len),
                )
            })
            .collect();
        assert_eq!(
            imports,
            vec![
                ("./a.tools.abl", 2, 9, Some(2)),
                ("b.tools.abl", 8, 9, None)
            ]
        );
        assert_eq!(
            errors("TOOLS:\n  file:\n  file: a.tools.abl [x\n  file: a.tools.abl\n    [x]\n"),
            vec![
                "2:8: `file:` needs a path, such as `file: \"./crm.tools.abl\" [get_customer]`",
                "3:21: `[` without a closing `]`",
                "5:5: `file:` takes no indented block; list the tools in brackets: `file: \"./a.tools.abl\" [tool, ...]`",
            ]
        );
    }

    #[test]
    fn inconsistent_indentation() {
        assert_eq!(
            errors("TOOLS:\n    f() -> string\n      type: http\n  g() -> string\n"),
            vec![
                "4:3: inconsistent indentation: 2 spaces here, 4 on the lines above at this level",
                "2:5: tool `f` is missing `endpoint:`",
                "2:5: tool `f` is missing `permission:` (the one permission a call needs, e.g. `crm.write`)",
                "2:5: tool `f` is missing `repeat_safety:` (`never`, `idempotent` or `reconcile`)",
                "4:3: tool `g` is missing `type: http` (how the tool is called)",
                "4:3: tool `g` is missing `permission:` (the one permission a call needs, e.g. `crm.write`)",
                "4:3: tool `g` is missing `repeat_safety:` (`never`, `idempotent` or `reconcile`)",
            ]
        );
    }

    #[test]
    fn deep_indentation_is_refused() {
        let mut content = String::from("TOOLS:\n");
        for i in 1..200 {
            content.push_str(&" ".repeat(i));
            content.push_str("x:\n");
        }
        let e = errors(&content);
        assert!(
            e.contains(&"65:65: indentation is nested too deeply".to_string()),
            "{e:?}"
        );
    }

    #[test]
    fn comments_and_quotes() {
        assert_eq!(strip_comment("a: b # c"), "a: b ");
        assert_eq!(strip_comment("# c"), "");
        assert_eq!(
            strip_comment("endpoint: https://x/#frag"),
            "endpoint: https://x/#frag"
        );
        assert_eq!(strip_comment("d: \"a # b\" # c"), "d: \"a # b\" ");
        assert_eq!(strip_comment("d: 'it''s # x' # c"), "d: 'it''s # x' ");
        assert_eq!(strip_comment("d: don't # c"), "d: don't ");
        assert_eq!(strip_comment(r#"d: "a \" # b" # c"#), r#"d: "a \" # b" "#);
        let t = one_tool(&tool_with("f() -> string", "    description: 'It''s #1'\n"));
        assert_eq!(t.description, "It's #1");
    }

    #[test]
    fn crlf_and_bom() {
        let content = tool_with("f() -> string", "").replace('\n', "\r\n");
        let t = one_tool(&format!("\u{feff}{content}"));
        assert_eq!(t.permission, "p.read");
    }

    #[test]
    fn seed_examples_parse() {
        // Seed tools plus the two Belay properties.
        let out = parse(
            r#"TOOLS:
  search_hotels(destination: string, checkin: date, checkout: date) -> {hotels: {id: string, name: string, price: number, rating: number}[], total: number}
    description: "Search available hotels"
    type: http
    endpoint: "/search"
    method: POST
    permission: hotels.read
    repeat_safety: idempotent

  get_hotel_reviews(hotel_id: string, limit: number = 10) -> Review[]
    type: http
    endpoint: "/hotels/{hotel_id}/reviews"
    method: GET
    description: "Get reviews for a hotel"
    permission: hotels.read
    repeat_safety: idempotent

  bulk_lookup(ids: string[]) -> {results: object[]}
    description: "Look up multiple records by ID"
    type: http
    endpoint: "https://api.example.com/v1/lookup"
    timeout: 10000
    permission: records.read
    repeat_safety: idempotent
"#,
        );
        assert_eq!(out.errors, vec![]);
        let names: Vec<&str> = out.tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["search_hotels", "get_hotel_reviews", "bulk_lookup"]);
        assert_eq!(
            out.tools[0].input_schema["properties"]["checkin"],
            json!({"type": "string", "format": "date"})
        );
        assert_eq!(
            out.tools[0].input_schema["required"],
            json!(["destination", "checkin", "checkout"])
        );
        assert_eq!(out.tools[1].source_line, 10);
        assert_eq!(out.tools[1].input_schema["required"], json!(["hotel_id"]));
        assert_eq!(
            out.tools[1].output_schema,
            json!({"type": "array", "items": {"title": "Review"}})
        );
        assert_eq!(
            out.tools[2].output_schema,
            json!({
                "type": "object",
                "properties": {"results": {"type": "array", "items": {"type": "object"}}},
                "required": ["results"],
                "additionalProperties": true
            })
        );
        let ToolBindingDef::Http { timeout_ms, .. } = &out.tools[2].binding else {
            panic!("an http tool");
        };
        assert_eq!(*timeout_ms, 10_000);
        // Every generated schema is itself a valid JSON Schema.
        for t in &out.tools {
            super::super::schema::compile(&t.input_schema).unwrap();
            super::super::schema::compile(&t.output_schema).unwrap();
        }
    }

    #[test]
    fn input_schema_validates_arguments() {
        let t = one_tool(&tool_with(
            "f(email: string, plan: string = \"starter\", when?: date) -> string",
            "",
        ));
        let v = |args: Value| super::super::validate_json(&t.input_schema, &args);
        assert_eq!(v(json!({"email": "a@b.c"})), Ok(()));
        assert_eq!(
            v(json!({"email": "a@b.c", "plan": "pro", "when": "2026-01-31"})),
            Ok(())
        );
        assert_eq!(
            v(json!({"plan": 3, "extra": true, "when": "soon"})).unwrap_err(),
            vec![
                "/plan: 3 is not of type \"string\"".to_string(),
                "/when: \"soon\" is not a \"date\"".to_string(),
                "/: Additional properties are not allowed ('extra' was unexpected)".to_string(),
                "/: \"email\" is a required property".to_string(),
            ]
        );
    }
}
