//! End-to-end: real PostgreSQL, real engine/worker/model/CRM processes.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::Result;
use belay_tests::{DbBackend, EngineOpts, Env, dispatch_counts, lease_expiries, of_kind};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(60);

async fn onboarding_run_completes_with_a_gapless_timeline(backend: DbBackend) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    env.start_worker(0).await?;
    let run_id = env
        .start_onboarding(0, "onboarding_express", "new@example.com", "k1")
        .await?;
    let seen = env.wait_for(0, &run_id, "run_completed", T).await?;
    assert_eq!(seen.last().map(|e| e.kind.as_str()), Some("run_completed"));

    let events = env.events(&run_id).await?;
    let scheduled = of_kind(&events, "tool_call_scheduled");
    let tools: Vec<&str> = scheduled
        .iter()
        .filter_map(|e| e["tool"].as_str())
        .collect();
    assert_eq!(
        tools,
        ["lookup_customer", "create_account", "send_welcome_email"]
    );
    for e in &scheduled {
        let key = e["idempotency_key"].as_str().unwrap_or_default();
        assert_eq!(
            key,
            format!("{run_id}/{}", e["call_id"].as_str().unwrap_or_default())
        );
        assert!(e["arguments"].is_object());
    }
    assert_eq!(scheduled[1]["arguments"]["email"], "new@example.com");
    let completed = of_kind(&events, "tool_call_completed");
    assert_eq!(completed.len(), 3);
    assert!(completed.iter().all(|e| e["attempt"] == 1));
    assert_eq!(of_kind(&events, "model_call_completed").len(), 4);
    // Every dispatch exactly once.
    assert!(dispatch_counts(&events).values().all(|&n| n == 1));

    // The output carries the account the CRM created, and the CRM saw one create.
    let accounts = env.crm_requests("/accounts").await?;
    assert_eq!(accounts.len(), 1);
    let run = env.client(0)?.get_run(&run_id).await?;
    assert_eq!(run.status, "completed");
    let output: Value = serde_json::from_str(&run.output_json)?;
    let account_id = completed[1]["result"]["account_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(!account_id.is_empty());
    assert_eq!(output["account_id"], account_id.as_str());
    assert_eq!(
        accounts[0]["idempotency_key"],
        format!("{run_id}/intake.t2")
    );
    env.stop().await
}

async fn start_run_twice_with_one_key_gives_one_run(backend: DbBackend) -> Result<()> {
    let env = Env::start_on(backend, EngineOpts::default()).await?;
    let a = env
        .start_onboarding(0, "onboarding", "x@example.com", "same-key")
        .await?;
    let b = env
        .start_onboarding(0, "onboarding", "x@example.com", "same-key")
        .await?;
    assert_eq!(a, b);
    assert_eq!(env.db.count_runs().await?, 1);
    // Another tenant cannot see the run.
    let other = env.client_for(0, "globex")?;
    let err = other
        .get_run(&a)
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("not found"), "{err}");
    // Bad input is refused with a precise error.
    let err = env
        .client(0)?
        .start_run(
            "onboarding",
            &serde_json::json!({"name": "no email"}),
            belay_sdk::StartOptions {
                idempotency_key: "k2".into(),
                ..Default::default()
            },
        )
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("input schema"), "{err}");
    let err = env
        .client(0)?
        .start_run(
            "nope",
            &serde_json::json!({}),
            belay_sdk::StartOptions {
                idempotency_key: "k3".into(),
                ..Default::default()
            },
        )
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("workflow `nope` not found"), "{err}");
    env.stop().await
}

async fn refused_tool_calls_go_back_to_the_model_and_the_run_goes_on(
    backend: DbBackend,
) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    env.start_worker(0).await?;
    let run_id = env
        .start_onboarding(0, "onboarding_refusals", "r@example.com", "r1")
        .await?;
    env.wait_for(0, &run_id, "run_completed", T).await?;
    let events = env.events(&run_id).await?;
    let refused = of_kind(&events, "tool_call_refused");
    let checks: Vec<&str> = refused.iter().filter_map(|e| e["check"].as_str()).collect();
    assert_eq!(
        checks,
        ["not_on_list", "invalid_arguments", "invalid_arguments"]
    );
    assert!(
        refused[1]["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("not valid JSON")
    );
    assert!(
        refused[2]["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("input schema")
    );
    assert_eq!(of_kind(&events, "run_completed").len(), 1);
    env.stop().await
}

async fn engine_killed_mid_run_resumes_without_duplicates(backend: DbBackend) -> Result<()> {
    // A long lease: the restart happens well within it, so no lease expires
    // and nothing may be dispatched twice.
    let mut env = Env::start_on(
        backend,
        EngineOpts {
            lease_ms: 20_000,
            sweep_ms: 100,
        },
    )
    .await?;
    env.start_worker(0).await?;
    let run_id = env
        .start_onboarding(0, "onboarding_express", "kill-engine@example.com", "ke")
        .await?;
    // The lookup reached the CRM: the worker holds its task, and the engine
    // dies while the call is in flight.
    env.crm_wait("/customers/lookup", 1).await?;
    env.restart_engine(0).await?;
    env.wait_for(0, &run_id, "run_completed", T).await?;
    let events = env.events(&run_id).await?;
    assert_eq!(of_kind(&events, "run_completed").len(), 1);
    // A call is dispatched again only after a lease of it expired: a claim
    // whose reply the dying engine never sent leaves its task leased to a
    // worker that does not know it, and a dispatch recorded with that
    // claim (`Task.dispatched`) counts as one.
    let expired = lease_expiries(&events);
    for (call, n) in dispatch_counts(&events) {
        let again = expired.get(&call).copied().unwrap_or(0);
        assert_eq!(
            n,
            1 + again,
            "{call}: {n} dispatches, {again} expired leases"
        );
    }
    let completed: Vec<&str> = of_kind(&events, "tool_call_completed")
        .iter()
        .filter_map(|e| e["call_id"].as_str())
        .collect();
    let unique: BTreeSet<&str> = completed.iter().copied().collect();
    assert_eq!(unique.len(), completed.len(), "no event written twice");
    assert_eq!(env.crm_requests("/accounts").await?.len(), 1);
    env.stop().await
}

async fn worker_killed_during_an_idempotent_call_is_retried_with_the_same_key(
    backend: DbBackend,
) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    env.crm_fault("/customers/lookup", "hang_after_effect", 1)
        .await?;
    env.start_worker(0).await?;
    let run_id = env
        .start_onboarding(0, "onboarding_express", "idem@example.com", "ki")
        .await?;
    env.crm_wait("/customers/lookup", 1).await?;
    env.workers[0].kill().await?;
    env.start_worker(0).await?;
    env.wait_for(0, &run_id, "run_completed", T).await?;
    let lookups = env.crm_requests("/customers/lookup").await?;
    let events = env.events(&run_id).await?;
    // The killed worker's lease expired after its dispatch. Under a loaded
    // machine (CI) a later lease can expire as well, of this call's retry
    // or of another call: each expired dispatched attempt of the lookup
    // is at most one more request (none when its worker found the answer
    // to its dispatch too late to act on), always with the same key.
    let expired: Vec<_> = of_kind(&events, "task_lease_expired")
        .into_iter()
        .filter(|e| e["call_id"] == "intake.t1")
        .collect();
    assert!(!expired.is_empty(), "{events:#?}");
    assert_eq!(expired[0]["dispatched"], true);
    let dispatched_expiries = expired.iter().filter(|e| e["dispatched"] == true).count();
    assert!(lookups.len() <= dispatched_expiries + 1, "{events:#?}");
    assert!(lookups.len() >= 2, "{lookups:#?} {events:#?}");
    for lookup in &lookups {
        assert_eq!(lookup["idempotency_key"], format!("{run_id}/intake.t1"));
    }
    env.stop().await
}

async fn worker_killed_after_dispatching_a_reconcile_call_pauses_the_run(
    backend: DbBackend,
) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    let run_id = env
        .run_losing_the_create(
            "rec@example.com",
            "kr",
            "hang_after_effect",
            Some("fail_400"),
        )
        .await?;
    env.wait_for(0, &run_id, "reconcile_probe_finished", T)
        .await?;
    let run = env.client(0)?.get_run(&run_id).await?;
    assert_eq!(run.status, "paused");
    assert!(
        run.status_reason.contains("uncertain outcome"),
        "{}",
        run.status_reason
    );
    let rows = env.uncertain_rows(&run_id).await?;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["status"], "open");
    assert_eq!(rows[0]["tool"], "create_account");
    assert_eq!(rows[0]["idempotency_key"], format!("{run_id}/intake.t2"));
    assert_eq!(rows[0]["arguments"]["email"], "rec@example.com");
    assert_eq!(rows[0]["probe"]["outcome"], "undecided");
    assert_eq!(env.db.task_status(&run_id, "intake.t2").await?, "uncertain");
    assert_eq!(env.crm_requests("/accounts").await?.len(), 1);
    env.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_engines_and_two_workers_complete_every_run_exactly_once() -> Result<()> {
    let mut env = Env::start(EngineOpts {
        lease_ms: 10_000,
        sweep_ms: 100,
    })
    .await?;
    env.start_engine(None).await?;
    env.start_worker(0).await?;
    env.start_worker(1).await?;
    let mut runs = Vec::new();
    for i in 0..8 {
        let engine = i % 2;
        runs.push((
            engine,
            env.start_onboarding(
                engine,
                "onboarding_express",
                &format!("u{i}@example.com"),
                &format!("many-{i}"),
            )
            .await?,
        ));
    }
    for (engine, run_id) in &runs {
        env.wait_for(*engine, run_id, "run_completed", T).await?;
    }
    for (_, run_id) in &runs {
        let events = env.events(run_id).await?;
        assert_eq!(of_kind(&events, "run_completed").len(), 1);
        assert!(dispatch_counts(&events).values().all(|&n| n == 1));
    }
    let creates = env.crm_requests("/accounts").await?;
    assert_eq!(creates.len(), 8);
    let keys: BTreeSet<String> = creates
        .iter()
        .map(|r| r["idempotency_key"].to_string())
        .collect();
    assert_eq!(keys.len(), 8);
    env.stop().await
}

async fn health_and_reflection_answer_without_proto_files(backend: DbBackend) -> Result<()> {
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let env = Env::start_on(backend, EngineOpts::default()).await?;
    let channel = tonic::transport::Endpoint::from_shared(env.engines[0].url.clone())?
        .connect()
        .await?;
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let status = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "belay.v1.RunService".into(),
        })
        .await?
        .into_inner()
        .status;
    assert_eq!(
        status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );

    let mut reflection = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = reflection
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await?
        .into_inner();
    let response = stream.message().await?.and_then(|r| r.message_response);
    let Some(MessageResponse::ListServicesResponse(list)) = response else {
        anyhow::bail!("unexpected reflection response {response:?}");
    };
    let names: BTreeSet<String> = list.service.into_iter().map(|s| s.name).collect();
    for expected in [
        "belay.v1.RunService",
        "belay.v1.WorkerService",
        "belay.v1.DefinitionService",
        "belay.v1.TenantService",
    ] {
        assert!(
            names.contains(expected),
            "{expected} missing from {names:?}"
        );
    }
    // The same in v1alpha, all that grpcurl from PyPI and Python's
    // grpcio-reflection speak; reflection needs no key.
    use tonic_reflection::pb::v1alpha as alpha;
    let channel = tonic::transport::Endpoint::from_shared(env.engines[0].url.clone())?
        .connect()
        .await?;
    let mut reflection = alpha::server_reflection_client::ServerReflectionClient::new(channel);
    let request = alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let mut stream = reflection
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await?
        .into_inner();
    let response = stream.message().await?.and_then(|r| r.message_response);
    let Some(alpha::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        response
    else {
        anyhow::bail!("unexpected v1alpha reflection response {response:?}");
    };
    let without_reflection = |names: BTreeSet<String>| -> BTreeSet<String> {
        names
            .into_iter()
            .filter(|n| !n.starts_with("grpc.reflection."))
            .collect()
    };
    let alpha_names: BTreeSet<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(alpha_names.contains("grpc.reflection.v1alpha.ServerReflection"));
    assert_eq!(
        without_reflection(alpha_names),
        without_reflection(names),
        "v1alpha lists what v1 lists"
    );
    env.stop().await
}

/// A worker whose key the engine refuses (a client key: the wrong role)
/// stops with an error naming the credential, instead of polling forever
/// looking healthy.
async fn a_worker_with_a_refused_key_stops_and_says_why(backend: DbBackend) -> Result<()> {
    let env = Env::start_on(backend, EngineOpts::default()).await?;
    let client_key = env.create_key("not-a-worker", "client", &["acme"]).await?;
    let run = tokio::process::Command::new(belay_tests::bin("belay-worker")?)
        .args(["--engine-url", &env.engines[0].url, "--worker-id", "w-bad"])
        .env("BELAY_API_KEY", &client_key)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), run).await??;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "exited 0: {stderr}");
    assert!(
        stderr.contains("refuses this worker's credential"),
        "{stderr}"
    );
    assert!(!stderr.contains(&client_key), "the key is never logged");
    env.stop().await
}

/// `belay keys create|list|revoke` against the admin endpoint: the key is
/// printed once and works on the gRPC API at once; a revoked one does not.
async fn the_cli_makes_lists_and_revokes_keys(backend: DbBackend) -> Result<()> {
    let env = Env::start_on(backend, EngineOpts::default()).await?;
    let belay = belay_tests::bin("belay")?;
    let cli = |key: &str, args: &[&str]| {
        std::process::Command::new(&belay)
            .env("BELAY_API_KEY", key)
            .env_remove("BELAY_ADMIN_TOKEN")
            .args(["--engine-url", &env.engines[0].url])
            .args([
                "--admin-url",
                env.engines[0].admin_url(),
                "--tenant",
                "acme",
            ])
            .args(args)
            .output()
    };
    let out = cli(
        belay_tests::ADMIN_TOKEN,
        &[
            "--json",
            "keys",
            "create",
            "--principal",
            "ci-bot",
            "--role",
            "client",
            "--tenants",
            "acme",
            "--grant",
            "crm.read",
            "--expires-in",
            "30d",
        ],
    )?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let made: Value = serde_json::from_slice(&out.stdout)?;
    let key = made["key"].as_str().unwrap_or_default().to_owned();
    assert!(key.starts_with("belay_"), "{made}");
    assert_eq!(
        (made["role"].as_str(), made["tenants"].clone()),
        (Some("client"), json!(["acme"]))
    );
    let runs = cli(&key, &["run", "list"])?;
    assert!(
        runs.status.success(),
        "{}",
        String::from_utf8_lossy(&runs.stderr)
    );
    // A client key may not manage keys.
    let refused = cli(&key, &["keys", "list"])?;
    assert!(!refused.status.success());
    let listed = cli(
        belay_tests::ADMIN_TOKEN,
        &["keys", "list", "--of-tenant", "acme"],
    )?;
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    let key_id = made["key_id"].as_str().unwrap_or_default();
    assert!(
        listed.contains(key_id) && listed.contains("active"),
        "{listed}"
    );
    assert!(!listed.contains(&key[23..]), "no secret in a listing");
    let revoked = cli(belay_tests::ADMIN_TOKEN, &["keys", "revoke", key_id])?;
    assert!(String::from_utf8_lossy(&revoked.stdout).contains("revoked"));
    let after = cli(&key, &["run", "list"])?;
    assert!(!after.status.success(), "a revoked key still works");
    assert!(
        String::from_utf8_lossy(&after.stderr).contains("revoked"),
        "{}",
        String::from_utf8_lossy(&after.stderr)
    );
    env.stop().await
}

async fn an_invalid_bundle_is_refused_whole_with_every_error(backend: DbBackend) -> Result<()> {
    let env = Env::start_on(backend, EngineOpts::default()).await?;
    let client = env.client(0)?;
    let before = client.list_definitions("").await?.len();
    let files = vec![
        belay_proto::v1::DefinitionFile {
            path: "good.tools.abl".into(),
            content: "TOOLS:\n  ping(x: string) -> string\n    description: \"ping\"\n    type: http\n    endpoint: \"/ping\"\n    permission: p\n    repeat_safety: idempotent\n".into(),
        },
        belay_proto::v1::DefinitionFile {
            path: "bad.yaml".into(),
            content: "kind: agent\nname: a\nmodel: m\ninstructions: i\ntools: [ping, nope]\nfrobnicate: 1\n".into(),
        },
    ];
    let err = client
        .register_files(files)
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("bad.yaml:5:"), "{err}");
    assert!(err.contains("nope"), "{err}");
    assert!(err.contains("bad.yaml:6:1"), "{err}");
    assert_eq!(
        client.list_definitions("").await?.len(),
        before,
        "nothing half-registered"
    );
    env.stop().await
}

async fn the_cli_starts_watches_and_lists_runs(backend: DbBackend) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    env.start_worker(0).await?;
    let belay = belay_tests::bin("belay")?;
    let cli = |args: &[&str]| {
        let mut cmd = std::process::Command::new(&belay);
        cmd.env("BELAY_API_KEY", belay_tests::ADMIN_TOKEN);
        cmd.args(["--engine-url", &env.engines[0].url, "--tenant", "acme"])
            .args(args);
        cmd.output()
    };
    let out = cli(&[
        "run",
        "start",
        "onboarding_express",
        "--input",
        r#"{"email":"cli@example.com","name":"C"}"#,
        "--idempotency-key",
        "cli-1",
        "--grant",
        "crm.read",
        "--grant",
        "crm.write",
        "--grant",
        "email.send",
        "--watch",
    ])?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("tool_call_dispatched"), "{stdout}");
    assert!(stdout.contains("run_completed"), "{stdout}");
    assert!(stdout.contains("status    completed"), "{stdout}");

    let out = cli(&["--json", "run", "list", "--status", "completed"])?;
    let list: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(list["runs"].as_array().map(Vec::len), Some(1));
    let run_id = list["runs"][0]["run_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();

    // Resumable: events after seq 5 start at 6.
    let out = cli(&["--json", "run", "events", &run_id, "--after", "5"])?;
    let first: Value = serde_json::from_str(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or("null"),
    )?;
    assert_eq!(first["seq"], 6);

    let out = cli(&["run", "list", "--status", "bogus"])?;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown status `bogus`"));

    // Output into a pipe whose reader has gone (`belay … | head -1`): a
    // quiet exit 0, not a panic.
    let (reader, writer) = std::io::pipe()?;
    drop(reader);
    let out = std::process::Command::new(&belay)
        .env("BELAY_API_KEY", belay_tests::ADMIN_TOKEN)
        .args(["--engine-url", &env.engines[0].url, "--tenant", "acme"])
        .args(["run", "events", &run_id])
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
    env.stop().await
}

async fn watching_past_the_end_returns_and_sigterm_ends_open_watches(
    backend: DbBackend,
) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    env.start_worker(0).await?;
    let done = env
        .start_onboarding(0, "onboarding_express", "w@example.com", "w1")
        .await?;
    let seen = env.wait_for(0, &done, "run_completed", T).await?;
    let last = seen.last().map(|e| e.seq).unwrap_or_default();
    // Resuming at (or past) the end of a finished run ends at once.
    let client = env.client(0)?;
    let tail = tokio::time::timeout(
        Duration::from_secs(10),
        client.watch(&done, last, |_| false),
    )
    .await??;
    assert!(tail.is_none());

    // A run that never finishes (no worker picks it up) has an open watch;
    // SIGTERM must still stop the engine promptly.
    env.workers[0].kill().await?;
    let open = env
        .start_onboarding(0, "onboarding_express", "w2@example.com", "w2")
        .await?;
    let watcher = tokio::spawn({
        let client = env.client(0)?;
        async move { client.watch(&open, 0, |_| false).await }
    });
    env.wait_for(0, &done, "run_completed", T).await?; // the engine answers
    env.engines[0].signal(nix::sys::signal::Signal::SIGTERM)?;
    let exited = tokio::time::timeout(Duration::from_secs(15), env.engines[0].wait()).await;
    assert!(
        exited.is_ok(),
        "the engine did not exit within 15 s of SIGTERM"
    );
    let ended = tokio::time::timeout(Duration::from_secs(5), watcher).await;
    assert!(ended.is_ok(), "the watch stream ended with the engine");
    env.stop().await
}

async fn runs_with_large_payloads_can_be_read_back(backend: DbBackend) -> Result<()> {
    let env = Env::start_on(backend, EngineOpts::default()).await?;
    let client = env.client(0)?;
    let big = "x".repeat(3 * 1024 * 1024);
    for key in ["big-1", "big-2"] {
        client
            .start_run(
                "onboarding",
                &serde_json::json!({"email": "big@example.com", "name": big}),
                belay_sdk::StartOptions {
                    idempotency_key: key.into(),
                    ..Default::default()
                },
            )
            .await?;
    }
    let (runs, _) = client.list_runs("", 10, "").await?;
    assert_eq!(runs.len(), 2);
    let events = client.events(&runs[0].run_id, 0).await?;
    assert!(events.len() >= 3, "{} events", events.len());
    // The same key with a different input is refused, not answered with the old run.
    let err = client
        .start_run(
            "onboarding",
            &serde_json::json!({"email": "other@example.com", "name": "n"}),
            belay_sdk::StartOptions {
                idempotency_key: "big-1".into(),
                ..Default::default()
            },
        )
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("different request"), "{err}");
    env.stop().await
}

belay_tests::on_both_backends!(
    onboarding_run_completes_with_a_gapless_timeline,
    start_run_twice_with_one_key_gives_one_run,
    refused_tool_calls_go_back_to_the_model_and_the_run_goes_on,
    engine_killed_mid_run_resumes_without_duplicates,
    worker_killed_during_an_idempotent_call_is_retried_with_the_same_key,
    worker_killed_after_dispatching_a_reconcile_call_pauses_the_run,
    health_and_reflection_answer_without_proto_files,
    an_invalid_bundle_is_refused_whole_with_every_error,
    the_cli_starts_watches_and_lists_runs,
    the_cli_makes_lists_and_revokes_keys,
    a_worker_with_a_refused_key_stops_and_says_why,
    watching_past_the_end_returns_and_sigterm_ends_open_watches,
    runs_with_large_payloads_can_be_read_back,
);
