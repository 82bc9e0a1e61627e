//! Fuzzes RFC 6901 JSON pointers: parsing, display, and lookups in parsed documents (the
//! piece of event-id extraction and per-field fingerprints that reads configuration).
//!
//! Input: the pointer text on the first line, the JSON document as the rest.
//!
//! Checks: nothing panics; a pointer has one spelling, so display gives back exactly the
//! text parsed, and tokens survive display → parse whatever they hold; a lookup finds the
//! same value in a document and in its canonical re-serialisation; array steps follow the
//! RFC's index rule (`0` or digits without a leading zero; never `-`, `+1` or `01`), object
//! steps compare names exactly.

#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use oncebox_core::json::{self, Pointer, Value};

fuzz_target!(|data: &[u8]| {
    let f = common::fields(data, 2);
    let Ok(text) = std::str::from_utf8(f[0]) else {
        return;
    };
    let pointer = match Pointer::parse(text) {
        Ok(pointer) => {
            assert_eq!(pointer.to_string(), text, "a pointer has one spelling");
            pointer
        }
        // Refused text still yields tokens to try: split on '/' as they are.
        Err(_) => Pointer::from_tokens(text.split('/').skip(1).map(str::to_owned).collect()),
    };
    let shown = pointer.to_string();
    assert_eq!(Pointer::parse(&shown).as_ref(), Ok(&pointer), "{shown:?}");

    let Ok(doc) = json::parse(f[1]) else {
        return;
    };
    let found = doc.pointer(&pointer);
    let canonical = json::parse(&doc.canonical()).expect("canonical bytes parse");
    assert_eq!(canonical.pointer(&pointer), found);
    assert_eq!(found, step_by_step(&doc, pointer.tokens()));
});

/// The lookup written out from the RFC, one token at a time.
fn step_by_step<'v>(mut value: &'v Value, tokens: &[String]) -> Option<&'v Value> {
    for token in tokens {
        value = match value {
            Value::Object(members) => &members.iter().find(|(k, _)| k == token)?.1,
            Value::Array(items) => {
                let canonical_index = token == "0"
                    || (token.starts_with(|c: char| c.is_ascii_digit() && c != '0')
                        && token.bytes().all(|b| b.is_ascii_digit()));
                if !canonical_index {
                    return None;
                }
                items.get(token.parse::<usize>().ok()?)?
            }
            _ => return None,
        };
    }
    Some(value)
}
