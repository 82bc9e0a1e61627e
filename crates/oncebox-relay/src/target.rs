//! Where a route's URL points: an HTTP receiver, a RabbitMQ exchange or a NATS JetStream
//! subject. One parser, used by the relay to send and by the binary to validate configuration.

use std::fmt;

use lapin::uri::AMQPUri;
use oncebox_amqp::UriError;
use reqwest::Url;
use thiserror::Error;

pub(crate) use oncebox_core::SHORT_STRING_MAX;

/// A route's destination, parsed from its `url`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Target {
    /// `http://…` or `https://…`: a POST per attempt.
    Http,
    /// `amqp://user:pass@host:port/vhost?exchange=NAME&routing_key=KEY`.
    Amqp(AmqpTarget),
    /// `nats://[user:pass@]host:port?subject=NAME` (`tls://` for TLS): a JetStream publish.
    Nats(NatsTarget),
}

/// A RabbitMQ exchange and the routing key every message of the route carries.
#[derive(Clone, PartialEq, Eq)]
pub struct AmqpTarget {
    pub(crate) uri: AMQPUri,
    /// Empty: the default exchange, which routes to the queue named by the routing key.
    pub exchange: String,
    pub routing_key: String,
}

/// A NATS server and the subject a JetStream stream captures.
#[derive(Clone, PartialEq, Eq)]
pub struct NatsTarget {
    /// The server URL without the query, credentials included.
    pub(crate) server: String,
    pub subject: String,
}

/// Why a route URL is refused. The variants name the part to fix; none echoes credentials.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum TargetError {
    #[error("not a URL ({0})")]
    NotUrl(String),
    #[error("scheme {0:?} is not one of http, https, amqp, nats, tls")]
    Scheme(String),
    #[error("has no host")]
    NoHost,
    #[error("needs the query parameter {0}")]
    Missing(&'static str),
    #[error("query parameter {name}: {reason}")]
    Invalid { name: &'static str, reason: String },
    #[error("unknown query parameter {0:?}")]
    Unknown(String),
}

impl Target {
    pub fn parse(text: &str) -> Result<Target, TargetError> {
        let url = Url::parse(text).map_err(|e| TargetError::NotUrl(e.to_string()))?;
        if url.host_str().is_none_or(str::is_empty) {
            return Err(TargetError::NoHost);
        }
        match url.scheme() {
            "http" | "https" => Ok(Target::Http),
            "amqp" => amqp(&url).map(Target::Amqp),
            // `tls://`: the NATS client's spelling of a connection that must be TLS.
            "nats" | "tls" => nats(&url).map(Target::Nats),
            other => Err(TargetError::Scheme(other.to_owned())),
        }
    }

    /// Whether the destination is a broker, where HTTP-only settings (a signing secret, a
    /// status URL) mean nothing.
    pub fn is_broker(&self) -> bool {
        !matches!(self, Target::Http)
    }
}

/// A URL's query split in two: the values of the parameters asked for, in order, and the rest.
struct Query {
    ours: Vec<Option<String>>,
    rest: Vec<(String, String)>,
}

/// The query split into ours (`wanted`) and the rest, refusing repeats of ours.
fn take_query(url: &Url, wanted: &[&'static str]) -> Result<Query, TargetError> {
    let mut ours = vec![None; wanted.len()];
    let mut rest = Vec::new();
    for (name, value) in url.query_pairs() {
        match wanted.iter().position(|w| *w == name) {
            Some(i) if ours[i].is_some() => {
                return Err(TargetError::Invalid {
                    name: wanted[i],
                    reason: "given twice".into(),
                });
            }
            Some(i) => ours[i] = Some(value.into_owned()),
            None => rest.push((name.into_owned(), value.into_owned())),
        }
    }
    Ok(Query { ours, rest })
}

/// Query parameters lapin reads itself: passed through to the connection.
const AMQP_CONNECTION_PARAMS: &[&str] = &[
    "heartbeat",
    "frame_max",
    "channel_max",
    "connection_timeout",
    "auth_mechanism",
];

fn amqp(url: &Url) -> Result<AmqpTarget, TargetError> {
    let Query { ours, rest } = take_query(url, &["exchange", "routing_key"])?;
    let mut ours = ours.into_iter();
    let exchange = ours
        .next()
        .flatten()
        .ok_or(TargetError::Missing("exchange"))?;
    let routing_key = ours.next().flatten().unwrap_or_default();
    for (name, value) in [("exchange", &exchange), ("routing_key", &routing_key)] {
        if value.len() > SHORT_STRING_MAX {
            return Err(TargetError::Invalid {
                name,
                reason: format!("longer than {SHORT_STRING_MAX} bytes"),
            });
        }
    }
    if exchange.is_empty() && routing_key.is_empty() {
        // The default exchange routes by queue name; without one every message is returned.
        return Err(TargetError::Invalid {
            name: "routing_key",
            reason: "must name the queue when exchange is empty (the default exchange)".into(),
        });
    }
    if let Some((name, _)) = rest
        .iter()
        .find(|(n, _)| !AMQP_CONNECTION_PARAMS.contains(&n.as_str()))
    {
        return Err(TargetError::Unknown(name.clone()));
    }
    let mut connection = url.clone();
    connection.set_query(None);
    if !rest.is_empty() {
        connection.query_pairs_mut().extend_pairs(&rest);
    }
    let uri = oncebox_amqp::connection_uri(connection.as_str()).map_err(|e| match e {
        UriError::NotUrl(e) => TargetError::NotUrl(e),
        // Sent as an AMQP short string when the connection opens: longer, lapin panics there.
        UriError::LongVhost => TargetError::Invalid {
            name: "vhost",
            reason: format!("longer than {SHORT_STRING_MAX} bytes"),
        },
        UriError::Tls => TargetError::NotUrl(e.to_string()),
        UriError::ZeroTimeout => TargetError::Invalid {
            name: "connection_timeout",
            reason: "0 leaves no time to connect".to_owned(),
        },
    })?;
    Ok(AmqpTarget {
        uri,
        exchange,
        routing_key,
    })
}

fn nats(url: &Url) -> Result<NatsTarget, TargetError> {
    let Query { ours, rest } = take_query(url, &["subject"])?;
    if let Some((name, _)) = rest.first() {
        return Err(TargetError::Unknown(name.clone()));
    }
    let subject = ours
        .into_iter()
        .next()
        .flatten()
        .ok_or(TargetError::Missing("subject"))?;
    if let Err(reason) = publish_subject(&subject) {
        return Err(TargetError::Invalid {
            name: "subject",
            reason: reason.into(),
        });
    }
    if !matches!(url.path(), "" | "/") {
        return Err(TargetError::NotUrl(
            "a NATS URL has no path; name the subject with ?subject=".into(),
        ));
    }
    let mut server = url.clone();
    server.set_query(None);
    server.set_path("");
    Ok(NatsTarget {
        server: server.to_string(),
        subject,
    })
}

/// A subject one can publish to: dot-separated non-empty tokens, no wildcards, no whitespace.
fn publish_subject(s: &str) -> Result<(), &'static str> {
    if s.is_empty() {
        return Err("must not be empty");
    }
    if s.chars().any(char::is_whitespace) {
        return Err("must not contain whitespace");
    }
    for token in s.split('.') {
        match token {
            "" => return Err("has an empty token (leading, trailing or double dot)"),
            "*" | ">" => return Err("wildcards cannot be published to"),
            _ => {}
        }
    }
    Ok(())
}

impl AmqpTarget {
    /// `host:port/vhost`, for logs and errors: never the credentials.
    pub fn server(&self) -> String {
        format!(
            "{}:{}/{}",
            self.uri.authority.host, self.uri.authority.port, self.uri.vhost
        )
    }
}

impl fmt::Debug for AmqpTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpTarget")
            .field("server", &self.server())
            .field("exchange", &self.exchange)
            .field("routing_key", &self.routing_key)
            .finish()
    }
}

impl NatsTarget {
    /// `host:port`, for logs and errors: never the credentials.
    pub fn server(&self) -> String {
        Url::parse(&self.server)
            .ok()
            .map(|u| {
                format!(
                    "{}:{}",
                    u.host_str().unwrap_or_default(),
                    u.port().unwrap_or(4222)
                )
            })
            .unwrap_or_default()
    }
}

impl fmt::Debug for NatsTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsTarget")
            .field("server", &self.server())
            .field("subject", &self.subject)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_amqp_and_nats_urls_parse() {
        assert_eq!(Target::parse("http://127.0.0.1:9000/h"), Ok(Target::Http));
        assert_eq!(Target::parse("https://example.com/h"), Ok(Target::Http));
        let Ok(Target::Amqp(a)) = Target::parse(
            "amqp://u:p%40ss@127.0.0.1:5672/%2f?exchange=orders&routing_key=paid&heartbeat=30",
        ) else {
            panic!("amqp parses")
        };
        assert_eq!(
            (a.exchange.as_str(), a.routing_key.as_str()),
            ("orders", "paid")
        );
        assert_eq!(a.uri.authority.host, "127.0.0.1");
        assert_eq!(a.uri.authority.userinfo.password, "p@ss");
        assert_eq!(a.uri.vhost, "/");
        assert_eq!(a.uri.query.heartbeat, Some(30));
        // Without a heartbeat of its own, the connection asks for the default one.
        let Ok(Target::Amqp(b)) = Target::parse("amqp://[fd00::5]/%2f?exchange=orders") else {
            panic!("amqp parses")
        };
        assert_eq!(b.uri.authority.host, "fd00::5");
        assert_eq!(b.uri.query.heartbeat, Some(oncebox_amqp::DEFAULT_HEARTBEAT));
        assert!(
            !format!("{a:?}").contains("p@ss"),
            "credentials never printed"
        );
        let Ok(Target::Nats(n)) = Target::parse("nats://u:secret@127.0.0.1:4222?subject=a.b")
        else {
            panic!("nats parses")
        };
        assert_eq!(n.subject, "a.b");
        assert_eq!(n.server, "nats://u:secret@127.0.0.1:4222");
        assert!(!format!("{n:?}").contains("secret"));
    }

    #[test]
    fn bad_urls_name_the_part_to_fix() {
        let cases = [
            ("ftp://h/x", TargetError::Scheme("ftp".into())),
            ("amqp://h/%2f", TargetError::Missing("exchange")),
            (
                "amqp://h/%2f?exchange=x&queue=q",
                TargetError::Unknown("queue".into()),
            ),
            ("nats://h:4222", TargetError::Missing("subject")),
            (
                "nats://h:4222?subject=a&stream=s",
                TargetError::Unknown("stream".into()),
            ),
        ];
        for (url, want) in cases {
            assert_eq!(Target::parse(url), Err(want), "{url}");
        }
        for url in [
            "amqp://h/%2f?exchange=",
            "amqp://h/%2f?exchange=x&exchange=y",
            "nats://h?subject=a.*",
            "nats://h?subject=a..b",
            "nats://h?subject=",
            "nats://h?subject=a%20b",
        ] {
            assert!(
                matches!(Target::parse(url), Err(TargetError::Invalid { .. })),
                "{url}: {:?}",
                Target::parse(url)
            );
        }
        let long = "x".repeat(256);
        assert!(Target::parse(&format!("amqp://h/%2f?exchange={long}")).is_err());
        // A vhost as long reached lapin, which panicked opening the connection.
        assert!(matches!(
            Target::parse(&format!("amqp://h/{long}?exchange=x")),
            Err(TargetError::Invalid { name: "vhost", .. })
        ));
        assert!(Target::parse(&format!("amqp://h/{}?exchange=x", &long[1..])).is_ok());
        assert!(matches!(
            Target::parse("amqp://h/%2f?exchange=x&connection_timeout=0"),
            Err(TargetError::Invalid {
                name: "connection_timeout",
                ..
            })
        ));
        assert!(Target::parse("not a url").is_err());
        assert!(Target::parse("nats://h/path?subject=a").is_err());
        assert!(matches!(
            Target::parse("tls://h:4222?subject=orders.paid"),
            Ok(Target::Nats(t)) if t.server.starts_with("tls://")
        ));
        assert_eq!(
            Target::parse("amqp:///x?exchange=e"),
            Err(TargetError::NoHost)
        );
    }
}
