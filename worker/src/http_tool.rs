//! Executes `tool_call` tasks whose binding is [`ToolBinding::Http`].
//!
//! A call is done in two steps so that nothing is dispatched that cannot be
//! executed: [`HttpToolClient::prepare`] resolves the endpoint, fills path
//! parameters, splits the remaining arguments into query or body and checks
//! the headers, all without I/O; [`HttpToolClient::execute`] then sends
//! exactly one request (no retry: the engine decides, from the failure class
//! and the tool's repeat safety, whether a call may be repeated).
//!
//! Request shape:
//! - endpoint: absolute `http(s)://` URL, or a path joined to the worker's
//!   HTTP base URL;
//! - `{name}` in the endpoint: replaced by the percent-encoded argument `name`
//!   (string, number or boolean), which is then removed from the arguments;
//! - GET, DELETE, HEAD, OPTIONS and other methods without a body: remaining
//!   top-level arguments become query parameters (arrays repeat the key,
//!   nulls are left out, objects are sent as JSON text);
//! - POST, PUT, PATCH: remaining arguments are the JSON body;
//! - headers: the binding's headers, then `Idempotency-Key` (always, and it
//!   wins over a binding header of the same name);
//! - timeout: the binding's `timeout_ms` for the whole request.
//!
//! A 2xx answer's body is the result: parsed as JSON, a non-JSON body becomes
//! a JSON string, an empty body `null`.
//!
//! Where a request may go ([`crate::ssrf`]): only to public addresses and
//! those the worker's [`NetworkPolicy`] allowlists. An IP-literal host is
//! checked by `prepare` (so the call is refused before dispatch), a host name
//! when it is resolved; either refusal is [`HttpToolError::Refused`], before
//! anything is sent. Redirects are not followed (a 3xx answer is
//! [`HttpToolError::Redirect`]): a followed redirect could lead anywhere,
//! would carry the binding's headers to another host, and would turn a POST
//! into a GET. Proxy variables (`HTTP_PROXY`, …) are ignored for tool
//! requests: behind a proxy the worker could not see where a request goes.
//!
//! [`ToolBinding::AsyncWebhook`] builds the same request (POST, PUT or PATCH
//! only); the callback URL the engine hands out at dispatch is then put into
//! the JSON body at the binding's dot-path `callback_url_field`
//! ([`PreparedRequest::set_callback_url`]), creating objects on the way. The
//! body must then be a JSON object, and every value on the path an object or
//! absent: otherwise the call is refused before dispatch. The 2xx answer is
//! reported as the acceptance; the result comes by callback.

use std::sync::Arc;
use std::time::Duration;

use belay_proto::v1::FailureClass;
use belay_proto::wire::{HttpBinding, ToolBinding, ToolCallSpec};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, LOCATION};
use reqwest::{Method, Url};
use serde_json::{Map, Value};

use crate::http_util::{SendFailure, classify_send_error, error_chain, truncate_text};
use crate::ssrf::{AddressRefused, CheckedResolver, NetworkPolicy};

/// Characters left as they are in a path parameter: RFC 3986 unreserved.
/// Everything else, `/` included, is percent-encoded so that a value stays
/// inside its path segment.
const PATH_SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Connect timeout of tool requests, in ms (the binding's `timeout_ms` still
/// bounds the whole request). A connect that times out sent nothing, so it is
/// classified `NOT_SENT`.
const CONNECT_TIMEOUT_MS: u64 = 10_000;

/// Header carrying [`ToolCallSpec::idempotency_key`] on every request.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";

/// Why an HTTP tool call failed. [`HttpToolError::class`] says whether the
/// tool may have acted.
#[derive(Debug, thiserror::Error)]
pub enum HttpToolError {
    /// The binding or the arguments cannot make a request (relative endpoint
    /// and no base URL, missing path parameter, bad header, unknown method).
    /// Detected before dispatch; the call never starts. Class `REJECTED`.
    #[error("the HTTP tool call cannot be made: {0}")]
    Config(String),
    /// The host is, or resolves to, a non-public address the worker's
    /// [`NetworkPolicy`] does not allow (see [`crate::ssrf`]). Nothing was
    /// sent, and repeating changes nothing. Class `REJECTED`.
    #[error("{0}")]
    Refused(#[from] AddressRefused),
    /// Connection refused, DNS failure, TLS failure or connect timeout: nothing
    /// was sent. Class `NOT_SENT`.
    #[error("could not connect to the tool endpoint, nothing was sent: {0}")]
    Connect(String),
    /// The whole-request timeout fired; the request may have been sent. Class
    /// `MAY_HAVE_ACTED`.
    #[error("tool call timed out after {timeout_ms} ms: {message}")]
    Timeout {
        /// The binding's timeout, in ms.
        timeout_ms: u64,
        /// Transport error chain.
        message: String,
    },
    /// The connection failed after the request was sent, or a 2xx body could
    /// not be read. Class `MAY_HAVE_ACTED`.
    #[error("tool call failed after the request was sent: {0}")]
    Transport(String),
    /// The endpoint answered with a status neither 2xx nor 3xx. Class: 429 `NOT_SENT`;
    /// other 4xx `REJECTED`; 5xx (and 1xx) `NOT_SENT` for
    /// GET/HEAD/OPTIONS/TRACE, which by HTTP semantics have no effect, and
    /// `MAY_HAVE_ACTED` for every other method.
    #[error("tool endpoint answered {method} with HTTP {status}: {body}")]
    Status {
        /// Request method, upper case.
        method: String,
        /// HTTP status code.
        status: u16,
        /// Response body as text, truncated to 4 KiB.
        body: String,
    },
    /// The endpoint answered with a redirect (3xx), which tool requests do
    /// not follow. Class: `REJECTED` for GET/HEAD/OPTIONS/TRACE (no effect,
    /// and the same request gets the same answer); `MAY_HAVE_ACTED` for
    /// every other method (a 303 after a POST says it acted).
    #[error(
        "tool endpoint answered {method} with HTTP {status}, a redirect to {location}; \
         tool requests do not follow redirects: point the tool at the final URL"
    )]
    Redirect {
        /// Request method, upper case.
        method: String,
        /// HTTP status code (300 to 399).
        status: u16,
        /// The `Location` header as text (truncated), or `<none>`.
        location: String,
    },
}

impl HttpToolError {
    /// The HTTP status when the tool answered with one (a reconcile probe's
    /// 404 means "definitely not found").
    pub fn status_code(&self) -> Option<u16> {
        match self {
            Self::Status { status, .. } | Self::Redirect { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The failure class to report in `FailTask`.
    pub fn class(&self) -> FailureClass {
        match self {
            Self::Config(_) | Self::Refused(_) => FailureClass::Rejected,
            Self::Connect(_) => FailureClass::NotSent,
            Self::Timeout { .. } | Self::Transport(_) => FailureClass::MayHaveActed,
            Self::Status { method, status, .. } => {
                if *status == 429 {
                    FailureClass::NotSent
                } else if (400..500).contains(status) {
                    FailureClass::Rejected
                } else if is_safe_method(method) {
                    FailureClass::NotSent
                } else {
                    FailureClass::MayHaveActed
                }
            }
            Self::Redirect { method, .. } => {
                if is_safe_method(method) {
                    FailureClass::Rejected
                } else {
                    FailureClass::MayHaveActed
                }
            }
        }
    }
}

fn is_safe_method(method: &str) -> bool {
    matches!(method, "GET" | "HEAD" | "OPTIONS" | "TRACE")
}

fn has_body(method: &Method) -> bool {
    *method == Method::POST || *method == Method::PUT || *method == Method::PATCH
}

/// A request ready to send, built by [`HttpToolClient::prepare`].
#[derive(Debug, Clone)]
pub struct PreparedRequest {
    method: Method,
    url: Url,
    headers: HeaderMap,
    body: Option<Vec<u8>>,
    timeout_ms: u64,
    /// `callback_url_field` of an async webhook: the callback URL goes here.
    callback_url_field: Option<String>,
}

/// Put `url` into `body` (a JSON object) at the dot-path `field`, creating
/// objects on the way. Errors name the segment that is not an object.
fn inject_at(body: &mut Value, field: &str, url: &str) -> Result<(), String> {
    let mut at = body;
    let segments: Vec<&str> = field.split('.').collect();
    for (i, seg) in segments.iter().enumerate() {
        let path = segments[..=i].join(".");
        let Value::Object(map) = at else {
            return Err(format!(
                "cannot put the callback URL at `{field}`: the value before `{seg}` is not a JSON object"
            ));
        };
        if i + 1 == segments.len() {
            map.insert((*seg).to_owned(), Value::String(url.to_owned()));
            return Ok(());
        }
        let next = map
            .entry((*seg).to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
        if !next.is_object() {
            return Err(format!(
                "cannot put the callback URL at `{field}`: `{path}` is {}, not an object",
                json_kind(next)
            ));
        }
        at = next;
    }
    Err(format!("`callback_url_field` {field:?} is empty"))
}

impl PreparedRequest {
    /// The request method.
    pub fn method(&self) -> &Method {
        &self.method
    }

    /// The full URL, path parameters and query included.
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// The JSON body, for POST, PUT and PATCH.
    pub fn body(&self) -> Option<&[u8]> {
        self.body.as_deref()
    }

    /// For a `type: async_webhook` request: put the callback URL from the
    /// dispatch into the body at the binding's `callback_url_field`.
    /// [`HttpToolError::Config`] if the request is not an async webhook or
    /// the body cannot hold it (both are refused by `prepare` already).
    pub fn set_callback_url(&mut self, url: &str) -> Result<(), HttpToolError> {
        let Some(field) = self.callback_url_field.as_deref() else {
            return Err(config("this request takes no callback URL"));
        };
        let mut body: Value = match self.body.as_deref() {
            Some(bytes) => serde_json::from_slice(bytes)
                .map_err(|e| config(format!("the request body is not JSON: {e}")))?,
            None => return Err(config("an async webhook request needs a body")),
        };
        inject_at(&mut body, field, url).map_err(config)?;
        self.body = Some(
            serde_json::to_vec(&body)
                .map_err(|e| config(format!("cannot encode the body: {e}")))?,
        );
        Ok(())
    }

    /// Whether the request waits for a callback URL ([`Self::set_callback_url`]).
    pub fn wants_callback_url(&self) -> bool {
        self.callback_url_field.is_some()
    }
}

/// Executes HTTP tool calls. Cheap to clone (the connection pool is shared).
#[derive(Debug, Clone)]
pub struct HttpToolClient {
    http: reqwest::Client,
    base_url: Option<String>,
    policy: Arc<NetworkPolicy>,
}

impl HttpToolClient {
    /// A client that joins path endpoints to `base_url` (e.g.
    /// `http://tools.internal:8080/api`) and reaches only the addresses
    /// `policy` allows (a base URL on a private network needs its block
    /// allowlisted too). Fails only if the HTTP client cannot be built.
    pub fn new(base_url: Option<String>, policy: NetworkPolicy) -> Result<Self, HttpToolError> {
        let policy = Arc::new(policy);
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(CONNECT_TIMEOUT_MS))
            .user_agent(concat!("belay-worker/", env!("CARGO_PKG_VERSION")))
            .dns_resolver(CheckedResolver::new(Arc::clone(&policy)))
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .build()
            .map_err(|e| HttpToolError::Config(error_chain(&e)))?;
        Ok(Self {
            http,
            base_url: base_url.filter(|b| !b.trim().is_empty()),
            policy,
        })
    }

    /// Builds the request for `spec` without any I/O. Every error is
    /// [`HttpToolError::Config`], or [`HttpToolError::Refused`] for an
    /// IP-literal host the policy refuses: the call must not be dispatched.
    pub fn prepare(&self, spec: &ToolCallSpec) -> Result<PreparedRequest, HttpToolError> {
        let request = self.prepare_binding(spec)?;
        self.policy.check_url(&request.url)?;
        Ok(request)
    }

    fn prepare_binding(&self, spec: &ToolCallSpec) -> Result<PreparedRequest, HttpToolError> {
        match &spec.binding {
            ToolBinding::Http(binding) => prepare_http(
                binding,
                &spec.arguments,
                &spec.idempotency_key,
                self.base_url.as_deref(),
            ),
            ToolBinding::AsyncWebhook(binding) => {
                let mut request = prepare_http(
                    &binding.http,
                    &spec.arguments,
                    &spec.idempotency_key,
                    self.base_url.as_deref(),
                )?;
                if !has_body(&request.method) {
                    return Err(config(format!(
                        "an async webhook is sent with POST, PUT or PATCH, not {}",
                        request.method
                    )));
                }
                request.callback_url_field = Some(binding.callback_url_field.clone());
                // Try the injection now, so a body that cannot carry the URL
                // is refused before dispatch.
                let mut trial = request.clone();
                trial.set_callback_url("https://callback.invalid/")?;
                Ok(request)
            }
            ToolBinding::Mcp(binding) => Err(config(format!(
                "tool `{}` is `type: mcp` (server `{}`): it is called by the MCP client, not over HTTP",
                spec.tool, binding.server
            ))),
        }
    }

    /// Sends `request` once and returns the result value. See the module docs
    /// for how the body becomes a value and [`HttpToolError`] for failures.
    pub async fn execute(&self, request: PreparedRequest) -> Result<Value, HttpToolError> {
        // `prepare` checked it, but maybe on a client with another policy.
        self.policy.check_url(&request.url)?;
        let method = request.method.as_str().to_owned();
        let timeout_ms = request.timeout_ms;
        let mut builder = self
            .http
            .request(request.method, request.url)
            .headers(request.headers)
            .timeout(Duration::from_millis(timeout_ms));
        if let Some(body) = request.body {
            builder = builder.body(body);
        }
        let send_error = |e: &reqwest::Error| {
            if let Some(refused) = address_refused(e) {
                return HttpToolError::Refused(refused.clone());
            }
            let message = error_chain(e);
            match classify_send_error(e) {
                SendFailure::NotSent if e.is_builder() => HttpToolError::Config(message),
                SendFailure::NotSent => HttpToolError::Connect(message),
                SendFailure::Timeout => HttpToolError::Timeout {
                    timeout_ms,
                    message,
                },
                SendFailure::AfterSend => HttpToolError::Transport(message),
            }
        };
        let response = builder.send().await.map_err(|e| send_error(&e))?;
        let status = response.status();
        if status.is_success() {
            // The tool acted; losing the body now loses the result, so any
            // error here is MAY_HAVE_ACTED (timeout or transport).
            let bytes = response.bytes().await.map_err(|e| send_error(&e))?;
            return Ok(body_value(&bytes));
        }
        if status.is_redirection() {
            let location = response.headers().get(LOCATION).map_or_else(
                || "<none>".to_owned(),
                |v| truncate_text(&String::from_utf8_lossy(v.as_bytes())),
            );
            return Err(HttpToolError::Redirect {
                method,
                status: status.as_u16(),
                location,
            });
        }
        let body = match response.text().await {
            Ok(text) => truncate_text(&text),
            Err(e) => format!("<body unreadable: {}>", error_chain(&e)),
        };
        Err(HttpToolError::Status {
            method,
            status: status.as_u16(),
            body,
        })
    }

    /// [`prepare`](Self::prepare) then [`execute`](Self::execute).
    pub async fn call(&self, spec: &ToolCallSpec) -> Result<Value, HttpToolError> {
        let request = self.prepare(spec)?;
        self.execute(request).await
    }
}

/// The policy's refusal, when that is why `err` happened: the resolver's
/// error comes back wrapped in the connector's and the client's.
fn address_refused(err: &reqwest::Error) -> Option<&AddressRefused> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(inner) = source {
        if let Some(refused) = inner.downcast_ref::<AddressRefused>() {
            return Some(refused);
        }
        source = inner.source();
    }
    None
}

/// A 2xx body as the tool's result: JSON if it parses, else a JSON string of
/// the (lossily decoded) text; empty or blank → `null`.
fn body_value(bytes: &[u8]) -> Value {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Value::Null;
    }
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
}

fn config(message: impl Into<String>) -> HttpToolError {
    HttpToolError::Config(message.into())
}

fn prepare_http(
    binding: &HttpBinding,
    arguments: &Value,
    idempotency_key: &str,
    base_url: Option<&str>,
) -> Result<PreparedRequest, HttpToolError> {
    let method = Method::from_bytes(binding.method.trim().to_ascii_uppercase().as_bytes())
        .map_err(|_| config(format!("invalid HTTP method {:?}", binding.method)))?;
    if binding.timeout_ms == 0 {
        return Err(config("timeout_ms must be greater than 0"));
    }

    // Arguments as an object we can take path parameters out of. `null`
    // counts as no arguments.
    let mut remaining: Option<Map<String, Value>> = match arguments {
        Value::Object(map) => Some(map.clone()),
        Value::Null => Some(Map::new()),
        _ => None,
    };
    let endpoint = fill_path_params(&binding.endpoint, &mut remaining)?;
    let mut url = resolve_endpoint(&endpoint, base_url)?;

    let body = if has_body(&method) {
        let value = match remaining {
            Some(map) => Value::Object(map),
            None => arguments.clone(),
        };
        Some(
            serde_json::to_vec(&value)
                .map_err(|e| config(format!("cannot encode the arguments: {e}")))?,
        )
    } else {
        let Some(map) = remaining else {
            return Err(config(format!(
                "arguments of a {method} tool must be a JSON object, got {}",
                json_kind(arguments)
            )));
        };
        if !map.is_empty() {
            let mut pairs = url.query_pairs_mut();
            for (key, value) in &map {
                match value {
                    Value::Array(items) => {
                        for item in items {
                            if let Some(text) = query_text(item) {
                                pairs.append_pair(key, &text);
                            }
                        }
                    }
                    other => {
                        if let Some(text) = query_text(other) {
                            pairs.append_pair(key, &text);
                        }
                    }
                }
            }
        }
        None
    };

    let mut headers = HeaderMap::new();
    headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
    if body.is_some() {
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    }
    for (name, value) in &binding.headers {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| config(format!("invalid header name {name:?}")))?;
        // The value is not echoed: binding headers often carry credentials.
        let value = HeaderValue::from_str(value)
            .map_err(|_| config(format!("invalid value for header {name}")))?;
        headers.insert(name, value);
    }
    let key = HeaderValue::from_str(idempotency_key)
        .map_err(|_| config("the idempotency key is not a valid header value"))?;
    headers.insert(HeaderName::from_static(IDEMPOTENCY_KEY_HEADER), key);

    Ok(PreparedRequest {
        method,
        url,
        headers,
        body,
        timeout_ms: binding.timeout_ms,
        callback_url_field: None,
    })
}

/// Replaces each `{name}` in `endpoint` with the percent-encoded argument and
/// removes that argument from `remaining`.
fn fill_path_params(
    endpoint: &str,
    remaining: &mut Option<Map<String, Value>>,
) -> Result<String, HttpToolError> {
    let mut out = String::with_capacity(endpoint.len());
    let mut rest = endpoint;
    while let Some(open) = rest.find('{') {
        let Some(len) = rest[open..].find('}') else {
            break;
        };
        let name = &rest[open + 1..open + len];
        out.push_str(&rest[..open]);
        rest = &rest[open + len + 1..];
        let Some(args) = remaining.as_mut() else {
            return Err(config(format!(
                "path parameter {{{name}}} needs object arguments"
            )));
        };
        let value = args
            .remove(name)
            .ok_or_else(|| config(format!("missing path parameter {{{name}}}")))?;
        let text = match &value {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            other => {
                return Err(config(format!(
                    "path parameter {{{name}}} must be a string, number or boolean, got {}",
                    json_kind(other)
                )));
            }
        };
        // URL parsing resolves dot segments, and `%2E` counts as a dot, so
        // `..` would climb out of the endpoint's path whatever the encoding.
        if text.is_empty() || text == "." || text == ".." {
            return Err(config(format!(
                "path parameter {{{name}}} must not be {text:?}"
            )));
        }
        out.extend(utf8_percent_encode(&text, PATH_SEGMENT));
    }
    out.push_str(rest);
    Ok(out)
}

fn resolve_endpoint(endpoint: &str, base_url: Option<&str>) -> Result<Url, HttpToolError> {
    let lower = endpoint.trim_start().to_ascii_lowercase();
    let full = if lower.starts_with("http://") || lower.starts_with("https://") {
        endpoint.trim().to_owned()
    } else {
        let Some(base) = base_url else {
            return Err(config(format!(
                "endpoint {endpoint:?} is a path and the worker has no HTTP base URL \
                 (set --http-base-url / BELAY_HTTP_BASE_URL)"
            )));
        };
        // Plain concatenation, not RFC 3986 resolution, so that a base URL
        // with a path (`http://host/api`) keeps it.
        format!(
            "{}/{}",
            base.trim().trim_end_matches('/'),
            endpoint.trim().trim_start_matches('/')
        )
    };
    let url = Url::parse(&full).map_err(|e| config(format!("invalid URL {full:?}: {e}")))?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(config(format!("unsupported URL scheme in {full:?}")));
    }
    Ok(url)
}

/// Text of one query value; `None` leaves it out.
fn query_text(value: &Value) -> Option<String> {
    match value {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        other => Some(other.to_string()),
    }
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;

    fn binding(endpoint: &str, method: &str) -> HttpBinding {
        HttpBinding {
            endpoint: endpoint.to_owned(),
            method: method.to_owned(),
            headers: BTreeMap::new(),
            timeout_ms: 1000,
            request: Default::default(),
        }
    }

    #[test]
    fn path_params_are_encoded_and_removed() {
        let req = prepare_http(
            &binding("/users/{id}/files/{name}", "GET"),
            &json!({"id": "a/b c", "name": 7, "q": "x"}),
            "key-1",
            Some("http://h:1/api/"),
        )
        .unwrap();
        assert_eq!(
            req.url().as_str(),
            "http://h:1/api/users/a%2Fb%20c/files/7?q=x"
        );
    }

    #[test]
    fn dot_segments_and_objects_are_refused_as_path_params() {
        for value in [json!(".."), json!("."), json!({"a": 1}), json!(null)] {
            let err = prepare_http(
                &binding("http://h/u/{id}", "GET"),
                &json!({"id": value}),
                "k",
                None,
            )
            .unwrap_err();
            assert_eq!(err.class(), FailureClass::Rejected, "{err}");
        }
    }

    #[test]
    fn relative_endpoint_without_base_is_a_rejected_config_error() {
        let err = prepare_http(&binding("/x", "GET"), &json!({}), "k", None).unwrap_err();
        assert!(matches!(err, HttpToolError::Config(_)));
        assert_eq!(err.class(), FailureClass::Rejected);
    }

    #[test]
    fn missing_path_param_is_rejected() {
        let err =
            prepare_http(&binding("http://h/u/{id}", "POST"), &json!({}), "k", None).unwrap_err();
        assert!(
            err.to_string().contains("missing path parameter {id}"),
            "{err}"
        );
    }

    #[test]
    fn query_arrays_repeat_and_nulls_are_left_out() {
        let req = prepare_http(
            &binding("http://h/s?fixed=1", "delete"),
            &json!({"tag": ["a", "b"], "n": 2, "flag": true, "none": null}),
            "k",
            None,
        )
        .unwrap();
        assert_eq!(req.method(), Method::DELETE);
        // serde_json's map order depends on its features; compare as a set.
        let mut pairs: Vec<String> = req
            .url()
            .query_pairs()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        assert_eq!(pairs.first().map(String::as_str), Some("fixed=1"));
        pairs.sort();
        assert_eq!(pairs, ["fixed=1", "flag=true", "n=2", "tag=a", "tag=b"]);
        assert!(req.body().is_none());
    }

    #[test]
    fn status_classes() {
        let status = |method: &str, status: u16| {
            HttpToolError::Status {
                method: method.to_owned(),
                status,
                body: String::new(),
            }
            .class()
        };
        assert_eq!(status("POST", 503), FailureClass::MayHaveActed);
        assert_eq!(status("DELETE", 500), FailureClass::MayHaveActed);
        assert_eq!(status("GET", 503), FailureClass::NotSent);
        assert_eq!(status("GET", 429), FailureClass::NotSent);
        assert_eq!(status("POST", 429), FailureClass::NotSent);
        assert_eq!(status("POST", 404), FailureClass::Rejected);
        assert_eq!(status("GET", 400), FailureClass::Rejected);
    }

    #[test]
    fn body_values() {
        assert_eq!(body_value(b""), Value::Null);
        assert_eq!(body_value(b" \n"), Value::Null);
        assert_eq!(body_value(b"{\"a\":1}"), json!({"a": 1}));
        assert_eq!(body_value(b"plain text"), json!("plain text"));
    }
}
