//! Parsed, validated definitions: the values stored in the `definitions` table
//! (as canonical JSON) and pinned into a run when it starts.
//!
//! Persisted shapes: fields are only added (with `#[serde(default)]`), never renamed.

use std::collections::BTreeMap;

use belay_proto::wire::{HttpRequestOptions, SandboxBinding};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::expr::{Expr, Template};

/// Whether a tool call may be repeated when its outcome is unknown
/// (DESIGN.md, "The tool call, exactly").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RepeatSafety {
    /// Never repeated once dispatched: a lost outcome fails the step.
    Never,
    /// Repeated with the same idempotency key.
    Idempotent,
    /// Never repeated blindly: a lost outcome becomes an uncertain outcome.
    Reconcile,
}

impl RepeatSafety {
    /// The `.tools.abl` / database spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            RepeatSafety::Never => "never",
            RepeatSafety::Idempotent => "idempotent",
            RepeatSafety::Reconcile => "reconcile",
        }
    }
}

/// How a tool is executed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToolBindingDef {
    /// `type: http`.
    Http {
        /// `endpoint:`, absolute URL or path; `{param}` segments are path parameters.
        endpoint: String,
        /// `method:`, upper case; default `POST`.
        method: String,
        /// `headers:` (the file's default headers merged in, the tool's
        /// winning); values may hold `{{config.NAME}}`.
        #[serde(default)]
        headers: BTreeMap<String, String>,
        /// `timeout:` in ms; default the file's, else 30000.
        timeout_ms: u64,
        /// `auth:`/`auth_config:` (or the file's), `query_params:`,
        /// `body_type:`, `body_mode:`, `body_template:`; the wire type
        /// itself, copied into the task spec. Added after the SSRF release.
        #[serde(flatten)]
        request: HttpRequestOptions,
    },
    /// `type: workflow`: a call starts a child run of `workflow` (no worker
    /// involved); `sync` waits for it and its output is the result, `async`
    /// returns `{"run_id"}` at once. Added after v0.1.
    Workflow {
        /// `workflow_id:`, a workflow of the same tenant (its newest version
        /// when the child starts).
        workflow: String,
        /// `mode:`; default `sync`.
        #[serde(default)]
        mode: ChildMode,
        /// `timeout_ms:`: a sync call fails (and the child is cancelled) after this.
        #[serde(default)]
        timeout_ms: Option<u64>,
        /// `param_mapping:` workflow input key → tool parameter; empty: the
        /// arguments are the child's input as they are.
        #[serde(default)]
        param_mapping: BTreeMap<String, String>,
    },
    /// `type: async_webhook` (fire and call back): a worker sends the request
    /// with a single-use callback URL injected at `callback_url_field`; a 2xx
    /// answer only means "accepted", and the call stays open until the tool
    /// server POSTs the result to that URL or `callback_timeout_ms` passes.
    /// Added after v0.1.
    AsyncWebhook {
        /// `endpoint:`, absolute URL or path; `{param}` segments are path parameters.
        endpoint: String,
        /// `method:`: `POST`, `PUT` or `PATCH`.
        method: String,
        /// `headers:`.
        #[serde(default)]
        headers: BTreeMap<String, String>,
        /// `timeout:` of the initial request in ms; default 30000.
        timeout_ms: u64,
        /// `callback_url_field:`: dot-path in the JSON body where the callback
        /// URL goes (`callbackUrl`, `meta.reply_to`); default `callbackUrl`.
        callback_url_field: String,
        /// `timeout_seconds:` in ms: how long the call waits for its callback
        /// after the request was accepted; default 3 600 000 (one hour).
        callback_timeout_ms: u64,
        /// As for `type: http` (the body is JSON). Added after the SSRF release.
        #[serde(flatten)]
        request: HttpRequestOptions,
    },
    /// `type: mcp`: a tool of an MCP server, called by a worker's MCP client.
    /// The server is a logical name the worker's configuration resolves;
    /// the tool's signature here is what the model sees and what arguments
    /// are validated against (the server's own description never reaches
    /// the model). Added after v0.1.
    Mcp {
        /// `server:`, the server's logical name.
        server: String,
        /// `server_tool:`, the tool's name on the server; the tool's own
        /// name when not given.
        server_tool: String,
        /// `headers:`, per-call HTTP headers (Streamable HTTP servers only);
        /// values may hold `{{config.X}}`, resolved by the worker.
        #[serde(default)]
        headers: BTreeMap<String, String>,
        /// `timeout:` of the whole call in ms; default 30000.
        timeout_ms: u64,
    },
    /// `type: mcp` with `resource:`: a call reads one resource of an MCP
    /// server (`resources/read`) and its contents are the result, recorded
    /// like any tool result. Added for issue 4.
    McpResource {
        /// `server:`, the server's logical name.
        server: String,
        /// `resource:`, a URI or a URI template whose `{name}` expressions
        /// are parameters of the tool.
        uri_template: String,
        /// `timeout:` of the whole read in ms; default 30000.
        timeout_ms: u64,
    },
    /// `type: sandbox`: inline JavaScript or Python code a worker runs in
    /// an isolated sandbox (no network, no filesystem beyond a fresh
    /// working directory, memory and time limits). A pure computation: its
    /// repeat safety defaults to `idempotent` and, without `effect:` or
    /// `hints.side_effects`, it has no side effects. The wire type itself,
    /// copied into the task spec. Added for issue 4.
    Sandbox(SandboxBinding),
}

/// `confirmation:` of a tool with `require: always`, or with `require:
/// when_side_effects` and side effects ([`ToolDef::has_side_effects`]) (the
/// seed's "Tool features: Confirmation"): every call waits for a person's
/// decision before it is dispatched. Added after v0.1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConfirmationDef {
    /// Written as `require: when_side_effects` (rather than `always`).
    /// Added for issue 4.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub when_side_effects: bool,
    /// `immutable_params:`: arguments an approver may not edit (the others
    /// may be edited; the call then runs with the edited arguments).
    #[serde(default)]
    pub immutable_params: Vec<String>,
    /// `approver_grant:` (a Belay extension): the permission an approver
    /// needs; default the tool's own `permission:`.
    pub approver_grant: String,
}

/// `strategy:` of a [`RetryPolicy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackoffStrategy {
    /// The same delay before every retry: `initial_delay_ms`.
    Fixed,
    /// `initial_delay_ms · multiplier^(n-1)` before retry `n`, at most
    /// `max_delay_ms`.
    Exponential,
}

/// `jitter:` of a [`RetryPolicy`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Jitter {
    /// The computed delay, exactly.
    #[default]
    None,
    /// "Full jitter": a delay drawn uniformly from `[0, computed delay]`.
    /// The draw is a hash of (run id, call id, attempt), so deciding the
    /// same failure again draws the same delay; the delay used is recorded
    /// in the failure event (`retry_delay_ms`).
    Full,
}

/// Largest retry count a tool may declare (`retry:`, `max_retries:`).
pub const MAX_DECLARED_RETRIES: u32 = 100;

/// Largest delay a tool may declare, ms (one day): `retry_delay:`,
/// `initial_delay_ms:`, `max_delay_ms:`.
pub const MAX_DECLARED_DELAY_MS: u64 = 86_400_000;

/// First delay of the engine's own backoff, ms: what `retry:` alone and a
/// `retry_policy:` without `initial_delay_ms:` start from.
pub const ENGINE_INITIAL_DELAY_MS: u64 = 500;

/// Ceiling of the engine's own backoff, ms: an exponential policy's
/// `max_delay_ms` when it gives none (or its `initial_delay_ms`, if larger).
pub const ENGINE_MAX_DELAY_MS: u64 = 30_000;

/// A tool's retry policy (the seed's "Retry policy", or its scalar
/// `retry:`/`retry_delay:`, or a file's defaults of those), resolved when
/// the file is parsed so the machine reads no defaults: it sets *when* the
/// retries of a call happen and *how many* there are. Whether a failed
/// attempt may be retried at all is still the tool's repeat safety and the
/// failure's class (DESIGN.md, "The tool call, exactly").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetryPolicy {
    /// `strategy:` (`retry_delay:` alone: `fixed`; `retry:` alone: `exponential`).
    pub strategy: BackoffStrategy,
    /// `initial_delay_ms:` (or `retry_delay:`): the delay before the first
    /// retry, ms; default 500.
    pub initial_delay_ms: u64,
    /// `multiplier:` of an exponential policy; default 2 (1 for `fixed`).
    pub multiplier: f64,
    /// `max_delay_ms:`: no delay is longer; default for `exponential` 30000
    /// (or `initial_delay_ms` when larger), for `fixed` `initial_delay_ms`.
    pub max_delay_ms: u64,
    /// `max_retries:` (or `retry:`): a call makes at most `1 + max_retries`
    /// attempts that reached the tool. `None`: the agent's
    /// `limits.max_tool_attempts` (a tool node's: 5 attempts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_retries: Option<u32>,
    /// `jitter:`; default `none`.
    #[serde(default)]
    pub jitter: Jitter,
}

impl RetryPolicy {
    /// The delay before retry `n` (1-based: the retry after the `n`th
    /// failed attempt that counts), ms, before jitter: `fixed`:
    /// `initial_delay_ms`; `exponential`: `initial_delay_ms ·
    /// multiplier^(n-1)`, at most `max_delay_ms`.
    pub fn base_delay_ms(&self, n: u32) -> u64 {
        let initial = self.initial_delay_ms.min(MAX_DECLARED_DELAY_MS);
        match self.strategy {
            BackoffStrategy::Fixed => initial,
            BackoffStrategy::Exponential => {
                let cap = self.max_delay_ms.clamp(initial, MAX_DECLARED_DELAY_MS);
                let mut delay = initial as f64;
                for _ in 1..n.max(1) {
                    delay *= self.multiplier;
                    if delay.is_nan() || delay >= cap as f64 {
                        return cap;
                    }
                }
                (delay as u64).min(cap)
            }
        }
    }
}

/// `circuit_breaker:` of a tool (the seed's "Circuit breaker"). Added after v0.1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CircuitBreakerDef {
    /// `threshold:`: consecutive failures that open the circuit.
    pub threshold: u32,
    /// `resetMs:`: how long an open circuit fails calls before one probe
    /// call is let through, ms.
    pub reset_ms: u64,
}

/// Where a parameter that the model does not supply gets its value (the
/// seed's "Parameter enrichment and sources": `source:` with `value:`, or
/// `key:` and `table:`). The machine fills every source but `config` when
/// the call is proposed, so the arguments recorded in `tool_call_scheduled`
/// are exactly what the tool receives; `config` is filled by the worker.
/// Added for issue 4.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ParamSource {
    /// `source: system`: `value:` is a jq expression over the run's state
    /// document (`{input, nodes, vars, run: {id, tenant}}`).
    System {
        /// The expression.
        expr: Expr,
    },
    /// `source: runtime`: `value:` names a fact of the call.
    Runtime {
        /// Which fact.
        field: RuntimeField,
    },
    /// `source: auth`: `value:` names a fact of who started the run.
    Auth {
        /// Which fact.
        field: AuthField,
    },
    /// `source: config`: `value:` is a name of the worker's tool
    /// configuration (`BELAY_TOOL_CONFIG_<NAME>`). The arguments hold the
    /// placeholder `{{config.NAME}}`; the worker puts the value in right
    /// before the request, so no event or spec ever holds it. The parameter
    /// must be a `string`.
    Config {
        /// The configuration name (`[A-Za-z0-9_]+`).
        name: String,
    },
    /// `source: expr`: `value:` is a jq expression over the run's state
    /// document with the model's arguments (defaults filled in) at `.args`.
    Expr {
        /// The expression.
        expr: Expr,
    },
    /// `source: lookup`: `key:` (a jq expression over the same document as
    /// `expr`) gives a key, looked up in `table:`; a key the table lacks
    /// gives the parameter's `default`, else the call is refused.
    Lookup {
        /// The key expression; its value must be a string, number or boolean
        /// (numbers and booleans are looked up by their JSON text).
        key: Expr,
        /// Key → value, as written under `table:`.
        table: BTreeMap<String, Value>,
    },
    /// `value:` without `source:` (or a hidden `source: model` parameter
    /// with a default): a constant.
    Literal {
        /// The value, checked against the parameter's type.
        value: Value,
    },
}

/// `source: runtime` values. Added for issue 4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuntimeField {
    /// The run's id.
    RunId,
    /// The id of the node the call belongs to.
    NodeId,
    /// The call's id (`<node>~<visit>.t<n>`), unique within the run.
    CallId,
    /// The call's idempotency key (`<run_id>/<call_id>`).
    IdempotencyKey,
    /// The run's tenant.
    Tenant,
    /// The time the call was proposed, by the engine's clock, as RFC 3339
    /// UTC with milliseconds (`2026-12-02T10:15:30.123Z`): the time of the
    /// transition that proposed it, which the store reads under the run's
    /// lock. The machine reads no clock; the value is recorded in the
    /// call's arguments, so replay never needs it again. Added for issue 4.
    Time,
    /// The UTC date of [`RuntimeField::Time`] (`2026-12-02`). Added for
    /// issue 4.
    Date,
    /// [`RuntimeField::Time`] in milliseconds since the Unix epoch. Added
    /// for issue 4.
    UnixMs,
}

impl RuntimeField {
    /// Whether the value is the time of the call's proposal.
    pub fn is_time(self) -> bool {
        matches!(
            self,
            RuntimeField::Time | RuntimeField::Date | RuntimeField::UnixMs
        )
    }
}

/// `source: auth` values. Added for issue 4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuthField {
    /// The identity of the caller that started the run (`StartRun`'s caller).
    Caller,
    /// The run's tenant.
    Tenant,
}

/// A parameter of a tool that the model never supplies and never sees:
/// one with a `source:` other than `model`, or `hidden: true`. Left out of
/// the schema the model is given; a call whose arguments name it is
/// refused. Added for issue 4.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InjectedParam {
    /// The parameter's name.
    pub name: String,
    /// Where its value comes from.
    pub source: ParamSource,
    /// Used when the source gives `null` (or a lookup misses).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<Value>,
    /// Whether the call is refused when no value comes (else the
    /// parameter is left out of the arguments).
    #[serde(default)]
    pub required: bool,
}

/// `effect:` (the seed's "State authority and provided fields"): the tool's
/// authority over state outside the run. Added for issue 4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// Reads only.
    ReadOnly,
    /// Writes state (the seed's session state; for Belay any state).
    StateWrite,
    /// Acts on the outside world (payments, messages, deletions).
    SideEffect,
}

/// `hints.latency`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Latency {
    /// `fast`.
    Fast,
    /// `medium`.
    Medium,
    /// `slow`.
    Slow,
}

/// The `hints:` block (the seed's "Hints"), as written. Stored so that
/// readers of the definition and the audit see it; what each one changes is
/// in `docs/tools.md`: `timeout` sets the tool's timeout when `timeout:` is
/// absent, `side_effects` feeds `confirmation.require: when_side_effects`,
/// `cacheable: true` (with `cache_ttl`) turns on the tenant's durable
/// result cache for the tool (`belay_machine::cache`), `latency` and
/// `requires_auth` are advisory. Added for issue 4.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolHints {
    /// `cacheable:`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cacheable: Option<bool>,
    /// `latency:`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<Latency>,
    /// `side_effects:`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub side_effects: Option<bool>,
    /// `requires_auth:`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requires_auth: Option<bool>,
    /// `timeout:` in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// `cache_ttl:` (a Belay extension, only with `cacheable: true`): how
    /// long a cached result is served, ms. `None` in a registered
    /// definition: the engine's `--tool-cache-ttl-ms`, which the
    /// coordinator pins here when a run starts (0: the tool's results are
    /// not cached). Added for issue 4 (result cache).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_ttl_ms: Option<u64>,
}

/// Longest `hints.cache_ttl:` a tool may declare, ms (7 days): a cached
/// result older than that is not "the same call's result" in any sense a
/// reader of the run would accept.
pub const MAX_CACHE_TTL_MS: u64 = 7 * 86_400_000;

impl ToolHints {
    /// Whether no hint is given.
    pub fn is_empty(&self) -> bool {
        *self == ToolHints::default()
    }
}

/// One `request_variants:` item of a `type: http` tool: when it applies,
/// and the request it sends, the variant's `endpoint:`, `method:`,
/// `headers:`, `query_params:`, `body_type:`, `body_mode:` and
/// `body_template:` merged over the tool's (headers by name, in any case,
/// the variant's winning; every other key replaced whole). The tool's
/// `timeout:`, `auth:`, `body_schema:` and `tls_profile:` are kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestVariantDef {
    /// `name:`, unique in the tool; recorded in the call's events and spec.
    pub name: String,
    /// `when:`: a jq expression over the call's arguments (`.region ==
    /// "EU"`) that must give `true` or `false`; `None` for the default
    /// variant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<Expr>,
    /// `default: true`: used when no other variant's `when` is true (at
    /// most one per tool).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub default: bool,
    /// Endpoint of the request (the file's `base_url` joined).
    pub endpoint: String,
    /// Method, upper case.
    pub method: String,
    /// Headers (the tool's merged with the variant's).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Auth, query parameters and body, as the tool's binding has them.
    #[serde(flatten)]
    pub request: HttpRequestOptions,
}

/// A tool declared in a `.tools.abl` file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDef {
    /// snake_case name from the signature.
    pub name: String,
    /// `description:`.
    pub description: String,
    /// JSON Schema (draft 2020-12) of the arguments object built from the
    /// signature and `parameters:` block: `type: object`, `properties`,
    /// `required`, `additionalProperties: false`, defaults as `default`.
    pub input_schema: Value,
    /// JSON Schema of the return type.
    pub output_schema: Value,
    /// `permission:`: the one permission a call needs (granted to node,
    /// caller and tenant).
    pub permission: String,
    /// `repeat_safety:`.
    pub repeat_safety: RepeatSafety,
    /// A `type: mcp` tool declared without `repeat_safety:`: its repeat
    /// safety comes from the server's hints when a run starts (the worker's
    /// `suggested_repeat_safety`: `idempotent` only for a server the
    /// worker's configuration trusts whose tool says `readOnlyHint` or
    /// `idempotentHint`), else `never`, which `repeat_safety` holds until
    /// then. Added after v0.1.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub repeat_safety_from_server: bool,
    /// `reconcile_with:`: an idempotent, read-only tool that looks this
    /// tool's effect up by idempotency key (it takes an `idempotency_key`
    /// string argument). Only on `reconcile` tools. Added after v0.1.
    #[serde(default)]
    pub reconcile_with: Option<String>,
    /// `pool:`: the worker pool its calls go to (only workers started with
    /// `--pool <name>` claim them; `belay_proto::pools`). `None`: any
    /// worker. Added for worker pools (issue 21).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// `type:` and its binding properties.
    pub binding: ToolBindingDef,
    /// `scrub_secrets:` (default `true`): secrets in the tool's results
    /// (API keys, bearer tokens, private keys, passwords) are replaced by
    /// `[REDACTED:<kind>]` before the result is recorded or shown to the
    /// model (`machine/scrub.rs`). Added after v0.1.
    #[serde(default = "yes", skip_serializing_if = "Clone::clone")]
    pub scrub_secrets: bool,
    /// `pii_access:`: the personal data this tool may receive from, and
    /// send back to, an agent that redacts PII (`AgentDef::pii_redaction`;
    /// `machine/pii.rs`). Default: none. Added after v0.1.
    #[serde(default, skip_serializing_if = "PiiAccess::is_none")]
    pub pii_access: PiiAccess,
    /// `confirmation:` with `require: always`; `None` for `never` or none.
    #[serde(default)]
    pub confirmation: Option<ConfirmationDef>,
    /// `retry_policy:`, or `retry:`/`retry_delay:` (the tool's, else the
    /// file's defaults); `None`: the engine's backoff (0.5 s doubling, at
    /// most 30 s) and the agent's `limits.max_tool_attempts`. Only on tools
    /// a worker calls (`http`, `async_webhook`, `mcp`). Added after v0.1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_policy: Option<RetryPolicy>,
    /// `rate_limit:` (or the file's default): most calls per second, over
    /// every run and worker of the tenant (`belay_machine::gates`). Added after v0.1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<f64>,
    /// `circuit_breaker:`: after `threshold` consecutive failures, calls
    /// fail without being sent until `reset_ms` has passed
    /// (`belay_machine::gates`). Added after v0.1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circuit_breaker: Option<CircuitBreakerDef>,
    /// Parameters the model never supplies (non-`model` `source:`, or
    /// `hidden: true`), in declaration order; filled when a call is
    /// proposed. Added for issue 4.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub injected: Vec<InjectedParam>,
    /// The schema the model is given (`input_schema` without the injected
    /// parameters); `None` when they are the same. Added for issue 4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_input_schema: Option<Value>,
    /// `hints:`. Added for issue 4.
    #[serde(default, skip_serializing_if = "ToolHints::is_empty")]
    pub hints: ToolHints,
    /// `effect:`. Added for issue 4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<Effect>,
    /// `compaction:`: what of a result the model is shown. Added for
    /// issue 4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<CompactionDef>,
    /// `on_result: {set: {var: expr}}`: after a call completes, each jq
    /// expression is evaluated over `{"result": <the result>}` and its value
    /// written to the run's `.vars.<var>`. Added for issue 4.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub on_result: BTreeMap<String, Expr>,
    /// `on_error: {set: {var: expr}}`: after a call fails for good, each jq
    /// expression is evaluated over `{"error": {"message": <why>}}` and its
    /// value written to `.vars.<var>`. Added for issue 4.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub on_error: BTreeMap<String, Expr>,
    /// `RESULT_SECRETS:` (a producer): result fields that go into the
    /// run's secret vault instead of the result (the result, every event
    /// and the model see `[VAULTED:<key>]`). Only on `http` and `mcp`
    /// tools. Added for issue 4.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub result_secrets: Vec<ResultSecretDef>,
    /// `SECRET_ACCESS: READ: [keys]` (a consumer): the vault keys a call
    /// may read; `{{_secret.KEY}}` of these fill its headers and body
    /// template. Added for issue 4.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secret_access: Vec<String>,
    /// `process:`: the pure `before` (arguments) and `after` (result)
    /// transforms around a call. Added for issue 4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessDef>,
    /// `request_variants:` of a `type: http` tool, in file order: each
    /// holds the whole request it sends (its overrides merged over the
    /// tool's). When a call is scheduled the engine picks one
    /// (`belay_machine::variants`), records its name in the
    /// `tool_call_scheduled` event and puts its request into the task
    /// spec. Added for issue 4.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub request_variants: Vec<RequestVariantDef>,
    /// `strict: true`: the schema the model is given in strict mode (the
    /// model schema rewritten by `definitions::strict::to_strict`: every
    /// object closed, every property required, optional ones nullable),
    /// sent with the provider's `strict` flag; a `null` the model sends for
    /// an optional parameter is removed before check 2. `None`: not strict.
    /// Added for issue 4 (strict mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict_schema: Option<Value>,
    /// Parameters with `visibility: {trace: false}`, in declaration order:
    /// `string` parameters the model supplies whose values the coordinator
    /// takes out of the model's answer into the run's vault (every record
    /// of the call holds a `{{_secret.KEY}}` placeholder) and the worker
    /// gets back at dispatch. Only on `type: http` tools. Added for issue 4
    /// (visibility).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub untraced: Vec<String>,
    /// `sampling:` of a `type: mcp` tool (a Belay extension): the server
    /// may ask the calling agent's model for completions during a call
    /// (`sampling/createMessage`), within these bounds and the budgets.
    /// `None`: every such request is refused. Added for MCP sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling: Option<SamplingDef>,
    /// File the tool was declared in (bundle-relative path).
    pub source_file: String,
    /// 1-based line of the signature.
    pub source_line: u32,
}

/// `sampling:` of a `type: mcp` tool: how many completions one call may
/// ask of the calling agent's model, and how long each may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SamplingDef {
    /// `max_requests`: completions per call (per attempt), 1 to
    /// [`SamplingDef::MAX_REQUESTS`]; default 1.
    pub max_requests: u32,
    /// `max_tokens`: output tokens per completion, 1 to
    /// [`SamplingDef::MAX_TOKENS`]; default [`SamplingDef::DEFAULT_TOKENS`].
    /// The engine lowers it to what is left of the budgets.
    pub max_tokens: u32,
}

impl SamplingDef {
    /// Most `max_requests` a tool may declare.
    pub const MAX_REQUESTS: u32 = 16;
    /// Most `max_tokens` a tool may declare.
    pub const MAX_TOKENS: u32 = 65_536;
    /// `max_tokens` when the tool does not say.
    pub const DEFAULT_TOKENS: u32 = 1024;
}

/// One `RESULT_SECRETS:` entry: `<path> -> <key> (consumers: [a, b],
/// ttl: 300, single_use: true)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResultSecretDef {
    /// Dotted path of the result field (declared `string` in the return
    /// type).
    pub path: String,
    /// The vault key it is kept under.
    pub key: String,
    /// `consumers:`: the tools that may read it; empty: any tool whose
    /// `SECRET_ACCESS` lists the key.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub consumers: Vec<String>,
    /// `ttl:` in seconds from when the result is recorded, by the engine's
    /// clock; `None`: until the run ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_s: Option<u64>,
    /// `single_use: true`: the first call that reads it consumes it (that
    /// call's retries read it again; no other call does).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub single_use: bool,
}

/// A tool's `compaction:` block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionDef {
    /// `essential_fields:`: dotted paths (`items.id`) of the fields the
    /// model is shown of a result; through an array, the path applies to
    /// each item. The recorded event keeps the whole result.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub essential_fields: Vec<String>,
    /// `max_description_length:`: in what the model is shown of a result,
    /// every string longer than this many characters (Unicode scalar
    /// values) is cut to it and marked `…[cut]`. The event keeps the whole
    /// result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_description_length: Option<u32>,
}

/// A tool's `process:` block: pure transforms around a call, jq
/// expressions evaluated by the machine (see `machine/process.rs`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessDef {
    /// `before:`, over `{"args": <the arguments>}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<ProcessBefore>,
    /// `after:`, over `{"result": <the result>, "args": <the arguments>}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<ProcessAfter>,
}

/// `process.before:`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessBefore {
    /// `params:`: parameter name -> expression; each value is set in the
    /// arguments the tool gets (added, or replacing the model's value).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub params: BTreeMap<String, Expr>,
    /// `require:`: preconditions; each must evaluate to `true`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub require: Vec<Expr>,
    /// `on_fail:`: what a failed precondition or expression does.
    pub on_fail: OnFail,
}

/// `process.after:`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessAfter {
    /// `result:`: field name -> expression; the transformed result is the
    /// object of these fields.
    pub result: BTreeMap<String, Expr>,
    /// `on_fail:`: what a failed expression does.
    pub on_fail: OnFail,
}

/// `on_fail:` of a `process` stage. Default [`OnFail::Block`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "action", content = "message")]
pub enum OnFail {
    /// `block("msg")`: before, the call is refused and the run fails;
    /// after, the result is withheld and the model reads `error: msg`.
    Block(String),
    /// `reask("msg")`: before, the call is refused and the model reads
    /// `msg` as the call's result, so it can propose again; after, the
    /// model reads `msg` instead of the result.
    Reask(String),
    /// `warn("msg")`: the stage is skipped (the model's arguments, or the
    /// raw result, are used) and `msg` is recorded in a
    /// `tool_call_processed` event.
    Warn(String),
    /// `use_original`: as `warn`, without a message.
    UseOriginal,
    /// `fallback("msg")`: before, no call is made and the model reads
    /// `msg` as its result; after, `msg` (a string) is the result.
    Fallback(String),
}

impl ToolDef {
    /// The JSON Schema of the arguments the model may send: the
    /// `input_schema` without the injected parameters.
    pub fn model_schema(&self) -> &Value {
        self.model_input_schema
            .as_ref()
            .unwrap_or(&self.input_schema)
    }

    /// The time a result of this tool is served from the tenant's result
    /// cache, ms, when its calls may use it: `hints.cacheable: true` and a
    /// TTL above 0 (`hints.cache_ttl_ms`, else `default_ttl_ms`). The parser
    /// allows `cacheable: true` only on an `idempotent` tool without
    /// declared side effects, whose results are scrubbed, that a worker
    /// calls; this checks the same again, so a definition stored before
    /// those rules never caches.
    pub fn cache_ttl_ms(&self, default_ttl_ms: u64) -> Option<u64> {
        let allowed = self.hints.cacheable == Some(true)
            && self.repeat_safety == RepeatSafety::Idempotent
            && !self.repeat_safety_from_server
            && self.scrub_secrets
            && !matches!(self.effect, Some(Effect::StateWrite | Effect::SideEffect))
            && self.hints.side_effects != Some(true)
            && !matches!(self.binding, ToolBindingDef::Workflow { .. });
        let ttl = self
            .hints
            .cache_ttl_ms
            .unwrap_or(default_ttl_ms)
            .min(MAX_CACHE_TTL_MS);
        (allowed && ttl > 0).then_some(ttl)
    }

    /// Whether the tool may change state outside the run: `effect:` when
    /// given (`read_only`: no), else `hints.side_effects`, else yes (a tool
    /// that says nothing is taken to have side effects, the safe reading for
    /// `confirmation.require: when_side_effects`; except a `type: sandbox`
    /// tool, which has no network and no filesystem to act on).
    pub fn has_side_effects(&self) -> bool {
        match (self.effect, self.hints.side_effects) {
            (Some(effect), _) => effect != Effect::ReadOnly,
            (None, Some(side_effects)) => side_effects,
            // A sandbox tool computes; it cannot reach the world.
            (None, None) => !matches!(self.binding, ToolBindingDef::Sandbox(_)),
        }
    }
}

/// Loop policy of an agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum LoopPolicy {
    /// Model call, tool calls, repeat until a final answer or a bound.
    BoundedLoop {
        /// Most model calls in one node execution.
        max_model_steps: u32,
        /// Most accepted tool calls in one node execution.
        max_tool_calls: u32,
    },
    /// One model call whose answer must be final: a proposed tool call would
    /// need a second model call to read its result, so it is refused and the
    /// run stops (`loop_policy`). Added after v0.1.
    ExactlyOneCall,
}

impl LoopPolicy {
    /// (most model calls, most accepted tool calls) of one node execution.
    pub fn bounds(&self) -> (u32, u32) {
        match self {
            LoopPolicy::BoundedLoop {
                max_model_steps,
                max_tool_calls,
            } => (*max_model_steps, *max_tool_calls),
            LoopPolicy::ExactlyOneCall => (1, 0),
        }
    }
}

/// Limits of an agent node's execution (`budget:` of an agent) or of a
/// whole run (`budget:` of a workflow). Tokens are the provider's reported
/// usage; `None`: unbounded. A run out of budget stops with a typed outcome
/// (`run_failed.stop`, kind `budget`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    /// Most tokens (input + output) over all model calls.
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// Most input (prompt) tokens over all model calls. Added after v0.1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_input_tokens: Option<u64>,
    /// Most output (completion) tokens over all model calls. Added after v0.1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u64>,
    /// Most model calls (workflow budgets; an agent's are its `loop:`).
    /// Added after v0.1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_model_steps: Option<u32>,
    /// Most accepted tool calls (workflow budgets; an agent's are its
    /// `loop:`). A call past it is refused back to the model. Added after v0.1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tool_calls: Option<u32>,
    /// Most cost in US dollars, from the agents' `pricing:` and the
    /// reported usage. Added after v0.1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
    /// Most wall time, ms (`max_wall_time: 10m`): of the agent's node from
    /// when it starts, or of the whole run from when it starts. Enforced by
    /// a durable timer; when it fires the node or run stops with
    /// `Stop::Deadline`. Added after v0.1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_wall_time_ms: Option<u64>,
}

impl Budget {
    /// Whether no limit is set.
    pub fn is_unbounded(&self) -> bool {
        *self == Budget::default()
    }
}

/// The price table of an agent's model, US dollars per million tokens, for
/// cost budgets. Added after v0.1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pricing {
    /// Price of a million input (prompt) tokens, USD.
    pub input_per_million_usd: f64,
    /// Price of a million output (completion) tokens, USD.
    pub output_per_million_usd: f64,
}

impl Pricing {
    /// Cost of one model call, USD.
    pub fn cost_usd(&self, input_tokens: u64, output_tokens: u64) -> f64 {
        (input_tokens as f64 * self.input_per_million_usd
            + output_tokens as f64 * self.output_per_million_usd)
            / 1_000_000.0
    }
}

/// What an agent does when one of its tool calls fails for good (after its
/// retries, or at once for a failure that cannot be retried).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnToolFailure {
    /// The model is told (`error: …`) and goes on.
    #[default]
    Continue,
    /// The run stops (`run_failed.stop`, kind `tool_failed`).
    Stop,
}

/// The longest duration a definition may give a durable timer (a wait, a
/// wall-time budget, a `type: workflow` tool's `timeout_ms`): 10 years
/// (3 650 days), ms. Longer ones are refused when parsed: a timer that far
/// out overflows the stores' clocks (SQLite's datetime ends in year 9999,
/// PostgreSQL's interval at about 178 million years) and would fire at once
/// or refuse the run.
pub const MAX_TIMER_MS: u64 = 3_650 * 24 * 3_600 * 1_000;

/// Longest interval between two calls of a rate-limited tool, ms (one
/// day): the smallest `rate_limit:` accepted is one call a day
/// (`1 / 86400`, about `0.0000116`).
pub const MAX_INTERVAL_MS: i64 = 86_400_000;

/// An agent declared in YAML (`kind: agent`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentDef {
    /// Agent name.
    pub name: String,
    /// Provider model name.
    pub model: String,
    /// `provider:`: the model API its calls need (`openai` or `anthropic`;
    /// only workers speaking it claim them). `None`: any worker. Added for
    /// worker pools (issue 21).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// `pool:`: the worker pool its model calls go to (its tool calls go
    /// where each tool's own `pool:` says). `None`: any worker. Added for
    /// worker pools (issue 21).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// System instructions.
    pub instructions: String,
    /// Names of tools the agent may propose (the node's list).
    pub tools: Vec<String>,
    /// Permissions granted to nodes running this agent.
    pub grants: Vec<String>,
    /// `loop:`.
    pub loop_policy: LoopPolicy,
    /// `budget:`.
    pub budget: Budget,
    /// Largest tool-call arguments accepted from the model, bytes; default 65536.
    pub max_argument_bytes: u32,
    /// Tool results are truncated to this many bytes before the model sees
    /// them; default 16384.
    pub max_result_bytes: u32,
    /// Model-call attempts before the run fails; default 5.
    pub max_model_attempts: u32,
    /// Attempts of one idempotent tool call (or of calls not yet dispatched)
    /// before it fails; default 5.
    pub max_tool_attempts: u32,
    /// Passed to the model as its output bound, tokens.
    #[serde(default)]
    pub max_output_tokens: Option<u32>,
    /// `pricing:`: the model's price table, for cost budgets. Added after v0.1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pricing: Option<Pricing>,
    /// `max_identical_calls:`: the same call (tool and arguments) proposed
    /// this many times in a row stops the run (`no_progress`); default 3,
    /// `0` turns the check off. Added after v0.1.
    #[serde(default = "default_identical_calls")]
    pub max_identical_calls: u32,
    /// `on_tool_failure:`. Added after v0.1.
    #[serde(default)]
    pub on_tool_failure: OnToolFailure,
    /// `output_schema:`: a JSON Schema the final answer must satisfy (as
    /// JSON); a final answer that does not is sent back to the model with
    /// the violations ((the machine's `Event::FinalAnswerRefused`)),
    /// within the agent's model-step budget. `None`: any answer finishes the
    /// node (JSON if it parses, text otherwise). Added after v0.1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    /// `pii_redaction:`: the kinds of personal data replaced by tokens
    /// (`[PII:email:1]`) in everything this agent's model is sent, and put
    /// back only into the arguments of tools whose `pii_access` allows it
    /// (`machine/pii.rs`). Empty: off (the default). Added after v0.1.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pii_redaction: Vec<PiiKind>,
    /// File and line, for messages.
    pub source_file: String,
    /// 1-based line of the document start.
    pub source_line: u32,
}

fn yes() -> bool {
    true
}

/// A kind of personal data the PII redaction of an agent finds
/// (`machine/pii.rs` has the rules of each).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PiiKind {
    /// An e-mail address (`local@domain.tld`).
    Email,
    /// A phone number in international form: `+`, country code, 8 to 15
    /// digits in all (ITU-T E.164), spaces or `-` allowed between digits.
    Phone,
    /// A payment card number: 13 to 19 digits passing the Luhn check
    /// (ISO/IEC 7812), spaces or `-` allowed between digits.
    Card,
    /// An IBAN (ISO 13616), checked per country and by its mod-97 digits.
    Iban,
    /// A US Social Security number written `AAA-GG-SSSS`, with the area,
    /// group and serial numbers the SSA never issues left out.
    Ssn,
}

impl PiiKind {
    /// Every kind, in the order `pii_redaction: true` lists them.
    pub const ALL: [PiiKind; 5] = [
        PiiKind::Email,
        PiiKind::Phone,
        PiiKind::Card,
        PiiKind::Iban,
        PiiKind::Ssn,
    ];

    /// The name written in definitions and tokens (`email`, `phone`, `card`,
    /// `iban`, `ssn`).
    pub fn name(self) -> &'static str {
        match self {
            PiiKind::Email => "email",
            PiiKind::Phone => "phone",
            PiiKind::Card => "card",
            PiiKind::Iban => "iban",
            PiiKind::Ssn => "ssn",
        }
    }

    /// The kind named `name`, if any.
    pub fn from_name(name: &str) -> Option<PiiKind> {
        PiiKind::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// A tool's `pii_access:` (abl-tools › PII access): the levels it holds.
/// `original` is `user` and `tools` together; the seed's `logs` level does
/// not apply (Belay writes no argument or result to its logs) and is
/// refused when parsed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PiiAccess {
    /// `user` (or `original`): the tool receives the personal data of the
    /// run's input and the agent's instructions as written, not as tokens.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub user: bool,
    /// `tools` (or `original`): the tool receives the personal data found
    /// in other tools' results as written.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tools: bool,
    /// `llm`: this tool's results go to the model as they are, personal
    /// data included (their values get no token).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub llm: bool,
}

impl PiiAccess {
    /// No level: the default, which `ToolDef` does not serialize (so the
    /// content hash of a tool without `pii_access:` is unchanged).
    pub fn is_none(&self) -> bool {
        *self == PiiAccess::default()
    }
}

/// Default of [`AgentDef::max_identical_calls`].
pub const DEFAULT_MAX_IDENTICAL_CALLS: u32 = 3;

fn default_identical_calls() -> u32 {
    DEFAULT_MAX_IDENTICAL_CALLS
}

/// One node of a workflow graph.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeDef {
    /// Node id, unique in the workflow.
    pub id: String,
    /// What the node does.
    pub kind: NodeKind,
    /// Extra permissions granted to this node (added to the agent's grants).
    #[serde(default)]
    pub grants: Vec<String>,
    /// Id of the next node; `None`: the run completes with this node's output.
    #[serde(default)]
    pub next: Option<String>,
    /// 1-based line of the node in its file.
    pub source_line: u32,
}

/// What a node does. Inputs written as [`Template`]s are JSON values whose
/// strings may hold `${ <jq> }` expressions over the run's state document
/// (`{"input", "nodes": {<id>: {"input", "output"}}, "vars", "run": {"id", "tenant"}}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum NodeKind {
    /// Run an agent loop. Its input is `input` rendered, or else the run
    /// input (first node) or the previous node's output.
    Agent {
        /// Agent name.
        agent: String,
        /// `input:`. Added after v0.1.
        #[serde(default)]
        input: Option<Template>,
    },
    /// Call a tool directly with `args` (no model): a deterministic step
    /// with the tool's checks, permission, repeat safety and durability.
    /// Its output is the tool's result.
    Tool {
        /// Tool name.
        tool: String,
        /// Arguments (an object once rendered).
        args: Template,
        /// Node to go to when the call fails for good; `None`: the run fails.
        #[serde(default)]
        on_error: Option<String>,
    },
    /// Wait durably for the first of several things to happen.
    Wait(WaitDef),
    /// Wait for a person's decision.
    Approval(ApprovalDef),
    /// Run another workflow as a child run (same tenant; the caller's
    /// grants carry over). `sync` waits for it and outputs its output;
    /// `async` starts it and outputs `{"run_id"}` at once. Cancelling the
    /// parent cancels a sync child.
    Workflow {
        /// Workflow name (its newest version when the child starts).
        workflow: String,
        /// The child's input; `None`: this node's input (the previous
        /// node's output, or the run input).
        #[serde(default)]
        input: Option<Template>,
        /// `sync` (default) or `async`.
        #[serde(default)]
        mode: ChildMode,
        /// Give up on a sync child after this many ms (the child is cancelled).
        #[serde(default)]
        timeout_ms: Option<u64>,
        /// Node to go to on timeout; `None`: the run fails.
        #[serde(default)]
        on_timeout: Option<String>,
        /// Node to go to when the child fails or is cancelled; `None`: the run fails.
        #[serde(default)]
        on_error: Option<String>,
    },
    /// Go to the first case whose condition is true.
    Branch {
        /// Cases in order.
        cases: Vec<BranchCase>,
        /// Where to go when no case matches; `None`: the node's `next`.
        #[serde(default)]
        default: Option<String>,
    },
    /// Set run variables (`.vars.<name>`); the node's output is the object set.
    Set {
        /// Object of values to set.
        values: Template,
    },
    /// End the run as failed with a message.
    Fail {
        /// The error (rendered; a non-string becomes its JSON text).
        error: Template,
    },
    /// End the run as completed.
    Succeed {
        /// The run's output; `None`: the previous node's output.
        #[serde(default)]
        output: Option<Template>,
    },
}

/// How a parent waits for a child run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChildMode {
    /// Wait for the child to end; its output is the node's output.
    #[default]
    Sync,
    /// Start the child and go on; the node's output is `{"run_id"}`.
    Async,
}

/// One case of a `branch` node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BranchCase {
    /// jq condition; jq truthiness (everything but `false` and `null` is true).
    pub when: Expr,
    /// Node to go to.
    pub next: String,
}

/// A `wait` node: the first of `any` to happen ends it; `timeout_ms` bounds
/// the whole wait.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WaitDef {
    /// What ends the wait (at least one).
    pub any: Vec<WaitFor>,
    /// Give up after this many ms.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Node to go to on timeout; `None`: the run fails.
    #[serde(default)]
    pub on_timeout: Option<String>,
}

/// One thing a wait waits for. Its `next` overrides the node's `next`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "for", rename_all = "snake_case")]
pub enum WaitFor {
    /// A signal delivered with `SignalRun` (buffered if it comes early).
    Signal {
        /// Signal name.
        name: String,
        /// JSON Schema the payload must match; checked when the signal is sent.
        #[serde(default)]
        payload_schema: Option<Value>,
        /// Where to go.
        #[serde(default)]
        next: Option<String>,
    },
    /// A duration, ms, from the moment the wait starts.
    Duration {
        /// ms.
        ms: u64,
        /// Where to go.
        #[serde(default)]
        next: Option<String>,
    },
    /// A point in time: an RFC 3339 timestamp (rendered).
    Until {
        /// The time.
        at: Template,
        /// Where to go.
        #[serde(default)]
        next: Option<String>,
    },
}

/// An `approval` node: a person with `approver_grant` approves (optionally
/// with edits to `subject`) or declines.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalDef {
    /// What the approver sees and approves, exactly (rendered once, when the
    /// node starts, and kept in the event).
    pub subject: Template,
    /// A question for the approver.
    #[serde(default)]
    pub prompt: Option<Template>,
    /// The permission an approver must hold.
    pub approver_grant: String,
    /// Whether an approver may change `subject` when approving; the edited
    /// subject must still match `edits_schema` when given.
    #[serde(default)]
    pub allow_edits: bool,
    /// JSON Schema an edited subject must match.
    #[serde(default)]
    pub edits_schema: Option<Value>,
    /// Node to go to on decline; `None`: the run fails.
    #[serde(default)]
    pub on_decline: Option<String>,
    /// Give up after this many ms.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Node to go to on timeout; `None`: the run fails.
    #[serde(default)]
    pub on_timeout: Option<String>,
}

impl NodeDef {
    /// Every node this node may go to, with the key that names it.
    pub fn successors(&self) -> Vec<(&'static str, &str)> {
        let mut out: Vec<(&'static str, &str)> = Vec::new();
        if let Some(n) = &self.next {
            out.push(("next", n));
        }
        match &self.kind {
            NodeKind::Tool {
                on_error: Some(n), ..
            } => out.push(("on_error", n)),
            NodeKind::Wait(w) => {
                for f in &w.any {
                    let next = match f {
                        WaitFor::Signal { next, .. }
                        | WaitFor::Duration { next, .. }
                        | WaitFor::Until { next, .. } => next,
                    };
                    if let Some(n) = next {
                        out.push(("next", n));
                    }
                }
                if let Some(n) = &w.on_timeout {
                    out.push(("on_timeout", n));
                }
            }
            NodeKind::Workflow {
                on_timeout,
                on_error,
                ..
            } => {
                if let Some(n) = on_timeout {
                    out.push(("on_timeout", n));
                }
                if let Some(n) = on_error {
                    out.push(("on_error", n));
                }
            }
            NodeKind::Approval(a) => {
                if let Some(n) = &a.on_decline {
                    out.push(("on_decline", n));
                }
                if let Some(n) = &a.on_timeout {
                    out.push(("on_timeout", n));
                }
            }
            NodeKind::Branch { cases, default } => {
                for c in cases {
                    out.push(("next", &c.next));
                }
                if let Some(n) = default {
                    out.push(("default", n));
                }
            }
            _ => {}
        }
        out
    }
}

/// A workflow declared in YAML (`kind: workflow`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkflowDef {
    /// Workflow name.
    pub name: String,
    /// Id of the first node (default: the first node listed).
    pub start: String,
    /// Nodes in file order.
    pub nodes: Vec<NodeDef>,
    /// JSON Schema of the run input; `None`: any JSON.
    #[serde(default)]
    pub input_schema: Option<Value>,
    /// `budget:`: limits over the whole run (every node). Added after v0.1.
    #[serde(default, skip_serializing_if = "Budget::is_unbounded")]
    pub budget: Budget,
    /// File of the declaration.
    pub source_file: String,
    /// 1-based line of the document start.
    pub source_line: u32,
}

/// Everything parsed from one bundle.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Bundle {
    /// Tools from `.tools.abl` files.
    pub tools: Vec<ToolDef>,
    /// Agents from YAML files.
    pub agents: Vec<AgentDef>,
    /// Workflows from YAML files.
    pub workflows: Vec<WorkflowDef>,
}
