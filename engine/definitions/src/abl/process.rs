//! `process:` of a tool in a `.tools.abl` file (seed `abl-tools.md`,
//! "Input/output transforms (`process`)"), checked into the stored
//! [`ProcessDef`].
//!
//! Rules:
//! - `before:` takes `params:` (one `name: <jq>` line per parameter),
//!   `require:` (`[<jq>, ...]` or `- <jq>` lines) and `on_fail:`; at least
//!   one of `params` and `require`. Its expressions are jq over
//!   `{"args": <the arguments>}`: the seed's `amount * 100` is written
//!   `.args.amount * 100`.
//! - `after:` takes `result:` (one `field: <jq>` line per field of the new
//!   result; required) and `on_fail:`. Its expressions are jq over
//!   `{"result": <the result>, "args": <the arguments>}`, like `on_result`.
//! - `on_fail:` is `block("msg")`, `reask("msg")`, `warn("msg")`,
//!   `use_original` or `fallback("msg")`; without it, `block` with a
//!   message naming the stage.
//! - `before.use:` (a named transform) is refused: Belay has no registry of
//!   named transforms.
//! - Each stage holds at most [`MAX_PROCESS_EXPRS`] expressions: each is an
//!   evaluation inside a run's transition.

use std::collections::BTreeMap;

use super::super::expr::Expr;
use super::super::model::{OnFail, ProcessAfter, ProcessBefore, ProcessDef};
use super::super::signature;
use super::lines::{Block, Cx, KeyValue, block_only, entry_kv, scalar, to_u32};

/// Most expressions (`params` plus `require`, or `result`) one stage may hold.
pub(super) const MAX_PROCESS_EXPRS: usize = 16;

/// Reads the `process:` block of a tool. `None`, with errors, when any part
/// is wrong.
pub(super) fn read_process(block: &Block, cx: &mut Cx<'_>) -> Option<ProcessDef> {
    let errors_before = cx.out.errors.len();
    let mut def = ProcessDef {
        before: None,
        after: None,
    };
    let mut seen: BTreeMap<&str, u32> = BTreeMap::new();
    for entry in &block.children {
        let line = &entry.line;
        let Some(kv) = entry_kv(line, "`before:` or `after:` in `process:`", cx) else {
            continue;
        };
        if let Some(first) = seen.insert(kv.key, line.no) {
            cx.error(
                line.no,
                kv.key_col,
                format!(
                    "duplicate `{}` in `process:` (first on line {first})",
                    kv.key
                ),
            );
            continue;
        }
        match kv.key {
            "before" if block_only(entry, &kv, cx) => def.before = read_before(entry, cx),
            "after" if block_only(entry, &kv, cx) => def.after = read_after(entry, cx),
            "before" | "after" => {}
            other => cx.error(
                line.no,
                kv.key_col,
                format!("unknown property `{other}` in `process:` (expected `before` or `after`)"),
            ),
        }
    }
    if def.before.is_none() && def.after.is_none() && cx.out.errors.len() == errors_before {
        cx.error(
            block.line.no,
            block.line.col(),
            "`process:` needs `before:` or `after:`",
        );
    }
    (cx.out.errors.len() == errors_before).then_some(def)
}

fn read_before(block: &Block, cx: &mut Cx<'_>) -> Option<ProcessBefore> {
    let errors_before = cx.out.errors.len();
    let mut params = BTreeMap::new();
    let mut require = Vec::new();
    let mut on_fail = None;
    let mut seen: BTreeMap<&str, u32> = BTreeMap::new();
    for entry in &block.children {
        let line = &entry.line;
        let Some(kv) = entry_kv(line, "`params:`, `require:` or `on_fail:` in `before:`", cx)
        else {
            continue;
        };
        if let Some(first) = seen.insert(kv.key, line.no) {
            cx.error(
                line.no,
                kv.key_col,
                format!(
                    "duplicate `{}` in `before:` (first on line {first})",
                    kv.key
                ),
            );
            continue;
        }
        match kv.key {
            "params" => {
                if block_only(entry, &kv, cx) {
                    params = read_expr_map(entry, "params", "args", cx);
                }
            }
            "require" => require = read_expr_list(entry, &kv, cx),
            "on_fail" => on_fail = read_on_fail(entry, &kv, cx),
            "use" => cx.error(
                line.no,
                kv.key_col,
                "`process.before.use` (a named transform) is not applicable: Belay has no registry of named transforms; write the transform inline as `params:` and `require:`",
            ),
            other => cx.error(
                line.no,
                kv.key_col,
                format!(
                    "unknown property `{other}` in `before:` (expected `params`, `require` or `on_fail`)"
                ),
            ),
        }
    }
    if params.len() + require.len() > MAX_PROCESS_EXPRS {
        cx.error(
            block.line.no,
            block.line.col(),
            format!(
                "`before:` holds {} expressions, more than the limit of {MAX_PROCESS_EXPRS}",
                params.len() + require.len()
            ),
        );
    }
    if params.is_empty() && require.is_empty() && cx.out.errors.len() == errors_before {
        cx.error(
            block.line.no,
            block.line.col(),
            "`before:` needs `params:` or `require:`",
        );
    }
    (cx.out.errors.len() == errors_before).then(|| ProcessBefore {
        params,
        require,
        on_fail: on_fail
            .unwrap_or_else(|| OnFail::Block("the tool's `process.before` failed".to_owned())),
    })
}

fn read_after(block: &Block, cx: &mut Cx<'_>) -> Option<ProcessAfter> {
    let errors_before = cx.out.errors.len();
    let mut result = BTreeMap::new();
    let mut on_fail = None;
    let mut seen: BTreeMap<&str, u32> = BTreeMap::new();
    for entry in &block.children {
        let line = &entry.line;
        let Some(kv) = entry_kv(line, "`result:` or `on_fail:` in `after:`", cx) else {
            continue;
        };
        if let Some(first) = seen.insert(kv.key, line.no) {
            cx.error(
                line.no,
                kv.key_col,
                format!("duplicate `{}` in `after:` (first on line {first})", kv.key),
            );
            continue;
        }
        match kv.key {
            "result" => {
                if block_only(entry, &kv, cx) {
                    result = read_expr_map(entry, "result", "result", cx);
                }
            }
            "on_fail" => on_fail = read_on_fail(entry, &kv, cx),
            other => cx.error(
                line.no,
                kv.key_col,
                format!("unknown property `{other}` in `after:` (expected `result` or `on_fail`)"),
            ),
        }
    }
    if result.len() > MAX_PROCESS_EXPRS {
        cx.error(
            block.line.no,
            block.line.col(),
            format!(
                "`after.result:` holds {} expressions, more than the limit of {MAX_PROCESS_EXPRS}",
                result.len()
            ),
        );
    }
    if result.is_empty() && cx.out.errors.len() == errors_before {
        cx.error(
            block.line.no,
            block.line.col(),
            "`after:` needs `result:` with one `field: <jq expression>` line per field",
        );
    }
    (cx.out.errors.len() == errors_before).then(|| ProcessAfter {
        result,
        on_fail: on_fail
            .unwrap_or_else(|| OnFail::Block("the tool's `process.after` failed".to_owned())),
    })
}

/// The hint for an expression that does not parse, by the stage's input.
fn hint(text: &str, input: &str) -> String {
    let starts_bare = text.chars().next().is_some_and(|c| c.is_ascii_alphabetic());
    if !starts_bare {
        return String::new();
    }
    if input == "args" {
        "; the expression is jq over {\"args\": <the arguments>}: write `.args.amount * 100`, with the leading `.`".to_owned()
    } else {
        "; the expression is jq over {\"result\": <the result>, \"args\": <the arguments>}: write `.result.amount_cents / 100`, with the leading `.`".to_owned()
    }
}

/// One parsed expression, or an error at `(no, col)`.
fn parse_expr(
    text: &str,
    what: &str,
    input: &str,
    no: u32,
    col: u32,
    cx: &mut Cx<'_>,
) -> Option<Expr> {
    if text.trim().is_empty() {
        cx.error(no, col, format!("{what} needs a jq expression"));
        return None;
    }
    match Expr::parse(text) {
        Ok(e) => Some(e),
        Err(e) => {
            let hint = hint(text.trim(), input);
            cx.error(
                no,
                col,
                format!("{what} is not a valid jq expression: {e}{hint}"),
            );
            None
        }
    }
}

/// `name: <jq>` lines under `params:` or `result:`.
fn read_expr_map(
    block: &Block,
    what: &str,
    input: &str,
    cx: &mut Cx<'_>,
) -> BTreeMap<String, Expr> {
    let mut map = BTreeMap::new();
    for item in &block.children {
        let Some(v) = entry_kv(&item.line, "`name: <jq expression>`", cx) else {
            continue;
        };
        let name_ok = v
            .key
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && v.key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !name_ok {
            cx.error(
                item.line.no,
                v.key_col,
                format!(
                    "name `{}` in `{what}:` must be letters, digits and `_`, not starting with a digit",
                    v.key
                ),
            );
            continue;
        }
        if map.contains_key(v.key) {
            cx.error(
                item.line.no,
                v.key_col,
                format!("duplicate `{}` in `{what}:`", v.key),
            );
            continue;
        }
        let Some(text) = scalar(item, &v, cx) else {
            continue;
        };
        let label = format!("`{}`", v.key);
        if let Some(e) = parse_expr(&text, &label, input, item.line.no, v.value_col, cx) {
            map.insert(v.key.to_owned(), e);
        }
    }
    map
}

/// `require: [<jq>, ...]` (split on top-level commas) or `- <jq>` lines.
fn read_expr_list(block: &Block, kv: &KeyValue<'_>, cx: &mut Cx<'_>) -> Vec<Expr> {
    let line = &block.line;
    let mut items: Vec<(String, u32, u32)> = Vec::new();
    if kv.value.is_empty() {
        for entry in &block.children {
            let text = entry.line.text.as_str();
            let Some(item) = text.strip_prefix('-') else {
                cx.error(
                    entry.line.no,
                    entry.line.col(),
                    "expected `- <jq expression>` in `require:`",
                );
                continue;
            };
            let lead = item.chars().take_while(|c| c.is_whitespace()).count();
            items.push((
                unquote(item.trim()),
                entry.line.no,
                entry.line.col() + to_u32(1 + lead),
            ));
        }
    } else {
        let Some(inner) = kv.value.strip_prefix('[').and_then(|v| v.strip_suffix(']')) else {
            cx.error(
                line.no,
                kv.value_col,
                "`require` takes a list of jq expressions, like `[.args.amount > 0]`",
            );
            return Vec::new();
        };
        if let Some(first) = block.children.first() {
            cx.error(
                first.line.no,
                first.line.col(),
                "`require` takes `[a, b]` or `- a` lines, not both",
            );
            return Vec::new();
        }
        for (offset, item) in split_top_level(inner) {
            let lead = item.chars().take_while(|c| c.is_whitespace()).count();
            items.push((
                unquote(item.trim()),
                line.no,
                kv.value_col + to_u32(1 + offset + lead),
            ));
        }
    }
    if items.is_empty() {
        cx.error(
            line.no,
            kv.key_col,
            "`require` needs at least one jq expression",
        );
    }
    items
        .into_iter()
        .filter_map(|(text, no, col)| parse_expr(&text, "`require` item", "args", no, col, cx))
        .collect()
}

/// A `"…"` or `'…'` item without its quotes (no escapes inside).
fn unquote(s: &str) -> String {
    for q in ['"', '\''] {
        if let Some(inner) = s.strip_prefix(q).and_then(|v| v.strip_suffix(q))
            && !inner.contains(q)
        {
            return inner.to_owned();
        }
    }
    s.to_owned()
}

/// `inner` split on commas outside brackets, braces, parentheses and
/// strings: each item with its character offset in `inner`.
fn split_top_level(inner: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    let mut start_byte = 0;
    let mut start_char = 0;
    for (n, (i, c)) in inner.char_indices().enumerate() {
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '"' | '\'' => quote = Some(c),
            '[' | '{' | '(' => depth += 1,
            ']' | '}' | ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push((start_char, &inner[start_byte..i]));
                start_byte = i + 1;
                start_char = n + 1;
            }
            _ => {}
        }
    }
    if !inner[start_byte..].trim().is_empty() || !out.is_empty() {
        out.push((start_char, &inner[start_byte..]));
    }
    out
}

/// `on_fail: block("msg") | reask("msg") | warn("msg") | use_original |
/// fallback("msg")`.
fn read_on_fail(block: &Block, kv: &KeyValue<'_>, cx: &mut Cx<'_>) -> Option<OnFail> {
    let line = &block.line;
    const EXPECTED: &str = "`on_fail` takes `block(\"msg\")`, `reask(\"msg\")`, `warn(\"msg\")`, `use_original` or `fallback(\"msg\")`";
    if let Some(first) = block.children.first() {
        cx.error(
            first.line.no,
            first.line.col(),
            "`on_fail` takes a value on its own line, not an indented block",
        );
        return None;
    }
    let value = kv.value.trim();
    if value == "use_original" {
        return Some(OnFail::UseOriginal);
    }
    let Some(open) = value.find('(') else {
        cx.error(line.no, kv.value_col, format!("{EXPECTED}, not `{value}`"));
        return None;
    };
    let name = &value[..open];
    let make: fn(String) -> OnFail = match name {
        "block" => OnFail::Block,
        "reask" => OnFail::Reask,
        "warn" => OnFail::Warn,
        "fallback" => OnFail::Fallback,
        _ => {
            cx.error(line.no, kv.value_col, format!("{EXPECTED}, not `{value}`"));
            return None;
        }
    };
    let chars: Vec<char> = value.chars().collect();
    let start = name.chars().count() + 1;
    let arg_col = kv.value_col + to_u32(start);
    if !matches!(chars.get(start), Some('"' | '\'')) {
        cx.error(
            line.no,
            arg_col,
            format!("`{name}(…)` takes a quoted message, like `{name}(\"Please provide a positive amount.\")`"),
        );
        return None;
    }
    match signature::lex_string(&chars, start) {
        Ok((msg, next)) => {
            let rest: String = chars[next..].iter().collect();
            if rest.trim() != ")" {
                // Point at the first character that does not belong.
                let lead = rest.chars().take_while(|c| c.is_whitespace()).count();
                let mut at = next + lead;
                if rest.trim_start().starts_with(')') {
                    let after = &chars[at + 1..];
                    at += 1 + after.iter().take_while(|c| c.is_whitespace()).count();
                }
                cx.error(
                    line.no,
                    kv.value_col + to_u32(at),
                    format!("expected `)` after the message of `{name}(…)`, and nothing after it"),
                );
                return None;
            }
            if msg.trim().is_empty() {
                cx.error(
                    line.no,
                    arg_col,
                    format!("the message of `{name}(…)` is empty"),
                );
                return None;
            }
            Some(make(msg))
        }
        Err((at, m)) => {
            cx.error(line.no, kv.value_col + to_u32(at), m);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::parse_tools_file;
    use super::*;
    use crate::model::ToolDef;

    const FILE: &str = "tools/fx.tools.abl";

    fn tool_with(extra: &str) -> String {
        format!(
            "TOOLS:\n  quote_fx(amount: number, from: string, to: string) -> object\n    type: http\n    endpoint: \"/x\"\n    permission: p.read\n    repeat_safety: idempotent\n{extra}"
        )
    }

    fn one_tool(extra: &str) -> ToolDef {
        let out = parse_tools_file(FILE, &tool_with(extra));
        assert_eq!(out.errors, vec![], "unexpected errors");
        out.tools.into_iter().next().expect("one tool")
    }

    /// Errors as `file:line:column: message`.
    fn errors(extra: &str) -> Vec<String> {
        let out = parse_tools_file(FILE, &tool_with(extra));
        assert!(out.tools.is_empty());
        out.errors
            .iter()
            .map(|e| format!("{}:{}:{}: {}", e.file, e.line, e.column, e.message))
            .collect()
    }

    #[test]
    fn process_before_and_after_are_parsed() {
        let t = one_tool(concat!(
            "    process:\n",
            "      before:\n",
            "        params:\n",
            "          amount_cents: \".args.amount * 100\"\n",
            "        require: [.args.amount > 0, \"[.args.from, .args.to] | length == 2\"]\n",
            "        on_fail: reask(\"Please provide a positive amount.\")\n",
            "      after:\n",
            "        result:\n",
            "          converted: \".result.amount_cents / 100\"\n",
            "        on_fail: warn(\"Could not normalize the quote.\")\n",
        ));
        let p = t.process.expect("process");
        let before = p.before.expect("before");
        assert_eq!(before.params["amount_cents"].source(), ".args.amount * 100");
        let require: Vec<&str> = before.require.iter().map(|e| e.source()).collect();
        assert_eq!(
            require,
            vec![".args.amount > 0", "[.args.from, .args.to] | length == 2"]
        );
        assert_eq!(
            before.on_fail,
            OnFail::Reask("Please provide a positive amount.".into())
        );
        let after = p.after.expect("after");
        assert_eq!(
            after.result["converted"].source(),
            ".result.amount_cents / 100"
        );
        assert_eq!(
            after.on_fail,
            OnFail::Warn("Could not normalize the quote.".into())
        );
    }

    #[test]
    fn on_fail_forms_and_defaults() {
        for (text, want) in [
            ("block(\"no\")", OnFail::Block("no".into())),
            ("use_original", OnFail::UseOriginal),
            ("fallback('none')", OnFail::Fallback("none".into())),
        ] {
            let t = one_tool(&format!(
                "    process:\n      before:\n        require:\n          - .args.amount > 0\n        on_fail: {text}\n"
            ));
            let before = t.process.and_then(|p| p.before).expect("before");
            assert_eq!(before.on_fail, want);
        }
        let t = one_tool("    process:\n      after:\n        result:\n          x: .result\n");
        let after = t.process.and_then(|p| p.after).expect("after");
        assert!(matches!(after.on_fail, OnFail::Block(_)));
    }

    #[test]
    fn process_errors_name_file_line_and_column() {
        let f = FILE;
        let cases: Vec<(&str, Vec<String>)> = vec![
            (
                "    process:\n      before:\n        params:\n          amount_cents: \"amount * 100\"\n",
                vec![format!(
                    "{f}:10:25: `amount_cents` is not a valid jq expression: "
                )],
            ),
            (
                "    process:\n      before:\n        use: normalize_fx\n",
                vec![format!(
                    "{f}:9:9: `process.before.use` (a named transform) is not applicable: Belay has no registry of named transforms; write the transform inline as `params:` and `require:`"
                )],
            ),
            (
                "    process:\n      before:\n        require: [.args.amount > 0]\n        on_fail: retry(\"x\")\n",
                vec![format!(
                    "{f}:10:18: `on_fail` takes `block(\"msg\")`, `reask(\"msg\")`, `warn(\"msg\")`, `use_original` or `fallback(\"msg\")`, not `retry(\"x\")`"
                )],
            ),
            (
                "    process:\n      before:\n        require: [.args.amount > 0]\n        on_fail: block(msg)\n",
                vec![format!(
                    "{f}:10:24: `block(…)` takes a quoted message, like `block(\"Please provide a positive amount.\")`"
                )],
            ),
            (
                "    process:\n      before:\n        require: [.args.amount > 0]\n        on_fail: warn(\"x\") now\n",
                vec![format!(
                    "{f}:10:28: expected `)` after the message of `warn(…)`, and nothing after it"
                )],
            ),
            (
                "    process:\n      before:\n        on_fail: use_original\n",
                vec![format!("{f}:8:7: `before:` needs `params:` or `require:`")],
            ),
            (
                "    process:\n      after:\n        on_fail: use_original\n",
                vec![format!(
                    "{f}:8:7: `after:` needs `result:` with one `field: <jq expression>` line per field"
                )],
            ),
            (
                "    process:\n      during:\n        x: 1\n",
                vec![format!(
                    "{f}:8:7: unknown property `during` in `process:` (expected `before` or `after`)"
                )],
            ),
            (
                "    process:\n",
                vec![format!("{f}:7:5: `process:` needs `before:` or `after:`")],
            ),
            (
                "    process:\n      before:\n        require: .args.amount > 0\n",
                vec![format!(
                    "{f}:9:18: `require` takes a list of jq expressions, like `[.args.amount > 0]`"
                )],
            ),
            (
                "    process:\n      before:\n        require:\n          - .args.amount > 0\n          - \"\"\n",
                vec![format!("{f}:11:13: `require` item needs a jq expression")],
            ),
        ];
        for (extra, want) in cases {
            let got = errors(extra);
            assert_eq!(got.len(), want.len(), "{extra}: {got:?}");
            for (g, w) in got.iter().zip(&want) {
                assert!(g.starts_with(w.as_str()), "{extra}:\n got  {g}\n want {w}");
            }
        }
        // The hint for a bare field name, as the seed writes it.
        let got = errors(
            "    process:\n      after:\n        result:\n          converted: \"result.amount_cents / 100\"\n",
        );
        assert!(
            got[0].ends_with("write `.result.amount_cents / 100`, with the leading `.`"),
            "{got:?}"
        );
    }

    #[test]
    fn a_stage_holds_a_bounded_number_of_expressions() {
        let params: String = (0..=MAX_PROCESS_EXPRS)
            .map(|i| format!("          p{i}: .args.amount\n"))
            .collect();
        let got = errors(&format!(
            "    process:\n      before:\n        params:\n{params}"
        ));
        assert_eq!(
            got,
            vec![format!(
                "{FILE}:8:7: `before:` holds 17 expressions, more than the limit of {MAX_PROCESS_EXPRS}"
            )]
        );
    }
}
