//! `sampling:` of a `type: mcp` tool in a `.tools.abl` file: a Belay
//! extension (the seeds name MCP sampling, a server asking the client for a
//! model completion, but give it no syntax). Without it, a server's
//! `sampling/createMessage` during a call of the tool is refused.
//!
//! ```text
//! summarize(text: string) -> object
//!   type: mcp
//!   server: docs
//!   sampling:
//!     max_requests: 2      # completions per call, 1 to 16; default 1
//!     max_tokens: 512      # output tokens per completion, 1 to 65536; default 1024
//! ```
//!
//! Only `type: mcp` tools that call a server tool take it (a `resource:`
//! read cannot ask anything). What a call may use is decided by the machine
//! (`machine/sampling.rs`): only calls an agent proposes, through the
//! agent's model, within what is left of the budgets.

use std::collections::BTreeMap;

use super::super::model::SamplingDef;
use super::lines::{Block, Cx, KeyValue, block_only, entry_kv, scalar};

/// Reads the `sampling:` block `block` (whose line is `kv`); `None` after
/// an error, which names the line and column.
pub(super) fn read(block: &Block, kv: &KeyValue<'_>, cx: &mut Cx<'_>) -> Option<SamplingDef> {
    if !block_only(block, kv, cx) {
        return None;
    }
    let mut def = SamplingDef {
        max_requests: 1,
        max_tokens: SamplingDef::DEFAULT_TOKENS,
    };
    let mut seen: BTreeMap<&'static str, u32> = BTreeMap::new();
    let errors_before = cx.out.errors.len();
    for entry in &block.children {
        let Some(e) = entry_kv(&entry.line, "`max_requests: N` or `max_tokens: N`", cx) else {
            continue;
        };
        let (name, most) = match e.key {
            "max_requests" => ("max_requests", SamplingDef::MAX_REQUESTS),
            "max_tokens" => ("max_tokens", SamplingDef::MAX_TOKENS),
            other => {
                cx.error(
                    entry.line.no,
                    e.key_col,
                    format!(
                        "unknown property `{other}` in `sampling:` (expected `max_requests`, `max_tokens`)"
                    ),
                );
                continue;
            }
        };
        if let Some(first) = seen.insert(name, entry.line.no) {
            cx.error(
                entry.line.no,
                e.key_col,
                format!("duplicate `{name}` in `sampling:` (first on line {first})"),
            );
            continue;
        }
        let Some(value) = scalar(entry, &e, cx) else {
            continue;
        };
        match value.parse::<u32>() {
            Ok(n) if (1..=most).contains(&n) => {
                if name == "max_requests" {
                    def.max_requests = n;
                } else {
                    def.max_tokens = n;
                }
            }
            _ => {
                let what = if name == "max_requests" {
                    "completions per call"
                } else {
                    "output tokens per completion"
                };
                cx.error(
                    entry.line.no,
                    e.value_col,
                    format!(
                        "`{name}` must be a whole number of {what}, 1 to {most}, not `{value}`"
                    ),
                );
            }
        }
    }
    (cx.out.errors.len() == errors_before).then_some(def)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use crate::model::{SamplingDef, ToolDef};
    use crate::{RegisteredNames, SourceFile, parse_bundle};

    fn parse(extra: &str, ty: &str) -> Result<ToolDef, Vec<String>> {
        let binding = match ty {
            "mcp" => "    type: mcp\n    server: docs\n",
            "mcp_resource" => "    type: mcp\n    server: docs\n    resource: \"docs://{q}\"\n",
            _ => "    type: http\n    endpoint: \"http://x.test/s\"\n    method: POST\n",
        };
        let content = format!(
            "TOOLS:\n  summarize(q: string) -> object\n    description: \"s\"\n{binding}    permission: docs\n    repeat_safety: idempotent\n{extra}"
        );
        let files = [SourceFile {
            path: "t.tools.abl".into(),
            content,
        }];
        match parse_bundle(&files, &RegisteredNames::default()) {
            Ok(bundle) => Ok(bundle.tools.into_iter().next().unwrap()),
            Err(errors) => Err(errors
                .iter()
                .map(|e| format!("{}:{}: {}", e.line, e.column, e.message))
                .collect()),
        }
    }

    #[test]
    fn an_mcp_tool_declares_sampling_with_defaults_for_what_it_leaves_out() {
        let tool = parse(
            "    sampling:\n      max_requests: 3\n      max_tokens: 200\n",
            "mcp",
        )
        .unwrap();
        assert_eq!(
            tool.sampling,
            Some(SamplingDef {
                max_requests: 3,
                max_tokens: 200
            })
        );
        let tool = parse("    sampling:\n      max_tokens: 64\n", "mcp").unwrap();
        assert_eq!(
            tool.sampling,
            Some(SamplingDef {
                max_requests: 1,
                max_tokens: 64
            })
        );
        let tool = parse("    sampling:\n", "mcp").unwrap();
        assert_eq!(
            tool.sampling,
            Some(SamplingDef {
                max_requests: 1,
                max_tokens: SamplingDef::DEFAULT_TOKENS
            })
        );
    }

    #[test]
    fn a_tool_without_sampling_stores_and_hashes_as_before() {
        let tool = parse("", "mcp").unwrap();
        assert_eq!(tool.sampling, None);
        let json = serde_json::to_value(&tool).unwrap();
        assert!(json.get("sampling").is_none(), "{json}");
    }

    #[test]
    fn bad_sampling_blocks_are_refused_with_their_place() {
        let errors = parse("    sampling:\n      max_requests: 17\n", "mcp").unwrap_err();
        assert_eq!(
            errors,
            [
                "9:21: `max_requests` must be a whole number of completions per call, 1 to 16, not `17`"
            ]
        );
        let errors = parse("    sampling:\n      max_tokens: 0\n", "mcp").unwrap_err();
        assert_eq!(
            errors,
            [
                "9:19: `max_tokens` must be a whole number of output tokens per completion, 1 to 65536, not `0`"
            ]
        );
        let errors = parse("    sampling:\n      temperature: 1\n", "mcp").unwrap_err();
        assert_eq!(
            errors,
            [
                "9:7: unknown property `temperature` in `sampling:` (expected `max_requests`, `max_tokens`)"
            ]
        );
        let errors = parse(
            "    sampling:\n      max_tokens: 5\n      max_tokens: 6\n",
            "mcp",
        )
        .unwrap_err();
        assert_eq!(
            errors,
            ["10:7: duplicate `max_tokens` in `sampling:` (first on line 9)"]
        );
        let errors = parse("    sampling: 3\n", "mcp").unwrap_err();
        assert_eq!(
            errors,
            ["8:15: `sampling` takes an indented block on the following lines, not a value"]
        );
    }

    #[test]
    fn sampling_is_refused_where_no_server_can_ask() {
        let errors = parse("    sampling:\n      max_tokens: 5\n", "http").unwrap_err();
        assert_eq!(
            errors,
            // At the `sampling:` line, not the tool's.
            ["9:5: `sampling:` applies to `type: mcp` tools only"]
        );
        let errors = parse("    sampling:\n      max_tokens: 5\n", "mcp_resource").unwrap_err();
        assert_eq!(
            errors,
            [
                "9:5: `sampling:` applies to calls of a server's tools, not to a `resource:` read (a read cannot ask for a completion)"
            ]
        );
    }
}
