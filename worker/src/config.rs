//! Worker configuration: where the engine is, how many tasks to run at once,
//! and how to reach model providers, HTTP tools and MCP servers.
//!
//! Everything here comes from flags or environment variables (see `main.rs`);
//! a worker holds no other state, durable or not.

use std::path::PathBuf;

use belay_proto::connect::ConnectOptions;

use crate::mcp::McpConfig;
use crate::placeholders::ConfigValues;
use crate::ssrf::NetworkPolicy;

/// The worker's log filter when `RUST_LOG` is not set (`tracing-subscriber`
/// `EnvFilter` directives): `info`, but `rmcp::service` at `error`, since
/// rmcp logs every error answer to a server's request at `warn` (a server
/// looping on `sampling/createMessage` would flood the log); the MCP
/// client logs the first refusal of a call at `warn` itself, the rest at
/// `debug`, and their number when the call ends.
pub const DEFAULT_LOG_FILTER: &str = "info,rmcp::service=error";

/// Default engine gRPC URL.
pub const DEFAULT_ENGINE_URL: &str = "http://127.0.0.1:50051";
/// Default OpenAI-compatible base URL (the part before `/chat/completions`).
pub const DEFAULT_MODEL_BASE_URL: &str = "https://api.openai.com/v1";
/// Default Anthropic base URL (the part before `/messages`).
pub const DEFAULT_ANTHROPIC_BASE_URL: &str = "https://api.anthropic.com/v1";
/// Default number of tasks a worker runs at once.
pub const DEFAULT_CONCURRENCY: usize = 8;
/// Default long-poll wait of `ClaimTasks`, in ms.
pub const DEFAULT_CLAIM_WAIT_MS: u32 = 10_000;
/// Default whole-request timeout of one model call, in ms.
pub const DEFAULT_MODEL_TIMEOUT_MS: u64 = 120_000;
/// Default time a shutting-down worker waits for in-flight tasks, in ms.
pub const DEFAULT_SHUTDOWN_GRACE_MS: u64 = 30_000;

/// Which API the worker's model calls speak (`--model-provider`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum ModelProvider {
    /// OpenAI Chat Completions (`POST {base_url}/chat/completions`), or any
    /// server compatible with it.
    #[default]
    #[value(name = "openai")]
    OpenAi,
    /// Anthropic Messages (`POST {base_url}/messages`,
    /// `anthropic-version: 2023-06-01`).
    #[value(name = "anthropic")]
    Anthropic,
}

impl ModelProvider {
    /// The provider's name, as `--model-provider` spells it (`openai`,
    /// `anthropic`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OpenAi => "openai",
            Self::Anthropic => "anthropic",
        }
    }

    /// The base URL used when none is configured:
    /// [`DEFAULT_MODEL_BASE_URL`] or [`DEFAULT_ANTHROPIC_BASE_URL`].
    pub fn default_base_url(self) -> &'static str {
        match self {
            Self::OpenAi => DEFAULT_MODEL_BASE_URL,
            Self::Anthropic => DEFAULT_ANTHROPIC_BASE_URL,
        }
    }

    /// The provider's conventional environment variable for the base URL,
    /// read when neither `--model-base-url` nor `BELAY_MODEL_BASE_URL` is set:
    /// `OPENAI_BASE_URL` for OpenAI; none for Anthropic, whose SDKs'
    /// `ANTHROPIC_BASE_URL` leaves out the `/v1` this worker's base URL has.
    pub fn base_url_env_vars(self) -> &'static [&'static str] {
        match self {
            Self::OpenAi => &["OPENAI_BASE_URL"],
            Self::Anthropic => &[],
        }
    }

    /// The provider's conventional environment variable for the API key,
    /// read when neither `--model-api-key` nor `BELAY_MODEL_API_KEY` is set:
    /// `OPENAI_API_KEY` or `ANTHROPIC_API_KEY`.
    pub fn api_key_env_vars(self) -> &'static [&'static str] {
        match self {
            Self::OpenAi => &["OPENAI_API_KEY"],
            Self::Anthropic => &["ANTHROPIC_API_KEY"],
        }
    }
}

/// How to reach the model provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelProviderConfig {
    /// Which API to speak. Default [`ModelProvider::OpenAi`].
    pub provider: ModelProvider,
    /// Base URL, e.g. `https://api.openai.com/v1`; requests go to
    /// `{base_url}/chat/completions` (OpenAI) or `{base_url}/messages`
    /// (Anthropic).
    pub base_url: String,
    /// Sent as `Authorization: Bearer <key>` (OpenAI) or `x-api-key: <key>`
    /// (Anthropic) when set. Never logged.
    pub api_key: Option<String>,
    /// Whole-request timeout of one model call (connect, send, wait, read the
    /// body), in ms. Default [`DEFAULT_MODEL_TIMEOUT_MS`].
    pub timeout_ms: u64,
}

impl Default for ModelProviderConfig {
    fn default() -> Self {
        Self {
            provider: ModelProvider::OpenAi,
            base_url: DEFAULT_MODEL_BASE_URL.to_owned(),
            api_key: None,
            timeout_ms: DEFAULT_MODEL_TIMEOUT_MS,
        }
    }
}

/// How the worker proves who it is to the engine and which engine
/// certificates it trusts. `Debug` never shows the API key.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct EngineAuth {
    /// The worker's API key, sent as `authorization: Bearer <key>` with
    /// every call (`--api-key`, `BELAY_API_KEY`); `None`: no header.
    pub api_key: Option<String>,
    /// CA certificates (PEM) the engine's certificate must chain to
    /// (`--ca-file`, `BELAY_CA_FILE`); `None`: the system's trust store.
    /// Only with an `https://` engine URL.
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for mTLS (`--client-cert`); needs
    /// `client_key`.
    pub client_cert: Option<PathBuf>,
    /// Its private key (PEM, `--client-key`).
    pub client_key: Option<PathBuf>,
}

impl std::fmt::Debug for EngineAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineAuth")
            .field("api_key", &self.api_key.as_ref().map(|_| "<hidden>"))
            .field("ca_file", &self.ca_file)
            .field("client_cert", &self.client_cert)
            .field("client_key", &self.client_key)
            .finish()
    }
}

/// Everything a worker process needs. Build with [`WorkerConfig::new`] and
/// override fields as needed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerConfig {
    /// Engine gRPC URL (`http://host:port`, or `https://` for TLS). The
    /// connection is lazy: the worker may start before the engine and
    /// survives engine restarts.
    pub engine_url: String,
    /// The API key and TLS trust of the engine connection. Default: no
    /// key, the system's trust store.
    pub engine_auth: EngineAuth,
    /// Stable id of this worker process, sent with every call and recorded by
    /// the engine on dispatch.
    pub worker_id: String,
    /// Maximum number of tasks in flight at once (at least 1). Default
    /// [`DEFAULT_CONCURRENCY`].
    pub concurrency: usize,
    /// Long-poll wait of one `ClaimTasks` call, in ms (the engine caps it at
    /// 30 000). Default [`DEFAULT_CLAIM_WAIT_MS`].
    pub claim_wait_ms: u32,
    /// The model provider.
    pub model: ModelProviderConfig,
    /// Base URL that HTTP tool endpoints given as paths (`/users/{id}`) are
    /// joined to. `None`: such tools fail with a `REJECTED` configuration error.
    pub http_base_url: Option<String>,
    /// Which non-public addresses (loopback, private, link-local, …) tool
    /// requests may reach (`--allow-private-network`, see [`crate::ssrf`]).
    /// Default: none, only public addresses.
    pub tool_network_policy: NetworkPolicy,
    /// On shutdown, how long to wait for in-flight tasks before dropping them,
    /// in ms. Dropped tasks are not reported; their leases expire. Default
    /// [`DEFAULT_SHUTDOWN_GRACE_MS`].
    pub shutdown_grace_ms: u64,
    /// Ask the engine, with each `CompleteTask`, to claim the next ready
    /// task in the same reply (`claim_next`). Default true; off, every
    /// task comes from the claim loop (as before issue 23; the benchmark
    /// compares the two).
    pub claim_with_reports: bool,
    /// MCP servers by logical name and the values of their `{{config.X}}`
    /// placeholders (`--mcp-config FILE`, JSON; see [`crate::mcp::config`]).
    /// Empty by default.
    pub mcp: McpConfig,
    /// Values of the `{{config.NAME}}` placeholders of HTTP tools (header
    /// values, `auth_config` credentials): `belay-worker` reads the
    /// `BELAY_TOOL_CONFIG_<NAME>` environment variables; the `config` map
    /// of [`WorkerConfig::mcp`] fills in names not given here. Secrets:
    /// `Debug` prints names only. Empty by default.
    pub tool_config: ConfigValues,
    /// Client-certificate profiles of HTTP tools (`tls_profile:`), read
    /// from `--tls-profiles`; the files are loaded when the worker starts.
    pub tls_profiles: crate::http_tool::TlsProfilesConfig,
    /// The worker's readiness, written by the claim loop; `belay-worker
    /// --health-listen` serves it ([`crate::health`]). A fresh one by
    /// default.
    pub health: crate::health::HealthState,
    /// Where the sandbox runtimes are and the default limits of `type:
    /// sandbox` tools (`--sandbox-*` flags). Added for issue 4.
    pub sandbox: crate::sandbox_tool::SandboxConfig,
    /// The worker pool this worker serves (`--pool`, `BELAY_WORKER_POOL`):
    /// it also claims the tasks of tools and agents that name it
    /// (`pool:`). `None`: only tasks that name no pool. Added for worker
    /// pools (issue 21).
    pub pool: Option<String>,
}

impl WorkerConfig {
    /// A configuration with defaults for everything but the engine URL and the
    /// worker id.
    pub fn new(engine_url: impl Into<String>, worker_id: impl Into<String>) -> Self {
        Self {
            engine_url: engine_url.into(),
            engine_auth: EngineAuth::default(),
            worker_id: worker_id.into(),
            concurrency: DEFAULT_CONCURRENCY,
            claim_wait_ms: DEFAULT_CLAIM_WAIT_MS,
            model: ModelProviderConfig::default(),
            http_base_url: None,
            tool_network_policy: NetworkPolicy::default(),
            shutdown_grace_ms: DEFAULT_SHUTDOWN_GRACE_MS,
            claim_with_reports: true,
            mcp: McpConfig::default(),
            tool_config: ConfigValues::default(),
            tls_profiles: Default::default(),
            health: crate::health::HealthState::default(),
            sandbox: Default::default(),
            pool: None,
        }
    }

    /// How to connect to the engine: [`WorkerConfig::engine_url`] with
    /// [`WorkerConfig::engine_auth`].
    pub fn connect_options(&self) -> ConnectOptions {
        ConnectOptions {
            url: self.engine_url.clone(),
            ca_file: self.engine_auth.ca_file.clone(),
            client_cert: self.engine_auth.client_cert.clone(),
            client_key: self.engine_auth.client_key.clone(),
            api_key: self.engine_auth.api_key.clone(),
        }
    }
}
