//! Code tools (`type: sandbox`) end to end: the real engine and worker
//! binaries, PostgreSQL (and SQLite), a scripted model, and real Node.js
//! and CPython run by the worker under bubblewrap
//! (`tests/sandbox-fixtures/`). The model calls the seed's JavaScript
//! `calculate_tax` and Python `analyze_text`, whose computed values are in
//! the run's events and its output; a Python tool that raises, and a
//! JavaScript tool whose result is not of its declared type, reach the
//! model as typed tool errors naming what happened, and the run goes on.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use belay_sdk::StartOptions;
use belay_tests::{DbBackend, EngineOpts, Env, Proc, bin, of_kind, repo_root};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(90);

/// The scripted model's turns: both seed tools in one turn, then the
/// division by zero, then an answer built from the two results.
const SCRIPT: &str = r#"
scripted-sandbox:
  - tool_calls:
      - name: calculate_tax
        arguments:
          income: "{{input.income}}"
          state: "{{input.state}}"
      - name: analyze_text
        arguments:
          text: "{{input.text}}"
  - tool_calls:
      - name: divide
        arguments: {a: 1, b: 0}
      - name: mistyped
        arguments: {x: 21}
  - content: '{"tax": {{result.calculate_tax.tax}}, "rate": {{result.calculate_tax.rate}}, "words": {{result.analyze_text.word_count}}}'
"#;

async fn an_agent_calls_javascript_and_python_code_tools_and_the_run_completes(
    backend: DbBackend,
) -> Result<()> {
    // Installs bubblewrap when it is missing, or fails here naming it
    // (not after the call bounces off a worker that cannot run it).
    belay_tests::ci_env(".ci/sandbox-tools.sh", "BELAY_BWRAP")?;
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    // This test's model script, in place of the example's.
    let dir = std::env::temp_dir().join("belay-test-logs");
    std::fs::create_dir_all(&dir)?;
    let script = dir.join(format!(
        "sandbox-script-{}.yaml",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(&script, SCRIPT)?;
    env.model = Proc::spawn(
        "model",
        &bin("scripted-model")?,
        &[
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--script".into(),
            script.display().to_string(),
        ],
        &[],
        true,
    )
    .await?;
    let client = env.client(0)?;
    client
        .register_paths(&[repo_root().join("tests/sandbox-fixtures")])
        .await?;
    client
        .set_tenant_grants(vec![
            "crm.read".into(),
            "crm.write".into(),
            "email.send".into(),
            "tax.compute".into(),
        ])
        .await?;
    env.start_worker(0).await?;

    let (run, _) = client
        .start_run(
            "sandbox_flow",
            &json!({"income": 1000, "state": "NY", "text": "One two three. Four five"}),
            StartOptions {
                idempotency_key: "sandbox-1".into(),
                caller: "test".into(),
                caller_grants: vec!["tax.compute".into()],
            },
        )
        .await?;
    env.wait_for(0, &run.run_id, "run_completed", T).await?;
    let done = client.get_run(&run.run_id).await?;
    ensure!(done.status == "completed", "{done:?}");
    let output: Value = serde_json::from_str(&done.output_json)?;
    ensure!(
        output.to_string().contains(r#""tax":109"#) && output.to_string().contains(r#""words":5"#),
        "{output}"
    );

    let events = env.events(&run.run_id).await?;
    let completed = of_kind(&events, "tool_call_completed");
    let result_of = |tool: &str| -> Result<Value> {
        let scheduled = of_kind(&events, "tool_call_scheduled");
        let call_id = scheduled
            .iter()
            .find(|e| e["tool"] == tool)
            .and_then(|e| e["call_id"].as_str())
            .with_context(|| format!("{tool} was not scheduled: {scheduled:?}"))?;
        completed
            .iter()
            .find(|e| e["call_id"] == call_id)
            .map(|e| e["result"].clone())
            .with_context(|| format!("{tool} did not complete: {completed:?}"))
    };
    ensure!(
        result_of("calculate_tax")? == json!({"tax": 109, "rate": 0.109}),
        "{completed:?}"
    );
    ensure!(
        result_of("analyze_text")? == json!({"word_count": 5, "sentences": 2}),
        "{completed:?}"
    );
    // Each ran once: a pure computation that succeeded is not repeated.
    let dispatched = of_kind(&events, "tool_call_dispatched");
    ensure!(dispatched.len() == 4, "{dispatched:?}");

    // The division by zero: a typed failure naming the exception, not
    // retried (the same code would raise again), told to the model.
    let failed = of_kind(&events, "tool_call_failed");
    ensure!(failed.len() == 2, "{failed:?}");
    let call_of = |tool: &str| -> Value {
        of_kind(&events, "tool_call_scheduled")
            .iter()
            .find(|e| e["tool"] == tool)
            .map(|e| e["call_id"].clone())
            .unwrap_or_default()
    };
    let error_of = |tool: &str| -> String {
        let call_id = call_of(tool);
        failed
            .iter()
            .find(|e| e["call_id"] == call_id)
            .and_then(|e| e["error"].as_str())
            .unwrap_or_default()
            .to_owned()
    };
    let error = error_of("divide");
    ensure!(
        error.starts_with(
            "tool `divide` failed: the code threw ZeroDivisionError: division by zero\nTraceback (most recent call last):\n  File \"tool.py\", line 2, in tool\n"
        ),
        "{error}"
    );
    let divide = call_of("divide");
    let attempts: Vec<&Value> = of_kind(&events, "tool_call_attempt_failed")
        .into_iter()
        .filter(|e| e["call_id"] == divide)
        .collect();
    ensure!(
        attempts.len() == 1
            && attempts[0]["class"] == "rejected"
            && attempts[0]["will_retry"] == false,
        "{attempts:?}"
    );
    // The mistyped result: the same return-type check as every tool's.
    let error = error_of("mistyped");
    ensure!(
        error.contains("its result does not match its declared return type")
            && error.contains(r#""doubled":"42""#),
        "{error}"
    );
    let requests: Vec<Value> = env
        .http
        .get(format!("{}/_requests", env.model.url))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let last = requests.last().context("no model request")?;
    let told = last["body"].to_string();
    ensure!(
        told.contains("ZeroDivisionError") && told.contains("declared return type"),
        "the model was not told: {last}"
    );
    env.stop().await
}

belay_tests::on_both_backends!(
    an_agent_calls_javascript_and_python_code_tools_and_the_run_completes
);
