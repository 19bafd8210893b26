//! A person's decision names the request it decides (issue 22), through
//! the coordinator on both backends: a client that resends round 1's
//! decision of a looping approval (a retry after a lost reply) after
//! round 2's request opened gets round 1's recorded decision back, and
//! round 2 stays open; the engine lists the open requests with their ids.

mod common;
use common::{Backend, TestDb};

use std::sync::Arc;

use belay_engine::coordinator::{
    ApprovalDecision, Coordinator, CoordinatorConfig, CoordinatorError, StartRun,
};
use belay_engine::definitions::SourceFile;
use belay_engine::store::RunRow;
use serde_json::json;

const TENANT: &str = "t";

/// review → decline → revise → review → … → done.
const LOOP: &str = r#"kind: workflow
name: reviewed
nodes:
  - id: review
    type: approval
    subject: "${ {draft: (.vars.draft // 1)} }"
    approver_grant: ops.approve
    on_decline: revise
    next: done
  - id: revise
    type: set
    values: {draft: "${ (.vars.draft // 1) + 1 }"}
    next: review
  - {id: done, type: succeed, output: "${ .nodes.review.output.subject }"}
"#;

async fn setup(backend: Backend) -> (TestDb, Arc<Coordinator>, RunRow) {
    let db = TestDb::create(backend, "belay_decide").await;
    let coord = Coordinator::new(db.store(4).await, CoordinatorConfig::default());
    let file = SourceFile {
        path: "flows.yaml".into(),
        content: LOOP.into(),
    };
    coord
        .register_bundle(TENANT, vec![file])
        .await
        .expect("register");
    let (run, _) = coord
        .start_run(StartRun {
            tenant: TENANT.into(),
            workflow: "reviewed".into(),
            input_json: "{}".into(),
            idempotency_key: "k1".into(),
            caller: "app".into(),
            caller_grants: Vec::new(),
        })
        .await
        .expect("start");
    (db, coord, run)
}

fn decision(request_id: &str, approve: bool, by: &str) -> ApprovalDecision {
    ApprovalDecision {
        node: "review".into(),
        request_id: request_id.into(),
        approve,
        approver: by.into(),
        approver_grants: vec!["ops.approve".into()],
        reason: "checked".into(),
        ..ApprovalDecision::default()
    }
}

async fn open_ids(coord: &Coordinator, run: &RunRow) -> Vec<String> {
    let open = coord
        .open_requests(run.run_id)
        .await
        .expect("open requests");
    open.into_iter().map(|r| r.request_id).collect()
}

async fn kinds(coord: &Coordinator, run: &RunRow) -> Vec<String> {
    let events = coord
        .list_events(TENANT, &run.run_id.to_string(), 0, 1000)
        .await
        .expect("events");
    events.into_iter().map(|e| e.kind).collect()
}

async fn a_retried_decision_of_an_earlier_round_never_decides_the_open_one(backend: Backend) {
    let (db, coord, run) = setup(backend).await;
    let id = run.run_id.to_string();
    assert_eq!(open_ids(&coord, &run).await, ["review.approval"]);
    assert!(
        run.status_reason.contains("request `review.approval`"),
        "{}",
        run.status_reason
    );

    // Round 1 declined; round 2 opens.
    let (after, duplicate) = coord
        .decide_approval(TENANT, &id, decision("review.approval", false, "grace"))
        .await
        .expect("round 1");
    assert!(!duplicate);
    assert_eq!(after.status, "waiting");
    assert_eq!(open_ids(&coord, &run).await, ["review~2.approval"]);
    let events_before = kinds(&coord, &run).await;

    // The client's retry of round 1 (its reply was lost) is answered with
    // the recorded decision: a duplicate, nothing written.
    let (again, duplicate) = coord
        .decide_approval(TENANT, &id, decision("review.approval", false, "grace"))
        .await
        .expect("retry");
    assert!(duplicate);
    assert_eq!(again.last_seq, after.last_seq);
    assert_eq!(kinds(&coord, &run).await, events_before);
    assert_eq!(open_ids(&coord, &run).await, ["review~2.approval"]);

    // Without a request id the retry is ambiguous: refused, naming both.
    let err = coord
        .decide_approval(TENANT, &id, decision("", false, "grace"))
        .await
        .expect_err("ambiguous");
    assert!(
        matches!(&err, CoordinatorError::InvalidArgument(m)
            if m.contains("review.approval, review~2.approval") && m.contains("the open one is `review~2.approval`")),
        "{err:?}"
    );
    assert_eq!(
        tonic::Status::from(err).code(),
        tonic::Code::InvalidArgument
    );
    // A different decision of round 1: a conflict naming the first.
    let err = coord
        .decide_approval(TENANT, &id, decision("review.approval", true, "bob"))
        .await
        .expect_err("conflict");
    assert!(
        matches!(&err, CoordinatorError::Conflict(m) if m.contains("grace")),
        "{err:?}"
    );
    assert_eq!(tonic::Status::from(err).code(), tonic::Code::Aborted);
    assert_eq!(
        kinds(&coord, &run).await,
        events_before,
        "refusals write nothing"
    );

    // Round 2, named, completes the run with round 2's subject.
    let (done, duplicate) = coord
        .decide_approval(TENANT, &id, decision("review~2.approval", true, "grace"))
        .await
        .expect("round 2");
    assert!(!duplicate);
    assert_eq!(done.status, "completed");
    assert_eq!(done.output.as_ref(), Some(&json!({"draft": 2})));
    assert!(open_ids(&coord, &run).await.is_empty());
    db.drop().await;
}

on_both_backends!(a_retried_decision_of_an_earlier_round_never_decides_the_open_one);
