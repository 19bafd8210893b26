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

/// A tool result reduced to its `compaction.essential_fields` for the
/// model: dotted paths into objects (`items.id`); an array, wherever it
/// is, keeps each item reduced by the same paths; a path naming a field
/// that is absent (or a scalar where an object is needed) gives nothing.
/// A result that is neither an object nor an array has no fields and is
/// kept whole. Empty path segments (`a..b`) never match.
pub fn essential_fields(result: &Value, paths: &[String]) -> Value {
    let split: Vec<Vec<&str>> = paths.iter().map(|p| p.split('.').collect()).collect();
    let refs: Vec<&[&str]> = split.iter().map(Vec::as_slice).collect();
    match result {
        Value::Object(_) | Value::Array(_) => {
            select(result, &refs).unwrap_or_else(|| Value::Object(Default::default()))
        }
        other => other.clone(),
    }
}

/// Marker after a string cut by [`cut_long_strings`].
pub const CUT_MARKER: &str = "…[cut]";

/// A tool result with every string (at any depth, object keys excepted)
/// longer than `max_chars` characters (Unicode scalar values) cut to
/// `max_chars` and followed by [`CUT_MARKER`], for the model
/// (`compaction.max_description_length`). Other values are unchanged.
pub fn cut_long_strings(value: &Value, max_chars: usize) -> Value {
    match value {
        Value::String(s) => match s.char_indices().nth(max_chars) {
            Some((at, _)) => Value::String(format!("{}{CUT_MARKER}", &s[..at])),
            None => value.clone(),
        },
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|v| cut_long_strings(v, max_chars))
                .collect(),
        ),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), cut_long_strings(v, max_chars)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The parts of `value` that `paths` (each non-empty) reach; `None` when
/// none does.
fn select(value: &Value, paths: &[&[&str]]) -> Option<Value> {
    match value {
        Value::Array(items) => Some(Value::Array(
            items
                .iter()
                .filter_map(|item| select(item, paths))
                .collect(),
        )),
        Value::Object(map) => {
            let mut out = serde_json::Map::new();
            for (key, field) in map {
                let rests: Vec<&[&str]> = paths
                    .iter()
                    .filter_map(|p| match p.split_first() {
                        Some((first, rest)) if first == key => Some(rest),
                        _ => None,
                    })
                    .collect();
                if rests.is_empty() {
                    continue;
                }
                let kept = if rests.iter().any(|r| r.is_empty()) {
                    Some(field.clone())
                } else {
                    select(field, &rests)
                };
                if let Some(kept) = kept {
                    out.insert(key.clone(), kept);
                }
            }
            Some(Value::Object(out))
        }
        _ => None,
    }
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
    fn long_strings_are_cut_at_any_depth_on_char_boundaries() {
        let v = json!({"description": "héllo wörld", "n": 12345678, "items": [{"t": "abcdef"}, "ab"], "abcdefgh": true});
        assert_eq!(
            cut_long_strings(&v, 5),
            json!({"description": "héllo…[cut]", "n": 12345678, "items": [{"t": "abcde…[cut]"}, "ab"], "abcdefgh": true})
        );
        assert_eq!(cut_long_strings(&json!("abc"), 3), json!("abc"));
    }

    #[test]
    fn truncates_on_char_boundary() {
        assert_eq!(truncate_str("héllo", 2), "h");
        assert_eq!(truncate_str("héllo", 3), "hé");
        let out = truncate_for_model(&json!("abcdef"), 4);
        assert_eq!(out, "abcd…[truncated: 4 of 6 bytes shown]");
        assert_eq!(truncate_for_model(&json!({"a": 1}), 100), "{\"a\":1}");
    }

    #[test]
    fn essential_fields_keep_paths_through_objects_and_arrays() {
        let result = json!({
            "items": [
                {"id": 1, "name": "a", "price": 3, "blurb": "long"},
                {"id": 2, "name": "b", "extra": {"x": 1}},
                "not an object"
            ],
            "meta": {"page": 1, "total": 9, "debug": "x"},
            "noise": "dropped"
        });
        let paths = [
            "items.id",
            "items.price",
            "meta.total",
            "missing.x",
            "noise.deeper",
        ]
        .map(String::from);
        assert_eq!(
            essential_fields(&result, &paths),
            json!({
                "items": [{"id": 1, "price": 3}, {"id": 2}],
                "meta": {"total": 9}
            })
        );
        // A whole field; and a top-level array of objects.
        let whole = ["meta".to_owned()];
        assert_eq!(
            essential_fields(&result, &whole),
            json!({"meta": {"page": 1, "total": 9, "debug": "x"}})
        );
        let list = json!([{"id": 1, "x": 2}, {"y": 3}]);
        assert_eq!(
            essential_fields(&list, &["id".to_owned()]),
            json!([{"id": 1}, {}])
        );
        // Nothing matches: an empty object. A scalar result is kept.
        assert_eq!(essential_fields(&result, &["zzz".to_owned()]), json!({}));
        assert_eq!(
            essential_fields(&json!("text"), &["a".to_owned()]),
            json!("text")
        );
    }
}
