//! oncebox's RabbitMQ consumer: every message runs through the inbox and is acknowledged only
//! after its commit; duplicates are acknowledged, poison and conflicts are quarantined with the
//! reason, and an unavailable store acknowledges nothing.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use oncebox_amqp::{Consumer, ConsumerOptions, InboxHandler};
//! use oncebox_core::consume::{KeyRule, MessageRules};
//! use oncebox_core::{Response, Source};
//! use oncebox_sqlite::{Inbox, Options};
//!
//! let inbox = Inbox::open(Options::new("app.db"))?;
//! let apply = InboxHandler::new(inbox, |tx, event| {
//!     tx.conn().execute("INSERT INTO payments (body) VALUES (?1)", [&event.payload])?;
//!     Ok(Response::completed("ok"))
//! });
//! let rules = MessageRules::new(Source::new("shop")?, KeyRule::MessageId);
//! let consumer = Consumer::new(apply, ConsumerOptions::new("payments", rules, "oncebox.quarantine"));
//! let connection = lapin::Connection::connect("amqp://127.0.0.1:5672/%2f", Default::default()).await?;
//! consumer.run(&connection, async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(()) }
//! ```

mod consumer;
mod copy;
pub mod crash;
mod error;
mod handle;
mod message;
mod publish;
mod uri;

pub use consumer::{Consumer, ConsumerOptions, OptionsError, SHORT_STRING_MAX};
pub use copy::HEADERS_DROPPED;
pub use error::ConsumeError;
pub use handle::MAX_HOLD;
pub use message::{ORIGIN_HEADERS, QUARANTINE_HEADERS, Quarantine};
#[cfg(feature = "sqlite")]
pub use oncebox_sqlite::InboxHandler;
pub use uri::{DEFAULT_HEARTBEAT, UriError, connection_uri};
