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
