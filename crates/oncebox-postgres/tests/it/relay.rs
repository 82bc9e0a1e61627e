//! The real relay on PostgreSQL, end to end: events ingested through the gateway's store are
//! delivered to an HTTP receiver by `Relay::run`, woken by `NOTIFY` (its poll is an hour long).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use oncebox_core::delivery::{DeliveryState, RetryPolicy, Verdict};
use oncebox_core::relay_store::{
    AttemptRecord, Claimed, DeliveryFilter, DeliveryGauges, DeliveryStore, DeliveryView, Resolve,
    StatusAnswer,
};
use oncebox_core::route::Route;
use oncebox_core::store::{EventStore, Page};
use oncebox_core::{Key, LeaseError, Processed, Source, SystemClock, Timestamp, Unavailable};
use oncebox_postgres::{Inbox, Options};
use oncebox_relay::{Relay, RelayOptions};
use oncebox_testkit::{event, run};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::claims::routed;
use crate::database::OwnDatabase;

/// A deadline for what takes milliseconds; the relay's poll is far longer.
const PROMPT: Duration = Duration::from_secs(20);

/// One request as the receiver saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Seen {
    key: String,
    attempt: String,
    body: Vec<u8>,
}

async fn hook(State(seen): State<watch::Sender<Vec<Seen>>>, headers: HeaderMap, body: Bytes) {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let request = Seen {
        key: header("idempotency-key"),
        attempt: header("oncebox-attempt"),
        body: body.to_vec(),
    };
    seen.send_modify(|all| all.push(request));
}

/// A receiver answering 200 to every request, and what it has seen so far.
pub(crate) async fn receiver() -> (String, watch::Receiver<Vec<Seen>>) {
    let (seen, watch) = watch::channel(Vec::new());
    let app = Router::new().route("/hook", post(hook)).with_state(seen);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/hook"), watch)
}

pub(crate) fn route(url: String) -> Route {
    Route {
        name: "hooks".into(),
        sources: vec![Source::new("shop").expect("source")],
        filter: None,
        url,
        timeout: Duration::from_secs(5),
        signing_secret: None,
        idempotent: true,
        status_url: None,
        retry: RetryPolicy::default(),
        concurrency: 4,
        rate: None,
        ca_pem: None,
    }
}

/// The relay's store, counting the relay's idle waits (a wait that is not zero follows a
/// round that found nothing), so the test can ingest only once the relay is idle: then nothing
/// but the notification can make it claim again.
#[derive(Debug, Clone)]
struct Watched {
    inbox: Inbox,
    idle: watch::Sender<u64>,
}

impl DeliveryStore for Watched {
    async fn claim(
        &self,
        now: Timestamp,
        limit: usize,
        lease: Duration,
        routes: &[String],
    ) -> Result<Vec<Claimed>, Unavailable> {
        self.inbox.claim(now, limit, lease, routes).await
    }

    async fn record(
        &self,
        claimed: &Claimed,
        attempt: AttemptRecord,
        verdict: Verdict,
        now: Timestamp,
    ) -> Result<(), LeaseError> {
        DeliveryStore::record(&self.inbox, claimed, attempt, verdict, now).await
    }

    async fn unclaim(
        &self,
        claimed: &Claimed,
        now: Timestamp,
        due: Timestamp,
    ) -> Result<(), LeaseError> {
        self.inbox.unclaim(claimed, now, due).await
    }

    async fn deliveries(&self, filter: DeliveryFilter) -> Result<Page<DeliveryView>, Unavailable> {
        self.inbox.deliveries(filter).await
    }

    async fn attempts(&self, id: i64) -> Result<Vec<AttemptRecord>, Unavailable> {
        self.inbox.attempts(id).await
    }

    async fn retry(&self, id: i64, now: Timestamp) -> Result<bool, Unavailable> {
        self.inbox.retry(id, now).await
    }

    async fn resolve(
        &self,
        id: i64,
        resolution: Resolve,
        note: &str,
        now: Timestamp,
    ) -> Result<bool, Unavailable> {
        DeliveryStore::resolve(&self.inbox, id, resolution, note, now).await
    }

    async fn reconcile(
        &self,
        id: i64,
        attempts: u32,
        answer: StatusAnswer,
        now: Timestamp,
    ) -> Result<bool, Unavailable> {
        self.inbox.reconcile(id, attempts, answer, now).await
    }

    async fn redeliver(&self, key: &Key, now: Timestamp) -> Result<u64, Unavailable> {
        self.inbox.redeliver(key, now).await
    }

    async fn gauges(&self) -> Result<DeliveryGauges, Unavailable> {
        self.inbox.gauges().await
    }

    async fn wait_for_work(&self, at_most: Duration) {
        if !at_most.is_zero() {
            self.idle.send_modify(|n| *n += 1);
        }
        self.inbox.wait_for_work(at_most).await;
    }
}

/// Runs `relay` on a task of its own until the returned sender fires (or is dropped).
pub fn running<S: DeliveryStore>(relay: Relay<S>) -> (oneshot::Sender<()>, JoinHandle<()>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        relay
            .run(async {
                let _ = stopped.await;
            })
            .await;
    });
    (stop, task)
}

async fn delivered_to(seen: &mut watch::Receiver<Vec<Seen>>, key: &str) {
    tokio::time::timeout(
        PROMPT,
        seen.wait_for(|all| all.iter().any(|s| s.key == key)),
    )
    .await
    .unwrap_or_else(|_| panic!("{key} not delivered in time"))
    .expect("receiver alive");
}

#[test]
fn relay_delivers_ingested_events_once_each_woken_by_notify() {
    run(async {
        let Some(db) = OwnDatabase::create().await else {
            return;
        };
        let open = || Inbox::open(Options::new(db.url.clone()).max_connections(4));
        let (gateway, inbox) = (open().await.expect("open"), open().await.expect("open"));
        let (idle, mut idle_waits) = watch::channel(0_u64);
        let store = Watched { inbox, idle };
        let (url, mut seen) = receiver().await;
        // Owed before the relay starts: its first claim finds it.
        let ingest = |id: &str| gateway.ingest(routed(id, &["hooks"]));
        assert!(matches!(ingest("evt-0").await, Ok(Processed::Applied(_))));
        let options = RelayOptions {
            // Only a notification can make the idle relay claim again within the test.
            idle_poll: Duration::from_secs(3600),
            lease: Duration::from_secs(30),
            ..RelayOptions::default()
        };
        let relay = Relay::new(
            store.clone(),
            vec![route(url)],
            Arc::new(SystemClock),
            options,
        );
        let (stop, running) = running(relay);
        for (i, id) in ["evt-0", "evt-1", "evt-2", "evt-3"].into_iter().enumerate() {
            if i > 0 {
                assert!(
                    matches!(ingest(id).await, Ok(Processed::Applied(_))),
                    "{id}"
                );
            }
            delivered_to(&mut seen, &format!("shop:{id}")).await;
            // The round after the delivery found nothing: the relay waits (or is about to)
            // when the next event is ingested.
            let rounds = i as u64 + 1;
            tokio::time::timeout(PROMPT, idle_waits.wait_for(|n| *n >= rounds))
                .await
                .expect("relay idle in time")
                .expect("store alive");
        }
        // The relay stops between rounds: every attempt it made is recorded by then.
        let _ = stop.send(());
        tokio::time::timeout(PROMPT, running)
            .await
            .expect("relay stops")
            .expect("relay task");
        let mut requests = seen.borrow().clone();
        requests.sort_by(|a, b| a.key.cmp(&b.key));
        let expect: Vec<Seen> = (0..4)
            .map(|i| Seen {
                key: format!("shop:evt-{i}"),
                attempt: "1".into(),
                body: event("shop", &format!("evt-{i}"), 1).payload,
            })
            .collect();
        assert_eq!(requests, expect, "each event once, with its stable key");
        let all = DeliveryFilter {
            limit: 100,
            ..DeliveryFilter::default()
        };
        let listed = store.deliveries(all).await.expect("deliveries");
        let states: Vec<(DeliveryState, u32)> =
            listed.items.iter().map(|d| (d.state, d.attempts)).collect();
        assert_eq!(states, [(DeliveryState::Delivered, 1); 4]);
        // One idle wait after each delivery, and at most one more begun while it was in flight
        // (the relay listens for new work while its sends run, so another route's event is
        // claimed at once): woken each time, never spinning.
        let waits = *idle_waits.borrow();
        assert!(
            (4..=8).contains(&waits),
            "{waits} idle waits for 4 deliveries"
        );
        drop((gateway, store));
        db.drop().await;
    });
}
