//! One JetStream message in hand, as the settle order sees it: ack, quarantine (a copy
//! published and confirmed), or a NAK with a delay; and in-progress acks while it is worked on.

use std::future::Future;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use futures::future::{Fuse, FusedFuture, FutureExt};
use oncebox_core::consume::{Broker, Counts, Reason, Requeue};
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};

use crate::consumer::ConsumerOptions;
use crate::message::{QuarantineError, quarantine};

/// One message being settled, with what settling it needs.
pub(crate) struct InHand<'a> {
    pub(crate) js: &'a jetstream::Context,
    pub(crate) message: &'a jetstream::Message,
    pub(crate) options: &'a ConsumerOptions,
}

impl Broker for InHand<'_> {
    type QuarantineError = QuarantineError;

    async fn ack(&self) -> bool {
        match self.message.ack().await {
            Ok(()) => true,
            Err(e) => {
                // Not acknowledged: the server delivers it again after the ack wait, and the
                // redelivery is answered as a duplicate.
                tracing::warn!(error = %e, "ack not sent; the message will come back as a duplicate");
                false
            }
        }
    }

    async fn quarantine(&self, reason: &Reason) -> Result<(), QuarantineError> {
        let o = self.options;
        let (to, source) = (&o.quarantine_subject, &o.rules.source);
        quarantine(self.js, to, &o.stream, source, self.message, reason)
            .await
            .inspect(|()| tracing::warn!(stream = %o.stream, reason = reason.slug(), detail = %reason.detail(), "message quarantined"))
            .inspect_err(|e| tracing::error!(stream = %o.stream, error = %e, "quarantine failed; message requeued"))
    }

    /// Returns the message to the server, to be delivered again after `after` (a NAK with a
    /// delay, which server 2.9 honours; the message stays pending meanwhile, so with
    /// `max_ack_pending = 1` nothing overtakes it).
    async fn requeue(&self, why: Requeue, after: Duration) {
        tracing::debug!(stream = %self.options.stream, ?why, "message requeued");
        if let Err(e) = self.message.ack_with(AckKind::Nak(Some(after))).await {
            tracing::debug!(error = %e, "nak not sent; the message comes back after the ack wait");
        }
    }
}

/// Runs `work`, telling the server every `every` that `message` is still in progress (which
/// starts its ack wait again), so it is not delivered again while `work` runs. `None`: says
/// nothing. A progress ack that is not sent is only logged: the message may then come back as
/// a copy, which the inbox answers.
pub(crate) async fn kept_alive<T>(
    message: &jetstream::Message,
    every: Option<Duration>,
    counts: &watch::Sender<Counts>,
    work: impl Future<Output = T>,
) -> T {
    let Some(every) = every else {
        return work.await;
    };
    let mut work = std::pin::pin!(work);
    // The ack is a branch of its own, not awaited in the tick's: sending waits for room in the
    // client's queue, which fills while it reconnects, and the work (a transaction open, row
    // locks held) must go on meanwhile. One at a time: a tick while one is on its way is let
    // pass.
    let progress = || message.ack_with(AckKind::Progress).fuse();
    let mut acking = std::pin::pin!(Fuse::terminated());
    let mut tick = tokio::time::interval_at(Instant::now() + every, every);
    // After a stall, one ack, not a burst to catch up.
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            done = &mut work => return done,
            acked = &mut acking, if !acking.is_terminated() => match acked {
                Ok(()) => counts.send_modify(|c| c.in_progress += 1),
                Err(e) => tracing::debug!(error = %e, "in-progress ack not sent; the message may be delivered again meanwhile"),
            },
            _ = tick.tick(), if acking.is_terminated() => acking.set(progress()),
        }
    }
}
