//! The admin HTTP endpoint: JSON over HTTP/1.1 on its own port, for
//! operators. It lists, shows and resolves uncertain outcomes, pauses,
//! resumes and cancels runs, lists MCP tool definitions and accepts
//! changed ones ([`crate::mcp_pins`]), and lists the tool calls of a
//! tenant's runs for audit ([`crate::audit`]). Every route but the OpenAPI document
//! ([`OPENAPI_PATH`]) needs a bearer token ([`AdminAuth`]); tenants are named
//! in the path (`/admin/v1/tenants/{tenant}/...`).
//!
//! Errors are JSON, `{"error": {"code", "message", "details"}}` (see
//! [`AdminError`]; the status codes are listed in [`AdminError::status`]).
//! Architecture Invariant: this module is the one place where errors become
//! HTTP responses; database details never reach clients (they are logged).
//! Authentication runs before a request body is read, so a request without
//! a valid token changes nothing and learns nothing.

mod openapi;

use std::collections::HashMap;
use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{
    DefaultBodyLimit, Extension, FromRequest, FromRequestParts, Path, Query, Request, State,
};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header, request::Parts};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::audit::ToolCallFilter;
use crate::coordinator::{Coordinator, CoordinatorError, UncertainFilter};
use crate::error_code::ErrorCode;
use crate::machine::Resolution;
use crate::mcp_pins::{McpToolDetail, McpToolFilter, McpToolStatus, McpToolView};
use crate::store::{RunRow, ToolCallRecord, UncertainRow};

/// Largest request body accepted, bytes (64 KiB); larger bodies get 413.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Longest `reason` accepted, bytes.
pub const MAX_REASON_BYTES: usize = 4096;
/// Longest `operator` accepted, bytes.
pub const MAX_OPERATOR_BYTES: usize = 128;

/// `GET`: the OpenAPI 3.1 document of this endpoint (no auth).
pub const OPENAPI_PATH: &str = "/admin/v1/openapi.json";
/// `GET`: a page of a tenant's uncertain outcomes.
pub const UNCERTAIN_LIST_PATH: &str = "/admin/v1/tenants/{tenant}/uncertain-outcomes";
/// `GET`: one uncertain outcome.
pub const UNCERTAIN_PATH: &str = "/admin/v1/tenants/{tenant}/uncertain-outcomes/{id}";
/// `POST`: resolve one uncertain outcome.
pub const UNCERTAIN_RESOLVE_PATH: &str =
    "/admin/v1/tenants/{tenant}/uncertain-outcomes/{id}/resolve";
/// `GET`: one run.
pub const RUN_PATH: &str = "/admin/v1/tenants/{tenant}/runs/{run_id}";
/// `POST`: operator pause of a run.
pub const RUN_PAUSE_PATH: &str = "/admin/v1/tenants/{tenant}/runs/{run_id}/pause";
/// `POST`: lift an operator pause.
pub const RUN_RESUME_PATH: &str = "/admin/v1/tenants/{tenant}/runs/{run_id}/resume";
/// `POST`: cancel a run.
pub const RUN_CANCEL_PATH: &str = "/admin/v1/tenants/{tenant}/runs/{run_id}/cancel";
/// `POST`: fail a call that waits outside any task (an accepted async
/// webhook whose callback never came, a sync child run).
pub const RUN_CALL_FAIL_PATH: &str =
    "/admin/v1/tenants/{tenant}/runs/{run_id}/calls/{call_id}/fail";
/// `GET`: the tenant's MCP tools (pinned and listed definitions).
pub const MCP_TOOLS_PATH: &str = "/admin/v1/tenants/{tenant}/mcp-tools";
/// `GET`: one MCP tool, with every definition workers reported.
pub const MCP_TOOL_PATH: &str = "/admin/v1/tenants/{tenant}/mcp-tools/{server}/{tool}";
/// `POST`: accept a reported definition of an MCP tool for the tenant.
pub const MCP_TOOL_ACCEPT_PATH: &str =
    "/admin/v1/tenants/{tenant}/mcp-tools/{server}/{tool}/accept";
/// `GET`: a page of the tool calls the tenant's runs proposed (audit).
pub const TOOL_CALLS_PATH: &str = "/admin/v1/tenants/{tenant}/tool-calls";

/// Every route the router serves, as `(method, path template)`; the OpenAPI
/// document describes exactly these.
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", OPENAPI_PATH),
    ("GET", UNCERTAIN_LIST_PATH),
    ("GET", UNCERTAIN_PATH),
    ("POST", UNCERTAIN_RESOLVE_PATH),
    ("GET", RUN_PATH),
    ("POST", RUN_PAUSE_PATH),
    ("POST", RUN_RESUME_PATH),
    ("POST", RUN_CANCEL_PATH),
    ("POST", RUN_CALL_FAIL_PATH),
    ("GET", MCP_TOOLS_PATH),
    ("GET", MCP_TOOL_PATH),
    ("POST", MCP_TOOL_ACCEPT_PATH),
    ("GET", TOOL_CALLS_PATH),
];

/// Errors of the admin layer. Each has one [`ErrorCode`]
/// ([`AdminError::error_code`]), which gives its HTTP status and error code
/// ([`AdminError::status`], [`AdminError::code`]); the codes themselves are
/// mapped in [`crate::error_code`], the one place for every wire.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The token configuration (`name:token[:tenant],...`) is malformed.
    /// Never produced by a request.
    #[error("invalid token configuration (`name:token[:tenant],…`): {0}")]
    Config(String),
    /// No bearer token, or one that matches no configured token: 401.
    #[error("{0}")]
    Unauthorized(String),
    /// The token is valid but not scoped to the tenant in the path: 403.
    #[error("{0}")]
    Forbidden(String),
    /// Malformed request (JSON syntax, unknown field, wrong type, missing
    /// field, bad query or path parameter): 400.
    #[error("{message}")]
    BadRequest {
        /// What is wrong, with the JSON position when there is one.
        message: String,
        /// Further items, one per problem.
        details: Vec<String>,
    },
    /// The body is larger than [`MAX_BODY_BYTES`]: 413.
    #[error("{0}")]
    PayloadTooLarge(String),
    /// The body is not declared as `application/json`: 415.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// No such route: 404.
    #[error("{0}")]
    RouteNotFound(String),
    /// The route exists but not with this method: 405.
    #[error("{0}")]
    MethodNotAllowed(String),
    /// The coordinator refused or failed (404, 400, 409, 422 or 503).
    #[error(transparent)]
    Coordinator(#[from] CoordinatorError),
    /// Serving failed (binding, accepting). Never produced by a request.
    #[error("admin endpoint I/O error: {0}")]
    Io(#[from] std::io::Error),
}

impl AdminError {
    fn bad_request(message: impl Into<String>) -> AdminError {
        AdminError::BadRequest {
            message: message.into(),
            details: Vec::new(),
        }
    }

    /// The error's code ([`ErrorCode`]), which gives its HTTP status
    /// ([`AdminError::status`]) and the `code` of its body
    /// ([`AdminError::code`]); a coordinator error's is its own
    /// ([`CoordinatorError::code`]).
    pub fn error_code(&self) -> ErrorCode {
        match self {
            AdminError::Config(_) | AdminError::Io(_) => ErrorCode::Internal,
            AdminError::Unauthorized(_) => ErrorCode::Unauthenticated,
            AdminError::Forbidden(_) => ErrorCode::PermissionDenied,
            AdminError::BadRequest { .. } => ErrorCode::InvalidArgument,
            AdminError::PayloadTooLarge(_) => ErrorCode::PayloadTooLarge,
            AdminError::UnsupportedMediaType(_) => ErrorCode::UnsupportedMediaType,
            AdminError::RouteNotFound(_) => ErrorCode::NotFound,
            AdminError::MethodNotAllowed(_) => ErrorCode::MethodNotAllowed,
            AdminError::Coordinator(e) => e.code(),
        }
    }

    /// The HTTP status:
    /// 400 `BadRequest`, `InvalidArgument`, `Definitions`;
    /// 401 `Unauthorized`; 403 `Forbidden`; 404 `NotFound`, `RouteNotFound`;
    /// 405 `MethodNotAllowed`; 409 `Conflict`, `FailedPrecondition`;
    /// 413 `PayloadTooLarge`; 415 `UnsupportedMediaType`;
    /// 422 `Unprocessable`; 503 `Store`; 500 `Config`, `Io`.
    pub fn status(&self) -> StatusCode {
        self.error_code().http_status()
    }

    /// The machine-readable code in the error body: `invalid_argument`,
    /// `unauthorized`, `forbidden`, `not_found`, `method_not_allowed`,
    /// `conflict` (already resolved), `failed_precondition` (the run's state
    /// does not allow it), `payload_too_large`, `unsupported_media_type`,
    /// `unprocessable`, `unavailable` or `internal`
    /// ([`ErrorCode::as_str`]).
    pub fn code(&self) -> &'static str {
        self.error_code().as_str()
    }

    /// The error body: `{"error": {"code", "message", "details": [string]}}`.
    /// Store and I/O details are logged, never returned.
    pub fn body(&self) -> Value {
        let (message, details) = match self {
            AdminError::BadRequest { message, details } => (message.clone(), details.clone()),
            AdminError::Coordinator(e) => (e.public_message(), e.details()),
            AdminError::Config(_) | AdminError::Io(_) => (
                "internal error of the admin endpoint".to_owned(),
                Vec::new(),
            ),
            other => (other.to_string(), Vec::new()),
        };
        serde_json::json!({"error": {"code": self.code(), "message": message, "details": details}})
    }
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        let status = self.status();
        match &self {
            AdminError::Coordinator(CoordinatorError::Store(e)) => {
                tracing::error!(error = %e, "admin request failed in the store");
            }
            AdminError::Config(_) | AdminError::Io(_) => {
                tracing::error!(error = %self, "admin request failed");
            }
            _ => tracing::debug!(status = status.as_u16(), error = %self, "admin request refused"),
        }
        let mut response = (status, Json(self.body())).into_response();
        if status == StatusCode::UNAUTHORIZED {
            let challenge = if matches!(&self, AdminError::Unauthorized(m) if m.starts_with("missing"))
            {
                r#"Bearer realm="belay-admin""#
            } else {
                r#"Bearer realm="belay-admin", error="invalid_token""#
            };
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(challenge),
            );
        }
        response
    }
}

impl From<JsonRejection> for AdminError {
    fn from(r: JsonRejection) -> AdminError {
        match r.status() {
            StatusCode::PAYLOAD_TOO_LARGE => AdminError::PayloadTooLarge(format!(
                "the request body is larger than {MAX_BODY_BYTES} bytes"
            )),
            StatusCode::UNSUPPORTED_MEDIA_TYPE => AdminError::UnsupportedMediaType(
                "the request body must be JSON with `Content-Type: application/json`".to_owned(),
            ),
            _ => match r {
                JsonRejection::JsonSyntaxError(e) => AdminError::bad_request(format!(
                    "malformed JSON: {}",
                    without_prefix(&e.body_text())
                )),
                JsonRejection::JsonDataError(e) => AdminError::bad_request(format!(
                    "invalid request body: {}",
                    without_prefix(&e.body_text())
                )),
                other => AdminError::bad_request(other.body_text()),
            },
        }
    }
}

/// An extractor rejection's text without axum's generic lead-in ("Failed to
/// deserialize ...: "), keeping serde's field path, message and position.
fn without_prefix(text: &str) -> &str {
    for lead in [
        "Failed to parse the request body as JSON: ",
        "Failed to deserialize the JSON body into the target type: ",
        "Failed to deserialize query string: ",
    ] {
        if let Some(rest) = text.strip_prefix(lead) {
            return rest;
        }
    }
    text
}

impl From<QueryRejection> for AdminError {
    fn from(r: QueryRejection) -> AdminError {
        AdminError::bad_request(format!(
            "invalid query string: {}",
            without_prefix(&r.body_text())
        ))
    }
}

impl From<PathRejection> for AdminError {
    fn from(r: PathRejection) -> AdminError {
        AdminError::bad_request(format!("invalid path: {}", r.body_text()))
    }
}

/// [`axum::Json`] with rejections mapped to [`AdminError`] (400, 413, 415).
#[derive(Debug)]
pub struct AdminJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for AdminJson<T> {
    type Rejection = AdminError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let Json(value) = Json::<T>::from_request(req, state).await?;
        Ok(AdminJson(value))
    }
}

/// [`axum::extract::Query`] with rejections mapped to [`AdminError`] (400).
#[derive(Debug)]
pub struct AdminQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for AdminQuery<T> {
    type Rejection = AdminError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Query(value) = Query::<T>::from_request_parts(parts, state).await?;
        Ok(AdminQuery(value))
    }
}

/// [`axum::extract::Path`] with rejections mapped to [`AdminError`] (400).
#[derive(Debug)]
pub struct AdminPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for AdminPath<T> {
    type Rejection = AdminError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Path(value) = Path::<T>::from_request_parts(parts, state).await?;
        Ok(AdminPath(value))
    }
}

// ---- authentication ------------------------------------------------------

/// One admin token: a name (recorded as who resolved or paused), the
/// secret (kept only as its SHA-256 digest) and a tenant scope (`*` = every
/// tenant). `Debug` never prints the secret.
#[derive(Clone)]
pub struct AdminToken {
    name: String,
    digest: [u8; 32],
    tenant: String,
    short: bool,
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminToken")
            .field("name", &self.name)
            .field("tenant", &self.tenant)
            .field("token", &"<redacted>")
            .finish()
    }
}

/// Tokens shorter than this are accepted but reported by [`AdminAuth::weak_tokens`].
pub const RECOMMENDED_TOKEN_CHARS: usize = 16;

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@'))
}

impl AdminToken {
    /// A token named `name` (letters, digits, `.`, `_`, `-`, `@`; at most 64),
    /// with secret `token` (no whitespace, `,` or `:`), for `tenant` (`*` for
    /// every tenant). Errors: [`AdminError::Config`] naming what is wrong,
    /// never echoing the secret.
    pub fn new(name: &str, token: &str, tenant: &str) -> Result<AdminToken, AdminError> {
        if !valid_name(name) {
            return Err(AdminError::Config(format!(
                "token name {name:?} must be 1 to 64 letters, digits, `.`, `_`, `-` or `@`"
            )));
        }
        if token.is_empty()
            || token
                .chars()
                .any(|c| c.is_whitespace() || c == ',' || c == ':')
        {
            return Err(AdminError::Config(format!(
                "the token of `{name}` must be non-empty, without whitespace, `,` or `:`"
            )));
        }
        if tenant != "*"
            && (tenant.is_empty() || tenant.chars().any(|c| c.is_whitespace() || c == '/'))
        {
            return Err(AdminError::Config(format!(
                "the tenant of token `{name}` must be `*` or a tenant name, got {tenant:?}"
            )));
        }
        Ok(AdminToken {
            name: name.to_owned(),
            digest: Sha256::digest(token.as_bytes()).into(),
            tenant: tenant.to_owned(),
            short: token.chars().count() < RECOMMENDED_TOKEN_CHARS,
        })
    }

    /// The token's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The tenant scope (`*` = every tenant).
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// Whether this token may act for `tenant`.
    pub fn allows(&self, tenant: &str) -> bool {
        self.tenant == "*" || self.tenant == tenant
    }
}

/// The configured admin tokens. Parse from the `BELAY_ADMIN_TOKENS` format:
/// comma-separated `name:token[:tenant]` entries, tenant defaulting to `*`
/// (every tenant), e.g. `ops:s3cr3t-0123456789,acme-bot:t0k3n-abcdefgh:acme`.
/// Names and tokens must be unique. Presented tokens are compared in constant
/// time (SHA-256 digests compared without early exit, over every token).
#[derive(Debug, Clone, Default)]
pub struct AdminAuth {
    tokens: Vec<AdminToken>,
}

impl AdminAuth {
    /// Auth over `tokens`. Errors: [`AdminError::Config`] on a duplicate name
    /// or token.
    pub fn new(tokens: Vec<AdminToken>) -> Result<AdminAuth, AdminError> {
        for (i, t) in tokens.iter().enumerate() {
            for u in &tokens[..i] {
                if u.name == t.name {
                    return Err(AdminError::Config(format!(
                        "token name `{}` is given twice",
                        t.name
                    )));
                }
                if u.digest == t.digest {
                    return Err(AdminError::Config(format!(
                        "tokens `{}` and `{}` are the same secret",
                        u.name, t.name
                    )));
                }
            }
        }
        Ok(AdminAuth { tokens })
    }

    /// Parse `name:token[:tenant],...` (see [`AdminAuth`]); empty entries are
    /// skipped, so an empty string means no tokens.
    pub fn parse(spec: &str) -> Result<AdminAuth, AdminError> {
        let mut tokens = Vec::new();
        for (i, entry) in spec.split(',').map(str::trim).enumerate() {
            if entry.is_empty() {
                continue;
            }
            let parts: Vec<&str> = entry.split(':').collect();
            let token = match parts.as_slice() {
                [name, token] => AdminToken::new(name, token, "*")?,
                [name, token, tenant] => AdminToken::new(name, token, tenant)?,
                _ => {
                    // Not echoed: a lone value may well be a secret.
                    return Err(AdminError::Config(format!(
                        "entry {} has {} `:`-separated part(s), not `name:token[:tenant]`",
                        i + 1,
                        parts.len()
                    )));
                }
            };
            tokens.push(token);
        }
        AdminAuth::new(tokens)
    }

    /// Whether no token is configured (the endpoint is then not served).
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The configured tokens.
    pub fn tokens(&self) -> &[AdminToken] {
        &self.tokens
    }

    /// Names of tokens shorter than [`RECOMMENDED_TOKEN_CHARS`].
    pub fn weak_tokens(&self) -> Vec<&str> {
        self.tokens
            .iter()
            .filter(|t| t.short)
            .map(|t| t.name.as_str())
            .collect()
    }

    /// The token an `Authorization: Bearer <token>` header names.
    /// Errors: [`AdminError::Unauthorized`] when it is missing, not a bearer
    /// token, or matches no configured token.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<&AdminToken, AdminError> {
        let value = headers.get(header::AUTHORIZATION).ok_or_else(|| {
            AdminError::Unauthorized(
                "missing bearer token: send `Authorization: Bearer <token>`".into(),
            )
        })?;
        let value = value
            .to_str()
            .map_err(|_| AdminError::Unauthorized("invalid bearer token".into()))?;
        let presented = match value.trim().split_once(' ') {
            Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => token.trim(),
            _ => {
                return Err(AdminError::Unauthorized(
                    "the Authorization header is not `Bearer <token>`".into(),
                ));
            }
        };
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut found = None;
        for t in &self.tokens {
            // No early exit: the time taken does not depend on which token
            // (if any) matches, nor on how many bytes match.
            if digest_eq(&t.digest, &digest) && found.is_none() {
                found = Some(t);
            }
        }
        found.ok_or_else(|| AdminError::Unauthorized("invalid bearer token".into()))
    }
}

impl FromStr for AdminAuth {
    type Err = AdminError;

    fn from_str(s: &str) -> Result<AdminAuth, AdminError> {
        AdminAuth::parse(s)
    }
}

/// Constant-time equality of two digests.
fn digest_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b) {
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0
}

/// The authenticated caller of a tenant route (inserted by the auth layer).
#[derive(Debug, Clone)]
pub struct Principal {
    /// The token's name.
    pub token_name: String,
}

impl Principal {
    /// Who acted: `<token name>` or `<token name>/<operator>`.
    /// Errors: [`AdminError::BadRequest`] for an empty, over-long or
    /// control-character operator.
    pub fn actor(&self, operator: Option<&str>) -> Result<String, AdminError> {
        match operator {
            None => Ok(self.token_name.clone()),
            Some(op) => {
                let op = op.trim();
                if op.is_empty()
                    || op.len() > MAX_OPERATOR_BYTES
                    || op.chars().any(char::is_control)
                {
                    return Err(AdminError::bad_request(format!(
                        "`operator` must be 1 to {MAX_OPERATOR_BYTES} bytes without control characters"
                    )));
                }
                Ok(format!("{}/{op}", self.token_name))
            }
        }
    }
}

#[derive(Debug, Clone)]
struct AppState {
    coord: Arc<Coordinator>,
    auth: Arc<AdminAuth>,
}

/// Auth layer of the tenant routes: 401 without a valid token, 403 when the
/// token is not scoped to the path's tenant; runs before the body is read.
async fn require_token(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Result<Response, AdminError> {
    // The token first: nothing else of the request is looked at without one.
    let token = state.auth.authenticate(req.headers())?;
    let (mut parts, body) = req.into_parts();
    let AdminPath(params) =
        AdminPath::<HashMap<String, String>>::from_request_parts(&mut parts, &state).await?;
    let mut req = Request::from_parts(parts, body);
    let tenant = params.get("tenant").map(String::as_str).unwrap_or("");
    if !token.allows(tenant) {
        return Err(AdminError::Forbidden(format!(
            "token `{}` may not act for tenant `{tenant}`",
            token.name
        )));
    }
    let principal = Principal {
        token_name: token.name.clone(),
    };
    req.extensions_mut().insert(principal);
    Ok(next.run(req).await)
}

// ---- request and response shapes -----------------------------------------

/// Query of `GET .../uncertain-outcomes`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    /// `open` (default), `resolved` or `any`.
    status: Option<String>,
    tool: Option<String>,
    run_id: Option<String>,
    older_than_ms: Option<u64>,
    newer_than_ms: Option<u64>,
    page_size: Option<u32>,
    page_token: Option<String>,
}

/// Response of `GET .../uncertain-outcomes`.
#[derive(Debug, Serialize)]
struct UncertainPage {
    items: Vec<UncertainRow>,
    /// `null` on the last page.
    next_page_token: Option<String>,
}

/// `resolution` of a resolve body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum ResolutionTag {
    Succeeded,
    Failed,
    Retry,
}

/// Body of `POST .../resolve`. One flat struct rather than a tagged enum,
/// so a wrong type is reported with its field's path and position; which
/// fields go with which `resolution` is checked in [`ResolveBody::into_parts`].
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveBody {
    resolution: ResolutionTag,
    /// `Some` whenever the field is present, even as `null`.
    #[serde(default, deserialize_with = "present")]
    result: Option<Value>,
    error: Option<String>,
    new_idempotency_key: Option<bool>,
    reason: String,
    operator: Option<String>,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

impl ResolveBody {
    /// The resolution, reason and operator; 400 when a field is missing for,
    /// or not allowed with, the `resolution` given.
    fn into_parts(self) -> Result<(Resolution, String, Option<String>), AdminError> {
        let only = |field: &str, with: &str| {
            AdminError::bad_request(format!(
                "`{field}` is only allowed with `\"resolution\": \"{with}\"`"
            ))
        };
        if self.resolution != ResolutionTag::Succeeded && self.result.is_some() {
            return Err(only("result", "succeeded"));
        }
        if self.resolution != ResolutionTag::Failed && self.error.is_some() {
            return Err(only("error", "failed"));
        }
        if self.resolution != ResolutionTag::Retry && self.new_idempotency_key.is_some() {
            return Err(only("new_idempotency_key", "retry"));
        }
        let resolution = match self.resolution {
            ResolutionTag::Succeeded => Resolution::Succeeded {
                result: self.result.ok_or_else(|| {
                    AdminError::bad_request(
                        "missing field `result`: the result to use is required with `\"resolution\": \"succeeded\"`",
                    )
                })?,
            },
            ResolutionTag::Failed => {
                let error = self.error.unwrap_or_default();
                if error.trim().is_empty() {
                    return Err(AdminError::bad_request(
                        "`error` is required with `\"resolution\": \"failed\"` and must not be empty: it is what the model or workflow sees",
                    ));
                }
                Resolution::Failed { error }
            }
            ResolutionTag::Retry => Resolution::Retry {
                new_idempotency_key: self.new_idempotency_key.unwrap_or(false),
            },
        };
        Ok((resolution, self.reason, self.operator))
    }
}

/// Body of `POST .../runs/{run_id}/pause|resume|cancel`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RunControlBody {
    reason: String,
    operator: Option<String>,
}

/// Query of `GET .../mcp-tools`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct McpToolsQuery {
    /// `pinned`, `changed`, `unpinned`, `unlisted` or `any` (default).
    status: Option<String>,
    /// Only tools of this server.
    server: Option<String>,
}

/// Response of `GET .../mcp-tools`.
#[derive(Debug, Serialize)]
struct McpToolsPage {
    items: Vec<McpToolView>,
}

/// Body of `POST .../mcp-tools/{server}/{tool}/accept`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AcceptMcpToolBody {
    /// The reported definition to accept (`sha256:<hex>`).
    definition_hash: String,
    reason: String,
    operator: Option<String>,
}

/// Query of `GET .../tool-calls`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolCallsQuery {
    tool: Option<String>,
    run_id: Option<String>,
    /// `scheduled` or `refused`.
    decision: Option<String>,
    limit: Option<u32>,
    page_token: Option<String>,
}

/// Response of `GET .../tool-calls`.
#[derive(Debug, Serialize)]
struct ToolCallsPage {
    items: Vec<ToolCallRecord>,
    /// `null` on the last page.
    next_page_token: Option<String>,
}

/// A run as the admin endpoint shows it.
#[derive(Debug, Serialize)]
struct RunView {
    run_id: String,
    tenant: String,
    workflow: String,
    workflow_version: i32,
    status: String,
    status_reason: String,
    input: Value,
    output: Option<Value>,
    idempotency_key: String,
    caller: String,
    last_seq: i64,
    created_at: chrono::DateTime<chrono::Utc>,
    updated_at: chrono::DateTime<chrono::Utc>,
    /// Ids of the run's open uncertain outcomes (at most 500).
    open_uncertain_outcomes: Vec<String>,
}

fn check_reason(reason: &str) -> Result<String, AdminError> {
    let reason = reason.trim();
    if reason.is_empty() {
        return Err(AdminError::bad_request("`reason` must not be empty"));
    }
    if reason.len() > MAX_REASON_BYTES {
        return Err(AdminError::bad_request(format!(
            "`reason` is {} bytes, more than {MAX_REASON_BYTES}",
            reason.len()
        )));
    }
    Ok(reason.to_owned())
}

// ---- handlers --------------------------------------------------------------

async fn openapi_doc() -> Json<Value> {
    Json(openapi::document())
}

async fn list_uncertain(
    State(state): State<AppState>,
    AdminPath(tenant): AdminPath<String>,
    AdminQuery(q): AdminQuery<ListQuery>,
) -> Result<Json<UncertainPage>, AdminError> {
    let filter = UncertainFilter {
        tenant,
        status: Some(q.status.unwrap_or_else(|| "open".to_owned())),
        tool: q.tool,
        run_id: q.run_id,
        older_than_ms: q.older_than_ms,
        newer_than_ms: q.newer_than_ms,
        page_size: q.page_size.unwrap_or(0),
        page_token: q.page_token.unwrap_or_default(),
    };
    let (items, next) = state.coord.list_uncertain(&filter).await?;
    Ok(Json(UncertainPage {
        items,
        next_page_token: Some(next).filter(|t| !t.is_empty()),
    }))
}

async fn show_uncertain(
    State(state): State<AppState>,
    AdminPath((tenant, id)): AdminPath<(String, String)>,
) -> Result<Json<UncertainRow>, AdminError> {
    Ok(Json(state.coord.get_uncertain(&tenant, &id).await?))
}

async fn resolve_uncertain(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    AdminPath((tenant, id)): AdminPath<(String, String)>,
    AdminJson(body): AdminJson<ResolveBody>,
) -> Result<Json<UncertainRow>, AdminError> {
    let (resolution, reason, operator) = body.into_parts()?;
    let reason = check_reason(&reason)?;
    let by = principal.actor(operator.as_deref())?;
    let row = state
        .coord
        .resolve_uncertain(&tenant, &id, resolution, &by, &reason)
        .await?;
    Ok(Json(row))
}

async fn run_view(state: &AppState, run: RunRow) -> Result<RunView, AdminError> {
    let (open, _) = state
        .coord
        .list_uncertain(&UncertainFilter {
            tenant: run.tenant.clone(),
            status: Some("open".into()),
            run_id: Some(run.run_id.to_string()),
            page_size: 500,
            ..UncertainFilter::default()
        })
        .await?;
    Ok(RunView {
        run_id: run.run_id.to_string(),
        tenant: run.tenant,
        workflow: run.workflow,
        workflow_version: run.workflow_version,
        status: run.status,
        status_reason: run.status_reason,
        input: run.input,
        output: run.output,
        idempotency_key: run.idempotency_key,
        caller: run.caller,
        last_seq: run.last_seq,
        created_at: run.created_at,
        updated_at: run.updated_at,
        open_uncertain_outcomes: open.iter().map(|r| r.uncertain_id.to_string()).collect(),
    })
}

async fn get_run(
    State(state): State<AppState>,
    AdminPath((tenant, run_id)): AdminPath<(String, String)>,
) -> Result<Json<RunView>, AdminError> {
    let run = state.coord.get_run(&tenant, &run_id).await?;
    Ok(Json(run_view(&state, run).await?))
}

async fn pause_run(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    AdminPath((tenant, run_id)): AdminPath<(String, String)>,
    AdminJson(body): AdminJson<RunControlBody>,
) -> Result<Json<RunView>, AdminError> {
    let reason = check_reason(&body.reason)?;
    let by = principal.actor(body.operator.as_deref())?;
    let run = state
        .coord
        .pause_run(&tenant, &run_id, &by, &reason)
        .await?;
    Ok(Json(run_view(&state, run).await?))
}

async fn resume_run(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    AdminPath((tenant, run_id)): AdminPath<(String, String)>,
    AdminJson(body): AdminJson<RunControlBody>,
) -> Result<Json<RunView>, AdminError> {
    let reason = check_reason(&body.reason)?;
    let by = principal.actor(body.operator.as_deref())?;
    let run = state
        .coord
        .resume_run(&tenant, &run_id, &by, &reason)
        .await?;
    Ok(Json(run_view(&state, run).await?))
}

async fn cancel_run(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    AdminPath((tenant, run_id)): AdminPath<(String, String)>,
    AdminJson(body): AdminJson<RunControlBody>,
) -> Result<Json<RunView>, AdminError> {
    let reason = check_reason(&body.reason)?;
    let by = principal.actor(body.operator.as_deref())?;
    // The run's cancel event records only a reason: name who cancelled in it.
    let reason = format!("{reason} (cancelled by {by})");
    let run = state.coord.cancel_run(&tenant, &run_id, &reason).await?;
    tracing::info!(run_id = %run.run_id, by, "run cancelled by operator");
    Ok(Json(run_view(&state, run).await?))
}

async fn fail_waiting_call(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    AdminPath((tenant, run_id, call_id)): AdminPath<(String, String, String)>,
    AdminJson(body): AdminJson<RunControlBody>,
) -> Result<Json<RunView>, AdminError> {
    let reason = check_reason(&body.reason)?;
    let by = principal.actor(body.operator.as_deref())?;
    let run = state
        .coord
        .fail_waiting_call(&tenant, &run_id, &call_id, &by, &reason)
        .await?;
    tracing::info!(run_id = %run.run_id, call_id, by, "waiting call failed by operator");
    Ok(Json(run_view(&state, run).await?))
}

async fn list_mcp_tools(
    State(state): State<AppState>,
    AdminPath(tenant): AdminPath<String>,
    AdminQuery(q): AdminQuery<McpToolsQuery>,
) -> Result<Json<McpToolsPage>, AdminError> {
    let status = match q.status.as_deref() {
        None | Some("any") => None,
        Some("pinned") => Some(McpToolStatus::Pinned),
        Some("changed") => Some(McpToolStatus::Changed),
        Some("unpinned") => Some(McpToolStatus::Unpinned),
        Some("unlisted") => Some(McpToolStatus::Unlisted),
        Some(other) => {
            return Err(AdminError::bad_request(format!(
                "invalid query string: `status` {other:?} is not one of `pinned`, `changed`, `unpinned`, `unlisted`, `any`"
            )));
        }
    };
    let filter = McpToolFilter {
        status,
        server: q.server,
    };
    let items = state.coord.list_mcp_tools(&tenant, &filter).await?;
    Ok(Json(McpToolsPage { items }))
}

async fn show_mcp_tool(
    State(state): State<AppState>,
    AdminPath((tenant, server, tool)): AdminPath<(String, String, String)>,
) -> Result<Json<McpToolDetail>, AdminError> {
    Ok(Json(
        state.coord.get_mcp_tool(&tenant, &server, &tool).await?,
    ))
}

async fn accept_mcp_tool(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    AdminPath((tenant, server, tool)): AdminPath<(String, String, String)>,
    AdminJson(body): AdminJson<AcceptMcpToolBody>,
) -> Result<Json<McpToolView>, AdminError> {
    let reason = check_reason(&body.reason)?;
    let by = principal.actor(body.operator.as_deref())?;
    let view = state
        .coord
        .accept_mcp_tool(&tenant, &server, &tool, &body.definition_hash, &by, &reason)
        .await?;
    Ok(Json(view))
}

async fn list_tool_calls(
    State(state): State<AppState>,
    AdminPath(tenant): AdminPath<String>,
    AdminQuery(q): AdminQuery<ToolCallsQuery>,
) -> Result<Json<ToolCallsPage>, AdminError> {
    let filter = ToolCallFilter {
        tenant,
        tool: q.tool,
        run_id: q.run_id,
        decision: q.decision,
        limit: q.limit,
        page_token: q.page_token,
    };
    let (items, next) = state.coord.list_tool_calls(&filter).await?;
    Ok(Json(ToolCallsPage {
        items,
        next_page_token: Some(next).filter(|t| !t.is_empty()),
    }))
}

async fn no_route(req: Request) -> AdminError {
    AdminError::RouteNotFound(format!(
        "no admin route {} {}; see {OPENAPI_PATH}",
        req.method(),
        req.uri().path()
    ))
}

async fn wrong_method(req: Request) -> AdminError {
    AdminError::MethodNotAllowed(format!(
        "{} is not allowed on {}; see {OPENAPI_PATH}",
        req.method(),
        req.uri().path()
    ))
}

/// The admin router: every route of [`ROUTES`], bodies limited to
/// [`MAX_BODY_BYTES`], tenant routes behind `auth`, unknown routes and
/// methods answered with the JSON error shape (404, 405).
pub fn router(coord: Arc<Coordinator>, auth: AdminAuth) -> Router {
    let state = AppState {
        coord,
        auth: Arc::new(auth),
    };
    let tenant_routes = Router::new()
        .route(UNCERTAIN_LIST_PATH, get(list_uncertain))
        .route(UNCERTAIN_PATH, get(show_uncertain))
        .route(UNCERTAIN_RESOLVE_PATH, post(resolve_uncertain))
        .route(RUN_PATH, get(get_run))
        .route(RUN_PAUSE_PATH, post(pause_run))
        .route(RUN_RESUME_PATH, post(resume_run))
        .route(RUN_CANCEL_PATH, post(cancel_run))
        .route(RUN_CALL_FAIL_PATH, post(fail_waiting_call))
        .route(MCP_TOOLS_PATH, get(list_mcp_tools))
        .route(MCP_TOOL_PATH, get(show_mcp_tool))
        .route(MCP_TOOL_ACCEPT_PATH, post(accept_mcp_tool))
        .route(TOOL_CALLS_PATH, get(list_tool_calls))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token));
    Router::new()
        .route(OPENAPI_PATH, get(openapi_doc))
        .merge(tenant_routes)
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// Serve the admin endpoint on `listener` (a `TcpListener`, or a
/// [`crate::tls::Listener`] for TLS) until `shutdown` completes; requests
/// carry their [`crate::tls::PeerInfo`] ([`crate::tls::serve_http`]).
/// Errors: [`AdminError::Io`] when serving fails.
pub async fn serve(
    coord: Arc<Coordinator>,
    auth: AdminAuth,
    listener: impl Into<crate::tls::Listener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), AdminError> {
    crate::tls::serve_http(listener, router(coord, auth), shutdown).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(value).expect("header"),
        );
        h
    }

    #[test]
    fn token_config_parses_names_tokens_and_tenants() {
        let auth = AdminAuth::parse(" ops:0123456789abcdef , bot:short:acme ,").expect("parse");
        assert_eq!(auth.tokens().len(), 2);
        assert_eq!(
            (auth.tokens()[0].name(), auth.tokens()[0].tenant()),
            ("ops", "*")
        );
        assert_eq!(
            (auth.tokens()[1].name(), auth.tokens()[1].tenant()),
            ("bot", "acme")
        );
        assert_eq!(auth.weak_tokens(), vec!["bot"]);
        assert!(AdminAuth::parse("").expect("empty").is_empty());
        assert!(
            !format!("{auth:?}").contains("0123456789abcdef"),
            "Debug redacts"
        );
    }

    #[test]
    fn token_config_errors_are_precise_and_never_echo_secrets() {
        for (spec, needle) in [
            ("s3cr3t-value", "entry 1 has 1 `:`-separated part(s)"),
            ("ops:a:b:c", "not `name:token[:tenant]`"),
            ("op s:tok", "token name"),
            ("ops:", "must be non-empty"),
            ("ops:tok:", "tenant of token `ops`"),
            ("a:tok,a:tok2", "given twice"),
            ("a:tok,b:tok", "same secret"),
        ] {
            let err = AdminAuth::parse(spec).expect_err(spec).to_string();
            assert!(err.contains(needle), "{spec}: {err}");
            assert!(!err.contains("tok2") && !err.contains("s3cr3t"), "{err}");
        }
    }

    #[test]
    fn bearer_tokens_authenticate_by_digest() {
        let auth = AdminAuth::parse("ops:secret-1,bot:secret-2:acme").expect("parse");
        assert_eq!(
            auth.authenticate(&headers("Bearer secret-2"))
                .expect("ok")
                .name(),
            "bot"
        );
        assert_eq!(
            auth.authenticate(&headers("bearer  secret-1"))
                .expect("ok")
                .name(),
            "ops"
        );
        for bad in [
            "Bearer secret-3",
            "Basic c2VjcmV0LTE=",
            "secret-1",
            "Bearer ",
        ] {
            assert!(
                matches!(
                    auth.authenticate(&headers(bad)),
                    Err(AdminError::Unauthorized(_))
                ),
                "{bad}"
            );
        }
        assert!(
            matches!(auth.authenticate(&HeaderMap::new()), Err(AdminError::Unauthorized(m)) if m.starts_with("missing"))
        );
        assert!(auth.tokens()[1].allows("acme") && !auth.tokens()[1].allows("other"));
        assert!(auth.tokens()[0].allows("anyone"));
    }

    #[test]
    fn coordinator_errors_map_to_one_status_and_code_each() {
        use crate::store::StoreError;
        let cases = [
            (
                CoordinatorError::NotFound("run x".into()),
                404,
                "not_found",
                "run x not found",
            ),
            (
                CoordinatorError::InvalidArgument("bad".into()),
                400,
                "invalid_argument",
                "bad",
            ),
            (
                CoordinatorError::Definitions(Vec::new()),
                400,
                "invalid_argument",
                "0 definition error(s)",
            ),
            (
                CoordinatorError::FailedPrecondition("finished".into()),
                409,
                "failed_precondition",
                "finished",
            ),
            (
                CoordinatorError::Conflict("already resolved".into()),
                409,
                "conflict",
                "already resolved",
            ),
            (
                CoordinatorError::Unprocessable {
                    message: "no match".into(),
                    errors: vec!["/id: 5 is not a string".into()],
                },
                422,
                "unprocessable",
                "no match",
            ),
            (
                CoordinatorError::Store(StoreError::Corrupt("SELECT password FROM t".into())),
                503,
                "unavailable",
                "the engine's database is unavailable or failed; retry later",
            ),
        ];
        for (e, status, code, message) in cases {
            let e = AdminError::from(e);
            assert_eq!((e.status().as_u16(), e.code()), (status, code), "{e:?}");
            let body = e.body();
            assert_eq!(body["error"]["message"], message, "{body}");
            assert!(body["error"]["details"].is_array());
            assert!(!body.to_string().contains("SELECT"), "no SQL leaks: {body}");
        }
        let e = AdminError::from(CoordinatorError::Unprocessable {
            message: "m".into(),
            errors: vec!["a".into(), "b".into()],
        });
        assert_eq!(e.body()["error"]["details"], serde_json::json!(["a", "b"]));
        let response = AdminError::Unauthorized("missing bearer token".into()).into_response();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            response.headers()[header::WWW_AUTHENTICATE],
            r#"Bearer realm="belay-admin""#
        );
    }

    #[test]
    fn actor_combines_token_name_and_operator() {
        let p = Principal {
            token_name: "ops".into(),
        };
        assert_eq!(p.actor(None).expect("actor"), "ops");
        assert_eq!(p.actor(Some(" alice ")).expect("actor"), "ops/alice");
        assert!(p.actor(Some("  ")).is_err());
        assert!(p.actor(Some("a\nb")).is_err());
    }

    #[test]
    fn resolve_bodies_decode_strictly() {
        let parts = |json: &str| {
            serde_json::from_str::<ResolveBody>(json)
                .map_err(|e| e.to_string())
                .and_then(|b| b.into_parts().map_err(|e| e.to_string()))
        };
        assert!(matches!(
            parts(r#"{"resolution":"retry","reason":"r"}"#),
            Ok((
                Resolution::Retry {
                    new_idempotency_key: false
                },
                _,
                None
            ))
        ));
        assert!(matches!(
            parts(r#"{"resolution":"succeeded","result":null,"reason":"r","operator":"a"}"#),
            Ok((
                Resolution::Succeeded {
                    result: Value::Null
                },
                _,
                Some(_)
            ))
        ));
        for (bad, needle) in [
            (
                r#"{"resolution":"succeeded","reason":"r"}"#,
                "missing field `result`",
            ),
            (
                r#"{"resolution":"failed","reason":"r"}"#,
                "`error` is required",
            ),
            (
                r#"{"resolution":"failed","error":"e","reason":"r","extra":1}"#,
                "unknown field `extra`",
            ),
            (
                r#"{"resolution":"maybe","reason":"r"}"#,
                "unknown variant `maybe`",
            ),
            (
                r#"{"resolution":"retry","new_idempotency_key":"yes","reason":"r"}"#,
                "expected a boolean",
            ),
            (
                r#"{"resolution":"retry","result":{},"reason":"r"}"#,
                "`result` is only allowed",
            ),
            (
                r#"{"resolution":"succeeded","result":{},"error":"e","reason":"r"}"#,
                "`error` is only allowed",
            ),
            (
                r#"{"resolution":"failed","error":"e","new_idempotency_key":true,"reason":"r"}"#,
                "`new_idempotency_key` is only allowed",
            ),
            (
                r#"{"result":{},"reason":"r"}"#,
                "missing field `resolution`",
            ),
        ] {
            let err = parts(bad).expect_err(bad);
            assert!(err.contains(needle), "{bad}: {err}");
        }
    }
}
