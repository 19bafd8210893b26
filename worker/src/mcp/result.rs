//! Cutting a tool result down to the caller's size limit.
//!
//! Size is counted as the bytes of the compact JSON of the `content` array
//! plus those of `structuredContent`. Over the limit, `structuredContent` is
//! kept whole if it fits (it is typed and validated; half of it would be
//! neither) and dropped otherwise; then content blocks are kept in order
//! while they fit, the first text block that does not fit is cut on a
//! character boundary with a marker, and the remaining blocks are dropped.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::ToolResult;

/// What [`truncate`] removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Truncation {
    /// Size before, in bytes (see the module docs).
    pub original_bytes: usize,
    /// Size after, in bytes; at most the limit.
    pub kept_bytes: usize,
    /// `structuredContent` was dropped because it alone exceeded the limit.
    pub structured_content_dropped: bool,
    /// Content blocks dropped whole.
    pub content_blocks_dropped: usize,
    /// A text block was cut short.
    pub text_cut: bool,
}

fn size(value: &Value) -> usize {
    serde_json::to_vec(value)
        .map(|v| v.len())
        .unwrap_or(usize::MAX)
}

/// `content` plus `structured_content`, cut to at most `limit_bytes`.
/// The text of content blocks joined with newlines (other blocks as JSON).
pub(crate) fn text(content: &[Value]) -> String {
    content
        .iter()
        .map(|block| match block.get("text").and_then(Value::as_str) {
            Some(text) => text.to_owned(),
            None => block.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

pub(crate) fn truncate(
    content: Vec<Value>,
    structured_content: Option<Value>,
    limit_bytes: usize,
) -> ToolResult {
    let content_value = Value::Array(content);
    let original = size(&content_value) + structured_content.as_ref().map_or(0, size);
    let Value::Array(content) = content_value else {
        return ToolResult::default();
    };
    if original <= limit_bytes {
        return ToolResult {
            content,
            structured_content,
            truncation: None,
        };
    }

    // The empty array's brackets.
    let mut budget = limit_bytes.saturating_sub(2);
    let mut structured_content_dropped = false;
    let structured = match structured_content {
        Some(s) if size(&s) <= budget => {
            budget -= size(&s);
            Some(s)
        }
        Some(_) => {
            structured_content_dropped = true;
            None
        }
        None => None,
    };

    let total = content.len();
    let mut kept = Vec::new();
    let mut text_cut = false;
    for block in content {
        // A comma before every block but the first.
        let separator = usize::from(!kept.is_empty());
        let block_size = size(&block) + separator;
        if block_size <= budget {
            budget -= block_size;
            kept.push(block);
            continue;
        }
        if let Some(cut) = cut_text_block(&block, budget.saturating_sub(separator)) {
            kept.push(cut);
            text_cut = true;
        }
        break;
    }
    let content_blocks_dropped = total - kept.len();
    let kept_value = Value::Array(kept);
    let kept_bytes = size(&kept_value) + structured.as_ref().map_or(0, size);
    let Value::Array(kept) = kept_value else {
        return ToolResult::default();
    };
    ToolResult {
        content: kept,
        structured_content: structured,
        truncation: Some(Truncation {
            original_bytes: original,
            kept_bytes,
            structured_content_dropped,
            content_blocks_dropped,
            text_cut,
        }),
    }
}

/// A `{"type": "text", "text": …}` block cut so that its compact JSON fits in
/// `budget` bytes, with a marker; `None` if it is not a text block or not
/// even the marker fits.
fn cut_text_block(block: &Value, budget: usize) -> Option<Value> {
    let text = block.get("text")?.as_str()?;
    if block.get("type").and_then(Value::as_str) != Some("text") {
        return None;
    }
    let with = |end: usize| {
        let mut cut = block.clone();
        let marker = format!("… [truncated: {} more bytes]", text.len() - end);
        if let Some(obj) = cut.as_object_mut() {
            obj.insert(
                "text".into(),
                Value::String(format!("{}{marker}", &text[..end])),
            );
        }
        cut
    };
    if size(&with(0)) > budget {
        return None;
    }
    // Largest char boundary whose block fits; JSON escaping makes the size
    // non-linear in the cut, so search rather than compute.
    let boundaries: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
    let (mut lo, mut hi) = (0usize, boundaries.len().saturating_sub(1));
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if size(&with(boundaries[mid])) <= budget {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    Some(with(boundaries.get(lo).copied().unwrap_or(0)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn text(t: &str) -> Value {
        json!({"type": "text", "text": t})
    }

    #[test]
    fn small_results_are_untouched() {
        let r = truncate(vec![text("hi")], Some(json!({"a": 1})), 1000);
        assert_eq!(r.truncation, None);
        assert_eq!(r.content, vec![text("hi")]);
    }

    #[test]
    fn long_text_is_cut_within_the_limit() {
        let long = "é\"\n".repeat(1000);
        for limit in [60usize, 100, 500, 2000] {
            let r = truncate(vec![text(&long), text("second")], None, limit);
            let t = r.truncation.clone().unwrap();
            assert!(t.kept_bytes <= limit, "{t:?}");
            assert_eq!(size(&Value::Array(r.content.clone())), t.kept_bytes);
            assert!(t.text_cut);
            assert_eq!(t.content_blocks_dropped, 1);
            let kept = r.content[0]["text"].as_str().unwrap();
            assert!(kept.contains("[truncated:"), "{kept}");
        }
    }

    #[test]
    fn structured_content_is_kept_whole_or_dropped() {
        let big = json!({"data": "x".repeat(500)});
        let r = truncate(vec![text(&"y".repeat(500))], Some(big.clone()), 600);
        assert_eq!(r.structured_content, Some(big.clone()));
        assert!(r.truncation.as_ref().unwrap().kept_bytes <= 600);
        let r = truncate(vec![text("small")], Some(big), 100);
        assert_eq!(r.structured_content, None);
        let t = r.truncation.unwrap();
        assert!(t.structured_content_dropped);
        assert_eq!(r.content, vec![text("small")]);
    }

    #[test]
    fn non_text_blocks_that_do_not_fit_are_dropped() {
        let image = json!({"type": "image", "data": "A".repeat(1000), "mimeType": "image/png"});
        let r = truncate(vec![text("a"), image, text("b")], None, 100);
        let t = r.truncation.unwrap();
        assert_eq!(r.content, vec![text("a")]);
        assert_eq!(t.content_blocks_dropped, 2);
        assert!(!t.text_cut);
    }
}
