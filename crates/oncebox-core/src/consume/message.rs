//! How a broker message becomes an `Event`: where its key comes from (a header, the message id,
//! a JSON pointer or derived fields; never a broker coordinate), the body limit and the
//! fingerprint, or the reason it can never be processed.

use std::borrow::Cow;

use super::Reason;
use crate::event::{Event, Meta};
use crate::fingerprint::{FingerprintMode, PayloadError, derive_event_id};
use crate::hops::{HOPS_HEADER, NATS_HOPS_HEADER};
use crate::json::{self, Pointer, Value};
use crate::key::{EventId, Key, Source};

/// Where a message's event id comes from. Always something the producer wrote: a broker's
/// delivery tag, offset or sequence changes on redelivery and republishing, so it is never a key.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyRule {
    /// A message header (AMQP header table, NATS header), by exact name.
    Header(String),
    /// The producer's message id: AMQP's `message_id` property, NATS's `Nats-Msg-Id` header.
    /// JetStream drops a message whose `Nats-Msg-Id` the stream saw within its duplicate
    /// window before any consumer sees it, so there the same id with another payload inside
    /// the window is never refused as a conflict nor kept for audit (the first payload still
    /// wins): a key from the payload or another header keeps such conflicts in view.
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
    /// The type of header `name` when it is present but [`header`](Self::header) cannot read
    /// it (an AMQP float, table, timestamp, …): a key there is invalid, not missing. The
    /// default, for transports whose headers are all text, says `None`.
    fn unreadable(&self, name: &str) -> Option<&'static str> {
        let _ = name;
        None
    }
    /// The producer's message id, if any.
    fn message_id(&self) -> Option<Cow<'_, [u8]>>;
    /// How many values the message's id has. A transport that carries the id in a header a
    /// message may repeat (NATS's `Nats-Msg-Id`) counts every one; the default, for those that
    /// carry one at most (AMQP's property), counts [`message_id`](Self::message_id).
    fn message_ids(&self) -> usize {
        usize::from(self.message_id().is_some())
    }
    /// Every value of header `name`, for a transport that carries one name more than once
    /// (NATS); the default, for those that cannot (AMQP's table), is [`header`](Self::header).
    fn header_values(&self, name: &str) -> Vec<Cow<'_, [u8]>> {
        self.header(name).into_iter().collect()
    }
}

/// The hop count a message arrived with (`crate::hops`): the highest of every value of either
/// spelling, so that a sender in the loop cannot lower it by adding a header, and a value of a
/// type that is no text or integer (an AMQP float) is no count.
fn arrived_hops(headers: &impl MessageHeaders) -> Result<u32, Reason> {
    let names = [HOPS_HEADER, NATS_HOPS_HEADER];
    if names.iter().any(|name| headers.unreadable(name).is_some()) {
        return Err(Reason::Hops(crate::hops::HopsError::Invalid));
    }
    let values: Vec<_> = names
        .iter()
        .flat_map(|n| headers.header_values(n))
        .collect();
    crate::hops::highest(values.iter().map(|v| &**v)).map_err(Reason::Hops)
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
    /// The whole JSON payload is fingerprinted, except beside a key derived from business
    /// fields: then those fields are, so the same fact in a new envelope is a duplicate, not
    /// a conflict (set `fingerprint` to have more fields count).
    pub fn new(source: Source, key: KeyRule) -> MessageRules {
        let fingerprint = match &key {
            KeyRule::Derive(fields) => FingerprintMode::Fields(fields.clone()),
            _ => FingerprintMode::Json,
        };
        MessageRules {
            source,
            key,
            fingerprint,
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
        // Before the key: a message that went round too often is refused whatever it holds.
        let hops = arrived_hops(headers)?;
        let missing = |what: String| Reason::EventIdMissing(what);
        let invalid = |e: crate::InvalidKey| Reason::EventIdInvalid(e.to_string());
        let event_id = match &self.key {
            KeyRule::Header(name) => match (headers.header(name), headers.unreadable(name)) {
                // As the gateway refuses it: which of the values names the event? Reading the
                // first would apply one event under another's key.
                (Some(_), _) if headers.header_values(name).len() > 1 => {
                    return Err(Reason::EventIdInvalid(format!(
                        "header {name} sent more than once"
                    )));
                }
                (Some(v), _) => EventId::from_bytes(&v).map_err(invalid)?,
                (None, Some(kind)) => {
                    return Err(Reason::EventIdInvalid(format!(
                        "header {name} is a {kind}, not text or an integer"
                    )));
                }
                (None, None) => return Err(missing(format!("header {name} absent"))),
            },
            // As a repeated header: the first of several ids could name another event.
            KeyRule::MessageId if headers.message_ids() > 1 => {
                return Err(Reason::EventIdInvalid(
                    "the message id sent more than once".to_owned(),
                ));
            }
            KeyRule::MessageId => headers
                .message_id()
                .ok_or_else(|| missing("no message id".to_owned()))
                .and_then(|v| EventId::from_bytes(&v).map_err(invalid))?,
            KeyRule::Pointer(p) => {
                let doc = json::parse(&payload).map_err(|e| Reason::InvalidJson(e.to_string()))?;
                id_at(&doc, p)?
            }
            KeyRule::Derive(fields) => derive_event_id(&payload, fields)
                .map_err(|e| match e {
                    // The body is not JSON at all: say so, not that a field is missing.
                    PayloadError::Json(e) => Reason::InvalidJson(e.to_string()),
                    e => missing(e.to_string()),
                })
                .and_then(|id| EventId::new(id).map_err(invalid))?,
        };
        let key = Key::new(
            self.source.clone(),
            event_id.deliverable().map_err(invalid)?,
        );
        let event = Event::new(key, payload, &self.fingerprint)
            .map_err(|e| Reason::InvalidJson(e.to_string()))?;
        let content_type = content_type.filter(|c| sendable(c)).map(str::to_owned);
        Ok(event.with_meta(Meta::new(content_type).with_hops(hops)))
    }
}

/// Whether a message's content type can be stored and sent on as an HTTP header: at most 255
/// bytes of visible ASCII, spaces and tabs. Any other is dropped (the event is kept): a
/// relay could never build a request carrying it.
fn sendable(content_type: &str) -> bool {
    content_type.len() <= 255
        && content_type
            .bytes()
            .all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
}

/// A string, or an integer (written out in decimal, past 64 bits too, as the gateway takes
/// it); anything else at the pointer is invalid.
fn id_at(doc: &Value, p: &Pointer) -> Result<EventId, Reason> {
    let text = match doc.pointer(p) {
        None => return Err(Reason::EventIdMissing(format!("{p} absent"))),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.integer_text(EventId::MAX_LEN).ok_or_else(|| {
            Reason::EventIdInvalid(format!(
                "{p} is a number but not an integer of at most {} digits",
                EventId::MAX_LEN
            ))
        })?,
        Some(_) => return Err(Reason::EventIdInvalid(format!("{p} is not a string"))),
    };
    EventId::new(text).map_err(|e| Reason::EventIdInvalid(e.to_string()))
}
