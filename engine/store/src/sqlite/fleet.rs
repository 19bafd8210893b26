//! When the engine fleet could last hear workers (`fleet_liveness`,
//! migration `20261209000160`; [`crate::Store::fleet_alive`]).

//! As on PostgreSQL (`postgres/fleet.rs`), the first record begins a
//! grace only if some task is leased.

use super::{CLOCK, Lite, NOW};
use crate::{FleetReset, StoreError};

impl Lite {
    pub(crate) async fn fleet_alive(&self, reset: FleetReset) -> Result<(), StoreError> {
        let (force, silent_ms) = match reset {
            FleetReset::No => (false, None),
            FleetReset::IfSilentFor(ms) => (false, Some(ms as f64)),
            FleetReset::Now => (true, None),
        };
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO fleet_liveness (id, last_seen_at, up_since)
             SELECT 1, {NOW}, CASE WHEN EXISTS (SELECT 1 FROM tasks WHERE status = 'leased')
                              THEN {NOW} ELSE '1970-01-01T00:00:00.000Z' END WHERE 1
             ON CONFLICT (id) DO UPDATE SET
                 up_since = CASE
                     WHEN ?1 OR (?2 IS NOT NULL AND last_seen_at < strftime('%Y-%m-%dT%H:%M:%fZ','now', {CLOCK}, printf('%+.3f seconds', -?2 / 1000.0)))
                     THEN {NOW} ELSE up_since END,
                 last_seen_at = MAX(last_seen_at, {NOW})"
        )))
        .bind(force)
        .bind(silent_ms)
        .execute(&self.write)
        .await?;
        Ok(())
    }
}
