//! Where the token endpoint of an OAuth-protected MCP server is: found
//! from the server's Protected Resource Metadata (RFC 9728) and its
//! authorization server's metadata (RFC 8414), as the MCP authorization
//! specification (2025-06-18 and later) asks of a client.
//!
//! [`Discovery::discover`], for a resource (the MCP endpoint's URL):
//!
//! 1. The protected-resource metadata URL: the `resource_metadata`
//!    parameter of the server's `WWW-Authenticate: Bearer` challenge
//!    ([`Challenge::parse`]) when it has one; else the well-known URIs of
//!    RFC 9728 §3.1 ([`protected_resource_metadata_urls`]): the endpoint's
//!    path inserted after `/.well-known/oauth-protected-resource`, then the
//!    root. A well-known URI that answers with a status other than 2xx is
//!    passed over; an advertised one is not (the server said where).
//! 2. The document's `resource` must be the server's URL (RFC 9728 §3.3;
//!    for the root URI, the origin it was made from also does), compared in
//!    canonical form ([`canonical_resource`]); otherwise nothing in it is
//!    used. Its `authorization_servers` are tried in order, the first
//!    [`MAX_AUTHORIZATION_SERVERS`] only; when none of several is usable,
//!    the error lists each one tried and why
//!    ([`DiscoveryError::NoUsableAuthorizationServer`]).
//! 3. For an issuer, the metadata URLs of RFC 8414 §3.1 and OpenID Connect
//!    Discovery, in the MCP specification's order
//!    ([`authorization_server_metadata_urls`]); the first 2xx answer is
//!    used. Its `issuer` must be the issuer it was asked for (RFC 8414
//!    §3.3), it must have a `token_endpoint`, and when it lists
//!    `grant_types_supported` that must hold `client_credentials`. The
//!    client authenticates with HTTP Basic unless
//!    `token_endpoint_auth_methods_supported` lists only
//!    `client_secret_post` ([`ClientAuth`]).
//! 4. Scopes ([`Discovered::scopes`]): those configured, else the
//!    challenge's `scope`, else the metadata's `scopes_supported`, else
//!    none.
//!
//! Every URL here is chosen by the server, so every fetch goes through the
//! worker's [`NetworkPolicy`] exactly as a tool request does (the resolver
//! checks every address, an IP literal is checked before sending, no
//! redirects, no proxy): a loopback, private or link-local address is
//! refused unless allowlisted. Behind an `https` MCP endpoint an `http`
//! metadata URL or token endpoint is refused (the client secret would go
//! in clear). Answers are read up to [`MAX_METADATA_BYTES`], each fetch
//! within a timeout. Errors ([`DiscoveryError`]) name the URL and what was
//! wrong with it.
//!
//! rmcp 3.11 has discovery too (its `auth` feature), but it brings the
//! `oauth2` crate and its own address policy, which would refuse an
//! authorization server on an allowlisted private network; this module is
//! reqwest, serde and the [`crate::ssrf`] resolver, which tool requests
//! already use.

use std::sync::Arc;
use std::time::Duration;

use reqwest::Url;
use reqwest::header::{ACCEPT, HeaderValue};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::http_util::{CappedRead, error_chain, read_capped};
use crate::oauth2::ClientAuth;
use crate::ssrf::{AddressRefused, NetworkPolicy};

/// Largest metadata document read, in bytes (256 KiB; real ones are a few
/// KiB).
pub const MAX_METADATA_BYTES: usize = 256 * 1024;

/// Most authorization servers tried from one protected-resource metadata
/// document, in its order; the rest are ignored. Each costs up to three
/// metadata fetches ([`authorization_server_metadata_urls`]), made while
/// other requests to the same MCP server wait for discovery, and real
/// documents list one or two.
pub const MAX_AUTHORIZATION_SERVERS: usize = 4;

/// Longest text kept of one authorization server's failure in
/// [`DiscoveryError::NoUsableAuthorizationServer`]'s message, in chars.
const MAX_FAILURE_CHARS: usize = 300;

/// How long one metadata fetch may take, connection included, in ms.
pub const METADATA_TIMEOUT_MS: u64 = 10_000;

/// The RFC 9728 well-known URI suffix.
const PROTECTED_RESOURCE: &str = "oauth-protected-resource";
/// The RFC 8414 well-known URI suffix.
const AUTHORIZATION_SERVER: &str = "oauth-authorization-server";
/// The OpenID Connect Discovery 1.0 well-known URI suffix.
const OPENID_CONFIGURATION: &str = "openid-configuration";

/// The parameters of a `WWW-Authenticate: Bearer` challenge (RFC 6750 §3,
/// RFC 9728 §5.1) that discovery uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Challenge {
    /// `resource_metadata`: where the protected-resource metadata is.
    pub resource_metadata: Option<String>,
    /// `scope`: space-separated scopes the resource asks for.
    pub scope: Option<String>,
    /// `error`, e.g. `invalid_token`.
    pub error: Option<String>,
}

impl Challenge {
    /// The `Bearer` challenge of a `WWW-Authenticate` value (RFC 9110
    /// §11.6.1: challenges and their `name=value` or `name="quoted"`
    /// parameters, separated by commas; the scheme in any case). `None`
    /// when the value has no `Bearer` challenge.
    pub fn parse(header: &str) -> Option<Self> {
        let mut challenge = Self::default();
        let (mut found, mut in_bearer) = (false, false);
        let mut rest = header;
        loop {
            rest = rest.trim_start_matches([',', ' ', '\t']);
            if rest.is_empty() {
                break;
            }
            let end = rest.find(|c: char| !is_tchar(c)).unwrap_or(rest.len());
            if end == 0 {
                // Not a token: nothing more can be read reliably.
                break;
            }
            let name = &rest[..end];
            let after = rest[end..].trim_start_matches([' ', '\t']);
            match after.strip_prefix('=') {
                Some(value) if !value.starts_with('=') => {
                    let value = value.trim_start_matches([' ', '\t']);
                    let (value, remaining) = match value.strip_prefix('"') {
                        Some(quoted) => unquote(quoted),
                        None => {
                            let end = value.find([',', ' ', '\t']).unwrap_or(value.len());
                            (value[..end].to_owned(), &value[end..])
                        }
                    };
                    if in_bearer {
                        let slot = match name.to_ascii_lowercase().as_str() {
                            "resource_metadata" => Some(&mut challenge.resource_metadata),
                            "scope" => Some(&mut challenge.scope),
                            "error" => Some(&mut challenge.error),
                            _ => None,
                        };
                        if let Some(slot) = slot
                            && slot.is_none()
                        {
                            *slot = Some(value);
                        }
                    }
                    rest = remaining;
                }
                _ => {
                    // A scheme (or a token68, whose `=` padding is skipped
                    // with it): a new challenge begins.
                    if in_bearer {
                        break;
                    }
                    in_bearer = name.eq_ignore_ascii_case("bearer");
                    found |= in_bearer;
                    rest = after.trim_start_matches('=');
                }
            }
        }
        found.then_some(challenge)
    }
}

/// RFC 9110 `tchar`.
fn is_tchar(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c)
}

/// A quoted string's value (after its opening quote) and what follows its
/// closing quote; backslash escapes the next character. Unterminated: the
/// rest is the value.
fn unquote(text: &str) -> (String, &str) {
    let mut value = String::new();
    let mut chars = text.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return (value, &text[i + 1..]),
            '\\' => {
                if let Some((_, escaped)) = chars.next() {
                    value.push(escaped);
                }
            }
            c => value.push(c),
        }
    }
    (value, "")
}

/// The canonical URI of a resource (MCP authorization, "Canonical Server
/// URI"; RFC 8707 §2): scheme and host in lower case (as [`Url`] keeps
/// them), no fragment, and no `/` after the host when the path is empty.
/// E.g. `https://MCP.example.com/mcp#x` → `https://mcp.example.com/mcp`,
/// `https://mcp.example.com/` → `https://mcp.example.com`.
pub fn canonical_resource(url: &Url) -> String {
    let mut url = url.clone();
    url.set_fragment(None);
    let text = url.to_string();
    if url.path() == "/" && url.query().is_none() {
        text.trim_end_matches('/').to_owned()
    } else {
        text
    }
}

/// `base` with its path replaced by `/.well-known/{suffix}` followed by
/// `path` (without a terminating `/`, RFC 8414 §3.1), no query, no
/// fragment.
fn inserted(base: &Url, suffix: &str, path: &str) -> Url {
    let mut url = base.clone();
    url.set_fragment(None);
    url.set_query(None);
    url.set_path(&format!(
        "/.well-known/{suffix}{}",
        path.trim_end_matches('/')
    ));
    url
}

/// The well-known URIs of a resource's protected-resource metadata, in the
/// order they are tried (RFC 9728 §3.1, MCP authorization): the resource's
/// path (and query) inserted after `/.well-known/oauth-protected-resource`,
/// then the root. Each with the resource identifier it stands for (the
/// value the document's `resource` must have, RFC 9728 §3.3).
pub fn protected_resource_metadata_urls(resource: &Url) -> Vec<(Url, String)> {
    let mut urls = Vec::new();
    let path = resource.path().trim_end_matches('/');
    if !path.is_empty() {
        let mut url = inserted(resource, PROTECTED_RESOURCE, path);
        url.set_query(resource.query());
        urls.push((url, canonical_resource(resource)));
    }
    let mut origin = resource.clone();
    origin.set_path("/");
    origin.set_query(None);
    urls.push((
        inserted(resource, PROTECTED_RESOURCE, ""),
        canonical_resource(&origin),
    ));
    urls
}

/// The metadata URLs of an authorization server, in the order they are
/// tried (MCP authorization 2025-11-25, "Authorization Server Metadata
/// Discovery"). Issuer `https://auth.example.com/tenant`:
/// `/.well-known/oauth-authorization-server/tenant` (RFC 8414 §3.1),
/// `/.well-known/openid-configuration/tenant`, then
/// `/tenant/.well-known/openid-configuration` (OpenID Connect Discovery
/// 1.0 §4). Without a path: the first two without it.
pub fn authorization_server_metadata_urls(issuer: &Url) -> Vec<Url> {
    let path = issuer.path().trim_end_matches('/');
    let mut urls = vec![
        inserted(issuer, AUTHORIZATION_SERVER, path),
        inserted(issuer, OPENID_CONFIGURATION, path),
    ];
    if !path.is_empty() {
        let mut appended = issuer.clone();
        appended.set_fragment(None);
        appended.set_query(None);
        appended.set_path(&format!("{path}/.well-known/{OPENID_CONFIGURATION}"));
        urls.push(appended);
    }
    urls
}

/// What discovery found for one resource: where and how to get its tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovered {
    /// The protected-resource metadata document that was used.
    pub resource_metadata_url: Url,
    /// The authorization server's issuer identifier.
    pub issuer: String,
    /// Its token endpoint.
    pub token_url: Url,
    /// How the client authenticates there.
    pub auth: ClientAuth,
    /// Space-separated scopes to ask for (see the module docs for the
    /// order); empty: no `scope` parameter.
    pub scopes: String,
    /// The resource's canonical URI, the token request's RFC 8707
    /// `resource`.
    pub resource: String,
}

/// Why discovery found no usable token endpoint. Every variant names the
/// URL it is about; none holds a secret or a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiscoveryError {
    /// A URL from the server is not an absolute `http(s)` URL.
    #[error("OAuth discovery: {what} `{url}` is not an absolute http(s) URL")]
    BadUrl {
        /// Which URL it is, e.g. "resource_metadata".
        what: &'static str,
        /// The value as given.
        url: String,
    },
    /// An `http` URL behind an `https` MCP endpoint.
    #[error(
        "OAuth discovery: {url} is not https, and the MCP server is: the client secret \
         and tokens would travel in clear"
    )]
    NotHttps {
        /// The URL.
        url: String,
    },
    /// The worker's network policy refused the address (nothing was sent).
    #[error("OAuth discovery: {url}: {refused}")]
    Refused {
        /// The URL.
        url: String,
        /// Which address and range, and the flag that would allow it.
        refused: AddressRefused,
    },
    /// The request failed: connection, timeout, or reading the answer.
    #[error("OAuth discovery: fetching {url} failed: {message}")]
    Fetch {
        /// The URL.
        url: String,
        /// The transport error.
        message: String,
    },
    /// No metadata where it was looked for: every URL answered with a
    /// status other than 2xx.
    #[error("OAuth discovery: no {what} metadata: {}", list_tried(.tried))]
    NoMetadata {
        /// "protected-resource" or "authorization server".
        what: &'static str,
        /// Each URL tried and its status.
        tried: Vec<(String, u16)>,
    },
    /// An answer larger than [`MAX_METADATA_BYTES`].
    #[error("OAuth discovery: {url} answered with more than {limit} bytes")]
    TooLarge {
        /// The URL.
        url: String,
        /// The limit, in bytes.
        limit: usize,
    },
    /// An answer that is not a JSON object of the expected shape.
    #[error("OAuth discovery: {url} is not valid metadata: {message}")]
    BadJson {
        /// The URL.
        url: String,
        /// The parse error.
        message: String,
    },
    /// The protected-resource metadata is for another resource (RFC 9728
    /// §3.3): none of it is used.
    #[error(
        "OAuth discovery: the protected-resource metadata at {url} is for `{resource}`, \
         not `{expected}` (RFC 9728 §3.3)"
    )]
    ResourceMismatch {
        /// The metadata URL.
        url: String,
        /// Its `resource`.
        resource: String,
        /// The resource the worker connects to.
        expected: String,
    },
    /// The protected-resource metadata names no authorization server.
    #[error(
        "OAuth discovery: the protected-resource metadata at {url} has no `authorization_servers`"
    )]
    NoAuthorizationServers {
        /// The metadata URL.
        url: String,
    },
    /// Several authorization servers are listed and none of those tried
    /// (the first [`MAX_AUTHORIZATION_SERVERS`]) is usable. When only one
    /// is listed, its own error is returned instead.
    #[error(
        "OAuth discovery: none of the {} authorization servers tried (of {listed} listed in the \
         protected-resource metadata at {url}; at most {MAX_AUTHORIZATION_SERVERS} are tried) \
         is usable: {}",
        failures.len(),
        list_failures(.failures)
    )]
    NoUsableAuthorizationServer {
        /// The protected-resource metadata URL.
        url: String,
        /// How many authorization servers it lists.
        listed: usize,
        /// Each server tried (its issuer identifier as listed) and why it
        /// is not usable, in the order tried.
        failures: Vec<(String, DiscoveryError)>,
    },
    /// The authorization server metadata is for another issuer (RFC 8414
    /// §3.3): none of it is used.
    #[error(
        "OAuth discovery: the authorization server metadata at {url} has issuer `{issuer}`, \
         not `{expected}` (RFC 8414 §3.3)"
    )]
    IssuerMismatch {
        /// The metadata URL.
        url: String,
        /// Its `issuer`.
        issuer: String,
        /// The issuer the protected resource named.
        expected: String,
    },
    /// The authorization server metadata has no `token_endpoint`.
    #[error("OAuth discovery: the authorization server metadata at {url} has no `token_endpoint`")]
    NoTokenEndpoint {
        /// The metadata URL.
        url: String,
    },
    /// The authorization server does not offer the client-credentials
    /// grant (its `grant_types_supported` lacks `client_credentials`).
    #[error(
        "OAuth discovery: the authorization server at {url} does not support the \
         client_credentials grant (grant_types_supported: {supported:?})"
    )]
    GrantNotSupported {
        /// The metadata URL.
        url: String,
        /// The grants it lists.
        supported: Vec<String>,
    },
    /// The token endpoint accepts no client-secret authentication the
    /// worker has (`client_secret_basic`, `client_secret_post`).
    #[error(
        "OAuth discovery: the authorization server at {url} accepts no client secret \
         (token_endpoint_auth_methods_supported: {supported:?})"
    )]
    AuthMethodNotSupported {
        /// The metadata URL.
        url: String,
        /// The methods it lists.
        supported: Vec<String>,
    },
}

/// Why a server with `oauth` got no access token, or none it accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthorizationError {
    /// The token endpoint could not be discovered.
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
    /// The token endpoint refused or could not be reached.
    #[error(transparent)]
    Token(#[from] crate::oauth2::TokenError),
    /// The MCP server answered 401 to a request that carried an access
    /// token fetched for it just before (after one refresh, and one new
    /// discovery when the endpoint was discovered): the tokens of that
    /// endpoint are not accepted there. The server handled nothing.
    #[error(
        "the MCP server at {resource} refused a fresh access token from {token_url} \
         (HTTP 401{}): it does not accept that endpoint's tokens for this client, \
         scopes or resource",
        challenge_note(.challenge_error.as_deref())
    )]
    TokenRefused {
        /// The MCP endpoint's URL.
        resource: String,
        /// The token endpoint the refused token came from.
        token_url: String,
        /// The `error` of the server's `WWW-Authenticate: Bearer` challenge
        /// (e.g. `invalid_token`), cut to 64 characters; `None` without one.
        challenge_error: Option<String>,
    },
}

/// `, challenge error `code``, or nothing.
fn challenge_note(error: Option<&str>) -> String {
    error
        .map(|e| format!(", challenge error `{e}`"))
        .unwrap_or_default()
}

/// RFC 9728 §2 fields used here.
#[derive(Deserialize)]
struct ProtectedResourceMetadata {
    resource: String,
    #[serde(default)]
    authorization_servers: Vec<String>,
    #[serde(default)]
    scopes_supported: Vec<String>,
}

/// RFC 8414 §2 fields used here.
#[derive(Deserialize)]
struct AuthorizationServerMetadata {
    issuer: String,
    token_endpoint: Option<String>,
    grant_types_supported: Option<Vec<String>>,
    token_endpoint_auth_methods_supported: Option<Vec<String>>,
}

/// A fetch that got an answer: the document, or a status other than 2xx.
enum Fetched<T> {
    Document(T),
    Status(u16),
}

/// Fetches metadata through the worker's network policy. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Discovery {
    http: reqwest::Client,
    policy: Arc<NetworkPolicy>,
    timeout: Duration,
}

impl Discovery {
    /// A client that reaches only what `policy` allows, as tool requests
    /// do, each fetch within [`METADATA_TIMEOUT_MS`].
    ///
    /// # Errors
    /// The HTTP client's error when it cannot be built.
    pub fn new(policy: Arc<NetworkPolicy>) -> Result<Self, reqwest::Error> {
        let http = crate::http_tool::tool_client_builder(&policy).build()?;
        Ok(Self {
            http,
            policy,
            timeout: Duration::from_millis(METADATA_TIMEOUT_MS),
        })
    }

    /// The HTTP client (policy-checked), for the discovered token endpoint.
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// The policy's refusal of a URL whose host is an IP literal (a host
    /// name is checked when it is resolved).
    ///
    /// # Errors
    /// The refusal.
    pub fn check(&self, url: &Url) -> Result<(), AddressRefused> {
        self.policy.check_url(url)
    }

    /// The token endpoint of `resource` (see the module docs), with the
    /// challenge of its 401 answer when it had one, and `scopes` the
    /// configured ones (space-separated; empty: none configured).
    ///
    /// # Errors
    /// [`DiscoveryError`], naming the URL and what was wrong.
    pub async fn discover(
        &self,
        resource: &Url,
        challenge: Option<&Challenge>,
        scopes: &str,
    ) -> Result<Discovered, DiscoveryError> {
        let expected = canonical_resource(resource);
        let https = resource.scheme() == "https";
        let advertised = challenge
            .and_then(|c| c.resource_metadata.as_deref())
            .map(str::trim)
            .filter(|u| !u.is_empty());
        let (metadata_url, metadata) = match advertised {
            Some(text) => {
                let url = Url::parse(text)
                    .or_else(|_| resource.join(text))
                    .ok()
                    .filter(is_http)
                    .ok_or_else(|| DiscoveryError::BadUrl {
                        what: "resource_metadata",
                        url: text.to_owned(),
                    })?;
                match self.fetch::<ProtectedResourceMetadata>(&url, https).await? {
                    Fetched::Document(metadata) => {
                        check_resource(&url, &metadata.resource, &[&expected])?;
                        (url, metadata)
                    }
                    Fetched::Status(status) => {
                        return Err(DiscoveryError::NoMetadata {
                            what: "protected-resource",
                            tried: vec![(url.to_string(), status)],
                        });
                    }
                }
            }
            None => {
                let mut tried = Vec::new();
                let mut found = None;
                for (url, stands_for) in protected_resource_metadata_urls(resource) {
                    match self.fetch::<ProtectedResourceMetadata>(&url, https).await? {
                        Fetched::Document(metadata) => {
                            check_resource(&url, &metadata.resource, &[&expected, &stands_for])?;
                            found = Some((url, metadata));
                            break;
                        }
                        Fetched::Status(status) => tried.push((url.to_string(), status)),
                    }
                }
                found.ok_or(DiscoveryError::NoMetadata {
                    what: "protected-resource",
                    tried,
                })?
            }
        };
        if metadata.authorization_servers.is_empty() {
            return Err(DiscoveryError::NoAuthorizationServers {
                url: metadata_url.to_string(),
            });
        }
        let listed = metadata.authorization_servers.len();
        if listed > MAX_AUTHORIZATION_SERVERS {
            tracing::warn!(
                resource_metadata = %metadata_url,
                listed,
                tried = MAX_AUTHORIZATION_SERVERS,
                "the protected-resource metadata lists more authorization servers than are tried"
            );
        }
        let mut failures = Vec::new();
        for issuer in metadata
            .authorization_servers
            .iter()
            .take(MAX_AUTHORIZATION_SERVERS)
        {
            match self.authorization_server(issuer, https).await {
                Ok((token_url, auth)) => {
                    let scopes = [
                        scopes.trim().to_owned(),
                        challenge
                            .and_then(|c| c.scope.as_deref())
                            .unwrap_or_default()
                            .trim()
                            .to_owned(),
                        metadata.scopes_supported.join(" "),
                    ]
                    .into_iter()
                    .find(|s| !s.is_empty())
                    .unwrap_or_default();
                    return Ok(Discovered {
                        resource_metadata_url: metadata_url,
                        issuer: issuer.clone(),
                        token_url,
                        auth,
                        scopes,
                        resource: expected,
                    });
                }
                Err(e) => {
                    tracing::warn!(issuer, error = %e, "authorization server not usable");
                    failures.push((issuer.clone(), e));
                }
            }
        }
        // One server: its own error says everything, typed as it is.
        if listed == 1
            && let Some((_, error)) = failures.pop()
        {
            return Err(error);
        }
        Err(DiscoveryError::NoUsableAuthorizationServer {
            url: metadata_url.to_string(),
            listed,
            failures,
        })
    }

    /// The token endpoint of the authorization server `issuer` and how to
    /// authenticate there.
    async fn authorization_server(
        &self,
        issuer: &str,
        https: bool,
    ) -> Result<(Url, ClientAuth), DiscoveryError> {
        let bad = || DiscoveryError::BadUrl {
            what: "authorization server",
            url: issuer.to_owned(),
        };
        let issuer_url = Url::parse(issuer).map_err(|_| bad())?;
        // RFC 8414 §2: an issuer has no query and no fragment.
        if !is_http(&issuer_url) || issuer_url.query().is_some() || issuer_url.fragment().is_some()
        {
            return Err(bad());
        }
        let mut tried = Vec::new();
        for url in authorization_server_metadata_urls(&issuer_url) {
            let metadata = match self
                .fetch::<AuthorizationServerMetadata>(&url, https)
                .await?
            {
                Fetched::Document(metadata) => metadata,
                Fetched::Status(status) => {
                    tried.push((url.to_string(), status));
                    continue;
                }
            };
            let at = url.to_string();
            if Url::parse(&metadata.issuer).ok().as_ref() != Some(&issuer_url) {
                return Err(DiscoveryError::IssuerMismatch {
                    url: at,
                    issuer: metadata.issuer,
                    expected: issuer.to_owned(),
                });
            }
            if let Some(grants) = metadata.grant_types_supported
                && !grants.iter().any(|g| g == "client_credentials")
            {
                return Err(DiscoveryError::GrantNotSupported {
                    url: at,
                    supported: grants,
                });
            }
            let auth = match metadata.token_endpoint_auth_methods_supported {
                // RFC 8414 §2: absent means `client_secret_basic`.
                None => ClientAuth::Basic,
                Some(methods) if methods.iter().any(|m| m == "client_secret_basic") => {
                    ClientAuth::Basic
                }
                Some(methods) if methods.iter().any(|m| m == "client_secret_post") => {
                    ClientAuth::Post
                }
                Some(methods) => {
                    return Err(DiscoveryError::AuthMethodNotSupported {
                        url: at,
                        supported: methods,
                    });
                }
            };
            let Some(endpoint) = metadata.token_endpoint.filter(|e| !e.trim().is_empty()) else {
                return Err(DiscoveryError::NoTokenEndpoint { url: at });
            };
            let token_url = Url::parse(&endpoint).ok().filter(is_http).ok_or_else(|| {
                DiscoveryError::BadUrl {
                    what: "token_endpoint",
                    url: endpoint.clone(),
                }
            })?;
            if https && token_url.scheme() != "https" {
                return Err(DiscoveryError::NotHttps {
                    url: token_url.to_string(),
                });
            }
            tracing::info!(
                issuer,
                metadata = %url,
                token_endpoint = %token_url,
                "OAuth authorization server discovered"
            );
            return Ok((token_url, auth));
        }
        Err(DiscoveryError::NoMetadata {
            what: "authorization server",
            tried,
        })
    }

    /// GETs `url` as JSON through the policy, reading at most
    /// [`MAX_METADATA_BYTES`]; a status other than 2xx is
    /// [`Fetched::Status`] (redirects are not followed, so a 3xx is too).
    async fn fetch<T: DeserializeOwned>(
        &self,
        url: &Url,
        https: bool,
    ) -> Result<Fetched<T>, DiscoveryError> {
        let at = || url.to_string();
        if https && url.scheme() != "https" {
            return Err(DiscoveryError::NotHttps { url: at() });
        }
        self.policy
            .check_url(url)
            .map_err(|refused| DiscoveryError::Refused { url: at(), refused })?;
        let failed = |e: reqwest::Error| match crate::ssrf::address_refused(&e) {
            Some(refused) => DiscoveryError::Refused {
                url: at(),
                refused: refused.clone(),
            },
            None => DiscoveryError::Fetch {
                url: at(),
                message: error_chain(&e),
            },
        };
        let mut response = self
            .http
            .get(url.clone())
            .header(ACCEPT, HeaderValue::from_static("application/json"))
            .timeout(self.timeout)
            .send()
            .await
            .map_err(failed)?;
        let status = response.status();
        if !status.is_success() {
            return Ok(Fetched::Status(status.as_u16()));
        }
        let body = read_capped(&mut response, MAX_METADATA_BYTES)
            .await
            .map_err(|e| match e {
                CappedRead::TooLarge(_) => DiscoveryError::TooLarge {
                    url: at(),
                    limit: MAX_METADATA_BYTES,
                },
                CappedRead::Failed(e) => failed(e),
            })?;
        serde_json::from_slice(&body)
            .map(Fetched::Document)
            .map_err(|e| DiscoveryError::BadJson {
                url: at(),
                message: e.to_string(),
            })
    }
}

/// `url answered HTTP status, …`.
fn list_tried(tried: &[(String, u16)]) -> String {
    tried
        .iter()
        .map(|(url, status)| format!("{url} answered HTTP {status}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `` `issuer`: why; … `` with each reason without the `OAuth discovery: `
/// prefix, and cut to [`MAX_FAILURE_CHARS`] (issuers and URLs come from the
/// server).
fn list_failures(failures: &[(String, DiscoveryError)]) -> String {
    failures
        .iter()
        .map(|(issuer, error)| {
            let error = error.to_string();
            let reason = error.strip_prefix("OAuth discovery: ").unwrap_or(&error);
            let text = format!("`{issuer}`: {reason}");
            match text.char_indices().nth(MAX_FAILURE_CHARS) {
                Some((end, _)) => format!("{}…", &text[..end]),
                None => text,
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn is_http(url: &Url) -> bool {
    matches!(url.scheme(), "http" | "https") && url.host().is_some()
}

/// RFC 9728 §3.3: the document's `resource` must be one of `accepted`
/// (canonical forms), or nothing in it is used.
fn check_resource(url: &Url, resource: &str, accepted: &[&str]) -> Result<(), DiscoveryError> {
    let canonical = Url::parse(resource).map(|r| canonical_resource(&r));
    match canonical {
        Ok(c) if accepted.contains(&c.as_str()) => Ok(()),
        _ => Err(DiscoveryError::ResourceMismatch {
            url: url.to_string(),
            resource: resource.to_owned(),
            expected: accepted
                .first()
                .map(|e| (*e).to_owned())
                .unwrap_or_default(),
        }),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn url(text: &str) -> Url {
        Url::parse(text).unwrap()
    }

    #[test]
    fn bearer_challenges_are_read_among_others() {
        let c = Challenge::parse(
            r#"Bearer error="invalid_token", resource_metadata="https://mcp.example.com/.well-known/oauth-protected-resource", scope="files:read files:write""#,
        )
        .unwrap();
        assert_eq!(
            c.resource_metadata.as_deref(),
            Some("https://mcp.example.com/.well-known/oauth-protected-resource")
        );
        assert_eq!(c.scope.as_deref(), Some("files:read files:write"));
        assert_eq!(c.error.as_deref(), Some("invalid_token"));

        // Another scheme first (with a token68), parameters of other
        // challenges ignored, unquoted values, escapes, any case.
        let c = Challenge::parse(
            r#"Basic dXNlcjpwYXNz==, Digest realm="x", scope="not-this", bearer Resource_Metadata=https://a.example/m, scope="a\"b", Other scope=no"#,
        )
        .unwrap();
        assert_eq!(c.resource_metadata.as_deref(), Some("https://a.example/m"));
        assert_eq!(c.scope.as_deref(), Some("a\"b"));
        assert_eq!(c.error, None);

        assert_eq!(Challenge::parse("Bearer"), Some(Challenge::default()));
        assert_eq!(Challenge::parse(r#"Basic realm="x""#), None);
        assert_eq!(Challenge::parse(""), None);
    }

    #[test]
    fn canonical_uris_drop_the_fragment_and_a_bare_slash() {
        assert_eq!(
            canonical_resource(&url("HTTPS://MCP.Example.com/mcp#frag")),
            "https://mcp.example.com/mcp"
        );
        assert_eq!(
            canonical_resource(&url("https://mcp.example.com/")),
            "https://mcp.example.com"
        );
        assert_eq!(
            canonical_resource(&url("https://mcp.example.com:8443")),
            "https://mcp.example.com:8443"
        );
        assert_eq!(
            canonical_resource(&url("https://mcp.example.com:443/a/")),
            "https://mcp.example.com/a/"
        );
    }

    #[test]
    fn well_known_uris_insert_the_path_then_fall_back_to_the_root() {
        let urls: Vec<(String, String)> =
            protected_resource_metadata_urls(&url("https://mcp.example.com/public/mcp"))
                .into_iter()
                .map(|(u, r)| (u.to_string(), r))
                .collect();
        assert_eq!(
            urls,
            [
                (
                    "https://mcp.example.com/.well-known/oauth-protected-resource/public/mcp"
                        .to_owned(),
                    "https://mcp.example.com/public/mcp".to_owned()
                ),
                (
                    "https://mcp.example.com/.well-known/oauth-protected-resource".to_owned(),
                    "https://mcp.example.com".to_owned()
                ),
            ]
        );
        let root = protected_resource_metadata_urls(&url("https://mcp.example.com/"));
        assert_eq!(root.len(), 1);
        assert_eq!(
            root[0].0.as_str(),
            "https://mcp.example.com/.well-known/oauth-protected-resource"
        );

        let with_path: Vec<String> =
            authorization_server_metadata_urls(&url("https://auth.example.com/tenant1/"))
                .iter()
                .map(Url::to_string)
                .collect();
        assert_eq!(
            with_path,
            [
                "https://auth.example.com/.well-known/oauth-authorization-server/tenant1",
                "https://auth.example.com/.well-known/openid-configuration/tenant1",
                "https://auth.example.com/tenant1/.well-known/openid-configuration",
            ]
        );
        let bare: Vec<String> =
            authorization_server_metadata_urls(&url("https://auth.example.com"))
                .iter()
                .map(Url::to_string)
                .collect();
        assert_eq!(
            bare,
            [
                "https://auth.example.com/.well-known/oauth-authorization-server",
                "https://auth.example.com/.well-known/openid-configuration",
            ]
        );
    }

    #[test]
    fn a_resource_must_match_in_canonical_form() {
        let at = url("https://mcp.example.com/.well-known/oauth-protected-resource/mcp");
        let accepted = ["https://mcp.example.com/mcp"];
        assert!(check_resource(&at, "https://MCP.example.com/mcp", &accepted).is_ok());
        assert!(check_resource(&at, "https://mcp.example.com/mcp#x", &accepted).is_ok());
        for other in [
            "https://mcp.example.com/mcp/",
            "https://mcp.example.com/other",
            "http://mcp.example.com/mcp",
            "https://evil.example/mcp",
            "not a url",
        ] {
            let err = check_resource(&at, other, &accepted).unwrap_err();
            assert!(
                matches!(&err, DiscoveryError::ResourceMismatch { resource, .. } if resource == other),
                "{other}: {err:?}"
            );
        }
    }
}
