//! Broker consumption without IO: how a message becomes an `Event`, what the broker is told once
//! the store answered (ack, quarantine with a reason, or requeue later), and the `Apply` seam
//! the AMQP and NATS consumers call.

use std::borrow::Cow;
use std::future::Future;
use std::time::Duration;

use crate::event::{Event, Meta};
use crate::fingerprint::{Fingerprint, FingerprintMode, derive_event_id};
use crate::json::{self, Pointer, Value};
use crate::key::{EventId, Key, Source};
use crate::outcome::{ProcessError, Processed};

mod settle;

pub use settle::{Broker, settle};

/// Where a message's event id comes from. Always something the producer wrote: a broker's
/// delivery tag, offset or sequence changes on redelivery and republishing, so it is never a key.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyRule {
    /// A message header (AMQP header table, NATS header), by exact name.
    Header(String),
    /// The producer's message id: AMQP's `message_id` property, NATS's `Nats-Msg-Id` header.
    MessageId,
    /// A JSON pointer into the body: a string, or an integer written in decimal.
    Pointer(Pointer),
    /// SHA-256 of these fields' canonical values, for producers that send no id.
    Derive(Vec<Pointer>),
}

/// The transport's view of one message's headers.
pub trait MessageHeaders {
    /// The value of header `name`, as bytes (numbers in decimal); `None` when absent or of a
    /// type that is not text or an integer.
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>>;
    /// The producer's message id, if any.
    fn message_id(&self) -> Option<Cow<'_, [u8]>>;
}

/// How a consumer turns messages into events: plain data, built once from configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageRules {
    /// Named by configuration, never by the message.
    pub source: Source,
    pub key: KeyRule,
    pub fingerprint: FingerprintMode,
    pub max_body: usize,
}

impl MessageRules {
    pub fn new(source: Source, key: KeyRule) -> MessageRules {
        MessageRules {
            source,
            key,
            fingerprint: FingerprintMode::Json,
            max_body: 1 << 20,
        }
    }

    /// The event a message carries, or why it can never be processed (it is quarantined, not
    /// retried: the same bytes would fail the same way).
    pub fn event(
        &self,
        headers: &impl MessageHeaders,
        payload: Vec<u8>,
        content_type: Option<&str>,
    ) -> Result<Event, Reason> {
        if payload.len() > self.max_body {
            return Err(Reason::BodyTooLarge {
                limit: self.max_body,
            });
        }
        let missing = |what: String| Reason::EventIdMissing(what);
        let invalid = |e: crate::InvalidKey| Reason::EventIdInvalid(e.to_string());
        let event_id = match &self.key {
            KeyRule::Header(name) => headers
                .header(name)
                .ok_or_else(|| missing(format!("header {name} absent or not text")))
                .and_then(|v| EventId::from_bytes(&v).map_err(invalid))?,
            KeyRule::MessageId => headers
                .message_id()
                .ok_or_else(|| missing("no message id".to_owned()))
                .and_then(|v| EventId::from_bytes(&v).map_err(invalid))?,
            KeyRule::Pointer(p) => {
                let doc = json::parse(&payload).map_err(|e| Reason::InvalidJson(e.to_string()))?;
                id_at(&doc, p)?
            }
            KeyRule::Derive(fields) => derive_event_id(&payload, fields)
                .map_err(|e| missing(e.to_string()))
                .and_then(|id| EventId::new(id).map_err(invalid))?,
        };
        let key = Key::new(self.source.clone(), event_id);
        let event = Event::new(key, payload, &self.fingerprint)
            .map_err(|e| Reason::InvalidJson(e.to_string()))?;
        Ok(event.with_meta(Meta {
            content_type: content_type.map(str::to_owned),
            headers: Vec::new(),
        }))
    }
}

/// A string, or an integer written in decimal; anything else at the pointer is invalid.
fn id_at(doc: &Value, p: &Pointer) -> Result<EventId, Reason> {
    let text = match doc.pointer(p) {
        None => return Err(Reason::EventIdMissing(format!("{p} absent"))),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n
            .to_i64()
            .ok_or_else(|| Reason::EventIdInvalid(format!("{p} is not an integer")))?
            .to_string(),
        Some(_) => return Err(Reason::EventIdInvalid(format!("{p} is not a string"))),
    };
    EventId::new(text).map_err(|e| Reason::EventIdInvalid(e.to_string()))
}

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
}

impl Reason {
    pub fn slug(&self) -> &'static str {
        match self {
            Reason::EventIdMissing(_) => "event-id-missing",
            Reason::EventIdInvalid(_) => "event-id-invalid",
            Reason::InvalidJson(_) => "invalid-json",
            Reason::BodyTooLarge { .. } => "body-too-large",
            Reason::KeyReused { .. } => "key-reused",
            Reason::Invalid(_) => "invalid",
            Reason::HandlerFailed { .. } => "handler-failed",
        }
    }

    /// One line for operators; never the payload.
    pub fn detail(&self) -> String {
        match self {
            Reason::EventIdMissing(d)
            | Reason::EventIdInvalid(d)
            | Reason::InvalidJson(d)
            | Reason::Invalid(d) => d.clone(),
            Reason::BodyTooLarge { limit } => format!("body larger than {limit} bytes"),
            Reason::KeyReused { stored, offered } => {
                format!("key reused with another payload (stored {stored}, offered {offered})")
            }
            Reason::HandlerFailed { attempts, error } => {
                format!("handler failed on {attempts} deliveries: {error}")
            }
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

/// Decides from the store's answer. `attempt` is this delivery's number, from 1 (the broker's
/// delivery count where it has one).
///
/// Only a committed outcome is acknowledged (G3). `Unavailable` is requeued however often it
/// happens: the message is not at fault. Conflicts and invalid events are quarantined at once —
/// retrying cannot change them, and requeueing would loop forever.
pub fn decide(outcome: Result<Processed, ProcessError>, attempt: u32, p: &RetryPolicy) -> Settle {
    let requeue = |why, after| Settle::Requeue { why, after };
    match outcome {
        Ok(done) => Settle::Ack(done),
        Err(ProcessError::Conflict { stored, offered }) => {
            Settle::Quarantine(Reason::KeyReused { stored, offered })
        }
        Err(ProcessError::Invalid(e)) => Settle::Quarantine(Reason::Invalid(e.to_string())),
        Err(ProcessError::InProgress { retry_after }) => {
            requeue(Requeue::InProgress, retry_after.max(p.delay))
        }
        Err(ProcessError::Uncertain) => requeue(Requeue::Uncertain, p.uncertain_delay),
        Err(ProcessError::Handler(e)) if attempt >= p.max_attempts => {
            Settle::Quarantine(Reason::HandlerFailed {
                attempts: attempt,
                error: e.to_string(),
            })
        }
        Err(ProcessError::Handler(_)) => requeue(Requeue::HandlerFailed, p.delay),
        // `Unavailable` and anything a newer store may add: requeue, never ack.
        Err(_) => requeue(Requeue::Unavailable, p.delay),
    }
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
    /// Acknowledgements the broker connection refused; such messages come back as duplicates.
    pub ack_failures: u64,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::{Response, Unavailable};

    struct H(Vec<(&'static str, &'static [u8])>, Option<&'static [u8]>);

    impl MessageHeaders for H {
        fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
            self.0
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| Cow::Borrowed(*v))
        }
        fn message_id(&self) -> Option<Cow<'_, [u8]>> {
            self.1.map(Cow::Borrowed)
        }
    }

    fn rules(key: KeyRule) -> MessageRules {
        MessageRules::new(Source::new("shop").unwrap(), key)
    }

    fn slug(r: Result<Event, Reason>) -> &'static str {
        r.map(|_| "ok").unwrap_or_else(|e| e.slug())
    }

    #[test]
    fn keys_come_from_the_configured_place_only() {
        let body = br#"{"id":"evt_1","n":7}"#.to_vec();
        let h = H(vec![("x-id", b"hdr_1")], Some(b"mid_1"));
        let id = |r: &MessageRules| r.event(&h, body.clone(), None).unwrap().key.event_id;
        assert_eq!(id(&rules(KeyRule::Header("x-id".into()))).as_str(), "hdr_1");
        assert_eq!(id(&rules(KeyRule::MessageId)).as_str(), "mid_1");
        let ptr = KeyRule::Pointer(Pointer::parse("/id").unwrap());
        assert_eq!(id(&rules(ptr)).as_str(), "evt_1");
        let num = KeyRule::Pointer(Pointer::parse("/n").unwrap());
        assert_eq!(id(&rules(num)).as_str(), "7");
        let derived = KeyRule::Derive(vec![Pointer::parse("/n").unwrap()]);
        assert_eq!(id(&rules(derived)).as_str().len(), 64);
    }

    #[test]
    fn bad_messages_get_a_reason_never_a_panic() {
        let none = H(vec![("x-id", b"\xff\xfe")], None);
        let header = rules(KeyRule::Header("x-id".into()));
        let ptr = rules(KeyRule::Pointer(Pointer::parse("/id").unwrap()));
        let ok = br#"{"id":"a"}"#.to_vec();
        assert_eq!(
            slug(header.event(&none, ok.clone(), None)),
            "event-id-invalid"
        );
        let other = rules(KeyRule::Header("absent".into()));
        assert_eq!(
            slug(other.event(&none, ok.clone(), None)),
            "event-id-missing"
        );
        let mid = rules(KeyRule::MessageId);
        assert_eq!(slug(mid.event(&none, ok, None)), "event-id-missing");
        for (body, want) in [
            (&b"not json"[..], "invalid-json"),
            (b"", "invalid-json"),
            (br#"{"id":{}}"#, "event-id-invalid"),
            (br#"{"id":1.5}"#, "event-id-invalid"),
            (br#"{"id":"   "}"#, "event-id-invalid"),
            (br#"{"other":1}"#, "event-id-missing"),
            (br#"{"id":"a","id":"b"}"#, "invalid-json"),
        ] {
            assert_eq!(
                slug(ptr.event(&none, body.to_vec(), None)),
                want,
                "{body:?}"
            );
        }
        let mut small = ptr.clone();
        small.max_body = 4;
        assert_eq!(
            slug(small.event(&none, b"{}    ".to_vec(), None)),
            "body-too-large"
        );
        let deep = "[".repeat(100_000);
        assert_eq!(
            slug(ptr.event(&none, deep.into_bytes(), None)),
            "invalid-json"
        );
        // A header key with a non-JSON body is fine under the raw fingerprint only.
        let raw = MessageRules {
            fingerprint: FingerprintMode::Raw,
            ..rules(KeyRule::Header("x-id".into()))
        };
        let h = H(vec![("x-id", b"k")], None);
        assert_eq!(slug(raw.event(&h, b"\x00\x01".to_vec(), None)), "ok");
    }

    #[test]
    fn only_committed_outcomes_are_acknowledged() {
        let p = RetryPolicy::default();
        let done = Processed::Applied(Response::completed(""));
        assert_eq!(decide(Ok(done.clone()), 1, &p), Settle::Ack(done));
        let dup = Processed::Duplicate(Response::completed(""));
        assert_eq!(decide(Ok(dup.clone()), 9, &p), Settle::Ack(dup));
        for attempt in [1, 5, 1000] {
            let busy = Err(ProcessError::Unavailable(Unavailable::Busy));
            assert_eq!(
                decide(busy, attempt, &p),
                Settle::Requeue {
                    why: Requeue::Unavailable,
                    after: p.delay
                },
                "unavailable is never quarantined nor acked"
            );
        }
        let uncertain = decide(Err(ProcessError::Uncertain), 1, &p);
        assert!(matches!(
            uncertain,
            Settle::Requeue {
                why: Requeue::Uncertain,
                ..
            }
        ));
        let fp = Fingerprint::from([0; 32]);
        let conflict = Err(ProcessError::Conflict {
            stored: fp,
            offered: fp,
        });
        assert!(matches!(
            decide(conflict, 1, &p),
            Settle::Quarantine(Reason::KeyReused { .. })
        ));
        let failed = || Err(ProcessError::Handler("boom".into()));
        assert!(matches!(decide(failed(), 1, &p), Settle::Requeue { .. }));
        let last = decide(failed(), p.max_attempts, &p);
        assert!(matches!(last, Settle::Quarantine(ref r) if r.slug() == "handler-failed"));
    }

    #[test]
    fn counts_tell_acks_from_requeues() {
        let mut c = Counts::default();
        c.add(
            &Settle::Ack(Processed::Applied(Response::completed(""))),
            true,
        );
        c.add(
            &Settle::Ack(Processed::Duplicate(Response::completed(""))),
            false,
        );
        c.add(
            &Settle::Quarantine(Reason::InvalidJson(String::new())),
            true,
        );
        c.add(
            &Settle::Requeue {
                why: Requeue::Unavailable,
                after: Duration::ZERO,
            },
            false,
        );
        assert_eq!(
            (c.applied, c.duplicates, c.quarantined, c.requeued),
            (1, 1, 1, 1)
        );
        assert_eq!((c.acked, c.ack_failures), (2, 1));
    }
}
