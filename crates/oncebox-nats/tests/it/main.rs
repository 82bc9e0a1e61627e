//! The JetStream consumer against the real NATS server (`ONCEBOX_NATS_URL`) and real SQLite
//! files: duplicates, a consumer killed between commit and ack, processing past the ack wait,
//! poison messages, an unavailable database and the stream-sequence watermark. Each scenario
//! prints its figures D, L and F.

mod faults;
mod kill;
mod scenarios;
mod support;
