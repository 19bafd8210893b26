//! Hearing workers through an outage (issue 22): a lease must not run out
//! because no engine could hear its heartbeats.
//!
//! Every engine down for longer than the lease (a fleet restart during a
//! deploy), or the database unreachable, while workers go on: their
//! heartbeats reach no one, and the first sweep afterwards used to judge
//! their leases expired and fail calls that succeeded. So each engine's
//! sweeper records, every tick, that it reaches the database
//! ([`crate::store::Store::fleet_alive`]), and begins the fleet's stretch of
//! hearing workers again when it starts after every engine was silent for
//! [`Coordinator::outage_gap_ms`], or when it could not itself reach the
//! database for that long. For a lease length after that (at least 5 s:
//! [`crate::store::fleet_grace_ms`]), a heartbeat
//! re-asserts a lease that expired meanwhile and no lease is judged
//! expired; a worker that reconnects re-asserts its leases with its next
//! heartbeat (a third of a lease apart), and a result it reports for its
//! still-current attempt is recorded as usual.

use tokio::time::Instant;

use super::{Coordinator, CoordinatorError};
use crate::store::FleetReset;

/// What one engine's sweep loop knows about its own reach of the database.
#[derive(Debug)]
pub(super) struct Reach {
    /// When it last recorded the fleet's liveness; `None` before the first
    /// time (the engine is starting).
    last_ok: Option<Instant>,
}

impl Reach {
    /// An engine that has not recorded anything yet.
    pub(super) fn starting() -> Reach {
        Reach { last_ok: None }
    }
}

impl Coordinator {
    /// Silence longer than this (ms) is an outage: a third of a lease (a
    /// worker heartbeats every third of a lease, so a shorter silence
    /// costs no lease), at least three sweep intervals (a tick late by a
    /// stalled process only delays lease expiry by a lease, never judges
    /// one early).
    pub fn outage_gap_ms(&self) -> i64 {
        (self.config.lease_ms / 3).max(3 * self.config.sweep_interval_ms) as i64
    }

    /// Record that this engine reaches the database (each sweep tick,
    /// before leases are judged); see the module doc.
    pub(super) async fn record_fleet_alive(
        &self,
        reach: &mut Reach,
    ) -> Result<(), CoordinatorError> {
        let gap = self.outage_gap_ms();
        let reset = match reach.last_ok {
            None => FleetReset::IfSilentFor(gap),
            Some(at) if at.elapsed().as_millis() > gap as u128 => FleetReset::Now,
            Some(_) => FleetReset::No,
        };
        self.store.fleet_alive(reset).await?;
        if reset != FleetReset::No {
            tracing::info!(
                ?reset,
                grace_ms = crate::store::fleet_grace_ms(self.config.lease_ms as i64),
                "the fleet hears workers again; leases that expired meanwhile may be re-asserted and none is judged for the grace"
            );
        }
        reach.last_ok = Some(Instant::now());
        Ok(())
    }

    /// Refresh this engine's registration in the fleet and the fleet's
    /// behaviour level (`store::fleet_level`; every
    /// [`REFRESH_INTERVAL_MS`](crate::store::fleet_level::REFRESH_INTERVAL_MS)
    /// from the sweep loop). Returns the fleet's level.
    ///
    /// Errors: [`StoreError::Config`](crate::store::StoreError::Config)
    /// naming both levels when the fleet's level was raised past this
    /// engine's while it ran (it was not seen live for a whole hold, e.g.
    /// stopped or cut off from the database): it would misread what the
    /// fleet now does, so [`Coordinator::fleet_outranked`] resolves and the
    /// engine stops, as one of its level is refused at start.
    pub async fn refresh_fleet_level(&self) -> Result<i32, CoordinatorError> {
        let own = crate::store::fleet_level::BEHAVIOUR_LEVEL;
        let level = self
            .store
            .refresh_fleet(crate::store::FleetRefresh {
                level: own,
                hold_ms: self.config.fleet_upgrade_hold_ms,
            })
            .await?;
        if let Err(e) = crate::store::fleet_level::judge_join(own, level) {
            self.outranked.send_replace(Some(e.to_string()));
            return Err(e.into());
        }
        Ok(level)
    }

    /// Resolves, with the reason, once the fleet's behaviour level was
    /// found raised past this engine's ([`Coordinator::refresh_fleet_level`]):
    /// the engine must stop serving.
    pub async fn fleet_outranked(&self) -> String {
        let mut seen = self.outranked.subscribe();
        let reason = seen
            .wait_for(Option::is_some)
            .await
            .map(|reason| reason.clone().unwrap_or_default());
        match reason {
            Ok(reason) => reason,
            // The sender lives as long as `self`.
            Err(_) => std::future::pending().await,
        }
    }
}
