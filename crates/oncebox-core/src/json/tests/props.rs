//! Property tests for parsing and canonical form, plus value generators reused by fingerprints.

use proptest::prelude::*;

use super::*;

pub(crate) fn arb_number() -> impl Strategy<Value = Number> {
    let digits = "[1-9]([0-9]{0,25}[1-9])?";
    let exponent = prop_oneof![-30i64..30, any::<i64>()];
    let nonzero =
        (any::<bool>(), digits, exponent).prop_map(|(negative, digits, exponent)| Number {
            negative,
            digits,
            exponent,
        });
    prop_oneof![Just(Number::default()), nonzero]
}

pub(crate) fn arb_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        arb_number().prop_map(Value::Number),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(any::<String>(), inner, 0..6)
                .prop_map(|members| Value::Object(members.into_iter().collect())),
        ]
    })
}

/// Deterministic choices for re-spelling a value (splitmix64).
struct Noise(u64);

impl Noise {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        usize::try_from((z ^ (z >> 31)) % n as u64).unwrap_or(0)
    }

    fn pick<'a>(&mut self, options: &[&'a str]) -> &'a str {
        options[self.below(options.len())]
    }

    fn whitespace(&mut self, out: &mut String) {
        for _ in 0..self.below(3) {
            out.push_str(self.pick(&[" ", "\t", "\n", "\r"]));
        }
    }
}

/// Spells `value` as a different but equal JSON text: random whitespace, member order,
/// number notation and string escapes.
pub(crate) fn render_noisy(value: &Value, seed: u64) -> String {
    let mut out = String::new();
    write_noisy(value, &mut Noise(seed), &mut out);
    out
}

fn write_noisy(value: &Value, noise: &mut Noise, out: &mut String) {
    noise.whitespace(out);
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_noisy_number(n, noise, out),
        Value::String(s) => write_noisy_string(s, noise, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_noisy(item, noise, out);
            }
            noise.whitespace(out);
            out.push(']');
        }
        Value::Object(members) => {
            let mut order: Vec<&(String, Value)> = members.iter().collect();
            for i in (1..order.len()).rev() {
                order.swap(i, noise.below(i + 1));
            }
            out.push('{');
            for (i, (key, item)) in order.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                noise.whitespace(out);
                write_noisy_string(key, noise, out);
                noise.whitespace(out);
                out.push(':');
                write_noisy(item, noise, out);
            }
            noise.whitespace(out);
            out.push('}');
        }
    }
    noise.whitespace(out);
}

fn write_noisy_number(n: &Number, noise: &mut Noise, out: &mut String) {
    if n.digits.is_empty() {
        out.push_str(noise.pick(&["0", "-0", "0.000", "0e7", "-0.0E-3", "0E+0"]));
        return;
    }
    if n.negative {
        out.push('-');
    }
    let padding = noise.below(3);
    let digits = format!("{}{}", n.digits, "0".repeat(padding));
    let split = noise.below(digits.len() + 1);
    let (int, frac) = digits.split_at(split);
    out.push_str(if int.is_empty() { "0" } else { int });
    if !frac.is_empty() {
        out.push('.');
        out.push_str(frac);
    }
    let exponent = i128::from(n.exponent) - padding as i128 + frac.len() as i128;
    if exponent != 0 || noise.below(2) == 0 {
        out.push_str(noise.pick(&["e", "E"]));
        if exponent >= 0 && noise.below(2) == 0 {
            out.push('+');
        }
        out.push_str(&exponent.to_string());
    }
}

fn write_noisy_string(s: &str, noise: &mut Noise, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        let must_escape = c == '"' || c == '\\' || c < ' ';
        if !must_escape && noise.below(8) != 0 {
            out.push(c);
            continue;
        }
        match c {
            '\n' if noise.below(2) == 0 => out.push_str("\\n"),
            '"' | '\\' | '/' if noise.below(2) == 0 => {
                out.push('\\');
                out.push(c);
            }
            _ => {
                for unit in c.encode_utf16(&mut [0; 2]) {
                    let escaped = if noise.below(2) == 0 {
                        format!("\\u{unit:04x}")
                    } else {
                        format!("\\u{unit:04X}")
                    };
                    out.push_str(&escaped);
                }
            }
        }
    }
    out.push('"');
}

const JSONISH: &[u8] = b"[]{}\",:0123456789.eE+-\\/u tfnrlasd\x00\x1f\n\xff\xc3\xa9\xed";

/// Fragments that concatenate into valid JSON far more often than random bytes do.
const TOKENS: &[&str] = &[
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    " ",
    "\t",
    "\"a\"",
    "\"a\":",
    "\"b\":",
    "\"\\u00e9\\n\"",
    "\"\\ud83d\\ude00\"",
    "\"\\u0000\"",
    "0",
    "-0",
    "-1.50e3",
    "1E-2",
    "9007199254740993",
    "true",
    "false",
    "null",
    "[1,",
    "{\"a\":",
];

fn check_round_trip(value: &Value) {
    let canonical = value.canonical();
    let reparsed = parse(&canonical).expect("canonical output parses");
    assert_eq!(&reparsed, value);
    assert_eq!(reparsed.canonical(), canonical);
}

proptest! {
    #![proptest_config(oncebox_testkit::seed::Seed::from_env(module_path!()).proptest())]
    #[test]
    fn parse_never_panics_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse(&bytes);
    }

    #[test]
    fn parsed_json_like_bytes_canonicalise_idempotently(
        bytes in prop::collection::vec(prop::sample::select(JSONISH), 0..48)
    ) {
        if let Ok(value) = parse(&bytes) {
            check_round_trip(&value);
        }
    }

    #[test]
    fn parsed_token_soup_canonicalises_idempotently(
        tokens in prop::collection::vec(prop::sample::select(TOKENS), 1..16)
    ) {
        if let Ok(value) = parse(tokens.concat().as_bytes()) {
            check_round_trip(&value);
        }
    }

    #[test]
    fn mutated_documents_round_trip_when_they_parse(
        value in arb_value(),
        seed in any::<u64>(),
        at in any::<prop::sample::Index>(),
        byte in prop::sample::select(JSONISH),
    ) {
        let mut bytes = render_noisy(&value, seed).into_bytes();
        let i = at.index(bytes.len());
        bytes[i] = byte;
        if let Ok(mutated) = parse(&bytes) {
            check_round_trip(&mutated);
        }
    }

    #[test]
    fn generated_values_round_trip_through_canonical_form(value in arb_value()) {
        check_round_trip(&value);
    }

    #[test]
    fn respelled_values_parse_to_the_same_value(value in arb_value(), seed in any::<u64>()) {
        let text = render_noisy(&value, seed);
        prop_assert_eq!(parse(text.as_bytes()), Ok(value), "{}", text);
    }
}
