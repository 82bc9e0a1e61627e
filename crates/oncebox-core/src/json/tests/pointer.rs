//! Tests for RFC 6901 JSON Pointer parsing, display and resolution.

use super::*;

#[test]
fn pointers_parse_and_display_per_rfc_6901() {
    assert_eq!(ptr("").tokens(), [] as [String; 0]);
    assert_eq!(ptr("/").tokens(), [""]);
    assert_eq!(ptr("/a~1b/m~0n/~01").tokens(), ["a/b", "m~n", "~1"]);
    for text in ["", "/", "/a~1b", "/m~0n", "/a/0", "//", "/~01"] {
        assert_eq!(ptr(text).to_string(), text);
    }
    assert_eq!(
        "/x".parse::<Pointer>(),
        Ok(Pointer::from_tokens(vec!["x".into()]))
    );
}

#[test]
fn malformed_pointers_are_rejected() {
    assert_eq!(Pointer::parse("a"), Err(PointerError::MissingLeadingSlash));
    assert_eq!(
        Pointer::parse("/~2"),
        Err(PointerError::InvalidEscape { offset: 1 })
    );
    assert_eq!(
        Pointer::parse("/ab/~"),
        Err(PointerError::InvalidEscape { offset: 4 })
    );
    assert_eq!(
        Pointer::parse("/~~0"),
        Err(PointerError::InvalidEscape { offset: 1 })
    );
}

#[test]
fn pointers_resolve_per_rfc_6901() {
    let doc = ok(
        r#"{"foo":["bar","baz"],"":0,"a/b":1,"c%d":2,"e^f":3,"g|h":4,"i\\j":5,"k\"l":6," ":7,"m~n":8}"#,
    );
    assert_eq!(doc.pointer(&ptr("")), Some(&doc));
    assert_eq!(
        doc.pointer(&ptr("/foo/0")),
        Some(&Value::String("bar".into()))
    );
    let cases = [
        ("/", "0"),
        ("/a~1b", "1"),
        ("/c%d", "2"),
        ("/e^f", "3"),
        ("/g|h", "4"),
        ("/i\\j", "5"),
        ("/k\"l", "6"),
        ("/ ", "7"),
        ("/m~0n", "8"),
    ];
    for (p, expected) in cases {
        assert_eq!(doc.pointer(&ptr(p)), Some(&ok(expected)), "{p}");
    }
}

#[test]
fn pointers_to_missing_places_resolve_to_nothing() {
    let doc = ok(r#"{"a":[10,20],"s":"x"}"#);
    assert_eq!(doc.pointer(&ptr("/a/1")), Some(&ok("20")));
    for p in [
        "/b", "/a/2", "/a/-", "/a/01", "/a/+1", "/a/1e0", "/a/", "/s/0", "/a/1/x",
    ] {
        assert_eq!(doc.pointer(&ptr(p)), None, "{p}");
    }
    assert_eq!(doc.pointer(&ptr("/a/99999999999999999999999")), None);
}
