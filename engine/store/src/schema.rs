//! Rolling upgrades: which database schemas an engine can run beside
//! (issue 22).
//!
//! The policy is expand/contract. A release's migrations only add (tables,
//! nullable or defaulted columns, indexes): an engine of the previous
//! release keeps working beside them, so during a rolling upgrade old and
//! new replicas share the database, and an old pod can restart, scale or be
//! rolled back to after the new release migrated. What a newer release
//! stops needing is dropped only by a later release (contract), once no
//! replica that needs it can still run; that migration raises
//! `schema_compat.oldest_compatible` to the oldest engine schema (the
//! newest migration an engine binary knows) that can run without it.
//!
//! At start ([`crate::Store::migrate`]) an engine compares the migrations
//! the database has with the ones it knows: the database may be ahead of it
//! (a newer release migrated), and then the engine runs beside the newer
//! migrations as long as it is not older than `oldest_compatible`; it
//! refuses to start, with a message naming the versions, when it is.
//! Before this check an engine refused any database with a migration it
//! did not know (sqlx's "previously applied but missing").

use crate::StoreError;

/// How the database's schema relates to the engine's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchemaFit {
    /// The database has nothing this engine does not know.
    Known,
    /// A newer release migrated further (`newest_applied`), compatibly:
    /// this engine (`newest_known`) runs beside its migrations.
    BesideNewer {
        /// The newest migration this engine knows.
        newest_known: i64,
        /// The newest migration the database has.
        newest_applied: i64,
    },
}

/// Judge the database's applied migration versions against the engine's
/// known ones, given the database's `oldest_compatible` (`None` before the
/// table existed).
///
/// Errors: [`StoreError::Config`] naming the versions when the database
/// was migrated by a release this engine is too old to run beside.
pub fn judge(
    known: &[i64],
    applied: &[i64],
    oldest_compatible: Option<i64>,
) -> Result<SchemaFit, StoreError> {
    let newest_known = known.iter().copied().max().unwrap_or(0);
    let Some(newest_applied) = applied.iter().copied().filter(|v| !known.contains(v)).max() else {
        return Ok(SchemaFit::Known);
    };
    match oldest_compatible {
        Some(oldest) if newest_known >= oldest => Ok(SchemaFit::BesideNewer {
            newest_known,
            newest_applied,
        }),
        oldest => Err(StoreError::Config(format!(
            "the database was migrated to {newest_applied} by a newer release, which needs engines that know at least migration {}; this engine knows migrations up to {newest_known}: upgrade this engine (a database is never migrated back)",
            oldest.map_or_else(|| "(unknown)".to_owned(), |o| o.to_string())
        ))),
    }
}

/// [`judge`], logging when the engine runs beside a newer release's
/// migrations; what both backends' `migrate` call before migrating.
pub fn check(
    known: &[i64],
    applied: &[i64],
    oldest_compatible: Option<i64>,
) -> Result<(), StoreError> {
    if let SchemaFit::BesideNewer {
        newest_known,
        newest_applied,
    } = judge(known, applied, oldest_compatible)?
    {
        tracing::info!(
            newest_known,
            newest_applied,
            "the database has migrations of a newer release; running beside them (schema_compat)"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_ahead_of_the_engine_is_run_beside_while_compatible_and_refused_after() {
        assert_eq!(
            judge(&[1, 2], &[1, 2], Some(2)).ok(),
            Some(SchemaFit::Known)
        );
        assert_eq!(
            judge(&[1, 2, 3], &[1], Some(2)).ok(),
            Some(SchemaFit::Known),
            "pending ones are applied"
        );
        assert_eq!(
            judge(&[1, 2], &[1, 2, 5], Some(2)).ok(),
            Some(SchemaFit::BesideNewer {
                newest_known: 2,
                newest_applied: 5
            })
        );
        let err = judge(&[1, 2], &[1, 2, 5, 6], Some(3)).expect_err("contracted past this engine");
        let text = err.to_string();
        assert!(
            text.contains("migrated to 6")
                && text.contains("at least migration 3")
                && text.contains("up to 2"),
            "{text}"
        );
        assert!(
            judge(&[1, 2], &[1, 2, 5], None).is_err(),
            "no compatibility record: refused"
        );
    }
}
