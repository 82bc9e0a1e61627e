//! How a SQLite store is opened: file, durability, timeouts, queue bounds, thread placement and
//! the clock.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use oncebox_core::{Clock, SystemClock};

use crate::placement::Placement;

/// The most [`Options::recent_answers`] keeps: about 250 bytes each, so 2.5 GB.
pub const MAX_RECENT_ANSWERS: usize = 10_000_000;

/// The longest [`Options::linger`]: callers come back within micro- to milliseconds, and the
/// wait holds the callers a batch already has.
pub const MAX_LINGER: Duration = Duration::from_millis(100);

/// What a commit survives. Only `Full` keeps G6; the others are the user's explicit choice and
/// are logged as a warning when the store opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Durability {
    /// WAL + `synchronous=FULL`: a commit survives power loss.
    #[default]
    Full,
    /// WAL + `synchronous=NORMAL`: survives a process crash; the last commits may be lost on
    /// power loss.
    Normal,
}

/// Options of [`crate::Inbox::open`].
#[derive(Debug, Clone)]
pub struct Options {
    /// The database file; created with its directory's permissions if it does not exist.
    pub path: PathBuf,
    /// How commits reach the disk: [`Durability::Full`] unless set.
    pub durability: Durability,
    /// How long a write waits for another process holding SQLite's write lock before the whole
    /// batch answers `Unavailable::Busy`. At most [`oncebox_core::LONGEST_WAIT`].
    pub busy_timeout: Duration,
    /// A request the writer has not started within this time gets `Unavailable::Deadline`, and
    /// never runs. One it started is answered as its batch ends: `process` with
    /// `Unavailable::CommitUnknown` when the deadline passed while its handler ran (it may
    /// still commit; the retry is answered `Duplicate` if it did); oncebox's own requests
    /// (`begin`, `complete`, `release`, `resolve`, purges, the relay's and operators' verbs)
    /// with what they did, however long the batch took; `write` with `Deadline` at the
    /// deadline, its fate unknown. At most [`oncebox_core::LONGEST_WAIT`] (a longer one,
    /// `Duration::MAX` say, is taken as that).
    pub deadline: Duration,
    /// Requests waiting for the writer. A full queue makes callers wait, up to their deadline.
    pub queue_capacity: usize,
    /// Most requests one transaction commits together.
    pub max_batch: usize,
    /// Longest the writer waits for callers it just answered to send again before it commits a
    /// smaller batch; it only waits when recent batches show that many callers (zero: never).
    /// At most [`MAX_LINGER`] (a longer one is taken as that).
    pub linger: Duration,
    /// Keys whose first answer the gateway's ingest keeps in memory after their commit, so a
    /// prompt retry is answered without a read (`recent.rs`); about 250 bytes each. Zero:
    /// none. At most [`MAX_RECENT_ANSWERS`] (more is taken as that).
    pub recent_answers: usize,
    /// Frames (pages) in the WAL from which the checkpointer works to start the log over
    /// (`checkpoint.rs`); 32 768 are 128 MiB at SQLite's default page size. The log grows
    /// that long only under writes that never pause: a pass that copies everything while the
    /// writer rests lets its next transaction start the log over at any length. Longer means
    /// fewer syncs of the database file, which rewrite hot pages each time. Zero counts as
    /// one.
    pub wal_restart_frames: u32,
    /// Which CPU the writer and checkpoint threads are kept on (`placement.rs`).
    pub placement: Placement,
    /// What records are dated by and leases measured with; a manual clock in tests.
    pub clock: Arc<dyn Clock>,
    /// Whether `open` brings an older schema up to date (the default). Off, an older schema is
    /// refused (`OpenError::SchemaOutdated`) and nothing is written to it: for tools that only
    /// look at or operate on a store that its own gateway keeps.
    pub migrate: bool,
    /// The longest string, BLOB or row the writer connection stores, in bytes: SQLite's
    /// `SQLITE_LIMIT_LENGTH` on it, which can only be lowered from the 1 000 000 000 SQLite is
    /// built with (`None`: that). An event whose record would be longer is refused before it
    /// reaches the writer (`Invalid::TooLarge`). Lowered, it also bounds what handlers write
    /// and read on the writer's connection, so set it above anything the file already holds.
    pub length_limit: Option<usize>,
}

impl Options {
    /// The defaults for the database file at `path`: durable commits, a 10 s deadline, a 5 s
    /// wait for another process's write lock, migrations on.
    pub fn new(path: impl Into<PathBuf>) -> Options {
        Options {
            path: path.into(),
            durability: Durability::Full,
            busy_timeout: Duration::from_secs(5),
            deadline: Duration::from_secs(10),
            queue_capacity: 8192,
            max_batch: 1024,
            linger: Duration::from_micros(500),
            recent_answers: 65_536,
            wal_restart_frames: 32_768,
            placement: Placement::default(),
            clock: Arc::new(SystemClock),
            migrate: true,
            length_limit: None,
        }
    }

    /// Sets [`Options::recent_answers`].
    pub fn recent_answers(mut self, keys: usize) -> Options {
        self.recent_answers = keys;
        self
    }

    /// Sets [`Options::wal_restart_frames`].
    pub fn wal_restart_frames(mut self, frames: u32) -> Options {
        self.wal_restart_frames = frames;
        self
    }

    /// Sets [`Options::placement`].
    pub fn placement(mut self, placement: Placement) -> Options {
        self.placement = placement;
        self
    }

    /// Sets [`Options::clock`].
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Options {
        self.clock = clock;
        self
    }

    /// Sets [`Options::durability`].
    pub fn durability(mut self, durability: Durability) -> Options {
        self.durability = durability;
        self
    }

    /// Sets [`Options::busy_timeout`].
    pub fn busy_timeout(mut self, t: Duration) -> Options {
        self.busy_timeout = t;
        self
    }

    /// Sets [`Options::deadline`].
    pub fn deadline(mut self, t: Duration) -> Options {
        self.deadline = t;
        self
    }

    /// Sets [`Options::linger`].
    pub fn linger(mut self, t: Duration) -> Options {
        self.linger = t;
        self
    }

    /// Sets [`Options::max_batch`].
    pub fn max_batch(mut self, n: usize) -> Options {
        self.max_batch = n.max(1);
        self
    }

    /// Sets [`Options::migrate`].
    pub fn migrate(mut self, migrate: bool) -> Options {
        self.migrate = migrate;
        self
    }

    /// Sets [`Options::length_limit`].
    pub fn length_limit(mut self, bytes: usize) -> Options {
        self.length_limit = Some(bytes);
        self
    }
}
