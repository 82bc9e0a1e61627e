//! Webhook authenticity as pure functions: each signature scheme's verification and signing.
//!
//! The gateway calls [`verify`] over the raw body before any parsing or database access; `oncebox
//! send` and the relay call [`sign`]. Nothing here does IO or knows an HTTP library: headers come
//! through the small [`Headers`] trait.
//!
//! Hostile input is bounded before any MAC is computed: a header longer than
//! [`MAX_HEADER_BYTES`] or a list of more than [`MAX_SIGNATURES`] signatures is refused as
//! malformed, so a forged request costs at most `secrets × 1` HMACs over the body whatever it sends.

mod schemes;
mod secret;

pub use schemes::{SVIX_ID, WEBHOOK_ID};
pub use secret::{Secret, SecretError};

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose;
use hmac::Hmac;
use sha2::Sha256;
use subtle::{Choice, ConstantTimeEq as _};
use thiserror::Error;

use crate::clock::Timestamp;

/// A header value longer than this is refused before any decoding or MAC. Real signature headers
/// are well under 1 KiB even with a full rotation list. (Error messages spell out the number.)
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

/// At most this many signatures in one rotation list (Standard Webhooks entries, Stripe `v1`
/// entries): each one costs a comparison for every configured secret. (Error messages spell out
/// the number.)
pub const MAX_SIGNATURES: usize = 64;

/// Bytes of an HMAC-SHA256 tag.
const TAG_LEN: usize = 32;

type HmacSha256 = Hmac<Sha256>;

/// Request headers as the verifier reads them.
///
/// `name` is always lowercase ASCII. A header that appears several times yields its first value
/// (the gateway passes the first one). Values are used exactly as given: no trimming, no
/// unfolding; HTTP parsers already strip optional whitespace around a field value.
pub trait Headers {
    fn get(&self, name: &str) -> Option<&[u8]>;
}

/// Names compare ASCII case-insensitively; the first matching pair wins.
impl Headers for [(&str, &[u8])] {
    fn get(&self, name: &str) -> Option<&[u8]> {
        self.iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
    }
}

impl<const N: usize> Headers for [(&str, &[u8]); N] {
    fn get(&self, name: &str) -> Option<&[u8]> {
        Headers::get(self.as_slice(), name)
    }
}

/// Names compare ASCII case-insensitively; the first matching key in map order wins.
impl Headers for BTreeMap<String, Vec<u8>> {
    fn get(&self, name: &str) -> Option<&[u8]> {
        self.iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }
}

/// How a source proves that a request comes from it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Scheme {
    /// No check at all; every request is accepted (the gateway logs this loudly).
    None,
    /// <https://www.standardwebhooks.com/>: `webhook-id`, `webhook-timestamp`,
    /// `webhook-signature: v1,<base64> v1,<base64>…` over `{id}.{timestamp}.{body}`.
    StandardWebhooks,
    /// `Stripe-Signature: t=<seconds>,v1=<hex>[,v1=<hex>…]` over `{t}.{body}`; only `v1` counts.
    Stripe,
    /// `X-Hub-Signature-256: sha256=<hex>` over the raw body; no timestamp.
    Github,
    /// `{header}: {prefix}{encoding(HMAC-SHA256(body))}`; no timestamp. `header` is matched
    /// case-insensitively, `prefix` byte for byte.
    HmacSha256 {
        header: String,
        encoding: Encoding,
        prefix: String,
    },
}

impl Scheme {
    /// The configuration spelling (`signature = "…"` in `oncebox.toml`).
    pub fn name(&self) -> &'static str {
        match self {
            Scheme::None => "none",
            Scheme::StandardWebhooks => "standard-webhooks",
            Scheme::Stripe => "stripe",
            Scheme::Github => "github",
            Scheme::HmacSha256 { .. } => "hmac-sha256",
        }
    }
}

/// Text encoding of a MAC in a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Encoding {
    /// Lowercase when signing; either case accepted when verifying.
    Hex,
    /// Standard alphabet with padding (RFC 4648 §4).
    Base64,
}

/// What a successful verification established about the request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Verified {
    /// The signed send time (Standard Webhooks, Stripe), at the start of its second.
    pub timestamp: Option<Timestamp>,
    /// The `webhook-id` header as sent (Standard Webhooks only); not yet validated as an event id.
    pub webhook_id: Option<String>,
}

/// Why a request is not authentic. Messages name the rule broken, never a secret or a MAC.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum SignatureError {
    #[error("required header `{header}` is missing")]
    Missing { header: String },
    #[error("header `{header}` is malformed: {reason}")]
    Malformed {
        header: String,
        reason: &'static str,
    },
    /// Also the answer when no secret is configured: verification fails closed.
    #[error("no signature matches a configured secret")]
    Mismatch,
    #[error("signed timestamp is outside the tolerance")]
    TimestampOutOfTolerance,
}

/// Checks that `body` with `headers` was signed by one of `secrets` under `scheme`, and for timed
/// schemes that the signed timestamp is within `tolerance` of `now` in either direction
/// (inclusive). Any signature matching any secret passes, so both sides can rotate keys.
///
/// Order: headers are parsed and bounded first ([`SignatureError::Malformed`]), then the
/// timestamp is checked, and only then are MACs computed, so floods of stale or garbage requests
/// cost no HMAC. Comparisons are constant-time and every (secret, signature) pair is compared.
pub fn verify<H: Headers + ?Sized>(
    scheme: &Scheme,
    secrets: &[Secret],
    headers: &H,
    body: &[u8],
    now: Timestamp,
    tolerance: Duration,
) -> Result<Verified, SignatureError> {
    let check = Check {
        secrets,
        body: Some(body),
        now,
        tolerance,
    };
    run(scheme, &check, headers)
}

/// The part of [`verify`] that needs no body: each header present, well formed and bounded,
/// and the signed timestamp within `tolerance`. A request refused here is refused by `verify`
/// with the same error, so it can be turned away before its body is read: a flood of unsigned
/// or stale requests then costs neither the bytes nor the time of a body.
pub fn verify_headers<H: Headers + ?Sized>(
    scheme: &Scheme,
    headers: &H,
    now: Timestamp,
    tolerance: Duration,
) -> Result<(), SignatureError> {
    let check = Check {
        secrets: &[],
        body: None,
        now,
        tolerance,
    };
    run(scheme, &check, headers).map(|_| ())
}

fn run<H: Headers + ?Sized>(
    scheme: &Scheme,
    check: &Check<'_>,
    headers: &H,
) -> Result<Verified, SignatureError> {
    match scheme {
        Scheme::None => Ok(Verified {
            timestamp: None,
            webhook_id: None,
        }),
        Scheme::StandardWebhooks => schemes::verify_standard_webhooks(check, headers),
        Scheme::Stripe => schemes::verify_stripe(check, headers),
        Scheme::Github => schemes::verify_github(check, headers),
        Scheme::HmacSha256 {
            header,
            encoding,
            prefix,
        } => schemes::verify_hmac_sha256(check, headers, header, *encoding, prefix),
    }
}

/// The header(s) a sender sets for `body` under `scheme`, as lowercase `(name, value)` pairs.
/// `id` and `timestamp` are used by Standard Webhooks (both) and Stripe (timestamp only), and
/// truncated to whole seconds; `Scheme::None` yields no header.
pub fn sign(
    scheme: &Scheme,
    secret: &Secret,
    id: &str,
    timestamp: Timestamp,
    body: &[u8],
) -> Vec<(String, String)> {
    match scheme {
        Scheme::None => Vec::new(),
        Scheme::StandardWebhooks => schemes::sign_standard_webhooks(secret, id, timestamp, body),
        Scheme::Stripe => schemes::sign_stripe(secret, timestamp, body),
        Scheme::Github => schemes::sign_github(secret, body),
        Scheme::HmacSha256 {
            header,
            encoding,
            prefix,
        } => schemes::sign_hmac_sha256(secret, body, header, *encoding, prefix),
    }
}

/// The request-independent inputs of one verification.
struct Check<'a> {
    secrets: &'a [Secret],
    /// `None` when only the headers are checked: no MAC is computed then.
    body: Option<&'a [u8]>,
    now: Timestamp,
    tolerance: Duration,
}

impl Check<'_> {
    fn within_tolerance(&self, signed_at: Timestamp) -> Result<(), SignatureError> {
        // The signed times are whole seconds: `now` is cut to its second too, or a signature
        // exactly the tolerance old would fail by the milliseconds past it while one exactly
        // the tolerance ahead passes. In i128: no overflow at i64::MIN or i64::MAX.
        let now = i128::from(self.now.0).div_euclid(1000) * 1000;
        let skew = (now - i128::from(signed_at.0)).unsigned_abs();
        if skew > self.tolerance.as_millis() {
            return Err(SignatureError::TimestampOutOfTolerance);
        }
        Ok(())
    }

    /// Whether any secret's tag over `signed` equals any candidate. Every pair is compared,
    /// without early exit, so timing says nothing about which secret or entry matched.
    fn matches(
        &self,
        signed: &[&[u8]],
        candidates: &[[u8; TAG_LEN]],
    ) -> Result<(), SignatureError> {
        if self.body.is_none() {
            return Ok(());
        }
        let mut found = Choice::from(0);
        for secret in self.secrets {
            let tag = secret.tag(signed);
            for candidate in candidates {
                found |= tag.ct_eq(candidate);
            }
        }
        if bool::from(found) {
            Ok(())
        } else {
            Err(SignatureError::Mismatch)
        }
    }
}

fn malformed(header: &str, reason: &'static str) -> SignatureError {
    SignatureError::Malformed {
        header: header.to_owned(),
        reason,
    }
}

/// A required header's value, refused when absent or longer than [`MAX_HEADER_BYTES`].
fn required<'h, H: Headers + ?Sized>(
    headers: &'h H,
    name: &str,
) -> Result<&'h [u8], SignatureError> {
    let value = headers.get(name).ok_or_else(|| SignatureError::Missing {
        header: name.to_owned(),
    })?;
    if value.len() > MAX_HEADER_BYTES {
        return Err(malformed(name, "longer than 65536 bytes"));
    }
    Ok(value)
}

/// Unix seconds as senders write them: ASCII digits only, no sign, no whitespace, no leading
/// zero (so the text is the one reformatting would produce, and signing it is unambiguous).
/// Negative times are refused as malformed: no sender signs before 1970.
fn parse_seconds(text: &[u8]) -> Result<Timestamp, &'static str> {
    const RULE: &str =
        "timestamp must be unix seconds in decimal digits without sign or leading zero";
    let (first, _) = text.split_first().ok_or(RULE)?;
    if !text.iter().all(u8::is_ascii_digit) || (*first == b'0' && text.len() > 1) {
        return Err(RULE);
    }
    let mut seconds: i64 = 0;
    for digit in text {
        let value = char::from(*digit).to_digit(10).ok_or(RULE)?;
        seconds = seconds
            .checked_mul(10)
            .and_then(|s| s.checked_add(i64::from(value)))
            .ok_or("timestamp is out of range")?;
    }
    seconds
        .checked_mul(1000)
        .map(Timestamp)
        .ok_or("timestamp is out of range")
}

/// Whole seconds for a signed header; the sub-second part is dropped.
fn seconds(t: Timestamp) -> i64 {
    t.0.div_euclid(1000)
}

fn decode_hex_tag(text: &[u8]) -> Option<[u8; TAG_LEN]> {
    let mut tag = [0u8; TAG_LEN];
    hex::decode_to_slice(text, &mut tag).ok()?;
    Some(tag)
}

fn decode_base64_tag(text: &[u8]) -> Option<[u8; TAG_LEN]> {
    // 32 bytes encode to exactly 44 characters with padding; checking first bounds the work.
    if text.len() != 44 {
        return None;
    }
    general_purpose::STANDARD.decode(text).ok()?.try_into().ok()
}

#[cfg(test)]
mod tests;
