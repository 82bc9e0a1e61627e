//! Files that must not be opened as they are: one that is no database, a database file lost
//! beside its log (which started empty would forget every key the log holds), and a schema a
//! later build migrated that it did not mark readable by this one.

use oncebox_core::{Event, Processed, Response};
use oncebox_sqlite::rusqlite::Connection;
use oncebox_sqlite::{Inbox, OpenError, Options};

use crate::harness::shop;

fn event(id: &str) -> Event {
    shop(id, r#"{"n":1}"#)
}

fn ok(tx: &mut oncebox_sqlite::Tx<'_>) -> Result<Response, oncebox_sqlite::HandlerError> {
    let _ = tx;
    Ok(Response::completed("done"))
}

#[test]
fn damaged_file_is_refused_not_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("o.db");
    std::fs::write(&path, vec![0x5a; 8192]).unwrap();
    let err = Inbox::open(Options::new(&path)).unwrap_err();
    assert!(matches!(err, OpenError::Sqlite { .. }), "{err:?}");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        vec![0x5a; 8192],
        "the file was left as it was"
    );
}

/// A database file lost or truncated beside its log (a restore that missed it, a truncation)
/// is refused: opened, SQLite would start an empty database over it, drop the log, and every
/// key the inbox had committed would be new again. The log is left as it was.
#[test]
fn a_database_file_lost_beside_its_log_is_refused_not_started_empty() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("o.db");
    let inbox = Inbox::open(Options::new(&path)).unwrap();
    assert!(matches!(
        inbox.process_blocking(event("k"), ok),
        Ok(Processed::Applied(_))
    ));
    // The state a crash leaves: the file and its log, the log holding the last commits.
    let log = std::fs::read(dir.path().join("o.db-wal")).unwrap();
    assert!(!log.is_empty(), "the commit is in the log");
    let file = std::fs::read(&path).unwrap();
    for (name, file_bytes) in [("missing.db", None), ("emptied.db", Some(Vec::new()))] {
        let lost = dir.path().join(name);
        let lost_log = dir.path().join(format!("{name}-wal"));
        std::fs::write(&lost_log, &log).unwrap();
        if let Some(bytes) = &file_bytes {
            std::fs::write(&lost, bytes).unwrap();
        }
        let err = Inbox::open(Options::new(&lost)).unwrap_err();
        assert!(
            matches!(err, OpenError::LostDatabase { log_bytes, .. } if log_bytes == log.len() as u64),
            "{name}: {err:?}"
        );
        assert!(err.to_string().contains("lost or truncated"), "{err}");
        assert_eq!(
            std::fs::read(&lost_log).unwrap(),
            log,
            "{name}: log untouched"
        );
        assert_eq!(
            std::fs::read(&lost).ok(),
            file_bytes,
            "{name}: nothing created"
        );
        // With the file back, the key is remembered.
        std::fs::write(&lost, &file).unwrap();
        let back = Inbox::open(Options::new(&lost)).unwrap();
        let again = back.process_blocking(event("k"), ok);
        assert!(
            matches!(again, Ok(Processed::Duplicate(_))),
            "{name}: {again:?}"
        );
    }
}

/// The same file lost under a running store: a reader opened after it refuses as `open` does,
/// and creates nothing. Before, it created an empty file, and its first read had SQLite delete
/// the log beside it, so that the next start found nothing to refuse and began an empty inbox.
#[test]
fn a_reader_opened_after_the_database_file_was_lost_creates_nothing() {
    for emptied in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("o.db");
        let wal = dir.path().join("o.db-wal");
        let inbox = Inbox::open(Options::new(&path)).unwrap();
        assert!(matches!(
            inbox.process_blocking(event("k"), ok),
            Ok(Processed::Applied(_))
        ));
        let log = std::fs::read(&wal).unwrap();
        assert!(!log.is_empty(), "the commit is in the log");
        if emptied {
            std::fs::write(&path, []).unwrap();
        } else {
            std::fs::remove_file(&path).unwrap();
        }
        // The pool has no reader yet: this read opens one.
        let read = inbox.read_blocking(|c| {
            c.query_row("SELECT count(*) FROM oncebox_inbox", [], |r| {
                r.get::<_, i64>(0)
            })
        });
        let Err(why) = read else {
            panic!("emptied {emptied}: read {read:?}");
        };
        assert!(why.to_string().contains("lost or truncated"), "{why}");
        let now = std::fs::read(&wal).unwrap_or_default();
        assert!(
            now == log,
            "emptied {emptied}: the log, {} bytes, is now {} bytes",
            log.len(),
            now.len()
        );
        assert_eq!(
            std::fs::read(&path).ok(),
            emptied.then(Vec::new),
            "emptied {emptied}: nothing created"
        );
    }
}

/// A file a later build migrated is refused unless that build marked it readable by this one
/// (`readable_from`): then it opens, with or without migrations, answers from what it holds and
/// stays at the later version.
#[test]
fn schema_newer_than_this_build_is_refused_unless_marked_readable_by_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("o.db");
    let inbox = Inbox::open(Options::new(&path)).unwrap();
    assert!(matches!(
        inbox.process_blocking(event("e1"), |_tx| Ok(Response::completed(b"ok".to_vec()))),
        Ok(Processed::Applied(_))
    ));
    drop(inbox);
    let db = Connection::open(&path).unwrap();
    let set = |sql: &str| db.execute(sql, []).unwrap();
    let kept = || -> i64 {
        db.query_row("SELECT version FROM oncebox_schema", [], |r| r.get(0))
            .unwrap()
    };
    let current = kept();
    // A later build whose steps keep this build's statements valid.
    set("UPDATE oncebox_schema SET version = version + 1");
    for migrate in [true, false] {
        let inbox = Inbox::open(Options::new(&path).migrate(migrate))
            .unwrap_or_else(|e| panic!("migrate {migrate}: {e}"));
        let again = inbox.process_blocking(event("e1"), |_tx| {
            Ok(Response::completed(b"twice".to_vec()))
        });
        assert!(matches!(again, Ok(Processed::Duplicate(_))), "{again:?}");
        drop(inbox);
        assert_eq!(kept(), current + 1, "left at the later version");
    }
    // One whose steps break this build, and one from before the mark.
    set("UPDATE oncebox_schema SET readable_from = version");
    let refused = Inbox::open(Options::new(&path)).unwrap_err();
    assert!(
        matches!(refused, OpenError::SchemaTooNew { found, known } if found == current + 1 && known == current),
        "{refused:?}"
    );
    set("UPDATE oncebox_schema SET version = 99, readable_from = NULL");
    let err = Inbox::open(Options::new(&path)).unwrap_err();
    assert!(
        matches!(err, OpenError::SchemaTooNew { found: 99, .. }),
        "{err:?}"
    );
}
