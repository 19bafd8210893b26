//! The customer-onboarding example of Belay: test doubles for the services the
//! example's agent talks to.
//!
//! Two HTTP servers stand in for real services so the example and the end-to-end
//! tests run without network access or credentials, and so every run is
//! deterministic:
//!
//! - [`model_server`]: a scripted, stateless OpenAI-compatible chat completions
//!   server. Which answer it gives depends only on the request (the number of
//!   assistant messages already in it), so a retried model call gets the same
//!   answer.
//! - [`crm_server`]: the CRM behind the example's tools (look up a customer,
//!   create an account, send reminder and welcome emails, check identity
//!   documents), with idempotency keys and injectable faults (hang or fail
//!   before or after the side effect) so tests can reproduce every row of the
//!   engine's repeat-safety table.
//!
//! Both run in-process ([`model_server::serve_model_server`],
//! [`crm_server::serve_crm_server`]) or as the `scripted-model` and `crm-server`
//! binaries, which tests spawn as separate processes.

mod conn;

pub mod crm_server;
pub mod model_server;
pub mod process;

pub use crm_server::{CrmState, serve_crm_server};
pub use model_server::{ModelServerState, Script, serve_model_server};

/// The scripts of the onboarding example (`examples/onboarding/script.yaml`),
/// embedded so the model server binary works from any directory.
pub const ONBOARDING_SCRIPT: &str = include_str!("../script.yaml");

/// Model name of the intake agent's script (the `onboarding` workflow):
/// look the customer up, create the account, answer with its id.
pub const INTAKE_MODEL: &str = "scripted-intake";

/// Model name of the one-agent onboarding script (the `onboarding_express`
/// workflow): look up, create the account, send the welcome email.
pub const ONBOARDING_MODEL: &str = "scripted-onboarding";

/// Model name of the script that first proposes three calls the engine must
/// refuse (unknown tool, invalid JSON, schema violation), then onboards.
pub const REFUSALS_MODEL: &str = "scripted-refusals";

/// Model names of the scripts of the MCP end-to-end tests
/// (`tests/tests/mcp.rs`, `tests/mcp-fixtures/`), in name order.
pub const MCP_TEST_MODELS: [&str; 6] = [
    "scripted-mcp-brief",
    "scripted-mcp-clock",
    "scripted-mcp-echo-http",
    "scripted-mcp-everything",
    "scripted-mcp-sampling",
    "scripted-mcp-slow",
];
