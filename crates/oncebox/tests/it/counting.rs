//! The receiver of the multi-node test: counts deliveries per idempotency key and per relay (each
//! relay posts to `/hook/{relay}`), and can hold one relay's requests, so the test pauses that
//! relay after the receiver applied them and before the relay read the answers. It notes any
//! key it is handling twice at once.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use tokio::sync::{Notify, watch};

/// The relays the receiver tells apart.
pub const RELAYS: usize = 2;
/// How long the receiver takes to apply a delivery.
const WORK: std::time::Duration = std::time::Duration::from_millis(2);

#[derive(Default)]
struct Counts {
    /// Deliveries of each key, by relay.
    hits: HashMap<String, [u32; RELAYS]>,
    by_relay: [usize; RELAYS],
    /// `(relay, after)`: that relay's requests are held once it delivered `after` of them.
    hold: Option<(usize, usize)>,
    /// Keys of the requests held.
    held: Vec<String>,
    /// Requests of each key being handled now, and the keys that ever had two at once (two
    /// relays sending one delivery together, which fenced leases must prevent), with when the
    /// second began.
    in_flight: HashMap<String, u32>,
    overlapped: Vec<(String, std::time::Instant)>,
}

/// One request of `key` being handled: counted in from its start to its end or its drop (the
/// relay gave up on it).
struct Handling<'a> {
    counts: &'a Mutex<Counts>,
    key: String,
}

impl<'a> Handling<'a> {
    fn start(counts: &'a Mutex<Counts>, key: &str) -> Handling<'a> {
        let mut c = counts.lock().unwrap();
        let n = c.in_flight.entry(key.to_owned()).or_default();
        *n += 1;
        if *n > 1 {
            c.overlapped
                .push((key.to_owned(), std::time::Instant::now()));
        }
        Handling {
            counts,
            key: key.to_owned(),
        }
    }
}

impl Drop for Handling<'_> {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = c.in_flight.get_mut(&self.key) {
            *n -= 1;
        }
    }
}

pub struct Receiver {
    counts: Mutex<Counts>,
    /// The first request was held.
    pub holding: Notify,
    released: watch::Sender<bool>,
}

impl Receiver {
    /// Listens on a free loopback port; answers 200 to every delivery.
    pub async fn start() -> (Arc<Receiver>, SocketAddr) {
        let r = Arc::new(Receiver {
            counts: Mutex::default(),
            holding: Notify::new(),
            released: watch::Sender::new(false),
        });
        let app = axum::Router::new()
            .route("/hook/{relay}", axum::routing::post(hook))
            .with_state(r.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (r, addr)
    }

    /// Holds `relay`'s requests once it has delivered `after`, until [`Receiver::release`].
    pub fn hold(&self, relay: usize, after: usize) {
        self.counts.lock().unwrap().hold = Some((relay, after));
    }

    /// Answers the held requests (the effect counts now) and holds nothing more.
    pub fn release(&self) {
        self.released.send_replace(true);
    }

    pub fn held(&self) -> Vec<String> {
        self.counts.lock().unwrap().held.clone()
    }

    /// Whether `relay` delivered every one of `keys`.
    pub fn delivered_all(&self, relay: usize, keys: &[String]) -> bool {
        let c = self.counts.lock().unwrap();
        keys.iter()
            .all(|k| c.hits.get(k).is_some_and(|h| h[relay] > 0))
    }

    /// Deliveries per key, all relays together.
    pub fn per_key(&self) -> HashMap<String, u32> {
        let c = self.counts.lock().unwrap();
        c.hits
            .iter()
            .map(|(k, h)| (k.clone(), h.iter().sum()))
            .collect()
    }

    pub fn by_relay(&self) -> [usize; RELAYS] {
        self.counts.lock().unwrap().by_relay
    }

    /// Keys that had two requests in the receiver at once, with when the second began.
    pub fn overlapped(&self) -> Vec<(String, std::time::Instant)> {
        self.counts.lock().unwrap().overlapped.clone()
    }
}

async fn hook(
    State(r): State<Arc<Receiver>>,
    Path(relay): Path<usize>,
    headers: HeaderMap,
) -> StatusCode {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    if relay >= RELAYS || key.is_empty() {
        return StatusCode::BAD_REQUEST;
    }
    let _handling = Handling::start(&r.counts, &key);
    let held = {
        let mut c = r.counts.lock().unwrap();
        let hold = c
            .hold
            .is_some_and(|(who, after)| who == relay && c.by_relay[relay] >= after)
            && !*r.released.borrow();
        if hold {
            c.held.push(key.clone());
        }
        hold
    };
    if held {
        r.holding.notify_one();
        let mut released = r.released.subscribe();
        let _ = released.wait_for(|done| *done).await;
    }
    // The receiver's own work, long enough that a second request of the key sent at about
    // the same moment (two relays holding one delivery) would find this one still here.
    tokio::time::sleep(WORK).await;
    // Applied, then answered: the delivery counts whether or not the relay reads the answer.
    let mut c = r.counts.lock().unwrap();
    c.hits.entry(key).or_default()[relay] += 1;
    c.by_relay[relay] += 1;
    StatusCode::OK
}
