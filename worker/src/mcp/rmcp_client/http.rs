//! The Streamable HTTP backend ([`HeaderClient`], reqwest) with per-call
//! headers, and the OAuth bearer tokens of a server configured with `oauth`
//! ([`OAuth`]: a configured or discovered token endpoint, a new token once
//! on a 401, discovery again once when a discovered endpoint fails).

use super::*;

/// HTTP: provably not processed when the connection was never made, the
/// request never built, or the server refused it before handling it.
pub(super) fn http_not_sent(error: &StreamableHttpError<reqwest::Error>) -> bool {
    match error {
        StreamableHttpError::Client(e) => e.is_connect() || e.is_builder(),
        StreamableHttpError::HttpStatus(status) => status.status == 429,
        // 401/403: refused before it was handled (or, with `oauth`, no
        // token could be had and nothing was sent).
        StreamableHttpError::SessionExpired
        | StreamableHttpError::ReservedHeaderConflict(_)
        | StreamableHttpError::AuthRequired(_)
        | StreamableHttpError::InsufficientScope(_) => true,
        _ => false,
    }
}

// ---------------------------------------------------------------------------
// Streamable HTTP backend with per-call headers.

#[derive(Clone)]
pub(super) struct HeaderClient {
    pub(super) inner: reqwest::Client,
    pub(super) calls: Arc<Calls>,
    pub(super) generation: u64,
    /// Cancelled when the server no longer knows this connection's session:
    /// the supervisor then re-makes the connection (see [`HeaderClient::answered`]).
    pub(super) lost: CancellationToken,
    /// Bearer tokens for a server configured with `oauth`.
    pub(super) oauth: Option<Arc<OAuth>>,
}

/// Bearer tokens of one server configured with `oauth` (client-credentials
/// grant, RFC 6749 §4.4, with the server's canonical URI as RFC 8707
/// `resource`): from its configured token endpoint, or from the one
/// discovered from its 401 answer ([`crate::oauth_discovery`]). Tokens and
/// the discovered endpoint outlive a connection (they are in [`Shared`]).
pub(super) struct OAuth {
    pub(super) config: ResolvedOAuth,
    /// The MCP endpoint: the protected resource.
    pub(super) resource: reqwest::Url,
    pub(super) tokens: Arc<crate::oauth2::TokenCache>,
    /// For a configured token endpoint (the operator's choice, as the
    /// server's URL is: not subject to the address policy).
    pub(super) http: reqwest::Client,
    /// Through the worker's address policy: every discovery fetch and a
    /// discovered token endpoint (both chosen by the server).
    pub(super) discovery: crate::oauth_discovery::Discovery,
    pub(super) state: Arc<OAuthState>,
}

/// What one server's [`OAuth`] keeps across connections.
#[derive(Default)]
pub(super) struct OAuthState {
    /// The discovered token endpoint and the challenge it came from; one
    /// discovery at a time.
    pub(super) found: tokio::sync::Mutex<Found>,
    /// Why the latest token could not be had: a handshake that failed for
    /// it reports this rather than rmcp's bare "auth required".
    pub(super) failure: Mutex<Option<AuthorizationError>>,
}

#[derive(Default)]
pub(super) struct Found {
    pub(super) endpoint: Option<Arc<Discovered>>,
    pub(super) challenge: Option<Challenge>,
}

/// Where tokens come from.
#[derive(Clone)]
pub(super) enum Grant {
    /// `oauth.token_url`.
    Configured(reqwest::Url),
    /// Found by discovery.
    Discovered(Arc<Discovered>),
}

impl Grant {
    /// The token endpoint.
    fn token_url(&self) -> &reqwest::Url {
        match self {
            Self::Configured(url) => url,
            Self::Discovered(found) => &found.token_url,
        }
    }
}

/// How long a token request may take, in ms.
pub(super) const OAUTH_TOKEN_TIMEOUT_MS: u64 = 10_000;

/// How rmcp's HTTP client starts the error of a JSON answer that is not a
/// JSON-RPC message (`UnexpectedServerResponse`).
const UNPARSEABLE_ANSWER: &str = "could not parse JSON response";

/// When the server refused a request's credentials (401): its `Bearer`
/// challenge, if it sent one. `None`: not a 401.
fn refusal<T>(
    result: &Result<T, StreamableHttpError<reqwest::Error>>,
) -> Option<Option<Challenge>> {
    match result {
        // rmcp reports a 401 with a `WWW-Authenticate` header as
        // `AuthRequired`, and one without in an unexpected-response error.
        Err(StreamableHttpError::AuthRequired(e)) => {
            Some(Challenge::parse(&e.www_authenticate_header))
        }
        Err(StreamableHttpError::UnexpectedServerResponse(message))
            if message.starts_with("HTTP 401") =>
        {
            Some(None)
        }
        _ => None,
    }
}

/// A token that could not be had, or a fresh one the server refused, as a
/// transport error (a 401: the server handled nothing).
fn no_token(error: &AuthorizationError) -> StreamableHttpError<reqwest::Error> {
    let message = match error {
        AuthorizationError::TokenRefused { .. } => error.to_string(),
        _ => format!("no OAuth access token: {error}"),
    };
    StreamableHttpError::AuthRequired(
        rmcp::transport::streamable_http_client::AuthRequiredError::new(message),
    )
}

impl OAuth {
    /// The credentials of a token request from `grant`.
    fn creds(&self, grant: &Grant) -> crate::oauth2::ClientCredentials {
        let (token_url, scopes, resource, auth) = match grant {
            Grant::Configured(url) => (
                url.clone(),
                self.config.scopes.clone(),
                crate::oauth_discovery::canonical_resource(&self.resource),
                crate::oauth2::ClientAuth::Basic,
            ),
            Grant::Discovered(found) => (
                found.token_url.clone(),
                found.scopes.clone(),
                found.resource.clone(),
                found.auth,
            ),
        };
        crate::oauth2::ClientCredentials {
            token_url,
            client_id: self.config.client_id.clone(),
            client_secret: self.config.client_secret.clone(),
            scopes,
            resource: Some(resource),
            auth,
        }
    }

    /// The grant known now: the configured endpoint, or one discovered
    /// earlier. `None`: to be discovered.
    pub(super) async fn known(&self) -> Option<Grant> {
        match &self.config.token_url {
            Some(url) => Some(Grant::Configured(url.clone())),
            None => self
                .state
                .found
                .lock()
                .await
                .endpoint
                .clone()
                .map(Grant::Discovered),
        }
    }

    /// Discovers the token endpoint, with `challenge` (else the last one
    /// seen), unless another request already did (or already replaced
    /// `stale`): then that one.
    async fn discover(
        &self,
        challenge: Option<Challenge>,
        stale: Option<&Arc<Discovered>>,
    ) -> Result<Grant, AuthorizationError> {
        let mut found = self.state.found.lock().await;
        if let Some(current) = &found.endpoint
            && stale.is_none_or(|stale| !Arc::ptr_eq(stale, current))
        {
            return Ok(Grant::Discovered(current.clone()));
        }
        if challenge.is_some() {
            found.challenge = challenge;
        }
        let discovered = self
            .discovery
            .discover(
                &self.resource,
                found.challenge.as_ref(),
                &self.config.scopes,
            )
            .await?;
        tracing::info!(
            resource = discovered.resource,
            resource_metadata = %discovered.resource_metadata_url,
            issuer = discovered.issuer,
            token_endpoint = %discovered.token_url,
            scopes = discovered.scopes,
            "MCP server's OAuth token endpoint discovered"
        );
        let discovered = Arc::new(discovered);
        found.endpoint = Some(discovered.clone());
        Ok(Grant::Discovered(discovered))
    }

    /// A token from `grant` (a new one if the cached one is `rejected`).
    async fn token(
        &self,
        grant: &Grant,
        rejected: Option<&str>,
    ) -> Result<String, AuthorizationError> {
        let creds = self.creds(grant);
        let http = match grant {
            Grant::Configured(_) => &self.http,
            Grant::Discovered(_) => {
                self.discovery.check(&creds.token_url).map_err(|refused| {
                    crate::oauth2::TokenError {
                        token_url: creds.token_url.to_string(),
                        message: refused.to_string(),
                        refused: Some(refused),
                        too_large: None,
                    }
                })?;
                self.discovery.http()
            }
        };
        let timeout = Duration::from_millis(OAUTH_TOKEN_TIMEOUT_MS);
        let token = match rejected {
            None => self.tokens.token(http, &creds, timeout).await,
            Some(rejected) => {
                self.tokens
                    .refresh_after_rejection(http, &creds, rejected, timeout)
                    .await
            }
        };
        Ok(token?)
    }

    /// [`OAuth::token`]; when a discovered endpoint fails, it is discovered
    /// again once (`rediscovered` says whether that chance is used up).
    pub(super) async fn token_or_rediscover(
        &self,
        grant: &mut Grant,
        rejected: Option<&str>,
        rediscovered: &mut bool,
    ) -> Result<String, AuthorizationError> {
        match self.token(grant, rejected).await {
            Ok(token) => Ok(token),
            Err(error) => {
                let Grant::Discovered(stale) = grant.clone() else {
                    return Err(error);
                };
                if *rediscovered {
                    return Err(error);
                }
                tracing::info!(
                    %error,
                    "the discovered token endpoint failed: discovering it again"
                );
                *rediscovered = true;
                *grant = self.discover(None, Some(&stale)).await?;
                self.token(grant, rejected).await
            }
        }
    }

    /// Records why no token could be had, as the transport error.
    fn failed(&self, error: AuthorizationError) -> StreamableHttpError<reqwest::Error> {
        let refused = no_token(&error);
        *lock(&self.state.failure) = Some(error);
        refused
    }

    /// `result`, unless it is a 401 to the fresh token from `grant`: then
    /// [`AuthorizationError::TokenRefused`], recorded as [`OAuth::failed`]
    /// does, so that a handshake refused for it says so.
    fn unless_refused<T>(
        &self,
        grant: &Grant,
        result: Result<T, StreamableHttpError<reqwest::Error>>,
    ) -> Result<T, StreamableHttpError<reqwest::Error>> {
        let Some(challenge) = refusal(&result) else {
            return result;
        };
        let error = AuthorizationError::TokenRefused {
            resource: self.resource.to_string(),
            token_url: grant.token_url().to_string(),
            challenge_error: challenge
                .and_then(|c| c.error)
                .map(|e| e.chars().take(64).collect()),
        };
        tracing::warn!(%error, "MCP server refused a fresh access token");
        Err(self.failed(error))
    }

    /// Runs `send` with a bearer token (see [`HeaderClient::authorized`]).
    async fn authorized<T, F, Fut>(&self, send: F) -> Result<T, StreamableHttpError<reqwest::Error>>
    where
        F: Fn(Option<String>) -> Fut,
        Fut: Future<Output = Result<T, StreamableHttpError<reqwest::Error>>>,
    {
        let mut rediscovered = false;
        let mut grant = match self.known().await {
            Some(grant) => grant,
            None => {
                // Nothing known yet: the server's 401 says where to look
                // (MCP authorization, "Authorization Server Discovery").
                let result = send(None).await;
                let Some(challenge) = refusal(&result) else {
                    return result;
                };
                rediscovered = true;
                self.discover(challenge, None)
                    .await
                    .map_err(|e| self.failed(e))?
            }
        };
        let token = self
            .token_or_rediscover(&mut grant, None, &mut rediscovered)
            .await
            .map_err(|e| self.failed(e))?;
        let result = send(Some(token.clone())).await;
        if refusal(&result).is_none() {
            return result;
        }
        tracing::info!(
            token_url = grant.token_url().as_str(),
            "MCP server answered 401: fetching a new access token"
        );
        let token = self
            .token_or_rediscover(&mut grant, Some(&token), &mut rediscovered)
            .await
            .map_err(|e| self.failed(e))?;
        let result = send(Some(token.clone())).await;
        let Some(challenge) = refusal(&result) else {
            return result;
        };
        let Grant::Discovered(stale) = &grant else {
            return self.unless_refused(&grant, result);
        };
        if rediscovered {
            return self.unless_refused(&grant, result);
        }
        // A fresh token refused too: the server may have moved to another
        // authorization server.
        tracing::info!(
            "MCP server refused a fresh access token: discovering the token endpoint again"
        );
        let stale = stale.clone();
        grant = self
            .discover(challenge, Some(&stale))
            .await
            .map_err(|e| self.failed(e))?;
        let token = self
            .token(&grant, Some(&token))
            .await
            .map_err(|e| self.failed(e))?;
        let result = send(Some(token)).await;
        self.unless_refused(&grant, result)
    }
}

impl HeaderClient {
    /// Runs `send` with the bearer token of a server configured with
    /// `oauth` (else with `auth_header` as rmcp gave it): the cached token,
    /// and once more with a new one when the server answers 401. Without a
    /// token endpoint yet, the request goes without a token first, and a
    /// 401 starts discovery; a discovered endpoint that fails, or whose
    /// fresh token is refused again, is discovered again once. A 401 is
    /// the server refusing before handling the request, so sending it again
    /// cannot repeat an effect.
    async fn authorized<T, F, Fut>(
        &self,
        auth_header: Option<String>,
        send: F,
    ) -> Result<T, StreamableHttpError<reqwest::Error>>
    where
        F: Fn(Option<String>) -> Fut,
        Fut: Future<Output = Result<T, StreamableHttpError<reqwest::Error>>>,
    {
        match &self.oauth {
            None => send(auth_header).await,
            Some(oauth) => oauth.authorized(send).await,
        }
    }
}

pub(super) type HeaderMap = HashMap<reqwest::header::HeaderName, reqwest::header::HeaderValue>;

impl HeaderClient {
    /// What a POST's answer means for the request it carried.
    ///
    /// A JSON-RPC error without an `id` answering a request is the server
    /// refusing that request before handling it (it could not read it, or
    /// does not know the session). rmcp cannot match it to the request, which
    /// would then wait for its whole timeout; so with a session attached and
    /// an error about the session (some servers answer an unknown session
    /// with 400 rather than the 404 the specification asks for) it becomes
    /// `SessionExpired`, and otherwise it is given the request's id. A
    /// `SessionExpired` (either way) marks the connection lost: rmcp's own
    /// re-initialisation is off, because it would repeat a call on a new
    /// session without the definition check of a re-made connection.
    fn answered(
        &self,
        message_id: Option<RequestId>,
        session_attached: bool,
        result: PostResult,
    ) -> PostResult {
        let result = match (result, message_id) {
            (
                Ok(StreamableHttpPostResponse::Json(JsonRpcMessage::Error(mut error), session)),
                Some(id),
            ) if error.id.is_none() => {
                let about_session = error.error.message.to_ascii_lowercase().contains("session");
                if session_attached && about_session {
                    Err(StreamableHttpError::SessionExpired)
                } else {
                    error.id = Some(id);
                    Ok(StreamableHttpPostResponse::Json(
                        JsonRpcMessage::Error(error),
                        session,
                    ))
                }
            }
            // An answer that arrived but is not a JSON-RPC message: the
            // request it answers fails now, as undecodable (not as lost).
            (Err(StreamableHttpError::UnexpectedServerResponse(message)), Some(id))
                if message.starts_with(UNPARSEABLE_ANSWER) =>
            {
                Ok(StreamableHttpPostResponse::Json(
                    undecodable(&self.calls, self.generation, id, message.into_owned()),
                    None,
                ))
            }
            // The same inside an SSE stream: an event whose data is not a
            // JSON-RPC message becomes the error answer of the request the
            // stream answers (rmcp would drop it, and the call would wait
            // for its timeout and be read as lost).
            (Ok(StreamableHttpPostResponse::Sse(stream, session)), Some(id)) => {
                Ok(StreamableHttpPostResponse::Sse(
                    checked_events(stream, Arc::clone(&self.calls), self.generation, id),
                    session,
                ))
            }
            (result, _) => result,
        };
        if matches!(result, Err(StreamableHttpError::SessionExpired)) {
            self.lost.cancel();
        }
        result
    }

    fn headers_for(&self, message: &ClientJsonRpcMessage, mut headers: HeaderMap) -> HeaderMap {
        if let JsonRpcMessage::Request(request) = message
            && let Some(marker) = self.calls.by_request_id(self.generation, &request.id)
            && let Some(slot) = lock(&self.calls.slots).get(&marker)
        {
            headers.extend(slot.headers.iter().cloned());
        }
        headers
    }
}

type PostResult = Result<StreamableHttpPostResponse, StreamableHttpError<reqwest::Error>>;

/// The id of a request message (`None` for notifications and answers).
fn request_id(message: &ClientJsonRpcMessage) -> Option<RequestId> {
    match message {
        JsonRpcMessage::Request(request) => Some(request.id.clone()),
        _ => None,
    }
}

/// An error answer in place of an answer to `id` that cannot be decoded
/// (`reason`, cut to 1 KiB); the call it answers (if it is one) is marked
/// so, and ends `Undecodable`, not lost.
fn undecodable(
    calls: &Calls,
    generation: u64,
    id: RequestId,
    reason: String,
) -> ServerJsonRpcMessage {
    let mut reason = reason;
    if reason.len() > 1024 {
        let mut end = 1024;
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        reason.truncate(end);
    }
    if let Some(marker) = calls.by_request_id(generation, &id)
        && let Some(slot) = lock(&calls.slots).get_mut(&marker)
    {
        slot.undecodable = Some(reason.clone());
    }
    JsonRpcMessage::error(
        ErrorData::new(
            rmcp::model::ErrorCode(super::stdio::ANSWER_UNDECODABLE_CODE),
            reason,
            None,
        ),
        Some(id),
    )
}

/// The events of an SSE answer to request `id`: an event whose data is not
/// a JSON-RPC message is repaired where [`crate::json_text::repair`] can
/// (lone surrogates, bytes that are not UTF-8), else replaced by
/// [`undecodable`]'s error answer (its event id and retry kept). Events
/// without data (keep-alives, retry hints) pass as they are.
fn checked_events(
    stream: futures_util::stream::BoxStream<'static, Result<sse_stream::Sse, sse_stream::Error>>,
    calls: Arc<Calls>,
    generation: u64,
    id: RequestId,
) -> futures_util::stream::BoxStream<'static, Result<sse_stream::Sse, sse_stream::Error>> {
    use futures_util::StreamExt as _;
    stream
        .map(move |event| {
            let mut sse = event?;
            let Some(data) = sse.data.as_deref().filter(|d| !d.trim().is_empty()) else {
                return Ok(sse);
            };
            let Err(e) = serde_json::from_str::<ServerJsonRpcMessage>(data) else {
                return Ok(sse);
            };
            // Lone surrogates are repaired as on stdio (`json_text`).
            let repaired = crate::json_text::repair(data.as_bytes())
                .and_then(|(text, _)| String::from_utf8(text).ok())
                .filter(|text| serde_json::from_str::<ServerJsonRpcMessage>(text).is_ok());
            sse.data = match repaired {
                Some(text) => Some(text),
                None => {
                    let reason = format!("{UNPARSEABLE_ANSWER} in an SSE event: {e}");
                    let answer = undecodable(&calls, generation, id.clone(), reason);
                    serde_json::to_string(&answer).ok()
                }
            };
            Ok(sse)
        })
        .boxed()
}

impl StreamableHttpClient for HeaderClient {
    type Error = reqwest::Error;

    fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HeaderMap,
    ) -> impl Future<Output = PostResult> + Send + '_ {
        let headers = self.headers_for(&message, custom_headers);
        let (id, attached) = (request_id(&message), session_id.is_some());
        async move {
            let result = self
                .authorized(auth_header, |auth| {
                    self.inner.post_message(
                        uri.clone(),
                        message.clone(),
                        session_id.clone(),
                        auth,
                        headers.clone(),
                    )
                })
                .await;
            self.answered(id, attached, result)
        }
    }

    fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HeaderMap,
        max_sse_event_size: usize,
    ) -> impl Future<Output = PostResult> + Send + '_ {
        let headers = self.headers_for(&message, custom_headers);
        let (id, attached) = (request_id(&message), session_id.is_some());
        async move {
            let result = self
                .authorized(auth_header, |auth| {
                    self.inner.post_message_with_max_sse_event_size(
                        uri.clone(),
                        message.clone(),
                        session_id.clone(),
                        auth,
                        headers.clone(),
                        max_sse_event_size,
                    )
                })
                .await;
            self.answered(id, attached, result)
        }
    }

    fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HeaderMap,
        limits: StreamableHttpResponseLimits,
    ) -> impl Future<Output = PostResult> + Send + '_ {
        let headers = self.headers_for(&message, custom_headers);
        let (id, attached) = (request_id(&message), session_id.is_some());
        async move {
            let result = self
                .authorized(auth_header, |auth| {
                    self.inner.post_message_with_response_limits(
                        uri.clone(),
                        message.clone(),
                        session_id.clone(),
                        auth,
                        headers.clone(),
                        limits,
                    )
                })
                .await;
            self.answered(id, attached, result)
        }
    }

    fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HeaderMap,
    ) -> impl Future<Output = Result<(), StreamableHttpError<reqwest::Error>>> + Send + '_ {
        self.authorized(auth_header, move |auth| {
            self.inner.delete_session(
                uri.clone(),
                session_id.clone(),
                auth,
                custom_headers.clone(),
            )
        })
    }

    fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HeaderMap,
    ) -> impl Future<
        Output = Result<
            futures_util::stream::BoxStream<'static, Result<sse_stream::Sse, sse_stream::Error>>,
            StreamableHttpError<reqwest::Error>,
        >,
    > + Send
    + '_ {
        self.authorized(auth_header, move |auth| {
            self.inner.get_stream(
                uri.clone(),
                session_id.clone(),
                last_event_id.clone(),
                auth,
                custom_headers.clone(),
            )
        })
    }
}
