//! The PostgreSQL backend (production: any number of engine replicas
//! share one database).
//!
//! One file per concern, named as in `sqlite/`, so that the two versions
//! of a backend method sit at the same relative path: this file (the pool,
//! migrations, health checks), `wakes` (wake-ups: `LISTEN/NOTIFY`),
//! `tenants`, `definitions`, `runs`, `transition` (locking and folding a
//! run for [`Store::transition`](crate::Store::transition)),
//! `write_decision` (the statements of a decision), `tasks` (claims,
//! heartbeats, leases), `timers` (timers, callbacks, the engine's clock),
//! `uncertain`, `outbox`, `notifications`, `gates` (tool gates),
//! `tool_cache`, `mcp_tools`, `tool_calls` (the audit) and `principals`
//! (callers' credentials).

use std::time::Duration;

use std::sync::atomic::AtomicI32;
use std::sync::{Arc, Mutex};

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use crate::rows::StoreError;
use crate::transition::{STATE_CACHE_RUNS, StateCache};
use wakes::WakeRelay;

/// SQL: whether the run of task `t` lets it be claimed (running or
/// waiting, or paused and the task runs while paused); NULL, so false, when
/// the run is gone. A scalar sub-select, which PostgreSQL does not flatten
/// into a join, so every plan looks the run up by primary key for each
/// candidate task in `tasks_ready` order: a join let a generic plan
/// prepared while the tables were small read every run (`Seq Scan on
/// runs`, kept as the table grew, until it was first analysed).
macro_rules! run_admits_task {
    () => {
        "(SELECT r.status IN ('running', 'waiting') OR (r.status = 'paused' AND t.runs_while_paused)
           FROM runs r WHERE r.run_id = t.run_id)"
    };
}

/// SQL: whether the lease of task `t` (leased) still holds at `$now` (an
/// SQL expression): its claim-time `lease_expires_at`, or a heartbeat's
/// extension of the same attempt in `task_heartbeats`. Heartbeats write
/// only that narrow table (migration `20261206000090`), so liveness does
/// not rewrite `tasks` rows (wide: the spec) or their index entries; a
/// task that ends before its first heartbeat (most do) never has a row
/// there, and the extension is looked up only once the claim-time lease
/// has passed.
macro_rules! lease_holds {
    ($now:literal) => {
        concat!(
            "(t.lease_expires_at > ",
            $now,
            " OR EXISTS (SELECT 1 FROM task_heartbeats h
                  WHERE h.task_id = t.task_id AND h.attempt = t.attempt AND h.lease_until > ",
            $now,
            "))"
        )
    };
}

/// SQL: whether the fleet is in its grace after an outage (see
/// `fleet.rs`): it began hearing workers again less than the ms in
/// parameter `$N` ago (a lease length).
macro_rules! fleet_in_grace {
    ($ms:literal) => {
        concat!(
            "EXISTS (SELECT 1 FROM fleet_liveness f WHERE f.id = 1
                AND f.up_since > belay_now() - make_interval(secs => ",
            $ms,
            "::float8 / 1000.0))"
        )
    };
}

mod console_sessions;
mod definitions;
mod fleet;
mod fleet_level;
mod gates;
mod gauges;
mod mcp_tools;
mod notifications;
mod optimistic;
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
pub(crate) mod wakes;
mod workers;
mod write_decision;

/// The PostgreSQL backend of [`Store`](crate::Store); cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Pg {
    pool: PgPool,
    /// Folded states of recently changed runs, so a transition folds only
    /// the events appended since (by any replica) instead of the whole
    /// history. Entries are only a cache: a state is used only when its
    /// `last_seq` is at most the run row's, read under the run lock, and the
    /// missing tail is folded from the events table.
    states: Arc<Mutex<StateCache>>,
    /// Wake-ups of committed transitions, sent after commit
    /// ([`wakes`]).
    wakes: WakeRelay,
    /// This replica's id in `engine_replicas` (`fleet_level`), new for
    /// every connect.
    replica_id: uuid::Uuid,
    /// The fleet's behaviour level as last read (`fleet_level`; 0, the
    /// most cautious, until [`Pg::join_fleet`] read it).
    fleet_level: Arc<AtomicI32>,
}

/// A pooled connection idle this long is pinged before it is handed out.
const PING_IDLE_AFTER: Duration = Duration::from_secs(1);

impl Pg {
    /// Connect with a pool of at most `max_connections`.
    ///
    /// Errors: [`StoreError::Database`] when the database is unreachable.
    pub(crate) async fn connect(url: &str, max_connections: u32) -> Result<Pg, StoreError> {
        let mut options: PgConnectOptions = url.parse()?;
        // How the fleet tells engines that register (`fleet_level`) from
        // engines of a release before the registry; a name the URL gives
        // is kept after it (without the prefix, this engine's own
        // connections would look like an older engine's, and the fleet's
        // level could never rise).
        let name = crate::fleet_level::application_name(options.get_application_name());
        options = options.application_name(&name);
        // One plain connection first: an unreachable server, a refused login
        // or a missing database is reported as itself, at once, instead of
        // as a pool timeout after 10 s.
        let probe = tokio::time::timeout(
            Duration::from_secs(10),
            <sqlx::PgConnection as sqlx::Connection>::connect_with(&options),
        )
        .await
        .map_err(|_| {
            StoreError::Config(format!(
                "PostgreSQL at {} did not answer within 10 s",
                shown_url(url)
            ))
        })??;
        sqlx::Connection::close(probe).await?;
        // sqlx pings (a round trip) every connection it hands out by
        // default (and, unconditionally, every one given back, which also
        // closes one that broke in use); a connection used within the last
        // second is live but for
        // a server restart in that second, which fails the statement and
        // the transaction rolls back (the caller retries, and sqlx drops the
        // broken connection), so only a longer idle one is pinged.
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(10))
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= PING_IDLE_AFTER {
                        sqlx::Connection::ping(conn).await?;
                    }
                    Ok(true)
                })
            })
            .connect_with(options)
            .await?;
        Ok(Pg {
            wakes: WakeRelay::start(pool.clone()),
            pool,
            states: Arc::new(Mutex::new(StateCache::new(STATE_CACHE_RUNS))),
            replica_id: uuid::Uuid::new_v4(),
            fleet_level: Arc::new(AtomicI32::new(0)),
        })
    }

    /// The underlying pool (for LISTEN connections).
    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Apply pending migrations from `migrations/` (embedded at build time).
    pub(crate) async fn migrate(&self) -> Result<(), StoreError> {
        let mut migrator = sqlx::migrate!("../../migrations/postgres");
        let known: Vec<i64> = migrator.iter().map(|m| m.version).collect();
        let (applied, oldest) = self.schema_versions().await?;
        crate::schema::check(&known, &applied, oldest)?;
        // Migrations of a newer release this engine does not know are
        // expected during a rolling upgrade (`schema.rs`).
        migrator.set_ignore_missing(true);
        migrator.run(&self.pool).await?;
        // Refuses an engine the fleet's behaviour level is past.
        self.join_fleet(crate::fleet_level::BEHAVIOUR_LEVEL).await?;
        Ok(())
    }

    /// One round trip to the database (health checks).
    pub(crate) async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    pub(crate) async fn close(&self) {
        self.pool.close().await;
    }
}

/// A database URL without its password, for messages.
fn shown_url(url: &str) -> String {
    match split_credentials(url) {
        Some((scheme, rest)) => format!("{scheme}://{rest}"),
        None => "the configured URL".to_owned(),
    }
}

/// `(scheme, host-and-path)` of `scheme://[user[:password]@]host…`, the
/// credentials dropped.
fn split_credentials(url: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    Some((scheme, rest))
}
