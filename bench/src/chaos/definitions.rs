//! The chaos runs' definitions: four HTTP tools of the recording server
//! (one per repeat safety, the reconcile one with and without a probe), the
//! probe, an agent whose scripted model calls the `idempotent` and the
//! `never` tool, and the workflow `chaos`:
//!
//! ```text
//! agent (model → chaos_idempotent → model → chaos_never → model → answer)
//!   → never (tool node) → idem (tool node) → probed (tool node) → plain (tool node) → done
//! ```
//!
//! Every tool node goes on to the next one whether its call succeeds or
//! fails (`on_error`), so one run exercises every kind of call. Each tool
//! gets the run id and call id from the engine (`source: runtime`), which
//! is how the recording server tells calls apart without trusting the
//! idempotency key it checks.

use belay_proto::v1::DefinitionFile;

use super::recorder::{PROBE_PATH, ToolKind};

/// Tenant of the chaos runs.
pub const TENANT: &str = "chaos";
/// Name of the workflow.
pub const WORKFLOW: &str = "chaos";
/// The tools' permission, granted to the tenant, the nodes and the caller.
pub const PERMISSION: &str = "chaos.call";
/// The probe's name.
pub const PROBE_TOOL: &str = "chaos_probe";

fn repeat_safety(kind: ToolKind) -> &'static str {
    match kind {
        ToolKind::Never => "repeat_safety: never",
        ToolKind::Idempotent => "repeat_safety: idempotent",
        ToolKind::ReconcileProbed => "repeat_safety: reconcile\n    reconcile_with: chaos_probe",
        ToolKind::Reconcile => "repeat_safety: reconcile",
    }
}

fn tool_text(kind: ToolKind, timeout_ms: u64) -> String {
    format!(
        r#"  {name}(run: string, call: string) -> {{ok: boolean, call: string}}
    description: "Recorded by the chaos harness's tool server"
    type: http
    endpoint: "{path}"
    method: POST
    timeout: {timeout_ms}ms
    parameters:
      run:
        source: runtime
        value: run_id
      call:
        source: runtime
        value: call_id
    permission: {PERMISSION}
    {safety}
"#,
        name = kind.tool(),
        path = kind.path(),
        safety = repeat_safety(kind),
    )
}

/// The tools file: the four tools with `timeout_ms`, and the probe.
pub fn tools(timeout_ms: u64) -> String {
    let mut text =
        String::from("# The chaos harness's tools (bench/src/chaos/definitions.rs).\nTOOLS:\n");
    for kind in ToolKind::ALL {
        text.push_str(&tool_text(kind, timeout_ms));
        text.push('\n');
    }
    text.push_str(&format!(
        r#"  {PROBE_TOOL}(idempotency_key: string) -> {{ok: boolean, call: string}}
    description: "Whether a chaos_reconcile_probed request with this key arrived (404: none did)"
    type: http
    endpoint: "{PROBE_PATH}"
    method: GET
    timeout: {timeout_ms}ms
    effect: read_only
    permission: {PERMISSION}
    repeat_safety: idempotent
"#
    ));
    text
}

const AGENT: &str = r#"kind: agent
name: chaos_agent
model: chaos-scripted
instructions: |
  Call chaos_idempotent, then chaos_never, then answer.
tools: [chaos_idempotent, chaos_never]
grants: [chaos.call]
loop:
  type: bounded_loop
  max_model_steps: 3
  max_tool_calls: 2
limits:
  max_model_attempts: 6
  max_tool_attempts: 6
"#;

fn tool_node(id: &str, kind: ToolKind, next: &str) -> String {
    format!(
        r#"  - id: {id}
    type: tool
    tool: {tool}
    args: {{}}
    grants: [{PERMISSION}]
    next: {next}
    on_error: {next}
"#,
        tool = kind.tool(),
    )
}

/// The workflow file.
pub fn workflow() -> String {
    let mut text = String::from(
        r#"kind: workflow
name: chaos
input_schema:
  type: object
start: agent
nodes:
  - id: agent
    type: agent
    agent: chaos_agent
    next: never
"#,
    );
    text.push_str(&tool_node("never", ToolKind::Never, "idem"));
    text.push_str(&tool_node("idem", ToolKind::Idempotent, "probed"));
    text.push_str(&tool_node("probed", ToolKind::ReconcileProbed, "plain"));
    text.push_str(&tool_node("plain", ToolKind::Reconcile, "done"));
    text.push_str(
        r#"  - id: done
    type: succeed
    output: {ok: true}
"#,
    );
    text
}

/// The bundle, as files for `Client::register_files`.
pub fn bundle(tool_timeout_ms: u64) -> Vec<DefinitionFile> {
    vec![
        DefinitionFile {
            path: "chaos.tools.abl".to_owned(),
            content: tools(tool_timeout_ms),
        },
        DefinitionFile {
            path: "agent.yaml".to_owned(),
            content: AGENT.to_owned(),
        },
        DefinitionFile {
            path: "workflow.yaml".to_owned(),
            content: workflow(),
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bundle_parses_with_every_tool_and_the_probe() {
        use belay_engine::definitions::{RegisteredNames, SourceFile, parse_bundle};
        let files: Vec<SourceFile> = bundle(2000)
            .into_iter()
            .map(|f| SourceFile {
                path: f.path,
                content: f.content,
            })
            .collect();
        let bundle = match parse_bundle(&files, &RegisteredNames::default()) {
            Ok(bundle) => bundle,
            Err(errors) => panic!("the chaos bundle does not parse: {errors:?}"),
        };
        let mut names: Vec<&str> = bundle.tools.iter().map(|t| t.name.as_str()).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            [
                "chaos_idempotent",
                "chaos_never",
                "chaos_probe",
                "chaos_reconcile",
                "chaos_reconcile_probed"
            ]
        );
        let probed = bundle
            .tools
            .iter()
            .find(|t| t.name == "chaos_reconcile_probed")
            .and_then(|t| t.reconcile_with.clone());
        assert_eq!(probed.as_deref(), Some(PROBE_TOOL));
    }
}
