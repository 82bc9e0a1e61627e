//! The schema version is oncebox's own (`oncebox_schema`), not SQLite's `user_version`, which
//! an application sharing the file keeps for its own migrator: whatever it holds, oncebox opens
//! the file and leaves it as it was. A file an earlier build versioned there is adopted.

use std::path::Path;

use oncebox_core::{Event, Processed, Response};
use oncebox_sqlite::rusqlite::Connection;
use oncebox_sqlite::{Inbox, OpenError, Options};

use crate::harness::shop;

/// The last version earlier builds kept in `user_version`.
const EARLIER: i64 = 7;

fn event() -> Event {
    shop("e1", r#"{"n":1}"#)
}

fn ok(tx: &mut oncebox_sqlite::Tx<'_>) -> Result<Response, oncebox_sqlite::HandlerError> {
    let _ = tx;
    Ok(Response::completed("done"))
}

fn user_version(path: &Path) -> i64 {
    Connection::open(path)
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap()
}

fn kept_version(path: &Path) -> Option<i64> {
    let c = Connection::open(path).unwrap();
    c.query_row("SELECT version FROM oncebox_schema", [], |r| r.get(0))
        .ok()
}

/// The version this build gives a new file.
fn current() -> i64 {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new.db");
    drop(Inbox::open(Options::new(&path)).unwrap());
    kept_version(&path).unwrap()
}

fn notes(path: &Path) -> Vec<String> {
    let c = Connection::open(path).unwrap();
    let mut q = c
        .prepare("SELECT body FROM app_notes ORDER BY rowid")
        .unwrap();
    q.query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// An application's file at `user_version` 0, 2, 5 or 99, with or without its own tables:
/// oncebox opens it, works, opens it again, and leaves `user_version` and the tables alone.
#[test]
fn an_applications_user_version_is_left_to_it() {
    for version in [0, 2, 5, 99] {
        for own_tables in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("app.db");
            let app = Connection::open(&path).unwrap();
            if own_tables {
                app.execute_batch(
                    "CREATE TABLE app_notes (body TEXT); INSERT INTO app_notes VALUES ('mine');",
                )
                .unwrap();
            }
            app.pragma_update(None, "user_version", version).unwrap();
            drop(app);
            let case = format!("user_version {version}, own tables {own_tables}");
            let inbox = Inbox::open(Options::new(&path)).unwrap_or_else(|e| panic!("{case}: {e}"));
            let out = inbox.process_blocking(event(), ok);
            assert!(matches!(out, Ok(Processed::Applied(_))), "{case}: {out:?}");
            drop(inbox);
            assert_eq!(user_version(&path), version, "{case}");
            let inbox = Inbox::open(Options::new(&path).migrate(false))
                .unwrap_or_else(|e| panic!("{case}, again: {e}"));
            let out = inbox.process_blocking(event(), ok);
            assert!(
                matches!(out, Ok(Processed::Duplicate(_))),
                "{case}: {out:?}"
            );
            drop(inbox);
            assert_eq!(user_version(&path), version, "{case}");
            if own_tables {
                assert_eq!(notes(&path), ["mine"], "{case}");
            }
        }
    }
}

/// A file an earlier build kept, versioned in `user_version`: opened without migrations it is
/// refused as outdated (later steps were added since) and nothing is written; the first open
/// that migrates moves its version into oncebox's table and runs the steps after it, and from
/// then on `user_version` is not read — the application may set it to anything.
#[test]
fn a_file_an_earlier_build_versioned_is_adopted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    let inbox = Inbox::open(Options::new(&path)).unwrap();
    assert!(matches!(
        inbox.process_blocking(event(), ok),
        Ok(Processed::Applied(_))
    ));
    drop(inbox);
    // As an earlier build left it.
    let c = Connection::open(&path).unwrap();
    c.execute_batch("DROP TABLE oncebox_schema").unwrap();
    c.pragma_update(None, "user_version", EARLIER).unwrap();
    drop(c);

    let looking = Inbox::open(Options::new(&path).migrate(false));
    let Err(OpenError::SchemaOutdated { found, known }) = looking else {
        panic!("opened without its later steps: {looking:?}");
    };
    assert_eq!(found, EARLIER);
    assert_eq!(
        kept_version(&path),
        None,
        "nothing written without migrations"
    );
    let inbox = Inbox::open(Options::new(&path)).unwrap();
    assert!(matches!(
        inbox.process_blocking(event(), ok),
        Ok(Processed::Duplicate(_))
    ));
    drop(inbox);
    assert_eq!(kept_version(&path), Some(known), "adopted and migrated");
    assert_eq!(user_version(&path), EARLIER, "left as it was");

    // The application's now: oncebox no longer reads it.
    for version in [0, 2, 99] {
        Connection::open(&path)
            .unwrap()
            .pragma_update(None, "user_version", version)
            .unwrap();
        let inbox = Inbox::open(Options::new(&path)).unwrap();
        assert!(matches!(
            inbox.process_blocking(event(), ok),
            Ok(Processed::Duplicate(_))
        ));
        drop(inbox);
        assert_eq!(user_version(&path), version);
    }
}

/// An earlier build's file whose `user_version` an application changed since: what oncebox's
/// tables show is its version, and the application's value stays.
#[test]
fn an_earlier_builds_file_renumbered_by_an_application_is_read_from_its_tables() {
    for version in [0, 2, 9, 99] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.db");
        drop(Inbox::open(Options::new(&path)).unwrap());
        let c = Connection::open(&path).unwrap();
        c.execute_batch("DROP TABLE oncebox_schema").unwrap();
        c.pragma_update(None, "user_version", version).unwrap();
        drop(c);
        let inbox = Inbox::open(Options::new(&path))
            .unwrap_or_else(|e| panic!("user_version {version}: {e}"));
        drop(inbox);
        // Read as the last version kept there, then migrated on from it.
        assert_eq!(
            kept_version(&path),
            Some(current()),
            "user_version {version}"
        );
        assert_eq!(user_version(&path), version);
    }
}

/// A path that names no file of its own is refused at the open, naming it: on `:memory:`, an
/// empty path or a `file:` URI every connection of the inbox gets a database of its own, and
/// none outlives the process, so every key would be new again after a restart.
#[test]
fn a_path_that_names_no_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("file:{}?mode=memory", dir.path().join("x.db").display());
    for path in [":memory:", "", "file::memory:", uri.as_str()] {
        match Inbox::open(Options::new(path)) {
            Err(e @ OpenError::NotAFile { .. }) => {
                assert!(e.to_string().contains("names no database file"), "{e}");
            }
            other => panic!("{path:?} opened: {:?}", other.map(|_| ())),
        }
    }
    // A file whose name holds `file:` past its start is a file like any other.
    let inside = dir.path().join("file:inbox.db");
    Inbox::open(Options::new(&inside)).unwrap();
    assert!(inside.exists());
}
