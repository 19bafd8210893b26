//! What waits on people: approval nodes (the subject, the prompt, editing
//! where the node allows it), tool calls waiting for a confirmation (their
//! exact arguments), and tools' questions for a person; decided or
//! answered with a reason. Found in the tenant's waiting runs' folded
//! states, so nothing is kept beside the runs.

use askama::Template;
use axum::Extension;
use axum::extract::State;
use axum::response::Response;
use serde::Deserialize;
use serde_json::Value;

use super::ConsoleState;
use super::error::ConsoleError;
use super::page::{self, ConsoleForm, ConsoleQuery, Layout, pretty, redirect, run_url, seg, when};
use super::session::Viewer;
use crate::admin::AdminPath;
use crate::auth::{Principal, Role};
use crate::coordinator::ApprovalDecision;
use crate::machine::{RunState, StepKind};
use crate::store::{RunRow, RunSearch};

/// Most waiting runs looked at.
const MAX_RUNS: i64 = 200;

/// The page's query.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ApprovalsQuery {
    notice: Option<String>,
}

/// One thing waiting on a person.
struct Waiting {
    /// `approval`, `confirmation` or `input`.
    kind: &'static str,
    run_id: String,
    run_url: String,
    workflow: String,
    /// The node (approval) or call id (confirmation, input).
    target: String,
    /// The request decided or answered (empty: a confirmation's only one).
    request_id: String,
    title: String,
    prompt: Option<String>,
    subject: String,
    grant: String,
    allow_edits: bool,
    immutable: Vec<String>,
    since: String,
    action: String,
    may_decide: bool,
}

/// The page.
#[derive(Template)]
#[template(path = "console/approvals.html")]
struct ApprovalsPage {
    layout: Layout,
    items: Vec<Waiting>,
}

/// Whether `p` holds `grant` as an approver (admins hold every grant).
fn holds(p: &Principal, grant: &str) -> bool {
    p.role == Role::Admin || p.grants.iter().any(|g| g == grant)
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => pretty(other),
    }
}

/// The approval node `run` waits in, if any, with its prompt and since when.
async fn approval(
    state: &ConsoleState,
    viewer: &Viewer,
    run: &RunRow,
    folded: &RunState,
) -> Result<Option<Waiting>, ConsoleError> {
    let Some(step) = &folded.step else {
        return Ok(None);
    };
    let StepKind::Approval {
        subject,
        approver_grant,
        allow_edits,
        request_id,
        ..
    } = &step.kind
    else {
        return Ok(None);
    };
    let after = folded.node_started_seq.saturating_sub(1) as i64;
    let events = state
        .coord
        .store()
        .list_events(run.run_id, after, 200)
        .await?;
    let asked = events.iter().rev().find(|e| e.kind == "approval_requested");
    let url = run_url(&viewer.tenant, &run.run_id.to_string());
    Ok(Some(Waiting {
        kind: "approval",
        run_id: run.run_id.to_string(),
        workflow: run.workflow.clone(),
        target: step.id.clone(),
        request_id: request_id.clone(),
        title: format!("Approval {}", step.id),
        prompt: asked
            .map(|e| &e.payload["prompt"])
            .filter(|p| !p.is_null())
            .map(text),
        subject: pretty(subject),
        grant: approver_grant.clone(),
        allow_edits: *allow_edits,
        immutable: Vec::new(),
        since: asked.map(|e| when(&e.recorded_at)).unwrap_or_default(),
        action: format!("{url}/approvals/{}/decide", seg(&step.id)),
        may_decide: holds(&viewer.principal, approver_grant),
        run_url: url,
    }))
}

/// The confirmations and questions of `run`'s open calls.
fn calls(viewer: &Viewer, run: &RunRow, folded: &RunState) -> Vec<Waiting> {
    let url = run_url(&viewer.tenant, &run.run_id.to_string());
    let mut out = Vec::new();
    for (call_id, call) in folded.tool_calls.iter() {
        let base = |kind, title: String, subject: String, grant: String, action: String| Waiting {
            kind,
            run_id: run.run_id.to_string(),
            run_url: url.clone(),
            workflow: run.workflow.clone(),
            target: call_id.clone(),
            request_id: String::new(),
            title,
            prompt: None,
            subject,
            may_decide: grant.is_empty() || holds(&viewer.principal, &grant),
            grant,
            allow_edits: true,
            immutable: Vec::new(),
            since: String::new(),
            action,
        };
        if let Some((grant, immutable)) = &call.awaiting_confirmation {
            let mut w = base(
                "confirmation",
                format!("Confirm {} (call {call_id})", call.tool),
                pretty(&call.arguments),
                grant.clone(),
                format!("{url}/approvals/{}/decide", seg(call_id)),
            );
            w.immutable = immutable.clone();
            out.push(w);
        }
        if let Some(input) = &call.awaiting_input {
            let mut w = base(
                "input",
                format!("{} asks (call {call_id}, {})", call.tool, input.via),
                pretty(&input.requests),
                String::new(),
                format!("{url}/calls/{}/input", seg(call_id)),
            );
            w.allow_edits = false;
            w.request_id = input.request_id.clone();
            out.push(w);
        }
    }
    out
}

/// `GET /console/t/{tenant}/approvals`.
pub(crate) async fn page(
    State(state): State<ConsoleState>,
    Extension(viewer): Extension<Viewer>,
    ConsoleQuery(q): ConsoleQuery<ApprovalsQuery>,
) -> Result<Response, ConsoleError> {
    let runs = state
        .coord
        .store()
        .search_runs(&RunSearch {
            tenant: &viewer.tenant,
            status: Some("waiting"),
            limit: MAX_RUNS,
            ..RunSearch::default()
        })
        .await?;
    let mut items = Vec::new();
    // Oldest first: the one waiting longest is first.
    for run in runs.iter().rev() {
        let folded = state.coord.store().run_state(run.run_id).await?;
        if let Some(w) = approval(&state, &viewer, run, &folded).await? {
            items.push(w);
        }
        items.extend(calls(&viewer, run, &folded));
    }
    page::html(&ApprovalsPage {
        layout: Layout::new(
            &viewer,
            "Waiting on people",
            "approvals",
            q.notice.as_deref(),
        ),
        items,
    })
}

/// The decision form of an approval or a confirmation.
#[derive(Debug, Deserialize)]
pub(crate) struct DecideForm {
    decision: String,
    reason: String,
    /// The request decided (empty: the node's only one).
    #[serde(default)]
    request_id: String,
    /// The subject as edited (or as shown, unedited).
    #[serde(default)]
    subject: Option<String>,
    /// The subject as shown, to tell an edit from none.
    #[serde(default)]
    original: Option<String>,
    /// The grant the page said deciding needs (empty: none). The decision
    /// acts with it, as `belay run approve --grant` does: a key must hold
    /// it (a request only narrows its key's grants), an admin's is taken as
    /// given, so an admin may decide what the page offers it.
    #[serde(default)]
    grant: String,
}

impl DecideForm {
    /// Whether it approves. Errors: 400 for anything but approve or decline.
    fn approves(&self) -> Result<bool, ConsoleError> {
        match self.decision.as_str() {
            "approve" => Ok(true),
            "decline" => Ok(false),
            other => Err(ConsoleError::bad_request(format!(
                "unknown decision {other:?}; approve or decline"
            ))),
        }
    }

    /// The grants the decision acts with: the form's grant, else the key's.
    /// Errors: 403 when the key does not hold the form's grant.
    fn grants(&self, p: &Principal) -> Result<Vec<String>, ConsoleError> {
        let grant = self.grant.trim();
        let requested: Vec<String> = if grant.is_empty() {
            Vec::new()
        } else {
            vec![grant.to_owned()]
        };
        Ok(p.narrow_grants(&requested)?)
    }

    /// The edited subject's JSON text, or empty when it was not changed.
    /// Errors: 400 when it is not JSON.
    fn edited(&self) -> Result<String, ConsoleError> {
        let Some(text) = self
            .subject
            .as_deref()
            .map(str::trim)
            .filter(|t| !t.is_empty())
        else {
            return Ok(String::new());
        };
        let edited: Value = serde_json::from_str(text).map_err(|e| {
            ConsoleError::bad_request(format!("the edited subject is not JSON: {e}"))
        })?;
        let original = self
            .original
            .as_deref()
            .and_then(|o| serde_json::from_str::<Value>(o).ok());
        Ok(if original.as_ref() == Some(&edited) {
            String::new()
        } else {
            edited.to_string()
        })
    }
}

/// `POST …/approvals/{node}/decide`.
pub(crate) async fn decide(
    State(state): State<ConsoleState>,
    Extension(viewer): Extension<Viewer>,
    AdminPath((_, run_id, node)): AdminPath<(String, String, String)>,
    ConsoleForm(f): ConsoleForm<DecideForm>,
) -> Result<Response, ConsoleError> {
    let approve = f.approves()?;
    let p = &viewer.principal;
    let decision = ApprovalDecision {
        node,
        request_id: f.request_id.trim().to_owned(),
        approve,
        edited_subject_json: f.edited()?,
        approver: p.actor("")?,
        approver_grants: f.grants(p)?,
        reason: page::reason(&f.reason)?,
    };
    state
        .coord
        .decide_approval(&viewer.tenant, &run_id, decision)
        .await?;
    let notice = if approve { "approved" } else { "declined" };
    Ok(redirect(&format!(
        "/console/t/{}/approvals?notice={notice}",
        seg(&viewer.tenant)
    )))
}

/// The answer form of a tool's question.
#[derive(Debug, Deserialize)]
pub(crate) struct AnswerForm {
    answer: String,
    /// The question answered (empty: the call's only one).
    #[serde(default)]
    request_id: String,
}

/// `POST …/calls/{call_id}/input`.
pub(crate) async fn answer(
    State(state): State<ConsoleState>,
    Extension(viewer): Extension<Viewer>,
    AdminPath((_, run_id, call_id)): AdminPath<(String, String, String)>,
    ConsoleForm(f): ConsoleForm<AnswerForm>,
) -> Result<Response, ConsoleError> {
    state
        .coord
        .provide_tool_input(
            &viewer.tenant,
            &run_id,
            &call_id,
            f.request_id.trim(),
            &f.answer,
            &viewer.principal.actor("")?,
        )
        .await?;
    Ok(redirect(&format!(
        "/console/t/{}/approvals?notice=answered",
        seg(&viewer.tenant)
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unchanged_subject_is_no_edit() {
        let f = |subject: &str| DecideForm {
            decision: "approve".into(),
            reason: "ok".into(),
            request_id: String::new(),
            subject: Some(subject.into()),
            original: Some("{\"plan\": \"pro\"}".into()),
            grant: String::new(),
        };
        assert_eq!(f("{\n  \"plan\": \"pro\"\n}").edited().expect("same"), "");
        assert_eq!(
            f("{\"plan\": \"enterprise\"}").edited().expect("edit"),
            r#"{"plan":"enterprise"}"#
        );
        assert!(f("{oops").edited().is_err());
        assert!(f("{}").approves().expect("approve"));
    }
}
