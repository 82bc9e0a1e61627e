//! Integration tests of the Redis tier against a real Redis: the shared one of
//! `ONCEBOX_REDIS_URL` (each test in a namespace of its own) and private `redis-server`
//! processes the restart and outage tests kill.

mod cache;
mod clock;
mod conformance;
mod deadline;
mod eviction;
mod failover;
mod fence;
mod guard;
mod harness;
mod lease;
mod lost;
mod race;
mod restart;
mod tls;
