//! Integration tests of the PostgreSQL backend on a real server (`ONCEBOX_POSTGRES_URL`): the
//! conformance suite and the model-based test, batched ingest, faults.

mod faults;
mod harness;
mod ingest;

oncebox_testkit::conformance!(harness::Postgres);
