//! The WAL is started over under writes that never pause (`checkpoint.rs`): the checkpointer
//! catches up, the writer copies the rest between batches, and nothing written is lost; a
//! reader holding an old snapshot keeps the log as it is until it lets go.

use std::path::Path;

use oncebox_core::store::{EventStore, Ingest};
use oncebox_core::{Event, Key, Processed};
use oncebox_sqlite::{Inbox, Options};
use oncebox_testkit::run;

const WRITERS: usize = 16;
const EACH: usize = 100;

fn ingest(id: &str) -> Ingest {
    Ingest {
        event: Event::json(Key::parse("shop", id).unwrap(), r#"{"n":1}"#).unwrap(),
        order: None,
        accepted: b"accepted".to_vec(),
        stale: Vec::new(),
        routes: Vec::new(),
    }
}

/// `WRITERS` callers each ingesting `EACH` new keys back to back, so the writer always has
/// a batch waiting; `round` keeps the keys of several calls apart.
async fn steady_writes(inbox: &Inbox, round: usize) {
    let callers = (0..WRITERS).map(|c| {
        let inbox = inbox.clone();
        tokio::spawn(async move {
            for i in 0..EACH {
                let done = inbox.ingest(ingest(&format!("r{round}-c{c}-{i}"))).await;
                assert!(matches!(done, Ok(Processed::Applied(_))), "{done:?}");
            }
        })
    });
    for caller in callers.collect::<Vec<_>>() {
        caller.await.unwrap();
    }
}

fn stored(path: &Path) -> i64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    let ok: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok");
    conn.query_row("SELECT count(*) FROM oncebox_inbox", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn the_log_starts_over_under_steady_writes_and_keeps_every_commit() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("o.db");
        // A short restart length, so that the test's few hundred commits pass it many times.
        let inbox = Inbox::open(Options::new(&path).wal_restart_frames(64)).unwrap();
        steady_writes(&inbox, 0).await;
        let stats = inbox.stats();
        assert!(
            stats.log_restarts() > 0,
            "no restart in {} commits",
            stats.commits()
        );
        // The checkpointer only asks for one after a pass found the log this long.
        assert!(stats.commits() >= 64, "{} commits", stats.commits());
        drop(inbox);
        assert_eq!(stored(&path), (WRITERS * EACH) as i64);
    });
}

#[test]
fn a_reader_holding_an_old_snapshot_keeps_the_log_until_it_lets_go() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("o.db");
        let inbox = Inbox::open(Options::new(&path).wal_restart_frames(64)).unwrap();
        inbox.ingest(ingest("first")).await.unwrap();
        // An open read transaction on the first commit's snapshot: no pass may copy past it,
        // so nothing can start the log over.
        let reader = rusqlite::Connection::open(&path).unwrap();
        reader.execute_batch("BEGIN").unwrap();
        let seen: i64 = reader
            .query_row("SELECT count(*) FROM oncebox_inbox", [], |r| r.get(0))
            .unwrap();
        assert_eq!(seen, 1);
        steady_writes(&inbox, 0).await;
        assert_eq!(inbox.stats().log_restarts(), 0);
        let still: i64 = reader
            .query_row("SELECT count(*) FROM oncebox_inbox", [], |r| r.get(0))
            .unwrap();
        assert_eq!(still, 1, "the snapshot held");
        reader.execute_batch("COMMIT").unwrap();
        steady_writes(&inbox, 1).await;
        assert!(inbox.stats().log_restarts() > 0);
        drop(reader);
        drop(inbox);
        assert_eq!(stored(&path), (2 * WRITERS * EACH + 1) as i64);
    });
}
