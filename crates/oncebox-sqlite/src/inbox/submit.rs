//! How `Inbox` hands a request to the writer and waits for its answer: up to the caller's
//! deadline, or — for a request whose caller must learn its fate — for as long as its batch
//! takes once the writer started it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Instant;

use oncebox_core::Unavailable;
use rusqlite::Connection;

use super::Inbox;
use crate::error::{Error, storage, unavailable};
use crate::process::{RAN_COMMIT, ROLLED_BACK};
use crate::writer::{Body, Cx, Fatal, Job, again};

/// What a caller whose deadline passed while the writer ran its request is told: the request
/// may still commit, so its outcome is unknown, not merely late.
const RAN_PAST_DEADLINE: &str = "the deadline passed while the request ran; it may still commit";

/// Whether a queued request runs: settled once, between the writer starting it and its caller
/// giving up at the deadline, so that neither can take the other's answer.
#[derive(Clone, Default)]
struct Fate(Arc<AtomicU8>);

const QUEUED: u8 = 0;
const STARTED: u8 = 1;
const ABANDONED: u8 = 2;

impl Fate {
    /// The writer's side: whether the request may run (it starts now, or it ran before in a
    /// transaction a batch-mate ended, and its caller still waits).
    fn start(&self) -> bool {
        let start = self
            .0
            .compare_exchange(QUEUED, STARTED, Ordering::AcqRel, Ordering::Acquire);
        matches!(start, Ok(_) | Err(STARTED))
    }

    /// The caller's side, at its deadline: true when the request never ran and never will.
    fn abandon(&self) -> bool {
        self.0
            .compare_exchange(QUEUED, ABANDONED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// A body that runs only if its caller has not given up on it.
struct Fated<B> {
    fate: Fate,
    body: B,
}

impl<B> Fated<B> {
    /// `body`, run only while its caller waits, and the fate that caller keeps.
    fn new(body: B) -> (Fate, Fated<B>) {
        let fate = Fate::default();
        (fate.clone(), Fated { fate, body })
    }
}

impl<T, E, B> Body<T, E> for Fated<B>
where
    E: From<Unavailable>,
    B: Body<T, E>,
{
    fn call(&mut self, cx: &mut Cx<'_, '_>) -> Result<Result<T, E>, Fatal> {
        if self.fate.start() {
            self.body.call(cx)
        } else {
            // Its caller gave up: nothing of it is written.
            Ok(Err(E::from(Unavailable::Deadline)))
        }
    }

    fn again(&self) -> bool {
        self.body.again()
    }
}

/// The answer to a caller of a fated request that got none by its deadline.
fn late(fate: &Fate) -> Unavailable {
    if fate.abandon() {
        Unavailable::Deadline
    } else {
        Unavailable::CommitUnknown(RAN_PAST_DEADLINE.into())
    }
}

/// The answer to a caller of a fated request whose answer was dropped unsent (the writer
/// stopped, or a panic while it answered): `Closed` only when it never ran and never will. One
/// it started may have committed, and a reader standing in would take its own record for a
/// duplicate: its handler ran.
fn unanswered(fate: &Fate) -> Unavailable {
    if fate.abandon() {
        Unavailable::Closed
    } else {
        Unavailable::CommitUnknown(
            "the writer ran this request but its answer never came; it may have committed".into(),
        )
    }
}

impl Inbox {
    /// Queues oncebox's own request, code that can run again in a new transaction when a
    /// batch-mate's statement made SQLite end the first. Waited for whole once the writer
    /// started it ([`Inbox::submit_whole`]), so that `Deadline` means it never ran: answered
    /// `Deadline` while its batch went on to commit, a `release` that took effect was retried
    /// into `Fenced`, an operator's `resolve` into "not resolvable", and a purge chunk's
    /// deletions came after the memory of recent answers was cleared.
    pub(crate) async fn submit<T, E, F>(&self, run: F) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<Unavailable> + Send + 'static,
        F: FnMut(&mut Cx<'_, '_>) -> Result<Result<T, E>, Fatal> + Send + 'static,
    {
        self.submit_whole(run).await
    }

    /// [`Inbox::submit_body`] for a request whose missing answer a reader may stand in for
    /// (`or_committed`): `Unavailable::Deadline` only when the request never ran and never
    /// will, and `CommitUnknown` when its deadline passed while the writer ran it. That one may
    /// still commit, and a record read then may be its own, which must not be answered as a
    /// duplicate: its handler ran.
    pub(crate) async fn submit_fated<T, E, B>(&self, body: B) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<Unavailable> + Send + 'static,
        B: Body<T, E>,
    {
        let (fate, body) = Fated::new(body);
        settle(self.queue(body).await, &fate)
    }

    /// Queues a request and waits for its answer up to the deadline. Needs a Tokio runtime
    /// with timers enabled (`timeout_at`).
    pub(crate) async fn submit_body<T, E, B>(&self, body: B) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<Unavailable> + Send + 'static,
        B: Body<T, E>,
    {
        self.queue(body)
            .await
            .unwrap_or_else(|why| Err(E::from(why)))
    }

    /// Queues a request and waits for its answer up to the deadline: the answer, or why there
    /// is none (`Deadline`: the caller's own deadline passed).
    async fn queue<T, E, B>(&self, body: B) -> Result<Result<T, E>, Unavailable>
    where
        T: Send + 'static,
        E: From<Unavailable> + Send + 'static,
        B: Body<T, E>,
    {
        self.refuse_on_writer();
        let deadline = Instant::now() + self.shared.deadline;
        // A oneshot: one allocation and no lock per answer, where a bounded channel cost a
        // mutex and a waiter registration on every request.
        let (tx, rx) = tokio::sync::oneshot::channel();
        // A caller that gave up (deadline) has dropped its receiver; nothing to do then.
        let job = Job::new(deadline, move |answer| drop(tx.send(answer)), body);
        let sender = self.shared.sender.as_ref().ok_or(Unavailable::Closed)?;
        let wait = async {
            sender
                .send_async(job)
                .await
                .map_err(|_| Unavailable::Closed)?;
            rx.await.map_err(|_| Unavailable::Closed)
        };
        tokio::time::timeout_at(deadline.into(), wait)
            .await
            .unwrap_or(Err(Unavailable::Deadline))
    }

    /// [`Inbox::submit`] for a request whose caller must learn its fate: a relay's claim (rows
    /// it would otherwise leave `in_flight` under tokens no one holds, later taken over as
    /// possibly sent) and its record, a two-phase lease (answered `Deadline` while it commits,
    /// it would hold the key for its whole TTL and then be taken over as a call that may have
    /// happened). The writer checks a request's deadline when it starts it, but the batch
    /// commits later: once started, the request is waited for past the deadline, for as long
    /// as its batch takes.
    pub(crate) async fn submit_whole<T, E, F>(&self, run: F) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<Unavailable> + Send + 'static,
        F: FnMut(&mut Cx<'_, '_>) -> Result<Result<T, E>, Fatal> + Send + 'static,
    {
        self.refuse_on_writer();
        let (fate, body) = Fated::new(again(run));
        let deadline = Instant::now() + self.shared.deadline;
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        let job = Job::new(deadline, move |answer| drop(tx.send(answer)), body);
        let sender = self.shared.sender.as_ref().ok_or(Unavailable::Closed)?;
        let queued = tokio::time::timeout_at(deadline.into(), sender.send_async(job)).await;
        match queued {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(E::from(Unavailable::Closed)),
            Err(_) => return Err(E::from(Unavailable::Deadline)),
        }
        if let Ok(answer) = tokio::time::timeout_at(deadline.into(), &mut rx).await {
            return answer.unwrap_or_else(|_| Err(E::from(unanswered(&fate))));
        }
        if fate.abandon() {
            return Err(E::from(Unavailable::Deadline));
        }
        // Started before the deadline: its batch answers once it commits or fails.
        rx.await.unwrap_or_else(|_| Err(E::from(unanswered(&fate))))
    }

    /// Refuses a call made from inside a request the writer runs (a handler calling the store
    /// it runs in): queued behind itself, it waited its whole deadline, holding every request
    /// queued meanwhile and its own batch with them. A programming error, told at once: the
    /// panic fails the handler (the writer catches it), whose work is rolled back.
    pub(super) fn refuse_on_writer(&self) {
        assert!(
            std::thread::current().id() != self.shared.writer,
            "oncebox: an Inbox was called from inside one of its own handlers (on its writer \
             thread), where it would wait for itself; use the handler's Tx instead"
        );
    }

    /// [`Inbox::submit_fated`] for threads outside an async runtime: blocks the calling thread.
    pub(super) fn submit_fated_blocking<T, E, B>(&self, body: B) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<Unavailable> + Send + 'static,
        B: Body<T, E>,
    {
        let (fate, body) = Fated::new(body);
        settle(self.queue_blocking(body), &fate)
    }

    /// [`Inbox::submit_body`] for threads outside an async runtime: blocks the calling thread.
    pub(super) fn submit_blocking<T, E, B>(&self, body: B) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<Unavailable> + Send + 'static,
        B: Body<T, E>,
    {
        self.queue_blocking(body)
            .unwrap_or_else(|why| Err(E::from(why)))
    }

    /// [`Inbox::queue`], blocking the calling thread.
    fn queue_blocking<T, E, B>(&self, body: B) -> Result<Result<T, E>, Unavailable>
    where
        T: Send + 'static,
        E: From<Unavailable> + Send + 'static,
        B: Body<T, E>,
    {
        self.refuse_on_writer();
        let deadline = Instant::now() + self.shared.deadline;
        let (tx, rx) = flume::bounded(1);
        let job = Job::new(deadline, move |answer| drop(tx.send(answer)), body);
        let sender = self.shared.sender.as_ref().ok_or(Unavailable::Closed)?;
        sender.send_deadline(job, deadline).map_err(|e| match e {
            flume::SendTimeoutError::Timeout(_) => Unavailable::Deadline,
            flume::SendTimeoutError::Disconnected(_) => Unavailable::Closed,
        })?;
        rx.recv_deadline(deadline).map_err(|e| match e {
            flume::RecvTimeoutError::Timeout => Unavailable::Deadline,
            flume::RecvTimeoutError::Disconnected => Unavailable::Closed,
        })
    }
}

/// A fated request's answer: its own, or, when its caller's deadline passed first, whether it
/// may still commit ([`late`]).
fn settle<T, E: From<Unavailable>>(
    out: Result<Result<T, E>, Unavailable>,
    fate: &Fate,
) -> Result<T, E> {
    match out {
        Ok(answer) => answer,
        Err(Unavailable::Deadline) => Err(E::from(late(fate))),
        Err(Unavailable::Closed) => Err(E::from(unanswered(fate))),
        Err(why) => Err(E::from(why)),
    }
}

/// A caller's closure on the writer connection, in a savepoint of its own.
pub(super) fn write<T>(
    cx: &mut Cx<'_, '_>,
    f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
) -> Result<Result<T, Error>, Fatal> {
    cx.savepoint()?;
    let out = f(cx.conn);
    if cx.ended() {
        // Its own statement made SQLite end the transaction: its error, which every retry
        // would repeat, and the batch goes on without it — unless the storage failed.
        let e = match out {
            Err(e) if unavailable(&e).is_some() => return Err(Fatal(storage(&e))),
            Err(e) if !cx.stray_commit() => e,
            _ => rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ABORT_ROLLBACK),
                Some(
                    if cx.stray_commit() {
                        RAN_COMMIT
                    } else {
                        ROLLED_BACK
                    }
                    .into(),
                ),
            ),
        };
        cx.own_rollback();
        return Ok(Err(Error::Sql(e)));
    }
    // Writes that leave a deferred foreign key unmet would fail the batch's `COMMIT`: undone
    // here, in the closure's own savepoint, and its caller hears SQLite's own refusal, which a
    // retry repeats (not `Unavailable`).
    let out = match out {
        Ok(_) if cx.deferred_violations() => Err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CONSTRAINT_FOREIGNKEY),
            Some(crate::writer::DEFERRED_FK.into()),
        )),
        out => out,
    };
    if out.is_err() {
        cx.rollback_to()?;
    }
    cx.release()?;
    match out.map_err(Error::from) {
        Err(Error::Unavailable(why)) => Err(Fatal(why)),
        other => Ok(other),
    }
}
