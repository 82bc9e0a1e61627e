//! The consumer loop on a durable JetStream pull consumer with explicit acks: messages run
//! concurrently up to the batch (one at a time with the watermark), each through the inbox,
//! each settled only after the store answered — ack after the commit, quarantine then ack, or
//! a NAK with a delay.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::consumer::PullConsumer;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use oncebox_core::consume::{
    Apply, Arrivals, Counts, MessageHeaders, MessageRules, Owed, RetryPolicy, Settle, Ticket,
    settle,
};
use oncebox_core::retention::DEFAULT_RETENTION;
use tokio::sync::watch;

mod apply;

use crate::attempts::Attempts;
use crate::in_hand::{InHand, kept_alive};
use crate::message::Headers;
use crate::pull::{MOST_IN_A_ROW, Trouble};
use crate::setup::{ConsumeError, DeliverFrom, bind};

/// How long `run` waits, before it returns, for the acks it sent to reach the server.
const FLUSH_LIMIT: Duration = Duration::from_secs(5);
/// How long one pull request waits for messages, unless the durable caps it lower.
const PULL_EXPIRES: Duration = Duration::from_secs(30);

/// What one consumer reads and how it settles messages.
#[derive(Debug, Clone)]
pub struct ConsumerOptions {
    pub stream: String,
    /// The durable consumer's name; created with the settings below when it does not exist.
    /// An existing one keeps its settings: it is refused unless its acks are explicit and its
    /// deliveries unlimited, and a filter or ack wait other than these is logged.
    pub durable: String,
    /// One subject filter (server 2.9 knows one; `None`: the whole stream).
    pub filter_subject: Option<String>,
    /// How long the server waits for an ack before delivering the message again.
    pub ack_wait: Duration,
    /// Tell the server, every third of the durable's ack wait, that a message in hand is still
    /// being worked on (an in-progress ack, which starts its ack wait again), so an apply, or
    /// a wait for an earlier message of its key, that outlasts the ack wait does not have the
    /// message delivered again meanwhile. Such a copy would be answered as a duplicate once the
    /// first settled, but it takes a place among the messages in hand, and it raises the
    /// server's delivery count, which after a restart reads as earlier failures. Off: a message
    /// in hand past the ack wait is delivered again, to this consumer or another.
    pub progress: bool,
    /// Unacknowledged messages the server lets this consumer hold.
    pub max_ack_pending: i64,
    /// Where a durable created by this consumer starts reading. `oncebox consume` gives its
    /// source's retention.
    pub deliver_from: DeliverFrom,
    /// Messages pulled per request, and processed at once.
    pub batch: usize,
    pub rules: MessageRules,
    /// Subject quarantined messages are published to; a stream must capture it. The consumer
    /// refuses to start when its own stream captures it and its filter lets it through.
    pub quarantine_subject: String,
    pub retry: RetryPolicy,
    /// Drive the offset watermark from the stream sequence: each message is handed to the
    /// `Apply` with its position, which an `Apply` that keeps a watermark (the stores'
    /// `InboxHandler`) moves in the message's own transaction, recording a message at or below
    /// it as stale; an `Apply` that ignores the position keeps no watermark. So a replayed
    /// stream (a recreated durable, a restored stream) changes nothing even after its inbox
    /// records were purged. Needs `max_ack_pending = 1`, so messages are processed strictly in
    /// order and none passes one that is being retried. The watermark's name carries the
    /// stream's creation time: a stream deleted and created again, whose sequences start at 1
    /// again, gets a watermark of its own.
    pub watermark: bool,
    /// How often the server tells an idle pull that it is alive. Two missed in a row are a pull
    /// error, which the consumer logs and goes on after (see `run`).
    pub heartbeat: Duration,
}

impl ConsumerOptions {
    pub fn new(
        stream: &str,
        durable: &str,
        rules: MessageRules,
        quarantine_subject: &str,
    ) -> ConsumerOptions {
        ConsumerOptions {
            stream: stream.to_owned(),
            durable: durable.to_owned(),
            filter_subject: None,
            ack_wait: Duration::from_secs(30),
            progress: true,
            max_ack_pending: 1024,
            deliver_from: DeliverFrom::Retention(DEFAULT_RETENTION),
            batch: 64,
            rules,
            quarantine_subject: quarantine_subject.to_owned(),
            retry: RetryPolicy::default(),
            watermark: false,
            heartbeat: Duration::from_secs(5),
        }
    }

    /// Refuses what could never work, before anything is asked of the server: a retry policy
    /// without a pause (see [`RetryPolicy::check`]), which would NAK messages back with no
    /// delay through a store outage. `bind` and `run` call it.
    pub fn check(&self) -> Result<(), ConsumeError> {
        self.retry.check()?;
        Ok(())
    }
}

/// A JetStream consumer that applies each message through `A`.
pub struct Consumer<A> {
    apply: A,
    options: ConsumerOptions,
    counts: watch::Sender<Counts>,
    /// Kept across `run`s, so a reconnect does not forget a failing handler's attempts.
    attempts: Attempts,
    /// Conflicts whose quarantine the server did not take: not asked of the store again.
    owed: Owed,
    /// The order messages arrived in: one key's are applied in it (`Arrivals`).
    arrivals: Arrivals,
}

impl<A> std::fmt::Debug for Consumer<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("options", &self.options)
            .field("counts", &*self.counts.borrow())
            .finish_non_exhaustive()
    }
}

impl<A: Apply> Consumer<A> {
    pub fn new(apply: A, options: ConsumerOptions) -> Consumer<A> {
        let counts = watch::Sender::new(Counts::default());
        Consumer {
            apply,
            options,
            counts,
            attempts: Attempts::default(),
            owed: Owed::default(),
            arrivals: Arrivals::default(),
        }
    }

    /// What this consumer settled so far; `wait_for` on it waits for a condition.
    pub fn counts(&self) -> watch::Receiver<Counts> {
        self.counts.subscribe()
    }

    /// The durable pull consumer, created when absent (see [`DeliverFrom`] for where a new
    /// one starts), after the checks that refuse a setup this consumer cannot be safe with.
    pub async fn bind(&self, js: &jetstream::Context) -> Result<PullConsumer, ConsumeError> {
        Ok(bind(js, &self.options).await?.consumer)
    }

    /// Consumes until `shutdown` completes or pulling fails. On shutdown it stops pulling and
    /// settles the messages in hand; messages pulled but not started come back after the ack
    /// wait.
    ///
    /// A pull error (a missed heartbeat, `no responders`, a pull request not sent) is logged,
    /// counted in [`Counts::pull_errors`] and gone on after: the client renews the pull itself.
    /// Pulling fails, and `run` returns, when the server ends the pull (the consumer deleted,
    /// a request over its limits) or after several errors with no message between.
    pub async fn run(
        &self,
        js: &jetstream::Context,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), ConsumeError> {
        let bound = bind(js, &self.options).await?;
        let watermark = watermark_name(&self.options, bound.stream_created);
        if self.options.watermark {
            crate::setup::refuse_wound_back(&self.apply, js, &self.options, &watermark).await?;
        }
        let at = Stream {
            js,
            created: bound.stream_created,
            watermark: &watermark,
            // Three chances before the wait runs out; a server's ack wait is never zero, but a
            // floor keeps a tiny one from becoming a busy loop.
            progress_every: self
                .options
                .progress
                .then(|| (bound.ack_wait / 3).max(Duration::from_millis(10))),
        };
        let limit = if self.options.watermark {
            1
        } else {
            self.options.batch.max(1)
        };
        // Within the durable's own caps: past them the server ends the pull with an error.
        let limit = bound.max_batch.map_or(limit, |cap| limit.min(cap));
        let expires = bound
            .max_expires
            .map_or(PULL_EXPIRES, |cap| PULL_EXPIRES.min(cap));
        let heartbeat = self.options.heartbeat.min(expires / 2);
        let pull = || crate::pull::messages(&bound.consumer, limit, heartbeat, expires);
        let mut messages = pull().await.map_err(ConsumeError::Pull)?;
        // The messages in hand are futures of this one task, not a task each: measured with
        // benches/consume.rs, a task per message cost more (the spawn, a cross-thread wake-up
        // when the store answers, the context cloned into it) than spreading the decoding over
        // threads gave. Always drained before returning.
        let mut in_hand = FuturesUnordered::new();
        let mut shutdown = std::pin::pin!(shutdown);
        let mut trouble = Trouble::default();
        // The error a stream that ends itself gave last: the end alone says nothing.
        let mut last_error = None;
        let ended = loop {
            tokio::select! {
                () = &mut shutdown => break Ok(()),
                Some(()) = in_hand.next(), if !in_hand.is_empty() => {}
                next = messages.next(), if in_hand.len() < limit => match next {
                    Some(Ok(message)) => {
                        trouble.clear();
                        // Taken here, in arrival order.
                        let ticket = self.arrivals.ticket();
                        in_hand.push(self.guarded(&at, message, ticket));
                    }
                    Some(Err(e)) => {
                        let in_a_row = trouble.note(std::time::Instant::now());
                        self.counts.send_modify(|c| c.pull_errors += 1);
                        if in_a_row >= MOST_IN_A_ROW {
                            break Err(ConsumeError::Pull(format!(
                                "{e} ({in_a_row} pull errors with no message between)"
                            )));
                        }
                        tracing::warn!(stream = %self.options.stream, error = %e, in_a_row, "pull error; pulling goes on");
                        last_error = Some(e.to_string());
                        // The client's stream may not ask again before its pull request
                        // expires (35 s): after `no responders`, or a pull request not sent,
                        // it still counts the messages it asked for. A fresh one asks at once.
                        match pull().await {
                            Ok(fresh) => messages = fresh,
                            Err(e) => break Err(ConsumeError::Pull(e)),
                        }
                    }
                    None => break Err(ConsumeError::Pull(match last_error.take() {
                        Some(e) => format!("message stream ended after: {e}"),
                        None => "message stream ended".into(),
                    })),
                },
            }
        };
        while in_hand.next().await.is_some() {}
        // Acks are queued in the client, not yet written: flushed, so the acks `counts` reports
        // have reached the server before the caller goes on (and its process, maybe, exits).
        // Bounded, so a dead connection cannot hold up a shutdown; an ack lost there comes
        // back as a duplicate.
        match tokio::time::timeout(FLUSH_LIMIT, js.client().flush()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "acks not flushed; those lost come back as duplicates")
            }
            Err(_) => {
                tracing::warn!("acks not flushed in time; those lost come back as duplicates")
            }
        }
        ended
    }

    /// `handle`, with a panic outside the `Apply` (whose panics are handler failures) confined
    /// to its message: it is neither acked nor requeued, so the server delivers it again after
    /// the ack wait, and the other messages go on.
    async fn guarded(&self, at: &Stream<'_>, message: jetstream::Message, ticket: Ticket) {
        let handled = AssertUnwindSafe(self.handle(at, message, ticket)).catch_unwind();
        if handled.await.is_err() {
            tracing::error!(stream = %self.options.stream, "handling a message panicked; it comes back after the ack wait");
        }
    }

    async fn handle(&self, at: &Stream<'_>, message: jetstream::Message, mut ticket: Ticket) {
        let o = &self.options;
        // The sequence is the stream's position of the stored message: stable across
        // redeliveries, so fit for the watermark, yet never part of the key.
        let (sequence, delivered) = match message.info() {
            Ok(info) => (info.stream_sequence, info.delivered),
            Err(_) => (0, 1),
        };
        let headers = Headers(message.headers.as_ref());
        // Kept with the event, so a relay forwards a raw body under the type it came with
        // rather than as JSON.
        let content_type = ["Content-Type", "content-type"]
            .into_iter()
            .find_map(|name| headers.header(name))
            .and_then(|v| String::from_utf8(v.into_owned()).ok());
        let event = o
            .rules
            .event(&headers, message.payload.to_vec(), content_type.as_deref());
        let work = async {
            // Of two messages of one key in hand, the one that arrived first is applied first,
            // so its payload is the one kept (G4); the ticket is held until this one is
            // settled.
            ticket
                .turn(event.as_ref().ok().map(|e| (&e.key, e.fingerprint)))
                .await;
            let offered = event.as_ref().ok().map(|e| (e.key.clone(), e.fingerprint));
            let owed = offered.as_ref().and_then(|(k, f)| self.owed.take(k, *f));
            let decision = self.outcome_of(at, event, owed, sequence, delivered).await;
            (offered, decision)
        };
        let (offered, decision) = kept_alive(&message, at.progress_every, &self.counts, work).await;
        if matches!(decision, Settle::Ack(_)) {
            // The effect is committed; a crash from here on is redelivered and answered as a
            // duplicate.
            crate::crash::point!("nats-before-ack");
        }
        let in_hand = InHand {
            js: at.js,
            message: &message,
            options: o,
        };
        if let Some((key, offered)) = &offered {
            self.owed.owe(key, *offered, &decision, o.retry.delay);
        }
        let (settle, acked) = settle(&in_hand, decision, &o.retry).await;
        if let Some((key, offered)) = &offered {
            self.owed.settled(key, *offered, &settle);
        }
        if !matches!(settle, Settle::Requeue { .. }) {
            self.attempts.settled((at.created, sequence));
        }
        self.counts.send_modify(|c| c.add(&settle, acked));
    }
}

/// The offset watermark's stream name, `nats:{stream}:{durable}:{created}` with the stream's
/// creation time in Unix nanoseconds. Persisted: do not change.
///
/// One per durable, so consumers of one stream with other filters keep their own. One per
/// incarnation of the stream: a stream deleted and created again under its name numbers its
/// messages from 1 again, and a watermark left high by the old one would record every new
/// message as stale, which loses it. A stream restored from a snapshot keeps its creation time
/// (the server takes it from the snapshot), and so its watermark: a replay of it stays stale.
///
/// The creation time is in the name rather than stored beside the offset and compared,
/// because the store's watermark holds an offset and compares nothing else; and a new name
/// needs no reset: it starts from nothing, and the new stream's first message sets it.
///
/// Before, the name was `nats:{stream}:{durable}`. A deployment that upgrades starts a new
/// watermark and leaves the old one unused. Its durable goes on from its ack floor, so only
/// messages not yet acknowledged come again, each answered by its inbox record as before; a
/// message is applied twice only if it is read again after its record was purged, which the ack
/// floor and, for a new durable, `DeliverFrom::Retention` rule out (`DeliverFrom::All` on a new
/// durable does not).
fn watermark_name(o: &ConsumerOptions, stream_created: i128) -> String {
    format!("nats:{}:{}:{stream_created}", o.stream, o.durable)
}

/// The stream being consumed, as one `run` bound it.
struct Stream<'a> {
    js: &'a jetstream::Context,
    /// The stream's creation time (see `setup::Bound`).
    created: i128,
    /// The offset watermark's name.
    watermark: &'a str,
    /// How often a message in hand is said to be in progress (`None`: never).
    progress_every: Option<Duration>,
}
