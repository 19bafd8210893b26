//! The run page: the header (status and why, deadlines, input, output,
//! totals, open uncertain outcomes), the workflow's graph with the current
//! node, the timeline grouped by node and call with every event's raw
//! JSON, and the controls: pause, resume, cancel, signal. The header,
//! graph and timeline refresh live (`?partial=1`).

use askama::Template;
use axum::Extension;
use axum::extract::State;
use axum::response::{Html, IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use uuid::Uuid;

use super::ConsoleState;
use super::error::ConsoleError;
use super::graph::{self, RunMarks};
use super::page::{self, ConsoleForm, ConsoleQuery, Layout, pretty, redirect, run_url, when};
use super::session::Viewer;
use super::timeline::{self, Section};
use crate::admin::AdminPath;
use crate::coordinator::UncertainFilter;
use crate::machine::event::TimerSpec;
use crate::machine::{RunState, StepKind};
use crate::store::{EventRow, RunRow};

/// Most events the page reads (the newest beyond are left out, and said so).
const MAX_EVENTS: usize = 5000;

/// The page's query.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunQuery {
    partial: Option<String>,
    notice: Option<String>,
}

/// The live part: header, graph, timeline.
#[derive(Template)]
#[template(path = "console/run_live.html")]
struct RunLive {
    run: RunRow,
    created: String,
    updated: String,
    deadlines: Vec<String>,
    input: String,
    output: Option<String>,
    totals: String,
    uncertain: Vec<String>,
    uncertain_url: String,
    graph: Option<String>,
    sections: Vec<Section>,
    truncated: bool,
}

/// The whole page.
#[derive(Template)]
#[template(path = "console/run.html")]
struct RunPage {
    layout: Layout,
    run_id: String,
    url: String,
    status: String,
    finished: bool,
    signals: Vec<String>,
    signal_id: String,
    live: String,
}

/// The run's events in seq order, at most [`MAX_EVENTS`] (and whether
/// there were more).
async fn events(
    state: &ConsoleState,
    tenant: &str,
    run_id: &str,
) -> Result<(Vec<EventRow>, bool), ConsoleError> {
    let mut all: Vec<EventRow> = Vec::new();
    loop {
        let after = all.last().map(|e| e.seq as u64).unwrap_or(0);
        let page = state.coord.list_events(tenant, run_id, after, 1000).await?;
        let got = page.len();
        all.extend(page);
        if got < 1000 {
            return Ok((all, false));
        }
        if all.len() >= MAX_EVENTS {
            return Ok((all, true));
        }
    }
}

/// When a timer set at `set_at` is due.
fn due(spec: &TimerSpec, set_at: Option<&DateTime<Utc>>) -> String {
    match (&spec.at, spec.after_ms, set_at) {
        (Some(at), _, _) => at.clone(),
        (None, Some(ms), Some(t)) => {
            when(&(*t + chrono::Duration::milliseconds(i64::try_from(ms).unwrap_or(i64::MAX / 2))))
        }
        _ => "unknown".into(),
    }
}

/// The deadlines the run is under: its wall time, and the timers of the
/// node it waits in.
fn deadlines(state: &RunState, events: &[EventRow]) -> Vec<String> {
    let latest = |kind: &str| {
        events
            .iter()
            .rev()
            .find(|e| e.kind == kind)
            .map(|e| &e.recorded_at)
    };
    let mut out = Vec::new();
    if let Some(d) = &state.deadline {
        out.push(format!(
            "run wall time ends {}",
            due(d, latest("run_started"))
        ));
    }
    if let Some(step) = &state.step {
        match &step.kind {
            StepKind::Wait { timers, .. } => {
                for t in timers {
                    out.push(format!(
                        "{} ({}) fires {}",
                        step.id,
                        t.timer_id,
                        due(t, latest("wait_started"))
                    ));
                }
            }
            StepKind::Approval { timer: Some(t), .. } => {
                out.push(format!(
                    "approval {} times out {}",
                    step.id,
                    due(t, latest("approval_requested"))
                ));
            }
            _ => {}
        }
    }
    out
}

/// The node the run is at.
fn current_node(state: &RunState) -> Option<String> {
    state
        .node
        .as_ref()
        .map(|n| n.id.clone())
        .or_else(|| state.step.as_ref().map(|s| s.id.clone()))
}

/// The live part of the page.
async fn live(
    state: &ConsoleState,
    tenant: &str,
    run: RunRow,
) -> Result<(RunLive, RunState), ConsoleError> {
    let run_id = run.run_id.to_string();
    let folded = state.coord.store().run_state(run.run_id).await?;
    let (events, truncated) = events(state, tenant, &run_id).await?;
    let (open, _) = state
        .coord
        .list_uncertain(&UncertainFilter {
            tenant: tenant.to_owned(),
            status: Some("open".into()),
            run_id: Some(run_id.clone()),
            page_size: 500,
            ..UncertainFilter::default()
        })
        .await?;
    let marks = RunMarks {
        visits: folded.visits.clone(),
        current: current_node(&folded),
    };
    let t = &folded.totals;
    let live = RunLive {
        created: when(&run.created_at),
        updated: when(&run.updated_at),
        deadlines: deadlines(&folded, &events),
        input: pretty(&run.input),
        output: run.output.as_ref().map(pretty),
        totals: format!(
            "{} model step(s), {} tool call(s), {} / {} tokens in / out, ${:.4}",
            t.model_steps, t.tool_calls, t.input_tokens, t.output_tokens, t.cost_usd
        ),
        uncertain: open.iter().map(|r| r.uncertain_id.to_string()).collect(),
        uncertain_url: format!("/console/t/{}/uncertain", page::seg(tenant)),
        graph: folded
            .plan
            .as_ref()
            .map(|p| graph::svg(&p.workflow.def, &marks, "g-run")),
        sections: timeline::build(&events),
        truncated,
        run,
    };
    Ok((live, folded))
}

/// `GET /console/t/{tenant}/runs/{run_id}`.
pub(crate) async fn page(
    State(state): State<ConsoleState>,
    Extension(viewer): Extension<Viewer>,
    AdminPath((_, run_id)): AdminPath<(String, String)>,
    ConsoleQuery(q): ConsoleQuery<RunQuery>,
) -> Result<Response, ConsoleError> {
    let run = state.coord.get_run(&viewer.tenant, &run_id).await?;
    let status = run.status.clone();
    let (live, folded) = live(&state, &viewer.tenant, run).await?;
    if q.partial.is_some() {
        return Ok(Html(live.render()?).into_response());
    }
    let signals = match folded.step.as_ref().map(|s| &s.kind) {
        Some(StepKind::Wait { signals, .. }) => signals.clone(),
        _ => Vec::new(),
    };
    page::html(&RunPage {
        layout: Layout::new(
            &viewer,
            format!("Run {run_id}"),
            "runs",
            q.notice.as_deref(),
        ),
        url: run_url(&viewer.tenant, &run_id),
        finished: matches!(status.as_str(), "completed" | "failed" | "cancelled"),
        status,
        run_id,
        signals,
        signal_id: Uuid::now_v7().to_string(),
        live: live.render()?,
    })
}

/// The pause, resume and cancel forms.
#[derive(Debug, Deserialize)]
pub(crate) struct ControlForm {
    reason: String,
}

/// `POST …/pause`.
pub(crate) async fn pause(
    State(state): State<ConsoleState>,
    Extension(viewer): Extension<Viewer>,
    AdminPath((_, run_id)): AdminPath<(String, String)>,
    ConsoleForm(f): ConsoleForm<ControlForm>,
) -> Result<Response, ConsoleError> {
    let by = viewer.principal.actor("")?;
    state
        .coord
        .pause_run(&viewer.tenant, &run_id, &by, &page::reason(&f.reason)?)
        .await?;
    Ok(redirect(&format!(
        "{}?notice=paused",
        run_url(&viewer.tenant, &run_id)
    )))
}

/// `POST …/resume`.
pub(crate) async fn resume(
    State(state): State<ConsoleState>,
    Extension(viewer): Extension<Viewer>,
    AdminPath((_, run_id)): AdminPath<(String, String)>,
    ConsoleForm(f): ConsoleForm<ControlForm>,
) -> Result<Response, ConsoleError> {
    let by = viewer.principal.actor("")?;
    state
        .coord
        .resume_run(&viewer.tenant, &run_id, &by, &page::reason(&f.reason)?)
        .await?;
    Ok(redirect(&format!(
        "{}?notice=resumed",
        run_url(&viewer.tenant, &run_id)
    )))
}

/// `POST …/cancel`: the reason names who cancelled, as the admin endpoint's.
pub(crate) async fn cancel(
    State(state): State<ConsoleState>,
    Extension(viewer): Extension<Viewer>,
    AdminPath((_, run_id)): AdminPath<(String, String)>,
    ConsoleForm(f): ConsoleForm<ControlForm>,
) -> Result<Response, ConsoleError> {
    let reason = format!(
        "{} (cancelled by {})",
        page::reason(&f.reason)?,
        viewer.principal.id
    );
    state
        .coord
        .cancel_run(&viewer.tenant, &run_id, &reason)
        .await?;
    tracing::info!(run_id, by = %viewer.principal.id, "run cancelled from the console");
    Ok(redirect(&format!(
        "{}?notice=cancelled",
        run_url(&viewer.tenant, &run_id)
    )))
}

/// The signal form.
#[derive(Debug, Deserialize)]
pub(crate) struct SignalForm {
    name: String,
    signal_id: String,
    #[serde(default)]
    payload: String,
}

impl SignalForm {
    /// The payload as JSON text (`{}` when left empty). Errors: 400 naming
    /// the form's field and where the text stops being JSON.
    fn payload(&self) -> Result<String, ConsoleError> {
        let text = self.payload.trim();
        if text.is_empty() {
            return Ok("{}".to_owned());
        }
        serde_json::from_str::<serde_json::Value>(text)
            .map(|_| text.to_owned())
            .map_err(|e| {
                ConsoleError::bad_request(format!(
                    "Payload (JSON): not JSON at line {}, column {} ({e}); write it as JSON, e.g. {{\"approved\": true}}",
                    e.line(),
                    e.column()
                ))
            })
    }
}

/// `POST …/signal`.
pub(crate) async fn signal(
    State(state): State<ConsoleState>,
    Extension(viewer): Extension<Viewer>,
    AdminPath((_, run_id)): AdminPath<(String, String)>,
    ConsoleForm(f): ConsoleForm<SignalForm>,
) -> Result<Response, ConsoleError> {
    let by = viewer.principal.actor("")?;
    let payload = f.payload()?;
    let (_, duplicate) = state
        .coord
        .signal_run(
            &viewer.tenant,
            &run_id,
            f.name.trim(),
            f.signal_id.trim(),
            &payload,
            &by,
        )
        .await?;
    let notice = if duplicate { "duplicate" } else { "signalled" };
    Ok(redirect(&format!(
        "{}?notice={notice}",
        run_url(&viewer.tenant, &run_id)
    )))
}
