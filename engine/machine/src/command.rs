//! What a [`Decision`] holds besides its events: the [`Command`]s the
//! coordinator performs in the same transaction, and the task kinds and
//! ends they name.

use serde_json::Value;

use crate::event::{Event, ResolutionKind, ResolvedVia, TimerSpec};
use crate::gates::ToolGates;
use crate::vault::VaultEntry;
use belay_definitions::model::{CircuitBreakerDef, RepeatSafety};

/// Kind of a task row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskKind {
    /// A call to a model provider.
    ModelCall,
    /// A call to a tool.
    ToolCall,
}

impl TaskKind {
    /// Database / wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskKind::ModelCall => belay_proto::wire::TASK_KIND_MODEL_CALL,
            TaskKind::ToolCall => belay_proto::wire::TASK_KIND_TOOL_CALL,
        }
    }
}

/// Terminal status the store sets on a task row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskEnd {
    /// Result recorded.
    Completed,
    /// Failed for good.
    Failed,
    /// Outcome unknown, an uncertain-outcome record exists.
    Uncertain,
    /// No longer needed (a probe whose call was resolved otherwise).
    Cancelled,
}

/// Effects the coordinator performs in the same transaction as the events.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Persist a timer; any engine replica fires it once it is due.
    ScheduleTimer(TimerSpec),
    /// Create a child run (after this transition commits; exactly once: the
    /// id is fixed) of `workflow` with `input`, for the tenant, caller and
    /// caller grants of this run, linked to this run's `call_id`.
    StartChildRun {
        /// Call id in this run.
        call_id: String,
        /// The child's run id.
        child_run_id: String,
        /// Workflow name.
        workflow: String,
        /// Input.
        input: Value,
        /// Whether this run waits for the child's end.
        sync: bool,
    },
    /// Cancel a child run (after this transition commits).
    CancelChildRun {
        /// The child's run id.
        child_run_id: String,
        /// Why.
        reason: String,
    },
    /// Delete a timer (fired, or no longer wanted).
    CancelTimer {
        /// Timer id.
        timer_id: String,
    },
    /// Insert a task row, ready to claim.
    ScheduleTask {
        /// Call id (unique per run).
        call_id: String,
        /// Kind.
        kind: TaskKind,
        /// `ModelCallSpec` or `ToolCallSpec` as JSON.
        spec: Value,
        /// Idempotency key of the call.
        idempotency_key: String,
        /// Repeat safety for tool calls.
        repeat_safety: Option<RepeatSafety>,
        /// Claimable while the run is paused (reconcile probes).
        runs_while_paused: bool,
        /// What a worker needs to claim it: the tags of
        /// `belay_proto::pools` (sorted; empty: any worker). Added for
        /// worker pools (issue 21).
        requires: Vec<String>,
    },
    /// Give a task a new spec, with a new idempotency key (an operator's
    /// retry of a call that surely did nothing) or the same one (a
    /// person's answers to carry, a sampling grant computed again before a
    /// retry).
    RekeyTask {
        /// Call id.
        call_id: String,
        /// New key.
        idempotency_key: String,
        /// The spec carrying the new key.
        spec: Value,
    },
    /// Close an uncertain-outcome record with its resolution.
    MarkUncertainResolved {
        /// Call id.
        call_id: String,
        /// Resolution as stored (`{"resolution": ..., "result"|"error"|"idempotency_key": ...}`).
        resolution: Value,
        /// `succeeded`, `failed`, `retry`.
        kind: ResolutionKind,
        /// Who.
        resolved_by: String,
        /// Why.
        reason: String,
        /// How.
        via: ResolvedVia,
    },
    /// Flag a late result on a resolved uncertain-outcome record.
    FlagDiscrepancy {
        /// Call id.
        call_id: String,
        /// `{attempt, result, detail}`.
        discrepancy: Value,
    },
    /// Store what a reconcile probe found on the uncertain-outcome record.
    RecordProbe {
        /// The uncertain call.
        call_id: String,
        /// `{tool, outcome, detail}`.
        probe: Value,
    },
    /// Queue a notification for operators (webhook outbox).
    NotifyOperator {
        /// Event kind, e.g. `run.paused.uncertain_outcome`.
        kind: String,
        /// JSON body.
        payload: Value,
    },
    /// Put a task back to ready after `delay_ms`, keeping its attempt counter.
    RetryTask {
        /// Call id.
        call_id: String,
        /// Delay before it can be claimed again, ms.
        delay_ms: u64,
    },
    /// Remember which run and call a callback token belongs to, so that
    /// `POST /callbacks/v1/{token}` can find the run.
    RegisterCallback {
        /// Call id.
        call_id: String,
        /// Lower-case hex SHA-256 of the token.
        token_sha256: String,
    },
    /// Before anything else of this decision is written: read the tool's
    /// gates (`crate::gates::admit`) and take the call's turn. If they hold
    /// the call back, the store asks the machine again with
    /// [`Input::DispatchGated`](crate::Input::DispatchGated) and writes that decision instead. Emitted
    /// only with a dispatch, and only for a tool that declares a gate.
    PassToolGates {
        /// Tool name (the gates are the tenant's, per tool name).
        tool: String,
        /// What the pinned tool declares.
        gates: ToolGates,
        /// The call was deferred before and holds a turn.
        holds_turn: bool,
    },
    /// Move the tool's circuit: a success closes it, a failure counts
    /// towards opening it (`crate::gates::after_failure`). Only for tools
    /// with a `circuit_breaker:`.
    RecordToolOutcome {
        /// Tool name.
        tool: String,
        /// Its breaker.
        circuit_breaker: CircuitBreakerDef,
        /// Whether the call failed in a way that counts
        /// (`crate::gates::counts_as_failure`).
        failed: bool,
    },
    /// Mark the current attempt of a tool call task as dispatched.
    MarkDispatched {
        /// Call id.
        call_id: String,
        /// Attempt.
        attempt: u32,
    },
    /// Close a task.
    EndTask {
        /// Call id.
        call_id: String,
        /// How it ended.
        end: TaskEnd,
    },
    /// Write an uncertain-outcome record for a tool call.
    RecordUncertainOutcome {
        /// Call id.
        call_id: String,
        /// Node id.
        node: String,
        /// Tool name.
        tool: String,
        /// Tool version.
        tool_version: u32,
        /// Arguments sent.
        arguments: Value,
        /// Idempotency key.
        idempotency_key: String,
        /// Attempt whose outcome is unknown.
        attempt: u32,
        /// Why.
        reason: String,
    },
    /// Cancel every open task of the run.
    CancelOpenTasks,
    /// Put a producer's sealed result fields into the run's vault (a key
    /// written again replaces its value and options, and is unconsumed).
    /// Emitted with the result's events, so the vault holds a value only
    /// if the result was recorded.
    VaultSecrets {
        /// The producing call.
        call_id: String,
        /// Its tool.
        tool: String,
        /// What to keep.
        entries: Vec<VaultEntry>,
    },
    /// At a dispatch: read the run's vault for `keys`, for `tool` (a key's
    /// `consumers` must allow it), leaving out expired keys and single-use
    /// keys another call consumed; consume the single-use ones for
    /// `call_id`. The store hands what it read to the coordinator
    /// (the store's `Applied::secrets`), which gives it to the worker.
    RestoreSecrets {
        /// The dispatched call.
        call_id: String,
        /// Its tool.
        tool: String,
        /// Its `SECRET_ACCESS: READ` keys.
        keys: Vec<String>,
    },
    /// The run ended: delete its vault.
    DropRunSecrets,
    /// Before the `ScheduleTask` of `call_id` in the same decision: look
    /// `key` up in the tenant's tool cache (by the engine's clock). On a
    /// live entry the store leaves that task out and decides
    /// [`Input::ToolCacheHit`](crate::Input::ToolCacheHit) with it, on the state after this decision,
    /// in the same transaction ([`cache`](crate::cache)). Added for issue 4 (result cache).
    LookupToolCache {
        /// Call id.
        call_id: String,
        /// The call's cache key ([`cache::key`](crate::cache::key)).
        key: String,
    },
    /// Keep a call's result in the tenant's tool cache for `ttl_ms` by the
    /// engine's clock (a newer result of the same key replaces it). Added
    /// for issue 4 (result cache).
    StoreToolCache {
        /// The call's cache key ([`cache::key`](crate::cache::key)).
        key: String,
        /// Tool name (for operators and the store's tests).
        tool: String,
        /// The call whose result it is.
        call_id: String,
        /// The result, as recorded (scrubbed).
        result: Value,
        /// How long it is served, ms.
        ttl_ms: u64,
    },
}

/// What the machine decided for one input.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decision {
    /// Events to append, in order.
    pub events: Vec<Event>,
    /// Effects to perform in the same transaction.
    pub commands: Vec<Command>,
}
