//! The gauges read from the database on scrape: the ready-task backlog,
//! open uncertain outcomes, paused and waiting runs (one statement,
//! `Store::gauge_counts`, at most once per [`REFRESH_EVERY`]: scrapes of
//! several Prometheus servers cost one statement), plus this process's
//! pool connections and database error counts (no statement).
//!
//! A label value seen once stays, at 0 once its rows are gone, so a
//! series does not vanish (and `max_over_time` of it stays right).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use super::{
    DB_ERRORS, DB_GAUGE_ERRORS, DB_POOL, EngineMetrics, RUNS_PAUSED, RUNS_WAITING, TASKS_READY,
    TASKS_UNCLAIMABLE, UNCERTAIN_OPEN,
};
use crate::store::Store;

/// How long a reading of the database gauges is served before the next
/// scrape reads again.
pub const REFRESH_EVERY: Duration = Duration::from_secs(1);

/// The cache of the database gauges.
#[derive(Debug, Default)]
pub(super) struct DbGauges {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// When the gauges were last read.
    read_at: Option<Instant>,
    /// Label values set so far, by gauge.
    seen: [BTreeSet<String>; 5],
}

/// The gauges of `GaugeCounts`, in the order of `State::seen`, with their
/// label name.
const GAUGES: [(&str, &str); 5] = [
    (TASKS_READY, "kind"),
    (TASKS_UNCLAIMABLE, "kind"),
    (UNCERTAIN_OPEN, "tenant"),
    (RUNS_PAUSED, "reason"),
    (RUNS_WAITING, "reason"),
];

impl DbGauges {
    /// Reads the database gauges into `m` unless read less than
    /// [`REFRESH_EVERY`] ago; sets the pool and error figures every time.
    /// A worker is live for `live_window_ms` after its last claim.
    pub(super) async fn refresh(&self, m: &EngineMetrics, store: &Store, live_window_ms: i64) {
        let pool = store.pool_connections();
        m.gauge(DB_POOL, &[("state", "idle")])
            .set(f64::from(pool.idle));
        m.gauge(DB_POOL, &[("state", "in_use")])
            .set(f64::from(pool.in_use));
        let mut state = self.state.lock().await;
        if state.read_at.is_some_and(|t| t.elapsed() < REFRESH_EVERY) {
            set_errors(m);
            return;
        }
        let read = async {
            let counts = store.gauge_counts().await?;
            let unclaimable = store
                .unclaimable_tasks(None, live_window_ms, UNCLAIMABLE_COUNTED)
                .await?;
            // Tasks a requirement of which no live worker has: more
            // workers like the live ones would not take them either.
            let missing: Vec<_> = unclaimable
                .iter()
                .filter(|t| !t.missing.is_empty())
                .cloned()
                .collect();
            Ok::<_, crate::store::StoreError>((counts, by_kind(&unclaimable), by_kind(&missing)))
        };
        match read.await {
            Ok((counts, unclaimable, missing)) => {
                state.read_at = Some(Instant::now());
                let lists = [
                    // What workers can take: the autoscaler scales on it,
                    // and must not add workers for tasks that need what no
                    // live worker has (with no live worker at all, every
                    // ready task counts: a first worker takes it).
                    claimable(counts.tasks_ready, &missing),
                    unclaimable,
                    counts.uncertain_open,
                    counts.runs_paused,
                    counts.runs_waiting,
                ];
                for (i, list) in lists.into_iter().enumerate() {
                    set_gauge(m, GAUGES[i], &mut state.seen[i], list);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the database gauges for /metrics");
                m.counter(DB_GAUGE_ERRORS, &[]).increment(1);
            }
        }
        set_errors(m);
    }
}

/// At most this many unclaimable tasks are counted per reading.
const UNCLAIMABLE_COUNTED: i64 = 1_000;

/// Ready tasks by kind (`ready`) less `cannot` (by kind), at least 0.
fn claimable(ready: Vec<(String, i64)>, cannot: &[(String, i64)]) -> Vec<(String, i64)> {
    ready
        .into_iter()
        .map(|(kind, n)| {
            let less: i64 = cannot
                .iter()
                .filter(|(k, _)| *k == kind)
                .map(|(_, c)| *c)
                .sum();
            (kind, (n - less).max(0))
        })
        .collect()
}

/// Unclaimable tasks counted by kind.
fn by_kind(tasks: &[crate::store::UnclaimableTask]) -> Vec<(String, i64)> {
    let mut counts = std::collections::BTreeMap::<String, i64>::new();
    for task in tasks {
        *counts.entry(task.kind.clone()).or_default() += 1;
    }
    counts.into_iter().collect()
}

/// Sets gauge `name` to `list`, and to 0 for label values seen before but
/// absent now. `tasks_ready` always has both kinds.
fn set_gauge(
    m: &EngineMetrics,
    (name, label): (&'static str, &'static str),
    seen: &mut BTreeSet<String>,
    list: Vec<(String, i64)>,
) {
    if name == TASKS_READY || name == TASKS_UNCLAIMABLE {
        seen.extend(["model_call".to_owned(), "tool_call".to_owned()]);
    }
    let mut zero: BTreeSet<String> = seen.clone();
    for (value, count) in list {
        m.gauge(name, &[(label, &value)]).set(count as f64);
        zero.remove(&value);
        seen.insert(value);
    }
    for value in zero {
        m.gauge(name, &[(label, &value)]).set(0.0);
    }
}

/// Sets `belay_db_errors_total` from the store's process-wide counts.
fn set_errors(m: &EngineMetrics) {
    for (class, count) in crate::store::db_error_counts() {
        m.counter(DB_ERRORS, &[("operation", class)])
            .absolute(count);
    }
}
