//! The rules of `type: mcp` tools: what does not apply to them
//! (`endpoint:`, `method:`, headers the MCP transport sets itself), the
//! properties only they take, and `server:` / `server_tool:` names.
//! `resource:` is read in `mcp_resource.rs`, `sampling:` in `sampling.rs`.

use super::lines::{Cx, Line};
use super::props::{BindingType, Props};
use super::{MAX_MCP_NAME_CHARS, MCP_RESERVED_HEADERS};

/// The `type: mcp` rules: `endpoint:` and `method:` do not apply (the
/// worker's configuration says how to reach the server), header values hold
/// only `{{config.NAME}}` placeholders and no header the MCP transport sets
/// itself; `server:` and `server_tool:` belong to `type: mcp` tools only.
pub(super) fn check_mcp_props(props: &Props<'_>, name: &str, line: &Line, cx: &mut Cx<'_>) {
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

/// `None` when `value` is a usable `server:` / `server_tool:` name: 1 to
/// [`MAX_MCP_NAME_CHARS`] characters without whitespace, control characters
/// or `/`.
pub(super) fn check_mcp_name(key: &str, value: &str) -> Option<String> {
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
