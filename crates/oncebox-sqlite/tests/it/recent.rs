//! The memory of recent first answers (`Options::recent_answers`): a prompt retry is answered
//! from it without the writer, a different payload still meets the stored record, and a purge
//! makes it forget.

use std::sync::Arc;
use std::time::Duration;

use oncebox_core::store::{EventStore, Ingest};
use oncebox_core::{Clock, ManualClock, ProcessError, Processed, Response, Retention, Timestamp};
use oncebox_sqlite::{Inbox, Options};
use oncebox_testkit::run;

use crate::harness::{self, shop};

fn ingest(id: &str, body: &str) -> Ingest {
    harness::ingest(shop(id, body))
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
        let clock = ManualClock::new(Timestamp(1_767_225_600_000));
        let options = Options::new(dir.path().join("o.db")).clock(Arc::new(clock.clone()));
        let inbox = Inbox::open(options).unwrap();
        inbox.ingest(ingest("k", r#"{"n":1}"#)).await.unwrap();
        // A day past a one-hour retention: every terminal record goes.
        clock.advance(Duration::from_secs(86_400));
        let purged = Inbox::purge(
            &inbox,
            clock.now(),
            &Retention::new(Duration::from_secs(3600)),
        )
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
