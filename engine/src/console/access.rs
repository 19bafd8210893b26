//! Who may open each console page or send each form: every route borrows
//! the policy of the gRPC method or admin route that does the same thing
//! ([`Policy`]), so the console has no rules of its own. A principal sees a
//! tenant's pages only when its key is scoped to that tenant.

use crate::auth::policy::{Access, grpc_access};
use crate::auth::{AuthError, Principal, Role};

/// The rule a console route borrows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Anyone, signed in or not: the login page and the static assets.
    Public,
    /// Any signed-in principal (the console's entry and logout).
    SignedIn,
    /// The roles of a `belay.v1` method ([`crate::auth::policy`]),
    /// `"<package.Service>/<Method>"`.
    Rpc(&'static str),
    /// The roles of the admin endpoint's tenant routes (operators and
    /// admins: uncertain outcomes).
    AdminTenant,
}

/// Reading runs, their events and the approvals waiting in them.
pub const LIST_RUNS: Policy = Policy::Rpc("belay.v1.RunService/ListRuns");
/// One run with its timeline.
pub const GET_RUN: Policy = Policy::Rpc("belay.v1.RunService/GetRun");
/// Operator pause.
pub const PAUSE_RUN: Policy = Policy::Rpc("belay.v1.RunService/PauseRun");
/// Lift an operator pause.
pub const RESUME_RUN: Policy = Policy::Rpc("belay.v1.RunService/ResumeRun");
/// Cancel.
pub const CANCEL_RUN: Policy = Policy::Rpc("belay.v1.RunService/CancelRun");
/// Deliver a signal.
pub const SIGNAL_RUN: Policy = Policy::Rpc("belay.v1.RunService/SignalRun");
/// Decide an approval node or a tool call's confirmation.
pub const DECIDE_APPROVAL: Policy = Policy::Rpc("belay.v1.RunService/DecideApproval");
/// Answer a tool's question for a person.
pub const PROVIDE_TOOL_INPUT: Policy = Policy::Rpc("belay.v1.RunService/ProvideToolInput");
/// The tenant's definitions.
pub const LIST_DEFINITIONS: Policy = Policy::Rpc("belay.v1.DefinitionService/ListDefinitions");
/// The uncertain-outcome queue and its resolution.
pub const UNCERTAIN: Policy = Policy::AdminTenant;

impl Policy {
    /// The roles it admits; empty for an RPC the gRPC policy does not list
    /// (refused to everyone, as there).
    pub fn roles(self) -> &'static [Role] {
        match self {
            Policy::Public | Policy::SignedIn => &Role::ALL,
            Policy::AdminTenant => crate::admin::OPERATE,
            Policy::Rpc(method) => match grpc_access(&format!("/{method}")) {
                Some(Access::Roles(roles)) => roles,
                Some(Access::Public) => &Role::ALL,
                None => &[],
            },
        }
    }

    /// Whether `principal` may use a route of this policy (its role only;
    /// the tenant is checked by [`authorize`]).
    pub fn admits(self, principal: &Principal) -> bool {
        principal.has_role(self.roles())
    }
}

/// Check that `principal` may use a route of `policy` for `tenant`.
/// Errors: [`AuthError::PermissionDenied`] naming the principal, its role
/// and what the route needs, or the tenants it may act for.
pub fn authorize(principal: &Principal, policy: Policy, tenant: &str) -> Result<(), AuthError> {
    if !policy.admits(principal) {
        let needs: Vec<&str> = policy.roles().iter().map(|r| r.as_str()).collect();
        return Err(AuthError::PermissionDenied(format!(
            "principal `{}` has role {}; this needs role {}",
            principal.id,
            principal.role,
            if needs.is_empty() {
                "(none: refused to everyone)".to_owned()
            } else {
                needs.join(" or ")
            }
        )));
    }
    principal.require_tenant(tenant)
}

/// What the principal may do on a tenant's pages, for showing only the
/// controls it can use (the routes check again).
#[derive(Debug, Clone, Copy, Default)]
pub struct Abilities {
    /// Pause, resume, cancel.
    pub operate: bool,
    /// Signals.
    pub signal: bool,
    /// Approvals and confirmations.
    pub decide: bool,
    /// Answers to tools' questions.
    pub answer: bool,
    /// The uncertain-outcome queue.
    pub uncertain: bool,
}

impl Abilities {
    /// The abilities of `principal`.
    pub fn of(principal: &Principal) -> Abilities {
        Abilities {
            operate: PAUSE_RUN.admits(principal),
            signal: SIGNAL_RUN.admits(principal),
            decide: DECIDE_APPROVAL.admits(principal),
            answer: PROVIDE_TOOL_INPUT.admits(principal),
            uncertain: UNCERTAIN.admits(principal),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_borrowed_rpc_policy_exists() {
        for policy in [
            LIST_RUNS,
            GET_RUN,
            PAUSE_RUN,
            RESUME_RUN,
            CANCEL_RUN,
            SIGNAL_RUN,
            DECIDE_APPROVAL,
            PROVIDE_TOOL_INPUT,
            LIST_DEFINITIONS,
            UNCERTAIN,
        ] {
            assert!(!policy.roles().is_empty(), "{policy:?} admits no one");
            assert!(!policy.roles().contains(&Role::Worker), "{policy:?}");
        }
        assert!(Policy::Rpc("belay.v1.RunService/Nope").roles().is_empty());
        assert_eq!(UNCERTAIN.roles(), &[Role::Operator, Role::Admin]);
        assert!(!DECIDE_APPROVAL.roles().contains(&Role::Client));
    }
}
