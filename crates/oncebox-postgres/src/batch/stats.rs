//! The batch workers' counters, for operators and tests.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of the batch workers' work since open.
#[derive(Debug, Default)]
pub struct BatchStats {
    pub(super) commits: AtomicU64,
    pub(super) requests: AtomicU64,
    pub(super) held: AtomicU64,
    pub(super) in_flight: AtomicU64,
    pub(super) fallbacks: AtomicU64,
}

impl BatchStats {
    /// Batch transactions committed.
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// Requests answered by committed batches.
    pub fn committed_requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Batches that gave up on a held key and sent each of their requests the per-event way.
    pub fn fallbacks(&self) -> u64 {
        self.fallbacks.load(Ordering::Relaxed)
    }

    /// Requests the workers have taken from the queue and not yet answered: in a batch's
    /// transaction, or waiting for the next round because their key is already in one.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// Batch transactions in flight now (begun, not yet committed or failed).
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }
}
