//! The definitions a run uses, resolved when it starts and pinned in its
//! `RunStarted` event, so the run never changes behaviour when newer versions
//! are registered and the fold needs no database.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use belay_definitions::model::{AgentDef, ToolDef, WorkflowDef};

/// A pinned definition: its registered version and content hash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pinned<T> {
    /// Registered version (1-based, per tenant and name).
    pub version: u32,
    /// sha256 of the canonical definition, hex.
    pub content_hash: String,
    /// The definition.
    pub def: T,
}

/// Everything a run needs: its workflow and every agent and tool reachable from it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunPlan {
    /// The workflow.
    pub workflow: Pinned<WorkflowDef>,
    /// Agents by name.
    pub agents: BTreeMap<String, Pinned<AgentDef>>,
    /// Tools by name.
    pub tools: BTreeMap<String, Pinned<ToolDef>>,
}

impl RunPlan {
    /// Whether a tool of the plan fills a parameter with the time
    /// (`source: runtime` `time`, `date`, `unix_ms`): a decision of such a
    /// run may read the transition's time ([`crate::RunState::now`]).
    pub fn reads_time(&self) -> bool {
        self.tools.values().any(|t| {
            t.def.injected.iter().any(|p| {
                matches!(p.source, belay_definitions::model::ParamSource::Runtime { field } if field.is_time())
            })
        })
    }
}
