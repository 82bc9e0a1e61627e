//! One claimed delivery: wait for the route's concurrency, send it if its lease still covers
//! the attempt and its record, decide, and record the outcome while the lease lasts.

use std::time::Duration;

use oncebox_core::delivery::{Attempt, Verdict, decide};
use oncebox_core::relay_store::{AttemptRecord, Claimed, DeliveryStore};
use oncebox_core::route::Route;
use oncebox_core::{LeaseError, Timestamp, Unavailable};

use tokio::sync::{TryAcquireError, watch};

use super::lease::SHORT_LEASE_PAUSE;
use super::pace::Promise;
use super::{Lane, Relay, Step, Turn, until_stopped};
use crate::send;

/// Recording an outcome while the store is unavailable: the first and the longest pause
/// between tries. There is no cap on their number: only the lease ends them, since giving up
/// any earlier leaves the delivery in flight to be sent again once the lease is gone.
const RECORD_RETRY: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(1));

/// How far past its route's `max_age` a delivery tried before may still be sent: the relay's
/// own pace in taking a due delivery (a last try scheduled at the cap, after a wait past it,
/// is taken a moment after). One later than this was held back by an outage.
const AGE_GRACE: Duration = Duration::from_secs(60);

impl<S: DeliveryStore> Relay<S> {
    /// Sends `claimed` once its route has a free permit; a claim still waiting for one when
    /// `stop` fires is given back unsent, so a shutdown does not leave it in flight until its
    /// lease ends (nor send it late, with the process about to be killed).
    ///
    /// `claimed_at` is the clock's monotonic time taken before the claim was asked for.
    ///
    /// On a paced route (`rate`) it then waits for a slot of the route's pace (`promise`, taken
    /// when the claim came back); a slot its lease cannot wait for gives the claim back at
    /// once. The slot comes after the permit, so it is taken just before the request goes: a
    /// slot taken first and then held behind a slow receiver's permits would send with the
    /// slots taken meanwhile, in a burst, as the permits free up together.
    pub(super) async fn deliver(
        &self,
        claimed: &Claimed,
        claimed_at: Duration,
        mut promise: Option<Promise<'_>>,
        stop: &watch::Receiver<bool>,
    ) -> Result<Step, LeaseError> {
        let Some(Lane {
            route,
            permits,
            link,
            client,
            ..
        }) = self.routes.get(&claimed.route)
        else {
            // Claims are limited to configured routes; a vanished one keeps its delivery as is.
            return Err(LeaseError::Fenced);
        };
        if claimed.taken_over {
            return self.orphaned(claimed, route).await;
        }
        if let Some(why) = self.too_old(claimed, route) {
            return self.expired(claimed, route, why).await;
        }
        self.warn_if_claimed_short(claimed, route, claimed_at);
        // Claimed as a shutdown began (the claim was under way when it was asked for): no
        // turn, as one still waiting gets none, since a process about to stop could be killed
        // with the request on its way.
        let stopped = *stop.borrow();
        let permit = if stopped {
            Err(Duration::ZERO)
        } else {
            let stopping = until_stopped(stop.clone());
            match permits.try_acquire() {
                Ok(permit) => Ok(permit),
                Err(TryAcquireError::Closed) => return Err(LeaseError::Fenced),
                // The stop first: a permit freed by the attempt that ended as the shutdown began
                // is handed straight to this waiter, and both are ready at its next poll. The
                // wait ends, too, once the lease no longer leaves time to send and record.
                Err(TryAcquireError::NoPermits) => {
                    let short = tokio::time::sleep(self.left_to_send(claimed, route, claimed_at));
                    tokio::select! {
                        biased;
                        () = stopping => Err(Duration::ZERO),
                        permit = permits.acquire() => Ok(permit.map_err(|_| LeaseError::Fenced)?),
                        () = short => Err(SHORT_LEASE_PAUSE),
                    }
                }
            }
        };
        let permit = match permit {
            Ok(permit) => permit,
            Err(pause) => {
                self.unclaim(claimed, pause).await?;
                return Ok(Step::Unclaimed);
            }
        };
        if let Some(promise) = promise.as_mut()
            && let Err(pause) = self.paced(claimed, route, claimed_at, promise, stop).await
        {
            drop(permit);
            self.unclaim(claimed, pause).await?;
            return Ok(Step::Unclaimed);
        }
        // A shutdown that began during the pace: given back unsent, as above.
        if *stop.borrow() {
            drop(permit);
            self.unclaim(claimed, Duration::ZERO).await?;
            return Ok(Step::Unclaimed);
        }
        // Asked again after the waits: behind a slow receiver's permits (most of a lease) or a
        // pace, a claim young enough when it came back can be past its cap when its turn comes.
        if let Some(why) = self.too_old(claimed, route) {
            drop(permit);
            return self.expired(claimed, route, why).await;
        }
        // Given back unsent, to be taken again, when either holds:
        // - the route's circuit is open (the sends ahead of this claim failed), or its one
        //   trial after the cooldown is out: not sent into the failure;
        // - the attempt and its record no longer both fit in the lease. One sent later could
        //   still be on its way when the lease ends and another relay sends the delivery again;
        //   waiting for a permit behind a slow receiver is where the time goes.
        let lease_short = self.short_of_lease(claimed, route, claimed_at, Duration::ZERO);
        let turn = if lease_short {
            Turn::Shut
        } else {
            self.turn(&route.name)
        };
        if matches!(turn, Turn::Shut) {
            drop(permit);
            // Held back a moment where the lease ran short, rather than taken again at once.
            let pause = if lease_short {
                SHORT_LEASE_PAUSE
            } else {
                Duration::ZERO
            };
            self.unclaim(claimed, pause).await?;
            return Ok(Step::Unclaimed);
        }
        let (attempt, record) =
            send::attempt(client, link, route, claimed, self.clock.as_ref()).await;
        // The limit is on requests to the receiver; recording waits for a commit and must not
        // hold the next request back.
        drop(permit);
        let concluded = self
            .conclude(claimed, route, &attempt, record, turn.epoch())
            .await;
        // A trial the receiver was not asked in ends here; an answered one was settled.
        drop(turn);
        concluded
    }

    /// Why `claimed`, tried before within its budget, is past its route's `max_age` (and the
    /// grace) now: an outage held it back. The route's caps bound when a request with its key
    /// may reach the receiver: one that honours the key keeps it that long and no longer (the
    /// route's `max_age` says so), so a request after an earlier one whose outcome was unknown
    /// could apply the event a second time. A delivery never tried gets its one try still:
    /// nothing of it reached the receiver.
    fn too_old(&self, claimed: &Claimed, route: &Route) -> Option<String> {
        let budget = &claimed.budget;
        let age = budget.age(self.clock.now());
        let cap = route.retry.max_age;
        (budget.spent(claimed.attempts) > 0 && age > cap.saturating_add(AGE_GRACE)).then(|| {
            format!(
                "not sent again: older than its route's max_age of {cap:?} when its turn came \
                 (an outage held it back), after an earlier attempt"
            )
        })
    }

    /// Records `claimed` dead without sending it ([`Relay::too_old`]).
    async fn expired(
        &self,
        claimed: &Claimed,
        route: &Route,
        why: String,
    ) -> Result<Step, LeaseError> {
        tracing::warn!(key = %claimed.idempotency_key, route = %route.name, "{why}");
        let record = AttemptRecord {
            started_at: self.clock.now(),
            duration: Duration::ZERO,
            status: None,
            error: Some(why.clone()),
        };
        metrics::counter!("oncebox_delivery_attempts_total", "route" => route.name.clone(), "outcome" => "dead").increment(1);
        let verdict = Verdict::Dead(why);
        self.record(claimed, record, &verdict).await?;
        Ok(Step::Decided(verdict))
    }

    /// A delivery claimed from a relay whose lease ran out mid-attempt: that relay may have
    /// sent it (it died between the request and its record, or stalled past its lease). Its
    /// attempt is recorded as one sent without an answer (DESIGN §6), so it is not sent now: on
    /// a route that does not honour the key it is parked `uncertain` for the route's status
    /// URL or an operator; on one that does it is retried after the backoff, as the next
    /// attempt. Counted, a relay dying on every try of a delivery runs into the route's caps
    /// instead of sending it for ever, and `Oncebox-Attempt` never repeats a number.
    async fn orphaned(&self, claimed: &Claimed, route: &Route) -> Result<Step, LeaseError> {
        let why = if route.idempotent {
            "the relay holding this delivery stopped mid-attempt (its lease ran out): it may \
             have been sent; sent again, since this route honours the key"
        } else {
            "the relay holding this delivery stopped mid-attempt (its lease ran out): it may \
             have been sent, and this route does not honour the key"
        };
        let record = AttemptRecord {
            started_at: self.clock.now(),
            duration: Duration::ZERO,
            status: None,
            error: Some(why.to_owned()),
        };
        metrics::counter!("oncebox_delivery_orphaned_total", "route" => route.name.clone())
            .increment(1);
        tracing::warn!(key = %claimed.idempotency_key, route = %route.name, "{why}");
        // Nothing was asked of the receiver: its circuit hears nothing of this.
        let attempt = Attempt::NoAnswer(why.to_owned());
        self.conclude(claimed, route, &attempt, record, None).await
    }

    /// Decides an attempt's verdict, tells the route's circuit when the receiver was asked
    /// (`sent_in`: the circuit's epoch it was asked in), and records the verdict.
    async fn conclude(
        &self,
        claimed: &Claimed,
        route: &Route,
        attempt: &Attempt,
        record: AttemptRecord,
        sent_in: Option<u64>,
    ) -> Result<Step, LeaseError> {
        let now = self.clock.now();
        // Counted from the delivery's budget: its creation, or an operator's latest retry.
        let budget = &claimed.budget;
        // A lost attempt (not `sent_in`: taken over from a relay that stopped) counts towards
        // the attempts cap but not the age cap: after an outage longer than `max_age` the
        // delivery still gets a try of this relay's, as a pending one does, rather than dying
        // for the outage.
        let age = if sent_in.is_some() {
            budget.age(now)
        } else {
            Duration::ZERO
        };
        let verdict = decide(
            attempt,
            route,
            budget.spent(claimed.attempts).saturating_add(1),
            age,
            rand::random(),
        );
        if let Some(epoch) = sent_in {
            let pause = asked_pause(attempt, &verdict, route.retry.backoff.cap);
            self.note(
                &route.name,
                !matches!(verdict, Verdict::Delivered),
                epoch,
                pause,
            );
        }
        let label = match &verdict {
            Verdict::Delivered => "delivered",
            Verdict::Retry(_) => "retrying",
            Verdict::Uncertain(_) => "uncertain",
            _ => "dead",
        };
        metrics::counter!("oncebox_delivery_attempts_total", "route" => route.name.clone(), "outcome" => label).increment(1);
        tracing::debug!(route = %route.name, key = %claimed.idempotency_key, ?verdict, "attempt");
        // Between the receiver's answer and our record: a crash here leaves the delivery in
        // flight; after the lease it is claimed again and re-sent with the same key.
        crate::crash::point!("relay-before-record");
        match self.record(claimed, record, &verdict).await {
            Ok(()) => Ok(Step::Decided(verdict)),
            Err(LeaseError::Fenced) => {
                // Another relay took the delivery after our lease expired; its outcome wins.
                tracing::warn!(key = %claimed.idempotency_key, route = %route.name, "lease lost: outcome not recorded");
                metrics::counter!("oncebox_delivery_fenced_total", "route" => route.name.clone())
                    .increment(1);
                Err(LeaseError::Fenced)
            }
            Err(e) => Err(e),
        }
    }

    /// Records an attempt's outcome. A store that is briefly unavailable (a lock held by
    /// another process, a pool out of connections) is asked again while the lease lasts: the
    /// outcome is known only here, and once the lease is gone the delivery is sent again —
    /// a second effect where the route does not honour the key.
    async fn record(
        &self,
        claimed: &Claimed,
        record: AttemptRecord,
        verdict: &Verdict,
    ) -> Result<(), LeaseError> {
        let until = claimed.lease_expires_at;
        self.asking_again(claimed, "outcome not recorded yet", until, |now| {
            self.store
                .record(claimed, record.clone(), verdict.clone(), now)
        })
        .await
    }

    /// Runs `op` at the clock's now until it is done or `until` is near, pausing with backoff
    /// after each `Unavailable`. Also after a write whose fate is unknown (its answer lost):
    /// it may have taken effect, and the lease's own guard then refuses the next try
    /// (`Fenced`), which says that the earlier try took effect, not that the lease was lost
    /// (read so only for a try begun within `until`: for `record` the lease, where no other
    /// relay could take the claim; an `unclaim` refused past it has nothing left to give back
    /// either way). Giving up there instead left a claim whose outcome was never recorded in
    /// flight, to be taken over as one that may have been sent: parked uncertain, on a route
    /// that ignores the key, although the receiver had answered.
    pub(super) async fn asking_again<F, Fut>(
        &self,
        claimed: &Claimed,
        what: &str,
        until: Timestamp,
        mut op: F,
    ) -> Result<(), LeaseError>
    where
        F: FnMut(Timestamp) -> Fut,
        Fut: Future<Output = Result<(), LeaseError>>,
    {
        let mut pause = RECORD_RETRY.0;
        let mut unknown = false;
        loop {
            let now = self.clock.now();
            let answer = op(now).await;
            // Judged when the answer came: a call that hung (a connection dead until the
            // system gave up on it) may have outlasted the lease.
            let answered = self.clock.now();
            match answer {
                Err(LeaseError::Unavailable(e)) if answered.plus(pause) < until => {
                    unknown |= matches!(e, Unavailable::CommitUnknown(_));
                    tracing::warn!(key = %claimed.idempotency_key, error = %e, "{what}; trying again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(RECORD_RETRY.1);
                }
                Err(LeaseError::Fenced) if unknown && now < until => {
                    tracing::info!(key = %claimed.idempotency_key, "{what}: the earlier try, whose answer was lost, took effect");
                    return Ok(());
                }
                done => return done,
            }
        }
    }
}

/// How long the receiver asked the whole route to pause: the `Retry-After` of a 429 or 503
/// that is retried, at most the route's backoff cap (a receiver's or a proxy's mistake of a
/// year would otherwise hold every delivery back that long). RFC 9110 and 6585 address it to
/// the client, not to the one request: honoured by the failed delivery alone, the route went
/// on sending the others, up to its concurrency at once, into a receiver that asked for quiet.
/// Another status's `Retry-After` (a 500's) has no such meaning and delays its delivery only.
/// Never past the answered delivery's own next try (`wait`), which `decide` cut to a last try
/// at its `max_age`: held past that, it would be found too old when claimed and die unsent.
fn asked_pause(attempt: &Attempt, verdict: &Verdict, cap: Duration) -> Option<Duration> {
    match (attempt, verdict) {
        (
            Attempt::Answered {
                status: 429 | 503,
                retry_after: Some(asked),
            },
            Verdict::Retry(wait),
        ) if !asked.is_zero() => Some((*asked).min(cap).min(*wait)).filter(|d| !d.is_zero()),
        _ => None,
    }
}
