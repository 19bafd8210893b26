//! The worker's spans of a run's trace: one per model call and one per tool
//! call, each a child of the span of its node (the parent the engine put in
//! the task spec, [`belay_proto::trace::CallTrace`]), with the attributes
//! of the OpenTelemetry GenAI semantic conventions (semconv 1.37 and
//! later: `gen_ai.operation.name` `chat` / `execute_tool`,
//! `gen_ai.provider.name`, `gen_ai.request.model`,
//! `gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`,
//! `gen_ai.tool.name`, `gen_ai.tool.call.id`) beside Belay's own
//! (`belay.run_id`, `belay.tenant`, `belay.call_id`, `belay.attempt`,
//! `belay.repeat_safety`). Outbound HTTP tool requests and MCP calls carry
//! the tool-call span on as `traceparent` ([`outbound`]). Exporter and log
//! format: [`belay_proto::telemetry`].

use belay_proto::telemetry;
use belay_proto::trace::{CallTrace, TraceContext};
use belay_proto::v1::Task;
use belay_proto::wire::{ModelCallResult, ModelCallSpec, ToolBinding, ToolCallSpec};

use crate::config::ModelProvider;

/// `gen_ai.provider.name` of a model provider (the semconv's well-known
/// values).
pub fn provider_name(provider: ModelProvider) -> &'static str {
    match provider {
        ModelProvider::OpenAi => "openai",
        ModelProvider::Anthropic => "anthropic",
    }
}

/// The call id of `task`: its spec's trace names it; otherwise its
/// idempotency key without the `<run id>/` prefix.
fn call_id<'a>(task: &'a Task, trace: Option<&'a CallTrace>) -> &'a str {
    match trace {
        Some(t) => &t.call_id,
        None => task
            .idempotency_key
            .strip_prefix(task.run_id.as_str())
            .and_then(|k| k.strip_prefix('/'))
            .unwrap_or(&task.idempotency_key),
    }
}

/// The span of one model call (`chat <model>`, kind client); record the
/// answer's usage with [`record_usage`].
pub fn model_call_span(
    task: &Task,
    spec: &ModelCallSpec,
    provider: ModelProvider,
) -> tracing::Span {
    let span = tracing::info_span!(
        "model call",
        otel.name = format!("chat {}", spec.model),
        otel.kind = "client",
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = provider_name(provider),
        gen_ai.request.model = %spec.model,
        gen_ai.request.max_tokens = spec.max_output_tokens.map(i64::from),
        gen_ai.usage.input_tokens = tracing::field::Empty,
        gen_ai.usage.output_tokens = tracing::field::Empty,
        gen_ai.response.finish_reasons = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
        belay.run_id = %task.run_id,
        belay.tenant = %task.tenant,
        belay.call_id = call_id(task, spec.trace.as_ref()),
        belay.attempt = i64::from(task.attempt),
    );
    if let Some(trace) = &spec.trace {
        telemetry::set_parent(&span, &trace.context);
    }
    span
}

/// Put a model answer's token usage and finish reason on its span.
pub fn record_usage(span: &tracing::Span, result: &ModelCallResult) {
    // As i64: tracing-opentelemetry exports a u64 as text.
    span.record(
        "gen_ai.usage.input_tokens",
        clamp(result.usage.input_tokens),
    );
    span.record(
        "gen_ai.usage.output_tokens",
        clamp(result.usage.output_tokens),
    );
    if let Some(reason) = &result.finish_reason {
        span.record("gen_ai.response.finish_reasons", reason.as_str());
    }
}

/// `n` as an OpenTelemetry integer (i64), saturating.
fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Mark `span` failed (`otel.status_code` `ERROR`); the error itself is in
/// the call's log line.
pub fn record_failure(span: &tracing::Span) {
    span.record("otel.status_code", "ERROR");
}

/// The binding kind of a tool (`http`, `mcp`, …), for `belay.tool.binding`.
fn binding_kind(binding: &ToolBinding) -> &'static str {
    match binding {
        ToolBinding::Http(_) => "http",
        ToolBinding::AsyncWebhook(_) => "async_webhook",
        ToolBinding::Mcp(_) => "mcp",
        ToolBinding::McpResource(_) => "mcp_resource",
        ToolBinding::Sandbox(_) => "sandbox",
    }
}

/// The span of one tool call (`execute_tool <tool>`, kind client).
pub fn tool_call_span(task: &Task, spec: &ToolCallSpec) -> tracing::Span {
    let call = call_id(task, spec.trace.as_ref());
    // The spec says it; a spec of an older engine only in a traced run.
    let repeat_safety = match (spec.repeat_safety.as_str(), spec.trace.as_ref()) {
        ("", Some(t)) => t.repeat_safety.as_str(),
        (own, _) => own,
    };
    let span = tracing::info_span!(
        "tool call",
        otel.name = format!("execute_tool {}", spec.tool),
        otel.kind = "client",
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %spec.tool,
        gen_ai.tool.call.id = call,
        otel.status_code = tracing::field::Empty,
        belay.run_id = %task.run_id,
        belay.tenant = %task.tenant,
        belay.call_id = call,
        belay.attempt = i64::from(task.attempt),
        belay.tool.version = i64::from(spec.tool_version),
        belay.tool.binding = binding_kind(&spec.binding),
        belay.repeat_safety = repeat_safety,
    );
    if let Some(trace) = &spec.trace {
        telemetry::set_parent(&span, &trace.context);
    }
    span
}

/// The trace context an outbound request of the call in `span` carries:
/// `span` as the parent while spans are exported, else the spec's (the
/// node's span), so the tool's server joins the run's trace either way.
/// `None` for a call of an untraced run.
pub fn outbound(span: &tracing::Span, trace: Option<&CallTrace>) -> Option<TraceContext> {
    let trace = trace?;
    telemetry::traceparent_of(span, Some(&trace.context))
}
