//! An event larger than PostgreSQL can store fails the same way on every try: it is refused as
//! invalid before the database is asked, on every path in, and never joins a batch, where its
//! failing statement would fail every request beside it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use oncebox_core::store::{EventStore, Ingest};
use oncebox_core::{
    Begun, Event, Invalid, LeaseError, ManualClock, Meta, ProcessError, Processed, RecordState,
    Response,
};
use oncebox_postgres::{Inbox, MAX_EVENT_BYTES};
use oncebox_testkit::{EPOCH, event};

use crate::harness::{Postgres, options, schema, url};
use crate::hold::{Holder, blocked_by};

/// A deadline for what takes milliseconds.
const PROMPT: Duration = Duration::from_secs(30);

/// `id` with a payload of `bytes` zeros. Allocated zeroed, its pages are never touched by a
/// refusal, so an event past 1 GiB costs no memory here.
fn sized(id: &str, bytes: usize) -> Event {
    let mut event = event("shop", id, 1);
    event.payload = vec![0; bytes];
    event
}

fn ingest(event: Event) -> Ingest {
    Ingest {
        event,
        order: None,
        accepted: b"accepted".to_vec(),
        stale: Vec::new(),
        routes: Vec::new(),
    }
}

fn too_large<T>(answer: &Result<T, ProcessError>, size: usize) -> bool {
    matches!(
        answer,
        Err(ProcessError::Invalid(Invalid::TooLarge { size: s, limit }))
            if *s == size && *limit == MAX_EVENT_BYTES
    )
}

/// Refused by the size alone: the store's pool is closed, so anything that asked the database
/// would be answered `Unavailable` instead.
#[test]
fn an_event_past_what_postgresql_stores_is_invalid_before_the_database_is_asked() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let pg = Postgres::open(schema(), ManualClock::new(EPOCH)).await;
        let inbox = pg.inbox.clone();
        inbox.pool().close().await;
        let size = MAX_EVENT_BYTES + 1;

        let ran = Arc::new(AtomicBool::new(false));
        let running = ran.clone();
        let answer = inbox
            .process(sized("huge", size), move |_| {
                running.store(true, Ordering::SeqCst);
                Box::pin(async { Ok(Response::completed("never")) })
            })
            .await;
        assert!(too_large(&answer, size), "{answer:?}");
        assert!(!ran.load(Ordering::SeqCst), "the handler never ran");

        let begun = inbox
            .begin(sized("huge", size), Duration::from_secs(30))
            .await;
        assert!(too_large(&begun, size), "{begun:?}");
        let batched = inbox.ingest(ingest(sized("huge", size))).await;
        assert!(too_large(&batched, size), "{batched:?}");

        // The header lines are stored in the same row and messages: they count.
        let mut padded = sized("padded", MAX_EVENT_BYTES - 4);
        let mut meta = Meta::new(None);
        meta.push_header("x-pad", "abcdef");
        padded.meta = meta;
        let lines = "x-pad: abcdef\n".len();
        let answer = inbox
            .process(padded, |_| {
                Box::pin(async { Ok(Response::completed("never")) })
            })
            .await;
        assert!(
            too_large(&answer, MAX_EVENT_BYTES - 4 + lines),
            "{answer:?}"
        );

        // The same store's events within the limit still go to the database (which is closed).
        let small = inbox.ingest(ingest(event("shop", "small", 1))).await;
        assert!(
            matches!(small, Err(ProcessError::Unavailable(_))),
            "{small:?}"
        );
    });
}

/// The batch worker is held on a row another transaction keeps locked while the huge event
/// and four ordinary ones arrive. The ordinary ones wait in the queue and are then taken into
/// one batch; the huge one is answered at once, never queued, so it cannot fail theirs, even
/// with the batch's byte bound set as high as it goes.
#[test]
fn a_huge_event_never_fails_the_events_batched_beside_it() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let clock = ManualClock::new(EPOCH);
        let schema = schema();
        let other = Inbox::open(options(&schema, &clock)).await.expect("node");
        let node = options(&schema, &clock)
            .batch_workers(1)
            .max_batch_bytes(usize::MAX);
        let node = Inbox::open(node).await.expect("node");

        let holder = Holder::start(&other, event("shop", "held", 1)).await;
        let held = {
            let node = node.clone();
            tokio::spawn(async move { node.ingest(ingest(event("shop", "held", 1))).await })
        };
        let mut admin = other.pool().acquire().await.expect("connection");
        tokio::time::timeout(PROMPT, async {
            while blocked_by(&mut admin, holder.pid).await == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the worker's batch waits on the held row");
        drop(admin);

        let neighbours: Vec<_> = (0..4)
            .map(|i| {
                let node = node.clone();
                let event = event("shop", &format!("n{i}"), 1);
                tokio::spawn(async move { node.ingest(ingest(event)).await })
            })
            .collect();
        let huge = {
            let node = node.clone();
            tokio::spawn(async move {
                node.ingest(ingest(sized("huge", MAX_EVENT_BYTES + 1)))
                    .await
            })
        };
        tokio::time::timeout(PROMPT, async {
            while node.queued() < 4 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the neighbours are queued");

        let won = holder.release().await;
        assert!(matches!(won, Ok(Processed::Applied(_))), "{won:?}");
        let again = held.await.expect("task");
        assert!(matches!(again, Ok(Processed::Duplicate(_))), "{again:?}");
        for (i, n) in neighbours.into_iter().enumerate() {
            let answer = n.await.expect("task");
            assert!(
                matches!(answer, Ok(Processed::Applied(_))),
                "n{i}: {answer:?}"
            );
        }
        let huge = huge.await.expect("task");
        assert!(too_large(&huge, MAX_EVENT_BYTES + 1), "{huge:?}");
    });
}

/// A two-phase response past what a record keeps is the holder's own error, not an outage: it
/// would fail the same way on every retry. Nothing is written and the lease stays the holder's,
/// so it completes with a shorter response.
#[test]
fn a_response_past_what_postgresql_stores_is_too_large_and_the_lease_kept() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let pg = Postgres::open(schema(), ManualClock::new(EPOCH)).await;
        let begun = pg.inbox.begin(event("shop", "paid", 1), PROMPT).await;
        let Ok(Begun::Leased(lease)) = begun else {
            panic!("{begun:?}");
        };
        let huge = Response::completed(vec![0; MAX_EVENT_BYTES + 1]);
        let answer = pg.inbox.complete(&lease, huge).await;
        assert!(matches!(answer, Err(LeaseError::TooLarge(_))), "{answer:?}");
        let shorter = Response::completed("charged");
        pg.inbox.complete(&lease, shorter).await.expect("completed");
        let record = pg.inbox.record(&lease.key).await.expect("read");
        let state = record.map(|r| r.state);
        assert_eq!(
            state,
            Some(RecordState::Done(Response::completed("charged")))
        );
    });
}
