//! The admin HTTP endpoint: JSON over HTTP/1.1 on its own port, for
//! operators. It lists, shows and resolves uncertain outcomes, pauses,
//! resumes and cancels runs, lists MCP tool definitions and accepts
//! changed ones ([`crate::mcp_pins`]), and lists the tool calls of a
//! tenant's runs for audit ([`crate::audit`]), and serves the engine's
//! Prometheus metrics ([`METRICS_PATH`]) and, beside its JSON routes, the
//! operator console's pages ([`crate::console`]). Every route but the public ones
//! ([`PUBLIC_ROUTES`]: the OpenAPI document and the metrics) needs a bearer
//! token ([`AdminAuth`]); tenants are named in the path
//! (`/admin/v1/tenants/{tenant}/...`).
//!
//! Errors are JSON, `{"error": {"code", "message", "details"}}` (see
//! [`AdminError`]; the status codes are listed in [`AdminError::status`]).
//! Architecture Invariant: this module is the one place where errors become
//! HTTP responses; database details never reach clients (they are logged).
//! Authentication runs before a request body is read, so a request without
//! a valid token changes nothing and learns nothing.

mod keys;
mod openapi;

pub use keys::{KEY_REVOKE_PATH, KEYS_PATH, valid_principal_id};

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{
    DefaultBodyLimit, Extension, FromRequest, FromRequestParts, Path, Query, Request, State,
};
use axum::http::{HeaderValue, StatusCode, header, request::Parts};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::audit::ToolCallFilter;
pub use crate::auth::{AdminAuth, AdminToken, RECOMMENDED_TOKEN_CHARS};
use crate::auth::{AuthError, Authenticator, Credentials, Principal, Role};
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

/// The engine's Prometheus metrics, text exposition format
/// ([`crate::metrics`]). Public, like a health check: Prometheus scrapes
/// without a credential (keep the admin port off the internet, or allow
/// only the scraper to reach it).
pub const METRICS_PATH: &str = "/metrics";

/// The routes anyone may call, without a credential: the OpenAPI document
/// and the metrics. Every other route of [`ROUTES`] needs a principal.
pub const PUBLIC_ROUTES: &[&str] = &[OPENAPI_PATH, METRICS_PATH];

/// Every route the router serves, as `(method, path template)`; the OpenAPI
/// document describes exactly these.
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", OPENAPI_PATH),
    ("GET", METRICS_PATH),
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
    ("GET", KEYS_PATH),
    ("POST", KEYS_PATH),
    ("POST", KEY_REVOKE_PATH),
];

/// Errors of the admin layer. Each has one [`ErrorCode`]
/// ([`AdminError::error_code`]), which gives its HTTP status and error code
/// ([`AdminError::status`], [`AdminError::code`]); the codes themselves are
/// mapped in [`crate::error_code`], the one place for every wire.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// A fault of the endpoint itself (no randomness for a key). Never
    /// produced by a request's content.
    #[error("{0}")]
    Internal(String),
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
            AdminError::Internal(_) | AdminError::Io(_) => ErrorCode::Internal,
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
            AdminError::Internal(_) | AdminError::Io(_) => (
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
            AdminError::Internal(_) | AdminError::Io(_) => {
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

/// Who acted, as events record it: the principal's id, or
/// `<id>/<operator>` for a named operator acting through it. Errors:
/// [`AdminError::BadRequest`] for an empty, over-long or control-character
/// operator.
fn actor(principal: &Principal, operator: Option<&str>) -> Result<String, AdminError> {
    match operator {
        None => Ok(principal.id.clone()),
        Some(op) if op.trim().is_empty() => Err(AdminError::bad_request(format!(
            "`operator` must be 1 to {MAX_OPERATOR_BYTES} bytes without control characters"
        ))),
        Some(op) => principal.actor(op).map_err(|_| {
            AdminError::bad_request(format!(
                "`operator` must be 1 to {MAX_OPERATOR_BYTES} bytes without control characters"
            ))
        }),
    }
}

#[derive(Debug, Clone)]
struct AppState {
    coord: Arc<Coordinator>,
    auth: Authenticator,
}

/// The roles the tenant routes admit: operating a tenant.
pub(crate) const OPERATE: &[Role] = &[Role::Operator, Role::Admin];

/// Authenticate a request (401 without a credential that proves a
/// principal), before anything else of it is looked at. The credentials
/// are taken out of the request first, so the returned future holds no
/// reference to it while the store is asked.
fn authenticate(
    state: &AppState,
    req: &Request,
) -> Result<impl Future<Output = Result<Principal, AuthError>> + Send + 'static, AdminError> {
    let credentials = Credentials::from_headers(req.headers(), peer_cert_subject(req))?;
    let auth = state.auth.clone();
    Ok(async move { auth.authenticate(credentials).await })
}

/// The subject of the connection's verified client certificate (the
/// listener's [`PeerInfo`](crate::tls::PeerInfo)).
fn peer_cert_subject(req: &Request) -> Option<String> {
    req.extensions()
        .get::<crate::tls::PeerInfo>()
        .and_then(|p| p.client_cert_subject.clone())
}

/// Auth layer of the tenant routes: 401 without a valid credential, 403
/// for a principal that is not an operator or admin of the path's tenant;
/// runs before the body is read.
async fn require_operator(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Result<Response, AdminError> {
    let principal = authenticate(&state, &req)?.await?;
    if !principal.has_role(OPERATE) {
        return Err(AdminError::Forbidden(format!(
            "principal `{}` has role {}; the admin endpoint needs role operator or admin",
            principal.id, principal.role
        )));
    }
    let (mut parts, body) = req.into_parts();
    let AdminPath(params) =
        AdminPath::<HashMap<String, String>>::from_request_parts(&mut parts, &state).await?;
    let mut req = Request::from_parts(parts, body);
    let tenant = params.get("tenant").map(String::as_str).unwrap_or("");
    principal.require_tenant(tenant)?;
    req.extensions_mut().insert(principal);
    Ok(next.run(req).await)
}

/// Auth layer of the key routes: 401 without a valid credential, 403 for a
/// principal that is not an operator or admin (the handlers check tenants).
async fn require_key_manager(
    State(state): State<AppState>,
    mut req: Request,
    next: Next,
) -> Result<Response, AdminError> {
    let principal = authenticate(&state, &req)?.await?;
    if !principal.has_role(OPERATE) {
        return Err(AdminError::Forbidden(format!(
            "principal `{}` has role {}; managing keys needs role operator or admin",
            principal.id, principal.role
        )));
    }
    req.extensions_mut().insert(principal);
    Ok(next.run(req).await)
}

impl From<AuthError> for AdminError {
    fn from(e: AuthError) -> AdminError {
        match e {
            AuthError::Unauthenticated(m) => AdminError::Unauthorized(m),
            AuthError::PermissionDenied(m) => AdminError::Forbidden(m),
            AuthError::InvalidArgument(m) => AdminError::bad_request(m),
            AuthError::Store(e) => AdminError::Coordinator(CoordinatorError::Store(e)),
            AuthError::Config(m) | AuthError::Internal(m) => AdminError::Internal(m),
        }
    }
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

/// `GET /metrics`: the engine's metrics (database gauges read at most once
/// a second), as Prometheus's text format 0.0.4.
async fn metrics(State(state): State<AppState>) -> impl axum::response::IntoResponse {
    let text = state
        .coord
        .metrics()
        .render(state.coord.store(), state.coord.live_window_ms())
        .await;
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
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
    let by = actor(&principal, operator.as_deref())?;
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
    let by = actor(&principal, body.operator.as_deref())?;
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
    let by = actor(&principal, body.operator.as_deref())?;
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
    let by = actor(&principal, body.operator.as_deref())?;
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
    let by = actor(&principal, body.operator.as_deref())?;
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
    let by = actor(&principal, body.operator.as_deref())?;
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
/// methods answered with the JSON error shape (404, 405); with the
/// operator console ([`crate::console`]) beside them, its cookies not
/// `Secure` (see [`router_for`]).
pub fn router(coord: Arc<Coordinator>, auth: Authenticator) -> Router {
    router_for(coord, auth, false)
}

/// [`router`] for a listener that serves TLS when `tls`: the console's
/// session cookies are then `Secure`.
pub fn router_for(coord: Arc<Coordinator>, auth: Authenticator, tls: bool) -> Router {
    let console = crate::console::router(Arc::clone(&coord), auth.clone(), tls);
    let state = AppState { coord, auth };
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
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_operator,
        ));
    let key_routes = Router::new()
        .route(KEYS_PATH, get(keys::list_keys).post(keys::create_key))
        .route(KEY_REVOKE_PATH, post(keys::revoke_key))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_key_manager,
        ));
    Router::new()
        .route(OPENAPI_PATH, get(openapi_doc))
        .route(METRICS_PATH, get(metrics))
        .merge(tenant_routes)
        .merge(key_routes)
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
        .merge(console)
}

/// Serve the admin endpoint on `listener` (a `TcpListener`, or a
/// [`crate::tls::Listener`] for TLS) until `shutdown` completes; requests
/// carry their [`crate::tls::PeerInfo`] ([`crate::tls::serve_http`]).
/// Errors: [`AdminError::Io`] when serving fails.
pub async fn serve(
    coord: Arc<Coordinator>,
    auth: Authenticator,
    listener: impl Into<crate::tls::Listener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), AdminError> {
    crate::tls::serve_http(listener, router(coord, auth), shutdown).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn actor_combines_principal_and_operator() {
        let p = AdminToken::new("ops", "secret-0123456789", "*")
            .expect("token")
            .principal();
        assert_eq!(actor(&p, None).expect("actor"), "ops");
        assert_eq!(actor(&p, Some(" alice ")).expect("actor"), "ops/alice");
        assert!(actor(&p, Some("  ")).is_err());
        assert!(actor(&p, Some("a\nb")).is_err());
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
