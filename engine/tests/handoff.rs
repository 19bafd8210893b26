//! A report that claims the next task (issue 23), through the real gRPC
//! API on both backends: `CompleteTask` with `claim_next` hands the worker
//! the run's next step, leased to it at attempt 1, in the same reply (a
//! claim afterwards finds nothing); without `claim_next` (a worker older
//! than it) nothing is handed out and the next step waits for a claim; a
//! report asking for two gets its run's next step and another ready one; a
//! worker key of another tenant is handed none of this tenant's tasks; a
//! report refused (a stale attempt) claims nothing. And the dispatch that
//! rides on the claim: an `idempotent` HTTP call is handed out already
//! dispatched (`Task.dispatched`), by a claim and by a report alike, and a
//! worker that asks anyway is told OK; a `never` call is dispatched only
//! when its worker asks; a grant withdrawn before the claim is refused at
//! the claim, and the worker is told so when it asks.

mod common;
use common::{Backend, TestDb};

use belay_engine::auth::{self, Role, Tenants};
use belay_engine::definitions::SourceFile;
use belay_engine::server::{Engine, EngineOptions, Listeners};
use belay_engine::store::Store;
use belay_proto::connect::{AuthChannel, ConnectOptions};
use belay_proto::v1;
use belay_proto::v1::run_service_client::RunServiceClient;
use belay_proto::v1::worker_service_client::WorkerServiceClient;

const TOOLS: &str = r#"TOOLS:
  noop(i: number) -> {ok: boolean}
    description: "does nothing"
    type: http
    endpoint: "/noop"
    permission: t.noop
    repeat_safety: idempotent
  once(i: number) -> {ok: boolean}
    description: "acts once"
    type: http
    endpoint: "/once"
    permission: t.noop
    repeat_safety: never
"#;

/// One `never` tool step.
const ONCE: &str = r#"kind: workflow
name: once
nodes:
  - id: only
    type: tool
    tool: once
    args: {i: 1}
    grants: [t.noop]
    next: done
  - id: done
    type: succeed
    output: "${ .nodes.only.output }"
"#;

/// Two tool steps, one after the other.
const TWO_STEPS: &str = r#"kind: workflow
name: two
nodes:
  - id: first
    type: tool
    tool: noop
    args: {i: 1}
    grants: [t.noop]
    next: second
  - id: second
    type: tool
    tool: noop
    args: {i: 2}
    grants: [t.noop]
    next: done
  - id: done
    type: succeed
    output: "${ .nodes.second.output }"
"#;

/// Three tool steps, one after the other.
const THREE_STEPS: &str = r#"kind: workflow
name: three
nodes:
  - {id: first, type: tool, tool: noop, args: {i: 1}, grants: [t.noop], next: second}
  - {id: second, type: tool, tool: noop, args: {i: 2}, grants: [t.noop], next: third}
  - {id: third, type: tool, tool: noop, args: {i: 3}, grants: [t.noop], next: done}
  - {id: done, type: succeed}
"#;

struct Fixture {
    db: TestDb,
    store: Store,
    url: String,
    stop: tokio::sync::oneshot::Sender<()>,
    served: tokio::task::JoinHandle<()>,
}

impl Fixture {
    async fn start(backend: Backend) -> Fixture {
        let db = TestDb::create(backend, "belay_handoff").await;
        let engine = Engine::start(EngineOptions::new(db.url.clone(), 4))
            .await
            .expect("engine");
        let store = engine.coordinator().store().clone();
        for tenant in ["a", "b"] {
            engine
                .coordinator()
                .register_bundle(
                    tenant,
                    vec![
                        SourceFile {
                            path: "t.tools.abl".into(),
                            content: TOOLS.into(),
                        },
                        SourceFile {
                            path: "two.yaml".into(),
                            content: TWO_STEPS.into(),
                        },
                        SourceFile {
                            path: "once.yaml".into(),
                            content: ONCE.into(),
                        },
                        SourceFile {
                            path: "three.yaml".into(),
                            content: THREE_STEPS.into(),
                        },
                    ],
                )
                .await
                .expect("register");
            store
                .set_tenant_grants(tenant, &["t.noop".to_owned()])
                .await
                .expect("grants");
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(async move {
            engine
                .serve(Listeners::grpc_only(listener), async {
                    let _ = stopped.await;
                })
                .await
                .expect("serve");
        });
        Fixture {
            db,
            store,
            url,
            stop,
            served,
        }
    }

    async fn key(&self, tenant: &str, role: Role) -> String {
        auth::mint_key(
            &self.store,
            &format!("{tenant}-{role}"),
            role,
            Tenants::Only(vec![tenant.to_owned()]),
            vec!["t.noop".into()],
            "test",
        )
        .await
        .expect("mint")
    }

    fn channel(&self, key: &str) -> AuthChannel {
        ConnectOptions::new(self.url.clone())
            .with_api_key(key)
            .connect_lazy()
            .expect("channel")
    }

    async fn start_run(&self, tenant: &str, key: &str) -> String {
        self.start_workflow(tenant, key, "two").await
    }

    async fn start_workflow(&self, tenant: &str, key: &str, workflow: &str) -> String {
        RunServiceClient::new(self.channel(key))
            .start_run(v1::StartRunRequest {
                tenant: tenant.into(),
                workflow: workflow.into(),
                input_json: "{}".into(),
                idempotency_key: format!("{tenant}-{workflow}-run"),
                ..Default::default()
            })
            .await
            .expect("start")
            .into_inner()
            .run
            .expect("run")
            .run_id
    }

    /// The kinds of run `run_id`'s events, in order.
    async fn event_kinds(&self, run_id: &str) -> Vec<String> {
        let id = uuid::Uuid::parse_str(run_id).expect("run id");
        self.store
            .list_events(id, 0, 1_000)
            .await
            .expect("events")
            .into_iter()
            .map(|e| e.kind)
            .collect()
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.served.await;
        self.db.drop().await;
    }
}

async fn claim(worker: &mut WorkerServiceClient<AuthChannel>, id: &str) -> Vec<v1::Task> {
    worker
        .claim_tasks(v1::ClaimTasksRequest {
            worker_id: id.into(),
            max_tasks: 8,
            wait_ms: 0,
            capabilities: None,
        })
        .await
        .expect("claim")
        .into_inner()
        .tasks
}

async fn dispatch(worker: &mut WorkerServiceClient<AuthChannel>, id: &str, task: &v1::Task) {
    worker
        .dispatch_tool_call(v1::DispatchToolCallRequest {
            worker_id: id.into(),
            task_id: task.task_id.clone(),
            attempt: task.attempt,
            ..Default::default()
        })
        .await
        .expect("dispatch");
}

fn completion(id: &str, task: &v1::Task, claim_next: u32) -> v1::CompleteTaskRequest {
    v1::CompleteTaskRequest {
        worker_id: id.into(),
        task_id: task.task_id.clone(),
        attempt: task.attempt,
        result_json: r#"{"ok":true}"#.into(),
        claim_next,
        ..Default::default()
    }
}

async fn a_report_hands_over_the_runs_next_step(backend: Backend) {
    let f = Fixture::start(backend).await;
    let client = f.key("a", Role::Client).await;
    let run_id = f.start_run("a", &client).await;
    let mut worker = WorkerServiceClient::new(f.channel(&f.key("a", Role::Worker).await));
    let first = claim(&mut worker, "w1").await;
    assert_eq!(first.len(), 1, "the first step is ready");
    dispatch(&mut worker, "w1", &first[0]).await;
    let handed = worker
        .complete_task(completion("w1", &first[0], 1))
        .await
        .expect("complete")
        .into_inner()
        .tasks;
    assert_eq!(handed.len(), 1, "the second step rides on the report");
    let second = &handed[0];
    assert_eq!(second.run_id, run_id);
    assert_eq!(second.attempt, 1);
    assert_ne!(second.task_id, first[0].task_id);
    assert!(second.spec_json.contains("\"i\":2"), "{}", second.spec_json);
    assert!(second.lease_ms > 0);
    assert!(
        claim(&mut worker, "w2").await.is_empty(),
        "the handed-over step is leased to w1"
    );
    dispatch(&mut worker, "w1", second).await;
    let after_last = worker
        .complete_task(completion("w1", second, 1))
        .await
        .expect("complete")
        .into_inner()
        .tasks;
    assert!(after_last.is_empty(), "the run has no step left");
    let run = RunServiceClient::new(f.channel(&client))
        .get_run(v1::GetRunRequest {
            tenant: "a".into(),
            run_id: run_id.clone(),
        })
        .await
        .expect("get")
        .into_inner()
        .run
        .expect("run");
    assert_eq!(run.status, "completed");
    f.stop().await;
}

async fn a_report_asking_for_two_gets_its_runs_next_step_and_another_ready_one(backend: Backend) {
    let f = Fixture::start(backend).await;
    let client = f.key("a", Role::Client).await;
    let first_run = f.start_run("a", &client).await;
    let mut worker = WorkerServiceClient::new(f.channel(&f.key("a", Role::Worker).await));
    let first = claim(&mut worker, "w1").await;
    let other_run = f.start_workflow("a", &client, "once").await;
    let handed = worker
        .complete_task(completion("w1", &first[0], 2))
        .await
        .expect("complete")
        .into_inner()
        .tasks;
    let runs: Vec<&str> = handed.iter().map(|t| t.run_id.as_str()).collect();
    assert_eq!(
        runs,
        [first_run.as_str(), other_run.as_str()],
        "the run's next step, handed by its transition, then the claim's"
    );
    assert!(handed[0].dispatched && !handed[1].dispatched, "{handed:?}");
    f.stop().await;
}

async fn a_report_without_claim_next_hands_over_nothing(backend: Backend) {
    let f = Fixture::start(backend).await;
    let client = f.key("a", Role::Client).await;
    f.start_run("a", &client).await;
    let mut worker = WorkerServiceClient::new(f.channel(&f.key("a", Role::Worker).await));
    let first = claim(&mut worker, "w1").await;
    dispatch(&mut worker, "w1", &first[0]).await;
    let handed = worker
        .complete_task(completion("w1", &first[0], 0))
        .await
        .expect("complete")
        .into_inner()
        .tasks;
    assert!(handed.is_empty());
    assert_eq!(
        claim(&mut worker, "w1").await.len(),
        1,
        "the next step is ready"
    );
    f.stop().await;
}

async fn another_tenants_worker_is_handed_none_of_this_tenants_steps(backend: Backend) {
    let f = Fixture::start(backend).await;
    // Tenant a's first step, claimed and left leased: its second step will
    // not be ready, but a's other run's first step is.
    let a_client = f.key("a", Role::Client).await;
    f.start_run("a", &a_client).await;
    let b_client = f.key("b", Role::Client).await;
    f.start_run("b", &b_client).await;
    let mut b_worker = WorkerServiceClient::new(f.channel(&f.key("b", Role::Worker).await));
    let b_first = claim(&mut b_worker, "wb").await;
    assert_eq!(b_first.len(), 1, "b's worker sees b's step only");
    dispatch(&mut b_worker, "wb", &b_first[0]).await;
    // Ready now: a's first step (never claimed) and b's second step.
    let handed = b_worker
        .complete_task(completion("wb", &b_first[0], 8))
        .await
        .expect("complete")
        .into_inner()
        .tasks;
    assert_eq!(handed.len(), 1, "only b's next step: {handed:?}");
    assert_eq!(handed[0].tenant, "b");
    let mut a_worker = WorkerServiceClient::new(f.channel(&f.key("a", Role::Worker).await));
    let a_ready = claim(&mut a_worker, "wa").await;
    assert_eq!(a_ready.len(), 1, "a's step is still ready for a's workers");
    assert_eq!(a_ready[0].tenant, "a");
    f.stop().await;
}

async fn a_refused_report_claims_nothing(backend: Backend) {
    let f = Fixture::start(backend).await;
    let client = f.key("a", Role::Client).await;
    f.start_run("a", &client).await;
    let mut worker = WorkerServiceClient::new(f.channel(&f.key("a", Role::Worker).await));
    let first = claim(&mut worker, "w1").await;
    dispatch(&mut worker, "w1", &first[0]).await;
    let mut stale = completion("w1", &first[0], 1);
    stale.attempt += 1;
    let refused = worker
        .complete_task(stale)
        .await
        .expect_err("a stale attempt is refused");
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    // The right report still works and hands over the second step.
    let handed = worker
        .complete_task(completion("w1", &first[0], 1))
        .await
        .expect("complete")
        .into_inner()
        .tasks;
    assert_eq!(handed.len(), 1);
    f.stop().await;
}

/// How many of `kinds` are `kind`.
fn count(kinds: &[String], kind: &str) -> usize {
    kinds.iter().filter(|k| *k == kind).count()
}

async fn an_idempotent_call_is_handed_out_dispatched(backend: Backend) {
    let f = Fixture::start(backend).await;
    let client = f.key("a", Role::Client).await;
    let run_id = f.start_run("a", &client).await;
    let mut worker = WorkerServiceClient::new(f.channel(&f.key("a", Role::Worker).await));
    let first = claim(&mut worker, "w1").await;
    assert!(first[0].dispatched, "an idempotent HTTP call");
    let spec: serde_json::Value = serde_json::from_str(&first[0].spec_json).expect("spec");
    assert_eq!(spec["dispatch_with_claim"], true);
    assert_eq!(spec["repeat_safety"], "idempotent", "for untraced logs too");
    let kinds = f.event_kinds(&run_id).await;
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("tool_call_dispatched")
    );
    // A worker that asks anyway (one older than `dispatched`) is told OK,
    // and nothing more is recorded.
    dispatch(&mut worker, "w1", &first[0]).await;
    assert_eq!(f.event_kinds(&run_id).await, kinds);
    let handed = worker
        .complete_task(completion("w1", &first[0], 1))
        .await
        .expect("complete")
        .into_inner()
        .tasks;
    assert!(handed[0].dispatched, "a report's next step too");
    worker
        .complete_task(completion("w1", &handed[0], 1))
        .await
        .expect("complete");
    let kinds = f.event_kinds(&run_id).await;
    assert_eq!(count(&kinds, "tool_call_dispatched"), 2, "{kinds:?}");
    assert_eq!(kinds.last().map(String::as_str), Some("run_completed"));
    f.stop().await;
}

async fn a_never_call_is_dispatched_only_when_its_worker_asks(backend: Backend) {
    let f = Fixture::start(backend).await;
    let client = f.key("a", Role::Client).await;
    let run_id = f.start_workflow("a", &client, "once").await;
    let mut worker = WorkerServiceClient::new(f.channel(&f.key("a", Role::Worker).await));
    let task = claim(&mut worker, "w1").await;
    assert!(!task[0].dispatched, "a `never` call");
    let spec: serde_json::Value = serde_json::from_str(&task[0].spec_json).expect("spec");
    assert_eq!(spec.get("dispatch_with_claim"), None, "false is left out");
    assert_eq!(spec["repeat_safety"], "never");
    assert_eq!(
        count(&f.event_kinds(&run_id).await, "tool_call_dispatched"),
        0
    );
    dispatch(&mut worker, "w1", &task[0]).await;
    assert_eq!(
        count(&f.event_kinds(&run_id).await, "tool_call_dispatched"),
        1
    );
    f.stop().await;
}

async fn a_grant_withdrawn_before_the_claim_is_refused_there(backend: Backend) {
    let f = Fixture::start(backend).await;
    let client = f.key("a", Role::Client).await;
    let run_id = f.start_run("a", &client).await;
    f.store.set_tenant_grants("a", &[]).await.expect("withdraw");
    let mut worker = WorkerServiceClient::new(f.channel(&f.key("a", Role::Worker).await));
    let first = claim(&mut worker, "w1").await;
    assert!(!first[0].dispatched, "refused: not dispatched");
    let kinds = f.event_kinds(&run_id).await;
    assert_eq!(count(&kinds, "tool_call_dispatched"), 0, "{kinds:?}");
    let refused = worker
        .dispatch_tool_call(v1::DispatchToolCallRequest {
            worker_id: "w1".into(),
            task_id: first[0].task_id.clone(),
            attempt: first[0].attempt,
            ..Default::default()
        })
        .await
        .expect_err("the attempt was refused at the claim");
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    f.stop().await;
}

/// A report of a step this engine handed over is decided without the
/// run's lock on PostgreSQL (`postgres/optimistic.rs`): when the hand-off
/// it makes would dispatch the next step on grants withdrawn since, its
/// one statement writes nothing and the report is answered ABORTED; sent
/// again, it is decided under the lock: recorded, and the next step, no
/// longer dispatchable, is claimed by the reply undispatched.
/// SQLite decides under the lock at once.
async fn a_report_racing_a_grant_withdrawal_is_decided_again(backend: Backend) {
    let f = Fixture::start(backend).await;
    let client = f.key("a", Role::Client).await;
    let run_id = f.start_workflow("a", &client, "three").await;
    let mut worker = WorkerServiceClient::new(f.channel(&f.key("a", Role::Worker).await));
    let first = claim(&mut worker, "w1").await;
    let handed = worker
        .complete_task(completion("w1", &first[0], 1))
        .await
        .expect("complete")
        .into_inner()
        .tasks;
    assert!(handed.len() == 1 && handed[0].dispatched, "{handed:?}");
    f.store.set_tenant_grants("a", &[]).await.expect("withdraw");
    let report = completion("w1", &handed[0], 1);
    if backend == Backend::Postgres {
        let raced = worker
            .complete_task(report.clone())
            .await
            .expect_err("the rows changed under the report");
        assert_eq!(raced.code(), tonic::Code::Aborted, "{raced:?}");
        let kinds = f.event_kinds(&run_id).await;
        assert_eq!(count(&kinds, "tool_call_completed"), 1, "{kinds:?}");
    }
    let again = worker
        .complete_task(report)
        .await
        .expect("complete")
        .into_inner()
        .tasks;
    // The third step is claimed by the reply's `claim_next`, undispatched.
    assert!(again.len() == 1 && !again[0].dispatched, "{again:?}");
    let kinds = f.event_kinds(&run_id).await;
    assert_eq!(count(&kinds, "tool_call_completed"), 2, "{kinds:?}");
    assert_eq!(count(&kinds, "tool_call_dispatched"), 2, "{kinds:?}");
    f.stop().await;
}

/// Every step of a run handed over by the reports before it, the middle
/// one's report decided without the run's lock on PostgreSQL: the run
/// completes with the history the locking transition writes.
async fn a_run_of_handed_steps_completes_alike(backend: Backend) {
    let f = Fixture::start(backend).await;
    let client = f.key("a", Role::Client).await;
    let run_id = f.start_workflow("a", &client, "three").await;
    let mut worker = WorkerServiceClient::new(f.channel(&f.key("a", Role::Worker).await));
    let mut task = claim(&mut worker, "w1").await.remove(0);
    for step in 1..=3 {
        let handed = worker
            .complete_task(completion("w1", &task, 1))
            .await
            .expect("complete")
            .into_inner()
            .tasks;
        if step == 3 {
            assert!(handed.is_empty(), "{handed:?}");
            break;
        }
        assert!(handed.len() == 1 && handed[0].dispatched, "{handed:?}");
        task = handed[0].clone();
    }
    let kinds = f.event_kinds(&run_id).await;
    let call = [
        "tool_call_scheduled",
        "tool_call_dispatched",
        "tool_call_completed",
    ];
    let expected: Vec<&str> = [
        &["run_started"][..],
        &call,
        &call,
        &call,
        &["node_passed", "run_completed"],
    ]
    .concat();
    assert_eq!(kinds, expected);
    f.stop().await;
}

on_both_backends!(
    a_report_racing_a_grant_withdrawal_is_decided_again,
    a_run_of_handed_steps_completes_alike,
    a_report_hands_over_the_runs_next_step,
    a_report_without_claim_next_hands_over_nothing,
    a_report_asking_for_two_gets_its_runs_next_step_and_another_ready_one,
    another_tenants_worker_is_handed_none_of_this_tenants_steps,
    a_refused_report_claims_nothing,
    an_idempotent_call_is_handed_out_dispatched,
    a_never_call_is_dispatched_only_when_its_worker_asks,
    a_grant_withdrawn_before_the_claim_is_refused_there,
);
