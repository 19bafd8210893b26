//! `belay dev`: one process that runs an engine (gRPC API, admin endpoint,
//! lease sweeper) and a worker, on a SQLite file by default, so a developer
//! needs nothing else running.
//!
//! The pieces are the ones `belay-engine` and `belay-worker` run; only their
//! wiring lives here. Shutdown order matters: on Ctrl-C or SIGTERM the
//! worker stops claiming and drains first (it reports its in-flight tasks to
//! the engine, which is still serving), then the engine stops and the store
//! is closed. A second signal stops waiting for the drain. A SIGKILL at any
//! moment loses nothing committed: the next `belay dev` on the same file
//! resumes the runs as an engine restart does.

use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};

use anyhow::{Result, anyhow, bail};
use belay_engine::admin::{AdminAuth, AdminToken, RECOMMENDED_TOKEN_CHARS};
use belay_engine::coordinator::CoordinatorConfig;
use belay_engine::server::{
    CallbackListener, Engine, EngineOptions, Listeners, ServeError, shutdown_signal,
};
use belay_worker::config::{
    DEFAULT_CONCURRENCY, DEFAULT_MODEL_TIMEOUT_MS, DEFAULT_SHUTDOWN_GRACE_MS, ModelProvider,
};
use belay_worker::ssrf::AllowPrivateNetworkArgs;
use belay_worker::{ModelProviderConfig, WorkerConfig};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Database connections of the store (SQLite: readers beside the one writer).
const DB_CONNECTIONS: u32 = 8;

/// Name of the admin token `belay dev` serves (recorded as who resolved an
/// uncertain outcome: `dev/<operator>`).
const ADMIN_TOKEN_NAME: &str = "dev";

mod keys;

/// Flags of `belay dev`. The admin token is the global `--admin-token`
/// (`BELAY_ADMIN_TOKEN`), the one `belay uncertain` sends.
#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Engine and worker")]
pub struct DevArgs {
    /// SQLite database file, created when missing [default: `belay/dev.db`
    /// in the user's data directory, e.g. ~/.local/share/belay/dev.db].
    /// One `belay dev` per file.
    #[arg(long, value_name = "PATH")]
    db: Option<PathBuf>,
    /// Keep the database in memory: nothing is kept after the process exits.
    #[arg(long)]
    in_memory: bool,
    /// PostgreSQL URL, instead of SQLite [env: DATABASE_URL, used only when
    /// neither --db nor --in-memory is given].
    #[arg(long, value_name = "URL")]
    database_url: Option<String>,
    /// gRPC listen address; port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:50051", value_name = "ADDR")]
    listen: String,
    /// Admin HTTP listen address; port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:50052", value_name = "ADDR")]
    admin_listen: String,
    /// Serve on a non-loopback --listen or --admin-listen address
    /// (plaintext: `belay dev` has no TLS); refused otherwise.
    #[arg(long)]
    insecure: bool,
    /// Which API model calls speak: OpenAI Chat Completions (or a compatible
    /// server) or Anthropic Messages.
    #[arg(long, env = "BELAY_MODEL_PROVIDER", value_enum, default_value_t = ModelProvider::OpenAi)]
    model_provider: ModelProvider,
    /// Base URL of the model provider; falls back to $OPENAI_BASE_URL
    /// (openai), then https://api.openai.com/v1 (openai) or
    /// https://api.anthropic.com/v1 (anthropic).
    #[arg(long, env = "BELAY_MODEL_BASE_URL", value_name = "URL")]
    model_base_url: Option<String>,
    /// Model provider API key; falls back to $OPENAI_API_KEY (openai) or
    /// $ANTHROPIC_API_KEY (anthropic).
    #[arg(long, env = "BELAY_MODEL_API_KEY", hide_env_values = true)]
    model_api_key: Option<String>,
    /// Base URL for HTTP tool endpoints given as paths (`/accounts`).
    #[arg(long, env = "BELAY_HTTP_BASE_URL", value_name = "URL")]
    http_base_url: Option<String>,
    #[command(flatten)]
    allow_private_networks: AllowPrivateNetworkArgs,
    /// Tasks the worker runs at once.
    #[arg(long, default_value_t = DEFAULT_CONCURRENCY as u32,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    concurrency: u32,
    /// Lease of a claimed task, ms: how long after a crash an unfinished
    /// task is looked at again.
    #[arg(long, default_value_t = CoordinatorConfig::default().lease_ms,
          value_parser = clap::value_parser!(u64).range(100..=86_400_000))]
    lease_ms: u64,
    /// How often expired leases are looked for, ms.
    #[arg(long, default_value_t = CoordinatorConfig::default().sweep_interval_ms,
          value_parser = clap::value_parser!(u64).range(10..=3_600_000))]
    sweep_interval_ms: u64,
    /// How long a result of a `hints.cacheable: true` tool is served from
    /// the tenant's result cache, ms, when the tool gives no
    /// `hints.cache_ttl`; 0: such tools are not cached.
    #[arg(long, env = "BELAY_TOOL_CACHE_TTL_MS", default_value_t = CoordinatorConfig::default().tool_cache_ttl_ms,
          value_parser = clap::value_parser!(u64).range(0..=belay_engine::definitions::model::MAX_CACHE_TTL_MS))]
    tool_cache_ttl_ms: u64,
    /// On shutdown, how long the worker waits for its in-flight tasks, ms.
    #[arg(long, default_value_t = DEFAULT_SHUTDOWN_GRACE_MS)]
    shutdown_grace_ms: u64,
    /// MCP servers of `type: mcp` tools (the worker's `--mcp-config` JSON
    /// document); checked at start.
    #[arg(long, env = "BELAY_MCP_CONFIG", value_name = "FILE")]
    mcp_config: Option<PathBuf>,
    /// Key of the runs' secret vaults (`RESULT_SECRETS`), as for
    /// `belay-engine`: 32 bytes as 64 hex digits or base64. Unset: a tool
    /// with `RESULT_SECRETS` is refused at dispatch.
    #[arg(long, env = "BELAY_VAULT_KEY", hide_env_values = true)]
    vault_key: Option<String>,
}

/// Where the database is, and which flag said so (for error messages).
#[derive(Debug, PartialEq, Eq)]
enum Database {
    /// A SQLite file (absolute path); `flag` is `--db` or how the default
    /// was chosen.
    File { path: PathBuf, flag: &'static str },
    /// SQLite in memory.
    Memory,
    /// A database URL from `--database-url` or `DATABASE_URL`.
    Url { url: String, flag: &'static str },
}

impl Database {
    /// Pick the database from the flags; `env_url` is `$DATABASE_URL` and
    /// `data_dir` the user's data directory. Errors name the flags.
    fn choose(
        args: &DevArgs,
        env_url: Option<String>,
        data_dir: Option<PathBuf>,
    ) -> Result<Database> {
        let url = args.database_url.clone().filter(|u| !u.is_empty());
        match (&args.db, args.in_memory, url) {
            (Some(_), true, _) => bail!("--db and --in-memory exclude each other: give one"),
            (Some(_), false, Some(_)) => {
                bail!("--db and --database-url exclude each other: give one")
            }
            (None, true, Some(_)) => {
                bail!("--in-memory and --database-url exclude each other: give one")
            }
            (Some(path), false, None) => Ok(Database::File {
                path: absolute(path, "--db")?,
                flag: "--db",
            }),
            (None, true, None) => Ok(Database::Memory),
            (None, false, Some(url)) => Ok(Database::Url {
                url,
                flag: "--database-url",
            }),
            (None, false, None) => match env_url.filter(|u| !u.is_empty()) {
                Some(url) => Ok(Database::Url {
                    url,
                    flag: "DATABASE_URL",
                }),
                None => {
                    let dir = data_dir.ok_or_else(|| {
                        anyhow!(
                            "cannot find the user's data directory for the default database: \
                             pass --db PATH or --in-memory"
                        )
                    })?;
                    Ok(Database::File {
                        path: absolute(&dir.join("belay").join("dev.db"), "--db")?,
                        flag: "--db (default)",
                    })
                }
            },
        }
    }

    /// The URL `belay_engine::store::Store::connect` takes.
    fn store_url(&self) -> Result<String> {
        match self {
            Database::File { path, flag } => {
                let text = path
                    .to_str()
                    .ok_or_else(|| anyhow!("{flag} {}: the path is not UTF-8", path.display()))?;
                // The SQLite URL parser percent-decodes the path and ends it
                // at `?`; the store takes a URL containing `:memory:` or
                // `mode=memory` anywhere for an in-memory database. Encode
                // what either would misread.
                const MISREAD: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS
                    .add(b'%')
                    .add(b'?')
                    .add(b'#')
                    .add(b':')
                    .add(b'=');
                Ok(format!(
                    "sqlite://{}",
                    percent_encoding::utf8_percent_encode(text, MISREAD)
                ))
            }
            Database::Memory => Ok("sqlite::memory:".to_owned()),
            Database::Url { url, .. } => Ok(url.clone()),
        }
    }

    /// What the `database:` line shows: never a password.
    fn shown(&self) -> String {
        match self {
            Database::File { path, .. } => format!("sqlite://{}", path.display()),
            Database::Memory => "sqlite::memory: (nothing is kept after exit)".to_owned(),
            Database::Url { url, .. } => without_password(url),
        }
    }

    /// How error messages name this database: the flag and the place.
    fn named(&self) -> String {
        match self {
            Database::File { path, flag } => format!("{flag} {}", path.display()),
            Database::Memory => "--in-memory".to_owned(),
            Database::Url { url, flag } => format!("{flag} {}", without_password(url)),
        }
    }
}

/// `path` made absolute against the current directory (not resolved: a
/// symlink stays one), so the `database:` line says where the file is.
fn absolute(path: &Path, flag: &str) -> Result<PathBuf> {
    if path.as_os_str().is_empty() {
        bail!("{flag}: the path is empty");
    }
    std::path::absolute(path).map_err(|e| anyhow!("{flag} {}: {e}", path.display()))
}

/// A database URL with its password removed; a URL that does not parse is
/// shown by its scheme only, as it may hold a password we cannot find.
fn without_password(url: &str) -> String {
    if url.starts_with("sqlite:") {
        return url.to_owned();
    }
    match reqwest::Url::parse(url) {
        Ok(mut parsed) => {
            if parsed.password().is_some() {
                // Only fails for URLs that cannot have a password, which this has.
                let _ = parsed.set_password(None);
            }
            parsed.to_string()
        }
        Err(_) => format!(
            "{}://(unparsable URL)",
            url.split("://").next().unwrap_or_default()
        ),
    }
}

/// An `http(s)://host…` URL, or an error naming `flag`.
fn check_http_url(flag: &str, url: &str) -> Result<()> {
    match reqwest::Url::parse(url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => Ok(()),
        Ok(_) => bail!("{flag} {url:?}: not an http(s) URL with a host"),
        Err(e) => bail!("{flag} {url:?}: {e}"),
    }
}

/// The flag if set and not empty, else the first of `vars` that is.
fn flag_or_env(flag: Option<String>, vars: &[&str]) -> Option<String> {
    flag.filter(|v| !v.is_empty()).or_else(|| {
        vars.iter()
            .filter_map(|var| std::env::var(var).ok())
            .find(|v| !v.is_empty())
    })
}

/// Bind `addr`, or an error naming `flag`.
async fn bind(flag: &str, addr: &str) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow!("{flag} {addr}: cannot listen: {e}"))
}

/// The address a local client reaches a listener bound to `addr` at
/// (`0.0.0.0` and `::` are not addresses one connects to).
fn reachable(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => (Ipv4Addr::LOCALHOST, addr.port()).into(),
        IpAddr::V6(ip) if ip.is_unspecified() => (Ipv6Addr::LOCALHOST, addr.port()).into(),
        _ => addr,
    }
}

/// A message on one line (database drivers sometimes add newlines).
fn one_line(text: String) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Run `belay dev` until Ctrl-C or SIGTERM. `admin_token` is the global
/// `--admin-token`; without it a random one is generated and printed.
///
/// Errors (one line, naming the flag): conflicting or invalid flags, a
/// database that cannot be opened (including a SQLite file another `belay
/// dev` or engine holds), an address that cannot be bound, or the engine
/// or worker failing while serving.
pub async fn run(
    args: DevArgs,
    admin_token: Option<String>,
    api_key: Option<String>,
) -> Result<()> {
    init_logging();
    // Everything the flags can get wrong is checked before anything starts.
    let database = Database::choose(&args, std::env::var("DATABASE_URL").ok(), dirs::data_dir())?;
    let store_url = database.store_url()?;
    if let Database::File { path, flag } = &database
        && path.is_dir()
    {
        bail!(
            "{flag} {}: is a directory, not a database file",
            path.display()
        );
    }
    let provider = args.model_provider;
    let model_base_url = flag_or_env(args.model_base_url.clone(), provider.base_url_env_vars())
        .unwrap_or_else(|| provider.default_base_url().to_owned());
    check_http_url("--model-base-url", &model_base_url)?;
    let http_base_url = args.http_base_url.clone().filter(|u| !u.is_empty());
    if let Some(url) = &http_base_url {
        check_http_url("--http-base-url", url)?;
    }
    let tool_network_policy = args.allow_private_networks.policy()?;
    let mcp = match &args.mcp_config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow!("--mcp-config {}: cannot read: {e}", path.display()))?;
            let mcp = belay_worker::mcp::McpConfig::from_json(&text)
                .map_err(|e| anyhow!("--mcp-config {}: {e}", path.display()))?;
            mcp.validate()
                .map_err(|e| anyhow!("--mcp-config {}: {e}", path.display()))?;
            mcp
        }
        None => belay_worker::mcp::McpConfig::default(),
    };
    let admin_token = admin_token.filter(|t| !t.is_empty());
    let tokens = match &admin_token {
        Some(token) => {
            if token.chars().count() < RECOMMENDED_TOKEN_CHARS {
                tracing::warn!(
                    "the admin token is shorter than {RECOMMENDED_TOKEN_CHARS} characters"
                );
            }
            AdminToken::new(ADMIN_TOKEN_NAME, token, "*")
                .and_then(|t| AdminAuth::new(vec![t]))
                .map_err(|e| anyhow!("--admin-token (BELAY_ADMIN_TOKEN): {e}"))?
        }
        None => AdminAuth::default(),
    };

    let vault_key = match args.vault_key.as_deref().filter(|k| !k.trim().is_empty()) {
        Some(key) => Some(
            belay_engine::vault::VaultKey::parse(key)
                .map_err(|e| anyhow!("--vault-key (BELAY_VAULT_KEY): {e}"))?,
        ),
        None => None,
    };
    let engine = Engine::start(EngineOptions {
        coordinator: CoordinatorConfig {
            lease_ms: args.lease_ms,
            sweep_interval_ms: args.sweep_interval_ms,
            tool_cache_ttl_ms: args.tool_cache_ttl_ms,
            definition_config: belay_engine::definitions::config_from_env(std::env::vars()),
            ..CoordinatorConfig::default()
        },
        vault_key,
        insecure: args.insecure,
        tokens,
        ..EngineOptions::new(store_url, DB_CONNECTIONS)
    })
    .await
    .map_err(|e| match e {
        ServeError::Connect(e) => anyhow!("{}: {}", database.named(), one_line(e.to_string())),
        ServeError::Migrate(e) => anyhow!(
            "{}: applying migrations: {}",
            database.named(),
            one_line(e.to_string())
        ),
        e => anyhow::Error::new(e).context("--vault-key (BELAY_VAULT_KEY)"),
    })?;
    let grpc_listener = bind("--listen", &args.listen).await?;
    let admin_listener = bind("--admin-listen", &args.admin_listen).await?;
    let grpc_addr = grpc_listener.local_addr()?;
    let admin_addr = admin_listener.local_addr()?;
    // Callbacks of `type: async_webhook` tools are served beside the admin
    // endpoint (one port fewer for a developer).
    engine
        .serve_callbacks_at(&format!("http://{}", reachable(admin_addr)))
        .map_err(|e| {
            anyhow!(
                "--admin-listen: {}",
                one_line(format!("{:#}", anyhow::Error::new(e)))
            )
        })?;
    let (engine_stop, engine_stopped) = watch::channel(false);
    let keys = keys::issue(&engine, admin_token.is_some(), api_key.as_deref()).await?;
    let listeners = Listeners {
        admin: Some(admin_listener),
        callbacks: Some(CallbackListener::OnAdmin),
        ..Listeners::grpc_only(grpc_listener)
    };
    engine.check_listeners(&listeners)?;
    let mut served = tokio::spawn(engine.serve(listeners, stopped(&engine_stopped)));
    let (worker_stop, worker_stopped) = watch::channel(false);
    let worker_id = format!("dev-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let config = WorkerConfig {
        concurrency: args.concurrency as usize,
        model: ModelProviderConfig {
            provider,
            base_url: model_base_url,
            api_key: flag_or_env(args.model_api_key.clone(), provider.api_key_env_vars()),
            timeout_ms: DEFAULT_MODEL_TIMEOUT_MS,
        },
        http_base_url,
        tool_network_policy,
        shutdown_grace_ms: args.shutdown_grace_ms,
        claim_with_reports: true,
        mcp,
        tool_config: belay_worker::placeholders::ConfigValues::from_env(),
        engine_auth: belay_worker::config::EngineAuth {
            api_key: Some(keys.worker.clone()),
            ..Default::default()
        },
        ..WorkerConfig::new(format!("http://{}", reachable(grpc_addr)), worker_id)
    };
    let mut worker = tokio::spawn(belay_worker::run(config, stopped(&worker_stopped)));

    // Tests and scripts read the first line to find the port: keep it first.
    let mut out = std::io::stdout().lock();
    writeln!(out, "listening on http://{grpc_addr}")?;
    writeln!(out, "admin listening on http://{admin_addr}")?;
    writeln!(out, "database: {}", database.shown())?;
    writeln!(out, "{}", keys.admin_line())?;
    writeln!(
        out,
        "callbacks (type: async_webhook): http://{}/callbacks/v1/{{token}}",
        reachable(admin_addr)
    )?;
    out.flush()?;
    drop(out);

    // Serve until a signal, or until a piece fails on its own.
    let failed = tokio::select! {
        () = shutdown_signal() => None,
        r = &mut served => Some(ended("the engine", r.map(|r| r.map_err(anyhow::Error::from)))),
        r = &mut worker => Some(ended("the worker", r)),
    };

    // The worker drains while the engine still serves its reports (without
    // the gRPC API there is nothing to report to: its leases expire instead).
    let _ = worker_stop.send(true);
    if served.is_finished() {
        worker.abort();
    } else if !worker.is_finished() {
        tokio::select! {
            r = &mut worker => {
                if let Err(e) = ended("the worker", r) {
                    tracing::warn!(error = %e, "worker stopped with an error");
                }
            }
            () = shutdown_signal() => {
                tracing::warn!("second signal: not waiting for in-flight tasks (their leases expire)");
                worker.abort();
            }
        }
    }
    // The engine drains its endpoints, stops its background work and
    // closes the store.
    let _ = engine_stop.send(true);
    if !served.is_finished() {
        let _ = (&mut served).await;
    }
    match failed {
        Some(Err(e)) => Err(e),
        // A piece that ended by itself without an error still ended early.
        Some(Ok(what)) => bail!("{what} stopped unexpectedly"),
        None => {
            tracing::info!("stopped");
            Ok(())
        }
    }
}

/// What a finished task of `belay dev` amounts to: `Ok(what)` if it ended
/// without an error, else the error, on one line.
fn ended(
    what: &'static str,
    joined: std::result::Result<Result<()>, tokio::task::JoinError>,
) -> Result<&'static str> {
    match joined {
        Ok(Ok(())) => Ok(what),
        Ok(Err(e)) => Err(anyhow!("{what}: {}", one_line(format!("{e:#}")))),
        Err(e) => Err(anyhow!("{what}: {e}")),
    }
}

/// A future that completes when `rx` turns true (or its sender is gone).
fn stopped(rx: &watch::Receiver<bool>) -> impl Future<Output = ()> + Send + 'static {
    let mut rx = rx.clone();
    async move {
        let _ = rx.wait_for(|s| *s).await;
    }
}

/// Start logging to stderr (`RUST_LOG` filters; default `info`, SQL quiet).
fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        args: DevArgs,
    }

    fn parse(flags: &[&str]) -> DevArgs {
        let mut argv = vec!["dev"];
        argv.extend_from_slice(flags);
        match Wrap::try_parse_from(argv) {
            Ok(w) => w.args,
            Err(e) => panic!("{flags:?}: {e}"),
        }
    }

    fn choose(flags: &[&str], env: Option<&str>) -> Result<Database> {
        Database::choose(
            &parse(flags),
            env.map(str::to_owned),
            Some(PathBuf::from("/home/u/.local/share")),
        )
    }

    #[test]
    fn the_database_flags_exclude_each_other_and_name_themselves() {
        for (flags, needle) in [
            (&["--db", "a.db", "--in-memory"][..], "--db and --in-memory"),
            (
                &["--db", "a.db", "--database-url", "postgres://h/d"][..],
                "--db and --database-url",
            ),
            (
                &["--in-memory", "--database-url", "postgres://h/d"][..],
                "--in-memory and --database-url",
            ),
        ] {
            let err = choose(flags, None)
                .map(|d| format!("{d:?}"))
                .unwrap_or_else(|e| e.to_string());
            assert!(err.contains(needle), "{flags:?}: {err}");
        }
    }

    #[test]
    fn an_empty_db_path_is_a_usage_error() {
        assert!(Wrap::try_parse_from(["dev", "--db", ""]).is_err());
        assert!(
            absolute(Path::new(""), "--db")
                .err()
                .is_some_and(|e| e.to_string() == "--db: the path is empty")
        );
    }

    #[test]
    fn the_default_is_a_file_in_the_data_directory_and_database_url_only_without_flags() {
        assert_eq!(
            choose(&[], None).ok(),
            Some(Database::File {
                path: PathBuf::from("/home/u/.local/share/belay/dev.db"),
                flag: "--db (default)",
            })
        );
        let pg = Some("postgres://u:secret@h/d");
        assert!(matches!(
            choose(&[], pg),
            Ok(Database::Url {
                flag: "DATABASE_URL",
                ..
            })
        ));
        assert!(matches!(choose(&["--in-memory"], pg), Ok(Database::Memory)));
        assert!(matches!(
            choose(&["--db", "/x.db"], pg),
            Ok(Database::File { .. })
        ));
        assert!(
            Database::choose(&parse(&[]), None, None)
                .err()
                .is_some_and(|e| e.to_string().contains("--db PATH or --in-memory"))
        );
    }

    #[test]
    fn urls_are_shown_without_passwords_and_paths_survive_the_sqlite_parser() {
        assert_eq!(
            without_password("postgres://u:secret@h:5432/d"),
            "postgres://u@h:5432/d"
        );
        assert_eq!(without_password("postgres://u@h/d"), "postgres://u@h/d");
        assert!(!without_password("postgres://u:se cret@[h/d").contains("secret"));
        let db = Database::File {
            path: PathBuf::from("/tmp/a b/what?#100%.db"),
            flag: "--db",
        };
        assert_eq!(
            db.store_url().ok().as_deref(),
            Some("sqlite:///tmp/a b/what%3F%23100%25.db")
        );
        assert_eq!(db.shown(), "sqlite:///tmp/a b/what?#100%.db");
        let db = Database::File {
            path: PathBuf::from("/tmp/x:memory:/mode=memory.db"),
            flag: "--db",
        };
        let url = db.store_url().unwrap_or_default();
        assert!(
            !url.contains(":memory:") && !url.contains("mode=memory"),
            "{url}"
        );
    }

    #[test]
    fn unspecified_listen_addresses_are_reached_on_loopback() {
        let any: SocketAddr = ([0, 0, 0, 0], 7).into();
        assert_eq!(reachable(any), SocketAddr::from(([127, 0, 0, 1], 7)));
        let local: SocketAddr = ([127, 0, 0, 2], 7).into();
        assert_eq!(reachable(local), local);
    }
}
