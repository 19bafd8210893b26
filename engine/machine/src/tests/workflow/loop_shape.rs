//! The benchmark's loop shape (`belay-bench --shape loop`), shared by the
//! tests of the event forms a loop step writes at each behaviour level
//! (`passed.rs`, `folded.rs`): a tool node, a `set` and a `branch`, three
//! times round, then `succeed`.

use serde_json::json;

use crate::tests::{Run, plan_files};
use crate::*;

/// The loop's tools: `noop`; `noted`, whose result sets a run variable
/// (`on_result`); `padded`, whose call's arguments get a default the
/// node's input does not have.
pub(super) const TOOLS: &str = r#"TOOLS:
  noop(i: number) -> {ok: boolean}
    description: "Does nothing"
    type: http
    endpoint: "/noop"
    permission: crm.write
    repeat_safety: idempotent
  noted(i: number) -> {ok: boolean}
    description: "Does nothing, and notes it"
    type: http
    endpoint: "/noted"
    permission: crm.write
    repeat_safety: idempotent
    on_result:
      set:
        noted: .result.ok
  padded(i: number, pad?: string = "x") -> {ok: boolean}
    description: "Does nothing, with a default"
    type: http
    endpoint: "/padded"
    permission: crm.write
    repeat_safety: idempotent
"#;

/// An agent the plan needs (the loop has no agent node).
pub(super) const AGENT: &str =
    "kind: agent\nname: a\nmodel: m\ninstructions: i\ntools: [noop]\ngrants: [crm.write]\n";

/// The loop around tool `tool`.
pub(super) fn loop_of(tool: &str) -> String {
    format!(
        r#"kind: workflow
name: w
nodes:
  - id: call
    type: tool
    tool: {tool}
    args: {{i: "${{ .vars.n // 0 }}"}}
    grants: [crm.write]
    next: count
  - id: count
    type: set
    values: {{n: "${{ (.vars.n // 0) + 1 }}"}}
    next: again
  - id: again
    type: branch
    cases:
      - when: "${{ .vars.n < 3 }}"
        next: call
    default: done
  - id: done
    type: succeed
    output: "${{ {{n: .vars.n}} }}"
"#
    )
}

/// Start `workflow` (with [`TOOLS`]) on a state whose fleet is at `level`.
pub(super) fn start_at(workflow: &str, level: u32) -> (Run, Decision) {
    let state = RunState {
        fleet_level: level,
        ..RunState::default()
    };
    Run::start_plan_on(state, plan_files(TOOLS, AGENT, workflow), json!({}))
}

/// Run the loop around `tool` at `level` to its end, dispatching and
/// completing each call; the run and the kinds of each decision: the
/// start's, then each that completed a call.
pub(super) fn run_loop(tool: &str, level: u32) -> (Run, Vec<Vec<&'static str>>) {
    let (mut run, start) = start_at(&loop_of(tool), level);
    let mut decisions = vec![Run::kinds(&start)];
    for call in ["call.t1", "call~2.t1", "call~3.t1"] {
        run.step(Input::DispatchToolCall {
            call_id: call.into(),
            attempt: 1,
            worker_id: "w".into(),
            callback_token_sha256: None,
            tenant_grants: None,
        });
        let d = run.step(Input::ToolCallCompleted {
            call_id: call.into(),
            attempt: 1,
            result: json!({"ok": true}),
            secrets: Vec::new(),
        });
        decisions.push(Run::kinds(&d));
    }
    (run, decisions)
}

/// `run`'s state with what differs between the forms set aside: the seqs
/// and the level it was written at.
pub(super) fn seqs_aside(run: &Run) -> RunState {
    RunState {
        last_seq: 0,
        node_started_seq: 0,
        fleet_level: 0,
        ..run.state.clone()
    }
}
