//! URLs fit to show: the user info of `scheme://user:password@host/…` and the values of query
//! parameters named like secrets are hidden, also when a password was pasted unencoded; a
//! route's receiver is shown only as far as its host.

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

/// A route's `url` or `status_url` fit to show: its scheme, `***@` for its user info and its
/// host and port; whatever follows the host is `/***`, as the core's `Route` shows it. A
/// receiver's key may sit anywhere after the host: in the path
/// (`https://hooks.slack.com/services/T0/B0/SECRET`, a Discord or Teams webhook) as in any
/// query parameter (`?code=…` for an Azure Function, `?sig=…` for a SAS URL).
pub(crate) fn redact_route_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        // Never a validated route's URL: nothing tells what in it is safe to show.
        return "***".to_owned();
    };
    let (user, after_user) = match userinfo_end(rest) {
        Some(at) => ("***@", &rest[at + 1..]),
        None => ("", rest),
    };
    let end = after_user.find(['/', '?', '#']).unwrap_or(after_user.len());
    let hidden = if end < after_user.len() { "/***" } else { "" };
    format!("{scheme}://{user}{}{hidden}", &after_user[..end])
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

/// Where the user info of `rest` (a URL after its `scheme://`) ends: the index of the `@`
/// before the host, or `None` when there is no user info.
///
/// RFC 3986 ends the authority at the first `/`, `?` or `#`, but people paste passwords
/// without percent-encoding them, and a password may hold any of those and `@` too
/// (`postgres://app:ab/c@d@db/x`). Cutting there would show the password's tail as a path, so
/// for credentials the rules are:
/// - the user info exists when the RFC authority holds an `@`, or when it is `user:…` with
///   something other than a port after the colon (a password cut short by its own `/`, `?`
///   or `#`); otherwise an `@` further on is in the path or query (`/@alice`,
///   `?email=a@b.example`) and the URL has no user info;
/// - it then runs to the last `@` before the query or fragment that follows the first `@`:
///   a password's own `?` and `#` come before its last `@`, while a query after the host
///   often holds e-mail addresses, whose `@` must not be taken for the host's.
fn userinfo_end(rest: &str) -> Option<usize> {
    let first_at = rest.find('@')?;
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    if !authority.contains('@') && is_host_port(authority) {
        return None;
    }
    let query = rest[first_at..]
        .find(['?', '#'])
        .map_or(rest.len(), |i| first_at + i);
    rest[..query].rfind('@')
}

/// Whether `authority` reads as `host`, `host:port` or `[v6]:port` (an empty port is allowed,
/// as RFC 3986 does); `user:password` with a password that is not all digits does not.
fn is_host_port(authority: &str) -> bool {
    let after_host = match authority.strip_prefix('[') {
        Some(v6) => v6.split_once(']').map_or("", |(_, after)| after),
        None => authority.find(':').map_or("", |i| &authority[i..]),
    };
    match after_host.strip_prefix(':') {
        Some(port) => port.bytes().all(|b| b.is_ascii_digit()),
        None => after_host.is_empty(),
    }
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
