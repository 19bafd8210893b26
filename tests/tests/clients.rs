//! The Python and TypeScript clients (`clients/`) against a real engine
//! and worker, on both backends: their own suites (`clients/python/tests`
//! with pytest, `clients/typescript/test` with node's test runner) run as
//! child processes that may SIGKILL the engine (its pid is in a file); this
//! harness then starts it again on the same ports and writes the new pid.
//! They may also freeze it (SIGSTOP, to show that keepalive pings end a
//! watch on an engine that stopped answering) and thaw it (SIGCONT); the
//! harness thaws it once the suite has ended, whatever happened. They get
//! a test CA (`BELAY_TEST_PKI_DIR`) for the TLS servers they start to
//! fail handshakes against, and the workflows of `tests/client-fixtures`.
//! Also: the type checks (`mypy --strict`, `tsc --noEmit`), the README
//! holding the example scripts verbatim, and `buf lint`/`buf breaking`.
//!
//! What the suites need is installed by `.ci/clients.sh` (run here once
//! when `BELAY_CLIENTS_*` are not set).

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context, Result, bail, ensure};
use belay_tests::pki::TestPki;
use belay_tests::{ADMIN_TOKEN, DbBackend, EngineOpts, Env, ci_env, on_both_backends, repo_root};
use nix::sys::signal::Signal;
use tokio::process::Command;

const SCRIPT: &str = ".ci/clients.sh";

fn python() -> Result<String> {
    ci_env(SCRIPT, "BELAY_CLIENTS_PYTHON")
}

fn typescript() -> Result<PathBuf> {
    Ok(PathBuf::from(ci_env(SCRIPT, "BELAY_CLIENTS_TS")?))
}

async fn python_suite(backend: DbBackend) -> Result<()> {
    let mut suite = Command::new(python()?);
    suite
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
        .current_dir(repo_root().join("clients/python"));
    run_suite(backend, "pytest", suite).await
}

async fn typescript_suite(backend: DbBackend) -> Result<()> {
    let mut suite = Command::new("node");
    suite
        .args([
            "--test",
            "--test-concurrency=1",
            "dist/test/client.test.js",
            "dist/test/resilience.test.js",
        ])
        .current_dir(typescript()?);
    run_suite(backend, "node --test", suite).await
}

on_both_backends!(python_suite, typescript_suite);

/// Start the world, run `suite` with its environment, restart the engine
/// whenever the suite kills it, and fail unless the suite passes.
async fn run_suite(backend: DbBackend, name: &str, mut suite: Command) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    env.client(0)?
        .register_paths(&[repo_root().join("tests/client-fixtures")])
        .await?;
    env.start_worker(0).await?;
    let client_key = env.create_key("client-suite", "client", &["acme"]).await?;
    // Kept until the suite has ended (dropping it removes the files).
    let pki = TestPki::generate()?;
    let pid_file = std::env::temp_dir().join(format!(
        "belay-engine-{}.pid",
        uuid::Uuid::new_v4().simple()
    ));
    write_pid(&env, &pid_file)?;
    suite
        .env("BELAY_ENGINE_URL", &env.engines[0].url)
        .env("BELAY_API_KEY", ADMIN_TOKEN)
        .env("BELAY_TENANT", &env.tenant)
        .env("BELAY_TEST_CLIENT_KEY", client_key)
        .env("BELAY_TEST_ENGINE_PID_FILE", &pid_file)
        .env("BELAY_TEST_PKI_DIR", pki.dir())
        .env(
            "BELAY_TEST_DEFINITIONS",
            repo_root().join("examples/onboarding/definitions"),
        )
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let mut child = suite.spawn().with_context(|| format!("starting {name}"))?;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status?,
            exited = env.engines[0].wait() => {
                exited?;
                env.start_engine_again(0).await?;
                write_pid(&env, &pid_file)?;
            }
        }
    };
    // A suite that died with the engine frozen leaves it stopped: let it
    // run, so it stops cleanly (an engine that is running ignores SIGCONT).
    env.engines[0].signal(Signal::SIGCONT)?;
    let _ = std::fs::remove_file(&pid_file);
    env.stop().await?;
    ensure!(
        status.success(),
        "{name} failed ({status}); its output is above"
    );
    Ok(())
}

fn write_pid(env: &Env, path: &Path) -> Result<()> {
    let pid = env.engines[0].pid().context("the engine has exited")?;
    // Written whole and renamed, so a reader never sees half a number.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, pid.to_string())?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

async fn check(program: &str, args: &[&str], dir: &Path) -> Result<()> {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .await
        .with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {args:?} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

#[tokio::test]
async fn python_client_passes_mypy_strict() -> Result<()> {
    let dir = repo_root().join("clients/python");
    // The installed package (with its generated modules), then the suite and the example.
    check(
        &python()?,
        &["-m", "mypy", "--strict", "-p", "belay_client"],
        &dir,
    )
    .await?;
    check(
        &python()?,
        &["-m", "mypy", "--strict", "tests", "examples"],
        &dir,
    )
    .await
}

#[tokio::test]
async fn typescript_client_passes_tsc() -> Result<()> {
    check(
        "node_modules/.bin/tsc",
        &["--noEmit", "-p", "tsconfig.json"],
        &typescript()?,
    )
    .await
}

#[tokio::test]
async fn proto_passes_buf_lint_and_buf_breaking() -> Result<()> {
    // Without BELAY_BUF, as a developer runs it: buf.sh finds buf itself
    // (on PATH, else through .ci/clients.sh, whose cache ci_env fills).
    ci_env(SCRIPT, "BELAY_BUF")?;
    let out = Command::new("bash")
        .arg(".ci/buf.sh")
        .env_remove("BELAY_BUF")
        .current_dir(repo_root())
        .output()
        .await?;
    ensure!(
        out.status.success(),
        "buf found problems ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

#[test]
fn the_readme_shows_the_example_scripts_verbatim() -> Result<()> {
    let root = repo_root();
    let readme = std::fs::read_to_string(root.join("README.md"))?;
    for (file, fence) in [
        ("clients/python/examples/onboarding.py", "```python\n"),
        ("clients/typescript/examples/onboarding.ts", "```ts\n"),
    ] {
        let script = std::fs::read_to_string(root.join(file))?;
        ensure!(
            readme.contains(&format!("{fence}{script}```\n")),
            "README.md does not show {file} as it is (in a {} block): copy it again",
            fence.trim()
        );
        let lines = script.lines().count();
        ensure!(
            lines <= 25,
            "{file} has {lines} lines: the README promises about 20"
        );
    }
    Ok(())
}
