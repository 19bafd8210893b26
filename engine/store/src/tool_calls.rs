//! The audit of tool calls: one [`ToolCallRecord`] per call a run proposed,
//! derived from the run's events alone (the source of truth; no table of
//! its own). The statements are in the backends (`postgres/tool_calls.rs`,
//! `sqlite/tool_calls.rs`, around the page of [`push_page`]): they
//! page a tenant's proposal events (`tool_call_scheduled`,
//! `tool_call_refused`) newest first through the partial index
//! `events_tool_calls` and fetch, per proposal, the events that tell the
//! rest ([`ToolCallEvents`]); [`ToolCallEvents::into_record`]
//! reads them the way the run's fold does (`RunState::apply`).

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::{Database, Encode, QueryBuilder, Type};
use uuid::Uuid;

use crate::rows::StoreError;
use belay_machine::{Event, ResolutionKind};

/// The event kinds of a proposed call, as listed in the partial index
/// `events_tool_calls` (SQLite uses a partial index only when the query
/// repeats its condition, so both are spelled from here and the migration).
pub(crate) const PROPOSAL_KINDS: &str = "('tool_call_scheduled', 'tool_call_refused')";

/// The event kinds that end a call, or leave it uncertain or open again; the
/// newest of them after the proposal is where the call stands.
pub(crate) const END_KINDS: &str = "('tool_call_completed', 'tool_call_failed', 'uncertain_outcome_recorded', 'uncertain_outcome_resolved')";

/// What the engine decided about a proposed call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolCallDecision {
    /// It passed the checks and was scheduled (`tool_call_scheduled`).
    Scheduled,
    /// It failed a check (`tool_call_refused`); the reason went to the model.
    Refused,
}

impl ToolCallDecision {
    /// The proposal event's kind (`events.kind`).
    pub fn event_kind(self) -> &'static str {
        match self {
            ToolCallDecision::Scheduled => "tool_call_scheduled",
            ToolCallDecision::Refused => "tool_call_refused",
        }
    }
}

/// Where a proposed call stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolCallOutcome {
    /// It succeeded (`tool_call_completed`, or resolved as succeeded).
    Completed,
    /// It failed for good (`tool_call_failed`, a declined confirmation, or
    /// resolved as failed), or was refused.
    Failed,
    /// Its outcome is unknown and unresolved (`uncertain_outcome_recorded`).
    Uncertain,
    /// Not ended yet: running, waiting for a confirmation, or retried after
    /// an uncertain outcome.
    Open,
}

/// Why a call was refused (`tool_call_refused`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolCallRefusal {
    /// The check that failed: `not_on_list`, `invalid_arguments`,
    /// `permission`, `budget`, `no_progress`, `truncated`, `loop_policy`,
    /// `parameter_source`.
    pub check: String,
    /// What the model was told.
    pub reason: String,
}

/// A person's decision on a call of a tool with `confirmation:`
/// (`confirmation_decided`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolCallConfirmation {
    /// Approved or declined.
    pub approved: bool,
    /// Who decided.
    pub by: String,
    /// Whether the approver edited the arguments (the call then ran with
    /// the edit, which is what [`ToolCallRecord::arguments`] shows).
    pub edited: bool,
}

/// One proposed tool call of a run, as the audit shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCallRecord {
    /// The run.
    pub run_id: Uuid,
    /// Seq of the proposal event in the run's history.
    pub seq: i64,
    /// The call id (`<node>.t<n>`); `None` for a refused call, which has none.
    pub call_id: Option<String>,
    /// The tool's name (for a refused call, as the model wrote it).
    pub tool: String,
    /// The pinned tool definition's version; `None` for a refused call.
    pub tool_version: Option<u32>,
    /// The node that proposed it.
    pub node: String,
    /// A scheduled call's arguments as validated and sent (the approver's
    /// edit, if any); a refused call's arguments as the model wrote them
    /// (the JSON they parse to, else the text itself).
    pub arguments: Value,
    /// Who started the run.
    pub caller: String,
    /// The run's tenant.
    pub tenant: String,
    /// Scheduled or refused.
    pub decision: ToolCallDecision,
    /// Set for a refused call.
    pub refusal: Option<ToolCallRefusal>,
    /// Set once a person decided a call that needed a confirmation.
    pub confirmation: Option<ToolCallConfirmation>,
    /// The `request_variants:` item the call sends (the approver's
    /// decision's, once decided); `None`: the tool's own request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// Where the call stands.
    pub outcome: ToolCallOutcome,
    /// The result of a completed call.
    pub result: Option<Value>,
    /// Set when that result came from the tenant's result cache
    /// (`hints.cacheable`): the tool was not called; where the entry came
    /// from. Added for issue 4 (result cache).
    pub cached: Option<belay_machine::cache::CachedResult>,
    /// What the model or workflow was told of a failed call (a refused
    /// call's refusal reason).
    pub error: Option<String>,
    /// For a failed `type: mcp` call: which kind of failure ended it (the
    /// tool's own `isError`, a JSON-RPC error, the transport), from its
    /// `tool_call_failed`. Added for issue 22.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<belay_machine::ToolFailureKind>,
    /// When it was proposed (the proposal event, database clock).
    pub proposed_at: DateTime<Utc>,
    /// When it completed or failed (a refused call: when it was refused).
    pub ended_at: Option<DateTime<Utc>>,
}

/// Filters of [`Store::list_tool_calls`](crate::Store::list_tool_calls).
#[derive(Debug, Clone, Default)]
pub struct ToolCallQuery<'a> {
    /// Tenant (required).
    pub tenant: &'a str,
    /// Only calls of this tool.
    pub tool: Option<&'a str>,
    /// Only calls of this run.
    pub run_id: Option<Uuid>,
    /// Only scheduled, or only refused, calls.
    pub decision: Option<ToolCallDecision>,
    /// Keyset position `(proposed_at, run_id, seq)`: calls strictly older.
    pub after: Option<(DateTime<Utc>, Uuid, i64)>,
    /// Page size + 1.
    pub limit: i64,
}

/// Push the page of proposals to `sql`: the tenant's events of
/// [`PROPOSAL_KINDS`] that pass the filters given, strictly before the
/// keyset position `after` (its time as the backend binds it), newest
/// first, at most `q.limit`. Only the filters given are in the statement: a
/// `$n IS NULL OR …` condition makes PostgreSQL's generic plan of a
/// prepared statement read every proposal of the tenant and sort them,
/// instead of reading `events_tool_calls` backwards until the page is full.
pub(crate) fn push_page<DB, T>(
    sql: &mut QueryBuilder<DB>,
    q: &ToolCallQuery<'_>,
    after: Option<(T, Uuid, i64)>,
) where
    DB: Database,
    for<'a> &'a str: Encode<'a, DB> + Type<DB>,
    for<'a> Uuid: Encode<'a, DB> + Type<DB>,
    for<'a> i64: Encode<'a, DB> + Type<DB>,
    for<'a> T: Encode<'a, DB> + Type<DB>,
{
    sql.push("SELECT run_id, seq, kind, payload, recorded_at FROM events WHERE tenant = ")
        .push_bind(q.tenant)
        .push(format_args!(" AND kind IN {PROPOSAL_KINDS}"));
    if let Some(tool) = q.tool {
        sql.push(" AND payload->>'tool' = ").push_bind(tool);
    }
    if let Some(run_id) = q.run_id {
        sql.push(" AND run_id = ").push_bind(run_id);
    }
    if let Some(decision) = q.decision {
        sql.push(" AND kind = ").push_bind(decision.event_kind());
    }
    if let Some((time, run_id, seq)) = after {
        sql.push(" AND (recorded_at, run_id, seq) < (")
            .push_bind(time)
            .push(", ")
            .push_bind(run_id)
            .push(", ")
            .push_bind(seq)
            .push(")");
    }
    sql.push(" ORDER BY recorded_at DESC, run_id DESC, seq DESC LIMIT ")
        .push_bind(q.limit);
}

/// A proposal event with the events that tell the rest of its call, as the
/// backends select them.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct ToolCallEvents {
    pub(crate) run_id: Uuid,
    pub(crate) seq: i64,
    pub(crate) proposal: Value,
    pub(crate) proposed_at: DateTime<Utc>,
    pub(crate) tenant: String,
    pub(crate) caller: String,
    /// The call's first `confirmation_decided`, if any.
    pub(crate) confirmation: Option<Value>,
    /// The call's newest event of [`END_KINDS`], if any.
    pub(crate) end_payload: Option<Value>,
    pub(crate) ended_at: Option<DateTime<Utc>>,
    /// For a refused call: the `arguments` text of its `tool_use` in the
    /// newest `model_call_completed` before it that proposed it.
    pub(crate) model_arguments: Option<String>,
}

impl ToolCallEvents {
    /// The record these events tell. Errors: [`StoreError::Corrupt`] for an
    /// event that does not decode or is not of the kind selected.
    pub(crate) fn into_record(self) -> Result<ToolCallRecord, StoreError> {
        let run_id = self.run_id;
        let decode = |what: &str, payload: Value| {
            serde_json::from_value::<Event>(payload).map_err(|e| {
                StoreError::Corrupt(format!("run {run_id}: {what} of event {}: {e}", self.seq))
            })
        };
        let mut record = ToolCallRecord {
            run_id,
            seq: self.seq,
            call_id: None,
            tool: String::new(),
            tool_version: None,
            node: String::new(),
            arguments: Value::Null,
            caller: self.caller,
            tenant: self.tenant,
            decision: ToolCallDecision::Scheduled,
            refusal: None,
            confirmation: None,
            variant: None,
            outcome: ToolCallOutcome::Open,
            result: None,
            cached: None,
            error: None,
            error_kind: None,
            proposed_at: self.proposed_at,
            ended_at: None,
        };
        match decode("proposal", self.proposal)? {
            Event::ToolCallScheduled {
                node,
                call_id,
                tool,
                tool_version,
                arguments,
                variant,
                ..
            } => {
                record.call_id = Some(call_id);
                record.tool = tool;
                record.tool_version = Some(tool_version);
                record.node = node;
                record.arguments = arguments;
                record.variant = variant;
            }
            Event::ToolCallRefused {
                node,
                tool,
                check,
                reason,
                ..
            } => {
                record.decision = ToolCallDecision::Refused;
                record.tool = tool;
                record.node = node;
                record.arguments = match self.model_arguments {
                    Some(text) => serde_json::from_str(&text).unwrap_or(Value::String(text)),
                    None => Value::Null,
                };
                record.outcome = ToolCallOutcome::Failed;
                record.error = Some(reason.clone());
                record.ended_at = Some(self.proposed_at);
                record.refusal = Some(ToolCallRefusal { check, reason });
                return Ok(record);
            }
            other => {
                return Err(StoreError::Corrupt(format!(
                    "run {run_id}: event {} is `{}`, not a tool call proposal",
                    self.seq,
                    other.kind()
                )));
            }
        }
        if let Some(payload) = self.confirmation
            && let Event::ConfirmationDecided {
                approved,
                by,
                arguments,
                edited,
                variant,
                ..
            } = decode("confirmation", payload)?
        {
            if approved {
                record.arguments = arguments;
                record.variant = variant;
            }
            record.confirmation = Some(ToolCallConfirmation {
                approved,
                by,
                edited,
            });
        }
        let Some(payload) = self.end_payload else {
            return Ok(record);
        };
        let (outcome, result, error) = match decode("end", payload)? {
            Event::ToolCallCompleted { result, cached, .. } => {
                record.cached = cached;
                (ToolCallOutcome::Completed, Some(result), None)
            }
            Event::ToolCallFailed { error, kind, .. } => {
                record.error_kind = kind;
                (ToolCallOutcome::Failed, None, Some(error))
            }
            Event::UncertainOutcomeRecorded { .. } => (ToolCallOutcome::Uncertain, None, None),
            Event::UncertainOutcomeResolved {
                resolution,
                result,
                error,
                ..
            } => match resolution {
                // As the fold reads them: a missing result is `null`, a
                // missing error "failed".
                ResolutionKind::Succeeded => (
                    ToolCallOutcome::Completed,
                    Some(result.unwrap_or(Value::Null)),
                    None,
                ),
                ResolutionKind::Failed => (
                    ToolCallOutcome::Failed,
                    None,
                    Some(error.unwrap_or_else(|| "failed".to_owned())),
                ),
                ResolutionKind::Retry => (ToolCallOutcome::Open, None, None),
            },
            other => {
                return Err(StoreError::Corrupt(format!(
                    "run {run_id}: `{}` does not end a tool call",
                    other.kind()
                )));
            }
        };
        if matches!(
            outcome,
            ToolCallOutcome::Completed | ToolCallOutcome::Failed
        ) {
            record.ended_at = self.ended_at;
        }
        record.outcome = outcome;
        record.result = result;
        record.error = error;
        Ok(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn events(end: Option<Value>) -> ToolCallEvents {
        ToolCallEvents {
            run_id: Uuid::nil(),
            seq: 7,
            proposal: json!({"type": "tool_call_scheduled", "node": "n", "call_id": "n.t1",
                "tool_use_id": "tu", "tool": "create", "tool_version": 2,
                "arguments": {"email": "e"}, "idempotency_key": "k", "repeat_safety": "reconcile"}),
            proposed_at: DateTime::UNIX_EPOCH,
            tenant: "acme".into(),
            caller: "c".into(),
            confirmation: None,
            end_payload: end,
            ended_at: Some(DateTime::UNIX_EPOCH + chrono::Duration::seconds(1)),
            model_arguments: None,
        }
    }

    fn resolved(resolution: &str, extra: Value) -> Value {
        let mut v = json!({"type": "uncertain_outcome_resolved", "call_id": "n.t1",
            "resolution": resolution, "resolved_by": "ops", "reason": "r", "via": "operator"});
        v.as_object_mut()
            .expect("object")
            .extend(extra.as_object().expect("object").clone());
        v
    }

    #[test]
    fn the_newest_end_event_says_where_a_call_stands() {
        let cases = [
            (None, ToolCallOutcome::Open, None, None),
            (
                Some(
                    json!({"type": "uncertain_outcome_recorded", "call_id": "n.t1", "attempt": 1, "reason": "lost"}),
                ),
                ToolCallOutcome::Uncertain,
                None,
                None,
            ),
            (
                Some(resolved("succeeded", json!({"result": {"id": "a"}}))),
                ToolCallOutcome::Completed,
                Some(json!({"id": "a"})),
                None,
            ),
            (
                Some(resolved("failed", json!({"error": "gone"}))),
                ToolCallOutcome::Failed,
                None,
                Some("gone"),
            ),
            (
                Some(resolved("retry", json!({"idempotency_key": "k"}))),
                ToolCallOutcome::Open,
                None,
                None,
            ),
        ];
        for (end, outcome, result, error) in cases {
            let r = events(end).into_record().expect("record");
            assert_eq!(
                (r.outcome, r.result, r.error.as_deref()),
                (outcome, result, error)
            );
            let ended = matches!(
                outcome,
                ToolCallOutcome::Completed | ToolCallOutcome::Failed
            );
            assert_eq!(r.ended_at.is_some(), ended, "{outcome:?}");
            assert_eq!(
                (r.call_id.as_deref(), r.tool_version),
                (Some("n.t1"), Some(2))
            );
        }
    }

    #[test]
    fn an_approved_edit_is_what_the_call_ran_with() {
        let mut e = events(None);
        e.confirmation = Some(json!({"type": "confirmation_decided", "call_id": "n.t1",
            "approved": true, "by": "ops", "reason": "", "arguments": {"email": "f"}, "edited": true}));
        let r = e.into_record().expect("record");
        assert_eq!(r.arguments, json!({"email": "f"}));
        assert_eq!(
            r.confirmation,
            Some(ToolCallConfirmation {
                approved: true,
                by: "ops".into(),
                edited: true
            })
        );
    }

    #[test]
    fn the_audit_shows_the_request_variant_the_call_sends() {
        let mut e = events(None);
        e.proposal["variant"] = json!("eu");
        let r = e.into_record().expect("record");
        assert_eq!(r.variant.as_deref(), Some("eu"));
        assert_eq!(serde_json::to_value(&r).expect("json")["variant"], "eu");
        // An approver's edit chose again.
        let mut e = events(None);
        e.proposal["variant"] = json!("eu");
        e.confirmation = Some(json!({"type": "confirmation_decided", "call_id": "n.t1",
            "approved": true, "by": "ops", "reason": "", "arguments": {"email": "f"},
            "edited": true, "variant": "default"}));
        let r = e.into_record().expect("record");
        assert_eq!(r.variant.as_deref(), Some("default"));
        // No variants: no field.
        let r = events(None).into_record().expect("record");
        assert!(
            serde_json::to_value(&r)
                .expect("json")
                .get("variant")
                .is_none()
        );
    }

    #[test]
    fn refused_arguments_are_the_models_text_parsed_when_they_parse() {
        for (text, arguments) in [
            (Some(r#"{"a":1}"#), json!({"a": 1})),
            (Some("{not json"), json!("{not json")),
            (None, Value::Null),
        ] {
            let mut e = events(None);
            e.proposal = json!({"type": "tool_call_refused", "node": "n", "tool_use_id": "tu",
                "tool": "nope", "check": "not_on_list", "reason": "not here"});
            e.model_arguments = text.map(str::to_owned);
            let r = e.into_record().expect("record");
            assert_eq!(r.arguments, arguments);
            assert_eq!(
                (r.decision, r.outcome, r.call_id, r.error.as_deref()),
                (
                    ToolCallDecision::Refused,
                    ToolCallOutcome::Failed,
                    None,
                    Some("not here")
                )
            );
            assert_eq!(r.ended_at, Some(r.proposed_at));
        }
    }

    #[test]
    fn an_event_of_another_kind_is_corrupt() {
        let mut e = events(None);
        e.proposal = json!({"type": "run_cancelled", "reason": "x"});
        assert!(matches!(e.into_record(), Err(StoreError::Corrupt(_))));
    }
}
