//! The definitions page: a tenant's tools, agents and workflows by version,
//! tools with their signature read back from their schemas, permission,
//! repeat safety and binding, workflows with their graph.

use askama::Template;
use axum::Extension;
use axum::extract::State;
use axum::response::Response;
use serde::Deserialize;
use serde_json::Value;

use super::ConsoleState;
use super::error::ConsoleError;
use super::graph::{self, RunMarks};
use super::page::{self, ConsoleQuery, Layout};
use super::session::Viewer;
use super::signature::signature;
use crate::definitions::model::WorkflowDef;
use crate::store::DefinitionRow;

/// The page's query.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DefinitionsQuery {
    notice: Option<String>,
}

/// What every kind shows: name, version, the start of the content hash.
struct Head {
    name: String,
    version: i32,
    hash: String,
}

/// A tool.
struct Tool {
    head: Head,
    signature: String,
    description: String,
    permission: String,
    repeat_safety: String,
    reconcile_with: String,
    binding: String,
}

/// An agent.
struct Agent {
    head: Head,
    model: String,
    tools: String,
    grants: String,
}

/// A workflow.
struct Workflow {
    head: Head,
    start: String,
    nodes: usize,
    graph: Option<String>,
}

/// The page.
#[derive(Template)]
#[template(path = "console/definitions.html")]
struct DefinitionsPage {
    layout: Layout,
    tools: Vec<Tool>,
    agents: Vec<Agent>,
    workflows: Vec<Workflow>,
}

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn list(v: &Value) -> String {
    v.as_array()
        .map(|a| a.iter().map(s).collect::<Vec<_>>().join(", "))
        .unwrap_or_default()
}

fn head(d: &DefinitionRow) -> Head {
    Head {
        name: d.name.clone(),
        version: d.version,
        hash: d.content_hash.chars().take(12).collect(),
    }
}

fn tool(d: &DefinitionRow) -> Tool {
    let b = &d.body;
    Tool {
        head: head(d),
        signature: signature(&d.name, &b["input_schema"], &b["output_schema"]),
        description: s(&b["description"]),
        permission: s(&b["permission"]),
        repeat_safety: s(&b["repeat_safety"]),
        reconcile_with: s(&b["reconcile_with"]),
        binding: s(&b["binding"]["type"]),
    }
}

fn agent(d: &DefinitionRow) -> Agent {
    let b = &d.body;
    Agent {
        head: head(d),
        model: s(&b["model"]),
        tools: list(&b["tools"]),
        grants: list(&b["grants"]),
    }
}

fn workflow(d: &DefinitionRow) -> Workflow {
    let def = serde_json::from_value::<WorkflowDef>(d.body.clone()).ok();
    Workflow {
        head: head(d),
        start: s(&d.body["start"]),
        nodes: d.body["nodes"].as_array().map(Vec::len).unwrap_or(0),
        graph: def.map(|wf| {
            graph::svg(
                &wf,
                &RunMarks::default(),
                &format!("g-{}-{}", d.name, d.version),
            )
        }),
    }
}

/// `GET /console/t/{tenant}/definitions`.
pub(crate) async fn page(
    State(state): State<ConsoleState>,
    Extension(viewer): Extension<Viewer>,
    ConsoleQuery(q): ConsoleQuery<DefinitionsQuery>,
) -> Result<Response, ConsoleError> {
    let rows = state
        .coord
        .store()
        .list_definitions(&viewer.tenant, None)
        .await?;
    let of = |kind: &'static str| rows.iter().filter(move |d| d.kind == kind);
    page::html(&DefinitionsPage {
        layout: Layout::new(&viewer, "Definitions", "definitions", q.notice.as_deref()),
        tools: of("tool").map(tool).collect(),
        agents: of("agent").map(agent).collect(),
        workflows: of("workflow").map(workflow).collect(),
    })
}
