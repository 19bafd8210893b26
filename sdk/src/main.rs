//! `belay`: the command-line client for users and operators.

use std::path::PathBuf;
use std::process::ExitCode;

use belay_sdk::{Client, Run, SdkError, StartOptions, timeline_line};
use clap::{Parser, Subcommand};
use serde_json::{Value, json};

#[derive(Parser)]
#[command(
    name = "belay",
    version,
    about = "Belay client: definitions, runs, tenants"
)]
struct Cli {
    /// Engine gRPC URL.
    #[arg(
        long,
        env = "BELAY_ENGINE_URL",
        default_value = "http://127.0.0.1:50051",
        global = true
    )]
    engine_url: String,
    /// Tenant to act for.
    #[arg(long, env = "BELAY_TENANT", default_value = "default", global = true)]
    tenant: String,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Register and list definitions.
    #[command(subcommand)]
    Definitions(DefCmd),
    /// Start, inspect, watch and cancel runs.
    #[command(subcommand)]
    Run(RunCmd),
    /// Tenant permissions.
    #[command(subcommand)]
    Tenant(TenantCmd),
}

#[derive(Subcommand)]
enum DefCmd {
    /// Register `*.tools.abl` and YAML files (files or folders) as one bundle.
    Register {
        /// Files or folders.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// List definitions.
    List {
        /// tool | agent | workflow
        #[arg(long, default_value = "")]
        kind: String,
    },
}

#[derive(Subcommand)]
enum TenantCmd {
    /// Replace the tenant's grants.
    SetGrants {
        /// Permissions, e.g. crm.read crm.write.
        grants: Vec<String>,
    },
    /// Show the tenant's grants.
    Show,
}

#[derive(Subcommand)]
enum RunCmd {
    /// Start a run (prints it; with --watch, streams its events until it ends).
    Start {
        /// Workflow name.
        workflow: String,
        /// Input JSON, or @path to a JSON file.
        #[arg(long, default_value = "{}")]
        input: String,
        /// Idempotency key; default: a new random key.
        #[arg(long)]
        idempotency_key: Option<String>,
        /// Caller name.
        #[arg(long, default_value = "cli")]
        caller: String,
        /// Permission the caller holds (repeatable).
        #[arg(long = "grant")]
        grants: Vec<String>,
        /// Stream events until the run finishes.
        #[arg(long)]
        watch: bool,
    },
    /// Show one run.
    Get {
        /// Run id.
        run_id: String,
    },
    /// List runs, newest first.
    List {
        /// Filter by status.
        #[arg(long, default_value = "")]
        status: String,
        /// Page size (1..=500).
        #[arg(long, default_value_t = 50)]
        page_size: u32,
        /// Token from a previous page.
        #[arg(long, default_value = "")]
        page_token: String,
    },
    /// Print a run's event timeline.
    Events {
        /// Run id.
        run_id: String,
        /// Only events after this seq.
        #[arg(long, default_value_t = 0)]
        after: u64,
    },
    /// Stream a run's events until it finishes.
    Watch {
        /// Run id.
        run_id: String,
        /// Resume after this seq.
        #[arg(long, default_value_t = 0)]
        after: u64,
    },
    /// Cancel a run.
    Cancel {
        /// Run id.
        run_id: String,
        /// Why.
        #[arg(long, default_value = "")]
        reason: String,
    },
}

fn run_json(r: &Run) -> Value {
    json!({
        "run_id": r.run_id, "tenant": r.tenant, "workflow": r.workflow,
        "workflow_version": r.workflow_version, "status": r.status,
        "status_reason": r.status_reason,
        "input": serde_json::from_str::<Value>(&r.input_json).unwrap_or(Value::Null),
        "output": serde_json::from_str::<Value>(&r.output_json).unwrap_or(Value::Null),
        "idempotency_key": r.idempotency_key, "caller": r.caller, "last_seq": r.last_seq,
        "created_at": r.created_at, "updated_at": r.updated_at,
    })
}

fn print_run(r: &Run, as_json: bool) {
    if as_json {
        println!("{}", run_json(r));
        return;
    }
    println!("run       {}", r.run_id);
    println!("workflow  {} v{}", r.workflow, r.workflow_version);
    println!(
        "status    {}{}",
        r.status,
        if r.status_reason.is_empty() {
            String::new()
        } else {
            format!(" ({})", r.status_reason)
        }
    );
    println!("input     {}", r.input_json);
    if !r.output_json.is_empty() {
        println!("output    {}", r.output_json);
    }
    println!("events    {}", r.last_seq);
    println!("created   {}  updated {}", r.created_at, r.updated_at);
}

fn read_input(input: &str) -> Result<Value, SdkError> {
    let (what, text) = match input.strip_prefix('@') {
        Some(path) => (
            path.to_owned(),
            std::fs::read_to_string(path).map_err(|source| SdkError::Io {
                path: path.into(),
                source,
            })?,
        ),
        None => ("--input".to_owned(), input.to_owned()),
    };
    serde_json::from_str(&text).map_err(|source| SdkError::Json { what, source })
}

/// One event: a timeline line, or a JSON object with the payload parsed.
fn print_event(e: &belay_sdk::RunEvent, as_json: bool) {
    if as_json {
        let payload = serde_json::from_str::<Value>(&e.payload_json).unwrap_or(Value::Null);
        println!(
            "{}",
            json!({"seq": e.seq, "kind": e.kind, "recorded_at": e.recorded_at, "payload": payload})
        );
    } else {
        println!("{}", timeline_line(e));
    }
}

async fn watch(client: &Client, run_id: &str, after: u64, as_json: bool) -> Result<(), SdkError> {
    client
        .watch(run_id, after, |e| {
            print_event(e, as_json);
            false
        })
        .await?;
    Ok(())
}

async fn run(cli: Cli) -> Result<(), SdkError> {
    let client = Client::connect_lazy(&cli.engine_url, &cli.tenant)?;
    let as_json = cli.json;
    match cli.command {
        Cmd::Definitions(DefCmd::Register { paths }) => {
            let defs = client.register_paths(&paths).await?;
            for d in defs {
                if as_json {
                    println!(
                        "{}",
                        json!({"kind": d.kind, "name": d.name, "version": d.version, "content_hash": d.content_hash, "created": d.created})
                    );
                } else {
                    println!(
                        "{:<9} {:<28} v{:<4} {}",
                        d.kind,
                        d.name,
                        d.version,
                        if d.created { "registered" } else { "unchanged" }
                    );
                }
            }
        }
        Cmd::Definitions(DefCmd::List { kind }) => {
            for d in client.list_definitions(&kind).await? {
                if as_json {
                    println!(
                        "{}",
                        json!({"kind": d.kind, "name": d.name, "version": d.version, "content_hash": d.content_hash, "created_at": d.created_at})
                    );
                } else {
                    println!(
                        "{:<9} {:<28} v{:<4} {}  {}",
                        d.kind,
                        d.name,
                        d.version,
                        &d.content_hash[..12.min(d.content_hash.len())],
                        d.created_at
                    );
                }
            }
        }
        Cmd::Tenant(TenantCmd::SetGrants { grants }) => {
            let grants = client.set_tenant_grants(grants).await?;
            println!(
                "{}",
                if as_json {
                    json!({"tenant": client.tenant(), "grants": grants}).to_string()
                } else {
                    grants.join(" ")
                }
            );
        }
        Cmd::Tenant(TenantCmd::Show) => {
            let grants = client.tenant_grants().await?;
            println!(
                "{}",
                if as_json {
                    json!({"tenant": client.tenant(), "grants": grants}).to_string()
                } else {
                    grants.join(" ")
                }
            );
        }
        Cmd::Run(RunCmd::Start {
            workflow,
            input,
            idempotency_key,
            caller,
            grants,
            watch: follow,
        }) => {
            let input = read_input(&input)?;
            let key = idempotency_key.unwrap_or_else(|| format!("cli-{}", uuid_like()));
            let (r, created) = client
                .start_run(
                    &workflow,
                    &input,
                    StartOptions {
                        idempotency_key: key,
                        caller,
                        caller_grants: grants,
                    },
                )
                .await?;
            if !as_json && !created {
                println!("(idempotency key already used: existing run)");
            }
            print_run(&r, as_json);
            if follow {
                watch(&client, &r.run_id, 0, as_json).await?;
                print_run(&client.get_run(&r.run_id).await?, as_json);
            }
        }
        Cmd::Run(RunCmd::Get { run_id }) => print_run(&client.get_run(&run_id).await?, as_json),
        Cmd::Run(RunCmd::List {
            status,
            page_size,
            page_token,
        }) => {
            let (runs, next) = client.list_runs(&status, page_size, &page_token).await?;
            if as_json {
                println!(
                    "{}",
                    json!({"runs": runs.iter().map(run_json).collect::<Vec<_>>(), "next_page_token": next})
                );
            } else {
                println!(
                    "{:<36}  {:<20} {:<10} {:>6}  CREATED",
                    "RUN", "WORKFLOW", "STATUS", "EVENTS"
                );
                for r in &runs {
                    println!(
                        "{:<36}  {:<20} {:<10} {:>6}  {}",
                        r.run_id, r.workflow, r.status, r.last_seq, r.created_at
                    );
                }
                if !next.is_empty() {
                    println!("next page: --page-token '{next}'");
                }
            }
        }
        Cmd::Run(RunCmd::Events { run_id, after }) => {
            for e in client.events(&run_id, after).await? {
                print_event(&e, as_json);
            }
        }
        Cmd::Run(RunCmd::Watch { run_id, after }) => {
            watch(&client, &run_id, after, as_json).await?
        }
        Cmd::Run(RunCmd::Cancel { run_id, reason }) => {
            print_run(&client.cancel_run(&run_id, &reason).await?, as_json)
        }
    }
    Ok(())
}

/// A random-enough key for CLI-started runs (time + pid), without pulling in
/// a UUID crate for one call.
fn uuid_like() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{nanos:x}-{:x}", std::process::id())
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
