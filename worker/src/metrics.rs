//! The worker's Prometheus metrics, served at `GET /metrics` of its health
//! listener (`--health-listen`, [`crate::health`]), text exposition format
//! 0.0.4. Every name and label is defined here, once.
//!
//! A recorder of this worker's own (the `metrics` crate's [`Recorder`] API
//! on `metrics-exporter-prometheus`), not the process-global one, so two
//! workers in one process keep their figures apart. The claim loop
//! ([`crate::runner`]) records.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use metrics::{Key, Label, Metadata, Recorder};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};

/// `belay_worker_slots{state}` gauge: task slots (`--concurrency`), `busy`
/// (a task running) or `free`.
pub const SLOTS: &str = "belay_worker_slots";
/// `belay_worker_tasks_total{kind,outcome}`: tasks this worker performed,
/// by kind (`model_call`, `tool_call`, `other`) and how its report went:
/// `succeeded`, `not_sent`, `may_have_acted`, `rejected` (the failure
/// class reported), `report_refused` (the engine took no report: the lease
/// was lost, the attempt stale).
pub const TASKS: &str = "belay_worker_tasks_total";
/// `belay_worker_task_duration_seconds{kind}` histogram: from a task
/// claimed to its report answered.
pub const TASK_DURATION: &str = "belay_worker_task_duration_seconds";
/// `belay_worker_claims_total{result}`: claim requests: `claimed` (at
/// least one task), `empty`, `error` (the engine could not be reached or
/// failed), `refused` (the credential was refused).
pub const CLAIMS: &str = "belay_worker_claims_total";

/// Histogram buckets of [`TASK_DURATION`], seconds.
pub const SECONDS_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

const HELP: &[(&str, &str)] = &[
    (SLOTS, "Task slots of this worker, by state (busy, free)."),
    (TASKS, "Tasks performed, by kind and report outcome."),
    (
        TASK_DURATION,
        "Seconds from a task claimed to its report answered.",
    ),
    (CLAIMS, "Claim requests, by result."),
];

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

/// One worker's metrics. Cheap to clone (shared).
#[derive(Clone)]
pub struct WorkerMetrics {
    inner: Arc<Inner>,
}

struct Inner {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    capacity: AtomicU64,
    busy: AtomicU64,
}

impl std::fmt::Debug for WorkerMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerMetrics").finish_non_exhaustive()
    }
}

impl Default for WorkerMetrics {
    fn default() -> Self {
        let recorder = match PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
        {
            Ok(b) => b.build_recorder(),
            // Only refused for an empty bucket list, which this is not.
            Err(_) => PrometheusBuilder::new().build_recorder(),
        };
        for (name, help) in HELP {
            if name.ends_with("_total") {
                recorder.describe_counter((*name).into(), None, (*help).into());
            } else if name.ends_with("_seconds") {
                recorder.describe_histogram((*name).into(), None, (*help).into());
            } else {
                recorder.describe_gauge((*name).into(), None, (*help).into());
            }
        }
        let handle = recorder.handle();
        WorkerMetrics {
            inner: Arc::new(Inner {
                recorder,
                handle,
                capacity: AtomicU64::new(0),
                busy: AtomicU64::new(0),
            }),
        }
    }
}

/// The `kind` label of a task kind.
fn kind_label(kind: &str) -> &'static str {
    match kind {
        "model_call" => "model_call",
        "tool_call" => "tool_call",
        _ => "other",
    }
}

fn key(name: &'static str, labels: &[(&'static str, &'static str)]) -> Key {
    let labels: Vec<Label> = labels.iter().map(|(k, v)| Label::new(*k, *v)).collect();
    Key::from_parts(name, labels)
}

impl WorkerMetrics {
    fn counter(&self, name: &'static str, labels: &[(&'static str, &'static str)], n: u64) {
        self.inner
            .recorder
            .register_counter(&key(name, labels), &METADATA)
            .increment(n);
    }

    /// The worker has `n` task slots (its concurrency).
    pub(crate) fn set_capacity(&self, n: usize) {
        self.inner
            .capacity
            .store(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
        self.publish_slots();
    }

    /// A task started (`true`) or ended (`false`) in a slot.
    pub(crate) fn slot(&self, busy: bool) {
        if busy {
            self.inner.busy.fetch_add(1, Ordering::Relaxed);
        } else {
            let _ = self
                .inner
                .busy
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(1));
        }
        self.publish_slots();
    }

    fn publish_slots(&self) {
        let capacity = self.inner.capacity.load(Ordering::Relaxed);
        let busy = self.inner.busy.load(Ordering::Relaxed).min(capacity);
        let gauge = |state| {
            self.inner
                .recorder
                .register_gauge(&key(SLOTS, &[("state", state)]), &METADATA)
        };
        gauge("busy").set(busy as f64);
        gauge("free").set((capacity - busy) as f64);
    }

    /// A claim request ended with `result` (see [`CLAIMS`]).
    pub(crate) fn claim(&self, result: &'static str) {
        self.counter(CLAIMS, &[("result", result)], 1);
    }

    /// A task of `kind` was reported with `outcome` (see [`TASKS`]).
    pub(crate) fn task(&self, kind: &str, outcome: &'static str) {
        self.counter(
            TASKS,
            &[("kind", kind_label(kind)), ("outcome", outcome)],
            1,
        );
    }

    /// A task of `kind` took `elapsed`, claimed to reported.
    pub(crate) fn task_duration(&self, kind: &str, elapsed: Duration) {
        self.inner
            .recorder
            .register_histogram(
                &key(TASK_DURATION, &[("kind", kind_label(kind))]),
                &METADATA,
            )
            .record(elapsed.as_secs_f64());
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        self.inner.handle.render()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_tasks_and_claims_render_with_their_labels() {
        let m = WorkerMetrics::default();
        m.set_capacity(4);
        m.slot(true);
        m.slot(true);
        m.slot(false);
        m.task("tool_call", "succeeded");
        m.task("weird", "not_sent");
        m.claim("empty");
        m.task_duration("model_call", Duration::from_millis(30));
        let text = m.render();
        for want in [
            r#"belay_worker_slots{state="busy"} 1"#,
            r#"belay_worker_slots{state="free"} 3"#,
            r#"belay_worker_tasks_total{kind="tool_call",outcome="succeeded"} 1"#,
            r#"belay_worker_tasks_total{kind="other",outcome="not_sent"} 1"#,
            r#"belay_worker_claims_total{result="empty"} 1"#,
            r#"belay_worker_task_duration_seconds_bucket{kind="model_call",le="0.05"} 1"#,
            "# TYPE belay_worker_task_duration_seconds histogram",
        ] {
            assert!(text.contains(want), "{want} missing from:\n{text}");
        }
    }
}
