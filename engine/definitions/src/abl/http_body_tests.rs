//! `body_type: xml` (with `xml_root:`), `body_schema:` with
//! `use_body_schema:`, and `tls_profile:` of HTTP tools.

use belay_proto::wire::{BodyType, HttpRequestOptions};
use serde_json::json;

use super::super::model::{ToolBindingDef, ToolDef};

const FILE: &str = "b.tools.abl";

/// A POST tool `submit(order: object, region: string)` with `extra`
/// property lines (indented 4; the first is line 7).
fn with(extra: &str) -> String {
    format!(
        "TOOLS:\n  submit(amount: number, currency: string) -> object\n    type: http\n    endpoint: \"https://api.example.com/orders\"\n    permission: orders.write\n    repeat_safety: idempotent\n{extra}"
    )
}

fn tool(content: &str) -> ToolDef {
    let out = super::parse_tools_file(FILE, content);
    assert_eq!(out.errors, vec![], "unexpected errors");
    out.tools.into_iter().next().expect("a tool")
}

fn request(content: &str) -> HttpRequestOptions {
    match tool(content).binding {
        ToolBindingDef::Http { request, .. } => request,
        other => panic!("http, not {other:?}"),
    }
}

fn errors(content: &str) -> Vec<String> {
    let out = super::parse_tools_file(FILE, content);
    assert!(out.tools.is_empty(), "a tool with errors is left out");
    out.errors
        .iter()
        .map(|e| format!("{}:{}: {}", e.line, e.column, e.message))
        .collect()
}

#[test]
fn xml_bodies_with_a_root_or_a_template() {
    let r = request(&with("    body_type: xml\n    xml_root: Order\n"));
    assert_eq!(r.body_type, BodyType::Xml);
    assert_eq!(r.xml_root.as_deref(), Some("Order"));
    let r = request(&with(
        "    body_type: xml\n    body: \"<order><amount>{{amount}}</amount></order>\"\n",
    ));
    assert_eq!(r.xml_root, None);
    assert_eq!(
        r.body_template.as_deref(),
        Some("<order><amount>{{amount}}</amount></order>")
    );
    let json = serde_json::to_value(request(&with("    body_type: xml\n"))).expect("json");
    assert_eq!(json["body_type"], "xml");
    assert_eq!(
        errors(&with("    xml_root: 1bad\n")),
        vec![
            "7:15: `xml_root` must be an XML element name (a letter or `_`, then letters, digits, `_`, `-`, `.`), not `1bad`"
        ]
    );
    assert_eq!(
        errors(&with("    xml_root: Order\n")),
        vec!["7:15: `xml_root:` applies to `body_type: xml` only"]
    );
    assert_eq!(
        errors(&with(
            "    body_type: xml\n    xml_root: Order\n    body: \"<o>{{amount}}</o>\"\n"
        )),
        vec![
            "8:15: `xml_root:` names the root of a body made from the arguments; a `body_template:` writes its own root"
        ]
    );
}

#[test]
fn body_schema_with_use_body_schema() {
    let schema = r#"'{"type": "object", "required": ["amount"], "properties": {"amount": {"type": "number", "minimum": 0}, "currency": {"type": "string", "default": "EUR"}}}'"#;
    let r = request(&with(&format!(
        "    body_schema: {schema}\n    use_body_schema: true\n"
    )));
    assert_eq!(
        r.body_schema.expect("schema")["properties"]["amount"]["minimum"],
        json!(0)
    );
    // Form and XML bodies made from the arguments are JSON values first.
    for body_type in ["form", "xml"] {
        let r = request(&with(&format!(
            "    body_type: {body_type}\n    body_schema: {schema}\n    use_body_schema: true\n"
        )));
        assert!(r.body_schema.is_some());
    }
    assert_eq!(
        errors(&with(&format!("    body_schema: {schema}\n"))),
        vec![
            "7:19: `body_schema:` is used only with `use_body_schema: true` beside it (add it, or drop the schema)"
        ]
    );
    assert_eq!(
        errors(&with("    use_body_schema: true\n")),
        vec!["7:22: `use_body_schema: true` needs a `body_schema:` (the JSON Schema of the body)"]
    );
    assert_eq!(
        errors(&with("    use_body_schema: yes\n")),
        vec!["7:22: unknown use_body_schema `yes` (expected `true` or `false`)"]
    );
    assert_eq!(
        errors(&with(
            "    body_schema: '{\"type\": \"object\",}'\n    use_body_schema: true\n"
        ))[0]
            .split(" (")
            .next(),
        Some("7:19: `body_schema` is not JSON")
    );
    assert_eq!(
        errors(&with(
            "    body_schema: '{\"type\": \"objekt\"}'\n    use_body_schema: true\n"
        ))[0]
            .split(':')
            .take(3)
            .collect::<Vec<_>>(),
        ["7", "19", " `body_schema` is not a valid JSON Schema"]
    );
    assert_eq!(
        errors(&with(&format!(
            "    method: GET\n    body_schema: {schema}\n    use_body_schema: true\n"
        ))),
        vec![
            "8:19: `body_schema:` does not apply: `method: GET` with this `body_mode` sends no body"
        ]
    );
    assert_eq!(
        errors(&with(&format!(
            "    body_type: text\n    body: \"{{{{amount}}}}\"\n    body_schema: {schema}\n    use_body_schema: true\n"
        ))),
        vec![
            "9:19: `body_schema:` checks a body made from a JSON value: `body_type: json` (arguments or template), or `form` or `xml` made from the arguments (not a text template)"
        ]
    );
}

#[test]
fn tls_profile_names_a_profile_of_the_worker() {
    let r = request(&with("    tls_profile: partner_mtls\n"));
    assert_eq!(r.tls_profile.as_deref(), Some("partner_mtls"));
    assert_eq!(
        serde_json::to_value(&r).expect("json")["tls_profile"],
        "partner_mtls"
    );
    assert_eq!(
        errors(&with("    tls_profile: \"a b\"\n")),
        vec![
            "7:18: `tls_profile` must be the name of a profile of the worker's configuration: 1 to 64 letters, digits, `_`, `-` or `.`, not `a b`"
        ]
    );
    let mcp = "TOOLS:\n  r(a: string) -> string\n    type: mcp\n    server: s\n    permission: p\n    repeat_safety: never\n    tls_profile: x\n";
    assert_eq!(
        errors(mcp),
        vec!["2:3: `tls_profile:` applies to `type: http` and `type: async_webhook` tools only"]
    );
}
