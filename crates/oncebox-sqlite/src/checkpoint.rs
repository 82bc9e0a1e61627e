//! WAL checkpoints on a thread of their own: copying the log back into the database file (and
//! its fsync) stays off the writer's commit path, as long as the checkpointer keeps up; and
//! bringing the log back to its start without stalling the writer.
//!
//! Why the second part: SQLite starts the log over only when a write transaction begins with
//! every frame already copied back. Under steady writes a checkpoint running beside the
//! writer never sees that moment (the writer appends while it copies), so the log grew to the
//! writer's own fallback (`wal_autocheckpoint`), and the writer then copied what was left and
//! synced the database file itself: 50–60 ms with every caller waiting, about once a second
//! in the gateway benchmark. (A log left to grow without bound was slower still: the writer's
//! CPU per event doubled.) So once the log is `Options::wal_restart_frames` long, the
//! checkpointer runs passes back to back, each copying what the writer appended during the
//! last, until one has little left; then the writer copies that little rest itself between
//! two batches (2–4 ms there), and its next transaction starts the log over.
//!
//! A failed sync of the database file stops every checkpoint for the rest of the store's life
//! (`SyncFailed`). Why: Linux reports a writeback error once per open file and then marks the
//! pages clean; the next sync on the same file succeeds without them. A checkpoint pass after
//! the failure would then see its own sync succeed, count every frame copied, and let the
//! writer start the log over: the copies that never reached the disk would exist nowhere, and a
//! power cut would lose acknowledged events (fsyncgate). Left alone, the log keeps every frame
//! since the last good restart; the next process's recovery reads them back and copies them
//! again. The log grows until then, and the error says to restart. A database file deleted or
//! replaced under the store trips the same latch (`moved.rs`): copied into a file no path
//! names, the log's frames would go with it.
//!
//! The restart length is long on purpose: the database file is synced once per restart, and
//! each sync writes every hot page (index leaves, the table's last pages) copied since the
//! last one. Restarting at 32 768 frames instead of 16 384 and 8 192 took `COMMIT` (the WAL's
//! fsync, which shares the disk with those writes) from 0.43–0.50 to 0.31–0.39 ms.

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rusqlite::Connection;

use crate::read::Looks;
use crate::read::looks::HOLD;

/// Commits between two checkpoints: often enough to keep the WAL small, rarely enough that the
/// extra fsync of the database file stays a small cost.
const EVERY: u32 = 64;

/// Pages in the WAL at which the writer checkpoints by itself after all (its WAL hook,
/// `writer/walhook.rs`, in place of SQLite's `wal_autocheckpoint`): a bound on the log should
/// this thread fall behind, twice the length at which it starts the log over (`Options::wal_restart_frames`), and never below
/// SQLite's own default of 1 000, so that a tiny restart length does not make the writer
/// checkpoint after nearly every commit.
pub(crate) fn writer_fallback(restart_frames: u32) -> i64 {
    i64::from(restart_frames).saturating_mul(2).max(1000)
}

/// A pass that had at most this many frames to copy ends the catching up: what the writer
/// appended meanwhile is a few commits' worth, which it copies itself in a millisecond or two.
const FINAL_FRAMES: i64 = 256;

/// Most passes one catching up runs. Each copies what the writer appended during the last; a
/// disk too slow for them to shrink leaves the log to the writer's fallback.
const MAX_PASSES: u32 = 32;

/// Set once a sync of the database file failed: from then on nothing in this store copies the
/// log back, nor lets a connection's close do it (see the module's comment).
#[derive(Debug, Clone, Default)]
pub(crate) struct SyncFailed(Arc<AtomicBool>);

impl SyncFailed {
    pub(crate) fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    /// Trips the latch; true the first time.
    pub(crate) fn trip(&self) -> bool {
        !self.0.swap(true, Ordering::AcqRel)
    }

    /// Trips the latch, saying so once.
    pub(crate) fn set(&self, what: &dyn std::fmt::Display) {
        if self.trip() {
            tracing::error!(
                error = %what,
                "the database file failed to sync: checkpoints stop and the write-ahead log keeps \
                 everything until this process restarts (its recovery copies the log again); \
                 restart it, and check the disk"
            );
        }
    }
}

/// Keeps `conn`'s close from copying the log back (SQLite checkpoints when a database's last
/// connection closes, and deletes the log once all of it is copied).
pub(crate) fn keep_log_at_close(conn: &Connection) {
    let no_checkpoint = rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE;
    if let Err(e) = conn.set_db_config(no_checkpoint, true) {
        tracing::error!(error = %e, "a connection may copy the log back when it closes");
    }
}

/// Whether `e` is an I/O error (a failed sync among them), after which no pass may run again.
fn io_failure(e: &rusqlite::Error) -> bool {
    e.sqlite_error_code() == Some(rusqlite::ErrorCode::SystemIoFailure)
}

/// The writer's side: it counts its commits and wakes the checkpointer once every `EVERY`. A
/// signal per commit woke that thread for nothing 63 times out of 64.
pub(crate) struct Due {
    tx: flume::Sender<()>,
    since: Cell<u32>,
    /// Set by the checkpointer when only a little of the log is left to copy.
    finish: Arc<AtomicBool>,
    failed: SyncFailed,
    /// The writer's checkpoint at close is off.
    stopped: Cell<bool>,
    /// Look connections, whose kept snapshots would hold the restart back.
    looks: Arc<Looks>,
}

/// The checkpointer's side.
pub(crate) struct Checkpointer {
    due: flume::Receiver<()>,
    finish: Arc<AtomicBool>,
    /// Log length (frames) from which the checkpointer works to start the log over.
    restart_frames: i64,
    /// Look connections whose kept snapshots would hold the passes back (`read/looks.rs`).
    looks: Arc<Looks>,
    failed: SyncFailed,
}

/// The writer's `Due` and what `run` takes; both watch `failed`.
pub(crate) fn due(
    restart_frames: u32,
    looks: Arc<Looks>,
    failed: SyncFailed,
) -> (Due, Checkpointer) {
    let (tx, rx) = flume::bounded(1);
    let finish = Arc::new(AtomicBool::new(false));
    let due = Due {
        tx,
        since: Cell::new(0),
        finish: finish.clone(),
        failed: failed.clone(),
        stopped: Cell::new(false),
        looks: looks.clone(),
    };
    let checkpointer = Checkpointer {
        due: rx,
        finish,
        restart_frames: i64::from(restart_frames.max(1)),
        looks,
        failed,
    };
    (due, checkpointer)
}

impl Due {
    /// Counts one commit.
    pub fn committed(&self) {
        let since = self.since.get() + 1;
        if since < EVERY {
            self.since.set(since);
            return;
        }
        self.since.set(0);
        // Full: a checkpoint is already due and will cover this one too.
        let _ = self.tx.try_send(());
    }

    /// Between two batches: copies the rest of the log if the checkpointer asked for it.
    /// Returns whether the whole log is copied now, so that the writer's next transaction
    /// starts it over.
    pub fn finish(&self, conn: &Connection) -> bool {
        if self.stop_if_failed(conn) {
            return false;
        }
        if !self.finish.swap(false, Ordering::Acquire) {
            return false;
        }
        // A look's kept snapshot, taken since the checkpointer last ended them, holds a mark
        // in the log: the writer's next transaction could not start the log over, and looks
        // keep such snapshots until the next commit, while duplicates keep them coming.
        // Ended now, before the copy, a look that begins after it reads the database file
        // alone and holds nothing back.
        self.looks.release_idle();
        passive(conn, &self.failed).is_some_and(|p| p.busy == 0 && p.checkpointed == p.log)
    }

    /// Once the database file failed to sync: turns the writer's checkpoint at close off,
    /// once (its fallback copies, `writer/walhook.rs`, read the latch themselves). Returns
    /// whether it failed.
    pub fn stop_if_failed(&self, conn: &Connection) -> bool {
        if !self.failed.is_set() {
            return false;
        }
        if !self.stopped.replace(true) {
            keep_log_at_close(conn);
        }
        true
    }
}

/// What one `PRAGMA wal_checkpoint(PASSIVE)` reports.
#[derive(Debug, Clone, Copy)]
struct Pass {
    /// Non-zero when another checkpoint held the lock and nothing was done.
    busy: i64,
    /// Frames in the log.
    log: i64,
    /// Frames of it copied back into the database file, by this pass or earlier ones.
    checkpointed: i64,
}

fn passive(conn: &Connection, failed: &SyncFailed) -> Option<Pass> {
    if failed.is_set() {
        return None;
    }
    // PASSIVE never waits for the writer or readers; whatever it cannot copy now it copies next
    // time. A failure is only logged: the WAL stays valid and the writer's fallback bounds it.
    // An I/O failure (SQLite's own sync of the file, in a pass that reached the log's end)
    // stops every pass after it.
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
        Ok(Pass {
            busy: r.get(0)?,
            log: r.get(1)?,
            checkpointed: r.get(2)?,
        })
    })
    .inspect_err(|e| {
        if io_failure(e) {
            failed.set(e);
        } else {
            tracing::warn!(error = %e, "WAL checkpoint failed");
        }
    })
    .ok()
}

/// Checkpoints on each signal until the writer drops its sender; one last checkpoint keeps the
/// WAL short at close. Before each pass, and every `HOLD` while no signal comes, it ends the
/// snapshots idle look connections keep: a snapshot older than the log's end stops a pass
/// at its frame and any restart, and one kept after the last commit would do so for the
/// next writer, this process's or another's.
pub(crate) fn run(conn: &Connection, c: &Checkpointer, file: &crate::moved::Opened) {
    loop {
        let signal = c.due.recv_timeout(HOLD);
        c.looks.release_idle();
        match signal {
            Ok(()) => {}
            Err(flume::RecvTimeoutError::Timeout) => continue,
            Err(flume::RecvTimeoutError::Disconnected) => break,
        }
        // Signals that queued while the last checkpoint ran are served by this one.
        c.due.try_iter().for_each(drop);
        // A file moved since the writer's last look trips the latch: `passive` copies nothing.
        let _ = file.moved();
        if let Some(pass) = passive(conn, &c.failed)
            && pass.log >= c.restart_frames
        {
            catch_up(conn, pass, c);
        }
    }
    passive(conn, &c.failed);
    if c.failed.is_set() {
        keep_log_at_close(conn);
        // The look connections close after this one when the store was dropped by a request
        // the writer ran (it could not wait for the threads to end), and the last connection
        // to close would copy the log back.
        c.looks.keep_log_at_close();
    }
}

/// Runs passes back to back until one had at most `FINAL_FRAMES` to copy and left nothing
/// behind, then asks the writer to copy the rest. Gives up when the log started over
/// meanwhile, when a reader holds frames back (nothing restarts then anyway), or after
/// `MAX_PASSES`.
///
/// SQLite syncs the database file only in a pass that reaches the log's very end, so every
/// page copied since waits for the pass that does; left to the writer's last pass, that was a
/// sync of tens of megabytes (about 50 ms on the benchmark's disk). Synced here after each
/// pass, the writer's sync covers only the pages it copies itself.
fn catch_up(conn: &Connection, mut last: Pass, c: &Checkpointer) {
    for _ in 0..MAX_PASSES {
        if !sync(conn, &c.failed) {
            return;
        }
        // A look since the last pass holds its snapshot until the next commit: its mark
        // would stop this pass short of the log's end, and end the catching up.
        c.looks.release_idle();
        let Some(pass) = passive(conn, &c.failed) else {
            return;
        };
        if pass.busy != 0 || pass.log < last.log || pass.checkpointed < pass.log {
            return;
        }
        let copied = pass.log - last.checkpointed;
        last = pass;
        if copied <= FINAL_FRAMES {
            if sync(conn, &c.failed) {
                c.finish.store(true, Ordering::Release);
            }
            return;
        }
    }
}

/// Syncs the database file's data, through the checkpointer connection's own handle of it.
/// Returns false, with `failed` set, when the sync failed: the error is reported once, so
/// SQLite's own sync after it would succeed without the pages it lost (the module's comment).
///
/// Not through a handle of our own (`File::open`): closing it, when the store closed, dropped
/// every POSIX lock this process held on the file (they belong to the process and the file,
/// not to a handle), the shared lock each of its SQLite connections keeps on a WAL database
/// among them. Another process could then take the file alone, checkpoint and delete the log
/// a second store of this process still committed into. SQLite's own closes wait while the
/// process holds locks on the file; it knows nothing of another handle.
#[allow(
    unsafe_code,
    reason = "SQLite's own file handle, synced by its own method"
)]
fn sync(conn: &Connection, failed: &SyncFailed) -> bool {
    use rusqlite::ffi;
    let mut file: *mut ffi::sqlite3_file = std::ptr::null_mut();
    // SAFETY: SQLITE_FCNTL_FILE_POINTER stores the main database's file (or null) into `file`;
    // the connection is this thread's own and open for the call, and its file is synced as
    // SQLite syncs it, by its own method.
    let rc = unsafe {
        let rc = ffi::sqlite3_file_control(
            conn.handle(),
            c"main".as_ptr(),
            ffi::SQLITE_FCNTL_FILE_POINTER,
            (&raw mut file).cast(),
        );
        if rc != ffi::SQLITE_OK || file.is_null() || (*file).pMethods.is_null() {
            return true;
        }
        let Some(sync) = (*(*file).pMethods).xSync else {
            return true;
        };
        sync(file, ffi::SQLITE_SYNC_NORMAL | ffi::SQLITE_SYNC_DATAONLY)
    };
    if rc != ffi::SQLITE_OK {
        failed.set(&format!("xSync answered {rc}"));
        return false;
    }
    true
}

#[cfg(test)]
mod tests;
