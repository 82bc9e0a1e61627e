//! Reconciliation: asking routes' status URLs whether their receivers applied the keys of
//! uncertain deliveries, and settling each by the answer.

use futures::future::join_all;

use oncebox_core::delivery::{DeliveryState, RetryPolicy};
use oncebox_core::relay_store::{DeliveryFilter, DeliveryStore, DeliveryView, StatusAnswer};
use oncebox_core::{Timestamp, Unavailable};

use super::{Lane, Relay, lock};
use crate::send;

/// Uncertain deliveries one route's status URL is asked about per pass. Their questions run
/// side by side, as many at once as the route's concurrency (on permits of their own, so they
/// never wait in line with deliveries), so a pass takes a few of its timeouts at most.
const PER_PASS: usize = 16;

/// Pages of uncertain deliveries one pass reads per route at most, looking for [`PER_PASS`]
/// readable ones. A row that no longer parses (edited by hand) is skipped by the listing but
/// still uses up its place in the page, and nothing reschedules it: read from the start each
/// time, 16 such rows would hide every later uncertain delivery of the route. So a pass reads
/// on past them, and the next pass goes on where it stopped, back at the start once it reached
/// the end.
const PAGES_PER_PASS: usize = 8;

impl<S: DeliveryStore> Relay<S> {
    /// Asks status URLs about the uncertain deliveries whose check is due: applied →
    /// delivered; not applied → due again with the same key, or dead once the route's attempts
    /// or age are used up; no answer → asked again later,
    /// after a wait that doubles each time. Returns how many were settled.
    ///
    /// Routes are asked side by side: one after another, a status URL that hung until its
    /// timeout held every later route's questions back by as long, and one route's failure
    /// ended the pass for the rest. A failure is the answer only when nothing was settled.
    pub async fn reconcile(&self) -> Result<usize, Unavailable> {
        let passes = self
            .routes
            .iter()
            .filter(|(_, lane)| lane.route.status_url.is_some())
            .map(|(name, lane)| self.reconcile_route(name, lane));
        let (mut settled, mut failed) = (0, None);
        for pass in join_all(passes).await {
            match pass {
                Ok(n) => settled += n,
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        match failed {
            Some(e) if settled == 0 => Err(e),
            _ => Ok(settled),
        }
    }

    /// One route's share of [`Relay::reconcile`].
    async fn reconcile_route(&self, name: &str, lane: &Lane) -> Result<usize, Unavailable> {
        let due = self.due_uncertain(name, lane).await?;
        let mut settled = 0;
        for done in join_all(due.iter().map(|d| self.ask(lane, d))).await {
            settled += usize::from(done?);
        }
        Ok(settled)
    }

    /// Up to [`PER_PASS`] uncertain deliveries of `route` whose check is due, in id order
    /// from where the last pass stopped, on from the start once past the end (up to where it
    /// began), reading on past rows the listing skips.
    async fn due_uncertain(
        &self,
        route: &str,
        lane: &Lane,
    ) -> Result<Vec<DeliveryView>, Unavailable> {
        let began = *lock(&lane.reconciled_to);
        let (mut due, mut after, mut wrapped, mut left) = (Vec::new(), began, false, None);
        for _ in 0..PAGES_PER_PASS {
            let filter = DeliveryFilter {
                state: Some(DeliveryState::Uncertain),
                route: Some(route.to_owned()),
                due_by: Some(self.clock.now()),
                after,
                limit: PER_PASS - due.len(),
                ..DeliveryFilter::default()
            };
            let page = self.store.deliveries(filter).await?;
            // Once wrapped, what lies past where this pass began was read already.
            let upto = began.filter(|_| wrapped).unwrap_or(i64::MAX);
            due.extend(page.items.into_iter().filter(|d| d.id <= upto));
            left = page.next.filter(|next| *next < upto);
            match left {
                _ if due.len() >= PER_PASS => break,
                Some(next) => after = Some(next),
                None if began.is_some() && !wrapped => (after, wrapped) = (None, true),
                None => break,
            }
        }
        *lock(&lane.reconciled_to) = left;
        Ok(due)
    }

    /// Asks about one delivery; true when its answer settled it.
    async fn ask(&self, lane: &Lane, d: &DeliveryView) -> Result<bool, Unavailable> {
        let answer = {
            let Ok(_permit) = lane.questions.acquire().await else {
                return Ok(false);
            };
            // The key the receiver saw: a library handler's message carries its own.
            let asked = match &lane.client {
                Ok(client) => send::applied(client, &lane.route, &d.idempotency_key).await,
                Err(_) => None,
            };
            match asked {
                Some(true) => StatusAnswer::Applied,
                Some(false) if spent(&lane.route.retry, d, self.clock.now()) => {
                    StatusAnswer::NotAppliedSpent
                }
                Some(false) => StatusAnswer::NotApplied,
                None => StatusAnswer::NoAnswer,
            }
        };
        // Only while it is still uncertain: an operator may have settled it meanwhile.
        let changed = self
            .store
            .reconcile(d.id, d.attempts, answer, self.clock.now())
            .await?;
        Ok(changed && answer != StatusAnswer::NoAnswer)
    }
}

/// Whether `d` has used up the attempts or the age `policy` allows: another attempt would be
/// past the cap a retry is held to.
fn spent(policy: &RetryPolicy, d: &DeliveryView, now: Timestamp) -> bool {
    d.budget.spent(d.attempts) >= policy.max_attempts || d.budget.age(now) >= policy.max_age
}
