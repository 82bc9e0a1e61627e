//! Tests for payload fingerprints and derived ids, with pinned vectors for persisted encodings.

use proptest::prelude::*;
use sha2::{Digest, Sha256};

use super::*;
use crate::json::tests::props::{arb_value, render_noisy};

fn fp(mode: &FingerprintMode, payload: &str) -> Fingerprint {
    mode.fingerprint(payload.as_bytes())
        .expect("payload fingerprints")
}

fn fields(pointers: &[&str]) -> FingerprintMode {
    FingerprintMode::Fields(pointers.iter().map(|p| ptrs(p)).collect())
}

fn ptrs(p: &str) -> Pointer {
    Pointer::parse(p).expect("valid pointer")
}

fn sha256(parts: &[&[u8]]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part);
    }
    hasher.finalize().into()
}

#[test]
fn fingerprint_prints_as_lowercase_hex() {
    let fingerprint = Fingerprint::from([0xab; 32]);
    assert_eq!(fingerprint.to_hex(), "ab".repeat(32));
    assert_eq!(fingerprint.to_string(), "ab".repeat(32));
    assert_eq!(
        format!("{fingerprint:?}"),
        format!("Fingerprint({})", "ab".repeat(32))
    );
    assert_eq!(fingerprint.as_bytes(), &[0xab; 32]);
}

#[test]
fn fingerprint_from_slice_requires_32_bytes() {
    assert_eq!(
        Fingerprint::from_slice(&[7; 32]),
        Some(Fingerprint::from([7; 32]))
    );
    assert_eq!(Fingerprint::from_slice(&[7; 31]), None);
    assert_eq!(Fingerprint::from_slice(&[7; 33]), None);
    assert_eq!(Fingerprint::from_slice(&[]), None);
}

#[test]
fn default_mode_is_json() {
    assert_eq!(FingerprintMode::default(), FingerprintMode::Json);
}

#[test]
fn key_order_and_whitespace_do_not_change_the_json_fingerprint() {
    let mode = FingerprintMode::Json;
    assert_eq!(
        fp(&mode, r#"{"a":1,"b":[true,null]}"#),
        fp(&mode, " {\n \"b\" : [ true , null ] ,\t\"a\": 1.0 }\r\n")
    );
}

#[test]
fn different_values_change_the_json_fingerprint() {
    let mode = FingerprintMode::Json;
    assert_ne!(fp(&mode, r#"{"a":1}"#), fp(&mode, r#"{"a":2}"#));
    assert_ne!(fp(&mode, r#"{"a":1}"#), fp(&mode, r#"{"a":"1"}"#));
    assert_ne!(fp(&mode, "9007199254740993"), fp(&mode, "9007199254740992"));
}

#[test]
fn json_mode_rejects_invalid_json() {
    assert_eq!(
        FingerprintMode::Json.fingerprint(br#"{"a":1,"a":2}"#),
        Err(PayloadError::Json(JsonError::DuplicateName {
            name: "a".into()
        }))
    );
    assert!(FingerprintMode::Json.fingerprint(b"\xff").is_err());
    assert!(fields(&["/a"]).fingerprint(b"{").is_err());
}

#[test]
fn json_fingerprint_is_prefix_then_canonical_bytes() {
    let expected = sha256(&[b"oncebox/json/v1\0", br#"{"a":15e-1,"b":"x"}"#]);
    assert_eq!(
        fp(&FingerprintMode::Json, r#"{"b":"x","a":1.50}"#).as_bytes(),
        &expected
    );
}

#[test]
fn fields_fingerprint_follows_the_documented_encoding() {
    let mut expected = b"oncebox/fields/v1\0".to_vec();
    expected.extend_from_slice(&2u64.to_be_bytes());
    expected.extend_from_slice(b"/a");
    expected.push(1);
    expected.extend_from_slice(&3u64.to_be_bytes());
    expected.extend_from_slice(b"\"x\"");
    expected.extend_from_slice(&4u64.to_be_bytes());
    expected.extend_from_slice(b"/m~1");
    expected.push(0);
    let actual = fp(&fields(&["/a", "/m~1"]), r#"{"a":"x","b":2}"#);
    assert_eq!(actual.as_bytes(), &sha256(&[&expected]));
}

#[test]
fn persisted_encodings_never_change() {
    // Pinned outputs: if one of these fails, stored fingerprints and ids would stop matching.
    let payload = r#"{"id":"evt_1","amount":100,"tags":["a"]}"#;
    let pinned = [
        (fp(&FingerprintMode::Json, payload), JSON_VECTOR),
        (fp(&fields(&["/id", "/missing"]), payload), FIELDS_VECTOR),
        (fp(&FingerprintMode::Raw, payload), RAW_VECTOR),
    ];
    for (actual, expected) in pinned {
        assert_eq!(actual.to_hex(), expected);
    }
    let id = derive_event_id(payload.as_bytes(), &[ptrs("/id"), ptrs("/amount")]);
    assert_eq!(id.as_deref(), Ok(DERIVED_ID_VECTOR));
}

// Computed independently of this crate (Python hashlib over the documented byte layouts).
const JSON_VECTOR: &str = "3e68ec3bc02c9c76378346cb05a9f9184bb8609e987d920a214d21fe203734cb";
const FIELDS_VECTOR: &str = "48394057d58fe668bc24c3bf91ee38943c7925dbcff681e84791713af8c8c4c1";
const RAW_VECTOR: &str = "d470453d6f2b8e40d4f96f9b78ed2d3557d18062397d07a7ae2928cef939667f";
const DERIVED_ID_VECTOR: &str = "746abe5e742bc6b89a1f6a2f7d183a0cbccca4af19fff9422268f90a812e5b35";

#[test]
fn absent_field_differs_from_null() {
    let mode = fields(&["/a"]);
    assert_ne!(fp(&mode, r#"{"a":null}"#), fp(&mode, "{}"));
}

#[test]
fn unrelated_fields_do_not_change_the_fields_fingerprint() {
    let mode = fields(&["/id", "/amount"]);
    assert_eq!(
        fp(&mode, r#"{"id":"x","amount":5,"sent_at":"2024-01-01"}"#),
        fp(
            &mode,
            r#"{"sent_at":"2025-06-30","amount":5.0,"id":"x","extra":[1]}"#
        )
    );
    assert_ne!(
        fp(&mode, r#"{"id":"x","amount":5}"#),
        fp(&mode, r#"{"id":"x","amount":6}"#)
    );
}

#[test]
fn field_boundaries_cannot_collide() {
    let mode = fields(&["/a", "/b"]);
    assert_ne!(
        fp(&mode, r#"{"a":"x","b":""}"#),
        fp(&mode, r#"{"a":"","b":"x"}"#)
    );
    assert_ne!(fp(&mode, r#"{"a":1}"#), fp(&mode, r#"{"b":1}"#));
    assert_ne!(
        fp(&fields(&["/a", "/b"]), "{}"),
        fp(&fields(&["/b", "/a"]), "{}")
    );
}

#[test]
fn raw_mode_differs_on_one_whitespace_byte() {
    let mode = FingerprintMode::Raw;
    assert_ne!(fp(&mode, r#"{"a":1}"#), fp(&mode, r#"{"a": 1}"#));
    assert_eq!(fp(&mode, r#"{"a":1}"#), fp(&mode, r#"{"a":1}"#));
}

#[test]
fn raw_mode_accepts_any_bytes() {
    assert!(FingerprintMode::Raw.fingerprint(b"\xff\x00{{{").is_ok());
    assert!(FingerprintMode::Raw.fingerprint(b"").is_ok());
}

#[test]
fn modes_are_domain_separated() {
    let payload = r#"{"a":1}"#;
    let json = fp(&FingerprintMode::Json, payload);
    assert_ne!(json, fp(&FingerprintMode::Raw, payload));
    assert_ne!(json, fp(&fields(&[""]), payload));
    let id = derive_event_id(payload.as_bytes(), &[ptrs("")]).expect("id");
    assert_ne!(id, fp(&fields(&[""]), payload).to_hex());
}

#[test]
fn derived_event_id_is_stable_64_char_hex() {
    let pointers = [ptrs("/order/id"), ptrs("/kind")];
    let a = derive_event_id(br#"{"order":{"id":7},"kind":"paid","at":1}"#, &pointers);
    let b = derive_event_id(
        b" {\"at\":2, \"kind\":\"paid\",\"order\":{\"id\":7.0}} ",
        &pointers,
    );
    let a = a.expect("id derives");
    assert_eq!(Ok(a.clone()), b);
    assert_eq!(a.len(), 64);
    assert!(
        a.bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
    );
    let other = derive_event_id(br#"{"order":{"id":8},"kind":"paid"}"#, &pointers);
    assert_ne!(Ok(a), other);
}

#[test]
fn derived_event_id_requires_every_field() {
    let pointers = [ptrs("/id"), ptrs("/a~1b")];
    assert_eq!(
        derive_event_id(br#"{"id":1}"#, &pointers),
        Err(PayloadError::MissingField {
            pointer: "/a~1b".into()
        })
    );
    assert!(derive_event_id(br#"{"id":1,"a/b":null}"#, &pointers).is_ok());
}

#[test]
fn derived_event_id_rejects_an_empty_field_list() {
    assert_eq!(derive_event_id(b"{}", &[]), Err(PayloadError::NoFields));
    // A fingerprint of no fields is the same for every payload: no conflict would be seen.
    assert_eq!(
        FingerprintMode::Fields(Vec::new()).fingerprint(b"{\"a\":1}"),
        Err(PayloadError::NoFields)
    );
}

#[test]
fn payload_errors_explain_themselves() {
    let err = FingerprintMode::Json
        .fingerprint(b"[1,]")
        .expect_err("invalid");
    assert_eq!(err.to_string(), "invalid JSON: JSON syntax error at byte 3");
}

proptest! {
    #![proptest_config(oncebox_testkit::seed::Seed::from_env(module_path!()).proptest())]
    #[test]
    fn respelling_a_value_keeps_its_fingerprint(value in arb_value(), seed in any::<u64>()) {
        let canonical = value.canonical();
        let noisy = render_noisy(&value, seed);
        let mode = FingerprintMode::Json;
        prop_assert_eq!(mode.fingerprint(noisy.as_bytes()), mode.fingerprint(&canonical));
        let whole = fields(&[""]);
        prop_assert_eq!(whole.fingerprint(noisy.as_bytes()), whole.fingerprint(&canonical));
    }

    /// The gateway hands over the value it parsed already; every mode gives the fingerprint it
    /// gives from the bytes alone.
    #[test]
    fn an_already_parsed_value_gives_the_same_fingerprint(value in arb_value(), seed in any::<u64>()) {
        let noisy = render_noisy(&value, seed);
        let parsed = json::parse(noisy.as_bytes()).unwrap();
        for mode in [FingerprintMode::Json, fields(&[""]), fields(&["/a", "/b/0"]), FingerprintMode::Raw] {
            prop_assert_eq!(
                mode.fingerprint_parsed(noisy.as_bytes(), Some(&parsed)),
                mode.fingerprint(noisy.as_bytes())
            );
        }
    }
}
