//! Identity end to end against a real engine on 127.0.0.1: the tenant and
//! grants of a request come from its key (a request narrows them, never
//! widens), events name the principal, an approval needs the approver's
//! grant, idempotent retries by another principal are refused, keys are
//! made, listed, revoked and expire through the admin endpoint, and a
//! revoked worker key stops at its next claim.

mod access_harness;
mod common;

use access_harness::{Fixture, authed, key_id};
use belay_engine::auth::Role;
use belay_proto::v1::worker_service_client::WorkerServiceClient;
use belay_proto::v1::{self, run_service_client::RunServiceClient};
use common::Backend;
use serde_json::{Value, json};
use tonic::Code;

fn start(workflow: &str, key: &str, grants: &[&str]) -> v1::StartRunRequest {
    v1::StartRunRequest {
        tenant: String::new(),
        workflow: workflow.into(),
        input_json: r#"{"email":"e"}"#.into(),
        idempotency_key: key.into(),
        caller: String::new(),
        caller_grants: grants.iter().map(|g| (*g).to_owned()).collect(),
    }
}

async fn first_event(f: &Fixture, run_id: &str) -> Value {
    let events = f
        .store()
        .list_events(run_id.parse().expect("uuid"), 0, 1)
        .await
        .expect("events");
    events[0].payload.clone()
}

async fn grants_and_caller_come_from_the_key(backend: Backend) {
    let f = Fixture::start(backend).await;
    let mut runs = RunServiceClient::new(f.channel());
    let client = f.key("a", Role::Client);
    let widened = runs
        .start_run(authed(
            start("w", "k-wide", &["crm.write", "payments.refund"]),
            &client,
        ))
        .await
        .expect_err("a request cannot widen its key's grants");
    assert_eq!(widened.code(), Code::PermissionDenied);
    assert!(
        widened.message().contains("payments.refund"),
        "{}",
        widened.message()
    );
    let run = runs
        .start_run(authed(start("w", "k-1", &[]), &client))
        .await
        .expect("start")
        .into_inner()
        .run
        .expect("run");
    assert_eq!(
        (run.tenant.as_str(), run.caller.as_str()),
        ("a", "a-client")
    );
    let started = first_event(&f, &run.run_id).await;
    assert_eq!(started["caller_grants"], json!(["crm.write"]), "{started}");
    assert_eq!(started["caller"], "a-client");
    // Someone acting through the key is recorded under it.
    let mut named = start("w", "k-2", &["crm.write"]);
    named.caller = "alice".into();
    let run = runs
        .start_run(authed(named, &client))
        .await
        .expect("start as alice")
        .into_inner()
        .run
        .expect("run");
    assert_eq!(run.caller, "a-client/alice");
    // The tenant field may only name the key's own tenant.
    let mut other = start("w", "k-3", &[]);
    other.tenant = "b".into();
    let refused = runs
        .start_run(authed(other, &client))
        .await
        .expect_err("tenant b");
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert!(
        refused.message().contains("`a`") && refused.message().contains("`b`"),
        "{}",
        refused.message()
    );
    f.stop().await;
}

async fn a_retry_by_another_principal_or_with_other_grants_is_refused(backend: Backend) {
    let f = Fixture::start(backend).await;
    let store = f.store().clone();
    let mut runs = RunServiceClient::new(f.channel());
    let client = f.key("a", Role::Client);
    let first = runs
        .start_run(authed(start("w", "same-key", &[]), &client))
        .await
        .expect("start")
        .into_inner();
    let run_id = first.run.expect("run").run_id;
    let again = runs
        .start_run(authed(start("w", "same-key", &["crm.write"]), &client))
        .await
        .expect("the same request again")
        .into_inner();
    assert!(!again.created);
    assert_eq!(again.run.expect("run").run_id, run_id);
    let operator = f.key("a", Role::Operator);
    let by_other = runs
        .start_run(authed(start("w", "same-key", &[]), &operator))
        .await
        .expect_err("another principal");
    assert_eq!(by_other.code(), Code::FailedPrecondition);
    assert!(
        by_other.message().contains(&run_id),
        "{}",
        by_other.message()
    );
    // The same principal with a key of more grants, asking for them all.
    let wider = belay_engine::auth::mint_key(
        &store,
        "a-client",
        Role::Client,
        belay_engine::auth::Tenants::Only(vec!["a".into()]),
        vec!["crm.write".into(), "crm.delete".into()],
        "test",
    )
    .await
    .expect("mint");
    let other_grants = runs
        .start_run(authed(start("w", "same-key", &[]), &wider))
        .await
        .expect_err("other grants");
    assert_eq!(other_grants.code(), Code::FailedPrecondition);
    assert!(
        other_grants.message().contains("grants"),
        "{}",
        other_grants.message()
    );
    f.stop().await;
}

async fn an_approval_needs_the_approvers_own_grant(backend: Backend) {
    let f = Fixture::start(backend).await;
    let mut runs = RunServiceClient::new(f.channel());
    let run = runs
        .start_run(authed(
            start("early", "k-early", &[]),
            &f.key("a", Role::Client),
        ))
        .await
        .expect("start")
        .into_inner()
        .run
        .expect("run");
    let decide = |grants: &[&str]| v1::DecideApprovalRequest {
        tenant: String::new(),
        run_id: run.run_id.clone(),
        node: "approve".into(),
        approve: true,
        edited_subject_json: String::new(),
        approver: String::new(),
        approver_grants: grants.iter().map(|g| (*g).to_owned()).collect(),
        reason: "ok".into(),
        ..Default::default()
    };
    // The fixture's approver holds crm.write only: claiming ops.approve in
    // the request is widening, and without it the node's grant is missing.
    let approver = f.key("a", Role::Approver);
    for grants in [&["ops.approve"][..], &[][..]] {
        let refused = runs
            .decide_approval(authed(decide(grants), &approver))
            .await
            .expect_err("no ops.approve");
        assert_eq!(
            refused.code(),
            Code::PermissionDenied,
            "{grants:?}: {refused:?}"
        );
    }
    // Another tenant's approver asking for a grant it lacks is told the
    // tenant is not its own (the real reason), not that it lacks the grant.
    let mut other = decide(&["ops.approve"]);
    other.tenant = "a".into();
    let refused = runs
        .decide_approval(authed(other, &f.key("b", Role::Approver)))
        .await
        .expect_err("another tenant");
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert!(
        refused.message().contains("tenant") && !refused.message().contains("ops.approve"),
        "{}",
        refused.message()
    );
    let store = f.store().clone();
    let holder = belay_engine::auth::mint_key(
        &store,
        "grace",
        Role::Approver,
        belay_engine::auth::Tenants::Only(vec!["a".into()]),
        vec!["ops.approve".into()],
        "test",
    )
    .await
    .expect("mint");
    runs.decide_approval(authed(decide(&[]), &holder))
        .await
        .expect("approved by a holder of ops.approve");
    let events = store
        .list_events(run.run_id.parse().expect("uuid"), 0, 100)
        .await
        .expect("events");
    let decided: Vec<&Value> = events
        .iter()
        .filter(|e| e.kind == "approval_decided")
        .map(|e| &e.payload)
        .collect();
    assert_eq!(decided.len(), 1, "{decided:?}");
    assert_eq!(decided[0]["by"], "grace", "{}", decided[0]);
    f.stop().await;
}

async fn keys_are_made_listed_revoked_and_expire_through_the_admin_endpoint(backend: Backend) {
    let f = Fixture::start(backend).await;
    let http = reqwest::Client::new();
    let keys_url = format!("{}/admin/v1/keys", f.admin_url());
    let operator = f.key("a", Role::Operator);
    let create = |body: Value| {
        http.post(&keys_url)
            .bearer_auth(&operator)
            .json(&body)
            .send()
    };
    let made = create(json!({"principal": "svc", "role": "client", "grants": ["crm.write"]}))
        .await
        .expect("create");
    assert_eq!(made.status().as_u16(), 201);
    let made: Value = made.json().await.expect("json");
    let key = made["key"].as_str().expect("key shown once").to_owned();
    assert_eq!(
        made["tenants"],
        json!(["a"]),
        "the operator's tenant by default"
    );
    for refused in [
        json!({"principal": "root2", "role": "admin", "tenants": ["*"]}),
        json!({"principal": "svc", "role": "client", "tenants": ["b"]}),
        // Grants the operator does not hold itself.
        json!({"principal": "svc2", "role": "client", "grants": ["payments.refund"]}),
        // An id in use by keys the operator does not manage (tenant b's).
        json!({"principal": "b-client", "role": "approver"}),
    ] {
        let status = create(refused.clone()).await.expect("create").status();
        assert_eq!(status.as_u16(), 403, "{refused}");
    }
    let bad = create(json!({"principal": "a/b", "role": "root"}))
        .await
        .expect("create");
    assert_eq!(bad.status().as_u16(), 400);
    let listed: Value = http
        .get(&keys_url)
        .bearer_auth(&operator)
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    let text = listed.to_string();
    assert!(
        !text.contains(&key[23..]) && !text.contains("secret_sha256"),
        "{text}"
    );
    // The new key works on the gRPC API at once.
    let mut runs = RunServiceClient::new(f.channel());
    let get = |key: &str| {
        authed(
            v1::GetRunRequest {
                tenant: String::new(),
                run_id: f.run_id().to_owned(),
            },
            key,
        )
    };
    runs.get_run(get(&key)).await.expect("the new key works");
    let revoked = http
        .post(format!("{keys_url}/{}/revoke", key_id(&key)))
        .bearer_auth(&operator)
        .send()
        .await
        .expect("revoke");
    assert_eq!(revoked.status().as_u16(), 200);
    let refused = runs.get_run(get(&key)).await.expect_err("revoked");
    assert_eq!(refused.code(), Code::Unauthenticated);
    assert!(
        refused.message().contains("revoked"),
        "{}",
        refused.message()
    );
    // A key that expires, by the database clock.
    let short: Value =
        create(json!({"principal": "tmp", "role": "client", "expires_in_seconds": 60}))
            .await
            .expect("create")
            .json()
            .await
            .expect("json");
    let short = short["key"].as_str().expect("key").to_owned();
    runs.get_run(get(&short)).await.expect("valid for a minute");
    f.store().advance_clock(61_000).await.expect("clock");
    let expired = runs.get_run(get(&short)).await.expect_err("expired");
    assert_eq!(expired.code(), Code::Unauthenticated);
    assert!(
        expired.message().contains("expired"),
        "{}",
        expired.message()
    );
    f.stop().await;
}

async fn a_revoked_worker_key_stops_at_its_next_claim(backend: Backend) {
    let f = Fixture::start(backend).await;
    let store = f.store().clone();
    let worker = access_harness::mint(&store, "a", Role::Worker).await;
    let mut client = WorkerServiceClient::new(f.channel());
    let claim = |key: &str| {
        authed(
            v1::ClaimTasksRequest {
                worker_id: "w9".into(),
                max_tasks: 4,
                wait_ms: 0,
                capabilities: None,
            },
            key,
        )
    };
    client
        .claim_tasks(claim(&worker))
        .await
        .expect("claims while valid");
    // A long poll that outlives the key hands out nothing: revoked while it
    // waits, it ends UNAUTHENTICATED when a task turns up.
    let waiting = {
        let mut client = client.clone();
        let key = worker.clone();
        tokio::spawn(async move {
            let mut req = claim(&key);
            req.get_mut().wait_ms = 20_000;
            client.claim_tasks(req).await
        })
    };
    // Revoked through this engine's admin endpoint: the key it verified
    // moments ago (and keeps for `--key-cache-ms`) is forgotten at once.
    let revoked = reqwest::Client::new()
        .post(format!(
            "{}/admin/v1/keys/{}/revoke",
            f.admin_url(),
            key_id(&worker)
        ))
        .bearer_auth(f.key("a", Role::Operator))
        .send()
        .await
        .expect("revoke");
    assert_eq!(revoked.status().as_u16(), 200);
    let mut runs = RunServiceClient::new(f.channel());
    runs.start_run(authed(
        start("w", "wake-the-claim", &[]),
        &f.key("a", Role::Client),
    ))
    .await
    .expect("a run, so a task is ready");
    let answered = waiting
        .await
        .expect("join")
        .expect_err("revoked while waiting");
    assert_eq!(answered.code(), Code::Unauthenticated, "{answered:?}");
    let refused = client
        .claim_tasks(claim(&worker))
        .await
        .expect_err("revoked");
    assert_eq!(refused.code(), Code::Unauthenticated);
    f.stop().await;
}

on_both_backends!(
    grants_and_caller_come_from_the_key,
    a_retry_by_another_principal_or_with_other_grants_is_refused,
    an_approval_needs_the_approvers_own_grant,
    keys_are_made_listed_revoked_and_expire_through_the_admin_endpoint,
    a_revoked_worker_key_stops_at_its_next_claim,
);
