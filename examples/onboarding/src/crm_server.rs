//! The CRM behind the onboarding example's tools, as an in-memory HTTP server.
//!
//! Service endpoints (what the tools call):
//!
//! - `POST /customers/lookup` `{email}` → `200 {found: false}` or
//!   `200 {found: true, customer_id, name}` for the seeded customers
//!   ([`SEEDED_CUSTOMERS`]).
//! - `POST /accounts` `{email, name, plan}` → `201 {account_id}`; `plan` may be
//!   left out ([`DEFAULT_PLAN`]).
//! - `POST /emails/welcome` `{email, account_id, plan?}` → `200 {message_id}`,
//!   or `404` if the account does not exist. The email names `plan` when given
//!   (the plan an approver approved, which may differ from the account's).
//! - `POST /emails/reminder` `{email, account_id, reminder?}` → `200
//!   {message_id}` (`rem_NNNNNN`), or `404` if the account does not exist:
//!   "please upload your documents", `reminder` counting from 1.
//! - `POST /kyc/checks` `{account_id, email, name, files}` → `200 {check_id,
//!   status}`, or `404` if the account does not exist. `status` is `review`
//!   when `files` is empty or the email's local part contains `+review`
//!   ([`kyc_status`]), else `clear`. With a `callbackUrl` (a `type:
//!   async_webhook` call), it answers `202 {check_id, status: "pending"}`
//!   at once and POSTs `{check_id, status}` to `callbackUrl` afterwards, as a
//!   KYC provider does (retrying connection failures and 5xx for about two minutes);
//!   a repeated idempotency key gets the first answer and no second callback.
//! - `GET /accounts/by-idempotency-key/{key}` → `200 {account_id, ...}` or
//!   `404 {"error": "not_found"}`: a read-only lookup to reconcile an uncertain
//!   account creation.
//!
//! Every `POST` except the lookup honours an `Idempotency-Key` header: a
//! repeated key with the same request returns the first response and has no
//! second effect; a repeated key with a different request is refused with
//! `409`, since it means the caller reused a key for another call. Requests
//! without the header are never deduplicated, so a double dispatch shows up as
//! two accounts.
//!
//! Invalid JSON, missing or mistyped fields get `400` with a JSON body
//! `{error, message}`. Identifiers are sequential (`acct_000001`,
//! `msg_000001`) so runs are reproducible.
//!
//! Control endpoints for tests, all under `/_` and never recorded:
//!
//! - `GET /_requests[?path=P]`: every service request in arrival order.
//! - `GET /_wait?path=P&count=N&timeout_ms=T`: long-poll until `N` requests to
//!   `P` (any path if omitted) have been recorded: `200 {count}`, or
//!   `408 {count, error}` after `T` ms (default 10000).
//! - `POST /_faults {path, action, times}`, `GET /_faults`, `DELETE /_faults`:
//!   see [`FaultAction`].
//!   A fault path ending in `*` matches every path with that prefix.
//! - `POST /_release`: answer the requests held by `hold_after_effect`.
//! - `GET /_state`: the accounts, emails and KYC checks ([`CrmSnapshot`]).
//! - `GET /_callbacks`: callbacks sent so far ([`SentCallback`]) and how many
//!   are held; `POST /_callbacks/hold {hold}`: hold new callbacks (or stop
//!   holding); `POST /_callbacks/send`: send the held ones now; `POST
//!   /_callbacks/replay`: send the last callback again (same URL and body)
//!   and answer with what its receiver said.
//!
//! A request is recorded, its fault chosen and its effect applied in one
//! critical section, and only then are `/_wait` callers woken: when `/_wait`
//! answers, the effects of the requests it counted are visible in `/_state`.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{ConnectInfo, Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::conn::{ConnHandle, Stopper};

/// The customers `POST /customers/lookup` finds: `(email, customer_id, name)`.
pub const SEEDED_CUSTOMERS: &[(&str, &str, &str)] = &[
    ("known@example.com", "cust_000001", "Known Customer"),
    ("ada@example.com", "cust_000002", "Ada Lovelace"),
    ("grace@example.com", "cust_000003", "Grace Hopper"),
];

/// The plan of an account created without one (the `create_account` tool's
/// declared default).
pub const DEFAULT_PLAN: &str = "starter";

/// `/_wait`'s timeout when `timeout_ms` is not given.
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest `/_wait` accepts, so a typo cannot park a request for days.
pub const MAX_WAIT_TIMEOUT: Duration = Duration::from_secs(3600);

const ACCOUNTS: &str = "/accounts";
const LOOKUP: &str = "/customers/lookup";
const WELCOME: &str = "/emails/welcome";
const REMINDER: &str = "/emails/reminder";
const KYC: &str = "/kyc/checks";
const BY_KEY_PREFIX: &str = "/accounts/by-idempotency-key/";

/// One service request as received, for `GET /_requests`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedRequest {
    /// Arrival order, from 1.
    pub seq: u64,
    /// The HTTP method.
    pub method: String,
    /// The request path, as sent (without the query).
    pub path: String,
    /// The `Idempotency-Key` header, if present and valid text.
    pub idempotency_key: Option<String>,
    /// The body as JSON: `null` when empty, the raw text as a JSON string when
    /// it is not valid JSON.
    pub body: Value,
    /// The fault applied to this request, if any.
    pub fault: Option<FaultAction>,
    /// The HTTP status answered; `None` for a hung request.
    pub status: Option<u16>,
    /// The W3C `traceparent` header, if present and valid text (the
    /// trace tests check the worker's propagation with it).
    #[serde(default)]
    pub traceparent: Option<String>,
}

/// An account created by `POST /accounts`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Account {
    /// `acct_NNNNNN`, sequential.
    pub account_id: String,
    /// The account's email.
    pub email: String,
    /// The account holder's name.
    pub name: String,
    /// The plan.
    pub plan: String,
    /// The `Idempotency-Key` of the creating request, if any.
    pub idempotency_key: Option<String>,
    /// The `seq` of the creating request.
    pub request_seq: u64,
}

/// A welcome email sent by `POST /emails/welcome`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WelcomeEmail {
    /// `msg_NNNNNN`, sequential.
    pub message_id: String,
    /// The recipient.
    pub email: String,
    /// The account welcomed.
    pub account_id: String,
    /// The plan the email names, if the request gave one.
    #[serde(default)]
    pub plan: Option<String>,
    /// The `Idempotency-Key` of the sending request, if any.
    pub idempotency_key: Option<String>,
    /// The `seq` of the sending request.
    pub request_seq: u64,
}

/// A reminder to upload documents, sent by `POST /emails/reminder`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReminderEmail {
    /// `rem_NNNNNN`, sequential.
    pub message_id: String,
    /// The recipient.
    pub email: String,
    /// The account.
    pub account_id: String,
    /// Which reminder this is for the account, from 1 (as the caller says).
    pub reminder: u64,
    /// The `Idempotency-Key` of the sending request, if any.
    pub idempotency_key: Option<String>,
    /// The `seq` of the sending request.
    pub request_seq: u64,
}

/// An identity check run by `POST /kyc/checks`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KycCheck {
    /// `kyc_NNNNNN`, sequential.
    pub check_id: String,
    /// The account checked.
    pub account_id: String,
    /// The customer's email.
    pub email: String,
    /// The customer's name.
    pub name: String,
    /// The documents checked.
    pub files: Vec<String>,
    /// `clear` or `review` ([`kyc_status`]).
    pub status: String,
    /// The `Idempotency-Key` of the request, if any.
    pub idempotency_key: Option<String>,
    /// The `seq` of the request.
    pub request_seq: u64,
}

/// A callback the CRM sent (`GET /_callbacks`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SentCallback {
    /// Where it went.
    pub url: String,
    /// What it carried.
    pub body: Value,
    /// The receiver's HTTP status, if it answered.
    pub status: Option<u16>,
    /// The receiver's answer (JSON, or its text as a JSON string).
    pub response: Value,
    /// Attempts made (connection failures and 5xx are retried).
    pub attempts: u32,
}

/// Callbacks sent and held, for `GET /_callbacks`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CallbackLog {
    /// Sent callbacks, in the order they finished.
    pub sent: Vec<SentCallback>,
    /// Callbacks waiting for `POST /_callbacks/send`.
    pub held: usize,
}

/// Everything the CRM has created, for `GET /_state`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CrmSnapshot {
    /// Accounts, in creation order.
    pub accounts: Vec<Account>,
    /// Welcome emails, in sending order.
    pub emails: Vec<WelcomeEmail>,
    /// Document reminders, in sending order.
    #[serde(default)]
    pub reminders: Vec<ReminderEmail>,
    /// KYC checks, in order.
    #[serde(default)]
    pub kyc_checks: Vec<KycCheck>,
}

/// What a fault does to a request. Every faulted request is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultAction {
    /// Apply the effect (e.g. create the account), then never answer: the
    /// connection stays open until the server stops, then closes without a
    /// response.
    HangAfterEffect,
    /// Do not apply the effect and never answer, as above.
    HangBeforeEffect,
    /// Apply the effect, then answer `500`.
    #[serde(rename = "fail_500_after_effect")]
    Fail500AfterEffect,
    /// Answer `503` without applying the effect.
    #[serde(rename = "fail_503")]
    Fail503,
    /// Answer `400` without applying the effect (a definite refusal that is
    /// not "not found").
    #[serde(rename = "fail_400")]
    Fail400,
    /// Apply the effect, then hold the answer until `POST /_release` (or the
    /// server stops): a response that arrives as late as the test wants.
    HoldAfterEffect,
}

/// A fault armed for the next `times` requests to `path`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    /// The exact request path (e.g. `/accounts`).
    pub path: String,
    /// What to do.
    pub action: FaultAction,
    /// How many requests it still applies to; `1` when omitted.
    #[serde(default = "one")]
    pub times: u32,
}

fn one() -> u32 {
    1
}

/// Why a fault was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FaultError {
    /// `times` was 0.
    #[error("`times` must be at least 1")]
    ZeroTimes,
    /// The path is not a service path.
    #[error("`path` must start with `/` and must not be a control path (`/_...`): {0:?}")]
    BadPath(String),
}

/// The CRM's state: customers, accounts, emails, the request log and faults.
///
/// Share it (in an `Arc`) with [`serve_crm_server`] to inspect it in-process.
#[derive(Debug)]
pub struct CrmState {
    inner: Mutex<Inner>,
    /// Bumped after each recorded request, to wake `/_wait` callers.
    recorded: watch::Sender<u64>,
    /// Bumped by `POST /_release`: held requests answer when it moves.
    released: watch::Sender<u64>,
}

#[derive(Debug, Default)]
struct Inner {
    requests: Vec<RecordedRequest>,
    accounts: Vec<Account>,
    emails: Vec<WelcomeEmail>,
    reminders: Vec<ReminderEmail>,
    kyc_checks: Vec<KycCheck>,
    account_keys: HashMap<String, Keyed>,
    email_keys: HashMap<String, Keyed>,
    reminder_keys: HashMap<String, Keyed>,
    kyc_keys: HashMap<String, Keyed>,
    /// Armed faults, oldest first; a request consumes the first matching one.
    faults: Vec<Fault>,
    /// Callbacks due to be sent (URL, body), taken by the request's handler.
    outgoing: Vec<(String, Value)>,
    /// Callbacks held by `POST /_callbacks/hold`.
    held: Vec<(String, Value)>,
    /// Whether new callbacks are held.
    hold_callbacks: bool,
    /// Callbacks sent.
    sent: Vec<SentCallback>,
}

/// The first request and answer seen for an idempotency key.
#[derive(Debug, Clone)]
struct Keyed {
    request: Value,
    reply: Reply,
}

/// A service answer: status and JSON body.
#[derive(Debug, Clone)]
struct Reply {
    status: StatusCode,
    body: Value,
}

impl Reply {
    fn ok(body: Value) -> Self {
        Self {
            status: StatusCode::OK,
            body,
        }
    }

    fn error(status: StatusCode, error: &str, message: impl Into<String>) -> Self {
        Self {
            status,
            body: json!({"error": error, "message": message.into()}),
        }
    }
}

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body)).into_response()
    }
}

impl Default for CrmState {
    fn default() -> Self {
        Self::new()
    }
}

impl CrmState {
    /// An empty CRM (only the seeded customers exist).
    pub fn new() -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            recorded: watch::Sender::new(0),
            released: watch::Sender::new(0),
        }
    }

    /// Release every request held by a `hold_after_effect` fault; returns
    /// the new release generation.
    pub fn release_held(&self) -> u64 {
        let mut generation = 0;
        self.released.send_modify(|g| {
            *g += 1;
            generation = *g;
        });
        generation
    }

    /// Handlers never panic while holding the lock, but a poisoned lock must
    /// not take the test double down either: the data is still consistent
    /// because every change is applied in one step.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Service requests received so far, in arrival order; only those to
    /// exactly `path` if given.
    pub fn requests(&self, path: Option<&str>) -> Vec<RecordedRequest> {
        self.lock()
            .requests
            .iter()
            .filter(|request| path.is_none_or(|path| request.path == path))
            .cloned()
            .collect()
    }

    /// How many service requests (to exactly `path`, if given) were received.
    pub fn request_count(&self, path: Option<&str>) -> usize {
        self.lock()
            .requests
            .iter()
            .filter(|request| path.is_none_or(|path| request.path == path))
            .count()
    }

    /// Callbacks sent so far and how many are held.
    pub fn callbacks(&self) -> CallbackLog {
        let inner = self.lock();
        CallbackLog {
            sent: inner.sent.clone(),
            held: inner.held.len(),
        }
    }

    /// Hold new callbacks (`true`) or send them as they come (`false`).
    pub fn hold_callbacks(&self, hold: bool) {
        self.lock().hold_callbacks = hold;
    }

    /// Take the callbacks due now: those of the requests just applied, plus
    /// the held ones when `held` is set.
    fn take_callbacks(&self, held: bool) -> Vec<(String, Value)> {
        let mut inner = self.lock();
        let mut due = std::mem::take(&mut inner.outgoing);
        if held {
            due.append(&mut inner.held);
        }
        due
    }

    /// The accounts and emails created so far.
    pub fn snapshot(&self) -> CrmSnapshot {
        let inner = self.lock();
        CrmSnapshot {
            accounts: inner.accounts.clone(),
            emails: inner.emails.clone(),
            reminders: inner.reminders.clone(),
            kyc_checks: inner.kyc_checks.clone(),
        }
    }

    /// Arms a fault after those already armed.
    pub fn add_fault(&self, fault: Fault) -> Result<(), FaultError> {
        if fault.times == 0 {
            return Err(FaultError::ZeroTimes);
        }
        if !fault.path.starts_with('/') || fault.path.starts_with("/_") {
            return Err(FaultError::BadPath(fault.path));
        }
        self.lock().faults.push(fault);
        Ok(())
    }

    /// The faults still armed, oldest first.
    pub fn faults(&self) -> Vec<Fault> {
        self.lock().faults.clone()
    }

    /// Disarms every fault; returns how many were armed.
    pub fn clear_faults(&self) -> usize {
        std::mem::take(&mut self.lock().faults).len()
    }

    /// How many [`CrmState::wait_for_requests`] calls (including `/_wait`
    /// requests) are waiting right now; lets a test know a long-poll has
    /// reached the server.
    pub fn pending_waits(&self) -> usize {
        self.recorded.receiver_count()
    }

    /// Waits until at least `count` service requests (to exactly `path`, if
    /// given) have been recorded, with their effects applied. Returns the count
    /// reached, or `Err` with the count so far after `timeout`.
    pub async fn wait_for_requests(
        &self,
        path: Option<&str>,
        count: usize,
        timeout: Duration,
    ) -> Result<usize, usize> {
        let mut changes = self.recorded.subscribe();
        // `wait_for` checks the current state first, then again after every
        // recorded request, so no request can slip between check and wait.
        let reached = changes.wait_for(|_| self.request_count(path) >= count);
        match tokio::time::timeout(timeout, reached).await {
            Ok(_) => Ok(self.request_count(path)),
            Err(_) => Err(self.request_count(path)),
        }
    }

    /// Records a service request, picks its fault and applies its effect, all
    /// under one lock, then wakes `/_wait` callers.
    fn process(
        &self,
        method: &Method,
        path: &str,
        key: Result<Option<String>, ()>,
        traceparent: Option<String>,
        body: &Result<Bytes, BytesRejection>,
    ) -> (Option<FaultAction>, Reply) {
        let recorded_body = match body {
            Ok(bytes) if bytes.is_empty() => Value::Null,
            Ok(bytes) => serde_json::from_slice(bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned())),
            Err(_) => Value::Null,
        };
        let (seq, fault, reply) = {
            let mut inner = self.lock();
            let seq = inner.requests.len() as u64 + 1;
            let fault = inner.take_fault(path);
            let mut apply = || -> Reply {
                let key = match &key {
                    Ok(key) => key.as_deref(),
                    Err(()) => {
                        return Reply::error(
                            StatusCode::BAD_REQUEST,
                            "invalid_idempotency_key",
                            "the Idempotency-Key header must be non-empty visible ASCII",
                        );
                    }
                };
                let body = match body {
                    Ok(bytes) => bytes,
                    Err(rejection) => {
                        return Reply::error(
                            rejection.status(),
                            "invalid_body",
                            rejection.body_text(),
                        );
                    }
                };
                inner.apply(seq, method, path, key, body)
            };
            let reply = match fault {
                None
                | Some(
                    FaultAction::HangAfterEffect
                    | FaultAction::Fail500AfterEffect
                    | FaultAction::HoldAfterEffect,
                ) => apply(),
                Some(FaultAction::HangBeforeEffect) => Reply::ok(Value::Null),
                Some(FaultAction::Fail503) => Reply::error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "injected fault: fail_503",
                ),
                Some(FaultAction::Fail400) => Reply::error(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    "injected fault: fail_400",
                ),
            };
            let status = match fault {
                Some(FaultAction::HangAfterEffect | FaultAction::HangBeforeEffect) => None,
                Some(FaultAction::Fail500AfterEffect) => Some(500),
                _ => Some(reply.status.as_u16()),
            };
            inner.requests.push(RecordedRequest {
                seq,
                method: method.to_string(),
                path: path.to_owned(),
                idempotency_key: key.ok().flatten(),
                body: recorded_body,
                fault,
                status,
                traceparent,
            });
            (seq, fault, reply)
        };
        self.recorded.send_modify(|n| *n += 1);
        match fault {
            Some(action) => tracing::info!(seq, %method, path, ?action, "fault applied"),
            None => {
                tracing::debug!(seq, %method, path, status = reply.status.as_u16(), "request")
            }
        }
        (fault, reply)
    }
}

impl Inner {
    /// Consumes one use of the first fault armed for `path`.
    fn take_fault(&mut self, path: &str) -> Option<FaultAction> {
        // A fault path ending in `*` matches every path with that prefix.
        let index = self
            .faults
            .iter()
            .position(|fault| match fault.path.strip_suffix('*') {
                Some(prefix) => path.starts_with(prefix),
                None => fault.path == path,
            })?;
        let fault = &mut self.faults[index];
        let action = fault.action;
        fault.times = fault.times.saturating_sub(1);
        if fault.times == 0 {
            self.faults.remove(index);
        }
        Some(action)
    }

    /// Applies a service request's effect and computes its answer.
    fn apply(
        &mut self,
        seq: u64,
        method: &Method,
        path: &str,
        key: Option<&str>,
        body: &[u8],
    ) -> Reply {
        if let Some(encoded) = path.strip_prefix(BY_KEY_PREFIX) {
            if method != Method::GET {
                return method_not_allowed(method, path);
            }
            return self.account_by_key(encoded);
        }
        let known = [LOOKUP, ACCOUNTS, WELCOME, REMINDER, KYC];
        if !known.contains(&path) {
            return Reply::error(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no endpoint {method} {path}"),
            );
        }
        if method != Method::POST {
            return method_not_allowed(method, path);
        }
        let body: Value = match serde_json::from_slice(body) {
            Ok(body) => body,
            Err(error) => {
                return Reply::error(
                    StatusCode::BAD_REQUEST,
                    "invalid_json",
                    format!("the request body is not valid JSON: {error}"),
                );
            }
        };
        match path {
            LOOKUP => lookup_customer(&body),
            ACCOUNTS => self.create_account(seq, key, &body),
            REMINDER => self.send_reminder(seq, key, &body),
            KYC => self.check_kyc(seq, key, &body),
            _ => self.send_welcome(seq, key, &body),
        }
    }

    fn create_account(&mut self, seq: u64, key: Option<&str>, body: &Value) -> Reply {
        let fields = required_string(body, "email").and_then(|email| {
            let name = required_string(body, "name")?;
            // `plan` is optional with the same default as the tool's
            // declaration, so a caller that leaves defaults to the service
            // behaves the same as one that fills them in.
            let plan = match body.get("plan") {
                None | Some(Value::Null) => DEFAULT_PLAN.to_owned(),
                Some(_) => required_string(body, "plan")?,
            };
            Ok((email, name, plan))
        });
        let (email, name, plan) = match fields {
            Ok(fields) => fields,
            Err(reply) => return reply,
        };
        let request = json!({"email": email, "name": name, "plan": plan});
        if let Some(reply) = replay(&self.account_keys, key, &request, ACCOUNTS) {
            return reply;
        }
        let account_id = format!("acct_{:06}", self.accounts.len() + 1);
        self.accounts.push(Account {
            account_id: account_id.clone(),
            email: email.clone(),
            name: name.clone(),
            plan: plan.clone(),
            idempotency_key: key.map(str::to_owned),
            request_seq: seq,
        });
        let reply = Reply {
            status: StatusCode::CREATED,
            body: json!({"account_id": account_id}),
        };
        if let Some(key) = key {
            self.account_keys.insert(
                key.to_owned(),
                Keyed {
                    request,
                    reply: reply.clone(),
                },
            );
        }
        reply
    }

    fn send_welcome(&mut self, seq: u64, key: Option<&str>, body: &Value) -> Reply {
        let fields = required_string(body, "email").and_then(|email| {
            let account_id = required_string(body, "account_id")?;
            let plan = match body.get("plan") {
                None | Some(Value::Null) => None,
                Some(_) => Some(required_string(body, "plan")?),
            };
            Ok((email, account_id, plan))
        });
        let (email, account_id, plan) = match fields {
            Ok(fields) => fields,
            Err(reply) => return reply,
        };
        let mut request = json!({"email": email, "account_id": account_id});
        if let Some(plan) = &plan {
            request["plan"] = json!(plan);
        }
        if let Some(reply) = replay(&self.email_keys, key, &request, WELCOME) {
            return reply;
        }
        if let Some(reply) = self.unknown_account(&account_id) {
            return reply;
        }
        let message_id = format!("msg_{:06}", self.emails.len() + 1);
        self.emails.push(WelcomeEmail {
            message_id: message_id.clone(),
            email: email.clone(),
            account_id: account_id.clone(),
            plan,
            idempotency_key: key.map(str::to_owned),
            request_seq: seq,
        });
        let reply = Reply::ok(json!({"message_id": message_id}));
        if let Some(key) = key {
            self.email_keys.insert(
                key.to_owned(),
                Keyed {
                    request,
                    reply: reply.clone(),
                },
            );
        }
        reply
    }

    /// `404 account_not_found` unless `account_id` exists.
    fn unknown_account(&self, account_id: &str) -> Option<Reply> {
        let known = self
            .accounts
            .iter()
            .any(|account| account.account_id == account_id);
        (!known).then(|| {
            Reply::error(
                StatusCode::NOT_FOUND,
                "account_not_found",
                format!("no account {account_id}"),
            )
        })
    }

    fn send_reminder(&mut self, seq: u64, key: Option<&str>, body: &Value) -> Reply {
        let fields = required_string(body, "email").and_then(|email| {
            let account_id = required_string(body, "account_id")?;
            let reminder = match body.get("reminder") {
                None | Some(Value::Null) => 1,
                Some(value) => value.as_u64().filter(|n| *n >= 1).ok_or_else(|| {
                    Reply::error(
                        StatusCode::BAD_REQUEST,
                        "invalid_field",
                        format!("field `reminder` must be a whole number from 1, got {value}"),
                    )
                })?,
            };
            Ok((email, account_id, reminder))
        });
        let (email, account_id, reminder) = match fields {
            Ok(fields) => fields,
            Err(reply) => return reply,
        };
        let request = json!({"email": email, "account_id": account_id, "reminder": reminder});
        if let Some(reply) = replay(&self.reminder_keys, key, &request, REMINDER) {
            return reply;
        }
        if let Some(reply) = self.unknown_account(&account_id) {
            return reply;
        }
        let message_id = format!("rem_{:06}", self.reminders.len() + 1);
        self.reminders.push(ReminderEmail {
            message_id: message_id.clone(),
            email,
            account_id,
            reminder,
            idempotency_key: key.map(str::to_owned),
            request_seq: seq,
        });
        let reply = Reply::ok(json!({"message_id": message_id}));
        if let Some(key) = key {
            self.reminder_keys.insert(
                key.to_owned(),
                Keyed {
                    request,
                    reply: reply.clone(),
                },
            );
        }
        reply
    }

    fn check_kyc(&mut self, seq: u64, key: Option<&str>, body: &Value) -> Reply {
        let fields = required_string(body, "account_id").and_then(|account_id| {
            let email = required_string(body, "email")?;
            let name = required_string(body, "name")?;
            let files = string_list(body, "files")?;
            Ok((account_id, email, name, files))
        });
        let (account_id, email, name, files) = match fields {
            Ok(fields) => fields,
            Err(reply) => return reply,
        };
        // The callback URL differs per attempt (each dispatch mints a token),
        // so it is not part of what an idempotency key must repeat.
        let callback_url = match body.get("callbackUrl") {
            None | Some(Value::Null) => None,
            Some(Value::String(url))
                if url.starts_with("http://") || url.starts_with("https://") =>
            {
                Some(url.clone())
            }
            Some(_) => {
                return Reply::error(
                    StatusCode::BAD_REQUEST,
                    "invalid_field",
                    "`callbackUrl` must be an http(s) URL",
                );
            }
        };
        let request =
            json!({"account_id": account_id, "email": email, "name": name, "files": files});
        if let Some(reply) = replay(&self.kyc_keys, key, &request, KYC) {
            return reply;
        }
        if let Some(reply) = self.unknown_account(&account_id) {
            return reply;
        }
        let check_id = format!("kyc_{:06}", self.kyc_checks.len() + 1);
        let status = kyc_status(&email, &files);
        self.kyc_checks.push(KycCheck {
            check_id: check_id.clone(),
            account_id,
            email,
            name,
            files,
            status: status.to_owned(),
            idempotency_key: key.map(str::to_owned),
            request_seq: seq,
        });
        let reply = match callback_url {
            Some(url) => {
                let result = json!({"check_id": check_id, "status": status});
                if self.hold_callbacks {
                    self.held.push((url, result));
                } else {
                    self.outgoing.push((url, result));
                }
                Reply {
                    status: StatusCode::ACCEPTED,
                    body: json!({"check_id": check_id, "status": "pending"}),
                }
            }
            None => Reply::ok(json!({"check_id": check_id, "status": status})),
        };
        if let Some(key) = key {
            self.kyc_keys.insert(
                key.to_owned(),
                Keyed {
                    request,
                    reply: reply.clone(),
                },
            );
        }
        reply
    }

    fn account_by_key(&self, encoded: &str) -> Reply {
        let key = match percent_encoding::percent_decode_str(encoded).decode_utf8() {
            Ok(key) => key,
            Err(_) => {
                return Reply::error(
                    StatusCode::BAD_REQUEST,
                    "invalid_key",
                    "the idempotency key in the path is not UTF-8 once percent-decoded",
                );
            }
        };
        let account = self.account_keys.get(key.as_ref()).and_then(|keyed| {
            let id = keyed.reply.body.get("account_id")?.as_str()?;
            self.accounts
                .iter()
                .find(|account| account.account_id == id)
        });
        match account {
            Some(account) => Reply::ok(json!({
                "account_id": account.account_id,
                "email": account.email,
                "name": account.name,
                "plan": account.plan,
                "idempotency_key": account.idempotency_key,
            })),
            None => Reply {
                status: StatusCode::NOT_FOUND,
                body: json!({"error": "not_found"}),
            },
        }
    }
}

/// The stored answer for a repeated idempotency key, or a `409` if the key
/// comes with a different request; `None` for a new or absent key.
fn replay(
    keys: &HashMap<String, Keyed>,
    key: Option<&str>,
    request: &Value,
    path: &str,
) -> Option<Reply> {
    let keyed = keys.get(key?)?;
    Some(if &keyed.request == request {
        keyed.reply.clone()
    } else {
        Reply::error(
            StatusCode::CONFLICT,
            "idempotency_key_reused",
            format!(
                "Idempotency-Key {:?} was first used for POST {path} with {}, not {}",
                key.unwrap_or_default(),
                keyed.request,
                request
            ),
        )
    })
}

fn lookup_customer(body: &Value) -> Reply {
    let email = match required_string(body, "email") {
        Ok(email) => email,
        Err(reply) => return reply,
    };
    let wanted = email.trim().to_ascii_lowercase();
    match SEEDED_CUSTOMERS
        .iter()
        .find(|(seeded, _, _)| *seeded == wanted)
    {
        Some((_, customer_id, name)) => {
            Reply::ok(json!({"found": true, "customer_id": customer_id, "name": name}))
        }
        None => Reply::ok(json!({"found": false})),
    }
}

/// The outcome of a KYC check: `review` when no documents came or the
/// email's local part contains `+review` (so a test or a demo can ask for
/// one), else `clear`.
pub fn kyc_status(email: &str, files: &[String]) -> &'static str {
    let local = email.split('@').next().unwrap_or_default();
    if files.is_empty() || local.contains("+review") {
        "review"
    } else {
        "clear"
    }
}

/// A required field holding a list of strings.
fn string_list(body: &Value, field: &str) -> Result<Vec<String>, Reply> {
    let invalid = || {
        Reply::error(
            StatusCode::BAD_REQUEST,
            "invalid_field",
            format!("field `{field}` must be a list of strings"),
        )
    };
    match body.get(field) {
        None | Some(Value::Null) => Err(Reply::error(
            StatusCode::BAD_REQUEST,
            "missing_field",
            format!("missing field `{field}`"),
        )),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| item.as_str().map(str::to_owned).ok_or_else(invalid))
            .collect(),
        Some(_) => Err(invalid()),
    }
}

/// Extracts a required non-empty string field from a JSON object body.
fn required_string(body: &Value, field: &str) -> Result<String, Reply> {
    let Some(object) = body.as_object() else {
        return Err(Reply::error(
            StatusCode::BAD_REQUEST,
            "invalid_body",
            "the request body must be a JSON object",
        ));
    };
    match object.get(field) {
        None | Some(Value::Null) => Err(Reply::error(
            StatusCode::BAD_REQUEST,
            "missing_field",
            format!("missing field `{field}`"),
        )),
        Some(Value::String(text)) if !text.trim().is_empty() => Ok(text.clone()),
        Some(Value::String(_)) => Err(Reply::error(
            StatusCode::BAD_REQUEST,
            "invalid_field",
            format!("field `{field}` must not be empty"),
        )),
        Some(other) => Err(Reply::error(
            StatusCode::BAD_REQUEST,
            "invalid_field",
            format!("field `{field}` must be a string, got {other}"),
        )),
    }
}

fn method_not_allowed(method: &Method, path: &str) -> Reply {
    Reply::error(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{method} is not allowed on {path}"),
    )
}

/// Shared by the handlers of one `serve_crm_server` call.
#[derive(Clone)]
struct Ctx {
    state: Arc<CrmState>,
    stopper: Stopper,
    http: reqwest::Client,
}

/// Attempts to deliver one callback: 50 ms doubling to 2 s between them,
/// about two minutes in all.
const CALLBACK_ATTEMPTS: usize = 64;

/// POST `body` to `url` as a KYC provider would: connection failures and 5xx
/// are retried ([`CALLBACK_ATTEMPTS`]); the outcome is logged in
/// `GET /_callbacks`.
async fn send_callback(
    state: &CrmState,
    http: &reqwest::Client,
    url: String,
    body: Value,
) -> SentCallback {
    use backon::{ExponentialBuilder, Retryable as _};
    let mut attempts = 0u32;
    let result = (|| {
        attempts += 1;
        let request = http.post(&url).json(&body).timeout(Duration::from_secs(10));
        async move {
            let response = request.send().await.map_err(|e| e.to_string())?;
            let status = response.status();
            let text = response.text().await.unwrap_or_default();
            if status.is_server_error() {
                return Err(format!("HTTP {status}: {text}"));
            }
            Ok((status.as_u16(), text))
        }
    })
    // Providers retry for a long while: an engine restarting (or all of
    // them down for a deploy) must not lose the result.
    .retry(
        ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(50))
            .with_max_delay(Duration::from_secs(2))
            .with_max_times(CALLBACK_ATTEMPTS - 1),
    )
    .await;
    let sent = match result {
        Ok((status, text)) => SentCallback {
            url,
            body,
            status: Some(status),
            response: serde_json::from_str(&text).unwrap_or(Value::String(text)),
            attempts,
        },
        Err(error) => SentCallback {
            url,
            body,
            status: None,
            response: Value::String(error),
            attempts,
        },
    };
    tracing::info!(url = %sent.url, status = ?sent.status, attempts, "callback sent");
    state.lock().sent.push(sent.clone());
    sent
}

fn spawn_callbacks(ctx: &Ctx, due: Vec<(String, Value)>) {
    for (url, body) in due {
        let state = Arc::clone(&ctx.state);
        let http = ctx.http.clone();
        tokio::spawn(async move {
            send_callback(&state, &http, url, body).await;
        });
    }
}

#[derive(Deserialize)]
struct HoldRequest {
    hold: bool,
}

/// `GET /_callbacks`.
async fn control_callbacks(State(ctx): State<Ctx>) -> Response {
    axum::Json(ctx.state.callbacks()).into_response()
}

/// `POST /_callbacks/hold {hold}`.
async fn control_hold_callbacks(
    State(ctx): State<Ctx>,
    body: Result<axum::Json<HoldRequest>, axum::extract::rejection::JsonRejection>,
) -> Response {
    match body {
        Ok(axum::Json(req)) => {
            ctx.state.hold_callbacks(req.hold);
            axum::Json(json!({"hold": req.hold})).into_response()
        }
        Err(r) => {
            Reply::error(StatusCode::BAD_REQUEST, "invalid_body", r.body_text()).into_response()
        }
    }
}

/// `POST /_callbacks/send`: send the held callbacks now and answer with
/// what their receivers said.
async fn control_send_callbacks(State(ctx): State<Ctx>) -> Response {
    let mut sent = Vec::new();
    for (url, body) in ctx.state.take_callbacks(true) {
        sent.push(send_callback(&ctx.state, &ctx.http, url, body).await);
    }
    axum::Json(json!({"sent": sent})).into_response()
}

/// `POST /_callbacks/replay`: send the last callback again.
async fn control_replay_callback(State(ctx): State<Ctx>) -> Response {
    let last = ctx.state.lock().sent.last().cloned();
    match last {
        Some(last) => {
            let sent = send_callback(&ctx.state, &ctx.http, last.url, last.body).await;
            axum::Json(sent).into_response()
        }
        None => Reply::error(
            StatusCode::NOT_FOUND,
            "not_found",
            "no callback was sent yet",
        )
        .into_response(),
    }
}

/// Serves the CRM on `listener` until `shutdown` completes.
///
/// At shutdown, the connections of hung requests are closed without a
/// response, pending `/_wait` calls answer `503`, and other in-flight requests
/// finish before this returns.
pub async fn serve_crm_server<F>(
    listener: TcpListener,
    state: Arc<CrmState>,
    shutdown: F,
) -> std::io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    let stopper = Stopper::new();
    let http = reqwest::Client::builder()
        .build()
        .map_err(|e| std::io::Error::other(format!("building the callback HTTP client: {e}")))?;
    let ctx = Ctx {
        state,
        stopper: stopper.clone(),
        http,
    };
    let router = Router::new()
        .route("/_requests", get(control_requests))
        .route("/_wait", get(control_wait))
        .route(
            "/_faults",
            get(control_faults)
                .post(control_add_fault)
                .delete(control_clear_faults),
        )
        .route("/_state", get(control_state))
        .route("/_release", axum::routing::post(control_release))
        .route("/_callbacks", get(control_callbacks))
        .route(
            "/_callbacks/hold",
            axum::routing::post(control_hold_callbacks),
        )
        .route(
            "/_callbacks/send",
            axum::routing::post(control_send_callbacks),
        )
        .route(
            "/_callbacks/replay",
            axum::routing::post(control_replay_callback),
        )
        .fallback(service)
        .with_state(ctx);
    let signal = async move {
        shutdown.await;
        stopper.stop();
    };
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<ConnHandle>(),
    )
    .with_graceful_shutdown(signal)
    .await
}

/// Every non-control request: record, apply, then answer or misbehave as the
/// fault says.
async fn service(
    State(ctx): State<Ctx>,
    ConnectInfo(conn): ConnectInfo<ConnHandle>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let path = uri.path();
    if path.starts_with("/_") {
        return Reply::error(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no control endpoint {method} {path}"),
        )
        .into_response();
    }
    let key = match headers.get("idempotency-key") {
        None => Ok(None),
        Some(value) => match value.to_str() {
            Ok(text) if !text.is_empty() => Ok(Some(text.to_owned())),
            _ => Err(()),
        },
    };
    let traceparent = headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let (fault, reply) = ctx.state.process(&method, path, key, traceparent, &body);
    // Callbacks go out while the answer is on its way, as with a real
    // provider: one may arrive before the answer does.
    spawn_callbacks(&ctx, ctx.state.take_callbacks(false));
    match fault {
        None => reply.into_response(),
        Some(FaultAction::HangAfterEffect | FaultAction::HangBeforeEffect) => {
            ctx.stopper.hang(conn).await;
            // The connection was shut down before `hang` returned, so this
            // answer goes nowhere; it only lets the connection task end.
            Reply::error(
                StatusCode::SERVICE_UNAVAILABLE,
                "stopping",
                "the server is stopping",
            )
            .into_response()
        }
        Some(FaultAction::Fail500AfterEffect) => Reply::error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "injected fault: fail_500_after_effect (the effect was applied)",
        )
        .into_response(),
        Some(FaultAction::Fail503 | FaultAction::Fail400) => reply.into_response(),
        Some(FaultAction::HoldAfterEffect) => {
            let mut released = ctx.state.released.subscribe();
            let held_at = *released.borrow_and_update();
            tokio::select! {
                _ = released.wait_for(|g| *g > held_at) => reply.into_response(),
                _ = ctx.stopper.stopped() => Reply::error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "stopping",
                    "the server is stopping",
                )
                .into_response(),
            }
        }
    }
}

/// `POST /_release`: answer every request held by `hold_after_effect`.
async fn control_release(State(ctx): State<Ctx>) -> Response {
    let generation = ctx.state.release_held();
    axum::Json(serde_json::json!({ "released": generation })).into_response()
}

#[derive(Debug, Deserialize)]
struct PathFilter {
    path: Option<String>,
}

/// `GET /_requests[?path=P]`.
async fn control_requests(
    State(ctx): State<Ctx>,
    query: Result<Query<PathFilter>, QueryRejection>,
) -> Response {
    match query {
        Ok(Query(filter)) => axum::Json(ctx.state.requests(filter.path.as_deref())).into_response(),
        Err(rejection) => bad_query(&rejection),
    }
}

#[derive(Debug, Deserialize)]
struct WaitQuery {
    path: Option<String>,
    count: Option<usize>,
    timeout_ms: Option<u64>,
}

/// `GET /_wait?path=P&count=N&timeout_ms=T`.
async fn control_wait(
    State(ctx): State<Ctx>,
    query: Result<Query<WaitQuery>, QueryRejection>,
) -> Response {
    let query = match query {
        Ok(Query(query)) => query,
        Err(rejection) => return bad_query(&rejection),
    };
    let count = query.count.unwrap_or(1);
    let timeout = query
        .timeout_ms
        .map_or(DEFAULT_WAIT_TIMEOUT, Duration::from_millis)
        .min(MAX_WAIT_TIMEOUT);
    let path = query.path.as_deref();
    tokio::select! {
        result = ctx.state.wait_for_requests(path, count, timeout) => match result {
            Ok(reached) => axum::Json(json!({"count": reached})).into_response(),
            Err(so_far) => (
                StatusCode::REQUEST_TIMEOUT,
                axum::Json(json!({
                    "count": so_far,
                    "error": "timeout",
                    "message": format!("{so_far} of {count} requests to {} after {} ms", path.unwrap_or("any path"), timeout.as_millis()),
                })),
            )
                .into_response(),
        },
        // A pending long-poll must not hold up the server's graceful shutdown.
        () = ctx.stopper.stopped() => Reply::error(StatusCode::SERVICE_UNAVAILABLE, "stopping", "the server is stopping").into_response(),
    }
}

/// `GET /_faults`.
async fn control_faults(State(ctx): State<Ctx>) -> Response {
    axum::Json(json!({"faults": ctx.state.faults()})).into_response()
}

/// `POST /_faults {path, action, times}`.
async fn control_add_fault(
    State(ctx): State<Ctx>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    // Parsed by hand rather than with `Json` so a test need not set
    // `Content-Type`, and so errors come back as JSON.
    let parsed = body
        .map_err(|rejection| rejection.body_text())
        .and_then(|bytes| serde_json::from_slice::<Fault>(&bytes).map_err(|e| e.to_string()));
    let fault = match parsed {
        Ok(fault) => fault,
        Err(message) => {
            return Reply::error(
                StatusCode::BAD_REQUEST,
                "invalid_fault",
                format!("expected {{path, action, times}}: {message}"),
            )
            .into_response();
        }
    };
    match ctx.state.add_fault(fault) {
        Ok(()) => axum::Json(json!({"faults": ctx.state.faults()})).into_response(),
        Err(error) => Reply::error(StatusCode::BAD_REQUEST, "invalid_fault", error.to_string())
            .into_response(),
    }
}

/// `DELETE /_faults`.
async fn control_clear_faults(State(ctx): State<Ctx>) -> Response {
    axum::Json(json!({"cleared": ctx.state.clear_faults()})).into_response()
}

/// `GET /_state`.
async fn control_state(State(ctx): State<Ctx>) -> Response {
    axum::Json(ctx.state.snapshot()).into_response()
}

fn bad_query(rejection: &QueryRejection) -> Response {
    Reply::error(
        StatusCode::BAD_REQUEST,
        "invalid_query",
        rejection.body_text(),
    )
    .into_response()
}
