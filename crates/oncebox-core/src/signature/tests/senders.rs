//! What real senders send beyond the specs' examples: Svix's own header names, and signature
//! lists holding an entry the reference libraries never match but do not refuse.

use std::slice;

use super::*;

/// The spec's example under Svix's names.
fn svix_headers(id: &str, timestamp: &str, signature: &str) -> BTreeMap<String, Vec<u8>> {
    map(&[
        ("svix-id".into(), id.into()),
        ("svix-timestamp".into(), timestamp.into()),
        ("svix-signature".into(), signature.into()),
    ])
}

#[test]
fn svix_header_names_verify_as_the_spec_names_do() {
    let verified = sw_verify(&svix_headers(SW_ID, "1614265330", SW_SIGNATURE));
    assert_eq!(
        verified,
        Ok(Verified {
            timestamp: Some(at(SW_SECONDS)),
            webhook_id: Some(SW_ID.to_owned()),
        })
    );
    let tampered = sw_verify(&svix_headers("msg_other", "1614265330", SW_SIGNATURE));
    assert_eq!(tampered, Err(SignatureError::Mismatch));
    let mut partial = svix_headers(SW_ID, "1614265330", SW_SIGNATURE);
    partial.remove("svix-signature");
    assert_eq!(
        sw_verify(&partial),
        Err(SignatureError::Missing {
            header: "svix-signature".into()
        })
    );
}

/// A request carrying any of the spec's names is read by them alone: Svix's names cannot
/// supply an id, a time or a signature the spec's names left out, so the id an event is
/// stored under (`webhook-id` whenever one of the spec's headers is sent) is the signed one.
#[test]
fn the_spec_names_win_and_are_never_completed_by_svix_names() {
    let mut both = svix_headers("msg_unsigned", "1614265330", SW_SIGNATURE);
    both.extend(sw_headers(SW_ID, "1614265330", SW_SIGNATURE));
    let verified = sw_verify(&both).expect("the spec's names verify");
    assert_eq!(verified.webhook_id.as_deref(), Some(SW_ID));

    let mut mixed = svix_headers(SW_ID, "1614265330", SW_SIGNATURE);
    mixed.insert("webhook-timestamp".into(), b"1614265330".to_vec());
    assert_eq!(
        sw_verify(&mixed),
        Err(SignatureError::Missing {
            header: "webhook-id".into()
        })
    );
}

#[test]
fn an_undecodable_entry_beside_a_valid_signature_is_skipped() {
    let valid = SW_SIGNATURE;
    for list in [
        format!("v1,notbase64!! {valid}"),
        format!("{valid} v1,!!!!"),
        format!("v1,{} {valid}", &valid[3..40]),
    ] {
        let headers = sw_headers(SW_ID, "1614265330", &list);
        assert!(sw_verify(&headers).is_ok(), "{list}");
        let svix = svix_headers(SW_ID, "1614265330", &list);
        assert!(sw_verify(&svix).is_ok(), "{list} under svix names");
    }
    // Beside a wrong one it is a plain mismatch, and alone it is still named malformed.
    let wrong = "v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
    let list = format!("v1,!!!! {wrong}");
    assert_eq!(
        sw_verify(&sw_headers(SW_ID, "1614265330", &list)),
        Err(SignatureError::Mismatch)
    );
    assert_malformed(
        sw_verify(&svix_headers(SW_ID, "1614265330", "v1,!!!!")),
        "svix-signature",
    );

    let key = secret(&Scheme::Stripe, "s");
    let signed = sign(&Scheme::Stripe, &key, "", at(SW_SECONDS), b"x");
    let value = &signed.first().expect("stripe signs with a header").1;
    for extra in ["v1=xyz", "v1=", &format!("v1={}", "zz".repeat(32))] {
        let headers = one("stripe-signature", &format!("{value},{extra}"));
        let result = verify(
            &Scheme::Stripe,
            slice::from_ref(&key),
            &headers,
            b"x",
            at(SW_SECONDS),
            TOLERANCE,
        );
        assert!(result.is_ok(), "{extra}: {result:?}");
    }
}
