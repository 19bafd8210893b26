//! Machine tests of per-tool retry policies (`retry:`, `retry_delay:`,
//! `retry_policy:` of a `.tools.abl` tool): the delay after each failed
//! attempt, the attempt count, full jitter, and what repeat safety still
//! decides. Definitions are parsed from text, as in production; each step
//! checks replay = live and the JSON round trip of its events.

#![allow(clippy::unwrap_used)]

use belay_proto::wire::{ChatMessage, ToolUse, Usage};
use serde_json::json;

use super::{Run, plan_files};
use crate::*;

const TOOLS: &str = r#"TOOLS:
  fixed_get(id: string) -> object
    type: http
    endpoint: "/fixed/{id}"
    method: GET
    retry_policy:
      strategy: fixed
      initial_delay_ms: 1500
      max_retries: 3
    permission: crm.read
    repeat_safety: idempotent

  growing_post(id: string) -> object
    type: http
    endpoint: "/grow"
    method: POST
    retry_policy:
      strategy: exponential
      initial_delay_ms: 200
      multiplier: 2
      max_delay_ms: 1000
      max_retries: 5
    permission: crm.read
    repeat_safety: idempotent

  once(id: string) -> object
    type: http
    endpoint: "/once"
    retry: 1
    retry_delay: 5000
    permission: crm.read
    repeat_safety: idempotent

  jittered(id: string) -> object
    type: http
    endpoint: "/jitter"
    retry_policy:
      strategy: exponential
      initial_delay_ms: 1000
      max_delay_ms: 8000
      max_retries: 8
      jitter: full
    permission: crm.read
    repeat_safety: idempotent

  no_retry(id: string) -> object
    type: mcp
    server: crm
    retry: 0
    retry_delay: 100
    permission: crm.read
    repeat_safety: idempotent

  slow_start(id: string) -> object
    type: http
    endpoint: "/slow"
    retry_delay: 60000
    permission: crm.read
    repeat_safety: idempotent

  wipe(id: string) -> object
    type: http
    endpoint: "/wipe"
    retry: 5
    permission: crm.read
    repeat_safety: never

  create(id: string) -> object
    type: http
    endpoint: "/create"
    retry: 5
    permission: crm.read
    repeat_safety: reconcile
    reconcile_with: find

  find(idempotency_key: string) -> object
    type: http
    endpoint: "/find/{idempotency_key}"
    method: GET
    retry_policy:
      strategy: fixed
      initial_delay_ms: 700
    permission: crm.read
    repeat_safety: idempotent

  plain(id: string) -> object
    type: http
    endpoint: "/plain"
    permission: crm.read
    repeat_safety: idempotent
"#;

const AGENT: &str = "kind: agent\nname: a\nmodel: m\ninstructions: i\ntools: [once, plain]\ngrants: [crm.read]\nlimits:\n  max_tool_attempts: 4\n";

/// A plan of the tools above, the agent, and `workflow`.
fn plan(workflow: &str) -> RunPlan {
    plan_files(TOOLS, AGENT, workflow)
}

/// A workflow of one tool node `call` calling `tool`.
fn tool_node(tool: &str) -> String {
    format!(
        "kind: workflow\nname: w\nnodes:\n  - {{id: call, type: tool, tool: {tool}, args: {{id: \"7\"}}, grants: [crm.read]}}\n"
    )
}

impl Run {
    fn start_as(run_id: &str, workflow: &str) -> Run {
        let mut run = Run {
            state: RunState::default(),
            history: vec![],
        };
        run.step(Input::Start {
            run_id: run_id.into(),
            tenant: "acme".into(),
            caller: "app".into(),
            caller_grants: vec!["crm.read".into()],
            tenant_grants: vec!["crm.read".into()],
            input: json!({}),
            plan: Box::new(plan(workflow)),
            trace: None,
        });
        run
    }

    /// A run of a tool node calling `tool` (call id `call.t1`).
    fn tool(tool: &str) -> Run {
        Self::start_as("r1", &tool_node(tool))
    }

    /// Attempt `attempt` of `call_id` is dispatched, then fails.
    fn fail(
        &mut self,
        call_id: &str,
        attempt: u32,
        class: FailureClass,
        status_code: Option<u16>,
    ) -> Decision {
        self.step(Input::DispatchToolCall {
            call_id: call_id.into(),
            attempt,
            worker_id: "w".into(),
            callback_token_sha256: None,
            tenant_grants: None,
        });
        self.step(Input::TaskFailed {
            call_id: call_id.into(),
            attempt,
            error: format!("attempt {attempt} failed"),
            class,
            dispatched: true,
            status_code,
        })
    }

    /// A 503 to a GET: the tool answered, nothing was done.
    fn fail_503_get(&mut self, attempt: u32) -> Decision {
        self.fail("call.t1", attempt, FailureClass::NotSent, Some(503))
    }

    /// A 503 to a POST: it may have acted.
    fn fail_503_post(&mut self, attempt: u32) -> Decision {
        self.fail("call.t1", attempt, FailureClass::MayHaveActed, Some(503))
    }
}

/// The `RetryTask` delay of `d`, if it retries.
fn retry_delay(d: &Decision) -> Option<u64> {
    d.commands.iter().find_map(|c| match c {
        Command::RetryTask { delay_ms, .. } => Some(*delay_ms),
        _ => None,
    })
}

/// `(will_retry, retry_delay_ms)` of the attempt-failed (or lease-expired)
/// event of `d`; the delay recorded is the delay commanded.
fn recorded(d: &Decision) -> (bool, Option<u64>) {
    let found = d.events.iter().find_map(|e| match e {
        Event::ToolCallAttemptFailed {
            will_retry,
            retry_delay_ms,
            ..
        } => Some((*will_retry, *retry_delay_ms)),
        Event::TaskLeaseExpired { retry_delay_ms, .. } => {
            Some((retry_delay_ms.is_some(), *retry_delay_ms))
        }
        _ => None,
    });
    let (will_retry, delay) = found.expect("a failed attempt is recorded");
    assert_eq!(
        delay,
        retry_delay(d),
        "recorded and commanded delays differ"
    );
    assert_eq!(will_retry, delay.is_some());
    (will_retry, delay)
}

fn failed_error(d: &Decision) -> Option<String> {
    d.events.iter().find_map(|e| match e {
        Event::ToolCallFailed { error, .. } => Some(error.clone()),
        _ => None,
    })
}

#[test]
fn a_fixed_policy_spaces_every_retry_by_its_delay_and_stops_after_max_retries() {
    let mut run = Run::tool("fixed_get");
    for attempt in 1..=3 {
        let d = run.fail_503_get(attempt);
        assert_eq!(recorded(&d), (true, Some(1500)), "attempt {attempt}");
    }
    // `max_retries: 3`: the fourth attempt was the last.
    let d = run.fail_503_get(4);
    assert_eq!(recorded(&d), (false, None));
    let error = failed_error(&d).unwrap();
    assert!(
        error.contains("failed after 4 attempts (its retry policy allows no more)"),
        "{error}"
    );
    assert!(d.commands.contains(&Command::EndTask {
        call_id: "call.t1".into(),
        end: TaskEnd::Failed
    }));
    assert_eq!(run.state.status, RunStatus::Failed);
    // The status the tool answered with is recorded with each attempt.
    assert!(run.history.iter().all(|e| !matches!(
        e,
        Event::ToolCallAttemptFailed { status_code, .. } if *status_code != Some(503)
    )));
}

#[test]
fn an_exponential_policy_grows_by_its_multiplier_up_to_its_ceiling() {
    let mut run = Run::tool("growing_post");
    let delays: Vec<Option<u64>> = (1..=6).map(|a| recorded(&run.fail_503_post(a)).1).collect();
    assert_eq!(
        delays,
        [
            Some(200),
            Some(400),
            Some(800),
            Some(1000),
            Some(1000),
            None
        ]
    );
    assert_eq!(run.state.status, RunStatus::Failed);
}

#[test]
fn max_retries_replaces_the_agents_attempts_and_the_model_is_told() {
    let workflow = "kind: workflow\nname: w\nnodes:\n  - {id: intake, type: agent, agent: a}\n";
    let mut run = Run::start_as("r1", workflow);
    run.step(Input::ModelCallCompleted {
        call_id: "intake.m1".into(),
        attempt: 1,
        result: belay_proto::wire::ModelCallResult {
            content: None,
            tool_calls: vec![
                ToolUse {
                    id: "tu0".into(),
                    name: "once".into(),
                    arguments: r#"{"id":"1"}"#.into(),
                },
                ToolUse {
                    id: "tu1".into(),
                    name: "plain".into(),
                    arguments: r#"{"id":"2"}"#.into(),
                },
            ],
            usage: Usage {
                input_tokens: 1,
                output_tokens: 1,
            },
            finish_reason: None,
        },
    });
    // `once` (`retry: 1`, `retry_delay: 5000`): two attempts, 5 s apart.
    let d = run.fail("intake.t1", 1, FailureClass::MayHaveActed, Some(502));
    assert_eq!(recorded(&d), (true, Some(5000)));
    let d = run.fail("intake.t1", 2, FailureClass::MayHaveActed, Some(502));
    assert_eq!(recorded(&d), (false, None));
    assert!(
        failed_error(&d)
            .unwrap()
            .contains("failed after 2 attempts")
    );
    // `plain` (no policy) keeps the agent's `max_tool_attempts: 4` and the
    // engine's backoff, whose delays are recorded too.
    for (attempt, delay) in [(1, 500), (2, 1000), (3, 2000)] {
        let d = run.fail("intake.t2", attempt, FailureClass::MayHaveActed, Some(502));
        assert_eq!(recorded(&d), (true, Some(delay)));
    }
    let d = run.fail("intake.t2", 4, FailureClass::MayHaveActed, Some(502));
    assert_eq!(recorded(&d), (false, None));
    // Both failures went back to the model, which is asked again.
    assert!(
        d.commands
            .iter()
            .any(|c| matches!(c, Command::ScheduleTask { call_id, .. } if call_id == "intake.m2"))
    );
    let told: Vec<String> = run
        .state
        .node
        .as_ref()
        .unwrap()
        .transcript
        .iter()
        .filter_map(|m| match m {
            ChatMessage::Tool { content, .. } => Some(content.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(told.len(), 2, "{told:?}");
    assert!(
        told[0].starts_with("error:") && told[0].contains("`once` failed after 2 attempts"),
        "{told:?}"
    );
    assert!(
        told[1].contains("`plain` failed after 4 attempts"),
        "{told:?}"
    );
}

#[test]
fn full_jitter_stays_within_the_computed_delay_and_is_stable_for_the_same_failure() {
    let bases = [1000, 2000, 4000, 8000, 8000, 8000, 8000, 8000];
    let mut all = Vec::new();
    for run_id in ["r1", "r2", "r3"] {
        let mut run = Run::start_as(run_id, &tool_node("jittered"));
        for (i, base) in bases.iter().enumerate() {
            let attempt = u32::try_from(i).unwrap() + 1;
            run.step(Input::DispatchToolCall {
                call_id: "call.t1".into(),
                attempt,
                worker_id: "w".into(),
                callback_token_sha256: None,
                tenant_grants: None,
            });
            let input = || Input::TaskFailed {
                call_id: "call.t1".into(),
                attempt,
                error: "HTTP 503".into(),
                class: FailureClass::MayHaveActed,
                dispatched: true,
                status_code: Some(503),
            };
            // Deciding the same failure again draws the same delay.
            let again = decide(&run.state, input()).unwrap();
            let d = run.step(input());
            assert_eq!(d, again);
            let delay = recorded(&d).1.unwrap();
            assert!(delay <= *base, "{delay} > {base}");
            assert_eq!(
                delay,
                full_jitter_ms(*base, run_id, "call.t1", attempt),
                "the draw is keyed by run, call and attempt"
            );
            all.push(delay);
        }
        let d = run.fail("call.t1", 9, FailureClass::MayHaveActed, Some(503));
        assert_eq!(recorded(&d), (false, None));
    }
    // Draws differ between runs and attempts (not the computed delay each time).
    let distinct: std::collections::BTreeSet<_> = all.iter().collect();
    assert!(distinct.len() > all.len() / 2, "{all:?}");
}

#[test]
fn full_jitter_draws_are_uniform_enough_and_bounded() {
    let draws: Vec<u64> = (0..2000)
        .map(|a| full_jitter_ms(1000, "run", "call", a))
        .collect();
    assert!(draws.iter().all(|d| *d <= 1000));
    for quarter in 0..4 {
        let n = draws.iter().filter(|d| **d / 250 == quarter).count();
        assert!((400..=600).contains(&n), "quarter {quarter}: {n}");
    }
    assert_eq!(full_jitter_ms(0, "run", "call", 1), 0);
    assert_eq!(
        full_jitter_ms(u64::MAX, "run", "call", 1),
        full_jitter_ms(u64::MAX, "run", "call", 1)
    );
}

#[test]
fn repeat_safety_still_decides_whether_a_retry_is_allowed() {
    // `never`: an attempt that may have acted is not repeated, `retry: 5`
    // or not.
    let mut run = Run::tool("wipe");
    let d = run.fail_503_post(1);
    assert_eq!(recorded(&d), (false, None));
    assert!(
        failed_error(&d)
            .unwrap()
            .contains("repeat safety is `never`")
    );
    // ... but one that provably did nothing is, on the policy's schedule.
    let mut run = Run::tool("wipe");
    let d = run.fail("call.t1", 1, FailureClass::NotSent, Some(429));
    assert_eq!(recorded(&d), (true, Some(500)));

    // `reconcile`: an attempt that may have acted becomes uncertain; its
    // probe retries on the probe tool's own policy.
    let mut run = Run::tool("create");
    let d = run.fail_503_post(1);
    assert_eq!(
        d.events.iter().map(Event::kind).collect::<Vec<_>>(),
        [
            "tool_call_attempt_failed",
            "uncertain_outcome_recorded",
            "reconcile_probe_scheduled",
            "run_paused"
        ]
    );
    assert_eq!(recorded(&d), (false, None));
    let d = run.fail("call.t1.p1", 1, FailureClass::NotSent, Some(503));
    assert_eq!(recorded(&d), (true, Some(700)));

    // A definite refusal is never retried.
    let mut run = Run::tool("fixed_get");
    let d = run.fail("call.t1", 1, FailureClass::Rejected, Some(400));
    assert_eq!(recorded(&d), (false, None));
}

#[test]
fn attempts_that_reached_nothing_keep_their_allowance_with_the_longer_delay() {
    // `retry: 0`, `retry_delay: 100` (an MCP tool): a refused connection
    // (not sent, no answer) is still retried, as a redeploy must not fail a
    // durable run, with the engine's backoff (longer than 100 ms) ...
    let mut run = Run::tool("no_retry");
    for (attempt, delay) in [(1, 500), (2, 1000), (3, 2000)] {
        let d = run.fail("call.t1", attempt, FailureClass::NotSent, None);
        assert_eq!(recorded(&d), (true, Some(delay)), "attempt {attempt}");
    }
    // ... and a lease lost before dispatch too, its delay recorded.
    let d = run.step(Input::LeaseExpired {
        call_id: "call.t1".into(),
        attempt: 4,
        dispatched: false,
    });
    assert_eq!(
        d.events.iter().map(Event::kind).collect::<Vec<_>>(),
        ["task_lease_expired"]
    );
    assert_eq!(recorded(&d), (true, Some(4000)));
    // An answer from the tool counts against `retry: 0`: no retry.
    let d = run.fail("call.t1", 5, FailureClass::NotSent, Some(503));
    assert_eq!(recorded(&d), (false, None));

    // A policy's delay longer than the engine's wins.
    let mut run = Run::tool("slow_start");
    let d = run.fail("call.t1", 1, FailureClass::NotSent, None);
    assert_eq!(recorded(&d), (true, Some(60_000)));

    // The allowance of unreached attempts is the engine's.
    let mut run = Run::tool("no_retry");
    for attempt in 1..MAX_NOT_SENT_ATTEMPTS {
        let d = run.fail("call.t1", attempt, FailureClass::NotSent, None);
        assert!(recorded(&d).0, "attempt {attempt}");
    }
    let d = run.fail(
        "call.t1",
        MAX_NOT_SENT_ATTEMPTS,
        FailureClass::NotSent,
        None,
    );
    assert_eq!(recorded(&d), (false, None));
    assert!(failed_error(&d).unwrap().contains("could not be reached"));
}

#[test]
fn a_lease_lost_after_dispatch_counts_and_records_the_policys_delay() {
    let mut run = Run::tool("growing_post");
    run.fail_503_post(1);
    run.step(Input::DispatchToolCall {
        call_id: "call.t1".into(),
        attempt: 2,
        worker_id: "w".into(),
        callback_token_sha256: None,
        tenant_grants: None,
    });
    let d = run.step(Input::LeaseExpired {
        call_id: "call.t1".into(),
        attempt: 2,
        dispatched: true,
    });
    assert_eq!(recorded(&d), (true, Some(400)));
}

#[test]
fn events_recorded_before_the_delay_field_decode_unchanged() {
    for old in [
        json!({"type": "tool_call_attempt_failed", "call_id": "c", "attempt": 1, "error": "e", "class": "not_sent", "dispatched": true, "will_retry": true}),
        json!({"type": "task_lease_expired", "call_id": "c", "attempt": 1, "dispatched": false}),
    ] {
        let event: Event = serde_json::from_value(old.clone()).unwrap();
        assert_eq!(serde_json::to_value(&event).unwrap(), old);
    }
}

/// `retry:` alone declares the engine's own schedule: the policy's base
/// delays are [`retry_delay_ms`]'s.
#[test]
fn a_bare_retry_policy_is_the_engines_schedule() {
    use belay_definitions::model::{BackoffStrategy, Jitter, RetryPolicy};
    let engine = RetryPolicy {
        strategy: BackoffStrategy::Exponential,
        initial_delay_ms: 500,
        multiplier: 2.0,
        max_delay_ms: 30_000,
        max_retries: Some(9),
        jitter: Jitter::None,
    };
    assert_eq!(
        (1..=9).map(|n| engine.base_delay_ms(n)).collect::<Vec<_>>(),
        (1..=9).map(retry_delay_ms).collect::<Vec<_>>()
    );
}
