//! The operator console: server-rendered HTML pages on the admin listener
//! (same port, same keys, same roles and tenant scoping as the admin
//! endpoint and the gRPC API), for the runs of a tenant, one run's graph
//! and timeline, the uncertain-outcome queue, the approvals and tool
//! questions waiting on people, and the definitions.
//!
//! - Sign-in: an API key (or a configured token) typed into the login page
//!   begins a session, a row of the store behind a random token in a
//!   cookie (`HttpOnly`, `SameSite=Strict`, `Secure` under TLS;
//!   [`session`]). Neither the cookie nor the row holds the key. Every
//!   request authenticates the session's key against the store again, so
//!   a revoked key ends its sessions on their next request, on every
//!   replica; signing out ends the session on every replica too.
//! - Authorization: each route borrows the policy of the gRPC method or
//!   admin route that does the same ([`access`]); pages show only the
//!   controls the principal may use, and the routes check again.
//! - CSRF: every form carries the session's random CSRF token; a form
//!   posted without it, or with another, is refused with 403 before its
//!   handler runs ([`session::guard`]).
//! - Pages: [`runs`] (filters, counts, paging, live updates), [`run`]
//!   (status and why, the graph from [`graph`], the timeline from
//!   [`timeline`], controls), [`uncertain`] (queue, verdicts, audit),
//!   [`approvals`] (approvals, confirmations, tool input), [`definitions`]
//!   (with [`signature`]). Templates are askama's, compiled into the
//!   binary from `engine/templates/console/`; the stylesheet and the one
//!   script are embedded too ([`assets`]): no CDN, no network.
//!
//! Architecture Invariant: no state outside the database (sessions included); no rule of
//! access of its own; reads and changes go through the same coordinator
//! and store calls as the admin endpoint and the gRPC API.

mod access;
mod approvals;
mod assets;
mod definitions;
mod error;
mod graph;
mod page;
mod run;
mod runs;
mod session;
mod signature;
mod tenants;
mod timeline;
mod uncertain;

use std::sync::Arc;

use axum::Router;
use axum::routing::{MethodRouter, get, post};

pub use access::Policy;
pub use error::ConsoleError;
pub use session::{CSRF_FIELD, LOGIN_COOKIE, SESSION_COOKIE};

use crate::auth::Authenticator;
use crate::coordinator::Coordinator;

/// The console's entry: the runs of the principal's tenant, the page
/// choosing one (a key of several), or the login page.
pub const HOME_PATH: &str = "/console";
/// `GET`: the login form; `POST`: sign in with a key.
pub const LOGIN_PATH: &str = "/console/login";
/// `POST`: sign out (ends the session, clears the cookie).
pub const LOGOUT_PATH: &str = "/console/logout";
/// `GET`: the stylesheet.
pub const CSS_PATH: &str = "/console/assets/console.css";
/// `GET`: the script (live updates, small helpers).
pub const JS_PATH: &str = "/console/assets/console.js";
/// `GET`: a tenant's runs.
pub const RUNS_PATH: &str = "/console/t/{tenant}/runs";
/// `GET`: one run.
pub const RUN_PATH: &str = "/console/t/{tenant}/runs/{run_id}";
/// `POST`: pause a run.
pub const RUN_PAUSE_PATH: &str = "/console/t/{tenant}/runs/{run_id}/pause";
/// `POST`: lift an operator pause.
pub const RUN_RESUME_PATH: &str = "/console/t/{tenant}/runs/{run_id}/resume";
/// `POST`: cancel a run.
pub const RUN_CANCEL_PATH: &str = "/console/t/{tenant}/runs/{run_id}/cancel";
/// `POST`: signal a run.
pub const RUN_SIGNAL_PATH: &str = "/console/t/{tenant}/runs/{run_id}/signal";
/// `POST`: decide an approval node (or a call's confirmation: the call id).
pub const DECIDE_PATH: &str = "/console/t/{tenant}/runs/{run_id}/approvals/{node}/decide";
/// `POST`: answer a tool's question for a person.
pub const ANSWER_PATH: &str = "/console/t/{tenant}/runs/{run_id}/calls/{call_id}/input";
/// `GET`: the uncertain-outcome queue and its audit.
pub const UNCERTAIN_PATH: &str = "/console/t/{tenant}/uncertain";
/// `POST`: resolve one uncertain outcome.
pub const RESOLVE_PATH: &str = "/console/t/{tenant}/uncertain/{id}/resolve";
/// `GET`: approvals, confirmations and tool questions waiting on people.
pub const APPROVALS_PATH: &str = "/console/t/{tenant}/approvals";
/// `GET`: the tenant's definitions.
pub const DEFINITIONS_PATH: &str = "/console/t/{tenant}/definitions";

/// Every console route: `(method, path template, policy)`.
pub const ROUTES: &[(&str, &str, Policy)] = &[
    ("GET", HOME_PATH, Policy::SignedIn),
    ("GET", LOGIN_PATH, Policy::Public),
    ("POST", LOGIN_PATH, Policy::Public),
    ("POST", LOGOUT_PATH, Policy::SignedIn),
    ("GET", CSS_PATH, Policy::Public),
    ("GET", JS_PATH, Policy::Public),
    ("GET", RUNS_PATH, access::LIST_RUNS),
    ("GET", RUN_PATH, access::GET_RUN),
    ("POST", RUN_PAUSE_PATH, access::PAUSE_RUN),
    ("POST", RUN_RESUME_PATH, access::RESUME_RUN),
    ("POST", RUN_CANCEL_PATH, access::CANCEL_RUN),
    ("POST", RUN_SIGNAL_PATH, access::SIGNAL_RUN),
    ("POST", DECIDE_PATH, access::DECIDE_APPROVAL),
    ("POST", ANSWER_PATH, access::PROVIDE_TOOL_INPUT),
    ("GET", UNCERTAIN_PATH, access::UNCERTAIN),
    ("POST", RESOLVE_PATH, access::UNCERTAIN),
    ("GET", APPROVALS_PATH, access::LIST_RUNS),
    ("GET", DEFINITIONS_PATH, access::LIST_DEFINITIONS),
];

/// What every console handler reads.
#[derive(Debug, Clone)]
pub(crate) struct ConsoleState {
    pub(crate) coord: Arc<Coordinator>,
    pub(crate) auth: Authenticator,
    /// Whether the listener serves TLS: session cookies are then `Secure`.
    pub(crate) secure: bool,
}

/// The policy [`ROUTES`] lists for `method` `path`.
fn policy_of(method: &str, path: &str) -> Policy {
    ROUTES
        .iter()
        .find(|(m, p, _)| *m == method && *p == path)
        .map(|(_, _, policy)| *policy)
        // A route missing from the table is refused to everyone.
        .unwrap_or(Policy::Rpc(""))
}

/// `handler` on `path` behind [`session::guard`] with the policy
/// [`ROUTES`] lists for it.
fn guarded(
    state: &ConsoleState,
    method: &'static str,
    path: &'static str,
    handler: MethodRouter<ConsoleState>,
) -> Router<ConsoleState> {
    let guard = session::Guard {
        state: state.clone(),
        policy: policy_of(method, path),
    };
    Router::new().route(
        path,
        handler.route_layer(axum::middleware::from_fn_with_state(guard, session::guard)),
    )
}

/// The console's routes ([`ROUTES`]), for merging into the admin router;
/// `secure` (the listener serves TLS) makes its cookies `Secure`.
pub fn router(coord: Arc<Coordinator>, auth: Authenticator, secure: bool) -> Router {
    let state = ConsoleState {
        coord,
        auth,
        secure,
    };
    let s = &state;
    Router::new()
        .route(HOME_PATH, get(tenants::home))
        .route(LOGIN_PATH, get(session::login_form).post(session::login))
        .route(CSS_PATH, get(assets::css))
        .route(JS_PATH, get(assets::js))
        .merge(guarded(s, "POST", LOGOUT_PATH, post(session::logout)))
        .merge(guarded(s, "GET", RUNS_PATH, get(runs::page)))
        .merge(guarded(s, "GET", RUN_PATH, get(run::page)))
        .merge(guarded(s, "POST", RUN_PAUSE_PATH, post(run::pause)))
        .merge(guarded(s, "POST", RUN_RESUME_PATH, post(run::resume)))
        .merge(guarded(s, "POST", RUN_CANCEL_PATH, post(run::cancel)))
        .merge(guarded(s, "POST", RUN_SIGNAL_PATH, post(run::signal)))
        .merge(guarded(s, "POST", DECIDE_PATH, post(approvals::decide)))
        .merge(guarded(s, "POST", ANSWER_PATH, post(approvals::answer)))
        .merge(guarded(s, "GET", UNCERTAIN_PATH, get(uncertain::page)))
        .merge(guarded(s, "POST", RESOLVE_PATH, post(uncertain::resolve)))
        .merge(guarded(s, "GET", APPROVALS_PATH, get(approvals::page)))
        .merge(guarded(s, "GET", DEFINITIONS_PATH, get(definitions::page)))
        .layer(axum::middleware::map_response(page::security_headers))
        .layer(axum::extract::DefaultBodyLimit::max(
            crate::admin::MAX_BODY_BYTES,
        ))
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_has_a_policy_and_tenant_routes_borrow_one() {
        for (method, path, policy) in ROUTES {
            assert_eq!(policy_of(method, path), *policy);
            if path.contains("{tenant}") {
                assert!(
                    matches!(policy, Policy::Rpc(_) | Policy::AdminTenant),
                    "{method} {path}"
                );
                assert!(!policy.roles().is_empty(), "{method} {path}");
            }
        }
        assert!(policy_of("DELETE", RUNS_PATH).roles().is_empty());
    }
}
