//! A result that arrives after its run ended is kept in the run's history
//! (issue 22), through the coordinator on both backends: the worker that
//! lost its lease reports its real result after an operator resolved the
//! outcome and the run completed; it used to be refused ("run is completed:
//! late result") and kept only in a worker log line.

mod common;
use common::Backend;

use belay_engine::machine::Resolution;
use belay_proto::wire::{ModelCallResult, Usage};

async fn a_late_result_after_the_run_completed_is_recorded_not_refused(backend: Backend) {
    let (db, coord, run_id) = common::create_run(backend, "belay_late").await;
    // Attempt 1 of the reconcile `create` is dispatched, then loses its lease.
    let task = common::dispatched_create(&coord).await;
    coord
        .store()
        .expire_task_timers(None)
        .await
        .expect("expire");
    assert_eq!(coord.sweep_expired_leases().await.expect("sweep"), 1);
    // An operator resolves it as failed; the model ends the run.
    let record = &coord
        .store()
        .uncertain_for_run(run_id.parse().expect("uuid"))
        .await
        .expect("uncertain")[0];
    coord
        .resolve_uncertain(
            "t",
            &record.uncertain_id.to_string(),
            Resolution::Failed {
                error: "not created".into(),
            },
            "ops",
            "checked the CRM",
        )
        .await
        .expect("resolve");
    let model = coord.claim("w2", 1, 0).await.expect("claim").remove(0);
    let done = ModelCallResult {
        content: Some("done".into()),
        tool_calls: Vec::new(),
        usage: Usage::default(),
        finish_reason: None,
    };
    coord
        .complete(
            "w2",
            &model.task_id.to_string(),
            model.attempt as u32,
            &serde_json::to_string(&done).expect("json"),
        )
        .await
        .expect("complete");
    assert_eq!(
        coord.get_run("t", &run_id).await.expect("run").status,
        "completed"
    );

    // Attempt 1's worker reports what really happened at the tool.
    coord
        .complete("w1", &task, 1, r#"{"id":"acc_1"}"#)
        .await
        .expect("a late result is recorded, not refused");
    let events = coord
        .list_events("t", &run_id, 0, 1000)
        .await
        .expect("events");
    let late = events.last().expect("events");
    assert_eq!(late.kind, "late_result_recorded");
    let payload = serde_json::to_string(&late.payload).expect("json");
    assert!(
        payload.contains("acc_1") && payload.contains("after the outcome was resolved"),
        "{payload}"
    );
    assert_eq!(
        coord.get_run("t", &run_id).await.expect("run").status,
        "completed"
    );
    db.drop().await;
}

on_both_backends!(a_late_result_after_the_run_completed_is_recorded_not_refused);
