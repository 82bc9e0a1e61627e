//! A JetStream message as the core reads it (headers, `Nats-Msg-Id`), and the quarantine: a
//! subject, captured by a stream, where messages that can never be processed are published
//! with the reason before they are acknowledged.

use std::borrow::Cow;
use std::str::FromStr;

use async_nats::jetstream;
use async_nats::{HeaderMap, HeaderName};
use oncebox_core::Source;
use oncebox_core::consume::{MessageHeaders, Reason};

use crate::copy::{fit, kept_headers};

/// Headers a quarantined message carries: the reason's slug, its detail, the stream it came
/// from and the source it was read for. Do not rename: operators' tooling reads them.
pub const QUARANTINE_HEADERS: [&str; 4] = [
    "Oncebox-Reason",
    "Oncebox-Detail",
    "Oncebox-Stream",
    "Oncebox-Source",
];

/// Headers a quarantined copy carries saying where the original was: the subject it was
/// published to (so that an operator can publish the copy back there) and its sequence in the
/// stream read (so that it can be found there while the stream keeps it). The subject is left
/// out with the original headers when those do not fit. Do not rename: operators' tooling
/// reads them.
pub const ORIGIN_HEADERS: [&str; 2] = ["Oncebox-Subject", "Oncebox-Stream-Sequence"];

/// The header publishers put their message id in (JetStream's own publish dedup reads it too,
/// within its window; oncebox never relies on that window).
const MSG_ID: &str = "Nats-Msg-Id";

/// Why a message could not be quarantined; it is then requeued, never acknowledged.
#[derive(Debug, thiserror::Error)]
pub(crate) enum QuarantineError {
    #[error("publish failed: {0}")]
    Publish(#[from] jetstream::context::PublishError),
}

/// The headers of a message.
pub(crate) struct Headers<'a>(pub Option<&'a HeaderMap>);

impl MessageHeaders for Headers<'_> {
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        // Parsed, not passed as `&str`: the client panics on a name it cannot hold, and a
        // name no header can have is simply absent.
        let name = HeaderName::from_str(name).ok()?;
        let value: &str = self.0?.get(name)?.as_ref();
        Some(Cow::Borrowed(value.as_bytes()))
    }

    fn message_id(&self) -> Option<Cow<'_, [u8]>> {
        self.header(MSG_ID)
    }

    fn message_ids(&self) -> usize {
        self.header_values(MSG_ID).len()
    }

    fn header_values(&self, name: &str) -> Vec<Cow<'_, [u8]>> {
        let (Ok(name), Some(map)) = (HeaderName::from_str(name), self.0) else {
            return Vec::new();
        };
        map.get_all(name)
            .map(|v| {
                let value: &str = v.as_ref();
                Cow::Borrowed(value.as_bytes())
            })
            .collect()
    }
}

/// Publishes the message to the quarantine subject with the reason and waits for the stream's
/// acknowledgement, so the original is acknowledged only once its copy is stored. The copy is
/// cut to fit what the quarantine takes (see [`fit`]), which a failure would never change.
pub(crate) async fn quarantine(
    js: &jetstream::Context,
    subject: &str,
    stream: &str,
    source: &Source,
    message: &jetstream::Message,
    reason: &Reason,
) -> Result<(), QuarantineError> {
    let limit = copy_limit(js, subject).await;
    let kept = kept_headers(message.headers.as_ref(), message.subject.as_str());
    // The sequence is read from the message's reply subject; a client that cannot read it
    // leaves the header out rather than the copy.
    let sequence = message.info().ok().map(|info| info.stream_sequence);
    let copy = fit(
        &kept,
        reason,
        stream,
        source,
        sequence,
        message.payload.len(),
        limit,
    );
    let payload = message
        .payload
        .slice(..copy.payload_len.min(message.payload.len()));
    js.publish_with_headers(subject.to_owned(), copy.headers, payload)
        .await?
        .await?;
    Ok(())
}

/// The largest message the quarantine takes: the server's `max_payload` (what this client was
/// told when it connected), or the quarantine stream's `max_msg_size` if smaller. Read at each
/// quarantine, which is rare, so a stream changed since the start counts; unread (the stream
/// lookup failed) it is `max_payload` alone, and a copy the stream refuses is requeued.
async fn copy_limit(js: &jetstream::Context, subject: &str) -> usize {
    let max_payload = js.client().max_payload();
    let stream_max = async {
        let name = js.stream_by_subject(subject).await.ok()?;
        let stream = js.get_stream(name).await.ok()?;
        // Zero or negative: no limit of the stream's own.
        usize::try_from(stream.cached_info().config.max_message_size)
            .ok()
            .filter(|n| *n > 0)
    };
    stream_max.await.map_or(max_payload, |n| n.min(max_payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_lookups_never_panic() {
        let mut map = HeaderMap::new();
        map.insert("Event-Id", "evt_1");
        map.insert(MSG_ID, "msg_1");
        let h = Headers(Some(&map));
        assert_eq!(h.header("Event-Id").as_deref(), Some(&b"evt_1"[..]));
        assert_eq!(h.message_id().as_deref(), Some(&b"msg_1"[..]));
        for bad in ["", "a:b", "a b", "caf\u{e9}", "x\ny"] {
            assert_eq!(h.header(bad), None, "{bad:?}");
        }
        assert_eq!(Headers(None).header("Event-Id"), None);
    }

    /// A message id sent twice is refused as a header sent twice is: keyed by the first, the
    /// message could apply another event's effect under its key.
    #[test]
    fn a_message_id_sent_twice_is_refused() {
        use oncebox_core::consume::{KeyRule, MessageRules};
        let rules = MessageRules::new(Source::new("shop").unwrap(), KeyRule::MessageId);
        let mut map = HeaderMap::new();
        map.insert(MSG_ID, "msg_1");
        let body = br#"{}"#.to_vec();
        let once = rules.event(&Headers(Some(&map)), body.clone(), None);
        assert_eq!(
            once.map(|e| e.key.event_id.to_string()),
            Ok("msg_1".to_owned())
        );
        map.append(MSG_ID, "msg_2");
        let twice = rules.event(&Headers(Some(&map)), body, None);
        assert_eq!(
            twice.map(|_| ()).map_err(|e| e.slug()),
            Err("event-id-invalid")
        );
    }
}
