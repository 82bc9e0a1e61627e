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

/// Two nodes on a new schema: one to hold keys open, and one with a single batch worker and
/// `deadline`.
async fn nodes(deadline: Duration) -> (Inbox, Inbox) {
    let clock = ManualClock::new(EPOCH);
    let schema = schema();
    let stuck = Inbox::open(options(&schema, &clock)).await.expect("node");
    let node = options(&schema, &clock).batch_workers(1).deadline(deadline);
    (stuck, Inbox::open(node).await.expect("node"))
}

/// Waits until PostgreSQL says a session waits on `pid`'s locks; fails after [`PROMPT`].
async fn blocked_on(admin: &mut oncebox_postgres::sqlx::PgConnection, pid: i32, what: &str) {
    tokio::time::timeout(PROMPT, async {
        while blocked_by(admin, pid).await == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}: not within {PROMPT:?}"));
}

#[test]
fn a_batch_held_on_a_stuck_transactions_row_gives_up_and_frees_its_worker() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        // One worker: a batch that never ends stops every later one.
        let (stuck, node) = nodes(Duration::from_secs(2)).await;

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

/// Requests batched beside a key another transaction holds are not refused with it: the batch
/// gives up on the lock within half the deadline and each of its requests goes the per-event
/// way, where only the held key waits again.
#[test]
fn a_held_key_fails_alone_not_the_requests_batched_beside_it() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let (stuck, node) = nodes(Duration::from_secs(4)).await;
        let first_holder = Holder::start(&stuck, event("shop", "evt-0", 5)).await;
        let holder = Holder::start(&stuck, event("shop", "evt-1", 5)).await;
        let spawn = |id: &'static str| {
            let node = node.clone();
            tokio::spawn(async move { node.ingest(ingest(id)).await })
        };
        // The one worker waits on evt-0's row, so what comes next queues into one batch.
        let busy = spawn("evt-0");
        let mut admin = stuck.pool().acquire().await.expect("connection");
        blocked_on(
            &mut admin,
            first_holder.pid,
            "the first batch waits on evt-0",
        )
        .await;
        let (held, beside) = (spawn("evt-1"), spawn("evt-2"));
        tokio::time::timeout(PROMPT, async {
            while node.queued() < 2 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("both queued behind the first batch");
        // The fault: the batch of evt-1 and evt-2 waits on the holder's row.
        blocked_on(&mut admin, holder.pid, "the batch waits on evt-1's row").await;
        let answer = |task: tokio::task::JoinHandle<_>| async move {
            tokio::time::timeout(PROMPT, task)
                .await
                .expect("answered")
                .expect("task")
        };
        let beside: Result<Processed, ProcessError> = answer(beside).await;
        assert!(matches!(beside, Ok(Processed::Applied(_))), "{beside:?}");
        let held: Result<Processed, ProcessError> = answer(held).await;
        assert!(
            matches!(held, Err(ProcessError::Unavailable(_))),
            "{held:?}"
        );
        assert!(matches!(
            answer(busy).await,
            Err(ProcessError::Unavailable(_))
        ));
        assert!(node.batch_stats().fallbacks() >= 1);
        assert!(!holder.is_finished() && !first_holder.is_finished());
        for h in [holder, first_holder] {
            assert!(matches!(h.release().await, Ok(Processed::Applied(_))));
        }
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

/// A relay's claim queued behind a lock on the outbox (a migration's, a `VACUUM FULL`): the
/// server ends its wait within the deadline. Before, the claim outlived its caller, who gave
/// up after `lost_after`, and committed once the lock was released, leasing the rows to nobody
/// until the lease ran out, when the next node took them over as possibly sent.
#[test]
fn a_claim_queued_behind_a_lock_gives_up_on_the_server_not_only_in_the_caller() {
    use oncebox_core::relay_store::DeliveryStore;
    use oncebox_postgres::sqlx;

    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let clock = ManualClock::new(EPOCH);
        let schema = schema();
        let other = Inbox::open(options(&schema, &clock)).await.expect("node");
        // The caller would wait far longer than the deadline: only the server can end it.
        let relay = options(&schema, &clock)
            .deadline(Duration::from_secs(1))
            .lost_after(Duration::from_secs(20));
        let relay = Inbox::open(relay).await.expect("node");
        let routed = Ingest {
            routes: vec!["hooks".to_owned()],
            ..ingest("evt-1")
        };
        assert!(matches!(
            relay.ingest(routed).await,
            Ok(Processed::Applied(_))
        ));
        // The outbox locked against writes as a migration's `ALTER TABLE` or a `LOCK TABLE`
        // would, reads still allowed.
        let mut holder = other.pool().begin().await.expect("begin");
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *holder)
            .await
            .expect("pid");
        sqlx::query("LOCK TABLE oncebox_outbox IN SHARE MODE")
            .execute(&mut *holder)
            .await
            .expect("lock");
        let lease = Duration::from_secs(60);
        let mut admin = other.pool().acquire().await.expect("connection");
        let claim = {
            let relay = relay.clone();
            tokio::spawn(async move { relay.claim(EPOCH, 10, lease, &[]).await })
        };
        // The fault shows in the answer: only a wait for a lock ends in 55P03 (`Busy`).
        let refused = tokio::time::timeout(PROMPT, claim)
            .await
            .expect("answered")
            .expect("task");
        assert!(
            matches!(refused, Err(oncebox_core::Unavailable::Busy)),
            "the server ended the wait (55P03): {refused:?}"
        );
        // Ended on the server: nothing waits on the lock any more to commit after it.
        assert_eq!(
            blocked_by(&mut admin, pid).await,
            0,
            "the claim still waits"
        );
        holder.commit().await.expect("release the lock");
        drop(admin);
        // Another node has the delivery, as never sent.
        let claimed = other.claim(EPOCH, 10, lease, &[]).await.expect("claim");
        assert_eq!(claimed.len(), 1, "{claimed:?}");
        assert!(!claimed[0].taken_over, "{claimed:?}");
    });
}
