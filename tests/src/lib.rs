//! Harness for Belay's end-to-end tests: a fresh database per test (a
//! PostgreSQL database, or a SQLite file: [`DbBackend`]), and real engine,
//! worker, scripted-model and CRM processes that tests can kill with SIGKILL
//! and restart. [`on_both_backends!`] runs a test on each backend.
//!
//! Binaries are found next to the test executable (`target/<profile>/`), so
//! build them first: `cargo build --workspace --bins`.

pub mod pki;
pub mod source_scan;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use belay_sdk::{Client, ConnectOptions, RunEvent, StartOptions};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Base URL of the PostgreSQL server (without database).
pub fn pg_base() -> String {
    std::env::var("BELAY_TEST_PG").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

/// Root of the repository.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// Path of a workspace binary next to the running test executable.
pub fn bin(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    // target/<profile>/deps/<test> → target/<profile>/<name>
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| anyhow!("cannot locate target dir from {}", exe.display()))?;
    let path = dir.join(name);
    if !path.exists() {
        bail!(
            "{} not found: run `cargo build --workspace --bins` first",
            path.display()
        );
    }
    Ok(path)
}

/// Which store a test's engines run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbBackend {
    /// A fresh database on the local PostgreSQL server.
    Postgres,
    /// A fresh SQLite file in a temporary directory (one engine at a time).
    Sqlite,
}

/// Generate, for each named `async fn name(backend: DbBackend) ->
/// anyhow::Result<()>` in the calling module, a test `postgres::name` and a
/// test `sqlite::name`.
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() -> anyhow::Result<()> {
                    super::$name($crate::DbBackend::Postgres).await
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() -> anyhow::Result<()> {
                    super::$name($crate::DbBackend::Sqlite).await
                }
            )*
        }
    };
}

/// A database created for one test, dropped by [`TestDb::drop_db`].
pub struct TestDb {
    /// Database name (PostgreSQL) or file name (SQLite).
    pub name: String,
    /// Full URL (`postgres://…` or `sqlite://…`).
    pub url: String,
    /// Which backend.
    pub backend: DbBackend,
    /// The SQLite file's directory, removed with the database.
    dir: Option<PathBuf>,
}

impl TestDb {
    /// Create a fresh, empty PostgreSQL database.
    pub async fn create() -> Result<TestDb> {
        Self::create_on(DbBackend::Postgres).await
    }

    /// Create a fresh, empty database on `backend`.
    pub async fn create_on(backend: DbBackend) -> Result<TestDb> {
        let name = format!("belay_t_{}", uuid::Uuid::new_v4().simple());
        if backend == DbBackend::Sqlite {
            let dir = std::env::temp_dir().join(&name);
            std::fs::create_dir_all(&dir)?;
            let file = dir.join("belay.db");
            return Ok(TestDb {
                url: format!("sqlite://{}", file.display()),
                name,
                backend,
                dir: Some(dir),
            });
        }
        let admin = sqlx::PgPool::connect(&format!("{}/postgres", pg_base()))
            .await
            .context("connecting to PostgreSQL (is it running on 127.0.0.1:5432?)")?;
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&admin)
            .await?;
        admin.close().await;
        Ok(TestDb {
            url: format!("{}/{name}", pg_base()),
            name,
            backend,
            dir: None,
        })
    }

    /// Number of runs in the database (every tenant).
    pub async fn count_runs(&self) -> Result<i64> {
        match self.backend {
            DbBackend::Postgres => {
                let pool = sqlx::PgPool::connect(&self.url).await?;
                let n = sqlx::query_scalar("SELECT count(*) FROM runs")
                    .fetch_one(&pool)
                    .await?;
                pool.close().await;
                Ok(n)
            }
            DbBackend::Sqlite => {
                let pool = sqlx::SqlitePool::connect(&self.url).await?;
                let n = sqlx::query_scalar("SELECT count(*) FROM runs")
                    .fetch_one(&pool)
                    .await?;
                pool.close().await;
                Ok(n)
            }
        }
    }

    /// Status of a run's task for `call_id` (`ready`, `leased`, `uncertain`, …).
    pub async fn task_status(&self, run_id: &str, call_id: &str) -> Result<String> {
        let run = uuid::Uuid::parse_str(run_id)?;
        match self.backend {
            DbBackend::Postgres => {
                let pool = sqlx::PgPool::connect(&self.url).await?;
                let s = sqlx::query_scalar(
                    "SELECT status FROM tasks WHERE run_id = $1 AND call_id = $2",
                )
                .bind(run)
                .bind(call_id)
                .fetch_one(&pool)
                .await?;
                pool.close().await;
                Ok(s)
            }
            DbBackend::Sqlite => {
                let pool = sqlx::SqlitePool::connect(&self.url).await?;
                let s = sqlx::query_scalar(
                    "SELECT status FROM tasks WHERE run_id = ?1 AND call_id = ?2",
                )
                .bind(run)
                .bind(call_id)
                .fetch_one(&pool)
                .await?;
                pool.close().await;
                Ok(s)
            }
        }
    }

    /// The spec (JSON) of a run's task for `call_id`: for a model call, the
    /// transcript the model was sent.
    pub async fn task_spec(&self, run_id: &str, call_id: &str) -> Result<Value> {
        let run = uuid::Uuid::parse_str(run_id)?;
        match self.backend {
            DbBackend::Postgres => {
                let pool = sqlx::PgPool::connect(&self.url).await?;
                let spec: Value =
                    sqlx::query_scalar("SELECT spec FROM tasks WHERE run_id = $1 AND call_id = $2")
                        .bind(run)
                        .bind(call_id)
                        .fetch_one(&pool)
                        .await?;
                pool.close().await;
                Ok(spec)
            }
            DbBackend::Sqlite => {
                let pool = sqlx::SqlitePool::connect(&self.url).await?;
                let spec: String =
                    sqlx::query_scalar("SELECT spec FROM tasks WHERE run_id = ?1 AND call_id = ?2")
                        .bind(run)
                        .bind(call_id)
                        .fetch_one(&pool)
                        .await?;
                pool.close().await;
                Ok(serde_json::from_str(&spec)?)
            }
        }
    }

    /// Status of a run's task for `call_id` and how long, in ms by the
    /// engine's clock (`belay_clock`), until it becomes claimable (negative:
    /// it already is): the persisted next-attempt time of a retry.
    pub async fn task_ready_in_ms(&self, run_id: &str, call_id: &str) -> Result<(String, f64)> {
        let run = uuid::Uuid::parse_str(run_id)?;
        match self.backend {
            DbBackend::Postgres => {
                let pool = sqlx::PgPool::connect(&self.url).await?;
                let row: (String, f64) = sqlx::query_as(
                    "SELECT status, (EXTRACT(EPOCH FROM (available_at - belay_now())) * 1000)::float8
                     FROM tasks WHERE run_id = $1 AND call_id = $2",
                )
                .bind(run)
                .bind(call_id)
                .fetch_one(&pool)
                .await?;
                pool.close().await;
                Ok(row)
            }
            DbBackend::Sqlite => {
                let pool = sqlx::SqlitePool::connect(&self.url).await?;
                let row: (String, f64) = sqlx::query_as(
                    "SELECT status, (julianday(available_at) - julianday('now',
                         COALESCE((SELECT printf('%+.3f seconds', offset_ms / 1000.0) FROM belay_clock WHERE id = 1), '+0 seconds')))
                         * 86400000.0
                     FROM tasks WHERE run_id = ?1 AND call_id = ?2",
                )
                .bind(run)
                .bind(call_id)
                .fetch_one(&pool)
                .await?;
                pool.close().await;
                Ok(row)
            }
        }
    }

    /// Move the engine's clock forward by `ms` (the offset in
    /// `belay_clock`, as `Store::advance_clock` does), for every engine on
    /// this database, running or not: leases, retry delays and timers are
    /// judged by it, and events are stamped with it.
    pub async fn advance_clock(&self, ms: i64) -> Result<()> {
        let updated = match self.backend {
            DbBackend::Postgres => {
                let pool = sqlx::PgPool::connect(&self.url).await?;
                let done =
                    sqlx::query("UPDATE belay_clock SET offset_ms = offset_ms + $1 WHERE id = 1")
                        .bind(ms)
                        .execute(&pool)
                        .await?;
                pool.close().await;
                done.rows_affected()
            }
            DbBackend::Sqlite => {
                let pool = sqlx::SqlitePool::connect(&self.url).await?;
                let done =
                    sqlx::query("UPDATE belay_clock SET offset_ms = offset_ms + ?1 WHERE id = 1")
                        .bind(ms)
                        .execute(&pool)
                        .await?;
                pool.close().await;
                done.rows_affected()
            }
        };
        if updated != 1 {
            bail!("belay_clock has no row 1 (are the migrations applied?)");
        }
        Ok(())
    }

    /// Every row of `table`, each as one line of text (PostgreSQL: the row
    /// as JSON; SQLite: its columns `quote`d, blobs as hex), for tests that
    /// look for what must never be stored.
    pub async fn dump_table(&self, table: &str) -> Result<Vec<String>> {
        match self.backend {
            DbBackend::Postgres => {
                let pool = sqlx::PgPool::connect(&self.url).await?;
                let rows: Vec<(String,)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                    "SELECT to_jsonb(t)::text FROM {table} t"
                )))
                .fetch_all(&pool)
                .await?;
                pool.close().await;
                Ok(rows.into_iter().map(|r| r.0).collect())
            }
            DbBackend::Sqlite => {
                let pool = sqlx::SqlitePool::connect(&self.url).await?;
                let columns: Vec<(String,)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                    "SELECT name FROM pragma_table_info('{table}') ORDER BY cid"
                )))
                .fetch_all(&pool)
                .await?;
                let quoted: Vec<String> =
                    columns.iter().map(|(c,)| format!("quote({c})")).collect();
                let rows: Vec<(String,)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                    "SELECT json_array({}) FROM {table}",
                    quoted.join(", ")
                )))
                .fetch_all(&pool)
                .await?;
                pool.close().await;
                Ok(rows.into_iter().map(|r| r.0).collect())
            }
        }
    }

    /// Drop the database (terminating leftover connections) or remove the
    /// SQLite file.
    pub async fn drop_db(&self) -> Result<()> {
        if let Some(dir) = &self.dir {
            std::fs::remove_dir_all(dir)?;
            return Ok(());
        }
        let admin = sqlx::PgPool::connect(&format!("{}/postgres", pg_base())).await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        )))
        .execute(&admin)
        .await?;
        admin.close().await;
        Ok(())
    }
}

/// A spawned process that printed `listening on <url>`.
pub struct Proc {
    /// Name for messages.
    pub name: String,
    /// URL it listens on (empty for workers).
    pub url: String,
    /// Every `listening on` URL it printed, in order (engines print the
    /// gRPC URL, then the admin URL).
    pub urls: Vec<String>,
    /// The file its stderr (its log) goes to.
    pub log: PathBuf,
    child: Child,
}

impl Proc {
    /// Spawn `bin args…`; if `wait_listen`, wait for its `listening on` line.
    pub async fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(&str, String)],
        wait_listen: bool,
    ) -> Result<Proc> {
        Self::spawn_lines(name, program, args, env, usize::from(wait_listen)).await
    }

    /// Spawn and wait for `lines_wanted` lines of the form `… listening on <url>`.
    pub async fn spawn_lines(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(&str, String)],
        lines_wanted: usize,
    ) -> Result<Proc> {
        let log_dir = std::env::temp_dir().join("belay-test-logs");
        std::fs::create_dir_all(&log_dir)?;
        let log_path = log_dir.join(format!("{name}-{}.log", uuid::Uuid::new_v4().simple()));
        let log = std::fs::File::create(&log_path)?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.env(
            "RUST_LOG",
            std::env::var("BELAY_TEST_LOG").unwrap_or_else(|_| "info,sqlx=warn".into()),
        );
        let mut child = cmd
            .spawn()
            .with_context(|| format!("spawning {}", program.display()))?;
        let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
        let mut lines = BufReader::new(stdout).lines();
        let mut urls = Vec::new();
        for _ in 0..lines_wanted {
            let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
                .await
                .with_context(|| format!("{name} did not start within 60 s"))??
                .ok_or_else(|| anyhow!("{name} exited before listening"))?;
            let (_, url) = line
                .split_once("listening on ")
                .ok_or_else(|| anyhow!("{name} printed {line:?}, expected `listening on …`"))?;
            urls.push(url.trim().to_owned());
        }
        let url = urls.first().cloned().unwrap_or_default();
        // Keep draining stdout so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Proc {
            name: name.to_owned(),
            url,
            urls,
            log: log_path,
            child,
        })
    }

    /// SIGKILL the process and reap it.
    pub async fn kill(&mut self) -> Result<()> {
        self.child.start_kill()?;
        self.child.wait().await?;
        Ok(())
    }

    /// Wait for the process to exit.
    pub async fn wait(&mut self) -> Result<std::process::ExitStatus> {
        Ok(self.child.wait().await?)
    }

    /// Send a signal (SIGSTOP / SIGCONT to freeze and thaw a process).
    pub fn signal(&self, signal: nix::sys::signal::Signal) -> Result<()> {
        let pid = self
            .child
            .id()
            .ok_or_else(|| anyhow!("{} has exited", self.name))?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal)?;
        Ok(())
    }

    /// The process id (`None` once it has been reaped).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// The admin URL an engine printed (empty for other processes).
    pub fn admin_url(&self) -> &str {
        self.urls.get(1).map(String::as_str).unwrap_or("")
    }

    /// Base URL of an engine's callback endpoint (its third line).
    pub fn callback_url(&self) -> &str {
        self.urls.get(2).map(String::as_str).unwrap_or("")
    }

    /// An engine's admin and callback ports, to restart it on the same ones.
    fn ports_after_grpc(&self) -> Result<(u16, u16)> {
        let port = |url: &str| -> Result<u16> {
            url.rsplit(':')
                .next()
                .unwrap_or_default()
                .parse()
                .with_context(|| format!("{}: no port in {url:?}", self.name))
        };
        Ok((port(self.admin_url())?, port(self.callback_url())?))
    }

    /// Port of `url`.
    pub fn port(&self) -> Result<u16> {
        let port = self.url.rsplit(':').next().unwrap_or_default();
        Ok(port.parse()?)
    }
}

/// Admin bearer token every test engine accepts (token name `ops`, all tenants).
pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789";

/// The vault key (`BELAY_VAULT_KEY`) of every test engine: tools with
/// `RESULT_SECRETS` are refused by an engine without one.
pub const VAULT_KEY: &str = "62656c61792d746573742d7661756c742d6b65792d303132333435363738390a";

/// Engine options for a test.
#[derive(Debug, Clone)]
pub struct EngineOpts {
    /// Lease in ms.
    pub lease_ms: u64,
    /// Sweep interval in ms.
    pub sweep_ms: u64,
}

impl Default for EngineOpts {
    fn default() -> Self {
        EngineOpts {
            lease_ms: 1_500,
            sweep_ms: 100,
        }
    }
}

/// One test's world: database, tool and model doubles, engines, workers.
pub struct Env {
    /// Database.
    pub db: TestDb,
    /// CRM test double.
    pub crm: Proc,
    /// Scripted model server.
    pub model: Proc,
    /// Engines (index 0 is the default).
    pub engines: Vec<Proc>,
    /// Workers.
    pub workers: Vec<Proc>,
    /// Engine options.
    pub opts: EngineOpts,
    /// HTTP client for the doubles' control endpoints.
    pub http: reqwest::Client,
    /// Tenant used by [`Env::client`].
    pub tenant: String,
    /// With TLS ([`Env::start_with_tls`]): engines serve it with these
    /// certificates, workers present the client certificate, and
    /// [`Env::client`] trusts the CA.
    pub tls: Option<pki::TestPki>,
    /// The workers' API key (role `worker`, every tenant), made through the
    /// admin endpoint when the first engine starts.
    pub worker_key: String,
}

impl Env {
    /// Start a database, the doubles and one engine (no worker yet);
    /// register the example's definitions (plus the test fixtures) and grant
    /// the tenant the example's permissions.
    pub async fn start(opts: EngineOpts) -> Result<Env> {
        Self::start_on(DbBackend::Postgres, opts).await
    }

    /// [`Env::start`] on `backend`.
    pub async fn start_on(backend: DbBackend, opts: EngineOpts) -> Result<Env> {
        Self::start_full(backend, opts, None).await
    }

    /// [`Env::start_on`] with every engine serving TLS from `tls` (and
    /// asking for client certificates from its CA), every worker trusting
    /// its CA and presenting its client certificate.
    pub async fn start_with_tls(
        backend: DbBackend,
        opts: EngineOpts,
        tls: pki::TestPki,
    ) -> Result<Env> {
        Self::start_full(backend, opts, Some(tls)).await
    }

    async fn start_full(
        backend: DbBackend,
        opts: EngineOpts,
        tls: Option<pki::TestPki>,
    ) -> Result<Env> {
        let db = TestDb::create_on(backend).await?;
        let crm = Proc::spawn(
            "crm",
            &bin("crm-server")?,
            &["--listen".into(), "127.0.0.1:0".into()],
            &[],
            true,
        )
        .await?;
        let model = Proc::spawn(
            "model",
            &bin("scripted-model")?,
            &["--listen".into(), "127.0.0.1:0".into()],
            &[],
            true,
        )
        .await?;
        let mut env = Env {
            db,
            crm,
            model,
            engines: Vec::new(),
            workers: Vec::new(),
            opts,
            http: http_client(tls.as_ref())?,
            tenant: "acme".into(),
            tls,
            worker_key: String::new(),
        };
        env.start_engine(None).await?;
        env.worker_key = env.create_key("test-worker", "worker", &["*"]).await?;
        let client = env.client(0)?;
        let root = repo_root();
        client
            .register_paths(&[
                root.join("examples/onboarding/definitions"),
                root.join("tests/fixtures"),
            ])
            .await?;
        client
            .set_tenant_grants(vec![
                "crm.read".into(),
                "crm.write".into(),
                "email.send".into(),
            ])
            .await?;
        Ok(env)
    }

    /// Start another engine on the same database (on `port`, or a free one),
    /// with its admin and callback endpoints on free ports.
    pub async fn start_engine(&mut self, port: Option<u16>) -> Result<usize> {
        self.start_engine_on(port, None).await
    }

    /// Start another engine with `extra` flags that make it print
    /// `extra_lines` more `… listening on <url>` lines (after the gRPC,
    /// admin and callback ones; see [`Proc::urls`]).
    pub async fn start_engine_with(
        &mut self,
        extra: &[String],
        extra_lines: usize,
    ) -> Result<usize> {
        self.start_engine_full(None, None, extra, extra_lines).await
    }

    async fn start_engine_on(
        &mut self,
        port: Option<u16>,
        ports: Option<(u16, u16)>,
    ) -> Result<usize> {
        self.start_engine_full(port, ports, &[], 0).await
    }

    async fn start_engine_full(
        &mut self,
        port: Option<u16>,
        ports: Option<(u16, u16)>,
        extra: &[String],
        extra_lines: usize,
    ) -> Result<usize> {
        let (admin_port, callback_port) = ports.unwrap_or((0, 0));
        let listen = format!("127.0.0.1:{}", port.unwrap_or(0));
        let mut args: Vec<String> = vec![
            "--listen".into(),
            listen,
            "--lease-ms".into(),
            self.opts.lease_ms.to_string(),
            "--sweep-interval-ms".into(),
            self.opts.sweep_ms.to_string(),
            "--db-connections".into(),
            "6".into(),
            "--admin-listen".into(),
            format!("127.0.0.1:{admin_port}"),
            "--callback-listen".into(),
            format!("127.0.0.1:{callback_port}"),
        ];
        if let Some(tls) = &self.tls {
            args.extend(tls.engine_args());
        }
        args.extend(extra.iter().cloned());
        let engine = Proc::spawn_lines(
            &format!("engine{}", self.engines.len()),
            &bin("belay-engine")?,
            &args,
            &[
                ("DATABASE_URL", self.db.url.clone()),
                ("BELAY_ADMIN_TOKENS", format!("ops:{ADMIN_TOKEN}:*")),
                ("BELAY_VAULT_KEY", VAULT_KEY.into()),
            ],
            3 + extra_lines,
        )
        .await?;
        self.engines.push(engine);
        Ok(self.engines.len() - 1)
    }

    /// SIGKILL engine `i` and start a new one on the same port, replacing it.
    pub async fn restart_engine(&mut self, i: usize) -> Result<()> {
        let port = self.engines[i].port()?;
        let ports = self.engines[i].ports_after_grpc()?;
        self.engines[i].kill().await?;
        let new = self.start_engine_on(Some(port), Some(ports)).await?;
        let proc = self.engines.remove(new);
        self.engines[i] = proc;
        Ok(())
    }

    /// SIGKILL engine `i` and leave it down (its ports stay recorded, for
    /// [`Env::start_engine_again`]).
    pub async fn kill_engine(&mut self, i: usize) -> Result<()> {
        self.engines[i].kill().await
    }

    /// Start engine `i` again (after [`Env::kill_engine`]) on its gRPC and
    /// admin ports, replacing it.
    pub async fn start_engine_again(&mut self, i: usize) -> Result<()> {
        let port = self.engines[i].port()?;
        let ports = self.engines[i].ports_after_grpc()?;
        let new = self.start_engine_on(Some(port), Some(ports)).await?;
        let proc = self.engines.remove(new);
        self.engines[i] = proc;
        Ok(())
    }

    /// Start a worker connected to engine `engine`.
    pub async fn start_worker(&mut self, engine: usize) -> Result<usize> {
        self.spawn_worker(engine, &[], &[]).await
    }

    /// Start a worker connected to engine `engine` with `env` added to its
    /// environment (e.g. `BELAY_TOOL_CONFIG_<NAME>` placeholder values).
    pub async fn start_worker_with_env(
        &mut self,
        engine: usize,
        env: &[(&str, String)],
    ) -> Result<usize> {
        self.spawn_worker(engine, &[], env).await
    }

    /// Start a worker connected to engine `engine` with `extra` flags
    /// (e.g. `--health-listen 127.0.0.1:PORT`).
    pub async fn start_worker_with_args(
        &mut self,
        engine: usize,
        extra: &[String],
    ) -> Result<usize> {
        self.spawn_worker(engine, extra, &[]).await
    }

    /// Start a worker connected to engine `engine` whose MCP servers are
    /// `mcp_config` (the `--mcp-config` JSON document, written to a file
    /// next to the test logs).
    pub async fn start_worker_with_mcp(
        &mut self,
        engine: usize,
        mcp_config: &Value,
    ) -> Result<usize> {
        self.start_worker_with_mcp_and(engine, mcp_config, &[])
            .await
    }

    /// [`Env::start_worker_with_mcp`] with `extra` flags (e.g. `--pool`).
    pub async fn start_worker_with_mcp_and(
        &mut self,
        engine: usize,
        mcp_config: &Value,
        extra: &[&str],
    ) -> Result<usize> {
        let dir = std::env::temp_dir().join("belay-test-logs");
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(format!("mcp-{}.json", uuid::Uuid::new_v4().simple()));
        std::fs::write(&path, serde_json::to_vec_pretty(mcp_config)?)?;
        let mut args = vec!["--mcp-config".to_owned(), path.display().to_string()];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        self.spawn_worker(engine, &args, &[]).await
    }

    /// A worker on engine `engine` with the example's model and CRM, plus
    /// `extra` flags and `env` variables.
    async fn spawn_worker(
        &mut self,
        engine: usize,
        extra: &[String],
        env: &[(&str, String)],
    ) -> Result<usize> {
        let id = format!("worker{}", self.workers.len());
        let mut args: Vec<String> = vec![
            "--engine-url".into(),
            self.engines[engine].url.clone(),
            "--worker-id".into(),
            id.clone(),
            "--model-base-url".into(),
            format!("{}/v1", self.model.url),
            "--http-base-url".into(),
            self.crm.url.clone(),
            // The CRM and any other tool double run on this machine.
            "--allow-private-network".into(),
            "127.0.0.0/8,::1".into(),
            "--concurrency".into(),
            "4".into(),
            // The scripted model speaks OpenAI's API, whatever the shell's
            // BELAY_MODEL_PROVIDER says.
            "--model-provider".into(),
            "openai".into(),
        ];
        if let Some(tls) = &self.tls {
            args.extend(tls.worker_args());
        }
        args.extend_from_slice(extra);
        let mut env = env.to_vec();
        env.push(("BELAY_API_KEY", self.worker_key.clone()));
        let worker = Proc::spawn(&id, &bin("belay-worker")?, &args, &env, false).await?;
        self.workers.push(worker);
        Ok(self.workers.len() - 1)
    }

    /// A client of engine `i` for the test tenant (trusting the test CA
    /// with TLS), authenticated as the admin `ops` (the configured
    /// [`ADMIN_TOKEN`]).
    pub fn client(&self, i: usize) -> Result<Client> {
        self.client_for(i, &self.tenant)
    }

    /// [`Env::client`] for `tenant`.
    pub fn client_for(&self, i: usize, tenant: &str) -> Result<Client> {
        let mut options = ConnectOptions::new(&self.engines[i].url);
        options.ca_file = self.tls.as_ref().map(|t| t.path("ca.pem"));
        options.api_key = Some(ADMIN_TOKEN.to_owned());
        Ok(Client::connect(&options, tenant)?)
    }

    /// Make an API key of `role` for `tenants` (`["*"]`: every tenant)
    /// through engine 0's admin endpoint, as the admin `ops`; returns the
    /// key.
    pub async fn create_key(
        &self,
        principal: &str,
        role: &str,
        tenants: &[&str],
    ) -> Result<String> {
        let url = format!("{}/admin/v1/keys", self.engines[0].admin_url());
        let response = self
            .http
            .post(url)
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({"principal": principal, "role": role, "tenants": tenants}))
            .send()
            .await?;
        let status = response.status();
        let body: Value = response.json().await?;
        match body["key"].as_str() {
            Some(key) if status.as_u16() == 201 => Ok(key.to_owned()),
            _ => bail!("creating key {principal}: {status} {body}"),
        }
    }

    /// Start an onboarding run for `email`.
    pub async fn start_onboarding(
        &self,
        engine: usize,
        workflow: &str,
        email: &str,
        key: &str,
    ) -> Result<String> {
        let (run, _) = self
            .client(engine)?
            .start_run(
                workflow,
                &json!({"email": email, "name": "Ada Lovelace", "plan": "pro"}),
                StartOptions {
                    idempotency_key: key.into(),
                    caller: "test".into(),
                    caller_grants: vec!["crm.read".into(), "crm.write".into(), "email.send".into()],
                },
            )
            .await?;
        Ok(run.run_id)
    }

    /// Watch a run (through engine `engine`) until an event of `kind` or the
    /// end of the run; returns the events seen. Fails after `timeout`.
    pub async fn wait_for(
        &self,
        engine: usize,
        run_id: &str,
        kind: &str,
        timeout: Duration,
    ) -> Result<Vec<RunEvent>> {
        let client = self.client(engine)?;
        let mut seen = Vec::new();
        let fut = async {
            let mut after = 0;
            // A watch stream breaks when an engine is killed: resume from the last seq.
            loop {
                let result = client
                    .watch(run_id, after, |e| {
                        seen.push(e.clone());
                        e.kind == kind || belay_sdk::is_final_event(&e.kind)
                    })
                    .await;
                if let Some(last) = seen.last() {
                    after = last.seq;
                    if last.kind == kind || belay_sdk::is_final_event(&last.kind) {
                        return Ok::<(), anyhow::Error>(());
                    }
                }
                if result.is_err() {
                    tokio::time::sleep(Duration::from_millis(100)).await; // engine restarting
                }
            }
        };
        tokio::time::timeout(timeout, fut).await.map_err(|_| {
            anyhow!(
                "run {run_id}: no `{kind}` within {timeout:?}; saw {:?}",
                seen.iter().map(|e| e.kind.clone()).collect::<Vec<_>>()
            )
        })??;
        Ok(seen)
    }

    /// Watch a run (through engine `engine`) until its `n`-th event of
    /// `kind` (counting from its first event) or the end of the run; returns
    /// the events seen. Fails after `timeout`, or when the run ends first.
    pub async fn wait_for_nth(
        &self,
        engine: usize,
        run_id: &str,
        kind: &str,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<RunEvent>> {
        let client = self.client(engine)?;
        let mut seen: Vec<RunEvent> = Vec::new();
        let count = |seen: &[RunEvent]| seen.iter().filter(|e| e.kind == kind).count();
        let fut = async {
            let mut after = 0;
            // A watch stream breaks when an engine is killed: resume from the last seq.
            loop {
                let mut found = count(&seen);
                let result = client
                    .watch(run_id, after, |e| {
                        seen.push(e.clone());
                        if e.kind == kind {
                            found += 1;
                        }
                        found >= n || belay_sdk::is_final_event(&e.kind)
                    })
                    .await;
                if let Some(last) = seen.last() {
                    after = last.seq;
                    if count(&seen) >= n || belay_sdk::is_final_event(&last.kind) {
                        return Ok::<(), anyhow::Error>(());
                    }
                }
                if result.is_err() {
                    tokio::time::sleep(Duration::from_millis(100)).await; // engine restarting
                }
            }
        };
        tokio::time::timeout(timeout, fut).await.map_err(|_| {
            anyhow!(
                "run {run_id}: no `{kind}` #{n} within {timeout:?}; saw {:?}",
                seen.iter().map(|e| e.kind.clone()).collect::<Vec<_>>()
            )
        })??;
        if count(&seen) < n {
            bail!(
                "run {run_id} ended before `{kind}` #{n}; saw {:?}",
                seen.iter().map(|e| e.kind.clone()).collect::<Vec<_>>()
            );
        }
        Ok(seen)
    }

    /// Every event of a run, as JSON payloads, checked gapless from 1.
    pub async fn events(&self, run_id: &str) -> Result<Vec<Value>> {
        let events = self.client(0)?.events(run_id, 0).await?;
        for (i, e) in events.iter().enumerate() {
            if e.seq != i as u64 + 1 {
                bail!("run {run_id}: seq {} at position {i}: not gapless", e.seq);
            }
        }
        events
            .iter()
            .map(|e| serde_json::from_str(&e.payload_json).map_err(Into::into))
            .collect()
    }

    /// The requests the scripted model server received for `model`, in
    /// order: each one's JSON body (the provider request: messages, tools).
    pub async fn model_requests(&self, model: &str) -> Result<Vec<Value>> {
        let all: Value = self
            .http
            .get(format!("{}/_requests", self.model.url))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        Ok(all
            .as_array()
            .map(|rs| {
                rs.iter()
                    .filter(|r| r["model"] == model)
                    .map(|r| r["body"].clone())
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Requests the CRM received for `path`.
    pub async fn crm_requests(&self, path: &str) -> Result<Vec<Value>> {
        let v: Value = self
            .http
            .get(format!("{}/_requests", self.crm.url))
            .query(&[("path", path)])
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        Ok(v.as_array().cloned().unwrap_or_default())
    }

    /// Wait until the CRM received `count` requests for `path`.
    pub async fn crm_wait(&self, path: &str, count: usize) -> Result<()> {
        self.http
            .get(format!("{}/_wait", self.crm.url))
            .query(&[
                ("path", path),
                ("count", &count.to_string()),
                ("timeout_ms", "30000"),
            ])
            .send()
            .await?
            .error_for_status()
            .with_context(|| format!("CRM never got {count} request(s) for {path}"))?;
        Ok(())
    }

    /// Install a CRM fault.
    pub async fn crm_fault(&self, path: &str, action: &str, times: u32) -> Result<()> {
        self.http
            .post(format!("{}/_faults", self.crm.url))
            .json(&json!({"path": path, "action": action, "times": times}))
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    }

    /// Make an onboarding run lose the answer of its `create_account` call:
    /// arm `create_fault` on `/accounts` (and `probe_fault` on the reconcile
    /// probe's path), start a worker and the run, wait until the create
    /// reached the CRM, SIGKILL that worker and start another. Returns the
    /// run id.
    pub async fn run_losing_the_create(
        &mut self,
        email: &str,
        key: &str,
        create_fault: &str,
        probe_fault: Option<&str>,
    ) -> Result<String> {
        self.crm_fault("/accounts", create_fault, 1).await?;
        if let Some(fault) = probe_fault {
            self.crm_fault("/accounts/by-idempotency-key/*", fault, 1)
                .await?;
        }
        let worker = self.start_worker(0).await?;
        let run_id = self
            .start_onboarding(0, "onboarding_express", email, key)
            .await?;
        self.crm_wait("/accounts", 1).await?;
        self.workers[worker].kill().await?;
        self.start_worker(0).await?;
        Ok(run_id)
    }

    /// Answer the CRM requests held by `hold_after_effect`.
    pub async fn crm_release(&self) -> Result<()> {
        self.http
            .post(format!("{}/_release", self.crm.url))
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    }

    /// The CRM's accounts and emails.
    pub async fn crm_state(&self) -> Result<Value> {
        Ok(self
            .http
            .get(format!("{}/_state", self.crm.url))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?)
    }

    /// The uncertain-outcome records of a run, oldest first, as the admin
    /// endpoint of engine 0 shows them (every status).
    pub async fn uncertain_rows(&self, run_id: &str) -> Result<Vec<Value>> {
        let (status, page) = self
            .admin(
                0,
                reqwest::Method::GET,
                &format!("/uncertain-outcomes?status=any&run_id={run_id}&page_size=500"),
                None,
            )
            .await?;
        if status != 200 {
            bail!("listing uncertain outcomes: {status} {page}");
        }
        let mut rows = page["items"].as_array().cloned().unwrap_or_default();
        rows.reverse();
        Ok(rows)
    }

    /// Call the admin endpoint of engine `i`: `method` `path` (below
    /// `/admin/v1/tenants/<tenant>`) with an optional JSON body; returns the
    /// status and the JSON answer.
    pub async fn admin(
        &self,
        i: usize,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<(u16, Value)> {
        let url = format!(
            "{}/admin/v1/tenants/{}{path}",
            self.engines[i].admin_url(),
            self.tenant
        );
        let mut request = self.http.request(method, url).bearer_auth(ADMIN_TOKEN);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        let text = response.text().await?;
        Ok((
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        ))
    }

    /// Kill everything and drop the database.
    pub async fn stop(mut self) -> Result<()> {
        for p in self.workers.iter_mut().chain(self.engines.iter_mut()) {
            let _ = p.kill().await;
        }
        let _ = self.crm.kill().await;
        let _ = self.model.kill().await;
        self.db.drop_db().await
    }
}

/// The harness's HTTP client: with TLS, it trusts the test CA too (the
/// engines' admin endpoints); the doubles are plaintext.
fn http_client(tls: Option<&pki::TestPki>) -> Result<reqwest::Client> {
    let mut builder = reqwest::Client::builder();
    if let Some(tls) = tls {
        let pem = std::fs::read(tls.path("ca.pem"))?;
        builder = builder.add_root_certificate(reqwest::Certificate::from_pem(&pem)?);
    }
    Ok(builder.build()?)
}

/// Events of `kind` among payloads.
pub fn of_kind<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

/// Count of each call id's `tool_call_dispatched` events.
pub fn dispatch_counts(events: &[Value]) -> std::collections::BTreeMap<String, usize> {
    counts_by_call(events, "tool_call_dispatched")
}

/// Count of each call id's `task_lease_expired` events.
pub fn lease_expiries(events: &[Value]) -> std::collections::BTreeMap<String, usize> {
    counts_by_call(events, "task_lease_expired")
}

/// Count of each call id's events of `kind`.
fn counts_by_call(events: &[Value], kind: &str) -> std::collections::BTreeMap<String, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for e in of_kind(events, kind) {
        *counts
            .entry(e["call_id"].as_str().unwrap_or_default().to_owned())
            .or_insert(0) += 1;
    }
    counts
}

/// Path of a real MCP server installed by `.ci/mcp-servers.sh`
/// (`BELAY_MCP_EVERYTHING`, `BELAY_MCP_TIME`, `BELAY_MCP_PYTHON`): from the
/// environment (`.ci/run` sets it), else from running the script once per
/// test binary (it installs into a cache outside the clone and prints
/// `export NAME=PATH` lines).
pub fn mcp_server(var: &str) -> Result<String> {
    let path = ci_env(".ci/mcp-servers.sh", var)
        .with_context(|| format!("{var}: the MCP servers (npm and python3 are needed)"))?;
    if !Path::new(&path).exists() {
        bail!("{var}={path} does not exist: run `eval \"$(.ci/mcp-servers.sh)\"`");
    }
    Ok(path)
}

/// The value of `var`: from the environment (`.ci/run` sets it), else from
/// the `export NAME=VALUE` lines `script` (under the repository root, an
/// idempotent installer such as `.ci/mcp-servers.sh` or `.ci/clients.sh`)
/// prints, running it once per test binary and script.
pub fn ci_env(script: &str, var: &str) -> Result<String> {
    type Exports = std::result::Result<std::collections::BTreeMap<String, String>, String>;
    static RUNS: std::sync::Mutex<std::collections::BTreeMap<String, Exports>> =
        std::sync::Mutex::new(std::collections::BTreeMap::new());
    if let Ok(value) = std::env::var(var)
        && !value.is_empty()
    {
        return Ok(value);
    }
    let mut runs = RUNS
        .lock()
        .map_err(|_| anyhow!("a test panicked while {script} ran"))?;
    let exports = runs
        .entry(script.to_owned())
        .or_insert_with(|| run_exports(&repo_root().join(script)));
    match exports {
        Ok(exports) => exports
            .get(var)
            .cloned()
            .ok_or_else(|| anyhow!("{script} printed no {var}")),
        Err(e) => bail!("{var} is not set and {script} failed: {e}"),
    }
}

/// Run an installer script and collect the `export NAME=VALUE` lines it prints.
fn run_exports(
    script: &Path,
) -> std::result::Result<std::collections::BTreeMap<String, String>, String> {
    let out = std::process::Command::new("bash")
        .arg(script)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!("{} failed ({})", script.display(), out.status));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("export ")?.split_once('='))
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect())
}
