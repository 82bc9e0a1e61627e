//! The writer connection's WAL hook, in place of the one `wal_autocheckpoint` installs. SQLite
//! calls it after each commit with the log's length in frames.
//!
//! Why our own: it counts the log's restarts as they happen (the length fell since the last
//! commit), where counting the writer's last copies (`checkpoint::Due::finish`) also counted
//! the copies after which a reader's snapshot kept the log from starting over, so the count
//! went up while the log grew. And the fallback copy it runs once the log is too long (the
//! checkpointer fell behind) trips the sync latch (`checkpoint::SyncFailed`) when it fails with
//! an I/O error, as the checkpointer's own passes do; SQLite's hook dropped its errors, and a
//! later pass could then start the log over past pages that never reached the disk.
#![allow(
    unsafe_code,
    reason = "sqlite3_wal_hook takes a C callback and its argument"
)]

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use rusqlite::{Connection, ffi};

use super::Stats;
use crate::checkpoint::SyncFailed;

/// What the hook reads and counts.
struct Watch {
    /// The log's length after the last commit.
    frames: Cell<c_int>,
    /// Length from which the hook copies the log back itself.
    fallback: c_int,
    stats: Arc<Stats>,
    failed: SyncFailed,
}

/// The hook's state, installed on one connection. It must outlive every call of the hook, so
/// the writer keeps it in a field declared after its connection (fields drop in order), and it
/// is freed only when dropped.
pub(crate) struct Installed(*mut Watch);

// SAFETY: the state is only read by the hook, on the thread that uses the connection, and it
// moves with the writer that owns both.
unsafe impl Send for Installed {}

impl Drop for Installed {
    fn drop(&mut self) {
        // SAFETY: made by `Box::into_raw` in `install`, freed once, here.
        drop(unsafe { Box::from_raw(self.0) });
    }
}

impl Installed {
    /// Puts the hook back on `conn`, before each commit: a handler on the writer connection
    /// may have replaced it (`PRAGMA wal_autocheckpoint`, its own hook), and SQLite's own
    /// would then copy the log back after a failed sync.
    pub(crate) fn reinstall(&self, conn: &Connection) {
        // SAFETY: as in `install`; the state is alive as long as `self`.
        unsafe {
            ffi::sqlite3_wal_hook(conn.handle(), Some(hook), self.0.cast::<c_void>());
        }
    }
}

/// Installs the hook on `conn`, replacing `wal_autocheckpoint`'s: past `fallback` frames a
/// commit copies the log back passively, unless the database file failed to sync. The
/// returned state must outlive the connection.
pub(crate) fn install(
    conn: &Connection,
    fallback: i64,
    stats: Arc<Stats>,
    failed: SyncFailed,
) -> Installed {
    let watch = Box::into_raw(Box::new(Watch {
        frames: Cell::new(0),
        fallback: c_int::try_from(fallback).unwrap_or(c_int::MAX),
        stats,
        failed,
    }));
    let installed = Installed(watch);
    installed.reinstall(conn);
    installed
}

/// The hook: SQLite's calling convention, after each commit of the connection.
unsafe extern "C" fn hook(
    arg: *mut c_void,
    db: *mut ffi::sqlite3,
    name: *const c_char,
    frames: c_int,
) -> c_int {
    // SAFETY: `name` is the database's name SQLite passes, a NUL-terminated string.
    if unsafe { std::ffi::CStr::from_ptr(name) } != c"main" {
        // An attached database's log: its length says nothing of the store's.
        return ffi::SQLITE_OK;
    }
    // SAFETY: `arg` is the `Watch` `install` registered, alive while the connection is.
    let watch = unsafe { &*arg.cast::<Watch>() };
    if frames < watch.frames.get() {
        watch.stats.log_restarts.fetch_add(1, Ordering::Relaxed);
    }
    watch.frames.set(frames);
    if frames >= watch.fallback && !watch.failed.is_set() {
        let (mut log, mut copied) = (0, 0);
        // SAFETY: `db` and `name` are the connection and database SQLite called us for; a
        // checkpoint from inside the hook is what SQLite's own hook runs.
        let rc = unsafe {
            ffi::sqlite3_wal_checkpoint_v2(
                db,
                name,
                ffi::SQLITE_CHECKPOINT_PASSIVE,
                &raw mut log,
                &raw mut copied,
            )
        };
        match rc & 0xff {
            ffi::SQLITE_OK | ffi::SQLITE_BUSY | ffi::SQLITE_LOCKED => {}
            ffi::SQLITE_IOERR => watch
                .failed
                .set(&format!("the writer's fallback checkpoint answered {rc}")),
            _ => tracing::warn!(code = rc, "the writer's fallback checkpoint failed"),
        }
    }
    ffi::SQLITE_OK
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rusqlite::Connection;

    use super::install;
    use crate::checkpoint::SyncFailed;
    use crate::scratch::insert;
    use crate::writer::Stats;

    fn checkpoint(conn: &Connection) -> (i64, i64) {
        conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
            Ok((r.get(1)?, r.get(2)?))
        })
        .unwrap()
    }

    /// Counted when the log starts over, not when it was copied: a reader's snapshot of the
    /// log's end, begun before the copy, keeps the next write from starting it over, and
    /// nothing is counted.
    #[test]
    fn a_restart_is_counted_when_the_log_starts_over_and_only_then() {
        let (_dir, options, writer) = crate::scratch::writer();
        let stats = Arc::new(Stats::default());
        let hook = install(&writer, 1_000_000, stats.clone(), SyncFailed::default());
        for k in ["a", "b", "c"] {
            insert(&writer, k);
        }
        let (log, copied) = checkpoint(&writer);
        assert_eq!(log, copied, "all copied");
        insert(&writer, "d");
        assert_eq!(stats.log_restarts(), 1, "the log started over");

        // A reader on a snapshot of the log's end, begun before the copy.
        insert(&writer, "e");
        let reader = Connection::open(&options.path).unwrap();
        reader.execute_batch("BEGIN").unwrap();
        let n: i64 = reader
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 5);
        let (log, copied) = checkpoint(&writer);
        assert_eq!(log, copied, "all copied, the reader's snapshot included");
        insert(&writer, "f");
        assert_eq!(stats.log_restarts(), 1, "the reader kept the log as it was");
        reader.execute_batch("COMMIT").unwrap();
        checkpoint(&writer);
        insert(&writer, "g");
        assert_eq!(stats.log_restarts(), 2);
        // The connection first: the hook's state must outlive it.
        drop(writer);
        drop(hook);
    }

    /// With no checkpointer keeping up, the log is copied back past the fallback length and
    /// starts over, as with SQLite's own hook; not once the database file failed to sync.
    #[test]
    fn past_the_fallback_the_writer_copies_the_log_itself_unless_a_sync_failed() {
        let (_dir, _options, writer) = crate::scratch::writer();
        let stats = Arc::new(Stats::default());
        let failed = SyncFailed::default();
        let hook = install(&writer, 8, stats.clone(), failed.clone());
        for k in 0..40 {
            insert(&writer, &k.to_string());
        }
        assert!(stats.log_restarts() >= 1, "copied and started over");
        failed.set(&"a test's failed sync");
        let before = stats.log_restarts();
        for k in 40..80 {
            insert(&writer, &k.to_string());
        }
        assert_eq!(
            stats.log_restarts(),
            before,
            "nothing copied after the failure"
        );
        let (log, _) = checkpoint(&writer);
        assert!(log >= 40, "the log kept every frame since: {log}");
        drop(writer);
        drop(hook);
    }
}
