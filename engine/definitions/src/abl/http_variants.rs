//! `request_variants:` of a `type: http` tool (seed: abl-tools › Request
//! variants): a list of `- name: …` items, each with a `when:` jq
//! expression over the call's arguments (or `default: true`) and overrides
//! of `endpoint:`, `method:`, `headers:`, `query_params:`, `body_type:`,
//! `body_mode:` and `body_template:` (alias `body:`).
//!
//! The overrides are read by the same code as the tool's own keys
//! ([`read_props`]), so they are checked the same way, and each variant's
//! whole request (its overrides merged over the tool's) is checked as a
//! tool's would be: path parameters against the signature, the body rules
//! against the method. A variant stores that merged request
//! ([`RequestVariantDef`]); the engine picks one when a call is scheduled
//! (`belay_machine::variants`).
//!
//! `when:` is jq, like every Belay expression, evaluated over the
//! arguments object: a parameter is `.region`. The seed writes
//! `region == "EU"`, which jq reads as a call of a function `region`: it is
//! refused, with the expression rewritten (`.region == "EU"`) in the hint.
//! A bare parameter name is refused even where jq would accept it (a
//! parameter named `length` or `keys` names a jq builtin), since it would
//! not mean the parameter.

use std::collections::BTreeMap;

use belay_proto::wire::HttpRequestOptions;

use super::super::check_name;
use super::super::expr::Expr;
use super::super::model::RequestVariantDef;
use super::super::signature::Signature;
use super::headers::merge_headers;
use super::http::{BodyProps, check_body, check_path_params, join_base_url, read_query_params};
use super::lines::{Block, Cx, Line, head, is_quoted, parse_scalar, split_key, to_u32};
use super::read_props::read_props;

/// Most variants of one tool: each `when` is evaluated inside the engine's
/// transition when a call is scheduled, so their number is bounded.
pub(super) const MAX_VARIANTS: usize = 16;

/// The keys a variant may override (`body` is the alias of
/// `body_template`).
const OVERRIDES: &[&str] = &[
    "endpoint",
    "method",
    "headers",
    "query_params",
    "body_type",
    "body_mode",
    "body_template",
    "body",
];

/// jq's keywords: a bare word that is one of them is jq, not a parameter.
const JQ_KEYWORDS: &[&str] = &[
    "and", "or", "not", "if", "then", "elif", "else", "end", "as", "def", "reduce", "foreach",
    "try", "catch", "label", "import", "include", "__loc__",
];

/// The tool's own request, which variants override.
pub(super) struct BaseRequest<'a> {
    /// `endpoint:` as written (the file's `base_url` not joined yet).
    pub endpoint: Option<&'a str>,
    /// `method:`, upper case (default POST).
    pub method: &'a str,
    /// The tool's headers with the file's defaults merged in.
    pub headers: &'a BTreeMap<String, String>,
    /// The tool's auth, query parameters and body.
    pub request: &'a HttpRequestOptions,
    /// `body_type:` as written, with its line and column.
    pub body_type: Option<(belay_proto::wire::BodyType, u32, u32)>,
    /// `body_mode:` as written.
    pub body_mode: Option<belay_proto::wire::BodyMode>,
    /// `body_template:` as written, with its line and column.
    pub body_template: Option<&'a (String, u32, u32)>,
    /// The file's `base_url:`.
    pub base_url: Option<&'a str>,
    /// Line and column of the tool's `xml_root:`.
    pub xml_root: Option<(u32, u32)>,
    /// Line and column of the tool's `body_schema:` (when used).
    pub body_schema: Option<(u32, u32)>,
    /// Whether the tool's own request had errors: then a variant's merged
    /// request is not checked (its errors would repeat the tool's).
    pub broken: bool,
}

/// Reads `request_variants:` (`block`) of the tool `tool` (signature line
/// `line`). Errors carry the line and column they are about.
pub(super) fn read_variants(
    block: &Block,
    base: &BaseRequest<'_>,
    sig: Option<&Signature>,
    tool: &str,
    line: &Line,
    secrets: &mut Vec<(String, u32, u32)>,
    cx: &mut Cx<'_>,
) -> Vec<RequestVariantDef> {
    let mut out: Vec<RequestVariantDef> = Vec::new();
    // Name → line, and the line of the first `default: true`.
    let mut names: BTreeMap<String, u32> = BTreeMap::new();
    let mut default_at: Option<(String, u32)> = None;
    if block.children.is_empty() {
        cx.error(
            block.line.no,
            block.line.col(),
            "`request_variants:` needs at least one `- name: …` item",
        );
    }
    for (i, entry) in block.children.iter().enumerate() {
        let Some(rest) = entry.line.text.strip_prefix("- ") else {
            cx.error(
                entry.line.no,
                entry.line.col(),
                format!(
                    "expected a `- name: …` item in `request_variants:`, found `{}`",
                    head(&entry.line.text)
                ),
            );
            continue;
        };
        if i == MAX_VARIANTS {
            cx.error(
                entry.line.no,
                entry.line.col(),
                format!("tool `{tool}` has more than {MAX_VARIANTS} request variants"),
            );
            break;
        }
        let Some(variant) = read_variant(entry, rest, base, sig, tool, line, secrets, cx) else {
            continue;
        };
        let (def, name_line) = variant;
        if let Some(first) = names.insert(def.name.clone(), name_line) {
            cx.error(
                name_line,
                entry.line.col(),
                format!(
                    "duplicate request variant `{}` (first on line {first})",
                    def.name
                ),
            );
            continue;
        }
        if def.default {
            if let Some((first, first_line)) = &default_at {
                cx.error(
                    name_line,
                    entry.line.col(),
                    format!(
                        "only one request variant may be `default: true`; `{first}` (line {first_line}) already is"
                    ),
                );
                continue;
            }
            default_at = Some((def.name.clone(), name_line));
        }
        out.push(def);
    }
    out
}

/// One `- name: …` item: `rest` is its first line after `- `. Returns the
/// variant and the line of its `name:`, or `None` after an error.
#[allow(
    clippy::too_many_arguments,
    reason = "its one caller, `read_variants`, passes on the tool's context; a struct would only wrap it"
)]
fn read_variant(
    entry: &Block,
    rest: &str,
    base: &BaseRequest<'_>,
    sig: Option<&Signature>,
    tool: &str,
    tool_line: &Line,
    secrets: &mut Vec<(String, u32, u32)>,
    cx: &mut Cx<'_>,
) -> Option<(RequestVariantDef, u32)> {
    let errors_before = cx.out.errors.len();
    // The item's first key is on the `- ` line; it and the lines under it
    // are the item's keys.
    let first = Block {
        line: Line {
            no: entry.line.no,
            indent: entry.line.indent + 2 + (rest.len() - rest.trim_start().len()),
            text: rest.trim_start().to_owned(),
        },
        children: Vec::new(),
    };
    let mut name: Option<(String, u32)> = None;
    let mut when: Option<(String, u32, u32)> = None;
    let mut default: Option<bool> = None;
    let mut overrides: Vec<&Block> = Vec::new();
    let mut seen: BTreeMap<String, u32> = BTreeMap::new();
    for item in std::iter::once(&first).chain(entry.children.iter()) {
        let line = &item.line;
        let Some(kv) = split_key(line).filter(|kv| !kv.optional) else {
            cx.error(
                line.no,
                line.col(),
                format!(
                    "expected `key: value` in a request variant of `{tool}`, found `{}`",
                    head(&line.text)
                ),
            );
            continue;
        };
        if OVERRIDES.contains(&kv.key) {
            overrides.push(item);
            continue;
        }
        if !matches!(kv.key, "name" | "when" | "default") {
            cx.error(
                line.no,
                kv.key_col,
                format!(
                    "`{}:` cannot be set in a request variant (a variant has `name`, `when` or `default`, and overrides `endpoint`, `method`, `headers`, `query_params`, `body_type`, `body_mode` or `body_template`)",
                    kv.key
                ),
            );
            continue;
        }
        if let Some(first) = seen.insert(kv.key.to_owned(), line.no) {
            cx.error(
                line.no,
                kv.key_col,
                format!(
                    "duplicate `{}` in a request variant (first on line {first})",
                    kv.key
                ),
            );
            continue;
        }
        if let Some(child) = item.children.first() {
            cx.error(
                child.line.no,
                child.line.col(),
                format!(
                    "`{}` takes a value on its own line, not an indented block",
                    kv.key
                ),
            );
            continue;
        }
        let value = match parse_scalar(kv.value, kv.value_col) {
            Ok(v) => v,
            Err((col, m)) => {
                cx.error(line.no, col, m);
                continue;
            }
        };
        match kv.key {
            "name" => match check_name("request variant", &value) {
                Some(m) => cx.error(line.no, kv.value_col, m),
                None => name = Some((value, line.no)),
            },
            "default" => match value.as_str() {
                "true" => default = Some(true),
                "false" => default = Some(false),
                other => cx.error(
                    line.no,
                    kv.value_col,
                    format!("`default:` must be `true` or `false`, found `{other}`"),
                ),
            },
            _ => {
                let col = kv.value_col + u32::from(is_quoted(kv.value));
                when = Some((value, line.no, col));
            }
        }
    }
    let props = read_props(overrides.into_iter(), cx);
    // Its `{{_secret.KEY}}` are checked against the tool's `SECRET_ACCESS`
    // by the caller, as the tool's own are.
    secrets.extend(props.header_secrets.iter().cloned());
    let when = when.and_then(|(text, wline, wcol)| parse_when(&text, wline, wcol, sig, cx));
    let is_default = default.unwrap_or(false);
    let Some((name, name_line)) = name else {
        if cx.out.errors.len() == errors_before {
            cx.error(
                entry.line.no,
                entry.line.col(),
                "a request variant needs `name:`",
            );
        }
        return None;
    };
    match (&when, is_default) {
        (Some(_), true) => cx.error(
            name_line,
            entry.line.col(),
            format!(
                "request variant `{name}` is `default: true`: it is used when no `when:` is true, and takes no `when:` of its own"
            ),
        ),
        (None, false) if !seen.contains_key("when") => cx.error(
            name_line,
            entry.line.col(),
            format!(
                "request variant `{name}` needs `when:` (a jq expression over the arguments, like `.region == \"EU\"`) or `default: true`"
            ),
        ),
        _ => {}
    }
    if cx.out.errors.len() > errors_before {
        return None;
    }

    // The variant's whole request, checked as a tool's.
    let endpoint_raw = props
        .endpoint
        .as_ref()
        .map(|(e, l, c)| (e.as_str(), *l, *c));
    if let (Some(sig), Some((endpoint, eline, ecol))) = (sig, endpoint_raw) {
        check_path_params(endpoint, eline, ecol, sig, cx);
    }
    let method = props.method.as_deref().unwrap_or(base.method);
    let body_type = props.body_type.or(base.body_type);
    let body_mode = props.body_mode.or(base.body_mode).unwrap_or_default();
    let body_template = props.body_template.as_ref().or(base.body_template);
    if !base.broken {
        let merged_from = cx.out.errors.len();
        let body = BodyProps {
            method,
            body_type,
            body_mode,
            body_template,
            xml_root: base.xml_root,
            body_schema: base.body_schema,
        };
        check_body(&body, false, sig, tool, tool_line, secrets, cx);
        for e in &mut cx.out.errors[merged_from..] {
            e.message = format!("request variant `{name}`: {}", e.message);
        }
    }
    let query_params = props
        .query_params
        .map(|block| read_query_params(block, sig, tool, cx));
    if cx.out.errors.len() > errors_before {
        return None;
    }
    let endpoint = match (endpoint_raw, base.endpoint) {
        (Some((e, _, _)), _) | (None, Some(e)) => join_base_url(base.base_url, e.to_owned()),
        // The tool's missing `endpoint:` is reported already.
        (None, None) => return None,
    };
    let request = HttpRequestOptions {
        query_params: query_params.unwrap_or_else(|| base.request.query_params.clone()),
        body_type: body_type.map(|(t, _, _)| t).unwrap_or_default(),
        body_mode,
        body_template: body_template.map(|(t, _, _)| t.clone()),
        ..base.request.clone()
    };
    let def = RequestVariantDef {
        name,
        when,
        default: is_default,
        endpoint,
        method: method.to_owned(),
        headers: merge_headers(base.headers, props.headers),
        request,
    };
    Some((def, name_line))
}

/// `when:` parsed as jq; refused (with the rewritten expression as a hint)
/// when it names a parameter without the leading `.`.
fn parse_when(
    text: &str,
    line: u32,
    col: u32,
    sig: Option<&Signature>,
    cx: &mut Cx<'_>,
) -> Option<Expr> {
    if text.trim().is_empty() {
        cx.error(
            line,
            col,
            "`when` needs a jq expression over the call's arguments, like `.region == \"EU\"`",
        );
        return None;
    }
    let params: Vec<&str> = sig
        .map(|s| s.params.iter().map(|p| p.name.as_str()).collect())
        .unwrap_or_default();
    let bare = bare_parameters(text, &params);
    if let Some(&(offset, word)) = bare.first() {
        let rewritten = with_dots(text, &bare);
        let at = col.saturating_add(to_u32(text[..offset].chars().count()));
        cx.error(
            line,
            at,
            format!(
                "`when` names the parameter `{word}` without a leading `.`: the expression is jq over the call's arguments, so write `{rewritten}`"
            ),
        );
        return None;
    }
    match Expr::parse(text) {
        Ok(e) => Some(e),
        Err(e) => {
            cx.error(
                line,
                col,
                format!(
                    "`when` is not a valid jq expression: {e}; it is evaluated over the call's arguments (a parameter is `.name`) and must give `true` or `false`"
                ),
            );
            None
        }
    }
}

/// The byte offsets and names of the words of `text` (outside string
/// literals) that are parameter names written without a leading `.`,
/// `$` or `@`, not followed by `(` (a call) or `:` (an object key), and not
/// jq keywords.
fn bare_parameters<'t>(text: &'t str, params: &[&str]) -> Vec<(usize, &'t str)> {
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    let mut i = 0;
    let mut in_string = false;
    while i < bytes.len() {
        let c = bytes[i];
        if in_string {
            match c {
                b'\\' => i += 1,
                b'"' => in_string = false,
                _ => {}
            }
            i += 1;
            continue;
        }
        if c == b'"' {
            in_string = true;
            i += 1;
            continue;
        }
        if c == b'#' {
            // A jq comment runs to the end of the line.
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            let word = &text[start..i];
            let before = text[..start].trim_end().chars().next_back();
            let after = text[i..].trim_start().chars().next();
            let prefixed = matches!(text[..start].chars().next_back(), Some('.' | '$' | '@'))
                || matches!(before, Some('.'));
            let called_or_key = matches!(after, Some('(' | ':'));
            if params.contains(&word) && !prefixed && !called_or_key && !JQ_KEYWORDS.contains(&word)
            {
                found.push((start, word));
            }
            continue;
        }
        i += 1;
    }
    found
}

/// `text` with a `.` before each of `bare` (offsets in `text`).
fn with_dots(text: &str, bare: &[(usize, &str)]) -> String {
    let mut out = String::with_capacity(text.len() + bare.len());
    let mut last = 0;
    for (offset, _) in bare {
        out.push_str(&text[last..*offset]);
        out.push('.');
        last = *offset;
    }
    out.push_str(&text[last..]);
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::model::ToolDef;
    use belay_proto::wire::{BodyMode, BodyType, QueryParam};
    use serde_json::json;

    const FILE: &str = "v.tools.abl";

    /// A `submit(order: object, region: string)` tool around `variants`
    /// (the lines under `request_variants:`, indented 6).
    fn file(variants: &str) -> String {
        format!(
            "TOOLS:\n  submit(order: object, region: string, id: string) -> {{ref: string}}\n    type: http\n    endpoint: \"https://api.example.com/us/submit\"\n    method: POST\n    headers:\n      X-Region: us\n      Accept: application/json\n    permission: orders.write\n    repeat_safety: idempotent\n    request_variants:\n{variants}"
        )
    }

    fn tool(content: &str) -> ToolDef {
        let out = super::super::parse_tools_file(FILE, content);
        assert_eq!(out.errors, vec![], "unexpected errors");
        out.tools.into_iter().next().unwrap()
    }

    fn errors(content: &str) -> Vec<String> {
        let out = super::super::parse_tools_file(FILE, content);
        assert!(out.tools.is_empty(), "a tool with errors is left out");
        out.errors
            .iter()
            .map(|e| format!("{}:{}: {}", e.line, e.column, e.message))
            .collect()
    }

    #[test]
    fn the_seeds_example_with_jq_when_and_overrides() {
        let t = tool(&file(concat!(
            "      - name: eu\n",
            "        when: '.region == \"EU\"'\n",
            "        endpoint: \"https://api.eu.example.com/submit/{id}\"\n",
            "        method: PUT\n",
            "        headers:\n",
            "          x-region: eu\n",
            "          X-Residency: eu-only\n",
            "        query_params:\n",
            "          dc: fra\n",
            "        body_type: json\n",
            "      - name: gb\n",
            "        when: .region == \"GB\"\n",
            "        body_type: form\n",
            "        body_mode: none\n",
            "      - name: default\n",
            "        default: true\n",
        )));
        assert_eq!(t.request_variants.len(), 3);
        let eu = &t.request_variants[0];
        assert_eq!(eu.name, "eu");
        assert!(!eu.default);
        assert_eq!(eu.when.as_ref().unwrap().source(), ".region == \"EU\"");
        assert_eq!(eu.endpoint, "https://api.eu.example.com/submit/{id}");
        assert_eq!(eu.method, "PUT");
        // The variant's header wins over the tool's of the same name in any
        // case; the tool's others are kept.
        assert_eq!(
            eu.headers,
            BTreeMap::from([
                ("Accept".to_owned(), "application/json".to_owned()),
                ("X-Residency".to_owned(), "eu-only".to_owned()),
                ("x-region".to_owned(), "eu".to_owned()),
            ])
        );
        assert_eq!(
            eu.request.query_params,
            vec![QueryParam {
                key: "dc".into(),
                value: "fra".into()
            }]
        );
        let gb = &t.request_variants[1];
        assert_eq!(gb.endpoint, "https://api.example.com/us/submit");
        assert_eq!(gb.method, "POST");
        assert_eq!(gb.request.body_type, BodyType::Form);
        assert_eq!(gb.request.body_mode, BodyMode::None);
        let default = &t.request_variants[2];
        assert!(default.default && default.when.is_none());
        assert_eq!(default.endpoint, "https://api.example.com/us/submit");
        assert_eq!(
            default.headers.get("X-Region").map(String::as_str),
            Some("us")
        );
        // Stored and read back as the definition is.
        let json = serde_json::to_value(&t).unwrap();
        assert_eq!(
            json["request_variants"][0]["when"],
            json!(".region == \"EU\"")
        );
        assert_eq!(json["request_variants"][2]["default"], json!(true));
        let back: ToolDef = serde_json::from_value(json).unwrap();
        assert_eq!(back, t);
    }

    #[test]
    fn the_seeds_bare_when_is_refused_with_the_jq_form() {
        assert_eq!(
            errors(&file(concat!(
                "      - name: eu\n",
                "        when: region == \"EU\"\n",
                "        endpoint: \"https://api.eu.example.com/submit\"\n",
            ))),
            vec![
                "13:15: `when` names the parameter `region` without a leading `.`: the expression is jq over the call's arguments, so write `.region == \"EU\"`"
            ]
        );
        assert_eq!(
            errors(&file("      - name: eu\n        when: '.region =='\n")).len(),
            1
        );
        let broken = errors(&file("      - name: eu\n        when: '.region =='\n"));
        assert!(
            broken[0].starts_with("13:16: `when` is not a valid jq expression"),
            "{broken:?}"
        );
    }

    #[test]
    fn variant_errors_have_lines_and_columns() {
        let e = |variants: &str| errors(&file(variants));
        // Unknown keys, and keys a variant does not override.
        assert_eq!(
            e(
                "      - name: eu\n        when: .region == \"EU\"\n        timeout: 5s\n        colour: red\n"
            ),
            vec![
                "14:9: `timeout:` cannot be set in a request variant (a variant has `name`, `when` or `default`, and overrides `endpoint`, `method`, `headers`, `query_params`, `body_type`, `body_mode` or `body_template`)",
                "15:9: `colour:` cannot be set in a request variant (a variant has `name`, `when` or `default`, and overrides `endpoint`, `method`, `headers`, `query_params`, `body_type`, `body_mode` or `body_template`)",
            ]
        );
        // Two defaults, a duplicate name.
        assert_eq!(
            e(concat!(
                "      - name: a\n        default: true\n",
                "      - name: b\n        default: true\n",
                "      - name: a\n        when: .region == \"x\"\n",
            )),
            vec![
                "14:7: only one request variant may be `default: true`; `a` (line 12) already is",
                "16:7: duplicate request variant `a` (first on line 12)",
            ]
        );
        // Overrides are checked like the tool's own keys.
        assert_eq!(
            e(
                "      - name: eu\n        when: .region == \"EU\"\n        method: FETCH\n        endpoint: api/x\n        body_type: yaml\n"
            ),
            vec![
                "14:17: unknown method `FETCH` (expected GET, POST, PUT, PATCH or DELETE)",
                "15:19: endpoint `api/x` must be a path starting with `/` or an http(s) URL",
                "16:20: unknown body_type `yaml` (expected `json`, `form`, `xml` or `text`)",
            ]
        );
        // The merged request is checked as a tool's: path parameters, and
        // the body rules against the method.
        assert_eq!(
            e(
                "      - name: eu\n        when: .region == \"EU\"\n        endpoint: \"/eu/{nope}\"\n        method: GET\n        body_type: form\n"
            ),
            vec![
                "14:24: path parameter `{nope}` is not a parameter of `submit`",
                "16:20: request variant `eu`: `method: GET` sends no body: `body_type:` does not apply",
            ]
        );
        // `when` or `default`, not both, not neither; a name.
        assert_eq!(
            e(concat!(
                "      - name: a\n        default: true\n        when: .region == \"x\"\n",
                "      - name: b\n        endpoint: /b\n",
                "      - when: .region == \"x\"\n",
                "      - name: Bad-Name\n        default: maybe\n",
                "      name: c\n",
            )),
            vec![
                "12:7: request variant `a` is `default: true`: it is used when no `when:` is true, and takes no `when:` of its own",
                "15:7: request variant `b` needs `when:` (a jq expression over the arguments, like `.region == \"EU\"`) or `default: true`",
                "17:7: a request variant needs `name:`",
                "18:15: request variant name `Bad-Name` must be lower case letters, digits and `_`, starting with a letter",
                "19:18: `default:` must be `true` or `false`, found `maybe`",
                "20:7: expected a `- name: …` item in `request_variants:`, found `name: c`",
            ]
        );
    }

    #[test]
    fn only_http_tools_take_variants() {
        let content = "TOOLS:\n  r(a: string) -> string\n    type: mcp\n    server: s\n    permission: p\n    repeat_safety: never\n    request_variants:\n      - name: x\n        default: true\n";
        assert_eq!(
            errors(content),
            vec!["7:5: `request_variants:` applies to `type: http` tools only"]
        );
        let empty = file("").trim_end().to_string();
        assert_eq!(
            errors(&empty),
            vec!["11:5: `request_variants:` needs at least one `- name: …` item"]
        );
    }

    #[test]
    fn bare_parameters_are_found_outside_strings_and_paths() {
        let params = ["region", "tier", "length"];
        let words = |t: &str| -> Vec<String> {
            bare_parameters(t, &params)
                .into_iter()
                .map(|(_, w)| w.to_owned())
                .collect()
        };
        assert_eq!(words(r#"region == "EU""#), ["region"]);
        assert_eq!(words(r#".region == "EU""#), Vec::<String>::new());
        assert_eq!(words(r#"."region" == "region""#), Vec::<String>::new());
        assert_eq!(
            words(r#"$region or {region: 1} or region(1)"#),
            Vec::<String>::new()
        );
        assert_eq!(words(r#"region == "EU" and tier > 2"#), ["region", "tier"]);
        assert_eq!(words("length > 2"), ["length"]);
        assert_eq!(words(".a | not"), Vec::<String>::new());
        assert_eq!(
            with_dots(
                r#"region == "EU" and tier"#,
                &bare_parameters(r#"region == "EU" and tier"#, &params)
            ),
            r#".region == "EU" and .tier"#
        );
    }
}
