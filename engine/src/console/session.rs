//! Signing in and out, the session cookie, and the guard every console
//! route but the public ones passes: it authenticates the cookie's
//! credential against the store (as the admin endpoint authenticates a
//! bearer header), applies the route's [`Policy`] and the path's tenant,
//! and refuses a form without the session's CSRF token (403) before its
//! handler runs.
//!
//! The cookie holds the credential (base64url), so that no replica needs a
//! session table: a key revoked or expired signs its sessions out on their
//! next request. It is `HttpOnly` (no script reads it), `SameSite=Strict`
//! (no other site's page sends it) and `Secure` under TLS, and lives 12
//! hours. The CSRF token is HMAC-SHA256 of a fixed label keyed with the
//! credential: the same on every replica, unknowable without the
//! credential. The login form has its own token, a random value in a
//! cookie of the login path (double submit), so no other site can sign a
//! browser into a session of its choosing.

use std::collections::HashMap;

use askama::Template;
use axum::body::{Body, to_bytes};
use axum::extract::{FromRequestParts, Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::Sha256;

use super::access::{self, Policy};
use super::error::ConsoleError;
use super::page::{self, redirect};
use super::{ConsoleState, HOME_PATH, LOGIN_PATH};
use crate::admin::{AdminError, AdminQuery, MAX_BODY_BYTES};
use crate::auth::key::constant_time_eq;
use crate::auth::{AuthError, Credentials, Principal};

/// The session cookie: the signed-in credential, base64url.
pub const SESSION_COOKIE: &str = "belay_console";
/// The login form's CSRF cookie (path [`LOGIN_PATH`]).
pub const LOGIN_COOKIE: &str = "belay_console_login";
/// The form field every console form carries its CSRF token in.
pub const CSRF_FIELD: &str = "csrf";
/// How long a session cookie lives, seconds (12 hours).
const SESSION_MAX_AGE_S: u32 = 12 * 3600;
/// The label the CSRF token is the HMAC of.
const CSRF_LABEL: &[u8] = b"belay-console-csrf-v1";

/// The state of [`guard`]: the console's, and the route's policy.
#[derive(Debug, Clone)]
pub(crate) struct Guard {
    pub(crate) state: ConsoleState,
    pub(crate) policy: Policy,
}

/// Who is looking, as [`guard`] hands it to a handler.
#[derive(Debug, Clone)]
pub(crate) struct Viewer {
    /// The authenticated principal.
    pub(crate) principal: Principal,
    /// The session's CSRF token, for the page's forms.
    pub(crate) csrf: String,
    /// The tenant of the path (empty for routes without one).
    pub(crate) tenant: String,
}

/// The value of cookie `name` in a request's headers.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// The CSRF token of a session whose credential is `credential`.
pub(crate) fn csrf_token(credential: &str) -> String {
    // HMAC takes a key of any length.
    let mut mac = match Hmac::<Sha256>::new_from_slice(credential.as_bytes()) {
        Ok(mac) => mac,
        Err(_) => return String::new(),
    };
    mac.update(CSRF_LABEL);
    hex::encode(mac.finalize().into_bytes())
}

/// A `Set-Cookie` value: `HttpOnly`, `SameSite=Strict`, `Secure` when
/// `secure`; `max_age` 0 clears it.
fn set_cookie(name: &str, value: &str, path: &str, max_age: u32, secure: bool) -> HeaderValue {
    let secure = if secure { "; Secure" } else { "" };
    let text = format!(
        "{name}={value}; Path={path}; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}"
    );
    HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static("invalid=1"))
}

/// The principal and credential of the request's session cookie; `None`
/// without one, or when its credential no longer proves anyone (revoked,
/// expired, malformed). Errors: the store could not be read.
async fn signed_in(
    state: &ConsoleState,
    headers: &HeaderMap,
) -> Result<Option<(Principal, String)>, ConsoleError> {
    let Some(value) = cookie(headers, SESSION_COOKIE) else {
        return Ok(None);
    };
    let Some(credential) = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(value)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
    else {
        return Ok(None);
    };
    let credentials = Credentials {
        bearer: Some(credential.clone()),
        cert_subject: None,
    };
    match state.auth.authenticate(credentials).await {
        Ok(principal) => Ok(Some((principal, credential))),
        Err(AuthError::Unauthenticated(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The guard of every non-public console route (see the module doc).
pub(crate) async fn guard(
    State(g): State<Guard>,
    req: Request,
    next: Next,
) -> Result<Response, ConsoleError> {
    let is_post = req.method() == Method::POST;
    // Owned, so the future holds no reference to the request (whose body
    // is not `Sync`) while the store is asked.
    let headers = req.headers().clone();
    let Some((principal, credential)) = signed_in(&g.state, &headers).await? else {
        if is_post {
            return Err(
                AdminError::Unauthorized("sign in first (the session ended)".into()).into(),
            );
        }
        let next = req
            .uri()
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_default();
        return Err(ConsoleError::SignIn { next });
    };
    let (mut parts, body) = req.into_parts();
    let params = Path::<HashMap<String, String>>::from_request_parts(&mut parts, &())
        .await
        .map(|Path(p)| p)
        .unwrap_or_default();
    let tenant = params.get("tenant").cloned().unwrap_or_default();
    if tenant.is_empty() {
        if !g.policy.admits(&principal) {
            return Err(AuthError::PermissionDenied(format!(
                "principal `{}` may not use this page",
                principal.id
            ))
            .into());
        }
    } else {
        access::authorize(&principal, g.policy, &tenant)?;
    }
    let csrf = csrf_token(&credential);
    let body = if is_post {
        let bytes = to_bytes(body, MAX_BODY_BYTES).await.map_err(|_| {
            AdminError::PayloadTooLarge(format!("the form is larger than {MAX_BODY_BYTES} bytes"))
        })?;
        check_csrf(&bytes, &csrf)?;
        Body::from(bytes)
    } else {
        body
    };
    let mut req = Request::from_parts(parts, body);
    req.extensions_mut().insert(Viewer {
        principal,
        csrf,
        tenant,
    });
    Ok(next.run(req).await)
}

/// The form field [`CSRF_FIELD`] of a urlencoded body.
fn form_csrf(body: &[u8]) -> Option<String> {
    form_urlencoded::parse(body)
        .find(|(k, _)| k == CSRF_FIELD)
        .map(|(_, v)| v.into_owned())
}

/// Refuse a form whose CSRF field is missing or is not `expected`: 403.
fn check_csrf(body: &[u8], expected: &str) -> Result<(), ConsoleError> {
    match form_csrf(body) {
        Some(sent)
            if !expected.is_empty() && constant_time_eq(sent.as_bytes(), expected.as_bytes()) =>
        {
            Ok(())
        }
        Some(_) => Err(AdminError::Forbidden(
            "the form's CSRF token is not this session's: reload the page and send it again".into(),
        )
        .into()),
        None => Err(AdminError::Forbidden(
            "the form has no CSRF token: forms of the console must be sent from its pages".into(),
        )
        .into()),
    }
}

/// `GET /console`: the runs of the signed-in principal's tenant, or the
/// login page (not signed in, or a key of several tenants).
pub(crate) async fn home(
    State(state): State<ConsoleState>,
    headers: HeaderMap,
) -> Result<Response, ConsoleError> {
    match signed_in(&state, &headers).await? {
        Some((principal, _)) => match principal.tenant_for("") {
            Ok(tenant) => Ok(redirect(&page::runs_url(&tenant))),
            Err(_) => Ok(redirect(LOGIN_PATH)),
        },
        None => Ok(redirect(LOGIN_PATH)),
    }
}

/// Query of the login page.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LoginQuery {
    /// Where to go once signed in (a console path).
    next: Option<String>,
}

/// The login page.
#[derive(Template)]
#[template(path = "console/login.html")]
struct LoginPage {
    csrf: String,
    next: String,
    tenant: String,
    error: Option<String>,
}

/// `next` when it is a console page of this site, else the empty string.
fn safe_next(next: &str) -> String {
    let ok = next.starts_with("/console/t/")
        && !next.contains("//")
        && next
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/_-.~?=&%+:".contains(c));
    if ok { next.to_owned() } else { String::new() }
}

/// Render the login page with a fresh login token (or the request's).
fn login_page(
    state: &ConsoleState,
    headers: &HeaderMap,
    status: StatusCode,
    next: &str,
    tenant: &str,
    error: Option<String>,
) -> Result<Response, ConsoleError> {
    let token = match cookie(headers, LOGIN_COOKIE) {
        Some(t) if t.len() == 32 && t.chars().all(|c| c.is_ascii_hexdigit()) => t.to_owned(),
        _ => {
            let mut bytes = [0u8; 16];
            getrandom::fill(&mut bytes).map_err(|e| {
                AdminError::Internal(format!("no randomness for a login token: {e}"))
            })?;
            hex::encode(bytes)
        }
    };
    let html = LoginPage {
        csrf: token.clone(),
        next: safe_next(next),
        tenant: tenant.to_owned(),
        error,
    }
    .render()?;
    let mut response = (status, axum::response::Html(html)).into_response();
    response.headers_mut().append(
        header::SET_COOKIE,
        set_cookie(LOGIN_COOKIE, &token, LOGIN_PATH, 3600, state.secure),
    );
    Ok(response)
}

/// `GET /console/login`.
pub(crate) async fn login_form(
    State(state): State<ConsoleState>,
    headers: HeaderMap,
    AdminQuery(q): AdminQuery<LoginQuery>,
) -> Result<Response, ConsoleError> {
    login_page(
        &state,
        &headers,
        StatusCode::OK,
        q.next.as_deref().unwrap_or(""),
        "",
        None,
    )
}

/// The login form.
#[derive(Debug, Deserialize)]
pub(crate) struct LoginBody {
    key: String,
    #[serde(default)]
    tenant: String,
    #[serde(default)]
    next: String,
    #[serde(default)]
    csrf: String,
}

/// `POST /console/login`: check the login token, authenticate the key,
/// choose the tenant, set the session cookie and go to the runs (or
/// `next`).
pub(crate) async fn login(
    State(state): State<ConsoleState>,
    headers: HeaderMap,
    axum::Form(body): axum::Form<LoginBody>,
) -> Result<Response, ConsoleError> {
    let expected = cookie(&headers, LOGIN_COOKIE).unwrap_or("");
    if expected.is_empty() || !constant_time_eq(body.csrf.as_bytes(), expected.as_bytes()) {
        return Err(AdminError::Forbidden(
            "the login form's CSRF token is missing or stale: open the login page and sign in from it".into(),
        )
        .into());
    }
    let again = |status, message: String| {
        login_page(
            &state,
            &headers,
            status,
            &body.next,
            &body.tenant,
            Some(message),
        )
    };
    let credentials = Credentials {
        bearer: Some(body.key.trim().to_owned()),
        cert_subject: None,
    };
    let principal = match state.auth.authenticate(credentials).await {
        Ok(p) => p,
        Err(AuthError::Unauthenticated(m)) => return again(StatusCode::UNAUTHORIZED, m),
        Err(e) => return Err(e.into()),
    };
    let tenant = match principal.tenant_for(body.tenant.trim()) {
        Ok(t) => t,
        Err(AuthError::InvalidArgument(m)) => return again(StatusCode::BAD_REQUEST, m),
        Err(AuthError::PermissionDenied(m)) => return again(StatusCode::FORBIDDEN, m),
        Err(e) => return Err(e.into()),
    };
    if !access::LIST_RUNS.admits(&principal) {
        let m = format!(
            "principal `{}` has role {}, which reads no runs: the console is for clients, approvers, operators and admins",
            principal.id, principal.role
        );
        return again(StatusCode::FORBIDDEN, m);
    }
    tracing::info!(principal = %principal.id, tenant, "console sign-in");
    let next = safe_next(&body.next);
    let prefix = format!("/console/t/{}/", page::seg(&tenant));
    let to = if next.starts_with(&prefix) {
        next
    } else {
        page::runs_url(&tenant)
    };
    let value = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(body.key.trim());
    let mut response = redirect(&to);
    let h = response.headers_mut();
    h.append(
        header::SET_COOKIE,
        set_cookie(
            SESSION_COOKIE,
            &value,
            HOME_PATH,
            SESSION_MAX_AGE_S,
            state.secure,
        ),
    );
    h.append(
        header::SET_COOKIE,
        set_cookie(LOGIN_COOKIE, "", LOGIN_PATH, 0, state.secure),
    );
    Ok(response)
}

/// `POST /console/logout`: clear the session cookie.
pub(crate) async fn logout(State(state): State<ConsoleState>) -> Response {
    let mut response = redirect(LOGIN_PATH);
    response.headers_mut().append(
        header::SET_COOKIE,
        set_cookie(SESSION_COOKIE, "", HOME_PATH, 0, state.secure),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_and_tokens() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; belay_console=abc; b=2"),
        );
        assert_eq!(cookie(&headers, SESSION_COOKIE), Some("abc"));
        assert_eq!(cookie(&headers, "c"), None);
        let t = csrf_token("belay_k_s");
        assert_eq!(t.len(), 64);
        assert_ne!(t, csrf_token("belay_k_t"));
        let c = set_cookie(SESSION_COOKIE, "v", "/console", 60, true);
        let c = c.to_str().unwrap_or_default();
        for part in ["HttpOnly", "SameSite=Strict", "Secure", "Path=/console"] {
            assert!(c.contains(part), "{c}");
        }
        assert!(
            !set_cookie("n", "v", "/", 0, false)
                .to_str()
                .unwrap_or_default()
                .contains("Secure")
        );
    }

    #[test]
    fn csrf_is_required_and_must_match() {
        let token = csrf_token("k");
        assert!(check_csrf(format!("a=1&csrf={token}").as_bytes(), &token).is_ok());
        assert!(check_csrf(b"a=1", &token).is_err());
        assert!(check_csrf(b"csrf=nope", &token).is_err());
        assert!(check_csrf(b"csrf=", "").is_err());
    }

    #[test]
    fn next_must_be_a_console_page() {
        assert_eq!(
            safe_next("/console/t/acme/runs?status=paused"),
            "/console/t/acme/runs?status=paused"
        );
        for bad in [
            "https://evil.example/",
            "//evil.example",
            "/console/t/x//y",
            "/console/t/\"x",
            "/admin/v1",
        ] {
            assert_eq!(safe_next(bad), "", "{bad}");
        }
    }
}
