//! The stop signal every Belay process honours, shared by the engine, the
//! worker, `belay dev` and the example's binaries (feature `grpc`): one
//! definition, so they all stop the same way.

/// Completes on the first Ctrl-C (SIGINT) or SIGTERM (the signal
/// Kubernetes sends a pod it stops), and logs which one came. A handler
/// that cannot be installed is logged and that signal is not waited for
/// (the process then dies of it as usual, which the stores survive).
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("Ctrl-C received: stopping"),
        () = terminate => tracing::info!("SIGTERM received: stopping"),
    }
}
