//! Fuzzes timestamp parsing and the tolerance check of the timed schemes (Standard Webhooks'
//! `webhook-timestamp`, Stripe's `t=`), and `Timestamp`'s saturating arithmetic, at the edges
//! of `i64` (`i64::MIN` clocks, seconds whose milliseconds overflow, huge tolerances).
//!
//! Input: the clock (8 bytes, little-endian `i64` milliseconds), the tolerance (8 bytes,
//! little-endian `u64` milliseconds), a byte picking the scheme, then the timestamp text. The
//! text is signed correctly, so the answer depends on the timestamp alone.
//!
//! Checks, against an independent reading of the rule (decimal digits, no sign, no leading
//! zero, milliseconds fitting an `i64`): a valid timestamp is accepted exactly when it is
//! within the tolerance of the clock, in either direction and inclusive, and reported to the
//! millisecond; anything else is refused as malformed; no arithmetic overflows.

#![no_main]

mod common;

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use oncebox_core::Timestamp;
use oncebox_core::signature::{Encoding, Scheme, Secret, SignatureError, sign, verify};

const ID: &str = "msg_1";
const BODY: &[u8] = b"{}";

fuzz_target!(|data: &[u8]| {
    let (now, rest) = take_u64(data);
    let (tolerance, rest) = take_u64(rest);
    let Some((selector, text)) = rest.split_first() else {
        return;
    };
    let now = Timestamp(i64::from_le_bytes(now.to_le_bytes()));
    let tolerance = Duration::from_millis(tolerance);
    check_arithmetic(now, tolerance);

    let secret = Secret::from_bytes(b"secret".to_vec());
    let standard = selector % 2 == 0;
    let result = if standard {
        let signed = [ID.as_bytes(), b".", text, b".", BODY].concat();
        let signature = format!("v1,{}", tag(&secret, Encoding::Base64, &signed));
        let headers: [(&str, &[u8]); 3] = [
            ("webhook-id", ID.as_bytes()),
            ("webhook-timestamp", text),
            ("webhook-signature", signature.as_bytes()),
        ];
        verify(
            &Scheme::StandardWebhooks,
            &[secret],
            &headers,
            BODY,
            now,
            tolerance,
        )
    } else {
        let signed = [text, b".", BODY].concat();
        let value = [
            b"t=",
            text,
            b",v1=",
            tag(&secret, Encoding::Hex, &signed).as_bytes(),
        ]
        .concat();
        let headers: [(&str, &[u8]); 1] = [("stripe-signature", &value)];
        verify(&Scheme::Stripe, &[secret], &headers, BODY, now, tolerance)
    };

    match expected_millis(text) {
        Some(millis) => {
            // Signed times are whole seconds, and the clock is read to its second as well.
            let now_second = i128::from(now.millis()).div_euclid(1000) * 1000;
            let skew = (now_second - i128::from(millis)).unsigned_abs();
            if skew <= tolerance.as_millis() {
                let verified = result.expect("a valid timestamp within tolerance is accepted");
                assert_eq!(verified.timestamp, Some(Timestamp(millis)));
            } else {
                assert_eq!(result, Err(SignatureError::TimestampOutOfTolerance));
            }
        }
        // A comma in Stripe's `t=` splits the header itself: some other refusal is right then.
        None if !standard && text.contains(&b',') => assert!(result.is_err()),
        None => {
            let header = if standard {
                "webhook-timestamp"
            } else {
                "stripe-signature"
            };
            assert!(
                matches!(&result, Err(SignatureError::Malformed { header: h, .. }) if h == header),
                "{result:?}"
            );
        }
    }
});

/// The MAC of `signed` in `encoding`, through the public signer: `hmac-sha256` with no prefix
/// signs exactly the bytes it is given, so this is the tag a sender of the timed scheme sends.
fn tag(secret: &Secret, encoding: Encoding, signed: &[u8]) -> String {
    let scheme = Scheme::HmacSha256 {
        header: "x".to_owned(),
        encoding,
        prefix: String::new(),
    };
    let headers = sign(&scheme, secret, "", Timestamp(0), signed);
    headers.into_iter().next().expect("one header").1
}

/// The rule written out on its own: unix seconds in decimal digits, no sign, no leading zero,
/// whose milliseconds fit an `i64`.
fn expected_millis(text: &[u8]) -> Option<i64> {
    let digits = std::str::from_utf8(text).ok()?;
    if digits.is_empty()
        || !digits.bytes().all(|b| b.is_ascii_digit())
        || (digits.starts_with('0') && digits.len() > 1)
        || digits.len() > 30
    {
        return None;
    }
    let seconds: u128 = digits.parse().ok()?;
    i64::try_from(seconds.checked_mul(1000)?).ok()
}

/// `plus` and `minus` saturate at the ends of `i64` and are exact elsewhere.
fn check_arithmetic(t: Timestamp, d: Duration) {
    let exact = |v: i128| i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX });
    let ms = i128::try_from(d.as_millis()).expect("u64 milliseconds fit i128");
    assert_eq!(t.plus(d).millis(), exact(i128::from(t.millis()) + ms));
    assert_eq!(t.minus(d).millis(), exact(i128::from(t.millis()) - ms));
}

/// A little-endian `u64` from the first 8 bytes (zero-padded when shorter), and the rest.
fn take_u64(data: &[u8]) -> (u64, &[u8]) {
    let (head, rest) = data.split_at(data.len().min(8));
    let mut bytes = [0u8; 8];
    bytes[..head.len()].copy_from_slice(head);
    (u64::from_le_bytes(bytes), rest)
}
