//! `belay health`: one probe of an engine's gRPC health service
//! (`grpc.health.v1.Health/Check`) or of an HTTP readiness route (a
//! worker's `GET /readyz`), exiting 0 when it is serving. The container
//! images' `HEALTHCHECK` runs it (`deploy/container/Containerfile`); in
//! Kubernetes the kubelet's own `grpc:` and `httpGet:` probes do the same
//! without it.

use std::time::Duration;

use anyhow::{Context, bail};
use belay_sdk::ConnectOptions;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// Flags of `belay health`.
#[derive(clap::Args)]
pub struct HealthArgs {
    /// Probe this HTTP(S) URL instead of the engine's gRPC health: the
    /// answer must be a 2xx (e.g. a worker's
    /// `http://127.0.0.1:8081/readyz`, which the worker image sets).
    #[arg(long, env = "BELAY_HEALTH_URL", value_name = "URL")]
    url: Option<String>,
    /// The gRPC service whose health to ask for; empty: the whole server.
    #[arg(long, default_value = "")]
    service: String,
    /// How long the probe may take, connection included (e.g. `3s`).
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

/// Runs the probe: `Ok` when serving, else an error naming what answered
/// (or did not).
///
/// Errors: the engine URL or CA file is invalid, nothing answers within the
/// timeout, the health service answers other than `SERVING`, or the HTTP
/// route answers other than 2xx.
pub async fn run(args: HealthArgs, options: &ConnectOptions) -> anyhow::Result<()> {
    let probe = async {
        match args.url.as_deref().filter(|u| !u.trim().is_empty()) {
            Some(url) => probe_http(url, options).await,
            None => probe_grpc(options, &args.service).await,
        }
    };
    match tokio::time::timeout(args.timeout, probe).await {
        Ok(result) => result,
        Err(_) => bail!(
            "no answer within {}",
            humantime::format_duration(args.timeout)
        ),
    }
}

/// `grpc.health.v1.Health/Check` of `service` at the engine URL.
async fn probe_grpc(options: &ConnectOptions, service: &str) -> anyhow::Result<()> {
    let channel = options
        .endpoint()?
        .connect()
        .await
        .with_context(|| format!("connecting to {}", options.url))?;
    let answer = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .with_context(|| format!("grpc.health.v1.Health/Check at {}", options.url))?;
    let status = answer.into_inner().status();
    if status != ServingStatus::Serving {
        bail!("{} is {}", options.url, status.as_str_name());
    }
    outln!("{}: SERVING", options.url);
    Ok(())
}

/// `GET url`, which must answer 2xx; the body is printed (a worker's
/// `/readyz` says why it is not ready).
async fn probe_http(url: &str, options: &ConnectOptions) -> anyhow::Result<()> {
    let mut client = reqwest::Client::builder();
    if let Some(ca) = &options.ca_file {
        let pem = std::fs::read(ca).with_context(|| format!("reading {}", ca.display()))?;
        for cert in reqwest::Certificate::from_pem_bundle(&pem)
            .with_context(|| format!("parsing {} (PEM)", ca.display()))?
        {
            client = client.add_root_certificate(cert);
        }
    }
    let answer = client
        .build()?
        .get(url)
        .send()
        .await
        .with_context(|| format!("GET {url}"))?;
    let status = answer.status();
    let body = answer.text().await.unwrap_or_default();
    if !status.is_success() {
        bail!("GET {url}: {status} {}", body.trim());
    }
    outln!("{url}: {status}");
    Ok(())
}
