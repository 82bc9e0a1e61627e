//! No duplicate is answered before the first delivery's COMMIT (G3: only a committed record
//! produces a replay). The first delivery of a key is held inside its transaction, just before
//! `COMMIT`; 49 more deliveries of the key arrive meanwhile and must all wait; released, the
//! first is applied and the 49 replay its answer. Also with a second handle on the same file
//! (another process, as the catalogue's two server processes are): its deliveries wait behind
//! the file's write lock the held transaction keeps. A test binary of its own: the failpoint
//! it arms is global to the process and would hold every other test's commits too; its two
//! tests take turns at it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::time::Duration;

use oncebox_core::store::{EventStore, Ingest};
use oncebox_core::{Event, Key, Processed};
use oncebox_sqlite::{Inbox, Options};

/// Held by the test arming the failpoint, so that the other waits instead of sharing it.
static FAILPOINT: Mutex<()> = Mutex::new(());

fn ingest() -> Ingest {
    Ingest {
        event: Event::json(Key::parse("shop", "evt-1").unwrap(), r#"{"n":1}"#).unwrap(),
        order: None,
        accepted: br#"{"status":"accepted"}"#.to_vec(),
        stale: Vec::new(),
        routes: Vec::new(),
    }
}

#[test]
fn no_replay_is_answered_before_the_first_deliverys_commit() {
    race(1);
}

#[test]
fn no_replay_is_answered_before_the_first_deliverys_commit_through_another_handle() {
    race(2);
}

/// The first delivery through the first of `handles` handles on one file, held before its
/// COMMIT; 49 more spread over the handles in turn.
fn race(handles: usize) {
    let _turn = FAILPOINT.lock().unwrap_or_else(PoisonError::into_inner);
    let dir = tempfile::tempdir().unwrap();
    let inboxes: Vec<Arc<Inbox>> = (0..handles)
        .map(|_| Arc::new(Inbox::open(Options::new(dir.path().join("o.db"))).unwrap()))
        .collect();
    // The writer, at its first `before-commit`, says so and waits for the release.
    let (reached, at_point) = mpsc::channel::<()>();
    let (release, released) = mpsc::channel::<()>();
    let released = Mutex::new(released);
    let first = AtomicBool::new(true);
    fail::cfg_callback("before-commit", move || {
        if first.swap(false, Ordering::SeqCst) {
            reached.send(()).unwrap();
            released.lock().unwrap().recv().unwrap();
        }
    })
    .unwrap();
    oncebox_testkit::run(async move {
        // Set just before the release: an answer that finds it unset came before the COMMIT.
        let open = Arc::new(AtomicBool::new(false));
        let spawn = |inbox: &Arc<Inbox>| {
            let (inbox, open) = (inbox.clone(), open.clone());
            tokio::spawn(async move {
                let answer = inbox.ingest(ingest()).await;
                (answer, open.load(Ordering::SeqCst))
            })
        };
        let winner = spawn(&inboxes[0]);
        tokio::task::spawn_blocking(move || at_point.recv_timeout(Duration::from_secs(30)))
            .await
            .unwrap()
            .expect("the first delivery reached the point before its COMMIT");
        let others: Vec<_> = (0..49).map(|i| spawn(&inboxes[i % handles])).collect();
        // The first handle's: each has either passed every look at committed state and waits
        // for its held writer, or been answered (which the checks below refuse). Another
        // handle's writer takes a batch and waits for the file's write lock; the rest of its
        // requests queue behind it: one queued there shows its requests met the held one.
        let on_first = others.iter().step_by(handles).collect::<Vec<_>>();
        let waited = tokio::time::timeout(Duration::from_secs(30), async {
            while inboxes[0].queued() + on_first.iter().filter(|o| o.is_finished()).count()
                < on_first.len()
                || inboxes[1..].iter().any(|other| other.queued() == 0)
            {
                tokio::task::yield_now().await;
            }
        });
        waited
            .await
            .expect("the requests reached their writers' queues or were answered");
        for inbox in &inboxes {
            assert_eq!(inbox.stats().commits(), 0, "nothing committed yet");
        }
        open.store(true, Ordering::SeqCst);
        release.send(()).unwrap();
        let (won, after) = winner.await.unwrap();
        assert!(after, "the first delivery was answered before its COMMIT");
        let Processed::Applied(answer) = won.unwrap() else {
            panic!("the first delivery is applied");
        };
        for other in others {
            let (got, after) = other.await.unwrap();
            assert!(
                after,
                "a replay was answered before the first delivery's COMMIT"
            );
            match got.unwrap() {
                Processed::Duplicate(replay) => assert_eq!(replay, answer),
                got => panic!("a later delivery replays the first: {got:?}"),
            }
        }
        assert!(inboxes[0].stats().commits() >= 1);
    });
    fail::remove("before-commit");
}
