//! How the engine and worker processes log and trace (feature `telemetry`):
//! the `tracing` subscriber (text or JSON lines on stderr, `RUST_LOG`
//! filter) and, when an OTLP endpoint is configured, an OpenTelemetry
//! layer exporting spans over OTLP/gRPC (tonic) in batches. Also the few
//! helpers that tie a span to a run's [`TraceContext`]: the parent of a
//! `tracing` span ([`set_parent`]), the `traceparent` a span hands on
//! ([`traceparent_of`]), and spans with given ids and times
//! ([`record_span`], the engine's node spans). The only file of Belay that
//! names the `opentelemetry*` crates.

use std::cell::Cell;
use std::sync::OnceLock;
use std::time::SystemTime;

use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
    Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator, SdkTracerProvider};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::trace::TraceContext;

/// Name of the instrumentation scope of every Belay span.
pub const SCOPE: &str = "belay";

/// The format of log lines on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines (colours on a terminal). The default.
    #[default]
    Text,
    /// One JSON object a line (tracing-subscriber's JSON format):
    /// `timestamp` (RFC 3339), `level`, `target`, `fields` (with
    /// `message`), and `span`/`spans` (the open spans and their fields).
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = TelemetryError;

    /// `text` or `json` (any case).
    fn from_str(s: &str) -> Result<LogFormat, TelemetryError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "text" | "" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(TelemetryError::LogFormat(other.to_owned())),
        }
    }
}

/// What a process logs and traces.
#[derive(Debug, Clone)]
pub struct TelemetryOptions {
    /// The service name when `OTEL_SERVICE_NAME` is unset or empty
    /// (`belay-engine`, `belay-worker`).
    pub default_service_name: &'static str,
    /// Log line format.
    pub log_format: LogFormat,
    /// The `RUST_LOG` filter used when `RUST_LOG` is unset or invalid.
    pub default_filter: String,
    /// OTLP/gRPC endpoint (`http://host:4317`); `None` or empty: no traces
    /// are exported (the default).
    pub otlp_endpoint: Option<String>,
}

/// Why logging or tracing could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// `--log-format` / `BELAY_LOG_FORMAT` is neither `text` nor `json`.
    #[error("log format {0:?} is neither `text` nor `json`")]
    LogFormat(String),
    /// The OTLP exporter refused its configuration (a malformed endpoint).
    #[error("OTLP exporter to {endpoint:?}: {message}")]
    Exporter {
        /// The configured endpoint.
        endpoint: String,
        /// What the exporter said.
        message: String,
    },
    /// A global subscriber was already set in this process.
    #[error("a tracing subscriber is already installed: {0}")]
    AlreadySet(String),
}

/// The process's telemetry; keep it until exit and call
/// [`Telemetry::shutdown`] so the last spans are sent.
#[derive(Debug)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

impl Telemetry {
    /// Install the global subscriber: `options.log_format` lines on stderr
    /// and, with an endpoint, spans exported over OTLP/gRPC with the
    /// resource `service.name` of `OTEL_SERVICE_NAME` or
    /// `options.default_service_name`. Must run inside a Tokio runtime
    /// when an endpoint is set (the gRPC channel lives on it).
    pub fn init(options: TelemetryOptions) -> Result<Telemetry, TelemetryError> {
        let filter = EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| EnvFilter::new(&options.default_filter));
        let provider = match options.otlp_endpoint.as_deref().map(str::trim) {
            Some(endpoint) if !endpoint.is_empty() => Some(provider(
                endpoint,
                &service_name(options.default_service_name),
            )?),
            _ => None,
        };
        let otel = provider.as_ref().map(|p| {
            tracing_opentelemetry::layer()
                .with_tracer(p.tracer(SCOPE))
                .with_tracked_inactivity(false)
                .with_threads(false)
        });
        let registry = tracing_subscriber::registry().with(filter).with(otel);
        let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
        let installed = match options.log_format {
            LogFormat::Text => registry
                .with(
                    tracing_subscriber::fmt::layer()
                        .with_writer(std::io::stderr)
                        .with_ansi(ansi),
                )
                .try_init(),
            LogFormat::Json => registry
                .with(
                    tracing_subscriber::fmt::layer()
                        .json()
                        .with_current_span(true)
                        .with_span_list(false)
                        .with_writer(std::io::stderr),
                )
                .try_init(),
        };
        installed.map_err(|e| TelemetryError::AlreadySet(e.to_string()))?;
        if let Some(p) = &provider {
            let _ = PROVIDER.set(p.clone());
        }
        Ok(Telemetry { provider })
    }

    /// Whether spans are exported.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Send the spans still queued and stop the exporter; waits for the
    /// export to finish (on a blocking thread: the SDK's shutdown blocks).
    pub async fn shutdown(self) {
        let Some(provider) = self.provider else {
            return;
        };
        let done = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "flushing spans at shutdown failed"),
            Err(e) => tracing::warn!(error = %e, "flushing spans at shutdown panicked"),
        }
    }
}

/// Whether this process exports spans (an endpoint was configured).
pub fn exporting() -> bool {
    PROVIDER.get().is_some()
}

/// `OTEL_SERVICE_NAME`, or `default` when it is unset or empty.
fn service_name(default: &str) -> String {
    std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| default.to_owned())
}

/// A tracer provider batching spans to `endpoint` over OTLP/gRPC.
fn provider(endpoint: &str, service: &str) -> Result<SdkTracerProvider, TelemetryError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|e| TelemetryError::Exporter {
            endpoint: endpoint.to_owned(),
            message: e.to_string(),
        })?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(service.to_owned())
        .build();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .with_id_generator(ChosenIds::default())
        .build())
}

thread_local! {
    /// The span id the next span started on this thread takes
    /// ([`record_span`]); `None`: a random one.
    static NEXT_SPAN_ID: Cell<Option<SpanId>> = const { Cell::new(None) };
}

/// Random ids, except a span id [`record_span`] asks for: the SDK's
/// tracer takes span ids only from its id generator.
#[derive(Debug, Default)]
struct ChosenIds(RandomIdGenerator);

impl IdGenerator for ChosenIds {
    fn new_trace_id(&self) -> TraceId {
        self.0.new_trace_id()
    }

    fn new_span_id(&self) -> SpanId {
        NEXT_SPAN_ID
            .with(Cell::take)
            .unwrap_or_else(|| self.0.new_span_id())
    }
}

/// The OpenTelemetry context whose remote parent is `trace`'s parent span.
/// `None` when the ids do not parse (a stored context is always valid).
pub fn remote_context(trace: &TraceContext) -> Option<Context> {
    let trace_id = TraceId::from_hex(trace.trace_id()).ok()?;
    let span_id = SpanId::from_hex(trace.parent_id()).ok()?;
    let state = trace.tracestate.parse::<TraceState>().unwrap_or_default();
    let context = SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::new(trace.flags()),
        true,
        state,
    );
    context
        .is_valid()
        .then(|| Context::new().with_remote_span_context(context))
}

/// Make `trace`'s parent span the parent of `span` (a `tracing` span not
/// yet entered). Nothing when no spans are exported.
pub fn set_parent(span: &tracing::Span, trace: &TraceContext) {
    if !exporting() {
        return;
    }
    if let Some(cx) = remote_context(trace)
        && let Err(e) = span.set_parent(cx)
    {
        tracing::debug!(error = %e, "span parent not set");
    }
}

/// The trace context a request made inside `span` carries: `span` as the
/// parent when it is exported, else `fallback` (the context the task came
/// with), so downstream services still join the run's trace.
pub fn traceparent_of(
    span: &tracing::Span,
    fallback: Option<&TraceContext>,
) -> Option<TraceContext> {
    if exporting() {
        let cx = span.context();
        let sc = cx.span().span_context().clone();
        if sc.is_valid() {
            return Some(TraceContext {
                traceparent: format!(
                    "00-{}-{}-{:02x}",
                    sc.trace_id(),
                    sc.span_id(),
                    sc.trace_flags().to_u8()
                ),
                tracestate: sc.trace_state().header(),
            });
        }
    }
    fallback.cloned()
}

/// A span recorded after the fact, with its own id and times (the engine's
/// node spans, whose id every process derives from the run's trace).
#[derive(Debug, Clone)]
pub struct SpanRecord {
    /// Span name.
    pub name: String,
    /// The trace and parent span.
    pub parent: TraceContext,
    /// Its span id, 16 hex digits.
    pub span_id: String,
    /// When it began.
    pub start: SystemTime,
    /// When it ended.
    pub end: SystemTime,
    /// Attributes: string values.
    pub attributes: Vec<(&'static str, String)>,
    /// `Some(description)`: the span's status is an error.
    pub error: Option<String>,
}

/// Export `record` as one span; nothing when no spans are exported or its
/// ids do not parse.
pub fn record_span(record: SpanRecord) {
    let Some(provider) = PROVIDER.get() else {
        return;
    };
    let (Some(parent), Ok(span_id)) = (
        remote_context(&record.parent),
        SpanId::from_hex(&record.span_id),
    ) else {
        return;
    };
    let tracer = provider.tracer(SCOPE);
    let builder = tracer
        .span_builder(record.name)
        .with_start_time(record.start)
        .with_attributes(
            record
                .attributes
                .into_iter()
                .map(|(k, v)| KeyValue::new(k, v)),
        );
    // The id generator hands this id to the span built next on this thread.
    NEXT_SPAN_ID.with(|next| next.set(Some(span_id)));
    let mut span = tracer.build_with_context(builder, &parent);
    NEXT_SPAN_ID.with(|next| next.set(None));
    if let Some(description) = record.error {
        span.set_status(Status::error(description));
    }
    span.end_with_timestamp(record.end);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_formats_parse_and_a_wrong_one_is_named() {
        assert_eq!("json".parse::<LogFormat>().ok(), Some(LogFormat::Json));
        assert_eq!("Text".parse::<LogFormat>().ok(), Some(LogFormat::Text));
        let err = "yaml".parse::<LogFormat>().expect_err("not a format");
        assert!(err.to_string().contains("\"yaml\""), "{err}");
    }

    #[test]
    fn a_stored_context_becomes_a_remote_parent() {
        let trace = TraceContext::parse(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "rojo=1",
        )
        .expect("valid");
        let cx = remote_context(&trace).expect("valid ids");
        let sc = cx.span().span_context().clone();
        assert!(sc.is_remote() && sc.is_sampled());
        assert_eq!(sc.trace_id().to_string(), trace.trace_id());
        assert_eq!(sc.span_id().to_string(), trace.parent_id());
        assert_eq!(sc.trace_state().header(), "rojo=1");
    }
}
