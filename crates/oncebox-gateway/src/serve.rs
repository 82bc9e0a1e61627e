//! The HTTP server loop: hyper HTTP/1.1 with real header-read and body timeouts, a lingering
//! close so that a refusal sent before the body was read reaches its client, `Connection:
//! close` on such a refusal, and a graceful shutdown that lets in-flight requests finish within
//! a grace period and cuts the rest, never answering 2xx without a commit.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderValue, Request, header};
use axum::response::Response;
use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tower::ServiceExt as _;

use crate::linger::{self, Lingering};
use crate::peers::{Arriving, Peer, PeerBusy, Peers};
use crate::policy::Limits;

/// After a failed `accept` (out of file descriptors, say), wait this long before the next one
/// instead of spinning.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves `app` on `listener` until `shutdown` completes, then stops accepting, lets in-flight
/// requests finish within `limits.shutdown_grace`, cuts whatever is left, and returns. Of
/// `limits` it uses `connections`, `bodies_per_peer`, `header_timeout` (which also bounds a
/// write that makes no progress: a client not reading its answers) and `shutdown_grace`; the
/// router applies the others.
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
    let open = Arc::new(Semaphore::new(limits.connections.max(1)));
    let peers = Peers::new(limits.bodies_per_peer);
    let mut full = false;
    tokio::pin!(shutdown);
    loop {
        // A connection is accepted only with a place for it: past the cap, new ones wait in
        // the backlog until one ends.
        let place = match Arc::clone(&open).try_acquire_owned() {
            Ok(place) => place,
            Err(_) => {
                if !full {
                    tracing::warn!(
                        connections = limits.connections,
                        "connection limit reached: new connections wait until one ends"
                    );
                }
                full = true;
                tokio::select! {
                    place = Arc::clone(&open).acquire_owned() => match place {
                        Ok(place) => place,
                        Err(_) => break,
                    },
                    Some(_) = connections.join_next(), if !connections.is_empty() => continue,
                    () = &mut shutdown => break,
                }
            }
        };
        // Said again only once a tenth of the places came free: a flood sitting at the cap
        // would otherwise be said at every dip.
        full = full && open.available_permits() < limits.connections.max(10) / 10;
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
                let (io, left) = Lingering::new(stream, limits.header_timeout);
                let app = app.clone();
                let bodies = peers.clone().map(|peers| (peers, Peer::of(peer.ip())));
                let service = hyper::service::service_fn(move |request| {
                    answer(app.clone(), request, bodies.clone())
                });
                let connection = graceful.watch(builder.serve_connection(TokioIo::new(io), service));
                connections.spawn(async move {
                    let _place = place;
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

/// Runs `app` on `request`, and asks for the connection's close when the answer leaves part of
/// the request's body unread (a 413 by its declared length, a 404 or 401 decided on the head).
///
/// Why: hyper then does not keep the connection (the rest of the body is still on it), but
/// without `Connection: close` in the answer a pooled client takes the connection for alive,
/// sends its next request on it and meets the close instead of an answer (Python's `requests`
/// reports `RemoteDisconnected`). With the header, hyper closes after the answer and the
/// client knows. A request with no body costs nothing more; one with a body, one small
/// allocation.
///
/// The body is also counted against its peer's cap while the server waits for it
/// (`peers.rs`); `bodies` is `None` without a cap.
async fn answer(
    app: Router,
    request: Request<Incoming>,
    bodies: Option<(Arc<Peers>, Peer)>,
) -> Result<Response, Infallible> {
    if request.body().is_end_stream() {
        return app.oneshot(request).await;
    }
    let ended = Arc::new(AtomicBool::new(false));
    let request = request.map(|inner| Tracked {
        inner,
        ended: Arc::clone(&ended),
        bodies,
        arriving: None,
    });
    let mut response = app.oneshot(request).await?;
    if !ended.load(Ordering::Relaxed) {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    Ok(response)
}

/// A request body that records, in `ended`, that it was read to its end, and counts against
/// its peer while its reader waits for it.
struct Tracked {
    inner: Incoming,
    ended: Arc<AtomicBool>,
    bodies: Option<(Arc<Peers>, Peer)>,
    /// Counted as arriving: from the first read that found nothing there to its end.
    arriving: Option<Arriving>,
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) else {
            let counted = self.arriving.is_some() || self.ended.load(Ordering::Relaxed);
            if let (false, Some((peers, peer))) = (counted, &self.bodies) {
                let Some(arriving) = peers.enter(*peer) else {
                    let cap = peers.cap();
                    crate::quiet::quietly!(
                        warn,
                        %peer,
                        cap,
                        "request body refused: its client has as many arriving as limits.bodies_per_peer allows"
                    );
                    return Poll::Ready(Some(Err(Box::new(PeerBusy { cap }))));
                };
                self.arriving = Some(arriving);
            }
            return Poll::Pending;
        };
        // The last data frame of a body of known length already ends it: a reader that stops
        // there, at its length, has read it all.
        if frame.is_none() || self.inner.is_end_stream() {
            self.ended.store(true, Ordering::Relaxed);
            self.arriving = None;
        }
        Poll::Ready(frame.map(|f| f.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
