//! The `scripted-model` and `crm-server` binaries as separate processes: the
//! one stdout line with the address, serving, flags, and stopping on SIGTERM;
//! and the `onboarding` runner end to end.

#![allow(missing_docs)]

mod common;

use std::process::Stdio;

use common::client;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};

/// Spawns a binary and reads the address from its single stdout line.
async fn spawn(
    binary: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Child, String, BufReader<tokio::process::ChildStdout>) {
    let mut command = Command::new(binary);
    command
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    command.env_remove("SCRIPTED_MODEL_API_KEY");
    for (key, value) in env {
        command.env(key, value);
    }
    let mut child = command.spawn().expect("spawn");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).await.expect("read line");
    let url = line
        .trim_end()
        .strip_prefix("listening on ")
        .expect("listening line")
        .to_owned();
    assert!(url.starts_with("http://127.0.0.1:"), "{line}");
    assert!(!url.ends_with(":0"), "the real port is printed: {line}");
    (child, url, stdout)
}

/// Sends SIGTERM and checks the process exits successfully without printing
/// anything else on stdout.
async fn terminate(mut child: Child, mut stdout: BufReader<tokio::process::ChildStdout>) {
    let pid = Pid::from_raw(i32::try_from(child.id().expect("running")).expect("pid"));
    kill(pid, Signal::SIGTERM).expect("SIGTERM");
    let status = child.wait().await.expect("wait");
    assert!(status.success(), "{status}");
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).await.expect("read rest");
    assert_eq!(rest, "", "stdout carries only the listening line");
}

#[tokio::test]
async fn crm_server_binary_serves_and_stops_on_sigterm() {
    let (child, url, stdout) = spawn(
        env!("CARGO_BIN_EXE_crm-server"),
        &["--listen", "127.0.0.1:0"],
        &[],
    )
    .await;
    let response = client()
        .post(format!("{url}/accounts"))
        .json(&json!({"email": "a@example.com", "name": "A", "plan": "pro"}))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 201);

    // A hung request must not keep the process from stopping.
    let faults = client()
        .post(format!("{url}/_faults"))
        .json(&json!({"path": "/accounts", "action": "hang_after_effect"}))
        .send()
        .await
        .expect("send");
    assert_eq!(faults.status(), 200);
    let hung_url = url.clone();
    let hung = tokio::spawn(async move {
        client()
            .post(format!("{hung_url}/accounts"))
            .json(&json!({"email": "b@example.com", "name": "B", "plan": "pro"}))
            .send()
            .await
    });
    let wait = client()
        .get(format!("{url}/_wait?path=/accounts&count=2"))
        .send()
        .await
        .expect("send");
    assert_eq!(wait.status(), 200);

    terminate(child, stdout).await;
    assert!(
        hung.await.expect("task").is_err(),
        "the hung request is never answered"
    );
}

#[tokio::test]
async fn scripted_model_binary_uses_the_embedded_script_and_api_key() {
    let (child, url, stdout) = spawn(
        env!("CARGO_BIN_EXE_scripted-model"),
        &[],
        &[("SCRIPTED_MODEL_API_KEY", "sk-env")],
    )
    .await;
    let request = json!({
        "model": "scripted-onboarding",
        "messages": [{"role": "user", "content": "{\"email\": \"e@example.com\"}"}],
    });
    let unauthorized = client()
        .post(format!("{url}/v1/chat/completions"))
        .json(&request)
        .send()
        .await
        .expect("send");
    assert_eq!(unauthorized.status(), 401);
    let response = client()
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth("sk-env")
        .json(&request)
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.expect("json");
    assert_eq!(
        body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
        r#"{"email":"e@example.com"}"#
    );
    terminate(child, stdout).await;
}

#[tokio::test]
async fn scripted_model_binary_loads_a_script_file() {
    let dir = std::env::temp_dir().join(format!("belay-scripted-model-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("script.yaml");
    std::fs::write(&path, "echo:\n  - content: \"hi {{input.who}}\"\n").expect("write");
    let script = path.to_str().expect("utf-8 path");
    let (child, url, stdout) = spawn(
        env!("CARGO_BIN_EXE_scripted-model"),
        &["--script", script, "--listen", "127.0.0.1:0"],
        &[],
    )
    .await;
    let response = client()
        .post(format!("{url}/v1/chat/completions"))
        .json(&json!({"model": "echo", "messages": [{"role": "user", "content": "{\"who\": \"there\"}"}]}))
        .send()
        .await
        .expect("send");
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["choices"][0]["message"]["content"], "hi there");
    terminate(child, stdout).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn scripted_model_binary_refuses_a_bad_script_without_announcing() {
    let output = Command::new(env!("CARGO_BIN_EXE_scripted-model"))
        .args(["--script", "/nonexistent/script.yaml"])
        .output()
        .await
        .expect("run");
    assert!(!output.status.success());
    assert!(output.stdout.is_empty());
    assert!(String::from_utf8_lossy(&output.stderr).contains("cannot read script"));
}

/// Runs the `onboarding` runner (in-memory SQLite) with `args`.
async fn onboarding(args: &[&str]) -> (std::process::ExitStatus, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_onboarding"))
        .args(args)
        .env_remove("DATABASE_URL")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .expect("run onboarding");
    (
        output.status,
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn onboarding_runner_plays_documents_reminder_and_approval_to_completion() {
    let (status, stdout, stderr) = onboarding(&["--approved-plan", "enterprise"]).await;
    assert!(status.success(), "{stdout}\n{stderr}");
    for expected in [
        "wait_started",
        "timer_fired                 node=documents timer=documents.w2",
        "send_reminder_email",
        "signal_received",
        "a duplicate, applied once",
        "kyc_check",
        "approval_requested",
        "approval_decided",
        // The welcome node starts with its call (behaviour level 3), on
        // the plan the approver chose.
        "welcome.t1 send_welcome_email args={\"account_id\":\"acct_000001\",\"email\":\"margaret@example.com\",\"plan\":\"enterprise\"}",
        "run_completed",
        "status: completed",
        "1 reminder(s), 1 KYC check(s), 1 welcome email(s) (plan enterprise)",
    ] {
        assert!(stdout.contains(expected), "{expected:?} missing:\n{stdout}");
    }
    assert_eq!(stdout.matches("signal_received").count(), 1, "{stdout}");
}

#[tokio::test]
async fn onboarding_runner_exits_non_zero_when_kyc_asks_for_a_review() {
    let (status, stdout, stderr) = onboarding(&[
        "--email",
        "m+review@example.com",
        "--days-without-documents",
        "0",
    ])
    .await;
    assert!(!status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("status: failed"), "{stdout}");
    assert!(stdout.contains("needs a manual review"), "{stdout}");
    assert!(stdout.contains("0 reminder(s)"), "{stdout}");
}
