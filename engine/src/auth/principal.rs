//! Who is calling: a [`Principal`] (id, role, tenant scope, grants), the
//! [`Role`]s, and the rules that turn a request's claimed tenant and
//! grants into proven ones.

use std::fmt;
use std::str::FromStr;

use super::AuthError;

/// Longest name of who acts through a principal ([`Principal::actor`]),
/// bytes.
pub const MAX_ACTOR_BYTES: usize = 128;

/// What a principal may do. Roles are not ordered: each RPC and admin
/// route lists the roles it admits ([`super::policy`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Starts runs, reads them, signals them, answers tool-input requests.
    Client,
    /// Serves `WorkerService`: claims tasks, dispatches, reports. The only
    /// role that reaches it.
    Worker,
    /// Decides approvals (with its grants), reads runs.
    Approver,
    /// Operates a tenant: grants, definitions, pause, resume, cancel,
    /// uncertain outcomes, MCP pins, keys of its tenants.
    Operator,
    /// Everything an operator may, for every tenant, and keys of any role.
    Admin,
}

impl Role {
    /// Every role, in the order they are documented.
    pub const ALL: [Role; 5] = [
        Role::Client,
        Role::Worker,
        Role::Approver,
        Role::Operator,
        Role::Admin,
    ];

    /// The role's name: `client`, `worker`, `approver`, `operator`, `admin`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Client => "client",
            Role::Worker => "worker",
            Role::Approver => "approver",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = AuthError;

    /// Errors: [`AuthError::InvalidArgument`] naming the roles there are.
    fn from_str(s: &str) -> Result<Role, AuthError> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| {
                AuthError::InvalidArgument(format!(
                    "unknown role {s:?}; roles are client, worker, approver, operator, admin"
                ))
            })
    }
}

/// The tenants a principal may act for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tenants {
    /// Every tenant (admins, and workers of a shared pool).
    All,
    /// These tenants only (never empty).
    Only(Vec<String>),
}

impl Tenants {
    /// From the stored form: `None` is every tenant.
    pub fn from_stored(tenants: Option<Vec<String>>) -> Tenants {
        match tenants {
            None => Tenants::All,
            Some(list) => Tenants::Only(list),
        }
    }

    /// The stored form: `None` for every tenant.
    pub fn to_stored(&self) -> Option<Vec<String>> {
        match self {
            Tenants::All => None,
            Tenants::Only(list) => Some(list.clone()),
        }
    }

    /// Whether `tenant` is among them.
    pub fn contains(&self, tenant: &str) -> bool {
        match self {
            Tenants::All => true,
            Tenants::Only(list) => list.iter().any(|t| t == tenant),
        }
    }

    /// Whether every tenant of `other` is among these.
    pub fn covers(&self, other: &Tenants) -> bool {
        match (self, other) {
            (Tenants::All, _) => true,
            (Tenants::Only(_), Tenants::All) => false,
            (Tenants::Only(_), Tenants::Only(list)) => list.iter().all(|t| self.contains(t)),
        }
    }
}

impl fmt::Display for Tenants {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tenants::All => f.write_str("*"),
            Tenants::Only(list) => f.write_str(&list.join(",")),
        }
    }
}

/// An authenticated caller: proven by an API key, a configured token or a
/// client certificate. Requests carry it in their extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// Who: recorded in events as who started, signalled, approved or
    /// resolved (e.g. `alice@acme`, `worker-pool-a`).
    pub id: String,
    /// The credential that proved it: a key id, `token:<name>` for a
    /// configured token, `cert:<key id>` for a client certificate.
    pub credential: String,
    /// What it may do.
    pub role: Role,
    /// For which tenants.
    pub tenants: Tenants,
    /// Its permissions: the caller leg of a call's permission check, and
    /// what it holds as an approver.
    pub grants: Vec<String>,
}

impl Principal {
    /// Whether the role is one of `roles`.
    pub fn has_role(&self, roles: &[Role]) -> bool {
        roles.contains(&self.role)
    }

    /// The tenant a request acts for. `requested` must be empty or one of
    /// the principal's tenants; empty means the principal's only tenant.
    /// Errors: [`AuthError::PermissionDenied`] naming the principal and
    /// both tenants; [`AuthError::InvalidArgument`] when empty is
    /// ambiguous (several or every tenant).
    pub fn tenant_for(&self, requested: &str) -> Result<String, AuthError> {
        match (&self.tenants, requested) {
            (Tenants::Only(list), "") if list.len() == 1 => Ok(list[0].clone()),
            (_, "") => Err(AuthError::InvalidArgument(format!(
                "`tenant` is required: principal `{}` may act for tenants {}",
                self.id, self.tenants
            ))),
            (tenants, t) if tenants.contains(t) => Ok(t.to_owned()),
            (tenants, t) => Err(AuthError::PermissionDenied(format!(
                "principal `{}` may act for tenant(s) `{tenants}`, not for tenant `{t}`",
                self.id
            ))),
        }
    }

    /// Check that the principal may act for `tenant` (named in a path, or
    /// found on a row). Errors: [`AuthError::PermissionDenied`].
    pub fn require_tenant(&self, tenant: &str) -> Result<(), AuthError> {
        if self.tenants.contains(tenant) {
            Ok(())
        } else {
            Err(AuthError::PermissionDenied(format!(
                "principal `{}` may act for tenant(s) `{}`, not for tenant `{tenant}`",
                self.id, self.tenants
            )))
        }
    }

    /// Who acted, as events record it: the principal's id, or
    /// `<id>/<claimed>` when the request names a person or process acting
    /// through it (an operator at a shared console, an end user of a
    /// service). Errors: [`AuthError::InvalidArgument`] for a claimed name
    /// longer than [`MAX_ACTOR_BYTES`] or with control characters.
    pub fn actor(&self, claimed: &str) -> Result<String, AuthError> {
        let claimed = claimed.trim();
        if claimed.is_empty() || claimed == self.id {
            return Ok(self.id.clone());
        }
        if claimed.len() > MAX_ACTOR_BYTES || claimed.chars().any(char::is_control) {
            return Err(AuthError::InvalidArgument(format!(
                "the name of who acts must be 1 to {MAX_ACTOR_BYTES} bytes without control characters"
            )));
        }
        Ok(format!("{}/{claimed}", self.id))
    }

    /// Whether an admin: admins act with any grants (they could make a key
    /// holding them), so for them a request's grants are taken as given.
    fn holds_every_grant(&self) -> bool {
        self.role == Role::Admin
    }

    /// The grants a request acts with: the principal's, or, when the
    /// request names some, those, each of which the principal must hold
    /// (a request narrows, never widens; an admin's are taken as given).
    /// Sorted, without duplicates.
    /// Errors: [`AuthError::PermissionDenied`] naming the grants the
    /// principal does not hold.
    pub fn narrow_grants(&self, requested: &[String]) -> Result<Vec<String>, AuthError> {
        let mut grants = if requested.is_empty() {
            self.grants.clone()
        } else if self.holds_every_grant() {
            requested.to_vec()
        } else {
            let missing: Vec<&str> = requested
                .iter()
                .filter(|g| !self.grants.contains(g))
                .map(String::as_str)
                .collect();
            if !missing.is_empty() {
                return Err(AuthError::PermissionDenied(format!(
                    "principal `{}` does not hold grant(s) {}; a request may only narrow its principal's grants",
                    self.id,
                    missing.join(", ")
                )));
            }
            requested.to_vec()
        };
        grants.sort();
        grants.dedup();
        Ok(grants)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(tenants: Tenants) -> Principal {
        Principal {
            id: "alice".into(),
            credential: "k1".into(),
            role: Role::Client,
            tenants,
            grants: vec!["a".into(), "b".into()],
        }
    }

    #[test]
    fn the_tenant_of_a_request_is_the_principals() {
        let one = principal(Tenants::Only(vec!["acme".into()]));
        assert_eq!(one.tenant_for("").expect("default"), "acme");
        assert_eq!(one.tenant_for("acme").expect("same"), "acme");
        let err = one.tenant_for("victim").expect_err("other tenant");
        assert!(matches!(err, AuthError::PermissionDenied(_)));
        assert!(err.to_string().contains("acme") && err.to_string().contains("victim"));
        let all = principal(Tenants::All);
        assert!(matches!(
            all.tenant_for(""),
            Err(AuthError::InvalidArgument(_))
        ));
        assert_eq!(all.tenant_for("victim").expect("admin"), "victim");
    }

    #[test]
    fn a_request_narrows_grants_and_never_widens_them() {
        let p = principal(Tenants::All);
        assert_eq!(p.narrow_grants(&[]).expect("all"), vec!["a", "b"]);
        assert_eq!(p.narrow_grants(&["b".into()]).expect("narrow"), vec!["b"]);
        let err = p
            .narrow_grants(&["b".into(), "payments.refund".into()])
            .expect_err("widen");
        assert!(err.to_string().contains("payments.refund"));
    }

    #[test]
    fn roles_parse_and_print() {
        for r in Role::ALL {
            assert_eq!(r.as_str().parse::<Role>().expect("parse"), r);
        }
        assert!("root".parse::<Role>().is_err());
    }

    #[test]
    fn tenant_scopes_cover() {
        let ab = Tenants::Only(vec!["a".into(), "b".into()]);
        assert!(Tenants::All.covers(&ab));
        assert!(ab.covers(&Tenants::Only(vec!["a".into()])));
        assert!(!ab.covers(&Tenants::All));
        assert!(!ab.covers(&Tenants::Only(vec!["c".into()])));
    }
}
