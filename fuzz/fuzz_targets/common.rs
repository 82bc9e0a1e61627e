//! Helpers the fuzz targets share: splitting an input into fields, and the schemes under test.

#![allow(
    dead_code,
    reason = "each target compiles this file as its own module and most use only part of it"
)]

use oncebox_core::signature::{Encoding, Scheme};

/// The first `n - 1` newline-terminated fields of `data`, then the rest (which may hold
/// newlines): text seeds stay readable, and the last field is usually a body. Missing fields
/// are empty.
pub fn fields(data: &[u8], n: usize) -> Vec<&[u8]> {
    let mut out: Vec<&[u8]> = data.splitn(n, |b| *b == b'\n').collect();
    out.resize(n, &[]);
    out
}

/// Every signing scheme, picked by one input byte. The `hmac-sha256` variants cover both
/// encodings, an empty prefix and a header name in mixed case (matched case-insensitively).
pub fn scheme(selector: u8) -> Scheme {
    match selector % 6 {
        0 => Scheme::StandardWebhooks,
        1 => Scheme::Stripe,
        2 => Scheme::Github,
        3 => Scheme::HmacSha256 {
            header: "X-Signature".to_owned(),
            encoding: Encoding::Hex,
            prefix: String::new(),
        },
        4 => Scheme::HmacSha256 {
            header: "x-signature".to_owned(),
            encoding: Encoding::Base64,
            prefix: "sha256=".to_owned(),
        },
        _ => Scheme::None,
    }
}

/// Whether the scheme's MAC is hex, where verification accepts either letter case.
pub fn hex_encoded(scheme: &Scheme) -> bool {
    match scheme {
        Scheme::Stripe | Scheme::Github => true,
        Scheme::HmacSha256 { encoding, .. } => *encoding == Encoding::Hex,
        _ => false,
    }
}

/// Whether the scheme signs a timestamp (and so checks it against a tolerance).
pub fn timed(scheme: &Scheme) -> bool {
    matches!(scheme, Scheme::StandardWebhooks | Scheme::Stripe)
}
