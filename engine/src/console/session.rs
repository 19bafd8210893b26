//! Signing in and out, the session, and the guard every console route but
//! the public ones passes: it finds the request's session, authenticates
//! the session's credential against the store again (as the admin endpoint
//! authenticates a bearer header), applies the route's [`Policy`] and the
//! path's tenant, and refuses a form without the session's CSRF token (403)
//! before its handler runs.
//!
//! A session is a row of the store (`console_sessions`; OWASP's Session
//! Management Cheat Sheet: a server-side session behind a random id). The
//! cookie holds only a random 256-bit session token, the row only its
//! SHA-256, the key id it signed in with, and the session's random CSRF
//! token: neither the cookie nor the database holds the API key. Every
//! replica reads the same rows; a key revoked or expired ends its sessions
//! on their next request, signing out deletes the row, and a session ends
//! 12 hours after sign-in whatever happens. The cookie is `HttpOnly` (no
//! script reads it), `SameSite=Strict` (no other site's page sends it) and
//! `Secure` under TLS. Forms carry the session's CSRF token (synchronizer
//! token). The login form has its own token, a random value in a cookie of
//! the login path (double submit), so no other site can sign a browser
//! into a session of its choosing; signing in ends the browser's previous
//! session (no fixation).

use std::collections::HashMap;

use askama::Template;
use axum::body::{Body, to_bytes};
use axum::extract::{FromRequestParts, Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::access::{self, Policy};
use super::error::ConsoleError;
use super::page::{self, ConsoleQuery, redirect};
use super::{ConsoleState, HOME_PATH, LOGIN_PATH};
use crate::admin::{AdminError, MAX_BODY_BYTES};
use crate::auth::key::{constant_time_eq, secret_sha256};
use crate::auth::{AuthError, Credentials, Principal};
use crate::store::NewConsoleSession;

/// The session cookie: the session token, 64 lowercase hex digits.
pub const SESSION_COOKIE: &str = "belay_console";
/// The login form's CSRF cookie (path [`LOGIN_PATH`]).
pub const LOGIN_COOKIE: &str = "belay_console_login";
/// The form field every console form carries its CSRF token in.
pub const CSRF_FIELD: &str = "csrf";
/// How long a session lives from sign-in, seconds (12 hours).
const SESSION_MAX_AGE_S: u32 = 12 * 3600;
/// Random bytes of a session token and of a CSRF token.
const TOKEN_BYTES: usize = 32;

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

/// A fresh random token: [`TOKEN_BYTES`] bytes, lowercase hex.
/// Errors: the system has no randomness (500).
fn random_token(what: &str) -> Result<String, ConsoleError> {
    let mut bytes = [0u8; TOKEN_BYTES];
    getrandom::fill(&mut bytes)
        .map_err(|e| AdminError::Internal(format!("no randomness for {what}: {e}")))?;
    Ok(hex::encode(bytes))
}

/// The SHA-256 (the store's key) of the request's session token, `None`
/// without a well-formed session cookie.
fn session_id(headers: &HeaderMap) -> Option<String> {
    cookie(headers, SESSION_COOKIE)
        .filter(|t| t.len() == 2 * TOKEN_BYTES && t.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(secret_sha256)
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

/// The principal and CSRF token of the request's session; `None` without
/// one, when it ended or expired, or when its credential no longer proves
/// anyone (revoked, expired, removed: the session is then ended too).
/// Errors: the store could not be read.
pub(crate) async fn signed_in(
    state: &ConsoleState,
    headers: &HeaderMap,
) -> Result<Option<(Principal, String)>, ConsoleError> {
    let Some(id) = session_id(headers) else {
        return Ok(None);
    };
    let store = state.coord.store();
    let Some(session) = store.console_session(&id).await? else {
        return Ok(None);
    };
    match state
        .auth
        .resume(&session.credential, &session.credential_sha256)
        .await
    {
        Ok(principal) => Ok(Some((principal, session.csrf))),
        Err(AuthError::Unauthenticated(why)) => {
            tracing::info!(principal = %session.principal, %why, "console session ended");
            store.end_console_session(&id).await?;
            Ok(None)
        }
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
    let Some((principal, csrf)) = signed_in(&g.state, &headers).await? else {
        if is_post {
            return Err(AdminError::Unauthorized(
                "no console session came with this form: sign in and send it again from the console's page (a form sent from another site carries no session)".into(),
            )
            .into());
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
        Some(t) if t.len() == 2 * TOKEN_BYTES && t.bytes().all(|b| b.is_ascii_hexdigit()) => {
            t.to_owned()
        }
        _ => random_token("a login token")?,
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
    ConsoleQuery(q): ConsoleQuery<LoginQuery>,
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
        // A key of several tenants, none typed: choose one after signing in.
        Err(AuthError::InvalidArgument(_)) => String::new(),
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
    let to = if tenant.is_empty() {
        HOME_PATH.to_owned()
    } else if next.starts_with(&prefix) {
        next
    } else {
        page::runs_url(&tenant)
    };
    let value = begin_session(&state, &headers, &principal, body.key.trim()).await?;
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

/// Store a new session of `principal`, signed in with credential text
/// `key`, ending the browser's previous one; returns the cookie's value.
/// Errors: no randomness, the store could not be written.
async fn begin_session(
    state: &ConsoleState,
    headers: &HeaderMap,
    principal: &Principal,
    key: &str,
) -> Result<String, ConsoleError> {
    let store = state.coord.store();
    if let Some(previous) = session_id(headers) {
        store.end_console_session(&previous).await?;
    }
    let token = random_token("a session token")?;
    store
        .create_console_session(&NewConsoleSession {
            id_sha256: secret_sha256(&token),
            credential: principal.credential.clone(),
            credential_sha256: secret_sha256(key),
            principal: principal.id.clone(),
            csrf: random_token("a CSRF token")?,
            ttl_ms: i64::from(SESSION_MAX_AGE_S) * 1000,
        })
        .await?;
    Ok(token)
}

/// `POST /console/logout`: end the session and clear its cookie.
pub(crate) async fn logout(
    State(state): State<ConsoleState>,
    headers: HeaderMap,
) -> Result<Response, ConsoleError> {
    if let Some(id) = session_id(&headers) {
        state.coord.store().end_console_session(&id).await?;
    }
    let mut response = redirect(LOGIN_PATH);
    response.headers_mut().append(
        header::SET_COOKIE,
        set_cookie(SESSION_COOKIE, "", HOME_PATH, 0, state.secure),
    );
    Ok(response)
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
        // Not a session token: no session is looked up.
        assert_eq!(session_id(&headers), None);
        let token = random_token("a test").unwrap_or_default();
        assert_eq!(token.len(), 64);
        assert_ne!(Some(token.clone()), random_token("a test").ok());
        let mut headers = HeaderMap::new();
        let value = format!("{SESSION_COOKIE}={token}");
        headers.insert(
            header::COOKIE,
            HeaderValue::from_str(&value).unwrap_or(HeaderValue::from_static("")),
        );
        assert_eq!(session_id(&headers), Some(secret_sha256(&token)));
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
        let token = "a".repeat(64);
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
