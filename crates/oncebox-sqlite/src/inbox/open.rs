//! Opening an `Inbox`: the checks that refuse a missing, lost or outdated file, the migration,
//! and the writer and checkpointer threads, started where they are placed.

use std::sync::{Arc, Mutex};

use crate::error::OpenError;
use crate::options::{Durability, Options};
use crate::probe::ProbeGate;
use crate::read::{Looks, Readers};
use crate::recent::Recent;
use crate::writer::{Stats, Writer};
use crate::{checkpoint, purge, schema};

use super::{Inbox, Shared};

impl Inbox {
    /// Opens (creating if needed) and migrates the database, then starts the writer thread.
    ///
    /// Opening needs no runtime, but the async methods of what it returns need a Tokio
    /// runtime with timers enabled ([`Inbox`]).
    pub fn open(mut options: Options) -> Result<Inbox, OpenError> {
        options.deadline = options.deadline.min(oncebox_core::LONGEST_WAIT);
        options.busy_timeout = options.busy_timeout.min(oncebox_core::LONGEST_WAIT);
        // The writer waits up to this long for a batch's callers to come back, holding those it
        // has: a long one is only latency, and an unbounded one overflowed its clock (a panic
        // on the writer thread, which then answered every later request `Closed`).
        options.linger = options.linger.min(crate::options::MAX_LINGER);
        if options.durability != Durability::Full {
            tracing::warn!(
                durability = ?options.durability,
                "durability below synchronous=FULL: the last commits may be lost on power failure"
            );
        }
        schema::refuse_no_file(&options)?;
        schema::refuse_lost_file(&options)?;
        schema::refuse_outdated(&options)?;
        let mut conn = schema::open_writer(&options)?;
        schema::migrate(&mut conn, &options)?;
        // The boot is anchored at open, not at its first purge: records finished before that
        // purge were dated by the bare wall clock, and a clock behind at open then set right
        // made the purge that anchored at the right time delete them inside their window.
        let stamps = oncebox_core::Stamps::default();
        purge::purge_time(&conn, &options.clock, options.clock.now(), &stamps).map_err(
            |source| OpenError::Sqlite {
                path: options.path.display().to_string(),
                source,
            },
        )?;
        let length_limit = schema::length_limit(&conn);
        let checkpointer = schema::open_checkpointer(&options)?;
        let stats = Arc::new(Stats::default());
        let looks = Arc::new(Looks::new(options.clone(), stats.clone()));
        let sync_failed = checkpoint::SyncFailed::default();
        let (checkpoint, due) = checkpoint::due(
            options.wal_restart_frames,
            looks.clone(),
            sync_failed.clone(),
        );
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
        let wal_hook = crate::writer::install_wal_hook(
            &conn,
            checkpoint::writer_fallback(options.wal_restart_frames),
            stats.clone(),
            sync_failed.clone(),
        );
        let file = crate::moved::Opened::at(&options.path, sync_failed.clone());
        let watched = file.clone();
        let writer = Writer {
            file,
            commits: crate::writer::Commits::guard(&conn),
            conn,
            wal_hook,
            clock: options.clock.clone(),
            max_batch: options.max_batch,
            linger: options.linger,
            checkpoint,
            stats: stats.clone(),
            stamps: stamps.clone(),
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
                checkpoint::run(&checkpointer, &due, &watched)
            })
            .map_err(OpenError::Thread)?;
        // An error means a thread ended first; it then runs nowhere.
        let _ = (running.recv(), running.recv());
        Ok(Inbox {
            shared: Arc::new(Shared {
                sender: Some(sender),
                writer: writer.thread().id(),
                length_limit,
                threads: Mutex::new(vec![writer, checkpointer]),
                deadline: options.deadline,
                stats: stats.clone(),
                clock: options.clock.clone(),
                stamps,
                recent: Recent::new(options.recent_answers),
                readers: Readers::new(options, looks, stats),
                probe: ProbeGate::default(),
                sync_failed,
                last_claim: Mutex::new(None),
            }),
        })
    }
}
