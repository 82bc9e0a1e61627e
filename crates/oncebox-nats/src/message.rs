//! A JetStream message as the core reads it (headers, `Nats-Msg-Id`), and the quarantine: a
//! subject, captured by a stream, where messages that can never be processed are published
//! with the reason before they are acknowledged.

use std::borrow::Cow;
use std::str::FromStr;

use async_nats::jetstream;
use async_nats::{HeaderMap, HeaderName};
use oncebox_core::Source;
use oncebox_core::consume::{MessageHeaders, Reason};

/// Headers a quarantined message carries: the reason's slug, its detail, the stream it came
/// from and the source it was read for. Do not rename: operators' tooling reads them.
pub const QUARANTINE_HEADERS: [&str; 4] = [
    "Oncebox-Reason",
    "Oncebox-Detail",
    "Oncebox-Stream",
    "Oncebox-Source",
];

/// The header publishers put their message id in (JetStream's own publish dedup reads it too,
/// within its window; oncebox never relies on that window).
const MSG_ID: &str = "Nats-Msg-Id";

/// What a quarantined copy calls an original `Nats-*` header: `Oncebox-Original-Nats-Msg-Id`,
/// say. Do not rename: operators' tooling reads them.
const ORIGINAL_PREFIX: &str = "Oncebox-Original-";

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
}

/// Publishes the message to the quarantine subject with the reason and waits for the stream's
/// acknowledgement, so the original is acknowledged only once its copy is stored.
pub(crate) async fn quarantine(
    js: &jetstream::Context,
    subject: &str,
    stream: &str,
    source: &Source,
    message: &async_nats::Message,
    reason: &Reason,
) -> Result<(), QuarantineError> {
    // Every original header, but those JetStream acts on (`Nats-*`) renamed: the message id
    // would make the quarantine stream drop a second copy of the same id (say, two conflicting
    // payloads) as a duplicate; `Nats-Expected-*` make it refuse the copy (requeued then,
    // forever); `Nats-Rollup` would purge earlier copies; `Nats-TTL` would expire this one.
    let mut headers = HeaderMap::new();
    for (name, values) in message.headers.iter().flat_map(HeaderMap::iter) {
        let original: &str = name.as_ref();
        let is_nats = original
            .get(..5)
            .is_some_and(|p| p.eq_ignore_ascii_case("nats-"));
        let name = if is_nats {
            // A name that was valid stays valid with a prefix of header characters; if the
            // client disagrees, the value is dropped rather than kept under its own name.
            match HeaderName::from_str(&format!("{ORIGINAL_PREFIX}{original}")) {
                Ok(renamed) => renamed,
                Err(_) => continue,
            }
        } else {
            name.clone()
        };
        for value in values {
            headers.append(name.clone(), value.clone());
        }
    }
    for (name, value) in QUARANTINE_HEADERS
        .iter()
        .zip(reason.quarantine_values(stream, source))
    {
        // Header values are one line.
        headers.insert(*name, value.replace(['\r', '\n'], " ").as_str());
    }
    js.publish_with_headers(subject.to_owned(), headers, message.payload.clone())
        .await?
        .await?;
    Ok(())
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
}
