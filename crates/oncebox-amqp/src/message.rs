//! A delivery as the core reads it (headers, message id), and the quarantine: where messages
//! that can never be processed are published, with the reason, before they are acknowledged.

use std::borrow::Cow;

use lapin::message::Delivery;
use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, LongString, ShortString};
use lapin::{BasicProperties, Channel};
use oncebox_core::Source;
use oncebox_core::consume::{MessageHeaders, Reason};

/// Headers a quarantined message carries: the reason's slug, its detail, the queue it came
/// from and the source it was read for. Do not rename: operators' tooling reads them.
pub const QUARANTINE_HEADERS: [&str; 4] = [
    "x-oncebox-reason",
    "x-oncebox-detail",
    "x-oncebox-queue",
    "x-oncebox-source",
];

/// Where quarantined messages go: an exchange (it must exist and route the key somewhere;
/// an unroutable quarantine is an error, not a silent drop) and the routing key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quarantine {
    pub exchange: String,
    pub routing_key: String,
}

/// Why a message could not be quarantined; it is then requeued, never acknowledged.
#[derive(Debug, thiserror::Error)]
pub(crate) enum QuarantineError {
    #[error("publish failed: {0}")]
    Publish(#[from] lapin::Error),
    #[error("the broker refused the quarantined message")]
    Nacked,
    #[error("the quarantine exchange routed the message nowhere")]
    Unroutable,
}

/// The AMQP properties of a delivery.
pub(crate) struct Props<'a>(pub &'a BasicProperties);

impl MessageHeaders for Props<'_> {
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        let value = self.0.headers().as_ref()?.inner().get(name)?;
        text(value)
    }

    fn message_id(&self) -> Option<Cow<'_, [u8]>> {
        self.0
            .message_id()
            .as_ref()
            .map(|id| Cow::Borrowed(id.as_str().as_bytes()))
    }
}

/// Text and integers only: an id in a table, an array or a float is no id.
fn text(value: &AMQPValue) -> Option<Cow<'_, [u8]>> {
    let number = |n: i128| Some(Cow::Owned(n.to_string().into_bytes()));
    match value {
        AMQPValue::LongString(s) => Some(Cow::Borrowed(s.as_bytes())),
        AMQPValue::ShortString(s) => Some(Cow::Borrowed(s.as_str().as_bytes())),
        AMQPValue::ByteArray(b) => Some(Cow::Borrowed(b.as_slice())),
        AMQPValue::ShortShortInt(n) => number((*n).into()),
        AMQPValue::ShortShortUInt(n) => number((*n).into()),
        AMQPValue::ShortInt(n) => number((*n).into()),
        AMQPValue::ShortUInt(n) => number((*n).into()),
        AMQPValue::LongInt(n) => number((*n).into()),
        AMQPValue::LongUInt(n) => number((*n).into()),
        AMQPValue::LongLongInt(n) => number((*n).into()),
        _ => None,
    }
}

/// The broker's delivery count, where the queue keeps one (quorum queues).
pub(crate) fn delivery_count(props: &BasicProperties) -> Option<u32> {
    let value = props.headers().as_ref()?.inner().get("x-delivery-count")?;
    let n = String::from_utf8(text(value)?.into_owned()).ok()?;
    // The header counts earlier deliveries; this one is the next.
    n.parse::<u32>().ok().map(|n| n.saturating_add(1))
}

/// Publishes `delivery` to the quarantine with the reason and waits for the broker's confirm,
/// so the original is acknowledged only once its copy is safe.
pub(crate) async fn quarantine(
    channel: &Channel,
    to: &Quarantine,
    queue: &str,
    source: &Source,
    delivery: &Delivery,
    reason: &Reason,
) -> Result<(), QuarantineError> {
    let mut headers = delivery.properties.headers().clone().unwrap_or_default();
    for (name, value) in QUARANTINE_HEADERS
        .iter()
        .zip(reason.quarantine_values(queue, source))
    {
        headers.insert(
            ShortString::from(*name),
            AMQPValue::LongString(LongString::from(value)),
        );
    }
    // Persistent, whatever the original was: a quarantined message is kept for an operator.
    let properties = delivery
        .properties
        .clone()
        .with_headers(headers)
        .with_delivery_mode(2);
    let confirm = channel
        .basic_publish(
            to.exchange.as_str().into(),
            to.routing_key.as_str().into(),
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            &delivery.data,
            properties,
        )
        .await?
        .await?;
    if !confirm.is_ack() {
        return Err(QuarantineError::Nacked);
    }
    if confirm.take_message().is_some() {
        return Err(QuarantineError::Unroutable);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use lapin::types::{FieldArray, FieldTable};

    use super::*;

    #[test]
    fn headers_read_text_and_integers_only() {
        let mut table = FieldTable::default();
        table.insert("s".into(), AMQPValue::LongString("evt_1".into()));
        table.insert("n".into(), AMQPValue::LongLongInt(-42));
        table.insert("f".into(), AMQPValue::Double(1.5));
        table.insert("a".into(), AMQPValue::FieldArray(FieldArray::default()));
        table.insert("x-delivery-count".into(), AMQPValue::LongInt(2));
        let props = BasicProperties::default()
            .with_headers(table)
            .with_message_id("mid".into());
        let p = Props(&props);
        assert_eq!(p.header("s").as_deref(), Some(&b"evt_1"[..]));
        assert_eq!(p.header("n").as_deref(), Some(&b"-42"[..]));
        assert_eq!(p.header("f"), None);
        assert_eq!(p.header("a"), None);
        assert_eq!(p.header("absent"), None);
        assert_eq!(p.message_id().as_deref(), Some(&b"mid"[..]));
        assert_eq!(delivery_count(&props), Some(3), "two earlier deliveries");
        let bare = BasicProperties::default();
        assert_eq!(
            (Props(&bare).header("s"), Props(&bare).message_id()),
            (None, None)
        );
        assert_eq!(delivery_count(&bare), None);
    }
}
