//! The answer a plaintext client gets on a TLS port, in its own protocol,
//! so that it reads as the mistake it is rather than as a broken
//! connection: a gRPC call fails with `UNAVAILABLE` and [`GRPC_MESSAGE`];
//! an HTTP request gets `400` and [`HTTP_MESSAGE`].

use std::convert::Infallible;

use axum::http::{HeaderValue, Request, Response, StatusCode, header};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

use super::Protocol;

/// The `grpc-message` a plaintext gRPC client gets on the TLS gRPC port.
pub const GRPC_MESSAGE: &str = "this Belay endpoint serves TLS, and the client connected without it: use an https:// engine URL (with --ca-file when the engine's certificate is from a private CA)";

/// The body of the `400` a plaintext HTTP client gets on a TLS port.
pub const HTTP_MESSAGE: &str =
    "This Belay endpoint serves TLS, and the request came without it: use an https:// URL.\n";

/// Serves the refusal on `stream` until the client closes it (the
/// listener's handshake timeout bounds it).
pub(super) async fn refuse(stream: TcpStream, protocol: Protocol) {
    let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
        std::future::ready(Ok::<_, Infallible>(refusal(&request, protocol)))
    });
    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

/// A gRPC call (by its content type, or any request on the gRPC port)
/// gets a trailers-only `UNAVAILABLE`; anything else a `400`.
fn refusal<B>(request: &Request<B>, protocol: Protocol) -> Response<String> {
    let grpc = protocol == Protocol::Grpc
        || request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/grpc"));
    let mut response = if grpc {
        let mut r = Response::new(String::new());
        let headers = r.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        // 14: UNAVAILABLE.
        headers.insert("grpc-status", HeaderValue::from_static("14"));
        headers.insert("grpc-message", grpc_message());
        r
    } else {
        let mut r = Response::new(HTTP_MESSAGE.to_owned());
        *r.status_mut() = StatusCode::BAD_REQUEST;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        r
    };
    // HTTP/2 has no `Connection` header; the timeout ends such a connection.
    if request.version() < axum::http::Version::HTTP_2 {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// [`GRPC_MESSAGE`] percent-encoded as gRPC wants (space and printable
/// ASCII but `%` stay as they are).
fn grpc_message() -> HeaderValue {
    let encoded: String = GRPC_MESSAGE
        .bytes()
        .map(|b| match b {
            b' '..=b'~' if b != b'%' => (b as char).to_string(),
            b => format!("%{b:02X}"),
        })
        .collect();
    HeaderValue::from_str(&encoded).unwrap_or_else(|_| HeaderValue::from_static("use TLS"))
}
