//! Where a body's or a header's id is taken from beyond the plain cases of `keys.rs`: integer
//! ids past 64 bits, and a signed source that takes no id from a header its signature leaves
//! out.

use axum::http::StatusCode;
use oncebox_testkit::run;

use crate::support::{TestGateway, post};

/// Integer ids in the body are taken in plain decimal, past `i64` too (senders with unsigned
/// 64-bit ids): refused, every retry of theirs would be. Fractions and ids longer than an id
/// may be are refused.
#[test]
fn integer_ids_are_taken_in_decimal_past_64_bits_too() {
    run(async {
        let gw = TestGateway::new();
        for (body, id) in [
            (r#"{"id":18446744073709551615}"#, "18446744073709551615"),
            (r#"{"id":-9223372036854775809}"#, "-9223372036854775809"),
            (r#"{"id":1e3}"#, "1000"),
            (r#"{"id":-0}"#, "0"),
        ] {
            let a = gw.send(post("open", &[], body)).await;
            assert_eq!(a.status, StatusCode::ACCEPTED, "{body}: {:?}", a.json());
            assert_eq!(a.json()["event_id"], id, "{body}");
        }
        for body in [r#"{"id":1.5}"#.to_owned(), format!(r#"{{"id":1e{}}}"#, 255)] {
            let a = gw.send(post("open", &[], body.clone())).await;
            assert_eq!(
                (a.status, a.slug().as_str()),
                (StatusCode::BAD_REQUEST, "event-id-invalid"),
                "{body}"
            );
        }
    });
}

/// A signed source given the default id rule (a library caller's `SourcePolicy` may; the
/// binary's configuration never does) takes no id from a header its signature does not cover:
/// a captured request sent again under `Idempotency-Key: 2` is the same event, replayed.
#[test]
fn a_signed_source_takes_no_id_from_an_unsigned_header() {
    use oncebox_core::signature::{Encoding, Scheme, Secret, sign};
    run(async {
        let gw = TestGateway::new();
        let scheme = Scheme::HmacSha256 {
            header: "x-signature".into(),
            encoding: Encoding::Base64,
            prefix: String::new(),
        };
        let secret = Secret::parse(&scheme, "hmac-secret").unwrap();
        let body = r#"{"id":"h1"}"#;
        let signed = sign(&scheme, &secret, "", crate::support::NOW, body.as_bytes());
        let mut answers = Vec::new();
        for key in ["1", "2"] {
            let mut headers: Vec<(&str, &str)> = signed
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_str()))
                .collect();
            headers.push(("idempotency-key", key));
            answers.push(gw.send(post("hmac", &headers, body)).await);
        }
        assert_eq!(answers[0].status, StatusCode::ACCEPTED);
        assert_eq!(answers[0].json()["event_id"], "h1");
        assert!(
            answers[1].replayed(),
            "the same event: {:?}",
            answers[1].json()
        );
        assert_eq!(gw.rows(), 1);
    });
}
