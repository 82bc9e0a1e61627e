//! The relay's storage seam: claim due deliveries under a fenced lease, record each attempt's
//! outcome (refused once the lease is lost), and the operator's actions on deliveries.

use std::future::Future;
use std::time::Duration;

use crate::clock::Timestamp;
use crate::delivery::{DeliveryState, Verdict};
use crate::key::Key;
use crate::lease::LeaseError;
use crate::outcome::Unavailable;
use crate::store::Page;

/// The header each attempt carries its claim's fencing token in (HTTP, AMQP): a number that
/// grows with every claim in the store, so a later holder of the same delivery always sends a
/// larger one. A receiver can keep the largest it applied per `Idempotency-Key` and refuse a
/// smaller one: the late request of a relay that stalled past its lease, which the store
/// already refuses to record, is then refused there too. Only within one key: tokens order
/// claims, not events (an older event retried later carries a larger one). Case matters in
/// NATS headers: there it is [`NATS_FENCE_HEADER`].
pub const FENCE_HEADER: &str = "oncebox-fencing-token";

/// The fencing token's header as NATS messages carry it.
pub const NATS_FENCE_HEADER: &str = "Oncebox-Fencing-Token";

/// A delivery claimed by one relay: it alone may record the outcome, while `token` is the
/// newest and the lease has not expired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    pub id: i64,
    pub route: String,
    pub key: Key,
    /// `{source}:{event_id}`: the same for every attempt, forever. Do not change.
    pub idempotency_key: String,
    pub payload: Vec<u8>,
    pub content_type: String,
    /// Attempts made before this one.
    pub attempts: u32,
    pub created_at: Timestamp,
    /// What the route's caps count from.
    pub budget: Budget,
    /// The claim's fencing token, sent with each attempt as [`FENCE_HEADER`].
    pub token: i64,
    pub lease_expires_at: Timestamp,
    /// Claimed from a relay whose lease ran out mid-attempt (it died or stalled): that relay
    /// may have sent it, so the outcome of an attempt is unknown before this one begins.
    pub taken_over: bool,
    /// What its requests carry in `oncebox-hops` (`crate::hops`): one more than the event it
    /// came from arrived with; 1 for a message the library queued from an event of its own.
    pub hops: u32,
}

/// Where a delivery's caps on attempts and age count from: its creation, or an operator's
/// latest `retry` or `redeliver`, which gives it a budget as fresh as a new delivery's. Without
/// one, a delivery retried by hand after a long outage was older than the route's `max_age`, and
/// dead again at its first failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Attempts made before it began.
    pub attempts_before: u32,
    pub since: Timestamp,
}

impl Budget {
    /// Attempts counted against the caps out of `attempts` made in all.
    pub fn spent(&self, attempts: u32) -> u32 {
        attempts.saturating_sub(self.attempts_before)
    }

    /// Its age at `now`: zero for a `since` ahead of it (a clock set back).
    pub fn age(&self, now: Timestamp) -> Duration {
        let ms = now.millis().saturating_sub(self.since.millis());
        Duration::from_millis(u64::try_from(ms).unwrap_or(0))
    }
}

/// One attempt as recorded for operators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptRecord {
    pub started_at: Timestamp,
    pub duration: Duration,
    /// The receiver's status, when it answered.
    pub status: Option<u16>,
    pub error: Option<String>,
}

impl AttemptRecord {
    /// The error as the stores keep it ([`crate::delivery::storable`]).
    pub fn stored_error(&self) -> Option<String> {
        self.error.as_deref().map(crate::delivery::storable)
    }
}

/// A delivery as operators see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryView {
    pub id: i64,
    pub route: String,
    pub key: Key,
    /// The key every attempt carries: `{source}:{event_id}` for a routed event, the handler's
    /// own for a message a library handler queued. A status URL is asked about this one.
    pub idempotency_key: String,
    pub state: DeliveryState,
    pub attempts: u32,
    pub created_at: Timestamp,
    /// What the route's caps count from.
    pub budget: Budget,
    pub next_attempt_at: Option<Timestamp>,
    pub last_status: Option<u16>,
    pub last_error: Option<String>,
    pub note: Option<String>,
    /// What its requests carry in `oncebox-hops` (`crate::hops`): 16 or more on a delivery a
    /// loop of routes made.
    pub hops: u32,
}

/// Which deliveries to list, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeliveryFilter {
    pub state: Option<DeliveryState>,
    pub route: Option<String>,
    pub key: Option<Key>,
    pub after: Option<i64>,
    /// Only deliveries whose `next_attempt_at` is due by then: for a pending or retrying one
    /// its next attempt, for an uncertain one its next status question (for others it means
    /// nothing).
    pub due_by: Option<Timestamp>,
    pub limit: usize,
}

/// Gauges for operators: how many deliveries per state, and the oldest one still owed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeliveryGauges {
    pub by_state: Vec<(String, i64)>,
    /// Creation time of the oldest delivery not yet delivered, dead or uncertain.
    pub oldest_pending: Option<Timestamp>,
    /// Deliveries still owed (pending, retrying, in flight) per route, by route name.
    pub owed_by_route: Vec<(String, i64)>,
}

impl DeliveryGauges {
    /// The gauges from the counts per state and, per route, its deliveries still owed (not yet
    /// delivered, and neither given up on nor parked for an operator) with the creation time
    /// of the oldest of them.
    pub fn new(
        by_state: Vec<(String, i64)>,
        owed: impl IntoIterator<Item = (String, i64, i64)>,
    ) -> DeliveryGauges {
        let mut oldest_pending: Option<Timestamp> = None;
        let owed_by_route = owed
            .into_iter()
            .map(|(route, n, oldest)| {
                let oldest = Timestamp(oldest);
                oldest_pending = Some(oldest_pending.map_or(oldest, |o| o.min(oldest)));
                (route, n)
            })
            .collect();
        DeliveryGauges {
            by_state,
            oldest_pending,
            owed_by_route,
        }
    }
}

/// An operator's settlement of a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Resolve {
    Delivered,
    Dead,
}

/// What a route's status URL said about an `uncertain` delivery's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StatusAnswer {
    /// The receiver applied it: delivered.
    Applied,
    /// The receiver never saw it: due again now, with the same key.
    NotApplied,
    /// The receiver never saw it, and the route's attempts or age are used up: dead, as a
    /// retry past them would be. Without it an uncertain delivery of a receiver that never
    /// answers went round (sent, uncertain, not applied, sent again) past every cap.
    NotAppliedSpent,
    /// The question went unanswered: it stays uncertain and is asked again later, after twice
    /// as long as since it was last asked (10 s at the least, 30 min at the most), so a status
    /// URL that is down is not hammered.
    NoAnswer,
}

/// What settling an uncertain delivery by a status answer writes: its state, its delivery
/// time and its note; the same on every backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    pub state: &'static str,
    pub delivered_at: Option<i64>,
    pub note: &'static str,
}

impl StatusAnswer {
    /// What `Applied` and `NotApplied` write at `now`; `None` for an answer that settles
    /// nothing (`NoAnswer` only puts the next question off).
    pub fn settled(self, now: Timestamp) -> Option<Settled> {
        let (state, delivered_at, note) = match self {
            StatusAnswer::Applied => ("delivered", Some(now.millis()), "status_url: applied"),
            StatusAnswer::NotApplied => ("pending", None, "status_url: not applied"),
            StatusAnswer::NotAppliedSpent => (
                "dead",
                None,
                "status_url: not applied; its attempts or age are used up",
            ),
            StatusAnswer::NoAnswer => return None,
        };
        Some(Settled {
            state,
            delivered_at,
            note,
        })
    }
}

/// The shortest and longest wait before a status URL is asked about one delivery; the first
/// question waits the route's timeout after the delivery became uncertain, within these.
pub const STATUS_RECHECK: (Duration, Duration) =
    (Duration::from_secs(10), Duration::from_secs(30 * 60));

/// What the relay and the admin API need of a backend.
pub trait DeliveryStore: Clone + Send + Sync + 'static {
    /// Claims up to `limit` deliveries that are due at `now` (pending, or retrying past their
    /// time, or in flight under an expired lease — a relay that died), oldest first, each under
    /// a new fencing token until `now + lease`. `routes` limits the claim to those routes
    /// (empty: all).
    fn claim(
        &self,
        now: Timestamp,
        limit: usize,
        lease: Duration,
        routes: &[String],
    ) -> impl Future<Output = Result<Vec<Claimed>, Unavailable>> + Send;

    /// Records an attempt and its verdict. Refused with `LeaseError::Fenced` when the lease
    /// expired or another relay holds a newer token: the attempt's outcome is then not ours to
    /// record.
    fn record(
        &self,
        claimed: &Claimed,
        attempt: AttemptRecord,
        verdict: Verdict,
        now: Timestamp,
    ) -> impl Future<Output = Result<(), LeaseError>> + Send;

    /// Gives a claim back unsent: due again at `due` (`now`, or later where the relay holds it
    /// back), no attempt counted, the lease ended. Refused with `LeaseError::Fenced` when
    /// another claim took the lease since; a lease that merely ran out is still given back
    /// (nothing was sent under it).
    fn unclaim(
        &self,
        claimed: &Claimed,
        now: Timestamp,
        due: Timestamp,
    ) -> impl Future<Output = Result<(), LeaseError>> + Send;

    fn deliveries(
        &self,
        filter: DeliveryFilter,
    ) -> impl Future<Output = Result<Page<DeliveryView>, Unavailable>> + Send;

    /// The attempts of one delivery, oldest first.
    fn attempts(
        &self,
        id: i64,
    ) -> impl Future<Output = Result<Vec<AttemptRecord>, Unavailable>> + Send;

    /// Makes a `dead`, `uncertain` or `retrying` delivery due now, with a fresh [`Budget`].
    /// False when it is in another state (delivered, in flight, pending) or does not exist.
    fn retry(
        &self,
        id: i64,
        now: Timestamp,
    ) -> impl Future<Output = Result<bool, Unavailable>> + Send;

    /// Settles a delivery by hand, with a note: an `uncertain` one above all, but any still
    /// owed (`pending`, `retrying`: one owed to a route since removed is given up so) or
    /// `dead`, and one in flight whose relay's lease ended (the relay died or stalled mid-send;
    /// its late record is fenced). An empty `note` keeps the one it had. False when it is
    /// delivered, in flight under a live lease (its relay's outcome is on the way) or does not
    /// exist.
    fn resolve(
        &self,
        id: i64,
        resolution: Resolve,
        note: &str,
        now: Timestamp,
    ) -> impl Future<Output = Result<bool, Unavailable>> + Send;

    /// Settles a delivery by its receiver's status URL, only while it is still `uncertain`
    /// and its question was due at `now`. False otherwise: an operator who settled it while
    /// the question was out has the last word, and an answer about an earlier attempt (the
    /// delivery was retried and became uncertain again meanwhile), or a second relay's answer
    /// to the same question, changes nothing: `attempts` is the delivery's count when it was
    /// asked about, and an answer settles only a delivery that still has that count.
    /// `NoAnswer` settles nothing and only puts the next question off (true).
    fn reconcile(
        &self,
        id: i64,
        attempts: u32,
        answer: StatusAnswer,
        now: Timestamp,
    ) -> impl Future<Output = Result<bool, Unavailable>> + Send;

    /// Makes every delivery of the event due again with the same idempotency key and a fresh
    /// [`Budget`] (operator replay); returns how many. Deliveries in flight are left alone.
    fn redeliver(
        &self,
        key: &Key,
        now: Timestamp,
    ) -> impl Future<Output = Result<u64, Unavailable>> + Send;

    fn gauges(&self) -> impl Future<Output = Result<DeliveryGauges, Unavailable>> + Send;

    /// Waits until new work may be due, for at most `at_most`. The relay calls it once with a
    /// zero wait before its first claim, so a backend that is told about new deliveries
    /// (PostgreSQL's `LISTEN`) registers before it queries and misses nothing; one that is not
    /// simply sleeps, which is the polling fallback.
    fn wait_for_work(&self, at_most: Duration) -> impl Future<Output = ()> + Send;
}

/// Delivery `id`, if it exists. `retry` and `resolve` answer `false` both for a delivery whose
/// state refuses them and for none at all; callers tell the two apart with this.
pub async fn delivery<S: DeliveryStore>(
    store: &S,
    id: i64,
) -> Result<Option<DeliveryView>, Unavailable> {
    // Listings are ordered by id, so the first delivery after `id - 1` is `id` if it exists.
    let filter = DeliveryFilter {
        after: Some(id.saturating_sub(1)),
        limit: 1,
        ..DeliveryFilter::default()
    };
    let page = store.deliveries(filter).await?;
    Ok(page.items.into_iter().next().filter(|d| d.id == id))
}
