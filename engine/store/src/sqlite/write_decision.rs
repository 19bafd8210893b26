//! Writing a decision in its transition's transaction: append the events,
//! perform each command's statements and update the run row
//! ([`write_decision`]), one statement at a time (no round trip to save:
//! the database is in the process; PostgreSQL merges the hot path's).

use chrono::Utc;
use serde_json::Value;
use sqlx::{Sqlite, Transaction};
use uuid::Uuid;

use super::gates::record_tool_outcome;
use super::outbox::insert_outbox;
use super::{NOW, now_plus_ms, ts};
use crate::hand_off::{HANDED_ATTEMPT, Handed, scheduled_task_id};
use crate::rows::{StoreError, TOOL_CACHE_COLUMNS};
use crate::transition::Wakes;
use belay_machine::{Command, Decision, RunState, SealedSecret, TaskEnd};

/// SQL of the newest uncertain-outcome record of a call (`?1` run, `?2` call).
const NEWEST_RECORD: &str = "(SELECT uncertain_id FROM uncertain_outcomes
     WHERE run_id = ?1 AND call_id = ?2 ORDER BY occurrence DESC LIMIT 1)";

/// Inserts the task a [`Command::ScheduleTask`] asks for, ready, or
/// leased when it is the `handed` one. Returns whether it is ready (a
/// claimer may want waking).
async fn schedule_task(
    tx: &mut Transaction<'static, Sqlite>,
    run_id: Uuid,
    tenant: &str,
    command: &Command,
    handed: Option<&Handed>,
) -> Result<bool, StoreError> {
    let Command::ScheduleTask {
        call_id,
        kind,
        spec,
        idempotency_key,
        repeat_safety,
        runs_while_paused,
        requires,
    } = command
    else {
        return Ok(false);
    };
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO tasks (task_id, run_id, tenant, call_id, kind, status, spec, idempotency_key, repeat_safety,
             runs_while_paused, requires, available_at, created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, 'ready', ?6, ?7, ?8, ?9, ?10, {NOW}, {NOW}, {NOW})"
    )))
    .bind(scheduled_task_id(call_id, handed))
    .bind(run_id)
    .bind(tenant)
    .bind(call_id)
    .bind(kind.as_str())
    .bind(spec)
    .bind(idempotency_key)
    .bind(repeat_safety.map(|r| r.as_str()))
    .bind(runs_while_paused)
    .bind(Value::from(requires.clone()))
    .execute(&mut **tx)
    .await?;
    match handed.filter(|h| h.call_id == *call_id) {
        Some(h) => lease_handed(tx, h).await.map(|()| false),
        None => Ok(true),
    }
}

/// Leases the just inserted task `handed` names to its worker, as a claim
/// would ([`crate::hand_off`]).
async fn lease_handed(
    tx: &mut Transaction<'static, Sqlite>,
    handed: &Handed,
) -> Result<(), StoreError> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE tasks SET status = 'leased', attempt = ?2, worker_id = ?3, lease_expires_at = {lease},
                dispatched = ?5, dispatched_attempt = CASE WHEN ?5 THEN ?2 END,
                dispatched_at = CASE WHEN ?5 THEN {NOW} END, updated_at = {NOW}
         WHERE task_id = ?1",
        lease = now_plus_ms(4)
    )))
    .bind(handed.task_id)
    .bind(HANDED_ATTEMPT)
    .bind(&handed.worker_id)
    .bind(handed.lease_ms as f64)
    .bind(handed.dispatched)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Append the decision's events after `last_seq`, perform its commands, and
/// update the run row from the state `after` the events. `handed`: the
/// scheduled task to write leased to the reporting worker.
pub(super) async fn write_decision(
    tx: &mut Transaction<'static, Sqlite>,
    run_id: Uuid,
    tenant: &str,
    last_seq: i64,
    decision: &Decision,
    after: &RunState,
    handed: Option<&Handed>,
) -> Result<Wakes, StoreError> {
    let handed_call = handed.map(|h| h.call_id.as_str());
    let mut wakes = Wakes {
        tasks: crate::transition::wakes_tasks(decision, handed_call),
        events: !decision.events.is_empty(),
        outbox: false,
        secrets: Vec::new(),
    };
    for (i, event) in decision.events.iter().enumerate() {
        let payload = serde_json::to_value(event)
            .map_err(|e| StoreError::Corrupt(format!("event does not serialise: {e}")))?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO events (run_id, seq, kind, payload, tenant, recorded_at) VALUES (?1, ?2, ?3, ?4, ?5, {NOW})"
        )))
            .bind(run_id)
            .bind(last_seq + 1 + i as i64)
            .bind(event.kind())
            .bind(payload)
            .bind(tenant)
            .execute(&mut **tx)
            .await?;
    }
    for command in &decision.commands {
        match command {
            Command::ScheduleTask { .. } => {
                wakes.tasks |= schedule_task(tx, run_id, tenant, command, handed).await?;
            }
            Command::RetryTask { call_id, delay_ms } => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE tasks SET status = 'ready', lease_expires_at = NULL, worker_id = NULL, dispatched = 0,
                            available_at = {available}, updated_at = {NOW}
                     WHERE run_id = ?1 AND call_id = ?2",
                    available = now_plus_ms(3)
                )))
                .bind(run_id)
                .bind(call_id)
                .bind(*delay_ms as f64)
                .execute(&mut **tx)
                .await?;
                wakes.tasks = true;
            }
            Command::MarkDispatched { call_id, attempt } => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE tasks SET dispatched = 1, dispatched_attempt = ?3, dispatched_at = {NOW}, updated_at = {NOW}
                     WHERE run_id = ?1 AND call_id = ?2 AND attempt = ?3 AND status = 'leased'"
                )))
                .bind(run_id)
                .bind(call_id)
                .bind(*attempt as i32)
                .execute(&mut **tx)
                .await?;
            }
            Command::EndTask { call_id, end } => {
                let status = match end {
                    TaskEnd::Completed => "completed",
                    TaskEnd::Failed => "failed",
                    TaskEnd::Uncertain => "uncertain",
                    TaskEnd::Cancelled => "cancelled",
                };
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE tasks SET status = ?3, lease_expires_at = NULL, updated_at = {NOW}
                     WHERE run_id = ?1 AND call_id = ?2"
                )))
                .bind(run_id)
                .bind(call_id)
                .bind(status)
                .execute(&mut **tx)
                .await?;
            }
            Command::RecordUncertainOutcome {
                call_id,
                node,
                tool,
                tool_version,
                arguments,
                idempotency_key,
                attempt: _,
                reason,
            } => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "INSERT INTO uncertain_outcomes (uncertain_id, tenant, run_id, task_id, call_id, node_id, tool,
                         tool_version, arguments, idempotency_key, attempts, worker_id, reason, occurrence, created_at)
                     SELECT ?3, ?4, ?1, t.task_id, ?2, ?5, ?6, ?7, ?8, ?9,
                            -- Every attempt's dispatch and failure, from the events
                            -- (this transition's events are already inserted).
                            (SELECT COALESCE(json_group_array(json_object(
                                        'seq', e.seq, 'event', e.kind, 'attempt', e.payload -> '$.attempt',
                                        'worker_id', e.payload -> '$.worker_id', 'error', e.payload -> '$.error',
                                        'class', e.payload -> '$.class', 'at', e.recorded_at) ORDER BY e.seq), '[]')
                             FROM events e
                             WHERE e.run_id = ?1 AND e.payload ->> '$.call_id' = ?2
                               AND e.kind IN ('tool_call_dispatched', 'tool_call_attempt_failed', 'task_lease_expired')),
                            t.worker_id, ?10,
                            (SELECT COALESCE(MAX(occurrence), 0) + 1 FROM uncertain_outcomes u
                             WHERE u.run_id = ?1 AND u.call_id = ?2),
                            {NOW}
                     FROM tasks t WHERE t.run_id = ?1 AND t.call_id = ?2"
                )))
                .bind(run_id)
                .bind(call_id)
                .bind(Uuid::now_v7())
                .bind(tenant)
                .bind(node)
                .bind(tool)
                .bind(*tool_version as i32)
                .bind(arguments)
                .bind(idempotency_key)
                .bind(reason)
                .execute(&mut **tx)
                .await?;
            }
            Command::RekeyTask {
                call_id,
                idempotency_key,
                spec,
            } => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE tasks SET idempotency_key = ?3, spec = ?4, updated_at = {NOW}
                     WHERE run_id = ?1 AND call_id = ?2"
                )))
                .bind(run_id)
                .bind(call_id)
                .bind(idempotency_key)
                .bind(spec)
                .execute(&mut **tx)
                .await?;
            }
            Command::MarkUncertainResolved {
                call_id,
                resolution,
                kind,
                resolved_by,
                reason,
                via,
            } => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE uncertain_outcomes SET status = 'resolved', resolution = ?3, resolution_kind = ?4,
                            resolved_by = ?5, resolution_reason = ?6, resolved_via = ?7, resolved_at = {NOW}
                     WHERE uncertain_id = (SELECT uncertain_id FROM uncertain_outcomes
                                           WHERE run_id = ?1 AND call_id = ?2 AND status = 'open'
                                           ORDER BY occurrence DESC LIMIT 1)"
                )))
                .bind(run_id)
                .bind(call_id)
                .bind(resolution)
                .bind(kind.as_str())
                .bind(resolved_by)
                .bind(reason)
                .bind(via.as_str())
                .execute(&mut **tx)
                .await?;
            }
            Command::FlagDiscrepancy {
                call_id,
                discrepancy,
            } => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE uncertain_outcomes
                     SET discrepancy = json_insert(COALESCE(discrepancy, '[]'), '$[#]', json(?3))
                     WHERE uncertain_id = {NEWEST_RECORD}"
                )))
                .bind(run_id)
                .bind(call_id)
                .bind(discrepancy)
                .execute(&mut **tx)
                .await?;
            }
            Command::RecordProbe { call_id, probe } => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE uncertain_outcomes SET probe = json_set(json(?3), '$.at', {NOW})
                     WHERE uncertain_id = {NEWEST_RECORD}"
                )))
                .bind(run_id)
                .bind(call_id)
                .bind(probe)
                .execute(&mut **tx)
                .await?;
            }
            Command::NotifyOperator { kind, payload } => {
                // The record's id is added here, as the PostgreSQL backend
                // does in SQL (SQLite stores ids as blobs).
                let call_id = payload.get("call_id").and_then(Value::as_str).unwrap_or("");
                let record: Option<(Uuid,)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                    "SELECT uncertain_id FROM uncertain_outcomes WHERE uncertain_id = {NEWEST_RECORD}"
                )))
                .bind(run_id)
                .bind(call_id)
                .fetch_optional(&mut **tx)
                .await?;
                let mut payload = payload.clone();
                if let Value::Object(map) = &mut payload {
                    map.insert(
                        "uncertain_id".into(),
                        record.map_or(Value::Null, |(id,)| Value::String(id.to_string())),
                    );
                }
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "INSERT INTO notifications (notification_id, tenant, run_id, kind, payload, next_attempt_at, created_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, {NOW}, {NOW})"
                )))
                .bind(Uuid::now_v7())
                .bind(tenant)
                .bind(run_id)
                .bind(kind)
                .bind(payload)
                .execute(&mut **tx)
                .await?;
            }
            Command::ScheduleTimer(timer) => {
                let fire_at = match timer.at.as_deref().and_then(|t| {
                    chrono::DateTime::parse_from_rfc3339(t)
                        .ok()
                        .map(|t| ts(&t.with_timezone(&Utc)))
                }) {
                    Some(at) => at,
                    None => {
                        let row: (String,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                            "SELECT {}",
                            now_plus_ms(1)
                        )))
                        .bind(timer.after_ms.unwrap_or(0) as f64)
                        .fetch_one(&mut **tx)
                        .await?;
                        row.0
                    }
                };
                sqlx::query(
                    "INSERT INTO timers (run_id, timer_id, fire_at) VALUES (?1, ?2, ?3)
                     ON CONFLICT (run_id, timer_id) DO UPDATE SET fire_at = excluded.fire_at",
                )
                .bind(run_id)
                .bind(&timer.timer_id)
                .bind(fire_at)
                .execute(&mut **tx)
                .await?;
            }
            Command::RegisterCallback {
                call_id,
                token_sha256,
            } => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "INSERT INTO callbacks (token_sha256, run_id, call_id, created_at)
                     VALUES (?1, ?2, ?3, {NOW}) ON CONFLICT (token_sha256) DO NOTHING"
                )))
                .bind(token_sha256)
                .bind(run_id)
                .bind(call_id)
                .execute(&mut **tx)
                .await?;
            }
            Command::CancelTimer { timer_id } => {
                sqlx::query("DELETE FROM timers WHERE run_id = ?1 AND timer_id = ?2")
                    .bind(run_id)
                    .bind(timer_id)
                    .execute(&mut **tx)
                    .await?;
            }
            Command::StartChildRun {
                call_id,
                child_run_id,
                workflow,
                input,
                sync,
            } => {
                let payload = serde_json::json!({
                    "tenant": tenant, "call_id": call_id, "child_run_id": child_run_id,
                    "workflow": workflow, "input": input, "sync": sync,
                });
                insert_outbox(tx, run_id, "start_child", &payload).await?;
                wakes.outbox = true;
            }
            Command::CancelChildRun {
                child_run_id,
                reason,
            } => {
                let payload = serde_json::json!({
                    "tenant": tenant, "child_run_id": child_run_id, "reason": reason,
                });
                insert_outbox(tx, run_id, "cancel_child", &payload).await?;
                wakes.outbox = true;
            }
            Command::CancelOpenTasks => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE tasks SET status = 'cancelled', lease_expires_at = NULL, updated_at = {NOW}
                     WHERE run_id = ?1 AND status IN ('ready', 'leased')"
                )))
                .bind(run_id)
                .execute(&mut **tx)
                .await?;
            }
            // Passed before this decision was written (`transition_at`);
            // lookups were made by `serve_from_cache`.
            Command::PassToolGates { .. } | Command::LookupToolCache { .. } => {}
            Command::StoreToolCache {
                key,
                tool,
                call_id,
                result,
                ttl_ms,
            } => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "INSERT INTO tool_cache ({TOOL_CACHE_COLUMNS})
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, {NOW}, {expires})
                     ON CONFLICT (tenant, cache_key) DO UPDATE SET
                         tool = excluded.tool, result = excluded.result, run_id = excluded.run_id,
                         call_id = excluded.call_id, stored_at = excluded.stored_at,
                         expires_at = excluded.expires_at",
                    expires = now_plus_ms(7)
                )))
                .bind(tenant)
                .bind(key)
                .bind(tool)
                .bind(result)
                .bind(run_id)
                .bind(call_id)
                .bind(*ttl_ms as f64)
                .execute(&mut **tx)
                .await?;
            }
            Command::RecordToolOutcome {
                tool,
                circuit_breaker,
                failed,
            } => record_tool_outcome(tx, tenant, tool, circuit_breaker, *failed).await?,
            Command::VaultSecrets {
                call_id, entries, ..
            } => {
                for entry in entries {
                    let consumers = serde_json::to_string(&entry.consumers)
                        .map_err(|e| StoreError::Corrupt(format!("consumers: {e}")))?;
                    let ttl_ms = entry
                        .ttl_s
                        .map(|t| i64::try_from(t.saturating_mul(1000)).unwrap_or(i64::MAX));
                    sqlx::query(sqlx::AssertSqlSafe(format!(
                        "INSERT INTO run_secrets (run_id, key, producer_call, nonce, ciphertext, expires_at, single_use, consumers, consumed_by_call, created_at)
                         VALUES (?1, ?2, ?3, ?4, ?5, CASE WHEN ?6 IS NULL THEN NULL ELSE {} END, ?7, ?8, NULL, {NOW})
                         ON CONFLICT (run_id, key) DO UPDATE SET producer_call = excluded.producer_call,
                             nonce = excluded.nonce, ciphertext = excluded.ciphertext,
                             expires_at = excluded.expires_at, single_use = excluded.single_use,
                             consumers = excluded.consumers, consumed_by_call = NULL,
                             created_at = excluded.created_at",
                        now_plus_ms(6)
                    )))
                    .bind(run_id)
                    .bind(&entry.sealed.key)
                    .bind(call_id)
                    .bind(&entry.sealed.nonce)
                    .bind(&entry.sealed.ciphertext)
                    .bind(ttl_ms)
                    .bind(entry.single_use)
                    .bind(consumers)
                    .execute(&mut **tx)
                    .await?;
                }
            }
            Command::RestoreSecrets {
                call_id,
                tool,
                keys,
            } => {
                let keys = serde_json::to_string(keys)
                    .map_err(|e| StoreError::Corrupt(format!("vault keys: {e}")))?;
                let rows: Vec<(String, Vec<u8>, Vec<u8>)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                    "UPDATE run_secrets
                     SET consumed_by_call = CASE WHEN single_use THEN ?4 ELSE consumed_by_call END
                     WHERE run_id = ?1 AND key IN (SELECT value FROM json_each(?2))
                       AND (expires_at IS NULL OR expires_at > {NOW})
                       AND (consumers = '[]' OR EXISTS (SELECT 1 FROM json_each(consumers) WHERE value = ?3))
                       AND (consumed_by_call IS NULL OR consumed_by_call = ?4)
                     RETURNING key, nonce, ciphertext"
                )))
                .bind(run_id)
                .bind(keys)
                .bind(tool)
                .bind(call_id)
                .fetch_all(&mut **tx)
                .await?;
                wakes
                    .secrets
                    .extend(
                        rows.into_iter()
                            .map(|(key, nonce, ciphertext)| SealedSecret {
                                key,
                                nonce,
                                ciphertext,
                            }),
                    );
            }
            Command::DropRunSecrets => {
                sqlx::query("DELETE FROM run_secrets WHERE run_id = ?1")
                    .bind(run_id)
                    .execute(&mut **tx)
                    .await?;
            }
        }
    }
    if after.status.is_terminal() {
        // A run that ended has nothing left to wake it.
        sqlx::query("DELETE FROM timers WHERE run_id = ?1")
            .bind(run_id)
            .execute(&mut **tx)
            .await?;
        // A child run that ends tells its parent (through the outbox).
        if crate::transition::ends_run(decision) {
            let parent: Option<(Option<Uuid>,)> =
                sqlx::query_as("SELECT parent_run_id FROM runs WHERE run_id = ?1")
                    .bind(run_id)
                    .fetch_optional(&mut **tx)
                    .await?;
            if let Some((Some(parent),)) = parent {
                let payload =
                    crate::transition::child_finished_payload(tenant, parent, run_id, after);
                insert_outbox(tx, run_id, "child_finished", &payload).await?;
                wakes.outbox = true;
            }
        }
    }
    // The run row is a projection of the events: a decision without any
    // (a duplicate signal, a stale timer, a repeated child report) leaves
    // it as it is, `updated_at` included.
    if !decision.events.is_empty() {
        let new_seq = last_seq + decision.events.len() as i64;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE runs SET status = ?2, status_reason = ?3, output = ?4, last_seq = ?5, updated_at = {NOW}
             WHERE run_id = ?1"
        )))
        .bind(run_id)
        .bind(after.status.as_str())
        .bind(&after.status_reason)
        .bind(after.output.as_ref())
        .bind(new_seq)
        .execute(&mut **tx)
        .await?;
    }
    Ok(wakes)
}
