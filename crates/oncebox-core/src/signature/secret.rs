//! Signing keys as configured: how each scheme's senders write them, normalised once to an
//! HMAC key block, never printed.

use std::fmt;

use base64::Engine as _;
use base64::engine::DecodePaddingMode;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use hmac::Mac as _;
use hmac::digest::generic_array::GenericArray;
use sha2::{Digest as _, Sha256};
use thiserror::Error;

use super::{HmacSha256, Scheme, TAG_LEN};

/// The Standard Webhooks secret prefix (spec: "whsec_" followed by base64).
const WHSEC_PREFIX: &str = "whsec_";

/// Configured secrets are trusted operator input: accept them with or without base64 padding,
/// as the reference libraries do. Signatures from the wire are decoded strictly instead.
const SECRET_BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// A signing key. Its value is never printed: `Debug` and `Display` show `Secret(***)`.
///
/// It holds the key already normalised to one SHA-256 block exactly as HMAC (RFC 2104) does: a
/// key longer than 64 bytes is hashed, a shorter one zero-padded. Doing it once here keeps
/// construction infallible and makes every MAC cost the same whatever the secret's length.
#[derive(Clone)]
pub struct Secret {
    block: [u8; 64],
    /// The key's length before normalising: the block no longer tells a short key apart.
    key_len: usize,
}

impl Secret {
    /// A secret from raw key bytes. An empty key is allowed here (it is a valid HMAC key);
    /// [`Secret::parse`] refuses empty configuration.
    pub fn from_bytes(bytes: Vec<u8>) -> Secret {
        let key_len = bytes.len();
        let mut block = [0u8; 64];
        if bytes.len() > block.len() {
            let digest = Sha256::digest(&bytes);
            block.iter_mut().zip(digest).for_each(|(d, s)| *d = s);
        } else {
            block.iter_mut().zip(bytes).for_each(|(d, s)| *d = s);
        }
        Secret { block, key_len }
    }

    /// How many bytes the key has, as decoded (a standard-webhooks secret's base64) or as
    /// written: for callers that require a strong key where they choose it, such as a route
    /// that signs. Verification takes whatever key the sender chose.
    pub fn key_len(&self) -> usize {
        self.key_len
    }

    /// Whether `other` is the same HMAC key: the same bytes once decoded (a `whsec_` secret
    /// and its bare base64 are one key), or keys HMAC cannot tell apart. Configuration uses it
    /// to refuse one key serving two sources, or a route signing with a source's key, where a
    /// request signed for one would be accepted by the other.
    pub fn same_key(&self, other: &Secret) -> bool {
        self.block == other.block
    }

    /// A secret as written in configuration, read the way `scheme`'s senders use it:
    /// Standard Webhooks secrets are base64 after an optional `whsec_` prefix (as in the
    /// reference libraries) and the decoded bytes are the key; Stripe, GitHub and `hmac-sha256`
    /// secrets are the raw UTF-8 bytes of the string (a Stripe `whsec_…` secret included).
    pub fn parse(scheme: &Scheme, configured: &str) -> Result<Secret, SecretError> {
        if configured.is_empty() {
            return Err(SecretError::Empty);
        }
        match scheme {
            // A secret next to `none` means the operator believes the source is protected.
            Scheme::None => Err(SecretError::SchemeTakesNoSecret),
            Scheme::StandardWebhooks => {
                let encoded = configured.strip_prefix(WHSEC_PREFIX).unwrap_or(configured);
                let key = SECRET_BASE64
                    .decode(encoded)
                    .map_err(|_| SecretError::NotBase64)?;
                if key.is_empty() {
                    return Err(SecretError::Empty);
                }
                Ok(Secret::from_bytes(key))
            }
            Scheme::Stripe | Scheme::Github | Scheme::HmacSha256 { .. } => {
                Ok(Secret::from_bytes(configured.as_bytes().to_vec()))
            }
        }
    }

    /// HMAC-SHA256 over the concatenation of `parts`.
    pub(super) fn tag(&self, parts: &[&[u8]]) -> [u8; TAG_LEN] {
        let mut mac = HmacSha256::new(&GenericArray::from(self.block));
        for part in parts {
            mac.update(part);
        }
        mac.finalize().into_bytes().into()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// Why a configured secret was refused; the message names the rule and never the secret.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum SecretError {
    #[error("secret must not be empty")]
    Empty,
    #[error(
        "a standard-webhooks secret must be base64 (standard alphabet) after the optional `whsec_` prefix"
    )]
    NotBase64,
    #[error("signature scheme `none` takes no secret")]
    SchemeTakesNoSecret,
}
