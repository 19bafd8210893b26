//! Belay as an MCP server (cargo feature `mcp-server`, off by default):
//! chosen workflows of one tenant are served as MCP tools over Streamable
//! HTTP (`POST/GET/DELETE /mcp`) on their own listener (`--mcp-listen`).
//! An agent is served through a workflow whose node runs it.
//!
//! - **Tools.** One tool per workflow named in [`McpServerSettings::workflows`]
//!   (its newest version; the tool's input schema is the workflow's
//!   `input_schema`, or any object), plus [`RUN_STATUS_TOOL`], which reports
//!   on a run an earlier call started.
//! - **Calls.** A call starts a durable run (`StartRun` with the tenant, the
//!   caller `mcp:<token name>` and [`McpServerSettings::caller_grants`]) and
//!   waits for its end at most [`McpServerSettings::wait_ms`]: a completed
//!   run answers with its output (`structuredContent` when it is an object,
//!   always as JSON text), a failed or cancelled one with `isError`; a run
//!   still going answers with a handle (`run_id`, `status`) to ask
//!   [`RUN_STATUS_TOOL`] about later.
//! - **Idempotency.** The run's idempotency key is, in order: the request's
//!   `_meta["io.belay/idempotency-key"]` (as `mcp/<token>/key/<key>`: keys
//!   are the caller's own, never shared with other callers or with runs
//!   started over gRPC); else, on a session (protocol
//!   revisions before 2026-07-28), `mcp/<token>/<session id>/<request id>`,
//!   so a request repeated on its session gets the same run; else a fresh
//!   key (a stateless request id is not unique across clients, so it cannot
//!   name a run).
//! - **Security.** Every request needs `Authorization: Bearer <token>` (the
//!   `name:token[:tenant]` format of admin tokens; a token scoped to another
//!   tenant is refused); `Host` must be one of the allowed hosts (DNS
//!   rebinding) and a present `Origin` one of the allowed origins (none by
//!   default: browsers are refused). Both checks are rmcp's.
//!
//! The only module of the engine that imports `rmcp` (pinned `=3.11.0`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    InitializeResult, JsonObject, ListToolsResult, MetaObject, PaginatedRequestParams,
    ServerCapabilities, Tool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::admin::AdminAuth;
use crate::coordinator::{Coordinator, CoordinatorError, StartRun};
use crate::definitions::model::WorkflowDef;
use crate::error_code::ErrorCode;
use crate::store::RunRow;

/// Path of the MCP endpoint on its listener.
pub const MCP_PATH: &str = "/mcp";
/// The tool that reports on a run an earlier call started.
pub const RUN_STATUS_TOOL: &str = "belay_run_status";
/// `_meta` key of a call's idempotency key (the worker's MCP client sends
/// the same key to the servers it calls).
pub const IDEMPOTENCY_META_KEY: &str = "io.belay/idempotency-key";
/// Default of [`McpServerSettings::wait_ms`].
pub const DEFAULT_WAIT_MS: u64 = 60_000;
/// Longest wait a call may ask for, ms.
pub const MAX_WAIT_MS: u64 = 10 * 60_000;

/// What the MCP server serves and to whom.
#[derive(Debug, Clone)]
pub struct McpServerSettings {
    /// The tenant whose workflows are served and whose runs calls start.
    pub tenant: String,
    /// The workflows served as tools (by name; the newest version).
    pub workflows: Vec<String>,
    /// The grants of a caller over MCP (checked with the node's and the
    /// tenant's, as for every caller).
    pub caller_grants: Vec<String>,
    /// Bearer tokens (`name:token[:tenant]`); must not be empty.
    pub auth: AdminAuth,
    /// Accepted `Host` values (`host` or `host:port`); empty: rmcp's
    /// loopback default (`localhost`, `127.0.0.1`, `::1`).
    pub allowed_hosts: Vec<String>,
    /// Accepted `Origin` values (`scheme://host:port`); a request with any
    /// other `Origin` is refused (none accepted when empty). A request
    /// without `Origin` (not from a browser) passes.
    pub allowed_origins: Vec<String>,
    /// How long a call waits for its run to end before it answers with a
    /// handle, ms.
    pub wait_ms: u64,
}

/// Why the MCP server cannot be served as configured.
#[derive(Debug, thiserror::Error)]
pub enum McpServerError {
    /// A setting is unusable.
    #[error("MCP server: {0}")]
    Config(String),
    /// Serving failed.
    #[error("MCP server I/O error: {0}")]
    Io(#[from] std::io::Error),
}

impl McpServerSettings {
    /// Checks the settings.
    ///
    /// # Errors
    /// [`McpServerError::Config`] naming the setting: no tenant, no
    /// workflow, no token, a token scoped to another tenant, a wait of 0 or
    /// past [`MAX_WAIT_MS`].
    pub fn check(&self) -> Result<(), McpServerError> {
        if self.tenant.trim().is_empty() {
            return Err(McpServerError::Config(
                "--mcp-tenant is required: the tenant whose workflows are served".into(),
            ));
        }
        if self.workflows.iter().all(|w| w.trim().is_empty()) {
            return Err(McpServerError::Config(
                "--mcp-workflows names no workflow to serve".into(),
            ));
        }
        if let Some(w) = self
            .workflows
            .iter()
            .find(|w| w.as_str() == RUN_STATUS_TOOL)
        {
            return Err(McpServerError::Config(format!(
                "a workflow cannot be served as `{w}`: the name is the run status tool's"
            )));
        }
        if self.auth.is_empty() {
            return Err(McpServerError::Config(
                "--mcp-tokens is required: every MCP request needs a bearer token".into(),
            ));
        }
        if let Some(t) = self.auth.tokens().iter().find(|t| !t.allows(&self.tenant)) {
            return Err(McpServerError::Config(format!(
                "token `{}` is scoped to tenant `{}`, not `{}`",
                t.name(),
                t.tenant(),
                self.tenant
            )));
        }
        if self.wait_ms == 0 || self.wait_ms > MAX_WAIT_MS {
            return Err(McpServerError::Config(format!(
                "--mcp-wait-ms must be 1 to {MAX_WAIT_MS}, not {}",
                self.wait_ms
            )));
        }
        Ok(())
    }
}

/// The authenticated caller of a request (put there by the auth layer).
#[derive(Debug, Clone)]
struct Caller {
    token: String,
}

/// The tools: one handler per session (rmcp makes one per session).
#[derive(Clone)]
struct BelayTools {
    coord: Arc<Coordinator>,
    settings: Arc<McpServerSettings>,
}

fn text(value: impl Into<String>) -> ContentBlock {
    ContentBlock::text(value.into())
}

fn internal(e: CoordinatorError) -> ErrorData {
    match &e {
        CoordinatorError::Store(store) => {
            tracing::error!(error = %store, "MCP call failed in the store");
            ErrorData::internal_error(e.public_message(), None)
        }
        other => ErrorData::internal_error(other.to_string(), None),
    }
}

/// `_meta` key of a result: the run the call started (or found).
pub const RUN_ID_META_KEY: &str = "io.belay/run-id";

/// A run as a tool result: the output of a completed run, an error for a
/// failed or cancelled one, a handle otherwise; `_meta` names the run
/// ([`RUN_ID_META_KEY`]).
fn run_result(run: &RunRow) -> CallToolResult {
    let mut meta = JsonObject::new();
    meta.insert(
        RUN_ID_META_KEY.into(),
        Value::String(run.run_id.to_string()),
    );
    run_result_body(run).with_meta(Some(MetaObject(meta)))
}

fn run_result_body(run: &RunRow) -> CallToolResult {
    let handle = json!({
        "run_id": run.run_id.to_string(),
        "status": run.status,
        "status_reason": run.status_reason,
    });
    match run.status.as_str() {
        "completed" => {
            let output = run.output.clone().unwrap_or(Value::Null);
            let mut result = CallToolResult::success(vec![text(output.to_string())]);
            if output.is_object() {
                result.structured_content = Some(output);
            }
            result
        }
        "failed" | "cancelled" => {
            let mut result = CallToolResult::error(vec![text(format!(
                "run {} {}: {}",
                run.run_id, run.status, run.status_reason
            ))]);
            result.structured_content = Some(handle);
            result
        }
        _ => {
            let mut result = CallToolResult::success(vec![text(format!(
                "run {} is {}{}; call `{RUN_STATUS_TOOL}` with {{\"run_id\": \"{}\"}} for its result",
                run.run_id,
                run.status,
                if run.status_reason.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", run.status_reason)
                },
                run.run_id
            ))]);
            result.structured_content = Some(handle);
            result
        }
    }
}

fn finished(status: &str) -> bool {
    matches!(status, "completed" | "failed" | "cancelled")
}

impl BelayTools {
    fn caller(context: &RequestContext<RoleServer>) -> Result<Caller, ErrorData> {
        context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<Caller>())
            .cloned()
            .ok_or_else(|| ErrorData::invalid_request("no authenticated caller", None))
    }

    /// The workflow `name` if it is served, its newest version.
    async fn workflow(&self, name: &str) -> Result<Option<WorkflowDef>, CoordinatorError> {
        if !self.settings.workflows.iter().any(|w| w == name) {
            return Ok(None);
        }
        let Some(row) = self
            .coord
            .store()
            .latest_definition(&self.settings.tenant, "workflow", name)
            .await?
        else {
            return Ok(None);
        };
        serde_json::from_value(row.body).map(Some).map_err(|e| {
            CoordinatorError::Store(crate::store::StoreError::Corrupt(format!(
                "workflow `{name}` does not decode: {e}"
            )))
        })
    }

    /// Waits until the run ends or `wait` passes; returns it as it is then.
    async fn wait_for_end(&self, run: RunRow, wait: Duration) -> Result<RunRow, CoordinatorError> {
        let deadline = tokio::time::Instant::now() + wait;
        // Subscribed before each read, so an end between the two is heard.
        let mut wake = self.coord.subscribe_run_events();
        let mut run = run;
        loop {
            if finished(&run.status) || tokio::time::Instant::now() >= deadline {
                return Ok(run);
            }
            // Wake-ups say "a run changed"; a second's poll covers a missed one.
            let until = deadline.min(tokio::time::Instant::now() + Duration::from_secs(1));
            loop {
                match tokio::time::timeout_at(until, wake.recv()).await {
                    Ok(Ok(id)) if id != run.run_id => continue,
                    _ => break,
                }
            }
            run = self
                .coord
                .get_run(&self.settings.tenant, &run.run_id.to_string())
                .await?;
        }
    }

    async fn start(
        &self,
        workflow: &str,
        request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = Self::caller(context)?;
        let input = Value::Object(request.arguments.clone().unwrap_or_default());
        let meta_key = request
            .meta
            .as_ref()
            .and_then(|m| m.get(IDEMPOTENCY_META_KEY))
            .or_else(|| context.meta.get(IDEMPOTENCY_META_KEY))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let session = context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|p| p.headers.get("mcp-session-id"))
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        // Every key is scoped to the caller's token, so one caller's key can
        // neither return nor reveal another caller's run.
        let key = match (meta_key, session) {
            (Some(key), _) => format!("mcp/{}/key/{key}", caller.token),
            (None, Some(session)) => format!("mcp/{}/{session}/{}", caller.token, context.id),
            (None, None) => format!("mcp/{}/{}", caller.token, uuid::Uuid::new_v4()),
        };
        let started = self
            .coord
            .start_run(StartRun {
                tenant: self.settings.tenant.clone(),
                workflow: workflow.to_owned(),
                input_json: input.to_string(),
                idempotency_key: key.clone(),
                caller: format!("mcp:{}", caller.token),
                caller_grants: self.settings.caller_grants.clone(),
            })
            .await;
        let (run, created) = match started {
            Ok(started) => started,
            // The caller's mistake (input not matching the schema, a key
            // reused for another input): a tool error the caller can read.
            Err(e) if e.code().is_client_error() => {
                return Ok(CallToolResult::error(vec![text(format!(
                    "the run of `{workflow}` was not started: {e}"
                ))]));
            }
            Err(e) => return Err(internal(e)),
        };
        tracing::info!(
            run_id = %run.run_id, workflow, caller = caller.token, created, key,
            "MCP call started a run"
        );
        let run = self
            .wait_for_end(run, Duration::from_millis(self.settings.wait_ms))
            .await
            .map_err(internal)?;
        Ok(run_result(&run))
    }

    async fn status(
        &self,
        request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let caller = Self::caller(context)?;
        let run_id = request
            .arguments
            .as_ref()
            .and_then(|a| a.get("run_id"))
            .and_then(Value::as_str)
            .ok_or_else(|| ErrorData::invalid_params("`run_id` (a string) is required", None))?;
        // Only runs this token started: a token reads no other run.
        let run = match self.coord.get_run(&self.settings.tenant, run_id).await {
            Ok(run) if run.caller == format!("mcp:{}", caller.token) => run,
            Ok(_) | Err(CoordinatorError::NotFound(_)) => {
                return Ok(CallToolResult::error(vec![text(format!(
                    "no run {run_id} was started by this token"
                ))]));
            }
            Err(CoordinatorError::InvalidArgument(m)) => {
                return Err(ErrorData::invalid_params(m, None));
            }
            Err(e) => return Err(internal(e)),
        };
        let wait = request
            .arguments
            .as_ref()
            .and_then(|a| a.get("wait_ms"))
            .and_then(Value::as_u64)
            .unwrap_or(0)
            .min(self.settings.wait_ms);
        let run = self
            .wait_for_end(run, Duration::from_millis(wait))
            .await
            .map_err(internal)?;
        Ok(run_result(&run))
    }
}

fn object(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        _ => JsonObject::new(),
    }
}

impl ServerHandler for BelayTools {
    fn get_info(&self) -> InitializeResult {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("belay", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Each tool starts a durable Belay run of the workflow it names and answers with \
                 the run's output; a run that takes longer answers with its run_id, to ask \
                 `belay_run_status` about.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let mut tools = Vec::new();
        for name in &self.settings.workflows {
            let workflow = match self.workflow(name).await {
                Ok(Some(w)) => w,
                Ok(None) => {
                    tracing::warn!(
                        workflow = name, tenant = %self.settings.tenant,
                        "a workflow served over MCP is not registered; not listed"
                    );
                    continue;
                }
                Err(e) => return Err(internal(e)),
            };
            // MCP tool inputs are objects: a workflow whose input is not
            // declared as one takes any object.
            let schema = workflow
                .input_schema
                .filter(|s| s.get("type").and_then(Value::as_str) == Some("object"))
                .unwrap_or_else(|| json!({"type": "object"}));
            tools.push(Tool::new(
                name.clone(),
                format!(
                    "Runs the Belay workflow `{name}` (a durable run: it survives restarts) and answers with its output, or with its run_id while it is still going."
                ),
                object(schema),
            ));
        }
        tools.push(Tool::new(
            RUN_STATUS_TOOL,
            "The status of a run an earlier call started (and its output once it completed); waits up to `wait_ms` for it to end.",
            object(json!({
                "type": "object",
                "required": ["run_id"],
                "properties": {
                    "run_id": {"type": "string", "description": "The run_id an earlier call answered with."},
                    "wait_ms": {"type": "integer", "minimum": 0, "description": "Wait at most this long for the run to end."},
                },
            })),
        ));
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        let result = if name == RUN_STATUS_TOOL {
            self.status(&request, &context).await?
        } else if self.settings.workflows.contains(&name) {
            self.start(&name, &request, &context).await?
        } else {
            return Err(ErrorData::invalid_params(format!("no tool `{name}`"), None));
        };
        Ok(CallToolResponse::Complete(result))
    }
}

/// Auth layer: a valid bearer token for the tenant, or 401 (nothing else of
/// the request is looked at).
async fn require_token(
    State(settings): State<Arc<McpServerSettings>>,
    mut req: Request,
    next: Next,
) -> Response {
    let token = match settings.auth.authenticate(req.headers()) {
        Ok(token) if token.allows(&settings.tenant) => token.name().to_owned(),
        Ok(_) => {
            return (
                ErrorCode::PermissionDenied.http_status(),
                "the token may not act for this tenant",
            )
                .into_response();
        }
        Err(e) => {
            let mut response = (e.code().http_status(), e.to_string()).into_response();
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static(r#"Bearer realm="belay-mcp""#),
            );
            return response;
        }
    };
    req.extensions_mut().insert(Caller { token });
    next.run(req).await
}

/// The MCP endpoint's router: [`MCP_PATH`] behind the token check.
pub fn router(
    coord: Arc<Coordinator>,
    settings: McpServerSettings,
    cancel: CancellationToken,
) -> Result<Router, McpServerError> {
    settings.check()?;
    let settings = Arc::new(settings);
    let mut config = StreamableHttpServerConfig::default()
        .with_allowed_origins(settings.allowed_origins.clone())
        .enforce_origin_validation();
    if !settings.allowed_hosts.is_empty() {
        config = config.with_allowed_hosts(settings.allowed_hosts.clone());
    }
    config.cancellation_token = cancel;
    let tools = BelayTools {
        coord,
        settings: Arc::clone(&settings),
    };
    let service = StreamableHttpService::new(
        move || Ok(tools.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    Ok(Router::new()
        .nest_service(MCP_PATH, service)
        .layer(middleware::from_fn_with_state(settings, require_token)))
}

/// Serves the MCP endpoint on `listener` until `shutdown` completes.
///
/// # Errors
/// [`McpServerError::Config`] for unusable settings, [`McpServerError::Io`]
/// when serving fails.
pub async fn serve(
    coord: Arc<Coordinator>,
    settings: McpServerSettings,
    listener: impl Into<crate::tls::Listener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), McpServerError> {
    let cancel = CancellationToken::new();
    let app = router(coord, settings, cancel.clone())?;
    let stop = async move {
        shutdown.await;
        // Ends open SSE streams, so the graceful shutdown does not wait on them.
        cancel.cancel();
    };
    crate::tls::serve_http(listener, app, stop).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> McpServerSettings {
        McpServerSettings {
            tenant: "acme".into(),
            workflows: vec!["w".into()],
            caller_grants: vec![],
            auth: AdminAuth::parse("bot:secret-token-0123456789:acme").expect("tokens"),
            allowed_hosts: vec![],
            allowed_origins: vec![],
            wait_ms: DEFAULT_WAIT_MS,
        }
    }

    #[test]
    fn settings_are_checked() {
        assert!(settings().check().is_ok());
        for (change, needle) in [
            (
                Box::new(|s: &mut McpServerSettings| s.tenant.clear())
                    as Box<dyn Fn(&mut McpServerSettings)>,
                "--mcp-tenant",
            ),
            (Box::new(|s| s.workflows.clear()), "names no workflow"),
            (
                Box::new(|s| s.workflows = vec![RUN_STATUS_TOOL.into()]),
                "run status tool",
            ),
            (Box::new(|s| s.auth = AdminAuth::default()), "--mcp-tokens"),
            (
                Box::new(|s| s.auth = AdminAuth::parse("x:tok-0123456789abcdef:other").expect("t")),
                "scoped to tenant `other`",
            ),
            (Box::new(|s| s.wait_ms = 0), "--mcp-wait-ms"),
        ] {
            let mut s = settings();
            change(&mut s);
            let err = s.check().expect_err(needle).to_string();
            assert!(err.contains(needle), "{needle}: {err}");
        }
    }
}
