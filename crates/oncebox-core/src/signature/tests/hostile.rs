//! Hostile and broken signature headers: every one is refused (but for entries the reference
//! libraries skip beside a valid one), none panics.

use std::slice;

use super::*;

#[test]
fn one_changed_byte_of_body_id_or_timestamp_fails() {
    let body = SW_BODY.as_bytes();
    for i in 0..body.len() {
        let mut tampered = body.to_vec();
        tampered[i] ^= 0x01;
        let secrets = [secret(&Scheme::StandardWebhooks, SW_SECRET)];
        let headers = sw_headers(SW_ID, "1614265330", SW_SIGNATURE);
        let result = verify(
            &Scheme::StandardWebhooks,
            &secrets,
            &headers,
            &tampered,
            at(SW_SECONDS),
            TOLERANCE,
        );
        assert_eq!(result, Err(SignatureError::Mismatch), "body byte {i}");
    }
    for i in 0..SW_ID.len() {
        let mut id = SW_ID.as_bytes().to_vec();
        id[i] ^= 0x01;
        let id = String::from_utf8(id).expect("ASCII stays UTF-8");
        let result = sw_verify(&sw_headers(&id, "1614265330", SW_SIGNATURE));
        assert_eq!(result, Err(SignatureError::Mismatch), "id byte {i}");
    }
    for timestamp in ["1614265331", "1614265329", "1614265320", "2614265330"] {
        let result = sw_verify(&sw_headers(SW_ID, timestamp, SW_SIGNATURE));
        assert!(result.is_err(), "{timestamp}");
    }
    for (scheme, key) in signed_schemes() {
        let headers = map(&sign(&scheme, &key, "evt", at(SW_SECONDS), b"amount=100"));
        let result = verify(
            &scheme,
            &[key],
            &headers,
            b"amount=900",
            at(SW_SECONDS),
            TOLERANCE,
        );
        assert_eq!(result, Err(SignatureError::Mismatch), "{scheme:?}");
    }
    let key = secret(&Scheme::Stripe, "s");
    let signed = sign(&Scheme::Stripe, &key, "", at(SW_SECONDS), b"x");
    let value = signed
        .first()
        .map(|(_, v)| v.replace("t=1614265330", "t=1614265331"))
        .unwrap_or_default();
    let result = verify(
        &Scheme::Stripe,
        &[key],
        &one("stripe-signature", &value),
        b"x",
        at(SW_SECONDS),
        TOLERANCE,
    );
    assert_eq!(result, Err(SignatureError::Mismatch));
}

#[test]
fn entries_that_are_not_version_and_signature_are_skipped_as_the_reference_libraries_do() {
    let spaced = [
        format!("{SW_SIGNATURE} "),
        format!(" {SW_SIGNATURE}"),
        format!("v1a,xyz  {SW_SIGNATURE}"),
        format!("junk {SW_SIGNATURE}"),
    ];
    for list in &spaced {
        let verified = sw_verify(&sw_headers(SW_ID, "1614265330", list));
        assert!(verified.is_ok(), "{list:?}: {verified:?}");
    }
}

#[test]
fn empty_signatures_are_malformed() {
    for list in ["v1,", "", " ", "v1, v1,", ",abc", "v1"] {
        assert_malformed(
            sw_verify(&sw_headers(SW_ID, "1614265330", list)),
            "webhook-signature",
        );
    }
    for (scheme, key) in signed_schemes() {
        for value in ["", "v1=", "t=1614265330,v1=", "sha256=", "t="] {
            let header = match &scheme {
                Scheme::StandardWebhooks => continue,
                Scheme::Stripe => "stripe-signature",
                Scheme::Github => "x-hub-signature-256",
                _ => "x-signature",
            };
            let result = verify(
                &scheme,
                slice::from_ref(&key),
                &one(header, value),
                b"",
                at(SW_SECONDS),
                TOLERANCE,
            );
            assert_malformed(result, header);
        }
    }
}

#[test]
fn every_prefix_of_a_valid_signature_is_malformed() {
    for cut in 0..SW_SIGNATURE.len() {
        let prefix = &SW_SIGNATURE[..cut];
        assert_malformed(
            sw_verify(&sw_headers(SW_ID, "1614265330", prefix)),
            "webhook-signature",
        );
    }
    for (scheme, key) in signed_schemes() {
        let signed = sign(&scheme, &key, "evt", at(SW_SECONDS), b"body");
        let Some((name, value)) = signed.last() else {
            panic!("{scheme:?} signs with a header");
        };
        let mut headers = map(&signed);
        for cut in 0..value.len() {
            headers.insert(name.clone(), value.as_bytes()[..cut].to_vec());
            let result = verify(
                &scheme,
                slice::from_ref(&key),
                &headers,
                b"body",
                at(SW_SECONDS),
                TOLERANCE,
            );
            assert_malformed(result, name);
        }
    }
}

#[test]
fn over_long_headers_are_malformed_even_with_a_valid_signature() {
    let padded = format!("{SW_SIGNATURE} v1a,{}", "A".repeat(MAX_HEADER_BYTES));
    assert_malformed(
        sw_verify(&sw_headers(SW_ID, "1614265330", &padded)),
        "webhook-signature",
    );
    let long_id = "i".repeat(MAX_HEADER_BYTES + 1);
    assert_malformed(
        sw_verify(&sw_headers(&long_id, "1614265330", SW_SIGNATURE)),
        "webhook-id",
    );
    for (scheme, key) in signed_schemes() {
        let mut signed = sign(&scheme, &key, "evt", at(SW_SECONDS), b"body");
        let Some((name, value)) = signed.last_mut() else {
            panic!("{scheme:?} signs with a header");
        };
        let name = name.clone();
        value.push_str(&"0".repeat(MAX_HEADER_BYTES));
        let result = verify(
            &scheme,
            &[key],
            &map(&signed),
            b"body",
            at(SW_SECONDS),
            TOLERANCE,
        );
        assert_eq!(
            result,
            Err(SignatureError::Malformed {
                header: name,
                reason: "longer than 65536 bytes"
            }),
        );
    }
}

#[test]
fn bad_base64_or_hex_is_malformed() {
    let valid_b64 = SW_SIGNATURE.trim_start_matches("v1,");
    let bad_lists = [
        "v1,!!!!".to_string(),
        format!("v1,{}", valid_b64.trim_end_matches('=')), // unpadded
        format!("v1,{valid_b64}="),                        // extra padding
        format!("v1,{}", &valid_b64[..40]),                // 30 bytes
        "v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=".to_string(), // 34 bytes
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OF=".to_string(), // non-zero trailing bits
        format!("v1,{}", valid_b64.replace('+', "-")),     // URL-safe alphabet
        "v1,!!!!  garbage".to_string(),                    // and entries that are skipped
    ];
    for list in &bad_lists {
        assert_malformed(
            sw_verify(&sw_headers(SW_ID, "1614265330", list)),
            "webhook-signature",
        );
    }
    let key = secret(&Scheme::Stripe, "s");
    let hex64 = "ab".repeat(32);
    let bad_stripe = [
        format!("t=1614265330,v1={}", "zz".repeat(32)),
        format!("t=1614265330,v1={}", &hex64[..63]),
        format!("t=1614265330,v1={hex64}00"),
    ];
    for value in &bad_stripe {
        let result = verify(
            &Scheme::Stripe,
            slice::from_ref(&key),
            &one("stripe-signature", value),
            b"",
            at(SW_SECONDS),
            TOLERANCE,
        );
        assert_malformed(result, "stripe-signature");
    }
    let gh = secret(&Scheme::Github, "s");
    for value in [
        format!("sha256={}", "g".repeat(64)),
        format!("sha1={hex64}"),
        format!("sha256= {hex64}"),
    ] {
        let result = verify(
            &Scheme::Github,
            slice::from_ref(&gh),
            &one("x-hub-signature-256", &value),
            b"",
            at(0),
            TOLERANCE,
        );
        assert_malformed(result, "x-hub-signature-256");
    }
}

#[test]
fn thousands_of_entries_in_a_rotation_list_are_malformed() {
    let too_many = |reason| SignatureError::Malformed {
        header: "webhook-signature".into(),
        reason,
    };
    // Short entries, so the list stays under the header size limit and the count is what trips.
    let mut short = vec!["v1a,x"; 9_999];
    short.push(SW_SIGNATURE);
    let list = short.join(" ");
    assert!(list.len() <= MAX_HEADER_BYTES);
    let result = sw_verify(&sw_headers(SW_ID, "1614265330", &list));
    assert_eq!(result, Err(too_many("more than 64 signatures")));
    // The limit itself is allowed: 63 other entries and the valid one.
    let at_limit = short[short.len() - MAX_SIGNATURES..].join(" ");
    assert!(sw_verify(&sw_headers(SW_ID, "1614265330", &at_limit)).is_ok());
    // Ten thousand full-size v1 entries trip the size limit first.
    let mut long = vec!["v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="; 9_999];
    long.push(SW_SIGNATURE);
    let result = sw_verify(&sw_headers(SW_ID, "1614265330", &long.join(" ")));
    assert_eq!(result, Err(too_many("longer than 65536 bytes")));

    let key = secret(&Scheme::Stripe, "s");
    let signed = sign(&Scheme::Stripe, &key, "", at(SW_SECONDS), b"x");
    let valid = signed.first().map(|(_, v)| v.clone()).unwrap_or_default();
    let wrong = format!(",v1={}", "00".repeat(32));
    for (count, reason) in [
        (900, "more than 64 v1 signatures"),
        (9_999, "longer than 65536 bytes"),
    ] {
        let flood = format!("{valid}{}", wrong.repeat(count));
        let result = verify(
            &Scheme::Stripe,
            slice::from_ref(&key),
            &one("stripe-signature", &flood),
            b"x",
            at(SW_SECONDS),
            TOLERANCE,
        );
        let expected = SignatureError::Malformed {
            header: "stripe-signature".into(),
            reason,
        };
        assert_eq!(result, Err(expected), "{count} entries");
    }
    let at_limit = format!("{valid}{}", wrong.repeat(MAX_SIGNATURES - 1));
    let result = verify(
        &Scheme::Stripe,
        &[key],
        &one("stripe-signature", &at_limit),
        b"x",
        at(SW_SECONDS),
        TOLERANCE,
    );
    assert!(result.is_ok(), "{result:?}");
}

#[test]
fn one_valid_among_several_entries_passes() {
    let list = format!(
        "v1a,c29tZXRoaW5nIGVsc2U= v1,{} {SW_SIGNATURE} v2,whatever",
        "A".repeat(43) + "="
    );
    assert!(sw_verify(&sw_headers(SW_ID, "1614265330", &list)).is_ok());

    let key = secret(&Scheme::Stripe, "s");
    let signed = sign(&Scheme::Stripe, &key, "", at(SW_SECONDS), b"x");
    let valid = signed.first().map(|(_, v)| v.clone()).unwrap_or_default();
    let v1 = valid.split(',').nth(1).unwrap_or_default();
    let header = format!(
        "t=1614265330,v1={},{v1},v0={},future=1",
        "00".repeat(32),
        "11".repeat(32)
    );
    let result = verify(
        &Scheme::Stripe,
        &[key],
        &one("stripe-signature", &header),
        b"x",
        at(SW_SECONDS),
        TOLERANCE,
    );
    assert!(result.is_ok(), "{result:?}");
}

#[test]
fn missing_headers_are_named() {
    let full = sw_headers(SW_ID, "1614265330", SW_SIGNATURE);
    for name in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
        let mut headers = full.clone();
        headers.remove(name);
        assert_eq!(
            sw_verify(&headers),
            Err(SignatureError::Missing {
                header: name.into()
            })
        );
    }
    for (scheme, key) in signed_schemes().into_iter().skip(1) {
        let result = verify(&scheme, &[key], &BTreeMap::new(), b"", at(0), TOLERANCE);
        assert!(
            matches!(result, Err(SignatureError::Missing { .. })),
            "{scheme:?}: {result:?}"
        );
    }
}

#[test]
fn webhook_id_must_be_non_empty_utf8() {
    let mut headers = sw_headers(SW_ID, "1614265330", SW_SIGNATURE);
    headers.insert("webhook-id".into(), vec![0xff, 0xfe]);
    assert_malformed(sw_verify(&headers), "webhook-id");
    assert_malformed(
        sw_verify(&sw_headers("", "1614265330", SW_SIGNATURE)),
        "webhook-id",
    );
}

#[test]
fn stripe_needs_exactly_one_timestamp_and_a_v1() {
    let key = secret(&Scheme::Stripe, "s");
    let v1 = format!("v1={}", "00".repeat(32));
    for value in [
        v1.clone(),
        format!("t=1614265330,t=1614265330,{v1}"),
        format!("t=1614265330,v0={}", "00".repeat(32)),
    ] {
        let result = verify(
            &Scheme::Stripe,
            slice::from_ref(&key),
            &one("stripe-signature", &value),
            b"",
            at(SW_SECONDS),
            TOLERANCE,
        );
        assert_malformed(result, "stripe-signature");
    }
}
