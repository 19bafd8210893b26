//! A tool's `pii_access:` (seed `abl-tools.md`, "PII access"), read when a
//! `.tools.abl` file is parsed. What it opens up at run time is
//! `belay_machine::pii`: an agent with `pii_redaction:` sends its model
//! tokens (`[PII:email:1]`) instead of personal data, and puts the data
//! back only into the arguments of a tool whose `pii_access` allows it.
//!
//! Forms: one level (`pii_access: user`) or a list (`pii_access: [user,
//! tools]`). Levels:
//!
//! - `user`: data of the run's input and the agent's instructions;
//! - `tools`: data found in other tools' results;
//! - `original`: both (the broadest access);
//! - `llm`: this tool's own results go to the model as they are;
//! - `logs` is refused: Belay writes no argument or result to any log, so
//!   there is nothing for it to allow.
//!
//! A tool with `user`, `tools` or `original` may not also have a
//! `visibility.trace: false` parameter: such a value is sealed in the
//! run's vault as the model wrote it, before the engine could put the
//! data back into it.

use super::super::model::PiiAccess;
use super::lines::{Cx, to_u32};

/// Reads the value of `pii_access:` (written at `line`, value at `col`).
/// `None` after an error, which names the level and its column.
pub(super) fn read_pii_access(
    value: &str,
    line: u32,
    col: u32,
    cx: &mut Cx<'_>,
) -> Option<PiiAccess> {
    // (level, column) of each level as written.
    let mut levels: Vec<(&str, u32)> = Vec::new();
    match value.strip_prefix('[') {
        Some(rest) => {
            let Some(inner) = rest.strip_suffix(']') else {
                cx.error(
                    line,
                    col,
                    "`pii_access:` list is not closed: expected `[level, level]`",
                );
                return None;
            };
            let mut offset = 1;
            // A trailing comma (`[user, tools,]`) ends the list, as in YAML.
            let inner = inner.trim_end().strip_suffix(',').unwrap_or(inner);
            for item in inner.split(',') {
                let lead = item.chars().take_while(|c| c.is_whitespace()).count();
                levels.push((item.trim(), col + to_u32(offset + lead)));
                offset += item.chars().count() + 1;
            }
        }
        None => levels.push((value.trim(), col)),
    }
    let mut access = PiiAccess::default();
    let mut ok = true;
    let mut seen: Vec<&str> = Vec::new();
    for (level, at) in levels {
        if seen.contains(&level) {
            cx.error(line, at, format!("`pii_access:` names `{level}` twice"));
            ok = false;
            continue;
        }
        seen.push(level);
        match level {
            "user" => access.user = true,
            "tools" => access.tools = true,
            "original" => {
                access.user = true;
                access.tools = true;
            }
            "llm" => access.llm = true,
            "logs" => {
                cx.error(
                    line,
                    at,
                    "`pii_access: logs` does not apply to Belay: it writes no argument or result of a tool to its logs, so there is no PII in logs for this level to allow",
                );
                ok = false;
            }
            "" => {
                cx.error(
                    line,
                    at,
                    "`pii_access:` needs a level: `user`, `tools`, `original` or `llm`",
                );
                ok = false;
            }
            other => {
                cx.error(
                    line,
                    at,
                    format!(
                        "unknown `pii_access:` level `{other}` (expected `user`, `tools`, `original` or `llm`, or a list of them)"
                    ),
                );
                ok = false;
            }
        }
    }
    ok.then_some(access)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::super::parse_tools_file;
    use crate::model::PiiAccess;

    fn tool(prop: &str) -> Result<PiiAccess, Vec<String>> {
        let src = format!(
            "TOOLS:\n  send_mail(to: string, body: string) -> {{sent: boolean}}\n    type: http\n    endpoint: /send\n    method: POST\n    permission: mail.send\n    repeat_safety: never\n{prop}"
        );
        let out = parse_tools_file("t.tools.abl", &src);
        if out.errors.is_empty() {
            Ok(out.tools[0].pii_access)
        } else {
            Err(out.errors.iter().map(ToString::to_string).collect())
        }
    }

    #[test]
    fn levels_and_lists_are_read() {
        assert_eq!(tool(""), Ok(PiiAccess::default()));
        assert_eq!(
            tool("    pii_access: user\n"),
            Ok(PiiAccess {
                user: true,
                ..Default::default()
            })
        );
        assert_eq!(
            tool("    pii_access: [tools, llm]\n"),
            Ok(PiiAccess {
                tools: true,
                llm: true,
                ..Default::default()
            })
        );
        assert_eq!(
            tool("    pii_access: [user, tools,]\n"),
            Ok(PiiAccess {
                user: true,
                tools: true,
                llm: false
            })
        );
        assert_eq!(
            tool("    pii_access: original\n"),
            Ok(PiiAccess {
                user: true,
                tools: true,
                llm: false
            })
        );
    }

    #[test]
    fn bad_levels_are_errors_at_their_column() {
        let errs = tool("    pii_access: [user, secrets]\n").unwrap_err();
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].starts_with("t.tools.abl:8:24: unknown `pii_access:` level `secrets`"),
            "{errs:?}"
        );
        let errs = tool("    pii_access: logs\n").unwrap_err();
        assert!(
            errs[0].starts_with("t.tools.abl:8:17: `pii_access: logs` does not apply to Belay"),
            "{errs:?}"
        );
        let errs = tool("    pii_access: [user, user]\n").unwrap_err();
        assert!(errs[0].contains("names `user` twice"), "{errs:?}");
        let errs = tool("    pii_access: [user\n").unwrap_err();
        assert!(errs[0].contains("list is not closed"), "{errs:?}");
        let errs = tool("    pii_access: []\n").unwrap_err();
        assert!(errs[0].contains("needs a level"), "{errs:?}");
    }

    #[test]
    fn access_to_data_and_an_untraced_parameter_do_not_mix() {
        let errs = tool(
            "    pii_access: user\n    parameters:\n      to:\n        visibility: {trace: false}\n",
        )
        .unwrap_err();
        assert!(
            errs.iter()
                .any(|e| e.contains("visibility.trace: false") && e.contains("pii_access")),
            "{errs:?}"
        );
        // `llm` alone concerns results only.
        assert!(
            tool("    pii_access: llm\n    parameters:\n      to:\n        visibility: {trace: false}\n")
                .is_ok()
        );
    }
}
