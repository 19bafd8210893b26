//! Tests of `parameters:`: nested fields and descriptions, where injected
//! values come from (sources, runtime values, lookups), hidden parameters
//! and the model's schema.

use super::*;

use std::collections::BTreeMap;

use serde_json::json;

use crate::expr::Expr;
use crate::model::{AuthField, InjectedParam, ParamSource, RuntimeField};

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
        errs[2].ends_with("declares the item fields of an `object[]` parameter; `s` is `string[]`"),
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
                    table: BTreeMap::from([("DE".into(), json!("eu")), ("US".into(), json!("us"))]),
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

/// The example of the README's "HTTP tools" section, as written there.
#[test]
fn readme_parameters_example_parses() {
    // The README's example, taken from the README itself.
    let readme = include_str!("../../../../../README.md");
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
