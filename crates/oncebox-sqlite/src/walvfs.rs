//! A VFS over the platform's default one that hands the writer's WAL appends of one commit to
//! the kernel as one write instead of two system calls per page.
//!
//! Why: SQLite writes each WAL frame with two `pwrite` calls (a 24-byte header, then the page),
//! so a commit of 30 random keys made about 90 system calls before its fsync, each paying the
//! system call, the inode lock and a timestamp update on top of the copy. The writer thread is
//! the serial section of every ingest, so its time per request bounds the gateway.
//!
//! Only the write-ahead log of a connection opened with this VFS is wrapped; the database file
//! and the shared-memory index get the default VFS's own methods untouched. Appends that follow
//! each other are gathered in memory; anything else — a write elsewhere, a read of the
//! gathered range, a sync, a truncation, a size query, a file control — writes them out first.
//! That is sound only where every commit syncs the log (`synchronous=FULL`): SQLite publishes
//! a commit to other connections after that sync, so no reader can look for frames still held
//! here, and a crash can only lose frames of a commit that had not returned. So gathered bytes
//! outlive a write transaction only if it did not commit; they are dropped then
//! ([`discard_pending`] after a rollback, and at close), never written over frames another
//! connection may have committed since. The writer connection uses this VFS at
//! `Durability::Full` only.
#![allow(unsafe_code, reason = "SQLite's VFS interface is a C vtable")]

use std::ffi::{CStr, c_int, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use rusqlite::ffi;

use crate::vfsfile::{self, Wrapper};

/// The name connections open this VFS by.
pub(crate) const NAME: &CStr = c"oncebox-wal";

/// Gathered appends are written out past this size even before a sync.
const LIMIT: usize = 4 << 20;

/// The default VFS this one forwards to, and this VFS as registered.
struct Registered {
    inner: *mut ffi::sqlite3_vfs,
}

// SAFETY: the pointer is to SQLite's default VFS, a process-wide object SQLite never frees or
// moves while registered; it is only read.
unsafe impl Send for Registered {}
unsafe impl Sync for Registered {}

static REGISTERED: OnceLock<Option<Registered>> = OnceLock::new();
/// Appends gathered and writes made, since the process started: tests must see gathering
/// happen.
static APPENDS: AtomicU64 = AtomicU64::new(0);
static WRITES: AtomicU64 = AtomicU64::new(0);
/// Reads that found their range still gathered and wrote it out first.
static READ_FLUSHES: AtomicU64 = AtomicU64::new(0);
thread_local! {
    /// Rollbacks on this thread whose gathered frames were dropped (per thread: tests run
    /// side by side).
    static DISCARDS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Registers the VFS once per process; returns whether it can be used.
pub(crate) fn register() -> bool {
    REGISTERED
        .get_or_init(|| {
            // SAFETY: sqlite3_vfs_find(NULL) returns the default VFS or null; the copy made
            // here is leaked on purpose, as SQLite keeps the registered pointer for the
            // process's lifetime.
            unsafe {
                let inner = ffi::sqlite3_vfs_find(std::ptr::null());
                if inner.is_null() {
                    return None;
                }
                let mut vfs = *inner;
                vfs.zName = NAME.as_ptr();
                vfs.pNext = std::ptr::null_mut();
                vfs.szOsFile =
                    c_int::try_from(std::mem::size_of::<WalFile>()).ok()? + (*inner).szOsFile;
                vfs.xOpen = Some(open);
                let leaked = Box::into_raw(Box::new(vfs));
                (ffi::sqlite3_vfs_register(leaked, 0) == ffi::SQLITE_OK)
                    .then_some(Registered { inner })
            }
        })
        .is_some()
}

fn inner_vfs() -> *mut ffi::sqlite3_vfs {
    REGISTERED
        .get()
        .and_then(Option::as_ref)
        .map_or(std::ptr::null_mut(), |r| r.inner)
}

/// A WAL file: the default VFS's file lives right after this header in SQLite's allocation.
#[repr(C)]
struct WalFile {
    base: ffi::sqlite3_file,
    inner: *mut ffi::sqlite3_file,
    /// Appends not yet written, starting at file offset `start`.
    pending: Vec<u8>,
    start: i64,
    /// The range of gathered appends that failed to go out, until the transaction's rollback
    /// ([`discard_pending`]): SQLite counts those frames written, so the transaction must not
    /// commit and nothing may read them. Why: a read that wrote them out first and failed
    /// (`SQLITE_FULL`) fails only its statement; SQLite does not take a read's error for a
    /// lost write, and a handler that went on to `COMMIT` once space was free published
    /// frames that were never in the file.
    lost: Option<(i64, i64)>,
}

// SAFETY: `open` stores the default VFS's file, methods set, in `inner` of every file it
// gives `METHODS`.
unsafe impl Wrapper for WalFile {
    unsafe fn inner(f: *mut ffi::sqlite3_file) -> *mut ffi::sqlite3_file {
        // SAFETY: per the trait's contract, `f` is a `WalFile`.
        unsafe { (*f.cast::<WalFile>()).inner }
    }
}

impl WalFile {
    /// The file offset just past the gathered appends.
    fn end(&self) -> i64 {
        self.start
            .saturating_add(i64::try_from(self.pending.len()).unwrap_or(i64::MAX))
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
    // SAFETY: SQLite passes a buffer of this VFS's szOsFile bytes at `file`, which holds a
    // `WalFile` followed by the default VFS's file; the default VFS fills the part given to it.
    unsafe {
        let Some(inner_open) = inner_vfs.as_ref().and_then(|v| v.xOpen) else {
            return ffi::SQLITE_ERROR;
        };
        if flags & ffi::SQLITE_OPEN_WAL == 0 {
            // Not the log: the default VFS's file in place, with its own methods.
            return inner_open(inner_vfs, name, file, flags, out_flags);
        }
        let wal = file.cast::<WalFile>();
        let inner = file
            .cast::<u8>()
            .add(std::mem::size_of::<WalFile>())
            .cast::<ffi::sqlite3_file>();
        (*inner).pMethods = std::ptr::null();
        let rc = inner_open(inner_vfs, name, inner, flags, out_flags);
        if rc != ffi::SQLITE_OK || (*inner).pMethods.is_null() {
            (*wal).base.pMethods = std::ptr::null();
            return if rc == ffi::SQLITE_OK {
                ffi::SQLITE_CANTOPEN
            } else {
                rc
            };
        }
        wal.write(WalFile {
            base: ffi::sqlite3_file {
                pMethods: &raw const METHODS,
            },
            inner,
            pending: Vec::new(),
            start: 0,
            lost: None,
        });
        ffi::SQLITE_OK
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
    xLock: Some(vfsfile::lock::<WalFile>),
    xUnlock: Some(vfsfile::unlock::<WalFile>),
    xCheckReservedLock: Some(vfsfile::check_reserved_lock::<WalFile>),
    xFileControl: Some(file_control),
    xSectorSize: Some(vfsfile::sector_size::<WalFile>),
    xDeviceCharacteristics: Some(vfsfile::device_characteristics::<WalFile>),
    xShmMap: Some(vfsfile::shm_map::<WalFile>),
    xShmLock: Some(vfsfile::shm_lock::<WalFile>),
    xShmBarrier: Some(vfsfile::shm_barrier::<WalFile>),
    xShmUnmap: Some(vfsfile::shm_unmap::<WalFile>),
    xFetch: Some(fetch),
    xUnfetch: Some(unfetch),
};

/// The wrapper behind SQLite's handle.
///
/// # Safety
/// `f` must be a file opened by `open` with `METHODS`, not yet closed.
unsafe fn wal<'a>(f: *mut ffi::sqlite3_file) -> &'a mut WalFile {
    // SAFETY: per the contract; SQLite serializes calls on one file.
    unsafe { &mut *f.cast::<WalFile>() }
}

/// The default VFS's methods of the wrapped file.
///
/// # Safety
/// As for `wal`.
unsafe fn methods<'a>(w: &WalFile) -> &'a ffi::sqlite3_io_methods {
    // SAFETY: `open` checked that the default VFS set them.
    unsafe { &*(*w.inner).pMethods }
}

/// The most one forwarded write carries: the default VFS's write masks its length to 17 bits
/// (it never expects more than a page), so longer runs go out in pieces of this size.
const CHUNK: usize = 64 << 10;

/// Writes out the gathered appends.
///
/// # Safety
/// As for `wal`.
unsafe fn flush(w: &mut WalFile) -> c_int {
    // SAFETY: `wal`'s contract, which the caller holds.
    let Some(write) = (unsafe { methods(w) }).xWrite else {
        return ffi::SQLITE_IOERR_WRITE;
    };
    let mut rc = ffi::SQLITE_OK;
    let end = w.end();
    let mut at = w.start;
    for piece in w.pending.chunks(CHUNK) {
        // A piece is at most CHUNK bytes, so both conversions hold.
        let len = c_int::try_from(piece.len()).unwrap_or(c_int::MAX);
        // SAFETY: forwarding to the default VFS's xWrite on its own file.
        rc = unsafe { write(w.inner, piece.as_ptr().cast(), len, at) };
        WRITES.fetch_add(1, Ordering::Relaxed);
        if rc != ffi::SQLITE_OK {
            break;
        }
        at += i64::from(len);
    }
    // Dropped on failure too, and remembered as lost: every later write and sync of the
    // transaction fails, so it cannot commit, and SQLite writes the frames of any later
    // attempt again.
    if rc != ffi::SQLITE_OK {
        w.lost = Some(
            w.lost
                .map_or((w.start, end), |(s, e)| (s.min(w.start), e.max(end))),
        );
    }
    w.pending.clear();
    rc
}

unsafe extern "C" fn close(f: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: `f` is ours (METHODS); the wrapper is dropped once and SQLite does not use the
    // file after xClose.
    unsafe {
        let w = wal(f);
        // Whatever is still gathered belongs to no commit (a commit syncs, which writes it
        // out): dropped, never written.
        let closed = methods(w).xClose.map_or(ffi::SQLITE_OK, |x| x(w.inner));
        std::ptr::drop_in_place(&raw mut w.pending);
        closed
    }
}

unsafe extern "C" fn read(f: *mut ffi::sqlite3_file, buf: *mut c_void, n: c_int, at: i64) -> c_int {
    // SAFETY: `f` is ours; forwarding after writing out anything the read could overlap.
    unsafe {
        let w = wal(f);
        let end = w.end();
        if w.lost
            .is_some_and(|(s, e)| at < e && at.saturating_add(i64::from(n)) > s)
        {
            return ffi::SQLITE_IOERR_READ;
        }
        if !w.pending.is_empty() && at < end && at.saturating_add(i64::from(n)) > w.start {
            READ_FLUSHES.fetch_add(1, Ordering::Relaxed);
            let rc = flush(w);
            if rc != ffi::SQLITE_OK {
                return rc;
            }
        }
        methods(w)
            .xRead
            .map_or(ffi::SQLITE_IOERR_READ, |x| x(w.inner, buf, n, at))
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
        let w = wal(f);
        if w.lost.is_some() {
            return ffi::SQLITE_IOERR_WRITE;
        }
        let len = usize::try_from(n).unwrap_or(0);
        let end = w.end();
        if !w.pending.is_empty() && at != end {
            let rc = flush(w);
            if rc != ffi::SQLITE_OK {
                return rc;
            }
        }
        if w.pending.is_empty() {
            w.start = at;
        }
        APPENDS.fetch_add(1, Ordering::Relaxed);
        w.pending
            .extend_from_slice(std::slice::from_raw_parts(data.cast::<u8>(), len));
        if w.pending.len() >= LIMIT {
            return flush(w);
        }
        ffi::SQLITE_OK
    }
}

/// Forwards a call that does not touch the log's bytes.
macro_rules! forward {
    ($f:ident, $method:ident, $missing:expr $(, $arg:expr)*) => {{
        // SAFETY: `$f` is ours; forwarding to the default VFS's method on its own file.
        unsafe {
            let w = wal($f);
            methods(w).$method.map_or($missing, |x| x(w.inner $(, $arg)*))
        }
    }};
}

/// Forwards a call that must see the file as written: gathered appends go out first.
macro_rules! after_flush {
    ($f:ident, $($rest:tt)*) => {{
        // SAFETY: `$f` is ours.
        let rc = unsafe { flush(wal($f)) };
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        forward!($f, $($rest)*)
    }};
}

unsafe extern "C" fn truncate(f: *mut ffi::sqlite3_file, size: i64) -> c_int {
    after_flush!(f, xTruncate, ffi::SQLITE_IOERR_TRUNCATE, size)
}

unsafe extern "C" fn sync(f: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    // SAFETY: `f` is ours.
    if unsafe { wal(f) }.lost.is_some() {
        return ffi::SQLITE_IOERR_FSYNC;
    }
    after_flush!(f, xSync, ffi::SQLITE_IOERR_FSYNC, flags)
}

unsafe extern "C" fn file_size(f: *mut ffi::sqlite3_file, size: *mut i64) -> c_int {
    after_flush!(f, xFileSize, ffi::SQLITE_IOERR_FSTAT, size)
}

unsafe extern "C" fn file_control(f: *mut ffi::sqlite3_file, op: c_int, arg: *mut c_void) -> c_int {
    after_flush!(f, xFileControl, ffi::SQLITE_NOTFOUND, op, arg)
}

unsafe extern "C" fn fetch(
    f: *mut ffi::sqlite3_file,
    at: i64,
    n: c_int,
    out: *mut *mut c_void,
) -> c_int {
    // No mapping unless the default VFS gives one: SQLite then reads with xRead.
    // SAFETY: SQLite passes a valid out pointer.
    unsafe { *out = std::ptr::null_mut() };
    after_flush!(f, xFetch, ffi::SQLITE_OK, at, n, out)
}

unsafe extern "C" fn unfetch(f: *mut ffi::sqlite3_file, at: i64, p: *mut c_void) -> c_int {
    forward!(f, xUnfetch, ffi::SQLITE_OK, at, p)
}

mod discard;
#[cfg(test)]
mod tests;

pub(crate) use discard::{discard_pending, rollback_discard};
