//! Machine tests of MCP sampling ([`crate::sampling`]): which calls get a grant
//! and how large, and that the completions a worker reports are charged to
//! the node's and the run's budgets like model-call tokens, live and in
//! replay ([`Run`] checks replay = live at every step). Definitions are parsed from `.tools.abl` and YAML, as in
//! production.

#![allow(clippy::unwrap_used)]

use belay_proto::wire::{
    ModelCallResult, SamplingGrant, SamplingUsage, ToolCallSpec, ToolUse, Usage,
};
use serde_json::{Value, json};

use super::{Run, plan_files, scheduled_specs};
use crate::*;

const TOOLS: &str = r#"TOOLS:
  ask(q: string) -> object
    description: "Asks a server that samples"
    type: mcp
    server: docs
    permission: crm.write
    repeat_safety: idempotent
    sampling:
      max_requests: 2
      max_tokens: 500
  plain(q: string) -> object
    description: "Asks a server that may not sample"
    type: mcp
    server: docs
    permission: crm.write
    repeat_safety: idempotent
"#;

/// An agent over both tools, with `budget` (YAML lines under `budget:`).
fn agent(budget: &str) -> String {
    format!(
        "kind: agent\nname: a\nmodel: gpt-sampler\ninstructions: i\ntools: [ask, plain]\ngrants: [crm.write]\nbudget:\n{budget}"
    )
}

/// A workflow of one agent node `n`, with the run's `budget` (YAML lines).
fn workflow(budget: &str) -> String {
    format!(
        "kind: workflow\nname: w\nbudget:\n{budget}nodes:\n  - {{id: n, type: agent, agent: a}}\n"
    )
}

/// The model answers call `call_id` with usage (10 in, 5 out) and `calls`.
fn model(run: &mut Run, call_id: &str, calls: &[(&str, Value)]) -> Decision {
    run.step(Input::ModelCallCompleted {
        call_id: call_id.into(),
        attempt: 1,
        result: ModelCallResult {
            content: None,
            tool_calls: calls
                .iter()
                .enumerate()
                .map(|(i, (name, args))| ToolUse {
                    id: format!("tu{i}"),
                    name: (*name).into(),
                    arguments: args.to_string(),
                })
                .collect(),
            usage: Usage {
                input_tokens: 10,
                output_tokens: 5,
            },
            finish_reason: None,
        },
    })
}

/// The tool-call specs `d` schedules, by call id.
fn tool_specs(d: &Decision) -> Vec<(String, ToolCallSpec)> {
    scheduled_specs(d)
        .into_iter()
        .filter_map(|(id, spec, _)| Some((id, serde_json::from_value(spec).ok()?)))
        .collect()
}

fn dispatch(run: &mut Run, call_id: &str) {
    run.step(Input::DispatchToolCall {
        call_id: call_id.into(),
        attempt: 1,
        worker_id: "w1".into(),
        callback_token_sha256: None,
        tenant_grants: None,
    });
}

fn usage(requests: u32, input_tokens: u64, output_tokens: u64) -> SamplingUsage {
    SamplingUsage {
        requests,
        input_tokens,
        output_tokens,
    }
}

fn completed(call_id: &str) -> Input {
    Input::ToolCallCompleted {
        call_id: call_id.into(),
        attempt: 1,
        result: json!({"answer": "sampled"}),
        secrets: Vec::new(),
    }
}

#[test]
fn an_agents_call_carries_its_model_and_what_is_left_of_the_budgets() {
    // No budget: the tool's own bounds.
    let plan = plan_files(TOOLS, &agent(""), &workflow(""));
    let (mut run, _) = Run::start_plan(plan, json!({}));
    let d = model(
        &mut run,
        "n.m1",
        &[("ask", json!({"q": "a"})), ("plain", json!({"q": "b"}))],
    );
    let specs = tool_specs(&d);
    assert_eq!(specs.len(), 2, "{specs:?}");
    assert_eq!(
        specs[0].1.sampling,
        Some(SamplingGrant {
            model: "gpt-sampler".into(),
            max_requests: 2,
            max_tokens: 500,
            max_total_tokens: None,
            max_input_tokens: None,
        })
    );
    // A tool without `sampling:` gets no grant, and its spec is unchanged.
    assert_eq!(specs[1].1.sampling, None);
    assert!(scheduled_specs(&d)[1].1.get("sampling").is_none());

    // The agent's token budget, then the run's output budget, lower it to
    // what is left after the model call's 15 tokens.
    let plan = plan_files(TOOLS, &agent("  max_tokens: 300\n"), &workflow(""));
    let (mut run, _) = Run::start_plan(plan, json!({}));
    let d = model(&mut run, "n.m1", &[("ask", json!({"q": "a"}))]);
    assert_eq!(
        tool_specs(&d)[0].1.sampling.as_ref().unwrap().max_tokens,
        285
    );
    let plan = plan_files(
        TOOLS,
        &agent("  max_tokens: 300\n"),
        &workflow("  max_output_tokens: 105\n"),
    );
    let (mut run, _) = Run::start_plan(plan, json!({}));
    let d = model(&mut run, "n.m1", &[("ask", json!({"q": "a"}))]);
    assert_eq!(
        tool_specs(&d)[0].1.sampling.as_ref().unwrap().max_tokens,
        100
    );
}

#[test]
fn the_grant_bounds_the_sum_by_every_budget_and_parallel_calls_split_it() {
    let grant_of = |agent_extra: &str, run_budget: &str, calls: &[(&str, Value)]| {
        let plan = plan_files(TOOLS, &agent(agent_extra), &workflow(run_budget));
        let (mut run, _) = Run::start_plan(plan, json!({}));
        let d = model(&mut run, "n.m1", calls);
        tool_specs(&d)
            .into_iter()
            .filter_map(|(_, spec)| spec.sampling)
            .collect::<Vec<_>>()
    };
    let one = [("ask", json!({"q": "a"}))];
    // 300 tokens, 15 used: 285 in all, for output and input together.
    let g = grant_of("  max_tokens: 300\n", "", &one);
    assert_eq!(
        (
            g[0].max_tokens,
            g[0].max_total_tokens,
            g[0].max_input_tokens
        ),
        (285, Some(285), Some(285))
    );
    // An input budget with one token left bounds the prompts.
    let g = grant_of("  max_input_tokens: 11\n", "", &one);
    assert_eq!(
        (
            g[0].max_tokens,
            g[0].max_total_tokens,
            g[0].max_input_tokens
        ),
        (500, None, Some(1))
    );
    // A cost budget, at the agent's prices: $0.001 left at $10 per million
    // output tokens is 100 output tokens (the model call cost 10 in at $1
    // and 5 out at $10 per million: $0.00006).
    let g = grant_of(
        "  max_cost_usd: 0.00106\npricing:\n  input_per_million_usd: 1\n  output_per_million_usd: 10\n",
        "",
        &one,
    );
    assert_eq!(g[0].max_total_tokens, Some(100));
    assert_eq!(g[0].max_input_tokens, Some(1000));
    assert_eq!(g[0].max_tokens, 100);
    // The agent's `max_output_tokens` bounds each completion.
    let g = grant_of("  max_tokens: 300\nmax_output_tokens: 64\n", "", &one);
    assert_eq!((g[0].max_tokens, g[0].max_total_tokens), (64, Some(285)));
    // Three sampling calls in one turn split what is left.
    let three = [
        ("ask", json!({"q": "a"})),
        ("ask", json!({"q": "b"})),
        ("ask", json!({"q": "c"})),
        ("plain", json!({"q": "d"})),
    ];
    let g = grant_of("  max_tokens: 300\n", "", &three);
    assert_eq!(g.len(), 3);
    assert!(g.iter().all(|g| g.max_total_tokens == Some(95)), "{g:?}");
}

/// Attempt 1 of `call_id` failed in a way that is retried.
fn hiccup(call_id: &str) -> Input {
    Input::TaskFailed {
        call_id: call_id.into(),
        attempt: 1,
        error: "server hiccup".into(),
        class: FailureClass::NotSent,
        dispatched: true,
        status_code: None,
    }
}

/// The grant of the spec a decision gave a call again (`RekeyTask`).
fn regranted(d: &Decision) -> Option<SamplingGrant> {
    d.commands.iter().find_map(|c| match c {
        Command::RekeyTask { spec, .. } => {
            serde_json::from_value::<ToolCallSpec>(spec.clone())
                .ok()?
                .sampling
        }
        _ => None,
    })
}

#[test]
fn a_retry_gets_a_grant_from_what_is_left_after_the_first_attempt() {
    let mut run = at_the_call();
    // Attempt 1 sampled 60 tokens, then failed in a way that is retried.
    let d = run.step(Input::ToolCallSampled {
        usage: SamplingUsage {
            requests: 1,
            input_tokens: 40,
            output_tokens: 20,
        },
        report: Box::new(hiccup("n.t1")),
    });
    let regranted = regranted(&d);
    // 100 - 15 (model) - 60 (sampling) = 25 left.
    assert_eq!(regranted.map(|g| g.max_total_tokens), Some(Some(25)));
    assert!(
        d.commands
            .iter()
            .any(|c| matches!(c, Command::RetryTask { .. })),
        "{:?}",
        d.commands
    );
}

#[test]
fn a_retry_takes_no_more_than_its_share_while_the_turns_other_calls_are_open() {
    let plan = plan_files(TOOLS, &agent("  max_tokens: 300\n"), &workflow(""));
    let (mut run, _) = Run::start_plan(plan, json!({}));
    let d = model(
        &mut run,
        "n.m1",
        &[
            ("ask", json!({"q": "a"})),
            ("ask", json!({"q": "b"})),
            ("ask", json!({"q": "c"})),
        ],
    );
    assert!(
        tool_specs(&d)
            .iter()
            .all(|(_, s)| s.sampling.as_ref().and_then(|g| g.max_total_tokens) == Some(95))
    );
    dispatch(&mut run, "n.t1");
    let d = run.step(hiccup("n.t1"));
    let regranted = regranted(&d);
    // t2 and t3 still hold their 95 each: the retry gets a third, not all.
    assert_eq!(regranted.and_then(|g| g.max_total_tokens), Some(95));
}

#[test]
fn no_grant_without_room_in_a_budget_or_for_a_tool_node() {
    // The model's 5 output tokens used the agent's output budget up.
    let plan = plan_files(TOOLS, &agent("  max_output_tokens: 5\n"), &workflow(""));
    let (mut run, _) = Run::start_plan(plan, json!({}));
    let d = model(&mut run, "n.m1", &[("ask", json!({"q": "a"}))]);
    let specs = tool_specs(&d);
    assert_eq!(specs.len(), 1);
    assert_eq!(specs[0].1.sampling, None);
    // The run's input budget likewise.
    let plan = plan_files(TOOLS, &agent(""), &workflow("  max_input_tokens: 10\n"));
    let (mut run, _) = Run::start_plan(plan, json!({}));
    let d = model(&mut run, "n.m1", &[("ask", json!({"q": "a"}))]);
    assert_eq!(tool_specs(&d)[0].1.sampling, None);

    // A workflow's tool node: no agent, no model, no grant.
    let wf = "kind: workflow\nname: w\nnodes:\n  - {id: t, type: tool, tool: ask, args: {q: x}, grants: [crm.write]}\n";
    let plan = plan_files(TOOLS, &agent(""), wf);
    let (_, d) = Run::start_plan(plan, json!({}));
    let specs = tool_specs(&d);
    assert_eq!(specs.len(), 1, "{specs:?}");
    assert_eq!(specs[0].1.tool, "ask");
    assert_eq!(specs[0].1.sampling, None);
}

#[test]
fn an_agent_that_redacts_pii_grants_sampling_only_to_tools_whose_results_may_reach_the_model() {
    let redacting = "  max_tokens: 1000\npii_redaction: true\n";
    let plan = plan_files(TOOLS, &agent(redacting), &workflow(""));
    let (mut run, _) = Run::start_plan(plan, json!({}));
    let d = model(&mut run, "n.m1", &[("ask", json!({"q": "a"}))]);
    assert_eq!(tool_specs(&d)[0].1.sampling, None);
    let llm = TOOLS.replacen("    sampling:\n", "    pii_access: llm\n    sampling:\n", 1);
    let plan = plan_files(&llm, &agent(redacting), &workflow(""));
    let (mut run, _) = Run::start_plan(plan, json!({}));
    let d = model(&mut run, "n.m1", &[("ask", json!({"q": "a"}))]);
    assert!(tool_specs(&d)[0].1.sampling.is_some());
}

/// Runs the agent (`max_tokens: 100`) to its call of `ask` (the model used
/// 15 tokens), dispatched.
fn at_the_call() -> Run {
    let plan = plan_files(TOOLS, &agent("  max_tokens: 100\n"), &workflow(""));
    let (mut run, _) = Run::start_plan(plan, json!({}));
    let d = model(&mut run, "n.m1", &[("ask", json!({"q": "a"}))]);
    assert_eq!(
        tool_specs(&d)[0].1.sampling.as_ref().unwrap().max_tokens,
        85
    );
    dispatch(&mut run, "n.t1");
    run
}

#[test]
fn reported_sampling_is_charged_and_a_used_up_budget_stops_before_the_next_model_call() {
    // Without sampling the run goes on to its next model call.
    let mut run = at_the_call();
    let d = run.step(completed("n.t1"));
    assert_eq!(
        d.events.iter().map(Event::kind).collect::<Vec<_>>(),
        ["tool_call_completed", "model_call_scheduled"]
    );

    // The same result with 90 tokens of sampling: 15 + 90 is past the
    // agent's 100, so the run stops before calling the model again.
    let mut run = at_the_call();
    let d = run.step(Input::ToolCallSampled {
        usage: usage(2, 40, 50),
        report: Box::new(completed("n.t1")),
    });
    assert_eq!(
        d.events.iter().map(Event::kind).collect::<Vec<_>>(),
        ["tool_call_sampled", "tool_call_completed", "run_failed"]
    );
    assert_eq!(
        d.events[0],
        Event::ToolCallSampled {
            call_id: "n.t1".into(),
            attempt: 1,
            usage: usage(2, 40, 50),
        }
    );
    let Event::RunFailed { stop, error, .. } = &d.events[2] else {
        panic!("{:?}", d.events[2]);
    };
    assert!(
        matches!(stop, Some(Stop::Budget { .. })),
        "{stop:?}: {error}"
    );
    assert!(error.contains("`tokens` budget (105 of 100)"), "{error}");
    assert_eq!(run.state.status, RunStatus::Failed);
    assert_eq!(run.state.totals.input_tokens, 50);
    assert_eq!(run.state.totals.output_tokens, 55);
    assert_eq!(run.state.totals.model_steps, 1, "sampling is no model step");
    assert!(
        !d.commands
            .iter()
            .any(|c| matches!(c, Command::ScheduleTask { .. })),
        "{:?}",
        d.commands
    );
}

#[test]
fn sampling_reported_with_a_failure_is_charged_too() {
    let mut run = at_the_call();
    let d = run.step(Input::ToolCallSampled {
        usage: usage(1, 3, 4),
        report: Box::new(Input::TaskFailed {
            call_id: "n.t1".into(),
            attempt: 1,
            error: "the tool reported an error".into(),
            class: FailureClass::Rejected,
            dispatched: true,
            status_code: None,
        }),
    });
    assert_eq!(
        d.events.iter().map(Event::kind).collect::<Vec<_>>(),
        [
            "tool_call_sampled",
            "tool_call_attempt_failed",
            "tool_call_failed",
            "model_call_scheduled"
        ]
    );
    let node = run.state.node.as_ref().unwrap();
    assert_eq!(
        (node.input_tokens, node.output_tokens, node.tokens),
        (13, 9, 22)
    );
    assert_eq!(
        (
            run.state.totals.input_tokens,
            run.state.totals.output_tokens
        ),
        (13, 9)
    );
}

#[test]
fn sampling_for_a_call_that_is_not_open_is_refused_and_records_nothing() {
    let mut run = at_the_call();
    run.step(completed("n.t1"));
    let before = run.history.len();
    let refused = run.try_step(Input::ToolCallSampled {
        usage: usage(1, 3, 4),
        report: Box::new(completed("n.t1")),
    });
    assert!(
        matches!(refused, Err(MachineError::CallNotOpen { .. })),
        "{refused:?}"
    );
    assert_eq!(run.history.len(), before);
}

#[test]
fn sampling_reported_with_a_question_for_a_person_is_charged_too() {
    let mut run = at_the_call();
    let d = run.step(Input::ToolCallSampled {
        usage: usage(1, 30, 2),
        report: Box::new(Input::ToolInputRequested {
            call_id: "n.t1".into(),
            attempt: 1,
            via: "elicitation".into(),
            requests: json!({"message": "which one?"}),
            request_state: None,
            may_have_acted: true,
        }),
    });
    assert_eq!(
        d.events.iter().map(Event::kind).collect::<Vec<_>>(),
        ["tool_call_sampled", "tool_call_input_requested"]
    );
    assert_eq!(run.state.status, RunStatus::Waiting);
    let node = run.state.node.as_ref().unwrap();
    assert_eq!(
        (node.input_tokens, node.output_tokens, node.tokens),
        (40, 7, 47)
    );
}
