//! One delivery, from the store's answer to what the broker is told: an outage is waited out
//! with the delivery held (never handed back, where a quorum queue would count it towards its
//! delivery limit), a panicking handler counts as a failing one, and handler failures are
//! counted here, not by the broker.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::FutureExt;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions};
use oncebox_core::consume::{
    Arrivals, Broker, Counts, Owed, Reason, Requeue, Settle, Ticket, decide, panic_message, settle,
};
use oncebox_core::delivery::Backoff;
use oncebox_core::{Event, Key, ProcessError, Processed};
use tokio::sync::watch;

use crate::ConsumerOptions;
use crate::message::{Props, delivery_count, quarantined_here_for};
use crate::publish::{Publisher, QuarantineError};

/// Keys remembered with their handler failures until settled; past this many, the keys that
/// never failed are dropped, and if that is not enough the memory is cleared: a key failing
/// again falls back to the broker's `x-delivery-count`, which also
/// counts requeues that were no handler failure: such a message may be quarantined sooner
/// than `max_attempts` failures (never looped). A classic queue keeps no count: its messages
/// start again from one.
const MAX_REMEMBERED_FAILURES: usize = 10_000;

/// The longest wait between two tries of an unavailable store (or `retry.delay`, if longer):
/// an outage of hours is retried every half minute at most, not every few hours.
const OUTAGE_BACKOFF_CAP: Duration = Duration::from_secs(30);

/// What every delivery's task needs.
pub(crate) struct Shared<A> {
    pub(crate) apply: A,
    pub(crate) options: ConsumerOptions,
    pub(crate) counts: watch::Sender<Counts>,
    failures: Mutex<HashMap<Key, u32>>,
    /// Conflicts whose quarantine the broker did not take: not asked of the store again.
    owed: Owed,
    /// The order deliveries arrived in: one key's are applied in it (`Arrivals`).
    pub(crate) arrivals: Arrivals,
}

impl<A: oncebox_core::consume::Apply> Shared<A> {
    pub(crate) fn new(apply: A, options: ConsumerOptions) -> Shared<A> {
        Shared {
            apply,
            options,
            counts: watch::Sender::new(Counts::default()),
            failures: Mutex::new(HashMap::new()),
            owed: Owed::default(),
            arrivals: Arrivals::default(),
        }
    }

    pub(crate) async fn handle(
        self: Arc<Self>,
        delivery: Delivery,
        publisher: Arc<Publisher>,
        stopping: watch::Receiver<bool>,
        mut ticket: Ticket,
    ) {
        failpoint(&self.options.queue);
        let event = self.event(&delivery);
        let key = event.as_ref().ok().map(|e| e.key.clone());
        let offered = event.as_ref().ok().map(|e| e.fingerprint);
        // Of two deliveries of one key in hand, the one that arrived first is applied first,
        // so its payload is the one kept (G4); the ticket is held until this one is settled.
        ticket
            .turn(event.as_ref().ok().map(|e| (&e.key, e.fingerprint)))
            .await;
        let decision = match event {
            Err(reason) => Settle::Quarantine(reason),
            Ok(event) => match self.owed.take(&event.key, event.fingerprint) {
                Some(reason) => Settle::Quarantine(reason),
                None => self.process(event, &delivery, &stopping).await,
            },
        };
        if let (Some(key), Some(offered)) = (&key, offered) {
            self.owed
                .owe(key, offered, &decision, self.options.retry.delay);
        }
        if matches!(decision, Settle::Ack(_)) {
            // The effect is committed; a crash from here on is redelivered and answered as a
            // duplicate.
            crate::crash::point!("amqp-before-ack");
        }
        let in_hand = InHand {
            delivery: &delivery,
            publisher: &publisher,
            options: &self.options,
            stopping,
        };
        let (settle, acked) = settle(&in_hand, decision, &self.options.retry).await;
        if let (Some(key), Some(offered)) = (&key, offered) {
            self.owed.settled(key, offered, &settle);
        }
        // Settled for good: its failures are no longer counted. A quarantine the broker did not
        // take (unroutable, refused, unconfirmed) was requeued instead, and its next failure
        // is one more, not a first: forgotten then, each try of the quarantine would cost
        // `max_attempts` more runs of the handler.
        if let Some(key) = key.filter(|_| !matches!(settle, Settle::Requeue { .. })) {
            self.forget(&key);
        }
        self.counts.send_modify(|c| c.add(&settle, acked));
    }

    fn event(&self, delivery: &Delivery) -> Result<Event, Reason> {
        let content_type = delivery.properties.content_type().as_ref();
        self.options.rules.event(
            &Props(&delivery.properties),
            delivery.data.clone(),
            content_type.map(|c| c.as_str()),
        )
    }

    /// Applies the event until the store answers something other than `Unavailable`, or the
    /// consumer stops. While the store is out the delivery stays in hand and the store is
    /// tried again after growing waits: nacking it back each time would count towards a
    /// quorum queue's delivery limit (20 by default since RabbitMQ 4.0), past which the broker
    /// drops or dead-letters a message that was never acknowledged. On shutdown it is
    /// requeued (the caller's wait is cut short then).
    async fn process(
        &self,
        mut event: Event,
        delivery: &Delivery,
        stopping: &watch::Receiver<bool>,
    ) -> Settle {
        let retry = &self.options.retry;
        let backoff = Backoff {
            base: retry.delay,
            cap: OUTAGE_BACKOFF_CAP.max(retry.delay),
        };
        let mut outages = 0;
        loop {
            let key = event.key.clone();
            let outcome = self.apply_caught(event).await;
            let attempt = self.attempt(&key, delivery, &outcome);
            if let Some(line) = oncebox_core::consume::worth_a_warning(&outcome, attempt) {
                tracing::warn!(queue = %self.options.queue, key = %key, "{line}");
            }
            let decision = decide(outcome, attempt, retry);
            match decision {
                Settle::Requeue {
                    why: Requeue::Unavailable,
                    ..
                } => {}
                Settle::Requeue { .. } | Settle::Ack(_) | Settle::Quarantine(_) => return decision,
            }
            // Full jitter: many deliveries held through one outage must not all try the store
            // again at the same instant.
            let wait = backoff.delay(outages, rand::random::<f64>());
            outages = outages.saturating_add(1);
            let mut stopped = stopping.clone();
            if *stopped.borrow()
                || tokio::time::timeout(wait, stopped.wait_for(|s| *s))
                    .await
                    .is_ok()
            {
                return decision;
            }
            tracing::debug!(queue = %self.options.queue, "store unavailable; trying again");
            // Built again from the delivery rather than cloned before every first try: only
            // an outage pays for it. The same bytes give the same event.
            event = match self.event(delivery) {
                Ok(event) => event,
                Err(reason) => return Settle::Quarantine(reason),
            };
        }
    }

    /// The store's answer, with a panic in `Apply` turned into a handler failure: a panicking
    /// task would drop the delivery unsettled, holding its prefetch slot until the channel
    /// closes. Whatever the panic interrupted, nothing was reported committed, and a redelivery
    /// is answered by the store.
    async fn apply_caught(&self, event: Event) -> Result<Processed, ProcessError> {
        match AssertUnwindSafe(self.apply.apply(event, None))
            .catch_unwind()
            .await
        {
            Ok(outcome) => outcome,
            Err(panic) => {
                let what = panic_message(&*panic);
                tracing::error!(queue = %self.options.queue, panic = %what, "handler panicked");
                Err(ProcessError::Handler(
                    format!("the handler panicked: {what}").into(),
                ))
            }
        }
    }

    /// This delivery's number among the key's handler failures, counted by this consumer,
    /// which remembers every key it handed back until the key is settled. The broker's count
    /// (quorum queues) is only a fallback for a key this consumer never saw (it restarted):
    /// that count also includes requeues for other reasons (another worker's lease, an
    /// uncertain key, a shutdown), which are no handler failures.
    fn attempt(
        &self,
        key: &Key,
        delivery: &Delivery,
        outcome: &Result<Processed, ProcessError>,
    ) -> u32 {
        if outcome.is_ok() {
            return 1;
        }
        let mut failures = self.failures.lock().unwrap_or_else(PoisonError::into_inner);
        let failed = matches!(outcome, Err(ProcessError::Handler(_)));
        count(&mut failures, key, failed, || {
            // A first delivery had none before it, whatever its headers say: a producer can
            // set `x-delivery-count` itself, and a classic queue passes it on untouched.
            delivery
                .redelivered
                .then(|| delivery_count(&delivery.properties))
                .flatten()
        })
    }

    /// The key was settled for good: its failures are no longer counted.
    fn forget(&self, key: &Key) {
        let mut failures = self.failures.lock().unwrap_or_else(PoisonError::into_inner);
        if !failures.is_empty() {
            failures.remove(key);
        }
    }
}

/// One delivery being settled, with what settling it needs.
struct InHand<'a> {
    delivery: &'a Delivery,
    publisher: &'a Publisher,
    options: &'a ConsumerOptions,
    stopping: watch::Receiver<bool>,
}

impl Broker for InHand<'_> {
    type QuarantineError = QuarantineError;

    /// Bounded by `confirm_timeout`: a broker under a resource alarm stops reading the
    /// connection (which the quarantine publishes on too), and a stop must not wait for it.
    async fn ack(&self) -> bool {
        let deadline = self.options.confirm_timeout;
        let ack = self.delivery.acker.ack(BasicAckOptions::default());
        match tokio::time::timeout(deadline, ack).await {
            Ok(Ok(true)) => true,
            Ok(Ok(false) | Err(_)) => {
                // The channel is gone: the broker requeued the message and its redelivery will
                // be answered as a duplicate.
                tracing::warn!("ack not sent; the message will come back as a duplicate");
                false
            }
            Err(_) => {
                // The ack may still reach the broker; if it does not, the channel's close
                // requeues the message, and its redelivery is answered as a duplicate.
                tracing::warn!(
                    ?deadline,
                    "ack not sent in time; the message may come back as a duplicate"
                );
                false
            }
        }
    }

    async fn quarantine(&self, reason: &Reason) -> Result<(), QuarantineError> {
        let o = self.options;
        // Came back through the quarantine exchange itself: a copy an operator republished
        // elsewhere (as the README invites, once its cause is fixed) is quarantined again,
        // not requeued for ever.
        // The default exchange (`""`) routes by queue name alone, and a quarantine there never
        // names the consumed queue (`ConsumerOptions::check`): nothing comes back through it.
        // Compared all the same, a copy an operator sent back by the default exchange, the
        // usual way to publish to a queue, was taken for one routed back and requeued for ever.
        let routed_back = !o.quarantine.exchange.is_empty()
            && self.delivery.exchange.as_str() == o.quarantine.exchange;
        if routed_back && quarantined_here_for(&self.delivery.properties, &o.queue, reason.slug()) {
            let e = QuarantineError::RoutesBack;
            tracing::error!(queue = %o.queue, quarantine = %o.quarantine.exchange, error = %e, "not quarantined again; message requeued");
            return Err(e);
        }
        self.publisher
            .quarantine(
                &o.quarantine,
                &o.queue,
                &o.rules.source,
                self.delivery,
                reason,
                &self.stopping,
            )
            .await
            .inspect(|()| tracing::warn!(queue = %o.queue, reason = reason.slug(), detail = %reason.detail(), "message quarantined"))
            .inspect_err(|e| tracing::error!(queue = %o.queue, error = %e, "quarantine failed; message requeued"))
    }

    /// Holds the message for `after` (it keeps its prefetch slot, so a failing handler or a
    /// held lease slows the consumer down instead of spinning), then returns it to the queue.
    /// Shutdown cuts the wait short. The nack is bounded by `confirm_timeout`, as the ack is.
    async fn requeue(&self, why: Requeue, after: Duration) {
        tracing::debug!(queue = %self.options.queue, ?why, "message requeued");
        let mut stopping = self.stopping.clone();
        let _ = tokio::time::timeout(held_for(after), stopping.wait_for(|s| *s)).await;
        let options = BasicNackOptions {
            requeue: true,
            multiple: false,
        };
        let deadline = self.options.confirm_timeout;
        match tokio::time::timeout(deadline, self.delivery.acker.nack(options)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "nack not sent; the closing channel requeues the message");
            }
            Err(_) => {
                tracing::debug!(
                    ?deadline,
                    "nack not sent in time; the closing channel requeues the message"
                );
            }
        }
    }
}

/// Counts one more outcome of `key` in `failures` and answers its attempt number: a handler
/// failure adds one (the first one the broker's own count, `broker`, when it keeps one); any
/// other requeue leaves the count as it is, starting it at zero.
fn count(
    failures: &mut HashMap<Key, u32>,
    key: &Key,
    failed: bool,
    broker: impl FnOnce() -> Option<u32>,
) -> u32 {
    if !failures.contains_key(key) && failures.len() >= MAX_REMEMBERED_FAILURES {
        // Keys that were only requeued (in progress, uncertain, the store out) and then
        // settled by another consumer are never forgotten here: they go first, so that a
        // churn of them does not reset the counts of keys whose handler keeps failing.
        failures.retain(|_, n| *n > 0);
        // Little freed, it would be pruned again soon, a full pass each time: cleared.
        if failures.len() >= MAX_REMEMBERED_FAILURES / 10 * 9 {
            failures.clear();
        }
    }
    let n = match failures.get(key) {
        Some(n) if failed => n.saturating_add(1),
        Some(_) => return 1,
        None if failed => broker().unwrap_or(1),
        None => 0,
    };
    failures.insert(key.clone(), n);
    n.max(1)
}

/// The longest a delivery is held before it is returned to the queue, well inside RabbitMQ's
/// default `consumer_timeout` (30 minutes), past which the broker closes the channel and every
/// message in hand comes again.
pub const MAX_HOLD: Duration = Duration::from_secs(300);

/// How long a delivery to be requeued after `after` is held. The wait asked for may be longer
/// than any configured delay: an in-progress key's is what is left of another holder's lease,
/// and a library's `RetryPolicy` may ask for any uncertain delay.
fn held_for(after: Duration) -> Duration {
    after.min(MAX_HOLD)
}

/// Tests only (`crash-points`; nothing without it): a delivery's task failing outside the
/// handler's own catch, armed with `return(<queue>)` for one consumer's queue, so that other
/// consumers in the same test process go on.
fn failpoint(queue: &str) {
    // Read by the failpoint only, which is nothing without the feature.
    let _ = queue;
    fail::fail_point!("amqp-delivery-task", |armed: Option<String>| {
        assert!(
            armed.as_deref() != Some(queue),
            "failpoint amqp-delivery-task on queue {queue}"
        );
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str) -> Key {
        Key::parse("shop", id).unwrap()
    }

    /// A memory full of keys that were only requeued drops them, not the failing key's count.
    #[test]
    fn a_churn_of_requeued_keys_keeps_a_failing_keys_count() {
        let mut failures = HashMap::new();
        assert_eq!(count(&mut failures, &key("boom"), true, || None), 1);
        assert_eq!(count(&mut failures, &key("boom"), true, || None), 2);
        for i in 0..MAX_REMEMBERED_FAILURES {
            count(&mut failures, &key(&format!("busy-{i}")), false, || None);
        }
        assert!(
            failures.len() < MAX_REMEMBERED_FAILURES,
            "the churn was pruned"
        );
        assert_eq!(count(&mut failures, &key("boom"), true, || None), 3);
        // A requeue that is no failure leaves a count alone and answers attempt 1.
        assert_eq!(count(&mut failures, &key("boom"), false, || None), 1);
        assert_eq!(failures[&key("boom")], 3);
        // A first failure takes the broker's count.
        assert_eq!(count(&mut failures, &key("new"), true, || Some(4)), 4);
    }

    #[test]
    fn no_requeue_holds_a_delivery_past_the_cap() {
        assert_eq!(held_for(Duration::from_secs(45 * 60)), MAX_HOLD);
        assert_eq!(held_for(Duration::from_secs(5)), Duration::from_secs(5));
    }
}
