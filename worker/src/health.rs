//! The worker's health, for a pod's probes (`--health-listen`): what the
//! claim loop knows of the engine, served over HTTP.
//!
//! - `GET /livez`: `200 ok` while the process serves requests (its runtime
//!   is not stuck); a liveness probe restarts a worker that stops answering.
//! - `GET /readyz`: `200` with `{"ready": true, ...}` once a claim has
//!   reached the engine and while the last one did; `503` with
//!   `{"ready": false, "reason": ...}` before the first claim, while the
//!   engine cannot be reached (since when, and the last gRPC status), and
//!   once the worker is shutting down (it claims nothing more). A readiness
//!   probe takes the pod out of a Service's endpoints; nothing routes to a
//!   worker (it pulls its work), so readiness is for operators and rollouts
//!   (`kubectl rollout status` waits for it).
//! - `GET /metrics`: the worker's Prometheus metrics ([`crate::metrics`]),
//!   text format 0.0.4. Public, like the probes.
//!
//! The claim loop ([`crate::runner`]) writes the state; [`serve`] reads it.
//! Tests await [`HealthState::wait_for`] instead of polling.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json};
use axum::routing::get;
use serde_json::json;
use tokio::sync::watch;

use crate::metrics::WorkerMetrics;

/// What the worker knows of its readiness.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// No claim has reached the engine yet.
    Starting,
    /// The last claim reached the engine.
    Ready,
    /// Claims fail: since when, and the last gRPC status (code and message).
    EngineUnreachable {
        /// When the first failing claim of this outage failed.
        since: Instant,
        /// The last failure, e.g. `Unavailable: tcp connect error`.
        last_error: String,
    },
    /// Shutdown began: no more claims.
    Stopping,
}

/// The worker's health, shared by the claim loop and the HTTP server
/// (cheap to clone). Starts as [`Readiness::Starting`].
#[derive(Debug, Clone)]
pub struct HealthState {
    tx: Arc<watch::Sender<Readiness>>,
    /// The worker id, shown in `/readyz`.
    worker_id: Arc<Mutex<String>>,
    /// The worker's metrics, served at `/metrics`.
    metrics: WorkerMetrics,
}

impl Default for HealthState {
    fn default() -> Self {
        HealthState {
            tx: Arc::new(watch::channel(Readiness::Starting).0),
            worker_id: Arc::default(),
            metrics: WorkerMetrics::default(),
        }
    }
}

/// Two handles are equal when they share one state.
impl PartialEq for HealthState {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.tx, &other.tx)
    }
}

impl Eq for HealthState {}

impl HealthState {
    /// The worker's metrics (what `/metrics` serves).
    pub fn metrics(&self) -> &WorkerMetrics {
        &self.metrics
    }

    /// The current readiness.
    pub fn get(&self) -> Readiness {
        self.tx.borrow().clone()
    }

    /// Waits until the readiness is one for which `pred` holds (at once if
    /// it already is), and returns it.
    pub async fn wait_for(&self, pred: impl Fn(&Readiness) -> bool) -> Readiness {
        let mut rx = self.tx.subscribe();
        // The sender lives in `self`, so `wait_for` cannot see it dropped.
        match rx.wait_for(|r| pred(r)).await {
            Ok(r) => r.clone(),
            Err(_) => self.get(),
        }
    }

    pub(crate) fn set_worker_id(&self, id: &str) {
        if let Ok(mut w) = self.worker_id.lock() {
            id.clone_into(&mut w);
        }
    }

    /// A claim reached the engine.
    pub(crate) fn claim_succeeded(&self) {
        self.tx.send_if_modified(|r| {
            let changed = !matches!(r, Readiness::Ready | Readiness::Stopping);
            if changed {
                *r = Readiness::Ready;
            }
            changed
        });
    }

    /// A claim failed with `error` (a gRPC status, shown as it is).
    pub(crate) fn claim_failed(&self, error: String) {
        self.tx.send_if_modified(|r| match r {
            Readiness::Stopping => false,
            Readiness::EngineUnreachable { last_error, .. } => {
                let changed = *last_error != error;
                *last_error = error;
                changed
            }
            _ => {
                *r = Readiness::EngineUnreachable {
                    since: Instant::now(),
                    last_error: error,
                };
                true
            }
        });
    }

    /// Shutdown began.
    pub(crate) fn stopping(&self) {
        self.tx.send_replace(Readiness::Stopping);
    }

    fn worker_id(&self) -> String {
        self.worker_id.lock().map(|w| w.clone()).unwrap_or_default()
    }
}

/// Serves `/livez`, `/readyz` and `/metrics` of `state` on `listener` until `shutdown`
/// resolves. Errors: the listener's.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: HealthState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let router = Router::new()
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state);
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

/// Binds `addr` for [`serve`]. Errors name the address.
pub async fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr} (--health-listen): {e}"))
}

async fn metrics(State(state): State<HealthState>) -> impl IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
}

async fn readyz(State(state): State<HealthState>) -> impl IntoResponse {
    let worker_id = state.worker_id();
    match state.get() {
        Readiness::Ready => (
            StatusCode::OK,
            Json(json!({"ready": true, "worker_id": worker_id})),
        ),
        Readiness::Starting => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({
                "ready": false,
                "worker_id": worker_id,
                "reason": "no claim has reached the engine yet",
            })),
        ),
        Readiness::EngineUnreachable { since, last_error } => {
            let down = since.elapsed().as_millis();
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({
                    "ready": false,
                    "worker_id": worker_id,
                    "reason": format!("the engine cannot be reached: {last_error}"),
                    "unreachable_for_ms": u64::try_from(down).unwrap_or(u64::MAX),
                })),
            )
        }
        Readiness::Stopping => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({
                "ready": false,
                "worker_id": worker_id,
                "reason": "shutting down: no more claims",
            })),
        ),
    }
}
