//! A batch's open transaction: requests run as they are taken, their answers held until the
//! commit. When a request's own statement makes SQLite roll the whole transaction back (a
//! constraint declared `ON CONFLICT ROLLBACK`, `RAISE(ROLLBACK)`), that request is answered as
//! the cause, a new transaction begins, and the requests run before it run again there: they
//! did nothing wrong, and failing them with the batch made each retry of the cause fail its
//! batch-mates too. A request whose writes leave a deferred foreign key unmet, which would
//! fail the `COMMIT`, is refused the same way.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::Ordering;

use oncebox_core::{Clock, Unavailable};

use super::{Cx, Fatal, Job, Stats};
use crate::error::storage;

/// What a request whose code cannot run twice is told when another request's statement ended
/// the transaction it ran in.
const LOST: &str = "rolled back with its batch: another request's statement made SQLite end \
                    the transaction; nothing of this request was kept, so a retry applies it";

/// An open transaction and the requests whose answers wait for its commit.
pub(super) struct Open<'c, 's> {
    pub cx: Cx<'c, 's>,
    pub held: Vec<Job>,
    /// Set by the first request that cannot go on; the batch then takes nobody else (what is
    /// still queued waits for the next transaction) and rolls back.
    pub failed: Option<Unavailable>,
    stats: &'c Stats,
    clock: &'c dyn Clock,
}

impl<'c, 's> Open<'c, 's> {
    pub fn new(
        cx: Cx<'c, 's>,
        (stats, clock): (&'c Stats, &'c dyn Clock),
        expected: usize,
    ) -> Open<'c, 's> {
        Open {
            cx,
            held: Vec::with_capacity(expected),
            failed: None,
            stats,
            clock,
        }
    }

    /// Runs one request in the transaction; false once the transaction cannot commit.
    pub fn run(&mut self, mut job: Job) -> bool {
        if job.expired() {
            // Its caller has been told `Unavailable` already, or will be; doing the work now
            // would only surprise it. Nothing of it was written.
            job.refuse(Unavailable::Deadline);
            return true;
        }
        // Each request is judged at the time it runs, not at its batch's `BEGIN`: a batch takes
        // requests for up to `BATCH_WORK` after slow handlers, and a lease begun late in one,
        // dated from the `BEGIN`, ended that much sooner than its holder (who asked after the
        // `BEGIN`) counted; a `complete` late in one was judged live past its lease's end.
        // The completion stamp (`Cx::stamp`, what retention counts from) stays the batch's:
        // read later it could come after the commit, and the answer, that it dates (the
        // boot's anchor may hold it a millisecond past the wall clock), and a batch's
        // duration is nothing to a retention.
        self.cx.now = self.clock.now();
        // A hook a batch-mate's code set in place of the guard's is replaced again.
        self.cx.commits.install(self.cx.conn);
        // A panic in a request (a closure given to `Inbox::write`, say) fails its batch, which
        // is rolled back, and the writer goes on: unwinding out of here ended the thread, and
        // every later request of the process was refused as closed.
        let ran = catch_unwind(AssertUnwindSafe(|| job.run(&mut self.cx))).unwrap_or_else(|_| {
            Err(Fatal(Unavailable::Storage(
                "a request panicked on the writer; its batch was rolled back".into(),
            )))
        });
        let own = std::mem::take(&mut self.cx.own);
        let why = match ran {
            // Its writes leave a foreign key SQLite checks only at `COMMIT` unmet (a handler's
            // and a caller's `write` are undone in their own savepoints; this is any other
            // request): kept, they would fail the commit, and every batch-mate with it.
            Ok(()) if !self.cx.ended() && self.cx.deferred_violations() => {
                return self.restart(job, Some(Unavailable::Storage(super::DEFERRED_FK.into())));
            }
            Ok(()) if !self.cx.ended() => {
                self.held.push(job);
                return true;
            }
            Ok(()) if own => return self.restart(job, None),
            // The savepoints already released went with a transaction SQLite rolled back, and
            // the request does not know it.
            Ok(()) => Unavailable::Storage(
                "transaction rolled back by SQLite: a statement's error ended it".into(),
            ),
            Err(Fatal(why)) => why,
        };
        job.refuse(why.clone());
        self.failed = Some(why);
        false
    }

    /// `cause` cannot be kept: its own statement ended the transaction, or (`refused`) its
    /// writes would fail the commit. It is answered now (nothing of it is kept, whatever
    /// becomes of the batch), the transaction is rolled back and a new one begins, and the
    /// requests run before it run again there. Those whose code cannot run twice (a caller's
    /// `FnOnce` handler, already run) are answered `Unavailable`, nothing of them kept: their
    /// callers' retry applies them.
    fn restart(&mut self, cause: Job, refused: Option<Unavailable>) -> bool {
        match refused {
            Some(why) => cause.refuse(why),
            None => cause.answer(None),
        }
        let conn = self.cx.conn;
        if !conn.is_autocommit() {
            // A transaction the cause began after SQLite had ended the writer's.
            let _ = conn.execute_batch("ROLLBACK");
        }
        // What the ended transaction gathered of the log belongs to no commit (walvfs.rs).
        crate::walvfs::discard_pending(conn);
        self.stats.restarts.fetch_add(1, Ordering::Relaxed);
        let before = std::mem::take(&mut self.held);
        let begun = (self.cx.commits.restore(conn)).and_then(|()| self.cx.commits.begin(conn));
        if let Err(e) = begun {
            // Answered with the batch's failure.
            self.held = before;
            self.failed = Some(storage(&e));
            return false;
        }
        let mut before = before.into_iter();
        while let Some(job) = before.next() {
            if !job.again() {
                job.refuse(Unavailable::Storage(LOST.into()));
            } else if !self.run(job) {
                self.held.extend(before);
                return false;
            }
        }
        true
    }
}
