//! Log lines that senders' requests cause, at most one a second for each kind: a flood of
//! forged or malformed requests costs no database work, and must not cost a log line each
//! either (a disk or a log pipeline filled by an attacker). The metrics count every request;
//! the next line written says how many were left out.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// One kind of line: when it was last written and how many were left out since.
pub(crate) struct Throttle {
    /// The second (since the process's first throttled line) it was last written in;
    /// `u64::MAX` before the first.
    last: AtomicU64,
    left_out: AtomicU64,
}

impl Throttle {
    pub(crate) const fn new() -> Throttle {
        Throttle {
            last: AtomicU64::new(u64::MAX),
            left_out: AtomicU64::new(0),
        }
    }

    /// Whether a line may be written now, and if so how many were left out before it.
    pub(crate) fn allow(&self) -> Option<u64> {
        static START: OnceLock<Instant> = OnceLock::new();
        self.allow_at(START.get_or_init(Instant::now).elapsed().as_secs())
    }

    /// [`Throttle::allow`] in the second `now`.
    fn allow_at(&self, now: u64) -> Option<u64> {
        let last = self.last.load(Ordering::Relaxed);
        let due = last == u64::MAX || now > last;
        if due
            && self
                .last
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return Some(self.left_out.swap(0, Ordering::Relaxed));
        }
        self.left_out.fetch_add(1, Ordering::Relaxed);
        None
    }
}

/// A `tracing` event (`quietly!(info, %source, "...")`) written at most once a second from
/// this call site, with `left_out`: how many it left out since the last.
macro_rules! quietly {
    ($level:ident, $($field:tt)+) => {{
        static SAID: $crate::quiet::Throttle = $crate::quiet::Throttle::new();
        if let Some(left_out) = SAID.allow() {
            tracing::$level!(left_out, $($field)+);
        }
    }};
}
pub(crate) use quietly;

#[cfg(test)]
mod tests {
    use super::Throttle;

    #[test]
    fn one_line_a_second_saying_how_many_were_left_out() {
        let t = Throttle::new();
        assert_eq!(t.allow_at(0), Some(0));
        assert_eq!(t.allow_at(0), None);
        assert_eq!(t.allow_at(0), None);
        assert_eq!(t.allow_at(1), Some(2));
        assert_eq!(t.allow_at(1), None);
        assert_eq!(t.allow_at(5), Some(1));
        assert_eq!(t.allow_at(6), Some(0));
    }
}
