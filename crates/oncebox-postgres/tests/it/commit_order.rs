//! No duplicate is answered before the first delivery's COMMIT (G3), across two nodes sharing
//! one database. The first delivery of a key holds its transaction open after its inbox insert
//! (through `process`, whose handler can wait: the batched path has no such pause); 49 more
//! deliveries of the key arrive meanwhile at two nodes' batchers, half at each, and must all
//! wait — queued, or in a batch that PostgreSQL holds on the first one's uncommitted row.
//! Released, the first is applied and the 49 replay its answer; made to fail instead, exactly
//! one of the 49 applies the key and the others replay that one.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use oncebox_core::store::{EventStore, Ingest};
use oncebox_core::{ManualClock, ProcessError, Processed};
use oncebox_postgres::{Inbox, sqlx};
use oncebox_testkit::{EPOCH, event};

use crate::harness::{options, schema, url};
use crate::hold::{Holder, blocked_by};

fn ingest() -> Ingest {
    Ingest {
        event: event("shop", "evt-1", 5),
        order: None,
        accepted: b"accepted".to_vec(),
        stale: Vec::new(),
        routes: Vec::new(),
    }
}

/// Requests of both nodes waiting for, or inside, a batch.
fn waiting(nodes: &[Inbox]) -> u64 {
    nodes
        .iter()
        .map(|n| n.queued() as u64 + n.batch_stats().held())
        .sum()
}

type Later = tokio::task::JoinHandle<(Result<Processed, ProcessError>, bool)>;

/// Two nodes: each its own pool and batch workers on the same tables. Enough workers that
/// every one of the 49 can have its batch at the server (none need wait in a queue), so each
/// is answered by what PostgreSQL says about the row.
async fn nodes(schema: &str, clock: &ManualClock) -> [Inbox; 2] {
    let node = || async {
        // A deadline far beyond the test's own: on a loaded machine the 49 must wait out the
        // whole hold, and a deadline answer would read as an early one.
        let o = options(schema, clock)
            .batch_workers(25)
            .max_connections(27)
            .deadline(Duration::from_secs(120));
        Inbox::open(o).await.expect("node")
    };
    [node().await, node().await]
}

/// While `holder` keeps the key's first row uncommitted: sends the 49 later deliveries, half
/// to each node, and returns once every batch in flight on either node waits for the holder's
/// transaction (PostgreSQL says so) and each of the 49 is in one of them or queued behind,
/// none answered. Each later delivery's task also tells whether `open` was set when it was
/// answered.
async fn wait_behind(nodes: &[Inbox; 2], holder: &Holder, open: &Arc<AtomicBool>) -> Vec<Later> {
    let others: Vec<Later> = (0..49)
        .map(|n| {
            let (inbox, open) = (nodes[n % 2].clone(), open.clone());
            tokio::spawn(async move {
                let answer = inbox.ingest(ingest()).await;
                (answer, open.load(Ordering::SeqCst))
            })
        })
        .collect();
    let mut admin = nodes[0].pool().acquire().await.expect("connection");
    let settled = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let blocked = blocked_by(&mut admin, holder.pid).await;
            let in_flight: u64 = nodes.iter().map(|n| n.batch_stats().in_flight()).sum();
            let answered = others.iter().filter(|o| o.is_finished()).count() as u64;
            if answered > 0 || blocked > 0 && blocked as u64 == in_flight && waiting(nodes) == 49 {
                return (blocked, answered);
            }
            // Each look is a query: leave the server's cores to the sessions it waits for.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    let (blocked, answered) = settled
        .await
        .expect("the 49 reached the batchers and their batches waited on the first's row");
    assert_eq!(
        answered, 0,
        "a later delivery was answered while the first was open"
    );
    let queued: usize = nodes.iter().map(Inbox::queued).sum();
    eprintln!(
        "commit order: of 49 later deliveries, {} in {blocked} batches held on the first's row, {queued} queued",
        49 - queued
    );
    assert!(
        blocked >= 1,
        "a batch waited on the first delivery's row lock"
    );
    others
}

/// Two nodes on a new schema, the key's first delivery holding its transaction open on node 0,
/// and the 49 later ones waiting behind it ([`wait_behind`]). `open` is to be set just before
/// the holder is let go: an answer that finds it unset came before the holder's end.
struct Held {
    nodes: [Inbox; 2],
    holder: Holder,
    open: Arc<AtomicBool>,
    others: Vec<Later>,
}

async fn hold_key() -> Held {
    let clock = ManualClock::new(EPOCH);
    let nodes = nodes(&schema(), &clock).await;
    let holder = Holder::start(&nodes[0], event("shop", "evt-1", 5)).await;
    let open = Arc::new(AtomicBool::new(false));
    let others = wait_behind(&nodes, &holder, &open).await;
    Held {
        nodes,
        holder,
        open,
        others,
    }
}

async fn rows(inbox: &Inbox) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM oncebox_inbox")
        .fetch_one(inbox.pool())
        .await
        .expect("count")
}

#[test]
fn no_replay_is_answered_before_the_first_deliverys_commit_on_either_node() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let Held {
            nodes,
            holder,
            open,
            others,
        } = hold_key().await;
        open.store(true, Ordering::SeqCst);
        let won = holder.release().await;
        let Processed::Applied(answer) = won.expect("first delivery") else {
            panic!("the first delivery is applied");
        };
        for other in others {
            let (got, after) = other.await.expect("later delivery");
            assert!(
                after,
                "a replay was answered before the first delivery's COMMIT"
            );
            match got.expect("later delivery") {
                Processed::Duplicate(replay) => assert_eq!(replay, answer),
                got => panic!("a later delivery replays the first: {got:?}"),
            }
        }
        assert_eq!(rows(&nodes[0]).await, 1, "one record of the key");
    });
}

/// The first delivery fails after its inbox insert while the 49 wait on its row: its
/// transaction rolls back and the key is free again, so exactly one of the 49 applies it and
/// the other 48 replay that one's answer. None is answered before the failure, none is told
/// "duplicate" of the failed attempt, and the key holds one record.
#[test]
fn a_first_delivery_failing_while_others_wait_leaves_the_key_to_exactly_one_of_them() {
    if url().is_none() {
        return;
    }
    oncebox_testkit::run(async {
        let Held {
            nodes,
            holder,
            open,
            others,
        } = hold_key().await;
        open.store(true, Ordering::SeqCst);
        let failed = holder.fail().await;
        assert!(
            matches!(failed, Err(ProcessError::Handler(_))),
            "the first delivery fails: {failed:?}"
        );
        let mut applied = Vec::new();
        let mut replays = Vec::new();
        for other in others {
            let (got, after) = other.await.expect("later delivery");
            assert!(
                after,
                "a later delivery was answered before the first failed"
            );
            match got.expect("later delivery") {
                Processed::Applied(a) => applied.push(a),
                Processed::Duplicate(r) => replays.push(r),
                got => panic!("a later delivery is applied or replays: {got:?}"),
            }
        }
        assert_eq!(applied.len(), 1, "exactly one of the 49 applies the key");
        assert_eq!(replays.len(), 48);
        assert!(
            replays.iter().all(|r| *r == applied[0]),
            "the 48 replay the one that applied"
        );
        assert_eq!(rows(&nodes[0]).await, 1, "one record of the key");
    });
}
