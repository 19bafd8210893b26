//! The console's stylesheet and script, embedded in the binary
//! (`include_str!`), so the console needs no network and no CDN.

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

/// The stylesheet.
const CSS: &str = include_str!("static/console.css");
/// The script: live updates of the parts of a page marked `data-live`, and
/// the verdict fields of the uncertain-outcome forms.
const JS: &str = include_str!("static/console.js");

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut response = body.into_response();
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // Assets change only with the binary; an hour is enough for a console.
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, max-age=3600"),
    );
    response
}

/// `GET /console/assets/console.css`.
pub(crate) async fn css() -> Response {
    asset(CSS, "text/css; charset=utf-8")
}

/// `GET /console/assets/console.js`.
pub(crate) async fn js() -> Response {
    asset(JS, "text/javascript; charset=utf-8")
}
