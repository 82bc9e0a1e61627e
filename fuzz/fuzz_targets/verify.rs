//! Fuzzes the sign/verify round trip of every scheme: what `signature::sign` produces over
//! fuzzed bytes must pass `signature::verify`, and any one-byte change must not.
//!
//! Input: a byte picking the scheme, a byte to XOR into one position (0: no change), that
//! position (2 bytes, little-endian, taken modulo the bytes that can change), the send time
//! (8 bytes, little-endian `i64` milliseconds), a byte for the number of rotated-out secrets
//! listed beside the signing one, then newline-separated secret, event id and body.
//!
//! Checks: a signature verifies with a configured secret list holding its secret anywhere, at
//! a clock up to 999 ms after the send time (signatures carry whole seconds), and reports the
//! second and the id it carried; a send time before 1970 or an empty Standard Webhooks id is
//! refused as malformed, never accepted; changing one byte of the secret, the body or any
//! header value makes verification fail — except changing the letter case of a hex MAC, which
//! verification accepts on purpose.

#![no_main]

mod common;

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use oncebox_core::Timestamp;
use oncebox_core::signature::{Scheme, Secret, SignatureError, sign, verify};

fuzz_target!(|data: &[u8]| {
    let Some((head, rest)) = data.split_first_chunk::<13>() else {
        return;
    };
    let scheme = common::scheme(head[0]);
    let flip = head[1];
    let position = usize::from(u16::from_le_bytes([head[2], head[3]]));
    let sent = Timestamp(i64::from_le_bytes(head[4..12].try_into().expect("8 bytes")));
    let decoys = usize::from(head[12] % 3);
    let f = common::fields(rest, 3);
    let (key, id, body) = (f[0], String::from_utf8_lossy(f[1]), f[2]);

    let signed = sign(&scheme, &Secret::from_bytes(key.to_vec()), &id, sent, body);
    let values: Vec<Vec<u8>> = signed.iter().map(|(_, v)| v.as_bytes().to_vec()).collect();
    let attempt = |key: &[u8], body: &[u8], values: &[Vec<u8>]| {
        // Rotated-out secrets before the signing one, so a match is not simply the first.
        let mut secrets: Vec<Secret> = (0..decoys)
            .map(|i| Secret::from_bytes([key, b"decoy", &[b'0' + i as u8]].concat()))
            .collect();
        secrets.push(Secret::from_bytes(key.to_vec()));
        let headers: Vec<(&str, &[u8])> = signed
            .iter()
            .zip(values)
            .map(|((name, _), value)| (name.as_str(), value.as_slice()))
            .collect();
        // Signatures carry whole seconds: the clock may be up to 999 ms past the second signed.
        verify(
            &scheme,
            &secrets,
            headers.as_slice(),
            body,
            sent,
            Duration::from_millis(999),
        )
    };

    let result = attempt(key, body, &values);
    let malformed = matches!(result, Err(SignatureError::Malformed { .. }));
    if common::timed(&scheme) && sent.millis() < 0 {
        assert!(malformed, "a send time before 1970 is refused: {result:?}");
        return;
    }
    if scheme == Scheme::StandardWebhooks && id.is_empty() {
        assert!(malformed, "an empty webhook-id is refused: {result:?}");
        return;
    }
    let verified = result.expect("a fresh signature verifies");
    if common::timed(&scheme) {
        let second = Timestamp(sent.millis().div_euclid(1000) * 1000);
        assert_eq!(verified.timestamp, Some(second));
    }
    if scheme == Scheme::StandardWebhooks {
        assert_eq!(verified.webhook_id.as_deref(), Some(&*id));
    }

    if flip == 0 || scheme == Scheme::None {
        return;
    }
    let (mut key, mut body, mut values) = (key.to_vec(), body.to_vec(), values);
    let total = key.len() + body.len() + values.iter().map(Vec::len).sum::<usize>();
    let mut at = position % total.max(1);
    let mut regions: Vec<(&mut Vec<u8>, bool)> = vec![(&mut key, false), (&mut body, false)];
    regions.extend(values.iter_mut().map(|v| (v, true)));
    for (bytes, is_header) in regions {
        if let Some(byte) = bytes.get_mut(at) {
            let changed = *byte ^ flip;
            let case_only = byte.is_ascii_alphabetic() && changed.eq_ignore_ascii_case(byte);
            if is_header && common::hex_encoded(&scheme) && case_only {
                // Hex is accepted in either case: the same MAC, rightly still valid.
                return;
            }
            *byte = changed;
            break;
        }
        at -= bytes.len();
    }
    let tampered = attempt(&key, &body, &values);
    assert!(
        tampered.is_err(),
        "one changed byte still verifies: {tampered:?}"
    );
});
