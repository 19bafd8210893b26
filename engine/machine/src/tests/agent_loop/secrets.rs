//! Secrets in what tools answer: redacted from results and errors before
//! they are recorded, and result fields a producer vaults and a consumer
//! reads back at dispatch.

use belay_proto::wire::ToolCallSpec;
use serde_json::json;

use super::{dispatch, tool_results};
use crate::tests::{Opts, Run, scheduled_specs};
use crate::*;

#[test]
fn secrets_in_results_are_redacted_before_they_are_recorded_unless_the_tool_opts_out() {
    let (mut run, _) = Run::start(Opts::default());
    run.model("intake.m1", &[("lookup", r#"{"email":"e"}"#)], None);
    dispatch(&mut run, "intake.t1", 1);
    let d = run.step(Input::ToolCallCompleted {
        call_id: "intake.t1".into(),
        attempt: 1,
        result: json!({"found": true, "api_key": "k_live_123", "echo": "Authorization: Bearer abcdefghijklmnop"}),
        secrets: Vec::new(),
    });
    let recorded = d.events.iter().find_map(|e| match e {
        Event::ToolCallCompleted { result, .. } => Some(result.clone()),
        _ => None,
    });
    assert_eq!(
        recorded,
        Some(
            json!({"found": true, "api_key": "[REDACTED:secret_field]", "echo": "Authorization: Bearer [REDACTED:bearer_token]"})
        )
    );
    assert!(!tool_results(&run)[0].contains("k_live_123"));

    let (mut run, _) = Run::start(Opts {
        edit: Some(|p| {
            if let Some(t) = p.tools.get_mut("lookup") {
                t.def.scrub_secrets = false;
            }
        }),
        ..Opts::default()
    });
    run.model("intake.m1", &[("lookup", r#"{"email":"e"}"#)], None);
    dispatch(&mut run, "intake.t1", 1);
    let raw = json!({"api_key": "k_live_123"});
    let d = run.step(Input::ToolCallCompleted {
        call_id: "intake.t1".into(),
        attempt: 1,
        result: raw.clone(),
        secrets: Vec::new(),
    });
    assert!(
        d.events
            .iter()
            .any(|e| matches!(e, Event::ToolCallCompleted { result, .. } if *result == raw))
    );
}

#[test]
fn errors_quoting_what_a_tool_answered_are_scrubbed_too() {
    let (mut run, _) = Run::start(Opts::default());
    run.model("intake.m1", &[("wipe", r#"{"email":"e"}"#)], None);
    dispatch(&mut run, "intake.t1", 1);
    run.step(Input::TaskFailed {
        call_id: "intake.t1".into(),
        attempt: 1,
        error: "HTTP 401: {\"error\":\"bad key\",\"echo\":\"Bearer abcdefghijklmnop\"}".into(),
        class: FailureClass::Rejected,
        dispatched: true,
        status_code: Some(401),
    });
    let told = tool_results(&run);
    assert!(
        told[0].contains("Bearer [REDACTED:bearer_token]") && !told[0].contains("abcdefghijklmnop"),
        "{told:?}"
    );
}

#[test]
fn a_producer_vaults_its_result_fields_and_a_consumer_reads_them_at_dispatch() {
    use belay_definitions::model::ResultSecretDef;
    let sealed = |key: &str| SealedSecret {
        key: key.into(),
        nonce: vec![0; 12],
        ciphertext: vec![7, 7, 7],
    };
    let (mut run, _) = Run::start(Opts {
        edit: Some(|plan| {
            if let Some(lookup) = plan.tools.get_mut("lookup") {
                lookup.def.result_secrets = vec![
                    ResultSecretDef {
                        path: "otp".into(),
                        key: "txn_otp".into(),
                        consumers: vec!["create".into()],
                        ttl_s: Some(300),
                        single_use: true,
                    },
                    ResultSecretDef {
                        path: "session.key".into(),
                        key: "sess".into(),
                        consumers: vec![],
                        ttl_s: None,
                        single_use: false,
                    },
                ];
            }
            if let Some(create) = plan.tools.get_mut("create") {
                create.def.secret_access = vec!["txn_otp".into()];
            }
        }),
        ..Opts::default()
    });
    // The producer's spec names its paths and keys, never an option.
    let d = run.model(
        "intake.m1",
        &[("lookup", r#"{"email":"a@example.com"}"#)],
        None,
    );
    let spec: ToolCallSpec =
        serde_json::from_value(scheduled_specs(&d)[0].1.clone()).expect("tool spec");
    assert_eq!(
        serde_json::to_value(&spec.result_secrets).unwrap_or_default(),
        json!([{"path": "otp", "key": "txn_otp"}, {"path": "session.key", "key": "sess"}])
    );
    let d = run.step(Input::DispatchToolCall {
        call_id: "intake.t1".into(),
        attempt: 1,
        worker_id: "w1".into(),
        callback_token_sha256: None,
        tenant_grants: None,
    });
    // The producer reads nothing.
    assert!(
        !d.commands
            .iter()
            .any(|c| matches!(c, Command::RestoreSecrets { .. }))
    );
    let d = run.step(Input::ToolCallCompleted {
        call_id: "intake.t1".into(),
        attempt: 1,
        result: json!({"otp": "[VAULTED:txn_otp]", "ok": true}),
        secrets: vec![sealed("txn_otp"), sealed("undeclared")],
    });
    assert_eq!(
        Run::kinds(&d),
        [
            "tool_call_completed",
            "secrets_vaulted",
            "model_call_scheduled"
        ]
    );
    let vaulted = serde_json::to_value(&d.events[1]).unwrap_or_default();
    assert_eq!(
        vaulted,
        json!({
            "type": "secrets_vaulted", "call_id": "intake.t1", "tool": "lookup",
            "keys": [{"key": "txn_otp", "path": "otp", "ttl_s": 300, "single_use": true, "consumers": ["create"]}],
            "absent": ["sess"]
        })
    );
    // Only the declared key goes into the vault; the undeclared one is dropped.
    let entries: Vec<&VaultEntry> = d
        .commands
        .iter()
        .filter_map(|c| match c {
            Command::VaultSecrets { entries, .. } => Some(entries),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].sealed, sealed("txn_otp"));
    assert_eq!((entries[0].ttl_s, entries[0].single_use), (Some(300), true));

    // The consumer's dispatch reads its keys, and again when the same
    // attempt asks again (its reply was lost).
    run.model(
        "intake.m2",
        &[("create", r#"{"email":"a@example.com"}"#)],
        None,
    );
    let restore = Command::RestoreSecrets {
        call_id: "intake.t2".into(),
        tool: "create".into(),
        keys: vec!["txn_otp".into()],
    };
    for _ in 0..2 {
        let d = run.step(Input::DispatchToolCall {
            call_id: "intake.t2".into(),
            attempt: 1,
            worker_id: "w1".into(),
            callback_token_sha256: None,
            tenant_grants: None,
        });
        assert!(d.commands.contains(&restore), "{:?}", d.commands);
    }
    run.step(Input::ToolCallCompleted {
        call_id: "intake.t2".into(),
        attempt: 1,
        result: json!({"account_id": "acc_1"}),
        secrets: Vec::new(),
    });
    // The run's end drops its vault.
    let d = run.model("intake.m3", &[], Some("done"));
    assert!(
        Run::kinds(&d).contains(&"run_completed"),
        "{:?}",
        Run::kinds(&d)
    );
    assert!(d.commands.contains(&Command::DropRunSecrets));
}

#[test]
fn a_run_without_producers_drops_no_vault() {
    let (mut run, _) = Run::start(Opts::default());
    let d = run.model("intake.m1", &[], Some("done"));
    assert!(Run::kinds(&d).contains(&"run_completed"));
    assert!(!d.commands.contains(&Command::DropRunSecrets));
}
