//! A small scanner of Rust source for the tidy checks (`tests/tidy.rs`):
//! the length of every function, and the lines that are test code.
//!
//! Not a parser: it blanks comments, string and character literals (so a
//! brace or `fn` inside them counts for nothing), then matches braces.
//! Lifetimes (`'a`) are told from character literals (`'a'`, `'\n'`,
//! `'\u{1F600}'`) by the closing quote. A function's length is the number
//! of lines from the line of its `fn` keyword to the line of its closing
//! brace, both included (doc comments and attributes above it are not
//! counted; closures and nested items inside it are). The method is the one
//! of the review in `shared/design/engine-split-review.md`, so figures
//! compare with it.

/// One function of a file: its name, the 1-based line of its `fn`
/// keyword, how many lines it spans, and whether it sits in test code (a
/// `#[cfg(test)]` item or a `#[test]` function).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FnSpan {
    /// The function's name (`new`, `decide`); for a method, without its type.
    pub name: String,
    /// Line of the `fn` keyword, from 1.
    pub line: usize,
    /// Lines from the `fn` line to the closing brace, both included.
    pub lines: usize,
    /// Inside a `#[cfg(test)]` item, or marked `#[test]`.
    pub in_test: bool,
}

/// `source` with every comment, string literal and character literal
/// replaced by spaces (newlines kept), so that only code remains and line
/// numbers are unchanged.
pub fn blank_non_code(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0usize;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if let Some(end) = raw_string_end(&chars, i) {
            for &ch in &chars[i..end] {
                out.push(blank(ch));
            }
            i = end;
        } else if c == '"' {
            // A plain (or byte) string: up to the unescaped closing quote.
            out.push(' ');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' && i + 1 < chars.len() {
                    out.push(blank(chars[i]));
                    i += 1;
                }
                out.push(blank(chars[i]));
                i += 1;
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' {
            match char_literal_end(&chars, i) {
                Some(end) => {
                    for &ch in &chars[i..end] {
                        out.push(blank(ch));
                    }
                    i = end;
                }
                // A lifetime or a loop label.
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn prev(chars: &[char], i: usize) -> char {
    if i == 0 { ' ' } else { chars[i - 1] }
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Where a raw string (`r"…"`, `r#"…"#`, `br"…"`) starting at `i` ends
/// (one past its last character), if one starts there.
fn raw_string_end(chars: &[char], i: usize) -> Option<usize> {
    let mut j = i;
    if chars.get(j) == Some(&'b') {
        j += 1;
    }
    if chars.get(j) != Some(&'r') || is_ident_char(prev(chars, i)) {
        return None;
    }
    j += 1;
    let mut hashes = 0;
    while chars.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    if chars.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    while j < chars.len() {
        if chars[j] == '"' && (0..hashes).all(|k| chars.get(j + 1 + k) == Some(&'#')) {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(chars.len())
}

/// Where a character literal starting at `i` (a `'`) ends, or `None` when
/// the quote starts a lifetime or a label.
fn char_literal_end(chars: &[char], i: usize) -> Option<usize> {
    match chars.get(i + 1)? {
        '\\' => {
            let mut j = i + 2;
            while j < chars.len() && chars[j] != '\'' && j < i + 12 {
                j += 1;
            }
            (chars.get(j) == Some(&'\'')).then_some(j + 1)
        }
        _ => (chars.get(i + 2) == Some(&'\'')).then_some(i + 3),
    }
}

/// Every function of `source` with its length, in order of appearance.
pub fn functions(source: &str) -> Vec<FnSpan> {
    let code = blank_non_code(source);
    let chars: Vec<char> = code.chars().collect();
    let line_of = line_index(&chars);
    let test_ranges = test_ranges(&chars);
    let mut out = Vec::new();
    let mut i = 0;
    while i + 2 < chars.len() {
        let is_fn = chars[i] == 'f'
            && chars[i + 1] == 'n'
            && chars[i + 2].is_whitespace()
            && !is_ident_char(prev(&chars, i));
        if !is_fn {
            i += 1;
            continue;
        }
        let name: String = chars[i + 2..]
            .iter()
            .skip_while(|c| c.is_whitespace())
            .take_while(|c| is_ident_char(**c))
            .collect();
        if name.is_empty() {
            // `fn(` pointer types and the like.
            i += 2;
            continue;
        }
        if let Some(close) = body_end(&chars, i) {
            let (first, last) = (line_of[i], line_of[close]);
            out.push(FnSpan {
                name,
                line: first,
                lines: last - first + 1,
                in_test: test_ranges.iter().any(|&(a, b)| a <= i && i <= b)
                    || marked_test(&chars, i),
            });
        }
        i += 2;
    }
    out
}

/// The 1-based line of each character.
fn line_index(chars: &[char]) -> Vec<usize> {
    let mut line = 1;
    chars
        .iter()
        .map(|&c| {
            let here = line;
            if c == '\n' {
                line += 1;
            }
            here
        })
        .collect()
}

/// The index of the closing brace of the body of the function whose `fn`
/// is at `at`; `None` for a declaration without a body (`fn f();`).
fn body_end(chars: &[char], at: usize) -> Option<usize> {
    let mut j = at;
    let mut parens = 0i32;
    while j < chars.len() {
        match chars[j] {
            '(' | '[' => parens += 1,
            ')' | ']' => parens -= 1,
            ';' if parens == 0 => return None,
            '{' if parens == 0 => return matching_brace(chars, j),
            _ => {}
        }
        j += 1;
    }
    None
}

fn matching_brace(chars: &[char], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (j, &c) in chars.iter().enumerate().skip(open) {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(j);
                }
            }
            _ => {}
        }
    }
    None
}

/// The character ranges of items marked `#[cfg(test)]`: from the attribute
/// to the closing brace of the item's body (or its `;`).
fn test_ranges(chars: &[char]) -> Vec<(usize, usize)> {
    let text: String = chars.iter().collect();
    let mut ranges = Vec::new();
    let mut from = 0;
    while let Some(found) = text[from..].find("#[cfg(test)]") {
        let byte = from + found;
        let start = text[..byte].chars().count();
        let mut j = start + "#[cfg(test)]".len();
        while j < chars.len() && chars[j] != '{' && chars[j] != ';' {
            j += 1;
        }
        let end = if chars.get(j) == Some(&'{') {
            matching_brace(chars, j).unwrap_or(chars.len())
        } else {
            j
        };
        ranges.push((start, end));
        from = byte + "#[cfg(test)]".len();
    }
    ranges
}

/// Whether the function at `at` carries `#[test]` (or `#[tokio::test]`)
/// among the attributes just above it.
fn marked_test(chars: &[char], at: usize) -> bool {
    let before: String = chars[at.saturating_sub(400)..at].iter().collect();
    // Whole lines only: the one the `fn` is on (`pub `, `async `) is not
    // an attribute line.
    let whole = before.rfind('\n').map_or("", |end| &before[..end]);
    whole
        .lines()
        .rev()
        .take_while(|l| {
            let t = l.trim();
            t.starts_with("#[") || t.is_empty()
        })
        .any(|l| l.contains("test]") || l.contains("::test("))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_lines_from_fn_to_closing_brace() {
        let src = "fn a() {\n    let s = \"}\";\n    // }\n}\n\nfn b() -> u8 { 1 }\n";
        let f = functions(src);
        assert_eq!(f.len(), 2);
        assert_eq!((f[0].name.as_str(), f[0].line, f[0].lines), ("a", 1, 4));
        assert_eq!((f[1].name.as_str(), f[1].line, f[1].lines), ("b", 6, 1));
    }

    #[test]
    fn tells_lifetimes_from_char_literals() {
        let src =
            "fn a<'x>(s: &'x str) -> char {\n    let c = '{';\n    let d = '\\'';\n    c\n}\n";
        let f = functions(src);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].lines, 5);
    }

    #[test]
    fn raw_strings_and_block_comments_hide_braces() {
        let src = "fn a() {\n    let s = r#\"{ \"}\" \"#;\n    /* { /* } */ */\n}\n";
        assert_eq!(functions(src)[0].lines, 4);
    }

    #[test]
    fn declarations_without_bodies_are_skipped_and_tests_are_marked() {
        let src = "trait T { fn f(&self); }\nfn g() {}\n#[cfg(test)]\nmod tests {\n    fn helper() {}\n}\n#[test]\nfn t() {}\n";
        let f = functions(src);
        let names: Vec<(&str, bool)> = f.iter().map(|f| (f.name.as_str(), f.in_test)).collect();
        assert_eq!(names, [("g", false), ("helper", true), ("t", true)]);
    }
}
