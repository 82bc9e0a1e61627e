//! Relay benchmark: deliveries/s from a backlog, and accept → delivered latency at a steady rate.
//!
//! The receiver is local and answers 200 at once, so the figures are the relay's and the store's.
//!
//! `cargo bench -p oncebox-relay --bench relay` (options: `-- --backlog N --rate N --seconds N`,
//! `--setting I` for one drain of `SETTINGS[I]` only, to profile).
//! The store is the durable default (WAL, `synchronous=FULL`); every delivery row is made by
//! `EventStore::ingest`, exactly as the gateway makes it. Receiver, relays, producers and the
//! store's writer thread run in this one process and share the machine's cores. Prints figures;
//! asserts only that every delivery arrived exactly once, never anything about time.

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use oncebox_core::delivery::RetryPolicy;
use oncebox_core::relay_store::DeliveryStore;
use oncebox_core::route::Route;
use oncebox_core::signature::{Scheme, Secret};
use oncebox_core::store::{EventStore, Ingest};
use oncebox_core::{Event, Key, Processed, Source, SystemClock};
use oncebox_relay::{Relay, RelayOptions};
use oncebox_sqlite::rusqlite::Connection;
use oncebox_sqlite::{Inbox, Options};

const SOURCE: &str = "shop";
const ROUTE: &str = "bench";
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// Producers filling the backlog: enough for the writer to commit large groups.
const PRODUCERS: usize = 128;

/// How a drain drives its relays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drive {
    /// `run_once` in a loop until a round claims nothing: the relay's own work only.
    RunOnce,
    /// `Relay::run`, as `oncebox serve` runs it (gauges on a timer, idle poll between rounds).
    Run,
}

/// (relays, batch, route concurrency per relay, drive). The first is the shipped default.
const SETTINGS: &[(usize, usize, usize, Drive)] = &[
    (1, 64, 16, Drive::RunOnce),
    (1, 256, 64, Drive::RunOnce),
    (1, 1024, 256, Drive::RunOnce),
    (1, 256, 256, Drive::RunOnce),
    (2, 64, 16, Drive::RunOnce),
    (2, 256, 64, Drive::RunOnce),
    (2, 1024, 256, Drive::RunOnce),
    (1, 64, 16, Drive::Run),
    (1, 1024, 256, Drive::Run),
];

/// The receiver: answers 200 at once, counts requests, keeps each key's first arrival.
#[derive(Debug, Default)]
struct Receiver {
    requests: AtomicU64,
    arrivals: Mutex<HashMap<String, Instant>>,
}

impl Receiver {
    /// Requests and first arrivals since the last call; starts counting afresh.
    fn take(&self) -> (u64, HashMap<String, Instant>) {
        let arrivals = std::mem::take(&mut *self.arrivals.lock().expect("arrivals"));
        (self.requests.swap(0, Ordering::Relaxed), arrivals)
    }

    fn distinct(&self) -> usize {
        self.arrivals.lock().expect("arrivals").len()
    }
}

async fn hook(State(r): State<Arc<Receiver>>, headers: HeaderMap, _body: Bytes) -> StatusCode {
    let at = Instant::now();
    r.requests.fetch_add(1, Ordering::Relaxed);
    if let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()) {
        r.arrivals
            .lock()
            .expect("arrivals")
            .entry(key.to_owned())
            .or_insert(at);
    }
    StatusCode::OK
}

async fn start_receiver() -> (Arc<Receiver>, String) {
    let receiver = Arc::new(Receiver::default());
    let app = Router::new()
        .route("/hook", post(hook))
        .with_state(receiver.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await.expect("receiver") });
    (receiver, url)
}

/// The route as a user would configure it: signed, idempotent, the default retry policy.
fn route(url: &str, concurrency: usize) -> Route {
    Route {
        name: ROUTE.to_owned(),
        sources: vec![Source::new(SOURCE).expect("source")],
        filter: None,
        url: url.to_owned(),
        timeout: Duration::from_secs(10),
        signing_secret: Some(Secret::parse(&Scheme::StandardWebhooks, SECRET).expect("secret")),
        idempotent: true,
        status_url: None,
        retry: RetryPolicy::default(),
        concurrency,
        rate: None,
        ca_pem: None,
    }
}

/// Accepts `shop:{id}` for the bench route, as the gateway would.
async fn accept(inbox: &Inbox, id: &str) {
    let key = Key::parse(SOURCE, id).expect("key");
    let body = format!(r#"{{"id":"{id}","type":"payment.succeeded","amount":1}}"#);
    let ingest = Ingest {
        event: Event::json(key, body).expect("event"),
        order: None,
        accepted: b"{}".to_vec(),
        stale: b"{}".to_vec(),
        routes: vec![ROUTE.into()],
    };
    let out = inbox.ingest(ingest).await.expect("ingest");
    assert!(matches!(out, Processed::Applied(_)), "{id} is new");
}

/// Fills a database with `n` pending deliveries once, through `ingest`; each run copies it.
async fn template(dir: &Path, n: usize) -> PathBuf {
    let path = dir.join("template.db");
    let inbox = Inbox::open(Options::new(&path)).expect("open");
    let start = Instant::now();
    let tasks: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let inbox = inbox.clone();
            tokio::spawn(async move {
                for i in (p..n).step_by(PRODUCERS) {
                    accept(&inbox, &format!("evt_{i:07}")).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("producer");
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "backlog: {n} events ingested by {PRODUCERS} producers in {secs:.1} s ({:.0} events/s)",
        n as f64 / secs
    );
    // Dropping the last handle joins the writer; then fold the WAL into the file to copy it.
    drop(inbox);
    Connection::open(&path)
        .and_then(|c| c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())))
        .expect("checkpoint");
    path
}

/// Delivered rows in the store, from its gauges.
async fn delivered(inbox: &Inbox) -> i64 {
    let gauges = inbox.gauges().await.expect("gauges");
    gauges
        .by_state
        .iter()
        .filter(|(state, _)| state == "delivered")
        .map(|(_, n)| n)
        .sum()
}

/// Phase 1: `relays` relays drain `n` pending deliveries; returns deliveries/s.
async fn drain(
    template: &Path,
    run: &Path,
    receiver: &Receiver,
    url: &str,
    (relays, batch, concurrency, drive): (usize, usize, usize, Drive),
    n: usize,
) -> f64 {
    std::fs::copy(template, run).expect("copy template");
    let inbox = Inbox::open(Options::new(run)).expect("open");
    let options = RelayOptions {
        batch,
        ..RelayOptions::default()
    };
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let start = Instant::now();
    let tasks: Vec<_> = (0..relays)
        .map(|_| {
            let relay = Relay::new(
                inbox.clone(),
                vec![route(url, concurrency)],
                Arc::new(SystemClock),
                options.clone(),
            );
            let mut stopped = stopped.clone();
            tokio::spawn(async move {
                let mut rounds = 0_u64;
                match drive {
                    // Nothing claimed means nothing due: all delivered or another relay's.
                    Drive::RunOnce => {
                        while relay.run_once().await.expect("round").claimed > 0 {
                            rounds += 1;
                        }
                    }
                    Drive::Run => {
                        relay
                            .run(async {
                                let _ = stopped.wait_for(|s| *s).await;
                            })
                            .await;
                    }
                }
                rounds
            })
        })
        .collect();
    if drive == Drive::Run {
        // `run` never ends by itself: stop it once the receiver has every key. It records the
        // round in hand before it returns, so the store is checked after it.
        while receiver.distinct() < n {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let _ = stop.send(true);
    }
    let mut rounds = 0;
    for t in tasks {
        rounds += t.await.expect("relay");
    }
    let secs = start.elapsed().as_secs_f64();
    let rate = n as f64 / secs;
    let stats = inbox.stats();
    println!(
        "  {relays} relay{} batch {batch:>4} concurrency {concurrency:>3} {:<8}: {secs:>6.2} s \
         {rate:>7.0} deliveries/s  ({}{} commits, {:.1} requests/commit)",
        if relays == 1 { " " } else { "s" },
        match drive {
            Drive::RunOnce => "run_once",
            Drive::Run => "run",
        },
        match drive {
            Drive::RunOnce => format!("{rounds} rounds, "),
            Drive::Run => String::new(),
        },
        stats.commits(),
        stats.committed_requests() as f64 / stats.commits().max(1) as f64,
    );
    // Exactly once, end to end: every row delivered, every key sent once.
    let (requests, arrivals) = receiver.take();
    assert_eq!(delivered(&inbox).await, n as i64, "all delivered");
    assert_eq!(requests, n as u64, "one request per delivery");
    assert_eq!(arrivals.len(), n, "distinct keys");
    drop(inbox);
    let _ = std::fs::remove_file(run);
    rate
}

/// Phase 2: `rate` events/s for `seconds` while `Relay::run` polls every `idle_poll`; prints
/// accept → delivered latency (receiver arrival − instant `ingest` returned).
async fn steady(
    path: &Path,
    receiver: &Receiver,
    url: &str,
    (rate, seconds): (usize, usize),
    idle_poll: Duration,
) {
    let inbox = Inbox::open(Options::new(path)).expect("open");
    let options = RelayOptions {
        idle_poll,
        ..RelayOptions::default()
    };
    let concurrency = 16;
    let relay = Relay::new(
        inbox.clone(),
        vec![route(url, concurrency)],
        Arc::new(SystemClock),
        options,
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let relay = tokio::spawn(async move {
        relay
            .run(async {
                let _ = stopped.await;
            })
            .await;
    });
    let n = rate * seconds;
    let mut tick = tokio::time::interval(Duration::from_secs(1) / u32::try_from(rate).unwrap_or(1));
    let start = Instant::now();
    let mut producers = Vec::with_capacity(n);
    for i in 0..n {
        tick.tick().await;
        let inbox = inbox.clone();
        // A task per event: a slow commit must not hold back the next arrival.
        producers.push(tokio::spawn(async move {
            accept(&inbox, &format!("lat_{i:07}")).await;
            Instant::now()
        }));
    }
    let offered = n as f64 / start.elapsed().as_secs_f64();
    let mut accepted = Vec::with_capacity(n);
    for p in producers {
        accepted.push(p.await.expect("producer"));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while receiver.distinct() < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = stop.send(());
    relay.await.expect("relay");
    let (requests, arrivals) = receiver.take();
    assert_eq!(arrivals.len(), n, "every event delivered");
    assert_eq!(requests, n as u64, "one request per delivery");
    let mut early = 0;
    let mut latency: Vec<Duration> = accepted
        .iter()
        .enumerate()
        .map(|(i, at)| {
            let arrived = arrivals[&format!("{SOURCE}:lat_{i:07}")];
            // The relay can deliver before the producer task is polled again to read the clock.
            early += usize::from(arrived < *at);
            arrived.saturating_duration_since(*at)
        })
        .collect();
    latency.sort_unstable();
    let slow = latency.partition_point(|d| *d <= Duration::from_millis(100));
    let pct = |p: f64| latency[((n as f64 * p).ceil() as usize).clamp(1, n) - 1];
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "  idle_poll {:>3} ms, batch 64, concurrency {concurrency}: offered {offered:.0} events/s; \
         accept → delivered p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; {:.1}% over 100 ms \
         ({early} arrived before ingest returned, counted as 0)",
        idle_poll.as_millis(),
        ms(pct(0.50)),
        ms(pct(0.99)),
        ms(latency[n - 1]),
        100.0 * (n - slow) as f64 / n as f64,
    );
    drop(inbox);
    let _ = std::fs::remove_file(path);
}

fn main() {
    let backlog = oncebox_testkit::bench_arg("--backlog", 100_000);
    let rate = oncebox_testkit::bench_arg("--rate", 1_000).max(1);
    let seconds = oncebox_testkit::bench_arg("--seconds", 10).max(1);
    let base = std::env::var_os("ONCEBOX_BENCH_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")), Into::into);
    std::fs::create_dir_all(&base).expect("bench dir");
    let dir = tempfile::tempdir_in(&base).expect("tempdir");
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");

    println!(
        "relay: {cores} cores, shared by the receiver (axum, 200 at once), the relays, the \
         producers, and the store's writer and checkpoint threads; one tokio runtime with \
         {cores} workers"
    );
    println!(
        "store: SQLite WAL, synchronous=FULL, in {}; route signed (Standard Webhooks), \
         HTTP/1.1 keep-alive on loopback",
        dir.path().display()
    );
    rt.block_on(async {
        let (receiver, url) = start_receiver().await;
        let template = template(dir.path(), backlog).await;
        println!(
            "phase 1: drain {backlog} pending deliveries (run_once: rounds in a loop until one \
             claims nothing; run: the serve loop)"
        );
        // `--setting I` runs that one drain and nothing else (for profiling).
        if std::env::args().any(|a| a == "--setting") {
            let setting =
                SETTINGS[oncebox_testkit::bench_arg("--setting", 0).min(SETTINGS.len() - 1)];
            let run = dir.path().join("drain.db");
            drain(&template, &run, &receiver, &url, setting, backlog).await;
            return;
        }
        let mut rates = Vec::new();
        for (i, &setting) in SETTINGS.iter().enumerate() {
            let run = dir.path().join(format!("drain-{i}.db"));
            rates.push(drain(&template, &run, &receiver, &url, setting, backlog).await);
        }
        let (best, &top) = rates
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .expect("settings");
        let (relays, batch, concurrency, drive) = SETTINGS[best];
        // The default relay as `oncebox serve` runs it.
        let serve = SETTINGS
            .iter()
            .position(|s| *s == (1, 64, 16, Drive::Run))
            .map_or(0.0, |i| rates[i]);
        println!(
            "  default (1 relay, batch 64, concurrency 16): {:.0} deliveries/s with run_once, \
             {serve:.0} with run; best {top:.0} deliveries/s ({relays} relay(s), batch {batch}, \
             concurrency {concurrency}, {drive:?}) = {:.1}x default; target >= 10000",
            rates[0],
            top / rates[0]
        );
        println!(
            "phase 2: {rate} events/s for {seconds} s through ingest while Relay::run delivers"
        );
        // The default idle poll, and the 500 ms it once was, for comparison.
        let default_poll = RelayOptions::default().idle_poll.as_millis() as u64;
        for poll in [default_poll, 500] {
            let path = dir.path().join(format!("steady-{poll}.db"));
            let idle_poll = Duration::from_millis(poll);
            steady(&path, &receiver, &url, (rate, seconds), idle_poll).await;
        }
        println!("  target: p99 < 100 ms");
    });
}
