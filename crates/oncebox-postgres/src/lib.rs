//! oncebox on PostgreSQL: the same guarantees as on SQLite, for several gateway and relay nodes
//! sharing one database.
//!
//! - **Claims** are `INSERT … ON CONFLICT DO NOTHING` on the key's unique index, under READ
//!   COMMITTED; a key that exists is decided from its committed record, read under a row lock.
//!   No reliance on SERIALIZABLE; deadlocks (40P01), serialization failures (40001) and lost
//!   connections answer `Unavailable`, never `Duplicate` (G3).
//! - **Handlers** get a real transaction ([`Tx`]): the user's SQL, the inbox record, action keys,
//!   entity versions, offsets and outbox rows commit or roll back together.
//! - **Batched ingest** for the gateway: concurrent events become one set-based statement
//!   (`INSERT … SELECT FROM UNNEST(…) ON CONFLICT DO NOTHING RETURNING`) and one commit.
//! - **Leases** use fencing tokens from a sequence (never repeated) and single guarded
//!   statements, so an expired holder cannot complete.
//! - **Relay** claims with `FOR UPDATE SKIP LOCKED`; new deliveries `NOTIFY` listening relays.
//! - **Broker consumers** (RabbitMQ, NATS) take [`InboxHandler`] as their `Apply`.
//! - **Size**: an event past [`MAX_EVENT_BYTES`] is refused as invalid before any query.
//! - **Migrations** run under an advisory lock: nodes starting together apply each once.

mod anchor;
mod batch;
mod claim;
mod consume;
pub mod crash;
mod deliveries;
mod error;
mod inbox;
mod limit;
mod listen;
mod offsets;
mod options;
mod qualified;
mod read;
mod schema;
mod silent;
mod skew;
mod store;
mod tx;

pub use batch::BatchStats;
pub use consume::InboxHandler;
pub use error::{Error, OpenError};
pub use inbox::{Handler, Inbox};
pub use limit::MAX_EVENT_BYTES;
pub use oncebox_core::{Record, RecordState, Resolution};
pub use options::Options;
pub use read::MAX_PAGE;
pub use sqlx;
pub use tx::{Enqueued, HandlerError, OffsetMove, Once, Tx};

/// The `LISTEN`/`NOTIFY` channel on which new deliveries wake relays, for the tables in the
/// `public` schema; [`outbox_channel`] names each schema's.
pub const OUTBOX_CHANNEL: &str = "oncebox_outbox";

/// The channel on which new deliveries in `schema` wake that schema's relays: one per schema,
/// so a commit in one deployment's schema wakes no other deployment's relays sharing the
/// database. `public` keeps [`OUTBOX_CHANNEL`]; another schema's name is hashed into the
/// channel's, which PostgreSQL limits to 63 bytes.
pub fn outbox_channel(schema: &str) -> String {
    if schema == "public" {
        return OUTBOX_CHANNEL.to_owned();
    }
    let digest = oncebox_core::FingerprintMode::Raw
        .fingerprint(schema.as_bytes())
        .map(|f| f.to_hex())
        .unwrap_or_default();
    format!("{OUTBOX_CHANNEL}_{}", &digest[..digest.len().min(16)])
}
