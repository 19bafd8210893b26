//! Test helpers: in-process axum servers and a fake engine `WorkerService`.
#![allow(dead_code, missing_docs, clippy::unwrap_used)]

use std::collections::{HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, Uri};
use axum::routing::post;
use belay_proto::v1::worker_service_server::{WorkerService, WorkerServiceServer};
use belay_proto::v1::{
    ClaimTasksRequest, ClaimTasksResponse, CompleteTaskRequest, CompleteTaskResponse,
    DispatchToolCallRequest, DispatchToolCallResponse, FailTaskRequest, FailTaskResponse,
    FailureClass, HeartbeatRequest, HeartbeatResponse, LeaseStatus, RequestToolInputRequest,
    RequestToolInputResponse, Task,
};
use belay_proto::wire::{ModelCallResult, ToolSchema};
use belay_worker::{ModelClient, ModelError, ModelProvider, ModelProviderConfig};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc};
use tonic::{Request, Response, Status};

/// Upper bound for awaiting something that must happen; a guard against a
/// hung test, not a wait.
pub const GUARD: Duration = Duration::from_secs(20);

/// Serves `router` on an ephemeral local port.
pub async fn serve(router: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    });
    addr
}

/// Requests a [`recording_server`] saw: URI, headers and JSON body, in order.
pub type Recorded = Arc<Mutex<Vec<(Uri, HeaderMap, Value)>>>;

/// A server answering every `POST path` with 200 and `answer`, recording each
/// request. Returns its address and the record.
pub async fn recording_server(path: &str, answer: Value) -> (SocketAddr, Recorded) {
    let recorded = Recorded::default();
    let router = Router::new().route(
        path,
        post({
            let recorded = Arc::clone(&recorded);
            move |uri: Uri, headers: HeaderMap, body: Bytes| async move {
                let body: Value = serde_json::from_slice(&body).unwrap();
                recorded.lock().unwrap().push((uri, headers, body));
                axum::Json(answer)
            }
        }),
    );
    (serve(router).await, recorded)
}

/// The tool the model tests offer: `lookup`, one string argument `q`.
pub fn lookup_tool() -> ToolSchema {
    ToolSchema {
        name: "lookup".into(),
        description: "Look something up".into(),
        parameters: json!({"type": "object", "properties": {"q": {"type": "string"}}}),
        strict: false,
    }
}

/// A model client of `provider` at `base_url`.
pub fn model_client(
    provider: ModelProvider,
    base_url: String,
    api_key: Option<&str>,
    timeout_ms: u64,
) -> ModelClient {
    ModelClient::new(&ModelProviderConfig {
        provider,
        base_url,
        api_key: api_key.map(str::to_owned),
        timeout_ms,
    })
    .unwrap()
}

/// Asserts that `parse` reads none of `bodies` (2xx bodies), each an
/// `InvalidResponse`, which may have acted.
pub fn assert_unreadable(
    parse: impl Fn(&[u8]) -> Result<ModelCallResult, ModelError>,
    bodies: &[&[u8]],
) {
    for body in bodies {
        let err = parse(body).unwrap_err();
        assert!(matches!(err, ModelError::InvalidResponse(_)), "{err}");
        assert_eq!(err.class(), FailureClass::MayHaveActed);
    }
}

/// A local port with nothing listening on it.
pub fn closed_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    addr
}

/// A server that accepts a connection, reads the request head, then closes
/// the connection without answering: an error after the request was sent.
pub async fn hang_up_server() -> SocketAddr {
    use tokio::io::AsyncReadExt;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                let mut seen = Vec::new();
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
                drop(socket);
            });
        }
    });
    addr
}

/// An ordered log shared by the fake engine and the fake tool servers.
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    pub fn push(&self, entry: impl Into<String>) {
        self.0.lock().unwrap().push(entry.into());
    }
    pub fn entries(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

/// A report the fake engine accepted.
#[derive(Debug, Clone)]
pub enum Report {
    Complete(CompleteTaskRequest),
    Fail(FailTaskRequest),
    NeedsInput(RequestToolInputRequest),
}

impl Report {
    pub fn task_id(&self) -> &str {
        match self {
            Report::Complete(r) => &r.task_id,
            Report::Fail(r) => &r.task_id,
            Report::NeedsInput(r) => &r.task_id,
        }
    }
}

#[derive(Default)]
pub struct EngineState {
    pub queue: VecDeque<Task>,
    /// Task ids whose dispatch is refused with FAILED_PRECONDITION.
    pub refuse_dispatch: HashSet<String>,
    /// Task ids whose lease heartbeats report as not held.
    pub lost: HashSet<String>,
    /// Answer this many CompleteTask calls with UNAVAILABLE first.
    pub unavailable_completes: u32,
    /// Task ids whose CompleteTask is refused with INVALID_ARGUMENT (a
    /// result the engine will never accept).
    pub refuse_completes: HashSet<String>,
    pub complete_calls: u32,
    pub dispatches: Vec<DispatchToolCallRequest>,
    pub heartbeats: Vec<HeartbeatRequest>,
    pub claims: Vec<ClaimTasksRequest>,
    /// Notified (one permit) each time a heartbeat answer says a lease is lost.
    pub lost_told: std::sync::Arc<tokio::sync::Notify>,
    /// Leave this many heartbeats unanswered for ever (an engine that
    /// stalls), counted from the first.
    pub stall_heartbeats: u32,
    /// When each heartbeat arrived (stalled ones too).
    pub heartbeat_at: Vec<tokio::time::Instant>,
    /// Notified (one permit) each time a heartbeat arrives.
    pub heartbeat_seen: std::sync::Arc<tokio::sync::Notify>,
    /// Task ids whose dispatch is never answered.
    pub stall_dispatch: HashSet<String>,
    /// Notified (one permit) when a dispatch of `stall_dispatch` arrives.
    pub dispatch_stalled: std::sync::Arc<tokio::sync::Notify>,
    /// Task ids whose dispatch is answered (OK) only once
    /// `dispatch_released` is notified.
    pub hold_dispatch: HashSet<String>,
    /// Releases the held dispatches (one permit each).
    pub dispatch_released: std::sync::Arc<tokio::sync::Notify>,
}

/// Handle of a running fake engine.
pub struct FakeEngine {
    pub addr: SocketAddr,
    pub state: Arc<Mutex<EngineState>>,
    pub log: Log,
    task_added: Arc<Notify>,
    reports: mpsc::UnboundedReceiver<Report>,
}

impl FakeEngine {
    pub async fn start(log: Log) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::serve(listener, log)
    }

    /// Serves on `addr` (e.g. a port a worker is already trying to reach).
    pub async fn start_on(addr: SocketAddr, log: Log) -> Self {
        let listener = TcpListener::bind(addr).await.unwrap();
        Self::serve(listener, log)
    }

    fn serve(listener: TcpListener, log: Log) -> Self {
        let state = Arc::new(Mutex::new(EngineState::default()));
        let task_added = Arc::new(Notify::new());
        let (tx, rx) = mpsc::unbounded_channel();
        let service = FakeService {
            state: Arc::clone(&state),
            log: log.clone(),
            task_added: Arc::clone(&task_added),
            reports: tx,
        };
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(WorkerServiceServer::new(service))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
        Self {
            addr,
            state,
            log,
            task_added,
            reports: rx,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn push(&self, task: Task) {
        self.state.lock().unwrap().queue.push_back(task);
        self.task_added.notify_one();
    }

    /// The next accepted report.
    pub async fn next_report(&mut self) -> Report {
        tokio::time::timeout(GUARD, self.reports.recv())
            .await
            .expect("no report within the guard time")
            .expect("fake engine stopped")
    }

    /// Reports accepted so far that were not taken with `next_report`.
    pub fn pending_reports(&mut self) -> Vec<Report> {
        let mut out = Vec::new();
        while let Ok(report) = self.reports.try_recv() {
            out.push(report);
        }
        out
    }
}

struct FakeService {
    state: Arc<Mutex<EngineState>>,
    log: Log,
    task_added: Arc<Notify>,
    reports: mpsc::UnboundedSender<Report>,
}

#[tonic::async_trait]
impl WorkerService for FakeService {
    async fn claim_tasks(
        &self,
        request: Request<ClaimTasksRequest>,
    ) -> Result<Response<ClaimTasksResponse>, Status> {
        let request = request.into_inner();
        let wait = Duration::from_millis(u64::from(request.wait_ms));
        let max = request.max_tasks as usize;
        self.state.lock().unwrap().claims.push(request);
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            {
                let mut state = self.state.lock().unwrap();
                if !state.queue.is_empty() {
                    let n = max.min(state.queue.len());
                    let tasks: Vec<Task> = state.queue.drain(..n).collect();
                    for task in &tasks {
                        self.log
                            .push(format!("claim {} {}", task.task_id, task.attempt));
                    }
                    return Ok(Response::new(ClaimTasksResponse { tasks }));
                }
            }
            // Long poll: woken by `push`, or return empty at the deadline.
            if tokio::time::timeout_at(deadline, self.task_added.notified())
                .await
                .is_err()
            {
                return Ok(Response::new(ClaimTasksResponse { tasks: vec![] }));
            }
        }
    }

    async fn heartbeat(
        &self,
        request: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        let request = request.into_inner();
        let stall = {
            let mut state = self.state.lock().unwrap();
            state.heartbeat_at.push(tokio::time::Instant::now());
            state.heartbeat_seen.notify_one();
            let stall = state.stall_heartbeats > 0;
            state.stall_heartbeats = state.stall_heartbeats.saturating_sub(1);
            stall
        };
        if stall {
            std::future::pending::<()>().await;
        }
        let mut state = self.state.lock().unwrap();
        let leases: Vec<LeaseStatus> = request
            .leases
            .iter()
            .map(|l| LeaseStatus {
                task_id: l.task_id.clone(),
                attempt: l.attempt,
                held: !state.lost.contains(&l.task_id),
                lease_ms: 0,
            })
            .collect();
        if leases.iter().any(|l: &LeaseStatus| !l.held) {
            state.lost_told.notify_one();
        }
        state.heartbeats.push(request);
        Ok(Response::new(HeartbeatResponse { leases }))
    }

    async fn dispatch_tool_call(
        &self,
        request: Request<DispatchToolCallRequest>,
    ) -> Result<Response<DispatchToolCallResponse>, Status> {
        let request = request.into_inner();
        let stall = {
            let state = self.state.lock().unwrap();
            let stall = state.stall_dispatch.contains(&request.task_id);
            if stall {
                state.dispatch_stalled.notify_one();
            }
            stall
        };
        if stall {
            self.log
                .push(format!("dispatch {} stalled", request.task_id));
            std::future::pending::<()>().await;
        }
        let held = {
            let state = self.state.lock().unwrap();
            state
                .hold_dispatch
                .contains(&request.task_id)
                .then(|| state.dispatch_released.clone())
        };
        if let Some(released) = held {
            released.notified().await;
        }
        let mut state = self.state.lock().unwrap();
        let refused = state.refuse_dispatch.contains(&request.task_id);
        self.log.push(format!(
            "dispatch {} {}{}",
            request.task_id,
            request.attempt,
            if refused { " refused" } else { "" }
        ));
        // An MCP call: pin whatever the worker lists (trust on first use).
        let mcp_pinned_hash = request.mcp_definition_hash.clone();
        state.dispatches.push(request);
        if refused {
            return Err(Status::failed_precondition("budget exhausted"));
        }
        Ok(Response::new(DispatchToolCallResponse {
            mcp_pinned_hash,
            ..DispatchToolCallResponse::default()
        }))
    }

    async fn report_mcp_tools(
        &self,
        request: Request<belay_proto::v1::ReportMcpToolsRequest>,
    ) -> Result<Response<belay_proto::v1::ReportMcpToolsResponse>, Status> {
        let request = request.into_inner();
        self.log.push(format!(
            "report_mcp_tools {} {}",
            request.server,
            request.tools.len()
        ));
        Ok(Response::new(belay_proto::v1::ReportMcpToolsResponse {
            new_definitions: 0,
        }))
    }

    async fn complete_task(
        &self,
        request: Request<CompleteTaskRequest>,
    ) -> Result<Response<CompleteTaskResponse>, Status> {
        let request = request.into_inner();
        {
            let mut state = self.state.lock().unwrap();
            state.complete_calls += 1;
            if state.unavailable_completes > 0 {
                state.unavailable_completes -= 1;
                return Err(Status::unavailable("engine restarting"));
            }
            if state.refuse_completes.contains(&request.task_id) {
                self.log
                    .push(format!("complete {} refused", request.task_id));
                return Err(Status::invalid_argument("result_json is not valid JSON"));
            }
        }
        self.log
            .push(format!("complete {} {}", request.task_id, request.attempt));
        let _ = self.reports.send(Report::Complete(request));
        Ok(Response::new(CompleteTaskResponse::default()))
    }

    async fn fail_task(
        &self,
        request: Request<FailTaskRequest>,
    ) -> Result<Response<FailTaskResponse>, Status> {
        let request = request.into_inner();
        self.log
            .push(format!("fail {} {}", request.task_id, request.attempt));
        let _ = self.reports.send(Report::Fail(request));
        Ok(Response::new(FailTaskResponse {}))
    }

    async fn request_tool_input(
        &self,
        request: Request<RequestToolInputRequest>,
    ) -> Result<Response<RequestToolInputResponse>, Status> {
        let request = request.into_inner();
        self.log.push(format!(
            "needs-input {} {}",
            request.task_id, request.attempt
        ));
        let _ = self.reports.send(Report::NeedsInput(request));
        Ok(Response::new(RequestToolInputResponse {}))
    }
}
