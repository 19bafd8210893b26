//! [`read_props`]: the one pass over a tool's property lines (or the
//! file's default lines), a `match` on each key that reads its value into
//! `Props` (`props.rs`) with the readers of the stage or feature the
//! property belongs to. Unknown properties, and the seed's that Belay does
//! not implement, are refused here.

use std::collections::BTreeMap;

use belay_proto::wire::{BodyMode, BodyType};
use serde_json::Value;

use crate::model::{ChildMode, Effect, MAX_TIMER_MS, RepeatSafety};
use crate::{NameAt, check_name, check_permission};

use super::behaviour::{
    parse_rate_limit, read_circuit_breaker, read_compaction, read_confirmation, read_hints,
    read_on_outcome,
};
use super::headers::{check_header_placeholders, read_headers};
use super::http::{MAX_TLS_PROFILE_CHARS, check_base_url, check_endpoint, is_xml_name};
use super::lines::{
    Block, Cx, KeyValue, block_only, first_time, head, is_quoted, keyword, parse_scalar,
    parse_timeout, scalar, split_key, to_u32,
};
use super::mcp::check_mcp_name;
use super::props::{BindingType, Props};
use super::{
    MAX_CALLBACK_TIMEOUT_SECONDS, SEED_BINDING_TYPES, SEED_TOOL_PROPERTIES, pii, process, retry,
    sampling, sandbox, secrets,
};

pub(super) fn read_props<'b>(
    children: impl Iterator<Item = &'b Block>,
    cx: &mut Cx<'_>,
) -> Props<'b> {
    let mut props = Props::default();
    let mut seen: BTreeMap<&str, u32> = BTreeMap::new();
    for child in children {
        let line = &child.line;
        let Some(kv) = split_key(line) else {
            cx.error(
                line.no,
                line.col(),
                format!("expected `property: value`, found `{}`", head(&line.text)),
            );
            continue;
        };
        if kv.optional {
            cx.error(
                line.no,
                kv.key_col,
                format!("unknown property `{}?`", kv.key),
            );
            continue;
        }
        // `body:` is the seed's alias of `body_template:`: one property.
        let key = if kv.key == "body" {
            "body_template"
        } else {
            kv.key
        };
        let what = format!("property `{}`", kv.key);
        if !first_time(&mut seen, &KeyValue { key, ..kv }, line.no, &what, cx) {
            continue;
        }
        props.present.insert(key.to_string());
        match key {
            "base_url" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    match check_base_url(&s) {
                        Some(m) => cx.error(line.no, kv.value_col, m),
                        None => props.base_url = Some((s, line.no, kv.value_col)),
                    }
                }
            }
            "auth" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    props.auth = Some((s, line.no, kv.value_col));
                }
            }
            "auth_config" | "query_params" | "request_variants" => {
                if block_only(child, &kv, cx) {
                    match key {
                        "auth_config" => props.auth_config = Some(child),
                        "query_params" => props.query_params = Some(child),
                        _ => props.request_variants = Some(child),
                    }
                }
            }
            "body_type" => {
                let choices = [
                    ("json", BodyType::Json),
                    ("form", BodyType::Form),
                    ("xml", BodyType::Xml),
                    ("text", BodyType::Text),
                ];
                if let Some(t) = keyword(child, &kv, &choices, cx) {
                    props.body_type = Some((t, line.no, kv.value_col));
                }
            }
            "xml_root" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    if is_xml_name(&s) {
                        props.xml_root = Some((s, line.no, kv.value_col));
                    } else {
                        cx.error(
                            line.no,
                            kv.value_col,
                            format!("`xml_root` must be an XML element name (a letter or `_`, then letters, digits, `_`, `-`, `.`), not `{s}`"),
                        );
                    }
                }
            }
            "body_schema" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    let col = kv.value_col + u32::from(is_quoted(kv.value));
                    match serde_json::from_str::<Value>(&s) {
                        Err(e) => cx.error(
                            line.no,
                            col,
                            format!("`body_schema` is not JSON ({e}); write the JSON Schema on one line, in single quotes"),
                        ),
                        Ok(schema) if !schema.is_object() => cx.error(
                            line.no,
                            col,
                            "`body_schema` must be a JSON Schema object, like `{\"type\": \"object\"}`",
                        ),
                        Ok(schema) => match crate::schema::compile(&schema) {
                            Err(e) => cx.error(
                                line.no,
                                col,
                                format!("`body_schema` is not a valid JSON Schema: {e}"),
                            ),
                            Ok(_) => props.body_schema = Some((schema, line.no, col)),
                        },
                    }
                }
            }
            "use_body_schema" => {
                let choices = [("true", true), ("false", false)];
                if let Some(b) = keyword(child, &kv, &choices, cx) {
                    props.use_body_schema = Some((b, line.no, kv.value_col));
                }
            }
            "tls_profile" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    let ok = !s.is_empty()
                        && s.chars().count() <= MAX_TLS_PROFILE_CHARS
                        && s.chars()
                            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
                    if ok {
                        props.tls_profile = Some(s);
                    } else {
                        cx.error(
                            line.no,
                            kv.value_col,
                            format!("`tls_profile` must be the name of a profile of the worker's configuration: 1 to {MAX_TLS_PROFILE_CHARS} letters, digits, `_`, `-` or `.`, not `{s}`"),
                        );
                    }
                }
            }
            "body_mode" => {
                let choices = [("auto", BodyMode::Auto), ("none", BodyMode::None)];
                props.body_mode = keyword(child, &kv, &choices, cx).or(props.body_mode);
            }
            "retry" | "retry_delay" | "retry_policy" => {
                retry::read_prop(child, &kv, &mut props.retry, cx);
            }
            "body_template" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    let col = kv.value_col + u32::from(is_quoted(kv.value));
                    props.body_template = Some((s, line.no, col));
                }
            }
            "description" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    props.description = Some(s);
                }
            }
            "type" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    if s == "http" {
                        props.binding_type = Some(BindingType::Http);
                    } else if s == "workflow" {
                        props.binding_type = Some(BindingType::Workflow);
                    } else if s == "async_webhook" {
                        props.binding_type = Some(BindingType::AsyncWebhook);
                    } else if s == "mcp" {
                        props.binding_type = Some(BindingType::Mcp);
                    } else if s == "sandbox" {
                        props.binding_type = Some(BindingType::Sandbox);
                    } else {
                        props.binding_type = Some(BindingType::Unsupported);
                        let message = if SEED_BINDING_TYPES.contains(&s.as_str()) {
                            format!("binding type `{s}` is not supported yet")
                        } else {
                            format!(
                                "unknown binding type `{s}` (expected `http`, `workflow`, `async_webhook`, `mcp` or `sandbox`)"
                            )
                        };
                        cx.error(line.no, kv.value_col, message);
                    }
                }
            }
            "endpoint" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    // Point at the text inside the quotes.
                    let col = kv.value_col + u32::from(is_quoted(kv.value));
                    if let Some((inner, at)) = secrets::first_secret_placeholder(&s) {
                        let col = col.saturating_add(to_u32(s[..at].chars().count()));
                        cx.error(
                            line.no,
                            col,
                            secrets::misplaced_message(inner, "`endpoint`"),
                        );
                    } else if let Some(message) = check_endpoint(&s) {
                        cx.error(line.no, kv.value_col, message);
                    } else {
                        props.endpoint = Some((s, line.no, col));
                    }
                }
            }
            "method" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    let upper = s.to_ascii_uppercase();
                    if ["GET", "POST", "PUT", "PATCH", "DELETE"].contains(&upper.as_str()) {
                        props.method = Some(upper);
                        props.method_at = (line.no, kv.value_col);
                    } else {
                        cx.error(
                            line.no,
                            kv.value_col,
                            format!(
                                "unknown method `{s}` (expected GET, POST, PUT, PATCH or DELETE)"
                            ),
                        );
                    }
                }
            }
            "timeout" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    match parse_timeout(&s) {
                        Ok(ms) => props.timeout_ms = Some(ms),
                        Err(m) => cx.error(line.no, kv.value_col, m),
                    }
                }
            }
            "permission" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    match check_permission("permission", &s) {
                        Some(m) => cx.error(line.no, kv.value_col, m),
                        None => props.permission = Some(s),
                    }
                }
            }
            "repeat_safety" => {
                let choices = [
                    ("never", RepeatSafety::Never),
                    ("idempotent", RepeatSafety::Idempotent),
                    ("reconcile", RepeatSafety::Reconcile),
                ];
                props.repeat_safety = keyword(child, &kv, &choices, cx).or(props.repeat_safety);
            }
            "reconcile_with" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    match check_name("tool", &s) {
                        Some(m) => cx.error(line.no, kv.value_col, m),
                        None => {
                            props.reconcile_with = Some(NameAt {
                                name: s,
                                line: line.no,
                                column: kv.value_col,
                            })
                        }
                    }
                }
            }
            "pool" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    match belay_proto::pools::check_pool_name(&s) {
                        Ok(()) => props.pool = Some(s),
                        Err(m) => cx.error(line.no, kv.value_col, m),
                    }
                }
            }
            "strict" => {
                if keyword(child, &kv, &[("true", true), ("false", false)], cx) == Some(true) {
                    props.strict = Some((line.no, kv.value_col));
                }
            }
            "pii_access" => {
                if let Some(s) = scalar(child, &kv, cx)
                    && let Some(access) = pii::read_pii_access(&s, line.no, kv.value_col, cx)
                {
                    props.pii_access = Some((access, line.no, kv.value_col));
                }
            }
            "scrub_secrets" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    match s.as_str() {
                        "true" => props.scrub_secrets = None,
                        "false" => props.scrub_secrets = Some(false),
                        other => cx.error(
                            line.no,
                            kv.value_col,
                            format!("`scrub_secrets:` must be `true` or `false`, found `{other}`"),
                        ),
                    }
                }
            }
            "headers" => {
                if block_only(child, &kv, cx) {
                    props.headers = read_headers(child, cx);
                    props.header_secrets = check_header_placeholders(child, true, cx);
                }
            }
            "RESULT_SECRETS" | "SECRET_ACCESS" => {
                if block_only(child, &kv, cx) {
                    if key == "RESULT_SECRETS" {
                        props.result_secrets = Some(child);
                    } else {
                        props.secret_access = Some(child);
                    }
                }
            }
            "resource" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    props.resource = Some((s, line.no, kv.value_col));
                }
            }
            "server" | "server_tool" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    match check_mcp_name(kv.key, &s) {
                        Some(m) => cx.error(line.no, kv.value_col, m),
                        None if kv.key == "server" => props.server = Some(s),
                        None => props.server_tool = Some(s),
                    }
                }
            }
            "parameters" => {
                if block_only(child, &kv, cx) {
                    props.parameters = Some(child);
                }
            }
            "workflow_id" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    match check_name("workflow", &s) {
                        Some(m) => cx.error(line.no, kv.value_col, m),
                        None => {
                            props.workflow_id = Some(NameAt {
                                name: s,
                                line: line.no,
                                column: kv.value_col,
                            })
                        }
                    }
                }
            }
            "mode" => {
                let choices = [("sync", ChildMode::Sync), ("async", ChildMode::Async)];
                props.mode = keyword(child, &kv, &choices, cx).or(props.mode);
            }
            "timeout_ms" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    let config = s
                        .trim()
                        .strip_prefix("{{")
                        .and_then(|r| r.strip_suffix("}}"))
                        .and_then(|inner| belay_proto::wire::config_placeholder_name(inner.trim()));
                    match (config, s.parse::<u64>()) {
                        (Some(name), _) => {
                            props.workflow_timeout_config =
                                Some((name.to_owned(), line.no, kv.value_col));
                        }
                        (None, Ok(ms)) if (1..=MAX_TIMER_MS).contains(&ms) => {
                            props.workflow_timeout_ms = Some(ms)
                        }
                        (None, Ok(ms)) if ms > MAX_TIMER_MS => cx.error(
                            line.no,
                            kv.value_col,
                            format!(
                                "`timeout_ms` is longer than 10 years ({MAX_TIMER_MS} ms), the longest a durable timer may wait, not `{ms}`"
                            ),
                        ),
                        _ => cx.error(
                            line.no,
                            kv.value_col,
                            format!(
                                "`timeout_ms` must be a whole number of ms, at least 1, or `{{{{config.NAME}}}}`, not `{s}`"
                            ),
                        ),
                    }
                }
            }
            "confirmation" => {
                if block_only(child, &kv, cx) {
                    props.confirmation = read_confirmation(child, cx);
                }
            }
            "rate_limit" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    match parse_rate_limit(&s) {
                        Ok(rate) => props.rate_limit = Some(rate),
                        Err(m) => cx.error(line.no, kv.value_col, m),
                    }
                }
            }
            "circuit_breaker" => {
                props.circuit_breaker = read_circuit_breaker(child, &kv, cx);
            }
            "compaction" => {
                if block_only(child, &kv, cx) {
                    props.compaction = read_compaction(child, cx);
                }
            }
            "process" => {
                if block_only(child, &kv, cx) {
                    props.process = process::read_process(child, cx);
                }
            }
            "on_result" | "on_error" => {
                if block_only(child, &kv, cx) {
                    let set = read_on_outcome(child, kv.key, cx);
                    if kv.key == "on_result" {
                        props.on_result = set;
                    } else {
                        props.on_error = set;
                    }
                }
            }
            "hints" => {
                if block_only(child, &kv, cx) {
                    (props.hints, props.hint_at) = read_hints(child, cx);
                }
            }
            "effect" => {
                let choices = [
                    ("read_only", Effect::ReadOnly),
                    ("state_write", Effect::StateWrite),
                    ("side_effect", Effect::SideEffect),
                ];
                if let Some(e) = keyword(child, &kv, &choices, cx) {
                    props.effect = Some((e, line.no, kv.value_col));
                }
            }
            "callback_url_field" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    let valid = !s.is_empty()
                        && s.split('.').all(|seg| {
                            !seg.is_empty()
                                && seg
                                    .chars()
                                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
                        });
                    if valid {
                        props.callback_url_field = Some((s, line.no, kv.value_col));
                    } else {
                        cx.error(
                            line.no,
                            kv.value_col,
                            format!(
                                "`callback_url_field` must be a dot-path of field names (letters, digits, `_`, `-`), like `callbackUrl` or `meta.reply_to`, not `{s}`"
                            ),
                        );
                    }
                }
            }
            "timeout_seconds" => {
                if let Some(s) = scalar(child, &kv, cx) {
                    match s.parse::<u64>() {
                        Ok(n) if (1..=MAX_CALLBACK_TIMEOUT_SECONDS).contains(&n) => {
                            props.callback_timeout_seconds = Some(n)
                        }
                        _ => cx.error(
                            line.no,
                            kv.value_col,
                            format!(
                                "`timeout_seconds` must be a whole number of seconds from 1 to {MAX_CALLBACK_TIMEOUT_SECONDS} (30 days), not `{s}`"
                            ),
                        ),
                    }
                }
            }
            "runtime" | "code" | "memory_mb" => {
                sandbox::read_prop(child, &kv, &mut props.sandbox, cx);
            }
            "sampling" => {
                props.sampling =
                    sampling::read(child, &kv, cx).map(|def| (def, line.no, kv.key_col));
            }
            "param_mapping" => {
                if block_only(child, &kv, cx) {
                    for entry in &child.children {
                        let Some(m) = split_key(&entry.line) else {
                            cx.error(
                                entry.line.no,
                                entry.line.col(),
                                "expected `workflow_input_key: tool_parameter`",
                            );
                            continue;
                        };
                        match parse_scalar(m.value, m.value_col) {
                            Ok(param) if !param.is_empty() => {
                                props.param_mapping.insert(m.key.to_owned(), param);
                            }
                            _ => cx.error(
                                entry.line.no,
                                m.value_col,
                                format!("`{}` needs the name of a tool parameter", m.key),
                            ),
                        }
                    }
                }
            }
            other => {
                let message = if SEED_TOOL_PROPERTIES.contains(&other) || other.starts_with("wsdl_")
                {
                    format!("property `{other}` is not supported yet")
                } else {
                    format!("unknown property `{other}`")
                };
                cx.error(line.no, kv.key_col, message);
            }
        }
    }
    props
}
