//! Worker pools in the store and coordinator (issue 21), on both backends:
//! a task's requirements are computed when it is scheduled (`tasks.requires`
//! from the tool's binding and `pool:`); a claim with capabilities takes
//! only the tasks they cover, at attempt 1; a claim without capabilities (a
//! worker older than worker pools) takes any task; a worker key's tenants
//! still limit what it claims, capabilities or not; the ready tasks no live
//! worker can take are listed with what is missing, and stop being listed
//! once a capable worker has claimed.

mod common;
use common::{Backend, TestDb};

use std::sync::Arc;

use belay_engine::coordinator::{Coordinator, StartRun};
use belay_engine::store::{ClaimFilter, Store};
use uuid::Uuid;

const TOOLS: &str = r#"TOOLS:
  alpha_echo(message: string) -> object[]
    description: "echo on server alpha"
    type: mcp
    server: alpha
    server_tool: echo
    permission: mcp.use
    repeat_safety: idempotent

  beta_echo(message: string) -> object[]
    description: "echo on server beta"
    type: mcp
    server: beta
    server_tool: echo
    permission: mcp.use
    repeat_safety: idempotent

  crunch(n: number) -> object
    description: "runs on pool gpu, relative endpoint"
    type: http
    endpoint: "/crunch"
    method: POST
    pool: gpu
    permission: mcp.use
    repeat_safety: idempotent
"#;

const FLOWS: &str = "kind: workflow\nname: wa\nnodes:\n  - {id: c, type: tool, tool: alpha_echo, args: {message: hi}, grants: [mcp.use]}\n---\nkind: workflow\nname: wb\nnodes:\n  - {id: c, type: tool, tool: beta_echo, args: {message: hi}, grants: [mcp.use]}\n---\nkind: workflow\nname: wg\nnodes:\n  - {id: c, type: tool, tool: crunch, args: {n: 1}, grants: [mcp.use]}\n";

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

async fn setup(backend: Backend) -> (TestDb, Store, Arc<Coordinator>) {
    let db = TestDb::create(backend, "belay_pools").await;
    let store = db.store(4).await;
    let coord = common::coordinator(store.clone(), &["t", "u"], TOOLS, FLOWS, &["mcp.use"]).await;
    (db, store, coord)
}

async fn start(coord: &Coordinator, tenant: &str, workflow: &str, key: &str) -> Uuid {
    let (run, _) = coord
        .start_run(StartRun {
            tenant: tenant.into(),
            workflow: workflow.into(),
            input_json: "{}".into(),
            idempotency_key: key.into(),
            caller: "c".into(),
            caller_grants: strings(&["mcp.use"]),
        })
        .await
        .expect("start");
    run.run_id
}

/// A claim (no wait) of up to 10 tasks by `worker` with `caps` (`None`:
/// none named) for `tenants`: the claimed `(run, attempt)` pairs.
async fn claim(
    coord: &Coordinator,
    worker: &str,
    caps: Option<&[String]>,
    tenants: Option<&[String]>,
) -> Vec<(Uuid, i32)> {
    let filter = ClaimFilter {
        tenants,
        capabilities: caps,
    };
    coord
        .claim_matching(worker, 10, 0, filter)
        .await
        .expect("claim")
        .into_iter()
        .map(|t| (t.run_id, t.attempt))
        .collect()
}

async fn claims_take_only_the_tasks_capabilities_cover(backend: Backend) {
    let (db, store, coord) = setup(backend).await;
    let run_a = start(&coord, "t", "wa", "a").await;
    let run_b = start(&coord, "t", "wb", "b").await;
    let run_g = start(&coord, "t", "wg", "g").await;

    // No worker has claimed yet: every task is unclaimable, for want of a
    // worker at all.
    let all = coord.unclaimable_tasks(None).await.expect("unclaimable");
    assert_eq!(all.len(), 3, "{all:?}");
    assert!(
        all.iter()
            .all(|t| t.reason == "no live worker serves tenant `t`"),
        "{all:?}"
    );
    let g = all.iter().find(|t| t.run_id == run_g).expect("gpu task");
    assert_eq!(g.requires, ["http_base_url", "pool:gpu"]);
    // The backlog by the pool each task names ("" for none): what each
    // worker group's autoscaler selects.
    let counts = store.gauge_counts().await.expect("gauges");
    assert_eq!(
        counts.tasks_ready,
        [
            ("tool_call".to_owned(), String::new(), 2),
            ("tool_call".to_owned(), "gpu".to_owned(), 1)
        ]
    );

    let alpha = strings(&["mcp:alpha", "http_base_url"]);
    let beta = strings(&["mcp:beta", "model_provider:openai"]);
    assert_eq!(claim(&coord, "wa", Some(&alpha), None).await, [(run_a, 1)]);
    assert_eq!(claim(&coord, "wb", Some(&beta), None).await, [(run_b, 1)]);
    // Nothing else is theirs: the gpu task stays, and is shown unclaimable
    // for the one requirement no live worker has.
    assert!(claim(&coord, "wa", Some(&alpha), None).await.is_empty());
    let left = coord.unclaimable_tasks(None).await.expect("unclaimable");
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(
        (left[0].run_id, left[0].kind.as_str()),
        (run_g, "tool_call")
    );
    assert_eq!(left[0].missing, ["pool:gpu"]);
    assert_eq!(left[0].reason, "no live worker has pool:gpu");
    // The gpu pool's backlog leaves it out (no live worker has the pool:
    // more workers like the live ones would not take it), the shown zero
    // stays a series.
    let text = coord.metrics().render(&store, coord.live_window_ms()).await;
    for (series, want) in [
        (r#"belay_tasks_ready{kind="tool_call",pool="gpu"} "#, "0"),
        (r#"belay_tasks_ready{kind="tool_call",pool=""} "#, "0"),
        (r#"belay_tasks_unclaimable{kind="tool_call"} "#, "1"),
    ] {
        let value = text.lines().find_map(|l| l.strip_prefix(series));
        assert_eq!(value, Some(want), "{series} in\n{text}");
    }
    assert_eq!(
        coord
            .unclaimable_tasks(Some(run_g))
            .await
            .expect("of the run"),
        left
    );
    assert!(
        coord
            .unclaimable_tasks(Some(run_a))
            .await
            .expect("of the run")
            .is_empty()
    );
    // A worker with the pool but without the base URL cannot take it
    // either; one with both can, at its first attempt.
    let pool_only = strings(&["pool:gpu"]);
    assert!(
        claim(&coord, "wg0", Some(&pool_only), None)
            .await
            .is_empty()
    );
    let gpu = strings(&["pool:gpu", "http_base_url"]);
    assert_eq!(claim(&coord, "wg", Some(&gpu), None).await, [(run_g, 1)]);
    assert!(
        coord
            .unclaimable_tasks(None)
            .await
            .expect("unclaimable")
            .is_empty()
    );
    let live = store.live_workers(60_000).await.expect("live");
    let ids: Vec<&str> = live.iter().map(|w| w.worker_id.as_str()).collect();
    assert_eq!(ids, ["wa", "wb", "wg", "wg0"]);
    assert_eq!(live[2].capabilities.as_deref(), Some(&gpu[..]));
    store.close().await;
    db.drop().await;
}

async fn a_claim_without_capabilities_takes_any_task(backend: Backend) {
    let (db, store, coord) = setup(backend).await;
    let run_b = start(&coord, "t", "wb", "b").await;
    let run_g = start(&coord, "t", "wg", "g").await;
    let mut got = claim(&coord, "old", None, None).await;
    got.sort();
    let mut want = vec![(run_b, 1), (run_g, 1)];
    want.sort();
    assert_eq!(got, want);
    // It is live and counted as able to run anything.
    let run_a = start(&coord, "t", "wa", "a").await;
    assert!(
        coord
            .unclaimable_tasks(Some(run_a))
            .await
            .expect("unclaimable")
            .is_empty()
    );
    let live = store.live_workers(60_000).await.expect("live");
    assert_eq!(live.len(), 1);
    assert_eq!(
        (live[0].capabilities.as_ref(), live[0].tenants.as_ref()),
        (None, None)
    );
    store.close().await;
    db.drop().await;
}

async fn capabilities_never_widen_a_worker_keys_tenants(backend: Backend) {
    let (db, store, coord) = setup(backend).await;
    let run_t = start(&coord, "t", "wa", "a").await;
    let run_u = start(&coord, "u", "wa", "a").await;
    let alpha = strings(&["mcp:alpha"]);
    let only_u = strings(&["u"]);
    // A worker of tenant `u` that has everything `t`'s task needs gets
    // `u`'s task only.
    assert_eq!(
        claim(&coord, "wu", Some(&alpha), Some(&only_u)).await,
        [(run_u, 1)]
    );
    assert!(
        claim(&coord, "wu", Some(&alpha), Some(&only_u))
            .await
            .is_empty()
    );
    // And does not make `t`'s task claimable: no live worker serves `t`.
    let left = coord.unclaimable_tasks(None).await.expect("unclaimable");
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].run_id, run_t);
    assert_eq!(left[0].reason, "no live worker serves tenant `t`");
    let live = store.live_workers(60_000).await.expect("live");
    assert_eq!(live[0].tenants.as_deref(), Some(&only_u[..]));
    store.close().await;
    db.drop().await;
}

async fn a_worker_is_live_for_three_leases_by_the_engines_clock(backend: Backend) {
    let (db, store, coord) = setup(backend).await;
    let run_g = start(&coord, "t", "wg", "g").await;
    let alpha = strings(&["mcp:alpha"]);
    assert!(claim(&coord, "wa", Some(&alpha), None).await.is_empty());
    let left = coord.unclaimable_tasks(None).await.expect("unclaimable");
    assert_eq!(left[0].reason, "no live worker has http_base_url, pool:gpu");
    // Three leases (of 60 s) later by the engine's clock, `wa` is gone.
    store.advance_clock(180_001).await.expect("advance");
    assert!(
        store
            .live_workers(coord.live_window_ms())
            .await
            .expect("live")
            .is_empty()
    );
    let left = coord
        .unclaimable_tasks(Some(run_g))
        .await
        .expect("unclaimable");
    assert_eq!(left[0].reason, "no live worker serves tenant `t`");
    store.close().await;
    db.drop().await;
}

on_both_backends!(
    claims_take_only_the_tasks_capabilities_cover,
    a_claim_without_capabilities_takes_any_task,
    capabilities_never_widen_a_worker_keys_tenants,
    a_worker_is_live_for_three_leases_by_the_engines_clock,
);
