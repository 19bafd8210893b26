//! Connection handles and the stop signal of the CRM server.
//!
//! A fault of the CRM server can "hang" a request: never answer and hold the
//! connection open until the server stops. axum's graceful shutdown waits for
//! every in-flight request, so a request that never finishes would keep the
//! server from stopping, and answering it at shutdown would deliver a response
//! the test asked never to be delivered. Instead each connection carries a
//! duplicate of its socket's file descriptor; when the server stops, the
//! sockets of hung requests are shut down first (the client sees the
//! connection close without a response), then the hung handlers are released so
//! the connection tasks end and the graceful shutdown completes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::connect_info::Connected;
use axum::serve::IncomingStream;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Per-connection information handed to handlers through `ConnectInfo`.
#[derive(Clone, Debug)]
pub(crate) struct ConnHandle {
    /// A duplicate of the connection's socket, used only to shut it down. `None`
    /// if duplicating failed (e.g. out of file descriptors) or on non-Unix
    /// platforms; the hung request is then simply released at stop.
    socket: Option<Arc<std::net::TcpStream>>,
}

impl ConnHandle {
    /// Closes the connection in both directions without sending anything.
    fn abort(&self) {
        if let Some(socket) = &self.socket {
            // The connection may already be gone (client gave up): nothing to do.
            let _ = socket.shutdown(std::net::Shutdown::Both);
        }
    }
}

impl Connected<IncomingStream<'_, TcpListener>> for ConnHandle {
    fn connect_info(stream: IncomingStream<'_, TcpListener>) -> Self {
        #[cfg(unix)]
        let socket = {
            use std::os::fd::AsFd;
            // Dropping the duplicate closes only the duplicate descriptor, never
            // the connection the server is using.
            match stream.io().as_fd().try_clone_to_owned() {
                Ok(fd) => Some(Arc::new(std::net::TcpStream::from(fd))),
                Err(error) => {
                    tracing::warn!(%error, "cannot duplicate a connection's socket; a hung request on it will not be aborted at stop");
                    None
                }
            }
        };
        #[cfg(not(unix))]
        let socket = {
            let _ = stream;
            None
        };
        Self { socket }
    }
}

/// The "server is stopping" signal of one `serve_*` call.
#[derive(Clone, Debug)]
pub(crate) struct Stopper {
    inner: Arc<StopperInner>,
}

#[derive(Debug)]
struct StopperInner {
    /// Whether stop has begun, and the connections of requests hung until then.
    /// One mutex for both so a request that hangs concurrently with the stop is
    /// either aborted by `stop` or sees `stopped` and aborts itself.
    hung: Mutex<Hung>,
    stopped: watch::Sender<bool>,
}

#[derive(Debug, Default)]
struct Hung {
    stopped: bool,
    next_id: u64,
    conns: HashMap<u64, ConnHandle>,
}

/// Unregisters a hung connection when its request future is dropped, e.g.
/// because hyper saw the client go away before the server stopped; otherwise
/// the duplicate socket would keep the connection half-open until the stop.
struct Registration<'a> {
    stopper: &'a Stopper,
    id: u64,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.stopper.lock().conns.remove(&self.id);
    }
}

impl Stopper {
    /// A signal that has not fired.
    pub(crate) fn new() -> Self {
        Self {
            inner: Arc::new(StopperInner {
                hung: Mutex::new(Hung::default()),
                stopped: watch::Sender::new(false),
            }),
        }
    }

    /// Fires the signal: aborts the connections of hung requests, then wakes
    /// everything waiting in [`Stopper::stopped`].
    pub(crate) fn stop(&self) {
        let hung = {
            let mut hung = self.lock();
            hung.stopped = true;
            std::mem::take(&mut hung.conns)
        };
        for conn in hung.values() {
            conn.abort();
        }
        self.inner.stopped.send_replace(true);
    }

    /// Completes once [`Stopper::stop`] has been called.
    pub(crate) async fn stopped(&self) {
        let mut rx = self.inner.stopped.subscribe();
        // The sender lives in `self`, so `wait_for` cannot fail while we wait.
        let _ = rx.wait_for(|stopped| *stopped).await;
    }

    /// Holds a request without answering until the server stops; by then its
    /// connection has been shut down, so whatever the caller returns afterwards
    /// never reaches the client.
    pub(crate) async fn hang(&self, conn: ConnHandle) {
        let _registration = {
            let mut hung = self.lock();
            if hung.stopped {
                conn.abort();
                return;
            }
            let id = hung.next_id;
            hung.next_id += 1;
            hung.conns.insert(id, conn);
            Registration { stopper: self, id }
        };
        self.stopped().await;
    }

    /// Nothing panics while holding this lock, and the data stays consistent
    /// even if something did, so poisoning is ignored.
    fn lock(&self) -> std::sync::MutexGuard<'_, Hung> {
        self.inner
            .hung
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}
