//! A RabbitMQ URL as oncebox connects with it: lapin's reading, with the host as written and a
//! heartbeat short enough to notice a connection that went silent.

use lapin::uri::AMQPUri;
use oncebox_core::SHORT_STRING_MAX;

/// The heartbeat, in seconds, asked for when a URL names none (`?heartbeat=N` sets another; the
/// lower of the two sides' wins). A connection that stops carrying anything, a broker behind a
/// cut network that never resets it, is given up after two heartbeats: 20 s, where RabbitMQ's
/// default of 60 s left a consumer waiting 2 minutes before it reconnected.
pub const DEFAULT_HEARTBEAT: u16 = 10;

/// Why a RabbitMQ URL can never connect.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UriError {
    /// Not a URL lapin reads (a scheme other than `amqp`/`amqps`, a bad number in the query).
    #[error("not an AMQP URL: {0}")]
    NotUrl(String),
    /// A vhost longer than [`SHORT_STRING_MAX`]: lapin panics when it opens the connection.
    #[error("the vhost is longer than {SHORT_STRING_MAX} bytes, the most AMQP can name")]
    LongVhost,
    /// `amqps://`: this build carries no TLS for RabbitMQ, and lapin without a TLS backend
    /// quietly connects in plain text, the credentials with it.
    #[error(
        "amqps:// (TLS) is not supported for RabbitMQ in this build, and is refused rather than \
         connected in plain text: use amqp:// on a network you trust, or a TLS tunnel to the broker"
    )]
    Tls,
    /// `connection_timeout=0`: no connection could be made in no time, and lapin refuses it.
    #[error(
        "connection_timeout=0 leaves no time to connect: give it in milliseconds, or leave it out"
    )]
    ZeroTimeout,
}

/// `url` read for [`lapin::Connection::connect_uri`]. lapin's own reading puts `localhost` in
/// place of an IPv6 address (`amqp://[fd00::5]/` connected to the local machine); here the
/// host is the one written. A URL without `heartbeat` asks for
/// [`DEFAULT_HEARTBEAT`].
pub fn connection_uri(url: &str) -> Result<AMQPUri, UriError> {
    let mut uri: AMQPUri = url.parse().map_err(UriError::NotUrl)?;
    if uri.scheme == lapin::uri::AMQPScheme::AMQPS {
        return Err(UriError::Tls);
    }
    if uri.vhost.len() > SHORT_STRING_MAX {
        return Err(UriError::LongVhost);
    }
    if uri.query.connection_timeout == Some(0) {
        return Err(UriError::ZeroTimeout);
    }
    // lapin read it as a URL, so this one reads too.
    let written = url::Url::parse(url).map_err(|e| UriError::NotUrl(e.to_string()))?;
    if let Some(host) = written.host_str().filter(|h| !h.is_empty()) {
        uri.authority.host = host.trim_matches(['[', ']']).to_owned();
    }
    uri.query.heartbeat.get_or_insert(DEFAULT_HEARTBEAT);
    Ok(uri)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_is_the_one_written_and_a_heartbeat_is_asked_for() {
        for (url, host) in [
            ("amqp://guest:guest@10.1.2.3:5673/%2f", "10.1.2.3"),
            ("amqp://[::1]:5672/", "::1"),
        ] {
            let uri = connection_uri(url).unwrap();
            assert_eq!(uri.authority.host, host, "{url}");
            assert_eq!(uri.query.heartbeat, Some(DEFAULT_HEARTBEAT), "{url}");
        }
        let uri = connection_uri("amqp://u:p%40ss@127.0.0.1:5672/%2f?heartbeat=30").unwrap();
        assert_eq!(
            (uri.authority.port, uri.vhost.as_str(), uri.query.heartbeat),
            (5672, "/", Some(30))
        );
        assert_eq!(uri.authority.userinfo.password, "p@ss");
        // Zero is kept: it leaves the heartbeat to the broker, as the URL asks.
        let off = connection_uri("amqp://127.0.0.1/?heartbeat=0").unwrap();
        assert_eq!(off.query.heartbeat, Some(0));
    }

    #[test]
    fn a_url_that_can_never_connect_is_refused() {
        let long = format!("amqp://127.0.0.1/{}", "v".repeat(SHORT_STRING_MAX + 1));
        assert_eq!(connection_uri(&long).unwrap_err(), UriError::LongVhost);
        // Without a TLS backend lapin would connect in plain text.
        assert_eq!(
            connection_uri("amqps://guest:guest@broker.example/vh").unwrap_err(),
            UriError::Tls
        );
        assert_eq!(
            connection_uri("amqp://127.0.0.1/%2f?connection_timeout=0").unwrap_err(),
            UriError::ZeroTimeout
        );
        assert!(connection_uri("amqp://127.0.0.1/%2f?connection_timeout=1").is_ok());
        for bad in ["http://127.0.0.1/", "amqp://h/?heartbeat=x", "not a url"] {
            assert!(
                matches!(connection_uri(bad), Err(UriError::NotUrl(_))),
                "{bad}"
            );
        }
    }
}
