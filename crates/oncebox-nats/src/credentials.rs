//! A NATS server URL's credentials, given to the client the way it sends them. async-nats
//! connects with the credentials of its `ConnectOptions` only and ignores a URL's
//! `user:password@` or `token@`: a server requiring them refused every connection, and one
//! with a `no_auth_user` took the client for that user, in that user's account.

use async_nats::ConnectOptions;
use percent_encoding::percent_decode_str;

/// `options` with the credentials `url` carries (`user:password@`, or `token@` alone,
/// percent-decoded), and `url` without them, to connect to. A URL that does not parse is
/// returned as it is, for the client to refuse in its own words.
pub fn with_credentials(options: ConnectOptions, url: &str) -> (ConnectOptions, String) {
    // As the client reads an address: `nats://` when no scheme is given.
    let full = if url.contains("://") {
        url.to_owned()
    } else {
        format!("nats://{url}")
    };
    let Ok(mut parsed) = url::Url::parse(&full) else {
        return (options, url.to_owned());
    };
    if parsed.username().is_empty() && parsed.password().is_none() {
        return (options, url.to_owned());
    }
    let decoded = |s: &str| percent_decode_str(s).decode_utf8_lossy().into_owned();
    let user = decoded(parsed.username());
    let options = match parsed.password() {
        Some(password) => options.user_and_password(user, decoded(password)),
        None => options.token(user),
    };
    // Both succeed on a URL with a host, which one with credentials has.
    let _ = parsed.set_username("");
    let _ = parsed.set_password(None);
    (options, parsed.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bare(url: &str) -> String {
        with_credentials(ConnectOptions::new(), url).1
    }

    #[test]
    fn the_url_connected_to_carries_no_credentials() {
        assert_eq!(
            bare("nats://relay:s3%2Fcr%3At@nats:4222"),
            "nats://nats:4222"
        );
        assert_eq!(bare("tls://tok3n@nats:4222"), "tls://nats:4222");
        assert_eq!(bare("relay:pw@127.0.0.1:4222"), "nats://127.0.0.1:4222");
        // Without credentials, or unparseable: as given.
        assert_eq!(bare("nats://nats:4222"), "nats://nats:4222");
        assert_eq!(bare("127.0.0.1:4222"), "127.0.0.1:4222");
        assert_eq!(bare("nats://[::1"), "nats://[::1");
    }
}
