//! The HTTP server loop: hyper HTTP/1.1 with real header-read and body timeouts, a lingering
//! close so that a refusal sent before the body was read reaches its client, and a graceful
//! shutdown that lets in-flight requests finish within a grace period and cuts the rest, never
//! answering 2xx without a commit.

use std::future::Future;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use crate::linger::{self, Lingering};
use crate::policy::Limits;

/// After a failed `accept` (out of file descriptors, say), wait this long before the next one
/// instead of spinning.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves `app` on `listener` until `shutdown` completes, then stops accepting, lets in-flight
/// requests finish within `limits.shutdown_grace`, cuts whatever is left, and returns. Of
/// `limits` it uses `header_timeout` and `shutdown_grace`; the router applies the others.
///
/// A request cut by the grace deadline loses its connection: its sender sees no answer and
/// retries, which is a duplicate if the commit happened. Nothing is ever answered 2xx without
/// its commit, because the answer is produced only after the store returns. When this returns,
/// no connection task of it is left running.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let mut builder = http1::Builder::new();
    // Slowloris: the timer starts when the server begins reading a request head, so a client
    // that sends nothing, or trickles its headers, is cut off after `header_timeout`. HTTP/1.1
    // only: webhook senders use it, and an HTTP/2 preface would escape this timer.
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let (io, left) = Lingering::new(stream);
                let service = TowerToHyperService::new(app.clone());
                let connection = graceful.watch(builder.serve_connection(TokioIo::new(io), service));
                connections.spawn(async move {
                    if let Err(e) = connection.await {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                    // Hyper has dropped the socket by now; one it closed cleanly is left here.
                    linger::close(&left).await;
                });
            }
            // Reap finished connections so the set does not grow with every one ever served.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    tracing::info!(
        in_flight = connections.len(),
        "shutting down: waiting for in-flight requests"
    );
    tokio::select! {
        () = graceful.shutdown() => tracing::info!("all requests finished"),
        () = tokio::time::sleep(limits.shutdown_grace) => {
            tracing::warn!(grace = ?limits.shutdown_grace, "grace period over: cutting remaining connections");
        }
    }
    // Aborting drops each connection's request future: a cut request is never answered.
    connections.shutdown().await;
    Ok(())
}
