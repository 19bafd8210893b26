//! The fleet's liveness, as [`crate::Store::fleet_alive`] records it.

/// Whether an engine's [`crate::Store::fleet_alive`] begins the fleet's
/// stretch of hearing workers again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FleetReset {
    /// No: the engine was reachable all along (a sweep tick).
    No,
    /// When no engine recorded its liveness for this many ms: an engine
    /// starting (after every engine was down, workers could not be heard).
    IfSilentFor(i64),
    /// Yes: this engine could not reach the database for a while, so the
    /// workers' heartbeats could not be recorded.
    Now,
}

/// Shortest grace after an outage, ms: longer than a worker waits between
/// two heartbeat retries (2 s) and between two retries of a report (5 s),
/// so a worker that reconnects is heard before any lease is judged.
pub const FLEET_GRACE_MIN_MS: i64 = 5_000;

/// How long after the fleet begins hearing workers again (an outage's end)
/// leases are not judged and expired ones may be re-asserted: a lease
/// length (`lease_ms`), at least [`FLEET_GRACE_MIN_MS`].
pub fn fleet_grace_ms(lease_ms: i64) -> i64 {
    lease_ms.max(FLEET_GRACE_MIN_MS)
}
