//! Belay's engine: the coordinator that drives the run machine through the
//! store, and the services around it.
//!
//! The layers below are crates of their own, re-exported here under their
//! old paths (`belay_engine::machine::…` and so on):
//! - [`definitions`] (`belay-definitions`): parse and validate `.tools.abl`
//!   and YAML definitions (pure).
//! - [`machine`] (`belay-machine`): the pure run state machine (events in,
//!   decisions out), with [`gates`], the rules of a tool's shared rate limit
//!   and circuit breaker.
//! - [`store`] (`belay-store`): every SQL statement; PostgreSQL and SQLite.
//!
//! This crate:
//! - [`expr_sandbox`]: jq expressions evaluated in child processes with
//!   hard limits (memory, CPU time, a deadline).
//! - [`coordinator`]: drives the machine through the store; leases, sweeper.
//! - [`auth`]: identity and access: principals, API keys, roles, the
//!   policy of each gRPC method.
//! - [`api`]: the gRPC services (`belay.v1`), health and reflection, behind
//!   the authentication layer.
//! - [`admin`]: the admin HTTP endpoint (uncertain outcomes, run controls,
//!   the tool-call audit).
//! - [`console`]: the operator console, HTML pages on the admin listener
//!   (runs, a run's graph and timeline, uncertain outcomes, approvals,
//!   definitions), with the admin endpoint's keys and roles.
//! - [`audit`]: the audit of tool calls, derived from the runs' events.
//! - [`callbacks`]: the callback HTTP endpoint of `type: async_webhook` tools.
//! - [`notify`]: webhook delivery of operator notifications.
//! - [`mcp_pins`]: pinning of MCP tool definitions (reports, trust on first
//!   use, operator acceptance).
//! - [`metrics`]: the Prometheus metrics (`GET /metrics` of the admin
//!   endpoint): names, recording of committed decisions, database gauges.
//! - [`server`]: the one way an engine process is put together
//!   ([`server::EngineOptions`], [`server::Engine::serve`]) and the stop signal.
//! - [`tls`]: TLS of the listeners (rustls; certificate reload, optional
//!   client certificates), the listener every endpoint serves on, and the
//!   [`tls::PeerInfo`] each request carries.
//! - [`vault`]: AES-256-GCM encryption of the run secret vault
//!   (`RESULT_SECRETS` / `SECRET_ACCESS`).
//! - `mcp_server` (cargo feature `mcp-server`): chosen workflows served as
//!   MCP tools over Streamable HTTP, each call a durable run.

pub use belay_definitions as definitions;
pub use belay_machine as machine;
pub use belay_machine::gates;
pub use belay_store as store;

pub mod admin;
pub mod api;
pub mod audit;
pub mod auth;
pub mod callbacks;
pub mod console;
pub mod coordinator;
pub mod error_code;
pub mod expr_sandbox;
pub mod mcp_pins;
#[cfg(feature = "mcp-server")]
pub mod mcp_server;
pub mod metrics;
pub mod notify;
pub mod server;
pub mod telemetry;
pub mod tls;
pub mod vault;
