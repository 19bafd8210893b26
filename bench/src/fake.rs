//! The benchmark's test doubles, served in-process on one free port and kept
//! as cheap as possible so they do not show up in the figures:
//!
//! - a scripted OpenAI-compatible model (`POST /v1/chat/completions`) that
//!   answers turn `n` (the number of assistant messages already in the
//!   request) with one call of `noop(i: n)` while `n < K`, and with the final
//!   answer `{"ok": true}` after that; like the example's scripted model it
//!   keeps no conversation state, so a retried call gets the same answer;
//! - the `noop` HTTP tool (`POST /noop`), which answers `{"ok": true}`, or
//!   `{"ok": true, "pad": "xx…"}` padded to `result_bytes` of JSON.
//!
//! Both count the requests they served, so the report can show retries.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde::Deserialize;
use serde_json::json;
use tokio::net::TcpListener;

/// Path of the no-op tool's endpoint, relative to the worker's
/// `--http-base-url`.
pub const TOOL_PATH: &str = "/noop";

/// What the doubles served so far.
#[derive(Debug, Default)]
pub struct Counters {
    /// Chat completion requests answered (any status).
    pub model_requests: AtomicU64,
    /// No-op tool requests answered.
    pub tool_requests: AtomicU64,
}

#[derive(Debug)]
struct FakeState {
    tool_steps: u32,
    /// The no-op tool's answer, built once.
    tool_answer: String,
    counters: Arc<Counters>,
}

/// The no-op tool's answer: `{"ok":true}`, or with a `pad` string making
/// the whole JSON `result_bytes` long (at least the unpadded answer). The
/// padding is pseudo-random letters and digits (xorshift64, fixed seed), so
/// PostgreSQL's TOAST compression cannot shrink it the way it would a run
/// of one character: stored sizes are those of real data.
pub fn tool_answer(result_bytes: usize) -> String {
    const FRAME: usize = r#"{"ok":true,"pad":""}"#.len();
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    if result_bytes <= FRAME {
        return r#"{"ok":true}"#.to_owned();
    }
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let pad: String = (0..result_bytes - FRAME)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ALPHABET[(x % ALPHABET.len() as u64) as usize] as char
        })
        .collect();
    format!(r#"{{"ok":true,"pad":"{pad}"}}"#)
}

/// The part of a chat completion request the model looks at; everything else
/// (tools, content, temperature) is skipped by serde without being kept.
#[derive(Deserialize)]
struct ChatRequest {
    #[serde(default)]
    messages: Vec<ChatMessage>,
}

#[derive(Deserialize)]
struct ChatMessage {
    role: String,
}

/// Serves the scripted model and the no-op tool on `listener` until
/// `shutdown` completes. The model calls the tool `tool_steps` times, then
/// answers; the tool's answer is [`tool_answer`]`(result_bytes)`. Models are
/// reached at `<url>/v1`, the tool at `<url>`.
///
/// Errors: the listener failing.
pub async fn serve<F>(
    listener: TcpListener,
    tool_steps: u32,
    result_bytes: usize,
    counters: Arc<Counters>,
    shutdown: F,
) -> std::io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    let state = Arc::new(FakeState {
        tool_steps,
        tool_answer: tool_answer(result_bytes),
        counters,
    });
    let app = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route(TOOL_PATH, post(noop))
        // Transcripts grow with K; the default 2 MB limit is plenty for a
        // no-op tool but not for a long loop.
        .layer(axum::extract::DefaultBodyLimit::max(64 * 1024 * 1024))
        .with_state(state);
    // Small answers must not wait for delayed ACKs (Nagle).
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

fn json_response(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn chat_completions(State(state): State<Arc<FakeState>>, body: Bytes) -> Response {
    state
        .counters
        .model_requests
        .fetch_add(1, Ordering::Relaxed);
    let request: ChatRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => {
            let error = json!({"error": {"message": format!("invalid request: {e}"),
                                         "type": "invalid_request_error"}});
            return json_response(StatusCode::BAD_REQUEST, error.to_string());
        }
    };
    let turn = request
        .messages
        .iter()
        .filter(|m| m.role == "assistant")
        .count();
    let (message, finish_reason) = if turn < state.tool_steps as usize {
        (
            json!({
                "role": "assistant",
                "content": null,
                "tool_calls": [{
                    "id": format!("call_{turn}"),
                    "type": "function",
                    "function": {"name": "noop", "arguments": format!("{{\"i\":{turn}}}")},
                }],
            }),
            "tool_calls",
        )
    } else {
        (
            json!({"role": "assistant", "content": "{\"ok\":true}"}),
            "stop",
        )
    };
    let answer = json!({
        "id": format!("chatcmpl-bench-{turn}"),
        "object": "chat.completion",
        "created": 0,
        "model": "bench-noop",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    });
    json_response(StatusCode::OK, answer.to_string())
}

async fn noop(State(state): State<Arc<FakeState>>) -> Response {
    state.counters.tool_requests.fetch_add(1, Ordering::Relaxed);
    json_response(StatusCode::OK, state.tool_answer.clone())
}

#[cfg(test)]
mod tests {
    use super::tool_answer;

    #[test]
    fn the_tool_answer_is_padded_to_the_asked_size() {
        assert_eq!(tool_answer(0), r#"{"ok":true}"#);
        assert_eq!(tool_answer(1 << 20).len(), 1 << 20);
        let v: serde_json::Value = serde_json::from_str(&tool_answer(100)).expect("JSON");
        assert_eq!(v["ok"], true);
    }
}
