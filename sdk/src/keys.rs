//! API keys through the admin endpoint (`/admin/v1/keys`): create (the key
//! is returned once), list, revoke. An admin manages every key, an
//! operator those of its own tenants.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::SdkError;
use crate::admin::AdminClient;

/// A key as the admin endpoint lists it: never its secret.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KeyInfo {
    /// The public id (16 hex digits).
    pub key_id: String,
    /// Who it proves.
    pub principal: String,
    /// `client`, `worker`, `approver`, `operator` or `admin`.
    pub role: String,
    /// Tenants it acts for; `["*"]` for every tenant.
    pub tenants: Vec<String>,
    /// Its permissions.
    #[serde(default)]
    pub grants: Vec<String>,
    /// `active`, `revoked` or `expired`.
    pub status: String,
    /// RFC 3339; `None` when it never expires.
    #[serde(default)]
    pub expires_at: Option<String>,
    /// The client-certificate subject it authenticates, if a certificate
    /// principal.
    #[serde(default)]
    pub cert_subject: Option<String>,
    /// Who made it.
    #[serde(default)]
    pub created_by: String,
    /// Fields this version does not know.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Value>,
}

/// A key just made: the key text (shown once) and what it is.
#[derive(Debug, Clone, Deserialize)]
pub struct CreatedKey {
    /// `belay_<key id>_<secret>`; `None` for a certificate principal.
    pub key: Option<String>,
    /// What was stored.
    #[serde(flatten)]
    pub info: KeyInfo,
}

/// What to make ([`AdminClient::create_key`]).
#[derive(Debug, Clone, Default)]
pub struct NewKey {
    /// Who the key proves.
    pub principal: String,
    /// Its role.
    pub role: String,
    /// Its tenants (`["*"]`: every tenant); `None`: the caller's tenant.
    pub tenants: Option<Vec<String>>,
    /// Its grants.
    pub grants: Vec<String>,
    /// Lifetime, seconds; `None`: no expiry.
    pub expires_in_seconds: Option<u64>,
    /// Authenticate this client-certificate subject instead of a key.
    pub cert_subject: Option<String>,
    /// Free text.
    pub description: String,
}

#[derive(Deserialize)]
struct KeyPage {
    items: Vec<KeyInfo>,
}

impl AdminClient {
    /// Create a key. Errors: [`SdkError::Admin`] with the endpoint's code
    /// (`forbidden` when the caller may not make it, `invalid_argument`
    /// naming the field).
    pub async fn create_key(&self, new: &NewKey) -> Result<CreatedKey, SdkError> {
        let mut body = json!({
            "principal": new.principal,
            "role": new.role,
            "grants": new.grants,
            "description": new.description,
        });
        if let Some(t) = &new.tenants {
            body["tenants"] = json!(t);
        }
        if let Some(s) = new.expires_in_seconds {
            body["expires_in_seconds"] = json!(s);
        }
        if let Some(s) = &new.cert_subject {
            body["cert_subject"] = json!(s);
        }
        let url = self.root_url(&["keys"]);
        self.send(self.http().post(url).json(&body)).await
    }

    /// The keys the caller may see; `tenant` narrows.
    pub async fn list_keys(&self, tenant: Option<&str>) -> Result<Vec<KeyInfo>, SdkError> {
        let mut url = self.root_url(&["keys"]);
        if let Some(t) = tenant {
            url.query_pairs_mut().append_pair("tenant", t);
        }
        let page: KeyPage = self.send(self.http().get(url)).await?;
        Ok(page.items)
    }

    /// Revoke a key (idempotent); returns it.
    pub async fn revoke_key(&self, key_id: &str) -> Result<KeyInfo, SdkError> {
        let url = self.root_url(&["keys", key_id, "revoke"]);
        self.send(self.http().post(url)).await
    }
}
