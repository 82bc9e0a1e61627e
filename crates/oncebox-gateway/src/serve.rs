//! The HTTP server loop: hyper with real header-read and body timeouts, and a graceful shutdown
//! that lets in-flight requests finish (or cuts them, never answering 2xx without a commit).

use std::future::Future;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

use crate::policy::Limits;

/// Serves `app` on `listener` until `shutdown` completes, then stops accepting, lets in-flight
/// requests finish within `limits.shutdown_grace`, and returns.
///
/// A request cut by the grace deadline loses its connection: its sender sees no answer and
/// retries, which is a duplicate if the commit happened. Nothing is ever answered 2xx without
/// its commit, because the answer is produced only after the store returns.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let mut builder = Builder::new(TokioExecutor::new());
    // Slowloris: a client that trickles its headers is cut off after `header_timeout`.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    // Running out of file descriptors must not end the server.
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let service = TowerToHyperService::new(app.clone());
                let connection = builder.serve_connection(TokioIo::new(stream), service).into_owned();
                let connection = graceful.watch(connection);
                tokio::spawn(async move {
                    if let Err(e) = connection.await {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    tracing::info!("shutting down: waiting for in-flight requests");
    tokio::select! {
        () = graceful.shutdown() => tracing::info!("all requests finished"),
        () = tokio::time::sleep(limits.shutdown_grace) => {
            tracing::warn!(grace = ?limits.shutdown_grace, "grace period over: cutting remaining connections");
        }
    }
    Ok(())
}
