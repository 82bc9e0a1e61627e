//! Which sync of a database file or of a log the power-loss VFS fails, and how many it has.

use std::sync::atomic::{AtomicU32, Ordering};

/// Which sync of a database file fails, counted from 1 (0: none), and how many were made.
static FAIL_DB_SYNC: AtomicU32 = AtomicU32::new(0);
static DB_SYNCS: AtomicU32 = AtomicU32::new(0);
static FAILED_DB_SYNCS: AtomicU32 = AtomicU32::new(0);

/// Makes the first sync of a database file (a name ending in `.db`) in this process from the
/// `nth` on (counted from 1) that has writes to persist fail with `SQLITE_IOERR_FSYNC`, once,
/// as Linux fails an `fsync` after a writeback error: the writes it was to persist stay
/// readable but are never persisted. The other handles open on the file are told at their
/// next sync; later syncs succeed without the lost writes.
pub fn fail_database_sync(nth: u32) {
    FAIL_DB_SYNC.store(nth, Ordering::SeqCst);
}

/// How many syncs [`fail_database_sync`] has failed.
pub fn failed_database_syncs() -> u32 {
    FAILED_DB_SYNCS.load(Ordering::SeqCst)
}

/// As for the database file, the sync of a log (a name ending in `-wal`) that fails, and the
/// counts.
static FAIL_LOG_SYNC: AtomicU32 = AtomicU32::new(0);
static LOG_SYNCS: AtomicU32 = AtomicU32::new(0);
static FAILED_LOG_SYNCS: AtomicU32 = AtomicU32::new(0);

/// [`fail_database_sync`] for the log: the first sync of a `-wal` file from the `nth` on that
/// has writes to persist fails, once, its writes readable and never persisted.
pub fn fail_log_sync(nth: u32) {
    FAIL_LOG_SYNC.store(nth, Ordering::SeqCst);
}

/// How many syncs [`fail_log_sync`] has failed.
pub fn failed_log_syncs() -> u32 {
    FAILED_LOG_SYNCS.load(Ordering::SeqCst)
}

/// Counts a sync of a database file (`database`) or of a log (`log`), and says whether it is
/// the one to fail: the first from the armed one on that has writes to persist (`held`).
pub(super) fn fails_now(database: bool, log: bool, held: bool) -> bool {
    let (syncs, fail, failed) = if database {
        (&DB_SYNCS, &FAIL_DB_SYNC, &FAILED_DB_SYNCS)
    } else if log {
        (&LOG_SYNCS, &FAIL_LOG_SYNC, &FAILED_LOG_SYNCS)
    } else {
        return false;
    };
    let nth = syncs.fetch_add(1, Ordering::SeqCst) + 1;
    let from = fail.load(Ordering::SeqCst);
    let now = from > 0 && nth >= from && held && failed.load(Ordering::SeqCst) == 0;
    if now {
        failed.fetch_add(1, Ordering::SeqCst);
    }
    now
}
