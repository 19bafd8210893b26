//! Tests of HTTP requests: endpoints and their path parameters, async
//! webhooks, `auth:`, `query_params:`, bodies and `headers:`.

use super::*;

use std::collections::BTreeMap;

use belay_proto::wire::{BodyMode, BodyType, HttpAuth, HttpRequestOptions};
use serde_json::json;

use crate::model::ToolBindingDef;

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
fn endpoint_errors() {
    assert_eq!(
        errors(
            "TOOLS:\n  f() -> string\n    type: http\n    endpoint: api/x\n    permission: a\n    repeat_safety: never\n"
        ),
        vec!["4:15: endpoint `api/x` must be a path starting with `/` or an http(s) URL"]
    );
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
        vec!["8:16: unknown body_mode `sometimes` (expected `auto` or `none`)"]
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
