//! The lingering close: a connection that hyper ends cleanly is shut for writing and read to
//! its end before its socket closes, so that a refusal sent before the request's body was read
//! reaches a client that is still sending that body. Also the write stall: a client that takes
//! no byte of its answer for a while is cut off.
//!
//! Why: a 413, 404 or 408 is often answered before the body is read. Closing a socket with
//! bytes still arriving makes the kernel answer them with a reset, which can reach the client
//! before it has read the refusal, or while it is still writing the body; many clients then
//! report a broken connection instead of the answer (and retry a request that can never
//! succeed). Shutting the write side and reading the rest away lets the client finish sending
//! and read the answer.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

/// At most this long in all, until this long passes without a byte, or until this much is read
/// away; then the socket closes.
const LINGER_TIME: Duration = Duration::from_secs(5);
const LINGER_IDLE: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 64 << 20;

/// Where a cleanly closed connection's socket waits for its lingering close.
pub(crate) type Slot = Arc<Mutex<Option<TcpStream>>>;

/// The socket as hyper sees it: every call goes straight to the stream. When hyper drops it,
/// a stream hyper shut down cleanly moves to `slot` instead of closing; one hyper dropped
/// without a shutdown (a timeout, a broken connection) closes at once, so a slow client gains
/// no time.
///
/// A write that makes no progress for `stall` fails with `TimedOut`, and hyper drops the
/// connection. Why: hyper has no write timeout, and while an answer waits to be written it
/// reads no next request, so its header timer never starts: a client that sends requests and
/// never reads the answers (a full receive window) held its connection, with its descriptor,
/// for as long as the process ran.
#[derive(Debug)]
pub(crate) struct Lingering {
    stream: Option<TcpStream>,
    shut: bool,
    slot: Slot,
    stall: Duration,
    /// Armed when a write or flush first waits, disarmed by any progress.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl Lingering {
    pub(crate) fn new(stream: TcpStream, stall: Duration) -> (Lingering, Slot) {
        let slot = Slot::default();
        let io = Lingering {
            stream: Some(stream),
            shut: false,
            slot: Arc::clone(&slot),
            stall,
            stalled: None,
        };
        (io, slot)
    }

    /// `written` as the write's answer, with the stall timer armed while it waits and an
    /// error once it has waited `stall` without progress.
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        written: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if written.is_ready() {
            self.stalled = None;
            return written;
        }
        let stall = self.stall;
        let timer = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(stall)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client took no byte of its answer for {stall:?}"),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn stream(&mut self) -> Pin<&mut TcpStream> {
        // `stream` is taken only in `drop`.
        Pin::new(self.stream.as_mut().expect("stream taken before drop"))
    }
}

impl Drop for Lingering {
    fn drop(&mut self) {
        if self.shut {
            let stream = self.stream.take();
            *self.slot.lock().unwrap_or_else(PoisonError::into_inner) = stream;
        }
    }
}

impl AsyncRead for Lingering {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.get_mut().stream().poll_read(cx, buf)
    }
}

impl AsyncWrite for Lingering {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = this.stream().poll_write(cx, buf);
        this.watch(cx, written)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = this.stream().poll_write_vectored(cx, bufs);
        this.watch(cx, written)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream
            .as_ref()
            .is_some_and(TcpStream::is_write_vectored)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let flushed = this.stream().poll_flush(cx);
        this.watch(cx, flushed)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let done = this.stream().poll_shutdown(cx);
        // Only a shutdown that went through lingers: a failed one leaves a broken socket.
        this.shut = matches!(done, Poll::Ready(Ok(())));
        done
    }
}

/// The lingering close of a socket hyper left in `slot`, if it left one.
pub(crate) async fn close(slot: &Slot) {
    let stream = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
    let Some(mut stream) = stream else {
        return;
    };
    let end = Instant::now() + LINGER_TIME;
    let mut buf = vec![0u8; 16 << 10];
    let mut drained = 0usize;
    while drained < LINGER_BYTES {
        let until = end.min(Instant::now() + LINGER_IDLE);
        match tokio::time::timeout_at(until, stream.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => drained += n,
            _ => break,
        }
    }
}
