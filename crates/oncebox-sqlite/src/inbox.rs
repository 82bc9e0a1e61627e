//! `Inbox`, the public handle: every write is a request to the writer thread, answered after
//! the batch it joined committed; reads go to reader connections.

use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use oncebox_core::{
    Begun, Event, Key, Lease, LeaseError, ProcessError, Processed, Record, Resolution, Response,
    Retention, Timestamp, Unavailable,
};
use rusqlite::Connection;

use crate::error::{Error, OpenError};
use crate::options::{Durability, Options};
use crate::probe::ProbeGate;
use crate::read::{Looks, Readers};
use crate::recent::Recent;
use crate::tx::{HandlerError, Tx};
use crate::writer::{Cx, Fatal, Job, Stats, Writer};
use crate::{checkpoint, lease, process, purge, read, schema};

mod answers;
pub(crate) use answers::Look;

/// The inbox on one SQLite file. Cheap to clone; the writer thread stops when the last clone
/// is dropped, after answering what was queued.
#[derive(Clone)]
pub struct Inbox {
    shared: Arc<Shared>,
}

struct Shared {
    sender: Option<flume::Sender<Job>>,
    /// The writer, then the checkpointer: joined in this order, as each one's end ends the next.
    threads: Mutex<Vec<JoinHandle<()>>>,
    readers: Readers,
    /// Whether looking for a committed duplicate on a reader currently pays.
    probe: ProbeGate,
    /// First answers of recently committed keys.
    recent: Recent,
    deadline: Duration,
    stats: Arc<Stats>,
    /// Bounds each purge's `now` by boot time (`oncebox_core::purge_time`).
    clock: Arc<dyn oncebox_core::Clock>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Closing the queue lets the writer drain it and exit; joining makes "dropped" mean
        // "file closed", which reopening in the same process relies on.
        drop(self.sender.take());
        if let Ok(threads) = self.threads.get_mut() {
            threads.drain(..).for_each(|t| drop(t.join()));
        }
    }
}

impl fmt::Debug for Inbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inbox").finish_non_exhaustive()
    }
}

impl Inbox {
    /// Opens (creating if needed) and migrates the database, then starts the writer thread.
    pub fn open(options: Options) -> Result<Inbox, OpenError> {
        if options.durability != Durability::Full {
            tracing::warn!(
                durability = ?options.durability,
                "durability below synchronous=FULL: the last commits may be lost on power failure"
            );
        }
        schema::refuse_lost_file(&options)?;
        schema::refuse_outdated(&options)?;
        let mut conn = schema::open_writer(&options)?;
        schema::migrate(&mut conn, &options)?;
        let checkpointer = schema::open_checkpointer(&options)?;
        let stats = Arc::new(Stats::default());
        // Opened only to be synced: a failure leaves the syncing to SQLite's own passes.
        let db = std::fs::File::open(&options.path).ok();
        let looks = Arc::new(Looks::new(options.clone(), stats.clone()));
        let (checkpoint, due) = checkpoint::due(options.wal_restart_frames, db, looks.clone());
        let (sender, receiver) = flume::bounded(options.queue_capacity.max(1));
        let cpu = crate::placement::cpu_for(options.placement, &options.path);
        if let Some(cpu) = cpu {
            tracing::debug!(cpu, "writer and checkpointer kept on one CPU");
        }
        // Open returns once both threads run where placed (and under their names).
        let (started, running) = std::sync::mpsc::sync_channel::<()>(2);
        let keep = move |started: std::sync::mpsc::SyncSender<()>| {
            if let Some(cpu) = cpu.filter(|&cpu| !crate::priority::pin(cpu)) {
                tracing::debug!(cpu, "a storage thread could not be kept on its CPU");
            }
            let _ = started.send(());
        };
        let started_too = started.clone();
        let writer = Writer {
            commits: crate::writer::Commits::guard(&conn),
            conn,
            clock: options.clock.clone(),
            max_batch: options.max_batch,
            linger: options.linger,
            checkpoint,
            stats: stats.clone(),
        };
        let writer = std::thread::Builder::new()
            .name("oncebox-writer".into())
            .spawn(move || {
                crate::priority::raise();
                keep(started);
                writer.run(&receiver)
            })
            .map_err(OpenError::Thread)?;
        let checkpointer = std::thread::Builder::new()
            .name("oncebox-ckpt".into())
            .spawn(move || {
                keep(started_too);
                checkpoint::run(&checkpointer, &due)
            })
            .map_err(OpenError::Thread)?;
        // An error means a thread ended first; it then runs nowhere.
        let _ = (running.recv(), running.recv());
        Ok(Inbox {
            shared: Arc::new(Shared {
                sender: Some(sender),
                threads: Mutex::new(vec![writer, checkpointer]),
                deadline: options.deadline,
                stats: stats.clone(),
                clock: options.clock.clone(),
                recent: Recent::new(options.recent_answers),
                readers: Readers::new(options, looks, stats),
                probe: ProbeGate::default(),
            }),
        })
    }

    /// Processes `event` once: a new key runs `handler` on the transaction that also records the
    /// key and its response; a committed key answers `Duplicate` without running it.
    pub async fn process<F>(&self, event: Event, handler: F) -> Result<Processed, ProcessError>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<Response, HandlerError> + Send + 'static,
    {
        let (key, fingerprint) = (event.key.clone(), event.fingerprint);
        let out = self
            .submit(move |cx| process::run(cx, &event, Box::new(handler)))
            .await;
        self.or_committed(out, &key, &fingerprint)
    }

    /// `process` for threads outside an async runtime. Blocks the calling thread.
    pub fn process_blocking<F>(&self, event: Event, handler: F) -> Result<Processed, ProcessError>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<Response, HandlerError> + Send + 'static,
    {
        let (key, fingerprint) = (event.key.clone(), event.fingerprint);
        let out = self.submit_blocking(move |cx| process::run(cx, &event, Box::new(handler)));
        self.or_committed(out, &key, &fingerprint)
    }

    /// Takes a fenced lease on the key for an effect outside the database.
    pub async fn begin(&self, event: Event, ttl: Duration) -> Result<Begun, ProcessError> {
        self.submit(move |cx| lease::begin(cx, &event, ttl)).await
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
    /// many. Never touches `processing` or `uncertain` records. `now` is taken no further than
    /// the boot's first purge plus the boot time since (`oncebox_core::purge_time`), so a wall
    /// clock jumping forward purges no record early.
    pub async fn purge(&self, now: Timestamp, retention: &Retention) -> Result<u64, Error> {
        let clock = self.shared.clock.clone();
        let now = self
            .write(move |c| purge::purge_time(c, &clock, now))
            .await?;
        let mut after = 0;
        let mut deleted = 0;
        loop {
            let r = retention.clone();
            let chunk = self
                .submit(move |cx| purge::chunk(cx, after, now, &r))
                .await?;
            deleted += chunk.deleted;
            if chunk.deleted > 0 {
                // Deleted records must not be answered from memory (recent.rs).
                self.shared.recent.clear();
            }
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
        self.submit(move |cx| write(cx, f)).await
    }

    /// `write` for threads outside an async runtime.
    pub fn write_blocking<T, F>(&self, f: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        self.submit_blocking(move |cx| write(cx, f))
    }

    /// Runs `f` on a reader connection (sees the last commit). Blocks the calling thread.
    pub fn read_blocking<T>(
        &self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Result<T, Error> {
        self.shared.readers.with(f)
    }

    /// Runs `f` on a reader connection from a blocking-task thread.
    pub async fn read<T, F>(&self, f: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
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

    pub(crate) async fn submit<T, E, F>(&self, run: F) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<Unavailable> + Send + 'static,
        F: FnOnce(&mut Cx<'_, '_>) -> Result<Result<T, E>, Fatal> + Send + 'static,
    {
        let deadline = Instant::now() + self.shared.deadline;
        // A oneshot: one allocation and no lock per answer, where a bounded channel cost a
        // mutex and a waiter registration on every request.
        let (tx, rx) = tokio::sync::oneshot::channel();
        // A caller that gave up (deadline) has dropped its receiver; nothing to do then.
        let job = Job::new(deadline, move |answer| drop(tx.send(answer)), run);
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
    /// possibly sent) and its record. The writer checks a request's deadline when it starts it,
    /// but the batch commits later: once started, the request is waited for past the deadline,
    /// for as long as its batch takes. Whether it starts is settled once, between the writer
    /// and a caller giving up at the deadline, so neither can take the other's answer.
    pub(crate) async fn submit_whole<T, E, F>(&self, run: F) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<Unavailable> + Send + 'static,
        F: FnOnce(&mut Cx<'_, '_>) -> Result<Result<T, E>, Fatal> + Send + 'static,
    {
        const QUEUED: u8 = 0;
        const STARTED: u8 = 1;
        const ABANDONED: u8 = 2;
        let fate = Arc::new(AtomicU8::new(QUEUED));
        let writer_side = fate.clone();
        let deadline = Instant::now() + self.shared.deadline;
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        let job = Job::new(
            deadline,
            move |answer| drop(tx.send(answer)),
            move |cx: &mut Cx<'_, '_>| {
                let start = writer_side.compare_exchange(
                    QUEUED,
                    STARTED,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                );
                match start {
                    Ok(_) => run(cx),
                    // Its caller gave up: nothing of it is written.
                    Err(_) => Ok(Err(E::from(Unavailable::Deadline))),
                }
            },
        );
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

    fn submit_blocking<T, E, F>(&self, run: F) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<Unavailable> + Send + 'static,
        F: FnOnce(&mut Cx<'_, '_>) -> Result<Result<T, E>, Fatal> + Send + 'static,
    {
        let deadline = Instant::now() + self.shared.deadline;
        let (tx, rx) = flume::bounded(1);
        let job = Job::new(deadline, move |answer| drop(tx.send(answer)), run);
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

fn write<T>(
    cx: &mut Cx<'_, '_>,
    f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
) -> Result<Result<T, Error>, Fatal> {
    cx.savepoint()?;
    let out = f(cx.conn);
    cx.still_open()?;
    if out.is_err() {
        cx.rollback_to()?;
    }
    cx.release()?;
    match out.map_err(Error::from) {
        Err(Error::Unavailable(why)) => Err(Fatal(why)),
        other => Ok(other),
    }
}
