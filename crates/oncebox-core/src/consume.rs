//! Broker consumption without IO: how a message becomes an `Event` (message.rs), what the
//! broker is told once the store answered (ack, quarantine with a reason, or requeue later) and
//! in which order (settle.rs), and the `Apply` seam the AMQP and NATS consumers call.

use std::future::Future;
use std::time::Duration;

use crate::event::Event;
use crate::fingerprint::Fingerprint;
use crate::key::Source;
use crate::outcome::{ProcessError, Processed, Unavailable};

mod decide;
mod message;
mod order;
mod owed;
mod settle;
#[cfg(test)]
mod tests;

pub use decide::{decide, worth_a_warning};
pub use message::{KeyRule, MessageHeaders, MessageRules};
pub use order::{Arrivals, Ticket};
pub use owed::Owed;
pub use settle::{Broker, settle};

/// The longest detail a quarantined copy carries, in bytes. A handler's error can be any size,
/// and a copy the broker refuses is never stored, so its message would be requeued forever: a
/// NATS copy must fit the server's `max_payload`, and RabbitMQ closes the connection on a
/// content header (the copy's properties) larger than its `frame_max` (128 KiB by default).
pub const MAX_DETAIL: usize = 1024;

/// Why a message went to quarantine. The slugs are the gateway's problem types (DESIGN §4) and
/// are written into quarantined messages; do not rename.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reason {
    EventIdMissing(String),
    EventIdInvalid(String),
    InvalidJson(String),
    BodyTooLarge {
        limit: usize,
    },
    /// The store refused the event as larger than it keeps in one row: its payload and its
    /// headers together, `size` bytes against `limit`. The gateway answers it the same way.
    EventTooLarge {
        size: usize,
        limit: usize,
    },
    /// Same key, another payload: the first payload won and is kept in the store; this one is
    /// kept in quarantine.
    KeyReused {
        stored: Fingerprint,
        offered: Fingerprint,
    },
    /// The store refused the event as invalid.
    Invalid(String),
    /// The handler failed on every one of `attempts` deliveries.
    HandlerFailed {
        attempts: u32,
        error: String,
    },
    /// The message went round through oncebox's relays too often (a route publishing back
    /// into its own source), or says so in a header that is no count (`crate::hops`).
    Hops(crate::hops::HopsError),
}

impl Reason {
    pub fn slug(&self) -> &'static str {
        match self {
            Reason::EventIdMissing(_) => "event-id-missing",
            Reason::EventIdInvalid(_) => "event-id-invalid",
            Reason::InvalidJson(_) => "invalid-json",
            Reason::BodyTooLarge { .. } | Reason::EventTooLarge { .. } => "body-too-large",
            Reason::KeyReused { .. } => "key-reused",
            Reason::Invalid(_) => "invalid",
            Reason::HandlerFailed { .. } => "handler-failed",
            Reason::Hops(e) => e.slug(),
        }
    }

    /// One line for operators, never the payload, of at most [`MAX_DETAIL`] bytes.
    pub fn detail(&self) -> String {
        self.detail_within(MAX_DETAIL)
    }

    /// The detail in at most `max` bytes: a longer one is cut on a character boundary and
    /// ends with a mark that it was cut and how long it was, if `max` leaves room for it.
    pub fn detail_within(&self, max: usize) -> String {
        let mut text = self.full_detail();
        if text.len() <= max {
            return text;
        }
        let mark = format!(" [cut: {} bytes in all]", text.len());
        match max.checked_sub(mark.len()) {
            Some(keep) => {
                text.truncate(text.floor_char_boundary(keep));
                text.push_str(&mark);
            }
            None => text.truncate(text.floor_char_boundary(max)),
        }
        text
    }

    /// The detail whole: a handler's error or a store's refusal may be any size.
    fn full_detail(&self) -> String {
        match self {
            Reason::EventIdMissing(d)
            | Reason::EventIdInvalid(d)
            | Reason::InvalidJson(d)
            | Reason::Invalid(d) => d.clone(),
            Reason::BodyTooLarge { limit } => format!("body larger than {limit} bytes"),
            Reason::EventTooLarge { size, limit } => format!(
                "the event is {size} bytes with its headers; the store keeps at most {limit}"
            ),
            Reason::KeyReused { stored, offered } => {
                format!("key reused with another payload (stored {stored}, offered {offered})")
            }
            Reason::HandlerFailed { attempts, error } => {
                format!("handler failed on {attempts} deliveries: {error}")
            }
            Reason::Hops(e) => e.to_string(),
        }
    }

    /// What a quarantined copy carries, in this order: the slug, the detail, where the message
    /// was read (a queue or a stream) and the source it was read for. Each broker names the
    /// four headers its own way.
    pub fn quarantine_values(&self, read_from: &str, source: &Source) -> [String; 4] {
        [
            self.slug().to_owned(),
            self.detail(),
            read_from.to_owned(),
            source.to_string(),
        ]
    }
}

/// Why a message is requeued; never a statement that it was processed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Requeue {
    /// The store could not answer: nothing is known about the key.
    Unavailable,
    /// Another worker holds the key's lease.
    InProgress,
    /// The key waits for reconciliation; it is neither done nor free.
    Uncertain,
    /// The handler failed and rolled back; attempts remain.
    HandlerFailed,
}

/// What the consumer tells the broker about one message. Exhaustive on purpose: a consumer
/// that did not know a decision could only guess, and a guess might be an ack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settle {
    /// Committed now, or before (duplicate), or stale: acknowledge.
    Ack(Processed),
    /// Never processable: publish to the quarantine with the reason, then acknowledge.
    Quarantine(Reason),
    /// Not acknowledged: redelivered after `after`.
    Requeue { why: Requeue, after: Duration },
}

/// How long a consumer waits before a message comes back, and how often a failing handler is
/// tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Wait after `Unavailable` or a failed handler.
    pub delay: Duration,
    /// Wait for an uncertain key (an operator settles it, which takes long).
    pub uncertain_delay: Duration,
    /// Deliveries a failing handler gets before the message is quarantined.
    pub max_attempts: u32,
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy {
            delay: Duration::from_secs(5),
            uncertain_delay: Duration::from_secs(60),
            max_attempts: 5,
        }
    }
}

/// The shortest wait a [`RetryPolicy`] may ask for: with none, a store outage or an uncertain
/// key becomes redeliveries as fast as the broker can send them (a NAK with no delay on NATS).
/// The CLI's configuration asks for at least as much.
pub const MIN_RETRY_DELAY: Duration = Duration::from_millis(10);

/// A [`RetryPolicy`] a consumer refuses to start with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RetryPolicyError {
    /// `field` (`delay` or `uncertain_delay`) is under [`MIN_RETRY_DELAY`].
    #[error(
        "retry {field} is {found:?}, less than {MIN_RETRY_DELAY:?}: messages would come back \
         without a pause while the store is out"
    )]
    TooShort {
        field: &'static str,
        found: Duration,
    },
}

impl RetryPolicy {
    /// Refuses waits under [`MIN_RETRY_DELAY`]. Consumers call it before they start.
    pub fn check(&self) -> Result<(), RetryPolicyError> {
        for (field, found) in [
            ("delay", self.delay),
            ("uncertain_delay", self.uncertain_delay),
        ] {
            if found < MIN_RETRY_DELAY {
                return Err(RetryPolicyError::TooShort { field, found });
            }
        }
        Ok(())
    }
}

/// What a caught panic said (`&str` or `String` payloads), for the handler failure a
/// consumer records in its place.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_owned())
}

/// Where a message sits in an ordered stream, for the offset watermark: `stream` names the
/// consumer's view of it (so two consumers of one stream keep separate watermarks). Never part
/// of the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    pub stream: String,
    pub partition: i64,
    pub offset: i64,
}

/// What a consumer hands each event to: a backend's inbox with the user's handler. Implemented
/// once per backend; consumers are generic over it.
pub trait Apply: Send + Sync + 'static {
    /// Processes the event once. With a `position`, the backend also moves the watermark in the
    /// same transaction and answers an event at or below it as `Stale`.
    fn apply(
        &self,
        event: Event,
        position: Option<Position>,
    ) -> impl Future<Output = Result<Processed, ProcessError>> + Send;

    /// The watermark of `(stream, partition)` as the backend keeps it, for a consumer's checks
    /// at its start (a NATS stream restored from a snapshot winds its sequence back below it).
    /// `None`: none kept yet, or this `Apply` keeps no watermark. No default: an `Apply` that
    /// wraps another forwards it, or the check is silently off behind the wrapper.
    fn watermark(
        &self,
        stream: &str,
        partition: i64,
    ) -> impl Future<Output = Result<Option<i64>, Unavailable>> + Send;
}

/// Whether `answer` settles its message's offset: every answer the consumer acknowledges does
/// (a duplicate, a refusal or a stale verdict, and a conflict or an invalid event, quarantined
/// and acknowledged on its first attempt), and an `Apply` keeping a watermark moves it past
/// such a message in a transaction of its own. The move made inside the handler's transaction
/// is undone with the handler's work when the handler refuses or finds the event stale, and
/// never made for a duplicate or a conflict answered from the record; left there, a replay of
/// the stream after that record is purged would judge the message afresh, and a duplicate's or
/// a conflict's key would apply a second time. Its own commit comes after the record's: a crash
/// between the two redelivers the message, answered again from the record, which moves it then.
pub fn settles_offset(answer: &Result<Processed, ProcessError>) -> bool {
    match answer {
        Ok(processed) => !processed.is_applied(),
        Err(ProcessError::Conflict { .. } | ProcessError::Invalid(_)) => true,
        Err(_) => false,
    }
}

/// An `Apply` from a closure, e.g. one that calls a backend's `process` with a handler.
pub fn from_fn<F, Fut>(f: F) -> FromFn<F>
where
    F: Fn(Event, Option<Position>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Processed, ProcessError>> + Send,
{
    FromFn(f)
}

/// See [`from_fn`].
#[derive(Debug, Clone)]
pub struct FromFn<F>(F);

impl<F, Fut> Apply for FromFn<F>
where
    F: Fn(Event, Option<Position>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Processed, ProcessError>> + Send,
{
    fn apply(
        &self,
        event: Event,
        position: Option<Position>,
    ) -> impl Future<Output = Result<Processed, ProcessError>> + Send {
        (self.0)(event, position)
    }

    /// A closure keeps no watermark of its own that this could read.
    async fn watermark(&self, _: &str, _: i64) -> Result<Option<i64>, Unavailable> {
        Ok(None)
    }
}

/// What a consumer did since it started, for tests and operators.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub applied: u64,
    pub duplicates: u64,
    pub stale: u64,
    pub quarantined: u64,
    pub requeued: u64,
    /// Acknowledgements sent (applied, duplicate, stale and quarantined messages).
    pub acked: u64,
    /// Acknowledgements the broker connection refused or did not take within the deadline (a
    /// late one may still arrive); such messages come back as duplicates.
    pub ack_failures: u64,
    /// Errors reading from the broker that the consumer went on after (a missed heartbeat,
    /// say); those it stopped on are what its `run` returned.
    pub pull_errors: u64,
    /// "Still working on it" acknowledgements sent for messages in hand longer than a part of
    /// the ack wait (NATS), so the broker did not deliver them again meanwhile.
    pub in_progress: u64,
}

impl Counts {
    /// Counts one settled message; `acked` says whether its acknowledgement went out.
    pub fn add(&mut self, settle: &Settle, acked: bool) {
        match settle {
            Settle::Ack(p) if p.is_duplicate() => self.duplicates += 1,
            Settle::Ack(p) if p.is_stale() => self.stale += 1,
            Settle::Ack(_) => self.applied += 1,
            Settle::Quarantine(_) => self.quarantined += 1,
            Settle::Requeue { .. } => self.requeued += 1,
        }
        if !matches!(settle, Settle::Requeue { .. }) {
            if acked {
                self.acked += 1;
            } else {
                self.ack_failures += 1;
            }
        }
    }
}
