//! The keys `belay dev` serves with: an admin key it prints (or the
//! `--admin-token`, or an admin `--api-key` still valid on this database)
//! and a worker key for its own worker. Keys an earlier `belay dev` made on
//! the same database are revoked, so a dev database does not collect
//! admin keys.

use anyhow::{Context, Result};
use belay_engine::auth::{Credentials, Role, Tenants, mint_key};
use belay_engine::server::Engine;

/// Who `belay dev` records as having made its keys.
const MADE_BY: &str = "belay dev";

/// How the admin acts, and the worker's key.
pub struct DevKeys {
    admin: Admin,
    /// The worker's key (role `worker`, every tenant).
    pub worker: String,
}

enum Admin {
    /// A key made now: printed.
    Made(String),
    /// The `--admin-token`.
    Token,
    /// The `--api-key` given, an admin key of this database.
    Given,
}

impl DevKeys {
    /// The line `belay dev` prints about the admin credential.
    pub fn admin_line(&self) -> String {
        match &self.admin {
            Admin::Made(key) => {
                format!("admin key: {key} (generated; export BELAY_API_KEY={key})")
            }
            Admin::Token => "admin key: the --admin-token (BELAY_ADMIN_TOKEN)".to_owned(),
            Admin::Given => "admin key: the --api-key (BELAY_API_KEY)".to_owned(),
        }
    }
}

/// Make the worker's key, and an admin key unless `admin_token` is set or
/// `api_key` is an admin key of this database; revoke the keys earlier
/// runs of `belay dev` made (but a still-used `api_key`). Errors: the
/// database refusing the keys.
pub async fn issue(engine: &Engine, admin_token: bool, api_key: Option<&str>) -> Result<DevKeys> {
    let store = engine.coordinator().store();
    let given = match api_key.filter(|k| !k.trim().is_empty()) {
        Some(key) => engine
            .authenticator()
            .authenticate(Credentials {
                bearer: Some(key.to_owned()),
                cert_subject: None,
            })
            .await
            .ok()
            .filter(|p| p.role == Role::Admin),
        None => None,
    };
    let keep = given.as_ref().map(|p| p.credential.clone());
    for row in store
        .list_principals(None)
        .await
        .context("reading the keys of the dev database")?
    {
        if row.created_by == MADE_BY
            && row.revoked_at.is_none()
            && Some(&row.key_id) != keep.as_ref()
        {
            store
                .revoke_principal(&row.key_id)
                .await
                .context("revoking an earlier belay dev key")?;
        }
    }
    let admin = if admin_token {
        Admin::Token
    } else if given.is_some() {
        Admin::Given
    } else {
        Admin::Made(mint(engine, "dev-admin", Role::Admin).await?)
    };
    Ok(DevKeys {
        admin,
        worker: mint(engine, "dev-worker", Role::Worker).await?,
    })
}

async fn mint(engine: &Engine, principal: &str, role: Role) -> Result<String> {
    mint_key(
        engine.coordinator().store(),
        principal,
        role,
        Tenants::All,
        Vec::new(),
        MADE_BY,
    )
    .await
    .with_context(|| format!("making the {role} key of belay dev"))
}
