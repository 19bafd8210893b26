//! The tool result cache (`tool_cache`): serving a transition's calls from
//! it (the rules are [`CacheServing`](crate::transition::CacheServing)'s),
//! listing and purging entries. Entries are stored by a decision's
//! `StoreToolCache` (`write_decision.rs`).

use sqlx::{Postgres, Transaction};

use super::Pg;
use crate::rows::{StoreError, TOOL_CACHE_COLUMNS, ToolCacheRow};
#[cfg(doc)]
use belay_machine::Command;
use belay_machine::{Decision, RunState};

/// Serve the calls `decision` launched with a cache lookup
/// ([`Command::LookupToolCache`]) from the tenant's tool cache where it has
/// a live entry (the rules are [`crate::transition::CacheServing`]'s); `state` is the
/// run before `decision`. A decision without lookups costs no statement.
pub(super) async fn serve_from_cache(
    tx: &mut Transaction<'static, Postgres>,
    tenant: &str,
    state: &RunState,
    decision: Decision,
) -> Result<Decision, StoreError> {
    let mut serving = match crate::transition::CacheServing::new(state, decision) {
        Ok(serving) => serving,
        Err(decision) => return Ok(decision),
    };
    if serving.needs_clock() {
        serving.set_clock(
            sqlx::query_scalar("SELECT belay_now()")
                .fetch_one(&mut **tx)
                .await?,
        );
    }
    while let Some(key) = serving.next_key() {
        let row: Option<ToolCacheRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {TOOL_CACHE_COLUMNS} FROM tool_cache
             WHERE tenant = $1 AND cache_key = $2 AND expires_at > belay_now()"
        )))
        .bind(tenant)
        .bind(&key)
        .fetch_optional(&mut **tx)
        .await?;
        let Some(row) = row else {
            continue;
        };
        if serving.needs_grants() {
            let stored: Option<(Vec<String>,)> =
                sqlx::query_as("SELECT grants FROM tenants WHERE tenant = $1")
                    .bind(tenant)
                    .fetch_optional(&mut **tx)
                    .await?;
            serving.set_grants(stored.map(|r| r.0).unwrap_or_default());
        }
        serving.serve(row);
    }
    Ok(serving.finish())
}

impl Pg {
    /// See [`crate::Store::tool_cache_entries`].
    pub(crate) async fn tool_cache_entries(
        &self,
        tenant: &str,
    ) -> Result<Vec<ToolCacheRow>, StoreError> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {TOOL_CACHE_COLUMNS} FROM tool_cache WHERE tenant = $1
             ORDER BY stored_at DESC, cache_key"
        )))
        .bind(tenant)
        .fetch_all(&self.pool)
        .await?)
    }

    /// See [`crate::Store::purge_expired_tool_cache`]. Rows another engine
    /// is deleting are skipped.
    pub(crate) async fn purge_expired_tool_cache(&self, limit: i64) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "DELETE FROM tool_cache WHERE (tenant, cache_key) IN (
                 SELECT tenant, cache_key FROM tool_cache WHERE expires_at <= belay_now()
                 ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)",
        )
        .bind(limit)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }
}
