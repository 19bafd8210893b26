//! The pure run machine: events in, decisions out. No I/O, no clock, no
//! randomness; the coordinator feeds it an [`Input`] and the run's folded
//! [`RunState`], writes the returned events and performs the returned
//! [`Command`]s in one transaction.
//!
//! Every transition is a match arm in [`decide`](fn@decide); follow-up work (the next
//! model call, the next node, the end of the run) is derived in `advance`
//! from the state alone, so replaying a history reaches the same decisions.
//!
//! `decide` works on a `Step` (`step/mod.rs`), the working copy of the
//! state; each phase of a call (the model's answer, a proposal, its
//! dispatch, its outcome, a failure, an uncertain outcome, the workflow
//! graph, child runs, waits) adds its part of `impl Step` in a file of
//! its own under `step/`.
//!
//! # In detail (moved from ARCHITECTURE.md)
//!
//! the run state machine. `event.rs` (the history, internally
//! tagged, append-only), `state.rs` (`RunState::apply`, the fold; the
//! state stays small however long the run: a call's result is kept only
//! while something will read it, a tool node's output or `on_result`, only
//! the latest node output is kept, the plan is shared, `Arc<RunPlan>`, and
//! the map of tool calls is a persistent `imbl::OrdMap`, so the copy `decide`
//! works on costs O(1) however many calls the run has made),
//! `decide.rs` (`decide`: one match arm per input; `advance` derives follow-up
//! work from state alone; a final answer of an agent with `output_schema:`
//! is checked there, `checked_final_answer`, and a failing one recorded as
//! `final_answer_refused`, whose fold appends the model's next user
//! message), `plan.rs` (definitions pinned into `RunStarted`),
//! `normalize.rs` (NUL stripping, a tool's `compaction.essential_fields`
//! and `max_description_length`, and truncation of what the model sees;
//! events keep results whole), `process.rs` (a tool's `process.before`,
//! evaluated when a call is proposed, its computed arguments recorded in
//! `tool_call_scheduled`; `process.after`, evaluated in `Machine::emit`
//! just before a non-probe call's result is recorded, its new result in a
//! `tool_call_processed` event the fold hands to the model, `on_result` and
//! a tool node's output; replay reads both events),
//! `sampling.rs` (MCP sampling: `grant` puts a `SamplingGrant` into the
//! spec of a call an agent node makes of a tool with `sampling:`: the sum
//! of the attempt's output and input tokens bounded by what is left of the
//! node's and the run's token and cost budgets (cost in tokens at the
//! agent's prices), split among the sampling calls of the model's turn
//! (`Step::sampling_share`), each completion by the tool's `max_tokens` and
//! the agent's `max_output_tokens`; none without room, for tool nodes or
//! probes, or in an agent with `pii_redaction:` for a tool without
//! `pii_access: llm`; `Step::with_sampling` at each place an agent call's
//! spec is built, and `Step::refresh_sampling_grant` before a retry
//! (`RekeyTask` with the same key and a spec with a grant from what is left
//! then); `decide_sampled` handles
//! `Input::ToolCallSampled`, the coordinator's wrapper of a tool call's
//! result, failure or question for a person that came with usage: `tool_call_sampled` is recorded
//! first, then the report is decided on the charged state in the same
//! decision; the fold, `RunState::charge_sampling`, adds the tokens and
//! cost to the run's totals and to the node whose call it is, so
//! `out_of_budget` counts them; `tests/sampling.rs`),
//! `mcp_report.rs` (`Input::McpReported`: an MCP call's definition hash,
//! recorded as `mcp_definition_checked` before the attempt's result or
//! failure, and its kind of failure, set on `tool_call_attempt_failed` and
//! `tool_call_failed`),
//! `variants.rs` (which `request_variants:` item a call sends: chosen once,
//! by evaluating each `when` over the arguments in the transition that
//! schedules the call or approves an edit; the name goes into
//! `tool_call_scheduled` / `confirmation_decided` / `reconcile_probe_scheduled`
//! and the call's state, and `tool_spec` builds the spec from the recorded
//! name, so a spec built again and a replay evaluate nothing),
//! `tests/agent_loop.rs`
//! (the agent loop), `tests/workflow.rs` (the graph), `tests/retry.rs`
//! (per-tool retry policies), `tests/variant.rs`, `tests/strict.rs`
//! (strict mode: the model's spec, nulls of optional parameters). A failed tool-call attempt's retry count and
//! delay come from its tool's pinned `retry_policy` when it has one
//! (`policy_retries`: attempts that reached the tool count against
//! `max_retries`; attempts that reached nothing keep `MAX_NOT_SENT_ATTEMPTS`
//! and wait the longer of the engine's backoff and the policy's delay), else
//! from the agent's `max_tool_attempts` and `retry_delay_ms`; `jitter: full`
//! draws from a SHA-256 of (run, call, attempt) (`full_jitter_ms`), so no
//! randomness enters the machine. The delay used is recorded in
//! `tool_call_attempt_failed` / `task_lease_expired` (`retry_delay_ms`) and
//! commanded as `RetryTask`. Repeat safety alone decides whether a retry is
//! allowed. `inject.rs` (parameters the model does not supply: a proposal naming one is refused
//! at check 2; each is filled in when the call is proposed, from the state
//! document, the call's ids, `RunState.caller`, the transition's time
//! (`RunState.now`, for `source: runtime` `time`/`date`/`unix_ms`; set by
//! the store from the transition's lock statement, or by the coordinator
//! for a run's start; no part of the fold) or a literal, `config` as its
//! `{{config.NAME}}` placeholder, so the recorded arguments are what the
//! tool receives and replay evaluates nothing; a source that gives nothing
//! refuses the call with check `parameter_source`, naming no value).
//! `untraced.rs` (`visibility.trace: false` arguments: `take_untraced`,
//! which the coordinator runs on a model's answer before it is recorded,
//! leaving `{{_secret._arg_<hex>}}` placeholders and sealing the values
//! into `Input::ModelCallCompletedUntraced`; `sealed_for` at check 2 (no
//! sealed value: refused, check `vault`); the values go into the vault with
//! the scheduling (`vault.rs`, `vault_arguments`) and come back with each
//! dispatch (`restore_secrets`); `tests/untraced.rs`).
//! `pii.rs` (PII redaction of an agent with `pii_redaction:`: `Redactor`
//! numbers the values found in the node's transcript (e-mail, phone,
//! card with Luhn, IBAN, SSN; the checks from crates `luhn` and
//! `iban_validate`) per kind in order of first appearance, starting from
//! the node's recorded table (`NodeState::pii`, folded from
//! `pii_tokens_issued`, which the model-call decision emits for new
//! entries before `model_call_scheduled`), so a token keeps its value
//! whatever a later detector finds and replay computes nothing; JSON is
//! changed string by string in place (`map_json`); the model call's spec gets `[PII:kind:n]` tokens in every
//! message except results of `pii_access: llm` tools; check 2 puts a
//! token's value back into a proposed call's arguments when the tool's
//! `pii_access` covers the value's origin, else refuses the call (check
//! `pii_access`); the final answer gets every value back; `tests/pii.rs`).
//! `cache.rs` (the result cache of `hints.cacheable` tools: the key, a
//! SHA-256 of tenant, tool name, pinned content hash and canonical
//! arguments): `launch_call` puts `Command::LookupToolCache` before a
//! cacheable call's `ScheduleTask`; the store answers a live entry with
//! `Input::ToolCacheHit` in the same transaction (`on_cache_hit`: the
//! checks of a dispatch, the call's key, the return type), recorded as
//! `tool_call_completed` with `cached` and no task; a result the tool gave
//! emits `Command::StoreToolCache` (`Step::emit`, `cache_store`), so a
//! replay never consults the cache. `tests/cache.rs` (tests only). The workflow graph lives
//! here: `start_node` renders a node's templates over `RunState::document()`
//! and starts it; branch, set, fail and succeed end in the same transition;
//! tool nodes reuse the tool-call lifecycle; waits and approvals set durable
//! timers (`Command::ScheduleTimer`, ids unique per visit: `<node>~<n>`),
//! start child runs (`workflow` nodes and `type: workflow` tools:
//! `Command::StartChildRun`, id `child_run_id(run, call)`),
//! hold calls of tools with `confirmation:` until a `DecideApproval` naming
//! the call id (`request_confirmation`, `on_confirmation`: the task is
//! scheduled only then, with exactly the approved arguments),
//! hold a call whose tool asked a person for input mid-call (an MCP
//! elicitation, `on_input_requested`: the task ends, the run waits) until a
//! `ProvideToolInput` answer that fits the question (`on_input_provided`,
//! `input_for_repeat`: the task is rekeyed with the same key and a spec
//! carrying every answer so far in `input`, and made ready again); only a
//! repeat the tool's repeat safety allows waits (otherwise fail or
//! uncertain), at most `MAX_INPUT_ROUNDS` (8) questions per call,
//! check every worker's result against the tool's declared return type
//! (`result_type_failure`: a mistyped result fails the call, or makes a
//! `reconcile` call uncertain; never a success),
//! take signals (buffered in the state until a wait takes them, deduplicated
//! by signal id; the state keeps each id's name and payload digest, so the
//! same id for another signal is refused, not passed off as a duplicate) and
//! decisions (a node the workflow lacks is "no such node"); a stale timer
//! changes nothing, which is what makes a timer fire exactly once whichever
//! replica gets it.
//! `vault.rs`: the run secret vault as the machine sees it. After a
//! producer's `tool_call_completed` (not a probe's), `vault_result` emits
//! `secrets_vaulted` (keys, paths and options; never a value) and
//! `Command::VaultSecrets` with the sealed values (`SealedSecret`, which
//! `Input::ToolCallCompleted.secrets` carries in from the coordinator; the
//! machine never holds a value and no event holds even a ciphertext); every
//! dispatch of a tool with `SECRET_ACCESS` (a repeated one of the same
//! attempt too) adds `Command::RestoreSecrets`; a run's end adds
//! `Command::DropRunSecrets` when its plan has a producer.
//! `scrub.rs` redacts secrets in tool results (worker results, callbacks,
//! late results) before they are recorded, unless the tool says
//! `scrub_secrets: false`; its patterns are constants (regex), so replay is
//! unaffected (only the recorded, scrubbed result is ever folded).
//! A tool's `on_result.set` / `on_error.set` (jq, parsed with the
//! definition) are evaluated in `Machine::emit` right after a
//! `tool_call_completed` / `tool_call_failed` of a non-probe call
//! (`outcome_vars`); the values go into a `tool_vars_set` event that the
//! fold writes to `.vars`, so replay never evaluates them again. A failed
//! expression is recorded in that event's `errors` and sets nothing.
//! The agent loop's stop conditions live in `step/` too: a `length` turn's
//! tool calls are refused (`truncated`), `exactly_one_call` refuses any tool
//! call and stops, `max_identical_calls` stops a run proposing the same call
//! again and again, `on_tool_failure: stop`, and the budgets of the node
//! (agent `loop:` and `budget:`) and of the run (workflow `budget:`, totals
//! folded in `RunState::totals`) checked before each model call
//! (`out_of_budget`); each stop is a typed `Stop` in `run_failed`.
//! Wall time (`max_wall_time` of an agent's or a workflow's `budget:`) is
//! not checked but timed: starting the node (or the run) sets a durable
//! timer (`<visit prefix>.deadline`, or `run~deadline`, recorded in
//! `node_started.deadline` / `run_started.deadline`), deleted when the node
//! or run ends; firing while it is still going (`on_deadline`) stops the
//! run with `Stop::Deadline` (limit, and elapsed = limit + how late the
//! timer fired: the one piece of time the coordinator hands in,
//! `Input::TimerFired.overdue_ms`, from `Store::due_timers`). In-flight
//! work is let go exactly as a cancel lets it go (`abandon_in_flight`,
//! shared): tasks cancelled, child runs cancelled, a dispatched
//! `reconcile` call recorded as an uncertain outcome. Agent nodes have no
//! `on_error`, so a node deadline ends the run, like every agent budget.
//! Uncertain outcomes live here too: `resolve` (operator, late result or
//! probe), reconcile probes (tool calls that run while the run is paused on
//! what they look up), late results (first result wins / discrepancy), and the
//! operator pause.
//! Tool gates: the dispatch of a call whose tool has a `rate_limit:` or
//! `circuit_breaker:` ends with `Command::PassToolGates` (after every other
//! check, so a turn taken is used); when the gates hold it back, the store
//! asks again in the same transaction with `Input::DispatchGated`
//! (`on_dispatch_gated`): a rate limit defers the call (`tool_call_deferred`,
//! the task ready again at its turn, no attempt counted; the call then holds
//! a turn, `ToolCallState::holds_turn`), an open circuit fails it as
//! `rejected` and not sent, so the model or a tool node's `on_error` hears it
//! at once. Results and the failures that count
//! (`gates::counts_as_failure`) of a tool with a breaker emit
//! `Command::RecordToolOutcome`.
//! **Invariant:** no I/O, no clock, no randomness; imports no sqlx, tonic,
//! reqwest or tokio. Replaying a history gives the same state and decisions
//! (given the same `RunState::now` and `RunState::fleet_level`, which the
//! store hands in and every event that depends on records).
//! One exception, hidden behind a process-wide service like the compiled
//! filter cache: with the expression sandbox on, evaluating a template or a
//! `when` in `decide` waits (at most 1 s) for an evaluator process. The
//! machine stays synchronous and deterministic in what it records: every
//! evaluated value lands in an event (`node_started` input or a
//! `tool_call_scheduled`'s arguments, `node_completed` or `node_passed` output, a branch's `{case, next}`, `wait_started` timers, `run_failed`
//! error), and `RunState::apply` (`state.rs`, the fold used by replay and
//! by the store) never evaluates an expression, so replaying a history never
//! evaluates again; only a new decision can differ in how an evaluation
//! fails (time or memory), which is then recorded like any other.

pub mod cache;
pub mod event;
pub mod gates;
pub mod level;
pub mod normalize;
pub mod pii;
pub mod plan;
pub mod requests;
pub mod scrub;
pub mod state;
pub mod untraced;
pub mod vault;

mod command;
mod decide;
mod error;
mod inject;
mod input;
mod mcp_report;
mod process;
mod sampling;
mod step;
mod variants;

pub use command::{Command, Decision, TaskEnd, TaskKind};
pub use decide::decide;
pub use error::MachineError;
pub use event::{
    Event, FailureClass, ProbeOutcome, ResolutionKind, ResolvedVia, Stop, TimerPurpose, TimerSpec,
    ToolFailureKind,
};
pub use input::{Input, Resolution};
pub use plan::{Pinned, RunPlan};
pub use state::{CallStatus, RunState, RunStatus, StepKind, StepState};
pub use vault::{SealedSecret, VaultEntry, VaultedKey};

use belay_definitions::model::{Jitter, RetryPolicy};

// `tests/agent_loop.rs` (`use crate::*`) checks a task spec with it.
#[cfg(test)]
use step::tool_spec;

/// Timer id of the run's wall-time budget (no node's timer id can be it:
/// those are `<node>[~<n>].<what>`).
pub const RUN_DEADLINE_TIMER: &str = "run~deadline";

/// Attempts of a `tool` node's call (idempotent, or not yet dispatched)
/// before it fails: the agents' default `max_tool_attempts`.
pub const TOOL_NODE_ATTEMPTS: u32 = 5;

/// Largest arguments of a `tool` node's call, bytes of JSON (after
/// defaults are filled in): the agents' default `max_argument_bytes`.
pub const TOOL_NODE_MAX_ARGUMENT_BYTES: usize = 65_536;

/// Most bytes of a mistyped tool result quoted in the failure it becomes
/// (the whole result is not kept: it does not match what the tool declares).
pub const RESULT_EXCERPT_BYTES: usize = 2048;

/// Attempts of a tool call that provably did nothing (`not_sent`, or lost
/// before dispatch) before it fails: with [`retry_delay_ms`]'s backoff
/// (0.5 s doubling, at most 30 s) about 13 minutes of retrying, so a tool
/// host or MCP server being redeployed does not fail the run. Attempts that
/// may have acted are bounded by the agent's `max_tool_attempts`.
pub const MAX_NOT_SENT_ATTEMPTS: u32 = 30;

/// Most questions one tool call may ask a person (MCP elicitation rounds)
/// before it fails: a server that asks for ever does not hold a run for ever.
pub const MAX_INPUT_ROUNDS: u32 = 8;

/// Retry delay for attempt number `failed` (1-based), ms: 500 · 2^(n-1), at most 30 s.
pub fn retry_delay_ms(failed: u32) -> u64 {
    let exp = failed.saturating_sub(1).min(16);
    (500u64 << exp).min(30_000)
}

/// The delay before the retry after the `n`th failure that counts under a
/// tool's `policy` (1-based), ms: [`RetryPolicy::base_delay_ms`], then, for
/// `jitter: full`, a draw from `[0, that]` ([`full_jitter_ms`]) keyed by
/// the failed attempt, so the same failure always gets the same delay.
pub fn policy_delay_ms(
    policy: &RetryPolicy,
    n: u32,
    run_id: &str,
    call_id: &str,
    attempt: u32,
) -> u64 {
    let base = policy.base_delay_ms(n);
    match policy.jitter {
        Jitter::None => base,
        Jitter::Full => full_jitter_ms(base, run_id, call_id, attempt),
    }
}

/// "Full jitter" (AWS, "Exponential Backoff and Jitter"): a delay uniform
/// in `[0, base]` ms, drawn from the SHA-256 of (run id, call id, attempt)
/// instead of a random source: the machine stays pure, and deciding the
/// same failure again gives the same delay.
pub fn full_jitter_ms(base: u64, run_id: &str, call_id: &str, attempt: u32) -> u64 {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!(
        "belay.retry.jitter\n{run_id}\n{call_id}\n{attempt}"
    ));
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first) % base.saturating_add(1)
}

/// The prefix of the `visit`-th visit (1-based) of node `node`, which names
/// the visit's calls and timers: `<node>` on the first visit, `<node>~<n>`
/// on the n-th.
pub fn visit_prefix(node: &str, visit: u32) -> String {
    match visit {
        0 | 1 => node.to_owned(),
        visit => format!("{node}~{visit}"),
    }
}

/// Idempotency key of a call: belongs to run + call, never to an attempt.
pub fn idempotency_key(run_id: &str, call_id: &str) -> String {
    format!("{run_id}/{call_id}")
}

/// The run id of the child started by `call_id` of `run_id`: a UUID v5
/// (RFC 9562) of `<run_id>/<call_id>` in Belay's namespace, so replaying the
/// history, or starting the child twice, names the same run.
pub fn child_run_id(run_id: &str, call_id: &str) -> String {
    /// Belay's UUID v5 namespace (a fixed random UUID).
    const NAMESPACE: uuid::Uuid = uuid::uuid!("6f1d3c1e-8a53-4c0e-9d3b-6b2a4f3e9c17");
    uuid::Uuid::new_v5(&NAMESPACE, format!("{run_id}/{call_id}").as_bytes()).to_string()
}

/// `ms` as a human duration (`3 days`, `1h 30m`, `2 months 4 days`), for
/// status reasons: humantime's format, with a space before a unit that is
/// a word (humantime writes `3days`).
pub fn show_ms(ms: u64) -> String {
    let text = humantime::format_duration(std::time::Duration::from_millis(ms)).to_string();
    text.split(' ')
        .map(|part| match part.find(|c: char| !c.is_ascii_digit()) {
            Some(at) if part[at..].len() > 2 => format!("{} {}", &part[..at], &part[at..]),
            _ => part.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests;
