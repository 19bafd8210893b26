//! The benchmark's workflow: one agent whose scripted model calls the no-op
//! tool K times, one call per turn, and then answers. A run is therefore
//! `K + 1` model calls and `K` tool calls: `2K + 1` steps.

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

/// Steps (model calls plus tool calls) of one run with `tool_steps` tool calls.
pub fn steps_per_run(tool_steps: u32) -> u64 {
    2 * u64::from(tool_steps) + 1
}

/// The definition bundle (tool, agent, workflow) for runs of `tool_steps`
/// no-op tool calls, as files for `Client::register_files`.
pub fn bundle(tool_steps: u32) -> Vec<DefinitionFile> {
    let tools = format!(
        r#"# The benchmark's only tool: does nothing, quickly.
TOOLS:
  noop(i: number) -> {{ok: boolean}}
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
    let workflow = r#"kind: workflow
name: bench
input_schema:
  type: object
start: work
nodes:
  - id: work
    type: agent
    agent: bench_agent
"#
    .to_owned();
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
