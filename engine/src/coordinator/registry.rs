//! Registering definitions, and resolving a workflow into the run plan a
//! run pins when it starts (the newest versions of everything it reaches).

use std::collections::BTreeMap;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{Coordinator, CoordinatorError, MAX_JSON_BYTES, check_text, require, shown};
use crate::definitions::model::{AgentDef, NodeKind, ToolDef, WorkflowDef};
use crate::definitions::{self, RegisteredNames, SourceFile};
use crate::machine::{self, Pinned, RunPlan};
use crate::store::{DefinitionRow, StoreError};

impl Coordinator {
    /// Parse, validate and register a bundle; refused whole on any error.
    pub async fn register_bundle(
        &self,
        tenant: &str,
        files: Vec<SourceFile>,
    ) -> Result<Vec<(DefinitionRow, bool)>, CoordinatorError> {
        require("tenant", tenant)?;
        if files.is_empty() {
            return Err(CoordinatorError::InvalidArgument(
                "the bundle has no files".into(),
            ));
        }
        let total: usize = files.iter().map(|f| f.content.len()).sum();
        if total > MAX_JSON_BYTES {
            return Err(CoordinatorError::InvalidArgument(format!(
                "the bundle is {total} bytes, more than {MAX_JSON_BYTES}"
            )));
        }
        for f in &files {
            check_text("files[].path", &f.path, 1024)?;
            if f.content.contains('\0') {
                return Err(CoordinatorError::InvalidArgument(format!(
                    "file {} contains a NUL character",
                    shown(&f.path)
                )));
            }
        }
        let registered = RegisteredNames {
            tools: self
                .store
                .definition_names(tenant, "tool")
                .await?
                .into_iter()
                .collect(),
            agents: self
                .store
                .definition_names(tenant, "agent")
                .await?
                .into_iter()
                .collect(),
            workflows: self
                .store
                .definition_names(tenant, "workflow")
                .await?
                .into_iter()
                .collect(),
            config: self.config.definition_config.clone(),
        };
        let bundle = definitions::parse_bundle(&files, &registered)
            .map_err(CoordinatorError::Definitions)?;
        let mut defs = Vec::new();
        let mut push =
            |kind: &str, name: &str, file: &str, body: Result<Value, serde_json::Error>| {
                let body = body.map_err(|e| {
                    CoordinatorError::InvalidArgument(format!("{kind} `{name}`: {e}"))
                })?;
                // Where a definition was written (file, line) is not part of
                // what it is: moving it must not make a new version.
                let hash = hex::encode(Sha256::digest(
                    without_source_positions(&body).to_string().as_bytes(),
                ));
                defs.push((
                    kind.to_owned(),
                    name.to_owned(),
                    hash,
                    body,
                    file.to_owned(),
                ));
                Ok::<(), CoordinatorError>(())
            };
        for t in &bundle.tools {
            push("tool", &t.name, &t.source_file, serde_json::to_value(t))?;
        }
        for a in &bundle.agents {
            push("agent", &a.name, &a.source_file, serde_json::to_value(a))?;
        }
        for w in &bundle.workflows {
            push("workflow", &w.name, &w.source_file, serde_json::to_value(w))?;
        }
        Ok(self.store.register_definitions(tenant, &defs).await?)
    }

    /// Resolve the newest versions of a workflow and everything it reaches.
    pub(super) async fn resolve_plan(
        &self,
        tenant: &str,
        workflow: &str,
    ) -> Result<RunPlan, CoordinatorError> {
        let row = self
            .store
            .latest_definition(tenant, "workflow", workflow)
            .await?
            .ok_or_else(|| CoordinatorError::NotFound(format!("workflow `{workflow}`")))?;
        let wf: WorkflowDef = decode(&row)?;
        let mut agents = BTreeMap::new();
        let mut tools = BTreeMap::new();
        for node in &wf.nodes {
            match &node.kind {
                NodeKind::Agent { agent, .. } => {
                    if agents.contains_key(agent) {
                        continue;
                    }
                    let arow = self
                        .store
                        .latest_definition(tenant, "agent", agent)
                        .await?
                        .ok_or_else(|| {
                            CoordinatorError::FailedPrecondition(format!(
                                "agent `{agent}` of workflow `{workflow}` is not registered"
                            ))
                        })?;
                    let adef: AgentDef = decode(&arow)?;
                    for tool in &adef.tools {
                        self.pin_tool(tenant, tool, &format!("agent `{agent}`"), &mut tools)
                            .await?;
                    }
                    agents.insert(agent.clone(), pinned(&arow, adef));
                }
                NodeKind::Tool { tool, .. } => {
                    self.pin_tool(tenant, tool, &format!("node `{}`", node.id), &mut tools)
                        .await?;
                }
                _ => {}
            }
        }
        Ok(RunPlan {
            workflow: pinned(&row, wf),
            agents,
            tools,
        })
    }

    /// Pin the newest `tool` (and its reconcile probe) into `tools`.
    async fn pin_tool(
        &self,
        tenant: &str,
        tool: &str,
        used_by: &str,
        tools: &mut BTreeMap<String, Pinned<ToolDef>>,
    ) -> Result<(), CoordinatorError> {
        if tools.contains_key(tool) {
            return Ok(());
        }
        let trow = self
            .store
            .latest_definition(tenant, "tool", tool)
            .await?
            .ok_or_else(|| {
                CoordinatorError::FailedPrecondition(format!(
                    "tool `{tool}` of {used_by} is not registered"
                ))
            })?;
        let mut tdef: ToolDef = decode(&trow)?;
        self.repeat_safety_from_server(&mut tdef).await?;
        // The engine's default cache TTL, pinned so the run keeps it.
        if tdef.hints.cacheable == Some(true) && tdef.hints.cache_ttl_ms.is_none() {
            tdef.hints.cache_ttl_ms = Some(self.config.tool_cache_ttl_ms);
        }
        // A reconcile probe is pinned too (never offered to the model).
        if let Some(probe) = tdef.reconcile_with.clone()
            && !tools.contains_key(&probe)
            && let Some(prow) = self.store.latest_definition(tenant, "tool", &probe).await?
        {
            let pdef: ToolDef = decode(&prow)?;
            tools.insert(probe, pinned(&prow, pdef));
        }
        tools.insert(tool.to_owned(), pinned(&trow, tdef));
        Ok(())
    }

    /// A `type: mcp` tool declared without `repeat_safety:` gets, for the
    /// run being planned, what the newest report of its server's listing
    /// suggests (`idempotent` only for a trusted server's read-only or
    /// idempotent tool; see `ToolDef::repeat_safety_from_server`); without
    /// a report it stays `never`. Pinned into the plan, so the run keeps it.
    async fn repeat_safety_from_server(&self, tool: &mut ToolDef) -> Result<(), CoordinatorError> {
        let crate::definitions::model::ToolBindingDef::Mcp {
            server,
            server_tool,
            ..
        } = &tool.binding
        else {
            return Ok(());
        };
        if !tool.repeat_safety_from_server {
            return Ok(());
        }
        let reported = self
            .store
            .mcp_tool_definitions(Some(server), Some(server_tool))
            .await?;
        // Newest report first.
        if reported
            .first()
            .is_some_and(|r| r.suggested_repeat_safety == "idempotent")
        {
            tool.repeat_safety = crate::definitions::model::RepeatSafety::Idempotent;
        }
        Ok(())
    }

    /// The state a run starts from: empty, with the engine's clock when a
    /// tool of `plan` fills a parameter with the time (`source: runtime`
    /// `time`, `date`, `unix_ms`), since its first node may call it (the
    /// one round trip is spent only then), and whether every engine of the
    /// level of the event forms every engine of the fleet reads
    /// (`store::fleet_level::machine_level`).
    pub(super) async fn start_state(
        &self,
        plan: &RunPlan,
    ) -> Result<machine::RunState, CoordinatorError> {
        let now = if plan.reads_time() {
            Some(self.store.clock_now().await?)
        } else {
            None
        };
        Ok(machine::RunState {
            now,
            fleet_level: crate::store::fleet_level::machine_level(self.store.fleet_level()),
            ..machine::RunState::default()
        })
    }
}

fn decode<T: serde::de::DeserializeOwned>(row: &DefinitionRow) -> Result<T, CoordinatorError> {
    serde_json::from_value(row.body.clone()).map_err(|e| {
        CoordinatorError::Store(StoreError::Corrupt(format!(
            "{} `{}` v{} does not decode: {e}",
            row.kind, row.name, row.version
        )))
    })
}

fn pinned<T>(row: &DefinitionRow, def: T) -> Pinned<T> {
    Pinned {
        version: row.version as u32,
        content_hash: row.content_hash.clone(),
        def,
    }
}

/// `body` without the `source_file` / `source_line` keys, at any depth.
fn without_source_positions(body: &Value) -> Value {
    match body {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| k.as_str() != "source_file" && k.as_str() != "source_line")
                .map(|(k, v)| (k.clone(), without_source_positions(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_source_positions).collect()),
        other => other.clone(),
    }
}
