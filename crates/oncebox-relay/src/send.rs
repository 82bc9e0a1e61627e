//! One attempt of a delivery, dispatched on its route's target: an HTTP request, a RabbitMQ
//! publish with a publisher confirm, or a JetStream publish with its PubAck. Each is read the
//! same honest way: confirmed, never sent, or sent without an answer.

mod amqp;
mod http;
mod nats;

use std::fmt;
use std::time::Instant;

use oncebox_core::Clock;
use oncebox_core::delivery::Attempt;
use oncebox_core::relay_store::{AttemptRecord, Claimed};
use oncebox_core::route::Route;

pub use http::USER_AGENT;
pub(crate) use http::{applied, client};

use crate::target::{Target, TargetError};

/// A broker's confirm in the attempt vocabulary the delivery policy speaks, which is HTTP's:
/// the broker took responsibility for the message, as a 2xx says a receiver did. The recorded
/// attempt carries no status, so operators never read an HTTP code nobody sent.
const CONFIRMED: Attempt = Attempt::Answered {
    status: 200,
    retry_after: None,
};

/// Where one route's attempts go, holding the broker connection between attempts.
pub(crate) enum Link {
    Http,
    Amqp(amqp::Publisher),
    Nats(nats::Publisher),
    /// A URL the configuration would have refused (a library caller built the route): every
    /// attempt fails as not sent, so the delivery waits, unharmed, until the caps end it.
    Invalid(TargetError),
}

impl Link {
    pub(crate) fn new(route: &Route) -> Link {
        match Target::parse(&route.url) {
            Ok(Target::Amqp(t)) => Link::Amqp(amqp::Publisher::new(t)),
            Ok(Target::Nats(t)) => Link::Nats(nats::Publisher::new(t, route.ca_pem.clone())),
            Ok(_) => Link::Http,
            Err(e) => Link::Invalid(e),
        }
    }
}

impl fmt::Debug for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Link::Http => f.write_str("Http"),
            Link::Amqp(p) => p.fmt(f),
            Link::Nats(p) => p.fmt(f),
            Link::Invalid(e) => write!(f, "Invalid({e})"),
        }
    }
}

/// Sends one attempt of `claimed` through `link` to `route`.
pub(crate) async fn attempt(
    client: &Result<reqwest::Client, String>,
    link: &Link,
    route: &Route,
    claimed: &Claimed,
    clock: &dyn Clock,
) -> (Attempt, AttemptRecord) {
    let started_at = clock.now();
    let started = Instant::now();
    let number = claimed.attempts.saturating_add(1);
    let attempt = match link {
        Link::Http => match client {
            Ok(client) => http::attempt(client, route, claimed, number, started_at).await,
            Err(e) => Attempt::NotSent(format!("route client: {e}")),
        },
        Link::Amqp(p) => p.publish(claimed, number, route.timeout).await,
        Link::Nats(p) => p.publish(claimed, number, route.timeout).await,
        Link::Invalid(e) => Attempt::NotSent(format!("route url: {e}")),
    };
    let status = match (&attempt, link) {
        (Attempt::Answered { status, .. }, Link::Http) => Some(*status),
        _ => None,
    };
    let error = match &attempt {
        Attempt::Answered { .. } => None,
        Attempt::NotSent(e) | Attempt::NoAnswer(e) => Some(e.clone()),
        other => Some(format!("{other:?}")),
    };
    let record = AttemptRecord {
        started_at,
        duration: started.elapsed(),
        status,
        error,
    };
    (attempt, record)
}
