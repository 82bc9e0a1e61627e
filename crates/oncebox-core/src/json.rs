//! Strict RFC 8259 JSON: parsing with exact decimal numbers, canonical bytes, and RFC 6901 pointers.

use std::fmt;

use thiserror::Error;

mod parse;
mod pointer;

pub use parse::parse;
use pointer::array_index;
pub use pointer::{Pointer, PointerError};

/// Deepest allowed nesting of arrays and objects; the top-level container is depth 1.
pub const MAX_DEPTH: usize = 128;

/// Why an input is not accepted as strict JSON.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum JsonError {
    #[error("empty input: expected a JSON value")]
    Empty,
    #[error("JSON syntax error at byte {offset}")]
    Syntax { offset: usize },
    #[error("invalid UTF-8 at byte {offset}")]
    InvalidUtf8 { offset: usize },
    #[error("a byte order mark before the JSON value is not allowed")]
    ByteOrderMark,
    #[error("duplicate object member name {name:?}")]
    DuplicateName { name: String },
    #[error("unpaired UTF-16 surrogate escape at byte {offset}")]
    LoneSurrogate { offset: usize },
    #[error("arrays and objects nested deeper than {limit}")]
    TooDeep { limit: usize },
    #[error("number at byte {offset} has an exponent out of range")]
    NumberOutOfRange { offset: usize },
    #[error("unescaped control character in string at byte {offset}")]
    ControlCharacter { offset: usize },
    #[error("unexpected data after the JSON value at byte {offset}")]
    TrailingData { offset: usize },
}

/// An exact decimal: `(-1)^negative × digits × 10^exponent`.
///
/// Fields are private so the normal form (no leading/trailing zeros in `digits`, zero is empty
/// and never negative) always holds; that is what makes derived equality mean numeric equality.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Number {
    negative: bool,
    digits: String,
    exponent: i64,
}

impl Number {
    pub fn negative(&self) -> bool {
        self.negative
    }

    /// Significant decimal digits without leading or trailing zeros; empty for zero.
    pub fn digits(&self) -> &str {
        &self.digits
    }

    pub fn exponent(&self) -> i64 {
        self.exponent
    }

    /// The value as an `i64` if it is an integer in range (`1.0` yes, `1.5` and `1e309` no).
    pub fn to_i64(&self) -> Option<i64> {
        // Normal form has no trailing zeros, so a negative exponent always means a fraction,
        // and a 20+ digit magnitude cannot fit; checking first keeps `1e999999` cheap.
        let exponent = usize::try_from(self.exponent).ok()?;
        if self.digits.len().saturating_add(exponent) > 19 {
            return None;
        }
        let mut magnitude: i128 = 0;
        for d in self.digits.bytes() {
            let digit = char::from(d).to_digit(10)?;
            magnitude = magnitude.checked_mul(10)?.checked_add(i128::from(digit))?;
        }
        for _ in 0..exponent {
            magnitude = magnitude.checked_mul(10)?;
        }
        i64::try_from(if self.negative { -magnitude } else { magnitude }).ok()
    }

    /// The value in plain decimal if it is an integer of at most `max_len` characters (`1e3`
    /// is `1000`, `-0` is `0`); `None` for a fraction or a longer one. For an `i64` it is the
    /// integer's own text; past `i64` (a sender's unsigned 64-bit ids) it goes on the same way.
    pub fn integer_text(&self, max_len: usize) -> Option<String> {
        let zeros = usize::try_from(self.exponent).ok()?;
        // Checked: on a 32-bit target the exponent alone can come near `usize::MAX`.
        let len = usize::from(self.negative)
            .checked_add(self.digits.len().max(1))?
            .checked_add(zeros)?;
        if len > max_len {
            return None;
        }
        if self.digits.is_empty() {
            return Some("0".to_owned());
        }
        let mut text = String::with_capacity(len);
        if self.negative {
            text.push('-');
        }
        text.push_str(&self.digits);
        text.extend(std::iter::repeat_n('0', zeros));
        Some(text)
    }

    /// The value as people write it, in plain decimal without an exponent (`19.99`, `0.005`,
    /// `12000`), if that takes at most `max_len` characters; `None` for a longer one (`1e309`).
    /// For display: the canonical form says `1999e-2` for 19.99.
    pub fn plain_text(&self, max_len: usize) -> Option<String> {
        if self.exponent >= 0 || self.digits.is_empty() {
            return self.integer_text(max_len);
        }
        let after = usize::try_from(self.exponent.unsigned_abs()).ok()?;
        let digits = self.digits.len();
        let body = if digits > after {
            digits.checked_add(1)?
        } else {
            after.checked_add(2)?
        };
        if usize::from(self.negative).checked_add(body)? > max_len {
            return None;
        }
        let mut text = String::with_capacity(body + 1);
        if self.negative {
            text.push('-');
        }
        if digits > after {
            text.push_str(&self.digits[..digits - after]);
            text.push('.');
            text.push_str(&self.digits[digits - after..]);
        } else {
            text.push_str("0.");
            text.extend(std::iter::repeat_n('0', after - digits));
            text.push_str(&self.digits);
        }
        Some(text)
    }

    /// Builds the normal form from the pieces of a JSON number literal, or `None` if the
    /// exponent cannot be represented. `exponent` is `None` when the literal's exponent was
    /// already too large to track; a zero mantissa is still fine then.
    fn from_literal(negative: bool, int: &str, frac: &str, exponent: Option<i128>) -> Option<Self> {
        let all = format!("{int}{frac}");
        let significant = all.trim_start_matches('0');
        let digits = significant.trim_end_matches('0');
        if digits.is_empty() {
            return Some(Self::default());
        }
        let trailing_zeros = significant.len() - digits.len();
        // i128 keeps the intermediate exact so acceptance depends only on the value, not on
        // how it was spelled (`0.1e9223372036854775808` is `1e9223372036854775807`).
        let exponent = exponent?
            .checked_sub(i128::try_from(frac.len()).ok()?)?
            .checked_add(i128::try_from(trailing_zeros).ok()?)?;
        Some(Self {
            negative,
            digits: digits.to_owned(),
            exponent: i64::try_from(exponent).ok()?,
        })
    }
}

/// Canonical form: `0`, or an optional `-`, the digits, and `e<exponent>` when non-zero.
impl fmt::Display for Number {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.digits.is_empty() {
            return f.write_str("0");
        }
        if self.negative {
            f.write_str("-")?;
        }
        f.write_str(&self.digits)?;
        if self.exponent != 0 {
            write!(f, "e{}", self.exponent)?;
        }
        Ok(())
    }
}

/// A parsed JSON value. Parsed objects have unique member names sorted by their UTF-8 bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Null,
    Bool(bool),
    Number(Number),
    String(String),
    Array(Vec<Value>),
    Object(Vec<(String, Value)>),
}

/// One step of the canonical writer; an explicit stack keeps deep hand-built values from
/// overflowing the call stack.
enum Emit<'a> {
    Value(&'a Value),
    Key(&'a String),
    Byte(u8),
}

impl Value {
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value `p` refers to, or `None` if any step is missing.
    pub fn pointer(&self, p: &Pointer) -> Option<&Value> {
        p.tokens()
            .iter()
            .try_fold(self, |value, token| match value {
                // Linear rather than binary search: hand-built objects need not be sorted.
                Value::Object(members) => members.iter().find(|(k, _)| k == token).map(|(_, v)| v),
                Value::Array(items) => array_index(token).and_then(|i| items.get(i)),
                _ => None,
            })
    }

    pub fn canonical(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_canonical(&mut out);
        out
    }

    /// Appends the canonical encoding: no insignificant whitespace, members sorted by key bytes,
    /// minimal string escapes and canonical numbers. Equal values always give equal bytes.
    pub fn write_canonical(&self, out: &mut Vec<u8>) {
        let mut stack = vec![Emit::Value(self)];
        while let Some(step) = stack.pop() {
            match step {
                Emit::Byte(b) => out.push(b),
                Emit::Key(s) | Emit::Value(Value::String(s)) => write_string(s, out),
                Emit::Value(Value::Null) => out.extend_from_slice(b"null"),
                Emit::Value(Value::Bool(b)) => {
                    out.extend_from_slice(if *b { "true" } else { "false" }.as_bytes());
                }
                Emit::Value(Value::Number(n)) => out.extend_from_slice(n.to_string().as_bytes()),
                Emit::Value(Value::Array(items)) => {
                    out.push(b'[');
                    stack.push(Emit::Byte(b']'));
                    for (i, item) in items.iter().enumerate().rev() {
                        stack.push(Emit::Value(item));
                        if i > 0 {
                            stack.push(Emit::Byte(b','));
                        }
                    }
                }
                Emit::Value(Value::Object(members)) => {
                    // Sorting here too means hand-built objects still canonicalise correctly.
                    let mut sorted: Vec<&(String, Value)> = members.iter().collect();
                    sorted.sort_by(|a, b| a.0.cmp(&b.0));
                    out.push(b'{');
                    stack.push(Emit::Byte(b'}'));
                    for (i, (key, item)) in sorted.into_iter().enumerate().rev() {
                        stack.push(Emit::Value(item));
                        stack.push(Emit::Byte(b':'));
                        stack.push(Emit::Key(key));
                        if i > 0 {
                            stack.push(Emit::Byte(b','));
                        }
                    }
                }
            }
        }
    }
}

/// Escapes only what JSON requires, using the short forms where JSON has them (as RFC 8785
/// does) so there is exactly one spelling of every string.
fn write_string(s: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    for &b in s.as_bytes() {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            0..0x20 => out.extend_from_slice(format!("\\u{b:04x}").as_bytes()),
            _ => out.push(b),
        }
    }
    out.push(b'"');
}

#[cfg(test)]
pub(crate) mod tests;
