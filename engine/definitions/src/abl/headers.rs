//! `headers:` blocks (a tool's own, the file's default `headers:`, and
//! `auth_config.custom_headers:`): header names and values, the
//! `{{config.NAME}}` and `{{_secret.KEY}}` placeholders a value may hold,
//! and how the file's defaults merge under a tool's own.

use std::collections::BTreeMap;

use belay_proto::wire::{
    TemplatePiece, config_placeholder_name, secret_placeholder_name, split_placeholders,
};

use super::lines::{Block, Cx, head, parse_scalar, to_u32};
use super::secrets;

/// RFC 9110 token: the characters of a header name.
pub(super) fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c))
}

/// The file's default headers under the tool's: a tool header wins over a
/// default of the same name in any case.
pub(super) fn merge_headers(
    defaults: &BTreeMap<String, String>,
    mut own: BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    for (name, value) in defaults {
        if !own.keys().any(|o| o.eq_ignore_ascii_case(name)) {
            own.insert(name.clone(), value.clone());
        }
    }
    own
}

/// Every `{{...}}` in the values of a headers block (`headers:`,
/// `auth_config.custom_headers:`) must be `{{config.NAME}}`, or, with
/// `secrets` (a tool's own `headers:`), `{{_secret.KEY}}`: returned as
/// (KEY, line, column) to check against the tool's `SECRET_ACCESS`.
pub(super) fn check_header_placeholders(
    block: &Block,
    secrets: bool,
    cx: &mut Cx<'_>,
) -> Vec<(String, u32, u32)> {
    let mut found = Vec::new();
    for header in &block.children {
        let line = &header.line;
        let Some((name, value)) = line.text.split_once(':') else {
            continue;
        };
        let name = name.trim_end();
        let lead = value.chars().take_while(|c| c.is_whitespace()).count();
        let value_col = line
            .col()
            .saturating_add(to_u32(name.chars().count() + 1 + lead));
        let value = value.trim();
        if secrets && let Ok(pieces) = split_placeholders(value) {
            for piece in pieces {
                if let TemplatePiece::Placeholder { inner, at } = piece
                    && let Some(key) = secret_placeholder_name(inner)
                {
                    let col = value_col.saturating_add(to_u32(value[..at].chars().count()));
                    found.push((key.to_owned(), line.no, col));
                }
            }
        }
        let check = if secrets {
            check_header_value(value)
        } else {
            check_config_placeholders(value)
        };
        if let Some(message) = check {
            cx.error(line.no, line.col(), format!("header `{name}`: {message}"));
        }
    }
    found
}

/// [`check_config_placeholders`] for a tool's own `headers:`, where
/// `{{_secret.KEY}}` is allowed too.
fn check_header_value(value: &str) -> Option<String> {
    let Ok(pieces) = split_placeholders(value) else {
        return Some("a `{{` placeholder is not closed with `}}`".into());
    };
    pieces.iter().find_map(|piece| match piece {
        TemplatePiece::Placeholder { inner, .. }
            if config_placeholder_name(inner).is_none()
                && secret_placeholder_name(inner).is_none() =>
        {
            Some(if inner.starts_with("_secret") {
                secrets::bad_key_message(inner)
            } else {
                format!(
                    "placeholder `{{{{{inner}}}}}` is not supported (only `{{{{config.NAME}}}}`, resolved by the worker from its configuration, and `{{{{_secret.KEY}}}}` of a key the tool lists in `SECRET_ACCESS`)"
                )
            })
        }
        _ => None,
    })
}

/// `None` when every `{{...}}` in `value` is `{{config.NAME}}` (NAME of
/// letters, digits, `_`, `-`, `.`), else what is wrong.
pub(super) fn check_config_placeholders(value: &str) -> Option<String> {
    let Ok(pieces) = split_placeholders(value) else {
        return Some("a `{{` placeholder is not closed with `}}`".into());
    };
    pieces.iter().find_map(|piece| match piece {
        TemplatePiece::Placeholder { inner, .. } if inner.starts_with("_secret") => {
            Some(secrets::misplaced_message(inner, "here"))
        }
        TemplatePiece::Placeholder { inner, .. } if config_placeholder_name(inner).is_none() => {
            Some(format!(
                "placeholder `{{{{{inner}}}}}` is not supported (only `{{{{config.NAME}}}}`, resolved by the worker from its configuration)"
            ))
        }
        _ => None,
    })
}

pub(super) fn read_headers(block: &Block, cx: &mut Cx<'_>) -> BTreeMap<String, String> {
    let mut headers = BTreeMap::new();
    // Header names are case-insensitive: `Accept` and `accept` are one header.
    let mut seen: BTreeMap<String, u32> = BTreeMap::new();
    for child in &block.children {
        let line = &child.line;
        if let Some(first) = child.children.first() {
            cx.error(
                first.line.no,
                first.line.col(),
                "a header is one `Name: value` line",
            );
            continue;
        }
        let Some((name, value)) = line.text.split_once(':') else {
            cx.error(
                line.no,
                line.col(),
                format!(
                    "expected `Header-Name: value`, found `{}`",
                    head(&line.text)
                ),
            );
            continue;
        };
        let name = name.trim_end();
        if !is_header_name(name) {
            cx.error(
                line.no,
                line.col(),
                format!("`{name}` is not a valid header name"),
            );
            continue;
        }
        let raw_value = value.trim();
        let value_col = line.col().saturating_add(to_u32(
            line.text.chars().count() - value.trim_start().chars().count(),
        ));
        let value = match parse_scalar(raw_value, value_col) {
            Ok(v) => v,
            Err((col, m)) => {
                cx.error(line.no, col, m);
                continue;
            }
        };
        if value.chars().any(|c| c == '\r' || c == '\n' || c == '\0') {
            cx.error(
                line.no,
                value_col,
                "a header value must not contain line breaks or NUL",
            );
            continue;
        }
        if let Some(first) = seen.insert(name.to_ascii_lowercase(), line.no) {
            cx.error(
                line.no,
                line.col(),
                format!("duplicate header `{name}` (first on line {first})"),
            );
            continue;
        }
        headers.insert(name.to_string(), value);
    }
    headers
}
