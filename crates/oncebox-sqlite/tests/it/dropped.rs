//! The last `Inbox` dropped on the writer thread itself: by a handler that captured a clone,
//! whose caller gave up and dropped its own. Joining the writer from there panicked ("Resource
//! deadlock avoided"), which rolled the handler's work back, and the checkpointer was never
//! joined.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use oncebox_core::{ProcessError, Response, Unavailable};
use oncebox_sqlite::rusqlite::Connection;
use oncebox_sqlite::{Inbox, Options};
use oncebox_testkit::run;

use crate::harness::shop;

/// Until the write-ahead log is gone: SQLite removes it when the last connection to the file
/// closes, the writer's, the checkpointer's and the readers' — so once both threads ended.
fn wait_closed(path: &Path) {
    let log = PathBuf::from(format!("{}-wal", path.display()));
    let until = Instant::now() + Duration::from_secs(10);
    while log.exists() {
        assert!(Instant::now() < until, "the file is still open");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn the_last_clone_dropped_by_a_handler_lets_it_commit_and_closes_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("o.db");
    run(async {
        let inbox = Inbox::open(Options::new(&path).deadline(Duration::from_millis(300))).unwrap();
        inbox
            .write(|c| c.execute_batch("CREATE TABLE effects (n INTEGER NOT NULL)"))
            .await
            .unwrap();
        let kept = inbox.clone();
        let (entered_tx, entered) = tokio::sync::oneshot::channel();
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let caller = inbox.clone();
        let call = tokio::spawn(async move {
            caller
                .process(shop("e1", r#"{"n":1}"#), move |tx| {
                    let _ = entered_tx.send(());
                    // Until its caller gave up and dropped every other clone.
                    let _ = wait.recv();
                    tx.conn()
                        .execute("INSERT INTO effects (n) VALUES (1)", [])?;
                    drop(kept);
                    Ok(Response::completed("done"))
                })
                .await
        });
        entered.await.expect("the writer runs the handler");
        let out = call.await.unwrap();
        // Its handler was running at the deadline: it may still commit.
        assert!(
            matches!(
                out,
                Err(ProcessError::Unavailable(Unavailable::CommitUnknown(_)))
            ),
            "{out:?}"
        );
        drop(inbox);
        go.send(()).unwrap();
    });
    wait_closed(&path);
    let c = Connection::open(&path).unwrap();
    let count = |sql: &str| -> i64 { c.query_row(sql, [], |r| r.get(0)).unwrap() };
    assert_eq!(
        count("SELECT count(*) FROM effects"),
        1,
        "the handler's work"
    );
    assert_eq!(
        count("SELECT count(*) FROM oncebox_inbox WHERE state = 'completed'"),
        1,
        "and its record"
    );
}
