//! Which roles each gRPC method admits: one table ([`GRPC_POLICY`]), read
//! by the authentication layer before a request reaches its handler. A
//! method missing from the table is refused to everyone, so a new RPC is
//! closed until it is listed here (and the isolation suite, which reads the
//! service descriptors, fails until it is).
//!
//! The tenant and grant checks of a request happen in its handler, with
//! the [`Principal`](super::Principal) this layer attached.

use super::Role;
use Role::{Admin, Approver, Client, Operator, Worker};

/// Who may call a method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone, without a credential: health checks and reflection.
    Public,
    /// A principal with one of these roles.
    Roles(&'static [Role]),
}

/// Reading runs: what clients start, approvers decide on and operators
/// operate.
const READ_RUNS: &[Role] = &[Client, Approver, Operator, Admin];
/// Starting and feeding runs.
const RUN_RUNS: &[Role] = &[Client, Operator, Admin];
/// Operating runs and tenants.
const OPERATE: &[Role] = &[Operator, Admin];
/// Deciding approvals.
const DECIDE: &[Role] = &[Approver, Operator, Admin];
/// The worker protocol: workers only, not even admins (a worker receives
/// secrets).
const WORK: &[Role] = &[Worker];

/// One method and the roles it admits.
pub type MethodPolicy = (&'static str, &'static [Role]);

/// One service (`package.Service`) and its methods.
pub type ServicePolicy = (&'static str, &'static [MethodPolicy]);

/// Every `belay.v1` method with the roles it admits, by service.
pub const GRPC_POLICY: &[ServicePolicy] = &[
    (
        "belay.v1.RunService",
        &[
            ("StartRun", RUN_RUNS),
            ("GetRun", READ_RUNS),
            ("ListRuns", READ_RUNS),
            ("ListRunEvents", READ_RUNS),
            ("WatchRun", READ_RUNS),
            ("CancelRun", OPERATE),
            ("PauseRun", OPERATE),
            ("ResumeRun", OPERATE),
            ("SignalRun", RUN_RUNS),
            ("DecideApproval", DECIDE),
            ("ProvideToolInput", RUN_RUNS),
        ],
    ),
    (
        "belay.v1.DefinitionService",
        &[("RegisterBundle", OPERATE), ("ListDefinitions", READ_RUNS)],
    ),
    (
        "belay.v1.TenantService",
        &[("SetTenantGrants", OPERATE), ("GetTenantGrants", OPERATE)],
    ),
    (
        "belay.v1.WorkerService",
        &[
            ("ClaimTasks", WORK),
            ("Heartbeat", WORK),
            ("DispatchToolCall", WORK),
            ("CompleteTask", WORK),
            ("FailTask", WORK),
            ("RequestToolInput", WORK),
            ("ReportMcpTools", WORK),
        ],
    ),
];

/// Services anyone may call.
const PUBLIC_SERVICES: &[&str] = &[
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
];

/// The access of a request path `/<package.Service>/<Method>`; `None` for
/// a method no one may call.
pub fn grpc_access(path: &str) -> Option<Access> {
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    if PUBLIC_SERVICES.contains(&service) {
        return Some(Access::Public);
    }
    GRPC_POLICY
        .iter()
        .find(|(s, _)| *s == service)?
        .1
        .iter()
        .find(|(m, _)| *m == method)
        .map(|(_, roles)| Access::Roles(roles))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_methods_have_roles_and_unknown_ones_none() {
        assert_eq!(
            grpc_access("/belay.v1.WorkerService/ClaimTasks"),
            Some(Access::Roles(&[Worker]))
        );
        assert_eq!(
            grpc_access("/grpc.health.v1.Health/Check"),
            Some(Access::Public)
        );
        assert_eq!(grpc_access("/belay.v1.RunService/DropTables"), None);
        assert_eq!(grpc_access("/belay.v1.Nope/StartRun"), None);
        assert_eq!(grpc_access("garbage"), None);
    }
}
