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

pub mod cache;
pub mod event;
pub mod gates;
pub mod normalize;
pub mod pii;
pub mod plan;
pub mod scrub;
pub mod state;
pub mod untraced;
pub mod vault;

mod command;
mod decide;
mod error;
mod inject;
mod input;
mod process;
mod sampling;
mod step;
mod variants;

pub use command::{Command, Decision, TaskEnd, TaskKind};
pub use decide::decide;
pub use error::MachineError;
pub use event::{
    Event, FailureClass, ProbeOutcome, ResolutionKind, ResolvedVia, Stop, TimerPurpose, TimerSpec,
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

/// `ms` as a human duration (`3days`, `1h 30m`), for status reasons.
pub fn show_ms(ms: u64) -> String {
    humantime::format_duration(std::time::Duration::from_millis(ms)).to_string()
}

#[cfg(test)]
mod tests;
