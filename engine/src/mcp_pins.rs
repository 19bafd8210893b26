//! Pinning of MCP tool definitions: a `type: mcp` tool is called only while
//! its server lists exactly the definition the run's tenant accepted.
//!
//! - **Reports.** Workers list the tools of their MCP servers and report each
//!   listing (`WorkerService.ReportMcpTools`: at start, after every
//!   `tools/list_changed` or reconnection, and when a call was refused
//!   because a definition changed). [`Coordinator::report_mcp_tools`] records
//!   every (server, tool, definition hash) in `mcp_tool_definitions`. What a
//!   server says (descriptions, schemas, hints) is untrusted data: it is
//!   stored and shown to operators, and never changes a grant, an attempt or
//!   a budget; the model sees the tool as its `.tools.abl` declaration says.
//! - **Pins.** `mcp_tool_pins` holds, per (tenant, server, tool), the hash
//!   the tenant accepted. At the tenant's first dispatch of a tool the hash
//!   the worker lists then is pinned (trust on first use,
//!   [`Coordinator::pin_mcp_for_dispatch`]); the dispatch answers with the
//!   pin, and the worker's MCP client refuses the call before sending
//!   anything when the server now lists another definition
//!   (`CallRefusal::DefinitionChanged`, reported as a `REJECTED` failure
//!   naming both hashes: the model is told, nothing is retried).
//! - **Accepting.** An operator reviews the change
//!   ([`Coordinator::list_mcp_tools`], [`Coordinator::get_mcp_tool`]: admin
//!   `GET .../mcp-tools`) and accepts a reported hash
//!   ([`Coordinator::accept_mcp_tool`]: `POST .../accept`); later calls go
//!   through.
//!
//! Pins are per tenant because admin tokens are scoped to tenants: one
//! tenant's operator cannot accept a definition for another's runs.

use serde::Serialize;
use serde_json::Value;

use belay_proto::wire::{TASK_KIND_TOOL_CALL, ToolBinding, ToolCallSpec};

use crate::coordinator::{Coordinator, CoordinatorError, MAX_TEXT_BYTES, require, shown};
use crate::machine::normalize;
use crate::store::{McpToolDefinitionRow, McpToolListingIn, McpToolPinRow, StoreError};

/// Most tools one report may list.
pub const MAX_REPORTED_TOOLS: usize = 1000;
/// Largest definition JSON of one reported tool, bytes (256 KiB).
pub const MAX_DEFINITION_BYTES: usize = 256 * 1024;
/// Longest server or tool name, characters (MCP tool names are 1 to 128).
pub const MAX_MCP_NAME_CHARS: usize = 128;

/// One tool of a report, as the worker's MCP client mapped it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpToolReport {
    /// The tool's name on the server.
    pub name: String,
    /// `sha256:<64 hex digits>`.
    pub definition_hash: String,
    /// The definition as JSON text (untrusted).
    pub definition_json: String,
    /// Why Belay refuses the tool; empty for a callable one.
    pub refusal: String,
    /// `never` or `idempotent`.
    pub suggested_repeat_safety: String,
}

/// Where a tenant's MCP tool stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum McpToolStatus {
    /// The newest listing is the pinned definition: calls go through.
    Pinned,
    /// The newest listing differs from the pinned definition: calls are
    /// refused until an operator accepts it (or the server goes back).
    Changed,
    /// Listed, but the tenant has no pin yet: its first dispatch pins the
    /// definition then listed (trust on first use).
    Unpinned,
    /// Pinned, but no worker has reported a listing of it.
    Unlisted,
}

impl McpToolStatus {
    /// The spelling in the admin API (`pinned`, `changed`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            McpToolStatus::Pinned => "pinned",
            McpToolStatus::Changed => "changed",
            McpToolStatus::Unpinned => "unpinned",
            McpToolStatus::Unlisted => "unlisted",
        }
    }
}

/// One MCP tool as a tenant's operator sees it: the pin and the newest
/// listing.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct McpToolView {
    /// The server's logical name.
    pub server: String,
    /// The tool's name on the server.
    pub tool: String,
    /// See [`McpToolStatus`].
    pub status: McpToolStatus,
    /// The tenant's pin, if any.
    pub pinned: Option<McpToolPinRow>,
    /// The newest listing any worker reported, if any.
    pub listed: Option<McpToolDefinitionRow>,
}

/// [`McpToolView`] plus every definition ever reported for the tool.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct McpToolDetail {
    /// The tool.
    #[serde(flatten)]
    pub view: McpToolView,
    /// Every reported definition, newest listing first.
    pub history: Vec<McpToolDefinitionRow>,
}

/// Filter of [`Coordinator::list_mcp_tools`].
#[derive(Debug, Clone, Default)]
pub struct McpToolFilter {
    /// Only this status.
    pub status: Option<McpToolStatus>,
    /// Only tools of this server.
    pub server: Option<String>,
}

/// `None` when `value` is a usable server or tool name: 1 to
/// [`MAX_MCP_NAME_CHARS`] characters without whitespace, control characters
/// or `/` (the `.tools.abl` parser's rule).
fn check_name(field: &str, value: &str) -> Result<(), CoordinatorError> {
    let chars = value.chars().count();
    if chars == 0
        || chars > MAX_MCP_NAME_CHARS
        || value
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '/')
    {
        return Err(CoordinatorError::InvalidArgument(format!(
            "`{field}` {} must be 1 to {MAX_MCP_NAME_CHARS} characters without whitespace, control characters or `/`",
            shown(value)
        )));
    }
    Ok(())
}

/// A definition hash: `sha256:` and 64 lower-case hex digits.
pub fn check_definition_hash(field: &str, value: &str) -> Result<(), CoordinatorError> {
    let valid = value.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
    });
    if valid {
        Ok(())
    } else {
        Err(CoordinatorError::InvalidArgument(format!(
            "`{field}` {} is not a definition hash (`sha256:` and 64 lower-case hex digits)",
            shown(value)
        )))
    }
}

fn view(
    server: String,
    tool: String,
    pinned: Option<McpToolPinRow>,
    listed: Option<McpToolDefinitionRow>,
) -> McpToolView {
    let status = match (&pinned, &listed) {
        (None, _) => McpToolStatus::Unpinned,
        (Some(_), None) => McpToolStatus::Unlisted,
        (Some(p), Some(l)) if p.definition_hash == l.definition_hash => McpToolStatus::Pinned,
        (Some(_), Some(_)) => McpToolStatus::Changed,
    };
    McpToolView {
        server,
        tool,
        status,
        pinned,
        listed,
    }
}

fn store_err(e: StoreError) -> CoordinatorError {
    CoordinatorError::from(e)
}

impl Coordinator {
    /// Record a worker's report of `server`'s tools. Returns how many
    /// listings were new (a new tool, or a new definition of one).
    ///
    /// Errors: `InvalidArgument` naming the first bad field (a name, a hash,
    /// a definition that is not JSON or larger than
    /// [`MAX_DEFINITION_BYTES`], more than [`MAX_REPORTED_TOOLS`] tools, a
    /// tool listed twice); `Store`.
    pub async fn report_mcp_tools(
        &self,
        worker_id: &str,
        server: &str,
        protocol_version: &str,
        tools: Vec<McpToolReport>,
    ) -> Result<u64, CoordinatorError> {
        require("worker_id", worker_id)?;
        check_name("server", server)?;
        crate::coordinator::check_text("protocol_version", protocol_version, 64)?;
        if tools.len() > MAX_REPORTED_TOOLS {
            return Err(CoordinatorError::InvalidArgument(format!(
                "a report may list at most {MAX_REPORTED_TOOLS} tools, not {}",
                tools.len()
            )));
        }
        let mut seen = std::collections::BTreeSet::new();
        let mut listings = Vec::with_capacity(tools.len());
        for t in tools {
            let at = |message: String| {
                CoordinatorError::InvalidArgument(format!(
                    "server `{server}`, tool {}: {message}",
                    shown(&t.name)
                ))
            };
            check_name("name", &t.name).map_err(|e| at(e.to_string()))?;
            if !seen.insert(t.name.clone()) {
                return Err(at("listed twice in one report".into()));
            }
            check_definition_hash("definition_hash", &t.definition_hash)
                .map_err(|e| at(e.to_string()))?;
            if t.definition_json.len() > MAX_DEFINITION_BYTES {
                return Err(at(format!(
                    "the definition is {} bytes, more than {MAX_DEFINITION_BYTES}",
                    t.definition_json.len()
                )));
            }
            let definition: Value = serde_json::from_str(&t.definition_json)
                .map_err(|e| at(format!("the definition is not JSON: {e}")))?;
            let suggested = match t.suggested_repeat_safety.as_str() {
                "never" | "idempotent" => t.suggested_repeat_safety.clone(),
                "" => "never".to_owned(),
                other => {
                    return Err(at(format!(
                        "`suggested_repeat_safety` {} is not `never` or `idempotent`",
                        shown(other)
                    )));
                }
            };
            let refusal = normalize::strip_nul(&t.refusal);
            let refusal = normalize::truncate_str(&refusal, MAX_TEXT_BYTES).to_owned();
            listings.push(McpToolListingIn {
                tool: t.name,
                definition_hash: t.definition_hash,
                // Untrusted JSON: PostgreSQL `jsonb` refuses NUL characters.
                definition: normalize::strip_nul_value(definition),
                refusal: Some(refusal).filter(|r| !r.is_empty()),
                suggested_repeat_safety: suggested,
            });
        }
        let protocol_version = normalize::strip_nul(protocol_version);
        let new = self
            .store()
            .record_mcp_tools(server, &protocol_version, worker_id, &listings)
            .await
            .map_err(store_err)?;
        tracing::info!(
            worker_id,
            server,
            tools = listings.len(),
            new,
            "MCP tools reported"
        );
        Ok(new)
    }

    /// Before dispatching a `type: mcp` call: the definition hash pinned for
    /// the run's tenant, pinning `listed_hash` (what the worker's server
    /// lists now) when the tenant has none yet (trust on first use). Runs
    /// before the dispatch transition, so a failure here leaves the call
    /// undispatched (the worker does not act).
    ///
    /// Errors: `InvalidArgument` (a malformed id or hash, or a task that is
    /// not a `type: mcp` call); `NotFound` (no such task);
    /// `FailedPrecondition` (the task is not leased to this worker at this
    /// attempt); `Store`.
    pub async fn pin_mcp_for_dispatch(
        &self,
        worker_id: &str,
        task_id: &str,
        attempt: u32,
        listed_hash: &str,
    ) -> Result<String, CoordinatorError> {
        require("worker_id", worker_id)?;
        check_definition_hash("mcp_definition_hash", listed_hash)?;
        let task = uuid::Uuid::parse_str(task_id).map_err(|e| {
            CoordinatorError::InvalidArgument(format!(
                "`task_id` is not a UUID ({e}): {}",
                shown(task_id)
            ))
        })?;
        let row = self
            .store()
            .mcp_pin_task(task)
            .await
            .map_err(store_err)?
            .ok_or_else(|| CoordinatorError::NotFound(format!("task {task_id}")))?;
        if row.kind != TASK_KIND_TOOL_CALL {
            return Err(CoordinatorError::InvalidArgument(format!(
                "task {task_id} is not a tool call"
            )));
        }
        if row.status != "leased"
            || i64::from(row.attempt) != i64::from(attempt)
            || row.worker_id.as_deref() != Some(worker_id)
        {
            return Err(CoordinatorError::FailedPrecondition(format!(
                "task {task_id} attempt {attempt} is not leased to worker {}",
                shown(worker_id)
            )));
        }
        let spec: ToolCallSpec = serde_json::from_value(row.spec).map_err(|e| {
            CoordinatorError::Store(StoreError::Corrupt(format!(
                "the spec of task {task_id} does not decode: {e}"
            )))
        })?;
        let ToolBinding::Mcp(binding) = spec.binding else {
            return Err(CoordinatorError::InvalidArgument(format!(
                "task {task_id} is not a call of a `type: mcp` tool; send no `mcp_definition_hash`"
            )));
        };
        let pin = self
            .store()
            .pin_mcp_tool_first_use(
                &row.tenant,
                &binding.server,
                &binding.server_tool,
                listed_hash,
                &format!("first use (worker {worker_id})"),
            )
            .await
            .map_err(store_err)?;
        if pin.definition_hash != listed_hash {
            tracing::warn!(
                tenant = %row.tenant, server = %binding.server, tool = %binding.server_tool,
                pinned = %pin.definition_hash, listed = listed_hash,
                "MCP tool definition changed; calls are refused until an operator accepts it"
            );
        }
        Ok(pin.definition_hash)
    }

    /// A tenant's MCP tools: every tool a worker reported and every tool the
    /// tenant pinned, ordered by server and tool.
    ///
    /// Errors: `InvalidArgument` (tenant); `Store`.
    pub async fn list_mcp_tools(
        &self,
        tenant: &str,
        filter: &McpToolFilter,
    ) -> Result<Vec<McpToolView>, CoordinatorError> {
        require("tenant", tenant)?;
        let server = filter.server.as_deref();
        let definitions = self
            .store()
            .mcp_tool_definitions(server, None)
            .await
            .map_err(store_err)?;
        let pins = self
            .store()
            .mcp_tool_pins(tenant, server, None)
            .await
            .map_err(store_err)?;
        let mut tools: std::collections::BTreeMap<
            (String, String),
            (Option<McpToolPinRow>, Option<McpToolDefinitionRow>),
        > = std::collections::BTreeMap::new();
        // Newest listing first per (server, tool): keep the first seen.
        for d in definitions {
            let entry = tools.entry((d.server.clone(), d.tool.clone())).or_default();
            if entry.1.is_none() {
                entry.1 = Some(d);
            }
        }
        for p in pins {
            let key = (p.server.clone(), p.tool.clone());
            tools.entry(key).or_default().0 = Some(p);
        }
        Ok(tools
            .into_iter()
            .map(|((server, tool), (pin, listed))| view(server, tool, pin, listed))
            .filter(|v| filter.status.is_none_or(|s| s == v.status))
            .collect())
    }

    /// One MCP tool of a tenant, with every definition reported for it.
    ///
    /// Errors: `NotFound` when no worker reported it and the tenant has no
    /// pin for it; `InvalidArgument`; `Store`.
    pub async fn get_mcp_tool(
        &self,
        tenant: &str,
        server: &str,
        tool: &str,
    ) -> Result<McpToolDetail, CoordinatorError> {
        require("tenant", tenant)?;
        check_name("server", server)?;
        check_name("tool", tool)?;
        let history = self
            .store()
            .mcp_tool_definitions(Some(server), Some(tool))
            .await
            .map_err(store_err)?;
        let pin = self
            .store()
            .mcp_tool_pins(tenant, Some(server), Some(tool))
            .await
            .map_err(store_err)?
            .into_iter()
            .next();
        if pin.is_none() && history.is_empty() {
            return Err(CoordinatorError::NotFound(format!(
                "MCP tool `{tool}` of server `{server}`"
            )));
        }
        Ok(McpToolDetail {
            view: view(
                server.to_owned(),
                tool.to_owned(),
                pin,
                history.first().cloned(),
            ),
            history,
        })
    }

    /// Accept definition `definition_hash` of `tool` on `server` for the
    /// tenant's runs: later calls go through while the server lists it.
    /// The hash must be one a worker reported (so what is accepted is what
    /// the operator could review).
    ///
    /// Errors: `InvalidArgument` (names, hash, reason); `NotFound` (no
    /// worker reported that definition); `FailedPrecondition` (Belay refuses
    /// that definition's schema, so accepting it would not make it
    /// callable); `Store`.
    pub async fn accept_mcp_tool(
        &self,
        tenant: &str,
        server: &str,
        tool: &str,
        definition_hash: &str,
        by: &str,
        reason: &str,
    ) -> Result<McpToolView, CoordinatorError> {
        require("tenant", tenant)?;
        check_name("server", server)?;
        check_name("tool", tool)?;
        check_definition_hash("definition_hash", definition_hash)?;
        require("by", by)?;
        crate::coordinator::check_text("reason", reason, MAX_TEXT_BYTES)?;
        let history = self
            .store()
            .mcp_tool_definitions(Some(server), Some(tool))
            .await
            .map_err(store_err)?;
        let Some(listing) = history
            .iter()
            .find(|d| d.definition_hash == definition_hash)
        else {
            let known: Vec<&str> = history.iter().map(|d| d.definition_hash.as_str()).collect();
            return Err(CoordinatorError::NotFound(format!(
                "definition {definition_hash} of MCP tool `{tool}` of server `{server}` (no worker reported it; reported: {})",
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            )));
        };
        if let Some(refusal) = &listing.refusal {
            return Err(CoordinatorError::FailedPrecondition(format!(
                "definition {definition_hash} of MCP tool `{tool}` cannot be called: {refusal}"
            )));
        }
        // Accepting the hash already pinned changes nothing (the store's
        // upsert leaves the row alone and returns it): a repeated request
        // keeps the first acceptance's time, author and history.
        let pin = self
            .store()
            .accept_mcp_tool(tenant, server, tool, definition_hash, by, reason)
            .await
            .map_err(store_err)?;
        tracing::info!(
            tenant,
            server,
            tool,
            definition_hash,
            by,
            previous = pin.previous_hash.as_deref().unwrap_or(""),
            "MCP tool definition accepted"
        );
        Ok(view(
            server.to_owned(),
            tool.to_owned(),
            Some(pin),
            history.first().cloned(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn definition_hashes_are_checked() {
        let good = format!("sha256:{}", "ab".repeat(32));
        assert!(check_definition_hash("h", &good).is_ok());
        for bad in [
            "",
            "sha256:",
            "md5:00",
            &format!("sha256:{}", "AB".repeat(32)),
            &format!("sha256:{}", "a".repeat(63)),
        ] {
            assert!(check_definition_hash("h", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("tool", "get-sum").is_ok());
        assert!(check_name("tool", "a.b_c").is_ok());
        for bad in ["", "a b", "a/b", "a\u{0}", &"x".repeat(129)] {
            assert!(check_name("tool", bad).is_err(), "{bad:?}");
        }
    }
}
