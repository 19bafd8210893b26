//! Belay worker: claims tasks from the engine over gRPC (`belay.v1.WorkerService`),
//! performs them, and reports back. Workers hold no durable state.
//!
//! - [`model`]: `model_call` tasks against OpenAI Chat Completions (or a
//!   compatible server) or Anthropic Messages ([`ModelClient`], chosen by
//!   [`ModelProvider`]).
//! - [`http_tool`]: `tool_call` tasks with an HTTP binding ([`HttpToolClient`]).
//! - [`ssrf`]: which addresses tool requests may reach ([`NetworkPolicy`]):
//!   public ones, and the non-public ones the configuration allowlists.
//! - [`engine_client`]: the gRPC client, with backoff for reports
//!   ([`EngineClient`]).
//! - [`runner`]: the claim / heartbeat / perform / report loop ([`run`]).
//! - [`config`]: the settings, [`WorkerConfig`].
//! - [`placeholders`]: `{{config.NAME}}` values ([`placeholders::ConfigValues`])
//!   and their one resolver, for HTTP tools and MCP servers.
//! - [`oauth2`]: OAuth 2.0 client-credentials tokens for `auth:
//!   oauth2_client` HTTP tools and `oauth` MCP servers, cached per worker.
//! - [`oauth_discovery`]: where an MCP server's token endpoint is, found
//!   from its protected-resource metadata (RFC 9728) and its authorization
//!   server's metadata (RFC 8414), through the [`ssrf`] policy.
//! - [`mcp`]: the MCP client ([`mcp::McpClient`]): servers by logical name,
//!   tool discovery pinned by hash, calls with typed outcomes.
//! - [`mcp_tool`]: `tool_call` tasks with an MCP binding ([`mcp_tool::McpTools`]):
//!   servers connected at start, tools reported to the engine, calls
//!   dispatched with the definition hash and checked against the pin.
//! - [`sandbox_tool`]: `tool_call` tasks with a sandbox binding
//!   ([`sandbox_tool::SandboxTools`]): inline JavaScript or Python run by
//!   Node.js or CPython under bubblewrap, with no network, no host files,
//!   a cleared environment and memory and time limits.
//! - [`sampling`]: an MCP server's `sampling/createMessage` during a
//!   granted call, made with the worker's model client
//!   ([`sampling::ModelSampler`]).
//!
//! Every failure is reported with a [`belay_proto::v1::FailureClass`] saying
//! whether the effect may have happened: `NOT_SENT` (provably nothing was
//! sent), `MAY_HAVE_ACTED` (repeat safety decides), `REJECTED` (a definite
//! refusal, not retried). A tool's side effect starts only after the engine
//! accepted `DispatchToolCall`.

pub mod config;
pub mod engine_client;
pub mod health;
pub mod http_tool;
mod http_util;
pub mod mcp;
pub mod mcp_tool;
pub mod model;
pub mod oauth2;
pub mod oauth_discovery;
pub mod placeholders;
pub mod runner;
pub mod sampling;
pub mod sandbox_tool;
pub mod ssrf;
pub mod untraced;

pub use config::{ModelProvider, ModelProviderConfig, WorkerConfig};
pub use engine_client::{EngineClient, RetryPolicy};
pub use http_tool::{HttpToolClient, HttpToolError};
pub use model::{ModelClient, ModelError};
pub use runner::{run, run_with_engine};
pub use ssrf::NetworkPolicy;
