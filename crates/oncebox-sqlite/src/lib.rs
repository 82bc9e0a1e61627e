//! oncebox on SQLite: the inbox record, the caller's business effect and its outbox messages
//! commit in one transaction, group-committed by a single writer thread.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use oncebox_core::{Event, Key, Response};
//! use oncebox_sqlite::{Inbox, Options};
//!
//! let inbox = Inbox::open(Options::new("app.db"))?;
//! let event = Event::json(Key::parse("shop", "evt_1")?, r#"{"order":7}"#)?;
//! let outcome = inbox
//!     .process(event, |tx| {
//!         tx.conn().execute("UPDATE orders SET paid = 1 WHERE id = 7", [])?;
//!         Ok(Response::completed("paid"))
//!     })
//!     .await?;
//! # Ok(()) }
//! ```

mod checkpoint;
mod consume;
pub mod crash;
mod deliveries;
mod error;
mod inbox;
mod lease;
mod lenient;
mod moved;
mod offsets;
mod options;
mod pcache;
mod placement;
#[cfg(feature = "crash-points")]
pub mod powerloss;
mod priority;
mod probe;
mod process;
mod purge;
mod read;
mod recent;
mod schema;
#[cfg(test)]
mod scratch;
mod stmts;
mod store;
mod tx;
mod vfsfile;
mod walvfs;
mod writer;

pub use consume::InboxHandler;
pub use error::{Error, OpenError};
pub use inbox::Inbox;
pub use oncebox_core::{Record, RecordState, Resolution};
pub use options::{Durability, MAX_LINGER, MAX_RECENT_ANSWERS, Options};
pub use pcache::{page_cache_wrapped, parked_pages};
pub use placement::Placement;
pub use rusqlite;
pub use tx::{Enqueued, HandlerError, OffsetMove, Once, Tx};
pub use writer::Stats;
