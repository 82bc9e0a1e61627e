//! A relay's claim, a two-phase lease and the writer's deadline: a claim or a lease the writer
//! started before its deadline, in a batch that commits after it, is answered (answered
//! `Deadline`, a claim's rows would stay `in_flight` under tokens no one holds, to be taken
//! over later as possibly sent, and a lease would hold its key for its TTL, held by nobody,
//! then be taken over as a call that may have happened); one the writer had not started by
//! then is given up and changes nothing; so is a `release`. A handler still running at its
//! deadline is told its outcome is unknown.

use std::time::{Duration, Instant};

use oncebox_core::relay_store::DeliveryStore;
use oncebox_core::store::{EventStore, Ingest};
use oncebox_core::{Begun, ManualClock, ProcessError, Processed, Response, Unavailable};
use oncebox_sqlite::{Inbox, Options};
use oncebox_testkit::writer::{hold_writer, queued};
use oncebox_testkit::{EPOCH, event, run};

const DEADLINE: Duration = Duration::from_millis(300);
const LEASE: Duration = Duration::from_secs(30);

async fn routed_event(dir: &tempfile::TempDir) -> Inbox {
    let options = Options::new(dir.path().join("d.db"))
        .clock(std::sync::Arc::new(ManualClock::new(EPOCH)))
        .deadline(DEADLINE);
    let inbox = Inbox::open(options).unwrap();
    let ingest = Ingest {
        event: event("shop", "evt-1", 1),
        order: None,
        accepted: b"accepted".to_vec(),
        stale: Vec::new(),
        routes: vec!["a".into()],
    };
    inbox.ingest(ingest).await.expect("stored");
    inbox
}

#[test]
fn a_claim_committed_after_its_deadline_is_answered_with_its_rows() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let inbox = routed_event(&dir).await;
        let gate = hold_writer(&inbox).await;
        let asked = Instant::now();
        let claimer = inbox.clone();
        let claim =
            tokio::spawn(async move { claimer.claim(EPOCH, 10, LEASE, &["a".to_owned()]).await });
        queued(&inbox, 1).await;
        // Behind the claim, in its batch, a request slower than the claim's deadline.
        let slow = inbox.clone();
        tokio::spawn(async move {
            let _ = slow
                .write(|_| {
                    std::thread::sleep(2 * DEADLINE);
                    Ok(())
                })
                .await;
        });
        queued(&inbox, 2).await;
        gate.send(()).unwrap();
        let claimed = claim.await.unwrap().expect("the claim's own answer");
        assert!(
            asked.elapsed() > DEADLINE,
            "its batch committed after the deadline"
        );
        assert_eq!(claimed.len(), 1);
    });
}

#[test]
fn a_claim_not_started_by_its_deadline_changes_nothing() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let inbox = routed_event(&dir).await;
        let gate = hold_writer(&inbox).await;
        let given_up = inbox.claim(EPOCH, 10, LEASE, &["a".to_owned()]).await;
        assert!(
            matches!(given_up, Err(Unavailable::Deadline)),
            "{given_up:?}"
        );
        drop(gate);
        let later = inbox
            .claim(EPOCH, 10, LEASE, &["a".to_owned()])
            .await
            .expect("claim");
        assert_eq!(later.len(), 1, "still pending");
        assert!(!later[0].taken_over);
    });
}

/// With the writer held and one request queued: a second request, queued behind it, that
/// holds the writer once it runs it; the first's deadline then passes (shown by a request asked
/// after it, answered `Deadline`) while its batch is held. Returns what releases the batch.
async fn hold_past_the_deadline(
    inbox: &Inbox,
    gate: std::sync::mpsc::Sender<()>,
) -> std::sync::mpsc::Sender<()> {
    let blocking = inbox.clone();
    let blocker = tokio::spawn(async move { hold_writer(&blocking).await });
    queued(inbox, 2).await;
    gate.send(()).unwrap();
    let release = blocker.await.unwrap();
    let later = inbox.write(|_| Ok(())).await;
    assert!(
        matches!(
            later,
            Err(oncebox_sqlite::Error::Unavailable(Unavailable::Deadline))
        ),
        "{later:?}"
    );
    release
}

/// A `release` whose batch a later request holds past its deadline is answered with what it
/// did (`Ok`, the key free), not `Deadline`: told `Deadline`, its holder's retry found the key
/// gone and was told `Fenced`, though its own release had taken effect.
#[test]
fn a_release_committed_after_its_deadline_is_answered_as_done() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let inbox = routed_event(&dir).await;
        let begun = inbox.begin(event("shop", "evt-3", 1), LEASE).await;
        let Ok(Begun::Leased(lease)) = begun else {
            panic!("a new key is leased: {begun:?}");
        };
        let gate = hold_writer(&inbox).await;
        let releasing = inbox.clone();
        let asked = Instant::now();
        let released = tokio::spawn(async move { releasing.release(&lease).await });
        queued(&inbox, 1).await;
        let release = hold_past_the_deadline(&inbox, gate).await;
        release.send(()).unwrap();
        let out = released.await.unwrap();
        assert!(asked.elapsed() > DEADLINE, "answered after its deadline");
        assert_eq!(out, Ok(()));
        let record = inbox.record(&event("shop", "evt-3", 1).key).await.unwrap();
        assert!(record.is_none(), "the key is free: {record:?}");
    });
}

/// The lease joins a batch that a later request in it holds past the lease's deadline: its
/// caller waits for the commit and gets the lease, which it then completes.
#[test]
fn a_lease_committed_after_its_deadline_is_its_callers() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let inbox = routed_event(&dir).await;
        let gate = hold_writer(&inbox).await;
        let asked = Instant::now();
        let beginning = inbox.clone();
        let begin =
            tokio::spawn(async move { beginning.begin(event("shop", "evt-2", 1), LEASE).await });
        queued(&inbox, 1).await;
        // Behind the lease, in its batch: a request that holds the writer until released.
        let release = hold_past_the_deadline(&inbox, gate).await;
        release.send(()).unwrap();
        let begun = begin.await.unwrap();
        assert!(asked.elapsed() > DEADLINE, "answered after its deadline");
        let Ok(Begun::Leased(lease)) = begun else {
            panic!("the lease it holds: {begun:?}");
        };
        assert!(!lease.taken_over);
        inbox
            .complete(&lease, Response::completed("sent"))
            .await
            .expect("its holder completes it");
    });
}

/// A lease not started by its deadline is given up, and the key is free.
#[test]
fn a_lease_not_started_by_its_deadline_changes_nothing() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let inbox = routed_event(&dir).await;
        let gate = hold_writer(&inbox).await;
        let given_up = inbox.begin(event("shop", "evt-2", 1), LEASE).await;
        assert!(
            matches!(
                given_up,
                Err(ProcessError::Unavailable(Unavailable::Deadline))
            ),
            "{given_up:?}"
        );
        drop(gate);
        let later = inbox.begin(event("shop", "evt-2", 1), LEASE).await;
        let Ok(Begun::Leased(lease)) = later else {
            panic!("a first lease: {later:?}");
        };
        assert!(!lease.taken_over, "nobody held it before");
    });
}

/// A handler still running when its caller's deadline passed: the caller was answered
/// `Deadline`, and when the handler's commit landed before the reader that then looked for
/// the key, `Duplicate`, the answer that says the handler did not run. The caller is told
/// that its request ran and may still commit (`CommitUnknown`), never a duplicate; the retry
/// reads the truth.
#[test]
fn a_handler_running_past_its_deadline_is_told_its_outcome_is_unknown() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let options = Options::new(dir.path().join("d.db")).deadline(DEADLINE);
        let inbox = Inbox::open(options).unwrap();
        let (started, handler_started) = std::sync::mpsc::channel::<()>();
        let (go, held) = std::sync::mpsc::channel::<()>();
        let out = inbox
            .process(event("shop", "evt-9", 1), move |_| {
                let _ = started.send(());
                // Held until its caller has its answer.
                let _ = held.recv();
                Ok(Response::completed(b"first".to_vec()))
            })
            .await;
        assert!(handler_started.try_recv().is_ok(), "the handler ran");
        assert!(
            matches!(
                out,
                Err(ProcessError::Unavailable(Unavailable::CommitUnknown(_)))
            ),
            "{out:?}"
        );
        go.send(()).unwrap();
        let again = inbox
            .process(event("shop", "evt-9", 1), |_| {
                Ok(Response::completed(b"second".to_vec()))
            })
            .await;
        match again {
            Ok(Processed::Duplicate(first)) => assert_eq!(first.body, b"first"),
            other => panic!("the retry reads the first handler's commit: {other:?}"),
        }
    });
}

/// "No deadline" written as `Duration::MAX`: added to the time now, it overflowed and panicked
/// in every call (and a busy timeout that long panicked in the driver at open). Both are taken
/// as the longest wait a store keeps. So is a linger that long, which panicked the writer
/// thread at the first batch expecting more than one caller, and every later request was
/// answered `Closed`.
#[test]
fn a_deadline_busy_timeout_and_linger_of_duration_max_are_the_longest_wait() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let options = Options::new(dir.path().join("d.db"))
            .deadline(Duration::MAX)
            .busy_timeout(Duration::MAX)
            .linger(Duration::MAX);
        let inbox = Inbox::open(options).expect("opens");
        let ok = |_: &mut oncebox_sqlite::Tx<'_>| Ok(Response::completed(b"ok".to_vec()));
        // Rounds of callers together, so that the writer comes to expect several and lingers.
        for round in 0..4 {
            let calls = (0..8).map(|i| {
                let key = format!("evt-{round}-{i}");
                inbox.process(event("shop", &key, 1), ok)
            });
            for out in futures::future::join_all(calls).await {
                assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
            }
        }
        let out = inbox.process(event("shop", "evt-max", 1), ok).await;
        assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
        let blocking = inbox.clone();
        let out = tokio::task::spawn_blocking(move || {
            blocking.process_blocking(event("shop", "evt-max", 1), ok)
        })
        .await
        .unwrap();
        assert!(matches!(out, Ok(Processed::Duplicate(_))), "{out:?}");
    });
}
