//! When the engine fleet could last hear workers (`fleet_liveness`,
//! migration `20261209000160`; [`crate::Store::fleet_alive`]).

//! The first record (no row yet: a new database, or the first start of a
//! release with this table) begins a grace only if some task is leased:
//! workers may hold leases no engine heard.

use super::Pg;
use crate::{FleetReset, StoreError};

impl Pg {
    pub(crate) async fn fleet_alive(&self, reset: FleetReset) -> Result<(), StoreError> {
        let (force, silent_ms) = match reset {
            FleetReset::No => (false, None),
            FleetReset::IfSilentFor(ms) => (false, Some(ms as f64)),
            FleetReset::Now => (true, None),
        };
        sqlx::query(
            "INSERT INTO fleet_liveness AS f (id, last_seen_at, up_since)
             SELECT 1, belay_now(), CASE WHEN EXISTS (SELECT 1 FROM tasks WHERE status = 'leased')
                                    THEN belay_now() ELSE '-infinity'::timestamptz END
             ON CONFLICT (id) DO UPDATE SET
                 up_since = CASE
                     WHEN $1 OR ($2::float8 IS NOT NULL
                               AND f.last_seen_at < belay_now() - make_interval(secs => $2::float8 / 1000.0))
                     THEN belay_now() ELSE f.up_since END,
                 last_seen_at = GREATEST(f.last_seen_at, belay_now())",
        )
        .bind(force)
        .bind(silent_ms)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}
