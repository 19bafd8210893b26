//! The fleet's behaviour level on SQLite: one engine per database file, so
//! no replica runs beside another and nothing is gated
//! (`crate::fleet_level`); every engine is at its own level.

use super::Lite;
use crate::StoreError;
use crate::fleet_level::{BEHAVIOUR_LEVEL, FleetRefresh};

impl Lite {
    /// See [`crate::Store::join_fleet`]: `own`.
    pub(crate) async fn join_fleet(&self, own: i32) -> Result<i32, StoreError> {
        Ok(own)
    }

    /// See [`crate::Store::refresh_fleet`]: the engine's own level.
    pub(crate) async fn refresh_fleet(&self, refresh: FleetRefresh) -> Result<i32, StoreError> {
        Ok(refresh.level)
    }

    /// See [`crate::Store::fleet_level`]: [`BEHAVIOUR_LEVEL`].
    pub(crate) fn fleet_level(&self) -> i32 {
        BEHAVIOUR_LEVEL
    }
}
