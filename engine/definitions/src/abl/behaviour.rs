//! Properties that shape how calls of a tool behave, beyond its request:
//! `confirmation:`, `rate_limit:`, `circuit_breaker:`, `compaction:`,
//! `on_result:` / `on_error:`, and `hints:` (checked against `effect:`).
//! Retries are read in `retry.rs`, caching in `cache.rs`.

use std::collections::BTreeMap;

use crate::check_permission;
use crate::expr::Expr;
use crate::model::{CircuitBreakerDef, CompactionDef, Effect, Latency, ToolHints};

use super::lines::{
    Block, Cx, KeyValue, block_only, entry_kv, first_time, keyword, parse_timeout, scalar,
    split_key, to_u32,
};
use super::props::{ConfirmationProps, Props};
use super::{MAX_RATE_LIMIT, MAX_RESET_MS, cache};

/// The `confirmation:` block: `require: always | never | when_side_effects`
/// (the `consent_*` properties are not supported: refused, not ignored),
/// `immutable_params: [a, b]`, `approver_grant: perm`. `None` for `never`.
pub(super) fn read_confirmation(block: &Block, cx: &mut Cx<'_>) -> Option<ConfirmationProps> {
    let mut require: Option<String> = None;
    let mut immutable = Vec::new();
    let mut grant = None;
    for entry in &block.children {
        let line = &entry.line;
        let Some(kv) = split_key(line) else {
            cx.error(
                line.no,
                line.col(),
                "expected `property: value` in `confirmation:`",
            );
            continue;
        };
        match kv.key {
            "require" => {
                let Some(v) = scalar(entry, &kv, cx) else { continue };
                match v.as_str() {
                    "always" | "never" | "when_side_effects" => require = Some(v),
                    other => cx.error(
                        line.no,
                        kv.value_col,
                        format!("unknown `require: {other}` (expected `always`, `never` or `when_side_effects`)"),
                    ),
                }
            }
            "immutable_params" => {
                let text = kv.value.trim();
                let Some(inner) = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')) else {
                    cx.error(
                        line.no,
                        kv.value_col,
                        "`immutable_params` takes a list of parameter names, like `[recipient, amount]`",
                    );
                    continue;
                };
                for item in inner.split(',').map(str::trim).filter(|i| !i.is_empty()) {
                    let name = item.trim_matches(|c| c == '"' || c == '\'');
                    immutable.push((name.to_owned(), line.no, kv.value_col));
                }
            }
            "approver_grant" => {
                if let Some(v) = scalar(entry, &kv, cx) {
                    match check_permission("approver_grant", &v) {
                        Some(m) => cx.error(line.no, kv.value_col, m),
                        None => grant = Some(v),
                    }
                }
            }
            key if key.starts_with("consent_") => cx.error(
                line.no,
                kv.key_col,
                format!("`{key}` is not supported yet: Belay asks an approver, not the end user in a conversation"),
            ),
            other => cx.error(
                line.no,
                kv.key_col,
                format!("unknown property `{other}` in `confirmation:` (expected `require`, `immutable_params`, `approver_grant`)"),
            ),
        }
    }
    match require.as_deref() {
        Some(r @ ("always" | "when_side_effects")) => Some(ConfirmationProps {
            immutable,
            grant,
            when_side_effects: r == "when_side_effects",
        }),
        Some(_) => None,
        None => {
            cx.error(
                block.line.no,
                block.line.col(),
                "`confirmation:` needs `require: always`, `require: never` or `require: when_side_effects`",
            );
            None
        }
    }
}

/// `rate_limit:`: calls per second, a decimal number more than 0 and at
/// most [`MAX_RATE_LIMIT`] (`2`, `0.5`: one call every 2 s).
pub(super) fn parse_rate_limit(s: &str) -> Result<f64, String> {
    let digits = |t: &str| !t.is_empty() && t.chars().all(|c| c.is_ascii_digit());
    let decimal = match s.split_once('.') {
        Some((whole, fraction)) => digits(whole) && digits(fraction),
        None => digits(s),
    };
    match s.parse::<f64>() {
        Ok(rate)
            if decimal
                && rate > 0.0
                && rate <= MAX_RATE_LIMIT
                && 1000.0 / rate <= crate::model::MAX_INTERVAL_MS as f64 =>
        {
            Ok(rate)
        }
        _ => Err(format!(
            "`rate_limit` must be a number of calls per second, at least one call a day (0.0000116) and at most {MAX_RATE_LIMIT} (like `10` or `0.5`), not `{s}`"
        )),
    }
}

/// `circuit_breaker:` as a block (`threshold:` and `resetMs:` on their own
/// lines) or inline (`{threshold: 5, resetMs: 30000}`). `reset_ms` is
/// accepted for `resetMs`. `None`, with errors, unless both are valid.
pub(super) fn read_circuit_breaker(
    block: &Block,
    kv: &KeyValue<'_>,
    cx: &mut Cx<'_>,
) -> Option<CircuitBreakerDef> {
    let line = &block.line;
    // (key, value, line, key column, value column) of each entry.
    let mut entries: Vec<(String, String, u32, u32, u32)> = Vec::new();
    if kv.value.is_empty() {
        for entry in &block.children {
            let Some(e) = entry_kv(&entry.line, "`threshold: N` or `resetMs: MS`", cx) else {
                continue;
            };
            if let Some(value) = scalar(entry, &e, cx) {
                entries.push((
                    e.key.to_owned(),
                    value,
                    entry.line.no,
                    e.key_col,
                    e.value_col,
                ));
            }
        }
    } else {
        let Some(inner) = kv.value.strip_prefix('{').and_then(|v| v.strip_suffix('}')) else {
            cx.error(
                line.no,
                kv.value_col,
                "`circuit_breaker` takes `{threshold: N, resetMs: MS}`, or `threshold:` and `resetMs:` on indented lines",
            );
            return None;
        };
        if let Some(first) = block.children.first() {
            cx.error(
                first.line.no,
                first.line.col(),
                "`circuit_breaker` takes `{threshold: N, resetMs: MS}` or indented lines, not both",
            );
            return None;
        }
        let leading = |t: &str| t.chars().take_while(|c| c.is_whitespace()).count();
        // Chars of the value before the item (the `{` at first).
        let mut offset = 1;
        for item in inner.split(',') {
            let col = kv.value_col + to_u32(offset + leading(item));
            offset += item.chars().count() + 1;
            let Some((key, value)) = item.split_once(':') else {
                cx.error(line.no, col, "expected `threshold: N` or `resetMs: MS`");
                continue;
            };
            let key_chars = key.trim_start().chars().count();
            let value_col = col + to_u32(key_chars + 1 + leading(value));
            entries.push((
                key.trim().to_owned(),
                value.trim().to_owned(),
                line.no,
                col,
                value_col,
            ));
        }
    }
    let mut threshold = None;
    let mut reset_ms = None;
    let mut seen: BTreeMap<&'static str, u32> = BTreeMap::new();
    for (key, value, eline, key_col, value_col) in &entries {
        let name = match key.as_str() {
            "threshold" => "threshold",
            "resetMs" | "reset_ms" => "resetMs",
            other => {
                cx.error(
                    *eline,
                    *key_col,
                    format!("unknown property `{other}` in `circuit_breaker:` (expected `threshold`, `resetMs`)"),
                );
                continue;
            }
        };
        if let Some(first) = seen.insert(name, *eline) {
            cx.error(
                *eline,
                *key_col,
                format!("duplicate `{name}` in `circuit_breaker:` (first on line {first})"),
            );
            continue;
        }
        let parsed = value.parse::<u64>().ok();
        match (name, parsed) {
            ("threshold", Some(n)) if n >= 1 && n <= u64::from(u32::MAX) => {
                threshold = u32::try_from(n).ok();
            }
            ("threshold", _) => cx.error(
                *eline,
                *value_col,
                format!("`threshold` must be a whole number of consecutive failures, at least 1, not `{value}`"),
            ),
            (_, Some(ms)) if (1..=MAX_RESET_MS).contains(&ms) => reset_ms = Some(ms),
            _ => cx.error(
                *eline,
                *value_col,
                format!("`resetMs` must be a whole number of ms from 1 to {MAX_RESET_MS} (30 days), not `{value}`"),
            ),
        }
    }
    for (name, what) in [
        ("threshold", "consecutive failures that open the circuit"),
        ("resetMs", "ms an open circuit waits before a probe call"),
    ] {
        if !seen.contains_key(name) {
            cx.error(
                line.no,
                kv.key_col,
                format!("`circuit_breaker:` needs `{name}:` ({what})"),
            );
        }
    }
    Some(CircuitBreakerDef {
        threshold: threshold?,
        reset_ms: reset_ms?,
    })
}

/// The `compaction:` block: `essential_fields: [a, b.c]` (or one path per
/// `- item` line). The seed's other properties are refused.
/// Most paths one `compaction.essential_fields` may list: selecting costs
/// (keys of the result) × (paths) inside a run's transition, so the count
/// is bounded.
pub(super) const MAX_ESSENTIAL_FIELDS: usize = 64;

/// Most variables one `on_result.set:` or `on_error.set:` may set: each is
/// an evaluation over the whole result inside a run's transition, and its
/// value is recorded in the `tool_vars_set` event.
pub(super) const MAX_OUTCOME_VARS: usize = 16;

pub(super) fn read_compaction(block: &Block, cx: &mut Cx<'_>) -> Option<CompactionDef> {
    let errors_before = cx.out.errors.len();
    let mut fields: Option<Vec<String>> = None;
    let mut max_len: Option<u32> = None;
    for entry in &block.children {
        let line = &entry.line;
        let Some(kv) = entry_kv(line, "`essential_fields: [path, ...]` in `compaction:`", cx)
        else {
            continue;
        };
        match kv.key {
            "essential_fields" => {
                if fields.is_some() {
                    cx.error(line.no, kv.key_col, "duplicate `essential_fields` in `compaction:`");
                    continue;
                }
                fields = read_field_paths(entry, &kv, cx);
                if let Some(f) = &fields
                    && f.len() > MAX_ESSENTIAL_FIELDS
                {
                    cx.error(
                        line.no,
                        kv.key_col,
                        format!(
                            "`essential_fields` lists {} paths, more than the limit of {MAX_ESSENTIAL_FIELDS}",
                            f.len()
                        ),
                    );
                    fields = None;
                }
            }
            "max_description_length" => {
                if max_len.is_some() {
                    cx.error(
                        line.no,
                        kv.key_col,
                        "duplicate `max_description_length` in `compaction:`",
                    );
                    continue;
                }
                if let Some(s) = scalar(entry, &kv, cx) {
                    match s.parse::<u32>() {
                        Ok(n) if n >= 1 => max_len = Some(n),
                        _ => cx.error(
                            line.no,
                            kv.value_col,
                            format!(
                                "`max_description_length` must be a whole number of characters, at least 1, not `{s}`"
                            ),
                        ),
                    }
                }
            }
            "summary_timeout_ms" => cx.error(
                line.no,
                kv.key_col,
                "`compaction.summary_timeout_ms` is not applicable: Belay never summarises a result with a model (what the model sees is cut by `essential_fields`, `max_description_length` and `max_result_bytes`, deterministically)",
            ),
            "max_search_tokens" => cx.error(
                line.no,
                kv.key_col,
                "`compaction.max_search_tokens` is not applicable: it applies to SearchAI results, and Belay has no SearchAI tools",
            ),
            other => cx.error(
                line.no,
                kv.key_col,
                format!(
                    "unknown property `{other}` in `compaction:` (expected `essential_fields` or `max_description_length`)"
                ),
            ),
        }
    }
    if cx.out.errors.len() != errors_before {
        return None;
    }
    if fields.is_none() && max_len.is_none() {
        cx.error(
            block.line.no,
            block.line.col(),
            "`compaction:` needs `essential_fields: [path, ...]` or `max_description_length: N`",
        );
        return None;
    }
    Some(CompactionDef {
        essential_fields: fields.unwrap_or_default(),
        max_description_length: max_len,
    })
}

/// `essential_fields:` as `[a, b.c]` or as `- a` lines: dotted paths, each
/// segment non-empty; at least one. `None`, with errors, when one is bad.
fn read_field_paths(block: &Block, kv: &KeyValue<'_>, cx: &mut Cx<'_>) -> Option<Vec<String>> {
    let line = &block.line;
    // (item, line, column) of each path as written.
    let mut items: Vec<(String, u32, u32)> = Vec::new();
    if kv.value.is_empty() {
        for entry in &block.children {
            let text = entry.line.text.as_str();
            let Some(item) = text.strip_prefix('-') else {
                cx.error(
                    entry.line.no,
                    entry.line.col(),
                    "expected `- path` in `essential_fields:`",
                );
                continue;
            };
            let lead = item.chars().take_while(|c| c.is_whitespace()).count();
            items.push((
                item.trim().to_owned(),
                entry.line.no,
                entry.line.col() + to_u32(1 + lead),
            ));
        }
    } else {
        let Some(inner) = kv.value.strip_prefix('[').and_then(|v| v.strip_suffix(']')) else {
            cx.error(
                line.no,
                kv.value_col,
                "`essential_fields` takes a list of dotted paths, like `[items.id, items.name]`",
            );
            return None;
        };
        if let Some(first) = block.children.first() {
            cx.error(
                first.line.no,
                first.line.col(),
                "`essential_fields` takes `[a, b]` or `- a` lines, not both",
            );
            return None;
        }
        let mut offset = 1;
        for item in inner.split(',') {
            let lead = item.chars().take_while(|c| c.is_whitespace()).count();
            let col = kv.value_col + to_u32(offset + lead);
            offset += item.chars().count() + 1;
            if item.trim().is_empty() && inner.trim().is_empty() {
                continue;
            }
            items.push((item.trim().to_owned(), line.no, col));
        }
    }
    let mut paths = Vec::new();
    let mut ok = true;
    for (item, no, col) in items {
        let path = item.trim_matches(|c| c == '"' || c == '\'');
        if path.is_empty() {
            cx.error(no, col, "empty item in `essential_fields`");
            ok = false;
        } else if path.split('.').any(str::is_empty) {
            cx.error(
                no,
                col,
                format!("`{item}` is not a field path: write names joined by `.`, like `items.id`"),
            );
            ok = false;
        } else if path.chars().any(|c| c.is_whitespace() || c.is_control()) {
            cx.error(
                no,
                col,
                format!("field path `{path}` must not contain spaces"),
            );
            ok = false;
        } else if !paths.iter().any(|p| p == path) {
            paths.push(path.to_owned());
        }
    }
    if ok && paths.is_empty() {
        cx.error(
            line.no,
            kv.value_col.max(kv.key_col),
            "`essential_fields` needs at least one field path",
        );
        return None;
    }
    ok.then_some(paths)
}

/// The `on_result:` or `on_error:` block: `set:` with one `var: <jq>` line
/// per run variable. `do:` action blocks are refused.
pub(super) fn read_on_outcome(
    block: &Block,
    what: &str,
    cx: &mut Cx<'_>,
) -> BTreeMap<String, Expr> {
    let mut set = BTreeMap::new();
    let input = if what == "on_result" {
        "`{\"result\": <the result>}`, like `.result.balance`"
    } else {
        "`{\"error\": {\"message\": <why>}}`, like `.error.message`"
    };
    for entry in &block.children {
        let line = &entry.line;
        let Some(kv) = entry_kv(line, &format!("`set:` in `{what}:`"), cx) else {
            continue;
        };
        match kv.key {
            "set" => {
                if !block_only(entry, &kv, cx) {
                    continue;
                }
                for item in &entry.children {
                    let Some(v) = entry_kv(&item.line, "`variable: <jq expression>`", cx) else {
                        continue;
                    };
                    let name_ok = v.key.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                        && v.key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                    if !name_ok {
                        cx.error(
                            item.line.no,
                            v.key_col,
                            format!("variable name `{}` must be letters, digits and `_`, not starting with a digit", v.key),
                        );
                        continue;
                    }
                    if set.contains_key(v.key) {
                        cx.error(
                            item.line.no,
                            v.key_col,
                            format!("duplicate variable `{}` in `{what}.set:`", v.key),
                        );
                        continue;
                    }
                    if set.len() >= MAX_OUTCOME_VARS {
                        cx.error(
                            item.line.no,
                            v.key_col,
                            format!(
                                "`{what}.set:` sets more than {MAX_OUTCOME_VARS} variables; keep one variable holding an object instead"
                            ),
                        );
                        continue;
                    }
                    let Some(text) = scalar(item, &v, cx) else {
                        continue;
                    };
                    if text.trim().is_empty() {
                        cx.error(
                            item.line.no,
                            v.value_col,
                            format!("`{}` needs a jq expression over {input}", v.key),
                        );
                        continue;
                    }
                    match Expr::parse(&text) {
                        Ok(e) => {
                            set.insert(v.key.to_owned(), e);
                        }
                        Err(e) => {
                            let hint = if text.starts_with("result") || text.starts_with("error") {
                                "; the expression is jq over {\"result\": ...} or {\"error\": ...}: write `.result.balance`, with the leading `.`"
                            } else {
                                ""
                            };
                            cx.error(
                                item.line.no,
                                v.value_col,
                                format!("`{}` is not a valid jq expression: {e}{hint}", v.key),
                            );
                        }
                    }
                }
            }
            "do" => cx.error(
                line.no,
                kv.key_col,
                format!("`{what}.do:` action blocks are not applicable: they are actions of a conversational runtime; in Belay, control flow is the workflow graph (`next`, `branch`, `on_error`)"),
            ),
            other => cx.error(
                line.no,
                kv.key_col,
                format!("unknown property `{other}` in `{what}:` (expected `set`)"),
            ),
        }
    }
    set
}

/// The `hints:` block: `cacheable`, `side_effects`, `requires_auth`
/// (`true`/`false`), `latency` (`fast`, `medium`, `slow`), `timeout` (a
/// duration, as `timeout:`; a bare number is ms), `cache_ttl` (a Belay
/// extension: `cache::parse_ttl`); with where `cacheable` and `cache_ttl`
/// were written, for `cache::check`.
pub(super) fn read_hints(
    block: &Block,
    cx: &mut Cx<'_>,
) -> (ToolHints, BTreeMap<&'static str, (u32, u32)>) {
    let mut hints = ToolHints::default();
    let mut at = BTreeMap::new();
    let mut seen: BTreeMap<&str, u32> = BTreeMap::new();
    for entry in &block.children {
        let line = &entry.line;
        let Some(kv) = entry_kv(line, "`hint: value` in `hints:`", cx) else {
            continue;
        };
        if !first_time(&mut seen, &kv, line.no, &format!("hint `{}`", kv.key), cx) {
            continue;
        }
        for known in ["cacheable", "cache_ttl"] {
            if kv.key == known {
                at.insert(known, (line.no, kv.value_col));
            }
        }
        let flag = |cx: &mut Cx<'_>| keyword(entry, &kv, &[("true", true), ("false", false)], cx);
        match kv.key {
            "cacheable" => hints.cacheable = flag(cx),
            "side_effects" => hints.side_effects = flag(cx),
            "requires_auth" => hints.requires_auth = flag(cx),
            "latency" => {
                let choices = [
                    ("fast", Latency::Fast),
                    ("medium", Latency::Medium),
                    ("slow", Latency::Slow),
                ];
                hints.latency = keyword(entry, &kv, &choices, cx);
            }
            "timeout" => {
                if let Some(s) = scalar(entry, &kv, cx) {
                    match parse_timeout(&s) {
                        Ok(ms) => hints.timeout_ms = Some(ms),
                        Err(m) => cx.error(line.no, kv.value_col, m),
                    }
                }
            }
            "cache_ttl" => {
                if let Some(s) = scalar(entry, &kv, cx) {
                    match cache::parse_ttl(&s) {
                        Ok(ms) => hints.cache_ttl_ms = Some(ms),
                        Err(m) => cx.error(line.no, kv.value_col, m),
                    }
                }
            }
            other => cx.error(
                line.no,
                kv.key_col,
                format!("unknown hint `{other}` (expected `cacheable`, `cache_ttl`, `latency`, `side_effects`, `requires_auth` or `timeout`)"),
            ),
        }
    }
    (hints, at)
}

/// `effect:` and `hints.side_effects` must agree: `read_only` with
/// `side_effects: true`, or a writing effect with `side_effects: false`,
/// is a contradiction the author has to settle.
pub(super) fn check_side_effect_hints(props: &Props<'_>, cx: &mut Cx<'_>) {
    if let (Some((effect, line, col)), Some(side_effects)) =
        (props.effect, props.hints.side_effects)
        && (effect == Effect::ReadOnly) == side_effects
    {
        let written = match effect {
            Effect::ReadOnly => "read_only",
            Effect::StateWrite => "state_write",
            Effect::SideEffect => "side_effect",
        };
        cx.error(
            line,
            col,
            format!("`effect: {written}` contradicts `hints.side_effects: {side_effects}`; keep one of them"),
        );
    }
}
