//! The wire format of each signature scheme: which headers, which bytes are signed, how parsed.

use base64::Engine as _;
use base64::engine::general_purpose;

use crate::clock::Timestamp;

use super::{
    Check, Encoding, Headers, MAX_SIGNATURES, Secret, SignatureError, TAG_LEN, Verified,
    decode_base64_tag, decode_hex_tag, malformed, parse_seconds, required, seconds,
};

// Header names are lowercase: `Headers::get` is always asked in lowercase.
/// The Standard Webhooks header naming the message, the same on every retry.
pub const WEBHOOK_ID: &str = "webhook-id";
const WEBHOOK_TIMESTAMP: &str = "webhook-timestamp";
const WEBHOOK_SIGNATURE: &str = "webhook-signature";
/// Svix's name for `webhook-id`, read when no Standard Webhooks header is sent.
pub const SVIX_ID: &str = "svix-id";
const STRIPE_SIGNATURE: &str = "stripe-signature";
const GITHUB_SIGNATURE: &str = "x-hub-signature-256";
const GITHUB_PREFIX: &str = "sha256=";

/// The three headers of a Standard Webhooks request. Svix, the scheme's origin, sends them as
/// `svix-id`, `svix-timestamp` and `svix-signature` unless an account renames them, and its
/// libraries read either set; so does oncebox. The spec's names win whenever one of them is
/// sent, so the id an event is stored under is always the one its signature covers.
struct Names {
    id: &'static str,
    timestamp: &'static str,
    signature: &'static str,
}

const WEBHOOK: Names = Names {
    id: WEBHOOK_ID,
    timestamp: WEBHOOK_TIMESTAMP,
    signature: WEBHOOK_SIGNATURE,
};

const SVIX: Names = Names {
    id: SVIX_ID,
    timestamp: "svix-timestamp",
    signature: "svix-signature",
};

fn names<H: Headers + ?Sized>(headers: &H) -> &'static Names {
    let sent = |n: &Names| {
        [n.id, n.timestamp, n.signature]
            .iter()
            .any(|h| headers.get(h).is_some())
    };
    if !sent(&WEBHOOK) && sent(&SVIX) {
        &SVIX
    } else {
        &WEBHOOK
    }
}

pub(super) fn verify_standard_webhooks<H: Headers + ?Sized>(
    check: &Check<'_>,
    headers: &H,
) -> Result<Verified, SignatureError> {
    let names = names(headers);
    let id = required(headers, names.id)?;
    let timestamp = required(headers, names.timestamp)?;
    let list = required(headers, names.signature)?;
    if id.is_empty() {
        return Err(malformed(names.id, "must not be empty"));
    }
    let webhook_id = std::str::from_utf8(id)
        .map_err(|_| malformed(names.id, "must be UTF-8"))?
        .to_owned();
    let signed_at = parse_seconds(timestamp).map_err(|r| malformed(names.timestamp, r))?;
    let candidates = standard_webhooks_list(names.signature, list)?;
    check.within_tolerance(signed_at)?;
    // The header text is signed as sent; `parse_seconds` accepted only the canonical spelling,
    // so it equals the reformatted number the reference libraries sign.
    check.matches(
        &[id, b".", timestamp, b".", check.body.unwrap_or_default()],
        &candidates,
    )?;
    Ok(Verified {
        timestamp: Some(signed_at),
        webhook_id: Some(webhook_id),
    })
}

/// The `v1` tags of a `webhook-signature` list: `version,signature` entries separated by
/// spaces. Other versions (`v1a` is ed25519) are skipped unchecked, as the spec asks. A `v1`
/// entry that does not decode is skipped too, as the reference libraries (which compare the
/// text) never match it; only when no `v1` entry decodes is the header malformed, so that a
/// sender's encoding bug shows up as such instead of a puzzling mismatch.
fn standard_webhooks_list(name: &str, value: &[u8]) -> Result<Vec<[u8; TAG_LEN]>, SignatureError> {
    let entries = || value.split(|b| *b == b' ');
    if entries().count() > MAX_SIGNATURES {
        return Err(malformed(name, "more than 64 signatures"));
    }
    let mut candidates = Vec::new();
    let mut undecodable = false;
    for entry in entries() {
        // An entry that is not `version,signature` (an empty one, from a doubled or trailing
        // space, say) is skipped, as the reference libraries skip it: it is not a `v1` one.
        let Some((version, signature)) = split_at_byte(entry, b',') else {
            continue;
        };
        if version == b"v1" {
            match decode_base64_tag(signature) {
                Some(tag) => candidates.push(tag),
                None => undecodable = true,
            }
        }
    }
    if candidates.is_empty() {
        return Err(malformed(
            name,
            if undecodable {
                "a v1 signature must be standard padded base64 of 32 bytes"
            } else {
                "no v1 signature"
            },
        ));
    }
    Ok(candidates)
}

pub(super) fn verify_stripe<H: Headers + ?Sized>(
    check: &Check<'_>,
    headers: &H,
) -> Result<Verified, SignatureError> {
    let value = required(headers, STRIPE_SIGNATURE)?;
    let mut timestamp = None;
    let mut candidates = Vec::new();
    let (mut undecodable, mut v1s) = (false, 0);
    for item in value.split(|b| *b == b',') {
        // An item that is not `key=value` (an empty one from a trailing comma, say) is skipped,
        // as stripe-node, stripe-python and stripe-java skip it (stripe-go refuses it):
        // refused, every event would be a 401 the day the header gained such an item. Only `t`
        // and `v1` count, and `t` only once.
        let Some((key, val)) = split_at_byte(item, b'=') else {
            continue;
        };
        match key {
            b"t" => {
                if timestamp.is_some() {
                    return Err(malformed(STRIPE_SIGNATURE, "more than one t= timestamp"));
                }
                timestamp = Some(val);
            }
            b"v1" => {
                v1s += 1;
                if v1s > MAX_SIGNATURES {
                    return Err(malformed(STRIPE_SIGNATURE, "more than 64 v1 signatures"));
                }
                // One that does not decode never matches, as in Stripe's own libraries.
                match decode_hex_tag(val) {
                    Some(tag) => candidates.push(tag),
                    None => undecodable = true,
                }
            }
            // `v0` is Stripe's test-mode scheme and other keys may come later: only `v1` proves
            // anything, as Stripe's own libraries decide.
            _ => {}
        }
    }
    let timestamp = timestamp.ok_or_else(|| malformed(STRIPE_SIGNATURE, "no t= timestamp"))?;
    let signed_at = parse_seconds(timestamp).map_err(|r| malformed(STRIPE_SIGNATURE, r))?;
    if candidates.is_empty() {
        return Err(malformed(
            STRIPE_SIGNATURE,
            if undecodable {
                "a v1 signature must be 64 hex digits"
            } else {
                "no v1 signature"
            },
        ));
    }
    check.within_tolerance(signed_at)?;
    check.matches(
        &[timestamp, b".", check.body.unwrap_or_default()],
        &candidates,
    )?;
    Ok(Verified {
        timestamp: Some(signed_at),
        webhook_id: None,
    })
}

pub(super) fn verify_github<H: Headers + ?Sized>(
    check: &Check<'_>,
    headers: &H,
) -> Result<Verified, SignatureError> {
    let value = required(headers, GITHUB_SIGNATURE)?;
    let tag = value
        .strip_prefix(GITHUB_PREFIX.as_bytes())
        .and_then(decode_hex_tag)
        .ok_or_else(|| malformed(GITHUB_SIGNATURE, "must be `sha256=` and 64 hex digits"))?;
    check.matches(&[check.body.unwrap_or_default()], &[tag])?;
    Ok(Verified {
        timestamp: None,
        webhook_id: None,
    })
}

pub(super) fn verify_hmac_sha256<H: Headers + ?Sized>(
    check: &Check<'_>,
    headers: &H,
    header: &str,
    encoding: Encoding,
    prefix: &str,
) -> Result<Verified, SignatureError> {
    let name = header.to_ascii_lowercase();
    let value = required(headers, &name)?;
    let encoded = value
        .strip_prefix(prefix.as_bytes())
        .ok_or_else(|| malformed(&name, "does not start with the configured prefix"))?;
    let tag = match encoding {
        Encoding::Hex => decode_hex_tag(encoded)
            .ok_or_else(|| malformed(&name, "must be 64 hex digits after the prefix"))?,
        Encoding::Base64 => decode_base64_tag(encoded).ok_or_else(|| {
            malformed(
                &name,
                "must be standard padded base64 of 32 bytes after the prefix",
            )
        })?,
    };
    check.matches(&[check.body.unwrap_or_default()], &[tag])?;
    Ok(Verified {
        timestamp: None,
        webhook_id: None,
    })
}

pub(super) fn sign_standard_webhooks(
    secret: &Secret,
    id: &str,
    timestamp: Timestamp,
    body: &[u8],
) -> Vec<(String, String)> {
    let timestamp = seconds(timestamp).to_string();
    let tag = secret.tag(&[id.as_bytes(), b".", timestamp.as_bytes(), b".", body]);
    let signature = format!("v1,{}", general_purpose::STANDARD.encode(tag));
    vec![
        (WEBHOOK_ID.to_owned(), id.to_owned()),
        (WEBHOOK_TIMESTAMP.to_owned(), timestamp),
        (WEBHOOK_SIGNATURE.to_owned(), signature),
    ]
}

pub(super) fn sign_stripe(
    secret: &Secret,
    timestamp: Timestamp,
    body: &[u8],
) -> Vec<(String, String)> {
    let timestamp = seconds(timestamp).to_string();
    let tag = secret.tag(&[timestamp.as_bytes(), b".", body]);
    let value = format!("t={timestamp},v1={}", hex::encode(tag));
    vec![(STRIPE_SIGNATURE.to_owned(), value)]
}

pub(super) fn sign_github(secret: &Secret, body: &[u8]) -> Vec<(String, String)> {
    let tag = secret.tag(&[body]);
    let value = format!("{GITHUB_PREFIX}{}", hex::encode(tag));
    vec![(GITHUB_SIGNATURE.to_owned(), value)]
}

pub(super) fn sign_hmac_sha256(
    secret: &Secret,
    body: &[u8],
    header: &str,
    encoding: Encoding,
    prefix: &str,
) -> Vec<(String, String)> {
    let tag = secret.tag(&[body]);
    let encoded = match encoding {
        Encoding::Hex => hex::encode(tag),
        Encoding::Base64 => general_purpose::STANDARD.encode(tag),
    };
    vec![(header.to_ascii_lowercase(), format!("{prefix}{encoded}"))]
}

/// `bytes` split around the first `separator`, which belongs to neither side.
fn split_at_byte(bytes: &[u8], separator: u8) -> Option<(&[u8], &[u8])> {
    let at = bytes.iter().position(|b| *b == separator)?;
    let (before, rest) = bytes.split_at_checked(at)?;
    Some((before, rest.get(1..)?))
}
