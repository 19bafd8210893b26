//! The engines and workers under test, started one of two ways ([`Launch`]):
//!
//! - as child processes (the default): normally the bench binary itself,
//!   re-run with its hidden `engine` / `worker` subcommands, which serve with
//!   the same library code as `belay-engine` and `belay-worker` (so
//!   `cargo run -p belay-bench` always measures the current source and never a
//!   stale binary); or the real binaries, which take the same flags. Each
//!   child's peak RSS is its own `VmHWM`, read from `/proc/<pid>/status` just
//!   before it is stopped. A child ends when its stdin closes, so none outlives
//!   the bench;
//! - in-process, as tokio tasks of the bench (`--in-process`): engines,
//!   workers and the bench then share one peak RSS.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use belay_engine::coordinator::CoordinatorConfig;
use belay_engine::server::{self, Engine};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpListener;
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How long an engine may take to apply migrations and listen.
const ENGINE_READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long an in-process member may take to stop.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a worker waits for in-flight tasks when it stops, in ms.
pub const WORKER_SHUTDOWN_GRACE_MS: u64 = 1_000;

/// Settings of one engine.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// PostgreSQL URL.
    pub database_url: String,
    /// Lease of a claim or heartbeat, ms.
    pub lease_ms: u64,
    /// How often expired leases are looked for, ms.
    pub sweep_interval_ms: u64,
    /// Size of the engine's connection pool.
    pub db_connections: u32,
}

/// Settings of one worker. `Debug` never prints the API key.
#[derive(Clone)]
pub struct WorkerOptions {
    /// The engine's gRPC URL.
    pub engine_url: String,
    /// The worker's API key (role `worker`), sent with every call; a child
    /// process gets it in its environment (`BELAY_API_KEY`), never on its
    /// command line.
    pub api_key: String,
    /// The worker's id.
    pub worker_id: String,
    /// Tasks in flight at once.
    pub concurrency: usize,
    /// OpenAI-compatible base URL of the scripted model.
    pub model_base_url: String,
    /// Base URL of the no-op tool.
    pub http_base_url: String,
}

impl std::fmt::Debug for WorkerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerOptions")
            .field("engine_url", &self.engine_url)
            .field("api_key", &"<hidden>")
            .field("worker_id", &self.worker_id)
            .field("concurrency", &self.concurrency)
            .field("model_base_url", &self.model_base_url)
            .field("http_base_url", &self.http_base_url)
            .finish()
    }
}

/// Connects an engine's store, applies migrations and builds its
/// coordinator (`belay_engine::server`, as `belay-engine` does); serve it
/// with [`serve_engine`].
///
/// Errors: PostgreSQL unreachable, or a migration failing.
pub async fn start_engine(options: &EngineOptions) -> Result<Engine> {
    Engine::start(server::EngineOptions {
        key_cache_ttl: std::time::Duration::from_millis(env_u64(
            "BELAY_KEY_CACHE_MS",
            server::DEFAULT_KEY_CACHE_TTL.as_millis() as u64,
        )?),
        coordinator: CoordinatorConfig {
            lease_ms: options.lease_ms,
            sweep_interval_ms: options.sweep_interval_ms,
            dispatch_with_claim: env_u64("BELAY_DISPATCH_WITH_CLAIM", 1)? != 0,
            ..CoordinatorConfig::default()
        },
        ..server::EngineOptions::new(options.database_url.clone(), options.db_connections)
    })
    .await
    .context("starting the engine on PostgreSQL")
}

/// Serves an engine (gRPC API, LISTEN/NOTIFY relay, lease sweeper) on
/// `listener` until `shutdown` completes, as `belay-engine` does.
///
/// Errors: the transport failing.
pub async fn serve_engine(
    engine: Engine,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    Ok(engine
        .serve(server::Listeners::grpc_only(listener), shutdown)
        .await?)
}

/// Runs a worker until `shutdown` completes, as `belay-worker` does, its
/// readiness in `health`, served on `health_listen` (`/livez`, `/readyz`)
/// when given.
///
/// Errors: an invalid configuration, or `health_listen` not bindable.
pub async fn run_worker(
    options: &WorkerOptions,
    health: belay_worker::health::HealthState,
    health_listen: Option<std::net::SocketAddr>,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    if let Some(addr) = health_listen {
        let listener = belay_worker::health::bind(addr).await?;
        let state = health.clone();
        tokio::spawn(async move {
            if let Err(e) =
                belay_worker::health::serve(listener, state, std::future::pending()).await
            {
                tracing::error!(error = %e, "health endpoint stopped");
            }
        });
    }
    let mut config =
        belay_worker::WorkerConfig::new(options.engine_url.clone(), options.worker_id.clone());
    config.health = health;
    config.engine_auth.api_key = Some(options.api_key.clone());
    config.concurrency = options.concurrency.max(1);
    config.model.base_url = options.model_base_url.clone();
    config.http_base_url = Some(options.http_base_url.clone());
    // The no-op tool server runs on this machine.
    config.tool_network_policy = belay_worker::NetworkPolicy::allowing_loopback();
    config.shutdown_grace_ms = WORKER_SHUTDOWN_GRACE_MS;
    config.claim_with_reports = env_u64("BELAY_CLAIM_WITH_REPORTS", 1)? != 0;
    belay_worker::run(config, shutdown).await
}

/// The bench's A/B switches, read by its engine and worker processes
/// under the names `belay-engine` and `belay-worker` read them
/// (`BELAY_KEY_CACHE_MS`, `BELAY_CLAIM_WITH_REPORTS`,
/// `BELAY_DISPATCH_WITH_CLAIM`: `0` or `false` turns it off), so one build measures both sides of a change; `default` when
/// unset. Errors: a value that is no number (or boolean), naming it.
fn env_u64(name: &str, default: u64) -> Result<u64> {
    match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(v) if v.eq_ignore_ascii_case("true") => Ok(1),
        Ok(v) if v.eq_ignore_ascii_case("false") => Ok(0),
        Ok(v) => v
            .trim()
            .parse()
            .with_context(|| format!("{name}={v:?} is not a number of ms or a boolean")),
    }
}

/// Completes when this process's stdin reaches end of file (the parent
/// closed it, or died), or on SIGTERM or Ctrl-C: the shutdown of a child
/// started by [`Fleet`].
pub fn parent_gone() -> impl Future<Output = ()> + Send + 'static {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        // Any outcome, EOF or error, means the parent is gone.
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
        let _ = tx.send(());
    });
    async move {
        #[cfg(unix)]
        let terminate = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut signal) => {
                    signal.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        #[cfg(not(unix))]
        let terminate = std::future::pending::<()>();
        tokio::select! {
            _ = rx => {}
            _ = tokio::signal::ctrl_c() => {}
            () = terminate => {}
        }
    }
}

/// Peak resident set size (`VmHWM`) of a process (`None`: this one), in KiB.
///
/// Errors: `/proc/<pid>/status` unreadable or without `VmHWM`.
pub fn peak_rss_kib(pid: Option<u32>) -> Result<u64> {
    status_kib(pid, "VmHWM:")
}

/// Current resident set size (`VmRSS`) of a process (`None`: this one), in KiB.
///
/// Errors: `/proc/<pid>/status` unreadable or without `VmRSS`.
pub fn rss_kib(pid: Option<u32>) -> Result<u64> {
    status_kib(pid, "VmRSS:")
}

/// A `kB` field of `/proc/<pid>/status`.
fn status_kib(pid: Option<u32>, field: &str) -> Result<u64> {
    let path = match pid {
        Some(pid) => PathBuf::from(format!("/proc/{pid}/status")),
        None => PathBuf::from("/proc/self/status"),
    };
    let status =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow!("no {field} in {}", path.display()))
}

/// A program and the arguments that come before the role's flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildCommand {
    /// The executable.
    pub program: PathBuf,
    /// Leading arguments, e.g. `["engine"]` for the bench's own role.
    pub args: Vec<String>,
}

impl ChildCommand {
    /// The bench executable `exe` playing `role` (`engine` or `worker`).
    pub fn bench_role(exe: &Path, role: &str) -> ChildCommand {
        ChildCommand {
            program: exe.to_owned(),
            args: vec![role.to_owned()],
        }
    }

    /// The command line, for the configuration printout.
    pub fn display(&self) -> String {
        std::iter::once(self.program.display().to_string())
            .chain(self.args.iter().cloned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// A standalone binary (`belay-engine`, `belay-worker`).
    pub fn binary(program: PathBuf) -> ChildCommand {
        ChildCommand {
            program,
            args: Vec::new(),
        }
    }
}

/// Where engines and workers run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Launch {
    /// Each engine and each worker is a child process.
    Processes {
        /// How to start an engine; it must print `listening on http://<addr>`
        /// on stdout once it serves.
        engine: ChildCommand,
        /// How to start a worker.
        worker: ChildCommand,
    },
    /// Everything runs as tasks of the bench process.
    InProcess,
}

/// Peak RSS of the engines and workers, in KiB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeakRss {
    /// One figure per engine process (one figure in total when shared).
    pub engines_kib: Vec<u64>,
    /// One figure per worker process (one figure in total when shared).
    pub workers_kib: Vec<u64>,
    /// True when engines, workers and the bench share one process.
    pub shared_process: bool,
}

struct ChildProc {
    name: String,
    child: Child,
    log: PathBuf,
}

enum Member {
    Process(Box<ChildProc>),
    Task(JoinHandle<Result<()>>),
}

/// The running engines and workers.
pub struct Fleet {
    launch: Launch,
    log_dir: PathBuf,
    prefix: String,
    engines: Vec<Member>,
    workers: Vec<Member>,
    /// How to tell that each worker is ready (one per worker).
    ready: Vec<WorkerReadiness>,
    stop: watch::Sender<bool>,
}

/// Where a worker's readiness is read.
enum WorkerReadiness {
    /// An in-process worker's own state.
    State(belay_worker::health::HealthState),
    /// A child process's `/readyz` URL (`--health-listen`).
    Url(String),
}

/// How long [`Fleet::wait_workers_ready`] waits for each worker.
const WORKER_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The last lines of a log file, for error messages.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = &lines[lines.len().saturating_sub(15)..];
    if tail.is_empty() {
        format!("(log {} is empty)", path.display())
    } else {
        format!("last lines of {}:\n{}", path.display(), tail.join("\n"))
    }
}

impl Fleet {
    /// An empty fleet; child processes log (stderr) to files in `log_dir`
    /// named `<prefix>engine-<i>.log` and `<prefix>worker-<i>.log`.
    pub fn new(launch: Launch, log_dir: PathBuf, prefix: &str) -> Fleet {
        let (stop, _) = watch::channel(false);
        Fleet {
            launch,
            log_dir,
            prefix: prefix.to_owned(),
            engines: Vec::new(),
            workers: Vec::new(),
            ready: Vec::new(),
            stop,
        }
    }

    fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.stop.subscribe();
        async move {
            let _ = rx.wait_for(|stopped| *stopped).await;
        }
    }

    /// Starts `command` with `args`, and `env` set on top of this
    /// process's environment (less the settings that would change what is
    /// measured, and any API key of the caller's).
    fn spawn_child(
        &self,
        name: &str,
        command: &ChildCommand,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Result<ChildProc> {
        std::fs::create_dir_all(&self.log_dir)
            .with_context(|| format!("creating {}", self.log_dir.display()))?;
        let log = self.log_dir.join(format!("{name}.log"));
        let stderr =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut cmd = Command::new(&command.program);
        cmd.args(&command.args)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .kill_on_drop(true);
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "warn");
        }
        // Settings of the environment that would change what is measured.
        for var in [
            "BELAY_ADMIN_TOKENS",
            "BELAY_WEBHOOK_URL",
            "BELAY_WEBHOOK_SECRET",
            "BELAY_MODEL_API_KEY",
            "OPENAI_API_KEY",
            "ANTHROPIC_API_KEY",
            "BELAY_MODEL_PROVIDER",
            "BELAY_CLAIM_WAIT_MS",
            "BELAY_API_KEY",
        ] {
            cmd.env_remove(var);
        }
        // The admin endpoint (now served by default) is not needed, and
        // replicas must not fight over its fixed port.
        cmd.env("BELAY_ADMIN_LISTEN", "");
        // Replicas must not fight over belay-engine's fixed callback port
        // (the bench's own `engine` command ignores this).
        cmd.env("BELAY_CALLBACK_LISTEN", "127.0.0.1:0");
        cmd.envs(env.iter().copied());
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {name}: {}", command.program.display()))?;
        Ok(ChildProc {
            name: name.to_owned(),
            child,
            log,
        })
    }

    /// Starts an engine; returns its gRPC URL once it serves.
    ///
    /// Errors: the engine failing to start (its log's tail is in the message).
    pub async fn add_engine(&mut self, options: &EngineOptions) -> Result<String> {
        let index = self.engines.len();
        match &self.launch {
            Launch::InProcess => {
                let coord = start_engine(options).await?;
                let listener = TcpListener::bind("127.0.0.1:0").await?;
                let url = format!("http://{}", listener.local_addr()?);
                let stopped = self.stopped();
                self.engines.push(Member::Task(tokio::spawn(serve_engine(
                    coord, listener, stopped,
                ))));
                Ok(url)
            }
            Launch::Processes { engine, .. } => {
                let args = vec![
                    "--database-url".to_owned(),
                    options.database_url.clone(),
                    "--listen".to_owned(),
                    "127.0.0.1:0".to_owned(),
                    "--lease-ms".to_owned(),
                    options.lease_ms.to_string(),
                    "--sweep-interval-ms".to_owned(),
                    options.sweep_interval_ms.to_string(),
                    "--db-connections".to_owned(),
                    options.db_connections.to_string(),
                ];
                let mut proc = self.spawn_child(
                    &format!("{}engine-{index}", self.prefix),
                    engine,
                    &args,
                    &[],
                )?;
                let stdout = proc
                    .child
                    .stdout
                    .take()
                    .ok_or_else(|| anyhow!("engine stdout not captured"))?;
                let mut lines = BufReader::new(stdout).lines();
                let found = tokio::time::timeout(ENGINE_READY_TIMEOUT, async {
                    while let Some(line) = lines.next_line().await? {
                        if let Some(url) = line.trim().strip_prefix("listening on ") {
                            return Ok::<_, std::io::Error>(Some(url.to_owned()));
                        }
                    }
                    Ok(None)
                })
                .await;
                let url = match found {
                    Ok(Ok(Some(url))) => url,
                    Ok(Ok(None)) | Ok(Err(_)) => {
                        let status = proc.child.wait().await.ok();
                        bail!(
                            "{} exited before listening ({status:?}); {}",
                            proc.name,
                            log_tail(&proc.log)
                        )
                    }
                    Err(_) => bail!(
                        "{} did not listen within {} s; {}",
                        proc.name,
                        ENGINE_READY_TIMEOUT.as_secs(),
                        log_tail(&proc.log)
                    ),
                };
                // Keep reading stdout so the child never blocks on a full pipe.
                tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
                self.engines.push(Member::Process(Box::new(proc)));
                Ok(url)
            }
        }
    }

    /// Starts a worker.
    ///
    /// Errors: the worker process failing to start.
    pub fn add_worker(&mut self, options: &WorkerOptions) -> Result<()> {
        let index = self.workers.len();
        match &self.launch {
            Launch::InProcess => {
                let options = options.clone();
                let stopped = self.stopped();
                let health = belay_worker::health::HealthState::default();
                self.ready.push(WorkerReadiness::State(health.clone()));
                self.workers.push(Member::Task(tokio::spawn(async move {
                    run_worker(&options, health, None, stopped).await
                })));
            }
            Launch::Processes { worker, .. } => {
                // A free port for its health endpoint (free when asked; the
                // worker binds it moments later).
                let health_addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
                self.ready
                    .push(WorkerReadiness::Url(format!("http://{health_addr}/readyz")));
                let args = vec![
                    "--health-listen".to_owned(),
                    health_addr.to_string(),
                    "--engine-url".to_owned(),
                    options.engine_url.clone(),
                    "--worker-id".to_owned(),
                    options.worker_id.clone(),
                    "--concurrency".to_owned(),
                    options.concurrency.to_string(),
                    "--model-base-url".to_owned(),
                    options.model_base_url.clone(),
                    "--http-base-url".to_owned(),
                    options.http_base_url.clone(),
                    "--allow-private-network".to_owned(),
                    "127.0.0.0/8,::1".to_owned(),
                    "--shutdown-grace-ms".to_owned(),
                    WORKER_SHUTDOWN_GRACE_MS.to_string(),
                ];
                let mut proc = self.spawn_child(
                    &format!("{}worker-{index}", self.prefix),
                    worker,
                    &args,
                    &[("BELAY_API_KEY", &options.api_key)],
                )?;
                if let Some(stdout) = proc.child.stdout.take() {
                    tokio::spawn(async move {
                        let mut lines = BufReader::new(stdout).lines();
                        while let Ok(Some(_)) = lines.next_line().await {}
                    });
                }
                self.workers.push(Member::Process(Box::new(proc)));
            }
        }
        Ok(())
    }

    /// Waits until every worker is ready (a claim of its has been answered
    /// by its engine: `/readyz` answers 200; a worker's first claim does not
    /// long-poll, so this takes moments), so that the workload does not
    /// time the workers' start-up. Child processes are asked every 10 ms.
    ///
    /// Errors: an engine or worker that stopped (named, with its log's
    /// tail), or a worker not ready within 30 s.
    pub async fn wait_workers_ready(&mut self) -> Result<()> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(1))
            .build()?;
        for i in 0..self.ready.len() {
            let deadline = tokio::time::Instant::now() + WORKER_READY_TIMEOUT;
            loop {
                self.check_alive()?;
                let ready = match &self.ready[i] {
                    WorkerReadiness::State(health) => tokio::time::timeout(
                        Duration::from_millis(10),
                        health.wait_for(|r| *r == belay_worker::health::Readiness::Ready),
                    )
                    .await
                    .is_ok(),
                    WorkerReadiness::Url(url) => {
                        let ok = http
                            .get(url)
                            .send()
                            .await
                            .is_ok_and(|r| r.status().is_success());
                        if !ok {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        ok
                    }
                };
                if ready {
                    break;
                }
                if tokio::time::Instant::now() >= deadline {
                    bail!("worker {i} was not ready within 30 s");
                }
            }
        }
        Ok(())
    }

    /// Fails if an engine or worker has stopped on its own.
    ///
    /// Errors: the member that stopped, with its log's tail.
    pub fn check_alive(&mut self) -> Result<()> {
        for member in self.engines.iter_mut().chain(self.workers.iter_mut()) {
            match member {
                Member::Process(proc) => {
                    if let Some(status) = proc.child.try_wait()? {
                        bail!("{} stopped ({status}); {}", proc.name, log_tail(&proc.log));
                    }
                }
                Member::Task(handle) => {
                    if handle.is_finished() {
                        bail!("an in-process engine or worker stopped");
                    }
                }
            }
        }
        Ok(())
    }

    /// Peak RSS of every engine and worker so far.
    ///
    /// Errors: `/proc` unreadable.
    pub fn peak_rss(&self) -> Result<PeakRss> {
        if self.launch == Launch::InProcess {
            let own = peak_rss_kib(None)?;
            return Ok(PeakRss {
                engines_kib: vec![own],
                workers_kib: vec![own],
                shared_process: true,
            });
        }
        let read = |members: &[Member]| -> Result<Vec<u64>> {
            members
                .iter()
                .filter_map(|m| match m {
                    Member::Process(proc) => Some(proc),
                    Member::Task(_) => None,
                })
                .map(|proc| {
                    let pid = proc
                        .child
                        .id()
                        .ok_or_else(|| anyhow!("{} has already exited", proc.name))?;
                    peak_rss_kib(Some(pid))
                })
                .collect()
        };
        Ok(PeakRss {
            engines_kib: read(&self.engines)?,
            workers_kib: read(&self.workers)?,
            shared_process: false,
        })
    }

    /// CPU time (user + system) of the engines and of the workers, each
    /// summed, ms; `None` in-process (then it is the bench's own).
    ///
    /// Errors: `/proc` unreadable, or a member has exited.
    pub fn cpu_ms(&self) -> Result<Option<(f64, f64)>> {
        if self.launch == Launch::InProcess {
            return Ok(None);
        }
        let sum = |members: &[Member]| -> Result<f64> {
            let mut ms = 0.0;
            for member in members {
                if let Member::Process(proc) = member {
                    let pid = proc
                        .child
                        .id()
                        .ok_or_else(|| anyhow!("{} has already exited", proc.name))?;
                    ms += crate::cpu::process_cpu_ms(Some(pid), true)?;
                }
            }
            Ok(ms)
        };
        Ok(Some((sum(&self.engines)?, sum(&self.workers)?)))
    }

    /// Current RSS of every engine process (this process's own when
    /// in-process), KiB.
    ///
    /// Errors: `/proc` unreadable.
    pub fn current_rss(&self) -> Result<Vec<u64>> {
        if self.launch == Launch::InProcess {
            return Ok(vec![rss_kib(None)?]);
        }
        self.engines
            .iter()
            .filter_map(|m| match m {
                Member::Process(proc) => Some(proc),
                Member::Task(_) => None,
            })
            .map(|proc| {
                let pid = proc
                    .child
                    .id()
                    .ok_or_else(|| anyhow!("{} has already exited", proc.name))?;
                rss_kib(Some(pid))
            })
            .collect()
    }

    /// Stops every worker, then every engine (child processes are killed).
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        let members = std::mem::take(&mut self.workers)
            .into_iter()
            .chain(std::mem::take(&mut self.engines));
        for member in members {
            match member {
                Member::Process(mut proc) => {
                    if let Err(e) = proc.child.kill().await {
                        tracing::warn!(name = proc.name, error = %e, "cannot kill");
                    }
                }
                Member::Task(handle) => {
                    let abort = handle.abort_handle();
                    if tokio::time::timeout(STOP_TIMEOUT, handle).await.is_err() {
                        abort.abort();
                    }
                }
            }
        }
    }
}
