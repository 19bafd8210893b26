//! Tenants' grants (`tenants`, a JSON array here): the permissions a
//! tenant's calls may use, checked at dispatch.

use serde_json::Value;

use super::{Lite, NOW};
use crate::rows::StoreError;

impl Lite {
    pub(crate) async fn set_tenant_grants(
        &self,
        tenant: &str,
        grants: &[String],
    ) -> Result<Vec<String>, StoreError> {
        let mut grants = grants.to_vec();
        grants.sort();
        grants.dedup();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO tenants (tenant, grants) VALUES (?1, ?2)
             ON CONFLICT (tenant) DO UPDATE SET grants = excluded.grants, updated_at = {NOW}"
        )))
        .bind(tenant)
        .bind(Value::from(grants.clone()))
        .execute(&self.write)
        .await?;
        Ok(grants)
    }

    pub(crate) async fn tenant_grants(&self, tenant: &str) -> Result<Vec<String>, StoreError> {
        let row: Option<(Value,)> = sqlx::query_as("SELECT grants FROM tenants WHERE tenant = ?1")
            .bind(tenant)
            .fetch_optional(&self.read)
            .await?;
        match row {
            None => Ok(Vec::new()),
            Some((v,)) => serde_json::from_value(v)
                .map_err(|e| StoreError::Corrupt(format!("grants of tenant {tenant}: {e}"))),
        }
    }
}
