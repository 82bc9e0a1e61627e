//! Ingest benchmark.
fn main() {}
