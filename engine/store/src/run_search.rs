//! The query behind the operator console's run list ([`RunSearch`]):
//! filters by status, workflow, creation time and text, a keyset page, and
//! the patterns both backends match the text with.

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// Which runs of a tenant to list ([`crate::Store::search_runs`]) or count
/// ([`crate::Store::count_runs_by_status`], which ignores `status`, `after`
/// and `limit`). Every filter left `None` matches every run.
#[derive(Debug, Clone, Default)]
pub struct RunSearch<'a> {
    /// Tenant (required).
    pub tenant: &'a str,
    /// Only runs of this status.
    pub status: Option<&'a str>,
    /// Only runs of this workflow (any version).
    pub workflow: Option<&'a str>,
    /// Only runs created at or after this time.
    pub created_from: Option<DateTime<Utc>>,
    /// Only runs created before this time.
    pub created_before: Option<DateTime<Utc>>,
    /// Only runs whose input or idempotency key contains this text (case
    /// insensitive), or whose id contains it (hex digits, hyphens ignored).
    pub text: Option<&'a str>,
    /// Keyset position: runs strictly older than this `(created_at, run_id)`.
    pub after: Option<(DateTime<Utc>, Uuid)>,
    /// Most rows returned (page size + 1, to tell whether there is more).
    pub limit: i64,
}

impl RunSearch<'_> {
    /// The `LIKE` pattern of [`RunSearch::text`] for the input and the
    /// idempotency key: `%text%`, with `\`, `%` and `_` escaped (`ESCAPE '\'`).
    pub(crate) fn text_pattern(&self) -> Option<String> {
        let text = self.text.map(str::trim).filter(|t| !t.is_empty())?;
        let mut pattern = String::with_capacity(text.len() + 2);
        pattern.push('%');
        for c in text.chars() {
            if matches!(c, '\\' | '%' | '_') {
                pattern.push('\\');
            }
            pattern.push(c);
        }
        pattern.push('%');
        Some(pattern)
    }

    /// The `LIKE` pattern of [`RunSearch::text`] for the run id as 32
    /// lowercase hex digits: `%<hex>%` when the text is only hex digits and
    /// hyphens (with at least one digit), else `None` (no id matches).
    pub(crate) fn id_pattern(&self) -> Option<String> {
        let text = self.text.map(str::trim).filter(|t| !t.is_empty())?;
        if !text.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            return None;
        }
        let hex: String = text
            .chars()
            .filter(char::is_ascii_hexdigit)
            .map(|c| c.to_ascii_lowercase())
            .collect();
        (!hex.is_empty()).then(|| format!("%{hex}%"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn search(text: &str) -> RunSearch<'_> {
        RunSearch {
            tenant: "t",
            text: Some(text),
            ..RunSearch::default()
        }
    }

    #[test]
    fn text_is_escaped_and_ids_are_hex_only() {
        assert_eq!(
            search("a%b_c\\").text_pattern().as_deref(),
            Some("%a\\%b\\_c\\\\%")
        );
        assert_eq!(search("  ").text_pattern(), None);
        assert_eq!(search("019A-bc").id_pattern().as_deref(), Some("%019abc%"));
        assert_eq!(search("ada@example.com").id_pattern(), None);
        assert_eq!(search("--").id_pattern(), None);
    }
}
