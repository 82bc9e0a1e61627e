//! Whether the gateway's ingest looks for a committed duplicate on a reader before queueing for
//! the writer: only while such looks pay.
//!
//! Why: a hit answers a retry without the writer. A miss is pure cost — and a large one under
//! writes: every commit makes a reader start its next transaction by unmapping the database
//! file and dropping its page cache, so the look pays an `munmap` (with its TLB shootdown on
//! every core), page faults and the index path again, and the writer then looks the key up
//! anyway (on its warm cache). Measured with the gateway benchmark on two cores, a look under
//! new events cost about 65 µs. So the gate keeps a score of recent outcomes: a duplicate
//! raises it by one, a new key lowers it by two (a look pays at a hit rate above about two
//! thirds). While the score is below zero nobody looks, and the writer's answers keep the
//! score: each request that skipped its look tells the gate whether the writer found a
//! duplicate, so retries coming back reopen it without a single look spent on new keys.
//! Either way the answer is the same: the writer answers duplicates from the same record.

use std::sync::atomic::{AtomicI32, Ordering};

/// Bounds of the score: how much history the gate weighs.
const MAX: i32 = 16;

#[derive(Debug, Default)]
pub(crate) struct ProbeGate {
    score: AtomicI32,
}

impl ProbeGate {
    /// Whether this request should look on a reader first.
    pub fn look(&self) -> bool {
        self.score.load(Ordering::Relaxed) >= 0
    }

    /// Records whether a request was a duplicate: found by its look, or by the writer when it
    /// did not look.
    pub fn found(&self, hit: bool) {
        let step = if hit { 1 } else { -2 };
        // Relaxed and racy on purpose: a lost update only shifts a heuristic.
        let score = self.score.load(Ordering::Relaxed);
        self.score
            .store((score + step).clamp(-MAX, MAX), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_keys_stop_the_looks_and_retries_bring_them_back() {
        let gate = ProbeGate::default();
        assert!(gate.look(), "a fresh gate looks");
        gate.found(false);
        assert!(!gate.look(), "one new key closes it");
        for _ in 0..MAX {
            gate.found(false);
        }
        assert!(!gate.look());
        // Duplicates the writer found while nobody looked raise the score back, past the
        // bound's worth of new keys.
        for _ in 0..MAX {
            gate.found(true);
        }
        assert!(gate.look());
    }

    #[test]
    fn a_low_hit_rate_keeps_the_gate_closed() {
        let gate = ProbeGate::default();
        // Half duplicates: every pair lowers the score by one.
        for _ in 0..100 {
            gate.found(true);
            gate.found(false);
            assert!(!gate.look());
        }
    }
}
