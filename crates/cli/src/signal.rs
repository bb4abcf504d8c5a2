//! Waiting for the operating system's request to stop: SIGINT or SIGTERM on Unix, Ctrl-C
//! elsewhere.

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
#[cfg(unix)]
pub(crate) async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler installs");
    tokio::select! {
        _ = ctrl_c => {}
        _ = term.recv() => {}
    }
}

/// Resolves on Ctrl-C (there is no SIGTERM outside Unix).
#[cfg(not(unix))]
pub async fn shutdown_signal() {
    if let Err(e) = tokio::signal::ctrl_c().await {
        tracing::error!(error = %e, "cannot listen for Ctrl-C; stop the process another way");
        std::future::pending::<()>().await;
    }
}
