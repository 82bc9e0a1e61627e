//! The JetStream consumer against the real NATS server (`ONCEBOX_NATS_URL`) and real SQLite
//! files: duplicates, a consumer killed between commit and ack, processing past the ack wait
//! (said to be in progress, and with that off),
//! poison messages, quarantined copies too large to store as they are, an unavailable database,
//! the stream-sequence watermark, the setups refused at start and where a new durable starts.
//! Each scenario prints its figures.

mod copy;
mod faults;
mod keys;
mod kill;
mod progress;
mod restore;
mod scenarios;
mod settle;
mod setup;
mod stall;
mod support;
