//! A TCP fault proxy between a client and its server (relay → receiver, gateway → PostgreSQL),
//! for a machine without netem or iptables. Its [`Mode`] is switched at run time and applies to
//! live connections as well as new ones. Every fault it injects is counted in [`Stats`], so a
//! test proves the fault happened.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

mod strand;

/// What the proxy does to traffic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// Bytes pass both ways.
    Pass,
    /// Each chunk, either way, is held this long before it is passed on.
    Delay(Duration),
    /// Each chunk the server sends is held this long; the client's pass at once: a path slow
    /// one way only, whose round trip's midpoint is not its middle.
    DelayReplies(Duration),
    /// Nothing moves and nothing is refused: connections stay open, bytes wait unread (as in
    /// a network that drops packets, which TCP retransmits once it heals). New connections are
    /// accepted and wait too. Switching back delivers everything held, late.
    BlackHole,
    /// Every connection, open or new, is closed at once with a reset.
    Reset,
    /// The client's bytes are forwarded; the server's next answer to them is dropped and both
    /// connections are cut: the server acted, the client never hears so. With a marker, only
    /// an answer to bytes containing it is dropped (e.g. `COMMIT`); the rest passes.
    DropReply,
    /// As [`Mode::DropReply`] until one answer was dropped (counted in
    /// [`Stats::dropped_replies`]), then as [`Mode::Pass`]: a reply lost once, on a path that
    /// works again for the repetition, however soon the client repeats.
    DropFirstReply,
    /// As [`Mode::DropReply`], but the client is sent these bytes in the answer's place before
    /// the cut: what a pooler in between says for a server connection it lost (PostgreSQL's
    /// `ErrorResponse` of class 08, say) after the server acted. Counted as a dropped reply.
    AnswerInstead(Vec<u8>),
    /// The client's bytes are forwarded and both connections are cut at once, without waiting
    /// for an answer: the server holds the request and may act on it later (after a lock it
    /// waits for), while the client already sees its connection gone. The server's side ends
    /// with a FIN, so what it received is read before the end. With a marker, only bytes
    /// containing it are cut after.
    CutRequest,
    /// The client's next bytes (with a marker, bytes containing it) and all it sends after are
    /// read and dropped, and nothing is answered; the connection is left open until the
    /// client closes it: a network path gone silent under an open connection (a server failed
    /// over to another address, a firewall that forgot it), with neither a reset nor a FIN.
    Strand,
}

/// Faults injected so far.
#[derive(Debug, Default)]
pub struct Stats {
    pub connections: AtomicU64,
    /// Connections closed by [`Mode::Reset`].
    pub resets: AtomicU64,
    /// Answers dropped by [`Mode::DropReply`] after the request reached the server.
    pub dropped_replies: AtomicU64,
    /// Connections cut by [`Mode::CutRequest`] right after a request was forwarded.
    pub cut_requests: AtomicU64,
    /// Chunks that waited at least once in [`Mode::BlackHole`] or [`Mode::Delay`].
    pub held: AtomicU64,
    /// Connections [`Mode::Strand`] left without an answer, the bytes their clients sent into
    /// the void, and those whose client then gave up on them (closed them).
    pub stranded: AtomicU64,
    pub stranded_bytes: AtomicU64,
    pub stranded_closed: AtomicU64,
}

impl Stats {
    pub fn get(n: &AtomicU64) -> u64 {
        n.load(Ordering::SeqCst)
    }
}

/// A running proxy; it stops accepting when dropped (open connections end with their peers).
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    pub stats: Arc<Stats>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream`, passing everything.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        Proxy::start_with_marker(upstream, None).await
    }

    /// As [`Proxy::start`]; in [`Mode::DropReply`], [`Mode::AnswerInstead`],
    /// [`Mode::CutRequest`] and [`Mode::Strand`] only client bytes containing `marker` are
    /// acted on.
    pub async fn start_with_marker(upstream: SocketAddr, marker: Option<Vec<u8>>) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy port");
        let addr = listener.local_addr().expect("proxy address");
        let (mode, _) = watch::channel(Mode::Pass);
        let stats = Arc::new(Stats::default());
        let (modes, counters) = (mode.clone(), stats.clone());
        let marker = Arc::new(marker);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                counters.connections.fetch_add(1, Ordering::SeqCst);
                let (modes, stats, marker) = (modes.subscribe(), counters.clone(), marker.clone());
                tokio::spawn(async move {
                    let _ = client.set_nodelay(true);
                    let _ = connection(client, upstream, modes, &stats, marker.as_deref()).await;
                });
            }
        });
        Proxy {
            addr,
            mode,
            stats,
            task,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Switches every connection, open and new, to `mode`.
    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    pub fn mode(&self) -> Mode {
        self.mode.borrow().clone()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A PostgreSQL URL whose connections stay in plain text (`sslmode=disable`): a proxy that
/// acts on the bytes it sees (a marker such as `COMMIT`) sees nothing of a TLS session, which
/// the default `sslmode=prefer` opens wherever the server offers one.
pub fn plaintext(url: &str) -> String {
    let joint = if url.contains('?') { '&' } else { '?' };
    format!("{url}{joint}sslmode=disable")
}

/// Closes with a reset (linger zero), not a graceful FIN.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

/// Waits while the mode holds traffic; returns the mode that lets it move (or resets).
async fn wait_while_held(modes: &mut watch::Receiver<Mode>, stats: &Stats) -> Mode {
    let mut counted = false;
    loop {
        let mode = modes.borrow_and_update().clone();
        if mode != Mode::BlackHole {
            return mode;
        }
        if !counted {
            stats.held.fetch_add(1, Ordering::SeqCst);
            counted = true;
        }
        if modes.changed().await.is_err() {
            return Mode::Reset;
        }
    }
}

async fn connection(
    client: TcpStream,
    upstream: SocketAddr,
    mut modes: watch::Receiver<Mode>,
    stats: &Stats,
    marker: Option<&[u8]>,
) -> std::io::Result<()> {
    // A new connection in a black hole is accepted but not connected onwards until it heals.
    if wait_while_held(&mut modes, stats).await == Mode::Reset {
        stats.resets.fetch_add(1, Ordering::SeqCst);
        reset(client);
        return Ok(());
    }
    let up = TcpStream::connect(upstream).await?;
    let _ = up.set_nodelay(true);
    let (mut client, mut up) = (client, up);
    let (mut from_client, mut from_up) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
    // Client bytes forwarded in DropReply mode (matching the marker) whose answer is due.
    let mut cut_next_answer = false;
    // The end of the client's previous chunk, so a marker split across two reads is found.
    let mut tail: Vec<u8> = Vec::new();
    loop {
        let mode = wait_while_held(&mut modes, stats).await;
        if mode == Mode::Reset {
            stats.resets.fetch_add(1, Ordering::SeqCst);
            reset(client);
            reset(up);
            return Ok(());
        }
        tokio::select! {
            r = client.read(&mut from_client) => {
                let n = r?;
                if n == 0 {
                    return up.shutdown().await;
                }
                let chunk = &from_client[..n];
                let mode = hold(&mut modes, stats, false).await;
                let mut marked = false;
                let first_left = mode == Mode::DropFirstReply
                    && stats.dropped_replies.load(Ordering::SeqCst) == 0;
                if first_left
                    || matches!(
                        mode,
                        Mode::DropReply | Mode::AnswerInstead(_) | Mode::CutRequest | Mode::Strand
                    )
                {
                    let mut seen = std::mem::take(&mut tail);
                    seen.extend_from_slice(chunk);
                    marked = marker.is_none_or(|m| seen.windows(m.len()).any(|w| w == m));
                    let keep = marker.map_or(0, |m| m.len().saturating_sub(1));
                    tail = seen[seen.len().saturating_sub(keep)..].to_vec();
                }
                if marked && mode == Mode::Strand {
                    return strand::stranded(client, up, n, stats).await;
                }
                up.write_all(chunk).await?;
                if marked && mode == Mode::CutRequest {
                    stats.cut_requests.fetch_add(1, Ordering::SeqCst);
                    reset(client);
                    up.shutdown().await?;
                    // Drained, not dropped: closing with unread bytes would send the server
                    // a reset, and it must be free to read the request and act on it.
                    while up.read(&mut from_up).await? > 0 {}
                    return Ok(());
                }
                cut_next_answer |= marked;
            }
            r = up.read(&mut from_up) => {
                let n = r?;
                if n == 0 {
                    return client.shutdown().await;
                }
                let instead = match &*modes.borrow() {
                    Mode::DropReply => Some(Vec::new()),
                    Mode::DropFirstReply if stats.dropped_replies.load(Ordering::SeqCst) == 0 => {
                        Some(Vec::new())
                    }
                    Mode::AnswerInstead(bytes) => Some(bytes.clone()),
                    _ => None,
                };
                if let Some(instead) = instead.filter(|_| cut_next_answer) {
                    // The server answered, so it has acted on the request: drop the answer.
                    stats.dropped_replies.fetch_add(1, Ordering::SeqCst);
                    if instead.is_empty() {
                        reset(client);
                    } else {
                        // Closed, not reset: a reset could discard the bytes before they
                        // are read.
                        client.write_all(&instead).await?;
                        client.shutdown().await?;
                    }
                    reset(up);
                    return Ok(());
                }
                cut_next_answer = false;
                hold(&mut modes, stats, true).await;
                client.write_all(&from_up[..n]).await?;
            }
            changed = modes.changed() => {
                // Re-evaluate the new mode at the top of the loop; a closed channel means the
                // proxy is gone.
                if changed.is_err() {
                    return Ok(());
                }
            }
        }
    }
}

/// Applies a delay or a black hole to a chunk already read (`reply`: the server's); returns the
/// mode it then passes in.
async fn hold(modes: &mut watch::Receiver<Mode>, stats: &Stats, reply: bool) -> Mode {
    let mode = modes.borrow().clone();
    match mode {
        Mode::Delay(d) | Mode::DelayReplies(d) if reply || matches!(mode, Mode::Delay(_)) => {
            stats.held.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(d).await;
            modes.borrow().clone()
        }
        Mode::BlackHole => wait_while_held(modes, stats).await,
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server that counts the chunks it received (it "acted" on them).
    pub(super) async fn echo() -> (SocketAddr, Arc<AtomicU64>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let got = Arc::new(AtomicU64::new(0));
        let count = got.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let count = count.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 {
                            return;
                        }
                        // Counted before the echo leaves: once any reply byte can reach the
                        // proxy (and, through it, the client), the count already holds it.
                        count.fetch_add(1, Ordering::SeqCst);
                        if s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (addr, got)
    }

    async fn roundtrip(addr: SocketAddr, msg: &[u8]) -> std::io::Result<Vec<u8>> {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(msg).await?;
        let mut buf = vec![0u8; msg.len()];
        s.read_exact(&mut buf).await?;
        Ok(buf)
    }

    #[test]
    fn every_mode_does_what_it_says_and_is_counted() {
        crate::run(async {
            let (server, got) = echo().await;
            let proxy = Proxy::start_with_marker(server, Some(b"COMMIT".to_vec())).await;
            assert_eq!(roundtrip(proxy.addr(), b"hello").await.unwrap(), b"hello");

            proxy.set(Mode::DropReply);
            assert_eq!(roundtrip(proxy.addr(), b"SELECT").await.unwrap(), b"SELECT");
            let before = got.load(Ordering::SeqCst);
            assert!(
                roundtrip(proxy.addr(), b"COMMIT").await.is_err(),
                "answer dropped"
            );
            assert_eq!(
                got.load(Ordering::SeqCst),
                before + 1,
                "the server acted on it"
            );
            assert_eq!(Stats::get(&proxy.stats.dropped_replies), 1);

            // The request reaches the server; the client's connection is gone before any
            // answer.
            proxy.set(Mode::CutRequest);
            let before = got.load(Ordering::SeqCst);
            assert!(roundtrip(proxy.addr(), b"COMMIT").await.is_err(), "cut");
            crate::child::until_async(
                "the server got the request that was cut",
                Duration::from_secs(5),
                || got.load(Ordering::SeqCst) == before + 1,
            )
            .await;
            assert_eq!(Stats::get(&proxy.stats.cut_requests), 1);

            proxy.set(Mode::Reset);
            assert!(roundtrip(proxy.addr(), b"x").await.is_err());
            assert!(Stats::get(&proxy.stats.resets) >= 1);

            // A black hole holds the exchange until it heals, then delivers it.
            proxy.set(Mode::BlackHole);
            let held = tokio::spawn(roundtrip(proxy.addr(), b"late"));
            crate::child::until_async(
                "the connection waits in the black hole",
                Duration::from_secs(5),
                || Stats::get(&proxy.stats.held) >= 1,
            )
            .await;
            assert!(!held.is_finished());
            proxy.set(Mode::Pass);
            assert_eq!(held.await.unwrap().unwrap(), b"late");

            proxy.set(Mode::Delay(Duration::from_millis(50)));
            let start = std::time::Instant::now();
            assert_eq!(roundtrip(proxy.addr(), b"slow").await.unwrap(), b"slow");
            assert!(
                start.elapsed() >= Duration::from_millis(100),
                "delayed both ways"
            );
        });
    }
}
