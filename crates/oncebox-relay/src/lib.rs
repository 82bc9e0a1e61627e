//! oncebox-relay: delivers outbox messages to routes. Each delivery is claimed under a lease
//! with a fencing token, sent with `Idempotency-Key: {source}:{event_id}` (the same for every
//! attempt, forever), and recorded only while the lease is still ours. A request sent without
//! an answer is retried only where the route honours the key; otherwise it is parked as
//! *uncertain* for a status URL or an operator to settle.

pub mod crash;
mod relay;
mod send;

pub use relay::{Outcome, Relay, RelayOptions};
