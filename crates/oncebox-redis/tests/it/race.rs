//! Two workers, each with its own connection, race for the same key at the same instant:
//! exactly one gets the lease, the other is told the key is in progress.

use std::sync::Arc;
use std::time::Duration;

use oncebox_core::{Begun, ProcessError, Response};
use oncebox_testkit::run;
use tokio::sync::Barrier;

use crate::harness::{Namespace, event, report, shared};

const KEYS: usize = 50;
const TTL: Duration = Duration::from_secs(30);

/// What one worker saw for one key.
#[derive(Debug)]
enum Saw {
    Won,
    InProgress,
    Duplicate,
}

#[test]
fn two_workers_race_for_one_key_and_exactly_one_wins() {
    let Some(url) = shared() else { return };
    run(async move {
        let ns = Namespace::new(&url);
        let workers = [ns.leases().await, ns.leases().await];
        let mut effects = vec![0_usize; KEYS];
        let (mut in_progress, mut false_duplicates, mut replays) = (0, 0, 0);
        for (i, applied) in effects.iter_mut().enumerate() {
            let e = event(&format!("race-{i}"), 1);
            // Both begin on the same barrier; the second barrier holds the winner's effect
            // until both answers are in, so the loser's answer is about a live lease.
            let start = Arc::new(Barrier::new(2));
            let answered = Arc::new(Barrier::new(2));
            let mut tasks = Vec::new();
            for w in &workers {
                let (w, e, start, answered) =
                    (w.clone(), e.clone(), start.clone(), answered.clone());
                tasks.push(tokio::spawn(async move {
                    start.wait().await;
                    let begun = w.begin(&e, TTL).await;
                    answered.wait().await;
                    match begun {
                        Ok(Begun::Leased(lease)) => {
                            // The effect, then the completion.
                            w.complete(&lease, &Response::completed("done"))
                                .await
                                .unwrap();
                            Saw::Won
                        }
                        Err(ProcessError::InProgress { .. }) => Saw::InProgress,
                        Ok(Begun::Duplicate(_)) => Saw::Duplicate,
                        other => panic!("unexpected answer {other:?}"),
                    }
                }));
            }
            for t in tasks {
                match t.await.unwrap() {
                    Saw::Won => *applied += 1,
                    Saw::InProgress => in_progress += 1,
                    // Nobody had completed while both answers were being given.
                    Saw::Duplicate => false_duplicates += 1,
                }
            }
            // The loser's redelivery after the winner completed is a legitimate duplicate.
            match workers[1].begin(&e, TTL).await {
                Ok(Begun::Duplicate(r)) if r == Response::completed("done") => replays += 1,
                other => panic!("expected the winner's answer, got {other:?}"),
            }
        }
        let doubles = effects.iter().filter(|n| **n > 1).count();
        let lost = effects.iter().filter(|n| **n == 0).count();
        report(
            "race",
            doubles,
            lost,
            false_duplicates,
            &format!("keys={KEYS} in_progress={in_progress} replays={replays}"),
        );
        assert_eq!(in_progress, KEYS, "every race was really contended");
        assert_eq!(replays, KEYS);
    });
}
