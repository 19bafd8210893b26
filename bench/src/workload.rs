//! The benchmark's workflows. [`Shape::Agent`] (the default): one agent
//! whose scripted model calls the no-op tool K times, one call per turn, and
//! then answers; a run is `K + 1` model calls and `K` tool calls, `2K + 1`
//! steps. [`Shape::Loop`]: a workflow that calls the no-op tool from a
//! `tool` node K times round a `set` + `branch` loop, with no model; a run
//! is K steps, and its history grows by a fixed number of events a step
//! while its state stays small, which shows what a long history costs.

use belay_proto::v1::DefinitionFile;

use crate::fake::TOOL_PATH;

/// Tenant the benchmark's runs belong to.
pub const TENANT: &str = "bench";
/// Name of the benchmark's workflow.
pub const WORKFLOW: &str = "bench";
/// The no-op tool's permission, granted to the tenant, the node and the caller.
pub const PERMISSION: &str = "bench.noop";

/// The waiting-runs scenario's workflow ([`crate::waits`]): wait for signal
/// `go`, then complete with its payload. No agent, no tool, no worker.
pub const WAIT_WORKFLOW: &str = r#"kind: workflow
name: bench_wait
nodes:
  - id: wait
    type: wait
    signal: go
    payload_schema: {type: object, required: [ok], properties: {ok: {type: boolean}}}
    next: done
  - id: done
    type: succeed
    output: "${ .nodes.wait.output.payload }"
"#;

/// What a benchmark run does (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Shape {
    /// An agent: K + 1 scripted model calls, K tool calls.
    Agent,
    /// A workflow loop: K tool calls, no model.
    Loop,
}

/// Steps (model calls plus tool calls) of one run with `tool_steps` tool calls.
pub fn steps_per_run(tool_steps: u32, shape: Shape) -> u64 {
    match shape {
        Shape::Agent => 2 * u64::from(tool_steps) + 1,
        Shape::Loop => u64::from(tool_steps),
    }
}

/// The definition bundle (tool, agent, workflow) for runs of `tool_steps`
/// no-op tool calls, as files for `Client::register_files`.
pub fn bundle(tool_steps: u32, shape: Shape) -> Vec<DefinitionFile> {
    let tools = format!(
        r#"# The benchmark's only tool: does nothing, quickly (`pad`: the
# padding of --result-bytes).
TOOLS:
  noop(i: number) -> {{ok: boolean, pad?: string}}
    description: "Does nothing (benchmark)"
    type: http
    endpoint: "{TOOL_PATH}"
    method: POST
    timeout: 10s
    permission: {PERMISSION}
    repeat_safety: idempotent
"#
    );
    // The loop limits fit the script exactly; both must be positive.
    let agent = format!(
        r#"kind: agent
name: bench_agent
model: bench-noop
instructions: |
  Call noop {tool_steps} times, one call per turn, then answer.
tools: [noop]
grants: [{PERMISSION}]
loop:
  type: bounded_loop
  max_model_steps: {model_steps}
  max_tool_calls: {tool_calls}
"#,
        model_steps = tool_steps + 1,
        tool_calls = tool_steps.max(1),
    );
    let workflow = match shape {
        Shape::Agent => r#"kind: workflow
name: bench
input_schema:
  type: object
start: work
nodes:
  - id: work
    type: agent
    agent: bench_agent
"#
        .to_owned(),
        Shape::Loop => format!(
            r#"kind: workflow
name: bench
input_schema:
  type: object
start: call
nodes:
  - id: call
    type: tool
    tool: noop
    args:
      i: "${{ .vars.n // 0 }}"
    grants: [{PERMISSION}]
    next: count
  - id: count
    type: set
    values:
      n: "${{ (.vars.n // 0) + 1 }}"
    next: again
  - id: again
    type: branch
    cases:
      - when: "${{ .vars.n < {tool_steps} }}"
        next: call
    default: done
  - id: done
    type: succeed
    output: "${{ {{n: .vars.n}} }}"
"#
        ),
    };
    vec![
        DefinitionFile {
            path: "bench.tools.abl".to_owned(),
            content: tools,
        },
        DefinitionFile {
            path: "agent.yaml".to_owned(),
            content: agent,
        },
        DefinitionFile {
            path: "workflow.yaml".to_owned(),
            content: workflow,
        },
    ]
}
