//! `belay dev`: the engine and a worker in one process on a SQLite file.
//! An onboarding run end to end, a clean stop that keeps the data, a SIGKILL
//! while the CRM holds a dispatched `create_account` and a restart on the
//! same file, and the flags it refuses.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};
use belay_tests::{
    ADMIN_TOKEN, DbBackend, EngineOpts, Env, Proc, TestDb, bin, dispatch_counts, of_kind, repo_root,
};
use nix::sys::signal::Signal;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const T: Duration = Duration::from_secs(60);

/// The SQLite file of a test database.
fn db_file(db: &TestDb) -> Result<PathBuf> {
    db.url
        .strip_prefix("sqlite://")
        .map(PathBuf::from)
        .ok_or_else(|| anyhow!("{} is not a SQLite URL", db.url))
}

/// `belay dev` on `file`, on free ports, with the test admin token, short
/// leases and `extra` flags; returns once it printed both addresses.
async fn spawn_dev(name: &str, file: &Path, extra: &[String]) -> Result<Proc> {
    let mut args: Vec<String> = [
        "dev",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--admin-token",
        ADMIN_TOKEN,
        "--lease-ms",
        "1500",
        "--sweep-interval-ms",
        "100",
        "--db",
    ]
    .map(String::from)
    .into();
    args.push(file.display().to_string());
    args.extend_from_slice(extra);
    Proc::spawn_lines(name, &bin("belay")?, &args, &[], 2).await
}

/// An [`Env`] whose engine 0 is `belay dev` (engine and worker in one
/// process) on a fresh SQLite file, with the example's definitions and
/// grants registered.
async fn dev_env() -> Result<Env> {
    let db = TestDb::create_on(DbBackend::Sqlite).await?;
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
        opts: EngineOpts::default(),
        http: reqwest::Client::new(),
        tenant: "acme".into(),
        tls: None,
        worker_key: String::new(),
    };
    let dev = spawn_dev("dev", &db_file(&env.db)?, &worker_flags(&env)).await?;
    env.engines.push(dev);
    let client = env.client(0)?;
    client
        .register_paths(&[repo_root().join("examples/onboarding/definitions")])
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

/// Flags pointing the in-process worker at the env's doubles.
fn worker_flags(env: &Env) -> Vec<String> {
    vec![
        "--model-base-url".into(),
        format!("{}/v1", env.model.url),
        "--http-base-url".into(),
        env.crm.url.clone(),
        // The doubles run on this machine.
        "--allow-private-network".into(),
        "127.0.0.0/8,::1".into(),
        "--concurrency".into(),
        "4".into(),
        "--model-provider".into(),
        "openai".into(),
    ]
}

/// Every request the CRM received, in arrival order.
async fn all_crm_requests(env: &Env) -> Result<Vec<Value>> {
    let v: Value = env
        .http
        .get(format!("{}/_requests", env.crm.url))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    Ok(v.as_array().cloned().unwrap_or_default())
}

/// A run's events are gapless (checked by [`Env::events`]), it completed
/// once, and every `never` / `reconcile` call was dispatched at most once and
/// reached the CRM at most once (by its idempotency key).
async fn assert_completed_once_without_repeats(env: &Env, run_id: &str) -> Result<Vec<Value>> {
    let events = env.events(run_id).await?;
    assert_eq!(of_kind(&events, "run_completed").len(), 1);
    let dispatches = dispatch_counts(&events);
    let requests = all_crm_requests(env).await?;
    let mut unsafe_calls = 0;
    for call in of_kind(&events, "tool_call_scheduled") {
        if !matches!(call["repeat_safety"].as_str(), Some("never" | "reconcile")) {
            continue;
        }
        unsafe_calls += 1;
        let call_id = call["call_id"].as_str().unwrap_or_default();
        let n = dispatches.get(call_id).copied().unwrap_or(0);
        assert!(n <= 1, "{call_id} dispatched {n} times");
        let key = &call["idempotency_key"];
        let seen = requests
            .iter()
            .filter(|r| &r["idempotency_key"] == key)
            .count();
        assert!(seen <= 1, "the CRM saw {call_id} {seen} times");
    }
    assert!(unsafe_calls >= 1, "the onboarding creates an account");
    Ok(events)
}

/// Run `belay args…` to its end (it must not serve), with logs at `warn`.
async fn belay_output(args: &[&str]) -> Result<Output> {
    let mut cmd = Command::new(bin("belay")?);
    cmd.args(args)
        .env("RUST_LOG", "warn")
        .env_remove("DATABASE_URL")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    tokio::time::timeout(T, cmd.output())
        .await
        .with_context(|| format!("belay {args:?} did not exit"))?
        .map_err(Into::into)
}

/// `belay` exited non-zero with exactly one `error:` line on stderr, no
/// panic; returns that line.
fn refused(output: &Output) -> Result<String> {
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(!output.status.success(), "exited 0; stderr: {stderr}");
    ensure!(!stderr.contains("panicked"), "panicked: {stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    match errors.as_slice() {
        [line] => Ok((*line).to_owned()),
        _ => bail!("expected one `error:` line, got: {stderr}"),
    }
}

/// `belay dev args…` spawned directly, and the four lines it prints first.
async fn spawn_dev_lines(args: &[&str]) -> Result<(Child, Vec<String>)> {
    let mut cmd = Command::new(bin("belay")?);
    cmd.arg("dev")
        .args(args)
        .env_remove("BELAY_ADMIN_TOKEN")
        .env_remove("DATABASE_URL")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    let mut child = cmd.spawn()?;
    let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
    let mut lines = BufReader::new(stdout).lines();
    let mut printed = Vec::new();
    for _ in 0..4 {
        let line = tokio::time::timeout(T, lines.next_line())
            .await
            .context("belay dev did not start")??
            .ok_or_else(|| anyhow!("belay dev exited after printing {printed:?}"))?;
        printed.push(line);
    }
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok((child, printed))
}

/// SIGTERM `belay dev` and expect a clean exit (0) within the timeout.
async fn stop_cleanly(dev: &mut Proc) -> Result<()> {
    dev.signal(Signal::SIGTERM)?;
    let status = tokio::time::timeout(T, dev.wait())
        .await
        .context("belay dev did not stop after SIGTERM")??;
    ensure!(
        status.success(),
        "belay dev exited with {status} after SIGTERM"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn onboarding_completes_on_belay_dev_and_the_data_survives_a_clean_stop() -> Result<()> {
    let mut env = dev_env().await?;
    let run_id = env
        .start_onboarding(0, "onboarding_express", "dev@example.com", "dev-1")
        .await?;
    env.wait_for(0, &run_id, "run_completed", T).await?;
    let events = assert_completed_once_without_repeats(&env, &run_id).await?;
    let tools: Vec<&str> = of_kind(&events, "tool_call_scheduled")
        .iter()
        .filter_map(|e| e["tool"].as_str())
        .collect();
    assert_eq!(
        tools,
        ["lookup_customer", "create_account", "send_welcome_email"]
    );
    assert_eq!(env.crm_requests("/accounts").await?.len(), 1);
    // The admin endpoint answers with the token given on the command line.
    let (status, body) = env
        .admin(0, reqwest::Method::GET, "/uncertain-outcomes", None)
        .await?;
    assert_eq!(status, 200, "{body}");

    // A clean stop exits 0 and releases the file; the next start sees the run.
    stop_cleanly(&mut env.engines[0]).await?;
    env.engines[0] = spawn_dev("dev-again", &db_file(&env.db)?, &worker_flags(&env)).await?;
    let run = env.client(0)?.get_run(&run_id).await?;
    assert_eq!(run.status, "completed");
    assert_eq!(env.events(&run_id).await?.len(), events.len());
    stop_cleanly(&mut env.engines[0]).await?;
    env.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn belay_dev_killed_while_a_create_is_held_resumes_on_the_same_file_without_repeats()
-> Result<()> {
    let mut env = dev_env().await?;
    // The CRM creates the account, then holds the answer: the effect happened
    // and the process that dispatched it never learns so.
    env.crm_fault("/accounts", "hold_after_effect", 1).await?;
    let run_id = env
        .start_onboarding(0, "onboarding_express", "held@example.com", "dev-2")
        .await?;
    env.crm_wait("/accounts", 1).await?;
    env.engines[0].kill().await?;

    env.engines[0] = spawn_dev("dev-restarted", &db_file(&env.db)?, &worker_flags(&env)).await?;
    env.wait_for(0, &run_id, "run_completed", T).await?;
    let events = assert_completed_once_without_repeats(&env, &run_id).await?;
    // The lost answer became an uncertain outcome that the reconcile probe
    // resolved by finding the account; nothing created it twice.
    let resolved = of_kind(&events, "uncertain_outcome_resolved");
    assert_eq!(resolved.len(), 1);
    assert_eq!(resolved[0]["via"], "probe");
    assert_eq!(env.crm_requests("/accounts").await?.len(), 1);
    let state = env.crm_state().await?;
    assert_eq!(state["accounts"].as_array().map(Vec::len), Some(1));
    let run = env.client(0)?.get_run(&run_id).await?;
    let output: Value = serde_json::from_str(&run.output_json)?;
    assert_eq!(output["account_id"], state["accounts"][0]["account_id"]);

    env.crm_release().await?;
    stop_cleanly(&mut env.engines[0]).await?;
    env.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn belay_dev_prints_its_addresses_database_and_a_generated_admin_token() -> Result<()> {
    let (mut child, lines) = spawn_dev_lines(&[
        "--in-memory",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ])
    .await?;
    let grpc = lines[0]
        .strip_prefix("listening on http://")
        .ok_or_else(|| anyhow!("first line {:?}", lines[0]))?;
    let admin = lines[1]
        .strip_prefix("admin listening on http://")
        .ok_or_else(|| anyhow!("second line {:?}", lines[1]))?;
    assert_eq!(
        lines[2],
        "database: sqlite::memory: (nothing is kept after exit)"
    );
    let token = lines[3]
        .strip_prefix("admin key: ")
        .and_then(|rest| rest.split_once(' '))
        .map(|(key, _)| key)
        .ok_or_else(|| anyhow!("fourth line {:?}", lines[3]))?;
    assert!(token.starts_with("belay_"), "{token}");
    assert!(lines[3].ends_with(&format!("(generated; export BELAY_API_KEY={token})")));

    // The gRPC API takes the printed key (and nothing without it), and so
    // does the admin endpoint.
    let anonymous = belay_sdk::Client::connect_lazy(&format!("http://{grpc}"), "acme")?;
    assert!(anonymous.list_runs("", 10, "").await.is_err());
    let client = belay_sdk::Client::connect(
        &belay_sdk::ConnectOptions {
            api_key: Some(token.to_owned()),
            ..belay_sdk::ConnectOptions::new(format!("http://{grpc}"))
        },
        "acme",
    )?;
    assert!(client.list_runs("", 10, "").await?.0.is_empty());
    let url = format!("http://{admin}/admin/v1/tenants/acme/uncertain-outcomes");
    let http = reqwest::Client::new();
    let ok = http.get(&url).bearer_auth(token).send().await?;
    assert_eq!(ok.status().as_u16(), 200);
    let wrong = http.get(&url).bearer_auth("not-the-token").send().await?;
    assert_eq!(wrong.status().as_u16(), 401);

    let pid = child.id().ok_or_else(|| anyhow!("belay dev exited"))?;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGTERM)?;
    let status = tokio::time::timeout(T, child.wait()).await??;
    assert!(status.success(), "{status}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_belay_dev_on_the_same_file_is_refused_naming_the_file() -> Result<()> {
    let db = TestDb::create_on(DbBackend::Sqlite).await?;
    let file = db_file(&db)?;
    let mut first = spawn_dev("dev-first", &file, &[]).await?;
    let path = file.display().to_string();
    let output = belay_output(&[
        "dev",
        "--db",
        &path,
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ])
    .await?;
    let error = refused(&output)?;
    assert!(error.contains("--db"), "{error}");
    assert!(error.contains(&path), "{error}");
    assert!(error.contains("in use"), "{error}");
    // The first one is unharmed.
    assert!(
        belay_sdk::Client::connect(
            &belay_sdk::ConnectOptions {
                api_key: Some(ADMIN_TOKEN.to_owned()),
                ..belay_sdk::ConnectOptions::new(&first.url)
            },
            "acme"
        )?
        .list_runs("", 10, "")
        .await
        .is_ok()
    );
    stop_cleanly(&mut first).await?;
    db.drop_db().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicting_or_unusable_database_flags_are_refused_in_one_line() -> Result<()> {
    let db = TestDb::create_on(DbBackend::Sqlite).await?;
    let file = db_file(&db)?;
    let dir = file
        .parent()
        .ok_or_else(|| anyhow!("{} has no parent", file.display()))?
        .to_owned();
    let path = file.display().to_string();
    let ports = ["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"];

    let mut args = vec!["dev", "--db", &path, "--in-memory"];
    args.extend(ports);
    let error = refused(&belay_output(&args).await?)?;
    assert!(error.contains("--db and --in-memory"), "{error}");
    assert!(!file.exists(), "a refused start creates nothing");

    // An allowlist entry of the worker that is not a CIDR block.
    let mut args = vec![
        "dev",
        "--db",
        &path,
        "--allow-private-network",
        "10.0.0.1/8",
    ];
    args.extend(ports);
    let error = refused(&belay_output(&args).await?)?;
    assert!(error.contains("--allow-private-network"), "{error}");
    assert!(error.contains("\"10.0.0.1/8\""), "{error}");
    assert!(!file.exists(), "a refused start creates nothing");

    // A path below a regular file can never be opened.
    std::fs::write(&file, b"not a directory")?;
    let below = file.join("dev.db").display().to_string();
    let mut args = vec!["dev", "--db", &below];
    args.extend(ports);
    let error = refused(&belay_output(&args).await?)?;
    assert!(error.contains("--db"), "{error}");
    assert!(error.contains(&below), "{error}");

    // A directory is not a database file.
    let dir_text = dir.display().to_string();
    let mut args = vec!["dev", "--db", &dir_text];
    args.extend(ports);
    let error = refused(&belay_output(&args).await?)?;
    assert!(error.contains("--db"), "{error}");
    assert!(error.contains("is a directory"), "{error}");

    db.drop_db().await
}
