//! Fuzzes the signature header parsers (Standard Webhooks `v1,…` lists, Stripe `t=…,v1=…`,
//! GitHub `sha256=…`, `hmac-sha256` hex and base64) through `signature::verify`.
//!
//! Input: one byte picks the scheme; then newline-separated header values (Standard Webhooks:
//! `webhook-id`, `webhook-timestamp`, `webhook-signature`; the others: their one header) and
//! the body as the rest. Seeds carry real signatures under the secrets below, so the fuzzer
//! also explores rotation lists around a valid entry.
//!
//! Checks: nothing panics; the answer is deterministic; a header that is missing or malformed
//! is refused as such whatever the clock says (headers are judged before time and MACs); time
//! changes only the answer of timed schemes, and only into `TimestampOutOfTolerance`; an
//! accepted request reports exactly the id and timestamp it carried.

#![no_main]

mod common;

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use oncebox_core::Timestamp;
use oncebox_core::signature::{Scheme, Secret, SignatureError, verify};

/// The Standard Webhooks specification's example secret; the seeds are signed with it.
const SW_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// The secret the other schemes' seeds are signed with.
const SECRET: &str = "secret";
/// 2023-11-14T22:13:20Z, the clock of the first verification.
const NOW: Timestamp = Timestamp(1_700_000_000_000);

fuzz_target!(|data: &[u8]| {
    let Some((selector, rest)) = data.split_first() else {
        return;
    };
    let scheme = common::scheme(*selector);
    let (headers, body): (Vec<(&str, &[u8])>, &[u8]) = match &scheme {
        Scheme::StandardWebhooks => {
            let f = common::fields(rest, 4);
            let names = ["webhook-id", "webhook-timestamp", "webhook-signature"];
            (names.into_iter().zip(f.iter().copied()).collect(), f[3])
        }
        _ => {
            let f = common::fields(rest, 2);
            let name = match &scheme {
                Scheme::Stripe => "stripe-signature",
                Scheme::Github => "x-hub-signature-256",
                _ => "x-signature",
            };
            (vec![(name, f[0])], f[1])
        }
    };
    let secrets: Vec<Secret> = match &scheme {
        Scheme::None => Vec::new(),
        Scheme::StandardWebhooks => [SW_SECRET, "whsec_cm90YXRlZA=="]
            .iter()
            .map(|s| Secret::parse(&scheme, s).expect("valid secret"))
            .collect(),
        _ => [SECRET, "rotated"]
            .iter()
            .map(|s| Secret::parse(&scheme, s).expect("valid secret"))
            .collect(),
    };
    let headers = headers.as_slice();

    let lenient = verify(&scheme, &secrets, headers, body, NOW, Duration::MAX);
    assert_eq!(
        lenient,
        verify(&scheme, &secrets, headers, body, NOW, Duration::MAX),
        "verification is deterministic"
    );
    // Another clock, no tolerance at all: differs only where time is part of the answer.
    let strict = verify(
        &scheme,
        &secrets,
        headers,
        body,
        Timestamp(i64::MIN),
        Duration::ZERO,
    );
    match &lenient {
        Err(SignatureError::Missing { .. } | SignatureError::Malformed { .. }) => {
            assert_eq!(lenient, strict, "header errors do not depend on the clock");
        }
        // A parsed timestamp is never i64::MIN: the strict clock is always out of tolerance,
        // and that is decided before any MAC.
        _ if common::timed(&scheme) => {
            assert_eq!(strict, Err(SignatureError::TimestampOutOfTolerance));
        }
        _ => assert_eq!(lenient, strict, "{scheme:?} reads no clock"),
    }
    // `Duration::MAX` covers every i64 distance, so the lenient check never fails on time.
    assert_ne!(lenient, Err(SignatureError::TimestampOutOfTolerance));

    if let Ok(verified) = lenient {
        match &scheme {
            Scheme::StandardWebhooks => {
                let id = std::str::from_utf8(headers[0].1).expect("an accepted id is UTF-8");
                assert_eq!(verified.webhook_id.as_deref(), Some(id));
                assert!(verified.timestamp.is_some());
            }
            Scheme::Stripe => {
                assert_eq!(verified.webhook_id, None);
                assert!(verified.timestamp.is_some());
            }
            _ => {
                assert_eq!(verified.webhook_id, None);
                assert_eq!(verified.timestamp, None);
            }
        }
        if let Some(t) = verified.timestamp {
            assert!(t.millis() >= 0 && t.millis() % 1000 == 0, "{t}");
        }
    }
});
