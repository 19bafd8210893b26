//! Tool gates (`tool_gates`: rate limits, circuit breakers). The rules
//! are in `belay_machine::gates`; these statements load and save its rows,
//! in the transition that dispatches a call or records its outcome. The
//! one writer connection serialises every transaction, so no row lock is
//! needed (the PostgreSQL backend takes them).

use sqlx::{Sqlite, Transaction};

use super::{CLOCK, Lite, NOW};
use crate::rows::StoreError;
use belay_definitions::model::CircuitBreakerDef;
use belay_machine::gates::{self, Circuit, GateRow, GateVerdict};

/// SQL for the engine's clock in ms since the epoch (`'now'` shifted like [`NOW`]).
fn now_ms() -> String {
    format!("CAST(ROUND((julianday('now', {CLOCK}) - 2440587.5) * 86400000.0) AS INTEGER)")
}

/// The tool's row and the engine's clock (ms); `None` when it has no row.
async fn load_gate(
    tx: &mut Transaction<'static, Sqlite>,
    tenant: &str,
    tool: &str,
) -> Result<Option<(GateRow, i64)>, StoreError> {
    let row: Option<crate::transition::GateTuple> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT next_at_ms, queue_at_ms, failures, circuit, retry_at_ms, {}
         FROM tool_gates WHERE tenant = ?1 AND tool = ?2",
        now_ms()
    )))
    .bind(tenant)
    .bind(tool)
    .fetch_optional(&mut **tx)
    .await?;
    row.map(crate::transition::gate_row).transpose()
}

/// The tool's row (a fresh one when it has none) and the engine's clock (ms).
async fn gate_or_default(
    tx: &mut Transaction<'static, Sqlite>,
    tenant: &str,
    tool: &str,
) -> Result<(GateRow, i64), StoreError> {
    if let Some(found) = load_gate(tx, tenant, tool).await? {
        return Ok(found);
    }
    let now: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT {}", now_ms())))
        .fetch_one(&mut **tx)
        .await?;
    Ok((GateRow::default(), now))
}

async fn save_gate(
    tx: &mut Transaction<'static, Sqlite>,
    tenant: &str,
    tool: &str,
    row: &GateRow,
) -> Result<(), StoreError> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO tool_gates (tenant, tool, next_at_ms, queue_at_ms, failures, circuit, retry_at_ms, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, {NOW})
         ON CONFLICT (tenant, tool) DO UPDATE SET next_at_ms = excluded.next_at_ms,
             queue_at_ms = excluded.queue_at_ms, failures = excluded.failures, circuit = excluded.circuit,
             retry_at_ms = excluded.retry_at_ms, updated_at = excluded.updated_at"
    )))
    .bind(tenant)
    .bind(tool)
    .bind(row.next_at_ms)
    .bind(row.queue_at_ms)
    .bind(i64::from(row.failures))
    .bind(row.circuit.as_str())
    .bind(row.retry_at_ms)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// See the PostgreSQL backend's `pass_tool_gates`.
pub(super) async fn pass_tool_gates(
    tx: &mut Transaction<'static, Sqlite>,
    tenant: &str,
    asked: &crate::transition::GatesAsked<'_>,
) -> Result<Option<GateVerdict>, StoreError> {
    let (tool, gates) = (asked.tool, asked.gates);
    let (row, now) = gate_or_default(tx, tenant, tool).await?;
    if gates.rate_limit.is_none() && row.circuit == Circuit::Closed {
        return Ok(None);
    }
    let (verdict, next) = gates::admit(&row, now, gates, asked.holds_turn);
    if next != row {
        save_gate(tx, tenant, tool, &next).await?;
    }
    Ok(verdict)
}

/// See the PostgreSQL backend's `record_tool_outcome`.
pub(super) async fn record_tool_outcome(
    tx: &mut Transaction<'static, Sqlite>,
    tenant: &str,
    tool: &str,
    breaker: &CircuitBreakerDef,
    failed: bool,
) -> Result<(), StoreError> {
    if !failed {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE tool_gates SET failures = 0, circuit = 'closed', retry_at_ms = 0, updated_at = {NOW}
             WHERE tenant = ?1 AND tool = ?2 AND (failures <> 0 OR circuit <> 'closed')"
        )))
        .bind(tenant)
        .bind(tool)
        .execute(&mut **tx)
        .await?;
        return Ok(());
    }
    let (row, now) = gate_or_default(tx, tenant, tool).await?;
    save_gate(tx, tenant, tool, &gates::after_failure(&row, now, breaker)).await
}

impl Lite {
    pub(crate) async fn tool_gate(
        &self,
        tenant: &str,
        tool: &str,
    ) -> Result<Option<GateRow>, StoreError> {
        let mut tx = self.read.begin().await?;
        let row = load_gate(&mut tx, tenant, tool).await?;
        tx.commit().await?;
        Ok(row.map(|(row, _)| row))
    }
}
