//! The audit of tool calls: every call a tenant's runs proposed, with its
//! arguments, the caller and tenant of its run, the engine's decision
//! (scheduled, or refused and why), a person's confirmation, and its
//! outcome (result or error), newest first, per tool, per run, per
//! decision (admin `GET /admin/v1/tenants/{tenant}/tool-calls`).
//!
//! Nothing is recorded for it: each record is derived from the run's events
//! ([`crate::store::ToolCallRecord`], [`Store::list_tool_calls`]), so the
//! audit says exactly what the history says, for runs written before it
//! existed too.
//!
//! [`Store::list_tool_calls`]: crate::store::Store::list_tool_calls

use crate::coordinator::{
    Coordinator, CoordinatorError, MAX_ID_BYTES, check_text, make_page_token, parse_page_token,
    parse_uuid, require, shown,
};
use crate::store::{ToolCallDecision, ToolCallQuery, ToolCallRecord};

/// Calls per page when no `limit` is given.
pub const DEFAULT_TOOL_CALLS_LIMIT: u32 = 50;
/// Most calls per page.
pub const MAX_TOOL_CALLS_LIMIT: u32 = 500;

/// Filters of [`Coordinator::list_tool_calls`], as an operator gives them
/// (each checked there, and named in the error when wrong).
#[derive(Debug, Clone, Default)]
pub struct ToolCallFilter {
    /// Tenant (required).
    pub tenant: String,
    /// Only calls of this tool (a refused call: the name the model wrote).
    pub tool: Option<String>,
    /// Only calls of this run (a UUID).
    pub run_id: Option<String>,
    /// `scheduled` or `refused`; `None`: both.
    pub decision: Option<String>,
    /// Calls per page, 1 to [`MAX_TOOL_CALLS_LIMIT`]; `None`:
    /// [`DEFAULT_TOOL_CALLS_LIMIT`].
    pub limit: Option<u32>,
    /// `next_page_token` of the previous page; `None` for the first.
    pub page_token: Option<String>,
}

impl Coordinator {
    /// A page of the tool calls a tenant's runs proposed, newest first, and
    /// the token of the next page (empty on the last). The token is
    /// `<proposed_at RFC 3339>|<run_id>|<seq>` of the page's last call.
    ///
    /// Errors: [`CoordinatorError::InvalidArgument`] naming the filter that
    /// is wrong; [`CoordinatorError::Store`].
    pub async fn list_tool_calls(
        &self,
        filter: &ToolCallFilter,
    ) -> Result<(Vec<ToolCallRecord>, String), CoordinatorError> {
        require("tenant", &filter.tenant)?;
        let tool = filter.tool.as_deref().filter(|t| !t.is_empty());
        if let Some(tool) = tool {
            check_text("tool", tool, MAX_ID_BYTES)?;
        }
        let run_id = match filter.run_id.as_deref() {
            None | Some("") => None,
            Some(id) => Some(parse_uuid("run_id", id)?),
        };
        let decision = match filter.decision.as_deref() {
            None | Some("") => None,
            Some("scheduled") => Some(ToolCallDecision::Scheduled),
            Some("refused") => Some(ToolCallDecision::Refused),
            Some(other) => {
                return Err(CoordinatorError::InvalidArgument(format!(
                    "`decision` {} is not `scheduled` or `refused`",
                    shown(other)
                )));
            }
        };
        let limit = match filter.limit {
            None => DEFAULT_TOOL_CALLS_LIMIT,
            Some(n @ 1..=MAX_TOOL_CALLS_LIMIT) => n,
            Some(n) => {
                return Err(CoordinatorError::InvalidArgument(format!(
                    "`limit` {n} is not from 1 to {MAX_TOOL_CALLS_LIMIT}"
                )));
            }
        };
        let after = parse_position(filter.page_token.as_deref().unwrap_or(""))?;
        let mut records = self
            .store()
            .list_tool_calls(&ToolCallQuery {
                tenant: &filter.tenant,
                tool,
                run_id,
                decision,
                after,
                limit: i64::from(limit) + 1,
            })
            .await?;
        let next = if records.len() > limit as usize {
            records.truncate(limit as usize);
            records
                .last()
                .map(|r| format!("{}|{}", make_page_token(&r.proposed_at, &r.run_id), r.seq))
                .unwrap_or_default()
        } else {
            String::new()
        };
        Ok((records, next))
    }
}

/// The keyset position a page token names: [`parse_page_token`]'s
/// `<time>|<id>` and the proposal's seq.
fn parse_position(
    token: &str,
) -> Result<Option<(chrono::DateTime<chrono::Utc>, uuid::Uuid, i64)>, CoordinatorError> {
    if token.is_empty() {
        return Ok(None);
    }
    let bad = || {
        CoordinatorError::InvalidArgument(format!(
            "`page_token` {} is not a token from a previous page",
            shown(token)
        ))
    };
    let (position, seq) = token.rsplit_once('|').ok_or_else(bad)?;
    let seq = seq.parse::<i64>().map_err(|_| bad())?;
    match parse_page_token(position) {
        Ok(Some((ts, id))) => Ok(Some((ts, id, seq))),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_tokens_name_time_run_and_seq() {
        let ts = chrono::DateTime::parse_from_rfc3339("2026-12-01T10:00:00.123456Z")
            .expect("time")
            .with_timezone(&chrono::Utc);
        let id = uuid::Uuid::now_v7();
        let token = format!("{}|42", make_page_token(&ts, &id));
        assert_eq!(parse_position(&token).expect("token"), Some((ts, id, 42)));
        assert_eq!(parse_position("").expect("empty"), None);
        let two_parts = make_page_token(&ts, &id);
        for bad in [
            "garbage".to_owned(),
            "x|y|1".to_owned(),
            two_parts.clone(),
            format!("{two_parts}|"),
            format!("{two_parts}|1.5"),
        ] {
            let bad = bad.as_str();
            let err = parse_position(bad).expect_err(bad).to_string();
            assert!(err.contains("`page_token`"), "{bad}: {err}");
        }
    }
}
