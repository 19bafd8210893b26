//! MCP server configuration, by logical name (the `server:` of a `type: mcp`
//! tool in `.tools.abl`).
//!
//! The document, as JSON (`belay-worker --mcp-config FILE`):
//!
//! ```json
//! {
//!   "servers": {
//!     "everything": {"transport": "stdio", "command": "/path/mcp-server-everything",
//!                    "args": ["stdio"], "env": {"API_KEY": "{{config.EVERYTHING_KEY}}"}},
//!     "search": {"transport": "http", "url": "https://mcp.example.com/mcp",
//!                "headers": {"Authorization": "Bearer {{config.SEARCH_TOKEN}}"},
//!                "trusted": true},
//!     "crm": {"transport": "http", "url": "https://crm.example.com/mcp",
//!             "oauth": {"token_url": "https://auth.example.com/token",
//!                       "client_id": "{{config.CRM_ID}}", "client_secret": "{{config.CRM_SECRET}}",
//!                       "scopes": ["mcp:tools"]}},
//!     "erp": {"transport": "http", "url": "https://erp.example.com/mcp",
//!             "oauth": {"client_id": "{{config.ERP_ID}}", "client_secret": "{{config.ERP_SECRET}}"}}
//!   },
//!   "config": {"EVERYTHING_KEY": "…", "SEARCH_TOKEN": "…", "CRM_ID": "…", "CRM_SECRET": "…"}
//! }
//! ```
//!
//! `oauth` (HTTP servers): MCP's authorization for Streamable HTTP is OAuth
//! 2.1; a worker has no browser, so it uses the client-credentials grant
//! ([`crate::oauth2`]), with the server's canonical URI as the RFC 8707
//! `resource`. Without `token_url`, the token endpoint is discovered from
//! the server's 401 answer ([`crate::oauth_discovery`]: RFC 9728, RFC
//! 8414) through the worker's address policy, and kept for the worker's
//! life. The access token is cached until shortly before it expires,
//! fetched again when the server answers 401, and sent as `Authorization:
//! Bearer …`. It is never logged nor put in an event.
//!
//! `{{config.NAME}}` placeholders (in stdio `env` values, HTTP `headers` values
//! and per-call headers) are replaced by `config.NAME`; a missing name or any
//! other placeholder is a [`ConfigError`], detected before anything starts.
//! Config values are secrets: `Debug` never prints them.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::placeholders::{self, PlaceholderError};
use crate::ssrf::NetworkPolicy;

/// Default time to wait for a server connection (spawn + handshake, or a
/// restart in progress) before a call is reported as not sent, in ms.
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 30_000;
/// Default first delay before a dead stdio server is restarted, in ms.
pub const DEFAULT_RESTART_MIN_DELAY_MS: u64 = 100;
/// Default longest delay between restarts of a server that keeps dying, in ms.
pub const DEFAULT_RESTART_MAX_DELAY_MS: u64 = 30_000;
/// Environment variables a stdio server inherits from the worker (when set).
/// Everything else of the worker's environment (API keys included) is withheld;
/// list more names in [`StdioServerConfig::inherit_env`].
pub const INHERITED_ENV: &[&str] = &["PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR"];

/// All MCP servers a worker can reach, plus the values of `{{config.X}}`
/// placeholders.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpConfig {
    /// Servers by logical name.
    #[serde(default)]
    pub servers: BTreeMap<String, McpServerConfig>,
    /// Values of `{{config.NAME}}` placeholders. Secrets: never logged.
    #[serde(default)]
    pub config: BTreeMap<String, String>,
}

impl fmt::Debug for McpConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpConfig")
            .field("servers", &self.servers)
            .field("config", &self.config.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl McpConfig {
    /// Parses the JSON document described in the module docs.
    ///
    /// # Errors
    /// [`ConfigError::Parse`] with serde's message (line and column included).
    pub fn from_json(text: &str) -> Result<Self, ConfigError> {
        serde_json::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))
    }

    /// Checks every server and resolves every placeholder, so that a bad
    /// configuration is refused when the worker starts rather than at the
    /// first call.
    ///
    /// # Errors
    /// The first [`ConfigError`] found, servers in name order.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for name in self.servers.keys() {
            self.resolve(name)?;
        }
        Ok(())
    }

    /// The server `name` with its placeholders replaced.
    ///
    /// # Errors
    /// [`ConfigError::UnknownServer`], or what [`McpServerConfig::resolve`] finds.
    pub fn resolve(&self, name: &str) -> Result<ResolvedServer, ConfigError> {
        let server = self
            .servers
            .get(name)
            .ok_or_else(|| ConfigError::UnknownServer(name.to_owned()))?;
        server.resolve(name, &self.config)
    }
}

/// One MCP server: how to reach it, and whether its tools' hints are trusted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "transport", rename_all = "snake_case")]
pub enum McpServerConfig {
    /// A local process speaking MCP over stdin/stdout, started and supervised
    /// by the worker.
    Stdio(StdioServerConfig),
    /// A remote server speaking MCP over Streamable HTTP.
    Http(HttpServerConfig),
}

/// `"transport": "stdio"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StdioServerConfig {
    /// Executable: a path, or a name looked up in the inherited `PATH`.
    pub command: String,
    /// Arguments, passed as they are (no placeholders, no shell).
    #[serde(default)]
    pub args: Vec<String>,
    /// Extra environment variables; values may hold `{{config.X}}`.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Names of further worker environment variables to pass on, beyond
    /// [`INHERITED_ENV`].
    #[serde(default)]
    pub inherit_env: Vec<String>,
    /// Working directory; the worker's when absent.
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// Whether the server's `readOnlyHint` / `idempotentHint` may make its
    /// tools `idempotent` by default (see [`super::default_repeat_safety`]).
    /// Default `false`: hints from an untrusted server are ignored.
    #[serde(default)]
    pub trusted: bool,
    /// How long a call waits for a connection, in ms. Default
    /// [`DEFAULT_CONNECT_TIMEOUT_MS`].
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// First restart delay of a stdio server that died, in ms (doubling up to
    /// `restart_max_delay_ms`). Default [`DEFAULT_RESTART_MIN_DELAY_MS`].
    #[serde(default = "default_restart_min_delay_ms")]
    pub restart_min_delay_ms: u64,
    /// Longest restart delay, in ms. Default [`DEFAULT_RESTART_MAX_DELAY_MS`].
    #[serde(default = "default_restart_max_delay_ms")]
    pub restart_max_delay_ms: u64,
}

/// `"transport": "http"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpServerConfig {
    /// The MCP endpoint, e.g. `https://mcp.example.com/mcp`.
    pub url: String,
    /// Headers sent with every request; values may hold `{{config.X}}`.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Whether the server's `readOnlyHint` / `idempotentHint` may make its
    /// tools `idempotent` by default (see [`super::default_repeat_safety`]).
    /// Default `false`: hints from an untrusted server are ignored.
    #[serde(default)]
    pub trusted: bool,
    /// How long a call waits for a connection, in ms. Default
    /// [`DEFAULT_CONNECT_TIMEOUT_MS`].
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// First restart delay of a stdio server that died, in ms (doubling up to
    /// `restart_max_delay_ms`). Default [`DEFAULT_RESTART_MIN_DELAY_MS`].
    #[serde(default = "default_restart_min_delay_ms")]
    pub restart_min_delay_ms: u64,
    /// Longest restart delay, in ms. Default [`DEFAULT_RESTART_MAX_DELAY_MS`].
    #[serde(default = "default_restart_max_delay_ms")]
    pub restart_max_delay_ms: u64,
    /// OAuth 2.1 client credentials: every request carries a bearer token
    /// from the configured or discovered token endpoint (see the module
    /// docs). Excludes an `Authorization` header in `headers`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oauth: Option<OAuthClientConfig>,
}

/// `"oauth"` of an HTTP server: the client-credentials grant (RFC 6749
/// §4.4) at `token_url`, or at the token endpoint discovered from the
/// server when there is none. `Debug` leaves the secret out.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OAuthClientConfig {
    /// The authorization server's token endpoint, `http(s)://…`; `None`:
    /// discovered from the server's protected-resource metadata (RFC 9728)
    /// and its authorization server's metadata (RFC 8414).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_url: Option<String>,
    /// The client identifier; may hold `{{config.X}}`.
    pub client_id: String,
    /// The client secret; may hold `{{config.X}}` (a secret belongs in
    /// `config`, not in the server entry).
    pub client_secret: String,
    /// Scopes to ask for (sent space-separated as `scope`). None: with a
    /// configured `token_url`, no `scope` parameter; with discovery, the
    /// `scope` of the server's challenge, else the `scopes_supported` of
    /// its protected-resource metadata, else none.
    #[serde(default)]
    pub scopes: Vec<String>,
}

/// `oauth` of an HTTP server with its placeholders resolved. `Debug`
/// leaves the secret out.
#[derive(Clone, PartialEq, Eq)]
pub struct ResolvedOAuth {
    /// The configured token endpoint; `None`: discovered.
    pub token_url: Option<reqwest::Url>,
    /// The client identifier.
    pub client_id: String,
    /// The client secret.
    pub client_secret: String,
    /// Configured scopes, space-separated; empty: none configured.
    pub scopes: String,
}

impl fmt::Debug for ResolvedOAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResolvedOAuth")
            .field(
                "token_url",
                &self.token_url.as_ref().map(reqwest::Url::as_str),
            )
            .field("client_id", &self.client_id)
            .field("scopes", &self.scopes)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for OAuthClientConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OAuthClientConfig")
            .field("token_url", &self.token_url)
            .field("client_id", &self.client_id)
            .field("scopes", &self.scopes)
            .finish_non_exhaustive()
    }
}

/// Settings shared by both transports (the same fields on both).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerCommon {
    /// See [`StdioServerConfig::trusted`].
    pub trusted: bool,
    /// See [`StdioServerConfig::connect_timeout_ms`].
    pub connect_timeout_ms: u64,
    /// See [`StdioServerConfig::restart_min_delay_ms`].
    pub restart_min_delay_ms: u64,
    /// See [`StdioServerConfig::restart_max_delay_ms`].
    pub restart_max_delay_ms: u64,
}

fn default_connect_timeout_ms() -> u64 {
    DEFAULT_CONNECT_TIMEOUT_MS
}
fn default_restart_min_delay_ms() -> u64 {
    DEFAULT_RESTART_MIN_DELAY_MS
}
fn default_restart_max_delay_ms() -> u64 {
    DEFAULT_RESTART_MAX_DELAY_MS
}

impl McpServerConfig {
    /// A stdio server with default settings.
    pub fn stdio(command: impl Into<String>, args: Vec<String>) -> Self {
        Self::Stdio(StdioServerConfig {
            command: command.into(),
            args,
            env: BTreeMap::new(),
            inherit_env: Vec::new(),
            cwd: None,
            trusted: false,
            connect_timeout_ms: DEFAULT_CONNECT_TIMEOUT_MS,
            restart_min_delay_ms: DEFAULT_RESTART_MIN_DELAY_MS,
            restart_max_delay_ms: DEFAULT_RESTART_MAX_DELAY_MS,
        })
    }

    /// A Streamable HTTP server with default settings.
    pub fn http(url: impl Into<String>) -> Self {
        Self::Http(HttpServerConfig {
            url: url.into(),
            headers: BTreeMap::new(),
            trusted: false,
            connect_timeout_ms: DEFAULT_CONNECT_TIMEOUT_MS,
            restart_min_delay_ms: DEFAULT_RESTART_MIN_DELAY_MS,
            restart_max_delay_ms: DEFAULT_RESTART_MAX_DELAY_MS,
            oauth: None,
        })
    }

    /// The settings shared by both transports.
    pub fn common(&self) -> ServerCommon {
        let (trusted, connect, min, max) = match self {
            Self::Stdio(s) => (
                s.trusted,
                s.connect_timeout_ms,
                s.restart_min_delay_ms,
                s.restart_max_delay_ms,
            ),
            Self::Http(h) => (
                h.trusted,
                h.connect_timeout_ms,
                h.restart_min_delay_ms,
                h.restart_max_delay_ms,
            ),
        };
        ServerCommon {
            trusted,
            connect_timeout_ms: connect,
            restart_min_delay_ms: min,
            restart_max_delay_ms: max,
        }
    }

    /// Sets [`StdioServerConfig::trusted`] / [`HttpServerConfig::trusted`].
    pub fn set_trusted(&mut self, trusted: bool) {
        match self {
            Self::Stdio(s) => s.trusted = trusted,
            Self::Http(h) => h.trusted = trusted,
        }
    }

    /// Sets the restart delays, in ms (see [`StdioServerConfig::restart_min_delay_ms`]).
    pub fn set_restart_delays(&mut self, min_ms: u64, max_ms: u64) {
        match self {
            Self::Stdio(s) => (s.restart_min_delay_ms, s.restart_max_delay_ms) = (min_ms, max_ms),
            Self::Http(h) => (h.restart_min_delay_ms, h.restart_max_delay_ms) = (min_ms, max_ms),
        }
    }

    /// Sets the connect timeout, in ms (see [`StdioServerConfig::connect_timeout_ms`]).
    pub fn set_connect_timeout_ms(&mut self, ms: u64) {
        match self {
            Self::Stdio(s) => s.connect_timeout_ms = ms,
            Self::Http(h) => h.connect_timeout_ms = ms,
        }
    }

    /// Checks the server `name` and replaces its placeholders from `vars`.
    ///
    /// # Errors
    /// [`ConfigError::EmptyServerName`], [`ConfigError::MissingCommand`],
    /// [`ConfigError::InvalidUrl`], [`ConfigError::InvalidHeader`],
    /// [`ConfigError::InvalidEnv`], [`ConfigError::MissingConfigValue`],
    /// [`ConfigError::UnsupportedPlaceholder`], [`ConfigError::InvalidSetting`].
    pub fn resolve(
        &self,
        name: &str,
        vars: &BTreeMap<String, String>,
    ) -> Result<ResolvedServer, ConfigError> {
        if name.trim().is_empty() {
            return Err(ConfigError::EmptyServerName);
        }
        let common = self.common();
        if common.connect_timeout_ms == 0 {
            return Err(ConfigError::InvalidSetting {
                server: name.to_owned(),
                message: "connect_timeout_ms must be at least 1".into(),
            });
        }
        if common.restart_min_delay_ms > common.restart_max_delay_ms {
            return Err(ConfigError::InvalidSetting {
                server: name.to_owned(),
                message: "restart_min_delay_ms is larger than restart_max_delay_ms".into(),
            });
        }
        let transport = match self {
            Self::Stdio(s) => {
                if s.command.trim().is_empty() {
                    return Err(ConfigError::MissingCommand {
                        server: name.to_owned(),
                    });
                }
                let mut env = BTreeMap::new();
                for (key, value) in &s.env {
                    if key.is_empty() || key.contains('=') || key.contains('\0') {
                        return Err(ConfigError::InvalidEnv {
                            server: name.to_owned(),
                            name: key.clone(),
                        });
                    }
                    env.insert(key.clone(), resolve_placeholders(name, value, vars)?);
                }
                ResolvedTransport::Stdio {
                    command: s.command.clone(),
                    args: s.args.clone(),
                    env,
                    inherit_env: s.inherit_env.clone(),
                    cwd: s.cwd.clone(),
                }
            }
            Self::Http(h) => {
                check_url(name, &h.url)?;
                let mut headers = BTreeMap::new();
                for (key, value) in &h.headers {
                    let value = resolve_placeholders(name, value, vars)?;
                    check_header(name, key, &value)?;
                    headers.insert(key.clone(), value);
                }
                let oauth = match &h.oauth {
                    None => None,
                    Some(oauth) => Some(resolve_oauth(name, oauth, &h.headers, vars)?),
                };
                ResolvedTransport::Http {
                    url: h.url.clone(),
                    headers,
                    oauth,
                }
            }
        };
        Ok(ResolvedServer {
            name: name.to_owned(),
            transport,
            common,
            config_values: vars.clone(),
            network_policy: NetworkPolicy::default(),
        })
    }
}

/// A server configuration with its placeholders replaced: what a client
/// connects with. Holds secrets: `Debug` prints header and env names only.
#[derive(Clone, PartialEq, Eq)]
pub struct ResolvedServer {
    /// Logical name.
    pub name: String,
    /// Transport, resolved.
    pub transport: ResolvedTransport,
    /// Shared settings.
    pub common: ServerCommon,
    /// Values of `{{config.X}}`, for per-call headers. Secrets.
    pub config_values: BTreeMap<String, String>,
    /// Which addresses OAuth discovery (and a discovered token endpoint)
    /// may reach: the worker's tool policy (`--allow-private-network`).
    /// [`McpConfig::resolve`] sets the default, which allows no
    /// non-public address; [`ResolvedServer::with_network_policy`] sets
    /// the worker's.
    pub network_policy: NetworkPolicy,
}

impl ResolvedServer {
    /// This server, its OAuth discovery reaching what `policy` allows.
    pub fn with_network_policy(mut self, policy: NetworkPolicy) -> Self {
        self.network_policy = policy;
        self
    }
}

impl fmt::Debug for ResolvedServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResolvedServer")
            .field("name", &self.name)
            .field("transport", &self.transport)
            .field("common", &self.common)
            .field(
                "config_values",
                &self.config_values.keys().collect::<Vec<_>>(),
            )
            .field("network_policy", &self.network_policy)
            .finish()
    }
}

impl fmt::Debug for ResolvedTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Stdio {
                command,
                args,
                env,
                inherit_env,
                cwd,
            } => f
                .debug_struct("Stdio")
                .field("command", command)
                .field("args", args)
                .field("env", &env.keys().collect::<Vec<_>>())
                .field("inherit_env", inherit_env)
                .field("cwd", cwd)
                .finish(),
            Self::Http {
                url,
                headers,
                oauth,
            } => f
                .debug_struct("Http")
                .field("url", url)
                .field("headers", &headers.keys().collect::<Vec<_>>())
                .field("oauth", oauth)
                .finish(),
        }
    }
}

/// The transport half of a [`ResolvedServer`]. `Debug` prints env and header
/// names only (their values may be secrets).
#[derive(Clone, PartialEq, Eq)]
pub enum ResolvedTransport {
    /// A child process.
    Stdio {
        /// Executable.
        command: String,
        /// Arguments.
        args: Vec<String>,
        /// Environment beyond the inherited names, placeholders resolved.
        env: BTreeMap<String, String>,
        /// Extra names inherited from the worker.
        inherit_env: Vec<String>,
        /// Working directory.
        cwd: Option<PathBuf>,
    },
    /// Streamable HTTP.
    Http {
        /// Endpoint URL.
        url: String,
        /// Headers for every request, placeholders resolved.
        headers: BTreeMap<String, String>,
        /// Client credentials for bearer tokens, placeholders resolved.
        oauth: Option<ResolvedOAuth>,
    },
}

/// A configuration that cannot work. Detected before any process starts or
/// any request is sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The document is not valid JSON of the expected shape.
    #[error("MCP configuration does not parse: {0}")]
    Parse(String),
    /// No server of that name is configured.
    #[error("no MCP server named `{0}` is configured")]
    UnknownServer(String),
    /// A server name is empty.
    #[error("an MCP server has an empty name")]
    EmptyServerName,
    /// A stdio server without a command.
    #[error("MCP server `{server}`: stdio transport needs a `command`")]
    MissingCommand {
        /// Server name.
        server: String,
    },
    /// The HTTP URL is not an absolute `http(s)://host/…` URL.
    #[error("MCP server `{server}`: url `{url}` is not usable: {reason}")]
    InvalidUrl {
        /// Server name.
        server: String,
        /// The URL as configured.
        url: String,
        /// Why.
        reason: String,
    },
    /// A header name or value is not valid HTTP, or is reserved by MCP.
    #[error("MCP server `{server}`: header `{name}` is not usable: {reason}")]
    InvalidHeader {
        /// Server name.
        server: String,
        /// Header name as configured.
        name: String,
        /// Why.
        reason: String,
    },
    /// An environment variable name is empty or contains `=` or NUL.
    #[error("MCP server `{server}`: environment variable name `{name}` is not valid")]
    InvalidEnv {
        /// Server name.
        server: String,
        /// The name as configured.
        name: String,
    },
    /// `{{config.NAME}}` names a value that is not in `config`.
    #[error("MCP server `{server}`: placeholder {{{{config.{name}}}}} has no value in `config`")]
    MissingConfigValue {
        /// Server name.
        server: String,
        /// The config name.
        name: String,
    },
    /// A `{{…}}` placeholder other than `{{config.NAME}}`, or an unclosed one.
    #[error(
        "MCP server `{server}`: placeholder `{placeholder}` is not supported (only {{{{config.NAME}}}})"
    )]
    UnsupportedPlaceholder {
        /// Server name.
        server: String,
        /// The placeholder text.
        placeholder: String,
    },
    /// A timing setting out of range.
    #[error("MCP server `{server}`: {message}")]
    InvalidSetting {
        /// Server name.
        server: String,
        /// What is wrong.
        message: String,
    },
}

/// Header names that the MCP transport sets itself; a configured or per-call
/// header may not override them.
pub const RESERVED_HEADERS: &[&str] = &[
    "accept",
    "content-type",
    "content-length",
    "host",
    "last-event-id",
    "mcp-protocol-version",
    "mcp-session-id",
    "transfer-encoding",
];

/// Replaces every `{{config.NAME}}` in `text` with `vars[NAME]`
/// (`server` only names the server in errors), with the worker's one
/// resolver, [`crate::placeholders::resolve`].
///
/// # Errors
/// [`ConfigError::MissingConfigValue`] or [`ConfigError::UnsupportedPlaceholder`].
pub fn resolve_placeholders(
    server: &str,
    text: &str,
    vars: &BTreeMap<String, String>,
) -> Result<String, ConfigError> {
    placeholders::resolve(text, |name| vars.get(name).map(String::as_str)).map_err(|e| match e {
        PlaceholderError::Missing(name) => ConfigError::MissingConfigValue {
            server: server.to_owned(),
            name,
        },
        PlaceholderError::Unsupported(placeholder) => ConfigError::UnsupportedPlaceholder {
            server: server.to_owned(),
            placeholder,
        },
    })
}

/// [`resolve_placeholders`] for a call's per-call header: `{{_secret.KEY}}`
/// resolves too, from `secrets` (to the empty string when absent), in the
/// same pass.
///
/// # Errors
/// As [`resolve_placeholders`].
pub fn resolve_call_header(
    server: &str,
    text: &str,
    vars: &BTreeMap<String, String>,
    secrets: &placeholders::SecretValues,
) -> Result<String, ConfigError> {
    placeholders::resolve_with_secrets(text, |name| vars.get(name).map(String::as_str), secrets)
        .map_err(|e| match e {
            PlaceholderError::Missing(name) => ConfigError::MissingConfigValue {
                server: server.to_owned(),
                name,
            },
            PlaceholderError::Unsupported(placeholder) => ConfigError::UnsupportedPlaceholder {
                server: server.to_owned(),
                placeholder,
            },
        })
}

/// Checks one header (name, resolved value) for HTTP validity and MCP
/// reservations.
///
/// # Errors
/// [`ConfigError::InvalidHeader`].
pub fn check_header(server: &str, name: &str, value: &str) -> Result<(), ConfigError> {
    let invalid = |reason: &str| ConfigError::InvalidHeader {
        server: server.to_owned(),
        name: name.to_owned(),
        reason: reason.to_owned(),
    };
    let parsed = reqwest::header::HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| invalid("not a valid HTTP header name"))?;
    if RESERVED_HEADERS.contains(&parsed.as_str()) {
        return Err(invalid("set by the MCP transport itself"));
    }
    reqwest::header::HeaderValue::from_str(value)
        .map_err(|_| invalid("value is not valid in an HTTP header"))?;
    Ok(())
}

/// `oauth` with its placeholders resolved; refuses a bad token URL, an
/// empty client id, a scope with whitespace, and an `Authorization` header
/// next to it.
fn resolve_oauth(
    server: &str,
    oauth: &OAuthClientConfig,
    headers: &BTreeMap<String, String>,
    vars: &BTreeMap<String, String>,
) -> Result<ResolvedOAuth, ConfigError> {
    let invalid = |message: String| ConfigError::InvalidSetting {
        server: server.to_owned(),
        message,
    };
    if let Some(name) = headers
        .keys()
        .find(|k| k.eq_ignore_ascii_case("authorization"))
    {
        return Err(ConfigError::InvalidHeader {
            server: server.to_owned(),
            name: name.clone(),
            reason: "`oauth` sets the Authorization header itself".into(),
        });
    }
    let token_url = match &oauth.token_url {
        None => None,
        Some(url) => {
            check_url(server, url)?;
            Some(
                reqwest::Url::parse(url).map_err(|e| ConfigError::InvalidUrl {
                    server: server.to_owned(),
                    url: url.clone(),
                    reason: e.to_string(),
                })?,
            )
        }
    };
    let client_id = resolve_placeholders(server, &oauth.client_id, vars)?;
    if client_id.trim().is_empty() {
        return Err(invalid("oauth.client_id is empty".into()));
    }
    let client_secret = resolve_placeholders(server, &oauth.client_secret, vars)?;
    for scope in &oauth.scopes {
        if scope.is_empty() || scope.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(invalid(format!(
                "oauth.scopes: `{scope}` is not a scope (non-empty, no spaces)"
            )));
        }
    }
    Ok(ResolvedOAuth {
        token_url,
        client_id,
        client_secret,
        scopes: oauth.scopes.join(" "),
    })
}

fn check_url(server: &str, url: &str) -> Result<(), ConfigError> {
    let invalid = |reason: &str| ConfigError::InvalidUrl {
        server: server.to_owned(),
        url: url.to_owned(),
        reason: reason.to_owned(),
    };
    let parsed = reqwest::Url::parse(url).map_err(|e| invalid(&e.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(invalid("scheme must be http or https"));
    }
    if parsed.host().is_none() {
        return Err(invalid("no host"));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn vars() -> BTreeMap<String, String> {
        BTreeMap::from([("TOKEN".to_owned(), "s3cret".to_owned())])
    }

    #[test]
    fn placeholders_resolve_from_config() {
        assert_eq!(
            resolve_placeholders("s", "Bearer {{config.TOKEN}}!", &vars()).unwrap(),
            "Bearer s3cret!"
        );
        assert_eq!(
            resolve_placeholders("s", "{{ config.TOKEN }}{{config.TOKEN}}", &vars()).unwrap(),
            "s3crets3cret"
        );
        assert_eq!(
            resolve_placeholders("s", "plain", &vars()).unwrap(),
            "plain"
        );
    }

    #[test]
    fn a_call_header_takes_vault_values_and_server_settings_do_not() {
        let secrets = placeholders::SecretValues::new(BTreeMap::from([(
            "sess".to_owned(),
            "v-1".to_owned(),
        )]));
        assert_eq!(
            resolve_call_header(
                "s",
                "{{config.TOKEN}}/{{_secret.sess}}/{{_secret.gone}}",
                &vars(),
                &secrets
            )
            .unwrap(),
            "s3cret/v-1/"
        );
        assert!(matches!(
            resolve_placeholders("s", "{{_secret.sess}}", &vars()),
            Err(ConfigError::UnsupportedPlaceholder { .. })
        ));
    }

    #[test]
    fn bad_placeholders_are_typed_errors() {
        assert_eq!(
            resolve_placeholders("s", "{{config.NOPE}}", &vars()),
            Err(ConfigError::MissingConfigValue {
                server: "s".into(),
                name: "NOPE".into()
            })
        );
        assert!(matches!(
            resolve_placeholders("s", "{{session.user}}", &vars()),
            Err(ConfigError::UnsupportedPlaceholder { .. })
        ));
        assert!(matches!(
            resolve_placeholders("s", "{{config.TOKEN", &vars()),
            Err(ConfigError::UnsupportedPlaceholder { .. })
        ));
    }

    #[test]
    fn oauth_client_credentials_resolve_and_bad_ones_are_typed_errors() {
        let parse = |oauth: &str, headers: &str| {
            McpConfig::from_json(&format!(
                r#"{{"servers": {{"crm": {{"transport": "http", "url": "http://127.0.0.1:1/mcp",
                    "headers": {headers}, "oauth": {oauth}}}}},
                    "config": {{"ID": "crm-client", "SECRET": "s3cret"}}}}"#
            ))
            .unwrap()
        };
        let good = r#"{"token_url": "http://127.0.0.1:2/token", "client_id": "{{config.ID}}",
                       "client_secret": "{{config.SECRET}}", "scopes": ["mcp:tools", "crm.read"]}"#;
        let config = parse(good, "{}");
        let resolved = config.resolve("crm").unwrap();
        let ResolvedTransport::Http {
            oauth: Some(creds), ..
        } = &resolved.transport
        else {
            panic!("{resolved:?}");
        };
        assert_eq!(creds.client_id, "crm-client");
        assert_eq!(creds.client_secret, "s3cret");
        assert_eq!(creds.scopes, "mcp:tools crm.read");
        assert_eq!(
            creds.token_url.as_ref().map(reqwest::Url::as_str),
            Some("http://127.0.0.1:2/token")
        );
        assert!(!format!("{resolved:?}").contains("s3cret"));
        assert!(!format!("{config:?}").contains("s3cret"));

        // Without `token_url` (nor scopes): discovered from the server.
        let discovered = parse(
            r#"{"client_id": "{{config.ID}}", "client_secret": "{{config.SECRET}}"}"#,
            "{}",
        );
        discovered.validate().unwrap();
        let resolved = discovered.resolve("crm").unwrap();
        let ResolvedTransport::Http {
            oauth: Some(creds), ..
        } = &resolved.transport
        else {
            panic!("{resolved:?}");
        };
        assert_eq!(creds.token_url, None);
        assert_eq!(creds.scopes, "");
        assert_eq!(creds.client_secret, "s3cret");
        assert!(!format!("{resolved:?}").contains("s3cret"));

        let err = |oauth: &str, headers: &str| parse(oauth, headers).validate().unwrap_err();
        assert!(matches!(
            err(good, r#"{"authorization": "Bearer x"}"#),
            ConfigError::InvalidHeader { name, reason, .. }
                if name == "authorization" && reason.contains("`oauth`")
        ));
        assert!(matches!(
            err(&good.replace("http://127.0.0.1:2/token", "ftp://x/token"), "{}"),
            ConfigError::InvalidUrl { url, .. } if url == "ftp://x/token"
        ));
        assert!(matches!(
            err(&good.replace("{{config.SECRET}}", "{{config.NOPE}}"), "{}"),
            ConfigError::MissingConfigValue { name, .. } if name == "NOPE"
        ));
        assert!(matches!(
            err(&good.replace("crm.read", "a b"), "{}"),
            ConfigError::InvalidSetting { message, .. } if message.contains("`a b` is not a scope")
        ));
        assert!(matches!(
            err(&good.replace("{{config.ID}}", " "), "{}"),
            ConfigError::InvalidSetting { message, .. } if message.contains("client_id is empty")
        ));
        assert!(matches!(
            McpConfig::from_json(
                r#"{"servers": {"crm": {"transport": "http", "url": "http://x/mcp",
                    "oauth": {"token_url": "http://x/t", "client_id": "a", "client_secret": "b", "scope": "c"}}}}"#
            ),
            Err(ConfigError::Parse(m)) if m.contains("scope")
        ));
    }

    #[test]
    fn parses_both_transports_and_refuses_unknown_fields() {
        let config = McpConfig::from_json(
            r#"{"servers": {
                "a": {"transport": "stdio", "command": "srv", "args": ["x"], "trusted": true},
                "b": {"transport": "http", "url": "http://127.0.0.1:1/mcp",
                      "headers": {"Authorization": "Bearer {{config.TOKEN}}"}}},
                "config": {"TOKEN": "s3cret"}}"#,
        )
        .unwrap();
        config.validate().unwrap();
        assert!(config.servers["a"].common().trusted);
        let b = config.resolve("b").unwrap();
        assert_eq!(
            b.transport,
            ResolvedTransport::Http {
                url: "http://127.0.0.1:1/mcp".into(),
                headers: BTreeMap::from([("Authorization".to_owned(), "Bearer s3cret".to_owned())]),
                oauth: None,
            }
        );
        assert!(!format!("{b:?}").contains("s3cret"));
        assert!(!format!("{config:?}").contains("s3cret"));

        let err = McpConfig::from_json(
            r#"{"servers": {"a": {"transport": "stdio", "command": "x", "comand": "y"}}}"#,
        )
        .unwrap_err();
        assert!(matches!(err, ConfigError::Parse(m) if m.contains("comand")));
        assert!(matches!(
            McpConfig::from_json(r#"{"servers": {"a": {"transport": "ws", "url": "x"}}}"#),
            Err(ConfigError::Parse(_))
        ));
    }

    #[test]
    fn invalid_servers_are_refused() {
        let missing = McpServerConfig::stdio("  ", vec![]);
        assert_eq!(
            missing.resolve("a", &vars()),
            Err(ConfigError::MissingCommand { server: "a".into() })
        );
        assert!(matches!(
            McpServerConfig::http("ftp://x/mcp").resolve("h", &vars()),
            Err(ConfigError::InvalidUrl { .. })
        ));
        assert!(matches!(
            McpServerConfig::http("/mcp").resolve("h", &vars()),
            Err(ConfigError::InvalidUrl { .. })
        ));
        let mut reserved = McpServerConfig::http("http://h/mcp");
        if let McpServerConfig::Http(h) = &mut reserved {
            h.headers.insert("Mcp-Session-Id".into(), "x".into());
        }
        assert!(matches!(
            reserved.resolve("h", &vars()),
            Err(ConfigError::InvalidHeader { .. })
        ));
        let mut bad_delay = McpServerConfig::stdio("x", vec![]);
        bad_delay.set_restart_delays(10, 1);
        assert!(matches!(
            bad_delay.resolve("x", &vars()),
            Err(ConfigError::InvalidSetting { .. })
        ));
        assert_eq!(
            McpConfig::default().resolve("zzz"),
            Err(ConfigError::UnknownServer("zzz".into()))
        );
    }
}
