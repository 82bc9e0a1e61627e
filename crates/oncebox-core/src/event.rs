//! An event as it enters a backend (key, payload, fingerprint) and an outbox message as it leaves.

use crate::fingerprint::{Fingerprint, FingerprintMode, PayloadError};
use crate::key::{Key, Source};

/// One delivery of an event, already authenticated and parsed at the edge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub key: Key,
    /// The exact bytes received; kept so a conflict can be audited and an event redelivered.
    pub payload: Vec<u8>,
    pub fingerprint: Fingerprint,
    /// How it arrived, kept for operators and for redelivery with the original content type.
    pub meta: Meta,
}

/// Transport details of an event: its content type and the request headers worth keeping.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Meta {
    pub content_type: Option<String>,
    /// Lowercase names, in arrival order; credentials (authorization, cookies) are never kept.
    pub headers: Vec<(String, String)>,
}

impl Meta {
    /// The headers as stored: `name: value` lines (an HTTP header value cannot hold a line
    /// break); `None` when there are none, so the library's events cost no extra bytes.
    pub fn header_lines(&self) -> Option<String> {
        if self.headers.is_empty() {
            return None;
        }
        let mut text = String::new();
        for (name, value) in &self.headers {
            text.push_str(name);
            text.push_str(": ");
            text.push_str(value);
            text.push('\n');
        }
        Some(text)
    }

    /// Headers read back from [`Meta::header_lines`]' form.
    pub fn parse_header_lines(text: Option<&str>) -> Vec<(String, String)> {
        text.unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once(": "))
            .map(|(n, v)| (n.to_owned(), v.to_owned()))
            .collect()
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
            meta: Meta::default(),
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

impl OutboxMessage {
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
