//! JSON text from outside (MCP servers, model providers) made decodable
//! where that is possible without guessing: the normalisation at the
//! boundary that DESIGN asks for. Pure, no I/O.
//!
//! Two things make otherwise well-formed JSON text undecodable by
//! `serde_json` and are repaired here, each to U+FFFD (the replacement
//! character), as a lenient decoder would:
//! - a lone surrogate escape (`"\ud83d"` without its low half, or a low
//!   half alone): UTF-16 leftovers of a string cut in the middle of a
//!   character, which JSON's grammar allows and no Rust string can hold;
//! - bytes that are not UTF-8.
//!
//! Anything else (a truncated line, a syntax error) is left as it is: the
//! caller reports it as undecodable.

/// What [`repair`] changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Repairs {
    /// Lone surrogate escapes replaced by `\ufffd`.
    pub lone_surrogates: usize,
    /// Whether bytes that are not UTF-8 were replaced by U+FFFD.
    pub invalid_utf8: bool,
}

impl Repairs {
    /// Whether anything was changed.
    pub fn any(&self) -> bool {
        self.lone_surrogates > 0 || self.invalid_utf8
    }
}

/// `text` with its lone surrogate escapes and non-UTF-8 bytes replaced by
/// U+FFFD, and what was replaced; `None` when nothing needed replacing.
/// Escapes are found inside string literals only (`"\\ud83d"` is a
/// backslash and five letters, not an escape), and a surrogate pair
/// (`\ud83d\ude00`) is kept. Every lone surrogate escape is replaced by the
/// escape `\ufffd`, six bytes for six, so positions in the text do not move.
pub fn repair(text: &[u8]) -> Option<(Vec<u8>, Repairs)> {
    let mut repairs = Repairs::default();
    let utf8: std::borrow::Cow<'_, str> = String::from_utf8_lossy(text);
    if let std::borrow::Cow::Owned(_) = &utf8 {
        repairs.invalid_utf8 = true;
    }
    let mut out = utf8.into_owned().into_bytes();
    repairs.lone_surrogates = replace_lone_surrogates(&mut out);
    repairs.any().then_some((out, repairs))
}

/// The code unit of the `\uXXXX` escape at `at` (the backslash), if there
/// is one.
fn escape_at(text: &[u8], at: usize) -> Option<u16> {
    let digits = text.get(at..at + 6)?;
    if digits[0] != b'\\' || digits[1] != b'u' {
        return None;
    }
    let hex = std::str::from_utf8(&digits[2..]).ok()?;
    u16::from_str_radix(hex, 16).ok()
}

fn is_high(unit: u16) -> bool {
    (0xD800..=0xDBFF).contains(&unit)
}

fn is_low(unit: u16) -> bool {
    (0xDC00..=0xDFFF).contains(&unit)
}

/// Replaces every lone surrogate escape inside a string literal of `text`
/// with `\ufffd` (in place); returns how many.
fn replace_lone_surrogates(text: &mut [u8]) -> usize {
    let mut replaced = 0;
    let mut in_string = false;
    let mut i = 0;
    while i < text.len() {
        match text[i] {
            b'"' => {
                in_string = !in_string;
                i += 1;
            }
            b'\\' if in_string => match escape_at(text, i) {
                Some(unit) if is_high(unit) => {
                    if escape_at(text, i + 6).is_some_and(is_low) {
                        i += 12;
                    } else {
                        text[i + 2..i + 6].copy_from_slice(b"fffd");
                        replaced += 1;
                        i += 6;
                    }
                }
                Some(unit) if is_low(unit) => {
                    text[i + 2..i + 6].copy_from_slice(b"fffd");
                    replaced += 1;
                    i += 6;
                }
                Some(_) => i += 6,
                // `\"`, `\\`, `\n`, …: the escaped byte is not a quote
                // that ends the string.
                None => i += 2,
            },
            _ => i += 1,
        }
    }
    replaced
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repaired(text: &str) -> Option<String> {
        repair(text.as_bytes()).map(|(bytes, _)| String::from_utf8(bytes).unwrap_or_default())
    }

    #[test]
    fn lone_surrogates_become_the_replacement_character_and_pairs_stay() {
        assert_eq!(
            repaired(r#"{"t":"x\ud83dy"}"#).as_deref(),
            Some(r#"{"t":"x\ufffdy"}"#)
        );
        assert_eq!(repaired(r#"{"t":"\ud83d\ude00"}"#), None);
        assert_eq!(
            repaired(r#"["\ude00", "\ud83d\u0041", "\ud83d\ud83d\ude00", "\uD83D"]"#).as_deref(),
            Some(r#"["\ufffd", "\ufffd\u0041", "\ufffd\ud83d\ude00", "\ufffd"]"#)
        );
        // An escaped backslash before `u` is text, not an escape.
        assert_eq!(repaired(r#"{"t":"\\ud83d"}"#), None);
        assert_eq!(
            repaired(r#"{"t":"\"\ud83d"}"#).as_deref(),
            Some(r#"{"t":"\"\ufffd"}"#)
        );
        // Outside strings nothing is an escape; a cut-off escape is left.
        assert_eq!(repaired(r#"{"t":"\ud8"#), None);
        let (text, repairs) = repair(br#"{"t":"x\ud83d"}"#).unwrap_or_default();
        assert_eq!(repairs.lone_surrogates, 1);
        let value: serde_json::Value = serde_json::from_slice(&text).unwrap_or_default();
        assert_eq!(value["t"], "x\u{FFFD}");
    }

    #[test]
    fn bytes_that_are_not_utf8_become_the_replacement_character() {
        let (text, repairs) = repair(b"{\"t\":\"a\xffb\"}").unwrap_or_default();
        assert!(repairs.invalid_utf8 && repairs.lone_surrogates == 0);
        assert_eq!(text, "{\"t\":\"a\u{FFFD}b\"}".as_bytes());
        assert_eq!(repair(b"{\"t\":\"\xc3\xa9\"}"), None);
    }
}
