//! A relay lease that leaves a route's reply little time to be recorded, warned of.

use std::time::Duration;

use oncebox_core::route::Route;
use oncebox_relay::RelayOptions;

/// What a lease should hold beyond a route's timeout: the relay keeps half of what is left,
/// up to 5 s, to record an outcome answered at the timeout, and a store's ordinary slow moment
/// (a SQLite writer's fsync under load, a PostgreSQL failover) can take that long.
const COMFORTABLE: Duration = Duration::from_secs(10);

/// Warns of each route whose timeout the lease outlasts by less than [`COMFORTABLE`]: a
/// reply received late in the attempt and recorded past the lease is not kept, and the
/// delivery is taken over, sent again, or parked uncertain on a route that ignores the key,
/// although the receiver answered.
pub(super) fn warn(relay: &RelayOptions, routes: &[Route], warnings: &mut Vec<String>) {
    for r in routes {
        let beyond = relay.lease.saturating_sub(r.timeout);
        if beyond < COMFORTABLE {
            warnings.push(format!(
                "relay.lease: holds only {} beyond routes.{}.timeout, and half of that is left \
                 to record an outcome answered late; a store slower than that (a busy SQLite \
                 writer, a PostgreSQL failover) loses the lease, and the delivery is sent again \
                 or, on a route that does not honour the key, parked uncertain although the \
                 receiver answered: a lease of at least the timeout + 10s keeps 5s",
                humantime::format_duration(beyond),
                r.name
            ));
        }
    }
}
