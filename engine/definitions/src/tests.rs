//! Tests of a bundle as a whole: references across files (tools, probes,
//! file imports, registered names, workflows that start workflows), every
//! error of every file in order, and names and permissions.

use super::model::{LoopPolicy, NodeKind, RepeatSafety, ToolBindingDef};
use super::*;
use serde_json::json;

fn file(path: &str, content: &str) -> SourceFile {
    SourceFile {
        path: path.into(),
        content: content.into(),
    }
}

/// Errors rendered through `Display`.
fn rendered(errors: Vec<DefinitionError>) -> Vec<String> {
    errors.iter().map(ToString::to_string).collect()
}

const ONBOARDING_TOOLS: &str = r#"# Tools of the onboarding example.
TOOLS:
  lookup_customer(email: string) -> {found: boolean, customer_id?: string, name?: string}
    description: "Find a customer by email"
    type: http
    endpoint: "https://crm.example.com/customers/lookup"
    method: GET
    timeout: 5s
    permission: crm.read
    repeat_safety: idempotent

  create_account(email: string, name: string, plan: string = "starter") -> {account_id: string}
    description: "Create the customer's account"
    type: http
    endpoint: "/accounts"
    method: POST
    headers:
      X-Api-Version: "2024-01"
    permission: crm.write
    repeat_safety: reconcile

  send_welcome_email(email: string, account_id: string) -> {message_id: string}
    description: "Send the welcome email"
    type: http
    endpoint: /emails/welcome
    permission: email.send
    repeat_safety: idempotent
"#;

const ONBOARDING_YAML: &str = r#"kind: agent
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
  max_argument_bytes: 65536
  max_result_bytes: 16384
  max_model_attempts: 5
  max_tool_attempts: 5
max_output_tokens: 1024
---
kind: workflow
name: onboarding
input_schema: {type: object, required: [email], properties: {email: {type: string}}}
start: intake
nodes:
  - id: intake
    type: agent
    agent: onboarding_agent
    grants: []
    next: null
"#;

#[test]
fn onboarding_bundle() {
    let bundle = parse_bundle(
        &[
            file("tools/onboarding.tools.abl", ONBOARDING_TOOLS),
            file("onboarding.yaml", ONBOARDING_YAML),
        ],
        &RegisteredNames::default(),
    )
    .unwrap();

    assert_eq!(bundle.tools.len(), 3);
    let lookup = &bundle.tools[0];
    assert_eq!(lookup.name, "lookup_customer");
    assert_eq!(lookup.description, "Find a customer by email");
    assert_eq!(lookup.permission, "crm.read");
    assert_eq!(lookup.repeat_safety, RepeatSafety::Idempotent);
    assert_eq!(lookup.source_file, "tools/onboarding.tools.abl");
    assert_eq!(lookup.source_line, 3);
    assert_eq!(
        lookup.input_schema,
        json!({
            "type": "object",
            "properties": {"email": {"type": "string"}},
            "required": ["email"],
            "additionalProperties": false
        })
    );
    assert_eq!(
        lookup.output_schema,
        json!({
            "type": "object",
            "properties": {
                "found": {"type": "boolean"},
                "customer_id": {"type": "string"},
                "name": {"type": "string"}
            },
            "required": ["found"],
            "additionalProperties": true
        })
    );
    assert_eq!(
        lookup.binding,
        ToolBindingDef::Http {
            endpoint: "https://crm.example.com/customers/lookup".into(),
            method: "GET".into(),
            headers: BTreeMap::new(),
            timeout_ms: 5_000,
            request: Default::default(),
        }
    );

    let create = &bundle.tools[1];
    assert_eq!(create.repeat_safety, RepeatSafety::Reconcile);
    assert_eq!(create.permission, "crm.write");
    assert_eq!(create.source_line, 12);
    assert_eq!(
        create.input_schema,
        json!({
            "type": "object",
            "properties": {
                "email": {"type": "string"},
                "name": {"type": "string"},
                "plan": {"type": "string", "default": "starter"}
            },
            "required": ["email", "name"],
            "additionalProperties": false
        })
    );
    assert_eq!(
        create.output_schema,
        json!({
            "type": "object",
            "properties": {"account_id": {"type": "string"}},
            "required": ["account_id"],
            "additionalProperties": true
        })
    );
    assert_eq!(
        create.binding,
        ToolBindingDef::Http {
            endpoint: "/accounts".into(),
            method: "POST".into(),
            headers: BTreeMap::from([("X-Api-Version".into(), "2024-01".into())]),
            timeout_ms: 30_000,
            request: Default::default(),
        }
    );

    let send = &bundle.tools[2];
    assert_eq!(send.name, "send_welcome_email");
    assert_eq!(send.repeat_safety, RepeatSafety::Idempotent);
    assert_eq!(
        send.input_schema["required"],
        json!(["email", "account_id"])
    );
    assert_eq!(
        send.binding,
        ToolBindingDef::Http {
            endpoint: "/emails/welcome".into(),
            method: "POST".into(),
            headers: BTreeMap::new(),
            timeout_ms: 30_000,
            request: Default::default(),
        }
    );

    assert_eq!(bundle.agents.len(), 1);
    let agent = &bundle.agents[0];
    assert_eq!(agent.name, "onboarding_agent");
    assert_eq!(agent.model, "scripted-onboarding");
    assert_eq!(agent.instructions, "You onboard new customers.\n");
    assert_eq!(
        agent.tools,
        ["lookup_customer", "create_account", "send_welcome_email"]
    );
    assert_eq!(agent.grants, ["crm.read", "crm.write", "email.send"]);
    assert_eq!(
        agent.loop_policy,
        LoopPolicy::BoundedLoop {
            max_model_steps: 8,
            max_tool_calls: 10
        }
    );
    assert_eq!(agent.budget.max_tokens, Some(100_000));
    assert_eq!(agent.max_output_tokens, Some(1024));
    assert_eq!(agent.source_file, "onboarding.yaml");

    assert_eq!(bundle.workflows.len(), 1);
    let wf = &bundle.workflows[0];
    assert_eq!(wf.name, "onboarding");
    assert_eq!(wf.start, "intake");
    assert_eq!(wf.source_line, 21);
    assert_eq!(wf.nodes.len(), 1);
    assert_eq!(
        wf.nodes[0].kind,
        NodeKind::Agent {
            agent: "onboarding_agent".into(),
            input: None,
        }
    );
    assert_eq!(wf.nodes[0].next, None);
    assert_eq!(wf.nodes[0].source_line, 26);

    // The pieces fit together: the workflow's input schema and each
    // tool's input schema validate real arguments.
    let input_schema = wf.input_schema.as_ref().unwrap();
    assert_eq!(
        validate_json(input_schema, &json!({"email": "a@b.c"})),
        Ok(())
    );
    assert_eq!(
        validate_json(input_schema, &json!({})),
        Err(vec!["/: \"email\" is a required property".to_string()])
    );
    assert_eq!(
        validate_json(
            &create.input_schema,
            &json!({"email": "a@b.c", "name": "Ada", "plan": "pro"})
        ),
        Ok(())
    );

    // The bundle round-trips through its persisted JSON form.
    let stored = serde_json::to_value(&bundle).unwrap();
    let back: model::Bundle = serde_json::from_value(stored).unwrap();
    assert_eq!(back, bundle);
}

#[test]
fn references_may_use_registered_names() {
    let yaml = "kind: agent\nname: a\nmodel: m\ninstructions: i\ntools: [old_tool]\n---\nkind: workflow\nname: w\nnodes:\n  - {id: n, type: agent, agent: old_agent}\n";
    let files = [file("a.yaml", yaml)];
    assert_eq!(
        rendered(parse_bundle(&files, &RegisteredNames::default()).unwrap_err()),
        vec![
            "a.yaml:5:9: unknown tool `old_tool`: not declared in this bundle nor registered",
            "a.yaml:10:33: unknown agent `old_agent`: not declared in this bundle nor registered",
        ]
    );
    let registered = RegisteredNames {
        tools: BTreeSet::from(["old_tool".to_string()]),
        agents: BTreeSet::from(["old_agent".to_string()]),
        workflows: BTreeSet::new(),
        config: BTreeMap::new(),
    };
    let bundle = parse_bundle(&files, &registered).unwrap();
    assert_eq!(bundle.agents[0].tools, ["old_tool"]);
}

/// A tools file of one `idempotent` HTTP tool per name, after `head` lines.
fn tools_of(head: &str, names: &[&str]) -> String {
    let mut out = format!("TOOLS:\n{head}");
    for n in names {
        out.push_str(&format!(
            "  {n}(x: string) -> string\n    type: http\n    endpoint: /{n}\n    permission: p\n    repeat_safety: idempotent\n"
        ));
    }
    out
}

fn agent_with_tools(tools: &str) -> String {
    format!("kind: agent\nname: a\nmodel: m\ninstructions: i\ntools:\n{tools}")
}

#[test]
fn file_imports_give_an_agent_the_tools_of_a_file() {
    let files = [
        file(
            "defs/tools/hotels.tools.abl",
            &tools_of("", &["search_hotels", "get_hotel", "get_reviews"]),
        ),
        // A tools file passes on what it imports (with a file default
        // around it, which stays its own).
        file(
            "defs/tools/all.tools.abl",
            &tools_of(
                "  timeout: 5s\n  file: \"./hotels.tools.abl\" [get_hotel, get_reviews]\n",
                &["book"],
            ),
        ),
        file(
            "defs/agents/a.yaml",
            &agent_with_tools(
                "  - book\n  - file: ../tools/hotels.tools.abl\n    tools: [search_hotels, get_hotel]\n  - file: ../tools/all.tools.abl\n",
            ),
        ),
    ];
    let bundle = parse_bundle(&files, &RegisteredNames::default()).unwrap();
    // Named tools first, then each import's in order, without repeats.
    assert_eq!(
        bundle.agents[0].tools,
        ["book", "search_hotels", "get_hotel", "get_reviews"]
    );
    // Imports declare nothing: each tool is defined once, by its file.
    assert_eq!(bundle.tools.len(), 4);
    let all = [file(
        "agents/a.yaml",
        &agent_with_tools("  - file: ../defs/tools/hotels.tools.abl\n"),
    )];
    let moved: Vec<SourceFile> = files[..2]
        .iter()
        .map(|f| file(&f.path, &f.content))
        .chain(all)
        .collect();
    let bundle = parse_bundle(&moved, &RegisteredNames::default()).unwrap();
    assert_eq!(
        bundle.agents[0].tools,
        ["search_hotels", "get_hotel", "get_reviews"]
    );
}

#[test]
fn wrong_file_imports_are_refused_with_their_place() {
    let errors = |files: &[SourceFile]| {
        rendered(parse_bundle(files, &RegisteredNames::default()).unwrap_err())
    };
    let a = |head: &str| file("t/a.tools.abl", &tools_of(head, &["x"]));
    // A missing file, names the importer, line, column and the path.
    assert_eq!(
        errors(&[a("  file: \"./missing.tools.abl\"\n")]),
        vec![
            "t/a.tools.abl:2:9: imported file `./missing.tools.abl` (`t/missing.tools.abl`) is not in the bundle; register it together with `t/a.tools.abl`"
        ]
    );
    // An unknown tool in the list, at its column.
    assert_eq!(
        errors(&[
            a("  file: b.tools.abl [y, nope]\n"),
            file("t/b.tools.abl", &tools_of("", &["y", "z"]))
        ]),
        vec!["t/a.tools.abl:2:25: `nope` is not a tool of `b.tools.abl` (it has: y, z)"]
    );
    // A cycle, through another file and of a file with itself.
    assert_eq!(
        errors(&[
            a("  file: b.tools.abl\n"),
            file(
                "t/b.tools.abl",
                &tools_of("  file: \"../t/a.tools.abl\" [x]\n", &["y"])
            ),
        ]),
        vec!["t/b.tools.abl:2:9: import cycle: t/a.tools.abl -> t/b.tools.abl -> t/a.tools.abl"]
    );
    assert_eq!(
        errors(&[a("  file: ./a.tools.abl\n")]),
        vec!["t/a.tools.abl:2:9: import cycle: t/a.tools.abl -> t/a.tools.abl"]
    );
    // Leaving the bundle, absolute paths, and files that are no tools files.
    assert_eq!(
        errors(&[a("  file: ../../etc/x.tools.abl\n")]),
        vec![
            "t/a.tools.abl:2:9: `../../etc/x.tools.abl` leaves the bundle: `..` climbs above `t/a.tools.abl`'s folders"
        ]
    );
    assert_eq!(
        errors(&[a("  file: /etc/x.tools.abl\n")]),
        vec![
            "t/a.tools.abl:2:9: `/etc/x.tools.abl` is an absolute path; an import names a file of the bundle relative to the importing file (`./tools/crm.tools.abl`)"
        ]
    );
    let agent = file("t/a.yaml", &agent_with_tools("  - file: a.yaml\n"));
    assert_eq!(
        errors(&[agent]),
        vec![
            "t/a.yaml:6:11: `a.yaml` (`t/a.yaml`) is not a tools file: only `*.tools.abl` files can be imported"
        ]
    );
    // The shape of an agent's `file:` entry.
    let agent = file(
        "a.yaml",
        &agent_with_tools("  - file: b.tools.abl\n    tools: []\n    only: [x]\n  - tools: [x]\n"),
    );
    assert_eq!(
        errors(&[agent, file("b.tools.abl", &tools_of("", &["x"]))]),
        vec![
            "a.yaml:7:12: an empty `tools` list imports nothing; leave it out to import every tool of the file",
            "a.yaml:8:5: unknown key `only` in a `file:` entry of `tools` (expected one of: file, tools)",
            "a.yaml:9:5: a `file:` entry of `tools` is missing `file:`",
        ]
    );
}

#[test]
fn every_error_of_every_file_in_order() {
    let tools_a = "TOOLS:\n  dup(x: string) -> string\n    type: http\n    endpoint: /a\n    permission: p\n    repeat_safety: never\n";
    let tools_b = "TOOLS:\n  dup() -> string\n    type: http\n    endpoint: /b\n    permission: p\n    repeat_safety: never\n  broken(x: nope) -> string\n    permission: p\n";
    let yaml = "kind: agent\nname: a\nmodel: m\ninstructions: i\ntools: [broken, dup, ghost]\nextra: 1\n---\nkind: agent\nname: a\nmodel: m\ninstructions: i\n";
    let errors = parse_bundle(
        &[
            file("z.yaml", yaml),
            file("a.tools.abl", tools_a),
            file("b.tools.abl", tools_b),
            file("notes.txt", "hello"),
            file("a.tools.abl", tools_a),
        ],
        &RegisteredNames::default(),
    )
    .unwrap_err();
    assert_eq!(
        rendered(errors),
        vec![
            // `broken` has errors of its own but is declared, so the
            // agent listing it gets no extra error; `ghost` does.
            "z.yaml:5:22: unknown tool `ghost`: not declared in this bundle nor registered",
            "z.yaml:6:1: unknown key `extra` in an agent (expected one of: kind, name, model, instructions, tools, grants, loop, budget, limits, max_output_tokens, pricing, max_identical_calls, on_tool_failure, output_schema, pii_redaction, provider, pool)",
            "z.yaml:9:7: agent `a` is already declared at z.yaml:2",
            "a.tools.abl:1:1: this file appears twice in the bundle",
            "b.tools.abl:2:3: tool `dup` is already declared at a.tools.abl:2",
            "b.tools.abl:7:3: tool `broken` is missing `type: http` (how the tool is called)",
            "b.tools.abl:7:3: tool `broken` is missing `repeat_safety:` (`never`, `idempotent` or `reconcile`)",
            "b.tools.abl:7:13: unknown type `nope` (expected string, number, boolean, date, object, or `type[]`)",
            "notes.txt:1:1: `notes.txt` is not a definition file: expected `*.tools.abl` (tools) or `*.yaml` / `*.yml` (agents and workflows)",
        ]
    );
}

#[test]
fn reconcile_probes_are_checked_across_the_bundle() {
    let tools = "TOOLS:\n  create(email: string) -> {id: string}\n    type: http\n    endpoint: /c\n    permission: p\n    repeat_safety: reconcile\n    reconcile_with: find\n  find(idempotency_key: string) -> {id: string}\n    type: http\n    endpoint: /f/{idempotency_key}\n    method: GET\n    permission: p\n    repeat_safety: idempotent\n";
    let bundle = parse_bundle(&[file("t.tools.abl", tools)], &RegisteredNames::default()).unwrap();
    assert_eq!(bundle.tools[0].reconcile_with.as_deref(), Some("find"));
    assert_eq!(bundle.tools[1].reconcile_with, None);

    let bad = "TOOLS:\n  create(email: string) -> {id: string}\n    type: http\n    endpoint: /c\n    permission: p\n    repeat_safety: reconcile\n    reconcile_with: find\n  find(key: string) -> {id: string}\n    type: http\n    endpoint: /f\n    permission: p\n    repeat_safety: never\n  other() -> string\n    type: http\n    endpoint: /o\n    permission: p\n    repeat_safety: never\n    reconcile_with: ghost\n";
    assert_eq!(
        rendered(
            parse_bundle(&[file("t.tools.abl", bad)], &RegisteredNames::default()).unwrap_err()
        ),
        vec![
            "t.tools.abl:7:21: `find`, the reconcile probe of `create`, must be `repeat_safety: idempotent` and take an `idempotency_key: string` parameter",
            "t.tools.abl:18:21: `reconcile_with:` needs `repeat_safety: reconcile`",
            "t.tools.abl:18:21: unknown tool `ghost` in `reconcile_with:`: not declared in this bundle nor registered",
        ]
    );
}

#[test]
fn duplicate_tool_in_one_file() {
    let tool = "  f() -> string\n    type: http\n    endpoint: /f\n    permission: p\n    repeat_safety: never\n";
    let content = format!("TOOLS:\n{tool}{tool}");
    assert_eq!(
        rendered(
            parse_bundle(
                &[file("t.tools.abl", &content)],
                &RegisteredNames::default()
            )
            .unwrap_err()
        ),
        vec!["t.tools.abl:7:3: tool `f` is already declared at t.tools.abl:2"]
    );
}

#[test]
fn file_kinds() {
    assert!(matches!(file_kind("x/A.TOOLS.ABL"), Some(FileKind::Tools)));
    assert!(matches!(file_kind("a.yml"), Some(FileKind::Yaml)));
    assert!(matches!(file_kind("a.YAML"), Some(FileKind::Yaml)));
    assert!(file_kind("a.abl").is_none());
    assert!(file_kind("tools.abl.yaml.txt").is_none());
}

#[test]
fn empty_bundle_is_empty() {
    assert_eq!(
        parse_bundle(&[], &RegisteredNames::default()),
        Ok(model::Bundle::default())
    );
}

#[test]
fn names_and_permissions() {
    assert_eq!(check_name("tool", "a_1"), None);
    assert_eq!(
        check_name("tool", ""),
        Some("tool name must not be empty".into())
    );
    assert_eq!(
        check_name("agent", "1a"),
        Some(
            "agent name `1a` must be lower case letters, digits and `_`, starting with a letter"
                .into()
        )
    );
    assert!(check_name("agent", "a-b").is_some());
    assert!(check_name("agent", "é").is_some());
    assert_eq!(check_name("agent", &"a".repeat(64)), None);
    assert_eq!(check_permission("grant", "crm.write"), None);
    assert_eq!(
        check_permission("grant", ""),
        Some("grant must not be empty".into())
    );
    assert_eq!(
        check_permission("grant", "a\u{7}"),
        Some("grant `a\u{7}` must not contain whitespace".into())
    );
    assert_eq!(
        check_permission("grant", &"p".repeat(129)),
        Some("grant is longer than 128 characters".into())
    );
}

#[test]
fn error_display() {
    let e = DefinitionError::new("a.yaml", 3, 7, "boom");
    assert_eq!(e.to_string(), "a.yaml:3:7: boom");
}

const RUN_A_TOOL: &str = "TOOLS:\n  run_a(email: string) -> {ok: boolean}\n    description: \"Runs a\"\n    type: workflow\n    workflow_id: a\n    permission: p\n    repeat_safety: idempotent\n";

#[test]
fn workflows_that_start_themselves_are_refused_with_the_cycle_named() {
    // Directly.
    let direct =
        "kind: workflow\nname: a\nnodes:\n  - id: again\n    type: workflow\n    workflow: a\n";
    assert_eq!(
        rendered(parse_bundle(&[file("a.yaml", direct)], &RegisteredNames::default()).unwrap_err()),
        vec![
            "a.yaml:6:15: workflow `a` starts itself again through child runs: `a` (node `again`) → `a`; a workflow may not run itself as a child, directly or through other workflows, since its runs would nest without end",
        ]
    );
    // Through another workflow and a `type: workflow` tool: one error,
    // at the first workflow of the cycle.
    let through = "kind: workflow\nname: a\nnodes:\n  - {id: first, type: succeed}\n  - {id: kyc, type: workflow, workflow: b}\n---\nkind: workflow\nname: b\nnodes:\n  - {id: check, type: tool, tool: run_a, args: {email: x}}\n";
    let errors = rendered(
        parse_bundle(
            &[file("t.tools.abl", RUN_A_TOOL), file("w.yaml", through)],
            &RegisteredNames::default(),
        )
        .unwrap_err(),
    );
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with(
            "w.yaml:5:41: workflow `a` starts itself again through child runs: `a` (node `kyc`) → `b` (node `check`, tool `run_a`) → `a`;"
        ),
        "{errors:?}"
    );
    // Through an agent that may call such a tool.
    let agent = "kind: agent\nname: helper\nmodel: m\ninstructions: i\ntools: [run_a]\n---\nkind: workflow\nname: a\nnodes:\n  - {id: intake, type: agent, agent: helper}\n";
    let errors = rendered(
        parse_bundle(
            &[file("t.tools.abl", RUN_A_TOOL), file("w.yaml", agent)],
            &RegisteredNames::default(),
        )
        .unwrap_err(),
    );
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("`a` (node `intake`, agent `helper`, tool `run_a`) → `a`"),
        "{errors:?}"
    );
}

#[test]
fn a_workflow_tools_timeout_may_come_from_the_engines_config() {
    let tools = "TOOLS:\n  kyc(id: string) -> object\n    type: workflow\n    workflow_id: kyc_flow\n    timeout_ms: \"{{config.KYC_TIMEOUT_MS}}\"\n    permission: kyc\n    repeat_safety: idempotent\n";
    let registered = |value: Option<&str>| RegisteredNames {
        workflows: BTreeSet::from(["kyc_flow".to_string()]),
        config: value
            .map(|v| BTreeMap::from([("KYC_TIMEOUT_MS".to_string(), v.to_string())]))
            .unwrap_or_default(),
        ..RegisteredNames::default()
    };
    let bundle = parse_bundle(&[file("t.tools.abl", tools)], &registered(Some(" 90000 ")))
        .unwrap_or_else(|e| panic!("{e:?}"));
    let model::ToolBindingDef::Workflow { timeout_ms, .. } = &bundle.tools[0].binding else {
        panic!("{:?}", bundle.tools[0].binding)
    };
    assert_eq!(*timeout_ms, Some(90_000));

    let message = |value: Option<&str>| {
        let errors =
            parse_bundle(&[file("t.tools.abl", tools)], &registered(value)).expect_err("refused");
        assert_eq!(errors.len(), 1, "{errors:?}");
        errors[0].to_string()
    };
    assert_eq!(
        message(None),
        "t.tools.abl:5:17: `{{config.KYC_TIMEOUT_MS}}` has no value on the engine: set BELAY_TOOL_CONFIG_KYC_TIMEOUT_MS in the engine's environment"
    );
    assert_eq!(
        message(Some("18446744073709551615")),
        "t.tools.abl:5:17: `{{config.KYC_TIMEOUT_MS}}` is longer than 10 years (315360000000 ms), the longest a durable timer may wait"
    );
    for bad in ["soon", "0", "-5", "1.5"] {
        assert_eq!(
            message(Some(bad)),
            "t.tools.abl:5:17: `{{config.KYC_TIMEOUT_MS}}` must be a whole number of ms, at least 1, for `timeout_ms`",
            "{bad}"
        );
    }
    // Anything else that is not a number is refused where it is written.
    let other = tools.replace("{{config.KYC_TIMEOUT_MS}}", "{{KYC}}");
    let errors =
        parse_bundle(&[file("t.tools.abl", &other)], &registered(Some("5"))).expect_err("refused");
    assert!(
        errors[0].to_string().starts_with("t.tools.abl:5:17: `timeout_ms` must be a whole number of ms, at least 1, or `{{config.NAME}}`"),
        "{errors:?}"
    );
    assert_eq!(
        config_from_env([
            ("BELAY_TOOL_CONFIG_A".to_string(), "1".to_string()),
            ("BELAY_TOOL_CONFIG_".to_string(), "2".to_string()),
            ("PATH".to_string(), "/bin".to_string()),
        ]),
        BTreeMap::from([("A".to_string(), "1".to_string())])
    );
}

#[test]
fn shared_children_are_not_cycles() {
    // a → b, a → c, b → c, c → registered d: every chain ends.
    let yaml = "kind: workflow\nname: a\nnodes:\n  - {id: one, type: workflow, workflow: b, next: two}\n  - {id: two, type: workflow, workflow: c, mode: async}\n---\nkind: workflow\nname: b\nnodes:\n  - {id: one, type: workflow, workflow: c}\n---\nkind: workflow\nname: c\nnodes:\n  - {id: one, type: workflow, workflow: d}\n";
    let registered = RegisteredNames {
        workflows: BTreeSet::from(["d".to_string()]),
        ..RegisteredNames::default()
    };
    let bundle = parse_bundle(&[file("w.yaml", yaml)], &registered).unwrap();
    assert_eq!(bundle.workflows.len(), 3);
}
