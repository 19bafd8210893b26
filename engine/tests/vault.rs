//! The run secret vault (`RESULT_SECRETS` / `SECRET_ACCESS`) on both
//! backends, driven through the coordinator as workers drive it (claim,
//! dispatch, complete): a producer's values are sealed into `run_secrets`
//! in the transaction of its result, never in an event; a consumer's
//! dispatch reads the keys its tool may read (`consumers`), not expired by
//! the engine's clock (moved with `Store::advance_clock`), a single-use one
//! only by the call that consumed it (and that call's retries); the rows go
//! when the run ends. Without a vault key a producer is refused before it
//! acts; a key that does not open a row reads nothing.

mod common;
use common::{Backend, TestDb};

use std::sync::Arc;

use belay_engine::coordinator::{Coordinator, CoordinatorConfig, CoordinatorError, StartRun};
use belay_engine::machine::FailureClass;
use belay_engine::store::{ClaimedTask, Store};
use belay_engine::vault::{SecretText, VaultKey};
use serde_json::{Value, json};
use uuid::Uuid;

const TENANT: &str = "t";
const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const OTP: &str = "otp-5b1e-77f3";
const SESSION: &str = "sess-9c2d-40aa";
const SCOPED: &str = "scoped-1f0e-8e21";

const TOOLS: &str = r#"TOOLS:
  request_otp(n: number) -> {otp: string, session: string, scoped: string, expires_in: number}
    type: http
    endpoint: "/otp"
    permission: p.use
    repeat_safety: never
    RESULT_SECRETS:
      otp -> txn_otp (consumers: [use_otp], single_use: true)
      session -> session (ttl: 300)
      scoped -> scoped (consumers: [use_otp])

  use_otp(n: number) -> object
    type: http
    endpoint: "/use"
    method: POST
    headers:
      X-OTP-Token: "{{_secret.txn_otp}}"
    permission: p.use
    repeat_safety: idempotent
    SECRET_ACCESS:
      READ: [txn_otp, session, scoped]

  other_reader(n: number) -> object
    type: http
    endpoint: "/other"
    permission: p.use
    repeat_safety: idempotent
    SECRET_ACCESS:
      READ: [txn_otp, session, scoped]
"#;

const FLOWS: &str = r#"kind: workflow
name: vault_flow
nodes:
  - {id: produce, type: tool, tool: request_otp, args: {n: "${ .input.n }"}, grants: [p.use], next: use}
  - {id: use, type: tool, tool: use_otp, args: {n: 1}, grants: [p.use], next: again}
  - {id: again, type: tool, tool: use_otp, args: {n: 2}, grants: [p.use], next: other}
  - {id: other, type: tool, tool: other_reader, args: {n: 3}, grants: [p.use], next: done}
  - {id: done, type: succeed}
"#;

struct Env {
    db: TestDb,
    store: Store,
    coord: Arc<Coordinator>,
}

impl Env {
    async fn new(backend: Backend, key: Option<&str>) -> Env {
        let db = TestDb::create(backend, "belay_vault").await;
        let store = db.store(8).await;
        let coord = common::coordinator(store.clone(), &[TENANT], TOOLS, FLOWS, &["p.use"]).await;
        if let Some(key) = key {
            coord
                .use_vault_key(VaultKey::parse(key).expect("key"))
                .expect("vault key");
        }
        Env { db, store, coord }
    }

    /// Another coordinator on the same database (another engine replica).
    fn replica(&self, key: Option<&str>) -> Arc<Coordinator> {
        let coord = Coordinator::new(self.store.clone(), CoordinatorConfig::default());
        if let Some(key) = key {
            coord
                .use_vault_key(VaultKey::parse(key).expect("key"))
                .expect("vault key");
        }
        coord
    }

    async fn finish(self) {
        self.store.close().await;
        self.db.drop().await;
    }

    async fn start(&self, n: u32) -> Uuid {
        let (run, _) = self
            .coord
            .start_run(StartRun {
                tenant: TENANT.into(),
                workflow: "vault_flow".into(),
                input_json: json!({"n": n}).to_string(),
                idempotency_key: format!("vault-{n}"),
                caller: "app".into(),
                caller_grants: vec!["p.use".into()],
            })
            .await
            .expect("start");
        run.run_id
    }

    async fn claim_one(&self) -> ClaimedTask {
        let mut tasks = self.coord.claim("w1", 64, 0).await.expect("claim");
        assert_eq!(tasks.len(), 1, "one ready task");
        tasks.remove(0)
    }

    /// Dispatch as worker `w1` through `coord`: the vault values, by key.
    async fn dispatch_on(
        coord: &Coordinator,
        task: &ClaimedTask,
    ) -> Result<Vec<(String, String)>, CoordinatorError> {
        let d = coord
            .dispatch_call("w1", &task.task_id.to_string(), task.attempt as u32)
            .await?;
        Ok(d.secrets
            .into_iter()
            .map(|(k, v)| (k, v.into_inner()))
            .collect())
    }

    async fn dispatch(&self, task: &ClaimedTask) -> Vec<(String, String)> {
        Env::dispatch_on(&self.coord, task).await.expect("dispatch")
    }

    /// The producer's result as a worker reports it: `otp` and `scoped`
    /// taken out (markers left), `session` left in the result (the engine
    /// takes it out itself).
    async fn produce_on(&self, coord: &Coordinator, task: &ClaimedTask) {
        let result = json!({
            "otp": "[VAULTED:txn_otp]",
            "session": SESSION,
            "scoped": "[VAULTED:scoped]",
            "expires_in": 300,
        });
        coord
            .complete_with_secrets(
                "w1",
                &task.task_id.to_string(),
                task.attempt as u32,
                &result.to_string(),
                vec![
                    ("txn_otp".into(), SecretText::new(OTP.into())),
                    ("scoped".into(), SecretText::new(SCOPED.into())),
                    ("undeclared".into(), SecretText::new("x-undeclared".into())),
                ],
            )
            .await
            .expect("complete");
    }

    async fn complete(&self, task: &ClaimedTask) {
        self.coord
            .complete("w1", &task.task_id.to_string(), task.attempt as u32, "{}")
            .await
            .expect("complete");
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

    async fn status(&self, run: Uuid) -> String {
        self.store
            .get_run(TENANT, run)
            .await
            .expect("run")
            .expect("exists")
            .status
    }

    /// Every row of `run_secrets` and `events`, as text.
    async fn raw_text(&self) -> String {
        let raw = self.db.raw().await;
        let mut rows = raw.dump("run_secrets", "key").await;
        rows.extend(raw.dump("events", "run_id, seq").await);
        rows.extend(raw.dump("tasks", "task_id").await);
        rows.join("\n")
    }
}

fn keys(secrets: &[(String, String)]) -> Vec<&str> {
    let mut keys: Vec<&str> = secrets.iter().map(|(k, _)| k.as_str()).collect();
    keys.sort_unstable();
    keys
}

fn value<'a>(secrets: &'a [(String, String)], key: &str) -> Option<&'a str> {
    secrets
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

async fn a_single_use_value_is_read_by_one_call_and_its_retries_only(backend: Backend) {
    let env = Env::new(backend, Some(KEY)).await;
    let run = env.start(1).await;
    let produce = env.claim_one().await;
    // The producer reads nothing.
    assert!(env.dispatch(&produce).await.is_empty());
    env.produce_on(&env.coord, &produce).await;

    // Recorded: markers and keys, never a value (the session value the
    // worker left in the result is taken out by the engine).
    let events = env.events(run).await;
    let completed = events
        .iter()
        .find(|e| e["type"] == "tool_call_completed")
        .expect("completed");
    assert_eq!(
        completed["result"],
        json!({"otp": "[VAULTED:txn_otp]", "session": "[VAULTED:session]", "scoped": "[VAULTED:scoped]", "expires_in": 300})
    );
    let vaulted = events
        .iter()
        .find(|e| e["type"] == "secrets_vaulted")
        .expect("secrets_vaulted");
    let vaulted_keys: Vec<&str> = vaulted["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .filter_map(|k| k["key"].as_str())
        .collect();
    assert_eq!(vaulted_keys, ["txn_otp", "session", "scoped"]);
    let rows = env.store.run_secrets(run).await.expect("rows");
    assert_eq!(
        rows.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(),
        ["scoped", "session", "txn_otp"]
    );
    assert!(rows[1].expires_at.is_some() && rows[0].expires_at.is_none());
    assert_eq!(rows[2].consumers, ["use_otp"]);
    assert!(rows[2].single_use && rows[2].consumed_by_call.is_none());
    let raw = env.raw_text().await;
    for secret in [OTP, SESSION, SCOPED, "x-undeclared"] {
        assert!(!raw.contains(secret), "`{secret}` is stored in clear");
    }

    // The consumer's first call reads all three and consumes the OTP; a
    // repeated dispatch of the same attempt (its reply lost) and a retry
    // after NOT_SENT read it again.
    let use_task = env.claim_one().await;
    let first = env.dispatch(&use_task).await;
    assert_eq!(keys(&first), ["scoped", "session", "txn_otp"]);
    assert_eq!(value(&first, "txn_otp"), Some(OTP));
    assert_eq!(value(&first, "session"), Some(SESSION));
    assert_eq!(value(&first, "scoped"), Some(SCOPED));
    assert_eq!(env.dispatch(&use_task).await, first);
    let rows = env.store.run_secrets(run).await.expect("rows");
    assert_eq!(rows[2].consumed_by_call.as_deref(), Some("use.t1"));
    env.coord
        .fail(
            "w1",
            &use_task.task_id.to_string(),
            use_task.attempt as u32,
            "could not connect",
            FailureClass::NotSent,
            None,
        )
        .await
        .expect("fail");
    env.store
        .expire_task_timers(Some(use_task.task_id))
        .await
        .expect("due now");
    let retry = env.claim_one().await;
    assert_eq!(retry.attempt, 2);
    assert_eq!(value(&env.dispatch(&retry).await, "txn_otp"), Some(OTP));
    env.complete(&retry).await;

    // Another call of the same tool: the OTP is gone, the others stay.
    let again = env.claim_one().await;
    assert_eq!(keys(&env.dispatch(&again).await), ["scoped", "session"]);
    env.complete(&again).await;

    // A tool `consumers` does not name reads neither the OTP nor `scoped`.
    let other = env.claim_one().await;
    assert_eq!(keys(&env.dispatch(&other).await), ["session"]);
    env.complete(&other).await;

    // The run ended: its vault is gone.
    assert_eq!(env.status(run).await, "completed");
    assert!(env.store.run_secrets(run).await.expect("rows").is_empty());
    env.finish().await;
}

async fn a_value_past_its_ttl_is_not_read(backend: Backend) {
    let env = Env::new(backend, Some(KEY)).await;
    let run = env.start(2).await;
    let produce = env.claim_one().await;
    env.dispatch(&produce).await;
    env.produce_on(&env.coord, &produce).await;
    // `session` has `ttl: 300`: gone after 301 s by the engine's clock;
    // the others live until the run ends.
    env.store.advance_clock(301_000).await.expect("clock");
    let use_task = env.claim_one().await;
    assert_eq!(keys(&env.dispatch(&use_task).await), ["scoped", "txn_otp"]);
    // A cancelled run drops its vault too.
    env.coord
        .cancel_run(TENANT, &run.to_string(), "done with it")
        .await
        .expect("cancel");
    assert!(env.store.run_secrets(run).await.expect("rows").is_empty());
    env.finish().await;
}

async fn without_a_vault_key_a_producer_is_refused_before_it_acts(backend: Backend) {
    let env = Env::new(backend, None).await;
    let run = env.start(3).await;
    let produce = env.claim_one().await;
    let refused = Env::dispatch_on(&env.coord, &produce)
        .await
        .expect_err("refused");
    let CoordinatorError::FailedPrecondition(message) = refused else {
        panic!("{refused:?}")
    };
    assert!(message.contains("BELAY_VAULT_KEY"), "{message}");
    let events = env.events(run).await;
    assert!(
        !events.iter().any(|e| e["type"] == "tool_call_dispatched"),
        "{events:?}"
    );
    let failed = events
        .iter()
        .find(|e| e["type"] == "tool_call_failed")
        .expect("the call failed");
    assert!(
        failed["error"]
            .as_str()
            .is_some_and(|m| m.contains("no vault key")),
        "{failed}"
    );
    assert_eq!(env.status(run).await, "failed");

    // A result that reaches an engine without a key (dispatched by one
    // with it) fails its call: the values are never kept unencrypted, and
    // the result is not recorded as if whole.
    let run = env.start(4).await;
    let produce = env.claim_one().await;
    let keyed = env.replica(Some(KEY));
    Env::dispatch_on(&keyed, &produce).await.expect("dispatch");
    env.produce_on(&env.coord, &produce).await;
    let events = env.events(run).await;
    assert!(!events.iter().any(|e| e["type"] == "tool_call_completed"));
    let failed = events
        .iter()
        .find(|e| e["type"] == "tool_call_failed")
        .expect("the call failed");
    assert!(
        failed["error"]
            .as_str()
            .is_some_and(|m| m.contains("result was dropped")),
        "{failed}"
    );
    let raw = env.raw_text().await;
    for secret in [OTP, SESSION, SCOPED] {
        assert!(!raw.contains(secret), "`{secret}` was recorded");
    }
    assert!(env.store.run_secrets(run).await.expect("rows").is_empty());
    env.finish().await;
}

async fn a_value_sealed_under_another_key_is_not_read(backend: Backend) {
    let env = Env::new(backend, Some(KEY)).await;
    env.start(5).await;
    let produce = env.claim_one().await;
    env.dispatch(&produce).await;
    env.produce_on(&env.coord, &produce).await;
    let use_task = env.claim_one().await;
    let rekeyed = env.replica(Some(&"ab".repeat(32)));
    let read = Env::dispatch_on(&rekeyed, &use_task)
        .await
        .expect("dispatch");
    assert!(read.is_empty(), "{read:?}");
    env.finish().await;
}

on_both_backends!(
    a_single_use_value_is_read_by_one_call_and_its_retries_only,
    a_value_past_its_ttl_is_not_read,
    without_a_vault_key_a_producer_is_refused_before_it_acts,
    a_value_sealed_under_another_key_is_not_read,
);
