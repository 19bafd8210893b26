//! The engine's Prometheus metrics, served at `GET /metrics` of the admin
//! endpoint (text exposition format 0.0.4). Every name and label is
//! defined here, once; the Helm chart and dashboards depend on them.
//!
//! Recording goes through the `metrics` crate's [`Recorder`] API on a
//! recorder of this engine's own ([`EngineMetrics`], built by
//! `metrics-exporter-prometheus`), not the process-global one, so two
//! engines in one process (tests, `belay dev`) keep their figures apart.
//! The coordinator records what its transitions decide (`observe.rs`: the
//! events of each committed decision) and its claims; the gauges of the
//! database are read on scrape, at most once a second (`db.rs`).
//!
//! Labels are bounded: tenants, workflow, tool and model names come from
//! registered definitions, kinds, outcomes, statuses and reasons from
//! fixed lists; no run, call or task id is a label. The counters whose
//! labels are all from fixed lists ([`ZERO_SERIES`]) are shown at 0 from
//! the start, so a rate or an alert on them has a series before the first
//! event; the others appear with their first event.

mod db;
mod observe;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use metrics::{Counter, Gauge, Histogram, Key, Label, Metadata, Recorder};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};

pub use observe::{Observed, observe};

/// `belay_runs_started_total{tenant,workflow}`: runs created (top-level and
/// child runs).
pub const RUNS_STARTED: &str = "belay_runs_started_total";
/// `belay_runs_ended_total{tenant,workflow,status}`: runs that reached a
/// final status (`completed`, `failed`, `cancelled`).
pub const RUNS_ENDED: &str = "belay_runs_ended_total";
/// `belay_steps_total{kind,outcome}`: results of task attempts: `kind`
/// `model_call` or `tool_call`; `outcome` `succeeded`, `failed` (for
/// good), `retried` (failed, another attempt follows), `lease_expired`,
/// `uncertain`.
pub const STEPS: &str = "belay_steps_total";
/// `belay_step_duration_seconds{kind}` histogram: from a task attempt
/// becoming ready (claimable) to its result recorded.
pub const STEP_DURATION: &str = "belay_step_duration_seconds";
/// `belay_dispatch_latency_seconds{kind}` histogram: from a task becoming
/// ready to a worker claiming it.
pub const DISPATCH_LATENCY: &str = "belay_dispatch_latency_seconds";
/// `belay_tasks_ready{kind,pool}` gauge: ready, unclaimed tasks claimable
/// now, less those needing a capability no live worker has (counted in
/// `belay_tasks_unclaimable`), so an autoscaler on this adds no workers
/// for them; with no live worker every ready task counts. `pool` is the
/// pool the task's tool or agent names, "" for none (each worker group's
/// autoscaler takes its own pool's). The database's figure, the same on
/// every engine: take `max` across engines, not `sum`.
pub const TASKS_READY: &str = "belay_tasks_ready";
/// `belay_tasks_unclaimable{kind}` gauge: ready tasks no live worker can
/// take (their requirements are covered by no live worker's capabilities;
/// database-wide, at most 1,000 counted: take `max` across engines).
pub const TASKS_UNCLAIMABLE: &str = "belay_tasks_unclaimable";
/// `belay_leases_expired_total{kind}`: leases that ran out before the worker
/// reported (this engine's sweeper judged them).
pub const LEASES_EXPIRED: &str = "belay_leases_expired_total";
/// `belay_uncertain_outcomes_open{tenant}` gauge (database).
pub const UNCERTAIN_OPEN: &str = "belay_uncertain_outcomes_open";
/// `belay_runs_paused{reason}` gauge (database): `operator`,
/// `uncertain_outcome`.
pub const RUNS_PAUSED: &str = "belay_runs_paused";
/// `belay_runs_waiting{reason}` gauge (database): `signal`, `timer`,
/// `approval`, `child_run`, `callback`, `confirmation`, `input`, `other`.
pub const RUNS_WAITING: &str = "belay_runs_waiting";
/// `belay_model_tokens_total{provider,model,direction}`: tokens of model
/// calls as the provider reported them; `direction` `input` or `output`;
/// `provider` as the worker reports it (`openai`, `anthropic`), `unknown`
/// from a worker that does not.
pub const MODEL_TOKENS: &str = "belay_model_tokens_total";
/// `belay_model_cost_usd_total{provider,model}`: cost of model calls by the
/// agent's `pricing:` (agents without one add nothing), USD.
pub const MODEL_COST: &str = "belay_model_cost_usd_total";
/// `belay_tool_calls_total{tool,outcome}`: tool calls ended: `succeeded`,
/// `cached` (served from the result cache), `failed`, `uncertain`,
/// `refused` (a proposal failed the engine's checks; `tool` is `unknown`
/// for a name the run's plan does not have).
pub const TOOL_CALLS: &str = "belay_tool_calls_total";
/// `belay_db_pool_connections{state}` gauge: this engine's pool, `idle` or
/// `in_use`.
pub const DB_POOL: &str = "belay_db_pool_connections";
/// `belay_db_errors_total{class}`: database errors this process met, by
/// class: `pool_timeout`, `conflict`, `connection`, `statement`, `decode`,
/// `other` (see `belay_store::DB_ERROR_CLASSES`), every class shown from
/// the first scrape.
pub const DB_ERRORS: &str = "belay_db_errors_total";
/// `belay_task_claims_total{result}`: claim requests answered: `claimed`
/// (at least one task) or `empty`.
pub const TASK_CLAIMS: &str = "belay_task_claims_total";
/// `belay_db_gauge_refresh_errors_total`: scrapes whose database gauges
/// could not be read (the previous figures are served).
pub const DB_GAUGE_ERRORS: &str = "belay_db_gauge_refresh_errors_total";

/// The `kind` label values of task metrics.
const KINDS: &[&str] = &["model_call", "tool_call"];

/// The `outcome` label values of [`STEPS`].
const STEP_OUTCOMES: &[&str] = &[
    "succeeded",
    "failed",
    "retried",
    "lease_expired",
    "uncertain",
];

/// A label name with every value it takes.
type LabelValues = (&'static str, &'static [&'static str]);

/// The counters shown at 0 from the start, each with its label names and
/// every value of each: all their labels come from fixed lists. Not
/// [`DB_GAUGE_ERRORS`]: `promtool check metrics` refuses `gauge` in a
/// counter's name, so it stays absent until a refresh fails (renaming it
/// would break dashboards).
const ZERO_SERIES: &[(&str, &[LabelValues])] = &[
    (STEPS, &[("kind", KINDS), ("outcome", STEP_OUTCOMES)]),
    (LEASES_EXPIRED, &[("kind", KINDS)]),
    (TASK_CLAIMS, &[("result", &["claimed", "empty"])]),
];

/// Histogram buckets of every `_seconds` metric, seconds.
pub const SECONDS_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// Every metric with its help text, in the order they are described.
const HELP: &[(&str, &str)] = &[
    (RUNS_STARTED, "Runs created, by tenant and workflow."),
    (
        RUNS_ENDED,
        "Runs that reached a final status (completed, failed, cancelled).",
    ),
    (STEPS, "Results of task attempts, by kind and outcome."),
    (
        STEP_DURATION,
        "Seconds from a task attempt becoming ready to its result recorded.",
    ),
    (
        DISPATCH_LATENCY,
        "Seconds from a task becoming ready to a worker claiming it.",
    ),
    (
        TASKS_READY,
        "Ready, unclaimed tasks claimable now (database-wide: take max across engines).",
    ),
    (
        TASKS_UNCLAIMABLE,
        "Ready tasks no live worker can take (database-wide: take max across engines).",
    ),
    (
        LEASES_EXPIRED,
        "Task leases that expired before the worker reported.",
    ),
    (
        UNCERTAIN_OPEN,
        "Open uncertain outcomes (database-wide), by tenant.",
    ),
    (RUNS_PAUSED, "Paused runs (database-wide), by reason."),
    (RUNS_WAITING, "Waiting runs (database-wide), by reason."),
    (
        MODEL_TOKENS,
        "Model tokens as providers reported them, by direction.",
    ),
    (TOOL_CALLS, "Tool calls ended, by tool and outcome."),
    (
        DB_POOL,
        "Connections of this engine's database pool, by state.",
    ),
    (DB_ERRORS, "Database errors this process met, by class."),
    (TASK_CLAIMS, "Claim requests answered, by result."),
    (
        DB_GAUGE_ERRORS,
        "Scrapes whose database gauges could not be read.",
    ),
];

/// Help text of [`MODEL_COST`] (rendered by this module: see
/// [`EngineMetrics::render`]).
const MODEL_COST_HELP: &str = "Cost of model calls by the agents' pricing, USD.";

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

/// One engine's metrics: a Prometheus recorder of its own and the cache of
/// the database gauges. Cheap to share (`Arc` inside).
#[derive(Clone)]
pub struct EngineMetrics {
    inner: Arc<Inner>,
}

struct Inner {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    /// Model cost by `(provider, model)`, USD: the `metrics` crate's
    /// counters are integers, so this counter is kept and rendered here.
    cost: Mutex<BTreeMap<(String, String), f64>>,
    db: db::DbGauges,
}

impl std::fmt::Debug for EngineMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineMetrics").finish_non_exhaustive()
    }
}

impl Default for EngineMetrics {
    fn default() -> Self {
        EngineMetrics::new()
    }
}

impl EngineMetrics {
    /// A fresh set of metrics, every name described, nothing recorded but
    /// the zero series of [`ZERO_SERIES`].
    pub fn new() -> EngineMetrics {
        let recorder = build_recorder();
        for (name, help) in HELP {
            describe(&recorder, name, help);
        }
        let handle = recorder.handle();
        let m = EngineMetrics {
            inner: Arc::new(Inner {
                recorder,
                handle,
                cost: Mutex::new(BTreeMap::new()),
                db: db::DbGauges::default(),
            }),
        };
        for (name, labels) in ZERO_SERIES {
            for values in every_combination(labels) {
                m.counter(name, &values).increment(0);
            }
        }
        m
    }

    /// The counter `name` with `labels`.
    pub(crate) fn counter(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Counter {
        self.inner
            .recorder
            .register_counter(&key(name, labels), &METADATA)
    }

    /// The gauge `name` with `labels`.
    pub(crate) fn gauge(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Gauge {
        self.inner
            .recorder
            .register_gauge(&key(name, labels), &METADATA)
    }

    /// The histogram `name` with `labels`.
    pub(crate) fn histogram(
        &self,
        name: &'static str,
        labels: &[(&'static str, &str)],
    ) -> Histogram {
        self.inner
            .recorder
            .register_histogram(&key(name, labels), &METADATA)
    }

    /// Adds `usd` to the model cost of `(provider, model)`.
    pub(crate) fn add_cost(&self, provider: &str, model: &str, usd: f64) {
        if !(usd.is_finite() && usd > 0.0) {
            return;
        }
        if let Ok(mut cost) = self.inner.cost.lock() {
            *cost
                .entry((provider.to_owned(), model.to_owned()))
                .or_default() += usd;
        }
    }

    /// Records a claim's answer: its result, and each task's dispatch
    /// latency (`waited_ms`, ready to claimed).
    pub fn claimed(&self, tasks: &[crate::store::ClaimedTask]) {
        let result = if tasks.is_empty() { "empty" } else { "claimed" };
        self.counter(TASK_CLAIMS, &[("result", result)])
            .increment(1);
        for task in tasks {
            self.histogram(
                DISPATCH_LATENCY,
                &[("kind", observe::kind_label(&task.kind))],
            )
            .record(task.waited_ms / 1000.0);
        }
    }

    /// Records what a committed decision did ([`observe`]).
    pub fn record(&self, observed: &Observed) {
        observed.record(self);
    }

    /// The text exposition of every metric: the database gauges read
    /// first when older than a second (`store`'s figures; the previous ones
    /// when the read fails, counted in [`DB_GAUGE_ERRORS`]); a worker is
    /// live for `live_window_ms` after its last claim (for
    /// [`TASKS_UNCLAIMABLE`]).
    pub async fn render(&self, store: &crate::store::Store, live_window_ms: i64) -> String {
        self.inner.db.refresh(self, store, live_window_ms).await;
        let mut text = self.inner.handle.render();
        if let Ok(cost) = self.inner.cost.lock() {
            render_float_counter(&mut text, MODEL_COST, MODEL_COST_HELP, &cost);
        }
        text
    }

    /// Drains recorded histogram samples into their buckets; the engine
    /// runs it every few seconds so an endpoint never scraped stays small.
    pub fn upkeep(&self) {
        self.inner.handle.run_upkeep();
    }
}

/// Every label set of `labels` (each name with each of its values).
fn every_combination(labels: &[LabelValues]) -> Vec<Vec<(&'static str, &'static str)>> {
    labels
        .iter()
        .fold(vec![Vec::new()], |sets, (name, values)| {
            sets.iter()
                .flat_map(|set| {
                    values.iter().map(move |value| {
                        let mut next = set.clone();
                        next.push((*name, *value));
                        next
                    })
                })
                .collect()
        })
}

/// A recorder whose `_seconds` histograms have [`SECONDS_BUCKETS`].
fn build_recorder() -> PrometheusRecorder {
    match PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
    {
        Ok(b) => b.build_recorder(),
        // Only refused for an empty bucket list, which this is not.
        Err(_) => PrometheusBuilder::new().build_recorder(),
    }
}

fn describe(recorder: &PrometheusRecorder, name: &'static str, help: &'static str) {
    if name.ends_with("_total") {
        recorder.describe_counter(name.into(), None, help.into());
    } else if name.ends_with("_seconds") {
        recorder.describe_histogram(name.into(), None, help.into());
    } else {
        recorder.describe_gauge(name.into(), None, help.into());
    }
}

fn key(name: &'static str, labels: &[(&'static str, &str)]) -> Key {
    let labels: Vec<Label> = labels
        .iter()
        .map(|(k, v)| Label::new(*k, (*v).to_owned()))
        .collect();
    Key::from_parts(name, labels)
}

/// Appends a counter with float values to `text` in the text exposition
/// format (HELP, TYPE, one sample per label pair; label values escaped as
/// the format asks: `\\`, `\"`, `\n`).
fn render_float_counter(
    text: &mut String,
    name: &str,
    help: &str,
    values: &BTreeMap<(String, String), f64>,
) {
    use std::fmt::Write as _;
    let _ = writeln!(text, "# HELP {name} {help}");
    let _ = writeln!(text, "# TYPE {name} counter");
    for ((provider, model), usd) in values {
        let _ = writeln!(
            text,
            "{name}{{provider=\"{}\",model=\"{}\"}} {usd}",
            escape_label(provider),
            escape_label(model)
        );
    }
    text.push('\n');
}

/// A label value escaped for the text exposition format.
fn escape_label(v: &str) -> String {
    v.replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_gauges_and_cost_render_with_their_labels() {
        let m = EngineMetrics::new();
        m.counter(RUNS_STARTED, &[("tenant", "acme"), ("workflow", "onboard")])
            .increment(2);
        m.gauge(TASKS_READY, &[("kind", "tool_call"), ("pool", "gpu")])
            .set(3.0);
        m.add_cost("openai", "gpt \"4\"", 0.25);
        m.add_cost("openai", "gpt \"4\"", 0.5);
        m.add_cost("openai", "free", 0.0);
        let mut text = m.inner.handle.render();
        render_float_counter(
            &mut text,
            MODEL_COST,
            MODEL_COST_HELP,
            &m.inner.cost.lock().map(|c| c.clone()).unwrap_or_default(),
        );
        assert!(
            text.contains("# TYPE belay_runs_started_total counter"),
            "{text}"
        );
        assert!(
            text.contains(r#"belay_runs_started_total{tenant="acme",workflow="onboard"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"belay_tasks_ready{kind="tool_call",pool="gpu"} 3"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"belay_model_cost_usd_total{provider="openai",model="gpt \"4\""} 0.75"#
            ),
            "{text}"
        );
        assert!(!text.contains("free"), "a zero cost adds no series: {text}");
    }

    #[test]
    fn two_engines_keep_their_figures_apart() {
        let (a, b) = (EngineMetrics::new(), EngineMetrics::new());
        a.counter(STEPS, &[("kind", "model_call"), ("outcome", "succeeded")])
            .increment(1);
        let series = r#"belay_steps_total{kind="model_call",outcome="succeeded"}"#;
        assert!(a.inner.handle.render().contains(&format!("{series} 1")));
        assert!(b.inner.handle.render().contains(&format!("{series} 0")));
    }

    #[test]
    fn counters_of_fixed_labels_are_shown_at_zero_from_the_start() {
        let text = EngineMetrics::new().inner.handle.render();
        for series in [
            r#"belay_steps_total{kind="tool_call",outcome="lease_expired"} 0"#,
            r#"belay_steps_total{kind="model_call",outcome="uncertain"} 0"#,
            r#"belay_leases_expired_total{kind="tool_call"} 0"#,
            r#"belay_task_claims_total{result="empty"} 0"#,
        ] {
            assert!(text.contains(series), "{series} in\n{text}");
        }
        assert_eq!(
            text.matches("belay_steps_total{").count(),
            KINDS.len() * STEP_OUTCOMES.len(),
            "{text}"
        );
        assert!(!text.contains("belay_runs_started_total{"), "{text}");
    }
}
