//! The gathering VFS against a real file: whole commits, spills read back, fewer writes.

use std::sync::atomic::Ordering;

use crate::options::{Durability, Options};
use crate::schema::{migrate, open_reader, open_writer};

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
    // A transaction larger than the cache spills frames mid-way and reads them back.
    let read_back = super::READ_FLUSHES.load(Ordering::Relaxed);
    writer.execute_batch("PRAGMA cache_size = 20").unwrap();
    writer
        .execute_batch(
            "BEGIN; UPDATE t SET v = zeroblob(500); INSERT INTO t SELECT randomblob(16), \
             v FROM t; COMMIT;",
        )
        .unwrap();
    let count = |c: &rusqlite::Connection| -> i64 {
        c.query_row("SELECT count(*) FROM t WHERE length(v) = 500", [], |r| {
            r.get(0)
        })
        .unwrap()
    };
    assert!(
        super::READ_FLUSHES.load(Ordering::Relaxed) > read_back,
        "no read met gathered frames (else this test proves nothing about them)"
    );
    let reader = open_reader(&options).unwrap();
    assert_eq!(count(&reader), 4000);
    drop(writer);
    let reopened = open_writer(&options).unwrap();
    assert_eq!(count(&reopened), 4000);
    let check: String = reopened
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
}
