//! A decision names the request it decides (issue 22): a retried decision
//! of a loop's earlier visit is answered with what was recorded and never
//! applied to the visit open now.

use serde_json::json;

use crate::requests::{RequestKind, open_requests};
use crate::tests::Run;
use crate::*;

/// review → decline → revise → review → … → done.
const LOOP: &str = r#"kind: workflow
name: w
nodes:
  - id: review
    type: approval
    subject: "${ .vars.draft // 1 }"
    approver_grant: ok.go
    on_decline: revise
    next: done
  - id: revise
    type: set
    values: {draft: "${ (.vars.draft // 1) + 1 }"}
    next: review
  - {id: done, type: succeed, output: "${ .nodes.review.output.subject }"}
"#;

fn decision(request: Option<&str>, approve: bool, by: &str) -> Input {
    Input::DecideApproval {
        node: "review".into(),
        request: request.map(str::to_owned),
        approve,
        edited_subject: None,
        by: by.into(),
        grants: vec!["ok.go".into()],
        reason: String::new(),
    }
}

fn open_ids(run: &Run) -> Vec<String> {
    open_requests(&run.state)
        .into_iter()
        .map(|r| r.request_id)
        .collect()
}

#[test]
fn each_visit_of_an_approval_node_is_its_own_request_named_in_event_reason_and_open_list() {
    let (mut run, _) = Run::start_workflow(LOOP, json!({}));
    let Some(Event::ApprovalRequested { request_id, .. }) = run.history.last() else {
        panic!("{:?}", run.history.last());
    };
    assert_eq!(request_id, "review.approval");
    assert!(
        run.state
            .status_reason
            .contains("request `review.approval`"),
        "{}",
        run.state.status_reason
    );
    let open = open_requests(&run.state);
    assert_eq!(open.len(), 1);
    assert_eq!(
        (
            open[0].kind,
            open[0].node.as_str(),
            open[0].approver_grant.as_str()
        ),
        (RequestKind::Approval, "review", "ok.go")
    );
    // Round 1 is declined (named by its id): round 2 opens.
    run.step(decision(Some("review.approval"), false, "grace"));
    assert_eq!(open_ids(&run), vec!["review~2.approval"]);
    let Some(Event::ApprovalRequested {
        request_id,
        subject,
        ..
    }) = run.history.last()
    else {
        panic!("{:?}", run.history.last());
    };
    assert_eq!(
        (request_id.as_str(), subject),
        ("review~2.approval", &json!(2))
    );
}

#[test]
fn a_retried_decision_of_round_one_after_round_two_opened_is_answered_and_never_applied_to_round_two()
 {
    let (mut run, _) = Run::start_workflow(LOOP, json!({}));
    // Round 1, named by node only (the node has been requested once).
    run.step(decision(None, false, "grace"));
    assert_eq!(open_ids(&run), vec!["review~2.approval"]);
    let before = run.history.len();

    // The client retries round 1's decline after a lost reply, naming it:
    // the recorded decision answers it, nothing is written.
    let d = run.step(decision(Some("review.approval"), false, "grace"));
    assert!(d.events.is_empty() && d.commands.is_empty(), "{d:?}");
    assert_eq!(run.history.len(), before);
    assert_eq!(open_ids(&run), vec!["review~2.approval"]);

    // The same retry without a request id cannot be told from a decision
    // of round 2: refused, naming the requests and the open one.
    let err = run
        .try_step(decision(None, false, "grace"))
        .expect_err("ambiguous");
    assert!(
        matches!(&err, MachineError::RequestRequired { subject, requests, open }
            if subject == "review"
                && requests == &["review.approval", "review~2.approval"]
                && open.as_deref() == Some("review~2.approval")),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("the open one is `review~2.approval`"),
        "{err}"
    );

    // A different decision of round 1 is a conflict naming the first.
    let err = run
        .try_step(decision(Some("review.approval"), true, "bob"))
        .expect_err("differs");
    assert!(
        matches!(&err, MachineError::AlreadyDecided { request, by, approved: false, .. }
            if request == "review.approval" && by == "grace"),
        "{err:?}"
    );
    // A request the node never made is named as such.
    let err = run
        .try_step(decision(Some("review~9.approval"), true, "bob"))
        .expect_err("unknown");
    assert!(
        matches!(&err, MachineError::NoSuchRequest { request, .. } if request == "review~9.approval"),
        "{err:?}"
    );
    assert_eq!(run.history.len(), before, "refusals write nothing");

    // Round 2, named, is decided; its retry after the run ended is answered too.
    run.step(decision(Some("review~2.approval"), true, "grace"));
    assert_eq!(run.state.status, RunStatus::Completed);
    assert_eq!(run.state.output, Some(json!(2)));
    let d = run.step(decision(Some("review~2.approval"), true, "grace"));
    assert!(d.events.is_empty(), "{d:?}");
    let err = run
        .try_step(decision(Some("review~2.approval"), false, "bob"))
        .expect_err("differs after the end");
    assert!(
        matches!(err, MachineError::AlreadyDecided { approved: true, .. }),
        "{err:?}"
    );
}

#[test]
fn a_decision_written_before_request_ids_existed_folds_onto_the_nodes_latest_request() {
    // Events of an older engine carry no request ids: the fold derives them.
    let (mut run, _) = Run::start_workflow(LOOP, json!({}));
    run.step(decision(None, false, "grace"));
    let old: Vec<Event> = run
        .history
        .iter()
        .cloned()
        .map(|e| match e {
            Event::ApprovalRequested {
                node,
                subject,
                prompt,
                approver_grant,
                allow_edits,
                timer,
                ..
            } => Event::ApprovalRequested {
                node,
                request_id: String::new(),
                subject,
                prompt,
                approver_grant,
                allow_edits,
                timer,
            },
            Event::ApprovalDecided {
                node,
                approved,
                by,
                reason,
                subject,
                edited,
                ..
            } => Event::ApprovalDecided {
                node,
                request_id: String::new(),
                approved,
                by,
                reason,
                subject,
                edited,
            },
            e => e,
        })
        .collect();
    // As an older engine wrote them: no `request_id` key at all.
    for e in &old {
        let text = serde_json::to_string(e).expect("serialise");
        assert!(!text.contains("request_id"), "{text}");
    }
    let state = RunState::fold(&old);
    assert_eq!(
        open_requests(&state)
            .into_iter()
            .map(|r| r.request_id)
            .collect::<Vec<_>>(),
        vec!["review~2.approval"]
    );
    let rounds = &state.approvals["review"];
    assert_eq!(rounds.len(), 2);
    assert_eq!(
        rounds[0]
            .answered
            .as_ref()
            .map(|d| (d.by.as_str(), d.approved)),
        Some(("grace", false))
    );
    assert!(rounds[1].answered.is_none());
}
