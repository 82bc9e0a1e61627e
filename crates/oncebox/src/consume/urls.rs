//! The broker URLs `consume` is given, checked before anything starts and refused without
//! repeating them (they carry passwords and tokens).

use anyhow::Result;

const AMQP_FORM: &str = "amqp://[user:password@]host[:port]/[vhost]";
const NATS_FORM: &str = "nats://[user:password@]host[:port] or tls://…";

/// Refuses a RabbitMQ URL that could never connect: a consumer would otherwise retry it
/// forever, or, with a vhost longer than AMQP can name, lapin would panic opening it. The
/// URL is not repeated: it carries the password, and lapin's reading of one without `//`
/// (`amqp:guest:s3cret@rabbit/%2f`) quotes it whole.
pub(super) fn amqp_url(url: &str) -> Result<lapin::uri::AMQPUri> {
    oncebox_amqp::connection_uri(url).map_err(|e| {
        let why = match e {
            oncebox_amqp::UriError::NotUrl(said) => not_an_amqp_url(url, &said),
            e => e.to_string(),
        };
        crate::exit::usage(format!("--amqp: {why}"))
    })
}

/// Why lapin does not read `url` (it `said`), in words that quote none of the URL's
/// credentials: the URL parser's own errors (`invalid port number`, `empty host`) name no part
/// of their input, and lapin's about a URL that reads (a query value that is no number, a
/// mechanism it does not know) are shown unless they hold the user or password.
fn not_an_amqp_url(url: &str, said: &str) -> String {
    match url::Url::parse(url) {
        Err(e) => format!("not a URL ({e}); expected {AMQP_FORM}"),
        // lapin says `Invalid URL: '<the URL>'`.
        Ok(u) if u.cannot_be_a_base() => {
            format!("not an AMQP URL: no // after the scheme; expected {AMQP_FORM}")
        }
        Ok(u) if !matches!(u.scheme(), "amqp" | "amqps") => {
            format!("not an AMQP URL: the scheme is not amqp; expected {AMQP_FORM}")
        }
        Ok(u) => {
            let credentials = [u.username(), u.password().unwrap_or_default()];
            if credentials
                .iter()
                .any(|c| !c.is_empty() && said.contains(c))
            {
                format!("not an AMQP URL; expected {AMQP_FORM}")
            } else {
                format!("not an AMQP URL: {said}")
            }
        }
    }
}

/// Refuses a NATS URL the client cannot connect with, as `--amqp` is refused: the consumer
/// would otherwise say "reconnecting" for ever. Read as the client reads it (`nats://` when no
/// scheme is given), without repeating it: it may carry a password or a token.
pub(super) fn nats_url(url: &str) -> Result<()> {
    let refused = |why: String| crate::exit::usage(format!("--nats: {why}; expected {NATS_FORM}"));
    let full = if url.contains("://") {
        url.to_owned()
    } else {
        format!("nats://{url}")
    };
    let parsed = url::Url::parse(&full).map_err(|e| refused(format!("not a URL ({e})")))?;
    // `ws://` and `wss://` are the client's too, but this build has no WebSocket transport:
    // it would speak plain NATS to a WebSocket port.
    if !matches!(parsed.scheme(), "nats" | "tls") {
        return Err(refused("the scheme is not nats or tls".to_owned()));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(refused("no host".to_owned()));
    }
    // What `connect_nats` hands the client, read as the client reads it.
    let (_, server) = oncebox_nats::with_credentials(async_nats::ConnectOptions::new(), url);
    server
        .parse::<async_nats::ServerAddr>()
        .map_err(|_| refused("not a URL the NATS client reads".to_owned()))?;
    Ok(())
}
