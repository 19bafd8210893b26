//! A tool's `parameters:` block, applied to its signature: descriptions and
//! nested fields ([`enrich_field`]), and where a value the model does not
//! supply comes from (`source:`, `value:`, `key:`, `table:`, `hidden:`;
//! [`finish_source`]), with where a `source: config` value may not go
//! ([`check_injected_use`]).

use std::collections::BTreeMap;

use belay_proto::wire::config_placeholder_name;
use serde_json::Value;

use crate::expr::Expr;
use crate::model::{AuthField, InjectedParam, ParamSource, RuntimeField};
use crate::signature::{
    self, Field, MAX_TYPE_DEPTH, Prim, TypeExpr, check_input_type, parse_field_decl,
};

use super::lines::{
    Block, Cx, KeyValue, block_only, entry_kv, first_time, head, is_quoted, keyword, scalar,
    split_key, to_u32,
};
use super::props::{BindingType, Props};
use super::{SEED_ENRICHMENT_KEYS, SOURCE_KEYS, secrets, visibility};

/// A `visibility.trace: false` parameter: name, type, and the line and
/// column of its `trace:` value.
type Untraced = (String, TypeExpr, u32, u32);

/// A parameter the model does not supply, with the line and column of its
/// name.
type Injected = (InjectedParam, (u32, u32));

/// Apply a tool's `parameters:` block to its signature parameters; returns
/// the parameters the model does not supply ([`InjectedParam`]), in the
/// block's order, each with the line and column of its name, and those
/// with `visibility.trace: false` (name, type, line and column of the
/// `trace:` value).
pub(super) fn apply_parameters(
    block: &Block,
    params: &mut [Field],
    tool: &str,
    cx: &mut Cx<'_>,
) -> (Vec<Injected>, Vec<Untraced>) {
    let mut injected = Vec::new();
    let mut untraced = Vec::new();
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
        let mut keys = SourceKeys::default();
        enrich_field(param, &child.children, 1, Some(&mut keys), cx);
        if let Some(v) = keys.visibility {
            if let Some((model, l, c)) = v.model {
                let from_elsewhere = keys.value.is_some()
                    || keys
                        .source
                        .as_ref()
                        .is_some_and(|(s, _, _)| s.as_str() != "model");
                match keys.hidden {
                    Some((hidden, ..)) if hidden == model => cx.error(
                        l,
                        c,
                        format!("`visibility.model: {model}` contradicts `hidden: {hidden}`"),
                    ),
                    _ if model && from_elsewhere => cx.error(
                        l,
                        c,
                        format!("`visibility.model: true` contradicts the parameter's source: `{}` is never shown to the model when its value comes from elsewhere", kv.key),
                    ),
                    // `model: false` is `hidden: true`.
                    None if !model => keys.hidden = Some((true, l, c)),
                    _ => {}
                }
            }
            if let Some((false, l, c)) = v.trace {
                untraced.push((kv.key.to_owned(), param.ty.clone(), l, c));
            }
        }
        if let Some(i) = finish_source(param, keys, (line.no, kv.key_col), cx) {
            injected.push((i, (line.no, kv.key_col)));
        }
    }
    (injected, untraced)
}

/// The source settings written under one parameter, with the line and
/// column of each value, read by [`SourceKeys::read`] and checked by
/// [`finish_source`].
#[derive(Default)]
struct SourceKeys<'b> {
    /// Keys seen, for duplicates.
    seen: BTreeMap<String, u32>,
    source: Option<(String, u32, u32)>,
    /// `value:` as written (unquoted), whether it was quoted, line, column.
    value: Option<(String, bool, u32, u32)>,
    key: Option<(String, u32, u32)>,
    table: Option<&'b Block>,
    hidden: Option<(bool, u32, u32)>,
    required: Option<(bool, u32, u32)>,
    /// `default:` as written (unquoted), whether it was quoted, line, column.
    default: Option<(String, bool, u32, u32)>,
    /// `visibility:` (`abl/visibility.rs`).
    visibility: Option<visibility::Visibility>,
}

impl<'b> SourceKeys<'b> {
    fn read(&mut self, block: &'b Block, kv: &KeyValue<'_>, cx: &mut Cx<'_>) {
        let line = &block.line;
        if let Some(first) = self.seen.insert(kv.key.to_owned(), line.no) {
            cx.error(
                line.no,
                kv.key_col,
                format!("duplicate `{}:` (first on line {first})", kv.key),
            );
            return;
        }
        let at = |v: String| (v, line.no, kv.value_col);
        let flag = |cx: &mut Cx<'_>| {
            keyword(block, kv, &[("true", true), ("false", false)], cx)
                .map(|b| (b, line.no, kv.value_col))
        };
        match kv.key {
            "source" => self.source = scalar(block, kv, cx).map(at),
            "key" => self.key = scalar(block, kv, cx).map(at),
            "value" | "default" => {
                let Some(v) = scalar(block, kv, cx) else {
                    return;
                };
                let entry = Some((v, is_quoted(kv.value), line.no, kv.value_col));
                if kv.key == "value" {
                    self.value = entry;
                } else {
                    self.default = entry;
                }
            }
            "table" => {
                if block_only(block, kv, cx) {
                    self.table = Some(block);
                }
            }
            "hidden" => self.hidden = flag(cx),
            "visibility" => self.visibility = Some(visibility::read_visibility(block, kv, cx)),
            _ => self.required = flag(cx),
        }
    }
}

/// A literal written for a parameter of type `ty` (`default:`, a `value:`
/// without `source:`, a `table:` entry): the text for `string` (quoted or
/// not), a `YYYY-MM-DD` text for `date`, an unquoted number or `true` /
/// `false` for `number` and `boolean`. Other types take no literal.
fn typed_literal(ty: &TypeExpr, text: &str, quoted: bool, what: &str) -> Result<Value, String> {
    let found = || {
        if quoted {
            format!("\"{text}\"")
        } else {
            format!("`{text}`")
        }
    };
    match ty {
        TypeExpr::Prim(Prim::String) => Ok(Value::String(text.to_owned())),
        TypeExpr::Prim(Prim::Date) if signature::is_date(text) => {
            Ok(Value::String(text.to_owned()))
        }
        TypeExpr::Prim(Prim::Date) => Err(format!("{what} {} is not a date (YYYY-MM-DD)", found())),
        TypeExpr::Prim(Prim::Number) => {
            match (quoted, serde_json::from_str::<serde_json::Number>(text)) {
                (false, Ok(n)) => Ok(Value::Number(n)),
                _ => Err(format!("{what} {} is not a number", found())),
            }
        }
        TypeExpr::Prim(Prim::Boolean) => match (quoted, text) {
            (false, "true") => Ok(Value::Bool(true)),
            (false, "false") => Ok(Value::Bool(false)),
            _ => Err(format!("{what} {} is not `true` or `false`", found())),
        },
        _ => Err(format!(
            "a parameter of type `{}` cannot take a {what}; literals are for string, number, boolean and date",
            ty.describe()
        )),
    }
}

/// The `value:`s of `source: runtime`, for messages.
const RUNTIME_VALUES: &str = "`run_id`, `node_id`, `call_id`, `idempotency_key`, `tenant`, `time` (or `now`), `date` or `unix_ms`";

/// The built-in type of `ty`, if it is one.
fn field_ty_prim(ty: &TypeExpr) -> Option<Prim> {
    match ty {
        TypeExpr::Prim(p) => Some(*p),
        _ => None,
    }
}

/// The `source:`, `value:`, `key:`, `table:`, `hidden:`, `required:` and
/// `default:` of one parameter, applied to `field` (`required`, `default`)
/// and checked; `Some` for a parameter the model does not supply. `at` is
/// the line and column of the parameter's name.
fn finish_source(
    field: &mut Field,
    keys: SourceKeys<'_>,
    at: (u32, u32),
    cx: &mut Cx<'_>,
) -> Option<InjectedParam> {
    let name = field.name.clone();
    // A vaulted secret never becomes an argument (the model's transcript
    // and every event hold the arguments).
    for (what, entry) in [("`value`", &keys.value), ("`default`", &keys.default)] {
        if let Some((text, quoted, line, col)) = entry
            && let Some((inner, at)) = secrets::first_secret_placeholder(text)
        {
            let col = col
                .saturating_add(u32::from(*quoted))
                .saturating_add(to_u32(text[..at].chars().count()));
            let what = format!("a parameter's {what}");
            cx.error(*line, col, secrets::misplaced_message(inner, &what));
            return None;
        }
    }
    if let Some((text, quoted, line, col)) = &keys.default {
        match typed_literal(&field.ty, text, *quoted, "default") {
            Ok(v) => field.default = Some(v),
            Err(m) => cx.error(*line, *col, m),
        }
    }
    if let Some((required, line, col)) = keys.required {
        if required && field.default.is_some() {
            cx.error(
                line,
                col,
                format!("`{name}` has a default, so it is never missing; drop `required: true` or the default"),
            );
        }
        field.optional = !required;
    }
    let source = keys.source.as_ref().map(|(s, _, _)| s.as_str());
    let (src_line, src_col) = keys.source.as_ref().map_or(at, |(_, l, c)| (*l, *c));
    let lookup = source == Some("lookup");
    if !lookup {
        for (what, pos) in [
            ("key", keys.key.as_ref().map(|(_, l, c)| (*l, *c))),
            ("table", keys.table.map(|b| (b.line.no, b.line.col()))),
        ] {
            if let Some((l, c)) = pos {
                cx.error(l, c, format!("`{what}:` goes with `source: lookup`"));
            }
        }
    }
    let model_source = matches!(source, None | Some("model"));
    if let Some((false, line, col)) = keys.hidden
        && !(model_source && keys.value.is_none())
    {
        cx.error(
            line,
            col,
            format!("`hidden: false` contradicts the parameter's source: `{name}` is never shown to the model when its value comes from elsewhere"),
        );
    }
    let field_ty = field.ty.clone();
    let need_string = |cx: &mut Cx<'_>, what: &str| {
        if field.ty != TypeExpr::Prim(Prim::String) {
            cx.error(
                src_line,
                src_col,
                format!(
                    "`source: {what}` gives a string; `{name}` is a `{}`",
                    field.ty.describe()
                ),
            );
        }
    };
    let value = keys.value.clone();
    let value_text = |cx: &mut Cx<'_>, what: &str| -> Option<(String, u32, u32)> {
        match &value {
            Some((v, _, l, c)) => Some((v.clone(), *l, *c)),
            None => {
                cx.error(src_line, src_col, format!("`source: {what}` needs a `value:` ({})", match what {
                    "system" => "a jq expression over the run's state, like `.input.customer_id`",
                    "expr" => "a jq expression over the run's state and the model's arguments at `.args`",
                    "runtime" => RUNTIME_VALUES,
                    _ => "the name of a worker configuration value, like `CRM_ACCOUNT`",
                }));
                None
            }
        }
    };
    let parse_expr =
        |cx: &mut Cx<'_>, text: &str, line: u32, col: u32, what: &str| match Expr::parse(text) {
            Ok(e) => Some(e),
            Err(e) => {
                cx.error(
                    line,
                    col,
                    format!("`{what}` is not a valid jq expression: {e}"),
                );
                None
            }
        };
    let source = match source {
        None | Some("model") => {
            match (&keys.value, keys.hidden) {
                (Some((_, _, line, col)), _) if source == Some("model") => {
                    cx.error(*line, *col, format!("`value:` needs a `source:` other than `model`: the model supplies `{name}`"));
                    return None;
                }
                (Some((text, quoted, line, col)), _) => {
                    match typed_literal(&field.ty, text, *quoted, "value") {
                        Ok(value) => ParamSource::Literal { value },
                        Err(m) => {
                            cx.error(*line, *col, m);
                            return None;
                        }
                    }
                }
                (None, Some((true, line, col))) => match &field.default {
                    Some(d) => ParamSource::Literal { value: d.clone() },
                    None => {
                        cx.error(line, col, format!("hidden parameter `{name}` needs a `source:`, a `value:` or a `default:`: the model never sends it"));
                        return None;
                    }
                },
                _ => return None,
            }
        }
        Some("system" | "expr") => {
            let what = source.unwrap_or_default();
            let (text, line, col) = value_text(cx, what)?;
            let expr = parse_expr(cx, &text, line, col, "value")?;
            if what == "system" {
                ParamSource::System { expr }
            } else {
                ParamSource::Expr { expr }
            }
        }
        Some("runtime") => {
            let (text, line, col) = value_text(cx, "runtime")?;
            let field = match text.as_str() {
                "run_id" => RuntimeField::RunId,
                "node_id" => RuntimeField::NodeId,
                "call_id" => RuntimeField::CallId,
                "idempotency_key" => RuntimeField::IdempotencyKey,
                "tenant" => RuntimeField::Tenant,
                "time" | "now" => RuntimeField::Time,
                "date" => RuntimeField::Date,
                "unix_ms" => RuntimeField::UnixMs,
                other => {
                    cx.error(line, col, format!("unknown `value: {other}` of `source: runtime` (expected {RUNTIME_VALUES})"));
                    return None;
                }
            };
            // What each value gives: the time as RFC 3339 text, the date as
            // `YYYY-MM-DD` (a `date` or a `string`), ms as a number.
            let fits = match field {
                RuntimeField::Date => {
                    matches!(field_ty_prim(&field_ty), Some(Prim::Date | Prim::String))
                }
                RuntimeField::UnixMs => field_ty_prim(&field_ty) == Some(Prim::Number),
                _ => field_ty_prim(&field_ty) == Some(Prim::String),
            };
            if !fits {
                let gives = match field {
                    RuntimeField::Date => {
                        "a date (`YYYY-MM-DD`), for a `date` or `string` parameter"
                    }
                    RuntimeField::UnixMs => "a number (ms since the Unix epoch)",
                    RuntimeField::Time => "a string (RFC 3339, like `2026-12-02T10:15:30.123Z`)",
                    _ => "a string",
                };
                cx.error(
                    src_line,
                    src_col,
                    format!(
                        "`source: runtime` `value: {text}` gives {gives}; `{name}` is a `{}`",
                        field_ty.describe()
                    ),
                );
            }
            ParamSource::Runtime { field }
        }
        Some("auth") => {
            need_string(cx, "auth");
            let field = match value.as_ref().map(|(v, _, l, c)| (v.as_str(), *l, *c)) {
                None | Some(("caller", _, _)) => AuthField::Caller,
                Some(("tenant", _, _)) => AuthField::Tenant,
                Some((other, line, col)) => {
                    cx.error(line, col, format!("unknown `value: {other}` of `source: auth` (expected `caller`, the identity that started the run, or `tenant`)"));
                    return None;
                }
            };
            ParamSource::Auth { field }
        }
        Some("config") => {
            need_string(cx, "config");
            let (text, line, col) = value_text(cx, "config")?;
            // `NAME` or `{{config.NAME}}`.
            let config_name = match text.strip_prefix("{{").and_then(|t| t.strip_suffix("}}")) {
                Some(inner) => config_placeholder_name(inner.trim()).map(str::to_owned),
                None => config_placeholder_name(&format!("config.{text}")).map(|_| text.clone()),
            };
            let Some(config_name) = config_name else {
                cx.error(line, col, format!("`value: {text}` of `source: config` must be a configuration name (letters, digits, `_`, `-`, `.`) or `{{{{config.NAME}}}}`"));
                return None;
            };
            ParamSource::Config { name: config_name }
        }
        Some("lookup") => {
            if let Some((_, _, line, col)) = &keys.value {
                cx.error(
                    *line,
                    *col,
                    "`source: lookup` takes `key:` and `table:`, not `value:`",
                );
            }
            let Some((key, kline, kcol)) = &keys.key else {
                cx.error(src_line, src_col, "`source: lookup` needs `key:` (a jq expression giving the key, like `.args.country`)");
                return None;
            };
            let key = parse_expr(cx, key, *kline, *kcol, "key")?;
            let Some(table_block) = keys.table else {
                cx.error(
                    src_line,
                    src_col,
                    "`source: lookup` needs `table:`, an indented block of `key: value` lines",
                );
                return None;
            };
            let mut table = BTreeMap::new();
            for entry in &table_block.children {
                let Some(kv) = entry_kv(&entry.line, "`key: value` in `table:`", cx) else {
                    continue;
                };
                let Some(text) = scalar(entry, &kv, cx) else {
                    continue;
                };
                match typed_literal(&field.ty, &text, is_quoted(kv.value), "value") {
                    Ok(v) => {
                        if table.insert(kv.key.to_owned(), v).is_some() {
                            cx.error(
                                entry.line.no,
                                kv.key_col,
                                format!("duplicate key `{}` in `table:`", kv.key),
                            );
                        }
                    }
                    Err(m) => cx.error(entry.line.no, kv.value_col, m),
                }
            }
            if table.is_empty() && table_block.children.is_empty() {
                cx.error(
                    table_block.line.no,
                    table_block.line.col(),
                    "`table:` is empty",
                );
            }
            ParamSource::Lookup { key, table }
        }
        Some(other) => {
            cx.error(src_line, src_col, format!("unknown `source: {other}` (expected `model`, `system`, `runtime`, `config`, `auth`, `expr` or `lookup`)"));
            return None;
        }
    };
    Some(InjectedParam {
        name,
        source,
        default: field.default.clone(),
        required: !field.optional,
    })
}

/// Where a `source: config` parameter may go: only into a request body or
/// an MCP call, never a URL (a URL ends up in errors and logs) nor a child
/// run's input (no worker resolves it there).
pub(super) fn check_injected_use(
    injected: &[(InjectedParam, (u32, u32))],
    props: &Props<'_>,
    tool: &str,
    cx: &mut Cx<'_>,
) {
    for (param, (line, col)) in injected {
        if !matches!(param.source, ParamSource::Config { .. }) {
            continue;
        }
        let name = &param.name;
        let in_text = |text: &str| {
            let squeezed: String = text.chars().filter(|c| !c.is_whitespace()).collect();
            squeezed.contains(&format!("{{{{{name}}}}}"))
        };
        let endpoint_has = props
            .endpoint
            .as_ref()
            .is_some_and(|(e, _, _)| e.contains(&format!("{{{name}}}")));
        let query_has = props.query_params.is_some_and(|b| {
            fn any_line(b: &Block, f: &dyn Fn(&str) -> bool) -> bool {
                f(&b.line.text) || b.children.iter().any(|c| any_line(c, f))
            }
            any_line(b, &in_text)
        });
        let method = props.method.as_deref().unwrap_or("POST");
        let to_query = props.body_template.is_none()
            && matches!(method, "GET" | "DELETE")
            && props.body_mode != Some(belay_proto::wire::BodyMode::None);
        let problem = match props.binding_type {
            Some(BindingType::Workflow) => Some("a `type: workflow` tool's arguments go to a child run, where no worker resolves it".to_owned()),
            _ if endpoint_has => Some("it is a path parameter, and a URL ends up in logs and errors".to_owned()),
            _ if query_has => Some("`query_params:` puts it in the URL, which ends up in logs and errors".to_owned()),
            Some(BindingType::Http | BindingType::AsyncWebhook) if to_query => Some(format!("a {method} request sends its arguments in the URL, which ends up in logs and errors")),
            _ => None,
        };
        if let Some(problem) = problem {
            cx.error(
                *line,
                *col,
                format!("parameter `{name}` of `{tool}` has `source: config`, but {problem}; a configured value goes in a request body or an MCP call only"),
            );
        }
    }
}

/// [`check_injected_use`] for each `request_variants:` item (its merged
/// request): a variant must not put a `source: config` parameter into a
/// URL either (a path parameter, a query parameter, or the arguments of a
/// request without a body). Reported at the parameter, naming the variant.
pub(super) fn check_injected_use_in_variants(
    injected: &[(InjectedParam, (u32, u32))],
    variants: &[crate::model::RequestVariantDef],
    tool: &str,
    cx: &mut Cx<'_>,
) {
    for (param, (line, col)) in injected {
        if !matches!(param.source, ParamSource::Config { .. }) {
            continue;
        }
        let name = &param.name;
        let placeholder = |text: &str| {
            let squeezed: String = text.chars().filter(|c| !c.is_whitespace()).collect();
            squeezed.contains(&format!("{{{{{name}}}}}"))
        };
        for v in variants {
            let method = v.method.trim().to_ascii_uppercase();
            let problem = if v.endpoint.contains(&format!("{{{name}}}")) {
                Some("it is a path parameter".to_owned())
            } else if v.request.query_params.iter().any(|q| placeholder(&q.value)) {
                Some("`query_params:` puts it in the URL".to_owned())
            } else if v.request.body_template.is_none()
                && matches!(method.as_str(), "GET" | "DELETE")
                && v.request.body_mode != belay_proto::wire::BodyMode::None
            {
                Some(format!("a {method} request sends its arguments in the URL"))
            } else {
                None
            };
            if let Some(problem) = problem {
                cx.error(
                    *line,
                    *col,
                    format!(
                        "parameter `{name}` of `{tool}` has `source: config`, but in request variant `{}` {problem}, which ends up in logs and errors; a configured value goes in a request body or an MCP call only",
                        v.name
                    ),
                );
            }
        }
    }
}

/// Apply an indented block to a parameter or field: `description:`, and
/// nested fields when it is an `object` / `object[]`.
fn enrich_field<'b>(
    field: &mut Field,
    blocks: &'b [Block],
    depth: usize,
    mut keys: Option<&mut SourceKeys<'b>>,
    cx: &mut Cx<'_>,
) {
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
    // The seed's schema keys: `properties:` (under `object` or `object[]`)
    // and `items:` (under `object[]`) with a block of field lines declare
    // the same fields as lines written directly under the parameter, so
    // their blocks are read as if they were (duplicates across both
    // included). Under an `object`, `items:` stays a field named `items`.
    let is_array = matches!(field.ty, TypeExpr::Array(_));
    let blocks: Vec<&Block> = blocks
        .iter()
        .flat_map(|b| {
            let schema_key = can_nest
                && !b.children.is_empty()
                && split_key(&b.line).is_some_and(|kv| {
                    kv.value.is_empty()
                        && !kv.optional
                        && (kv.key == "properties" || (kv.key == "items" && is_array))
                });
            if schema_key {
                b.children.iter().collect::<Vec<_>>()
            } else {
                vec![b]
            }
        })
        .collect();
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
        // Under an object parameter, `source: string` declares a field
        // named `source`; `source: system` is the setting.
        let key_declares_field = can_nest
            && (kv.value.is_empty()
                || parse_field_decl(&line.text, line.col())
                    .is_ok_and(|f| check_input_type(&f.ty).is_ok()));
        if SOURCE_KEYS.contains(&kv.key) && !kv.optional && !key_declares_field {
            match keys.as_deref_mut() {
                Some(keys) => keys.read(child, &kv, cx),
                None => cx.error(
                    line.no,
                    kv.key_col,
                    format!(
                        "`{}:` applies to a tool's parameters, not to nested fields",
                        kv.key
                    ),
                ),
            }
            continue;
        }
        if SEED_ENRICHMENT_KEYS.contains(&kv.key) && !declares_field {
            let message = match kv.key {
                "properties" => format!(
                    "`properties:` with a block of `field: type` lines declares the fields of an `object` or `object[]` parameter; `{}` is `{}`",
                    field.name,
                    field.ty.describe()
                ),
                "items" => format!(
                    "`items:` with a block of `field: type` lines declares the item fields of an `object[]` parameter; `{}` is `{}`",
                    field.name,
                    field.ty.describe()
                ),
                _ => format!("parameter setting `{}:` is not supported yet", kv.key),
            };
            cx.error(line.no, kv.key_col, message);
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
        if let Err(e) = signature::expand_named(&mut nested.ty, &cx.types)
            .and_then(|()| check_input_type(&nested.ty))
        {
            cx.error(line.no, e.column, e.message);
            continue;
        }
        if !first_time(&mut seen, &kv, line.no, &format!("field `{}`", kv.key), cx) {
            continue;
        }
        if !child.children.is_empty() {
            enrich_field(&mut nested, &child.children, depth + 1, None, cx);
        }
        if let Some(fields) = field.ty.object_fields_mut() {
            fields.push(nested);
        }
    }
}
