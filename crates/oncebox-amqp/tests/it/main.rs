//! The RabbitMQ consumer against the real broker (`ONCEBOX_AMQP_URL`) and real SQLite files:
//! duplicates, a consumer killed between commit and ack, processing past the broker's patience,
//! poison messages, an unavailable database (also on a quorum queue with a delivery limit),
//! failing and panicking handlers, a quarantine that fails or is misconfigured (a conflict
//! then not offered to the store again), and a broker
//! that stops answering. Each scenario prints what it measured.

mod alarm;
mod blocked;
mod conflict;
mod faults;
mod handler;
mod kill;
mod publishing;
mod quarantine;
mod scenarios;
mod support;
