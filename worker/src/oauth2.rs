//! OAuth 2.0 client-credentials tokens (RFC 6749 §4.4) for HTTP tools with
//! `auth: oauth2_client`, sent as bearer tokens (RFC 6750 §2.1).
//!
//! The token request is a POST to the token endpoint with
//! `grant_type=client_credentials` (and `scope` when the tool names
//! scopes, `resource` when the token is for one resource: RFC 8707, as MCP
//! servers ask), form-encoded, the client authenticated with HTTP Basic
//! (RFC 6749 §2.3.1: id and secret form-encoded, then `id:secret` in
//! base64) or, when the authorization server's metadata offers only that,
//! with `client_id` and `client_secret` in the body ([`ClientAuth`]).
//! The answer is read up to [`MAX_TOKEN_ANSWER_BYTES`] (the endpoint may
//! be one an MCP server chose through discovery): a longer one is refused
//! once that many bytes have arrived. Its `access_token` (a string),
//! `token_type` (a string, `bearer` in any case) and `expires_in` are
//! read; anything else is ignored. `expires_in` is seconds, as a JSON
//! number or, as some servers send it, a string holding one (`"3599"`);
//! when absent, or anything else (`"soon"`, `null`, `true`), or not
//! positive, the token lives [`DEFAULT_LIFETIME_SECS`] (a warning is
//! logged for a value that is there but unusable).
//!
//! [`TokenCache`] keeps one token per (token URL, client id, scopes,
//! resource) per worker, in memory only: it is used until
//! [`refresh_margin`] before it expires, then fetched again; a tool that
//! answers 401 makes the caller fetch a new one once
//! ([`TokenCache::refresh_after_rejection`]). Calls that need the same
//! token while it is being fetched wait for that one fetch. Time comes
//! from a [`Clock`], so expiry is testable without sleeping.
//!
//! Errors ([`TokenError`]) name the token endpoint and its status or the
//! RFC 6749 §5.2 `error` code, never the secret or a token.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::Url;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderValue};
use serde_json::{Map, Value};

use crate::http_util::{CappedRead, error_chain, read_capped};

/// Lifetime of a token whose answer has no `expires_in`, in seconds (RFC
/// 6749 §5.1 leaves the default to the server; five minutes keeps a stale
/// token short-lived, and a 401 still refreshes it).
pub const DEFAULT_LIFETIME_SECS: u64 = 300;

/// Largest token endpoint answer read, in bytes (64 KiB; a real one is a
/// few hundred bytes, a JWT access token a few KiB).
pub const MAX_TOKEN_ANSWER_BYTES: usize = 64 * 1024;

/// Longest time before expiry at which a token is refreshed, in seconds.
pub const MAX_REFRESH_MARGIN_SECS: u64 = 30;

/// Characters left as they are by `application/x-www-form-urlencoded`
/// (WHATWG URL, "urlencoded serializer"); the rest is percent-encoded.
pub(crate) const FORM_VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'*')
    .remove(b'-')
    .remove(b'.')
    .remove(b'_');

/// `text` form-encoded (spaces as `%20`, which every decoder accepts).
pub(crate) fn form_encode(text: &str) -> String {
    utf8_percent_encode(text, FORM_VALUE).to_string()
}

/// How long before a token of `lifetime` expires it is refreshed: half its
/// lifetime, at most [`MAX_REFRESH_MARGIN_SECS`].
pub fn refresh_margin(lifetime: Duration) -> Duration {
    (lifetime / 2).min(Duration::from_secs(MAX_REFRESH_MARGIN_SECS))
}

/// The current time for token expiry: the system's monotonic clock, or any
/// function (tests move it forward without sleeping).
#[derive(Clone)]
pub struct Clock(Arc<dyn Fn() -> Instant + Send + Sync>);

impl Clock {
    /// [`Instant::now`].
    pub fn system() -> Self {
        Self(Arc::new(Instant::now))
    }

    /// A clock that reads `now()`.
    pub fn from_fn(now: impl Fn() -> Instant + Send + Sync + 'static) -> Self {
        Self(Arc::new(now))
    }

    fn now(&self) -> Instant {
        (self.0)()
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::system()
    }
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Clock")
    }
}

/// A client's credentials with placeholders resolved. `Debug` leaves the
/// secret out.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientCredentials {
    /// The token endpoint.
    pub token_url: Url,
    /// The client identifier.
    pub client_id: String,
    /// The client secret.
    pub client_secret: String,
    /// Space-separated scopes; empty: no `scope` parameter.
    pub scopes: String,
    /// The resource the token is for (RFC 8707 `resource` parameter, an
    /// absolute URI); `None`: no `resource` parameter.
    pub resource: Option<String>,
    /// How the client authenticates to the token endpoint.
    pub auth: ClientAuth,
}

/// How a client authenticates to the token endpoint with its secret (RFC
/// 6749 §2.3.1; the names are RFC 8414's `token_endpoint_auth_methods_supported`
/// values).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum ClientAuth {
    /// `client_secret_basic`: HTTP Basic, id and secret form-encoded first.
    /// What every authorization server must accept (RFC 6749 §2.3.1).
    #[default]
    Basic,
    /// `client_secret_post`: `client_id` and `client_secret` in the form body.
    Post,
}

impl fmt::Debug for ClientCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientCredentials")
            .field("token_url", &self.token_url.as_str())
            .field("client_id", &self.client_id)
            .field("scopes", &self.scopes)
            .field("resource", &self.resource)
            .field("auth", &self.auth)
            .finish_non_exhaustive()
    }
}

/// Why no token could be had. Nothing was sent to the tool.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("OAuth 2.0 token request to {token_url} failed: {message}")]
pub struct TokenError {
    /// The token endpoint.
    pub token_url: String,
    /// What happened (transport error, status and `error` code, or a
    /// malformed answer); never a secret or a token.
    pub message: String,
    /// Whether the address was refused by the worker's network policy
    /// (see [`crate::ssrf`]) rather than the request failing.
    pub refused: Option<crate::ssrf::AddressRefused>,
    /// `Some(limit)` when the answer was longer than `limit` bytes
    /// ([`MAX_TOKEN_ANSWER_BYTES`]) and was not read further.
    pub too_large: Option<usize>,
}

/// One cached token.
struct Token {
    access_token: String,
    fresh_until: Instant,
}

/// The token of one (token URL, client id, scopes, resource): `None` until
/// fetched.
type Slot = Arc<tokio::sync::Mutex<Option<Token>>>;

/// What a cached token is for: (token URL, client id, scopes, resource).
type SlotKey = (String, String, String, Option<String>);

/// Access tokens by (token URL, client id, scopes, resource), shared by
/// every call of a worker. See the module docs.
#[derive(Default)]
pub struct TokenCache {
    clock: Clock,
    slots: Mutex<HashMap<SlotKey, Slot>>,
}

impl fmt::Debug for TokenCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenCache").finish_non_exhaustive()
    }
}

/// The token endpoint's successful answer (RFC 6749 §5.1), the fields
/// used.
struct TokenAnswer {
    access_token: Option<String>,
    token_type: Option<String>,
    /// Seconds; `None` when absent or unusable (see the module docs).
    expires_in: Option<f64>,
    /// `expires_in` was there but not a number nor a numeric string.
    expires_in_unusable: bool,
}

impl TokenAnswer {
    /// The answer in `body`, or what is wrong with it (`access_token` and
    /// `token_type` must be strings when present).
    fn parse(body: &[u8]) -> Result<Self, String> {
        let Ok(Value::Object(answer)) = serde_json::from_slice::<Value>(body) else {
            return Err("the answer is not a JSON object".into());
        };
        let (expires_in, expires_in_unusable) = match answer.get("expires_in") {
            None | Some(Value::Null) => (None, false),
            Some(Value::Number(n)) => (n.as_f64(), false),
            Some(Value::String(text)) => match text.trim().parse::<f64>() {
                Ok(secs) => (Some(secs), false),
                Err(_) => (None, true),
            },
            Some(_) => (None, true),
        };
        Ok(Self {
            access_token: string_field(&answer, "access_token")?,
            token_type: string_field(&answer, "token_type")?,
            expires_in,
            expires_in_unusable,
        })
    }
}

/// The string `field` of `answer`; `None` when absent or `null`.
fn string_field(answer: &Map<String, Value>, field: &str) -> Result<Option<String>, String> {
    match answer.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(_) => Err(format!("`{field}` in the answer is not a string")),
    }
}

impl TokenCache {
    /// An empty cache whose expiry follows `clock`.
    pub fn new(clock: Clock) -> Self {
        Self {
            clock,
            slots: Mutex::default(),
        }
    }

    fn slot(&self, creds: &ClientCredentials) -> Slot {
        let key = (
            creds.token_url.as_str().to_owned(),
            creds.client_id.clone(),
            creds.scopes.clone(),
            creds.resource.clone(),
        );
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(slots.entry(key).or_default())
    }

    /// A token for `creds`: the cached one while fresh, else a new one
    /// (fetched once however many calls wait for it), within `timeout`.
    ///
    /// # Errors
    /// [`TokenError`] when the token endpoint cannot be reached, refuses,
    /// or answers without a usable bearer token.
    pub async fn token(
        &self,
        http: &reqwest::Client,
        creds: &ClientCredentials,
        timeout: Duration,
    ) -> Result<String, TokenError> {
        self.token_unless(http, creds, timeout, None).await
    }

    /// After the tool refused `rejected` with 401: a new token, unless
    /// another call already replaced it (then that one).
    ///
    /// # Errors
    /// As [`TokenCache::token`].
    pub async fn refresh_after_rejection(
        &self,
        http: &reqwest::Client,
        creds: &ClientCredentials,
        rejected: &str,
        timeout: Duration,
    ) -> Result<String, TokenError> {
        self.token_unless(http, creds, timeout, Some(rejected))
            .await
    }

    /// The cached token while fresh and not `rejected`, else a new one.
    async fn token_unless(
        &self,
        http: &reqwest::Client,
        creds: &ClientCredentials,
        timeout: Duration,
        rejected: Option<&str>,
    ) -> Result<String, TokenError> {
        let slot = self.slot(creds);
        // Held across the fetch: callers of the same slot wait for it.
        let mut token = slot.lock().await;
        if let Some(t) = token.as_ref()
            && self.clock.now() < t.fresh_until
            && rejected != Some(t.access_token.as_str())
        {
            return Ok(t.access_token.clone());
        }
        *token = None;
        let fetched = self.fetch(http, creds, timeout).await?;
        let access_token = fetched.access_token.clone();
        *token = Some(fetched);
        Ok(access_token)
    }

    async fn fetch(
        &self,
        http: &reqwest::Client,
        creds: &ClientCredentials,
        timeout: Duration,
    ) -> Result<Token, TokenError> {
        let fail = |message: String| TokenError {
            token_url: creds.token_url.to_string(),
            message,
            refused: None,
            too_large: None,
        };
        let mut body = String::from("grant_type=client_credentials");
        if !creds.scopes.trim().is_empty() {
            body.push_str("&scope=");
            body.push_str(&form_encode(creds.scopes.trim()));
        }
        if let Some(resource) = &creds.resource {
            body.push_str("&resource=");
            body.push_str(&form_encode(resource));
        }
        let mut request = http.post(creds.token_url.clone());
        match creds.auth {
            ClientAuth::Basic => {
                request = request.basic_auth(
                    form_encode(&creds.client_id),
                    Some(form_encode(&creds.client_secret)),
                );
            }
            ClientAuth::Post => {
                body.push_str("&client_id=");
                body.push_str(&form_encode(&creds.client_id));
                body.push_str("&client_secret=");
                body.push_str(&form_encode(&creds.client_secret));
            }
        }
        let sent_at = self.clock.now();
        let mut response = request
            .header(
                CONTENT_TYPE,
                HeaderValue::from_static("application/x-www-form-urlencoded"),
            )
            .header(ACCEPT, HeaderValue::from_static("application/json"))
            .body(body)
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| TokenError {
                refused: crate::ssrf::address_refused(&e).cloned(),
                ..fail(error_chain(&e))
            })?;
        let status = response.status();
        let bytes = read_capped(&mut response, MAX_TOKEN_ANSWER_BYTES)
            .await
            .map_err(|e| match e {
                CappedRead::TooLarge(seen) => TokenError {
                    too_large: Some(MAX_TOKEN_ANSWER_BYTES),
                    ..fail(format!(
                        "HTTP {} with an answer of more than {MAX_TOKEN_ANSWER_BYTES} bytes \
                         ({seen}); the worker reads at most {MAX_TOKEN_ANSWER_BYTES} bytes of \
                         a token answer",
                        status.as_u16()
                    ))
                },
                CappedRead::Failed(e) => fail(error_chain(&e)),
            })?;
        if !status.is_success() {
            // RFC 6749 §5.2: the `error` code, whatever else is there.
            let code = serde_json::from_slice::<Value>(&bytes)
                .ok()
                .and_then(|answer| answer.get("error")?.as_str().map(str::to_owned))
                .map(|e| format!(" (error `{}`)", e.chars().take(64).collect::<String>()))
                .unwrap_or_default();
            return Err(fail(format!("HTTP {}{code}", status.as_u16())));
        }
        let answer = TokenAnswer::parse(&bytes).map_err(fail)?;
        let Some(access_token) = answer.access_token.filter(|t| !t.is_empty()) else {
            return Err(fail("the answer has no `access_token`".into()));
        };
        match answer.token_type.as_deref() {
            Some(t) if t.eq_ignore_ascii_case("bearer") => {}
            Some(t) => {
                return Err(fail(format!(
                    "token_type `{}` is not `bearer`",
                    t.chars().take(32).collect::<String>()
                )));
            }
            None => return Err(fail("the answer has no `token_type`".into())),
        }
        if HeaderValue::from_str(&access_token).is_err() {
            return Err(fail("the access token is not valid in a header".into()));
        }
        if answer.expires_in_unusable {
            tracing::warn!(
                token_url = %creds.token_url,
                default_secs = DEFAULT_LIFETIME_SECS,
                "the token answer's `expires_in` is not a number of seconds: using the default lifetime"
            );
        }
        let lifetime = match answer.expires_in {
            Some(secs) if secs.is_finite() && secs > 0.0 => {
                Duration::from_secs_f64(secs.min(365.0 * 24.0 * 3600.0))
            }
            _ => Duration::from_secs(DEFAULT_LIFETIME_SECS),
        };
        Ok(Token {
            access_token,
            // From when the request was sent: the server's clock started
            // no earlier.
            fresh_until: sent_at + lifetime - refresh_margin(lifetime),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn margins() {
        assert_eq!(
            refresh_margin(Duration::from_secs(3600)),
            Duration::from_secs(30)
        );
        assert_eq!(
            refresh_margin(Duration::from_secs(10)),
            Duration::from_secs(5)
        );
    }

    #[test]
    fn form_encoding_keeps_pairs_apart() {
        assert_eq!(form_encode("a b&c=d+é"), "a%20b%26c%3Dd%2B%C3%A9");
        assert_eq!(form_encode("A-z_0.9*"), "A-z_0.9*");
    }

    #[test]
    fn debug_leaves_the_secret_out() {
        let creds = ClientCredentials {
            token_url: Url::parse("https://auth.example.com/token").unwrap(),
            client_id: "id".into(),
            client_secret: "s3cret".into(),
            scopes: String::new(),
            resource: None,
            auth: ClientAuth::Post,
        };
        assert!(!format!("{creds:?}").contains("s3cret"));
    }
}
