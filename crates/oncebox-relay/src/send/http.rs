//! One HTTP attempt: the request DESIGN §6 describes, and the honest reading of what happened —
//! answered, never sent, or sent without an answer. And the status-URL question of
//! reconciliation.

use std::borrow::Cow;
use std::time::Duration;

use oncebox_core::Timestamp;
use oncebox_core::delivery::Attempt;
use oncebox_core::hops::HOPS_HEADER;
use oncebox_core::json::Value;
use oncebox_core::relay_store::{Claimed, FENCE_HEADER};
use oncebox_core::route::Route;
use oncebox_core::signature::{Scheme, sign};

/// How long a connection to a receiver is kept idle for the next delivery: shorter than the
/// receivers' own keep-alive (gunicorn 2 s, Node, uvicorn and Apache 5 s), so the relay gives a
/// connection up before the receiver does. Kept past it (reqwest's default is 90 s), a delivery
/// written as the receiver closes the connection gets no answer, and on a route that does not
/// honour the key an event the receiver never saw is parked *uncertain*. A new connection for
/// deliveries more than a second apart costs one handshake; under load connections stay busy.
const IDLE: Duration = Duration::from_secs(1);

/// Every request's `User-Agent`. Without one (reqwest sends none by default) web application
/// firewalls' common rules (AWS WAF's `NoUserAgent_HEADER`, say) answer 403, and every
/// delivery of the route died on its first attempt; with one, a receiver can also allow it by
/// name.
pub const USER_AGENT: &str = concat!("oncebox/", env!("CARGO_PKG_VERSION"));

/// The client of one route. Redirects are not followed: a receiver that moved must be
/// reconfigured, not guessed. A connection not made within half the route's timeout is given
/// up as a connect error: the receiver saw nothing and the attempt is retried. Without it the
/// whole timeout would fire during the connect, and a receiver behind a firewall that drops
/// packets would read as sent without an answer — uncertain. An `https` receiver must present
/// a certificate from the system's authorities or from the route's own (`ca_pem`). The
/// environment's proxies (`HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY`) are not used: set for
/// something else (a package install in the image), they would see every signed body and the
/// URL's credentials, and a filtering proxy's own `200` would be recorded as delivered.
pub(crate) fn client(route: &Route) -> Result<reqwest::Client, String> {
    let mut builder = reqwest::Client::builder()
        .user_agent(USER_AGENT)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .pool_idle_timeout(IDLE)
        .connect_timeout(route.timeout / 2);
    if let Some(pem) = &route.ca_pem {
        let authorities = reqwest::Certificate::from_pem_bundle(pem)
            .map_err(|e| format!("the route's authorities: {}", error_chain(&e)))?;
        for ca in authorities {
            builder = builder.add_root_certificate(ca);
        }
    }
    builder.build().map_err(|e| error_chain(&e))
}

/// POSTs attempt `number` of `claimed` to `route`.
pub(super) async fn attempt(
    client: &reqwest::Client,
    route: &Route,
    claimed: &Claimed,
    number: u32,
    started_at: Timestamp,
) -> Attempt {
    let key = wire_key(&claimed.idempotency_key);
    let mut request = client
        .post(&route.url)
        .timeout(route.timeout)
        .header("content-type", claimed.content_type.as_str())
        // Stable for every attempt of this (event, route), forever: receivers deduplicate on it.
        .header("idempotency-key", key.as_ref())
        .header("oncebox-attempt", number.to_string())
        // The loop guard: a gateway receiving this refuses it past the limit (`hops`).
        .header(HOPS_HEADER, claimed.hops.to_string())
        .header(FENCE_HEADER, claimed.token.to_string())
        .body(claimed.payload.clone());
    if let Some(secret) = &route.signing_secret {
        for (name, value) in sign(
            &Scheme::StandardWebhooks,
            secret,
            &key,
            started_at,
            &claimed.payload,
        ) {
            request = request.header(name, value);
        }
    }
    match request.send().await {
        Ok(response) => {
            let status = response.status().as_u16();
            let header = |name| response.headers().get(name).and_then(|v| v.to_str().ok());
            // A date in Retry-After is on the receiver's clock: measured from its own Date, a
            // skew between the two clocks does not stretch or shorten the wait.
            let sent_at = header("date").and_then(http_date).unwrap_or(started_at);
            let retry_after = header("retry-after").and_then(|v| retry_after(v, sent_at));
            drain(response).await;
            Attempt::Answered {
                status,
                retry_after,
            }
        }
        // The URL is left out: a route's may carry credentials (`user:pass@`, a `?token=`),
        // and the text is kept as the attempt's error, shown by the admin API and dashboard.
        Err(e) => classify(&e.without_url()),
    }
}

/// The key as it goes on the wire, in `Idempotency-Key`, in the signed `webhook-id` and (percent
/// encoded once more) in the status URL. Do not change: receivers deduplicate on it, across
/// restarts and upgrades.
///
/// A key of printable ASCII (and tabs, which an outbox key may hold) goes verbatim: every key
/// that went before goes as it did. Any other key goes percent-encoded, every byte but
/// ALPHA / DIGIT / `-._~` as `%XX`: receivers read header bytes as Latin-1 (Python's
/// `http.server`, Node's `http`), so raw UTF-8 would reach them as mojibake and a signature over
/// it would never verify. The two forms cannot meet for gateway keys: a verbatim one has a `:`
/// right after its source name (`[a-z0-9][a-z0-9._-]*`), an encoded one has no `:`, and
/// percent-encoding is injective. An outbox key is the application's own string: one of
/// printable ASCII that spells another key's encoding would reach the receiver as that key.
fn wire_key(key: &str) -> Cow<'_, str> {
    if key.bytes().all(|b| matches!(b, b' '..=b'~' | b'\t')) {
        Cow::Borrowed(key)
    } else {
        Cow::Owned(percent_encode(key))
    }
}

/// The most of a receiver's answer read: its body is not needed, and one that streams
/// gigabytes within the timeout must not fill the relay's memory.
const BODY_LIMIT: usize = 64 << 10;

/// Reads the body away so the connection can be reused, up to [`BODY_LIMIT`]; past it the
/// response is dropped and its connection closed.
async fn drain(mut response: reqwest::Response) {
    let mut read = 0usize;
    while let Ok(Some(chunk)) = response.chunk().await {
        read += chunk.len();
        if read > BODY_LIMIT {
            break;
        }
    }
}

/// At most [`BODY_LIMIT`] bytes of the body; `None` past it or when reading fails.
async fn limited_body(mut response: reqwest::Response) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.ok()? {
        if body.len() + chunk.len() > BODY_LIMIT {
            return None;
        }
        body.extend_from_slice(&chunk);
    }
    Some(body)
}

/// The wait a `Retry-After` value asks for (RFC 9110 §10.2.3): a number of seconds, or an
/// HTTP date, measured from `now`, the answer's own date (a date already past asks for none). A number too large to
/// hold waits the longest possible, so the route's age limit gives the delivery up instead of
/// retrying it early. `None` for anything else: the backoff alone decides.
fn retry_after(value: &str, now: Timestamp) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        return Some(Duration::from_secs(value.parse().unwrap_or(u64::MAX)));
    }
    let wait = http_date(value)?
        .millis()
        .saturating_sub(now.millis())
        .max(0);
    Some(Duration::from_millis(u64::try_from(wait).unwrap_or(0)))
}

/// An HTTP date (RFC 9110 §5.6.7, the obsolete forms included).
fn http_date(value: &str) -> Option<Timestamp> {
    let at = httpdate::parse_http_date(value.trim()).ok()?;
    let since = at.duration_since(std::time::UNIX_EPOCH).ok()?;
    Some(Timestamp(
        i64::try_from(since.as_millis()).unwrap_or(i64::MAX),
    ))
}

/// A connection that could not be made means the receiver saw nothing. Anything else after the
/// connection was made — a timeout waiting for the answer, a reset — may have come after the
/// receiver applied the request: the outcome is unknown.
fn classify(e: &reqwest::Error) -> Attempt {
    let text = error_chain(e);
    if e.is_connect() || e.is_builder() {
        Attempt::NotSent(text)
    } else {
        Attempt::NoAnswer(text)
    }
}

pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Asks the route's status URL whether the receiver applied `key`, named in the URL by its
/// [wire form](wire_key), the key the receiver saw, percent-encoded. `Some(true)`: applied;
/// `Some(false)`: not applied; `None`: the answer says nothing (no status URL, an error, or a
/// body without a boolean `applied`).
///
/// Only the body speaks: a 2xx with `{"applied": true|false}`, or a 404 with `{"applied":
/// false}` (a receiver with no record of the key). A bare 404 is no answer: a wrong path, a
/// status endpoint not yet deployed or a proxy's default page answers one for every key, and
/// taking it for "not applied" would send every uncertain delivery again, the applied ones too.
pub(crate) async fn applied(client: &reqwest::Client, route: &Route, key: &str) -> Option<bool> {
    let url = status_url(route.status_url.as_ref()?, key)?;
    // `no-cache`: a cache in front of the receiver (a CDN storing JSON GETs) would answer a
    // later question with an earlier "not applied", and the delivery would be sent again.
    let response = client
        .get(url)
        .header(reqwest::header::CACHE_CONTROL, "no-cache")
        .timeout(route.timeout)
        .send()
        .await
        .ok()?;
    let not_found = response.status().as_u16() == 404;
    if !response.status().is_success() && !not_found {
        return None;
    }
    // The strict parser: a name twice (`{"applied": false, "applied": true}`) is no answer, not
    // its last value, as in every other JSON oncebox reads.
    let body = oncebox_core::json::parse(&limited_body(response).await?).ok()?;
    let Value::Object(fields) = body else {
        return None;
    };
    let applied = match fields.iter().find(|(name, _)| name == "applied")? {
        (_, Value::Bool(applied)) => *applied,
        _ => return None,
    };
    // A 404 that says "applied" contradicts itself.
    (!(not_found && applied)).then_some(applied)
}

/// The status URL of `key`; `None` for a key that no path segment can name. A key that is `.`
/// or `..` alone is a dot segment, which URL parsing removes, and so is its percent-encoding
/// (`%2E`): `/status/..` asks `/`, another resource, whose answer would settle the delivery.
/// Such a delivery stays for an operator.
fn status_url(template: &str, key: &str) -> Option<String> {
    let segment = percent_encode(&wire_key(key));
    (segment != "." && segment != "..").then(|| template.replace("{key}", &segment))
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_of_printable_ascii_goes_verbatim_any_other_percent_encoded() {
        let cases = [
            ("shop:evt_1", "shop:evt_1"),
            ("shop:a%b c", "shop:a%b c"),
            ("thank-you:o-7\tx", "thank-you:o-7\tx"),
            ("shop:msg_é_1", "shop%3Amsg_%C3%A9_1"),
            ("shop:a b\u{a0}", "shop%3Aa%20b%C2%A0"),
            ("shop:~ok-é", "shop%3A~ok-%C3%A9"),
        ];
        for (key, wire) in cases {
            assert_eq!(wire_key(key), wire, "{key:?}");
        }
    }

    #[test]
    fn a_key_no_path_segment_can_name_is_not_asked_about() {
        let template = "http://h/status/{key}";
        for key in [".", ".."] {
            assert_eq!(status_url(template, key), None, "{key:?}");
        }
        for (key, path) in [
            ("a..", "/status/a.."),
            ("...", "/status/..."),
            ("shop:.", "/status/shop%3A."),
        ] {
            let url = status_url(template, key).unwrap();
            assert_eq!(reqwest::Url::parse(&url).unwrap().path(), path, "{key:?}");
        }
    }

    /// 2015-10-21T07:28:00Z, the example date of RFC 9110.
    const AT: Timestamp = Timestamp(1_445_412_480_000);

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        let cases: [(&str, Option<Duration>); 10] = [
            ("120", Some(Duration::from_secs(120))),
            (" 0 ", Some(Duration::ZERO)),
            (
                "Wed, 21 Oct 2015 07:30:00 GMT",
                Some(Duration::from_secs(120)),
            ),
            // The obsolete forms a recipient must still accept.
            (
                "Wednesday, 21-Oct-15 07:30:00 GMT",
                Some(Duration::from_secs(120)),
            ),
            ("Wed Oct 21 07:30:00 2015", Some(Duration::from_secs(120))),
            // Already past: due now, not a negative wait.
            ("Wed, 21 Oct 2015 07:27:00 GMT", Some(Duration::ZERO)),
            (
                "99999999999999999999999",
                Some(Duration::from_secs(u64::MAX)),
            ),
            ("-5", None),
            ("1.5", None),
            ("soon", None),
        ];
        for (value, want) in cases {
            assert_eq!(retry_after(value, AT), want, "{value:?}");
        }
        assert_eq!(retry_after("", AT), None);
    }
}
