//! `belay-worker`: runs one worker process until SIGTERM or Ctrl-C.
//!
//! Logs go to stderr, as text or JSON lines (`--log-format`); `RUST_LOG`
//! filters them (default [`belay_worker::config::DEFAULT_LOG_FILTER`]:
//! `info`, rmcp's per-message service logs at `error`). Spans go to
//! `--otlp-endpoint` (`OTEL_EXPORTER_OTLP_ENDPOINT`) when set.

use belay_worker::config::{
    DEFAULT_CLAIM_WAIT_MS, DEFAULT_CONCURRENCY, DEFAULT_ENGINE_URL, DEFAULT_LOG_FILTER,
    DEFAULT_MODEL_TIMEOUT_MS, DEFAULT_SHUTDOWN_GRACE_MS, ModelProvider,
};
use belay_worker::mcp::McpConfig;
use belay_worker::placeholders::ConfigValues;
use belay_worker::ssrf::AllowPrivateNetworkArgs;
use belay_worker::{ModelProviderConfig, WorkerConfig};
use std::path::PathBuf;

use anyhow::Context as _;
use belay_proto::telemetry::{Telemetry, TelemetryOptions};
use clap::Parser;

/// An address to listen on, or none (an empty value).
#[derive(Debug, Clone, Copy)]
struct OptionalAddr(Option<std::net::SocketAddr>);

/// `--health-listen`'s value: an address (`0.0.0.0:8081`), or nothing for
/// an empty value, so that a pod spec can turn the endpoint off by
/// setting the variable empty.
fn optional_addr(s: &str) -> Result<OptionalAddr, String> {
    if s.trim().is_empty() {
        return Ok(OptionalAddr(None));
    }
    s.trim()
        .parse()
        .map(|a| OptionalAddr(Some(a)))
        .map_err(|e| format!("`{s}` is not an address like 0.0.0.0:8081: {e}"))
}

/// Belay worker: claims model and tool calls from the engine and performs them.
#[derive(Debug, Parser)]
// A negative number is a value (refused by its type, naming the flag),
// not an unknown flag.
#[command(name = "belay-worker", version, about, allow_negative_numbers = true)]
struct Args {
    /// Engine gRPC URL: http:// (plaintext) or https:// (TLS).
    #[arg(long, env = "BELAY_ENGINE_URL", default_value = DEFAULT_ENGINE_URL)]
    engine_url: String,
    /// The worker's API key, sent as `authorization: Bearer <key>` with
    /// every engine call.
    #[arg(long, env = "BELAY_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// CA certificates (PEM) the engine's certificate must chain to
    /// (https:// only); default: the system's trust store.
    #[arg(long, env = "BELAY_CA_FILE")]
    ca_file: Option<PathBuf>,
    /// Client certificate (PEM) presented to the engine (mTLS, https://
    /// only); needs --client-key.
    #[arg(long, env = "BELAY_CLIENT_CERT")]
    client_cert: Option<PathBuf>,
    /// Private key (PEM) of --client-cert.
    #[arg(long, env = "BELAY_CLIENT_KEY")]
    client_key: Option<PathBuf>,
    /// Stable id of this worker process [default: worker-<random>].
    #[arg(long, env = "BELAY_WORKER_ID")]
    worker_id: Option<String>,
    /// Maximum number of tasks in flight.
    #[arg(long, env = "BELAY_WORKER_CONCURRENCY", default_value_t = DEFAULT_CONCURRENCY as u32,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    concurrency: u32,
    /// Long-poll wait of one claim, in ms (at most 30000).
    #[arg(long, env = "BELAY_CLAIM_WAIT_MS", default_value_t = DEFAULT_CLAIM_WAIT_MS,
          value_parser = clap::value_parser!(u32).range(0..=30_000))]
    claim_wait_ms: u32,
    /// Which API model calls speak: OpenAI Chat Completions (or a compatible
    /// server) or Anthropic Messages.
    #[arg(long, env = "BELAY_MODEL_PROVIDER", value_enum, default_value_t = ModelProvider::OpenAi)]
    model_provider: ModelProvider,
    /// Model provider base URL; falls back to $OPENAI_BASE_URL (openai), then
    /// https://api.openai.com/v1 (openai) or https://api.anthropic.com/v1
    /// (anthropic).
    #[arg(long, env = "BELAY_MODEL_BASE_URL")]
    model_base_url: Option<String>,
    /// Model provider API key; falls back to $OPENAI_API_KEY (openai) or
    /// $ANTHROPIC_API_KEY (anthropic).
    #[arg(long, env = "BELAY_MODEL_API_KEY", hide_env_values = true)]
    model_api_key: Option<String>,
    /// Whole-request timeout of one model call, in ms.
    #[arg(long, env = "BELAY_MODEL_TIMEOUT_MS", default_value_t = DEFAULT_MODEL_TIMEOUT_MS)]
    model_timeout_ms: u64,
    /// Base URL for HTTP tool endpoints given as paths.
    #[arg(long, env = "BELAY_HTTP_BASE_URL")]
    http_base_url: Option<String>,
    #[command(flatten)]
    allow_private_networks: AllowPrivateNetworkArgs,
    /// On shutdown, how long to wait for in-flight tasks, in ms.
    #[arg(long, env = "BELAY_SHUTDOWN_GRACE_MS", default_value_t = DEFAULT_SHUTDOWN_GRACE_MS)]
    shutdown_grace_ms: u64,
    /// Ask the engine, with each task's report, for the next ready task in
    /// the same reply (one round trip per step instead of two); `false`:
    /// only the claim loop claims.
    #[arg(long, env = "BELAY_CLAIM_WITH_REPORTS", default_value_t = true, action = clap::ArgAction::Set)]
    claim_with_reports: bool,
    /// MCP servers (JSON: {"servers": {NAME: {"transport": "stdio"|"http", ...}},
    /// "config": {NAME: VALUE}}); checked at start. Empty: no MCP servers.
    /// Its `config` values also fill HTTP tools' `{{config.NAME}}`
    /// placeholders, after the BELAY_TOOL_CONFIG_<NAME> environment variables.
    #[arg(long, env = "BELAY_MCP_CONFIG")]
    mcp_config: Option<String>,
    /// Client-certificate (mTLS) profiles of HTTP tools' `tls_profile:`
    /// (JSON: {"profiles": {NAME: {"cert": PEM_PATH, "key": PEM_PATH,
    /// "ca": PEM_PATH}}}, `ca` optional); the files are read at start.
    #[arg(long, env = "BELAY_TLS_PROFILES")]
    tls_profiles: Option<String>,
    /// Serve `GET /livez` and `GET /readyz` (the pod's probes) on this
    /// address, e.g. 0.0.0.0:8081. `/readyz` is 503 until a claim reaches
    /// the engine, while it cannot be reached, and once shutdown began.
    /// An empty value (`BELAY_WORKER_HEALTH_LISTEN=`) serves nothing.
    #[arg(long, env = "BELAY_WORKER_HEALTH_LISTEN", value_parser = optional_addr)]
    health_listen: Option<OptionalAddr>,
    /// Print the resources and resource templates of this `--mcp-config`
    /// server as JSON on stdout, and exit (claims no work). For an operator
    /// choosing the URIs of `resource:` tools.
    #[arg(long, value_name = "SERVER")]
    list_mcp_resources: Option<String>,
    #[command(flatten)]
    sandbox: belay_worker::sandbox_tool::SandboxArgs,
    /// The worker pool this worker serves: it claims the tasks of tools
    /// and agents with `pool: NAME` as well as those naming no pool.
    /// Lower-case letters, digits, `-` and `_`. Empty: no pool.
    #[arg(long, env = "BELAY_WORKER_POOL")]
    pool: Option<String>,
    /// Log lines on stderr: `text` or `json` (one JSON object a line).
    #[arg(long, env = "BELAY_LOG_FORMAT", default_value = "text")]
    log_format: belay_proto::telemetry::LogFormat,
    /// OTLP/gRPC endpoint spans are exported to (`http://collector:4317`);
    /// unset or empty: no traces. The service name is `OTEL_SERVICE_NAME`,
    /// default `belay-worker`.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
}

/// `--list-mcp-resources SERVER`: connects to that server only and prints
/// its listing.
async fn list_mcp_resources(
    mcp: &McpConfig,
    server: &str,
    network_policy: belay_worker::NetworkPolicy,
) -> anyhow::Result<()> {
    let resolved = mcp
        .resolve(server)
        .map_err(|e| anyhow::anyhow!("--list-mcp-resources: {e}"))?
        .with_network_policy(network_policy);
    let client = belay_worker::mcp::connect(resolved)
        .await
        .map_err(|e| anyhow::anyhow!("--list-mcp-resources: {e}"))?;
    let listing = client.list_resources().await;
    client.shutdown().await;
    let listing = listing.map_err(|e| anyhow::anyhow!("--list-mcp-resources: {e}"))?;
    println!("{}", serde_json::to_string_pretty(&listing)?);
    Ok(())
}

/// The MCP configuration at `path`, checked; none (or an empty path, e.g.
/// `BELAY_MCP_CONFIG=`) is no MCP servers.
fn load_mcp_config(path: Option<&str>) -> anyhow::Result<McpConfig> {
    let Some(path) = path.filter(|p| !p.is_empty()) else {
        return Ok(McpConfig::default());
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("--mcp-config {path}: cannot read: {e}"))?;
    let mcp =
        McpConfig::from_json(&text).map_err(|e| anyhow::anyhow!("--mcp-config {path}: {e}"))?;
    mcp.validate()
        .map_err(|e| anyhow::anyhow!("--mcp-config {path}: {e}"))?;
    Ok(mcp)
}

/// The flag (or its `BELAY_*` variable) if set and not empty, else the first
/// of `vars` that is. clap's `env` takes one variable; these settings also
/// honour the provider's conventional names.
fn flag_or_env(flag: Option<String>, vars: &[&str]) -> Option<String> {
    flag.filter(|v| !v.is_empty()).or_else(|| {
        vars.iter()
            .filter_map(|var| std::env::var(var).ok())
            .find(|v| !v.is_empty())
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let telemetry = Telemetry::init(TelemetryOptions {
        default_service_name: "belay-worker",
        log_format: args.log_format,
        default_filter: DEFAULT_LOG_FILTER.to_owned(),
        otlp_endpoint: args.otlp_endpoint.clone(),
    })
    .context("--log-format / --otlp-endpoint")?;
    let result = work(args).await;
    // The spans of the last calls go out before the process ends.
    telemetry.shutdown().await;
    result
}

/// The worker process after logging is set up.
async fn work(args: Args) -> anyhow::Result<()> {
    let worker_id = args
        .worker_id
        .filter(|id| !id.is_empty())
        .unwrap_or_else(|| {
            let id = uuid::Uuid::new_v4().simple().to_string();
            format!("worker-{}", &id[..12])
        });
    // A URL without a scheme and host would only ever fail to connect; say so now.
    match reqwest::Url::parse(&args.engine_url) {
        Ok(url) if matches!(url.scheme(), "http" | "https") && url.host().is_some() => {}
        _ => anyhow::bail!(
            "--engine-url {:?} is not an http(s) URL with a host, e.g. http://127.0.0.1:50051",
            args.engine_url
        ),
    }
    let mcp = load_mcp_config(args.mcp_config.as_deref())?;
    if let Some(server) = &args.list_mcp_resources {
        return list_mcp_resources(&mcp, server, args.allow_private_networks.policy()?).await;
    }
    let tls_profiles =
        belay_worker::http_tool::TlsProfilesConfig::load(args.tls_profiles.as_deref())
            .map_err(|e| anyhow::anyhow!(e))?;
    let tool_network_policy = args.allow_private_networks.policy()?;
    let provider = args.model_provider;
    let given = |p: Option<PathBuf>| p.filter(|p| !p.as_os_str().is_empty());
    let engine_auth = belay_worker::EngineAuth {
        api_key: args.api_key.filter(|k| !k.trim().is_empty()),
        ca_file: given(args.ca_file),
        client_cert: given(args.client_cert),
        client_key: given(args.client_key),
    };
    let config = WorkerConfig {
        engine_url: args.engine_url,
        engine_auth,
        worker_id,
        concurrency: args.concurrency as usize,
        claim_wait_ms: args.claim_wait_ms,
        model: ModelProviderConfig {
            provider,
            base_url: flag_or_env(args.model_base_url, provider.base_url_env_vars())
                .unwrap_or_else(|| provider.default_base_url().to_owned()),
            api_key: flag_or_env(args.model_api_key, provider.api_key_env_vars()),
            timeout_ms: args.model_timeout_ms,
        },
        http_base_url: args.http_base_url.filter(|u| !u.is_empty()),
        tool_network_policy,
        shutdown_grace_ms: args.shutdown_grace_ms,
        claim_with_reports: args.claim_with_reports,
        mcp,
        tool_config: ConfigValues::from_env(),
        tls_profiles,
        health: belay_worker::health::HealthState::default(),
        sandbox: args.sandbox.into_config(),
        pool: args.pool.filter(|p| !p.is_empty()),
    };
    // The health endpoint outlives the claim loop's shutdown (it says
    // "stopping") and ends with the process.
    if let Some(OptionalAddr(Some(addr))) = args.health_listen {
        let listener = belay_worker::health::bind(addr).await?;
        // The bound address: with port 0, the one the system chose.
        let bound = listener.local_addr().unwrap_or(addr);
        tracing::info!(addr = %bound, "health endpoint listening (/livez, /readyz, /metrics)");
        let state = config.health.clone();
        tokio::spawn(async move {
            if let Err(e) =
                belay_worker::health::serve(listener, state, std::future::pending()).await
            {
                tracing::error!(error = %e, "health endpoint stopped");
            }
        });
    }
    belay_worker::run(config, belay_proto::signal::shutdown_signal()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_negative_number_is_refused_naming_its_flag() {
        let Err(err) = Args::try_parse_from(["belay-worker", "--shutdown-grace-ms", "-5"]) else {
            panic!("a negative grace was accepted");
        };
        let text = err.to_string();
        assert!(
            text.contains("--shutdown-grace-ms") && text.contains("-5"),
            "{text}"
        );
    }

    #[test]
    fn an_empty_mcp_config_is_no_mcp_servers() {
        // `BELAY_MCP_CONFIG=` reaches clap as an empty value, as this does.
        let args = Args::try_parse_from(["belay-worker", "--mcp-config", ""]).expect("parses");
        let mcp = load_mcp_config(args.mcp_config.as_deref()).expect("no servers");
        assert!(mcp.servers.is_empty());
        let args = Args::try_parse_from(["belay-worker"]).expect("parses");
        assert!(
            load_mcp_config(args.mcp_config.as_deref())
                .expect("no servers")
                .servers
                .is_empty()
        );
        let err = load_mcp_config(Some("/nonexistent/mcp.json")).expect_err("missing file");
        assert!(err.to_string().contains("cannot read"), "{err}");
    }

    #[test]
    fn private_networks_are_allowed_by_repeated_flags_or_commas() {
        let args = Args::try_parse_from([
            "belay-worker",
            "--allow-private-network",
            "127.0.0.0/8",
            "--allow-private-network",
            "10.0.0.0/8,::1",
        ])
        .expect("parses");
        let policy = args.allow_private_networks.policy().expect("valid");
        let allowed: Vec<String> = policy.allowed().iter().map(ToString::to_string).collect();
        assert_eq!(allowed, ["127.0.0.0/8", "10.0.0.0/8", "::1/128"]);
        // `BELAY_ALLOW_PRIVATE_NETWORKS=` reaches clap as an empty value.
        for argv in [
            &["belay-worker"][..],
            &["belay-worker", "--allow-private-network", ""],
        ] {
            let args = Args::try_parse_from(argv).expect("parses");
            let policy = args.allow_private_networks.policy().expect("valid");
            assert!(policy.allowed().is_empty());
        }
    }

    #[test]
    fn a_bad_cidr_is_a_startup_error_naming_the_flag_and_the_value() {
        for bad in ["10.0.0.0/33", "10.0.0.1/8", "intranet"] {
            let args = Args::try_parse_from(["belay-worker", "--allow-private-network", bad])
                .expect("parses");
            let err = args.allow_private_networks.policy().expect_err("refused");
            let message = err.to_string();
            assert!(message.contains("--allow-private-network"), "{message}");
            assert!(message.contains(bad), "{message}");
        }
    }

    #[test]
    fn the_model_provider_is_openai_unless_named_and_a_bad_name_is_refused() {
        let args = Args::try_parse_from(["belay-worker"]).expect("parses");
        assert_eq!(args.model_provider, ModelProvider::OpenAi);
        let args = Args::try_parse_from(["belay-worker", "--model-provider", "anthropic"])
            .expect("parses");
        assert_eq!(args.model_provider, ModelProvider::Anthropic);
        assert_eq!(
            args.model_provider.default_base_url(),
            "https://api.anthropic.com/v1"
        );
        let err = Args::try_parse_from(["belay-worker", "--model-provider", "claude"])
            .expect_err("not a provider");
        let text = err.to_string();
        assert!(text.contains("--model-provider"), "{text}");
        assert!(
            text.contains("[possible values: openai, anthropic]"),
            "{text}"
        );
    }

    #[test]
    fn an_empty_health_address_serves_nothing_and_a_bad_one_is_named() {
        let args = Args::try_parse_from(["belay-worker", "--health-listen", ""]).expect("parses");
        assert!(matches!(args.health_listen, Some(OptionalAddr(None))));
        let args = Args::try_parse_from(["belay-worker", "--health-listen", "127.0.0.1:0"])
            .expect("parses");
        assert!(matches!(args.health_listen, Some(OptionalAddr(Some(_)))));
        let err = Args::try_parse_from(["belay-worker", "--health-listen", "localhost"])
            .expect_err("refused")
            .to_string();
        assert!(
            err.contains("`localhost` is not an address like 0.0.0.0:8081"),
            "{err}"
        );
    }

    #[test]
    fn sandbox_binds_must_be_absolute_paths_that_exist() {
        let ok = Args::try_parse_from(["belay-worker", "--sandbox-ro-bind", "/usr,/tmp"])
            .expect("parses");
        assert_eq!(ok.sandbox.sandbox_ro_binds.len(), 2);
        for (bad, says) in [
            ("relative/lib", "`relative/lib` is not an absolute path"),
            ("/no/such/belay/dir", "`/no/such/belay/dir` cannot be bound"),
            ("", "an empty path"),
        ] {
            let err = Args::try_parse_from(["belay-worker", "--sandbox-ro-bind", bad])
                .expect_err("refused")
                .to_string();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }
}
