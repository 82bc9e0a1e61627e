//! The strict JSON parser: recursive descent over validated UTF-8, exact decimal numbers.

use super::{JsonError, MAX_DEPTH, Number, Value};

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
