//! `belay-engine`: the engine server (coordinator) and its `migrate` command.

use std::time::Duration;

use anyhow::Context;
use belay_engine::admin::{AdminAuth, RECOMMENDED_TOKEN_CHARS};
use belay_engine::auth::{Role, Tenants};
use belay_engine::coordinator::CoordinatorConfig;
use belay_engine::notify;
use belay_engine::server::{
    CallbackListener, Engine, EngineOptions, Listeners, ServeError, WebhookOptions, shutdown_signal,
};
use belay_engine::store::Store;
use belay_engine::tls::TlsSettings;
use belay_engine::vault::VaultKey;
use belay_proto::telemetry::{Telemetry, TelemetryOptions};
use clap::{Parser, Subcommand};

#[derive(Parser)]
// A negative number is a value (refused by its type, naming the flag),
// not an unknown flag.
#[command(
    name = "belay-engine",
    version,
    about = "Belay engine: coordinator, gRPC API, lease sweeper",
    allow_negative_numbers = true
)]
struct Cli {
    /// Database URL: `postgres://…` (production; any number of engine
    /// replicas) or `sqlite://PATH` (embedded; one engine process per file).
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/test",
        global = true
    )]
    database_url: String,
    #[command(flatten)]
    telemetry: TelemetryArgs,
    #[command(flatten)]
    serve: ServeArgs,
    #[command(subcommand)]
    command: Option<Command>,
}

/// Logs and traces (README "Traces and logs").
#[derive(clap::Args)]
struct TelemetryArgs {
    /// Log lines on stderr: `text` or `json` (one JSON object a line).
    #[arg(long, env = "BELAY_LOG_FORMAT", default_value = "text", global = true)]
    log_format: belay_proto::telemetry::LogFormat,
    /// OTLP/gRPC endpoint spans are exported to (`http://collector:4317`);
    /// unset or empty: no traces. The service name is `OTEL_SERVICE_NAME`,
    /// default `belay-engine`.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", global = true)]
    otlp_endpoint: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Apply migrations and serve (the default when no command is given).
    Serve,
    /// Apply migrations and exit.
    Migrate,
    /// Create an API key directly in the database and print it (the
    /// bootstrap of a new deployment: the first admin key; later keys are
    /// made through the admin endpoint, `belay keys create`).
    CreateKey(CreateKeyArgs),
}

/// Flags of `belay-engine create-key`.
#[derive(clap::Args)]
struct CreateKeyArgs {
    /// Who the key proves (letters, digits, `.`, `_`, `-`, `@`).
    #[arg(long)]
    principal: String,
    /// client, worker, approver, operator or admin.
    #[arg(long, default_value = "admin")]
    role: String,
    /// Tenants it acts for, comma-separated; `*` for every tenant.
    #[arg(long, default_value = "*")]
    tenants: String,
    /// Its grants, comma-separated.
    #[arg(long, value_delimiter = ',')]
    grants: Vec<String>,
}

#[derive(clap::Args)]
struct ServeArgs {
    /// gRPC listen address; port 0 picks a free port.
    #[arg(long, env = "BELAY_LISTEN", default_value = "127.0.0.1:50051")]
    listen: String,
    /// Lease length of a claim or heartbeat, ms.
    #[arg(long, env = "BELAY_LEASE_MS", default_value_t = 30_000)]
    lease_ms: u64,
    /// How often expired leases are looked for, ms.
    #[arg(long, env = "BELAY_SWEEP_INTERVAL_MS", default_value_t = 1_000)]
    sweep_interval_ms: u64,
    /// How long every engine of the fleet must have run a newer release
    /// before behaviour an older one would misread is used, ms (a rollback
    /// within it is still possible; README "Rolling upgrades").
    #[arg(long, env = "BELAY_FLEET_UPGRADE_HOLD_MS",
          default_value_t = belay_engine::store::fleet_level::DEFAULT_UPGRADE_HOLD_MS)]
    fleet_upgrade_hold_ms: u64,
    /// Record the dispatch of an `idempotent` HTTP call (no gates, vault
    /// values or callback) when its task is leased, so the worker acts
    /// without asking; `false`: every worker asks (`DispatchToolCall`).
    #[arg(long, env = "BELAY_DISPATCH_WITH_CLAIM", default_value_t = true,
          action = clap::ArgAction::Set)]
    dispatch_with_claim: bool,
    /// How long a result of a `hints.cacheable: true` tool is served from
    /// the tenant's result cache, ms, when the tool gives no
    /// `hints.cache_ttl`; 0: such tools are not cached.
    #[arg(long, env = "BELAY_TOOL_CACHE_TTL_MS",
          default_value_t = belay_engine::machine::cache::DEFAULT_TOOL_CACHE_TTL_MS,
          value_parser = clap::value_parser!(u64).range(0..=belay_engine::definitions::model::MAX_CACHE_TTL_MS))]
    tool_cache_ttl_ms: u64,
    /// Database connections.
    #[arg(long, env = "BELAY_DB_CONNECTIONS", default_value_t = 16)]
    db_connections: u32,
    /// How long to go on trying, at start, a database that cannot be
    /// reached yet (not listening, starting up, in recovery), e.g. `60s`,
    /// `2m`; `0s`: exit at once. Any other database error exits at once.
    #[arg(long, env = "BELAY_DB_STARTUP_WAIT", default_value = "60s",
          value_parser = humantime::parse_duration)]
    db_startup_wait: std::time::Duration,
    /// How long a verified API key (one without an expiry) is kept before
    /// it is looked up again, ms: the most a key revoked through another
    /// engine replica takes to stop working on this one (a key revoked
    /// through this one stops at once); 0: every request looks its key up.
    #[arg(long, env = "BELAY_KEY_CACHE_MS", default_value_t = 1_000)]
    key_cache_ms: u64,
    /// Admin HTTP listen address (keys, uncertain outcomes, run controls);
    /// port 0 picks a free port; empty: not served.
    #[arg(long, env = "BELAY_ADMIN_LISTEN", default_value = "127.0.0.1:50052")]
    admin_listen: String,
    /// Configured tokens, the bootstrap principals: comma-separated
    /// `name:token[:tenant]`; a `*` token (the default tenant) is an admin
    /// of every tenant, a tenant's token an operator of it. Accepted on the
    /// gRPC API and the admin endpoint beside the database's API keys.
    #[arg(long, env = "BELAY_ADMIN_TOKENS", hide_env_values = true)]
    admin_tokens: Option<String>,
    /// Listen address of the callback endpoint of `type: async_webhook`
    /// tools (`POST /callbacks/v1/{token}`); port 0 picks a free port; empty:
    /// not served (such tools are then refused at dispatch).
    #[arg(long, env = "BELAY_CALLBACK_LISTEN", default_value = "127.0.0.1:50053")]
    callback_listen: String,
    /// Base URL tool servers use to reach the callback endpoint (behind a
    /// load balancer or ingress: its public URL); default
    /// `http://<callback listen address>` (`https://` with TLS).
    #[arg(long, env = "BELAY_CALLBACK_BASE_URL")]
    callback_base_url: Option<String>,
    /// Key of the runs' secret vaults (`RESULT_SECRETS` values, kept
    /// encrypted with AES-256-GCM): 32 bytes as 64 hex digits or base64
    /// (`openssl rand -hex 32`). Every engine on one database needs the
    /// same key. Unset: a tool with `RESULT_SECRETS` is refused at dispatch.
    #[arg(long, env = "BELAY_VAULT_KEY", hide_env_values = true)]
    vault_key: Option<String>,
    /// Webhook URL that receives signed notifications (a run paused on an
    /// uncertain outcome); needs --webhook-secret.
    #[arg(long, env = "BELAY_WEBHOOK_URL")]
    webhook_url: Option<String>,
    /// Secret of the webhook signature (`Belay-Signature`, HMAC-SHA256).
    #[arg(long, env = "BELAY_WEBHOOK_SECRET", hide_env_values = true)]
    webhook_secret: Option<String>,
    /// How often due webhook notifications are looked for, ms.
    #[arg(long, env = "BELAY_WEBHOOK_INTERVAL_MS", default_value_t = 1_000)]
    webhook_interval_ms: u64,
    #[command(flatten)]
    tls: TlsArgs,
    #[cfg(feature = "mcp-server")]
    #[command(flatten)]
    mcp: McpServerArgs,
}

/// TLS of every endpoint (gRPC, admin, callbacks, MCP).
#[derive(clap::Args)]
struct TlsArgs {
    /// Certificate chain (PEM, leaf first) every endpoint serves TLS with;
    /// needs --tls-key. Reloaded when the file changes.
    #[arg(long, env = "BELAY_TLS_CERT")]
    tls_cert: Option<std::path::PathBuf>,
    /// Private key (PEM) of --tls-cert. Reloaded when the file changes.
    #[arg(long, env = "BELAY_TLS_KEY")]
    tls_key: Option<std::path::PathBuf>,
    /// CA certificates (PEM) client certificates are verified against
    /// (mTLS); clients without one are let in to authenticate otherwise.
    #[arg(long, env = "BELAY_TLS_CLIENT_CA")]
    tls_client_ca: Option<std::path::PathBuf>,
    /// How often the certificate and key files are checked for changes,
    /// ms; 0: never.
    #[arg(long, env = "BELAY_TLS_RELOAD_INTERVAL_MS", default_value_t = 5_000)]
    tls_reload_interval_ms: u64,
    /// Serve plaintext on a non-loopback address (refused otherwise): only
    /// behind a trusted network or a proxy that terminates TLS.
    #[arg(long)]
    insecure: bool,
}

/// Belay as an MCP server (cargo feature `mcp-server`).
#[cfg(feature = "mcp-server")]
#[derive(clap::Args)]
struct McpServerArgs {
    /// Listen address of the MCP endpoint (Streamable HTTP at `/mcp`);
    /// port 0 picks a free port; empty (the default): not served.
    #[arg(long, env = "BELAY_MCP_LISTEN", default_value = "")]
    mcp_listen: String,
    /// The tenant whose workflows are served as MCP tools.
    #[arg(long, env = "BELAY_MCP_TENANT", default_value = "")]
    mcp_tenant: String,
    /// Workflows served as MCP tools, comma-separated.
    #[arg(long, env = "BELAY_MCP_WORKFLOWS", value_delimiter = ',')]
    mcp_workflows: Vec<String>,
    /// Bearer tokens of MCP callers: comma-separated `name:token[:tenant]`;
    /// a run's caller is `mcp:<name>`.
    #[arg(long, env = "BELAY_MCP_TOKENS", hide_env_values = true)]
    mcp_tokens: Option<String>,
    /// Grants of MCP callers, comma-separated.
    #[arg(long, env = "BELAY_MCP_CALLER_GRANTS", value_delimiter = ',')]
    mcp_caller_grants: Vec<String>,
    /// Accepted `Host` values (`host` or `host:port`), comma-separated;
    /// default: loopback names only (DNS rebinding protection).
    #[arg(long, env = "BELAY_MCP_ALLOWED_HOSTS", value_delimiter = ',')]
    mcp_allowed_hosts: Vec<String>,
    /// Accepted `Origin` values (`scheme://host:port`), comma-separated;
    /// default: none (requests from browsers are refused).
    #[arg(long, env = "BELAY_MCP_ALLOWED_ORIGINS", value_delimiter = ',')]
    mcp_allowed_origins: Vec<String>,
    /// How long a call waits for its run to end before answering with its
    /// run id, ms.
    #[arg(long, env = "BELAY_MCP_WAIT_MS", default_value_t = belay_engine::mcp_server::DEFAULT_WAIT_MS)]
    mcp_wait_ms: u64,
}

fn main() -> anyhow::Result<()> {
    // Started as an expression evaluator of the sandbox: serve and exit.
    belay_engine::expr_sandbox::run_sandbox_if_requested();
    // Otherwise evaluate workflow expressions in such evaluators.
    belay_engine::expr_sandbox::enable_sandbox();
    async_main()
}

#[tokio::main]
async fn async_main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let telemetry = Telemetry::init(TelemetryOptions {
        default_service_name: "belay-engine",
        log_format: cli.telemetry.log_format,
        default_filter: "info,sqlx=warn".to_owned(),
        otlp_endpoint: cli.telemetry.otlp_endpoint.clone(),
    })
    .context("--log-format / --otlp-endpoint")?;
    let result = run(cli).await;
    // The last spans (a run's final node) go out before the process ends.
    telemetry.shutdown().await;
    result
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Some(Command::Migrate) => {
            let store = Store::connect(&cli.database_url, 2)
                .await
                .context("connecting to the database")?;
            store.migrate().await.context("applying migrations")?;
            println!("migrations applied");
            Ok(())
        }
        Some(Command::CreateKey(args)) => create_key(&cli.database_url, args).await,
        Some(Command::Serve) | None => serve(&cli.database_url, cli.serve).await,
    }
}

async fn create_key(database_url: &str, args: CreateKeyArgs) -> anyhow::Result<()> {
    let role: Role = args.role.parse().context("--role")?;
    let tenants = match args.tenants.trim() {
        "*" => Tenants::All,
        list => Tenants::Only(
            list.split(',')
                .map(|t| t.trim().to_owned())
                .filter(|t| !t.is_empty())
                .collect(),
        ),
    };
    if let Tenants::Only(list) = &tenants {
        if list.is_empty() {
            anyhow::bail!("--tenants: name at least one tenant, or `*`");
        }
        if let Some(bad) = list.iter().find(|t| {
            t.len() > 128
                || t.chars()
                    .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '/' | '*'))
        }) {
            anyhow::bail!(
                "--tenants: {bad:?} is not a tenant name (1 to 128 bytes without whitespace, `/` or `*`)"
            );
        }
        if role == Role::Admin {
            anyhow::bail!(
                "--role admin acts for every tenant: give --tenants '*', or make an operator key"
            );
        }
    }
    if !belay_engine::admin::valid_principal_id(&args.principal) {
        anyhow::bail!(
            "--principal {:?}: 1 to 128 letters, digits, `.`, `_`, `-` or `@`",
            args.principal
        );
    }
    let store = Store::connect(database_url, 2)
        .await
        .context("connecting to the database")?;
    store.migrate().await.context("applying migrations")?;
    let key = belay_engine::auth::mint_key(
        &store,
        &args.principal,
        role,
        tenants,
        args.grants,
        "belay-engine create-key",
    )
    .await
    .context("creating the key")?;
    store.close().await;
    println!("{key}");
    Ok(())
}

async fn serve(database_url: &str, args: ServeArgs) -> anyhow::Result<()> {
    // Flags are checked before anything touches the database.
    let auth = AdminAuth::parse(args.admin_tokens.as_deref().unwrap_or(""))
        .context("--admin-tokens (BELAY_ADMIN_TOKENS)")?;
    for name in auth.weak_tokens() {
        tracing::warn!(
            token = name,
            "admin token is shorter than {RECOMMENDED_TOKEN_CHARS} characters"
        );
    }
    let webhook = webhook_options(&args)?;
    let tls = TlsSettings::from_flags(
        args.tls.tls_cert.clone(),
        args.tls.tls_key.clone(),
        args.tls.tls_client_ca.clone(),
        Duration::from_millis(args.tls.tls_reload_interval_ms),
    )?;
    let vault_key = match args.vault_key.as_deref().filter(|k| !k.trim().is_empty()) {
        Some(key) => Some(VaultKey::parse(key).context("--vault-key (BELAY_VAULT_KEY)")?),
        None => None,
    };
    #[cfg(feature = "mcp-server")]
    let mcp = mcp_settings(&args.mcp)?;

    // The database first (as before the builder): a second engine on one
    // SQLite file, or an unreachable database, is named before any port.
    let engine = Engine::start(EngineOptions {
        database_url: database_url.to_owned(),
        db_connections: args.db_connections,
        db_startup_wait: args.db_startup_wait,
        key_cache_ttl: std::time::Duration::from_millis(args.key_cache_ms),
        coordinator: CoordinatorConfig {
            lease_ms: args.lease_ms,
            sweep_interval_ms: args.sweep_interval_ms,
            fleet_upgrade_hold_ms: args.fleet_upgrade_hold_ms,
            dispatch_with_claim: args.dispatch_with_claim,
            tool_cache_ttl_ms: args.tool_cache_ttl_ms,
            definition_config: belay_engine::definitions::config_from_env(std::env::vars()),
        },
        vault_key,
        callback_base_url: None,
        webhook,
        tokens: auth,
        tls,
        insecure: args.tls.insecure,
    })
    .await
    .map_err(|e| match e {
        ServeError::Setting { .. } => {
            anyhow::Error::new(e).context("--vault-key (BELAY_VAULT_KEY)")
        }
        ServeError::Webhook(_) => anyhow::Error::new(e).context("--webhook-url / --webhook-secret"),
        ServeError::Tls(_) => {
            anyhow::Error::new(e).context("--tls-cert / --tls-key / --tls-client-ca")
        }
        e => anyhow::Error::new(e),
    })?;

    let grpc = bind(&args.listen, "").await?;
    let addr = grpc.local_addr()?;
    let admin = if args.admin_listen.trim().is_empty() {
        None
    } else {
        Some(bind(&args.admin_listen, "the admin endpoint ").await?)
    };
    let callbacks = if args.callback_listen.trim().is_empty() {
        None
    } else {
        let l = bind(&args.callback_listen, "the callback endpoint ").await?;
        engine
            .serve_callbacks_at(&callback_base_url(&args, &l, engine.scheme())?)
            .context("--callback-base-url (BELAY_CALLBACK_BASE_URL)")?;
        Some(l)
    };
    #[cfg(feature = "mcp-server")]
    let mcp = match mcp {
        Some(settings) => Some((
            bind(&args.mcp.mcp_listen, "the MCP endpoint ").await?,
            settings,
        )),
        None => None,
    };

    let listeners = Listeners {
        grpc,
        admin,
        callbacks: callbacks.map(CallbackListener::Own),
        #[cfg(feature = "mcp-server")]
        mcp,
    };
    // Refused before any `listening on` line: scripts wait for those.
    engine.check_listeners(&listeners)?;
    // Tests and scripts read this line to find the port: keep it first.
    let scheme = engine.scheme();
    println!("listening on {scheme}://{addr}");
    if let Some(l) = &listeners.admin {
        println!("admin listening on {scheme}://{}", l.local_addr()?);
    }
    if let Some(CallbackListener::Own(l)) = &listeners.callbacks {
        println!("callbacks listening on {scheme}://{}", l.local_addr()?);
        tracing::info!(
            base_url = engine.coordinator().callback_base_url().unwrap_or_default(),
            "callback URLs handed to tool servers"
        );
    }
    #[cfg(feature = "mcp-server")]
    if let Some((l, _)) = &listeners.mcp {
        println!(
            "mcp listening on {scheme}://{}{}",
            l.local_addr()?,
            belay_engine::mcp_server::MCP_PATH
        );
    }
    use std::io::Write;
    std::io::stdout().flush()?;
    engine.serve(listeners, shutdown_signal()).await?;
    Ok(())
}

/// Binds `address`; `what` (empty, or ending in a space) names the endpoint
/// in the error.
async fn bind(address: &str, what: &str) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(address)
        .await
        .with_context(|| format!("binding {what}{address}"))
}

/// The webhook of `--webhook-url` and `--webhook-secret`, checked.
fn webhook_options(args: &ServeArgs) -> anyhow::Result<Option<WebhookOptions>> {
    match (&args.webhook_url, &args.webhook_secret) {
        (Some(url), Some(secret)) if !url.is_empty() => {
            notify::check_config(url, secret).context("--webhook-url / --webhook-secret")?;
            Ok(Some(WebhookOptions {
                url: url.clone(),
                secret: secret.clone(),
                interval: Duration::from_millis(args.webhook_interval_ms),
            }))
        }
        (Some(url), None) if !url.is_empty() => anyhow::bail!(
            "--webhook-secret (BELAY_WEBHOOK_SECRET) is required when --webhook-url is set: \
             receivers verify the `Belay-Signature` header with it"
        ),
        (_, Some(_)) => {
            tracing::warn!("--webhook-secret is set without --webhook-url: no webhooks are sent");
            Ok(None)
        }
        _ => Ok(None),
    }
}

/// The base URL tool servers call back on: `--callback-base-url`, or the
/// callback listener's address with `scheme`.
fn callback_base_url(
    args: &ServeArgs,
    listener: &tokio::net::TcpListener,
    scheme: &str,
) -> anyhow::Result<String> {
    if let Some(base) = args
        .callback_base_url
        .as_deref()
        .filter(|b| !b.trim().is_empty())
    {
        return Ok(base.to_owned());
    }
    // A wildcard address is not one a tool server can call: name the
    // loopback one and say that others need the flag.
    let mut addr = listener.local_addr()?;
    if addr.ip().is_unspecified() {
        tracing::warn!(
            listen = %addr,
            "callbacks listen on every interface; URLs handed to tool servers name 127.0.0.1: set --callback-base-url to what they reach"
        );
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    Ok(format!("{scheme}://{addr}"))
}

/// The MCP server's settings from its flags, checked; `None` when
/// `--mcp-listen` is empty.
#[cfg(feature = "mcp-server")]
fn mcp_settings(
    args: &McpServerArgs,
) -> anyhow::Result<Option<belay_engine::mcp_server::McpServerSettings>> {
    if args.mcp_listen.trim().is_empty() {
        return Ok(None);
    }
    let clean = |v: &[String]| -> Vec<String> {
        v.iter()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect()
    };
    let auth = AdminAuth::parse(args.mcp_tokens.as_deref().unwrap_or(""))
        .context("--mcp-tokens (BELAY_MCP_TOKENS)")?;
    for name in auth.weak_tokens() {
        tracing::warn!(
            token = name,
            "MCP token is shorter than {RECOMMENDED_TOKEN_CHARS} characters"
        );
    }
    let settings = belay_engine::mcp_server::McpServerSettings {
        tenant: args.mcp_tenant.trim().to_owned(),
        workflows: clean(&args.mcp_workflows),
        caller_grants: clean(&args.mcp_caller_grants),
        auth,
        allowed_hosts: clean(&args.mcp_allowed_hosts),
        allowed_origins: clean(&args.mcp_allowed_origins),
        wait_ms: args.mcp_wait_ms,
    };
    settings.check()?;
    Ok(Some(settings))
}
