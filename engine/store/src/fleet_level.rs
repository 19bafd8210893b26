//! Behaviour changes gated on the whole engine fleet having upgraded
//! (issue 22; migration `20261211000190`).
//!
//! Expand/contract keeps the *schema* of a rolling upgrade compatible
//! (`schema.rs`); a *behaviour* change can still be misread by an older
//! replica sharing the database. The model is CockroachDB's cluster
//! version (its "upgrade finalization"): each build implements a
//! behaviour level ([`BEHAVIOUR_LEVEL`]); each engine registers its level
//! and refreshes it (`engine_replicas`); the fleet's level (`fleet_level`)
//! is raised to the lowest live replica's level once the fleet has looked
//! that way for a whole hold ([`DEFAULT_UPGRADE_HOLD_MS`]: a rollback
//! within the hold is still possible); a behaviour of level N is used only
//! while the fleet is at N or higher; the level never goes down, and an
//! engine below it refuses to start ([`judge_join`]).
//!
//! Engines of releases before the registry (level 0) cannot register.
//! On PostgreSQL they are recognised by their connections: a client
//! connection to the database that does not name itself `belay-engine`
//! (every engine of level 1 or higher sets that `application_name`) and
//! whose last statement was one of an engine's (it calls `belay_now()`,
//! `LISTEN`s on a Belay channel, or reads the migrations table), or whose
//! statement this database user may not see. While one is connected the
//! fleet stays below level 1. Behind a connection pooler that does not
//! pass `application_name` on, or with such connections of another tool,
//! the fleet stays at its level: safe, and only the gated behaviour's
//! gain is missed (logged at debug level at every refresh; the fleet's
//! level is in `fleet_level`). A name the database URL gives an engine's
//! connections is kept after `belay-engine` ([`application_name`]).
//!
//! SQLite: one engine per database file, so no replica runs beside
//! another and nothing is gated; its backend reports [`BEHAVIOUR_LEVEL`].
//!
//! The levels:
//!
//! | level | behaviour an older replica would misread |
//! |---|---|
//! | 0 | releases before the registry |
//! | 1 | a heartbeat extends a lease in `task_heartbeats` alone ([`heartbeats_write_task_rows`]); below, it also extends `tasks.lease_expires_at`, which is all a release before migration `20261206000090` reads |
//! | 2 | a node that starts and ends in one decision is one `node_passed` event (`belay_machine::level::NODE_PASSED`); below, a `node_started` and a `node_completed`, the only kinds a release of level 1 folds. A database that has run nothing and seen no engine starts at level 2 (migration `20261212000200`) |
//! | 3 | a tool node's start rides on its call's `tool_call_scheduled` (`starts_node`) and its end on the call's `tool_call_completed` (`ends_node`) where they carry the same arguments and result (`belay_machine::level::FOLDED_TOOL_NODE`); below, its own `node_started` and `node_completed`, which a release of level 2 needs. A database that has run nothing and seen no engine starts at level 3 (migration `20261213000210`) |
//!
//! The machine picks the forms (`RunState::fleet_level`, from
//! [`machine_level`]); the levels of its forms are `belay_machine::level`'s.

use crate::StoreError;

/// The behaviour level this build implements.
pub const BEHAVIOUR_LEVEL: i32 = 3;

/// How long (ms) the fleet must have looked upgraded before its level is
/// raised, by default: 10 minutes, longer than a rolling upgrade's pods
/// take to replace each other, so a rollback decided during the rollout
/// is still possible.
pub const DEFAULT_UPGRADE_HOLD_MS: u64 = 600_000;

/// A replica not seen for this long (ms) is not counted as live: ten
/// refreshes missed ([`REFRESH_INTERVAL_MS`]).
pub const REPLICA_LIVE_MS: i64 = 10 * REFRESH_INTERVAL_MS as i64;

/// How often (ms) an engine refreshes its registration and reads the
/// fleet's level.
pub const REFRESH_INTERVAL_MS: u64 = 1_000;

/// The `application_name` every engine's database connections carry (on
/// PostgreSQL), unless the database URL names another.
pub const ENGINE_APPLICATION_NAME: &str = "belay-engine";

/// The `application_name` of an engine's connections, given the one its
/// database URL names, if any: [`ENGINE_APPLICATION_NAME`], or that name
/// after it (`belay-engine payments`) unless it already begins with it.
pub fn application_name(from_url: Option<&str>) -> String {
    match from_url {
        Some(name) if name.starts_with(ENGINE_APPLICATION_NAME) => name.to_owned(),
        Some(name) if !name.is_empty() => format!("{ENGINE_APPLICATION_NAME} {name}"),
        _ => ENGINE_APPLICATION_NAME.to_owned(),
    }
}

/// Whether a heartbeat must also extend the lease on the task's row (the
/// behaviour of releases below level 1), given the fleet's level.
pub fn heartbeats_write_task_rows(fleet_level: i32) -> bool {
    fleet_level < 1
}

/// The level of the event forms the machine may write for a fleet at
/// `fleet_level` (`RunState::fleet_level`): the fleet's, never above this
/// build's own ([`BEHAVIOUR_LEVEL`]); 0 for a level the database should
/// never hold (below 0).
pub fn machine_level(fleet_level: i32) -> u32 {
    u32::try_from(fleet_level.min(BEHAVIOUR_LEVEL)).unwrap_or(0)
}

/// What [`crate::Store::refresh_fleet`] asks: this engine's level, and how
/// long the fleet must look upgraded before its level is raised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FleetRefresh {
    /// This engine's behaviour level ([`BEHAVIOUR_LEVEL`] but in tests).
    pub level: i32,
    /// [`DEFAULT_UPGRADE_HOLD_MS`] unless configured, ms.
    pub hold_ms: u64,
}

/// Judge an engine of `own` level joining a fleet at `fleet` level.
///
/// Errors: [`StoreError::Config`] naming both levels when the fleet was
/// raised past the engine (it would misread what the fleet now does).
pub fn judge_join(own: i32, fleet: i32) -> Result<(), StoreError> {
    if own >= fleet {
        return Ok(());
    }
    Err(StoreError::Config(format!(
        "every engine of this database's fleet was upgraded to behaviour level {fleet}, and this engine implements level {own}: it would misread what the fleet now does, so it does not start; run a release of level {fleet} or later (a fleet's level never goes down)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engine_below_the_fleet_level_is_refused_naming_both() {
        assert!(judge_join(1, 0).is_ok());
        assert!(judge_join(1, 1).is_ok());
        let text = judge_join(0, 1).expect_err("below").to_string();
        assert!(
            text.contains("behaviour level 1") && text.contains("implements level 0"),
            "{text}"
        );
    }

    #[test]
    fn an_engine_names_its_connections_belay_engine_before_any_name_of_the_url() {
        assert_eq!(application_name(None), "belay-engine");
        assert_eq!(application_name(Some("")), "belay-engine");
        assert_eq!(application_name(Some("payments")), "belay-engine payments");
        assert_eq!(application_name(Some("belay-engine-eu")), "belay-engine-eu");
    }

    #[test]
    fn heartbeats_write_task_rows_below_level_one_only() {
        assert!(heartbeats_write_task_rows(0));
        assert!(!heartbeats_write_task_rows(1));
        assert!(!heartbeats_write_task_rows(BEHAVIOUR_LEVEL));
    }

    #[test]
    fn the_machine_writes_the_forms_of_the_fleets_level_up_to_its_own() {
        use belay_machine::level::{FOLDED_TOOL_NODE, NODE_PASSED};
        assert!(machine_level(1) < NODE_PASSED);
        assert_eq!(machine_level(2), NODE_PASSED);
        assert_eq!(machine_level(3), FOLDED_TOOL_NODE);
        assert_eq!(machine_level(BEHAVIOUR_LEVEL + 1), FOLDED_TOOL_NODE);
        assert_eq!(machine_level(-1), 0);
    }
}
