//! The relay loop: claim due deliveries under a fenced lease, send each once per claim with
//! its stable key, decide, and record — a relay whose lease was lost records nothing.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oncebox_core::delivery::{DeliveryState, Verdict};
use oncebox_core::relay_store::DeliveryStore;
use oncebox_core::route::Route;
use oncebox_core::{Clock, LeaseError, Unavailable};
use tokio::sync::{Semaphore, watch};

use crate::send::{self, Link};

mod circuit;
mod deliver;
mod lease;
mod outage;
mod pace;
mod pump;
mod reconcile;

use circuit::{Circuit, Turn, open};

/// Ends once `stop` says the relay is stopping. The guard `wait_for` gives is dropped inside,
/// as it cannot be held across an await in a `select!`.
async fn until_stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// How often `run` publishes the delivery gauges.
const GAUGES_EVERY: Duration = Duration::from_secs(10);

/// How often `run` looks for uncertain deliveries whose status check is due.
const RECONCILE_EVERY: Duration = Duration::from_secs(1);

/// What became of one claimed delivery.
enum Step {
    Decided(Verdict),
    /// Given back unsent: too little of its lease was left to send it.
    Unclaimed,
}

/// Tuning of a relay.
#[derive(Debug, Clone)]
pub struct RelayOptions {
    /// How long a claim is ours. Longer than any route's timeout, or a slow attempt would lose
    /// its lease before it can record the outcome.
    pub lease: Duration,
    /// Deliveries claimed at most per claim. Each route sends at most its concurrency at once;
    /// beside those the running loop holds at most this many more, waiting for a slow route's
    /// permits.
    pub batch: usize,
    /// Wait between rounds that found nothing to do (a new event is picked up within it).
    pub idle_poll: Duration,
    /// Consecutive failed attempts that open a route's circuit.
    pub circuit_threshold: u32,
    /// How long an open circuit keeps the relay off the route before one trial round.
    pub circuit_cooldown: Duration,
}

impl Default for RelayOptions {
    fn default() -> RelayOptions {
        RelayOptions {
            lease: Duration::from_secs(120),
            batch: 64,
            // An empty claim costs the writer about 0.15 ms: polling every 10 ms keeps the
            // accept → delivered latency low for a small share of one core.
            idle_poll: Duration::from_millis(10),
            circuit_threshold: 10,
            circuit_cooldown: Duration::from_secs(30),
        }
    }
}

/// What one round did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    pub claimed: usize,
    pub delivered: usize,
    pub retrying: usize,
    pub uncertain: usize,
    pub dead: usize,
    /// Attempts whose outcome could not be recorded because the lease was lost.
    pub fenced: usize,
    /// Claims given back unsent: due again a second later where their lease ran short (they
    /// waited for the route's concurrency, or the claim itself was slow), at once where the
    /// route's circuit opened meanwhile or the relay is stopping.
    pub unclaimed: usize,
    /// Uncertain deliveries settled through a status URL.
    pub reconciled: usize,
}

impl Outcome {
    /// Counts what became of one claim; an unavailable store ends the round as an error.
    fn add(&mut self, step: Result<Step, LeaseError>) -> Result<(), Unavailable> {
        match step {
            Ok(Step::Decided(Verdict::Delivered)) => self.delivered += 1,
            Ok(Step::Decided(Verdict::Retry(_))) => self.retrying += 1,
            Ok(Step::Decided(Verdict::Uncertain(_))) => self.uncertain += 1,
            Ok(Step::Decided(_)) => self.dead += 1,
            Ok(Step::Unclaimed) => self.unclaimed += 1,
            Err(LeaseError::Fenced) => self.fenced += 1,
            Err(LeaseError::Unavailable(e)) => return Err(e),
            Err(e) => return Err(Unavailable::Storage(e.to_string())),
        }
        Ok(())
    }
}

/// One route as the relay serves it: its settings, its concurrency limit, and the link that
/// carries its attempts (a broker connection is kept here between attempts).
#[derive(Debug)]
struct Lane {
    route: Route,
    /// Requests to the receiver in flight at once: the route's concurrency.
    permits: Semaphore,
    /// The route's `rate`, when it has one.
    pace: Option<pace::Pace>,
    /// Status-URL questions in flight at once, apart from the requests: a slow status URL
    /// never holds a delivery back.
    questions: Semaphore,
    link: Link,
    /// The route's own HTTP client (its attempts and its status URL): connects give up within
    /// a part of the route's timeout, so a receiver that drops packets reads as not reached.
    /// `Err` when it could not be built (authorities that do not parse, say): every attempt
    /// then fails as not sent, and the delivery waits, unharmed, until the caps end it.
    client: Result<reqwest::Client, String>,
    /// Where the last reconciliation pass stopped with uncertain deliveries left past it: the
    /// next pass goes on from there (`reconcile.rs`).
    reconciled_to: Mutex<Option<i64>>,
}

/// A relay over a store and a set of routes.
#[derive(Debug)]
pub struct Relay<S> {
    store: S,
    routes: BTreeMap<String, Lane>,
    clock: Arc<dyn Clock>,
    options: RelayOptions,
    circuits: Mutex<HashMap<String, Circuit>>,
    /// Routes not configured here that deliveries were found owed to, already warned of.
    warned_unrouted: Mutex<BTreeSet<String>>,
    /// Routes whose claims came back too short of their lease to send, already warned of.
    warned_short: Mutex<BTreeSet<String>>,
}

/// The longest a route's attempt may take, and the longest interval of its pace: a hundred
/// years, as configuration allows.
const CENTURY: Duration = Duration::from_secs(100 * 366 * 24 * 3600);

impl<S: DeliveryStore> Relay<S> {
    pub fn new(
        store: S,
        routes: Vec<Route>,
        clock: Arc<dyn Clock>,
        options: RelayOptions,
    ) -> Relay<S> {
        let routes = routes
            .into_iter()
            .map(|mut route| {
                // Configuration caps it far below; a library caller's `Duration::MAX` would
                // overflow the deadline an attempt computes from it.
                route.timeout = route.timeout.min(CENTURY);
                let lane = Lane {
                    permits: Semaphore::new(route.concurrency.max(1)),
                    pace: route.rate.map(pace::Pace::new),
                    questions: Semaphore::new(route.concurrency.max(1)),
                    link: Link::new(&route),
                    client: send::client(&route).inspect_err(|e| {
                        tracing::error!(route = %route.name, error = %e, "route client not built: its attempts fail as not sent");
                    }),
                    reconciled_to: Mutex::new(None),
                    route,
                };
                (lane.route.name.clone(), lane)
            })
            .collect();
        Relay {
            store,
            routes,
            clock,
            options,
            circuits: Mutex::new(HashMap::new()),
            warned_unrouted: Mutex::default(),
            warned_short: Mutex::default(),
        }
    }

    /// Routes the relay may claim for now: configured, and not behind an open circuit.
    fn open_routes(&self) -> Vec<String> {
        let now = self.clock.monotonic();
        let circuits = self.circuits();
        self.routes
            .keys()
            .filter(|name| !open(&circuits, name, now))
            .cloned()
            .collect()
    }

    /// A claim's place in its route's pace, for a route that has one (`rate`).
    fn promise(&self, route: &str) -> Option<pace::Promise<'_>> {
        Some(self.routes.get(route)?.pace.as_ref()?.promise())
    }

    /// One round: claim, send, record, then ask status URLs about uncertain deliveries.
    /// Returns what happened; an unavailable store is an error (nothing was claimed, or the
    /// claims expire and are taken again).
    pub async fn run_once(&self) -> Result<Outcome, Unavailable> {
        let mut outcome = self.deliver_due().await?;
        outcome.reconciled = self.reconcile().await?;
        Ok(outcome)
    }

    /// Claims what is due on the open routes, sends each and records its outcome.
    async fn deliver_due(&self) -> Result<Outcome, Unavailable> {
        let now = self.clock.now();
        let routes = self.open_routes();
        let mut outcome = Outcome::default();
        if routes.is_empty() {
            return Ok(outcome);
        }
        let claimed_at = self.clock.monotonic();
        let claimed = self
            .store
            .claim(now, self.options.batch, self.options.lease, &routes)
            .await?;
        outcome.claimed = claimed.len();
        // Never stopped: a single round sends everything it claimed.
        let (_never, stop) = watch::channel(false);
        let results = futures::future::join_all(claimed.iter().map(|c| async {
            let promise = self.promise(&c.route);
            self.deliver(c, claimed_at, promise, &stop).await
        }))
        .await;
        for r in results {
            outcome.add(r)?;
        }
        Ok(outcome)
    }

    /// Publishes gauges: deliveries per state, the age of the oldest one still owed, and how
    /// many are owed to routes this relay does not have (warned of once per such route).
    pub async fn publish_gauges(&self) -> Result<(), Unavailable> {
        let g = self.store.gauges().await?;
        // Every state, 0 where the store counted none: a state whose last delivery moved on
        // must read 0, not its last count (an alert on `uncertain > 0` would never clear).
        for state in DeliveryState::NAMES {
            let n = g
                .by_state
                .iter()
                .find(|(s, _)| s == state)
                .map_or(0, |(_, n)| *n);
            metrics::gauge!("oncebox_deliveries", "state" => state).set(n as f64);
        }
        let age = g.oldest_pending.map_or(0.0, |t| {
            (self.clock.now().millis().saturating_sub(t.millis())).max(0) as f64 / 1000.0
        });
        metrics::gauge!("oncebox_oldest_pending_delivery_seconds").set(age);
        let unrouted = self.unrouted_of(g.owed_by_route);
        let total: i64 = unrouted.iter().map(|(_, n)| n).sum();
        metrics::gauge!("oncebox_deliveries_unrouted").set(total as f64);
        let mut warned = lock(&self.warned_unrouted);
        for (route, owed) in unrouted {
            if warned.insert(route.clone()) {
                tracing::warn!(
                    route,
                    owed,
                    "deliveries are owed to a route that is not configured (renamed or removed?): no relay sends them until a route of that name is configured again"
                );
            }
        }
        Ok(())
    }

    /// Deliveries still owed to routes this relay is not configured with, by route name: a
    /// route renamed or removed leaves its queue behind, and nothing sends it.
    pub async fn unrouted(&self) -> Result<Vec<(String, i64)>, Unavailable> {
        Ok(self.unrouted_of(self.store.gauges().await?.owed_by_route))
    }

    fn unrouted_of(&self, owed: Vec<(String, i64)>) -> Vec<(String, i64)> {
        owed.into_iter()
            .filter(|(route, _)| !self.routes.contains_key(route))
            .collect()
    }

    /// Delivers until `shutdown` completes (see `pump`: each route's deliveries go on as their
    /// own requests end, so a slow receiver holds back no other route); with nothing to do it
    /// waits for the store's wake-up (PostgreSQL's `NOTIFY`) or at most `idle_poll`. Status
    /// URLs are asked beside, never in between, so a slow one holds no delivery back. On
    /// shutdown an attempt in progress finishes and is recorded, and a claim still waiting
    /// for its route is given back unsent.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) {
        let (stop, stopped) = watch::channel(false);
        let signal = async move {
            shutdown.await;
            let _ = stop.send(true);
        };
        tokio::join!(
            signal,
            self.deliver_until(stopped.clone()),
            self.reconcile_until(stopped)
        );
    }

    async fn reconcile_until(&self, mut stopped: watch::Receiver<bool>) {
        loop {
            // A pass only asks and settles, each settlement one guarded statement: it may be
            // cut short, so that a hanging status URL never holds the shutdown up.
            tokio::select! {
                biased;
                _ = stopped.wait_for(|stop| *stop) => return,
                done = self.reconcile() => if let Err(e) = done {
                    tracing::warn!(error = %e, "reconciliation failed");
                },
            }
            tokio::select! {
                biased;
                _ = stopped.wait_for(|stop| *stop) => return,
                () = tokio::time::sleep(RECONCILE_EVERY) => {}
            }
        }
    }
}

/// The guarded value, whatever a panic left it: each holder's state stays valid at every step.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
