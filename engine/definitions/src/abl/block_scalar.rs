//! Literal block scalars of `.tools.abl` files, as in YAML: `key: |` takes
//! the lines after it that are indented further than the key (and the
//! blank lines among and after them) as its value, verbatim: the
//! indentation of the block's first line is removed from every line, and
//! nothing else (`#` is text, not a comment; blank lines are kept).
//!
//! - `|` ends the value with one line break (trailing blank lines dropped),
//!   `|-` with none, `|+` keeps the trailing blank lines.
//! - Folded scalars (`>`) and indentation indicators (`|2`) are refused:
//!   code, the one property that takes a block, wants its lines as written,
//!   and the first line sets the indentation.
//! - A line of the block indented less than its first line, or indented
//!   with a tab, is an error at that line; so is a block with no text.
//!
//! The lines are read here, before the file's line tree is built, so they
//! never reach it (no structure errors about code). Which properties may
//! take a block is the caller's decision: only `code:` does
//! (`super::sandbox`); any other gets an error at its `|`.

use std::iter::Peekable;

use super::lines::{Line, to_u32};

/// The text of a `key: |` block, read when the file's lines are split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct BlockScalar {
    /// The value, or why it is refused: `(line, column, message)` of each
    /// problem, reported by the property that takes the block (a property
    /// that takes none reports only that).
    pub text: Result<String, Vec<(u32, u32, String)>>,
}

/// Whether `value` (a property's text after `key:`) opens a block scalar:
/// `|` or `>`, with any chomping or indentation indicators.
pub(super) fn is_indicator(value: &str) -> bool {
    let mut chars = value.chars();
    matches!(chars.next(), Some('|' | '>'))
        && chars.all(|c| c == '-' || c == '+' || c.is_ascii_digit())
}

/// How the value ends.
#[derive(Clone, Copy)]
enum Chomp {
    /// `|`: one line break.
    Clip,
    /// `|-`: none.
    Strip,
    /// `|+`: every trailing line break.
    Keep,
}

/// Reads the block of `key` (at `line`, whose value is `indicator`) from
/// `raws`, the file's remaining raw lines as `(index, text)`: consumes
/// every following line that is blank or indented further than `key`.
pub(super) fn read<'a, I>(indicator: &str, key: &Line, raws: &mut Peekable<I>) -> BlockScalar
where
    I: Iterator<Item = (usize, &'a str)>,
{
    // (line number, raw text without `\r`) of the block's lines.
    let mut taken: Vec<(u32, &str)> = Vec::new();
    while let Some(&(i, raw)) = raws.peek() {
        let raw = raw.strip_suffix('\r').unwrap_or(raw);
        let indent = raw.len() - raw.trim_start().len();
        if !raw.trim().is_empty() && indent <= key.indent {
            break;
        }
        taken.push((to_u32(i).saturating_add(1), raw));
        raws.next();
    }
    // The indicator's column: after `key:` and its spaces.
    let col = key
        .col()
        .saturating_add(to_u32(key.text.chars().count() - indicator.chars().count()));
    let chomp = match indicator {
        "|" => Chomp::Clip,
        "|-" => Chomp::Strip,
        "|+" => Chomp::Keep,
        _ if indicator.starts_with('>') => {
            return refused(
                key.no,
                col,
                "folded block scalars (`>`) are not supported; use `|`, which keeps the lines as written",
            );
        }
        _ => {
            return refused(
                key.no,
                col,
                format!(
                    "block scalar indicator `{indicator}` is not supported: write `|`, `|-` or `|+` (the first line of the block sets its indentation)"
                ),
            );
        }
    };
    // Trailing blank lines are not content (their line breaks may be).
    let content_end = taken
        .iter()
        .rposition(|(_, raw)| !raw.trim().is_empty())
        .map_or(0, |p| p + 1);
    let Some(&(_, first)) = taken.iter().find(|(_, raw)| !raw.trim().is_empty()) else {
        return refused(
            key.no,
            col,
            "the block is empty: write its lines below, indented further than the key",
        );
    };
    let block_indent = first.len() - first.trim_start().len();
    let mut errors = Vec::new();
    let mut lines: Vec<&str> = Vec::with_capacity(content_end);
    for &(no, raw) in &taken[..content_end] {
        if raw.trim().is_empty() {
            lines.push(raw.get(block_indent..).unwrap_or(""));
            continue;
        }
        let leading = &raw[..raw.len() - raw.trim_start().len()];
        if let Some(at) = leading.chars().position(|c| c != ' ')
            && at < block_indent
        {
            errors.push((
                no,
                to_u32(at).saturating_add(1),
                "indentation must be spaces (found a tab or other whitespace)".to_string(),
            ));
            continue;
        }
        if leading.len() < block_indent {
            errors.push((
                no,
                to_u32(leading.len()).saturating_add(1),
                format!(
                    "this line of the block is indented {} spaces, less than its first line ({block_indent})",
                    leading.len()
                ),
            ));
            continue;
        }
        lines.push(&raw[block_indent..]);
    }
    if !errors.is_empty() {
        return BlockScalar { text: Err(errors) };
    }
    let mut text = lines.join("\n");
    match chomp {
        Chomp::Strip => {}
        Chomp::Clip => text.push('\n'),
        Chomp::Keep => {
            text.push('\n');
            for _ in content_end..taken.len() {
                text.push('\n');
            }
        }
    }
    BlockScalar { text: Ok(text) }
}

fn refused(line: u32, column: u32, message: impl Into<String>) -> BlockScalar {
    BlockScalar {
        text: Err(vec![(line, column, message.into())]),
    }
}
