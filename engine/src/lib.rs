//! Belay's engine (coordinator).
//!
//! - [`definitions`]: parse and validate `.tools.abl` and YAML definitions (pure).
//! - [`machine`]: the pure run state machine (events in, decisions out).
//! - [`expr_sandbox`]: jq expressions evaluated in child processes with
//!   hard limits (memory, CPU time, a deadline).
//! - [`gates`]: the rules of a tool's shared rate limit and circuit breaker (pure).
//! - [`store`]: every SQL statement; PostgreSQL.
//! - [`coordinator`]: drives the machine through the store; leases, sweeper.
//! - [`api`]: the gRPC services (`belay.v1`), health and reflection.
//! - [`admin`]: the admin HTTP endpoint (uncertain outcomes, run controls,
//!   the tool-call audit).
//! - [`audit`]: the audit of tool calls, derived from the runs' events.
//! - [`callbacks`]: the callback HTTP endpoint of `type: async_webhook` tools.
//! - [`notify`]: webhook delivery of operator notifications.
//! - [`mcp_pins`]: pinning of MCP tool definitions (reports, trust on first
//!   use, operator acceptance).
//! - [`vault`]: AES-256-GCM encryption of the run secret vault
//!   (`RESULT_SECRETS` / `SECRET_ACCESS`).
//! - `mcp_server` (cargo feature `mcp-server`): chosen workflows served as
//!   MCP tools over Streamable HTTP, each call a durable run.

#[cfg(feature = "server")]
pub mod admin;
#[cfg(feature = "server")]
pub mod api;
#[cfg(feature = "server")]
pub mod audit;
#[cfg(feature = "server")]
pub mod callbacks;
#[cfg(feature = "server")]
pub mod coordinator;
pub mod definitions;
pub mod expr_sandbox;
pub mod gates;
pub mod machine;
#[cfg(feature = "server")]
pub mod mcp_pins;
#[cfg(feature = "mcp-server")]
pub mod mcp_server;
#[cfg(feature = "server")]
pub mod notify;
#[cfg(feature = "server")]
pub mod store;
pub mod vault;
