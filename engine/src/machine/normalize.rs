//! Normalisation of text that enters from models and tools, done once at the
//! boundary (DESIGN.md invariants): NUL bytes removed (PostgreSQL `jsonb`
//! rejects `\u0000`), and results cut to a byte limit on a UTF-8 boundary
//! before the model sees them. Lone surrogates cannot occur: the values are
//! Rust strings, and `serde_json` refuses them when parsing.

use serde_json::Value;

/// Remove NUL characters from a string.
pub fn strip_nul(text: &str) -> String {
    if text.contains('\0') {
        text.replace('\0', "")
    } else {
        text.to_owned()
    }
}

/// Remove NUL characters from every string (and object key) in a JSON value.
pub fn strip_nul_value(value: Value) -> Value {
    match value {
        Value::String(s) => Value::String(strip_nul(&s)),
        Value::Array(items) => Value::Array(items.into_iter().map(strip_nul_value).collect()),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (strip_nul(&k), strip_nul_value(v)))
                .collect(),
        ),
        other => other,
    }
}

/// Cut `text` to at most `limit` bytes on a char boundary.
pub fn truncate_str(text: &str, limit: usize) -> &str {
    if text.len() <= limit {
        return text;
    }
    let mut end = limit;
    while end > 0 && !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A tool result as the model sees it: strings as-is, everything else as
/// JSON text; longer than `limit` bytes is cut and says how much was dropped.
pub fn truncate_for_model(result: &Value, limit: usize) -> String {
    let text = match result {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    if text.len() <= limit {
        return text;
    }
    let kept = truncate_str(&text, limit);
    format!(
        "{kept}…[truncated: {} of {} bytes shown]",
        kept.len(),
        text.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strips_nul_everywhere() {
        let v = strip_nul_value(json!({"a\u{0}": ["x\u{0}y", 1, {"b": "\u{0}"}]}));
        assert_eq!(v, json!({"a": ["xy", 1, {"b": ""}]}));
    }

    #[test]
    fn truncates_on_char_boundary() {
        assert_eq!(truncate_str("héllo", 2), "h");
        assert_eq!(truncate_str("héllo", 3), "hé");
        let out = truncate_for_model(&json!("abcdef"), 4);
        assert_eq!(out, "abcd…[truncated: 4 of 6 bytes shown]");
        assert_eq!(truncate_for_model(&json!({"a": 1}), 100), "{\"a\":1}");
    }
}
