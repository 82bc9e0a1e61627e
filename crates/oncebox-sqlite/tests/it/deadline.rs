//! A relay's claim and the writer's deadline: a claim the writer started before its deadline,
//! in a batch that commits after it, is answered with its rows (answered `Deadline`, its rows
//! would stay `in_flight` under tokens no one holds, to be taken over later as possibly sent);
//! one the writer had not started by then is given up and changes nothing.

use std::time::{Duration, Instant};

use oncebox_core::relay_store::DeliveryStore;
use oncebox_core::store::{EventStore, Ingest};
use oncebox_core::{ManualClock, Unavailable};
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
