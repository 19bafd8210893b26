//! The bench's credentials: every `belay.v1` call is authenticated, so
//! before any engine starts the bench applies the migrations and mints two
//! API keys directly in its fresh database, as `belay-engine create-key`
//! does: an operator key of the bench tenant (registers the definitions,
//! sets the tenant's grants, starts and signals runs) and a worker key for
//! every tenant (the only role `WorkerService` admits). Keys are looked up
//! on every request; nothing here is cached.

use anyhow::{Context, Result};
use belay_engine::auth::{Role, Tenants, mint_key};
use belay_engine::store::Store;

use crate::workload;

/// Who the database records as having made the keys.
const MADE_BY: &str = "belay-bench";
/// The operator key's principal (events name it as who started and
/// signalled the runs).
pub const OPERATOR_PRINCIPAL: &str = "bench-operator";
/// The worker key's principal.
pub const WORKER_PRINCIPAL: &str = "bench-worker";

/// The two keys (`belay_<key id>_<secret>`); `Debug` never prints them.
#[derive(Clone)]
pub struct BenchKeys {
    /// Role `operator` of [`workload::TENANT`] only, holding
    /// [`workload::PERMISSION`] (the caller leg of the no-op tool's check).
    pub operator: String,
    /// Role `worker`, every tenant (a shared pool: its claims are not
    /// narrowed to a tenant list, as before authentication).
    pub worker: String,
}

impl std::fmt::Debug for BenchKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BenchKeys")
            .field("operator", &"<hidden>")
            .field("worker", &"<hidden>")
            .finish()
    }
}

/// Applies the migrations to the database at `database_url` and mints the
/// bench's keys there, on one connection that is closed before returning
/// (so the setup's statistics settle with the rest of the setup's).
///
/// Errors: the database unreachable, a migration failing, or the keys
/// refused.
pub async fn mint(database_url: &str) -> Result<BenchKeys> {
    mint_for(database_url, workload::TENANT, workload::PERMISSION).await
}

/// [`mint`] for another tenant and permission (the chaos harness's): the
/// operator key serves `tenant` only, holding `permission`.
///
/// Errors: as [`mint`].
pub async fn mint_for(database_url: &str, tenant: &str, permission: &str) -> Result<BenchKeys> {
    let store = Store::connect(database_url, 1)
        .await
        .context("connecting to the bench database to make its API keys")?;
    let keys = mint_on(&store, tenant, permission).await;
    store.close().await;
    keys
}

async fn mint_on(store: &Store, tenant: &str, permission: &str) -> Result<BenchKeys> {
    store
        .migrate()
        .await
        .context("applying migrations before making the bench's API keys")?;
    let operator = mint_key(
        store,
        OPERATOR_PRINCIPAL,
        Role::Operator,
        Tenants::Only(vec![tenant.to_owned()]),
        vec![permission.to_owned()],
        MADE_BY,
    )
    .await
    .context("making the bench's operator key")?;
    let worker = mint_key(
        store,
        WORKER_PRINCIPAL,
        Role::Worker,
        Tenants::All,
        Vec::new(),
        MADE_BY,
    )
    .await
    .context("making the bench's worker key")?;
    Ok(BenchKeys { operator, worker })
}
