//! The result cache of `hints.cacheable: true` tools end to end, on both
//! backends: a real engine and worker, and the CRM double (a local HTTP
//! server) counting the lookups that reach it. The tools and workflows are
//! `tests/fixtures/cache.*`: the same lookup, cached for ten minutes and
//! not cached.
//!
//! A second run calling with the same arguments is served from the cache
//! (no request, no task, no dispatch; its events say where the result came
//! from); other arguments, another tenant, an expired entry (the engine's
//! clock moved past the TTL), a tool without `cacheable: true` and a call
//! after a failed one all reach the server.

use std::time::Duration;

use anyhow::{Result, ensure};
use belay_sdk::{Client, StartOptions};
use belay_tests::{DbBackend, EngineOpts, Env, of_kind, repo_root};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(60);
const LOOKUP: &str = "/customers/lookup";
const TTL_MS: i64 = 600_000;

/// Start `workflow` for `email` and wait for its end; returns the run id
/// and its final status.
async fn run(client: &Client, workflow: &str, email: &str, key: &str) -> Result<(String, String)> {
    let (run, _) = client
        .start_run(
            workflow,
            &json!({"email": email}),
            StartOptions {
                idempotency_key: key.into(),
                caller: "test".into(),
                caller_grants: vec!["crm.read".into()],
            },
        )
        .await?;
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let now = client.get_run(&run.run_id).await?;
        if ["completed", "failed", "cancelled"].contains(&now.status.as_str()) {
            return Ok((run.run_id, now.status));
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "run {} still {} after {T:?}",
            run.run_id,
            now.status
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn lookups(env: &Env) -> Result<usize> {
    Ok(env.crm_requests(LOOKUP).await?.len())
}

/// The `cached` marker of the run's (one) `tool_call_completed`.
async fn cached(env: &Env, run_id: &str) -> Result<Value> {
    cached_of(&env.client(0)?, run_id).await
}

/// [`cached`] of a run of `client`'s tenant.
async fn cached_of(client: &Client, run_id: &str) -> Result<Value> {
    let events: Vec<Value> = client
        .events(run_id, 0)
        .await?
        .iter()
        .map(|e| serde_json::from_str(&e.payload_json))
        .collect::<Result<_, _>>()?;
    let completed = of_kind(&events, "tool_call_completed");
    ensure!(completed.len() == 1, "{events:?}");
    Ok(completed[0].get("cached").cloned().unwrap_or(Value::Null))
}

async fn identical_calls_reach_the_server_once_per_tenant_until_the_ttl_passes(
    backend: DbBackend,
) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    env.start_worker(0).await?;
    let acme = env.client(0)?;

    // First run: the lookup reaches the CRM.
    let (first, status) = run(&acme, "cached_lookup", "ada@example.com", "c-1").await?;
    ensure!(status == "completed", "{status}");
    ensure!(lookups(&env).await? == 1);
    ensure!(cached(&env, &first).await?.is_null());

    // Same tenant, same arguments: served from the cache; nothing reached
    // the CRM, nothing was dispatched, the event says where it came from.
    let (second, status) = run(&acme, "cached_lookup", "ada@example.com", "c-2").await?;
    ensure!(status == "completed", "{status}");
    ensure!(lookups(&env).await? == 1, "the second run reached the CRM");
    let hit = cached(&env, &second).await?;
    ensure!(
        hit["stored_by_run"] == json!(first) && hit["stored_by_call"] == json!("lookup.t1"),
        "{hit}"
    );
    let events = env.events(&second).await?;
    ensure!(
        of_kind(&events, "tool_call_dispatched").is_empty(),
        "{events:?}"
    );
    let first_out = acme.get_run(&first).await?.output_json;
    let second_out = acme.get_run(&second).await?.output_json;
    ensure!(first_out == second_out, "{first_out} vs {second_out}");

    // Other arguments: a lookup of their own.
    let (_, status) = run(&acme, "cached_lookup", "bob@example.com", "c-3").await?;
    ensure!(status == "completed", "{status}");
    ensure!(lookups(&env).await? == 2);

    // Another tenant, same arguments: its own lookup (tenants never share
    // an entry).
    let globex = env.client_for(0, "globex")?;
    let root = repo_root();
    globex
        .register_paths(&[
            root.join("examples/onboarding/definitions"),
            root.join("tests/fixtures"),
        ])
        .await?;
    globex.set_tenant_grants(vec!["crm.read".into()]).await?;
    let (other, status) = run(&globex, "cached_lookup", "ada@example.com", "g-1").await?;
    ensure!(status == "completed", "{status}");
    ensure!(lookups(&env).await? == 3);
    ensure!(cached_of(&globex, &other).await?.is_null());

    // Past the TTL by the engine's clock: the lookup reaches the CRM again.
    env.db.advance_clock(TTL_MS + 1_000).await?;
    let (later, status) = run(&acme, "cached_lookup", "ada@example.com", "c-4").await?;
    ensure!(status == "completed", "{status}");
    ensure!(lookups(&env).await? == 4);
    ensure!(cached(&env, &later).await?.is_null());
    // ...and its fresh result is served to the next run.
    let (again, _) = run(&acme, "cached_lookup", "ada@example.com", "c-5").await?;
    ensure!(lookups(&env).await? == 4);
    ensure!(
        cached(&env, &again).await?["stored_by_run"] == json!(later),
        "served from the older entry"
    );
    env.stop().await
}

async fn uncached_tools_and_failed_calls_always_reach_the_server(backend: DbBackend) -> Result<()> {
    let mut env = Env::start_on(backend, EngineOpts::default()).await?;
    env.start_worker(0).await?;
    let acme = env.client(0)?;

    // Without `cacheable: true`, every call is a request.
    for key in ["u-1", "u-2"] {
        let (run_id, status) = run(&acme, "uncached_lookup", "ada@example.com", key).await?;
        ensure!(status == "completed", "{status}");
        ensure!(cached(&env, &run_id).await?.is_null());
    }
    ensure!(lookups(&env).await? == 2);

    // A failed call is not cached: the next identical call reaches the
    // server, and only its success is served afterwards.
    env.crm_fault(LOOKUP, "fail_400", 1).await?;
    let (failed, status) = run(&acme, "cached_lookup", "ada@example.com", "f-1").await?;
    ensure!(status == "failed", "{status}");
    ensure!(lookups(&env).await? == 3);
    let events = env.events(&failed).await?;
    ensure!(
        !of_kind(&events, "tool_call_failed").is_empty(),
        "{events:?}"
    );
    let (ok, status) = run(&acme, "cached_lookup", "ada@example.com", "f-2").await?;
    ensure!(status == "completed", "{status}");
    ensure!(
        lookups(&env).await? == 4,
        "the call after a failure was not sent"
    );
    ensure!(cached(&env, &ok).await?.is_null());
    let (served, _) = run(&acme, "cached_lookup", "ada@example.com", "f-3").await?;
    ensure!(lookups(&env).await? == 4);
    ensure!(
        cached(&env, &served).await?["stored_by_run"] == json!(ok),
        "not served from the success"
    );
    env.stop().await
}

belay_tests::on_both_backends!(
    identical_calls_reach_the_server_once_per_tenant_until_the_ttl_passes,
    uncached_tools_and_failed_calls_always_reach_the_server,
);
