//! A store together with what must outlive it (a temporary directory): the one place that
//! forwards both store traits, so backends need no wrapper of their own; and where a test
//! watches a relay's claims and idle waits (counts them, advances a clock) without writing
//! the whole `DeliveryStore` out again.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use oncebox_core::delivery::Verdict;
use oncebox_core::relay_store::{
    AttemptRecord, Claimed, DeliveryFilter, DeliveryGauges, DeliveryStore, DeliveryView, Resolve,
    StatusAnswer,
};
use oncebox_core::store::{
    Activity, ConflictFilter, ConflictRecord, EventFilter, EventStore, Ingest, Page, Stats,
    StoredEvent,
};
use oncebox_core::{Key, LeaseError, ProcessError, Processed, Retention, Timestamp, Unavailable};

/// What a [`Holding`] runs after each claim, given its answer.
pub type OnClaim = Arc<dyn Fn(&Result<Vec<Claimed>, Unavailable>) + Send + Sync>;
/// What a [`Holding`] runs before each wait for work, given how long it may wait.
pub type OnWait = Arc<dyn Fn(Duration) + Send + Sync>;

/// `store`, and `guard` kept alive as long as any clone of it.
#[derive(Clone)]
pub struct Holding<S> {
    pub store: S,
    guard: Arc<dyn Any + Send + Sync>,
    on_claim: Option<OnClaim>,
    on_wait: Option<OnWait>,
}

impl<S> Holding<S> {
    pub fn new(store: S, guard: impl Any + Send + Sync) -> Holding<S> {
        Holding {
            store,
            guard: Arc::new(guard),
            on_claim: None,
            on_wait: None,
        }
    }

    /// Runs `f` after each claim, with its answer.
    #[must_use]
    pub fn on_claim(
        self,
        f: impl Fn(&Result<Vec<Claimed>, Unavailable>) + Send + Sync + 'static,
    ) -> Holding<S> {
        Holding {
            on_claim: Some(Arc::new(f)),
            ..self
        }
    }

    /// Runs `f` before each wait for work, with how long it may wait.
    #[must_use]
    pub fn on_wait(self, f: impl Fn(Duration) + Send + Sync + 'static) -> Holding<S> {
        Holding {
            on_wait: Some(Arc::new(f)),
            ..self
        }
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for Holding<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let _ = &self.guard;
        f.debug_struct("Holding")
            .field("store", &self.store)
            .finish()
    }
}

impl<S: EventStore> EventStore for Holding<S> {
    async fn ingest(&self, ingest: Ingest) -> Result<Processed, ProcessError> {
        self.store.ingest(ingest).await
    }

    async fn event(&self, key: &Key) -> Result<Option<StoredEvent>, Unavailable> {
        self.store.event(key).await
    }

    async fn events(&self, filter: EventFilter) -> Result<Page<StoredEvent>, Unavailable> {
        self.store.events(filter).await
    }

    async fn stats(&self) -> Result<Stats, Unavailable> {
        self.store.stats().await
    }

    async fn purge(&self, now: Timestamp, retention: &Retention) -> Result<u64, Unavailable> {
        self.store.purge(now, retention).await
    }

    async fn conflicts(&self, filter: ConflictFilter) -> Result<Page<ConflictRecord>, Unavailable> {
        self.store.conflicts(filter).await
    }

    async fn activity(&self, since: Timestamp, bucket: Duration) -> Result<Activity, Unavailable> {
        self.store.activity(since, bucket).await
    }

    async fn ready(&self) -> Result<(), Unavailable> {
        self.store.ready().await
    }
}

impl<S: DeliveryStore> DeliveryStore for Holding<S> {
    async fn claim(
        &self,
        now: Timestamp,
        limit: usize,
        lease: Duration,
        routes: &[String],
    ) -> Result<Vec<Claimed>, Unavailable> {
        let claimed = self.store.claim(now, limit, lease, routes).await;
        if let Some(on_claim) = &self.on_claim {
            on_claim(&claimed);
        }
        claimed
    }

    async fn record(
        &self,
        claimed: &Claimed,
        attempt: AttemptRecord,
        verdict: Verdict,
        now: Timestamp,
    ) -> Result<(), LeaseError> {
        self.store.record(claimed, attempt, verdict, now).await
    }

    async fn unclaim(
        &self,
        claimed: &Claimed,
        now: Timestamp,
        due: Timestamp,
    ) -> Result<(), LeaseError> {
        self.store.unclaim(claimed, now, due).await
    }

    async fn deliveries(&self, filter: DeliveryFilter) -> Result<Page<DeliveryView>, Unavailable> {
        self.store.deliveries(filter).await
    }

    async fn attempts(&self, id: i64) -> Result<Vec<AttemptRecord>, Unavailable> {
        self.store.attempts(id).await
    }

    async fn retry(&self, id: i64, now: Timestamp) -> Result<bool, Unavailable> {
        self.store.retry(id, now).await
    }

    async fn resolve(
        &self,
        id: i64,
        resolution: Resolve,
        note: &str,
        now: Timestamp,
    ) -> Result<bool, Unavailable> {
        self.store.resolve(id, resolution, note, now).await
    }

    async fn reconcile(
        &self,
        id: i64,
        attempts: u32,
        answer: StatusAnswer,
        now: Timestamp,
    ) -> Result<bool, Unavailable> {
        self.store.reconcile(id, attempts, answer, now).await
    }

    async fn redeliver(&self, key: &Key, now: Timestamp) -> Result<u64, Unavailable> {
        self.store.redeliver(key, now).await
    }

    async fn gauges(&self) -> Result<DeliveryGauges, Unavailable> {
        self.store.gauges().await
    }

    async fn wait_for_work(&self, at_most: Duration) {
        if let Some(on_wait) = &self.on_wait {
            on_wait(at_most);
        }
        self.store.wait_for_work(at_most).await;
    }
}
