//! Two stores of one process on one file, one of them closed: the other keeps the lock on the
//! database every SQLite connection to a WAL file holds while open. The checkpointer synced
//! the file through a handle of its own, and closing that handle dropped every POSIX lock the
//! process held on the file (they belong to the process and the file, not to a handle), so
//! another process could take the file alone, checkpoint it and delete the log the remaining
//! store still committed into.

#![allow(unsafe_code, reason = "the lock is asked of the kernel, by fcntl")]

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

use oncebox_core::{Processed, Response};
use oncebox_sqlite::{Inbox, Options};
use oncebox_testkit::{event, run};

/// SQLite's unix locking: the shared lock is a read lock on these bytes.
const SHARED_FIRST: i64 = 0x4000_0000 + 2;
const SHARED_SIZE: i64 = 510;

/// Whether any process, this one included, holds a read lock on the database's shared range.
/// Asked through an open file description lock, which conflicts with this process's own POSIX
/// locks too; its handle is never closed, since closing it would drop those very locks.
fn shared_lock_held(path: &Path) -> bool {
    let file = File::open(path).unwrap();
    // SAFETY: a plain `flock` query on an open descriptor; every field is set or zero.
    let held = unsafe {
        let mut query: libc::flock = std::mem::zeroed();
        query.l_type = libc::F_WRLCK as libc::c_short;
        query.l_whence = libc::SEEK_SET as libc::c_short;
        query.l_start = SHARED_FIRST;
        query.l_len = SHARED_SIZE;
        let rc = libc::fcntl(file.as_raw_fd(), libc::F_OFD_GETLK, &mut query);
        assert_eq!(rc, 0, "F_OFD_GETLK: {}", std::io::Error::last_os_error());
        query.l_type == libc::F_RDLCK as libc::c_short
    };
    std::mem::forget(file);
    held
}

#[test]
fn closing_one_store_keeps_the_lock_the_other_holds_on_the_file() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("two.db");
        let first = Inbox::open(Options::new(&path)).unwrap();
        let second = Inbox::open(Options::new(&path)).unwrap();
        let applied = first
            .process(event("shop", "evt-1", 1), |_| Ok(Response::completed("ok")))
            .await;
        assert!(matches!(applied, Ok(Processed::Applied(_))), "{applied:?}");
        assert!(shared_lock_held(&path), "a store holds the shared lock");
        drop(second);
        assert!(
            shared_lock_held(&path),
            "the store still open lost its lock on the file when the other closed"
        );
        let applied = first
            .process(event("shop", "evt-2", 1), |_| Ok(Response::completed("ok")))
            .await;
        assert!(matches!(applied, Ok(Processed::Applied(_))), "{applied:?}");
    });
}
