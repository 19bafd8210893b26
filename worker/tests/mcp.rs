//! The MCP client against real, unmodified MCP servers installed from their
//! registries by `.ci/mcp-servers.sh` (`eval "$(.ci/mcp-servers.sh)"` sets
//! the variables below): `@modelcontextprotocol/server-everything` over stdio
//! and over Streamable HTTP, and `mcp-server-time` over stdio.
//!
//! Without the variables, the tests run the script themselves (once per
//! test binary). A server that cannot be installed fails the test: these
//! tests never skip.
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use belay_proto::v1::FailureClass;
use belay_worker::NetworkPolicy;
use belay_worker::mcp::{
    self, CallOutcome, CallRefusal, CallRequest, ConfigError, ElicitationAction, ElicitationAnswer,
    InputAnswers, InputVia, McpClient, McpConfig, McpError, McpEvent, McpServerConfig,
    ResolvedServer, SamplingGrant, SamplingSession, SamplingUsage,
};
use belay_worker::oauth_discovery::{AuthorizationError, DiscoveryError};
use belay_worker::sampling::ModelSampler;
use common::GUARD;
use serde_json::{Map, Value, json};
use tokio::io::{AsyncBufReadExt as _, BufReader};

/// The servers' paths from `.ci/mcp-servers.sh`, run once per test binary
/// when the environment does not name them (so the README's test command
/// works on a fresh machine): it installs them into a cache outside the
/// clone the first time, and prints `export NAME=PATH` lines.
fn installed_by_script() -> &'static Result<BTreeMap<String, String>, String> {
    static PATHS: std::sync::OnceLock<Result<BTreeMap<String, String>, String>> =
        std::sync::OnceLock::new();
    PATHS.get_or_init(|| {
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.ci/mcp-servers.sh");
        let out = std::process::Command::new("bash")
            .arg(&script)
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| format!("running {}: {e}", script.display()))?;
        if !out.status.success() {
            return Err(format!(
                "{} failed ({}); see its output above",
                script.display(),
                out.status
            ));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let mut paths = BTreeMap::new();
        for line in text.lines() {
            let Some((name, value)) = line.strip_prefix("export ").and_then(|l| l.split_once('='))
            else {
                continue;
            };
            // `printf %q` leaves plain paths as they are; anything it had to
            // quote is refused rather than guessed at.
            if value.contains(['\\', '\'', '"', '$']) {
                return Err(format!(
                    "{name}: the path {value} needs shell quoting; set {name} yourself"
                ));
            }
            paths.insert(name.to_owned(), value.to_owned());
        }
        Ok(paths)
    })
}

/// Path of an installed server: from the environment (`.ci/run` sets it),
/// else from `.ci/mcp-servers.sh`; panics with the reason.
fn installed(var: &str) -> String {
    let path = match std::env::var(var) {
        Ok(path) if !path.is_empty() => path,
        _ => match installed_by_script() {
            Ok(paths) => match paths.get(var) {
                Some(path) => path.clone(),
                None => panic!(".ci/mcp-servers.sh printed no {var}"),
            },
            Err(e) => panic!(
                "{var} is not set and the MCP servers could not be installed: {e}; \
                 the MCP tests need the real servers (npm and python3 on PATH)"
            ),
        },
    };
    assert!(
        std::path::Path::new(&path).exists(),
        "{var}={path} does not exist: run `eval \"$(.ci/mcp-servers.sh)\"`"
    );
    path
}

fn resolve(name: &str, server: McpServerConfig, vars: &[(&str, &str)]) -> ResolvedServer {
    let config = McpConfig {
        servers: BTreeMap::from([(name.to_owned(), server)]),
        config: vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    };
    config.resolve(name).unwrap()
}

fn everything_stdio_config() -> McpServerConfig {
    let mut server =
        McpServerConfig::stdio(installed("BELAY_MCP_EVERYTHING"), vec!["stdio".into()]);
    server.set_restart_delays(50, 1_000);
    server
}

async fn everything_stdio() -> Arc<dyn McpClient> {
    mcp::connect(resolve("everything", everything_stdio_config(), &[]))
        .await
        .unwrap()
}

fn args(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

fn text_of(outcome: &CallOutcome) -> String {
    let result = match outcome {
        CallOutcome::Ok(r) | CallOutcome::ToolError(r) => r,
        other => panic!("no result: {other:?}"),
    };
    result
        .content
        .iter()
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Tools server-everything lists to a client that declares elicitation (form
/// and URL) and sampling, as Belay does: its always-on tools plus those it
/// registers for those capabilities (its async sampling tool also needs the
/// tasks capability, which Belay does not declare).
const EVERYTHING_TOOLS: &[&str] = &[
    "echo",
    "get-annotated-message",
    "get-env",
    "get-resource-links",
    "get-resource-reference",
    "get-structured-content",
    "get-sum",
    "get-tiny-image",
    "gzip-file-as-resource",
    "toggle-simulated-logging",
    "toggle-subscriber-updates",
    "trigger-long-running-operation",
    "trigger-elicitation-request",
    "trigger-url-elicitation",
    "trigger-sampling-request",
    "simulate-research-query",
];

/// Discovery of every tool: the exact set of names, every one mapped or
/// refused with a reason, hashes stable across listings.
async fn check_everything_discovery(client: &dyn McpClient) {
    let discovery = client.list_tools().await.unwrap();
    assert_eq!(discovery.protocol_version, "2025-11-25");
    let listed: BTreeSet<&str> = discovery
        .tools
        .iter()
        .map(|t| t.name.as_str())
        .chain(discovery.refused.iter().map(|r| r.name.as_str()))
        .collect();
    let expected: BTreeSet<&str> = EVERYTHING_TOOLS.iter().copied().collect();
    assert_eq!(listed, expected, "discovery: {discovery:#?}");
    for refused in &discovery.refused {
        assert!(!refused.reason.to_string().is_empty());
        assert!(refused.definition_hash.starts_with("sha256:"));
    }
    for tool in &discovery.tools {
        assert_eq!(tool.input_schema["type"], "object", "{}", tool.name);
        assert!(tool.definition_hash.starts_with("sha256:"));
    }
    let structured = discovery
        .tools
        .iter()
        .find(|t| t.name == "get-structured-content")
        .unwrap();
    assert!(structured.output_schema.is_some());
    assert_eq!(structured.hints.read_only, Some(true));
    assert_eq!(
        mcp::default_repeat_safety(false, &structured.hints),
        mcp::DefaultRepeatSafety::Never
    );
    assert_eq!(
        mcp::default_repeat_safety(true, &structured.hints),
        mcp::DefaultRepeatSafety::Idempotent
    );
    let again = client.list_tools().await.unwrap();
    let hashes = |d: &mcp::Discovery| {
        d.tools
            .iter()
            .map(|t| (t.name.clone(), t.definition_hash.clone()))
            .collect::<BTreeMap<_, _>>()
    };
    assert_eq!(hashes(&discovery), hashes(&again));
}

/// A call with structured output, an `isError` result, refusals before
/// sending, and truncation.
async fn check_everything_calls(client: &dyn McpClient) {
    let outcome = client
        .call_tool(CallRequest::new(
            "get-structured-content",
            args(json!({"location": "Chicago"})),
        ))
        .await;
    let CallOutcome::Ok(result) = &outcome else {
        panic!("{outcome:?}");
    };
    assert_eq!(
        result.structured_content,
        Some(json!({"temperature": 36, "conditions": "Light rain / drizzle", "humidity": 82}))
    );
    assert_eq!(result.truncation, None);

    // A tool that throws: reported as a tool failure, never as success.
    let outcome = client
        .call_tool(CallRequest::new(
            "get-resource-reference",
            args(json!({"resourceType": "Text", "resourceId": 0})),
        ))
        .await;
    assert!(matches!(outcome, CallOutcome::ToolError(_)), "{outcome:?}");
    assert!(
        text_of(&outcome).contains("Invalid resourceId"),
        "{outcome:?}"
    );
    assert_eq!(outcome.failure_class(), Some(FailureClass::Rejected));

    // Refused before sending.
    let outcome = client
        .call_tool(CallRequest::new(
            "get-sum",
            args(json!({"a": "one", "b": 2})),
        ))
        .await;
    assert!(
        matches!(&outcome, CallOutcome::Refused(CallRefusal::InvalidArguments { errors, .. }) if errors.contains("/a")),
        "{outcome:?}"
    );
    let outcome = client
        .call_tool(CallRequest::new("no-such-tool", Map::new()))
        .await;
    assert!(
        matches!(
            outcome,
            CallOutcome::Refused(CallRefusal::UnknownTool { .. })
        ),
        "{outcome:?}"
    );
    let mut pinned = CallRequest::new("get-sum", args(json!({"a": 1, "b": 2})));
    pinned.expected_hash = Some("sha256:0000".into());
    let outcome = client.call_tool(pinned).await;
    assert!(
        matches!(
            &outcome,
            CallOutcome::Refused(CallRefusal::DefinitionChanged {
                actual: Some(_),
                ..
            })
        ),
        "{outcome:?}"
    );
    assert!(!outcome.may_have_acted());

    // The pinned hash goes through, and the sum is right.
    let hash = client
        .list_tools()
        .await
        .unwrap()
        .tools
        .into_iter()
        .find(|t| t.name == "get-sum")
        .unwrap()
        .definition_hash;
    let mut pinned = CallRequest::new("get-sum", args(json!({"a": 19, "b": 23})));
    pinned.expected_hash = Some(hash);
    pinned.idempotency_key = Some("run-1/call-1".into());
    let outcome = client.call_tool(pinned).await;
    assert!(text_of(&outcome).contains("42"), "{outcome:?}");

    // Truncated to the caller's limit.
    let mut long = CallRequest::new("echo", args(json!({"message": "x".repeat(10_000)})));
    long.max_result_bytes = 500;
    let outcome = client.call_tool(long).await;
    let CallOutcome::Ok(result) = &outcome else {
        panic!("{outcome:?}");
    };
    let truncation = result.truncation.as_ref().unwrap();
    assert!(truncation.kept_bytes <= 500, "{truncation:?}");
    assert!(truncation.original_bytes > 10_000, "{truncation:?}");
    assert!(truncation.text_cut);
}

#[tokio::test]
async fn everything_over_stdio_discovers_and_calls() {
    let client = everything_stdio().await;
    // server-everything registers its capability-dependent tools after the
    // handshake and says so with tools/list_changed: the change signal moves.
    let mut changed = client.tools_changed();
    tokio::time::timeout(GUARD, changed.wait_for(|seq| *seq >= 1))
        .await
        .unwrap()
        .unwrap();
    check_everything_discovery(client.as_ref()).await;
    check_everything_calls(client.as_ref()).await;

    // Per-call headers need an HTTP server.
    let mut with_headers = CallRequest::new("echo", args(json!({"message": "hi"})));
    with_headers.headers.insert("X-Tenant".into(), "t1".into());
    let outcome = client.call_tool(with_headers).await;
    assert!(
        matches!(
            outcome,
            CallOutcome::Refused(CallRefusal::HeadersNotSupported { .. })
        ),
        "{outcome:?}"
    );
    client.shutdown().await;
    let outcome = client
        .call_tool(CallRequest::new("echo", args(json!({"message": "hi"}))))
        .await;
    assert!(
        matches!(outcome, CallOutcome::Disconnected { .. }),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn stdio_server_gets_only_the_configured_environment() {
    let mut server = everything_stdio_config();
    if let McpServerConfig::Stdio(s) = &mut server {
        s.env
            .insert("BELAY_TEST_VALUE".into(), "value-{{config.V}}".into());
    }
    let client = mcp::connect(resolve("everything", server, &[("V", "42")]))
        .await
        .unwrap();
    let outcome = client
        .call_tool(CallRequest::new("get-env", Map::new()))
        .await;
    let text = text_of(&outcome);
    assert!(text.contains("value-42"), "{text}");
    // The worker's own environment (here: the test's) is not passed on.
    assert!(!text.contains("BELAY_MCP_EVERYTHING"), "{text}");
    assert!(text.contains("\"PATH\""), "{text}");
    client.shutdown().await;
}

#[tokio::test]
async fn stdio_server_killed_mid_call_is_lost_after_send_then_restarted() {
    let client = everything_stdio().await;
    let first = client.status();
    assert!(first.connected);
    assert_eq!(first.generation, 1);
    let pid = first.pid.unwrap();
    let mut events = client.events();

    let slow = {
        let client = client.clone();
        tokio::spawn(async move {
            let mut request = CallRequest::new(
                "trigger-long-running-operation",
                args(json!({"duration": 60, "steps": 60})),
            );
            request.idempotency_key = Some("run-9/call-1".into());
            client.call_tool(request).await
        })
    };
    // The server is working on the call once it reports progress.
    tokio::time::timeout(GUARD, async {
        loop {
            match events.recv().await.unwrap() {
                McpEvent::Progress { call, .. } if call == "run-9/call-1" => break,
                _ => {}
            }
        }
    })
    .await
    .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();

    let outcome = tokio::time::timeout(GUARD, slow).await.unwrap().unwrap();
    assert!(
        matches!(outcome, CallOutcome::LostAfterSend { .. }),
        "{outcome:?}"
    );
    assert_eq!(outcome.failure_class(), Some(FailureClass::MayHaveActed));

    // The supervisor restarts the server; the next call waits for it.
    let outcome = tokio::time::timeout(
        GUARD,
        client.call_tool(CallRequest::new("echo", args(json!({"message": "again"})))),
    )
    .await
    .unwrap();
    assert!(text_of(&outcome).contains("again"), "{outcome:?}");
    let second = client.status();
    assert!(second.connected);
    assert!(second.generation >= 2, "{second:?}");
    assert_ne!(second.pid, Some(pid));
    assert!(second.last_error.is_some());
    client.shutdown().await;
}

#[tokio::test]
async fn elicitation_mid_call_becomes_needs_input_then_answers_complete_it() {
    let client = everything_stdio().await;
    let outcome = client
        .call_tool(CallRequest::new("trigger-elicitation-request", Map::new()))
        .await;
    let CallOutcome::NeedsInput(needed) = &outcome else {
        panic!("{outcome:?}");
    };
    assert_eq!(needed.via, InputVia::Elicitation);
    assert!(needed.may_have_acted);
    assert_eq!(needed.requests["requestedSchema"]["type"], "object");
    assert!(needed.requests["requestedSchema"]["properties"]["name"].is_object());
    assert_eq!(outcome.failure_class(), None);

    // The engine waits durably for the person, then calls again with the
    // answer; the server's question is answered from it.
    let mut again = CallRequest::new("trigger-elicitation-request", Map::new());
    again.input = Some(InputAnswers {
        elicitations: vec![ElicitationAnswer {
            action: ElicitationAction::Accept,
            content: Some(json!({"name": "Ada Lovelace", "check": true})),
            question: Some(needed.requests.clone()),
        }],
        ..InputAnswers::default()
    });
    // An answer given to another question is not handed to this one: the
    // call needs input again.
    let mut other = again.clone();
    if let Some(input) = other.input.as_mut() {
        input.elicitations[0].question = Some(json!({"message": "something else"}));
    }
    let outcome = client.call_tool(other).await;
    assert!(matches!(outcome, CallOutcome::NeedsInput(_)), "{outcome:?}");
    let outcome = client.call_tool(again).await;
    assert!(matches!(outcome, CallOutcome::Ok(_)), "{outcome:?}");
    assert!(text_of(&outcome).contains("Ada Lovelace"), "{outcome:?}");

    // URL mode, mid-call: the same, with the URL to send the person to.
    let url_args = json!({"url": "https://example.com/authorize", "elicitationId": "e-1"});
    let outcome = client
        .call_tool(CallRequest::new(
            "trigger-url-elicitation",
            args(url_args.clone()),
        ))
        .await;
    let CallOutcome::NeedsInput(needed) = &outcome else {
        panic!("{outcome:?}");
    };
    assert_eq!(needed.via, InputVia::Elicitation);
    assert_eq!(needed.requests["mode"], "url");
    assert_eq!(needed.requests["url"], "https://example.com/authorize");

    // URL mode as error -32042: the server refused to start; nothing acted.
    let mut error_path = url_args;
    error_path["errorPath"] = json!(true);
    let outcome = client
        .call_tool(CallRequest::new(
            "trigger-url-elicitation",
            args(error_path),
        ))
        .await;
    let CallOutcome::NeedsInput(needed) = &outcome else {
        panic!("{outcome:?}");
    };
    assert_eq!(needed.via, InputVia::UrlElicitationRequired);
    assert!(!needed.may_have_acted);
    assert_eq!(
        needed.requests["elicitations"][0]["url"], "https://modelcontextprotocol.io",
        "{needed:?}"
    );
    client.shutdown().await;
}

#[tokio::test]
async fn cancelled_and_timed_out_calls_are_typed() {
    let client = everything_stdio().await;
    let mut slow = CallRequest::new(
        "trigger-long-running-operation",
        args(json!({"duration": 30, "steps": 30})),
    );
    slow.timeout_ms = 300;
    let outcome = client.call_tool(slow.clone()).await;
    assert_eq!(
        outcome,
        CallOutcome::Timeout {
            timeout_ms: 300,
            sent: true,
            detail: None,
        }
    );
    assert_eq!(outcome.failure_class(), Some(FailureClass::MayHaveActed));

    let token = mcp::CancellationToken::new();
    slow.timeout_ms = 60_000;
    slow.cancel = Some(token.clone());
    let mut events = client.events();
    let call = {
        let client = client.clone();
        tokio::spawn(async move { client.call_tool(slow).await })
    };
    tokio::time::timeout(GUARD, async {
        while !matches!(
            events.recv().await.unwrap(),
            McpEvent::RequestWritten { .. }
        ) {}
    })
    .await
    .unwrap();
    token.cancel();
    let outcome = tokio::time::timeout(GUARD, call).await.unwrap().unwrap();
    assert!(
        matches!(outcome, CallOutcome::Cancelled { sent: true, .. }),
        "{outcome:?}"
    );
    // The connection is still usable.
    let outcome = client
        .call_tool(CallRequest::new(
            "echo",
            args(json!({"message": "still here"})),
        ))
        .await;
    assert!(text_of(&outcome).contains("still here"), "{outcome:?}");
    client.shutdown().await;
}

/// server-everything's Streamable HTTP mode on a free local port; killed
/// when dropped.
struct HttpEverything {
    child: tokio::process::Child,
    url: String,
}

impl HttpEverything {
    /// SIGKILL, and wait until it is gone (its port closed).
    async fn kill(mut self) {
        self.child.kill().await.unwrap();
    }
}

async fn everything_http() -> HttpEverything {
    everything_http_on(common::closed_port().port()).await
}

/// [`everything_http`] on a given port (to restart it where it was).
async fn everything_http_on(port: u16) -> HttpEverything {
    let mut child = tokio::process::Command::new(installed("BELAY_MCP_EVERYTHING"))
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // It says on stderr when it listens.
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    tokio::time::timeout(GUARD, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("listening on port") {
                return;
            }
        }
        panic!("server-everything exited before listening");
    })
    .await
    .unwrap();
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    HttpEverything {
        child,
        url: format!("http://127.0.0.1:{port}/mcp"),
    }
}

/// What the recording proxy saw of one request.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    headers: axum::http::HeaderMap,
    body: String,
}

/// A pass-through HTTP proxy in front of `upstream` that records every
/// request, to see what the client puts on the wire.
async fn recording_proxy(upstream: String) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let log: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let client = reqwest::Client::new();
    let seen = log.clone();
    let router = axum::Router::new().route(
        "/mcp",
        axum::routing::any(
            move |method: axum::http::Method,
                  headers: axum::http::HeaderMap,
                  body: axum::body::Bytes| {
                let (client, upstream, seen) = (client.clone(), upstream.clone(), seen.clone());
                async move {
                    seen.lock().unwrap().push(Seen {
                        method: method.to_string(),
                        headers: headers.clone(),
                        body: String::from_utf8_lossy(&body).into_owned(),
                    });
                    let mut request = client.request(method, &upstream).body(body);
                    for (name, value) in &headers {
                        if name != "host" && name != "content-length" {
                            request = request.header(name, value);
                        }
                    }
                    let response = request.send().await.unwrap();
                    let mut builder = axum::http::Response::builder().status(response.status());
                    for (name, value) in response.headers() {
                        if name != "content-length" && name != "transfer-encoding" {
                            builder = builder.header(name, value);
                        }
                    }
                    let chunks = futures_util::stream::unfold(response, |mut r| async move {
                        match r.chunk().await {
                            Ok(Some(chunk)) => Some((Ok::<_, std::io::Error>(chunk), r)),
                            _ => None,
                        }
                    });
                    builder.body(axum::body::Body::from_stream(chunks)).unwrap()
                }
            },
        ),
    );
    let addr = common::serve(router).await;
    (format!("http://{addr}/mcp"), log)
}

#[tokio::test]
async fn everything_over_streamable_http_discovers_and_calls() {
    let server = everything_http().await;
    let (proxy_url, seen) = recording_proxy(server.url.clone()).await;
    let mut config = McpServerConfig::http(proxy_url);
    if let McpServerConfig::Http(h) = &mut config {
        h.headers
            .insert("Authorization".into(), "Bearer {{config.TOKEN}}".into());
    }
    let client = mcp::connect(resolve("everything-http", config, &[("TOKEN", "t0k3n")]))
        .await
        .unwrap();
    assert_eq!(client.status().transport, "http");
    check_everything_discovery(client.as_ref()).await;
    check_everything_calls(client.as_ref()).await;

    // Per-call headers: accepted when valid, refused when reserved or
    // unresolvable, before anything is sent.
    let mut with_headers = CallRequest::new("echo", args(json!({"message": "hello"})));
    with_headers
        .headers
        .insert("X-Belay-Tenant".into(), "{{config.TOKEN}}-t1".into());
    let outcome = client.call_tool(with_headers).await;
    assert!(text_of(&outcome).contains("hello"), "{outcome:?}");
    for (name, value) in [("Mcp-Session-Id", "x"), ("X-Secret", "{{config.NOPE}}")] {
        let mut bad = CallRequest::new("echo", args(json!({"message": "hello"})));
        bad.headers.insert(name.into(), value.into());
        let outcome = client.call_tool(bad).await;
        // A reserved header is refused; a value this worker lacks is not
        // sent (another worker may have it).
        assert!(
            matches!(
                outcome,
                CallOutcome::Refused(
                    CallRefusal::InvalidHeader { .. } | CallRefusal::MissingConfigValue { .. }
                )
            ),
            "{outcome:?}"
        );
        assert_eq!(
            outcome.failure_class(),
            Some(if name == "X-Secret" {
                FailureClass::NotSent
            } else {
                FailureClass::Rejected
            })
        );
    }
    client.shutdown().await;
    // On the wire: the configured header on every request, the per-call
    // header on its call only, the idempotency key in `_meta`, and never
    // the client's internal call marker.
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.iter()
            .any(|r| r.method == "POST" && r.body.contains("tools/call"))
    );
    for request in &seen {
        assert_eq!(
            request.headers["authorization"], "Bearer t0k3n",
            "{request:?}"
        );
        assert!(!request.body.contains("call-marker"), "{request:?}");
    }
    let tenant: Vec<&Seen> = seen
        .iter()
        .filter(|r| r.headers.contains_key("x-belay-tenant"))
        .collect();
    assert_eq!(tenant.len(), 1, "{tenant:?}");
    assert_eq!(tenant[0].headers["x-belay-tenant"], "t0k3n-t1");
    assert!(tenant[0].body.contains("\"hello\""), "{:?}", tenant[0]);
    assert!(
        seen.iter().any(|r| r
            .body
            .contains("\"io.belay/idempotency-key\":\"run-1/call-1\"")),
        "no idempotency key in any request"
    );
}

#[tokio::test]
async fn http_server_gone_before_the_call_is_not_sent() {
    let server = everything_http().await;
    let mut config = McpServerConfig::http(server.url.clone());
    config.set_connect_timeout_ms(2_000);
    let client = mcp::connect(resolve("everything-http", config, &[]))
        .await
        .unwrap();
    client.list_tools().await.unwrap();
    server.kill().await;
    let outcome = client
        .call_tool(CallRequest::new("echo", args(json!({"message": "hello"}))))
        .await;
    assert!(
        matches!(outcome, CallOutcome::Disconnected { .. }),
        "{outcome:?}"
    );
    assert_eq!(outcome.failure_class(), Some(FailureClass::NotSent));
    client.shutdown().await;
}

#[tokio::test]
async fn time_server_over_stdio_discovers_and_calls() {
    let client = mcp::connect(resolve(
        "time",
        McpServerConfig::stdio(
            installed("BELAY_MCP_TIME"),
            vec!["--local-timezone".into(), "UTC".into()],
        ),
        &[],
    ))
    .await
    .unwrap();
    let discovery = client.list_tools().await.unwrap();
    // mcp-server-time (on the `mcp` 2.x SDK) speaks the current revision:
    // the client's `server/discover` path, where server-everything takes
    // the `initialize` fallback.
    assert_eq!(discovery.protocol_version, "2026-07-28");
    let names: BTreeSet<&str> = discovery.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        BTreeSet::from(["convert_time", "get_current_time"]),
        "{discovery:#?}"
    );
    assert!(discovery.refused.is_empty(), "{discovery:#?}");
    for tool in &discovery.tools {
        assert!(tool.output_schema.is_some(), "{}", tool.name);
    }

    let outcome = client
        .call_tool(CallRequest::new(
            "convert_time",
            args(
                json!({"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}),
            ),
        ))
        .await;
    let CallOutcome::Ok(result) = &outcome else {
        panic!("{outcome:?}");
    };
    let structured = result.structured_content.as_ref().unwrap();
    assert_eq!(
        structured["target"]["timezone"], "Asia/Tokyo",
        "{structured}"
    );
    assert!(
        structured["target"]["datetime"]
            .as_str()
            .unwrap()
            .contains("T21:00:00"),
        "{structured}"
    );

    let outcome = client
        .call_tool(CallRequest::new(
            "get_current_time",
            args(json!({"timezone": "Not/A_Zone"})),
        ))
        .await;
    assert!(matches!(outcome, CallOutcome::ToolError(_)), "{outcome:?}");
    assert!(
        text_of(&outcome).contains("Invalid timezone"),
        "{outcome:?}"
    );
    client.shutdown().await;
}

#[tokio::test]
async fn bad_configurations_are_typed_errors() {
    let missing = McpServerConfig::stdio("", vec![]);
    let config = McpConfig {
        servers: BTreeMap::from([("broken".to_owned(), missing)]),
        config: BTreeMap::new(),
    };
    assert_eq!(
        config.resolve("broken"),
        Err(ConfigError::MissingCommand {
            server: "broken".into()
        })
    );
    assert!(matches!(
        mcp::McpServers::connect_all(&config).await,
        Err(McpError::Config(ConfigError::MissingCommand { .. }))
    ));

    let absent = resolve(
        "absent",
        McpServerConfig::stdio("/nonexistent/belay-mcp-server", vec![]),
        &[],
    );
    match mcp::connect(absent).await {
        Err(McpError::Spawn {
            server,
            command,
            message,
        }) => {
            assert_eq!(server, "absent");
            assert_eq!(command, "/nonexistent/belay-mcp-server");
            assert!(message.contains("No such file"), "{message}");
        }
        other => panic!("{:?}", other.map(|c| c.status())),
    }

    // A process that exits at once never completes the handshake, and
    // says how it exited.
    let exits = resolve("exits", McpServerConfig::stdio("true", vec![]), &[]);
    let outcome = mcp::connect(exits).await.map(|c| c.status());
    assert!(
        matches!(&outcome, Err(McpError::Exited { status, stderr, .. })
            if status == "exit status: 0" && stderr.is_empty()),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn a_changed_definition_is_refused_after_a_restart() {
    // The time server names its local time zone in its argument
    // descriptions; a restart with another zone changes the definition.
    let zone_file = std::env::temp_dir().join(format!("belay-mcp-tz-{}", uuid::Uuid::new_v4()));
    std::fs::write(&zone_file, "UTC").unwrap();
    let mut server = McpServerConfig::stdio(
        "/bin/sh",
        vec![
            "-c".into(),
            r#"exec "$TIME_SERVER" --local-timezone "$(cat "$ZONE_FILE")""#.into(),
        ],
    );
    if let McpServerConfig::Stdio(s) = &mut server {
        s.env
            .insert("TIME_SERVER".into(), installed("BELAY_MCP_TIME"));
        s.env
            .insert("ZONE_FILE".into(), zone_file.display().to_string());
    }
    server.set_restart_delays(50, 1_000);
    let client = mcp::connect(resolve("time", server, &[])).await.unwrap();
    let hash_of = |d: &mcp::Discovery| {
        d.tools
            .iter()
            .find(|t| t.name == "get_current_time")
            .unwrap()
            .definition_hash
            .clone()
    };
    let pinned = hash_of(&client.list_tools().await.unwrap());
    let mut call = CallRequest::new("get_current_time", args(json!({"timezone": "UTC"})));
    call.expected_hash = Some(pinned.clone());
    let outcome = client.call_tool(call.clone()).await;
    assert!(matches!(outcome, CallOutcome::Ok(_)), "{outcome:?}");

    // The server restarts with another configuration.
    std::fs::write(&zone_file, "Europe/Paris").unwrap();
    let mut changed = client.tools_changed();
    changed.borrow_and_update();
    let mut events = client.events();
    let pid = client.status().pid.unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    tokio::time::timeout(GUARD, async {
        while !matches!(events.recv().await.unwrap(), McpEvent::Connected { .. }) {}
    })
    .await
    .unwrap();
    // The reconnection is a tools-changed signal: the catalog is re-listed
    // before the next call, and the pinned definition no longer matches.
    assert!(changed.has_changed().unwrap());
    let outcome = client.call_tool(call.clone()).await;
    let CallOutcome::Refused(CallRefusal::DefinitionChanged {
        expected, actual, ..
    }) = &outcome
    else {
        panic!("{outcome:?}");
    };
    assert_eq!(expected, &pinned);
    let current = actual.clone().unwrap();
    assert_ne!(current, pinned);
    assert!(!outcome.may_have_acted());

    // Once the new definition is accepted (pinned), calls go through.
    let discovery = client.list_tools().await.unwrap();
    assert_eq!(hash_of(&discovery), current);
    let described = discovery
        .tools
        .iter()
        .find(|t| t.name == "get_current_time")
        .unwrap();
    assert!(described.input_schema.to_string().contains("Europe/Paris"));
    call.expected_hash = Some(current);
    let outcome = client.call_tool(call).await;
    assert!(matches!(outcome, CallOutcome::Ok(_)), "{outcome:?}");
    client.shutdown().await;
    let _ = std::fs::remove_file(&zone_file);
}

#[tokio::test]
async fn http_server_restarted_is_reached_on_a_new_session() {
    // server-everything answers a POST for a session it does not know with
    // 400 and a JSON-RPC error without an id; the client must not wait for
    // an answer that never comes, but make a new session and go on.
    let port = common::closed_port().port();
    let server = everything_http_on(port).await;
    let mut config = McpServerConfig::http(server.url.clone());
    config.set_restart_delays(50, 500);
    let client = mcp::connect(resolve("everything-http", config, &[]))
        .await
        .unwrap();
    let hash = client
        .list_tools()
        .await
        .unwrap()
        .tools
        .into_iter()
        .find(|t| t.name == "echo")
        .unwrap()
        .definition_hash;
    let mut call = CallRequest::new("echo", args(json!({"message": "first"})));
    call.expected_hash = Some(hash.clone());
    assert!(text_of(&client.call_tool(call).await).contains("first"));
    assert_eq!(client.status().generation, 1);

    server.kill().await;
    let _again = everything_http_on(port).await;
    let mut call = CallRequest::new("echo", args(json!({"message": "second"})));
    call.expected_hash = Some(hash);
    call.timeout_ms = 20_000;
    let outcome = tokio::time::timeout(GUARD, client.call_tool(call))
        .await
        .unwrap();
    assert!(text_of(&outcome).contains("second"), "{outcome:?}");
    // The forgotten session ended the connection; the call went out on the
    // next one, checked against that connection's listing.
    assert!(client.status().generation >= 2, "{:?}", client.status());
    client.shutdown().await;
}

#[tokio::test]
async fn a_call_waiting_for_a_restart_is_checked_against_the_new_listing() {
    // As in `a_changed_definition_is_refused_after_a_restart`, but the call
    // is made at once after the kill: it waits for the re-made connection
    // and must be checked against what the restarted server lists, not
    // against the listing of the connection that died.
    let zone_file = std::env::temp_dir().join(format!("belay-mcp-tz-{}", uuid::Uuid::new_v4()));
    std::fs::write(&zone_file, "UTC").unwrap();
    let mut server = McpServerConfig::stdio(
        "/bin/sh",
        vec![
            "-c".into(),
            r#"exec "$TIME_SERVER" --local-timezone "$(cat "$ZONE_FILE")""#.into(),
        ],
    );
    if let McpServerConfig::Stdio(s) = &mut server {
        s.env
            .insert("TIME_SERVER".into(), installed("BELAY_MCP_TIME"));
        s.env
            .insert("ZONE_FILE".into(), zone_file.display().to_string());
    }
    server.set_restart_delays(200, 1_000);
    let client = mcp::connect(resolve("time", server, &[])).await.unwrap();
    let pinned = client
        .list_tools()
        .await
        .unwrap()
        .tools
        .into_iter()
        .find(|t| t.name == "get_current_time")
        .unwrap()
        .definition_hash;
    std::fs::write(&zone_file, "Asia/Tokyo").unwrap();
    let mut events = client.events();
    let pid = client.status().pid.unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // Lost, not yet re-made (the restart waits at least 200 ms).
    tokio::time::timeout(GUARD, async {
        while !matches!(
            events.recv().await.unwrap(),
            McpEvent::ConnectionLost { .. }
        ) {}
    })
    .await
    .unwrap();
    assert!(!client.status().connected);
    let mut call = CallRequest::new("get_current_time", args(json!({"timezone": "UTC"})));
    call.expected_hash = Some(pinned.clone());
    let outcome = tokio::time::timeout(GUARD, client.call_tool(call))
        .await
        .unwrap();
    assert!(
        matches!(
            &outcome,
            CallOutcome::Refused(CallRefusal::DefinitionChanged { expected, actual: Some(actual), .. })
                if expected == &pinned && actual != &pinned
        ),
        "{outcome:?}"
    );
    assert!(client.status().generation >= 2);
    client.shutdown().await;
    let _ = std::fs::remove_file(&zone_file);
}

/// A tiny MCP server (the Python SDK's `MCPServer`) whose tool `big`
/// returns `n` bytes of text (twice in its answer: as content and as
/// `structuredContent`).
fn big_answer_server() -> McpServerConfig {
    let script = std::env::temp_dir().join(format!("belay-mcp-big-{}.py", uuid::Uuid::new_v4()));
    std::fs::write(
        &script,
        r#"from mcp.server.mcpserver import MCPServer
server = MCPServer("big")
@server.tool()
def big(n: int) -> str:
    """Returns n bytes."""
    return "x" * n
server.run()
"#,
    )
    .unwrap();
    McpServerConfig::stdio(
        installed("BELAY_MCP_PYTHON"),
        vec![script.display().to_string()],
    )
}

#[tokio::test]
async fn an_answer_too_large_for_stdio_fails_at_once_as_may_have_acted() {
    let client = mcp::connect(resolve("big", big_answer_server(), &[]))
        .await
        .unwrap();
    let big = |n: usize| {
        let mut call = CallRequest::new("big", args(json!({ "n": n })));
        // Far longer than the test may take: a discarded answer must not
        // wait for it.
        call.timeout_ms = 3_600_000;
        call
    };
    // 40 MiB twice: past the 64 MiB stdio message limit.
    let outcome = tokio::time::timeout(GUARD, client.call_tool(big(40 << 20)))
        .await
        .expect("the call ends without waiting for its timeout");
    assert_eq!(
        outcome,
        CallOutcome::AnswerTooLarge {
            limit_bytes: 64 << 20
        }
    );
    assert_eq!(outcome.failure_class(), Some(FailureClass::MayHaveActed));
    // 10 MiB twice: past rmcp's default 16 MiB line, within Belay's limit;
    // read, then truncated to the call's result limit.
    let outcome = tokio::time::timeout(GUARD, client.call_tool(big(10 << 20)))
        .await
        .unwrap();
    let CallOutcome::Ok(result) = &outcome else {
        panic!("{outcome:?}");
    };
    assert!(result.truncation.is_some(), "{:?}", result.truncation);
    // The connection is still usable.
    let outcome = client.call_tool(big(3)).await;
    assert!(text_of(&outcome).contains("xxx"), "{outcome:?}");
    client.shutdown().await;
}

/// `McpTools` of a worker whose `--mcp-config` holds `servers`, reporting to
/// a fake engine.
async fn mcp_tools(
    servers: Vec<(&str, McpServerConfig)>,
) -> (common::FakeEngine, Arc<belay_worker::mcp_tool::McpTools>) {
    let engine = common::FakeEngine::start(common::Log::default()).await;
    let client = belay_worker::EngineClient::connect_lazy(&engine.url(), "w-mcp").unwrap();
    let config = McpConfig {
        servers: servers
            .into_iter()
            .map(|(name, server)| (name.to_owned(), server))
            .collect(),
        config: BTreeMap::new(),
    };
    let tools = belay_worker::mcp_tool::McpTools::start(
        &config,
        &belay_worker::NetworkPolicy::default(),
        client,
    )
    .await
    .unwrap();
    (engine, tools)
}

/// Calls `server`'s `tool` through `tools`; also says whether the call was
/// dispatched.
async fn call_through(
    tools: &belay_worker::mcp_tool::McpTools,
    server: &str,
    tool: &str,
    arguments: Value,
) -> (belay_worker::mcp_tool::McpCallReport, bool) {
    let task = belay_proto::v1::Task {
        task_id: "task-1".into(),
        run_id: "run-1".into(),
        tenant: "acme".into(),
        kind: "tool_call".into(),
        attempt: 1,
        ..Default::default()
    };
    let binding = belay_proto::wire::McpBinding {
        server: server.into(),
        server_tool: tool.into(),
        headers: BTreeMap::new(),
        timeout_ms: 30_000,
    };
    let spec = belay_proto::wire::ToolCallSpec {
        tool: tool.into(),
        tool_version: 1,
        arguments,
        binding: belay_proto::wire::ToolBinding::Mcp(binding.clone()),
        idempotency_key: "run-1/call-1".into(),
        input: None,
        config_params: Vec::new(),
        result_secrets: Vec::new(),
        variant: None,
        sampling: None,
        trace: None,
        dispatch_with_claim: false,
        repeat_safety: String::new(),
    };
    let mut dispatched = false;
    let report = tools
        .call(&task, &spec, &binding, None, |_| dispatched = true)
        .await;
    (report, dispatched)
}

#[tokio::test]
async fn a_server_this_worker_lacks_is_not_sent_so_another_worker_may_serve_it() {
    let (engine, tools) = mcp_tools(vec![]).await;
    let (report, dispatched) = call_through(&tools, "elsewhere", "echo", json!({})).await;
    let belay_worker::mcp_tool::McpCallReport::Fail { class, error, .. } = report else {
        panic!("{report:?}");
    };
    assert_eq!(class, FailureClass::NotSent);
    assert!(
        error.contains("MCP server `elsewhere` is not configured on worker `w-mcp`"),
        "{error}"
    );
    assert!(!dispatched);
    assert!(engine.state.lock().unwrap().dispatches.is_empty());
    tools.shutdown().await;
}

#[tokio::test]
async fn arguments_the_input_schema_refuses_are_rejected_before_dispatch() {
    let (engine, tools) = mcp_tools(vec![(
        "time",
        McpServerConfig::stdio(installed("BELAY_MCP_TIME"), vec![]),
    )])
    .await;
    // `timezone` is a required string.
    let (report, dispatched) =
        call_through(&tools, "time", "get_current_time", json!({"timezone": 5})).await;
    let belay_worker::mcp_tool::McpCallReport::Fail { class, error, .. } = report else {
        panic!("{report:?}");
    };
    assert_eq!(class, FailureClass::Rejected);
    assert!(error.contains("do not match its input schema"), "{error}");
    assert!(!dispatched);
    assert!(engine.state.lock().unwrap().dispatches.is_empty());
    // Valid arguments are dispatched (pinning the listed definition) and sent.
    let (report, dispatched) = call_through(
        &tools,
        "time",
        "get_current_time",
        json!({"timezone": "UTC"}),
    )
    .await;
    assert!(
        matches!(report, belay_worker::mcp_tool::McpCallReport::Complete(_)),
        "{report:?}"
    );
    assert!(dispatched);
    assert_eq!(engine.state.lock().unwrap().dispatches.len(), 1);
    tools.shutdown().await;
}

/// A server that asks the client for a completion whatever the client
/// declares, and whatever grant the call has.
///
/// `legacy`: a plain JSON-RPC server over stdio written here (Python, no
/// SDK: the SDK's own server refuses to ask a client that did not declare
/// sampling) that speaks 2025-11-25 and, during `tools/call`, sends
/// `sampling/createMessage` and waits for the answer: `ask` then fails the
/// tool with the client's error (`isError`), `ask_and_report` returns it.
/// Otherwise the Python SDK's `MCPServer` on 2026-07-28, whose `ask`
/// returns `input_required` with a sampling request in it.
fn sampling_server(legacy: bool) -> McpServerConfig {
    let script =
        std::env::temp_dir().join(format!("belay-mcp-sampling-{}.py", uuid::Uuid::new_v4()));
    let legacy_server = r#"import json, sys
def send(m):
    sys.stdout.write(json.dumps(m) + "\n"); sys.stdout.flush()
def read():
    line = sys.stdin.readline()
    if not line:
        sys.exit(0)
    return json.loads(line)
schema = {"type": "object", "properties": {"prompt": {"type": "string"}}, "required": ["prompt"]}
tools = [{"name": n, "description": n, "inputSchema": schema} for n in ("ask", "ask_and_report")]
while True:
    m = read()
    method, mid = m.get("method"), m.get("id")
    if mid is None:
        continue
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": mid, "result": {"protocolVersion": "2025-11-25",
              "capabilities": {"tools": {}}, "serverInfo": {"name": "sampler", "version": "1"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": mid, "result": {"tools": tools}})
    elif method == "tools/call":
        name = m["params"]["name"]
        send({"jsonrpc": "2.0", "id": "s-1", "method": "sampling/createMessage", "params": {
              "messages": [{"role": "user", "content": {"type": "text", "text": m["params"]["arguments"]["prompt"]}}],
              "maxTokens": 50}})
        answer = read()
        while answer.get("id") != "s-1":
            answer = read()
        if "error" in answer:
            e = answer["error"]
            text = f"refused: code={e['code']} {e['message']}"
            send({"jsonrpc": "2.0", "id": mid, "result": {"content": [{"type": "text", "text": text}],
                  "isError": name == "ask"}})
        else:
            send({"jsonrpc": "2.0", "id": mid, "result": {"content": [{"type": "text", "text": "sampled"}]}})
    else:
        send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": f"unknown method {method}"}})
"#;
    let modern_server = r#"import warnings
warnings.simplefilter("ignore")
from mcp import types
from mcp.server.mcpserver import MCPServer, Context
server = MCPServer("sampler")

@server.tool()
async def ask(prompt: str, ctx: Context) -> types.InputRequiredResult:
    """Asks the client's model, 2026-07-28 style."""
    return types.InputRequiredResult(input_requests={"llm": types.CreateMessageRequest(
        params=types.CreateMessageRequestParams(
            messages=[types.SamplingMessage(role="user", content=types.TextContent(type="text", text=prompt))],
            max_tokens=50))})

server.run()
"#;
    std::fs::write(&script, if legacy { legacy_server } else { modern_server }).unwrap();
    McpServerConfig::stdio(
        installed("BELAY_MCP_PYTHON"),
        vec![script.display().to_string()],
    )
}

#[tokio::test]
async fn a_server_asking_for_sampling_without_a_grant_is_refused_with_an_mcp_error_and_a_typed_outcome()
 {
    // A call without a grant: JSON-RPC error -1 with the reason.
    let client = mcp::connect(resolve("sampler", sampling_server(true), &[]))
        .await
        .unwrap();
    assert_eq!(
        client.status().protocol_version.as_deref(),
        Some("2025-11-25")
    );
    let outcome = client
        .call_tool(CallRequest::new(
            "ask_and_report",
            args(json!({"prompt": "hi"})),
        ))
        .await;
    let text = text_of(&outcome);
    assert!(matches!(outcome, CallOutcome::Ok(_)), "{outcome:?}");
    assert!(text.contains("code=-1 "), "{text}");
    assert!(text.contains("has no sampling grant"), "{text}");

    // A tool that fails for it ends typed: a definite refusal.
    let outcome = client
        .call_tool(CallRequest::new("ask", args(json!({"prompt": "hi"}))))
        .await;
    let CallOutcome::SamplingRefused {
        may_have_acted,
        detail,
    } = &outcome
    else {
        panic!("{outcome:?}");
    };
    assert!(*may_have_acted);
    assert!(
        detail
            .as_deref()
            .is_some_and(|d| d.contains("has no sampling grant")),
        "{detail:?}"
    );
    assert_eq!(outcome.failure_class(), Some(FailureClass::Rejected));
    // The connection is still usable.
    let outcome = client
        .call_tool(CallRequest::new(
            "ask_and_report",
            args(json!({"prompt": "again"})),
        ))
        .await;
    assert!(text_of(&outcome).contains("refused"), "{outcome:?}");
    client.shutdown().await;

    // 2026-07-28: a sampling request inside `input_required` never becomes
    // a question for a person; nothing ran.
    let client = mcp::connect(resolve("sampler", sampling_server(false), &[]))
        .await
        .unwrap();
    assert_eq!(
        client.status().protocol_version.as_deref(),
        Some("2026-07-28")
    );
    let outcome = client
        .call_tool(CallRequest::new("ask", args(json!({"prompt": "hi"}))))
        .await;
    assert_eq!(
        outcome,
        CallOutcome::SamplingRefused {
            may_have_acted: false,
            detail: None
        }
    );
    assert_eq!(outcome.failure_class(), Some(FailureClass::Rejected));
    client.shutdown().await;

    // Through the worker's tool path: reported as REJECTED, naming why.
    let (_engine, tools) = mcp_tools(vec![("sampler", sampling_server(true))]).await;
    let (report, dispatched) = call_through(&tools, "sampler", "ask", json!({"prompt": "x"})).await;
    let belay_worker::mcp_tool::McpCallReport::Fail { class, error, .. } = report else {
        panic!("{report:?}");
    };
    assert!(dispatched);
    assert_eq!(class, FailureClass::Rejected);
    assert!(
        error.contains("asked for a model completion (MCP sampling) that Belay did not give"),
        "{error}"
    );
    tools.shutdown().await;
}

/// A scripted OpenAI-compatible model over real HTTP: every completion is
/// `text` with usage 11 input and 3 output tokens; the requests it got are
/// recorded.
async fn scripted_model(text: &str) -> (belay_worker::ModelProviderConfig, common::Recorded) {
    let answer = json!({
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "gpt-sampler",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": "stop"
        }],
        "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}
    });
    let (addr, recorded) = common::recording_server("/v1/chat/completions", answer).await;
    let config = belay_worker::ModelProviderConfig {
        provider: belay_worker::ModelProvider::OpenAi,
        base_url: format!("http://{addr}/v1"),
        api_key: None,
        timeout_ms: 10_000,
    };
    (config, recorded)
}

fn grant(max_requests: u32, max_tokens: u32) -> SamplingGrant {
    SamplingGrant {
        model: "gpt-sampler".into(),
        max_requests,
        max_tokens,
        max_total_tokens: None,
        max_input_tokens: None,
    }
}

fn sampling_session(
    model: &belay_worker::ModelProviderConfig,
    grant: SamplingGrant,
) -> Arc<SamplingSession> {
    let client = belay_worker::ModelClient::new(model).unwrap();
    Arc::new(SamplingSession::new(
        grant,
        Arc::new(ModelSampler::new(client)),
    ))
}

fn sampling_call(prompt: &str, session: Option<&Arc<SamplingSession>>) -> CallRequest {
    let mut request = CallRequest::new(
        "trigger-sampling-request",
        args(json!({"prompt": prompt, "maxTokens": 100})),
    );
    request.sampling = session.cloned();
    request
}

#[tokio::test]
async fn a_granted_call_samples_through_the_runs_model_within_its_grant() {
    let (model, recorded) = scripted_model("forty-two").await;
    let session = sampling_session(&model, grant(1, 40));
    let everything = everything_stdio().await;
    // Belay declares the capability, so server-everything lists its tool.
    let discovery = everything.list_tools().await.unwrap();
    assert!(
        discovery
            .tools
            .iter()
            .any(|t| t.name == "trigger-sampling-request"),
        "{discovery:#?}"
    );

    let outcome = everything
        .call_tool(sampling_call("what is the answer?", Some(&session)))
        .await;
    assert!(matches!(outcome, CallOutcome::Ok(_)), "{outcome:?}");
    // The server got the model's text, the grant's model and MCP's stop
    // reason, and shows them in its result.
    let text = text_of(&outcome);
    assert!(text.contains("forty-two"), "{text}");
    assert!(text.contains("gpt-sampler"), "{text}");
    assert!(text.contains("endTurn"), "{text}");
    // One model request: the grant's model, the server's 100 tokens capped
    // to the grant's 40, its system prompt and text, no tools.
    let requests: Vec<Value> = recorded
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.2.clone())
        .collect();
    assert_eq!(requests.len(), 1, "{requests:#?}");
    assert_eq!(requests[0]["model"], "gpt-sampler");
    assert_eq!(requests[0]["max_tokens"], 40);
    assert_eq!(
        requests[0]["messages"],
        json!([
            {"role": "system", "content": "You are a helpful test server."},
            {"role": "user", "content": "Resource trigger-sampling-request context: what is the answer?"}
        ])
    );
    assert!(requests[0].get("tools").is_none(), "{}", requests[0]);
    assert_eq!(
        session.usage(),
        SamplingUsage {
            requests: 1,
            input_tokens: 11,
            output_tokens: 3
        }
    );

    // Past `max_requests`: refused, the model is not called, nothing more
    // is used, and the call's failure is typed.
    let outcome = everything
        .call_tool(sampling_call("again?", Some(&session)))
        .await;
    let CallOutcome::SamplingRefused {
        may_have_acted,
        detail,
    } = &outcome
    else {
        panic!("{outcome:?}");
    };
    assert!(*may_have_acted);
    assert!(
        detail
            .as_deref()
            .is_some_and(|d| d.contains("may ask for 1 completion(s)")),
        "{detail:?}"
    );
    assert_eq!(outcome.failure_class(), Some(FailureClass::Rejected));
    assert_eq!(recorded.lock().unwrap().len(), 1);
    assert_eq!(session.usage().requests, 1);

    // Without a grant: refused as before, on the same connection.
    let outcome = everything.call_tool(sampling_call("no grant?", None)).await;
    let CallOutcome::SamplingRefused { detail, .. } = &outcome else {
        panic!("{outcome:?}");
    };
    assert!(
        detail
            .as_deref()
            .is_some_and(|d| d.contains("has no sampling grant")),
        "{detail:?}"
    );
    assert_eq!(recorded.lock().unwrap().len(), 1);
    everything.shutdown().await;
}

#[tokio::test]
async fn over_http_two_calls_at_once_each_sample_under_their_own_grant() {
    // Over Streamable HTTP a server's request comes on the stream of the
    // call that asked, so two calls in flight at once are told apart (over
    // stdio they would be refused: the asker is unknown).
    let (model, recorded) = scripted_model("each").await;
    let server = everything_http().await;
    let client = mcp::connect(resolve(
        "everything-http",
        McpServerConfig::http(server.url.clone()),
        &[],
    ))
    .await
    .unwrap();
    let first = sampling_session(&model, grant(1, 30));
    let second = sampling_session(&model, grant(1, 60));
    let (one, two) = tokio::join!(
        client.call_tool(sampling_call("first", Some(&first))),
        client.call_tool(sampling_call("second", Some(&second))),
    );
    for outcome in [&one, &two] {
        assert!(text_of(outcome).contains("each"), "{outcome:?}");
    }
    assert_eq!(first.usage().requests, 1);
    assert_eq!(second.usage().requests, 1);
    // Each model request went out under the grant of the call that asked.
    let requests: Vec<Value> = recorded
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.2.clone())
        .collect();
    assert_eq!(requests.len(), 2, "{requests:#?}");
    for request in &requests {
        let prompt = request["messages"][1]["content"]
            .as_str()
            .unwrap_or_default();
        let cap = if prompt.ends_with("first") { 30 } else { 60 };
        assert!(
            prompt.ends_with("first") || prompt.ends_with("second"),
            "{prompt}"
        );
        assert_eq!(request["max_tokens"], cap, "{request}");
    }
    client.shutdown().await;
}

#[tokio::test]
async fn a_grant_bounds_the_sum_of_a_calls_completions() {
    let (model, recorded) = scripted_model("bounded").await;
    let everything = everything_stdio().await;
    // Five output tokens in all: the server's 100 are capped to 5, then
    // to the 2 left after the first completion's 3; then none are left.
    let session = sampling_session(
        &model,
        SamplingGrant {
            max_total_tokens: Some(5),
            ..grant(3, 40)
        },
    );
    for _ in 0..2 {
        let outcome = everything
            .call_tool(sampling_call("short?", Some(&session)))
            .await;
        assert!(matches!(outcome, CallOutcome::Ok(_)), "{outcome:?}");
    }
    let caps: Vec<Value> = recorded
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.2["max_tokens"].clone())
        .collect();
    assert_eq!(caps, [json!(5), json!(2)]);
    let outcome = everything
        .call_tool(sampling_call("more?", Some(&session)))
        .await;
    let CallOutcome::SamplingRefused { detail, .. } = &outcome else {
        panic!("{outcome:?}");
    };
    assert!(
        detail
            .as_deref()
            .is_some_and(|d| d.contains("may use 5 output token(s) in all")),
        "{detail:?}"
    );
    assert_eq!(recorded.lock().unwrap().len(), 2);
    assert_eq!(
        session.usage(),
        SamplingUsage {
            requests: 2,
            input_tokens: 22,
            output_tokens: 6
        }
    );

    // Input tokens: server-everything's prompt is its system prompt (30
    // bytes) and "Resource trigger-sampling-request context: " (43) with
    // the question: more than 10 tokens at 4 bytes a token, so it is
    // refused before the model is called.
    let session = sampling_session(
        &model,
        SamplingGrant {
            max_input_tokens: Some(10),
            ..grant(3, 40)
        },
    );
    let outcome = everything
        .call_tool(sampling_call("a long question?", Some(&session)))
        .await;
    let CallOutcome::SamplingRefused { detail, .. } = &outcome else {
        panic!("{outcome:?}");
    };
    assert!(
        detail
            .as_deref()
            .is_some_and(|d| d.contains("input token(s)") && d.contains("the 10 left of the 10")),
        "{detail:?}"
    );
    assert_eq!(session.usage(), SamplingUsage::default());
    assert_eq!(recorded.lock().unwrap().len(), 2);
    // Room for one prompt (about 19 tokens): the provider's 11 input
    // tokens are subtracted, and the next prompt no longer fits.
    let session = sampling_session(
        &model,
        SamplingGrant {
            max_input_tokens: Some(25),
            ..grant(3, 40)
        },
    );
    let outcome = everything
        .call_tool(sampling_call("q?", Some(&session)))
        .await;
    assert!(matches!(outcome, CallOutcome::Ok(_)), "{outcome:?}");
    let outcome = everything
        .call_tool(sampling_call("q?", Some(&session)))
        .await;
    let CallOutcome::SamplingRefused { detail, .. } = &outcome else {
        panic!("{outcome:?}");
    };
    assert!(
        detail.as_deref().is_some_and(
            |d| d.contains("about 19 input token(s)") && d.contains("the 14 left of the 25")
        ),
        "{detail:?}"
    );
    assert_eq!(recorded.lock().unwrap().len(), 3);
    everything.shutdown().await;
}

/// A raw stdio server: `early` answers at once and then asks for a
/// completion on its own account; `slow` waits until that request has
/// been answered and returns the answer as an error result (it asks for
/// nothing itself).
fn late_sampler() -> McpServerConfig {
    let script = std::env::temp_dir().join(format!("belay-mcp-late-{}.py", uuid::Uuid::new_v4()));
    let source = r#"import json, sys, threading, time
lock = threading.Lock()
late = {"answer": None}
answered = threading.Event()
def send(m):
    with lock:
        sys.stdout.write(json.dumps(m) + "\n"); sys.stdout.flush()
schema = {"type": "object", "properties": {}}
tools = [{"name": n, "description": n, "inputSchema": schema} for n in ("early", "slow")]
def ask_late():
    # Likely after `early` has ended on the client; the outcome is the same
    # if it has not (two calls in flight).
    time.sleep(0.2)
    send({"jsonrpc": "2.0", "id": "late-1", "method": "sampling/createMessage", "params": {
          "messages": [{"role": "user", "content": {"type": "text", "text": "asked by early, after it ended"}}],
          "maxTokens": 50}})
def answer_slow(mid):
    answered.wait(20)
    send({"jsonrpc": "2.0", "id": mid, "result": {"isError": True,
          "content": [{"type": "text", "text": "slow failed on its own; late answer: " + json.dumps(late["answer"])}]}})
for line in sys.stdin:
    m = json.loads(line)
    method, mid = m.get("method"), m.get("id")
    if mid == "late-1":
        late["answer"] = m.get("result") or m.get("error")
        answered.set()
        continue
    if mid is None:
        continue
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": mid, "result": {"protocolVersion": "2025-11-25",
              "capabilities": {"tools": {}}, "serverInfo": {"name": "late", "version": "1"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": mid, "result": {"tools": tools}})
    elif method == "tools/call" and m["params"]["name"] == "early":
        send({"jsonrpc": "2.0", "id": mid, "result": {"content": [{"type": "text", "text": "done"}]}})
        threading.Thread(target=ask_late).start()
    elif method == "tools/call":
        threading.Thread(target=answer_slow, args=(mid,)).start()
    else:
        send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "unknown"}})
"#;
    std::fs::write(&script, source).unwrap();
    McpServerConfig::stdio(
        installed("BELAY_MCP_PYTHON"),
        vec![script.display().to_string()],
    )
}

#[tokio::test]
async fn over_stdio_a_request_no_call_can_be_tied_to_is_refused_and_charged_to_none() {
    let (model, recorded) = scripted_model("late text").await;
    let client = mcp::connect(resolve("late", late_sampler(), &[]))
        .await
        .unwrap();
    // `slow` has a grant and asks nothing; `early` (no grant) starts while
    // it is in flight, ends, and its server then asks for a completion
    // while `slow` is the only call left in flight.
    let session = sampling_session(&model, grant(1, 30));
    let mut slow = CallRequest::new("slow", Map::new());
    slow.sampling = Some(Arc::clone(&session));
    let (slow, early) = tokio::join!(
        client.call_tool(slow),
        client.call_tool(CallRequest::new("early", Map::new())),
    );
    assert!(matches!(early, CallOutcome::Ok(_)), "{early:?}");
    // The request was refused, `slow`'s grant untouched, the model not
    // called; and `slow`'s own error is not reworded as a refusal.
    let CallOutcome::ToolError(result) = &slow else {
        panic!("{slow:?}");
    };
    let text = serde_json::to_string(&result.content).unwrap();
    assert!(text.contains("slow failed on its own"), "{text}");
    assert!(
        text.contains("cannot tell for sure which tool call asked"),
        "{text}"
    );
    assert_eq!(session.usage(), SamplingUsage::default());
    assert!(recorded.lock().unwrap().is_empty());
    client.shutdown().await;
}

#[tokio::test]
async fn a_model_that_fails_a_granted_completion_leaves_the_tools_own_outcome() {
    let router = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(|| async {
            (
                axum::http::StatusCode::TOO_MANY_REQUESTS,
                axum::Json(json!({"error": {"message": "rate limited", "type": "rate_limit"}})),
            )
        }),
    );
    let addr = common::serve(router).await;
    let model = belay_worker::ModelProviderConfig {
        provider: belay_worker::ModelProvider::OpenAi,
        base_url: format!("http://{addr}/v1"),
        api_key: None,
        timeout_ms: 5_000,
    };
    let session = sampling_session(&model, grant(1, 30));
    let everything = everything_stdio().await;
    let outcome = everything
        .call_tool(sampling_call("rate?", Some(&session)))
        .await;
    // The server got -32603 with the provider's error; the call is not a
    // refusal Belay made ("did not give"), and not a definite failure
    // either: the tool may have acted and a repeat may succeed, so its
    // repeat safety decides (`LostAfterSend`, MAY_HAVE_ACTED).
    assert!(
        matches!(outcome, CallOutcome::LostAfterSend { .. }),
        "{outcome:?}"
    );
    let said = format!("{outcome:?}");
    assert!(said.contains("sampling/createMessage failed"), "{said}");
    assert!(said.contains("429"), "{said}");
    // The completion asked of the model counts; the provider reported no
    // tokens.
    assert_eq!(session.usage().requests, 1);
    everything.shutdown().await;
}

/// A raw stdio server whose `loop` asks for a completion 40 times in a row
/// (each after the previous answer) and returns how many were answered and
/// refused.
fn looping_sampler() -> McpServerConfig {
    let script = std::env::temp_dir().join(format!("belay-mcp-loop-{}.py", uuid::Uuid::new_v4()));
    let source = r#"import json, sys
def send(m):
    sys.stdout.write(json.dumps(m) + "\n"); sys.stdout.flush()
def read():
    line = sys.stdin.readline()
    if not line:
        sys.exit(0)
    return json.loads(line)
tools = [{"name": "loop", "description": "loop", "inputSchema": {"type": "object", "properties": {}}}]
while True:
    m = read()
    method, mid = m.get("method"), m.get("id")
    if mid is None:
        continue
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": mid, "result": {"protocolVersion": "2025-11-25",
              "capabilities": {"tools": {}}, "serverInfo": {"name": "loop", "version": "1"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": mid, "result": {"tools": tools}})
    elif method == "tools/call":
        refused = answered = 0
        for i in range(40):
            send({"jsonrpc": "2.0", "id": f"s-{i}", "method": "sampling/createMessage", "params": {
                  "messages": [{"role": "user", "content": {"type": "text", "text": "again"}}], "maxTokens": 5}})
            a = read()
            while a.get("id") != f"s-{i}":
                a = read()
            if "error" in a: refused += 1
            else: answered += 1
        send({"jsonrpc": "2.0", "id": mid, "result": {"content": [{"type": "text",
              "text": f"answered={answered} refused={refused}"}]}})
    else:
        send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "unknown"}})
"#;
    std::fs::write(&script, source).unwrap();
    McpServerConfig::stdio(
        installed("BELAY_MCP_PYTHON"),
        vec![script.display().to_string()],
    )
}

/// Log lines written while a test runs.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_server_looping_on_sampling_is_refused_past_its_grant_and_logged_once_at_warn() {
    let captured = Captured::default();
    let writer = captured.clone();
    // The worker's own default filter.
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(
            belay_worker::config::DEFAULT_LOG_FILTER,
        ))
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    // The test's runtime has one thread, where the client's tasks run too.
    let _log = tracing::subscriber::set_default(subscriber);
    let (model, recorded) = scripted_model("x").await;
    let client = mcp::connect(resolve("loop", looping_sampler(), &[]))
        .await
        .unwrap();
    let session = sampling_session(&model, grant(2, 30));
    let mut request = CallRequest::new("loop", Map::new());
    request.sampling = Some(Arc::clone(&session));
    let outcome = client.call_tool(request).await;
    // The grant holds; the server's result stands.
    let text = text_of(&outcome);
    assert!(text.contains("answered=2 refused=38"), "{text}");
    assert_eq!(recorded.lock().unwrap().len(), 2);
    client.shutdown().await;
    let logged = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    // One line at warn for the 38 refusals, and their number at the end.
    let warned: Vec<&str> = logged.lines().filter(|l| l.contains(" WARN ")).collect();
    assert_eq!(warned.len(), 2, "{logged}");
    assert!(warned[0].contains("has used them"), "{logged}");
    assert!(
        warned[1].contains("answered with an error during the call")
            && warned[1].contains("errors=38"),
        "{logged}"
    );
}

#[tokio::test]
async fn a_worker_reports_what_a_servers_sampling_used_with_the_result() {
    let (model, recorded) = scripted_model("sampled text").await;
    let mut engine = common::FakeEngine::start(common::Log::default()).await;
    let task = |id: &str, sampling: Option<SamplingGrant>| {
        let spec = belay_proto::wire::ToolCallSpec {
            tool: "ask".into(),
            tool_version: 1,
            arguments: json!({"prompt": "summarise"}),
            binding: belay_proto::wire::ToolBinding::Mcp(belay_proto::wire::McpBinding {
                server: "everything".into(),
                server_tool: "trigger-sampling-request".into(),
                headers: BTreeMap::new(),
                timeout_ms: 30_000,
            }),
            idempotency_key: format!("run-1/{id}"),
            input: None,
            config_params: Vec::new(),
            result_secrets: Vec::new(),
            variant: None,
            sampling,
            trace: None,
            dispatch_with_claim: false,
            repeat_safety: String::new(),
        };
        belay_proto::v1::Task {
            task_id: id.into(),
            run_id: "run-1".into(),
            tenant: "acme".into(),
            kind: "tool_call".into(),
            attempt: 1,
            lease_ms: 30_000,
            spec_json: serde_json::to_string(&spec).unwrap(),
            idempotency_key: format!("run-1/{id}"),
            dispatched: false,
            lease_from_ms: 0,
        }
    };
    let mut config = belay_worker::WorkerConfig::new(engine.url(), "w-sampling");
    config.claim_wait_ms = 500;
    config.model = model;
    config.mcp = McpConfig {
        servers: BTreeMap::from([("everything".to_owned(), everything_stdio_config())]),
        config: BTreeMap::new(),
    };
    let client = belay_worker::EngineClient::connect_lazy(&engine.url(), "w-sampling").unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(belay_worker::run_with_engine(config, client, async move {
        let _ = stopped.await;
    }));

    // Granted: the result, and beside it what the completion used.
    engine.push(task("t1", Some(grant(2, 50))));
    let report = tokio::time::timeout(GUARD, engine.next_report())
        .await
        .unwrap();
    let common::Report::Complete(done) = report else {
        panic!("{report:?}");
    };
    assert!(
        done.result_json.contains("sampled text"),
        "{}",
        done.result_json
    );
    assert_eq!(
        done.sampling_usage,
        Some(belay_proto::v1::SamplingUsage {
            requests: 1,
            input_tokens: 11,
            output_tokens: 3
        })
    );
    assert_eq!(recorded.lock().unwrap()[0].2["max_tokens"], 50);

    // No grant: a typed refusal, and no usage.
    engine.push(task("t2", None));
    let report = tokio::time::timeout(GUARD, engine.next_report())
        .await
        .unwrap();
    let common::Report::Fail(failed) = report else {
        panic!("{report:?}");
    };
    assert_eq!(failed.class, FailureClass::Rejected as i32);
    assert!(
        failed
            .error
            .contains("MCP sampling) that Belay did not give"),
        "{}",
        failed.error
    );
    assert_eq!(failed.sampling_usage, None);
    assert_eq!(recorded.lock().unwrap().len(), 1);
    // Each report names the definition the call was checked against (the
    // pin the dispatch returned), and a failure its kind: the tool's own.
    assert!(done.mcp_definition_hash.starts_with("sha256:"), "{done:?}");
    assert_eq!(failed.mcp_definition_hash, done.mcp_definition_hash);
    assert_eq!(
        failed.failure_kind,
        belay_proto::v1::ToolFailureKind::ToolError as i32
    );

    // A result the engine refuses: the failure reported instead carries
    // what the completion used, so it is charged all the same.
    engine
        .state
        .lock()
        .unwrap()
        .refuse_completes
        .insert("t3".into());
    engine.push(task("t3", Some(grant(1, 50))));
    let report = tokio::time::timeout(GUARD, engine.next_report())
        .await
        .unwrap();
    let common::Report::Fail(failed) = report else {
        panic!("{report:?}");
    };
    assert_eq!(failed.class, FailureClass::MayHaveActed as i32);
    assert!(
        failed.error.contains("the engine refused the result"),
        "{}",
        failed.error
    );
    assert_eq!(
        failed.sampling_usage,
        Some(belay_proto::v1::SamplingUsage {
            requests: 1,
            input_tokens: 11,
            output_tokens: 3
        })
    );
    assert_eq!(recorded.lock().unwrap().len(), 2);

    let _ = stop.send(());
    tokio::time::timeout(GUARD, worker)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// A local OAuth authorization server (client-credentials grant) and what
/// it issued; the bearer tokens an MCP server in front of it accepts.
#[derive(Clone, Default)]
struct Authority {
    /// Token requests: (Authorization header, form body).
    requests: Arc<Mutex<Vec<(String, String)>>>,
    /// Tokens the resource server accepts now.
    valid: Arc<Mutex<BTreeSet<String>>>,
    /// Issue tokens the resource server does not accept.
    withhold: Arc<Mutex<bool>>,
    /// Metadata documents by path (404 elsewhere).
    metadata: Arc<Mutex<BTreeMap<String, Value>>>,
    /// Paths of the metadata requests, in order.
    asked: Arc<Mutex<Vec<String>>>,
}

/// `GET` of any path: the document `documents` holds for it (404 without
/// one); every path is recorded in `asked`.
async fn metadata_answer(
    uri: axum::http::Uri,
    documents: &Mutex<BTreeMap<String, Value>>,
    asked: &Mutex<Vec<String>>,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let path = uri.path().to_owned();
    asked.lock().unwrap().push(path.clone());
    let document = documents.lock().unwrap().get(&path).cloned();
    match document {
        Some(document) => axum::Json(document).into_response(),
        None => axum::http::StatusCode::NOT_FOUND.into_response(),
    }
}

/// `POST /token`: `tok-<n>` for client `crm-client` / `s3cret` (HTTP
/// Basic, or `client_id` and `client_secret` in the body),
/// `invalid_client` (401) otherwise; any other `GET`: `metadata`. Returns
/// the server's base URL, `http://127.0.0.1:PORT`.
async fn authorization_server(authority: Authority) -> String {
    let metadata = authority.clone();
    let router = axum::Router::new()
        .route(
            "/token",
            axum::routing::post(
                move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                    let authority = authority.clone();
                    async move {
                        let auth = headers
                            .get("authorization")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or_default()
                            .to_owned();
                        let body = String::from_utf8_lossy(&body).into_owned();
                        let n = {
                            let mut requests = authority.requests.lock().unwrap();
                            requests.push((auth.clone(), body.clone()));
                            requests.len()
                        };
                        // base64("crm-client:s3cret")
                        let basic = auth == "Basic Y3JtLWNsaWVudDpzM2NyZXQ=";
                        let post = auth.is_empty()
                            && body.contains("&client_id=crm-client&client_secret=s3cret");
                        if !basic && !post {
                            return (
                                axum::http::StatusCode::UNAUTHORIZED,
                                axum::Json(json!({"error": "invalid_client"})),
                            );
                        }
                        let token = format!("tok-{n}");
                        if !*authority.withhold.lock().unwrap() {
                            authority.valid.lock().unwrap().insert(token.clone());
                        }
                        (
                            axum::http::StatusCode::OK,
                            axum::Json(
                                json!({"access_token": token, "token_type": "Bearer", "expires_in": 3600}),
                            ),
                        )
                    }
                },
            ),
        )
        .fallback(axum::routing::get(move |uri: axum::http::Uri| {
            let metadata = metadata.clone();
            async move { metadata_answer(uri, &metadata.metadata, &metadata.asked).await }
        }));
    format!("http://{}", common::serve(router).await)
}

/// [`authorization_server`]'s token endpoint.
async fn token_endpoint(authority: Authority) -> String {
    format!("{}/token", authorization_server(authority).await)
}

/// What a [`guarded_proxy_with`] answers besides its MCP endpoint.
#[derive(Clone, Default)]
struct Resource {
    /// The `WWW-Authenticate` value of its 401 answers (empty: none).
    challenge: Arc<Mutex<String>>,
    /// Metadata documents by path (404 elsewhere).
    metadata: Arc<Mutex<BTreeMap<String, Value>>>,
    /// Paths of the metadata requests, in order.
    asked: Arc<Mutex<Vec<String>>>,
}

/// An MCP endpoint that demands a valid bearer token (401 with a
/// `WWW-Authenticate` challenge otherwise, as MCP's authorization asks)
/// and passes accepted requests to `upstream`; records the token of each.
async fn guarded_proxy(
    upstream: String,
    authority: Authority,
) -> (String, Arc<Mutex<Vec<String>>>) {
    let resource = Resource::default();
    *resource.challenge.lock().unwrap() = r#"Bearer error="invalid_token", resource_metadata="http://127.0.0.1/.well-known/oauth-protected-resource""#.to_owned();
    guarded_proxy_with(upstream, authority, resource).await
}

/// [`guarded_proxy`] answering with `resource`'s challenge, and with its
/// metadata on any other path.
async fn guarded_proxy_with(
    upstream: String,
    authority: Authority,
    resource: Resource,
) -> (String, Arc<Mutex<Vec<String>>>) {
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let (client, log) = (reqwest::Client::new(), seen.clone());
    let documents = resource.clone();
    let router = axum::Router::new()
        .route(
            "/mcp",
            axum::routing::any(
                move |method: axum::http::Method,
                      headers: axum::http::HeaderMap,
                      body: axum::body::Bytes| {
                    let (client, upstream, log, authority, resource) = (
                        client.clone(),
                        upstream.clone(),
                        log.clone(),
                        authority.clone(),
                        resource.clone(),
                    );
                    async move {
                        let bearer = headers
                            .get("authorization")
                            .and_then(|v| v.to_str().ok())
                            .and_then(|v| v.strip_prefix("Bearer "))
                            .unwrap_or_default()
                            .to_owned();
                        log.lock().unwrap().push(bearer.clone());
                        if !authority.valid.lock().unwrap().contains(&bearer) {
                            let challenge = resource.challenge.lock().unwrap().clone();
                            let mut refused = axum::http::Response::builder().status(401);
                            if !challenge.is_empty() {
                                refused = refused.header("www-authenticate", challenge);
                            }
                            return refused.body(axum::body::Body::empty()).unwrap();
                        }
                        let mut request = client.request(method, &upstream).body(body);
                        for (name, value) in &headers {
                            if name != "host" && name != "content-length" && name != "authorization"
                            {
                                request = request.header(name, value);
                            }
                        }
                        let response = request.send().await.unwrap();
                        let mut builder = axum::http::Response::builder().status(response.status());
                        for (name, value) in response.headers() {
                            if name != "content-length" && name != "transfer-encoding" {
                                builder = builder.header(name, value);
                            }
                        }
                        let chunks = futures_util::stream::unfold(response, |mut r| async move {
                            match r.chunk().await {
                                Ok(Some(chunk)) => Some((Ok::<_, std::io::Error>(chunk), r)),
                                _ => None,
                            }
                        });
                        builder.body(axum::body::Body::from_stream(chunks)).unwrap()
                    }
                },
            ),
        )
        .fallback(axum::routing::get(move |uri: axum::http::Uri| {
            let documents = documents.clone();
            async move { metadata_answer(uri, &documents.metadata, &documents.asked).await }
        }));
    let addr = common::serve(router).await;
    (format!("http://{addr}/mcp"), seen)
}

fn oauth_server(url: String, token_url: &str, secret_name: &str) -> McpServerConfig {
    McpServerConfig::Http(mcp::HttpServerConfig {
        oauth: Some(mcp::OAuthClientConfig {
            token_url: Some(token_url.to_owned()),
            client_id: "{{config.CRM_ID}}".into(),
            client_secret: format!("{{{{config.{secret_name}}}}}"),
            scopes: vec!["mcp:tools".into(), "crm.read".into()],
        }),
        ..match McpServerConfig::http(url) {
            McpServerConfig::Http(h) => h,
            McpServerConfig::Stdio(_) => unreachable!(),
        }
    })
}

#[tokio::test]
async fn an_oauth_server_gets_a_client_credentials_token_cached_and_refreshed_on_401() {
    let everything = everything_http().await;
    let authority = Authority::default();
    let token_url = token_endpoint(authority.clone()).await;
    let (url, seen) = guarded_proxy(everything.url.clone(), authority.clone()).await;
    let vars = [
        ("CRM_ID", "crm-client"),
        ("CRM_SECRET", "s3cret"),
        ("WRONG_SECRET", "nope"),
    ];

    // Without a token the server refuses: a client without `oauth` cannot
    // connect.
    let err = mcp::connect(resolve("crm", McpServerConfig::http(url.clone()), &[]))
        .await
        .err()
        .unwrap();
    assert!(matches!(err, McpError::Connect { .. }), "{err:?}");

    // With client credentials: one token, fetched once, on every request.
    let resolved = resolve(
        "crm",
        oauth_server(url.clone(), &token_url, "CRM_SECRET"),
        &vars,
    );
    assert!(!format!("{resolved:?}").contains("s3cret"));
    let client = mcp::connect(resolved).await.unwrap();
    let mut events = client.events();
    let discovery = client.list_tools().await.unwrap();
    assert!(discovery.tools.iter().any(|t| t.name == "echo"));
    let outcome = client
        .call_tool(CallRequest::new("echo", args(json!({"message": "one"}))))
        .await;
    assert!(text_of(&outcome).contains("one"), "{outcome:?}");
    {
        let requests = authority.requests.lock().unwrap();
        assert_eq!(requests.len(), 1, "{requests:?}");
        // The server's canonical URI as RFC 8707 `resource`.
        assert_eq!(
            requests[0].1,
            format!(
                "grant_type=client_credentials&scope=mcp%3Atools%20crm.read&resource={}",
                form_encoded(&url)
            )
        );
    }
    let before = seen.lock().unwrap().clone();
    assert!(before.len() >= 3, "{before:?}");
    assert!(before[1..].iter().all(|t| t == "tok-1"), "{before:?}");

    // The authorization server revokes it: the next request is answered
    // 401, a new token is fetched once, and the call goes through.
    authority.valid.lock().unwrap().clear();
    let outcome = client
        .call_tool(CallRequest::new("echo", args(json!({"message": "two"}))))
        .await;
    assert!(text_of(&outcome).contains("two"), "{outcome:?}");
    assert_eq!(authority.requests.lock().unwrap().len(), 2);
    let after: Vec<String> = seen.lock().unwrap()[before.len()..].to_vec();
    assert_eq!(
        after.first().map(String::as_str),
        Some("tok-1"),
        "{after:?}"
    );
    assert!(after[1..].iter().all(|t| t == "tok-2"), "{after:?}");
    // Tokens never appear in what the client reports.
    while let Ok(event) = events.try_recv() {
        let text = format!("{event:?}");
        assert!(!text.contains("tok-"), "{text}");
    }
    assert!(!format!("{:?}", client.status()).contains("tok-"));
    client.shutdown().await;

    // A token endpoint that refuses the client: a typed connection error
    // naming the endpoint and its `error`, and the MCP server saw nothing.
    let seen_before = seen.lock().unwrap().len();
    let err = mcp::connect(resolve(
        "crm",
        oauth_server(url.clone(), &token_url, "WRONG_SECRET"),
        &vars,
    ))
    .await
    .err()
    .unwrap();
    let McpError::Authorization { error, .. } = &err else {
        panic!("{err:?}");
    };
    assert!(matches!(**error, AuthorizationError::Token(_)), "{error:?}");
    let message = err.to_string();
    assert!(message.contains(&token_url), "{message}");
    assert!(message.contains("invalid_client"), "{message}");
    assert!(!message.contains("nope"), "{message}");
    assert_eq!(seen.lock().unwrap().len(), seen_before);
    everything.kill().await;
}

/// `text` as `application/x-www-form-urlencoded` writes a URL.
fn form_encoded(text: &str) -> String {
    text.replace(':', "%3A").replace('/', "%2F")
}

/// An HTTP server with `oauth` and neither `token_url` nor scopes: both
/// are discovered.
fn discovering_server(url: String, secret_name: &str) -> McpServerConfig {
    McpServerConfig::Http(mcp::HttpServerConfig {
        oauth: Some(mcp::OAuthClientConfig {
            token_url: None,
            client_id: "{{config.CRM_ID}}".into(),
            client_secret: format!("{{{{config.{secret_name}}}}}"),
            scopes: Vec::new(),
        }),
        ..match McpServerConfig::http(url) {
            McpServerConfig::Http(h) => h,
            McpServerConfig::Stdio(_) => unreachable!(),
        }
    })
}

const OAUTH_VARS: [(&str, &str); 3] = [
    ("CRM_ID", "crm-client"),
    ("CRM_SECRET", "s3cret"),
    ("WRONG_SECRET", "nope"),
];

/// `server` resolved, its OAuth discovery reaching loopback (where the
/// test's servers are).
fn on_loopback(server: McpServerConfig) -> ResolvedServer {
    resolve("crm", server, &OAUTH_VARS).with_network_policy(NetworkPolicy::allowing_loopback())
}

/// The authorization server metadata (RFC 8414) of `issuer`, with its
/// token endpoint at `base`.
fn as_metadata(issuer: &str, base: &str) -> Value {
    json!({
        "issuer": issuer,
        "token_endpoint": format!("{base}/token"),
        "grant_types_supported": ["client_credentials", "authorization_code"],
        "token_endpoint_auth_methods_supported": ["client_secret_basic", "private_key_jwt"],
        "response_types_supported": ["code"],
    })
}

#[tokio::test]
async fn oauth_discovery_from_the_challenge_finds_the_token_endpoint_and_caches_one_token() {
    let everything = everything_http().await;
    let authority = Authority::default();
    let issuer = authorization_server(authority.clone()).await;
    authority.metadata.lock().unwrap().insert(
        "/.well-known/oauth-authorization-server".into(),
        as_metadata(&issuer, &issuer),
    );
    let resource = Resource::default();
    let (url, seen) =
        guarded_proxy_with(everything.url.clone(), authority.clone(), resource.clone()).await;
    let origin = url.trim_end_matches("/mcp").to_owned();
    *resource.challenge.lock().unwrap() = format!(
        r#"Bearer error="invalid_token", resource_metadata="{origin}/prm", scope="mcp:tools crm.read""#
    );
    resource.metadata.lock().unwrap().insert(
        "/prm".into(),
        json!({"resource": url, "authorization_servers": [issuer],
               "scopes_supported": ["not-these"], "bearer_methods_supported": ["header"]}),
    );

    let client = mcp::connect(on_loopback(discovering_server(url.clone(), "CRM_SECRET")))
        .await
        .unwrap();
    let mut events = client.events();
    let discovery = client.list_tools().await.unwrap();
    assert!(discovery.tools.iter().any(|t| t.name == "echo"));
    for message in ["one", "two", "three"] {
        let outcome = client
            .call_tool(CallRequest::new("echo", args(json!({"message": message}))))
            .await;
        assert!(text_of(&outcome).contains(message), "{outcome:?}");
    }
    // One discovery from the advertised URL (no well-known guess), one
    // token for every request, with the challenge's scopes and the
    // server's URI as `resource`, the client authenticated with Basic.
    assert_eq!(*resource.asked.lock().unwrap(), ["/prm"]);
    assert_eq!(
        *authority.asked.lock().unwrap(),
        ["/.well-known/oauth-authorization-server"]
    );
    {
        let requests = authority.requests.lock().unwrap();
        assert_eq!(requests.len(), 1, "{requests:?}");
        assert_eq!(requests[0].0, "Basic Y3JtLWNsaWVudDpzM2NyZXQ=");
        assert_eq!(
            requests[0].1,
            format!(
                "grant_type=client_credentials&scope=mcp%3Atools%20crm.read&resource={}",
                form_encoded(&url)
            )
        );
    }
    let before = seen.lock().unwrap().clone();
    assert_eq!(before[0], "", "the first request goes without a token");
    assert!(before.len() >= 5, "{before:?}");
    assert!(before[1..].iter().all(|t| t == "tok-1"), "{before:?}");

    // Revoked: one new token from the endpoint already known.
    authority.valid.lock().unwrap().clear();
    let outcome = client
        .call_tool(CallRequest::new("echo", args(json!({"message": "four"}))))
        .await;
    assert!(text_of(&outcome).contains("four"), "{outcome:?}");
    assert_eq!(authority.requests.lock().unwrap().len(), 2);
    assert_eq!(resource.asked.lock().unwrap().len(), 1);

    // Fresh tokens refused too: the endpoint is discovered again once,
    // and the call is refused without reaching the tool.
    authority.valid.lock().unwrap().clear();
    *authority.withhold.lock().unwrap() = true;
    let outcome = client
        .call_tool(CallRequest::new("echo", args(json!({"message": "five"}))))
        .await;
    assert_eq!(
        outcome.failure_class(),
        Some(FailureClass::NotSent),
        "{outcome:?}"
    );
    assert_eq!(*resource.asked.lock().unwrap(), ["/prm", "/prm"]);
    assert_eq!(authority.requests.lock().unwrap().len(), 4);

    // Tokens never appear in what the client reports.
    while let Ok(event) = events.try_recv() {
        let text = format!("{event:?}");
        assert!(!text.contains("tok-"), "{text}");
    }
    assert!(!format!("{:?}", client.status()).contains("tok-"));
    client.shutdown().await;
    everything.kill().await;
}

#[tokio::test]
async fn oauth_discovery_falls_back_to_the_well_known_uris() {
    let everything = everything_http().await;
    let authority = Authority::default();
    let base = authorization_server(authority.clone()).await;
    // An issuer with a path, publishing OpenID Connect metadata only, and
    // taking the client's secret in the body only.
    let issuer = format!("{base}/tenant");
    let mut metadata = as_metadata(&issuer, &base);
    metadata["token_endpoint_auth_methods_supported"] = json!(["client_secret_post"]);
    authority
        .metadata
        .lock()
        .unwrap()
        .insert("/.well-known/openid-configuration/tenant".into(), metadata);
    // A 401 without a challenge (so without `resource_metadata`);
    // metadata at the root only.
    let resource = Resource::default();
    let (url, seen) =
        guarded_proxy_with(everything.url.clone(), authority.clone(), resource.clone()).await;
    resource.metadata.lock().unwrap().insert(
        "/.well-known/oauth-protected-resource".into(),
        json!({"resource": url, "authorization_servers": [issuer], "scopes_supported": ["mcp:tools"]}),
    );

    let client = mcp::connect(on_loopback(discovering_server(url.clone(), "CRM_SECRET")))
        .await
        .unwrap();
    for message in ["one", "two"] {
        let outcome = client
            .call_tool(CallRequest::new("echo", args(json!({"message": message}))))
            .await;
        assert!(text_of(&outcome).contains(message), "{outcome:?}");
    }
    assert_eq!(
        *resource.asked.lock().unwrap(),
        [
            "/.well-known/oauth-protected-resource/mcp",
            "/.well-known/oauth-protected-resource"
        ]
    );
    assert_eq!(
        *authority.asked.lock().unwrap(),
        [
            "/.well-known/oauth-authorization-server/tenant",
            "/.well-known/openid-configuration/tenant"
        ]
    );
    {
        let requests = authority.requests.lock().unwrap();
        assert_eq!(requests.len(), 1, "{requests:?}");
        assert_eq!(requests[0].0, "", "no Basic: client_secret_post");
        assert_eq!(
            requests[0].1,
            format!(
                "grant_type=client_credentials&scope=mcp%3Atools&resource={}\
                 &client_id=crm-client&client_secret=s3cret",
                form_encoded(&url)
            )
        );
    }
    assert!(seen.lock().unwrap()[1..].iter().all(|t| t == "tok-1"));
    client.shutdown().await;
    everything.kill().await;
}

/// A refused discovery: the typed error, and nothing but unauthenticated
/// requests reached the MCP endpoint (which has no upstream: no tool ran).
async fn refused_discovery(
    resolved: ResolvedServer,
    seen: &Mutex<Vec<String>>,
) -> AuthorizationError {
    let err = mcp::connect(resolved).await.err().unwrap();
    let McpError::Authorization { error, .. } = err else {
        panic!("{err:?}");
    };
    assert!(
        seen.lock().unwrap().iter().all(String::is_empty),
        "{seen:?}"
    );
    *error
}

#[tokio::test]
async fn oauth_discovery_refuses_mismatched_metadata_and_addresses_the_policy_refuses() {
    let authority = Authority::default();
    let issuer = authorization_server(authority.clone()).await;
    let as_path = "/.well-known/oauth-authorization-server";
    let resource = Resource::default();
    let (url, seen) = guarded_proxy_with(
        format!("http://{}/mcp", common::closed_port()),
        authority.clone(),
        resource.clone(),
    )
    .await;
    let origin = url.trim_end_matches("/mcp").to_owned();
    let port = origin.rsplit(':').next().unwrap().to_owned();
    let challenge = |metadata: &str| {
        *resource.challenge.lock().unwrap() = format!(r#"Bearer resource_metadata="{metadata}""#);
    };
    let set = |documents: &Mutex<BTreeMap<String, Value>>, path: &str, document: Value| {
        documents.lock().unwrap().insert(path.to_owned(), document);
    };
    let server = || on_loopback(discovering_server(url.clone(), "CRM_SECRET"));
    challenge(&format!("{origin}/prm"));

    // Protected-resource metadata for another resource (RFC 9728 §3.3).
    set(
        &resource.metadata,
        "/prm",
        json!({"resource": "https://elsewhere.example/mcp", "authorization_servers": [issuer]}),
    );
    let error = refused_discovery(server(), &seen).await;
    let AuthorizationError::Discovery(DiscoveryError::ResourceMismatch {
        url: at,
        resource: named,
        expected,
    }) = &error
    else {
        panic!("{error:?}");
    };
    assert_eq!(at, &format!("{origin}/prm"));
    assert_eq!(named, "https://elsewhere.example/mcp");
    assert_eq!(expected, &url);
    assert!(
        authority.asked.lock().unwrap().is_empty(),
        "none of it is used"
    );

    // Authorization server metadata for another issuer (RFC 8414 §3.3).
    set(
        &resource.metadata,
        "/prm",
        json!({"resource": url, "authorization_servers": [issuer]}),
    );
    set(
        &authority.metadata,
        as_path,
        as_metadata("https://other-issuer.example", &issuer),
    );
    let error = refused_discovery(server(), &seen).await;
    let AuthorizationError::Discovery(DiscoveryError::IssuerMismatch {
        url: at,
        issuer: named,
        expected,
    }) = &error
    else {
        panic!("{error:?}");
    };
    assert_eq!(at, &format!("{issuer}{as_path}"));
    assert_eq!(named, "https://other-issuer.example");
    assert_eq!(expected, &issuer);

    // No client-credentials grant.
    let mut metadata = as_metadata(&issuer, &issuer);
    metadata["grant_types_supported"] = json!(["authorization_code"]);
    set(&authority.metadata, as_path, metadata);
    let error = refused_discovery(server(), &seen).await;
    assert!(
        matches!(
            &error,
            AuthorizationError::Discovery(DiscoveryError::GrantNotSupported { .. })
        ),
        "{error:?}"
    );
    assert!(error.to_string().contains("client_credentials"), "{error}");
    assert!(authority.requests.lock().unwrap().is_empty());

    // A token endpoint that refuses the client: its `error` (the endpoint
    // was just discovered: not again); the secret is not in the message.
    set(&authority.metadata, as_path, as_metadata(&issuer, &issuer));
    resource.asked.lock().unwrap().clear();
    let error = refused_discovery(
        on_loopback(discovering_server(url.clone(), "WRONG_SECRET")),
        &seen,
    )
    .await;
    let AuthorizationError::Token(token_error) = &error else {
        panic!("{error:?}");
    };
    assert_eq!(token_error.token_url, format!("{issuer}/token"));
    assert!(error.to_string().contains("invalid_client"), "{error}");
    assert!(!error.to_string().contains("nope"), "{error}");
    assert_eq!(*resource.asked.lock().unwrap(), ["/prm"]);
    assert_eq!(authority.requests.lock().unwrap().len(), 1);
    assert!(authority.valid.lock().unwrap().is_empty());

    // A token endpoint the metadata puts on a private network: refused by
    // the address policy, nothing sent.
    let mut metadata = as_metadata(&issuer, &issuer);
    metadata["token_endpoint"] = json!("http://10.0.0.7/token");
    set(&authority.metadata, as_path, metadata);
    let error = refused_discovery(server(), &seen).await;
    let AuthorizationError::Token(token_error) = &error else {
        panic!("{error:?}");
    };
    assert_eq!(token_error.token_url, "http://10.0.0.7/token");
    assert_eq!(
        token_error.refused.as_ref().map(|r| r.range.kind),
        Some(belay_worker::ssrf::RangeKind::Private)
    );
    assert_eq!(authority.requests.lock().unwrap().len(), 1);
    set(&authority.metadata, as_path, as_metadata(&issuer, &issuer));

    // Metadata that is not there, not an object, or too large.
    challenge(&format!("{origin}/missing"));
    let error = refused_discovery(server(), &seen).await;
    assert!(
        matches!(&error, AuthorizationError::Discovery(DiscoveryError::NoMetadata { tried, .. })
            if tried == &[(format!("{origin}/missing"), 404)]),
        "{error:?}"
    );
    challenge(&format!("{origin}/prm"));
    set(&resource.metadata, "/prm", json!(["not", "an", "object"]));
    let error = refused_discovery(server(), &seen).await;
    assert!(
        matches!(&error, AuthorizationError::Discovery(DiscoveryError::BadJson { url: at, .. })
            if at == &format!("{origin}/prm")),
        "{error:?}"
    );
    set(
        &resource.metadata,
        "/prm",
        json!({"resource": url, "authorization_servers": [issuer], "padding": "x".repeat(300 * 1024)}),
    );
    let error = refused_discovery(server(), &seen).await;
    assert!(
        matches!(&error, AuthorizationError::Discovery(DiscoveryError::TooLarge { limit, .. })
            if *limit == belay_worker::oauth_discovery::MAX_METADATA_BYTES),
        "{error:?}"
    );
    set(
        &resource.metadata,
        "/prm",
        json!({"resource": url, "authorization_servers": [issuer]}),
    );

    // The worker's address policy: without loopback allowlisted, metadata
    // on loopback is refused before anything is sent, by IP literal and
    // by a name that resolves there.
    resource.asked.lock().unwrap().clear();
    for (metadata_url, resolved) in [
        (format!("{origin}/prm"), false),
        (format!("http://localhost:{port}/prm"), true),
    ] {
        challenge(&metadata_url);
        let error = refused_discovery(
            resolve(
                "crm",
                discovering_server(url.clone(), "CRM_SECRET"),
                &OAUTH_VARS,
            ),
            &seen,
        )
        .await;
        let AuthorizationError::Discovery(DiscoveryError::Refused { url: at, refused }) = &error
        else {
            panic!("{error:?}");
        };
        assert_eq!(at, &metadata_url);
        assert_eq!(refused.range.kind, belay_worker::ssrf::RangeKind::Loopback);
        assert_eq!(refused.resolved, resolved);
        assert!(
            error.to_string().contains("--allow-private-network"),
            "{error}"
        );
    }
    assert!(
        resource.asked.lock().unwrap().is_empty(),
        "nothing was fetched"
    );

    // Allowlisting loopback lets loopback through, not the cloud metadata
    // service an `authorization_servers` entry points at.
    challenge(&format!("{origin}/prm"));
    set(
        &resource.metadata,
        "/prm",
        json!({"resource": url, "authorization_servers": ["http://169.254.169.254/latest"]}),
    );
    let error = refused_discovery(server(), &seen).await;
    let AuthorizationError::Discovery(DiscoveryError::Refused { url: at, refused }) = &error else {
        panic!("{error:?}");
    };
    assert_eq!(
        at,
        "http://169.254.169.254/.well-known/oauth-authorization-server/latest"
    );
    assert_eq!(refused.range.kind, belay_worker::ssrf::RangeKind::LinkLocal);
}

#[tokio::test]
async fn oauth_discovery_tries_at_most_four_authorization_servers_and_names_each_failure() {
    use belay_worker::oauth_discovery::MAX_AUTHORIZATION_SERVERS;
    let everything = everything_http().await;
    let authority = Authority::default();
    let base = authorization_server(authority.clone()).await;
    // `{base}/good` publishes metadata; `{base}/asN` publish none (404).
    authority.metadata.lock().unwrap().insert(
        "/.well-known/oauth-authorization-server/good".into(),
        as_metadata(&format!("{base}/good"), &base),
    );
    let resource = Resource::default();
    let (url, _seen) =
        guarded_proxy_with(everything.url.clone(), authority.clone(), resource.clone()).await;
    let origin = url.trim_end_matches("/mcp").to_owned();
    *resource.challenge.lock().unwrap() =
        format!(r#"Bearer error="invalid_token", resource_metadata="{origin}/prm""#);
    let list = |unusable: usize, then_good: bool| {
        let mut servers: Vec<String> = (0..unusable).map(|i| format!("{base}/as{i}")).collect();
        if then_good {
            servers.push(format!("{base}/good"));
        }
        resource.metadata.lock().unwrap().insert(
            "/prm".into(),
            json!({"resource": url, "authorization_servers": servers}),
        );
        authority.asked.lock().unwrap().clear();
    };
    let server = || on_loopback(discovering_server(url.clone(), "CRM_SECRET"));
    assert_eq!(MAX_AUTHORIZATION_SERVERS, 4);

    // 300 listed, none usable: four tried (three metadata URLs each, an
    // issuer with a path), and the error names the count and each one.
    list(300, false);
    let err = mcp::connect(server()).await.err().unwrap();
    let message = err.to_string();
    let McpError::Authorization { error, .. } = err else {
        panic!("{err:?}");
    };
    let AuthorizationError::Discovery(DiscoveryError::NoUsableAuthorizationServer {
        url: at,
        listed,
        failures,
    }) = *error
    else {
        panic!("{error:?}");
    };
    assert_eq!(at, format!("{origin}/prm"));
    assert_eq!(listed, 300);
    let tried: Vec<&str> = failures.iter().map(|(issuer, _)| issuer.as_str()).collect();
    let expected: Vec<String> = (0..4).map(|i| format!("{base}/as{i}")).collect();
    assert_eq!(tried, expected);
    for (issuer, failure) in &failures {
        let DiscoveryError::NoMetadata { tried, .. } = failure else {
            panic!("{issuer}: {failure:?}");
        };
        assert_eq!(tried.len(), 3, "{tried:?}");
        assert!(tried.iter().all(|(_, status)| *status == 404), "{tried:?}");
    }
    assert_eq!(authority.asked.lock().unwrap().len(), 4 * 3);
    assert!(
        message.contains(&format!(
            "none of the 4 authorization servers tried (of 300 listed in the protected-resource \
             metadata at {origin}/prm; at most 4 are tried)"
        )),
        "{message}"
    );
    for issuer in &expected {
        assert!(
            message.contains(&format!("`{issuer}`: no authorization server metadata: ")),
            "{message}"
        );
    }
    assert!(!message.contains(&format!("{base}/as4")), "{message}");

    // A usable fifth is not reached; a usable fourth is.
    list(4, true);
    let err = mcp::connect(server()).await.err().unwrap();
    assert!(
        err.to_string()
            .contains("none of the 4 authorization servers tried (of 5 listed"),
        "{err}"
    );
    assert!(authority.requests.lock().unwrap().is_empty());
    list(3, true);
    let client = mcp::connect(server()).await.unwrap();
    let outcome = client
        .call_tool(CallRequest::new("echo", args(json!({"message": "fourth"}))))
        .await;
    assert!(text_of(&outcome).contains("fourth"), "{outcome:?}");
    assert_eq!(authority.asked.lock().unwrap().len(), 3 * 3 + 1);
    client.shutdown().await;
    everything.kill().await;
}

#[tokio::test]
async fn a_server_that_refuses_fresh_tokens_is_an_authorization_error_naming_the_token_endpoint() {
    let everything = everything_http().await;
    let authority = Authority::default();
    let issuer = authorization_server(authority.clone()).await;
    let token_url = format!("{issuer}/token");
    authority.metadata.lock().unwrap().insert(
        "/.well-known/oauth-authorization-server".into(),
        as_metadata(&issuer, &issuer),
    );
    let resource = Resource::default();
    let (url, seen) =
        guarded_proxy_with(everything.url.clone(), authority.clone(), resource.clone()).await;
    let origin = url.trim_end_matches("/mcp").to_owned();
    *resource.challenge.lock().unwrap() =
        format!(r#"Bearer error="invalid_token", resource_metadata="{origin}/prm""#);
    resource.metadata.lock().unwrap().insert(
        "/prm".into(),
        json!({"resource": url, "authorization_servers": [issuer]}),
    );
    // The authorization server issues tokens the MCP server never accepts.
    *authority.withhold.lock().unwrap() = true;

    let refused = |err: McpError| {
        let message = err.to_string();
        let McpError::Authorization { server, error } = err else {
            panic!("{err:?}");
        };
        assert_eq!(server, "crm");
        assert_eq!(
            *error,
            AuthorizationError::TokenRefused {
                resource: url.clone(),
                token_url: token_url.clone(),
                challenge_error: Some("invalid_token".into()),
            }
        );
        assert!(
            message.starts_with(&format!(
                "MCP server `crm`: authorization failed: the MCP server at {url} refused a fresh \
                 access token from {token_url} (HTTP 401, challenge error `invalid_token`)"
            )),
            "{message}"
        );
        assert!(!message.contains("tok-"), "{message}");
        assert!(!message.contains("Transport"), "{message}");
    };

    // A configured token endpoint: the token, one refresh, then the error.
    let err = mcp::connect(resolve(
        "crm",
        oauth_server(url.clone(), &token_url, "CRM_SECRET"),
        &OAUTH_VARS,
    ))
    .await
    .err()
    .unwrap();
    refused(err);
    assert_eq!(authority.requests.lock().unwrap().len(), 2);
    assert_eq!(*seen.lock().unwrap(), ["tok-1", "tok-2"]);

    // A discovered one: the first request without a token, discovery, the
    // token, one refresh, then the error (discovered once: not again).
    seen.lock().unwrap().clear();
    let err = mcp::connect(on_loopback(discovering_server(url.clone(), "CRM_SECRET")))
        .await
        .err()
        .unwrap();
    refused(err);
    assert_eq!(*resource.asked.lock().unwrap(), ["/prm"]);
    assert_eq!(authority.requests.lock().unwrap().len(), 4);
    assert_eq!(*seen.lock().unwrap(), ["", "tok-3", "tok-4"]);

    // Connected, then every fresh token refused: the call is not sent,
    // and says why.
    *authority.withhold.lock().unwrap() = false;
    let client = mcp::connect(resolve(
        "crm",
        oauth_server(url.clone(), &token_url, "CRM_SECRET"),
        &OAUTH_VARS,
    ))
    .await
    .unwrap();
    authority.valid.lock().unwrap().clear();
    *authority.withhold.lock().unwrap() = true;
    let outcome = client
        .call_tool(CallRequest::new("echo", args(json!({"message": "x"}))))
        .await;
    assert_eq!(
        outcome.failure_class(),
        Some(FailureClass::NotSent),
        "{outcome:?}"
    );
    let CallOutcome::Disconnected { reason } = &outcome else {
        panic!("{outcome:?}");
    };
    assert!(
        reason.contains(&format!(
            "the MCP server at {url} refused a fresh access token from {token_url}"
        )),
        "{reason}"
    );
    assert!(!reason.contains("tok-"), "{reason}");
    client.shutdown().await;
    everything.kill().await;
}

#[tokio::test]
async fn resources_are_listed_and_read_with_limits_and_typed_errors() {
    let client = everything_stdio().await;
    let listing = client.list_resources().await.unwrap();
    assert_eq!(listing.server, "everything");
    let uris: BTreeSet<&str> = listing
        .resources
        .iter()
        .filter_map(|r| r["uri"].as_str())
        .collect();
    assert!(
        uris.contains("demo://resource/static/document/features.md"),
        "{uris:?}"
    );
    let templates: BTreeSet<&str> = listing
        .templates
        .iter()
        .filter_map(|t| t["uriTemplate"].as_str())
        .collect();
    assert!(
        templates.contains("demo://resource/dynamic/text/{resourceId}"),
        "{templates:?}"
    );

    // A text resource from a template.
    let outcome = client
        .read_resource(mcp::ReadRequest::new("demo://resource/dynamic/text/3"))
        .await;
    let CallOutcome::Ok(result) = &outcome else {
        panic!("{outcome:?}");
    };
    assert_eq!(result.content.len(), 1, "{result:?}");
    assert_eq!(result.content[0]["uri"], "demo://resource/dynamic/text/3");
    assert_eq!(result.content[0]["mimeType"], "text/plain");
    assert!(
        result.content[0]["text"]
            .as_str()
            .unwrap()
            .starts_with("Resource 3: This is a plaintext resource"),
        "{result:?}"
    );
    assert!(result.truncation.is_none());
    // Cut to the caller's limit, and says so.
    let mut small = mcp::ReadRequest::new("demo://resource/static/document/features.md");
    small.max_result_bytes = 300;
    let CallOutcome::Ok(cut) = client.read_resource(small).await else {
        panic!("not read");
    };
    assert!(cut.truncation.is_some(), "{cut:?}");
    assert!(serde_json::to_string(&cut.content).unwrap().len() <= 300);
    // A resource the server does not have: its JSON-RPC error, typed.
    let outcome = client
        .read_resource(mcp::ReadRequest::new("demo://resource/nope"))
        .await;
    assert!(
        matches!(outcome, CallOutcome::Rejected { .. }),
        "{outcome:?}"
    );
    assert_eq!(outcome.failure_class(), Some(FailureClass::Rejected));
    client.shutdown().await;

    // A server without resources lists none.
    let time = mcp::connect(resolve(
        "time",
        McpServerConfig::stdio(installed("BELAY_MCP_TIME"), vec![]),
        &[],
    ))
    .await
    .unwrap();
    let listing = time.list_resources().await.unwrap();
    assert!(listing.resources.is_empty() && listing.templates.is_empty());
    time.shutdown().await;
}

/// Reads through the worker's tool path a `type: mcp` tool with
/// `resource: template`; also says whether the read was dispatched.
async fn read_through(
    tools: &belay_worker::mcp_tool::McpTools,
    server: &str,
    template: &str,
    arguments: Value,
) -> (belay_worker::mcp_tool::McpCallReport, bool) {
    let task = belay_proto::v1::Task {
        task_id: "task-1".into(),
        run_id: "run-1".into(),
        tenant: "acme".into(),
        kind: "tool_call".into(),
        attempt: 1,
        ..Default::default()
    };
    let binding = belay_proto::wire::McpResourceBinding {
        server: server.into(),
        uri_template: template.into(),
        timeout_ms: 30_000,
    };
    let spec = belay_proto::wire::ToolCallSpec {
        tool: "read_doc".into(),
        tool_version: 1,
        arguments,
        binding: belay_proto::wire::ToolBinding::McpResource(binding.clone()),
        idempotency_key: "run-1/call-1".into(),
        input: None,
        config_params: Vec::new(),
        result_secrets: Vec::new(),
        variant: None,
        sampling: None,
        trace: None,
        dispatch_with_claim: false,
        repeat_safety: String::new(),
    };
    let mut dispatched = false;
    let report = tools
        .read(&task, &spec, &binding, |_| dispatched = true)
        .await;
    (report, dispatched)
}

#[tokio::test]
async fn a_resource_tool_fills_its_uri_template_and_reports_the_contents() {
    let (engine, tools) = mcp_tools(vec![("everything", everything_stdio_config())]).await;
    let template = "demo://resource/dynamic/text/{id}";
    let (report, dispatched) = read_through(&tools, "everything", template, json!({"id": 7})).await;
    let belay_worker::mcp_tool::McpCallReport::Complete(json) = &report else {
        panic!("{report:?}");
    };
    let value: Value = serde_json::from_str(json).unwrap();
    assert_eq!(
        value["contents"][0]["uri"],
        "demo://resource/dynamic/text/7"
    );
    assert!(
        value["contents"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("Resource 7:"),
        "{value}"
    );
    assert!(dispatched);
    assert_eq!(engine.state.lock().unwrap().dispatches.len(), 1);

    // An argument the template needs but the call lacks: refused before
    // dispatch, naming it.
    let (report, dispatched) = read_through(&tools, "everything", template, json!({})).await;
    let belay_worker::mcp_tool::McpCallReport::Fail { class, error, .. } = report else {
        panic!("{report:?}");
    };
    assert_eq!(class, FailureClass::Rejected);
    assert!(error.contains("no argument `id`"), "{error}");
    assert!(!dispatched);
    // A resource the server lacks: dispatched, then its error, REJECTED.
    let (report, _) = read_through(
        &tools,
        "everything",
        "demo://resource/{id}",
        json!({"id": "x y"}),
    )
    .await;
    let belay_worker::mcp_tool::McpCallReport::Fail { class, error, .. } = report else {
        panic!("{report:?}");
    };
    assert_eq!(class, FailureClass::Rejected);
    assert!(
        error.contains(
            "MCP resource `demo://resource/x%20y` of server `everything` could not be read"
        ),
        "{error}"
    );
    // A server this worker lacks: not sent, another worker may have it.
    let (report, dispatched) = read_through(&tools, "elsewhere", template, json!({"id": 1})).await;
    assert!(
        matches!(
            report,
            belay_worker::mcp_tool::McpCallReport::Fail {
                class: FailureClass::NotSent,
                ..
            }
        ),
        "{report:?}"
    );
    assert!(!dispatched);
    tools.shutdown().await;
}

#[tokio::test]
async fn the_worker_lists_a_servers_resources_for_an_operator() {
    let config = std::env::temp_dir().join(format!("belay-mcp-{}.json", uuid::Uuid::new_v4()));
    let document = McpConfig {
        servers: BTreeMap::from([("everything".to_owned(), everything_stdio_config())]),
        config: BTreeMap::new(),
    };
    std::fs::write(&config, serde_json::to_string(&document).unwrap()).unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_belay-worker"))
        .arg("--mcp-config")
        .arg(&config)
        .args(["--list-mcp-resources", "everything"])
        .env("BELAY_ENGINE_URL", "http://127.0.0.1:1")
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listing: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listing["server"], "everything");
    assert!(
        listing["resources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["uri"] == "demo://resource/static/document/features.md"),
        "{listing}"
    );
    // A server that is not configured: a clear error, not a listing.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_belay-worker"))
        .arg("--mcp-config")
        .arg(&config)
        .args(["--list-mcp-resources", "nope"])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no MCP server named `nope` is configured"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_file(&config);
}

/// A plain JSON-RPC stdio server (Python, no SDK) speaking 2025-11-25,
/// written into the test's temp dir: `body` handles one `tools/call`
/// (`name`, `args`, `mid` in scope; `send`, `raw` to answer), after the
/// common `initialize` / `tools/list` handling. Every line it reads is
/// appended to `<script>.seen` (its length and method), so a test can tell
/// what the server received. `tools` are listed with a `text` argument.
fn raw_server(
    tag: &str,
    tools: &[&str],
    before_loop: &str,
    body: &str,
) -> (McpServerConfig, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("belay-mcp-{tag}-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("server.py");
    let seen = dir.join("seen");
    let tools = tools
        .iter()
        .map(|t| format!("{t:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    let indented: String = body.lines().map(|l| format!("        {l}\n")).collect();
    let source = format!(
        r#"import json, os, sys, time
SEEN = {seen:?}
FLAG = {flag:?}
def send(m):
    sys.stdout.write(json.dumps(m) + "\n"); sys.stdout.flush()
def raw(text):
    sys.stdout.write(text + "\n"); sys.stdout.flush()
schema = {{"type": "object", "properties": {{"text": {{"type": "string"}}}}}}
tools = [{{"name": n, "description": n, "inputSchema": schema}} for n in ({tools},)]
{before_loop}
for line in sys.stdin:
    m = json.loads(line)
    method, mid = m.get("method"), m.get("id")
    with open(SEEN, "a") as f:
        f.write(f"{{len(line)}} {{method}}\n")
    if mid is None:
        continue
    if method == "initialize":
        send({{"jsonrpc": "2.0", "id": mid, "result": {{"protocolVersion": "2025-11-25",
              "capabilities": {{"tools": {{}}}}, "serverInfo": {{"name": "raw", "version": "1"}}}}}})
    elif method == "tools/list":
        send({{"jsonrpc": "2.0", "id": mid, "result": {{"tools": tools}}}})
        after_list()
    elif method == "tools/call":
        name, args = m["params"]["name"], m["params"].get("arguments", {{}})
{indented}    else:
        send({{"jsonrpc": "2.0", "id": mid, "error": {{"code": -32601, "message": "unknown"}}}})
"#,
        seen = seen.display().to_string(),
        flag = dir.join("flag").display().to_string(),
    );
    std::fs::write(&script, source).unwrap();
    let mut server = McpServerConfig::stdio(
        installed("BELAY_MCP_PYTHON"),
        vec![script.display().to_string()],
    );
    server.set_restart_delays(50, 1_000);
    (server, seen)
}

/// A request line longer than 1000 bytes the server read (`seen` file).
fn read_a_long_line(seen: &std::path::Path) -> bool {
    std::fs::read_to_string(seen)
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').next().and_then(|n| n.parse::<usize>().ok()) > Some(1000))
}

/// Issue 22, item 1: a stdio server that stops reading its stdin (its
/// first process, right after listing its tools). A 1 MB request cannot be
/// written whole (the pipe fills): the call ends at its timeout as not
/// sent (provably: the server read none of it), and the session is torn
/// down and the server restarted before the next call, which the new
/// process answers at once.
#[tokio::test]
async fn a_request_a_wedged_stdio_server_cannot_take_is_not_sent_and_the_server_is_restarted() {
    let (server, seen) = raw_server(
        "wedged",
        &["echo"],
        "def after_list():\n    if not os.path.exists(FLAG):\n        open(FLAG, \"w\").close()\n        time.sleep(3600)",
        "send({\"jsonrpc\": \"2.0\", \"id\": mid, \"result\": {\"content\": [{\"type\": \"text\", \"text\": args.get(\"text\", \"\")[:10]}]}})",
    );
    let client = mcp::connect(resolve("wedged", server, &[])).await.unwrap();
    client.list_tools().await.unwrap();
    let mut big = CallRequest::new("echo", args(json!({"text": "x".repeat(1 << 20)})));
    big.timeout_ms = 1_500;
    let outcome = tokio::time::timeout(GUARD, client.call_tool(big))
        .await
        .unwrap();
    let CallOutcome::Timeout {
        sent: false,
        detail: Some(detail),
        ..
    } = &outcome
    else {
        panic!("{outcome:?}");
    };
    assert!(detail.contains("not reading its stdin"), "{detail}");
    assert_eq!(outcome.failure_class(), Some(FailureClass::NotSent));
    // The next call goes to the restarted server, within its timeout.
    let mut small = CallRequest::new("echo", args(json!({"text": "hello"})));
    small.timeout_ms = 15_000;
    let outcome = tokio::time::timeout(GUARD, client.call_tool(small))
        .await
        .unwrap();
    assert_eq!(text_of(&outcome), "hello", "{outcome:?}");
    assert!(client.status().generation >= 2, "{:?}", client.status());
    assert!(!read_a_long_line(&seen), "the server read the big request");
    client.shutdown().await;
}

/// Issue 22, item 1: a stdio server that exits before answering
/// `initialize` says that it exited, with its exit status and its last
/// stderr lines, and a call through the worker fails `NOT_SENT` saying so.
#[tokio::test]
async fn a_stdio_server_that_exits_before_the_handshake_says_how_it_exited() {
    let dir = std::env::temp_dir().join(format!("belay-mcp-exits-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("server.py");
    std::fs::write(
        &script,
        "import sys\nsys.stderr.write(\"starting\\n\")\nsys.stderr.write(\"fatal: MY_API_KEY is not set\\n\")\nsys.exit(3)\n",
    )
    .unwrap();
    let mut server = McpServerConfig::stdio(
        installed("BELAY_MCP_PYTHON"),
        vec![script.display().to_string()],
    );
    server.set_restart_delays(50, 1_000);
    let err = match mcp::connect(resolve("exits", server.clone(), &[])).await {
        Err(e) => e,
        Ok(_) => panic!("connected to a server that exits"),
    };
    let McpError::Exited { status, stderr, .. } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(status, "exit status: 3");
    assert_eq!(
        stderr,
        &[
            "starting".to_owned(),
            "fatal: MY_API_KEY is not set".to_owned()
        ]
    );
    assert!(
        err.to_string()
            .contains("exited (exit status: 3) before completing the MCP handshake"),
        "{err}"
    );
    let (_engine, tools) = mcp_tools(vec![("exits", server)]).await;
    let (report, dispatched) = call_through(&tools, "exits", "echo", json!({})).await;
    let belay_worker::mcp_tool::McpCallReport::Fail { class, error, .. } = report else {
        panic!("{report:?}");
    };
    assert_eq!(class, FailureClass::NotSent);
    assert!(!dispatched);
    assert!(
        error.contains("exited (exit status: 3)") && error.contains("MY_API_KEY is not set"),
        "{error}"
    );
    tools.shutdown().await;
}

/// Issue 22, items 4 and 7: what a server answers, kept apart. A lone
/// surrogate escape is replaced with U+FFFD and the answer read; an answer
/// that cannot be decoded fails its call at once, definitely (never
/// waiting for its timeout, never retried as lost), and the connection
/// stays usable; a JSON-RPC error is the protocol's answer (repeat safety
/// decides, unless it refused the request before running it), `isError`
/// the tool's own.
#[tokio::test]
async fn answers_are_repaired_undecodable_protocol_errors_or_tool_errors() {
    let (server, _) = raw_server(
        "odd",
        &[
            "surrogate",
            "garbled",
            "rpc_error",
            "bad_params",
            "tool_error",
        ],
        "def after_list():\n    pass",
        r#"if name == "surrogate":
    send({"jsonrpc": "2.0", "id": mid, "result": {"content": [{"type": "text", "text": "x\ud83dy"}]}})
elif name == "garbled":
    raw('{"jsonrpc":"2.0","id":' + json.dumps(mid) + ',"result":{"content":[{"type":"text","text":"cut')
elif name == "rpc_error":
    send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32603, "message": "database unavailable"}})
elif name == "bad_params":
    send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32602, "message": "bad text"}})
else:
    send({"jsonrpc": "2.0", "id": mid, "result": {"isError": True, "content": [{"type": "text", "text": "no such city"}]}})"#,
    );
    let client = mcp::connect(resolve("odd", server.clone(), &[]))
        .await
        .unwrap();
    let call = |tool: &str| {
        let mut call = CallRequest::new(tool, Map::new());
        // Far longer than the test may take: nothing may wait for it.
        call.timeout_ms = 3_600_000;
        call
    };
    let outcome = tokio::time::timeout(GUARD, client.call_tool(call("surrogate")))
        .await
        .unwrap();
    assert_eq!(text_of(&outcome), "x\u{FFFD}y", "{outcome:?}");
    let outcome = tokio::time::timeout(GUARD, client.call_tool(call("garbled")))
        .await
        .unwrap();
    assert!(
        matches!(&outcome, CallOutcome::Undecodable { reason } if reason.contains("EOF")),
        "{outcome:?}"
    );
    assert_eq!(outcome.failure_class(), Some(FailureClass::Rejected));
    assert_eq!(
        mcp::failure_kind(&outcome),
        Some(mcp::ToolFailureKind::ProtocolError)
    );
    let outcome = client.call_tool(call("rpc_error")).await;
    assert!(
        matches!(&outcome, CallOutcome::Rejected { code: -32603, .. }),
        "{outcome:?}"
    );
    assert_eq!(outcome.failure_class(), Some(FailureClass::MayHaveActed));
    let outcome = client.call_tool(call("bad_params")).await;
    assert_eq!(
        outcome.failure_class(),
        Some(FailureClass::Rejected),
        "{outcome:?}"
    );
    let outcome = client.call_tool(call("tool_error")).await;
    assert!(matches!(outcome, CallOutcome::ToolError(_)), "{outcome:?}");
    assert_eq!(
        mcp::failure_kind(&outcome),
        Some(mcp::ToolFailureKind::ToolError)
    );
    // Still the first connection: nothing was lost.
    assert_eq!(client.status().generation, 1);
    client.shutdown().await;

    // Through the worker, each report carries its kind.
    let (_engine, tools) = mcp_tools(vec![("odd", server)]).await;
    for (tool, class, kind) in [
        (
            "rpc_error",
            FailureClass::MayHaveActed,
            mcp::ToolFailureKind::ProtocolError,
        ),
        (
            "garbled",
            FailureClass::Rejected,
            mcp::ToolFailureKind::ProtocolError,
        ),
        (
            "tool_error",
            FailureClass::Rejected,
            mcp::ToolFailureKind::ToolError,
        ),
    ] {
        let (report, dispatched) = call_through(&tools, "odd", tool, json!({})).await;
        assert!(dispatched);
        assert!(
            matches!(&report, belay_worker::mcp_tool::McpCallReport::Fail { class: c, kind: Some(k), .. } if *c == class && *k == kind),
            "{tool}: {report:?}"
        );
    }
    tools.shutdown().await;
}

/// A pass-through proxy in front of `upstream` that answers a `tools/call`
/// of `echo` with the message `garble` with a cut-off JSON body (status
/// 200, `application/json`), as a server whose answer broke would; with
/// `garble-sse` the same inside an SSE event, with `surrogate-sse` an SSE
/// event whose text ends in a lone surrogate escape.
async fn garbling_proxy(upstream: String) -> String {
    let client = reqwest::Client::new();
    let router = axum::Router::new().route(
        "/mcp",
        axum::routing::any(
            move |method: axum::http::Method,
                  headers: axum::http::HeaderMap,
                  body: axum::body::Bytes| {
                let (client, upstream) = (client.clone(), upstream.clone());
                async move {
                    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    let message = request["params"]["arguments"]["message"].clone();
                    let cut = format!(
                        r#"{{"jsonrpc":"2.0","id":{},"result":{{"content":[{{"type":"text","text":"cut"#,
                        request["id"]
                    );
                    let lone = format!(
                        r#"{{"jsonrpc":"2.0","id":{},"result":{{"content":[{{"type":"text","text":"half \ud83d"}}]}}}}"#,
                        request["id"]
                    );
                    let answer = match message.as_str() {
                        Some("garble") => Some(("application/json", cut)),
                        Some("garble-sse") => {
                            Some(("text/event-stream", format!("event: message\ndata: {cut}\n\n")))
                        }
                        Some("surrogate-sse") => {
                            Some(("text/event-stream", format!("event: message\ndata: {lone}\n\n")))
                        }
                        _ => None,
                    };
                    if let Some((kind, text)) = answer {
                        return axum::http::Response::builder()
                            .status(200)
                            .header("content-type", kind)
                            .body(axum::body::Body::from(text))
                            .unwrap();
                    }
                    let mut forwarded = client.request(method, &upstream).body(body);
                    for (name, value) in &headers {
                        if name != "host" && name != "content-length" {
                            forwarded = forwarded.header(name, value);
                        }
                    }
                    let response = forwarded.send().await.unwrap();
                    let mut builder = axum::http::Response::builder().status(response.status());
                    for (name, value) in response.headers() {
                        if name != "content-length" && name != "transfer-encoding" {
                            builder = builder.header(name, value);
                        }
                    }
                    let bytes = response.bytes().await.unwrap_or_default();
                    builder.body(axum::body::Body::from(bytes)).unwrap()
                }
            },
        ),
    );
    format!("http://{}/mcp", common::serve(router).await)
}

/// Issue 22, item 7, over Streamable HTTP: an answer that arrived but is
/// not a JSON-RPC message, as a JSON body or as an SSE event, fails its
/// call at once as undecodable (a definite failure), not as an answer lost
/// after sending; a lone surrogate in an SSE event is repaired.
#[tokio::test]
async fn an_undecodable_http_answer_fails_its_call_at_once_not_as_lost() {
    let everything = everything_http().await;
    let url = garbling_proxy(everything.url.clone()).await;
    let client = mcp::connect(resolve("garbled", McpServerConfig::http(url), &[]))
        .await
        .unwrap();
    // A cut-off JSON answer, and the same inside an SSE stream.
    for message in ["garble", "garble-sse"] {
        let mut call = CallRequest::new("echo", args(json!({"message": message})));
        call.timeout_ms = 3_600_000;
        let outcome = tokio::time::timeout(GUARD, client.call_tool(call))
            .await
            .unwrap();
        assert!(
            matches!(&outcome, CallOutcome::Undecodable { reason } if reason.contains("could not parse")),
            "{message}: {outcome:?}"
        );
        assert_eq!(outcome.failure_class(), Some(FailureClass::Rejected));
    }
    // A lone surrogate inside an SSE event is repaired, as on stdio.
    let mut call = CallRequest::new("echo", args(json!({"message": "surrogate-sse"})));
    call.timeout_ms = 3_600_000;
    let outcome = tokio::time::timeout(GUARD, client.call_tool(call))
        .await
        .unwrap();
    assert!(text_of(&outcome).contains("half \u{fffd}"), "{outcome:?}");
    // The session is still good.
    let outcome = client
        .call_tool(CallRequest::new("echo", args(json!({"message": "fine"}))))
        .await;
    assert!(text_of(&outcome).contains("fine"), "{outcome:?}");
    client.shutdown().await;
    everything.kill().await;
}
