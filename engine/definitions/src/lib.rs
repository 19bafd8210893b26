//! Definitions: parse and validate a bundle of `.tools.abl` files (tools) and
//! YAML files (agents and workflows) into a [`model::Bundle`], reporting every
//! error of every file with its line and column.
//!
//! Architecture invariant: pure code. No I/O, no clock, no async: callers
//! hand in file contents and get values or errors back, so registration can
//! refuse a bundle before anything is stored ("never half-registered").

pub mod expr;
pub mod model;

mod abl;
mod imports;
#[cfg(test)]
mod prop_tests;
mod schema;
mod signature;
pub mod strict;
mod yaml;

use std::collections::{BTreeMap, BTreeSet};

/// Longest tool, agent, workflow or node name. Model providers cap function
/// names at 64 characters (OpenAI: `^[a-zA-Z0-9_-]{1,64}$`), and tool names
/// are sent to them verbatim.
const MAX_NAME_LEN: usize = 64;

/// Longest permission or grant.
const MAX_PERMISSION_LEN: usize = 128;

/// One file of a bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFile {
    /// Bundle-relative path; its extension selects the parser.
    pub path: String,
    /// The file's text.
    pub content: String,
}

/// One problem in one file, 1-based line and column.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}:{column}: {message}")]
pub struct DefinitionError {
    /// Bundle-relative path of the file.
    pub file: String,
    /// 1-based line.
    pub line: u32,
    /// 1-based column (characters, not bytes).
    pub column: u32,
    /// What is wrong, in words an author can act on.
    pub message: String,
}

impl DefinitionError {
    fn new(file: &str, line: u32, column: u32, message: impl Into<String>) -> Self {
        DefinitionError {
            file: file.to_string(),
            line,
            column,
            message: message.into(),
        }
    }
}

/// Names already registered for the tenant (so a bundle may reference them).
#[derive(Debug, Clone, Default)]
pub struct RegisteredNames {
    /// Tool names.
    pub tools: BTreeSet<String>,
    /// Agent names.
    pub agents: BTreeSet<String>,
    /// Workflow names.
    pub workflows: BTreeSet<String>,
    /// Values of the `{{config.NAME}}` placeholders the engine resolves in
    /// definitions when they are registered (a `type: workflow` tool's
    /// `timeout_ms`), by NAME: the engine's configuration
    /// (`BELAY_TOOL_CONFIG_<NAME>` in its environment, see
    /// [`config_from_env`]). The stored definition holds the value.
    pub config: BTreeMap<String, String>,
}

/// Prefix of the engine's environment variables that give `{{config.NAME}}`
/// values for definitions (the same prefix workers read for tool calls).
pub const CONFIG_ENV_PREFIX: &str = "BELAY_TOOL_CONFIG_";

/// `{{config.NAME}}` values from `vars` (an environment): every
/// `BELAY_TOOL_CONFIG_<NAME>=value` with a non-empty NAME.
pub fn config_from_env(
    vars: impl IntoIterator<Item = (String, String)>,
) -> BTreeMap<String, String> {
    vars.into_iter()
        .filter_map(|(k, v)| {
            let name = k.strip_prefix(CONFIG_ENV_PREFIX)?;
            (!name.is_empty()).then(|| (name.to_owned(), v))
        })
        .collect()
}

/// A name (or a reference to one) and where it is written.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NameAt {
    name: String,
    line: u32,
    column: u32,
}

/// How a file is parsed, from its name.
enum FileKind {
    Tools,
    Yaml,
}

fn file_kind(path: &str) -> Option<FileKind> {
    let lower = path.to_ascii_lowercase();
    if lower.ends_with(".tools.abl") {
        Some(FileKind::Tools)
    } else if lower.ends_with(".yaml") || lower.ends_with(".yml") {
        Some(FileKind::Yaml)
    } else {
        None
    }
}

/// Parse and validate a whole bundle. Every error of every file is returned
/// (not just the first); Ok only if there are none.
///
/// Errors come in bundle file order, then by line and column. References
/// (an agent's tools, a node's agent) may name definitions of this bundle or
/// of `registered`; names must be unique across the bundle.
pub fn parse_bundle(
    files: &[SourceFile],
    registered: &RegisteredNames,
) -> Result<model::Bundle, Vec<DefinitionError>> {
    let mut bundle = model::Bundle::default();
    let mut errors: Vec<DefinitionError> = Vec::new();
    // (file, name) of every declaration, for duplicate and reference checks.
    let mut tools_declared: Vec<(&str, NameAt)> = Vec::new();
    let mut agents_declared: Vec<(&str, NameAt)> = Vec::new();
    let mut workflows_declared: Vec<(&str, NameAt)> = Vec::new();
    let mut tool_refs: Vec<(&str, NameAt)> = Vec::new();
    let mut agent_refs: Vec<(&str, NameAt)> = Vec::new();
    let mut workflow_refs: Vec<(&str, NameAt)> = Vec::new();
    let mut config_timeouts: Vec<(&str, (String, String, u32, u32))> = Vec::new();
    let mut probe_refs: Vec<(&str, String, NameAt)> = Vec::new();
    // (file, producer, vault key, consumer) of every `consumers:` name.
    let mut secret_consumers: Vec<(&str, String, String, NameAt)> = Vec::new();
    let mut paths: BTreeSet<&str> = BTreeSet::new();
    // `file:` imports: (file, tools it declares, its imports) of every
    // tools file, (file, agent, imports) of every agent.
    let mut tools_files: Vec<(&str, Vec<NameAt>, Vec<imports::FileImport>)> = Vec::new();
    let mut agent_imports: Vec<(&str, String, Vec<imports::FileImport>)> = Vec::new();

    for file in files {
        let path = file.path.as_str();
        if !paths.insert(path) {
            errors.push(DefinitionError::new(
                path,
                1,
                1,
                "this file appears twice in the bundle",
            ));
            continue;
        }
        match file_kind(path) {
            Some(FileKind::Tools) => {
                let out = abl::parse_tools_file(path, &file.content);
                bundle.tools.extend(out.tools);
                tools_files.push((path, out.declared.clone(), out.imports));
                tools_declared.extend(out.declared.into_iter().map(|n| (path, n)));
                probe_refs.extend(out.reconcile_refs.into_iter().map(|(t, n)| (path, t, n)));
                secret_consumers.extend(
                    out.secret_consumers
                        .into_iter()
                        .map(|(t, k, n)| (path, t, k, n)),
                );
                workflow_refs.extend(out.workflow_refs.into_iter().map(|n| (path, n)));
                config_timeouts.extend(out.config_timeouts.into_iter().map(|c| (path, c)));
                errors.extend(out.errors);
            }
            Some(FileKind::Yaml) => {
                let out = yaml::parse_yaml_file(path, &file.content);
                bundle.agents.extend(out.agents);
                bundle.workflows.extend(out.workflows);
                agents_declared.extend(out.declared_agents.into_iter().map(|n| (path, n)));
                workflows_declared.extend(out.declared_workflows.into_iter().map(|n| (path, n)));
                tool_refs.extend(out.tool_refs.into_iter().map(|n| (path, n)));
                agent_imports.extend(out.agent_imports.into_iter().map(|(a, i)| (path, a, i)));
                agent_refs.extend(out.agent_refs.into_iter().map(|n| (path, n)));
                workflow_refs.extend(out.workflow_refs.into_iter().map(|n| (path, n)));
                errors.extend(out.errors);
            }
            None => errors.push(DefinitionError::new(
                path,
                1,
                1,
                format!(
                    "`{path}` is not a definition file: expected `*.tools.abl` (tools) or `*.yaml` / `*.yml` (agents and workflows)"
                ),
            )),
        }
    }

    // `timeout_ms: "{{config.NAME}}"`: the engine's value, now.
    for (file, (tool, name, line, column)) in config_timeouts {
        let value = match registered.config.get(&name) {
            None => Err(format!(
                "`{{{{config.{name}}}}}` has no value on the engine: set {CONFIG_ENV_PREFIX}{name} in the engine's environment"
            )),
            Some(v) => match v.trim().parse::<u64>() {
                Ok(ms) if (1..=model::MAX_TIMER_MS).contains(&ms) => Ok(ms),
                Ok(ms) if ms > model::MAX_TIMER_MS => Err(format!(
                    "`{{{{config.{name}}}}}` is longer than 10 years ({} ms), the longest a durable timer may wait",
                    model::MAX_TIMER_MS
                )),
                // The value is configuration, not a secret, but say only
                // what it is not.
                _ => Err(format!(
                    "`{{{{config.{name}}}}}` must be a whole number of ms, at least 1, for `timeout_ms`"
                )),
            },
        };
        match value {
            Ok(ms) => {
                for def in bundle.tools.iter_mut().filter(|t| t.name == tool) {
                    if let model::ToolBindingDef::Workflow { timeout_ms, .. } = &mut def.binding {
                        *timeout_ms = Some(ms);
                    }
                }
            }
            Err(message) => errors.push(DefinitionError::new(file, line, column, message)),
        }
    }

    let tool_names = check_unique("tool", &tools_declared, &mut errors);
    let agent_names = check_unique("agent", &agents_declared, &mut errors);
    let workflow_names = check_unique("workflow", &workflows_declared, &mut errors);
    for (file, r) in &tool_refs {
        if !tool_names.contains(r.name.as_str()) && !registered.tools.contains(&r.name) {
            errors.push(DefinitionError::new(
                file,
                r.line,
                r.column,
                format!(
                    "unknown tool `{}`: not declared in this bundle nor registered",
                    r.name
                ),
            ));
        }
    }
    for (file, tool, r) in &probe_refs {
        match bundle.tools.iter().find(|t| t.name == r.name) {
            Some(probe) => {
                let takes_key = probe
                    .input_schema
                    .pointer("/properties/idempotency_key/type")
                    .is_some_and(|t| t == "string");
                if probe.repeat_safety != model::RepeatSafety::Idempotent || !takes_key {
                    errors.push(DefinitionError::new(
                        file,
                        r.line,
                        r.column,
                        format!(
                            "`{}`, the reconcile probe of `{tool}`, must be `repeat_safety: idempotent` and take an `idempotency_key: string` parameter",
                            r.name
                        ),
                    ));
                } else if !matches!(
                    probe.binding,
                    model::ToolBindingDef::Http { .. } | model::ToolBindingDef::Mcp { .. }
                ) {
                    errors.push(DefinitionError::new(
                        file,
                        r.line,
                        r.column,
                        format!(
                            "`{}`, the reconcile probe of `{tool}`, must be `type: http` or `type: mcp`: a probe answers in the same request",
                            r.name
                        ),
                    ));
                }
            }
            None if tool_names.contains(r.name.as_str()) || registered.tools.contains(&r.name) => {}
            None => errors.push(DefinitionError::new(
                file,
                r.line,
                r.column,
                format!(
                    "unknown tool `{}` in `reconcile_with:`: not declared in this bundle nor registered",
                    r.name
                ),
            )),
        }
    }
    // A consumer named in `RESULT_SECRETS` is a tool of the bundle that
    // reads the key (or a registered tool, whose declaration is not at hand).
    for (file, producer, key, r) in &secret_consumers {
        match bundle.tools.iter().find(|t| t.name == r.name) {
            Some(consumer) if !consumer.secret_access.contains(key) => {
                errors.push(DefinitionError::new(
                    file,
                    r.line,
                    r.column,
                    format!(
                        "`{}` is a consumer of vault key `{key}` of `{producer}`, but its `SECRET_ACCESS: READ` does not list `{key}`",
                        r.name
                    ),
                ));
            }
            Some(_) => {}
            None if tool_names.contains(r.name.as_str()) || registered.tools.contains(&r.name) => {}
            None => errors.push(DefinitionError::new(
                file,
                r.line,
                r.column,
                format!(
                    "unknown tool `{}` in `consumers:` of vault key `{key}`: not declared in this bundle nor registered",
                    r.name
                ),
            )),
        }
    }
    for (file, r) in &agent_refs {
        if !agent_names.contains(r.name.as_str()) && !registered.agents.contains(&r.name) {
            errors.push(DefinitionError::new(
                file,
                r.line,
                r.column,
                format!(
                    "unknown agent `{}`: not declared in this bundle nor registered",
                    r.name
                ),
            ));
        }
    }

    for (file, r) in &workflow_refs {
        if !workflow_names.contains(r.name.as_str()) && !registered.workflows.contains(&r.name) {
            errors.push(DefinitionError::new(
                file,
                r.line,
                r.column,
                format!(
                    "unknown workflow `{}`: not declared in this bundle nor registered",
                    r.name
                ),
            ));
        }
    }
    resolve_imports(
        &mut bundle,
        files,
        &tools_files,
        &agent_imports,
        &mut errors,
    );
    check_child_cycles(
        &bundle,
        &Refs {
            workflows: &workflow_refs,
            tools: &tool_refs,
            agents: &agent_refs,
        },
        &mut errors,
    );

    if errors.is_empty() {
        return Ok(bundle);
    }
    // Deterministic order: as the files were given, then top to bottom.
    let order: BTreeMap<&str, usize> = files
        .iter()
        .enumerate()
        .rev()
        .map(|(i, f)| (f.path.as_str(), i))
        .collect();
    errors.sort_by_key(|e| {
        (
            order.get(e.file.as_str()).copied().unwrap_or(usize::MAX),
            e.line,
            e.column,
        )
    });
    Err(errors)
}

/// Resolve the bundle's `file:` imports (`imports.rs`): report the wrong
/// ones, and add the tools each agent imports to its `tools`, after the
/// ones it names (without repeats).
fn resolve_imports(
    bundle: &mut model::Bundle,
    files: &[SourceFile],
    tools_files: &[(&str, Vec<NameAt>, Vec<imports::FileImport>)],
    agent_imports: &[(&str, String, Vec<imports::FileImport>)],
    errors: &mut Vec<DefinitionError>,
) {
    if agent_imports.is_empty() && tools_files.iter().all(|(_, _, i)| i.is_empty()) {
        return;
    }
    let known = imports::ToolsFiles::new(
        tools_files
            .iter()
            .map(|(p, d, i)| (*p, d.as_slice(), i.as_slice())),
        files
            .iter()
            .map(|f| f.path.as_str())
            .filter(|p| !matches!(file_kind(p), Some(FileKind::Tools))),
    );
    let mut resolver = imports::Resolver::new(&known, errors);
    resolver.check_tools_files();
    for (file, agent, list) in agent_imports {
        let names = resolver.names(file, list);
        if let Some(a) = bundle
            .agents
            .iter_mut()
            .find(|a| a.name == *agent && a.source_file == *file)
        {
            for name in names {
                if !a.tools.contains(&name) {
                    a.tools.push(name);
                }
            }
        }
    }
}

/// The references of a bundle, with the file each is written in.
struct Refs<'r> {
    /// `workflow:` of workflow nodes, `workflow_id:` of workflow tools.
    workflows: &'r [(&'r str, NameAt)],
    /// `tool:` of tool nodes, `tools:` of agents.
    tools: &'r [(&'r str, NameAt)],
    /// `agent:` of agent nodes.
    agents: &'r [(&'r str, NameAt)],
}

impl Refs<'_> {
    /// Line and column of the reference to `name` that node `node` of
    /// `file` writes: the first one at or after the node's line (a node's
    /// keys follow its start), else the node's line.
    fn position(&self, file: &str, node: &model::NodeDef) -> (u32, u32) {
        let (list, name) = match &node.kind {
            model::NodeKind::Workflow { workflow, .. } => (self.workflows, workflow),
            model::NodeKind::Tool { tool, .. } => (self.tools, tool),
            model::NodeKind::Agent { agent, .. } => (self.agents, agent),
            _ => return (node.source_line, 1),
        };
        list.iter()
            .filter(|(f, r)| *f == file && r.name == *name && r.line >= node.source_line)
            .map(|(_, r)| (r.line, r.column))
            .min()
            .unwrap_or((node.source_line, 1))
    }
}

/// One way a workflow of a bundle starts another as a child run.
struct ChildStart<'b> {
    /// The workflow started.
    child: &'b str,
    /// The node that starts it.
    node: &'b model::NodeDef,
    /// How, in words: "node `kyc`", "node `check`, tool `run_kyc`",
    /// "node `intake`, agent `a`, tool `run_kyc`".
    how: String,
}

/// Every child start of every workflow of `bundle`: `workflow` nodes, tool
/// nodes whose tool is a `type: workflow` tool, and agent nodes whose agent
/// may call one. Only definitions of the bundle are known here.
fn child_starts(bundle: &model::Bundle) -> BTreeMap<&str, Vec<ChildStart<'_>>> {
    let tool_child = |tool: &str| {
        bundle
            .tools
            .iter()
            .find(|t| t.name == tool)
            .and_then(|t| match &t.binding {
                model::ToolBindingDef::Workflow { workflow, .. } => Some(workflow.as_str()),
                _ => None,
            })
    };
    let mut starts: BTreeMap<&str, Vec<ChildStart<'_>>> = BTreeMap::new();
    for w in &bundle.workflows {
        let list = starts.entry(w.name.as_str()).or_default();
        for node in &w.nodes {
            match &node.kind {
                model::NodeKind::Workflow { workflow, .. } => list.push(ChildStart {
                    child: workflow,
                    node,
                    how: format!("node `{}`", node.id),
                }),
                model::NodeKind::Tool { tool, .. } => {
                    if let Some(child) = tool_child(tool) {
                        list.push(ChildStart {
                            child,
                            node,
                            how: format!("node `{}`, tool `{tool}`", node.id),
                        });
                    }
                }
                model::NodeKind::Agent { agent, .. } => {
                    let tools = bundle
                        .agents
                        .iter()
                        .find(|a| a.name == *agent)
                        .map(|a| a.tools.as_slice())
                        .unwrap_or_default();
                    for tool in tools {
                        if let Some(child) = tool_child(tool) {
                            list.push(ChildStart {
                                child,
                                node,
                                how: format!("node `{}`, agent `{agent}`, tool `{tool}`", node.id),
                            });
                        }
                    }
                }
                _ => {}
            }
        }
    }
    starts
}

/// Refuse workflows that start themselves again through child runs,
/// directly or through other workflows of the bundle (each run would start
/// another, without end). One error per cycle, at the first workflow of the
/// bundle in it, on the node that starts the next one, naming every step.
///
/// Only the bundle's definitions are followed: a registered workflow's
/// references are not known here, so a cycle closed by registering a new
/// version of a workflow that another registered one starts is not seen;
/// the coordinator bounds those at run time (`MAX_CHILD_DEPTH`).
fn check_child_cycles(bundle: &model::Bundle, refs: &Refs<'_>, errors: &mut Vec<DefinitionError>) {
    use std::collections::VecDeque;
    let starts = child_starts(bundle);
    let mut reported: BTreeSet<&str> = BTreeSet::new();
    for w in &bundle.workflows {
        let root = w.name.as_str();
        if reported.contains(root) {
            continue;
        }
        // Breadth first, so the shortest way back is the one named. `came`:
        // each workflow reached, and the (workflow, start) it was reached by.
        let mut came: BTreeMap<&str, (&str, usize)> = BTreeMap::new();
        let mut queue = VecDeque::from([root]);
        let mut back: Option<(&str, usize)> = None;
        'search: while let Some(at) = queue.pop_front() {
            for (i, start) in starts.get(at).into_iter().flatten().enumerate() {
                if start.child == root {
                    back = Some((at, i));
                    break 'search;
                }
                if starts.contains_key(start.child) && !came.contains_key(start.child) {
                    came.insert(start.child, (at, i));
                    queue.push_back(start.child);
                }
            }
        }
        let Some(last) = back else {
            continue;
        };
        let mut hops = vec![last];
        let mut at = last.0;
        while at != root {
            match came.get(at) {
                Some(&previous) => {
                    hops.push(previous);
                    at = previous.0;
                }
                None => break,
            }
        }
        hops.reverse();
        let step = |&(from, i): &(&str, usize)| starts.get(from).and_then(|s| s.get(i));
        let mut chain = format!("`{root}`");
        for start in hops.iter().filter_map(step) {
            chain.push_str(&format!(" ({}) → `{}`", start.how, start.child));
        }
        let (line, column) = hops
            .first()
            .and_then(step)
            .map_or((w.source_line, 1), |start| {
                refs.position(&w.source_file, start.node)
            });
        errors.push(DefinitionError::new(
            &w.source_file,
            line,
            column,
            format!(
                "workflow `{root}` starts itself again through child runs: {chain}; a workflow may not run itself as a child, directly or through other workflows, since its runs would nest without end"
            ),
        ));
        reported.extend(hops.iter().map(|(from, _)| *from));
    }
}

/// Report every declaration of a name after its first; return all names.
fn check_unique<'a>(
    kind: &str,
    declared: &'a [(&'a str, NameAt)],
    errors: &mut Vec<DefinitionError>,
) -> BTreeSet<&'a str> {
    let mut first: BTreeMap<&str, (&str, u32)> = BTreeMap::new();
    for (file, n) in declared {
        if let Some((first_file, first_line)) = first.get(n.name.as_str()) {
            errors.push(DefinitionError::new(
                file,
                n.line,
                n.column,
                format!(
                    "{kind} `{}` is already declared at {first_file}:{first_line}",
                    n.name
                ),
            ));
        } else {
            first.insert(&n.name, (file, n.line));
        }
    }
    first.into_keys().collect()
}

/// Validate `value` against a JSON Schema; Err lists each violation as
/// "<json pointer>: <message>".
///
/// The root is shown as `/`. Formats such as `date` are asserted, remote
/// `$ref`s are refused, and each message is capped in length (they quote the
/// offending value). An invalid schema gives one error, `invalid schema: ...`.
pub fn validate_json(
    schema: &serde_json::Value,
    value: &serde_json::Value,
) -> Result<(), Vec<String>> {
    schema::validate_json(schema, value)
}

/// `Some(message)` when `name` is not a valid `kind` name:
/// `^[a-z][a-z0-9_]*$`, at most [`MAX_NAME_LEN`] characters.
fn check_name(kind: &str, name: &str) -> Option<String> {
    let mut chars = name.chars();
    let valid = chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if name.is_empty() {
        Some(format!("{kind} name must not be empty"))
    } else if !valid {
        Some(format!(
            "{kind} name `{name}` must be lower case letters, digits and `_`, starting with a letter"
        ))
    } else if name.len() > MAX_NAME_LEN {
        Some(format!(
            "{kind} name `{name}` is longer than {MAX_NAME_LEN} characters"
        ))
    } else {
        None
    }
}

/// `Some(message)` when `value` is not a usable permission or grant: it is
/// compared verbatim at every call, so invisible differences (spaces,
/// control characters) would make a grant silently never match.
fn check_permission(kind: &str, value: &str) -> Option<String> {
    if value.is_empty() {
        Some(format!("{kind} must not be empty"))
    } else if value.chars().any(|c| c.is_whitespace() || c.is_control()) {
        Some(format!("{kind} `{value}` must not contain whitespace"))
    } else if value.chars().count() > MAX_PERMISSION_LEN {
        Some(format!(
            "{kind} is longer than {MAX_PERMISSION_LEN} characters"
        ))
    } else {
        None
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
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
            vec![
                "t/b.tools.abl:2:9: import cycle: t/a.tools.abl -> t/b.tools.abl -> t/a.tools.abl"
            ]
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
            &agent_with_tools(
                "  - file: b.tools.abl\n    tools: []\n    only: [x]\n  - tools: [x]\n",
            ),
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
                "z.yaml:6:1: unknown key `extra` in an agent (expected one of: kind, name, model, instructions, tools, grants, loop, budget, limits, max_output_tokens, pricing, max_identical_calls, on_tool_failure, output_schema, pii_redaction)",
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
        let bundle =
            parse_bundle(&[file("t.tools.abl", tools)], &RegisteredNames::default()).unwrap();
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
            Some("agent name `1a` must be lower case letters, digits and `_`, starting with a letter".into())
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
            rendered(
                parse_bundle(&[file("a.yaml", direct)], &RegisteredNames::default()).unwrap_err()
            ),
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
            let errors = parse_bundle(&[file("t.tools.abl", tools)], &registered(value))
                .expect_err("refused");
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
        let errors = parse_bundle(&[file("t.tools.abl", &other)], &registered(Some("5")))
            .expect_err("refused");
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
}
