//! The runs page: a tenant's runs, filtered by status, workflow, time
//! range and text (in the input, the idempotency key or the id), with
//! counts by status and keyset paging; the table and counts refresh live
//! (`?partial=1` answers with them alone).

use askama::Template;
use axum::Extension;
use axum::extract::State;
use axum::response::{Html, IntoResponse, Response};
use chrono::{DateTime, NaiveDateTime, Utc};
use serde::Deserialize;

use super::ConsoleState;
use super::error::ConsoleError;
use super::page::{self, ConsoleQuery, Layout, query_value, run_url, runs_url, when};
use super::session::Viewer;
use crate::coordinator::{make_page_token, parse_page_token};
use crate::store::{RunRow, RunSearch};

/// Runs per page unless the query says (`size`, at most [`MAX_PAGE_SIZE`]).
const PAGE_SIZE: i64 = 25;
/// Most runs a page may show.
const MAX_PAGE_SIZE: i64 = 200;
/// The longest search text (`q`), in characters: a search names a run, not
/// a document, and SQLite refuses a `LIKE` pattern over 50,000 bytes.
const MAX_SEARCH_CHARS: usize = 500;

/// The statuses a run can have, in the order the counts show them.
pub(crate) const STATUSES: [&str; 7] = [
    "pending",
    "running",
    "waiting",
    "paused",
    "completed",
    "failed",
    "cancelled",
];

/// The page's query: the filters, the page, and whether only the live part
/// is wanted.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunsQuery {
    status: Option<String>,
    workflow: Option<String>,
    /// Created at or after (`YYYY-MM-DDTHH:MM[:SS]`, UTC).
    from: Option<String>,
    /// Created before (same form).
    to: Option<String>,
    /// Text in the input, idempotency key or id.
    q: Option<String>,
    /// A page token (`<created_at>|<run_id>` of the last run of the previous page).
    page: Option<String>,
    /// Runs per page (1 to [`MAX_PAGE_SIZE`]; default [`PAGE_SIZE`]).
    size: Option<i64>,
    partial: Option<String>,
    notice: Option<String>,
}

impl RunsQuery {
    fn value(v: &Option<String>) -> &str {
        v.as_deref().map(str::trim).unwrap_or("")
    }

    /// The query string of these filters with `status` replaced (no page).
    fn with_status(&self, status: &str) -> String {
        let mut parts = Vec::new();
        let size = self.size.map(|n| n.to_string()).unwrap_or_default();
        for (name, value) in [
            ("status", status),
            ("workflow", Self::value(&self.workflow)),
            ("from", Self::value(&self.from)),
            ("to", Self::value(&self.to)),
            ("q", Self::value(&self.q)),
            ("size", size.as_str()),
        ] {
            if !value.is_empty() {
                parts.push(format!("{name}={}", query_value(value)));
            }
        }
        parts.join("&")
    }
}

/// A time filter: `YYYY-MM-DDTHH:MM` or with seconds, taken as UTC.
fn parse_time(name: &str, text: &str) -> Result<Option<DateTime<Utc>>, ConsoleError> {
    if text.is_empty() {
        return Ok(None);
    }
    ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S"]
        .iter()
        .find_map(|f| NaiveDateTime::parse_from_str(text, f).ok())
        .map(|t| Some(t.and_utc()))
        .ok_or_else(|| {
            ConsoleError::bad_request(format!(
                "`{name}` {text:?} is not a time like 2026-12-02T14:30 (UTC)"
            ))
        })
}

/// One status and its count, as a filter link.
struct Count {
    status: &'static str,
    n: i64,
    url: String,
    current: bool,
}

/// One run of the table.
struct RunLine {
    id: String,
    url: String,
    workflow: String,
    version: i32,
    status: String,
    reason: String,
    created: String,
    updated: String,
}

impl RunLine {
    fn of(tenant: &str, r: &RunRow) -> RunLine {
        RunLine {
            id: r.run_id.to_string(),
            url: run_url(tenant, &r.run_id.to_string()),
            workflow: r.workflow.clone(),
            version: r.workflow_version,
            status: r.status.clone(),
            reason: page::cut(&r.status_reason, 140),
            created: when(&r.created_at),
            updated: when(&r.updated_at),
        }
    }
}

/// The live part: counts, table, pager.
#[derive(Template)]
#[template(path = "console/runs_live.html")]
struct RunsLive {
    counts: Vec<Count>,
    all_url: String,
    total: i64,
    filtered: bool,
    rows: Vec<RunLine>,
    next_url: Option<String>,
    first_url: Option<String>,
}

/// The whole page.
#[derive(Template)]
#[template(path = "console/runs.html")]
struct RunsPage {
    layout: Layout,
    status: String,
    workflow: String,
    from: String,
    to: String,
    q: String,
    statuses: [&'static str; 7],
    workflows: Vec<String>,
    live: String,
}

/// The page size a query asks for. Errors: 400 outside 1 to [`MAX_PAGE_SIZE`].
fn page_size(q: &RunsQuery) -> Result<i64, ConsoleError> {
    match q.size {
        None => Ok(PAGE_SIZE),
        Some(n) if (1..=MAX_PAGE_SIZE).contains(&n) => Ok(n),
        Some(n) => Err(ConsoleError::bad_request(format!(
            "`size` {n} is not between 1 and {MAX_PAGE_SIZE}"
        ))),
    }
}

/// The search a query asks for (its limit one more than a page).
fn search<'a>(tenant: &'a str, q: &'a RunsQuery) -> Result<RunSearch<'a>, ConsoleError> {
    let status = Some(RunsQuery::value(&q.status)).filter(|s| !s.is_empty());
    if let Some(s) = status
        && !STATUSES.contains(&s)
    {
        return Err(ConsoleError::bad_request(format!(
            "unknown status `{s}`; one of {}",
            STATUSES.join(", ")
        )));
    }
    let text = RunsQuery::value(&q.q);
    let chars = text.chars().count();
    if chars > MAX_SEARCH_CHARS {
        return Err(ConsoleError::bad_request(format!(
            "the search text `q` is {chars} characters long; search with at most {MAX_SEARCH_CHARS}"
        )));
    }
    Ok(RunSearch {
        tenant,
        status,
        workflow: Some(RunsQuery::value(&q.workflow)).filter(|s| !s.is_empty()),
        created_from: parse_time("from", RunsQuery::value(&q.from))?,
        created_before: parse_time("to", RunsQuery::value(&q.to))?,
        text: Some(text).filter(|s| !s.is_empty()),
        after: parse_page_token(RunsQuery::value(&q.page)).map_err(|_| {
            ConsoleError::bad_request(
                "this page link is not valid (its `page` is not one this console made): go back to the first page",
            )
        })?,
        limit: page_size(q)? + 1,
    })
}

/// The live part of the page for `q`.
async fn live(state: &ConsoleState, tenant: &str, q: &RunsQuery) -> Result<RunsLive, ConsoleError> {
    let search = search(tenant, q)?;
    let store = state.coord.store();
    let mut rows = store.search_runs(&search).await?;
    let counted = store.count_runs_by_status(&search).await?;
    let base = runs_url(tenant);
    let size = page_size(q)?;
    let next_url = if rows.len() as i64 > size {
        rows.truncate(size as usize);
        rows.last().map(|r| {
            let token = make_page_token(&r.created_at, &r.run_id);
            let status = RunsQuery::value(&q.status);
            format!(
                "{base}?{}&page={}",
                q.with_status(status),
                query_value(&token)
            )
        })
    } else {
        None
    };
    let current = RunsQuery::value(&q.status);
    let counts = STATUSES
        .iter()
        .map(|&s| Count {
            status: s,
            n: counted
                .iter()
                .find(|(c, _)| c.as_str() == s)
                .map(|(_, n)| *n)
                .unwrap_or(0),
            url: format!("{base}?{}", q.with_status(s)),
            current: current == s,
        })
        .collect();
    Ok(RunsLive {
        counts,
        all_url: format!("{base}?{}", q.with_status("")),
        total: counted.iter().map(|(_, n)| n).sum(),
        filtered: !q.with_status(current).is_empty(),
        rows: rows.iter().map(|r| RunLine::of(tenant, r)).collect(),
        next_url,
        first_url: search
            .after
            .map(|_| format!("{base}?{}", q.with_status(current))),
    })
}

/// `GET /console/t/{tenant}/runs`.
pub(crate) async fn page(
    State(state): State<ConsoleState>,
    Extension(viewer): Extension<Viewer>,
    ConsoleQuery(q): ConsoleQuery<RunsQuery>,
) -> Result<Response, ConsoleError> {
    let live = live(&state, &viewer.tenant, &q).await?;
    if q.partial.is_some() {
        return Ok(Html(live.render()?).into_response());
    }
    let workflows = state
        .coord
        .store()
        .definition_names(&viewer.tenant, "workflow")
        .await?;
    page::html(&RunsPage {
        layout: Layout::new(&viewer, "Runs", "runs", q.notice.as_deref()),
        status: RunsQuery::value(&q.status).to_owned(),
        workflow: RunsQuery::value(&q.workflow).to_owned(),
        from: RunsQuery::value(&q.from).to_owned(),
        to: RunsQuery::value(&q.to).to_owned(),
        q: RunsQuery::value(&q.q).to_owned(),
        statuses: STATUSES,
        workflows,
        live: live.render()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_parse_and_keep_each_other() {
        assert!(parse_time("from", "").expect("empty").is_none());
        assert_eq!(
            parse_time("from", "2026-12-02T14:30")
                .expect("time")
                .map(|t| t.to_rfc3339()),
            Some("2026-12-02T14:30:00+00:00".to_owned())
        );
        assert!(parse_time("to", "yesterday").is_err());
        let q = RunsQuery {
            workflow: Some("onboarding".into()),
            q: Some("ada@x".into()),
            ..RunsQuery::default()
        };
        assert_eq!(
            q.with_status("paused"),
            "status=paused&workflow=onboarding&q=ada%40x"
        );
        let bad = RunsQuery {
            status: Some("sleeping".into()),
            ..RunsQuery::default()
        };
        assert!(search("t", &bad).is_err());
    }
}
