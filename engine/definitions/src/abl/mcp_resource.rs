//! `resource:` of a `type: mcp` tool: a call reads one resource of the MCP
//! server (`resources/read`) instead of calling a tool, and the resource's
//! contents are the call's result (recorded, scrubbed and cut for the model
//! like any tool result, so a replay never reads it again).
//!
//! ```text
//! read_doc(doc_id: string) -> object
//!   type: mcp
//!   server: docs
//!   resource: "docs://articles/{doc_id}"
//!   permission: docs.read
//! ```
//!
//! Rules, checked when the file is parsed:
//! - the value is a URI (`scheme:…`) or a URI template of RFC 6570 level 1:
//!   each `{name}` is a required parameter of the tool of a primitive type
//!   (string, number, boolean, date), filled from the call's arguments and
//!   percent-encoded by the worker; operators (`{+x}`, `{?x}`, …) are not
//!   supported;
//! - `server_tool:` and `headers:` do not apply;
//! - without `repeat_safety:` the tool is `idempotent` (a read changes
//!   nothing), not left to the server's hints.

use std::collections::BTreeSet;

use super::super::model::{RepeatSafety, ToolBindingDef};
use super::super::signature::{Prim, Signature, TypeExpr};

/// Longest `resource:` value accepted, in characters.
const MAX_TEMPLATE_CHARS: usize = 2048;

/// The binding of a tool with `resource:`, or the message of the first
/// problem (reported at the value's line and column).
pub(super) fn binding(
    server: String,
    template: String,
    timeout_ms: u64,
    sig: &Signature,
    present: &BTreeSet<String>,
    repeat_safety: Option<RepeatSafety>,
) -> Result<ToolBindingDef, String> {
    for key in ["server_tool", "headers"] {
        if present.contains(key) {
            return Err(format!(
                "tool `{}` reads a resource (`resource:`): `{key}:` does not apply",
                sig.name
            ));
        }
    }
    if repeat_safety == Some(RepeatSafety::Reconcile) {
        return Err(format!(
            "tool `{}` reads a resource (`resource:`): `repeat_safety: reconcile` does not apply, a read changes nothing to reconcile (use `idempotent`, the default, or `never`)",
            sig.name
        ));
    }
    check_template(&template, sig)?;
    // Every parameter fills the URI: one that does not would be a value
    // the model supplies for nothing.
    let used = variables(&template)?;
    if let Some(unused) = sig.params.iter().find(|p| !used.contains(&p.name)) {
        return Err(format!(
            "`resource:` does not use parameter `{}` of `{}`: a resource tool's parameters only fill `{{name}}` expressions of its URI",
            unused.name, sig.name
        ));
    }
    Ok(ToolBindingDef::McpResource {
        server,
        uri_template: template,
        timeout_ms,
    })
}

/// The names of a template's `{name}` expressions, in order.
///
/// # Errors
/// A message for an unclosed or nested brace, an empty name or an
/// operator.
pub(super) fn variables(template: &str) -> Result<Vec<String>, String> {
    let mut names = Vec::new();
    let mut open: Option<String> = None;
    for c in template.chars() {
        match (c, &mut open) {
            ('{', None) => open = Some(String::new()),
            ('{', Some(_)) => return Err("`{` inside a `{…}` expression".into()),
            ('}', None) => return Err("`}` without a matching `{`".into()),
            ('}', Some(name)) => {
                let name = std::mem::take(name);
                open = None;
                if name.is_empty() {
                    return Err("an empty `{}` expression".into());
                }
                if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                    return Err(format!(
                        "`{{{name}}}`: only simple `{{name}}` expressions are supported (RFC 6570 level 1)"
                    ));
                }
                names.push(name);
            }
            (c, Some(name)) => name.push(c),
            (_, None) => {}
        }
    }
    if open.is_some() {
        return Err("unclosed `{`".into());
    }
    Ok(names)
}

fn check_template(template: &str, sig: &Signature) -> Result<(), String> {
    let chars = template.chars().count();
    if chars == 0 || chars > MAX_TEMPLATE_CHARS {
        return Err(format!(
            "`resource:` must be 1 to {MAX_TEMPLATE_CHARS} characters, not {chars}"
        ));
    }
    if template
        .chars()
        .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err("`resource:` may not contain spaces or control characters".into());
    }
    let scheme_end = template.find(':').unwrap_or(0);
    let scheme = &template[..scheme_end];
    let scheme_ok = scheme
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !scheme_ok {
        return Err(format!(
            "`resource:` `{template}` is not a URI: it needs a scheme (`file:`, `https:`, `docs:`…)"
        ));
    }
    let names = variables(template).map_err(|m| format!("`resource:` {m}"))?;
    for name in names {
        let Some(param) = sig.params.iter().find(|p| p.name == name) else {
            return Err(format!(
                "`resource:` `{{{name}}}` is not a parameter of `{}`",
                sig.name
            ));
        };
        if !matches!(
            param.ty,
            TypeExpr::Prim(Prim::String | Prim::Number | Prim::Boolean | Prim::Date)
        ) {
            return Err(format!(
                "`resource:` `{{{name}}}` must be a string, number, boolean or date parameter"
            ));
        }
        if param.optional && param.default.is_none() {
            return Err(format!(
                "`resource:` `{{{name}}}` is optional without a default: an absent value would leave a hole in the URI"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::parse_tools_file;
    use super::*;

    fn tool(signature: &str, extra: &str) -> String {
        format!(
            "TOOLS:\n  {signature}\n    type: mcp\n    server: docs\n    permission: docs.read\n{extra}"
        )
    }

    #[test]
    fn a_resource_tool_reads_a_uri_template_filled_from_its_parameters() {
        let out = parse_tools_file(
            "t.tools.abl",
            &tool(
                "read_doc(doc_id: string) -> object",
                "    resource: \"docs://articles/{doc_id}\"\n    timeout: 5s\n",
            ),
        );
        assert_eq!(out.errors, vec![]);
        let t = &out.tools[0];
        assert_eq!(
            t.binding,
            ToolBindingDef::McpResource {
                server: "docs".into(),
                uri_template: "docs://articles/{doc_id}".into(),
                timeout_ms: 5_000,
            }
        );
        // A read changes nothing: idempotent unless declared otherwise.
        assert_eq!(t.repeat_safety, RepeatSafety::Idempotent);
        assert!(!t.repeat_safety_from_server);
        let stored = serde_json::to_value(&t.binding).unwrap();
        assert_eq!(stored["type"], "mcp_resource");
        // A fixed URI needs no parameter.
        let out = parse_tools_file(
            "t.tools.abl",
            &tool(
                "readme() -> object",
                "    resource: \"file:///srv/README.md\"\n",
            ),
        );
        assert_eq!(out.errors, vec![]);
    }

    #[test]
    fn bad_resource_declarations_are_errors_with_their_position() {
        let errors = |sig: &str, extra: &str| {
            parse_tools_file("t.tools.abl", &tool(sig, extra))
                .errors
                .iter()
                .map(|e| format!("{}:{}: {}", e.line, e.column, e.message))
                .collect::<Vec<_>>()
        };
        let cases = [
            (
                "f(id: string) -> object",
                "    resource: \"docs://a/{nope}\"\n",
                "6:15: `resource:` `{nope}` is not a parameter of `f`",
            ),
            (
                "f(id: string) -> object",
                "    resource: \"docs://a/{+id}\"\n",
                "6:15: `resource:` `{+id}`: only simple `{name}` expressions are supported (RFC 6570 level 1)",
            ),
            (
                "f(id: string) -> object",
                "    resource: \"docs://a/{id\"\n",
                "6:15: `resource:` unclosed `{`",
            ),
            (
                "f(id: string) -> object",
                "    resource: \"a/{id}\"\n",
                "6:15: `resource:` `a/{id}` is not a URI: it needs a scheme (`file:`, `https:`, `docs:`…)",
            ),
            (
                "f(id: string[]) -> object",
                "    resource: \"docs://a/{id}\"\n",
                "6:15: `resource:` `{id}` must be a string, number, boolean or date parameter",
            ),
            (
                "f(id?: string) -> object",
                "    resource: \"docs://a/{id}\"\n",
                "6:15: `resource:` `{id}` is optional without a default: an absent value would leave a hole in the URI",
            ),
            (
                "f(id: string, lang: string) -> object",
                "    resource: \"docs://a/{id}\"\n",
                "6:15: `resource:` does not use parameter `lang` of `f`: a resource tool's parameters only fill `{name}` expressions of its URI",
            ),
            (
                "f(id: string) -> object",
                "    resource: \"docs://a/{id}\"\n    repeat_safety: reconcile\n",
                "6:15: tool `f` reads a resource (`resource:`): `repeat_safety: reconcile` does not apply, a read changes nothing to reconcile (use `idempotent`, the default, or `never`)",
            ),
            (
                "f(id: string) -> object",
                "    resource: \"docs://a/{id}\"\n    server_tool: x\n",
                "6:15: tool `f` reads a resource (`resource:`): `server_tool:` does not apply",
            ),
        ];
        for (sig, extra, expected) in cases {
            assert_eq!(errors(sig, extra), vec![expected.to_owned()], "{extra}");
        }
        // Only for `type: mcp`.
        let http = "TOOLS:\n  f() -> object\n    type: http\n    endpoint: /f\n    permission: p\n    repeat_safety: idempotent\n    resource: \"docs://x\"\n";
        let out = parse_tools_file("t.tools.abl", http);
        assert!(
            out.errors
                .iter()
                .any(|e| e.message == "`resource:` applies to `type: mcp` tools only"),
            "{:?}",
            out.errors
        );
    }

    #[test]
    fn template_variables_are_read_in_order() {
        assert_eq!(
            variables("x://{a}/b/{c_2}").unwrap(),
            vec!["a".to_owned(), "c_2".to_owned()]
        );
        assert!(variables("x://{}").is_err());
        assert!(variables("x://}").is_err());
        assert!(variables("x://{a{b}}").is_err());
    }
}
