//! The SQLite backend (embedded default: `belay dev`, the example, tests).
//!
//! Same semantics as [`postgres`](crate::postgres), done the SQLite way:
//!
//! - **One writer.** Every write goes through one connection (a pool of
//!   one), in `BEGIN IMMEDIATE` transactions, so transitions and claims are
//!   serialised inside the engine process: that is the run-row lock and
//!   `SKIP LOCKED` of PostgreSQL. Reads use a separate pool (WAL mode lets
//!   them run beside the writer).
//! - **One engine process per file.** The engine holds an exclusive `flock`
//!   on the database file while the store is open; a second engine on the
//!   same file (by any path, symlink or hard link) is refused with
//!   [`StoreError::Config`]. Workers connect over gRPC, any
//!   number of them.
//! - **Wake-ups** are an in-process broadcast channel fed after each commit
//!   (PostgreSQL: `LISTEN/NOTIFY`).
//! - **Durability**: WAL with `synchronous = FULL`, so a committed transition
//!   survives a process kill and a power cut.
//! - **Clock**: SQLite's `'now'` (the engine machine's clock, ms precision);
//!   leases are judged by it, as PostgreSQL's `now()` is on the other backend.
//!
//! One file per concern, named as in `postgres/` (see there), so that the
//! two versions of a backend method sit at the same relative path. This
//! file holds the connections, migrations, health checks and the SQL of
//! the engine's clock ([`NOW`]) that the other files share.

use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Sqlite, Transaction};
use tokio::sync::broadcast;
use uuid::Uuid;

use crate::rows::StoreError;
use crate::transition::{STATE_CACHE_RUNS, StateCache, TasksWakeSeq, Wake};

mod console_sessions;
mod definitions;
mod fleet;
mod fleet_level;
mod gates;
mod gauges;
mod mcp_tools;
mod notifications;
mod outbox;
mod principals;
mod run_search;
mod runs;
mod schema;
mod tasks;
mod tenants;
mod timers;
mod tool_cache;
mod tool_calls;
mod transition;
mod uncertain;
mod wakes;
mod workers;
mod write_decision;

/// SQL for "now" in the stored time format (`YYYY-MM-DDTHH:MM:SS.SSSZ`).
const NOW: &str = "strftime('%Y-%m-%dT%H:%M:%fZ','now', COALESCE((SELECT printf('%+.3f seconds', offset_ms / 1000.0) FROM belay_clock WHERE id = 1), '+0 seconds'))";

/// The strftime modifier that shifts SQLite's `'now'` by the clock offset
/// (see `Store::advance_clock`).
const CLOCK: &str = "COALESCE((SELECT printf('%+.3f seconds', offset_ms / 1000.0) FROM belay_clock WHERE id = 1), '+0 seconds')";

/// SQL for "now plus the ms in bound parameter `?N`" in the stored format.
fn now_plus_ms(param: u8) -> String {
    format!(
        "strftime('%Y-%m-%dT%H:%M:%fZ','now', {CLOCK}, printf('%+.3f seconds', ?{param} / 1000.0))"
    )
}

/// SQL: whether the fleet is in its grace after an outage (see
/// `fleet.rs`): it began hearing workers again less than the ms in bound
/// parameter `?N` ago.
fn fleet_in_grace(param: u8) -> String {
    format!(
        "EXISTS (SELECT 1 FROM fleet_liveness f WHERE f.id = 1 AND f.up_since > \
         strftime('%Y-%m-%dT%H:%M:%fZ','now', {CLOCK}, printf('%+.3f seconds', -?{param} / 1000.0)))"
    )
}

/// A timestamp in the stored format, for binding.
fn ts(t: &DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

/// A keyset position `(created_at, id)` for binding. Stored times have ms
/// precision; a position between two ms (a hand-made page token, or one
/// from PostgreSQL, which keeps µs) lies after every row of its ms, whatever
/// the id, so it becomes (that ms, the largest id). Without this the
/// fraction would be cut off and rows of that ms with a larger id skipped.
fn keyset(after: Option<(DateTime<Utc>, Uuid)>) -> (Option<String>, Option<Uuid>) {
    match after {
        None => (None, None),
        Some((t, id)) if t.timestamp_subsec_nanos() % 1_000_000 == 0 => (Some(ts(&t)), Some(id)),
        Some((t, _)) => (Some(ts(&t)), Some(Uuid::max())),
    }
}

/// The SQLite backend of [`Store`](crate::Store); cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Lite {
    /// The one writer connection.
    write: SqlitePool,
    /// Readers (the writer itself for an in-memory database).
    read: SqlitePool,
    /// See the PostgreSQL backend: folded states of recently changed runs.
    states: Arc<Mutex<StateCache>>,
    /// Wake-ups, sent after commit.
    wake: broadcast::Sender<Wake>,
    /// Bumped whenever tasks may have become claimable
    /// ([`crate::Store::tasks_wake_seq`]).
    tasks_seq: TasksWakeSeq,
    /// The exclusive `flock` on the database file, held while any clone lives and
    /// the store is not closed.
    lock: Arc<Mutex<Option<std::fs::File>>>,
}

impl Lite {
    /// Open `sqlite://PATH`, `sqlite:PATH` or `sqlite::memory:`; readers get
    /// at most `max_connections` connections.
    pub(crate) async fn connect(url: &str, max_connections: u32) -> Result<Lite, StoreError> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| StoreError::Config(format!("SQLite URL {url:?}: {e}")))?
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10));
        // In memory only when the URL says so: `sqlite::memory:`, or a
        // `mode=memory` query parameter; a file whose name merely contains
        // those words is a file.
        let (location, query) = url.split_once('?').unwrap_or((url, ""));
        let memory = location == "sqlite::memory:"
            || location == "sqlite://:memory:"
            || query.split('&').any(|p| p == "mode=memory");
        let (write, read, lock) = if memory {
            // One connection that never closes: the database lives in it.
            let pool = SqlitePoolOptions::new()
                .max_connections(1)
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None)
                .acquire_timeout(Duration::from_secs(60))
                .connect_with(options)
                .await?;
            (pool.clone(), pool, None)
        } else {
            let path = options.get_filename().to_path_buf();
            if let Some(dir) = path.parent()
                && !dir.as_os_str().is_empty()
                && !dir.exists()
            {
                std::fs::create_dir_all(dir).map_err(|e| {
                    StoreError::Config(format!("creating directory {}: {e}", dir.display()))
                })?;
            }
            let lock = lock_file(&path)?;
            let options = options
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Full);
            let write = SqlitePoolOptions::new()
                .max_connections(1)
                .acquire_timeout(Duration::from_secs(60))
                .connect_with(options.clone())
                .await?;
            let read = SqlitePoolOptions::new()
                .max_connections(max_connections.max(1))
                .acquire_timeout(Duration::from_secs(10))
                .connect_with(options)
                .await?;
            (write, read, Some(lock))
        };
        let (wake, _) = broadcast::channel(1024);
        Ok(Lite {
            write,
            read,
            states: Arc::new(Mutex::new(StateCache::new(STATE_CACHE_RUNS))),
            wake,
            tasks_seq: TasksWakeSeq::default(),
            lock: Arc::new(Mutex::new(lock)),
        })
    }

    pub(crate) async fn migrate(&self) -> Result<(), StoreError> {
        let mut migrator = sqlx::migrate!("../../migrations/sqlite");
        let known: Vec<i64> = migrator.iter().map(|m| m.version).collect();
        let (applied, oldest) = self.schema_versions().await?;
        crate::schema::check(&known, &applied, oldest)?;
        // Migrations of a newer release this engine does not know are
        // expected during a rolling upgrade (`schema.rs`).
        migrator.set_ignore_missing(true);
        migrator.run(&self.write).await?;
        Ok(())
    }

    pub(crate) async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.read).await?;
        Ok(())
    }

    async fn begin(&self) -> Result<Transaction<'static, Sqlite>, StoreError> {
        Ok(self.write.begin_with("BEGIN IMMEDIATE").await?)
    }

    pub(crate) async fn close(&self) {
        self.write.close().await;
        self.read.close().await;
        // No connection is left, so another engine may open the file now
        // (a restart in the same process, as after a crash in another).
        self.lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
    }
}

/// Take an exclusive `flock` on the database file itself (created empty if
/// missing; SQLite takes an empty file as a new database). The lock follows
/// the file, not the name: a symlink, a hard link or another spelling of the
/// path finds it taken. It is released when the handle closes, including
/// when the process dies. (SQLite's own locks are POSIX `fcntl` locks, which
/// `flock` does not interact with on Linux; the handle is closed only after
/// every SQLite connection, as closing it would drop this process's `fcntl`
/// locks on the file.)
fn lock_file(path: &std::path::Path) -> Result<std::fs::File, StoreError> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| {
            StoreError::Config(format!("opening SQLite database {}: {e}", path.display()))
        })?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(StoreError::Config(format!(
            "SQLite database {} is in use by another engine process; \
             one engine process per SQLite file; use PostgreSQL for several engine replicas",
            path.display(),
        ))),
        Err(std::fs::TryLockError::Error(e)) => Err(StoreError::Config(format!(
            "locking SQLite database {}: {e}",
            path.display()
        ))),
    }
}
