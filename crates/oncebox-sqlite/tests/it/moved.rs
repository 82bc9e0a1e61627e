//! The database file deleted, moved away or replaced under an open store: in WAL mode SQLite
//! says nothing, and commits went on being answered as stored while checkpoints copied them
//! into a file no path names; all of it went with that file when the process ended. Now
//! nothing more is committed (the caller is told the storage is unavailable, and the store is
//! not ready), checkpoints stop so the log at the path keeps every commit, and the file put
//! back lets the store go on.

use oncebox_core::store::EventStore;
use oncebox_core::{Event, ProcessError, Processed, Response, Unavailable};
use oncebox_sqlite::{Inbox, OpenError, Options};

use crate::harness::shop;

fn event(id: &str) -> Event {
    shop(id, r#"{"n":1}"#)
}

fn ok(tx: &mut oncebox_sqlite::Tx<'_>) -> Result<Response, oncebox_sqlite::HandlerError> {
    let _ = tx;
    Ok(Response::completed("done"))
}

/// Asserts that `out` is the refusal of a moved file, naming `how`.
fn refused(out: Result<Processed, ProcessError>, how: &str) {
    match out {
        Err(ProcessError::Unavailable(Unavailable::Storage(why))) => {
            assert!(why.contains(how), "{why}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_database_file_moved_away_commits_nothing_until_it_is_back() {
    oncebox_testkit::run(async {
        let dir = tempfile::tempdir().unwrap();
        let (path, away) = (dir.path().join("o.db"), dir.path().join("away.db"));
        let inbox = Inbox::open(Options::new(&path)).unwrap();
        assert!(matches!(
            inbox.process(event("before"), ok).await,
            Ok(Processed::Applied(_))
        ));
        std::fs::rename(&path, &away).unwrap();
        refused(
            inbox.process(event("while"), ok).await,
            "deleted or moved away",
        );
        assert!(inbox.ready().await.is_err(), "not ready");
        // A copy put in its place is another file: still refused.
        std::fs::copy(&away, &path).unwrap();
        refused(inbox.process(event("while"), ok).await, "replaced");
        std::fs::rename(&away, &path).unwrap();
        // The file back: the refused event applies now, once.
        inbox.ready().await.expect("ready again");
        assert!(matches!(
            inbox.process(event("while"), ok).await,
            Ok(Processed::Applied(_))
        ));
        drop(inbox);
        let reopened = Inbox::open(Options::new(&path)).unwrap();
        for id in ["before", "while"] {
            let again = reopened.process(event(id), ok).await;
            assert!(
                matches!(again, Ok(Processed::Duplicate(_))),
                "{id}: {again:?}"
            );
        }
    });
}

/// Deleted for good: what comes after is refused, not answered as stored into the deleted
/// file; the log at the path keeps what was committed, and the next open refuses the missing
/// file beside it instead of starting an empty inbox.
#[test]
fn a_database_file_deleted_under_the_store_is_refused_at_the_next_open() {
    oncebox_testkit::run(async {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("o.db");
        let inbox = Inbox::open(Options::new(&path)).unwrap();
        assert!(matches!(
            inbox.process(event("before"), ok).await,
            Ok(Processed::Applied(_))
        ));
        std::fs::remove_file(&path).unwrap();
        refused(
            inbox.process(event("after"), ok).await,
            "deleted or moved away",
        );
        drop(inbox);
        let log = std::fs::metadata(dir.path().join("o.db-wal"))
            .unwrap()
            .len();
        assert!(log > 0, "the log keeps the store's commits");
        let err = Inbox::open(Options::new(&path)).unwrap_err();
        assert!(matches!(err, OpenError::LostDatabase { .. }), "{err:?}");
    });
}
