//! The single writer thread: it owns the write connection and group-commits whatever requests
//! are queued — one `BEGIN IMMEDIATE`, a savepoint per request, one `COMMIT` (one fsync) — and
//! only then answers every caller.

use std::sync::Arc;
use std::time::Instant;

use oncebox_core::{Clock, Timestamp, Unavailable};
use rusqlite::Connection;

use crate::crash;
use crate::error::storage;

/// What a request sees of the open transaction.
pub(crate) struct Cx<'c> {
    pub conn: &'c Connection,
    /// One instant for the whole batch: every record of one commit carries the same time.
    pub now: Timestamp,
    /// Next fencing token minus one; persisted in `oncebox_meta` by whoever hands a token out.
    pub fence: &'c mut i64,
}

impl Cx<'_> {
    pub fn savepoint(&self) -> Result<(), Fatal> {
        self.exec("SAVEPOINT oncebox_request")
    }

    pub fn release(&self) -> Result<(), Fatal> {
        self.exec("RELEASE oncebox_request")
    }

    /// Undoes everything since `savepoint` and keeps the savepoint open.
    pub fn rollback_to(&self) -> Result<(), Fatal> {
        self.exec("ROLLBACK TO oncebox_request")
    }

    fn exec(&self, sql: &str) -> Result<(), Fatal> {
        self.conn.execute_batch(sql).map_err(|e| Fatal(storage(&e)))
    }

    /// Hands out the next fencing token; it commits or rolls back with the batch.
    pub fn next_fence(&mut self) -> Result<i64, Fatal> {
        *self.fence += 1;
        self.conn
            .prepare_cached("UPDATE oncebox_meta SET value = ?1 WHERE name = 'fence'")
            .and_then(|mut s| s.execute([*self.fence]))
            .map_err(|e| Fatal(storage(&e)))?;
        Ok(*self.fence)
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
type Work = Box<dyn FnOnce(Result<&mut Cx<'_>, Unavailable>) -> Result<Finish, Fatal> + Send>;

/// One queued request.
pub(crate) struct Job {
    deadline: Instant,
    work: Work,
}

impl Job {
    /// Wraps `run` so its answer is held back until commit and replaced by `Unavailable` if the
    /// batch does not commit.
    pub fn new<T, E, F>(deadline: Instant, reply: flume::Sender<Result<T, E>>, run: F) -> Job
    where
        T: Send + 'static,
        E: From<Unavailable> + Send + 'static,
        F: FnOnce(&mut Cx<'_>) -> Result<Result<T, E>, Fatal> + Send + 'static,
    {
        let work: Work = Box::new(move |cx| {
            let cx = match cx {
                Ok(cx) => cx,
                Err(why) => {
                    let _ = reply.send(Err(E::from(why)));
                    return Ok(Box::new(|_| {}));
                }
            };
            let answer = match run(cx) {
                Ok(answer) => answer,
                Err(Fatal(why)) => {
                    let _ = reply.send(Err(E::from(why.clone())));
                    return Err(Fatal(why));
                }
            };
            Ok(Box::new(move |failed| {
                // A caller that gave up (deadline) has dropped its receiver; nothing to do then.
                let _ = reply.send(match failed {
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
    pub fence: i64,
    pub max_batch: usize,
}

impl Writer {
    /// Runs until every sender is dropped, then finishes what is queued and returns.
    pub fn run(mut self, rx: &flume::Receiver<Job>) {
        let mut batch = Vec::with_capacity(self.max_batch);
        while let Ok(first) = rx.recv() {
            batch.push(first);
            // Group commit: whatever queued up while the last fsync ran joins this transaction.
            batch.extend(rx.try_iter().take(self.max_batch.saturating_sub(1)));
            self.commit(&mut batch);
        }
    }

    fn commit(&mut self, batch: &mut Vec<Job>) {
        if let Err(e) = self.conn.execute_batch("BEGIN IMMEDIATE") {
            let why = storage(&e);
            batch.drain(..).for_each(|job| job.refuse(why.clone()));
            return;
        }
        let now = self.clock.now();
        let mut finishes: Vec<Finish> = Vec::with_capacity(batch.len());
        let mut jobs = batch.drain(..);
        let mut failed = None;
        while let Some(job) = jobs.next() {
            if job.deadline <= Instant::now() {
                // Its caller has been told `Unavailable` already; doing the work now would only
                // surprise it. Nothing of it was written.
                job.refuse(Unavailable::Deadline);
                continue;
            }
            let mut cx = Cx {
                conn: &self.conn,
                now,
                fence: &mut self.fence,
            };
            match (job.work)(Ok(&mut cx)) {
                Ok(finish) => finishes.push(finish),
                Err(Fatal(why)) => {
                    failed = Some(why);
                    break;
                }
            }
            // SQLite rolls the whole transaction back by itself on some errors (full disk, IO):
            // the savepoints already released are gone too.
            if self.conn.is_autocommit() {
                failed = Some(Unavailable::Storage(
                    "transaction rolled back by SQLite".into(),
                ));
                break;
            }
        }
        if let Some(why) = failed {
            jobs.for_each(|job| job.refuse(why.clone()));
            self.abort(finishes, &why);
            return;
        }
        crash::point!("before-commit");
        match self.conn.execute_batch("COMMIT") {
            Ok(()) => {
                crash::point!("after-commit");
                finishes.into_iter().for_each(|f| f(None));
            }
            Err(e) => {
                // A failed COMMIT (fsync EIO, say) may or may not be durable after a restart:
                // the answer is "unknown", which only a retry can resolve.
                let why = Unavailable::CommitUnknown(e.to_string());
                self.abort(finishes, &why);
            }
        }
    }

    /// Rolls the batch back. The fence counter is not wound back: a COMMIT that failed may
    /// still have become durable, and a token must never be handed out twice.
    fn abort(&mut self, finishes: Vec<Finish>, why: &Unavailable) {
        if !self.conn.is_autocommit() {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
        tracing::warn!(error = %why, requests = finishes.len(), "batch rolled back");
        finishes.into_iter().for_each(|f| f(Some(why.clone())));
    }
}
