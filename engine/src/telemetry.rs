//! The engine's side of a run's trace: the `StartRun` span, whose context
//! (child of the caller's W3C `traceparent` from the gRPC metadata, or the
//! root of a new trace) becomes the run's persisted trace context
//! ([`start_run_span`]), and one span per node visit, recorded when a
//! committed transition ends the visit ([`record_node_spans`]), with the
//! span id every process derives from the run's trace
//! ([`belay_proto::trace::TraceContext::node_span_id`]) so the workers'
//! model and tool call spans are its children. Processes, exporter and
//! log format: [`belay_proto::telemetry`].

use std::sync::OnceLock;
use std::time::SystemTime;

use belay_proto::telemetry::{self, SpanRecord};
use belay_proto::trace::TraceContext;
use belay_store::{Applied, EndedNode, Store};
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

/// Node spans waiting for their start time; more are dropped (and
/// counted in a warning) rather than slowing transitions down.
const QUEUE: usize = 4096;

/// The span of one `StartRun` request, and the trace context the run is
/// started in: the caller's `traceparent`/`tracestate` gRPC metadata is the
/// span's parent (ignored when malformed, as the W3C rules ask, with a
/// debug log). With spans exported the run's context names this span;
/// without, it is the caller's context as received (`None` without one).
pub fn start_run_span(
    traceparent: Option<&str>,
    tracestate: Option<&str>,
    tenant: &str,
    workflow: &str,
) -> (tracing::Span, Option<TraceContext>) {
    let incoming =
        traceparent.and_then(|parent| incoming_trace(parent, tracestate.unwrap_or_default()));
    let span = tracing::info_span!(
        "StartRun",
        otel.name = "belay.v1.RunService/StartRun",
        otel.kind = "server",
        rpc.system = "grpc",
        rpc.service = "belay.v1.RunService",
        rpc.method = "StartRun",
        belay.tenant = tenant,
        belay.workflow = workflow,
    );
    if let Some(parent) = &incoming {
        telemetry::set_parent(&span, parent);
    }
    let trace = telemetry::traceparent_of(&span, incoming.as_ref());
    (span, trace)
}

/// The W3C trace context of a request's `traceparent` and `tracestate`
/// values, if well-formed.
pub fn incoming_trace(parent: &str, state: &str) -> Option<TraceContext> {
    match TraceContext::parse(parent, state) {
        Ok(trace) => Some(trace),
        Err(e) => {
            tracing::debug!(error = %e, "traceparent ignored");
            None
        }
    }
}

/// What the node span writer is handed.
#[derive(Debug)]
enum Item {
    /// A node visit to make a span of.
    Ended(Box<Ended>),
    /// Answer once every item queued before is recorded.
    Flush(oneshot::Sender<()>),
}

/// The writer's queue, once [`record_node_spans`] started it.
static QUEUED: OnceLock<mpsc::Sender<Item>> = OnceLock::new();

/// Wait until the node spans of every transition committed so far are
/// handed to the exporter (the engine's shutdown, before the store
/// closes). Nothing when spans are not exported.
pub async fn flush_node_spans() {
    let Some(tx) = QUEUED.get() else {
        return;
    };
    let (done, flushed) = oneshot::channel();
    if tx.send(Item::Flush(done)).await.is_ok() {
        let _ = flushed.await;
    }
}

/// One ended node visit of a traced run, waiting for its start time.
#[derive(Debug)]
struct Ended {
    run_id: Uuid,
    tenant: String,
    trace: TraceContext,
    node: EndedNode,
    end: SystemTime,
    run_status: &'static str,
}

/// `store`, recording a node span for every node visit a committed
/// transition ends, when spans are exported (otherwise `store` as it is).
/// The spans are made by a task of their own (it reads the visit's
/// `NodeStarted` or `NodePassed` time), so a transition only queues them. Call inside a
/// Tokio runtime, before the store is handed to the coordinator.
pub fn record_node_spans(store: Store) -> Store {
    if !telemetry::exporting() {
        return store;
    }
    let tx = QUEUED.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Item>(QUEUE);
        tokio::spawn(node_span_writer(store.clone(), rx));
        tx
    });
    let tx = tx.clone();
    store.on_commit(move |applied: &Applied| queue_ended(&tx, applied))
}

/// Queue the node visits `applied` ended.
fn queue_ended(tx: &mpsc::Sender<Item>, applied: &Applied) {
    let Some(trace) = &applied.trace else {
        return;
    };
    for node in &applied.ended_nodes {
        let ended = Item::Ended(Box::new(Ended {
            run_id: applied.run_id,
            tenant: applied.tenant.clone(),
            trace: trace.clone(),
            node: node.clone(),
            end: applied.now.into(),
            run_status: applied.status,
        }));
        if tx.try_send(ended).is_err() {
            tracing::warn!(run_id = %applied.run_id, node = %node.node, "node span dropped: too many queued");
        }
    }
}

/// Make the span of each queued node visit, its start read from the store.
async fn node_span_writer(store: Store, mut rx: mpsc::Receiver<Item>) {
    while let Some(item) = rx.recv().await {
        let ended = match item {
            Item::Ended(ended) => *ended,
            Item::Flush(done) => {
                let _ = done.send(());
                continue;
            }
        };
        let after = ended.node.started_seq.saturating_sub(1) as i64;
        let start = match store.list_events(ended.run_id, after, 1).await {
            Ok(rows) => rows
                .first()
                .map(|row| SystemTime::from(row.recorded_at))
                .unwrap_or(ended.end),
            Err(e) => {
                tracing::warn!(run_id = %ended.run_id, error = %e, "node span: start time not read");
                ended.end
            }
        };
        telemetry::record_span(node_span(ended, start));
    }
}

/// The span of one ended node visit.
fn node_span(ended: Ended, start: SystemTime) -> SpanRecord {
    let run_id = ended.run_id.to_string();
    let span_id = ended.trace.node_span_id(&run_id, &ended.node.visit);
    let error = (!ended.node.completed)
        .then(|| format!("run {} before the node completed", ended.run_status));
    SpanRecord {
        name: format!("node {}", ended.node.node),
        parent: ended.trace,
        span_id,
        start,
        end: ended.end.max(start),
        attributes: vec![
            ("belay.run_id", run_id),
            ("belay.tenant", ended.tenant),
            ("belay.node", ended.node.node),
            ("belay.node.visit", ended.node.visit),
            ("belay.run.status", ended.run_status.to_owned()),
        ],
        error,
    }
}
