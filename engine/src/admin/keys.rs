//! The key routes of the admin endpoint: create an API key (shown once),
//! list keys, revoke one. An admin manages every key; an operator the keys
//! of its own tenants, of any role but `admin`. Revocation takes effect on
//! the key's next request (keys are looked up on every request).

use axum::Json;
use axum::extract::{Extension, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{AdminError, AdminJson, AdminPath, AdminQuery, AppState};
use crate::auth::{Principal, Role, Tenants, key};
use crate::coordinator::CoordinatorError;
use crate::store::{NewPrincipal, PrincipalRow};

/// `GET`: the keys the caller may see (`?tenant=` narrows); `POST`: create one.
pub const KEYS_PATH: &str = "/admin/v1/keys";
/// `POST`: revoke a key (idempotent).
pub const KEY_REVOKE_PATH: &str = "/admin/v1/keys/{key_id}/revoke";

/// Longest principal id, bytes.
pub const MAX_PRINCIPAL_BYTES: usize = 128;
/// Most grants of one key.
pub const MAX_KEY_GRANTS: usize = 256;
/// Longest lifetime of a key: ten years, seconds.
pub const MAX_KEY_LIFETIME_SECS: u64 = 10 * 366 * 24 * 3600;

/// Body of `POST /admin/v1/keys`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateKeyBody {
    /// Who the key proves: letters, digits, `.`, `_`, `-`, `@`.
    principal: String,
    /// `client`, `worker`, `approver`, `operator` or `admin`.
    role: String,
    /// The tenants it may act for; `["*"]` for every tenant. Default: the
    /// caller's tenant, when it has exactly one.
    tenants: Option<Vec<String>>,
    /// Its permissions.
    #[serde(default)]
    grants: Vec<String>,
    #[serde(default)]
    description: String,
    /// Lifetime in seconds from now (database clock); default: none.
    expires_in_seconds: Option<u64>,
    /// Authenticate a client certificate with this RFC 4514 subject
    /// instead of a key (no secret is made).
    cert_subject: Option<String>,
}

/// A key as listed: never its secret or the secret's hash.
#[derive(Debug, Serialize)]
pub(super) struct KeyView {
    key_id: String,
    principal: String,
    role: String,
    /// `["*"]` for every tenant.
    tenants: Vec<String>,
    grants: Vec<String>,
    description: String,
    cert_subject: Option<String>,
    created_by: String,
    created_at: DateTime<Utc>,
    expires_at: Option<DateTime<Utc>>,
    revoked_at: Option<DateTime<Utc>>,
    /// `active`, `revoked` or `expired`.
    status: &'static str,
}

impl From<PrincipalRow> for KeyView {
    fn from(row: PrincipalRow) -> KeyView {
        let status = if row.revoked_at.is_some() {
            "revoked"
        } else if row.expired {
            "expired"
        } else {
            "active"
        };
        KeyView {
            tenants: row.tenants.unwrap_or_else(|| vec!["*".to_owned()]),
            key_id: row.key_id,
            principal: row.principal,
            role: row.role,
            grants: row.grants,
            description: row.description,
            cert_subject: row.cert_subject,
            created_by: row.created_by,
            created_at: row.created_at,
            expires_at: row.expires_at,
            revoked_at: row.revoked_at,
            status,
        }
    }
}

/// Response of `POST /admin/v1/keys`: the key, shown this once.
#[derive(Debug, Serialize)]
pub(super) struct CreatedKey {
    /// `belay_<key id>_<secret>`; `null` for a certificate principal.
    key: Option<String>,
    #[serde(flatten)]
    view: KeyView,
}

/// Query of `GET /admin/v1/keys`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListKeysQuery {
    tenant: Option<String>,
}

/// Response of `GET /admin/v1/keys`.
#[derive(Debug, Serialize)]
pub(super) struct KeysPage {
    items: Vec<KeyView>,
}

pub(super) async fn create_key(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    AdminJson(body): AdminJson<CreateKeyBody>,
) -> Result<(StatusCode, Json<CreatedKey>), AdminError> {
    let new = checked_key(&caller, &body)?;
    if caller.role != Role::Admin {
        check_principal_is_theirs(&state, &caller, &new.principal).await?;
    }
    let secret = match &body.cert_subject {
        Some(_) => None,
        None => Some(key::generate()?),
    };
    let key_id = match &secret {
        Some(k) => k.key_id.clone(),
        None => key::generate()?.key_id,
    };
    let row = state
        .coord
        .store()
        .create_principal(&NewPrincipal {
            key_id,
            secret_sha256: secret.as_ref().map(|k| k.secret_sha256.clone()),
            ..new
        })
        .await
        .map_err(conflict)?;
    tracing::info!(key_id = %row.key_id, principal = %row.principal, role = %row.role, by = %caller.id, "key created");
    Ok((
        StatusCode::CREATED,
        Json(CreatedKey {
            key: secret.map(|k| k.key),
            view: row.into(),
        }),
    ))
}

/// An operator may make a key for a principal id only when every key that
/// id already has is one it manages (not an admin's, within its tenants):
/// otherwise it could make a key that events record as someone else.
async fn check_principal_is_theirs(
    state: &AppState,
    caller: &Principal,
    principal: &str,
) -> Result<(), AdminError> {
    let rows = state
        .coord
        .store()
        .list_principals(None)
        .await
        .map_err(CoordinatorError::from)?;
    let foreign = rows.iter().any(|row| {
        row.principal == principal
            && (row.role == Role::Admin.as_str()
                || !caller
                    .tenants
                    .covers(&Tenants::from_stored(row.tenants.clone())))
    });
    if foreign {
        return Err(AdminError::Forbidden(format!(
            "principal id `{principal}` is in use by keys principal `{}` does not manage; choose another id",
            caller.id
        )));
    }
    Ok(())
}

/// A duplicate certificate subject is the caller's conflict (409); other
/// store errors stay store errors.
fn conflict(e: crate::store::StoreError) -> AdminError {
    match e {
        crate::store::StoreError::Conflict(m) => {
            AdminError::Coordinator(CoordinatorError::Conflict(m))
        }
        other => AdminError::Coordinator(CoordinatorError::Store(other)),
    }
}

/// The row a create request asks for, checked against what `caller` may
/// grant; `key_id` and `secret_sha256` are left for the caller to fill.
fn checked_key(caller: &Principal, body: &CreateKeyBody) -> Result<NewPrincipal, AdminError> {
    check_principal_id(&body.principal)?;
    let role: Role = body.role.parse()?;
    let tenants = requested_tenants(caller, body.tenants.as_deref())?;
    if caller.role != Role::Admin {
        if role == Role::Admin {
            return Err(AdminError::Forbidden(format!(
                "principal `{}` is an operator; only an admin makes admin keys",
                caller.id
            )));
        }
        if !caller.tenants.covers(&tenants) {
            return Err(AdminError::Forbidden(format!(
                "principal `{}` may manage keys of tenant(s) `{}`, not `{tenants}`",
                caller.id, caller.tenants
            )));
        }
        // As a request narrows its key's grants, a key an operator makes
        // holds only grants the operator holds.
        let missing: Vec<&str> = body
            .grants
            .iter()
            .filter(|g| !caller.grants.contains(g))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            return Err(AdminError::Forbidden(format!(
                "principal `{}` does not hold grant(s) {}, so it may not give them",
                caller.id,
                missing.join(", ")
            )));
        }
    }
    if role == Role::Admin && tenants != Tenants::All {
        return Err(AdminError::bad_request(
            "an admin key acts for every tenant: give `tenants: [\"*\"]`, or make an operator key",
        ));
    }
    check_grants(&body.grants)?;
    let expires_in_ms = body
        .expires_in_seconds
        .map(|s| {
            if s == 0 || s > MAX_KEY_LIFETIME_SECS {
                Err(AdminError::bad_request(format!(
                    "`expires_in_seconds` must be 1 to {MAX_KEY_LIFETIME_SECS}"
                )))
            } else {
                Ok(s as i64 * 1000)
            }
        })
        .transpose()?;
    if let Some(subject) = &body.cert_subject {
        check_text("cert_subject", subject, 1024)?;
    }
    check_text_or_empty("description", &body.description, 1024)?;
    Ok(NewPrincipal {
        key_id: String::new(),
        principal: body.principal.clone(),
        role: role.as_str().to_owned(),
        tenants: tenants.to_stored(),
        grants: sorted(&body.grants),
        secret_sha256: None,
        cert_subject: body.cert_subject.clone(),
        description: body.description.clone(),
        created_by: caller.id.clone(),
        expires_in_ms,
    })
}

/// The tenants a key is asked for: `["*"]` is every tenant, absent the
/// caller's only tenant.
fn requested_tenants(caller: &Principal, asked: Option<&[String]>) -> Result<Tenants, AdminError> {
    let Some(list) = asked else {
        return match &caller.tenants {
            Tenants::Only(list) if list.len() == 1 => Ok(caller.tenants.clone()),
            _ => Err(AdminError::bad_request(
                "`tenants` is required: a list of tenant names, or `[\"*\"]` for every tenant",
            )),
        };
    };
    if list == ["*"] {
        return Ok(Tenants::All);
    }
    if list.is_empty() || list.len() > 256 {
        return Err(AdminError::bad_request(
            "`tenants` must hold 1 to 256 tenant names, or be `[\"*\"]`",
        ));
    }
    for t in list {
        if t.is_empty()
            || t.len() > 128
            || t.chars()
                .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '/' | ',' | '*'))
        {
            return Err(AdminError::bad_request(format!(
                "tenant {t:?} must be 1 to 128 bytes without whitespace, `/`, `,` or `*`"
            )));
        }
    }
    let mut list = list.to_vec();
    list.sort();
    list.dedup();
    Ok(Tenants::Only(list))
}

/// Whether `id` is a valid principal id: 1 to [`MAX_PRINCIPAL_BYTES`]
/// letters, digits, `.`, `_`, `-` or `@` (no `/`: events write
/// `<principal>/<who>` for someone acting through a principal).
pub fn valid_principal_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_PRINCIPAL_BYTES
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@'))
}

fn check_principal_id(id: &str) -> Result<(), AdminError> {
    if !valid_principal_id(id) {
        return Err(AdminError::bad_request(format!(
            "`principal` must be 1 to {MAX_PRINCIPAL_BYTES} letters, digits, `.`, `_`, `-` or `@`, got {id:?}"
        )));
    }
    Ok(())
}

fn check_grants(grants: &[String]) -> Result<(), AdminError> {
    if grants.len() > MAX_KEY_GRANTS {
        return Err(AdminError::bad_request(format!(
            "{} grants, more than {MAX_KEY_GRANTS}",
            grants.len()
        )));
    }
    for g in grants {
        check_text("grants[]", g, 256)?;
        if g.contains(char::is_whitespace) {
            return Err(AdminError::bad_request(format!(
                "grant {g:?} contains whitespace"
            )));
        }
    }
    Ok(())
}

fn check_text(field: &str, value: &str, max: usize) -> Result<(), AdminError> {
    if value.trim().is_empty() {
        return Err(AdminError::bad_request(format!("`{field}` is empty")));
    }
    check_text_or_empty(field, value, max)
}

fn check_text_or_empty(field: &str, value: &str, max: usize) -> Result<(), AdminError> {
    if value.len() > max || value.chars().any(char::is_control) {
        return Err(AdminError::bad_request(format!(
            "`{field}` must be at most {max} bytes without control characters"
        )));
    }
    Ok(())
}

fn sorted(grants: &[String]) -> Vec<String> {
    let mut g = grants.to_vec();
    g.sort();
    g.dedup();
    g
}

pub(super) async fn list_keys(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    AdminQuery(query): AdminQuery<ListKeysQuery>,
) -> Result<Json<KeysPage>, AdminError> {
    let tenant = match (&caller.tenants, query.tenant.as_deref()) {
        (Tenants::All, asked) => asked.map(str::to_owned),
        (_, asked) => Some(caller.tenant_for(asked.unwrap_or(""))?),
    };
    let rows = state
        .coord
        .store()
        .list_principals(tenant.as_deref())
        .await
        .map_err(CoordinatorError::from)?;
    Ok(Json(KeysPage {
        items: rows.into_iter().map(KeyView::from).collect(),
    }))
}

pub(super) async fn revoke_key(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    AdminPath(key_id): AdminPath<String>,
) -> Result<Json<KeyView>, AdminError> {
    let store = state.coord.store();
    let not_found = || AdminError::Coordinator(CoordinatorError::NotFound(format!("key {key_id}")));
    let row = store
        .principal_by_key_id(&key_id)
        .await
        .map_err(CoordinatorError::from)?
        .ok_or_else(not_found)?;
    let scope = Tenants::from_stored(row.tenants.clone());
    if caller.role != Role::Admin && (row.role == "admin" || !caller.tenants.covers(&scope)) {
        // Without naming the key's tenants: an operator learns nothing of
        // other tenants' keys.
        return Err(AdminError::Forbidden(format!(
            "principal `{}` may not revoke key {key_id}: it manages keys of tenant(s) `{}` only",
            caller.id, caller.tenants
        )));
    }
    let row = store
        .revoke_principal(&key_id)
        .await
        .map_err(CoordinatorError::from)?
        .ok_or_else(not_found)?;
    state.auth.forget_key(&row.key_id);
    tracing::info!(key_id = %row.key_id, principal = %row.principal, by = %caller.id, "key revoked");
    Ok(Json(row.into()))
}
