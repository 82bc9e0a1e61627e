//! A transaction left open on a key (another node's handler stuck, or its host frozen with the
//! transaction uncommitted) holds the key's row lock for as long as the server keeps its
//! session: hours, if the host vanished. A batch of this node that meets the row must give up
//! within the deadline and free its worker; waiting, it stopped every later batch on the
//! worker, whatever their keys.

use std::time::Duration;

use oncebox_core::store::{EventStore, Ingest};
use oncebox_core::{ManualClock, ProcessError, Processed};
use oncebox_postgres::Inbox;
use oncebox_testkit::{EPOCH, event};

use crate::harness::{options, schema, url};
use crate::hold::{Holder, blocked_by};

/// A deadline for what takes milliseconds or the node's own deadline.
const PROMPT: Duration = Duration::from_secs(30);

fn ingest(id: &str) -> Ingest {
    Ingest {
        event: event("shop", id, 5),
        order: None,
        accepted: b"accepted".to_vec(),
        stale: Vec::new(),
        routes: Vec::new(),
    }
}

#[test]
fn a_batch_held_on_a_stuck_transactions_row_gives_up_and_frees_its_worker() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let clock = ManualClock::new(EPOCH);
        let schema = schema();
        let stuck = Inbox::open(options(&schema, &clock)).await.expect("node");
        // One worker: a batch that never ends stops every later one.
        let node = options(&schema, &clock)
            .batch_workers(1)
            .deadline(Duration::from_secs(2));
        let node = Inbox::open(node).await.expect("node");

        // The other node's handler holds evt-1's transaction open until released.
        let holder = Holder::start(&stuck, event("shop", "evt-1", 5)).await;

        let first = {
            let node = node.clone();
            tokio::spawn(async move { node.ingest(ingest("evt-1")).await })
        };
        // The fault: PostgreSQL says this node's batch waits on the holder's row.
        let mut admin = stuck.pool().acquire().await.expect("connection");
        let waited = tokio::time::timeout(PROMPT, async {
            loop {
                let blocked = blocked_by(&mut admin, holder.pid).await;
                if blocked > 0 || first.is_finished() {
                    return blocked;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the batch reached the server");
        assert_eq!(waited, 1, "the batch waited on the holder's row lock");
        drop(admin);
        let answer = tokio::time::timeout(PROMPT, first)
            .await
            .expect("answered within the deadline")
            .expect("task");
        assert!(
            matches!(answer, Err(ProcessError::Unavailable(_))),
            "no answer about a key another transaction holds: {answer:?}"
        );

        // The worker is free again: another key goes through while the holder still waits.
        let other = node.ingest(ingest("evt-2")).await;
        assert!(
            matches!(other, Ok(Processed::Applied(_))),
            "a later batch is not stuck behind the held one: {other:?}"
        );
        assert!(!holder.is_finished(), "the holder was still open");

        let won = holder.release().await;
        assert!(matches!(won, Ok(Processed::Applied(_))), "{won:?}");
        let again = node.ingest(ingest("evt-1")).await.expect("ingest");
        assert!(again.is_duplicate(), "{again:?}");
    });
}

/// "No deadline" written as `Duration::MAX`: added to the time now, it overflowed and panicked
/// at open. It is taken as the longest wait a store keeps.
#[test]
fn a_deadline_of_duration_max_is_the_longest_wait() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let clock = ManualClock::new(EPOCH);
        let options = options(&schema(), &clock).deadline(Duration::MAX);
        let node = Inbox::open(options).await.expect("opens");
        let out = node.ingest(ingest("evt-max")).await;
        assert!(matches!(out, Ok(Processed::Applied(_))), "{out:?}");
        let again = node.ingest(ingest("evt-max")).await;
        assert!(matches!(again, Ok(Processed::Duplicate(_))), "{again:?}");
    });
}
