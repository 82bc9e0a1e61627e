//! Tests for the strict JSON parser and canonical form (numbers, pointers, properties below).

mod numbers;
mod pointer;
pub(crate) mod props;

use super::*;

fn ok(input: &str) -> Value {
    match parse(input.as_bytes()) {
        Ok(v) => v,
        Err(e) => panic!("{input:?} should parse: {e}"),
    }
}

fn err(input: &[u8]) -> JsonError {
    match parse(input) {
        Ok(v) => panic!(
            "{:?} should be rejected, got {v:?}",
            String::from_utf8_lossy(input)
        ),
        Err(e) => e,
    }
}

fn num(input: &str) -> Number {
    match ok(input) {
        Value::Number(n) => n,
        other => panic!("{input:?} is not a number: {other:?}"),
    }
}

fn canon(input: &str) -> String {
    String::from_utf8(ok(input).canonical()).expect("canonical output is UTF-8")
}

fn ptr(s: &str) -> Pointer {
    Pointer::parse(s).expect("valid pointer")
}

#[test]
fn any_top_level_value_is_accepted() {
    assert_eq!(ok("null"), Value::Null);
    assert_eq!(ok("true"), Value::Bool(true));
    assert_eq!(ok("false"), Value::Bool(false));
    assert_eq!(ok("\"s\""), Value::String("s".into()));
    assert_eq!(ok("[]"), Value::Array(vec![]));
    assert_eq!(ok("{}"), Value::Object(vec![]));
    assert_eq!(ok("12"), Value::Number(num("12")));
}

#[test]
fn surrounding_json_whitespace_is_allowed() {
    assert_eq!(
        ok(" \t\r\n{ \"a\" : [ 1 , 2 ] }\n\r\t "),
        ok(r#"{"a":[1,2]}"#)
    );
}

#[test]
fn empty_input_is_rejected() {
    assert_eq!(err(b""), JsonError::Empty);
    assert_eq!(err(b" \n\t\r"), JsonError::Empty);
}

#[test]
fn nesting_100000_deep_is_rejected_without_overflowing_the_stack() {
    let deep = "[".repeat(100_000);
    assert_eq!(
        err(deep.as_bytes()),
        JsonError::TooDeep { limit: MAX_DEPTH }
    );
    let deep = "{\"a\":".repeat(100_000);
    assert_eq!(
        err(deep.as_bytes()),
        JsonError::TooDeep { limit: MAX_DEPTH }
    );
}

#[test]
fn depth_128_is_accepted_and_129_rejected() {
    let nest = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    assert!(parse(nest(MAX_DEPTH).as_bytes()).is_ok());
    assert_eq!(
        err(nest(MAX_DEPTH + 1).as_bytes()),
        JsonError::TooDeep { limit: 128 }
    );
    let objects = |n: usize| format!("{}1{}", "{\"k\":".repeat(n), "}".repeat(n));
    assert!(parse(objects(MAX_DEPTH).as_bytes()).is_ok());
    assert_eq!(
        err(objects(MAX_DEPTH + 1).as_bytes()),
        JsonError::TooDeep { limit: 128 }
    );
    let mixed = format!("{}[]{}", "{\"k\":".repeat(127), "}".repeat(127));
    assert!(parse(mixed.as_bytes()).is_ok());
    let mixed = format!("{}[[]]{}", "{\"k\":".repeat(127), "}".repeat(127));
    assert!(matches!(err(mixed.as_bytes()), JsonError::TooDeep { .. }));
}

#[test]
fn duplicate_names_are_rejected() {
    let dup = |name: &str| JsonError::DuplicateName { name: name.into() };
    assert_eq!(err(br#"{"a":1,"a":1}"#), dup("a"));
    assert_eq!(err(br#"{"a":1,"\u0061":2}"#), dup("a"));
    assert_eq!(err(br#"[{"x":{"b":1,"c":2,"b":3}}]"#), dup("b"));
    assert_eq!(err(br#"{"":1,"":2}"#), dup(""));
    assert!(parse(br#"{"a":{"a":1},"b":{"a":1}}"#).is_ok());
}

#[test]
fn duplicate_name_is_truncated_to_64_characters() {
    let long = "é".repeat(100);
    let doc = format!(r#"{{"{long}":1,"{long}":2}}"#);
    let JsonError::DuplicateName { name } = err(doc.as_bytes()) else {
        panic!("expected a duplicate name error");
    };
    assert_eq!(name, "é".repeat(64));
}

#[test]
fn lone_surrogates_are_rejected() {
    for bad in [
        r#""\ud800""#,
        r#""\udc00""#,
        r#""\ud800\u0041""#,
        r#""\udbff\n""#,
        r#""\ud800x""#,
        r#""\udfff\ud800""#,
    ] {
        assert_eq!(
            err(bad.as_bytes()),
            JsonError::LoneSurrogate { offset: 1 },
            "{bad}"
        );
    }
}

#[test]
fn surrogate_pairs_decode_to_one_character() {
    assert_eq!(ok(r#""\ud83d\ude00""#), Value::String("😀".into()));
    assert_eq!(ok(r#""\uD83D\uDE00""#), Value::String("😀".into()));
    assert_eq!(ok(r#""\u00e9\u20AC""#), Value::String("é€".into()));
}

#[test]
fn invalid_utf8_is_rejected() {
    let bad: [(&[u8], usize); 7] = [
        (b"\"\xff\"", 1),
        (b"\"\xc0\x80\"", 1),
        (b"\"\xe2\x82\"", 1),
        (b"\"\xed\xa0\x80\"", 1),
        (b"\xff", 0),
        (b"[1]\xff", 3),
        (b"{\"a\xf0\x9f\x98\":1}", 3),
    ];
    for (input, offset) in bad {
        assert_eq!(err(input), JsonError::InvalidUtf8 { offset }, "{input:?}");
    }
}

#[test]
fn raw_control_characters_in_strings_are_rejected() {
    assert_eq!(
        err(b"\"a\x00b\""),
        JsonError::ControlCharacter { offset: 2 }
    );
    assert_eq!(err(b"\"\n\""), JsonError::ControlCharacter { offset: 1 });
    assert_eq!(err(b"\"\t\""), JsonError::ControlCharacter { offset: 1 });
    assert_eq!(err(b"\"\x1f\""), JsonError::ControlCharacter { offset: 1 });
    assert_eq!(ok("\"\x7f\""), Value::String("\x7f".into()));
}

#[test]
fn escaped_nul_is_accepted() {
    assert_eq!(ok(r#""\u0000""#), Value::String("\0".into()));
}

#[test]
fn nul_outside_strings_is_rejected() {
    assert_eq!(err(b"\x00"), JsonError::Syntax { offset: 0 });
    assert_eq!(err(b"[1,\x001]"), JsonError::Syntax { offset: 3 });
    assert_eq!(err(b"1\x00"), JsonError::TrailingData { offset: 1 });
}

#[test]
fn byte_order_mark_is_rejected() {
    assert_eq!(err(b"\xef\xbb\xbf{}"), JsonError::ByteOrderMark);
    assert_eq!(ok("\"\u{feff}\""), Value::String("\u{feff}".into()));
}

#[test]
fn trailing_data_is_rejected() {
    assert_eq!(err(b"{} {}"), JsonError::TrailingData { offset: 3 });
    assert_eq!(err(b"1 2"), JsonError::TrailingData { offset: 2 });
    assert_eq!(err(b"[]]"), JsonError::TrailingData { offset: 2 });
}

#[test]
fn malformed_structure_is_a_syntax_error() {
    for bad in [
        "[1,]",
        r#"{"a":1,}"#,
        "{a:1}",
        "[1 2]",
        r#"{"a" 1}"#,
        "'a'",
        "tru",
        "nul",
        "\"abc",
        r#""\x""#,
        r#""\u12""#,
        r#""\u12G4""#,
        "[",
        "{",
        r#"{"a":}"#,
        "[,1]",
        "{,}",
        "\u{a0}1",
    ] {
        assert!(
            matches!(err(bad.as_bytes()), JsonError::Syntax { .. }),
            "{bad}"
        );
    }
}

#[test]
fn escapes_are_decoded() {
    assert_eq!(
        ok(r#""\"\\\/\b\f\n\r\t""#),
        Value::String("\"\\/\u{8}\u{c}\n\r\t".into())
    );
}

#[test]
fn objects_are_sorted_by_key_bytes() {
    let Value::Object(members) = ok(r#"{"b":1,"a":2,"é":3,"Z":4,"aa":5}"#) else {
        panic!("expected an object");
    };
    let keys: Vec<&str> = members.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["Z", "a", "aa", "b", "é"]);
}

#[test]
fn canonical_form_has_no_whitespace_and_sorted_members() {
    assert_eq!(
        canon(r#" { "b" : [ 1.0 , true , null ] , "a" : { "y" : "" , "x" : -0 } } "#),
        r#"{"a":{"x":0,"y":""},"b":[1,true,null]}"#
    );
}

#[test]
fn canonical_strings_escape_minimally() {
    assert_eq!(
        canon(r#""\u0022\u005c\/\u0001\u001f\b\f\n\r\t\u007f\u00e9\ud83d\ude00""#),
        "\"\\\"\\\\/\\u0001\\u001f\\b\\f\\n\\r\\t\u{7f}é😀\""
    );
}

#[test]
fn canonical_sorts_hand_built_objects() {
    let value = Value::Object(vec![
        ("b".into(), Value::Null),
        ("a".into(), Value::Array(vec![Value::Bool(false)])),
    ]);
    assert_eq!(value.canonical(), br#"{"a":[false],"b":null}"#);
}

#[test]
fn canonical_writer_handles_deep_hand_built_values() {
    let mut value = Value::Null;
    for _ in 0..10_000 {
        value = Value::Array(vec![value]);
    }
    assert_eq!(value.canonical().len(), 20_004);
    // Dropping is recursive in std, so unwind the nesting by hand.
    while let Value::Array(mut items) = value {
        value = items.pop().unwrap_or(Value::Null);
    }
}

#[test]
fn as_str_returns_only_strings() {
    assert_eq!(ok("\"x\"").as_str(), Some("x"));
    assert_eq!(ok("1").as_str(), None);
}

#[test]
fn error_messages_name_the_rule() {
    assert_eq!(
        JsonError::DuplicateName { name: "a".into() }.to_string(),
        "duplicate object member name \"a\""
    );
    assert_eq!(
        JsonError::TooDeep { limit: 128 }.to_string(),
        "arrays and objects nested deeper than 128"
    );
}
