//! Routes: where accepted events go, which events each one takes, and how it is delivered.
//! Plain data; the gateway matches events to routes and the relay sends to them.

use std::time::Duration;

use crate::delivery::RetryPolicy;
use crate::json::{Pointer, Value};
use crate::key::Source;
use crate::signature::Secret;

/// One destination of events. Its `Debug` shows each URL's scheme and host only: a
/// receiver's URL carries credentials in its user info, path or query (`?code=…`, Slack's
/// `/services/…/<secret>`), and a library's `{:?}` of a route, or of a relay holding it, would
/// log them.
#[derive(Clone)]
pub struct Route {
    pub name: String,
    /// Sources whose events this route takes.
    pub sources: Vec<Source>,
    /// Only events whose JSON value at the pointer equals this value (e.g. `/type` =
    /// `"payment_intent.succeeded"`); `None` takes every event of the sources.
    pub filter: Option<(Pointer, Value)>,
    pub url: String,
    pub timeout: Duration,
    /// Signs every request with Standard Webhooks headers, so receivers verify with any
    /// Standard Webhooks library.
    pub signing_secret: Option<Secret>,
    /// The receiver honours `Idempotency-Key`: a request without an answer may be retried.
    pub idempotent: bool,
    /// `GET` with `{key}` replaced asks the receiver whether it applied a key.
    pub status_url: Option<String>,
    pub retry: RetryPolicy,
    /// Requests in flight to this route at once.
    pub concurrency: usize,
    /// At most this many requests to the receiver, spaced evenly; `None` sends as fast as
    /// `concurrency` lets. Per relay process, as `concurrency` is.
    pub rate: Option<Rate>,
    /// PEM certificates of authorities an `https` receiver's certificate may come from,
    /// trusted beside the system's (a receiver behind a private authority); for a NATS route
    /// over TLS, the authorities its server's certificate must come from, trusted alone.
    pub ca_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Route")
            .field("name", &self.name)
            .field("sources", &self.sources)
            .field("filter", &self.filter)
            .field("url", &crate::shown::route_url(&self.url))
            .field("timeout", &self.timeout)
            .field("signing_secret", &self.signing_secret)
            .field("idempotent", &self.idempotent)
            .field(
                "status_url",
                &self.status_url.as_deref().map(crate::shown::route_url),
            )
            .field("retry", &self.retry)
            .field("concurrency", &self.concurrency)
            .field("rate", &self.rate)
            .field("ca_pem", &self.ca_pem.as_ref().map(|pem| pem.len()))
            .finish()
    }
}

/// How long a request waits for the receiver's answer unless a route says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Requests in flight to one route at once unless it says otherwise.
pub const DEFAULT_CONCURRENCY: usize = 16;

impl Route {
    /// A route named `name` to `url` (an http(s) receiver, `amqp://…` or `nats://…`) with no
    /// sources (it sends the messages a library's handlers queue for `name`; a configured route
    /// must name one) and the defaults a configured route has: no filter, unsigned, not idempotent, no status URL, a 10 s timeout,
    /// the default retries, 16 requests at once, unpaced. Set the rest on the value.
    pub fn new(name: impl Into<String>, url: impl Into<String>) -> Route {
        Route {
            name: name.into(),
            sources: Vec::new(),
            filter: None,
            url: url.into(),
            timeout: DEFAULT_TIMEOUT,
            signing_secret: None,
            idempotent: false,
            status_url: None,
            retry: RetryPolicy::default(),
            concurrency: DEFAULT_CONCURRENCY,
            rate: None,
            ca_pem: None,
        }
    }

    /// Whether an event of `source` with body `doc` (when it parsed as JSON) goes here.
    pub fn takes(&self, source: &Source, doc: Option<&Value>) -> bool {
        if !self.sources.contains(source) {
            return false;
        }
        match &self.filter {
            None => true,
            Some((pointer, want)) => doc.and_then(|d| d.pointer(pointer)) == Some(want),
        }
    }
}

/// A route's pace: at most `requests` every `per`, one every `per / requests`. Written
/// `"50/s"`, `"600/min"` or `"100/h"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub requests: u32,
    pub per: Duration,
}

/// The most requests a rate may name per unit: far more than one relay sends.
pub const MAX_RATE_REQUESTS: u32 = 1_000_000;

/// Why a rate was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RateError {
    #[error("expected requests per unit: \"50/s\", \"600/min\" or \"100/h\"")]
    Form,
    #[error("the number of requests must be from 1 to {MAX_RATE_REQUESTS}")]
    Requests,
}

impl Rate {
    /// Parses `"N/s"`, `"N/min"` or `"N/h"`, N from 1 to [`MAX_RATE_REQUESTS`].
    pub fn parse(text: &str) -> Result<Rate, RateError> {
        let (n, unit) = text.split_once('/').ok_or(RateError::Form)?;
        let per = match unit {
            "s" => Duration::from_secs(1),
            "min" => Duration::from_secs(60),
            "h" => Duration::from_secs(3600),
            _ => return Err(RateError::Form),
        };
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
            return Err(RateError::Form);
        }
        let requests = n
            .parse::<u32>()
            .ok()
            .filter(|r| (1..=MAX_RATE_REQUESTS).contains(r))
            .ok_or(RateError::Requests)?;
        Ok(Rate { requests, per })
    }

    /// The time between two requests.
    pub fn interval(&self) -> Duration {
        self.per / self.requests.max(1)
    }
}

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let unit = match self.per.as_secs() {
            1 => "s",
            60 => "min",
            3600 => "h",
            _ => return write!(f, "{} per {:?}", self.requests, self.per),
        };
        write!(f, "{}/{unit}", self.requests)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_in_three_units_and_print_as_written() {
        for (text, requests, secs) in [("50/s", 50, 1), ("600/min", 600, 60), ("1/h", 1, 3600)] {
            let rate = Rate::parse(text).unwrap();
            assert_eq!(
                (rate.requests, rate.per),
                (requests, Duration::from_secs(secs))
            );
            assert_eq!(rate.to_string(), text);
        }
        assert_eq!(
            Rate::parse("50/s").unwrap().interval(),
            Duration::from_millis(20)
        );
        assert_eq!(
            Rate::parse("1000000/s").unwrap().interval(),
            Duration::from_micros(1)
        );
    }

    #[test]
    fn malformed_rates_are_refused_with_the_reason() {
        for bad in [
            "", "50", "/s", "50/", "50/sec", "50 /s", "+5/s", "-5/s", "5.5/s", "5/S",
        ] {
            assert_eq!(Rate::parse(bad), Err(RateError::Form), "{bad:?}");
        }
        for bad in ["0/s", "1000001/s", "99999999999999999999/s"] {
            assert_eq!(Rate::parse(bad), Err(RateError::Requests), "{bad:?}");
        }
    }

    /// A route's `Debug` shows its URLs' scheme and host only: credentials in the user info
    /// (encoded or not), the path or the query never reach a log.
    #[test]
    fn debug_shows_no_credentials() {
        let mut route = Route::new(
            "hooks",
            "https://user:pa/ss@hooks.example/services/T1/B2/s3cret?code=k3y",
        );
        route.status_url = Some("https://hooks.example/status/{key}?sig=s1g".to_owned());
        let shown = format!("{route:?}");
        for secret in ["pa/ss", "s3cret", "k3y", "s1g", "user"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        // The password's `/` is told from the path: the host is shown, the user info hidden.
        assert!(
            shown.contains("\"https://***@hooks.example/***\""),
            "{shown}"
        );
        assert!(shown.contains("\"https://hooks.example/***\""), "{shown}");
    }
}
