//! The syntax of a `.tools.abl` file, below any property: its lines
//! (comments cut, indentation kept) grouped into a tree of [`Block`]s,
//! `key: value` lines split into [`KeyValue`]s, and the one-line values
//! every reader takes (`scalar`, `keyword`, durations). Also [`Cx`], the
//! context every stage records its errors in.

use std::collections::BTreeMap;

use crate::DefinitionError;
use crate::signature::{self, TypeExpr};

use super::{AblOutput, MAX_BLOCK_DEPTH, block_scalar};

pub(super) struct Cx<'a> {
    pub(super) file: &'a str,
    pub(super) out: AblOutput,
    /// The file's `TYPES:`, expanded ([`types::read_types`](super::types::read_types)).
    pub(super) types: BTreeMap<String, TypeExpr>,
    /// The text of each `key: |` block scalar, by the line number of its
    /// key (`block_scalar.rs`); its lines are not in the line tree.
    pub(super) block_scalars: BTreeMap<u32, block_scalar::BlockScalar>,
}

impl Cx<'_> {
    pub(super) fn error(&mut self, line: u32, column: u32, message: impl Into<String>) {
        self.out
            .errors
            .push(DefinitionError::new(self.file, line, column, message));
    }
}

/// One meaningful line: comment stripped, trimmed, with its indentation.
#[derive(Debug, Clone)]
pub(super) struct Line {
    /// 1-based line number.
    pub(super) no: u32,
    /// Leading spaces.
    pub(super) indent: usize,
    /// The content, without comment and surrounding whitespace.
    pub(super) text: String,
}

impl Line {
    /// Column of the first character of `text`.
    pub(super) fn col(&self) -> u32 {
        to_u32(self.indent).saturating_add(1)
    }
}

/// A line and the more-indented lines under it.
#[derive(Debug)]
pub(super) struct Block {
    pub(super) line: Line,
    pub(super) children: Vec<Block>,
}

pub(super) fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The first few words of `text`, for messages that quote a line.
pub(super) fn head(text: &str) -> String {
    let cut: String = text.chars().take(40).collect();
    if cut.len() < text.len() {
        format!("{cut}...")
    } else {
        cut
    }
}

pub(super) fn split_lines(content: &str, cx: &mut Cx<'_>) -> Vec<Line> {
    let content = content.strip_prefix('\u{feff}').unwrap_or(content);
    let mut lines = Vec::new();
    let mut raws = content.split('\n').enumerate().peekable();
    while let Some((i, raw)) = raws.next() {
        let no = to_u32(i).saturating_add(1);
        let raw = raw.strip_suffix('\r').unwrap_or(raw);
        let stripped = strip_comment(raw);
        if stripped.trim().is_empty() {
            continue;
        }
        let leading: Vec<char> = stripped.chars().take_while(|c| c.is_whitespace()).collect();
        if let Some(at) = leading.iter().position(|&c| c != ' ') {
            cx.error(
                no,
                to_u32(at).saturating_add(1),
                "indentation must be spaces (found a tab or other whitespace)",
            );
            continue;
        }
        let line = Line {
            no,
            indent: leading.len(),
            text: stripped.trim().to_string(),
        };
        // A `key: |` takes the more-indented raw lines after it as its
        // text: comments, blank lines and indentation included.
        if let Some(indicator) = split_key(&line).map(|kv| kv.value)
            && block_scalar::is_indicator(indicator)
        {
            let scalar = block_scalar::read(indicator, &line, &mut raws);
            cx.block_scalars.insert(no, scalar);
        }
        lines.push(line);
    }
    lines
}

/// Cut a `#` comment: a `#` at the start or after whitespace, outside
/// quotes. As in YAML, `a#b` is not a comment, so `#` in URLs survives.
pub(super) fn strip_comment(raw: &str) -> &str {
    let mut quote: Option<char> = None;
    let mut prev: Option<char> = None;
    let mut escaped = false;
    for (i, c) in raw.char_indices() {
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if c == '\\' && q == '"' {
                    escaped = true;
                } else if c == '\'' && q == '\'' && raw[i + 1..].starts_with('\'') {
                    // `''` is a quote inside a single-quoted string.
                    escaped = true;
                } else if c == q {
                    quote = None;
                }
            }
            None => {
                // A quote opens a string only where a value can start; the
                // apostrophe in `don't` must not hide a later comment.
                let at_value_start = prev.is_none_or(|p| p.is_whitespace() || ":=,([{".contains(p));
                if (c == '"' || c == '\'') && at_value_start {
                    quote = Some(c);
                } else if c == '#' && prev.is_none_or(char::is_whitespace) {
                    return &raw[..i];
                }
            }
        }
        prev = Some(c);
    }
    raw
}

/// Group lines into blocks: each line owns the following lines indented
/// further than it.
pub(super) fn build_level(
    lines: &mut std::iter::Peekable<std::vec::IntoIter<Line>>,
    parent_indent: Option<usize>,
    depth: usize,
    cx: &mut Cx<'_>,
) -> Vec<Block> {
    let mut out = Vec::new();
    let mut level: Option<usize> = None;
    while let Some(next) = lines.peek() {
        if parent_indent.is_some_and(|p| next.indent <= p) {
            break;
        }
        if depth >= MAX_BLOCK_DEPTH {
            cx.error(next.no, next.col(), "indentation is nested too deeply");
            // Drop the whole over-deep subtree: one error is enough.
            while lines
                .peek()
                .is_some_and(|l| parent_indent.is_none_or(|p| l.indent > p))
            {
                lines.next();
            }
            break;
        }
        let Some(line) = lines.next() else { break };
        match level {
            None => level = Some(line.indent),
            Some(l) if l != line.indent => cx.error(
                line.no,
                line.col(),
                format!(
                    "inconsistent indentation: {} spaces here, {} on the lines above at this level",
                    line.indent, l
                ),
            ),
            Some(_) => {}
        }
        let children = build_level(lines, Some(line.indent), depth + 1, cx);
        out.push(Block { line, children });
    }
    out
}

/// `key: value` (or `key?: value` in `parameters:`), split with columns.
pub(super) struct KeyValue<'a> {
    pub(super) key: &'a str,
    pub(super) key_col: u32,
    pub(super) optional: bool,
    pub(super) value: &'a str,
    pub(super) value_col: u32,
}

pub(super) fn split_key(line: &Line) -> Option<KeyValue<'_>> {
    let text = line.text.as_str();
    let colon = text.find(':')?;
    let rest = &text[colon + 1..];
    if !(rest.is_empty() || rest.starts_with(char::is_whitespace)) {
        return None;
    }
    let mut key = text[..colon].trim_end();
    let optional = key.ends_with('?');
    if optional {
        key = key[..key.len() - 1].trim_end();
    }
    let mut chars = key.chars();
    let valid = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !valid {
        return None;
    }
    let value = rest.trim();
    let value_offset = text.len() - rest.trim_start().len();
    Some(KeyValue {
        key,
        key_col: line.col(),
        optional,
        value,
        value_col: line
            .col()
            .saturating_add(to_u32(text[..value_offset].chars().count())),
    })
}

/// A scalar property value: `"double"` or `'single'` quoted, or bare text.
pub(super) fn parse_scalar(value: &str, col: u32) -> Result<String, (u32, String)> {
    let chars: Vec<char> = value.chars().collect();
    match chars.first() {
        Some('"' | '\'') => {
            let (s, next) = signature::lex_string(&chars, 0)
                .map_err(|(at, m)| (col.saturating_add(to_u32(at)), m))?;
            if chars[next..].iter().any(|c| !c.is_whitespace()) {
                return Err((
                    col.saturating_add(to_u32(next)),
                    "unexpected text after the closing quote".to_string(),
                ));
            }
            Ok(s)
        }
        _ if block_scalar::is_indicator(value) => Err((
            col,
            "block scalars (`|`, `>`) are supported for `code:` only; write the value on one line, in quotes"
                .to_string(),
        )),
        _ => Ok(value.to_string()),
    }
}

pub(super) fn is_quoted(value: &str) -> bool {
    value.starts_with('"') || value.starts_with('\'')
}

/// The `key: value` of `line` (no `key?:`); else the error "expected
/// {expected}, found `…`".
pub(super) fn entry_kv<'l>(
    line: &'l Line,
    expected: &str,
    cx: &mut Cx<'_>,
) -> Option<KeyValue<'l>> {
    let kv = split_key(line).filter(|kv| !kv.optional);
    if kv.is_none() {
        cx.error(
            line.no,
            line.col(),
            format!("expected {expected}, found `{}`", head(&line.text)),
        );
    }
    kv
}

/// A one-line value that is one of `choices`; else an error "unknown KEY
/// `value` (expected `a` or `b`)" at the value.
pub(super) fn keyword<T: Copy>(
    block: &Block,
    kv: &KeyValue<'_>,
    choices: &[(&str, T)],
    cx: &mut Cx<'_>,
) -> Option<T> {
    let s = scalar(block, kv, cx)?;
    if let Some((_, value)) = choices.iter().find(|(name, _)| *name == s) {
        return Some(*value);
    }
    let names: Vec<String> = choices.iter().map(|(n, _)| format!("`{n}`")).collect();
    let expected = match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => names.join(""),
    };
    cx.error(
        block.line.no,
        kv.value_col,
        format!("unknown {} `{s}` (expected {expected})", kv.key),
    );
    None
}

/// Records that `kv.key` was written on `line`; `false`, with the error
/// "duplicate {what} (first on line N)" at the key, if it was already.
pub(super) fn first_time<'k>(
    seen: &mut BTreeMap<&'k str, u32>,
    kv: &KeyValue<'k>,
    line: u32,
    what: &str,
    cx: &mut Cx<'_>,
) -> bool {
    match seen.insert(kv.key, line) {
        None => true,
        Some(first) => {
            cx.error(
                line,
                kv.key_col,
                format!("duplicate {what} (first on line {first})"),
            );
            false
        }
    }
}

/// The value of a one-line property; `None` (with an error) otherwise.
pub(super) fn scalar(block: &Block, kv: &KeyValue<'_>, cx: &mut Cx<'_>) -> Option<String> {
    let line = &block.line;
    if let Some(first) = block.children.first() {
        cx.error(
            first.line.no,
            first.line.col(),
            format!(
                "`{}` takes a value on its own line, not an indented block",
                kv.key
            ),
        );
        return None;
    }
    if kv.value.is_empty() {
        cx.error(line.no, kv.key_col, format!("`{}` needs a value", kv.key));
        return None;
    }
    match parse_scalar(kv.value, kv.value_col) {
        Ok(s) => Some(s),
        Err((col, m)) => {
            cx.error(line.no, col, m);
            None
        }
    }
}

/// Whether a block property (`headers:`, `parameters:`) has no inline value.
pub(super) fn block_only(block: &Block, kv: &KeyValue<'_>, cx: &mut Cx<'_>) -> bool {
    if kv.value.is_empty() {
        return true;
    }
    cx.error(
        block.line.no,
        kv.value_col,
        format!(
            "`{}` takes an indented block on the following lines, not a value",
            kv.key
        ),
    );
    false
}

/// `30s`, `500ms`, `2m`, or a bare number, which the seed defines as
/// milliseconds (`timeout: 10000` in "HTTP tools"). Returns ms.
pub(super) fn parse_timeout(s: &str) -> Result<u64, String> {
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(digits_end);
    let factor = match unit {
        "" | "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        _ => 0,
    };
    let Ok(n) = number.parse::<u64>() else {
        return Err(format!(
            "timeout `{s}` is not a duration (write e.g. `30s`, `500ms`, `2m`, or a number of milliseconds)"
        ));
    };
    if factor == 0 && unit.chars().all(|c| c.is_ascii_alphabetic()) {
        return Err(format!(
            "timeout `{s}` has an unknown unit (use `ms`, `s` or `m`)"
        ));
    }
    if factor == 0 {
        return Err(format!(
            "timeout `{s}` is not a duration (write e.g. `30s`, `500ms`, `2m`, or a number of milliseconds)"
        ));
    }
    match n.checked_mul(factor) {
        Some(0) => Err("timeout must be more than 0".to_string()),
        Some(ms) => Ok(ms),
        None => Err(format!("timeout `{s}` is too large")),
    }
}
