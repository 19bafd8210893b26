//! The recording tool server: the HTTP tools the chaos runs call, their
//! reconcile probe, and a scripted OpenAI-compatible model, in the harness's
//! process (so nothing it records is lost when engines, workers or
//! PostgreSQL die).
//!
//! - `POST /tools/<kind>` ([`ToolKind`]): records the request (its
//!   `Idempotency-Key` header and the `run` and `call` the engine filled
//!   in) when it arrives whole, which is when the tool "acts"; then answers
//!   `{"ok": true, "call": <call>}`, now or, for a share of requests drawn
//!   from the seed, slowly (between half and one and a half times the
//!   tool's timeout, so some answers come after the worker gave up);
//! - `GET /tools/probe?idempotency_key=K`: the probe of the probed
//!   reconcile tool: the same answer when a request with that key arrived,
//!   `404` when none did (the truth, as the recording knows it);
//! - `POST /v1/chat/completions`: turn `n` (assistant messages so far) of
//!   the agent calls `chaos_idempotent` (turn 0), then `chaos_never`
//!   (turn 1), then answers; slow for a share of requests too.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use super::rng;

/// The four tools the runs call, by repeat safety.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ToolKind {
    /// `chaos_never`: `repeat_safety: never`.
    Never,
    /// `chaos_idempotent`: `repeat_safety: idempotent`.
    Idempotent,
    /// `chaos_reconcile_probed`: `repeat_safety: reconcile` with
    /// `reconcile_with: chaos_probe`.
    ReconcileProbed,
    /// `chaos_reconcile`: `repeat_safety: reconcile`, no probe.
    Reconcile,
}

impl ToolKind {
    /// Every kind, in report order.
    pub const ALL: [ToolKind; 4] = [
        ToolKind::Never,
        ToolKind::Idempotent,
        ToolKind::ReconcileProbed,
        ToolKind::Reconcile,
    ];

    /// The tool's name in the definitions.
    pub fn tool(self) -> &'static str {
        match self {
            ToolKind::Never => "chaos_never",
            ToolKind::Idempotent => "chaos_idempotent",
            ToolKind::ReconcileProbed => "chaos_reconcile_probed",
            ToolKind::Reconcile => "chaos_reconcile",
        }
    }

    /// The tool of this name.
    pub fn of_tool(name: &str) -> Option<ToolKind> {
        ToolKind::ALL.into_iter().find(|k| k.tool() == name)
    }

    /// Its endpoint, relative to the worker's HTTP base URL.
    pub fn path(self) -> &'static str {
        match self {
            ToolKind::Never => "/tools/never",
            ToolKind::Idempotent => "/tools/idempotent",
            ToolKind::ReconcileProbed => "/tools/reconcile_probed",
            ToolKind::Reconcile => "/tools/reconcile",
        }
    }

    /// Whether a call may reach the tool at most once.
    pub fn at_most_once(self) -> bool {
        !matches!(self, ToolKind::Idempotent)
    }
}

/// Path of the probe's endpoint.
pub const PROBE_PATH: &str = "/tools/probe";

/// One request a tool received whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolRequest {
    /// Which tool.
    pub kind: ToolKind,
    /// The run id the engine filled in (`source: runtime`).
    pub run: String,
    /// The call id the engine filled in.
    pub call: String,
    /// The `Idempotency-Key` header, if any.
    pub key: Option<String>,
    /// How long the answer was held back, ms (0: at once).
    pub delay_ms: u64,
}

/// How the server answers.
#[derive(Debug, Clone, Copy)]
pub struct RecorderOptions {
    /// Seed of the slow answers.
    pub seed: u64,
    /// Share of tool and model requests answered slowly (0.0..=1.0).
    pub slow_share: f64,
    /// The tools' timeout, ms (a slow answer takes 0.5 to 1.5 times it).
    pub tool_timeout_ms: u64,
    /// The workers' model timeout, ms (the same for the model).
    pub model_timeout_ms: u64,
}

/// Everything the server saw. Cheap to clone (shared).
#[derive(Debug, Clone, Default)]
pub struct Recording {
    inner: Arc<RecordingInner>,
}

#[derive(Debug, Default)]
struct RecordingInner {
    requests: Mutex<Vec<ToolRequest>>,
    model_requests: AtomicU64,
    probe_requests: AtomicU64,
    slow_answers: AtomicU64,
    malformed: Mutex<Vec<String>>,
}

impl Recording {
    /// Every tool request so far, in arrival order.
    pub fn requests(&self) -> Vec<ToolRequest> {
        self.inner
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Tool requests that did not carry a run and a call (what was wrong).
    pub fn malformed(&self) -> Vec<String> {
        self.inner
            .malformed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Model requests served.
    pub fn model_requests(&self) -> u64 {
        self.inner.model_requests.load(Ordering::Relaxed)
    }

    /// Probe requests served.
    pub fn probe_requests(&self) -> u64 {
        self.inner.probe_requests.load(Ordering::Relaxed)
    }

    /// Answers held back (tools and model).
    pub fn slow_answers(&self) -> u64 {
        self.inner.slow_answers.load(Ordering::Relaxed)
    }

    /// Records a request, its answer delay drawn by `delay` from how many
    /// requests of the same call came before it; returns the delay.
    fn record(&self, mut request: ToolRequest, delay: impl Fn(usize) -> u64) -> u64 {
        let mut requests = self
            .inner
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let before = requests
            .iter()
            .filter(|r| r.kind == request.kind && r.run == request.run && r.call == request.call)
            .count();
        request.delay_ms = delay(before);
        let delay_ms = request.delay_ms;
        requests.push(request);
        delay_ms
    }

    /// The call of the probed reconcile tool that a request with `key`
    /// was made for, if one arrived.
    fn probed_call(&self, key: &str) -> Option<String> {
        self.inner
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .find(|r| r.kind == ToolKind::ReconcileProbed && r.key.as_deref() == Some(key))
            .map(|r| r.call.clone())
    }

    /// Per kind, the requests received.
    pub fn counts_by_kind(&self) -> HashMap<ToolKind, usize> {
        let mut counts = HashMap::new();
        for r in self.requests() {
            *counts.entry(r.kind).or_insert(0) += 1;
        }
        counts
    }
}

struct ServerState {
    options: RecorderOptions,
    recording: Recording,
    model_counter: AtomicU64,
}

/// How long to hold an answer back: drawn from `seed` and `what`, so the
/// same request of the same seed is held the same time.
pub fn answer_delay_ms(seed: u64, what: &str, slow_share: f64, timeout_ms: u64) -> u64 {
    let h = rng::hash(seed, what);
    let draw = (h % 1_000_000) as f64 / 1_000_000.0;
    if draw >= slow_share {
        return 0;
    }
    // 0.5 to 1.5 timeouts, from other bits of the same hash.
    timeout_ms / 2 + (h >> 32) % timeout_ms.max(1)
}

/// Serves the tools, the probe and the model on `listener`, recording into
/// `recording`, until the task is aborted.
///
/// Errors: the listener failing.
pub async fn serve(
    listener: TcpListener,
    options: RecorderOptions,
    recording: Recording,
) -> std::io::Result<()> {
    let state = Arc::new(ServerState {
        options,
        recording,
        model_counter: AtomicU64::new(0),
    });
    let mut app = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route(PROBE_PATH, get(probe));
    for kind in ToolKind::ALL {
        app = app.route(
            kind.path(),
            post(move |state, headers, body| tool(kind, state, headers, body)),
        );
    }
    let app = app
        .layer(axum::extract::DefaultBodyLimit::max(16 * 1024 * 1024))
        .with_state(state);
    axum::serve(listener, app).await
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

#[derive(Deserialize)]
struct ToolBody {
    run: Option<String>,
    call: Option<String>,
}

async fn tool(
    kind: ToolKind,
    State(state): State<Arc<ServerState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let parsed: Option<ToolBody> = serde_json::from_slice(&body).ok();
    let (Some(run), Some(call)) = parsed.map_or((None, None), |b| (b.run, b.call)) else {
        let what = format!(
            "{} received a body without run and call: {}",
            kind.tool(),
            String::from_utf8_lossy(&body)
        );
        state
            .recording
            .inner
            .malformed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(what);
        return json_response(StatusCode::BAD_REQUEST, &json!({"error": "run and call"}));
    };
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let options = state.options;
    let what = format!("{}/{run}/{call}", kind.tool());
    let request = ToolRequest {
        kind,
        run,
        call: call.clone(),
        key,
        delay_ms: 0,
    };
    // The n-th request of a call draws its own delay.
    let delay = state.recording.record(request, |nth| {
        answer_delay_ms(
            options.seed,
            &format!("{what}/{nth}"),
            options.slow_share,
            options.tool_timeout_ms,
        )
    });
    if delay > 0 {
        state
            .recording
            .inner
            .slow_answers
            .fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    json_response(StatusCode::OK, &json!({"ok": true, "call": call}))
}

#[derive(Deserialize)]
struct ProbeQuery {
    idempotency_key: String,
}

async fn probe(State(state): State<Arc<ServerState>>, query: Query<ProbeQuery>) -> Response {
    state
        .recording
        .inner
        .probe_requests
        .fetch_add(1, Ordering::Relaxed);
    match state.recording.probed_call(&query.idempotency_key) {
        Some(call) => json_response(StatusCode::OK, &json!({"ok": true, "call": call})),
        None => json_response(
            StatusCode::NOT_FOUND,
            &json!({"error": "no request with this idempotency key arrived"}),
        ),
    }
}

#[derive(Deserialize)]
struct ChatRequest {
    #[serde(default)]
    messages: Vec<ChatMessage>,
}

#[derive(Deserialize)]
struct ChatMessage {
    role: String,
}

/// The scripted model's answer at `turn`: a call of `chaos_idempotent`,
/// then of `chaos_never`, then the final answer.
pub fn model_answer(turn: usize) -> Value {
    let call = |tool: &str| {
        json!({
            "role": "assistant",
            "content": null,
            "tool_calls": [{
                "id": format!("call_{turn}"),
                "type": "function",
                "function": {"name": tool, "arguments": "{}"},
            }],
        })
    };
    let (message, finish_reason) = match turn {
        0 => (call(ToolKind::Idempotent.tool()), "tool_calls"),
        1 => (call(ToolKind::Never.tool()), "tool_calls"),
        _ => (
            json!({"role": "assistant", "content": "{\"ok\":true}"}),
            "stop",
        ),
    };
    json!({
        "id": format!("chatcmpl-chaos-{turn}"),
        "object": "chat.completion",
        "created": 0,
        "model": "chaos-scripted",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    })
}

async fn chat_completions(State(state): State<Arc<ServerState>>, body: Bytes) -> Response {
    state
        .recording
        .inner
        .model_requests
        .fetch_add(1, Ordering::Relaxed);
    let Ok(request) = serde_json::from_slice::<ChatRequest>(&body) else {
        let error =
            json!({"error": {"message": "invalid request", "type": "invalid_request_error"}});
        return json_response(StatusCode::BAD_REQUEST, &error);
    };
    let turn = request
        .messages
        .iter()
        .filter(|m| m.role == "assistant")
        .count();
    let n = state.model_counter.fetch_add(1, Ordering::Relaxed);
    let options = state.options;
    let delay = answer_delay_ms(
        options.seed,
        &format!("model/{n}"),
        options.slow_share,
        options.model_timeout_ms,
    );
    if delay > 0 {
        state
            .recording
            .inner
            .slow_answers
            .fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    json_response(StatusCode::OK, &model_answer(turn))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_of_answers_is_slow_and_slow_means_around_the_timeout() {
        let delays: Vec<u64> = (0..2000)
            .map(|i| answer_delay_ms(42, &format!("x/{i}"), 0.1, 2000))
            .collect();
        let slow: Vec<u64> = delays.iter().copied().filter(|d| *d > 0).collect();
        assert!((120..=280).contains(&slow.len()), "{} slow", slow.len());
        assert!(slow.iter().all(|d| (1000..3000).contains(d)), "{slow:?}");
        assert!(
            slow.iter().any(|d| *d > 2000),
            "some come after the timeout"
        );
        assert_eq!(answer_delay_ms(42, "x/1", 0.1, 2000), delays[1]);
        assert!((0..100).all(|i| answer_delay_ms(1, &i.to_string(), 0.0, 2000) == 0));
    }

    #[test]
    fn the_model_calls_the_two_tools_then_answers() {
        let name = |turn| {
            model_answer(turn)["choices"][0]["message"]["tool_calls"][0]["function"]["name"].clone()
        };
        assert_eq!(name(0), "chaos_idempotent");
        assert_eq!(name(1), "chaos_never");
        assert_eq!(model_answer(2)["choices"][0]["finish_reason"], "stop");
    }

    #[tokio::test]
    async fn the_probe_tells_whether_a_request_with_the_key_arrived() -> anyhow::Result<()> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let recording = Recording::default();
        let options = RecorderOptions {
            seed: 1,
            slow_share: 0.0,
            tool_timeout_ms: 1000,
            model_timeout_ms: 1000,
        };
        let server = tokio::spawn(serve(listener, options, recording.clone()));
        let http = reqwest::Client::new();
        let probe = |key: &str| {
            http.get(format!("{url}{PROBE_PATH}?idempotency_key={key}"))
                .send()
        };
        assert_eq!(probe("r1/p.t1").await?.status(), 404);
        let answer = http
            .post(format!("{url}{}", ToolKind::ReconcileProbed.path()))
            .header("idempotency-key", "r1/p.t1")
            .json(&json!({"run": "r1", "call": "p.t1"}))
            .send()
            .await?;
        assert_eq!(answer.status(), 200);
        let found = probe("r1/p.t1").await?;
        assert_eq!(found.status(), 200);
        assert_eq!(
            found.json::<Value>().await?,
            json!({"ok": true, "call": "p.t1"})
        );
        let bad = http
            .post(format!("{url}{}", ToolKind::Never.path()))
            .json(&json!({"call": "x"}))
            .send()
            .await?;
        assert_eq!(bad.status(), 400);
        assert_eq!(recording.requests().len(), 1);
        assert_eq!(recording.malformed().len(), 1);
        assert_eq!(recording.probe_requests(), 2);
        server.abort();
        Ok(())
    }
}
