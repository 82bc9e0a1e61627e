//! oncebox-relay: delivers outbox messages to routes — HTTP receivers, RabbitMQ exchanges, NATS
//! JetStream subjects. Each delivery is claimed under a lease with a fencing token, sent with
//! the key `{source}:{event_id}` (the same for every attempt, forever), and recorded only while
//! the lease is still ours. An attempt sent without an answer (or a publish without a confirm)
//! is retried only where the route honours the key; otherwise it is parked as *uncertain* for
//! a status URL or an operator to settle.

pub mod crash;
mod relay;
mod send;
mod target;

pub use relay::{Outcome, Relay, RelayOptions};
pub use send::USER_AGENT;
pub use target::{AmqpTarget, NatsTarget, Target, TargetError};
