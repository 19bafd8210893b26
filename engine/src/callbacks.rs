//! The callback endpoint of `type: async_webhook` tools (HTTP, axum).
//!
//! `POST /callbacks/v1/{token}` with the tool's result as a JSON body. The
//! token is the only credential: 256 random bits minted at dispatch, handed to
//! the worker once inside the callback URL, stored only as its SHA-256
//! (`callbacks` table and the run's `callback_issued` event). It is served on
//! its own listener (`--callback-listen`), apart from the admin endpoint, so
//! tool servers outside the cluster can reach it without reaching the admin
//! API.
//!
//! Answers (JSON; errors use the admin endpoint's error shape):
//! - 200 `{"applied": true, "run_id"}`: the result completed the call (or
//!   resolved its uncertain outcome).
//! - 200 `{"applied": false, "run_id", "detail"}`: nothing was applied: the
//!   token was used before (a replay; nothing changed), or the call or the
//!   run had already ended (the timeout fired, the run was cancelled): the
//!   callback is then kept in the run's history as a late result. Either way
//!   the sender should not retry.
//! - 404: no such token. 400: the body is not JSON. 413: larger than
//!   [`MAX_CALLBACK_BYTES`]. 422: the result does not match the tool's output
//!   type (the token stays unused: a corrected callback may follow).
//!   503: the database is unavailable.

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::json;

use crate::admin::AdminError;
use crate::coordinator::{CALLBACK_PATH_PREFIX, Coordinator, MAX_CALLBACK_BYTES};

/// Route of the callback endpoint (axum syntax).
pub const CALLBACK_PATH: &str = "/callbacks/v1/{token}";

async fn receive(
    State(coord): State<Arc<Coordinator>>,
    Path(token): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, AdminError> {
    let body = body.map_err(|r| {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            AdminError::PayloadTooLarge(format!(
                "the callback body is larger than {MAX_CALLBACK_BYTES} bytes"
            ))
        } else {
            AdminError::BadRequest {
                message: format!("cannot read the callback body: {}", r.body_text()),
                details: Vec::new(),
            }
        }
    })?;
    let outcome = coord.callback(&token, &body).await?;
    Ok((
        StatusCode::OK,
        axum::Json(match outcome.detail {
            Some(detail) => json!({
                "applied": outcome.applied,
                "run_id": outcome.run_id.to_string(),
                "detail": detail,
            }),
            None => json!({"applied": outcome.applied, "run_id": outcome.run_id.to_string()}),
        }),
    )
        .into_response())
}

async fn no_route(req: axum::extract::Request) -> AdminError {
    AdminError::RouteNotFound(format!(
        "no callback route {}; callbacks are POST {CALLBACK_PATH_PREFIX}{{token}}",
        req.uri().path()
    ))
}

/// [`CALLBACK_PATH`] with bodies up to [`MAX_CALLBACK_BYTES`] and no
/// fallback, to merge into another router (`belay dev` serves it beside the
/// admin endpoint).
pub fn routes(coord: Arc<Coordinator>) -> Router {
    Router::new()
        .route(CALLBACK_PATH, post(receive))
        .layer(DefaultBodyLimit::max(MAX_CALLBACK_BYTES))
        .with_state(coord)
}

/// The callback router: [`routes`] and a JSON 404 for anything else.
pub fn router(coord: Arc<Coordinator>) -> Router {
    routes(coord).fallback(no_route)
}

/// Serve the callback endpoint on `listener` (a `TcpListener`, or a
/// [`crate::tls::Listener`] for TLS) until `shutdown` completes.
/// Errors: [`AdminError::Io`] when serving fails.
pub async fn serve(
    coord: Arc<Coordinator>,
    listener: impl Into<crate::tls::Listener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), AdminError> {
    crate::tls::serve_http(listener, router(coord), shutdown).await?;
    Ok(())
}
