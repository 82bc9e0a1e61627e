//! RFC 6901 JSON Pointers: parsing, display and array index rules.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

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

/// RFC 6901 array index: `0` or decimal without a leading zero; `-` (past the end) never exists.
pub(super) fn array_index(token: &str) -> Option<usize> {
    match token.as_bytes() {
        [b'0'] => Some(0),
        [b'1'..=b'9', rest @ ..] if rest.iter().all(u8::is_ascii_digit) => token.parse().ok(),
        _ => None,
    }
}
