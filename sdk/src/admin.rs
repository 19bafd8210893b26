//! A typed client of the engine's admin HTTP endpoint (`/admin/v1`, JSON,
//! bearer token): list, show and resolve uncertain outcomes; show, pause,
//! resume and cancel runs. Errors carry the server's code and message
//! ([`SdkError::Admin`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::SdkError;

/// An uncertain-outcome record as the admin endpoint returns it. Fields the
/// client does not know yet are kept in `extra` (and printed by `--json`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct UncertainOutcome {
    /// Record id (UUID).
    pub uncertain_id: String,
    /// Tenant.
    pub tenant: String,
    /// Run id.
    pub run_id: String,
    /// Task id.
    pub task_id: String,
    /// Call id within the run.
    pub call_id: String,
    /// Workflow node.
    pub node_id: String,
    /// Tool name.
    pub tool: String,
    /// Tool version.
    pub tool_version: i64,
    /// The exact arguments sent.
    pub arguments: Value,
    /// Idempotency key of the call.
    pub idempotency_key: String,
    /// Every attempt with its timestamps and error.
    pub attempts: Vec<Value>,
    /// Worker that dispatched the call.
    pub worker_id: Option<String>,
    /// Why the outcome is uncertain.
    pub reason: String,
    /// `open` or `resolved`.
    pub status: String,
    /// When recorded (RFC 3339).
    pub created_at: String,
    /// The resolution as stored.
    pub resolution: Option<Value>,
    /// `succeeded`, `failed` or `retry`.
    pub resolution_kind: Option<String>,
    /// Who resolved it.
    pub resolved_by: Option<String>,
    /// When (RFC 3339).
    pub resolved_at: Option<String>,
    /// `operator`, `late_result` or `probe`.
    pub resolved_via: Option<String>,
    /// Why.
    pub resolution_reason: Option<String>,
    /// What a reconcile probe found.
    pub probe: Option<Value>,
    /// Late results that arrived after resolution.
    pub discrepancy: Option<Value>,
    /// Fields added by newer engines.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// One page of uncertain outcomes.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct UncertainPage {
    /// Records, newest first.
    pub items: Vec<UncertainOutcome>,
    /// Token of the next page; `None` on the last page.
    pub next_page_token: Option<String>,
}

/// Filters of [`AdminClient::list_uncertain`]; `None` leaves a filter out.
#[derive(Debug, Clone, Default)]
pub struct UncertainQuery {
    /// `open` (the server's default), `resolved` or `any`.
    pub status: Option<String>,
    /// Tool name.
    pub tool: Option<String>,
    /// Run id.
    pub run_id: Option<String>,
    /// Only records at least this old, ms.
    pub older_than_ms: Option<u64>,
    /// Only records at most this old, ms.
    pub newer_than_ms: Option<u64>,
    /// 1..=500 (server default 50).
    pub page_size: Option<u32>,
    /// From a previous page.
    pub page_token: Option<String>,
}

/// How to resolve an uncertain outcome.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolution {
    /// It took effect; `result` (must match the tool's output type) is the call's result.
    Succeeded(Value),
    /// It failed; the model or workflow sees the message as the tool's failure.
    Failed(String),
    /// Call again: with the same idempotency key, or a new one (`true`) when
    /// the first call surely did nothing.
    Retry {
        /// Use a new idempotency key.
        new_idempotency_key: bool,
    },
}

/// A run as the admin endpoint returns it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct AdminRun {
    /// Run id.
    pub run_id: String,
    /// Tenant.
    pub tenant: String,
    /// Workflow name.
    pub workflow: String,
    /// Workflow version.
    pub workflow_version: i64,
    /// `running`, `paused`, ...
    pub status: String,
    /// Why paused, waiting, failed or cancelled.
    pub status_reason: String,
    /// Input.
    pub input: Value,
    /// Output when completed.
    pub output: Option<Value>,
    /// Idempotency key given at start.
    pub idempotency_key: String,
    /// Caller.
    pub caller: String,
    /// Newest event seq.
    pub last_seq: i64,
    /// Created (RFC 3339).
    pub created_at: String,
    /// Last changed (RFC 3339).
    pub updated_at: String,
    /// Ids of open uncertain outcomes.
    pub open_uncertain_outcomes: Vec<String>,
    /// Fields added by newer engines.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// A client of one engine's admin endpoint, for one tenant. Cheap to clone.
#[derive(Debug, Clone)]
pub struct AdminClient {
    base: reqwest::Url,
    token: String,
    tenant: String,
    http: reqwest::Client,
}

/// The certificates of the PEM file at `path`; at least one.
fn ca_certificates(path: &std::path::Path) -> Result<Vec<reqwest::Certificate>, SdkError> {
    let pem = std::fs::read(path).map_err(|source| SdkError::Io {
        path: path.to_owned(),
        source,
    })?;
    let invalid = |message: String| SdkError::InvalidCaFile {
        path: path.to_owned(),
        message,
    };
    let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| invalid(e.to_string()))?;
    if certs.is_empty() {
        return Err(invalid("no CERTIFICATE block".into()));
    }
    Ok(certs)
}

impl AdminClient {
    /// A client of the admin endpoint at `url` (e.g. `http://127.0.0.1:50052`)
    /// with bearer `token`, acting for `tenant`.
    ///
    /// Errors: [`SdkError::InvalidAdminUrl`], [`SdkError::MissingAdminToken`],
    /// [`SdkError::Http`] when the HTTP client cannot be built.
    pub fn new(url: &str, token: &str, tenant: &str) -> Result<AdminClient, SdkError> {
        AdminClient::with_ca_file(url, token, tenant, None)
    }

    /// [`AdminClient::new`] trusting only the CA certificates (PEM) in
    /// `ca_file` for an `https://` URL (`None`: the system's trust store).
    ///
    /// Errors: as [`AdminClient::new`]; [`SdkError::InvalidAdminUrl`] for a
    /// CA file with an `http://` URL; [`SdkError::Io`] when the file cannot
    /// be read; [`SdkError::InvalidCaFile`] when it holds no certificate.
    pub fn with_ca_file(
        url: &str,
        token: &str,
        tenant: &str,
        ca_file: Option<&std::path::Path>,
    ) -> Result<AdminClient, SdkError> {
        let base = reqwest::Url::parse(url).map_err(|e| SdkError::InvalidAdminUrl {
            url: url.to_owned(),
            message: e.to_string(),
        })?;
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
            return Err(SdkError::InvalidAdminUrl {
                url: url.to_owned(),
                message: "must be an http or https URL".into(),
            });
        }
        if token.trim().is_empty() {
            return Err(SdkError::MissingAdminToken);
        }
        let mut http = reqwest::Client::builder().timeout(std::time::Duration::from_secs(30));
        if let Some(path) = ca_file {
            if base.scheme() != "https" {
                return Err(SdkError::InvalidAdminUrl {
                    url: url.to_owned(),
                    message: "a CA file is set, but the URL is plaintext http://: use https://, or drop the CA file".into(),
                });
            }
            http = http.tls_certs_only(ca_certificates(path)?);
        }
        let http = http.build()?;
        Ok(AdminClient {
            base,
            token: token.trim().to_owned(),
            tenant: tenant.to_owned(),
            http,
        })
    }

    /// The tenant this client acts for.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// `/admin/v1/tenants/<tenant>/<segments...>`, each segment percent-encoded.
    fn url(&self, segments: &[&str]) -> reqwest::Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty()
                .extend(["admin", "v1", "tenants", self.tenant.as_str()])
                .extend(segments);
        }
        url
    }

    /// `/admin/v1/<segments...>`, each segment percent-encoded.
    pub(crate) fn root_url(&self, segments: &[&str]) -> reqwest::Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(["admin", "v1"]).extend(segments);
        }
        url
    }

    /// The HTTP client.
    pub(crate) fn http(&self) -> &reqwest::Client {
        &self.http
    }

    pub(crate) async fn send<T: serde::de::DeserializeOwned>(
        &self,
        req: reqwest::RequestBuilder,
    ) -> Result<T, SdkError> {
        let resp = req.bearer_auth(&self.token).send().await?;
        let status = resp.status();
        let bytes = resp.bytes().await?;
        if status.is_success() {
            return serde_json::from_slice(&bytes).map_err(|source| SdkError::Json {
                what: "the admin endpoint's answer".into(),
                source,
            });
        }
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let error = &body["error"];
        let text = |v: &Value| v.as_str().map(str::to_owned);
        Err(SdkError::Admin {
            status: status.as_u16(),
            code: text(&error["code"]).unwrap_or_else(|| "unknown".into()),
            message: text(&error["message"]).unwrap_or_else(|| {
                let raw = String::from_utf8_lossy(&bytes);
                let raw = raw.trim();
                if raw.is_empty() {
                    status.to_string()
                } else {
                    raw.chars().take(500).collect()
                }
            }),
            details: error["details"]
                .as_array()
                .map(|d| d.iter().filter_map(text).collect())
                .unwrap_or_default(),
        })
    }

    /// A page of uncertain outcomes, newest first.
    pub async fn list_uncertain(&self, q: &UncertainQuery) -> Result<UncertainPage, SdkError> {
        let mut url = self.url(&["uncertain-outcomes"]);
        {
            let mut pairs = url.query_pairs_mut();
            let mut add = |k: &str, v: Option<String>| {
                if let Some(v) = v {
                    pairs.append_pair(k, &v);
                }
            };
            add("status", q.status.clone());
            add("tool", q.tool.clone());
            add("run_id", q.run_id.clone());
            add("older_than_ms", q.older_than_ms.map(|n| n.to_string()));
            add("newer_than_ms", q.newer_than_ms.map(|n| n.to_string()));
            add("page_size", q.page_size.map(|n| n.to_string()));
            add("page_token", q.page_token.clone());
        }
        if url.query() == Some("") {
            url.set_query(None);
        }
        self.send(self.http.get(url)).await
    }

    /// One uncertain outcome.
    pub async fn get_uncertain(&self, id: &str) -> Result<UncertainOutcome, SdkError> {
        self.send(self.http.get(self.url(&["uncertain-outcomes", id])))
            .await
    }

    /// Resolve an uncertain outcome; `reason` is required, `operator` is
    /// recorded as `<token name>/<operator>`. Returns the resolved record.
    pub async fn resolve_uncertain(
        &self,
        id: &str,
        resolution: Resolution,
        reason: &str,
        operator: Option<&str>,
    ) -> Result<UncertainOutcome, SdkError> {
        let mut body = match resolution {
            Resolution::Succeeded(result) => json!({"resolution": "succeeded", "result": result}),
            Resolution::Failed(error) => json!({"resolution": "failed", "error": error}),
            Resolution::Retry {
                new_idempotency_key,
            } => json!({"resolution": "retry", "new_idempotency_key": new_idempotency_key}),
        };
        body["reason"] = json!(reason);
        if let Some(op) = operator {
            body["operator"] = json!(op);
        }
        let url = self.url(&["uncertain-outcomes", id, "resolve"]);
        self.send(self.http.post(url).json(&body)).await
    }

    /// One run.
    pub async fn get_run(&self, run_id: &str) -> Result<AdminRun, SdkError> {
        self.send(self.http.get(self.url(&["runs", run_id]))).await
    }

    /// The tenant's MCP tools (`{"items": [...]}`: per tool its `status`,
    /// `pinned` and `listed` definitions), optionally only those in
    /// `status` (`pinned`, `changed`, `unpinned`, `unlisted`, `any`).
    pub async fn list_mcp_tools(&self, status: Option<&str>) -> Result<Value, SdkError> {
        let mut url = self.url(&["mcp-tools"]);
        if let Some(status) = status {
            url.query_pairs_mut().append_pair("status", status);
        }
        self.send(self.http.get(url)).await
    }

    /// One MCP tool of `server`, with every definition workers reported.
    pub async fn get_mcp_tool(&self, server: &str, tool: &str) -> Result<Value, SdkError> {
        self.send(self.http.get(self.url(&["mcp-tools", server, tool])))
            .await
    }

    /// Accept the reported definition `definition_hash` of `tool` on
    /// `server` for the tenant's runs; returns the tool with its new pin.
    pub async fn accept_mcp_tool(
        &self,
        server: &str,
        tool: &str,
        definition_hash: &str,
        reason: &str,
        operator: Option<&str>,
    ) -> Result<Value, SdkError> {
        let mut body = json!({"definition_hash": definition_hash, "reason": reason});
        if let Some(op) = operator {
            body["operator"] = json!(op);
        }
        let url = self.url(&["mcp-tools", server, tool, "accept"]);
        self.send(self.http.post(url).json(&body)).await
    }

    async fn control(
        &self,
        action: &str,
        run_id: &str,
        reason: &str,
        operator: Option<&str>,
    ) -> Result<AdminRun, SdkError> {
        let mut body = json!({"reason": reason});
        if let Some(op) = operator {
            body["operator"] = json!(op);
        }
        let url = self.url(&["runs", run_id, action]);
        self.send(self.http.post(url).json(&body)).await
    }

    /// Operator pause: the run's tasks are not claimed until resumed.
    pub async fn pause_run(
        &self,
        run_id: &str,
        reason: &str,
        operator: Option<&str>,
    ) -> Result<AdminRun, SdkError> {
        self.control("pause", run_id, reason, operator).await
    }

    /// Lift an operator pause.
    pub async fn resume_run(
        &self,
        run_id: &str,
        reason: &str,
        operator: Option<&str>,
    ) -> Result<AdminRun, SdkError> {
        self.control("resume", run_id, reason, operator).await
    }

    /// Cancel a run.
    pub async fn cancel_run(
        &self,
        run_id: &str,
        reason: &str,
        operator: Option<&str>,
    ) -> Result<AdminRun, SdkError> {
        self.control("cancel", run_id, reason, operator).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_encode_every_segment() {
        let c = AdminClient::new("http://127.0.0.1:50052/", "t", "acme corp/x").expect("client");
        assert_eq!(
            c.url(&["uncertain-outcomes", "a/b", "resolve"]).as_str(),
            "http://127.0.0.1:50052/admin/v1/tenants/acme%20corp%2Fx/uncertain-outcomes/a%2Fb/resolve"
        );
        let c = AdminClient::new("https://h/prefix", "t", "acme").expect("client");
        assert_eq!(
            c.url(&["runs", "r"]).as_str(),
            "https://h/prefix/admin/v1/tenants/acme/runs/r"
        );
        assert!(matches!(
            AdminClient::new("h:1", "t", "a"),
            Err(SdkError::InvalidAdminUrl { .. })
        ));
        assert!(matches!(
            AdminClient::new("http://h", " ", "a"),
            Err(SdkError::MissingAdminToken)
        ));
    }

    #[test]
    fn records_keep_unknown_fields() {
        let r: UncertainOutcome =
            serde_json::from_value(json!({"uncertain_id": "u", "tool": "t", "new_field": 1}))
                .expect("decode");
        assert_eq!(r.extra["new_field"], 1);
        assert_eq!(serde_json::to_value(&r).expect("encode")["new_field"], 1);
    }
}
