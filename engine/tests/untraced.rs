//! `visibility: {trace: false}` on both backends, driven through the
//! coordinator as workers drive it: the value the model sends is taken out
//! of its answer before anything is recorded, sealed into `run_secrets` in
//! the transaction that schedules the call, and handed back only by the
//! call's dispatch, also by another engine replica after the first one is
//! gone (a crash between scheduling and dispatch loses nothing), and to a
//! retry; no row of events, tasks, runs or the admin audit holds it, and
//! the run's vault goes when the run ends. Without a vault key the call is
//! refused before it can act.

mod common;
use common::{Backend, TestDb, claim_of};

use std::sync::Arc;

use belay_engine::coordinator::{Coordinator, CoordinatorConfig, CoordinatorError, StartRun};
use belay_engine::machine::FailureClass;
use belay_engine::store::Store;
use belay_engine::vault::VaultKey;
use belay_proto::wire::{ModelCallResult, ToolUse, Usage};
use serde_json::{Value, json};
use uuid::Uuid;

const TENANT: &str = "acme";
const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const CARD: &str = "4929-7745-0198-3321";
const TOKENS: &str = "ops:ops-token-0123456789";

const TOOLS: &str = r#"TOOLS:
  pay(card: string, amount: number) -> {ok: boolean}
    description: "Charge a card"
    type: http
    endpoint: "/pay"
    method: POST
    permission: pay.charge
    repeat_safety: idempotent
    parameters:
      card:
        description: "The card number the customer gave"
        visibility: {trace: false}
"#;
const AGENT: &str = "kind: agent\nname: a\nmodel: m\ninstructions: i\ntools: [pay]\ngrants: [pay.charge]\n---\nkind: workflow\nname: w\nnodes:\n  - id: n\n    type: agent\n    agent: a\n";

struct Env {
    db: TestDb,
    store: Store,
    coord: Arc<Coordinator>,
    admin: String,
}

impl Env {
    async fn new(backend: Backend, key: Option<&str>) -> Env {
        let db = TestDb::create(backend, "belay_untraced").await;
        let store = db.store(8).await;
        let coord =
            common::coordinator(store.clone(), &[TENANT], TOOLS, AGENT, &["pay.charge"]).await;
        if let Some(key) = key {
            coord
                .use_vault_key(VaultKey::parse(key).expect("key"))
                .expect("vault key");
        }
        let admin = common::serve_admin(&coord, TOKENS).await;
        Env {
            db,
            store,
            coord,
            admin,
        }
    }

    /// Another engine on the same database, as after a restart.
    fn replica(&self, key: Option<&str>) -> Arc<Coordinator> {
        let coord = Coordinator::new(self.store.clone(), CoordinatorConfig::default());
        if let Some(key) = key {
            coord
                .use_vault_key(VaultKey::parse(key).expect("key"))
                .expect("vault key");
        }
        coord
    }

    async fn start(&self) -> Uuid {
        let (run, _) = self
            .coord
            .start_run(StartRun {
                tenant: TENANT.into(),
                workflow: "w".into(),
                input_json: "{}".into(),
                idempotency_key: "k1".into(),
                caller: "app".into(),
                caller_grants: vec!["pay.charge".into()],
            })
            .await
            .expect("start");
        run.run_id
    }

    /// The model's turn: it proposes `pay` with `arguments`, or answers.
    async fn turn(&self, coord: &Coordinator, run: Uuid, arguments: Option<&str>) {
        let model = claim_of(coord, "w1", run, "model_call").await;
        let result = ModelCallResult {
            content: arguments.is_none().then(|| "done".to_owned()),
            tool_calls: arguments
                .map(|a| ToolUse {
                    id: "tu1".into(),
                    name: "pay".into(),
                    arguments: a.into(),
                })
                .into_iter()
                .collect(),
            usage: Usage::default(),
            finish_reason: None,
        };
        coord
            .complete(
                "w1",
                &model.task_id.to_string(),
                model.attempt as u32,
                &serde_json::to_string(&result).expect("json"),
            )
            .await
            .expect("complete model call");
    }

    async fn events(&self, run: Uuid) -> Vec<Value> {
        self.store
            .list_events(run, 0, 1000)
            .await
            .expect("events")
            .into_iter()
            .map(|e| e.payload)
            .collect()
    }

    /// Every row of the tables a run writes, and the admin audit and
    /// run pages, as text.
    async fn everything(&self, run: Uuid) -> String {
        let raw = self.db.raw().await;
        let mut rows = Vec::new();
        for (table, order) in [
            ("events", "run_id, seq"),
            ("tasks", "task_id"),
            ("runs", "run_id"),
            ("run_secrets", "key"),
        ] {
            rows.extend(raw.dump(table, order).await);
        }
        let http = reqwest::Client::new();
        for path in [
            format!("/admin/v1/tenants/{TENANT}/tool-calls"),
            format!("/admin/v1/tenants/{TENANT}/runs/{run}"),
        ] {
            let response = http
                .get(format!("{}{path}", self.admin))
                .bearer_auth("ops-token-0123456789")
                .send()
                .await
                .expect("admin");
            assert_eq!(response.status(), reqwest::StatusCode::OK, "{path}");
            let body = response.text().await.expect("body");
            rows.push(body);
        }
        rows.join("\n")
    }

    async fn finish(self) {
        self.store.close().await;
        self.db.drop().await;
    }
}

async fn an_untraced_value_survives_a_restart_in_the_vault_and_is_in_no_record(backend: Backend) {
    let env = Env::new(backend, Some(KEY)).await;
    let run = env.start().await;
    env.turn(
        &env.coord,
        run,
        Some(&format!(r#"{{"card": "{CARD}", "amount": 12}}"#)),
    )
    .await;

    // Scheduled with a placeholder; the value sealed in `run_secrets`.
    let events = env.events(run).await;
    let scheduled = events
        .iter()
        .find(|e| e["type"] == "tool_call_scheduled")
        .expect("scheduled");
    let placeholder = scheduled["arguments"]["card"].as_str().expect("card");
    assert!(placeholder.starts_with("{{_secret._arg_"), "{placeholder}");
    assert_eq!(scheduled["arguments"]["amount"], json!(12));
    let rows = env.store.run_secrets(run).await.expect("rows");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].consumers, ["pay"]);
    assert!(!rows[0].single_use);
    let everything = env.everything(run).await;
    assert!(
        everything.contains("_arg_"),
        "the audit shows the placeholder"
    );
    assert!(!everything.contains(CARD), "the value is recorded");
    assert!(!everything.contains(&CARD.replace('-', "")));

    // The engine that scheduled the call is gone; another one dispatches.
    let replica = env.replica(Some(KEY));
    let task = claim_of(&replica, "w1", run, "tool_call").await;
    let dispatched = replica
        .dispatch_call("w1", &task.task_id.to_string(), task.attempt as u32)
        .await
        .expect("dispatch");
    let secrets: Vec<(String, String)> = dispatched
        .secrets
        .into_iter()
        .map(|(k, v)| (k, v.into_inner()))
        .collect();
    assert_eq!(secrets.len(), 1);
    assert_eq!(format!("{{{{_secret.{}}}}}", secrets[0].0), placeholder);
    assert_eq!(secrets[0].1, CARD);

    // A retry (the first attempt sent nothing) reads it again.
    replica
        .fail(
            "w1",
            &task.task_id.to_string(),
            task.attempt as u32,
            "connection refused",
            FailureClass::NotSent,
            None,
        )
        .await
        .expect("fail");
    env.store
        .expire_task_timers(Some(task.task_id))
        .await
        .expect("due now");
    let retry = claim_of(&replica, "w1", run, "tool_call").await;
    assert_eq!(retry.attempt, 2);
    let again = replica
        .dispatch_call("w1", &retry.task_id.to_string(), 2)
        .await
        .expect("dispatch");
    assert_eq!(
        again.secrets.first().map(|(_, v)| v.expose().to_owned()),
        Some(CARD.to_owned())
    );
    replica
        .complete("w1", &retry.task_id.to_string(), 2, r#"{"ok": true}"#)
        .await
        .expect("complete");
    env.turn(&replica, run, None).await;
    let status = env
        .store
        .get_run(TENANT, run)
        .await
        .expect("run")
        .expect("exists")
        .status;
    assert_eq!(status, "completed");
    assert!(env.store.run_secrets(run).await.expect("rows").is_empty());
    assert!(!env.everything(run).await.contains(CARD));
    env.finish().await;
}

async fn without_a_vault_key_an_untraced_call_is_refused_before_it_acts(backend: Backend) {
    let env = Env::new(backend, None).await;
    let run = env.start().await;
    env.turn(
        &env.coord,
        run,
        Some(&format!(r#"{{"card": "{CARD}", "amount": 12}}"#)),
    )
    .await;
    let events = env.events(run).await;
    let refused = events
        .iter()
        .find(|e| e["type"] == "tool_call_refused")
        .expect("refused");
    assert_eq!(refused["check"], "vault");
    assert!(
        refused["reason"]
            .as_str()
            .is_some_and(|r| r.contains("BELAY_VAULT_KEY")),
        "{refused}"
    );
    assert!(!events.iter().any(|e| e["type"] == "tool_call_scheduled"));
    assert!(env.store.run_secrets(run).await.expect("rows").is_empty());
    assert!(!env.everything(run).await.contains(CARD));
    // The model hears it (its next turn is scheduled) and answers.
    env.turn(&env.coord, run, None).await;
    env.finish().await;
}

async fn a_call_scheduled_with_a_key_is_not_dispatched_by_an_engine_without_one(backend: Backend) {
    let env = Env::new(backend, Some(KEY)).await;
    let run = env.start().await;
    env.turn(
        &env.coord,
        run,
        Some(&format!(r#"{{"card": "{CARD}", "amount": 12}}"#)),
    )
    .await;
    let keyless = env.replica(None);
    let task = claim_of(&keyless, "w1", run, "tool_call").await;
    let refused = keyless
        .dispatch_call("w1", &task.task_id.to_string(), task.attempt as u32)
        .await
        .expect_err("refused");
    let CoordinatorError::FailedPrecondition(message) = refused else {
        panic!("{refused:?}")
    };
    assert!(
        message.contains("BELAY_VAULT_KEY") && message.contains("`card`"),
        "{message}"
    );
    assert!(!message.contains(CARD));
    let events = env.events(run).await;
    assert!(!events.iter().any(|e| e["type"] == "tool_call_dispatched"));
    env.finish().await;
}

on_both_backends!(
    an_untraced_value_survives_a_restart_in_the_vault_and_is_in_no_record,
    without_a_vault_key_an_untraced_call_is_refused_before_it_acts,
    a_call_scheduled_with_a_key_is_not_dispatched_by_an_engine_without_one,
);
