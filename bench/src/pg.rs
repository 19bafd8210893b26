//! Everything the benchmark asks PostgreSQL directly: its own fresh database,
//! the commit counters of `pg_stat_database`, step latencies computed from
//! the task and event rows after the run, and the single-insert commit
//! ceiling.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use sqlx::{Connection, PgConnection, PgPool, Row};

/// A database created for one benchmark run (`belay_bench_<uuid>`) on the
/// server of the given URL; nothing else on that server is touched.
#[derive(Debug, Clone)]
pub struct BenchDatabase {
    /// URL of the database the bench connected to in order to create this one.
    admin_url: String,
    /// The database's name.
    pub name: String,
    /// URL of the database.
    pub url: String,
}

/// `url` with its database (the path) replaced by `database`.
///
/// Errors: `url` is not a URL.
pub fn with_database(url: &str, database: &str) -> Result<String> {
    let mut parsed =
        reqwest::Url::parse(url).with_context(|| format!("--database-url {url:?} is not a URL"))?;
    parsed.set_path(&format!("/{database}"));
    Ok(parsed.to_string())
}

impl BenchDatabase {
    /// Creates a fresh, empty database on the server of `server_url`.
    ///
    /// Errors: the server is unreachable or refuses `CREATE DATABASE`.
    pub async fn create(server_url: &str) -> Result<BenchDatabase> {
        BenchDatabase::create_named(server_url, "belay_bench").await
    }

    /// Creates a fresh, empty database `<prefix>_<uuid>` on the server of
    /// `server_url` (`prefix`: lower-case letters, digits and `_`).
    ///
    /// Errors: the server is unreachable or refuses `CREATE DATABASE`.
    pub async fn create_named(server_url: &str, prefix: &str) -> Result<BenchDatabase> {
        let name = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
        let url = with_database(server_url, &name)?;
        let mut admin = PgConnection::connect(server_url).await.with_context(|| {
            format!("connecting to PostgreSQL at {server_url} (is it running?)")
        })?;
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await
            .with_context(|| format!("creating the database {name}"))?;
        admin.close().await?;
        Ok(BenchDatabase {
            admin_url: server_url.to_owned(),
            name,
            url,
        })
    }

    /// Drops the database, ending any connection still open to it.
    ///
    /// Errors: the server is unreachable or refuses `DROP DATABASE`.
    pub async fn drop_database(&self) -> Result<()> {
        let mut admin = PgConnection::connect(&self.admin_url).await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        )))
        .execute(&mut admin)
        .await
        .with_context(|| format!("dropping the database {}", self.name))?;
        admin.close().await?;
        Ok(())
    }
}

/// A pool of the bench's own connections to its database that counts the
/// statements it runs, so they can be left out of the engine's transaction
/// count.
#[derive(Debug, Clone)]
pub struct Monitor {
    pool: PgPool,
    statements: Arc<AtomicU64>,
    polled_runs: Arc<AtomicU64>,
}

/// Commit and rollback counters of one database (`pg_stat_database`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct XactCounts {
    /// `xact_commit`.
    pub commits: i64,
    /// `xact_rollback`.
    pub rollbacks: i64,
}

/// Activity counters of one table (`pg_stat_user_tables`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableCounts {
    /// Sequential scans started.
    pub seq_scan: i64,
    /// Rows read by sequential scans.
    pub seq_tup_read: i64,
    /// Index scans started.
    pub idx_scan: i64,
    /// Index entries read by index scans (plain and bitmap).
    pub idx_tup_read: i64,
    /// Rows inserted.
    pub inserted: i64,
    /// Rows updated (HOT updates included).
    pub updated: i64,
    /// Rows updated without touching an index (HOT).
    pub hot_updated: i64,
    /// Rows deleted.
    pub deleted: i64,
}

impl TableCounts {
    /// `self - earlier`, field by field.
    pub fn since(&self, earlier: &TableCounts) -> TableCounts {
        TableCounts {
            seq_scan: self.seq_scan - earlier.seq_scan,
            seq_tup_read: self.seq_tup_read - earlier.seq_tup_read,
            idx_scan: self.idx_scan - earlier.idx_scan,
            idx_tup_read: self.idx_tup_read - earlier.idx_tup_read,
            inserted: self.inserted - earlier.inserted,
            updated: self.updated - earlier.updated,
            hot_updated: self.hot_updated - earlier.hot_updated,
            deleted: self.deleted - earlier.deleted,
        }
    }

    /// True when nothing happened.
    pub fn is_idle(&self) -> bool {
        *self == TableCounts::default()
    }
}

/// The counters of the database and of its tables at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DbCounts {
    /// Commits and rollbacks.
    pub xact: XactCounts,
    /// Per table, by name.
    pub tables: BTreeMap<String, TableCounts>,
}

impl DbCounts {
    /// The per-table activity between `earlier` and `self`, tables that did
    /// something only.
    pub fn tables_since(&self, earlier: &DbCounts) -> Vec<(String, TableCounts)> {
        self.tables
            .iter()
            .map(|(name, now)| {
                let before = earlier.tables.get(name).copied().unwrap_or_default();
                (name.clone(), now.since(&before))
            })
            .filter(|(_, delta)| !delta.is_idle())
            .collect()
    }
}

const XACT_QUERY: &str =
    "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = current_database()";

// Index entries read are summed over the table's indexes: unlike the
// table's `idx_tup_fetch`, they count bitmap scans too.
const TABLES_QUERY: &str = "SELECT t.relname::text AS relname,
        COALESCE(t.seq_scan, 0) AS seq_scan, COALESCE(t.seq_tup_read, 0) AS seq_tup_read,
        COALESCE(t.idx_scan, 0) AS idx_scan, COALESCE(i.idx_tup_read, 0)::int8 AS idx_tup_read,
        t.n_tup_ins, t.n_tup_upd, t.n_tup_hot_upd, t.n_tup_del
 FROM pg_stat_user_tables t
 LEFT JOIN (SELECT relid, sum(idx_tup_read) AS idx_tup_read FROM pg_stat_user_indexes GROUP BY relid) i
        ON i.relid = t.relid";

fn xact_of(row: &sqlx::postgres::PgRow) -> Result<XactCounts> {
    Ok(XactCounts {
        commits: row.try_get("xact_commit")?,
        rollbacks: row.try_get("xact_rollback")?,
    })
}

fn tables_of(rows: &[sqlx::postgres::PgRow]) -> Result<BTreeMap<String, TableCounts>> {
    rows.iter()
        .map(|row| {
            Ok((
                row.try_get("relname")?,
                TableCounts {
                    seq_scan: row.try_get("seq_scan")?,
                    seq_tup_read: row.try_get("seq_tup_read")?,
                    idx_scan: row.try_get("idx_scan")?,
                    idx_tup_read: row.try_get("idx_tup_read")?,
                    inserted: row.try_get("n_tup_ins")?,
                    updated: row.try_get("n_tup_upd")?,
                    hot_updated: row.try_get("n_tup_hot_upd")?,
                    deleted: row.try_get("n_tup_del")?,
                },
            ))
        })
        .collect()
}

/// Final status of a run, as the monitor saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunEnd {
    /// `completed`, `failed`, `cancelled`, or `paused`.
    pub status: String,
    /// Why, for anything but `completed`.
    pub reason: String,
}

impl Monitor {
    /// Connects one connection to `url`.
    ///
    /// Errors: the database is unreachable.
    pub async fn connect(url: &str) -> Result<Monitor> {
        let statements = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&statements);
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            // The poll must always be an index scan of `runs`, one per run id,
            // so that it can be subtracted from the table's figures exactly.
            .after_connect(move |conn, _| {
                let counter = Arc::clone(&counter);
                Box::pin(async move {
                    counter.fetch_add(1, Ordering::Relaxed);
                    sqlx::query("SET enable_seqscan = off")
                        .execute(conn)
                        .await?;
                    Ok(())
                })
            })
            .connect(url)
            .await
            .context("connecting the bench's monitor to its database")?;
        Ok(Monitor {
            pool,
            statements,
            polled_runs: Arc::new(AtomicU64::new(0)),
        })
    }

    /// The pool, for queries whose transactions need not be counted.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Statements (each its own transaction) run through [`Monitor::counted`]
    /// so far.
    pub fn statements(&self) -> u64 {
        self.statements.load(Ordering::Relaxed)
    }

    /// Run ids looked up by [`Monitor::ended_runs`] so far: each is one
    /// index scan of `runs` (PostgreSQL scans `= ANY(array)` once per element).
    pub fn polled_runs(&self) -> u64 {
        self.polled_runs.load(Ordering::Relaxed)
    }

    fn counted(&self) {
        self.statements.fetch_add(1, Ordering::Relaxed);
    }

    /// The database's and its tables' counters (two counted statements).
    ///
    /// Errors: the queries failing.
    pub async fn counts(&self) -> Result<DbCounts> {
        self.counted();
        let row = sqlx::query(XACT_QUERY)
            .fetch_one(&self.pool)
            .await
            .context("reading pg_stat_database")?;
        self.counted();
        let rows = sqlx::query(TABLES_QUERY)
            .fetch_all(&self.pool)
            .await
            .context("reading pg_stat_user_tables")?;
        Ok(DbCounts {
            xact: xact_of(&row)?,
            tables: tables_of(&rows)?,
        })
    }

    /// Which of `runs` have ended (or paused); one counted statement.
    ///
    /// Errors: the query failing.
    pub async fn ended_runs(&self, runs: &[uuid::Uuid]) -> Result<Vec<(uuid::Uuid, RunEnd)>> {
        self.counted();
        self.polled_runs
            .fetch_add(runs.len() as u64, Ordering::Relaxed);
        let rows = sqlx::query(
            "SELECT run_id, status, status_reason FROM runs
             WHERE run_id = ANY($1) AND status IN ('completed', 'failed', 'cancelled', 'paused')",
        )
        .bind(runs)
        .fetch_all(&self.pool)
        .await
        .context("polling run statuses")?;
        rows.into_iter()
            .map(|row| {
                Ok((
                    row.try_get("run_id")?,
                    RunEnd {
                        status: row.try_get("status")?,
                        reason: row.try_get("status_reason")?,
                    },
                ))
            })
            .collect()
    }

    /// Closes the pool, so its backend exits and flushes its statistics.
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// Reads the database's counters once every other backend has gone (so
/// their statistics are flushed) and the commit counter has settled: it must
/// not move for a short while. Opens (and closes) its own connection; its
/// own reads are not in the counters it returns.
///
/// Errors: the database is unreachable.
pub async fn settled_counts(url: &str) -> Result<Settled> {
    let mut statements = 0;
    let mut conn = PgConnection::connect(url).await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let others: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .fetch_one(&mut conn)
        .await?;
        statements += 1;
        if others == 0 || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut last = xact_of(&sqlx::query(XACT_QUERY).fetch_one(&mut conn).await?)?;
    statements += 1;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = xact_of(&sqlx::query(XACT_QUERY).fetch_one(&mut conn).await?)?;
        statements += 1;
        if now == last {
            break;
        }
        last = now;
    }
    let rows = sqlx::query(TABLES_QUERY).fetch_all(&mut conn).await?;
    statements += 1;
    let tables = tables_of(&rows)?;
    conn.close().await?;
    Ok(Settled {
        counts: DbCounts { xact: last, tables },
        statements,
    })
}

/// What [`settled_counts`] read, and how many statements it ran to read it
/// (which counters read later include).
#[derive(Debug, Clone)]
pub struct Settled {
    /// The counters.
    pub counts: DbCounts,
    /// Statements run, each its own transaction.
    pub statements: u64,
}

/// Step timings of a finished benchmark, from the database.
#[derive(Debug, Clone, Default)]
pub struct StepTimings {
    /// Ready → result recorded of every completed model call task, in ms.
    pub model_ms: Vec<f64>,
    /// Ready → result recorded of every completed tool call task, in ms.
    pub tool_ms: Vec<f64>,
    /// Ready → dispatched of every completed tool call task, in ms.
    pub tool_dispatch_ms: Vec<f64>,
    /// Tasks that needed more than one attempt.
    pub retried: u64,
    /// Tasks not completed (failed, cancelled, uncertain or still open).
    pub not_completed: u64,
    /// Events written.
    pub events: u64,
    /// Created → last update of every run, in ms.
    pub run_ms: Vec<f64>,
    /// Ready → recorded of the steps in the first tenth of each run (by
    /// creation), ms: with the last tenth, shows whether a step costs more
    /// as its run's history grows.
    pub first_tenth_ms: Vec<f64>,
    /// The same, last tenth of each run.
    pub last_tenth_ms: Vec<f64>,
    /// The run with the longest history, and its events.
    pub longest_run: Option<(uuid::Uuid, i64)>,
}

impl StepTimings {
    /// Completed steps (model and tool call tasks).
    pub fn steps(&self) -> u64 {
        (self.model_ms.len() + self.tool_ms.len()) as u64
    }
}

/// Reads the step timings: a task becomes ready at its `available_at` (its
/// creation, or the end of its last retry backoff) and is done at the
/// `recorded_at` of the `model_call_completed` / `tool_call_completed` event
/// of its call. Both are `now()` of their transactions, so the figure runs
/// from the start of the transaction that made the task ready to the start
/// of the one that recorded its result.
///
/// Errors: the queries failing.
pub async fn step_timings(pool: &PgPool) -> Result<StepTimings> {
    let rows = sqlx::query(
        "SELECT t.kind, t.attempt,
                (EXTRACT(EPOCH FROM (e.recorded_at - t.available_at)) * 1000)::float8 AS done_ms,
                (EXTRACT(EPOCH FROM (t.dispatched_at - t.available_at)) * 1000)::float8 AS dispatch_ms,
                ntile(10) OVER (PARTITION BY t.run_id ORDER BY t.created_at, t.task_id) AS tenth
         FROM tasks t
         JOIN events e ON e.run_id = t.run_id AND e.payload->>'call_id' = t.call_id
                      AND e.kind IN ('model_call_completed', 'tool_call_completed')
         WHERE t.status = 'completed'",
    )
    .fetch_all(pool)
    .await
    .context("reading step timings")?;
    let mut timings = StepTimings::default();
    for row in rows {
        let kind: String = row.try_get("kind")?;
        let attempt: i32 = row.try_get("attempt")?;
        let done: f64 = row.try_get("done_ms")?;
        let dispatch: Option<f64> = row.try_get("dispatch_ms")?;
        let tenth: i32 = row.try_get("tenth")?;
        if attempt > 1 {
            timings.retried += 1;
        }
        match tenth {
            1 => timings.first_tenth_ms.push(done),
            10 => timings.last_tenth_ms.push(done),
            _ => {}
        }
        match kind.as_str() {
            "model_call" => timings.model_ms.push(done),
            "tool_call" => {
                timings.tool_ms.push(done);
                if let Some(dispatch) = dispatch {
                    timings.tool_dispatch_ms.push(dispatch);
                }
            }
            other => bail!("unexpected task kind {other:?}"),
        }
    }
    let not_completed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM tasks WHERE status <> 'completed'")
            .fetch_one(pool)
            .await?;
    timings.not_completed = not_completed.max(0) as u64;
    let events: i64 = sqlx::query_scalar("SELECT count(*) FROM events")
        .fetch_one(pool)
        .await?;
    timings.events = events.max(0) as u64;
    timings.longest_run = sqlx::query_as(
        "SELECT run_id, last_seq::int8 FROM runs ORDER BY last_seq DESC, run_id LIMIT 1",
    )
    .fetch_optional(pool)
    .await?;
    timings.run_ms = sqlx::query_scalar(
        "SELECT (EXTRACT(EPOCH FROM (updated_at - created_at)) * 1000)::float8 FROM runs",
    )
    .fetch_all(pool)
    .await?;
    Ok(timings)
}

/// A one-line summary of where runs and tasks are, for a timeout message.
///
/// Errors: the queries failing.
pub async fn progress_summary(pool: &PgPool) -> Result<String> {
    let runs: Vec<(String, i64)> =
        sqlx::query_as("SELECT status, count(*) FROM runs GROUP BY status ORDER BY status")
            .fetch_all(pool)
            .await?;
    let tasks: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT kind, status, count(*) FROM tasks GROUP BY kind, status ORDER BY kind, status",
    )
    .fetch_all(pool)
    .await?;
    let runs = runs
        .iter()
        .map(|(s, n)| format!("{s} {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    let tasks = tasks
        .iter()
        .map(|(k, s, n)| format!("{k} {s} {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    Ok(format!("runs: {runs}; tasks: {tasks}"))
}

/// PostgreSQL's single-row insert-and-commit ceiling, as measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ceiling {
    /// Connections inserting at once.
    pub connections: u32,
    /// Commits done.
    pub commits: u64,
    /// How long they took.
    pub elapsed: Duration,
}

impl Ceiling {
    /// Commits per second.
    pub fn per_sec(&self) -> f64 {
        self.commits as f64 / self.elapsed.as_secs_f64().max(f64::EPSILON)
    }
}

/// Measures single-row `INSERT` + commit transactions per second: each of
/// `connections` connections runs `INSERT INTO bench_ceiling ... VALUES ($1)`
/// (a prepared statement, autocommit: one round trip and one commit each) in
/// a loop for `duration`.
///
/// Errors: a connection or an insert failing.
pub async fn commit_ceiling(url: &str, connections: u32, duration: Duration) -> Result<Ceiling> {
    let mut setup = PgConnection::connect(url).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS bench_ceiling (
             id bigserial PRIMARY KEY,
             n bigint NOT NULL,
             at timestamptz NOT NULL DEFAULT now())",
    )
    .execute(&mut setup)
    .await
    .context("creating the ceiling's scratch table")?;
    setup.close().await?;

    let connections = connections.max(1);
    let mut conns = Vec::with_capacity(connections as usize);
    for _ in 0..connections {
        conns.push(
            PgConnection::connect(url)
                .await
                .context("connecting for the ceiling")?,
        );
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(connections as usize));
    let mut tasks = tokio::task::JoinSet::new();
    for (i, mut conn) in conns.into_iter().enumerate() {
        let barrier = Arc::clone(&barrier);
        tasks.spawn(async move {
            // Warm the prepared statement up before the clock starts.
            sqlx::query("INSERT INTO bench_ceiling (n) VALUES ($1)")
                .bind(-1_i64)
                .execute(&mut conn)
                .await?;
            barrier.wait().await;
            let start = Instant::now();
            let deadline = start + duration;
            let mut done = 0_u64;
            while Instant::now() < deadline {
                sqlx::query("INSERT INTO bench_ceiling (n) VALUES ($1)")
                    .bind(i as i64)
                    .execute(&mut conn)
                    .await?;
                done += 1;
            }
            let elapsed = start.elapsed();
            conn.close().await?;
            Ok::<_, sqlx::Error>((done, elapsed))
        });
    }
    let mut commits = 0;
    let mut elapsed = Duration::ZERO;
    while let Some(joined) = tasks.join_next().await {
        let (done, took) = joined.context("a ceiling task panicked")??;
        commits += done;
        elapsed = elapsed.max(took);
    }
    Ok(Ceiling {
        connections,
        commits,
        elapsed,
    })
}
