//! Third parties the relay talks to, run by the tests: a receiver that counts effects per
//! idempotency key and can be told how to answer, and a TCP proxy that forwards a request and
//! then drops the reply (the receiver applied it; the relay never hears so), and its
//! protocol-blind cousin for brokers.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One request as the receiver saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    /// When it arrived.
    pub at: std::time::Instant,
}

/// How the receiver answers the next requests; the last entry repeats.
#[derive(Debug, Default)]
struct Script {
    /// Status and headers.
    answers: Vec<(u16, Vec<(String, String)>)>,
}

/// Shared state of a counting receiver.
#[derive(Debug, Default)]
pub struct Receiver {
    pub seen: Mutex<Vec<Seen>>,
    /// 2xx answers per idempotency key. A receiver that honours the key applies the first
    /// and acknowledges the rest: its effects per key are `min(hits, 1)`.
    hits: Mutex<HashMap<String, u32>>,
    script: Mutex<Script>,
}

impl Receiver {
    /// Answers `status` (with `Retry-After` seconds) to the next requests, in order.
    pub fn answer(&self, answers: &[(u16, Option<u64>)]) {
        let headers = |(status, secs): &(u16, Option<u64>)| {
            let retry = secs.map(|s| ("retry-after".to_owned(), s.to_string()));
            (*status, retry.into_iter().collect())
        };
        self.script.lock().unwrap().answers = answers.iter().map(headers).collect();
    }

    /// As [`Receiver::answer`], with the headers of each answer given (`Retry-After` as an
    /// HTTP date and the answer's own `Date`, say).
    pub fn answer_with(&self, answers: &[(u16, &[(&str, &str)])]) {
        let own = |(status, headers): &(u16, &[(&str, &str)])| {
            let headers = headers
                .iter()
                .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()));
            (*status, headers.collect())
        };
        self.script.lock().unwrap().answers = answers.iter().map(own).collect();
    }

    pub fn requests(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Requests answered 2xx for `key`.
    pub fn hits_of(&self, key: &str) -> u32 {
        self.hits.lock().unwrap().get(key).copied().unwrap_or(0)
    }

    /// Effects for `key` at a receiver that honours the idempotency key.
    pub fn effects_of(&self, key: &str) -> u32 {
        self.hits_of(key).min(1)
    }
}

async fn hook(
    State(r): State<Arc<Receiver>>,
    headers: HeaderMap,
    body: Bytes,
) -> impl IntoResponse {
    r.seen.lock().unwrap().push(Seen {
        headers: headers.clone(),
        body: body.to_vec(),
        at: std::time::Instant::now(),
    });
    let (status, reply_headers) = {
        let mut script = r.script.lock().unwrap();
        if script.answers.len() > 1 {
            script.answers.remove(0)
        } else {
            script.answers.first().cloned().unwrap_or((200, Vec::new()))
        }
    };
    if (200..300).contains(&status)
        && let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok())
    {
        *r.hits.lock().unwrap().entry(key.to_owned()).or_insert(0) += 1;
    }
    let mut res = StatusCode::from_u16(status)
        .unwrap_or(StatusCode::OK)
        .into_response();
    for (name, value) in reply_headers {
        if let (Ok(name), Ok(value)) = (
            axum::http::HeaderName::try_from(name),
            HeaderValue::from_str(&value),
        ) {
            res.headers_mut().insert(name, value);
        }
    }
    res
}

/// `GET /status/{key}`: whether the key was applied.
async fn status(State(r): State<Arc<Receiver>>, Path(key): Path<String>) -> impl IntoResponse {
    let applied = r.hits_of(&key) > 0;
    axum::Json(serde_json::json!({ "applied": applied }))
}

/// Starts a receiver on a loopback port.
pub async fn start() -> (Arc<Receiver>, SocketAddr) {
    let receiver = Arc::new(Receiver::default());
    let app = Router::new()
        .route("/hook", post(hook))
        .route("/status/{key}", get(status))
        .with_state(receiver.clone());
    (receiver, serve(app).await)
}

/// Serves `app` on a loopback port; returns its address.
pub async fn serve(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// A receiver that reads each request whole and never answers, holding the connection open.
/// Returns its address and a count of the requests it has read.
pub async fn silent() -> (SocketAddr, Arc<AtomicU32>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let read = Arc::new(AtomicU32::new(0));
    let counter = read.clone();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let counter = counter.clone();
            tokio::spawn(async move {
                let (mut request, mut buf) = (Vec::new(), [0u8; 8192]);
                while !complete(&request) {
                    match client.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                counter.fetch_add(1, Ordering::SeqCst);
                // Held until the sender gives up and closes it.
                let _ = client.read(&mut buf).await;
            });
        }
    });
    (addr, read)
}

/// A proxy in front of `upstream` that forwards each request whole, waits for the upstream's
/// answer, and then closes the client's connection without passing the answer on. Returns the
/// proxy's address and a counter of replies dropped (the fault, proven to have happened).
pub async fn dropping_proxy(upstream: SocketAddr) -> (SocketAddr, Arc<Mutex<u32>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let dropped = Arc::new(Mutex::new(0));
    let counter = dropped.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut client, _)) = listener.accept().await else {
                return;
            };
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 8192];
                // Read one whole request: headers, then Content-Length bytes of body.
                loop {
                    let Ok(n) = client.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    request.extend_from_slice(&buf[..n]);
                    if complete(&request) {
                        break;
                    }
                }
                let Ok(mut up) = TcpStream::connect(upstream).await else {
                    return;
                };
                if up.write_all(&request).await.is_err() {
                    return;
                }
                // Wait until the receiver answered: by then it has applied the request.
                let mut reply = [0u8; 1024];
                if matches!(up.read(&mut reply).await, Ok(n) if n > 0) {
                    *counter.lock().unwrap() += 1;
                }
                // Drop both connections: the relay sees the connection close with no answer.
                drop(client);
            });
        }
    });
    (addr, dropped)
}

/// A receiver whose keep-alive ends after `idle`, as gunicorn's (2 s) or Node's (5 s) does. A
/// request reaching a connection idle that long is dropped unanswered: it crossed the server's
/// close, and the client reads "connection closed before message completed" — the request
/// written, no answer. Returns the address and the number of requests so dropped.
pub async fn short_keep_alive(idle: std::time::Duration) -> (SocketAddr, Arc<AtomicU32>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let dropped = Arc::new(AtomicU32::new(0));
    let counter = dropped.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut answered: Option<std::time::Instant> = None;
                loop {
                    let mut request = Vec::new();
                    let mut buf = [0u8; 8192];
                    while !complete(&request) {
                        match conn.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    if answered.is_some_and(|at| at.elapsed() >= idle) {
                        counter.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                    let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                    if conn.write_all(ok).await.is_err() {
                        return;
                    }
                    answered = Some(std::time::Instant::now());
                }
            });
        }
    });
    (addr, dropped)
}

fn complete(request: &[u8]) -> bool {
    let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&request[..end]).to_ascii_lowercase();
    let length = head
        .lines()
        .find_map(|l| {
            l.strip_prefix("content-length:")
                .map(|v| v.trim().parse::<usize>().unwrap_or(0))
        })
        .unwrap_or(0);
    request.len() >= end + 4 + length
}

/// A TCP proxy in front of `upstream` (a broker) that passes bytes both ways until the client
/// has sent `marker` (a payload): it forwards those bytes, waits for the upstream's next bytes
/// (its answer: by then it holds the message), and drops both connections without passing the
/// answer on. Only the first connection carrying the marker is cut; later ones pass through,
/// as a healed network would. Returns the address and the number of cuts made (the fault,
/// proven to have happened).
pub async fn cutting_proxy(upstream: SocketAddr, marker: Vec<u8>) -> (SocketAddr, Arc<AtomicU32>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cuts = Arc::new(AtomicU32::new(0));
    let armed = Arc::new(AtomicBool::new(true));
    let counter = cuts.clone();
    tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                return;
            };
            let (counter, armed, marker) = (counter.clone(), armed.clone(), marker.clone());
            tokio::spawn(async move {
                let Ok(up) = TcpStream::connect(upstream).await else {
                    return;
                };
                pass_until_marker(client, up, &marker, &armed, &counter).await;
            });
        }
    });
    (addr, cuts)
}

async fn pass_until_marker(
    mut client: TcpStream,
    mut up: TcpStream,
    marker: &[u8],
    armed: &AtomicBool,
    cuts: &AtomicU32,
) {
    let mut sent = Vec::new();
    let (mut from_client, mut from_up) = ([0u8; 8192], [0u8; 8192]);
    loop {
        tokio::select! {
            r = client.read(&mut from_client) => {
                let n = match r { Ok(0) | Err(_) => return, Ok(n) => n };
                if up.write_all(&from_client[..n]).await.is_err() {
                    return;
                }
                sent.extend_from_slice(&from_client[..n]);
                if sent.windows(marker.len()).any(|w| w == marker)
                    && armed.swap(false, Ordering::SeqCst)
                {
                    // Wait until the broker answered: it has the message. Then cut.
                    if matches!(up.read(&mut from_up).await, Ok(n) if n > 0) {
                        cuts.fetch_add(1, Ordering::SeqCst);
                    }
                    return;
                }
            }
            r = up.read(&mut from_up) => {
                let n = match r { Ok(0) | Err(_) => return, Ok(n) => n };
                if client.write_all(&from_up[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}
