//! Definitions: parse and validate a bundle of `.tools.abl` files (tools) and
//! YAML files (agents and workflows) into a [`model::Bundle`], reporting every
//! error of every file with its line and column.
//!
//! Architecture invariant: pure code. No I/O, no clock, no async: callers
//! hand in file contents and get values or errors back, so registration can
//! refuse a bundle before anything is stored ("never half-registered").
//!
//! # In detail (moved from ARCHITECTURE.md)
//!
//! parses `.tools.abl` (`abl.rs`, `signature.rs`; the
//! `TYPES:` section of named types in `abl/types.rs`, substituted into the
//! file's signatures by `signature::expand_named`) and YAML
//! agents/workflows (`yaml.rs`: node types agent, tool, wait, approval,
//! branch, set, fail, succeed; durations with humantime), builds JSON Schema
//! (`schema.rs`; `strict.rs`: a `strict: true` tool's model schema rewritten
//! into the subset both providers constrain generation to, or a
//! `StrictSchemaError` naming the tool and the JSON pointer, and
//! `strip_optional_nulls`, which the machine applies before check 2),
//! validates cross references; every error carries file, line
//! and column. Tool bindings: `http`, `async_webhook`, `workflow` and `mcp`
//! (`server:`, `server_tool:`, `headers:` whose values may hold only
//! `{{config.NAME}}`, `timeout:`). HTTP tools also take `auth:` +
//! `auth_config:` (credentials must be `{{config.NAME}}`, so no definition
//! holds one), `query_params:`, `body_type:` (`json`, `form`, `xml`, `text`;
//! `xml_root:`), `body_mode:`, `body_template:` (placeholders must name
//! parameters, or `{{_secret.KEY}}`), `body_schema:` with `use_body_schema:` (compiled when
//! parsed), `tls_profile:` (a name only), `request_variants:`
//! (`abl/http_variants.rs`: each variant's overrides merged over the tool's
//! request and checked as a tool's; `when:` parsed as jq, a bare parameter
//! name refused with the `.name` form as a hint); the lines above a file's first tool
//! are its defaults (`base_url`, `auth`, `timeout`, `headers`, `retry`,
//! `retry_delay`, `rate_limit`), folded into each HTTP tool when parsed.
//! `abl/pii.rs` reads a tool's `pii_access:` (`user`, `tools`, `original`,
//! `llm`, or a list; `logs` refused) into `ToolDef.pii_access`, and an
//! agent's `pii_redaction:` (`true`, `false` or a list of `PiiKind`s) is
//! read in `yaml.rs`; what they do is `belay-machine`'s `pii.rs`.
//! `abl/visibility.rs` reads a parameter's `visibility: {model, trace}`
//! (`model: false` is `hidden: true`; `trace: false` into
//! `ToolDef.untraced`, only for `string` parameters the model supplies on
//! `type: http` tools without `confirmation:`, `process:`,
//! `request_variants:` or `hints.cacheable`).
//! `abl/secrets.rs` reads a producer's `RESULT_SECRETS:` (`<result_path> ->
//! <vault_key> (consumers, ttl, single_use)`; the path must be a `string`
//! field of the return type; `http` and `mcp` tools only) and a consumer's
//! `SECRET_ACCESS: READ`, into `ToolDef.result_secrets` / `secret_access`,
//! and checks every `{{_secret.KEY}}` (a tool's own `headers:` and
//! `body_template:` only, for a key its `READ` lists; refused with its
//! position anywhere else); `mod.rs` checks `consumers:` against the
//! bundle (a tool that reads the key, or a registered one). `abl/sampling.rs` reads a `type: mcp` tool's `sampling:` (a Belay
//! extension: `max_requests`, `max_tokens`) into `ToolDef.sampling`
//! (left out when absent, so other tools' stored definitions and hashes are
//! unchanged), refused on other tools and on `resource:` reads.
//! `abl/process.rs`
//! checks a tool's `process:` block (jq over `{"args"}` / `{"result", "args"}`,
//! `on_fail`; `use` refused). `abl/retry.rs`
//! reads `retry:`, `retry_delay:` and `retry_policy:` (tools a worker calls:
//! `http`, `async_webhook`, `mcp`; one form per tool) and resolves them, with
//! every default applied, into the stored `ToolDef.retry_policy`
//! (`model.rs`: `RetryPolicy`, `base_delay_ms`), which a run pins in its plan. Tools a worker calls also take
//! `rate_limit:` (calls per second) and `circuit_breaker:` (`threshold`,
//! `resetMs`), kept on the `ToolDef` (and so pinned in the run's plan); see
//! `gates.rs`. A tool's `parameters:` block also takes
//! `required:`, `default:` and a source (`source:` `system` | `runtime` |
//! `config` | `auth` | `expr` | `lookup` with `value:` / `key:` + `table:`,
//! a bare `value:`, or `hidden: true`; `finish_source`): such parameters are
//! `ToolDef.injected` and are left out of `model_input_schema`, the schema
//! the model is given (`ToolDef::model_schema`). `hints:` (`ToolHints`) and
//! `effect:` are stored; `hints.timeout` is the timeout when `timeout:` is
//! absent; `abl/mcp_resource.rs` reads a `type: mcp` tool's `resource:` (a URI
//! or RFC 6570 level-1 template over the tool's required primitive
//! parameters) into `ToolBindingDef::McpResource` (wire
//! `ToolBinding::McpResource`; `idempotent` unless declared); `abl/cache.rs` reads `hints.cache_ttl` (a Belay extension) and
//! refuses `hints.cacheable: true` on a tool that may act (a side-effecting
//! `effect:` or `hints.side_effects`, `repeat_safety` other than
//! `idempotent`, `type: workflow`), with `scrub_secrets: false`, or with a
//! parameter unique to each call (`ToolDef::cache_ttl_ms` checks the same
//! again at run time); `confirmation.require: when_side_effects` becomes a
//! `ConfirmationDef` only for a tool that `has_side_effects` (undeclared
//! counts as yes, except for a `type: sandbox` tool), so the machine sees
//! `always` or nothing. `abl/sandbox.rs` reads `type: sandbox` tools
//! (`runtime:`, `code:`, `memory_mb:`, the sandbox `timeout:`; repeat
//! safety `idempotent` by default, `reconcile` and request properties
//! refused, parameter names that are reserved words of the runtime's
//! language refused) into the wire `SandboxBinding`; `abl/block_scalar.rs`
//! reads a `key: |` block's raw lines when the file is split into lines
//! (before the line tree, so `#` and blank lines are text), and only
//! `code:` accepts one. A literal `until:` must be an RFC 3339 time. A loop of nodes
//! that neither waits nor does work (only `branch`, `set`, `async`
//! `workflow` nodes and fixed-time waits) is refused, since a run in it
//! would go round inside one transition; a loop with a `wait` on a duration
//! or a signal, an approval, an agent, a tool or a sync child is a loop the
//! run takes one step at a time (polling), and is allowed. A workflow that
//! starts itself again through child runs (`workflow` nodes, `type:
//! workflow` tools of tool nodes or of an agent's tools), directly or
//! through other workflows of the bundle, is refused with the cycle named
//! (`mod.rs`, `check_child_cycles`); registered workflows carry no
//! references here, so a cycle closed by a new version of a registered
//! workflow is bounded at run time instead (`MAX_CHILD_DEPTH`, coordinator).
//! `imports.rs`: `file:` imports (a tools file's `file: "path" [a, b]`
//! line, an agent's `- file:` entry of `tools:`): paths are resolved
//! relative to the importing file against the bundle's own paths (no file
//! system; `..` above the importing file and absolute paths refused), tools
//! files' imports are followed transitively with a cycle check, and each
//! agent's imported tool names are appended to its `tools` (`mod.rs`,
//! `resolve_imports`); an import declares no tool. `prop_tests.rs`
//! (tests only): proptest round trips of generated signatures and
//! `.tools.abl` files, and of the JSON Schema built from them, with a
//! fixed seed.
//! `expr.rs`: jq expressions (`Expr`) and `${ }` templates
//! (`Template`) over the run's state document, evaluated with jaq. Functions
//! that read the clock, environment, time zone or input, log, or halt are
//! refused when parsed, and every output must be JSON. Compiled filters are
//! shared through a process-wide cache keyed by source text.
//! Bounded evaluation (jaq has no fuel or interruption hook; `expr.rs`'s
//! module doc has the whole rule): `expr/guard.rs` refuses when parsed what
//! can run for ever (recursive `def`s, `repeat`, `while`, `until`,
//! `recurse(f)`, `combinations`, literal `range`s past 100 000 values or
//! with step 0, a string repeated by a computed count); evaluation counts
//! `range`'s values (100 000 per evaluation) and the value's size (1 MiB of
//! JSON, counted while converting, so a shared structure stops early);
//! evaluation and compilation run on a thread with a 256 MiB stack (jaq
//! drops nested values and parses nested text recursively: a 2 MiB stack
//! aborts the process at ~10 000 levels of a value, ~200 brackets of text
//! in a debug build), and an expression is at most 16 KiB of text. This
//! makes every evaluation end; it does not bound its cost (a value that
//! squares at each step of a bounded loop, `reduce range(40) as $i (2; .
//! * .)`, exhausts memory; `def f(g): g | g; f(f(…))` runs for years), since
//! no hook exists to count it: the cost is bounded by `expr_sandbox.rs`
//! (below), behind a hook (`expr::set_remote`) through which
//! `Expr::eval` / `Template::render` send compiled expressions to an
//! evaluator process. `model.rs` holds the stored definition types.
//! **Invariant:** pure, no I/O, except the evaluation hook described in
//! `expr_sandbox.rs` (this directory names no process, pipe or clock).

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
    let mut config_timeouts: Vec<(&str, abl::ConfigTimeout)> = Vec::new();
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
mod tests;
