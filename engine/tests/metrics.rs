//! The engine's metrics on both backends, through the coordinator: the
//! backlog gauge (`belay_tasks_ready`) follows ready and claimed tasks, the
//! paused-run gauge names its reason, and the counters of a run's steps
//! carry the bounded labels (tenant, workflow, kind, outcome, tool, model,
//! provider) the Helm chart and dashboards rely on.

mod common;

use belay_engine::coordinator::StartRun;
use belay_proto::wire::{ModelCallResult, ToolUse, Usage};
use common::{Backend, CREATE_AGENT, CREATE_TOOL, TestDb};
use serde_json::json;

/// The sample of `name{labels}` in the exposition `text`, if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn start(tenant: &str, key: &str) -> StartRun {
    StartRun {
        tenant: tenant.into(),
        workflow: "w".into(),
        input_json: "{}".into(),
        idempotency_key: key.into(),
        caller: "c".into(),
        caller_grants: vec!["crm.write".into()],
    }
}

/// A model answer proposing `create`, with `usage`, from an OpenAI worker.
fn proposal() -> String {
    let mut v = serde_json::to_value(ModelCallResult {
        content: None,
        tool_calls: vec![ToolUse {
            id: "tu".into(),
            name: "create".into(),
            arguments: r#"{"email":"e@example.com"}"#.into(),
        }],
        usage: Usage {
            input_tokens: 7,
            output_tokens: 3,
        },
        finish_reason: None,
    })
    .unwrap_or_default();
    v[belay_proto::wire::MODEL_PROVIDER_FIELD] = json!("openai");
    v.to_string()
}

async fn backlog_and_step_counters_follow_the_tasks(backend: Backend) {
    let db = TestDb::create(backend, "belay_metrics").await;
    let store = db.store(4).await;
    let coord = common::coordinator(
        store.clone(),
        &["t"],
        CREATE_TOOL,
        CREATE_AGENT,
        &["crm.write"],
    )
    .await;
    for key in ["k1", "k2"] {
        coord.start_run(start("t", key)).await.expect("start");
    }
    let counts = store.gauge_counts().await.expect("gauges");
    assert_eq!(
        counts.tasks_ready,
        vec![("model_call".to_owned(), String::new(), 2)]
    );
    let text = coord.metrics().render(&store, coord.live_window_ms()).await;
    assert_eq!(
        sample(&text, r#"belay_tasks_ready{kind="model_call",pool=""}"#),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, r#"belay_tasks_ready{kind="tool_call",pool=""}"#),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"belay_runs_started_total{tenant="t",workflow="w"}"#
        ),
        Some(2.0),
        "{text}"
    );

    let claimed = coord.claim("w1", 1, 0).await.expect("claim");
    assert_eq!(claimed.len(), 1);
    let counts = store.gauge_counts().await.expect("gauges");
    assert_eq!(
        counts.tasks_ready,
        vec![("model_call".to_owned(), String::new(), 1)],
        "a claimed task is no backlog"
    );
    let task = &claimed[0];
    coord
        .complete(
            "w1",
            &task.task_id.to_string(),
            task.attempt as u32,
            &proposal(),
        )
        .await
        .expect("complete");
    let counts = store.gauge_counts().await.expect("gauges");
    assert_eq!(
        counts.tasks_ready,
        vec![
            ("model_call".to_owned(), String::new(), 1),
            ("tool_call".to_owned(), String::new(), 1)
        ]
    );

    // The counters right away (the database gauges are cached for a second).
    let text = coord.metrics().render(&store, coord.live_window_ms()).await;
    for (series, want) in [
        (
            r#"belay_steps_total{kind="model_call",outcome="succeeded"}"#,
            1.0,
        ),
        (
            r#"belay_model_tokens_total{provider="openai",model="m",direction="input"}"#,
            7.0,
        ),
        (
            r#"belay_model_tokens_total{provider="openai",model="m",direction="output"}"#,
            3.0,
        ),
        (
            r#"belay_step_duration_seconds_count{kind="model_call"}"#,
            1.0,
        ),
        (
            r#"belay_dispatch_latency_seconds_count{kind="model_call"}"#,
            1.0,
        ),
        (r#"belay_task_claims_total{result="claimed"}"#, 1.0),
    ] {
        assert_eq!(sample(&text, series), Some(want), "{series} in\n{text}");
    }
    store.close().await;
    db.drop().await;
}

async fn paused_runs_are_counted_by_reason(backend: Backend) {
    let db = TestDb::create(backend, "belay_metrics").await;
    let store = db.store(4).await;
    let coord = common::coordinator(
        store.clone(),
        &["t", "u"],
        CREATE_TOOL,
        CREATE_AGENT,
        &["crm.write"],
    )
    .await;
    let (run, _) = coord.start_run(start("t", "k1")).await.expect("start");
    coord.start_run(start("u", "k2")).await.expect("start");
    coord
        .pause_run("t", &run.run_id.to_string(), "ops", "maintenance window")
        .await
        .expect("pause");
    let counts = store.gauge_counts().await.expect("gauges");
    assert_eq!(counts.runs_paused, vec![("operator".to_owned(), 1)]);
    assert!(counts.runs_waiting.is_empty(), "{counts:?}");
    assert!(counts.uncertain_open.is_empty(), "{counts:?}");
    // The paused run's model call is held: only the other run's is backlog.
    assert_eq!(
        counts.tasks_ready,
        vec![("model_call".to_owned(), String::new(), 1)]
    );
    let text = coord.metrics().render(&store, coord.live_window_ms()).await;
    assert_eq!(
        sample(&text, r#"belay_runs_paused{reason="operator"}"#),
        Some(1.0),
        "{text}"
    );
    store.close().await;
    db.drop().await;
}

on_both_backends!(
    backlog_and_step_counters_follow_the_tasks,
    paused_runs_are_counted_by_reason,
);
