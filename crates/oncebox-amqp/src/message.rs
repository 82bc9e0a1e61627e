//! A delivery as the core reads it (headers, message id), and the quarantine: where messages
//! that can never be processed are published, with the reason, before they are acknowledged.

use std::borrow::Cow;

use std::collections::BTreeMap;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
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

/// Headers a copy never keeps: RabbitMQ routes a message to every routing key listed in them
/// (sender-selected distribution), so a copy would reach queues besides the quarantine.
const ROUTING_HEADERS: [&str; 2] = ["CC", "BCC"];

/// The broker's delivery history, which a copy keeps only under another name (the prefix
/// below): a copy an operator sends back into a queue would otherwise carry the original's
/// `x-delivery-count`, read by [`delivery_count`] as earlier failures, and be quarantined again
/// at its first failure. `x-first-death-*` and `x-last-death-*` are RabbitMQ's summary of
/// `x-death`. Do not rename the kept names: operators' tooling reads them.
const HISTORY_HEADERS: [&str; 8] = [
    "x-delivery-count",
    "x-death",
    "x-first-death-exchange",
    "x-first-death-queue",
    "x-first-death-reason",
    "x-last-death-exchange",
    "x-last-death-queue",
    "x-last-death-reason",
];
const HISTORY_PREFIX: &str = "x-oncebox-original-";

/// The properties of `delivery`'s quarantined copy: the original's, with the reason's headers
/// added, made persistent (a quarantined message is kept for an operator), and without what
/// would lose or scatter the only remaining copy: the per-message TTL (`expiration`), the
/// `CC`/`BCC` routing headers, and `user_id`, which the broker refuses unless it names the
/// publishing connection's own user (and a refusal closes the channel). The broker's delivery
/// history (`x-delivery-count`, `x-death`, …) is kept as `x-oncebox-original-…`.
pub(crate) fn copy_properties(
    original: &BasicProperties,
    reason: &Reason,
    queue: &str,
    source: &Source,
) -> BasicProperties {
    let mut headers: BTreeMap<ShortString, AMQPValue> = original
        .headers()
        .as_ref()
        .map(|h| h.inner().clone())
        .unwrap_or_default();
    for name in ROUTING_HEADERS {
        headers.remove(name);
    }
    for name in HISTORY_HEADERS {
        if let Some(value) = headers.remove(name) {
            // `x-` dropped: `x-oncebox-original-delivery-count`, `x-oncebox-original-death`.
            let kept = ShortString::from(format!("{HISTORY_PREFIX}{}", &name[2..]));
            // A copy of a copy keeps the first history: the original's is the one to read.
            headers.entry(kept).or_insert(value);
        }
    }
    for (name, value) in QUARANTINE_HEADERS
        .iter()
        .zip(reason.quarantine_values(queue, source))
    {
        headers.insert(
            ShortString::from(*name),
            AMQPValue::LongString(LongString::from(value)),
        );
    }
    let mut copy = BasicProperties::default()
        .with_headers(FieldTable::from(headers))
        .with_delivery_mode(2);
    let o = original;
    if let Some(v) = o.content_type() {
        copy = copy.with_content_type(v.clone());
    }
    if let Some(v) = o.content_encoding() {
        copy = copy.with_content_encoding(v.clone());
    }
    if let Some(v) = o.priority() {
        copy = copy.with_priority(*v);
    }
    if let Some(v) = o.correlation_id() {
        copy = copy.with_correlation_id(v.clone());
    }
    if let Some(v) = o.reply_to() {
        copy = copy.with_reply_to(v.clone());
    }
    if let Some(v) = o.message_id() {
        copy = copy.with_message_id(v.clone());
    }
    if let Some(v) = o.timestamp() {
        copy = copy.with_timestamp(*v);
    }
    if let Some(v) = o.kind() {
        copy = copy.with_type(v.clone());
    }
    if let Some(v) = o.app_id() {
        copy = copy.with_app_id(v.clone());
    }
    if let Some(v) = o.cluster_id() {
        copy = copy.with_cluster_id(v.clone());
    }
    copy
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

    #[test]
    fn quarantined_copy_keeps_what_identifies_the_message_and_drops_what_would_lose_or_scatter_it()
    {
        let mut table = FieldTable::default();
        table.insert("CC".into(), AMQPValue::FieldArray(FieldArray::default()));
        table.insert("BCC".into(), AMQPValue::FieldArray(FieldArray::default()));
        table.insert("x-event-id".into(), AMQPValue::LongString("evt_1".into()));
        table.insert("x-delivery-count".into(), AMQPValue::LongLongInt(4));
        table.insert(
            "x-death".into(),
            AMQPValue::FieldArray(FieldArray::default()),
        );
        table.insert(
            "x-first-death-reason".into(),
            AMQPValue::LongString("delivery_limit".into()),
        );
        let original = BasicProperties::default()
            .with_expiration("100".into())
            .with_user_id("someone-else".into())
            .with_message_id("mid".into())
            .with_content_type("application/json".into())
            .with_correlation_id("corr".into())
            .with_priority(3)
            .with_headers(table);
        let reason = Reason::EventIdMissing("no message id".to_owned());
        let source = Source::new("shop").unwrap();
        let copy = copy_properties(&original, &reason, "orders", &source);
        let headers = copy.headers().clone().unwrap_or_default();
        let names: Vec<&str> = headers.inner().keys().map(|k| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "x-event-id",
                "x-oncebox-detail",
                "x-oncebox-original-death",
                "x-oncebox-original-delivery-count",
                "x-oncebox-original-first-death-reason",
                "x-oncebox-queue",
                "x-oncebox-reason",
                "x-oncebox-source"
            ]
        );
        // Sent back into a queue, the copy starts its count again; the original's is kept.
        assert_eq!(delivery_count(&original), Some(5));
        assert_eq!(delivery_count(&copy), None);
        assert_eq!(
            headers.inner().get("x-oncebox-original-delivery-count"),
            Some(&AMQPValue::LongLongInt(4))
        );
        assert_eq!((copy.expiration(), copy.user_id()), (&None, &None));
        assert_eq!(copy.delivery_mode(), &Some(2));
        assert_eq!(copy.message_id(), original.message_id());
        assert_eq!(copy.content_type(), original.content_type());
        assert_eq!(copy.correlation_id(), original.correlation_id());
        assert_eq!(copy.priority(), original.priority());

        // The copy sent back, failing again: its second copy keeps the first history, and the
        // newer count goes.
        let mut again = copy.headers().clone().unwrap_or_default();
        again.insert("x-delivery-count".into(), AMQPValue::LongLongInt(1));
        again.insert(
            "x-last-death-reason".into(),
            AMQPValue::LongString("rejected".into()),
        );
        let second = copy_properties(&copy.with_headers(again), &reason, "orders", &source);
        let kept = second.headers().clone().unwrap_or_default();
        assert_eq!(
            kept.inner().get("x-oncebox-original-delivery-count"),
            Some(&AMQPValue::LongLongInt(4))
        );
        assert!(kept.inner().get("x-delivery-count").is_none());
        assert!(kept.inner().get("x-last-death-reason").is_none());
        assert!(
            kept.inner()
                .contains_key("x-oncebox-original-last-death-reason")
        );
    }
}
