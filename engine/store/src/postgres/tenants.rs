//! Tenants' grants (`tenants`): the permissions a tenant's calls may use,
//! checked at dispatch.

use super::Pg;
use crate::rows::StoreError;

impl Pg {
    /// Replace a tenant's grants; returns them sorted.
    pub(crate) async fn set_tenant_grants(
        &self,
        tenant: &str,
        grants: &[String],
    ) -> Result<Vec<String>, StoreError> {
        let mut grants = grants.to_vec();
        grants.sort();
        grants.dedup();
        sqlx::query(
            "INSERT INTO tenants (tenant, grants) VALUES ($1, $2)
             ON CONFLICT (tenant) DO UPDATE SET grants = EXCLUDED.grants, updated_at = belay_now()",
        )
        .bind(tenant)
        .bind(&grants)
        .execute(&self.pool)
        .await?;
        Ok(grants)
    }

    /// A tenant's grants (empty if never configured).
    pub(crate) async fn tenant_grants(&self, tenant: &str) -> Result<Vec<String>, StoreError> {
        let row: Option<(Vec<String>,)> =
            sqlx::query_as("SELECT grants FROM tenants WHERE tenant = $1")
                .bind(tenant)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(|r| r.0).unwrap_or_default())
    }
}
