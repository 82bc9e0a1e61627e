//! The HTTP server loop: hyper HTTP/1.1 with real header-read and body timeouts, a lingering
//! close so that a refusal sent before the body was read reaches its client, and a graceful
//! shutdown that lets in-flight requests finish within a grace period and cuts the rest, never
//! answering 2xx without a commit.

use std::future::Future;
use std::os::fd::AsFd;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::policy::Limits;

/// After a failed `accept` (out of file descriptors, say), wait this long before the next one
/// instead of spinning.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The lingering close: after a connection ends cleanly its socket is shut for writing and
/// what the client still sends is read and dropped, for at most `LINGER_TIME` in all, until
/// `LINGER_IDLE` passes without a byte, or until `LINGER_BYTES`, then it is closed.
const LINGER_TIME: Duration = Duration::from_secs(5);
const LINGER_IDLE: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 64 << 20;

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
                // A second handle on the socket keeps it open after hyper drops its own, for
                // the lingering close.
                let linger = stream.as_fd().try_clone_to_owned().ok();
                let service = TowerToHyperService::new(app.clone());
                let connection = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
                connections.spawn(async move {
                    let ended = connection.await;
                    match (ended, linger) {
                        (Ok(()), Some(fd)) => linger_close(std::net::TcpStream::from(fd)).await,
                        (Ok(()), None) => {}
                        // A timed-out or broken connection is closed at once: lingering would
                        // hand a slow client the time its timeout just took away.
                        (Err(e), _) => tracing::debug!(%peer, error = %e, "connection ended with an error"),
                    }
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

/// Closes a connection whose last answer is written. A refusal (413, 404, 408) is often sent
/// before the request's body is read; closing a socket with unread bytes in it makes the kernel
/// answer them with a reset, which can reach the client before it has read the refusal, or
/// while it is still writing the body, and many clients then report a broken connection
/// instead of the answer. Shutting the write side and reading the rest away lets the client
/// finish sending and read the answer.
async fn linger_close(socket: std::net::TcpStream) {
    // The socket is already non-blocking: the flag belongs to the socket, shared by both handles.
    let Ok(mut stream) = TcpStream::from_std(socket) else {
        return;
    };
    let _ = stream.shutdown().await;
    let end = Instant::now() + LINGER_TIME;
    let mut buf = vec![0u8; 64 << 10];
    let mut drained = 0usize;
    while drained < LINGER_BYTES {
        let until = end.min(Instant::now() + LINGER_IDLE);
        match tokio::time::timeout_at(until, stream.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => drained += n,
            _ => break,
        }
    }
}
