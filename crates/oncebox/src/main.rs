//! The oncebox binary.
fn main() {}
