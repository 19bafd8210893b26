//! `GET /console`, the console's entry: the runs of the signed-in
//! principal's tenant, or, for a key of several tenants (or every tenant),
//! the page choosing one (the header's "switch tenant" leads here too). A
//! session is not bound to a tenant: each page's tenant is its path's,
//! checked by [`super::session::guard`], so switching is only navigating.

use askama::Template;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use serde::Deserialize;

use super::error::ConsoleError;
use super::page::{self, ConsoleQuery, redirect};
use super::session::signed_in;
use super::{ConsoleState, LOGIN_PATH};
use crate::auth::{Principal, Tenants};

/// Query of `GET /console`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HomeQuery {
    /// The tenant to open (from the choosing page's form).
    tenant: Option<String>,
}

/// The page choosing a tenant.
#[derive(Template)]
#[template(path = "console/tenants.html")]
struct TenantsPage {
    principal: String,
    role: &'static str,
    csrf: String,
    /// `(tenant, its runs' URL)`, for a key of listed tenants.
    tenants: Vec<(String, String)>,
    /// Whether the key may act for every tenant (a name is typed).
    every: bool,
    error: Option<String>,
}

/// `GET /console[?tenant=<name>]`: the login page when not signed in; the
/// runs of `tenant` (or of the key's one tenant); else the choosing page
/// (with an error, 403, naming a tenant the key may not act for).
pub(crate) async fn home(
    State(state): State<ConsoleState>,
    headers: HeaderMap,
    ConsoleQuery(q): ConsoleQuery<HomeQuery>,
) -> Result<Response, ConsoleError> {
    let Some((principal, csrf)) = signed_in(&state, &headers).await? else {
        return Ok(redirect(LOGIN_PATH));
    };
    let wanted = q.tenant.as_deref().map(str::trim).unwrap_or("");
    match principal.tenant_for(wanted) {
        Ok(tenant) => Ok(redirect(&page::runs_url(&tenant))),
        Err(e) if wanted.is_empty() => {
            tracing::debug!(error = %e, "console: several tenants, choosing");
            choose(&principal, csrf, StatusCode::OK, None)
        }
        Err(e) => choose(&principal, csrf, StatusCode::FORBIDDEN, Some(e.to_string())),
    }
}

/// Render the choosing page for `principal`.
fn choose(
    principal: &Principal,
    csrf: String,
    status: StatusCode,
    error: Option<String>,
) -> Result<Response, ConsoleError> {
    let (tenants, every) = match &principal.tenants {
        Tenants::All => (Vec::new(), true),
        Tenants::Only(list) => (
            list.iter()
                .map(|t| (t.clone(), page::runs_url(t)))
                .collect(),
            false,
        ),
    };
    let html = TenantsPage {
        principal: principal.id.clone(),
        role: principal.role.as_str(),
        csrf,
        tenants,
        every,
        error,
    }
    .render()?;
    Ok((status, Html(html)).into_response())
}
