//! SQLite-specific tests.
