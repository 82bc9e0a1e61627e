//! What the VFS wrappers here share: the file methods they hand to the platform VFS's file
//! untouched (locks, shared memory, sector size, device characteristics).

#![allow(unsafe_code, reason = "SQLite's VFS interface is a C vtable")]

use std::ffi::{c_int, c_void};

use rusqlite::ffi;

/// A VFS file that wraps one of the platform VFS.
///
/// # Safety
/// For a file opened by the implementor's `xOpen` and not yet closed, [`Wrapper::inner`] must
/// return the wrapped file, whose methods the platform VFS set.
pub(crate) unsafe trait Wrapper {
    /// The wrapped file.
    ///
    /// # Safety
    /// `f` must be a file of this wrapper, opened and not yet closed.
    unsafe fn inner(f: *mut ffi::sqlite3_file) -> *mut ffi::sqlite3_file;
}

/// Defines a method that forwards to the wrapped file's own, or answers `$missing` when the
/// platform VFS has none.
macro_rules! forward {
    ($name:ident($($arg:ident: $ty:ty),*) -> $ret:ty, $method:ident, $missing:expr) => {
        pub(crate) unsafe extern "C" fn $name<W: Wrapper>(
            f: *mut ffi::sqlite3_file
            $(, $arg: $ty)*
        ) -> $ret {
            // SAFETY: SQLite calls this through W's methods, on W's open file; the call goes
            // to the platform VFS's method on its own file.
            unsafe {
                let inner = W::inner(f);
                (*(*inner).pMethods).$method.map_or($missing, |x| x(inner $(, $arg)*))
            }
        }
    };
}

forward!(lock(level: c_int) -> c_int, xLock, ffi::SQLITE_OK);
forward!(unlock(level: c_int) -> c_int, xUnlock, ffi::SQLITE_OK);
forward!(check_reserved_lock(out: *mut c_int) -> c_int, xCheckReservedLock, ffi::SQLITE_OK);
forward!(sector_size() -> c_int, xSectorSize, 4096);
forward!(device_characteristics() -> c_int, xDeviceCharacteristics, 0);
forward!(
    shm_map(page: c_int, size: c_int, extend: c_int, out: *mut *mut c_void) -> c_int,
    xShmMap,
    ffi::SQLITE_IOERR_SHMMAP
);
forward!(
    shm_lock(offset: c_int, n: c_int, flags: c_int) -> c_int,
    xShmLock,
    ffi::SQLITE_IOERR_SHMLOCK
);
forward!(shm_unmap(delete: c_int) -> c_int, xShmUnmap, ffi::SQLITE_OK);

pub(crate) unsafe extern "C" fn shm_barrier<W: Wrapper>(f: *mut ffi::sqlite3_file) {
    // SAFETY: as for the forwarded methods above.
    unsafe {
        let inner = W::inner(f);
        if let Some(x) = (*(*inner).pMethods).xShmBarrier {
            x(inner);
        }
    }
}
