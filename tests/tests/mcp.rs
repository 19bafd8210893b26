//! MCP tools end to end: the real engine and worker binaries, the scripted
//! model, and real, unmodified MCP servers installed by `.ci/mcp-servers.sh`
//! (`@modelcontextprotocol/server-everything` over stdio and over Streamable
//! HTTP, `mcp-server-time` over stdio).
//!
//! - an agent run calls MCP tools (structured output, content blocks, an
//!   `isError` result the model is told about) and completes;
//! - a tool whose definition changed (the time server restarted in another
//!   time zone) is refused until an operator accepts the new definition;
//! - a server killed mid-call: the call may have acted, so its repeat safety
//!   (`reconcile`) makes it an uncertain outcome an operator resolves; the
//!   server comes back and later calls go through;
//! - a tool asking a person for input mid-call (elicitation) waits durably
//!   for `ProvideToolInput`, then runs again with the answer;
//! - Belay as an MCP server (the engine's `mcp-server` feature, on in this
//!   workspace's build): the `mcp` Python package lists and calls the
//!   onboarding agent's workflow; tokens, `Origin` and `Host` are checked.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use belay_sdk::StartOptions;
use belay_tests::{DbBackend, EngineOpts, Env, dispatch_counts, mcp_server, of_kind, repo_root};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;

const T: Duration = Duration::from_secs(90);

/// Registers the MCP fixtures and grants the tenant `mcp.use`.
async fn setup(env: &Env) -> Result<()> {
    let client = env.client(0)?;
    client
        .register_paths(&[repo_root().join("tests/mcp-fixtures")])
        .await?;
    client
        .set_tenant_grants(vec![
            "crm.read".into(),
            "crm.write".into(),
            "email.send".into(),
            "mcp.use".into(),
        ])
        .await?;
    Ok(())
}

async fn start(env: &Env, workflow: &str, key: &str) -> Result<String> {
    let (run, _) = env
        .client(0)?
        .start_run(
            workflow,
            &json!({}),
            StartOptions {
                idempotency_key: key.into(),
                caller: "test".into(),
                caller_grants: vec!["mcp.use".into()],
            },
        )
        .await?;
    Ok(run.run_id)
}

/// Waits for the run's end and returns its output, checking it completed.
async fn completed(env: &Env, run: &str) -> Result<Value> {
    env.wait_for(0, run, "run_completed", T).await?;
    let done = env.client(0)?.get_run(run).await?;
    ensure!(done.status == "completed", "{done:?}");
    Ok(serde_json::from_str(&done.output_json)?)
}

fn errors_of(events: &[Value]) -> Vec<String> {
    of_kind(events, "tool_call_failed")
        .iter()
        .map(|e| e["error"].as_str().unwrap_or_default().to_owned())
        .collect()
}

async fn an_agent_run_calls_mcp_tools_over_stdio_and_completes(backend: DbBackend) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    setup(&env).await?;
    let everything = mcp_server("BELAY_MCP_EVERYTHING")?;
    env.start_worker_with_mcp(
        0,
        &json!({"servers": {"everything": {"transport": "stdio", "command": everything, "args": ["stdio"]}}}),
    )
    .await?;
    let run = start(&env, "mcp_everything", "mcp-1").await?;
    let output = completed(&env, &run).await?;
    // The structured result and the content blocks reached the model.
    ensure!(
        output == json!({"temperature": 36, "echo": "Echo: it is Light rain / drizzle"}),
        "{output}"
    );
    let events = env.events(&run).await?;
    let completed_results: Vec<&Value> = of_kind(&events, "tool_call_completed")
        .into_iter()
        .map(|e| &e["result"])
        .collect();
    ensure!(
        completed_results
            == vec![
                &json!({"temperature": 36, "conditions": "Light rain / drizzle", "humidity": 82}),
                &json!([{"type": "text", "text": "Echo: it is Light rain / drizzle"}]),
            ],
        "{completed_results:?}"
    );
    // The isError result is a tool failure, never a success, and the model
    // is told (the last model call's transcript carries it).
    let errors = errors_of(&events);
    ensure!(
        errors.len() == 1
            && errors[0]
                .contains("`get-resource-reference` of server `everything` reported an error")
            && errors[0].contains("Invalid resourceId"),
        "{errors:?}"
    );
    let last_model = of_kind(&events, "model_call_scheduled")
        .last()
        .and_then(|e| e["call_id"].as_str())
        .ok_or_else(|| anyhow!("no model call"))?
        .to_owned();
    let spec = env.db.task_spec(&run, &last_model).await?;
    let told = spec["messages"].as_array().into_iter().flatten().any(|m| {
        m["role"] == "tool"
            && m["content"]
                .as_str()
                .is_some_and(|c| c.starts_with("error:") && c.contains("Invalid resourceId"))
    });
    ensure!(told, "the model was not told: {spec}");
    // One dispatch per call.
    let counts = dispatch_counts(&events);
    ensure!(
        counts.len() == 3 && counts.values().all(|n| *n == 1),
        "{counts:?}"
    );

    // The worker reported the server's tools; the three used ones are
    // pinned for the tenant on first use, the others not yet.
    let (status, page) = env
        .admin(
            0,
            reqwest::Method::GET,
            "/mcp-tools?server=everything",
            None,
        )
        .await?;
    ensure!(status == 200, "{status} {page}");
    let items = page["items"].as_array().cloned().unwrap_or_default();
    let status_of = |tool: &str| {
        items
            .iter()
            .find(|i| i["tool"] == tool)
            .map(|i| i["status"].clone())
    };
    for tool in ["echo", "get-structured-content", "get-resource-reference"] {
        ensure!(status_of(tool) == Some(json!("pinned")), "{tool}: {page}");
    }
    ensure!(status_of("get-sum") == Some(json!("unpinned")), "{page}");
    let echo = items
        .iter()
        .find(|i| i["tool"] == "echo")
        .ok_or_else(|| anyhow!("no echo"))?;
    ensure!(
        echo["pinned"]["accepted_by"] == "first use (worker test-worker/worker0)",
        "{echo}"
    );
    ensure!(
        echo["listed"]["reported_by"] == "test-worker/worker0"
            && echo["listed"]["definition"]["input_schema"]["type"] == "object",
        "{echo}"
    );
    env.stop().await
}

async fn a_changed_definition_is_refused_until_an_operator_accepts_it(
    backend: DbBackend,
) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    setup(&env).await?;
    // The time server names its local time zone in its tool's argument
    // descriptions: restarted in another zone, its definition changes. The
    // wrapper records the server's pid (`exec` keeps it).
    let dir = std::env::temp_dir().join(format!("belay-mcp-time-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir)?;
    let zone_file = dir.join("zone");
    let pid_file = dir.join("pid");
    std::fs::write(&zone_file, "UTC")?;
    env.start_worker_with_mcp(
        0,
        &json!({"servers": {"time": {
            "transport": "stdio",
            "command": "/bin/sh",
            "args": ["-c", r#"echo $$ > "$PID_FILE"; exec "$TIME_SERVER" --local-timezone "$(cat "$ZONE_FILE")""#],
            "env": {
                "TIME_SERVER": mcp_server("BELAY_MCP_TIME")?,
                "ZONE_FILE": zone_file.display().to_string(),
                "PID_FILE": pid_file.display().to_string(),
            },
            "restart_min_delay_ms": 50,
            "restart_max_delay_ms": 1000,
        }}}),
    )
    .await?;
    let tool_path = "/mcp-tools/time/get_current_time";

    // First call: pinned on first use, and it goes through.
    let first = start(&env, "mcp_clock", "clock-1").await?;
    completed(&env, &first).await?;
    let events = env.events(&first).await?;
    ensure!(
        of_kind(&events, "tool_call_completed").len() == 1,
        "{events:?}"
    );
    let (_, tool) = env.admin(0, reqwest::Method::GET, tool_path, None).await?;
    ensure!(tool["status"] == "pinned", "{tool}");
    let pinned = tool["pinned"]["definition_hash"]
        .as_str()
        .ok_or_else(|| anyhow!("no pin: {tool}"))?
        .to_owned();

    // The server dies and comes back in another zone.
    std::fs::write(&zone_file, "Europe/Paris")?;
    let pid: i32 = std::fs::read_to_string(&pid_file)?.trim().parse()?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )?;

    // The next call is refused before anything is sent, naming the change;
    // the model is told and the run goes on.
    let second = start(&env, "mcp_clock", "clock-2").await?;
    completed(&env, &second).await?;
    let events = env.events(&second).await?;
    let errors = errors_of(&events);
    ensure!(
        errors.len() == 1
            && errors[0].contains("changed")
            && errors[0].contains(&pinned)
            && errors[0].contains("mcp-tools/time/get_current_time/accept"),
        "{errors:?}"
    );
    ensure!(
        of_kind(&events, "tool_call_completed").is_empty(),
        "{events:?}"
    );
    // The operator sees the change (reported before the failure was).
    let (_, changed) = env
        .admin(0, reqwest::Method::GET, "/mcp-tools?status=changed", None)
        .await?;
    let items = changed["items"].as_array().cloned().unwrap_or_default();
    ensure!(
        items.len() == 1 && items[0]["tool"] == "get_current_time",
        "{changed}"
    );
    let listed = items[0]["listed"]["definition_hash"]
        .as_str()
        .ok_or_else(|| anyhow!("no listing: {changed}"))?
        .to_owned();
    ensure!(listed != pinned, "{changed}");
    ensure!(
        items[0]["listed"]["definition"]
            .to_string()
            .contains("Europe/Paris"),
        "{changed}"
    );
    ensure!(errors[0].contains(&listed), "{errors:?}");

    // Refused again until accepted.
    let third = start(&env, "mcp_clock", "clock-3").await?;
    completed(&env, &third).await?;
    ensure!(
        errors_of(&env.events(&third).await?).len() == 1,
        "still refused"
    );

    // (Through the SDK's admin client, as `belay` would.)
    let admin = belay_sdk::admin::AdminClient::new(
        env.engines[0].admin_url(),
        belay_tests::ADMIN_TOKEN,
        &env.tenant,
    )?;
    let accepted = admin
        .accept_mcp_tool(
            "time",
            "get_current_time",
            &listed,
            "the zone moved to Paris",
            Some("alice"),
        )
        .await?;
    ensure!(
        accepted["pinned"]["accepted_by"] == "ops/alice",
        "{accepted}"
    );
    ensure!(
        accepted["status"] == "pinned" && accepted["pinned"]["previous_hash"] == pinned.as_str(),
        "{accepted}"
    );
    let fourth = start(&env, "mcp_clock", "clock-4").await?;
    completed(&env, &fourth).await?;
    let events = env.events(&fourth).await?;
    ensure!(errors_of(&events).is_empty(), "{events:?}");
    ensure!(
        of_kind(&events, "tool_call_completed").len() == 1,
        "{events:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    env.stop().await
}

/// server-everything's Streamable HTTP mode on `port`; killed when dropped.
async fn everything_http(port: u16) -> Result<tokio::process::Child> {
    let mut child = tokio::process::Command::new(mcp_server("BELAY_MCP_EVERYTHING")?)
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let stderr = child.stderr.take().ok_or_else(|| anyhow!("no stderr"))?;
    let mut lines = BufReader::new(stderr).lines();
    tokio::time::timeout(T, async {
        while let Some(line) = lines.next_line().await? {
            if line.contains("listening on port") {
                return Ok(());
            }
        }
        Err(anyhow!("server-everything exited before listening"))
    })
    .await
    .context("server-everything did not listen")??;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(child)
}

/// A request the proxy forwarded.
#[derive(Debug, Clone)]
struct Seen {
    headers: axum::http::HeaderMap,
    body: String,
}

/// A pass-through proxy in front of an MCP server over Streamable HTTP: it
/// records every request, and sends on the channel each time the server
/// answered a `tools/call` of `tool` (the call reached it). When the server
/// dies mid-answer the proxy breaks the connection, as the server would.
async fn watching_proxy(
    upstream: String,
    tool: &'static str,
) -> Result<(String, mpsc::UnboundedReceiver<()>, Arc<Mutex<Vec<Seen>>>)> {
    let (reached, rx) = mpsc::unbounded_channel();
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let log = Arc::clone(&seen);
    let client = reqwest::Client::new();
    let router = axum::Router::new().route(
        "/mcp",
        axum::routing::any(
            move |method: axum::http::Method,
                  headers: axum::http::HeaderMap,
                  body: axum::body::Bytes| {
                let (client, upstream, reached, log) = (
                    client.clone(),
                    upstream.clone(),
                    reached.clone(),
                    log.clone(),
                );
                async move {
                    let text = String::from_utf8_lossy(&body).into_owned();
                    let watched = text.contains("\"tools/call\"") && text.contains(tool);
                    if let Ok(mut log) = log.lock() {
                        log.push(Seen {
                            headers: headers.clone(),
                            body: text,
                        });
                    }
                    let mut request = client.request(method, &upstream).body(body);
                    for (name, value) in &headers {
                        if name != "host" && name != "content-length" {
                            request = request.header(name, value);
                        }
                    }
                    let response = match request.send().await {
                        Ok(r) => r,
                        Err(e) => {
                            return axum::http::Response::builder()
                                .status(502)
                                .body(axum::body::Body::from(e.to_string()))
                                .unwrap_or_default();
                        }
                    };
                    if watched {
                        let _ = reached.send(());
                    }
                    let mut builder = axum::http::Response::builder().status(response.status());
                    for (name, value) in response.headers() {
                        if name != "content-length" && name != "transfer-encoding" {
                            builder = builder.header(name, value);
                        }
                    }
                    let chunks = futures_util::stream::unfold(Some(response), |r| async move {
                        let mut r = r?;
                        match r.chunk().await {
                            Ok(Some(chunk)) => Some((Ok::<_, std::io::Error>(chunk), Some(r))),
                            Ok(None) => None,
                            // The server died mid-answer: break the connection.
                            Err(e) => Some((Err(std::io::Error::other(e.to_string())), None)),
                        }
                    });
                    builder
                        .body(axum::body::Body::from_stream(chunks))
                        .unwrap_or_default()
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok((format!("http://{addr}/mcp"), rx, seen))
}

async fn a_server_killed_mid_call_is_handled_by_repeat_safety(backend: DbBackend) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    setup(&env).await?;
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0")?;
        probe.local_addr()?.port()
    };
    let mut server = everything_http(port).await?;
    let (proxy, mut reached, seen) = watching_proxy(
        format!("http://127.0.0.1:{port}/mcp"),
        "trigger-long-running-operation",
    )
    .await?;
    env.start_worker_with_mcp(
        0,
        &json!({
            "servers": {"everything-http": {
                "transport": "http",
                "url": proxy,
                "restart_min_delay_ms": 50,
                "restart_max_delay_ms": 500,
            }},
            "config": {"TEST_HEADER": "from-config"},
        }),
    )
    .await?;

    // The long operation reaches the server; the server is killed.
    let run = start(&env, "mcp_slow", "slow-1").await?;
    tokio::time::timeout(T, reached.recv())
        .await
        .context("the call never reached the server")?
        .ok_or_else(|| anyhow!("proxy gone"))?;
    server.kill().await?;

    // It may have acted and is `reconcile`: an uncertain outcome, the run
    // paused, the call dispatched exactly once.
    env.wait_for(0, &run, "uncertain_outcome_recorded", T)
        .await?;
    let paused = env.client(0)?.get_run(&run).await?;
    ensure!(paused.status == "paused", "{paused:?}");
    let rows = env.uncertain_rows(&run).await?;
    ensure!(rows.len() == 1, "{rows:?}");
    ensure!(rows[0]["tool"] == "slow_operation", "{rows:?}");
    let reason = rows[0]["reason"].as_str().unwrap_or_default();
    ensure!(
        reason.contains("may have acted") && reason.contains("trigger-long-running-operation"),
        "{rows:?}"
    );
    let classes: Vec<&Value> = rows[0]["attempts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| &a["class"])
        .filter(|c| !c.is_null())
        .collect();
    ensure!(classes == vec![&json!("may_have_acted")], "{rows:?}");
    let events = env.events(&run).await?;
    ensure!(
        dispatch_counts(&events).values().all(|n| *n == 1),
        "{events:?}"
    );

    // The server comes back on its port; the operator resolves the record.
    let _server = everything_http(port).await?;
    let id = rows[0]["uncertain_id"].as_str().unwrap_or_default();
    let (status, body) = env
        .admin(
            0,
            reqwest::Method::POST,
            &format!("/uncertain-outcomes/{id}/resolve"),
            Some(json!({"resolution": "failed", "error": "the operation was interrupted; not repeated", "reason": "server killed mid-call"})),
        )
        .await?;
    ensure!(status == 200, "{status} {body}");
    let output = completed(&env, &run).await?;
    ensure!(output == json!({"done": true}), "{output}");
    let events = env.events(&run).await?;
    ensure!(
        dispatch_counts(&events).values().all(|n| *n == 1),
        "never repeated: {events:?}"
    );

    // Later calls reach the restarted server, with the per-call header's
    // `{{config.X}}` resolved by the worker.
    let again = start(&env, "mcp_echo_http", "echo-1").await?;
    let output = completed(&env, &again).await?;
    ensure!(output == json!({"echo": "Echo: back again"}), "{output}");
    let seen = seen.lock().map_err(|_| anyhow!("poisoned"))?.clone();
    let call = seen
        .iter()
        .find(|s| s.body.contains("\"tools/call\"") && s.body.contains("back again"))
        .ok_or_else(|| anyhow!("no echo call seen"))?;
    ensure!(
        call.headers
            .get("x-belay-test")
            .is_some_and(|v| v == "from-config"),
        "{call:?}"
    );
    ensure!(
        call.body.contains(&format!(
            "\"io.belay/idempotency-key\":\"{again}/agent.t1\""
        )),
        "{call:?}"
    );
    env.stop().await
}

/// Belay's MCP endpoint token of the Python client.
const MCP_TOKEN: &str = "py-client-token-0123456789";

async fn a_standard_mcp_client_lists_and_calls_a_belay_agent(backend: DbBackend) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    env.start_worker(0).await?;
    // The onboarding agent's workflow, served as an MCP tool by a second
    // engine on the same database.
    let mcp = env
        .start_engine_with(
            &[
                "--mcp-listen".into(),
                "127.0.0.1:0".into(),
                "--mcp-tenant".into(),
                env.tenant.clone(),
                "--mcp-workflows".into(),
                "onboarding_express".into(),
                "--mcp-tokens".into(),
                format!("py:{MCP_TOKEN}:{}", env.tenant),
                "--mcp-caller-grants".into(),
                "crm.read,crm.write,email.send".into(),
            ],
            1,
        )
        .await?;
    let url = env.engines[mcp]
        .urls
        .get(3)
        .cloned()
        .ok_or_else(|| anyhow!("the engine printed no MCP URL"))?;

    // What a client without a valid token, from a browser page of another
    // origin, or through a rebinding host name gets: refused, nothing run.
    let http = reqwest::Client::new();
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "probe", "version": "1"}}});
    let probe = |token: Option<&str>, header: Option<(&'static str, &'static str)>| {
        let mut request = http
            .post(&url)
            .header("accept", "application/json, text/event-stream")
            .json(&initialize);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some((name, value)) = header {
            request = request.header(name, value);
        }
        request.send()
    };
    ensure!(probe(None, None).await?.status() == 401);
    ensure!(probe(Some("wrong-token-0123456789"), None).await?.status() == 401);
    let origin = probe(Some(MCP_TOKEN), Some(("origin", "https://evil.example"))).await?;
    ensure!(origin.status() == 403, "{}", origin.status());
    let host = probe(Some(MCP_TOKEN), Some(("host", "evil.example"))).await?;
    ensure!(host.status().is_client_error(), "{}", host.status());
    ensure!(env.db.count_runs().await? == 0);

    let python = mcp_server("BELAY_MCP_PYTHON")?;
    let script = repo_root().join("tests/mcp-fixtures/mcp_client.py");
    let input = json!({"email": "grace@example.com", "name": "Grace Hopper", "plan": "pro"});
    let out = tokio::time::timeout(
        T,
        tokio::process::Command::new(python)
            .arg(&script)
            .args([
                url.as_str(),
                MCP_TOKEN,
                "onboarding_express",
                &input.to_string(),
                "mcp-onboarding-1",
            ])
            .output(),
    )
    .await
    .context("the Python client did not finish")??;
    ensure!(
        out.status.success(),
        "the Python client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value = serde_json::from_slice(&out.stdout)
        .with_context(|| String::from_utf8_lossy(&out.stdout).into_owned())?;

    // Listed: the workflow (its input schema) and the run status tool.
    let tools = seen["tools"].as_array().cloned().unwrap_or_default();
    let names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
    ensure!(
        names == ["onboarding_express", "belay_run_status"],
        "{seen}"
    );
    ensure!(
        tools[0]["input_schema"]["required"] == json!(["email", "name"]),
        "{seen}"
    );
    ensure!(seen["server"] == "belay", "{seen}");

    // Called: a durable run of the agent, its output as the result.
    let first = &seen["first"];
    ensure!(first["isError"] != true, "{seen}");
    let output = &first["structuredContent"];
    ensure!(
        output["status"] == "onboarded"
            && output["account_id"]
                .as_str()
                .is_some_and(|a| a.starts_with("acct_")),
        "{seen}"
    );
    let run_of = |result: &Value| {
        result["_meta"]["io.belay/run-id"]
            .as_str()
            .map(str::to_owned)
    };
    let run = run_of(first).ok_or_else(|| anyhow!("no run id: {seen}"))?;
    // The same idempotency key is the same run; without one, a new run.
    ensure!(run_of(&seen["again"]) == Some(run.clone()), "{seen}");
    ensure!(seen["again"]["structuredContent"] == *output, "{seen}");
    let other = run_of(&seen["other"]).ok_or_else(|| anyhow!("no run id: {seen}"))?;
    ensure!(other != run, "{seen}");
    ensure!(env.db.count_runs().await? == 2);
    let started = env.client(0)?.get_run(&run).await?;
    ensure!(
        started.status == "completed"
            && started.caller == "mcp:py"
            && started.idempotency_key == "mcp/py/key/mcp-onboarding-1",
        "{started:?}"
    );
    ensure!(
        serde_json::from_str::<Value>(&started.input_json)? == input,
        "{started:?}"
    );
    env.stop().await
}

/// One JSON-RPC message POSTed to an MCP endpoint: the session id the
/// answer carries and the JSON-RPC answer (from a JSON or an SSE body).
async fn mcp_post(
    url: &str,
    session: Option<&str>,
    message: Value,
) -> Result<(Option<String>, Value)> {
    let mut request = reqwest::Client::new()
        .post(url)
        .bearer_auth(MCP_TOKEN)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .json(&message);
    if let Some(session) = session {
        request = request.header("mcp-session-id", session);
    }
    let response = tokio::time::timeout(T, request.send()).await??;
    let status = response.status();
    let session = response
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = tokio::time::timeout(T, response.text()).await??;
    ensure!(status.is_success(), "{status}: {body}");
    let answer = body
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .chain(std::iter::once(body.as_str()))
        .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
        .find(|v| v.get("id").is_some())
        .unwrap_or(Value::Null);
    Ok((session, answer))
}

async fn a_long_run_answers_with_a_handle_and_its_status_later(backend: DbBackend) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    setup(&env).await?;
    let mcp = env
        .start_engine_with(
            &[
                "--mcp-listen".into(),
                "127.0.0.1:0".into(),
                "--mcp-tenant".into(),
                env.tenant.clone(),
                "--mcp-workflows".into(),
                "mcp_wait_for_go".into(),
                "--mcp-tokens".into(),
                format!("raw:{MCP_TOKEN}"),
                "--mcp-wait-ms".into(),
                "300".into(),
            ],
            1,
        )
        .await?;
    let url = env.engines[mcp].urls[3].clone();
    let (session, init) = mcp_post(
        &url,
        None,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}}}),
    )
    .await?;
    ensure!(init["result"]["serverInfo"]["name"] == "belay", "{init}");
    let session = session.ok_or_else(|| anyhow!("no session id"))?;
    mcp_post(
        &url,
        Some(&session),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await?;

    // The run waits for a signal: after --mcp-wait-ms the call answers with
    // a handle, not an error.
    let (_, call) = mcp_post(
        &url,
        Some(&session),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "mcp_wait_for_go", "arguments": {"note": "later"}}}),
    )
    .await?;
    let result = &call["result"];
    ensure!(result["isError"] == false, "{call}");
    ensure!(result["structuredContent"]["status"] == "waiting", "{call}");
    let run = result["structuredContent"]["run_id"]
        .as_str()
        .ok_or_else(|| anyhow!("no run id: {call}"))?
        .to_owned();
    ensure!(
        result["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("belay_run_status")),
        "{call}"
    );
    // The same request repeated on its session is the same run.
    let (_, repeated) = mcp_post(
        &url,
        Some(&session),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "mcp_wait_for_go", "arguments": {"note": "later"}}}),
    )
    .await?;
    ensure!(
        repeated["result"]["structuredContent"]["run_id"] == run.as_str(),
        "{repeated}"
    );

    env.client(0)?
        .signal(&run, "go", "go-1", &json!({}), "test")
        .await?;
    let (_, status) = mcp_post(
        &url,
        Some(&session),
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
            "name": "belay_run_status", "arguments": {"run_id": run, "wait_ms": 60000}}}),
    )
    .await?;
    ensure!(
        status["result"]["structuredContent"] == json!({"note": "later"}),
        "{status}"
    );
    ensure!(
        status["result"]["_meta"]["io.belay/run-id"] == run.as_str(),
        "{status}"
    );
    // A run this token did not start is not shown.
    let other = start(&env, "mcp_wait_for_go", "not-over-mcp").await?;
    let (_, hidden) = mcp_post(
        &url,
        Some(&session),
        json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {
            "name": "belay_run_status", "arguments": {"run_id": other}}}),
    )
    .await?;
    ensure!(hidden["result"]["isError"] == true, "{hidden}");
    env.stop().await
}

/// A tool asking a person for input mid-call (`trigger-elicitation-request`
/// of server-everything sends `elicitation/create`): the run waits durably,
/// across a worker's death, until `ProvideToolInput` answers; a wrong answer
/// is refused and changes nothing; the call then runs again with the answer
/// (same idempotency key). A `never` tool asking the same fails instead.
async fn a_tool_asking_for_input_waits_durably_for_the_answer(backend: DbBackend) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    setup(&env).await?;
    let everything = mcp_server("BELAY_MCP_EVERYTHING")?;
    let config = json!({"servers": {"everything": {"transport": "stdio", "command": everything, "args": ["stdio"]}}});
    let worker = env.start_worker_with_mcp(0, &config).await?;
    let run = start(&env, "mcp_elicit", "elicit-1").await?;
    env.wait_for(0, &run, "tool_call_input_requested", T)
        .await?;
    let client = env.client(0)?;
    let waiting = client.get_run(&run).await?;
    ensure!(
        waiting.status == "waiting"
            && waiting
                .status_reason
                .contains("waits for input from a person"),
        "{waiting:?}"
    );
    let events = env.events(&run).await?;
    let asked = of_kind(&events, "tool_call_input_requested");
    ensure!(asked.len() == 1, "{asked:?}");
    let call = asked[0]["call_id"].as_str().unwrap_or_default().to_owned();
    ensure!(
        asked[0]["via"] == "elicitation"
            && asked[0]["requests"]["requestedSchema"]["properties"]["name"].is_object(),
        "{}",
        asked[0]
    );
    // The worker that saw the question dies; nothing is lost.
    env.workers[worker].kill().await?;

    // An answer that does not fit the form: refused, naming the field.
    let bad = client
        .provide_tool_input(
            &run,
            &call,
            &json!({"action": "accept", "content": {"name": 7}}),
            "ada",
        )
        .await;
    let message = format!(
        "{:?}",
        bad.err()
            .ok_or_else(|| anyhow!("a wrong answer was accepted"))?
    );
    ensure!(message.contains("/content/name"), "{message}");
    ensure!(client.get_run(&run).await?.status == "waiting");

    let answer = json!({"action": "accept", "content": {"name": "Ada Lovelace", "check": true}});
    let answered = client
        .provide_tool_input(&run, &call, &answer, "ada")
        .await?;
    ensure!(answered.status == "running", "{answered:?}");
    // The same answer again (a retry after a lost reply) is answered with
    // the recorded one and changes nothing; a different one is refused,
    // naming the first (issue 22).
    let (_, duplicate) = client
        .answer_request(&run, &call, "", &answer, "ada")
        .await?;
    ensure!(duplicate, "a retried answer is a duplicate");
    let other = json!({"action": "decline"});
    let refused = client.provide_tool_input(&run, &call, &other, "bob").await;
    let message = format!(
        "{:?}",
        refused
            .err()
            .ok_or_else(|| anyhow!("a second, different answer was accepted"))?
    );
    ensure!(
        message.contains("Aborted") && message.contains("ada"),
        "{message}"
    );
    env.start_worker_with_mcp(0, &config).await?;
    let output = completed(&env, &run).await?;
    ensure!(output.to_string().contains("Ada Lovelace"), "{output}");
    let events = env.events(&run).await?;
    let provided = of_kind(&events, "tool_call_input_provided");
    ensure!(
        provided.len() == 1 && provided[0]["by"] == "ops/ada" && provided[0]["answer"] == answer,
        "{provided:?}"
    );
    let spec = env.db.task_spec(&run, &call).await?;
    let given = &spec["input"]["elicitations"];
    ensure!(
        given.as_array().map(Vec::len) == Some(1)
            && given[0]["action"] == answer["action"]
            && given[0]["content"] == answer["content"]
            && given[0]["question"] == asked[0]["requests"],
        "{spec}"
    );
    ensure!(
        dispatch_counts(&events).get(&call) == Some(&2),
        "{:?}",
        dispatch_counts(&events)
    );

    // A `never` tool whose server kept running after Belay did not answer
    // at once may have acted: it is not repeated, and says why.
    let once = start(&env, "mcp_elicit_once", "elicit-2").await?;
    env.wait_for(0, &once, "run_failed", T).await?;
    let errors = errors_of(&env.events(&once).await?);
    ensure!(
        errors.len() == 1 && errors[0].contains("repeat safety `never`"),
        "{errors:?}"
    );
    env.stop().await
}

/// A resource read as the run starts (a tool node bound to `resource:`),
/// recorded as a step, and carried into the agent's context.
async fn a_resource_read_at_the_start_reaches_the_model_and_is_recorded(
    backend: DbBackend,
) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    setup(&env).await?;
    let everything = mcp_server("BELAY_MCP_EVERYTHING")?;
    env.start_worker_with_mcp(
        0,
        &json!({"servers": {"everything": {"transport": "stdio", "command": everything, "args": ["stdio"]}}}),
    )
    .await?;
    let (run, _) = env
        .client(0)?
        .start_run(
            "mcp_resource_brief",
            &json!({"doc_id": "5"}),
            StartOptions {
                idempotency_key: "mcp-resource-1".into(),
                caller: "test".into(),
                caller_grants: vec!["mcp.use".into()],
            },
        )
        .await?;
    let output = completed(&env, &run.run_id).await?;
    let brief = output["brief"].as_str().unwrap_or_default();
    ensure!(
        brief.starts_with("Resource 5: This is a plaintext resource"),
        "{output}"
    );
    let events = env.events(&run.run_id).await?;
    // The read is one recorded, dispatched step: its contents are in the
    // event (a replay folds them from there, it never reads again).
    let reads = of_kind(&events, "tool_call_completed");
    ensure!(reads.len() == 1, "{reads:?}");
    let contents = &reads[0]["result"]["contents"];
    ensure!(
        contents[0]["uri"] == "demo://resource/dynamic/text/5"
            && contents[0]["text"].as_str() == Some(brief),
        "{contents}"
    );
    let counts = dispatch_counts(&events);
    ensure!(
        counts.values().all(|n| *n == 1) && counts.len() == 1,
        "{counts:?}"
    );
    // The model saw it in its context.
    let model_call = of_kind(&events, "model_call_scheduled")
        .first()
        .and_then(|e| e["call_id"].as_str())
        .ok_or_else(|| anyhow!("no model call"))?
        .to_owned();
    let spec = env.db.task_spec(&run.run_id, &model_call).await?;
    ensure!(spec.to_string().contains(brief), "{spec}");
    env.stop().await
}

/// MCP sampling end to end: the server's `sampling/createMessage` during
/// an agent's call is answered by the agent's model (the scripted model
/// server, through the worker's model client), its tokens are recorded in
/// `tool_call_sampled` and charged to the agent's budget, which stops the
/// run before its next model call.
async fn an_mcp_servers_sampling_goes_through_the_agents_model_and_budget(
    backend: DbBackend,
) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    setup(&env).await?;
    let everything = mcp_server("BELAY_MCP_EVERYTHING")?;
    env.start_worker_with_mcp(
        0,
        &json!({"servers": {"everything": {"transport": "stdio", "command": everything, "args": ["stdio"]}}}),
    )
    .await?;
    let run = start(&env, "mcp_sampling", "mcp-sampling-1").await?;
    env.wait_for(0, &run, "run_failed", T).await?;
    let events = env.events(&run).await?;
    // The call's spec carried the grant: the agent's model, and what was
    // left of its 200 tokens after the first model call's 120.
    let scheduled = of_kind(&events, "tool_call_scheduled");
    ensure!(scheduled.len() == 1, "{scheduled:?}");
    let call = scheduled[0]["call_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let spec = env.db.task_spec(&run, &call).await?;
    ensure!(
        spec["sampling"]
            == json!({
                "model": "scripted-mcp-sampling",
                "max_requests": 1,
                "max_tokens": 80,
                // The 80 tokens left of the budget bound all completions
                // together, output and input.
                "max_total_tokens": 80,
                "max_input_tokens": 80
            }),
        "{spec}"
    );
    // The server got the model's completion and put it in its result.
    let results = of_kind(&events, "tool_call_completed");
    ensure!(
        results.len() == 1 && results[0]["result"].to_string().contains("forty-two"),
        "{results:?}"
    );
    // Its usage was recorded before the result, and charged: 120 + 120 is
    // past the agent's 200, so the run stopped before a second model call.
    let kinds: Vec<&str> = events
        .iter()
        .filter_map(|e| e["kind"].as_str().or_else(|| e["type"].as_str()))
        .collect();
    let sampled_at = kinds.iter().position(|k| *k == "tool_call_sampled");
    let completed_at = kinds.iter().position(|k| *k == "tool_call_completed");
    ensure!(
        sampled_at.is_some() && sampled_at < completed_at,
        "{kinds:?}"
    );
    let sampled = of_kind(&events, "tool_call_sampled");
    ensure!(
        sampled.len() == 1
            && sampled[0]["usage"]
                == json!({"requests": 1, "input_tokens": 100, "output_tokens": 20}),
        "{sampled:?}"
    );
    let failed = of_kind(&events, "run_failed");
    ensure!(
        failed.len() == 1
            && failed[0]["stop"]["kind"] == "budget"
            && failed[0]["error"]
                .as_str()
                .is_some_and(|e| e.contains("`tokens` budget (240 of 200)")),
        "{failed:?}"
    );
    ensure!(
        of_kind(&events, "model_call_scheduled").len() == 1,
        "{kinds:?}"
    );
    env.stop().await
}

belay_tests::on_both_backends!(
    an_agent_run_calls_mcp_tools_over_stdio_and_completes,
    a_tool_asking_for_input_waits_durably_for_the_answer,
    a_resource_read_at_the_start_reaches_the_model_and_is_recorded,
    an_mcp_servers_sampling_goes_through_the_agents_model_and_budget
);

mod postgres_only {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_changed_definition_is_refused_until_an_operator_accepts_it() -> Result<()> {
        super::a_changed_definition_is_refused_until_an_operator_accepts_it(DbBackend::Postgres)
            .await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_server_killed_mid_call_is_handled_by_repeat_safety() -> Result<()> {
        super::a_server_killed_mid_call_is_handled_by_repeat_safety(DbBackend::Postgres).await
    }

    /// Two engines on one database (the second serves MCP): PostgreSQL.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_long_run_answers_with_a_handle_and_its_status_later() -> Result<()> {
        super::a_long_run_answers_with_a_handle_and_its_status_later(DbBackend::Postgres).await
    }

    /// Two engines on one database (the second serves MCP): PostgreSQL.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_standard_mcp_client_lists_and_calls_a_belay_agent() -> Result<()> {
        super::a_standard_mcp_client_lists_and_calls_a_belay_agent(DbBackend::Postgres).await
    }
}
