//! A delivery as the core reads it (headers, message id), and the quarantine: where messages
//! that can never be processed are published, with the reason, before they are acknowledged.

use std::borrow::Cow;

use lapin::BasicProperties;
use lapin::types::AMQPValue;
use oncebox_core::consume::MessageHeaders;

/// Headers a quarantined message carries: the reason's slug, its detail, the queue it came
/// from and the source it was read for. Do not rename: operators' tooling reads them.
pub const QUARANTINE_HEADERS: [&str; 4] = [
    "x-oncebox-reason",
    "x-oncebox-detail",
    "x-oncebox-queue",
    "x-oncebox-source",
];

/// Headers a quarantined copy carries saying where the original was published: its exchange
/// (empty for the default exchange) and its routing key, so that an operator can publish it
/// back where it came from. Do not rename: operators' tooling reads them.
pub const ORIGIN_HEADERS: [&str; 2] = ["x-oncebox-exchange", "x-oncebox-routing-key"];

/// Where quarantined messages go: an exchange (it must exist and route the key somewhere;
/// an unroutable quarantine is an error, not a silent drop) and the routing key. The default
/// exchange with the consumed queue's own name is refused at start: it would route every
/// copy back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quarantine {
    pub exchange: String,
    pub routing_key: String,
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

    fn unreadable(&self, name: &str) -> Option<&'static str> {
        let value = self.0.headers().as_ref()?.inner().get(name)?;
        if text(value).is_some() {
            return None;
        }
        Some(match value {
            AMQPValue::Boolean(_) => "boolean",
            AMQPValue::Float(_) => "float",
            AMQPValue::Double(_) => "double",
            AMQPValue::DecimalValue(_) => "decimal",
            AMQPValue::Timestamp(_) => "timestamp",
            AMQPValue::FieldArray(_) => "array",
            AMQPValue::FieldTable(_) => "table",
            AMQPValue::Void => "void",
            _ => "value of another type",
        })
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

/// Whether `props` are those of a copy this queue quarantined for `reason`: quarantining it
/// again would only send it round once more when the quarantine routes back into the queue.
pub(crate) fn quarantined_here_for(props: &BasicProperties, queue: &str, reason: &str) -> bool {
    let p = Props(props);
    let is = |name: &str, value: &str| p.header(name).is_some_and(|v| &*v == value.as_bytes());
    is("x-oncebox-queue", queue) && is("x-oncebox-reason", reason)
}

/// The broker's delivery count, where the queue keeps one (quorum queues).
pub(crate) fn delivery_count(props: &BasicProperties) -> Option<u32> {
    let value = props.headers().as_ref()?.inner().get("x-delivery-count")?;
    let n = String::from_utf8(text(value)?.into_owned()).ok()?;
    // The header counts earlier deliveries; this one is the next.
    n.parse::<u32>().ok().map(|n| n.saturating_add(1))
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
        // Present but unreadable is told apart from absent: the key is invalid, not missing.
        assert_eq!(
            (p.unreadable("f"), p.unreadable("a")),
            (Some("double"), Some("array"))
        );
        assert_eq!((p.unreadable("s"), p.unreadable("absent")), (None, None));
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
