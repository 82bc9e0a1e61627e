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

impl Inbox {
    /// Queues oncebox's own request, code that can run again in a new transaction when a
    /// batch-mate's statement made SQLite end the first.
    pub(crate) async fn submit<T, E, F>(&self, run: F) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<Unavailable> + Send + 'static,
        F: FnMut(&mut Cx<'_, '_>) -> Result<Result<T, E>, Fatal> + Send + 'static,
    {
        self.submit_body(again(run)).await
    }

    /// Queues a request and waits for its answer up to the deadline. Needs a Tokio runtime
    /// with timers enabled (`timeout_at`).
    pub(crate) async fn submit_body<T, E, B>(&self, body: B) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<Unavailable> + Send + 'static,
        B: Body<T, E>,
    {
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
        match tokio::time::timeout_at(deadline.into(), wait).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(why)) => Err(E::from(why)),
            Err(_) => Err(E::from(Unavailable::Deadline)),
        }
    }

    /// [`Inbox::submit`] for a request whose caller must learn its fate: a relay's claim (rows
    /// it would otherwise leave `in_flight` under tokens no one holds, later taken over as
    /// possibly sent) and its record, a two-phase lease (answered `Deadline` while it commits,
    /// it would hold the key for its whole TTL and then be taken over as a call that may have
    /// happened). The writer checks a request's deadline when it starts it, but the batch
    /// commits later: once started, the request is waited for past the deadline, for as long
    /// as its batch takes. Whether it starts is settled once, between the writer and a caller
    /// giving up at the deadline, so neither can take the other's answer.
    pub(crate) async fn submit_whole<T, E, F>(&self, mut run: F) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<Unavailable> + Send + 'static,
        F: FnMut(&mut Cx<'_, '_>) -> Result<Result<T, E>, Fatal> + Send + 'static,
    {
        const QUEUED: u8 = 0;
        const STARTED: u8 = 1;
        const ABANDONED: u8 = 2;
        let fate = Arc::new(AtomicU8::new(QUEUED));
        let writer_side = fate.clone();
        let deadline = Instant::now() + self.shared.deadline;
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        let body = again(move |cx: &mut Cx<'_, '_>| {
            let start =
                writer_side.compare_exchange(QUEUED, STARTED, Ordering::AcqRel, Ordering::Acquire);
            match start {
                // Run again (a batch-mate ended the first transaction): its caller still waits.
                Ok(_) | Err(STARTED) => run(cx),
                // Its caller gave up: nothing of it is written.
                Err(_) => Ok(Err(E::from(Unavailable::Deadline))),
            }
        });
        let job = Job::new(deadline, move |answer| drop(tx.send(answer)), body);
        let sender = self.shared.sender.as_ref().ok_or(Unavailable::Closed)?;
        let queued = tokio::time::timeout_at(deadline.into(), sender.send_async(job)).await;
        match queued {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(E::from(Unavailable::Closed)),
            Err(_) => return Err(E::from(Unavailable::Deadline)),
        }
        if let Ok(answer) = tokio::time::timeout_at(deadline.into(), &mut rx).await {
            return answer.unwrap_or(Err(E::from(Unavailable::Closed)));
        }
        let gave_up = fate.compare_exchange(QUEUED, ABANDONED, Ordering::AcqRel, Ordering::Acquire);
        if gave_up.is_ok() {
            return Err(E::from(Unavailable::Deadline));
        }
        // Started before the deadline: its batch answers once it commits or fails.
        rx.await.unwrap_or(Err(E::from(Unavailable::Closed)))
    }

    /// [`Inbox::submit_body`] for threads outside an async runtime: blocks the calling thread.
    pub(super) fn submit_blocking<T, E, B>(&self, body: B) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<Unavailable> + Send + 'static,
        B: Body<T, E>,
    {
        let deadline = Instant::now() + self.shared.deadline;
        let (tx, rx) = flume::bounded(1);
        let job = Job::new(deadline, move |answer| drop(tx.send(answer)), body);
        let sender = self.shared.sender.as_ref().ok_or(Unavailable::Closed)?;
        sender.send_deadline(job, deadline).map_err(|e| match e {
            flume::SendTimeoutError::Timeout(_) => Unavailable::Deadline,
            flume::SendTimeoutError::Disconnected(_) => Unavailable::Closed,
        })?;
        rx.recv_deadline(deadline).map_err(|e| match e {
            flume::RecvTimeoutError::Timeout => E::from(Unavailable::Deadline),
            flume::RecvTimeoutError::Disconnected => E::from(Unavailable::Closed),
        })?
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
    if out.is_err() {
        cx.rollback_to()?;
    }
    cx.release()?;
    match out.map_err(Error::from) {
        Err(Error::Unavailable(why)) => Err(Fatal(why)),
        other => Ok(other),
    }
}
