//! The real relay on PostgreSQL, end to end: events ingested through the gateway's store are
//! delivered to an HTTP receiver by `Relay::run`, woken by `NOTIFY` (its poll is an hour long).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use oncebox_core::delivery::{DeliveryState, RetryPolicy};
use oncebox_core::relay_store::{DeliveryFilter, DeliveryStore};
use oncebox_core::route::Route;
use oncebox_core::store::EventStore;
use oncebox_core::{Processed, Source, SystemClock};
use oncebox_postgres::{Inbox, Options};
use oncebox_relay::{Relay, RelayOptions};
use oncebox_testkit::relay::Holding;
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
        // The relay's idle waits counted (a wait that is not zero follows a round that found
        // nothing), so the test can ingest only once the relay is idle: then nothing but the
        // notification can make it claim again.
        let (idle, mut idle_waits) = watch::channel(0_u64);
        let store = Holding::new(inbox, ()).on_wait(move |at_most| {
            if !at_most.is_zero() {
                idle.send_modify(|n| *n += 1);
            }
        });
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
