//! The relay on a connection pool smaller than its route's concurrency: the answers of many
//! sends, arriving together, queue for the pool's few connections while the relay claims
//! again, and the claim needs a connection too. The relay must keep those sends going while
//! it claims: a send left waiting would hold its connection (or its turn for one) until the
//! claim gave up, which with this test's hour-long deadline means never.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use oncebox_core::delivery::{DeliveryState, RetryPolicy};
use oncebox_core::relay_store::{DeliveryFilter, DeliveryStore};
use oncebox_core::route::Route;
use oncebox_core::store::EventStore;
use oncebox_core::{Processed, Source, SystemClock};
use oncebox_postgres::{Inbox, Options};
use oncebox_relay::{Relay, RelayOptions};
use oncebox_testkit::run;
use tokio::sync::{Semaphore, watch};

use crate::claims::routed;
use crate::database::OwnDatabase;
use crate::relay::running;

/// A deadline for what takes milliseconds.
const PROMPT: Duration = Duration::from_secs(20);
/// Requests the route sends at once; the pool has two connections.
const CONCURRENCY: usize = 8;

/// A receiver that counts the requests it holds and answers 200 only once let go.
struct Held {
    arrived: watch::Sender<usize>,
    gate: Semaphore,
}

async fn held(State(h): State<Arc<Held>>) -> StatusCode {
    h.arrived.send_modify(|n| *n += 1);
    if let Ok(permit) = h.gate.acquire().await {
        permit.forget();
    }
    StatusCode::OK
}

async fn receiver() -> (Arc<Held>, watch::Receiver<usize>, String) {
    let (arrived, arrivals) = watch::channel(0);
    let h = Arc::new(Held {
        arrived,
        gate: Semaphore::new(0),
    });
    let app = Router::new()
        .route("/hook", post(held))
        .with_state(h.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (h, arrivals, format!("http://{addr}/hook"))
}

#[test]
fn answers_arriving_together_are_recorded_while_the_relay_claims_on_a_small_pool() {
    run(async {
        let Some(db) = OwnDatabase::create().await else {
            return;
        };
        let gateway = Inbox::open(Options::new(db.url.clone()))
            .await
            .expect("open");
        // Two connections, and a wait for one that outlasts the test.
        let small = Options::new(db.url.clone())
            .max_connections(2)
            .deadline(Duration::from_secs(3600));
        let inbox = Inbox::open(small).await.expect("open");
        let (h, mut arrivals, url) = receiver().await;
        let ids: Vec<String> = (0..CONCURRENCY).map(|i| format!("evt-{i}")).collect();
        for id in &ids {
            let out = gateway.ingest(routed(id, &["hooks"])).await;
            assert!(matches!(out, Ok(Processed::Applied(_))), "{id}: {out:?}");
        }
        let route = Route {
            name: "hooks".into(),
            sources: vec![Source::new("shop").expect("source")],
            filter: None,
            url,
            timeout: Duration::from_secs(3600),
            signing_secret: None,
            idempotent: true,
            status_url: None,
            retry: RetryPolicy::default(),
            concurrency: CONCURRENCY,
            rate: None,
            ca_pem: None,
        };
        let options = RelayOptions {
            // Claims follow each send's end at once, whatever the poll.
            idle_poll: Duration::from_secs(3600),
            lease: Duration::from_secs(3600),
            ..RelayOptions::default()
        };
        let relay = Relay::new(inbox.clone(), vec![route], Arc::new(SystemClock), options);
        let (stop, running) = running(relay);
        // Every request is held by the receiver: the answers all come at once, four times as
        // many as the pool has connections to record them with.
        tokio::time::timeout(PROMPT, arrivals.wait_for(|n| *n == CONCURRENCY))
            .await
            .expect("every request arrives")
            .expect("receiver alive");
        h.gate.add_permits(CONCURRENCY);
        let all = DeliveryFilter {
            limit: 100,
            ..DeliveryFilter::default()
        };
        let recorded = async {
            loop {
                let listed = inbox.deliveries(all.clone()).await.expect("deliveries");
                if listed
                    .items
                    .iter()
                    .all(|d| d.state == DeliveryState::Delivered)
                {
                    return listed.items.len();
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        let delivered = tokio::time::timeout(PROMPT, recorded)
            .await
            .expect("every answer recorded: no send waits behind the relay's claim");
        assert_eq!(delivered, CONCURRENCY);
        assert_eq!(*arrivals.borrow(), CONCURRENCY, "each sent once");
        let _ = stop.send(());
        tokio::time::timeout(PROMPT, running)
            .await
            .expect("relay stops")
            .expect("relay task");
        drop((gateway, inbox));
        db.drop().await;
    });
}
