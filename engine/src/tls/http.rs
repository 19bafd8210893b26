//! The HTTP endpoints (axum) served on a [`Listener`], with each request's
//! [`PeerInfo`] as an extension.

use std::future::Future;

use axum::Router;
use axum::extract::{ConnectInfo, Request};
use axum::middleware::Next;
use axum::response::Response;

use super::{Listener, PeerInfo};

/// Serves `router` on `listener` until `shutdown` completes (then
/// gracefully: open requests finish). Every request carries the
/// connection's [`PeerInfo`] both as the extension `PeerInfo` (the type
/// gRPC handlers look for too) and as `ConnectInfo<PeerInfo>`.
///
/// Errors: the server's I/O error.
pub async fn serve_http(
    listener: impl Into<Listener>,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = router
        .layer(axum::middleware::from_fn(peer_extension))
        .into_make_service_with_connect_info::<PeerInfo>();
    axum::serve(listener.into(), app)
        .with_graceful_shutdown(shutdown)
        .await
}

async fn peer_extension(mut request: Request, next: Next) -> Response {
    if let Some(ConnectInfo(peer)) = request.extensions().get::<ConnectInfo<PeerInfo>>() {
        let peer = peer.clone();
        request.extensions_mut().insert(peer);
    }
    next.run(request).await
}
