//! The operator console in a real browser: Debian's Chromium driven by
//! playwright-core (`tests/console/console.cjs`, installed by
//! `.ci/console.sh`), against a real engine on PostgreSQL, a worker, the
//! scripted model and the example's CRM double. A reconcile call made
//! uncertain through the CRM's controls is found in the queue and resolved
//! from the page, and its run completes; documents are signalled and an
//! approval decided (with an edit) from the pages, and that run completes
//! with the approved plan; a viewer of the tenant cannot resolve; a viewer
//! of another tenant sees none of it; forms without the CSRF token are
//! refused; axe-core finds no serious or critical violation on any page;
//! and each page is saved as a 1280×800 screenshot in the folder the test
//! prints (`<target>/console-screenshots/`).

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use belay_tests::{ADMIN_TOKEN, EngineOpts, Env, bin, ci_env, of_kind, repo_root};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(60);

/// A key of `role` for `tenant` with `grants`, made as the admin.
async fn key(
    env: &Env,
    principal: &str,
    role: &str,
    tenant: &str,
    grants: &[&str],
) -> Result<String> {
    let response = env
        .http
        .post(format!("{}/admin/v1/keys", env.engines[0].admin_url()))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"principal": principal, "role": role, "tenants": [tenant], "grants": grants}))
        .send()
        .await?;
    let body: Value = response.json().await?;
    body["key"]
        .as_str()
        .map(str::to_owned)
        .with_context(|| format!("creating the key of {principal}: {body}"))
}

/// Where the screenshots go: `<target>/console-screenshots`, beside the
/// binaries the test runs.
fn screenshot_dir() -> Result<std::path::PathBuf> {
    let engine = bin("belay-engine")?;
    let target = engine
        .parent()
        .and_then(std::path::Path::parent)
        .context("the target dir of the binaries")?;
    Ok(target.join("console-screenshots"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_resolve_and_approve_in_a_real_browser_and_strangers_see_nothing() -> Result<()> {
    let started = Instant::now();
    // Prerequisites first: a missing browser or package fails at once.
    let modules = ci_env(".ci/console.sh", "BELAY_CONSOLE_NODE_MODULES")
        .context("the console's browser test needs `.ci/console.sh` (chromium, node, npm)")?;
    let chromium = ci_env(".ci/console.sh", "BELAY_CHROMIUM")?;
    ensure!(
        std::path::Path::new(&chromium).exists(),
        "{chromium} does not exist: run .ci/console.sh"
    );
    let shots = screenshot_dir()?;
    let _ = std::fs::remove_dir_all(&shots);
    std::fs::create_dir_all(&shots)?;

    let mut env = Env::start(EngineOpts::default()).await?;
    // The create reaches the CRM, its answer never comes back, the worker
    // dies, and the probe fails: only an operator can tell.
    let lost = env
        .run_losing_the_create(
            "ui@example.com",
            "ui-1",
            "hang_after_effect",
            Some("fail_400"),
        )
        .await?;
    env.wait_for(0, &lost, "reconcile_probe_finished", T)
        .await?;
    let account = env.crm_state().await?["accounts"][0]["account_id"].clone();
    let account = account.as_str().context("the CRM's account")?.to_owned();
    let uncertain = env.uncertain_rows(&lost).await?;
    let uncertain_id = uncertain[0]["uncertain_id"]
        .as_str()
        .context("record")?
        .to_owned();
    // The long onboarding, waiting for documents.
    let waiting = env
        .start_onboarding(0, "onboarding", "docs@example.com", "ui-2")
        .await?;
    env.wait_for(0, &waiting, "wait_started", T).await?;

    let keys = [
        (
            "BELAY_KEY_OPERATOR",
            key(&env, "operator", "operator", "acme", &[]).await?,
        ),
        (
            "BELAY_KEY_APPROVER",
            key(
                &env,
                "approver",
                "approver",
                "acme",
                &["onboarding.approve"],
            )
            .await?,
        ),
        (
            "BELAY_KEY_VIEWER",
            key(&env, "viewer", "client", "acme", &[]).await?,
        ),
        (
            "BELAY_KEY_STRANGER",
            key(&env, "stranger", "client", "globex", &[]).await?,
        ),
    ];
    let prepared = started.elapsed();
    let script = repo_root().join("tests/console/console.cjs");
    let output = tokio::process::Command::new("node")
        .arg(&script)
        .envs(keys.iter().map(|(k, v)| (*k, v.as_str())))
        .env("BELAY_CONSOLE_NODE_MODULES", &modules)
        .env("BELAY_CHROMIUM", &chromium)
        .env("BELAY_CONSOLE_URL", env.engines[0].admin_url())
        .env("BELAY_SCREENSHOTS", &shots)
        .env("BELAY_RUN_LOST", &lost)
        .env("BELAY_RUN_WAITING", &waiting)
        .env("BELAY_UNCERTAIN_ID", &uncertain_id)
        .env("BELAY_ACCOUNT_ID", &account)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(120), output)
        .await
        .context("the browser script ran over 120 s")??;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    println!("console screenshots: {}", shots.display());
    if !output.status.success() {
        bail!(
            "the browser script failed ({}):\n{stdout}\n{stderr}",
            output.status
        );
    }
    let browser = started.elapsed() - prepared;

    // What the pages did, from the runs' histories.
    env.wait_for(0, &lost, "run_completed", T).await?;
    let events = env.events(&lost).await?;
    let resolved = of_kind(&events, "uncertain_outcome_resolved");
    assert_eq!(resolved.len(), 1);
    assert_eq!(resolved[0]["resolved_by"], "operator");
    assert_eq!(resolved[0]["via"], "operator");
    assert_eq!(resolved[0]["result"]["account_id"], account.as_str());
    let run = env.client(0)?.get_run(&lost).await?;
    let output: Value = serde_json::from_str(&run.output_json)?;
    assert_eq!(
        output["account_id"],
        account.as_str(),
        "the run used the operator's result"
    );
    assert_eq!(
        env.crm_requests("/accounts").await?.len(),
        2,
        "one create per run: nothing repeated"
    );

    env.wait_for(0, &waiting, "run_completed", T).await?;
    let events = env.events(&waiting).await?;
    let signal = of_kind(&events, "signal_received");
    assert_eq!(
        (signal.len(), &signal[0]["sent_by"]),
        (1, &json!("operator"))
    );
    let decided = of_kind(&events, "approval_decided");
    assert_eq!(decided.len(), 1);
    assert_eq!(
        (
            &decided[0]["by"],
            &decided[0]["approved"],
            &decided[0]["edited"]
        ),
        (&json!("approver"), &json!(true), &json!(true))
    );
    assert!(
        of_kind(&events, "run_paused").is_empty(),
        "the refused forms paused nothing"
    );
    let welcome = env.crm_requests("/emails/welcome").await?;
    let plans: Vec<&Value> = welcome.iter().map(|w| &w["body"]["plan"]).collect();
    assert!(
        plans.contains(&&json!("enterprise")),
        "the welcome email has the approved plan: {plans:?}"
    );

    for name in [
        "login",
        "runs",
        "run",
        "run-completed",
        "uncertain",
        "approvals",
        "definitions",
    ] {
        let file = shots.join(format!("{name}.png"));
        let size = std::fs::metadata(&file)
            .with_context(|| format!("{}", file.display()))?
            .len();
        assert!(size > 10_000, "{} is {size} bytes", file.display());
    }
    eprintln!(
        "console test: setup {:.1} s, browser {:.1} s, total {:.1} s",
        prepared.as_secs_f64(),
        browser.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    env.stop().await
}
