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
    /// Label values set so far, by gauge of [`GAUGES`].
    seen: [BTreeSet<Labels>; 5],
}

/// A series' label values, in the order of its gauge's label names.
type Labels = Vec<String>;

/// A gauge's figures: label values and a count.
type Figures = Vec<(Labels, i64)>;

/// The gauges of `GaugeCounts`, in the order of `State::seen`, with their
/// label names.
const GAUGES: [(&str, &[&str]); 5] = [
    (TASKS_READY, &["kind", "pool"]),
    (TASKS_UNCLAIMABLE, &["kind"]),
    (UNCERTAIN_OPEN, &["tenant"]),
    (RUNS_PAUSED, &["reason"]),
    (RUNS_WAITING, &["reason"]),
];

/// The task kinds, each always shown in the backlog gauges (0 included;
/// the ready backlog with pool "").
const KINDS: [&str; 2] = ["model_call", "tool_call"];

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
            Ok::<_, crate::store::StoreError>((counts, unclaimable))
        };
        match read.await {
            Ok((counts, unclaimable)) => {
                state.read_at = Some(Instant::now());
                // Tasks a requirement of which no live worker has: more
                // workers like the live ones would not take them either.
                let missing: Vec<_> = unclaimable
                    .iter()
                    .filter(|t| !t.missing.is_empty())
                    .collect();
                let lists = [
                    // What workers can take: the autoscaler scales on it,
                    // and must not add workers for tasks that need what no
                    // live worker has (with no live worker at all, every
                    // ready task counts: a first worker takes it).
                    claimable(counts.tasks_ready, &missing),
                    count_by(&unclaimable, |t| vec![t.kind.clone()]),
                    one_label(counts.uncertain_open),
                    one_label(counts.runs_paused),
                    one_label(counts.runs_waiting),
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

/// The ready backlog by `(kind, pool)` less the tasks of `cannot` (by the
/// same), at least 0.
fn claimable(
    ready: Vec<(String, String, i64)>,
    cannot: &[&crate::store::UnclaimableTask],
) -> Figures {
    let less = count_by(cannot, |t| {
        vec![
            t.kind.clone(),
            crate::store::pool_of(&t.requires).to_owned(),
        ]
    });
    ready
        .into_iter()
        .map(|(kind, pool, n)| {
            let labels = vec![kind, pool];
            let minus: i64 = less
                .iter()
                .filter(|(l, _)| *l == labels)
                .map(|(_, c)| *c)
                .sum();
            (labels, (n - minus).max(0))
        })
        .collect()
}

/// `tasks` counted by the label values `labels` gives each.
fn count_by<T>(tasks: &[T], labels: impl Fn(&T) -> Labels) -> Figures {
    let mut counts = std::collections::BTreeMap::<Labels, i64>::new();
    for task in tasks {
        *counts.entry(labels(task)).or_default() += 1;
    }
    counts.into_iter().collect()
}

/// The figures of a one-label gauge.
fn one_label(list: Vec<(String, i64)>) -> Figures {
    list.into_iter().map(|(v, n)| (vec![v], n)).collect()
}

/// Sets gauge `name` to `list`, and to 0 for label values seen before but
/// absent now. The backlog gauges always have both kinds.
fn set_gauge(
    m: &EngineMetrics,
    (name, names): (&'static str, &[&'static str]),
    seen: &mut BTreeSet<Labels>,
    list: Figures,
) {
    if name == TASKS_READY || name == TASKS_UNCLAIMABLE {
        // The kinds with the other labels empty: pool "" (no pool).
        seen.extend(KINDS.map(|k| {
            let mut labels = vec![String::new(); names.len()];
            labels[0] = k.to_owned();
            labels
        }));
    }
    let set = |values: &Labels, figure: f64| {
        let labels: Vec<(&'static str, &str)> = names
            .iter()
            .zip(values)
            .map(|(n, v)| (*n, v.as_str()))
            .collect();
        m.gauge(name, &labels).set(figure);
    };
    let mut zero = seen.clone();
    for (values, count) in list {
        set(&values, count as f64);
        zero.remove(&values);
        seen.insert(values);
    }
    for values in zero {
        set(&values, 0.0);
    }
}

/// Sets `belay_db_errors_total` from the store's process-wide counts.
fn set_errors(m: &EngineMetrics) {
    for (class, count) in crate::store::db_error_counts() {
        m.counter(DB_ERRORS, &[("class", class)]).absolute(count);
    }
}
