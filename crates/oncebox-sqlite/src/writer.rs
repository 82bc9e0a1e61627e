//! The single writer thread: it owns the write connection and group-commits whatever requests
//! are queued — one `BEGIN IMMEDIATE`, a savepoint per request, one `COMMIT` (one fsync) — and
//! only then answers every caller.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use oncebox_core::{Clock, Timestamp, Unavailable};
use rusqlite::Connection;

use crate::crash;
use crate::error::storage;
use crate::stmts::{Sql, Statements, Stmt};

mod commits;
mod gather;
mod job;
mod open;
mod walhook;
pub(crate) use commits::Commits;
use gather::gather;
pub(crate) use job::{Body, Job, RAN_TWICE, again, once};
use open::Open;
pub(crate) use walhook::{Installed as WalHook, install as install_wal_hook};

/// How long the requests a batch adds to its first may run before it takes no more and
/// commits. Far above what a batch of ingests or quick handlers takes (a few ms for hundreds),
/// so it caps only batches of slow handlers: ten of 500 ms each, committed together, would all
/// be answered after 5 s, past a deadline the first of them had been well inside. The first
/// request is not counted: it is taken whatever it costs, and its batch-mates wait for it
/// either way.
const BATCH_WORK: Duration = Duration::from_millis(250);

/// What a request sees of the open transaction.
pub(crate) struct Cx<'c, 's> {
    pub conn: &'c Connection,
    /// The writer's hot statements on `conn`.
    stmts: &'c Statements<'s>,
    /// The time the request running now began (`Open::run` reads it afresh for each).
    pub now: Timestamp,
    /// What a record finished in this batch is dated (`completed_at`, which retention reads):
    /// the batch's time at its `BEGIN`, but never earlier than this boot's purge anchor says real time is
    /// ([`oncebox_core::stamp_floor`]), so a wall clock behind makes no record look old.
    pub stamp: Timestamp,
    commits: &'c Commits,
    /// Set by a request that found its own statement ended the transaction, and answers for it
    /// (`writer/open.rs`).
    own: bool,
}

impl<'s> Cx<'_, 's> {
    pub fn savepoint(&self) -> Result<(), Fatal> {
        self.exec(Sql::Savepoint)
    }

    pub fn release(&self) -> Result<(), Fatal> {
        self.exec(Sql::Release)
    }

    /// Undoes everything since `savepoint` and keeps the savepoint open.
    pub fn rollback_to(&self) -> Result<(), Fatal> {
        self.exec(Sql::RollbackTo)
    }

    /// Whether the transaction is gone: SQLite rolled it back by itself, as some statement
    /// errors make it do (a constraint declared `ON CONFLICT ROLLBACK`, `RAISE(ROLLBACK)`, a
    /// full disk, IO), or a statement someone ran ended it. Checked after each request, and
    /// inside one right after user code returns: a handler that went on past such an error
    /// would otherwise see the record written next in autocommit, without its effect.
    pub fn ended(&self) -> bool {
        self.commits.ended(self.conn)
    }

    /// Whether it ended by a `COMMIT` someone ran (turned into a rollback: `commits.rs`).
    pub fn stray_commit(&self) -> bool {
        self.commits.stray_commit()
    }

    /// The request running now ended the transaction by its own statement and answers for it
    /// (its error is its answer): the batch begins a new one and goes on without it.
    pub fn own_rollback(&mut self) {
        self.own = true;
    }

    /// Whether the transaction holds foreign-key violations SQLite checks only at `COMMIT` (a
    /// `DEFERRABLE INITIALLY DEFERRED` key, `PRAGMA defer_foreign_keys`). Left in, they fail
    /// the batch's `COMMIT`, every batch-mate with it, at each retry of the request that made
    /// them; checked after each request's own work, whose savepoint then undoes them.
    pub fn deferred_violations(&self) -> bool {
        deferred_violations(self.conn)
    }

    /// One of the writer's hot statements, prepared once for this connection.
    pub fn stmt(&self, sql: Sql) -> rusqlite::Result<Stmt<'_, 's>> {
        self.stmts.get(sql)
    }

    fn exec(&self, sql: Sql) -> Result<(), Fatal> {
        self.stmt(sql)
            .and_then(|mut s| s.execute([]))
            .map(drop)
            .map_err(|e| Fatal(storage(&e)))
    }

    /// Hands out the next fencing token; it commits or rolls back with the batch. Counted up
    /// from the stored value inside the batch's write transaction, never from a copy in
    /// memory: another process writing the same file (a second `oncebox serve`, a relay) hands
    /// out tokens from the same counter, and a stale copy would give one a token the other
    /// already holds, or wind the counter back.
    pub fn next_fence(&mut self) -> Result<i64, Fatal> {
        self.conn
            .prepare_cached(
                "UPDATE oncebox_meta SET value = value + 1 WHERE name = 'fence' RETURNING value",
            )
            .and_then(|mut s| s.query_row([], |r| r.get(0)))
            .map_err(|e| Fatal(storage(&e)))
    }
}

/// The batch's transaction cannot commit: every request in it is answered `Unavailable`.
#[derive(Debug)]
pub(crate) struct Fatal(pub Unavailable);

impl From<rusqlite::Error> for Fatal {
    fn from(e: rusqlite::Error) -> Fatal {
        Fatal(storage(&e))
    }
}

/// The writer thread's state.
pub(crate) struct Writer {
    pub conn: Connection,
    /// The WAL hook's state on `conn`: declared after it, so it outlives the connection; put
    /// back before each commit.
    pub wal_hook: WalHook,
    pub clock: Arc<dyn Clock>,
    pub max_batch: usize,
    pub linger: Duration,
    /// Told of each commit, so WAL checkpoints run off the writer's critical path.
    pub checkpoint: crate::checkpoint::Due,
    pub stats: Arc<Stats>,
    /// The only way to commit on `conn`.
    pub commits: Commits,
    /// This boot's purge anchor, kept up by purges.
    pub stamps: oncebox_core::Stamps,
    /// The database file as opened: a batch is not committed into one deleted or replaced.
    pub file: crate::moved::Opened,
}

/// Counters of the writer's work, of duplicates answered without it and of reads served on
/// reader connections, for metrics and for tests that must see batching (or its absence), or
/// a request that never reached the database, happen.
#[derive(Debug, Default)]
pub struct Stats {
    pub(crate) commits: AtomicU64,
    pub(crate) committed_requests: AtomicU64,
    pub(crate) failed_batches: AtomicU64,
    pub(crate) commit_nanos: AtomicU64,
    pub(crate) from_memory: AtomicU64,
    pub(crate) log_restarts: AtomicU64,
    pub(crate) reads: AtomicU64,
    pub(crate) restarts: AtomicU64,
}

impl Stats {
    /// Transactions committed.
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// Requests answered from a committed transaction.
    pub fn committed_requests(&self) -> u64 {
        self.committed_requests.load(Ordering::Relaxed)
    }

    /// Time spent in `COMMIT` (writing the WAL and syncing it), in total.
    pub fn commit_time(&self) -> Duration {
        Duration::from_nanos(self.commit_nanos.load(Ordering::Relaxed))
    }

    /// Duplicates answered from the memory of recent first answers, without a read.
    pub fn answered_from_memory(&self) -> u64 {
        self.from_memory.load(Ordering::Relaxed)
    }

    /// Times the WAL started over, as the writer's commits saw it (`writer/walhook.rs`): after
    /// the checkpointer caught up and the writer copied the rest (`checkpoint.rs`), or after
    /// the writer's fallback copy.
    pub fn log_restarts(&self) -> u64 {
        self.log_restarts.load(Ordering::Relaxed)
    }

    /// Batches rolled back and answered `Unavailable`.
    pub fn failed_batches(&self) -> u64 {
        self.failed_batches.load(Ordering::Relaxed)
    }

    /// Transactions begun again inside a batch: a request's own statement made SQLite roll
    /// the batch's transaction back; that request was answered with its error and the ones
    /// before it ran again.
    pub fn restarted_transactions(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    /// Reads the database served on reader connections: looks for a committed key (a
    /// duplicate before the writer, or when the writer could not answer), records, events,
    /// listings, counts. Not the writer's own reads inside its transactions, nor answers from
    /// the memory of recent ones ([`Stats::answered_from_memory`]).
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }
}

impl Writer {
    /// Runs until every sender is dropped, then finishes what is queued and returns.
    pub fn run(self, rx: &flume::Receiver<Job>) {
        // Lives as long as the loop and ends before the connection does.
        let stmts = Statements::new(&self.conn);
        // Callers seen in the last batch plus those that queued while it committed: the number
        // of requests likely to be back for the next batch.
        let mut expected = 1;
        while let Ok(first) = rx.recv() {
            expected = self.batch(&stmts, first, rx, expected);
            // After answering, while the callers prepare their next requests. The next
            // transaction starts the log over if nothing holds it back; the WAL hook counts it
            // when it does.
            self.checkpoint.finish(&self.conn);
        }
        self.checkpoint.stop_if_failed(&self.conn);
    }

    /// Opens a transaction, runs `first`, whatever queued up while the last fsync ran and
    /// whatever arrives while it lingers, each as soon as it is taken from the queue, then
    /// commits and answers them all. Returns how many callers to expect next time.
    ///
    /// Running each request as it arrives, rather than once the batch is gathered, lets the
    /// writer's own work overlap the wait for the callers still coming back: the commit
    /// follows the last arrival directly.
    fn batch(
        &self,
        stmts: &Statements<'_>,
        first: Job,
        rx: &flume::Receiver<Job>,
        expected: usize,
    ) -> usize {
        if let Err(e) = self.commits.begin(&self.conn) {
            let why = storage(&e);
            self.stats.failed_batches.fetch_add(1, Ordering::Relaxed);
            // What queued while BEGIN waited out the busy timeout shares its failure. It is
            // taken before anyone is answered: a caller answered here may send again at once,
            // and that request must get a try of its own, not this stale failure (the lock
            // may be gone by then).
            let waited: Vec<Job> = rx
                .try_iter()
                .take(self.max_batch.saturating_sub(1))
                .collect();
            first.refuse(why.clone());
            waited.into_iter().for_each(|job| job.refuse(why.clone()));
            return 1;
        }
        crash::point!("after-begin");
        let now = self.clock.now();
        let cx = Cx {
            conn: &self.conn,
            stmts,
            now,
            stamp: self.stamps.completed(self.clock.as_ref(), now),
            commits: &self.commits,
            own: false,
        };
        let mut open = Open::new(cx, (&*self.stats, self.clock.as_ref()), expected);
        let mut taken = 1;
        // A batch stops taking requests once those after its first have run for
        // `BATCH_WORK`: slow handlers queued together would otherwise all wait for one commit
        // after the last of them, past their callers' deadlines, and none of them would be
        // answered as applied.
        let mut after_first: Option<Instant> = None;
        let mut take = |job: Job| {
            let ran = open.run(job);
            ran && after_first.get_or_insert_with(Instant::now).elapsed() < BATCH_WORK
        };
        if take(first) {
            gather(
                rx,
                &mut taken,
                expected.min(self.max_batch),
                self.linger,
                self.max_batch,
                &mut take,
            );
        }
        let Open { held, failed, .. } = open;
        if let Some(why) = failed {
            self.abort(held, &why);
            return 1;
        }
        crash::point!("before-commit");
        // One `stat` a commit. Committed into a file no path names, the batch would be
        // answered as stored and lost with it (`moved.rs`).
        if let Some(why) = self.file.moved() {
            self.abort(held, &Unavailable::Storage(why));
            return 1;
        }
        let committing = Instant::now();
        // A handler may have replaced the WAL hook this commit calls (`writer/walhook.rs`).
        self.wal_hook.reinstall(&self.conn);
        let committed = self.commits.commit(&self.conn);
        let spent = u64::try_from(committing.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.stats.commit_nanos.fetch_add(spent, Ordering::Relaxed);
        match committed {
            Ok(()) => {
                crash::point!("after-commit");
                // Counted before answering: none of this batch's callers can have come back yet.
                let next = taken + rx.len();
                // Release: a look that sees this count sees the commit (`read/looks.rs`).
                self.stats.commits.fetch_add(1, Ordering::Release);
                self.stats
                    .committed_requests
                    .fetch_add(held.len() as u64, Ordering::Relaxed);
                held.into_iter().for_each(|job| job.answer(None));
                self.checkpoint.committed();
                next
            }
            Err(e) => {
                // A failed COMMIT (fsync EIO, say) may or may not be durable after a restart:
                // the answer is "unknown", which only a retry can resolve.
                let why = Unavailable::CommitUnknown(e.to_string());
                self.abort(held, &why);
                1
            }
        }
    }

    /// Rolls the batch back, the fence counter's increments with it (the counter is a row of
    /// the transaction): none of the batch's tokens was answered to anyone.
    fn abort(&self, held: Vec<Job>, why: &Unavailable) {
        if !self.conn.is_autocommit() {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
        // Frames the batch wrote before failing must never reach the log after the write lock
        // is gone (walvfs.rs).
        crate::walvfs::discard_pending(&self.conn);
        // Whatever code changed of the connection's settings after ending the transaction.
        if let Err(e) = self.commits.restore(&self.conn) {
            tracing::warn!(error = %e, "setting the writer connection's settings again failed");
        }
        self.stats.failed_batches.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(error = %why, requests = held.len(), "batch rolled back");
        held.into_iter().for_each(|job| job.refuse(why.clone()));
    }
}

/// What a request whose writes leave a deferred foreign key unmet is told (a handler's error,
/// a `write`'s, another request's refusal): one text wherever it is caught.
pub(crate) const DEFERRED_FK: &str = "FOREIGN KEY constraint failed (deferred): the writes leave \
                                      a foreign key unmet, which SQLite would refuse at commit; \
                                      nothing of them was kept";

/// See [`Cx::deferred_violations`]. A status SQLite keeps per connection: zero exactly when
/// every foreign key, deferred or not, is satisfied; `ROLLBACK TO` a savepoint restores it.
#[allow(
    unsafe_code,
    reason = "a status counter SQLite exposes only through its C API"
)]
fn deferred_violations(conn: &Connection) -> bool {
    use rusqlite::ffi;
    let (mut current, mut highest) = (0, 0);
    // SAFETY: the connection is this thread's own and open for the call; the two outputs are
    // plain integers, and the reset flag 0 changes nothing.
    let rc = unsafe {
        ffi::sqlite3_db_status(
            conn.handle(),
            ffi::SQLITE_DBSTATUS_DEFERRED_FKS,
            &raw mut current,
            &raw mut highest,
            0,
        )
    };
    rc == ffi::SQLITE_OK && current > 0
}
