//! A first delivery whose handler fails while more deliveries of its key wait behind it in
//! the same batch (TESTING: the winner fails after its inbox insert): its savepoint is rolled
//! back and the key is free at once, so the next delivery applies it and the rest replay that
//! one's answer. One effect, one record, one commit, and no one told "duplicate" of the
//! attempt that failed.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use oncebox_core::{ProcessError, Processed, Response};
use oncebox_sqlite::rusqlite::Connection;
use oncebox_sqlite::{HandlerError, Inbox, Options};
use oncebox_testkit::run;
use oncebox_testkit::writer::{hold_writer, queued};

use crate::harness::shop;

const DELIVERIES: usize = 20;

#[test]
fn a_first_delivery_failing_leaves_its_key_to_the_next_one_in_its_batch() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("o.db");
        let inbox = Inbox::open(Options::new(&path)).unwrap();
        inbox
            .write(|c| c.execute_batch("CREATE TABLE effects (by INTEGER NOT NULL)"))
            .await
            .unwrap();
        // Held, the writer lets the deliveries queue in order; released, it takes them all
        // into one batch.
        let gate = hold_writer(&inbox).await;
        let commits = inbox.stats().commits();
        let ran = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for i in 0..DELIVERIES {
            let (inbox2, ran) = (inbox.clone(), ran.clone());
            tasks.push(tokio::spawn(async move {
                let event = shop("evt-1", r#"{"n":1}"#);
                inbox2
                    .process(event, move |tx| {
                        let first = ran.fetch_add(1, Ordering::SeqCst) == 0;
                        // The effect is written before the failure: it must go with it.
                        tx.conn()
                            .execute("INSERT INTO effects VALUES (?1)", [i as i64])?;
                        if first {
                            return Err(HandlerError::failed("the first attempt fails"));
                        }
                        Ok(Response::completed(format!("applied by {i}")))
                    })
                    .await
            }));
            queued(&inbox, i + 1).await;
        }
        gate.send(()).unwrap();
        let mut answers = Vec::new();
        for task in tasks {
            answers.push(task.await.unwrap());
        }
        assert!(
            matches!(answers[0], Err(ProcessError::Handler(_))),
            "the first fails: {:?}",
            answers[0]
        );
        let applied = Response::completed("applied by 1");
        assert_eq!(
            answers[1].as_ref().ok(),
            Some(&Processed::Applied(applied.clone()))
        );
        for (i, a) in answers.iter().enumerate().skip(2) {
            assert_eq!(
                a.as_ref().ok(),
                Some(&Processed::Duplicate(applied.clone())),
                "delivery {i} replays the one that applied"
            );
        }
        assert_eq!(
            ran.load(Ordering::SeqCst),
            2,
            "the handler ran twice, not more"
        );
        assert_eq!(
            inbox.stats().commits(),
            commits + 1,
            "one batch, one commit"
        );
        let c = Connection::open(&path).unwrap();
        let count = |sql: &str| -> i64 { c.query_row(sql, [], |r| r.get(0)).unwrap() };
        assert_eq!(count("SELECT count(*) FROM effects"), 1);
        assert_eq!(
            count("SELECT by FROM effects"),
            1,
            "the failed attempt's effect is gone"
        );
        assert_eq!(count("SELECT count(*) FROM oncebox_inbox"), 1);
    });
}
