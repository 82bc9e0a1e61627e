//! Tests for exact decimal numbers: equality by value, exponent range and `to_i64`.

use super::*;

#[test]
fn numbers_compare_by_exact_decimal_value() {
    let one = num("1");
    for spelling in [
        "1.0", "1e0", "1E+0", "0.1e1", "100e-2", "10e-1", "1.000e0", "0.001e3",
    ] {
        assert_eq!(num(spelling), one, "{spelling}");
    }
    assert_eq!(one.digits(), "1");
    assert_eq!(one.exponent(), 0);
    assert_ne!(num("1"), num("-1"));
    assert_ne!(num("1"), num("1.0000000000000000000001"));
}

#[test]
fn large_integers_are_not_rounded() {
    assert_ne!(num("9007199254740993"), num("9007199254740992"));
    assert_eq!(num("9007199254740993").to_string(), "9007199254740993");
}

#[test]
fn negative_zero_equals_zero() {
    for spelling in ["-0", "-0.0", "0e5", "-0e-5", "0.000", "-0E+99"] {
        let n = num(spelling);
        assert_eq!(n, num("0"), "{spelling}");
        assert!(!n.negative());
        assert_eq!(n.to_string(), "0");
    }
}

#[test]
fn numbers_have_one_canonical_spelling() {
    assert_eq!(canon("1.5"), "15e-1");
    assert_eq!(canon("1500"), "15e2");
    assert_eq!(canon("1"), "1");
    assert_eq!(canon("-0.001"), "-1e-3");
    assert_eq!(canon("0.0"), "0");
    assert_eq!(canon("-12.340e1"), "-1234e-1");
}

#[test]
fn number_syntax_is_strict() {
    for bad in [
        "01",
        "-",
        "1.",
        ".5",
        "+1",
        "1e",
        "1e+",
        "1E-",
        "0x10",
        "NaN",
        "Infinity",
        "-Infinity",
        "1.e5",
        "--1",
        "-01",
        "[01]",
        "1.5.2",
        "- 1",
    ] {
        assert!(
            matches!(
                err(bad.as_bytes()),
                JsonError::Syntax { .. } | JsonError::TrailingData { .. }
            ),
            "{bad}"
        );
    }
}

#[test]
fn exponents_outside_i64_are_number_out_of_range() {
    assert_eq!(
        err(b"1e99999999999999999999999"),
        JsonError::NumberOutOfRange { offset: 0 }
    );
    assert_eq!(
        err(b"[1e-99999999999999999999]"),
        JsonError::NumberOutOfRange { offset: 1 }
    );
    assert_eq!(
        err(b"10e9223372036854775807"),
        JsonError::NumberOutOfRange { offset: 0 }
    );
    assert_eq!(
        err(b"0.1e-9223372036854775808"),
        JsonError::NumberOutOfRange { offset: 0 }
    );
    assert_eq!(num("1e9223372036854775807").exponent(), i64::MAX);
    assert_eq!(num("1e-9223372036854775808").exponent(), i64::MIN);
}

#[test]
fn exponent_range_depends_on_the_value_not_its_spelling() {
    assert_eq!(num("0.1e9223372036854775808"), num("1e9223372036854775807"));
    assert_eq!(
        num("100e-9223372036854775810"),
        num("1e-9223372036854775808")
    );
    assert_eq!(num("0e99999999999999999999999999999999999"), num("0"));
}

#[test]
fn to_i64_accepts_only_exact_integers_in_range() {
    assert_eq!(num("1.0").to_i64(), Some(1));
    assert_eq!(num("12e2").to_i64(), Some(1200));
    assert_eq!(num("-0").to_i64(), Some(0));
    assert_eq!(num("9223372036854775807").to_i64(), Some(i64::MAX));
    assert_eq!(num("-9223372036854775808").to_i64(), Some(i64::MIN));
    assert_eq!(num("1.5").to_i64(), None);
    assert_eq!(num("9223372036854775808").to_i64(), None);
    assert_eq!(num("-9223372036854775809").to_i64(), None);
    assert_eq!(num("1e19").to_i64(), None);
    assert_eq!(num("1e9223372036854775807").to_i64(), None);
    let huge = num("1e309");
    assert_eq!((huge.digits(), huge.exponent()), ("1", 309));
    assert_eq!(huge.to_i64(), None);
}

#[test]
fn plain_text_is_the_number_as_people_write_it() {
    for (literal, plain) in [
        ("19.99", "19.99"),
        ("0.005", "0.005"),
        ("-1.5e-3", "-0.0015"),
        ("1999e-2", "19.99"),
        ("12345678901234567890", "12345678901234567890"),
        ("1.0", "1"),
        ("-0.0", "0"),
        ("12e2", "1200"),
        ("0.10", "0.1"),
    ] {
        assert_eq!(
            num(literal).plain_text(64).as_deref(),
            Some(plain),
            "{literal}"
        );
    }
    assert_eq!(num("1e309").plain_text(64), None);
    assert_eq!(num("1e-309").plain_text(64), None);
}
