//! `onboarding`: runs the customer-onboarding example end to end in one
//! process: an engine (on an in-memory SQLite database unless
//! `--database-url` names a SQLite file or a PostgreSQL database), a worker,
//! the scripted model server and the CRM server (on free local ports);
//! registers the example's definitions and submits one `onboarding` run.
//!
//! The run waits twice for the outside world, and the runner plays it: when
//! the run waits for documents, it lets `--days-without-documents` days pass
//! on the engine's clock (so the 3-day reminder goes out), then sends the
//! `documents_received` signal (twice, with one signal id: applied once);
//! when the run waits for approval, it approves as an approver holding
//! `onboarding.approve`, optionally changing the plan. It prints the event
//! timeline, the final output and what the CRM received, and exits 0 when
//! the run completed.

/// `println!` for output that may go to a closed pipe (`belay … | head`):
/// a broken pipe ends the process quietly (exit 0) instead of panicking;
/// any other write error ends it with exit 1.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        if let Err(e) = writeln!(out, $($arg)*).and_then(|()| out.flush()) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(0);
            }
            eprintln!("error: writing to stdout: {e}");
            std::process::exit(1);
        }
    }};
}

/// `print!` with the broken-pipe handling of [`outln!`].
#[allow(unused_macros)]
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        if let Err(e) = write!(out, $($arg)*).and_then(|()| out.flush()) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(0);
            }
            eprintln!("error: writing to stdout: {e}");
            std::process::exit(1);
        }
    }};
}

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use belay_engine::auth::{Role, Tenants, mint_key};
use belay_engine::coordinator::{Coordinator, CoordinatorConfig};
use belay_engine::server::{CallbackListener, Engine, EngineOptions, Listeners};
use belay_example_onboarding::{
    CrmState, ModelServerState, Script, serve_crm_server, serve_model_server,
};
use belay_sdk::{Client, ConnectOptions, RunEvent, StartOptions, timeline_line};
use clap::Parser;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

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
    /// Customer email (an email whose local part contains `+review` makes the
    /// CRM's KYC check answer `review`, and the run fails at `kyc_review`).
    #[arg(long, default_value = "margaret@example.com")]
    email: String,
    /// Customer name.
    #[arg(long, default_value = "Margaret Hamilton")]
    name: String,
    /// The plan the customer asks for.
    #[arg(long, default_value = "pro")]
    plan: String,
    /// Days that pass before the customer sends the documents: the runner
    /// moves the engine's clock forward this far (the test clock in the
    /// `belay_clock` table, kept in the database; 0 leaves the clock alone).
    /// From 3 days on, the reminder email goes out first.
    #[arg(long, default_value_t = 3)]
    days_without_documents: u32,
    /// Approve with this plan instead of the requested one (an approver's
    /// edit: starter, pro or enterprise).
    #[arg(long)]
    approved_plan: Option<String>,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 60)]
    timeout_secs: u64,
}

const TENANT: &str = "example";
const GRANTS: [&str; 3] = ["crm.read", "crm.write", "email.send"];
const DAY_MS: u64 = 24 * 3600 * 1000;

async fn bind() -> Result<(TcpListener, String)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    Ok((listener, url))
}

/// What the runner does in the outside world's place.
struct Outside<'a> {
    client: &'a Client,
    coord: &'a Coordinator,
    args: &'a Args,
    run_id: String,
    /// Whether the days without documents have passed.
    days_passed: bool,
}

impl Outside<'_> {
    /// React to one event of the run.
    async fn on_event(&mut self, event: &RunEvent) -> Result<()> {
        let payload: Value = serde_json::from_str(&event.payload_json).unwrap_or(Value::Null);
        match event.kind.as_str() {
            "wait_started" if payload["node"] == "documents" => {
                self.show_waiting().await?;
                if !self.days_passed && self.args.days_without_documents > 0 {
                    self.days_passed = true;
                    let ms = u64::from(self.args.days_without_documents) * DAY_MS;
                    outln!(
                        "      ⏩ {} day(s) pass without documents (the engine's clock moves forward)",
                        self.args.days_without_documents
                    );
                    self.coord
                        .store()
                        .advance_clock(i64::try_from(ms)?)
                        .await
                        .context("moving the engine's clock")?;
                    // A timer due by now fires and brings the run back to
                    // this wait (after the reminder); otherwise the
                    // documents come now.
                    let due = payload["timers"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|t| t["after_ms"].as_u64())
                        .any(|after| after <= ms);
                    if due {
                        return Ok(());
                    }
                }
                self.send_documents().await
            }
            "approval_requested" => {
                self.show_waiting().await?;
                self.approve(&payload).await
            }
            _ => Ok(()),
        }
    }

    async fn show_waiting(&self) -> Result<()> {
        let run = self.client.get_run(&self.run_id).await?;
        outln!("      … run {}: {}", run.status, run.status_reason);
        Ok(())
    }

    /// The customer portal sends the documents, and (a retry) again with the
    /// same signal id: the second is a duplicate, applied once.
    async fn send_documents(&self) -> Result<()> {
        let signal_id = format!("documents-{}", self.run_id);
        let payload = json!({"files": ["passport.pdf", "proof_of_address.pdf"]});
        for attempt in ["sent", "resent"] {
            let (_, duplicate) = self
                .client
                .signal(
                    &self.run_id,
                    "documents_received",
                    &signal_id,
                    &payload,
                    "customer-portal",
                )
                .await
                .context("sending the documents_received signal")?;
            outln!(
                "      ✉ customer portal {attempt} signal documents_received ({signal_id}): {}",
                if duplicate {
                    "a duplicate, applied once"
                } else {
                    "delivered"
                }
            );
        }
        Ok(())
    }

    /// An approver with `onboarding.approve` approves, with the plan edited
    /// when `--approved-plan` says so.
    async fn approve(&self, request: &Value) -> Result<()> {
        let node = request["node"].as_str().unwrap_or("approve");
        let edit = self.args.approved_plan.as_ref().map(|plan| {
            let mut subject = request["subject"].clone();
            subject["plan"] = json!(plan);
            subject
        });
        self.client
            .decide_approval(
                &self.run_id,
                node,
                true,
                edit.as_ref(),
                "example-approver",
                vec!["onboarding.approve".into()],
                "documents and KYC checked",
            )
            .await
            .context("approving")?;
        match &edit {
            Some(subject) => outln!("      ✔ example-approver approved {node} as {subject}"),
            None => outln!("      ✔ example-approver approved {node}"),
        }
        Ok(())
    }
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

    // The engine. Timers are found by the sweeper, so a short interval makes
    // the reminder go out promptly once the clock has moved.
    let (callback_listener, callback_url) = bind().await?;
    let (engine_listener, engine_url) = bind().await?;
    let engine = Engine::start(EngineOptions {
        coordinator: CoordinatorConfig {
            lease_ms: 10_000,
            sweep_interval_ms: 200,
            ..CoordinatorConfig::default()
        },
        // The callback endpoint of the KYC check (`type: async_webhook`).
        callback_base_url: Some(callback_url),
        ..EngineOptions::new(args.database_url.clone(), 8)
    })
    .await
    .with_context(|| format!("opening the database {}", args.database_url))?;
    let coord = Arc::clone(engine.coordinator());
    // Every call is authenticated: a key for the worker, and an admin key
    // for this program (it registers definitions, grants the tenant its
    // permissions, starts the run and approves it).
    let store = coord.store().clone();
    let mint = |principal: &'static str, role: Role| {
        let store = store.clone();
        async move {
            mint_key(
                &store,
                principal,
                role,
                Tenants::All,
                Vec::new(),
                "onboarding example",
            )
            .await
            .with_context(|| format!("making the {role} key"))
        }
    };
    let worker_key = mint("example-worker", Role::Worker).await?;
    let admin_key = mint("example-admin", Role::Admin).await?;
    let listeners = Listeners {
        callbacks: Some(CallbackListener::Own(callback_listener)),
        ..Listeners::grpc_only(engine_listener)
    };
    let engine = tokio::spawn(engine.serve(listeners, stopped()));

    // A worker.
    let mut config =
        belay_worker::WorkerConfig::new(engine_url.clone(), "example-worker".to_owned());
    config.engine_auth.api_key = Some(worker_key);
    config.model.base_url = format!("{model_url}/v1");
    config.http_base_url = Some(crm_url.clone());
    // The CRM double runs on this machine; tool requests reach loopback only
    // when allowed (see belay_worker::ssrf).
    config.tool_network_policy = belay_worker::NetworkPolicy::allowing_loopback();
    let worker = tokio::spawn(belay_worker::run(config, stopped()));

    // A PostgreSQL URL may carry a password: name the backend only.
    let database = if args.database_url.starts_with("sqlite:") {
        args.database_url.as_str()
    } else {
        "PostgreSQL"
    };
    eprintln!("engine {engine_url} ({database}) · model {model_url} · crm {crm_url}");

    let client = Client::connect(
        &ConnectOptions {
            api_key: Some(admin_key),
            ..ConnectOptions::new(&engine_url)
        },
        TENANT,
    )?;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("definitions");
    for d in client.register_paths(&[dir]).await? {
        let what = if d.created {
            "registered"
        } else {
            "unchanged "
        };
        outln!("{what} {} {} v{}", d.kind, d.name, d.version);
    }
    client
        .set_tenant_grants(GRANTS.iter().map(|g| (*g).to_owned()).collect())
        .await?;
    let key = format!("example-{}", uuid::Uuid::new_v4());
    let (run, _) = client
        .start_run(
            "onboarding",
            &json!({"email": args.email, "name": args.name, "plan": args.plan}),
            StartOptions {
                idempotency_key: key,
                caller: "onboarding-example".into(),
                caller_grants: GRANTS.iter().map(|g| (*g).to_owned()).collect(),
            },
        )
        .await?;
    outln!("\nrun {} started; timeline:", run.run_id);

    // The watch stream feeds a channel, so the runner can call the engine
    // (signal, approve) between events.
    let (events_tx, mut events) = mpsc::unbounded_channel::<RunEvent>();
    let watcher = tokio::spawn({
        let client = client.clone();
        let run_id = run.run_id.clone();
        async move {
            client
                .watch(&run_id, 0, |e| {
                    let _ = events_tx.send(e.clone());
                    false
                })
                .await
        }
    });
    let mut outside = Outside {
        client: &client,
        coord: &coord,
        args: &args,
        run_id: run.run_id.clone(),
        days_passed: false,
    };
    let mut watcher = watcher;
    let played = tokio::time::timeout(Duration::from_secs(args.timeout_secs), async {
        while let Some(event) = events.recv().await {
            outln!("{}", timeline_line(&event));
            outside.on_event(&event).await?;
        }
        // The stream ended: the run finished, or the watch failed.
        (&mut watcher).await?.context("watching the run")?;
        anyhow::Ok(())
    })
    .await;
    let final_run = client.get_run(&run.run_id).await?;
    outln!("\nstatus: {}", final_run.status);
    if !final_run.status_reason.is_empty() {
        outln!("reason: {}", final_run.status_reason);
    }
    if !final_run.output_json.is_empty() {
        let output: Value = serde_json::from_str(&final_run.output_json)?;
        outln!("output: {}", serde_json::to_string_pretty(&output)?);
    }
    let state = crm.snapshot();
    outln!(
        "crm: {} request(s); {} account(s), {} reminder(s), {} KYC check(s), {} welcome email(s){}",
        crm.request_count(None),
        state.accounts.len(),
        state.reminders.len(),
        state.kyc_checks.len(),
        state.emails.len(),
        state
            .emails
            .last()
            .and_then(|e| e.plan.as_deref())
            .map(|plan| format!(" (plan {plan})"))
            .unwrap_or_default()
    );

    let _ = stop_tx.send(true);
    watcher.abort();
    let _ = tokio::time::timeout(Duration::from_secs(5), worker).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), engine).await;
    match played {
        Err(_) => bail!(
            "run {} did not finish within {} s",
            run.run_id,
            args.timeout_secs
        ),
        Ok(result) => result?,
    }
    Ok(final_run.status == "completed")
}

fn main() -> ExitCode {
    // Started as an expression evaluator of the sandbox: serve and exit.
    belay_engine::expr_sandbox::run_sandbox_if_requested();
    // Otherwise evaluate workflow expressions in such evaluators.
    belay_engine::expr_sandbox::enable_sandbox();
    async_main()
}

#[tokio::main]
async fn async_main() -> ExitCode {
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
