//! Tests of agents and workflows from YAML: every key of an agent and of a
//! workflow, their defaults and errors, the workflow graph, documents and
//! kinds, and YAML syntax (positions, YAML 1.1 booleans, non-string keys).

use super::*;
use serde_json::json;

const FILE: &str = "agents/onboarding.yaml";

fn parse(content: &str) -> YamlOutput {
    parse_yaml_file(FILE, content)
}

/// Errors as `line:column: message`.
fn errors(content: &str) -> Vec<String> {
    let mut out = parse(content);
    // parse_bundle sorts; per file, errors come in decoding order.
    out.errors.sort_by_key(|e| (e.line, e.column));
    out.errors
        .iter()
        .map(|e| {
            assert_eq!(e.file, FILE);
            format!("{}:{}: {}", e.line, e.column, e.message)
        })
        .collect()
}

fn agent(extra: &str) -> String {
    format!("kind: agent\nname: a\nmodel: m\ninstructions: do it\n{extra}")
}

fn workflow(nodes: &str) -> String {
    format!("kind: workflow\nname: w\nnodes:\n{nodes}")
}

#[test]
fn full_agent() {
    let out = parse(
        r#"# leading comment
kind: agent
name: onboarding_agent
model: scripted-onboarding
instructions: |
  You onboard new customers.
tools: [lookup_customer, create_account, send_welcome_email]
grants: [crm.read, crm.write, email.send]
loop:
  type: bounded_loop
  max_model_steps: 8
  max_tool_calls: 10
budget:
  max_tokens: 100000
limits:
  max_argument_bytes: 1000
  max_result_bytes: 2000
  max_model_attempts: 3
  max_tool_attempts: 4
max_output_tokens: 1024
"#,
    );
    assert_eq!(out.errors, vec![]);
    assert_eq!(
        out.agents,
        vec![AgentDef {
            name: "onboarding_agent".into(),
            model: "scripted-onboarding".into(),
            provider: None,
            pool: None,
            instructions: "You onboard new customers.\n".into(),
            tools: vec![
                "lookup_customer".into(),
                "create_account".into(),
                "send_welcome_email".into()
            ],
            grants: vec!["crm.read".into(), "crm.write".into(), "email.send".into()],
            loop_policy: LoopPolicy::BoundedLoop {
                max_model_steps: 8,
                max_tool_calls: 10
            },
            budget: Budget {
                max_tokens: Some(100_000),
                ..Budget::default()
            },
            max_argument_bytes: 1000,
            max_result_bytes: 2000,
            max_model_attempts: 3,
            max_tool_attempts: 4,
            max_output_tokens: Some(1024),
            pricing: None,
            max_identical_calls: crate::model::DEFAULT_MAX_IDENTICAL_CALLS,
            on_tool_failure: OnToolFailure::Continue,
            output_schema: None,
            pii_redaction: Vec::new(),
            source_file: FILE.into(),
            source_line: 2,
        }]
    );
    assert_eq!(
        out.declared_agents,
        vec![NameAt {
            name: "onboarding_agent".into(),
            line: 3,
            column: 7
        }]
    );
    let refs: Vec<(String, u32, u32)> = out
        .tool_refs
        .iter()
        .map(|r| (r.name.clone(), r.line, r.column))
        .collect();
    assert_eq!(
        refs,
        vec![
            ("lookup_customer".to_string(), 7, 9),
            ("create_account".to_string(), 7, 26),
            ("send_welcome_email".to_string(), 7, 42)
        ]
    );
}

#[test]
fn agent_defaults() {
    let out = parse(&agent(""));
    assert_eq!(out.errors, vec![]);
    let a = &out.agents[0];
    assert_eq!(a.tools, Vec::<String>::new());
    assert_eq!(a.grants, Vec::<String>::new());
    assert_eq!(
        a.loop_policy,
        LoopPolicy::BoundedLoop {
            max_model_steps: 10,
            max_tool_calls: 20
        }
    );
    assert_eq!(a.budget, Budget::default());
    assert_eq!(
        (
            a.max_argument_bytes,
            a.max_result_bytes,
            a.max_model_attempts,
            a.max_tool_attempts
        ),
        (65_536, 16_384, 5, 5)
    );
    assert_eq!(a.max_output_tokens, None);
    assert_eq!(a.source_line, 1);
    // A loop without `type`, with one bound, keeps the other default;
    // explicit nulls mean "not set".
    let out = parse(&agent(
        "loop:\n  max_tool_calls: 3\nbudget: ~\nmax_output_tokens: null\ntools:\n",
    ));
    assert_eq!(out.errors, vec![]);
    assert_eq!(
        out.agents[0].loop_policy,
        LoopPolicy::BoundedLoop {
            max_model_steps: 10,
            max_tool_calls: 3
        }
    );
}

#[test]
fn agent_missing_required_keys() {
    assert_eq!(
        errors("kind: agent\ntools: [x]\n"),
        vec![
            "1:1: agent is missing `name:`",
            "1:1: agent is missing `model:`",
            "1:1: agent is missing `instructions:`",
        ]
    );
    assert_eq!(
        errors("kind: agent\nname: a\nmodel: \"\"\ninstructions: 5\n"),
        vec![
            "3:8: `model` must not be empty",
            "4:15: `instructions` must be a string, found a number",
        ]
    );
}

#[test]
fn budgets_pricing_and_stop_conditions() {
    let out = parse(&agent(
        "loop:\n  type: exactly_one_call\nbudget:\n  max_input_tokens: 10\n  max_output_tokens: 5\n  max_cost_usd: 0.25\npricing:\n  input_per_million_usd: 3\n  output_per_million_usd: 15.5\nmax_identical_calls: 0\non_tool_failure: stop\n",
    ));
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    let a = &out.agents[0];
    assert_eq!(a.loop_policy, LoopPolicy::ExactlyOneCall);
    assert_eq!(a.budget.max_input_tokens, Some(10));
    assert_eq!(a.budget.max_output_tokens, Some(5));
    assert_eq!(a.budget.max_cost_usd, Some(0.25));
    assert_eq!(
        a.pricing,
        Some(Pricing {
            input_per_million_usd: 3.0,
            output_per_million_usd: 15.5
        })
    );
    assert_eq!(a.max_identical_calls, 0);
    assert_eq!(a.on_tool_failure, OnToolFailure::Stop);
    assert_eq!(
        errors(&agent(
            "loop:\n  type: exactly_one_call\n  max_model_steps: 2\nbudget:\n  max_cost_usd: -1\n  max_model_steps: 3\npricing:\n  input_per_million_usd: x\non_tool_failure: retry\n"
        )),
        vec![
            "7:20: `max_model_steps` applies to `bounded_loop` only (`exactly_one_call` makes one model call and no tool call)",
            "9:17: `max_cost_usd` must be more than 0, found -1",
            "10:3: unknown key `max_model_steps` in `budget` (expected one of: max_tokens, max_input_tokens, max_output_tokens, max_cost_usd, max_wall_time)",
            "12:3: `pricing` is missing `output_per_million_usd:`",
            "12:26: `input_per_million_usd` must be an amount of US dollars, found \"x\"",
            "13:18: unknown `on_tool_failure: retry` (expected `continue` or `stop`)",
        ]
    );
    assert_eq!(
        errors(&agent("budget:\n  max_cost_usd: 1\n")),
        vec![
            "6:3: `budget.max_cost_usd` needs `pricing:` (`input_per_million_usd`, `output_per_million_usd`) to count cost"
        ]
    );
    // A workflow's budget covers the whole run.
    let out = parse(
        "kind: workflow\nname: w\nbudget:\n  max_model_steps: 4\n  max_tool_calls: 9\n  max_tokens: 100\nnodes:\n  - id: done\n    type: succeed\n",
    );
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    assert_eq!(out.workflows[0].budget.max_model_steps, Some(4));
    assert_eq!(out.workflows[0].budget.max_tool_calls, Some(9));
    assert_eq!(out.workflows[0].budget.max_tokens, Some(100));
}

#[test]
fn wall_time_budgets_of_an_agent_and_of_a_run() {
    // humantime text or whole ms, like the waits' timeouts.
    let out = parse(&agent("budget:\n  max_wall_time: 1h 30m\n"));
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    assert_eq!(out.agents[0].budget.max_wall_time_ms, Some(5_400_000));
    let out = parse(&agent("budget:\n  max_wall_time: 250\n"));
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    assert_eq!(out.agents[0].budget.max_wall_time_ms, Some(250));
    let out = parse(
        "kind: workflow\nname: w\nbudget:\n  max_wall_time: 2d\nnodes:\n  - id: done\n    type: succeed\n",
    );
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    assert_eq!(out.workflows[0].budget.max_wall_time_ms, Some(172_800_000));
    // Bad durations are refused at their position, every one of them.
    assert_eq!(
        errors(&agent("budget:\n  max_wall_time: soon\n  max_tokens: 5\n")),
        vec![
            "6:18: `max_wall_time` is not a duration (expected number at 0): write ms as a number, or text like `90s`, `15m`, `3d`",
        ]
    );
    assert_eq!(
        errors(&agent("budget:\n  max_wall_time: 0s\n")),
        vec!["6:18: `max_wall_time` must be at least 1 ms, found \"0s\""]
    );
    assert_eq!(
        errors(&agent("budget:\n  max_wall_time: -5\n")),
        vec!["6:18: `max_wall_time` must be at least 1, found -5"]
    );
    assert_eq!(
        errors(
            "kind: workflow\nname: w\nbudget:\n  max_wall_time: [1h]\nnodes:\n  - id: done\n    type: succeed\n"
        ),
        vec!["4:18: `max_wall_time` must be a whole number of at least 1, found a list"]
    );
    // Longer than a durable timer may wait (the stores' clocks end).
    for long in ["18446744073709551615", "3651d", "1000000000000000"] {
        assert_eq!(
            errors(&agent(&format!("budget:\n  max_wall_time: {long}\n"))),
            vec![
                "6:18: `max_wall_time` is longer than 10 years (315360000000 ms), the longest a durable timer may wait"
            ],
            "{long}"
        );
    }
    let out = parse(&agent("budget:\n  max_wall_time: 3650d\n"));
    assert!(out.errors.is_empty(), "{:?}", out.errors);
}

#[test]
fn pii_redaction_is_every_kind_some_kinds_or_off() {
    use crate::model::PiiKind;
    let kinds = |extra: &str| {
        let out = parse(&agent(extra));
        assert_eq!(out.errors, vec![], "{extra}");
        out.agents[0].pii_redaction.clone()
    };
    assert_eq!(kinds(""), []);
    assert_eq!(kinds("pii_redaction: false\n"), []);
    assert_eq!(kinds("pii_redaction: true\n"), PiiKind::ALL);
    assert_eq!(
        kinds("pii_redaction: [card, email]\n"),
        [PiiKind::Email, PiiKind::Card]
    );
    assert_eq!(
        errors(&agent("pii_redaction: [email, name]\n")),
        ["5:24: unknown kind `name` in `pii_redaction` (expected email, phone, card, iban, ssn)"]
    );
    assert_eq!(
        errors(&agent("pii_redaction: yes\n")),
        [
            "5:16: `pii_redaction` takes `true`, `false` or a list of kinds (email, phone, card, iban, ssn), found \"yes\""
        ]
    );
    let empty = errors(&agent("pii_redaction:\n"));
    assert_eq!(empty.len(), 1, "{empty:?}");
    assert!(
        empty[0].contains("`pii_redaction:` has no value"),
        "{empty:?}"
    );
    assert_eq!(
        errors(&agent("pii_redaction: []\n")),
        ["5:16: `pii_redaction: []` turns nothing on; write `false`, or name kinds"]
    );
}

#[test]
fn an_agent_output_schema_is_a_compiled_json_schema() {
    let out = parse(&agent(
        "output_schema:\n  type: object\n  required: [account_id]\n  properties:\n    account_id: {type: string}\n",
    ));
    assert_eq!(out.errors, vec![]);
    assert_eq!(
        out.agents[0].output_schema,
        Some(json!({
            "type": "object",
            "required": ["account_id"],
            "properties": {"account_id": {"type": "string"}}
        }))
    );
    let errs = errors(&agent("output_schema:\n  type: 5\n"));
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(
        errs[0].starts_with("6:3: `output_schema` is not a valid JSON Schema: "),
        "{errs:?}"
    );
}

#[test]
fn agent_value_errors() {
    assert_eq!(
        errors(&agent(
            "tools: [Lookup, ok_tool, ok_tool, 3]\ngrants: [crm read, crm.read, crm.read]\nloop:\n  type: exactly_one_call\nbudget:\n  max_tokens: 0\n  max_cost: 1\nlimits:\n  max_argument_bytes: -1\n  max_result_bytes: 1.5\n  max_model_attempts: 4294967296\n  max_tool_attempts: 2.0\n  max_tool_retries: 1\nmax_output_tokens: lots\ncolour: blue\n"
        )),
        vec![
            "5:9: tool name `Lookup` must be lower case letters, digits and `_`, starting with a letter",
            "5:26: `ok_tool` is listed twice in `tools` (first on line 5)",
            "5:35: each entry of `tools` must be a string, found a number",
            "6:10: grant `crm read` must not contain whitespace",
            "6:30: `crm.read` is listed twice in `grants` (first on line 6)",
            "10:15: `max_tokens` must be at least 1, found 0",
            "11:3: unknown key `max_cost` in `budget` (expected one of: max_tokens, max_input_tokens, max_output_tokens, max_cost_usd, max_wall_time)",
            "13:23: `max_argument_bytes` must be at least 1, found -1",
            "14:21: `max_result_bytes` must be a whole number of at least 1, found 1.5",
            "15:23: `max_model_attempts` is too large: 4294967296",
            "16:22: `max_tool_attempts` must be a whole number, written without a decimal point",
            "17:3: unknown key `max_tool_retries` in `limits` (expected one of: max_argument_bytes, max_result_bytes, max_model_attempts, max_tool_attempts)",
            "18:20: `max_output_tokens` must be a whole number of at least 1, found \"lots\"",
            "19:1: unknown key `colour` in an agent (expected one of: kind, name, model, instructions, tools, grants, loop, budget, limits, max_output_tokens, pricing, max_identical_calls, on_tool_failure, output_schema, pii_redaction, provider, pool)",
        ]
    );
    assert_eq!(
        errors(&agent(
            "loop:\n  type: forever\n  max_steps: 3\ntools: x\nlimits: 5\n"
        )),
        vec![
            "6:9: unknown loop type `forever` (expected `bounded_loop` or `exactly_one_call`)",
            "8:8: `tools` must be a list, found a string",
            "9:9: `limits` must be a mapping, found a number",
        ]
    );
    assert_eq!(
        errors(&agent("loop:\n  max_model_steps: 0\n  max_steps: 3\n")),
        vec![
            "6:20: `max_model_steps` must be at least 1, found 0",
            "7:3: unknown key `max_steps` in `loop` (expected one of: type, max_model_steps, max_tool_calls)",
        ]
    );
}

#[test]
fn full_workflow() {
    let out = parse(
        r#"kind: workflow
name: onboarding
input_schema: {type: object, required: [email], properties: {email: {type: string}}}
start: intake
nodes:
  - id: intake
    type: agent
    agent: onboarding_agent
    grants: [crm.admin]
    next: review
  - id: review
    type: agent
    agent: reviewer
    next: null
"#,
    );
    assert_eq!(out.errors, vec![]);
    assert_eq!(
        out.workflows,
        vec![WorkflowDef {
            name: "onboarding".into(),
            start: "intake".into(),
            nodes: vec![
                NodeDef {
                    id: "intake".into(),
                    kind: NodeKind::Agent {
                        agent: "onboarding_agent".into(),
                        input: None,
                    },
                    grants: vec!["crm.admin".into()],
                    next: Some("review".into()),
                    source_line: 6,
                },
                NodeDef {
                    id: "review".into(),
                    kind: NodeKind::Agent {
                        agent: "reviewer".into(),
                        input: None,
                    },
                    grants: vec![],
                    next: None,
                    source_line: 11,
                },
            ],
            input_schema: Some(json!({
                "type": "object",
                "required": ["email"],
                "properties": {"email": {"type": "string"}}
            })),
            budget: Budget::default(),
            source_file: FILE.into(),
            source_line: 1,
        }]
    );
    let refs: Vec<(&str, u32)> = out
        .agent_refs
        .iter()
        .map(|r| (r.name.as_str(), r.line))
        .collect();
    assert_eq!(refs, vec![("onboarding_agent", 8), ("reviewer", 13)]);
}

#[test]
fn start_defaults_to_the_first_node() {
    let out = parse(&workflow(
        "  - {id: b, type: agent, agent: x, next: a}\n  - {id: a, type: agent, agent: x}\n",
    ));
    assert_eq!(out.errors, vec![]);
    assert_eq!(out.workflows[0].start, "b");
    assert_eq!(out.workflows[0].input_schema, None);
}

#[test]
fn node_errors() {
    assert_eq!(
        errors(&workflow(
            "  - id: wait_docs\n    type: wait\n    duration: 7d\n  - id: x\n    type: teleport\n  - id: BadId\n    type: agent\n    agent: a\n  - type: agent\n    agent: a\n    retries: 3\n  - id: y\n  - just a string\n"
        )),
        vec![
            "8:11: unknown node type `teleport` (expected one of: agent, tool, wait, approval, branch, workflow, set, fail, succeed)",
            "9:9: node id name `BadId` must be lower case letters, digits and `_`, starting with a letter",
            "12:5: node is missing `id:`",
            "14:5: unknown key `retries` in an agent node (expected one of: id, type, agent, input, grants, next)",
            "15:5: node is missing `type:`",
            "16:5: a node must be a mapping, found a string",
        ]
    );
    assert_eq!(
        errors(&workflow("  - id: a\n    type: agent\n")),
        vec!["4:5: an agent node is missing `agent:`"]
    );
}

#[test]
fn graph_errors() {
    assert_eq!(
        errors(
            "kind: workflow\nname: w\nstart: nowhere\nnodes:\n  - {id: a, type: agent, agent: x, next: b}\n  - {id: b, type: agent, agent: x, next: missing}\n  - {id: a, type: agent, agent: x}\n"
        ),
        vec![
            "3:8: `start` names no node of this workflow: `nowhere`",
            "6:42: `next` names no node of this workflow: `missing`",
            "7:10: duplicate node id `a` (first on line 5)",
        ]
    );
    assert_eq!(
        errors(&workflow(
            "  - {id: a, type: agent, agent: x, next: b}\n  - {id: b, type: agent, agent: x, next: c}\n  - {id: c, type: agent, agent: x, next: b}\n  - {id: d, type: agent, agent: x, next: d}\n"
        )),
        vec![
            "5:42: nodes form a cycle (b -> c -> b) with no way out; the workflow could never finish",
            "7:42: nodes form a cycle (d -> d) with no way out; the workflow could never finish",
        ]
    );
    assert_eq!(
        errors("kind: workflow\nname: w\nnodes: []\n"),
        vec!["3:8: a workflow needs at least one node"]
    );
    assert_eq!(
        errors("kind: workflow\nname: w\n"),
        vec!["1:1: workflow is missing `nodes:`"]
    );
}

#[test]
fn input_schema_must_be_a_schema() {
    let e = errors(&format!(
        "kind: workflow\nname: w\ninput_schema:\n  type: banana\n{}",
        "nodes:\n  - {id: a, type: agent, agent: x}\n"
    ));
    assert_eq!(e.len(), 1);
    assert!(
        e[0].starts_with("4:3: `input_schema` is not a valid JSON Schema: "),
        "{e:?}"
    );
    assert_eq!(
        errors(
            "kind: workflow\nname: w\ninput_schema: {maximum: .inf}\nnodes:\n  - {id: a, type: agent, agent: x}\n"
        ),
        vec!["3:25: invalid YAML: non-finite float `.inf` rejected by the configured policy"]
    );
    assert_eq!(
        errors("kind: workflow\nname: w\ninput_schema: {$ref: \"https://evil.example/s.json\"}\nnodes:\n  - {id: a, type: agent, agent: x}\n")
            .len(),
        1
    );
}

#[test]
fn documents_and_kinds() {
    let out = parse(&format!(
        "{}---\n# second\n{}---\n",
        agent(""),
        workflow("  - id: n\n    type: agent\n    agent: a\n")
    ));
    assert_eq!(out.errors, vec![]);
    assert_eq!(out.agents.len(), 1);
    assert_eq!(out.workflows.len(), 1);
    assert_eq!(out.workflows[0].source_line, 7);
    assert_eq!(out.workflows[0].nodes[0].source_line, 10);
    assert_eq!(
        errors("kind: agent\n---\nkind: robot\n---\n- a\n---\nname: x\n---\nkind: [agent]\n"),
        vec![
            "1:1: agent is missing `name:`",
            "1:1: agent is missing `model:`",
            "1:1: agent is missing `instructions:`",
            "3:7: unknown kind `robot` (expected `agent` or `workflow`)",
            "5:1: a document must be a mapping, found a list",
            "7:1: missing `kind:` (`agent` or `workflow`)",
            "9:7: `kind` must be `agent` or `workflow`, found a list",
        ]
    );
    // An empty file declares nothing, without error.
    let out = parse("# nothing yet\n");
    assert_eq!((out.errors.len(), out.agents.len()), (0, 0));
}

#[test]
fn yaml_syntax_errors_have_positions() {
    assert_eq!(
        errors("kind: agent\nname: [a\nmodel: x\n"),
        vec!["3:6: invalid YAML: illegal placement of ':' indicator"]
    );
    let e = errors("kind: agent\nname: a\nname: b\n");
    assert_eq!(e.len(), 1);
    assert!(
        e[0].starts_with("3:1: invalid YAML: duplicate mapping key: name"),
        "{e:?}"
    );
}

#[test]
fn yaml_1_1_booleans_stay_strings() {
    let out = parse(&format!(
        "{}---\n{}",
        agent("grants: [on, yes]\n"),
        workflow("  - {id: n, type: agent, agent: y}\n")
    ));
    assert_eq!(out.errors, vec![]);
    assert_eq!(
        out.agents[0].grants,
        vec!["on".to_string(), "yes".to_string()]
    );
    assert_eq!(out.workflows[0].nodes[0].id, "n");
    assert_eq!(
        out.workflows[0].nodes[0].kind,
        NodeKind::Agent {
            agent: "y".into(),
            input: None
        }
    );
}

#[test]
fn non_string_keys() {
    assert_eq!(
        errors(&agent("? [a]\n: b\n")),
        vec!["5:3: keys must be strings, found a list"]
    );
    // Scalar keys are read as text, so `1:` is an unknown key "1".
    assert_eq!(
        errors(&agent("1: b\n")),
        vec![
            "5:1: unknown key `1` in an agent (expected one of: kind, name, model, instructions, tools, grants, loop, budget, limits, max_output_tokens, pricing, max_identical_calls, on_tool_failure, output_schema, pii_redaction, provider, pool)"
        ]
    );
}

#[test]
fn literal_until_must_be_a_time() {
    assert_eq!(
        errors(&workflow(
            "  - {id: a, type: wait, until: \"next tuesday\"}\n  - id: b\n    type: wait\n    for:\n      - {until: 2030-13-01T00:00:00Z}\n      - {until: 5}\n"
        )),
        vec![
            "4:32: `until` is not an RFC 3339 time (premature end of input): \"next tuesday\"; write a time such as `2030-01-31T09:00:00Z`, or a `${ }` expression that gives one",
            "8:17: `until` is not an RFC 3339 time (input is out of range): \"2030-13-01T00:00:00Z\"; write a time such as `2030-01-31T09:00:00Z`, or a `${ }` expression that gives one",
            "9:17: `until` must be an RFC 3339 time string, not a number; write a time such as `2030-01-31T09:00:00Z`, or a `${ }` expression that gives one",
        ]
    );
    // A real time, with spaces around it, and an expression (checked
    // when the wait starts) are both fine.
    let out = parse(&workflow(
        "  - {id: a, type: wait, until: \" 2030-01-31T09:00:00+01:00 \"}\n  - {id: b, type: wait, until: \"${ .input.deadline }\"}\n",
    ));
    assert_eq!(out.errors, vec![]);
    assert_eq!(out.workflows[0].nodes.len(), 2);
}

#[test]
fn loops_that_neither_wait_nor_work_are_refused() {
    // A counter loop of branch and set: it could leave, but it would
    // go round inside one step.
    let e = errors(&workflow(
        "  - {id: count, type: set, values: {n: \"${ (.vars.n // 0) + 1 }\"}, next: check}\n  - id: check\n    type: branch\n    cases:\n      - {when: \"${ .vars.n < 3 }\", next: count}\n    default: done\n  - {id: done, type: succeed}\n",
    ));
    assert_eq!(
        e,
        vec![
            "4:74: nodes form a loop (count -> check -> count) that neither waits nor does work: a run that enters it would go round inside one step without end; put a node in it that waits (`wait` with a `duration` or a signal, an `approval`) or does work (`agent`, `tool`)"
        ]
    );
    // Branches alone, an async child, and a fixed `until` are the same.
    let e = errors(&workflow(
        "  - id: a\n    type: branch\n    cases: [{when: \"${ .input.x }\", next: b}]\n    default: done\n  - id: b\n    type: workflow\n    workflow: child\n    mode: async\n    next: c\n  - {id: c, type: wait, until: \"2030-01-01T00:00:00Z\", next: a}\n  - {id: done, type: succeed}\n  - id: s\n    type: branch\n    cases: [{when: \"${ true }\", next: s}]\n    default: done\n",
    ));
    assert_eq!(e.len(), 2, "{e:?}");
    assert!(
        e[0].starts_with("6:43: nodes form a loop (a -> b -> c -> a)"),
        "{e:?}"
    );
    assert!(
        e[1].starts_with("17:39: nodes form a loop (s -> s)"),
        "{e:?}"
    );
    // A forced cycle is reported once, by the forced-cycle check.
    let e = errors(&workflow(
        "  - {id: a, type: set, values: {x: 1}, next: b}\n  - {id: b, type: set, values: {x: 2}, next: a}\n",
    ));
    assert_eq!(
        e,
        vec![
            "4:46: nodes form a cycle (a -> b -> a) with no way out; the workflow could never finish"
        ]
    );
    // Polling loops: a duration, a signal, an `until` expression, a
    // timeout, an agent or a tool in the loop make it a step at a time.
    for breaker in [
        "{id: w, type: wait, duration: 10m, next: check}",
        "{id: w, type: wait, signal: poke, next: check}",
        "{id: w, type: wait, until: \"${ .vars.next }\", next: check}",
        "{id: w, type: wait, until: \"2030-01-01T00:00:00Z\", timeout: 1h, on_timeout: check, next: check}",
        "{id: w, type: agent, agent: x, next: check}",
        "{id: w, type: tool, tool: t, next: check}",
        "{id: w, type: workflow, workflow: child, next: check}",
    ] {
        let out = parse(&workflow(&format!(
            "  - {breaker}\n  - id: check\n    type: branch\n    cases: [{{when: \"${{ .vars.done }}\", next: done}}]\n    default: w\n  - {{id: done, type: succeed}}\n"
        )));
        assert_eq!(out.errors, vec![], "{breaker}");
    }
}

#[test]
fn an_agent_names_a_provider_and_a_pool_checked_where_they_are() {
    let out = parse(&agent("provider: anthropic\npool: gpu\n"));
    assert_eq!(out.errors, vec![]);
    assert_eq!(out.agents[0].provider.as_deref(), Some("anthropic"));
    assert_eq!(out.agents[0].pool.as_deref(), Some("gpu"));
    assert_eq!(
        errors(&agent("provider: claude\npool: \"a b\"\n")),
        [
            "5:11: unknown `provider: claude` (expected `openai` or `anthropic`)",
            "6:7: pool name `a b` must be lower case letters, digits, `-` and `_`, starting with a letter"
        ]
    );
}
