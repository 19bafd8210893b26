//! MCP tools (`mcp_tool_definitions`, `mcp_tool_pins`): the definitions
//! workers report, and the one each tenant pinned. New statements only; the
//! rules are in `belay_engine::mcp_pins`.

use uuid::Uuid;

use super::{Lite, NOW};
use crate::rows::StoreError;

const MCP_DEFINITION_COLUMNS: &str = "server, tool, definition_hash, definition, refusal, suggested_repeat_safety, protocol_version, first_seen_at, last_seen_at, reported_by";

const MCP_PIN_COLUMNS: &str =
    "tenant, server, tool, definition_hash, previous_hash, accepted_by, reason, accepted_at";

impl Lite {
    /// See [`crate::Store::record_mcp_tools`].
    pub(crate) async fn record_mcp_tools(
        &self,
        server: &str,
        protocol_version: &str,
        reported_by: &str,
        listings: &[crate::rows::McpToolListingIn],
    ) -> Result<u64, StoreError> {
        let mut tx = self.begin().await?;
        let seq: i64 =
            sqlx::query_scalar("SELECT COALESCE(MAX(report_seq), 0) + 1 FROM mcp_tool_definitions")
                .fetch_one(&mut *tx)
                .await?;
        let mut new = 0;
        for l in listings {
            let inserted = sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO mcp_tool_definitions
                     (server, tool, definition_hash, definition, refusal, suggested_repeat_safety,
                      protocol_version, first_seen_at, last_seen_at, reported_by, report_seq)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, {NOW}, {NOW}, ?8, ?9)
                 ON CONFLICT (server, tool, definition_hash) DO NOTHING"
            )))
            .bind(server)
            .bind(&l.tool)
            .bind(&l.definition_hash)
            .bind(&l.definition)
            .bind(l.refusal.as_deref())
            .bind(&l.suggested_repeat_safety)
            .bind(protocol_version)
            .bind(reported_by)
            .bind(seq)
            .execute(&mut *tx)
            .await?;
            if inserted.rows_affected() == 1 {
                new += 1;
            } else {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE mcp_tool_definitions
                     SET last_seen_at = {NOW}, reported_by = ?4, protocol_version = ?5,
                         report_seq = ?6
                     WHERE server = ?1 AND tool = ?2 AND definition_hash = ?3"
                )))
                .bind(server)
                .bind(&l.tool)
                .bind(&l.definition_hash)
                .bind(reported_by)
                .bind(protocol_version)
                .bind(seq)
                .execute(&mut *tx)
                .await?;
            }
        }
        tx.commit().await?;
        Ok(new)
    }

    /// See [`crate::Store::mcp_tool_definitions`].
    pub(crate) async fn mcp_tool_definitions(
        &self,
        server: Option<&str>,
        tool: Option<&str>,
    ) -> Result<Vec<crate::rows::McpToolDefinitionRow>, StoreError> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {MCP_DEFINITION_COLUMNS} FROM mcp_tool_definitions
             WHERE (?1 IS NULL OR server = ?1) AND (?2 IS NULL OR tool = ?2)
             ORDER BY server, tool, report_seq DESC, definition_hash"
        )))
        .bind(server)
        .bind(tool)
        .fetch_all(&self.read)
        .await?)
    }

    /// See [`crate::Store::mcp_tool_pins`].
    pub(crate) async fn mcp_tool_pins(
        &self,
        tenant: &str,
        server: Option<&str>,
        tool: Option<&str>,
    ) -> Result<Vec<crate::rows::McpToolPinRow>, StoreError> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {MCP_PIN_COLUMNS} FROM mcp_tool_pins
             WHERE tenant = ?1 AND (?2 IS NULL OR server = ?2) AND (?3 IS NULL OR tool = ?3)
             ORDER BY server, tool"
        )))
        .bind(tenant)
        .bind(server)
        .bind(tool)
        .fetch_all(&self.read)
        .await?)
    }

    /// See [`crate::Store::pin_mcp_tool_first_use`].
    pub(crate) async fn pin_mcp_tool_first_use(
        &self,
        tenant: &str,
        server: &str,
        tool: &str,
        definition_hash: &str,
        accepted_by: &str,
    ) -> Result<crate::rows::McpToolPinRow, StoreError> {
        let mut tx = self.begin().await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO mcp_tool_pins
                 (tenant, server, tool, definition_hash, accepted_by, reason, accepted_at)
             VALUES (?1, ?2, ?3, ?4, ?5, 'trusted on first use', {NOW})
             ON CONFLICT (tenant, server, tool) DO NOTHING"
        )))
        .bind(tenant)
        .bind(server)
        .bind(tool)
        .bind(definition_hash)
        .bind(accepted_by)
        .execute(&mut *tx)
        .await?;
        let pin = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {MCP_PIN_COLUMNS} FROM mcp_tool_pins
             WHERE tenant = ?1 AND server = ?2 AND tool = ?3"
        )))
        .bind(tenant)
        .bind(server)
        .bind(tool)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(pin)
    }

    /// See [`crate::Store::accept_mcp_tool`].
    pub(crate) async fn accept_mcp_tool(
        &self,
        tenant: &str,
        server: &str,
        tool: &str,
        definition_hash: &str,
        accepted_by: &str,
        reason: &str,
    ) -> Result<crate::rows::McpToolPinRow, StoreError> {
        let mut tx = self.begin().await?;
        let pin = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "INSERT INTO mcp_tool_pins
                 (tenant, server, tool, definition_hash, accepted_by, reason, accepted_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, {NOW})
             ON CONFLICT (tenant, server, tool) DO UPDATE
             SET previous_hash = CASE WHEN mcp_tool_pins.definition_hash = excluded.definition_hash
                                      THEN mcp_tool_pins.previous_hash
                                      ELSE mcp_tool_pins.definition_hash END,
                 definition_hash = excluded.definition_hash,
                 accepted_by = excluded.accepted_by,
                 reason = excluded.reason,
                 accepted_at = excluded.accepted_at
             WHERE mcp_tool_pins.definition_hash <> excluded.definition_hash
             RETURNING {MCP_PIN_COLUMNS}"
        )))
        .bind(tenant)
        .bind(server)
        .bind(tool)
        .bind(definition_hash)
        .bind(accepted_by)
        .bind(reason)
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
        // Accepting the hash already pinned changes nothing (the WHERE leaves
        // the row alone and returns none): answer with the pin.
        match pin {
            Some(row) => Ok(row),
            None => self
                .mcp_tool_pins(tenant, Some(server), Some(tool))
                .await?
                .into_iter()
                .next()
                .ok_or_else(|| StoreError::NotFound(format!("MCP tool pin {server}/{tool}"))),
        }
    }

    /// See [`crate::Store::mcp_pin_task`].
    pub(crate) async fn mcp_pin_task(
        &self,
        task_id: Uuid,
    ) -> Result<Option<crate::rows::McpPinTask>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT tenant, kind, status, attempt, worker_id, spec FROM tasks WHERE task_id = ?1",
        )
        .bind(task_id)
        .fetch_optional(&self.read)
        .await?)
    }
}
