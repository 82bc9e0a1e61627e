//! `Inbox`, the public handle: every write is a request to the writer thread, answered after
//! the batch it joined committed; reads go to reader connections.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::thread::{JoinHandle, ThreadId};
use std::time::Duration;

use oncebox_core::{
    Begun, Event, Key, Lease, LeaseError, ProcessError, Processed, Record, Resolution, Response,
    Retention, Timestamp, Unavailable,
};
use rusqlite::Connection;

use crate::error::Error;
use crate::probe::ProbeGate;
use crate::read::Readers;
use crate::recent::Recent;
use crate::tx::{HandlerError, Tx};
use crate::writer::{Cx, Job, Stats, again, once};
use crate::{checkpoint, lease, process, purge, read};

mod answers;
mod open;
mod size;
mod submit;
pub(crate) use answers::Look;

/// The inbox on one SQLite file. Cheap to clone; the writer thread stops when the last clone
/// is dropped, after answering what was queued.
///
/// Its async methods wait for the writer with Tokio's timers (each request's deadline) and
/// read on Tokio's blocking threads: they need a Tokio runtime with timers enabled
/// (`Builder::enable_time`, or `#[tokio::main]`), and panic outside one. Threads outside an
/// async runtime use `process_blocking`, `write_blocking` and `read_blocking`.
#[derive(Clone)]
pub struct Inbox {
    shared: Arc<Shared>,
}

struct Shared {
    sender: Option<flume::Sender<Job>>,
    /// The writer, then the checkpointer: joined in this order, as each one's end ends the next.
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// The writer thread, where the last clone may be dropped too: by a handler that captured
    /// one, whose caller gave up and dropped the rest.
    writer: ThreadId,
    /// The longest string, BLOB or row the writer stores (its `SQLITE_LIMIT_LENGTH`).
    length_limit: usize,
    readers: Readers,
    /// Whether looking for a committed duplicate on a reader currently pays.
    probe: ProbeGate,
    /// First answers of recently committed keys.
    recent: Recent,
    deadline: Duration,
    stats: Arc<Stats>,
    /// Bounds each purge's `now` by boot time (`oncebox_core::purge_time`).
    clock: Arc<dyn oncebox_core::Clock>,
    /// The boot's purge anchor, which the writer dates finished records by.
    stamps: oncebox_core::Stamps,
    /// Set once the database file failed to sync: the readers, closing last, must then not
    /// copy the log back either (`checkpoint.rs`).
    sync_failed: checkpoint::SyncFailed,
    /// The store's clock, wall and monotonic, at this process's last claim (`None` before the
    /// first): `deliveries.rs` tells a step back of the wall clock by it.
    last_claim: Mutex<Option<(oncebox_core::Timestamp, Duration)>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Closing the queue lets the writer drain it and exit; joining makes "dropped" mean
        // "file closed", which reopening in the same process relies on.
        drop(self.sender.take());
        let Ok(threads) = self.threads.get_mut() else {
            return;
        };
        if std::thread::current().id() == self.writer {
            // Dropped by a request the writer runs: joining would wait for this very thread
            // (a panic: "Resource deadlock avoided", which rolled the request back). Let go,
            // the writer ends once it has answered what is queued, and its end ends the
            // checkpointer.
            threads.clear();
            return;
        }
        threads.drain(..).for_each(|t| drop(t.join()));
        if self.sync_failed.is_set() {
            self.readers.keep_log_at_close();
        }
    }
}

impl fmt::Debug for Inbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inbox").finish_non_exhaustive()
    }
}

/// How the wall clock moved between two claims of a process, against the monotonic clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    None,
    /// Back, or not known (a process's first claim).
    Back,
    /// Ahead by this much.
    Ahead(Duration),
}

impl Inbox {
    /// How the wall clock moved since this process's last claim against the time that passed
    /// by the monotonic clock, past `slack` either way ([`Step::Back`] too when there was no
    /// claim, which cannot tell); and the clock's reading now, for [`Inbox::claimed`]. Read on
    /// the store's own clock, not a claimer's `now`: claimers whose clocks differ, or one that
    /// reuses a `now` across claims, would read as steps.
    pub(crate) fn clock_step(
        &self,
        slack: Duration,
    ) -> (Step, (oncebox_core::Timestamp, Duration)) {
        let now = (self.shared.clock.now(), self.shared.clock.monotonic());
        let last = *self
            .shared
            .last_claim
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let Some((wall, mono)) = last else {
            return (Step::Back, now);
        };
        let stepped = oncebox_core::clock::stepped_ms((wall, mono), now);
        let slack = i128::try_from(slack.as_millis()).unwrap_or(i128::MAX);
        let step = if stepped < -slack {
            Step::Back
        } else if stepped > slack {
            Step::Ahead(Duration::from_millis(
                u64::try_from(stepped).unwrap_or(u64::MAX),
            ))
        } else {
            Step::None
        };
        (step, now)
    }

    /// Notes a claim made at `at` (the reading [`Inbox::clock_step`] gave).
    pub(crate) fn claimed(&self, at: (oncebox_core::Timestamp, Duration)) {
        *self
            .shared
            .last_claim
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(at);
    }

    /// Processes `event` once: a new key runs `handler` on the transaction that also records the
    /// key and its response; a committed key answers `Duplicate` without running it.
    ///
    /// An event whose record would be longer than the store keeps is refused at once,
    /// `Invalid::TooLarge` ([`Options::length_limit`]). A handler whose statement makes SQLite
    /// roll back the whole transaction (`ON CONFLICT ROLLBACK`, `RAISE(ROLLBACK)`) fails as
    /// `Handler`, nothing of it kept; the events that shared its batch and ran before it are
    /// answered `Unavailable`, since this `FnOnce` handler cannot run twice (a retry applies
    /// them; the broker consumers' `InboxHandler` runs them again instead).
    ///
    /// Needs a Tokio runtime with timers enabled, and panics outside one; threads outside an
    /// async runtime use [`Inbox::process_blocking`]. Every method panics when called from
    /// inside one of this store's handlers (on its writer thread), where the call would wait
    /// for itself: a handler works through its `Tx`.
    pub async fn process<F>(&self, event: Event, handler: F) -> Result<Processed, ProcessError>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<Response, HandlerError> + Send + 'static,
    {
        self.refuse_too_large(&event)?;
        let (key, fingerprint) = (event.key.clone(), event.fingerprint);
        let out = self
            .submit_fated(process::Request::new(event, handler))
            .await;
        self.or_committed(out, &key, &fingerprint)
    }

    /// `process` for threads outside an async runtime. Blocks the calling thread.
    pub fn process_blocking<F>(&self, event: Event, handler: F) -> Result<Processed, ProcessError>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<Response, HandlerError> + Send + 'static,
    {
        self.refuse_too_large(&event)?;
        let (key, fingerprint) = (event.key.clone(), event.fingerprint);
        let out = self.submit_fated_blocking(process::Request::new(event, handler));
        self.or_committed(out, &key, &fingerprint)
    }

    /// `process` with a handler that can run again: when a batch-mate's statement makes SQLite
    /// roll back the transaction it ran in, it runs again in the next one instead of failing.
    pub(crate) async fn process_again<H>(
        &self,
        event: Event,
        handler: H,
    ) -> Result<Processed, ProcessError>
    where
        H: Fn(&mut Tx<'_>) -> Result<Response, HandlerError> + Send + Sync + 'static,
    {
        self.refuse_too_large(&event)?;
        let (key, fingerprint) = (event.key.clone(), event.fingerprint);
        let handler = Arc::new(handler);
        let out = self
            .submit_fated(again(move |cx: &mut Cx<'_, '_>| {
                let handler = handler.clone();
                let mut once: Option<process::Handler> = Some(Box::new(move |tx| handler(tx)));
                process::run(cx, &event, &mut once)
            }))
            .await;
        self.or_committed(out, &key, &fingerprint)
    }

    /// Takes a fenced lease on the key for an effect outside the database.
    ///
    /// A lease the writer took is always its caller's: once the writer started the request,
    /// the call waits past `Options::deadline` for its batch to commit, rather than answer
    /// `Deadline` for a lease that then holds the key, held by nobody, for its whole TTL and
    /// is taken over as a call that may have happened. Not started by the deadline, it is
    /// `Unavailable::Deadline` with nothing written. An event longer than the store keeps is
    /// `Invalid::TooLarge` at once, and a TTL under 1 ms `Invalid::LeaseTtl`.
    ///
    /// Needs a Tokio runtime with timers enabled, and panics outside one.
    pub async fn begin(&self, event: Event, ttl: Duration) -> Result<Begun, ProcessError> {
        oncebox_core::check_ttl(ttl)?;
        self.refuse_too_large(&event)?;
        self.submit_whole(move |cx| lease::begin(cx, &event, ttl))
            .await
    }

    /// Records the external effect as done; refused once the lease expired or was taken over.
    /// The holder repeating its own completion (its reply was lost) is answered `Ok` again.
    pub async fn complete(&self, lease: &Lease, response: Response) -> Result<(), LeaseError> {
        let lease = lease.clone();
        self.submit(move |cx| lease::complete(cx, &lease, &response))
            .await
    }

    /// The external effect failed: the key is free again.
    pub async fn release(&self, lease: &Lease) -> Result<(), LeaseError> {
        let lease = lease.clone();
        self.submit(move |cx| lease::release(cx, &lease)).await
    }

    /// The external effect's outcome is unknown: park the key for reconciliation.
    pub async fn uncertain(&self, lease: &Lease) -> Result<(), LeaseError> {
        let lease = lease.clone();
        self.submit(move |cx| lease::uncertain(cx, &lease)).await
    }

    /// Settles an uncertain key; `Ok(false)` when it was not uncertain.
    pub async fn resolve(&self, key: &Key, resolution: Resolution) -> Result<bool, Error> {
        let key = key.clone();
        self.submit(move |cx| lease::resolve(cx, &key, &resolution))
            .await
    }

    /// Deletes terminal records older than their source's retention as of `now`; returns how
    /// many. Never touches `processing` or `uncertain` records. `now` is taken no later than the
    /// store's clock (a future one would delete records still inside their senders' redelivery
    /// window), and no further than
    /// the boot's anchor (taken at the first open on the boot) plus the boot time since (`oncebox_core::purge_time`), so a wall
    /// clock jumping forward purges no record early.
    pub async fn purge(&self, now: Timestamp, retention: &Retention) -> Result<u64, Error> {
        let (clock, stamps) = (self.shared.clock.clone(), self.shared.stamps.clone());
        let now = self
            .write(move |c| purge::purge_time(c, &clock, now, &stamps))
            .await?;
        let mut after = 0;
        let mut deleted = 0;
        loop {
            let r = retention.clone();
            // Waited for whole once the writer started it (`submit`): answered `Deadline` while
            // its batch went on to commit, the memory below would be cleared before the
            // deletion, and an answer read in between kept for a key no longer there.
            let chunk = self
                .submit(move |cx| purge::chunk(cx, after, now, &r))
                .await;
            // Deleted records must not be answered from memory (recent.rs). A chunk that
            // failed (a commit of unknown fate) may have deleted all the same: forgotten then
            // too.
            if !matches!(&chunk, Ok(c) if c.deleted == 0) {
                self.shared.recent.clear();
            }
            let chunk = chunk?;
            deleted += chunk.deleted;
            match chunk.next {
                Some(next) => after = next,
                None => return Ok(deleted),
            }
        }
    }

    /// Runs `f` on the writer connection inside the next group commit (schema setup, admin).
    pub async fn write<T, F>(&self, f: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        self.submit_body(once(move |cx| submit::write(cx, f))).await
    }

    /// `write` for threads outside an async runtime.
    pub fn write_blocking<T, F>(&self, f: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        self.submit_blocking(once(move |cx| submit::write(cx, f)))
    }

    /// Runs `f` on a reader connection (sees the last commit). Blocks the calling thread.
    /// Refused (a panic) inside one of this store's handlers, as every method is: it would not
    /// wait for itself there, but it would read past the handler's own writes and its batch's,
    /// none of them committed yet, and a read-then-write on it would overwrite an effect
    /// already answered as applied. A handler reads through its `Tx`.
    pub fn read_blocking<T>(
        &self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Result<T, Error> {
        self.refuse_on_writer();
        self.shared.readers.with(f)
    }

    /// Runs `f` on a reader connection from a blocking-task thread.
    pub async fn read<T, F>(&self, f: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        self.refuse_on_writer();
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || shared.readers.with(f))
            .await
            .map_err(|e| Error::Unavailable(Unavailable::Storage(e.to_string())))?
    }

    /// Requests waiting for the writer now, not yet taken into a transaction.
    pub fn queued(&self) -> usize {
        self.shared.sender.as_ref().map_or(0, flume::Sender::len)
    }

    /// Counters of the writer's work and of reads served since open.
    pub fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    /// The key's committed record.
    pub async fn record(&self, key: &Key) -> Result<Option<Record>, Error> {
        let key = key.clone();
        self.read(move |c| read::record(c, &key)).await
    }
}
