//! What this worker can run, sent with every `ClaimTasks` (worker pools,
//! issue 21): its MCP servers, model API, sandbox runtimes, HTTP base URL,
//! client-certificate profiles and pool. The engine hands it only tasks
//! whose requirements these cover (`belay_proto::pools` has the tags).

use belay_proto::v1::WorkerCapabilities;

use crate::config::{ModelProvider, WorkerConfig};
use crate::sandbox_tool::SandboxTools;

/// The capabilities of a worker with `config` whose sandbox found what
/// `sandbox` found. An MCP server counts once it is configured, reachable
/// or not (one that is down fails its calls `NOT_SENT` until it is back).
///
/// Errors: a `pool` that [`belay_proto::pools::check_pool_name`] refuses.
pub fn of(config: &WorkerConfig, sandbox: &SandboxTools) -> Result<WorkerCapabilities, String> {
    let pool = config.pool.clone().unwrap_or_default();
    if !pool.is_empty() {
        belay_proto::pools::check_pool_name(&pool).map_err(|e| format!("--pool: {e}"))?;
    }
    let provider = match config.model.provider {
        ModelProvider::OpenAi => "openai",
        ModelProvider::Anthropic => "anthropic",
    };
    Ok(WorkerCapabilities {
        mcp_servers: config.mcp.servers.keys().cloned().collect(),
        model_providers: vec![provider.to_owned()],
        sandbox_runtimes: sandbox
            .runtimes()
            .into_iter()
            .map(|r| r.as_str().to_owned())
            .collect(),
        http_base_url: config
            .http_base_url
            .as_deref()
            .is_some_and(|u| !u.trim().is_empty()),
        tls_profiles: config.tls_profiles.profiles.keys().cloned().collect(),
        pool,
    })
}
