//! Routes that deliver back into a consumer of their own source, found where the configuration
//! alone shows it: an AMQP route through the default exchange into a consumed queue, a NATS
//! route to a subject a consumer's filter takes. Each pass of such a loop is a new event under a
//! new key; the loop guard (`oncebox_core::hops`) ends it after 16, and `check` says so first.
//! An HTTP route to this gateway's own ingress for one of the route's sources is found too.
//! A route to a named exchange, or to a stream whose consumer has no filter, depends on
//! bindings and stream subjects the broker alone knows: those are not judged.

use std::net::{IpAddr, SocketAddr};

use oncebox_core::route::Route;
use oncebox_relay::Target;
use url::{Host, Url};

use super::consumer::{Broker, ConsumerSpec};

/// A warning for each route that feeds a consumer of one of its own sources.
pub(super) fn warn(routes: &[Route], consumers: &[ConsumerSpec], warnings: &mut Vec<String>) {
    for r in routes {
        let Ok(target) = Target::parse(&r.url) else {
            continue;
        };
        for c in consumers
            .iter()
            .filter(|c| r.sources.contains(&c.rules.source))
        {
            let fed = match (&target, &c.broker) {
                (Target::Amqp(t), Broker::Amqp { queue, .. }) => {
                    t.exchange.is_empty() && t.routing_key == *queue
                }
                (Target::Nats(t), Broker::Nats { subject, .. }) => subject
                    .as_deref()
                    .is_some_and(|f| subject_matches(f, &t.subject)),
                _ => false,
            };
            if fed {
                warnings.push(format!(
                    "routes.{}: it publishes into what consumers.{} reads for source {}, so each \
                     of its events comes back as a new one; the loop guard ends it after 16 \
                     events (hop-limit)",
                    r.name, c.name, c.rules.source
                ));
            }
        }
    }
}

/// A warning for each HTTP route that posts to this gateway's own ingress (`listen`) for one of
/// its own sources: every event it delivers is accepted again under a new key. Addresses are
/// compared as written: a loopback name or the listener's own address, and its port.
pub(super) fn warn_http(listen: SocketAddr, routes: &[Route], warnings: &mut Vec<String>) {
    if listen.port() == 0 {
        return;
    }
    for r in routes {
        let Ok(url) = Url::parse(&r.url) else {
            continue;
        };
        let ours = match url.host() {
            Some(Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
            Some(Host::Ipv4(ip)) => ip.is_loopback() || IpAddr::V4(ip) == listen.ip(),
            Some(Host::Ipv6(ip)) => ip.is_loopback() || IpAddr::V6(ip) == listen.ip(),
            None => false,
        };
        if !ours || url.port_or_known_default() != Some(listen.port()) {
            continue;
        }
        let mut segments = url.path_segments().into_iter().flatten();
        let into = match (
            segments.next(),
            segments.next(),
            segments.next(),
            segments.next(),
        ) {
            (Some("v1"), Some("sources"), Some(source), Some("events")) => source,
            _ => continue,
        };
        if r.sources.iter().any(|s| s.as_str() == into) {
            warnings.push(format!(
                "routes.{}: it posts to this gateway's own ingress for source {into}, which it \
                 takes from, so each of its events comes back as a new one; the loop guard ends \
                 it after 16 events (hop-limit)",
                r.name
            ));
        }
    }
}

/// Whether NATS subject `subject` (no wildcards) is taken by `filter`: `*` stands for one token,
/// a last `>` for one or more.
fn subject_matches(filter: &str, subject: &str) -> bool {
    let mut tokens = subject.split('.');
    for f in filter.split('.') {
        match (f, tokens.next()) {
            (">", Some(_)) => return true,
            ("*", Some(_)) => {}
            (f, Some(t)) if f == t => {}
            _ => return false,
        }
    }
    tokens.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::subject_matches;

    #[test]
    fn filters_take_subjects_as_nats_does() {
        assert!(subject_matches("orders.>", "orders.paid"));
        assert!(subject_matches("orders.>", "orders.paid.eu"));
        assert!(!subject_matches("orders.>", "orders"));
        assert!(subject_matches("orders.*", "orders.paid"));
        assert!(!subject_matches("orders.*", "orders.paid.eu"));
        assert!(subject_matches("orders.paid", "orders.paid"));
        assert!(!subject_matches("orders.paid", "orders.paid.eu"));
        assert!(!subject_matches("orders.paid.eu", "orders.paid"));
        assert!(!subject_matches("payments.>", "orders.paid"));
        assert!(subject_matches(">", "orders"));
    }
}
