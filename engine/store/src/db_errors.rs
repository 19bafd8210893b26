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
///   connection (I/O, TLS, a closed pool), or PostgreSQL refused or ended
///   the connection itself (SQLSTATE class `08` connection exception;
///   `57P01`-`57P03`: terminated by a shutdown, a crash, or starting up or
///   in recovery, as in a restart or a failover; class `28` and `3D000`:
///   a login or a database the server refuses at connect);
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
            Some(code) if is_connection_sqlstate(code) => 2,
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

/// Whether `code` is a PostgreSQL SQLSTATE of a connection the server
/// refused or ended (see [`DB_ERROR_CLASSES`]). SQLite's codes (decimal,
/// at most 4 digits) are never 5 characters long, so none matches.
fn is_connection_sqlstate(code: &str) -> bool {
    code.len() == 5
        && (code.starts_with("08")
            || code.starts_with("28")
            || matches!(code, "57P01" | "57P02" | "57P03" | "3D000"))
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

    /// A database error with only a SQLSTATE, as the server sends it.
    #[derive(Debug)]
    struct Refused(&'static str);

    impl std::fmt::Display for Refused {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "SQLSTATE {}", self.0)
        }
    }

    impl std::error::Error for Refused {}

    impl sqlx::error::DatabaseError for Refused {
        fn message(&self) -> &str {
            self.0
        }
        fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
            Some(self.0.into())
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    fn class_of(code: &'static str) -> &'static str {
        DB_ERROR_CLASSES[class(&sqlx::Error::Database(Box::new(Refused(code))))]
    }

    #[test]
    fn a_server_that_ends_or_refuses_the_connection_is_a_connection_error() {
        // A restart or failover: backends terminated by the shutdown, then
        // "the database system is starting up" / "in recovery mode".
        for code in [
            "57P01", "57P02", "57P03", "08006", "08001", "28P01", "28000", "3D000",
        ] {
            assert_eq!(class_of(code), "connection", "SQLSTATE {code}");
        }
        for (code, expected) in [
            ("40001", "conflict"),
            ("23505", "conflict"),
            ("5", "conflict"),
            ("42P01", "statement"),
            ("22P02", "statement"),
            ("57014", "statement"),
            ("2067", "conflict"),
            ("1299", "statement"),
        ] {
            assert_eq!(class_of(code), expected, "SQLSTATE {code}");
        }
    }

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
