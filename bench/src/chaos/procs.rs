//! The engines and workers under test: real `belay-engine` and
//! `belay-worker` processes, each started, SIGKILLed and started again by
//! the harness, none of them waited for in a way that stops the harness.
//!
//! Every slot is a small state machine (`Down` with a time to start again,
//! `Starting` until an engine prints its `listening on` line, `Up`), moved on
//! by [`Supervisor::tick`]. An engine listens on a new free port each time
//! and its [`Proxy`] is pointed at it, so workers and clients keep one
//! address. A worker starts each time under a new id (`chaos-w<j>-<n>`), so
//! the ids of killed workers are known: no task may stay leased by one.
//! A process that exits by itself is recorded (with its status) and started
//! again. Each start logs (stderr) to its own file in the log folder.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::proxy::Proxy;

/// How long after a failed start a slot tries again.
const RETRY_START: Duration = Duration::from_millis(500);
/// How long an engine may take to print its address before it is killed
/// and started again.
const ENGINE_START_TIMEOUT: Duration = Duration::from_secs(60);

/// How every process is started.
#[derive(Clone)]
pub struct ProcSpec {
    /// The `belay-engine` executable.
    pub engine_bin: PathBuf,
    /// The `belay-worker` executable.
    pub worker_bin: PathBuf,
    /// Where the processes' logs go.
    pub log_dir: PathBuf,
    /// The engines' database URL (through the PostgreSQL proxy).
    pub database_url: String,
    /// The engines' lease, ms.
    pub lease_ms: u64,
    /// The engines' sweep interval, ms.
    pub sweep_interval_ms: u64,
    /// Each engine's pool size.
    pub db_connections: u32,
    /// The workers' API key (role `worker`); given in their environment.
    pub worker_key: String,
    /// The tool server's base URL as workers reach it (through its proxy);
    /// the model is at `<url>/v1`.
    pub tool_url: String,
    /// The workers' model timeout, ms.
    pub model_timeout_ms: u64,
    /// Tasks each worker runs at once.
    pub worker_concurrency: u32,
}

impl std::fmt::Debug for ProcSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcSpec")
            .field("engine_bin", &self.engine_bin)
            .field("worker_bin", &self.worker_bin)
            .field("worker_key", &"<hidden>")
            .finish_non_exhaustive()
    }
}

enum SlotState {
    /// Not running; starts again at this instant (`None`: not until told).
    Down(Option<Instant>),
    /// Started; an engine's address arrives on the channel.
    Starting {
        child: Child,
        address: Option<oneshot::Receiver<SocketAddr>>,
        since: Instant,
    },
    /// Running.
    Up(Child),
}

/// A process that ended without the harness killing it.
#[derive(Debug, Clone)]
pub struct Exit {
    /// `engine-0`, `worker-2`.
    pub name: String,
    /// Its exit status, in words.
    pub status: String,
    /// Its log file.
    pub log: PathBuf,
}

struct Slot {
    name: String,
    starts: u32,
    state: SlotState,
    log: PathBuf,
    /// Workers: the id of the current (or last) start.
    worker_id: String,
}

/// The engines and workers.
pub struct Supervisor {
    spec: ProcSpec,
    engines: Vec<Slot>,
    engine_proxies: Vec<Proxy>,
    workers: Vec<Slot>,
    dead_worker_ids: BTreeSet<String>,
    exits: Vec<Exit>,
    logs: Vec<PathBuf>,
}

impl Supervisor {
    /// Slots for an engine behind each of `engine_proxies` and `workers`
    /// workers (worker `j` talks to engine `j mod E`), all down; [`tick`]
    /// starts them.
    ///
    /// [`tick`]: Supervisor::tick
    pub fn new(spec: ProcSpec, engine_proxies: Vec<Proxy>, workers: u32) -> Supervisor {
        let now = Some(Instant::now());
        let slot = |name: String| Slot {
            name,
            starts: 0,
            state: SlotState::Down(now),
            log: PathBuf::new(),
            worker_id: String::new(),
        };
        Supervisor {
            engines: (0..engine_proxies.len())
                .map(|i| slot(format!("engine-{i}")))
                .collect(),
            engine_proxies,
            workers: (0..workers).map(|j| slot(format!("worker-{j}"))).collect(),
            spec,
            dead_worker_ids: BTreeSet::new(),
            exits: Vec::new(),
            logs: Vec::new(),
        }
    }

    /// The engines' proxies (clients and workers connect to these).
    pub fn engine_proxies(&self) -> &[Proxy] {
        &self.engine_proxies
    }

    /// Engines.
    pub fn engine_count(&self) -> usize {
        self.engines.len()
    }

    /// Workers.
    pub fn worker_count(&self) -> usize {
        self.workers.len()
    }

    /// Moves every slot on: starts what is due, notices engines that now
    /// listen, and records processes that exited by themselves.
    ///
    /// Errors: a process that cannot be spawned at all (missing binary).
    pub fn tick(&mut self) -> Result<()> {
        let now = Instant::now();
        for i in 0..self.engines.len() {
            self.tick_engine(i, now)?;
        }
        for j in 0..self.workers.len() {
            self.tick_worker(j, now)?;
        }
        Ok(())
    }

    fn tick_engine(&mut self, i: usize, now: Instant) -> Result<()> {
        let state = std::mem::replace(&mut self.engines[i].state, SlotState::Down(None));
        self.engines[i].state = match state {
            SlotState::Down(Some(at)) if at <= now => self.spawn_engine(i)?,
            SlotState::Starting {
                mut child,
                mut address,
                since,
            } => {
                if let Some(status) = child.try_wait()? {
                    self.exited(i, true, &status.to_string());
                    SlotState::Down(Some(now + RETRY_START))
                } else if let Some(addr) = address.as_mut().and_then(|rx| rx.try_recv().ok()) {
                    self.engine_proxies[i].set_upstream(addr);
                    SlotState::Up(child)
                } else if now.duration_since(since) > ENGINE_START_TIMEOUT {
                    let _ = child.start_kill();
                    self.exited(i, true, "did not listen in time (killed)");
                    SlotState::Down(Some(now + RETRY_START))
                } else {
                    SlotState::Starting {
                        child,
                        address,
                        since,
                    }
                }
            }
            SlotState::Up(mut child) => match child.try_wait()? {
                Some(status) => {
                    self.exited(i, true, &status.to_string());
                    SlotState::Down(Some(now + RETRY_START))
                }
                None => SlotState::Up(child),
            },
            other => other,
        };
        Ok(())
    }

    fn tick_worker(&mut self, j: usize, now: Instant) -> Result<()> {
        let state = std::mem::replace(&mut self.workers[j].state, SlotState::Down(None));
        self.workers[j].state = match state {
            SlotState::Down(Some(at)) if at <= now => self.spawn_worker(j)?,
            SlotState::Up(mut child) => match child.try_wait()? {
                Some(status) => {
                    self.exited(j, false, &status.to_string());
                    let id = self.workers[j].worker_id.clone();
                    self.dead_worker_ids.insert(id);
                    SlotState::Down(Some(now + RETRY_START))
                }
                None => SlotState::Up(child),
            },
            other => other,
        };
        Ok(())
    }

    fn exited(&mut self, index: usize, engine: bool, status: &str) {
        let slot = if engine {
            &self.engines[index]
        } else {
            &self.workers[index]
        };
        self.exits.push(Exit {
            name: slot.name.clone(),
            status: status.to_owned(),
            log: slot.log.clone(),
        });
    }

    fn log_file(&mut self, name: &str, start: u32) -> Result<(PathBuf, std::fs::File)> {
        std::fs::create_dir_all(&self.spec.log_dir)
            .with_context(|| format!("creating {}", self.spec.log_dir.display()))?;
        let path = self.spec.log_dir.join(format!("{name}.{start}.log"));
        let file =
            std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        self.logs.push(path.clone());
        Ok((path, file))
    }

    fn command(&self, program: &Path, log: std::fs::File) -> Command {
        let mut cmd = Command::new(program);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true);
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "warn");
        }
        // Settings of the caller's environment that would change the setup.
        for var in [
            "DATABASE_URL",
            "BELAY_ADMIN_TOKENS",
            "BELAY_WEBHOOK_URL",
            "BELAY_WEBHOOK_SECRET",
            "BELAY_MODEL_API_KEY",
            "OPENAI_API_KEY",
            "ANTHROPIC_API_KEY",
            "BELAY_MODEL_PROVIDER",
            "BELAY_CLAIM_WAIT_MS",
            "BELAY_API_KEY",
            "BELAY_ENGINE_URL",
            "BELAY_WORKER_POOL",
            "BELAY_MCP_CONFIG",
            "BELAY_MCP_LISTEN",
        ] {
            cmd.env_remove(var);
        }
        cmd
    }

    fn spawn_engine(&mut self, i: usize) -> Result<SlotState> {
        let start = self.engines[i].starts;
        self.engines[i].starts += 1;
        let name = self.engines[i].name.clone();
        let (log, file) = self.log_file(&name, start)?;
        self.engines[i].log = log;
        let spec = &self.spec;
        let mut cmd = self.command(&spec.engine_bin, file);
        let args: Vec<String> = vec![
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--lease-ms".into(),
            spec.lease_ms.to_string(),
            "--sweep-interval-ms".into(),
            spec.sweep_interval_ms.to_string(),
            "--db-connections".into(),
            spec.db_connections.to_string(),
            "--callback-listen".into(),
            "127.0.0.1:0".into(),
        ];
        cmd.args(args)
            .env("DATABASE_URL", &spec.database_url)
            // No admin endpoint: the harness reads the database itself.
            .env("BELAY_ADMIN_LISTEN", "");
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {name}: {}", spec.engine_bin.display()))?;
        let (tx, rx) = oneshot::channel();
        if let Some(stdout) = child.stdout.take() {
            tokio::spawn(read_address(stdout, tx));
        }
        Ok(SlotState::Starting {
            child,
            address: Some(rx),
            since: Instant::now(),
        })
    }

    fn spawn_worker(&mut self, j: usize) -> Result<SlotState> {
        let start = self.workers[j].starts;
        self.workers[j].starts += 1;
        let name = self.workers[j].name.clone();
        let (log, file) = self.log_file(&name, start)?;
        self.workers[j].log = log;
        let id = format!("chaos-w{j}-{start}");
        self.workers[j].worker_id = id.clone();
        let engine = format!(
            "http://{}",
            self.engine_proxies[j % self.engine_proxies.len()].addr()
        );
        let spec = &self.spec;
        let mut cmd = self.command(&spec.worker_bin, file);
        let args: Vec<String> = vec![
            "--engine-url".into(),
            engine,
            "--worker-id".into(),
            id,
            "--model-base-url".into(),
            format!("{}/v1", spec.tool_url),
            "--http-base-url".into(),
            spec.tool_url.clone(),
            "--allow-private-network".into(),
            "127.0.0.0/8,::1".into(),
            "--concurrency".into(),
            spec.worker_concurrency.to_string(),
            "--model-provider".into(),
            "openai".into(),
            "--model-timeout-ms".into(),
            spec.model_timeout_ms.to_string(),
            "--shutdown-grace-ms".into(),
            "1000".into(),
        ];
        cmd.args(args).env("BELAY_API_KEY", &spec.worker_key);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {name}: {}", spec.worker_bin.display()))?;
        if let Some(stdout) = child.stdout.take() {
            tokio::spawn(drain(stdout));
        }
        Ok(SlotState::Up(child))
    }

    /// SIGKILLs engine `i` (if it runs) and starts it again after `down`.
    /// Returns whether it was running.
    pub async fn kill_engine(&mut self, i: usize, down: Duration) -> bool {
        let state = std::mem::replace(
            &mut self.engines[i].state,
            SlotState::Down(Some(Instant::now() + down)),
        );
        match state {
            SlotState::Up(mut child) | SlotState::Starting { mut child, .. } => {
                let _ = child.kill().await;
                true
            }
            SlotState::Down(at) => {
                self.engines[i].state = SlotState::Down(at);
                false
            }
        }
    }

    /// SIGKILLs worker `j` (if it runs) and starts it again, under a new
    /// id, after `down`. Returns whether it was running.
    pub async fn kill_worker(&mut self, j: usize, down: Duration) -> bool {
        let state = std::mem::replace(
            &mut self.workers[j].state,
            SlotState::Down(Some(Instant::now() + down)),
        );
        match state {
            SlotState::Up(mut child) | SlotState::Starting { mut child, .. } => {
                let _ = child.kill().await;
                let id = self.workers[j].worker_id.clone();
                self.dead_worker_ids.insert(id);
                true
            }
            SlotState::Down(at) => {
                self.workers[j].state = SlotState::Down(at);
                false
            }
        }
    }

    /// Whether every engine listens and every worker runs.
    pub fn all_up(&self) -> bool {
        self.engines
            .iter()
            .chain(&self.workers)
            .all(|s| matches!(s.state, SlotState::Up(_)))
    }

    /// Whether engine `i` listens.
    pub fn engine_up(&self, i: usize) -> bool {
        matches!(self.engines[i].state, SlotState::Up(_))
    }

    /// Starts everything that is down now, and waits until all is up.
    ///
    /// Errors: not all up within `timeout` (what is not, and the last
    /// exits).
    pub async fn bring_all_up(&mut self, timeout: Duration) -> Result<()> {
        let now = Instant::now();
        for slot in self.engines.iter_mut().chain(self.workers.iter_mut()) {
            if let SlotState::Down(_) = slot.state {
                slot.state = SlotState::Down(Some(now));
            }
        }
        let deadline = now + timeout;
        loop {
            self.tick()?;
            if self.all_up() {
                return Ok(());
            }
            if Instant::now() > deadline {
                let down: Vec<&str> = self
                    .engines
                    .iter()
                    .chain(&self.workers)
                    .filter(|s| !matches!(s.state, SlotState::Up(_)))
                    .map(|s| s.name.as_str())
                    .collect();
                bail!(
                    "not running after {} s: {}; last exits: {:?}",
                    timeout.as_secs(),
                    down.join(", "),
                    self.exits.iter().rev().take(3).collect::<Vec<_>>()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Ids of the workers that were killed or exited.
    pub fn dead_worker_ids(&self) -> &BTreeSet<String> {
        &self.dead_worker_ids
    }

    /// Processes that ended by themselves.
    pub fn exits(&self) -> &[Exit] {
        &self.exits
    }

    /// Every log file written.
    pub fn logs(&self) -> &[PathBuf] {
        &self.logs
    }

    /// Starts of each kind so far: (engines, workers).
    pub fn starts(&self) -> (u32, u32) {
        let sum = |slots: &[Slot]| slots.iter().map(|s| s.starts).sum();
        (sum(&self.engines), sum(&self.workers))
    }

    /// Kills every worker, then every engine.
    pub async fn stop(&mut self) {
        for slot in self.workers.iter_mut().chain(self.engines.iter_mut()) {
            let state = std::mem::replace(&mut slot.state, SlotState::Down(None));
            if let SlotState::Up(mut child) | SlotState::Starting { mut child, .. } = state {
                let _ = child.kill().await;
            }
        }
    }
}

/// Sends the address of an engine's first `listening on http://…` line,
/// then keeps reading so that the engine never blocks on a full pipe.
async fn read_address(stdout: tokio::process::ChildStdout, tx: oneshot::Sender<SocketAddr>) {
    let mut lines = BufReader::new(stdout).lines();
    let mut tx = Some(tx);
    while let Ok(Some(line)) = lines.next_line().await {
        let addr = line
            .trim()
            .strip_prefix("listening on http://")
            .and_then(|a| a.parse().ok());
        if let Some(addr) = addr
            && let Some(tx) = tx.take()
        {
            let _ = tx.send(addr);
        }
    }
}

async fn drain(stdout: tokio::process::ChildStdout) {
    let mut lines = BufReader::new(stdout).lines();
    while let Ok(Some(_)) = lines.next_line().await {}
}
