//! `RESULT_SECRETS:` and `SECRET_ACCESS:` of a tool (the seed's "Reuse
//! secrets across tools (SecretRef)"), and where `{{_secret.KEY}}` may
//! stand.
//!
//! A producer's `RESULT_SECRETS:` lines are `<result_path> -> <vault_key>
//! (consumers: [a, b], ttl: 300, single_use: true)`, the options optional:
//! the path names a `string` field of the declared return type (through
//! objects only), the key is a vault key (`is_vault_key`), `consumers` are
//! tool names (checked across the bundle by `definitions::parse_bundle`),
//! `ttl` whole seconds from 1 to 30 days, `single_use` `true` or `false`.
//! Only `type: http` and `type: mcp` tools produce: the worker takes the
//! values out of their results before reporting them.
//!
//! A consumer's `SECRET_ACCESS:` holds `READ: [keys]` (or `READ:` with `-
//! key` lines). `{{_secret.KEY}}` is allowed in the tool's own `headers:`
//! and `body_template:` only, and only for a key its `READ` lists; anywhere
//! else (endpoint, query values, auth settings, the file's default headers,
//! a parameter's `value:` or `default:`) it is refused where it stands.

use std::collections::BTreeMap;

use belay_proto::wire::{MAX_VAULT_KEY_CHARS, TemplatePiece, is_vault_key, split_placeholders};

use super::super::model::ResultSecretDef;
use super::super::signature::{Prim, Signature, TypeExpr};
use super::super::{NameAt, check_name};
use super::lines::{Block, Cx, Line, entry_kv, head, to_u32};
use super::props::{BindingType, Props};

/// Largest `ttl:` accepted, seconds: 30 days.
pub(super) const MAX_TTL_S: u64 = 30 * 24 * 3600;

/// Most entries of one `RESULT_SECRETS:` block, and most keys of one
/// `SECRET_ACCESS: READ` list: each is a row of the vault written (or read)
/// inside a run's transition.
pub(super) const MAX_SECRETS: usize = 16;

/// The first placeholder of `text` that starts with `_secret` (a vault
/// reference, well-formed or not), with the byte offset of its `{{`.
pub(super) fn first_secret_placeholder(text: &str) -> Option<(&str, usize)> {
    split_placeholders(text)
        .ok()?
        .into_iter()
        .find_map(|p| match p {
            TemplatePiece::Placeholder { inner, at } if inner.starts_with("_secret") => {
                Some((inner, at))
            }
            _ => None,
        })
}

/// Why `{{inner}}` (a vault reference) may not stand in `what` (`here`
/// for a message that already names the place).
pub(super) fn misplaced_message(inner: &str, what: &str) -> String {
    let place = if what == "here" {
        "here".to_owned()
    } else {
        format!("in {what}")
    };
    format!(
        "`{{{{{inner}}}}}` is not allowed {place}: a vaulted secret goes only into a tool's `headers:` and `body_template:`"
    )
}

/// Why `key` may not be written in a tools file: the vault keys of
/// untraced arguments (`visibility: {trace: false}`) start with
/// [`belay_proto::wire::ARG_KEY_PREFIX`], and a worker fills any
/// whole argument `{{_secret._arg_…}}` from the keys its dispatch returned,
/// so a key of that shape a tool could read would let a model copy the
/// secret into an argument.
fn reserved_key(key: &str) -> Option<String> {
    let prefix = belay_proto::wire::ARG_KEY_PREFIX;
    key.starts_with(prefix).then(|| {
        format!("vault keys starting with `{prefix}` are reserved for untraced arguments (`visibility: {{trace: false}}`)")
    })
}

/// Why `{{inner}}`, which starts with `_secret`, names no vault key.
pub(super) fn bad_key_message(inner: &str) -> String {
    format!(
        "`{{{{{inner}}}}}` is not a vault reference: write `{{{{_secret.KEY}}}}`, KEY of letters, digits, `_` and `-` (at most {MAX_VAULT_KEY_CHARS})"
    )
}

/// A tool's `RESULT_SECRETS:` and `SECRET_ACCESS:`, checked against its
/// binding type and return type, and `placed` (every `{{_secret.KEY}}` of
/// its headers and body template: KEY, line, column) against its
/// `SECRET_ACCESS`. Consumers named are recorded for the bundle's check.
pub(super) fn read_tool(
    props: &Props<'_>,
    sig: Option<&Signature>,
    tool: &str,
    line: &Line,
    placed: Vec<(String, u32, u32)>,
    cx: &mut Cx<'_>,
) -> (Vec<ResultSecretDef>, Vec<String>) {
    let mut produced = Vec::new();
    if let Some(block) = props.result_secrets {
        match props.binding_type {
            Some(BindingType::Http | BindingType::Mcp | BindingType::Sandbox) => {
                produced = read_result_secrets(block, sig, tool, cx);
            }
            Some(other @ (BindingType::AsyncWebhook | BindingType::Workflow)) => {
                let kind = if other == BindingType::Workflow {
                    "workflow"
                } else {
                    "async_webhook"
                };
                cx.error(
                    block.line.no,
                    block.line.col(),
                    format!(
                        "`RESULT_SECRETS:` applies to `type: http` and `type: mcp` tools (the worker takes the values out of their results); the result of a `type: {kind}` tool never passes through a worker"
                    ),
                );
            }
            // Already reported.
            Some(BindingType::Unsupported) | None => {}
        }
    }
    let mut access = Vec::new();
    if let Some(block) = props.secret_access {
        if props.binding_type == Some(BindingType::Workflow) {
            cx.error(
                block.line.no,
                block.line.col(),
                "`SECRET_ACCESS:` applies to tools a worker calls (`type: http`, `async_webhook` or `mcp`): a `type: workflow` tool sends no headers or body",
            );
        } else {
            access = read_secret_access(block, cx);
        }
    }
    for (key, kline, kcol) in placed {
        if !access.contains(&key) {
            let message = if props.secret_access.is_some() {
                format!(
                    "`{{{{_secret.{key}}}}}`: `{key}` is not in the `SECRET_ACCESS: READ` list of `{tool}`"
                )
            } else {
                format!(
                    "`{{{{_secret.{key}}}}}` needs `SECRET_ACCESS:` with `READ: [{key}]` in `{tool}` (line {})",
                    line.no
                )
            };
            cx.error(kline, kcol, message);
        }
    }
    (produced, access)
}

/// The entries of a `RESULT_SECRETS:` block.
fn read_result_secrets(
    block: &Block,
    sig: Option<&Signature>,
    tool: &str,
    cx: &mut Cx<'_>,
) -> Vec<ResultSecretDef> {
    let mut out: Vec<ResultSecretDef> = Vec::new();
    // Key and path → the line that first wrote them.
    let mut keys: BTreeMap<String, u32> = BTreeMap::new();
    let mut paths: BTreeMap<String, u32> = BTreeMap::new();
    for entry in &block.children {
        if let Some(nested) = entry.children.first() {
            cx.error(
                nested.line.no,
                nested.line.col(),
                "a `RESULT_SECRETS` entry is one line: `<result_path> -> <vault_key> (options)`",
            );
            continue;
        }
        let Some((def, at)) = read_entry(&entry.line, tool, cx) else {
            continue;
        };
        let (path_col, key_col) = at;
        let no = entry.line.no;
        if let Some(first) = keys.insert(def.key.clone(), no) {
            cx.error(
                no,
                key_col,
                format!(
                    "vault key `{}` is written twice (first on line {first})",
                    def.key
                ),
            );
            continue;
        }
        if let Some(first) = paths.insert(def.path.clone(), no) {
            cx.error(
                no,
                path_col,
                format!(
                    "result field `{}` is vaulted twice (first on line {first})",
                    def.path
                ),
            );
            continue;
        }
        if let Some(sig) = sig
            && let Some(message) = check_result_path(&sig.returns, &def.path, tool)
        {
            cx.error(no, path_col, message);
            continue;
        }
        out.push(def);
    }
    if block.children.is_empty() {
        cx.error(
            block.line.no,
            block.line.col(),
            "`RESULT_SECRETS:` needs at least one `<result_path> -> <vault_key>` line",
        );
    } else if block.children.len() > MAX_SECRETS {
        cx.error(
            block.line.no,
            block.line.col(),
            format!(
                "`RESULT_SECRETS:` has {} entries, more than the limit of {MAX_SECRETS}",
                block.children.len()
            ),
        );
    }
    out
}

/// One `<result_path> -> <vault_key> (options)` line, with the columns of
/// its path and key.
fn read_entry(line: &Line, tool: &str, cx: &mut Cx<'_>) -> Option<(ResultSecretDef, (u32, u32))> {
    let text = line.text.as_str();
    let col_at = |byte: usize| {
        line.col()
            .saturating_add(to_u32(text[..byte].chars().count()))
    };
    // An optional list dash, as in `- otp_token -> txn_otp`.
    let start = text
        .strip_prefix('-')
        .filter(|rest| rest.starts_with(char::is_whitespace))
        .map_or(0, |rest| text.len() - rest.trim_start().len());
    let Some(arrow) = text.find("->") else {
        cx.error(
            line.no,
            line.col(),
            format!(
                "expected `<result_path> -> <vault_key> (options)` in `RESULT_SECRETS:`, found `{}`",
                head(text)
            ),
        );
        return None;
    };
    let raw_path = &text[start..arrow];
    let path = raw_path.trim();
    let path_at = start + (raw_path.len() - raw_path.trim_start().len());
    let path_col = col_at(path_at);
    let after = arrow + 2;
    let (raw_key, options) = match text[after..].find('(') {
        Some(open) => (&text[after..after + open], Some(after + open)),
        None => (&text[after..], None),
    };
    let key = raw_key.trim();
    let key_at = after + (raw_key.len() - raw_key.trim_start().len());
    let key_col = col_at(key_at);
    let mut ok = true;
    if path.is_empty() {
        cx.error(line.no, path_col, "the result path before `->` is empty");
        ok = false;
    } else if !path.split('.').all(|seg| {
        !seg.is_empty()
            && seg
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    }) {
        cx.error(
            line.no,
            path_col,
            format!(
                "`{path}` is not a result path: write field names joined by `.`, like `otp_token` or `session.key`"
            ),
        );
        ok = false;
    }
    if key.is_empty() {
        cx.error(line.no, key_col, "the vault key after `->` is empty");
        ok = false;
    } else if !is_vault_key(key) {
        cx.error(
            line.no,
            key_col,
            format!(
                "`{key}` is not a vault key: letters, digits, `_` and `-`, starting with a letter or `_`, at most {MAX_VAULT_KEY_CHARS}"
            ),
        );
        ok = false;
    } else if let Some(message) = reserved_key(key) {
        cx.error(line.no, key_col, message);
        ok = false;
    }
    let mut def = ResultSecretDef {
        path: path.to_owned(),
        key: key.to_owned(),
        consumers: Vec::new(),
        ttl_s: None,
        single_use: false,
    };
    if let Some(open) = options {
        ok &= read_options(line, open, &mut def, tool, cx);
    }
    ok.then_some((def, (path_col, key_col)))
}

/// The `(consumers: [a, b], ttl: 300, single_use: true)` of an entry, whose
/// `(` is at byte `open` of the line. `false` after an error.
fn read_options(
    line: &Line,
    open: usize,
    def: &mut ResultSecretDef,
    tool: &str,
    cx: &mut Cx<'_>,
) -> bool {
    let text = line.text.as_str();
    let col_at = |byte: usize| {
        line.col()
            .saturating_add(to_u32(text[..byte].chars().count()))
    };
    let trimmed = text.trim_end();
    let Some(inner) = trimmed[open + 1..].strip_suffix(')') else {
        cx.error(
            line.no,
            col_at(open),
            "the options of a `RESULT_SECRETS` entry must end the line with `)`",
        );
        return false;
    };
    let base = open + 1;
    let mut ok = true;
    let mut seen: BTreeMap<&str, ()> = BTreeMap::new();
    for (at, item) in split_top_level(inner) {
        let at = base + at;
        let lead = item.len() - item.trim_start().len();
        let item_at = at + lead;
        let item = item.trim();
        if item.is_empty() {
            if !inner.trim().is_empty() {
                cx.error(line.no, col_at(item_at), "empty option between commas");
                ok = false;
            }
            continue;
        }
        let Some(colon) = item.find(':') else {
            cx.error(
                line.no,
                col_at(item_at),
                format!(
                    "expected `option: value` (`consumers`, `ttl` or `single_use`), found `{item}`"
                ),
            );
            ok = false;
            continue;
        };
        let (name, value) = (item[..colon].trim_end(), &item[colon + 1..]);
        let value_lead = value.len() - value.trim_start().len();
        let value_at = item_at + colon + 1 + value_lead;
        let value = value.trim();
        if seen.insert(name, ()).is_some() {
            cx.error(
                line.no,
                col_at(item_at),
                format!("duplicate option `{name}`"),
            );
            ok = false;
            continue;
        }
        let value_col = col_at(value_at);
        match name {
            "consumers" => match read_consumers(value, value_at, line, cx) {
                Some(names) => {
                    for (consumer, at) in &names {
                        cx.out.secret_consumers.push((
                            tool.to_owned(),
                            def.key.clone(),
                            NameAt {
                                name: consumer.clone(),
                                line: line.no,
                                column: col_at(*at),
                            },
                        ));
                    }
                    def.consumers = names.into_iter().map(|(n, _)| n).collect();
                }
                None => ok = false,
            },
            "ttl" => match value.parse::<u64>() {
                Ok(n) if (1..=MAX_TTL_S).contains(&n) => def.ttl_s = Some(n),
                _ => {
                    cx.error(
                        line.no,
                        value_col,
                        format!(
                            "`ttl` must be a whole number of seconds from 1 to {MAX_TTL_S} (30 days), not `{value}`"
                        ),
                    );
                    ok = false;
                }
            },
            "single_use" => match value {
                "true" => def.single_use = true,
                "false" => def.single_use = false,
                other => {
                    cx.error(
                        line.no,
                        value_col,
                        format!("`single_use` must be `true` or `false`, not `{other}`"),
                    );
                    ok = false;
                }
            },
            other => {
                cx.error(
                    line.no,
                    col_at(item_at),
                    format!(
                        "unknown option `{other}` of a `RESULT_SECRETS` entry (expected `consumers`, `ttl` or `single_use`)"
                    ),
                );
                ok = false;
            }
        }
    }
    ok
}

/// `text` split at the commas outside `[ ]`, each piece with its byte
/// offset in `text`.
fn split_top_level(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push((start, &text[start..i]));
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push((start, &text[start..]));
    out
}

/// `[a, b]`: tool names with their byte offsets in the line (`value` starts
/// at byte `at`). `None` after an error.
fn read_consumers(
    value: &str,
    at: usize,
    line: &Line,
    cx: &mut Cx<'_>,
) -> Option<Vec<(String, usize)>> {
    let text = line.text.as_str();
    let col_at = |byte: usize| {
        line.col()
            .saturating_add(to_u32(text[..byte].chars().count()))
    };
    let Some(inner) = value.strip_prefix('[').and_then(|v| v.strip_suffix(']')) else {
        cx.error(
            line.no,
            col_at(at),
            "`consumers` takes a list of tool names, like `[convert_transaction_to_emi]`",
        );
        return None;
    };
    let mut names: Vec<(String, usize)> = Vec::new();
    let mut ok = true;
    let mut offset = at + 1;
    for item in inner.split(',') {
        let lead = item.len() - item.trim_start().len();
        let item_at = offset + lead;
        offset += item.len() + 1;
        let name = item.trim();
        if name.is_empty() {
            if !inner.trim().is_empty() {
                cx.error(line.no, col_at(item_at), "empty item in `consumers`");
                ok = false;
            }
            continue;
        }
        if let Some(message) = check_name("tool", name) {
            cx.error(line.no, col_at(item_at), message);
            ok = false;
        } else if names.iter().any(|(n, _)| n == name) {
            cx.error(
                line.no,
                col_at(item_at),
                format!("`{name}` is listed twice in `consumers`"),
            );
            ok = false;
        } else {
            names.push((name.to_owned(), item_at));
        }
    }
    if ok && names.is_empty() {
        cx.error(
            line.no,
            col_at(at),
            "`consumers: []` allows no tool: name the tools, or leave `consumers` out to allow any tool whose `SECRET_ACCESS` lists the key",
        );
        return None;
    }
    ok.then_some(names)
}

/// What is wrong with `path` as a field of the return type `returns`, if
/// anything: it must go through declared object fields only, to a field
/// declared `string` (the result holds `[VAULTED:<key>]` there instead,
/// which must still match the type).
fn check_result_path(returns: &TypeExpr, path: &str, tool: &str) -> Option<String> {
    let mut ty = returns;
    let mut walked = String::new();
    for segment in path.split('.') {
        let fields = match ty {
            TypeExpr::Object(fields) => fields,
            other => {
                let what = if walked.is_empty() {
                    format!("the return type of `{tool}`")
                } else {
                    format!("`{walked}`")
                };
                return Some(format!(
                    "`{path}` is not a field of the return type of `{tool}`: {what} is `{}`, which declares no fields",
                    other.describe()
                ));
            }
        };
        let Some(field) = fields.iter().find(|f| f.name == segment) else {
            let names: Vec<String> = fields.iter().map(|f| format!("`{}`", f.name)).collect();
            let within = if walked.is_empty() {
                format!("the return type of `{tool}`")
            } else {
                format!("`{walked}`")
            };
            return Some(format!(
                "`{path}` is not a field of the return type of `{tool}`: {within} has no field `{segment}` (it has {})",
                if names.is_empty() {
                    "none".to_owned()
                } else {
                    names.join(", ")
                }
            ));
        };
        if !walked.is_empty() {
            walked.push('.');
        }
        walked.push_str(segment);
        ty = &field.ty;
    }
    if *ty != TypeExpr::Prim(Prim::String) {
        return Some(format!(
            "`{path}` is declared `{}`: a vaulted field must be a `string` (the result holds `[VAULTED:<key>]` in its place)",
            ty.describe()
        ));
    }
    None
}

/// The keys of a `SECRET_ACCESS:` block: `READ: [a, b]` or `READ:` with
/// `- a` lines.
fn read_secret_access(block: &Block, cx: &mut Cx<'_>) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    let mut read_seen = false;
    for entry in &block.children {
        let line = &entry.line;
        let Some(kv) = entry_kv(line, "`READ: [vault_key, ...]` in `SECRET_ACCESS:`", cx) else {
            continue;
        };
        if kv.key != "READ" {
            let message = if kv.key.eq_ignore_ascii_case("write") {
                "`WRITE` is not supported: a tool writes the vault with `RESULT_SECRETS:`; `SECRET_ACCESS:` takes `READ` only".to_owned()
            } else {
                format!(
                    "unknown key `{}` in `SECRET_ACCESS:` (expected `READ`)",
                    kv.key
                )
            };
            cx.error(line.no, kv.key_col, message);
            continue;
        }
        if read_seen {
            cx.error(line.no, kv.key_col, "duplicate `READ` in `SECRET_ACCESS:`");
            continue;
        }
        read_seen = true;
        // (key, line, column) of each item as written.
        let mut items: Vec<(String, u32, u32)> = Vec::new();
        if kv.value.is_empty() {
            for item in &entry.children {
                let text = item.line.text.as_str();
                let Some(rest) = text.strip_prefix('-') else {
                    cx.error(
                        item.line.no,
                        item.line.col(),
                        "expected `- vault_key` under `READ:`",
                    );
                    continue;
                };
                let lead = rest.len() - rest.trim_start().len();
                items.push((
                    rest.trim().to_owned(),
                    item.line.no,
                    item.line.col().saturating_add(to_u32(1 + lead)),
                ));
            }
        } else {
            let Some(inner) = kv.value.strip_prefix('[').and_then(|v| v.strip_suffix(']')) else {
                cx.error(
                    line.no,
                    kv.value_col,
                    "`READ` takes a list of vault keys, like `[txn_otp]`",
                );
                continue;
            };
            if let Some(first) = entry.children.first() {
                cx.error(
                    first.line.no,
                    first.line.col(),
                    "`READ` takes `[a, b]` or `- a` lines, not both",
                );
                continue;
            }
            let mut offset = 1;
            for item in inner.split(',') {
                let lead = item.chars().take_while(|c| c.is_whitespace()).count();
                let col = kv.value_col.saturating_add(to_u32(offset + lead));
                offset += item.chars().count() + 1;
                if item.trim().is_empty() && inner.trim().is_empty() {
                    continue;
                }
                items.push((item.trim().to_owned(), line.no, col));
            }
        }
        let items_written = items.len();
        for (key, no, col) in items {
            if !is_vault_key(&key) {
                cx.error(
                    no,
                    col,
                    format!(
                        "`{key}` is not a vault key: letters, digits, `_` and `-`, starting with a letter or `_`, at most {MAX_VAULT_KEY_CHARS}"
                    ),
                );
            } else if let Some(message) = reserved_key(&key) {
                cx.error(no, col, message);
            } else if keys.contains(&key) {
                cx.error(
                    no,
                    col,
                    format!("vault key `{key}` is listed twice in `READ`"),
                );
            } else {
                keys.push(key);
            }
        }
        if items_written == 0 {
            cx.error(line.no, kv.key_col, "`READ` needs at least one vault key");
        } else if keys.len() > MAX_SECRETS {
            cx.error(
                line.no,
                kv.key_col,
                format!(
                    "`READ` lists {} vault keys, more than the limit of {MAX_SECRETS}",
                    keys.len()
                ),
            );
        }
    }
    if !read_seen && block.children.is_empty() {
        cx.error(
            block.line.no,
            block.line.col(),
            "`SECRET_ACCESS:` needs `READ: [vault_key, ...]`",
        );
    }
    keys
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::super::{RegisteredNames, SourceFile, parse_bundle};
    use super::super::parse_tools_file;

    const FILE: &str = "vault.tools.abl";

    /// The seed's example (abl-tools › Reuse secrets across tools).
    const SEED: &str = r#"TOOLS:
  request_otp(account_id: string) -> {otp_token: string, expires_in: number}
    type: http
    endpoint: "/api/otp/request"
    method: POST
    permission: p.write
    repeat_safety: never
    RESULT_SECRETS:
      otp_token -> txn_otp (consumers: [convert_transaction_to_emi], ttl: 300, single_use: true)

  convert_transaction_to_emi(txn_id: string) -> {status: string}
    type: http
    endpoint: "/api/txn/convert"
    method: POST
    permission: p.write
    repeat_safety: never
    SECRET_ACCESS:
      READ: [txn_otp]
    headers:
      X-OTP-Token: "{{_secret.txn_otp}}"
"#;

    /// Errors as `line:column: message`.
    fn errors(content: &str) -> Vec<String> {
        let out = parse_tools_file(FILE, content);
        out.errors
            .iter()
            .map(|e| format!("{}:{}: {}", e.line, e.column, e.message))
            .collect()
    }

    /// A `type` tool `sig` (line 2) with `extra` property lines from line 7.
    fn tool(kind: &str, sig: &str, extra: &str) -> String {
        format!(
            "TOOLS:\n  {sig}\n    type: {kind}\n    endpoint: \"/x\"\n    permission: p.read\n    repeat_safety: idempotent\n{extra}"
        )
    }

    #[test]
    fn the_seed_example_parses_into_a_producer_and_a_consumer() {
        let out = parse_tools_file(FILE, SEED);
        assert_eq!(out.errors, vec![]);
        let [producer, consumer] = &out.tools[..] else {
            panic!("{:?}", out.tools)
        };
        assert_eq!(
            serde_json::to_value(&producer.result_secrets).unwrap(),
            serde_json::json!([{
                "path": "otp_token", "key": "txn_otp",
                "consumers": ["convert_transaction_to_emi"], "ttl_s": 300, "single_use": true
            }])
        );
        assert!(producer.secret_access.is_empty());
        assert_eq!(consumer.secret_access, vec!["txn_otp".to_owned()]);
        assert!(consumer.result_secrets.is_empty());
        let crate::model::ToolBindingDef::Http { headers, .. } = &consumer.binding else {
            panic!("http")
        };
        assert_eq!(headers["X-OTP-Token"], "{{_secret.txn_otp}}");
        assert_eq!(out.secret_consumers.len(), 1);
        assert_eq!(out.secret_consumers[0].2.name, "convert_transaction_to_emi");
        assert_eq!(
            (
                out.secret_consumers[0].2.line,
                out.secret_consumers[0].2.column
            ),
            (9, 41)
        );
    }

    #[test]
    fn options_are_optional_lists_take_both_forms_and_mcp_and_bodies_take_part() {
        let out = parse_tools_file(
            FILE,
            "TOOLS:
  login(user: string) -> {session: {token: string, refresh?: string}, ok: boolean}
    type: mcp
    server: auth
    permission: p.read
    RESULT_SECRETS:
      - session.token -> sess
      session.refresh->refresh (ttl: 60)
  use_it(n: number) -> object
    type: http
    endpoint: \"/y\"
    method: POST
    body_template: '{\"t\": \"{{_secret.sess}}\", \"n\": \"{{n}}\"}'
    permission: p.read
    repeat_safety: idempotent
    SECRET_ACCESS:
      READ:
        - sess
        - refresh
  mcp_use(n: number) -> object
    type: mcp
    server: auth
    headers:
      Authorization: \"Bearer {{_secret.sess}}\"
    permission: p.read
    SECRET_ACCESS:
      READ: [sess]
",
        );
        assert_eq!(out.errors, vec![]);
        let defs = &out.tools[0].result_secrets;
        assert_eq!(defs.len(), 2);
        assert_eq!(
            (defs[0].path.as_str(), defs[0].key.as_str()),
            ("session.token", "sess")
        );
        assert_eq!((defs[0].ttl_s, defs[0].single_use), (None, false));
        assert!(defs[0].consumers.is_empty());
        assert_eq!((defs[1].key.as_str(), defs[1].ttl_s), ("refresh", Some(60)));
        assert_eq!(out.tools[1].secret_access, ["sess", "refresh"]);
        assert_eq!(out.tools[2].secret_access, ["sess"]);
    }

    #[test]
    fn result_secrets_errors() {
        let sig = "t(a: string) -> {tok: string, n: number, obj: {k: string}, items: object[], any: object}";
        let cases = [
            (
                "    RESULT_SECRETS:\n      tok txn\n",
                vec![
                    "8:7: expected `<result_path> -> <vault_key> (options)` in `RESULT_SECRETS:`, found `tok txn`",
                ],
            ),
            (
                "    RESULT_SECRETS:\n      tokn -> k1\n      obj.q -> k2\n      n -> k3\n      items.id -> k4\n      any.x -> k5\n",
                vec![
                    "8:7: `tokn` is not a field of the return type of `t`: the return type of `t` has no field `tokn` (it has `tok`, `n`, `obj`, `items`, `any`)",
                    "9:7: `obj.q` is not a field of the return type of `t`: `obj` has no field `q` (it has `k`)",
                    "10:7: `n` is declared `number`: a vaulted field must be a `string` (the result holds `[VAULTED:<key>]` in its place)",
                    "11:7: `items.id` is not a field of the return type of `t`: `items` is `object[]`, which declares no fields",
                    "12:7: `any.x` is not a field of the return type of `t`: `any` is `object`, which declares no fields",
                ],
            ),
            (
                "    RESULT_SECRETS:\n      tok -> k (ttl: 0, single_use: yes, consumers: [], color: red, ttl: 5)\n",
                vec![
                    "8:22: `ttl` must be a whole number of seconds from 1 to 2592000 (30 days), not `0`",
                    "8:37: `single_use` must be `true` or `false`, not `yes`",
                    "8:53: `consumers: []` allows no tool: name the tools, or leave `consumers` out to allow any tool whose `SECRET_ACCESS` lists the key",
                    "8:57: unknown option `color` of a `RESULT_SECRETS` entry (expected `consumers`, `ttl` or `single_use`)",
                    "8:69: duplicate option `ttl`",
                ],
            ),
            (
                "    RESULT_SECRETS:\n      tok -> 9k (ttl: 5\n      obj.k -> k2 (consumers: x)\n      tok -> k3\n      obj.k -> k2\n      n -> k2\n      obj.k -> k6\n",
                vec![
                    "8:14: `9k` is not a vault key: letters, digits, `_` and `-`, starting with a letter or `_`, at most 64",
                    "8:17: the options of a `RESULT_SECRETS` entry must end the line with `)`",
                    "9:31: `consumers` takes a list of tool names, like `[convert_transaction_to_emi]`",
                    "12:12: vault key `k2` is written twice (first on line 11)",
                    "13:7: result field `obj.k` is vaulted twice (first on line 11)",
                ],
            ),
            (
                "    RESULT_SECRETS: tok -> k\n",
                vec![
                    "7:21: `RESULT_SECRETS` takes an indented block on the following lines, not a value",
                ],
            ),
            (
                "    RESULT_SECRETS:\n",
                vec![
                    "7:5: `RESULT_SECRETS:` needs at least one `<result_path> -> <vault_key>` line",
                ],
            ),
        ];
        for (extra, expected) in cases {
            assert_eq!(errors(&tool("http", sig, extra)), expected, "{extra}");
        }
        // Only tools whose result passes through a worker produce.
        assert_eq!(
            errors(&tool(
                "async_webhook",
                "t(a: string) -> {tok: string}",
                "    method: POST\n    RESULT_SECRETS:\n      tok -> k\n"
            )),
            vec![
                "8:5: `RESULT_SECRETS:` applies to `type: http` and `type: mcp` tools (the worker takes the values out of their results); the result of a `type: async_webhook` tool never passes through a worker"
            ]
        );
    }

    #[test]
    fn secret_access_errors_and_references_outside_headers_and_bodies() {
        let sig = "t(a: string) -> object";
        let cases = [
            (
                "    headers:\n      X-Otp: \"otp {{_secret.otp}}\"\n",
                vec![
                    "8:19: `{{_secret.otp}}` needs `SECRET_ACCESS:` with `READ: [otp]` in `t` (line 2)",
                ],
            ),
            (
                "    SECRET_ACCESS:\n      READ: [otp]\n    headers:\n      X-A: \"{{_secret.other}}\"\n      X-B: \"{{_secret.a.b}}\"\n",
                vec![
                    "11:7: header `X-B`: `{{_secret.a.b}}` is not a vault reference: write `{{_secret.KEY}}`, KEY of letters, digits, `_` and `-` (at most 64)",
                    "10:13: `{{_secret.other}}`: `other` is not in the `SECRET_ACCESS: READ` list of `t`",
                ],
            ),
            (
                "    SECRET_ACCESS:\n      READ: [otp, otp, 1x]\n      WRITE: [otp]\n      mode: x\n",
                vec![
                    "8:19: vault key `otp` is listed twice in `READ`",
                    "8:24: `1x` is not a vault key: letters, digits, `_` and `-`, starting with a letter or `_`, at most 64",
                    "9:7: `WRITE` is not supported: a tool writes the vault with `RESULT_SECRETS:`; `SECRET_ACCESS:` takes `READ` only",
                    "10:7: unknown key `mode` in `SECRET_ACCESS:` (expected `READ`)",
                ],
            ),
            (
                "    SECRET_ACCESS:\n      READ: []\n",
                vec!["8:7: `READ` needs at least one vault key"],
            ),
            (
                "    SECRET_ACCESS:\n      READ: [otp]\n    method: GET\n    query_params:\n      code: \"{{_secret.otp}}\"\n",
                vec![
                    "11:14: `{{_secret.otp}}` is not allowed in `query_params`: a vaulted secret goes only into a tool's `headers:` and `body_template:`",
                ],
            ),
            (
                "    SECRET_ACCESS:\n      READ: [otp]\n    auth: bearer\n    auth_config:\n      token: \"{{_secret.otp}}\"\n",
                vec![
                    "11:14: `token`: `{{_secret.otp}}` is not allowed here: a vaulted secret goes only into a tool's `headers:` and `body_template:`",
                    "9:11: `auth: bearer` needs `token:` in `auth_config:` (e.g. `token: \"{{config.NAME}}\"`)",
                ],
            ),
            (
                "    SECRET_ACCESS:\n      READ: [otp]\n    parameters:\n      a:\n        value: \"x-{{_secret.otp}}\"\n",
                vec![
                    "11:19: `{{_secret.otp}}` is not allowed in a parameter's `value`: a vaulted secret goes only into a tool's `headers:` and `body_template:`",
                ],
            ),
        ];
        for (extra, expected) in cases {
            assert_eq!(errors(&tool("http", sig, extra)), expected, "{extra}");
        }
        // The endpoint.
        assert_eq!(
            errors(
                "TOOLS:\n  t(a: string) -> object\n    type: http\n    endpoint: \"/x/{{_secret.otp}}\"\n    permission: p.read\n    repeat_safety: idempotent\n    SECRET_ACCESS:\n      READ: [otp]\n"
            ),
            vec![
                "4:19: `{{_secret.otp}}` is not allowed in `endpoint`: a vaulted secret goes only into a tool's `headers:` and `body_template:`",
            ]
        );
        // The file's default headers.
        assert_eq!(
            errors(
                "TOOLS:\n  headers:\n    X-Otp: \"{{_secret.otp}}\"\n  t(a: string) -> object\n    type: http\n    endpoint: \"/x\"\n    permission: p.read\n    repeat_safety: idempotent\n"
            ),
            vec![
                "3:13: `{{_secret.otp}}` is not allowed in the file's default `headers:`: put it in the `headers:` of the tool whose `SECRET_ACCESS` lists `otp`",
            ]
        );
        // A workflow tool sends nothing.
        assert_eq!(
            errors(
                "TOOLS:\n  w(a: string) -> object\n    type: workflow\n    workflow_id: flow\n    permission: p.read\n    repeat_safety: idempotent\n    SECRET_ACCESS:\n      READ: [otp]\n"
            ),
            vec![
                "7:5: `SECRET_ACCESS:` applies to tools a worker calls (`type: http`, `async_webhook` or `mcp`): a `type: workflow` tool sends no headers or body",
            ]
        );
    }

    #[test]
    fn consumers_must_be_tools_of_the_bundle_that_read_the_key() {
        let bundle = |content: &str, registered: &[&str]| {
            let registered = RegisteredNames {
                tools: registered.iter().map(|s| (*s).to_owned()).collect(),
                ..RegisteredNames::default()
            };
            let files = [SourceFile {
                path: FILE.into(),
                content: content.into(),
            }];
            parse_bundle(&files, &registered)
                .err()
                .unwrap_or_default()
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
        };
        assert_eq!(bundle(SEED, &[]), Vec::<String>::new());
        let ghost = SEED.replace(
            "consumers: [convert_transaction_to_emi]",
            "consumers: [convert_transaction_to_emi, ghost]",
        );
        assert_eq!(
            bundle(&ghost, &[]),
            vec![
                "vault.tools.abl:9:69: unknown tool `ghost` in `consumers:` of vault key `txn_otp`: not declared in this bundle nor registered"
            ]
        );
        // A registered tool is taken at its word.
        assert_eq!(bundle(&ghost, &["ghost"]), Vec::<String>::new());
        let unread = SEED
            .replace("READ: [txn_otp]", "READ: [other]")
            .replace("{{_secret.txn_otp}}", "{{_secret.other}}");
        assert_eq!(
            bundle(&unread, &[]),
            vec![
                "vault.tools.abl:9:41: `convert_transaction_to_emi` is a consumer of vault key `txn_otp` of `request_otp`, but its `SECRET_ACCESS: READ` does not list `txn_otp`"
            ]
        );
    }
}

#[cfg(test)]
mod reserved_tests {
    use super::super::parse_tools_file;

    #[test]
    fn vault_keys_of_untraced_arguments_cannot_be_written() {
        let content = "TOOLS:\n  t(a: string) -> {tok: string}\n    type: http\n    endpoint: \"/x\"\n    permission: p.read\n    repeat_safety: idempotent\n    RESULT_SECRETS:\n      tok -> _arg_0123456789abcdef01234567\n  u(a: string) -> string\n    type: http\n    endpoint: \"/y\"\n    permission: p.read\n    repeat_safety: idempotent\n    SECRET_ACCESS:\n      READ: [_arg_0123456789abcdef01234567]\n";
        let errors: Vec<String> = parse_tools_file("t.tools.abl", content)
            .errors
            .iter()
            .map(|e| format!("{}:{}: {}", e.line, e.column, e.message))
            .collect();
        let message = "vault keys starting with `_arg_` are reserved for untraced arguments (`visibility: {trace: false}`)";
        assert_eq!(
            errors,
            vec![format!("8:14: {message}"), format!("15:14: {message}")]
        );
    }
}
