//! Worker pools end to end: the real engine and worker binaries and real,
//! unmodified MCP servers (`@modelcontextprotocol/server-everything`,
//! `mcp-server-time`, installed by `.ci/mcp-servers.sh`).
//!
//! - two workers with different MCP servers, runs needing each: every task
//!   goes to the worker that has its server, on its first claim (attempt 1,
//!   dispatched by that worker, no `NOT_SENT` bounce);
//! - a task of a pool no worker serves is shown unclaimable on `GetRun`
//!   ("no live worker has pool:gpu") and is not handed out; once a worker of
//!   that pool starts, it claims the task and the run completes.

use std::time::Duration;

use anyhow::{Result, bail, ensure};
use belay_sdk::StartOptions;
use belay_tests::{DbBackend, EngineOpts, Env, mcp_server, of_kind, repo_root};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(90);

async fn setup(env: &Env) -> Result<()> {
    let client = env.client(0)?;
    client
        .register_paths(&[repo_root().join("tests/pool-fixtures")])
        .await?;
    client.set_tenant_grants(vec!["mcp.use".into()]).await?;
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

fn everything() -> Result<Value> {
    let command = mcp_server("BELAY_MCP_EVERYTHING")?;
    Ok(json!({"transport": "stdio", "command": command, "args": ["stdio"]}))
}

fn time() -> Result<Value> {
    Ok(json!({"transport": "stdio", "command": mcp_server("BELAY_MCP_TIME")?}))
}

/// Waits for the run to complete; checks its one tool call was dispatched
/// once, at attempt 1, by worker `worker` (the events name
/// `<principal>/<worker id>`), and never failed.
async fn completed_by(env: &Env, run: &str, worker: &str) -> Result<()> {
    env.wait_for(0, run, "run_completed", T).await?;
    let events = env.events(run).await?;
    let dispatched = of_kind(&events, "tool_call_dispatched");
    ensure!(dispatched.len() == 1, "{dispatched:?}");
    ensure!(dispatched[0]["attempt"] == 1, "{:?}", dispatched[0]);
    let by = dispatched[0]["worker_id"].as_str().unwrap_or_default();
    ensure!(
        by.ends_with(&format!("/{worker}")),
        "run {run} dispatched by {by}, not {worker}"
    );
    let failed = of_kind(&events, "tool_call_failed");
    ensure!(failed.is_empty(), "bounced: {failed:?}");
    Ok(())
}

async fn each_task_goes_to_a_capable_worker_and_a_pool_waits_for_its_worker(
    backend: DbBackend,
) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    setup(&env).await?;
    env.start_worker_with_mcp(0, &json!({"servers": {"everything": everything()?}}))
        .await?;
    env.start_worker_with_mcp(0, &json!({"servers": {"time": time()?}}))
        .await?;
    let mut runs = Vec::new();
    for i in 0..3 {
        runs.push((
            start(&env, "pool_echo", &format!("echo-{i}")).await?,
            "worker0",
        ));
        runs.push((
            start(&env, "pool_time", &format!("time-{i}")).await?,
            "worker1",
        ));
    }
    for (run, worker) in &runs {
        completed_by(&env, run, worker).await?;
    }

    // Nobody serves pool `gpu`: the task waits, shown as such.
    let gpu = start(&env, "pool_gpu", "gpu-1").await?;
    let (run, unclaimable) = env.client(0)?.get_run_detail(&gpu).await?;
    ensure!(run.status == "running", "{run:?}");
    ensure!(unclaimable.len() == 1, "{unclaimable:?}");
    let task = &unclaimable[0];
    ensure!(task.kind == "tool_call", "{task:?}");
    ensure!(task.requires == ["mcp:everything", "pool:gpu"], "{task:?}");
    ensure!(task.missing == ["pool:gpu"], "{task:?}");
    ensure!(task.reason == "no live worker has pool:gpu", "{task:?}");
    ensure!(unclaimable_gauge(&env).await? == 1.0);
    // The autoscaler's backlog leaves it out: more workers like the live
    // ones would not take it either.
    let ready = gauge(&env, "belay_tasks_ready{kind=\"tool_call\",pool=\"gpu\"}").await?;
    ensure!(
        ready == 0.0,
        "belay_tasks_ready counts a task no worker can take: {ready}"
    );
    // No worker took it meanwhile (the two have polled since).
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let events = env.events(&gpu).await?;
    ensure!(
        of_kind(&events, "tool_call_dispatched").is_empty(),
        "{events:?}"
    );

    // A worker of the pool appears: it claims the task at once.
    env.start_worker_with_mcp_and(
        0,
        &json!({"servers": {"everything": everything()?}}),
        &["--pool", "gpu"],
    )
    .await?;
    completed_by(&env, &gpu, "worker2").await?;
    let (_, unclaimable) = env.client(0)?.get_run_detail(&gpu).await?;
    ensure!(unclaimable.is_empty(), "{unclaimable:?}");
    // The gauge is read from the database at most once a second: poll
    // until a fresh reading shows the task gone (5 s at most).
    let mut gauge = unclaimable_gauge(&env).await?;
    for _ in 0..50 {
        if gauge == 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        gauge = unclaimable_gauge(&env).await?;
    }
    ensure!(gauge == 0.0, "belay_tasks_unclaimable stayed {gauge}");
    Ok(())
}

/// `belay_tasks_unclaimable{kind="tool_call"}` on engine 0's `/metrics`.
async fn unclaimable_gauge(env: &Env) -> anyhow::Result<f64> {
    gauge(env, "belay_tasks_unclaimable{kind=\"tool_call\"}").await
}

/// The value of `series` (name and labels, as exposed) on engine 0's `/metrics`.
async fn gauge(env: &Env, series: &str) -> anyhow::Result<f64> {
    let url = format!("{}/metrics", env.engines[0].admin_url());
    let text = reqwest::get(&url).await?.error_for_status()?.text().await?;
    let line = text
        .lines()
        .find(|l| l.starts_with(series))
        .ok_or_else(|| anyhow::anyhow!("no {series} in {text}"))?;
    let value = line.rsplit(' ').next().unwrap_or_default();
    Ok(value.parse()?)
}

/// `--pool` is checked before the worker starts.
#[test]
fn a_bad_pool_name_stops_the_worker_with_an_error() -> Result<()> {
    let out = std::process::Command::new(belay_tests::bin("belay-worker")?)
        .args(["--engine-url", "http://127.0.0.1:9", "--pool", "GPU pool"])
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        bail!("started: {stderr}");
    }
    ensure!(
        stderr.contains("--pool: pool name `GPU pool` must be lower case"),
        "{stderr}"
    );
    Ok(())
}

belay_tests::on_both_backends!(each_task_goes_to_a_capable_worker_and_a_pool_waits_for_its_worker);
