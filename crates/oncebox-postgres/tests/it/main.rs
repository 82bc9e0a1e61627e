//! Integration tests of the PostgreSQL backend on a real server (`ONCEBOX_POSTGRES_URL`): the
//! conformance suite and the model-based test, batched ingest, faults.

mod harness;

oncebox_testkit::conformance!(harness::Postgres);
