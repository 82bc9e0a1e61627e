//! The long-running delivery loop: claims go on as sends end, route by route. A round that
//! waited for every claim of its batch held each route back behind the slowest receiver of
//! any route (up to its timeout); here a route with room is claimed for as soon as any send
//! ends, and a route whose claims fill its concurrency is not claimed for until one ends.

use std::collections::HashMap;
use std::pin::pin;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use oncebox_core::relay_store::{Claimed, DeliveryStore};
use oncebox_core::{LeaseError, Timestamp, Unavailable};
use tokio::sync::watch;

use super::outage::Outage;
use super::{GAUGES_EVERY, Outcome, Relay, Step, until_stopped};

impl<S: DeliveryStore> Relay<S> {
    pub(super) async fn deliver_until(&self, stopped: watch::Receiver<bool>) {
        // By the time that passes, not the wall clock: one set back an hour held the gauges
        // (and the unrouted warning) at their old values for that hour.
        let mut gauges_due = self.clock.monotonic();
        let mut held = InHand::default();
        let mut outage = Outage::default();
        let mut sending = FuturesUnordered::new();
        // A store that is told about new work starts listening before the first claim.
        self.store.wait_for_work(Duration::ZERO).await;
        loop {
            let (room, paced_for) = if *stopped.borrow() {
                (None, None)
            } else {
                self.room(&held.by_route)
            };
            // Taken before the claim is asked for, so the lease is measured from no later
            // than its start.
            let claimed_at = self.clock.monotonic();
            let (claimed, freed) = match room {
                Some(want) => {
                    let claim = self.claim_for(want);
                    let (answer, freed) = beside(claim, &mut sending, &mut held).await;
                    let answer = answer.map(|(claimed, failed)| {
                        if let Some(e) = failed {
                            outage.partly(&e);
                        }
                        claimed
                    });
                    (outage.read(answer), freed)
                }
                None => (Vec::new(), false),
            };
            // More may be due at once, or a route has room again since the claim began: look
            // again without waiting.
            let mut again = freed || !claimed.is_empty();
            for c in claimed {
                held.take(&c);
                let stop = stopped.clone();
                let promise = self.promise(&c.route);
                sending.push(async move {
                    let step = self.deliver(&c, claimed_at, promise, &stop).await;
                    (c.route, c.id, step)
                });
            }
            let now = self.clock.monotonic();
            if now >= gauges_due {
                gauges_due = now + GAUGES_EVERY;
                let (published, freed) =
                    beside(self.publish_gauges(), &mut sending, &mut held).await;
                again |= freed;
                if let Err(e) = published {
                    tracing::debug!(error = %e, "gauges not published");
                }
            }
            if *stopped.borrow() {
                // Attempts in progress finish and are recorded; claims waiting for their
                // route are given back.
                self.say_waiting(&held.lease_ends);
                while sending.next().await.is_some() {}
                return;
            }
            let pause = if again {
                Duration::ZERO
            } else {
                // A paced route left out for its pace is looked at again when a slot of it
                // comes within reach.
                let idle = outage.pause(self.options.idle_poll);
                paced_for.map_or(idle, |wait| idle.min(wait))
            };
            tokio::select! {
                biased;
                () = until_stopped(stopped.clone()) => {}
                Some((route, id, step)) = sending.next(), if !sending.is_empty() => {
                    held.settle(&route, id, step);
                }
                () = self.store.wait_for_work(pause) => {}
            }
        }
    }

    /// Says what a graceful stop waits for: each attempt in progress ends by its route's
    /// timeout and its record by its lease's end (an operator who cannot wait stops the
    /// process; those deliveries are then taken again when their leases end).
    fn say_waiting(&self, leases: &HashMap<i64, Timestamp>) {
        if leases.is_empty() {
            return;
        }
        let now = self.clock.now();
        let last = leases.values().max().map_or(0, |end| end.millis());
        let ms = u64::try_from(last.saturating_sub(now.millis())).unwrap_or(0);
        tracing::info!(
            "waiting for {} delivery attempt{}, up to {}s; signal again to stop now",
            leases.len(),
            if leases.len() == 1 { "" } else { "s" },
            // Whole seconds, rounded up: a wait is not announced shorter than it may be.
            ms.div_ceil(1000),
        );
    }

    /// The open routes that have room (fewer claims held than their concurrency, and on a
    /// paced route slots within reach not promised to claims in hand), each with its room, and
    /// how many to claim for them: at most their room together, and what the batch has room
    /// for. `None`: no room. Beside it, when a paced route was left out for its pace alone, how
    /// long until a slot of it comes within reach.
    ///
    /// One claim over several routes takes the oldest due first, so one route may take the
    /// others' share; those wait for its permits (and its slots), and while it holds its
    /// concurrency it is left out of the next claims. The batch bounds one claim, not the
    /// claims in hand: each route's own concurrency bounds those it sends. Counted against
    /// the batch, the claims of slow routes held it whole (a route whose backlog came first,
    /// or a few slow ones at their concurrency, 4 × 16 of the default 64), and no other route
    /// was claimed for until one of their slow answers came, one claim per answer. While a
    /// route holds a surplus (more than its concurrency) the next claims are split so that no
    /// route gets more than its own room (`Want::split`, `claim_for`), and no surplus grows
    /// beside it: the claims in hand stay within the routes' concurrency and one batch more.
    fn room(&self, held: &HashMap<String, usize>) -> (Option<Want>, Option<Duration>) {
        let now = tokio::time::Instant::now();
        let mut split = false;
        for (name, n) in held {
            let most = self
                .routes
                .get(name)
                .map_or(*n, |l| l.route.concurrency.max(1));
            split |= *n > most;
        }
        let mut room = 0usize;
        let mut paced_for: Option<Duration> = None;
        let mut any_paced = false;
        let routes: Vec<(String, usize)> = self
            .open_routes()
            .into_iter()
            .filter_map(|name| {
                let lane = self.routes.get(&name)?;
                let concurrency = lane.route.concurrency.max(1);
                let mut free = concurrency.saturating_sub(held.get(&name).copied().unwrap_or(0));
                if let Some(pace) = lane.pace.as_ref().filter(|_| free > 0) {
                    match pace.room(now) {
                        Ok(slots) => free = free.min(slots),
                        Err(wait) => {
                            free = 0;
                            paced_for = Some(paced_for.map_or(wait, |w| w.min(wait)));
                        }
                    }
                }
                room = room.saturating_add(free);
                any_paced |= free > 0 && lane.pace.is_some();
                (free > 0).then_some((name, free))
            })
            .collect();
        // A paced route's room is its slots: claimed beside others in one claim, oldest first,
        // it took more, and held them waiting for their slots under the lease.
        split |= any_paced && routes.len() > 1;
        let room = room.min(self.options.batch);
        let want = (room > 0 && !routes.is_empty()).then_some(Want {
            routes,
            room,
            split,
        });
        (want, paced_for)
    }

    /// Claims what `want` asks for: in one claim over its routes, or, split, so that no route
    /// gets more than its own room. Split, the routes go smallest room first: one whose room
    /// is less than what is left to claim is claimed for alone, and once every route left has
    /// room for all that is left, they are claimed for together, oldest first across them as
    /// unsplit (claimed alone in name order, the route first in it took the whole room every
    /// round). A failure before anything was claimed is the answer (in an outage every claim
    /// would wait out the store's deadline in turn); one after is given beside the claims,
    /// which are leased: dropped here, they would wait in flight for their lease to end and be
    /// taken over as if their relay had died.
    async fn claim_for(
        &self,
        want: Want,
    ) -> Result<(Vec<Claimed>, Option<Unavailable>), Unavailable> {
        let (now, lease) = (self.clock.now(), self.options.lease);
        let mut routes = want.routes;
        if !want.split {
            let names: Vec<String> = routes.into_iter().map(|(n, _)| n).collect();
            let claimed = self.store.claim(now, want.room, lease, &names).await?;
            return Ok((claimed, None));
        }
        routes.sort_by_key(|(_, free)| *free);
        let mut left = want.room;
        let mut claimed = Vec::new();
        let mut failed = None;
        let mut at = 0;
        while left > 0 && at < routes.len() {
            let alone = routes[at].1 < left;
            let (names, limit): (Vec<String>, usize) = if alone {
                (vec![routes[at].0.clone()], routes[at].1)
            } else {
                (routes[at..].iter().map(|(n, _)| n.clone()).collect(), left)
            };
            at = if alone { at + 1 } else { routes.len() };
            match self.store.claim(now, limit, lease, &names).await {
                Ok(got) => {
                    left = left.saturating_sub(got.len());
                    claimed.extend(got);
                }
                Err(e) if claimed.is_empty() => return Err(e),
                Err(e) => failed = Some(e),
            }
        }
        Ok((claimed, failed))
    }
}

/// What to claim: the routes with room, each with its room; how many in all; and whether
/// split so that no route gets more than its room (a route holds claims past its concurrency,
/// or a paced route is among several).
struct Want {
    routes: Vec<(String, usize)>,
    room: usize,
    split: bool,
}

/// What a send ends with: its route, its delivery's id and its step.
type Sent = (String, i64, Result<Step, LeaseError>);

/// The claims not yet decided: how many per route, and when each one's lease ends.
#[derive(Default)]
struct InHand {
    by_route: HashMap<String, usize>,
    lease_ends: HashMap<i64, Timestamp>,
}

impl InHand {
    fn take(&mut self, c: &Claimed) {
        *self.by_route.entry(c.route.clone()).or_default() += 1;
        self.lease_ends.insert(c.id, c.lease_expires_at);
    }

    /// Counts a send's end: its route has room again, and a store error is logged.
    fn settle(&mut self, route: &str, id: i64, step: Result<Step, LeaseError>) {
        self.lease_ends.remove(&id);
        if let Some(n) = self.by_route.get_mut(route) {
            *n = n.saturating_sub(1);
        }
        if let Err(e) = Outcome::default().add(step) {
            tracing::warn!(error = %e, "relay round failed");
        }
    }
}

/// Awaits `work` (a claim, the gauges) while the sends in flight go on. A send left unpolled
/// would keep what it holds of the store, a pooled connection in mid-statement or its turn for
/// one, until `work` ended, and `work` may be waiting for exactly that: on a pool smaller than
/// the sends, the claim then waited out the store's whole deadline. Its answer would wait
/// unread as well. Also says whether a send ended meanwhile: its route has room again, and
/// the loop looks at once instead of waiting out its poll.
async fn beside<T>(
    work: impl Future<Output = T>,
    sending: &mut FuturesUnordered<impl Future<Output = Sent>>,
    held: &mut InHand,
) -> (T, bool) {
    let mut work = pin!(work);
    let mut freed = false;
    loop {
        tokio::select! {
            biased;
            out = &mut work => return (out, freed),
            Some((route, id, step)) = sending.next(), if !sending.is_empty() => {
                held.settle(&route, id, step);
                freed = true;
            }
        }
    }
}
