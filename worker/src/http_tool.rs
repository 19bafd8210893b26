//! Executes `tool_call` tasks whose binding is [`ToolBinding::Http`].
//!
//! A call is done in two steps so that nothing is dispatched that cannot be
//! executed: [`HttpToolClient::prepare`] resolves the endpoint, fills path
//! parameters, splits the remaining arguments into query or body and checks
//! the headers, all without I/O; [`HttpToolClient::execute`] then sends
//! exactly one request (no retry: the engine decides, from the failure class
//! and the tool's repeat safety, whether a call may be repeated).
//!
//! Request shape:
//! - endpoint: absolute `http(s)://` URL, or a path joined to the worker's
//!   HTTP base URL;
//! - `{name}` in the endpoint: replaced by the percent-encoded argument `name`
//!   (string, number or boolean), which is then removed from the arguments;
//! - `query_params:` ([`QueryParam`]), in order, after the endpoint's own
//!   query; the arguments their `{{param}}` placeholders name are removed;
//! - `body_template:`: the body, filled from the arguments (see
//!   [`BodyType`]); the arguments it names are removed;
//! - `body_mode: auto` (the default) sends the remaining top-level
//!   arguments: as the body for POST, PUT and PATCH (JSON object, or form
//!   pairs), as query parameters for GET, DELETE and other methods without
//!   a body (arrays repeat the key, nulls are left out, objects are sent as
//!   JSON text); `body_mode: none` does not send them;
//! - headers: `Accept: application/json`, the body's `Content-Type`, the
//!   binding's headers, then the `auth:` headers, then `Idempotency-Key`
//!   (always, and it wins over a header of the same name);
//! - timeout: the binding's `timeout_ms` for the whole request (and for an
//!   OAuth token request).
//!
//! Credentials: `{{config.NAME}}` in header values and in `auth_config`
//! are resolved from the worker's [`ConfigValues`] when the request is
//! prepared. A name this worker has no value for fails the call with
//! [`HttpToolError::Unconfigured`] (`NOT_SENT`, before dispatch: another
//! worker may have it); the placeholder is never sent as it is. Resolved
//! values are marked sensitive (`Debug` hides them) and appear in no error.
//! `auth: bearer` sends `Authorization: Bearer <token>` (RFC 6750 §2.1),
//! `api_key` the key in its header, `custom` its headers, and
//! `oauth2_client` a bearer token from [`crate::oauth2`] (fetched after
//! dispatch, cached per worker, fetched again once if the tool answers 401).
//!
//! A 2xx answer's body is the result: parsed as JSON, a non-JSON body becomes
//! a JSON string, an empty body `null`; an answer whose `Content-Type` is
//! XML is converted to JSON ([`xml`]).
//!
//! `body_type: xml` ([`xml`]) sends the arguments as XML elements under a
//! root element (`xml_root:`, default the tool's name), or an XML template;
//! `body_schema:` ([`body_schema`]) fills the body's top-level defaults
//! and refuses a body that does not satisfy it, before dispatch
//! ([`HttpToolError::BodySchema`]).
//!
//! Where a request may go ([`crate::ssrf`]): only to public addresses and
//! those the worker's [`NetworkPolicy`] allowlists. An IP-literal host is
//! checked by `prepare` (so the call is refused before dispatch), a host name
//! when it is resolved; either refusal is [`HttpToolError::Refused`], before
//! anything is sent. Redirects are not followed (a 3xx answer is
//! [`HttpToolError::Redirect`]): a followed redirect could lead anywhere,
//! would carry the binding's headers to another host, and would turn a POST
//! into a GET. Proxy variables (`HTTP_PROXY`, …) are ignored for tool
//! requests: behind a proxy the worker could not see where a request goes.
//!
//! Vault references: `{{_secret.KEY}}` in a header value or the body
//! template is filled from the values the engine handed out at dispatch
//! ([`HttpToolClient::prepare_with_secrets`]); a key without a value is the
//! empty string (never the placeholder), and nothing else of the request
//! (endpoint, query, auth settings) takes one. [`HttpToolClient::prepare`]
//! builds the request with none (so a call that cannot be made is refused
//! before dispatch); the runner builds it again with the values once the
//! dispatch returned them. Headers holding one are marked sensitive.
//!
//! [`ToolBinding::AsyncWebhook`] builds the same request (POST, PUT or PATCH
//! only); the callback URL the engine hands out at dispatch is then put into
//! the JSON body at the binding's dot-path `callback_url_field`
//! ([`PreparedRequest::set_callback_url`]), creating objects on the way. The
//! body must then be a JSON object, and every value on the path an object or
//! absent: otherwise the call is refused before dispatch. The 2xx answer is
//! reported as the acceptance; the result comes by callback.

use std::sync::Arc;
use std::time::Duration;

use belay_proto::v1::FailureClass;
use belay_proto::wire::{
    BodyMode, BodyType, HttpAuth, HttpBinding, QueryParam, TemplatePiece, ToolBinding,
    ToolCallSpec, split_placeholders,
};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::header::{
    ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, LOCATION,
};
use reqwest::{Method, Url};
use serde_json::{Map, Value};

use crate::http_util::{
    CappedRead, MAX_ERROR_BODY_BYTES, SendFailure, classify_send_error, error_chain, truncate_text,
};
use crate::oauth2::{ClientCredentials, Clock, TokenCache, TokenError, form_encode};
use crate::placeholders::{self, ConfigValues, PlaceholderError, SecretValues};
use crate::ssrf::{AddressRefused, CheckedResolver, NetworkPolicy};

mod body_schema;
pub mod tls;
pub mod xml;

pub use tls::TlsProfilesConfig;

/// Characters left as they are in a path parameter: RFC 3986 unreserved.
/// Everything else, `/` included, is percent-encoded so that a value stays
/// inside its path segment.
const PATH_SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Connect timeout of tool requests, in ms (the binding's `timeout_ms` still
/// bounds the whole request). A connect that times out sent nothing, so it is
/// classified `NOT_SENT`.
const CONNECT_TIMEOUT_MS: u64 = 10_000;

/// The most bytes of a 2xx response body the worker reads (4 MiB): the
/// engine's cap on a result document (`MAX_JSON_BYTES` in
/// `engine/src/coordinator/mod.rs`), so a longer answer could never be
/// recorded. Checked against `Content-Length` before reading and while
/// reading (a chunked body has none); a longer body fails the call with
/// [`HttpToolError::ResponseTooLarge`].
pub const MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;

/// Header carrying [`ToolCallSpec::idempotency_key`] on every request.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";

/// Why an HTTP tool call failed. [`HttpToolError::class`] says whether the
/// tool may have acted.
#[derive(Debug, thiserror::Error)]
pub enum HttpToolError {
    /// The binding or the arguments cannot make a request (relative endpoint
    /// and no base URL, missing path parameter, bad header, unknown method).
    /// Detected before dispatch; the call never starts. Class `REJECTED`.
    #[error("the HTTP tool call cannot be made: {0}")]
    Config(String),
    /// A `{{config.NAME}}` placeholder of the binding (header or
    /// `auth_config`) has no value on this worker. Detected before dispatch;
    /// nothing was sent, and a worker configured with the value can make the
    /// call. Class `NOT_SENT`.
    #[error(
        "{{{{config.{name}}}}} has no value on this worker (set {env}{name}, or `config` in \
         --mcp-config); nothing was sent"
    )]
    Unconfigured {
        /// The placeholder's NAME.
        name: String,
        /// [`crate::placeholders::ENV_PREFIX`].
        env: &'static str,
    },
    /// The tool's `tls_profile:` is not one of this worker's
    /// (`--tls-profiles`). Detected before dispatch; nothing was sent, and
    /// a worker with the profile can make the call. Class `NOT_SENT`.
    #[error(
        "the TLS client-certificate profile `{0}` is not configured on this worker \
         (--tls-profiles / BELAY_TLS_PROFILES); nothing was sent"
    )]
    UnknownTlsProfile(String),
    /// The server refused the TLS handshake over the client certificate
    /// (it asked for one and got none, or did not accept the one sent):
    /// its application saw no request. Class `REJECTED`: the same
    /// certificate gets the same answer.
    #[error(
        "the tool's server refused the TLS handshake over the client certificate ({detail}); \
         {hint}; nothing was sent"
    )]
    ClientCertificate {
        /// The TLS alert, as rustls names it.
        detail: String,
        /// What to change.
        hint: &'static str,
    },
    /// The OAuth 2.0 token could not be had (see [`crate::oauth2`]): nothing
    /// was sent to the tool. Class `NOT_SENT`.
    #[error("{0}; nothing was sent to the tool")]
    Auth(Box<TokenError>),
    /// The host is, or resolves to, a non-public address the worker's
    /// [`NetworkPolicy`] does not allow (see [`crate::ssrf`]). Nothing was
    /// sent, and repeating changes nothing. Class `REJECTED`.
    #[error("{0}")]
    Refused(#[from] AddressRefused),
    /// Connection refused, DNS failure, TLS failure or connect timeout: nothing
    /// was sent. Class `NOT_SENT`.
    #[error("could not connect to the tool endpoint, nothing was sent: {0}")]
    Connect(String),
    /// The whole-request timeout fired; the request may have been sent. Class
    /// `MAY_HAVE_ACTED`.
    #[error("tool call timed out after {timeout_ms} ms: {message}")]
    Timeout {
        /// The binding's timeout, in ms.
        timeout_ms: u64,
        /// Transport error chain.
        message: String,
    },
    /// The request body does not satisfy the tool's `body_schema:` (with
    /// `use_body_schema: true`): the violations, each with its JSON pointer.
    /// Detected before dispatch; nothing was sent, and the same arguments
    /// make the same body, so it is not repeated. Class `REJECTED`.
    #[error("the request body does not match the tool's `body_schema`, nothing was sent: {0}")]
    BodySchema(String),
    /// The connection failed after the request was sent, or a 2xx body could
    /// not be read. Class `MAY_HAVE_ACTED`.
    #[error("tool call failed after the request was sent: {0}")]
    Transport(String),
    /// The endpoint answered with a status neither 2xx nor 3xx. Class: 429 `NOT_SENT`;
    /// other 4xx `REJECTED`; 5xx (and 1xx) `NOT_SENT` for
    /// GET/HEAD/OPTIONS/TRACE, which by HTTP semantics have no effect, and
    /// `MAY_HAVE_ACTED` for every other method.
    #[error("tool endpoint answered {method} with HTTP {status}: {body}")]
    Status {
        /// Request method, upper case.
        method: String,
        /// HTTP status code.
        status: u16,
        /// Response body as text, truncated to 4 KiB.
        body: String,
    },
    /// The endpoint answered with a redirect (3xx), which tool requests do
    /// not follow. Class: `REJECTED` for GET/HEAD/OPTIONS/TRACE (no effect,
    /// and the same request gets the same answer); `MAY_HAVE_ACTED` for
    /// every other method (a 303 after a POST says it acted).
    #[error(
        "tool endpoint answered {method} with HTTP {status}, a redirect to {location}; \
         tool requests do not follow redirects: point the tool at the final URL"
    )]
    Redirect {
        /// Request method, upper case.
        method: String,
        /// HTTP status code (300 to 399).
        status: u16,
        /// The `Location` header as text (truncated), or `<none>`.
        location: String,
    },
    /// The endpoint answered 2xx with a body longer than
    /// [`MAX_RESPONSE_BYTES`]: the result cannot be recorded. Class:
    /// `REJECTED` for GET/HEAD/OPTIONS/TRACE (no effect, and the same
    /// request gets the same answer); `MAY_HAVE_ACTED` for every other
    /// method (the tool acted, and its answer is lost).
    #[error(
        "tool endpoint answered {method} with HTTP {status} and a body of more than {limit} bytes \
         ({seen}); the worker reads at most {limit} bytes of a tool's answer"
    )]
    ResponseTooLarge {
        /// Request method, upper case.
        method: String,
        /// HTTP status code (2xx).
        status: u16,
        /// [`MAX_RESPONSE_BYTES`].
        limit: usize,
        /// What was known when reading stopped: `Content-Length: N` or
        /// `read N bytes`.
        seen: String,
    },
}

impl HttpToolError {
    /// The HTTP status when the tool answered with one (a reconcile probe's
    /// 404 means "definitely not found").
    pub fn status_code(&self) -> Option<u16> {
        match self {
            Self::Status { status, .. } | Self::Redirect { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The failure class to report in `FailTask`.
    pub fn class(&self) -> FailureClass {
        match self {
            Self::Config(_)
            | Self::Refused(_)
            | Self::BodySchema(_)
            | Self::ClientCertificate { .. } => FailureClass::Rejected,
            Self::Connect(_)
            | Self::Unconfigured { .. }
            | Self::UnknownTlsProfile(_)
            | Self::Auth(_) => FailureClass::NotSent,
            Self::Timeout { .. } | Self::Transport(_) => FailureClass::MayHaveActed,
            Self::Status { method, status, .. } => {
                if *status == 429 {
                    FailureClass::NotSent
                } else if (400..500).contains(status) {
                    FailureClass::Rejected
                } else if is_safe_method(method) {
                    FailureClass::NotSent
                } else {
                    FailureClass::MayHaveActed
                }
            }
            Self::Redirect { method, .. } | Self::ResponseTooLarge { method, .. } => {
                if is_safe_method(method) {
                    FailureClass::Rejected
                } else {
                    FailureClass::MayHaveActed
                }
            }
        }
    }
}

fn is_safe_method(method: &str) -> bool {
    matches!(method, "GET" | "HEAD" | "OPTIONS" | "TRACE")
}

fn has_body(method: &Method) -> bool {
    *method == Method::POST || *method == Method::PUT || *method == Method::PATCH
}

/// A request ready to send, built by [`HttpToolClient::prepare`]. Header
/// values that came from configuration are marked sensitive, so `Debug`
/// does not show them.
#[derive(Debug, Clone)]
pub struct PreparedRequest {
    method: Method,
    url: Url,
    headers: HeaderMap,
    body: Option<Vec<u8>>,
    timeout_ms: u64,
    /// `callback_url_field` of an async webhook: the callback URL goes here.
    callback_url_field: Option<String>,
    /// `auth: oauth2_client`: the token is fetched when the request is sent.
    oauth: Option<ClientCredentials>,
    /// `tls_profile:`: the client certificate the request is sent with.
    tls_profile: Option<String>,
}

/// Put `url` into `body` (a JSON object) at the dot-path `field`, creating
/// objects on the way. Errors name the segment that is not an object.
fn inject_at(body: &mut Value, field: &str, url: &str) -> Result<(), String> {
    let mut at = body;
    let segments: Vec<&str> = field.split('.').collect();
    for (i, seg) in segments.iter().enumerate() {
        let path = segments[..=i].join(".");
        let Value::Object(map) = at else {
            return Err(format!(
                "cannot put the callback URL at `{field}`: the value before `{seg}` is not a JSON object"
            ));
        };
        if i + 1 == segments.len() {
            map.insert((*seg).to_owned(), Value::String(url.to_owned()));
            return Ok(());
        }
        let next = map
            .entry((*seg).to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
        if !next.is_object() {
            return Err(format!(
                "cannot put the callback URL at `{field}`: `{path}` is {}, not an object",
                json_kind(next)
            ));
        }
        at = next;
    }
    Err(format!("`callback_url_field` {field:?} is empty"))
}

impl PreparedRequest {
    /// The request method.
    pub fn method(&self) -> &Method {
        &self.method
    }

    /// The full URL, path parameters and query included.
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// The body, for POST, PUT and PATCH (and a template's).
    pub fn body(&self) -> Option<&[u8]> {
        self.body.as_deref()
    }

    /// The headers (configured values are marked sensitive).
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// For a `type: async_webhook` request: put the callback URL from the
    /// dispatch into the body at the binding's `callback_url_field`.
    /// [`HttpToolError::Config`] if the request is not an async webhook or
    /// the body cannot hold it (both are refused by `prepare` already).
    pub fn set_callback_url(&mut self, url: &str) -> Result<(), HttpToolError> {
        let Some(field) = self.callback_url_field.as_deref() else {
            return Err(config("this request takes no callback URL"));
        };
        let mut body: Value = match self.body.as_deref() {
            Some(bytes) => serde_json::from_slice(bytes)
                .map_err(|e| config(format!("the request body is not JSON: {e}")))?,
            None => return Err(config("an async webhook request needs a body")),
        };
        inject_at(&mut body, field, url).map_err(config)?;
        self.body = Some(
            serde_json::to_vec(&body)
                .map_err(|e| config(format!("cannot encode the body: {e}")))?,
        );
        Ok(())
    }

    /// Send the W3C trace context `trace` with the request (`traceparent`,
    /// and `tracestate` when it has one), replacing any the tool's own
    /// headers set.
    pub fn set_trace(&mut self, trace: &belay_proto::trace::TraceContext) {
        if let Ok(value) = HeaderValue::from_str(&trace.traceparent) {
            self.headers
                .insert(HeaderName::from_static("traceparent"), value);
        }
        self.headers.remove("tracestate");
        if !trace.tracestate.is_empty()
            && let Ok(value) = HeaderValue::from_str(&trace.tracestate)
        {
            self.headers
                .insert(HeaderName::from_static("tracestate"), value);
        }
    }

    /// Whether the request waits for a callback URL ([`Self::set_callback_url`]).
    pub fn wants_callback_url(&self) -> bool {
        self.callback_url_field.is_some()
    }
}

/// Executes HTTP tool calls. Cheap to clone (the connection pool and the
/// OAuth token cache are shared).
#[derive(Debug, Clone)]
pub struct HttpToolClient {
    http: reqwest::Client,
    base_url: Option<String>,
    policy: Arc<NetworkPolicy>,
    config: Arc<ConfigValues>,
    tokens: Arc<TokenCache>,
    /// One client per `--tls-profiles` profile, with its certificate, and
    /// whether it has one (a profile may hold a CA bundle only).
    tls_clients: Arc<std::collections::BTreeMap<String, (reqwest::Client, bool)>>,
}

/// The builder of every tool client: connect timeout, user agent, the
/// policy's address check on every resolved address, no redirects, no
/// proxy.
pub(crate) fn tool_client_builder(policy: &Arc<NetworkPolicy>) -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_millis(CONNECT_TIMEOUT_MS))
        .user_agent(concat!("belay-worker/", env!("CARGO_PKG_VERSION")))
        .dns_resolver(CheckedResolver::new(Arc::clone(policy)))
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
}

impl HttpToolClient {
    /// A client that joins path endpoints to `base_url` (e.g.
    /// `http://tools.internal:8080/api`) and reaches only the addresses
    /// `policy` allows (a base URL on a private network needs its block
    /// allowlisted too). Fails only if the HTTP client cannot be built.
    pub fn new(base_url: Option<String>, policy: NetworkPolicy) -> Result<Self, HttpToolError> {
        let policy = Arc::new(policy);
        let http = tool_client_builder(&policy)
            .build()
            .map_err(|e| HttpToolError::Config(error_chain(&e)))?;
        Ok(Self {
            http,
            base_url: base_url.filter(|b| !b.trim().is_empty()),
            policy,
            config: Arc::default(),
            tokens: Arc::default(),
            tls_clients: Arc::default(),
        })
    }

    /// This client, sending the requests of tools with `tls_profile:` with
    /// the certificates of `profiles` ([`tls`]). Reads the files; `Err`
    /// names the profile and the file that cannot be used.
    pub fn with_tls_profiles(
        mut self,
        profiles: &TlsProfilesConfig,
    ) -> Result<Self, HttpToolError> {
        let mut clients = std::collections::BTreeMap::new();
        for (name, profile) in &profiles.profiles {
            let material = profile
                .read()
                .map_err(|e| config(format!("TLS profile `{name}`: {e}")))?;
            let mut builder = tool_client_builder(&self.policy);
            let has_certificate = material.identity.is_some();
            if let Some(identity) = material.identity {
                builder = builder.identity(identity);
            }
            if let Some(roots) = material.roots {
                builder = builder.tls_certs_only(roots);
            }
            let client = builder.build().map_err(|e| {
                config(format!(
                    "TLS profile `{name}`: cannot build its client: {}",
                    error_chain(&e)
                ))
            })?;
            clients.insert(name.clone(), (client, has_certificate));
        }
        self.tls_clients = Arc::new(clients);
        Ok(self)
    }

    /// The values `{{config.NAME}}` placeholders resolve to.
    pub fn config_values(&self) -> &ConfigValues {
        &self.config
    }

    /// This client, resolving `{{config.NAME}}` placeholders from `values`
    /// (none by default: every placeholder is then [`HttpToolError::Unconfigured`]).
    #[must_use]
    pub fn with_config_values(mut self, values: ConfigValues) -> Self {
        self.config = Arc::new(values);
        self
    }

    /// This client, judging OAuth token expiry by `clock` (with an empty
    /// token cache). Default: [`Clock::system`].
    #[must_use]
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.tokens = Arc::new(TokenCache::new(clock));
        self
    }

    /// Builds the request for `spec` without any I/O. Every error is
    /// [`HttpToolError::Config`], or [`HttpToolError::Refused`] for an
    /// IP-literal host the policy refuses: the call must not be dispatched.
    pub fn prepare(&self, spec: &ToolCallSpec) -> Result<PreparedRequest, HttpToolError> {
        self.prepare_with_secrets(spec, &SecretValues::default())
    }

    /// [`prepare`](Self::prepare), with `{{_secret.KEY}}` of the headers and
    /// body template filled from `secrets` (the dispatch's values; a key
    /// without one is the empty string).
    pub fn prepare_with_secrets(
        &self,
        spec: &ToolCallSpec,
        secrets: &SecretValues,
    ) -> Result<PreparedRequest, HttpToolError> {
        let request = self.prepare_binding(spec, secrets)?;
        if let Some(name) = &request.tls_profile
            && !self.tls_clients.contains_key(name)
        {
            return Err(HttpToolError::UnknownTlsProfile(name.clone()));
        }
        self.policy.check_url(&request.url)?;
        if let Some(oauth) = &request.oauth {
            self.policy.check_url(&oauth.token_url)?;
        }
        Ok(request)
    }

    fn prepare_binding(
        &self,
        spec: &ToolCallSpec,
        secrets: &SecretValues,
    ) -> Result<PreparedRequest, HttpToolError> {
        match &spec.binding {
            ToolBinding::Http(binding) => prepare_http(
                &spec.tool,
                binding,
                &spec.arguments,
                &spec.idempotency_key,
                self.base_url.as_deref(),
                &self.config,
                secrets,
            ),
            ToolBinding::AsyncWebhook(binding) => {
                let mut request = prepare_http(
                    &spec.tool,
                    &binding.http,
                    &spec.arguments,
                    &spec.idempotency_key,
                    self.base_url.as_deref(),
                    &self.config,
                    secrets,
                )?;
                if !has_body(&request.method) {
                    return Err(config(format!(
                        "an async webhook is sent with POST, PUT or PATCH, not {}",
                        request.method
                    )));
                }
                request.callback_url_field = Some(binding.callback_url_field.clone());
                // Try the injection now, so a body that cannot carry the URL
                // is refused before dispatch.
                let mut trial = request.clone();
                trial.set_callback_url("https://callback.invalid/")?;
                Ok(request)
            }
            ToolBinding::Mcp(binding) => Err(config(format!(
                "tool `{}` is `type: mcp` (server `{}`): it is called by the MCP client, not over HTTP",
                spec.tool, binding.server
            ))),
            ToolBinding::McpResource(binding) => Err(config(format!(
                "tool `{}` reads a resource of MCP server `{}`: it is read by the MCP client, not over HTTP",
                spec.tool, binding.server
            ))),
            ToolBinding::Sandbox(_) => Err(config(format!(
                "tool `{}` is `type: sandbox`: its code runs in the worker's sandbox, not over HTTP",
                spec.tool
            ))),
        }
    }

    /// Sends `request` once and returns the result value. See the module docs
    /// for how the body becomes a value and [`HttpToolError`] for failures.
    pub async fn execute(&self, request: PreparedRequest) -> Result<Value, HttpToolError> {
        // `prepare` checked it, but maybe on a client with another policy.
        self.policy.check_url(&request.url)?;
        let timeout = Duration::from_millis(request.timeout_ms);
        let Some(oauth) = &request.oauth else {
            return self.send(&request, None).await;
        };
        self.policy.check_url(&oauth.token_url)?;
        let token = self
            .tokens
            .token(&self.http, oauth, timeout)
            .await
            .map_err(token_error)?;
        match self.send(&request, Some(&token)).await {
            // The tool refused the token (revoked, or expired early): one
            // new token, one more request (nothing acted on the first).
            Err(HttpToolError::Status { status: 401, .. }) => {
                let fresh = self
                    .tokens
                    .refresh_after_rejection(&self.http, oauth, &token, timeout)
                    .await
                    .map_err(token_error)?;
                self.send(&request, Some(&fresh)).await
            }
            other => other,
        }
    }

    /// Sends `request` once, with `Authorization: Bearer <token>` when a
    /// token is given.
    async fn send(
        &self,
        request: &PreparedRequest,
        bearer: Option<&str>,
    ) -> Result<Value, HttpToolError> {
        let method = request.method.as_str().to_owned();
        let timeout_ms = request.timeout_ms;
        let mut headers = request.headers.clone();
        if let Some(token) = bearer {
            let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| config("the access token is not valid in a header"))?;
            value.set_sensitive(true);
            headers.insert(AUTHORIZATION, value);
        }
        let (http, sends_certificate) = match &request.tls_profile {
            None => (&self.http, false),
            Some(name) => {
                let (client, has) = self
                    .tls_clients
                    .get(name)
                    .ok_or_else(|| HttpToolError::UnknownTlsProfile(name.clone()))?;
                (client, *has)
            }
        };
        let mut builder = http
            .request(request.method.clone(), request.url.clone())
            .headers(headers)
            .timeout(Duration::from_millis(timeout_ms));
        if let Some(body) = &request.body {
            builder = builder.body(body.clone());
        }
        let send_error = |e: &reqwest::Error| {
            if let Some(refused) = crate::ssrf::address_refused(e) {
                return HttpToolError::Refused(refused.clone());
            }
            if let Some(detail) = tls::client_certificate_refused(e) {
                let hint = if sends_certificate {
                    "the server does not accept the certificate of the tool's `tls_profile:`"
                } else {
                    "the server asks for a client certificate: give the tool a `tls_profile:` \
                     with `cert` and `key`"
                };
                return HttpToolError::ClientCertificate { detail, hint };
            }
            let message = error_chain(e);
            match classify_send_error(e) {
                SendFailure::NotSent if e.is_builder() => HttpToolError::Config(message),
                SendFailure::NotSent => HttpToolError::Connect(message),
                SendFailure::Timeout => HttpToolError::Timeout {
                    timeout_ms,
                    message,
                },
                SendFailure::AfterSend => HttpToolError::Transport(message),
            }
        };
        let response = builder.send().await.map_err(|e| send_error(&e))?;
        let status = response.status();
        if status.is_success() {
            // The tool acted; losing the body now loses the result, so any
            // error here is MAY_HAVE_ACTED (timeout or transport).
            let xml = response
                .headers()
                .get(CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(xml::is_xml_content_type);
            let bytes = read_body_capped(response, &method, MAX_RESPONSE_BYTES)
                .await
                .map_err(|e| e.unwrap_or_else(|e| send_error(&e)))?;
            // An XML answer as JSON (`xml.rs`); one that does not parse
            // stays its text.
            let value = if xml { xml::decode(&bytes) } else { None };
            return Ok(value.unwrap_or_else(|| body_value(&bytes)));
        }
        if status.is_redirection() {
            let location = response.headers().get(LOCATION).map_or_else(
                || "<none>".to_owned(),
                |v| truncate_text(&String::from_utf8_lossy(v.as_bytes())),
            );
            return Err(HttpToolError::Redirect {
                method,
                status: status.as_u16(),
                location,
            });
        }
        // Only what the error quotes is read: a failing endpoint's answer
        // is never held whole.
        let mut response = response;
        let body = match crate::http_util::read_prefix(&mut response, MAX_ERROR_BODY_BYTES).await {
            Ok((bytes, false)) => truncate_text(&String::from_utf8_lossy(&bytes)),
            Ok((bytes, true)) => format!(
                "{}… (the rest was not read)",
                truncate_text(&String::from_utf8_lossy(&bytes))
            ),
            Err(e) => format!("<body unreadable: {}>", error_chain(&e)),
        };
        Err(HttpToolError::Status {
            method,
            status: status.as_u16(),
            body,
        })
    }

    /// [`prepare`](Self::prepare) then [`execute`](Self::execute).
    pub async fn call(&self, spec: &ToolCallSpec) -> Result<Value, HttpToolError> {
        let request = self.prepare(spec)?;
        self.execute(request).await
    }
}

/// A token failure as the call's: the policy's refusal stays one.
fn token_error(e: TokenError) -> HttpToolError {
    match e.refused {
        Some(refused) => HttpToolError::Refused(refused),
        None => HttpToolError::Auth(Box::new(e)),
    }
}

/// The body of a 2xx `response`, at most `limit` bytes
/// ([`crate::http_util::read_capped`]): a longer one (announced by
/// `Content-Length`, or read) is [`HttpToolError::ResponseTooLarge`] (`Ok`
/// of the outer error); a read failure is the transport's error (`Err`).
async fn read_body_capped(
    mut response: reqwest::Response,
    method: &str,
    limit: usize,
) -> Result<Vec<u8>, Result<HttpToolError, reqwest::Error>> {
    let status = response.status().as_u16();
    crate::http_util::read_capped(&mut response, limit)
        .await
        .map_err(|e| match e {
            CappedRead::TooLarge(seen) => Ok(HttpToolError::ResponseTooLarge {
                method: method.to_owned(),
                status,
                limit,
                seen,
            }),
            CappedRead::Failed(e) => Err(e),
        })
}

/// A 2xx body as the tool's result: JSON if it parses, else a JSON string of
/// the (lossily decoded) text; empty or blank → `null`.
fn body_value(bytes: &[u8]) -> Value {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Value::Null;
    }
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
}

fn config(message: impl Into<String>) -> HttpToolError {
    HttpToolError::Config(message.into())
}

fn prepare_http(
    tool: &str,
    binding: &HttpBinding,
    arguments: &Value,
    idempotency_key: &str,
    base_url: Option<&str>,
    values: &ConfigValues,
    secrets: &SecretValues,
) -> Result<PreparedRequest, HttpToolError> {
    let method = Method::from_bytes(binding.method.trim().to_ascii_uppercase().as_bytes())
        .map_err(|_| config(format!("invalid HTTP method {:?}", binding.method)))?;
    if binding.timeout_ms == 0 {
        return Err(config("timeout_ms must be greater than 0"));
    }
    let options = &binding.request;

    // Arguments as an object we can take path parameters out of. `null`
    // counts as no arguments.
    let mut remaining: Option<Map<String, Value>> = match arguments {
        Value::Object(map) => Some(map.clone()),
        Value::Null => Some(Map::new()),
        _ => None,
    };
    // Templates read every argument; what they name is not sent again.
    let all_args = remaining.clone().unwrap_or_default();
    let endpoint = fill_path_params(&binding.endpoint, &mut remaining)?;
    let mut url = resolve_endpoint(&endpoint, base_url)?;
    let templated = options
        .query_params
        .iter()
        .map(|q| q.value.as_str())
        .chain(options.body_template.as_deref());
    if let Some(map) = remaining.as_mut() {
        for text in templated {
            for name in param_names(text)? {
                map.remove(name);
            }
        }
    } else if !options.query_params.is_empty() || options.body_template.is_some() {
        return Err(config(format!(
            "arguments must be a JSON object to fill templates, got {}",
            json_kind(arguments)
        )));
    }
    if !options.query_params.is_empty() {
        let mut pairs = url.query_pairs_mut();
        for param in &options.query_params {
            for value in query_values(param, &all_args)? {
                pairs.append_pair(&param.key, &value);
            }
        }
    }

    let auto = options.body_mode == BodyMode::Auto;
    let shape = BodyShape {
        body_type: options.body_type,
        schema: options.body_schema.as_ref(),
        xml_root: options.xml_root.as_deref().unwrap_or(tool),
    };
    let body = if let Some(template) = &options.body_template {
        let args = with_secrets(template, &all_args, secrets)?;
        Some(render_body(template, &shape, &args)?)
    } else if has_body(&method) && auto {
        Some(encode_body(&shape, remaining, arguments)?)
    } else {
        if auto {
            let Some(map) = remaining else {
                return Err(config(format!(
                    "arguments of a {method} tool must be a JSON object, got {}",
                    json_kind(arguments)
                )));
            };
            if !map.is_empty() {
                let mut pairs = url.query_pairs_mut();
                for (key, value) in &map {
                    for text in value_texts(value) {
                        pairs.append_pair(key, &text);
                    }
                }
            }
        }
        None
    };

    let mut headers = HeaderMap::new();
    let accept = match options.body_type {
        BodyType::Xml => "application/xml, text/xml;q=0.9, application/json;q=0.8",
        _ => "application/json",
    };
    headers.insert(ACCEPT, HeaderValue::from_static(accept));
    if body.is_some() {
        let content_type = match options.body_type {
            BodyType::Json => "application/json",
            BodyType::Form => "application/x-www-form-urlencoded",
            BodyType::Text => "text/plain; charset=utf-8",
            BodyType::Xml => "application/xml; charset=utf-8",
        };
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    }
    for (name, value) in &binding.headers {
        insert_header(&mut headers, name, value, values, Some(secrets))?;
    }
    let oauth = apply_auth(&options.auth, &mut headers, values)?;
    let key = HeaderValue::from_str(idempotency_key)
        .map_err(|_| config("the idempotency key is not a valid header value"))?;
    headers.insert(HeaderName::from_static(IDEMPOTENCY_KEY_HEADER), key);

    Ok(PreparedRequest {
        method,
        url,
        headers,
        body,
        timeout_ms: binding.timeout_ms,
        callback_url_field: None,
        oauth,
        tls_profile: options.tls_profile.clone(),
    })
}

/// `args` plus, for each `{{_secret.KEY}}` of `template`, the string value
/// of KEY in `secrets` (the empty string when it has none) under the name
/// `_secret.KEY`, which no parameter can have: the body template's
/// placeholders are then all filled by one pass.
fn with_secrets(
    template: &str,
    args: &Map<String, Value>,
    secrets: &SecretValues,
) -> Result<Map<String, Value>, HttpToolError> {
    let mut out = args.clone();
    let pieces = split_placeholders(template)
        .map_err(|_| config("a `{{` placeholder of the body template is not closed"))?;
    for piece in pieces {
        if let TemplatePiece::Placeholder { inner, .. } = piece
            && let Some(key) = belay_proto::wire::secret_placeholder_name(inner)
        {
            let value = secrets.get(key).unwrap_or_default();
            out.insert(inner.to_owned(), Value::String(value.to_owned()));
        }
    }
    Ok(out)
}

/// `text` with its `{{config.NAME}}` placeholders resolved from `values`
/// (and, given `secrets`, its `{{_secret.KEY}}` from them).
fn resolve_config(
    text: &str,
    values: &ConfigValues,
    secrets: Option<&SecretValues>,
) -> Result<String, HttpToolError> {
    let lookup = |name: &str| values.get(name);
    match secrets {
        Some(secrets) => placeholders::resolve_with_secrets(text, lookup, secrets),
        None => placeholders::resolve(text, lookup),
    }
    .map_err(|e| match e {
        PlaceholderError::Missing(name) => HttpToolError::Unconfigured {
            name,
            env: placeholders::ENV_PREFIX,
        },
        PlaceholderError::Unsupported(p) => config(format!("placeholder `{p}` is not supported")),
    })
}

/// Adds the header `name: value`, its placeholders resolved (with
/// `secrets`, `{{_secret.KEY}}` too: only a tool's own headers take them);
/// a value from configuration is marked sensitive. Errors never echo the
/// value.
fn insert_header(
    headers: &mut HeaderMap,
    name: &str,
    value: &str,
    values: &ConfigValues,
    secrets: Option<&SecretValues>,
) -> Result<(), HttpToolError> {
    let header = HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| config(format!("invalid header name {name:?}")))?;
    let configured = placeholders::has_placeholder(value);
    let text = if configured {
        resolve_config(value, values, secrets)?
    } else {
        value.to_owned()
    };
    let mut value = HeaderValue::from_str(&text)
        .map_err(|_| config(format!("invalid value for header {header}")))?;
    // Binding headers often carry credentials even without a placeholder.
    value.set_sensitive(true);
    headers.insert(header, value);
    Ok(())
}

/// Adds the headers of `auth` (RFC 6750 §2.1 for bearer tokens); for
/// `oauth2_client`, the resolved credentials the token is fetched with.
fn apply_auth(
    auth: &HttpAuth,
    headers: &mut HeaderMap,
    values: &ConfigValues,
) -> Result<Option<ClientCredentials>, HttpToolError> {
    match auth {
        HttpAuth::None => {}
        HttpAuth::Bearer { token } => {
            let token = resolve_config(token, values, None)?;
            insert_header(
                headers,
                AUTHORIZATION.as_str(),
                &format!("Bearer {token}"),
                values,
                None,
            )?;
        }
        HttpAuth::ApiKey { header_name, key } => {
            insert_header(headers, header_name, key, values, None)?;
        }
        HttpAuth::Custom { headers: custom } => {
            for (name, value) in custom {
                insert_header(headers, name, value, values, None)?;
            }
        }
        HttpAuth::Oauth2Client {
            token_url,
            client_id,
            client_secret,
            scopes,
        } => {
            let token_url = Url::parse(token_url)
                .ok()
                .filter(|u| matches!(u.scheme(), "http" | "https"))
                .ok_or_else(|| config(format!("invalid token URL {token_url:?}")))?;
            return Ok(Some(ClientCredentials {
                token_url,
                client_id: resolve_config(client_id, values, None)?,
                client_secret: resolve_config(client_secret, values, None)?,
                scopes: scopes.clone(),
                resource: None,
                auth: crate::oauth2::ClientAuth::Basic,
            }));
        }
    }
    Ok(None)
}

/// The parameter names of the `{{param}}` placeholders of `text`.
fn param_names(text: &str) -> Result<Vec<&str>, HttpToolError> {
    let pieces = split_placeholders(text)
        .map_err(|_| config("a `{{` placeholder of the binding is not closed"))?;
    Ok(pieces
        .into_iter()
        .filter_map(|p| match p {
            TemplatePiece::Placeholder { inner, .. } => Some(inner),
            TemplatePiece::Text(_) => None,
        })
        .collect())
}

/// The values `param` sends (its key once per value): a lone `{{p}}` sends
/// nothing for an absent or `null` argument and one value per array item;
/// text with placeholders is sent only when every argument it names is
/// there.
fn query_values(
    param: &QueryParam,
    args: &Map<String, Value>,
) -> Result<Vec<String>, HttpToolError> {
    let pieces = split_placeholders(&param.value)
        .map_err(|_| config(format!("query parameter {:?}: unclosed `{{{{`", param.key)))?;
    if let [TemplatePiece::Placeholder { inner, .. }] = pieces.as_slice() {
        return Ok(args.get(*inner).map(value_texts).unwrap_or_default());
    }
    let mut out = String::new();
    for piece in pieces {
        match piece {
            TemplatePiece::Text(t) => out.push_str(t),
            TemplatePiece::Placeholder { inner, .. } => match args.get(inner) {
                None | Some(Value::Null) => return Ok(Vec::new()),
                Some(value) => out.push_str(&value_text(value)),
            },
        }
    }
    Ok(vec![out])
}

/// How a body is encoded: its type, the `body_schema` its JSON value must
/// satisfy, and the root element of an XML body made from the arguments.
struct BodyShape<'a> {
    body_type: BodyType,
    schema: Option<&'a Value>,
    xml_root: &'a str,
}

impl BodyShape<'_> {
    /// `value` authored from and checked against the body schema, if any.
    fn checked(&self, value: Value) -> Result<Value, HttpToolError> {
        match self.schema {
            Some(schema) => body_schema::author_and_check(schema, value),
            None => Ok(value),
        }
    }
}

/// The body `template` filled from `args` (see [`BodyType`]).
fn render_body(
    template: &str,
    shape: &BodyShape<'_>,
    args: &Map<String, Value>,
) -> Result<Vec<u8>, HttpToolError> {
    match shape.body_type {
        BodyType::Json => {
            let parsed: Value = serde_json::from_str(template)
                .map_err(|e| config(format!("the body template is not JSON: {e}")))?;
            let filled = shape.checked(fill_json(&parsed, args)?)?;
            serde_json::to_vec(&filled).map_err(|e| config(format!("cannot encode the body: {e}")))
        }
        BodyType::Form => fill_text(template, args, form_encode).map(String::into_bytes),
        BodyType::Text => fill_text(template, args, str::to_owned).map(String::into_bytes),
        BodyType::Xml => {
            let filled = fill_text(template, args, xml_escape)?;
            xml::check_well_formed(&filled).map_err(|e| {
                config(format!(
                    "the XML body template, filled in, is not well-formed: {e}"
                ))
            })?;
            Ok(filled.into_bytes())
        }
    }
}

/// `text` escaped for XML text or an attribute value.
fn xml_escape(text: &str) -> String {
    quick_xml::escape::escape(text).into_owned()
}

/// A JSON template's value filled: a string that is one placeholder
/// becomes the argument (`null` when absent), other strings get the
/// arguments as text.
fn fill_json(template: &Value, args: &Map<String, Value>) -> Result<Value, HttpToolError> {
    Ok(match template {
        Value::String(text) => {
            let pieces = split_placeholders(text)
                .map_err(|_| config("a `{{` placeholder of the body template is not closed"))?;
            if let [TemplatePiece::Placeholder { inner, .. }] = pieces.as_slice() {
                args.get(*inner).cloned().unwrap_or(Value::Null)
            } else {
                Value::String(fill_text(text, args, str::to_owned)?)
            }
        }
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|item| fill_json(item, args))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| Ok((k.clone(), fill_json(v, args)?)))
                .collect::<Result<_, HttpToolError>>()?,
        ),
        other => other.clone(),
    })
}

/// `text` with each `{{param}}` replaced by `encode` of the argument as
/// text (absent or `null`: empty).
fn fill_text(
    text: &str,
    args: &Map<String, Value>,
    encode: impl Fn(&str) -> String,
) -> Result<String, HttpToolError> {
    let pieces = split_placeholders(text)
        .map_err(|_| config("a `{{` placeholder of the body template is not closed"))?;
    let mut out = String::with_capacity(text.len());
    for piece in pieces {
        match piece {
            TemplatePiece::Text(t) => out.push_str(t),
            TemplatePiece::Placeholder { inner, .. } => {
                let value = args
                    .get(inner)
                    .filter(|v| !v.is_null())
                    .map(value_text)
                    .unwrap_or_default();
                out.push_str(&encode(&value));
            }
        }
    }
    Ok(out)
}

/// The remaining arguments as a `body_mode: auto` body.
fn encode_body(
    shape: &BodyShape<'_>,
    remaining: Option<Map<String, Value>>,
    arguments: &Value,
) -> Result<Vec<u8>, HttpToolError> {
    let remaining = match (shape.schema, remaining) {
        (Some(_), Some(map)) => match shape.checked(Value::Object(map))? {
            Value::Object(map) => Some(map),
            _ => None,
        },
        (_, remaining) => remaining,
    };
    match (shape.body_type, remaining) {
        (BodyType::Form, Some(map)) => {
            let pairs: Vec<String> = map
                .iter()
                .flat_map(|(key, value)| {
                    value_texts(value)
                        .into_iter()
                        .map(move |text| format!("{}={}", form_encode(key), form_encode(&text)))
                })
                .collect();
            Ok(pairs.join("&").into_bytes())
        }
        (BodyType::Form | BodyType::Text | BodyType::Xml, None) => Err(config(format!(
            "arguments of a form, text or XML body must be a JSON object, got {}",
            json_kind(arguments)
        ))),
        (BodyType::Xml, Some(map)) => xml::encode(shape.xml_root, &Value::Object(map))
            .map_err(|e| config(format!("the arguments cannot be sent as XML: {e}"))),
        // The parser requires a template for text; an old spec might not.
        (BodyType::Text, Some(_)) => Err(config("a text body needs a `body_template`")),
        (BodyType::Json, remaining) => {
            let value = match remaining {
                Some(map) => Value::Object(map),
                None => shape.checked(arguments.clone())?,
            };
            serde_json::to_vec(&value)
                .map_err(|e| config(format!("cannot encode the arguments: {e}")))
        }
    }
}

/// Replaces each `{name}` in `endpoint` with the percent-encoded argument and
/// removes that argument from `remaining`.
fn fill_path_params(
    endpoint: &str,
    remaining: &mut Option<Map<String, Value>>,
) -> Result<String, HttpToolError> {
    let mut out = String::with_capacity(endpoint.len());
    let mut rest = endpoint;
    while let Some(open) = rest.find('{') {
        let Some(len) = rest[open..].find('}') else {
            break;
        };
        let name = &rest[open + 1..open + len];
        out.push_str(&rest[..open]);
        rest = &rest[open + len + 1..];
        let Some(args) = remaining.as_mut() else {
            return Err(config(format!(
                "path parameter {{{name}}} needs object arguments"
            )));
        };
        let value = args
            .remove(name)
            .ok_or_else(|| config(format!("missing path parameter {{{name}}}")))?;
        let text = match &value {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            other => {
                return Err(config(format!(
                    "path parameter {{{name}}} must be a string, number or boolean, got {}",
                    json_kind(other)
                )));
            }
        };
        // URL parsing resolves dot segments, and `%2E` counts as a dot, so
        // `..` would climb out of the endpoint's path whatever the encoding.
        if text.is_empty() || text == "." || text == ".." {
            return Err(config(format!(
                "path parameter {{{name}}} must not be {text:?}"
            )));
        }
        out.extend(utf8_percent_encode(&text, PATH_SEGMENT));
    }
    out.push_str(rest);
    Ok(out)
}

fn resolve_endpoint(endpoint: &str, base_url: Option<&str>) -> Result<Url, HttpToolError> {
    let lower = endpoint.trim_start().to_ascii_lowercase();
    let full = if lower.starts_with("http://") || lower.starts_with("https://") {
        endpoint.trim().to_owned()
    } else {
        let Some(base) = base_url else {
            return Err(config(format!(
                "endpoint {endpoint:?} is a path and the worker has no HTTP base URL \
                 (set --http-base-url / BELAY_HTTP_BASE_URL)"
            )));
        };
        // Plain concatenation, not RFC 3986 resolution, so that a base URL
        // with a path (`http://host/api`) keeps it.
        format!(
            "{}/{}",
            base.trim().trim_end_matches('/'),
            endpoint.trim().trim_start_matches('/')
        )
    };
    let url = Url::parse(&full).map_err(|e| config(format!("invalid URL {full:?}: {e}")))?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(config(format!("unsupported URL scheme in {full:?}")));
    }
    Ok(url)
}

/// The texts one argument sends as query or form values: none for `null`,
/// one per item (nulls left out) for an array, else one.
fn value_texts(value: &Value) -> Vec<String> {
    match value {
        Value::Null => Vec::new(),
        Value::Array(items) => items
            .iter()
            .filter(|item| !item.is_null())
            .map(value_text)
            .collect(),
        other => vec![value_text(other)],
    }
}

/// An argument as text: a string as it is, anything else as JSON text.
fn value_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;

    fn prepare(
        binding: &HttpBinding,
        arguments: &Value,
        base_url: Option<&str>,
    ) -> Result<PreparedRequest, HttpToolError> {
        prepare_http(
            "t",
            binding,
            arguments,
            "k",
            base_url,
            &ConfigValues::default(),
            &SecretValues::default(),
        )
    }

    fn binding(endpoint: &str, method: &str) -> HttpBinding {
        HttpBinding {
            endpoint: endpoint.to_owned(),
            method: method.to_owned(),
            headers: BTreeMap::new(),
            timeout_ms: 1000,
            request: Default::default(),
        }
    }

    #[test]
    fn path_params_are_encoded_and_removed() {
        let req = prepare(
            &binding("/users/{id}/files/{name}", "GET"),
            &json!({"id": "a/b c", "name": 7, "q": "x"}),
            Some("http://h:1/api/"),
        )
        .unwrap();
        assert_eq!(
            req.url().as_str(),
            "http://h:1/api/users/a%2Fb%20c/files/7?q=x"
        );
    }

    #[test]
    fn dot_segments_and_objects_are_refused_as_path_params() {
        for value in [json!(".."), json!("."), json!({"a": 1}), json!(null)] {
            let err = prepare(
                &binding("http://h/u/{id}", "GET"),
                &json!({"id": value}),
                None,
            )
            .unwrap_err();
            assert_eq!(err.class(), FailureClass::Rejected, "{err}");
        }
    }

    #[test]
    fn relative_endpoint_without_base_is_a_rejected_config_error() {
        let err = prepare(&binding("/x", "GET"), &json!({}), None).unwrap_err();
        assert!(matches!(err, HttpToolError::Config(_)));
        assert_eq!(err.class(), FailureClass::Rejected);
    }

    #[test]
    fn missing_path_param_is_rejected() {
        let err = prepare(&binding("http://h/u/{id}", "POST"), &json!({}), None).unwrap_err();
        assert!(
            err.to_string().contains("missing path parameter {id}"),
            "{err}"
        );
    }

    #[test]
    fn query_arrays_repeat_and_nulls_are_left_out() {
        let req = prepare(
            &binding("http://h/s?fixed=1", "delete"),
            &json!({"tag": ["a", "b"], "n": 2, "flag": true, "none": null}),
            None,
        )
        .unwrap();
        assert_eq!(req.method(), Method::DELETE);
        // serde_json's map order depends on its features; compare as a set.
        let mut pairs: Vec<String> = req
            .url()
            .query_pairs()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        assert_eq!(pairs.first().map(String::as_str), Some("fixed=1"));
        pairs.sort();
        assert_eq!(pairs, ["fixed=1", "flag=true", "n=2", "tag=a", "tag=b"]);
        assert!(req.body().is_none());
    }

    #[test]
    fn body_mode_none_sends_neither_body_nor_extra_query() {
        let mut b = binding("http://h/x", "POST");
        b.request.body_mode = BodyMode::None;
        let req = prepare(&b, &json!({"a": 1}), None).unwrap();
        assert!(req.body().is_none());
        assert_eq!(req.url().query(), None);
        assert!(req.headers().get(CONTENT_TYPE).is_none());
    }

    #[test]
    fn templates_see_path_parameters_too() {
        let mut b = binding("http://h/u/{id}", "GET");
        b.request.query_params = vec![QueryParam {
            key: "ref".into(),
            value: "u-{{id}}".into(),
        }];
        let req = prepare(&b, &json!({"id": 7, "x": "y"}), None).unwrap();
        assert_eq!(req.url().as_str(), "http://h/u/7?ref=u-7&x=y");
    }

    #[test]
    fn configured_header_values_are_sensitive() {
        let mut b = binding("http://h/x", "GET");
        b.headers.insert("X-Key".into(), "{{config.K}}".into());
        let values = ConfigValues::new(BTreeMap::from([("K".to_owned(), "v".to_owned())]));
        let req = prepare_http(
            "t",
            &b,
            &json!({}),
            "k",
            None,
            &values,
            &SecretValues::default(),
        )
        .unwrap();
        assert!(req.headers()["x-key"].is_sensitive());
        assert_eq!(req.headers()["x-key"], "v");
    }

    #[test]
    fn vault_values_fill_headers_and_the_body_template_only() {
        let mut b = binding("http://h/x", "POST");
        b.headers
            .insert("X-OTP-Token".into(), "{{_secret.txn_otp}}".into());
        b.headers
            .insert("X-Both".into(), "{{config.K}}:{{_secret.txn_otp}}".into());
        b.headers
            .insert("X-Gone".into(), "[{{_secret.gone}}]".into());
        b.request.body_template =
            Some(r#"{"otp": "{{_secret.txn_otp}}", "note": "otp={{_secret.txn_otp}};{{_secret.gone}}", "id": "{{id}}"}"#.into());
        // A query value is never filled from the vault.
        b.request.query_params = vec![QueryParam {
            key: "otp".into(),
            value: "{{_secret.txn_otp}}".into(),
        }];
        let values = ConfigValues::new(BTreeMap::from([("K".to_owned(), "v".to_owned())]));
        let secrets = SecretValues::new(BTreeMap::from([(
            "txn_otp".to_owned(),
            "otp-981".to_owned(),
        )]));
        let args = json!({"id": 4});
        let req = prepare_http("t", &b, &args, "k", None, &values, &secrets).unwrap();
        assert_eq!(req.headers()["x-otp-token"], "otp-981");
        assert!(req.headers()["x-otp-token"].is_sensitive());
        assert_eq!(req.headers()["x-both"], "v:otp-981");
        assert_eq!(req.headers()["x-gone"], "[]");
        let body: Value = serde_json::from_slice(req.body().unwrap()).unwrap();
        assert_eq!(
            body,
            json!({"otp": "otp-981", "note": "otp=otp-981;", "id": 4})
        );
        assert_eq!(req.url().query().unwrap_or_default(), "");
        // Before dispatch (no values yet): every reference is empty, never
        // the placeholder.
        let before =
            prepare_http("t", &b, &args, "k", None, &values, &SecretValues::default()).unwrap();
        assert_eq!(before.headers()["x-otp-token"], "");
        let body: Value = serde_json::from_slice(before.body().unwrap()).unwrap();
        assert_eq!(body, json!({"otp": "", "note": "otp=;", "id": 4}));
        // Auth settings take none.
        b.request.auth = HttpAuth::Bearer {
            token: "{{_secret.txn_otp}}".into(),
        };
        assert!(matches!(
            prepare_http("t", &b, &args, "k", None, &values, &secrets),
            Err(HttpToolError::Config(m)) if !m.contains("otp-981")
        ));
    }

    #[test]
    fn status_classes() {
        let status = |method: &str, status: u16| {
            HttpToolError::Status {
                method: method.to_owned(),
                status,
                body: String::new(),
            }
            .class()
        };
        assert_eq!(status("POST", 503), FailureClass::MayHaveActed);
        assert_eq!(status("DELETE", 500), FailureClass::MayHaveActed);
        assert_eq!(status("GET", 503), FailureClass::NotSent);
        assert_eq!(status("GET", 429), FailureClass::NotSent);
        assert_eq!(status("POST", 429), FailureClass::NotSent);
        assert_eq!(status("POST", 404), FailureClass::Rejected);
        assert_eq!(status("GET", 400), FailureClass::Rejected);
    }

    #[test]
    fn body_values() {
        assert_eq!(body_value(b""), Value::Null);
        assert_eq!(body_value(b" \n"), Value::Null);
        assert_eq!(body_value(b"{\"a\":1}"), json!({"a": 1}));
        assert_eq!(body_value(b"plain text"), json!("plain text"));
    }
}
