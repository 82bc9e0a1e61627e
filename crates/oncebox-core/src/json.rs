//! Strict RFC 8259 JSON: parsing with exact decimal numbers, canonical bytes, and RFC 6901 pointers.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

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
        p.0.iter().try_fold(self, |value, token| match value {
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

/// RFC 6901 array index: `0` or decimal without a leading zero; `-` (past the end) never exists.
fn array_index(token: &str) -> Option<usize> {
    match token.as_bytes() {
        [b'0'] => Some(0),
        [b'1'..=b'9', rest @ ..] if rest.iter().all(u8::is_ascii_digit) => token.parse().ok(),
        _ => None,
    }
}

/// Parses one strict JSON document; see the crate's fingerprint contract for the rules.
pub fn parse(input: &[u8]) -> Result<Value, JsonError> {
    let text = std::str::from_utf8(input).map_err(|e| JsonError::InvalidUtf8 {
        offset: e.valid_up_to(),
    })?;
    if text.starts_with('\u{feff}') {
        return Err(JsonError::ByteOrderMark);
    }
    let mut parser = Parser { text, pos: 0 };
    parser.skip_whitespace();
    if parser.peek().is_none() {
        return Err(JsonError::Empty);
    }
    let value = parser.value(0)?;
    parser.skip_whitespace();
    match parser.peek() {
        None => Ok(value),
        Some(_) => Err(JsonError::TrailingData { offset: parser.pos }),
    }
}

/// Recursive descent over already-validated UTF-8; recursion depth is capped by `MAX_DEPTH`.
struct Parser<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn rest(&self) -> &[u8] {
        self.text.as_bytes().get(self.pos..).unwrap_or_default()
    }

    fn syntax(&self) -> JsonError {
        JsonError::Syntax { offset: self.pos }
    }

    fn eat(&mut self, b: u8) -> bool {
        let found = self.peek() == Some(b);
        if found {
            self.pos += 1;
        }
        found
    }

    fn expect(&mut self, b: u8) -> Result<(), JsonError> {
        if self.eat(b) {
            Ok(())
        } else {
            Err(self.syntax())
        }
    }

    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    fn skip_digits(&mut self) -> &'a str {
        let start = self.pos;
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.pos += 1;
        }
        self.text.get(start..self.pos).unwrap_or_default()
    }

    fn value(&mut self, depth: usize) -> Result<Value, JsonError> {
        match self.peek() {
            Some(b'[' | b'{') if depth >= MAX_DEPTH => Err(JsonError::TooDeep { limit: MAX_DEPTH }),
            Some(b'[') => self.array(depth + 1),
            Some(b'{') => self.object(depth + 1),
            Some(b'"') => self.string().map(Value::String),
            Some(b't') => self.literal("true", Value::Bool(true)),
            Some(b'f') => self.literal("false", Value::Bool(false)),
            Some(b'n') => self.literal("null", Value::Null),
            Some(b'-' | b'0'..=b'9') => self.number().map(Value::Number),
            _ => Err(self.syntax()),
        }
    }

    fn literal(&mut self, word: &str, value: Value) -> Result<Value, JsonError> {
        if !self.rest().starts_with(word.as_bytes()) {
            return Err(self.syntax());
        }
        self.pos += word.len();
        Ok(value)
    }

    fn array(&mut self, depth: usize) -> Result<Value, JsonError> {
        self.pos += 1;
        let mut items = Vec::new();
        self.skip_whitespace();
        if self.eat(b']') {
            return Ok(Value::Array(items));
        }
        loop {
            self.skip_whitespace();
            items.push(self.value(depth)?);
            self.skip_whitespace();
            if self.eat(b']') {
                return Ok(Value::Array(items));
            }
            self.expect(b',')?;
        }
    }

    fn object(&mut self, depth: usize) -> Result<Value, JsonError> {
        self.pos += 1;
        let mut members = Vec::new();
        self.skip_whitespace();
        if !self.eat(b'}') {
            loop {
                self.skip_whitespace();
                if self.peek() != Some(b'"') {
                    return Err(self.syntax());
                }
                let name = self.string()?;
                self.skip_whitespace();
                self.expect(b':')?;
                self.skip_whitespace();
                members.push((name, self.value(depth)?));
                self.skip_whitespace();
                if self.eat(b'}') {
                    break;
                }
                self.expect(b',')?;
            }
        }
        // Names compare after unescaping, so `"a"` and `"\u0061"` collide here as they should.
        members.sort_by(|a, b| a.0.cmp(&b.0));
        let duplicate = members.windows(2).find_map(|pair| match pair {
            [(a, _), (b, _)] if a == b => Some(a.chars().take(64).collect()),
            _ => None,
        });
        match duplicate {
            Some(name) => Err(JsonError::DuplicateName { name }),
            None => Ok(Value::Object(members)),
        }
    }

    fn string(&mut self) -> Result<String, JsonError> {
        self.pos += 1;
        let mut out = String::new();
        loop {
            let start = self.pos;
            while self
                .peek()
                .is_some_and(|b| b != b'"' && b != b'\\' && b >= 0x20)
            {
                self.pos += 1;
            }
            // The run stops only at ASCII bytes, so it ends on a char boundary of valid UTF-8.
            out.push_str(
                self.text
                    .get(start..self.pos)
                    .ok_or_else(|| self.syntax())?,
            );
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => out.push(self.escape()?),
                Some(_) => return Err(JsonError::ControlCharacter { offset: self.pos }),
                None => return Err(self.syntax()),
            }
        }
    }

    fn escape(&mut self) -> Result<char, JsonError> {
        let at = self.pos;
        let kind = self.text.as_bytes().get(at + 1).copied();
        self.pos = at + 2;
        Ok(match kind {
            Some(b'u') => return self.unicode_escape(at),
            Some(b'"') => '"',
            Some(b'\\') => '\\',
            Some(b'/') => '/',
            Some(b'b') => '\u{8}',
            Some(b'f') => '\u{c}',
            Some(b'n') => '\n',
            Some(b'r') => '\r',
            Some(b't') => '\t',
            _ => return Err(JsonError::Syntax { offset: at + 1 }),
        })
    }

    /// Decodes the rest of a `\u` escape starting at `at`, pairing surrogates and refusing any
    /// that are unpaired, since they have no UTF-8 encoding.
    fn unicode_escape(&mut self, at: usize) -> Result<char, JsonError> {
        let lone = JsonError::LoneSurrogate { offset: at };
        let code = match self.hex4()? {
            high @ 0xD800..=0xDBFF => {
                if !self.rest().starts_with(b"\\u") {
                    return Err(lone);
                }
                self.pos += 2;
                let low = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&low) {
                    return Err(lone);
                }
                0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00)
            }
            0xDC00..=0xDFFF => return Err(lone),
            code => code,
        };
        char::from_u32(code).ok_or(lone)
    }

    fn hex4(&mut self) -> Result<u32, JsonError> {
        let mut code = 0;
        for _ in 0..4 {
            let digit = self.peek().and_then(|b| char::from(b).to_digit(16));
            code = code * 16 + digit.ok_or_else(|| self.syntax())?;
            self.pos += 1;
        }
        Ok(code)
    }

    fn number(&mut self) -> Result<Number, JsonError> {
        let start = self.pos;
        let negative = self.eat(b'-');
        let int = match self.peek() {
            Some(b'0') => {
                self.pos += 1;
                if self.peek().is_some_and(|b| b.is_ascii_digit()) {
                    return Err(self.syntax());
                }
                "0"
            }
            Some(b'1'..=b'9') => self.skip_digits(),
            _ => return Err(self.syntax()),
        };
        let mut frac = "";
        if self.eat(b'.') {
            frac = self.skip_digits();
            if frac.is_empty() {
                return Err(self.syntax());
            }
        }
        let mut exponent = Some(0);
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.pos += 1;
            let exp_negative = self.eat(b'-');
            if !exp_negative {
                self.eat(b'+');
            }
            let digits = self.skip_digits();
            if digits.is_empty() {
                return Err(self.syntax());
            }
            exponent = exponent_value(digits, exp_negative);
        }
        Number::from_literal(negative, int, frac, exponent)
            .ok_or(JsonError::NumberOutOfRange { offset: start })
    }
}

/// The exponent literal's value, or `None` once it is beyond 2^100: no fraction or trailing
/// zeros in a real input could bring that back into `i64` range.
fn exponent_value(digits: &str, negative: bool) -> Option<i128> {
    let mut value: i128 = 0;
    for d in digits.bytes() {
        value = value * 10 + i128::from(d - b'0');
        if value > 1 << 100 {
            return None;
        }
    }
    Some(if negative { -value } else { value })
}

/// An RFC 6901 JSON Pointer, held as its unescaped reference tokens.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Pointer(Vec<String>);

/// Why a string is not a JSON Pointer.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PointerError {
    #[error("a JSON pointer must be empty or start with '/'")]
    MissingLeadingSlash,
    #[error("invalid '~' escape at byte {offset} of a JSON pointer (only ~0 and ~1 exist)")]
    InvalidEscape { offset: usize },
}

impl Pointer {
    pub fn parse(s: &str) -> Result<Self, PointerError> {
        if s.is_empty() {
            return Ok(Self::default());
        }
        let rest = s
            .strip_prefix('/')
            .ok_or(PointerError::MissingLeadingSlash)?;
        let mut tokens = Vec::new();
        let mut offset = 1;
        for raw in rest.split('/') {
            tokens.push(unescape_token(raw, offset)?);
            offset += raw.len() + 1;
        }
        Ok(Self(tokens))
    }

    pub fn from_tokens(tokens: Vec<String>) -> Self {
        Self(tokens)
    }

    pub fn tokens(&self) -> &[String] {
        &self.0
    }
}

fn unescape_token(raw: &str, offset: usize) -> Result<String, PointerError> {
    let mut token = String::with_capacity(raw.len());
    let mut chars = raw.char_indices();
    while let Some((i, c)) = chars.next() {
        if c != '~' {
            token.push(c);
            continue;
        }
        match chars.next() {
            Some((_, '0')) => token.push('~'),
            Some((_, '1')) => token.push('/'),
            _ => return Err(PointerError::InvalidEscape { offset: offset + i }),
        }
    }
    Ok(token)
}

impl FromStr for Pointer {
    type Err = PointerError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for Pointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for token in &self.0 {
            f.write_str("/")?;
            for c in token.chars() {
                match c {
                    '~' => f.write_str("~0")?,
                    '/' => f.write_str("~1")?,
                    c => fmt::Write::write_char(f, c)?,
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests;
