//! The session cookie on the wire: reading it from a request, and setting or clearing it with
//! the attributes a browser needs to keep it to this gateway.

use axum::http::{HeaderMap, HeaderValue, header};

use super::session::COOKIE;

/// The values of every cookie `name` the request carries, in its order. A browser sends all
/// the cookies of that name it keeps for the URL, and any page served from the same host, on
/// any port, can set one with a longer path, which comes first: reading only the first, such a
/// page kept the operator logged out of every page under that path.
pub(crate) fn cookie_values<'a>(
    headers: &'a HeaderMap,
    name: &'a str,
) -> impl Iterator<Item = &'a str> + 'a {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .filter(move |(n, _)| *n == name)
        .map(|(_, v)| v)
}

/// Whether the browser reached the gateway over TLS: the gateway itself speaks plain HTTP, so
/// only a TLS proxy in front can say so, in `X-Forwarded-Proto` or `Forwarded`'s `proto` (the
/// first proxy's). A client that says so falsely only keeps its own browser from sending the
/// cookie back.
fn over_tls(headers: &HeaderMap) -> bool {
    let first = |name: &str| {
        let v = headers.get(name)?.to_str().ok()?;
        Some(v.split(',').next()?.trim().to_owned())
    };
    let https = |p: &str| p.trim_matches('"').eq_ignore_ascii_case("https");
    let forwarded = first("forwarded").is_some_and(|element| {
        element.split(';').any(|pair| {
            pair.split_once('=').is_some_and(|(name, value)| {
                name.trim().eq_ignore_ascii_case("proto") && https(value.trim())
            })
        })
    });
    forwarded || first("x-forwarded-proto").is_some_and(|p| https(&p))
}

/// The session cookie; `Secure` when the browser came over TLS ([`over_tls`]), so that it is
/// never sent back over plain HTTP.
pub(crate) fn set_cookie(value: &str, max_age: u64, headers: &HeaderMap) -> HeaderValue {
    let secure = if over_tls(headers) { "; Secure" } else { "" };
    let cookie =
        format!("{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}");
    HeaderValue::from_str(&cookie).unwrap_or_else(|_| HeaderValue::from_static(""))
}
