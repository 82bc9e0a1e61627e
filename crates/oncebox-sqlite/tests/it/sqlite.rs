//! SQLite-specific behaviour: busy and locked files, deadlines, group commit, several writers on
//! one file (files that must not be opened: `refused.rs`).

use std::sync::Arc;
use std::time::Duration;

use oncebox_core::store::EventStore;
use oncebox_core::{Event, ProcessError, Processed, Response, Unavailable};
use oncebox_sqlite::rusqlite::Connection;
use oncebox_sqlite::{Inbox, Options};
use oncebox_testkit::run;
use oncebox_testkit::writer::hold_writer;

use crate::harness::{ingest, shop};
use tokio::sync::Barrier;

fn event(id: &str) -> Event {
    shop(id, r#"{"n":1}"#)
}

fn ok(tx: &mut oncebox_sqlite::Tx<'_>) -> Result<Response, oncebox_sqlite::HandlerError> {
    let _ = tx;
    Ok(Response::completed("done"))
}

/// Takes SQLite's write lock on another connection, as another process would.
fn hold_write_lock(path: &std::path::Path) -> Connection {
    let c = Connection::open(path).unwrap();
    c.execute_batch("BEGIN IMMEDIATE").unwrap();
    c
}

#[test]
fn locked_database_answers_unavailable_for_uncommitted_keys_and_replays_committed_ones() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("o.db");
        let inbox =
            Inbox::open(Options::new(&path).busy_timeout(Duration::from_millis(50))).unwrap();
        inbox.process(event("done"), ok).await.unwrap();
        let lock = hold_write_lock(&path);
        // A key not committed cannot be answered while the writer is locked out: unavailable,
        // never a guess.
        let out = inbox.process(event("new"), ok).await;
        assert!(
            matches!(out, Err(ProcessError::Unavailable(Unavailable::Busy))),
            "{out:?}"
        );
        assert!(
            inbox.stats().failed_batches() >= 1,
            "the lock was really hit"
        );
        // A committed key is answered from its record, read back from the database.
        let out = inbox.process(event("done"), ok).await;
        assert_eq!(
            out.unwrap(),
            Processed::Duplicate(Response::completed("done"))
        );
        drop(lock);
        assert!(
            inbox
                .process(event("done"), ok)
                .await
                .unwrap()
                .is_duplicate()
        );
        assert!(matches!(
            inbox.process(event("new"), ok).await,
            Ok(Processed::Applied(_))
        ));
    });
}

/// The gateway's ingest after a run of new keys has stopped looking on a reader first (every
/// look missed): with the writer locked out, a committed key is still replayed and a new one is
/// still unavailable.
#[test]
fn ingest_replays_committed_keys_under_a_lock_after_looks_stopped_paying() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("o.db");
        // Without the memory of recent answers, which would answer every replay here.
        let options = Options::new(&path)
            .busy_timeout(Duration::from_millis(50))
            .recent_answers(0);
        let inbox = Inbox::open(options).unwrap();
        for i in 0..64 {
            let out = inbox.ingest(ingest(event(&format!("new-{i}")))).await;
            assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
        }
        let lock = hold_write_lock(&path);
        let failed = inbox.stats().failed_batches();
        for i in 0..64 {
            let out = inbox.ingest(ingest(event(&format!("new-{i}")))).await;
            assert_eq!(
                out.unwrap(),
                Processed::Duplicate(Response::completed("accepted"))
            );
        }
        assert!(
            inbox.stats().failed_batches() > failed,
            "some replays met the locked writer: the look was really skipped"
        );
        let out = inbox.ingest(ingest(event("never"))).await;
        assert!(
            matches!(out, Err(ProcessError::Unavailable(Unavailable::Busy))),
            "{out:?}"
        );
        drop(lock);
    });
}

/// Once new keys have stopped the reader looks, retries coming back reopen them through the
/// writer's answers alone: after a bounded run of duplicates answered by the writer, the rest
/// are answered by a reader without reaching the writer at all.
#[test]
fn duplicates_the_writer_answers_reopen_the_reader_looks() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        // Without the memory of recent answers, which would answer every retry here.
        let options = Options::new(dir.path().join("o.db")).recent_answers(0);
        let inbox = Inbox::open(options).unwrap();
        for i in 0..64 {
            let out = inbox.ingest(ingest(event(&format!("k-{i}")))).await;
            assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
        }
        let written = inbox.stats().committed_requests();
        assert_eq!(written, 64, "every new key went through the writer");
        for i in 0..64 {
            let out = inbox.ingest(ingest(event(&format!("k-{i}")))).await;
            assert_eq!(
                out.unwrap(),
                Processed::Duplicate(Response::completed("accepted"))
            );
        }
        let by_writer = inbox.stats().committed_requests() - written;
        assert!(
            (1..=32).contains(&by_writer),
            "the first retries met the closed gate and the writer answered them, then the \
             looks resumed: {by_writer} of 64 went to the writer"
        );
        let before = inbox.stats().committed_requests();
        for i in 0..16 {
            let out = inbox.ingest(ingest(event(&format!("k-{i}")))).await;
            assert!(out.unwrap().is_duplicate());
        }
        assert_eq!(
            inbox.stats().committed_requests(),
            before,
            "with the gate open, duplicates are answered by a reader"
        );
    });
}

#[test]
fn request_past_its_deadline_is_unavailable_and_writes_nothing() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("o.db");
        // The deadline is well past SQLite's longest busy-handler sleep (100 ms): once the
        // lock is dropped, the writer wakes and reaches the next request within it.
        let options = Options::new(&path)
            .busy_timeout(Duration::from_secs(20))
            .deadline(Duration::from_secs(1));
        let inbox = Inbox::open(options).unwrap();
        let lock = hold_write_lock(&path);
        let out = inbox.process(event("late"), ok).await;
        assert!(
            matches!(out, Err(ProcessError::Unavailable(Unavailable::Deadline))),
            "{out:?}"
        );
        drop(lock);
        // Requests are served in order: once this one is answered the late one was handled.
        assert!(matches!(
            inbox.process(event("after"), ok).await,
            Ok(Processed::Applied(_))
        ));
        assert!(
            inbox.record(&event("late").key).await.unwrap().is_none(),
            "nothing written"
        );
        assert!(matches!(
            inbox.process(event("late"), ok).await,
            Ok(Processed::Applied(_))
        ));
    });
}

#[test]
fn concurrent_requests_share_commits() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let inbox = Inbox::open(Options::new(dir.path().join("o.db"))).unwrap();
        const N: usize = 64;
        let barrier = Arc::new(Barrier::new(N));
        let tasks: Vec<_> = (0..N)
            .map(|i| {
                let (inbox, barrier) = (inbox.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    inbox.process(event(&format!("e{i}")), ok).await
                })
            })
            .collect();
        for t in tasks {
            assert!(matches!(t.await.unwrap(), Ok(Processed::Applied(_))));
        }
        let stats = inbox.stats();
        assert_eq!(stats.committed_requests(), N as u64);
        assert!(
            stats.commits() < N as u64,
            "{} commits for {N} requests",
            stats.commits()
        );
    });
}

#[test]
fn two_writers_on_one_file_apply_a_key_once() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("o.db");
        let a = Inbox::open(Options::new(&path)).unwrap();
        let b = Inbox::open(Options::new(&path)).unwrap();
        a.write(|c| c.execute_batch("CREATE TABLE effects (n INTEGER)"))
            .await
            .unwrap();
        // The file's write lock held (through `a`'s writer) until all 40 are handed to their
        // stores: none can be answered before every one was sent, however the runtime is
        // scheduled. Sent as they were polled, the other store's requests sometimes all left
        // after the winner was answered, and nothing overlapped.
        let hold = hold_writer(&a).await;
        let sent = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let requests: Vec<_> = (0..40)
            .map(|i| {
                let inbox = if i % 2 == 0 { a.clone() } else { b.clone() };
                let sent = sent.clone();
                tokio::spawn(async move {
                    sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    inbox
                        .process(event("shared"), |tx| {
                            tx.conn().execute("INSERT INTO effects VALUES (1)", [])?;
                            Ok(Response::completed("once"))
                        })
                        .await
                })
            })
            .collect();
        // Sent, and waiting in both stores at once: `a`'s behind its held writer, `b`'s behind
        // the file's write lock that writer holds.
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while sent.load(std::sync::atomic::Ordering::SeqCst) < 40
            || a.queued() == 0
            || b.queued() == 0
        {
            assert!(
                std::time::Instant::now() < until,
                "the requests were not all held"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        drop(hold);
        let mut applied = 0;
        for request in requests {
            match request.await.unwrap() {
                Ok(Processed::Applied(_)) => applied += 1,
                Ok(Processed::Duplicate(r)) => assert_eq!(r, Response::completed("once")),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(applied, 1);
        let effects: i64 = a
            .read(|c| c.query_row("SELECT count(*) FROM effects", [], |r| r.get(0)))
            .await
            .unwrap();
        assert_eq!(effects, 1);
    });
}

#[test]
fn blocking_and_async_callers_share_one_inbox() {
    let dir = tempfile::tempdir().unwrap();
    let inbox = Inbox::open(Options::new(dir.path().join("o.db"))).unwrap();
    assert!(matches!(
        inbox.process_blocking(event("b"), ok),
        Ok(Processed::Applied(_))
    ));
    run(async move {
        assert!(inbox.process(event("b"), ok).await.unwrap().is_duplicate());
    });
}

/// A request that panics on the writer (a closure given to `write`) fails, its work rolled
/// back, and the writer goes on serving: the panic used to end the writer thread, after which
/// every request of the process was refused as closed.
#[test]
fn a_panic_on_the_writer_fails_its_request_and_the_writer_goes_on() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let inbox = Inbox::open(Options::new(dir.path().join("o.db"))).unwrap();
        let out = inbox
            .write(|c| {
                c.execute_batch("CREATE TABLE half (n INTEGER)")?;
                panic!("a request's own bug");
                #[allow(unreachable_code)]
                Ok(())
            })
            .await;
        assert!(out.is_err(), "{out:?}");
        let out = inbox.process(event("after"), ok).await;
        assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
        let half = inbox
            .write(|c| {
                c.query_row(
                    "SELECT count(*) FROM sqlite_master WHERE name = 'half'",
                    [],
                    |r| r.get::<_, i64>(0),
                )
            })
            .await
            .unwrap();
        assert_eq!(half, 0, "the panicking request's work was rolled back");
    });
}
