//! The machine's tests, without a database, one file per topic, and the
//! one harness they share: [`Run`] feeds inputs to [`decide`], folds the
//! events into the live state, and at every step checks that replaying the
//! recorded history gives the same state (replay = live) and that every
//! event survives its JSON round trip. Beside it are the two ways a test
//! gets a plan: built by hand for the agent loop ([`Opts`], [`Run::start`]),
//! or parsed from `.tools.abl` and YAML text, as in production
//! ([`plan_files`], [`Run::start_plan`]).

use std::collections::BTreeMap;

use belay_proto::wire::{ChatMessage, ModelCallResult, ToolUse, Usage};
use serde_json::{Value, json};

use crate::*;
use belay_definitions::model::{
    AgentDef, Budget, LoopPolicy, NodeDef, NodeKind, OnToolFailure, RepeatSafety, ToolBindingDef,
    ToolDef, WorkflowDef,
};
use belay_definitions::{RegisteredNames, SourceFile, parse_bundle};

mod agent_loop;
mod cache;
mod parameters;
mod pii;
mod retry;
mod sampling;
mod strict;
mod trace;
mod untraced;
mod variant;
mod workflow;

// ---- the harness ----

/// A run under test: the live state plus every event recorded so far.
struct Run {
    state: RunState,
    history: Vec<Event>,
}

impl Run {
    /// Decides `input` on the live state, applies and records its events,
    /// and checks what every test relies on: each event survives its JSON
    /// round trip, and folding the history gives the live state.
    fn try_step(&mut self, input: Input) -> Result<Decision, MachineError> {
        let d = decide(&self.state, input)?;
        let (now, level) = (self.state.now, self.state.fleet_level);
        for e in &d.events {
            self.state.apply(e);
            self.history.push(e.clone());
            // Every event survives its JSON round trip (it is persisted as jsonb).
            let back: Event = serde_json::from_value(serde_json::to_value(e).expect("serialise"))
                .expect("deserialise");
            assert_eq!(&back, e);
        }
        // Replay equals live, the transition's time (`now`) and the level
        // of the forms it may write (`fleet_level`) aside: the store hands them in
        // before each transition (a test may too, as `cache.rs` does) and
        // they are no part of the fold, so a folded history has neither. No
        // event may set them; all the rest must agree.
        assert_eq!((self.state.now, self.state.fleet_level), (now, level));
        let mut replayed = RunState::fold(&self.history);
        assert_eq!((replayed.now, replayed.fleet_level), (None, 0));
        replayed.now = self.state.now;
        replayed.fleet_level = self.state.fleet_level;
        assert_eq!(replayed, self.state);
        Ok(d)
    }

    fn step(&mut self, input: Input) -> Decision {
        self.try_step(input).expect("transition accepted")
    }

    /// The kinds of the events `d` records.
    fn kinds(d: &Decision) -> Vec<&'static str> {
        d.events.iter().map(Event::kind).collect()
    }

    /// The kinds of every event recorded so far.
    fn history_kinds(&self) -> Vec<&'static str> {
        self.history.iter().map(Event::kind).collect()
    }
}

// ---- the agent loop's plan, built by hand ----

/// A tool `name` needing `permission`, with the `required` string
/// parameters and an optional `plan` (default `starter`), posting to `/name`.
fn tool(
    name: &str,
    permission: &str,
    repeat_safety: RepeatSafety,
    required: &[&str],
) -> Pinned<ToolDef> {
    let props: serde_json::Map<String, Value> = required
        .iter()
        .map(|p| ((*p).to_owned(), json!({"type": "string"})))
        .collect();
    let mut props = props;
    props.insert(
        "plan".into(),
        json!({"type": "string", "default": "starter"}),
    );
    Pinned {
        version: 1,
        content_hash: format!("hash-{name}"),
        def: ToolDef {
            name: name.into(),
            description: format!("{name} tool"),
            input_schema: json!({"type": "object", "properties": props, "required": required, "additionalProperties": false}),
            // Any value: most tests here are about the loop, not the type.
            output_schema: json!({}),
            permission: permission.into(),
            pool: None,
            repeat_safety,
            repeat_safety_from_server: false,
            scrub_secrets: true,
            pii_access: Default::default(),
            reconcile_with: None,
            binding: ToolBindingDef::Http {
                endpoint: format!("/{name}"),
                method: "POST".into(),
                headers: BTreeMap::new(),
                timeout_ms: 1000,
                request: Default::default(),
            },
            confirmation: None,
            retry_policy: None,
            rate_limit: None,
            circuit_breaker: None,
            injected: Vec::new(),
            model_input_schema: None,
            hints: Default::default(),
            effect: None,
            compaction: None,
            on_result: BTreeMap::new(),
            on_error: BTreeMap::new(),
            result_secrets: Vec::new(),
            secret_access: Vec::new(),
            process: None,
            request_variants: Vec::new(),
            strict_schema: None,
            untraced: Vec::new(),
            sampling: None,
            source_file: "t.tools.abl".into(),
            source_line: 1,
        },
    }
}

/// The agent loop's plan: the agent `onboarder` over `lookup`, `create` and
/// `wipe` in the one node `intake`, with these limits and grants (and with
/// `probe`, a `find` tool that reconciles `create`).
struct Opts {
    probe: bool,
    max_model_steps: u32,
    max_tool_calls: u32,
    max_result_bytes: u32,
    caller_grants: Vec<String>,
    /// Changes to the plan (agent and workflow settings) before the run starts.
    edit: Option<fn(&mut RunPlan)>,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            probe: false,
            max_model_steps: 6,
            max_tool_calls: 10,
            max_result_bytes: 16384,
            caller_grants: vec!["crm.read".into(), "crm.write".into(), "ops.danger".into()],
            edit: None,
        }
    }
}

/// The plan `opts` describes.
fn plan(opts: &Opts) -> RunPlan {
    let mut tools = BTreeMap::new();
    tools.insert(
        "lookup".to_owned(),
        tool("lookup", "crm.read", RepeatSafety::Idempotent, &["email"]),
    );
    tools.insert(
        "create".to_owned(),
        tool("create", "crm.write", RepeatSafety::Reconcile, &["email"]),
    );
    tools.insert(
        "wipe".to_owned(),
        tool("wipe", "ops.danger", RepeatSafety::Never, &["email"]),
    );
    if let Some(wipe) = tools.get_mut("wipe") {
        wipe.def.output_schema = json!({"type": "object", "required": ["wiped"]});
    }
    if let Some(create) = tools.get_mut("create") {
        create.def.output_schema = json!({"type": "object", "required": ["account_id"], "properties": {"account_id": {"type": "string"}}});
        if opts.probe {
            create.def.reconcile_with = Some("find".into());
        }
    }
    if opts.probe {
        tools.insert(
            "find".to_owned(),
            tool(
                "find",
                "crm.read",
                RepeatSafety::Idempotent,
                &["idempotency_key"],
            ),
        );
    }
    let agent = AgentDef {
        name: "onboarder".into(),
        model: "m".into(),
        provider: None,
        pool: None,
        instructions: "be careful".into(),
        tools: vec!["lookup".into(), "create".into(), "wipe".into()],
        grants: vec!["crm.read".into(), "crm.write".into(), "ops.danger".into()],
        loop_policy: LoopPolicy::BoundedLoop {
            max_model_steps: opts.max_model_steps,
            max_tool_calls: opts.max_tool_calls,
        },
        budget: Budget::default(),
        max_argument_bytes: 200,
        max_result_bytes: opts.max_result_bytes,
        max_model_attempts: 3,
        max_tool_attempts: 3,
        max_output_tokens: None,
        pricing: None,
        max_identical_calls: 0,
        on_tool_failure: OnToolFailure::Continue,
        output_schema: None,
        pii_redaction: Vec::new(),
        source_file: "a.yaml".into(),
        source_line: 1,
    };
    let mut agents = BTreeMap::new();
    agents.insert(
        "onboarder".to_owned(),
        Pinned {
            version: 1,
            content_hash: "h".into(),
            def: agent,
        },
    );
    let mut plan = RunPlan {
        workflow: Pinned {
            version: 1,
            content_hash: "w".into(),
            def: WorkflowDef {
                name: "onboarding".into(),
                start: "intake".into(),
                nodes: vec![NodeDef {
                    id: "intake".into(),
                    kind: NodeKind::Agent {
                        agent: "onboarder".into(),
                        input: None,
                    },
                    grants: vec![],
                    next: None,
                    source_line: 1,
                }],
                input_schema: None,
                budget: Budget::default(),
                source_file: "w.yaml".into(),
                source_line: 1,
            },
        },
        agents,
        tools,
    };
    if let Some(edit) = opts.edit {
        edit(&mut plan);
    }
    plan
}

impl Run {
    /// Starts run `r1` of the plan `opts` describes, for `a@example.com`.
    fn start(opts: Opts) -> (Run, Decision) {
        let mut run = Run {
            state: RunState::default(),
            history: vec![],
        };
        let d = run.step(Input::Start {
            run_id: "r1".into(),
            tenant: "acme".into(),
            caller: "app".into(),
            caller_grants: opts.caller_grants.clone(),
            tenant_grants: vec!["crm.read".into(), "crm.write".into(), "ops.danger".into()],
            input: json!({"email": "a@example.com"}),
            plan: Box::new(plan(&opts)),
            trace: None,
        });
        (run, d)
    }

    /// The model answers `call_id` with `calls` (tool name, arguments) and `content`.
    fn model(&mut self, call_id: &str, calls: &[(&str, &str)], content: Option<&str>) -> Decision {
        self.step(Input::ModelCallCompleted {
            call_id: call_id.into(),
            attempt: 1,
            result: ModelCallResult {
                content: content.map(str::to_owned),
                tool_calls: calls
                    .iter()
                    .enumerate()
                    .map(|(i, (name, args))| ToolUse {
                        id: format!("tu{i}"),
                        name: (*name).into(),
                        arguments: (*args).into(),
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

    /// The agent node's transcript so far.
    fn transcript(&self) -> Vec<ChatMessage> {
        self.state
            .node
            .as_ref()
            .map(|n| n.transcript.clone())
            .unwrap_or_default()
    }
}

/// The `(call id, spec, idempotency key)` of every task `d` schedules.
fn scheduled_specs(d: &Decision) -> Vec<(String, Value, String)> {
    d.commands
        .iter()
        .filter_map(|c| match c {
            Command::ScheduleTask {
                call_id,
                spec,
                idempotency_key,
                ..
            } => Some((call_id.clone(), spec.clone(), idempotency_key.clone())),
            _ => None,
        })
        .collect()
}

// ---- plans parsed from text, as in production ----

/// A plan from a tools file, an agent YAML and a workflow YAML.
fn plan_files(tools: &str, agent: &str, workflow: &str) -> RunPlan {
    let files = [
        SourceFile {
            path: "t.tools.abl".into(),
            content: tools.into(),
        },
        SourceFile {
            path: "a.yaml".into(),
            content: agent.into(),
        },
        SourceFile {
            path: "w.yaml".into(),
            content: workflow.into(),
        },
    ];
    let bundle = match parse_bundle(&files, &RegisteredNames::default()) {
        Ok(b) => b,
        Err(errors) => panic!(
            "{}",
            errors
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        ),
    };
    fn pin<T>(def: T) -> Pinned<T> {
        Pinned {
            version: 1,
            content_hash: "h".into(),
            def,
        }
    }
    let tools: BTreeMap<_, _> = bundle
        .tools
        .into_iter()
        .map(|t| (t.name.clone(), pin(t)))
        .collect();
    let agents: BTreeMap<_, _> = bundle
        .agents
        .into_iter()
        .map(|a| (a.name.clone(), pin(a)))
        .collect();
    let workflow = bundle.workflows.into_iter().next().expect("a workflow");
    RunPlan {
        workflow: pin(workflow),
        agents,
        tools,
    }
}

impl Run {
    /// Starts run `r1` of `plan` with `input`; caller and tenant hold `crm.write`.
    fn start_plan(plan: RunPlan, input: Value) -> (Run, Decision) {
        Self::start_plan_on(RunState::default(), plan, input)
    }

    /// [`Run::start_plan`] from `state` (what the store hands in: `now`,
    /// `fleet_level`).
    fn start_plan_on(state: RunState, plan: RunPlan, input: Value) -> (Run, Decision) {
        let mut run = Run {
            state,
            history: vec![],
        };
        let d = run.step(Input::Start {
            run_id: "r1".into(),
            tenant: "acme".into(),
            caller: "app".into(),
            caller_grants: vec!["crm.write".into()],
            tenant_grants: vec!["crm.write".into()],
            input,
            plan: Box::new(plan),
            trace: None,
        });
        (run, d)
    }
}

/// A workflow of one agent node `n` running the agent `a`.
const AGENT_WF: &str = "kind: workflow\nname: w\nnodes:\n  - {id: n, type: agent, agent: a}\n";

/// The specs of the model calls `d` schedules.
fn model_calls(d: &Decision) -> Vec<Value> {
    model_call_ids(d)
        .into_iter()
        .map(|(_, spec)| spec)
        .collect()
}

/// The specs of the model calls `d` schedules, with their call ids.
fn model_call_ids(d: &Decision) -> Vec<(String, Value)> {
    d.commands
        .iter()
        .filter_map(|c| match c {
            Command::ScheduleTask {
                kind: TaskKind::ModelCall,
                call_id,
                spec,
                ..
            } => Some((call_id.clone(), spec.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn durations_in_reasons_read_as_words() {
    assert_eq!(show_ms(3 * 86_400_000), "3 days");
    assert_eq!(show_ms(86_400_000), "1 day");
    assert_eq!(show_ms(5_400_000), "1h 30m");
    assert_eq!(show_ms(7_200_000), "2h");
    assert_eq!(show_ms(250), "250ms");
}
