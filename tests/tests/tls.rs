//! TLS end to end: an engine serving TLS from a test CA's certificate
//! (and asking for client certificates from it), a worker that trusts the
//! CA and presents a client certificate, the SDK and the CLI with
//! `--ca-file`; a CLI without the CA, or speaking plaintext to the TLS
//! port, is told what is wrong. PostgreSQL; real processes.

use anyhow::Result;
use belay_tests::pki::TestPki;
use belay_tests::{DbBackend, EngineOpts, Env};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_worker_sdk_and_cli_work_over_tls() -> Result<()> {
    let mut env = Env::start_with_tls(
        DbBackend::Postgres,
        EngineOpts::default(),
        TestPki::generate()?,
    )
    .await?;
    let url = env.engines[0].url.clone();
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    env.start_worker(0).await?;
    let run_id = env
        .start_onboarding(0, "onboarding_express", "tls@example.com", "tls-1")
        .await?;
    let events = env
        .wait_for(0, &run_id, "run_completed", Duration::from_secs(60))
        .await?;
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds.last(), Some(&"run_completed"), "{kinds:?}");

    let ca = env
        .tls
        .as_ref()
        .map(|t| t.path("ca.pem"))
        .unwrap_or_default();
    let other_ca = env
        .tls
        .as_ref()
        .map(|t| t.path("other-ca.pem"))
        .unwrap_or_default();
    let belay = belay_tests::bin("belay")?;
    let cli = |engine_url: &str, ca: Option<&std::path::Path>, args: &[&str]| {
        let mut cmd = std::process::Command::new(&belay);
        cmd.env("BELAY_API_KEY", belay_tests::ADMIN_TOKEN);
        cmd.env_remove("BELAY_CA_FILE")
            .args(["--engine-url", engine_url, "--tenant", "acme"]);
        if let Some(ca) = ca {
            cmd.arg("--ca-file").arg(ca);
        }
        cmd.args(args).output()
    };

    let out = cli(
        &url,
        Some(&ca),
        &["--json", "run", "list", "--status", "completed"],
    )?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(&run_id), "{stdout}");

    // Another CA's trust: the certificate error, and the way out.
    let out = cli(&url, Some(&other_ca), &["run", "list"])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("invalid peer certificate: UnknownIssuer"),
        "{stderr}"
    );
    assert!(
        stderr.contains("hint: ") && stderr.contains("--ca-file"),
        "{stderr}"
    );

    // Plaintext to the TLS port: told to use https://.
    let plaintext = url.replacen("https://", "http://", 1);
    let out = cli(&plaintext, None, &["run", "list"])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("unavailable: this Belay endpoint serves TLS")
            && stderr.contains("use an https:// engine URL"),
        "{stderr}"
    );

    // The CA file with a plaintext URL is refused before anything is sent.
    let out = cli(&plaintext, Some(&ca), &["run", "list"])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("use https://"), "{stderr}");
    env.stop().await
}
