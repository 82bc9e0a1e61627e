//! Tests for webhook signatures: published vectors, hostile headers, tolerance edges, rotation.

mod hostile;
mod props;
mod senders;
mod timestamps;

use std::collections::BTreeMap;
use std::slice;
use std::time::Duration;

use super::*;

/// The Standard Webhooks spec's published example.
const SW_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SW_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
const SW_SECONDS: i64 = 1_614_265_330;
const SW_BODY: &str = r#"{"test": 2432232314}"#;
const SW_SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

const TOLERANCE: Duration = Duration::from_secs(300);

fn at(seconds: i64) -> Timestamp {
    Timestamp(seconds * 1000)
}

fn secret(scheme: &Scheme, configured: &str) -> Secret {
    Secret::parse(scheme, configured).expect("valid secret")
}

fn map(pairs: &[(String, String)]) -> BTreeMap<String, Vec<u8>> {
    pairs
        .iter()
        .map(|(n, v)| (n.clone(), v.clone().into_bytes()))
        .collect()
}

fn sw_headers(id: &str, timestamp: &str, signature: &str) -> BTreeMap<String, Vec<u8>> {
    map(&[
        ("webhook-id".into(), id.into()),
        ("webhook-timestamp".into(), timestamp.into()),
        ("webhook-signature".into(), signature.into()),
    ])
}

/// Verifies `headers` for the spec example's body at the spec example's time.
fn sw_verify(headers: &BTreeMap<String, Vec<u8>>) -> Result<Verified, SignatureError> {
    let secrets = [secret(&Scheme::StandardWebhooks, SW_SECRET)];
    verify(
        &Scheme::StandardWebhooks,
        &secrets,
        headers,
        SW_BODY.as_bytes(),
        at(SW_SECONDS),
        TOLERANCE,
    )
}

fn one(name: &str, value: &str) -> BTreeMap<String, Vec<u8>> {
    map(&[(name.into(), value.into())])
}

fn assert_malformed(result: Result<Verified, SignatureError>, header: &str) {
    match result {
        Err(SignatureError::Malformed { header: h, .. }) if h == header => {}
        other => panic!("expected {header} malformed, got {other:?}"),
    }
}

/// Every scheme that carries a signature, with a secret configured for it.
fn signed_schemes() -> Vec<(Scheme, Secret)> {
    let hmac = |encoding, prefix: &str| Scheme::HmacSha256 {
        header: "X-Signature".into(),
        encoding,
        prefix: prefix.into(),
    };
    vec![
        (
            Scheme::StandardWebhooks,
            secret(&Scheme::StandardWebhooks, SW_SECRET),
        ),
        (Scheme::Stripe, secret(&Scheme::Stripe, "whsec_stripe")),
        (Scheme::Github, secret(&Scheme::Github, "gh secret")),
        (
            hmac(Encoding::Hex, "sha256="),
            Secret::from_bytes(b"h".to_vec()),
        ),
        (
            hmac(Encoding::Base64, ""),
            Secret::from_bytes(b"b".to_vec()),
        ),
    ]
}

#[test]
fn github_known_vector_verifies() {
    let scheme = Scheme::Github;
    let key = secret(&scheme, "It's a Secret to Everybody");
    let expected = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
    let headers = [("X-Hub-Signature-256", expected.as_bytes())];
    let verified = verify(
        &scheme,
        slice::from_ref(&key),
        &headers,
        b"Hello, World!",
        at(0),
        TOLERANCE,
    );
    assert_eq!(
        verified,
        Ok(Verified {
            timestamp: None,
            webhook_id: None
        })
    );
    let signed = sign(&scheme, &key, "ignored", at(0), b"Hello, World!");
    assert_eq!(signed, [("x-hub-signature-256".into(), expected.into())]);
}

#[test]
fn standard_webhooks_spec_example_verifies() {
    let verified = sw_verify(&sw_headers(SW_ID, "1614265330", SW_SIGNATURE));
    assert_eq!(
        verified,
        Ok(Verified {
            timestamp: Some(at(SW_SECONDS)),
            webhook_id: Some(SW_ID.into()),
        })
    );
    let key = secret(&Scheme::StandardWebhooks, SW_SECRET);
    let signed = sign(
        &Scheme::StandardWebhooks,
        &key,
        SW_ID,
        Timestamp(1_614_265_330_999),
        SW_BODY.as_bytes(),
    );
    assert_eq!(
        signed,
        [
            ("webhook-id".into(), SW_ID.into()),
            ("webhook-timestamp".into(), "1614265330".into()),
            ("webhook-signature".into(), SW_SIGNATURE.into()),
        ]
    );
}

#[test]
fn stripe_hand_computed_vector_verifies() {
    // Computed independently with Python's standard library:
    // hmac.new(b"whsec_test_secret", b'1700000000.{"id":"evt_1","object":"event"}',
    //          hashlib.sha256).hexdigest()
    // The `whsec_` prefix is part of Stripe's key: Stripe secrets are used as raw UTF-8.
    let header = "t=1700000000,v1=0c8670ed117751cc551a20e35839447075c42800ea3cf3e8a2fbda99cd1e6edd";
    let body = br#"{"id":"evt_1","object":"event"}"#;
    let key = secret(&Scheme::Stripe, "whsec_test_secret");
    let verified = verify(
        &Scheme::Stripe,
        slice::from_ref(&key),
        &one("Stripe-Signature", header),
        body,
        at(1_700_000_000),
        TOLERANCE,
    );
    assert_eq!(verified.map(|v| v.timestamp), Ok(Some(at(1_700_000_000))));
    let signed = sign(&Scheme::Stripe, &key, "ignored", at(1_700_000_000), body);
    assert_eq!(signed, [("stripe-signature".into(), header.into())]);
    // Items that are not `key=value` are skipped, as Stripe's libraries skip them.
    for padded in [
        format!("{header},"),
        format!("{header},x"),
        format!(",{header}"),
    ] {
        let verified = verify(
            &Scheme::Stripe,
            slice::from_ref(&key),
            &one("Stripe-Signature", &padded),
            body,
            at(1_700_000_000),
            TOLERANCE,
        );
        assert!(verified.is_ok(), "{padded}: {verified:?}");
    }
}

#[test]
fn every_scheme_round_trips_sign_then_verify() {
    let body = br#"{"id":"evt_42"}"#;
    for (scheme, key) in signed_schemes() {
        let headers = map(&sign(&scheme, &key, "evt_42", at(SW_SECONDS), body));
        let verified = verify(&scheme, &[key], &headers, body, at(SW_SECONDS), TOLERANCE);
        assert!(verified.is_ok(), "{scheme:?}: {verified:?}");
    }
}

#[test]
fn hmac_hex_is_accepted_in_either_case_and_needs_its_prefix() {
    let scheme = Scheme::HmacSha256 {
        header: "X-Signature".into(),
        encoding: Encoding::Hex,
        prefix: "sha256=".into(),
    };
    let key = Secret::from_bytes(b"k".to_vec());
    let signed = sign(&scheme, &key, "", at(0), b"body");
    let value = signed.first().map(|(_, v)| v.clone()).unwrap_or_default();
    let upper = format!(
        "sha256={}",
        value.trim_start_matches("sha256=").to_uppercase()
    );
    let check = |v: &str| {
        verify(
            &scheme,
            slice::from_ref(&key),
            &one("x-signature", v),
            b"body",
            at(0),
            TOLERANCE,
        )
    };
    assert!(check(&value).is_ok());
    assert!(check(&upper).is_ok());
    assert_malformed(check(value.trim_start_matches("sha256=")), "x-signature");
    assert_malformed(
        check(&format!("SHA256={}", value.trim_start_matches("sha256="))),
        "x-signature",
    );
}

#[test]
fn long_and_empty_keys_are_hashed_as_hmac_specifies() {
    // Expected tags from Python: hmac.new(key, b"body", hashlib.sha256).hexdigest().
    let cases: [(Vec<u8>, &str); 4] = [
        (
            Vec::new(),
            "7ec3619ea7f921721b6d8bec83ea2d0c6d557e0b164daf577e62c8cc88ed74ae",
        ),
        (
            vec![b'k'; 64],
            "2e213d30b446410b3c21ed0982394dd2add15ccc4da5abab1cac32e7fd6eb01f",
        ),
        (
            vec![b'k'; 65],
            "2da24f5c5e8c4884fbeebd56a313b1578530a805d626213a9338445723ad28f6",
        ),
        (
            vec![b'k'; 200],
            "0f251ee8bf342a5adda9c08be11ca526e68e9b3b0df4b31f8dfaf626c95a6846",
        ),
    ];
    let scheme = Scheme::HmacSha256 {
        header: "x-mac".into(),
        encoding: Encoding::Hex,
        prefix: String::new(),
    };
    for (key, expected) in cases {
        let len = key.len();
        let signed = sign(&scheme, &Secret::from_bytes(key), "", at(0), b"body");
        assert_eq!(
            signed,
            [("x-mac".into(), expected.into())],
            "key of {len} bytes"
        );
    }
}

#[test]
fn secret_rotation_accepts_either_configured_secret() {
    for (scheme, _) in signed_schemes() {
        let old = secret(&scheme, "whsec_b2xkIHNlY3JldCBvbGQgc2VjcmV0");
        let new = secret(&scheme, "whsec_bmV3IHNlY3JldCBuZXcgc2VjcmV0");
        let other = secret(&scheme, "whsec_b3RoZXIgc291cmNlIHNlY3JldA==");
        let configured = [old.clone(), new.clone()];
        for signer in [&old, &new] {
            let headers = map(&sign(&scheme, signer, "evt", at(SW_SECONDS), b"x"));
            assert!(
                verify(
                    &scheme,
                    &configured,
                    &headers,
                    b"x",
                    at(SW_SECONDS),
                    TOLERANCE
                )
                .is_ok()
            );
        }
        let headers = map(&sign(&scheme, &other, "evt", at(SW_SECONDS), b"x"));
        let result = verify(
            &scheme,
            &configured,
            &headers,
            b"x",
            at(SW_SECONDS),
            TOLERANCE,
        );
        assert_eq!(result, Err(SignatureError::Mismatch), "{scheme:?}");
    }
}

#[test]
fn a_secret_of_one_source_never_verifies_another_source() {
    for (scheme, source_a) in signed_schemes() {
        let source_b = secret(&scheme, "whsec_c291cmNlIGIgaGFzIGl0cyBvd24=");
        let headers = map(&sign(&scheme, &source_a, "evt", at(SW_SECONDS), b"x"));
        let result = verify(
            &scheme,
            &[source_b],
            &headers,
            b"x",
            at(SW_SECONDS),
            TOLERANCE,
        );
        assert_eq!(result, Err(SignatureError::Mismatch), "{scheme:?}");
        // No secret at all fails closed.
        let result = verify(&scheme, &[], &headers, b"x", at(SW_SECONDS), TOLERANCE);
        assert_eq!(result, Err(SignatureError::Mismatch), "{scheme:?}");
    }
}

#[test]
fn none_scheme_accepts_anything_without_a_timestamp() {
    let result = verify(
        &Scheme::None,
        &[],
        &BTreeMap::new(),
        b"anything",
        Timestamp(i64::MIN),
        Duration::ZERO,
    );
    assert_eq!(
        result,
        Ok(Verified {
            timestamp: None,
            webhook_id: None
        })
    );
    assert!(
        sign(
            &Scheme::None,
            &Secret::from_bytes(Vec::new()),
            "",
            at(0),
            b""
        )
        .is_empty()
    );
}

#[test]
fn header_lookup_ignores_case_and_takes_the_first() {
    let headers: [(&str, &[u8]); 3] = [("X-A", b"1"), ("x-a", b"2"), ("x-b", b"3")];
    assert_eq!(Headers::get(&headers, "x-a"), Some(&b"1"[..]));
    assert_eq!(Headers::get(&headers[..], "x-b"), Some(&b"3"[..]));
    assert_eq!(Headers::get(&headers, "x-c"), None);
    // The gateway may hand over a trait object for its own header map.
    let dynamic: &dyn Headers = &headers;
    let result = verify(&Scheme::Github, &[], dynamic, b"", at(0), TOLERANCE);
    assert_eq!(
        result,
        Err(SignatureError::Missing {
            header: "x-hub-signature-256".into()
        })
    );
}

#[test]
fn secret_debug_and_display_never_show_the_value() {
    let key = secret(&Scheme::Github, "hunter2-very-secret");
    for shown in [
        format!("{key:?}"),
        format!("{key}"),
        format!("{:?}", Some(&key)),
    ] {
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("Secret(***)"), "{shown}");
    }
}

#[test]
fn configured_secrets_follow_their_scheme() {
    let sw = Scheme::StandardWebhooks;
    let with_prefix = secret(&sw, SW_SECRET);
    let without = secret(&sw, SW_SECRET.trim_start_matches("whsec_"));
    let sig = |k: &Secret| sign(&sw, k, SW_ID, at(SW_SECONDS), SW_BODY.as_bytes());
    assert_eq!(
        sig(&with_prefix),
        sig(&without),
        "the whsec_ prefix is optional"
    );
    assert!(
        Secret::parse(&sw, "whsec_c2VjcmV0").is_ok(),
        "padding is optional in configuration"
    );
    assert_eq!(
        Secret::parse(&sw, "whsec_not base64!").err(),
        Some(SecretError::NotBase64)
    );
    assert_eq!(Secret::parse(&sw, "whsec_").err(), Some(SecretError::Empty));
    assert_eq!(
        Secret::parse(&Scheme::Stripe, "").err(),
        Some(SecretError::Empty)
    );
    assert_eq!(
        Secret::parse(&Scheme::None, "x").err(),
        Some(SecretError::SchemeTakesNoSecret)
    );
    // Stripe keeps the prefix as key bytes: the same text is a different key than under SW.
    let stripe = secret(&Scheme::Stripe, SW_SECRET);
    let as_sw = secret(&sw, SW_SECRET);
    let headers = map(&sign(
        &sw,
        &stripe,
        SW_ID,
        at(SW_SECONDS),
        SW_BODY.as_bytes(),
    ));
    let result = verify(
        &sw,
        &[as_sw],
        &headers,
        SW_BODY.as_bytes(),
        at(SW_SECONDS),
        TOLERANCE,
    );
    assert_eq!(result, Err(SignatureError::Mismatch));
    let message = SecretError::NotBase64.to_string();
    assert!(
        message.contains("base64") && message.contains("whsec_"),
        "{message}"
    );
}
