//! Prometheus metrics end to end: a real engine (PostgreSQL) and worker run
//! onboarding runs while a real Prometheus (Debian `prometheus`, installed
//! by `.ci/prometheus.sh` when missing) scrapes both `/metrics` endpoints
//! every second; the figures are read back through Prometheus's HTTP API
//! (`/api/v1/query`) and must be exactly what the workload makes them.
//! Scrapes are awaited through `/api/v1/targets` (a scrape that started
//! after the moment of interest), never with a fixed sleep. Both
//! endpoints' text passes `promtool check metrics`.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};
use belay_tests::{EngineOpts, Env};
use serde_json::Value;
use tokio::io::AsyncWriteExt;

const T: Duration = Duration::from_secs(90);

/// `prometheus` and `promtool`: `$BELAY_PROMETHEUS` / `$BELAY_PROMTOOL`, else
/// what `.ci/prometheus.sh` installs and prints.
fn tools() -> Result<(String, String)> {
    if let (Ok(p), Ok(t)) = (
        std::env::var("BELAY_PROMETHEUS"),
        std::env::var("BELAY_PROMTOOL"),
    ) {
        return Ok((p, t));
    }
    let script = belay_tests::repo_root().join(".ci/prometheus.sh");
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
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let var = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("export {name}=")))
            .map(str::to_owned)
            .ok_or_else(|| anyhow!("{} printed no {name}", script.display()))
    };
    Ok((var("BELAY_PROMETHEUS")?, var("BELAY_PROMTOOL")?))
}

/// A free port on 127.0.0.1 (bound, then released for the child to take).
fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// A Prometheus server scraping `engine` and `worker` (`host:port`) every
/// second; it stops when dropped (`kill_on_drop`).
struct Prometheus {
    url: String,
    http: reqwest::Client,
    _child: tokio::process::Child,
    _dir: TempDir,
}

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Prometheus {
    async fn start(binary: &str, engine: &str, worker: &str) -> Result<Prometheus> {
        let dir = std::env::temp_dir().join(format!("belay-prometheus-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(dir.join("data"))?;
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n\
             scrape_configs:\n\
             - job_name: engine\n  static_configs:\n  - targets: ['{engine}']\n\
             - job_name: worker\n  static_configs:\n  - targets: ['{worker}']\n"
        );
        std::fs::write(dir.join("prometheus.yml"), config)?;
        let port = free_port()?;
        let log = std::fs::File::create(dir.join("prometheus.log"))?;
        let child = tokio::process::Command::new(binary)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {binary}"))?;
        let p = Prometheus {
            url: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
            _child: child,
            _dir: TempDir(dir),
        };
        p.ready().await?;
        Ok(p)
    }

    /// Waits until Prometheus answers `/-/ready` (its start-up).
    async fn ready(&self) -> Result<()> {
        let deadline = tokio::time::Instant::now() + T;
        loop {
            let ok = self.http.get(format!("{}/-/ready", self.url)).send().await;
            if ok.is_ok_and(|r| r.status().is_success()) {
                return Ok(());
            }
            ensure!(
                tokio::time::Instant::now() < deadline,
                "Prometheus did not start"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the targets of `jobs` are up with a scrape that started
    /// at or after `after` (Prometheus's `lastScrape`, RFC 3339).
    async fn scraped_after(
        &self,
        jobs: &[&str],
        after: chrono::DateTime<chrono::Utc>,
    ) -> Result<()> {
        let deadline = tokio::time::Instant::now() + T;
        loop {
            let v: Value = self
                .http
                .get(format!("{}/api/v1/targets", self.url))
                .send()
                .await?
                .json()
                .await?;
            let targets = v["data"]["activeTargets"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let fresh = targets.iter().filter(|t| {
                let last = t["lastScrape"]
                    .as_str()
                    .and_then(|s| s.parse::<chrono::DateTime<chrono::Utc>>().ok());
                let job = t["labels"]["job"].as_str().unwrap_or_default();
                jobs.contains(&job) && t["health"] == "up" && last.is_some_and(|l| l >= after)
            });
            if fresh.count() == jobs.len() {
                return Ok(());
            }
            ensure!(
                tokio::time::Instant::now() < deadline,
                "no scrape of {jobs:?} after {after}: {targets:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The value of instant query `q`: one series, its value.
    async fn value(&self, q: &str) -> Result<f64> {
        let v: Value = self
            .http
            .get(format!("{}/api/v1/query", self.url))
            .query(&[("query", q)])
            .send()
            .await?
            .json()
            .await?;
        ensure!(v["status"] == "success", "query {q}: {v}");
        let result = v["data"]["result"].as_array().cloned().unwrap_or_default();
        ensure!(
            result.len() == 1,
            "query {q}: expected one series, got {result:?}"
        );
        let text = result[0]["value"][1].as_str().unwrap_or_default();
        text.parse()
            .with_context(|| format!("query {q}: value {text:?}"))
    }
}

/// `text` passes `promtool check metrics` (no problems printed).
async fn promtool_check(promtool: &str, what: &str, text: &str) -> Result<()> {
    let mut child = tokio::process::Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut stdin = child.stdin.take().ok_or_else(|| anyhow!("no stdin"))?;
    stdin.write_all(text.as_bytes()).await?;
    drop(stdin);
    let out = child.wait_with_output().await?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        out.status.success() && said.trim().is_empty(),
        "promtool on {what}: {said}\n{text}"
    );
    Ok(())
}

/// `host:port` of an `http://host:port` URL.
fn host_port(url: &str) -> String {
    url.trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned()
}

async fn get_text(url: &str) -> Result<String> {
    let r = reqwest::get(url).await?;
    if !r.status().is_success() {
        bail!("GET {url}: {}", r.status());
    }
    Ok(r.text().await?)
}

/// Runs `n` onboarding runs to completion through engine 0.
async fn complete_runs(env: &Env, first: usize, n: usize) -> Result<()> {
    for i in first..first + n {
        let run = env
            .start_onboarding(
                0,
                "onboarding_express",
                &format!("m{i}@example.com"),
                &format!("m{i}"),
            )
            .await?;
        env.wait_for(0, &run, "run_completed", T).await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_what_the_workload_did() -> Result<()> {
    let (prometheus, promtool) = tools()?;
    let mut env = Env::start(EngineOpts::default()).await?;
    let worker_port = free_port()?;
    let engine_metrics = format!("{}/metrics", env.engines[0].admin_url());
    let worker_metrics = format!("http://127.0.0.1:{worker_port}/metrics");
    let prom = Prometheus::start(
        &prometheus,
        &host_port(env.engines[0].admin_url()),
        &format!("127.0.0.1:{worker_port}"),
    )
    .await?;

    // A backlog before any worker: two ready model calls.
    for i in 0..2 {
        env.start_onboarding(
            0,
            "onboarding_express",
            &format!("b{i}@example.com"),
            &format!("b{i}"),
        )
        .await?;
    }
    // The engine reads the database gauges at most once a second.
    prom.scraped_after(
        &["engine"],
        chrono::Utc::now() + chrono::Duration::milliseconds(1100),
    )
    .await?;
    assert_eq!(
        prom.value(r#"max(belay_tasks_ready{kind="model_call"})"#)
            .await?,
        2.0
    );
    assert_eq!(
        prom.value(r#"belay_tasks_ready{kind="tool_call"}"#).await?,
        0.0
    );

    env.start_worker_with_args(
        0,
        &["--health-listen".into(), format!("127.0.0.1:{worker_port}")],
    )
    .await?;
    complete_runs(&env, 0, 1).await?;
    wait_all_completed(&env.client(0)?, 3).await?;
    prom.scraped_after(
        &["engine", "worker"],
        chrono::Utc::now() + chrono::Duration::milliseconds(1100),
    )
    .await?;
    assert_workload_figures(&prom, 3).await?;

    for (what, url) in [("engine", &engine_metrics), ("worker", &worker_metrics)] {
        promtool_check(&promtool, what, &get_text(url).await?).await?;
    }
    drop(prom);
    env.stop().await
}

/// Waits until `n` runs of the tenant are completed (the backlog's two
/// and the one watched).
async fn wait_all_completed(client: &belay_sdk::Client, n: usize) -> Result<()> {
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let (runs, _) = client.list_runs("completed", 50, "").await?;
        let done = runs.len();
        if done >= n {
            return Ok(());
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "{done} of {n} runs completed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The figures `runs` onboarding_express runs make: each is 4 model calls
/// (100 prompt and 20 completion tokens each, the scripted model's
/// defaults) and 3 tool calls, every attempt succeeding.
async fn assert_workload_figures(prom: &Prometheus, runs: usize) -> Result<()> {
    let n = runs as f64;
    let wf = r#"workflow="onboarding_express""#;
    let cases: Vec<(String, f64)> = vec![
        (format!("sum(belay_runs_started_total{{{wf}}})"), n),
        (format!(r#"sum(belay_runs_ended_total{{{wf},status="completed"}})"#), n),
        (r#"belay_steps_total{kind="model_call",outcome="succeeded"}"#.into(), 4.0 * n),
        (r#"belay_steps_total{kind="tool_call",outcome="succeeded"}"#.into(), 3.0 * n),
        (r#"belay_model_tokens_total{provider="openai",model="scripted-onboarding",direction="input"}"#.into(), 400.0 * n),
        (r#"belay_model_tokens_total{provider="openai",model="scripted-onboarding",direction="output"}"#.into(), 80.0 * n),
        (r#"belay_tool_calls_total{tool="create_account",outcome="succeeded"}"#.into(), n),
        (r#"belay_step_duration_seconds_count{kind="model_call"}"#.into(), 4.0 * n),
        (r#"belay_step_duration_seconds_count{kind="tool_call"}"#.into(), 3.0 * n),
        (r#"belay_dispatch_latency_seconds_count{kind="model_call"}"#.into(), 4.0 * n),
        (r#"belay_tasks_ready{kind="model_call"}"#.into(), 0.0),
        (r#"belay_worker_tasks_total{kind="model_call",outcome="succeeded"}"#.into(), 4.0 * n),
        (r#"belay_worker_tasks_total{kind="tool_call",outcome="succeeded"}"#.into(), 3.0 * n),
        (r#"belay_worker_task_duration_seconds_count{kind="tool_call"}"#.into(), 3.0 * n),
        (r#"belay_worker_slots{state="busy"}"#.into(), 0.0),
        (r#"belay_worker_slots{state="free"}"#.into(), 4.0),
        // Both kinds are always shown, 0 included; nothing was uncertain.
        ("count(belay_tasks_ready)".into(), 2.0),
        ("absent(belay_uncertain_outcomes_open)".into(), 1.0),
    ];
    for (q, want) in cases {
        assert_eq!(prom.value(&q).await?, want, "{q}");
    }
    ensure!(
        prom.value(r#"belay_worker_claims_total{result="claimed"}"#)
            .await?
            >= 1.0
    );
    ensure!(prom.value(r#"sum(belay_db_pool_connections)"#).await? >= 1.0);
    Ok(())
}

/// `/metrics` of the admin endpoint answers without a credential; the
/// admin routes beside it still refuse one that is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_public_while_the_admin_routes_are_not() -> Result<()> {
    let env = Env::start(EngineOpts::default()).await?;
    let admin = env.engines[0].admin_url().to_owned();
    let text = get_text(&format!("{admin}/metrics")).await?;
    assert!(text.contains("# TYPE belay_tasks_ready gauge"), "{text}");
    for path in [
        "/admin/v1/keys",
        "/admin/v1/tenants/acme/uncertain-outcomes",
    ] {
        let status = reqwest::get(format!("{admin}{path}")).await?.status();
        assert_eq!(status.as_u16(), 401, "{path} without a credential");
    }
    env.stop().await
}
