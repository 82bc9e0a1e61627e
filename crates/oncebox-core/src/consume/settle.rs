//! Settling a message: the one order in which every consumer tells its broker what became of
//! it, whatever the broker. Ack only what the store answered (applied, duplicate, stale); ack a
//! poison message only once its quarantined copy is stored; requeue everything else.

use std::future::Future;
use std::time::Duration;

use super::{Reason, Requeue, RetryPolicy, Settle};

/// The broker's side of the message in hand: what a consumer can tell it. Each broker crate
/// implements it over its own delivery handle; [`settle`] decides which calls are made.
pub trait Broker {
    /// Why a quarantined copy may not be stored.
    type QuarantineError;

    /// Acknowledges the message. False when the ack could not be sent: the broker delivers the
    /// message again, and the inbox answers the redelivery as a duplicate.
    fn ack(&self) -> impl Future<Output = bool> + Send;

    /// Publishes a copy of the message with `reason` to the quarantine and waits until the
    /// broker confirmed that it stored the copy. Any error (the implementation reports it) means
    /// the copy may be lost.
    fn quarantine(
        &self,
        reason: &Reason,
    ) -> impl Future<Output = Result<(), Self::QuarantineError>> + Send;

    /// Leaves the message unacknowledged, to be delivered again after `after`.
    fn requeue(&self, why: Requeue, after: Duration) -> impl Future<Output = ()> + Send;
}

/// Tells the broker what `decision` says; returns what was actually done and whether an
/// acknowledgement went out (for [`Counts::add`](super::Counts::add)).
///
/// A quarantine whose copy was not confirmed is requeued as `Unavailable` after `retry.delay`,
/// never acknowledged: acking it would lose the message.
pub async fn settle<B: Broker + Sync>(
    broker: &B,
    decision: Settle,
    retry: &RetryPolicy,
) -> (Settle, bool) {
    match decision {
        Settle::Ack(_) => {
            let acked = broker.ack().await;
            (decision, acked)
        }
        Settle::Quarantine(ref reason) => match broker.quarantine(reason).await {
            Ok(()) => {
                let acked = broker.ack().await;
                (decision, acked)
            }
            Err(_) => {
                let (why, after) = (Requeue::Unavailable, retry.delay);
                broker.requeue(why, after).await;
                (Settle::Requeue { why, after }, false)
            }
        },
        Settle::Requeue { why, after } => {
            broker.requeue(why, after).await;
            (decision, false)
        }
    }
}
