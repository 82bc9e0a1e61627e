//! oncebox's NATS JetStream consumer: a durable pull consumer with explicit acks; every
//! message runs through the inbox and is acknowledged only after its commit; duplicates are
//! acknowledged, poison and conflicts are quarantined with the reason, an unavailable store
//! acknowledges nothing; the stream sequence can drive the offset watermark. A failing (or
//! panicking) handler's attempts are counted by the consumer, not by the server's delivery count,
//! and a setup that would loop or lose messages is refused at start (see `ConsumeError`).
//!
//! Written against JetStream as nats-server 2.9 offers it: one filter subject per consumer,
//! NAK with a delay, explicit acks.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use oncebox_core::consume::{KeyRule, MessageRules};
//! use oncebox_core::{Response, Source};
//! use oncebox_nats::{Consumer, ConsumerOptions, InboxHandler};
//! use oncebox_sqlite::{Inbox, Options};
//!
//! let inbox = Inbox::open(Options::new("app.db"))?;
//! let apply = InboxHandler::new(inbox, |tx, event| {
//!     tx.conn().execute("INSERT INTO payments (body) VALUES (?1)", [&event.payload])?;
//!     Ok(Response::completed("ok"))
//! });
//! let rules = MessageRules::new(Source::new("shop")?, KeyRule::MessageId);
//! let options = ConsumerOptions::new("PAYMENTS", "oncebox", rules, "quarantine.payments");
//! let consumer = Consumer::new(apply, options);
//! let js = async_nats::jetstream::new(async_nats::connect("nats://127.0.0.1:4222").await?);
//! consumer.run(&js, async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(()) }
//! ```

mod attempts;
mod consumer;
mod copy;
pub mod crash;
mod credentials;
mod in_hand;
mod message;
mod pull;
mod setup;
mod subject;

pub use consumer::{Consumer, ConsumerOptions};
pub use copy::{HEADERS_DROPPED, PAYLOAD_TRUNCATED};
pub use credentials::with_credentials;
pub use message::{ORIGIN_HEADERS, QUARANTINE_HEADERS};
#[cfg(feature = "sqlite")]
pub use oncebox_sqlite::InboxHandler;
pub use setup::{ConsumeError, DeliverFrom, DurableProblem};
