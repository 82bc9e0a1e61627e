//! The gathering VFS against a real file: whole commits, spills read back, fewer writes.

use std::sync::atomic::Ordering;

use crate::options::{Durability, Options};
use crate::schema::{migrate, open_reader, open_writer};

/// SQLite's own check of the file, as seen by `conn`.
fn integrity(conn: &rusqlite::Connection) -> String {
    conn.query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap()
}

/// How many rows of `t` hold a value of each length, as `conn` reads them.
fn lengths(conn: &rusqlite::Connection) -> Vec<(i64, i64)> {
    conn.prepare("SELECT length(v), count(*) FROM t GROUP BY 1 ORDER BY 1")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// Commits through the gathering VFS are whole for a second connection and after reopening,
/// also when a transaction outgrows the writer's cache and SQLite reads its own unsynced
/// frames back; and the log's page writes really were gathered.
#[test]
fn gathered_commits_are_whole_and_fewer_writes_reach_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options::new(dir.path().join("gathered.db"));
    assert_eq!(options.durability, Durability::Full);
    let mut writer = open_writer(&options).unwrap();
    migrate(&mut writer, &options).unwrap();
    assert!(super::register());
    let (appends, writes) = (
        super::APPENDS.load(Ordering::Relaxed),
        super::WRITES.load(Ordering::Relaxed),
    );
    writer
        .execute_batch("CREATE TABLE t (k BLOB NOT NULL UNIQUE, v BLOB NOT NULL)")
        .unwrap();
    for round in 0..20 {
        writer
            .execute_batch(&format!(
                "BEGIN; INSERT INTO t SELECT randomblob(16), zeroblob(300) FROM \
                 (WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n \
                 WHERE i < 100) SELECT i FROM n); UPDATE t SET v = zeroblob({round}) \
                 WHERE rowid % 7 = 0; COMMIT;"
            ))
            .unwrap();
    }
    let gathered = super::APPENDS.load(Ordering::Relaxed) - appends;
    let written = super::WRITES.load(Ordering::Relaxed) - writes;
    assert!(
        written * 4 < gathered,
        "{gathered} appends went out in {written} writes"
    );
    // A transaction larger than the cache spills frames mid-way and reads them back: a value
    // of 500 pages, written as overflow pages in order, then read whole before the commit.
    let read_back = super::READ_FLUSHES.load(Ordering::Relaxed);
    writer
        .execute_batch("PRAGMA cache_size = 20; PRAGMA cache_spill = 10")
        .unwrap();
    writer
        .execute_batch(
            "BEGIN; INSERT INTO t VALUES (x'00', zeroblob(2000000));
             UPDATE t SET v = zeroblob(500) WHERE length(v) = 2000000; COMMIT;",
        )
        .unwrap();
    assert!(
        super::READ_FLUSHES.load(Ordering::Relaxed) > read_back,
        "no read met gathered frames (else this test proves nothing about them)"
    );
    let count = |c: &rusqlite::Connection| -> i64 {
        c.query_row("SELECT count(*) FROM t WHERE length(v) = 500", [], |r| {
            r.get(0)
        })
        .unwrap()
    };
    let reader = open_reader(&options).unwrap();
    assert_eq!(count(&reader), 1);
    drop(writer);
    let reopened = open_writer(&options).unwrap();
    assert_eq!(count(&reopened), 1);
    assert_eq!(integrity(&reopened), "ok");
}

/// Frames a rolled-back transaction spilled are dropped, not written later over the frames a
/// second connection committed at the same offsets in the meantime.
#[test]
fn frames_of_a_rolled_back_transaction_never_reach_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options::new(dir.path().join("rolled.db"));
    let mut writer = open_writer(&options).unwrap();
    migrate(&mut writer, &options).unwrap();
    writer
        .execute_batch(
            "CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB NOT NULL);
             INSERT INTO t WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n
               WHERE i < 2000) SELECT i, zeroblob(300) FROM n;",
        )
        .unwrap();
    // A transaction larger than the cache spills frames before its end (a value of 500 pages,
    // written as overflow pages in order), then rolls back.
    writer
        .execute_batch("PRAGMA cache_size = 20; PRAGMA cache_spill = 10")
        .unwrap();
    writer
        .execute_batch("BEGIN; INSERT INTO t VALUES (100000, zeroblob(2000000));")
        .unwrap();
    writer.execute_batch("ROLLBACK").unwrap();
    assert!(
        super::discard_pending(&writer) > 0,
        "the rollback left no gathered frames (else this test proves nothing)"
    );
    // Another connection commits where the spilled frames would have gone.
    let other = rusqlite::Connection::open(dir.path().join("rolled.db")).unwrap();
    other
        .execute_batch("UPDATE t SET v = zeroblob(302) WHERE k <= 1000")
        .unwrap();
    drop(other);
    // The first connection writes and reads on; everything the other committed is there.
    writer
        .execute_batch("UPDATE t SET v = zeroblob(303) WHERE k > 1900")
        .unwrap();
    let lengths = lengths(&writer);
    assert_eq!(lengths, [(300, 900), (302, 1000), (303, 100)]);
    assert_eq!(integrity(&writer), "ok");
}

/// As above, when SQLite ends the transaction by itself (`RAISE(ROLLBACK)` in a trigger) and
/// the code that ran the statement goes on reading: the writer's rollback hook drops the
/// gathered frames at once, before that read could write them out over the frames another
/// connection committed at the same offsets meanwhile.
#[test]
fn frames_of_a_transaction_sqlite_rolled_back_itself_are_dropped_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("raised.db");
    let options = Options::new(&path);
    let mut writer = open_writer(&options).unwrap();
    migrate(&mut writer, &options).unwrap();
    writer
        .execute_batch(
            "CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB NOT NULL);
             INSERT INTO t WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n
               WHERE i < 2000) SELECT i, zeroblob(300) FROM n;
             CREATE TRIGGER stop AFTER INSERT ON t WHEN new.k = 100000
               BEGIN SELECT RAISE(ROLLBACK, 'stopped'); END;
             PRAGMA cache_size = 20; PRAGMA cache_spill = 10;",
        )
        .unwrap();
    let _commits = crate::writer::Commits::guard(&writer);
    let discards = super::DISCARDS.get();
    writer.execute_batch("BEGIN").unwrap();
    // Spills frames (a value of 500 pages), then the trigger makes SQLite roll back.
    let raised = writer.execute("INSERT INTO t VALUES (100000, zeroblob(2000000))", []);
    assert!(raised.is_err(), "{raised:?}");
    assert!(writer.is_autocommit(), "SQLite ended the transaction");
    assert!(
        super::DISCARDS.get() > discards,
        "the rollback dropped no gathered frames (else this test proves nothing)"
    );
    assert_eq!(
        super::discard_pending(&writer),
        0,
        "dropped by the hook already"
    );
    let other = rusqlite::Connection::open(&path).unwrap();
    other
        .execute_batch("UPDATE t SET v = zeroblob(302) WHERE k <= 1000")
        .unwrap();
    drop(other);
    // The statement's code reads on; everything the other committed is there, whole.
    let lengths = lengths(&writer);
    assert_eq!(lengths, [(300, 1000), (302, 1000)]);
    assert_eq!(integrity(&writer), "ok");
}

/// A file under the wrapper whose writes fail on demand (`SQLITE_FULL`, a disk full for a
/// while) and otherwise land in memory.
#[repr(C)]
struct Fake {
    base: rusqlite::ffi::sqlite3_file,
    data: Vec<u8>,
}

static FAIL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

unsafe extern "C" fn fake_write(
    f: *mut rusqlite::ffi::sqlite3_file,
    data: *const std::ffi::c_void,
    n: std::ffi::c_int,
    at: i64,
) -> std::ffi::c_int {
    if FAIL.load(Ordering::SeqCst) {
        return rusqlite::ffi::SQLITE_FULL;
    }
    // SAFETY: `f` is the test's `Fake`; `data` holds `n` bytes.
    unsafe {
        let fake = &mut *f.cast::<Fake>();
        let (at, n) = (at as usize, n as usize);
        if fake.data.len() < at + n {
            fake.data.resize(at + n, 0);
        }
        let bytes = std::slice::from_raw_parts(data.cast::<u8>(), n);
        fake.data[at..at + n].copy_from_slice(bytes);
    }
    rusqlite::ffi::SQLITE_OK
}

unsafe extern "C" fn fake_read(
    f: *mut rusqlite::ffi::sqlite3_file,
    buf: *mut std::ffi::c_void,
    n: std::ffi::c_int,
    at: i64,
) -> std::ffi::c_int {
    // SAFETY: `f` is the test's `Fake`; `buf` has room for `n` bytes.
    unsafe {
        let fake = &*f.cast::<Fake>();
        let out = std::slice::from_raw_parts_mut(buf.cast::<u8>(), n as usize);
        for (i, b) in out.iter_mut().enumerate() {
            *b = fake.data.get(at as usize + i).copied().unwrap_or(0);
        }
    }
    rusqlite::ffi::SQLITE_OK
}

unsafe extern "C" fn fake_sync(
    _: *mut rusqlite::ffi::sqlite3_file,
    _: std::ffi::c_int,
) -> std::ffi::c_int {
    rusqlite::ffi::SQLITE_OK
}

static FAKE_METHODS: rusqlite::ffi::sqlite3_io_methods = rusqlite::ffi::sqlite3_io_methods {
    iVersion: 1,
    xRead: Some(fake_read),
    xWrite: Some(fake_write),
    xSync: Some(fake_sync),
    // SAFETY: every other method is an `Option` of a function pointer: zeroed, `None`.
    ..unsafe { std::mem::zeroed() }
};

/// Gathered appends that failed to go out when a read wrote them first (the read fails with
/// `SQLITE_FULL`, which SQLite takes for that statement's error alone) are lost for the rest of
/// the transaction: a read of them, any later write and the commit's sync fail, so the frames
/// SQLite counts written can never be read as garbage nor published by a commit. The
/// transaction's end forgets them.
#[test]
fn appends_that_failed_to_go_out_fail_the_rest_of_their_transaction() {
    use rusqlite::ffi;

    let mut fake = Fake {
        base: ffi::sqlite3_file {
            pMethods: &raw const FAKE_METHODS,
        },
        data: Vec::new(),
    };
    let mut w = super::WalFile {
        base: ffi::sqlite3_file {
            pMethods: &raw const super::METHODS,
        },
        inner: (&raw mut fake).cast(),
        pending: Vec::new(),
        start: 0,
        lost: None,
    };
    let f = (&raw mut w).cast::<ffi::sqlite3_file>();
    let page = [7u8; 100];
    let mut buf = [0u8; 50];
    // SAFETY: `f` is a `WalFile` over the test's `Fake`, both alive for the whole test.
    unsafe {
        assert_eq!(
            super::write(f, page.as_ptr().cast(), 100, 0),
            ffi::SQLITE_OK
        );
        assert_eq!(
            super::write(f, page.as_ptr().cast(), 100, 100),
            ffi::SQLITE_OK
        );
        FAIL.store(true, Ordering::SeqCst);
        let read = super::read(f, buf.as_mut_ptr().cast(), 50, 120);
        assert_eq!(
            read,
            ffi::SQLITE_FULL,
            "the read wrote the appends out first"
        );
        // Space is free again: nothing of the transaction goes on.
        FAIL.store(false, Ordering::SeqCst);
        let again = super::read(f, buf.as_mut_ptr().cast(), 50, 120);
        assert_eq!(again, ffi::SQLITE_IOERR_READ, "never the file's zeros");
        let more = super::write(f, page.as_ptr().cast(), 100, 200);
        assert_eq!(more, ffi::SQLITE_IOERR_WRITE);
        let sync = super::sync(f, ffi::SQLITE_SYNC_NORMAL);
        assert_eq!(sync, ffi::SQLITE_IOERR_FSYNC, "the commit cannot sync");
        // The rollback ends it.
        super::discard::drop_gathered(&mut *f.cast::<super::WalFile>());
        assert_eq!(
            super::write(f, page.as_ptr().cast(), 100, 0),
            ffi::SQLITE_OK
        );
        assert_eq!(super::sync(f, ffi::SQLITE_SYNC_NORMAL), ffi::SQLITE_OK);
        let read = super::read(f, buf.as_mut_ptr().cast(), 50, 20);
        assert_eq!((read, buf), (ffi::SQLITE_OK, [7u8; 50]));
    }
}
