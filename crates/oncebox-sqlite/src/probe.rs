//! Whether the gateway's ingest looks for a committed duplicate on a reader before queueing for
//! the writer: only while such looks pay.
//!
//! Why: a hit answers a retry without the writer. A miss is pure cost — and a large one under
//! writes, because every commit makes a reader drop its page cache, so the look reads the index
//! path from the file again, and the writer then looks the key up anyway (on its warm cache).
//! Measured with the gateway benchmark on two cores, with new events only the reader's look
//! was over half of the request threads' CPU. So the gate keeps a score of recent looks: a hit
//! raises it by one, a miss lowers it by two (a look pays at a hit rate above about two
//! thirds). While the score is below zero only one request in `SAMPLE` looks, enough to notice
//! when retries come back. Either way the answer is the same: the writer answers duplicates
//! from the same record.

use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};

/// Bounds of the score: how much history the gate weighs.
const MAX: i32 = 16;
/// While looks do not pay, one request in this many still looks.
const SAMPLE: u32 = 32;

#[derive(Debug, Default)]
pub(crate) struct ProbeGate {
    score: AtomicI32,
    skipped: AtomicU32,
}

impl ProbeGate {
    /// Whether this request should look on a reader first.
    pub fn look(&self) -> bool {
        if self.score.load(Ordering::Relaxed) >= 0 {
            return true;
        }
        self.skipped.fetch_add(1, Ordering::Relaxed) % SAMPLE == SAMPLE - 1
    }

    /// Records what a look found.
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

    fn looks(gate: &ProbeGate, n: usize) -> usize {
        (0..n).filter(|_| gate.look()).count()
    }

    #[test]
    fn new_keys_stop_the_looks_and_retries_bring_them_back() {
        let gate = ProbeGate::default();
        assert_eq!(looks(&gate, 10), 10, "a fresh gate looks");
        // Misses: after the score goes negative only the sample looks.
        for _ in 0..MAX {
            gate.found(false);
        }
        assert_eq!(looks(&gate, 320), 10);
        // Hits from the sample raise the score back; then every request looks again.
        for _ in 0..(MAX as usize + 1) {
            gate.found(true);
        }
        assert_eq!(looks(&gate, 10), 10);
    }

    #[test]
    fn a_low_hit_rate_keeps_the_score_down() {
        let gate = ProbeGate::default();
        // Half hits: every pair lowers the score by one.
        for _ in 0..100 {
            gate.found(true);
            gate.found(false);
        }
        assert!(!(0..SAMPLE - 1).any(|_| gate.look()));
    }
}
