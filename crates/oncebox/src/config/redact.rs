//! URLs fit to show: the user info of `scheme://user:password@host/…` and the values of query
//! parameters named like secrets are hidden, also when a password was pasted unencoded; a
//! route's receiver is shown only as far as its host.

use oncebox_core::shown::userinfo_end;

/// Names of query parameters whose values are never shown (compared without case, as parts
/// of the name: `sslpassword`, `api_key`, `access_token` match too).
const SECRET_PARAMETERS: [&str; 5] = ["password", "secret", "token", "key", "signature"];

/// `url` with its whole user info replaced by `***` (a token alone, `https://TOKEN@host`, is
/// as secret as a password) and the values of secret-named query parameters (`?password=…`,
/// `?token=…`: drivers and webhook receivers take them there too) by `***`; a URL without
/// user info keeps its host, path and other parameters as written.
pub(crate) fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return without_scheme(url);
    };
    match userinfo_end(rest) {
        Some(at) => format!("{scheme}://***@{}", redact_query(&rest[at + 1..])),
        None => format!("{scheme}://{}", redact_query(rest)),
    }
}

/// A route's `url` or `status_url` fit to show: as far as its host
/// ([`oncebox_core::shown::route_url`]), as the relay's logs and the dashboard show it.
pub(crate) fn redact_route_url(url: &str) -> String {
    oncebox_core::shown::route_url(url)
}

/// A setting without `scheme://` fit to show: a path, or a server's address written wrong
/// (`postgres:/app:pw@db/x`, `host=db password=…`). Everything before its last `@` and the
/// values of secret-named `key=value` words are hidden.
fn without_scheme(setting: &str) -> String {
    let shown = match setting.rfind('@') {
        Some(at) => format!("***{}", &setting[at..]),
        None => setting.to_owned(),
    };
    if !shown.contains('=') {
        return shown;
    }
    crate::store::joined_pairs(&shown)
        .split(' ')
        .map(|word| match word.split_once('=') {
            Some((name, _)) if is_secret(name) => format!("{name}=***"),
            _ => word.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The host and what follows it, fit to show: [`redact_url`] without the scheme and without
/// the user info at all, for messages that name where a store is.
pub(crate) fn host_and_path(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let host = userinfo_end(rest).map_or(0, |at| at + 1);
    redact_query(&rest[host..])
}

/// A URL's host, path, query and fragment with the values of secret-named parameters hidden.
fn redact_query(tail: &str) -> String {
    let Some((path, after)) = tail.split_once('?') else {
        return tail.to_owned();
    };
    let (query, fragment) = match after.split_once('#') {
        Some((query, fragment)) => (query, Some(fragment)),
        None => (after, None),
    };
    let query: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _)) if is_secret(name) => format!("{name}=***"),
            _ => pair.to_owned(),
        })
        .collect();
    let mut shown = format!("{path}?{}", query.join("&"));
    if let Some(fragment) = fragment {
        shown.push('#');
        shown.push_str(fragment);
    }
    shown
}

fn is_secret(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    SECRET_PARAMETERS.iter().any(|s| name.contains(s))
}
