//! Counts of the database errors this process met, by class, for the
//! engine's `belay_db_errors_total{class}`: every `sqlx::Error` that
//! becomes a [`StoreError::Database`](crate::StoreError::Database) passes
//! [`count`]. Process-wide (like the pool they come from), lock-free.

use std::sync::atomic::{AtomicU64, Ordering};

/// The classes, in the order of [`db_error_counts`]:
/// - `pool_timeout`: no pool connection came free in time;
/// - `conflict`: a transaction lost to another (serialization failure,
///   deadlock, a unique value taken, SQLite busy or locked);
/// - `connection`: the database could not be reached or dropped the
///   connection (I/O, TLS, a closed pool);
/// - `statement`: the database refused a statement for another reason;
/// - `decode`: a row or value did not decode;
/// - `other`: anything else sqlx reports.
pub const DB_ERROR_CLASSES: [&str; 6] = [
    "pool_timeout",
    "conflict",
    "connection",
    "statement",
    "decode",
    "other",
];

static COUNTS: [AtomicU64; 6] = [const { AtomicU64::new(0) }; 6];

/// The class of `e` (an index into [`DB_ERROR_CLASSES`]).
fn class(e: &sqlx::Error) -> usize {
    match e {
        sqlx::Error::PoolTimedOut => 0,
        sqlx::Error::Database(db) => match db.code().as_deref() {
            // PostgreSQL: serialization_failure, deadlock_detected,
            // unique_violation; SQLite: SQLITE_BUSY, SQLITE_LOCKED,
            // SQLITE_CONSTRAINT_UNIQUE / _PRIMARYKEY.
            Some("40001" | "40P01" | "23505" | "5" | "6" | "2067" | "1555") => 1,
            _ => 3,
        },
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => 2,
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::TypeNotFound { .. }
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. } => 4,
        _ => 5,
    }
}

/// Counts `e` under its class.
pub(crate) fn count(e: &sqlx::Error) {
    COUNTS[class(e)].fetch_add(1, Ordering::Relaxed);
}

/// Every class with the number of errors of it this process met so far.
pub fn db_error_counts() -> [(&'static str, u64); 6] {
    std::array::from_fn(|i| (DB_ERROR_CLASSES[i], COUNTS[i].load(Ordering::Relaxed)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_counted_by_class() {
        let before = db_error_counts();
        count(&sqlx::Error::PoolTimedOut);
        count(&sqlx::Error::PoolClosed);
        count(&sqlx::Error::RowNotFound);
        let after = db_error_counts();
        let grew = |name: &str| {
            let i = DB_ERROR_CLASSES
                .iter()
                .position(|c| *c == name)
                .unwrap_or(99);
            after[i].1 - before[i].1
        };
        // Other tests of this process may count errors concurrently:
        // these three at least.
        assert!(grew("pool_timeout") >= 1);
        assert!(grew("connection") >= 1);
        assert!(grew("other") >= 1);
    }
}
