//! A history of operations against the system under test: each is invoked, then ends `ok`,
//! `fail` (a definite refusal: nothing was written) or `info` (indeterminate: a 503, a timeout,
//! a reset — the effect may or may not have happened). The checker reads it with the final
//! state to compute the figures of TESTING.md.
//!
//! Order comes from one monotonic counter shared by every thread, not from clocks: an operation
//! that completed before another was invoked has a smaller completion stamp than that
//! invocation stamp. Each stamp also carries the wall clock in ms, only to compare with commit
//! stamps a database wrote on the same machine.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// `(source, event_id)`, as two strings (never concatenated: `a:b`/`c` is not `a`/`b:c`).
pub type Key = (String, String);

/// The key `(source, event_id)`.
pub fn key(source: &str, event_id: &str) -> Key {
    (source.to_owned(), event_id.to_owned())
}

/// How an operation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Acknowledged: a 2xx, a broker ack, a library `Ok`. `replayed`: the answer said the key
    /// was already processed (`Idempotent-Replayed`, `Duplicate`).
    Ok { replayed: bool },
    /// A definite refusal that writes nothing by contract.
    Fail(Refusal),
    /// Indeterminate: whatever happened is unknown to the sender (503, 409, timeout, reset,
    /// no answer). Never an acknowledgement.
    Info(String),
}

/// A definite refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The same key with another payload (422 `key-reused`, `Conflict`).
    Conflict,
    /// Signature or timestamp check failed (401).
    Unauthorized,
    /// Bad input or unknown source (400, 404, 413, 415): the status.
    Invalid(u16),
    /// The connection was refused: nothing was sent (the server was down).
    Unreached,
}

impl Outcome {
    /// The outcome an HTTP answer means to a webhook sender.
    pub fn http(status: u16, replayed: bool) -> Outcome {
        match status {
            200..=299 => Outcome::Ok { replayed },
            422 => Outcome::Fail(Refusal::Conflict),
            401 => Outcome::Fail(Refusal::Unauthorized),
            400 | 404 | 405 | 413 | 415 => Outcome::Fail(Refusal::Invalid(status)),
            // 409 in-progress, 503 unavailable, a 500 or anything else: nothing is known.
            other => Outcome::Info(format!("HTTP {other}")),
        }
    }

    /// Could the effect have committed by the time this answer was given?
    pub fn may_have_committed(&self) -> bool {
        matches!(self, Outcome::Ok { .. } | Outcome::Info(_))
    }
}

/// One moment of the history: the shared counter's value and the wall clock in ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Stamp {
    pub at: u64,
    pub wall_ms: i64,
}

/// One operation: a delivery of `payload` (a tag the test chose, such as `v1`) for `key`,
/// signed with `credentials` (the source whose secret signed it; `None` when the source needs
/// no signature).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    pub id: usize,
    pub key: Key,
    pub payload: String,
    pub credentials: Option<String>,
    pub invoked: Stamp,
    /// `None` while pending (and for ever, if the process that ran it died first).
    pub completed: Option<(Stamp, Outcome)>,
}

impl Op {
    pub fn outcome(&self) -> Option<&Outcome> {
        self.completed.as_ref().map(|(_, o)| o)
    }
}

/// The recorder; share it by reference or `Arc` between threads and tasks.
#[derive(Debug, Default)]
pub struct History {
    clock: AtomicU64,
    ops: Mutex<Vec<Op>>,
}

/// An operation invoked and not yet completed; complete it exactly once.
#[derive(Debug)]
#[must_use = "an invoked operation must end ok, fail or info"]
pub struct Pending<'h> {
    history: &'h History,
    id: usize,
}

impl History {
    pub fn new() -> History {
        History::default()
    }

    fn stamp(&self) -> Stamp {
        // SeqCst: a stamp taken after another thread's stamp (in real time) is larger.
        let at = self.clock.fetch_add(1, Ordering::SeqCst);
        let wall_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        Stamp { at, wall_ms }
    }

    /// Records the invocation of a delivery of `payload` for `key`, signed with the secret of
    /// `credentials` (or unsigned).
    pub fn invoke(&self, key: Key, payload: &str, credentials: Option<&str>) -> Pending<'_> {
        let mut ops = self.ops.lock().unwrap();
        let id = ops.len();
        // Stamped under the lock, so ids follow invocation order.
        let invoked = self.stamp();
        ops.push(Op {
            id,
            key,
            payload: payload.to_owned(),
            credentials: credentials.map(str::to_owned),
            invoked,
            completed: None,
        });
        Pending { history: self, id }
    }

    /// Every operation so far, in invocation order.
    pub fn ops(&self) -> Vec<Op> {
        self.ops.lock().unwrap().clone()
    }

    /// How many operations ended with an outcome matching `f`.
    pub fn count(&self, f: impl Fn(&Outcome) -> bool) -> usize {
        self.ops
            .lock()
            .unwrap()
            .iter()
            .filter(|o| o.outcome().is_some_and(&f))
            .count()
    }
}

impl Pending<'_> {
    pub fn id(&self) -> usize {
        self.id
    }

    /// Ends the operation with `outcome`, stamped now.
    pub fn end(self, outcome: Outcome) {
        let stamp = self.history.stamp();
        let mut ops = self.history.ops.lock().unwrap();
        ops[self.id].completed = Some((stamp, outcome));
    }

    pub fn ok(self, replayed: bool) {
        self.end(Outcome::Ok { replayed });
    }

    pub fn fail(self, refusal: Refusal) {
        self.end(Outcome::Fail(refusal));
    }

    pub fn info(self, why: impl Into<String>) {
        self.end(Outcome::Info(why.into()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_order_operations_across_threads() {
        let h = History::new();
        std::thread::scope(|s| {
            for t in 0..4 {
                let h = &h;
                s.spawn(move || {
                    for i in 0..50 {
                        h.invoke(key("s", &format!("{t}-{i}")), "v1", None)
                            .ok(false);
                    }
                });
            }
        });
        let ops = h.ops();
        assert_eq!(ops.len(), 200);
        let mut stamps: Vec<u64> = ops
            .iter()
            .flat_map(|o| [o.invoked.at, o.completed.as_ref().unwrap().0.at])
            .collect();
        assert!(
            ops.iter()
                .all(|o| o.invoked < o.completed.as_ref().unwrap().0)
        );
        stamps.sort_unstable();
        stamps.dedup();
        assert_eq!(stamps.len(), 400, "every stamp is distinct");
    }

    #[test]
    fn http_answers_map_to_outcomes() {
        assert_eq!(Outcome::http(202, false), Outcome::Ok { replayed: false });
        assert_eq!(Outcome::http(422, false), Outcome::Fail(Refusal::Conflict));
        assert!(matches!(Outcome::http(503, false), Outcome::Info(_)));
        assert!(matches!(Outcome::http(409, false), Outcome::Info(_)));
        assert!(!Outcome::http(401, false).may_have_committed());
    }
}
