//! How the console answers a refusal or a failure: an HTML page with the
//! status and message the admin endpoint would give ([`AdminError`], whose
//! codes come from [`crate::error_code`]), or, for a page asked for
//! without a session, a redirect to the login page.

use askama::Template;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};

use super::LOGIN_PATH;
use crate::admin::AdminError;
use crate::auth::AuthError;
use crate::coordinator::CoordinatorError;
use crate::store::StoreError;

/// Why a console request did not get its page.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    /// A page was asked for without a (valid) session: 303 to the login
    /// page, which comes back to `next` once signed in.
    #[error("sign in to see {next}")]
    SignIn {
        /// The path and query asked for.
        next: String,
    },
    /// Refused or failed, with the admin endpoint's status and message.
    #[error(transparent)]
    Refused(#[from] AdminError),
}

impl From<CoordinatorError> for ConsoleError {
    fn from(e: CoordinatorError) -> ConsoleError {
        ConsoleError::Refused(AdminError::Coordinator(e))
    }
}

impl From<AuthError> for ConsoleError {
    fn from(e: AuthError) -> ConsoleError {
        ConsoleError::Refused(AdminError::from(e))
    }
}

impl From<StoreError> for ConsoleError {
    fn from(e: StoreError) -> ConsoleError {
        ConsoleError::from(CoordinatorError::Store(e))
    }
}

impl From<askama::Error> for ConsoleError {
    fn from(e: askama::Error) -> ConsoleError {
        ConsoleError::Refused(AdminError::Internal(format!(
            "rendering a console page: {e}"
        )))
    }
}

impl ConsoleError {
    /// A refusal with 400 and `message`.
    pub(crate) fn bad_request(message: impl Into<String>) -> ConsoleError {
        ConsoleError::Refused(AdminError::BadRequest {
            message: message.into(),
            details: Vec::new(),
        })
    }
}

/// The error page.
#[derive(Template)]
#[template(path = "console/error.html")]
struct ErrorPage {
    status: u16,
    code: String,
    message: String,
    details: Vec<String>,
}

impl IntoResponse for ConsoleError {
    fn into_response(self) -> Response {
        let e = match self {
            ConsoleError::SignIn { next } => {
                let to = format!("{LOGIN_PATH}?next={}", super::page::query_value(&next));
                return super::page::redirect(&to);
            }
            ConsoleError::Refused(e) => e,
        };
        let status = e.status();
        match &e {
            AdminError::Coordinator(CoordinatorError::Store(s)) => {
                tracing::error!(error = %s, "console request failed in the store");
            }
            AdminError::Internal(_) | AdminError::Io(_) => {
                tracing::error!(error = %e, "console request failed");
            }
            _ => tracing::debug!(status = status.as_u16(), error = %e, "console request refused"),
        }
        // The admin endpoint's body: its message never holds store details.
        let body = e.body();
        let page = ErrorPage {
            status: status.as_u16(),
            code: e.code().to_owned(),
            message: body["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            details: body["error"]["details"]
                .as_array()
                .map(|d| {
                    d.iter()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default(),
        };
        match page.render() {
            Ok(html) => (status, Html(html)).into_response(),
            Err(_) => {
                let mut r = (status, page.message).into_response();
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; charset=utf-8"),
                );
                r
            }
        }
    }
}

impl ConsoleError {
    /// The HTTP status it answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            ConsoleError::SignIn { .. } => StatusCode::SEE_OTHER,
            ConsoleError::Refused(e) => e.status(),
        }
    }
}
