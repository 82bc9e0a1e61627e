//! Payload fingerprints (which bytes make two requests "the same") and derived event ids.

use std::fmt;

use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::json::{self, JsonError, Pointer, Value};

// Every prefix and byte layout below is hashed into fingerprints and ids that are stored in
// users' databases. Changing any of them silently turns every retried request into a
// "different payload" conflict, so they must never change; add a new `/v2` mode instead.
const JSON_PREFIX: &[u8] = b"oncebox/json/v1\0";
const FIELDS_PREFIX: &[u8] = b"oncebox/fields/v1\0";
const RAW_PREFIX: &[u8] = b"oncebox/raw/v1\0";
const DERIVED_ID_PREFIX: &[u8] = b"oncebox/derived-id/v1\0";

/// A SHA-256 payload fingerprint.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// `None` unless `bytes` is exactly 32 bytes long.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        <[u8; 32]>::try_from(bytes).ok().map(Self)
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl From<[u8; 32]> for Fingerprint {
    fn from(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

/// Which parts of a payload decide whether a retry carries "the same" request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FingerprintMode {
    /// The whole document, so key order, whitespace and number spelling don't matter.
    #[default]
    Json,
    /// Only these fields, in this order; an absent field is distinct from `null`.
    Fields(Vec<Pointer>),
    /// The exact bytes; for payloads that are not JSON, or where every byte matters.
    Raw,
}

/// Why a payload cannot be fingerprinted.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PayloadError {
    #[error("invalid JSON: {0}")]
    Json(#[from] JsonError),
    #[error("payload has no field at {pointer:?}")]
    MissingField { pointer: String },
    /// An empty field list: every payload would get the same derived id, or the same
    /// fingerprint (so a reused key would never be told apart).
    #[error(
        "no fields configured (an id derived from, or a fingerprint of, no fields is the same for every payload)"
    )]
    NoFields,
}

impl FingerprintMode {
    pub fn fingerprint(&self, payload: &[u8]) -> Result<Fingerprint, PayloadError> {
        self.fingerprint_parsed(payload, None)
    }

    /// As [`FingerprintMode::fingerprint`], with `parsed` the payload already parsed by
    /// `json::parse` (the gateway parses it once for the event id and routes as well).
    pub fn fingerprint_parsed(
        &self,
        payload: &[u8],
        parsed: Option<&Value>,
    ) -> Result<Fingerprint, PayloadError> {
        let mut hasher = Sha256::new();
        let owned;
        let value = match parsed {
            Some(v) => v,
            // The raw mode reads no JSON.
            None if matches!(self, Self::Raw) => &Value::Null,
            None => {
                owned = json::parse(payload)?;
                &owned
            }
        };
        match self {
            Self::Json => {
                hasher.update(JSON_PREFIX);
                // The canonical form is about as long as the payload: one allocation, no regrowth.
                let mut canonical = Vec::with_capacity(payload.len());
                value.write_canonical(&mut canonical);
                hasher.update(&canonical);
            }
            Self::Fields(pointers) if pointers.is_empty() => return Err(PayloadError::NoFields),
            Self::Fields(pointers) => {
                hasher.update(FIELDS_PREFIX);
                hash_fields(&mut hasher, value, pointers, false)?;
            }
            Self::Raw => {
                hasher.update(RAW_PREFIX);
                hasher.update(payload);
            }
        }
        Ok(Fingerprint(hasher.finalize().into()))
    }
}

/// Derives a 64-character lowercase hex event id from the fields at `pointers`, for senders
/// that send no id of their own. Every field must be present: an id silently built from a
/// missing field would merge unrelated events.
pub fn derive_event_id(payload: &[u8], pointers: &[Pointer]) -> Result<String, PayloadError> {
    // With no fields every payload would get the same id and all but the first event would be
    // dropped as duplicates.
    if pointers.is_empty() {
        return Err(PayloadError::NoFields);
    }
    let value = json::parse(payload)?;
    let mut hasher = Sha256::new();
    hasher.update(DERIVED_ID_PREFIX);
    hash_fields(&mut hasher, &value, pointers, true)?;
    Ok(hex::encode(hasher.finalize()))
}

/// Per pointer: the length-prefixed pointer text, then `0` if absent or `1` and the
/// length-prefixed canonical value. Length prefixes keep `("x", "")` and `("", "x")` apart.
fn hash_fields(
    hasher: &mut Sha256,
    value: &Value,
    pointers: &[Pointer],
    required: bool,
) -> Result<(), PayloadError> {
    for pointer in pointers {
        let text = pointer.to_string();
        update_length_prefixed(hasher, text.as_bytes());
        match value.pointer(pointer) {
            None if required => return Err(PayloadError::MissingField { pointer: text }),
            None => hasher.update([0]),
            Some(field) => {
                hasher.update([1]);
                update_length_prefixed(hasher, &field.canonical());
            }
        }
    }
    Ok(())
}

fn update_length_prefixed(hasher: &mut Sha256, bytes: &[u8]) {
    // usize never exceeds u64 on supported targets; saturating keeps this total regardless.
    let len = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    hasher.update(len.to_be_bytes());
    hasher.update(bytes);
}

#[cfg(test)]
mod tests;
