//! `belay`: the command-line client for users and operators, and `belay
//! dev` (an engine and a worker in one process, see [`dev`]).

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

mod dev;
mod health;
mod keys;

use std::path::PathBuf;
use std::process::ExitCode;

use belay_sdk::admin::{AdminClient, Resolution, UncertainOutcome, UncertainQuery};
use belay_sdk::{Client, ConnectOptions, Run, SdkError, StartOptions, timeline_line};
use clap::{Parser, Subcommand};
use serde_json::{Value, json};

#[derive(Parser)]
#[command(
    name = "belay",
    version,
    about = "Belay client: definitions, runs, tenants, uncertain outcomes; `belay dev` runs an engine and a worker"
)]
struct Cli {
    /// Engine gRPC URL: http:// (plaintext) or https:// (TLS).
    #[arg(
        long,
        env = "BELAY_ENGINE_URL",
        default_value = "http://127.0.0.1:50051",
        global = true
    )]
    engine_url: String,
    /// API key, sent as `authorization: Bearer <key>` with every engine
    /// call.
    #[arg(long, env = "BELAY_API_KEY", hide_env_values = true, global = true)]
    api_key: Option<String>,
    /// CA certificates (PEM) the engine's certificate must chain to, for
    /// https:// engine and admin URLs; default: the system's trust store.
    #[arg(long, env = "BELAY_CA_FILE", global = true)]
    ca_file: Option<PathBuf>,
    /// Tenant to act for.
    #[arg(long, env = "BELAY_TENANT", default_value = "default", global = true)]
    tenant: String,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// Engine admin endpoint URL (for `uncertain`).
    #[arg(
        long,
        env = "BELAY_ADMIN_URL",
        default_value = "http://127.0.0.1:50052",
        global = true
    )]
    admin_url: String,
    /// A configured admin token (`--admin-tokens` of the engine), used on
    /// the admin endpoint when no --api-key is given; `belay dev` serves
    /// with it as its admin token instead of making an admin key.
    #[arg(long, env = "BELAY_ADMIN_TOKEN", hide_env_values = true, global = true)]
    admin_token: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run an engine (gRPC API, admin endpoint) and a worker in one process,
    /// on a SQLite file by default; stops on Ctrl-C or SIGTERM.
    Dev(Box<dev::DevArgs>),
    /// Probe an engine's gRPC health (or, with --url, an HTTP readiness
    /// route such as a worker's /readyz): exit 0 when serving, 1 otherwise.
    /// The container images' HEALTHCHECK.
    Health(health::HealthArgs),
    #[command(flatten)]
    Client(Cmd),
}

/// The commands that talk to a running engine.
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
    /// List, show and resolve uncertain outcomes (admin endpoint).
    #[command(subcommand)]
    Uncertain(UncertainCmd),
    /// Create, list and revoke API keys (admin endpoint).
    #[command(subcommand)]
    Keys(keys::KeysCmd),
}

#[derive(Subcommand)]
enum UncertainCmd {
    /// List uncertain outcomes, newest first (open ones unless --status).
    List {
        /// open | resolved | any (default: open).
        #[arg(long)]
        status: Option<String>,
        /// Only this tool.
        #[arg(long)]
        tool: Option<String>,
        /// Only this run.
        #[arg(long = "run")]
        run_id: Option<String>,
        /// Only records at least this old, ms.
        #[arg(long)]
        older_than_ms: Option<u64>,
        /// Only records at most this old, ms.
        #[arg(long)]
        newer_than_ms: Option<u64>,
        /// Records per page (1..=500; default 50).
        #[arg(long)]
        page_size: Option<u32>,
        /// Token from a previous page.
        #[arg(long)]
        page_token: Option<String>,
    },
    /// Show one uncertain outcome: arguments, key, attempts, resolution.
    Show {
        /// Uncertain outcome id.
        id: String,
    },
    /// Resolve an uncertain outcome; the run resumes when nothing else holds it.
    Resolve {
        /// Uncertain outcome id.
        id: String,
        #[command(flatten)]
        resolution: ResolveAs,
        /// Use a new idempotency key (with --retry): only when the first
        /// call surely did nothing.
        #[arg(long)]
        new_key: bool,
        /// Why (recorded).
        #[arg(long)]
        reason: String,
        /// Who, within the admin token's name (recorded as `<token>/<operator>`).
        #[arg(long)]
        operator: Option<String>,
    },
}

#[derive(clap::Args)]
#[group(required = true, multiple = false)]
struct ResolveAs {
    /// It took effect: the result to use (JSON, or @path to a JSON file).
    #[arg(long, value_name = "JSON")]
    succeeded: Option<String>,
    /// It failed: the error the model or workflow sees.
    #[arg(long, value_name = "MESSAGE")]
    failed: Option<String>,
    /// Call the tool again (same idempotency key unless --new-key).
    #[arg(long)]
    retry: bool,
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
        /// Permissions, e.g. crm.read crm.write (replaces all current grants).
        #[arg(required_unless_present = "none")]
        grants: Vec<String>,
        /// Remove every grant of the tenant.
        #[arg(long, conflicts_with = "grants")]
        none: bool,
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
    /// Operator pause: the run's tasks are not claimed until resumed.
    Pause {
        /// Run id.
        run_id: String,
        /// Why (recorded).
        #[arg(long)]
        reason: String,
        /// Who (default: $BELAY_OPERATOR, else $USER).
        #[arg(long)]
        operator: Option<String>,
    },
    /// Send a signal to a run (for a `wait` node waiting for it; one sent
    /// early is kept until the wait starts).
    Signal {
        /// Run id.
        run_id: String,
        /// Signal name, as in the wait node's `signal:`.
        name: String,
        /// Payload JSON, or @path to a JSON file (default: null).
        #[arg(long, value_name = "JSON")]
        payload: Option<String>,
        /// The signal's id: sending the same id again is applied once
        /// (default: a new UUID, printed, so a retry can reuse it).
        #[arg(long, value_name = "ID")]
        signal_id: Option<String>,
        /// Who sends it (recorded; default: $BELAY_OPERATOR, else $USER).
        #[arg(long = "from", value_name = "WHO")]
        from: Option<String>,
    },
    /// Approve a waiting `approval` node, optionally with an edited subject.
    Approve {
        /// Run id.
        run_id: String,
        /// The approval node's id.
        node: String,
        /// The subject as approved (JSON, or @path to a JSON file), where
        /// the node allows edits; default: the subject as requested.
        #[arg(long, value_name = "JSON")]
        edit: Option<String>,
        #[command(flatten)]
        decision: DecisionArgs,
    },
    /// Decline a waiting `approval` node.
    Decline {
        /// Run id.
        run_id: String,
        /// The approval node's id.
        node: String,
        #[command(flatten)]
        decision: DecisionArgs,
    },
    /// Answer a tool's question to a person (an MCP elicitation): the call
    /// then runs again with the answer.
    Answer {
        /// Run id.
        run_id: String,
        /// The call that asked (see its `tool_call_input_requested` event).
        call_id: String,
        /// The answer (JSON, or @path to a JSON file), e.g.
        /// `{"action":"accept","content":{"name":"Ada"}}`.
        answer: String,
        /// Who answers (recorded; default: $BELAY_OPERATOR, else $USER).
        #[arg(long = "by", value_name = "WHO")]
        by: Option<String>,
        /// The question answered (`<call_id>.input<n>`, listed by `belay run
        /// get`): needed once the call has asked more than once.
        #[arg(long = "request", value_name = "ID")]
        request: Option<String>,
    },
    /// Lift an operator pause (a run with open uncertain outcomes stays paused).
    Resume {
        /// Run id.
        run_id: String,
        /// Why (recorded).
        #[arg(long)]
        reason: String,
        /// Who (default: $BELAY_OPERATOR, else $USER).
        #[arg(long)]
        operator: Option<String>,
    },
}

/// Who decides an approval, and why.
#[derive(clap::Args)]
struct DecisionArgs {
    /// Why (recorded).
    #[arg(long, default_value = "")]
    reason: String,
    /// Who decides (recorded; default: $BELAY_OPERATOR, else $USER).
    #[arg(long, value_name = "WHO")]
    approver: Option<String>,
    /// A permission the approver holds (repeatable); it must include the
    /// node's `approver_grant`.
    #[arg(long = "grant", value_name = "G")]
    grants: Vec<String>,
    /// The request decided (`belay run get` lists the open ones, e.g.
    /// `review~2.approval`): needed once a loop has visited the node more
    /// than once, and safe to repeat (the same decision again changes
    /// nothing).
    #[arg(long = "request", value_name = "ID")]
    request: Option<String>,
}

/// Who the CLI acts as for run controls: `--operator`, else
/// `$BELAY_OPERATOR`, else `$USER`, else `cli`.
fn operator_name(given: Option<String>) -> String {
    given
        .or_else(|| std::env::var("BELAY_OPERATOR").ok())
        .or_else(|| std::env::var("USER").ok())
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| "cli".to_owned())
}

/// The engine client of the global flags, and its connection options (a
/// value set empty, as by an empty variable, is unset).
fn engine_client(
    url: &str,
    api_key: Option<String>,
    ca_file: Option<PathBuf>,
    tenant: &str,
) -> Result<(Client, ConnectOptions), SdkError> {
    let options = ConnectOptions {
        api_key: api_key.filter(|k| !k.trim().is_empty()),
        ca_file: ca_file.filter(|p| !p.as_os_str().is_empty()),
        ..ConnectOptions::new(url)
    };
    Ok((Client::connect(&options, tenant)?, options))
}

/// The admin client of the global flags; it trusts the engine
/// connection's CA file. One credential for both endpoints: the API key;
/// without one, a configured admin token (`--admin-token`).
fn admin_client(
    cli_url: &str,
    token: &Option<String>,
    tenant: &str,
    engine: &ConnectOptions,
) -> Result<AdminClient, SdkError> {
    let credential = engine.api_key.as_deref().or(token.as_deref()).unwrap_or("");
    AdminClient::with_ca_file(cli_url, credential, tenant, engine.ca_file.as_deref())
}

fn compact(v: &Value, limit: usize) -> String {
    let text = match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    if text.chars().count() <= limit {
        text
    } else {
        let cut: String = text.chars().take(limit.saturating_sub(1)).collect();
        format!("{cut}…")
    }
}

/// `2026-11-29T12:00:00.123456Z` → `2026-11-29 12:00:00Z`.
fn short_time(t: &str) -> String {
    match (t.get(..10), t.get(11..19)) {
        (Some(d), Some(h)) => format!("{d} {h}Z"),
        _ => t.to_owned(),
    }
}

fn print_uncertain_table(items: &[UncertainOutcome]) {
    outln!(
        "{:<36}  {:<16} {:<36}  {:<8} {:<20}  REASON",
        "ID",
        "TOOL",
        "RUN",
        "STATUS",
        "CREATED"
    );
    for r in items {
        let status = match (&r.status[..], &r.resolution_kind) {
            ("resolved", Some(kind)) => kind.clone(),
            (s, _) => s.to_owned(),
        };
        outln!(
            "{:<36}  {:<16} {:<36}  {:<8} {:<20}  {}",
            r.uncertain_id,
            compact(&Value::String(r.tool.clone()), 16),
            r.run_id,
            status,
            short_time(&r.created_at),
            compact(&Value::String(r.reason.clone()), 60)
        );
    }
}

fn print_uncertain(r: &UncertainOutcome, as_json: bool) {
    if as_json {
        outln!("{}", serde_json::to_string(r).unwrap_or_default());
        return;
    }
    let pretty = |v: &Value| {
        serde_json::to_string_pretty(v)
            .unwrap_or_default()
            .replace('\n', "\n                 ")
    };
    outln!("uncertain outcome  {}  ({})", r.uncertain_id, r.status);
    outln!("tenant           {}", r.tenant);
    outln!("run              {}", r.run_id);
    outln!(
        "node / call      {} / {}  (task {})",
        r.node_id,
        r.call_id,
        r.task_id
    );
    outln!("tool             {} v{}", r.tool, r.tool_version);
    outln!("arguments        {}", pretty(&r.arguments));
    outln!("idempotency key  {}", r.idempotency_key);
    outln!("worker           {}", r.worker_id.as_deref().unwrap_or("-"));
    outln!("reason           {}", r.reason);
    outln!("created          {}", r.created_at);
    outln!("attempts");
    for a in &r.attempts {
        let n = a.get("attempt").map(|v| compact(v, 8)).unwrap_or_default();
        let rest: Vec<String> = a
            .as_object()
            .map(|o| {
                o.iter()
                    .filter(|(k, v)| *k != "attempt" && !v.is_null())
                    .map(|(k, v)| format!("{k}={}", compact(v, 120)))
                    .collect()
            })
            .unwrap_or_default();
        outln!("  #{n:<3} {}", rest.join("  "));
    }
    if let Some(probe) = &r.probe {
        outln!("probe            {}", compact(probe, 200));
    }
    if r.status == "resolved" {
        outln!(
            "resolution       {} by {} via {} at {}",
            r.resolution_kind.as_deref().unwrap_or("?"),
            r.resolved_by.as_deref().unwrap_or("?"),
            r.resolved_via.as_deref().unwrap_or("?"),
            r.resolved_at.as_deref().unwrap_or("?")
        );
        outln!(
            "  why            {}",
            r.resolution_reason.as_deref().unwrap_or("")
        );
        if let Some(res) = &r.resolution {
            for key in ["result", "error", "idempotency_key"] {
                if let Some(v) = res.get(key) {
                    outln!("  {key:<17} {}", pretty(v));
                }
            }
        }
    }
    if let Some(d) = r.discrepancy.as_ref().filter(|d| !d.is_null()) {
        outln!(
            "DISCREPANCY      late result(s) after resolution: {}",
            compact(d, 300)
        );
    }
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
        outln!("{}", run_json(r));
        return;
    }
    outln!("run       {}", r.run_id);
    outln!("workflow  {} v{}", r.workflow, r.workflow_version);
    outln!(
        "status    {}{}",
        r.status,
        if r.status_reason.is_empty() {
            String::new()
        } else {
            format!(" ({})", r.status_reason)
        }
    );
    outln!("input     {}", r.input_json);
    if !r.output_json.is_empty() {
        outln!("output    {}", r.output_json);
    }
    outln!("events    {}", r.last_seq);
    outln!("created   {}  updated {}", r.created_at, r.updated_at);
}

/// `belay run get`: the run, then each ready task no live worker can take
/// (`unclaimable <kind> <task id>: <reason>`; in JSON, `unclaimable`), then
/// each request waiting for a person (`waiting <kind> <request id> of
/// <node or call>`; in JSON, `open_requests`).
async fn print_run_detail(client: &Client, run_id: &str, as_json: bool) -> Result<(), SdkError> {
    let detail = client.get_run_response(run_id).await?;
    let run = detail
        .run
        .ok_or_else(|| tonic::Status::internal("GetRun returned no run"))?;
    let (unclaimable, requests) = (detail.unclaimable, detail.open_requests);
    if as_json {
        let mut v = run_json(&run);
        v["open_requests"] = requests
            .iter()
            .map(|r| {
                json!({"request_id": r.request_id, "kind": r.kind, "node": r.node,
                       "call_id": r.call_id, "approver_grant": r.approver_grant})
            })
            .collect();
        v["unclaimable"] = unclaimable
            .iter()
            .map(|t| {
                json!({"task_id": t.task_id, "kind": t.kind, "requires": t.requires,
                       "missing": t.missing, "reason": t.reason})
            })
            .collect();
        outln!("{v}");
        return Ok(());
    }
    print_run(&run, false);
    for t in &unclaimable {
        outln!("unclaimable {} {}: {}", t.kind, t.task_id, t.reason);
    }
    for r in &requests {
        let who = if r.approver_grant.is_empty() {
            String::new()
        } else {
            format!(" (needs {})", r.approver_grant)
        };
        outln!(
            "waiting   {} {} of {}{who}",
            r.kind,
            r.request_id,
            if r.call_id.is_empty() {
                &r.node
            } else {
                &r.call_id
            }
        );
    }
    Ok(())
}

fn read_input(input: &str) -> Result<Value, SdkError> {
    read_json(input, "--input")
}

/// JSON given inline, or `@path` to a JSON file.
fn read_json(input: &str, flag: &str) -> Result<Value, SdkError> {
    let (what, text) = match input.strip_prefix('@') {
        Some(path) => (
            format!("{flag} (file {path})"),
            std::fs::read_to_string(path).map_err(|source| SdkError::Io {
                path: path.into(),
                source,
            })?,
        ),
        None => (flag.to_owned(), input.to_owned()),
    };
    serde_json::from_str(&text).map_err(|source| SdkError::Json { what, source })
}

/// One event: a timeline line, or a JSON object with the payload parsed.
fn print_event(e: &belay_sdk::RunEvent, as_json: bool) {
    if as_json {
        let payload = serde_json::from_str::<Value>(&e.payload_json).unwrap_or(Value::Null);
        outln!(
            "{}",
            json!({"seq": e.seq, "kind": e.kind, "recorded_at": e.recorded_at, "payload": payload})
        );
    } else {
        outln!("{}", timeline_line(e));
    }
}

/// Stream a run's events until it finishes, resuming from the last seq seen
/// when the connection drops (an engine restart), with backoff.
async fn watch(client: &Client, run_id: &str, after: u64, as_json: bool) -> Result<(), SdkError> {
    use backon::BackoffBuilder;
    let mut delays = backon::ExponentialBuilder::default()
        .with_min_delay(std::time::Duration::from_millis(200))
        .with_max_delay(std::time::Duration::from_secs(5))
        .with_max_times(30)
        .build();
    let mut last = after;
    loop {
        let result = client
            .watch(run_id, last, |e| {
                print_event(e, as_json);
                last = e.seq;
                false
            })
            .await;
        match result {
            Ok(_) => return Ok(()),
            Err(SdkError::Status(status))
                if matches!(
                    status.code(),
                    tonic::Code::Unavailable
                        | tonic::Code::Unknown
                        | tonic::Code::Cancelled
                        | tonic::Code::Internal
                ) =>
            {
                let Some(delay) = delays.next() else {
                    return Err(SdkError::Status(status));
                };
                eprintln!(
                    "(connection lost: {}; resuming after seq {last})",
                    status.message()
                );
                tokio::time::sleep(delay).await;
            }
            Err(e) => return Err(e),
        }
    }
}

// `belay dev` serves instead of calling an engine: no client is made.
async fn run(cli: Cli) -> anyhow::Result<()> {
    let command = match cli.command {
        Command::Dev(args) => return dev::run(*args, cli.admin_token, cli.api_key).await,
        Command::Health(args) => {
            let (_, conn) = engine_client(&cli.engine_url, None, cli.ca_file, &cli.tenant)?;
            return health::run(args, &conn).await;
        }
        Command::Client(command) => command,
    };
    let (client, conn) = engine_client(&cli.engine_url, cli.api_key, cli.ca_file, &cli.tenant)?;
    let as_json = cli.json;
    let admin = || admin_client(&cli.admin_url, &cli.admin_token, &cli.tenant, &conn);
    match command {
        Cmd::Keys(cmd) => keys::run(cmd, admin()?, as_json).await?,
        Cmd::Uncertain(UncertainCmd::List {
            status,
            tool,
            run_id,
            older_than_ms,
            newer_than_ms,
            page_size,
            page_token,
        }) => {
            let page = admin()?
                .list_uncertain(&UncertainQuery {
                    status,
                    tool,
                    run_id,
                    older_than_ms,
                    newer_than_ms,
                    page_size,
                    page_token,
                })
                .await?;
            if as_json {
                outln!("{}", serde_json::to_string(&page).unwrap_or_default());
            } else {
                print_uncertain_table(&page.items);
                if let Some(next) = &page.next_page_token {
                    outln!("next page: --page-token '{next}'");
                }
            }
        }
        Cmd::Uncertain(UncertainCmd::Show { id }) => {
            print_uncertain(&admin()?.get_uncertain(&id).await?, as_json)
        }
        Cmd::Uncertain(UncertainCmd::Resolve {
            id,
            resolution,
            new_key,
            reason,
            operator,
        }) => {
            // clap counts a false flag as present, so check `--new-key` here.
            if new_key && !resolution.retry {
                eprintln!("error: --new-key only goes with --retry");
                std::process::exit(2);
            }
            let resolution = match resolution {
                ResolveAs {
                    succeeded: Some(result),
                    ..
                } => Resolution::Succeeded(read_json(&result, "--succeeded")?),
                ResolveAs {
                    failed: Some(error),
                    ..
                } => Resolution::Failed(error),
                _ => Resolution::Retry {
                    new_idempotency_key: new_key,
                },
            };
            let r = admin()?
                .resolve_uncertain(&id, resolution, &reason, operator.as_deref())
                .await?;
            if !as_json {
                outln!("resolved; the run resumes unless something else holds it\n");
            }
            print_uncertain(&r, as_json);
        }
        Cmd::Run(RunCmd::Pause {
            run_id,
            reason,
            operator,
        }) => print_run(
            &client
                .pause_run(&run_id, &operator_name(operator), &reason)
                .await?,
            as_json,
        ),
        Cmd::Run(RunCmd::Resume {
            run_id,
            reason,
            operator,
        }) => print_run(
            &client
                .resume_run(&run_id, &operator_name(operator), &reason)
                .await?,
            as_json,
        ),
        Cmd::Run(RunCmd::Signal {
            run_id,
            name,
            payload,
            signal_id,
            from,
        }) => {
            let payload = match payload {
                Some(text) => read_json(&text, "--payload")?,
                None => Value::Null,
            };
            let signal_id = signal_id.unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
            let (r, duplicate) = client
                .signal(&run_id, &name, &signal_id, &payload, &operator_name(from))
                .await?;
            if as_json {
                outln!(
                    "{}",
                    json!({"signal_id": signal_id, "duplicate": duplicate, "run": run_json(&r)})
                );
            } else {
                if duplicate {
                    outln!(
                        "signal {name} {signal_id} was already delivered: applied once, not again"
                    );
                } else {
                    outln!("signal {name} delivered (signal id {signal_id})");
                }
                print_run(&r, as_json);
            }
        }
        Cmd::Run(RunCmd::Approve {
            run_id,
            node,
            edit,
            decision,
        }) => {
            let edit = edit.map(|text| read_json(&text, "--edit")).transpose()?;
            let r = decide(&client, &run_id, &node, true, edit.as_ref(), decision).await?;
            if !as_json {
                outln!(
                    "approved node {node}{}",
                    if edit.is_some() { " with an edit" } else { "" }
                );
            }
            print_run(&r, as_json);
        }
        Cmd::Run(RunCmd::Decline {
            run_id,
            node,
            decision,
        }) => {
            let r = decide(&client, &run_id, &node, false, None, decision).await?;
            if !as_json {
                outln!("declined node {node}");
            }
            print_run(&r, as_json);
        }
        Cmd::Run(answer @ RunCmd::Answer { .. }) => {
            answer_question(&client, answer, as_json).await?
        }
        Cmd::Definitions(DefCmd::Register { paths }) => {
            let defs = client.register_paths(&paths).await?;
            for d in defs {
                if as_json {
                    outln!(
                        "{}",
                        json!({"kind": d.kind, "name": d.name, "version": d.version, "content_hash": d.content_hash, "created": d.created})
                    );
                } else {
                    outln!(
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
                    outln!(
                        "{}",
                        json!({"kind": d.kind, "name": d.name, "version": d.version, "content_hash": d.content_hash, "created_at": d.created_at})
                    );
                } else {
                    outln!(
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
        Cmd::Tenant(TenantCmd::SetGrants { grants, none: _ }) => {
            let grants = client.set_tenant_grants(grants).await?;
            outln!(
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
            outln!(
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
                outln!("(idempotency key already used: existing run)");
            }
            print_run(&r, as_json);
            if follow {
                watch(&client, &r.run_id, 0, as_json).await?;
                print_run(&client.get_run(&r.run_id).await?, as_json);
            }
        }
        Cmd::Run(RunCmd::Get { run_id }) => print_run_detail(&client, &run_id, as_json).await?,
        Cmd::Run(RunCmd::List {
            status,
            page_size,
            page_token,
        }) => {
            let (runs, next) = client.list_runs(&status, page_size, &page_token).await?;
            if as_json {
                outln!(
                    "{}",
                    json!({"runs": runs.iter().map(run_json).collect::<Vec<_>>(), "next_page_token": next})
                );
            } else {
                outln!(
                    "{:<36}  {:<20} {:<10} {:>6}  CREATED",
                    "RUN",
                    "WORKFLOW",
                    "STATUS",
                    "EVENTS"
                );
                for r in &runs {
                    outln!(
                        "{:<36}  {:<20} {:<10} {:>6}  {}",
                        r.run_id,
                        r.workflow,
                        r.status,
                        r.last_seq,
                        r.created_at
                    );
                }
                if !next.is_empty() {
                    outln!("next page: --page-token '{next}'");
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

/// `belay run answer`: `ProvideToolInput` for a tool's question.
async fn answer_question(client: &Client, cmd: RunCmd, as_json: bool) -> Result<(), SdkError> {
    let RunCmd::Answer {
        run_id,
        call_id,
        answer,
        by,
        request,
    } = cmd
    else {
        return Ok(());
    };
    let answer = read_json(&answer, "ANSWER")?;
    let request = request.unwrap_or_default();
    let (r, duplicate) = client
        .answer_request(&run_id, &call_id, &request, &answer, &operator_name(by))
        .await?;
    if duplicate {
        eprintln!("call {call_id} had already been given this answer; nothing changed");
    }
    if !as_json {
        outln!("answered call {call_id}");
    }
    print_run(&r, as_json);
    Ok(())
}

/// `DecideApproval` for `belay run approve` / `decline`.
async fn decide(
    client: &Client,
    run_id: &str,
    node: &str,
    approve: bool,
    edit: Option<&Value>,
    decision: DecisionArgs,
) -> Result<Run, SdkError> {
    let approver = operator_name(decision.approver);
    let Some(request) = decision.request else {
        return client
            .decide_approval(
                run_id,
                node,
                approve,
                edit,
                &approver,
                decision.grants,
                &decision.reason,
            )
            .await;
    };
    let (run, duplicate) = client
        .decide_request(
            run_id,
            &request,
            approve,
            edit,
            &approver,
            decision.grants,
            &decision.reason,
        )
        .await?;
    if duplicate {
        eprintln!("request {request} was already decided this way; nothing changed");
    }
    Ok(run)
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

fn main() -> ExitCode {
    // Started as an expression evaluator of the sandbox: serve and exit.
    belay_engine::expr_sandbox::run_sandbox_if_requested();
    // Otherwise evaluate workflow expressions in such evaluators.
    belay_engine::expr_sandbox::enable_sandbox();
    async_main()
}

#[tokio::main]
async fn async_main() -> ExitCode {
    let cli = Cli::parse();
    let engine_url = cli.engine_url.clone();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            if format!("{e:#}").contains("invalid peer certificate") {
                eprintln!(
                    "hint: the engine's certificate is not trusted here: pass --ca-file (BELAY_CA_FILE) with the CA that issued it"
                );
                return ExitCode::FAILURE;
            }
            let unreachable = e.downcast_ref::<SdkError>().is_some_and(|e| {
                matches!(e, SdkError::Status(s) if s.code() == tonic::Code::Unavailable
                    && s.message().contains("connect"))
            });
            if unreachable {
                eprintln!(
                    "hint: no engine answers at {engine_url} (--engine-url / BELAY_ENGINE_URL); is one running? `belay dev` starts one"
                );
            }
            ExitCode::FAILURE
        }
    }
}
