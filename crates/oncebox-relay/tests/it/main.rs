//! Relay tests against real HTTP receivers started by the test, the running RabbitMQ and NATS
//! servers, fault proxies, and a real SQLite store; time is a manual clock, so backoffs and
//! leases are stepped, not waited for.

mod amqp;
mod amqp_alarm;
mod amqp_refused;
mod answers;
mod broker;
mod circuit;
mod circuit_pause;
mod delivery;
mod faults;
mod fence;
mod gauges;
mod kill;
mod max_age;
mod nats;
mod nats_auth;
mod operator;
mod outbox;
mod pump;
mod rate;
mod receiver;
mod settle;
mod slow_claims;
mod tls;
mod unknown;
mod unrouted;
mod wire;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use oncebox_core::delivery::{Backoff, RetryPolicy};
use oncebox_core::relay_store::{DeliveryFilter, DeliveryStore, DeliveryView};
use oncebox_core::route::Route;
use oncebox_core::signature::{Scheme, Secret};
use oncebox_core::store::{EventStore, Ingest};
use oncebox_core::{Event, Key, ManualClock, Source, Timestamp};
use oncebox_relay::{Relay, RelayOptions};
use oncebox_sqlite::{Inbox, Options};

pub const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
pub const START: Timestamp = Timestamp(1_767_225_600_000);

/// A store, a clock and the directory holding the file.
#[derive(Debug)]
pub struct World {
    pub inbox: Inbox,
    pub clock: ManualClock,
    dir: tempfile::TempDir,
}

impl Default for World {
    fn default() -> World {
        World::with(|o| o)
    }
}

impl World {
    pub fn new() -> World {
        World::default()
    }

    /// A world whose store is opened with `options` applied to the defaults.
    pub fn with(options: impl FnOnce(Options) -> Options) -> World {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(START);
        let opened = Options::new(dir.path().join("relay.db")).clock(Arc::new(clock.clone()));
        let inbox = Inbox::open(options(opened)).unwrap();
        World { inbox, clock, dir }
    }

    pub fn path(&self) -> std::path::PathBuf {
        self.dir.path().join("relay.db")
    }

    /// Accepts `shop:{id}` for `routes`, as the gateway would.
    pub async fn accept(&self, id: &str, routes: &[&str]) {
        let event = Event::json(
            Key::parse("shop", id).unwrap(),
            format!(r#"{{"id":"{id}"}}"#),
        )
        .unwrap();
        let ingest = Ingest {
            event,
            order: None,
            accepted: b"{}".to_vec(),
            stale: b"{}".to_vec(),
            routes: routes.iter().map(|r| (*r).to_owned()).collect(),
        };
        self.inbox.ingest(ingest).await.unwrap();
    }

    pub fn relay(&self, routes: Vec<Route>) -> Relay<Inbox> {
        let options = RelayOptions {
            lease: Duration::from_secs(60),
            ..RelayOptions::default()
        };
        Relay::new(
            self.inbox.clone(),
            routes,
            Arc::new(self.clock.clone()),
            options,
        )
    }

    pub async fn delivery(&self, id: &str) -> DeliveryView {
        let filter = DeliveryFilter {
            key: Some(Key::parse("shop", id).unwrap()),
            limit: 10,
            ..DeliveryFilter::default()
        };
        let mut items = self.inbox.deliveries(filter).await.unwrap().items;
        assert_eq!(items.len(), 1, "one delivery for {id}");
        items.remove(0)
    }
}

/// A route to `addr` taking source `shop`, signed, with a small backoff.
pub fn route(name: &str, addr: SocketAddr, idempotent: bool) -> Route {
    let mut route = Route::new(name, format!("http://{addr}/hook"));
    route.sources = vec![Source::new("shop").unwrap()];
    route.timeout = Duration::from_secs(5);
    route.signing_secret = Some(Secret::parse(&Scheme::StandardWebhooks, SECRET).unwrap());
    route.idempotent = idempotent;
    route.retry = RetryPolicy {
        max_attempts: 5,
        max_age: Duration::from_secs(3 * 24 * 3600),
        backoff: Backoff {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(60),
        },
    };
    route.concurrency = 4;
    route
}

/// A route to a broker URL taking source `shop`: no signing secret, a small backoff.
pub fn broker_route(name: &str, url: &str, idempotent: bool) -> Route {
    Route {
        url: url.to_owned(),
        signing_secret: None,
        ..route(name, SocketAddr::from(([127, 0, 0, 1], 9)), idempotent)
    }
}

/// `base` with `pairs` added to its query.
pub fn with_query(base: &str, pairs: &[(&str, &str)]) -> String {
    let mut url = reqwest::Url::parse(base).expect("service URL");
    url.query_pairs_mut().extend_pairs(pairs);
    url.to_string()
}

/// A loopback port nobody listens on: bound, learnt, closed.
pub fn closed_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A name no other test run uses, for broker objects.
pub fn unique(prefix: &str) -> String {
    format!("oncebox-test-{prefix}-{}", uuid::Uuid::new_v4().simple())
}
