//! A parameter's `visibility: {model, trace}` (seed `abl-tools.md`,
//! "Parameter enrichment and sources"), read and checked when a
//! `.tools.abl` file is parsed. What happens at run time is
//! `belay_machine::untraced` (and the coordinator, which takes the values
//! out of the model's answer).
//!
//! - `model: false` hides the parameter from the model, exactly as
//!   `hidden: true` does (the two may not contradict each other).
//! - `trace: false` keeps the value out of every record of the call (its
//!   events, the model's recorded turn and transcript, task specs, the
//!   audit, logs, the admin endpoint): the engine takes it out of the
//!   model's answer, keeps it in the run's encrypted vault, and the worker
//!   gets it back at dispatch. It needs a `string` parameter the model
//!   supplies (a value the engine fills in is computed from the run's
//!   state, which the events already hold; a `source: config` value never
//!   enters the engine at all), on a `type: http` tool, and no feature
//!   that would show the value or compute with it in the engine
//!   (`confirmation:`, `process:`, `request_variants:`, `hints.cacheable`).

use super::super::model::{ParamSource, ToolBindingDef, ToolDef};
use super::super::signature::{Prim, TypeExpr};
use super::lines::{Block, Cx, KeyValue, scalar, to_u32};

/// `visibility:` as written: each flag with the line and column of its
/// value.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Visibility {
    /// `model:`.
    pub model: Option<(bool, u32, u32)>,
    /// `trace:`.
    pub trace: Option<(bool, u32, u32)>,
}

/// Reads `visibility: {model: false, trace: false}` or the same keys on
/// indented lines.
pub(super) fn read_visibility(block: &Block, kv: &KeyValue<'_>, cx: &mut Cx<'_>) -> Visibility {
    let line = &block.line;
    // (key, value, line, key column, value column) of each entry.
    let mut entries: Vec<(String, String, u32, u32, u32)> = Vec::new();
    if kv.value.is_empty() {
        for entry in &block.children {
            let Some(e) = super::lines::entry_kv(
                &entry.line,
                "`model: true|false` or `trace: true|false`",
                cx,
            ) else {
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
                "`visibility` takes `{model: true|false, trace: true|false}`, or `model:` and `trace:` on indented lines",
            );
            return Visibility::default();
        };
        if let Some(first) = block.children.first() {
            cx.error(
                first.line.no,
                first.line.col(),
                "`visibility` takes `{model: …, trace: …}` or indented lines, not both",
            );
            return Visibility::default();
        }
        let leading = |t: &str| t.chars().take_while(|c| c.is_whitespace()).count();
        let mut offset = 1;
        for item in inner.split(',') {
            let col = kv.value_col + to_u32(offset + leading(item));
            offset += item.chars().count() + 1;
            if item.trim().is_empty() {
                continue;
            }
            let Some((key, value)) = item.split_once(':') else {
                cx.error(
                    line.no,
                    col,
                    "expected `model: true|false` or `trace: true|false`",
                );
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
    let mut out = Visibility::default();
    for (key, value, eline, key_col, value_col) in entries {
        let slot = match key.as_str() {
            "model" => &mut out.model,
            "trace" => &mut out.trace,
            other => {
                cx.error(
                    eline,
                    key_col,
                    format!("unknown key `{other}` in `visibility:` (expected `model`, `trace`)"),
                );
                continue;
            }
        };
        if slot.is_some() {
            cx.error(
                eline,
                key_col,
                format!("duplicate `{key}` in `visibility:`"),
            );
            continue;
        }
        match value.as_str() {
            "true" => *slot = Some((true, eline, value_col)),
            "false" => *slot = Some((false, eline, value_col)),
            other => cx.error(
                eline,
                value_col,
                format!("`visibility.{key}` must be `true` or `false`, found `{other}`"),
            ),
        }
    }
    out
}

/// What a `trace: false` parameter needs of its tool, checked once the
/// tool is built; each problem is reported at the `trace:` value. Returns
/// whether all hold.
pub(super) fn check_untraced(
    tool: &ToolDef,
    untraced: &[(String, TypeExpr, u32, u32)],
    cx: &mut Cx<'_>,
) -> bool {
    let mut ok = true;
    for (name, ty, line, col) in untraced {
        let mut fail = |message: String| {
            cx.error(*line, *col, message);
            ok = false;
        };
        if let Some(p) = tool.injected.iter().find(|p| &p.name == name) {
            let from = match &p.source {
                ParamSource::Config { .. } => {
                    "`source: config`, whose value never enters the engine anyway".to_owned()
                }
                _ => "a source the engine computes from the run's state, which the run's events already hold".to_owned(),
            };
            fail(format!(
                "`trace: false` is for a value the model supplies; `{name}` comes from {from}"
            ));
            continue;
        }
        if *ty != TypeExpr::Prim(Prim::String) {
            fail(format!(
                "`trace: false` needs a `string` parameter (the value is kept as text in the run's vault); `{name}` is a `{}`",
                ty.describe()
            ));
            continue;
        }
        if !matches!(tool.binding, ToolBindingDef::Http { .. }) {
            fail(format!(
                "`trace: false` is supported on `type: http` tools only (their worker puts the value back at dispatch); `{}` is not one",
                tool.name
            ));
            continue;
        }
        let conflicts = [
            (
                tool.confirmation.is_some(),
                "`confirmation:` (an approver would be shown the arguments)",
            ),
            (
                tool.process.is_some(),
                "`process:` (it computes with the arguments in the engine)",
            ),
            (
                !tool.request_variants.is_empty(),
                "`request_variants:` (their `when` reads the arguments in the engine)",
            ),
            (
                tool.hints.cacheable == Some(true),
                "`hints.cacheable: true` (the cache is keyed by the arguments)",
            ),
        ];
        for (present, what) in conflicts {
            if present {
                fail(format!(
                    "`trace: false` on `{name}` cannot go with {what}: the engine only ever holds a placeholder for the value"
                ));
            }
        }
    }
    ok
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::super::parse_tools_file;

    /// A `type: http` tool `pay(card: string, amount: number, memo?:
    /// string)` with `extra` lines under `card:` and `more` tool lines.
    fn file(extra: &str, more: &str) -> String {
        format!(
            "TOOLS:\n  pay(card: string, amount: number, memo?: string) -> {{ok: boolean}}\n    type: http\n    endpoint: /pay\n    method: POST\n    permission: p\n    repeat_safety: idempotent\n{more}    parameters:\n      card:\n{extra}"
        )
    }

    fn errors(text: &str) -> Vec<String> {
        parse_tools_file("t.tools.abl", text)
            .errors
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn trace_false_marks_the_parameter_and_model_false_hides_it() {
        for extra in [
            "        visibility: {model: true, trace: false}\n",
            "        visibility:\n          trace: false\n",
        ] {
            let out = parse_tools_file("t.tools.abl", &file(extra, ""));
            assert!(out.errors.is_empty(), "{:?}", out.errors);
            let tool = &out.tools[0];
            assert_eq!(tool.untraced, ["card"]);
            // Still the model's to supply.
            assert!(tool.model_schema()["properties"].get("card").is_some());
        }
        let out = parse_tools_file(
            "t.tools.abl",
            &file(
                "        visibility: {model: false}\n        default: tok_test\n",
                "",
            ),
        );
        assert!(out.errors.is_empty(), "{:?}", out.errors);
        let tool = &out.tools[0];
        assert!(tool.untraced.is_empty());
        assert!(tool.model_schema()["properties"].get("card").is_none());
        assert_eq!(tool.injected[0].name, "card");
        // `model: false` without a value is `hidden: true` without one.
        assert_eq!(
            errors(&file("        visibility: {model: false}\n", "")),
            [
                "t.tools.abl:10:29: hidden parameter `card` needs a `source:`, a `value:` or a `default:`: the model never sends it"
            ]
        );
    }

    #[test]
    fn visibility_errors_name_the_place() {
        let cases: Vec<(String, &str)> = vec![
            (
                file(
                    "        visibility: {model: false, trace: false}\n        default: x\n",
                    "",
                ),
                "t.tools.abl:10:43: `trace: false` is for a value the model supplies; `card` comes from a source the engine computes from the run's state, which the run's events already hold",
            ),
            (
                file("        visibility: {trace: maybe}\n", ""),
                "t.tools.abl:10:29: `visibility.trace` must be `true` or `false`, found `maybe`",
            ),
            (
                file("        visibility: {shown: false}\n", ""),
                "t.tools.abl:10:22: unknown key `shown` in `visibility:` (expected `model`, `trace`)",
            ),
            (
                file("        visibility: hidden\n", ""),
                "t.tools.abl:10:21: `visibility` takes `{model: true|false, trace: true|false}`, or `model:` and `trace:` on indented lines",
            ),
            (
                file(
                    "        hidden: true\n        default: x\n        visibility: {model: true}\n",
                    "",
                ),
                "t.tools.abl:12:29: `visibility.model: true` contradicts `hidden: true`",
            ),
            (
                file(
                    "        source: config\n        value: CARD\n        visibility: {model: true}\n",
                    "",
                ),
                "t.tools.abl:12:29: `visibility.model: true` contradicts the parameter's source: `card` is never shown to the model when its value comes from elsewhere",
            ),
            (
                file(
                    "        visibility: {trace: false}\n",
                    "    process:\n      after:\n        result:\n          x: .result\n",
                ),
                "t.tools.abl:14:29: `trace: false` on `card` cannot go with `process:` (it computes with the arguments in the engine): the engine only ever holds a placeholder for the value",
            ),
            (
                file(
                    "        visibility: {trace: false}\n",
                    "    confirmation:\n      require: always\n",
                ),
                "t.tools.abl:12:29: `trace: false` on `card` cannot go with `confirmation:` (an approver would be shown the arguments): the engine only ever holds a placeholder for the value",
            ),
            (
                file("        visibility: {trace: false}\n", "")
                    .replace("card: string,", "card: number,"),
                "t.tools.abl:10:29: `trace: false` needs a `string` parameter (the value is kept as text in the run's vault); `card` is a `number`",
            ),
            (
                file("        visibility: {trace: false}\n", "").replace(
                    "    type: http\n    endpoint: /pay\n    method: POST\n",
                    "    type: mcp\n    server: s\n",
                ),
                "t.tools.abl:9:29: `trace: false` is supported on `type: http` tools only (their worker puts the value back at dispatch); `pay` is not one",
            ),
        ];
        for (text, want) in cases {
            assert_eq!(errors(&text), [want], "{text}");
        }
    }
}
