//! What the gateway reads of a request's headers beside the signature's and the id's: which
//! are stored with the event (none that holds a credential or a signature), and whether the
//! body comes in a coding it refuses.

/// Request headers never stored with an event: credentials. Stored, the dashboard and the
/// admin API would show them. Names are lowercase here, as `HeaderMap` gives them whatever
/// case they were sent in.
const NOT_KEPT: [&str; 3] = ["authorization", "cookie", "proxy-authorization"];

/// Parts of header names that hold a credential too: senders put plaintext shared secrets in
/// headers they name themselves (GitLab's `X-Gitlab-Token`, Telegram's
/// `X-Telegram-Bot-Api-Secret-Token`, Asana's `X-Hook-Secret`, `X-Api-Key`, `X-Auth-Token`,
/// and the many spellings of an authorization of their own: `X-Authorization`, `X-Auth`,
/// `X-Webhook-Auth`, `X-Credentials`, `X-Passphrase`). A header dropped wrongly costs an
/// operator a detail; one kept wrongly shows a secret for the whole retention.
///
/// Signatures too (`X-Hub-Signature-256`, `Stripe-Signature`, `webhook-signature`, Slack's,
/// Twilio's, Shopify's `X-Shopify-Hmac-Sha256`): GitHub and plain HMAC sign no timestamp, so a
/// stored body with its signature is a request anyone reading the store could post again, at
/// any time, under a new unsigned delivery id.
const CREDENTIAL_PARTS: [&str; 10] = [
    "secret",
    "token",
    "password",
    "passphrase",
    "api-key",
    "apikey",
    "auth",
    "credential",
    "signature",
    "hmac",
];

/// Header names ending in `-key` are keys too (Azure Functions' `X-Functions-Key`, API
/// Management's `Ocp-Apim-Subscription-Key`, a `X-Shared-Key`), but for these, which say what
/// an event is: its idempotency key, and Bitbucket's `X-Event-Key` (its event type).
const NOT_CREDENTIAL_KEYS: [&str; 3] = ["idempotency-key", "x-idempotency-key", "x-event-key"];

/// Whether a request header is stored with its event: no credential, no signature, and not
/// the header a source's `hmac-sha256` scheme reads its signature from (`signed`), whatever
/// its name.
pub(super) fn kept(name: &str, signed: Option<&str>) -> bool {
    !NOT_KEPT.contains(&name)
        && !signed.is_some_and(|s| s.eq_ignore_ascii_case(name))
        && !CREDENTIAL_PARTS.iter().any(|part| name.contains(part))
        && (!name.ends_with("-key") || NOT_CREDENTIAL_KEYS.contains(&name))
}

/// The request's coding other than `identity`, if any, with the header that names it: every
/// `Content-Encoding` value, each a list of codings, and every `Transfer-Encoding` value but
/// its `chunked`. hyper takes `Transfer-Encoding: gzip, chunked` and removes only the chunking,
/// so the gzip would reach the body as the Content-Encoding one would.
pub(super) fn content_coding(headers: &axum::http::HeaderMap) -> Option<(&'static str, String)> {
    let coded = |v: &axum::http::HeaderValue, plain: &[&str]| {
        v.to_str().map_or(true, |text| {
            text.split(',')
                .map(str::trim)
                .any(|c| !c.is_empty() && !plain.iter().any(|p| c.eq_ignore_ascii_case(p)))
        })
    };
    let found = |name: axum::http::HeaderName, shown: &'static str, plain: &[&str]| {
        headers
            .get_all(name)
            .iter()
            .find(|v| coded(v, plain))
            .map(|v| (shown, String::from_utf8_lossy(v.as_bytes()).into_owned()))
    };
    found(
        axum::http::header::CONTENT_ENCODING,
        "Content-Encoding",
        &["identity"],
    )
    .or_else(|| {
        found(
            axum::http::header::TRANSFER_ENCODING,
            "Transfer-Encoding",
            &["identity", "chunked"],
        )
    })
}
