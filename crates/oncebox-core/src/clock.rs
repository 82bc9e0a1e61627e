//! Time as the core sees it: a `Clock` the backends are given, so tests can move time by hand.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Mutex, OnceLock, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The longest wait a store keeps (a deadline, a busy timeout): about 24.8 days, what SQLite's
/// busy timeout and PostgreSQL's `lock_timeout` can hold (milliseconds in a 32-bit integer).
/// A longer one, `Duration::MAX` for "no deadline" say, is taken as this: added to the time
/// now it overflowed, a panic in every call.
pub const LONGEST_WAIT: Duration = Duration::from_millis(i32::MAX as u64);

/// Milliseconds since the Unix epoch. Stored as an integer so every backend compares it exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(pub i64);

impl Timestamp {
    pub fn millis(self) -> i64 {
        self.0
    }

    /// Saturates instead of overflowing: a retention of `u64::MAX` seconds means "forever".
    pub fn plus(self, d: Duration) -> Timestamp {
        Timestamp::clamped(i128::from(self.0).saturating_add(millis(d)))
    }

    /// Saturates at `i64::MIN` like [`Timestamp::plus`] does at `i64::MAX`.
    pub fn minus(self, d: Duration) -> Timestamp {
        Timestamp::clamped(i128::from(self.0).saturating_sub(millis(d)))
    }

    fn clamped(ms: i128) -> Timestamp {
        Timestamp(i64::try_from(ms).unwrap_or(if ms < 0 { i64::MIN } else { i64::MAX }))
    }
}

/// A duration's milliseconds as an `i128`, where any `i64` plus or minus them is exact.
/// Clamping the duration to `i64` first would not be: `i64::MIN` plus more than `i64::MAX`
/// milliseconds must saturate at `i64::MAX`, not stop at -1.
fn millis(d: Duration) -> i128 {
    // At most about 2^74 for `Duration::MAX`; saturating keeps this total regardless.
    i128::try_from(d.as_millis()).unwrap_or(i128::MAX)
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

/// The source of "now" for lease expiry, timestamps and retention.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    fn now(&self) -> Timestamp;

    /// Time elapsed since an arbitrary origin, never jumping: what the wall clock's jumps are
    /// measured against. Defaults to the process's monotonic clock.
    fn monotonic(&self) -> Duration {
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        ORIGIN.get_or_init(Instant::now).elapsed()
    }

    /// The machine's boot and the time since it, if known. Without it, only purges within one
    /// process are held to real time.
    fn boot(&self) -> Option<Boot> {
        None
    }
}

/// Which boot of the machine a clock runs on, and the time since it began. Unlike
/// [`Clock::monotonic`] it runs on across process restarts, so a purge in a new process can be
/// held to the time the purges of earlier processes on the same boot measured
/// ([`crate::retention::boot_bound`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Boot {
    pub id: i64,
    /// Including any time suspended: real time passed.
    pub since: Duration,
}

/// Wall-clock time.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        Timestamp(i64::try_from(ms).unwrap_or(i64::MAX))
    }

    /// Linux's boot id, with the process's time namespace mixed in, and `CLOCK_BOOTTIME`
    /// (suspend included); `None` where they cannot be read. In a container the boot is the
    /// host's, so a restarted container finds its anchor; a time namespace of its own (which
    /// offsets `CLOCK_BOOTTIME`) is another boot.
    fn boot(&self) -> Option<Boot> {
        Some(Boot {
            id: boot_id()?,
            since: boot_time()?,
        })
    }
}

/// This process's boot id, read once: a process lives within one boot and one time namespace,
/// and a later read that failed (no file descriptor left, say) or read another namespace name
/// must not make the same boot look new, which would anchor it afresh at whatever the wall
/// clock says then. A failed first read is tried again at the next call.
fn boot_id() -> Option<i64> {
    static ID: OnceLock<i64> = OnceLock::new();
    if let Some(id) = ID.get() {
        return Some(*id);
    }
    let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let namespace = match std::fs::read_link("/proc/self/ns/time") {
        Ok(p) => p.to_string_lossy().into_owned(),
        // A kernel without time namespaces (before 5.6): every process shares the boot's.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(_) => return None,
    };
    let id = boot_hash(&text, &namespace)?;
    Some(*ID.get_or_init(|| id))
}

/// `CLOCK_BOOTTIME`: time since boot, suspend included.
fn boot_time() -> Option<Duration> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: an all-zero `timespec` is valid (some targets give it private padding, so
        // it is not built field by field); `clock_gettime` writes one to a pointer that lives
        // for the call.
        #[allow(
            unsafe_code,
            reason = "reading CLOCK_BOOTTIME, which std does not offer"
        )]
        let (rc, ts) = unsafe {
            let mut ts: libc::timespec = std::mem::zeroed();
            let rc = libc::clock_gettime(libc::CLOCK_BOOTTIME, &raw mut ts);
            (rc, ts)
        };
        if rc != 0 {
            return None;
        }
        let secs = u64::try_from(ts.tv_sec).ok()?;
        let nanos = u32::try_from(ts.tv_nsec).ok()?;
        Some(Duration::new(secs, nanos))
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// A boot id from the text of `/proc/sys/kernel/random/boot_id` and the name of the time
/// namespace: a hash of both texts.
fn boot_hash(id: &str, namespace: &str) -> Option<i64> {
    let id = id.trim();
    if id.is_empty() {
        return None;
    }
    // FNV-1a: stable across builds and platforms, unlike std's hasher.
    let hash = id
        .bytes()
        .chain([0])
        .chain(namespace.bytes())
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
    Some(i64::from_ne_bytes(hash.to_ne_bytes()))
}

/// A clock that only moves when told to; clones share one time. `advance` is time passing
/// (wall and monotonic time move together); `set` is a jump of the wall clock alone.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<(AtomicI64, AtomicI64)>);

impl ManualClock {
    pub fn new(start: Timestamp) -> ManualClock {
        ManualClock(Arc::new((AtomicI64::new(start.0), AtomicI64::new(0))))
    }

    pub fn advance(&self, d: Duration) {
        let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        // Saturating, as `Timestamp::plus`: wrapped, a long advance read as time running back.
        let add = |v: i64| Some(v.saturating_add(ms));
        let _ = self
            .0
            .0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, add);
        let _ = self
            .0
            .1
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, add);
    }

    /// Moves the wall clock backwards or forwards without time passing: clock jumps are part
    /// of what tests must survive.
    pub fn set(&self, t: Timestamp) {
        self.0.0.store(t.0, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.0.load(Ordering::SeqCst))
    }

    fn monotonic(&self) -> Duration {
        Duration::from_millis(u64::try_from(self.0.1.load(Ordering::SeqCst)).unwrap_or(0))
    }

    /// One boot for a clock and its clones, as old as the time that passed on them: restarting
    /// a store on a clone is a process restart on the same machine.
    fn boot(&self) -> Option<Boot> {
        Some(Boot {
            id: 1,
            since: self.monotonic(),
        })
    }
}

/// The instant a purge may treat as now: `now`, bounded by [`crate::PurgeAnchor`] to the wall
/// time of this clock's first purge (the stores make one at open) plus the monotonic time
/// elapsed since. One anchor per clock instance (all handles opened with it share it); the
/// first purge sets it and is not bounded.
pub fn purge_now(clock: &Arc<dyn Clock>, now: Timestamp) -> Timestamp {
    type Anchors = Mutex<Vec<(Weak<dyn Clock>, crate::PurgeAnchor)>>;
    static ANCHORS: OnceLock<Anchors> = OnceLock::new();
    let mono = clock.monotonic();
    let mut anchors = ANCHORS
        .get_or_init(Anchors::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // A dropped clock's anchor goes with it; its address may be reused by a new clock.
    anchors.retain(|(w, _)| w.strong_count() > 0);
    if let Some((_, anchor)) = anchors
        .iter()
        .find(|(w, _)| std::ptr::addr_eq(w.as_ptr(), Arc::as_ptr(clock)))
    {
        return anchor.bound(now, mono);
    }
    anchors.push((Arc::downgrade(clock), crate::PurgeAnchor::new(now, mono)));
    now
}

/// How far the wall clock was stepped between two readings of a clock, each its
/// [`Clock::now`] and [`Clock::monotonic`]: milliseconds it moved beyond (positive) or short of
/// (negative) the time that passed. Zero while it only ran.
pub fn stepped_ms(then: (Timestamp, Duration), now: (Timestamp, Duration)) -> i128 {
    let walked = i128::from(now.0.millis()) - i128::from(then.0.millis());
    let passed = i128::try_from(now.1.saturating_sub(then.1).as_millis()).unwrap_or(i128::MAX);
    walked.saturating_sub(passed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_jumps_move_the_wall_clock_only() {
        let c = ManualClock::new(Timestamp(1_000));
        c.advance(Duration::from_millis(5));
        c.set(Timestamp(1_000_000));
        c.set(Timestamp(0));
        assert_eq!(
            (c.now(), c.monotonic()),
            (Timestamp(0), Duration::from_millis(5))
        );
        // A long advance stops at the end of time; it never wraps into the past.
        c.advance(Duration::MAX);
        assert_eq!(c.now(), Timestamp(i64::MAX));
        assert_eq!(
            c.monotonic(),
            Duration::from_millis(i64::MAX.unsigned_abs())
        );
    }

    #[test]
    fn a_step_is_what_the_wall_clock_moved_beyond_the_time_passed() {
        let c = ManualClock::new(Timestamp(1_000));
        let read = |c: &ManualClock| (c.now(), c.monotonic());
        let then = read(&c);
        c.advance(Duration::from_millis(700));
        assert_eq!(stepped_ms(then, read(&c)), 0);
        c.set(Timestamp(1_000 + 700 + 61_000));
        assert_eq!(stepped_ms(then, read(&c)), 61_000);
        c.set(Timestamp(1_000 + 700 - 5_000));
        assert_eq!(stepped_ms(then, read(&c)), -5_000);
        // The extremes do not wrap: the step is what it is, in 128 bits.
        c.set(Timestamp(i64::MIN));
        assert_eq!(stepped_ms(then, read(&c)), i128::from(i64::MIN) - 1_700);
    }

    #[test]
    fn boots_hash_the_boot_id_and_the_time_namespace() {
        let id = "6b3e3c36-1f0a-4c1e-9a7d-2f1e0c9b8a77\n";
        let a = boot_hash(id, "time:[4026531834]").unwrap();
        assert_eq!(a, boot_hash(id, "time:[4026531834]").unwrap());
        assert_ne!(a, boot_hash(id, "time:[4026532999]").unwrap());
        assert_ne!(a, boot_hash("0", "time:[4026531834]").unwrap());
        assert_eq!(boot_hash(" \n", ""), None);
        if cfg!(target_os = "linux") {
            let (a, b) = (SystemClock.boot().unwrap(), SystemClock.boot().unwrap());
            assert_eq!(a.id, b.id);
            assert!(b.since >= a.since && a.since > Duration::ZERO);
        }
    }

    #[test]
    fn purge_now_follows_monotonic_time_per_clock() {
        let manual = ManualClock::new(Timestamp(1_000));
        let clock: Arc<dyn Clock> = Arc::new(manual.clone());
        assert_eq!(purge_now(&clock, manual.now()), Timestamp(1_000));
        manual.set(Timestamp(1_000_000));
        manual.advance(Duration::from_millis(7));
        assert_eq!(purge_now(&clock, manual.now()), Timestamp(1_007));
        manual.set(Timestamp(500));
        assert_eq!(purge_now(&clock, manual.now()), Timestamp(500));
        manual.set(Timestamp(1_007));
        assert_eq!(purge_now(&clock, manual.now()), Timestamp(1_007), "no lag");
        let other: Arc<dyn Clock> = Arc::new(ManualClock::new(Timestamp(9)));
        assert_eq!(purge_now(&other, Timestamp(9)), Timestamp(9), "own anchor");
    }

    #[test]
    fn arithmetic_saturates_past_either_end_from_anywhere() {
        let forever = Duration::from_millis(u64::MAX);
        assert_eq!(Timestamp(i64::MIN).plus(forever), Timestamp(i64::MAX));
        assert_eq!(Timestamp(-5).plus(forever), Timestamp(i64::MAX));
        assert_eq!(Timestamp(i64::MAX).minus(forever), Timestamp(i64::MIN));
        assert_eq!(Timestamp(5).minus(forever), Timestamp(i64::MIN));
        assert_eq!(Timestamp(0).plus(Duration::MAX), Timestamp(i64::MAX));
        assert_eq!(Timestamp(0).minus(Duration::MAX), Timestamp(i64::MIN));
        // Exact wherever the result fits: u64::MAX ms reaches from i64::MIN to i64::MAX.
        assert_eq!(
            Timestamp(i64::MIN).plus(forever).minus(forever),
            Timestamp(i64::MIN)
        );
        assert_eq!(
            Timestamp(1).plus(Duration::from_micros(2_999)),
            Timestamp(3)
        );
    }
}
