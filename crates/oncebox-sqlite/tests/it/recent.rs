//! The memory of recent first answers (`Options::recent_answers`): a prompt retry is answered
//! from it without the writer, a different payload still meets the stored record, and a purge
//! makes it forget.

use std::time::Duration;

use oncebox_core::store::{EventStore, Ingest};
use oncebox_core::{
    Clock, Event, Key, ProcessError, Processed, Response, Retention, SystemClock, Timestamp,
};
use oncebox_sqlite::{Inbox, Options};
use oncebox_testkit::run;

fn ingest(id: &str, body: &str) -> Ingest {
    Ingest {
        event: Event::json(Key::parse("shop", id).unwrap(), body).unwrap(),
        order: None,
        accepted: b"accepted".to_vec(),
        stale: Vec::new(),
        routes: Vec::new(),
    }
}

#[test]
fn a_prompt_retry_is_answered_from_memory_and_a_new_payload_is_not() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let inbox = Inbox::open(Options::new(dir.path().join("o.db"))).unwrap();
        let first = inbox.ingest(ingest("k", r#"{"n":1}"#)).await.unwrap();
        assert_eq!(first, Processed::Applied(Response::completed("accepted")));
        let written = inbox.stats().committed_requests();
        let again = inbox.ingest(ingest("k", r#"{"n":1}"#)).await.unwrap();
        assert_eq!(again, Processed::Duplicate(Response::completed("accepted")));
        assert_eq!(inbox.stats().answered_from_memory(), 1);
        assert_eq!(
            inbox.stats().committed_requests(),
            written,
            "the writer saw nothing"
        );
        // Same key, another payload: the record decides, and records the conflict.
        let reused = inbox.ingest(ingest("k", r#"{"n":2}"#)).await;
        assert!(
            matches!(reused, Err(ProcessError::Conflict { .. })),
            "{reused:?}"
        );
        assert_eq!(inbox.stats().answered_from_memory(), 1);
        let stats = EventStore::stats(&inbox).await.unwrap();
        assert_eq!(stats.conflicts, 1);
    });
}

#[test]
fn a_purged_key_is_new_again_not_remembered() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let inbox = Inbox::open(Options::new(dir.path().join("o.db"))).unwrap();
        inbox.ingest(ingest("k", r#"{"n":1}"#)).await.unwrap();
        // A day past a one-hour retention: every terminal record goes.
        let later = Timestamp(SystemClock.now().millis() + 86_400_000);
        let purged = Inbox::purge(&inbox, later, &Retention::new(Duration::from_secs(3600)))
            .await
            .unwrap();
        assert_eq!(purged, 1);
        let again = inbox.ingest(ingest("k", r#"{"n":1}"#)).await.unwrap();
        assert_eq!(again, Processed::Applied(Response::completed("accepted")));
        assert_eq!(inbox.stats().answered_from_memory(), 0);
    });
}

#[test]
fn zero_recent_answers_keeps_none() {
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let options = Options::new(dir.path().join("o.db")).recent_answers(0);
        let inbox = Inbox::open(options).unwrap();
        inbox.ingest(ingest("k", r#"{"n":1}"#)).await.unwrap();
        let again = inbox.ingest(ingest("k", r#"{"n":1}"#)).await.unwrap();
        assert!(again.is_duplicate());
        assert_eq!(inbox.stats().answered_from_memory(), 0);
    });
}

/// `process` (the library, the broker consumers) answers a redelivery from memory too, without
/// running the handler; so does `process_blocking`.
#[test]
fn a_redelivered_message_is_answered_from_memory_without_its_handler() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    run(async {
        let dir = tempfile::tempdir().unwrap();
        let inbox = Inbox::open(Options::new(dir.path().join("o.db"))).unwrap();
        let runs = Arc::new(AtomicUsize::new(0));
        let handler = |runs: Arc<AtomicUsize>| {
            move |_: &mut oncebox_sqlite::Tx<'_>| {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok(Response::completed("done"))
            }
        };
        let event = || Event::json(Key::parse("orders", "m-1").unwrap(), r#"{"n":1}"#).unwrap();
        let first = inbox.process(event(), handler(runs.clone())).await.unwrap();
        assert_eq!(first, Processed::Applied(Response::completed("done")));
        let again = inbox.process(event(), handler(runs.clone())).await.unwrap();
        assert_eq!(again, Processed::Duplicate(Response::completed("done")));
        let blocking = {
            let (inbox, runs) = (inbox.clone(), runs.clone());
            tokio::task::spawn_blocking(move || inbox.process_blocking(event(), handler(runs)))
                .await
                .unwrap()
                .unwrap()
        };
        assert_eq!(blocking, Processed::Duplicate(Response::completed("done")));
        assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
        assert_eq!(inbox.stats().answered_from_memory(), 2);
    });
}
