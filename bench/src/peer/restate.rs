//! Restate 1.7 beside Belay: its server (`restate-server`, from the npm
//! package `@restatedev/restate-server`) and a TypeScript-SDK service whose
//! handler makes K durable steps (`ctx.run`), installed by
//! `bench/peers/restate/install.sh` into a cache outside the clone at the
//! versions its `package-lock.json` pins, started on free loopback ports
//! with a fresh data folder, and timed by `bench/peers/restate/drive.mjs`
//! (R invocations, at most C in flight).
//!
//! Restate's configuration (ports through `RESTATE_<SECTION>__<KEY>`
//! variables, `/health` on the admin port, `POST /deployments` to register
//! a service) is from <https://docs.restate.dev/server/networking> and the
//! server's `--dump-config`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::cpu;

/// The installer, beside this crate's sources.
const INSTALLER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/peers/restate/install.sh");

/// How long the server and the service may take to start.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// One timed round of `drive.mjs`: R invocations of K steps, C in flight.
#[derive(Debug, Clone, Deserialize)]
pub struct RestateRound {
    /// Invocations (R).
    pub runs: u32,
    /// Steps per invocation (K).
    pub steps: u32,
    /// Invocations in flight at once (C).
    pub concurrency: u32,
    /// Wall time of the R invocations, s.
    pub secs: f64,
    /// `R·K / secs`.
    pub steps_per_s: f64,
    /// `secs / (R·K)`, ms: what a step costs including its share of the
    /// invocation around it.
    pub wall_ms_per_step: f64,
    /// `(secs − secs_0_steps) / (R·K)`, ms: a step's cost beyond an
    /// invocation of no steps.
    pub marginal_ms_per_step: f64,
    /// Invocation latency (request to answer) percentiles, ms.
    pub invocation_ms: InvocationMs,
    /// Wall time of R invocations of no steps, s.
    pub secs_0_steps: f64,
    /// CPU spent during the round (both the K-step and the 0-step
    /// invocations), filled in by [`Restate::round`].
    #[serde(skip)]
    pub cpu: RestateCpu,
}

/// Invocation latency percentiles, ms.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct InvocationMs {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
}

/// CPU time of one round, ms, by process, and the machine's.
#[derive(Debug, Clone, Copy, Default)]
pub struct RestateCpu {
    /// `restate-server`.
    pub server_ms: f64,
    /// The Node.js process of the SDK service.
    pub service_ms: f64,
    /// The Node.js process of the driver (the client side).
    pub driver_ms: f64,
    /// The machine's busy time, all cores.
    pub machine_busy_ms: f64,
    /// The machine's total time, all cores.
    pub machine_total_ms: f64,
}

impl RestateRound {
    /// Steps the round's CPU time is divided by: the K-step invocations'
    /// (the 0-step ones are in the CPU time too, so this overstates a
    /// step's cost by their share).
    fn cpu_steps(&self) -> f64 {
        (f64::from(self.runs) * f64::from(self.steps)).max(1.0)
    }

    /// Server plus service CPU per step, ms (the driver, the client, left out,
    /// as Belay's bench process is).
    pub fn cpu_ms_per_step(&self) -> f64 {
        (self.cpu.server_ms + self.cpu.service_ms) / self.cpu_steps()
    }

    /// The figures, one `name: value` line each.
    pub fn lines(&self, label: &str) -> Vec<String> {
        let per = |ms: f64| format!("{:.3}", ms / self.cpu_steps());
        vec![
            format!(
                "restate {label}: R={} invocations x K={} steps, C={} in flight, {:.3} s",
                self.runs, self.steps, self.concurrency, self.secs
            ),
            format!("restate {label} steps/s: {:.1}", self.steps_per_s),
            format!(
                "restate {label} ms per step: {:.3} wall, {:.3} beyond a 0-step invocation",
                self.wall_ms_per_step, self.marginal_ms_per_step
            ),
            format!(
                "restate {label} invocation latency p50: {:.1} ms, p99: {:.1} ms",
                self.invocation_ms.p50, self.invocation_ms.p99
            ),
            format!(
                "restate {label} cpu ms per step: server {}, service {}, sum {}, driver (client) {}, \
                 machine busy {} ({:.0}% of the cores)",
                per(self.cpu.server_ms),
                per(self.cpu.service_ms),
                per(self.cpu.server_ms + self.cpu.service_ms),
                per(self.cpu.driver_ms),
                per(self.cpu.machine_busy_ms),
                100.0 * self.cpu.machine_busy_ms / self.cpu.machine_total_ms.max(f64::EPSILON),
            ),
        ]
    }
}

/// A running Restate: server and service, killed when dropped.
pub struct Restate {
    server: Child,
    service: Child,
    /// The folder with `drive.mjs` and its `node_modules`.
    dir: PathBuf,
    ingress_url: String,
    data: PathBuf,
}

impl Restate {
    /// Installs Restate if needed, starts its server (fresh data folder
    /// under `log_dir`, which also gets the server's and the service's
    /// logs) and the service, and registers the service.
    ///
    /// Errors: the installer fails, a process does not start or exits, the
    /// server is not healthy within a minute, the registration is refused.
    pub async fn start(log_dir: &Path) -> Result<Restate> {
        let (server_bin, dir) = install().await?;
        std::fs::create_dir_all(log_dir)
            .with_context(|| format!("creating {}", log_dir.display()))?;
        let data = log_dir.join("restate-data");
        let [ingress, admin, fabric, service_port] = free_ports::<4>().await?;
        let mut server = Command::new(&server_bin);
        server
            .args([
                "--no-logo",
                "--listen-mode",
                "tcp",
                "--bind-ip",
                "127.0.0.1",
            ])
            .arg("--bind-port")
            .arg(fabric.to_string())
            .arg("--base-dir")
            .arg(&data)
            .args(["--node-name", "bench"])
            .env("RESTATE_INGRESS__BIND_PORT", ingress.to_string())
            .env("RESTATE_ADMIN__BIND_PORT", admin.to_string())
            .env("RESTATE_LOG_FILTER", "warn")
            .env("RESTATE_DISABLE_TELEMETRY", "true")
            .env("RESTATE_ADMIN__DISABLE_WEB_UI", "true");
        let mut server = spawn_logged(server, &log_dir.join("restate-server.log"))?;
        let mut service = Command::new("node");
        service
            .arg("service.mjs")
            .current_dir(&dir)
            .env("PORT", service_port.to_string())
            .env("RESTATE_LOGGING", "WARN");
        let mut service = spawn_logged_stdout(service, &log_dir.join("restate-service.log"))?;
        wait_listening(&mut service, "the Restate service").await?;
        let admin_url = format!("http://127.0.0.1:{admin}");
        wait_healthy(&mut server, &admin_url).await?;
        register(&admin_url, service_port).await?;
        Ok(Restate {
            server,
            service,
            dir,
            ingress_url: format!("http://127.0.0.1:{ingress}"),
            data,
        })
    }

    /// Times R invocations of K steps with at most C in flight (after a
    /// warm-up of 5), then R of 0 steps, and reads the CPU the server, the
    /// service and the driver spent.
    ///
    /// Errors: the driver fails (it names the invocation) or prints no
    /// figures; `/proc` unreadable.
    pub async fn round(&self, runs: u32, steps: u32, concurrency: u32) -> Result<RestateRound> {
        let before = self.cpu_now()?;
        let driver = Command::new("node")
            .arg("drive.mjs")
            .arg(&self.ingress_url)
            .args([runs, steps, concurrency].map(|n| n.to_string()))
            .current_dir(&self.dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting node drive.mjs")?;
        // The driver's CPU time: once it exits and is waited for, it is in
        // the bench's children's time (`cutime + cstime`), which nothing
        // else adds to meanwhile (Restate's processes live on).
        let children_before = children_cpu_ms()?;
        let output = driver
            .wait_with_output()
            .await
            .context("waiting for node drive.mjs")?;
        let children_after = children_cpu_ms()?;
        if !output.status.success() {
            bail!(
                "the Restate driver failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        let after = self.cpu_now()?;
        let text = String::from_utf8_lossy(&output.stdout);
        let line = text
            .lines()
            .rev()
            .find(|l| l.starts_with('{'))
            .ok_or_else(|| anyhow!("the Restate driver printed no figures: {text}"))?;
        let mut round: RestateRound = serde_json::from_str(line)
            .with_context(|| format!("the Restate driver's figures are not understood: {line}"))?;
        round.cpu = RestateCpu {
            server_ms: after.server_ms - before.server_ms,
            service_ms: after.service_ms - before.service_ms,
            driver_ms: children_after - children_before,
            machine_busy_ms: after.machine_busy_ms - before.machine_busy_ms,
            machine_total_ms: after.machine_total_ms - before.machine_total_ms,
        };
        Ok(round)
    }

    /// The server's and the service's CPU time so far, and the machine's.
    fn cpu_now(&self) -> Result<RestateCpu> {
        let (machine_busy_ms, machine_total_ms) = cpu::machine_cpu_ms()?;
        Ok(RestateCpu {
            server_ms: cpu::process_cpu_ms(self.server.id(), false)?,
            service_ms: cpu::process_cpu_ms(self.service.id(), false)?,
            driver_ms: 0.0,
            machine_busy_ms,
            machine_total_ms,
        })
    }

    /// Stops the service and the server and removes the data folder.
    pub async fn stop(mut self) {
        let _ = self.service.kill().await;
        let _ = self.server.kill().await;
        let _ = std::fs::remove_dir_all(&self.data);
    }
}

/// CPU time of this process's exited, waited-for children, ms.
fn children_cpu_ms() -> Result<f64> {
    Ok(cpu::process_cpu_ms(None, true)? - cpu::process_cpu_ms(None, false)?)
}

/// Runs the installer; returns the server binary and the folder of the
/// service and the driver.
async fn install() -> Result<(PathBuf, PathBuf)> {
    let output = Command::new("bash")
        .arg(INSTALLER)
        .stderr(Stdio::inherit())
        .output()
        .await
        .with_context(|| format!("running {INSTALLER}"))?;
    if !output.status.success() {
        bail!("{INSTALLER} failed ({})", output.status);
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let value = |name: &str| -> Result<PathBuf> {
        let prefix = format!("export {name}=");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map(|v| PathBuf::from(v.trim_matches('\'')))
            .ok_or_else(|| anyhow!("{INSTALLER} printed no {name}: {text}"))
    };
    Ok((value("BELAY_RESTATE_SERVER")?, value("BELAY_RESTATE_DIR")?))
}

/// N distinct free loopback ports (bound, read, released; Restate binds
/// them moments later).
async fn free_ports<const N: usize>() -> Result<[u16; N]> {
    let mut listeners = Vec::with_capacity(N);
    let mut ports = [0u16; N];
    for port in &mut ports {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        *port = listener.local_addr()?.port();
        listeners.push(listener);
    }
    Ok(ports)
}

fn spawn_logged(mut cmd: Command, log: &Path) -> Result<Child> {
    let file = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(file.try_clone()?))
        .stderr(Stdio::from(file))
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {:?}", cmd.as_std().get_program()))
}

/// As [`spawn_logged`], with stdout piped (for its `listening on` line).
fn spawn_logged_stdout(mut cmd: Command, log: &Path) -> Result<Child> {
    let file = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(file))
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {:?}", cmd.as_std().get_program()))
}

/// Waits for the child's `listening on` line on stdout.
async fn wait_listening(child: &mut Child, what: &str) -> Result<()> {
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow!("{what}: no stdout"))?;
    let mut lines = BufReader::new(stdout).lines();
    let found = tokio::time::timeout(START_TIMEOUT, async {
        while let Some(line) = lines.next_line().await? {
            if line.starts_with("listening on ") {
                return Ok::<bool, std::io::Error>(true);
            }
        }
        Ok(false)
    })
    .await
    .with_context(|| format!("{what} did not start within {START_TIMEOUT:?}"))??;
    if !found {
        bail!("{what} exited before listening ({:?})", child.try_wait()?);
    }
    // Keep reading (and dropping) its stdout so it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(())
}

/// Polls the admin API's `/health` every 100 ms until it answers 200 (the
/// server says it is ready no other way), failing at once if the server
/// exits.
async fn wait_healthy(server: &mut Child, admin_url: &str) -> Result<()> {
    let http = reqwest::Client::new();
    let url = format!("{admin_url}/health");
    let deadline = tokio::time::Instant::now() + START_TIMEOUT;
    loop {
        if let Some(status) = server.try_wait()? {
            bail!("restate-server exited at start ({status}); see its log");
        }
        let last = match http.get(&url).send().await {
            Ok(answer) if answer.status().is_success() => return Ok(()),
            Ok(answer) => format!("answered {}", answer.status()),
            Err(e) => e.to_string(),
        };
        if tokio::time::Instant::now() >= deadline {
            bail!("restate-server was not healthy within {START_TIMEOUT:?}: {url}: {last}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Registers the service's deployment with the admin API.
async fn register(admin_url: &str, service_port: u16) -> Result<()> {
    let url = format!("{admin_url}/deployments");
    let answer = reqwest::Client::new()
        .post(&url)
        .json(&serde_json::json!({ "uri": format!("http://127.0.0.1:{service_port}") }))
        .send()
        .await
        .with_context(|| format!("POST {url}"))?;
    if !answer.status().is_success() {
        let status = answer.status();
        let body = answer.text().await.unwrap_or_default();
        bail!("POST {url} answered {status}: {body}");
    }
    Ok(())
}
