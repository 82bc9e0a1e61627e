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
pub(crate) use commits::Commits;
use gather::gather;

/// What a request sees of the open transaction.
pub(crate) struct Cx<'c, 's> {
    pub conn: &'c Connection,
    /// The writer's hot statements on `conn`.
    stmts: &'c Statements<'s>,
    /// One instant for the whole batch: every record of one commit carries the same time.
    pub now: Timestamp,
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

    /// Fails the batch when SQLite has rolled the whole transaction back by itself, as some
    /// statement errors do (a constraint declared `ON CONFLICT ROLLBACK`, `RAISE(ROLLBACK)`,
    /// a full disk, IO). Checked after each request, and inside one right after user code
    /// returns: a handler that went on past such an error would otherwise see the record
    /// written next in autocommit, without the effect it was to go with.
    pub fn still_open(&self) -> Result<(), Fatal> {
        if self.conn.is_autocommit() {
            return Err(Fatal(Unavailable::Storage(
                "transaction rolled back by SQLite: a statement's error ended it".into(),
            )));
        }
        Ok(())
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

/// Sends the prepared answer once the batch's fate is known (`None`: committed).
type Finish = Box<dyn FnOnce(Option<Unavailable>) + Send>;
type Work = Box<dyn FnOnce(Result<&mut Cx<'_, '_>, Unavailable>) -> Result<Finish, Fatal> + Send>;

/// One queued request.
pub(crate) struct Job {
    deadline: Instant,
    work: Work,
}

impl Job {
    /// Wraps `run` so its answer is held back until commit and replaced by `Unavailable` if the
    /// batch does not commit. `reply` hands the answer to the caller (a channel's send).
    pub fn new<T, E, F, R>(deadline: Instant, reply: R, run: F) -> Job
    where
        T: Send + 'static,
        E: From<Unavailable> + Send + 'static,
        F: FnOnce(&mut Cx<'_, '_>) -> Result<Result<T, E>, Fatal> + Send + 'static,
        R: FnOnce(Result<T, E>) + Send + 'static,
    {
        let work: Work = Box::new(move |cx| {
            let cx = match cx {
                Ok(cx) => cx,
                Err(why) => {
                    reply(Err(E::from(why)));
                    return Ok(Box::new(|_| {}));
                }
            };
            let answer = match run(cx) {
                Ok(answer) => answer,
                Err(Fatal(why)) => {
                    reply(Err(E::from(why.clone())));
                    return Err(Fatal(why));
                }
            };
            Ok(Box::new(move |failed| {
                reply(match failed {
                    None => answer,
                    Some(why) => Err(E::from(why)),
                });
            }))
        });
        Job { deadline, work }
    }

    fn refuse(self, why: Unavailable) {
        let _ = (self.work)(Err(why));
    }
}

/// The writer thread's state.
pub(crate) struct Writer {
    pub conn: Connection,
    pub clock: Arc<dyn Clock>,
    pub max_batch: usize,
    pub linger: Duration,
    /// Told of each commit, so WAL checkpoints run off the writer's critical path.
    pub checkpoint: crate::checkpoint::Due,
    pub stats: Arc<Stats>,
    /// The only way to commit on `conn`.
    pub commits: Commits,
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

    /// Times the writer copied the rest of the WAL back after the checkpointer caught up, so
    /// that its next transaction started the log over (`checkpoint.rs`).
    pub fn log_restarts(&self) -> u64 {
        self.log_restarts.load(Ordering::Relaxed)
    }

    /// Batches rolled back and answered `Unavailable`.
    pub fn failed_batches(&self) -> u64 {
        self.failed_batches.load(Ordering::Relaxed)
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
            // After answering, while the callers prepare their next requests.
            if self.checkpoint.finish(&self.conn) {
                self.stats.log_restarts.fetch_add(1, Ordering::Relaxed);
            }
        }
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
        if let Err(e) = self.conn.execute_batch("BEGIN IMMEDIATE") {
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
        let mut open = Open {
            cx: Cx {
                conn: &self.conn,
                stmts,
                now: self.clock.now(),
            },
            finishes: Vec::with_capacity(expected),
            failed: None,
        };
        let mut taken = 1;
        let mut take = |job: Job| open.run(job);
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
        let Open {
            finishes, failed, ..
        } = open;
        if let Some(why) = failed {
            self.abort(finishes, &why);
            return 1;
        }
        crash::point!("before-commit");
        let committing = Instant::now();
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
                    .fetch_add(finishes.len() as u64, Ordering::Relaxed);
                finishes.into_iter().for_each(|f| f(None));
                self.checkpoint.committed();
                next
            }
            Err(e) => {
                // A failed COMMIT (fsync EIO, say) may or may not be durable after a restart:
                // the answer is "unknown", which only a retry can resolve.
                let why = Unavailable::CommitUnknown(e.to_string());
                self.abort(finishes, &why);
                1
            }
        }
    }

    /// Rolls the batch back. The fence counter is not wound back: a COMMIT that failed may
    /// still have become durable, and a token must never be handed out twice.
    fn abort(&self, finishes: Vec<Finish>, why: &Unavailable) {
        if !self.conn.is_autocommit() {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
        // Frames the batch wrote before failing must never reach the log after the write lock
        // is gone (walvfs.rs).
        crate::walvfs::discard_pending(&self.conn);
        self.stats.failed_batches.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(error = %why, requests = finishes.len(), "batch rolled back");
        finishes.into_iter().for_each(|f| f(Some(why.clone())));
    }
}

/// An open transaction and the answers it holds back until its commit.
struct Open<'c, 's> {
    cx: Cx<'c, 's>,
    finishes: Vec<Finish>,
    /// Set by the first request that cannot go on; the batch then takes nobody else (what is
    /// still queued waits for the next transaction) and rolls back.
    failed: Option<Unavailable>,
}

impl Open<'_, '_> {
    /// Runs one request in the transaction; false once the transaction cannot commit.
    fn run(&mut self, job: Job) -> bool {
        if job.deadline <= Instant::now() {
            // Its caller has been told `Unavailable` already; doing the work now would only
            // surprise it. Nothing of it was written.
            job.refuse(Unavailable::Deadline);
            return true;
        }
        // A panic in a request (a closure given to `Inbox::write`, say) fails its batch, which
        // is rolled back, and the writer goes on: unwinding out of here ended the thread, and
        // every later request of the process was refused as closed.
        let work = job.work;
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(Ok(&mut self.cx))))
            .unwrap_or_else(|_| {
                Err(Fatal(Unavailable::Storage(
                    "a request panicked on the writer; its batch was rolled back".into(),
                )))
            });
        // The savepoints already released go with a transaction SQLite rolled back itself.
        match ran.and_then(|finish| self.cx.still_open().map(|()| finish)) {
            Ok(finish) => {
                self.finishes.push(finish);
                true
            }
            Err(Fatal(why)) => {
                self.failed = Some(why);
                false
            }
        }
    }
}
