//! Integration tests of the SQLite backend: the conformance suite, the crash test and the
//! examples' scenarios, all on real SQLite files.

mod crash;
mod damaged;
mod deadline;
mod deferred_fk;
mod deliveries;
mod drop_panics;
mod dropped;
mod examples;
mod first_fails;
mod harness;
mod lease_time;
mod left_open;
mod locks;
mod moved;
mod opens;
mod placement;
mod powerloss;
mod readonly;
mod recent;
mod reentrant;
mod refused;
mod rolled_back;
mod savepoint;
mod schema;
mod slow_handlers;
mod sqlite;
mod stamps;
mod too_large;
mod wal;
mod watermark;
mod wrapped;

oncebox_testkit::conformance!(harness::Sqlite);
