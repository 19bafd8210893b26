//! The operator's CLI end to end (issue 22: these commands had no test):
//! `belay uncertain list/show/resolve` against a create lost for real (the
//! CRM double hangs after creating the account, the probe fails), and
//! `belay run pause/resume/cancel` on a run waiting for its documents, each
//! checked through what the engine then reports.

use std::process::Output;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use belay_tests::{ADMIN_TOKEN, DbBackend, EngineOpts, Env, bin};
use serde_json::Value;

const T: Duration = Duration::from_secs(60);

/// `belay ARGS` against engine 0 of `env`, as the admin, for its tenant.
fn belay(env: &Env, args: &[&str]) -> Result<Output> {
    Ok(std::process::Command::new(bin("belay")?)
        .env("BELAY_API_KEY", ADMIN_TOKEN)
        .env_remove("BELAY_ADMIN_TOKEN")
        .args(["--engine-url", &env.engines[0].url])
        .args([
            "--admin-url",
            env.engines[0].admin_url(),
            "--tenant",
            &env.tenant,
        ])
        .args(args)
        .output()?)
}

/// `belay --json ARGS`, which must succeed; its output as JSON.
fn belay_json(env: &Env, args: &[&str]) -> Result<Value> {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = belay(env, &all)?;
    ensure!(
        out.status.success(),
        "belay {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "belay {args:?} printed no JSON: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

async fn the_cli_lists_shows_and_resolves_an_uncertain_outcome(backend: DbBackend) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    let run_id = env
        .run_losing_the_create(
            "cli@example.com",
            "cli1",
            "hang_after_effect",
            Some("fail_400"),
        )
        .await?;
    env.wait_for(0, &run_id, "reconcile_probe_finished", T)
        .await?;

    let list = belay_json(&env, &["uncertain", "list", "--run", &run_id])?;
    let items = list["items"].as_array().cloned().unwrap_or_default();
    ensure!(items.len() == 1, "{list}");
    let id = items[0]["uncertain_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let shown = belay_json(&env, &["uncertain", "show", &id])?;
    ensure!(shown["tool"] == "create_account", "{shown}");
    ensure!(shown["arguments"]["email"] == "cli@example.com", "{shown}");
    ensure!(
        shown["idempotency_key"] == format!("{run_id}/intake.t2").as_str(),
        "{shown}"
    );
    // The table form names the record too.
    let table = belay(&env, &["uncertain", "list", "--run", &run_id])?;
    ensure!(
        String::from_utf8_lossy(&table.stdout).contains(&id),
        "{table:?}"
    );

    // A result of the wrong type is refused, naming it; then resolved.
    let bad = belay(
        &env,
        &[
            "uncertain",
            "resolve",
            &id,
            "--succeeded",
            r#"{"account_id": 7}"#,
            "--reason",
            "found",
        ],
    )?;
    ensure!(!bad.status.success(), "a mistyped result was accepted");
    ensure!(
        String::from_utf8_lossy(&bad.stderr).contains("account_id"),
        "{bad:?}"
    );
    let account_id = env.crm_state().await?["accounts"][0]["account_id"].clone();
    let result = serde_json::json!({"account_id": account_id}).to_string();
    let resolved = belay_json(
        &env,
        &[
            "uncertain",
            "resolve",
            &id,
            "--succeeded",
            &result,
            "--reason",
            "in the CRM",
            "--operator",
            "alice",
        ],
    )?;
    ensure!(resolved["status"] == "resolved", "{resolved}");
    ensure!(resolved["resolved_by"] == "ops/alice", "{resolved}");
    let again = belay(
        &env,
        &[
            "uncertain",
            "resolve",
            &id,
            "--failed",
            "no",
            "--reason",
            "twice",
        ],
    )?;
    ensure!(!again.status.success(), "resolved twice");
    env.wait_for(0, &run_id, "run_completed", T).await?;
    ensure!(
        env.crm_requests("/accounts").await?.len() == 1,
        "one create"
    );
    env.stop().await
}

async fn the_cli_pauses_resumes_and_cancels_a_run(backend: DbBackend) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    env.start_worker(0).await?;
    let run_id = env
        .start_onboarding(0, "onboarding", "pause@example.com", "cli2")
        .await?;
    env.wait_for(0, &run_id, "wait_started", T).await?;
    let status = |env: &Env| -> Result<String> {
        Ok(belay_json(env, &["run", "get", &run_id])?["status"]
            .as_str()
            .unwrap_or_default()
            .to_owned())
    };
    let paused = belay_json(
        &env,
        &[
            "run",
            "pause",
            &run_id,
            "--reason",
            "checking",
            "--operator",
            "bob",
        ],
    )?;
    ensure!(paused["status"] == "paused", "{paused}");
    ensure!(status(&env)? == "paused");
    // Pausing twice is refused, naming why.
    let twice = belay(&env, &["run", "pause", &run_id, "--reason", "again"])?;
    ensure!(!twice.status.success(), "paused twice");
    ensure!(
        String::from_utf8_lossy(&twice.stderr).contains("already paused"),
        "{twice:?}"
    );
    let resumed = belay_json(&env, &["run", "resume", &run_id, "--reason", "fine"])?;
    ensure!(resumed["status"] != "paused", "{resumed}");
    let cancelled = belay_json(
        &env,
        &["run", "cancel", &run_id, "--reason", "customer left"],
    )?;
    ensure!(cancelled["status"] == "cancelled", "{cancelled}");
    ensure!(status(&env)? == "cancelled");
    let late = belay(&env, &["run", "resume", &run_id, "--reason", "too late"])?;
    ensure!(!late.status.success(), "resumed a cancelled run");
    env.stop().await
}

belay_tests::on_both_backends!(
    the_cli_lists_shows_and_resolves_an_uncertain_outcome,
    the_cli_pauses_resumes_and_cancels_a_run,
);
