//! A request late in a batch is judged at the time it runs, not at its batch's `BEGIN`: a
//! slow handler ahead of it in the batch (here 5 s of the store's clock) made a lease begun
//! after it end that much sooner than its holder counted, and a `complete` after it was taken
//! for live past its lease's end.

use std::sync::Arc;
use std::time::Duration;

use oncebox_core::{Begun, Clock, LeaseError, ManualClock, Processed, Response};
use oncebox_sqlite::{Inbox, Options};
use oncebox_testkit::writer::{hold_writer, queued};
use oncebox_testkit::{EPOCH, event, run};

const SLOW: Duration = Duration::from_secs(5);
const TTL: Duration = Duration::from_secs(10);

/// Runs `evt-slow{n}`, whose handler takes [`SLOW`] of `clock`, and then `after`, both in one
/// batch: the writer is held until both wait in its queue, in that order. Returns what `after`
/// answered.
async fn after_a_slow_handler<T, F>(inbox: &Inbox, clock: &ManualClock, n: u32, after: F) -> T
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    let gate = hold_writer(inbox).await;
    let commits = inbox.stats().commits();
    let slow = {
        let (inbox, clock) = (inbox.clone(), clock.clone());
        tokio::spawn(async move {
            let handler = move |_: &mut oncebox_sqlite::Tx<'_>| {
                clock.advance(SLOW);
                Ok(Response::completed(b"slow".to_vec()))
            };
            let id = format!("evt-slow{n}");
            inbox.process(event("shop", &id, 1), handler).await
        })
    };
    queued(inbox, 1).await;
    let after = tokio::spawn(after);
    queued(inbox, 2).await;
    gate.send(()).unwrap();
    assert!(matches!(slow.await.unwrap(), Ok(Processed::Applied(_))));
    let answered = after.await.unwrap();
    assert_eq!(
        inbox.stats().commits() - commits,
        1,
        "the holder, the slow handler and the request after it shared one commit"
    );
    answered
}

#[test]
fn a_lease_begun_or_completed_late_in_a_batch_is_judged_when_it_runs() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(EPOCH);
        let options = Options::new(dir.path().join("l.db")).clock(Arc::new(clock.clone()));
        let inbox = Inbox::open(options).unwrap();
        let begin = {
            let inbox = inbox.clone();
            async move { inbox.begin(event("shop", "evt-lease", 1), TTL).await }
        };
        let began_at = clock.now().plus(SLOW);
        let Ok(Begun::Leased(lease)) = after_a_slow_handler(&inbox, &clock, 1, begin).await else {
            panic!("leased");
        };
        assert_eq!(lease.expires_at, began_at.plus(TTL), "its whole TTL");
        // The lease has 1 s left when the next batch begins; the slow handler ahead of the
        // holder's `complete` takes 5 s of it.
        let left = lease.expires_at.0 - clock.now().0;
        clock.advance(Duration::from_millis(u64::try_from(left - 1_000).unwrap()));
        let complete = {
            let (inbox, lease) = (inbox.clone(), lease.clone());
            async move {
                inbox
                    .complete(&lease, Response::completed(b"done".to_vec()))
                    .await
            }
        };
        let completed = after_a_slow_handler(&inbox, &clock, 2, complete).await;
        assert!(
            matches!(completed, Err(LeaseError::Fenced)),
            "{completed:?}"
        );
    });
}
