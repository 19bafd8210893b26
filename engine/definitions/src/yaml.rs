//! Agents and workflows from YAML files (`kind: agent` / `kind: workflow`
//! documents, several per file separated by `---`).
//!
//! Each document is first read into a generic tree whose every node and key
//! carries its line and column (serde-saphyr's `Spanned`), then decoded by
//! hand. Decoding by hand rather than with `#[derive(Deserialize)]` is what
//! lets a file report every error (serde stops at the first) and point each
//! one at the offending key or list entry.

use std::collections::{BTreeMap, BTreeSet};

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use serde_saphyr::{MessageFormatter, Spanned};

use super::expr::{Expr, Template};
use super::imports::FileImport;
use super::model::{
    AgentDef, ApprovalDef, BranchCase, Budget, ChildMode, LoopPolicy, NodeDef, NodeKind,
    OnToolFailure, PiiKind, Pricing, WaitDef, WaitFor, WorkflowDef,
};
use super::{DefinitionError, NameAt, check_name, check_permission, schema};

/// Defaults documented on [`AgentDef`] and the `loop:` brief.
const DEFAULT_MAX_MODEL_STEPS: u32 = 10;
const DEFAULT_MAX_TOOL_CALLS: u32 = 20;
const DEFAULT_MAX_ARGUMENT_BYTES: u32 = 65_536;
const DEFAULT_MAX_RESULT_BYTES: u32 = 16_384;
const DEFAULT_MAX_MODEL_ATTEMPTS: u32 = 5;
const DEFAULT_MAX_TOOL_ATTEMPTS: u32 = 5;

const AGENT_KEYS: &[&str] = &[
    "kind",
    "name",
    "model",
    "instructions",
    "tools",
    "grants",
    "loop",
    "budget",
    "limits",
    "max_output_tokens",
    "pricing",
    "max_identical_calls",
    "on_tool_failure",
    "output_schema",
    "pii_redaction",
    "provider",
    "pool",
];
const WORKFLOW_KEYS: &[&str] = &["kind", "name", "input_schema", "start", "nodes", "budget"];
const AGENT_NODE_KEYS: &[&str] = &["id", "type", "agent", "input", "grants", "next"];
const TOOL_NODE_KEYS: &[&str] = &["id", "type", "tool", "args", "grants", "next", "on_error"];
const WAIT_NODE_KEYS: &[&str] = &[
    "id",
    "type",
    "signal",
    "payload_schema",
    "duration",
    "until",
    "for",
    "timeout",
    "on_timeout",
    "grants",
    "next",
];
const WAIT_FOR_KEYS: &[&str] = &["signal", "payload_schema", "duration", "until", "next"];
const APPROVAL_NODE_KEYS: &[&str] = &[
    "id",
    "type",
    "subject",
    "prompt",
    "approver_grant",
    "allow_edits",
    "edits_schema",
    "on_decline",
    "timeout",
    "on_timeout",
    "grants",
    "next",
];
const WORKFLOW_NODE_KEYS: &[&str] = &[
    "id",
    "type",
    "workflow",
    "input",
    "mode",
    "timeout",
    "on_timeout",
    "on_error",
    "grants",
    "next",
];
const BRANCH_NODE_KEYS: &[&str] = &["id", "type", "cases", "default", "grants", "next"];
const SET_NODE_KEYS: &[&str] = &["id", "type", "values", "grants", "next"];
const FAIL_NODE_KEYS: &[&str] = &["id", "type", "error", "grants"];
const SUCCEED_NODE_KEYS: &[&str] = &["id", "type", "output", "grants"];
const LOOP_KEYS: &[&str] = &["type", "max_model_steps", "max_tool_calls"];
/// `budget:` of an agent (its steps and tool calls are its `loop:`).
const BUDGET_KEYS: &[&str] = &[
    "max_tokens",
    "max_input_tokens",
    "max_output_tokens",
    "max_cost_usd",
    "max_wall_time",
];
/// `budget:` of a workflow (the whole run).
const RUN_BUDGET_KEYS: &[&str] = &[
    "max_tokens",
    "max_input_tokens",
    "max_output_tokens",
    "max_cost_usd",
    "max_model_steps",
    "max_tool_calls",
    "max_wall_time",
];
const PRICING_KEYS: &[&str] = &["input_per_million_usd", "output_per_million_usd"];
const LIMIT_KEYS: &[&str] = &[
    "max_argument_bytes",
    "max_result_bytes",
    "max_model_attempts",
    "max_tool_attempts",
];

/// What one YAML file yields.
#[derive(Debug, Default)]
pub(super) struct YamlOutput {
    /// Agents without errors.
    pub agents: Vec<AgentDef>,
    /// Workflows without errors.
    pub workflows: Vec<WorkflowDef>,
    /// Every agent name declared (valid definition or not).
    pub declared_agents: Vec<NameAt>,
    /// Every workflow name declared (valid definition or not).
    pub declared_workflows: Vec<NameAt>,
    /// Tool names listed by agents, to resolve against the bundle.
    pub tool_refs: Vec<NameAt>,
    /// `(agent, imports)`: the `file:` entries of each agent's `tools:`,
    /// resolved against the bundle's tools files.
    pub agent_imports: Vec<(String, Vec<FileImport>)>,
    /// Agent names used by workflow nodes, to resolve against the bundle.
    pub agent_refs: Vec<NameAt>,
    /// Workflow names used by `workflow` nodes, to resolve against the bundle.
    pub workflow_refs: Vec<NameAt>,
    /// Every problem found.
    pub errors: Vec<DefinitionError>,
}

/// A YAML value with its position.
type Node = Spanned<Val>;

/// A YAML value, in the shapes YAML can produce.
#[derive(Debug)]
enum Val {
    Null,
    Bool(bool),
    Int(i64),
    /// Integers above `i64::MAX`.
    UInt(u64),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    /// Entries in file order; keys are nodes too, so they have positions.
    Map(Vec<(Node, Node)>),
}

impl<'de> Deserialize<'de> for Val {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Val;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any YAML value")
            }
            fn visit_unit<E>(self) -> Result<Val, E> {
                Ok(Val::Null)
            }
            fn visit_none<E>(self) -> Result<Val, E> {
                Ok(Val::Null)
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Val, D::Error> {
                Val::deserialize(d)
            }
            fn visit_bool<E>(self, v: bool) -> Result<Val, E> {
                Ok(Val::Bool(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Val, E> {
                Ok(Val::Int(v))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Val, E> {
                Ok(i64::try_from(v).map_or(Val::UInt(v), Val::Int))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Val, E> {
                Ok(Val::Float(v))
            }
            fn visit_str<E>(self, v: &str) -> Result<Val, E> {
                Ok(Val::Str(v.to_string()))
            }
            fn visit_string<E>(self, v: String) -> Result<Val, E> {
                Ok(Val::Str(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Val, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Val::Seq(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Val, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    entries.push(entry);
                }
                Ok(Val::Map(entries))
            }
        }
        deserializer.deserialize_any(V)
    }
}

fn pos(node: &Node) -> (u32, u32) {
    let clamp = |n: u64| u32::try_from(n).unwrap_or(u32::MAX).max(1);
    (
        clamp(node.referenced.line()),
        clamp(node.referenced.column()),
    )
}

fn type_name(v: &Val) -> &'static str {
    match v {
        Val::Null => "null",
        Val::Bool(_) => "a boolean",
        Val::Int(_) | Val::UInt(_) | Val::Float(_) => "a number",
        Val::Str(_) => "a string",
        Val::Seq(_) => "a list",
        Val::Map(_) => "a mapping",
    }
}

/// Parse one YAML file.
pub(super) fn parse_yaml_file(file: &str, content: &str) -> YamlOutput {
    let mut cx = Cx {
        file,
        out: YamlOutput::default(),
    };
    let mut options = serde_saphyr::Options::default();
    // YAML 1.2 booleans only: with the YAML 1.1 default, a node id `n` or a
    // grant `on` would silently turn into `false` / `true`.
    options.strict_booleans = true;
    // Errors are reported with line and column; the source snippet is not used.
    options.with_snippet = false;
    match serde_saphyr::from_multiple_with_options::<Node>(content, options) {
        Ok(docs) => {
            for doc in &docs {
                parse_document(doc, &mut cx);
            }
        }
        Err(e) => {
            let (line, column) = e.location().map_or((1, 1), |l| {
                let clamp = |n: u64| u32::try_from(n).unwrap_or(u32::MAX).max(1);
                (clamp(l.line()), clamp(l.column()))
            });
            // The bare message: the location goes into DefinitionError, and
            // the default rendering adds a multi-line source snippet.
            let message = serde_saphyr::DefaultMessageFormatter.format_message(e.without_snippet());
            let message: String = message
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
            cx.error(line, column, format!("invalid YAML: {message}"));
        }
    }
    cx.out
}

struct Cx<'a> {
    file: &'a str,
    out: YamlOutput,
}

impl Cx<'_> {
    fn error(&mut self, line: u32, column: u32, message: impl Into<String>) {
        self.out
            .errors
            .push(DefinitionError::new(self.file, line, column, message));
    }

    fn error_at(&mut self, node: &Node, message: impl Into<String>) {
        let (line, column) = pos(node);
        self.error(line, column, message);
    }
}

/// A mapping being decoded: remembers which keys were read so the rest can
/// be reported as unknown.
struct MapView<'n> {
    node: &'n Node,
    entries: Vec<(String, &'n Node, &'n Node)>,
    used: Vec<bool>,
}

impl<'n> MapView<'n> {
    /// `None` (with an error) when `node` is not a mapping.
    fn new(node: &'n Node, what: &str, cx: &mut Cx<'_>) -> Option<Self> {
        let Val::Map(entries) = &node.value else {
            cx.error_at(
                node,
                format!("{what} must be a mapping, found {}", type_name(&node.value)),
            );
            return None;
        };
        let mut out = Vec::with_capacity(entries.len());
        for (k, v) in entries {
            match key_string(k) {
                Some(name) => out.push((name, k, v)),
                None => cx.error_at(
                    k,
                    format!("keys must be strings, found {}", type_name(&k.value)),
                ),
            }
        }
        let used = vec![false; out.len()];
        Some(MapView {
            node,
            entries: out,
            used,
        })
    }

    fn get(&mut self, key: &str) -> Option<&'n Node> {
        let i = self.entries.iter().position(|(k, _, _)| k == key)?;
        self.used[i] = true;
        Some(self.entries[i].2)
    }

    /// Like [`MapView::get`], but an explicit `null` counts as absent.
    fn get_present(&mut self, key: &str) -> Option<&'n Node> {
        self.get(key).filter(|n| !matches!(n.value, Val::Null))
    }

    /// Report every key not read, naming the keys allowed in `what`.
    fn finish(self, what: &str, allowed: &[&str], cx: &mut Cx<'_>) {
        for ((key, key_node, _), used) in self.entries.iter().zip(&self.used) {
            if !used {
                cx.error_at(
                    key_node,
                    format!(
                        "unknown key `{key}` in {what} (expected one of: {})",
                        allowed.join(", ")
                    ),
                );
            }
        }
    }
}

/// Scalar keys as text (`1:` is the key "1"); `None` for null and collections.
fn key_string(k: &Node) -> Option<String> {
    match &k.value {
        Val::Str(s) => Some(s.clone()),
        Val::Bool(b) => Some(b.to_string()),
        Val::Int(i) => Some(i.to_string()),
        Val::UInt(u) => Some(u.to_string()),
        Val::Float(f) => Some(f.to_string()),
        Val::Null | Val::Seq(_) | Val::Map(_) => None,
    }
}

fn parse_document(doc: &Node, cx: &mut Cx<'_>) {
    let Some(mut map) = MapView::new(doc, "a document", cx) else {
        return;
    };
    let Some(kind_node) = map.get("kind") else {
        cx.error_at(doc, "missing `kind:` (`agent` or `workflow`)");
        return;
    };
    match &kind_node.value {
        Val::Str(k) if k == "agent" => parse_agent(doc, map, cx),
        Val::Str(k) if k == "workflow" => parse_workflow(doc, map, cx),
        Val::Str(k) => cx.error_at(
            kind_node,
            format!("unknown kind `{k}` (expected `agent` or `workflow`)"),
        ),
        other => cx.error_at(
            kind_node,
            format!(
                "`kind` must be `agent` or `workflow`, found {}",
                type_name(other)
            ),
        ),
    }
}

fn string(node: &Node, key: &str, cx: &mut Cx<'_>) -> Option<String> {
    match &node.value {
        Val::Str(s) => Some(s.clone()),
        other => {
            cx.error_at(
                node,
                format!("`{key}` must be a string, found {}", type_name(other)),
            );
            None
        }
    }
}

fn required<'n>(map: &mut MapView<'n>, key: &str, what: &str, cx: &mut Cx<'_>) -> Option<&'n Node> {
    let node = map.get_present(key);
    if node.is_none() {
        cx.error_at(map.node, format!("{what} is missing `{key}:`"));
    }
    node
}

fn non_empty_string(node: &Node, key: &str, cx: &mut Cx<'_>) -> Option<String> {
    let s = string(node, key, cx)?;
    if s.trim().is_empty() {
        cx.error_at(node, format!("`{key}` must not be empty"));
        return None;
    }
    Some(s)
}

/// A definition or node name, checked against the naming rule.
fn name(node: &Node, key: &str, kind: &str, cx: &mut Cx<'_>) -> Option<NameAt> {
    let s = string(node, key, cx)?;
    if let Some(message) = check_name(kind, &s) {
        cx.error_at(node, message);
        return None;
    }
    let (line, column) = pos(node);
    Some(NameAt {
        name: s,
        line,
        column,
    })
}

/// The entries of a list value (absent or `null`: no entries).
fn list<'n>(node: Option<&'n Node>, key: &str, cx: &mut Cx<'_>) -> Option<&'n [Node]> {
    match node.map(|n| (n, &n.value)) {
        None | Some((_, Val::Null)) => Some(&[]),
        Some((_, Val::Seq(items))) => Some(items),
        Some((n, other)) => {
            cx.error_at(
                n,
                format!("`{key}` must be a list, found {}", type_name(other)),
            );
            None
        }
    }
}

/// Names in a list (`tools`, `grants`), each checked by `check`, without
/// duplicates.
fn names_list(
    node: Option<&Node>,
    key: &str,
    check: impl Fn(&str) -> Option<String>,
    cx: &mut Cx<'_>,
) -> Vec<NameAt> {
    let Some(items) = list(node, key, cx) else {
        return Vec::new();
    };
    names_in(items.iter(), key, check, cx)
}

/// The entries of [`names_list`], given one by one.
fn names_in<'n>(
    items: impl Iterator<Item = &'n Node>,
    key: &str,
    check: impl Fn(&str) -> Option<String>,
    cx: &mut Cx<'_>,
) -> Vec<NameAt> {
    let mut out: Vec<NameAt> = Vec::new();
    for item in items {
        let Val::Str(s) = &item.value else {
            cx.error_at(
                item,
                format!(
                    "each entry of `{key}` must be a string, found {}",
                    type_name(&item.value)
                ),
            );
            continue;
        };
        let s = s.clone();
        if let Some(message) = check(&s) {
            cx.error_at(item, message);
            continue;
        }
        let (line, column) = pos(item);
        if let Some(first) = out.iter().find(|n| n.name == s) {
            cx.error(
                line,
                column,
                format!(
                    "`{s}` is listed twice in `{key}` (first on line {})",
                    first.line
                ),
            );
            continue;
        }
        out.push(NameAt {
            name: s,
            line,
            column,
        });
    }
    out
}

/// An agent's `tools:`: tool names, and `file:` entries importing the tools
/// of a tools file of the bundle (`- file: ./tools/crm.tools.abl`, with
/// `tools: [a, b]` to take only those; the seed's `file: "path" [a, b]`).
fn agent_tools(node: Option<&Node>, cx: &mut Cx<'_>) -> (Vec<NameAt>, Vec<FileImport>) {
    let Some(items) = list(node, "tools", cx) else {
        return (Vec::new(), Vec::new());
    };
    let names = names_in(
        items.iter().filter(|i| !matches!(i.value, Val::Map(_))),
        "tools",
        |s| check_name("tool", s),
        cx,
    );
    let mut imports = Vec::new();
    for item in items.iter().filter(|i| matches!(i.value, Val::Map(_))) {
        let Some(mut map) = MapView::new(item, "a `file:` entry of `tools`", cx) else {
            continue;
        };
        let path = required(&mut map, "file", "a `file:` entry of `tools`", cx)
            .and_then(|n| string(n, "file", cx).map(|s| (s, pos(n))));
        let names = map.get_present("tools").map(|n| {
            let listed = names_list(Some(n), "tools", |s| check_name("tool", s), cx);
            if matches!(&n.value, Val::Seq(items) if items.is_empty()) {
                cx.error_at(
                    n,
                    "an empty `tools` list imports nothing; leave it out to import every tool of the file",
                );
            }
            listed
        });
        map.finish("a `file:` entry of `tools`", &["file", "tools"], cx);
        if let Some((path, (line, column))) = path {
            imports.push(FileImport {
                path,
                line,
                column,
                names,
            });
        }
    }
    (names, imports)
}

/// A whole number of at least 1 that fits `T`.
fn positive<T: TryFrom<u64>>(node: &Node, key: &str, cx: &mut Cx<'_>) -> Option<T> {
    let n = match node.value {
        Val::Int(i) => u64::try_from(i).ok().filter(|&n| n >= 1),
        Val::UInt(u) => Some(u),
        Val::Float(f) if f.fract() == 0.0 && f >= 1.0 => {
            cx.error_at(
                node,
                format!("`{key}` must be a whole number, written without a decimal point"),
            );
            return None;
        }
        _ => {
            cx.error_at(
                node,
                format!(
                    "`{key}` must be a whole number of at least 1, found {}",
                    show(&node.value)
                ),
            );
            return None;
        }
    };
    let Some(n) = n else {
        cx.error_at(
            node,
            format!("`{key}` must be at least 1, found {}", show(&node.value)),
        );
        return None;
    };
    match T::try_from(n) {
        Ok(v) => Some(v),
        Err(_) => {
            cx.error_at(node, format!("`{key}` is too large: {n}"));
            None
        }
    }
}

/// A short rendering of a scalar for messages.
fn show(v: &Val) -> String {
    match v {
        Val::Null => "null".into(),
        Val::Bool(b) => b.to_string(),
        Val::Int(i) => i.to_string(),
        Val::UInt(u) => u.to_string(),
        Val::Float(f) => f.to_string(),
        Val::Str(s) => format!("\"{}\"", s.chars().take(40).collect::<String>()),
        other => type_name(other).into(),
    }
}

fn opt_positive<T: TryFrom<u64>>(
    map: &mut MapView<'_>,
    key: &str,
    default: T,
    cx: &mut Cx<'_>,
) -> T {
    map.get_present(key)
        .and_then(|n| positive(n, key, cx))
        .unwrap_or(default)
}

fn parse_agent(doc: &Node, mut map: MapView<'_>, cx: &mut Cx<'_>) {
    let errors_before = cx.out.errors.len();
    let name_at =
        required(&mut map, "name", "agent", cx).and_then(|n| name(n, "name", "agent", cx));
    if let Some(n) = &name_at {
        cx.out.declared_agents.push(n.clone());
    }
    let model =
        required(&mut map, "model", "agent", cx).and_then(|n| non_empty_string(n, "model", cx));
    let instructions = required(&mut map, "instructions", "agent", cx)
        .and_then(|n| non_empty_string(n, "instructions", cx));
    let (tools, imports) = agent_tools(map.get("tools"), cx);
    let grants = names_list(
        map.get("grants"),
        "grants",
        |s| check_permission("grant", s),
        cx,
    );
    let loop_policy = parse_loop(map.get_present("loop"), cx);
    let budget = parse_budget(map.get_present("budget"), BUDGET_KEYS, cx);
    let limits = parse_limits(map.get_present("limits"), cx);
    let max_output_tokens = map
        .get_present("max_output_tokens")
        .and_then(|n| positive::<u32>(n, "max_output_tokens", cx));
    let pricing = map
        .get_present("pricing")
        .and_then(|n| parse_pricing(n, cx));
    if let (Some(_), None) = (budget.max_cost_usd, &pricing)
        && let Some(n) = map.get_present("budget")
    {
        cx.error_at(
            n,
            "`budget.max_cost_usd` needs `pricing:` (`input_per_million_usd`, `output_per_million_usd`) to count cost",
        );
    }
    let max_identical_calls = match map.get_present("max_identical_calls") {
        None => crate::model::DEFAULT_MAX_IDENTICAL_CALLS,
        Some(n) => match n.value {
            Val::Int(0) | Val::UInt(0) => 0,
            _ => positive::<u32>(n, "max_identical_calls", cx)
                .unwrap_or(crate::model::DEFAULT_MAX_IDENTICAL_CALLS),
        },
    };
    let on_tool_failure = match map.get_present("on_tool_failure") {
        None => OnToolFailure::Continue,
        Some(n) => match string(n, "on_tool_failure", cx).as_deref() {
            Some("continue") => OnToolFailure::Continue,
            Some("stop") => OnToolFailure::Stop,
            Some(other) => {
                cx.error_at(
                    n,
                    format!("unknown `on_tool_failure: {other}` (expected `continue` or `stop`)"),
                );
                OnToolFailure::Continue
            }
            None => OnToolFailure::Continue,
        },
    };
    let output_schema = map
        .get_present("output_schema")
        .and_then(|n| json_schema(n, "output_schema", cx));
    // An empty `pii_redaction:` is an error, not "off": for a privacy
    // setting, a value lost in editing must not quietly turn it off.
    let pii_redaction = map
        .get("pii_redaction")
        .map(|n| parse_pii_redaction(n, cx))
        .unwrap_or_default();
    let provider = map
        .get_present("provider")
        .and_then(|n| agent_provider(n, cx));
    let pool = map.get_present("pool").and_then(|n| pool_name(n, cx));
    map.finish("an agent", AGENT_KEYS, cx);
    cx.out.tool_refs.extend(tools.iter().cloned());
    if !imports.is_empty() {
        let agent = name_at.as_ref().map(|n| n.name.clone()).unwrap_or_default();
        cx.out.agent_imports.push((agent, imports));
    }

    if cx.out.errors.len() > errors_before {
        return;
    }
    let (Some(name_at), Some(model), Some(instructions)) = (name_at, model, instructions) else {
        return;
    };
    cx.out.agents.push(AgentDef {
        name: name_at.name,
        model,
        provider,
        pool,
        instructions,
        tools: tools.into_iter().map(|n| n.name).collect(),
        grants: grants.into_iter().map(|n| n.name).collect(),
        loop_policy,
        budget,
        max_argument_bytes: limits.max_argument_bytes,
        max_result_bytes: limits.max_result_bytes,
        max_model_attempts: limits.max_model_attempts,
        max_tool_attempts: limits.max_tool_attempts,
        max_output_tokens,
        pricing,
        max_identical_calls,
        on_tool_failure,
        output_schema,
        pii_redaction,
        source_file: cx.file.to_string(),
        source_line: pos(doc).0,
    });
}

/// An agent's `provider:`: one of [`belay_proto::pools::MODEL_PROVIDERS`].
fn agent_provider(node: &Node, cx: &mut Cx<'_>) -> Option<String> {
    let s = string(node, "provider", cx)?;
    if belay_proto::pools::MODEL_PROVIDERS.contains(&s.as_str()) {
        return Some(s);
    }
    cx.error_at(
        node,
        format!(
            "unknown `provider: {s}` (expected {})",
            belay_proto::pools::MODEL_PROVIDERS
                .iter()
                .map(|p| format!("`{p}`"))
                .collect::<Vec<_>>()
                .join(" or ")
        ),
    );
    None
}

/// A `pool:` ([`belay_proto::pools::check_pool_name`]).
fn pool_name(node: &Node, cx: &mut Cx<'_>) -> Option<String> {
    let s = string(node, "pool", cx)?;
    match belay_proto::pools::check_pool_name(&s) {
        Ok(()) => Some(s),
        Err(m) => {
            cx.error_at(node, m);
            None
        }
    }
}

/// An agent's `pii_redaction:`: `true` (every kind), `false` (off), or a
/// list of kinds (`[email, card]`; `belay_machine::pii`).
fn parse_pii_redaction(node: &Node, cx: &mut Cx<'_>) -> Vec<PiiKind> {
    match &node.value {
        Val::Bool(true) => PiiKind::ALL.to_vec(),
        Val::Bool(false) => Vec::new(),
        Val::Seq(_) => {
            let names = names_list(
                Some(node),
                "pii_redaction",
                |s| {
                    PiiKind::from_name(s).is_none().then(|| {
                        format!(
                            "unknown kind `{s}` in `pii_redaction` (expected {})",
                            PiiKind::ALL.map(PiiKind::name).join(", ")
                        )
                    })
                },
                cx,
            );
            let mut kinds: Vec<PiiKind> = names
                .iter()
                .filter_map(|n| PiiKind::from_name(&n.name))
                .collect();
            kinds.sort();
            if kinds.is_empty() && names.is_empty() && cx.out.errors.is_empty() {
                cx.error_at(
                    node,
                    "`pii_redaction: []` turns nothing on; write `false`, or name kinds",
                );
            }
            kinds
        }
        Val::Null => {
            cx.error_at(
                node,
                format!(
                    "`pii_redaction:` has no value: write `true`, `false` or a list of kinds ({})",
                    PiiKind::ALL.map(PiiKind::name).join(", ")
                ),
            );
            Vec::new()
        }
        other => {
            cx.error_at(
                node,
                format!(
                    "`pii_redaction` takes `true`, `false` or a list of kinds ({}), found {}",
                    PiiKind::ALL.map(PiiKind::name).join(", "),
                    show(other)
                ),
            );
            Vec::new()
        }
    }
}

fn parse_loop(node: Option<&Node>, cx: &mut Cx<'_>) -> LoopPolicy {
    let default = LoopPolicy::BoundedLoop {
        max_model_steps: DEFAULT_MAX_MODEL_STEPS,
        max_tool_calls: DEFAULT_MAX_TOOL_CALLS,
    };
    let Some(node) = node else { return default };
    let Some(mut map) = MapView::new(node, "`loop`", cx) else {
        return default;
    };
    // `type` may be left out: it means `bounded_loop`.
    if let Some(t) = map.get_present("type") {
        match string(t, "type", cx).as_deref() {
            Some("bounded_loop") | None => {}
            Some("exactly_one_call") => {
                for key in ["max_model_steps", "max_tool_calls"] {
                    if let Some(n) = map.get_present(key) {
                        cx.error_at(
                            n,
                            format!("`{key}` applies to `bounded_loop` only (`exactly_one_call` makes one model call and no tool call)"),
                        );
                    }
                }
                map.finish("`loop`", LOOP_KEYS, cx);
                return LoopPolicy::ExactlyOneCall;
            }
            Some(other) => {
                cx.error_at(
                    t,
                    format!("unknown loop type `{other}` (expected `bounded_loop` or `exactly_one_call`)"),
                );
                return default;
            }
        }
    }
    let max_model_steps = opt_positive(&mut map, "max_model_steps", DEFAULT_MAX_MODEL_STEPS, cx);
    let max_tool_calls = opt_positive(&mut map, "max_tool_calls", DEFAULT_MAX_TOOL_CALLS, cx);
    map.finish("`loop`", LOOP_KEYS, cx);
    LoopPolicy::BoundedLoop {
        max_model_steps,
        max_tool_calls,
    }
}

/// `budget:` with the keys `keys` allows (an agent's or a workflow's).
fn parse_budget(node: Option<&Node>, keys: &[&str], cx: &mut Cx<'_>) -> Budget {
    let mut budget = Budget::default();
    let Some(node) = node else { return budget };
    let Some(mut map) = MapView::new(node, "`budget`", cx) else {
        return budget;
    };
    let count = |key: &str, map: &mut MapView<'_>, cx: &mut Cx<'_>| {
        map.get_present(key)
            .and_then(|n| positive::<u64>(n, key, cx))
    };
    budget.max_tokens = count("max_tokens", &mut map, cx);
    budget.max_input_tokens = count("max_input_tokens", &mut map, cx);
    budget.max_output_tokens = count("max_output_tokens", &mut map, cx);
    if keys.contains(&"max_model_steps") {
        budget.max_model_steps = map
            .get_present("max_model_steps")
            .and_then(|n| positive::<u32>(n, "max_model_steps", cx));
        budget.max_tool_calls = map
            .get_present("max_tool_calls")
            .and_then(|n| positive::<u32>(n, "max_tool_calls", cx));
    }
    budget.max_cost_usd = map
        .get_present("max_cost_usd")
        .and_then(|n| usd(n, "max_cost_usd", cx));
    budget.max_wall_time_ms = map
        .get_present("max_wall_time")
        .and_then(|n| duration_ms(n, "max_wall_time", cx));
    map.finish("`budget`", keys, cx);
    budget
}

/// A positive amount of US dollars (a number, decimals allowed).
fn usd(node: &Node, key: &str, cx: &mut Cx<'_>) -> Option<f64> {
    let v = match node.value {
        Val::Int(i) => i as f64,
        Val::UInt(u) => u as f64,
        Val::Float(f) => f,
        _ => {
            cx.error_at(
                node,
                format!(
                    "`{key}` must be an amount of US dollars, found {}",
                    show(&node.value)
                ),
            );
            return None;
        }
    };
    if !(v.is_finite() && v > 0.0) {
        cx.error_at(node, format!("`{key}` must be more than 0, found {v}"));
        return None;
    }
    Some(v)
}

/// `pricing: {input_per_million_usd, output_per_million_usd}`.
fn parse_pricing(node: &Node, cx: &mut Cx<'_>) -> Option<Pricing> {
    let mut map = MapView::new(node, "`pricing`", cx)?;
    let price = |key: &str, map: &mut MapView<'_>, cx: &mut Cx<'_>| -> Option<f64> {
        let n = required(map, key, "`pricing`", cx)?;
        match n.value {
            Val::Int(0) | Val::UInt(0) | Val::Float(0.0) => Some(0.0),
            _ => usd(n, key, cx),
        }
    };
    let input = price("input_per_million_usd", &mut map, cx);
    let output = price("output_per_million_usd", &mut map, cx);
    map.finish("`pricing`", PRICING_KEYS, cx);
    Some(Pricing {
        input_per_million_usd: input?,
        output_per_million_usd: output?,
    })
}

struct Limits {
    max_argument_bytes: u32,
    max_result_bytes: u32,
    max_model_attempts: u32,
    max_tool_attempts: u32,
}

fn parse_limits(node: Option<&Node>, cx: &mut Cx<'_>) -> Limits {
    let mut limits = Limits {
        max_argument_bytes: DEFAULT_MAX_ARGUMENT_BYTES,
        max_result_bytes: DEFAULT_MAX_RESULT_BYTES,
        max_model_attempts: DEFAULT_MAX_MODEL_ATTEMPTS,
        max_tool_attempts: DEFAULT_MAX_TOOL_ATTEMPTS,
    };
    let Some(node) = node else { return limits };
    let Some(mut map) = MapView::new(node, "`limits`", cx) else {
        return limits;
    };
    limits.max_argument_bytes = opt_positive(
        &mut map,
        "max_argument_bytes",
        limits.max_argument_bytes,
        cx,
    );
    limits.max_result_bytes =
        opt_positive(&mut map, "max_result_bytes", limits.max_result_bytes, cx);
    limits.max_model_attempts = opt_positive(
        &mut map,
        "max_model_attempts",
        limits.max_model_attempts,
        cx,
    );
    limits.max_tool_attempts =
        opt_positive(&mut map, "max_tool_attempts", limits.max_tool_attempts, cx);
    map.finish("`limits`", LIMIT_KEYS, cx);
    limits
}

/// A node as read, before the graph checks.
struct ParsedNode {
    id: Option<NameAt>,
    /// Every node id this node names (`next`, `on_timeout`, case targets, …),
    /// with the key that names it.
    edges: Vec<(String, NameAt)>,
    def: Option<NodeDef>,
}

fn parse_workflow(doc: &Node, mut map: MapView<'_>, cx: &mut Cx<'_>) {
    let errors_before = cx.out.errors.len();
    let name_at =
        required(&mut map, "name", "workflow", cx).and_then(|n| name(n, "name", "workflow", cx));
    if let Some(n) = &name_at {
        cx.out.declared_workflows.push(n.clone());
    }
    let budget = parse_budget(map.get_present("budget"), RUN_BUDGET_KEYS, cx);
    let input_schema = map.get_present("input_schema").and_then(|n| {
        let value = to_json(n, cx)?;
        if let Err(message) = schema::compile(&value) {
            cx.error_at(
                n,
                format!("`input_schema` is not a valid JSON Schema: {message}"),
            );
            return None;
        }
        Some(value)
    });
    let start = map
        .get_present("start")
        .and_then(|n| name(n, "start", "node id", cx));
    let nodes_node = required(&mut map, "nodes", "workflow", cx);
    let mut nodes: Vec<ParsedNode> = Vec::new();
    if let Some(items) = list(nodes_node, "nodes", cx) {
        if items.is_empty()
            && let Some(n) = nodes_node
        {
            cx.error_at(n, "a workflow needs at least one node");
        }
        for item in items {
            nodes.push(parse_node(item, cx));
        }
    }
    map.finish("a workflow", WORKFLOW_KEYS, cx);

    // Ids, including those of nodes with other errors, so one bad node does
    // not also make every `next` pointing at it an error.
    let mut ids: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, node) in nodes.iter().enumerate() {
        let Some(id) = &node.id else { continue };
        if let Some(&first) = ids.get(id.name.as_str()) {
            let first_line = nodes[first].id.as_ref().map_or(0, |f| f.line);
            cx.error(
                id.line,
                id.column,
                format!(
                    "duplicate node id `{}` (first on line {first_line})",
                    id.name
                ),
            );
        } else {
            ids.insert(&id.name, i);
        }
    }
    let unknown_node = |r: &NameAt, key: &str, cx: &mut Cx<'_>| {
        cx.error(
            r.line,
            r.column,
            format!("`{key}` names no node of this workflow: `{}`", r.name),
        );
    };
    if let Some(s) = &start
        && !ids.contains_key(s.name.as_str())
    {
        unknown_node(s, "start", cx);
    }
    for node in &nodes {
        for (key, target) in &node.edges {
            if !ids.contains_key(target.name.as_str()) {
                unknown_node(target, key, cx);
            }
        }
    }
    let forced = check_cycles(&nodes, &ids, cx);
    check_idle_cycles(&nodes, &ids, &forced, cx);

    if cx.out.errors.len() > errors_before {
        return;
    }
    let Some(name_at) = name_at else { return };
    let defs: Vec<NodeDef> = nodes.into_iter().filter_map(|n| n.def).collect();
    let Some(start) = start
        .map(|s| s.name)
        .or_else(|| defs.first().map(|n| n.id.clone()))
    else {
        return;
    };
    cx.out.workflows.push(WorkflowDef {
        name: name_at.name,
        start,
        nodes: defs,
        input_schema,
        budget,
        source_file: cx.file.to_string(),
        source_line: pos(doc).0,
    });
}

fn parse_node(item: &Node, cx: &mut Cx<'_>) -> ParsedNode {
    let mut parsed = ParsedNode {
        id: None,
        edges: Vec::new(),
        def: None,
    };
    let Some(mut map) = MapView::new(item, "a node", cx) else {
        return parsed;
    };
    let errors_before = cx.out.errors.len();
    parsed.id = required(&mut map, "id", "node", cx).and_then(|n| name(n, "id", "node id", cx));
    let Some(type_node) = required(&mut map, "type", "node", cx) else {
        return parsed;
    };
    let Some(node_type) = string(type_node, "type", cx) else {
        return parsed;
    };
    let next = edge(&mut map, "next", &mut parsed.edges, cx);
    let grants = names_list(
        map.get("grants"),
        "grants",
        |s| check_permission("grant", s),
        cx,
    );
    let (kind, allowed): (Option<NodeKind>, &[&str]) = match node_type.as_str() {
        "agent" => {
            let agent = required(&mut map, "agent", "an agent node", cx)
                .and_then(|n| name(n, "agent", "agent", cx));
            if let Some(a) = &agent {
                cx.out.agent_refs.push(a.clone());
            }
            let input = map
                .get_present("input")
                .and_then(|n| template(n, "input", cx));
            (
                agent.map(|a| NodeKind::Agent {
                    agent: a.name,
                    input,
                }),
                AGENT_NODE_KEYS,
            )
        }
        "tool" => {
            let tool = required(&mut map, "tool", "a tool node", cx)
                .and_then(|n| name(n, "tool", "tool", cx));
            if let Some(t) = &tool {
                cx.out.tool_refs.push(t.clone());
            }
            let args = match map.get_present("args") {
                Some(n) => template(n, "args", cx),
                None => Some(Template::constant(Value::Object(Default::default()))),
            };
            let on_error = edge(&mut map, "on_error", &mut parsed.edges, cx);
            let kind = match (tool, args) {
                (Some(tool), Some(args)) => Some(NodeKind::Tool {
                    tool: tool.name,
                    args,
                    on_error,
                }),
                _ => None,
            };
            (kind, TOOL_NODE_KEYS)
        }
        "wait" => (
            parse_wait(item, &mut map, &mut parsed.edges, cx),
            WAIT_NODE_KEYS,
        ),
        "workflow" => {
            let workflow = required(&mut map, "workflow", "a workflow node", cx)
                .and_then(|n| name(n, "workflow", "workflow", cx));
            if let Some(w) = &workflow {
                cx.out.workflow_refs.push(w.clone());
            }
            let input = map
                .get_present("input")
                .and_then(|n| template(n, "input", cx));
            let mode = match map.get_present("mode") {
                None => Some(ChildMode::Sync),
                Some(n) => match string(n, "mode", cx).as_deref() {
                    Some("sync") => Some(ChildMode::Sync),
                    Some("async") => Some(ChildMode::Async),
                    Some(other) => {
                        cx.error_at(
                            n,
                            format!("unknown mode `{other}` (expected `sync` or `async`)"),
                        );
                        None
                    }
                    None => None,
                },
            };
            let timeout_ms = map
                .get_present("timeout")
                .and_then(|n| duration_ms(n, "timeout", cx));
            let on_timeout = edge(&mut map, "on_timeout", &mut parsed.edges, cx);
            let on_error = edge(&mut map, "on_error", &mut parsed.edges, cx);
            if mode == Some(ChildMode::Async)
                && (timeout_ms.is_some() || on_timeout.is_some() || on_error.is_some())
            {
                cx.error_at(
                    item,
                    "an `async` workflow node does not wait for its child: `timeout`, `on_timeout` and `on_error` apply to `sync` only",
                );
            }
            let kind = match (workflow, mode) {
                (Some(w), Some(mode)) => Some(NodeKind::Workflow {
                    workflow: w.name,
                    input,
                    mode,
                    timeout_ms,
                    on_timeout,
                    on_error,
                }),
                _ => None,
            };
            (kind, WORKFLOW_NODE_KEYS)
        }
        "approval" => {
            let subject = required(&mut map, "subject", "an approval node", cx)
                .and_then(|n| template(n, "subject", cx));
            let prompt = map
                .get_present("prompt")
                .and_then(|n| template(n, "prompt", cx));
            let approver_grant = required(&mut map, "approver_grant", "an approval node", cx)
                .and_then(|n| {
                    let s = string(n, "approver_grant", cx)?;
                    if let Some(m) = check_permission("approver_grant", &s) {
                        cx.error_at(n, m);
                        return None;
                    }
                    Some(s)
                });
            let allow_edits = map
                .get_present("allow_edits")
                .and_then(|n| boolean(n, "allow_edits", cx))
                .unwrap_or(false);
            let edits_schema = map
                .get_present("edits_schema")
                .and_then(|n| json_schema(n, "edits_schema", cx));
            let on_decline = edge(&mut map, "on_decline", &mut parsed.edges, cx);
            let timeout_ms = map
                .get_present("timeout")
                .and_then(|n| duration_ms(n, "timeout", cx));
            let on_timeout = edge(&mut map, "on_timeout", &mut parsed.edges, cx);
            let kind = match (subject, approver_grant) {
                (Some(subject), Some(approver_grant)) => Some(NodeKind::Approval(ApprovalDef {
                    subject,
                    prompt,
                    approver_grant,
                    allow_edits,
                    edits_schema,
                    on_decline,
                    timeout_ms,
                    on_timeout,
                })),
                _ => None,
            };
            (kind, APPROVAL_NODE_KEYS)
        }
        "branch" => {
            let mut cases = Vec::new();
            let cases_node = required(&mut map, "cases", "a branch node", cx);
            if let Some(items) = list(cases_node, "cases", cx) {
                for case in items {
                    let Some(mut cm) = MapView::new(case, "a case", cx) else {
                        continue;
                    };
                    let when =
                        required(&mut cm, "when", "a case", cx).and_then(|n| expr(n, "when", cx));
                    let next = required(&mut cm, "next", "a case", cx)
                        .and_then(|n| name(n, "next", "node id", cx));
                    cm.finish("a case", &["when", "next"], cx);
                    if let Some(n) = &next {
                        parsed.edges.push(("next".into(), n.clone()));
                    }
                    if let (Some(when), Some(next)) = (when, next) {
                        cases.push(BranchCase {
                            when,
                            next: next.name,
                        });
                    }
                }
            }
            let default = edge(&mut map, "default", &mut parsed.edges, cx);
            (Some(NodeKind::Branch { cases, default }), BRANCH_NODE_KEYS)
        }
        "set" => {
            let values = required(&mut map, "values", "a set node", cx).and_then(|n| {
                if !matches!(n.value, Val::Map(_)) {
                    cx.error_at(n, "`values` must be a mapping of variable names to values");
                    return None;
                }
                template(n, "values", cx)
            });
            (values.map(|values| NodeKind::Set { values }), SET_NODE_KEYS)
        }
        "fail" => {
            let error = required(&mut map, "error", "a fail node", cx)
                .and_then(|n| template(n, "error", cx));
            (error.map(|error| NodeKind::Fail { error }), FAIL_NODE_KEYS)
        }
        "succeed" => {
            let output = map
                .get_present("output")
                .and_then(|n| template(n, "output", cx));
            (Some(NodeKind::Succeed { output }), SUCCEED_NODE_KEYS)
        }
        other => {
            // The keys of an unknown type are not known, so they are not
            // reported as unknown: the type error says all there is to say.
            let message = {
                format!(
                    "unknown node type `{other}` (expected one of: agent, tool, wait, approval, branch, workflow, set, fail, succeed)"
                )
            };
            cx.error_at(type_node, message);
            return parsed;
        }
    };
    if matches!(node_type.as_str(), "fail" | "succeed")
        && let Some((_, n)) = parsed.edges.iter().find(|(k, _)| k == "next")
    {
        cx.error(
            n.line,
            n.column,
            format!("a `{node_type}` node ends the run: it cannot have `next`"),
        );
    }
    let article = if matches!(node_type.as_str(), "agent" | "approval") {
        "an"
    } else {
        "a"
    };
    map.finish(&format!("{article} {node_type} node"), allowed, cx);
    if cx.out.errors.len() > errors_before {
        return parsed;
    }
    if let (Some(id), Some(kind)) = (&parsed.id, kind) {
        parsed.def = Some(NodeDef {
            id: id.name.clone(),
            kind,
            grants: grants.into_iter().map(|g| g.name).collect(),
            next,
            source_line: pos(item).0,
        });
    }
    parsed
}

/// A key naming another node (`next`, `on_error`, …): recorded as an edge
/// for the graph checks; returns the id.
fn edge(
    map: &mut MapView<'_>,
    key: &str,
    edges: &mut Vec<(String, NameAt)>,
    cx: &mut Cx<'_>,
) -> Option<String> {
    let at = map
        .get_present(key)
        .and_then(|n| name(n, key, "node id", cx))?;
    let n = at.name.clone();
    edges.push((key.to_owned(), at));
    Some(n)
}

/// A `wait` node: `for:` (a list) or one of `signal:` / `duration:` /
/// `until:` directly on the node, plus `timeout:` / `on_timeout:`.
fn parse_wait(
    item: &Node,
    map: &mut MapView<'_>,
    edges: &mut Vec<(String, NameAt)>,
    cx: &mut Cx<'_>,
) -> Option<NodeKind> {
    let errors_before = cx.out.errors.len();
    let mut any = Vec::new();
    let direct = ["signal", "duration", "until"]
        .iter()
        .filter(|k| map.get_present(k).is_some())
        .count();
    if let Some(list_node) = map.get_present("for") {
        if direct > 0 {
            cx.error_at(
                list_node,
                "give either `for:` (a list) or one of `signal:`, `duration:`, `until:`, not both",
            );
        }
        if let Some(items) = list(Some(list_node), "for", cx) {
            if items.is_empty() {
                cx.error_at(list_node, "`for` needs at least one entry");
            }
            for entry in items {
                let Some(mut em) = MapView::new(entry, "an entry of `for`", cx) else {
                    continue;
                };
                if let Some(f) = wait_for(&mut em, true, edges, cx) {
                    any.push(f);
                }
                em.finish("an entry of `for`", WAIT_FOR_KEYS, cx);
            }
        }
    } else if direct == 0 {
        cx.error_at(
            item,
            "a wait node needs `signal:`, `duration:`, `until:` or a `for:` list of them",
        );
    } else if direct > 1 {
        cx.error_at(
            item,
            "a wait node takes one of `signal:`, `duration:`, `until:`; use a `for:` list to wait for the first of several",
        );
    } else if let Some(f) = wait_for(map, false, edges, cx) {
        any.push(f);
    }
    let timeout_ms = map
        .get_present("timeout")
        .and_then(|n| duration_ms(n, "timeout", cx));
    let on_timeout = map
        .get_present("on_timeout")
        .and_then(|n| name(n, "on_timeout", "node id", cx));
    if let Some(n) = &on_timeout {
        edges.push(("on_timeout".into(), n.clone()));
    }
    // A signal named twice could never tell its two branches apart.
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    for f in &any {
        if let WaitFor::Signal { name, .. } = f
            && !seen.insert(name)
        {
            cx.error_at(
                item,
                format!("signal `{name}` is waited for twice in one node"),
            );
        }
    }
    if cx.out.errors.len() > errors_before {
        return None;
    }
    Some(NodeKind::Wait(WaitDef {
        any,
        timeout_ms,
        on_timeout: on_timeout.map(|n| n.name),
    }))
}

/// One thing to wait for (`signal` + `payload_schema`, `duration`, or
/// `until`), with its optional `next`.
fn wait_for(
    map: &mut MapView<'_>,
    entry: bool,
    edges: &mut Vec<(String, NameAt)>,
    cx: &mut Cx<'_>,
) -> Option<WaitFor> {
    let signal = map.get_present("signal");
    let duration = map.get_present("duration");
    let until = map.get_present("until");
    // Inside a `for:` entry `next` belongs to the entry; on the node itself
    // it is the node's `next`, already read.
    let next = if entry {
        map.get_present("next")
            .and_then(|n| name(n, "next", "node id", cx))
    } else {
        None
    };
    if let Some(n) = &next {
        edges.push(("next".into(), n.clone()));
    }
    let next = next.map(|n| n.name);
    match (signal, duration, until) {
        (Some(s), None, None) => {
            let signal = name(s, "signal", "signal", cx)?;
            let payload_schema = map
                .get_present("payload_schema")
                .and_then(|n| json_schema(n, "payload_schema", cx));
            Some(WaitFor::Signal {
                name: signal.name,
                payload_schema,
                next,
            })
        }
        (None, Some(d), None) => Some(WaitFor::Duration {
            ms: duration_ms(d, "duration", cx)?,
            next,
        }),
        (None, None, Some(u)) => Some(WaitFor::Until {
            at: until_time(u, cx)?,
            next,
        }),
        _ => {
            cx.error_at(
                map.node,
                "each entry of `for` takes exactly one of `signal:`, `duration:`, `until:`",
            );
            None
        }
    }
}

/// The `until:` of a wait: a template rendered when the wait starts. One
/// without `${ }` is a fixed time, checked now as the machine would check
/// it then (an RFC 3339 time, surrounding spaces ignored), so a typo is
/// refused at registration rather than failing every run that gets there.
fn until_time(node: &Node, cx: &mut Cx<'_>) -> Option<Template> {
    let at = template(node, "until", cx)?;
    if !at.is_constant() {
        return Some(at);
    }
    // A constant renders without reading the state.
    let problem = match at.render(&Value::Null) {
        Ok(Value::String(s)) => chrono::DateTime::parse_from_rfc3339(s.trim())
            .err()
            .map(|e| format!("`until` is not an RFC 3339 time ({e}): {s:?}")),
        _ => Some(format!(
            "`until` must be an RFC 3339 time string, not {}",
            type_name(&node.value)
        )),
    };
    match problem {
        Some(message) => {
            cx.error_at(
                node,
                format!(
                    "{message}; write a time such as `2030-01-31T09:00:00Z`, or a `${{ }}` expression that gives one"
                ),
            );
            None
        }
        None => Some(at),
    }
}

/// A duration: a whole number of ms, or text such as `90s`, `15m`, `3d`,
/// `1h 30m` (humantime's syntax).
fn duration_ms(node: &Node, key: &str, cx: &mut Cx<'_>) -> Option<u64> {
    let ms = duration_ms_unbounded(node, key, cx)?;
    if ms > crate::model::MAX_TIMER_MS {
        cx.error_at(
            node,
            format!(
                "`{key}` is longer than 10 years ({} ms), the longest a durable timer may wait",
                crate::model::MAX_TIMER_MS
            ),
        );
        return None;
    }
    Some(ms)
}

fn duration_ms_unbounded(node: &Node, key: &str, cx: &mut Cx<'_>) -> Option<u64> {
    match &node.value {
        Val::Str(s) => match humantime::parse_duration(s.trim()) {
            Ok(d) if d.as_millis() >= 1 => u64::try_from(d.as_millis()).ok().or_else(|| {
                cx.error_at(node, format!("`{key}` is too long: {s}"));
                None
            }),
            Ok(_) => {
                cx.error_at(node, format!("`{key}` must be at least 1 ms, found {s:?}"));
                None
            }
            Err(e) => {
                cx.error_at(
                    node,
                    format!("`{key}` is not a duration ({e}): write ms as a number, or text like `90s`, `15m`, `3d`"),
                );
                None
            }
        },
        _ => positive::<u64>(node, key, cx),
    }
}

fn boolean(node: &Node, key: &str, cx: &mut Cx<'_>) -> Option<bool> {
    match node.value {
        Val::Bool(b) => Some(b),
        ref other => {
            cx.error_at(
                node,
                format!("`{key}` must be true or false, found {}", type_name(other)),
            );
            None
        }
    }
}

fn json_schema(node: &Node, key: &str, cx: &mut Cx<'_>) -> Option<Value> {
    let value = to_json(node, cx)?;
    if let Err(message) = schema::compile(&value) {
        cx.error_at(
            node,
            format!("`{key}` is not a valid JSON Schema: {message}"),
        );
        return None;
    }
    Some(value)
}

/// A value whose strings may hold `${ <jq> }`; every expression is compiled
/// now, and each error names the string's place in the value.
fn template(node: &Node, key: &str, cx: &mut Cx<'_>) -> Option<Template> {
    let value = to_json(node, cx)?;
    match Template::parse(&value) {
        Ok(t) => Some(t),
        Err(errors) => {
            for e in errors {
                cx.error_at(node, format!("`{key}`: {e}"));
            }
            None
        }
    }
}

/// One jq expression, written with or without `${ }`.
fn expr(node: &Node, key: &str, cx: &mut Cx<'_>) -> Option<Expr> {
    let s = string(node, key, cx)?;
    let trimmed = s.trim();
    let inner = trimmed
        .strip_prefix("${")
        .and_then(|r| r.strip_suffix('}'))
        .unwrap_or(trimmed);
    match Expr::parse(inner) {
        Ok(e) => Some(e),
        Err(e) => {
            cx.error_at(node, format!("`{key}`: {e}"));
            None
        }
    }
}

/// A cycle of nodes that each have exactly one way out (`next`) can never
/// finish; a cycle through a node with a choice (branch, wait, approval,
/// `on_error`) can, so only the first kind is an error. `fail` and `succeed`
/// end the run. Returns the nodes of the cycles reported.
fn check_cycles(
    nodes: &[ParsedNode],
    ids: &BTreeMap<&str, usize>,
    cx: &mut Cx<'_>,
) -> BTreeSet<usize> {
    let next_of = |i: usize| -> Option<usize> {
        let [(key, next)] = nodes[i].edges.as_slice() else {
            return None;
        };
        if key != "next" {
            return None;
        }
        ids.get(next.name.as_str()).copied()
    };
    // Each node has at most one forced successor, so following them from any
    // node either ends or enters exactly one cycle.
    let mut reported: BTreeSet<usize> = BTreeSet::new();
    let mut done: BTreeSet<usize> = BTreeSet::new();
    for start in 0..nodes.len() {
        let mut path: Vec<usize> = Vec::new();
        let mut cur = Some(start);
        while let Some(i) = cur {
            if done.contains(&i) {
                break;
            }
            if let Some(at) = path.iter().position(|&p| p == i) {
                let cycle = &path[at..];
                if cycle.iter().all(|c| !reported.contains(c)) {
                    reported.extend(cycle.iter().copied());
                    // Report at the `next` of the cycle's first node in file order.
                    let first = cycle.iter().copied().min().unwrap_or(i);
                    let mut names: Vec<&str> = Vec::new();
                    let rot = cycle.iter().position(|&c| c == first).unwrap_or(0);
                    for &c in cycle[rot..].iter().chain(&cycle[..rot]) {
                        names.push(nodes[c].id.as_ref().map_or("?", |n| n.name.as_str()));
                    }
                    names.push(names[0]);
                    if let Some((_, next)) = nodes[first].edges.first() {
                        cx.error(
                            next.line,
                            next.column,
                            format!(
                                "nodes form a cycle ({}) with no way out; the workflow could never finish",
                                names.join(" -> ")
                            ),
                        );
                    }
                }
                break;
            }
            path.push(i);
            cur = next_of(i);
        }
        done.extend(path);
    }
    reported
}

/// Whether a run passes through `node` within one step, without waiting
/// for anything outside or handing work to anyone: `branch`, `set`, an
/// `async` `workflow` node (it starts its child and goes on), and a `wait`
/// whose every entry is a fixed `until:` time with no `timeout` (once the
/// time has passed, which it has on every visit after the first, the wait
/// ends as soon as it starts).
fn passes_through(node: &NodeDef) -> bool {
    match &node.kind {
        NodeKind::Branch { .. } | NodeKind::Set { .. } => true,
        NodeKind::Workflow { mode, .. } => *mode == ChildMode::Async,
        NodeKind::Wait(wait) => {
            wait.timeout_ms.is_none()
                && wait
                    .any
                    .iter()
                    .all(|f| matches!(f, WaitFor::Until { at, .. } if at.is_constant()))
        }
        NodeKind::Agent { .. }
        | NodeKind::Tool { .. }
        | NodeKind::Approval(_)
        | NodeKind::Fail { .. }
        | NodeKind::Succeed { .. } => false,
    }
}

/// A cycle whose every node passes through ([`passes_through`]) loops
/// inside one step of the run for as long as its conditions hold, and
/// nothing outside can change them: the engine would spin in one
/// transition, writing events without end. So it is refused, even when a
/// branch could leave it (a counter in `set` is the same loop; count in
/// one jq expression instead). A cycle with a node that waits (a signal,
/// a duration, an `until:` expression, an approval) or does work (an
/// agent, a tool, a sync child workflow) is a loop the run takes one step
/// at a time, e.g. polling every 10 minutes; it is allowed.
fn check_idle_cycles(
    nodes: &[ParsedNode],
    ids: &BTreeMap<&str, usize>,
    already: &BTreeSet<usize>,
    cx: &mut Cx<'_>,
) {
    let idle: Vec<bool> = nodes
        .iter()
        .map(|n| n.def.as_ref().is_some_and(passes_through))
        .collect();
    // Successors within the idle part of the graph, in edge order.
    let succ: Vec<Vec<usize>> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            if !idle[i] {
                return Vec::new();
            }
            let mut out: Vec<usize> = Vec::new();
            for (_, target) in &n.edges {
                if let Some(&j) = ids.get(target.name.as_str())
                    && idle[j]
                    && !out.contains(&j)
                {
                    out.push(j);
                }
            }
            out
        })
        .collect();
    let mut reported: BTreeSet<usize> = already.clone();
    // In file order: the shortest way from each idle node back to itself.
    for start in 0..nodes.len() {
        if !idle[start] || reported.contains(&start) {
            continue;
        }
        let Some(cycle) = shortest_cycle(start, &succ) else {
            continue;
        };
        if cycle.iter().any(|c| reported.contains(c)) {
            continue;
        }
        reported.extend(cycle.iter().copied());
        let name = |i: usize| nodes[i].id.as_ref().map_or("?", |n| n.name.as_str());
        let mut names: Vec<&str> = cycle.iter().map(|&c| name(c)).collect();
        names.push(name(start));
        let to = cycle.get(1).copied().unwrap_or(start);
        let Some((_, edge)) = nodes[start].edges.iter().find(|(_, t)| t.name == name(to)) else {
            continue;
        };
        cx.error(
            edge.line,
            edge.column,
            format!(
                "nodes form a loop ({}) that neither waits nor does work: a run that enters it would go round inside one step without end; put a node in it that waits (`wait` with a `duration` or a signal, an `approval`) or does work (`agent`, `tool`)",
                names.join(" -> ")
            ),
        );
    }
}

/// The nodes of a shortest cycle through `start` (beginning with it), by
/// breadth-first search over `succ`.
fn shortest_cycle(start: usize, succ: &[Vec<usize>]) -> Option<Vec<usize>> {
    let mut parent: BTreeMap<usize, usize> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(i) = queue.pop_front() {
        for &j in &succ[i] {
            if j == start {
                let mut cycle = vec![i];
                let mut cur = i;
                while cur != start {
                    cur = *parent.get(&cur)?;
                    cycle.push(cur);
                }
                cycle.reverse();
                return Some(cycle);
            }
            if let std::collections::btree_map::Entry::Vacant(e) = parent.entry(j) {
                e.insert(i);
                queue.push_back(j);
            }
        }
    }
    None
}

/// The JSON of a YAML value (for `input_schema`).
fn to_json(node: &Node, cx: &mut Cx<'_>) -> Option<Value> {
    Some(match &node.value {
        Val::Null => Value::Null,
        Val::Bool(b) => Value::Bool(*b),
        Val::Int(i) => Value::from(*i),
        Val::UInt(u) => Value::from(*u),
        Val::Float(f) => match serde_json::Number::from_f64(*f) {
            Some(n) => Value::Number(n),
            None => {
                cx.error_at(node, "JSON has no infinity or NaN");
                return None;
            }
        },
        Val::Str(s) => Value::String(s.clone()),
        Val::Seq(items) => {
            let mut out = Vec::with_capacity(items.len());
            let mut ok = true;
            for item in items {
                match to_json(item, cx) {
                    Some(v) => out.push(v),
                    None => ok = false,
                }
            }
            if !ok {
                return None;
            }
            Value::Array(out)
        }
        Val::Map(entries) => {
            let mut out = serde_json::Map::new();
            let mut ok = true;
            for (k, v) in entries {
                let Some(key) = key_string(k) else {
                    cx.error_at(
                        k,
                        format!("keys must be strings, found {}", type_name(&k.value)),
                    );
                    ok = false;
                    continue;
                };
                match to_json(v, cx) {
                    Some(v) => {
                        out.insert(key, v);
                    }
                    None => ok = false,
                }
            }
            if !ok {
                return None;
            }
            Value::Object(out)
        }
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
