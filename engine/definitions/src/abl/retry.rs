//! `retry:`, `retry_delay:` and `retry_policy:` of a tool in a `.tools.abl`
//! file, and the file's `retry:`/`retry_delay:` defaults (seed
//! `abl-tools.md`: "HTTP binding properties", "Retry policy", "Shared
//! defaults"), checked and resolved into the stored [`RetryPolicy`].
//!
//! Rules:
//! - `retry: N` alone is the engine's backoff (exponential from 500 ms,
//!   doubling, at most 30 s) with `N` retries; `retry_delay: D` alone is a
//!   fixed `D` ms with the agent's attempt count; both: fixed `D`, `N` retries.
//! - `retry_policy:` is the structured form; a tool that writes it and
//!   `retry:` or `retry_delay:` is refused (one form per tool). It replaces
//!   the file's defaults.
//! - The file's `retry:`/`retry_delay:` apply, field by field, to its
//!   `type: http` and `type: async_webhook` tools (like its `timeout:`); a
//!   tool's own value wins.
//! - The properties apply to tools a worker calls (`http`, `async_webhook`,
//!   `mcp`); a `type: workflow` tool, which starts a child run, refuses them.

use std::collections::BTreeMap;

use super::super::model::{
    BackoffStrategy, ENGINE_INITIAL_DELAY_MS, ENGINE_MAX_DELAY_MS, Jitter, MAX_DECLARED_DELAY_MS,
    MAX_DECLARED_RETRIES, RetryPolicy,
};
use super::lines::{Block, Cx, KeyValue, Line, entry_kv, first_time, keyword, scalar};
use super::props::BindingType;

/// What a tool (or the file's defaults) wrote of `retry:`, `retry_delay:`
/// and `retry_policy:`, each valid one with the line and column of its key.
#[derive(Debug, Default)]
pub(super) struct RetryProps {
    /// `retry:`.
    count: Option<u32>,
    /// `retry_delay:`, ms.
    delay_ms: Option<u64>,
    /// `retry_policy:`, with its defaults applied.
    policy: Option<RetryPolicy>,
    /// Line and column of each key written (valid or not), for errors.
    at: BTreeMap<&'static str, (u32, u32)>,
}

/// The keys of the `retry_policy:` block, in the seed's order.
const POLICY_KEYS: &[&str] = &[
    "strategy",
    "initial_delay_ms",
    "multiplier",
    "max_delay_ms",
    "max_retries",
    "jitter",
];

/// Largest `multiplier:`.
const MAX_MULTIPLIER: f64 = 100.0;

/// Reads the property `kv` (`retry`, `retry_delay` or `retry_policy`) of
/// `block` into `out`.
pub(super) fn read_prop(block: &Block, kv: &KeyValue<'_>, out: &mut RetryProps, cx: &mut Cx<'_>) {
    let line = &block.line;
    let key: &'static str = match kv.key {
        "retry" => "retry",
        "retry_delay" => "retry_delay",
        _ => "retry_policy",
    };
    out.at.insert(key, (line.no, kv.key_col));
    if key == "retry_policy" {
        if super::lines::block_only(block, kv, cx) {
            out.policy = read_policy(block, cx);
        }
        return;
    }
    let Some(value) = scalar(block, kv, cx) else {
        return;
    };
    let parsed = if key == "retry" {
        parse_count(key, &value).map(|n| out.count = Some(n))
    } else {
        parse_delay(key, &value).map(|ms| out.delay_ms = Some(ms))
    };
    if let Err(message) = parsed {
        cx.error(line.no, kv.value_col, message);
    }
}

/// A retry count: a whole number from 0 to [`MAX_DECLARED_RETRIES`].
fn parse_count(key: &str, value: &str) -> Result<u32, String> {
    match value.parse::<u32>() {
        Ok(n) if n <= MAX_DECLARED_RETRIES && value.bytes().all(|b| b.is_ascii_digit()) => Ok(n),
        _ => Err(format!(
            "`{key}` must be a whole number of retries from 0 to {MAX_DECLARED_RETRIES}, not `{value}`"
        )),
    }
}

/// A delay: a whole number of milliseconds from 0 to [`MAX_DECLARED_DELAY_MS`].
fn parse_delay(key: &str, value: &str) -> Result<u64, String> {
    match value.parse::<u64>() {
        Ok(ms) if ms <= MAX_DECLARED_DELAY_MS && value.bytes().all(|b| b.is_ascii_digit()) => {
            Ok(ms)
        }
        _ => Err(format!(
            "`{key}` must be a whole number of milliseconds from 0 to {MAX_DECLARED_DELAY_MS} (one day), not `{value}`"
        )),
    }
}

/// A multiplier: a decimal number (digits, at most one `.`) from 1 to
/// [`MAX_MULTIPLIER`]; below 1 the delays would shrink.
fn parse_multiplier(value: &str) -> Result<f64, String> {
    let decimal = value.split_once('.').map_or_else(
        || !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()),
        |(int, frac)| {
            !int.is_empty()
                && !frac.is_empty()
                && int.bytes().all(|b| b.is_ascii_digit())
                && frac.bytes().all(|b| b.is_ascii_digit())
        },
    );
    match value.parse::<f64>() {
        Ok(m) if decimal && (1.0..=MAX_MULTIPLIER).contains(&m) => Ok(m),
        _ => Err(format!(
            "`multiplier` must be a number from 1 to {MAX_MULTIPLIER}, like `2` or `1.5`, not `{value}`"
        )),
    }
}

/// The `retry_policy:` block, checked, with its defaults applied; `None`
/// after an error.
fn read_policy(block: &Block, cx: &mut Cx<'_>) -> Option<RetryPolicy> {
    let errors_before = cx.out.errors.len();
    let mut seen: BTreeMap<&str, u32> = BTreeMap::new();
    let mut strategy = None;
    let mut initial: Option<u64> = None;
    let mut multiplier: Option<(f64, u32, u32)> = None;
    let mut max_delay: Option<(u64, u32, u32)> = None;
    let mut max_retries = None;
    let mut jitter = None;
    for entry in &block.children {
        let line: &Line = &entry.line;
        let Some(kv) = entry_kv(line, "`property: value` in `retry_policy:`", cx) else {
            continue;
        };
        if !POLICY_KEYS.contains(&kv.key) {
            let expected: Vec<String> = POLICY_KEYS.iter().map(|k| format!("`{k}`")).collect();
            cx.error(
                line.no,
                kv.key_col,
                format!(
                    "unknown property `{}` in `retry_policy:` (expected {})",
                    kv.key,
                    expected.join(", ")
                ),
            );
            continue;
        }
        let what = format!("`{}` in `retry_policy:`", kv.key);
        if !first_time(&mut seen, &kv, line.no, &what, cx) {
            continue;
        }
        match kv.key {
            "strategy" => {
                let choices = [
                    ("fixed", BackoffStrategy::Fixed),
                    ("exponential", BackoffStrategy::Exponential),
                ];
                strategy = keyword(entry, &kv, &choices, cx);
            }
            "jitter" => {
                let choices = [("none", Jitter::None), ("full", Jitter::Full)];
                jitter = keyword(entry, &kv, &choices, cx);
            }
            key => {
                let Some(value) = scalar(entry, &kv, cx) else {
                    continue;
                };
                let at = (line.no, kv.value_col);
                let parsed = match key {
                    "initial_delay_ms" => parse_delay(key, &value).map(|ms| initial = Some(ms)),
                    "max_delay_ms" => {
                        parse_delay(key, &value).map(|ms| max_delay = Some((ms, at.0, at.1)))
                    }
                    "max_retries" => parse_count(key, &value).map(|n| max_retries = Some(n)),
                    _ => parse_multiplier(&value).map(|m| multiplier = Some((m, at.0, at.1))),
                };
                if let Err(message) = parsed {
                    cx.error(at.0, at.1, message);
                }
            }
        }
    }
    if !seen.contains_key("strategy") {
        cx.error(
            block.line.no,
            block.line.col(),
            "`retry_policy:` needs `strategy: fixed` or `strategy: exponential`",
        );
    }
    let initial_delay_ms = initial.unwrap_or(ENGINE_INITIAL_DELAY_MS);
    let (multiplier, max_delay_ms) = match strategy {
        Some(BackoffStrategy::Fixed) => {
            for (key, given) in [
                ("multiplier", multiplier.map(|(_, l, c)| (l, c))),
                ("max_delay_ms", max_delay.map(|(_, l, c)| (l, c))),
            ] {
                if let Some((l, c)) = given {
                    cx.error(
                        l,
                        c,
                        format!("`{key}` applies to `strategy: exponential` only (a fixed delay neither grows nor needs a ceiling)"),
                    );
                }
            }
            (1.0, initial_delay_ms)
        }
        _ => {
            let max_delay_ms = match max_delay {
                Some((max, l, c)) if max < initial_delay_ms => {
                    let initial_said = if initial.is_some() {
                        format!("`initial_delay_ms` ({initial_delay_ms})")
                    } else {
                        format!("the default `initial_delay_ms` ({initial_delay_ms})")
                    };
                    cx.error(
                        l,
                        c,
                        format!("`max_delay_ms` ({max}) is less than {initial_said}: the ceiling must be at least the first delay"),
                    );
                    max
                }
                Some((max, _, _)) => max,
                None => initial_delay_ms.max(ENGINE_MAX_DELAY_MS),
            };
            (multiplier.map_or(2.0, |(m, _, _)| m), max_delay_ms)
        }
    };
    if cx.out.errors.len() > errors_before {
        return None;
    }
    Some(RetryPolicy {
        strategy: strategy?,
        initial_delay_ms,
        multiplier,
        max_delay_ms,
        max_retries,
        jitter: jitter.unwrap_or_default(),
    })
}

/// The policy of tool `name` of binding `binding` that wrote `own`, in a
/// file whose defaults are `file` (applied to `http` and `async_webhook`
/// tools only). Errors for a `type: workflow` tool that writes any of the
/// keys, and for a tool that writes both forms.
pub(super) fn tool_policy(
    own: RetryProps,
    file: &RetryProps,
    binding: Option<BindingType>,
    name: &str,
    cx: &mut Cx<'_>,
) -> Option<RetryPolicy> {
    if binding == Some(BindingType::Workflow) {
        for (key, (line, col)) in &own.at {
            cx.error(
                *line,
                *col,
                format!(
                    "`{key}:` applies to tools a worker calls (`http`, `async_webhook`, `mcp`): a `type: workflow` call starts a child run and is not retried"
                ),
            );
        }
        return None;
    }
    if let Some((line, col)) = own.at.get("retry_policy") {
        let scalars: Vec<String> = ["retry", "retry_delay"]
            .iter()
            .filter(|k| own.at.contains_key(*k))
            .map(|k| format!("`{k}:`"))
            .collect();
        if !scalars.is_empty() {
            cx.error(
                *line,
                *col,
                format!(
                    "tool `{name}` has both `retry_policy:` and {}: give one form (in `retry_policy:`, the count is `max_retries:` and the delay `initial_delay_ms:`)",
                    scalars.join(" and ")
                ),
            );
            return None;
        }
        return own.policy;
    }
    let http_like = matches!(binding, Some(BindingType::Http | BindingType::AsyncWebhook));
    let count = own.count.or(file.count.filter(|_| http_like));
    let delay_ms = own.delay_ms.or(file.delay_ms.filter(|_| http_like));
    scalar_policy(count, delay_ms)
}

/// The policy `retry: count` and `retry_delay: delay_ms` stand for.
fn scalar_policy(count: Option<u32>, delay_ms: Option<u64>) -> Option<RetryPolicy> {
    let (strategy, initial_delay_ms, multiplier, max_delay_ms) = match delay_ms {
        Some(ms) => (BackoffStrategy::Fixed, ms, 1.0, ms),
        None if count.is_some() => (
            BackoffStrategy::Exponential,
            ENGINE_INITIAL_DELAY_MS,
            2.0,
            ENGINE_MAX_DELAY_MS,
        ),
        None => return None,
    };
    Some(RetryPolicy {
        strategy,
        initial_delay_ms,
        multiplier,
        max_delay_ms,
        max_retries: count,
        jitter: Jitter::None,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::super::model::{ToolBindingDef, ToolDef};
    use super::super::{AblOutput, parse_tools_file};
    use super::*;

    const FILE: &str = "tools/flaky.tools.abl";

    fn parse(content: &str) -> AblOutput {
        parse_tools_file(FILE, content)
    }

    /// The tools of `content`, which must have no error.
    fn tools(content: &str) -> Vec<ToolDef> {
        let out = parse(content);
        assert_eq!(out.errors, vec![], "unexpected errors");
        out.tools
    }

    /// Errors as `line:column: message`, each naming the file.
    fn errors(content: &str) -> Vec<String> {
        let out = parse(content);
        for e in &out.errors {
            assert_eq!(e.file, FILE);
        }
        out.errors
            .iter()
            .map(|e| format!("{}:{}: {}", e.line, e.column, e.message))
            .collect()
    }

    /// An idempotent `type: http` tool `f` with `extra` property lines
    /// (indented by four spaces) after its required ones (lines 2 to 7).
    fn http_tool(extra: &str) -> String {
        format!(
            "TOOLS:\n  f(id: string) -> object\n    type: http\n    endpoint: \"/x/{{id}}\"\n    method: GET\n    permission: p.read\n    repeat_safety: idempotent\n{extra}"
        )
    }

    /// The policy of the only tool of `content`.
    fn policy(content: &str) -> Option<RetryPolicy> {
        let tools = tools(content);
        assert_eq!(tools.len(), 1);
        tools[0].retry_policy.clone()
    }

    fn fixed(delay: u64, retries: Option<u32>) -> RetryPolicy {
        RetryPolicy {
            strategy: BackoffStrategy::Fixed,
            initial_delay_ms: delay,
            multiplier: 1.0,
            max_delay_ms: delay,
            max_retries: retries,
            jitter: Jitter::None,
        }
    }

    fn exponential(initial: u64, multiplier: f64, max: u64, retries: Option<u32>) -> RetryPolicy {
        RetryPolicy {
            strategy: BackoffStrategy::Exponential,
            initial_delay_ms: initial,
            multiplier,
            max_delay_ms: max,
            max_retries: retries,
            jitter: Jitter::None,
        }
    }

    #[test]
    fn scalar_forms() {
        assert_eq!(policy(&http_tool("")), None);
        // `retry:` alone: the engine's backoff, with that many retries.
        assert_eq!(
            policy(&http_tool("    retry: 3\n")),
            Some(exponential(500, 2.0, 30_000, Some(3)))
        );
        // `retry_delay:` alone: a fixed delay, the agent's attempt count.
        assert_eq!(
            policy(&http_tool("    retry_delay: 1000\n")),
            Some(fixed(1000, None))
        );
        // Both, as in the seed's "HTTP tools" example; quotes are fine.
        assert_eq!(
            policy(&http_tool("    retry: \"3\"\n    retry_delay: 1000\n")),
            Some(fixed(1000, Some(3)))
        );
        assert_eq!(
            policy(&http_tool("    retry: 0\n    retry_delay: 0\n")),
            Some(fixed(0, Some(0)))
        );
    }

    #[test]
    fn structured_form() {
        // The seed's "Retry policy" example.
        assert_eq!(
            policy(&http_tool(
                "    retry_policy:\n      strategy: exponential     # fixed | exponential\n      initial_delay_ms: 200\n      multiplier: 2\n      max_delay_ms: 5000\n      max_retries: 4\n      jitter: full              # none | full\n"
            )),
            Some(RetryPolicy {
                jitter: Jitter::Full,
                ..exponential(200, 2.0, 5000, Some(4))
            })
        );
        // Only the strategy: the engine's first delay; exponential grows by
        // 2 up to 30 s (or the first delay, when that is longer).
        assert_eq!(
            policy(&http_tool("    retry_policy:\n      strategy: fixed\n")),
            Some(fixed(500, None))
        );
        assert_eq!(
            policy(&http_tool(
                "    retry_policy:\n      strategy: exponential\n"
            )),
            Some(exponential(500, 2.0, 30_000, None))
        );
        assert_eq!(
            policy(&http_tool(
                "    retry_policy:\n      strategy: exponential\n      initial_delay_ms: 60000\n      multiplier: 1.5\n      jitter: none\n"
            )),
            Some(exponential(60_000, 1.5, 60_000, None))
        );
        assert_eq!(
            policy(&http_tool(
                "    retry_policy:\n      strategy: fixed\n      initial_delay_ms: 250\n      max_retries: 0\n      jitter: full\n"
            )),
            Some(RetryPolicy {
                jitter: Jitter::Full,
                ..fixed(250, Some(0))
            })
        );
    }

    #[test]
    fn mcp_and_async_webhook_tools_take_a_policy_workflow_tools_refuse_it() {
        let tools = tools(
            "TOOLS:\n  m(q: string) -> object\n    type: mcp\n    server: search\n    retry: 2\n    permission: p.read\n    repeat_safety: idempotent\n  a(q: string) -> object\n    type: async_webhook\n    endpoint: /a\n    method: POST\n    retry_policy:\n      strategy: fixed\n      initial_delay_ms: 10\n    permission: p.read\n    repeat_safety: idempotent\n",
        );
        assert!(matches!(tools[0].binding, ToolBindingDef::Mcp { .. }));
        assert_eq!(
            tools[0].retry_policy,
            Some(exponential(500, 2.0, 30_000, Some(2)))
        );
        assert_eq!(tools[1].retry_policy, Some(fixed(10, None)));
        assert_eq!(
            errors(
                "TOOLS:\n  w() -> object\n    type: workflow\n    workflow_id: report\n    retry: 2\n    retry_policy:\n      strategy: fixed\n    permission: p.read\n    repeat_safety: never\n"
            ),
            vec![
                "5:5: `retry:` applies to tools a worker calls (`http`, `async_webhook`, `mcp`): a `type: workflow` call starts a child run and is not retried",
                "6:5: `retry_policy:` applies to tools a worker calls (`http`, `async_webhook`, `mcp`): a `type: workflow` call starts a child run and is not retried",
            ]
        );
    }

    #[test]
    fn file_level_defaults_apply_field_by_field_to_http_tools() {
        let tools = tools(
            r#"TOOLS:
  retry: 3
  retry_delay: 250

  inherits(id: string) -> object
    type: http
    endpoint: "/a"
    permission: p.read
    repeat_safety: idempotent

  own_count(id: string) -> object
    type: http
    endpoint: "/b"
    retry: 1
    permission: p.read
    repeat_safety: idempotent

  own_policy(id: string) -> object
    type: async_webhook
    endpoint: "/c"
    method: POST
    retry_policy:
      strategy: exponential
      initial_delay_ms: 100
    permission: p.read
    repeat_safety: idempotent

  on_mcp(q: string) -> object
    type: mcp
    server: search
    permission: p.read
    repeat_safety: idempotent

  on_workflow() -> object
    type: workflow
    workflow_id: report
    permission: p.read
    repeat_safety: never
"#,
        );
        let policies: Vec<Option<RetryPolicy>> =
            tools.iter().map(|t| t.retry_policy.clone()).collect();
        assert_eq!(
            policies,
            vec![
                Some(fixed(250, Some(3))),
                Some(fixed(250, Some(1))),
                // A tool's `retry_policy:` replaces the file's defaults.
                Some(exponential(100, 2.0, 30_000, None)),
                // Like `timeout:`, the file's defaults are for HTTP requests.
                None,
                None,
            ]
        );
        let only_delay = tools_with_default("  retry_delay: 40\n");
        assert_eq!(only_delay, Some(fixed(40, None)));
        let only_count = tools_with_default("  retry: 2\n");
        assert_eq!(only_count, Some(exponential(500, 2.0, 30_000, Some(2))));
    }

    /// The policy of an `http` tool with no retry key of its own in a file
    /// whose defaults are `defaults`.
    fn tools_with_default(defaults: &str) -> Option<RetryPolicy> {
        policy(&format!(
            "TOOLS:\n{defaults}  f() -> object\n    type: http\n    endpoint: /f\n    permission: p.read\n    repeat_safety: idempotent\n"
        ))
    }

    #[test]
    fn scalar_errors() {
        assert_eq!(
            errors(&http_tool(
                "    retry: -1\n    retry_delay: 5s\n    timeout: 5s\n"
            )),
            vec![
                "8:12: `retry` must be a whole number of retries from 0 to 100, not `-1`",
                "9:18: `retry_delay` must be a whole number of milliseconds from 0 to 86400000 (one day), not `5s`",
            ]
        );
        for (value, message) in [
            (
                "1.5",
                "`retry` must be a whole number of retries from 0 to 100, not `1.5`",
            ),
            (
                "101",
                "`retry` must be a whole number of retries from 0 to 100, not `101`",
            ),
            (
                "three",
                "`retry` must be a whole number of retries from 0 to 100, not `three`",
            ),
            (
                "+2",
                "`retry` must be a whole number of retries from 0 to 100, not `+2`",
            ),
        ] {
            assert_eq!(
                errors(&http_tool(&format!("    retry: {value}\n"))),
                vec![format!("8:12: {message}")]
            );
        }
        assert_eq!(
            errors(&http_tool("    retry_delay: 86400001\n    retry:\n")),
            vec![
                "8:18: `retry_delay` must be a whole number of milliseconds from 0 to 86400000 (one day), not `86400001`",
                "9:5: `retry` needs a value",
            ]
        );
        assert_eq!(
            errors(&http_tool("    retry: 2\n    retry: 3\n")),
            vec!["9:5: duplicate property `retry` (first on line 8)"]
        );
    }

    #[test]
    fn policy_errors() {
        assert_eq!(
            errors(&http_tool("    retry_policy: exponential\n")),
            vec![
                "8:19: `retry_policy` takes an indented block on the following lines, not a value"
            ]
        );
        assert_eq!(
            errors(&http_tool(
                "    retry_policy:\n      initial_delay_ms: 100\n"
            )),
            vec!["8:5: `retry_policy:` needs `strategy: fixed` or `strategy: exponential`"]
        );
        assert_eq!(
            errors(&http_tool(
                "    retry_policy:\n      strategy: linear\n      jitter: half\n      max_retries: 1000\n      initial_delay_ms: -5\n"
            )),
            vec![
                "9:17: unknown strategy `linear` (expected `fixed` or `exponential`)",
                "10:15: unknown jitter `half` (expected `none` or `full`)",
                "11:20: `max_retries` must be a whole number of retries from 0 to 100, not `1000`",
                "12:25: `initial_delay_ms` must be a whole number of milliseconds from 0 to 86400000 (one day), not `-5`",
            ]
        );
        for value in [
            "0.5", "0", "-2", "1e3", "abc", "2.", ".5", "101", "inf", "NaN",
        ] {
            assert_eq!(
                errors(&http_tool(&format!(
                    "    retry_policy:\n      strategy: exponential\n      multiplier: {value}\n"
                ))),
                vec![format!(
                    "10:19: `multiplier` must be a number from 1 to 100, like `2` or `1.5`, not `{value}`"
                )],
                "{value}"
            );
        }
        assert_eq!(
            errors(&http_tool(
                "    retry_policy:\n      strategy: exponential\n      initial_delay_ms: 2000\n      max_delay_ms: 1000\n"
            )),
            vec![
                "11:21: `max_delay_ms` (1000) is less than `initial_delay_ms` (2000): the ceiling must be at least the first delay"
            ]
        );
        assert_eq!(
            errors(&http_tool(
                "    retry_policy:\n      strategy: exponential\n      max_delay_ms: 100\n"
            )),
            vec![
                "10:21: `max_delay_ms` (100) is less than the default `initial_delay_ms` (500): the ceiling must be at least the first delay"
            ]
        );
        assert_eq!(
            errors(&http_tool(
                "    retry_policy:\n      strategy: fixed\n      multiplier: 2\n      max_delay_ms: 9000\n"
            )),
            vec![
                "10:19: `multiplier` applies to `strategy: exponential` only (a fixed delay neither grows nor needs a ceiling)",
                "11:21: `max_delay_ms` applies to `strategy: exponential` only (a fixed delay neither grows nor needs a ceiling)",
            ]
        );
        assert_eq!(
            errors(&http_tool(
                "    retry_policy:\n      strategy: fixed\n      strategy: exponential\n      backoff: 2\n      retries?: 1\n      just words\n      jitter:\n        full: true\n"
            )),
            vec![
                "10:7: duplicate `strategy` in `retry_policy:` (first on line 9)",
                "11:7: unknown property `backoff` in `retry_policy:` (expected `strategy`, `initial_delay_ms`, `multiplier`, `max_delay_ms`, `max_retries`, `jitter`)",
                "12:7: expected `property: value` in `retry_policy:`, found `retries?: 1`",
                "13:7: expected `property: value` in `retry_policy:`, found `just words`",
                "15:9: `jitter` takes a value on its own line, not an indented block",
            ]
        );
    }

    #[test]
    fn one_form_per_tool() {
        assert_eq!(
            errors(&http_tool(
                "    retry: 3\n    retry_delay: 100\n    retry_policy:\n      strategy: fixed\n"
            )),
            vec![
                "10:5: tool `f` has both `retry_policy:` and `retry:` and `retry_delay:`: give one form (in `retry_policy:`, the count is `max_retries:` and the delay `initial_delay_ms:`)"
            ]
        );
        assert_eq!(
            errors(&http_tool(
                "    retry_policy:\n      strategy: fixed\n    retry_delay: 100\n"
            )),
            vec![
                "8:5: tool `f` has both `retry_policy:` and `retry_delay:`: give one form (in `retry_policy:`, the count is `max_retries:` and the delay `initial_delay_ms:`)"
            ]
        );
    }

    #[test]
    fn file_level_errors() {
        assert_eq!(
            errors(
                "TOOLS:\n  retry: many\n  retry_delay: 1.5\n  retry_policy:\n    strategy: fixed\n  f() -> object\n    type: http\n    endpoint: /f\n    permission: p.read\n    repeat_safety: idempotent\n  retry: 2\n"
            ),
            vec![
                "4:3: `retry_policy:` is not a file-level default: give it per tool (the file's defaults are `base_url:`, `auth:`, `auth_config:`, `timeout:`, `headers:`, `retry:`, `retry_delay:`, `rate_limit:`)",
                "2:10: `retry` must be a whole number of retries from 0 to 100, not `many`",
                "3:16: `retry_delay` must be a whole number of milliseconds from 0 to 86400000 (one day), not `1.5`",
                "11:3: file-level default `retry:` must come before the first tool",
            ]
        );
    }

    /// The example of the README's "Retries" section, as written there.
    #[test]
    fn readme_retry_example_parses() {
        let tools = tools(
            r#"TOOLS:
  retry: 3                 # file defaults, for the file's http/async_webhook tools
  retry_delay: 1000

  get_order(id: string) -> object
    type: http
    endpoint: "/orders/{id}"
    method: GET
    retry_policy:
      strategy: exponential   # fixed | exponential (required)
      initial_delay_ms: 200   # default 500
      multiplier: 2           # exponential only, 1 to 100; default 2
      max_delay_ms: 5000      # exponential only, >= initial; default 30000
      max_retries: 4          # 0 to 100; default: the agent's max_tool_attempts - 1
      jitter: full            # none (default) | full
    permission: orders.read
    repeat_safety: idempotent
"#,
        );
        assert_eq!(
            tools[0].retry_policy,
            Some(RetryPolicy {
                jitter: Jitter::Full,
                ..exponential(200, 2.0, 5000, Some(4))
            })
        );
    }

    #[test]
    fn stored_tools_without_a_policy_encode_and_decode_unchanged() {
        let tool = tools(&http_tool("")).remove(0);
        let json = serde_json::to_value(&tool).unwrap();
        assert!(json.get("retry_policy").is_none(), "{json}");
        assert_eq!(serde_json::from_value::<ToolDef>(json).unwrap(), tool);
        let with = tools(&http_tool(
            "    retry_policy:\n      strategy: exponential\n      jitter: full\n      max_retries: 2\n",
        ))
        .remove(0);
        let json = serde_json::to_value(&with).unwrap();
        assert_eq!(
            json["retry_policy"],
            serde_json::json!({"strategy": "exponential", "initial_delay_ms": 500, "multiplier": 2.0, "max_delay_ms": 30000, "max_retries": 2, "jitter": "full"})
        );
        assert_eq!(serde_json::from_value::<ToolDef>(json).unwrap(), with);
    }

    #[test]
    fn base_delays_follow_the_strategy() {
        let delays = |p: &RetryPolicy| (1..=7).map(|n| p.base_delay_ms(n)).collect::<Vec<_>>();
        assert_eq!(delays(&fixed(700, None)), [700; 7]);
        assert_eq!(
            delays(&exponential(200, 2.0, 5000, None)),
            [200, 400, 800, 1600, 3200, 5000, 5000]
        );
        assert_eq!(
            delays(&exponential(1000, 1.5, 60_000, None)),
            [1000, 1500, 2250, 3375, 5062, 7593, 11390]
        );
        // Huge attempt numbers stay at the ceiling.
        assert_eq!(
            exponential(1, 100.0, 9000, None).base_delay_ms(u32::MAX),
            9000
        );
        assert_eq!(fixed(0, None).base_delay_ms(0), 0);
    }
}
