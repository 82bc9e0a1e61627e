//! Integration tests of the SQLite backend: the conformance suite, the crash test and the
//! examples' scenarios, all on real SQLite files.

mod crash;
mod damaged;
mod deadline;
mod deliveries;
mod examples;
mod harness;
mod placement;
mod powerloss;
mod recent;
mod rolled_back;
mod sqlite;
mod wal;
mod watermark;

oncebox_testkit::conformance!(harness::Sqlite);
