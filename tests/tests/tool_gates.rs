//! A tool's `rate_limit:` and `circuit_breaker:` end to end, on both
//! backends: the real engine and two worker processes calling a real HTTP
//! server on this machine (in the test process; loopback is allowed to the
//! workers explicitly), which records when each request arrived.
//!
//! - eight runs call a tool with `rate_limit: 4` at once through two
//!   workers: every call completes, once, and no second holds more than
//!   the limit plus the bucket's one token, by the engine's clock and by the
//!   server's arrival times (real time: about two seconds; only a ceiling
//!   is asserted);
//! - three consecutive 500s open a tool's circuit: later calls fail without
//!   reaching the server (its hits are counted) and the tool node's
//!   `on_error` runs; after `resetMs` (the engine's clock moved, not waited
//!   for) one probe reaches the server: it fails and the circuit opens
//!   again; after another `resetMs` the probe succeeds, the circuit closes
//!   and later calls reach the server.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use belay_sdk::StartOptions;
use belay_tests::{DbBackend, EngineOpts, Env, of_kind};
use serde_json::json;

const T: Duration = Duration::from_secs(60);

/// The tool server: `/limited` answers 200 and records arrival times;
/// `/fragile` counts hits and answers 500 until it is `healthy`.
#[derive(Default)]
struct Server {
    limited: Mutex<Vec<Instant>>,
    fragile_hits: AtomicUsize,
    healthy: AtomicBool,
}

async fn serve() -> Result<(Arc<Server>, SocketAddr)> {
    let server = Arc::new(Server::default());
    let limited = Arc::clone(&server);
    let fragile = Arc::clone(&server);
    let router = axum::Router::new()
        .route(
            "/limited",
            axum::routing::post(move || {
                let server = Arc::clone(&limited);
                async move {
                    server
                        .limited
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(Instant::now());
                    axum::Json(json!({"ok": true}))
                }
            }),
        )
        .route(
            "/fragile",
            axum::routing::post(move || {
                let server = Arc::clone(&fragile);
                async move {
                    server.fragile_hits.fetch_add(1, Ordering::SeqCst);
                    if server.healthy.load(Ordering::SeqCst) {
                        (axum::http::StatusCode::OK, axum::Json(json!({"ok": true})))
                    } else {
                        (
                            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                            axum::Json(json!({"error": "down"})),
                        )
                    }
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok((server, addr))
}

/// Register the gated tools (pointing at `addr`) and their workflows.
async fn register(env: &Env, addr: SocketAddr) -> Result<()> {
    let tools = format!(
        r#"TOOLS:
  limited(n: number) -> object
    description: "A service that allows four calls a second"
    type: http
    endpoint: "http://{addr}/limited"
    rate_limit: 4
    permission: crm.read
    repeat_safety: idempotent

  fragile(n: number) -> object
    description: "A service that fails"
    type: http
    endpoint: "http://{addr}/fragile"
    circuit_breaker:
      threshold: 3
      resetMs: 60000
    permission: crm.read
    repeat_safety: never
"#
    );
    let flows = r#"kind: workflow
name: call_limited
nodes:
  - {id: call, type: tool, tool: limited, args: {n: "${ .input.n }"}, grants: [crm.read]}
---
kind: workflow
name: call_fragile
nodes:
  - {id: call, type: tool, tool: fragile, args: {n: "${ .input.n }"}, grants: [crm.read], on_error: failed}
  - {id: failed, type: fail, error: "${ .nodes.call.output.error }"}
"#;
    env.client(0)?
        .register_files(vec![
            belay_proto::v1::DefinitionFile {
                path: "gates.tools.abl".into(),
                content: tools,
            },
            belay_proto::v1::DefinitionFile {
                path: "gates.yaml".into(),
                content: flows.into(),
            },
        ])
        .await?;
    Ok(())
}

async fn start(env: &Env, workflow: &str, n: u32) -> Result<String> {
    let (run, _) = env
        .client(0)?
        .start_run(
            workflow,
            &json!({"n": n}),
            StartOptions {
                idempotency_key: format!("{workflow}-{n}"),
                caller: "test".into(),
                caller_grants: vec!["crm.read".into()],
            },
        )
        .await?;
    Ok(run.run_id)
}

/// The most of `times` (ms) in any window `[t, t + 1000)`.
fn most_in_a_second(times: &[i64]) -> usize {
    let mut times = times.to_vec();
    times.sort();
    (0..times.len())
        .map(|i| {
            times[i..]
                .iter()
                .take_while(|&&u| u < times[i] + 1000)
                .count()
        })
        .max()
        .unwrap_or(0)
}

async fn a_rate_limit_is_held_across_two_workers(backend: DbBackend) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    let (server, addr) = serve().await?;
    register(&env, addr).await?;
    env.start_worker(0).await?;
    env.start_worker(0).await?;
    let mut runs = Vec::new();
    for n in 0..8 {
        runs.push(start(&env, "call_limited", n).await?);
    }
    let client = env.client(0)?;
    let mut dispatched_at = Vec::new();
    let mut workers = std::collections::BTreeSet::new();
    let mut deferrals = 0;
    for run in &runs {
        env.wait_for(0, run, "run_completed", T).await?;
        ensure!(client.get_run(run).await?.status == "completed");
        let events = client.events(run, 0).await?;
        let payloads = env.events(run).await?;
        ensure!(
            of_kind(&payloads, "tool_call_attempt_failed").is_empty(),
            "a deferral is no failed attempt: {payloads:?}"
        );
        let dispatches = of_kind(&payloads, "tool_call_dispatched");
        ensure!(dispatches.len() == 1, "one dispatch per call: {payloads:?}");
        for e in dispatches
            .iter()
            .chain(of_kind(&payloads, "tool_call_deferred").iter())
        {
            workers.insert(e["worker_id"].as_str().unwrap_or_default().to_owned());
        }
        deferrals += of_kind(&payloads, "tool_call_deferred").len();
        for e in events.iter().filter(|e| e.kind == "tool_call_dispatched") {
            let at = chrono_ms(&e.recorded_at).context("recorded_at")?;
            dispatched_at.push(at);
        }
    }
    let arrivals: Vec<i64> = {
        let seen = server
            .limited
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let first = *seen.first().context("no request arrived")?;
        seen.iter()
            .map(|t| t.duration_since(first).as_millis() as i64)
            .collect()
    };
    ensure!(arrivals.len() == 8, "{} requests arrived", arrivals.len());
    // `rate_limit: 4` spaces dispatches 250 ms apart: at most 4 a second,
    // plus one for the bucket's token (and for the time between a dispatch
    // and its request).
    let (by_engine, by_server) = (
        most_in_a_second(&dispatched_at),
        most_in_a_second(&arrivals),
    );
    ensure!(
        by_engine <= 5 && by_server <= 5,
        "most in a second: {by_engine} dispatched (engine clock {dispatched_at:?}), {by_server} arrived ({arrivals:?})"
    );
    ensure!(
        deferrals > 0,
        "eight calls at once must wait for their turns"
    );
    ensure!(workers.len() == 2, "both workers took part: {workers:?}");
    env.stop().await
}

/// ms since the epoch of an RFC 3339 time.
fn chrono_ms(text: &str) -> Result<i64> {
    Ok(chrono::DateTime::parse_from_rfc3339(text)?.timestamp_millis())
}

async fn a_circuit_opens_stays_open_and_a_probe_closes_it(backend: DbBackend) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    let (server, addr) = serve().await?;
    register(&env, addr).await?;
    env.start_worker(0).await?;
    env.start_worker(0).await?;
    let client = env.client(0)?;
    let hits = || server.fragile_hits.load(Ordering::SeqCst);
    let mut n = 0;
    let mut run_once = |expect: &'static str| {
        n += 1;
        let env = &env;
        let client = &client;
        async move {
            let run = start(env, "call_fragile", n).await?;
            env.wait_for(0, &run, "run_completed", T).await?;
            let done = client.get_run(&run).await?;
            let events = env.events(&run).await?;
            let dispatched = !of_kind(&events, "tool_call_dispatched").is_empty();
            ensure!(
                done.status_reason.contains(expect)
                    || (expect.is_empty() && done.status == "completed"),
                "run {n}: expected {expect:?}, got {} {:?}",
                done.status,
                done.status_reason
            );
            Ok::<bool, anyhow::Error>(dispatched)
        }
    };
    // Three consecutive 500s open the circuit.
    for _ in 0..3 {
        ensure!(run_once("HTTP 500").await?, "closed: the call is sent");
    }
    ensure!(hits() == 3, "{} hits", hits());
    // Open: calls fail fast, without reaching the server, and stay failing.
    for _ in 0..2 {
        let sent =
            run_once("the circuit breaker of tool `fragile` is open after 3 consecutive failures")
                .await?;
        ensure!(!sent, "an open circuit sends nothing");
    }
    ensure!(hits() == 3, "{} hits", hits());
    // After resetMs one probe reaches the server; it fails: open again.
    env.db.advance_clock(60_000).await?;
    ensure!(run_once("HTTP 500").await?, "the probe is sent");
    ensure!(hits() == 4, "{} hits", hits());
    ensure!(!run_once("is open after 4 consecutive failures").await?);
    ensure!(hits() == 4, "{} hits", hits());
    // The server recovers; after resetMs the probe succeeds and the circuit closes.
    server.healthy.store(true, Ordering::SeqCst);
    env.db.advance_clock(60_000).await?;
    ensure!(run_once("").await?, "the probe is sent");
    ensure!(run_once("").await?, "closed: the call is sent");
    ensure!(hits() == 6, "{} hits", hits());
    env.stop().await
}

belay_tests::on_both_backends!(
    a_rate_limit_is_held_across_two_workers,
    a_circuit_opens_stays_open_and_a_probe_closes_it,
);
