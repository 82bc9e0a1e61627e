//! Binding the consumer at start: the stream read, the durable got or created, and every setting
//! under which the consumer could not keep its promises refused before a message is pulled — a
//! quarantine the consumer would read back or that no stream stores, a durable that acks or
//! drops messages on its own, a watermark without in-order delivery.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, PullConsumer, pull};
use async_nats::jetstream::context::{ConsumerInfoErrorKind, GetStreamByNameErrorKind};
use async_nats::jetstream::{self, stream};
use oncebox_core::consume::{Apply, RetryPolicyError};

use crate::consumer::ConsumerOptions;
use crate::copy::least_limit;
use crate::subject::matches;

/// Where a durable that does not exist yet starts reading. An existing durable goes on from
/// its own position whatever this says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeliverFrom {
    /// The messages stored within this horizon before the durable is created: give the
    /// source's inbox retention. An older message may have been applied already and had its
    /// inbox record purged since, so a new durable would apply it a second time; one inside
    /// the horizon is still answered as a duplicate. Records of messages near the horizon
    /// expire while a new durable works through its backlog: a horizon shorter than the
    /// retention by the time a catch-up takes closes that gap.
    Retention(Duration),
    /// The whole stream, from its first message: only for a stream whose every message is
    /// still guarded by an inbox record (or by the watermark) or was never applied. A
    /// work-queue stream is always read so (the server takes nothing else there), since it
    /// keeps only messages no consumer acknowledged.
    All,
}

/// Why `run` stopped before its shutdown signal.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumeError {
    /// The retry policy asks for no pause before a message comes back (see
    /// [`RetryPolicy::check`](oncebox_core::consume::RetryPolicy::check)): nothing was asked of
    /// the server. Retrying does not help until the options are changed.
    #[error("options: {0}")]
    Retry(#[from] RetryPolicyError),
    /// The stream or consumer could not be read or created.
    #[error("consumer setup: {0}")]
    Setup(String),
    /// The offset watermark stands above the stream's last sequence: the stream was restored
    /// from a snapshot older than the inbox, or lost the tail it had acknowledged (a single
    /// server's power loss before its sync), either of which winds its sequence back while
    /// keeping its creation time (and so the watermark's name). Started, the consumer would
    /// record every message published since, up to the watermark, stale and acknowledge it
    /// unapplied. Retrying does not help until the inbox and the stream agree again.
    #[error(
        "the offset watermark {watermark} ({name}) is above stream {stream}'s last sequence \
         {last}: the stream went back (restored from an earlier snapshot than the inbox, or \
         its acknowledged tail lost), and the messages published since would be recorded stale \
         unapplied; restore the inbox from the same moment as the stream, or set the watermark \
         to the stream's last sequence (UPDATE oncebox_offsets SET position = {last} WHERE \
         stream = '{name}'): the messages the inbox applied past it keep their records"
    )]
    WoundBack {
        stream: String,
        name: String,
        watermark: i64,
        last: u64,
    },
    /// The watermark needs in-order processing, which the server-side consumer does not give.
    /// Retrying does not help until the durable is changed.
    #[error("watermark mode needs max_ack_pending = 1 on consumer {durable} (it has {found})")]
    Unordered { durable: String, found: i64 },
    /// The consumed stream stores the quarantine subject and the consumer's filter lets it
    /// through: every quarantined copy would come back, fail the same way and be quarantined
    /// again, without end. Retrying does not help until the configuration is changed.
    #[error(
        "quarantine subject {quarantine} is stored by stream {stream} (its subject {captured_by}) \
         and read back by consumer {durable} ({filter}): quarantine to a subject this stream \
         does not keep, or filter it out"
    )]
    QuarantineReadBack {
        stream: String,
        durable: String,
        quarantine: String,
        captured_by: String,
        /// The consumer's filter, or "no filter".
        filter: String,
    },
    /// No stream stores the quarantine subject, or it is a wildcard no message can be
    /// published to: every quarantine would fail, and its message come back without end (in
    /// watermark mode the whole stream would wait behind it). Retrying does not help until a
    /// stream stores the subject.
    #[error("quarantine subject {subject:?} cannot be published to: {why}")]
    QuarantineUnstored { subject: String, why: String },
    /// The existing durable is configured so that messages could be acknowledged without being
    /// processed or dropped after some deliveries. Retrying does not help until the durable is
    /// deleted or changed.
    #[error("durable {durable} on stream {stream} cannot be used: {problem}")]
    UnsafeDurable {
        stream: String,
        durable: String,
        problem: DurableProblem,
    },
    /// Pulling messages failed. Unacknowledged messages come back after the ack wait.
    #[error("pull: {0}")]
    Pull(String),
}

/// What makes an existing durable unsafe to consume with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DurableProblem {
    /// `All` acknowledges every earlier message with one ack, including those NAKed for a
    /// retry; `None` counts a message acknowledged as soon as it is delivered.
    #[error("its ack policy is {0:?}, not Explicit")]
    AckPolicy(AckPolicy),
    /// The server stops delivering a message after this many deliveries, however long an
    /// outage kept the store from answering: the message is lost.
    #[error("its max_deliver is {0}, not unlimited")]
    MaxDeliver(i64),
    /// The server sends headers only: every payload would arrive empty, applied as such or
    /// quarantined as not JSON, and acknowledged either way.
    #[error("it delivers headers only, without payloads")]
    HeadersOnly,
}

/// The consumer bound to its durable, and the stream's identity.
pub(crate) struct Bound {
    pub consumer: PullConsumer,
    /// When the stream was created, in Unix nanoseconds: a stream deleted and created again
    /// under the same name starts its sequences at 1 again, and this tells the two apart.
    pub stream_created: i128,
    /// The durable's own caps on one pull: asking for more ends the pull with an error, and
    /// the consumer would end with it at every start.
    pub max_batch: Option<usize>,
    pub max_expires: Option<Duration>,
    /// The durable's own ack wait, which applies whatever was configured.
    pub ack_wait: Duration,
}

pub(crate) async fn bind(
    js: &jetstream::Context,
    o: &ConsumerOptions,
) -> Result<Bound, ConsumeError> {
    o.check()?;
    let setup = |e: &dyn std::fmt::Display| ConsumeError::Setup(e.to_string());
    let stream = js.get_stream(&o.stream).await.map_err(|e| setup(&e))?;
    let info = stream.cached_info();
    let stream_created = info.created.unix_timestamp_nanos();
    // Checked with the filter asked for before anything is created, and again below with the
    // filter of the durable found, which is the one the server applies.
    let asked_filter = o.filter_subject.clone().unwrap_or_default();
    read_back(info, o, &asked_filter)?;
    stored(js, o).await?;
    if o.rules.key == oncebox_core::consume::KeyRule::MessageId {
        // The server drops a repeated id inside the window before any consumer sees it.
        tracing::warn!(stream = %o.stream, window = ?info.config.duplicate_window, "keyed by Nats-Msg-Id: within the stream's duplicate window JetStream drops a message whose id it saw, so the same id with another payload there is never refused as key-reused nor kept for audit (the first payload still wins); a key from the payload or another header keeps such conflicts in view");
    }
    // A work-queue stream takes only durables that start at its first message, and holds only
    // messages no consumer has acknowledged: none of them was applied and settled, so reading
    // all is what the horizon is for elsewhere. Asked for a start time, the server refused
    // the durable (10101) and the consumer could never start.
    let work_queue = info.config.retention == stream::RetentionPolicy::WorkQueue;
    let from = if work_queue {
        DeliverFrom::All
    } else {
        o.deliver_from
    };
    let deliver_policy = deliver_policy(from).map_err(|e| setup(&e))?;
    if let DeliverPolicy::ByStartTime { start_time } = deliver_policy
        && info.state.messages > 0
        && info.state.first_timestamp < start_time
        && stream
            .consumer_info(&o.durable)
            .await
            .is_err_and(|e| e.kind() == ConsumerInfoErrorKind::NotFound)
    {
        // Said when the durable is made: the stream's messages before the horizon (those the
        // filter takes among them) are never read by it.
        tracing::warn!(stream = %o.stream, durable = %o.durable, filter = %o.filter_subject.as_deref().unwrap_or(""), first = %info.state.first_timestamp, start = %start_time, "a new durable starts at the retention horizon: the stream holds older messages, which it does not read (in the library, DeliverFrom::All reads them)");
    }
    let config = pull::Config {
        durable_name: Some(o.durable.clone()),
        filter_subject: asked_filter.clone(),
        ack_policy: AckPolicy::Explicit,
        ack_wait: o.ack_wait,
        max_ack_pending: if o.watermark { 1 } else { o.max_ack_pending },
        deliver_policy,
        ..pull::Config::default()
    };
    // Only used when the durable is absent; an existing one keeps its own settings, checked
    // below.
    let mut consumer: PullConsumer = stream
        .get_or_create_consumer(&o.durable, config)
        .await
        .map_err(|e| setup(&e))?;
    let found = consumer.info().await.map_err(|e| setup(&e))?.config.clone();
    let unsafe_durable = |problem| ConsumeError::UnsafeDurable {
        stream: o.stream.clone(),
        durable: o.durable.clone(),
        problem,
    };
    if found.ack_policy != AckPolicy::Explicit {
        return Err(unsafe_durable(DurableProblem::AckPolicy(found.ack_policy)));
    }
    // The server reports an unlimited max_deliver as -1; 0 is the client's "not set".
    if found.max_deliver > 0 {
        return Err(unsafe_durable(DurableProblem::MaxDeliver(
            found.max_deliver,
        )));
    }
    if found.headers_only {
        return Err(unsafe_durable(DurableProblem::HeadersOnly));
    }
    read_back(info, o, &found.filter_subject)?;
    if found.filter_subject != asked_filter {
        tracing::warn!(durable = %o.durable, found = %found.filter_subject, asked = %asked_filter, "the existing durable filters other subjects than configured; its own filter applies");
    }
    if found.ack_wait != o.ack_wait {
        tracing::warn!(durable = %o.durable, found = ?found.ack_wait, asked = ?o.ack_wait, "the existing durable has another ack wait than configured; its own applies");
    }
    if o.watermark && found.max_ack_pending != 1 {
        return Err(ConsumeError::Unordered {
            durable: o.durable.clone(),
            found: found.max_ack_pending,
        });
    }
    Ok(Bound {
        consumer,
        stream_created,
        // 0 is "no limit" on the server.
        max_batch: usize::try_from(found.max_batch).ok().filter(|n| *n > 0),
        max_expires: Some(found.max_expires).filter(|d| !d.is_zero()),
        ack_wait: found.ack_wait,
    })
}

/// Refuses a consumer that would read its own quarantined copies back.
fn read_back(info: &stream::Info, o: &ConsumerOptions, filter: &str) -> Result<(), ConsumeError> {
    let quarantine = &o.quarantine_subject;
    let Some(captured_by) = info.config.subjects.iter().find(|s| matches(s, quarantine)) else {
        return Ok(());
    };
    // An empty filter is the whole stream.
    if !filter.is_empty() && !matches(filter, quarantine) {
        return Ok(());
    }
    Err(ConsumeError::QuarantineReadBack {
        stream: o.stream.clone(),
        durable: o.durable.clone(),
        quarantine: quarantine.clone(),
        captured_by: captured_by.clone(),
        filter: if filter.is_empty() {
            "no filter".to_owned()
        } else {
            format!("filter {filter}")
        },
    })
}

/// Refuses a quarantine subject a copy cannot be stored under: a wildcard, one no stream keeps
/// (JetStream answers such a publish with no responders), one whose stream keeps messages only
/// for its consumers' interest, answers no publish (`no_ack`) or drops the oldest past a
/// per-subject limit, or one whose stream's `max_msg_size` is smaller than a copy cut as far
/// as it goes (see `copy::fit`).
async fn stored(js: &jetstream::Context, o: &ConsumerOptions) -> Result<(), ConsumeError> {
    let subject = &o.quarantine_subject;
    let refused = |why: &str| ConsumeError::QuarantineUnstored {
        subject: subject.to_owned(),
        why: why.to_owned(),
    };
    if subject.split('.').any(|t| t == "*" || t == ">") {
        return Err(refused("it holds a wildcard"));
    }
    let name = match js.stream_by_subject(subject).await {
        Ok(name) => name,
        Err(e) => {
            return Err(match e.kind() {
                GetStreamByNameErrorKind::NotFound => refused("no stream stores it"),
                GetStreamByNameErrorKind::InvalidSubject => refused("it is no valid subject"),
                _ => ConsumeError::Setup(e.to_string()),
            });
        }
    };
    let stream = js
        .get_stream(&name)
        .await
        .map_err(|e| ConsumeError::Setup(e.to_string()))?;
    let config = &stream.cached_info().config;
    // An interest stream drops a message no consumer's filter wants at the time, and still
    // acknowledges it with a sequence: the copy would be counted stored and the original
    // acked, with nothing kept. Whether a consumer wants it can change at any time, so such a
    // stream is refused whatever its consumers are now.
    if config.retention == stream::RetentionPolicy::Interest {
        return Err(refused(&format!(
            "its stream {name} keeps messages only while a consumer wants them (interest \
             retention), and drops a copy no consumer wants without saying so"
        )));
    }
    // A stream that answers no publish: the copy is stored, its PubAck waited for in vain, the
    // original requeued and copied again at every delivery, without end.
    if config.no_ack {
        return Err(refused(&format!(
            "its stream {name} acknowledges nothing it stores (no_ack): each copy would be \
             waited for in vain and published again at every delivery"
        )));
    }
    // Every copy goes to one subject: a per-subject limit drops earlier copies, whose
    // originals were acked, without a word, unless the stream refuses new messages per
    // subject instead (`discard = new` with `discard_new_per_subject`).
    let refuses_new =
        config.discard == stream::DiscardPolicy::New && config.discard_new_per_subject;
    if config.max_messages_per_subject > 0 && !refuses_new {
        return Err(refused(&format!(
            "its stream {name} keeps at most {} messages per subject and discards the oldest \
             (unless discard = new with discard_new_per_subject): every copy goes to this one \
             subject, so earlier copies would be dropped",
            config.max_messages_per_subject
        )));
    }
    let max = config.max_message_size;
    let least = least_limit(&o.stream, &o.rules.source);
    // Zero or negative: no limit of the stream's own.
    if usize::try_from(max).is_ok_and(|max| max > 0 && max < least) {
        return Err(refused(&format!(
            "its stream {name} stores messages of at most {max} bytes (max_msg_size), less \
             than the {least} a quarantined copy's own headers may take"
        )));
    }
    Ok(())
}

/// Where a new durable starts: the horizon is taken back from this host's clock, which is
/// the clock the inbox's retention runs on too.
fn deliver_policy(from: DeliverFrom) -> Result<DeliverPolicy, async_nats::Error> {
    match from {
        DeliverFrom::All => Ok(DeliverPolicy::All),
        DeliverFrom::Retention(horizon) => {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            let start = i128::try_from(now.saturating_sub(horizon).as_nanos())?;
            Ok(DeliverPolicy::ByStartTime {
                start_time: async_nats::datetime::from_nanos(start)?,
            })
        }
    }
}

/// Refuses to start on a stream whose last sequence is below the watermark
/// ([`ConsumeError::WoundBack`]). The watermark is read first and the stream's last sequence
/// after it: read the other way round, another consumer on the same durable could apply
/// messages published in between, and its watermark would pass a sequence read too early. A
/// store or a server that cannot say is no reason to stay down: the watermark keeps guarding
/// each message, and the check is made at the next start.
pub(crate) async fn refuse_wound_back(
    apply: &impl Apply,
    js: &jetstream::Context,
    options: &ConsumerOptions,
    name: &str,
) -> Result<(), ConsumeError> {
    let unchecked = |what: &dyn std::fmt::Display| {
        tracing::warn!(stream = %options.stream, error = %what, "the offset watermark could not be checked against the stream's last sequence");
        Ok(())
    };
    let watermark = match apply.watermark(name, 0).await {
        Ok(Some(watermark)) => watermark,
        Ok(None) => return Ok(()),
        Err(e) => return unchecked(&e),
    };
    let last = match js.get_stream(&options.stream).await {
        Ok(stream) => stream.cached_info().state.last_sequence,
        Err(e) => return unchecked(&e),
    };
    if u64::try_from(watermark).is_ok_and(|w| w > last) {
        return Err(ConsumeError::WoundBack {
            stream: options.stream.clone(),
            name: name.to_owned(),
            watermark,
            last,
        });
    }
    Ok(())
}
