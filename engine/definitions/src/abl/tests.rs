//! Tests of the `.tools.abl` parser: a file's structure, lines and
//! comments, its defaults and imports, each binding type and the
//! properties every tool takes, and the seed's examples. The tests of HTTP
//! requests, of the behaviour properties and of `parameters:` are in
//! `tests/`.

use super::*;

use std::collections::BTreeMap;

use belay_proto::wire::{HttpAuth, HttpRequestOptions};
use serde_json::{Value, json};

use crate::model::{ChildMode, RepeatSafety, ToolBindingDef, ToolDef};

use super::lines::{parse_timeout, strip_comment};

mod behaviour;
mod http;
mod parameters;

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
        vec!["4:3: expected a tool signature `name(params) -> ReturnType`, found `what is this`"]
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

#[test]
fn a_tool_names_a_pool_and_a_bad_one_is_refused_where_it_is() {
    let t = one_tool(&tool_with("ping() -> boolean", "    pool: eu-gpu\n"));
    assert_eq!(t.pool.as_deref(), Some("eu-gpu"));
    assert_eq!(one_tool(&tool_with("ping() -> boolean", "")).pool, None);
    assert_eq!(
        errors(&tool_with("ping() -> boolean", "    pool: GPU\n")),
        [
            "7:11: pool name `GPU` must be lower case letters, digits, `-` and `_`, starting with a letter"
        ]
    );
}
