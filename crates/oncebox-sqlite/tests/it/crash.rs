//! Crash test (placeholder).
