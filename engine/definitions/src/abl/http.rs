//! The request of a `type: http` or `type: async_webhook` tool:
//! `endpoint:` and its path parameters, the file's `base_url:`,
//! `query_params:`, and the body (`body_type:`, `body_mode:`,
//! `body_template:`, `xml_root:`, `body_schema:`), checked into
//! `HttpRequestOptions`. `auth:` is read in `auth.rs`, `headers:` in
//! `headers.rs`, `request_variants:` in `http_variants.rs`.

use std::collections::BTreeMap;

use belay_proto::wire::{
    BodyMode, BodyType, HttpRequestOptions, QueryParam, TemplatePiece, config_placeholder_name,
    secret_placeholder_name, split_placeholders,
};
use serde_json::Value;

use crate::signature::{Prim, Signature, TypeExpr};

use super::auth::props_auth;
use super::lines::{
    Block, Cx, KeyValue, Line, entry_kv, head, is_quoted, parse_scalar, scalar, split_key, to_u32,
};
use super::props::{BindingType, FileDefaults, Props};
use super::secrets;

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
pub(super) const MAX_TLS_PROFILE_CHARS: usize = 64;

/// The checked `auth:`, `query_params:` and body properties of a `type:
/// http` or `type: async_webhook` tool (the file's `auth:` when the tool
/// has none). For any other type, each of them written is an error.
/// Every `{{_secret.KEY}}` of the body template goes into `body_secrets`
/// (KEY, line, column), to check against the tool's `SECRET_ACCESS`.
pub(super) fn http_request_options(
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
pub(super) fn is_xml_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// The body properties of one request (a tool's, or a request variant's
/// merged over it), each with the line and column it was written at.
pub(super) struct BodyProps<'a> {
    /// Method, upper case.
    pub(super) method: &'a str,
    pub(super) body_type: Option<(BodyType, u32, u32)>,
    pub(super) body_mode: BodyMode,
    pub(super) body_template: Option<&'a (String, u32, u32)>,
    /// Line and column of `xml_root:`.
    pub(super) xml_root: Option<(u32, u32)>,
    /// Line and column of `body_schema:` (with `use_body_schema: true`).
    pub(super) body_schema: Option<(u32, u32)>,
}

/// The body rules: a method without a body takes no `body_type:` or
/// `body_template:`; an async webhook's body is JSON; `body_mode: none`
/// takes no template; a template is checked ([`check_body_template`]);
/// `body_type: text` needs one. Every `{{_secret.KEY}}` of the template
/// goes into `body_secrets`.
pub(super) fn check_body(
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
pub(super) fn read_query_params(
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

/// What is wrong with a `base_url:`, if anything: an absolute http(s) URL
/// without whitespace, `{` or `}`.
pub(super) fn check_base_url(url: &str) -> Option<String> {
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
pub(super) fn join_base_url(base_url: Option<&str>, endpoint: String) -> String {
    match base_url {
        Some(base) if endpoint.starts_with('/') => {
            format!("{}{endpoint}", base.trim_end_matches('/'))
        }
        _ => endpoint,
    }
}

pub(super) fn check_endpoint(endpoint: &str) -> Option<String> {
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

/// Check each `{name}` of the endpoint against the signature.
pub(super) fn check_path_params(
    endpoint: &str,
    line: u32,
    col: u32,
    sig: &Signature,
    cx: &mut Cx<'_>,
) {
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
