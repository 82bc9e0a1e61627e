//! Relay tests against real HTTP receivers and a real SQLite store.
