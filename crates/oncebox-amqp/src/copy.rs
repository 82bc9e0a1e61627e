//! A quarantined copy's properties: the original's, made safe to keep (nothing that would
//! expire, scatter or refuse it) and marked with the reason, cut to fit the one frame that
//! carries them.

use std::collections::BTreeMap;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use oncebox_core::Source;
use oncebox_core::consume::Reason;

use crate::message::{ORIGIN_HEADERS, QUARANTINE_HEADERS};

/// On a copy that left out the original's headers: the bytes its content header would have
/// taken with them, without the reason's. Do not rename: operators' tooling reads it.
pub const HEADERS_DROPPED: &str = "x-oncebox-headers-dropped";

/// The least of the detail a copy keeps before the original headers are dropped.
const DETAIL_FLOOR: usize = 128;

/// Headers a copy never keeps: RabbitMQ routes a message to every routing key listed in them
/// (sender-selected distribution), so a copy would reach queues besides the quarantine.
const ROUTING_HEADERS: [&str; 2] = ["CC", "BCC"];

/// The broker's delivery history, which a copy keeps only under another name (the prefix
/// below): a copy an operator sends back into a queue would otherwise carry the original's
/// `x-delivery-count`, read by [`delivery_count`](crate::message::delivery_count) as earlier
/// failures, and be quarantined again at its first failure. `x-first-death-*` and
/// `x-last-death-*` are RabbitMQ's summary of `x-death`. Do not rename the kept names:
/// operators' tooling reads them.
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
/// and where the original was published (`published`: its exchange and routing key) added,
/// made persistent (a quarantined message is kept for an operator), and without what would
/// lose or scatter the only remaining copy: the per-message TTL (`expiration`), the
/// `CC`/`BCC` routing headers, and `user_id`, which the broker refuses unless it names the
/// publishing connection's own user (and a refusal closes the channel). The broker's delivery
/// history (`x-delivery-count`, `x-death`, …) is kept as `x-oncebox-original-…`.
///
/// The properties travel in one content-header frame, which RabbitMQ refuses past the
/// connection's `frame_max` by closing the connection: every try would end the same way, the
/// message back in the queue each time. So they are cut to fit: the detail first, down to
/// [`DETAIL_FLOOR`], then the original headers dropped, marked [`HEADERS_DROPPED`].
pub(crate) fn copy_properties(
    original: &BasicProperties,
    reason: &Reason,
    queue: &str,
    source: &Source,
    published: [&str; 2],
    frame_max: usize,
) -> BasicProperties {
    let kept = kept_headers(original);
    let [slug, detail, queue, source] = reason.quarantine_values(queue, source);
    let [reason_h, detail_h, queue_h, source_h] = QUARANTINE_HEADERS;
    let [exchange_h, routing_key_h] = ORIGIN_HEADERS;
    let [exchange, routing_key] = published;
    let build =
        |kept: &BTreeMap<ShortString, AMQPValue>, detail: &str, marks: &[(&str, String)]| {
            let mut headers = kept.clone();
            let ours = [
                (reason_h, &*slug),
                (queue_h, &*queue),
                (source_h, &*source),
                (exchange_h, exchange),
                (routing_key_h, routing_key),
            ];
            let marks = marks.iter().map(|(n, v)| (*n, v.as_str()));
            for (name, value) in ours.into_iter().chain([(detail_h, detail)]).chain(marks) {
                let value = AMQPValue::LongString(LongString::from(value));
                headers.insert(ShortString::from(name), value);
            }
            with_original(original, headers)
        };
    // RabbitMQ's own bound on a frame's payload: `frame_max` less the frame's envelope.
    let limit = frame_max.saturating_sub(8);
    let whole = build(&kept, &detail, &[]);
    if header_frame_len(&whole) <= limit {
        return whole;
    }
    let bare = header_frame_len(&build(&kept, "", &[]));
    if let Some(room) = limit.checked_sub(bare)
        && room >= DETAIL_FLOOR.min(detail.len())
    {
        return build(&kept, &reason.detail_within(room), &[]);
    }
    let why = format!(
        "{detail} [original headers dropped: the copy's properties must fit one frame, the \
         connection's frame_max of {frame_max} bytes]"
    );
    let dropped = (
        HEADERS_DROPPED,
        header_frame_len(&with_original(original, kept)).to_string(),
    );
    build(&BTreeMap::new(), &why, &[dropped])
}

/// The original's headers a copy keeps (see [`copy_properties`]).
fn kept_headers(original: &BasicProperties) -> BTreeMap<ShortString, AMQPValue> {
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
    headers
}

/// The size of the content-header frame's payload for `props`: class, weight and body size,
/// then the properties as lapin encodes them.
fn header_frame_len(props: &BasicProperties) -> usize {
    let encoded = lapin::protocol::basic::gen_properties::<Vec<u8>>(props)(Vec::new().into());
    // An encoding that fails is no size: the copy is cut as far as it goes.
    encoded.map_or(usize::MAX, |written| 12 + written.write.len())
}

/// The copy's properties: `headers`, persistent, and what the original has of the rest but
/// `expiration` and `user_id`.
fn with_original(
    original: &BasicProperties,
    headers: BTreeMap<ShortString, AMQPValue>,
) -> BasicProperties {
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
    use crate::message::delivery_count;

    /// RabbitMQ's default.
    const FRAME_MAX: usize = 131_072;

    fn copy_properties(
        original: &BasicProperties,
        reason: &Reason,
        queue: &str,
        source: &Source,
    ) -> BasicProperties {
        super::copy_properties(original, reason, queue, source, ["shop", "paid"], FRAME_MAX)
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
                "x-oncebox-exchange",
                "x-oncebox-original-death",
                "x-oncebox-original-delivery-count",
                "x-oncebox-original-first-death-reason",
                "x-oncebox-queue",
                "x-oncebox-reason",
                "x-oncebox-routing-key",
                "x-oncebox-source"
            ]
        );
        let text = |name: &str| match headers.inner().get(name) {
            Some(AMQPValue::LongString(s)) => Some(s.as_bytes().to_vec()),
            _ => None,
        };
        assert_eq!(
            (text("x-oncebox-exchange"), text("x-oncebox-routing-key")),
            (Some(b"shop".to_vec()), Some(b"paid".to_vec()))
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

    #[test]
    fn a_copy_too_large_for_its_frame_cuts_the_detail_then_drops_the_original_headers() {
        let reason = Reason::HandlerFailed {
            attempts: 1,
            error: "e".repeat(5000),
        };
        let source = Source::new("shop").unwrap();
        let with_big = |n: usize| {
            let mut table = FieldTable::default();
            table.insert("x-big".into(), AMQPValue::LongString("b".repeat(n).into()));
            BasicProperties::default()
                .with_message_id("mid".into())
                .with_headers(table)
        };
        let header = |p: &BasicProperties, name: &str| match p.headers().as_ref()?.inner().get(name)
        {
            Some(AMQPValue::LongString(s)) => {
                Some(String::from_utf8_lossy(s.as_bytes()).into_owned())
            }
            _ => None,
        };
        let limit = FRAME_MAX - 8;
        for (big, kept) in [(1000, true), (129_900, true), (130_800, false)] {
            let original = with_big(big);
            let copy = copy_properties(&original, &reason, "orders", &source);
            assert!(header_frame_len(&copy) <= limit, "{big}");
            assert_eq!(header(&copy, "x-big").is_some(), kept, "{big}");
            assert_eq!(copy.message_id(), original.message_id());
            let detail = header(&copy, "x-oncebox-detail").unwrap();
            assert!(
                detail.starts_with("handler failed on 1 deliveries: eee"),
                "{detail}"
            );
            if kept {
                assert_eq!(header(&copy, HEADERS_DROPPED), None);
            } else {
                let dropped = header(&copy, HEADERS_DROPPED).unwrap();
                assert!(dropped.parse::<usize>().unwrap() > big, "{dropped}");
                assert!(detail.contains("original headers dropped"), "{detail}");
            }
        }
        // The middle one kept its headers by a shorter detail.
        let middle = copy_properties(&with_big(129_900), &reason, "orders", &source);
        let detail = header(&middle, "x-oncebox-detail").unwrap();
        assert!(detail.len() < 1024 && detail.contains("[cut: "), "{detail}");
    }
}
