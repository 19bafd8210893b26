//! The `TOOLS:` section, item by item: the file's shared defaults (the
//! lines above the first tool), `file:` imports, and the tools themselves
//! (`tool.rs`); anything else under `TOOLS:` is refused.

use crate::imports::parse_import_value;

use super::FILE_DEFAULTS;
use super::auth::props_auth;
use super::lines::{Block, Cx, Line, head, split_key};
use super::props::FileDefaults;
use super::read_props::read_props;
use super::tool::parse_tool;

/// One item under `TOOLS:`: a tool, or something the seed allows there that
/// Belay does not.
pub(super) fn parse_item(block: &Block, defaults: &FileDefaults, cx: &mut Cx<'_>) {
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

/// Reads the lines before the first tool: [`FILE_DEFAULTS`] (read by the
/// same code as a tool's properties), anything else refused.
pub(super) fn read_file_defaults(items: &[Block], cx: &mut Cx<'_>) -> FileDefaults {
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

pub(super) fn is_signature_start(text: &str) -> bool {
    let rest = text.trim_start_matches(|c: char| c.is_ascii_alphanumeric() || c == '_');
    rest.len() < text.len() && rest.trim_start().starts_with('(')
}
