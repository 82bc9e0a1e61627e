//! A counting HTTP receiver, the third party at the end of a route: it applies each request it
//! answers 2xx (counted per `Idempotency-Key` and per path tag, e.g. one tag per relay), can
//! be told to answer otherwise (5xx, 429 with `Retry-After`), can hold one tag's requests after
//! applying them (so the sender's reading of the answer can be paused), can answer slowly after
//! applying (past a sender's timeout), and answers a status URL for reconciliation.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio::sync::{Notify, watch};

/// The tag of requests to `POST /hook` (no tag in the path).
pub const UNTAGGED: &str = "";

#[derive(Debug, Default)]
struct Tally {
    /// Bodies applied per idempotency key, in arrival order.
    applied: HashMap<String, Vec<Vec<u8>>>,
    /// Applied requests per (key, tag).
    by_tag: HashMap<(String, String), u32>,
    /// Applied requests per tag.
    per_tag: HashMap<String, usize>,
    /// How the next requests are answered; the last entry repeats. Empty: 200.
    answers: Vec<(u16, Option<u64>)>,
    /// `(tag, after)`: requests of that tag are held, applied, once it has `after` applied.
    hold: Option<(String, usize)>,
    held: Vec<String>,
    /// How long an applied request waits before its answer.
    slow: Duration,
    /// Applied requests answered late (after `slow`, or never if the sender left first).
    slowed: usize,
    /// Requests seen at all (also those answered non-2xx).
    requests: usize,
}

/// The receiver; share the `Arc` [`Receiver::start`] returns.
#[derive(Debug)]
pub struct Receiver {
    state: Mutex<Tally>,
    /// Notified when the first held request waits.
    pub holding: Notify,
    /// The number of requests applied so far, for tests that wait for progress.
    pub applied_count: watch::Sender<usize>,
    released: watch::Sender<bool>,
}

impl Receiver {
    /// Listens on a free loopback port: `POST /hook`, `POST /hook/{tag}`, `GET /status/{key}`.
    pub async fn start() -> (Arc<Receiver>, SocketAddr) {
        let r = Arc::new(Receiver {
            state: Mutex::default(),
            holding: Notify::new(),
            applied_count: watch::Sender::new(0),
            released: watch::Sender::new(false),
        });
        let app = Router::new()
            .route("/hook", post(untagged))
            .route("/hook/{tag}", post(tagged))
            .route("/status/{key}", get(status))
            .with_state(r.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("receiver port");
        let addr = listener.local_addr().expect("receiver address");
        tokio::spawn(async move { axum::serve(listener, app).await });
        (r, addr)
    }

    /// Answers `(status, Retry-After seconds)` to the next requests in order; the last repeats.
    pub fn answer(&self, answers: &[(u16, Option<u64>)]) {
        self.state.lock().unwrap().answers = answers.to_vec();
    }

    /// Holds `tag`'s requests, already applied, once it has `after` applied, until
    /// [`Receiver::release`].
    pub fn hold(&self, tag: &str, after: usize) {
        self.state.lock().unwrap().hold = Some((tag.to_owned(), after));
    }

    /// Answers each request it applies only `after` that long (zero: at once), as a receiver
    /// that does its work and then stalls; a sender that gives up first never reads the answer.
    pub fn slow(&self, after: Duration) {
        self.state.lock().unwrap().slow = after;
    }

    /// Applied requests answered late so far, whether or not the sender was still waiting.
    pub fn slowed(&self) -> usize {
        self.state.lock().unwrap().slowed
    }

    /// Answers the held requests and holds nothing more.
    pub fn release(&self) {
        self.released.send_replace(true);
    }

    /// Keys of the requests held.
    pub fn held(&self) -> Vec<String> {
        self.state.lock().unwrap().held.clone()
    }

    /// Requests applied for `key` (every 2xx).
    pub fn hits_of(&self, key: &str) -> u32 {
        let s = self.state.lock().unwrap();
        s.applied.get(key).map_or(0, |b| b.len() as u32)
    }

    /// Effects of `key` at a receiver that honours `Idempotency-Key` (the first application
    /// counts, the rest are acknowledged) or, if not `honours_key`, one per application.
    pub fn effects_of(&self, key: &str, honours_key: bool) -> u32 {
        let hits = self.hits_of(key);
        if honours_key { hits.min(1) } else { hits }
    }

    /// Applications per key, all tags together.
    pub fn per_key(&self) -> HashMap<String, u32> {
        let s = self.state.lock().unwrap();
        s.applied
            .iter()
            .map(|(k, b)| (k.clone(), b.len() as u32))
            .collect()
    }

    /// The bodies applied per key, in arrival order.
    pub fn applied(&self) -> HashMap<String, Vec<Vec<u8>>> {
        self.state.lock().unwrap().applied.clone()
    }

    /// Applications from `tag`.
    pub fn by_tag(&self, tag: &str) -> usize {
        let s = self.state.lock().unwrap();
        s.per_tag.get(tag).copied().unwrap_or(0)
    }

    /// Whether `tag` applied every one of `keys`.
    pub fn delivered_all(&self, tag: &str, keys: &[String]) -> bool {
        let s = self.state.lock().unwrap();
        keys.iter()
            .all(|k| s.by_tag.contains_key(&(k.clone(), tag.to_owned())))
    }

    /// Requests received, whatever they were answered.
    pub fn requests(&self) -> usize {
        self.state.lock().unwrap().requests
    }
}

async fn untagged(State(r): State<Arc<Receiver>>, headers: HeaderMap, body: Bytes) -> Response {
    hook(r, UNTAGGED.to_owned(), headers, body).await
}

async fn tagged(
    State(r): State<Arc<Receiver>>,
    Path(tag): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    hook(r, tag, headers, body).await
}

async fn hook(r: Arc<Receiver>, tag: String, headers: HeaderMap, body: Bytes) -> Response {
    let Some(key) = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
    else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let (status, retry_after, held, slow) = {
        let mut s = r.state.lock().unwrap();
        s.requests += 1;
        let (status, retry_after) = if s.answers.len() > 1 {
            s.answers.remove(0)
        } else {
            s.answers.first().copied().unwrap_or((200, None))
        };
        let applies = (200..300).contains(&status);
        let held = applies
            && !*r.released.borrow()
            && s.hold.as_ref().is_some_and(|(t, after)| {
                *t == tag && s.per_tag.get(&tag).copied().unwrap_or(0) >= *after
            });
        if applies {
            // Applied before it is answered: the effect counts whether or not the sender
            // ever reads the answer.
            s.applied
                .entry(key.clone())
                .or_default()
                .push(body.to_vec());
            *s.by_tag.entry((key.clone(), tag.clone())).or_default() += 1;
            *s.per_tag.entry(tag).or_default() += 1;
            r.applied_count.send_modify(|n| *n += 1);
        }
        if held {
            s.held.push(key);
        }
        let slow = if applies { s.slow } else { Duration::ZERO };
        if !slow.is_zero() {
            s.slowed += 1;
        }
        (status, retry_after, held, slow)
    };
    if held {
        r.holding.notify_one();
        let _ = r.released.subscribe().wait_for(|done| *done).await;
    }
    // The third party's own slowness, not a test's barrier: the effect is already counted.
    if !slow.is_zero() {
        tokio::time::sleep(slow).await;
    }
    let mut res = StatusCode::from_u16(status)
        .unwrap_or(StatusCode::OK)
        .into_response();
    if let Some(secs) = retry_after {
        res.headers_mut().insert("retry-after", secs.into());
    }
    res
}

/// `GET /status/{key}`: whether the key was applied, for a route's reconciliation.
async fn status(State(r): State<Arc<Receiver>>, Path(key): Path<String>) -> impl IntoResponse {
    let applied = r.hits_of(&key) > 0;
    axum::Json(serde_json::json!({ "applied": applied }))
}
