//! Signature timestamps: tolerance in both directions, and hostile values refused without panic.

use std::slice;

use super::*;

#[test]
fn timestamps_within_tolerance_pass_and_outside_fail_in_both_directions() {
    for scheme in [Scheme::StandardWebhooks, Scheme::Stripe] {
        let key = secret(&scheme, SW_SECRET);
        // Signed times are whole seconds; the clock reading is not: the bounds hold anywhere
        // within the second (a signature exactly 300 s old failed 999 ms into it).
        for (offset, ok, into_second) in [0, 1, 999].into_iter().flat_map(|ms| {
            [
                (0, true),
                (299, true),
                (300, true),
                (301, false),
                (-299, true),
                (-300, true),
                (-301, false),
            ]
            .map(|(offset, ok)| (offset, ok, ms))
        }) {
            let now = Timestamp(at(SW_SECONDS).0 + into_second);
            let headers = map(&sign(&scheme, &key, "evt", at(SW_SECONDS + offset), b"x"));
            let result = verify(
                &scheme,
                slice::from_ref(&key),
                &headers,
                b"x",
                now,
                TOLERANCE,
            );
            if ok {
                assert!(
                    result.is_ok(),
                    "{scheme:?} {offset} (+{into_second} ms): {result:?}"
                );
            } else {
                assert_eq!(
                    result,
                    Err(SignatureError::TimestampOutOfTolerance),
                    "{scheme:?} {offset} (+{into_second} ms)"
                );
            }
        }
        let now = at(SW_SECONDS);
        // Out of tolerance wins over a wrong signature: no MAC is computed for stale requests.
        let headers = map(&sign(&scheme, &key, "evt", at(SW_SECONDS - 301), b"x"));
        let result = verify(
            &scheme,
            slice::from_ref(&key),
            &headers,
            b"tampered",
            now,
            TOLERANCE,
        );
        assert_eq!(result, Err(SignatureError::TimestampOutOfTolerance));
    }
}

#[test]
fn hostile_timestamps_are_rejected_without_panic() {
    let malformed_texts = [
        "-1",
        "-9223372036854775808",
        "9223372036854775807", // fits i64 seconds, not i64 milliseconds
        "9223372036854776",
        "999999999999999999999999999999",
        "+5",
        " 5",
        "5 ",
        "5.0",
        "",
        "0x10",
        "1e9",
        "01614265330",
        "\u{663}",
    ];
    for text in malformed_texts {
        assert_malformed(
            sw_verify(&sw_headers(SW_ID, text, SW_SIGNATURE)),
            "webhook-timestamp",
        );
        let stripe = format!("t={text},v1={}", "00".repeat(32));
        let key = secret(&Scheme::Stripe, "s");
        let result = verify(
            &Scheme::Stripe,
            &[key],
            &one("stripe-signature", &stripe),
            b"",
            at(SW_SECONDS),
            TOLERANCE,
        );
        assert_malformed(result, "stripe-signature");
    }
    for text in ["0", "99999999999", "9223372036854775"] {
        let result = sw_verify(&sw_headers(SW_ID, text, SW_SIGNATURE));
        assert_eq!(
            result,
            Err(SignatureError::TimestampOutOfTolerance),
            "{text}"
        );
    }
    let headers = sw_headers(SW_ID, "1614265330", SW_SIGNATURE);
    let secrets = [secret(&Scheme::StandardWebhooks, SW_SECRET)];
    for now in [i64::MIN, -1, i64::MAX] {
        let result = verify(
            &Scheme::StandardWebhooks,
            &secrets,
            &headers,
            SW_BODY.as_bytes(),
            Timestamp(now),
            TOLERANCE,
        );
        assert_eq!(result, Err(SignatureError::TimestampOutOfTolerance));
    }
    let forever = verify(
        &Scheme::StandardWebhooks,
        &secrets,
        &headers,
        SW_BODY.as_bytes(),
        Timestamp(i64::MIN),
        Duration::MAX,
    );
    assert!(forever.is_ok());
}
