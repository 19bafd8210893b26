//! OpenTelemetry traces and JSON logs end to end: a real engine and worker
//! export over OTLP/gRPC to a small Python receiver (`tests/otlp/receiver.py`,
//! grpcio + opentelemetry-proto installed by `.ci/otlp-receiver.sh`), which
//! writes every span it gets as a JSON line. A run of `onboarding_express`
//! is started with a W3C `traceparent` in `StartRun`'s gRPC metadata; the
//! test checks that every span is in that trace, the tree (`StartRun` →
//! node → model and tool calls), the service names (`OTEL_SERVICE_NAME`
//! honoured), the GenAI attributes of the model spans, and that each CRM
//! request (the HTTP tool calls) carried a `traceparent` of the run's
//! trace whose parent is the tool-call span. Both processes stop with
//! SIGTERM and flush their spans before exiting (nothing is polled for).
//! Both log JSON lines (`--log-format json`, `BELAY_LOG_FORMAT=json`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};
use belay_proto::connect::ConnectOptions;
use belay_proto::v1::StartRunRequest;
use belay_proto::v1::run_service_client::RunServiceClient;
use belay_tests::{ADMIN_TOKEN, EngineOpts, Env, Proc, repo_root};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(90);
/// The caller's trace and span (as an application backend would send them).
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";
const WORKER_SERVICE: &str = "belay-worker-traces-test";

/// The receiver's Python: `BELAY_OTLP_PYTHON` (`.ci/run` sets it), else
/// what `.ci/otlp-receiver.sh` installs and prints.
fn receiver_python() -> Result<String> {
    if let Ok(path) = std::env::var("BELAY_OTLP_PYTHON")
        && !path.is_empty()
    {
        return Ok(path);
    }
    let script = repo_root().join(".ci/otlp-receiver.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    ensure!(
        out.status.success(),
        "{} failed ({})",
        script.display(),
        out.status
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("export BELAY_OTLP_PYTHON="))
        .map(str::to_owned)
        .ok_or_else(|| anyhow!("{} printed no BELAY_OTLP_PYTHON", script.display()))
}

/// Start the receiver writing to a new file; returns it and the file.
async fn start_receiver() -> Result<(Proc, PathBuf)> {
    let out = std::env::temp_dir()
        .join("belay-test-logs")
        .join(format!("spans-{}.jsonl", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(out.parent().unwrap_or(&out))?;
    let python = PathBuf::from(receiver_python()?);
    let script = repo_root().join("tests/otlp/receiver.py");
    let receiver = Proc::spawn(
        "otlp",
        &python,
        &[script.display().to_string(), out.display().to_string()],
        &[],
        true,
    )
    .await?;
    Ok((receiver, out))
}

/// `StartRun` of `onboarding_express` with the caller's trace in the gRPC
/// metadata; returns the run id.
async fn start_traced_run(engine_url: &str) -> Result<String> {
    let channel = ConnectOptions::new(engine_url)
        .with_api_key(ADMIN_TOKEN)
        .connect_lazy()?;
    let mut client = RunServiceClient::new(channel);
    let mut request = tonic::Request::new(StartRunRequest {
        tenant: "acme".into(),
        workflow: "onboarding_express".into(),
        input_json: json!({"email": "traced@example.com", "name": "Ada Lovelace", "plan": "pro"})
            .to_string(),
        idempotency_key: "traced-1".into(),
        caller: "test".into(),
        caller_grants: vec!["crm.read".into(), "crm.write".into(), "email.send".into()],
    });
    let metadata = request.metadata_mut();
    metadata.insert(
        "traceparent",
        format!("00-{TRACE_ID}-{CALLER_SPAN}-01").parse()?,
    );
    metadata.insert("tracestate", "belay-test=1".parse()?);
    let response = client.start_run(request).await?.into_inner();
    response
        .run
        .map(|r| r.run_id)
        .ok_or_else(|| anyhow!("StartRun answered no run"))
}

/// Stop a process with SIGTERM and wait for it to exit (it flushes its
/// spans first).
async fn stop(proc: &mut Proc) -> Result<()> {
    proc.signal(nix::sys::signal::Signal::SIGTERM)?;
    let status = tokio::time::timeout(T, proc.wait())
        .await
        .with_context(|| format!("{} did not stop within {T:?}", proc.name))??;
    ensure!(status.success(), "{} exited with {status}", proc.name);
    Ok(())
}

/// The spans in the receiver's file.
fn spans(out: &PathBuf) -> Result<Vec<Value>> {
    let text =
        std::fs::read_to_string(out).with_context(|| format!("reading {}", out.display()))?;
    text.lines()
        .map(|l| serde_json::from_str(l).with_context(|| format!("span line {l:?}")))
        .collect()
}

fn named<'a>(spans: &'a [Value], prefix: &str) -> Vec<&'a Value> {
    spans
        .iter()
        .filter(|s| s["name"].as_str().is_some_and(|n| n.starts_with(prefix)))
        .collect()
}

/// Every line of a process's log is a JSON object with the fields of
/// tracing-subscriber's JSON format; returns them.
fn json_log(proc: &Proc) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(&proc.log)?;
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).with_context(|| format!("{}: log line {l:?}", proc.name)))
        .collect::<Result<_>>()?;
    ensure!(!lines.is_empty(), "{} logged nothing", proc.name);
    for line in &lines {
        for field in ["timestamp", "level", "target"] {
            ensure!(
                line[field].is_string(),
                "{}: no {field} in {line}",
                proc.name
            );
        }
        ensure!(
            line["fields"].is_object(),
            "{}: no fields in {line}",
            proc.name
        );
    }
    Ok(lines)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_is_one_trace_from_the_callers_span_to_the_tool_requests() -> Result<()> {
    let (mut receiver, out) = start_receiver().await?;
    let mut env = Env::start(EngineOpts::default()).await?;
    // The traced engine replaces the harness's first one, so every
    // transition of the run is its own.
    let engine = env
        .start_engine_with(
            &[
                "--otlp-endpoint".into(),
                receiver.url.clone(),
                "--log-format".into(),
                "json".into(),
            ],
            0,
        )
        .await?;
    env.kill_engine(0).await?;
    let worker = env
        .start_worker_with_env(
            engine,
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url.clone()),
                ("OTEL_SERVICE_NAME", WORKER_SERVICE.into()),
                ("BELAY_LOG_FORMAT", "json".into()),
            ],
        )
        .await?;
    let run_id = start_traced_run(&env.engines[engine].url).await?;
    env.wait_for(engine, &run_id, "run_completed", T).await?;
    let crm: Vec<Value> = env
        .http
        .get(format!("{}/_requests", env.crm.url))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    stop(&mut env.workers[worker]).await?;
    stop(&mut env.engines[engine]).await?;

    let spans = spans(&out)?;
    let ids: BTreeMap<&str, &Value> = spans
        .iter()
        .filter_map(|s| s["span_id"].as_str().map(|id| (id, s)))
        .collect();
    ensure!(!spans.is_empty(), "no spans received");
    for span in &spans {
        ensure!(
            span["trace_id"] == TRACE_ID,
            "a span outside the run's trace: {span}"
        );
    }

    let start = named(&spans, "belay.v1.RunService/StartRun");
    let [start] = start.as_slice() else {
        bail!("{} StartRun spans: {spans:#?}", start.len());
    };
    ensure!(start["parent_span_id"] == CALLER_SPAN, "{start}");
    ensure!(start["service"] == "belay-engine", "{start}");
    ensure!(start["kind"] == 2, "StartRun is a server span: {start}");

    let nodes = named(&spans, "node ");
    let [node] = nodes.as_slice() else {
        bail!("{} node spans: {spans:#?}", nodes.len());
    };
    ensure!(node["name"] == "node intake", "{node}");
    ensure!(
        node["parent_span_id"] == start["span_id"],
        "node under StartRun: {node}"
    );
    ensure!(node["service"] == "belay-engine", "{node}");
    ensure!(
        node["attributes"]["belay.run_id"] == run_id.as_str(),
        "{node}"
    );
    ensure!(node["attributes"]["belay.tenant"] == "acme", "{node}");
    ensure!(node["status"]["code"] != 2, "the node completed: {node}");

    let models = named(&spans, "chat ");
    ensure!(models.len() >= 2, "model spans: {models:#?}");
    for model in &models {
        let a = &model["attributes"];
        ensure!(
            model["parent_span_id"] == node["span_id"],
            "model call under its node: {model}"
        );
        ensure!(model["service"] == WORKER_SERVICE, "{model}");
        ensure!(model["kind"] == 3, "a model call is a client span: {model}");
        ensure!(a["gen_ai.operation.name"] == "chat", "{model}");
        ensure!(a["gen_ai.provider.name"] == "openai", "{model}");
        ensure!(
            a["gen_ai.request.model"] == "scripted-onboarding",
            "{model}"
        );
        ensure!(
            a["gen_ai.usage.input_tokens"].is_i64(),
            "input tokens: {model}"
        );
        ensure!(
            a["gen_ai.usage.output_tokens"].is_i64(),
            "output tokens: {model}"
        );
        ensure!(
            a["belay.run_id"] == run_id.as_str() && a["belay.tenant"] == "acme",
            "{model}"
        );
        ensure!(
            a["belay.call_id"]
                .as_str()
                .is_some_and(|c| c.starts_with("intake.m")),
            "{model}"
        );
        ensure!(a["belay.attempt"] == 1, "{model}");
        ensure!(model["status"]["code"] != 2, "the call succeeded: {model}");
    }

    let tools = named(&spans, "execute_tool ");
    ensure!(tools.len() >= 2, "tool spans: {tools:#?}");
    for tool in &tools {
        let a = &tool["attributes"];
        ensure!(
            tool["parent_span_id"] == node["span_id"],
            "tool call under its node: {tool}"
        );
        ensure!(tool["service"] == WORKER_SERVICE, "{tool}");
        ensure!(a["gen_ai.operation.name"] == "execute_tool", "{tool}");
        ensure!(
            tool["name"].as_str()
                == a["gen_ai.tool.name"]
                    .as_str()
                    .map(|n| format!("execute_tool {n}"))
                    .as_deref(),
            "{tool}"
        );
        ensure!(
            a["belay.call_id"]
                .as_str()
                .is_some_and(|c| c.starts_with("intake.t")),
            "{tool}"
        );
        ensure!(
            a["belay.repeat_safety"].is_string(),
            "repeat safety: {tool}"
        );
        ensure!(
            a["belay.run_id"] == run_id.as_str() && a["belay.attempt"] == 1,
            "{tool}"
        );
    }
    // Nothing else: every span is one of these, and each parent is known
    // (the caller's span aside).
    ensure!(
        spans.len() == 2 + models.len() + tools.len(),
        "unexpected spans: {spans:#?}"
    );

    // Each HTTP tool request carried the trace, with its tool-call span as
    // the parent.
    let mut parents = Vec::new();
    for request in &crm {
        let header = request["traceparent"]
            .as_str()
            .ok_or_else(|| anyhow!("a CRM request without traceparent: {request}"))?;
        let parts: Vec<&str> = header.split('-').collect();
        ensure!(
            parts.len() == 4 && parts[1] == TRACE_ID,
            "traceparent {header}"
        );
        let parent = ids
            .get(parts[2])
            .ok_or_else(|| anyhow!("traceparent {header}: its parent is no span received"))?;
        ensure!(
            parent["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("execute_tool ")),
            "traceparent {header} names {parent}, not a tool call"
        );
        parents.push(parts[2].to_owned());
    }
    ensure!(
        crm.len() == tools.len(),
        "{} CRM requests, {} tool spans",
        crm.len(),
        tools.len()
    );
    parents.sort();
    parents.dedup();
    ensure!(parents.len() == crm.len(), "one tool-call span per request");

    // Both logged JSON lines, and a worker line inside a tool call names
    // its span and the run.
    json_log(&env.engines[engine])?;
    let lines = json_log(&env.workers[worker])?;
    ensure!(
        lines
            .iter()
            .any(|l| l["fields"]["message"] == "tool call dispatched"
                && l["span"]["name"] == "tool call"
                && l["span"]["belay.run_id"] == run_id.as_str()),
        "no `tool call dispatched` line inside its span"
    );

    receiver.kill().await?;
    env.stop().await
}

/// An engine whose OTLP collector cannot be reached says so in its log
/// (the SDK's `BatchSpanProcessor.ExportError`, through `tracing`),
/// instead of losing its spans silently. The collector here is a port
/// nothing listens on; stopping the engine exports what it queued.
#[tokio::test(flavor = "multi_thread")]
async fn a_collector_that_cannot_be_reached_is_logged() -> Result<()> {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?;
    let endpoint = format!("http://{}", closed.local_addr()?);
    drop(closed);
    let mut env = Env::start(EngineOpts::default()).await?;
    let engine = env
        .start_engine_with(
            &[
                "--otlp-endpoint".into(),
                endpoint.clone(),
                "--log-format".into(),
                "json".into(),
            ],
            0,
        )
        .await?;
    env.kill_engine(0).await?;
    start_traced_run(&env.engines[engine].url).await?;
    stop(&mut env.engines[engine]).await?;
    let lines = json_log(&env.engines[engine])?;
    let failed: Vec<&Value> = lines
        .iter()
        .filter(|l| l["fields"]["name"] == "BatchSpanProcessor.ExportError")
        .collect();
    ensure!(
        !failed.is_empty(),
        "no export error logged; the log: {lines:#?}"
    );
    ensure!(failed.iter().all(|l| l["level"] == "ERROR"), "{failed:#?}");
    env.stop().await
}
