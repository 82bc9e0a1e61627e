//! An event as it enters a backend (key, payload, fingerprint) and an outbox message as it leaves.

use std::sync::Arc;

use crate::fingerprint::{Fingerprint, FingerprintMode, PayloadError};
use crate::key::{Key, Source};

/// One delivery of an event, already authenticated and parsed at the edge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub key: Key,
    /// The exact bytes received; kept so a conflict can be audited and an event redelivered.
    pub payload: Vec<u8>,
    pub fingerprint: Fingerprint,
    /// The mode `fingerprint` was taken by, where the records of its source may hold
    /// fingerprints an earlier version took another way: a record whose fingerprint differs is
    /// this event if its stored payload, fingerprinted this way, gives this event's.
    /// Shared: it is the source's own mode, set on every event of such a source.
    pub recheck: Option<Arc<FingerprintMode>>,
    /// How it arrived, kept for operators and for redelivery with the original content type.
    pub meta: Meta,
}

/// Transport details of an event: its content type and the request headers worth keeping.
///
/// The headers are kept as they are stored, one `name: value` line each (an HTTP header value
/// cannot hold a line break): written once at the edge, stored as they are, and split only
/// when someone reads them. Pairs of strings cost two allocations a header on every request
/// and a rendering on the writer thread, which every caller of a batch waits for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Meta {
    pub content_type: Option<String>,
    /// Lowercase names, in arrival order; credentials (authorization, cookies) are never kept.
    lines: String,
    /// How many oncebox relays the event passed through before it arrived (`crate::hops`); its
    /// deliveries carry one more. Not stored: it is read when the event's deliveries are queued.
    hops: u32,
}

impl Meta {
    /// A content type and no headers.
    pub fn new(content_type: Option<String>) -> Meta {
        Meta {
            content_type,
            lines: String::new(),
            hops: 0,
        }
    }

    /// Read back from the stored form ([`Meta::header_lines`]).
    pub fn from_header_lines(content_type: Option<String>, lines: Option<String>) -> Meta {
        Meta {
            content_type,
            lines: lines.unwrap_or_default(),
            hops: 0,
        }
    }

    /// The event arrived having passed through `hops` oncebox relays (`crate::hops::arrived`).
    pub fn with_hops(mut self, hops: u32) -> Meta {
        self.hops = hops;
        self
    }

    /// How many oncebox relays the event passed through before it arrived: 0 for an event
    /// read back from the store or made by the library.
    pub fn hops(&self) -> u32 {
        self.hops
    }

    /// Room for `bytes` more of header lines, so that the headers pushed next need no regrowth.
    pub fn reserve_headers(&mut self, bytes: usize) {
        self.lines.reserve(bytes);
    }

    /// Keeps one header. A name or value with a line break, or a name with a colon, would not
    /// read back as written and is not kept (HTTP allows neither). Checked byte by byte: `str`
    /// pattern searches cost more than the rest of the gateway's header handling together.
    pub fn push_header(&mut self, name: &str, value: &str) {
        let breaks = |b: &u8| *b == b'\n' || *b == b'\r';
        if name.as_bytes().iter().any(|b| breaks(b) || *b == b':')
            || value.as_bytes().iter().any(breaks)
        {
            return;
        }
        self.lines.reserve(name.len() + value.len() + 3);
        self.lines.push_str(name);
        self.lines.push_str(": ");
        self.lines.push_str(value);
        self.lines.push('\n');
    }

    /// The kept headers, in arrival order.
    pub fn headers(&self) -> impl Iterator<Item = (&str, &str)> {
        self.lines.lines().filter_map(|l| l.split_once(": "))
    }

    /// The headers as stored; `None` when there are none, so the library's events cost no
    /// extra bytes.
    pub fn header_lines(&self) -> Option<&str> {
        (!self.lines.is_empty()).then_some(self.lines.as_str())
    }
}

impl Event {
    /// Fingerprints `payload` by `mode`; a payload the mode cannot read is refused here, before
    /// any storage is touched.
    pub fn new(key: Key, payload: Vec<u8>, mode: &FingerprintMode) -> Result<Event, PayloadError> {
        Event::parsed(key, payload, mode, None)
    }

    /// As [`Event::new`], with `parsed` the payload as `json::parse` read it, so it is not parsed
    /// twice; the fingerprint is the same either way.
    pub fn parsed(
        key: Key,
        payload: Vec<u8>,
        mode: &FingerprintMode,
        parsed: Option<&crate::json::Value>,
    ) -> Result<Event, PayloadError> {
        let fingerprint = mode.fingerprint_parsed(&payload, parsed)?;
        Ok(Event {
            key,
            payload,
            fingerprint,
            recheck: None,
            meta: Meta::default(),
        })
    }

    /// Whether a record whose fingerprint differs from this event's, holding `payload`, is this
    /// event stored the way an earlier version fingerprinted it (see [`Event::recheck`]).
    pub fn matches_payload(&self, payload: &[u8]) -> bool {
        self.recheck.as_ref().is_some_and(|mode| {
            mode.fingerprint(payload)
                .is_ok_and(|f| f == self.fingerprint)
        })
    }

    /// A JSON event fingerprinted by its canonical form.
    pub fn json(key: Key, payload: impl Into<Vec<u8>>) -> Result<Event, PayloadError> {
        Event::new(key, payload.into(), &FingerprintMode::Json)
    }

    pub fn source(&self) -> &Source {
        &self.key.source
    }

    pub fn with_meta(mut self, meta: Meta) -> Event {
        self.meta = meta;
        self
    }
}

/// A side effect queued in the same transaction as the business effect, delivered later by a relay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxMessage {
    /// Where it goes: a route name, an exchange, a subject. Opaque to the backend.
    pub destination: String,
    /// Stable for the message's whole life; receivers deduplicate on it. Unique per destination,
    /// so enqueuing the same key twice for one destination queues it once.
    pub idempotency_key: String,
    pub payload: Vec<u8>,
    pub content_type: String,
}

/// Why a message cannot be queued: every target sends its idempotency key and content type as
/// headers, and a value no header can carry would fail every attempt until the caps end it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidMessage {
    #[error("the destination {0}")]
    Destination(&'static str),
    #[error("the idempotency key {0}")]
    IdempotencyKey(&'static str),
    #[error("the content type {0}")]
    ContentType(&'static str),
}

/// The longest idempotency key or content type queued: far past any real one, well inside every
/// receiver's header limits.
pub const MAX_HEADER_FIELD: usize = 1024;

/// What is wrong with `value` as a header value, if anything.
pub(crate) fn header_field(value: &str) -> Result<(), &'static str> {
    if value.trim().is_empty() {
        Err("is blank")
    } else if value.len() > MAX_HEADER_FIELD {
        Err("is longer than 1024 bytes")
    } else if value.chars().any(|c| c.is_control() && c != '\t') {
        // A tab is whitespace a header value may hold (`text/plain;\tcharset=utf-8`).
        Err("holds a control character")
    } else if value.trim_matches([' ', '\t']) != value {
        // Header values lose their spaces and tabs at either end on the wire: the receiver
        // would see another key. (Other whitespace, such as U+00A0, goes through as it is.)
        Err("starts or ends with whitespace")
    } else {
        Ok(())
    }
}

/// The longest AMQP short string, which vhost, queue and exchange names, routing keys,
/// `message_id` and `content_type` are: lapin panics on a longer one. Named here, where both
/// the relay (publishing) and the consumer (reading) find it.
pub const SHORT_STRING_MAX: usize = 255;

/// The longest destination queued: a route name is at most 64 bytes, and an exchange or a
/// routing key at most an AMQP short string.
pub const MAX_DESTINATION: usize = SHORT_STRING_MAX;

/// What is wrong with `name` as a destination, if anything: route names, exchanges and
/// subjects have no whitespace or control characters.
pub(crate) fn destination(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        Err("is empty")
    } else if name.len() > MAX_DESTINATION {
        Err("is longer than 255 bytes")
    } else if name.chars().any(|c| c.is_control() || c.is_whitespace()) {
        Err("holds whitespace or a control character")
    } else {
        Ok(())
    }
}

impl OutboxMessage {
    /// What `enqueue` answers when its insert found the key taken: `first` is the payload and
    /// content type queued under it (`None` if it vanished meanwhile, purged: the key was used).
    pub fn beside(&self, first: Option<(Vec<u8>, String)>) -> crate::Enqueued {
        match first {
            Some((payload, content_type))
                if payload != self.payload || content_type != self.content_type =>
            {
                crate::Enqueued::Conflict
            }
            _ => crate::Enqueued::Already,
        }
    }

    /// Whether the message can be sent: a destination a relay can name, and a key and content
    /// type every target can carry as a header. The backends' `enqueue` refuses a message that
    /// cannot: it would wait forever for a relay no configuration can give it.
    pub fn check(&self) -> Result<(), InvalidMessage> {
        destination(&self.destination).map_err(InvalidMessage::Destination)?;
        header_field(&self.idempotency_key).map_err(InvalidMessage::IdempotencyKey)?;
        header_field(&self.content_type).map_err(InvalidMessage::ContentType)
    }

    pub fn json(
        destination: impl Into<String>,
        idempotency_key: impl Into<String>,
        payload: impl Into<Vec<u8>>,
    ) -> OutboxMessage {
        OutboxMessage {
            destination: destination.into(),
            idempotency_key: idempotency_key.into(),
            payload: payload.into(),
            content_type: "application/json".to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{InvalidMessage, Meta, OutboxMessage};

    #[test]
    fn a_message_is_queued_only_with_a_destination_key_and_content_type_that_can_be_sent() {
        let ok = OutboxMessage::json("email", "thank-you:o-1", b"{}".to_vec());
        assert_eq!(ok.check(), Ok(()));
        let non_ascii = OutboxMessage::json("email", "merci:commande-é", b"{}".to_vec());
        assert_eq!(non_ascii.check(), Ok(()));
        let nbsp = OutboxMessage::json("email", "shop:x\u{a0}", b"{}".to_vec());
        assert_eq!(nbsp.check(), Ok(()), "no header trims U+00A0");
        let long = "k".repeat(1024);
        assert_eq!(
            OutboxMessage::json("email", long, Vec::new()).check(),
            Ok(())
        );
        for (key, why) in [
            ("", "is blank"),
            ("  ", "is blank"),
            ("k\r\nX-Injected: 1", "holds a control character"),
            ("k\0", "holds a control character"),
            (" k", "starts or ends with whitespace"),
            (&*"k".repeat(1025), "is longer than 1024 bytes"),
        ] {
            let msg = OutboxMessage::json("email", key, Vec::new());
            assert_eq!(
                msg.check(),
                Err(InvalidMessage::IdempotencyKey(why)),
                "{key:?}"
            );
        }
        for (destination, why) in [
            ("", "is empty"),
            ("my route", "holds whitespace or a control character"),
            ("\0x", "holds whitespace or a control character"),
            (&*"d".repeat(256), "is longer than 255 bytes"),
        ] {
            let msg = OutboxMessage::json(destination, "k", Vec::new());
            assert_eq!(
                msg.check(),
                Err(InvalidMessage::Destination(why)),
                "{destination:?}"
            );
        }
        let exchange = OutboxMessage::json("amq.topic:orders.*", "k", Vec::new());
        assert_eq!(exchange.check(), Ok(()), "exchanges and subjects");
        let mut msg = ok;
        msg.content_type = "text/plain;\tcharset=utf-8".to_owned();
        assert_eq!(msg.check(), Ok(()), "a tab inside is header whitespace");
        msg.content_type = "text/plain\n".to_owned();
        assert_eq!(
            msg.check(),
            Err(InvalidMessage::ContentType("holds a control character"))
        );
    }

    /// Headers read back from the stored lines are the ones kept, in order; a value or name
    /// that would not read back as written is not kept at all.
    #[test]
    fn headers_read_back_as_kept() {
        let mut meta = Meta::new(Some("application/json".into()));
        assert_eq!(meta.header_lines(), None, "no headers, no bytes");
        meta.push_header("content-type", "application/json");
        meta.push_header("x-empty", "");
        meta.push_header("x-colon", "a: b");
        meta.push_header("x-break", "a\nb");
        meta.push_header("x-return", "a\rb");
        meta.push_header("bad: name", "v");
        meta.push_header("bad:name", "v");
        let kept = [
            ("content-type", "application/json"),
            ("x-empty", ""),
            ("x-colon", "a: b"),
        ];
        assert_eq!(meta.headers().collect::<Vec<_>>(), kept);
        let stored = meta.header_lines().map(str::to_owned);
        let back = Meta::from_header_lines(meta.content_type.clone(), stored);
        assert_eq!(back, meta);
        assert_eq!(back.headers().collect::<Vec<_>>(), kept);
    }
}
