//! The WAL is started over under writes that never pause (`checkpoint.rs`): the checkpointer
//! catches up, the writer copies the rest between batches, and nothing written is lost; a
//! reader holding an old snapshot keeps the log as it is until it lets go.

use std::path::Path;

use oncebox_core::Processed;
use oncebox_core::store::{EventStore, Ingest};
use oncebox_sqlite::{Inbox, Options};
use oncebox_testkit::run;

use crate::harness::{self, shop};

const WRITERS: usize = 16;
const EACH: usize = 100;

fn ingest(id: &str) -> Ingest {
    harness::ingest(shop(id, r#"{"n":1}"#))
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

/// Rounds of steady writes until the writer has started the log over once, at most
/// `MAX_ROUNDS`; returns how many rounds that took. A round is real work, not a wait: the
/// checkpointer is woken every 64 commits and the writer acts on its request between two
/// batches, so how many commits one restart needs depends on how the threads are scheduled.
async fn writes_until_restart(inbox: &Inbox, first_round: usize) -> usize {
    let before = inbox.stats().log_restarts();
    for round in 0..MAX_ROUNDS {
        steady_writes(inbox, first_round + round).await;
        if inbox.stats().log_restarts() > before {
            return round + 1;
        }
    }
    panic!(
        "no restart in {MAX_ROUNDS} rounds, {} commits",
        inbox.stats().commits()
    );
}

const MAX_ROUNDS: usize = 50;
/// Rounds written while a reader holds its snapshot.
const HELD_ROUNDS: usize = 5;

fn stored(path: &Path) -> i64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    let ok: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok");
    conn.query_row("SELECT count(*) FROM oncebox_inbox", [], |r| r.get(0))
        .unwrap()
}

/// An inbox in a fresh directory with a short restart length, so that a test's few hundred
/// commits pass it many times.
fn short_log() -> (tempfile::TempDir, std::path::PathBuf, Inbox) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("o.db");
    let inbox = Inbox::open(Options::new(&path).wal_restart_frames(64)).unwrap();
    (dir, path, inbox)
}

#[test]
fn the_log_starts_over_under_steady_writes_and_keeps_every_commit() {
    run(async {
        let (_dir, path, inbox) = short_log();
        let rounds = writes_until_restart(&inbox, 0).await;
        // The checkpointer is first woken after 64 commits.
        let commits = inbox.stats().commits();
        assert!(commits >= 64, "{commits} commits");
        drop(inbox);
        assert_eq!(stored(&path), (rounds * WRITERS * EACH) as i64);
    });
}

#[test]
fn a_reader_holding_an_old_snapshot_keeps_the_log_until_it_lets_go() {
    run(async {
        let (_dir, path, inbox) = short_log();
        inbox.ingest(ingest("first")).await.unwrap();
        // An open read transaction on the first commit's snapshot: no pass may copy past it,
        // so nothing can start the log over.
        let reader = rusqlite::Connection::open(&path).unwrap();
        reader.execute_batch("BEGIN").unwrap();
        let seen: i64 = reader
            .query_row("SELECT count(*) FROM oncebox_inbox", [], |r| r.get(0))
            .unwrap();
        assert_eq!(seen, 1);
        // As many rounds as the other test needs for a restart, usually several times over.
        for round in 0..HELD_ROUNDS {
            steady_writes(&inbox, round).await;
        }
        assert_eq!(inbox.stats().log_restarts(), 0);
        let still: i64 = reader
            .query_row("SELECT count(*) FROM oncebox_inbox", [], |r| r.get(0))
            .unwrap();
        assert_eq!(still, 1, "the snapshot held");
        reader.execute_batch("COMMIT").unwrap();
        let rounds = writes_until_restart(&inbox, HELD_ROUNDS).await;
        drop(reader);
        drop(inbox);
        assert_eq!(
            stored(&path),
            ((HELD_ROUNDS + rounds) * WRITERS * EACH + 1) as i64
        );
    });
}

/// A duplicate's look keeps its snapshot for the next look (`read/looks.rs`). Once the looks
/// stop (new keys close the gate), the checkpointer ends that snapshot, or it would keep the
/// log from starting over like the reader above.
#[test]
fn a_look_left_idle_does_not_keep_the_log_from_starting_over() {
    run(async {
        let (dir, path, inbox) = short_log();
        inbox.ingest(ingest("first")).await.unwrap();
        drop(inbox);
        // Reopened, the memory of recent answers is empty: the retry is answered by a look.
        let inbox = Inbox::open(Options::new(&path).wal_restart_frames(64)).unwrap();
        let again = inbox.ingest(ingest("first")).await.unwrap();
        assert!(matches!(again, Processed::Duplicate(_)), "{again:?}");
        assert_eq!(inbox.stats().answered_from_memory(), 0);
        let rounds = writes_until_restart(&inbox, 0).await;
        drop(inbox);
        assert_eq!(stored(&path), (rounds * WRITERS * EACH + 1) as i64);
        drop(dir);
    });
}
