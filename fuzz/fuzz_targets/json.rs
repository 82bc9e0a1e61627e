//! Fuzzes the strict JSON parser, the canonical writer and the JSON fingerprints.
//!
//! Input: any bytes, taken as a payload.
//!
//! Checks: nothing panics; a payload the parser refuses cannot be fingerprinted as JSON, with
//! the same error; for one it accepts, parse → canonicalise → parse gives the same value,
//! canonicalising is idempotent, and the payload and its canonical bytes get the same
//! fingerprint (whole-document and per-field) and the same derived event id — equal values
//! hash equal. Parsed objects have unique names sorted by their bytes, numbers are in normal
//! form, and `Number::to_i64` agrees with an independent reading of the canonical number.

#![no_main]

use libfuzzer_sys::fuzz_target;
use oncebox_core::FingerprintMode;
use oncebox_core::fingerprint::derive_event_id;
use oncebox_core::json::{self, Number, Pointer, Value};

fuzz_target!(|data: &[u8]| {
    let value = match json::parse(data) {
        Ok(value) => value,
        Err(e) => {
            assert_eq!(FingerprintMode::Json.fingerprint(data), Err(e.into()));
            return;
        }
    };
    let canonical = value.canonical();
    let reparsed = json::parse(&canonical).expect("canonical bytes parse");
    assert_eq!(reparsed, value, "parse → canonicalise → parse is stable");
    assert_eq!(
        reparsed.canonical(),
        canonical,
        "canonicalising is idempotent"
    );

    let json = FingerprintMode::Json;
    assert_eq!(json.fingerprint(data), json.fingerprint(&canonical));
    // The top-level names (or the first indices) plus one that is absent: per-field hashing
    // must see the same fields in both spellings.
    let pointers = fields_of(&value);
    let fields = FingerprintMode::Fields(pointers.clone());
    assert_eq!(fields.fingerprint(data), fields.fingerprint(&canonical));
    assert_eq!(
        derive_event_id(data, &pointers),
        derive_event_id(&canonical, &pointers)
    );

    check_shape(&value);
});

fn fields_of(value: &Value) -> Vec<Pointer> {
    let mut tokens: Vec<String> = match value {
        Value::Object(members) => members.iter().take(4).map(|(k, _)| k.clone()).collect(),
        Value::Array(items) => (0..items.len().min(4)).map(|i| i.to_string()).collect(),
        _ => Vec::new(),
    };
    tokens.push("absent~".to_owned());
    tokens
        .into_iter()
        .map(|t| Pointer::from_tokens(vec![t]))
        .collect()
}

/// The parser's promises about the values it returns, checked over the whole tree.
fn check_shape(value: &Value) {
    let mut stack = vec![value];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(members) => {
                assert!(
                    members
                        .windows(2)
                        .all(|w| w[0].0.as_bytes() < w[1].0.as_bytes()),
                    "object names are unique and sorted by bytes"
                );
                stack.extend(members.iter().map(|(_, v)| v));
            }
            Value::Array(items) => stack.extend(items),
            Value::Number(n) => check_number(n),
            Value::Null | Value::Bool(_) | Value::String(_) => {}
        }
    }
}

fn check_number(n: &Number) {
    let digits = n.digits();
    assert!(digits.bytes().all(|b| b.is_ascii_digit()));
    assert!(!digits.starts_with('0') && !digits.ends_with('0'), "{n:?}");
    if digits.is_empty() {
        assert!(
            !n.negative() && n.exponent() == 0,
            "zero has one form: {n:?}"
        );
    }
    // An integer is the digits followed by `exponent` zeros; read that text directly.
    let integer = usize::try_from(n.exponent())
        .ok()
        .filter(|zeros| digits.len() + zeros <= 20)
        .and_then(|zeros| {
            let text = format!(
                "{}{digits}{}",
                if n.negative() { "-" } else { "" },
                "0".repeat(zeros)
            );
            if digits.is_empty() {
                Some(0)
            } else {
                text.parse::<i64>().ok()
            }
        });
    assert_eq!(n.to_i64(), integer, "{n:?}");
    if let Some(i) = integer {
        let back = json::parse(i.to_string().as_bytes()).expect("an i64 is JSON");
        assert_eq!(back, Value::Number(n.clone()));
    }
}
