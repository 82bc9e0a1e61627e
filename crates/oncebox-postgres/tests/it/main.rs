//! Integration tests of the PostgreSQL backend on a real server (`ONCEBOX_POSTGRES_URL`): the
//! conformance suite and the model-based test, batched ingest, faults.

mod claims;
mod commit_order;
mod consume;
mod database;
mod deliveries;
mod durable;
mod effects_race;
mod ended;
mod examples;
mod faults;
mod harness;
mod hold;
mod ingest;
mod lock_wait;
mod lost_reply;
mod migrations;
mod nats;
mod pool;
mod proxy;
mod purge;
mod reentrant;
mod relay;
mod savepoint;
mod search_path;
mod sessions;
mod setup;
mod silent;
mod skewed;
mod stale_claim;
mod too_large;
mod wake;
mod wrapped;

oncebox_testkit::conformance!(harness::Postgres);
