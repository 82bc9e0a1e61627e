//! A handler that calls the store it runs in: the call was queued behind the handler itself
//! and waited its whole deadline, holding every request queued meanwhile, and then the outer
//! call's answer was `Deadline` although its record committed later. It is refused at once:
//! the handler fails, nothing of it is kept, and the store goes on.

use std::time::Duration;

use oncebox_core::{ProcessError, Processed, Response};
use oncebox_sqlite::{Inbox, Options};
use oncebox_testkit::run;

use crate::harness::shop;

#[test]
fn a_handler_calling_its_own_store_fails_at_once_and_keeps_nothing() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        // Longer than the test may run: waiting it out cannot pass.
        let options = Options::new(dir.path().join("r.db")).deadline(Duration::from_secs(120));
        let inbox = Inbox::open(options).unwrap();
        let inner = inbox.clone();
        let outer = inbox
            .process(shop("outer", r#"{"n":1}"#), move |_| {
                let nested = inner.process_blocking(shop("inner", r#"{"n":2}"#), |_| {
                    Ok(Response::completed("inner"))
                });
                Ok(Response::completed(format!("{nested:?}")))
            })
            .await;
        assert!(matches!(outer, Err(ProcessError::Handler(_))), "{outer:?}");
        for key in ["outer", "inner"] {
            let record = inbox.record(&shop(key, "{}").key).await.unwrap();
            assert!(record.is_none(), "{key} was kept: {record:?}");
        }
        // The store goes on: both keys apply now.
        for (key, n) in [("outer", 1), ("inner", 2)] {
            let out = inbox
                .process(shop(key, &format!(r#"{{"n":{n}}}"#)), |_| {
                    Ok(Response::completed("ok"))
                })
                .await;
            assert!(matches!(out, Ok(Processed::Applied(_))), "{key}: {out:?}");
        }
    });
}

/// A handler that reads through the store's reader connections instead of its `Tx` fails at
/// once: the read would miss its own writes and its batch's, none committed yet, and a
/// balance read that way and written back would overwrite a credit already answered applied.
#[test]
fn a_handler_reading_past_its_tx_fails_at_once_and_keeps_nothing() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let inbox = Inbox::open(Options::new(dir.path().join("r.db"))).unwrap();
        let inner = inbox.clone();
        let outer = inbox
            .process(shop("reads", r#"{"n":1}"#), move |_| {
                let n =
                    inner.read_blocking(|c| c.query_row("SELECT 1", [], |r| r.get::<_, i64>(0)));
                Ok(Response::completed(format!("{n:?}")))
            })
            .await;
        assert!(matches!(outer, Err(ProcessError::Handler(_))), "{outer:?}");
        let record = inbox.record(&shop("reads", "{}").key).await.unwrap();
        assert!(record.is_none(), "kept: {record:?}");
        // Outside a handler it reads as before.
        let one = inbox.read_blocking(|c| c.query_row("SELECT 1", [], |r| r.get::<_, i64>(0)));
        assert_eq!(one.unwrap(), 1);
    });
}
