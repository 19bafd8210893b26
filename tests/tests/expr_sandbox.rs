//! The expression sandbox end to end, on both backends: the real
//! `belay-engine` binary evaluates workflow expressions in evaluator
//! processes with hard limits. Expressions that pass the registration
//! guard but would exhaust memory or run for years (each behind a `set`
//! node) fail their run with an error naming time or memory, while the
//! engine keeps serving; one behind a timer that comes due while the
//! engine is down fails its run once at the next start instead of taking
//! the engine down on every start. Deterministic: the tests wait on run
//! events (and the answer to `StartRun`), never on sleeps.
//!
//! `sandboxed_evaluation_cost` prints what an evaluation costs in process
//! and in the sandbox (run it with `--no-capture` to see the figures).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use belay_engine::definitions::expr::{Expr, Template};
use belay_sdk::{Client, StartOptions};
use belay_tests::{DbBackend, EngineOpts, Env};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(60);

/// Expressions the guard lets through whose evaluation would take the
/// engine down: (workflow name, expression).
fn hostile() -> Vec<(&'static str, String)> {
    vec![
        // 2^(2^40): squares until an allocation fails.
        ("squares", "reduce range(40) as $i (2; . * .)".into()),
        // A string doubled 60 times.
        ("doubles", r#"reduce range(60) as $i ("x"; . + .)"#.into()),
        // 2 * 10^9 bytes at once.
        (
            "allocates",
            r#""xx" | . * 1000 | . * 1000 | . * 1000"#.into(),
        ),
        // 10^12 bytes of "x".
        (
            "repeats",
            r#""x" | . * 1000 | . * 1000 | . * 1000 | . * 1000"#.into(),
        ),
        // 10^10 elements.
        (
            "pairs",
            "[range(100000)] as $a | [$a[] | $a[]] | length".into(),
        ),
        // 2^34 steps of nothing.
        (
            "nests",
            format!(
                "def f(g): g | g; {}.{}",
                "f(".repeat(34),
                ")".repeat(34)
            ),
        ),
        // 10^9 additions.
        (
            "loops",
            "[range(1000)] as $a | reduce $a[] as $i (0; reduce $a[] as $j (.; reduce $a[] as $k (.; . + 1)))".into(),
        ),
    ]
}

/// One workflow per hostile expression (`hostile_<name>`: a `set` node),
/// `calm` (adds 1 to its input), and `hostile_later` (a wait of an hour,
/// then a hostile `set`).
fn bundle() -> String {
    let mut yaml = String::new();
    for (name, expr) in hostile() {
        yaml.push_str(&format!(
            "kind: workflow\nname: hostile_{name}\nnodes:\n  - id: boom\n    type: set\n    values:\n      x: '${{ {expr} }}'\n    next: done\n  - {{id: done, type: succeed}}\n---\n"
        ));
    }
    yaml.push_str(
        r#"kind: workflow
name: calm
nodes:
  - id: add
    type: set
    values: {n: '${ .input.n + 1 }'}
    next: done
  - {id: done, type: succeed, output: '${ .vars.n }'}
---
kind: workflow
name: hostile_later
nodes:
  - id: pause
    type: wait
    for:
      - duration: 1h
        next: boom
  - id: boom
    type: set
    values: {x: '${ reduce range(60) as $i ("x"; . + .) }'}
"#,
    );
    yaml
}

async fn register(env: &Env) -> Result<()> {
    env.client(0)?
        .register_files(vec![belay_proto::v1::DefinitionFile {
            path: "sandbox.yaml".into(),
            content: bundle(),
        }])
        .await
        .context("registering the sandbox workflows")?;
    Ok(())
}

async fn start(client: &Client, workflow: &str, input: Value, key: &str) -> Result<String> {
    let (run, _) = client
        .start_run(
            workflow,
            &input,
            StartOptions {
                idempotency_key: key.into(),
                caller: "test".into(),
                caller_grants: vec![],
            },
        )
        .await
        .with_context(|| format!("starting {workflow}"))?;
    Ok(run.run_id)
}

/// A `calm` run completes with its input plus one: the engine evaluates
/// and answers.
async fn calm_run_completes(env: &Env, key: &str, n: i64) -> Result<()> {
    let client = env.client(0)?;
    let run_id = start(&client, "calm", json!({"n": n}), key).await?;
    env.wait_for(0, &run_id, "run_completed", T).await?;
    let run = client.get_run(&run_id).await?;
    ensure!(run.status == "completed", "{run:?}");
    let output: Value = serde_json::from_str(&run.output_json)?;
    ensure!(output == json!(n + 1), "{output}");
    Ok(())
}

/// The run failed at node `boom` with an error that names time or memory.
async fn failed_for_time_or_memory(env: &Env, run_id: &str) -> Result<String> {
    env.wait_for(0, run_id, "run_failed", T).await?;
    let run = env.client(0)?.get_run(run_id).await?;
    ensure!(run.status == "failed", "{run:?}");
    let why = run.status_reason;
    ensure!(why.contains("node `boom`"), "{why}");
    ensure!(
        why.contains("did not finish within 1000 ms") || why.contains("MiB of memory"),
        "{why}"
    );
    Ok(why)
}

async fn hostile_expressions_fail_their_runs_and_the_engine_keeps_serving(
    backend: DbBackend,
) -> Result<()> {
    let env = Env::start_on(backend, EngineOpts::default()).await?;
    register(&env).await?;
    let client = env.client(0)?;
    // All at once, with calm runs among them: more hostile evaluations
    // than evaluators, and the calm ones still get theirs.
    let mut starts = tokio::task::JoinSet::new();
    for (name, _) in hostile() {
        let client = client.clone();
        starts.spawn(async move {
            let workflow = format!("hostile_{name}");
            start(&client, &workflow, json!({}), &workflow).await
        });
    }
    let mut hostile_runs = Vec::new();
    for i in 0..3 {
        calm_run_completes(&env, &format!("calm-{i}"), i).await?;
    }
    while let Some(started) = starts.join_next().await {
        hostile_runs.push(started??);
    }
    ensure!(hostile_runs.len() == hostile().len());
    for run_id in &hostile_runs {
        let why = failed_for_time_or_memory(&env, run_id).await?;
        let workflow = client.get_run(run_id).await?.workflow;
        println!("{workflow}: {why}");
    }
    // Still the same engine, still answering.
    calm_run_completes(&env, "calm-after", 41).await?;
    env.stop().await
}

async fn a_hostile_expression_behind_a_timer_fails_its_run_once_instead_of_crash_looping(
    backend: DbBackend,
) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    register(&env).await?;
    let client = env.client(0)?;
    let run_id = start(&client, "hostile_later", json!({}), "later").await?;
    env.wait_for(0, &run_id, "wait_started", T).await?;
    // The timer comes due while no engine runs: the next engine fires it
    // as it starts (before the sandbox, it died there, on every start).
    env.kill_engine(0).await?;
    env.db.advance_clock(2 * 3_600_000).await?;
    env.start_engine_again(0).await?;
    failed_for_time_or_memory(&env, &run_id).await?;
    calm_run_completes(&env, "calm-1", 1).await?;
    // And the next start finds nothing left to fire.
    env.restart_engine(0).await?;
    calm_run_completes(&env, "calm-2", 2).await?;
    let run = env.client(0)?.get_run(&run_id).await?;
    ensure!(run.status == "failed", "{run:?}");
    let failures = env
        .events(&run_id)
        .await?
        .iter()
        .filter(|e| e["type"] == "run_failed")
        .count();
    ensure!(failures == 1, "{failures} run_failed events");
    env.stop().await
}

belay_tests::on_both_backends!(
    hostile_expressions_fail_their_runs_and_the_engine_keeps_serving,
    a_hostile_expression_behind_a_timer_fails_its_run_once_instead_of_crash_looping,
);

/// Mean time per call of `f` over `n` calls, in microseconds.
fn per_call(n: u32, mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..n {
        f();
    }
    start.elapsed().as_secs_f64() * 1e6 / f64::from(n)
}

/// What an evaluation costs in process and in the sandbox (one evaluator
/// process of the real `belay-engine` binary): an expression, a template
/// of three, over a small and a 100 KB state document; and the same
/// written in the part of jq the engine evaluates directly (no sandbox:
/// `expr/direct.rs`). Prints the figures; asserts only that all give the
/// same values.
#[test]
fn sandboxed_evaluation_cost() -> Result<()> {
    let small = json!({"input": {"email": "ada@example.com", "n": 3}, "nodes": {}, "vars": {}});
    let rows: Vec<Value> = (0..1000)
        .map(|i| json!({"id": i, "name": format!("customer {i}"), "tags": ["a", "b", "c"]}))
        .collect();
    let large = json!({"input": {"email": "ada@example.com", "n": 3}, "nodes": {"list": {"output": rows}}, "vars": {}});
    ensure!(serde_json::to_vec(&large)?.len() > 50_000);
    let template = |to: &str, subject: &str, count: &str| {
        Template::parse(&json!({"to": to, "subject": subject, "count": count}))
            .map_err(|e| anyhow::anyhow!("{e:?}"))
    };
    // Calls (`tostring`, `add`, `ascii_downcase`) are jaq's alone.
    let jaq = (
        Expr::parse(".input.n | tostring")?,
        template(
            "${ .input.email | ascii_downcase }",
            "Hello ${ .input.n | tostring }",
            "${ [.input.n, .input.n] | add }",
        )?,
        json!("3"),
    );
    let direct = (
        Expr::parse(".input.n + 1")?,
        template(
            "${ .input.email }",
            "Hello ${ .input.n }",
            "${ .input.n * 2 }",
        )?,
        json!(4),
    );
    let measure = |label: &str,
                   (expr, template, value): &(Expr, Template, Value)|
     -> Result<Vec<(String, f64)>> {
        let mut figures = Vec::new();
        for (state_name, state, n) in [("small", &small, 2000), ("100 KB", &large, 300)] {
            ensure!(expr.eval(state)? == *value);
            let expected = json!({"to": "ada@example.com", "subject": "Hello 3", "count": 6});
            ensure!(template.render(state).map_err(|e| anyhow::anyhow!("{e}"))? == expected);
            figures.push((
                format!("{label}: expression, {state_name} state"),
                per_call(n, || {
                    let _ = expr.eval(state);
                }),
            ));
            figures.push((
                format!("{label}: template of 3, {state_name} state"),
                per_call(n, || {
                    let _ = template.render(state);
                }),
            ));
        }
        Ok(figures)
    };
    // (nextest runs each test in a process of its own; under `cargo
    // test` another test may have enabled the sandbox already.)
    let in_process = if belay_engine::expr_sandbox::sandbox_enabled() {
        println!("the sandbox was enabled by another test: no in-process figures");
        Vec::new()
    } else {
        measure("in process", &jaq)?
    };
    belay_engine::expr_sandbox::enable_sandbox_with(belay_tests::bin("belay-engine")?);
    ensure!(belay_engine::expr_sandbox::sandbox_enabled());
    // The first evaluation starts the evaluator.
    let started = Instant::now();
    ensure!(jaq.0.eval(&small)? == json!("3"));
    let first_ms = started.elapsed().as_secs_f64() * 1e3;
    let sandboxed = measure("sandboxed", &jaq)?;
    let directly = measure("direct (sandbox on)", &direct)?;
    println!("expression evaluation cost (mean per call):");
    for (label, us) in in_process.iter().chain(&sandboxed).chain(&directly) {
        println!("  {label:<45} {us:>9.1} µs");
    }
    println!("  first sandboxed call (starts the evaluator) {first_ms:>9.1} ms");
    Ok(())
}

/// Through the sandbox, in this process: an expression that allocates
/// past the limit fails naming memory, one that runs past the deadline
/// fails naming time, and the evaluators that replace the killed ones
/// serve the next evaluation.
#[test]
fn a_sandboxed_evaluation_fails_on_memory_or_time_and_the_next_one_runs() -> Result<()> {
    use belay_engine::definitions::expr::ExprError;
    belay_engine::expr_sandbox::enable_sandbox_with(belay_tests::bin("belay-engine")?);
    let state = json!({"input": {"n": 1}});
    let memory = Expr::parse(r#""xx" | . * 1000 | . * 1000 | . * 1000"#)?.eval(&state);
    match &memory {
        Err(ExprError::ResourceLimit { limit }) => {
            ensure!(limit.contains("MiB of memory"), "{limit}")
        }
        other => anyhow::bail!("expected a memory limit, got {other:?}"),
    }
    let doubling = format!("def f(g): g | g; {}.{}", "f(".repeat(34), ")".repeat(34));
    let started = Instant::now();
    let time = Expr::parse(&doubling)?.eval(&state);
    ensure!(time == Err(ExprError::TimedOut { ms: 1000 }), "{time:?}");
    ensure!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    ensure!(Expr::parse(".input.n + 1")?.eval(&state)? == json!(2));
    // The in-process rules still hold in the evaluator.
    let many = Expr::parse("1, 2")?.eval(&state);
    ensure!(
        many == Err(ExprError::ManyValues {
            count: 2,
            at_least: false
        }),
        "{many:?}"
    );
    Ok(())
}
