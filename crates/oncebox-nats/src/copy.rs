//! The quarantined copy, built to fit the largest message the quarantine takes: a copy larger
//! than the server's `max_payload` (or its stream's `max_msg_size`) is never stored, and its
//! message would be requeued forever. What does not fit is cut, and the copy says so: first the
//! detail, then the payload, last the original headers.

use std::str::FromStr;

use async_nats::{HeaderMap, HeaderName};
use oncebox_core::Source;
use oncebox_core::consume::{MAX_DETAIL, Reason};

use crate::message::{ORIGIN_HEADERS, QUARANTINE_HEADERS};

/// On a copy whose payload was cut: the original payload's length in bytes. Do not rename:
/// operators' tooling reads it.
pub const PAYLOAD_TRUNCATED: &str = "Oncebox-Payload-Truncated";

/// On a copy that left out the original's headers: their size on the wire, in bytes. Do not
/// rename: operators' tooling reads it.
pub const HEADERS_DROPPED: &str = "Oncebox-Headers-Dropped";

/// What a copy calls an original `Nats-*` header: `Oncebox-Original-Nats-Msg-Id`, say. Do not
/// rename: operators' tooling reads them.
const ORIGINAL_PREFIX: &str = "Oncebox-Original-";

/// The least of the detail a copy keeps before its payload is cut: enough to tell the error.
const DETAIL_FLOOR: usize = 128;

/// The most headers JetStream stores with a message, in bytes on the wire: it refuses a
/// larger block ("header size exceeds maximum allowed of 64k"), whatever `max_payload` says.
/// An original can have nearly that much, and its copy adds the reason's headers.
const MAX_HEADERS: usize = u16::MAX as usize;

/// A copy ready to publish: its headers, and how many leading bytes of the payload it carries.
#[derive(Debug)]
pub(crate) struct Fitted {
    pub headers: HeaderMap,
    pub payload_len: usize,
}

/// Every original header, but those JetStream acts on (`Nats-*`) renamed: the message id would
/// make the quarantine stream drop a second copy of the same id (say, two conflicting payloads)
/// as a duplicate; `Nats-Expected-*` make it refuse the copy (requeued then, forever);
/// `Nats-Rollup` would purge earlier copies; `Nats-TTL` would expire this one. With them the
/// subject the original was published to (`Oncebox-Subject`), which goes only with them: its
/// length is the publisher's, so the least copy a stream must take cannot count on it.
pub(crate) fn kept_headers(original: Option<&HeaderMap>, subject: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, values) in original.into_iter().flat_map(HeaderMap::iter) {
        let text: &str = name.as_ref();
        let is_nats = text
            .get(..5)
            .is_some_and(|p| p.eq_ignore_ascii_case("nats-"));
        let name = if is_nats {
            // A name that was valid stays valid with a prefix of header characters; if the
            // client disagrees, the value is dropped rather than kept under its own name.
            match HeaderName::from_str(&format!("{ORIGINAL_PREFIX}{text}")) {
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
    // A subject holds no line breaks or spaces; the value replaces any the original had.
    headers.insert(ORIGIN_HEADERS[0], subject);
    headers
}

/// The copy of a message with headers `kept` (see [`kept_headers`]) and a payload of
/// `payload_len` bytes, read at `sequence` of its stream (`Oncebox-Stream-Sequence`, where the
/// client could read it), quarantined for `reason`, in at most `limit` bytes on the wire
/// (headers and payload, as the server counts them) and with at most [`MAX_HEADERS`] of
/// headers. Cut in this order until it fits: the detail, down to [`DETAIL_FLOOR`]; the payload,
/// marked [`PAYLOAD_TRUNCATED`]; the original headers, marked [`HEADERS_DROPPED`]. Past that (a
/// limit smaller than the copy's own headers, which `bind` refuses for the stream) the copy is
/// as small as it gets and may not fit.
pub(crate) fn fit(
    kept: &HeaderMap,
    reason: &Reason,
    read_from: &str,
    source: &Source,
    sequence: Option<u64>,
    payload_len: usize,
    limit: usize,
) -> Fitted {
    let [slug, detail, read_from, source] = reason.quarantine_values(read_from, source);
    let [reason_h, detail_h, from_h, source_h] = QUARANTINE_HEADERS;
    let sequence = sequence.map(|n| n.to_string());
    let build = |kept: &HeaderMap, detail: &str, marks: &[(&str, String)]| {
        let mut h = kept.clone();
        let ours = [
            (reason_h, &*slug),
            (from_h, &*read_from),
            (source_h, &*source),
        ];
        let at = sequence.as_deref().map(|n| (ORIGIN_HEADERS[1], n));
        let marks = marks.iter().map(|(n, v)| (*n, v.as_str()));
        for (name, value) in ours
            .into_iter()
            .chain(at)
            .chain([(detail_h, detail)])
            .chain(marks)
        {
            // Header values are one line.
            h.insert(name, value.replace(['\r', '\n'], " ").as_str());
        }
        h
    };
    // The bytes left beside headers `h` and `payload` bytes, in all and for more headers;
    // `None` when they do not fit.
    let spare = |h: &HeaderMap, payload: usize| {
        let size = wire_len(h);
        let total = limit.checked_sub(size.saturating_add(payload))?;
        Some((total, MAX_HEADERS.checked_sub(size)?))
    };

    let whole = build(kept, &detail, &[]);
    if spare(&whole, payload_len).is_some() {
        return copy(whole, payload_len);
    }
    // The detail shorter, everything else whole: it takes what is left beside them.
    if let Some((total, headers)) = spare(&build(kept, "", &[]), payload_len)
        && total.min(headers) >= DETAIL_FLOOR.min(detail.len())
    {
        let detail = reason.detail_within(total.min(headers));
        return copy(build(kept, &detail, &[]), payload_len);
    }
    // The shortest detail, with why the copy was cut; then the payload cut (it cannot be
    // whole beside even that), or, if the original headers leave no room, those dropped.
    let why = format!(
        "{} [copy cut to fit what the quarantine takes: {limit} bytes in all (the server's \
         max_payload or its stream's max_msg_size), at most {MAX_HEADERS} of them headers]",
        reason.detail_within(DETAIL_FLOOR)
    );
    let truncated = (PAYLOAD_TRUNCATED, payload_len.to_string());
    let cut = build(kept, &why, std::slice::from_ref(&truncated));
    if let Some((total, _)) = spare(&cut, 0) {
        return copy(cut, payload_len.min(total));
    }
    let dropped = (HEADERS_DROPPED, wire_len(kept).to_string());
    let none = HeaderMap::new();
    let bare = build(&none, &why, std::slice::from_ref(&dropped));
    if spare(&bare, payload_len).is_some() {
        return copy(bare, payload_len);
    }
    let least = build(&none, &why, &[truncated, dropped]);
    let left = limit.saturating_sub(wire_len(&least));
    copy(least, payload_len.min(left))
}

fn copy(headers: HeaderMap, payload_len: usize) -> Fitted {
    Fitted {
        headers,
        payload_len,
    }
}

/// The size of `headers` as the client sends them and the server counts them against
/// `max_payload`: `NATS/1.0\r\n`, each `name: value\r\n`, then `\r\n` (the client's own count is
/// private to it).
pub(crate) fn wire_len(headers: &HeaderMap) -> usize {
    let lines = headers.iter().flat_map(|(name, values)| {
        let name: &str = name.as_ref();
        values
            .iter()
            .map(move |v| name.len() + ": ".len() + v.as_str().len() + "\r\n".len())
    });
    "NATS/1.0\r\n".len() + lines.sum::<usize>() + "\r\n".len()
}

/// The least `max_msg_size` a quarantine stream must allow: the largest a copy gets with all
/// its cuts made, for a consumer reading `read_from` for `source` (numbers at their longest).
pub(crate) fn least_limit(read_from: &str, source: &Source) -> usize {
    let longest = Reason::EventIdInvalid("x".repeat(MAX_DETAIL));
    let least = fit(
        &HeaderMap::new(),
        &longest,
        read_from,
        source,
        Some(u64::MAX),
        usize::MAX,
        0,
    );
    // The numbers in the marks and in the detail may be longer than those of this one.
    wire_len(&least.headers) + 3 * usize::MAX.to_string().len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(*n, *v);
        }
        h
    }

    fn get(h: &HeaderMap, name: &str) -> Option<String> {
        h.get(name).map(|v| v.as_str().to_owned())
    }

    #[test]
    fn wire_len_counts_what_the_client_sends() {
        let h = headers(&[("A", "1"), ("A", "22"), ("Bb", "")]);
        let sent = "NATS/1.0\r\nA: 1\r\nA: 22\r\nBb: \r\n\r\n";
        assert_eq!(wire_len(&h), sent.len());
        assert_eq!(wire_len(&HeaderMap::new()), "NATS/1.0\r\n\r\n".len());
    }

    #[test]
    fn a_copy_is_cut_detail_first_then_payload_then_headers_and_always_fits() {
        let source = Source::new("shop").unwrap();
        let reason = Reason::HandlerFailed {
            attempts: 1,
            error: "e".repeat(5000),
        };
        let original = headers(&[
            ("Nats-Msg-Id", "m1"),
            ("X-Big", &"b".repeat(3000)),
            ("Oncebox-Subject", "a copy's own"),
        ]);
        let kept = kept_headers(Some(&original), "orders.paid");
        assert!(kept.get("Oncebox-Original-Nats-Msg-Id").is_some());
        assert_eq!(
            get(&kept, "Oncebox-Subject").as_deref(),
            Some("orders.paid")
        );
        let at = Some(42);
        let fit = |payload, limit| fit(&kept, &reason, "ORDERS", &source, at, payload, limit);
        let size = |c: &Fitted| wire_len(&c.headers) + c.payload_len;

        // Room for everything: whole (the detail at its usual bound).
        let whole = fit(100, 1 << 20);
        assert_eq!(whole.payload_len, 100);
        assert_eq!(
            get(&whole.headers, "Oncebox-Detail").unwrap().len(),
            MAX_DETAIL
        );
        assert_eq!(get(&whole.headers, PAYLOAD_TRUNCATED), None);
        let origin = ORIGIN_HEADERS.map(|h| get(&whole.headers, h));
        assert_eq!(origin, [Some("orders.paid".into()), Some("42".into())]);

        // A little short: only the detail is cut.
        let limit = size(&whole) - 500;
        let detail_cut = fit(100, limit);
        assert_eq!(size(&detail_cut), limit);
        assert_eq!(detail_cut.payload_len, 100);
        assert!(
            get(&detail_cut.headers, "Oncebox-Detail")
                .unwrap()
                .contains("[cut: ")
        );

        // Far short: the payload is cut, its length and the reason said.
        let payload_cut = fit(10_000, 5_000);
        assert!(size(&payload_cut) <= 5_000);
        assert!(payload_cut.payload_len > 0 && payload_cut.payload_len < 10_000);
        assert_eq!(
            get(&payload_cut.headers, PAYLOAD_TRUNCATED).as_deref(),
            Some("10000")
        );
        assert!(get(&payload_cut.headers, "X-Big").is_some());
        let detail = get(&payload_cut.headers, "Oncebox-Detail").unwrap();
        assert!(detail.contains("takes: 5000 bytes in all"), "{detail}");

        // Smaller than the original headers: they go too.
        let least = least_limit("ORDERS", &source);
        let bare = fit(10_000, least);
        assert!(size(&bare) <= least, "{} > {least}", size(&bare));
        assert_eq!(get(&bare.headers, "X-Big"), None);
        assert_eq!(
            get(&bare.headers, HEADERS_DROPPED),
            Some(wire_len(&kept).to_string())
        );
        assert_eq!(
            get(&bare.headers, "Oncebox-Reason").as_deref(),
            Some("handler-failed")
        );
        // The stream's sequence stays: the original can still be found by it.
        let origin = ORIGIN_HEADERS.map(|h| get(&bare.headers, h));
        assert_eq!(origin, [None, Some("42".into())]);
        // With the headers gone a small payload stays whole and unmarked.
        let small = fit(10, least);
        assert_eq!(
            (small.payload_len, get(&small.headers, PAYLOAD_TRUNCATED)),
            (10, None)
        );

        // Headers near JetStream's 64 KiB: the detail is cut to what is left of them, and
        // when too little is left, the original headers go (the payload, which fits, stays).
        for (huge, kept_whole) in [(64_800, true), (65_400, false)] {
            let near = kept_headers(Some(&headers(&[("X-Huge", &"h".repeat(huge))])), "o");
            let copy = super::fit(&near, &reason, "ORDERS", &source, at, 100, 1 << 20);
            assert!(wire_len(&copy.headers) <= MAX_HEADERS, "{huge}");
            assert_eq!(copy.payload_len, 100);
            assert_eq!(get(&copy.headers, "X-Huge").is_some(), kept_whole);
            let dropped = (!kept_whole).then(|| wire_len(&near).to_string());
            assert_eq!(get(&copy.headers, HEADERS_DROPPED), dropped);
            let detail = get(&copy.headers, "Oncebox-Detail").unwrap();
            assert!(detail.contains("[cut: "), "{detail}");
        }

        // No limit, however small, and no length, however large, panics.
        for (payload, limit) in [(usize::MAX, 0), (0, 0), (usize::MAX, usize::MAX), (5, 1)] {
            let _ = fit(payload, limit);
        }
    }
}
