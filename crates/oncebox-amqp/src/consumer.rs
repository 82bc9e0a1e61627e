//! The consumer loop: deliveries run concurrently up to the prefetch, each through the inbox,
//! and each is settled only after the store answered — ack after the commit, quarantine then
//! ack, or requeue after a delay.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions,
    ConfirmSelectOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Connection};
use oncebox_core::consume::{
    Apply, Broker, Counts, MessageRules, Reason, Requeue, RetryPolicy, Settle, decide, settle,
};
use oncebox_core::{Key, ProcessError};
use tokio::sync::watch;

use crate::message::{Props, Quarantine, QuarantineError, delivery_count, quarantine};

/// Handler failures remembered per key when the queue keeps no delivery count; past this many
/// keys the memory is cleared (a failing handler then gets a few more attempts, nothing worse).
const MAX_REMEMBERED_FAILURES: usize = 10_000;

/// What one consumer reads and how it settles messages.
#[derive(Debug, Clone)]
pub struct ConsumerOptions {
    pub queue: String,
    /// Unacknowledged deliveries the broker sends ahead; also how many run at once.
    pub prefetch: u16,
    pub rules: MessageRules,
    pub quarantine: Quarantine,
    pub retry: RetryPolicy,
}

impl ConsumerOptions {
    /// Prefetch 64; quarantined messages go to `quarantine_exchange` with the queue's name as
    /// routing key.
    pub fn new(queue: &str, rules: MessageRules, quarantine_exchange: &str) -> ConsumerOptions {
        ConsumerOptions {
            queue: queue.to_owned(),
            prefetch: 64,
            rules,
            quarantine: Quarantine {
                exchange: quarantine_exchange.to_owned(),
                routing_key: queue.to_owned(),
            },
            retry: RetryPolicy::default(),
        }
    }
}

/// Why `run` stopped before its shutdown signal.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumeError {
    /// The connection or channel failed. Unacknowledged messages go back to the queue; run
    /// again on a new connection.
    #[error("broker: {0}")]
    Broker(#[from] lapin::Error),
    /// The broker cancelled the consumer (the queue was deleted).
    #[error("the broker cancelled the consumer")]
    Cancelled,
    /// The channel or connection closed under the consumer.
    #[error("the channel closed")]
    Closed,
}

/// A RabbitMQ consumer that applies each message through `A`.
pub struct Consumer<A> {
    shared: Arc<Shared<A>>,
}

/// What every delivery's task needs.
struct Shared<A> {
    apply: A,
    options: ConsumerOptions,
    counts: watch::Sender<Counts>,
    failures: Mutex<HashMap<Key, u32>>,
}

impl<A> std::fmt::Debug for Consumer<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("options", &self.shared.options)
            .field("counts", &*self.shared.counts.borrow())
            .finish_non_exhaustive()
    }
}

impl<A: Apply> Consumer<A> {
    pub fn new(apply: A, options: ConsumerOptions) -> Consumer<A> {
        Consumer {
            shared: Arc::new(Shared {
                apply,
                options,
                counts: watch::Sender::new(Counts::default()),
                failures: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// What this consumer settled so far; `wait_for` on it waits for a condition.
    pub fn counts(&self) -> watch::Receiver<Counts> {
        self.shared.counts.subscribe()
    }

    /// Consumes until `shutdown` completes or the connection fails. On shutdown it stops taking
    /// deliveries, finishes and settles those in hand (a pending requeue delay is cut short),
    /// and closes its channels, which returns anything unacknowledged to the queue.
    pub async fn run(
        &self,
        connection: &Connection,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), ConsumeError> {
        let o = &self.shared.options;
        let channel = connection.create_channel().await?;
        channel
            .basic_qos(o.prefetch.max(1), BasicQosOptions::default())
            .await?;
        // Quarantine publishes wait for confirms on a channel of their own, so the consuming
        // channel's acks never queue behind them.
        let publish = connection.create_channel().await?;
        publish
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        let mut deliveries = channel
            .basic_consume(
                o.queue.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let tag = deliveries.tag();
        let (stop, stopping) = watch::channel(false);
        // Each delivery is its own task, so decoding, fingerprinting and the store's calls
        // spread over the runtime's threads; the set is always drained before returning.
        let mut in_hand = tokio::task::JoinSet::new();
        let mut shutdown = std::pin::pin!(shutdown);
        let ended = loop {
            tokio::select! {
                () = &mut shutdown => break Ok(()),
                Some(_) = in_hand.join_next(), if !in_hand.is_empty() => {}
                next = deliveries.next() => match next {
                    Some(Ok(delivery)) => {
                        let shared = self.shared.clone();
                        in_hand.spawn(shared.handle(delivery, publish.clone(), stopping.clone()));
                    }
                    Some(Err(e)) => break Err(ConsumeError::Broker(e)),
                    None if channel.status().connected() => break Err(ConsumeError::Cancelled),
                    None => break Err(ConsumeError::Closed),
                },
            }
        };
        // The order matters: no new deliveries, then settle those in hand, then close (which
        // requeues what was prefetched but not started).
        if ended.is_ok() {
            let _ = channel
                .basic_cancel(tag, BasicCancelOptions::default())
                .await;
        }
        let _ = stop.send(true);
        while in_hand.join_next().await.is_some() {}
        let _ = publish.close(200, "shutdown".into()).await;
        let _ = channel.close(200, "shutdown".into()).await;
        ended
    }
}

impl<A: Apply> Shared<A> {
    async fn handle(
        self: Arc<Self>,
        delivery: Delivery,
        publish: Channel,
        stopping: watch::Receiver<bool>,
    ) {
        let props = Props(&delivery.properties);
        let content_type = delivery.properties.content_type().as_ref();
        let decision = match self.options.rules.event(
            &props,
            delivery.data.clone(),
            content_type.map(|c| c.as_str()),
        ) {
            Err(reason) => Settle::Quarantine(reason),
            Ok(event) => {
                let key = event.key.clone();
                let outcome = self.apply.apply(event, None).await;
                let attempt = self.attempt(&key, &delivery, &outcome);
                decide(outcome, attempt, &self.options.retry)
            }
        };
        if matches!(decision, Settle::Ack(_)) {
            // The effect is committed; a crash from here on is redelivered and answered as a
            // duplicate.
            crate::crash::point!("amqp-before-ack");
        }
        let in_hand = InHand {
            delivery: &delivery,
            publish: &publish,
            options: &self.options,
            stopping,
        };
        let (settle, acked) = settle(&in_hand, decision, &self.options.retry).await;
        self.counts.send_modify(|c| c.add(&settle, acked));
    }

    /// This delivery's number for a failing handler: the queue's count where it keeps one,
    /// else this consumer's memory of the key's failures.
    fn attempt(
        &self,
        key: &Key,
        delivery: &Delivery,
        outcome: &Result<oncebox_core::Processed, ProcessError>,
    ) -> u32 {
        let Ok(mut failures) = self.failures.lock() else {
            return 1;
        };
        if !matches!(outcome, Err(ProcessError::Handler(_))) {
            failures.remove(key);
            return 1;
        }
        if failures.len() >= MAX_REMEMBERED_FAILURES {
            failures.clear();
        }
        let n = failures.entry(key.clone()).or_insert(0);
        *n += 1;
        delivery_count(&delivery.properties).map_or(*n, |count| count.max(*n))
    }
}

/// One delivery being settled, with what settling it needs.
struct InHand<'a> {
    delivery: &'a Delivery,
    /// The confirm-mode channel quarantined copies are published on.
    publish: &'a Channel,
    options: &'a ConsumerOptions,
    stopping: watch::Receiver<bool>,
}

impl Broker for InHand<'_> {
    type QuarantineError = QuarantineError;

    async fn ack(&self) -> bool {
        match self.delivery.acker.ack(BasicAckOptions::default()).await {
            Ok(true) => true,
            Ok(false) | Err(_) => {
                // The channel is gone: the broker requeued the message and its redelivery will
                // be answered as a duplicate.
                tracing::warn!("ack not sent; the message will come back as a duplicate");
                false
            }
        }
    }

    async fn quarantine(&self, reason: &Reason) -> Result<(), QuarantineError> {
        let o = self.options;
        let (to, source) = (&o.quarantine, &o.rules.source);
        quarantine(self.publish, to, &o.queue, source, self.delivery, reason)
            .await
            .inspect(|()| tracing::warn!(queue = %o.queue, reason = reason.slug(), detail = %reason.detail(), "message quarantined"))
            .inspect_err(|e| tracing::error!(queue = %o.queue, error = %e, "quarantine failed; message requeued"))
    }

    /// Holds the message for `after` (it keeps its prefetch slot, so an outage slows the
    /// consumer down instead of spinning), then returns it to the queue. Shutdown cuts the wait
    /// short.
    async fn requeue(&self, why: Requeue, after: Duration) {
        tracing::debug!(queue = %self.options.queue, ?why, "message requeued");
        let mut stopping = self.stopping.clone();
        let _ = tokio::time::timeout(after, stopping.wait_for(|s| *s)).await;
        let options = BasicNackOptions {
            requeue: true,
            multiple: false,
        };
        if let Err(e) = self.delivery.acker.nack(options).await {
            tracing::debug!(error = %e, "nack not sent; the closing channel requeues the message");
        }
    }
}
