//! The relay's store, seen by the binary: which claims are still open, so that a shutdown can
//! say how many delivery attempts it waits for and for how long at most.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use oncebox_core::delivery::Verdict;
use oncebox_core::relay_store::{
    AttemptRecord, Claimed, DeliveryFilter, DeliveryGauges, DeliveryStore, DeliveryView, Resolve,
    StatusAnswer,
};
use oncebox_core::store::Page;
use oncebox_core::{Key, LeaseError, Timestamp, Unavailable};

/// `S`, with every claim it handed out kept until it is recorded or given back. An attempt
/// lasts at most until its lease ends (the relay records nothing after that), so a claim whose
/// lease is over no longer counts, whether or not its record came.
#[derive(Clone, Debug)]
pub struct Tracked<S> {
    inner: S,
    /// Lease ends of the open claims, by delivery id and fencing token.
    open: Arc<Mutex<HashMap<(i64, i64), Timestamp>>>,
}

/// What a shutdown waits for: attempts in progress, and the last of their leases' ends.
#[derive(Debug, PartialEq, Eq)]
pub struct Waiting {
    pub attempts: usize,
    pub at_most: Duration,
}

impl<S> Tracked<S> {
    pub fn new(inner: S) -> Tracked<S> {
        Tracked {
            inner,
            open: Arc::default(),
        }
    }

    /// The claims still open at `now`.
    pub fn waiting(&self, now: Timestamp) -> Waiting {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.retain(|_, until| *until > now);
        let last = open.values().max().map_or(now, |t| *t);
        let ms = u64::try_from(last.millis().saturating_sub(now.millis())).unwrap_or(0);
        Waiting {
            attempts: open.len(),
            at_most: Duration::from_millis(ms),
        }
    }

    fn closed(&self, claimed: &Claimed) {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(claimed.id, claimed.token));
    }
}

impl<S: DeliveryStore> DeliveryStore for Tracked<S> {
    async fn claim(
        &self,
        now: Timestamp,
        limit: usize,
        lease: Duration,
        routes: &[String],
    ) -> Result<Vec<Claimed>, Unavailable> {
        let claimed = self.inner.claim(now, limit, lease, routes).await?;
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.extend(
            claimed
                .iter()
                .map(|c| ((c.id, c.token), c.lease_expires_at)),
        );
        Ok(claimed)
    }

    async fn record(
        &self,
        claimed: &Claimed,
        attempt: AttemptRecord,
        verdict: Verdict,
        now: Timestamp,
    ) -> Result<(), LeaseError> {
        let recorded = self.inner.record(claimed, attempt, verdict, now).await;
        // An unavailable store is asked again while the lease lasts: still open until then.
        if !matches!(recorded, Err(LeaseError::Unavailable(_))) {
            self.closed(claimed);
        }
        recorded
    }

    async fn unclaim(&self, claimed: &Claimed, now: Timestamp) -> Result<(), LeaseError> {
        let given_back = self.inner.unclaim(claimed, now).await;
        self.closed(claimed);
        given_back
    }

    async fn deliveries(&self, filter: DeliveryFilter) -> Result<Page<DeliveryView>, Unavailable> {
        self.inner.deliveries(filter).await
    }

    async fn attempts(&self, id: i64) -> Result<Vec<AttemptRecord>, Unavailable> {
        self.inner.attempts(id).await
    }

    async fn retry(&self, id: i64, now: Timestamp) -> Result<bool, Unavailable> {
        self.inner.retry(id, now).await
    }

    async fn resolve(
        &self,
        id: i64,
        resolution: Resolve,
        note: &str,
        now: Timestamp,
    ) -> Result<bool, Unavailable> {
        self.inner.resolve(id, resolution, note, now).await
    }

    async fn reconcile(
        &self,
        id: i64,
        attempts: u32,
        answer: StatusAnswer,
        now: Timestamp,
    ) -> Result<bool, Unavailable> {
        self.inner.reconcile(id, attempts, answer, now).await
    }

    async fn redeliver(&self, key: &Key, now: Timestamp) -> Result<u64, Unavailable> {
        self.inner.redeliver(key, now).await
    }

    async fn gauges(&self) -> Result<DeliveryGauges, Unavailable> {
        self.inner.gauges().await
    }

    async fn wait_for_work(&self, at_most: Duration) {
        self.inner.wait_for_work(at_most).await;
    }
}
