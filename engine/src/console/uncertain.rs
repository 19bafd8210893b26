//! The uncertain-outcome queue: a tenant's open records, oldest first,
//! each with the exact arguments sent, the idempotency key, every attempt
//! with its error, the reconcile probe's result and the tool's output
//! type; the three verdicts (succeeded with a result, validated against
//! that type by the coordinator; failed; retry with the same or a new
//! key) with a reason; and the audit of who resolved what.

use std::collections::BTreeMap;

use askama::Template;
use axum::Extension;
use axum::extract::State;
use axum::response::Response;
use serde::Deserialize;
use serde_json::Value;

use super::ConsoleState;
use super::error::ConsoleError;
use super::page::{self, ConsoleForm, ConsoleQuery, Layout, pretty, redirect, run_url, when};
use super::session::Viewer;
use super::signature::type_text;
use crate::admin::AdminPath;
use crate::coordinator::UncertainFilter;
use crate::machine::Resolution;
use crate::store::UncertainRow;

/// Most open records shown (the oldest), and most resolved ones in the audit.
const MAX_OPEN: u32 = 500;
const MAX_AUDIT: u32 = 50;

/// The page's query.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UncertainQuery {
    notice: Option<String>,
}

/// One attempt of a record.
struct AttemptLine {
    attempt: String,
    event: String,
    worker: String,
    error: String,
    at: String,
}

/// One open record.
struct Open {
    id: String,
    tool: String,
    version: i32,
    run_id: String,
    run_url: String,
    call_id: String,
    node: String,
    created: String,
    reason: String,
    arguments: String,
    key: String,
    worker: String,
    attempts: Vec<AttemptLine>,
    probe: Option<String>,
    output_type: String,
    repeat_safety: String,
}

/// One resolved record, for the audit.
struct Resolved {
    at: String,
    tool: String,
    run_id: String,
    run_url: String,
    verdict: String,
    by: String,
    via: String,
    reason: String,
}

/// The page.
#[derive(Template)]
#[template(path = "console/uncertain.html")]
struct UncertainPage {
    layout: Layout,
    open: Vec<Open>,
    resolved: Vec<Resolved>,
}

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn attempts(v: &Value) -> Vec<AttemptLine> {
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|e| AttemptLine {
                    attempt: s(&e["attempt"]),
                    event: s(&e["event"]).replace('_', " "),
                    worker: s(&e["worker_id"]),
                    error: [s(&e["class"]), s(&e["error"])].join(" ").trim().to_owned(),
                    at: s(&e["at"]),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The output types and repeat safety of the tenant's tools, by name and version.
async fn tool_facts(
    state: &ConsoleState,
    tenant: &str,
) -> Result<BTreeMap<(String, i32), (String, String)>, ConsoleError> {
    let rows = state
        .coord
        .store()
        .list_definitions(tenant, Some("tool"))
        .await?;
    Ok(rows
        .into_iter()
        .map(|d| {
            let facts = (
                type_text(&d.body["output_schema"]),
                s(&d.body["repeat_safety"]),
            );
            ((d.name, d.version), facts)
        })
        .collect())
}

fn open_line(
    tenant: &str,
    r: UncertainRow,
    facts: &BTreeMap<(String, i32), (String, String)>,
) -> Open {
    let (output_type, repeat_safety) = facts
        .get(&(r.tool.clone(), r.tool_version))
        .cloned()
        .unwrap_or_else(|| ("unknown".into(), String::new()));
    Open {
        id: r.uncertain_id.to_string(),
        run_url: run_url(tenant, &r.run_id.to_string()),
        run_id: r.run_id.to_string(),
        created: when(&r.created_at),
        arguments: pretty(&r.arguments),
        attempts: attempts(&r.attempts),
        probe: r.probe.as_ref().map(pretty),
        worker: r.worker_id.unwrap_or_default(),
        tool: r.tool,
        version: r.tool_version,
        call_id: r.call_id,
        node: r.node_id,
        reason: r.reason,
        key: r.idempotency_key,
        output_type,
        repeat_safety,
    }
}

fn resolved_line(tenant: &str, r: UncertainRow) -> Resolved {
    Resolved {
        at: r.resolved_at.as_ref().map(when).unwrap_or_default(),
        run_url: run_url(tenant, &r.run_id.to_string()),
        run_id: r.run_id.to_string(),
        tool: r.tool,
        verdict: r.resolution_kind.unwrap_or_default(),
        by: r.resolved_by.unwrap_or_default(),
        via: r.resolved_via.unwrap_or_default(),
        reason: r.resolution_reason.unwrap_or_default(),
    }
}

/// `GET /console/t/{tenant}/uncertain`.
pub(crate) async fn page(
    State(state): State<ConsoleState>,
    Extension(viewer): Extension<Viewer>,
    ConsoleQuery(q): ConsoleQuery<UncertainQuery>,
) -> Result<Response, ConsoleError> {
    let tenant = viewer.tenant.clone();
    let list = |status: &str, page_size| UncertainFilter {
        tenant: tenant.clone(),
        status: Some(status.to_owned()),
        page_size,
        ..UncertainFilter::default()
    };
    // Newest first from the coordinator; the queue is oldest first.
    let (mut open, _) = state.coord.list_uncertain(&list("open", MAX_OPEN)).await?;
    open.reverse();
    let (resolved, _) = state
        .coord
        .list_uncertain(&list("resolved", MAX_AUDIT))
        .await?;
    let facts = tool_facts(&state, &tenant).await?;
    page::html(&UncertainPage {
        layout: Layout::new(
            &viewer,
            "Uncertain outcomes",
            "uncertain",
            q.notice.as_deref(),
        ),
        open: open
            .into_iter()
            .map(|r| open_line(&tenant, r, &facts))
            .collect(),
        resolved: resolved
            .into_iter()
            .map(|r| resolved_line(&tenant, r))
            .collect(),
    })
}

/// The verdict form.
#[derive(Debug, Deserialize)]
pub(crate) struct ResolveForm {
    resolution: String,
    #[serde(default)]
    result: Option<String>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    new_key: Option<String>,
    reason: String,
}

impl ResolveForm {
    /// The resolution it asks for. Errors: 400 for an unknown verdict, a
    /// result that is not JSON, or a failure without an error.
    fn resolution(&self) -> Result<Resolution, ConsoleError> {
        match self.resolution.as_str() {
            "succeeded" => {
                let text = self.result.as_deref().unwrap_or("").trim();
                let result = serde_json::from_str(text).map_err(|e| {
                    ConsoleError::bad_request(format!("the result is not JSON: {e}"))
                })?;
                Ok(Resolution::Succeeded { result })
            }
            "failed" => {
                let error = self.error.as_deref().unwrap_or("").trim().to_owned();
                if error.is_empty() {
                    return Err(ConsoleError::bad_request(
                        "a failure needs the error the model or workflow will see",
                    ));
                }
                Ok(Resolution::Failed { error })
            }
            "retry" => Ok(Resolution::Retry {
                new_idempotency_key: self.new_key.is_some(),
            }),
            other => Err(ConsoleError::bad_request(format!(
                "unknown verdict {other:?}; one of succeeded, failed, retry"
            ))),
        }
    }
}

/// `POST /console/t/{tenant}/uncertain/{id}/resolve`.
pub(crate) async fn resolve(
    State(state): State<ConsoleState>,
    Extension(viewer): Extension<Viewer>,
    AdminPath((_, id)): AdminPath<(String, String)>,
    ConsoleForm(f): ConsoleForm<ResolveForm>,
) -> Result<Response, ConsoleError> {
    let resolution = f.resolution()?;
    let reason = page::reason(&f.reason)?;
    let by = viewer.principal.actor("")?;
    let row = state
        .coord
        .resolve_uncertain(&viewer.tenant, &id, resolution, &by, &reason)
        .await?;
    tracing::info!(uncertain_id = %row.uncertain_id, by, "uncertain outcome resolved from the console");
    Ok(redirect(&format!(
        "/console/t/{}/uncertain?notice=resolved",
        page::seg(&viewer.tenant)
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(
        resolution: &str,
        result: Option<&str>,
        error: Option<&str>,
        new_key: bool,
    ) -> ResolveForm {
        ResolveForm {
            resolution: resolution.into(),
            result: result.map(str::to_owned),
            error: error.map(str::to_owned),
            new_key: new_key.then(|| "on".to_owned()),
            reason: "r".into(),
        }
    }

    #[test]
    fn verdicts_become_resolutions() {
        assert!(matches!(
            form("succeeded", Some(r#"{"account_id": "a"}"#), None, false).resolution(),
            Ok(Resolution::Succeeded { .. })
        ));
        assert!(
            form("succeeded", Some("{nope"), None, false)
                .resolution()
                .is_err()
        );
        assert!(
            form("failed", None, Some("  "), false)
                .resolution()
                .is_err()
        );
        assert!(matches!(
            form("retry", None, None, true).resolution(),
            Ok(Resolution::Retry {
                new_idempotency_key: true
            })
        ));
        assert!(form("maybe", None, None, false).resolution().is_err());
    }
}
