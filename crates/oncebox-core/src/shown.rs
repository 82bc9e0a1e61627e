//! URLs fit to show (logs, `Debug`, the dashboard, `oncebox check`): a receiver's URL only as
//! far as its host, its user info hidden, also when a password was pasted unencoded.

/// A route's `url` or `status_url` fit to show: its scheme, `***@` for its user info and its
/// host and port; whatever follows the host is `/***`. A receiver's key may sit anywhere after
/// the host: in the path (`https://hooks.slack.com/services/T0/B0/SECRET`, a Discord or Teams
/// webhook) as in any query parameter (`?code=…` for an Azure Function, `?sig=…` for a SAS
/// URL). Without a leading scheme nothing tells what is safe to show: `***`. A `\` ends the
/// host as `/` does (URL parsers read it so in `http` and `https` URLs). An authority that
/// reads as `host:port` with an `@` after it may be a password beginning with digits pasted
/// unencoded (`admin:2024#pw@host`): shown as `scheme://***`.
pub fn route_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://").filter(|(s, _)| is_scheme(s)) else {
        return "***".to_owned();
    };
    let auth = authority(rest);
    let (user, after_user) = if let Some(at) = auth.rfind('@') {
        // Another `@` after the authority: which one ends the user info is a guess
        // (`u:x@pa/ss@host` may be one password pasted unencoded), and a wrong guess shows
        // part of the password as the host.
        if userinfo_end(rest).is_some_and(|end| end > at) {
            return format!("{scheme}://***");
        }
        ("***@", &rest[at + 1..])
    } else if !rest.contains('@') {
        ("", rest)
    } else if is_host_port(auth) && auth.contains(':') {
        // A host and port with an `@` after it may as well be a user and a password of digits
        // up to a `/`, `?` or `#`.
        return format!("{scheme}://***");
    } else if is_host_port(auth) && path_at(rest) {
        // A plain host and an `@` in the path (`https://social.example/@alice`).
        ("", rest)
    } else {
        // No host: a password pasted unencoded with a `/`, `\`, `?` or `#` in it, or a token
        // for a user name with a `/` in it (`https://ghp_Ab12/x9@github.com`). Where its start
        // reads as a host, the `@` may as well be in the path or the query
        // (`https://hooks.example/in@T0KEN`, `http://receiver?token=ab@S3CRET`): which it is
        // cannot be told, and the wrong guess showed the key as the host. With several `@`
        // after it, which one ends the user info is a guess, as above.
        match userinfo_end(rest) {
            Some(_) if is_host_port(auth) => return format!("{scheme}://***"),
            Some(at) if rest.find('@') == Some(at) => ("***@", &rest[at + 1..]),
            _ => return format!("{scheme}://***"),
        }
    };
    let host = authority(after_user);
    let hidden = if host.len() < after_user.len() {
        "/***"
    } else {
        ""
    };
    format!("{scheme}://{user}{host}{hidden}")
}

/// What precedes the first `/`, `\`, `?` or `#` of `rest`.
fn authority(rest: &str) -> &str {
    &rest[..rest.find(['/', '\\', '?', '#']).unwrap_or(rest.len())]
}

/// A URL scheme as RFC 3986 spells one: a letter, then letters, digits, `+`, `-` or `.`.
fn is_scheme(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// Where the user info of `rest` (a URL after its `scheme://`) ends: the index of its `@`, or
/// `None` when it has none. A password pasted without percent-encoding may hold `/`, `?` or `#`,
/// which end the authority by RFC 3986; so an authority that does not read as a host and port
/// is taken to run to the last `@` before any query or fragment. An `@` in the path of a URL
/// whose authority is a plain host (`https://social.example/@alice`) is no user info.
pub fn userinfo_end(rest: &str) -> Option<usize> {
    let first_at = rest.find('@')?;
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    if !authority.contains('@') && is_host_port(authority) && path_at(rest) {
        return None;
    }
    let query = rest[first_at..]
        .find(['?', '#'])
        .map_or(rest.len(), |i| first_at + i);
    rest[..query].rfind('@')
}

/// Whether the first `@` of `rest`, after an authority with none, reads as part of the path
/// or the query: it opens a path segment (`/@alice`), or the authority is a domain name (a dot
/// in it) and the `@` comes after a `?` or `#` (`?to=ops@example.com`). Otherwise the authority
/// may be the start of a user name or token holding a `/` or `?` (`https://ghp_Ab12/x9@host`,
/// and a dot proves nothing there: `ab.c/d@host`).
fn path_at(rest: &str) -> bool {
    let Some(at) = rest.find('@') else {
        return false;
    };
    let before = &rest[..at];
    let authority = &before[..before.find(['/', '\\', '?', '#']).unwrap_or(before.len())];
    before.ends_with(['/', '\\']) || (authority.contains('.') && before.contains(['?', '#']))
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

#[cfg(test)]
mod tests {
    use super::route_url;

    #[test]
    fn a_route_url_is_shown_only_as_far_as_its_host() {
        for (url, shown) in [
            (
                "https://hooks.slack.com/services/T0/B0/S3CRET",
                "https://hooks.slack.com/***",
            ),
            (
                "https://user:pw@hooks.example/services/s3cret",
                "https://***@hooks.example/***",
            ),
            // An `@` in the path is no user info: the host is kept, what follows hidden.
            (
                "https://hooks.example/hook/@tok3n",
                "https://hooks.example/***",
            ),
            // A password pasted unencoded, `/`, `?` or `#` and all, is hidden whole.
            (
                "https://app:pa/55@hooks.example/in",
                "https://***@hooks.example/***",
            ),
            ("https://user:p?ss@host/x", "https://***@host/***"),
            ("https://user:p#ss@host", "https://***@host"),
            // An `@` in the user info and another after a `/`: the password may run to
            // either, so nothing past the scheme is shown.
            ("https://u:x@Sup3rS3cret/2@hooks.example/in", "https://***"),
            ("https://u:pw@hooks.example/in@x?q=@", "https://***"),
            ("https://app:pa/55@hooks.example/in@T0KEN", "https://***"),
            (
                "https://u:pw@hooks.example/in?q=@",
                "https://***@hooks.example/***",
            ),
            ("http://[::1]:9000/T0KEN", "http://[::1]:9000/***"),
            ("nats://broker:4222", "nats://broker:4222"),
            ("nats://nats:4222?subject=orders", "nats://nats:4222/***"),
            ("no url", "***"),
            // Read by URL parsers as a path, a query and a password.
            (
                "https://hooks.slack.com\\services\\T0\\S3CRET",
                "https://hooks.slack.com/***",
            ),
            ("https:hooks.example/S3CRET?r=http://x", "***"),
            ("https://admin:2024#pw@host/x", "https://***"),
            ("https://admin:2024/pw@host/x", "https://***"),
            ("https://host:8443/@alice/T0KEN", "https://***"),
            ("https://hooks.example\\@T0KEN", "https://hooks.example/***"),
            // A token for a user name, a `/` in it, or a host and an `@` in the path or the
            // query: which it is cannot be told, so nothing past the scheme is shown.
            ("https://ghp_Ab12/x9@github.com/o/r", "https://***"),
            ("https://ab/cd@hooks.example/x", "https://***"),
            ("https://tok?en@host/x", "https://***"),
            ("https://ab.c/d@hooks.example/x", "https://***"),
            ("https://hooks.example/in@T0KEN", "https://***"),
            ("http://receiver?token=ab@S3CRET", "http://***"),
            // A start that reads as no host is user info.
            (
                "https://u:pa/ss@hooks.example/x",
                "https://***@hooks.example/***",
            ),
            (
                "https://hooks.example/in?to=ops@example.com",
                "https://hooks.example/***",
            ),
            ("http://localhost/@alice", "http://localhost/***"),
            (
                "https://app:pa\\55@hooks.example/in",
                "https://***@hooks.example/***",
            ),
        ] {
            assert_eq!(route_url(url), shown, "{url}");
        }
    }
}
