//! Whether a claim still fits its lease: what it must hold when sent, the pace's slot it can
//! wait for, and giving back one that no longer fits, unsent.

use std::time::Duration;

use oncebox_core::LeaseError;
use oncebox_core::relay_store::{Claimed, DeliveryStore};
use oncebox_core::route::Route;
use tokio::sync::watch;
use tokio::time::Instant;

use super::pace::Promise;
use super::{Relay, until_stopped};

/// What a lease must still hold after an attempt's timeout when it is sent: time to record.
/// At most half of what the lease holds beyond the timeout, so a fresh claim is always sent.
const RECORD_MARGIN: Duration = Duration::from_secs(5);

/// How long a claim not sent is given back at least, however short its lease ran.
const UNCLAIM_PATIENCE: Duration = Duration::from_secs(5);

/// How long a claim given back because its lease ran short is held back before it is due
/// again. Due at once, a claim that came back already short (claims slower than the lease's
/// margin beyond the timeout) was claimed and given back again without end, two writes a turn
/// and nothing sent; where the wait was for a slow receiver's permits, its route is full.
pub(super) const SHORT_LEASE_PAUSE: Duration = Duration::from_secs(1);

impl<S: DeliveryStore> Relay<S> {
    /// How much of its lease a claim must still hold to be sent on `route`: the timeout and a
    /// margin to record. `None` for a lease no longer than the timeout (a library caller's
    /// choice; configuration refuses it), where holding sends back would send nothing at all:
    /// such a claim is still not sent once its lease has ended.
    fn latest_send(&self, route: &Route) -> Option<Duration> {
        let beyond = self.options.lease.checked_sub(route.timeout)?;
        if beyond.is_zero() {
            return None;
        }
        Some(route.timeout + RECORD_MARGIN.min(beyond / 2))
    }

    /// Waits for `promise`'s slot in its route's pace. `Err` with how long to hold the claim
    /// back when it should be given back instead: its lease cannot wait for the slot
    /// ([`SHORT_LEASE_PAUSE`]), or the relay is stopping (none).
    pub(super) async fn paced(
        &self,
        claimed: &Claimed,
        route: &Route,
        claimed_at: Duration,
        promise: &mut Promise<'_>,
        stop: &watch::Receiver<bool>,
    ) -> Result<(), Duration> {
        while let Err(wait) = promise.take(Instant::now()) {
            if self.short_of_lease(claimed, route, claimed_at, wait) {
                return Err(SHORT_LEASE_PAUSE);
            }
            tokio::select! {
                biased;
                () = until_stopped(stop.clone()) => return Err(Duration::ZERO),
                () = tokio::time::sleep(wait) => {}
            }
        }
        Ok(())
    }

    /// Whether `claimed`, sent after waiting `ahead` more, could still be on its way when its
    /// lease ends (another relay may then send it again). Judged by the wall clock, as the
    /// store and other relays judge the lease, and by the time that really passed since the
    /// claim (`claimed_at`): a wall clock set back hides the lease's end from the first (and
    /// on SQLite the next claim then re-anchors the lease to its own now).
    pub(super) fn short_of_lease(
        &self,
        claimed: &Claimed,
        route: &Route,
        claimed_at: Duration,
        ahead: Duration,
    ) -> bool {
        ahead >= self.left_to_send(claimed, route, claimed_at)
    }

    /// How long `claimed` may still wait before [`Relay::short_of_lease`] holds for it: the
    /// time left for a permit. A claim still waiting then is given back unsent, while its
    /// lease lasts; left waiting, it stayed in flight past its lease, and another relay took it
    /// over as possibly sent (uncertain on a route that does not honour the key) though
    /// nothing was.
    pub(super) fn left_to_send(
        &self,
        claimed: &Claimed,
        route: &Route,
        claimed_at: Duration,
    ) -> Duration {
        let spare = self.latest_send(route).unwrap_or_default();
        let by_wall = claimed
            .lease_expires_at
            .millis()
            .saturating_sub(self.clock.now().millis());
        let by_wall = Duration::from_millis(u64::try_from(by_wall).unwrap_or(0));
        let held_for = self.clock.monotonic().saturating_sub(claimed_at);
        let by_time = self.options.lease.saturating_sub(held_for);
        by_wall.min(by_time).saturating_sub(spare)
    }

    /// Warns, once per route, of a claim that came back already too short of its lease to be
    /// sent: the store took longer to claim than the lease leaves beyond the route's timeout,
    /// so every claim is given back unsent until the lease is longer or the store faster.
    pub(super) fn warn_if_claimed_short(
        &self,
        claimed: &Claimed,
        route: &Route,
        claimed_at: Duration,
    ) {
        if !self.short_of_lease(claimed, route, claimed_at, Duration::ZERO) {
            return;
        }
        let mut warned = super::lock(&self.warned_short);
        if warned.insert(route.name.clone()) {
            tracing::warn!(
                route = %route.name,
                lease_ms = self.options.lease.as_millis(),
                timeout_ms = route.timeout.as_millis(),
                claimed_ms = self.clock.monotonic().saturating_sub(claimed_at).as_millis(),
                "a claim came back with too little of its lease left to send it: the store \
                 claims slower than the lease's margin beyond the route's timeout; claims are \
                 given back unsent until the lease is longer"
            );
        }
    }

    /// Gives back a claim that was not sent, asking a briefly unavailable store again as
    /// `record` does: left in flight, the delivery would be taken over once the lease ends as
    /// one that may have been sent, and parked `uncertain` on a route that ignores the key.
    /// Asked until the lease ends and at least `UNCLAIM_PATIENCE`: only the token guards it (a
    /// claim since makes it `Fenced`, harmlessly), and a lease already short gets its tries too.
    /// Due again after `pause`.
    pub(super) async fn unclaim(
        &self,
        claimed: &Claimed,
        pause: Duration,
    ) -> Result<(), LeaseError> {
        let until = claimed
            .lease_expires_at
            .max(self.clock.now().plus(UNCLAIM_PATIENCE));
        self.asking_again(claimed, "claim not given back yet", until, |now| {
            self.store.unclaim(claimed, now, now.plus(pause))
        })
        .await
    }
}
