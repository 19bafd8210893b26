//! What every console page shares: the layout's data ([`Layout`]: tenant,
//! principal, CSRF token, navigation, notice), rendering, redirects, URLs
//! and the formatting of times and JSON, and the security headers of
//! every console response.

use askama::Template;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::access::Abilities;
use super::error::ConsoleError;
use super::session::Viewer;
use crate::auth::Tenants;

/// The layout's data (`templates/console/base.html`).
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    /// The page's title.
    pub(crate) title: String,
    /// The tenant whose pages these are.
    pub(crate) tenant: String,
    /// Who is signed in.
    pub(crate) principal: String,
    /// Its role.
    pub(crate) role: &'static str,
    /// The session's CSRF token.
    pub(crate) csrf: String,
    /// Which navigation entry is current: `runs`, `uncertain`,
    /// `approvals`, `definitions`.
    pub(crate) active: &'static str,
    /// A notice from the previous action ([`notice`]).
    pub(crate) notice: Option<&'static str>,
    /// What the principal may do.
    pub(crate) can: Abilities,
    /// Whether the principal may act for other tenants too (the header
    /// links to the page choosing one).
    pub(crate) switch: bool,
}

impl Layout {
    /// The layout of a page of `viewer`'s tenant.
    pub(crate) fn new(
        viewer: &Viewer,
        title: impl Into<String>,
        active: &'static str,
        notice_code: Option<&str>,
    ) -> Layout {
        Layout {
            title: title.into(),
            tenant: viewer.tenant.clone(),
            principal: viewer.principal.id.clone(),
            role: viewer.principal.role.as_str(),
            csrf: viewer.csrf.clone(),
            active,
            notice: notice_code.and_then(notice),
            can: Abilities::of(&viewer.principal),
            switch: !matches!(&viewer.principal.tenants, Tenants::Only(list) if list.len() == 1),
        }
    }

    /// `/console/t/<tenant>`, the prefix of the tenant's pages.
    pub(crate) fn base(&self) -> String {
        format!("/console/t/{}", seg(&self.tenant))
    }
}

/// The text of a notice code an action redirects with (`?notice=`); an
/// unknown code shows nothing, so no text of a link is ever shown.
pub(crate) fn notice(code: &str) -> Option<&'static str> {
    Some(match code {
        "paused" => "The run was paused.",
        "resumed" => "The operator pause was lifted.",
        "cancelled" => "The run was cancelled.",
        "signalled" => "The signal was delivered.",
        "duplicate" => "That signal id was delivered before; nothing changed.",
        "resolved" => "The uncertain outcome was resolved.",
        "approved" => "Approved.",
        "declined" => "Declined.",
        "answered" => "The answer was sent to the tool.",
        _ => return None,
    })
}

/// A 400 for a query or form axum could not read: `what` (`why`, its
/// `prefix` cut and serde's word `words.0` said as `words.1`): `then`.
fn not_understood(
    why: &str,
    prefix: &str,
    words: (&str, &str),
    what: &str,
    then: &str,
) -> ConsoleError {
    let why = why
        .strip_prefix(prefix)
        .unwrap_or(why)
        .replace(words.0, words.1);
    ConsoleError::bad_request(format!("{what} ({why}): {then}"))
}

/// [`axum::extract::Query`] with rejections as [`ConsoleError`] pages
/// (400) that say the address is not understood and name the parameter
/// (unknown, repeated or of the wrong kind), instead of the admin
/// endpoint's JSON.
#[derive(Debug)]
pub(crate) struct ConsoleQuery<T>(pub(crate) T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ConsoleQuery<T> {
    type Rejection = ConsoleError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(v)| ConsoleQuery(v))
            .map_err(|e| {
                not_understood(
                    &e.body_text(),
                    "Failed to deserialize query string: ",
                    ("field", "parameter"),
                    "this page's address has a query this page does not take",
                    "open the page from the console's links",
                )
            })
    }
}

/// [`axum::Form`] with rejections as [`ConsoleError`]s (400). Fields a
/// form has beyond `T`'s (its CSRF token) are ignored.
#[derive(Debug)]
pub(crate) struct ConsoleForm<T>(pub(crate) T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ConsoleForm<T> {
    type Rejection = ConsoleError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        axum::Form::<T>::from_request(req, state)
            .await
            .map(|axum::Form(v)| ConsoleForm(v))
            .map_err(|e| {
                not_understood(
                    &e.body_text(),
                    "Failed to deserialize form body: ",
                    ("field", "form field"),
                    "the form was not understood",
                    "reload the page and send it again",
                )
            })
    }
}

/// A form's reason, trimmed. Errors: 400 for an empty one or one longer
/// than the admin endpoint takes.
pub(crate) fn reason(text: &str) -> Result<String, ConsoleError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(ConsoleError::bad_request("a reason is required"));
    }
    if text.len() > crate::admin::MAX_REASON_BYTES {
        return Err(ConsoleError::bad_request(format!(
            "the reason is {} bytes, more than {}",
            text.len(),
            crate::admin::MAX_REASON_BYTES
        )));
    }
    Ok(text.to_owned())
}

/// A page as a response.
pub(crate) fn html<T: Template>(page: &T) -> Result<Response, ConsoleError> {
    Ok(Html(page.render()?).into_response())
}

/// 303 See Other to `to` (after a form, and to the login page).
pub(crate) fn redirect(to: &str) -> Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(to) {
        response.headers_mut().insert(header::LOCATION, v);
    }
    response
}

/// The security headers of every console response: scripts, styles and
/// forms only from the engine itself, no framing, no caching of pages
/// (they hold CSRF tokens and tenant data).
pub(crate) async fn security_headers(mut response: Response) -> Response {
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
             connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

/// `s` percent-encoded for one path segment (every byte but RFC 3986's
/// unreserved characters).
pub(crate) fn seg(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `s` percent-encoded for a query value.
pub(crate) fn query_value(s: &str) -> String {
    seg(s)
}

/// The runs page of `tenant`.
pub(crate) fn runs_url(tenant: &str) -> String {
    format!("/console/t/{}/runs", seg(tenant))
}

/// The page of one run.
pub(crate) fn run_url(tenant: &str, run_id: &str) -> String {
    format!("/console/t/{}/runs/{}", seg(tenant), seg(run_id))
}

/// A time as pages show it: `2026-12-02 14:03:11 UTC`.
pub(crate) fn when(t: &DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// A JSON value, indented.
pub(crate) fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
}

/// A JSON value on one line, cut to `max` characters (with `…`).
pub(crate) fn short(v: &Value, max: usize) -> String {
    let text = match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    cut(&text, max)
}

/// `text` cut to `max` characters (with `…`).
pub(crate) fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_owned()
    } else {
        let mut s: String = text.chars().take(max).collect();
        s.push('…');
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_and_cuts() {
        assert_eq!(seg("acme"), "acme");
        assert_eq!(seg("a b/c?"), "a%20b%2Fc%3F");
        assert_eq!(cut("abcdef", 3), "abc…");
        assert_eq!(short(&Value::String("x".into()), 5), "x");
        assert_eq!(
            notice("resolved"),
            Some("The uncertain outcome was resolved.")
        );
        assert_eq!(notice("<script>"), None);
    }
}
