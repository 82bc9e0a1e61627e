//! The consumer loop: deliveries run concurrently up to the prefetch, each through the inbox
//! (handle.rs), and each is settled only after the store answered — ack after the commit,
//! quarantine then ack, or requeue after a delay.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use lapin::options::{
    BasicCancelOptions, BasicConsumeOptions, BasicQosOptions, ExchangeDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{Connection, ExchangeKind};
use oncebox_core::consume::{Apply, Counts, MessageRules, RetryPolicy, RetryPolicyError};
use tokio::sync::watch;

use crate::error::ConsumeError;
use crate::handle::Shared;
use crate::message::Quarantine;
use crate::publish::Publisher;

/// What one consumer reads and how it settles messages.
#[derive(Debug, Clone)]
pub struct ConsumerOptions {
    pub queue: String,
    /// Unacknowledged deliveries the broker sends ahead; also how many run at once.
    pub prefetch: u16,
    pub rules: MessageRules,
    pub quarantine: Quarantine,
    pub retry: RetryPolicy,
    /// How long a quarantine may wait for the broker's confirm (a broker under a resource
    /// alarm never sends it); past it the message is requeued. Also bounds every other broker
    /// call the consumer makes: opening its channels at start (past it `run` fails with
    /// [`ConsumeError::Timeout`]), each ack and nack, and each call on shutdown, so neither a
    /// delivery's task nor a stop request is held by a broker that stopped answering.
    pub confirm_timeout: Duration,
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
            confirm_timeout: Duration::from_secs(10),
        }
    }

    /// Refuses what could never work: a name longer than AMQP carries, a retry policy without
    /// a pause (see [`RetryPolicy::check`]), or a quarantine on the default exchange (`""`)
    /// with the queue's own name as routing key, which would put every quarantined copy
    /// straight back into the queue, to be quarantined again, forever.
    pub fn check(&self) -> Result<(), OptionsError> {
        self.retry.check()?;
        let q = &self.quarantine;
        // Each goes to the broker as an AMQP short string, which lapin refuses by panicking.
        for (field, name) in [
            ("queue", &self.queue),
            ("quarantine exchange", &q.exchange),
            ("quarantine routing key", &q.routing_key),
        ] {
            if name.len() > SHORT_STRING_MAX {
                return Err(OptionsError::TooLong(field));
            }
        }
        if q.exchange.is_empty() && q.routing_key == self.queue {
            return Err(OptionsError::QuarantineIsTheQueue(self.queue.clone()));
        }
        Ok(())
    }
}

/// Options [`ConsumerOptions::check`] refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OptionsError {
    #[error(
        "quarantine exchange \"\" (the default exchange) with routing key \"{0}\" routes quarantined messages back to queue \"{0}\"; name an exchange"
    )]
    QuarantineIsTheQueue(String),
    /// A name AMQP cannot carry: longer than 255 bytes.
    #[error("the {0} is longer than 255 bytes, the most AMQP can name")]
    TooLong(&'static str),
    #[error(transparent)]
    Retry(#[from] RetryPolicyError),
}

/// The longest AMQP short string (the core's, re-exported for this crate's users).
pub use oncebox_core::SHORT_STRING_MAX;

/// `call` within `after`, its silence an error.
async fn bounded<T, E>(
    call: &'static str,
    after: Duration,
    f: impl Future<Output = Result<T, E>>,
) -> Result<T, ConsumeError>
where
    ConsumeError: From<E>,
{
    match tokio::time::timeout(after, f).await {
        Ok(answer) => Ok(answer?),
        Err(_) => Err(ConsumeError::Timeout { call, after }),
    }
}

/// A RabbitMQ consumer that applies each message through `A`.
pub struct Consumer<A> {
    shared: Arc<Shared<A>>,
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
            shared: Arc::new(Shared::new(apply, options)),
        }
    }

    /// What this consumer settled so far; `wait_for` on it waits for a condition.
    pub fn counts(&self) -> watch::Receiver<Counts> {
        self.shared.counts.subscribe()
    }

    /// Consumes until `shutdown` completes or the connection fails; refuses options that
    /// [`ConsumerOptions::check`] refuses. On shutdown it stops taking deliveries, finishes and
    /// settles those in hand (a pending requeue delay is cut short, and a message held through
    /// a store outage is requeued), and closes its channels, which returns anything
    /// unacknowledged to the queue. Every broker call it makes, from opening its channels to
    /// closing them, each ack and nack included, waits no longer than `confirm_timeout`.
    ///
    /// The quarantine's copies are published on `connection` too: under a memory or disk
    /// alarm the broker blocks a connection that publishes and reads nothing more from it,
    /// its acks included, so one poison message holds every message in hand until the alarm
    /// ends. [`Consumer::run_apart`] publishes them on a connection of their own.
    pub async fn run(
        &self,
        connection: &Connection,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), ConsumeError> {
        self.run_apart(connection, connection, shutdown).await
    }

    /// [`Consumer::run`], with the quarantine's copies published on `publishing`, so that a
    /// broker alarm, which blocks a publishing connection, blocks only the quarantine (its
    /// message requeued after `confirm_timeout`) while `consuming` goes on reading and
    /// acknowledging the others. `oncebox consume` runs this way.
    pub async fn run_apart(
        &self,
        consuming: &Connection,
        publishing: &Connection,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), ConsumeError> {
        let connection = consuming;
        let o = &self.shared.options;
        o.check()?;
        // A broker under a resource alarm may not read the connection at all: each call at
        // start is bounded, so `run` fails instead of hanging.
        let deadline = o.confirm_timeout;
        let channel = bounded("channel.open", deadline, connection.create_channel()).await?;
        let qos = channel.basic_qos(o.prefetch.max(1), BasicQosOptions::default());
        bounded("basic.qos", deadline, qos).await?;
        quarantine_exists(publishing, &o.quarantine.exchange, deadline).await?;
        // Quarantine publishes wait for confirms on a channel of their own, so the consuming
        // channel's acks never queue behind them.
        let open = Publisher::open(publishing, deadline);
        let (publisher, mut reopens) =
            bounded("channel.open for the quarantine", deadline, open).await?;
        let consume = channel.basic_consume(
            o.queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        );
        let mut deliveries = bounded("basic.consume", deadline, consume).await?;
        let tag = deliveries.tag();
        let (stop, stopping) = watch::channel(false);
        // Each delivery is its own task, so decoding, fingerprinting and the store's calls
        // spread over the runtime's threads; the set is always drained before returning.
        let mut in_hand = tokio::task::JoinSet::new();
        let mut shutdown = std::pin::pin!(shutdown);
        let ended = loop {
            tokio::select! {
                () = &mut shutdown => break Ok(()),
                Some(joined) = in_hand.join_next(), if !in_hand.is_empty() => {
                    if let Err(e) = finished(joined) {
                        break Err(e);
                    }
                }
                Some(reply) = reopens.next() => {
                    publisher.serve(publishing, reply).await;
                    // A channel cannot be opened on a closed connection: the quarantine's
                    // message is requeued, and the caller connects both again.
                    if !publishing.status().connected() {
                        // One connection for both (`run`): the reading side's end, as ever.
                        let shared = std::ptr::eq(consuming, publishing);
                        break Err(if shared { ConsumeError::Closed } else { ConsumeError::QuarantineClosed });
                    }
                }
                next = deliveries.next() => match next {
                    Some(Ok(delivery)) => {
                        // Taken here, in arrival order.
                        let ticket = self.shared.arrivals.ticket();
                        let task = self.shared.clone().handle(delivery, publisher.clone(), stopping.clone(), ticket);
                        in_hand.spawn(task);
                    }
                    Some(Err(e)) => break Err(ConsumeError::Broker(e)),
                    None if channel.status().connected() => break Err(ConsumeError::Cancelled),
                    None => break Err(ConsumeError::Closed),
                },
            }
        };
        // The order matters: no new deliveries, then settle those in hand, then close (which
        // requeues what was prefetched but not started). Each broker call is bounded: a broker
        // under a resource alarm stops reading the connection, and a stop must not wait for it.
        if ended.is_ok() {
            let cancel = channel.basic_cancel(tag, BasicCancelOptions::default());
            let _ = tokio::time::timeout(deadline, cancel).await;
        }
        let _ = stop.send(true);
        // Tasks settling a poison message may still ask for a new quarantine channel.
        loop {
            tokio::select! {
                joined = in_hand.join_next() => match joined {
                    Some(joined) => {
                        let _ = finished(joined);
                    }
                    None => break,
                },
                Some(reply) = reopens.next() => publisher.serve(publishing, reply).await,
            }
        }
        publisher.close().await;
        let _ = tokio::time::timeout(deadline, channel.close(200, "shutdown".into())).await;
        ended
    }
}

/// Refuses a quarantine exchange that does not exist: every quarantine would fail and its
/// message be requeued without end, as NATS refuses a subject no stream stores. Whether a queue
/// is bound to it for the routing key the broker does not say without publishing: an
/// unroutable quarantine is still met at the first poison message (requeued, logged). A passive
/// declare asks, on a channel of its own since the broker closes the channel to say no. The
/// default exchange always exists. One deleted while the consumer runs is met as before: the
/// quarantine fails and the message is requeued until it is back.
async fn quarantine_exists(
    connection: &Connection,
    exchange: &str,
    deadline: Duration,
) -> Result<(), ConsumeError> {
    if exchange.is_empty() {
        return Ok(());
    }
    let call = "exchange.declare (passive) of the quarantine";
    let probe = bounded(call, deadline, connection.create_channel()).await?;
    let passive = ExchangeDeclareOptions {
        passive: true,
        ..ExchangeDeclareOptions::default()
    };
    let declare = probe.exchange_declare(
        exchange.into(),
        ExchangeKind::Direct,
        passive,
        FieldTable::default(),
    );
    match bounded(call, deadline, declare).await {
        Ok(()) => {
            let _ = tokio::time::timeout(deadline, probe.close(200, "checked".into())).await;
            Ok(())
        }
        Err(ConsumeError::Broker(e)) if matches!(e.kind(), lapin::ErrorKind::ProtocolError(a) if a.get_id() == 404) => {
            Err(ConsumeError::QuarantineMissing(exchange.to_owned()))
        }
        Err(e) => Err(e),
    }
}

/// A delivery's task ended. Handlers' panics are caught inside it, so a failed join is a bug
/// here: logged, and the run ends ([`ConsumeError::TaskFailed`]), so that the channel closes
/// and the unsettled message returns to the queue.
fn finished(joined: Result<(), tokio::task::JoinError>) -> Result<(), ConsumeError> {
    joined.map_err(|e| {
        tracing::error!(error = %e, "a delivery's task failed; its message is requeued as the channel closes");
        ConsumeError::TaskFailed(e.to_string())
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use oncebox_core::consume::{KeyRule, MIN_RETRY_DELAY, MessageRules, RetryPolicyError};

    use super::{ConsumerOptions, OptionsError};

    #[test]
    fn names_amqp_cannot_carry_are_refused_before_lapin_sees_them() {
        let rules = MessageRules::new(oncebox_core::Source::new("s").unwrap(), KeyRule::MessageId);
        let long = "q".repeat(256);
        let fits = &long[1..];
        assert_eq!(
            ConsumerOptions::new(fits, rules.clone(), fits).check(),
            Ok(())
        );
        let refused = |o: ConsumerOptions| o.check().unwrap_err();
        assert_eq!(
            refused(ConsumerOptions::new(&long, rules.clone(), "x")),
            OptionsError::TooLong("queue")
        );
        assert_eq!(
            refused(ConsumerOptions::new("q", rules.clone(), &long)),
            OptionsError::TooLong("quarantine exchange")
        );
        let mut o = ConsumerOptions::new("q", rules, "x");
        o.quarantine.routing_key = long;
        assert_eq!(refused(o), OptionsError::TooLong("quarantine routing key"));
    }

    #[test]
    fn a_retry_delay_under_the_floor_is_refused() {
        let rules = MessageRules::new(oncebox_core::Source::new("s").unwrap(), KeyRule::MessageId);
        let mut o = ConsumerOptions::new("q", rules, "x");
        o.retry.delay = Duration::ZERO;
        let refused = o.check().unwrap_err();
        assert!(
            matches!(
                refused,
                OptionsError::Retry(RetryPolicyError::TooShort { field: "delay", .. })
            ),
            "{refused:?}"
        );
        assert!(refused.to_string().contains("less than 10ms"), "{refused}");
        o.retry.delay = MIN_RETRY_DELAY;
        assert_eq!(o.check(), Ok(()));
    }
}
