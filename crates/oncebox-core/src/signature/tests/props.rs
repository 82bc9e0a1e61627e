//! Property tests: hostile header bytes never panic or authenticate; signing always verifies.

use proptest::prelude::*;

use super::*;

const NAMES: &[&str] = &[
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "stripe-signature",
    "x-hub-signature-256",
    "x-signature",
];

/// Pieces of real signature headers, so generated values get past the first checks.
const PIECES: &[&str] = &[
    "v1,",
    "v1a,",
    "v1=",
    "v0=",
    "t=",
    "sha256=",
    " ",
    ",",
    "=",
    "1614265330",
    "-",
    "+",
    "0",
    "9999999999999999999999",
    "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
    "ab",
    "==",
    "\u{e9}",
    "g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
];

fn arb_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..256),
        prop::collection::vec(prop::sample::select(PIECES), 0..12)
            .prop_map(|pieces| pieces.concat().into_bytes()),
    ]
}

fn arb_headers() -> impl Strategy<Value = BTreeMap<String, Vec<u8>>> {
    prop::collection::btree_map(
        prop::sample::select(NAMES).prop_map(str::to_owned),
        arb_value(),
        0..6,
    )
}

fn arb_now() -> impl Strategy<Value = Timestamp> {
    prop_oneof![Just(at(SW_SECONDS)), any::<i64>().prop_map(Timestamp)]
}

fn arb_tolerance() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(TOLERANCE),
        Just(Duration::MAX),
        any::<u64>().prop_map(Duration::from_millis)
    ]
}

proptest! {
    #![proptest_config(oncebox_testkit::seed::Seed::from_env(module_path!()).proptest())]
    #[test]
    fn arbitrary_headers_never_panic_nor_authenticate(
        headers in arb_headers(),
        body in prop::collection::vec(any::<u8>(), 0..64),
        now in arb_now(),
        tolerance in arb_tolerance(),
    ) {
        for (scheme, key) in signed_schemes() {
            let result = verify(&scheme, &[key], &headers, &body, now, tolerance);
            prop_assert!(result.is_err(), "{:?} accepted {:?}", scheme, headers);
        }
        let result = verify(&Scheme::None, &[], &headers, &body, now, tolerance);
        prop_assert!(result.is_ok());
    }

    #[test]
    fn mutated_signed_headers_never_panic(
        body in prop::collection::vec(any::<u8>(), 0..64),
        which in any::<prop::sample::Index>(),
        at_byte in any::<prop::sample::Index>(),
        byte in any::<u8>(),
        now in arb_now(),
    ) {
        for (scheme, key) in signed_schemes() {
            let mut signed = map(&sign(&scheme, &key, "evt_1", at(SW_SECONDS), &body));
            let name = signed.keys().nth(which.index(signed.len())).cloned().unwrap_or_default();
            if let Some(value) = signed.get_mut(&name)
                && !value.is_empty()
            {
                let i = at_byte.index(value.len());
                value[i] = byte;
            }
            let _ = verify(&scheme, &[key], &signed, &body, now, TOLERANCE);
        }
    }

    #[test]
    fn signed_requests_always_verify(
        id in "[^\\x00-\\x1f]{1,40}",
        body in prop::collection::vec(any::<u8>(), 0..256),
        seconds in 0i64..100_000_000_000,
    ) {
        for (scheme, key) in signed_schemes() {
            let headers = map(&sign(&scheme, &key, &id, at(seconds), &body));
            let verified = verify(&scheme, &[key], &headers, &body, at(seconds), TOLERANCE);
            prop_assert!(verified.is_ok(), "{:?}: {:?}", scheme, verified);
            if scheme == Scheme::StandardWebhooks {
                prop_assert_eq!(
                    verified,
                    Ok(Verified { timestamp: Some(at(seconds)), webhook_id: Some(id.clone()) })
                );
            }
        }
    }
}
