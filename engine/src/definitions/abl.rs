//! Parser of `.tools.abl` files: a `TOOLS:` section of tool signatures, each
//! followed by indented properties (seed: `seeds/abl-tools.md`), plus Belay's
//! `permission:` and `repeat_safety:`.
//!
//! The format is line-oriented: lines are grouped into a tree by indentation,
//! then each tool is read from its subtree. Errors are collected, not
//! returned at the first one, so an author sees every problem of a file at
//! once; a tool with any error is left out of the output.

use std::collections::{BTreeMap, BTreeSet};

use super::model::{ChildMode, ConfirmationDef, RepeatSafety, ToolBindingDef, ToolDef};
use super::signature::{
    self, Direction, Field, MAX_TYPE_DEPTH, Prim, Signature, TypeExpr, check_input_type,
    parse_field_decl, parse_signature,
};
use super::{DefinitionError, NameAt, check_name, check_permission};

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
const SEED_BINDING_TYPES: &[&str] = &["sandbox", "lambda", "searchai", "table"];

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
    "auth",
    "auth_config",
    "auth_profile",
    "tls_profile",
    "auth_jit",
    "consent",
    "connection",
    "retry",
    "retry_delay",
    "retry_policy",
    "query_params",
    "body_type",
    "body_mode",
    "body_template",
    "body",
    "body_schema",
    "use_body_schema",
    "request_variants",
    "rate_limit",
    "circuit_breaker",
    "protocol",
    "soap_version",
    "soap_action",
    "on_soap_fault",
    "wsdl_asset",
    "wsdl_operation",
    "wsdl_version",
    "hints",
    "effect",
    "provides",
    "compaction",
    "process",
    "pii_access",
    "scrub_secrets",
    "context_access",
    "store_result",
    "RESULT_SECRETS",
    "SECRET_ACCESS",
    "on_result",
    "on_error",
    "code",
    "runtime",
    "memory_mb",
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

/// File-level defaults of the seed's "Tool file format".
const SEED_FILE_DEFAULTS: &[&str] = &[
    "base_url",
    "auth",
    "timeout",
    "retry",
    "retry_delay",
    "rate_limit",
    "headers",
];

/// Enrichment keys of the seed's "Parameter enrichment and sources" table,
/// other than `description` (which is supported).
const SEED_ENRICHMENT_KEYS: &[&str] = &[
    "required",
    "default",
    "source",
    "value",
    "key",
    "table",
    "hidden",
    "visibility",
    "properties",
    "items",
];

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
    /// Every problem found.
    pub errors: Vec<DefinitionError>,
}

/// Parse one `.tools.abl` file.
pub(super) fn parse_tools_file(file: &str, content: &str) -> AblOutput {
    let mut cx = Cx {
        file,
        out: AblOutput::default(),
    };
    let lines = split_lines(content, &mut cx);
    let mut lines = lines.into_iter().peekable();
    let blocks = build_level(&mut lines, None, 0, &mut cx);
    let mut sections = 0;
    for block in &blocks {
        let line = &block.line;
        if line.text == "TOOLS:" {
            sections += 1;
            for item in &block.children {
                parse_item(item, &mut cx);
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
                    "expected `TOOLS:`, found `{}`; a tools file holds only a `TOOLS:` section",
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
    for (i, raw) in content.split('\n').enumerate() {
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
        lines.push(Line {
            no,
            indent: leading.len(),
            text: stripped.trim().to_string(),
        });
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
        _ if matches!(value, "|" | "|-" | "|+" | ">" | ">-" | ">+") => Err((
            col,
            "block scalars (`|`, `>`) are not supported; write the value on one line, in quotes"
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
fn parse_item(block: &Block, cx: &mut Cx<'_>) {
    let line = &block.line;
    if is_signature_start(&line.text) {
        parse_tool(block, cx);
        return;
    }
    let message = match split_key(line) {
        Some(kv) if kv.key == "file" => {
            "importing tools with `file:` is not supported; put every tools file in the bundle"
                .to_string()
        }
        Some(kv) if SEED_FILE_DEFAULTS.contains(&kv.key) => format!(
            "file-level default `{}:` is not supported yet; set it on each tool",
            kv.key
        ),
        _ => format!(
            "expected a tool signature `name(params) -> ReturnType`, found `{}`",
            head(&line.text)
        ),
    };
    cx.error(line.no, line.col(), message);
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
    /// `headers:` lines whose value holds a `{{...}}` placeholder: (line,
    /// column, header name, raw value), checked once the binding type is known.
    header_placeholders: Vec<(u32, u32, String, String)>,
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
    /// `confirmation:` with `require: always`: immutable params (with their
    /// line and column) and the approver grant, if given.
    confirmation: Option<(Vec<(String, u32, u32)>, Option<String>)>,
    parameters: Option<&'b Block>,
    /// Every property written, valid or not: an invalid `permission:` is
    /// reported once, as invalid, not a second time as missing.
    present: BTreeSet<String>,
}

fn parse_tool(block: &Block, cx: &mut Cx<'_>) {
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
    if let Some(sig) = &signature {
        for p in &sig.params {
            if let Err(e) = check_input_type(&p.ty) {
                cx.error(line.no, e.column, e.message);
            }
        }
    }

    let mut props = read_props(block, cx);

    if let Some(sig) = &mut signature
        && let Some(params_block) = props.parameters
    {
        apply_parameters(params_block, &mut sig.params, &name, cx);
    }

    if let (Some(sig), Some((immutable, _))) = (&signature, &props.confirmation) {
        for (param, pline, pcol) in immutable {
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
    if props.binding_type == Some(BindingType::Workflow) {
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
    if from_server {
        props.repeat_safety = Some(RepeatSafety::Never);
    } else if !props.present.contains("repeat_safety") {
        missing(
            cx,
            "`repeat_safety:` (`never`, `idempotent` or `reconcile`)",
        );
    }
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
    let binding = match (props.binding_type, props.endpoint, props.workflow_id) {
        (Some(BindingType::Mcp), _, _) => {
            let Some(server) = props.server else {
                return;
            };
            ToolBindingDef::Mcp {
                server,
                server_tool: props.server_tool.unwrap_or_else(|| sig.name.clone()),
                headers: props.headers,
                timeout_ms: props.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS),
            }
        }
        (Some(BindingType::Http), Some((endpoint, _, _)), _) => ToolBindingDef::Http {
            endpoint,
            method: props.method.unwrap_or_else(|| "POST".to_string()),
            headers: props.headers,
            timeout_ms: props.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS),
        },
        (Some(BindingType::Workflow), _, Some(workflow)) => ToolBindingDef::Workflow {
            workflow: workflow.name,
            mode: props.mode.unwrap_or_default(),
            timeout_ms: props.workflow_timeout_ms,
            param_mapping: props.param_mapping,
        },
        (Some(BindingType::AsyncWebhook), Some((endpoint, _, _)), _) => {
            ToolBindingDef::AsyncWebhook {
                endpoint,
                method: props.method.unwrap_or_else(|| "POST".to_string()),
                headers: props.headers,
                timeout_ms: props.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS),
                callback_url_field: props
                    .callback_url_field
                    .map(|(f, _, _)| f)
                    .unwrap_or_else(|| DEFAULT_CALLBACK_URL_FIELD.to_string()),
                callback_timeout_ms: props
                    .callback_timeout_seconds
                    .unwrap_or(DEFAULT_CALLBACK_TIMEOUT_SECONDS)
                    * 1000,
            }
        }
        _ => return,
    };
    let confirmation = props
        .confirmation
        .map(|(immutable, grant)| ConfirmationDef {
            immutable_params: immutable.into_iter().map(|(p, _, _)| p).collect(),
            approver_grant: grant.unwrap_or_else(|| permission.clone()),
        });
    cx.out.tools.push(ToolDef {
        name: sig.name,
        description: props.description.unwrap_or_default(),
        input_schema: signature::input_schema(&sig.params),
        output_schema: signature::type_schema(&sig.returns, Direction::Output),
        permission,
        repeat_safety,
        repeat_safety_from_server: from_server,
        scrub_secrets: props.scrub_secrets.unwrap_or(true),
        reconcile_with: props.reconcile_with.map(|p| p.name),
        binding,
        confirmation,
        source_file: cx.file.to_string(),
        source_line: line.no,
    });
}

/// The `type: mcp` rules: `endpoint:` and `method:` do not apply (the
/// worker's configuration says how to reach the server), header values hold
/// only `{{config.NAME}}` placeholders and no header the MCP transport sets
/// itself; `server:` and `server_tool:` belong to `type: mcp` tools only.
fn check_mcp_props(props: &Props<'_>, name: &str, line: &Line, cx: &mut Cx<'_>) {
    if props.binding_type != Some(BindingType::Mcp) {
        for key in ["server", "server_tool"] {
            if props.present.contains(key) {
                cx.error(
                    line.no,
                    line.col(),
                    format!("`{key}:` applies to `type: mcp` tools only"),
                );
            }
        }
        return;
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
    for (hline, hcol, header, value) in &props.header_placeholders {
        if let Some(message) = check_config_placeholders(value) {
            cx.error(*hline, *hcol, format!("header `{header}`: {message}"));
        }
    }
}

/// `None` when every `{{...}}` in `value` is `{{config.NAME}}` (NAME of
/// letters, digits, `_`, `-`, `.`), else what is wrong.
fn check_config_placeholders(value: &str) -> Option<String> {
    let mut rest = value;
    while let Some(start) = rest.find("{{") {
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else {
            return Some("a `{{` placeholder is not closed with `}}`".into());
        };
        let inner = after[..end].trim();
        let valid = inner.strip_prefix("config.").is_some_and(|n| {
            !n.is_empty()
                && n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        });
        if !valid {
            return Some(format!(
                "placeholder `{{{{{inner}}}}}` is not supported (only `{{{{config.NAME}}}}`, resolved by the worker from its MCP configuration)"
            ));
        }
        rest = &after[end + 2..];
    }
    None
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

fn read_props<'b>(block: &'b Block, cx: &mut Cx<'_>) -> Props<'b> {
    let mut props = Props::default();
    let mut seen: BTreeMap<&str, u32> = BTreeMap::new();
    for child in &block.children {
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
        if let Some(first) = seen.insert(kv.key, line.no) {
            cx.error(
                line.no,
                kv.key_col,
                format!("duplicate property `{}` (first on line {first})", kv.key),
            );
            continue;
        }
        props.present.insert(kv.key.to_string());
        match kv.key {
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
                    } else {
                        props.binding_type = Some(BindingType::Unsupported);
                        let message = if SEED_BINDING_TYPES.contains(&s.as_str()) {
                            format!("binding type `{s}` is not supported yet")
                        } else {
                            format!(
                                "unknown binding type `{s}` (expected `http`, `workflow`, `async_webhook` or `mcp`)"
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
                    if let Some(message) = check_endpoint(&s) {
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
                if let Some(s) = scalar(child, &kv, cx) {
                    let safety = match s.as_str() {
                        "never" => Some(RepeatSafety::Never),
                        "idempotent" => Some(RepeatSafety::Idempotent),
                        "reconcile" => Some(RepeatSafety::Reconcile),
                        _ => None,
                    };
                    match safety {
                        Some(r) => props.repeat_safety = Some(r),
                        None => cx.error(
                            line.no,
                            kv.value_col,
                            format!(
                                "unknown repeat_safety `{s}` (expected `never`, `idempotent` or `reconcile`)"
                            ),
                        ),
                    }
                }
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
                    for header in &child.children {
                        if let Some((name, value)) = header.line.text.split_once(':')
                            && value.contains("{{")
                        {
                            props.header_placeholders.push((
                                header.line.no,
                                header.line.col(),
                                name.trim_end().to_owned(),
                                value.trim().to_owned(),
                            ));
                        }
                    }
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
                if let Some(s) = scalar(child, &kv, cx) {
                    match s.as_str() {
                        "sync" => props.mode = Some(ChildMode::Sync),
                        "async" => props.mode = Some(ChildMode::Async),
                        _ => cx.error(
                            line.no,
                            kv.value_col,
                            format!("unknown mode `{s}` (expected `sync` or `async`)"),
                        ),
                    }
                }
            }
            "timeout_ms" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    match s.parse::<u64>() {
                        Ok(ms) if ms >= 1 => props.workflow_timeout_ms = Some(ms),
                        _ => cx.error(
                            line.no,
                            kv.value_col,
                            format!(
                                "`timeout_ms` must be a whole number of ms, at least 1, not `{s}`"
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

/// The `confirmation:` block: `require: always | never` (`when_side_effects`
/// needs `effect:`, which Belay does not read yet, and the `consent_*`
/// properties are not supported: both are refused, not ignored),
/// `immutable_params: [a, b]`, `approver_grant: perm`. `None` for `never`.
#[allow(clippy::type_complexity)]
fn read_confirmation(
    block: &Block,
    cx: &mut Cx<'_>,
) -> Option<(Vec<(String, u32, u32)>, Option<String>)> {
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
                    "always" | "never" => require = Some(v),
                    "when_side_effects" => cx.error(
                        line.no,
                        kv.value_col,
                        "`require: when_side_effects` needs the tool's `effect:`, which Belay does not read yet; use `always` or `never`",
                    ),
                    other => cx.error(
                        line.no,
                        kv.value_col,
                        format!("unknown `require: {other}` (expected `always` or `never`)"),
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
        Some("always") => Some((immutable, grant)),
        Some(_) => None,
        None => {
            cx.error(
                block.line.no,
                block.line.col(),
                "`confirmation:` needs `require: always` or `require: never`",
            );
            None
        }
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
        // RFC 9110 token characters.
        let is_tchar = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
        if name.is_empty() || !name.chars().all(is_tchar) {
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

/// Apply a tool's `parameters:` block to its signature parameters.
fn apply_parameters(block: &Block, params: &mut [Field], tool: &str, cx: &mut Cx<'_>) {
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
        enrich_field(param, &child.children, 1, cx);
    }
}

/// Apply an indented block to a parameter or field: `description:`, and
/// nested fields when it is an `object` / `object[]`.
fn enrich_field(field: &mut Field, blocks: &[Block], depth: usize, cx: &mut Cx<'_>) {
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
        if SEED_ENRICHMENT_KEYS.contains(&kv.key) && !declares_field {
            cx.error(
                line.no,
                kv.key_col,
                format!("parameter setting `{}:` is not supported yet", kv.key),
            );
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
        if let Err(e) = check_input_type(&nested.ty) {
            cx.error(line.no, e.column, e.message);
            continue;
        }
        if let Some(first) = seen.insert(kv.key, line.no) {
            cx.error(
                line.no,
                kv.key_col,
                format!("duplicate field `{}` (first on line {first})", kv.key),
            );
            continue;
        }
        if !child.children.is_empty() {
            enrich_field(&mut nested, &child.children, depth + 1, cx);
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
                "TOOLS:\n  f(a: string) -> string\n    type: http\n    endpoint: /f\n    confirmation:\n      require: when_side_effects\n      immutable_params: [b]\n      consent_scope: [x]\n    permission: p\n    repeat_safety: never\n"
            ),
            vec![
                "6:16: `require: when_side_effects` needs the tool's `effect:`, which Belay does not read yet; use `always` or `never`",
                "8:7: `consent_scope` is not supported yet: Belay asks an approver, not the end user in a conversation",
                "5:5: `confirmation:` needs `require: always` or `require: never`",
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
                "TOOLS:\n  search(q: string) -> string\n    type: sandbox\n    permission: web.read\n    repeat_safety: idempotent\n"
            ),
            vec!["3:11: binding type `sandbox` is not supported yet"]
        );
        assert_eq!(
            errors(
                "TOOLS:\n  search(q: string) -> string\n    type: carrier_pigeon\n    permission: web.read\n    repeat_safety: idempotent\n"
            ),
            vec![
                "3:11: unknown binding type `carrier_pigeon` (expected `http`, `workflow`, `async_webhook` or `mcp`)"
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
                "2:3: tool `t`: header `Mcp-Session-Id` is set by the MCP transport itself and cannot be given in `headers:`",
                "6:7: header `X-User`: placeholder `{{session.user}}` is not supported (only `{{config.NAME}}`, resolved by the worker from its MCP configuration)",
                "7:7: header `X-Key`: a `{{` placeholder is not closed with `}}`",
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
                "    colour: blue\n    auth: bearer\n    hints:\n      cacheable: true\n    wsdl_thing: x\n"
            )),
            vec![
                "7:5: unknown property `colour`",
                "8:5: property `auth` is not supported yet",
                "9:5: property `hints` is not supported yet",
                "11:5: property `wsdl_thing` is not supported yet",
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
                "8:13: block scalars (`|`, `>`) are not supported; write the value on one line, in quotes",
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
                "2:8: named type `Hotel` is not allowed in parameters; use `object` and declare its fields"
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
                "14:9: parameter setting `source:` is not supported yet",
                "15:14: unknown type `strng` (expected string, number, boolean, date, object, or `type[]`)",
                "17:9: duplicate field `x` (first on line 16)",
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
                "1:1: expected `TOOLS:`, found `AGENT: x`; a tools file holds only a `TOOLS:` section",
                "2:1: `TOOLS:` takes an indented block of tools, not a value on the same line",
            ]
        );
        assert_eq!(
            errors(
                "TOOLS:\n  base_url: \"https://x\"\n  file: \"./a.tools.abl\" [a]\n  what is this\n"
            ),
            vec![
                "2:3: file-level default `base_url:` is not supported yet; set it on each tool",
                "3:3: importing tools with `file:` is not supported; put every tools file in the bundle",
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
