//! The RabbitMQ consumer against the real broker (`ONCEBOX_AMQP_URL`) and real SQLite files:
//! duplicates, a consumer killed between commit and ack, processing past the broker's patience,
//! poison messages and an unavailable database. Each scenario prints its figures D, L and F.

mod faults;
mod kill;
mod scenarios;
mod support;
