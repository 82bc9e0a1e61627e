//! Fuzzes event-id extraction as broker consumers do it in the core (`MessageRules::event`):
//! from a header, the message id, a JSON pointer into the body, or fields hashed into a
//! derived id.
//!
//! Input: a byte picking the rule (bits 0-1), whether the header is absent (bit 2) and a
//! 16-byte body limit (bit 3); then newline-separated header value, pointers (space-separated)
//! and the body as the rest.
//!
//! Checks: nothing panics and the answer is deterministic; an accepted event keeps the body,
//! fingerprints it as JSON (beside a derived id: the fields it is derived from) and carries a
//! valid event id taken exactly from where the rule says (header bytes, the string at the
//! pointer or the integer there in plain decimal, past 64 bits too, 64 lowercase hex digits
//! for a derived id); the body limit and JSON refusals are reported as such; and the body's
//! canonical re-serialisation — an equal value — yields the same key and fingerprint, or the
//! same refusal.

#![no_main]

mod common;

use std::borrow::Cow;

use libfuzzer_sys::fuzz_target;
use oncebox_core::consume::{KeyRule, MessageHeaders, MessageRules, Reason};
use oncebox_core::fingerprint::derive_event_id;
use oncebox_core::json::{self, Pointer, Value};
use oncebox_core::{EventId, FingerprintMode, Source};

struct Headers<'a>(Option<&'a [u8]>);

impl MessageHeaders for Headers<'_> {
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        (name == "x-event-id").then_some(Cow::Borrowed(self.0?))
    }
    fn message_id(&self) -> Option<Cow<'_, [u8]>> {
        self.0.map(Cow::Borrowed)
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((selector, rest)) = data.split_first() else {
        return;
    };
    let f = common::fields(rest, 3);
    let (value, pointers, body) = (f[0], f[1], f[2]);
    let Ok(pointers) = std::str::from_utf8(pointers) else {
        return;
    };
    let Ok(pointers) = pointers
        .split(' ')
        .filter(|p| !p.is_empty())
        .map(Pointer::parse)
        .collect::<Result<Vec<_>, _>>()
    else {
        return;
    };
    let key = match selector % 4 {
        0 => KeyRule::Header("x-event-id".to_owned()),
        1 => KeyRule::MessageId,
        2 => KeyRule::Pointer(pointers.first().cloned().unwrap_or_default()),
        _ => KeyRule::Derive(pointers.clone()),
    };
    let headers = Headers((selector & 4 == 0).then_some(value));
    let mut rules = MessageRules::new(Source::new("fuzz").expect("valid source"), key);
    if selector & 8 != 0 {
        rules.max_body = 16;
    }

    let result = rules.event(&headers, body.to_vec(), Some("application/json"));
    assert_eq!(
        result,
        rules.event(&headers, body.to_vec(), Some("application/json"))
    );
    let parsed = json::parse(body);
    if body.len() > rules.max_body {
        assert_eq!(
            result,
            Err(Reason::BodyTooLarge {
                limit: rules.max_body
            })
        );
        return;
    }
    match &result {
        Ok(event) => {
            assert_eq!(event.payload, body);
            assert_eq!(event.key.source.as_str(), "fuzz");
            // A derived id fingerprints the fields it is derived from; any other rule, the
            // whole JSON body.
            let mode = match &rules.key {
                KeyRule::Derive(fields) => FingerprintMode::Fields(fields.clone()),
                _ => FingerprintMode::Json,
            };
            assert_eq!(Ok(event.fingerprint), mode.fingerprint(body));
            assert_eq!(event.meta.content_type.as_deref(), Some("application/json"));
            let id = event.key.event_id.as_str();
            assert_eq!(EventId::new(id).as_ref(), Ok(&event.key.event_id));
            let doc = parsed.as_ref().expect("an accepted body is JSON");
            match &rules.key {
                KeyRule::Header(_) | KeyRule::MessageId => {
                    assert_eq!(Some(id.as_bytes()), headers.0);
                }
                KeyRule::Pointer(p) => match doc.pointer(p) {
                    Some(Value::String(s)) => assert_eq!(id, s),
                    Some(Value::Number(n)) => assert_eq!(id, decimal(n)),
                    other => panic!("an id taken from {other:?}"),
                },
                KeyRule::Derive(fields) => {
                    assert!(
                        id.len() == 64
                            && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
                    );
                    assert_eq!(derive_event_id(body, fields).as_deref(), Ok(id));
                }
                _ => unreachable!("no other rule is built above"),
            }
        }
        Err(Reason::InvalidJson(_)) => assert!(parsed.is_err()),
        Err(_) => {}
    }

    // An equal value spelled canonically: the same event, or the same refusal.
    let Ok(doc) = parsed else {
        return;
    };
    let canonical = doc.canonical();
    if canonical.len() > rules.max_body {
        return;
    }
    let again = rules.event(&headers, canonical, Some("application/json"));
    match (&result, &again) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a.key, b.key);
            assert_eq!(a.fingerprint, b.fingerprint);
        }
        _ => assert_eq!(result, again),
    }
});

/// An integer's plain decimal text, read independently from the normal form's parts: the
/// sign, the significant digits and as many zeros as the exponent says (`0` for zero). Only
/// integers are taken as ids, so the exponent of one is never negative.
fn decimal(n: &oncebox_core::json::Number) -> String {
    let zeros = usize::try_from(n.exponent()).expect("an integer id");
    if n.digits().is_empty() {
        return "0".to_owned();
    }
    let sign = if n.negative() { "-" } else { "" };
    format!("{sign}{}{}", n.digits(), "0".repeat(zeros))
}
