//! The delivery conformance suite on PostgreSQL: the gateway's and the relay's stores on one
//! real database, each test in a schema of its own.

use std::time::Duration;

use oncebox_core::delivery::Verdict;
use oncebox_core::relay_store::{
    AttemptRecord, Claimed, DeliveryFilter, DeliveryGauges, DeliveryStore, DeliveryView, Resolve,
};
use oncebox_core::store::{EventFilter, EventStore, Ingest, Page, Stats, StoredEvent};
use oncebox_core::{
    Key, LeaseError, ManualClock, ProcessError, Processed, Retention, Timestamp, Unavailable,
};
use oncebox_postgres::Inbox;
use oncebox_testkit::relay::DeliveryBackend;

use crate::harness;

/// An `Inbox` under the suite (the testkit's trait cannot be implemented on it from here).
#[derive(Debug, Clone)]
pub struct Store {
    pub inbox: Inbox,
}

impl DeliveryBackend for Store {
    async fn fresh_store(clock: ManualClock) -> Store {
        let options = harness::options(&harness::schema(), &clock);
        Store {
            inbox: Inbox::open(options).await.expect("open"),
        }
    }

    fn available() -> bool {
        harness::url().is_some()
    }
}

impl EventStore for Store {
    async fn ingest(&self, ingest: Ingest) -> Result<Processed, ProcessError> {
        self.inbox.ingest(ingest).await
    }

    async fn event(&self, key: &Key) -> Result<Option<StoredEvent>, Unavailable> {
        self.inbox.event(key).await
    }

    async fn events(&self, filter: EventFilter) -> Result<Page<StoredEvent>, Unavailable> {
        self.inbox.events(filter).await
    }

    async fn stats(&self) -> Result<Stats, Unavailable> {
        EventStore::stats(&self.inbox).await
    }

    async fn purge(&self, now: Timestamp, retention: &Retention) -> Result<u64, Unavailable> {
        EventStore::purge(&self.inbox, now, retention).await
    }

    async fn ready(&self) -> Result<(), Unavailable> {
        self.inbox.ready().await
    }
}

impl DeliveryStore for Store {
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

    async fn redeliver(&self, key: &Key, now: Timestamp) -> Result<u64, Unavailable> {
        self.inbox.redeliver(key, now).await
    }

    async fn gauges(&self) -> Result<DeliveryGauges, Unavailable> {
        self.inbox.gauges().await
    }

    async fn wait_for_work(&self, at_most: Duration) {
        self.inbox.wait_for_work(at_most).await;
    }
}

oncebox_testkit::delivery_conformance!(Store);
