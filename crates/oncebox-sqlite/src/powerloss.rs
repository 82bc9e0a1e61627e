//! A VFS for power-loss tests, built with the `crash-points` feature only: every write stays in
//! this process's memory until its file is synced, so a process killed with SIGKILL leaves on
//! disk exactly what was synced: what a machine that lost power finds when none of its unsynced
//! writes reached the disk. (A real power cut may also keep some of them, in any order, or tear
//! a sector; this VFS does not try those. Truncations and deletions take effect at once.)
//!
//! Why not just SIGKILL: the kernel keeps a killed process's writes in its page cache and
//! writes them out later, so a commit that was written but never synced survives a kill. A
//! store that answered before its sync, or did not sync at all (`synchronous=NORMAL`), passes
//! every crash test and still loses acknowledged events when the power goes.
//!
//! Writes not yet synced are kept per file path and shared by every handle on that file, as
//! the page cache is: a reader sees what another connection wrote, and a sync on any handle
//! writes out all of it. Truncation takes effect at once. Files are never memory-mapped here
//! (SQLite then reads through `xRead`, which sees the unsynced writes). Files SQLite opens
//! without a name (temporary files) are the platform VFS's own.
//!
//! A sync of the database file, or of its log, can also be made to fail as Linux fails one
//! after a writeback error ([`fail_database_sync`], [`fail_log_sync`]): the writes it was to
//! persist stay readable (the page cache keeps them) but never reach the disk. As Linux does
//! since 4.13, the error is reported once to every handle that was open on the file when it
//! happened (at its next sync, which writes out what is held all the same), and a handle's
//! syncs after that succeed without the lost writes.

#![allow(unsafe_code, reason = "SQLite's VFS interface is a C vtable")]

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use rusqlite::ffi;

use crate::vfsfile::{self, Wrapper};

mod faults;
mod unsynced;
pub use faults::{fail_database_sync, fail_log_sync, failed_database_syncs, failed_log_syncs};
use unsynced::Unsynced;

/// The name this VFS is registered by; it is also made the default.
pub const NAME: &CStr = c"oncebox-powerloss";

type Shared = Arc<Mutex<Unsynced>>;

/// The platform's VFS this one forwards to.
struct Inner(*mut ffi::sqlite3_vfs);
// SAFETY: the pointer is to SQLite's default VFS as it was at installation, a process-wide
// object SQLite never frees or moves; it is only read.
unsafe impl Send for Inner {}
unsafe impl Sync for Inner {}

static INNER: OnceLock<Option<Inner>> = OnceLock::new();
static FILES: OnceLock<Mutex<HashMap<String, Shared>>> = OnceLock::new();

/// Makes this VFS the process's default, once; returns whether it is, with the stores' page
/// cache (`pcache.rs`) installed first. Call it before any store opens: the store's own log
/// VFS forwards to whatever the default was when it first opened, and finding a VFS starts
/// SQLite up, after which its page cache can no longer be replaced: the power-loss tests ran
/// without the wrapper every store has.
pub fn install() -> bool {
    let cache = crate::pcache::install();
    let vfs = INNER
        .get_or_init(|| {
            // SAFETY: as in `walvfs::register`: the default VFS is copied, renamed and given
            // this module's open and delete; the copy is leaked, as SQLite keeps it.
            unsafe {
                let inner = ffi::sqlite3_vfs_find(std::ptr::null());
                if inner.is_null() {
                    return None;
                }
                let mut vfs = *inner;
                vfs.zName = NAME.as_ptr();
                vfs.pNext = std::ptr::null_mut();
                vfs.szOsFile =
                    c_int::try_from(std::mem::size_of::<File>()).ok()? + (*inner).szOsFile;
                vfs.xOpen = Some(open);
                vfs.xDelete = Some(delete);
                let leaked = Box::into_raw(Box::new(vfs));
                (ffi::sqlite3_vfs_register(leaked, 1) == ffi::SQLITE_OK).then_some(Inner(inner))
            }
        })
        .is_some();
    cache && vfs
}

fn inner_vfs() -> *mut ffi::sqlite3_vfs {
    INNER
        .get()
        .and_then(Option::as_ref)
        .map_or(std::ptr::null_mut(), |i| i.0)
}

fn files() -> std::sync::MutexGuard<'static, HashMap<String, Shared>> {
    FILES
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// SQLite's handle: the platform VFS's file lives right after it in SQLite's allocation.
#[repr(C)]
struct File {
    base: ffi::sqlite3_file,
    inner: *mut ffi::sqlite3_file,
    unsynced: Shared,
    /// A database file (its name ends in `.db`), whose syncs `fail_database_sync` counts.
    database: bool,
    /// A log (its name ends in `-wal`), whose syncs `fail_log_sync` counts.
    log: bool,
    /// The file's failed syncs this handle was told of, or that came before it opened.
    seen: AtomicU64,
}

// SAFETY: `open` stores the platform VFS's file, methods set, in `inner` of every file it
// gives `METHODS`.
unsafe impl Wrapper for File {
    unsafe fn inner(f: *mut ffi::sqlite3_file) -> *mut ffi::sqlite3_file {
        // SAFETY: per the trait's contract, `f` is a `File`.
        unsafe { (*f.cast::<File>()).inner }
    }
}

unsafe extern "C" fn open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let inner_vfs = inner_vfs();
    // SAFETY: SQLite passes a buffer of this VFS's szOsFile bytes at `file`: a `File`, then
    // the platform VFS's file, which that VFS fills.
    unsafe {
        let Some(inner_open) = inner_vfs.as_ref().and_then(|v| v.xOpen) else {
            return ffi::SQLITE_ERROR;
        };
        if name.is_null() {
            return inner_open(inner_vfs, name, file, flags, out_flags);
        }
        let path = CStr::from_ptr(name).to_string_lossy().into_owned();
        let inner = file
            .cast::<u8>()
            .add(std::mem::size_of::<File>())
            .cast::<ffi::sqlite3_file>();
        (*inner).pMethods = std::ptr::null();
        let rc = inner_open(inner_vfs, name, inner, flags, out_flags);
        if rc != ffi::SQLITE_OK || (*inner).pMethods.is_null() {
            (*file).pMethods = std::ptr::null();
            return if rc == ffi::SQLITE_OK {
                ffi::SQLITE_CANTOPEN
            } else {
                rc
            };
        }
        let database = path.ends_with(".db");
        let log = path.ends_with("-wal");
        let unsynced = files().entry(path).or_default().clone();
        let seen = AtomicU64::new(
            unsynced
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .errors,
        );
        file.cast::<File>().write(File {
            base: ffi::sqlite3_file {
                pMethods: &raw const METHODS,
            },
            inner,
            unsynced,
            database,
            log,
            seen,
        });
        ffi::SQLITE_OK
    }
}

unsafe extern "C" fn delete(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    sync: c_int,
) -> c_int {
    // SAFETY: SQLite passes a file name; forwarding to the platform VFS's delete.
    unsafe {
        if !name.is_null() {
            files().remove(&*CStr::from_ptr(name).to_string_lossy());
        }
        let inner = inner_vfs();
        inner
            .as_ref()
            .and_then(|v| v.xDelete)
            .map_or(ffi::SQLITE_IOERR_DELETE, |x| x(inner, name, sync))
    }
}

static METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(close),
    xRead: Some(read),
    xWrite: Some(write),
    xTruncate: Some(truncate),
    xSync: Some(sync),
    xFileSize: Some(file_size),
    xLock: Some(vfsfile::lock::<File>),
    xUnlock: Some(vfsfile::unlock::<File>),
    xCheckReservedLock: Some(vfsfile::check_reserved_lock::<File>),
    xFileControl: Some(file_control),
    xSectorSize: Some(vfsfile::sector_size::<File>),
    xDeviceCharacteristics: Some(vfsfile::device_characteristics::<File>),
    xShmMap: Some(vfsfile::shm_map::<File>),
    xShmLock: Some(vfsfile::shm_lock::<File>),
    xShmBarrier: Some(vfsfile::shm_barrier::<File>),
    xShmUnmap: Some(vfsfile::shm_unmap::<File>),
    xFetch: Some(fetch),
    xUnfetch: Some(unfetch),
};

/// Our handle behind SQLite's, and the platform file's methods.
///
/// # Safety
/// `f` must be a file opened by `open` with `METHODS`, not yet closed.
unsafe fn parts<'a>(f: *mut ffi::sqlite3_file) -> (&'a File, &'a ffi::sqlite3_io_methods) {
    // SAFETY: per the contract; `open` checked that the platform VFS set its methods.
    unsafe {
        let file = &*f.cast::<File>();
        (file, &*(*file.inner).pMethods)
    }
}

fn lock_unsynced(file: &File) -> std::sync::MutexGuard<'_, Unsynced> {
    file.unsynced.lock().unwrap_or_else(PoisonError::into_inner)
}

unsafe extern "C" fn close(f: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: `f` is ours; the handle is dropped once, and SQLite does not use it after
    // xClose. What it wrote and did not sync stays with the path, as in a page cache.
    unsafe {
        let (file, methods) = parts(f);
        let closed = methods.xClose.map_or(ffi::SQLITE_OK, |x| x(file.inner));
        std::ptr::drop_in_place(&raw mut (*f.cast::<File>()).unsynced);
        closed
    }
}

unsafe extern "C" fn read(f: *mut ffi::sqlite3_file, buf: *mut c_void, n: c_int, at: i64) -> c_int {
    // SAFETY: `f` is ours; `buf` holds `n` bytes.
    unsafe {
        let (file, methods) = parts(f);
        let u = lock_unsynced(file);
        let Some(read) = methods.xRead else {
            return ffi::SQLITE_IOERR_READ;
        };
        // A read past the end of the file on disk zero-fills what it could not read.
        let rc = read(file.inner, buf, n, at);
        if rc != ffi::SQLITE_OK && rc != ffi::SQLITE_IOERR_SHORT_READ {
            return rc;
        }
        let out = std::slice::from_raw_parts_mut(buf.cast::<u8>(), usize::try_from(n).unwrap_or(0));
        let end = at.saturating_add(i64::from(n));
        u.overlay(at, out);
        let mut on_disk = 0_i64;
        if let Some(size) = methods.xFileSize {
            size(file.inner, &raw mut on_disk);
        }
        if end <= on_disk.max(u.end) {
            ffi::SQLITE_OK
        } else {
            ffi::SQLITE_IOERR_SHORT_READ
        }
    }
}

unsafe extern "C" fn write(
    f: *mut ffi::sqlite3_file,
    data: *const c_void,
    n: c_int,
    at: i64,
) -> c_int {
    // SAFETY: `f` is ours; `data` holds `n` bytes for the duration of the call.
    unsafe {
        let (file, _) = parts(f);
        let bytes =
            std::slice::from_raw_parts(data.cast::<u8>(), usize::try_from(n).unwrap_or(0)).to_vec();
        lock_unsynced(file).record(at, bytes);
        ffi::SQLITE_OK
    }
}

unsafe extern "C" fn truncate(f: *mut ffi::sqlite3_file, size: i64) -> c_int {
    // SAFETY: `f` is ours.
    unsafe {
        let (file, methods) = parts(f);
        let mut u = lock_unsynced(file);
        let rc = methods
            .xTruncate
            .map_or(ffi::SQLITE_IOERR_TRUNCATE, |x| x(file.inner, size));
        if rc == ffi::SQLITE_OK {
            u.truncate(size);
        }
        rc
    }
}

unsafe extern "C" fn sync(f: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    // SAFETY: `f` is ours; the writes go to the platform file in the order they were made.
    unsafe {
        let (file, methods) = parts(f);
        let mut u = lock_unsynced(file);
        let Some(write) = methods.xWrite else {
            return ffi::SQLITE_IOERR_WRITE;
        };
        // A failed sync another handle was told of: this one is told at its own next sync.
        let unseen = u.errors > file.seen.load(Ordering::SeqCst);
        if faults::fails_now(file.database, file.log, u.any()) {
            u.lose_all();
            file.seen.store(u.errors, Ordering::SeqCst);
            return ffi::SQLITE_IOERR_FSYNC;
        }
        for (offset, bytes) in u.to_persist() {
            let n = c_int::try_from(bytes.len()).unwrap_or(c_int::MAX);
            let rc = write(file.inner, bytes.as_ptr().cast(), n, offset);
            if rc != ffi::SQLITE_OK {
                return rc;
            }
        }
        let rc = methods
            .xSync
            .map_or(ffi::SQLITE_IOERR_FSYNC, |x| x(file.inner, flags));
        if rc == ffi::SQLITE_OK {
            u.persisted();
            if unseen {
                file.seen.store(u.errors, Ordering::SeqCst);
                return ffi::SQLITE_IOERR_FSYNC;
            }
        }
        rc
    }
}

unsafe extern "C" fn file_size(f: *mut ffi::sqlite3_file, size: *mut i64) -> c_int {
    // SAFETY: `f` is ours; SQLite passes a valid out pointer.
    unsafe {
        let (file, methods) = parts(f);
        let u = lock_unsynced(file);
        let rc = methods
            .xFileSize
            .map_or(ffi::SQLITE_IOERR_FSTAT, |x| x(file.inner, size));
        if rc == ffi::SQLITE_OK {
            *size = (*size).max(u.end);
        }
        rc
    }
}

unsafe extern "C" fn fetch(
    _f: *mut ffi::sqlite3_file,
    _at: i64,
    _n: c_int,
    out: *mut *mut c_void,
) -> c_int {
    // Never mapped: a mapping would show the disk without the unsynced writes.
    // SAFETY: SQLite passes a valid out pointer.
    unsafe { *out = std::ptr::null_mut() };
    ffi::SQLITE_OK
}

unsafe extern "C" fn unfetch(_f: *mut ffi::sqlite3_file, _at: i64, _p: *mut c_void) -> c_int {
    ffi::SQLITE_OK
}

/// Forwards a call that does not touch the file's bytes.
macro_rules! forward {
    ($f:ident, $method:ident, $missing:expr $(, $arg:expr)*) => {{
        // SAFETY: `$f` is ours; forwarding to the platform VFS's method on its own file.
        unsafe {
            let (file, methods) = parts($f);
            methods.$method.map_or($missing, |x| x(file.inner $(, $arg)*))
        }
    }};
}

unsafe extern "C" fn file_control(f: *mut ffi::sqlite3_file, op: c_int, arg: *mut c_void) -> c_int {
    forward!(f, xFileControl, ffi::SQLITE_NOTFOUND, op, arg)
}
