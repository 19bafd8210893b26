//! `onboarding`: runs the customer-onboarding example end to end in one
//! process: an engine (on an in-memory SQLite database unless
//! `--database-url` names a SQLite file or a PostgreSQL database), a worker, the scripted model server and
//! the CRM server (on free local ports); registers the example's definitions,
//! submits one run, prints its event timeline and final output, and exits 0
//! when the run completed.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use belay_engine::coordinator::{Coordinator, CoordinatorConfig};
use belay_engine::store::Store;
use belay_example_onboarding::{
    CrmState, ModelServerState, Script, serve_crm_server, serve_model_server,
};
use belay_sdk::{Client, StartOptions, timeline_line};
use clap::Parser;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::watch;

#[derive(Parser)]
#[command(
    name = "onboarding",
    about = "Run the Belay onboarding example end to end"
)]
struct Args {
    /// Database: `sqlite::memory:` (the default: nothing to install, nothing
    /// kept), `sqlite://PATH` (a file, kept), or a PostgreSQL URL
    /// (`postgres://user@host:port/db`). The engine applies its migrations.
    #[arg(long, env = "DATABASE_URL", default_value = "sqlite::memory:")]
    database_url: String,
    /// Customer email.
    #[arg(long, default_value = "margaret@example.com")]
    email: String,
    /// Customer name.
    #[arg(long, default_value = "Margaret Hamilton")]
    name: String,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 60)]
    timeout_secs: u64,
}

const TENANT: &str = "example";
const GRANTS: [&str; 3] = ["crm.read", "crm.write", "email.send"];

async fn bind() -> Result<(TcpListener, String)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    Ok((listener, url))
}

async fn run(args: Args) -> Result<bool> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };

    // The test doubles: a scripted OpenAI-compatible model and the CRM.
    let (model_listener, model_url) = bind().await?;
    let script = Script::onboarding().context("loading the embedded model script")?;
    let model_state = Arc::new(ModelServerState::new(script, None));
    tokio::spawn(serve_model_server(model_listener, model_state, stopped()));
    let (crm_listener, crm_url) = bind().await?;
    let crm = Arc::new(CrmState::new());
    tokio::spawn(serve_crm_server(crm_listener, Arc::clone(&crm), stopped()));

    // The engine.
    let store = Store::connect(&args.database_url, 8)
        .await
        .with_context(|| format!("opening the database {}", args.database_url))?;
    store.migrate().await.context("applying migrations")?;
    let coord = Coordinator::new(
        store,
        CoordinatorConfig {
            lease_ms: 10_000,
            sweep_interval_ms: 500,
        },
    );
    let background = coord.spawn_background();
    let (engine_listener, engine_url) = bind().await?;
    let engine = tokio::spawn(belay_engine::api::serve(
        Arc::clone(&coord),
        engine_listener,
        stopped(),
    ));

    // A worker.
    let mut config =
        belay_worker::WorkerConfig::new(engine_url.clone(), "example-worker".to_owned());
    config.model.base_url = format!("{model_url}/v1");
    config.http_base_url = Some(crm_url.clone());
    let worker = tokio::spawn(belay_worker::run(config, stopped()));

    // A PostgreSQL URL may carry a password: name the backend only.
    let database = if args.database_url.starts_with("sqlite:") {
        args.database_url.as_str()
    } else {
        "PostgreSQL"
    };
    eprintln!("engine {engine_url} ({database}) · model {model_url} · crm {crm_url}");

    let client = Client::connect_lazy(&engine_url, TENANT)?;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("definitions");
    for d in client.register_paths(&[dir]).await? {
        let what = if d.created {
            "registered"
        } else {
            "unchanged "
        };
        println!("{what} {} {} v{}", d.kind, d.name, d.version);
    }
    client
        .set_tenant_grants(GRANTS.iter().map(|g| (*g).to_owned()).collect())
        .await?;
    let key = format!("example-{}", uuid::Uuid::new_v4());
    let (run, _) = client
        .start_run(
            "onboarding",
            &json!({"email": args.email, "name": args.name, "plan": "pro"}),
            StartOptions {
                idempotency_key: key,
                caller: "onboarding-example".into(),
                caller_grants: GRANTS.iter().map(|g| (*g).to_owned()).collect(),
            },
        )
        .await?;
    println!("\nrun {} started; timeline:", run.run_id);
    let watched = tokio::time::timeout(
        Duration::from_secs(args.timeout_secs),
        client.watch(&run.run_id, 0, |e| {
            println!("{}", timeline_line(e));
            false
        }),
    )
    .await;
    let final_run = client.get_run(&run.run_id).await?;
    println!("\nstatus: {}", final_run.status);
    if !final_run.status_reason.is_empty() {
        println!("reason: {}", final_run.status_reason);
    }
    if !final_run.output_json.is_empty() {
        let output: serde_json::Value = serde_json::from_str(&final_run.output_json)?;
        println!("output: {}", serde_json::to_string_pretty(&output)?);
    }
    println!(
        "crm: {} request(s), {} account(s) created",
        crm.request_count(None),
        crm.snapshot().accounts.len()
    );

    let _ = stop_tx.send(true);
    for h in background {
        h.abort();
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), worker).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), engine).await;
    match watched {
        Err(_) => bail!(
            "run {} did not finish within {} s",
            run.run_id,
            args.timeout_secs
        ),
        Ok(result) => {
            result?;
        }
    }
    Ok(final_run.status == "completed")
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match run(Args::parse()).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
