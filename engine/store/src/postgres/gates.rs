//! Tool gates (`tool_gates`: rate limits, circuit breakers). The rules
//! are in `belay_machine::gates`; these statements load and save its rows,
//! in the transition that dispatches a call or records its outcome.

use sqlx::{Postgres, Transaction};

use super::Pg;
use crate::rows::StoreError;
use belay_definitions::model::CircuitBreakerDef;
#[cfg(doc)]
use belay_machine::Command;
use belay_machine::gates::{self, Circuit, GateRow, GateVerdict};

/// The columns of a `tool_gates` row, then the engine's clock in ms.
const GATE_COLUMNS: &str = "next_at_ms, queue_at_ms, failures::int8, circuit, retry_at_ms, floor(EXTRACT(EPOCH FROM belay_now()) * 1000)::int8";

/// The tool's row and the engine's clock (ms), locked for this transaction
/// with `lock`; `None` when the tool has no row.
async fn load_gate(
    tx: &mut Transaction<'static, Postgres>,
    tenant: &str,
    tool: &str,
    lock: bool,
) -> Result<Option<(GateRow, i64)>, StoreError> {
    let row: Option<crate::transition::GateTuple> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {GATE_COLUMNS} FROM tool_gates WHERE tenant = $1 AND tool = $2{}",
        if lock { " FOR UPDATE" } else { "" }
    )))
    .bind(tenant)
    .bind(tool)
    .fetch_optional(&mut **tx)
    .await?;
    row.map(crate::transition::gate_row).transpose()
}

/// The tool's row, created if missing, locked for this transaction; and
/// the engine's clock (ms). Creating it first means two replicas gating the
/// tool's first call wait for each other like any later one.
async fn lock_gate(
    tx: &mut Transaction<'static, Postgres>,
    tenant: &str,
    tool: &str,
) -> Result<(GateRow, i64), StoreError> {
    if let Some(found) = load_gate(tx, tenant, tool, true).await? {
        return Ok(found);
    }
    sqlx::query("INSERT INTO tool_gates (tenant, tool) VALUES ($1, $2) ON CONFLICT DO NOTHING")
        .bind(tenant)
        .bind(tool)
        .execute(&mut **tx)
        .await?;
    load_gate(tx, tenant, tool, true)
        .await?
        .ok_or_else(|| StoreError::Corrupt(format!("tool_gates row of {tool:?} vanished")))
}

async fn save_gate(
    tx: &mut Transaction<'static, Postgres>,
    tenant: &str,
    tool: &str,
    row: &GateRow,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE tool_gates SET next_at_ms = $3, queue_at_ms = $4, failures = $5, circuit = $6,
                retry_at_ms = $7, updated_at = belay_now()
         WHERE tenant = $1 AND tool = $2",
    )
    .bind(tenant)
    .bind(tool)
    .bind(row.next_at_ms)
    .bind(row.queue_at_ms)
    .bind(i32::try_from(row.failures).unwrap_or(i32::MAX))
    .bind(row.circuit.as_str())
    .bind(row.retry_at_ms)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// [`Command::PassToolGates`]: `None` when the call may go (its turn is
/// taken), else why not. A tool with a rate limit locks its row (every
/// dispatch takes a turn); a tool with only a circuit breaker reads its row
/// without a lock and locks it only when the circuit is not closed, so the
/// dispatches of a healthy tool never wait for each other.
pub(super) async fn pass_tool_gates(
    tx: &mut Transaction<'static, Postgres>,
    tenant: &str,
    asked: &crate::transition::GatesAsked<'_>,
) -> Result<Option<GateVerdict>, StoreError> {
    let (tool, gates) = (asked.tool, asked.gates);
    let (row, now) = if gates.rate_limit.is_some() {
        lock_gate(tx, tenant, tool).await?
    } else {
        match load_gate(tx, tenant, tool, false).await? {
            None => return Ok(None),
            Some((row, _)) if row.circuit == Circuit::Closed => return Ok(None),
            // Rows are never deleted.
            Some(_) => lock_gate(tx, tenant, tool).await?,
        }
    };
    let (verdict, next) = gates::admit(&row, now, gates, asked.holds_turn);
    if next != row {
        save_gate(tx, tenant, tool, &next).await?;
    }
    Ok(verdict)
}

/// [`Command::RecordToolOutcome`]. A success closes the circuit and clears
/// the count: one `UPDATE` that touches (and locks) the row only when
/// there is something to clear, so a healthy tool's results never wait for
/// each other. A failure is [`gates::after_failure`] on the locked row.
pub(super) async fn record_tool_outcome(
    tx: &mut Transaction<'static, Postgres>,
    tenant: &str,
    tool: &str,
    breaker: &CircuitBreakerDef,
    failed: bool,
) -> Result<(), StoreError> {
    if !failed {
        sqlx::query(
            "UPDATE tool_gates SET failures = 0, circuit = 'closed', retry_at_ms = 0, updated_at = belay_now()
             WHERE tenant = $1 AND tool = $2 AND (failures <> 0 OR circuit <> 'closed')",
        )
        .bind(tenant)
        .bind(tool)
        .execute(&mut **tx)
        .await?;
        return Ok(());
    }
    let (row, now) = lock_gate(tx, tenant, tool).await?;
    save_gate(tx, tenant, tool, &gates::after_failure(&row, now, breaker)).await
}

impl Pg {
    pub(crate) async fn tool_gate(
        &self,
        tenant: &str,
        tool: &str,
    ) -> Result<Option<GateRow>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let row = load_gate(&mut tx, tenant, tool, false).await?;
        tx.commit().await?;
        Ok(row.map(|(row, _)| row))
    }
}
