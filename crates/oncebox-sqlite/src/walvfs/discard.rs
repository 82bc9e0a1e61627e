//! Dropping what a rolled-back write transaction gathered in the WAL VFS, before anything can
//! write it out over frames another connection committed since.

use rusqlite::ffi;

use super::{DISCARDS, METHODS, WalFile, wal};

/// Drops the appends `conn`'s write transaction gathered without committing; returns how many
/// bytes that was. The writer calls it after every rollback.
///
/// Why: a transaction larger than the cache writes frames before its commit. Rolled back,
/// those frames belong to nothing, and once the write lock is released another connection
/// may commit its own frames at the same offsets; writing ours out later would overwrite them.
pub(crate) fn discard_pending(conn: &rusqlite::Connection) -> usize {
    // SAFETY: the connection is open for the duration of the call, on its own thread.
    unsafe { discard_pending_of(conn.handle()) }
}

/// [`discard_pending`] as `conn`'s rollback hook runs it (`writer/commits.rs`), where SQLite
/// has just released the write lock and nothing of the connection has read or written since:
/// dropped later, the gathered frames could be written out first, by a read of the handler
/// that went on after SQLite ended its transaction (`RAISE(ROLLBACK)`), over frames another
/// process committed meanwhile.
pub(crate) fn rollback_discard(conn: &rusqlite::Connection) -> impl Fn() + Send + 'static {
    // Kept as an address, to be `Send`. SAFETY: reading the handle has no effect.
    let db = unsafe { conn.handle() } as usize;
    move || {
        // SAFETY: SQLite calls a rollback hook on the connection's own thread, after the
        // rollback, while the connection is open (a connection's hooks go with it); file
        // control takes nothing the rollback holds.
        unsafe { discard_pending_of(db as *mut ffi::sqlite3) };
    }
}

/// [`discard_pending`] for the connection `db`.
///
/// # Safety
/// `db` is an open connection, used by no other thread during the call.
unsafe fn discard_pending_of(db: *mut ffi::sqlite3) -> usize {
    let mut file: *mut ffi::sqlite3_file = std::ptr::null_mut();
    // SAFETY: SQLITE_FCNTL_JOURNAL_POINTER stores the main database's journal or WAL file
    // pointer (or null) into `file`; the connection is open for the duration of the call (the
    // caller's promise), and the file is only touched if it is one of ours.
    unsafe {
        let rc = ffi::sqlite3_file_control(
            db,
            c"main".as_ptr(),
            ffi::SQLITE_FCNTL_JOURNAL_POINTER,
            (&raw mut file).cast(),
        );
        if rc != ffi::SQLITE_OK || file.is_null() || !std::ptr::eq((*file).pMethods, &METHODS) {
            return 0;
        }
        let dropped = drop_gathered(wal(file));
        if dropped > 0 {
            DISCARDS.set(DISCARDS.get() + 1);
        }
        dropped
    }
}

/// Drops what `w` gathered and forgets what it lost: the transaction is over, and its frames
/// belong to nothing. Returns how many bytes were dropped.
pub(super) fn drop_gathered(w: &mut WalFile) -> usize {
    let dropped = w.pending.len();
    w.pending.clear();
    w.lost = None;
    dropped
}
