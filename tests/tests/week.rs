//! A simulated week of onboarding: the `onboarding` workflow (intake agent,
//! a wait for documents with a 3-day reminder, KYC, an approval, the welcome
//! email) through days of the engine's clock in seconds of real time, with
//! engines killed (SIGKILL) and started again in between; and the `belay run
//! signal / approve / decline` commands on the same workflow.
//!
//! Time moves only through `belay_clock` ([`belay_tests::TestDb::advance_clock`]),
//! never by sleeping: each step waits for the event it expects.

use std::process::Output;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use belay_sdk::{Client, SdkError};
use belay_tests::{DbBackend, EngineOpts, Env, dispatch_counts, of_kind};
use serde_json::{Value, json};
use sqlx::types::chrono::{DateTime, FixedOffset};

const T: Duration = Duration::from_secs(60);
const MINUTE_MS: i64 = 60_000;
const DAY_MS: i64 = 24 * 60 * MINUTE_MS;

/// The gRPC code and message of a refused call.
fn refusal<T: std::fmt::Debug>(result: Result<T, SdkError>) -> Result<(tonic::Code, String)> {
    match result {
        Err(SdkError::Status(status)) => Ok((status.code(), status.message().to_owned())),
        other => Err(anyhow!("expected a refusal, got {other:?}")),
    }
}

/// The account the intake agent created (the CRM's only one).
async fn account_id(env: &Env) -> Result<String> {
    let state = env.crm_state().await?;
    let accounts = state["accounts"].as_array().cloned().unwrap_or_default();
    ensure!(accounts.len() == 1, "accounts: {accounts:?}");
    accounts[0]["account_id"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| anyhow!("no account_id in {state}"))
}

/// Status and status reason of a run.
async fn status(client: &Client, run_id: &str) -> Result<(String, String)> {
    let run = client.get_run(run_id).await?;
    Ok((run.status, run.status_reason))
}

/// The documents arrive: the portal sends the signal, then (a retry) the
/// same signal id again, which is applied once.
async fn send_documents(client: &Client, run_id: &str, signal_id: &str) -> Result<()> {
    let documents = json!({"files": ["passport.pdf", "utility_bill.pdf"]});
    let (_, duplicate) = client
        .signal(
            run_id,
            "documents_received",
            signal_id,
            &documents,
            "portal",
        )
        .await?;
    ensure!(!duplicate, "the first delivery is not a duplicate");
    let (_, duplicate) = client
        .signal(
            run_id,
            "documents_received",
            signal_id,
            &documents,
            "portal",
        )
        .await?;
    ensure!(duplicate, "the same signal id again is a duplicate");
    Ok(())
}

/// Every run of the tenant has a gapless history (checked by
/// [`Env::events`]), and no tool call of any run was dispatched twice.
async fn assert_every_run_gapless_and_dispatched_once(env: &Env) -> Result<()> {
    let (runs, _) = env.client(0)?.list_runs("", 500, "").await?;
    ensure!(!runs.is_empty(), "no runs");
    for run in runs {
        let events = env.events(&run.run_id).await?;
        let counts = dispatch_counts(&events);
        ensure!(
            counts.values().all(|&n| n == 1),
            "run {}: {counts:?}",
            run.run_id
        );
    }
    Ok(())
}

/// When the event of `kind` was recorded, by the engine's clock.
fn recorded_at(events: &[belay_sdk::RunEvent], kind: &str) -> Result<DateTime<FixedOffset>> {
    let event = events
        .iter()
        .find(|e| e.kind == kind)
        .ok_or_else(|| anyhow!("no `{kind}` event"))?;
    DateTime::parse_from_rfc3339(&event.recorded_at)
        .with_context(|| format!("recorded_at {:?} of `{kind}`", event.recorded_at))
}

async fn onboarding_runs_through_a_simulated_week_with_engine_restarts(
    backend: DbBackend,
) -> Result<()> {
    let real = Instant::now();
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    env.start_worker(0).await?;
    let client = env.client(0)?;

    // Day 0: the intake agent creates the account; the run waits for documents.
    let run_id = env
        .start_onboarding(0, "onboarding", "week@example.com", "week-1")
        .await?;
    env.wait_for(0, &run_id, "wait_started", T).await?;
    let (state, reason) = status(&client, &run_id).await?;
    assert_eq!(state, "waiting");
    assert!(reason.contains("documents_received"), "{reason}");
    let account = account_id(&env).await?;
    assert!(env.crm_requests("/emails/reminder").await?.is_empty());

    // Day 3: no documents. The reminder goes out once; the run waits again.
    env.db.advance_clock(3 * DAY_MS + MINUTE_MS).await?;
    env.wait_for_nth(0, &run_id, "wait_started", 2, T).await?;
    let reminders = env.crm_requests("/emails/reminder").await?;
    assert_eq!(reminders.len(), 1, "{reminders:?}");
    assert_eq!(reminders[0]["body"]["account_id"], account.as_str());
    assert_eq!(reminders[0]["body"]["reminder"], 1);
    assert_eq!(status(&client, &run_id).await?.0, "waiting");

    // Day 3, later: a payload the wait refuses changes nothing; then the
    // documents arrive, twice with one signal id.
    let (code, message) = refusal(
        client
            .signal(
                &run_id,
                "documents_received",
                "docs-bad",
                &json!({"files": "passport.pdf"}),
                "portal",
            )
            .await,
    )?;
    assert_eq!(code, tonic::Code::InvalidArgument, "{message}");
    assert!(message.contains("payload_schema"), "{message}");
    send_documents(&client, &run_id, "docs-week-1").await?;

    // KYC runs; the run waits for an approver.
    env.wait_for(0, &run_id, "approval_requested", T).await?;
    assert_eq!(env.crm_requests("/kyc/checks").await?.len(), 1);
    let (state, reason) = status(&client, &run_id).await?;
    assert_eq!(state, "waiting");
    assert!(reason.contains("onboarding.approve"), "{reason}");

    // The engine dies and comes back while the run waits.
    env.restart_engine(0).await?;
    let client = env.client(0)?;

    // Day 4: an approver without the grant is refused; one with it
    // approves, changing the plan; a second decision is refused. The CRM
    // holds the welcome email's answer until then, so the second decision
    // meets a run that is still going (once the run has ended, the engine
    // answers FAILED_PRECONDITION "run is completed" instead of ABORTED).
    env.db.advance_clock(DAY_MS).await?;
    env.crm_fault("/emails/welcome", "hold_after_effect", 1)
        .await?;
    let (code, message) = refusal(
        client
            .decide_approval(
                &run_id,
                "approve",
                true,
                None,
                "mallory",
                vec!["crm.write".into()],
                "looks fine",
            )
            .await,
    )?;
    assert_eq!(code, tonic::Code::PermissionDenied, "{message}");
    assert!(message.contains("onboarding.approve"), "{message}");
    let edit = json!({"account_id": account, "plan": "enterprise"});
    client
        .decide_approval(
            &run_id,
            "approve",
            true,
            Some(&edit),
            "grace",
            vec!["onboarding.approve".into()],
            "documents fine; enterprise as agreed",
        )
        .await?;
    let (code, message) = refusal(
        client
            .decide_approval(
                &run_id,
                "approve",
                false,
                None,
                "bob",
                vec!["onboarding.approve".into()],
                "changed my mind",
            )
            .await,
    )?;
    assert_eq!(code, tonic::Code::Aborted, "{message}");
    assert!(message.contains("grace"), "{message}");
    env.crm_wait("/emails/welcome", 1).await?;
    env.crm_release().await?;

    // The welcome email carries the approved (edited) plan; the run completes.
    env.wait_for(0, &run_id, "run_completed", T).await?;
    let welcome = env.crm_requests("/emails/welcome").await?;
    assert_eq!(welcome.len(), 1, "{welcome:?}");
    assert_eq!(welcome[0]["body"]["plan"], "enterprise");
    assert_eq!(welcome[0]["body"]["account_id"], account.as_str());
    let run = client.get_run(&run_id).await?;
    assert_eq!(run.status, "completed");
    let output: Value = serde_json::from_str(&run.output_json)?;
    assert_eq!(output["account_id"], account.as_str());
    assert_eq!(output["plan"], "enterprise");
    assert_eq!(output["kyc_status"], "clear");

    // The history: gapless, each call dispatched once, one signal, one
    // reminder timer, one decision, and the approval stamped on day 4.
    let events = env.events(&run_id).await?;
    let counts = dispatch_counts(&events);
    assert_eq!(
        counts.keys().map(String::as_str).collect::<Vec<_>>(),
        [
            "intake.t1",
            "intake.t2",
            "kyc.t1",
            "remind.t1",
            "welcome.t1"
        ]
    );
    assert!(counts.values().all(|&n| n == 1), "{counts:?}");
    assert_eq!(of_kind(&events, "signal_received").len(), 1);
    let fired = of_kind(&events, "timer_fired");
    assert_eq!(fired.len(), 1, "{fired:?}");
    assert_eq!(fired[0]["timer_id"], "documents.w2");
    let decided = of_kind(&events, "approval_decided");
    assert_eq!(decided.len(), 1);
    assert_eq!(decided[0]["by"], "ops/grace");
    assert_eq!(decided[0]["edited"], true);
    let raw = client.events(&run_id, 0).await?;
    let days = (recorded_at(&raw, "approval_decided")? - recorded_at(&raw, "run_started")?)
        .num_milliseconds();
    assert!(
        days >= 4 * DAY_MS,
        "approval recorded {days} ms after the start, less than 4 days"
    );
    assert_every_run_gapless_and_dispatched_once(&env).await?;
    eprintln!(
        "{backend:?}: a simulated week of onboarding in {:?} of real time",
        real.elapsed()
    );
    env.stop().await
}

async fn a_reminder_due_while_the_engine_is_down_goes_out_once_after_restart(
    backend: DbBackend,
) -> Result<()> {
    let real = Instant::now();
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    env.start_worker(0).await?;
    let run_id = env
        .start_onboarding(0, "onboarding", "down@example.com", "down-1")
        .await?;
    env.wait_for(0, &run_id, "wait_started", T).await?;

    // The engine is down while the reminder falls due.
    env.kill_engine(0).await?;
    env.db.advance_clock(3 * DAY_MS + MINUTE_MS).await?;
    env.start_engine_again(0).await?;
    env.wait_for_nth(0, &run_id, "wait_started", 2, T).await?;
    assert_eq!(env.crm_requests("/emails/reminder").await?.len(), 1);

    // Another restart changes nothing: the fired timer is gone.
    env.restart_engine(0).await?;
    let client = env.client(0)?;
    send_documents(&client, &run_id, "docs-down-1").await?;
    env.wait_for(0, &run_id, "approval_requested", T).await?;
    client
        .decide_approval(
            &run_id,
            "approve",
            true,
            None,
            "grace",
            vec!["onboarding.approve".into()],
            "ok",
        )
        .await?;
    env.wait_for(0, &run_id, "run_completed", T).await?;
    let reminders = env.crm_requests("/emails/reminder").await?;
    assert_eq!(reminders.len(), 1, "{reminders:?}");
    let events = env.events(&run_id).await?;
    assert_eq!(of_kind(&events, "timer_fired").len(), 1);
    assert_eq!(dispatch_counts(&events).get("remind.t1"), Some(&1));
    assert_eq!(
        env.crm_requests("/emails/welcome").await?[0]["body"]["plan"],
        "pro"
    );
    assert_every_run_gapless_and_dispatched_once(&env).await?;
    eprintln!(
        "{backend:?}: reminder across an engine outage in {:?} of real time",
        real.elapsed()
    );
    env.stop().await
}

async fn the_cli_signals_approves_and_declines(backend: DbBackend) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    env.start_worker(0).await?;
    let belay = belay_tests::bin("belay")?;
    let cli = |args: &[&str]| -> Result<Output> {
        let mut cmd = std::process::Command::new(&belay);
        cmd.env("BELAY_API_KEY", belay_tests::ADMIN_TOKEN);
        cmd.args(["--engine-url", &env.engines[0].url, "--tenant", "acme"])
            .args(args)
            .env("BELAY_OPERATOR", "olivia");
        Ok(cmd.output()?)
    };
    let refused = |output: &Output| -> String {
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(!output.status.success(), "exited 0: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        stderr
    };

    // Declined: the run fails at the `declined` node.
    let declined = env
        .start_onboarding(0, "onboarding", "cli-no@example.com", "cli-no")
        .await?;
    env.wait_for(0, &declined, "wait_started", T).await?;
    let stderr = refused(&cli(&[
        "run",
        "signal",
        &declined,
        "documents_received",
        "--payload",
        "{files: [",
    ])?);
    assert!(stderr.contains("--payload"), "{stderr}");
    let out = cli(&[
        "run",
        "signal",
        &declined,
        "documents_received",
        "--payload",
        r#"{"files": ["id.pdf"]}"#,
    ])?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    // The generated signal id is printed, so a retry can reuse it.
    let signal_id = stdout
        .lines()
        .find_map(|l| l.strip_prefix("signal documents_received delivered (signal id "))
        .and_then(|rest| rest.strip_suffix(')'))
        .ok_or_else(|| anyhow!("no signal id in {stdout}"))?;
    assert!(uuid::Uuid::parse_str(signal_id).is_ok(), "{signal_id}");
    let out = cli(&[
        "--json",
        "run",
        "signal",
        &declined,
        "documents_received",
        "--payload",
        r#"{"files": ["id.pdf"]}"#,
        "--signal-id",
        signal_id,
        "--from",
        "portal",
    ])?;
    let again: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(again["duplicate"], true, "{again}");
    assert_eq!(again["signal_id"], signal_id);
    assert_eq!(again["run"]["run_id"], declined.as_str());
    env.wait_for(0, &declined, "approval_requested", T).await?;
    let stderr = refused(&cli(&["run", "decline", &declined, "approve"])?);
    assert!(stderr.contains("onboarding.approve"), "{stderr}");
    let out = cli(&[
        "--json",
        "run",
        "decline",
        &declined,
        "approve",
        "--grant",
        "onboarding.approve",
        "--reason",
        "duplicate customer",
    ])?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(run["status"], "failed", "{run}");
    assert!(
        run["status_reason"]
            .as_str()
            .is_some_and(|r| r.contains("declined by ops/olivia: duplicate customer")),
        "{run}"
    );

    // Approved with an edit: the welcome email names the edited plan.
    let approved = env
        .start_onboarding(0, "onboarding", "cli-yes@example.com", "cli-yes")
        .await?;
    env.wait_for(0, &approved, "wait_started", T).await?;
    let out = cli(&[
        "run",
        "signal",
        &approved,
        "documents_received",
        "--payload",
        r#"{"files": ["id.pdf"]}"#,
    ])?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    env.wait_for(0, &approved, "approval_requested", T).await?;
    let stderr = refused(&cli(&[
        "run",
        "approve",
        &approved,
        "approve",
        "--grant",
        "onboarding.approve",
        "--edit",
        "plan=starter",
    ])?);
    assert!(stderr.contains("--edit"), "{stderr}");
    let events = env.events(&approved).await?;
    let subject = of_kind(&events, "approval_requested")[0]["subject"].clone();
    let mut edit = subject.clone();
    edit["plan"] = json!("starter");
    let out = cli(&[
        "run",
        "approve",
        &approved,
        "approve",
        "--grant",
        "onboarding.approve",
        "--approver",
        "grace",
        "--edit",
        &edit.to_string(),
        "--reason",
        "starter first",
    ])?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("approved node approve with an edit"),
        "{stdout}"
    );
    env.wait_for(0, &approved, "run_completed", T).await?;
    let welcome = env.crm_requests("/emails/welcome").await?;
    assert_eq!(welcome.len(), 1);
    assert_eq!(welcome[0]["body"]["plan"], "starter");
    let decided = of_kind(&env.events(&approved).await?, "approval_decided")[0].clone();
    assert_eq!(decided["by"], "ops/grace");
    assert_eq!(decided["subject"], edit);
    env.stop().await
}

belay_tests::on_both_backends!(
    onboarding_runs_through_a_simulated_week_with_engine_restarts,
    a_reminder_due_while_the_engine_is_down_goes_out_once_after_restart,
    the_cli_signals_approves_and_declines,
);
